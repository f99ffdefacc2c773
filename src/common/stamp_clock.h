// The post stamps of DROCE_LATENCY (common/histogram.h): the low 32 bits of the
// time-stamp counter on x86-64 (rdtsc: ~26 ns here, where CLOCK_MONOTONIC
// through kvm-clock costs ~150 ns, which would sit inside every measured
// span), else of CLOCK_MONOTONIC in ns. The TSC is machine-wide, so a stamp
// the provider takes on an application's thread can be aged by an engine in
// droced. Its rate is measured once per process against CLOCK_MONOTONIC
// (10 ms; StampCalibrate, called where a stall does not matter). Spans up to
// 2^32 ticks (2 s at 2.1 GHz) are measured right.
#pragma once

#include <time.h>

#include <cstdint>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

namespace droce::lab {

inline uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

inline uint64_t StampTicks() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  return MonotonicNs();
#endif
}

// Stamp ticks per nanosecond (1 without a TSC); measured at the first call.
inline double StampCalibrate() {
  static const double per_ns = [] {
#if defined(__x86_64__)
    const uint64_t n0 = MonotonicNs(), t0 = StampTicks();
    uint64_t n1;
    do n1 = MonotonicNs();
    while (n1 - n0 < 10'000'000);
    const uint64_t t1 = StampTicks();
    return static_cast<double>(t1 - t0) / static_cast<double>(n1 - n0);
#else
    return 1.0;
#endif
  }();
  return per_ns;
}

// A stamp for now; never 0 (0 means "not stamped").
inline uint32_t StampNow() {
  const uint32_t t = static_cast<uint32_t>(StampTicks());
  return t != 0 ? t : 1;
}

// Nanoseconds from `stamp` to `now` (both StampNow values).
inline uint64_t StampSpanNs(uint32_t stamp, uint32_t now) {
  return static_cast<uint64_t>(static_cast<double>(now - stamp) / StampCalibrate());
}

}  // namespace droce::lab
