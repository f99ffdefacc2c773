// Wire format: CRC-32 and the RoCEv2 ICRC, the frame parser and builder, PSN
// arithmetic and the IBA opcode table. The ICRC and IPv4 checksum are checked
// against references written here from the specs (not against droce's own
// code), and against real captured frames in golden_packets.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "golden_packets.h"
#include "wire/bytes.h"
#include "wire/frame.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/psn.h"

namespace droce::test {
namespace {

using wire::ParseError;
using Bytes = std::vector<uint8_t>;

// ---------------------------------------------------------------------------
// Independent references.

// Bitwise CRC-32/IEEE: reflected poly 0xEDB88320, init and final xor
// 0xFFFFFFFF (zlib.crc32). `crc` is a previous result, so it chains the same
// way zlib's crc32() does.
uint32_t RefCrc32(uint32_t crc, const uint8_t* p, size_t n) {
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint16_t Be16(const uint8_t* p) { return static_cast<uint16_t>(p[0] << 8 | p[1]); }

// RFC 1071 ones'-complement checksum of a 20-byte IPv4 header.
uint16_t RefIpv4Checksum(const uint8_t* ip) {
  uint32_t sum = 0;
  for (int i = 0; i < 20; i += 2) sum += Be16(ip + i);
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  return static_cast<uint16_t>(~sum);
}

// The ICRC of the RoCEv2/IPv4 packet at `ip` (IBA annex A17.8, as spelled out
// at the top of golden_packets.h): 8 bytes of ones for the missing LRH, then
// IP/UDP/BTH with the variant fields (TOS, TTL, IP checksum, UDP checksum,
// BTH byte 4) forced to ones, then the rest up to the ICRC.
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

// The ICRC as stored in the last 4 bytes (least significant byte first).
uint32_t StoredIcrc(const uint8_t* ip) {
  const uint8_t* p = ip + Be16(ip + 2) - 4;
  return uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 | uint32_t{p[3]} << 24;
}

// After editing a frame on purpose, make its IPv4 checksum and ICRC valid
// again so that the edit is the only defect the parser can find.
void FixIpChecksum(Bytes& f, size_t l3 = wire::kEthLen) {
  f[l3 + 10] = f[l3 + 11] = 0;
  const uint16_t c = RefIpv4Checksum(&f[l3]);
  f[l3 + 10] = static_cast<uint8_t>(c >> 8);
  f[l3 + 11] = static_cast<uint8_t>(c);
}
void FixIcrc(Bytes& f, size_t l3 = wire::kEthLen) {
  const uint32_t c = RefIcrcV4(&f[l3]);
  uint8_t* p = &f[l3 + Be16(&f[l3 + 2]) - 4];
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(c >> (8 * i));
}
void FixAll(Bytes& f, size_t l3 = wire::kEthLen) {
  FixIpChecksum(f, l3);
  FixIcrc(f, l3);
}

ParseError Parse(const Bytes& f, wire::PacketView* v = nullptr) {
  wire::PacketView tmp;
  return wire::parse_frame(std::span<const uint8_t>(f.data(), f.size()), v ? v : &tmp);
}

std::string Name(ParseError e) { return wire::parse_error_name(e); }

// ---------------------------------------------------------------------------
// Golden packets.

struct Golden {
  const char* name;
  Bytes bytes;
  uint32_t crc;
  uint8_t opcode;
};

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

// ---------------------------------------------------------------------------
// CRC-32.

TEST(Ipv4Checksum, MatchesRfc1071ForRandomHeaders) {
  // The word-at-a-time sum against the plain 16-bit big-endian loop, for
  // every even length up to 60 bytes (options included) and random bytes,
  // including all-ones headers whose sum needs several folds.
  std::mt19937 rng(1071);
  uint8_t h[60];
  for (int round = 0; round < 2000; ++round) {
    const size_t len = 2 * (rng() % 31);
    for (auto& b : h) b = round % 7 == 0 ? 0xFF : static_cast<uint8_t>(rng());
    uint32_t sum = 0;
    for (size_t i = 0; i + 1 < len; i += 2) sum += Be16(h + i);
    while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
    ASSERT_EQ(wire::ipv4_checksum(h, len), static_cast<uint16_t>(~sum)) << "len " << len << " round " << round;
  }
  // A header with its checksum filled in sums to zero.
  for (auto& b : h) b = static_cast<uint8_t>(rng());
  h[10] = h[11] = 0;
  const uint16_t c = wire::ipv4_checksum(h, 20);
  h[10] = static_cast<uint8_t>(c >> 8);
  h[11] = static_cast<uint8_t>(c);
  EXPECT_EQ(wire::ipv4_checksum(h, 20), 0);
  EXPECT_EQ(RefIpv4Checksum(h), 0);
}

TEST(Crc32, CheckValue) {
  // The catalogued check value of CRC-32/ISO-HDLC (the IEEE 802.3 CRC).
  const char* s = "123456789";
  EXPECT_EQ(wire::crc32(0, reinterpret_cast<const uint8_t*>(s), 9), 0xCBF43926u);
  EXPECT_EQ(RefCrc32(0, reinterpret_cast<const uint8_t*>(s), 9), 0xCBF43926u);
  EXPECT_EQ(wire::crc32(0, nullptr, 0), 0u);  // empty input: init ^ final
}

TEST(Crc32, MatchesBitwiseReferenceOnRandomBuffers) {
  // isa-l takes SIMD paths that depend on length and alignment; cover every
  // length up to a few cache lines, odd start offsets, and a few large sizes.
  std::mt19937 rng(1234);
  Bytes buf(70000 + 64);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  std::vector<size_t> lens;
  for (size_t n = 0; n <= 600; ++n) lens.push_back(n);
  for (size_t n : {1023u, 1024u, 1025u, 4095u, 4096u, 4097u, 9000u, 65536u, 70000u}) lens.push_back(n);
  for (size_t n : lens) {
    for (size_t off : {0u, 1u, 3u, 7u, 13u}) {
      const uint8_t* p = buf.data() + off;
      ASSERT_EQ(wire::crc32(0, p, n), RefCrc32(0, p, n)) << "len " << n << " offset " << off;
    }
  }
}

TEST(Crc32, Chains) {
  // icrc.h promises crc32(crc32(0, a), b) == crc32(0, a ++ b); the ICRC code
  // relies on it to hash the pseudo header and the payload separately.
  std::mt19937 rng(99);
  Bytes buf(5000);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (int t = 0; t < 2000; ++t) {
    const size_t n = rng() % buf.size();
    const size_t split = n == 0 ? 0 : rng() % (n + 1);
    const uint32_t whole = wire::crc32(0, buf.data(), n);
    const uint32_t chained = wire::crc32(wire::crc32(0, buf.data(), split), buf.data() + split, n - split);
    ASSERT_EQ(chained, whole) << "len " << n << " split " << split;
    ASSERT_EQ(whole, RefCrc32(0, buf.data(), n));
  }
}

// ---------------------------------------------------------------------------
// ICRC over the golden packets.

TEST(Icrc, ReferenceAgreesWithGoldenConstants) {
  // Guards the test's own reference before it is used to judge droce.
  for (const Golden& g : Goldens()) {
    const uint8_t* ip = g.bytes.data() + wire::kEthLen;
    EXPECT_EQ(RefIcrcV4(ip), g.crc) << g.name;
    EXPECT_EQ(StoredIcrc(ip), g.crc) << g.name << ": stored LSB first";
    EXPECT_EQ(RefIpv4Checksum(ip), 0) << g.name << ": valid header sums to 0";
    EXPECT_EQ(Be16(ip + 2) + wire::kEthLen, g.bytes.size()) << g.name;
  }
}

TEST(Icrc, ComputeMatchesGoldenPackets) {
  for (const Golden& g : Goldens()) {
    const uint8_t* ip = g.bytes.data() + wire::kEthLen;
    EXPECT_EQ(wire::compute_icrc_v4(ip, Be16(ip + 2)), g.crc) << g.name;
  }
}

TEST(Icrc, GoldenPacketsParse) {
  // Every golden opcode is in droce's table, so every frame must be accepted
  // whole, including the scapy one with a non-zero UDP checksum (masked out
  // of the ICRC, A17.8) and the one whose TOS/TTL/FECN/BECN a switch changed.
  for (const Golden& g : Goldens()) {
    ASSERT_TRUE(wire::opcode_known(g.opcode)) << g.name;
    wire::PacketView v;
    EXPECT_EQ(Name(Parse(g.bytes, &v)), "ok") << g.name;
    EXPECT_EQ(v.bth.opcode, g.opcode) << g.name;
    EXPECT_EQ(v.l3_offset, wire::kEthLen) << g.name;
    EXPECT_EQ(v.bth_offset, wire::kRoceV4HeadLen) << g.name;
    EXPECT_FALSE(v.has_vlan) << g.name;
  }
}

TEST(Icrc, GoldenPacketFieldsDecode) {
  // Field values stated in the comments of golden_packets.h.
  wire::PacketView v;
  {
    Bytes f(std::begin(kCx4LxCnp), std::end(kCx4LxCnp));
    ASSERT_EQ(Parse(f, &v), ParseError::kOk);
    EXPECT_EQ(v.sip, 0x0A001101u);
    EXPECT_EQ(v.dip, 0x0A001201u);
    EXPECT_EQ(v.tos, 0xC2);
    EXPECT_EQ(v.ttl, 64);
    EXPECT_EQ(v.udp_sport, 0);
    EXPECT_TRUE(v.bth.becn);
    EXPECT_FALSE(v.bth.fecn);
    EXPECT_EQ(v.bth.dqpn, 0x118u);
    EXPECT_EQ(v.payload_len, 0u);  // the 16 reserved bytes are header, not payload
    EXPECT_TRUE(v.info->mask & wire::kMaskCnp);
  }
  {
    Bytes f(std::begin(kHuaweiRcAck), std::end(kHuaweiRcAck));
    ASSERT_EQ(Parse(f, &v), ParseError::kOk);
    const wire::Aeth a = wire::read_aeth(v.ext(v.info->aeth));
    EXPECT_EQ(a.syndrome, 0x06);
    EXPECT_EQ(a.type(), wire::AckType::kAck);
    EXPECT_EQ(a.value(), 6);
    EXPECT_EQ(a.msn, 1u);
    EXPECT_TRUE(v.bth.migreq);
    EXPECT_EQ(v.bth.dqpn, 0x45u);
    EXPECT_EQ(v.bth.psn, 0u);
    EXPECT_EQ(v.udp_sport, 72);
  }
  {
    Bytes f(std::begin(kHuaweiRcSendOnlyImmPad3), std::end(kHuaweiRcSendOnlyImmPad3));
    ASSERT_EQ(Parse(f, &v), ParseError::kOk);
    EXPECT_EQ(v.bth.pad, 3);
    EXPECT_EQ(v.payload_len, 141u);
    EXPECT_EQ(wire::load_be32(v.ext(v.info->immdt)), 1u);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(v.payload), 14), "GET / HTTP/1.1");
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(v.payload) + 137, 4), "\r\n\r\n");
  }
  {
    Bytes f(std::begin(kRxeRcRdmaReadRequest), std::end(kRxeRcRdmaReadRequest));
    ASSERT_EQ(Parse(f, &v), ParseError::kOk);
    const wire::Reth r = wire::read_reth(v.ext(v.info->reth));
    EXPECT_EQ(r.va, 0x00007fee260fb000ull);
    EXPECT_EQ(r.rkey, 0x2B8u);
    EXPECT_EQ(r.dma_len, 65536u);
    EXPECT_EQ(v.bth.dqpn, 0x11u);
    EXPECT_TRUE(v.bth.ackreq);
    EXPECT_EQ(v.bth.psn, 0x54CB63u);
    EXPECT_EQ(v.udp_sport, 57236);
    EXPECT_EQ(v.payload_len, 0u);
  }
  {
    Bytes f(std::begin(kScapyUcSendOnlyPad2), std::end(kScapyUcSendOnlyPad2));
    ASSERT_EQ(Parse(f, &v), ParseError::kOk);
    EXPECT_EQ(v.bth.pad, 2);
    EXPECT_EQ(v.payload_len, 18u);  // 20 bytes after the BTH, 2 of them pad
    EXPECT_EQ(v.bth.dqpn, 211u);
    EXPECT_EQ(v.bth.psn, 13571856u);
    EXPECT_EQ(v.udp_sport, 49152);
    EXPECT_EQ(v.tos, 0x01);
  }
  {
    Bytes f(std::begin(kHuaweiRcSendOnlyImmMutated), std::end(kHuaweiRcSendOnlyImmMutated));
    ASSERT_EQ(Parse(f, &v), ParseError::kOk);
    EXPECT_TRUE(v.bth.fecn);
    EXPECT_TRUE(v.bth.becn);
    EXPECT_EQ(v.tos, 0x03);
    EXPECT_EQ(v.ttl, 63);
    EXPECT_EQ(v.payload_len, 4u);
    EXPECT_EQ(wire::load_be32(v.payload), 1u);
  }
}

