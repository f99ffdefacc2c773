// CRC-32 (IEEE 802.3 polynomial, reflected) as the ICRC uses it, the ICRC's
// masked pseudo header, and the Internet checksum. Chaining:
// crc32(crc32(0, a), b) == crc32(0, a ++ b).
#pragma once

#include <cstddef>
#include <cstdint>

namespace droce::wire {

uint32_t crc32(uint32_t crc, const uint8_t* data, size_t len);

// The CRC over the start of the ICRC's input (IBA A17.8): 8 bytes of ones in
// place of the LRH, then the IP header, the UDP header and the BTH, which
// start at `ip` and are contiguous, with every field a router or switch may
// rewrite set to ones. The caller chains crc32 over the rest of the packet
// (from icrc_head_len(ip) bytes after `ip`) up to the ICRC.
uint32_t icrc_head(const uint8_t* ip);
// Bytes from the IP header through the BTH: 40 (IPv4) or 60 (IPv6).
size_t icrc_head_len(const uint8_t* ip);

// One's-complement sum (RFC 1071) accumulated over pieces of any length; a
// piece may end in the middle of a 16-bit word.
class InetSum {
 public:
  void add(const uint8_t* p, size_t n);
  void add_word(uint16_t w) { sum_ += w; }
  // The folded 16-bit sum (not complemented).
  uint16_t fold() const;

 private:
  uint64_t sum_ = 0;
  bool odd_ = false;  // the last piece ended after the high byte of a word
};

// The UDP pseudo header (RFC 768, RFC 8200 8.1) of the datagram after the IP
// header at `ip`, of `udp_len` bytes, added to `sum`.
void add_udp_pseudo_header(InetSum* sum, const uint8_t* ip, size_t udp_len);

}  // namespace droce::wire
