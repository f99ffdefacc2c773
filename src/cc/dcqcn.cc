// DCQCN's reaction point and the parameter parser (cc/dcqcn.h).
#include "cc/dcqcn.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"
#include "absl/strings/strip.h"

namespace droce::cc {
namespace {

struct Knob {
  const char* name;
  uint32_t DcqcnParams::*field;
  uint32_t min, max;
};
// Ranges: what ConnectX's firmware accepts where known (mlxconfig's field
// widths), else what keeps the arithmetic meaningful.
constexpr Knob kKnobs[] = {
    {"rpg_time_reset", &DcqcnParams::rpg_time_reset, 1, 131071},
    {"rpg_byte_reset", &DcqcnParams::rpg_byte_reset, 0, 1u << 30},
    {"rpg_threshold", &DcqcnParams::rpg_threshold, 1, 31},
    {"rpg_max_rate", &DcqcnParams::rpg_max_rate, 0, 400000},
    {"rpg_ai_rate", &DcqcnParams::rpg_ai_rate, 1, 100000},
    {"rpg_hai_rate", &DcqcnParams::rpg_hai_rate, 1, 100000},
    {"rpg_gd", &DcqcnParams::rpg_gd, 1, 15},
    {"rpg_min_dec_fac", &DcqcnParams::rpg_min_dec_fac, 1, 100},
    {"rpg_min_rate", &DcqcnParams::rpg_min_rate, 1, 400000},
    {"rate_to_set_on_first_cnp", &DcqcnParams::rate_to_set_on_first_cnp, 0, 400000},
    {"dce_tcp_g", &DcqcnParams::dce_tcp_g, 0, 1023},
    {"dce_tcp_rtt", &DcqcnParams::dce_tcp_rtt, 1, 131071},
    {"initial_alpha_value", &DcqcnParams::initial_alpha_value, 0, 1023},
    {"rate_reduce_monitor_period", &DcqcnParams::rate_reduce_monitor_period, 0, 131071},
    {"clamp_tgt_rate", &DcqcnParams::clamp_tgt_rate, 0, 1},
    {"clamp_tgt_rate_after_time_inc", &DcqcnParams::clamp_tgt_rate_after_time_inc, 0, 1},
    {"min_time_between_cnps", &DcqcnParams::min_time_between_cnps, 0, 131071},
    {"cnp_dscp", &DcqcnParams::cnp_dscp, 0, 63},
    {"cnp_802p_prio", &DcqcnParams::cnp_802p_prio, 0, 7},
};

constexpr uint64_t kUs = 1000;

}  // namespace

absl::Status ParseDcqcnParams(const std::string& text, DcqcnParams* out) {
  DcqcnParams p = *out;
  for (absl::string_view item : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    const size_t eq = item.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("'", item, "': expected name=value"));
    }
    const absl::string_view name = item.substr(0, eq), value = item.substr(eq + 1);
    const Knob* k = std::find_if(std::begin(kKnobs), std::end(kKnobs), [&](const Knob& kn) { return name == kn.name; });
    if (k == std::end(kKnobs)) {
      return absl::InvalidArgumentError(absl::StrCat("'", name, "' is not a DCQCN parameter (e.g. rpg_ai_rate, dce_tcp_g)"));
    }
    uint32_t v = 0;
    if (!absl::SimpleAtoi(value, &v) || v < k->min || v > k->max) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "='", value, "': expected an integer from ", k->min, " to ", k->max));
    }
    p.*(k->field) = v;
  }
  *out = p;
  return absl::OkStatus();
}

std::string FormatDcqcnParams(const DcqcnParams& p) {
  std::string s;
  for (const Knob& k : kKnobs) absl::StrAppend(&s, s.empty() ? "" : ",", k.name, "=", p.*(k.field));
  return s;
}

void ReactionPoint::Configure(const DcqcnParams& p, double line_mbps) {
  p_ = p;
  max_ = p.rpg_max_rate != 0 ? std::min<double>(p.rpg_max_rate, line_mbps) : line_mbps;
  min_ = std::min<double>(p.rpg_min_rate, max_);
  g_ = (1024.0 - p.dce_tcp_g) / 1024.0;
  Deactivate();
}

void ReactionPoint::Deactivate() {
  active_ = false;
  rc_ = rt_ = max_;
  cut_pending_ = cnp_for_alpha_ = false;
  bytes_ = 0;
  t_stage_ = b_stage_ = 0;
}

uint64_t ReactionPoint::next_event_ns() const {
  if (!active_) return UINT64_MAX;
  uint64_t t = std::min(next_alpha_ns_, next_timer_ns_);
  if (cut_pending_) t = std::min(t, cut_at_ns_);
  return t;
}

