// Microbenchmarks of the shared-memory queues on the fast path: the SPSC ring
// (src/queue/ring.h) that carries WQEs from the provider to the engine, used
// the way the two sides use it (slot write + one release store per batch,
// acquire load + slot copy + one release store per batch), on one thread and
// across two threads; and the MPSC doorbell queue (src/queue/doorbell.h).
//
//   build/bench/ring_bench [--benchmark_filter=REGEX]
//
// Items are 128-byte slots: a SendWqe (64 B) and four SGEs, the provider's
// default send stride.

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

#include "queue/abi.h"
#include "queue/doorbell.h"
#include "queue/ring.h"
#include "queue/shm.h"

namespace {

namespace queue = droce::queue;

constexpr uint32_t kStride = sizeof(queue::SendWqe) + 4 * sizeof(queue::Sge);

struct RingFixture {
  queue::ShmRegion shm;
  queue::Ring ring;
  explicit RingFixture(uint32_t size) {
    shm = *queue::ShmRegion::Create("bench-ring", queue::ring_bytes(size, kStride));
    ring = queue::Ring::Init(shm.data(), size, kStride);
  }
};

// Producer side of one batch: write `n` WQEs, publish once (ring.h P0/P1).
// Returns false if the ring has no room for n.
inline bool Produce(queue::Ring& r, uint32_t& prod, uint32_t n, uint64_t seq) {
  if (prod + n - r.load_cons_acquire() > r.size()) return false;
  for (uint32_t i = 0; i < n; ++i) {
    queue::SendWqe w{};
    w.wr_id = seq + i;
    w.num_sge = 1;
    queue::Sge s{0x1000, 64, 0x100};
    uint8_t* slot = r.slot(prod + i);
    std::memcpy(slot, &w, sizeof(w));
    std::memcpy(slot + sizeof(w), &s, sizeof(s));
  }
  prod += n;
  r.publish_prod(prod);
  return true;
}

// Consumer side: snapshot every published WQE into private memory (as the
// engine does before validating it), publish cons once. Returns the count.
inline uint32_t Consume(queue::Ring& r, uint32_t& cons, uint64_t* sum) {
  const uint32_t prod = r.load_prod_acquire();
  uint32_t n = 0;
  for (; cons != prod; ++cons, ++n) {
    alignas(64) uint8_t snap[kStride];
    std::memcpy(snap, r.slot(cons), kStride);
    queue::SendWqe w;
    std::memcpy(&w, snap, sizeof(w));
    *sum += w.wr_id;
  }
  if (n != 0) r.publish_cons(cons);
  return n;
}

// One thread plays both sides: the cost of the ring operations themselves
// (no cache-line transfer between cores). Arg: batch size.
void BM_RingSpscOneThread(benchmark::State& state) {
  const uint32_t batch = static_cast<uint32_t>(state.range(0));
  RingFixture f(256);
  uint32_t prod = 0, cons = 0;
  uint64_t sum = 0, seq = 0;
  for (auto _ : state) {
    Produce(f.ring, prod, batch, seq);
    seq += batch;
    benchmark::DoNotOptimize(Consume(f.ring, cons, &sum));
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * batch);
}
BENCHMARK(BM_RingSpscOneThread)->Arg(1)->Arg(8)->Arg(32);

// Producer on the benchmark thread, consumer on another thread: WQEs per
// second through the ring, cache lines moving between cores as they do
// between an application thread and the engine. Arg: batch size. On a
// loaded 2-core VM this figure depends on what else runs.
void BM_RingSpscTwoThreads(benchmark::State& state) {
  const uint32_t batch = static_cast<uint32_t>(state.range(0));
  RingFixture f(1024);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> consumed{0};
  std::thread consumer([&] {
    uint32_t cons = 0;
    uint64_t sum = 0, n = 0;
    for (;;) {
      const uint32_t k = Consume(f.ring, cons, &sum);
      n += k;
      if (k == 0) {
        if (stop.load(std::memory_order_acquire) && f.ring.load_prod_acquire() == cons) break;
        __builtin_ia32_pause();
      }
    }
    benchmark::DoNotOptimize(sum);
    consumed.store(n, std::memory_order_release);
  });
  uint32_t prod = 0;
  uint64_t seq = 0;
  for (auto _ : state) {
    while (!Produce(f.ring, prod, batch, seq)) __builtin_ia32_pause();
    seq += batch;
  }
  stop.store(true, std::memory_order_release);
  consumer.join();
  if (consumed.load() != seq) state.SkipWithError("lost items");
  state.SetItemsProcessed(static_cast<int64_t>(seq));
}
BENCHMARK(BM_RingSpscTwoThreads)->Arg(1)->Arg(32)->UseRealTime();

// The doorbell: one Push (CAS on the tail) and one Pop per QP rung.
void BM_DoorbellPushPop(benchmark::State& state) {
  queue::DoorbellQueue q(1024);
  uint32_t v = 0;
  for (auto _ : state) {
    q.Push(17);
    benchmark::DoNotOptimize(q.Pop(&v));
  }
  benchmark::DoNotOptimize(v);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_DoorbellPushPop);

}  // namespace

BENCHMARK_MAIN();
