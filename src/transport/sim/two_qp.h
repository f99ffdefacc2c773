// A deterministic in-memory network for driving transport QPs without DPDK:
// QPs with their rings, CQs and registered buffers (SimQp), an environment
// that hands out frame buffers from a pool (SimEnv), and a link that loses,
// duplicates, corrupts and delays frames in virtual time from a seed
// (SimLink). Shared by the unit tests (tests/unit/transport_*_test.cc) and
// the benchmark (bench/transport_bench.cc); header-only, not part of the
// library.
//
// Nothing here allocates per packet once warm: frames come from a free list
// that grows in chunks, the in-flight set is a binary heap in a vector, and
// the fault dice are integer comparisons on one 64-bit generator.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "common/counters.h"
#include "cq/cq.h"
#include "mem/mr_table.h"
#include "queue/abi.h"
#include "queue/ring.h"
#include "queue/shm.h"
#include "queue/wqe_encode.h"
#include "transport/env.h"
#include "transport/qp.h"
#include "transport/scheduler.h"
#include "wire/frame.h"

namespace droce::transport::sim {

// SplitMix64 (Steele, Lea, Flood 2014): a fast, well-mixed generator; the
// link rolls several dice per frame.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : s_(seed) {}
  uint64_t operator()() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }

 private:
  uint64_t s_;
};

// Largest frame: a 4096-byte path MTU plus every header, or a 9 KiB jumbo.
inline constexpr uint32_t kFrameCap = 9216 + 128;

// What the link does to each frame, as probabilities in [0, 1]. A reordered
// frame is held back by 1-21 µs; a duplicate arrives 1-6 µs after sending.
struct LinkFaults {
  double loss = 0, dup = 0, corrupt = 0, reorder = 0;
};

struct LinkStats {
  uint64_t sent = 0, lost = 0, duplicated = 0, corrupted = 0, delivered = 0;
  uint64_t corrupt_caught = 0;  // corrupted frames the parser refused
  uint64_t parse_errors = 0;    // uncorrupted frames the parser refused: a bug
};

class SimLink {
 public:
  SimLink(LinkFaults f, uint64_t seed)
      : rng_(seed),
        loss_(Threshold(f.loss)),
        dup_(Threshold(f.dup)),
        corrupt_(Threshold(f.corrupt)),
        reorder_(Threshold(f.reorder)) {}
  SimLink(const SimLink&) = delete;
  SimLink& operator=(const SimLink&) = delete;

  uint64_t clock = 1'000'000;  // virtual ns
  LinkStats stats;
  // Sees every frame as it is sent, at `clock` (before the fault dice).
  std::function<void(std::span<const uint8_t>)> on_send;
  // Decides when a frame that survived the dice arrives, in place of the
  // fixed 1 µs (a switch: cc/switch.h): sets *due, may rewrite the frame
  // (ECN CE), returns false to drop it (counted in shaped_drop).
  std::function<bool(uint8_t* data, uint32_t len, uint64_t now, uint64_t* due)> shaper;
  uint64_t shaped_drop = 0;

  bool Alloc(uint32_t len, TxFrame* f) {
    if (len > kFrameCap) return false;
    if (free_.empty()) Grow();
    f->data = free_.back();
    free_.pop_back();
    f->capacity = len;
    f->handle = f->data;
    return true;
  }
  // A frame the transport filled (len > 0) or gave back unused (len == 0).
  void Send(const TxFrame& f, uint32_t len) {
    if (len == 0) {
      free_.push_back(f.data);
      return;
    }
    ++stats.sent;
    if (on_send) on_send(std::span<const uint8_t>(f.data, len));
    if (Roll(loss_)) {
      ++stats.lost;
      free_.push_back(f.data);
      return;
    }
    if (Roll(dup_)) {
      ++stats.duplicated;
      TxFrame copy;
      Alloc(len, &copy);
      std::memcpy(copy.data, f.data, len);
      Push(clock + 1000 + rng_() % 5000, copy.data, len);
    }
    const uint64_t jitter = Roll(reorder_) ? 1000 + rng_() % 20000 : 0;
    uint64_t due = clock + 1000 + jitter;
    if (shaper && !shaper(f.data, len, clock, &due)) {
      ++shaped_drop;
      free_.push_back(f.data);
      return;
    }
    Push(due, f.data, len);
  }

