#include "wire/frame.h"

#include <algorithm>
#include <bit>
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
    case ParseError::kBadIpVersion: return "bad_ip_version";
    case ParseError::kIpv6ExtHeader: return "ipv6_ext_header";
    case ParseError::kBadUdpChecksum: return "bad_udp_checksum";
    case ParseError::kCount: break;
  }
  return "unknown";
}

uint16_t ipv4_checksum(const uint8_t* hdr, size_t len) {
  // RFC 1071: the ones'-complement sum does not depend on byte order (1.2.B),
  // so add 32-bit words as the CPU loads them, fold, and swap once at the
  // end: a few instructions for a 20-byte header instead of a 16-bit loop
  // run twice per packet. A trailing odd byte is ignored (IPv4 header
  // lengths are multiples of 4).
  uint64_t sum = 0;
  size_t i = 0;
  for (; i + 4 <= len; i += 4) {
    uint32_t w;
    std::memcpy(&w, hdr + i, 4);
    sum += w;
  }
  if (i + 2 <= len) {
    uint16_t h;
    std::memcpy(&h, hdr + i, 2);
    sum += h;
  }
  sum = (sum & 0xFFFFFFFF) + (sum >> 32);
  sum = (sum & 0xFFFFFFFF) + (sum >> 32);
  sum = (sum & 0xFFFF) + (sum >> 16);
  sum = (sum & 0xFFFF) + (sum >> 16);
  const uint16_t folded = static_cast<uint16_t>(~sum);
  if constexpr (std::endian::native == std::endian::little) return __builtin_bswap16(folded);
  return folded;
}

