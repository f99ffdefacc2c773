// What a real-time worker's wakeups cost a thread spinning on the same CPU
// (docs/PERFORMANCE.md, DROCE_WATCH_US): one SCHED_OTHER thread spins and
// counts, another sleeps PERIOD ns on a futex (or clock_nanosleep) in a
// loop, at SCHED_FIFO 1 unless told otherwise, for one second, both on
// CPU 0. Prints how late the sleeper wakes (p50, p99), how much of its
// solo rate the spinner keeps, and so the CPU time one wakeup takes from it.
//   build/bench/rt_wake PERIOD_NS [futex|nanosleep] [fifo|other]
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace {

uint64_t Now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return uint64_t(t.tv_sec) * 1'000'000'000u + uint64_t(t.tv_nsec);
}

std::atomic<bool> g_stop{false};
std::atomic<uint64_t> g_spins{0};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s PERIOD_NS [futex|nanosleep] [fifo|other]\n", argv[0]);
    return 2;
  }
  const long period = std::atol(argv[1]);
  const bool futex = argc < 3 || std::strcmp(argv[2], "nanosleep") != 0;
  const bool fifo = argc < 4 || std::strcmp(argv[3], "other") != 0;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  sched_setaffinity(0, sizeof set, &set);  // inherited by both threads
  std::thread spinner([] {
    uint64_t n = 0;
    while (!g_stop.load(std::memory_order_relaxed)) {
      if ((++n & 1023) == 0) g_spins.store(n, std::memory_order_relaxed);
    }
  });
  // The spinner alone.
  uint64_t t0 = Now(), s0 = g_spins.load();
  usleep(300'000);
  const double solo = double(g_spins.load() - s0) / double(Now() - t0);
  std::vector<uint64_t> late;
  late.reserve(1 << 20);
  std::thread sleeper([&] {
    prctl(PR_SET_TIMERSLACK, 1UL);
    if (fifo) {
      sched_param p{};
      p.sched_priority = 1;
      if (sched_setscheduler(0, SCHED_FIFO, &p) != 0) std::perror("SCHED_FIFO");
    }
    uint32_t word = 0;
    for (const uint64_t end = Now() + 1'000'000'000; Now() < end;) {
      const uint64_t a = Now();
      timespec ts{0, period};
      if (futex) syscall(SYS_futex, &word, FUTEX_WAIT, 0, &ts, nullptr, 0);
      else clock_nanosleep(CLOCK_MONOTONIC, 0, &ts, nullptr);
      late.push_back(Now() - a - uint64_t(period));
    }
  });
  t0 = Now();
  s0 = g_spins.load();
  sleeper.join();
  const uint64_t span = Now() - t0;
  const double kept = double(g_spins.load() - s0) / double(span) / solo;
  g_stop = true;
  spinner.join();
  std::sort(late.begin(), late.end());
  std::printf("period %ld ns, %s, %s: %zu wakeups/s, late p50 %lu ns p99 %lu ns; the spinner keeps %.1f %% "
              "(%.0f ns of its CPU per wakeup)\n",
              period, futex ? "futex" : "nanosleep", fifo ? "SCHED_FIFO 1" : "SCHED_OTHER", late.size(),
              late[late.size() / 2], late[late.size() * 99 / 100], kept * 100,
              (1 - kept) * double(span) / double(late.size()));
}
