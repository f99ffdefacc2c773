// A simulated RC transfer without I/O: two transport::Qp objects (requester
// and responder) on one thread, joined by an in-memory link that hands each
// frame straight to the other QP. Everything of droce's fast path but DPDK
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
//   build/bench/transport_bench [--benchmark_filter=REGEX]

#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "common/counters.h"
#include "cq/cq.h"
#include "mem/mr_table.h"
#include "queue/abi.h"
#include "queue/ring.h"
#include "queue/shm.h"
#include "transport/env.h"
#include "transport/qp.h"
#include "wire/frame.h"

namespace {

namespace queue = droce::queue;
namespace transport = droce::transport;
namespace wire = droce::wire;
namespace cq = droce::cq;
namespace mem = droce::mem;

constexpr uint32_t kFrameCap = 9216 + 128;
constexpr uint32_t kPoolFrames = 2048;
constexpr uint32_t kDepth = 256;  // SQ and RQ slots
constexpr uint32_t kCqDepth = 1024;
constexpr uint32_t kMaxSge = 4;

// The wire: a pool of frame buffers and the frames in flight, in order.
struct Link {
  std::vector<std::unique_ptr<uint8_t[]>> storage;
  std::vector<uint8_t*> free;
  struct Frame {
    uint8_t* data;
    uint32_t len;
  };
  std::vector<Frame> inflight, delivering;
  uint64_t clock = 1'000'000;

  Link() {
    for (uint32_t i = 0; i < kPoolFrames; ++i) {
      storage.emplace_back(new uint8_t[kFrameCap]);
      free.push_back(storage.back().get());
    }
    inflight.reserve(kPoolFrames);
    delivering.reserve(kPoolFrames);
  }
};

class LinkEnv : public transport::TransportEnv {
 public:
  explicit LinkEnv(Link* link) : link_(link) {}
  uint64_t NowNs() override { return link_->clock; }
  bool AllocFrame(uint32_t len, transport::TxFrame* f) override {
    if (len > kFrameCap || link_->free.empty()) return false;
    f->data = link_->free.back();
    link_->free.pop_back();
    f->capacity = len;
    f->handle = f->data;
    return true;
  }
  void SendFrame(const transport::TxFrame& f, uint32_t len) override {
    if (len == 0) {
      link_->free.push_back(f.data);
      return;
    }
    link_->inflight.push_back({f.data, len});
  }
  bool ResolveMac(const wire::Ipv6Addr&, wire::MacAddr* mac) override {
    *mac = {2, 0, 0, 0, 0, 9};
    return true;
  }
  mem::MrTable& Mrs() override { return mrs; }
  bool InvalidateRkey(uint32_t rkey, uint32_t pd) override { return mrs.Invalidate(rkey, pd); }
  const transport::AddressHandle* FindAh(uint32_t) override { return nullptr; }
  droce::Counters& Stats() override { return stats; }

  mem::MrTable mrs;
  droce::Counters stats;

 private:
  Link* link_;
};

struct End {
  std::unique_ptr<LinkEnv> env;
  queue::ShmRegion shm;
  queue::Ring sq, rq;
  std::unique_ptr<cq::CqRegion> scq_region, rcq_region;
  std::unique_ptr<cq::CqProducer> scq, rcq;
  std::unique_ptr<cq::CqConsumer> scq_c, rcq_c;
  std::unique_ptr<transport::Qp> qp;
  std::vector<uint8_t> buf;
  uint32_t key = 0;
  uint32_t sq_prod = 0, rq_prod = 0;