// ---------------------------------------------------------------------------
// Corruption.

TEST(Corruption, EverySingleBitFlipOutsideMaskedFieldsIsRejected) {
  // CRC-32 detects every single-bit error, and the RFC 1071 sum detects every
  // single-bit error in the IP header, so a flip anywhere from the ethertype
  // to the last ICRC byte must be refused -- except in the fields that A17.8
  // masks out of the ICRC because the network may rewrite them:
  //   - the UDP checksum: masked, and droce does not verify UDP checksums
  //     (RoCEv2/IPv4 senders put 0 there; see the scapy vector), so accepted;
  //   - BTH byte 4 (FECN, BECN, reserved): masked, accepted.
  // The MAC addresses are not covered by the ICRC at all (the Ethernet FCS
  // protects them), so a flip there is accepted too.
  for (const Golden& g : Goldens()) {
    const size_t udp_csum = wire::kEthLen + wire::kIpv4Len + 6;
    const size_t bth_b4 = wire::kRoceV4HeadLen + 4;
    for (size_t byte = 0; byte < g.bytes.size(); ++byte) {
      for (int bit = 0; bit < 8; ++bit) {
        Bytes f = g.bytes;
        f[byte] ^= static_cast<uint8_t>(1u << bit);
        const ParseError e = Parse(f);
        const bool accepted = byte < 12 || byte == udp_csum || byte == udp_csum + 1 || byte == bth_b4;
        if (accepted) {
          ASSERT_EQ(Name(e), "ok") << g.name << " byte " << byte << " bit " << bit;
        } else {
          ASSERT_NE(Name(e), "ok") << g.name << " byte " << byte << " bit " << bit;
        }
        // A flip in the BTH or after it (outside byte 4) leaves the IP and UDP
        // headers intact, so only a transport-level error may catch it.
        if (byte >= wire::kRoceV4HeadLen && byte != bth_b4) {
          ASSERT_TRUE(e == ParseError::kBadIcrc || e == ParseError::kBadVersion ||
                      e == ParseError::kUnknownOpcode || e == ParseError::kBadLength ||
                      e == ParseError::kBadPad)
              << g.name << " byte " << byte << " bit " << bit << ": " << Name(e);
        }
      }
    }
  }
}

