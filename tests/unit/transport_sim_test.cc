// Two RC QPs over a simulated lossy link, in virtual time: every message
// arrives intact, in order, exactly once, and completes on both sides.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "cq/cq.h"
#include "queue/shm.h"
#include "queue/wqe_encode.h"
#include "transport/sim/two_qp.h"
#include "transport/qp.h"
#include "wire/frame.h"

namespace droce::test {
namespace {

using transport::QpAttr;
using transport::QpState;
using transport::sim::LinkFaults;
using transport::sim::SimPair;
using transport::sim::SimQp;

// Every frame the link delivered parsed, unless it was corrupted on purpose.
void ExpectCleanLink(const SimPair& p) {
  EXPECT_EQ(p.net.link.stats.parse_errors, 0u);
  EXPECT_EQ(p.net.unrouted, 0u);
}

void TransferWith(LinkFaults faults, uint8_t mtu, uint32_t msg_len, int nmsgs, uint32_t seed);
void Transfer(double loss, double dup, uint8_t mtu, uint32_t msg_len, int nmsgs, uint32_t seed) {
  LinkFaults f;
  f.loss = loss;
  f.dup = dup;
  TransferWith(f, mtu, msg_len, nmsgs, seed);
}

void TransferWith(LinkFaults faults, uint8_t mtu, uint32_t msg_len, int nmsgs, uint32_t seed) {
  const double loss = faults.loss, dup = faults.dup;
  SimPair p(faults, seed);
  ASSERT_EQ(0, p.Init(64, 256, size_t{msg_len} * 2, {.mtu = mtu}));
  SimQp &a = p.a, &b = p.b;
  std::mt19937 rng(seed);
  int sent = 0, received = 0, send_done = 0;
  std::vector<queue::Cqe> cqes(64);
  for (int m = 0; m < nmsgs; ++m) {
    for (uint32_t i = 0; i < msg_len; ++i) a.buf[i] = static_cast<uint8_t>(rng());
    std::memset(b.buf.data(), 0, msg_len);
    b.PostRecv(1000 + m, 0, msg_len);
    a.PostSend(m, 0, msg_len);
    ++sent;
    bool ok = p.net.Run([&] {
      int n = a.scq_c->Poll(cqes.data(), 64);
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(cqes[i].status, queue::wc::kSuccess);
        EXPECT_EQ(cqes[i].wr_id, static_cast<uint64_t>(m));
        ++send_done;
      }
      n = b.rcq_c->Poll(cqes.data(), 64);
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(cqes[i].status, queue::wc::kSuccess);
        EXPECT_EQ(cqes[i].byte_len, msg_len);
        EXPECT_EQ(cqes[i].wr_id, static_cast<uint64_t>(1000 + m));
        ++received;
      }
      return send_done == sent && received == sent;
    });
    ASSERT_TRUE(ok) << "message " << m << " never completed";
    ASSERT_EQ(0, std::memcmp(a.buf.data(), b.buf.data(), msg_len)) << "message " << m;
  }
  EXPECT_EQ(a.qp->state(), QpState::kRts);
  EXPECT_EQ(b.qp->state(), QpState::kRts);
  ExpectCleanLink(p);
  if (loss == 0 && dup == 0) {
    EXPECT_EQ(a.env->stats.completer_retry_err, 0u);
    EXPECT_EQ(b.env->stats.duplicate_request, 0u);
  }
}

TEST(TransportSim, LosslessSmallMessages) { Transfer(0, 0, 3, 1, 200, 1); }
TEST(TransportSim, LosslessSegmented) { Transfer(0, 0, 3, 4096 * 3 + 5, 50, 2); }
TEST(TransportSim, LossyRetransmits) { Transfer(0.05, 0, 1, 5000, 100, 3); }
TEST(TransportSim, DuplicatesAreNotExecutedTwice) { Transfer(0, 0.1, 3, 3000, 100, 4); }
TEST(TransportSim, LossAndDuplicates4096Mtu) { Transfer(0.03, 0.03, 5, 20000, 50, 5); }

std::string Dump(const Counters& c) {
  std::string out;
  for (const auto& i : kCounterInfo) {
    if (c.*(i.field) != 0) out += std::string(i.name) + "=" + std::to_string(c.*(i.field)) + " ";
  }
  return out;
}

