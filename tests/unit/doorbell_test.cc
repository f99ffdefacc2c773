// queue::DoorbellQueue, the bounded MPSC queue (Vyukov) through which
// application threads tell the worker which QP has work. Its contract
// (doorbell.h): FIFO per producer, a doorbell is never silently lost -- either
// the consumer pops it or TakeOverflow() reports that one was dropped, after
// which the worker scans every QP.
//
// DROCE_STRESS_ITERS overrides the number of pushes per producer thread in
// the stress tests (e.g. smaller under ThreadSanitizer).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <iostream>
#include <thread>
#include <vector>

#include "queue/doorbell.h"

namespace droce::test {
namespace {

using queue::DoorbellQueue;

uint64_t StressIters(uint64_t dflt) {
  if (const char* e = std::getenv("DROCE_STRESS_ITERS")) {
    const uint64_t v = std::strtoull(e, nullptr, 0);
    if (v > 0) return v;
  }
  return dflt;
}

TEST(Doorbell, FifoSingleThread) {
  DoorbellQueue q(16);
  uint32_t v = 0;
  EXPECT_FALSE(q.Pop(&v)) << "new queue is empty";
  EXPECT_FALSE(q.MaybeNonEmpty());
  for (uint32_t i = 0; i < 16; ++i) q.Push(100 + i);
  EXPECT_TRUE(q.MaybeNonEmpty());
  for (uint32_t i = 0; i < 16; ++i) {
    ASSERT_TRUE(q.Pop(&v));
    EXPECT_EQ(v, 100 + i);
  }
  EXPECT_FALSE(q.Pop(&v));
  EXPECT_FALSE(q.MaybeNonEmpty());
  EXPECT_FALSE(q.TakeOverflow());
}

TEST(Doorbell, ManyLapsInterleaved) {
  // The cell sequence numbers advance by `size` per lap; run far enough to
  // reuse every cell many times, with the fill level varying.
  DoorbellQueue q(8);
  uint32_t in = 0, out = 0, v = 0;
  for (int round = 0; round < 1000; ++round) {
    // Never more than 8 outstanding: this test is about reuse, not overflow.
    const uint32_t burst = std::min<uint32_t>(1 + round * 7 % 8, 8 - (in - out));
    for (uint32_t i = 0; i < burst; ++i) q.Push(in++);
    const uint32_t take = 1 + static_cast<uint32_t>(round * 5 % 8);
    for (uint32_t i = 0; i < take && q.Pop(&v); ++i) ASSERT_EQ(v, out++);
  }
  while (q.Pop(&v)) ASSERT_EQ(v, out++);
  EXPECT_EQ(in, out);
  EXPECT_FALSE(q.TakeOverflow());
}

TEST(Doorbell, SizeRoundsUpToPowerOfTwo) {
  // Asking for 5 gives 8 cells: 8 pushes fit, the 9th overflows.
  DoorbellQueue q(5);
  for (uint32_t i = 0; i < 8; ++i) q.Push(i);
  EXPECT_FALSE(q.TakeOverflow());
  q.Push(8);
  EXPECT_TRUE(q.TakeOverflow());
  uint32_t v = 0;
  for (uint32_t i = 0; i < 8; ++i) {
    ASSERT_TRUE(q.Pop(&v));
    EXPECT_EQ(v, i);
  }
  EXPECT_FALSE(q.Pop(&v));
}

TEST(Doorbell, OverflowIsStickyUntilTaken) {
  DoorbellQueue q(4);
  for (uint32_t i = 0; i < 4; ++i) q.Push(i);
  // Several dropped doorbells collapse into one overflow report...
  q.Push(4);
  q.Push(5);
  q.Push(6);
  // ...which stays visible (also to MaybeNonEmpty, so the worker wakes to
  // scan) while the queue drains,
  uint32_t v = 0;
  for (uint32_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(q.Pop(&v));
    EXPECT_EQ(v, i) << "entries queued before the overflow are intact";
  }
  EXPECT_FALSE(q.Pop(&v)) << "the dropped doorbells are not in the queue";
  EXPECT_TRUE(q.MaybeNonEmpty()) << "empty but overflowed: the worker must still look";
  // ...and is reported exactly once.
  EXPECT_TRUE(q.TakeOverflow());
  EXPECT_FALSE(q.TakeOverflow());
  EXPECT_FALSE(q.MaybeNonEmpty());
  // The queue works normally afterwards.
  q.Push(42);
  ASSERT_TRUE(q.Pop(&v));
  EXPECT_EQ(v, 42u);
  EXPECT_FALSE(q.TakeOverflow());
}

TEST(Doorbell, OverflowAfterTakeIsReportedAgain) {
  DoorbellQueue q(2);
  uint32_t v = 0;
  for (int round = 0; round < 10; ++round) {
    q.Push(1);
    q.Push(2);
    q.Push(3);  // dropped
    EXPECT_TRUE(q.TakeOverflow()) << round;
    ASSERT_TRUE(q.Pop(&v));
    EXPECT_EQ(v, 1u);
    ASSERT_TRUE(q.Pop(&v));
    EXPECT_EQ(v, 2u);
    EXPECT_FALSE(q.Pop(&v));
    EXPECT_FALSE(q.TakeOverflow());
  }
}

// Value layout for the stress tests: producer id in the top byte, a
// per-producer sequence number below.
constexpr uint32_t Tag(uint32_t producer, uint32_t seq) { return producer << 24 | seq; }

struct Received {
  std::vector<uint32_t> next;  // per producer: next expected sequence number
  uint64_t total = 0, dups_or_reorders = 0, gaps = 0, foreign = 0;
  explicit Received(uint32_t producers) : next(producers, 0) {}
  // Per-producer FIFO: each producer's values must come out in push order.
  // With no overflow they must also be consecutive; with overflow a gap is a
  // dropped (and reported) doorbell.
  void Take(uint32_t v) {
    const uint32_t p = v >> 24, s = v & 0xFFFFFF;
    ++total;
    if (p >= next.size()) {
      ++foreign;
      return;
    }
    if (s < next[p]) ++dups_or_reorders;
    if (s > next[p]) ++gaps;
    next[p] = s + 1;
  }
};

TEST(Doorbell, MultiProducerStressNoOverflow) {
  // Three producers, one consumer, a small queue (so cells are reused
  // constantly and producers contend on the tail CAS). Producers reserve a
  // ticket and wait until the consumer is less than `size` behind it, so the
  // queue can never be full: every value must come out exactly once, in
  // per-producer order, and no overflow may be reported.
  constexpr uint32_t kProducers = 3, kSize = 256;
  const uint32_t per = static_cast<uint32_t>(std::min<uint64_t>(StressIters(4'000'000), 0xFFFFFF));
  DoorbellQueue q(kSize);
  std::atomic<uint64_t> tickets{0}, popped{0};
  std::atomic<bool> done_flags[kProducers] = {};
  std::atomic<bool> gave_up{false};
  constexpr uint64_t kMaxStall = 200'000'000;  // polls without progress before giving up

  std::vector<std::thread> producers;
  for (uint32_t p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (uint32_t s = 0; s < per; ++s) {
        const uint64_t t = tickets.fetch_add(1, std::memory_order_relaxed);
        uint64_t stall = 0;
        while (t >= popped.load(std::memory_order_acquire) + kSize) {  // (not t - popped: it may be < 0)
          if (++stall > kMaxStall || gave_up.load(std::memory_order_relaxed)) {
            gave_up = true;
            return;
          }
          std::this_thread::yield();
        }
        q.Push(Tag(p, s));
      }
      done_flags[p].store(true, std::memory_order_release);
    });
  }

