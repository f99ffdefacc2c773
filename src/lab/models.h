// The random models behind the fault rules: a seeded generator, netem's
// correlated uniform, the three loss models and the delay distributions.
// Header-only, no DPDK; each draws a fixed number of random numbers per
// packet, so that the same seed and the same packets give the same
// decisions.
//
// Loss models and their stationary loss (the long-run fraction of packets
// lost), which tests/unit/lab_fault_test.cc checks over 10^6 packets:
//
// * random P: each packet is lost with probability P. Loss = P.
//   (With a correlation ρ, netem's "correlated" uniform below is used;
//   that generator does not keep the rate P, as is known of netem, so the
//   stationary value holds only for ρ = 0.)
//
// * state p13 [p31 [p32 [p23 [p14]]]]: netem's 4-state Markov chain
//   (S. Salsano, F. Ludovici, A. Ordine, "Definition of a general and
//   intuitive loss model for packet networks and its implementation in the
//   Netem module in the Linux kernel", Univ. of Rome Tor Vergata, 2009;
//   Linux net/sched/sch_netem.c, loss_4state). States: 1 = packet received
//   in a gap period, 2 = received in a burst, 3 = lost in a burst, 4 =
//   isolated loss in a gap. Transitions p13, p14 (p11 = 1 - p13 - p14),
//   p31, p32 (p33 = 1 - p31 - p32), p23 (p22 = 1 - p23), p41 = 1. A packet
//   is lost when the chain enters (or stays in) state 3 or 4. Solving
//   π = πP: π2 = π3 p32 / p23, π3 = π1 p13 / p31, π4 = π1 p14, so
//     loss = π3 + π4
//          = (p13 p23 + p14 p23 p31) / (p23 p31 + p14 p23 p31 + p13 p23 + p13 p32),
//   the formula of the Salsano et al. report. iproute2's defaults for the
//   parameters left out: p31 = 1 - p13, p32 = 0, p23 = 1, p14 = 0 (then
//   loss = p13).
//
// * gemodel p [r [1-h [1-k]]]: Gilbert-Elliott (E. N. Gilbert, "Capacity of
//   a burst-noise channel", Bell Syst. Tech. J. 39, 1960; E. O. Elliott,
//   "Estimates of error rates for codes on burst-noise channels", BSTJ 42,
//   1963; netem's loss_gilb_ell). Two states, Good and Bad; p = P(G → B),
//   r = P(B → G); a packet is lost with probability 1-k in Good and 1-h in
//   Bad (h, k: the probabilities of delivery, Gilbert's notation; tc-netem(8)
//   takes 1-h and 1-k). Stationary state probabilities πB = p / (p + r),
//   πG = r / (p + r), so
//     loss = (1-k) r / (p + r) + (1-h) p / (p + r).
//   iproute2's defaults: r = 1 - p, 1-h = 100 %, 1-k = 0 % ("simple
//   Gilbert": loss = p / (p + r) = p).
//
// Delay distributions (delay T J distribution D): every one has mean T.
// uniform: T + J·U(-1, 1) (netem's default); normal: T + J·N(0, 1);
// pareto: T + J·(X - 1.5)/√0.75 with X ~ Pareto(α = 3, xm = 1), whose mean
// is 1.5 and variance 0.75, so J is the standard deviation; paretonormal:
// T + J·(N(0,1) + 3·that pareto)/4, the mix netem's paretonormal table is
// made of (iproute2 netem/paretonormal.c). A correlation ρ makes the
// standardised variate AR(1), z' = ρ z_prev + √(1-ρ²) z, which keeps the
// mean and the variance (netem's correlated uniform keeps neither).
// Samples are clipped to [0, 60 s]: the clipping at 0 moves the mean when J
// is large next to T.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

#include "lab/fault_rules.h"

namespace droce::lab {

// SplitMix64 (Steele, Lea, Flood, "Fast splittable pseudorandom number
// generators", OOPSLA 2014), as the transport simulator uses.
class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1), 53 bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // N(0, 1) by Box-Muller (two uniforms per draw; the second value is not
  // kept, so every draw costs the same).
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
  }

 private:
  uint64_t s_;
};

// netem's get_crandom: next = (1 - ρ)·u + ρ·last. With ρ = 0 a plain
// uniform.
class CorrelatedUniform {
 public:
  explicit CorrelatedUniform(double rho = 0) : rho_(rho) {}
  double Next(Rng& rng) {
    const double u = rng.Uniform();
    if (rho_ == 0) return u;
    last_ = (1 - rho_) * u + rho_ * last_;
    return last_;
  }

 private:
  double rho_;
  double last_ = 0;
};

// One of the loss models of a rule; Lost() draws for one packet.
class LossModel {
 public:
  LossModel() = default;
  explicit LossModel(const FaultRule& r) : kind_(r.loss), corr_(r.loss_corr) {
    for (int i = 0; i < 5; ++i) p_[i] = r.loss_p[i];
  }
  bool active() const { return kind_ != LossKind::kNone; }

