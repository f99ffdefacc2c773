// Microbenchmark of the hand-off between workers (DROCE_WORKERS > 1, issue
// 19): what it costs per packet when a RoCE packet arrives on one worker's rx
// queue but its QP is owned by another worker. The receiving worker parses it
// (wire::parse_frame, ICRC included), finds the QP in the table and enqueues
// the mbuf into the owner's inbox (an rte_ring created as the engine creates
// it: 4096 slots, RING_F_SC_DEQ; since 2026-12-05 the receive step's frames
// for one target go in together, rte_ring_mp_enqueue_burst, before the
// turn's wake-up of the targets: a seq_cst fence and a load; the second
// argument 0 models the engine before, one rte_ring_mp_enqueue per packet
// as it is parsed); the owner
// dequeues bursts of 32 (rte_ring_sc_dequeue_burst), parses again
// (HandleFrame with handed=true), delivers and frees the mbuf. As
// src/engine/worker.cc (Device::PollOnce, HandleFrame, HandOff).
//
//   build/bench/handoff_bench [--benchmark_filter=REGEX]
//
// Cases, each with a 64 B and a 1024 B RC SEND Only payload (the first
// argument) and, for the handed ones, per-packet (0) or batched (1) enqueue:
//   BM_Direct            one worker: parse once, deliver (the path with
//                        DROCE_WORKERS=1, or a packet on its owner's queue)
//   BM_HandedOneThread   both workers on one thread: parse, enqueue, dequeue,
//                        parse again, deliver; the hand-off's CPU cost without
//                        a cache-line transfer. Minus BM_Direct: the cost of
//                        the hand-off itself.
//   BM_HandedTwoThreads  receiver on CPU 0 (EAL main lcore), owner on CPU 1
//                        (EAL lcore 1, spinning): 4 runs of 2^19 packets end
//                        to end; the time per packet is the slower side's.
//                        Which side that is: inbox_full/pkt (the receiver
//                        waited for room: the owner is slower) against
//                        empty_polls/pkt (the owner found its inbox empty),
//                        and `burst`, the owner's mean dequeue. recv_on_cpu
//                        or owner_on_cpu well below 1 (the share of the wall
//                        time each side was on its CPU) means the run was
//                        disturbed; `preempted` counts both sides' involuntary
//                        context switches.
// `per_pkt` is the time per packet. Every case takes its mbufs from an
// rte_pktmbuf_pool in bursts of 32 (standing in for rte_eth_rx_burst; the
// pool's mbufs all hold the frame already) and the worker that delivers a
// packet frees it, as the engine does: that cost is in every case alike.
// What HandleFrame does besides (VLAN and ARP checks, learning the sender's
// MAC on the receiving worker, the transport's OnPacket on the owner) is the
// same with and without a hand-off and is left out; "delivery" reads the
// first 64 bytes of the payload and counts the packet.
//
// Needs no hugepages or NIC (EAL: --no-huge --no-pci, lcores 0-1,
// so a machine with at least 2 CPUs). The two-thread case spins both CPUs for
// well under a second; on a shared or virtual machine its figure depends on
// what else runs there.

#include <benchmark/benchmark.h>

#include <rte_errno.h>
#include <rte_eal.h>
#include <rte_launch.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_pause.h>
#include <rte_prefetch.h>
#include <rte_ring.h>

#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "wire/build.h"
#include "wire/frame.h"