// RDMA WRITE, READ and atomics under loss and duplication: data lands
// exactly, READs that lose responses are reissued for the missing part, and a
// duplicated atomic is never executed twice.
void RdmaOps(double loss, double dup, uint8_t mtu, uint32_t len, int rounds, uint32_t seed,
             double reorder = 0, double corrupt = 0) {
  LinkFaults faults;
  faults.loss = loss;
  faults.dup = dup;
  faults.reorder = reorder;
  faults.corrupt = corrupt;
  SimPair p(faults, seed);
  ASSERT_EQ(0, p.Init(64, 256, size_t{len} * 3 + 72, {.mtu = mtu}));
  SimQp &a = p.a, &b = p.b;
  std::mt19937 rng(seed);
  const uint64_t rbase = reinterpret_cast<uint64_t>(b.buf.data());
  const size_t word_off = (size_t{len} * 3 + 7) & ~size_t{7};  // atomics need 8-byte alignment
  uint64_t expect_word = 0;
  std::memcpy(b.buf.data() + word_off, &expect_word, 8);
  std::vector<queue::Cqe> c(64);
  for (int r = 0; r < rounds; ++r) {
    for (uint32_t i = 0; i < len; ++i) a.buf[i] = static_cast<uint8_t>(rng());
    a.PostOp(queue::WqeOp::kWrite, 1, 0, len, rbase, b.key);
    a.PostOp(queue::WqeOp::kRead, 2, len, len, rbase, b.key);
    a.PostOp(queue::WqeOp::kFetchAdd, 3, 2 * len, 8, rbase + word_off, b.key, 3);
    int done = 0;
    ASSERT_TRUE(p.net.Run([&] {
      int n = a.scq_c->Poll(c.data(), 64);
      for (int i = 0; i < n; ++i) EXPECT_EQ(c[i].status, queue::wc::kSuccess) << "round " << r << " wr " << c[i].wr_id << " " << Dump(a.env->stats) << " / " << Dump(b.env->stats);
      done += n;
      return done == 3;
    })) << "round " << r << " done " << done << " a: " << transport::qp_state_name(a.qp->state())
        << " b: " << transport::qp_state_name(b.qp->state()) << "\n" << Dump(a.env->stats) << "\n"
        << Dump(b.env->stats);
    ASSERT_EQ(0, std::memcmp(a.buf.data(), b.buf.data(), len)) << "WRITE, round " << r;
    ASSERT_EQ(0, std::memcmp(a.buf.data(), a.buf.data() + len, len)) << "READ, round " << r;
    uint64_t orig = 0;
    std::memcpy(&orig, a.buf.data() + 2 * len, 8);
    EXPECT_EQ(orig, expect_word) << "round " << r;
    expect_word += 3;
  }
  uint64_t word = 0;
  std::memcpy(&word, b.buf.data() + word_off, 8);
  EXPECT_EQ(word, expect_word);  // each FETCH_ADD executed exactly once
  ExpectCleanLink(p);
}

TEST(TransportSim, RdmaLossless) { RdmaOps(0, 0, 3, 10000, 20, 21); }
TEST(TransportSim, RdmaUnderLoss) { RdmaOps(0.05, 0, 1, 20000, 30, 22); }
TEST(TransportSim, RdmaUnderDuplication) { RdmaOps(0, 0.1, 3, 9000, 30, 23); }
TEST(TransportSim, RdmaUnderLossAndDuplication) { RdmaOps(0.03, 0.05, 5, 50000, 20, 24); }

// Many seeds, every MTU: the combinations single seeds miss.
TEST(TransportSim, RdmaManySeeds) {
  for (uint32_t seed = 100; seed < 300; ++seed) {
    SCOPED_TRACE(seed);
    RdmaOps(0.02 + (seed % 5) * 0.01, (seed % 3) * 0.04, static_cast<uint8_t>(1 + seed % 5),
            1000 + (seed * 7919) % 30000, 6, seed, /*reorder=*/(seed % 2) * 0.05, /*corrupt=*/0.01);
    if (HasFatalFailure()) return;
  }
}

TEST(TransportSim, SendManySeeds) {
  for (uint32_t seed = 1000; seed < 1200; ++seed) {
    SCOPED_TRACE(seed);
    Transfer(0.02 + (seed % 4) * 0.01, (seed % 3) * 0.04, static_cast<uint8_t>(1 + seed % 5),
             1 + (seed * 7919) % 20000, 10, seed);
    if (HasFatalFailure()) return;
  }
}

