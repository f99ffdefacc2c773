// DCQCN's reaction and notification points (src/cc/dcqcn.h) in virtual time,
// against the equations: first by hand for each phase, then a scripted CNP
// train against a reference model that steps every microsecond.
#include "cc/dcqcn.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

namespace droce::cc {
namespace {

constexpr uint64_t kUs = 1000;
constexpr double kLine = 25000;  // Mb/s

TEST(DcqcnParams, ParsesFormatsAndRefuses) {
  DcqcnParams p;
  ASSERT_TRUE(ParseDcqcnParams("rpg_ai_rate=10, rpg_gd=9,min_time_between_cnps=0", &p).ok());
  EXPECT_EQ(p.rpg_ai_rate, 10u);
  EXPECT_EQ(p.rpg_gd, 9u);
  EXPECT_EQ(p.min_time_between_cnps, 0u);
  DcqcnParams back;
  ASSERT_TRUE(ParseDcqcnParams(FormatDcqcnParams(p), &back).ok());
  EXPECT_EQ(back, p);
  EXPECT_NE(FormatDcqcnParams(DcqcnParams{}).find("rpg_time_reset=300"), std::string::npos);
  DcqcnParams q;
  for (const char* bad : {"rpg_ai=5", "rpg_gd=0", "dce_tcp_g=1024", "rpg_ai_rate", "cnp_dscp=64", "rpg_ai_rate=-1"}) {
    EXPECT_FALSE(ParseDcqcnParams(bad, &q).ok()) << bad;
  }
  EXPECT_EQ(q, DcqcnParams{});  // a refused list changes nothing
}

TEST(Dcqcn, FirstCnpCutsAtTheNextMonitorPeriod) {
  ReactionPoint rp;
  rp.Configure(DcqcnParams{}, kLine);
  EXPECT_FALSE(rp.active());
  EXPECT_EQ(rp.rate_mbps(), kLine);
  rp.OnCnp(1000 * kUs);
  ASSERT_TRUE(rp.active());
  const double a0 = 1023.0 / 1024;  // initial_alpha_value
  const double g = 5.0 / 1024;      // (1024 - dce_tcp_g) / 1024
  EXPECT_DOUBLE_EQ(rp.alpha(), a0);
  EXPECT_EQ(rp.rate_mbps(), kLine);  // not yet: at the start of the next period
  // No CNP in the next dce_tcp_rtt: alpha = (1 - g) alpha.
  rp.Advance(1001 * kUs);
  EXPECT_DOUBLE_EQ(rp.alpha(), a0 * (1 - g));
  EXPECT_EQ(rp.cuts(), 0u);
  // 4 µs (rate_reduce_monitor_period) after the first CNP: alpha's update
  // of that microsecond, then Rc = Rc (1 - alpha / 2) with Rt the rate
  // before the cut.
  rp.Advance(1004 * kUs);
  const double a4 = a0 * std::pow(1 - g, 4);
  EXPECT_NEAR(rp.alpha(), a4, 1e-15);
  EXPECT_EQ(rp.cuts(), 1u);
  EXPECT_NEAR(rp.rate_mbps(), kLine * (1 - a4 / 2), 1e-9);
  EXPECT_DOUBLE_EQ(rp.target_mbps(), kLine);
  // Ten periods without CNP: no cut, alpha decays.
  rp.Advance(1014 * kUs);
  EXPECT_EQ(rp.cuts(), 1u);
  EXPECT_NEAR(rp.alpha(), a0 * std::pow(1 - g, 14), 1e-15);
}

TEST(Dcqcn, CnpRaisesAlphaAtTheNextUpdate) {
  ReactionPoint rp;
  rp.Configure(DcqcnParams{}, kLine);
  rp.OnCnp(0);
  rp.Advance(4 * kUs);
  const double r1 = rp.rate_mbps();
  rp.OnCnp(10 * kUs + 500);  // 10.5 µs: cut at 12 µs, the next period's start
  const double g = 5.0 / 1024;
  const double a10 = 1023.0 / 1024 * std::pow(1 - g, 10);
  EXPECT_NEAR(rp.alpha(), a10, 1e-15);
  EXPECT_DOUBLE_EQ(rp.rate_mbps(), r1);
  rp.Advance(11 * kUs);  // the update at 11 µs saw the CNP
  const double a11 = a10 * (1 - g) + g;
  EXPECT_NEAR(rp.alpha(), a11, 1e-15);
  rp.Advance(12 * kUs);
  const double a12 = a11 * (1 - g);
  EXPECT_NEAR(rp.alpha(), a12, 1e-15);
  EXPECT_NEAR(rp.rate_mbps(), r1 * (1 - a12 / 2), 1e-9);
  // The target is not clamped again: no timer increase came in between.
  EXPECT_DOUBLE_EQ(rp.target_mbps(), kLine);
}

TEST(Dcqcn, MonitorPeriodAllowsOneCutPerPeriod) {
  ReactionPoint rp;
  rp.Configure(DcqcnParams{}, kLine);
  rp.OnCnp(100 * kUs);  // periods start at 100, 104, 108 ... µs
  rp.OnCnp(101 * kUs + 100);
  rp.OnCnp(102 * kUs + 100);
  EXPECT_EQ(rp.cuts(), 0u);
  rp.Advance(104 * kUs);
  EXPECT_EQ(rp.cuts(), 1u);  // one cut for three CNPs
  rp.OnCnp(104 * kUs + 300);
  rp.OnCnp(107 * kUs + 900);
  rp.Advance(107 * kUs + 999);
  EXPECT_EQ(rp.cuts(), 1u);
  rp.Advance(108 * kUs);
  EXPECT_EQ(rp.cuts(), 2u);
  rp.Advance(200 * kUs);
  EXPECT_EQ(rp.cuts(), 2u);  // no CNP since: no cut
}

TEST(Dcqcn, NoMonitorPeriodCutsAtEachCnp) {
  DcqcnParams p;
  p.rate_reduce_monitor_period = 0;
  ReactionPoint rp;
  rp.Configure(p, kLine);
  rp.OnCnp(0);
  EXPECT_EQ(rp.cuts(), 1u);
  EXPECT_DOUBLE_EQ(rp.rate_mbps(), kLine * (1 - 1023.0 / 2048));
  rp.OnCnp(500);
  EXPECT_EQ(rp.cuts(), 2u);
}

TEST(Dcqcn, IncreasePhasesFastRecoveryAdditiveHyper) {
  DcqcnParams p;
  p.rpg_byte_reset = 0;  // timer only: its stage stands for both
  ReactionPoint rp;
  rp.Configure(p, kLine);
  rp.OnCnp(0);
  rp.Advance(4 * kUs);  // the first CNP's cut; the timer restarts from it
  ASSERT_EQ(rp.cuts(), 1u);
  double rc = rp.rate_mbps(), rt = rp.target_mbps();
  // 304 µs: stage 0 < F = 1, fast recovery.
  rp.Advance(304 * kUs);
  rc = (rt + rc) / 2;
  EXPECT_DOUBLE_EQ(rp.rate_mbps(), rc);
  EXPECT_DOUBLE_EQ(rp.target_mbps(), rt);
  // 600 µs: stage 1 == F, additive increase by rpg_ai_rate... but the
  // target is the line rate already: it stays there.
  rp.Advance(604 * kUs);
  rc = (std::min(rt + 5, kLine) + rc) / 2;
  EXPECT_DOUBLE_EQ(rp.rate_mbps(), rc);
  EXPECT_EQ(rp.time_stage(), 2u);
  // A CNP now: the timer raised the rate since the last cut, so the target
  // is clamped to the rate before this cut.
  rp.OnCnp(700 * kUs + 500);
  rp.Advance(704 * kUs);  // the cut: 700.5 µs is in the period [700, 704)
  ASSERT_EQ(rp.cuts(), 2u);
  const double a = rp.alpha();
  EXPECT_DOUBLE_EQ(rp.target_mbps(), rc);
  rt = rc;
  rc = rc * (1 - a / 2);
  EXPECT_DOUBLE_EQ(rp.rate_mbps(), rc);
  // 1004 µs FR, 1304 µs AI (+5), 1604 µs HI (+50), 1904 µs HI (+50).
  rp.Advance(1004 * kUs);
  rc = (rt + rc) / 2;
  EXPECT_DOUBLE_EQ(rp.rate_mbps(), rc);
  rp.Advance(1304 * kUs);
  rt += 5;
  rc = (rt + rc) / 2;
  EXPECT_DOUBLE_EQ(rp.target_mbps(), rt);
  EXPECT_DOUBLE_EQ(rp.rate_mbps(), rc);
  rp.Advance(1604 * kUs);
  rt += 50;
  rc = (rt + rc) / 2;
  EXPECT_DOUBLE_EQ(rp.target_mbps(), rt);
  EXPECT_DOUBLE_EQ(rp.rate_mbps(), rc);
  rp.Advance(1904 * kUs);
  rt += 50;
  rc = (rt + rc) / 2;
  EXPECT_DOUBLE_EQ(rp.rate_mbps(), rc);
}

TEST(Dcqcn, ByteCounterRaisesTheRate) {
  ReactionPoint rp;
  rp.Configure(DcqcnParams{}, kLine);
  rp.OnCnp(0);
  rp.Advance(4 * kUs);
  double rc = rp.rate_mbps();
  const double rt = rp.target_mbps();
  rp.OnSent(32766, 5 * kUs);
  EXPECT_EQ(rp.byte_stage(), 0u);
  rp.OnSent(1, 6 * kUs);  // 32767 bytes: one byte-counter event, fast recovery
  EXPECT_EQ(rp.byte_stage(), 1u);
  rc = (rt + rc) / 2;
  EXPECT_DOUBLE_EQ(rp.rate_mbps(), rc);
  // Three more events at once (3 × 32767 bytes): stage 1 with the timer's
  // stage 0 is still "one counter at F": additive, then additive (b 2 > F,
  // t 0), each capped at the line rate.
  rp.OnSent(3 * 32767, 7 * kUs);
  EXPECT_EQ(rp.byte_stage(), 4u);
  for (int i = 0; i < 3; ++i) rc = (std::min(rt + 5, kLine) + rc) / 2;
  EXPECT_DOUBLE_EQ(rp.rate_mbps(), rc);
}

TEST(Dcqcn, FloorAndRelease) {
  DcqcnParams p;
  p.rpg_min_rate = 1000;
  p.rate_reduce_monitor_period = 0;
  p.dce_tcp_g = 0;  // alpha jumps to 1 at every update with a CNP
  ReactionPoint rp;
  rp.Configure(p, kLine);
  for (uint64_t t = 0; t < 20; ++t) rp.OnCnp(t * kUs + 500);
  EXPECT_EQ(rp.cuts(), 20u);
  EXPECT_DOUBLE_EQ(rp.rate_mbps(), 1000);  // never below rpg_min_rate
  // Without CNPs the timer and byte counter bring it back; within 1 Mb/s of
  // the line rate the limiter is released.
  uint64_t t = 20 * kUs;
  while (rp.active() && t < 1'000'000 * kUs) {
    rp.OnSent(1024, t);
    t += 1 * kUs;
  }
  EXPECT_FALSE(rp.active());
  EXPECT_EQ(rp.rate_mbps(), kLine);
  EXPECT_EQ(rp.next_event_ns(), UINT64_MAX);
}

TEST(Dcqcn, RateToSetOnFirstCnpAndMaxRate) {
  DcqcnParams p;
  p.rate_to_set_on_first_cnp = 4000;
  p.rpg_max_rate = 10000;
  ReactionPoint rp;
  rp.Configure(p, kLine);
  EXPECT_EQ(rp.max_mbps(), 10000);
  rp.OnCnp(0);
  EXPECT_DOUBLE_EQ(rp.target_mbps(), 4000);
  EXPECT_DOUBLE_EQ(rp.rate_mbps(), 4000);
  rp.Advance(4 * kUs);
  EXPECT_NEAR(rp.rate_mbps(), 4000 * (1 - 1023.0 / 1024 * std::pow(1019.0 / 1024, 4) / 2), 1e-9);
}

// A reference written straight from the equations, stepping every
// microsecond (no closed forms, no skipping): alpha update, then a held cut,
// then the timer, then the CNPs of that microsecond (scripted at +0.5 µs).
struct Reference {
  DcqcnParams p;
  double rc = kLine, rt = kLine, alpha = 0;
  bool active = false, cnp_seen = false, pending = false;
  uint64_t origin_us = 0, cut_at_us = 0, next_alpha_us = 0, next_timer_us = 0;
  uint32_t t_stage = 0;