TEST(Corruption, TosAndTtlRewritesWithFixedChecksumAreAccepted) {
  // A router decrements TTL and may remark DSCP/ECN, fixing the IP checksum as
  // it goes; the ICRC masks TOS and TTL (A17.8) so the packet stays valid.
  // The ICRC is deliberately NOT recomputed here.
  for (const Golden& g : Goldens()) {
    for (size_t byte : {wire::kEthLen + 1, wire::kEthLen + 8}) {
      for (int bit = 0; bit < 8; ++bit) {
        Bytes f = g.bytes;
        f[byte] ^= static_cast<uint8_t>(1u << bit);
        FixIpChecksum(f);
        wire::PacketView v;
        ASSERT_EQ(Name(Parse(f, &v)), "ok") << g.name << " byte " << byte << " bit " << bit;
        EXPECT_EQ(v.tos, f[wire::kEthLen + 1]);
        EXPECT_EQ(v.ttl, f[wire::kEthLen + 8]);
      }
    }
  }
}

TEST(Corruption, FecnBecnRewritesAreAccepted) {
  // A17.8: BTH byte 4 is masked; switches set FECN (ECN marking translated by
  // the receiver) and BECN without touching the ICRC.
  for (const Golden& g : Goldens()) {
    for (uint8_t b4 : {0x00, 0x80, 0x40, 0xC0, 0x3F, 0xFF}) {
      Bytes f = g.bytes;
      f[wire::kRoceV4HeadLen + 4] = b4;
      wire::PacketView v;
      ASSERT_EQ(Name(Parse(f, &v)), "ok") << g.name << " byte4 " << int{b4};
      EXPECT_EQ(v.bth.fecn, (b4 & 0x80) != 0);
      EXPECT_EQ(v.bth.becn, (b4 & 0x40) != 0);
    }
  }
}

TEST(Corruption, AnyUdpChecksumValueIsAccepted) {
  // The UDP checksum is masked out of the ICRC; droce accepts whatever is
  // there, which the scapy vector (checksum 0xaca2) requires.
  for (const Golden& g : Goldens()) {
    for (uint16_t c : {0x0000, 0xFFFF, 0x1234}) {
      Bytes f = g.bytes;
      f[wire::kEthLen + wire::kIpv4Len + 6] = static_cast<uint8_t>(c >> 8);
      f[wire::kEthLen + wire::kIpv4Len + 7] = static_cast<uint8_t>(c);
      EXPECT_EQ(Name(Parse(f)), "ok") << g.name;
    }
  }
}

// ---------------------------------------------------------------------------
// Build -> parse round trips.

struct Built {
  Bytes frame;
  wire::Ipv4Path path;
  wire::Bth bth;
  Bytes payload;
};

// Builds a frame the way the transport does: outer headers, BTH, extended
// headers (written by `ext`), payload, zero pad, then the ICRC. The buffer
// starts as 0xA5 garbage so that a byte no writer sets would show.
Built Build(const wire::Ipv4Path& path, const wire::Bth& bth, const Bytes& payload,
            const std::function<void(uint8_t*, const wire::OpcodeInfo&)>& ext, uint16_t ip_id = 0x1234) {
  const wire::OpcodeInfo& info = wire::opcode_info(bth.opcode);
  const size_t roce_len = info.length + payload.size() + bth.pad + wire::kIcrcLen;
  Built b{Bytes(wire::kRoceV4HeadLen + roce_len, 0xA5), path, bth, payload};
  uint8_t* f = b.frame.data();
  const unsigned off = wire::write_outer_v4(f, path, roce_len, ip_id);
  EXPECT_EQ(off, wire::kRoceV4HeadLen);
  wire::write_bth(f + off, bth);
  if (info.mask & wire::kMaskCnp) std::memset(f + off + wire::kBthLen, 0, wire::kCnpPayloadLen);
  if (ext) ext(f + off, info);
  if (!payload.empty()) std::memcpy(f + off + info.length, payload.data(), payload.size());
  std::memset(f + off + info.length + payload.size(), 0, bth.pad);
  wire::finish_icrc_v4(f, b.frame.size());
  return b;
}

wire::Ipv4Path RandomPath(std::mt19937& rng) {
  wire::Ipv4Path p;
  for (auto& x : p.dmac) x = static_cast<uint8_t>(rng());
  for (auto& x : p.smac) x = static_cast<uint8_t>(rng());
  p.sip = rng();
  p.dip = rng();
  p.udp_sport = wire::udp_sport_for_qp(rng() & 0xFFFFFF, rng() & 0xFFFFFF);
  p.tos = static_cast<uint8_t>(rng());
  p.ttl = static_cast<uint8_t>(rng() | 1);
  return p;
}

wire::Bth RandomBth(std::mt19937& rng, uint8_t opcode, uint8_t pad) {
  wire::Bth b;
  b.opcode = opcode;
  b.se = rng() & 1;
  b.migreq = rng() & 1;
  b.pad = pad;
  b.pkey = static_cast<uint16_t>(rng());
  b.fecn = rng() & 1;
  b.becn = rng() & 1;
  b.dqpn = rng() & 0xFFFFFF;
  b.ackreq = rng() & 1;
  b.psn = rng() & 0xFFFFFF;
  return b;
}

Bytes RandomBytes(std::mt19937& rng, size_t n) {
  Bytes b(n);
  for (auto& x : b) x = static_cast<uint8_t>(rng());
  return b;
}