// Everything at once: 1% and 10% loss with reordering, duplication and
// corruption; every byte and completion checked. A failing seed is in the
// trace so it can be replayed.
TEST(TransportSim, HostileLinkManySeeds) {
  for (double loss : {0.0, 0.01, 0.10}) {
    for (uint32_t seed = 3000; seed < 3040; ++seed) {
      SCOPED_TRACE(testing::Message() << "loss " << loss << " seed " << seed);
      LinkFaults f;
      f.loss = loss;
      f.dup = 0.02;
      f.reorder = 0.05;
      f.corrupt = 0.01;
      TransferWith(f, static_cast<uint8_t>(1 + seed % 5), 1 + (seed * 7919) % 12000, 12, seed);
      if (HasFatalFailure()) return;
    }
  }
}

// A destination that never resolves: the WQE fails with RETRY_EXC_ERR after
// what its retries would have taken, instead of waiting forever.
TEST(TransportSim, UnresolvableNeighborEndsInRetryExceeded) {
  SimPair p(LinkFaults{}, 12);
  ASSERT_EQ(0, p.Init(16, 64, 4096, {.mtu = 3}));
  SimQp& a = p.a;
  a.env->resolvable = false;
  a.PostSend(1, 0, 100);
  a.PostSend(2, 0, 100);
  std::vector<queue::Cqe> c(8);
  int n = 0;
  ASSERT_TRUE(p.net.Run([&] {
    n += a.scq_c->Poll(c.data() + n, 8 - n);
    return n == 2;
  }));
  EXPECT_EQ(c[0].wr_id, 1u);
  EXPECT_EQ(c[0].status, queue::wc::kRetryExcErr);
  EXPECT_EQ(c[1].status, queue::wc::kWrFlushErr);
  EXPECT_EQ(a.qp->state(), QpState::kErr);
}

// Regression (found by transport_volume_test, seed 1000160): a READ
// reissued for its missing second response, then rewound to its start by a
// late sequence NAK, must still accept the reissue's ONLY response. The
// completer remembered only the latest request's start and failed the READ
// with BAD_RESP_ERR.
TEST(TransportSim, ReadReissueThenRewindAcceptsEitherResponse) {
  SimPair p(LinkFaults{}, 13);
  ASSERT_EQ(0, p.Init(16, 64, 4096, {.mtu = 1}));  // 256-byte MTU: a 389-byte READ has 2 responses
  SimQp &a = p.a, &b = p.b;
  for (uint32_t i = 0; i < 389; ++i) b.buf[1024 + i] = static_cast<uint8_t>(i * 7 + 1);
  std::vector<uint8_t> read_req, nak, only;
  int read_reqs = 0;
  bool last_dropped = false;
  p.net.tap = [&](const wire::PacketView& v) {
    const uint8_t op = v.bth.opcode;
    if (op == wire::kRcReadRequest && ++read_reqs == 1) {
      read_req.assign(v.frame.begin(), v.frame.end());  // held: the WRITE after it draws a NAK
      return false;
    }
    if (op == wire::kRcAck && nak.empty() &&
        wire::read_aeth(v.ext(v.info->aeth)).type() == wire::AckType::kNak) {
      nak.assign(v.frame.begin(), v.frame.end());  // held: it arrives late
      return false;
    }
    if (op == wire::kRcReadResponseLast && !last_dropped) {
      last_dropped = true;  // lost: the READ is reissued for its second response
      return false;
    }
    if (op == wire::kRcReadResponseOnly && only.empty()) {
      only.assign(v.frame.begin(), v.frame.end());  // the reissue's answer, held
      return false;
    }
    return true;
  };
  a.PostOp(queue::WqeOp::kWrite, 1, 0, 16, b.Addr(0), b.key);
  a.PostOp(queue::WqeOp::kRead, 2, 1024, 389, b.Addr(1024), b.key);
  a.PostOp(queue::WqeOp::kWrite, 3, 0, 16, b.Addr(0), b.key);
  ASSERT_TRUE(p.net.Run([&] { return !nak.empty(); }));
  p.net.link.Inject(read_req);
  ASSERT_TRUE(p.net.Run([&] { return !only.empty(); }));
  p.net.link.Inject(nak);  // rewinds the requester to the READ's first PSN
  ASSERT_TRUE(p.net.Run([&] { return read_reqs == 3; }));  // the whole READ resent
  p.net.link.Inject(only);
  std::vector<queue::Cqe> c(8);
  int n = 0;
  ASSERT_TRUE(p.net.Run([&] {
    n += a.scq_c->Poll(c.data() + n, 8 - n);
    return n == 3;
  }));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c[i].wr_id, static_cast<uint64_t>(i + 1));
    EXPECT_EQ(c[i].status, queue::wc::kSuccess) << "wr " << c[i].wr_id;
  }
  EXPECT_EQ(0, std::memcmp(a.buf.data() + 1024, b.buf.data() + 1024, 389));
  ExpectCleanLink(p);
}

