// The fault stage on a live link (DROCE_FAULT): between the engine and the
// PMD, one per worker and direction — tx frames just before
// rte_eth_tx_burst, rx frames just after rte_eth_rx_burst. It reads only what
// the rules' filters need from the BTH (lab/roce_peek.h), asks the decision
// engine (lab/fault_engine.h) and acts on the mbuf: drop = free it, corrupt =
// flip a byte of the ICRC (the peer's ICRC check fails: icrc_err), duplicate
// = a copy (rte_pktmbuf_copy), delay and reorder = held in a small
// time-ordered queue (lab/hold_queue.h) released on later loop turns.
// Frames that are not RoCEv2 (ARP, ICMP, ND) pass untouched. Without rules
// the worker has no stage, and the loop pays one predictable branch per
// burst. Owned by its worker's driver, like the rest of the worker's state.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "lab/fault_engine.h"
#include "lab/hold_queue.h"

struct rte_mbuf;
struct rte_mempool;

namespace droce::engine {

class CaptureTap;

class FaultStage {
 public:
  // Frames held per direction at most; more are let go as they are
  // (counted in overflow()).
  static constexpr size_t kMaxHeld = 1024;

  FaultStage(std::vector<lab::FaultRule> rules, uint64_t salt, rte_mempool* pool, uint64_t now_ns);

  // Judges (*tx)[from..] in place: dropped frames are freed, delayed ones
  // held, copies appended; then appends the held frames now due (already
  // judged). A capture's tap, if any, records each frame as judged (point
  // "tx", before the stage acts).
  void OnTx(std::vector<rte_mbuf*>* tx, size_t from, uint64_t now_ns, CaptureTap* tap);
  // Judges rx[0..n) in place and returns how many to handle now; delayed
  // frames and copies wait for ReleaseRx. The tap records point "rx wire".
  uint16_t OnRx(rte_mbuf** rx, uint16_t n, uint64_t now_ns, CaptureTap* tap);
  // Hands the received frames now due to f(rte_mbuf*).
  template <typename F>
  void ReleaseRx(uint64_t now_ns, F&& f) {
    rx_hold_.Release(now_ns, f);
  }
  // Replaces the rules (droce ctl fault set/clear): new generators and
  // counters; frames already held keep their release times.
  void SetRules(std::vector<lab::FaultRule> rules, uint64_t now_ns);
  bool holding() const { return !tx_hold_.empty() || !rx_hold_.empty(); }
  const lab::FaultEngine& engine() const { return engine_; }
  uint64_t overflow() const { return overflow_; }

 private:
  // Whether m is a RoCEv2 frame; *d what the rules do to it.
  bool Judge(rte_mbuf* m, lab::Direction dir, uint64_t now_ns, lab::Decision* d);
  void Corrupt(rte_mbuf* m, uint32_t salt);
  void MarkCe(rte_mbuf* m);  // ECN CE (a loss rule with `ecn`)
  // Holds m per d (delay or reorder); false if the queue is full.
  bool Hold(lab::HoldQueue<rte_mbuf*>& q, rte_mbuf* m, const lab::Decision& d, uint64_t now_ns);

  uint64_t salt_;
  lab::FaultEngine engine_;
  lab::HoldQueue<rte_mbuf*> tx_hold_{kMaxHeld}, rx_hold_{kMaxHeld};
  rte_mempool* pool_;
  uint32_t icrc_off_ = 0;  // of the frame Judge last looked at
  uint64_t overflow_ = 0;
  std::vector<rte_mbuf*> copies_;
};

// Each rule's text and counters, summed over the workers' stages (which
// have the same rules).
struct RuleTotals {
  std::string text;
  lab::RuleCounters counters;
};
std::vector<RuleTotals> SumRules(const std::vector<const FaultStage*>& stages);

// "droce: droce0 fault rule 1 '...': matched ..." lines of every worker's
// stage, summed per rule (Device::FaultReport).
std::vector<std::string> SumFaultReports(const std::vector<const FaultStage*>& stages);

}  // namespace droce::engine
