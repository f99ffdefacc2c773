// A test-and-test-and-set spin lock for the few engine structures that
// several worker threads of one device share (a CQ's producer side, an SRQ,
// the memory-window table, the neighbour caches). Critical sections are a
// few dozen instructions, so waiters spin briefly and then yield the CPU.
// A device with one worker creates its locks disabled: lock() and unlock()
// are then a predictable branch and nothing else. No DPDK in here: the
// transport, which has none, uses it too.
#pragma once

#include <sched.h>

#include <atomic>

namespace droce {

class SpinLock {
 public:
  explicit SpinLock(bool enabled = false) : enabled_(enabled) {}
  // Set before any concurrent use (when the owning object is created).
  void set_enabled(bool on) { enabled_ = on; }
  bool enabled() const { return enabled_; }

  void lock() {
    if (!enabled_) return;
    for (unsigned spins = 0;; ++spins) {
      if (!held_.load(std::memory_order_relaxed) && !held_.exchange(true, std::memory_order_acquire)) return;
      if (spins < 64) CpuRelax();
      else sched_yield();  // the holder may have been preempted (2 cores, VMs)
    }
  }
  void unlock() {
    if (enabled_) held_.store(false, std::memory_order_release);
  }

 private:
  static void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
  }
  bool enabled_;
  std::atomic<bool> held_{false};
};

}  // namespace droce
