// ECN rewriting of frames for the switch element (cc/switch.h).
#include "cc/switch.h"

#include "cc/dcqcn.h"
#include "wire/bytes.h"
#include "wire/frame.h"

namespace droce::cc {
namespace {

// The offset of the IP header and whether it is IPv6; false if the frame
// carries neither.
bool L3(const uint8_t* f, uint32_t len, uint32_t* off, bool* v6) {
  if (len < wire::kEthLen) return false;
  uint32_t o = 12;
  uint16_t type = wire::load_be16(f + o);
  if (type == wire::kEtherTypeVlan) {
    if (len < wire::kEthLen + wire::kVlanLen) return false;
    o += wire::kVlanLen;
    type = wire::load_be16(f + o);
  }
  o += 2;
  if (type == wire::kEtherTypeIpv4 && len >= o + wire::kIpv4Len) {
    *v6 = false;
  } else if (type == wire::kEtherTypeIpv6 && len >= o + wire::kIpv6Len) {
    *v6 = true;
  } else {
    return false;
  }
  *off = o;
  return true;
}

}  // namespace

uint8_t FrameEcn(const uint8_t* frame, uint32_t len) {
  uint32_t off = 0;
  bool v6 = false;
  if (!L3(frame, len, &off, &v6)) return 0;
  // IPv6: the traffic class straddles bytes 0 and 1; its ECN bits are bits
  // 4-5 of byte 1.
  return v6 ? (frame[off + 1] >> 4) & kEcnMask : frame[off + 1] & kEcnMask;
}

uint8_t MarkCe(uint8_t* frame, uint32_t len) {
  uint32_t off = 0;
  bool v6 = false;
  if (!L3(frame, len, &off, &v6)) return 0;
  uint8_t* ip = frame + off;
  const uint8_t ecn = v6 ? (ip[1] >> 4) & kEcnMask : ip[1] & kEcnMask;
  if (ecn == kEcnNotEct || ecn == kEcnCe) return ecn;
  if (v6) {
    ip[1] |= kEcnCe << 4;
  } else {
    ip[1] |= kEcnCe;
    wire::store_be16(ip + 10, 0);
    wire::store_be16(ip + 10, wire::ipv4_checksum(ip, wire::kIpv4Len));
  }
  return ecn;
}

}  // namespace droce::cc
