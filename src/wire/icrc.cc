#include "wire/icrc.h"

#include <isa-l/crc.h>

#include <cstring>

#include "wire/bytes.h"
#include "wire/frame.h"

namespace droce::wire {

// isa-l's crc32_gzip_refl is the reflected IEEE CRC-32 (poly 0x04C11DB7) with
// the pre- and post-inversion of gzip/Ethernet, and it chains; CRC-32C would
// be the wrong polynomial.
uint32_t crc32(uint32_t crc, const uint8_t* data, size_t len) {
  return crc32_gzip_refl(crc, data, len);
}

size_t icrc_head_len(const uint8_t* ip) {
  return ((ip[0] >> 4) == 6 ? kIpv6Len : kIpv4Len) + kUdpLen + kBthLen;
}

uint32_t icrc_head(const uint8_t* ip) {
  // Pseudo header (IBA A17.8.1): 8 bytes of ones for the LRH, then the IP,
  // UDP and BTH headers with every field a router or switch may rewrite set
  // to ones: IPv4 TOS, TTL and checksum, or IPv6 traffic class, flow label
  // and hop limit; the UDP checksum; the BTH's FECN, BECN and reserved bits
  // (byte 4).
  uint8_t pseudo[8 + kIpv6Len + kUdpLen + kBthLen];
  std::memset(pseudo, 0xFF, 8);
  uint8_t* iph = pseudo + 8;
  size_t ip_len;
  if ((ip[0] >> 4) == 6) {
    ip_len = kIpv6Len;
    std::memcpy(iph, ip, ip_len + kUdpLen + kBthLen);
    iph[0] |= 0x0F;                  // traffic class, high nibble
    iph[1] = iph[2] = iph[3] = 0xFF;  // traffic class low nibble, flow label
    iph[7] = 0xFF;                    // hop limit
  } else {
    ip_len = kIpv4Len;
    std::memcpy(iph, ip, ip_len + kUdpLen + kBthLen);
    iph[1] = 0xFF;             // TOS (DSCP + ECN)
    iph[8] = 0xFF;             // TTL
    iph[10] = iph[11] = 0xFF;  // header checksum
  }
  uint8_t* udph = iph + ip_len;
  udph[6] = udph[7] = 0xFF;  // UDP checksum
  uint8_t* bth = udph + kUdpLen;
  bth[4] = 0xFF;             // FECN, BECN, reserved
  return crc32(0, pseudo, 8 + ip_len + kUdpLen + kBthLen);
}

uint32_t compute_icrc_v4(const uint8_t* ip, size_t ip_len) {
  const size_t head = kIpv4Len + kUdpLen + kBthLen;
  return crc32(icrc_head(ip), ip + head, ip_len - head - kIcrcLen);
}

uint32_t compute_icrc_v6(const uint8_t* ip, size_t ip_len) {
  const size_t head = kIpv6Len + kUdpLen + kBthLen;
  return crc32(icrc_head(ip), ip + head, ip_len - head - kIcrcLen);
}

uint32_t compute_icrc(const uint8_t* ip, size_t ip_len) {
  const size_t head = icrc_head_len(ip);
  return crc32(icrc_head(ip), ip + head, ip_len - head - kIcrcLen);
}

void InetSum::add(const uint8_t* p, size_t n) {
  if (n == 0) return;
  if (odd_) {
    sum_ += p[0];  // low byte of the word whose high byte ended the last piece
    ++p;
    --n;
    odd_ = false;
  }
  // 32-bit words: 2^16 == 1 (mod 0xFFFF), so their sum folds to the same
  // one's-complement sum as 16-bit words. 2^32 words cannot overflow.
  uint64_t s = 0;
  for (; n >= 8; p += 8, n -= 8) s += uint64_t{load_be32(p)} + load_be32(p + 4);
  for (; n >= 2; p += 2, n -= 2) s += load_be16(p);
  if (n == 1) {
    s += uint32_t{p[0]} << 8;
    odd_ = true;
  }
  sum_ += s;
}

uint16_t InetSum::fold() const {
  uint64_t s = sum_;
  while (s >> 16) s = (s & 0xFFFF) + (s >> 16);
  return static_cast<uint16_t>(s);
}

void add_udp_pseudo_header(InetSum* sum, const uint8_t* ip, size_t udp_len) {
  if ((ip[0] >> 4) == 6) {
    sum->add(ip + 8, 32);  // source and destination address
  } else {
    sum->add(ip + 12, 8);
  }
  // IPv4: zero, protocol, UDP length. IPv6: 32-bit upper-layer length, zeros,
  // next header. Both sum to the same words.
  sum->add_word(static_cast<uint16_t>(udp_len >> 16));
  sum->add_word(static_cast<uint16_t>(udp_len));
  sum->add_word(kIpProtoUdp);
}

uint16_t udp_checksum(const uint8_t* ip, size_t ip_len) {
  const size_t hlen = (ip[0] >> 4) == 6 ? kIpv6Len : kIpv4Len;
  const uint8_t* udp = ip + hlen;
  const size_t udp_len = ip_len - hlen;
  InetSum s;
  add_udp_pseudo_header(&s, ip, udp_len);
  s.add(udp, 6);  // without the checksum field
  s.add(udp + kUdpLen, udp_len - kUdpLen);
  const uint16_t c = static_cast<uint16_t>(~s.fold());
  return c == 0 ? 0xFFFF : c;
}

}  // namespace droce::wire
