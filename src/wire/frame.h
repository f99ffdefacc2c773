// RoCEv2 frames: Ethernet (optional 802.1Q tag) / IPv4 or IPv6 / UDP 4791 /
// BTH ... ICRC. The parser validates a whole frame in one call, contiguous or
// in segments, and never reads outside it; the builders write the outer
// headers, the ICRC and the UDP checksum around a transport packet that the
// caller fills in (wire/build.h writes the transport headers too).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>

#include "wire/headers.h"
#include "wire/opcode.h"

namespace droce::wire {

inline constexpr uint16_t kRoceV2Port = 4791;
inline constexpr uint16_t kEtherTypeIpv4 = 0x0800;
inline constexpr uint16_t kEtherTypeArp = 0x0806;
inline constexpr uint16_t kEtherTypeVlan = 0x8100;
inline constexpr uint16_t kEtherTypeIpv6 = 0x86DD;
inline constexpr unsigned kEthLen = 14;
inline constexpr unsigned kVlanLen = 4;
inline constexpr unsigned kIpv4Len = 20;
inline constexpr unsigned kIpv6Len = 40;
inline constexpr unsigned kUdpLen = 8;
inline constexpr uint8_t kIpProtoUdp = 17;
// Bytes in front of the BTH in an untagged RoCEv2/IPv4 frame.
inline constexpr unsigned kRoceV4HeadLen = kEthLen + kIpv4Len + kUdpLen;
// Bytes in front of the BTH in an untagged RoCEv2/IPv6 frame.
inline constexpr unsigned kRoceV6HeadLen = kEthLen + kIpv6Len + kUdpLen;
// The longest header stack in front of a payload: Ethernet, one VLAN tag,
// IPv6, UDP and the longest transport header (an XRC atomic request: BTH,
// XRCETH and AtomicETH). A segmented parse needs this many bytes contiguous.
inline constexpr unsigned kMaxRoceHeadLen =
    kEthLen + kVlanLen + kIpv6Len + kUdpLen + kBthLen + kXrcEthLen + kAtomicEthLen;

using MacAddr = std::array<uint8_t, 6>;
// An IPv6 address or a GID (a RoCEv2 GID is the IPv6 address; IPv4 uses the
// IPv4-mapped form ::ffff:a.b.c.d).
using Ipv6Addr = std::array<uint8_t, 16>;

enum class ParseError : uint8_t {
  kOk = 0,
  kTruncated,        // shorter than the headers it announces
  kNotIpv4,          // EtherType neither IPv4 nor IPv6 (ARP, LLDP, ...): not for the RoCE path
  kIpOptions,        // IPv4 header with options: RoCEv2 never sends them
  kIpFragment,       // fragmented datagram
  kBadIpChecksum,
  kBadIpLength,      // IPv4 total length or IPv6 payload length disagrees with the frame
  kNotUdp,
  kNotRoce,          // UDP, but not to port 4791
  kBadUdpLength,
  kBadVersion,       // BTH TVer != 0
  kUnknownOpcode,
  kBadLength,        // shorter than the opcode's headers plus ICRC, or payload where none is allowed
  kBadPad,           // pad count larger than the payload
  kBadIcrc,
  kBadIpVersion,     // IP version field disagrees with the EtherType
  kIpv6ExtHeader,    // UDP 4791 behind IPv6 extension headers: RoCEv2 sends none
  kBadUdpChecksum,   // IPv6: a non-zero UDP checksum that does not verify
  kCount,
};
const char* parse_error_name(ParseError e);

struct PacketView {
  // The whole frame as received. After a segmented parse: the frame's first
  // bytes, at least through the transport headers (the first segment, or the
  // caller's HeaderScratch when the headers straddle segments).
  std::span<const uint8_t> frame;
  MacAddr dmac{}, smac{};
  bool has_vlan = false;
  uint16_t vlan_tci = 0;
  unsigned l3_offset = 0;  // start of the IPv4 or IPv6 header
  bool ipv6 = false;
  uint32_t sip = 0, dip = 0;  // IPv4, host order; 0 for IPv6
  // IPv4: TOS and TTL. IPv6: traffic class and hop limit (the same values as
  // traffic_class and hop_limit), so that DSCP/ECN code needs one field.
  uint8_t tos = 0, ttl = 0;
  // The addresses as GIDs: the IPv6 addresses, or for IPv4 the IPv4-mapped
  // form (::ffff:a.b.c.d).
  Ipv6Addr sip6{}, dip6{};
  uint8_t traffic_class = 0, hop_limit = 0;  // IPv6 only
  uint32_t flow_label = 0;                   // IPv6 only, 20 bits
  unsigned l4_offset = 0;                    // start of the UDP header
  uint16_t udp_sport = 0;
  uint16_t udp_checksum = 0;                 // as received; 0 = none
  unsigned bth_offset = 0;
  Bth bth;
  const OpcodeInfo* info = nullptr;
  // After the extended headers. A segmented parse sets it only when the
  // payload lies in one segment (else nullptr: see for_each_payload_piece).
  const uint8_t* payload = nullptr;
  uint32_t payload_len = 0;          // excluding pad and ICRC
  uint32_t frame_len = 0;            // bytes in the whole frame
  // Where the payload starts among the segments of a segmented parse (for a
  // contiguous parse: segment 0 at payload - frame.data()).
  uint32_t payload_seg = 0, payload_seg_off = 0;

