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
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>

#include "queue/ring.h"

namespace droce::queue {

class DoorbellQueue {
 public:
  // size is clamped to [2, 2^20].
  explicit DoorbellQueue(uint32_t size)
      : mask_(round_up_pow2(size < 2 ? 2 : size > (1u << 20) ? (1u << 20) : size) - 1), cells_(new Cell[mask_ + 1]) {
    for (uint32_t i = 0; i <= mask_; ++i) cells_[i].seq.store(i, std::memory_order_relaxed);
  }

  void Push(uint32_t value) {
    uint32_t pos = tail_.load(std::memory_order_relaxed);
    for (;;) {
      Cell& c = cells_[pos & mask_];
      const uint32_t seq = c.seq.load(std::memory_order_acquire);
      const int32_t diff = static_cast<int32_t>(seq - pos);
      if (diff == 0) {
        if (tail_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          c.value = value;
          c.seq.store(pos + 1, std::memory_order_release);  // D1
          return;
        }
      } else if (diff < 0) {
        overflow_.store(true, std::memory_order_release);
        return;
      } else {
        pos = tail_.load(std::memory_order_relaxed);
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

  bool TakeOverflow() { return overflow_.exchange(false, std::memory_order_acq_rel); }
  // Any thread: a hint (exact on the consumer's thread) that Pop or
  // TakeOverflow has something.
  bool MaybeNonEmpty() const {
    const uint32_t head = head_.load(std::memory_order_relaxed);
    return cells_[head & mask_].seq.load(std::memory_order_acquire) == head + 1 ||
           overflow_.load(std::memory_order_relaxed);
  }

 private:
  struct alignas(kCacheLine) Cell {
    std::atomic<uint32_t> seq;
    uint32_t value;
  };
  const uint32_t mask_;
  std::unique_ptr<Cell[]> cells_;
  alignas(kCacheLine) std::atomic<uint32_t> tail_{0};
  // Written by the consumer only; atomic because a thread about to sleep
  // reads it for MaybeNonEmpty.
  alignas(kCacheLine) std::atomic<uint32_t> head_{0};
  std::atomic<bool> overflow_{false};
};

}  // namespace droce::queue