namespace {

namespace wire = droce::wire;

constexpr unsigned kInboxSize = 4096;  // src/engine/device.cc
constexpr uint16_t kRxBurst = 32;      // src/engine/worker.cc
constexpr unsigned kPoolMbufs = 8191;
constexpr unsigned kPoolCache = 256;  // src/io/dpdk_port.cc
constexpr uint32_t kPortIp = 0x0a000002;
constexpr uint32_t kQps = 256;      // QPs in the table, owners alternating
constexpr uint32_t kFirstQpn = 0x10;
constexpr uint32_t kDirectQpn = 0x10;  // owned by worker 0 (the receiver)
constexpr uint32_t kHandedQpn = 0x11;  // owned by worker 1

rte_mempool* g_pool = nullptr;

struct Worker;

// The owner reads only `owner` here (the engine's QpEntry has more).
struct QpEntry {
  Worker* owner = nullptr;
};

struct Worker {
  int index = 0;
  rte_ring* inbox = nullptr;
  // WakeWords::sleeping (never set here: the owner spins), a line of its
  // own as in the engine's shared page; then what the worker writes.
  alignas(64) std::atomic<uint32_t> sleeping{0};
  alignas(64) uint32_t handoff_targets = 0;
  rte_mbuf* outbox[kRxBurst];  // for the other worker (Device::batched)
  uint16_t outbox_n = 0;
  uint64_t handoff_pkts = 0, inbox_full = 0, dropped = 0, delivered = 0, sum = 0;
};

// The device's QP table and its two workers.
struct Device {
  Worker workers[2];
  bool batched = true;  // the engine's FlushHandoffs; false: enqueue per packet
  absl::flat_hash_map<uint32_t, std::unique_ptr<QpEntry>> qps;

  Device() {
    for (int i = 0; i < 2; ++i) {
      workers[i].index = i;
      const std::string name = "handoff_inbox" + std::to_string(i);
      workers[i].inbox = rte_ring_create(name.c_str(), kInboxSize, SOCKET_ID_ANY, RING_F_SC_DEQ);
    }
    for (uint32_t q = 0; q < kQps; ++q) {
      auto e = std::make_unique<QpEntry>();
      e->owner = &workers[q % 2];
      qps.emplace(kFirstQpn + q, std::move(e));
    }
  }
  ~Device() {
    for (Worker& w : workers) rte_ring_free(w.inbox);
  }
  bool ok() const { return workers[0].inbox != nullptr && workers[1].inbox != nullptr; }

