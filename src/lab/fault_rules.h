// Fault rules for live links (DROCE_FAULT, `droce exec --fault`, droced
// `--fault`): the parser of their text. Linux netem's words where they fit
// (tc-netem(8): loss random|state|gemodel, delay ... distribution, reorder,
// duplicate, corrupt, rate), droce's filters (qp, opcode, psn, tx|rx) and
// scripted faults (drop ... count N, drop acks for T). Several rules are
// separated by ';'. No DPDK: the decision engine (lab/fault_engine.h) and
// its tests run on plain values. docs/LAB.md has the syntax.
#pragma once

#include <bitset>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace droce::lab {

// Which way a rule looks: frames about to be sent (just before
// rte_eth_tx_burst) or just received (just after rte_eth_rx_burst).
enum Direction : uint8_t {
  kTx = 1,
  kRx = 2,
};

enum class LossKind : uint8_t {
  kNone,
  kRandom,   // Bernoulli, optionally netem-correlated
  kState,    // netem's 4-state Markov chain (p13 p31 p32 p23 p14)
  kGemodel,  // Gilbert-Elliott (p r 1-h 1-k)
};

enum class DelayDist : uint8_t {
  kUniform,       // T ± J, uniform (netem's default when no table is named)
  kNormal,        // mean T, standard deviation J
  kPareto,        // mean T, Pareto(alpha 3) standardised, times J
  kParetoNormal,  // mean T, (normal + 3 pareto) / 4 times J, as netem's table
};

// Probabilities are fractions in [0, 1] (the text gives percentages).
struct FaultRule {
  std::string text;  // the rule as written, trimmed (for reports)

  // Filters: a packet matches when every filter given matches.
  uint8_t dirs = kTx;  // kTx, kRx or both; `tx`/`rx` words (netem is egress: tx by default)
  bool has_qp = false;
  uint32_t qp = 0;  // BTH destination QP
  bool has_opcode = false;
  std::bitset<256> opcodes;  // BTH opcodes
  bool has_psn = false;
  uint32_t psn_lo = 0, psn_hi = 0;  // inclusive

  // Models.
  LossKind loss = LossKind::kNone;
  // kRandom: p[0] = P. kState: p13, p31, p32, p23, p14. kGemodel: p, r,
  // 1-h (loss in the bad state), 1-k (loss in the good state).
  double loss_p[5] = {0, 0, 0, 0, 0};
  double loss_corr = 0;
  // netem's `ecn`: what the loss model would drop is marked ECN CE instead
  // when the packet is ECN-capable (a congested switch's RED/ECN; DCQCN's
  // notification point answers with CNPs); other packets are still dropped.
  bool ecn = false;
  bool has_delay = false;
  uint64_t delay_ns = 0, jitter_ns = 0;
  double delay_corr = 0;
  DelayDist dist = DelayDist::kUniform;
  bool has_reorder = false;
  double reorder_p = 0, reorder_corr = 0;
  uint32_t gap = 1;
  double duplicate_p = 0, duplicate_corr = 0;
  double corrupt_p = 0, corrupt_corr = 0;
  uint64_t rate_bps = 0;  // 0: no rate limit

  // Scripted: `drop` drops every matching packet, for at most `count`
  // packets (0: no limit) and/or during `for` after the rule starts (0: no
  // window).
  bool drop = false;
  uint64_t drop_count = 0;
  uint64_t drop_for_ns = 0;

  bool has_seed = false;
  uint64_t seed = 0;
};

// Parses "RULE[; RULE...]" (empty rules between ';' are ignored). An error
// names the rule (1-based) and the word it refused, e.g.
// "rule 1 'loss randum 10%': unknown loss model 'randum' (random, state or gemodel)".
absl::StatusOr<std::vector<FaultRule>> ParseFaultRules(const std::string& text);

// One value of the text: a percentage ("10%" or "10", as tc reads them) as a
// fraction; a time ("5ms", "250us", "1.5s", "100ns"; a bare number is µs, as
// in tc); a rate in bit/s ("100M", "1Gbit", "500kbit", "9600").
bool ParsePercent(const std::string& s, double* fraction);
bool ParseTime(const std::string& s, uint64_t* ns);
bool ParseRate(const std::string& s, uint64_t* bps);

}  // namespace droce::lab
