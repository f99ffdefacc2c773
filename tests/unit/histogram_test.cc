// The HDR-style latency histogram (src/common/histogram.h).
#include "common/histogram.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace droce::test {
namespace {

using lab::LatencyHistogram;

TEST(LatencyHistogram, BucketsTileTheRangeFinely) {
  std::mt19937_64 rng(5);
  for (int i = 0; i < 200000; ++i) {
    const uint64_t v = rng() >> (rng() % 60);
    const uint32_t b = LatencyHistogram::Index(v);
    ASSERT_LT(b, LatencyHistogram::kBuckets);
    if (v >= (uint64_t{1} << LatencyHistogram::kMaxBits)) continue;
    const uint64_t lo = LatencyHistogram::Low(b), w = LatencyHistogram::Width(b);
    ASSERT_LE(lo, v) << v;
    ASSERT_LT(v, lo + w) << v;
    if (v >= LatencyHistogram::kSub) ASSERT_LE(static_cast<double>(w) / static_cast<double>(lo), 1.0 / 128) << v;
  }
  // Adjacent buckets meet.
  for (uint32_t b = 0; b + 1 < LatencyHistogram::kBuckets; ++b) {
    ASSERT_EQ(LatencyHistogram::Low(b) + LatencyHistogram::Width(b), LatencyHistogram::Low(b + 1)) << b;
  }
}

// Against the exact order statistics of 10^5 log-normal latencies (median
// 2 µs, a long tail): every percentile to p99.99 within 0.5 %.
TEST(LatencyHistogram, PercentilesMatchExactOrderStatistics) {
  std::mt19937_64 rng(9);
  std::lognormal_distribution<double> d(std::log(2000.0), 0.6);
  std::vector<uint64_t> v(100000);
  LatencyHistogram h;
  for (auto& x : v) {
    x = static_cast<uint64_t>(d(rng));
    h.Record(x);
  }
  std::sort(v.begin(), v.end());
  EXPECT_EQ(h.count(), v.size());
  EXPECT_EQ(h.max(), v.back());
  for (double p : {50.0, 90.0, 99.0, 99.9, 99.99}) {
    const uint64_t rank = static_cast<uint64_t>(std::ceil(p / 100 * static_cast<double>(v.size())));
    const double exact = static_cast<double>(v[rank - 1]);
    EXPECT_NEAR(h.Percentile(p), exact, exact * 0.005) << "p" << p;
  }
  double sum = 0;
  for (uint64_t x : v) sum += static_cast<double>(x);
  EXPECT_NEAR(h.mean(), sum / static_cast<double>(v.size()), 1e-6 * sum);
  EXPECT_EQ(LatencyHistogram().Percentile(99), 0);
}

}  // namespace
}  // namespace droce::test