  // Puts a copy of `frame` on the link, due now (a test replaying a frame
  // it held back).
  void Inject(std::span<const uint8_t> frame) {
    TxFrame f;
    Alloc(static_cast<uint32_t>(frame.size()), &f);
    std::memcpy(f.data, frame.data(), frame.size());
    Push(clock, f.data, static_cast<uint32_t>(frame.size()));
  }

  bool idle() const { return heap_.empty(); }
  uint64_t next_due() const { return heap_.front().due; }

  // Hands every frame due by `clock` to deliver(PacketView) in delivery
  // order, after the corruption dice; returns how many were delivered.
  template <typename Deliver>
  uint32_t DeliverDue(Deliver&& deliver) {
    uint32_t n = 0;
    while (!heap_.empty() && heap_.front().due <= clock) {
      std::pop_heap(heap_.begin(), heap_.end(), Later);
      const InFlight f = heap_.back();
      heap_.pop_back();
      ++n;
      const bool corrupt = Roll(corrupt_);
      if (corrupt) {
        // Flip one byte after the Ethernet header: the ICRC (or an IP/UDP
        // check) must catch it.
        ++stats.corrupted;
        f.data[14 + rng_() % (f.len - 14)] ^= static_cast<uint8_t>(1 + rng_() % 255);
      }
      wire::PacketView v;
      const wire::ParseError e = wire::parse_frame(std::span<const uint8_t>(f.data, f.len), &v);
      if (e == wire::ParseError::kOk) {
        ++stats.delivered;
        deliver(v);
      } else if (corrupt) {
        ++stats.corrupt_caught;
      } else {
        ++stats.parse_errors;
      }
      free_.push_back(f.data);
    }
    return n;
  }

  uint64_t Rand() { return rng_(); }

 private:
  struct InFlight {
    uint64_t due;
    uint64_t seq;  // ties keep sending order: runs are reproducible
    uint8_t* data;
    uint32_t len;
  };
  static bool Later(const InFlight& a, const InFlight& b) {
    return a.due != b.due ? a.due > b.due : a.seq > b.seq;
  }
  static uint64_t Threshold(double p) {
    if (p <= 0) return 0;
    if (p >= 1) return ~uint64_t{0};
    return static_cast<uint64_t>(p * 18446744073709551616.0);
  }
  bool Roll(uint64_t threshold) { return threshold != 0 && rng_() < threshold; }
  void Push(uint64_t due, uint8_t* data, uint32_t len) {
    heap_.push_back({due, seq_++, data, len});
    std::push_heap(heap_.begin(), heap_.end(), Later);
  }
  void Grow() {
    constexpr uint32_t kChunk = 64;
    chunks_.emplace_back(new uint8_t[size_t{kChunk} * kFrameCap]);
    for (uint32_t i = 0; i < kChunk; ++i) free_.push_back(chunks_.back().get() + size_t{i} * kFrameCap);
  }

  SplitMix64 rng_;
  uint64_t loss_, dup_, corrupt_, reorder_;
  uint64_t seq_ = 0;
  std::vector<InFlight> heap_;
  std::vector<uint8_t*> free_;
  std::vector<std::unique_ptr<uint8_t[]>> chunks_;
};