  Received got(kProducers);
  uint64_t stall = 0;
  bool overflow_seen = false;
  for (;;) {
    uint32_t v;
    if (q.Pop(&v)) {
      got.Take(v);
      popped.fetch_add(1, std::memory_order_release);
      stall = 0;
      continue;
    }
    overflow_seen |= q.TakeOverflow();
    bool all_done = true;
    for (auto& d : done_flags) all_done &= d.load(std::memory_order_acquire);
    if (all_done) {
      // Every Push returned before its done flag was set (release/acquire),
      // so one more drain sees all of them.
      while (q.Pop(&v)) got.Take(v);
      break;
    }
    if (gave_up.load() || ++stall > kMaxStall) {
      gave_up = true;
      break;
    }
    std::this_thread::yield();
  }
  for (auto& t : producers) t.join();
  overflow_seen |= q.TakeOverflow();

  ASSERT_FALSE(gave_up.load()) << "no progress";
  EXPECT_FALSE(overflow_seen) << "the queue was never more than full";
  EXPECT_EQ(got.total, uint64_t{kProducers} * per);
  EXPECT_EQ(got.foreign, 0u);
  EXPECT_EQ(got.dups_or_reorders, 0u);
  EXPECT_EQ(got.gaps, 0u);
  for (uint32_t p = 0; p < kProducers; ++p) EXPECT_EQ(got.next[p], per) << "producer " << p;
}

TEST(Doorbell, MultiProducerStressWithOverflowNeverLosesSilently) {
  // A tiny queue and no back-pressure: doorbells will be dropped. What must
  // hold is the never-lost rule: every value popped was pushed, at most once
  // and in per-producer order, and if anything is missing an overflow was
  // reported.
  constexpr uint32_t kProducers = 3, kSize = 4;
  const uint32_t per = static_cast<uint32_t>(std::min<uint64_t>(StressIters(1'000'000) / 4, 0xFFFFFF));
  DoorbellQueue q(kSize);
  std::atomic<int> done{0};
  std::vector<std::thread> producers;
  for (uint32_t p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      for (uint32_t s = 0; s < per; ++s) {
        q.Push(Tag(p, s));
        if ((s & 63) == 0) std::this_thread::yield();
      }
      done.fetch_add(1, std::memory_order_release);
    });
  }
  Received got(kProducers);
  bool overflow_seen = false;
  uint32_t v;
  for (;;) {
    if (q.Pop(&v)) {
      got.Take(v);
      continue;
    }
    overflow_seen |= q.TakeOverflow();
    if (done.load(std::memory_order_acquire) == static_cast<int>(kProducers)) {
      while (q.Pop(&v)) got.Take(v);
      break;
    }
    std::this_thread::yield();
  }
  for (auto& t : producers) t.join();
  overflow_seen |= q.TakeOverflow();

  EXPECT_EQ(got.foreign, 0u);
  EXPECT_EQ(got.dups_or_reorders, 0u);
  EXPECT_LE(got.total, uint64_t{kProducers} * per);
  if (got.total < uint64_t{kProducers} * per) {
    EXPECT_TRUE(overflow_seen) << (uint64_t{kProducers} * per - got.total)
                               << " doorbells vanished without an overflow report";
  }
  if (got.gaps > 0) {
    EXPECT_TRUE(overflow_seen) << "a gap in a producer's sequence is a dropped doorbell";
  }
  EXPECT_FALSE(q.Pop(&v));
  std::cout << "[          ] popped " << got.total << " of " << uint64_t{kProducers} * per
            << ", overflow reported: " << overflow_seen << "\n";
}

}  // namespace
}  // namespace droce::test
