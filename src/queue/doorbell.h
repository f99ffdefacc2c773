// The doorbell queue: application threads (many producers) tell the worker
// (one consumer) which QP has new work. A bounded MPSC queue after Vyukov:
// each cell carries a sequence number that says whose turn it is.
//   D1  a producer claims a cell by CAS on `tail`, writes the value, then
//       publishes the cell with a release store of seq = pos + 1;
//   D2  the consumer's acquire load of seq (pairs with D1) makes the value
//       visible; it frees the cell with a release store of seq = pos + size,
//       which a producer's acquire load pairs with before reusing it.
// A full queue is reported to the producer, which then sets `overflow` so the
// worker scans every QP once: a doorbell is never lost.
//
// The cells, `tail` and `overflow` may live in shared memory (droced: a
// client's queue, which the client writes); the consumer's `head` and the
// geometry are always the consumer's own, so whatever a producer writes
// there can only make the consumer skip or misread that queue's values,
// which the consumer checks anyway (the QPN must be one of the producer's).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "queue/ring.h"

namespace droce::queue {

class DoorbellQueue {
 public:
  struct alignas(kCacheLine) Cell {
    std::atomic<uint32_t> seq;
    uint32_t value;
  };
  struct Shared {
    alignas(kCacheLine) std::atomic<uint32_t> tail;
    std::atomic<uint32_t> overflow;
    // Cell cells[size] follow, cache-line aligned.
  };
  static_assert(sizeof(Shared) == kCacheLine);

  static uint32_t ClampSize(uint32_t size) {
    return round_up_pow2(size < 2 ? 2 : size > (1u << 20) ? (1u << 20) : size);
  }
  // Bytes of shared memory a queue of `size` (clamped) cells takes.
  static size_t Bytes(uint32_t size) { return sizeof(Shared) + size_t{ClampSize(size)} * sizeof(Cell); }

  // A queue in private memory. size is clamped to [2, 2^20].
  explicit DoorbellQueue(uint32_t size)
      : mask_(ClampSize(size) - 1), own_(new uint8_t[Bytes(size) + kCacheLine]) {
    Attach(reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(own_.get()) + kCacheLine - 1) & ~(kCacheLine - 1)),
           true);
  }
  // A view of a queue at `mem` (Bytes(size), cache-line aligned), shared with
  // another process; `init` initialises it (the creator does, once).
  DoorbellQueue(void* mem, uint32_t size, bool init) : mask_(ClampSize(size) - 1) { Attach(mem, init); }

  void Push(uint32_t value) {
    uint32_t pos = sh_->tail.load(std::memory_order_relaxed);
    for (;;) {
      Cell& c = cells_[pos & mask_];
      const uint32_t seq = c.seq.load(std::memory_order_acquire);
      const int32_t diff = static_cast<int32_t>(seq - pos);
      if (diff == 0) {
        if (sh_->tail.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          c.value = value;
          c.seq.store(pos + 1, std::memory_order_release);  // D1
          return;
        }
      } else if (diff < 0) {
        sh_->overflow.store(1, std::memory_order_release);
        return;
      } else {
        pos = sh_->tail.load(std::memory_order_relaxed);
      }
    }
  }

  // Single consumer.
  bool Pop(uint32_t* value) {
    const uint32_t head = head_.load(std::memory_order_relaxed);
    Cell& c = cells_[head & mask_];
    if (c.seq.load(std::memory_order_acquire) != head + 1) return false;  // D2
    *value = c.value;
    c.seq.store(head + mask_ + 1, std::memory_order_release);
    head_.store(head + 1, std::memory_order_relaxed);
    return true;
  }

  bool TakeOverflow() { return sh_->overflow.exchange(0, std::memory_order_acq_rel) != 0; }
  // Any thread: a hint (exact on the consumer's thread) that Pop or
  // TakeOverflow has something.
  bool MaybeNonEmpty() const {
    const uint32_t head = head_.load(std::memory_order_relaxed);
    return cells_[head & mask_].seq.load(std::memory_order_acquire) == head + 1 ||
           sh_->overflow.load(std::memory_order_relaxed) != 0;
  }

 private:
  void Attach(void* mem, bool init) {
    sh_ = static_cast<Shared*>(mem);
    cells_ = reinterpret_cast<Cell*>(sh_ + 1);
    if (!init) return;
    sh_->tail.store(0, std::memory_order_relaxed);
    sh_->overflow.store(0, std::memory_order_relaxed);
    for (uint32_t i = 0; i <= mask_; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }
  const uint32_t mask_;
  std::unique_ptr<uint8_t[]> own_;
  Shared* sh_ = nullptr;
  Cell* cells_ = nullptr;
  // Written by the consumer only; atomic because a thread about to sleep
  // reads it for MaybeNonEmpty.
  alignas(kCacheLine) std::atomic<uint32_t> head_{0};
};

}  // namespace droce::queue