  void HandleFrame(Worker& w, rte_mbuf* m, bool handed);
  void HandOff(Worker& from, Worker& to, rte_mbuf* m);
  // After the receive step: the outbox into the other worker's inbox.
  void FlushHandoffs(Worker& from);
  // The end of a turn: wake the workers handed frames (WakeWorker).
  void WakeTargets(Worker& w) {
    for (uint32_t t = w.handoff_targets; t != 0; t &= t - 1) {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      benchmark::DoNotOptimize(workers[__builtin_ctz(t)].sleeping.load(std::memory_order_relaxed));
    }
    w.handoff_targets = 0;
  }
};

inline void Deliver(Worker& w, const wire::PacketView& v) {
  uint64_t s = 0;
  const uint32_t n = std::min<uint32_t>(v.payload_len, 64);
  for (uint32_t i = 0; i < n; ++i) s += v.payload[i];
  w.sum += s;
  ++w.delivered;
  benchmark::DoNotOptimize(w.sum);
}

// Device::HandleFrame's RoCE path for a single-segment frame.
void Device::HandleFrame(Worker& w, rte_mbuf* m, bool handed) {
  const uint8_t* f = rte_pktmbuf_mtod(m, const uint8_t*);
  const uint32_t len = rte_pktmbuf_pkt_len(m);
  wire::PacketView v;
  if (wire::parse_frame({f, len}, &v) != wire::ParseError::kOk || wire::gid_is_multicast(v.dip6.data()) ||
      v.dip != kPortIp) {
    ++w.dropped;
    rte_pktmbuf_free(m);
    return;
  }
  auto it = qps.find(v.bth.dqpn);
  if (it == qps.end() || (handed && it->second->owner != &w)) {
    ++w.dropped;
    rte_pktmbuf_free(m);
    return;
  }
  QpEntry* e = it->second.get();
  if (e->owner != &w) {
    HandOff(w, *e->owner, m);
    return;
  }
  Deliver(w, v);
  rte_pktmbuf_free(m);
}

// The engine drops the frame when the inbox is full (handoff_drop); here the
// receiver waits instead, so that the two-thread case measures the rate the
// slower side sustains (`inbox_full` counts the waits).
void Device::HandOff(Worker& from, Worker& to, rte_mbuf* m) {
  if (batched) {
    from.outbox[from.outbox_n++] = m;  // at most a burst's worth per turn
    return;
  }
  while (rte_ring_mp_enqueue(to.inbox, m) != 0) {
    ++from.inbox_full;
    rte_pause();
  }
  ++from.handoff_pkts;
  from.handoff_targets |= 1u << to.index;
}

void Device::FlushHandoffs(Worker& from) {
  if (from.outbox_n == 0) return;
  Worker& to = workers[1 - from.index];
  unsigned put = 0;
  while ((put += rte_ring_mp_enqueue_burst(to.inbox, reinterpret_cast<void**>(from.outbox + put),
                                           from.outbox_n - put, nullptr)) < from.outbox_n) {
    ++from.inbox_full;
    rte_pause();
  }
  from.handoff_pkts += from.outbox_n;
  from.outbox_n = 0;
  from.handoff_targets |= 1u << to.index;
}

// A RoCEv2 RC SEND Only frame (IPv4, correct ICRC) with `payload` bytes.
std::vector<uint8_t> Frame(size_t payload, uint32_t dqpn) {
  wire::Path p;
  p.sip = 0x0a000001;
  p.dip = kPortIp;
  wire::TransportHeaders h;
  h.bth.opcode = wire::kRcSendOnly;
  h.bth.dqpn = dqpn;
  std::vector<uint8_t> data(payload);
  for (size_t i = 0; i < payload; ++i) data[i] = static_cast<uint8_t>(i * 131 + 7);
  std::vector<uint8_t> f(wire::frame_len_for(p, h.bth.opcode, payload));
  f.resize(wire::build_frame(f, p, h, data));
  return f;
}

// Writes the frame into every mbuf of the pool (all of them are in it), so
// that whichever mbuf a burst allocates holds a frame, as after an rx burst.
bool FillPool(const std::vector<uint8_t>& frame) {
  if (rte_mempool_avail_count(g_pool) != kPoolMbufs) return false;
  rte_mempool_obj_iter(
      g_pool,
      [](rte_mempool*, void* arg, void* obj, unsigned) {
        auto* f = static_cast<const std::vector<uint8_t>*>(arg);
        auto* m = static_cast<rte_mbuf*>(obj);
        std::memcpy(static_cast<uint8_t*>(m->buf_addr) + RTE_PKTMBUF_HEADROOM, f->data(), f->size());
      },
      const_cast<std::vector<uint8_t>*>(&frame));
  return true;
}

// rte_eth_rx_burst's stand-in: a burst of mbufs holding the frame.
inline bool RxBurst(rte_mbuf** rx, uint16_t len) {
  if (rte_pktmbuf_alloc_bulk(g_pool, rx, kRxBurst) != 0) return false;
  for (uint16_t i = 0; i < kRxBurst; ++i) {
    rx[i]->data_len = len;
    rx[i]->pkt_len = len;
  }
  return true;
}

// One worker's rx loop over a burst (PollOnce), then the turn's wake-ups.
inline void RxTurn(Device& d, Worker& w, rte_mbuf** rx, uint16_t n) {
  for (uint16_t i = 0; i < n; ++i) {
    if (i + 1 < n) rte_prefetch0(rte_pktmbuf_mtod(rx[i + 1], void*));
    d.HandleFrame(w, rx[i], /*handed=*/false);
  }
  d.FlushHandoffs(w);
  d.WakeTargets(w);
}

// The owner's inbox step of its turn. Returns the frames dequeued.
inline uint16_t InboxTurn(Device& d, Worker& w) {
  rte_mbuf* rx[kRxBurst];
  const auto n = static_cast<uint16_t>(rte_ring_sc_dequeue_burst(w.inbox, reinterpret_cast<void**>(rx), kRxBurst, nullptr));
  for (uint16_t i = 0; i < n; ++i) d.HandleFrame(w, rx[i], /*handed=*/true);
  return n;
}

void SetPerPacket(benchmark::State& state, int64_t packets) {
  state.SetItemsProcessed(packets);
  state.counters["per_pkt"] = benchmark::Counter(static_cast<double>(packets),
                                                 benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}

bool Setup(benchmark::State& state, Device& d, uint32_t qpn, uint16_t* len, bool batched = true) {
  d.batched = batched;
  if (!d.ok()) {
    state.SkipWithError("rte_ring_create failed");
    return false;
  }
  const auto f = Frame(static_cast<size_t>(state.range(0)), qpn);
  if (f.empty() || !FillPool(f)) {
    state.SkipWithError("frame or pool");
    return false;
  }
  *len = static_cast<uint16_t>(f.size());
  return true;
}

// Case 1: the packet's QP is the receiving worker's own.
void BM_Direct(benchmark::State& state) {
  Device d;
  uint16_t len;
  if (!Setup(state, d, kDirectQpn, &len)) return;
  Worker& a = d.workers[0];
  rte_mbuf* rx[kRxBurst];
  for (auto _ : state) {
    if (!RxBurst(rx, len)) {
      state.SkipWithError("pool empty");
      break;
    }
    RxTurn(d, a, rx, kRxBurst);
  }
  if (a.dropped != 0) state.SkipWithError("frames dropped");
  SetPerPacket(state, static_cast<int64_t>(state.iterations()) * kRxBurst);
}
BENCHMARK(BM_Direct)->Arg(64)->Arg(1024)->MinTime(0.3);

// Case 2: handed to worker 1, both workers' turns on this thread.
void BM_HandedOneThread(benchmark::State& state) {
  Device d;
  uint16_t len;
  if (!Setup(state, d, kHandedQpn, &len, state.range(1) != 0)) return;
  Worker& a = d.workers[0];
  Worker& b = d.workers[1];
  rte_mbuf* rx[kRxBurst];
  for (auto _ : state) {
    if (!RxBurst(rx, len)) {
      state.SkipWithError("pool empty");
      break;
    }
    RxTurn(d, a, rx, kRxBurst);
    benchmark::DoNotOptimize(InboxTurn(d, b));
  }
  if (a.dropped + b.dropped != 0 || a.handoff_pkts != static_cast<uint64_t>(state.iterations()) * kRxBurst) {
    state.SkipWithError("frames dropped");
  }
  SetPerPacket(state, static_cast<int64_t>(state.iterations()) * kRxBurst);
}
BENCHMARK(BM_HandedOneThread)->ArgsProduct({{64, 1024}, {0, 1}})->MinTime(0.3);

// Case 3: worker 1 on EAL lcore 1 (CPU 1), spinning on its inbox until it has
// handled `packets` frames.
constexpr uint64_t kTwoThreadPackets = 1u << 19;
constexpr int kTwoThreadRuns = 4;

// This thread's CPU time and involuntary context switches so far: a side
// that spins but was on its CPU for less than the wall time lost it to
// another thread or to the hypervisor.
struct ThreadUse {
  double cpu_s = 0;
  long preempted = 0;
  static ThreadUse Now() {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    rusage ru{};
    getrusage(RUSAGE_THREAD, &ru);
    return {static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9, ru.ru_nivcsw};
  }
  ThreadUse& operator+=(const ThreadUse& o) {
    cpu_s += o.cpu_s;
    preempted += o.preempted;
    return *this;
  }
  ThreadUse operator-(const ThreadUse& o) const { return {cpu_s - o.cpu_s, preempted - o.preempted}; }
};

struct Owner {
  Device* d = nullptr;
  uint64_t packets = 0;
  std::atomic<bool> ready{false};
  std::chrono::steady_clock::time_point end;
  uint64_t empty_polls = 0, bursts = 0;
  ThreadUse use;
};

int OwnerLoop(void* arg) {
  auto* o = static_cast<Owner*>(arg);
  Worker& b = o->d->workers[1];
  uint64_t got = 0, empty = 0, bursts = 0;
  const ThreadUse use0 = ThreadUse::Now();
  o->ready.store(true, std::memory_order_release);
  while (got < o->packets) {
    const uint16_t n = InboxTurn(*o->d, b);
    if (n == 0) {
      ++empty;
      rte_pause();
      continue;
    }
    ++bursts;
    got += n;
  }
  o->end = std::chrono::steady_clock::now();
  o->use += ThreadUse::Now() - use0;
  o->empty_polls += empty;
  o->bursts += bursts;
  return 0;
}

void BM_HandedTwoThreads(benchmark::State& state) {
  Device d;
  uint16_t len;
  if (!Setup(state, d, kHandedQpn, &len, state.range(1) != 0)) return;
  if (rte_lcore_count() < 2 || rte_get_main_lcore() != 0 || !rte_lcore_is_enabled(1)) {
    state.SkipWithError("needs EAL lcores 0 (main) and 1");
    return;
  }
  Worker& a = d.workers[0];
  uint64_t pool_waits = 0;
  double wall_s = 0;
  ThreadUse recv_use;
  Owner o;
  o.d = &d;
  o.packets = kTwoThreadPackets;
  rte_mbuf* rx[kRxBurst];
  for (auto _ : state) {
    o.ready.store(false, std::memory_order_relaxed);
    if (rte_eal_remote_launch(OwnerLoop, &o, 1) != 0) {
      state.SkipWithError("rte_eal_remote_launch");
      break;
    }
    while (!o.ready.load(std::memory_order_acquire)) rte_pause();
    const ThreadUse use0 = ThreadUse::Now();
    const auto start = std::chrono::steady_clock::now();
    for (uint64_t sent = 0; sent < kTwoThreadPackets; sent += kRxBurst) {
      while (!RxBurst(rx, len)) {
        ++pool_waits;
        rte_pause();
      }
      RxTurn(d, a, rx, kRxBurst);
    }
    rte_eal_wait_lcore(1);  // spins
    recv_use += ThreadUse::Now() - use0;
    const double t = std::chrono::duration<double>(o.end - start).count();
    wall_s += t;
    state.SetIterationTime(t);
  }
  const auto total = static_cast<int64_t>(state.iterations() * kTwoThreadPackets);
  if (a.dropped + d.workers[1].dropped != 0 || a.handoff_pkts != static_cast<uint64_t>(total)) {
    state.SkipWithError("frames dropped");
  }
  SetPerPacket(state, total);
  // Which side waited: the receiver on a full inbox (the owner is the slower
  // side), the owner on an empty one, and the owner's mean burst.
  state.counters["inbox_full/pkt"] = static_cast<double>(a.inbox_full) / static_cast<double>(total);
  state.counters["empty_polls/pkt"] = static_cast<double>(o.empty_polls) / static_cast<double>(total);
  state.counters["burst"] = o.bursts ? static_cast<double>(total) / static_cast<double>(o.bursts) : 0.0;
  state.counters["pool_waits"] = static_cast<double>(pool_waits);
  // The share of the wall time each side was on its CPU (1 if undisturbed;
  // the receiver's includes its wait for the owner to finish), and the times
  // either was preempted.
  if (wall_s > 0) {
    state.counters["recv_on_cpu"] = recv_use.cpu_s / wall_s;
    state.counters["owner_on_cpu"] = o.use.cpu_s / wall_s;
  }
  state.counters["preempted"] = static_cast<double>(recv_use.preempted + o.use.preempted);
}
BENCHMARK(BM_HandedTwoThreads)->ArgsProduct({{64, 1024}, {0, 1}})->UseManualTime()->Iterations(kTwoThreadRuns)->Unit(benchmark::kMillisecond);

std::string g_runtime_dir;

bool InitEal(const char* prog) {
  std::vector<std::string> args = {prog, "--no-huge", "--no-shconf", "--no-pci", "--no-telemetry",
                                   "-l", "0-1", "-m", "64", "--log-level=error",
                                   "--file-prefix=droce-handoff-bench-" + std::to_string(getpid())};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  if (rte_eal_init(static_cast<int>(argv.size() - 1), argv.data()) < 0) {
    std::fprintf(stderr, "handoff_bench: rte_eal_init: %s\n", rte_strerror(rte_errno));
    return false;
  }
  g_runtime_dir = rte_eal_get_runtime_dir();
  g_pool = rte_pktmbuf_pool_create("handoff_pool", kPoolMbufs, kPoolCache, 0, RTE_MBUF_DEFAULT_BUF_SIZE,
                                   SOCKET_ID_ANY);
  if (g_pool == nullptr) {
    std::fprintf(stderr, "handoff_bench: mbuf pool: %s\n", rte_strerror(rte_errno));
    return false;
  }
  return true;
}

void CleanupEal() {
  if (g_pool != nullptr) rte_mempool_free(g_pool);
  rte_eal_cleanup();
  // EAL leaves its runtime directory behind even with --no-shconf.
  std::error_code ec;
  if (!g_runtime_dir.empty()) std::filesystem::remove_all(g_runtime_dir, ec);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  if (!InitEal(argv[0])) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  CleanupEal();
  return 0;
}