  void Cut(uint64_t t) {
    if (t_stage > 0) rt = rc;  // clamp_tgt_rate_after_time_inc
    rc = std::max<double>(p.rpg_min_rate, rc * std::max(1 - alpha / 2, p.rpg_min_dec_fac / 100.0));
    t_stage = 0;
    next_timer_us = t + p.rpg_time_reset;
    pending = false;
  }
  void Tick(uint64_t t) {
    if (!active) return;
    const double g = (1024.0 - p.dce_tcp_g) / 1024;
    if (t == next_alpha_us) {
      alpha = (1 - g) * alpha + (cnp_seen ? g : 0);
      cnp_seen = false;
      next_alpha_us += p.dce_tcp_rtt;
    }
    if (pending && t == cut_at_us) Cut(t);
    if (t == next_timer_us) {
      next_timer_us += p.rpg_time_reset;
      const uint32_t f = p.rpg_threshold;
      if (t_stage == f) rt += p.rpg_ai_rate;
      else if (t_stage > f) rt += p.rpg_hai_rate;
      rt = std::min(rt, kLine);
      rc = (rt + rc) / 2;
      ++t_stage;
      if (rc > kLine - 1) {
        active = false;
        rc = rt = kLine;
      }
    }
  }
  void Cnp(uint64_t t) {
    if (!active) {
      active = true;
      alpha = p.initial_alpha_value / 1024.0;
      rt = rc;
      next_alpha_us = t + p.dce_tcp_rtt;
      next_timer_us = UINT64_MAX;  // from the first cut
      cnp_seen = false;
      t_stage = 0;
      origin_us = t;
    } else {
      cnp_seen = true;
    }
    if (!pending) {
      pending = true;
      cut_at_us = origin_us + ((t - origin_us) / p.rate_reduce_monitor_period + 1) * p.rate_reduce_monitor_period;
    }
  }
};

TEST(Dcqcn, ScriptedTrainMatchesTheReference) {
  DcqcnParams p;
  p.rpg_byte_reset = 0;   // the reference has no byte counter
  p.rpg_time_reset = 55;  // the paper's timer, to see many increases
  // All event times are whole microseconds plus the same offset, so a
  // reference on a microsecond grid sees the same order of events.
  const uint64_t kOff = 500;
  ReactionPoint rp;
  rp.Configure(p, kLine);
  Reference ref;
  ref.p = p;
  // CNP trains: bursts every 2 µs, then silences, then a steady 1-in-7.
  std::vector<uint64_t> cnps;
  for (uint64_t t = 10; t < 60; t += 2) cnps.push_back(t);
  for (uint64_t t = 400; t < 410; ++t) cnps.push_back(t);
  for (uint64_t t = 2000; t < 4000; t += 7) cnps.push_back(t);
  for (uint64_t t = 9000; t < 9100; t += 3) cnps.push_back(t);
  size_t next = 0;
  int compared = 0;
  for (uint64_t us = 0; us < 20000; ++us) {
    ref.Tick(us);
    if (next < cnps.size() && cnps[next] == us) {
      ref.Cnp(us);
      rp.OnCnp(us * kUs + kOff);
      ++next;
    }
    rp.Advance(us * kUs + kOff);
    if (us % 37 == 0 || (next > 0 && cnps[next - 1] == us)) {
      ASSERT_EQ(rp.active(), ref.active) << "at " << us << " µs";
      ASSERT_NEAR(rp.rate_mbps(), ref.rc, 1e-9 * kLine) << "at " << us << " µs";
      ASSERT_NEAR(rp.target_mbps(), ref.rt, 1e-9 * kLine) << "at " << us << " µs";
      if (ref.active) ASSERT_NEAR(rp.alpha(), ref.alpha, 1e-12) << "at " << us << " µs";
      ++compared;
    }
  }
  EXPECT_GT(compared, 500);
  EXPECT_GT(rp.cuts(), 300u);
  EXPECT_GT(rp.increases(), 40u);
  EXPECT_FALSE(rp.active());  // recovered to the line rate by the end
}

TEST(Dcqcn, NotificationPointSpacesCnps) {
  NotificationPoint np;
  int sent = 0;
  for (uint64_t t = 0; t < 100 * kUs; t += 500) sent += np.ShouldSend(t, 4);
  EXPECT_EQ(sent, 25);  // one per 4 µs
  NotificationPoint every;
  sent = 0;
  for (uint64_t t = 0; t < 100 * kUs; t += 500) sent += every.ShouldSend(t, 0);
  EXPECT_EQ(sent, 200);
}

}  // namespace
}  // namespace droce::cc