class SimEnv : public TransportEnv {
 public:
  explicit SimEnv(SimLink* link) : link_(link) {}
  uint64_t NowNs() override { return link_->clock; }
  bool AllocFrame(uint32_t len, TxFrame* f) override { return link_->Alloc(len, f); }
  void SendFrame(const TxFrame& f, uint32_t len) override { link_->Send(f, len); }
  bool ResolveMac(const wire::Ipv6Addr&, wire::MacAddr* mac) override {
    *mac = {2, 0, 0, 0, 0, 9};
    return resolvable;
  }
  mem::MrTable& Mrs() override { return mrs; }
  bool InvalidateRkey(uint32_t rkey, uint32_t pd) override { return mrs.Invalidate(rkey, pd); }
  const AddressHandle* FindAh(uint32_t id) override {
    auto it = ahs.find(id);
    return it == ahs.end() ? nullptr : &it->second;
  }
  bool FindXrcSrq(uint32_t srqn, XrcSrqRef* out) override {
    auto it = xrc_srqs.find(srqn);
    if (it == xrc_srqs.end()) return false;
    *out = it->second;
    return true;
  }
  Counters& Stats() override { return stats; }

  bool resolvable = true;  // false: the destination never answers ARP
  std::map<uint32_t, AddressHandle> ahs;
  std::map<uint32_t, XrcSrqRef> xrc_srqs;  // XRC SRQs by number (a target's domain)
  mem::MrTable mrs;
  Counters stats;

 private:
  SimLink* link_;
};

// Writes a one-SGE receive WQE into `ring` (a QP's RQ or an SRQ) and
// publishes it.
inline void PostRecvWqe(queue::Ring& ring, uint32_t* prod, uint64_t wr_id, uint64_t addr, uint32_t len,
                        uint32_t key) {
  uint8_t* slot = ring.slot(*prod);
  const queue::RecvWqe w{wr_id, 1, 0};
  const queue::Sge s{addr, len, key};
  std::memcpy(slot, &w, sizeof(w));
  std::memcpy(slot + sizeof(w), &s, sizeof(s));
  ring.publish_prod(++*prod);
}

// How a SimQp is connected (RTR/RTS attributes).
struct ConnectOpts {
  uint8_t mtu = 3;  // enum ibv_mtu
  uint32_t psn = 0xFFFFF0;  // both directions; the default wraps early
  uint8_t timeout = 10;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint8_t min_rnr_timer = 1;
  uint8_t max_rd_atomic = 4;
  uint8_t max_dest_rd_atomic = 4;
  uint32_t qkey = 0x1111;  // UD
  // To the peer's IPv6 address (GID index 1) with these GRH fields, instead
  // of its IPv4-mapped one; SimPair gives both ports an IPv6 address.
  bool ipv6 = false;
  uint8_t traffic_class = 0;
  uint32_t flow_label = 0;
  uint8_t hop_limit = 0;
};

inline constexpr uint32_t kSimPd = 1;
inline constexpr uint32_t kSimAccess =
    mem::kLocalWrite | mem::kRemoteWrite | mem::kRemoteRead | mem::kRemoteAtomic | mem::kMwBind;

// One QP with its SQ/RQ rings, send and receive CQs and one registered
// buffer, all on the environment `env`.
// It runs when its scheduler (SimNet's, once attached) says so, as a QP of
// the engine's worker does: a post rings its doorbell (Doorbell), and so
// does a modify made through Modify.
struct SimQp : Schedulable {
  static constexpr uint32_t kMaxSge = 4;
  static constexpr uint32_t kMaxInline = 64;  // fits the SQ slot of 4 SGEs