  const uint8_t* bth_ptr() const { return frame.data() + bth_offset; }
  // Pointer to an extended header at an offset from the opcode table.
  const uint8_t* ext(uint8_t off_from_bth) const { return frame.data() + bth_offset + off_from_bth; }
};

// Parses and validates one frame: Ethernet, at most one 802.1Q tag, IPv4 (no
// options, no fragments, header checksum, total length) or IPv6 (UDP as the
// next header, payload length), UDP to port 4791 (length, checksum as below),
// BTH version, the opcode table's header length, pad count and the ICRC.
// Bytes after the IP datagram (Ethernet padding, an FCS) are ignored. On an
// error the fields already parsed are set, the rest are not.
//
// UDP checksum. Senders: rxe writes 0 for IPv4 and IPv6 alike (rxe_net.c,
// prepare_udp_hdr) and so do RNICs; the ICRC covers the datagram instead
// and treats the checksum field as variant (masked to ones).
// droce's builders write 0 too unless Path::udp_checksum asks for one.
// Receivers: IPv4 ignores the field (RFC 768 makes it optional; RNICs do not
// check it). IPv6 accepts 0 (the RFC 6935/6936 tunnel exception, which rxe's
// IPv6 UDP tunnel socket also accepts: udp_sock_create6 leaves
// no_check6_rx set) or a checksum that verifies (RFC 8200 8.1); a wrong
// non-zero one is kBadUdpChecksum, as the kernel's UDP stack under rxe drops it.
ParseError parse_frame(std::span<const uint8_t> frame, PacketView* out);

// A frame in pieces (an mbuf chain, an iovec, a jumbo frame over memif).
using Segments = std::span<const std::span<const uint8_t>>;
struct HeaderScratch {
  alignas(64) uint8_t bytes[kMaxRoceHeadLen];
};
// The same checks over a frame in segments; headers may straddle segments and
// the ICRC is chained across them. Nothing is copied but, when the headers
// straddle, the first kMaxRoceHeadLen bytes into `scratch` (required), which
// then backs out->frame (keep it alive while the view is used). The payload stays in
// the segments: see out->payload, for_each_payload_piece and copy_payload.
ParseError parse_frame(Segments segs, PacketView* out, HeaderScratch* scratch);

// Calls fn(const uint8_t* p, size_t n) for each piece of the payload of `v`
// in order; `segs` are the segments it was parsed from ({v.frame} after a
// contiguous parse). Nothing is called for an empty payload.
template <typename Fn>
void for_each_payload_piece(Segments segs, const PacketView& v, Fn&& fn) {
  size_t left = v.payload_len;
  size_t off = v.payload_seg_off;
  for (size_t i = v.payload_seg; i < segs.size() && left != 0; ++i, off = 0) {
    if (off >= segs[i].size()) continue;
    const size_t n = segs[i].size() - off < left ? segs[i].size() - off : left;
    fn(segs[i].data() + off, n);
    left -= n;
  }
}
// Copies the payload to dst (v.payload_len bytes); returns the bytes copied.
size_t copy_payload(Segments segs, const PacketView& v, uint8_t* dst);

// The ICRC (IBA annex A17.8) of the RoCEv2/IPv4 packet that starts at `ip`
// and is `ip_len` bytes long including the 4 ICRC bytes at its end.
uint32_t compute_icrc_v4(const uint8_t* ip, size_t ip_len);
// The same for RoCEv2/IPv6: traffic class, flow label and hop limit are
// masked to ones (A17.8.2) in place of IPv4's TOS, TTL and checksum.
uint32_t compute_icrc_v6(const uint8_t* ip, size_t ip_len);
// Either, by the version in the first byte of the IP header.
uint32_t compute_icrc(const uint8_t* ip, size_t ip_len);

// The UDP checksum (RFC 768 / RFC 8200 8.1) that a datagram starting at the
// IPv4 or IPv6 header `ip` and `ip_len` bytes long should carry; never 0
// (a computed 0 is sent as 0xFFFF).
uint16_t udp_checksum(const uint8_t* ip, size_t ip_len);

// Where a frame goes: filled from the QP's address vector and the port.
struct Ipv4Path {
  MacAddr dmac{}, smac{};
  uint32_t sip = 0, dip = 0;  // host order
  uint16_t udp_sport = 0xC000;
  uint8_t tos = 0;
  uint8_t ttl = 64;
};

// Writes Ethernet/IPv4/UDP headers for a transport packet of `roce_len` bytes
// (BTH through ICRC). Returns the offset of the BTH (kRoceV4HeadLen).
unsigned write_outer_v4(uint8_t* frame, const Ipv4Path& path, size_t roce_len, uint16_t ip_id);

// Computes the ICRC of a frame built by write_outer_v4 (whose last 4 bytes are
// the ICRC) and stores it.
void finish_icrc_v4(uint8_t* frame, size_t frame_len);

// The IPv4 header checksum (RFC 1071) over `len` bytes.
uint16_t ipv4_checksum(const uint8_t* hdr, size_t len);

// Where a frame goes, for either IP version: filled from the QP's address
// vector (a GID that is not IPv4-mapped means IPv6) and the port.
struct Path {
  MacAddr dmac{}, smac{};
  bool vlan = false;      // write an 802.1Q tag
  uint16_t vlan_tci = 0;  // PCP (3 bits), DEI, VLAN ID (12 bits)
  bool ipv6 = false;
  uint32_t sip = 0, dip = 0;  // IPv4, host order
  Ipv6Addr sip6{}, dip6{};    // IPv6
  uint16_t udp_sport = 0xC000;
  uint8_t tos = 0;            // IPv4 TOS / IPv6 traffic class (DSCP + ECN)
  uint8_t ttl = 64;           // IPv4 TTL / IPv6 hop limit
  uint32_t flow_label = 0;    // IPv6, 20 bits
  // Send a UDP checksum. Off by default: RoCEv2 senders (rxe for both IP
  // versions, RNICs) put 0 and rely on the ICRC, which RFC 6935/6936 allow
  // for tunnels over IPv6; see docs/FEATURES.md.
  bool udp_checksum = false;

