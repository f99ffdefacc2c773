// Selective repeat's settings (DROCE_SR), apart from the QP so that the
// settings parser needs no transport internals.
#pragma once

#include <cstdint>

namespace droce::transport {

// Selective repeat (docs/LAB.md "Selective repeat"):
// IRN-style loss recovery between two droce QPs that both have it on,
// negotiated in band by a reserved BTH bit (wire::Bth::sr), so a peer
// without it (an RNIC, rxe, droce with it off) gets plain go-back-N.
struct SelectiveRepeat {
  bool on = false;
  // The BDP cap: at most this many request packets beyond the oldest
  // unacknowledged one (a power of two, 16..512), which is also how many a
  // responder holds out of order (its buffer, window × (path MTU + 256)
  // bytes, is allocated when it first holds one). Both ends should use the
  // same. 512 is go-back-N's own cap: over memif on two shared CPUs the
  // round trip is often 100-200 µs, and 256 packets of 1 KiB already
  // throttled a loss-free flow by about a third.
  uint32_t window = 512;
  // The retransmission timeout: the oldest unacknowledged packet is resent
  // when nothing was acknowledged for this long; the IBA local ACK timeout
  // and retry_cnt still bound a dead peer. 0 (the default): it follows the
  // path, as TCP's (RFC 6298): SRTT + 4 RTTVAR from packets acknowledged
  // without having been resent (Karn's rule), at least rto_min_us, before the
  // first sample rto_init_us; each timeout without progress doubles it up
  // to rto_max_us, and an acknowledgement brings it back to the estimate.
  // A fixed 320 µs (IRN's RTO_high) timed out whenever the peer's CPU was
  // busy for a moment and resent 1.83 packets per loss beside a build.
  // rto=TIME fixes it.
  uint32_t rto_us = 0;
  uint32_t rto_min_us = 320;
  uint32_t rto_init_us = 1000;
  uint32_t rto_max_us = 64000;
};
// A slot of the requester's SACK table that holds no SACK (never a PSN).
inline constexpr uint32_t kNoSack = 0xFFFFFFFF;

}  // namespace droce::transport
