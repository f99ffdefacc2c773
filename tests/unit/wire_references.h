// The wire tests' shared helpers: references written from the specs, frame fix-ups, the golden packets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "wire/frame.h"

namespace droce::test {

using wire::ParseError;
using Bytes = std::vector<uint8_t>;

// ---------------------------------------------------------------------------
// Independent references (wire_references.cc).

// Bitwise CRC-32/IEEE: reflected poly 0xEDB88320, init and final xor
// 0xFFFFFFFF (zlib.crc32). `crc` is a previous result, so it chains the same
// way zlib's crc32() does.
uint32_t RefCrc32(uint32_t crc, const uint8_t* p, size_t n);

uint16_t Be16(const uint8_t* p);

// RFC 1071 ones'-complement checksum of a 20-byte IPv4 header.
uint16_t RefIpv4Checksum(const uint8_t* ip);

// The ICRC of the RoCEv2/IPv4 packet at `ip` (IBA annex A17.8, as spelled out
// at the top of golden_packets.h): 8 bytes of ones for the missing LRH, then
// IP/UDP/BTH with the variant fields (TOS, TTL, IP checksum, UDP checksum,
// BTH byte 4) forced to ones, then the rest up to the ICRC.
uint32_t RefIcrcV4(const uint8_t* ip);

// The ICRC as stored in the last 4 bytes (least significant byte first).
uint32_t StoredIcrc(const uint8_t* ip);

// After editing a frame on purpose, make its IPv4 checksum and ICRC valid
// again so that the edit is the only defect the parser can find.
void FixIpChecksum(Bytes& f, size_t l3 = wire::kEthLen);
void FixIcrc(Bytes& f, size_t l3 = wire::kEthLen);
void FixAll(Bytes& f, size_t l3 = wire::kEthLen);

ParseError Parse(const Bytes& f, wire::PacketView* v = nullptr);

std::string Name(ParseError e);

// ---------------------------------------------------------------------------
// Golden packets (golden_packets.h).

struct Golden {
  const char* name;
  Bytes bytes;
  uint32_t crc;
  uint8_t opcode;
};

std::vector<Golden> Goldens();

}  // namespace droce::test
