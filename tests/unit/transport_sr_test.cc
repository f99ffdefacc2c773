// Selective repeat in virtual time: 64 KiB RDMA WRITEs
// through a 25 Gb/s link with a 5 µs propagation delay each way, requests
// lost by a seeded model (random 1 %, Gilbert-Elliott), every byte checked.
// Go-back-N resends everything after each loss; selective repeat resends
// only what was lost (retransmitted/lost ≤ 1.1) and keeps the link busy
// (goodput ≥ 3× go-back-N's). Then the negotiation: with one end off, both
// ends speak plain go-back-N RoCEv2, and the bit never leaves a QP that has
// selective repeat off.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cc/switch.h"
#include "lab/fault_rules.h"
#include "lab/models.h"
#include "transport/sim/two_qp.h"
#include "wire/bytes.h"
#include "wire/frame.h"

namespace droce::test {
namespace {

using transport::sim::LinkFaults;
using transport::sim::SimPair;
using transport::sim::SimQp;

constexpr uint32_t kMsg = 64 * 1024;

struct Options {
  bool sr_a = true, sr_b = true;  // selective repeat at the requester / responder
  std::string loss = "loss random 1%";  // netem's words (lab/fault_rules.h), requests only
  uint32_t writes = 512;
  uint32_t outstanding = 16;
  uint64_t seed = 1;
  uint8_t mtu = 3;  // 1024
  uint64_t delay_ns = 5000;  // propagation, each way
  uint32_t rto_us = 0;       // selective repeat's timeout: 0 adaptive (the default)
  // The path misbehaves: at random, 5 ms stretches with 10x the
  // propagation delay, and the responder stopping for 1-20 ms (nothing it
  // receives or sends moves until it runs again).
  bool jitter = false;
  // The responder stops once, stop_ns long, stop_at_ns into the run.
  uint64_t stop_at_ns = 0, stop_ns = 0;
};

struct Result {
  uint64_t lost = 0;           // request frames the model dropped
  uint64_t retransmitted = 0;  // the requester's retransmitted_pkts
  double goodput_gbps = 0;     // WRITE payload over the virtual time it took
  uint64_t sacks = 0, held = 0, rtos = 0, seq_naks = 0, cuts = 0, timeouts = 0;
  // Needless resends: as the requester counts them from the responder's
  // marks (sr_spurious_resends), and the duplicates the responder received.
  uint64_t spurious = 0, dups = 0;
  // The requester's retransmission timer at the end (`droce ctl res show qp`).
  transport::Qp::RetransTimer timer = transport::Qp::RetransTimer::kNone;
  uint64_t rto_ns = 0;
  uint64_t sr_bit_requests = 0, sr_bit_responses = 0;  // frames sent with wire::Bth::sr
  bool bytes_ok = false;
};

Result RunWrites(const Options& o) {
  Result r;
  SimPair p(LinkFaults{}, o.seed);
  p.a.sr.on = o.sr_a;
  p.b.sr.on = o.sr_b;
  p.a.sr.rto_us = p.b.sr.rto_us = o.rto_us;
  transport::sim::ConnectOpts c;
  c.mtu = o.mtu;
  c.timeout = 14;  // as perftest: 67 ms, which go-back-N never needs here
  c.max_rd_atomic = c.max_dest_rd_atomic = 16;
  const size_t src_len = size_t{o.outstanding} * kMsg;
  if (p.Init(64, 256, size_t{o.writes} * kMsg, c) != 0) {
    ADD_FAILURE() << "connect";
    return r;
  }
  std::mt19937_64 rng(o.seed);
  for (size_t i = 0; i < src_len; i += 8) {
    const uint64_t v = rng();
    std::memcpy(&p.a.buf[i], &v, 8);
  }
  auto rules = lab::ParseFaultRules(o.loss);
  if (!rules.ok() || rules->size() != 1) {
    ADD_FAILURE() << o.loss << ": " << rules.status();
    return r;
  }
  lab::LossModel model((*rules)[0]);
  lab::Rng loss_rng(o.seed * 7 + 3);
  cc::PortParams port;
  port.rate_bps = 25'000'000'000;
  port.delay_ns = o.delay_ns;
  port.buffer_bytes = 64u << 20;
  port.ecn = false;
  cc::EgressPort to_b(port, 1), to_a(port, 2);
  std::mt19937_64 weather(o.seed * 31 + 5);
  uint64_t slow_until = 0, stop_from = 0, stop_until = 0, next_slow = 0, next_stop = 0;
  uint64_t last_to_a = 0, last_to_b = 0;
  const uint64_t t0_shaper = p.net.link.clock;
  p.net.link.shaper = [&](uint8_t* d, uint32_t len, uint64_t now, uint64_t* due) {
    wire::PacketView v;
    if (wire::parse_frame(std::span<const uint8_t>(d, len), &v) != wire::ParseError::kOk) return true;
    const bool request = v.info->mask & wire::kMaskRequest;
    if (v.bth.sr) ++(request ? r.sr_bit_requests : r.sr_bit_responses);
    if (request && model.Lost(loss_rng)) {
      ++r.lost;
      return false;
    }
    *due = (v.bth.dqpn == p.b.qp->qpn() ? to_b : to_a).Enqueue(len, false, now).arrive_ns;
    if (o.stop_ns != 0 && stop_until == 0 && now >= t0_shaper + o.stop_at_ns) {
      stop_from = now;
      stop_until = now + o.stop_ns;
    }
    if (o.stop_ns != 0 && *due >= stop_from && *due < stop_until) *due = stop_until;
    if (o.jitter) {
      // Every 10 ms on average a 5 ms stretch at 10x the delay; every 25 ms
      // on average the responder stops for 1-20 ms.
      if (next_slow == 0) next_slow = now + weather() % 20'000'000, next_stop = now + weather() % 40'000'000;
      if (now >= next_slow) slow_until = now + 5'000'000, next_slow = now + 5'000'000 + weather() % 10'000'000;
      if (now >= next_stop) {
        stop_from = now;
        stop_until = now + 1'000'000 + weather() % 19'000'000;
        next_stop = stop_until + weather() % 30'000'000;
      }
      if (now < slow_until) *due += 9 * o.delay_ns;
      if (*due >= stop_from && *due < stop_until) *due = stop_until;
      // The path keeps order, as a queue does (selective repeat counts on
      // it to tell a lost resend).
      uint64_t& last = v.bth.dqpn == p.b.qp->qpn() ? last_to_b : last_to_a;
      *due = std::max(*due, last);
      last = *due;
    }
    return true;
  };
  const uint64_t t0 = p.net.link.clock;
  uint32_t posted = 0, done = 0;
  std::vector<queue::Cqe> cqes(64);
  const bool finished = p.net.Run(
      [&] {
        for (int k; (k = p.a.scq_c->Poll(cqes.data(), 64)) > 0;) {
          for (int i = 0; i < k; ++i) {
            EXPECT_EQ(cqes[i].status, queue::wc::kSuccess) << cqes[i].wr_id;
            ++done;
          }
        }
        while (posted < o.writes && posted - done < o.outstanding) {
          const uint32_t src = (posted % o.outstanding) * kMsg;
          p.a.PostOp(queue::WqeOp::kWrite, posted, src, kMsg, p.b.Addr(size_t{posted} * kMsg), p.b.key);
          ++posted;
        }
        return done == o.writes;
      },
      t0 + 10'000'000'000ull);
  EXPECT_TRUE(finished) << "WRITEs done: " << done << " of " << o.writes;
  const uint64_t elapsed = p.net.link.clock - t0;
  r.goodput_gbps = static_cast<double>(o.writes) * kMsg * 8 / static_cast<double>(elapsed);
  r.bytes_ok = true;
  for (uint32_t i = 0; i < o.writes && r.bytes_ok; ++i) {
    r.bytes_ok = std::memcmp(&p.b.buf[size_t{i} * kMsg], &p.a.buf[(i % o.outstanding) * kMsg], kMsg) == 0;
  }
  const Counters& sa = p.a.env->stats;
  const Counters& sb = p.b.env->stats;
  r.retransmitted = sa.retransmitted_pkts;
  r.sacks = sa.sr_sack_rcvd;
  r.held = sb.sr_held_pkts;
  r.rtos = sa.sr_timeouts;
  r.seq_naks = sa.rcvd_seq_err;
  r.cuts = sa.gbn_window_cuts;
  r.timeouts = sa.completer_retry_err;
  r.spurious = sa.sr_spurious_resends;
  r.dups = sb.duplicate_request;
  r.timer = p.a.qp->retrans_timer();
  r.rto_ns = p.a.qp->RetransTimeoutNs();
  EXPECT_EQ(sa.retry_exceeded_err, 0u);
  return r;
}

void Print(const char* what, const Result& r) {
  std::printf("  %-28s lost %5llu retransmitted %6llu (%.2f per loss) goodput %6.2f Gb/s "
              "SACKs %llu held %llu RTOs %llu spurious %llu NAKs %llu window cuts %llu timeouts %llu\n",
              what, static_cast<unsigned long long>(r.lost), static_cast<unsigned long long>(r.retransmitted),
              r.lost ? static_cast<double>(r.retransmitted) / static_cast<double>(r.lost) : 0.0, r.goodput_gbps,
              static_cast<unsigned long long>(r.sacks), static_cast<unsigned long long>(r.held),
              static_cast<unsigned long long>(r.rtos), static_cast<unsigned long long>(r.spurious),
              static_cast<unsigned long long>(r.seq_naks),
              static_cast<unsigned long long>(r.cuts), static_cast<unsigned long long>(r.timeouts));
}

// The checks for one loss model: retransmitted/lost ≤ 1.1 with
// selective repeat (go-back-N far above), goodput a multiple of go-back-N's,
// every byte in place with both.
void Compare(const std::string& loss, double min_goodput_ratio) {
  Options o;
  o.loss = loss;
  const Result sr = RunWrites(o);
  o.sr_a = o.sr_b = false;
  const Result gbn = RunWrites(o);
  Print(("selective repeat, " + loss).c_str(), sr);
  Print(("go-back-N, " + loss).c_str(), gbn);
  std::printf("  goodput ratio %.2f\n", sr.goodput_gbps / gbn.goodput_gbps);
  EXPECT_TRUE(sr.bytes_ok);
  EXPECT_TRUE(gbn.bytes_ok);
  ASSERT_GT(sr.lost, 100u);
  ASSERT_GT(gbn.lost, 100u);
  EXPECT_LE(static_cast<double>(sr.retransmitted), 1.1 * static_cast<double>(sr.lost));
  EXPECT_GT(static_cast<double>(gbn.retransmitted), 5.0 * static_cast<double>(gbn.lost));
  EXPECT_GE(sr.goodput_gbps, min_goodput_ratio * gbn.goodput_gbps);
  EXPECT_EQ(sr.seq_naks, 0u);  // no go-back-N fallback
  EXPECT_GT(sr.sacks, 0u);
}

// Go-back-N's window (transport/qp.h). Each loss costs go-back-N what it
// had in flight after it; on a path whose round trip holds far more than a
// loss-free stretch (here 1 ms each way, as slow as a TCG guest's rxe
// answers) a fixed 512-packet window resent 7.8 packets for each one
// delivered (31,928 for 4,096 in this run) and against Linux rxe ~284 per
// NAK. The window that halves on a loss resends 1.7 per delivered here.
TEST(GoBackNWindow, LongLossyPathResendsLittle) {
  Options o;
  o.sr_a = o.sr_b = false;
  o.loss = "loss random 2%";
  o.delay_ns = 1'000'000;
  o.writes = 64;
  const Result r = RunWrites(o);
  Print("go-back-N, 2 %, 1 ms each way", r);
  EXPECT_TRUE(r.bytes_ok);
  ASSERT_GT(r.lost, 40u);
  EXPECT_GT(r.cuts, 0u);
  EXPECT_LE(r.cuts, r.seq_naks + r.timeouts);
  const uint64_t delivered = uint64_t{o.writes} * (kMsg / 1024);
  EXPECT_LE(static_cast<double>(r.retransmitted), 3.0 * static_cast<double>(delivered));
}

// A responder that stops for longer than the local ACK timeout (67 ms)
// with a full window in flight: the requester times out, cuts its window to
// 64 and resends that much; the responder, running again, acknowledges the
// whole first transmission, beyond what was resent. The requester moves on
// to that PSN (Qp::SkipAckedTo) instead of ignoring the ACK and resending
// until retry exceeded (stall_memif's failure before the fix).
TEST(GoBackNWindow, PeerStoppedLongerThanTheTimeout) {
  Options o;
  o.sr_a = o.sr_b = false;
  o.loss = "loss random 0%";
  o.writes = 64;
  o.stop_at_ns = 200'000;
  o.stop_ns = 150'000'000;
  const Result r = RunWrites(o);
  Print("go-back-N, responder stopped 150 ms", r);
  EXPECT_TRUE(r.bytes_ok);
  EXPECT_GE(r.timeouts, 1u);
  EXPECT_LE(r.timeouts, 3u);
  EXPECT_GE(r.cuts, 1u);
}

// Without loss the window is never cut and nothing is resent.
TEST(GoBackNWindow, NoLossNoCut) {
  Options o;
  o.sr_a = o.sr_b = false;
  o.loss = "loss random 0%";
  o.writes = 64;
  const Result r = RunWrites(o);
  EXPECT_TRUE(r.bytes_ok);
  EXPECT_EQ(r.cuts, 0u);
  EXPECT_EQ(r.retransmitted, 0u);
}

// Selective repeat's retransmission timeout on a path that misbehaves
// (Options::jitter): the fixed 320 µs of before times out whenever the
// responder stops or the delay jumps, and each timeout resends a packet the
// responder has or will have; the timeout that follows the measured round
// trip, backed off while nothing is acknowledged, keeps resends to about
// one per loss.
TEST(SelectiveRepeat, AdaptiveTimeoutOnAMisbehavingPath) {
  Options o;
  o.loss = "loss random 1%";
  o.jitter = true;
  o.writes = 2048;
  o.rto_us = 320;
  const Result fixed = RunWrites(o);
  o.rto_us = 0;
  const Result adaptive = RunWrites(o);
  Print("fixed 320 us, misbehaving", fixed);
  Print("adaptive, misbehaving", adaptive);
  EXPECT_TRUE(fixed.bytes_ok);
  EXPECT_TRUE(adaptive.bytes_ok);
  ASSERT_GT(adaptive.lost, 100u);
  EXPECT_LE(static_cast<double>(adaptive.retransmitted), 1.1 * static_cast<double>(adaptive.lost));
  EXPECT_LT(adaptive.rtos, fixed.rtos);
  EXPECT_LT(static_cast<double>(adaptive.retransmitted) / static_cast<double>(adaptive.lost),
            static_cast<double>(fixed.retransmitted) / static_cast<double>(fixed.lost));
  // The needless resends, as the responder's ACKs report them: every
  // duplicate it received, and fewer with the adaptive timeout.
  EXPECT_EQ(fixed.spurious, fixed.dups);
  EXPECT_EQ(adaptive.spurious, adaptive.dups);
  EXPECT_GT(fixed.spurious, 0u);
  EXPECT_LT(adaptive.spurious, fixed.spurious);
}

// A responder that stops for 2 ms with nothing lost: every resend of the
// fixed 320 µs timeout was needless, and the requester counts each one from
// the marks on the responder's ACKs (wire::Bth::sr_run on an ACK).
TEST(SelectiveRepeat, NeedlessResendsAreCounted) {
  Options o;
  o.loss = "loss random 0%";
  o.writes = 64;
  o.rto_us = 320;
  o.stop_at_ns = 200'000;
  o.stop_ns = 2'000'000;
  const Result r = RunWrites(o);
  Print("fixed 320 us, stopped 2 ms", r);
  EXPECT_TRUE(r.bytes_ok);
  EXPECT_EQ(r.lost, 0u);
  ASSERT_GT(r.retransmitted, 0u);
  EXPECT_EQ(r.spurious, r.retransmitted);
  EXPECT_EQ(r.dups, r.retransmitted);
}

// The goodput check of the issue is at 1 % random loss: at least 3×.
TEST(SelectiveRepeat, RandomLoss1Percent) { Compare("loss random 1%", 3.0); }

// netem's Gilbert-Elliott: bursts (p = 0.5 % into Bad, r = 30 % back out,
// 50 % loss in Bad, none in Good): 0.82 % loss on average, several in a row.
// Bursts cost go-back-N one rewind each, so it does better than at random
// loss; the issue asks for the retransmission ratio here. Since go-back-N's
// window halves on a loss (transport/qp.h) it no longer waits for the local
// ACK timeout in this run and comes within 1.3x of selective repeat's
// goodput (19.1 against 23.3 Gb/s; 8.4 before, with a fixed 512): selective
// repeat must be no slower, and resend 1 packet per loss against ~27.
TEST(SelectiveRepeat, GilbertElliottLoss) { Compare("loss gemodel 0.5% 30% 50% 0%", 1.0); }

// No loss: nothing is resent, nothing held, and selective repeat costs no
// goodput.
TEST(SelectiveRepeat, NoLossNoResend) {
  Options o;
  o.loss = "loss random 0%";
  const Result sr = RunWrites(o);
  o.sr_a = o.sr_b = false;
  const Result gbn = RunWrites(o);
  Print("selective repeat, no loss", sr);
  Print("go-back-N, no loss", gbn);
  EXPECT_TRUE(sr.bytes_ok);
  EXPECT_EQ(sr.retransmitted, 0u);
  EXPECT_EQ(sr.held, 0u);
  EXPECT_EQ(sr.rtos, 0u);
  EXPECT_EQ(sr.spurious, 0u);
  EXPECT_GE(sr.goodput_gbps, 0.99 * gbn.goodput_gbps);
  // What `droce ctl res show qp` reports: selective repeat's timer, at its
  // floor on this steady 10 µs path; go-back-N's is the local ACK timeout.
  EXPECT_EQ(sr.timer, transport::Qp::RetransTimer::kSelectiveRepeat);
  EXPECT_EQ(sr.rto_ns, 320'000u);
  EXPECT_EQ(gbn.timer, transport::Qp::RetransTimer::kLocalAck);
  EXPECT_EQ(gbn.rto_ns, uint64_t{4096} << 14);
}

// A responder without selective repeat (an RNIC, rxe, droce with it off)
// ignores the bit: it NAKs gaps and the requester goes back N; its answers
// never carry the bit, so the requester never holds back to its window or
// expects SACKs.
TEST(SelectiveRepeat, PeerWithoutItGetsGoBackN) {
  Options o;
  o.sr_b = false;
  o.writes = 128;
  const Result r = RunWrites(o);
  Print("requester only", r);
  EXPECT_TRUE(r.bytes_ok);
  EXPECT_GT(r.sr_bit_requests, 0u);
  EXPECT_EQ(r.sr_bit_responses, 0u);
  EXPECT_EQ(r.sacks, 0u);
  EXPECT_EQ(r.held, 0u);
  EXPECT_EQ(r.rtos, 0u);
  EXPECT_EQ(r.spurious, 0u);
  EXPECT_EQ(r.timer, transport::Qp::RetransTimer::kLocalAck);  // the peer has no selective repeat
  EXPECT_GT(r.seq_naks, 0u);
}

// A requester without it sends no bit; a responder with it answers as any
// RoCE responder: NAKs, no holding, no bit on the wire at all.
TEST(SelectiveRepeat, RequesterWithoutItGetsGoBackN) {
  Options o;
  o.sr_a = false;
  o.writes = 128;
  const Result r = RunWrites(o);
  Print("responder only", r);
  EXPECT_TRUE(r.bytes_ok);
  EXPECT_EQ(r.sr_bit_requests, 0u);
  EXPECT_EQ(r.sr_bit_responses, 0u);
  EXPECT_EQ(r.held, 0u);
  EXPECT_GT(r.seq_naks, 0u);
}

// Exact counts, on the plain simulated link (1 µs, in order): one 8-packet
// WRITE (MTU 1024) with chosen request PSNs dropped, `drops` times each.
struct Exact {
  uint64_t resent, held, sacks_sent, sacks_rcvd, rtos, naks, cuts;
};
Exact DropAndCount(bool sr, std::vector<uint32_t> pkt_index, int drops) {
  SimPair p(LinkFaults{}, 7);
  p.a.sr.on = p.b.sr.on = sr;
  transport::sim::ConnectOpts c;
  c.psn = 100;
  EXPECT_EQ(p.Init(16, 64, 64 * 1024, c), 0);
  std::vector<int> left(pkt_index.size(), drops);
  p.net.tap = [&](const wire::PacketView& v) {
    if (!(v.info->mask & wire::kMaskRequest)) return true;
    for (size_t i = 0; i < pkt_index.size(); ++i) {
      if (v.bth.psn == 100 + pkt_index[i] && left[i] > 0) {
        --left[i];
        return false;
      }
    }
    return true;
  };
  for (size_t i = 0; i < 8 * 1024; ++i) p.a.buf[i] = static_cast<uint8_t>(i * 7 + 1);
  p.a.PostOp(queue::WqeOp::kWrite, 1, 0, 8 * 1024, p.b.Addr(16 * 1024), p.b.key);
  std::vector<queue::Cqe> cqe(4);
  EXPECT_TRUE(p.net.Run([&] { return p.a.scq_c->Poll(cqe.data(), 4) == 1; }));
  EXPECT_EQ(cqe[0].status, queue::wc::kSuccess);
  EXPECT_EQ(std::memcmp(&p.b.buf[16 * 1024], &p.a.buf[0], 8 * 1024), 0);
  const Counters& a = p.a.env->stats;
  const Counters& b = p.b.env->stats;
  return {a.retransmitted_pkts, b.sr_held_pkts, b.sr_sack_sent, a.sr_sack_rcvd, a.sr_timeouts, a.rcvd_seq_err,
          a.gbn_window_cuts};
}

// Packet 2 lost once: packets 3-7 held, one SACK (they arrive in one burst,
// so it grows to cover all five), packet 2 resent once.
TEST(SelectiveRepeat, OneLossExactCounts) {
  const Exact e = DropAndCount(true, {2}, 1);
  EXPECT_EQ(e.resent, 1u);
  EXPECT_EQ(e.held, 5u);
  EXPECT_EQ(e.sacks_sent, 1u);
  EXPECT_EQ(e.sacks_rcvd, 1u);
  EXPECT_EQ(e.rtos, 0u);
  EXPECT_EQ(e.naks, 0u);
  EXPECT_EQ(e.cuts, 0u) << "selective repeat's window is the responder's buffer, never cut";
}

// Go-back-N for the same loss: a NAK, and packets 2-7 go again.
TEST(SelectiveRepeat, GoBackNExactCounts) {
  const Exact e = DropAndCount(false, {2}, 1);
  EXPECT_EQ(e.resent, 6u);
  EXPECT_EQ(e.held, 0u);
  EXPECT_EQ(e.sacks_sent + e.sacks_rcvd + e.rtos, 0u);
  EXPECT_EQ(e.naks, 1u);
  EXPECT_EQ(e.cuts, 1u) << "the NAK cut go-back-N's window once";
}

// The resend of packet 2 lost as well: nothing sent after it can tell, so
// the retransmission timeout resends it (once), not the local ACK timeout.
TEST(SelectiveRepeat, LostResendTimesOut) {
  const Exact e = DropAndCount(true, {2}, 2);
  EXPECT_EQ(e.resent, 2u);
  EXPECT_EQ(e.held, 5u);
  EXPECT_EQ(e.rtos, 1u);
  EXPECT_EQ(e.naks, 0u);
}

// The last packet lost: no later packet makes a SACK. The responder
// acknowledged only the first packet (its announcement; the others asked
// for no ACK), so the first timeout resends packet 1, whose duplicate's
// ACK moves the cumulative acknowledgement to 7, and the second resends 7.
TEST(SelectiveRepeat, TailLossTimesOut) {
  const Exact e = DropAndCount(true, {7}, 1);
  EXPECT_EQ(e.resent, 2u);
  EXPECT_EQ(e.held, 0u);
  EXPECT_EQ(e.sacks_sent, 0u);
  EXPECT_EQ(e.rtos, 2u);
  EXPECT_EQ(e.naks, 0u);
}

// A window smaller than a message: the requester asks for an ACK twice per
// window, so a 64-packet WRITE through a 16-packet window never waits for
// the retransmission timeout (it asked only every 64 packets before).
TEST(SelectiveRepeat, SmallWindowNeverStalls) {
  SimPair p(LinkFaults{}, 3);
  p.a.sr.on = p.b.sr.on = true;
  p.a.sr.window = p.b.sr.window = 16;
  ASSERT_EQ(p.Init(16, 64, 256 * 1024), 0);
  for (int i = 0; i < 4; ++i) p.a.PostOp(queue::WqeOp::kWrite, i, 0, 64 * 1024, p.b.Addr(64 * 1024), p.b.key);
  std::vector<queue::Cqe> cqe(8);
  int done = 0;
  ASSERT_TRUE(p.net.Run([&] {
    done += p.a.scq_c->Poll(cqe.data(), 8);
    return done == 4;
  }));
  EXPECT_EQ(p.a.env->stats.sr_timeouts, 0u);
  EXPECT_EQ(p.a.env->stats.retransmitted_pkts, 0u);
  EXPECT_EQ(p.a.env->stats.completer_retry_err, 0u);
}

// Two holes (packets 1 and 4): both resent once, the others held.
TEST(SelectiveRepeat, TwoHolesExactCounts) {
  const Exact e = DropAndCount(true, {1, 4}, 1);
  EXPECT_EQ(e.resent, 2u);
  EXPECT_EQ(e.held, 5u);  // 2, 3, 5, 6, 7
  EXPECT_EQ(e.rtos, 0u);
  EXPECT_EQ(e.naks, 0u);
}

}  // namespace
}  // namespace droce::test
