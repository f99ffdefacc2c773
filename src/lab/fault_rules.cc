#include "lab/fault_rules.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace droce::lab {
namespace {

// IBA 9.2 table 35 names (lower case, as `opcode NAME` takes them).
struct OpcodeName {
  const char* name;
  uint8_t code;
};
constexpr OpcodeName kOpcodeNames[] = {
    {"rc_send_first", 0x00},          {"rc_send_middle", 0x01},
    {"rc_send_last", 0x02},           {"rc_send_last_imm", 0x03},
    {"rc_send_only", 0x04},           {"rc_send_only_imm", 0x05},
    {"rc_write_first", 0x06},         {"rc_write_middle", 0x07},
    {"rc_write_last", 0x08},          {"rc_write_last_imm", 0x09},
    {"rc_write_only", 0x0A},          {"rc_write_only_imm", 0x0B},
    {"rc_read_request", 0x0C},        {"rc_read_response_first", 0x0D},
    {"rc_read_response_middle", 0x0E}, {"rc_read_response_last", 0x0F},
    {"rc_read_response_only", 0x10},  {"rc_ack", 0x11},
    {"ack", 0x11},                    {"rc_atomic_ack", 0x12},
    {"atomic_ack", 0x12},             {"rc_compare_swap", 0x13},
    {"rc_fetch_add", 0x14},           {"rc_send_last_inv", 0x16},
    {"rc_send_only_inv", 0x17},       {"uc_send_first", 0x20},
    {"uc_send_middle", 0x21},         {"uc_send_last", 0x22},
    {"uc_send_last_imm", 0x23},       {"uc_send_only", 0x24},
    {"uc_send_only_imm", 0x25},       {"uc_write_first", 0x26},
    {"uc_write_middle", 0x27},        {"uc_write_last", 0x28},
    {"uc_write_last_imm", 0x29},      {"uc_write_only", 0x2A},
    {"uc_write_only_imm", 0x2B},      {"ud_send_only", 0x64},
    {"ud_send_only_imm", 0x65},       {"cnp", 0x81},
};

bool IsNumber(const std::string& s) {
  return !s.empty() && (std::isdigit(static_cast<unsigned char>(s[0])) || s[0] == '.');
}

// A decimal number with an optional fraction, then a suffix: "1.5ms" → 1.5, "ms".
bool SplitNumber(const std::string& s, double* v, std::string* suffix) {
  size_t i = 0;
  bool digits = false, dot = false;
  for (; i < s.size(); ++i) {
    if (std::isdigit(static_cast<unsigned char>(s[i]))) {
      digits = true;
    } else if (s[i] == '.' && !dot) {
      dot = true;
    } else {
      break;
    }
  }
  if (!digits) return false;
  *v = std::strtod(s.substr(0, i).c_str(), nullptr);
  *suffix = s.substr(i);
  return std::isfinite(*v);
}

bool ParseU64(const std::string& s, uint64_t* v) {
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    const std::string hex = s.substr(2);
    return hex.find_first_not_of("0123456789abcdefABCDEF") == std::string::npos && absl::SimpleHexAtoi(hex, v);
  }
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos && absl::SimpleAtoi(s, v);
}

class RuleParser {
 public:
  RuleParser(std::string text, int index)
      : text_(std::move(text)), index_(index), words_(absl::StrSplit(text_, absl::ByAnyChar(" \t\n"), absl::SkipEmpty())) {}