  void Init(Link* link, uint32_t qpn, uint32_t ip, size_t buf_len) {
    env = std::make_unique<LinkEnv>(link);
    const uint32_t sstride = sizeof(queue::SendWqe) + kMaxSge * sizeof(queue::Sge);
    const uint32_t rstride = sizeof(queue::RecvWqe) + kMaxSge * sizeof(queue::Sge);
    const size_t sq_len = queue::ring_bytes(kDepth, sstride);
    shm = *queue::ShmRegion::Create("bench-qp", sq_len + queue::ring_bytes(kDepth, rstride));
    sq = queue::Ring::Init(shm.data(), kDepth, sstride);
    rq = queue::Ring::Init(static_cast<uint8_t*>(shm.data()) + sq_len, kDepth, rstride);
    scq_region = *cq::CqRegion::Create(kCqDepth);
    rcq_region = *cq::CqRegion::Create(kCqDepth);
    scq = std::make_unique<cq::CqProducer>(scq_region.get(), nullptr, 1);
    rcq = std::make_unique<cq::CqProducer>(rcq_region.get(), nullptr, 2);
    scq_c = std::make_unique<cq::CqConsumer>(scq_region.get());
    rcq_c = std::make_unique<cq::CqConsumer>(rcq_region.get());
    transport::QpInit init;
    init.qpn = qpn;
    init.pd = 1;
    init.caps = {kDepth, kDepth, kMaxSge, kMaxSge, 64};
    init.sq = sq;
    init.rq = rq;
    init.send_cq = scq.get();
    init.recv_cq = rcq.get();
    init.port.mac = {2, 0, 0, 0, 0, static_cast<uint8_t>(qpn)};
    init.port.ip = ip;
    init.port.max_mtu = 5;
    qp = std::make_unique<transport::Qp>(init, env.get());
    buf.assign(buf_len, 0x5a);
    key = env->mrs.Register(1, reinterpret_cast<uint64_t>(buf.data()), reinterpret_cast<uint64_t>(buf.data()),
                            buf.size(), mem::kLocalWrite | mem::kRemoteWrite | mem::kRemoteRead |
                                            mem::kRemoteAtomic)->key;
  }

  bool Connect(uint32_t peer_qpn, uint32_t peer_ip, uint8_t mtu) {
    transport::QpAttr a;
    a.state = transport::QpState::kInit;
    a.access_flags = mem::kRemoteWrite | mem::kRemoteRead | mem::kRemoteAtomic;
    if (qp->Modify(a, transport::kAttrState | transport::kAttrPkeyIndex | transport::kAttrPort |
                          transport::kAttrAccessFlags) != 0) {
      return false;
    }
    a.state = transport::QpState::kRtr;
    a.av.is_global = true;
    a.av.dgid[10] = a.av.dgid[11] = 0xFF;
    a.av.dgid[12] = static_cast<uint8_t>(peer_ip >> 24);
    a.av.dgid[13] = static_cast<uint8_t>(peer_ip >> 16);
    a.av.dgid[14] = static_cast<uint8_t>(peer_ip >> 8);
    a.av.dgid[15] = static_cast<uint8_t>(peer_ip);
    a.path_mtu = mtu;
    a.dest_qpn = peer_qpn;
    a.rq_psn = 0;
    a.max_dest_rd_atomic = 16;
    a.min_rnr_timer = 1;
    if (qp->Modify(a, transport::kAttrState | transport::kAttrAv | transport::kAttrPathMtu |
                          transport::kAttrDestQpn | transport::kAttrRqPsn | transport::kAttrMaxDestRdAtomic |
                          transport::kAttrMinRnrTimer) != 0) {
      return false;
    }
    a.state = transport::QpState::kRts;
    a.sq_psn = 0;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    return qp->Modify(a, transport::kAttrState | transport::kAttrSqPsn | transport::kAttrTimeout |
                             transport::kAttrRetryCnt | transport::kAttrRnrRetry |
                             transport::kAttrMaxQpRdAtomic) == 0;
  }

  bool SqHasRoom() const { return sq_prod - sq.load_cons_acquire() < sq.size(); }
  bool RqHasRoom() const { return rq_prod - rq.load_cons_acquire() < rq.size(); }