namespace {

// IPv6 extension headers (RFC 8200 4, IANA "IPv6 Extension Header Types").
bool ipv6_ext_header(uint8_t nh) {
  switch (nh) {
    case 0:    // hop-by-hop options
    case 43:   // routing
    case 44:   // fragment
    case 50:   // ESP
    case 51:   // AH
    case 60:   // destination options
    case 135:  // mobility
    case 139:  // HIP
    case 140:  // shim6
    case 253:
    case 254:  // experiments
      return true;
    default:
      return false;
  }
}

// RoCEv2 never sends IPv6 extension headers. Follows the chain that starts
// with next header `nh` at `p` (`len` readable bytes) only to tell apart a
// RoCE packet we refuse (kIpv6ExtHeader) from traffic that is not RoCE
// (MLD behind hop-by-hop options, fragments, ...).
ParseError classify_ipv6_ext(uint8_t nh, const uint8_t* p, size_t len) {
  size_t off = 0;
  for (int i = 0; i < 8 && ipv6_ext_header(nh); ++i) {
    if (nh == 44) return ParseError::kIpFragment;
    if (nh == 50) return ParseError::kNotUdp;  // ESP: opaque
    if (len < 8 || off > len - 8) return ParseError::kIpv6ExtHeader;
    const size_t hlen = nh == 51 ? (size_t{p[off + 1]} + 2) * 4 : (size_t{p[off + 1]} + 1) * 8;
    nh = p[off];
    off += hlen;
  }
  if (nh != kIpProtoUdp) return ipv6_ext_header(nh) ? ParseError::kIpv6ExtHeader : ParseError::kNotUdp;
  if (len < kUdpLen || off > len - kUdpLen) return ParseError::kIpv6ExtHeader;
  return load_be16(p + off + 2) == kRoceV2Port ? ParseError::kIpv6ExtHeader : ParseError::kNotRoce;
}

inline uint32_t load_le32(const uint8_t* p) {
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// Validates everything but the ICRC and the UDP checksum of a frame `n`
// bytes long whose first `avail` bytes (avail == n, or avail >=
// kMaxRoceHeadLen) are contiguous at `f`. Every read below is either checked
// against `n` and within the first kMaxRoceHeadLen bytes, or checked against
// `avail`. Sets *ip_total to the IP datagram's length (header through ICRC).
ParseError parse_headers(const uint8_t* f, size_t avail, size_t n, PacketView* v,
                         size_t* ip_total_out) {
  v->frame_len = static_cast<uint32_t>(n);
  if (n < kEthLen) return ParseError::kTruncated;
  std::memcpy(v->dmac.data(), f, 6);
  std::memcpy(v->smac.data(), f + 6, 6);
  unsigned off = 12;
  uint16_t type = load_be16(f + off);
  v->has_vlan = false;
  v->vlan_tci = 0;
  if (type == kEtherTypeVlan) {
    if (n < kEthLen + kVlanLen) return ParseError::kTruncated;
    v->has_vlan = true;
    v->vlan_tci = load_be16(f + 14);
    off += kVlanLen;
    type = load_be16(f + off);
  }
  off += 2;
  v->l3_offset = off;
  const uint8_t* ip = f + off;
  size_t ip_total;
  unsigned ip_hlen;
  if (type == kEtherTypeIpv4) {
    v->ipv6 = false;
    if (n < off + kIpv4Len) return ParseError::kTruncated;
    if ((ip[0] >> 4) != 4) return ParseError::kBadIpVersion;
    if ((ip[0] & 0xF) != 5) return ParseError::kIpOptions;
    ip_total = load_be16(ip + 2);
    if (ip_total < kIpv4Len || off + ip_total > n) return ParseError::kBadIpLength;
    if ((load_be16(ip + 6) & 0x3FFF) != 0) return ParseError::kIpFragment;
    if (ipv4_checksum(ip, kIpv4Len) != 0) return ParseError::kBadIpChecksum;
    if (ip[9] != kIpProtoUdp) return ParseError::kNotUdp;
    v->tos = ip[1];
    v->ttl = ip[8];
    v->sip = load_be32(ip + 12);
    v->dip = load_be32(ip + 16);
    v->sip6 = ipv4_to_gid(v->sip);
    v->dip6 = ipv4_to_gid(v->dip);
    v->traffic_class = v->hop_limit = 0;
    v->flow_label = 0;
    ip_hlen = kIpv4Len;
  } else if (type == kEtherTypeIpv6) {
    v->ipv6 = true;
    if (n < off + kIpv6Len) return ParseError::kTruncated;
    if ((ip[0] >> 4) != 6) return ParseError::kBadIpVersion;
    ip_total = kIpv6Len + size_t{load_be16(ip + 4)};
    if (off + ip_total > n) return ParseError::kBadIpLength;
    v->traffic_class = static_cast<uint8_t>((ip[0] << 4) | (ip[1] >> 4));
    v->flow_label = load_be24(ip + 1) & 0xFFFFF;
    v->hop_limit = ip[7];
    v->tos = v->traffic_class;
    v->ttl = v->hop_limit;
    v->sip = v->dip = 0;
    std::memcpy(v->sip6.data(), ip + 8, 16);
    std::memcpy(v->dip6.data(), ip + 24, 16);
    if (ip[6] != kIpProtoUdp) {
      if (!ipv6_ext_header(ip[6])) return ParseError::kNotUdp;
      // Only the first kMaxRoceHeadLen bytes, so that a segmented parse
      // gives the same answer however the frame is cut.
      const size_t end = std::min({avail, off + ip_total, size_t{kMaxRoceHeadLen}});
      const size_t start = off + kIpv6Len;
      return classify_ipv6_ext(ip[6], ip + kIpv6Len, end > start ? end - start : 0);
    }
    ip_hlen = kIpv6Len;
  } else {
    return ParseError::kNotIpv4;
  }
  if (ip_total < ip_hlen + kUdpLen) return ParseError::kTruncated;
  const uint8_t* udp = ip + ip_hlen;
  v->l4_offset = off + ip_hlen;
  if (load_be16(udp + 2) != kRoceV2Port) return ParseError::kNotRoce;
  const size_t udp_len = load_be16(udp + 4);
  if (udp_len != ip_total - ip_hlen) return ParseError::kBadUdpLength;
  v->udp_sport = load_be16(udp);
  v->udp_checksum = load_be16(udp + 6);
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
  v->payload_len = static_cast<uint32_t>(body - v->bth.pad);
  *ip_total_out = ip_total;
  return ParseError::kOk;
}

// Calls fn(p, n) over bytes [start, start + len) of a segmented frame.
template <typename Fn>
void for_range(Segments segs, size_t start, size_t len, Fn&& fn) {
  for (const auto& s : segs) {
    if (len == 0) return;
    if (start >= s.size()) {
      start -= s.size();
      continue;
    }
    const size_t n = std::min(s.size() - start, len);
    fn(s.data() + start, n);
    len -= n;
    start = 0;
  }
}

}  // namespace

ParseError parse_frame(std::span<const uint8_t> frame, PacketView* v) {
  v->frame = frame;
  size_t ip_total = 0;
  const ParseError e = parse_headers(frame.data(), frame.size(), frame.size(), v, &ip_total);
  if (e != ParseError::kOk) return e;
  const uint8_t* ip = frame.data() + v->l3_offset;
  if (compute_icrc(ip, ip_total) != load_le32(ip + ip_total - kIcrcLen)) return ParseError::kBadIcrc;
  if (v->ipv6 && v->udp_checksum != 0) {
    // The UDP checksum rule is explained at parse_frame in frame.h.
    InetSum s;
    const size_t ip_hlen = v->l4_offset - v->l3_offset;
    add_udp_pseudo_header(&s, ip, ip_total - ip_hlen);
    s.add(ip + ip_hlen, ip_total - ip_hlen);
    if (s.fold() != 0xFFFF) return ParseError::kBadUdpChecksum;
  }
  const uint32_t payload_off = v->bth_offset + v->info->length;
  v->payload = frame.data() + payload_off;
  v->payload_seg = 0;
  v->payload_seg_off = payload_off;
  return ParseError::kOk;
}

ParseError parse_frame(Segments segs, PacketView* v, HeaderScratch* scratch) {
  size_t n = 0;
  for (const auto& s : segs) n += s.size();
  const size_t need = std::min<size_t>(n, kMaxRoceHeadLen);
  const uint8_t* h;
  size_t avail;
  if (!segs.empty() && segs[0].size() >= need) {
    h = segs[0].data();
    avail = segs[0].size();
    v->frame = segs[0];
  } else {
    size_t got = 0;
    for_range(segs, 0, need, [&](const uint8_t* p, size_t len) {
      std::memcpy(scratch->bytes + got, p, len);
      got += len;
    });
    h = scratch->bytes;
    avail = need;
    v->frame = {scratch->bytes, need};
  }
  v->payload = nullptr;
  size_t ip_total = 0;
  const ParseError e = parse_headers(h, avail, n, v, &ip_total);
  if (e != ParseError::kOk) return e;
  const uint8_t* ip = h + v->l3_offset;
  const size_t head = icrc_head_len(ip);  // within kMaxRoceHeadLen, so in h
  uint32_t crc = icrc_head(ip);
  for_range(segs, v->l3_offset + head, ip_total - head - kIcrcLen,
            [&](const uint8_t* p, size_t len) { crc = crc32(crc, p, len); });
  uint8_t icrc[kIcrcLen];
  size_t got = 0;
  for_range(segs, v->l3_offset + ip_total - kIcrcLen, kIcrcLen, [&](const uint8_t* p, size_t len) {
    std::memcpy(icrc + got, p, len);
    got += len;
  });
  if (crc != load_le32(icrc)) return ParseError::kBadIcrc;
  if (v->ipv6 && v->udp_checksum != 0) {
    InetSum s;
    const size_t ip_hlen = v->l4_offset - v->l3_offset;
    add_udp_pseudo_header(&s, ip, ip_total - ip_hlen);
    for_range(segs, v->l4_offset, ip_total - ip_hlen,
              [&](const uint8_t* p, size_t len) { s.add(p, len); });
    if (s.fold() != 0xFFFF) return ParseError::kBadUdpChecksum;
  }
  // Locate the payload among the segments.
  size_t off = v->bth_offset + v->info->length;
  for (size_t i = 0; i < segs.size(); ++i) {
    if (off < segs[i].size() || (off == segs[i].size() && i + 1 == segs.size())) {
      v->payload_seg = static_cast<uint32_t>(i);
      v->payload_seg_off = static_cast<uint32_t>(off);
      if (segs[i].size() - off >= v->payload_len) v->payload = segs[i].data() + off;
      break;
    }
    off -= segs[i].size();
  }
  return ParseError::kOk;
}

size_t copy_payload(Segments segs, const PacketView& v, uint8_t* dst) {
  size_t done = 0;
  for_each_payload_piece(segs, v, [&](const uint8_t* p, size_t n) {
    std::memcpy(dst + done, p, n);
    done += n;
  });
  return done;
}

}  // namespace droce::wire
