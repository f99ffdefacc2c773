// Builders for the outer headers (Ethernet, 802.1Q, IPv4/IPv6, UDP), the ICRC
// and the UDP checksum of an outgoing frame.
#include <cstring>

#include "wire/frame.h"
#include "wire/icrc.h"

namespace droce::wire {
namespace {

// Ethernet header and optional tag; returns the offset of the IP header.
unsigned write_eth(uint8_t* f, const Path& path, uint16_t ether_type) {
  std::memcpy(f, path.dmac.data(), 6);
  std::memcpy(f + 6, path.smac.data(), 6);
  unsigned off = 12;
  if (path.vlan) {
    store_be16(f + off, kEtherTypeVlan);
    store_be16(f + off + 2, path.vlan_tci);
    off += kVlanLen;
  }
  store_be16(f + off, ether_type);
  return off + 2;
}

void write_udp(uint8_t* udp, uint16_t sport, size_t roce_len) {
  store_be16(udp, sport);
  store_be16(udp + 2, kRoceV2Port);
  store_be16(udp + 4, static_cast<uint16_t>(kUdpLen + roce_len));
  store_be16(udp + 6, 0);  // no checksum; finish_udp_checksum may add one
}

unsigned write_ipv4(uint8_t* f, unsigned off, const Path& path, size_t roce_len, uint16_t ip_id) {
  uint8_t* ip = f + off;
  const size_t ip_total = kIpv4Len + kUdpLen + roce_len;
  ip[0] = 0x45;
  ip[1] = path.tos;
  store_be16(ip + 2, static_cast<uint16_t>(ip_total));
  store_be16(ip + 4, ip_id);
  store_be16(ip + 6, 0x4000);  // DF, as RoCE NICs send it
  ip[8] = path.ttl;
  ip[9] = kIpProtoUdp;
  store_be16(ip + 10, 0);
  store_be32(ip + 12, path.sip);
  store_be32(ip + 16, path.dip);
  store_be16(ip + 10, ipv4_checksum(ip, kIpv4Len));
  write_udp(ip + kIpv4Len, path.udp_sport, roce_len);
  return off + kIpv4Len + kUdpLen;
}

unsigned write_ipv6(uint8_t* f, unsigned off, const Path& path, size_t roce_len) {
  uint8_t* ip = f + off;
  // Version 6, traffic class, flow label (RFC 8200 3).
  store_be32(ip, (6u << 28) | (uint32_t{path.tos} << 20) | (path.flow_label & 0xFFFFF));
  store_be16(ip + 4, static_cast<uint16_t>(kUdpLen + roce_len));
  ip[6] = kIpProtoUdp;
  ip[7] = path.ttl;
  std::memcpy(ip + 8, path.sip6.data(), 16);
  std::memcpy(ip + 24, path.dip6.data(), 16);
  write_udp(ip + kIpv6Len, path.udp_sport, roce_len);
  return off + kIpv6Len + kUdpLen;
}

// Offset of the IP header of a frame this file wrote (tagged or not).
unsigned l3_offset(const uint8_t* f) {
  return load_be16(f + 12) == kEtherTypeVlan ? kEthLen + kVlanLen : kEthLen;
}

}  // namespace

Path Path::from(const Ipv4Path& p) {
  Path r;
  r.dmac = p.dmac;
  r.smac = p.smac;
  r.sip = p.sip;
  r.dip = p.dip;
  r.sip6 = ipv4_to_gid(p.sip);
  r.dip6 = ipv4_to_gid(p.dip);
  r.udp_sport = p.udp_sport;
  r.tos = p.tos;
  r.ttl = p.ttl;
  return r;
}

unsigned outer_len(const Path& path) {
  return kEthLen + (path.vlan ? kVlanLen : 0) + (path.ipv6 ? kIpv6Len : kIpv4Len) + kUdpLen;
}

unsigned write_outer(uint8_t* f, const Path& path, size_t roce_len, uint16_t ip_id) {
  if (path.ipv6) return write_outer_v6(f, path, roce_len);
  return write_ipv4(f, write_eth(f, path, kEtherTypeIpv4), path, roce_len, ip_id);
}

unsigned write_outer_v6(uint8_t* f, const Path& path, size_t roce_len) {
  return write_ipv6(f, write_eth(f, path, kEtherTypeIpv6), path, roce_len);
}

unsigned write_outer_v4(uint8_t* f, const Ipv4Path& path, size_t roce_len, uint16_t ip_id) {
  Path p;
  p.dmac = path.dmac;
  p.smac = path.smac;
  p.sip = path.sip;
  p.dip = path.dip;
  p.udp_sport = path.udp_sport;
  p.tos = path.tos;
  p.ttl = path.ttl;
  return write_ipv4(f, write_eth(f, p, kEtherTypeIpv4), p, roce_len, ip_id);
}

namespace {
void store_icrc(uint8_t* f, size_t frame_len, uint32_t icrc) {
  // The ICRC goes on the wire least significant byte first, like the FCS.
  uint8_t* p = f + frame_len - kIcrcLen;
  p[0] = static_cast<uint8_t>(icrc);
  p[1] = static_cast<uint8_t>(icrc >> 8);
  p[2] = static_cast<uint8_t>(icrc >> 16);
  p[3] = static_cast<uint8_t>(icrc >> 24);
}
}  // namespace

void finish_icrc_v4(uint8_t* frame, size_t frame_len) {
  store_icrc(frame, frame_len, compute_icrc_v4(frame + kEthLen, frame_len - kEthLen));
}

void finish_icrc(uint8_t* frame, size_t frame_len) {
  const unsigned l3 = l3_offset(frame);
  store_icrc(frame, frame_len, compute_icrc(frame + l3, frame_len - l3));
}

void finish_udp_checksum(uint8_t* frame, size_t frame_len) {
  const unsigned l3 = l3_offset(frame);
  const uint8_t* ip = frame + l3;
  const unsigned hlen = (ip[0] >> 4) == 6 ? kIpv6Len : kIpv4Len;
  store_be16(frame + l3 + hlen + 6, udp_checksum(ip, frame_len - l3));
}

void finish_frame(uint8_t* frame, size_t frame_len, const Path& path) {
  finish_icrc(frame, frame_len);
  if (path.udp_checksum) finish_udp_checksum(frame, frame_len);
}

bool gid_is_ipv4_mapped(const uint8_t* gid) {
  static constexpr uint8_t kPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
  return std::memcmp(gid, kPrefix, sizeof(kPrefix)) == 0;
}

bool gid_is_multicast(const uint8_t* gid) {
  if (gid[0] == 0xFF) return true;
  return gid_is_ipv4_mapped(gid) && (gid[12] & 0xF0) == 0xE0;
}

MacAddr multicast_mac(const uint8_t* gid) {
  if (gid_is_ipv4_mapped(gid)) return {0x01, 0x00, 0x5E, static_cast<uint8_t>(gid[13] & 0x7F), gid[14], gid[15]};
  return {0x33, 0x33, gid[12], gid[13], gid[14], gid[15]};
}

Ipv6Addr ipv4_to_gid(uint32_t ip) {
  Ipv6Addr g{};
  g[10] = g[11] = 0xFF;
  store_be32(g.data() + 12, ip);
  return g;
}

void path_set_gids(Path* path, const uint8_t* sgid, const uint8_t* dgid) {
  std::memcpy(path->sip6.data(), sgid, 16);
  std::memcpy(path->dip6.data(), dgid, 16);
  path->ipv6 = !(gid_is_ipv4_mapped(sgid) && gid_is_ipv4_mapped(dgid));
  path->sip = path->ipv6 ? 0 : gid_to_ipv4(sgid);
  path->dip = path->ipv6 ? 0 : gid_to_ipv4(dgid);
}

}  // namespace droce::wire
