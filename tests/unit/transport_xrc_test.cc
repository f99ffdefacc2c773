// XRC (IBA 9.8.3) in the virtual-time simulator: an XRC
// initiator QP sends to the XRC SRQs behind one XRC target QP, naming each
// in the XRCETH; the target executes every request on the SRQ it names (its
// receive WQEs, its CQ, its PD) and refuses an SRQ outside its domain.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <vector>

#include "transport/sim/two_qp.h"
#include "wire/frame.h"
#include "wire/opcode.h"

namespace droce::test {
namespace {

using transport::QpState;
using transport::QpType;
using transport::sim::LinkFaults;
using transport::sim::SimNet;
using transport::sim::SimQp;

constexpr uint32_t kXrcd = 7;

// An XRC SRQ of the target's environment: its ring, its CQ and its number.
struct XrcSrq {
  queue::ShmRegion shm;
  queue::Ring ring;
  std::unique_ptr<transport::Srq> srq;
  std::unique_ptr<cq::CqRegion> cq_region;
  std::unique_ptr<cq::CqProducer> cq;
  std::unique_ptr<cq::CqConsumer> cq_c;
  uint32_t prod = 0;
  uint32_t key = 0;  // lkey of the receive buffers (the target's MR)
  uint64_t base = 0;

  void Init(transport::sim::SimEnv* env, uint32_t srqn, uint32_t pd, uint32_t xrcd, const SimQp& owner) {
    constexpr uint32_t kDepth = 64;
    const uint32_t stride = sizeof(queue::RecvWqe) + SimQp::kMaxSge * sizeof(queue::Sge);
    shm = *queue::ShmRegion::Create("sim-xrc-srq", queue::ring_bytes(kDepth, stride));
    ring = queue::Ring::Init(shm.data(), kDepth, stride);
    srq = std::make_unique<transport::Srq>(ring, SimQp::kMaxSge);
    cq_region = *cq::CqRegion::Create(256);
    cq = std::make_unique<cq::CqProducer>(cq_region.get(), nullptr, 10 + srqn);
    cq_c = std::make_unique<cq::CqConsumer>(cq_region.get());
    env->xrc_srqs[srqn] = {srq.get(), cq.get(), pd, xrcd, srqn};
    key = owner.key;
    base = reinterpret_cast<uint64_t>(owner.buf.data());
  }
  void PostRecv(uint64_t wr_id, uint32_t off, uint32_t len) {
    transport::sim::PostRecvWqe(ring, &prod, wr_id, base + off, len, key);
  }
};

// One XRC initiator (a, QPN 0x11) connected to one XRC target (b, QPN 0x22)
// of domain kXrcd, whose environment holds SRQs 5 and 9 of that domain
// (PD kSimPd) and SRQ 12 of another domain.
struct XrcPair {
  explicit XrcPair(LinkFaults f = {}, uint64_t seed = 1, uint8_t mtu = 3) : net(f, seed) {
    a.Init(&net.link, 0x11, 0x0A000001, 64, 256, 64 * 1024, QpType::kXrcIni);
    b.xrcd = kXrcd;
    b.Init(&net.link, 0x22, 0x0A000002, 64, 256, 512 * 1024, QpType::kXrcTgt);
    net.Attach(&a);
    net.Attach(&b);
    srq5.Init(b.env.get(), 5, transport::sim::kSimPd, kXrcd, b);
    srq9.Init(b.env.get(), 9, transport::sim::kSimPd, kXrcd, b);
    other.Init(b.env.get(), 12, transport::sim::kSimPd, kXrcd + 1, b);
    transport::sim::ConnectOpts o;
    o.mtu = mtu;
    EXPECT_EQ(0, a.Connect(b, o));
    EXPECT_EQ(0, b.Connect(a, o));
  }
  // A one-SGE request from a's buffer [off, off + len) for XRC SRQ `srqn`.
  void Post(queue::WqeOp op, uint64_t wr_id, uint32_t srqn, uint32_t off, uint32_t len, uint64_t raddr = 0,
            uint32_t rkey = 0, uint64_t add = 0) {
    queue::SendWqe w{};
    w.wr_id = wr_id;
    w.op = op;
    w.flags = queue::kWqeSignaled;
    w.num_sge = 1;
    w.xrc_remote_srqn = srqn;
    SimQp::EncodeRemote(&w, raddr, rkey, add);
    const queue::Sge s{a.Addr(off), len, a.key};
    a.Post(w, &s);
  }
  std::vector<queue::Cqe> Drain(cq::CqConsumer* c, size_t n) {
    std::vector<queue::Cqe> out;
    queue::Cqe e[16];
    EXPECT_TRUE(net.Run([&] {
      for (int k = c->Poll(e, 16); k > 0; k = c->Poll(e, 16)) out.insert(out.end(), e, e + k);
      return out.size() >= n;
    })) << "got " << out.size() << " of " << n;
    return out;
  }