// Regression: UD has no path MTU attribute; its messages may be as long as
// the port's active MTU (4096 here), not QpAttr's default 1024.
TEST(TransportSim, UdMessageUpToThePortMtu) {
  SimPair p(LinkFaults{}, 14);
  ASSERT_EQ(0, p.Init(16, 64, 3 * 4096, {}, transport::QpType::kUd));
  SimQp &a = p.a, &b = p.b;
  for (uint32_t i = 0; i < 4096; ++i) a.buf[4096 + i] = static_cast<uint8_t>(i * 13 + 5);
  b.PostRecv(1, 0, 40 + 4096);
  queue::SendWqe w{};
  w.wr_id = 2;
  w.op = queue::WqeOp::kSend;
  w.flags = queue::kWqeSignaled;
  w.num_sge = 1;
  queue::EncodeUd(&w, 1, b.qp->qpn(), transport::sim::ConnectOpts{}.qkey);
  const queue::Sge s{a.Addr(4096), 4096, a.key};
  a.Post(w, &s);
  queue::Cqe sc{}, rc{};
  ASSERT_TRUE(p.net.Run([&] { return a.scq_c->Poll(&sc, 1) == 1; }));
  EXPECT_EQ(sc.status, queue::wc::kSuccess);
  ASSERT_TRUE(p.net.Run([&] { return b.rcq_c->Poll(&rc, 1) == 1; }));
  EXPECT_EQ(rc.status, queue::wc::kSuccess);
  EXPECT_EQ(rc.byte_len, 40u + 4096u);
  EXPECT_EQ(0, std::memcmp(b.buf.data() + 40, a.buf.data() + 4096, 4096));
}

// RC over IPv6 GIDs: every frame (requests, ACKs, READ responses) is IPv6
// between the ports' IPv6 addresses with the address vector's traffic
// class, flow label and hop limit, and SENDs and READs survive loss.
TEST(TransportSim, RcOverIpv6Gids) {
  SimPair p(LinkFaults{.loss = 0.05}, 11);
  const uint32_t len = 5000;
  ASSERT_EQ(0, p.Init(64, 256, len * 2,
                      {.ipv6 = true, .traffic_class = 0x68, .flow_label = 0xABCDE, .hop_limit = 9}));
  SimQp &a = p.a, &b = p.b;
  uint64_t frames = 0;
  p.net.tap = [&](const wire::PacketView& v) {
    const bool to_b = v.bth.dqpn == b.qp->qpn();
    EXPECT_TRUE(v.ipv6);
    EXPECT_EQ(v.sip6, to_b ? SimPair::kIp6A : SimPair::kIp6B);
    EXPECT_EQ(v.dip6, to_b ? SimPair::kIp6B : SimPair::kIp6A);
    EXPECT_EQ(v.traffic_class, 0x68);
    EXPECT_EQ(v.flow_label, 0xABCDEu);
    EXPECT_EQ(v.hop_limit, 9);
    ++frames;
    return true;
  };
  std::mt19937 rng(11);
  std::vector<queue::Cqe> c(64);
  for (int m = 0; m < 20; ++m) {
    for (uint32_t i = 0; i < len; ++i) a.buf[i] = static_cast<uint8_t>(rng());
    b.PostRecv(m, 0, len);
    a.PostSend(m, 0, len);
    int done = 0;
    ASSERT_TRUE(p.net.Run([&] {
      for (int i = a.scq_c->Poll(c.data(), 64); i > 0; --i, ++done) EXPECT_EQ(c[i - 1].status, queue::wc::kSuccess);
      for (int i = b.rcq_c->Poll(c.data(), 64); i > 0; --i, ++done) EXPECT_EQ(c[i - 1].byte_len, len);
      return done == 2;
    })) << "message " << m;
    ASSERT_EQ(0, std::memcmp(a.buf.data(), b.buf.data(), len)) << "message " << m;
  }
  // A READ back from b's buffer: responses travel over IPv6 too.
  std::memset(a.buf.data() + len, 0, len);
  a.PostOp(queue::WqeOp::kRead, 99, len, len, b.Addr(0), b.key);
  ASSERT_TRUE(p.net.Run([&] { return a.scq_c->Poll(c.data(), 64) == 1; }));
  EXPECT_EQ(c[0].status, queue::wc::kSuccess);
  EXPECT_EQ(0, std::memcmp(a.buf.data() + len, b.buf.data(), len));
  EXPECT_GT(frames, 100u);
}

