#include "lab/fault_engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace droce::lab {

FaultEngine::FaultEngine(std::vector<FaultRule> rules, uint64_t salt) {
  rules_.reserve(rules.size());
  for (size_t i = 0; i < rules.size(); ++i) {
    State s;
    s.rule = std::move(rules[i]);
    const uint64_t seed = s.rule.has_seed ? s.rule.seed : i + 1;
    // The salt (worker index) is mixed in so that workers draw different
    // dice; worker 0 (salt 0) draws exactly the rule's seed.
    s.rng = Rng(seed ^ (salt * 0xD1B54A32D192ED03ull));
    s.loss = LossModel(s.rule);
    s.delay = DelayModel(s.rule);
    s.dup_u = CorrelatedUniform(s.rule.duplicate_corr);
    s.corrupt_u = CorrelatedUniform(s.rule.corrupt_corr);
    s.reorder_u = CorrelatedUniform(s.rule.reorder_corr);
    dirs_ |= s.rule.dirs;
    rules_.push_back(std::move(s));
  }
}

void FaultEngine::Start(uint64_t now_ns) {
  started_ = true;
  start_ns_ = now_ns;
}

bool FaultEngine::Matches(const FaultRule& r, const PacketInfo& p) {
  if ((r.dirs & p.dir) == 0) return false;
  if (r.has_qp && p.qpn != r.qp) return false;
  if (r.has_opcode && !r.opcodes.test(p.opcode)) return false;
  if (r.has_psn && (p.psn < r.psn_lo || p.psn > r.psn_hi)) return false;
  return true;
}

Decision FaultEngine::Decide(const PacketInfo& p) {
  if (!started_) Start(p.now_ns);
  Decision d;
  d.at_ns = p.now_ns;
  for (size_t i = 0; i < rules_.size(); ++i) {
    State& s = rules_[i];
    if (!Matches(s.rule, p)) continue;
    Apply(s, static_cast<uint16_t>(i + 1), p, &d);
    if (d.drop) break;
  }
  return d;
}

void FaultEngine::Apply(State& s, uint16_t number, const PacketInfo& p, Decision* d) {
  const FaultRule& r = s.rule;
  RuleCounters& c = s.counters;
  ++c.matched;
  // Scripted drops first: they draw no random numbers.
  if (r.drop) {
    const bool in_window = r.drop_for_ns == 0 || p.now_ns < start_ns_ + r.drop_for_ns;
    const bool in_count = r.drop_count == 0 || c.dropped < r.drop_count;
    if (in_window && in_count) {
      ++c.dropped;
      d->drop = true;
      d->drop_rule = number;
      return;
    }
  }
  // The dice, in a fixed order and number per model configured.
  if (s.loss.active() && s.loss.Lost(s.rng)) {
    if (r.ecn && p.ecn != 0) {
      // netem's ecn: an ECN-capable packet is marked, not lost (one
      // already CE stays so, counted as marked again).
      ++c.marked;
      d->mark_ce = true;
      d->ce_rule = number;
    } else {
      ++c.dropped;
      d->drop = true;
      d->drop_rule = number;
      return;
    }
  }
  if (r.corrupt_p > 0 && s.corrupt_u.Next(s.rng) < r.corrupt_p) {
    ++c.corrupted;
    d->corrupt = true;
    d->corrupt_rule = number;
    d->corrupt_salt = static_cast<uint32_t>(s.rng.Next());
  }
  if (r.duplicate_p > 0 && s.dup_u.Next(s.rng) < r.duplicate_p) {
    ++c.duplicated;
    d->duplicate = true;
    d->duplicate_rule = number;
  }
  bool reordered = false;
  if (r.has_reorder) {
    // netem: with a delay, the first gap-1 packets after a reordered one are
    // delayed, and each later one goes at once with probability P; without a
    // delay (droce), a packet drawn with probability P waits behind the next
    // `gap` packets.
    const double u = s.reorder_u.Next(s.rng);
    if (r.has_delay) {
      if (s.reorder_count + 1 >= r.gap && u < r.reorder_p) {
        reordered = true;
        s.reorder_count = 0;
      } else {
        ++s.reorder_count;
      }
    } else if (u < r.reorder_p) {
      reordered = true;
      d->hold_packets = std::max(d->hold_packets, r.gap);
      d->release_ns = std::max(d->release_ns, p.now_ns + kReorderHoldMaxNs);
    }
  }
  if (reordered) {
    ++c.reordered;
    d->reorder_rule = number;
  }
  uint64_t release = 0;
  if (s.delay.active()) {
    const uint64_t delay = s.delay.Sample(s.rng);  // drawn even when reordered: decisions stay aligned
    if (!reordered) release = p.now_ns + delay;
  }
  if (r.rate_bps != 0) {
    // A link of rate R: the packet leaves when the previous one is out, after
    // its own serialisation time (netem's rate, without its overhead words).
    const uint64_t start = std::max(std::max(p.now_ns, release), s.rate_free_ns);
    const uint64_t tx_ns = (uint64_t{p.len} * 8 * 1'000'000'000ull) / r.rate_bps;
    s.rate_free_ns = start + tx_ns;
    release = s.rate_free_ns;
  }
  if (release > p.now_ns) {
    ++c.delayed;
    if (release >= d->release_ns) d->delay_rule = number;
    d->release_ns = std::max(d->release_ns, release);
  }
}

std::vector<std::string> FaultEngine::Report() const {
  std::vector<std::string> out;
  for (size_t i = 0; i < rules_.size(); ++i) {
    const RuleCounters& c = rules_[i].counters;
    out.push_back(absl::StrCat("rule ", i + 1, " '", rules_[i].rule.text, "': matched ", c.matched, ", dropped ",
                               c.dropped, ", corrupted ", c.corrupted, ", marked ", c.marked, ", duplicated ", c.duplicated, ", delayed ",
                               c.delayed, ", reordered ", c.reordered));
  }
  return out;
}

}  // namespace droce::lab
