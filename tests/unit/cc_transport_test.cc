// Congestion control in the transport: ECT(0) on data
// packets, CNPs on CE-marked packets, DCQCN cutting the rate through the
// pacer, and the four ConnectX counters, each an exact number of times, in
// the virtual-time simulator.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cc/dcqcn.h"
#include "cc/switch.h"
#include "transport/sim/two_qp.h"
#include "wire/bytes.h"
#include "wire/frame.h"

namespace droce::test {
namespace {

using transport::sim::LinkFaults;
using transport::sim::SimPair;
using transport::sim::SimQp;

// Runs until a has n send completions, all successful.
void AwaitSends(SimPair& p, int n) {
  std::vector<queue::Cqe> c(256);
  int got = 0;
  ASSERT_TRUE(p.net.Run([&] {
    const int k = p.a.scq_c->Poll(c.data(), 256);
    for (int i = 0; i < k; ++i) EXPECT_EQ(c[i].status, queue::wc::kSuccess) << c[i].wr_id;
    got += k;
    return got >= n;
  }));
}

struct Seen {
  std::vector<std::vector<uint8_t>> frames;
};

// Both ends' congestion control, a marking "switch" that sets CE on every
// ECN-capable frame, and every frame as it was sent.
void Connect(SimPair& p, cc::CcMode a_cc, cc::CcMode b_cc, uint32_t min_gap_us, Seen* seen, bool mark = true) {
  p.a.cc = a_cc;
  p.b.cc = b_cc;
  p.a.dcqcn.min_time_between_cnps = p.b.dcqcn.min_time_between_cnps = min_gap_us;
  ASSERT_EQ(0, p.Init(64, 256, 256 * 1024));
  p.net.link.on_send = [seen](std::span<const uint8_t> f) { seen->frames.emplace_back(f.begin(), f.end()); };
  if (mark) {
    p.net.link.shaper = [](uint8_t* data, uint32_t len, uint64_t, uint64_t*) {
      cc::MarkCe(data, len);
      return true;
    };
  }
}

uint8_t Opcode(const std::vector<uint8_t>& f) {
  wire::PacketView v;
  EXPECT_EQ(wire::parse_frame(f, &v), wire::ParseError::kOk);
  return v.bth.opcode;
}

TEST(CcTransport, DataLeavesEct0AcksDoNot) {
  Seen seen;
  SimPair p(LinkFaults{}, 1);
  Connect(p, cc::CcMode::kDcqcn, cc::CcMode::kDcqcn, 4, &seen, /*mark=*/false);
  for (int i = 0; i < 8; ++i) p.a.PostOp(queue::WqeOp::kWrite, i, 0, 3000, p.b.Addr(0), p.b.key);
  p.a.PostOp(queue::WqeOp::kRead, 9, 8192, 5000, p.b.Addr(4096), p.b.key);
  AwaitSends(p, 9);
  int data = 0, acks = 0;
  for (const auto& f : seen.frames) {
    const uint8_t op = Opcode(f);
    const bool is_ack = op == wire::kRcAck || op == wire::kRcAtomicAck;
    EXPECT_EQ(cc::FrameEcn(f.data(), f.size()), is_ack ? cc::kEcnNotEct : cc::kEct0) << int(op);
    (is_ack ? acks : data)++;
  }
  EXPECT_GT(data, 20);  // WRITE packets and READ responses
  EXPECT_GT(acks, 0);
  EXPECT_EQ(p.b.env->stats.np_ecn_marked_roce_packets, 0u);
  EXPECT_EQ(p.a.env->stats.rp_cnp_handled, 0u);
}

TEST(CcTransport, OffSendsNotEct) {
  Seen seen;
  SimPair p(LinkFaults{}, 2);
  Connect(p, cc::CcMode::kOff, cc::CcMode::kOff, 4, &seen, /*mark=*/false);
  for (int i = 0; i < 4; ++i) p.a.PostOp(queue::WqeOp::kWrite, i, 0, 3000, p.b.Addr(0), p.b.key);
  AwaitSends(p, 4);
  for (const auto& f : seen.frames) EXPECT_EQ(cc::FrameEcn(f.data(), f.size()), cc::kEcnNotEct);
}

// Every WRITE packet arrives with CE: with no gap between CNPs the receiver
// answers each one, and the sender acts on each.
TEST(CcTransport, EveryMarkedPacketGetsACnpAndCutsTheRate) {
  Seen seen;
  SimPair p(LinkFaults{}, 3);
  Connect(p, cc::CcMode::kDcqcn, cc::CcMode::kDcqcn, 0, &seen);
  constexpr int kMsgs = 40;  // 2 packets each at MTU 1024
  for (int i = 0; i < kMsgs; ++i) p.a.PostOp(queue::WqeOp::kWrite, i, 0, 2000, p.b.Addr(0), p.b.key);
  AwaitSends(p, kMsgs);
  ASSERT_TRUE(p.net.Run([&] { return p.net.link.idle(); }));
  EXPECT_EQ(p.b.env->stats.np_ecn_marked_roce_packets, 2u * kMsgs);
  EXPECT_EQ(p.b.env->stats.np_cnp_sent, 2u * kMsgs);
  EXPECT_EQ(p.a.env->stats.rp_cnp_handled, 2u * kMsgs);
  EXPECT_EQ(p.a.env->stats.rp_cnp_ignored, 0u);
  EXPECT_EQ(p.a.env->stats.np_cnp_sent, 0u);  // ACKs are not ECN-capable: never marked
  EXPECT_EQ(p.a.env->stats.malformed_pkts, 0u);  // a CNP is no longer "malformed"
  int cnps = 0;
  for (const auto& f : seen.frames) cnps += Opcode(f) == wire::kCnp;
  EXPECT_EQ(cnps, 2 * kMsgs);
  // The reaction point runs its timers when the QP sends: one more WRITE
  // after the monitor period shows the cuts.
  p.net.link.shaper = nullptr;
  p.net.link.clock += 10'000;
  p.a.PostOp(queue::WqeOp::kWrite, 99, 0, 100, p.b.Addr(0), p.b.key);
  AwaitSends(p, 1);
  const cc::ReactionPoint& rp = p.a.qp->reaction_point();
  EXPECT_TRUE(rp.active());
  EXPECT_GE(rp.cuts(), 1u);
  EXPECT_LT(rp.rate_mbps(), 25000 * (1 - 1023.0 / 2048 * 0.9));
}

TEST(CcTransport, MinTimeBetweenCnpsPerQp) {
  Seen seen;
  SimPair p(LinkFaults{}, 4);
  Connect(p, cc::CcMode::kDcqcn, cc::CcMode::kDcqcn, 50, &seen);
  // One message of 64 packets delivered within one sim step or two: far
  // less than 50 µs, so one CNP.
  p.a.PostOp(queue::WqeOp::kWrite, 1, 0, 64 * 1024, p.b.Addr(0), p.b.key);
  AwaitSends(p, 1);
  EXPECT_EQ(p.b.env->stats.np_ecn_marked_roce_packets, 64u);
  EXPECT_EQ(p.b.env->stats.np_cnp_sent, 1u);
  EXPECT_EQ(p.a.env->stats.rp_cnp_handled, 1u);
}

TEST(CcTransport, SenderWithCcOffIgnoresCnps) {
  Seen seen;
  SimPair p(LinkFaults{}, 5);
  Connect(p, cc::CcMode::kOff, cc::CcMode::kDcqcn, 0, &seen);
  // With CC off the sender's packets are not ECN-capable, so a switch would
  // not mark them; mark them anyway (a misbehaving switch) to get CNPs.
  p.net.link.shaper = [](uint8_t* data, uint32_t len, uint64_t, uint64_t*) {
    const unsigned ip0 = wire::kEthLen;
    if (len > ip0 + 20 && wire::load_be32(data + ip0 + 12) == 0x0A000001u) {  // from a
      // Not-ECT to CE by hand: TOS |= 3 and the checksum again.
      const unsigned ip = wire::kEthLen;
      data[ip + 1] |= cc::kEcnCe;
      wire::store_be16(data + ip + 10, 0);
      wire::store_be16(data + ip + 10, wire::ipv4_checksum(data + ip, wire::kIpv4Len));
    }
    return true;
  };
  for (int i = 0; i < 10; ++i) p.a.PostOp(queue::WqeOp::kWrite, i, 0, 100, p.b.Addr(0), p.b.key);
  AwaitSends(p, 10);
  ASSERT_TRUE(p.net.Run([&] { return p.net.link.idle(); }));
  EXPECT_EQ(p.b.env->stats.np_ecn_marked_roce_packets, 10u);
  EXPECT_EQ(p.b.env->stats.np_cnp_sent, 10u);
  EXPECT_EQ(p.a.env->stats.rp_cnp_ignored, 10u);
  EXPECT_EQ(p.a.env->stats.rp_cnp_handled, 0u);
  EXPECT_FALSE(p.a.qp->reaction_point().active());
}

TEST(CcTransport, ReceiverWithCcOffCountsMarksSendsNoCnp) {
  Seen seen;
  SimPair p(LinkFaults{}, 6);
  Connect(p, cc::CcMode::kDcqcn, cc::CcMode::kOff, 0, &seen);
  for (int i = 0; i < 10; ++i) p.a.PostOp(queue::WqeOp::kWrite, i, 0, 100, p.b.Addr(0), p.b.key);
  AwaitSends(p, 10);
  EXPECT_EQ(p.b.env->stats.np_ecn_marked_roce_packets, 10u);
  EXPECT_EQ(p.b.env->stats.np_cnp_sent, 0u);
  EXPECT_EQ(p.a.env->stats.rp_cnp_handled, 0u);
}

// The CNP's bytes, field by field, as ConnectX-4 Lx sends one (the capture
// below; docs/LAB.md): addresses, the IP ID and the destination QPN are the
// connection's.
TEST(CcTransport, CnpBytesAsConnectXSendsThem) {
  Seen seen;
  SimPair p(LinkFaults{}, 7);
  Connect(p, cc::CcMode::kDcqcn, cc::CcMode::kDcqcn, 4, &seen);
  p.a.PostOp(queue::WqeOp::kWrite, 1, 0, 100, p.b.Addr(0), p.b.key);
  AwaitSends(p, 1);
  const std::vector<uint8_t>* cnp = nullptr;
  for (const auto& f : seen.frames) {
    if (Opcode(f) == wire::kCnp) cnp = &f;
  }
  ASSERT_NE(cnp, nullptr);
  const std::vector<uint8_t>& f = *cnp;
  ASSERT_EQ(f.size(), 14u + 20 + 8 + 12 + 16 + 4);  // 74 bytes
  EXPECT_EQ(wire::load_be16(f.data() + 12), 0x0800);
  const uint8_t* ip = f.data() + 14;
  EXPECT_EQ(ip[0], 0x45);
  EXPECT_EQ(ip[1], 48 << 2 | 2);  // DSCP cnp_dscp 48, ECN ECT(0)
  EXPECT_EQ(wire::load_be16(ip + 2), 60);
  EXPECT_EQ(wire::load_be16(ip + 6), 0x4000);  // DF
  EXPECT_EQ(ip[8], 64);
  EXPECT_EQ(ip[9], 17);
  EXPECT_EQ(wire::load_be32(ip + 12), 0x0A000002u);  // from b
  EXPECT_EQ(wire::load_be32(ip + 16), 0x0A000001u);  // to a
  EXPECT_EQ(wire::ipv4_checksum(ip, 20), 0);
  const uint8_t* udp = ip + 20;
  EXPECT_EQ(wire::load_be16(udp), 0);  // source port 0, as the captured CNP
  EXPECT_EQ(wire::load_be16(udp + 2), 4791);
  EXPECT_EQ(wire::load_be16(udp + 4), 8 + 12 + 16 + 4);
  EXPECT_EQ(wire::load_be16(udp + 6), 0);  // no UDP checksum
  const uint8_t* bth = udp + 8;
  const uint8_t kBth[12] = {0x81, 0x00, 0xFF, 0xFF, 0x40, 0x00, 0x00, 0x11, 0x00, 0x00, 0x00, 0x00};
  EXPECT_EQ(0, std::memcmp(bth, kBth, 12));  // CNP, P_Key 0xFFFF, BECN, QP 0x11, PSN 0
  const uint8_t zeros[16] = {};
  EXPECT_EQ(0, std::memcmp(bth + 12, zeros, 16));
  // The ICRC verifies (parse_frame checked it too).
  const uint32_t icrc = wire::compute_icrc_v4(f.data() + 14, f.size() - 14);
  const uint8_t* t = f.data() + f.size() - 4;  // least significant byte first
  EXPECT_EQ(uint32_t{t[0]} | uint32_t{t[1]} << 8 | uint32_t{t[2]} << 16 | uint32_t{t[3]} << 24, icrc);
}

// A CNP captured from a ConnectX-4 Lx (10.0.17.1 -> 10.0.18.1, to QP 0x118),
// published in scapy's test/contrib/roce.uts ("RoCE CNP captured on
// ConnectX-4 Lx"). droce's CNP from a connection with those addresses and
// that QPN has the same bytes but for the MACs and the IP ID (and what the
// IP ID enters: the IP checksum and the ICRC).
constexpr uint8_t kConnectX4LxCnp[] = {
    0xe4, 0x1d, 0x2d, 0xab, 0x2b, 0xc2, 0x7c, 0xfe, 0x90, 0x64, 0x3b, 0x32, 0x08, 0x00, 0x45, 0xc2,
    0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11, 0x01, 0x0a, 0x00,
    0x12, 0x01, 0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, 0x81, 0x00, 0xff, 0xff, 0x40, 0x00,
    0x01, 0x18, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x82, 0xfd, 0x00, 0x2a};

TEST(CcTransport, CnpMatchesAConnectX4LxCapture) {
  // The capture itself: droce's parser accepts it and its ICRC is droce's.
  wire::PacketView v;
  ASSERT_EQ(wire::parse_frame(kConnectX4LxCnp, &v), wire::ParseError::kOk);
  EXPECT_EQ(v.bth.opcode, wire::kCnp);
  EXPECT_EQ(v.bth.dqpn, 0x118u);
  // droce's CNP between the same addresses to the same QP.
  Seen seen;
  SimPair p(LinkFaults{}, 9);
  p.a.cc = p.b.cc = cc::CcMode::kDcqcn;
  p.a.Init(&p.net.link, 0x118, 0x0A001201, 64, 256, 64 * 1024);  // the data sender: 10.0.18.1, QP 0x118
  p.b.Init(&p.net.link, 0x22, 0x0A001101, 64, 256, 64 * 1024);   // sends the CNP: 10.0.17.1
  p.net.Attach(&p.a);
  p.net.Attach(&p.b);
  ASSERT_EQ(p.a.Connect(p.b), 0);
  ASSERT_EQ(p.b.Connect(p.a), 0);
  p.net.link.on_send = [&seen](std::span<const uint8_t> f) { seen.frames.emplace_back(f.begin(), f.end()); };
  p.net.link.shaper = [](uint8_t* data, uint32_t len, uint64_t, uint64_t*) {
    cc::MarkCe(data, len);
    return true;
  };
  p.a.PostOp(queue::WqeOp::kWrite, 1, 0, 100, p.b.Addr(0), p.b.key);
  AwaitSends(p, 1);
  std::vector<uint8_t> cnp;
  for (const auto& f : seen.frames) {
    if (Opcode(f) == wire::kCnp) cnp = f;
  }
  ASSERT_EQ(cnp.size(), sizeof(kConnectX4LxCnp));
  // MACs aside; the capture's IP ID in, then the IP checksum and the ICRC
  // (which covers the IP ID) again.
  std::memcpy(cnp.data(), kConnectX4LxCnp, 12);
  std::memcpy(cnp.data() + 18, kConnectX4LxCnp + 18, 2);
  wire::store_be16(cnp.data() + 24, 0);
  wire::store_be16(cnp.data() + 24, wire::ipv4_checksum(cnp.data() + 14, 20));
  wire::finish_icrc_v4(cnp.data(), cnp.size());
  EXPECT_EQ(0, std::memcmp(cnp.data(), kConnectX4LxCnp, sizeof(kConnectX4LxCnp)))
      << "droce's CNP differs from the ConnectX-4 Lx capture";
  for (size_t i = 0; i < cnp.size(); ++i) EXPECT_EQ(cnp[i], kConnectX4LxCnp[i]) << "byte " << i;
}

// With DCQCN limiting it, the sender's packets leave at the reaction
// point's rate: a long transfer under constant marking is paced.
TEST(CcTransport, PacedAtTheReactionPointsRate) {
  Seen seen;
  SimPair p(LinkFaults{}, 8);
  Connect(p, cc::CcMode::kDcqcn, cc::CcMode::kDcqcn, 4, &seen);
  // Marks stop after 1 ms of virtual time: the rate is then held by DCQCN
  // and recovers by its timer and byte counter.
  const uint64_t t0 = p.net.link.clock;
  p.net.link.shaper = [&](uint8_t* data, uint32_t len, uint64_t now, uint64_t*) {
    if (now < t0 + 1'000'000) cc::MarkCe(data, len);
    return true;
  };
  for (int i = 0; i < 60; ++i) p.a.PostOp(queue::WqeOp::kWrite, i, 0, 64 * 1024, p.b.Addr(0), p.b.key);
  AwaitSends(p, 60);
  const cc::ReactionPoint& rp = p.a.qp->reaction_point();
  EXPECT_GT(p.a.env->stats.rp_cnp_handled, 10u);
  EXPECT_GT(rp.cuts(), 10u);
  EXPECT_GT(rp.increases(), 10u);
  // 60 × 64 KiB took far longer than at the unlimited simulated link.
  EXPECT_GT(p.net.link.clock - t0, 1'000'000u);
}

}  // namespace
}  // namespace droce::test
