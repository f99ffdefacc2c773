// Single-producer single-consumer rings in shared memory, the ABI between the
// verbs provider and the engine.
//
// Layout: a RingHeader (producer index, consumer index and the immutable
// geometry each on its own cache line) followed by `size` slots of `stride`
// bytes. Indices are free-running 32-bit counters; slot = index & (size - 1).
//
// Ordering (the only two synchronising edges):
//   P1  the producer writes a slot, then publishes prod with a release store;
//   C1  the consumer reads prod with an acquire load (pairs with P1), so the
//       slot contents are visible before it reads them;
//   C2  the consumer, done with a slot, publishes cons with a release store;
//   P0  the producer reads cons with an acquire load (pairs with C2) before it
//       reuses a slot, so it never overwrites one still being read.
// Multiple threads on one side must serialise among themselves (the provider
// holds a per-queue lock; the engine side has exactly one owner thread).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace droce::queue {

inline constexpr size_t kCacheLine = 64;

struct RingHeader {
  alignas(kCacheLine) std::atomic<uint32_t> prod;
  alignas(kCacheLine) std::atomic<uint32_t> cons;
  alignas(kCacheLine) uint32_t size;  // power of two
  uint32_t stride;                    // bytes per slot, multiple of 16
  uint32_t magic;
  uint32_t version;
};
static_assert(sizeof(RingHeader) == 3 * kCacheLine);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

inline constexpr uint32_t kRingMagic = 0x64524e47;  // "dRNG"
inline constexpr uint32_t kRingVersion = 1;

// The smallest power of two >= v; 0 when there is none in 32 bits (v > 2^31).
inline constexpr uint32_t round_up_pow2(uint32_t v) {
  if (v > (1u << 31)) return 0;
  uint32_t p = 1;
  while (p < v) p <<= 1;
  return p;
}

// Bytes a ring occupies, rounded up to a cache line so that whatever is
// placed after it in the same region (another ring, QpShared, CqControl)
// starts aligned.
inline constexpr size_t ring_bytes(uint32_t size, uint32_t stride) {
  return (sizeof(RingHeader) + size_t{size} * stride + kCacheLine - 1) & ~(kCacheLine - 1);
}

// A view of a ring placed at some address in shared memory. Cheap to copy.
class Ring {
 public:
  Ring() = default;
  explicit Ring(void* base) : h_(static_cast<RingHeader*>(base)) {
    slots_ = reinterpret_cast<uint8_t*>(h_ + 1);
    mask_ = h_->size - 1;
    stride_ = h_->stride;
  }
  // Initialises the header in fresh memory (size must be a power of two).
  static Ring Init(void* base, uint32_t size, uint32_t stride) {
    auto* h = static_cast<RingHeader*>(base);
    h->prod.store(0, std::memory_order_relaxed);
    h->cons.store(0, std::memory_order_relaxed);
    h->size = size;
    h->stride = stride;
    h->magic = kRingMagic;
    h->version = kRingVersion;
    return Ring(base);
  }

  bool valid() const { return h_ != nullptr; }
  uint32_t size() const { return mask_ + 1; }
  uint32_t stride() const { return stride_; }
  RingHeader* header() const { return h_; }
  uint8_t* slot(uint32_t index) const { return slots_ + size_t{index & mask_} * stride_; }

  // Producer side.
  uint32_t load_cons_acquire() const { return h_->cons.load(std::memory_order_acquire); }  // P0
  uint32_t load_prod_relaxed() const { return h_->prod.load(std::memory_order_relaxed); }
  void publish_prod(uint32_t prod) { h_->prod.store(prod, std::memory_order_release); }   // P1

  // Consumer side.
  uint32_t load_prod_acquire() const { return h_->prod.load(std::memory_order_acquire); }  // C1
  uint32_t load_cons_relaxed() const { return h_->cons.load(std::memory_order_relaxed); }
  void publish_cons(uint32_t cons) { h_->cons.store(cons, std::memory_order_release); }   // C2

 private:
  RingHeader* h_ = nullptr;
  uint8_t* slots_ = nullptr;
  uint32_t mask_ = 0;
  uint32_t stride_ = 0;
};

}  // namespace droce::queue
