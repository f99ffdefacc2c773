// Engine stalls (`engine_stalls`, `engine_stalled_us`): a worker's turns
// follow each other within about a millisecond however idle it is (its
// longest sleep is 1 ms, engine/worker.cc), so a turn that starts more than
// kStallNs after the one before means nothing ran the engine meanwhile —
// the kernel ran other threads on its CPU, a control call held it, the
// process was stopped, or the hypervisor froze the virtual CPU (on the VM of
// docs/PERFORMANCE.md, for a whole 100 ms period of the host's CPU quota; a
// peer waiting for an ACK meanwhile reaches its local ACK timeout). The
// decision alone, without clocks, so that it is tested in virtual time
// (tests/unit/stall_meter_test.cc).
#pragma once

#include <cstdint>

namespace droce::engine {

class StallMeter {
 public:
  // Longer than any sleep of the worker's loop (1 ms) and than the host's
  // usual preemptions here (up to a few ms, bench/host_gaps); shorter than
  // the shortest local ACK timeout perftest uses (timeout 14: 67 ms).
  static constexpr uint64_t kStallNs = 10'000'000;

  // A turn starts at now_ns; returns the stall that ended with it in ns (0:
  // none). The first turn only starts the count.
  uint64_t Turn(uint64_t now_ns) {
    const uint64_t prev = last_ns_;
    last_ns_ = now_ns;
    if (prev == 0 || now_ns <= prev || now_ns - prev <= kStallNs) return 0;
    return now_ns - prev;
  }

 private:
  uint64_t last_ns_ = 0;
};

}  // namespace droce::engine
