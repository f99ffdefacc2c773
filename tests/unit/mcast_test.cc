// UD multicast below the engine: multicast GIDs and their MACs (wire), the
// attach/detach rules and limits (engine/mcast.h), which address vectors may
// name a group (transport), and the frame a UD QP sends to a group; also the
// privileged Q_Key bit of a UD send (IBA 10.2.5).
#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <deque>

#include "cq/cq.h"
#include "engine/mcast.h"
#include "queue/shm.h"
#include "queue/wqe_encode.h"
#include "transport/sim/two_qp.h"
#include "transport/qp.h"
#include "wire/build.h"
#include "wire/frame.h"

namespace droce::test {
namespace {

wire::Ipv6Addr Gid4(uint8_t a, uint8_t b, uint8_t c, uint8_t d) {
  return wire::ipv4_to_gid(uint32_t{a} << 24 | uint32_t{b} << 16 | uint32_t{c} << 8 | d);
}

wire::Ipv6Addr Gid6(std::initializer_list<uint8_t> head, uint8_t last) {
  wire::Ipv6Addr g{};
  std::copy(head.begin(), head.end(), g.begin());
  g[15] = last;
  return g;
}

TEST(Multicast, GidsAreFf00Slash8OrMappedClassD) {
  EXPECT_TRUE(wire::gid_is_multicast(Gid4(224, 0, 0, 1).data()));
  EXPECT_TRUE(wire::gid_is_multicast(Gid4(239, 255, 255, 255).data()));
  EXPECT_FALSE(wire::gid_is_multicast(Gid4(223, 255, 255, 255).data()));
  EXPECT_FALSE(wire::gid_is_multicast(Gid4(240, 0, 0, 1).data()));
  EXPECT_FALSE(wire::gid_is_multicast(Gid4(10, 77, 0, 1).data()));
  EXPECT_TRUE(wire::gid_is_multicast(Gid6({0xFF, 0x02}, 1).data()));
  EXPECT_TRUE(wire::gid_is_multicast(Gid6({0xFF, 0x0E}, 7).data()));
  EXPECT_FALSE(wire::gid_is_multicast(Gid6({0xFE, 0x80}, 1).data()));
  EXPECT_FALSE(wire::gid_is_multicast(Gid6({0xFD, 0x78, 0, 1}, 1).data()));
  // A class-D address that is not IPv4-mapped is an ordinary IPv6 address.
  EXPECT_FALSE(wire::gid_is_multicast(Gid6({0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xE0}, 1).data()));
}

TEST(Multicast, MacsAreMappedFromTheGroup) {
  // IPv4: 01:00:5e and the low 23 bits (the top bit of the second byte drops).
  EXPECT_EQ(wire::multicast_mac(Gid4(239, 129, 2, 3).data()), (wire::MacAddr{0x01, 0x00, 0x5E, 0x01, 0x02, 0x03}));
  EXPECT_EQ(wire::multicast_mac(Gid4(224, 0, 0, 251).data()), (wire::MacAddr{0x01, 0x00, 0x5E, 0x00, 0x00, 0xFB}));
  // IPv6: 33:33 and the low 32 bits.
  const wire::Ipv6Addr g = {0xFF, 0x12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xAB, 0xCD, 0xEF, 0x01};
  EXPECT_EQ(wire::multicast_mac(g.data()), (wire::MacAddr{0x33, 0x33, 0xAB, 0xCD, 0xEF, 0x01}));
}

TEST(Multicast, AttachDetachFollowTheKernelsRules) {
  engine::McastGroups m;
  const wire::Ipv6Addr g1 = Gid4(239, 1, 1, 1), g2 = Gid6({0xFF, 0x12}, 2);
  EXPECT_EQ(m.Attach(Gid4(10, 0, 0, 1), 0x11), EINVAL);  // not a multicast GID
  EXPECT_EQ(m.Detach(g1, 0x11), EINVAL);                 // no such group
  EXPECT_EQ(m.Attach(g1, 0x11), 0);
  EXPECT_EQ(m.Attach(g1, 0x11), 0);  // again: no change
  EXPECT_EQ(m.Attach(g1, 0x12), 0);
  EXPECT_EQ(m.Attach(g2, 0x11), 0);
  ASSERT_NE(m.Members(g1), nullptr);
  EXPECT_EQ(*m.Members(g1), (std::vector<uint32_t>{0x11, 0x12}));
  EXPECT_EQ(m.AttachedTo(0x11), 2u);
  EXPECT_EQ(m.attachments(), 3u);
  EXPECT_EQ(m.Detach(g2, 0x12), EINVAL);  // the group exists, the QP is not in it
  EXPECT_EQ(m.Detach(g1, 0x11), 0);
  EXPECT_EQ(m.Detach(g1, 0x11), EINVAL);
  EXPECT_EQ(*m.Members(g1), (std::vector<uint32_t>{0x12}));
  EXPECT_EQ(m.Detach(g1, 0x12), 0);
  EXPECT_EQ(m.Members(g1), nullptr);  // the last member took the group with it
  EXPECT_EQ(m.Detach(g2, 0x11), 0);
  EXPECT_EQ(m.AttachedTo(0x11), 0u);
  EXPECT_EQ(m.groups(), 0u);
  EXPECT_EQ(m.attachments(), 0u);
}

TEST(Multicast, LimitsAreEnomem) {
  engine::McastGroups m;
  const wire::Ipv6Addr g = Gid4(239, 0, 0, 1);
  for (uint32_t q = 0; q < engine::McastGroups::kMaxQpsPerGroup; ++q) ASSERT_EQ(m.Attach(g, 0x100 + q), 0);
  EXPECT_EQ(m.Attach(g, 0x999), ENOMEM);
  EXPECT_EQ(m.Attach(g, 0x100), 0);  // a member attaching again is still fine
  EXPECT_EQ(m.Detach(g, 0x100), 0);
  EXPECT_EQ(m.Attach(g, 0x999), 0);

  engine::McastGroups many;
  for (uint32_t i = 0; i < engine::McastGroups::kMaxGroups; ++i) {
    ASSERT_EQ(many.Attach(Gid6({0xFF, 0x12, static_cast<uint8_t>(i >> 8)}, static_cast<uint8_t>(i)), 0x11), 0);
  }
  EXPECT_EQ(many.Attach(Gid4(239, 9, 9, 9), 0x11), ENOMEM);
  EXPECT_EQ(many.AttachedTo(0x11), engine::McastGroups::kMaxGroups);
}

// A frame to `group` as a peer would send it, parsed.
struct Frame {
  std::vector<uint8_t> bytes = std::vector<uint8_t>(256);
  wire::PacketView v;
  Frame(const wire::Ipv6Addr& group, uint8_t opcode, uint32_t dqpn) {
    wire::Path p;
    p.dmac = wire::multicast_mac(group.data());
    p.ipv6 = !wire::gid_is_ipv4_mapped(group.data());
    p.sip = 0x0A4D0002;
    p.sip6 = Gid6({0xFD, 0x78, 0, 1}, 2);
    p.dip = wire::gid_to_ipv4(group.data());
    p.dip6 = group;
    wire::TransportHeaders h;
    h.bth.opcode = opcode;
    h.bth.dqpn = dqpn;
    h.deth = {0x1111, 0x99};
    const uint8_t payload[4] = {1, 2, 3, 4};
    bytes.resize(wire::build_frame(bytes, p, h, payload));
    EXPECT_EQ(wire::parse_frame({bytes.data(), bytes.size()}, &v), wire::ParseError::kOk);
  }
};

TEST(Multicast, OnlyUdSendsToTheMulticastQpnReachTheGroup) {
  using V = engine::McastGroups::Verdict;
  engine::McastGroups m;
  const wire::Ipv6Addr g4 = Gid4(239, 1, 2, 3), g6 = Gid6({0xFF, 0x0E}, 3);
  ASSERT_EQ(m.Attach(g4, 0x11), 0);
  ASSERT_EQ(m.Attach(g4, 0x12), 0);
  ASSERT_EQ(m.Attach(g6, 0x13), 0);
  const std::vector<uint32_t>* members = nullptr;
  EXPECT_EQ(m.Route(Frame(g4, wire::kUdSendOnly, wire::kMulticastQpn).v, &members), V::kDeliver);
  ASSERT_NE(members, nullptr);
  EXPECT_EQ(*members, (std::vector<uint32_t>{0x11, 0x12}));
  EXPECT_EQ(m.Route(Frame(g6, wire::kUdSendOnlyImm, wire::kMulticastQpn).v, &members), V::kDeliver);
  EXPECT_EQ(*members, (std::vector<uint32_t>{0x13}));
  // A member's own QPN, or any other, is not the multicast QPN.
  EXPECT_EQ(m.Route(Frame(g4, wire::kUdSendOnly, 0x11).v, &members), V::kNotMulticastUd);
  // Connected services have no multicast.
  EXPECT_EQ(m.Route(Frame(g4, wire::kRcSendOnly, wire::kMulticastQpn).v, &members), V::kNotMulticastUd);
  EXPECT_EQ(m.Route(Frame(g4, wire::kUcSendOnly, wire::kMulticastQpn).v, &members), V::kNotMulticastUd);
  EXPECT_EQ(m.Route(Frame(Gid4(239, 1, 2, 4), wire::kUdSendOnly, wire::kMulticastQpn).v, &members), V::kNoGroup);
}

transport::AddressVector Av(const wire::Ipv6Addr& dgid, uint8_t sgid_index) {
  transport::AddressVector av;
  av.is_global = true;
  std::memcpy(av.dgid, dgid.data(), 16);
  av.sgid_index = sgid_index;
  return av;
}

TEST(Multicast, OnlyUdAddressHandlesMayNameAGroup) {
  transport::PortAddr port;
  port.ip = 0x0A4D0001;
  port.has_ip6 = true;
  port.ip6 = Gid6({0xFD, 0x78, 0, 1}, 1);
  using transport::AvUse;
  wire::Ipv6Addr out{};
  for (const auto& [gid, index] : {std::pair{Gid4(239, 1, 2, 3), transport::kGidIndexIpv4},
                                   std::pair{Gid6({0xFF, 0x0E}, 5), transport::kGidIndexIpv6}}) {
    EXPECT_TRUE(transport::av_destination(Av(gid, index), port, AvUse::kUdHandle, &out));
    EXPECT_EQ(out, gid);
    EXPECT_FALSE(transport::av_destination(Av(gid, index), port, AvUse::kConnected, &out));
  }
  // The source GID index must still match the group's family.
  EXPECT_FALSE(transport::av_destination(Av(Gid4(239, 1, 2, 3), 1), port, AvUse::kUdHandle, &out));
  EXPECT_FALSE(transport::av_destination(Av(Gid6({0xFF, 0x0E}, 5), 0), port, AvUse::kUdHandle, &out));
  port.has_ip6 = false;
  EXPECT_FALSE(transport::av_destination(Av(Gid6({0xFF, 0x0E}, 5), 1), port, AvUse::kUdHandle, &out));
}

// One UD QP on a simulated link; Sent() takes the frames it sent.
struct UdSender {
  transport::sim::SimLink link{transport::sim::LinkFaults{}, 1};
  transport::sim::SimEnv env{&link};
  queue::ShmRegion shm;
  std::unique_ptr<cq::CqRegion> cq_region;
  std::unique_ptr<cq::CqProducer> cq;
  std::unique_ptr<transport::Qp> qp;
  std::vector<uint8_t> buf = std::vector<uint8_t>(256, 'm');
  uint32_t key = 0;
  uint32_t prod = 0;
  queue::Ring sq;