  void PostRecv(uint32_t len) {
    uint8_t* slot = rq.slot(rq_prod);
    queue::RecvWqe w{rq_prod, 1, 0};
    queue::Sge s{reinterpret_cast<uint64_t>(buf.data()), len, key};
    std::memcpy(slot, &w, sizeof(w));
    std::memcpy(slot + sizeof(w), &s, sizeof(s));
    ++rq_prod;
  }
  void PostSend(queue::WqeOp op, uint32_t len, uint64_t raddr, uint32_t rkey) {
    uint8_t* slot = sq.slot(sq_prod);
    queue::SendWqe w{};
    w.wr_id = sq_prod;
    w.op = op;
    w.flags = queue::kWqeSignaled;
    w.num_sge = 1;
    w.remote_addr = raddr;
    w.rkey = rkey;
    w.compare_add = 1;
    queue::Sge s{reinterpret_cast<uint64_t>(buf.data()), len, key};
    std::memcpy(slot, &w, sizeof(w));
    std::memcpy(slot + sizeof(w), &s, sizeof(s));
    ++sq_prod;
  }
};

// Hands every frame in flight to the QP it is addressed to.
bool Deliver(Link& link, End& a, End& b, uint64_t* bad, uint64_t* frames) {
  if (link.inflight.empty()) return false;
  *frames += link.inflight.size();
  link.delivering.swap(link.inflight);
  for (const Link::Frame& f : link.delivering) {
    wire::PacketView v;
    if (wire::parse_frame(std::span<const uint8_t>(f.data, f.len), &v) == wire::ParseError::kOk) {
      (v.bth.dqpn == a.qp->qpn() ? a : b).qp->OnPacket(v);
    } else {
      ++*bad;
    }
    link.free.push_back(f.data);
  }
  link.delivering.clear();
  return true;
}

// Args: operation (0 SEND, 1 RDMA WRITE, 2 RDMA READ, 3 FETCH_ADD), message
// bytes, path MTU (enum ibv_mtu: 3 = 1024, 5 = 4096).
void BM_RcTransfer(benchmark::State& state) {
  const auto kind = state.range(0);
  const uint32_t len = kind == 3 ? 8 : static_cast<uint32_t>(state.range(1));
  const uint8_t mtu = static_cast<uint8_t>(state.range(2));
  const queue::WqeOp op = kind == 0   ? queue::WqeOp::kSend
                          : kind == 1 ? queue::WqeOp::kWrite
                          : kind == 2 ? queue::WqeOp::kRead
                                      : queue::WqeOp::kFetchAdd;
  Link link;
  End a, b;
  a.Init(&link, 0x11, 0x0A000001, len);
  b.Init(&link, 0x22, 0x0A000002, len);
  if (!a.Connect(0x22, 0x0A000002, mtu) || !b.Connect(0x11, 0x0A000001, mtu)) {
    state.SkipWithError("modify_qp failed");
    return;
  }
  const uint64_t raddr = reinterpret_cast<uint64_t>(b.buf.data());
  queue::Cqe cqes[64];
  uint64_t done = 0, bad = 0, errors = 0, turns = 0, frames = 0;
  for (auto _ : state) {
    // Keep the send queue full and, for SEND, receives posted.
    if (op == queue::WqeOp::kSend) {
      while (b.RqHasRoom()) b.PostRecv(len);
      b.rq.publish_prod(b.rq_prod);
    }
    while (a.SqHasRoom()) a.PostSend(op, len, raddr, b.key);
    a.sq.publish_prod(a.sq_prod);
    a.qp->PollSend(32);
    b.qp->PollSend(32);
    Deliver(link, a, b, &bad, &frames);
    b.qp->PollSend(32);  // ACKs and READ responses owed
    Deliver(link, a, b, &bad, &frames);
    int k;
    while ((k = a.scq_c->Poll(cqes, 64)) > 0) {
      for (int i = 0; i < k; ++i) errors += cqes[i].status != queue::wc::kSuccess;
      done += static_cast<uint64_t>(k);
    }
    while (b.rcq_c->Poll(cqes, 64) > 0) {
    }
    link.clock += 100;
    if ((++turns & 1023) == 0) {
      a.qp->OnTimer(link.clock);
      b.qp->OnTimer(link.clock);
    }
  }
  if (bad != 0 || errors != 0) state.SkipWithError("parse errors or failed completions");
  state.counters["msgs/s"] = benchmark::Counter(static_cast<double>(done), benchmark::Counter::kIsRate);
  state.counters["msgs/turn"] = benchmark::Counter(static_cast<double>(done) / static_cast<double>(turns));
  // Frames both ways (requests, ACKs, READ responses) per message.
  state.counters["frames/msg"] = benchmark::Counter(static_cast<double>(frames) / static_cast<double>(done));
  state.SetBytesProcessed(static_cast<int64_t>(done * len));
  state.SetLabel(kind == 0 ? "SEND" : kind == 1 ? "WRITE" : kind == 2 ? "READ" : "FETCH_ADD");
}
BENCHMARK(BM_RcTransfer)
    ->ArgNames({"op", "bytes", "mtu"})
    ->Args({0, 64, 3})
    ->Args({0, 4096, 3})
    ->Args({1, 64, 3})
    ->Args({1, 4096, 3})
    ->Args({1, 65536, 3})
    ->Args({1, 65536, 5})
    ->Args({2, 4096, 3})
    ->Args({2, 65536, 3})
    ->Args({3, 8, 3});

}  // namespace

BENCHMARK_MAIN();
