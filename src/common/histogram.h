// A latency histogram in the HDR style (log-linear buckets): values below
// 2^kSubBits nanoseconds have a bucket each; above, every power of two is
// cut into 2^(kSubBits-1) equal buckets, so a bucket is at most 1/128 of its
// value wide (kSubBits = 8) and a percentile read back from the bucket's
// middle is within 0.4 % of the true sample. Up to 2^36 ns (68 s); longer
// values land in the last bucket. 32 KiB, made only for QPs that measure.
//
// One writer (the QP's worker) records with Bump; readers on other threads
// (droce ctl, the metrics endpoint) Peek while it runs (common/counters.h).
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstdio>

#include "common/counters.h"

namespace droce::lab {

class LatencyHistogram {
 public:
  static constexpr int kSubBits = 8;
  static constexpr int kMaxBits = 36;
  static constexpr uint32_t kSub = 1u << kSubBits;
  static constexpr uint32_t kHalf = kSub / 2;
  static constexpr uint32_t kBuckets = kSub + (kMaxBits - kSubBits) * kHalf;

  static uint32_t Index(uint64_t v) {
    if (v < kSub) return static_cast<uint32_t>(v);
    const int msb = 63 - std::countl_zero(v);
    if (msb >= kMaxBits) return kBuckets - 1;
    const int shift = msb - kSubBits + 1;  // >= 1
    const uint32_t sub = static_cast<uint32_t>(v >> shift);  // [kHalf, kSub)
    return kSub + static_cast<uint32_t>(shift - 1) * kHalf + (sub - kHalf);
  }
  // The smallest value of bucket i, and its width.
  static uint64_t Low(uint32_t i) {
    if (i < kSub) return i;
    const uint32_t shift = (i - kSub) / kHalf + 1;
    const uint64_t sub = kHalf + (i - kSub) % kHalf;
    return sub << shift;
  }
  static uint64_t Width(uint32_t i) { return i < kSub ? 1 : uint64_t{1} << ((i - kSub) / kHalf + 1); }

  void Record(uint64_t ns) {
    Bump(counts_[Index(ns)]);
    Bump(total_);
    Bump(sum_, ns);
    if (ns > Peek(max_)) std::atomic_ref<uint64_t>(max_).store(ns, std::memory_order_relaxed);
  }

  uint64_t count() const { return Peek(total_); }
  uint64_t max() const { return Peek(max_); }
  double mean() const {
    const uint64_t n = count();
    return n == 0 ? 0 : static_cast<double>(Peek(sum_)) / static_cast<double>(n);
  }
  // The p-th percentile (0 < p <= 100) in ns: the middle of the bucket that
  // holds the sample of rank ceil(p/100 * count); 0 if empty.
  double Percentile(double p) const {
    uint64_t n = 0;
    std::array<uint64_t, kBuckets> snap;
    for (uint32_t i = 0; i < kBuckets; ++i) n += (snap[i] = Peek(counts_[i]));
    if (n == 0) return 0;
    uint64_t rank = static_cast<uint64_t>(p / 100.0 * static_cast<double>(n) + 0.999999);
    if (rank == 0) rank = 1;
    if (rank > n) rank = n;
    uint64_t seen = 0;
    for (uint32_t i = 0; i < kBuckets; ++i) {
      seen += snap[i];
      if (seen >= rank) {
        const double mid = static_cast<double>(Low(i)) + static_cast<double>(Width(i) - 1) / 2.0;
        return std::min(mid, static_cast<double>(max()));
      }
    }
    return static_cast<double>(max());
  }

 private:
  std::array<uint64_t, kBuckets> counts_{};
  uint64_t total_ = 0, sum_ = 0, max_ = 0;
};

// The kinds of send WQE whose latencies a QP keeps apart (the order of
// transport::Qp::LatencyClass).
inline constexpr const char* kLatencyClassNames[] = {"send", "write", "read", "atomic"};
inline constexpr int kNumLatencyClasses = 4;

// The class of a send completion by its ibv_wc_opcode value (0 SEND, 1 RDMA
// WRITE, 2 RDMA READ, 3 COMP_SWAP, 4 FETCH_ADD, 9 ATOMIC_WRITE; binds and
// local invalidations count as sends, as in the engine).
inline int LatencyClassOfWc(uint8_t wc_opcode) {
  switch (wc_opcode) {
    case 1:
    case 9: return 1;
    case 2: return 2;
    case 3:
    case 4: return 3;
    default: return 0;
  }
}

// "droce: DEV QP N CLASS latency, SPAN (us): n … mean … p50 … p99.99 … max …"
inline void PrintLatencyLine(std::FILE* out, const char* dev, uint32_t qpn, int cls, const char* span,
                             const LatencyHistogram& h) {
  std::fprintf(out,
               "droce: %s QP %u %s latency, %s (us): n %llu mean %.2f p50 %.2f p90 %.2f p99 %.2f p99.9 %.2f "
               "p99.99 %.2f max %.2f\n",
               dev, qpn, kLatencyClassNames[cls], span, static_cast<unsigned long long>(h.count()), h.mean() / 1e3,
               h.Percentile(50) / 1e3, h.Percentile(90) / 1e3, h.Percentile(99) / 1e3, h.Percentile(99.9) / 1e3,
               h.Percentile(99.99) / 1e3, static_cast<double>(h.max()) / 1e3);
}

}  // namespace droce::lab