  absl::StatusOr<FaultRule> Run() {
    FaultRule r;
    r.text = text_;
    bool saw_dir = false;
    bool saw_drop_target = false;
    while (pos_ < words_.size()) {
      const std::string w = absl::AsciiStrToLower(words_[pos_++]);
      if (w == "loss") {
        if (r.loss != LossKind::kNone) return Error("'loss' given twice");
        if (absl::Status s = Loss(&r); !s.ok()) return s;
      } else if (w == "delay") {
        if (r.has_delay) return Error("'delay' given twice");
        if (absl::Status s = Delay(&r); !s.ok()) return s;
      } else if (w == "distribution") {
        if (!r.has_delay) return Error("'distribution' needs a 'delay T J' before it");
        if (absl::Status s = Distribution(&r); !s.ok()) return s;
      } else if (w == "reorder") {
        if (r.has_reorder) return Error("'reorder' given twice");
        r.has_reorder = true;
        if (absl::Status s = ProbabilityAndCorrelation("reorder", &r.reorder_p, &r.reorder_corr); !s.ok()) return s;
      } else if (w == "gap") {
        uint64_t g = 0;
        const std::string v = Next();
        if (!ParseU64(v, &g) || g < 1 || g > 1000) return Error(absl::StrCat("'gap ", v, "': a packet count, 1 to 1000"));
        r.gap = static_cast<uint32_t>(g);
      } else if (w == "duplicate") {
        if (absl::Status s = ProbabilityAndCorrelation("duplicate", &r.duplicate_p, &r.duplicate_corr); !s.ok()) return s;
      } else if (w == "ecn") {
        r.ecn = true;
      } else if (w == "corrupt") {
        if (absl::Status s = ProbabilityAndCorrelation("corrupt", &r.corrupt_p, &r.corrupt_corr); !s.ok()) return s;
      } else if (w == "rate") {
        const std::string v = Next();
        if (!ParseRate(v, &r.rate_bps) || r.rate_bps == 0) {
          return Error(absl::StrCat("'rate ", v, "': a rate in bit/s, e.g. 9600, 500k, 100M, 1Gbit"));
        }
      } else if (w == "qp") {
        uint64_t q = 0;
        const std::string v = Next();
        if (!ParseU64(v, &q) || q > 0xFFFFFF) return Error(absl::StrCat("'qp ", v, "': a QP number (0 to 0xffffff)"));
        r.has_qp = true;
        r.qp = static_cast<uint32_t>(q);
        saw_drop_target = true;
      } else if (w == "opcode") {
        if (absl::Status s = Opcode(&r); !s.ok()) return s;
      } else if (w == "acks") {
        r.has_opcode = true;
        r.opcodes.set(0x11);
        r.opcodes.set(0x12);
        saw_drop_target = true;
      } else if (w == "psn") {
        if (absl::Status s = Psn(&r); !s.ok()) return s;
        saw_drop_target = true;
      } else if (w == "tx" || w == "rx") {
        r.dirs = saw_dir ? (r.dirs | (w == "tx" ? kTx : kRx)) : (w == "tx" ? kTx : kRx);
        saw_dir = true;
      } else if (w == "seed") {
        const std::string v = Next();
        if (!ParseU64(v, &r.seed)) return Error(absl::StrCat("'seed ", v, "': a number"));
        r.has_seed = true;
      } else if (w == "drop") {
        r.drop = true;
      } else if (w == "count") {
        const std::string v = Next();
        if (!r.drop) return Error("'count' belongs to 'drop' (drop psn X qp Y count N)");
        if (!ParseU64(v, &r.drop_count) || r.drop_count == 0) return Error(absl::StrCat("'count ", v, "': a count of at least 1"));
      } else if (w == "for") {
        const std::string v = Next();
        if (!r.drop) return Error("'for' belongs to 'drop' (drop acks for 5ms)");
        if (!ParseTime(v, &r.drop_for_ns) || r.drop_for_ns == 0) {
          return Error(absl::StrCat("'for ", v, "': a time, e.g. 5ms, 250us, 1s"));
        }
      } else {
        return Error(absl::StrCat("unknown word '", words_[pos_ - 1], "'"));
      }
    }
    const bool model = r.loss != LossKind::kNone || r.has_delay || r.has_reorder || r.duplicate_p > 0 ||
                       r.corrupt_p > 0 || r.rate_bps != 0 || r.drop;
    if (!model) return Error("no fault in it (loss, delay, reorder, duplicate, corrupt, rate or drop)");
    if (r.ecn && r.loss == LossKind::kNone) return Error("'ecn' marks what a loss model would drop: give one (e.g. loss random 1% ecn)");
    if (r.drop && !saw_drop_target && r.drop_count == 0 && r.drop_for_ns == 0) {
      return Error("'drop' alone would drop everything: name what (psn, qp, acks, opcode) or limit it (count, for)");
    }
    (void)saw_drop_target;
    return r;
  }

