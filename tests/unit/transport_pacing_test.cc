// Packet pacing (transport/pacer.h, IBV_QP_RATE_LIMIT) in virtual time:
// the token bucket alone, then a paced RC QP whose departures are read off
// the simulated link.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "transport/pacer.h"
#include "transport/sim/two_qp.h"

namespace droce::transport {
namespace {

using sim::LinkFaults;
using sim::SimPair;
using sim::SimQp;

TEST(Pacer, OffUntilARateIsSet) {
  Pacer p;
  uint64_t ready = 0;
  EXPECT_FALSE(p.on());
  p.Set(1'000'000, 0, 1100, 0);  // 1 Gb/s
  EXPECT_TRUE(p.on());
  EXPECT_TRUE(p.Ready(0, &ready));
  p.Set(0, 0, 1100, 0);
  EXPECT_FALSE(p.on());
}

// 1,000-byte frames at 1 Gb/s with a burst of one frame leave every 8 µs,
// to the nanosecond.
TEST(Pacer, SpacesFramesAtTheRate) {
  Pacer p;
  p.Set(1'000'000, 1, 1100, 0);
  uint64_t now = 0, ready = 0;
  std::vector<uint64_t> sent;
  while (sent.size() < 100) {
    if (p.Ready(now, &ready)) {
      sent.push_back(now);
      p.Sent(1000);
    } else {
      ASSERT_GT(ready, now);
      now = ready;
    }
  }
  for (size_t i = 1; i < sent.size(); ++i) {
    EXPECT_NEAR(static_cast<double>(sent[i] - sent[i - 1]), 8000.0, 2.0) << i;
  }
}

// After an idle spell at most `burst` bytes leave back to back (at the
// same instant), then the rate holds again.
TEST(Pacer, BurstAfterIdleIsBounded) {
  Pacer p;
  const uint32_t frame = 1000, max_frame = 1100, burst = 10'000;
  p.Set(100'000, burst, max_frame, 0);  // 100 Mb/s
  uint64_t ready = 0, now = 10'000'000;  // idle for 10 ms: the bucket is full
  uint32_t at_once = 0;
  while (p.Ready(now, &ready)) {
    p.Sent(frame);
    at_once += frame;
  }
  EXPECT_LE(at_once, burst);
  EXPECT_GE(at_once, burst - max_frame);
  // The next one waits for the refill of what the burst overdrew.
  EXPECT_GT(ready, now);
}

// A paced sender served by a thread that is sometimes descheduled: it sends
// while Ready says so, then says it waits for the pacer (as PollSend does)
// and comes back at the time Ready gave, except that every `stall_every`
// passes it comes back `stall_ns` late. Returns the departure times.
std::vector<uint64_t> SendWithStalls(Pacer& p, uint32_t frame, size_t frames, size_t stall_every,
                                     uint64_t stall_ns, bool waiting = true) {
  std::vector<uint64_t> sent;
  uint64_t now = 0, ready = 0;
  size_t passes = 0;
  while (sent.size() < frames) {
    if (p.Ready(now, &ready)) {
      sent.push_back(now);
      p.Sent(frame);
      continue;
    }
    p.SetWaiting(waiting);
    EXPECT_GT(ready, now);
    now = ready + (++passes % stall_every == 0 ? stall_ns : 0);
  }
  return sent;
}

// 1 Gb/s with the default burst (6,250 B: 50 µs), stalled 2 ms every 1,000
// passes (about every 8 ms): without the reserve each stall would lose
// ~1.95 ms of sending for good (20 % of the rate); with it the long run is
// the rate.
TEST(Pacer, ALateWaitingQpCatchesUp) {
  Pacer p;
  p.Set(1'000'000, 0, 1100, 0);
  const std::vector<uint64_t> sent = SendWithStalls(p, 1000, 20'000, 1000, 2'000'000);
  // From the first departure to the last: 19,999 frames of 8 µs each, the
  // initial bucket (6,250 - 1,100 B) ahead.
  const double span = static_cast<double>(sent.back() - sent.front());
  const double ideal = 19'999 * 8000.0 - (6250 - 1100) * 8.0;
  EXPECT_NEAR(span / ideal, 1.0, 0.001);
}

// The catch-up is paid at most at twice the rate and never as a burst:
// after each stall, the frames from any departure to any later one are at
// most the burst plus what twice the rate allows in between (at the rate
// alone when there is no reserve: BurstAfterIdleIsBounded).
TEST(Pacer, CatchUpIsAtMostTwiceTheRate) {
  Pacer p;
  const uint32_t frame = 1000, max_frame = 1100, burst = 4000;
  p.Set(1'000'000, burst, max_frame, 0);
  const std::vector<uint64_t> sent = SendWithStalls(p, frame, 10000, 1000, 1'000'000);
  bool caught_up_fast = false;
  for (size_t i = 0; i < sent.size(); ++i) {
    for (size_t j = i + 1; j < std::min(sent.size(), i + 64); ++j) {
      const double bytes = static_cast<double>((j - i + 1) * frame);
      const double span_ns = static_cast<double>(sent[j] - sent[i]);
      ASSERT_LE(bytes, burst + 2 * span_ns / 8.0 + 1) << i << ".." << j;  // 1 Gb/s: a byte per 8 ns
      if (span_ns > 0 && bytes > burst + span_ns / 8.0 + frame) caught_up_fast = true;
    }
  }
  EXPECT_TRUE(caught_up_fast);  // faster than the rate somewhere: the reserve was used
  const double span = static_cast<double>(sent.back() - sent.front());
  EXPECT_NEAR(span / (9999 * 8000.0 - (burst - max_frame) * 8.0), 1.0, 0.002);
}

// A QP that stopped for anything but the pacer (nothing to send, its
// window full) earns no reserve: after an idle spell it gets its burst, then
// the rate, as before.
TEST(Pacer, AnIdleQpEarnsNoReserve) {
  Pacer p;
  const uint32_t frame = 1000, burst = 10'000;
  p.Set(100'000, burst, 1100, 0);  // 100 Mb/s: 80 µs a frame
  uint64_t ready = 0;
  while (p.Ready(0, &ready)) p.Sent(frame);
  p.SetWaiting(false);  // e.g. its window filled
  uint64_t now = 20'000'000;
  EXPECT_TRUE(p.Ready(now, &ready));
  EXPECT_EQ(p.reserve_bytes(), 0.0);
  uint32_t at_once = 0;
  while (p.Ready(now, &ready)) {
    p.Sent(frame);
    at_once += frame;
  }
  EXPECT_LE(at_once, burst);
  EXPECT_NEAR(static_cast<double>(ready - now), (at_once - (burst - 1100)) * 80.0, 2.0);
}

// A new rate (congestion control's) drops what the old one had in reserve.
TEST(Pacer, ARateChangeDropsTheReserve) {
  Pacer p;
  p.Set(1'000'000, 0, 1100, 0);
  (void)SendWithStalls(p, 1000, 100, 50, 3'000'000);
  uint64_t ready = 0;
  const uint64_t late = 10'000'000;
  p.SetWaiting(true);
  (void)p.Ready(late, &ready);
  EXPECT_GT(p.reserve_bytes(), 0.0);
  p.SetRate(500'000, late);
  EXPECT_EQ(p.reserve_bytes(), 0.0);
}

// A QP paced at RATE sends its WRITE packets exactly spaced by their frame
// sizes at that rate, over the whole transfer: the long-run rate within
// 0.1 % and every gap within a nanosecond or two of frame * 8 / rate.
void PacedTransfer(uint32_t kbps, uint32_t len, uint8_t mtu, uint32_t burst = 1) {
  SimPair p(LinkFaults{}, 7);
  ASSERT_EQ(0, p.Init(64, 256, len + 64, {.mtu = mtu}));
  SimQp &a = p.a, &b = p.b;
  QpAttr r;
  r.state = QpState::kRts;
  r.rate_limit = kbps;
  r.max_burst_sz = burst;
  ASSERT_EQ(0, a.Modify(r, kAttrState | kAttrRateLimit));
  EXPECT_EQ(a.qp->attr().rate_limit, kbps);
  // a's requests as they leave.
  std::vector<std::pair<uint64_t, uint32_t>> seen;  // (ns, frame bytes)
  p.net.link.on_send = [&](std::span<const uint8_t> f) {
    wire::PacketView v;
    if (wire::parse_frame(f, &v) == wire::ParseError::kOk && v.bth.dqpn == b.qp->qpn()) {
      seen.emplace_back(p.net.link.clock, static_cast<uint32_t>(f.size()));
    }
  };
  const int kWrites = 4;
  for (int i = 0; i < kWrites; ++i) a.PostOp(queue::WqeOp::kWrite, i, 0, len, b.Addr(0), b.key);
  std::vector<queue::Cqe> c(16);
  int done = 0;
  ASSERT_TRUE(p.net.Run([&] {
    const int n = a.scq_c->Poll(c.data(), 16);
    for (int i = 0; i < n; ++i) EXPECT_EQ(c[i].status, queue::wc::kSuccess);
    done += n;
    return done == kWrites;
  }));
  ASSERT_GT(seen.size(), 10u);
  const double ns_per_byte = 8e6 / kbps;
  // The token bucket's envelope: over any stretch of packets i..j, no more
  // than the burst plus what the rate allows in between (the burst is at
  // least one frame).
  const uint64_t allowed = std::max<uint64_t>(burst != 0 ? burst : Pacer::DefaultBurst(kbps, mtu_bytes(mtu) + 128),
                                              mtu_bytes(mtu) + 128);
  for (size_t i = 0; i < seen.size(); ++i) {
    uint64_t bytes = 0;
    for (size_t j = i; j < seen.size(); ++j) {
      bytes += seen[j].second;
      const double budget = allowed + static_cast<double>(seen[j].first - seen[i].first) / ns_per_byte + 1;
      ASSERT_LE(static_cast<double>(bytes), budget) << "packets " << i << ".." << j;
    }
  }
  // Steady state once the first burst has left: each gap the previous
  // frame's time at the rate (a burst of one frame: from the first packet).
  size_t first = 0;
  while (first + 1 < seen.size() &&
         static_cast<double>(seen[first + 1].first - seen[first].first) < 0.99 * seen[first].second * ns_per_byte) {
    ++first;
  }
  if (burst == 1) {
    EXPECT_EQ(first, 0u);
  }
  uint64_t bytes = 0;
  for (size_t i = first + 1; i < seen.size(); ++i) {
    const double want = seen[i - 1].second * ns_per_byte;
    EXPECT_NEAR(static_cast<double>(seen[i].first - seen[i - 1].first), want, 2.0) << "packet " << i;
    bytes += seen[i - 1].second;
  }
  const double rate_kbps = bytes * 8e6 / static_cast<double>(seen.back().first - seen[first].first);
  EXPECT_NEAR(rate_kbps / kbps, 1.0, 0.001);
  EXPECT_EQ(a.env->stats.completer_retry_err, 0u) << "a paced transfer timed out";
}

TEST(TransportPacing, TenMegabitsMtu1024) { PacedTransfer(10'000, 64 * 1024, 3); }
// 64 KiB takes 140 ms at 4 Mb/s, longer than the ACK timeout (14: 67 ms):
// the paced requester asks for ACKs often enough that nothing times out.
TEST(TransportPacing, SlowerThanTheAckTimeout) {
  PacedTransfer(4'000, 256 * 1024, 3);
}
TEST(TransportPacing, OneGigabitMtu4096) { PacedTransfer(1'000'000, 256 * 1024, 5); }
TEST(TransportPacing, TenGigabitsMtu1024) { PacedTransfer(10'000'000, 256 * 1024, 3); }
// The default burst (max_burst_sz 0) and a larger one given.
TEST(TransportPacing, DefaultBurst) { PacedTransfer(1'000'000, 256 * 1024, 3, 0); }
TEST(TransportPacing, GivenBurst) { PacedTransfer(1'000'000, 256 * 1024, 3, 16 * 1024); }

// The attribute is taken only where the kernel takes it (RTR to RTS, RTS to
// RTS), within the announced maximum; rate 0 turns pacing off.
TEST(TransportPacing, ModifyRules) {
  SimPair p(LinkFaults{}, 3);
  ASSERT_EQ(0, p.Init(16, 64, 4096));
  QpAttr r;
  r.state = QpState::kRts;
  r.rate_limit = kMaxRateLimitKbps + 1;
  EXPECT_EQ(EINVAL, p.a.Modify(r, kAttrState | kAttrRateLimit));
  r.rate_limit = 5000;
  EXPECT_EQ(0, p.a.Modify(r, kAttrState | kAttrRateLimit));
  r.rate_limit = 0;
  EXPECT_EQ(0, p.a.Modify(r, kAttrState | kAttrRateLimit));
  EXPECT_EQ(p.a.qp->attr().rate_limit, 0u);
  r.state = QpState::kSqd;
  EXPECT_EQ(EINVAL, p.a.Modify(r, kAttrState | kAttrRateLimit));  // not RTS to SQD
}

// DROCE_RATE: QpInit's rate paces a QP from its creation, and again after
// a reset.
TEST(TransportPacing, DefaultRateFromInit) {
  SimPair p(LinkFaults{}, 5);
  p.a.rate_kbps = 20'000;
  ASSERT_EQ(0, p.Init(16, 64, 4096));
  EXPECT_EQ(p.a.qp->attr().rate_limit, 20'000u);
  QpAttr r;
  r.state = QpState::kReset;
  ASSERT_EQ(0, p.a.Modify(r, kAttrState));
  EXPECT_EQ(p.a.qp->attr().rate_limit, 20'000u);
}

}  // namespace
}  // namespace droce::transport
