// What the fault filters need from a frame, and nothing more: the BTH's
// opcode, destination QP and PSN, and where the ICRC is (to corrupt it).
// Ethernet, an optional 802.1Q tag, IPv4 (any header length) or IPv6
// (no extension headers), UDP to port 4791. Every offset is checked against
// the frame's length before it is read; the frame's own lengths (IPv4 total
// length, IPv6 payload length, UDP length) must fit in it, so that Ethernet
// padding is never taken for the ICRC. Not a validation: the receive path's
// parser (wire/frame.h) still checks everything.
#pragma once

#include <cstdint>

#include "wire/bytes.h"

namespace droce::lab {

struct RocePeek {
  uint8_t opcode = 0;
  uint32_t dqpn = 0;
  uint32_t psn = 0;
  uint32_t icrc_offset = 0;  // the ICRC's first byte from the frame's start
  uint32_t bth_offset = 0;   // the BTH's first byte
  uint8_t ecn = 0;           // the IP header's ECN bits (RFC 3168)
};

// Whether `f` (len bytes, contiguous) looks like a RoCEv2 frame; fills *out.
inline bool PeekRoce(const uint8_t* f, uint32_t len, RocePeek* out) {
  constexpr uint32_t kEth = 14, kUdp = 8, kBth = 12, kIcrc = 4;
  if (len < kEth) return false;
  uint32_t l3 = kEth;
  uint16_t type = wire::load_be16(f + 12);
  if (type == 0x8100) {
    if (len < kEth + 4) return false;
    type = wire::load_be16(f + 16);
    l3 += 4;
  }
  uint32_t l4 = 0, l3_end = 0;
  if (type == 0x0800) {
    if (len < l3 + 20) return false;
    const uint32_t ihl = (f[l3] & 0x0Fu) * 4;
    if ((f[l3] >> 4) != 4 || ihl < 20 || f[l3 + 9] != 17) return false;
    l4 = l3 + ihl;
    l3_end = l3 + wire::load_be16(f + l3 + 2);
    out->ecn = f[l3 + 1] & 3;
  } else if (type == 0x86DD) {
    if (len < l3 + 40 || f[l3 + 6] != 17) return false;
    l4 = l3 + 40;
    l3_end = l4 + wire::load_be16(f + l3 + 4);
    out->ecn = (f[l3 + 1] >> 4) & 3;
  } else {
    return false;
  }
  if (l3_end > len || l4 + kUdp > l3_end || wire::load_be16(f + l4 + 2) != 4791) return false;
  const uint32_t udp_end = l4 + wire::load_be16(f + l4 + 4);
  const uint32_t bth = l4 + kUdp;
  if (udp_end > l3_end || bth + kBth + kIcrc > udp_end) return false;
  out->opcode = f[bth];
  out->dqpn = wire::load_be24(f + bth + 5);
  out->psn = wire::load_be24(f + bth + 9);
  out->icrc_offset = udp_end - kIcrc;
  out->bth_offset = bth;
  return true;
}

}  // namespace droce::lab