  explicit UdSender(uint32_t qkey) {
    const uint32_t stride = sizeof(queue::SendWqe) + sizeof(queue::Sge);
    shm = *queue::ShmRegion::Create("test-ud", 2 * queue::ring_bytes(8, stride));
    sq = queue::Ring::Init(shm.data(), 8, stride);
    const queue::Ring rq = queue::Ring::Init(static_cast<uint8_t*>(shm.data()) + queue::ring_bytes(8, stride), 8, stride);
    cq_region = *cq::CqRegion::Create(16);
    cq = std::make_unique<cq::CqProducer>(cq_region.get(), nullptr, 1);
    transport::QpInit init;
    init.qpn = 0x42;
    init.type = transport::QpType::kUd;
    init.pd = 1;
    init.caps = {8, 8, 1, 1, 16};
    init.sq = sq;
    init.rq = rq;
    init.send_cq = init.recv_cq = cq.get();
    init.port.mac = {2, 0, 10, 77, 0, 1};
    init.port.ip = 0x0A4D0001;
    init.port.max_mtu = 3;
    qp = std::make_unique<transport::Qp>(init, &env);
    key = env.mrs.Register(1, reinterpret_cast<uint64_t>(buf.data()), reinterpret_cast<uint64_t>(buf.data()),
                           buf.size(), 1)->key;
    transport::QpAttr a;
    a.state = transport::QpState::kInit;
    a.qkey = qkey;
    EXPECT_EQ(qp->Modify(a, transport::kAttrState | transport::kAttrPkeyIndex | transport::kAttrPort |
                                transport::kAttrQkey), 0);
    a.state = transport::QpState::kRtr;
    EXPECT_EQ(qp->Modify(a, transport::kAttrState), 0);
    a.state = transport::QpState::kRts;
    EXPECT_EQ(qp->Modify(a, transport::kAttrState | transport::kAttrSqPsn), 0);
    // Neighbour resolution must not be needed for a group.
    env.resolvable = false;
  }