 private:
  absl::Status Error(const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrCat("rule ", index_, " '", text_, "': ", why));
  }
  std::string Next() { return pos_ < words_.size() ? words_[pos_++] : std::string(); }
  bool NextIsNumber() const { return pos_ < words_.size() && IsNumber(words_[pos_]); }

  absl::Status Percent(const std::string& what, const std::string& v, double* out) {
    if (!ParsePercent(v, out)) {
      return Error(absl::StrCat(what, ": '", v.empty() ? "(nothing)" : v, "' is not a percentage (0 to 100, e.g. 10%)"));
    }
    return absl::OkStatus();
  }

  absl::Status ProbabilityAndCorrelation(const std::string& what, double* p, double* corr) {
    if (absl::Status s = Percent(what, Next(), p); !s.ok()) return s;
    if (!NextIsNumber()) return absl::OkStatus();
    if (absl::Status s = Percent(what + " correlation", Next(), corr); !s.ok()) return s;
    // netem's correlated uniform never moves at 100 %: refuse it, as for delay.
    if (*corr >= 1) return Error(absl::StrCat(what, " correlation: below 100%"));
    return absl::OkStatus();
  }

  absl::Status Loss(FaultRule* r) {
    std::string kind = absl::AsciiStrToLower(Next());
    if (IsNumber(kind)) {  // tc: `loss 10%` is `loss random 10%`
      --pos_;
      kind = "random";
    }
    if (kind == "random") {
      r->loss = LossKind::kRandom;
      return ProbabilityAndCorrelation("loss random", &r->loss_p[0], &r->loss_corr);
    }
    if (kind == "state") {
      // iproute2's defaults for the parameters left out: p31 = 1 - p13,
      // p32 = 0, p23 = 1, p14 = 0 (tc/q_netem.c).
      r->loss = LossKind::kState;
      double* p = r->loss_p;
      if (absl::Status s = Percent("loss state p13", Next(), &p[0]); !s.ok()) return s;
      p[1] = 1 - p[0];
      p[2] = 0;
      p[3] = 1;
      p[4] = 0;
      const char* names[] = {"p13", "p31", "p32", "p23", "p14"};
      for (int i = 1; i < 5 && NextIsNumber(); ++i) {
        if (absl::Status s = Percent(absl::StrCat("loss state ", names[i]), Next(), &p[i]); !s.ok()) return s;
      }
      if (p[0] + p[4] > 1 + 1e-12) return Error("loss state: p13 + p14 is more than 100%");
      if (p[1] + p[2] > 1 + 1e-12) return Error("loss state: p31 + p32 is more than 100%");
      return absl::OkStatus();
    }
    if (kind == "gemodel") {
      // iproute2's defaults: r = 1 - p, 1-h = 100% (the bad state loses
      // every packet), 1-k = 0% (the good state none).
      r->loss = LossKind::kGemodel;
      double* p = r->loss_p;
      if (absl::Status s = Percent("loss gemodel p", Next(), &p[0]); !s.ok()) return s;
      p[1] = 1 - p[0];
      p[2] = 1;
      p[3] = 0;
      const char* names[] = {"p", "r", "1-h", "1-k"};
      for (int i = 1; i < 4 && NextIsNumber(); ++i) {
        if (absl::Status s = Percent(absl::StrCat("loss gemodel ", names[i]), Next(), &p[i]); !s.ok()) return s;
      }
      return absl::OkStatus();
    }
    return Error(absl::StrCat("unknown loss model '", kind.empty() ? "(nothing)" : kind,
                              "' (random, state, gemodel or a percentage)"));
  }

  absl::Status Delay(FaultRule* r) {
    const std::string t = Next();
    if (!ParseTime(t, &r->delay_ns)) return Error(absl::StrCat("delay: '", t.empty() ? "(nothing)" : t, "' is not a time (e.g. 5ms, 250us)"));
    r->has_delay = true;
    if (NextIsNumber()) {
      const std::string j = Next();
      if (!ParseTime(j, &r->jitter_ns)) return Error(absl::StrCat("delay jitter: '", j, "' is not a time"));
      if (NextIsNumber()) {
        if (absl::Status s = Percent("delay correlation", Next(), &r->delay_corr); !s.ok()) return s;
        if (r->delay_corr >= 1) return Error("delay correlation: below 100%");
      }
    }
    return absl::OkStatus();
  }

  absl::Status Distribution(FaultRule* r) {
    const std::string d = absl::AsciiStrToLower(Next());
    if (d == "uniform") r->dist = DelayDist::kUniform;
    else if (d == "normal") r->dist = DelayDist::kNormal;
    else if (d == "pareto") r->dist = DelayDist::kPareto;
    else if (d == "paretonormal") r->dist = DelayDist::kParetoNormal;
    else return Error(absl::StrCat("unknown distribution '", d.empty() ? "(nothing)" : d, "' (uniform, normal, pareto or paretonormal)"));
    return absl::OkStatus();
  }

  absl::Status Opcode(FaultRule* r) {
    const std::string v = Next();
    const std::string lower = absl::AsciiStrToLower(v);
    uint64_t code = 0;
    bool found = ParseU64(lower, &code) && code <= 0xFF;
    for (const OpcodeName& o : kOpcodeNames) {
      if (lower == o.name) {
        code = o.code;
        found = true;
      }
    }
    if (!found) return Error(absl::StrCat("opcode: '", v.empty() ? "(nothing)" : v, "' is not an opcode (a name such as rc_send_only or ack, or 0xNN)"));
    r->has_opcode = true;
    r->opcodes.set(code);
    return absl::OkStatus();
  }

  absl::Status Psn(FaultRule* r) {
    const std::string v = Next();
    const std::vector<std::string> parts = absl::StrSplit(v, '-');
    uint64_t lo = 0, hi = 0;
    bool ok = (parts.size() == 1 || parts.size() == 2) && ParseU64(parts[0], &lo);
    hi = lo;
    if (ok && parts.size() == 2) ok = ParseU64(parts[1], &hi);
    if (!ok || lo > 0xFFFFFF || hi > 0xFFFFFF || hi < lo) {
      return Error(absl::StrCat("psn: '", v.empty() ? "(nothing)" : v, "' is not a PSN or a range A-B (0 to 0xffffff, A <= B)"));
    }
    r->has_psn = true;
    r->psn_lo = static_cast<uint32_t>(lo);
    r->psn_hi = static_cast<uint32_t>(hi);
    return absl::OkStatus();
  }

  std::string text_;
  int index_;
  std::vector<std::string> words_;
  size_t pos_ = 0;
};

}  // namespace