// Parses a built frame and checks every field against what was built.
void ExpectRoundTrip(const Built& b, wire::PacketView* out = nullptr) {
  wire::PacketView v;
  ASSERT_EQ(Name(Parse(b.frame, &v)), "ok") << "opcode " << int{b.bth.opcode} << " pad " << int{b.bth.pad};
  // The builder's output must also satisfy the independent references.
  const uint8_t* ip = b.frame.data() + wire::kEthLen;
  EXPECT_EQ(RefIpv4Checksum(ip), 0);
  EXPECT_EQ(StoredIcrc(ip), RefIcrcV4(ip));
  EXPECT_EQ(Be16(ip + 6), 0x4000) << "DF set, no fragment";
  EXPECT_EQ(Be16(ip + 4), 0x1234) << "IP ID";
  EXPECT_EQ(Be16(ip + 26), 0) << "RoCEv2/IPv4 sends no UDP checksum";
  EXPECT_EQ(ip[20 + 8 + 4] & 0x3F, 0) << "BTH resv6a";
  EXPECT_EQ(ip[20 + 8 + 8] & 0x7F, 0) << "BTH resv7";

  EXPECT_EQ(v.dmac, b.path.dmac);
  EXPECT_EQ(v.smac, b.path.smac);
  EXPECT_FALSE(v.has_vlan);
  EXPECT_EQ(v.sip, b.path.sip);
  EXPECT_EQ(v.dip, b.path.dip);
  EXPECT_EQ(v.tos, b.path.tos);
  EXPECT_EQ(v.ttl, b.path.ttl);
  EXPECT_EQ(v.udp_sport, b.path.udp_sport);
  EXPECT_EQ(v.bth.opcode, b.bth.opcode);
  EXPECT_EQ(v.bth.se, b.bth.se);
  EXPECT_EQ(v.bth.migreq, b.bth.migreq);
  EXPECT_EQ(v.bth.pad, b.bth.pad);
  EXPECT_EQ(v.bth.tver, 0);
  EXPECT_EQ(v.bth.pkey, b.bth.pkey);
  EXPECT_EQ(v.bth.fecn, b.bth.fecn);
  EXPECT_EQ(v.bth.becn, b.bth.becn);
  EXPECT_EQ(v.bth.dqpn, b.bth.dqpn);
  EXPECT_EQ(v.bth.ackreq, b.bth.ackreq);
  EXPECT_EQ(v.bth.psn, b.bth.psn);
  EXPECT_EQ(v.info, &wire::opcode_info(b.bth.opcode));
  ASSERT_EQ(v.payload_len, b.payload.size());
  EXPECT_TRUE(std::equal(b.payload.begin(), b.payload.end(), v.payload));
  for (unsigned i = 0; i < b.bth.pad; ++i) EXPECT_EQ(v.payload[v.payload_len + i], 0);
  if (out) *out = v;
}

TEST(RoundTrip, RcSendAllKindsAllPads) {
  // IBA 9.3: PadCnt makes the payload a multiple of 4; only the last (or only)
  // packet of a message can be short, FIRST and MIDDLE carry a full PMTU.
  std::mt19937 rng(7);
  struct Kind {
    uint8_t op;
    bool imm;
    bool can_pad;
  };
  const Kind kinds[] = {
      {wire::kRcSendFirst, false, false}, {wire::kRcSendMiddle, false, false},
      {wire::kRcSendLast, false, true},   {wire::kRcSendLastImm, true, true},
      {wire::kRcSendOnly, false, true},   {wire::kRcSendOnlyImm, true, true},
  };
  for (const Kind& k : kinds) {
    for (uint8_t pad = 0; pad < 4; ++pad) {
      if (!k.can_pad && pad != 0) continue;
      for (size_t base : {0u, 4u, 256u, 1024u, 4096u}) {
        size_t len = base + (4 - pad) % 4;  // payload + pad is a multiple of 4
        if (base == 0 && pad == 0 && !k.can_pad) len = 4;
        const Bytes payload = RandomBytes(rng, len);
        const uint32_t imm = rng();
        const Built b = Build(RandomPath(rng), RandomBth(rng, k.op, pad), payload,
                              [&](uint8_t* bth, const wire::OpcodeInfo& info) {
                                if (k.imm) wire::store_be32(bth + info.immdt, imm);
                              });
        wire::PacketView v;
        ExpectRoundTrip(b, &v);
        if (::testing::Test::HasFatalFailure()) return;
        const auto& info = wire::opcode_info(k.op);
        EXPECT_EQ(info.immdt != 0, k.imm);
        if (k.imm) {
          EXPECT_EQ(wire::load_be32(v.ext(info.immdt)), imm);
        }
        EXPECT_EQ(v.payload, v.bth_ptr() + (k.imm ? 16 : 12));
      }
    }
  }
}

TEST(RoundTrip, RcAckEveryAethKind) {
  // IBA 9.7.5.1 / table 43: syndrome bits 7..5 select ACK (credit count),
  // RNR NAK (timer) or NAK (code); MSN is 24 bits.
  std::mt19937 rng(8);
  std::vector<wire::Aeth> aeths;
  for (uint8_t c = 0; c < 32; ++c) aeths.push_back(wire::Aeth::ack(rng(), c));
  aeths.push_back(wire::Aeth::ack(0xFFFFFF));
  for (uint8_t t = 0; t < 32; ++t) aeths.push_back(wire::Aeth::rnr_nak(rng(), t));
  for (wire::NakCode code : {wire::NakCode::kPsnSeqError, wire::NakCode::kInvalidRequest,
                             wire::NakCode::kRemoteAccessError, wire::NakCode::kRemoteOperationalError,
                             wire::NakCode::kInvalidRdRequest}) {
    aeths.push_back(wire::Aeth::nak(rng(), code));
  }
  for (const wire::Aeth& a : aeths) {
    const Built b = Build(RandomPath(rng), RandomBth(rng, wire::kRcAck, 0), {},
                          [&](uint8_t* bth, const wire::OpcodeInfo& info) { wire::write_aeth(bth + info.aeth, a); });
    wire::PacketView v;
    ExpectRoundTrip(b, &v);
    if (::testing::Test::HasFatalFailure()) return;
    const wire::Aeth got = wire::read_aeth(v.ext(v.info->aeth));
    EXPECT_EQ(got.syndrome, a.syndrome);
    EXPECT_EQ(got.msn, a.msn);
    EXPECT_EQ(got.type(), a.type());
    EXPECT_EQ(got.value(), a.value());
  }
  // The constructors encode what they claim.
  EXPECT_EQ(wire::Aeth::ack(5).type(), wire::AckType::kAck);
  EXPECT_EQ(wire::Aeth::ack(5).value(), wire::kCreditInvalid);
  EXPECT_EQ(wire::Aeth::ack(0x1234567, 3).msn, 0x234567u);
  EXPECT_EQ(wire::Aeth::rnr_nak(1, 14).type(), wire::AckType::kRnrNak);
  EXPECT_EQ(wire::Aeth::rnr_nak(1, 14).value(), 14);
  EXPECT_EQ(wire::Aeth::rnr_nak(1, 14).syndrome, 0x2E);
  EXPECT_EQ(wire::Aeth::nak(1, wire::NakCode::kRemoteAccessError).type(), wire::AckType::kNak);
  EXPECT_EQ(wire::Aeth::nak(1, wire::NakCode::kRemoteAccessError).syndrome, 0x62);
  EXPECT_EQ(wire::Aeth::nak(1, wire::NakCode::kInvalidRdRequest).value(), 4);
}

