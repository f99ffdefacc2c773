// Engine stalls (engine/stall_meter.h) in virtual time: which gaps between
// a worker's turns count, and how long each was.
#include "engine/stall_meter.h"

#include <gtest/gtest.h>

namespace droce::engine {
namespace {

constexpr uint64_t kUs = 1000, kMs = 1000 * kUs;

TEST(StallMeter, TurnsAMillisecondApartAreNoStall) {
  StallMeter m;
  uint64_t stalls = 0;
  // A busy worker (turns microseconds apart), then an idle one sleeping its
  // longest sleep (1 ms) between turns, then a host preemption of 9 ms.
  uint64_t t = 5 * kMs;
  for (int i = 0; i < 1000; ++i) stalls += m.Turn(t += 3 * kUs) != 0;
  for (int i = 0; i < 1000; ++i) stalls += m.Turn(t += kMs + 50 * kUs) != 0;
  stalls += m.Turn(t += 9 * kMs) != 0;
  stalls += m.Turn(t += StallMeter::kStallNs) != 0;  // exactly the bound: not more than it
  EXPECT_EQ(stalls, 0u);
}

TEST(StallMeter, EachLongGapCountsOnceWithItsLength) {
  StallMeter m;
  EXPECT_EQ(m.Turn(1 * kMs), 0u);  // the first turn starts the count
  EXPECT_EQ(m.Turn(1 * kMs + 20 * kUs), 0u);
  // The VM of docs/PERFORMANCE.md: a virtual CPU frozen for one 100 ms
  // period of the host's quota.
  EXPECT_EQ(m.Turn(1 * kMs + 20 * kUs + 100'300 * kUs), 100'300 * kUs);
  EXPECT_EQ(m.Turn(101 * kMs + 400 * kUs), 0u);
  EXPECT_EQ(m.Turn(112 * kMs), 10'600 * kUs);
}

TEST(StallMeter, AClockThatDidNotMoveOnIsNoStall) {
  StallMeter m;
  EXPECT_EQ(m.Turn(50 * kMs), 0u);
  EXPECT_EQ(m.Turn(50 * kMs), 0u);
  EXPECT_EQ(m.Turn(40 * kMs), 0u);  // another thread's reading, taken a little earlier
  EXPECT_EQ(m.Turn(45 * kMs), 0u);
}

}  // namespace
}  // namespace droce::engine