  SimNet net;
  SimQp a, b;
  XrcSrq srq5, srq9, other;
};

void Fill(std::vector<uint8_t>& buf, uint32_t off, uint32_t len, uint8_t seed) {
  for (uint32_t i = 0; i < len; ++i) buf[off + i] = static_cast<uint8_t>(seed + i * 7);
}

// SENDs alternate between two SRQs of the domain through one target QP:
// each lands in the SRQ its XRCETH names, byte-exact, completing on that
// SRQ's CQ with the target's QPN; multi-packet SENDs included.
void SendsToTwoSrqs(LinkFaults f, uint64_t seed) {
  XrcPair p(f, seed, /*mtu=*/1);  // 256-byte packets
  constexpr int kMsgs = 24;
  for (int i = 0; i < kMsgs; ++i) {
    XrcSrq& s = i % 2 ? p.srq9 : p.srq5;
    s.PostRecv(100 + i, 16384 * i, 16384);
  }
  for (int i = 0; i < kMsgs; ++i) {
    const uint32_t len = 1 + 611 * i;  // 1 byte to 14 KiB: up to 55 packets
    Fill(p.a.buf, 0, 64 * 1024, static_cast<uint8_t>(i));
    p.Post(queue::WqeOp::kSend, i, i % 2 ? 9 : 5, 0, len);
    // One message at a time, so that a's buffer can be refilled.
    const auto sc = p.Drain(p.a.scq_c.get(), 1);
    ASSERT_EQ(sc.size(), 1u);
    ASSERT_EQ(sc[0].status, queue::wc::kSuccess) << i;
    XrcSrq& s = i % 2 ? p.srq9 : p.srq5;
    const auto rc = p.Drain(s.cq_c.get(), 1);
    ASSERT_EQ(rc.size(), 1u);
    EXPECT_EQ(rc[0].status, queue::wc::kSuccess);
    EXPECT_EQ(rc[0].wr_id, 100u + i);
    EXPECT_EQ(rc[0].byte_len, len);
    EXPECT_EQ(rc[0].opcode, queue::wc::kOpRecv);
    EXPECT_EQ(rc[0].qp_num, 0x22u);
    EXPECT_EQ(0, std::memcmp(p.b.buf.data() + 16384 * i, p.a.buf.data(), len)) << i;
  }
  queue::Cqe e;
  EXPECT_EQ(p.other.cq_c->Poll(&e, 1), 0);
  EXPECT_EQ(p.b.env->stats.xrc_bad_srqn, 0u);
  EXPECT_EQ(p.b.qp->attr().state, QpState::kRts);
}

TEST(TransportXrc, SendsReachTheSrqTheyName) { SendsToTwoSrqs({}, 1); }
TEST(TransportXrc, SendsSurviveLossAndDuplication) {
  LinkFaults f;
  f.loss = 0.05;
  f.dup = 0.05;
  f.reorder = 0.05;
  SendsToTwoSrqs(f, 77);
}

// WRITE, READ and both atomics through the target, checked against the PD
// of the SRQ each request names; responses travel as XRC opcodes.
TEST(TransportXrc, RdmaAndAtomicsThroughTheTarget) {
  XrcPair p;
  Fill(p.a.buf, 0, 4096, 3);
  Fill(p.b.buf, 65536, 4096, 9);
  p.Post(queue::WqeOp::kWrite, 1, 5, 0, 4096, p.b.Addr(0), p.b.key);
  p.Post(queue::WqeOp::kRead, 2, 9, 8192, 4096, p.b.Addr(65536), p.b.key);
  p.Post(queue::WqeOp::kFetchAdd, 3, 5, 16384, 8, p.b.Addr(131072), p.b.key, 5);
  p.Post(queue::WqeOp::kFetchAdd, 4, 9, 16392, 8, p.b.Addr(131072), p.b.key, 6);
  std::vector<uint8_t> ops;
  p.net.link.on_send = [&](std::span<const uint8_t> f) { ops.push_back(f[wire::kRoceV4HeadLen]); };
  const auto c = p.Drain(p.a.scq_c.get(), 4);
  ASSERT_EQ(c.size(), 4u);
  for (const auto& e : c) EXPECT_EQ(e.status, queue::wc::kSuccess) << e.wr_id;
  EXPECT_EQ(0, std::memcmp(p.b.buf.data(), p.a.buf.data(), 4096));
  EXPECT_EQ(0, std::memcmp(p.a.buf.data() + 8192, p.b.buf.data() + 65536, 4096));
  uint64_t word = 0, first = 1, second = 1;
  std::memcpy(&word, p.b.buf.data() + 131072, 8);
  std::memcpy(&first, p.a.buf.data() + 16384, 8);
  std::memcpy(&second, p.a.buf.data() + 16392, 8);
  EXPECT_EQ(word, 11u);
  EXPECT_EQ(first, 0u);
  EXPECT_EQ(second, 5u);
  // Every packet either way is XRC (transport 101b): requests with an
  // XRCETH, READ responses and (atomic) ACKs without.
  ASSERT_FALSE(ops.empty());
  for (uint8_t op : ops) EXPECT_EQ(wire::opcode_transport(op), wire::kTransportXrc) << int(op);
  EXPECT_EQ(p.b.env->stats.rx_write_requests, 1u);
  EXPECT_EQ(p.b.env->stats.rx_read_requests, 1u);
  EXPECT_EQ(p.b.env->stats.rx_atomic_requests, 2u);
}

// The XRCETH sits right after the BTH and carries the SRQ number; the ACK
// is XRC ACKNOWLEDGE (0xB1) without one.
TEST(TransportXrc, WireLayout) {
  XrcPair p;
  p.srq9.PostRecv(1, 0, 64);
  std::vector<std::vector<uint8_t>> frames;
  p.net.link.on_send = [&](std::span<const uint8_t> f) { frames.emplace_back(f.begin(), f.end()); };
  p.Post(queue::WqeOp::kSendImm, 1, 9, 0, 16);
  ASSERT_EQ(p.Drain(p.a.scq_c.get(), 1).size(), 1u);
  ASSERT_GE(frames.size(), 2u);
  const uint8_t* req = frames[0].data() + wire::kRoceV4HeadLen;
  EXPECT_EQ(req[0], 0xA5);  // XRC SEND_ONLY_WITH_IMMEDIATE
  EXPECT_EQ(wire::load_be32(req + 12), 9u);
  const wire::OpcodeInfo& info = wire::opcode_info(0xA5);
  EXPECT_EQ(info.xrceth, 12);
  EXPECT_EQ(info.immdt, 16);
  // Headers, 16 bytes of payload, the ICRC.
  EXPECT_EQ(frames[0].size(), wire::kRoceV4HeadLen + 20u + 16 + 4);
  const uint8_t* ack = frames[1].data() + wire::kRoceV4HeadLen;
  EXPECT_EQ(ack[0], 0xB1);
  EXPECT_EQ(frames[1].size(), wire::kRoceV4HeadLen + 12u + 4 + 4);
}

// An SRQ number that is no SRQ of the target's domain: NAK invalid
// request, the initiator's WQE completes with IBV_WC_REM_INV_REQ_ERR, the
// target goes to error; counted once in xrc_bad_srqn.
void BadSrqn(uint32_t srqn) {
  XrcPair p;
  p.Post(queue::WqeOp::kSend, 1, srqn, 0, 64);
  const auto c = p.Drain(p.a.scq_c.get(), 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, queue::wc::kRemInvReqErr);
  EXPECT_EQ(p.b.env->stats.xrc_bad_srqn, 1u);
  EXPECT_EQ(p.b.qp->attr().state, QpState::kErr);
  queue::Cqe e;
  EXPECT_EQ(p.other.cq_c->Poll(&e, 1), 0);
}
TEST(TransportXrc, UnknownSrqIsAnInvalidRequest) { BadSrqn(77); }
TEST(TransportXrc, SrqOfAnotherDomainIsAnInvalidRequest) { BadSrqn(12); }

// A request is executed on its SRQ's PD: a WRITE naming an SRQ of another
// PD than the target's MR is a remote access error.
TEST(TransportXrc, MemoryIsCheckedAgainstTheSrqsPd) {
  XrcPair p;
  p.b.env->xrc_srqs[5].pd = transport::sim::kSimPd + 1;
  p.Post(queue::WqeOp::kWrite, 1, 5, 0, 64, p.b.Addr(0), p.b.key);
  const auto c = p.Drain(p.a.scq_c.get(), 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, queue::wc::kRemAccessErr);
}

// ATOMIC WRITE is defined for RC (and RD) only: an XRC initiator refuses
// it locally, and nothing goes on the wire.
TEST(TransportXrc, AtomicWriteIsNotAnXrcOperation) {
  XrcPair p;
  uint64_t sent_before = p.net.link.stats.sent;
  p.Post(queue::WqeOp::kAtomicWrite, 1, 5, 0, 8, p.b.Addr(0), p.b.key);
  const auto c = p.Drain(p.a.scq_c.get(), 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, queue::wc::kLocQpOpErr);
  EXPECT_EQ(p.net.link.stats.sent, sent_before);
}

// An SRQ destroyed while a multi-packet SEND into it is half way: the rest
// of the message finds no SRQ and the target fails it (no write into the
// buffers of a WQE that is gone).
TEST(TransportXrc, SrqGoneMidMessage) {
  XrcPair p(LinkFaults{}, 1, /*mtu=*/1);
  p.srq5.PostRecv(1, 0, 8192);
  bool dropped = false;
  p.net.tap = [&](const wire::PacketView& v) {
    if (!dropped && v.bth.opcode == (wire::kXrcBase | wire::kRcSendMiddle)) {
      dropped = true;
      p.b.qp->DropXrcSrq(p.srq5.srq.get());
      p.b.env->xrc_srqs.erase(5);
    }
    return true;
  };
  p.Post(queue::WqeOp::kSend, 1, 5, 0, 4096);
  const auto c = p.Drain(p.a.scq_c.get(), 1);
  ASSERT_TRUE(dropped);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, queue::wc::kRemInvReqErr);
  EXPECT_EQ(p.b.qp->attr().state, QpState::kErr);
}

// A READ whose first response is lost is asked for again at its old PSN:
// the target executes the duplicate on the PD of the SRQ it names (SRQ 9),
// while the message in progress meanwhile (a SEND into SRQ 5) keeps its own.
TEST(TransportXrc, DuplicateReadUsesItsOwnSrqsPd) {
  XrcPair p(LinkFaults{}, 3, /*mtu=*/1);
  Fill(p.b.buf, 65536, 1000, 17);
  // SRQ 9 is on a PD of its own, whose MR alone covers what is read: a
  // duplicate checked against the SEND's PD (SRQ 5's) would be refused.
  constexpr uint32_t kOtherPd = transport::sim::kSimPd + 1;
  p.b.env->xrc_srqs[9].pd = kOtherPd;
  const uint32_t rkey =
      p.b.env->mrs.Register(kOtherPd, p.b.Addr(65536), p.b.Addr(65536), 4096, transport::sim::kSimAccess)->key;
  bool dropped = false;
  p.net.tap = [&](const wire::PacketView& v) {
    if (!dropped && v.bth.opcode == (wire::kXrcBase | wire::kRcReadResponseFirst)) {
      dropped = true;
      return false;
    }
    return true;
  };
  p.srq5.PostRecv(1, 0, 4096);
  p.Post(queue::WqeOp::kRead, 1, 9, 0, 1000, p.b.Addr(65536), rkey);
  p.Post(queue::WqeOp::kSend, 2, 5, 8192, 600);
  const auto c = p.Drain(p.a.scq_c.get(), 2);
  ASSERT_EQ(c.size(), 2u);
  for (const auto& e : c) EXPECT_EQ(e.status, queue::wc::kSuccess) << e.wr_id;
  EXPECT_TRUE(dropped);
  EXPECT_EQ(0, std::memcmp(p.a.buf.data(), p.b.buf.data() + 65536, 1000));
  EXPECT_GE(p.b.env->stats.duplicate_request, 1u);
  EXPECT_EQ(p.b.env->stats.xrc_bad_srqn, 0u);
}

// A MIDDLE packet naming another SRQ of the domain than its message's FIRST
// (a peer changing SRQ mid-message) is an invalid request.
TEST(TransportXrc, AnotherSrqMidMessageIsAnInvalidRequest) {
  XrcPair p(LinkFaults{}, 4, /*mtu=*/1);
  p.srq5.PostRecv(1, 0, 8192);
  p.srq9.PostRecv(2, 8192, 8192);
  p.net.tap = [&](const wire::PacketView& v) {
    if (v.bth.opcode == (wire::kXrcBase | wire::kRcSendMiddle)) {
      // The parsed packet is the link's buffer: rewrite its XRCETH as a
      // hostile peer would have sent it.
      wire::store_be32(const_cast<uint8_t*>(v.ext(v.info->xrceth)), 9);
    }
    return true;
  };
  p.Post(queue::WqeOp::kSend, 1, 5, 0, 2048);
  const auto c = p.Drain(p.a.scq_c.get(), 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, queue::wc::kRemInvReqErr);
  EXPECT_EQ(p.b.env->stats.xrc_bad_srqn, 1u);
  EXPECT_EQ(p.b.qp->attr().state, QpState::kErr);
  // The WQE in progress failed on its own SRQ's CQ; SRQ 9's is untouched.
  const auto r = p.Drain(p.srq5.cq_c.get(), 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, queue::wc::kRemInvReqErr);
  queue::Cqe e;
  EXPECT_EQ(p.srq9.cq_c->Poll(&e, 1), 0);
}

// The modify table (ib_modify_qp_is_ok): a target needs the responder's
// attributes at RTR and a timeout at RTS; an initiator refuses them at RTR.
TEST(TransportXrc, ModifyTable) {
  transport::sim::SimLink link({}, 1);
  SimQp t, i;
  t.xrcd = kXrcd;
  t.Init(&link, 0x33, 0x0A000003, 16, 16, 4096, QpType::kXrcTgt);
  i.Init(&link, 0x44, 0x0A000004, 16, 16, 4096, QpType::kXrcIni);
  transport::QpAttr a;
  a.state = QpState::kInit;
  const uint32_t init_mask = transport::kAttrState | transport::kAttrPkeyIndex | transport::kAttrPort |
                             transport::kAttrAccessFlags;
  ASSERT_EQ(0, t.Modify(a, init_mask));
  ASSERT_EQ(0, i.Modify(a, init_mask));
  a.state = QpState::kRtr;
  a.av = SimQp::AvTo(0x0A000004);
  a.path_mtu = 3;
  a.dest_qpn = 0x44;
  const uint32_t rtr = transport::kAttrState | transport::kAttrAv | transport::kAttrPathMtu |
                       transport::kAttrDestQpn | transport::kAttrRqPsn;
  const uint32_t resp = transport::kAttrMaxDestRdAtomic | transport::kAttrMinRnrTimer;
  EXPECT_EQ(EINVAL, t.Modify(a, rtr));
  EXPECT_EQ(0, t.Modify(a, rtr | resp));
  EXPECT_EQ(EINVAL, i.Modify(a, rtr | resp));
  EXPECT_EQ(0, i.Modify(a, rtr));
  a.state = QpState::kRts;
  a.timeout = 14;
  EXPECT_EQ(EINVAL, t.Modify(a, transport::kAttrState | transport::kAttrSqPsn));
  EXPECT_EQ(0, t.Modify(a, transport::kAttrState | transport::kAttrSqPsn | transport::kAttrTimeout));
  EXPECT_EQ(EINVAL, i.Modify(a, transport::kAttrState | transport::kAttrSqPsn | transport::kAttrTimeout));
}

}  // namespace
}  // namespace droce::test
