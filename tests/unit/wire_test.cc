// Wire format: CRC-32 and the RoCEv2 ICRC, PSN arithmetic and the IBA opcode
// table. The ICRC and IPv4 checksum are checked against references written
// from the specs (wire_references.h; not against droce's own code), and
// against real captured frames in golden_packets.h. The frame builder and
// parser are tested in wire_frame_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
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
#include "wire_references.h"

namespace droce::test {
namespace {

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