  bool Lost(Rng& rng) {
    switch (kind_) {
      case LossKind::kNone: return false;
      case LossKind::kRandom: return p_[0] > 0 && corr_.Next(rng) < p_[0];
      case LossKind::kState: return FourState(rng.Uniform());
      case LossKind::kGemodel: return GilbertElliott(rng.Uniform(), rng.Uniform());
    }
    return false;
  }

  // The long-run loss fraction (formulas above).
  double Stationary() const { return StationaryLoss(kind_, p_); }
  static double StationaryLoss(LossKind kind, const double* p) {
    switch (kind) {
      case LossKind::kNone: return 0;
      case LossKind::kRandom: return p[0];
      case LossKind::kState: {
        const double p13 = p[0], p31 = p[1], p32 = p[2], p23 = p[3], p14 = p[4];
        const double den = p23 * p31 + p14 * p23 * p31 + p13 * p23 + p13 * p32;
        if (den == 0) return p13 > 0 ? 1.0 : p14 / (1 + p14);  // an absorbing loss state, or never left
        return (p13 * p23 + p14 * p23 * p31) / den;
      }
      case LossKind::kGemodel: {
        const double gp = p[0], gr = p[1], bad_loss = p[2], good_loss = p[3];
        if (gp + gr == 0) return good_loss;  // never leaves Good
        return (good_loss * gr + bad_loss * gp) / (gp + gr);
      }
    }
    return 0;
  }

 private:
  // netem's loss_4state with one uniform per packet: a1 = p13, a2 = p31,
  // a3 = p32, a4 = p14, a5 = p23.
  bool FourState(double u) {
    const double p13 = p_[0], p31 = p_[1], p32 = p_[2], p23 = p_[3], p14 = p_[4];
    switch (state_) {
      case 1:
        if (u < p14) {
          state_ = 4;
          return true;
        }
        if (u < p14 + p13) {
          state_ = 3;
          return true;
        }
        return false;
      case 2:
        if (u < p23) {
          state_ = 3;
          return true;
        }
        return false;
      case 3:
        if (u < p32) {
          state_ = 2;
          return false;
        }
        if (u < p32 + p31) {
          state_ = 1;
          return false;
        }
        return true;
      default:  // 4: an isolated loss is followed by a reception
        state_ = 1;
        return false;
    }
  }
  // netem's loss_gilb_ell: the transition, then the loss by the state the
  // packet met (two uniforms per packet whatever happens).
  bool GilbertElliott(double u_move, double u_loss) {
    const double gp = p_[0], gr = p_[1], bad_loss = p_[2], good_loss = p_[3];
    if (!bad_) {
      if (u_move < gp) bad_ = true;
      return u_loss < good_loss;
    }
    if (u_move < gr) bad_ = false;
    return u_loss < bad_loss;
  }

  LossKind kind_ = LossKind::kNone;
  double p_[5] = {0, 0, 0, 0, 0};
  CorrelatedUniform corr_;
  int state_ = 1;     // 4-state: 1..4
  bool bad_ = false;  // Gilbert-Elliott
};

// The delay of one packet in ns (T, J, distribution and correlation of a
// rule).
class DelayModel {
 public:
  DelayModel() = default;
  explicit DelayModel(const FaultRule& r)
      : active_(r.has_delay),
        mean_(static_cast<double>(r.delay_ns)),
        jitter_(static_cast<double>(r.jitter_ns)),
        rho_(r.delay_corr),
        dist_(r.dist) {}
  bool active() const { return active_; }

  uint64_t Sample(Rng& rng) {
    if (jitter_ == 0) {
      (void)rng.Next();  // one draw whatever the parameters: decisions stay aligned
      return static_cast<uint64_t>(mean_);
    }
    double z = Standard(rng);
    if (rho_ != 0) {
      z = rho_ * last_ + std::sqrt(1 - rho_ * rho_) * z;
      last_ = z;
    }
    double d = mean_ + jitter_ * z;
    if (d < 0) d = 0;
    if (d > 60e9) d = 60e9;
    return static_cast<uint64_t>(std::llround(d));
  }

 private:
  // A variate of mean 0 (uniform: in [-1, 1); the others: unit variance, and
  // paretonormal netem's mix).
  double Standard(Rng& rng) {
    switch (dist_) {
      case DelayDist::kUniform: return 2 * rng.Uniform() - 1;
      case DelayDist::kNormal: return rng.Normal();
      case DelayDist::kPareto: return Pareto(rng);
      case DelayDist::kParetoNormal: return (rng.Normal() + 3 * Pareto(rng)) / 4;
    }
    return 0;
  }
  // (X - 1.5) / sqrt(0.75), X ~ Pareto(3, 1) = (1 - U)^(-1/3).
  static double Pareto(Rng& rng) {
    const double x = std::pow(1.0 - rng.Uniform(), -1.0 / 3.0);
    return (x - 1.5) / std::sqrt(0.75);
  }

  bool active_ = false;
  double mean_ = 0, jitter_ = 0, rho_ = 0;
  DelayDist dist_ = DelayDist::kUniform;
  double last_ = 0;
};

}  // namespace droce::lab
