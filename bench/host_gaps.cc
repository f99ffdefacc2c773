// How often this host takes the CPU away from a thread that never sleeps:
// one thread spins on the clock for SECONDS (pinned to CPU if given) and
// counts the gaps between two consecutive readings longer than 20 µs, 50 µs
// and 1 ms, and the time they took. On a VM these are the hypervisor's (or
// the kernel's) preemptions; nothing a userspace poll loop can avoid. They
// bound what packet pacing can do here (docs/PERFORMANCE.md, bench/pacing):
// a paced flow's spacing error at p99 is at least the gap that ~1 % of its
// packets meet.
//   build/bench/host_gaps [SECONDS] [CPU]
// Prints one line: "host gaps over S s on cpu C: N > 20us (X % of the time),
// N > 50us, N > 1ms, longest L us".
#include <sched.h>
#include <time.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace {

uint64_t Now() {
  timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return uint64_t(t.tv_sec) * 1'000'000'000u + uint64_t(t.tv_nsec);
}

}  // namespace

int main(int argc, char** argv) {
  const double secs = argc > 1 ? std::atof(argv[1]) : 3.0;
  const int cpu = argc > 2 ? std::atoi(argv[2]) : -1;
  if (secs <= 0 || secs > 600) {
    std::fprintf(stderr, "usage: %s [SECONDS (0-600)] [CPU]\n", argv[0]);
    return 2;
  }
  if (cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof(set), &set) != 0) {
      std::perror("sched_setaffinity");
      return 1;
    }
  }
  const uint64_t start = Now(), end = start + static_cast<uint64_t>(secs * 1e9);
  uint64_t last = start, n20 = 0, n50 = 0, n1ms = 0, lost20 = 0, longest = 0;
  for (uint64_t t = start; t < end; last = t) {
    t = Now();
    const uint64_t g = t - last;
    if (g <= 20'000) continue;
    ++n20;
    lost20 += g;
    n50 += g > 50'000;
    n1ms += g > 1'000'000;
    if (g > longest) longest = g;
  }
  const double span = static_cast<double>(last - start);
  std::printf("host gaps over %.1f s on cpu %s: %llu > 20us (%.2f %% of the time), %llu > 50us, %llu > 1ms, "
              "longest %.0f us\n",
              span / 1e9, cpu >= 0 ? argv[2] : "any", static_cast<unsigned long long>(n20), 100.0 * lost20 / span,
              static_cast<unsigned long long>(n50), static_cast<unsigned long long>(n1ms), longest / 1e3);
  return 0;
}
