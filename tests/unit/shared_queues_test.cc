// What several workers of one device share (engine/device.h): a CQ whose
// producer side is fed by two threads, and an SRQ that two threads take
// from. Each entry must come out exactly once, in each producer's order.
// Checked by hand with the locks disabled (the objects built unshared): the
// CQ test failed in every run, the SRQ test in 4 of 4 (it ran into its
// deadline; before the deadlines it hung in 2 of 3 runs).
//
// DROCE_STRESS_ITERS overrides the number of entries per thread.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "cq/cq.h"
#include "queue/abi.h"
#include "queue/ring.h"
#include "transport/qp.h"

namespace droce::test {
namespace {

uint32_t PerThread(uint32_t dflt) {
  if (const char* e = std::getenv("DROCE_STRESS_ITERS")) {
    const unsigned long v = std::strtoul(e, nullptr, 0);
    if (v > 0 && v < (1u << 19)) return static_cast<uint32_t>(v);
  }
  return dflt;
}

TEST(SharedCq, TwoProducersOneConsumerEveryCompletionOnceInOrder) {
  const uint32_t n = PerThread(200'000);
  // Room for everything: a shared producer never sees a full CQ here, so a
  // lost or doubled entry can only come from the producers racing.
  auto region = cq::CqRegion::Create(2 * n);
  ASSERT_TRUE(region.ok()) << region.status();
  cq::CqProducer prod((*region).get(), nullptr, 0, /*shared=*/true);
  cq::CqConsumer cons((*region).get());
  std::atomic<int> push_failures{0};
  auto producer = [&](uint32_t id) {
    for (uint32_t i = 0; i < n; ++i) {
      queue::Cqe c{};
      c.wr_id = (uint64_t{id} << 32) | i;
      c.qp_num = id;
      c.byte_len = i;
      if (!prod.Push(c, false)) ++push_failures;
    }
  };
  std::thread a(producer, 1), b(producer, 2);
  uint32_t next[3] = {0, 0, 0};
  uint64_t got = 0, bad = 0;
  queue::Cqe out[64];
  while (got < 2ull * n) {
    const int k = cons.Poll(out, 64);
    for (int i = 0; i < k; ++i) {
      const uint32_t id = static_cast<uint32_t>(out[i].wr_id >> 32);
      const uint32_t seq = static_cast<uint32_t>(out[i].wr_id);
      if ((id != 1 && id != 2) || out[i].qp_num != id || out[i].byte_len != seq || seq != next[id]) ++bad;
      if (id == 1 || id == 2) next[id] = seq + 1;
    }
    got += static_cast<uint64_t>(k);
    if (k == 0 && push_failures.load() != 0) break;
  }
  a.join();
  b.join();
  EXPECT_EQ(push_failures.load(), 0);
  EXPECT_EQ(bad, 0u);
  EXPECT_EQ(next[1], n);
  EXPECT_EQ(next[2], n);
  EXPECT_EQ(cons.Poll(out, 64), 0) << "more entries than were pushed";
  EXPECT_FALSE(cons.overflowed());
}

TEST(SharedSrq, TwoTakersTakeEveryWqeOnce) {
  const uint32_t n = PerThread(200'000);
  constexpr uint32_t kSize = 1024, kSges = 1;
  constexpr uint32_t kStride = sizeof(queue::RecvWqe) + kSges * sizeof(queue::Sge);
  std::vector<uint8_t> mem(queue::ring_bytes(kSize, kStride) + queue::kCacheLine);
  void* base = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(mem.data()) + queue::kCacheLine - 1) &
                                       ~uintptr_t{queue::kCacheLine - 1});
  queue::Ring ring = queue::Ring::Init(base, kSize, kStride);
  transport::Srq srq(ring, kSges, /*shared=*/true);
  std::atomic<bool> done{false};
  // A race that loses the consumer index can leave the ring looking full or
  // never empty: every loop has a deadline, so such a run fails, not hangs.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  auto late = [&] { return std::chrono::steady_clock::now() > deadline; };
  std::vector<uint64_t> taken[2];
  auto taker = [&](int t) {
    taken[t].reserve(2 * n);
    queue::RecvWqe w;
    queue::Sge sg[kSges];
    bool bad_wqe = false;
    for (;;) {
      if (srq.Take(&w, sg, kSges, &bad_wqe)) {
        taken[t].push_back(w.wr_id);
        continue;
      }
      if ((done.load(std::memory_order_acquire) && srq.posted() == 0) || late()) return;
    }
  };
  std::thread a(taker, 0), b(taker, 1);
  // The application's side: post 2n WQEs, never more than the ring holds.
  uint32_t prod = 0;
  for (uint64_t i = 0; i < 2ull * n && !late(); ++i) {
    while (prod - ring.load_cons_acquire() >= kSize && !late()) std::this_thread::yield();
    queue::RecvWqe w{};
    w.wr_id = i;
    w.num_sge = 1;
    std::memcpy(ring.slot(prod), &w, sizeof(w));
    ring.publish_prod(++prod);
  }
  done.store(true, std::memory_order_release);
  a.join();
  b.join();
  std::vector<uint64_t> all = taken[0];
  all.insert(all.end(), taken[1].begin(), taken[1].end());
  ASSERT_EQ(all.size(), 2ull * n) << "WQEs lost or taken twice";
  std::sort(all.begin(), all.end());
  for (uint64_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], i) << "WQE taken twice or never";
  EXPECT_FALSE(srq.failed());
  // Each taker saw its WQEs in posting order.
  for (const auto& t : taken) EXPECT_TRUE(std::is_sorted(t.begin(), t.end()));
}

}  // namespace
}  // namespace droce::test
