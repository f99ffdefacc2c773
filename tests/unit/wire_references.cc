// The wire tests' shared helpers, declared and described in wire_references.h.
#include "wire_references.h"

#include <span>

#include "golden_packets.h"
#include "wire/opcode.h"

namespace droce::test {

uint32_t RefCrc32(uint32_t crc, const uint8_t* p, size_t n) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint16_t Be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }

uint16_t RefIpv4Checksum(const uint8_t* ip) {
  uint32_t sum = 0;
  for (int i = 0; i < 20; i += 2) sum += Be16(ip + i);
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

// Alone in this file, the insert below is inlined here, and GCC 12 then
// warns falsely (-Warray-bounds, -Wstringop-overread) about moving the 8
// bytes already in `buf`. In one file with the frame tests it was not.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Warray-bounds"
#if !defined(__clang__)
#pragma GCC diagnostic ignored "-Wstringop-overread"
#endif
uint32_t RefIcrcV4(const uint8_t* ip) {
  const size_t ip_len = Be16(ip + 2);
  Bytes buf(8, 0xFF);
  buf.insert(buf.end(), ip, ip + ip_len - 4);
  uint8_t* p = buf.data() + 8;
  p[1] = 0xFF;              // TOS
  p[8] = 0xFF;              // TTL
  p[10] = p[11] = 0xFF;     // IPv4 header checksum
  p[26] = p[27] = 0xFF;     // UDP checksum
  p[28 + 4] = 0xFF;         // BTH: FECN, BECN, resv6a
  return RefCrc32(0, buf.data(), buf.size());
}
#pragma GCC diagnostic pop

uint32_t StoredIcrc(const uint8_t* ip) {
  const uint8_t* p = ip + Be16(ip + 2) - 4;
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

void FixIpChecksum(Bytes& f, size_t l3) {
  f[l3 + 10] = f[l3 + 11] = 0;
  const uint16_t c = RefIpv4Checksum(&f[l3]);
  f[l3 + 10] = static_cast<uint8_t>(c >> 8);
  f[l3 + 11] = static_cast<uint8_t>(c);
}
void FixIcrc(Bytes& f, size_t l3) {
  const uint32_t c = RefIcrcV4(&f[l3]);
  uint8_t* p = &f[l3 + Be16(&f[l3 + 2]) - 4];
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(c >> (8 * i));
}
void FixAll(Bytes& f, size_t l3) {
  FixIpChecksum(f, l3);
  FixIcrc(f, l3);
}

ParseError Parse(const Bytes& f, wire::PacketView* v) {
  wire::PacketView tmp;
  return wire::parse_frame(std::span<const uint8_t>(f.data(), f.size()), v ? v : &tmp);
}

std::string Name(ParseError e) { return wire::parse_error_name(e); }

std::vector<Golden> Goldens() {
  auto v = [](std::span<const uint8_t> s) { return Bytes(s.begin(), s.end()); };
  return {
      {"kCx4LxCnp", v(kCx4LxCnp), kCx4LxCnpCrc, wire::kCnp},
      {"kHuaweiRcAck", v(kHuaweiRcAck), kHuaweiRcAckCrc, wire::kRcAck},
      {"kHuaweiRcSendOnlyImm", v(kHuaweiRcSendOnlyImm), kHuaweiRcSendOnlyImmCrc,
       wire::kRcSendOnlyImm},
      {"kHuaweiRcSendOnlyImmPad3", v(kHuaweiRcSendOnlyImmPad3), kHuaweiRcSendOnlyImmPad3Crc,
       wire::kRcSendOnlyImm},
      {"kRxeRcRdmaReadRequest", v(kRxeRcRdmaReadRequest), kRxeRcRdmaReadRequestCrc,
       wire::kRcReadRequest},
      {"kScapyUcSendOnlyPad2", v(kScapyUcSendOnlyPad2), kScapyUcSendOnlyPad2Crc, wire::kUcSendOnly},
      {"kHuaweiRcSendOnlyImmMutated", v(kHuaweiRcSendOnlyImmMutated),
       kHuaweiRcSendOnlyImmMutatedCrc, wire::kRcSendOnlyImm},
  };
}

}  // namespace droce::test
