// Microbenchmarks of completion queues (src/cq/cq.h): the engine's
// CqProducer::Push and the provider's CqConsumer::Poll, on one thread (the
// cost of the operations: index loads/stores, the 48-byte CQE copies and the
// seq_cst fence of the arm/notify protocol) and across two threads; and the
// notification path of an armed CQ.
//
//   build/bench/cq_bench [--benchmark_filter=REGEX]

#include <benchmark/benchmark.h>

#include <atomic>
#include <cstdint>
#include <thread>

#include "cq/cq.h"
#include "queue/abi.h"

namespace {

namespace cq = droce::cq;
namespace queue = droce::queue;

queue::Cqe MakeCqe(uint64_t id) {
  queue::Cqe c{};
  c.wr_id = id;
  c.byte_len = 64;
  c.qp_num = 0x11;
  c.status = queue::wc::kSuccess;
  c.opcode = queue::wc::kOpSend;
  return c;
}

// Push `batch` CQEs, then poll them all (Poll takes up to 16 at a time, as
// ibv_poll_cq does through its buffer in providers/verbs_datapath.cc).
void BM_CqPushPoll(benchmark::State& state) {
  const int batch = static_cast<int>(state.range(0));
  auto region = *cq::CqRegion::Create(1024);
  cq::CqProducer prod(region.get(), nullptr, 1);
  cq::CqConsumer cons(region.get());
  queue::Cqe out[16];
  uint64_t id = 0, sum = 0;
  for (auto _ : state) {
    for (int i = 0; i < batch; ++i) prod.Push(MakeCqe(id++), false);
    int left = batch;
    while (left > 0) {
      const int k = cons.Poll(out, left < 16 ? left : 16);
      for (int i = 0; i < k; ++i) sum += out[i].wr_id;
      left -= k;
    }
  }
  benchmark::DoNotOptimize(sum);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * batch);
}
BENCHMARK(BM_CqPushPoll)->Arg(1)->Arg(16)->Arg(64);

// An empty poll: what a busy-polling application pays per ibv_poll_cq miss
// (before the provider's own lock and engine drive).
void BM_CqPollEmpty(benchmark::State& state) {
  auto region = *cq::CqRegion::Create(1024);
  cq::CqConsumer cons(region.get());
  queue::Cqe out[16];
  for (auto _ : state) benchmark::DoNotOptimize(cons.Poll(out, 16));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_CqPollEmpty);

class CountingNotifier : public cq::CqNotifier {
 public:
  void NotifyCq(uint64_t) override { ++notified; }
  void CqError(uint64_t) override {}
  uint64_t notified = 0;
};

// Arm (consumer), push one CQE (producer: fence, sees the arm, exchange,
// notify), poll it: the event-driven completion path without the eventfd
// write.
void BM_CqArmPushNotifyPoll(benchmark::State& state) {
  auto region = *cq::CqRegion::Create(1024);
  CountingNotifier n;
  cq::CqProducer prod(region.get(), &n, 1);
  cq::CqConsumer cons(region.get());
  queue::Cqe out[16];
  uint64_t id = 0;
  for (auto _ : state) {
    cons.Arm(cq::kArmNextComp);
    prod.Push(MakeCqe(id++), false);
    benchmark::DoNotOptimize(cons.Poll(out, 16));
  }
  if (n.notified != id) state.SkipWithError("missed notifications");
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
}
BENCHMARK(BM_CqArmPushNotifyPoll);

// Producer (engine) on the benchmark thread, consumer (application) on
// another: CQEs per second crossing cores.
void BM_CqPushPollTwoThreads(benchmark::State& state) {
  auto region = *cq::CqRegion::Create(4096);
  cq::CqProducer prod(region.get(), nullptr, 1);
  cq::CqConsumer cons(region.get());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> polled{0};
  std::thread consumer([&] {
    queue::Cqe out[16];
    uint64_t n = 0;
    for (;;) {
      const int k = cons.Poll(out, 16);
      n += static_cast<uint64_t>(k);
      if (k == 0) {
        if (stop.load(std::memory_order_acquire) && region->ring().load_prod_acquire() ==
                                                        region->ring().load_cons_relaxed()) {
          break;
        }
        __builtin_ia32_pause();
      }
    }
    polled.store(n, std::memory_order_release);
  });
  uint64_t id = 0;
  for (auto _ : state) {
    while (prod.full()) __builtin_ia32_pause();
    prod.Push(MakeCqe(id++), false);
  }
  stop.store(true, std::memory_order_release);
  consumer.join();
  if (polled.load() != id) state.SkipWithError("lost completions");
  state.SetItemsProcessed(static_cast<int64_t>(id));
}
BENCHMARK(BM_CqPushPollTwoThreads)->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
