// When an idle worker naps instead of yielding its CPU (Device::YieldCpu):
// the decisions alone, without clocks or system calls, so that they are
// tested in virtual time (tests/unit/yield_policy_test.cc).
//
// A yield that gives the CPU to a thread spinning on memory beside the
// worker (droced's worker or a DROCE_PROGRESS=thread one next to perftest's
// ib_write_lat) comes back only when that thread's time slice ends, a
// scheduler tick (4 ms on the kernel of docs/PERFORMANCE.md), while a
// thread waking from a timed sleep preempts it at once. So after a yield
// lost that way the worker naps where it would have yielded, and yields
// once now and then (a probe) to see whether the spinner is gone.
#pragma once

#include <algorithm>
#include <cstdint>

namespace droce::engine {

class YieldPolicy {
 public:
  // A yield longer than this may have been lost (one with the CPU to itself
  // returns in 1-3 us here, one to a program that yields in ibv_poll_cq in
  // well under 200 us).
  static constexpr uint64_t kLostNs = 200'000;
  // The first probe comes this long after the naps start; a probe that
  // finds the spinner still there cost a slice, so the next waits twice as
  // long, up to kProbeMaxNs (0.25 % of the time then).
  static constexpr uint64_t kProbeNs = 100'000'000;
  static constexpr uint64_t kProbeMaxNs = 1'600'000'000;
  // Naps while the link is idle double up to this (each wakeup takes
  // ~13 us from the thread that has the CPU).
  static constexpr uint64_t kNapMaxNs = 1'000'000;

  // nap_ns: the nap while the link is busy (DROCE_WATCH_US); 0: never nap.
  explicit YieldPolicy(uint64_t nap_ns = 0) : base_nap_ns_(nap_ns) {}

  // Whether the worker naps now rather than yield (a yield then is a probe).
  bool Napping(uint64_t now_ns) const { return lost_ns_ != 0 && now_ns - lost_ns_ < probe_ns_; }
  bool active() const { return lost_ns_ != 0; }
  // The next nap: the base while the link is busy (`hot`: work in the last
  // 200 us), doubling up to kNapMaxNs while it is idle.
  uint64_t NextNap(bool hot) {
    nap_ns_ = hot ? base_nap_ns_ : std::min(nap_ns_ * 2, kNapMaxNs);
    return nap_ns_;
  }

  enum class Change { kNone, kStart, kStop };
  // After a yield that took `yield_ns` and came back at `now_ns`.
  // `off_cpu_ns`: how much of it this thread spent off its CPU (the host
  // descheduling the VM counts as the thread's CPU time, so a host stall is
  // not a lost yield). `app_yielded`: an application thread yielded in
  // ibv_poll_cq meanwhile (a program waiting in verbs, whose yields the
  // scheduler may pass over for a slice to keep shares fair: yields serve
  // it better than naps). `hot`: the link had work in the last 200 us (a
  // yield lost beside an idle link, a program setting up or computing, is
  // no one waiting for the worker). kStart: nap from now on; kStop: yield
  // again.
  Change AfterYield(uint64_t now_ns, uint64_t yield_ns, uint64_t off_cpu_ns, bool app_yielded, bool hot) {
    const bool lost = base_nap_ns_ != 0 && yield_ns > kLostNs && off_cpu_ns > yield_ns / 2 && !app_yielded &&
                      (hot || lost_ns_ != 0);
    if (!lost) {
      if (lost_ns_ == 0) return Change::kNone;
      lost_ns_ = 0;
      return Change::kStop;
    }
    const bool start = lost_ns_ == 0;
    probe_ns_ = start ? kProbeNs : std::min(probe_ns_ * 2, kProbeMaxNs);
    if (start) nap_ns_ = base_nap_ns_;
    lost_ns_ = now_ns;
    return start ? Change::kStart : Change::kNone;
  }

 private:
  uint64_t base_nap_ns_;
  uint64_t lost_ns_ = 0;   // when the last lost yield came back; 0: yielding
  uint64_t probe_ns_ = 0;  // how long after it to probe
  uint64_t nap_ns_ = 0;
};

}  // namespace droce::engine