  std::unique_ptr<SimEnv> env;
  queue::ShmRegion shm;
  queue::Ring sq, rq;
  std::unique_ptr<cq::CqRegion> scq_region, rcq_region;
  std::unique_ptr<cq::CqProducer> scq, rcq;
  std::unique_ptr<cq::CqConsumer> scq_c, rcq_c;
  std::unique_ptr<Qp> qp;
  std::vector<uint8_t> buf;
  uint32_t key = 0;
  uint32_t ip = 0;
  wire::Ipv6Addr ip6{};  // with has_ip6: the port's GID index 1
  bool has_ip6 = false;
  uint32_t rate_kbps = 0;  // QpInit::rate_kbps (DROCE_RATE), set before Init
  uint32_t rate_burst = 0;  // QpInit::rate_burst
  cc::CcMode cc = cc::CcMode::kOff;  // QpInit's congestion control, set before Init
  cc::DcqcnParams dcqcn;
  uint32_t line_mbps = 25000;
  SelectiveRepeat sr;      // QpInit::sr (DROCE_SR), set before Init
  AdaptiveRetrans adp;     // QpInit::adp (DROCE_ADP_RETRANS), set before Init
  uint32_t xrcd = 0;       // an XRC target's domain, set before Init
  uint32_t sq_prod = 0, rq_prod = 0;
  QpScheduler<SimQp>* sched = nullptr;  // set by SimNet::Attach

  // New work for the QP (the engine's doorbell and ModifyQp activate it).
  void Doorbell() {
    if (sched != nullptr) sched->Activate(this);
  }
  // Qp::Modify, then activated as the engine's ModifyQp does.
  int Modify(const QpAttr& a, uint32_t mask) {
    const int e = qp->Modify(a, mask);
    if (e == 0) Doorbell();
    return e;
  }

  void Init(SimLink* link, uint32_t qpn, uint32_t ip_addr, uint32_t depth, uint32_t cq_depth,
            size_t buf_len, QpType type = QpType::kRc, const wire::Ipv6Addr* ip6_addr = nullptr) {
    env = std::make_unique<SimEnv>(link);
    ip = ip_addr;
    has_ip6 = ip6_addr != nullptr;
    if (has_ip6) ip6 = *ip6_addr;
    const uint32_t sstride = sizeof(queue::SendWqe) + kMaxSge * sizeof(queue::Sge);
    const uint32_t rstride = sizeof(queue::RecvWqe) + kMaxSge * sizeof(queue::Sge);
    const size_t sq_len = queue::ring_bytes(depth, sstride);
    shm = *queue::ShmRegion::Create("sim-qp", sq_len + queue::ring_bytes(depth, rstride));
    sq = queue::Ring::Init(shm.data(), depth, sstride);
    rq = queue::Ring::Init(static_cast<uint8_t*>(shm.data()) + sq_len, depth, rstride);
    scq_region = *cq::CqRegion::Create(cq_depth);
    rcq_region = *cq::CqRegion::Create(cq_depth);
    scq = std::make_unique<cq::CqProducer>(scq_region.get(), nullptr, 1);
    rcq = std::make_unique<cq::CqProducer>(rcq_region.get(), nullptr, 2);
    scq_c = std::make_unique<cq::CqConsumer>(scq_region.get());
    rcq_c = std::make_unique<cq::CqConsumer>(rcq_region.get());
    QpInit init;
    init.qpn = qpn;
    init.type = type;
    init.pd = kSimPd;
    init.caps = {depth, depth, kMaxSge, kMaxSge, kMaxInline};
    init.sq = sq;
    init.rq = rq;
    init.send_cq = scq.get();
    init.recv_cq = rcq.get();
    init.port.mac = {2, 0, 0, 0, 0, static_cast<uint8_t>(qpn)};
    init.port.ip = ip;
    init.port.max_mtu = 5;
    init.port.has_ip6 = has_ip6;
    init.port.ip6 = ip6;
    init.rate_kbps = rate_kbps;
    init.rate_burst = rate_burst;
    init.cc = cc;
    init.dcqcn = dcqcn;
    init.line_mbps = line_mbps;
    init.sr = sr;
    init.adp = adp;
    if (type == QpType::kXrcTgt) {
      // No PD, queues or CQs of its own: each request names an SRQ
      // (env->xrc_srqs) that brings them.
      init.pd = 0;
      init.xrcd = xrcd;
      init.send_cq = init.recv_cq = nullptr;
    } else if (type == QpType::kXrcIni) {
      init.recv_cq = nullptr;
    }
    qp = std::make_unique<Qp>(init, env.get());
    buf.resize(buf_len);  // contents are the caller's business
    key = env->mrs.Register(kSimPd, Addr(0), Addr(0), buf.size(), kSimAccess)->key;
  }

