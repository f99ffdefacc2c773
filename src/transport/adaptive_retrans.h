// Adaptive retransmission (DROCE_ADP_RETRANS; docs/LAB.md "Adaptive
// retransmission"): settings and the round-trip estimator, apart from the QP
// so that the settings parser and the tests need no transport internals.
#pragma once

#include <algorithm>
#include <cstdint>

namespace droce::transport {

// ConnectX's "adaptive retransmission" (its counters roce_adp_retrans and
// roce_adp_retrans_to) in droce's terms: a go-back-N requester does not wait
// the QP's whole local ACK timeout (4.096 us × 2^timeout, 67 ms at perftest's
// timeout 14) for a lost tail packet, a lost ACK or a lost READ response: a
// timer of its own, from the QP's measured round trip, resends from the
// oldest unacknowledged packet, and doubles at each further expiry until it
// would reach the QP's timeout. These early resends spend no retry: only the
// QP's own timeout counts against retry_cnt, so a dead peer fails the QP
// exactly when it would without them. Nothing on the wire changes: any peer
// (an RNIC, rxe) sees an ordinary retransmission.
struct AdaptiveRetrans {
  bool on = false;
  // The shortest timeout, whatever the round trip: on this kind of host a
  // peer can be off its CPU for a few hundred microseconds, and each
  // spurious expiry resends the whole window.
  uint32_t min_us = 500;
  // The timeout before the QP's first round-trip sample.
  uint32_t init_us = 1000;
};

// RFC 6298's estimator (SRTT, RTTVAR; RTO = SRTT + 4 RTTVAR), in ns, fed
// one sample per round trip from packets sent once (Karn's rule: a
// retransmitted packet's acknowledgement is ambiguous).
class RttEstimator {
 public:
  void Sample(uint64_t rtt_ns) {
    if (!has_sample_) {
      srtt_ns_ = rtt_ns;
      rttvar_ns_ = rtt_ns / 2;
      has_sample_ = true;
      return;
    }
    const uint64_t err = srtt_ns_ > rtt_ns ? srtt_ns_ - rtt_ns : rtt_ns - srtt_ns_;
    rttvar_ns_ = rttvar_ns_ - rttvar_ns_ / 4 + err / 4;  // beta 1/4
    srtt_ns_ = srtt_ns_ - srtt_ns_ / 8 + rtt_ns / 8;      // alpha 1/8
  }
  // The first timeout of a loss: SRTT + 4 RTTVAR, at least min_ns; init_ns
  // before any sample.
  uint64_t Rto(uint64_t min_ns, uint64_t init_ns) const {
    if (!has_sample_) return std::max(init_ns, min_ns);
    return std::max(srtt_ns_ + 4 * rttvar_ns_, min_ns);
  }
  bool has_sample() const { return has_sample_; }
  uint64_t srtt_ns() const { return srtt_ns_; }
  uint64_t rttvar_ns() const { return rttvar_ns_; }

 private:
  uint64_t srtt_ns_ = 0, rttvar_ns_ = 0;
  bool has_sample_ = false;
};

}  // namespace droce::transport
