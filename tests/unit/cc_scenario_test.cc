// The congestion-control scenario runner (src/transport/sim/cc_scenario.h): 8 flows
// converge fairly through one bottleneck in virtual time, the same seed gives
// the same CSV, incast completes with every byte in place.
#include "transport/sim/cc_scenario.h"

#include <gtest/gtest.h>

namespace droce::cc {
namespace {

// DCQCN with the paper's time constants (docs/LAB.md: ConnectX's defaults
// oscillate in this topology and do not meet the fairness check).
ScenarioOptions Converge(uint64_t seed) {
  ScenarioOptions o;
  o.seed = seed;
  o.duration_us = 100'000;
  o.warmup_us = 40'000;
  o.window_us = 10'000;
  EXPECT_TRUE(ParseDcqcnParams("min_time_between_cnps=30,rate_reduce_monitor_period=50,clamp_tgt_rate=1,"
                               "rpg_byte_reset=0,rpg_time_reset=55",
                               &o.dcqcn)
                  .ok());
  return o;
}

TEST(CcScenario, EightFlowsConvergeFairlyAtFullUtilisation) {
  const ScenarioOptions o = Converge(1);
  absl::StatusOr<ScenarioResult> r = RunScenario(o);
  ASSERT_TRUE(r.ok()) << r.status();
  std::fputs(ScenarioSummary(o, *r).c_str(), stdout);
  ASSERT_EQ(r->windows.size(), 6u);
  for (const ScenarioWindow& w : r->windows) {
    EXPECT_GE(w.jain, 0.99) << "window at " << w.start_us << " us";
    EXPECT_GE(w.utilisation, 0.95) << "window at " << w.start_us << " us";
    EXPECT_LE(w.utilisation, 1.001) << "window at " << w.start_us << " us";
  }
  EXPECT_TRUE(r->data_ok);
  EXPECT_GT(r->bytes_verified, 0u);
  EXPECT_EQ(r->bottleneck.dropped, 0u);
  EXPECT_GT(r->cnps, 0u);
  EXPECT_GT(r->cuts, 0u);
  EXPECT_EQ(r->samples.size(), 1000u);
}

TEST(CcScenario, SameSeedSameCsvOtherSeedOther) {
  ScenarioOptions o = Converge(5);
  o.duration_us = 20'000;
  o.warmup_us = 10'000;
  const auto a = RunScenario(o), b = RunScenario(o);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(ScenarioCsv(*a), ScenarioCsv(*b));
  o.seed = 6;
  const auto c = RunScenario(o);
  ASSERT_TRUE(c.ok());
  EXPECT_NE(ScenarioCsv(*a), ScenarioCsv(*c));
}

TEST(CcScenario, IncastCompletesEveryBurst) {
  ScenarioOptions o;
  o.kind = ScenarioKind::kIncast;
  o.flows = 16;
  o.duration_us = 20'000;
  o.incast_bytes = 256 * 1024;
  const auto r = RunScenario(o);
  ASSERT_TRUE(r.ok()) << r.status();
  std::fputs(ScenarioSummary(o, *r).c_str(), stdout);
  EXPECT_EQ(r->completion_us.size(), 16u);
  EXPECT_TRUE(r->data_ok);
  // 16 × 256 KiB through 25 Gb/s takes at least 1.34 ms.
  for (double c : r->completion_us) EXPECT_GT(c, 100.0);
}

TEST(CcScenario, RefusesBadOptions) {
  ScenarioOptions o;
  o.flows = 0;
  EXPECT_FALSE(RunScenario(o).ok());
  o.flows = 8;
  o.sample_us = 0;
  EXPECT_FALSE(RunScenario(o).ok());
}

}  // namespace
}  // namespace droce::cc