  uint64_t Addr(size_t off) { return reinterpret_cast<uint64_t>(buf.data()) + off; }

  static AddressVector AvTo(uint32_t peer_ip) {
    AddressVector av;
    av.is_global = true;
    av.dgid[10] = av.dgid[11] = 0xFF;
    av.dgid[12] = static_cast<uint8_t>(peer_ip >> 24);
    av.dgid[13] = static_cast<uint8_t>(peer_ip >> 16);
    av.dgid[14] = static_cast<uint8_t>(peer_ip >> 8);
    av.dgid[15] = static_cast<uint8_t>(peer_ip);
    return av;
  }
  // The address vector of a connection to `peer` as `o` asks.
  static AddressVector AvFor(const SimQp& peer, const ConnectOpts& o) {
    if (!o.ipv6) return AvTo(peer.ip);
    AddressVector av;
    av.is_global = true;
    std::memcpy(av.dgid, peer.ip6.data(), 16);
    av.sgid_index = kGidIndexIpv6;
    av.traffic_class = o.traffic_class;
    av.flow_label = o.flow_label;
    av.hop_limit = o.hop_limit;
    return av;
  }

  // RESET → INIT → RTR → RTS towards `peer` (RC, UC), or for UD with the
  // peer's address handle installed as id 1. Returns 0 or the failing errno.
  int Connect(const SimQp& peer, const ConnectOpts& o = {}) {
    const QpType type = qp->type();
    QpAttr a;
    a.state = QpState::kInit;
    a.access_flags = mem::kRemoteWrite | mem::kRemoteRead | mem::kRemoteAtomic;
    a.qkey = o.qkey;
    uint32_t mask = kAttrState | kAttrPkeyIndex | kAttrPort;
    mask |= type == QpType::kUd ? kAttrQkey : kAttrAccessFlags;
    if (int e = qp->Modify(a, mask); e != 0) return e;
    a.state = QpState::kRtr;
    mask = kAttrState;
    if (type == QpType::kUd) {
      AddressHandle ah;
      ah.av = AvFor(peer, o);
      std::memcpy(ah.dgid.data(), ah.av.dgid, 16);
      ah.pd = kSimPd;
      env->ahs[1] = ah;
    } else {
      a.av = AvFor(peer, o);
      a.path_mtu = o.mtu;
      a.dest_qpn = peer.qp->qpn();
      a.rq_psn = o.psn;
      mask |= kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn;
      if (type == QpType::kRc || type == QpType::kXrcTgt) {  // a responder
        a.max_dest_rd_atomic = o.max_dest_rd_atomic;
        a.min_rnr_timer = o.min_rnr_timer;
        mask |= kAttrMaxDestRdAtomic | kAttrMinRnrTimer;
      }
    }
    if (int e = qp->Modify(a, mask); e != 0) return e;
    a.state = QpState::kRts;
    a.sq_psn = o.psn;
    mask = kAttrState | kAttrSqPsn;
    if (type == QpType::kXrcTgt) {
      a.timeout = o.timeout;  // required, as ib_modify_qp_is_ok has it
      mask |= kAttrTimeout;
    }
    if (type == QpType::kRc || type == QpType::kXrcIni) {  // a requester
      a.timeout = o.timeout;
      a.retry_cnt = o.retry_cnt;
      a.rnr_retry = o.rnr_retry;
      a.max_rd_atomic = o.max_rd_atomic;
      mask |= kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic;
    }
    return Modify(a, mask);
  }

  bool SqHasRoom() const { return sq_prod - sq.load_cons_acquire() < sq.size(); }
  bool RqHasRoom() const { return rq_prod - rq.load_cons_acquire() < rq.size(); }