bool ParsePercent(const std::string& s, double* fraction) {
  double v = 0;
  std::string suffix;
  if (!SplitNumber(s, &v, &suffix) || (!suffix.empty() && suffix != "%") || v > 100) return false;
  *fraction = v / 100;
  return true;
}

bool ParseTime(const std::string& s, uint64_t* ns) {
  double v = 0;
  std::string u;
  if (!SplitNumber(s, &v, &u)) return false;
  u = absl::AsciiStrToLower(u);
  double scale;
  if (u == "ns" || u == "nsec") scale = 1;
  else if (u.empty() || u == "us" || u == "usec" || u == "usecs") scale = 1e3;
  else if (u == "ms" || u == "msec" || u == "msecs") scale = 1e6;
  else if (u == "s" || u == "sec" || u == "secs") scale = 1e9;
  else return false;
  const double t = v * scale;
  if (t > 60e9) return false;  // a minute at most: frames are held in memory
  *ns = static_cast<uint64_t>(std::llround(t));
  return true;
}

bool ParseRate(const std::string& s, uint64_t* bps) {
  double v = 0;
  std::string u;
  if (!SplitNumber(s, &v, &u)) return false;
  if (u.size() >= 3 && absl::AsciiStrToLower(u.substr(u.size() - 3)) == "bit") u.resize(u.size() - 3);
  double scale;
  if (u.empty()) scale = 1;
  else if (u == "k" || u == "K") scale = 1e3;
  else if (u == "m" || u == "M") scale = 1e6;
  else if (u == "g" || u == "G") scale = 1e9;
  else return false;
  const double r = v * scale;
  if (r < 1 || r > 1e13) return false;
  *bps = static_cast<uint64_t>(std::llround(r));
  return true;
}

absl::StatusOr<std::vector<FaultRule>> ParseFaultRules(const std::string& text) {
  std::vector<FaultRule> out;
  int index = 0;
  for (absl::string_view part : absl::StrSplit(text, ';')) {
    const std::string rule(absl::StripAsciiWhitespace(part));
    if (rule.empty()) continue;
    absl::StatusOr<FaultRule> r = RuleParser(rule, ++index).Run();
    if (!r.ok()) return r.status();
    out.push_back(*std::move(r));
  }
  if (out.empty()) return absl::InvalidArgumentError(absl::StrCat("'", text, "' has no rule"));
  return out;
}

}  // namespace droce::lab