  static Path from(const Ipv4Path& p);
};

// Bytes in front of the BTH for a path: Ethernet, the tag, IP and UDP.
unsigned outer_len(const Path& path);
// Writes Ethernet[/802.1Q]/IPv4 or IPv6/UDP headers for a transport packet of
// `roce_len` bytes (BTH through ICRC); the UDP checksum is written as 0.
// Returns the offset of the BTH (outer_len(path)).
unsigned write_outer(uint8_t* frame, const Path& path, size_t roce_len, uint16_t ip_id = 0);
// The IPv6 case of write_outer (path.ipv6 is ignored).
unsigned write_outer_v6(uint8_t* frame, const Path& path, size_t roce_len);
// Computes and stores the ICRC of a frame written by write_outer or
// write_outer_v4 (any IP version, tagged or not) whose last 4 bytes are the
// ICRC. The UDP checksum, if wanted, comes after: finish_udp_checksum.
void finish_icrc(uint8_t* frame, size_t frame_len);
// finish_icrc for an IPv6 frame (the same function; named for symmetry).
inline void finish_icrc_v6(uint8_t* frame, size_t frame_len) { finish_icrc(frame, frame_len); }
// Computes and stores the UDP checksum of a finished frame.
void finish_udp_checksum(uint8_t* frame, size_t frame_len);
// finish_icrc, then finish_udp_checksum if path.udp_checksum.
void finish_frame(uint8_t* frame, size_t frame_len, const Path& path);

// GIDs (IBA A17.3): IPv4 addresses are carried as IPv4-mapped IPv6 addresses.
bool gid_is_ipv4_mapped(const uint8_t* gid);
inline uint32_t gid_to_ipv4(const uint8_t* gid) { return load_be32(gid + 12); }
Ipv6Addr ipv4_to_gid(uint32_t ip);
// A multicast GID (rdma_is_multicast_addr in Linux): ff00::/8 (RFC 4291
// 2.7), or the IPv4-mapped form of a 224.0.0.0/4 address (::ffff:239.x.y.z).
bool gid_is_multicast(const uint8_t* gid);
// The Ethernet group address a multicast GID is sent to: 01:00:5e and the
// low 23 bits of an IPv4 group (RFC 1112 6.4), 33:33 and the low 32 bits of
// an IPv6 group (RFC 2464 7). Meaningful only where gid_is_multicast holds.
MacAddr multicast_mac(const uint8_t* gid);
// The BTH destination QP of every multicast packet (IBA: QP 0xFFFFFF is
// the multicast QPN; Linux IB_MULTICAST_QPN).
inline constexpr uint32_t kMulticastQpn = 0xFFFFFF;
// Sets the path's addresses from a source and destination GID: IPv4 when
// both are IPv4-mapped, else IPv6.
void path_set_gids(Path* path, const uint8_t* sgid, const uint8_t* dgid);

// UDP source port for a QP: entropy for ECMP, in 0xC000–0xFFFF as rxe uses.
inline uint16_t udp_sport_for_qp(uint32_t src_qpn, uint32_t dst_qpn) {
  uint32_t h = (src_qpn * 0x9E3779B1u) ^ (dst_qpn * 0x85EBCA77u);
  h ^= h >> 15;
  return static_cast<uint16_t>(0xC000 | (h & 0x3FFF));
}

}  // namespace droce::wire
