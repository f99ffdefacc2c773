// The lab's fault rules (src/lab/): the parser and its refusals, the loss
// models against their stationary loss over 10^6 packets, seeds, filters,
// scripted drops, delay distributions, rate, reorder, the hold queue and
// the RoCE peek. Virtual time, seeded generators, no DPDK.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "lab/fault_engine.h"
#include "lab/fault_rules.h"
#include "lab/hold_queue.h"
#include "lab/models.h"
#include "lab/roce_peek.h"

namespace droce::lab {
namespace {

constexpr int kPackets = 1'000'000;

std::vector<FaultRule> Rules(const std::string& text) {
  auto r = ParseFaultRules(text);
  EXPECT_TRUE(r.ok()) << text << ": " << r.status();
  return r.ok() ? *r : std::vector<FaultRule>{};
}

std::string Refusal(const std::string& text) {
  auto r = ParseFaultRules(text);
  EXPECT_FALSE(r.ok()) << text;
  return r.ok() ? std::string() : std::string(r.status().message());
}

PacketInfo Packet(uint32_t psn, uint64_t now_ns = 0, uint32_t qpn = 17, uint8_t opcode = 0x04, Direction dir = kTx) {
  PacketInfo p;
  p.dir = dir;
  p.qpn = qpn;
  p.opcode = opcode;
  p.psn = psn & 0xFFFFFF;
  p.len = 1100;
  p.now_ns = now_ns;
  return p;
}

// The fraction of kPackets packets one rule drops.
double MeasuredLoss(const std::string& text) {
  FaultEngine e(Rules(text));
  uint64_t lost = 0;
  for (int i = 0; i < kPackets; ++i) lost += e.Decide(Packet(static_cast<uint32_t>(i), uint64_t(i) * 1000)).drop;
  EXPECT_EQ(e.counters(0).matched, static_cast<uint64_t>(kPackets));
  EXPECT_EQ(e.counters(0).dropped, lost);
  return static_cast<double>(lost) / kPackets;
}

double Stationary(const std::string& text) {
  const std::vector<FaultRule> r = Rules(text);
  return LossModel(r.at(0)).Stationary();
}

// ±5 % of the stationary value.
void ExpectLossNear(const std::string& text, double expected) {
  const double measured = MeasuredLoss(text);
  std::printf("%-36s measured %.5f  stationary %.5f  (%+.2f %%)\n", text.c_str(), measured, expected,
              100 * (measured - expected) / expected);
  EXPECT_NEAR(measured, expected, 0.05 * expected) << text << ": measured " << measured << ", stationary " << expected;
}

TEST(LabLoss, RandomMatchesItsRate) {
  EXPECT_DOUBLE_EQ(Stationary("loss random 10%"), 0.10);
  ExpectLossNear("loss random 10%", 0.10);
  ExpectLossNear("loss random 1%", 0.01);
  ExpectLossNear("loss 0.5%", 0.005);  // tc's short form
}

TEST(LabLoss, FourStateMatchesTheSalsanoFormula) {
  // p13 1 %, p31 30 %, p32 10 %, p23 40 %, p14 0.5 %:
  // (p13 p23 + p14 p23 p31) / (p23 p31 + p14 p23 p31 + p13 p23 + p13 p32)
  const double p13 = 0.01, p31 = 0.30, p32 = 0.10, p23 = 0.40, p14 = 0.005;
  const double expected = (p13 * p23 + p14 * p23 * p31) / (p23 * p31 + p14 * p23 * p31 + p13 * p23 + p13 * p32);
  EXPECT_NEAR(Stationary("loss state 1% 30% 10% 40% 0.5%"), expected, 1e-12);
  ExpectLossNear("loss state 1% 30% 10% 40% 0.5%", expected);
  // iproute2's defaults for the rest (p31 = 1 - p13, p32 = 0, p23 = 1,
  // p14 = 0): the loss is p13.
  EXPECT_NEAR(Stationary("loss state 5%"), 0.05, 1e-12);
  ExpectLossNear("loss state 5%", 0.05);
  // Long bursts: p13 0.5 %, p31 10 %.
  ExpectLossNear("loss state 0.5% 10%", Stationary("loss state 0.5% 10%"));
}

TEST(LabLoss, GilbertElliottMatchesItsStationaryLoss) {
  // p 2 %, r 20 %, 1-h 60 %, 1-k 1 %: (1-k) r/(p+r) + (1-h) p/(p+r).
  const double p = 0.02, r = 0.20, bad = 0.60, good = 0.01;
  const double expected = good * r / (p + r) + bad * p / (p + r);
  EXPECT_NEAR(Stationary("loss gemodel 2% 20% 60% 1%"), expected, 1e-12);
  ExpectLossNear("loss gemodel 2% 20% 60% 1%", expected);
  // Simple Gilbert (iproute2's defaults: r = 1 - p, 1-h = 100 %, 1-k = 0).
  EXPECT_NEAR(Stationary("loss gemodel 3%"), 0.03, 1e-12);
  ExpectLossNear("loss gemodel 3%", 0.03);
  // Gilbert: bursts with every packet of the bad state lost.
  ExpectLossNear("loss gemodel 1% 10%", 0.01 / 0.11);
}

TEST(LabLoss, BurstModelsLoseInBursts) {
  // The same mean loss, longer runs: the 4-state chain with p31 10 % has a
  // mean burst of 1/p31 = 10 packets.
  FaultEngine e(Rules("loss state 0.5% 10%"));
  uint64_t runs = 0, lost = 0;
  bool prev = false;
  for (int i = 0; i < kPackets; ++i) {
    const bool d = e.Decide(Packet(static_cast<uint32_t>(i))).drop;
    lost += d;
    runs += d && !prev;
    prev = d;
  }
  EXPECT_NEAR(static_cast<double>(lost) / runs, 10.0, 0.5);
}

TEST(LabSeed, SameSeedSameDecisionsOtherSeedOthers) {
  auto drops = [](const std::string& text, uint64_t salt) {
    FaultEngine e(Rules(text), salt);
    std::vector<uint32_t> psns;
    for (uint32_t i = 0; i < 100'000; ++i) {
      const Decision d = e.Decide(Packet(i, i * 1000));
      if (d.drop) psns.push_back(i);
    }
    return psns;
  };
  const auto a = drops("loss random 3% seed 42", 0);
  EXPECT_EQ(a, drops("loss random 3% seed 42", 0));
  EXPECT_NE(a, drops("loss random 3% seed 43", 0));
  EXPECT_NE(a, drops("loss random 3% seed 42", 1));  // another worker
  // Another rule before it does not change its decisions (a generator per rule).
  FaultEngine e(Rules("duplicate 50% seed 7; loss random 3% seed 42"));
  std::vector<uint32_t> b;
  for (uint32_t i = 0; i < 100'000; ++i) {
    if (e.Decide(Packet(i, i * 1000)).drop) b.push_back(i);
  }
  EXPECT_EQ(a, b);
  // Same for the other models and the delays.
  for (const std::string text : {"loss state 1% 30% 10% 40% 0.5% seed 9", "loss gemodel 2% 20% 60% 1% seed 9",
                                 "delay 1ms 300us distribution pareto seed 9; corrupt 5% seed 3"}) {
    FaultEngine x(Rules(text)), y(Rules(text));
    for (uint32_t i = 0; i < 10'000; ++i) {
      const Decision dx = x.Decide(Packet(i, i * 1000)), dy = y.Decide(Packet(i, i * 1000));
      ASSERT_EQ(dx.drop, dy.drop);
      ASSERT_EQ(dx.corrupt, dy.corrupt);
      ASSERT_EQ(dx.release_ns, dy.release_ns);
    }
  }
}

TEST(LabFilter, OnlyMatchingPacketsAreTouched) {
  // 100 % loss behind each filter: exactly the packets it names are lost.
  FaultEngine e(Rules("loss 100% qp 0x12 opcode rc_send_only psn 10-19 rx"));
  uint64_t lost = 0;
  for (uint32_t psn = 0; psn < 40; ++psn) {
    for (uint32_t qpn : {0x11u, 0x12u}) {
      for (uint8_t op : {uint8_t{0x04}, uint8_t{0x11}}) {
        for (Direction dir : {kTx, kRx}) {
          const bool want = qpn == 0x12 && op == 0x04 && psn >= 10 && psn <= 19 && dir == kRx;
          const bool got = e.Decide(Packet(psn, 0, qpn, op, dir)).drop;
          EXPECT_EQ(got, want) << "psn " << psn << " qpn " << qpn << " op " << int(op) << " dir " << int(dir);
          lost += got;
        }
      }
    }
  }
  EXPECT_EQ(lost, 10u);
  EXPECT_EQ(e.counters(0).matched, 10u);
  EXPECT_EQ(e.counters(0).dropped, 10u);
  EXPECT_FALSE(e.looks_at(kTx));
  EXPECT_TRUE(e.looks_at(kRx));
  // Default direction: tx only, as netem (an egress qdisc). Both: "tx rx".
  EXPECT_EQ(Rules("loss 1%")[0].dirs, kTx);
  EXPECT_EQ(Rules("loss 1% tx rx")[0].dirs, kTx | kRx);
  // Opcodes by number.
  EXPECT_TRUE(Rules("loss 1% opcode 0x0C")[0].opcodes.test(0x0C));
}

TEST(LabScripted, DropPsnOfQpNTimes) {
  FaultEngine e(Rules("drop psn 100 qp 17 count 3"));
  std::vector<bool> got;
  // PSN 100 of QP 17 sent five times (the transport's retries), others around it.
  for (int t = 0; t < 5; ++t) {
    EXPECT_FALSE(e.Decide(Packet(99, 0, 17)).drop);
    got.push_back(e.Decide(Packet(100, 0, 17)).drop);
    EXPECT_FALSE(e.Decide(Packet(100, 0, 18)).drop);  // another QP
    EXPECT_FALSE(e.Decide(Packet(101, 0, 17)).drop);
  }
  EXPECT_EQ(got, (std::vector<bool>{true, true, true, false, false}));
  EXPECT_EQ(e.counters(0).dropped, 3u);
  EXPECT_EQ(e.counters(0).matched, 5u);
}

// The capture's comments name the rule that acted (Decision::*_rule).
TEST(LabDecision, NamesTheRuleThatActed) {
  FaultEngine e(Rules("qp 18 duplicate 100%; qp 18 corrupt 100%; qp 18 delay 10us; drop psn 100 qp 17"));
  const Decision a = e.Decide(Packet(5, 1000, 18));
  EXPECT_TRUE(a.duplicate && a.corrupt);
  EXPECT_EQ(a.duplicate_rule, 1);
  EXPECT_EQ(a.corrupt_rule, 2);
  EXPECT_EQ(a.delay_rule, 3);
  EXPECT_EQ(a.release_ns, 11'000u);
  EXPECT_EQ(a.at_ns, 1000u);
  EXPECT_EQ(a.drop_rule, 0);
  const Decision d = e.Decide(Packet(100, 2000, 17));
  EXPECT_TRUE(d.drop);
  EXPECT_EQ(d.drop_rule, 4);
  EXPECT_EQ(d.duplicate_rule, 0);
  const Decision r = FaultEngine(Rules("reorder 100% gap 2")).Decide(Packet(1, 0));
  EXPECT_EQ(r.hold_packets, 2u);
  EXPECT_EQ(r.reorder_rule, 1);
}

TEST(LabScripted, DropAcksForAWindow) {
  FaultEngine e(Rules("drop acks for 5ms"));
  e.Start(1'000'000);
  uint64_t acks_lost = 0, others_lost = 0;
  for (uint64_t t = 1'000'000; t < 20'000'000; t += 10'000) {
    const bool ack = e.Decide(Packet(1, t, 17, 0x11)).drop;
    const bool atomic_ack = e.Decide(Packet(2, t, 17, 0x12)).drop;
    const bool send = e.Decide(Packet(3, t, 17, 0x04)).drop;
    const bool in_window = t < 6'000'000;
    EXPECT_EQ(ack, in_window) << t;
    EXPECT_EQ(atomic_ack, in_window) << t;
    acks_lost += ack + atomic_ack;
    others_lost += send;
  }
  EXPECT_EQ(acks_lost, 2u * 500);
  EXPECT_EQ(others_lost, 0u);
}

double MeanDelayNs(const std::string& text, int n) {
  FaultEngine e(Rules(text));
  double sum = 0;
  for (int i = 0; i < n; ++i) {
    const uint64_t now = 1'000'000'000;
    const Decision d = e.Decide(Packet(static_cast<uint32_t>(i), now));
    sum += d.release_ns == 0 ? 0.0 : static_cast<double>(d.release_ns - now);  // 0: clipped to no delay
  }
  return sum / n;
}

TEST(LabDelay, DistributionsHaveTheirMean) {
  // delay 1ms 200us: each distribution's mean is 1 ms (within 1 %).
  for (const char* dist : {"uniform", "normal", "pareto", "paretonormal"}) {
    const double mean = MeanDelayNs(std::string("delay 1ms 200us distribution ") + dist, kPackets);
    EXPECT_NEAR(mean, 1e6, 1e4) << dist;
  }
  EXPECT_NEAR(MeanDelayNs("delay 1ms 200us", kPackets), 1e6, 1e4);  // uniform by default
  EXPECT_NEAR(MeanDelayNs("delay 1ms 200us 50% distribution normal", kPackets), 1e6, 1e4);  // correlated
  EXPECT_DOUBLE_EQ(MeanDelayNs("delay 250us", 1000), 250e3);
}

TEST(LabDelay, NormalHasItsStandardDeviation) {
  FaultEngine e(Rules("delay 10ms 1ms distribution normal"));
  double sum = 0, sq = 0;
  for (int i = 0; i < kPackets; ++i) {
    const double d = static_cast<double>(e.Decide(Packet(static_cast<uint32_t>(i), 0)).release_ns);
    sum += d;
    sq += d * d;
  }
  const double mean = sum / kPackets;
  EXPECT_NEAR(std::sqrt(sq / kPackets - mean * mean), 1e6, 2e4);
  EXPECT_EQ(e.counters(0).delayed, static_cast<uint64_t>(kPackets));
}

TEST(LabRate, PacketsLeaveAtTheRate) {
  // 1 Mbit/s, 125-byte frames: one every 1 ms, whenever they are offered.
  FaultEngine e(Rules("rate 1M"));
  uint64_t last = 0;
  for (int i = 0; i < 100; ++i) {
    PacketInfo p = Packet(static_cast<uint32_t>(i), 0);
    p.len = 125;
    last = e.Decide(p).release_ns;
  }
  EXPECT_EQ(last, 100u * 1'000'000);
  uint64_t bps = 0;
  EXPECT_TRUE(ParseRate("1Gbit", &bps));
  EXPECT_EQ(bps, 1'000'000'000u);
  EXPECT_TRUE(ParseRate("500k", &bps));
  EXPECT_EQ(bps, 500'000u);
}

TEST(LabReorder, HeldBehindGapPacketsOrSkipsTheDelay) {
  // Without a delay: a reordered packet waits behind `gap` later ones.
  FaultEngine e(Rules("reorder 100% gap 3"));
  const Decision d = e.Decide(Packet(1, 1000));
  EXPECT_EQ(d.hold_packets, 3u);
  EXPECT_EQ(d.release_ns, 1000 + kReorderHoldMaxNs);
  // With a delay (netem): every gap-th packet goes at once with probability P.
  FaultEngine n(Rules("delay 10ms reorder 100% gap 4"));
  std::vector<bool> now;
  for (uint32_t i = 0; i < 8; ++i) now.push_back(n.Decide(Packet(i, 0)).release_ns == 0);
  EXPECT_EQ(now, (std::vector<bool>{false, false, false, true, false, false, false, true}));
  EXPECT_EQ(n.counters(0).reordered, 2u);
  EXPECT_EQ(n.counters(0).delayed, 6u);
  // Rates over 10^6 packets.
  FaultEngine r(Rules("reorder 5% gap 3; duplicate 2%; corrupt 1%"));
  for (int i = 0; i < kPackets; ++i) r.Decide(Packet(static_cast<uint32_t>(i), 0));
  EXPECT_NEAR(r.counters(0).reordered / double(kPackets), 0.05, 0.0025);
  EXPECT_NEAR(r.counters(1).duplicated / double(kPackets), 0.02, 0.001);
  EXPECT_NEAR(r.counters(2).corrupted / double(kPackets), 0.01, 0.0005);
}

TEST(LabParse, NetemWords) {
  const auto r = Rules("delay 100ms 10ms 25% distribution paretonormal; loss state 1% 2% 3% 4% 5%; "
                       "loss gemodel 1% 10% 70% 0.1%; duplicate 1% 10%; corrupt 0.1%; rate 100Mbit; "
                       "drop psn 5 qp 0x11 count 2 seed 9");
  ASSERT_EQ(r.size(), 7u);
  EXPECT_EQ(r[0].delay_ns, 100'000'000u);
  EXPECT_EQ(r[0].jitter_ns, 10'000'000u);
  EXPECT_DOUBLE_EQ(r[0].delay_corr, 0.25);
  EXPECT_EQ(r[0].dist, DelayDist::kParetoNormal);
  EXPECT_EQ(r[1].loss, LossKind::kState);
  EXPECT_DOUBLE_EQ(r[1].loss_p[4], 0.05);
  EXPECT_EQ(r[2].loss, LossKind::kGemodel);
  EXPECT_DOUBLE_EQ(r[2].loss_p[2], 0.70);
  EXPECT_DOUBLE_EQ(r[3].duplicate_corr, 0.10);
  EXPECT_EQ(r[5].rate_bps, 100'000'000u);
  EXPECT_TRUE(r[6].drop);
  EXPECT_EQ(r[6].drop_count, 2u);
  EXPECT_EQ(r[6].qp, 0x11u);
  EXPECT_EQ(r[6].seed, 9u);
  EXPECT_EQ(r[6].text, "drop psn 5 qp 0x11 count 2 seed 9");
  uint64_t ns = 0;
  EXPECT_TRUE(ParseTime("1.5s", &ns));
  EXPECT_EQ(ns, 1'500'000'000u);
  EXPECT_TRUE(ParseTime("100", &ns));  // tc: µs
  EXPECT_EQ(ns, 100'000u);
}

TEST(LabParse, BadRulesAreRefusedNamingTheWord) {
  EXPECT_EQ(Refusal("loss randum 10%"),
            "rule 1 'loss randum 10%': unknown loss model 'randum' (random, state, gemodel or a percentage)");
  EXPECT_EQ(Refusal("loss random 10%; delay 5 parsecs"), "rule 2 'delay 5 parsecs': unknown word 'parsecs'");
  EXPECT_EQ(Refusal("loss random 110%"),
            "rule 1 'loss random 110%': loss random: '110%' is not a percentage (0 to 100, e.g. 10%)");
  EXPECT_EQ(Refusal("delay fast"), "rule 1 'delay fast': delay: 'fast' is not a time (e.g. 5ms, 250us)");
  EXPECT_EQ(Refusal("delay 1ms 1ms distribution gauss"),
            "rule 1 'delay 1ms 1ms distribution gauss': unknown distribution 'gauss' (uniform, normal, pareto or "
            "paretonormal)");
  EXPECT_EQ(Refusal("rate fast"), "rule 1 'rate fast': 'rate fast': a rate in bit/s, e.g. 9600, 500k, 100M, 1Gbit");
  EXPECT_EQ(Refusal("loss 1% opcode send"),
            "rule 1 'loss 1% opcode send': opcode: 'send' is not an opcode (a name such as rc_send_only or ack, or "
            "0xNN)");
  EXPECT_EQ(Refusal("loss 1% psn 9-3"),
            "rule 1 'loss 1% psn 9-3': psn: '9-3' is not a PSN or a range A-B (0 to 0xffffff, A <= B)");
  EXPECT_EQ(Refusal("loss 1% qp 0x1000000"), "rule 1 'loss 1% qp 0x1000000': 'qp 0x1000000': a QP number (0 to 0xffffff)");
  EXPECT_EQ(Refusal("qp 5"),
            "rule 1 'qp 5': no fault in it (loss, delay, reorder, duplicate, corrupt, rate or drop)");
  EXPECT_EQ(Refusal("drop"),
            "rule 1 'drop': 'drop' alone would drop everything: name what (psn, qp, acks, opcode) or limit it "
            "(count, for)");
  EXPECT_EQ(Refusal("loss state 60% 10% 10% 10% 50%"),
            "rule 1 'loss state 60% 10% 10% 10% 50%': loss state: p13 + p14 is more than 100%");
  EXPECT_EQ(Refusal("loss 1% count 3"), "rule 1 'loss 1% count 3': 'count' belongs to 'drop' (drop psn X qp Y count N)");
  EXPECT_EQ(Refusal(" ; "), "' ; ' has no rule");
  EXPECT_EQ(Refusal("duplicate 1% 100%"), "rule 1 'duplicate 1% 100%': duplicate correlation: below 100%");
}

TEST(LabHoldQueue, ReleasesByTimeOrAfterLaterPackets) {
  HoldQueue<int> q(4);
  EXPECT_TRUE(q.Push(1, 300, 0));
  EXPECT_TRUE(q.Push(2, 100, 0));
  EXPECT_TRUE(q.Push(3, 1000, 2));  // reordered: after 2 packets, at the latest 1000
  EXPECT_TRUE(q.Push(4, 100, 0));
  EXPECT_FALSE(q.Push(5, 0, 0));  // full
  std::vector<int> out;
  auto take = [&out](int v) { out.push_back(v); };
  q.Release(50, take);
  EXPECT_TRUE(out.empty());
  q.Release(150, take);
  EXPECT_EQ(out, (std::vector<int>{2, 4}));
  q.Passed(1);
  q.Release(160, take);
  EXPECT_EQ(out.size(), 2u);
  q.Passed(1);
  q.Release(170, take);
  EXPECT_EQ(out, (std::vector<int>{2, 4, 3}));
  q.Release(400, take);
  EXPECT_EQ(out, (std::vector<int>{2, 4, 3, 1}));
  EXPECT_TRUE(q.empty());
  // A reordered entry whose packets never come leaves at its time limit.
  EXPECT_TRUE(q.Push(6, 500, 3));
  q.Passed(1);
  q.Release(499, take);
  EXPECT_EQ(out.size(), 4u);
  q.Release(500, take);
  EXPECT_EQ(out.back(), 6);
  q.Passed(5);  // nothing left to count
  EXPECT_TRUE(q.empty());
}

// Eth / IPv4 / UDP 4791 / BTH (RC SEND ONLY to QP 0x000123, PSN 0x0A0B0C) /
// 4 payload bytes / ICRC, then Ethernet padding the peek must not take for
// the ICRC.
std::vector<uint8_t> Frame(bool vlan) {
  std::vector<uint8_t> f(12, 0x02);
  if (vlan) f.insert(f.end(), {0x81, 0x00, 0x00, 0x64});
  f.insert(f.end(), {0x08, 0x00});
  const uint16_t ip_len = 20 + 8 + 12 + 4 + 4;
  f.insert(f.end(), {0x45, 0, uint8_t(ip_len >> 8), uint8_t(ip_len), 0, 0, 0x40, 0, 64, 17, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2});
  const uint16_t udp_len = 8 + 12 + 4 + 4;
  f.insert(f.end(), {0xC0, 0x00, 0x12, 0xB7, uint8_t(udp_len >> 8), uint8_t(udp_len), 0, 0});
  f.insert(f.end(), {0x04, 0x40, 0xFF, 0xFF, 0x00, 0x00, 0x01, 0x23, 0x80, 0x0A, 0x0B, 0x0C});
  f.insert(f.end(), {1, 2, 3, 4, 0xAA, 0xBB, 0xCC, 0xDD});
  f.insert(f.end(), 6, 0);  // padding
  return f;
}

TEST(LabPeek, ReadsTheBthAndFindsTheIcrc) {
  for (bool vlan : {false, true}) {
    const std::vector<uint8_t> f = Frame(vlan);
    RocePeek p;
    ASSERT_TRUE(PeekRoce(f.data(), static_cast<uint32_t>(f.size()), &p));
    EXPECT_EQ(p.opcode, 0x04);
    EXPECT_EQ(p.dqpn, 0x123u);
    EXPECT_EQ(p.psn, 0x0A0B0Cu);
    EXPECT_EQ(f[p.icrc_offset], 0xAA);
    // Every truncation is refused, never read past.
    for (uint32_t len = 0; len < f.size() - 6; ++len) EXPECT_FALSE(PeekRoce(f.data(), len, &p)) << len;
  }
  std::vector<uint8_t> arp = Frame(false);
  arp[12] = 0x08;
  arp[13] = 0x06;
  RocePeek p;
  EXPECT_FALSE(PeekRoce(arp.data(), static_cast<uint32_t>(arp.size()), &p));
}

}  // namespace
}  // namespace droce::lab

namespace droce::lab {
namespace {

// netem's `ecn`: the loss model's victims are marked CE when ECN-capable
// (a congested switch's marks on a live link), dropped otherwise.
TEST(LabEcn, MarksEcnCapablePacketsInsteadOfDropping) {
  FaultEngine e(Rules("loss random 10% ecn seed 7"));
  uint64_t marked = 0, dropped = 0;
  for (int i = 0; i < 100'000; ++i) {
    PacketInfo p = Packet(static_cast<uint32_t>(i), uint64_t(i) * 1000);
    p.ecn = (i % 2 == 0) ? 2 : 0;  // ECT(0) or not ECN-capable, alternately
    const Decision d = e.Decide(p);
    EXPECT_FALSE(d.drop && d.mark_ce);
    if (d.mark_ce) {
      EXPECT_EQ(p.ecn, 2);
      EXPECT_EQ(d.ce_rule, 1);
      EXPECT_FALSE(d.passes());
    }
    if (d.drop) EXPECT_EQ(p.ecn, 0);
    marked += d.mark_ce;
    dropped += d.drop;
  }
  EXPECT_EQ(e.counters(0).marked, marked);
  EXPECT_EQ(e.counters(0).dropped, dropped);
  EXPECT_NEAR(static_cast<double>(marked) / 50'000, 0.10, 0.01);
  EXPECT_NEAR(static_cast<double>(dropped) / 50'000, 0.10, 0.01);
  EXPECT_NE(Refusal("ecn").find("no fault"), std::string::npos);
  EXPECT_NE(Refusal("duplicate 1% ecn").find("loss model"), std::string::npos);
}

}  // namespace
}  // namespace droce::lab