// The responder coalesces the ACKs of one receive burst: a window of small
// SENDs delivered together is acknowledged by a few ACK frames, not one per
// message, and every send still completes.
TEST(TransportSim, AcksOfOneBurstLeaveAsOneFrame) {
  SimPair p(LinkFaults{}, 15);
  ASSERT_EQ(0, p.Init(64, 256, 4096));
  SimQp &a = p.a, &b = p.b;
  uint64_t acks = 0;
  p.net.tap = [&](const wire::PacketView& v) {
    if (v.bth.opcode == static_cast<uint8_t>(wire::Opcode::kRcAck)) ++acks;
    return true;
  };
  constexpr int kMsgs = 32;
  for (int i = 0; i < kMsgs; ++i) {
    b.PostRecv(i, i * 64, 64);
    a.PostSend(i, i * 64, 64);
  }
  std::vector<queue::Cqe> c(64);
  int sends = 0, recvs = 0;
  ASSERT_TRUE(p.net.Run([&] {
    sends += a.scq_c->Poll(c.data(), 64);
    recvs += b.rcq_c->Poll(c.data(), 64);
    return sends == kMsgs && recvs == kMsgs;
  }));
  EXPECT_LE(acks, 4u) << "one ACK per burst, not per message";
  EXPECT_GE(b.env->stats.ack_coalesced, static_cast<uint64_t>(kMsgs - 4));
}

// The ACK of a SEND whose receive completion the application has already
// seen goes out even if the application then moves its QP to ERR before the
// turn that would have sent it (rdma_disconnect, then destroy: fio's server
// over rdma_cm did this to its client's last SEND, and the Linux client
// resent it to a QP that was gone until it gave up).
TEST(TransportSim, QueuedAckLeavesBeforeTheQpGoesToError) {
  SimPair p(LinkFaults{}, 16);
  ASSERT_EQ(0, p.Init(16, 64, 4096));
  SimQp &a = p.a, &b = p.b;
  b.PostRecv(70, 0, 100);
  a.PostSend(7, 0, 100);
  std::vector<queue::Cqe> c(8);
  // Stops as soon as the receive completes: its ACK is still queued.
  ASSERT_TRUE(p.net.Run([&] { return b.rcq_c->Poll(c.data(), 8) == 1; }));
  ASSERT_EQ(c[0].status, queue::wc::kSuccess);
  ASSERT_TRUE(b.qp->HasResponses()) << "the test needs the ACK still queued";
  transport::QpAttr err;
  err.state = transport::QpState::kErr;
  ASSERT_EQ(b.Modify(err, transport::kAttrState), 0);
  ASSERT_TRUE(p.net.Run([&] { return a.scq_c->Poll(c.data(), 8) == 1; }));
  EXPECT_EQ(c[0].status, queue::wc::kSuccess) << "the SEND was delivered; its ACK must not be lost";
  EXPECT_EQ(a.env->stats.retry_exceeded_err, 0u);
}

TEST(TransportSim, RnrNakThenRetry) {
  SimPair p(LinkFaults{}, 9);
  ASSERT_EQ(0, p.Init(16, 64, 4096, {.mtu = 3}));
  SimQp &a = p.a, &b = p.b;
  a.PostSend(7, 0, 100);
  std::vector<queue::Cqe> c(8);
  // No receive posted: the responder RNR-NAKs until one appears.
  p.net.Run([&] { return b.env->stats.send_rnr_err >= 3; });
  b.PostRecv(70, 0, 100);
  ASSERT_TRUE(p.net.Run([&] { return a.scq_c->Poll(c.data(), 8) == 1; }));
  EXPECT_EQ(c[0].status, queue::wc::kSuccess);
  ASSERT_EQ(b.rcq_c->Poll(c.data(), 8), 1);
  EXPECT_EQ(c[0].wr_id, 70u);
}