  // Posts a send WQE with its w.num_sge SGEs.
  void Post(const queue::SendWqe& w, const queue::Sge* sges) {
    uint8_t* slot = sq.slot(sq_prod);
    std::memcpy(slot, &w, sizeof(w));
    std::memcpy(slot + sizeof(w), sges, sizeof(queue::Sge) * w.num_sge);
    sq.publish_prod(++sq_prod);
    Doorbell();
  }
  // Posts a send WQE with kWqeInline and w.inline_len bytes of `data`.
  void PostInline(const queue::SendWqe& w, const uint8_t* data) {
    uint8_t* slot = sq.slot(sq_prod);
    std::memcpy(slot, &w, sizeof(w));
    std::memcpy(slot + sizeof(w), data, w.inline_len);
    sq.publish_prod(++sq_prod);
    Doorbell();
  }
  // Fills the part of `w` its op takes from (raddr, rkey, cmp, swp), as the
  // provider would: RDMA and atomics their remote address and key (and the
  // atomic operands; ATOMIC WRITE: cmp's 8 bytes as its data, no SGE), SEND
  // with Invalidate `rkey` as the key to invalidate.
  static void EncodeRemote(queue::SendWqe* w, uint64_t raddr, uint32_t rkey, uint64_t cmp = 0, uint64_t swp = 0) {
    switch (w->op) {
      case queue::WqeOp::kWrite:
      case queue::WqeOp::kWriteImm:
      case queue::WqeOp::kRead: queue::EncodeRdma(w, raddr, rkey); break;
      case queue::WqeOp::kCmpSwap:
      case queue::WqeOp::kFetchAdd: queue::EncodeAtomic(w, raddr, rkey, cmp, swp); break;
      case queue::WqeOp::kAtomicWrite: queue::EncodeAtomicWrite(w, raddr, rkey, &cmp); break;
      case queue::WqeOp::kSendInv: w->invalidate_rkey = rkey; break;
      default: break;
    }
  }
  // One-SGE operation on [off, off + len) of the buffer.
  void PostOp(queue::WqeOp op, uint64_t wr_id, uint32_t off, uint32_t len, uint64_t raddr = 0,
              uint32_t rkey = 0, uint64_t cmp = 0, uint64_t swp = 0, uint32_t lkey_override = 0) {
    queue::SendWqe w = queue::SendWqeHeader(wr_id, op, queue::kWqeSignaled, 0, 0);
    w.num_sge = 1;
    EncodeRemote(&w, raddr, rkey, cmp, swp);
    const queue::Sge s{Addr(off), len, lkey_override ? lkey_override : key};
    Post(w, &s);
  }
  void PostSend(uint64_t wr_id, uint32_t off, uint32_t len, uint32_t lkey_override = 0) {
    PostOp(queue::WqeOp::kSend, wr_id, off, len, 0, 0, 0, 0, lkey_override);
  }
  void PostRecv(uint64_t wr_id, uint32_t off, uint32_t len) {
    PostRecvWqe(rq, &rq_prod, wr_id, Addr(off), len, key);
    Doorbell();
  }
};

// Two (or more) QPs on one link, driven one loop turn at a time as the
// engine's worker would: send, let the link deliver what is due, run the
// timers, advance virtual time.
class SimNet {
 public:
  SimNet(LinkFaults f, uint64_t seed) : link(f, seed) {}
  SimLink link;

  void Attach(SimQp* q) {
    qps_.push_back(q);
    q->sched = &sched_;
    sched_.Activate(q);
  }

