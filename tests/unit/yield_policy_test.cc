// When an idle worker naps instead of yielding (engine/yield_policy.h), in
// virtual time: which yields count as lost to a spinner, how long the naps
// are, when the worker probes and when it yields again.
#include "engine/yield_policy.h"

#include <gtest/gtest.h>

namespace droce::engine {
namespace {

constexpr uint64_t kUs = 1000, kMs = 1000 * kUs;
using Change = YieldPolicy::Change;

// A yield of 4 ms that the thread spent off its CPU, nobody yielding in
// ibv_poll_cq, the link busy: what a worker beside ib_write_lat sees.
Change LostYield(YieldPolicy& p, uint64_t now) { return p.AfterYield(now, 4 * kMs, 4 * kMs, false, true); }

TEST(YieldPolicy, ALostYieldOnABusyLinkStartsNapsUntilTheProbe) {
  YieldPolicy p(20 * kUs);
  EXPECT_FALSE(p.Napping(0));
  EXPECT_EQ(LostYield(p, 10 * kMs), Change::kStart);
  EXPECT_TRUE(p.active());
  EXPECT_TRUE(p.Napping(10 * kMs));
  EXPECT_TRUE(p.Napping(10 * kMs + YieldPolicy::kProbeNs - 1));
  EXPECT_FALSE(p.Napping(10 * kMs + YieldPolicy::kProbeNs));  // probe: yield once
  EXPECT_EQ(p.NextNap(true), 20 * kUs);
}

TEST(YieldPolicy, ShortYieldsHostStallsAndPollersDoNotStartNaps) {
  YieldPolicy p(20 * kUs);
  // Back at once, or 150 us: within kLostNs.
  EXPECT_EQ(p.AfterYield(kMs, 2 * kUs, 2 * kUs, false, true), Change::kNone);
  EXPECT_EQ(p.AfterYield(kMs, YieldPolicy::kLostNs, YieldPolicy::kLostNs, false, true), Change::kNone);
  // The host descheduled the VM: the thread's CPU time went on.
  EXPECT_EQ(p.AfterYield(kMs, 3 * kMs, 10 * kUs, false, true), Change::kNone);
  // An application thread yielded in ibv_poll_cq meanwhile.
  EXPECT_EQ(p.AfterYield(kMs, 4 * kMs, 4 * kMs, true, true), Change::kNone);
  // The link was idle (a program setting up its connection).
  EXPECT_EQ(p.AfterYield(kMs, 4 * kMs, 4 * kMs, false, false), Change::kNone);
  EXPECT_FALSE(p.active());
}

TEST(YieldPolicy, DroceWatchUsZeroAlwaysYields) {
  YieldPolicy p(0);
  EXPECT_EQ(LostYield(p, 10 * kMs), Change::kNone);
  EXPECT_FALSE(p.Napping(10 * kMs));
}

TEST(YieldPolicy, LostProbesWaitTwiceAsLongUpToTheCap) {
  YieldPolicy p(20 * kUs);
  uint64_t now = 5 * kMs;
  ASSERT_EQ(LostYield(p, now), Change::kStart);
  uint64_t expected = YieldPolicy::kProbeNs;
  for (int i = 0; i < 8; ++i) {
    now += expected;
    ASSERT_FALSE(p.Napping(now));
    ASSERT_TRUE(p.Napping(now - 1));
    // The probe is lost too; even on an idle link (the ping-pong the worker
    // serves stalls while its yields are lost) the naps go on.
    EXPECT_EQ(p.AfterYield(now, 4 * kMs, 4 * kMs, false, i % 2 == 0), Change::kNone);
    expected = std::min(expected * 2, YieldPolicy::kProbeMaxNs);
  }
  EXPECT_EQ(expected, YieldPolicy::kProbeMaxNs);
  EXPECT_TRUE(p.Napping(now + YieldPolicy::kProbeMaxNs - 1));
  EXPECT_FALSE(p.Napping(now + YieldPolicy::kProbeMaxNs));
}

TEST(YieldPolicy, AProbeThatComesBackAtOnceEndsTheNaps) {
  YieldPolicy p(20 * kUs);
  ASSERT_EQ(LostYield(p, kMs), Change::kStart);
  const uint64_t probe = kMs + YieldPolicy::kProbeNs;
  EXPECT_EQ(p.AfterYield(probe, 2 * kUs, 0, false, true), Change::kStop);
  EXPECT_FALSE(p.active());
  EXPECT_FALSE(p.Napping(probe));
  // And a later lost yield starts them again, with the first probe interval.
  ASSERT_EQ(LostYield(p, probe + kMs), Change::kStart);
  EXPECT_FALSE(p.Napping(probe + kMs + YieldPolicy::kProbeNs));
}

TEST(YieldPolicy, NapsDoubleWhileTheLinkIsIdle) {
  YieldPolicy p(20 * kUs);
  ASSERT_EQ(LostYield(p, kMs), Change::kStart);
  EXPECT_EQ(p.NextNap(true), 20 * kUs);
  EXPECT_EQ(p.NextNap(false), 40 * kUs);
  EXPECT_EQ(p.NextNap(false), 80 * kUs);
  for (int i = 0; i < 10; ++i) p.NextNap(false);
  EXPECT_EQ(p.NextNap(false), YieldPolicy::kNapMaxNs);
  EXPECT_EQ(p.NextNap(true), 20 * kUs);  // work again: back to DROCE_WATCH_US
}

}  // namespace
}  // namespace droce::engine