  void AddAh(uint32_t id, const wire::Ipv6Addr& dgid) {
    transport::AddressHandle ah;
    ah.av = Av(dgid, transport::kGidIndexIpv4);
    ah.pd = 1;
    ASSERT_TRUE(transport::av_destination(ah.av, transport::PortAddr{.ip = 0x0A4D0001}, transport::AvUse::kUdHandle,
                                          &ah.dgid));
    env.ahs[id] = ah;
  }

  // Sends 10 bytes through AH `ah` and returns the parsed frame.
  wire::PacketView Send(uint32_t ah, uint32_t remote_qpn, uint32_t remote_qkey) {
    queue::SendWqe w{};
    w.wr_id = prod;
    w.op = queue::WqeOp::kSend;
    w.flags = queue::kWqeSignaled;
    w.num_sge = 1;
    queue::EncodeUd(&w, ah, remote_qpn, remote_qkey);
    const queue::Sge s{reinterpret_cast<uint64_t>(buf.data()), 10, key};
    std::memcpy(sq.slot(prod), &w, sizeof(w));
    std::memcpy(sq.slot(prod) + sizeof(w), &s, sizeof(s));
    sq.publish_prod(++prod);
    qp->PollSend(8);
    const auto frames = Sent();
    wire::PacketView v;
    EXPECT_EQ(frames.size(), 1u);
    if (frames.empty()) return v;
    last = frames.front();
    EXPECT_EQ(wire::parse_frame(last, &v), wire::ParseError::kOk);
    return v;
  }

