// A simulated RC transfer without I/O: two transport::Qp objects (requester
// and responder) on one thread, joined by the fault-free simulated link of
// transport/sim/two_qp.h (the unit tests' harness). Everything of droce's fast path but DPDK
// and the provider runs: WQE snapshot and validation, packet build (headers,
// payload gather, ICRC), frame parse and ICRC check, responder scatter into
// the MR, ACKs, completer, CQEs into the shared CQ rings and polling them.
// Frame buffers come from a preallocated pool (no allocation per packet), as
// mbufs would.
//
// Figures are messages per second *per core* with both ends on that core:
// a real pair has each end on its own core, so each end's share of this
// work is roughly half.
//
// The `trace` argument (1; 2: clock=turn, a stamp per turn) gives both QPs
// an event trace sink (transport/trace.h, as DROCE_TRACE does) drained
// every 1 ms by another thread, copied out and converted as the trace's
// writer does, but not written: the datapath's share of the trace's cost.
//
//   build/bench/transport_bench [--benchmark_filter=REGEX]

#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "queue/abi.h"
#include "transport/sim/two_qp.h"
#include "transport/trace.h"

namespace {

namespace queue = droce::queue;
namespace sim = droce::transport::sim;

constexpr uint32_t kDepth = 256;  // SQ and RQ slots
constexpr uint32_t kCqDepth = 1024;

// The trace's writer thread without the file: drains `sink` every 1 ms into
// its own buffer until stopped.
class TraceDrainer {
 public:
  explicit TraceDrainer(droce::transport::TraceSink* sink) : thread_([this, sink] {
      std::vector<droce::transport::TraceEvent> out;
      while (!stop_.load(std::memory_order_relaxed)) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
        out.clear();
        sink->Drain([&](const droce::transport::TraceEvent* e, size_t n) {
          const size_t at = out.size();
          out.insert(out.end(), e, e + n);
          for (size_t i = at; i < out.size(); ++i) out[i].ns += 1;  // the writer's conversion, roughly
        });
      }
    }) {}
  ~TraceDrainer() {
    stop_.store(true);
    thread_.join();
  }

 private:
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Args: operation (0 SEND, 1 RDMA WRITE, 2 RDMA READ, 3 FETCH_ADD), message
// bytes, path MTU (enum ibv_mtu: 3 = 1024, 5 = 4096), trace (0: none, 1: a
// clock read per event, 2: clock=turn).
void BM_RcTransfer(benchmark::State& state) {
  const auto kind = state.range(0);
  const uint32_t len = kind == 3 ? 8 : static_cast<uint32_t>(state.range(1));
  const uint8_t mtu = static_cast<uint8_t>(state.range(2));
  const queue::WqeOp op = kind == 0   ? queue::WqeOp::kSend
                          : kind == 1 ? queue::WqeOp::kWrite
                          : kind == 2 ? queue::WqeOp::kRead
                                      : queue::WqeOp::kFetchAdd;
  sim::SimPair p(sim::LinkFaults{}, 1);
  sim::ConnectOpts opts;
  opts.mtu = mtu;
  opts.psn = 0;
  opts.timeout = 14;
  opts.max_rd_atomic = opts.max_dest_rd_atomic = 16;
  if (p.Init(kDepth, kCqDepth, len, opts) != 0) {
    state.SkipWithError("modify_qp failed");
    return;
  }
  sim::SimQp &a = p.a, &b = p.b;
  std::unique_ptr<droce::transport::TraceSink> sink;
  std::unique_ptr<TraceDrainer> drainer;
  if (state.range(3) != 0) {
    sink = std::make_unique<droce::transport::TraceSink>(1u << 16, state.range(3) == 2);  // DROCE_TRACE's default ring
    a.qp->SetTrace(sink.get());
    b.qp->SetTrace(sink.get());
    drainer = std::make_unique<TraceDrainer>(sink.get());
  }
  const uint64_t raddr = b.Addr(0);
  queue::Cqe cqes[64];
  uint64_t done = 0, errors = 0, turns = 0;
  for (auto _ : state) {
    // Keep the send queue full and, for SEND, receives posted.
    if (op == queue::WqeOp::kSend) {
      while (b.RqHasRoom()) b.PostRecv(b.rq_prod, 0, len);
    }
    while (a.SqHasRoom()) a.PostOp(op, a.sq_prod, 0, len, raddr, b.key, 1);
    if (sink != nullptr && sink->turn_clock()) sink->StartTurn();
    p.net.Step(32);
    int k;
    while ((k = a.scq_c->Poll(cqes, 64)) > 0) {
      for (int i = 0; i < k; ++i) errors += cqes[i].status != queue::wc::kSuccess;
      done += static_cast<uint64_t>(k);
    }
    while (b.rcq_c->Poll(cqes, 64) > 0) {
    }
    ++turns;
  }
  drainer.reset();
  if (sink != nullptr) state.counters["trace_dropped"] = static_cast<double>(sink->dropped());
  const uint64_t bad = p.net.link.stats.parse_errors;
  const uint64_t frames = p.net.link.stats.sent;
  if (bad != 0 || errors != 0) state.SkipWithError("parse errors or failed completions");
  state.counters["msgs/s"] = benchmark::Counter(static_cast<double>(done), benchmark::Counter::kIsRate);
  state.counters["msgs/turn"] = benchmark::Counter(static_cast<double>(done) / static_cast<double>(turns));
  // Frames both ways (requests, ACKs, READ responses) per message.
  state.counters["frames/msg"] = benchmark::Counter(static_cast<double>(frames) / static_cast<double>(done));
  state.SetBytesProcessed(static_cast<int64_t>(done * len));
  state.SetLabel(kind == 0 ? "SEND" : kind == 1 ? "WRITE" : kind == 2 ? "READ" : "FETCH_ADD");
}
BENCHMARK(BM_RcTransfer)
    ->ArgNames({"op", "bytes", "mtu", "trace"})
    ->Args({0, 64, 3, 0})
    ->Args({0, 64, 3, 1})
    ->Args({0, 64, 3, 2})
    ->Args({0, 4096, 3, 0})
    ->Args({1, 64, 3, 0})
    ->Args({1, 64, 3, 1})
    ->Args({1, 64, 3, 2})
    ->Args({1, 4096, 3, 0})
    ->Args({1, 65536, 3, 0})
    ->Args({1, 65536, 5, 0})
    ->Args({2, 4096, 3, 0})
    ->Args({2, 65536, 3, 0})
    ->Args({3, 8, 3, 0});

}  // namespace

BENCHMARK_MAIN();