  // One loop turn; returns false when nothing happened (no packet sent or
  // delivered, nothing in flight): the caller decides whether it is done.
  bool Step(unsigned budget = 16) {
    bool more = false;
    const uint64_t sent_before = link.stats.sent;
    // The engine worker's turn (engine/worker.cc), in virtual time: paced
    // QPs due, the active QPs' sends, the link's deliveries, the timers.
    auto find = [this](uint32_t qpn) { return Find(qpn); };
    sched_.RunPaced(link.clock, find);
    more = sched_.PollActive(budget, [](SimQp*) {}, find);
    const uint32_t delivered = link.DeliverDue([&](const wire::PacketView& v) {
      if (tap && !tap(v)) return;
      if (SimQp* q = Find(v.bth.dqpn); q != nullptr) {
        q->qp->OnPacket(v);
        sched_.AfterPacket(q, v.info->mask & wire::kMaskResponse, find);
        return;
      }
      ++unrouted;  // a corrupted QPN that still passed the ICRC: impossible
    });
    const bool active = more || delivered != 0 || link.stats.sent != sent_before;
    // Busy: a short step. Waiting for the link: jump to the next delivery
    // Nothing in flight: a timer may be pending, advance in 100 µs steps.
    // Never past the moment a paced QP may send again (transport/pacer.h),
    // so that paced departures are exact in virtual time.
    uint64_t paced = UINT64_MAX;
    for (SimQp* q : qps_) {
      if (q->qp->paced_until() > link.clock) paced = std::min(paced, q->qp->paced_until());
    }
    if (active) {
      link.clock += 500;
    } else if (!link.idle()) {
      // ... or to a QP's timer, if that comes first: a timer must fire
      // while its frames are still on the way (a peer that stopped, a path
      // that slowed down), as it would on a real link.
      uint64_t next = link.next_due();
      for (SimQp* q : qps_) next = std::min(next, q->qp->TimerDue());
      link.clock = std::max(link.clock + 1, next);
    } else {
      link.clock += 100'000;
    }
    link.clock = std::min(link.clock, paced);
    sched_.RunTimers(link.clock, 1, find, [](SimQp*) {});
    return active || !link.idle() || paced != UINT64_MAX;
  }

  // Steps until done() or until virtual time passes `limit_ns`; false on
  // timeout.
  template <typename Done>
  bool Run(Done&& done, uint64_t limit_ns = 60'000'000'000ull) {
    while (!done()) {
      if (link.clock > limit_ns) return false;
      Step();
    }
    return true;
  }

  // Sees every frame before its QP does; returning false drops it (a test
  // that holds a frame back copies it and Injects it later).
  std::function<bool(const wire::PacketView&)> tap;
  uint64_t unrouted = 0;

 private:
  SimQp* Find(uint32_t qpn) const {
    for (SimQp* q : qps_) {
      if (q->qp->qpn() == qpn) return q;
    }
    return nullptr;
  }

  std::vector<SimQp*> qps_;
  QpScheduler<SimQp> sched_;
};

// Two QPs, 0x11 at 10.0.0.1 (and fd78:1::11) and 0x22 at 10.0.0.2 (and
// fd78:1::12), connected to each other.
struct SimPair {
  static constexpr wire::Ipv6Addr kIp6A = {0xfd, 0x78, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x11};
  static constexpr wire::Ipv6Addr kIp6B = {0xfd, 0x78, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12};
  SimPair(LinkFaults f, uint64_t seed) : net(f, seed) {}
  SimPair(const SimPair&) = delete;
  SimPair& operator=(const SimPair&) = delete;

  // Returns 0 or the errno of the modify that failed.
  int Init(uint32_t depth, uint32_t cq_depth, size_t buf_len, const ConnectOpts& o = {},
           QpType type = QpType::kRc) {
    a.Init(&net.link, 0x11, 0x0A000001, depth, cq_depth, buf_len, type, &kIp6A);
    b.Init(&net.link, 0x22, 0x0A000002, depth, cq_depth, buf_len, type, &kIp6B);
    net.Attach(&a);
    net.Attach(&b);
    if (int e = a.Connect(b, o); e != 0) return e;
    return b.Connect(a, o);
  }

  SimNet net;
  SimQp a, b;
};

}  // namespace droce::transport::sim