TEST(RoundTrip, EveryKnownOpcodeWithRandomHeaders) {
  // Each extended header written at the table's offset reads back unchanged,
  // so the table, the writers and the readers agree.
  std::mt19937 rng(9);
  for (int op = 0; op < 256; ++op) {
    const wire::OpcodeInfo& info = wire::opcode_info(static_cast<uint8_t>(op));
    if (info.name == nullptr) continue;
    for (int rep = 0; rep < 8; ++rep) {
      const bool payload_ok = info.mask & wire::kMaskPayload;
      const size_t len = payload_ok ? rng() % 200 : 0;
      const uint8_t pad = static_cast<uint8_t>((4 - len % 4) % 4);
      const wire::Reth reth{(uint64_t{rng()} << 32) | rng(), static_cast<uint32_t>(rng()),
                            static_cast<uint32_t>(rng())};
      const wire::Aeth aeth{static_cast<uint8_t>(rng()), static_cast<uint32_t>(rng() & 0xFFFFFF)};
      const wire::AtomicEth atomic{(uint64_t{rng()} << 32) | rng(), static_cast<uint32_t>(rng()),
                                   (uint64_t{rng()} << 32) | rng(), (uint64_t{rng()} << 32) | rng()};
      const uint64_t orig = (uint64_t{rng()} << 32) | rng();
      const wire::Deth deth{static_cast<uint32_t>(rng()), static_cast<uint32_t>(rng() & 0xFFFFFF)};
      const uint32_t imm = rng(), ieth = rng();
      const Built b = Build(RandomPath(rng), RandomBth(rng, static_cast<uint8_t>(op), pad),
                            RandomBytes(rng, len), [&](uint8_t* p, const wire::OpcodeInfo& i) {
                              if (i.reth) wire::write_reth(p + i.reth, reth);
                              if (i.aeth) wire::write_aeth(p + i.aeth, aeth);
                              if (i.atomic_eth) wire::write_atomic_eth(p + i.atomic_eth, atomic);
                              if (i.atomic_ack_eth) wire::write_atomic_ack_eth(p + i.atomic_ack_eth, {orig});
                              if (i.deth) wire::write_deth(p + i.deth, deth);
                              if (i.immdt) wire::write_immdt(p + i.immdt, imm);
                              if (i.ieth) wire::write_ieth(p + i.ieth, ieth);
                            });
      wire::PacketView v;
      ExpectRoundTrip(b, &v);
      if (::testing::Test::HasFatalFailure()) return;
      if (info.reth) {
        const wire::Reth r = wire::read_reth(v.ext(info.reth));
        EXPECT_EQ(r.va, reth.va);
        EXPECT_EQ(r.rkey, reth.rkey);
        EXPECT_EQ(r.dma_len, reth.dma_len);
      }
      if (info.aeth) {
        const wire::Aeth a = wire::read_aeth(v.ext(info.aeth));
        EXPECT_EQ(a.syndrome, aeth.syndrome);
        EXPECT_EQ(a.msn, aeth.msn);
      }
      if (info.atomic_eth) {
        const wire::AtomicEth a = wire::read_atomic_eth(v.ext(info.atomic_eth));
        EXPECT_EQ(a.va, atomic.va);
        EXPECT_EQ(a.rkey, atomic.rkey);
        EXPECT_EQ(a.swap_add, atomic.swap_add);
        EXPECT_EQ(a.compare, atomic.compare);
      }
      if (info.atomic_ack_eth) {
        EXPECT_EQ(wire::read_atomic_ack_eth(v.ext(info.atomic_ack_eth)).orig, orig);
        EXPECT_EQ(wire::load_be64(v.ext(info.atomic_ack_eth)), orig) << "big-endian on the wire";
      }
      if (info.deth) {
        const wire::Deth d = wire::read_deth(v.ext(info.deth));
        EXPECT_EQ(d.qkey, deth.qkey);
        EXPECT_EQ(d.src_qp, deth.src_qp);
        EXPECT_EQ(v.ext(info.deth)[4], 0) << "DETH reserved byte";
      }
      if (info.immdt) {
        EXPECT_EQ(wire::read_immdt(v.ext(info.immdt)), imm);
        EXPECT_EQ(wire::load_be32(v.ext(info.immdt)), imm);
      }
      if (info.ieth) {
        EXPECT_EQ(wire::read_ieth(v.ext(info.ieth)), ieth);
        EXPECT_EQ(wire::load_be32(v.ext(info.ieth)), ieth);
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Malformed input.

TEST(Malformed, EveryTruncationIsRejectedWithoutOverread) {
  // Each prefix is copied into its own exact-size heap buffer, so an
  // out-of-bounds read would be caught by ASan builds.
  for (const Golden& g : Goldens()) {
    for (size_t n = 0; n < g.bytes.size(); ++n) {
      Bytes f(g.bytes.begin(), g.bytes.begin() + static_cast<std::ptrdiff_t>(n));
      EXPECT_NE(Name(Parse(f)), "ok") << g.name << " truncated to " << n;
    }
  }
}

TEST(Malformed, TruncatedAfterFixingLengthsIsRejected) {
  // Shorter packets whose IP and UDP lengths are consistent (so the length
  // checks pass) must still fail: too short for the BTH + ICRC, or for the
  // opcode's extended headers.
  Bytes base(std::begin(kRxeRcRdmaReadRequest), std::end(kRxeRcRdmaReadRequest));
  for (size_t roce = 0; roce < wire::kBthLen + wire::kRethLen + wire::kIcrcLen; ++roce) {
    Bytes f(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(
                                             std::min(base.size(), wire::kRoceV4HeadLen + roce)));
    f.resize(wire::kRoceV4HeadLen + roce, 0);
    wire::store_be16(&f[16], static_cast<uint16_t>(28 + roce));
    wire::store_be16(&f[38], static_cast<uint16_t>(8 + roce));
    FixIpChecksum(f);
    const ParseError e = Parse(f);
    if (roce < wire::kBthLen + wire::kIcrcLen) {
      EXPECT_EQ(Name(e), "truncated") << roce;
    } else {
      EXPECT_EQ(Name(e), "bad_length") << roce;
    }
  }
}

TEST(Malformed, BadIpChecksum) {
  for (const Golden& g : Goldens()) {
    Bytes f = g.bytes;
    f[wire::kEthLen + 11] ^= 0x01;
    EXPECT_EQ(Name(Parse(f)), "bad_ip_checksum") << g.name;
  }
}

TEST(Malformed, NotUdpPort4791) {
  // RoCEv2 is identified by UDP destination port 4791 (A17.2.2); other UDP
  // traffic is not for the transport.
  for (uint16_t port : {4790, 4792, 0, 0xFFFF, 0xB712}) {
    Bytes f(std::begin(kHuaweiRcAck), std::end(kHuaweiRcAck));
    wire::store_be16(&f[wire::kEthLen + wire::kIpv4Len + 2], port);
    FixIcrc(f);
    EXPECT_EQ(Name(Parse(f)), "not_roce") << port;
  }
}

TEST(Malformed, NonZeroTver) {
  // IBA 9.2: TVer must be 0; a packet with another version is dropped.
  for (uint8_t tver = 1; tver < 16; ++tver) {
    Bytes f(std::begin(kHuaweiRcSendOnlyImm), std::end(kHuaweiRcSendOnlyImm));
    f[wire::kRoceV4HeadLen + 1] = static_cast<uint8_t>((f[wire::kRoceV4HeadLen + 1] & 0xF0) | tver);
    FixIcrc(f);
    EXPECT_EQ(Name(Parse(f)), "bad_version") << int{tver};
  }
}

TEST(Malformed, UnknownOpcodes) {
  // Every opcode outside droce's table is refused, with a valid ICRC.
  int tried = 0;
  for (int op = 0; op < 256; ++op) {
    if (wire::opcode_known(static_cast<uint8_t>(op))) continue;
    Bytes f(std::begin(kHuaweiRcSendOnlyImm), std::end(kHuaweiRcSendOnlyImm));
    f[wire::kRoceV4HeadLen] = static_cast<uint8_t>(op);
    FixIcrc(f);
    EXPECT_EQ(Name(Parse(f)), "unknown_opcode") << op;
    ++tried;
  }
  EXPECT_EQ(tried, 256 - 62);
}

TEST(Malformed, PadLargerThanPayload) {
  // IBA 9.3: PadCnt counts bytes of the payload field; it cannot exceed it.
  {
    // An ACK has no payload, so any pad is too much.
    Bytes f(std::begin(kHuaweiRcAck), std::end(kHuaweiRcAck));
    for (uint8_t pad = 1; pad < 4; ++pad) {
      f[wire::kRoceV4HeadLen + 1] = static_cast<uint8_t>((f[wire::kRoceV4HeadLen + 1] & 0xCF) | pad << 4);
      FixIcrc(f);
      EXPECT_EQ(Name(Parse(f)), "bad_pad") << int{pad};
    }
  }
  {
    // SEND ONLY with 2 bytes after the BTH: pad 2 is fine, pad 3 is not.
    std::mt19937 rng(3);
    for (uint8_t pad = 0; pad < 4; ++pad) {
      wire::Bth bth = RandomBth(rng, wire::kRcSendOnly, 0);
      Built b = Build(RandomPath(rng), bth, Bytes{0x11, 0x22}, nullptr);
      b.frame[wire::kRoceV4HeadLen + 1] =
          static_cast<uint8_t>((b.frame[wire::kRoceV4HeadLen + 1] & 0xCF) | pad << 4);
      FixIcrc(b.frame);
      wire::PacketView v;
      const ParseError e = Parse(b.frame, &v);
      if (pad <= 2) {
        EXPECT_EQ(Name(e), "ok") << int{pad};
        EXPECT_EQ(v.payload_len, 2u - pad);
      } else {
        EXPECT_EQ(Name(e), "bad_pad") << int{pad};
      }
    }
  }
}

TEST(Malformed, PayloadOnOpcodeWithoutPayload) {
  // An ACK, a READ request and a CNP have a fixed size; extra bytes before
  // the ICRC are a malformed packet, not a payload.
  for (const Bytes& base : {Bytes(std::begin(kHuaweiRcAck), std::end(kHuaweiRcAck)),
                            Bytes(std::begin(kRxeRcRdmaReadRequest), std::end(kRxeRcRdmaReadRequest)),
                            Bytes(std::begin(kCx4LxCnp), std::end(kCx4LxCnp))}) {
    Bytes f = base;
    f.insert(f.end() - 4, {1, 2, 3, 4});
    wire::store_be16(&f[16], static_cast<uint16_t>(Be16(&f[16]) + 4));
    wire::store_be16(&f[38], static_cast<uint16_t>(Be16(&f[38]) + 4));
    FixAll(f);
    EXPECT_EQ(Name(Parse(f)), "bad_length") << int{f[wire::kRoceV4HeadLen]};
  }
}

TEST(Malformed, NonIpEthertypesAndVersionMismatch) {
  // ARP goes to the ARP responder, LLDP and the like are dropped: neither is
  // for the RoCE path. An IP version nibble that contradicts the EtherType
  // is a malformed frame.
  for (uint16_t type : {wire::kEtherTypeArp, uint16_t{0x88CC}, uint16_t{0x0000}, uint16_t{0x88F7}}) {
    Bytes f(std::begin(kHuaweiRcAck), std::end(kHuaweiRcAck));
    wire::store_be16(&f[12], type);
    EXPECT_EQ(Name(Parse(f)), "not_ipv4") << type;
  }
  {
    Bytes f(std::begin(kHuaweiRcAck), std::end(kHuaweiRcAck));  // IPv4 header, IPv6 EtherType
    wire::store_be16(&f[12], wire::kEtherTypeIpv6);
    f.resize(f.size() + 40, 0);  // long enough for an IPv6 header
    EXPECT_EQ(Name(Parse(f)), "bad_ip_version");
  }
  for (uint8_t ver : {0, 5, 6, 15}) {
    Bytes f(std::begin(kHuaweiRcAck), std::end(kHuaweiRcAck));  // IPv4 EtherType, version != 4
    f[wire::kEthLen] = static_cast<uint8_t>(ver << 4 | 5);
    FixAll(f);
    EXPECT_EQ(Name(Parse(f)), "bad_ip_version") << int{ver};
  }
}

TEST(Malformed, IpHeaderProblems) {
  const Bytes base(std::begin(kHuaweiRcSendOnlyImm), std::end(kHuaweiRcSendOnlyImm));
  {
    Bytes f = base;  // IHL 6: options, which RoCEv2 never sends
    f[wire::kEthLen] = 0x46;
    FixIpChecksum(f);
    EXPECT_EQ(Name(Parse(f)), "ip_options");
  }
  for (uint16_t frag : {0x2000, 0x0001, 0x4001, 0x1FFF}) {  // MF or a fragment offset
    Bytes f = base;
    wire::store_be16(&f[wire::kEthLen + 6], frag);
    FixIpChecksum(f);
    EXPECT_EQ(Name(Parse(f)), "ip_fragment") << frag;
  }
  {
    Bytes f = base;  // RoCE NICs set DF, but a clear DF is not a fragment
    wire::store_be16(&f[wire::kEthLen + 6], 0x0000);
    FixAll(f);       // the flags are covered by the ICRC
    EXPECT_EQ(Name(Parse(f)), "ok");
  }
  {
    Bytes f = base;  // TCP
    f[wire::kEthLen + 9] = 6;
    FixIpChecksum(f);
    EXPECT_EQ(Name(Parse(f)), "not_udp");
  }
  for (size_t total : {size_t{0}, size_t{19}, base.size() - wire::kEthLen + 1, size_t{0xFFFF}}) {
    Bytes f = base;  // total length beyond the frame, or below the header
    wire::store_be16(&f[wire::kEthLen + 2], static_cast<uint16_t>(total));
    FixIpChecksum(f);
    EXPECT_EQ(Name(Parse(f)), "bad_ip_length") << total;
  }
  for (int delta : {-1, 1, -4, 4}) {
    Bytes f = base;  // UDP length disagrees with the IP total length
    wire::store_be16(&f[wire::kEthLen + 24], static_cast<uint16_t>(Be16(&f[wire::kEthLen + 24]) + delta));
    EXPECT_EQ(Name(Parse(f)), "bad_udp_length") << delta;
  }
  {
    Bytes f = base;  // bad ICRC, all else fine
    f.back() ^= 0x80;
    EXPECT_EQ(Name(Parse(f)), "icrc_err");
  }
}

TEST(Malformed, EthernetPaddingIsIgnored) {
  // Short frames are padded to the 60-byte Ethernet minimum; the IP total
  // length, not the frame length, says where the ICRC is.
  for (const Golden& g : Goldens()) {
    Bytes f = g.bytes;
    f.resize(f.size() + 10, 0);
    wire::PacketView v;
    EXPECT_EQ(Name(Parse(f, &v)), "ok") << g.name;
    wire::PacketView ref;
    ASSERT_EQ(Parse(g.bytes, &ref), ParseError::kOk);
    EXPECT_EQ(v.payload_len, ref.payload_len) << g.name;
  }
}

TEST(Malformed, VlanTaggedFrame) {
  // IEEE 802.1Q: a 4-byte tag (TPID 0x8100, TCI) sits between the source MAC
  // and the ethertype. The ICRC does not cover L2, so it stays valid.
  for (const Golden& g : Goldens()) {
    const uint16_t tci = 0x6007;  // PCP 3, VID 7
    Bytes f = g.bytes;
    f.insert(f.begin() + 12, {0x81, 0x00, static_cast<uint8_t>(tci >> 8), static_cast<uint8_t>(tci)});
    wire::PacketView v, ref;
    ASSERT_EQ(Name(Parse(f, &v)), "ok") << g.name;
    ASSERT_EQ(Parse(g.bytes, &ref), ParseError::kOk);
    EXPECT_TRUE(v.has_vlan);
    EXPECT_EQ(v.vlan_tci, tci);
    EXPECT_EQ(v.l3_offset, wire::kEthLen + wire::kVlanLen);
    EXPECT_EQ(v.bth_offset, wire::kRoceV4HeadLen + wire::kVlanLen);
    EXPECT_EQ(v.bth.opcode, ref.bth.opcode);
    EXPECT_EQ(v.bth.psn, ref.bth.psn);
    EXPECT_EQ(v.sip, ref.sip);
    EXPECT_EQ(v.payload_len, ref.payload_len);
    EXPECT_EQ(0, std::memcmp(v.payload, ref.payload, ref.payload_len));
    EXPECT_EQ(v.payload - f.data(), ref.payload - g.bytes.data() + 4);
    // Tagged truncations, including inside the tag.
    for (size_t n = 0; n < f.size(); ++n) {
      Bytes t(f.begin(), f.begin() + static_cast<std::ptrdiff_t>(n));
      EXPECT_NE(Name(Parse(t)), "ok") << g.name << " tagged, truncated to " << n;
    }
    // Corruption after the tag is still caught.
    Bytes c = f;
    c[wire::kRoceV4HeadLen + wire::kVlanLen + 9] ^= 1;  // PSN
    EXPECT_EQ(Name(Parse(c)), "icrc_err");
  }
}

TEST(Malformed, ErrorNamesAreDistinct) {
  // Counters and logs are keyed by these names.
  std::set<std::string> names;
  for (int e = 0; e < static_cast<int>(ParseError::kCount); ++e) {
    const std::string n = wire::parse_error_name(static_cast<ParseError>(e));
    EXPECT_NE(n, "unknown") << e;
    EXPECT_TRUE(names.insert(n).second) << n;
  }
}

// ---------------------------------------------------------------------------
// PSN arithmetic (IBA 9.7.1: 24-bit, compared within half the space).

TEST(Psn, AddWrapsAt2To24) {
  EXPECT_EQ(wire::psn_add(0xFFFFFF, 1), 0u);
  EXPECT_EQ(wire::psn_add(0xFFFFF0, 0x20), 0x10u);
  EXPECT_EQ(wire::psn_add(5, 0x1000000), 5u);
  EXPECT_EQ(wire::psn_add(0, 0xFFFFFF), 0xFFFFFFu);
  EXPECT_EQ(wire::psn_add(0x123456, 0), 0x123456u);
}

TEST(Psn, DiffAndCompareAcrossTheWrap) {
  EXPECT_EQ(wire::psn_diff(1, 0xFFFFFF), 2);
  EXPECT_EQ(wire::psn_diff(0xFFFFFF, 1), -2);
  EXPECT_EQ(wire::psn_diff(0, 0xFFFFFF), 1);
  EXPECT_TRUE(wire::psn_lt(0xFFFFFF, 0x000001));
  EXPECT_FALSE(wire::psn_lt(0x000001, 0xFFFFFF));
  EXPECT_TRUE(wire::psn_le(0xFFFFFF, 0xFFFFFF));
  EXPECT_FALSE(wire::psn_lt(0xFFFFFF, 0xFFFFFF));
  EXPECT_TRUE(wire::psn_le(0xFFFFF0, 0x10));
  EXPECT_FALSE(wire::psn_le(0x10, 0xFFFFF0));
}

TEST(Psn, GreaterAcrossTheWrap) {
  EXPECT_TRUE(wire::psn_gt(0x000001, 0xFFFFFF));
  EXPECT_FALSE(wire::psn_gt(0xFFFFFF, 0xFFFFFF));
  EXPECT_TRUE(wire::psn_ge(0xFFFFFF, 0xFFFFFF));
  EXPECT_FALSE(wire::psn_ge(0xFFFFFE, 0xFFFFFF));
}

TEST(Psn, WindowIsHalfTheSpace) {
  // Distances in [-2^23, 2^23) are exact; 2^23 ahead reads as 2^23 behind.
  for (uint32_t a : {0u, 1u, 0x7FFFFFu, 0x800000u, 0xFFFFFEu, 0xFFFFFFu, 0x123456u}) {
    EXPECT_EQ(wire::psn_diff(wire::psn_add(a, 0x7FFFFF), a), 0x7FFFFF) << a;
    EXPECT_TRUE(wire::psn_lt(a, wire::psn_add(a, 0x7FFFFF))) << a;
    EXPECT_EQ(wire::psn_diff(wire::psn_add(a, 0x800000), a), -0x800000) << a;
    EXPECT_TRUE(wire::psn_lt(wire::psn_add(a, 0x800000), a)) << a;
    EXPECT_EQ(wire::psn_diff(wire::psn_add(a, 0x800001), a), -0x7FFFFF) << a;
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t a = rng() & 0xFFFFFF;
    const int32_t d = static_cast<int32_t>(rng() % 0x1000000) - 0x800000;  // [-2^23, 2^23)
    const uint32_t b = wire::psn_add(a, static_cast<uint32_t>(d) & 0xFFFFFF);
    ASSERT_EQ(wire::psn_diff(b, a), d) << a << " " << d;
    ASSERT_EQ(wire::psn_lt(b, a), d < 0);
    ASSERT_EQ(wire::psn_le(b, a), d <= 0);
    ASSERT_EQ(wire::psn_gt(b, a), d > 0);
    ASSERT_EQ(wire::psn_ge(b, a), d >= 0);
  }
}

TEST(UdpSport, AlwaysInRxeRangeAndSpread) {
  // 0xC000-0xFFFF (the IANA dynamic range rxe draws from); varied across QPs
  // so that ECMP spreads flows.
  std::mt19937 rng(6);
  std::set<uint16_t> seen;
  for (int i = 0; i < 200000; ++i) {
    const uint32_t s = i < 1000 ? static_cast<uint32_t>(i) : rng();
    const uint32_t d = i < 1000 ? 0x11 : rng();
    const uint16_t p = wire::udp_sport_for_qp(s, d);
    ASSERT_GE(p, 0xC000) << s << " " << d;
    if (i < 1000) seen.insert(p);
  }
  EXPECT_GT(seen.size(), 900u) << "1000 consecutive source QPNs should map to many ports";
  for (uint32_t q : {0u, 0xFFFFFFu, 0xFFFFFFFFu}) EXPECT_GE(wire::udp_sport_for_qp(q, q), 0xC000);
}

// ---------------------------------------------------------------------------
// Opcode table (IBA 9.2 table 35, 9.3 header layout; A17.9.4 CNP).

TEST(OpcodeTable, SpotChecksAgainstIba) {
  const auto& wi = wire::opcode_info(wire::kRcWriteOnlyImm);  // BTH RETH ImmDt
  EXPECT_EQ(wi.reth, 12);
  EXPECT_EQ(wi.immdt, 28);
  EXPECT_EQ(wi.length, 32);
  EXPECT_EQ(wi.payload, 32);
  EXPECT_TRUE(wi.mask & wire::kMaskRecvWqe) << "write with immediate consumes a receive WQE";

  const auto& aa = wire::opcode_info(wire::kRcAtomicAck);  // BTH AETH AtomicAckETH
  EXPECT_EQ(aa.aeth, 12);
  EXPECT_EQ(aa.atomic_ack_eth, 16);
  EXPECT_EQ(aa.length, 24);
  EXPECT_FALSE(aa.mask & wire::kMaskPayload);

  for (uint8_t op : {wire::kRcFetchAdd, wire::kRcCompareSwap}) {  // BTH AtomicETH
    const auto& fa = wire::opcode_info(op);
    EXPECT_EQ(fa.atomic_eth, 12);
    EXPECT_EQ(fa.length, 40);
    EXPECT_EQ(fa.reth, 0);
  }

  const auto& ud = wire::opcode_info(wire::kUdSendOnlyImm);  // BTH DETH ImmDt
  EXPECT_EQ(ud.deth, 12);
  EXPECT_EQ(ud.immdt, 20);
  EXPECT_EQ(ud.length, 24);

  const auto& inv = wire::opcode_info(wire::kRcSendLastInv);  // BTH IETH
  EXPECT_EQ(inv.ieth, 12);
  EXPECT_EQ(inv.length, 16);
  EXPECT_EQ(wire::opcode_info(wire::kRcSendOnlyInv).ieth, 12);

  const auto& cnp = wire::opcode_info(wire::kCnp);  // BTH + 16 reserved bytes
  EXPECT_EQ(cnp.length, 28);
  EXPECT_FALSE(cnp.mask & wire::kMaskPayload);

  const auto& rr = wire::opcode_info(wire::kRcReadRequest);  // BTH RETH
  EXPECT_EQ(rr.reth, 12);
  EXPECT_EQ(rr.length, 28);
  EXPECT_EQ(wire::opcode_info(wire::kRcAck).aeth, 12);
  EXPECT_EQ(wire::opcode_info(wire::kRcAck).length, 16);
  // READ RESPONSE FIRST/LAST/ONLY carry an AETH, MIDDLE does not (9.7.5.1.2).
  EXPECT_EQ(wire::opcode_info(wire::kRcReadResponseFirst).aeth, 12);
  EXPECT_EQ(wire::opcode_info(wire::kRcReadResponseMiddle).aeth, 0);
  EXPECT_EQ(wire::opcode_info(wire::kRcReadResponseMiddle).length, 12);
  EXPECT_EQ(wire::opcode_info(wire::kRcReadResponseLast).aeth, 12);
  EXPECT_EQ(wire::opcode_info(wire::kRcReadResponseOnly).aeth, 12);
  // Only FIRST/ONLY writes carry the RETH.
  EXPECT_EQ(wire::opcode_info(wire::kRcWriteFirst).reth, 12);
  EXPECT_EQ(wire::opcode_info(wire::kRcWriteMiddle).reth, 0);
  EXPECT_EQ(wire::opcode_info(wire::kRcWriteLast).reth, 0);
  EXPECT_EQ(wire::opcode_info(wire::kUcWriteOnlyImm).immdt, 28);
  EXPECT_EQ(wire::opcode_info(wire::kUdSendOnly).length, 20);
}

TEST(OpcodeTable, UnknownOpcodesHaveNoName) {
  // Reserved in IBA or not supported by droce (RD, FLUSH, XRC's FLUSH and
  // ATOMIC WRITE).
  std::vector<int> unknown = {0x15};
  for (int op = 0x18; op <= 0x1F; ++op) {
    if (op != wire::kRcAtomicWrite) unknown.push_back(op);
  }
  for (int op = 0x2C; op <= 0x63; ++op) unknown.push_back(op);
  for (int op = 0x66; op <= 0x80; ++op) unknown.push_back(op);
  for (int op = 0x82; op <= 0x9F; ++op) unknown.push_back(op);
  unknown.push_back(0xB5);
  for (int op = 0xB8; op <= 0xFF; ++op) unknown.push_back(op);
  for (int op : unknown) {
    EXPECT_EQ(wire::opcode_info(static_cast<uint8_t>(op)).name, nullptr) << op;
    EXPECT_FALSE(wire::opcode_known(static_cast<uint8_t>(op))) << op;
  }
  // ...and everything else is known: 256 - 194 = 62 opcodes.
  EXPECT_EQ(unknown.size(), 194u);
  int known = 0;
  for (int op = 0; op < 256; ++op) known += wire::opcode_known(static_cast<uint8_t>(op));
  EXPECT_EQ(known, 62);
}

TEST(OpcodeTable, LayoutIsConsistent) {
  // For every known opcode: headers follow the BTH in IBA order without gaps
  // or overlap, and the payload starts right after the last one.
  std::set<std::string> names;
  for (int op = 0; op < 256; ++op) {
    const wire::OpcodeInfo& i = wire::opcode_info(static_cast<uint8_t>(op));
    if (i.name == nullptr) continue;
    EXPECT_TRUE(names.insert(i.name).second) << i.name;
    struct H {
      uint8_t off;
      unsigned len;
      uint32_t bit;
    };
    const H hs[] = {{i.xrceth, wire::kXrcEthLen, wire::kMaskXrceth},
                    {i.deth, wire::kDethLen, wire::kMaskDeth},
                    {i.reth, wire::kRethLen, wire::kMaskReth},
                    {i.atomic_eth, wire::kAtomicEthLen, wire::kMaskAtomicEth},
                    {i.aeth, wire::kAethLen, wire::kMaskAeth},
                    {i.atomic_ack_eth, wire::kAtomicAckEthLen, wire::kMaskAtomicAckEth},
                    {i.immdt, wire::kImmDtLen, wire::kMaskImmDt},
                    {i.ieth, wire::kIethLen, wire::kMaskIeth}};
    unsigned off = wire::kBthLen;
    for (const H& h : hs) {
      EXPECT_EQ(h.off != 0, (i.mask & h.bit) != 0) << i.name;
      if (h.off == 0) continue;
      EXPECT_EQ(h.off, off) << i.name;
      off += h.len;
    }
    if (i.mask & wire::kMaskCnp) off += wire::kCnpPayloadLen;
    EXPECT_EQ(i.length, off) << i.name;
    EXPECT_EQ(i.payload, i.length) << i.name;
    // Exactly one of first/middle/last/only position, except ACK-like and CNP.
    const bool first = i.mask & wire::kMaskFirst, mid = i.mask & wire::kMaskMiddle,
               last = i.mask & wire::kMaskLast;
    if (!(i.mask & wire::kMaskCnp)) {
      EXPECT_TRUE(mid ? !(first || last) : (first || last)) << i.name;
    }
    EXPECT_NE((i.mask & wire::kMaskRequest) != 0, (i.mask & wire::kMaskResponse) != 0 ||
                                                      (i.mask & wire::kMaskCnp) != 0)
        << i.name;
    // Transport service from the top 3 opcode bits: RC 000, UC 001, UD 011,
    // XRC 101 (whose requests, and only those, carry an XRCETH).
    const int svc = op >> 5;
    if (svc == 5) {
      EXPECT_EQ((i.mask & wire::kMaskXrceth) != 0, (i.mask & wire::kMaskRequest) != 0) << i.name;
    } else {
      EXPECT_FALSE(i.mask & wire::kMaskXrceth) << i.name;
    }
    if (svc == 1 || svc == 3) {
      EXPECT_FALSE(i.mask & (wire::kMaskRead | wire::kMaskAtomic)) << i.name;
    }
  }
}

}  // namespace
}  // namespace droce::test
