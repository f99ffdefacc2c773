// The fault decision engine: for each packet (direction, BTH destination
// QP, opcode, PSN, length, time) what the rules do to it — drop, corrupt,
// duplicate, delay until a time, or hold back behind later packets
// (reorder) — with counters per rule. No DPDK: the engine's stage
// (engine/fault_stage.cc) applies the decisions to mbufs, the unit tests to
// plain values in virtual time.
//
// Every rule whose filters match applies, in order: any drop drops the
// packet (and ends the walk), corruption and duplication by any rule apply
// once, the latest release time wins. Each rule has its own generator,
// seeded by `seed S` (default: the rule's position), mixed with a salt (the
// worker index, so that two workers do not draw the same dice), and draws a
// fixed number of numbers per matching packet: the same seed and the same
// packets give the same decisions, and adding a rule leaves the others'
// decisions alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lab/fault_rules.h"
#include "lab/models.h"

namespace droce::lab {

struct PacketInfo {
  Direction dir = kTx;
  uint32_t qpn = 0;  // BTH destination QP
  uint8_t opcode = 0;
  uint32_t psn = 0;
  uint32_t len = 0;  // frame bytes, for `rate`
  uint8_t ecn = 0;   // the packet's ECN bits: ECT(0)/ECT(1) may be marked CE instead of dropped
  uint64_t now_ns = 0;
};

struct Decision {
  bool drop = false;
  bool corrupt = false;
  bool mark_ce = false;  // set ECN CE (a loss model with `ecn`)
  bool duplicate = false;
  // Send (or deliver) no earlier than this; 0: now.
  uint64_t release_ns = 0;
  // reorder without a delay: held until this many later packets of the same
  // direction have passed (or until release_ns, the hold's time limit).
  uint32_t hold_packets = 0;
  // Which byte to flip and how (the stage picks a byte in the ICRC from it).
  uint32_t corrupt_salt = 0;
  // Which rule (1-based; the last one to act) did each, for the capture's
  // comments; and when the decision was taken (the packet's now_ns).
  uint16_t drop_rule = 0, corrupt_rule = 0, duplicate_rule = 0, delay_rule = 0, reorder_rule = 0, ce_rule = 0;
  uint64_t at_ns = 0;
  bool passes() const { return !drop && !corrupt && !mark_ce && !duplicate && release_ns == 0 && hold_packets == 0; }
};

// What one rule did; one writer (the worker owning the engine).
struct RuleCounters {
  uint64_t matched = 0;     // packets that matched its filters
  uint64_t dropped = 0;     // lost (loss model or drop)
  uint64_t corrupted = 0;   // a byte of the ICRC flipped
  uint64_t marked = 0;      // ECN CE set instead of a drop (`ecn`)
  uint64_t duplicated = 0;  // sent (delivered) twice
  uint64_t delayed = 0;     // held until a later time (delay, rate)
  uint64_t reordered = 0;   // sent out of order (reorder)
  void Add(const RuleCounters& x) {
    matched += x.matched;
    dropped += x.dropped;
    corrupted += x.corrupted;
    marked += x.marked;
    duplicated += x.duplicated;
    delayed += x.delayed;
    reordered += x.reordered;
  }
};

// Every RuleCounters field with its name and what it counts, in the order
// reports list them (DROCE_STATS, `droce ctl fault show`, the Prometheus
// text, DPDK telemetry).
struct RuleCounterField {
  const char* name;
  uint64_t RuleCounters::*field;
  const char* help;
};
inline constexpr RuleCounterField kRuleCounterFields[] = {
    {"matched", &RuleCounters::matched, "frames the fault rule's filters matched"},
    {"dropped", &RuleCounters::dropped, "frames the fault rule dropped"},
    {"corrupted", &RuleCounters::corrupted, "frames the fault rule corrupted"},
    {"marked", &RuleCounters::marked, "frames the fault rule marked ECN CE"},
    {"duplicated", &RuleCounters::duplicated, "frames the fault rule duplicated"},
    {"delayed", &RuleCounters::delayed, "frames the fault rule delayed"},
    {"reordered", &RuleCounters::reordered, "frames the fault rule reordered"},
};

// A reordered packet without a delay waits at most this long for its gap.
inline constexpr uint64_t kReorderHoldMaxNs = 1'000'000;

class FaultEngine {
 public:
  explicit FaultEngine(std::vector<FaultRule> rules, uint64_t salt = 0);

  // The rules' time windows (drop ... for T) start here; without a call, at
  // the first packet.
  void Start(uint64_t now_ns);
  Decision Decide(const PacketInfo& p);

  size_t rules() const { return rules_.size(); }
  const FaultRule& rule(size_t i) const { return rules_[i].rule; }
  const RuleCounters& counters(size_t i) const { return rules_[i].counters; }
  // Whether any rule looks at this direction (the stage skips the other).
  bool looks_at(Direction d) const { return (dirs_ & d) != 0; }

  // "rule N 'TEXT': matched M, dropped D, ..." for each rule.
  std::vector<std::string> Report() const;

 private:
  struct State {
    FaultRule rule;
    Rng rng;
    LossModel loss;
    DelayModel delay;
    CorrelatedUniform dup_u, corrupt_u, reorder_u;
    uint64_t rate_free_ns = 0;  // when the rate's "wire" is free again
    uint32_t reorder_count = 0;  // netem's gap counter (with a delay)
    RuleCounters counters;
  };
  static bool Matches(const FaultRule& r, const PacketInfo& p);
  void Apply(State& s, uint16_t number, const PacketInfo& p, Decision* d);

  std::vector<State> rules_;
  uint8_t dirs_ = 0;
  bool started_ = false;
  uint64_t start_ns_ = 0;
};

}  // namespace droce::lab