  // Every frame on the link, delivered now (copies: the link reuses its
  // buffers).
  std::vector<std::vector<uint8_t>> Sent() {
    std::vector<std::vector<uint8_t>> out;
    link.clock += 1'000'000;
    link.DeliverDue([&](const wire::PacketView& v) { out.emplace_back(v.frame.begin(), v.frame.end()); });
    return out;
  }
  std::vector<uint8_t> last;  // the frame Send returned a view of
};

TEST(Multicast, UdSendToAGroupUsesTheGroupMacAndTheMulticastQpn) {
  UdSender s(0x1234);
  s.AddAh(1, Gid4(239, 129, 2, 3));
  const wire::PacketView v = s.Send(1, /*remote_qpn=*/0x77, 0x5555);
  ASSERT_NE(v.info, nullptr);
  EXPECT_EQ(v.dmac, (wire::MacAddr{0x01, 0x00, 0x5E, 0x01, 0x02, 0x03}));
  EXPECT_EQ(v.dip, 0xEF810203u);
  EXPECT_EQ(v.sip, 0x0A4D0001u);
  EXPECT_EQ(v.bth.dqpn, wire::kMulticastQpn);  // whatever the WR said
  const wire::Deth d = wire::read_deth(v.ext(v.info->deth));
  EXPECT_EQ(d.qkey, 0x5555u);
  EXPECT_EQ(d.src_qp, 0x42u);
  EXPECT_EQ(v.payload_len, 10u);
}

TEST(Multicast, UnicastUdSendStillResolvesItsNeighbour) {
  UdSender s(0x1234);
  s.AddAh(1, Gid4(10, 77, 0, 2));
  queue::SendWqe w{};
  w.op = queue::WqeOp::kSend;
  w.wr.ud.ah = 1;
  std::memcpy(s.sq.slot(0), &w, sizeof(w));
  s.sq.publish_prod(++s.prod);
  s.qp->PollSend(8);
  EXPECT_TRUE(s.Sent().empty());  // waiting for ARP, which never answers here
}

// IBA 10.2.5: a send WR's Q_Key with the high-order bit set is replaced by
// the QP's own Q_Key.
TEST(UdQkey, PrivilegedBitSendsTheQpsOwnQkey) {
  UdSender s(0x0BADCAFE);
  s.AddAh(1, Gid4(239, 0, 0, 9));
  for (uint32_t wr_qkey : {0x80000000u, 0x80001234u, 0xFFFFFFFFu}) {
    const wire::PacketView v = s.Send(1, 0, wr_qkey);
    ASSERT_NE(v.info, nullptr);
    EXPECT_EQ(wire::read_deth(v.ext(v.info->deth)).qkey, 0x0BADCAFEu) << std::hex << wr_qkey;
  }
  const wire::PacketView v = s.Send(1, 0, 0x7FFFFFFF);
  ASSERT_NE(v.info, nullptr);
  EXPECT_EQ(wire::read_deth(v.ext(v.info->deth)).qkey, 0x7FFFFFFFu);
}

}  // namespace
}  // namespace droce::test