// IBA table 45: the RNR NAK timer codes. Code 0 is the longest wait,
// 655.36 ms (it once read 655 s here: an rsockets stream whose peer asked
// for code 0 stalled for good after one RNR NAK).
TEST(TransportRnrTimer, Table45) {
  EXPECT_EQ(transport::rnr_timer_ns(0), 655'360'000u);
  EXPECT_EQ(transport::rnr_timer_ns(1), 10'000u);
  EXPECT_EQ(transport::rnr_timer_ns(5), 60'000u);
  EXPECT_EQ(transport::rnr_timer_ns(12), 640'000u);
  EXPECT_EQ(transport::rnr_timer_ns(14), 1'280'000u);
  EXPECT_EQ(transport::rnr_timer_ns(20), 10'240'000u);
  EXPECT_EQ(transport::rnr_timer_ns(31), 491'520'000u);
  for (uint8_t c = 2; c < 32; ++c) EXPECT_GT(transport::rnr_timer_ns(c), transport::rnr_timer_ns(c - 1)) << int(c);
  EXPECT_GT(transport::rnr_timer_ns(0), transport::rnr_timer_ns(31));
}

TEST(TransportSim, BadLkeyCompletesWithProtectionErrorAndFlushes) {
  SimPair p(LinkFaults{}, 10);
  ASSERT_EQ(0, p.Init(16, 64, 4096, {.mtu = 3}));
  SimQp& a = p.a;
  a.PostSend(1, 0, 100, /*lkey_override=*/0xBAD00);
  a.PostSend(2, 0, 100);
  std::vector<queue::Cqe> c(8);
  int n = 0;
  ASSERT_TRUE(p.net.Run([&] {
    n += a.scq_c->Poll(c.data() + n, 8 - n);
    return n == 2;
  }));
  EXPECT_EQ(c[0].wr_id, 1u);
  EXPECT_EQ(c[0].status, queue::wc::kLocProtErr);
  EXPECT_EQ(c[1].wr_id, 2u);
  EXPECT_EQ(c[1].status, queue::wc::kWrFlushErr);
  EXPECT_EQ(a.qp->state(), QpState::kErr);
}

TEST(TransportSim, RecvTooSmallIsLocalLengthErrorAndRemoteInvalidRequest) {
  SimPair p(LinkFaults{}, 11);
  ASSERT_EQ(0, p.Init(16, 64, 4096, {.mtu = 3}));
  SimQp &a = p.a, &b = p.b;
  b.PostRecv(5, 0, 10);
  a.PostSend(6, 0, 100);
  std::vector<queue::Cqe> c(8);
  ASSERT_TRUE(p.net.Run([&] { return a.scq_c->Poll(c.data(), 8) == 1; }));
  EXPECT_EQ(c[0].status, queue::wc::kRemInvReqErr);
  ASSERT_EQ(b.rcq_c->Poll(c.data(), 8), 1);
  EXPECT_EQ(c[0].status, queue::wc::kLocLenErr);
}

TEST(QpStateMachine, RejectsMissingAndExtraAttributes) {
  transport::sim::SimLink link(LinkFaults{}, 0);
  SimQp a;
  a.Init(&link, 0x11, 1, 16, 16, 64);
  QpAttr attr;
  attr.state = QpState::kInit;
  // RESET→INIT for RC needs PKEY_INDEX, PORT and ACCESS_FLAGS.
  EXPECT_EQ(EINVAL, a.Modify(attr, transport::kAttrState | transport::kAttrPort));
  // QKEY is not an RC attribute.
  EXPECT_EQ(EINVAL, a.Modify(attr, transport::kAttrState | transport::kAttrPkeyIndex |
                                           transport::kAttrPort | transport::kAttrAccessFlags |
                                           transport::kAttrQkey));
  EXPECT_EQ(QpState::kReset, a.qp->state());
  // RESET→RTR skips INIT.
  attr.state = QpState::kRtr;
  EXPECT_EQ(EINVAL, a.Modify(attr, transport::kAttrState));
  attr.state = QpState::kErr;
  EXPECT_EQ(0, a.Modify(attr, transport::kAttrState));
  EXPECT_EQ(QpState::kErr, a.qp->state());
}

}  // namespace
}  // namespace droce::test
