// The Internet checksum (RFC 1071) for the engine's ICMP, ICMPv6 and ND
// packets: a ones' complement sum over any number of bytes (an odd last byte
// is padded with zero), optionally continued from a pseudo-header's sum.
#pragma once

#include <cstddef>
#include <cstdint>

namespace droce::engine {

// Adds bytes to a running 32-bit sum of 16-bit big-endian words.
inline uint32_t inet_sum(const uint8_t* p, size_t n, uint32_t sum = 0) {
  size_t i = 0;
  for (; i + 1 < n; i += 2) sum += static_cast<uint32_t>(p[i] << 8 | p[i + 1]);
  if (i < n) sum += static_cast<uint32_t>(p[i] << 8);
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return sum;
}

// The checksum to store (or 0 when verifying data that carries a correct one).
inline uint16_t inet_checksum(const uint8_t* p, size_t n, uint32_t sum = 0) {
  return static_cast<uint16_t>(~inet_sum(p, n, sum));
}

}  // namespace droce::engine
