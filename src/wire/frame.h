// RoCEv2 frames: Ethernet (optional 802.1Q tag) / IPv4 / UDP 4791 / BTH ...
// ICRC. The parser validates a whole frame in one call and never reads
// outside it; the builder writes the outer headers and the ICRC around a
// transport packet that the caller fills in.
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
inline constexpr unsigned kUdpLen = 8;
// Bytes in front of the BTH in an untagged RoCEv2/IPv4 frame.
inline constexpr unsigned kRoceV4HeadLen = kEthLen + kIpv4Len + kUdpLen;

using MacAddr = std::array<uint8_t, 6>;

enum class ParseError : uint8_t {
  kOk = 0,
  kTruncated,        // shorter than the headers it announces
  kNotIpv4,          // not IPv4 (ARP, IPv6, ...): not for the RoCE path
  kIpOptions,        // IPv4 header with options: RoCEv2 never sends them
  kIpFragment,       // fragmented datagram
  kBadIpChecksum,
  kBadIpLength,      // IPv4 total length disagrees with the frame
  kNotUdp,
  kNotRoce,          // UDP, but not to port 4791
  kBadUdpLength,
  kBadVersion,       // BTH TVer != 0
  kUnknownOpcode,
  kBadLength,        // shorter than the opcode's headers plus ICRC, or payload where none is allowed
  kBadPad,           // pad count larger than the payload
  kBadIcrc,
  kCount,
};
const char* parse_error_name(ParseError e);

struct PacketView {
  std::span<const uint8_t> frame;  // the whole frame as received
  MacAddr dmac{}, smac{};
  bool has_vlan = false;
  uint16_t vlan_tci = 0;
  unsigned l3_offset = 0;  // start of the IPv4 header
  uint32_t sip = 0, dip = 0;  // host order
  uint8_t tos = 0, ttl = 0;
  uint16_t udp_sport = 0;
  unsigned bth_offset = 0;
  Bth bth;
  const OpcodeInfo* info = nullptr;
  const uint8_t* payload = nullptr;  // after the extended headers
  uint32_t payload_len = 0;          // excluding pad and ICRC

  const uint8_t* bth_ptr() const { return frame.data() + bth_offset; }
  // Pointer to an extended header at an offset from the opcode table.
  const uint8_t* ext(uint8_t off_from_bth) const { return frame.data() + bth_offset + off_from_bth; }
};

// Parses and validates one frame, including the IPv4 checksum and the ICRC.
ParseError parse_frame(std::span<const uint8_t> frame, PacketView* out);

// The ICRC (IBA annex A17.8) of the RoCEv2/IPv4 packet that starts at `ip`
// and is `ip_len` bytes long including the 4 ICRC bytes at its end.
uint32_t compute_icrc_v4(const uint8_t* ip, size_t ip_len);

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

// UDP source port for a QP: entropy for ECMP, in 0xC000–0xFFFF as rxe uses.
inline uint16_t udp_sport_for_qp(uint32_t src_qpn, uint32_t dst_qpn) {
  uint32_t h = (src_qpn * 0x9E3779B1u) ^ (dst_qpn * 0x85EBCA77u);
  h ^= h >> 15;
  return static_cast<uint16_t>(0xC000 | (h & 0x3FFF));
}

}  // namespace droce::wire
