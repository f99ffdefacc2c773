// Adaptive retransmission (DROCE_ADP_RETRANS, transport/adaptive_retrans.h;
// the ConnectX counters roce_adp_retrans and roce_adp_retrans_to) in virtual
// time: a lost tail packet, ACK or READ response is resent after the round
// trip's timeout instead of the QP's local ACK timeout; the early resends
// spend no retry, so a dead peer fails the QP when it would without them;
// each counter is triggered an exact number of times.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <vector>

#include "transport/adaptive_retrans.h"
#include "transport/sim/two_qp.h"
#include "wire/frame.h"

namespace droce::test {
namespace {

using transport::AdaptiveRetrans;
using transport::RttEstimator;
using transport::sim::ConnectOpts;
using transport::sim::LinkFaults;
using transport::sim::SimPair;

constexpr uint64_t kUs = 1000, kMs = 1000 * kUs;

TEST(RttEstimator, Rfc6298) {
  RttEstimator e;
  EXPECT_FALSE(e.has_sample());
  EXPECT_EQ(e.Rto(500 * kUs, 1 * kMs), 1 * kMs);       // no sample: init
  EXPECT_EQ(e.Rto(2 * kMs, 1 * kMs), 2 * kMs);         // never below min
  e.Sample(100 * kUs);                                 // SRTT = R, RTTVAR = R/2
  EXPECT_EQ(e.srtt_ns(), 100 * kUs);
  EXPECT_EQ(e.rttvar_ns(), 50 * kUs);
  EXPECT_EQ(e.Rto(10 * kUs, 1 * kMs), 300 * kUs);      // SRTT + 4 RTTVAR
  e.Sample(180 * kUs);                                 // |err| 80: RTTVAR 3/4·50 + 20, SRTT 7/8·100 + 22.5
  EXPECT_EQ(e.rttvar_ns(), 57500u);
  EXPECT_EQ(e.srtt_ns(), 110000u);
  EXPECT_EQ(e.Rto(500 * kUs, 1 * kMs), 500 * kUs);     // min wins
  for (int i = 0; i < 200; ++i) e.Sample(20 * kUs);    // a steady 20 µs round trip
  EXPECT_NEAR(static_cast<double>(e.srtt_ns()), 20'000.0, 100.0);
  EXPECT_LT(e.rttvar_ns(), 100u);
}

// One QP pair at 256-byte MTU with the given local ACK timeout; `a` has
// adaptive retransmission as given. drop(view) decides which frames the
// link loses.
struct Pair {
  explicit Pair(AdaptiveRetrans adp, uint8_t timeout = 14, uint8_t retry_cnt = 7) : p(LinkFaults{}, 61) {
    p.a.adp = adp;
    ConnectOpts o;
    o.mtu = 1;
    o.timeout = timeout;
    o.retry_cnt = retry_cnt;
    EXPECT_EQ(0, p.Init(16, 64, 8192, o));
    p.net.tap = [this](const wire::PacketView& v) { return !(drop && drop(v)); };
  }
  // Posts op and runs until its completion; returns the completion and the
  // virtual time it took.
  queue::Cqe Run(queue::WqeOp op, uint32_t len, uint64_t* took_ns) {
    const uint64_t start = p.net.link.clock;
    p.a.PostOp(op, ++wr_id, 0, len, p.b.Addr(4096), p.b.key);
    queue::Cqe c{};
    int got = 0;
    EXPECT_TRUE(p.net.Run([&] {
      got += p.a.scq_c->Poll(&c, 1);
      return got == 1;
    }));
    *took_ns = p.net.link.clock - start;
    return c;
  }
  const Counters& a() const { return p.a.env->stats; }
  SimPair p;
  std::function<bool(const wire::PacketView&)> drop;
  uint64_t wr_id = 0;
};

AdaptiveRetrans On(uint32_t min_us = 200, uint32_t init_us = 1000) { return {true, min_us, init_us}; }

bool IsRequest(const wire::PacketView& v) { return v.bth.opcode == wire::kRcWriteOnly || v.bth.opcode == wire::kRcReadRequest; }

// Drops the first n requests the requester sends.
std::function<bool(const wire::PacketView&)> DropRequests(int n) {
  return [n, seen = 0](const wire::PacketView& v) mutable { return IsRequest(v) && seen++ < n; };
}

// A lost single-packet WRITE: without adaptive retransmission it waits the
// whole local ACK timeout (timeout 14: 67 ms) and spends a retry; with it,
// one adaptive resend after init (1 ms, no round trip measured yet).
TEST(AdaptiveRetrans, LostTailRequestResentEarly) {
  Pair off({});
  off.drop = DropRequests(1);
  uint64_t off_ns = 0;
  EXPECT_EQ(off.Run(queue::WqeOp::kWrite, 200, &off_ns).status, queue::wc::kSuccess);
  EXPECT_EQ(off.a().completer_retry_err, 1u);
  EXPECT_EQ(off.a().roce_adp_retrans, 0u);
  EXPECT_GE(off_ns, 4096ull << 14);

  Pair on(On());
  on.drop = DropRequests(1);
  uint64_t on_ns = 0;
  EXPECT_EQ(on.Run(queue::WqeOp::kWrite, 200, &on_ns).status, queue::wc::kSuccess);
  EXPECT_EQ(on.a().roce_adp_retrans, 1u);
  EXPECT_EQ(on.a().roce_adp_retrans_to, 0u);
  EXPECT_EQ(on.a().completer_retry_err, 0u);
  EXPECT_EQ(on.a().retransmitted_pkts, 1u);
  EXPECT_GE(on_ns, 1 * kMs);
  EXPECT_LT(on_ns, 1 * kMs + 300 * kUs);  // the simulator looks every 100 µs while idle
}

// The same request lost three times: adaptive resends at init, then 2× and
// 4× later (1, 3 and 7 ms), all before the 67 ms timeout.
TEST(AdaptiveRetrans, DoublesAtEachFurtherExpiry) {
  Pair on(On());
  on.drop = DropRequests(3);
  uint64_t ns = 0;
  EXPECT_EQ(on.Run(queue::WqeOp::kWrite, 200, &ns).status, queue::wc::kSuccess);
  EXPECT_EQ(on.a().roce_adp_retrans, 3u);
  EXPECT_EQ(on.a().roce_adp_retrans_to, 0u);
  EXPECT_EQ(on.a().completer_retry_err, 0u);
  EXPECT_GE(ns, 7 * kMs);
  EXPECT_LT(ns, 7 * kMs + 500 * kUs);
}

// A lost ACK: the resend is a duplicate at the responder, which
// acknowledges it again.
TEST(AdaptiveRetrans, LostAck) {
  Pair on(On());
  int acks = 0;
  on.drop = [&](const wire::PacketView& v) { return v.bth.opcode == wire::kRcAck && acks++ == 0; };
  uint64_t ns = 0;
  EXPECT_EQ(on.Run(queue::WqeOp::kWrite, 200, &ns).status, queue::wc::kSuccess);
  EXPECT_EQ(on.a().roce_adp_retrans, 1u);
  EXPECT_EQ(on.p.b.env->stats.duplicate_request, 1u);
  EXPECT_EQ(on.a().completer_retry_err, 0u);
}

// A lost READ response: the READ is asked for again (a duplicate at the
// responder, which answers it again).
TEST(AdaptiveRetrans, LostReadResponse) {
  Pair on(On());
  for (int i = 0; i < 200; ++i) on.p.b.buf[4096 + i] = static_cast<uint8_t>(i * 7 + 1);
  int resp = 0;
  on.drop = [&](const wire::PacketView& v) { return v.bth.opcode == wire::kRcReadResponseOnly && resp++ == 0; };
  uint64_t ns = 0;
  EXPECT_EQ(on.Run(queue::WqeOp::kRead, 200, &ns).status, queue::wc::kSuccess);
  EXPECT_EQ(0, std::memcmp(on.p.a.buf.data(), on.p.b.buf.data() + 4096, 200));
  EXPECT_EQ(on.a().roce_adp_retrans, 1u);
  EXPECT_EQ(on.a().completer_retry_err, 0u);
  EXPECT_EQ(on.p.b.env->stats.rx_read_requests, 1u);
  EXPECT_EQ(on.p.b.env->stats.duplicate_request, 1u);  // the resend, answered again from memory
}

// Once the round trip is measured (a few µs here), the timeout is `min`:
// a loss after 20 lossless WRITEs is resent after ~200 µs, not init's 1 ms.
TEST(AdaptiveRetrans, MeasuredRoundTripShortensTheWait) {
  Pair on(On(/*min_us=*/200, /*init_us=*/1000));
  uint64_t ns = 0;
  for (int i = 0; i < 20; ++i) ASSERT_EQ(on.Run(queue::WqeOp::kWrite, 200, &ns).status, queue::wc::kSuccess);
  ASSERT_TRUE(on.p.a.qp->rtt().has_sample());
  EXPECT_LT(on.p.a.qp->rtt().srtt_ns(), 20 * kUs);
  on.drop = DropRequests(1);
  EXPECT_EQ(on.Run(queue::WqeOp::kWrite, 200, &ns).status, queue::wc::kSuccess);
  EXPECT_EQ(on.a().roce_adp_retrans, 1u);
  EXPECT_GE(ns, 200 * kUs);
  EXPECT_LT(ns, 500 * kUs);
}

// A dead peer: the adaptive resends come at 1 and 3 ms (the next, 4 ms
// later, would pass the 4.19 ms timeout 10); from there on only the local
// ACK timeout acts, and with retry_cnt 2 the third one fails the WQE: the
// QP gives up when it would without adaptive retransmission, and every one
// of its timeouts is counted in roce_adp_retrans_to.
TEST(AdaptiveRetrans, DeadPeerFailsOnTheQpsOwnTimeout) {
  uint64_t took[2] = {};
  for (int adp = 0; adp < 2; ++adp) {
    Pair t(adp ? On() : AdaptiveRetrans{}, /*timeout=*/10, /*retry_cnt=*/2);
    t.drop = [](const wire::PacketView& v) { return IsRequest(v); };
    const queue::Cqe c = t.Run(queue::WqeOp::kWrite, 200, &took[adp]);
    EXPECT_EQ(c.status, queue::wc::kRetryExcErr);
    EXPECT_EQ(t.a().completer_retry_err, 3u);
    EXPECT_EQ(t.a().retry_exceeded_err, 1u);
    EXPECT_EQ(t.a().roce_adp_retrans, adp ? 2u : 0u);
    EXPECT_EQ(t.a().roce_adp_retrans_to, adp ? 3u : 0u);
  }
  EXPECT_GE(took[0], 3 * (4096ull << 10));
  EXPECT_NEAR(static_cast<double>(took[1]), static_cast<double>(took[0]), 300.0 * kUs);
}

// Timeout 0 ("wait forever"): the adaptive resends go on, their waits
// capped at 67 ms, and the QP never fails.
TEST(AdaptiveRetrans, WaitForeverKeepsResending) {
  Pair t(On(), /*timeout=*/0);
  t.drop = DropRequests(10);
  uint64_t ns = 0;
  EXPECT_EQ(t.Run(queue::WqeOp::kWrite, 200, &ns).status, queue::wc::kSuccess);
  EXPECT_EQ(t.a().roce_adp_retrans, 10u);
  EXPECT_EQ(t.a().completer_retry_err, 0u);
  // 1 + 2 + 4 + ... + 64 ms, then 67 ms each: 127 ms + 3 × 67.1 ms.
  EXPECT_GE(ns, 127 * kMs + 3 * (4096ull << 14));
  EXPECT_LT(ns, 127 * kMs + 3 * (4096ull << 14) + 2 * kMs);
}

// A round-trip timeout above the cap (min 1 s) with timeout 0: every wait
// is the 67 ms cap, however many resends (the doubling never overflows).
TEST(AdaptiveRetrans, WaitForeverWithALongMinimum) {
  Pair t(On(/*min_us=*/1'000'000, /*init_us=*/1'000'000), /*timeout=*/0);
  t.drop = DropRequests(3);
  uint64_t ns = 0;
  EXPECT_EQ(t.Run(queue::WqeOp::kWrite, 200, &ns).status, queue::wc::kSuccess);
  EXPECT_EQ(t.a().roce_adp_retrans, 3u);
  EXPECT_GE(ns, 3 * (4096ull << 14));
  EXPECT_LT(ns, 3 * (4096ull << 14) + 1 * kMs);
}

// With selective repeat active its own timeout resends, not this one.
TEST(AdaptiveRetrans, SelectiveRepeatKeepsItsOwnTimeout) {
  SimPair p(LinkFaults{}, 62);
  p.a.adp = On();
  p.a.sr.on = p.b.sr.on = true;
  ConnectOpts o;
  o.mtu = 1;
  ASSERT_EQ(0, p.Init(16, 64, 8192, o));
  int n = 0;
  // The first WRITE negotiates SR (its ACK carries the bit); the second's
  // only packet is lost once.
  p.net.tap = [&](const wire::PacketView& v) { return !(v.bth.opcode == wire::kRcWriteOnly && n++ == 1); };
  for (int i = 0; i < 2; ++i) p.a.PostOp(queue::WqeOp::kWrite, i, 0, 200, p.b.Addr(4096), p.b.key);
  queue::Cqe c[2];
  int got = 0;
  ASSERT_TRUE(p.net.Run([&] {
    got += p.a.scq_c->Poll(c + got, 2 - got);
    return got == 2;
  }));
  EXPECT_EQ(c[1].status, queue::wc::kSuccess);
  EXPECT_EQ(p.a.env->stats.roce_adp_retrans, 0u);
  EXPECT_EQ(p.a.env->stats.sr_timeouts, 1u);
}

// Off (the default): no timing, no counter moves, whatever the loss.
TEST(AdaptiveRetrans, OffByDefault) {
  EXPECT_FALSE(AdaptiveRetrans{}.on);
  Pair off({});
  uint64_t ns = 0;
  for (int i = 0; i < 5; ++i) ASSERT_EQ(off.Run(queue::WqeOp::kWrite, 200, &ns).status, queue::wc::kSuccess);
  EXPECT_FALSE(off.p.a.qp->rtt().has_sample());
  EXPECT_EQ(off.a().roce_adp_retrans + off.a().roce_adp_retrans_to, 0u);
}

}  // namespace
}  // namespace droce::test
