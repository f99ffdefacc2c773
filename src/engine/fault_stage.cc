#include "engine/fault_stage.h"

#include <algorithm>

#include <rte_mbuf.h>

#include "absl/strings/str_cat.h"
#include "cc/switch.h"
#include "engine/capture_tap.h"
#include "lab/roce_peek.h"

namespace droce::engine {
namespace {

// Enough of a frame for the peek: Ethernet, a VLAN tag, IPv6, UDP and BTH.
constexpr uint32_t kPeekBytes = 128;

}  // namespace

FaultStage::FaultStage(std::vector<lab::FaultRule> rules, uint64_t salt, rte_mempool* pool, uint64_t now_ns)
    : salt_(salt), engine_(std::move(rules), salt), pool_(pool) {
  engine_.Start(now_ns);
  copies_.reserve(64);
}

void FaultStage::SetRules(std::vector<lab::FaultRule> rules, uint64_t now_ns) {
  engine_ = lab::FaultEngine(std::move(rules), salt_);
  engine_.Start(now_ns);
}

bool FaultStage::Judge(rte_mbuf* m, lab::Direction dir, uint64_t now_ns, lab::Decision* d) {
  const uint32_t len = rte_pktmbuf_pkt_len(m);
  uint8_t buf[kPeekBytes];
  const uint8_t* f = m->nb_segs == 1 ? rte_pktmbuf_mtod(m, const uint8_t*)
                                     : static_cast<const uint8_t*>(rte_pktmbuf_read(m, 0, std::min(len, kPeekBytes), buf));
  // Multi-segment: only the first kPeekBytes are copied, which is all the
  // peek reads (its offsets stay below 80); the lengths it checks are the
  // frame's.
  lab::RocePeek p;
  if (f == nullptr || !lab::PeekRoce(f, len, &p)) return false;
  icrc_off_ = p.icrc_offset;
  lab::PacketInfo info;
  info.dir = dir;
  info.qpn = p.dqpn;
  info.opcode = p.opcode;
  info.psn = p.psn;
  info.len = len;
  info.ecn = p.ecn;
  info.now_ns = now_ns;
  *d = engine_.Decide(info);
  return true;
}

void FaultStage::MarkCe(rte_mbuf* m) {
  // The IP header is in the first segment (PeekRoce read it there, or the
  // segment is shorter and MarkCe refuses).
  cc::MarkCe(rte_pktmbuf_mtod(m, uint8_t*), m->data_len);
}

void FaultStage::Corrupt(rte_mbuf* m, uint32_t salt) {
  // A byte of the ICRC: covered by nothing the receiver checks before the
  // ICRC over IPv4 (UDP checksum 0), so the peer counts icrc_err. Over IPv6
  // the UDP checksum covers it too.
  uint32_t off = icrc_off_ + (salt & 3);
  const auto x = static_cast<uint8_t>(1 + (salt >> 8) % 255);
  for (rte_mbuf* s = m; s != nullptr; s = s->next) {
    if (off < s->data_len) {
      rte_pktmbuf_mtod_offset(s, uint8_t*, off)[0] ^= x;
      return;
    }
    off -= s->data_len;
  }
}

bool FaultStage::Hold(lab::HoldQueue<rte_mbuf*>& q, rte_mbuf* m, const lab::Decision& d, uint64_t now_ns) {
  if (d.release_ns <= now_ns && d.hold_packets == 0) return false;
  if (q.Push(m, d.release_ns, d.hold_packets)) return true;
  ++overflow_;
  return false;
}

void FaultStage::OnTx(std::vector<rte_mbuf*>* tx, size_t from, uint64_t now_ns, CaptureTap* tap) {
  std::vector<rte_mbuf*>& v = *tx;
  size_t out = from;
  copies_.clear();
  for (size_t i = from; i < v.size(); ++i) {
    rte_mbuf* m = v[i];
    lab::Decision d;
    const bool judged = Judge(m, lab::kTx, now_ns, &d);
    if (tap != nullptr) [[unlikely]] tap->Add(lab::Capture::kTxEngine, m, judged ? &d : nullptr);
    if (!judged || d.passes()) {
      v[out++] = m;
      tx_hold_.Passed(1);
      continue;
    }
    if (d.drop) {
      rte_pktmbuf_free(m);
      continue;
    }
    // The copy before the corruption: one of the two arrives intact.
    if (d.duplicate) {
      if (rte_mbuf* c = rte_pktmbuf_copy(m, pool_, 0, UINT32_MAX); c != nullptr) copies_.push_back(c);
    }
    if (d.corrupt) Corrupt(m, d.corrupt_salt);
    if (d.mark_ce) MarkCe(m);
    if (Hold(tx_hold_, m, d, now_ns)) continue;
    v[out++] = m;
    tx_hold_.Passed(1);
  }
  if (tap != nullptr) [[unlikely]] tap->Commit(lab::Capture::kTxEngine);
  v.resize(out);
  for (rte_mbuf* c : copies_) {
    v.push_back(c);
    tx_hold_.Passed(1);
  }
  tx_hold_.Release(now_ns, [&v](rte_mbuf* m) { v.push_back(m); });
}

uint16_t FaultStage::OnRx(rte_mbuf** rx, uint16_t n, uint64_t now_ns, CaptureTap* tap) {
  uint16_t out = 0;
  for (uint16_t i = 0; i < n; ++i) {
    rte_mbuf* m = rx[i];
    lab::Decision d;
    const bool judged = Judge(m, lab::kRx, now_ns, &d);
    if (tap != nullptr) [[unlikely]] tap->Add(lab::Capture::kRxWire, m, judged ? &d : nullptr);
    if (!judged || d.passes()) {
      rx[out++] = m;
      rx_hold_.Passed(1);
      continue;
    }
    if (d.drop) {
      rte_pktmbuf_free(m);
      continue;
    }
    if (d.duplicate) {
      // Delivered right after this burst (ReleaseRx, due now).
      if (rte_mbuf* c = rte_pktmbuf_copy(m, pool_, 0, UINT32_MAX); c != nullptr) {
        if (!rx_hold_.Push(c, now_ns, 0)) {
          ++overflow_;
          rte_pktmbuf_free(c);
        }
      }
    }
    if (d.corrupt) Corrupt(m, d.corrupt_salt);
    if (d.mark_ce) MarkCe(m);
    if (Hold(rx_hold_, m, d, now_ns)) continue;
    rx[out++] = m;
    rx_hold_.Passed(1);
  }
  if (tap != nullptr) [[unlikely]] tap->Commit(lab::Capture::kRxWire);
  return out;
}

std::vector<RuleTotals> SumRules(const std::vector<const FaultStage*>& stages) {
  std::vector<RuleTotals> out;
  if (stages.empty()) return out;
  const lab::FaultEngine& first = stages[0]->engine();
  for (size_t i = 0; i < first.rules(); ++i) {
    RuleTotals t{first.rule(i).text, {}};
    for (const FaultStage* s : stages) {
      if (i < s->engine().rules()) t.counters.Add(s->engine().counters(i));
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<std::string> SumFaultReports(const std::vector<const FaultStage*>& stages) {
  std::vector<std::string> out;
  uint64_t overflow = 0;
  for (const FaultStage* s : stages) overflow += s->overflow();
  const std::vector<RuleTotals> rules = SumRules(stages);
  for (size_t i = 0; i < rules.size(); ++i) {
    std::string line = absl::StrCat("fault rule ", i + 1, " '", rules[i].text, "':");
    for (const lab::RuleCounterField& f : lab::kRuleCounterFields) {
      absl::StrAppend(&line, &f == lab::kRuleCounterFields ? " " : ", ", f.name, " ", rules[i].counters.*f.field);
    }
    out.push_back(std::move(line));
  }
  if (overflow != 0) out.push_back(absl::StrCat("fault stage: ", overflow, " frames not held (queue full: sent as they were)"));
  return out;
}

}  // namespace droce::engine