void ReactionPoint::OnCnp(uint64_t now_ns) {
  Advance(now_ns);
  if (!active_) {
    // The first CNP allocates a rate limiter (ConnectX: at
    // rate_to_set_on_first_cnp, 0 meaning the current rate) with alpha at
    // its initial value, which stands for this CNP's sample; the monitor
    // periods start here.
    active_ = true;
    alpha_ = p_.initial_alpha_value / 1024.0;
    if (p_.rate_to_set_on_first_cnp != 0) rc_ = std::clamp<double>(p_.rate_to_set_on_first_cnp, min_, max_);
    rt_ = rc_;
    next_alpha_ns_ = now_ns + p_.dce_tcp_rtt * kUs;
    // Nothing to recover from until the first cut: the timer and the byte
    // counter start there.
    next_timer_ns_ = UINT64_MAX;
    cnp_for_alpha_ = false;
    t_stage_ = b_stage_ = 0;
    bytes_ = 0;
    period_origin_ns_ = now_ns;
  } else {
    cnp_for_alpha_ = true;
  }
  if (p_.rate_reduce_monitor_period == 0) {
    Cut(now_ns);
    return;
  }
  if (!cut_pending_) {
    // "the flow rate is reduced at the beginning of the next
    // rate_reduce_monitor_period interval" (ConnectX's description).
    const uint64_t period = p_.rate_reduce_monitor_period * kUs;
    cut_pending_ = true;
    cut_at_ns_ = period_origin_ns_ + ((now_ns - period_origin_ns_) / period + 1) * period;
  }
}

void ReactionPoint::Cut(uint64_t at_ns) {
  // The target remembers the rate before the cut, for fast recovery; with
  // clamp_tgt_rate_after_time_inc only if the timer raised the rate since
  // the last cut (byte-counter increases alone leave the target where the
  // last clamp put it), and always with clamp_tgt_rate.
  if (p_.clamp_tgt_rate != 0 || (p_.clamp_tgt_rate_after_time_inc != 0 && t_stage_ > 0)) rt_ = rc_;
  // Rc = Rc (1 - alpha / 2^(rpg_gd - 10)), alpha in 1/1024: with rpg_gd 11
  // the paper's Rc (1 - alpha / 2); one cut keeps at least rpg_min_dec_fac %.
  const double cut = alpha_ * 1024.0 / static_cast<double>(1u << p_.rpg_gd);
  const double keep = std::max(1.0 - cut, p_.rpg_min_dec_fac / 100.0);
  rc_ = std::max(min_, rc_ * keep);
  t_stage_ = b_stage_ = 0;
  bytes_ = 0;
  next_timer_ns_ = at_ns + p_.rpg_time_reset * kUs;
  cut_pending_ = false;
  ++cuts_;
}

void ReactionPoint::Increase(bool from_timer) {
  // The stages before this event decide the phase (ns-3's Mellanox model,
  // extended to the byte counter as in the paper): fast recovery while both
  // are below F, hyper increase once both are above, additive otherwise.
  // With the byte counter off the timer's stage stands for both.
  const uint32_t t = t_stage_;
  const uint32_t b = p_.rpg_byte_reset != 0 ? b_stage_ : t_stage_;
  const uint32_t f = p_.rpg_threshold;
  if (std::max(t, b) < f) {
    // fast recovery: the rate halves its distance to the target
  } else if (std::min(t, b) > f) {
    rt_ += p_.rpg_hai_rate;
  } else {
    rt_ += p_.rpg_ai_rate;
  }
  rt_ = std::min(rt_, max_);
  rc_ = (rt_ + rc_) / 2;
  if (from_timer) {
    ++t_stage_;
  } else {
    ++b_stage_;
  }
  ++increases_;
  // Within 1 Mb/s (the knobs' unit) of the ceiling the limiter is released.
  if (rc_ > max_ - 1.0) Deactivate();
}

void ReactionPoint::OnSent(uint32_t bytes, uint64_t now_ns) {
  if (!active_) return;
  Advance(now_ns);
  if (!active_ || p_.rpg_byte_reset == 0 || next_timer_ns_ == UINT64_MAX) return;
  bytes_ += bytes;
  while (active_ && bytes_ >= p_.rpg_byte_reset) {
    bytes_ -= p_.rpg_byte_reset;
    Increase(false);
  }
}

void ReactionPoint::Advance(uint64_t now_ns) {
  const uint64_t rtt = p_.dce_tcp_rtt * kUs;
  while (active_) {
    const uint64_t cut_at = cut_pending_ ? cut_at_ns_ : UINT64_MAX;
    const uint64_t t = std::min({next_alpha_ns_, cut_at, next_timer_ns_});
    if (t > now_ns) return;
    if (next_alpha_ns_ == t) {
      // alpha = (1 - g) alpha + g * [a CNP came in the last dce_tcp_rtt].
      if (cnp_for_alpha_) {
        alpha_ = (1 - g_) * alpha_ + g_;
        cnp_for_alpha_ = false;
        next_alpha_ns_ += rtt;
      } else {
        // Updates without CNP up to the next other event: alpha decays
        // geometrically, in one step.
        const uint64_t until = std::min({cut_at, next_timer_ns_, now_ns});
        const uint64_t k = (until - next_alpha_ns_) / rtt + 1;
        alpha_ *= std::pow(1 - g_, static_cast<double>(k));
        next_alpha_ns_ += k * rtt;
      }
    } else if (cut_at == t) {
      Cut(t);
    } else {
      next_timer_ns_ += p_.rpg_time_reset * kUs;
      Increase(true);
    }
  }
}

}  // namespace droce::cc
