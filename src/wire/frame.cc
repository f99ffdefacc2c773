#include "wire/frame.h"

#include <cstring>

#include "wire/icrc.h"

namespace droce::wire {

const char* parse_error_name(ParseError e) {
  switch (e) {
    case ParseError::kOk: return "ok";
    case ParseError::kTruncated: return "truncated";
    case ParseError::kNotIpv4: return "not_ipv4";
    case ParseError::kIpOptions: return "ip_options";
    case ParseError::kIpFragment: return "ip_fragment";
    case ParseError::kBadIpChecksum: return "bad_ip_checksum";
    case ParseError::kBadIpLength: return "bad_ip_length";
    case ParseError::kNotUdp: return "not_udp";
    case ParseError::kNotRoce: return "not_roce";
    case ParseError::kBadUdpLength: return "bad_udp_length";
    case ParseError::kBadVersion: return "bad_version";
    case ParseError::kUnknownOpcode: return "unknown_opcode";
    case ParseError::kBadLength: return "bad_length";
    case ParseError::kBadPad: return "bad_pad";
    case ParseError::kBadIcrc: return "icrc_err";
    case ParseError::kCount: break;
  }
  return "unknown";
}

uint16_t ipv4_checksum(const uint8_t* hdr, size_t len) {
  uint32_t sum = 0;
  for (size_t i = 0; i + 1 < len; i += 2) sum += load_be16(hdr + i);
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

uint32_t compute_icrc_v4(const uint8_t* ip, size_t ip_len) {
  // Pseudo header (IBA A17.8.1): 8 bytes of ones for the LRH, then the IP,
  // UDP and BTH headers with every field a router or switch may rewrite set
  // to ones: IPv4 TOS, TTL and checksum; the UDP checksum; the BTH's FECN,
  // BECN and reserved bits (byte 4).
  uint8_t pseudo[8 + kIpv4Len + kUdpLen + kBthLen];
  std::memset(pseudo, 0xFF, 8);
  std::memcpy(pseudo + 8, ip, kIpv4Len + kUdpLen + kBthLen);
  uint8_t* iph = pseudo + 8;
  iph[1] = 0xFF;                 // TOS (DSCP + ECN)
  iph[8] = 0xFF;                 // TTL
  iph[10] = iph[11] = 0xFF;      // header checksum
  uint8_t* udph = iph + kIpv4Len;
  udph[6] = udph[7] = 0xFF;      // UDP checksum
  uint8_t* bth = udph + kUdpLen;
  bth[4] = 0xFF;                 // FECN, BECN, reserved
  uint32_t crc = crc32(0, pseudo, sizeof(pseudo));
  const size_t head = kIpv4Len + kUdpLen + kBthLen;
  return crc32(crc, ip + head, ip_len - head - kIcrcLen);
}

unsigned write_outer_v4(uint8_t* f, const Ipv4Path& path, size_t roce_len, uint16_t ip_id) {
  std::memcpy(f, path.dmac.data(), 6);
  std::memcpy(f + 6, path.smac.data(), 6);
  store_be16(f + 12, kEtherTypeIpv4);
  uint8_t* ip = f + kEthLen;
  const size_t ip_total = kIpv4Len + kUdpLen + roce_len;
  ip[0] = 0x45;
  ip[1] = path.tos;
  store_be16(ip + 2, static_cast<uint16_t>(ip_total));
  store_be16(ip + 4, ip_id);
  store_be16(ip + 6, 0x4000);  // DF, as RoCE NICs send it
  ip[8] = path.ttl;
  ip[9] = 17;                  // UDP
  store_be16(ip + 10, 0);
  store_be32(ip + 12, path.sip);
  store_be32(ip + 16, path.dip);
  store_be16(ip + 10, ipv4_checksum(ip, kIpv4Len));
  uint8_t* udp = ip + kIpv4Len;
  store_be16(udp, path.udp_sport);
  store_be16(udp + 2, kRoceV2Port);
  store_be16(udp + 4, static_cast<uint16_t>(kUdpLen + roce_len));
  store_be16(udp + 6, 0);      // RoCEv2 over IPv4 sends no UDP checksum
  return kRoceV4HeadLen;
}

void finish_icrc_v4(uint8_t* frame, size_t frame_len) {
  const uint8_t* ip = frame + kEthLen;
  const size_t ip_len = frame_len - kEthLen;
  uint32_t icrc = compute_icrc_v4(ip, ip_len);
  // The ICRC goes on the wire least significant byte first, like the FCS.
  uint8_t* p = frame + frame_len - kIcrcLen;
  p[0] = static_cast<uint8_t>(icrc);
  p[1] = static_cast<uint8_t>(icrc >> 8);
  p[2] = static_cast<uint8_t>(icrc >> 16);
  p[3] = static_cast<uint8_t>(icrc >> 24);
}

ParseError parse_frame(std::span<const uint8_t> frame, PacketView* v) {
  const uint8_t* f = frame.data();
  const size_t n = frame.size();
  if (n < kEthLen) return ParseError::kTruncated;
  v->frame = frame;
  std::memcpy(v->dmac.data(), f, 6);
  std::memcpy(v->smac.data(), f + 6, 6);
  unsigned off = 12;
  uint16_t type = load_be16(f + off);
  v->has_vlan = false;
  if (type == kEtherTypeVlan) {
    if (n < kEthLen + kVlanLen) return ParseError::kTruncated;
    v->has_vlan = true;
    v->vlan_tci = load_be16(f + 14);
    off += kVlanLen;
    type = load_be16(f + off);
  }
  off += 2;
  if (type != kEtherTypeIpv4) return ParseError::kNotIpv4;
  if (n < off + kIpv4Len) return ParseError::kTruncated;
  const uint8_t* ip = f + off;
  if ((ip[0] >> 4) != 4) return ParseError::kNotIpv4;
  if ((ip[0] & 0xF) != 5) return ParseError::kIpOptions;
  const size_t ip_total = load_be16(ip + 2);
  if (ip_total < kIpv4Len || off + ip_total > n) return ParseError::kBadIpLength;
  if ((load_be16(ip + 6) & 0x3FFF) != 0) return ParseError::kIpFragment;
  if (ipv4_checksum(ip, kIpv4Len) != 0) return ParseError::kBadIpChecksum;
  if (ip[9] != 17) return ParseError::kNotUdp;
  v->l3_offset = off;
  v->tos = ip[1];
  v->ttl = ip[8];
  v->sip = load_be32(ip + 12);
  v->dip = load_be32(ip + 16);
  if (ip_total < kIpv4Len + kUdpLen) return ParseError::kTruncated;
  const uint8_t* udp = ip + kIpv4Len;
  if (load_be16(udp + 2) != kRoceV2Port) return ParseError::kNotRoce;
  const size_t udp_len = load_be16(udp + 4);
  if (udp_len != ip_total - kIpv4Len) return ParseError::kBadUdpLength;
  v->udp_sport = load_be16(udp);
  const size_t roce_len = udp_len - kUdpLen;  // BTH .. ICRC
  if (roce_len < kBthLen + kIcrcLen) return ParseError::kTruncated;
  const uint8_t* bth = udp + kUdpLen;
  v->bth_offset = static_cast<unsigned>(bth - f);
  v->bth = read_bth(bth);
  if (v->bth.tver != 0) return ParseError::kBadVersion;
  const OpcodeInfo& info = opcode_info(v->bth.opcode);
  if (info.name == nullptr) return ParseError::kUnknownOpcode;
  v->info = &info;
  if (roce_len < size_t{info.length} + kIcrcLen) return ParseError::kBadLength;
  const size_t body = roce_len - info.length - kIcrcLen;  // payload + pad
  if (body != 0 && !(info.mask & kMaskPayload)) return ParseError::kBadLength;
  if (v->bth.pad > body) return ParseError::kBadPad;
  if (compute_icrc_v4(ip, ip_total) !=
      (uint32_t{bth[roce_len - 4]} | uint32_t{bth[roce_len - 3]} << 8 |
       uint32_t{bth[roce_len - 2]} << 16 | uint32_t{bth[roce_len - 1]} << 24)) {
    return ParseError::kBadIcrc;
  }
  v->payload = bth + info.length;
  v->payload_len = static_cast<uint32_t>(body - v->bth.pad);
  return ParseError::kOk;
}

}  // namespace droce::wire
