// Tests for the wire beyond IPv4 RC basics: IPv6 (parser, builder, ICRC
// masking, UDP checksum, extension headers), the 802.1Q builder, builders
// for every opcode, the segmented parser, AETH credit counts, MSN and GIDs.
// The basic IPv4 parser is tested in wire_frame_test.cc, the golden ICRCs in
// wire_test.cc.

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
#include "wire/build.h"
#include "wire/frame.h"
#include "wire/headers.h"
#include "wire/icrc.h"
#include "wire/opcode.h"
#include "wire/psn.h"

namespace droce::test {
namespace {

using Bytes = std::vector<uint8_t>;
using wire::ParseError;

std::string Name(ParseError e) { return wire::parse_error_name(e); }

ParseError Parse(const Bytes& f, wire::PacketView* v = nullptr) {
  wire::PacketView tmp;
  return wire::parse_frame(std::span<const uint8_t>(f.data(), f.size()), v ? v : &tmp);
}

// Bit-at-a-time CRC-32 (reflected 0xEDB88320, init and final xor ones): an
// oracle independent of isa-l.
uint32_t RefCrc32(const Bytes& b) {
  uint32_t c = 0xFFFFFFFF;
  for (uint8_t x : b) {
    c ^= x;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
  }
  return ~c;
}

// ICRC of an IPv6 RoCE datagram written straight from IBA A17.8.2.
uint32_t RefIcrcV6(const uint8_t* ip, size_t ip_len) {
  Bytes b(8 + ip_len - 4, 0xFF);
  std::copy(ip, ip + ip_len - 4, b.begin() + 8);
  uint8_t* i = &b[8];
  i[0] |= 0x0F;                 // traffic class high nibble
  i[1] = i[2] = i[3] = 0xFF;    // traffic class low nibble + flow label
  i[7] = 0xFF;                  // hop limit
  i[40 + 6] = i[40 + 7] = 0xFF;  // UDP checksum
  i[48 + 4] = 0xFF;             // BTH FECN, BECN, reserved
  return RefCrc32(b);
}

// Derived (not captured): RoCEv2/IPv6 RC SEND Only with Immediate built and
// checksummed by a separate Python script with zlib.crc32 following A17.8.2.
// fd00::1 -> fd00::2, traffic class 0x8a, flow label 0x12345, hop limit 64,
// UDP 0xc123 -> 4791 checksum 0, SE=1 M=1 PadCnt=1, BECN=1, dest QP 0x123,
// AckReq, PSN 0xabcdef, ImmDt 0x11223344, payload "droce-v6!!!".
// ICRC 0xee0a339c, stored LSB first.
constexpr uint8_t kV6SendOnlyImm[] = {
    0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x01,
    0x86, 0xdd, 0x68, 0xa1, 0x23, 0x45, 0x00, 0x28, 0x11, 0x40, 0xfd, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x01, 0xfd, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0xc1, 0x23, 0x12, 0xb7, 0x00, 0x28,
    0x00, 0x00, 0x05, 0xd0, 0xff, 0xff, 0x40, 0x00, 0x01, 0x23, 0x80, 0xab,
    0xcd, 0xef, 0x11, 0x22, 0x33, 0x44, 0x64, 0x72, 0x6f, 0x63, 0x65, 0x2d,
    0x76, 0x36, 0x21, 0x21, 0x21, 0x00, 0x9c, 0x33, 0x0a, 0xee,
};
constexpr uint32_t kV6SendOnlyImmCrc = 0xee0a339c;

Bytes V6() { return Bytes(std::begin(kV6SendOnlyImm), std::end(kV6SendOnlyImm)); }

struct Golden {
  const char* name;
  Bytes bytes;
};
std::vector<Golden> Goldens() {
  auto g = [](const char* n, const uint8_t* p, size_t len) { return Golden{n, Bytes(p, p + len)}; };
  return {
      g("kCx4LxCnp", kCx4LxCnp, sizeof(kCx4LxCnp)),
      g("kHuaweiRcAck", kHuaweiRcAck, sizeof(kHuaweiRcAck)),
      g("kHuaweiRcSendOnlyImm", kHuaweiRcSendOnlyImm, sizeof(kHuaweiRcSendOnlyImm)),
      g("kHuaweiRcSendOnlyImmPad3", kHuaweiRcSendOnlyImmPad3, sizeof(kHuaweiRcSendOnlyImmPad3)),
      g("kRxeRcRdmaReadRequest", kRxeRcRdmaReadRequest, sizeof(kRxeRcRdmaReadRequest)),
      g("kScapyUcSendOnlyPad2", kScapyUcSendOnlyPad2, sizeof(kScapyUcSendOnlyPad2)),
      g("kHuaweiRcSendOnlyImmMutated", kHuaweiRcSendOnlyImmMutated, sizeof(kHuaweiRcSendOnlyImmMutated)),
      g("kV6SendOnlyImm", kV6SendOnlyImm, sizeof(kV6SendOnlyImm)),
  };
}

// ---------------------------------------------------------------------------
// IPv6

TEST(Ipv6, KnownAnswerVectorParses) {
  const Bytes f = V6();
  const uint8_t* ip = f.data() + wire::kEthLen;
  EXPECT_EQ(RefIcrcV6(ip, f.size() - wire::kEthLen), kV6SendOnlyImmCrc);
  EXPECT_EQ(wire::compute_icrc_v6(ip, f.size() - wire::kEthLen), kV6SendOnlyImmCrc);
  EXPECT_EQ(wire::compute_icrc(ip, f.size() - wire::kEthLen), kV6SendOnlyImmCrc);

  wire::PacketView v;
  ASSERT_EQ(Name(Parse(f, &v)), "ok");
  EXPECT_TRUE(v.ipv6);
  EXPECT_EQ(v.l3_offset, wire::kEthLen);
  EXPECT_EQ(v.l4_offset, wire::kEthLen + wire::kIpv6Len);
  EXPECT_EQ(v.bth_offset, wire::kRoceV6HeadLen);
  EXPECT_EQ(v.traffic_class, 0x8a);
  EXPECT_EQ(v.tos, 0x8a);
  EXPECT_EQ(v.flow_label, 0x12345u);
  EXPECT_EQ(v.hop_limit, 64);
  EXPECT_EQ(v.ttl, 64);
  EXPECT_EQ(v.sip, 0u);
  EXPECT_EQ(v.dip, 0u);
  EXPECT_EQ(v.sip6[0], 0xfd);
  EXPECT_EQ(v.sip6[15], 1);
  EXPECT_EQ(v.dip6[15], 2);
  EXPECT_EQ(v.udp_sport, 0xc123);
  EXPECT_EQ(v.udp_checksum, 0);
  EXPECT_EQ(v.bth.opcode, wire::kRcSendOnlyImm);
  EXPECT_TRUE(v.bth.se);
  EXPECT_TRUE(v.bth.becn);
  EXPECT_EQ(v.bth.pad, 1);
  EXPECT_EQ(v.bth.dqpn, 0x123u);
  EXPECT_EQ(v.bth.psn, 0xabcdefu);
  EXPECT_EQ(wire::read_immdt(v.ext(v.info->immdt)), 0x11223344u);
  ASSERT_EQ(v.payload_len, 11u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(v.payload), v.payload_len), "droce-v6!!!");
  EXPECT_EQ(v.frame_len, f.size());
}

TEST(Ipv6, MaskedFieldsMayChangeInFlight) {
  // A17.8.2: traffic class (DSCP, ECN), flow label and hop limit are masked,
  // as are the UDP checksum and BTH byte 4.
  for (int field = 0; field < 5; ++field) {
    Bytes f = V6();
    uint8_t* ip = &f[wire::kEthLen];
    switch (field) {
      case 0: ip[0] = 0x6F; ip[1] = (ip[1] & 0x0F) | 0xF0; break;  // traffic class 0xff
      case 1: ip[1] &= 0xF0; ip[2] = 0; ip[3] = 0; break;          // flow label 0
      case 2: ip[7] = 1; break;                                    // hop limit
      case 3: ip[1] = static_cast<uint8_t>((ip[1] & 0x0F) | 0xB0); break;  // ECN CE
      case 4: ip[40 + 8 + 4] = 0xC0; break;                        // FECN + BECN
    }
    EXPECT_EQ(Name(Parse(f)), "ok") << field;
  }
}

TEST(Ipv6, EveryUnmaskedBitFlipIsRejected) {
  const Bytes base = V6();
  for (size_t byte = wire::kEthLen; byte < base.size(); ++byte) {
    const size_t rel = byte - wire::kEthLen;
    const bool masked = rel == 0 || rel == 1 || rel == 2 || rel == 3 || rel == 7 ||
                        rel == 46 || rel == 47 || rel == 52;
    for (int bit = 0; bit < 8; ++bit) {
      if (masked && !(rel == 0 && bit >= 4)) continue;  // version nibble is not masked
      Bytes f = base;
      f[byte] ^= static_cast<uint8_t>(1u << bit);
      EXPECT_NE(Name(Parse(f)), "ok") << "byte " << byte << " bit " << bit;
    }
  }
}

TEST(Ipv6, UdpChecksumZeroOrCorrect) {
  Bytes f = V6();
  wire::finish_udp_checksum(f.data(), f.size());
  const size_t c = wire::kEthLen + wire::kIpv6Len + 6;
  EXPECT_NE(wire::load_be16(&f[c]), 0);
  wire::PacketView v;
  EXPECT_EQ(Name(Parse(f, &v)), "ok");
  EXPECT_EQ(v.udp_checksum, wire::load_be16(&f[c]));
  // The checksum field is masked in the ICRC: a wrong one fails the UDP check.
  Bytes bad = f;
  bad[c + 1] ^= 0x01;
  EXPECT_EQ(Name(Parse(bad)), "bad_udp_checksum");
  // 0 means none.
  bad[c] = bad[c + 1] = 0;
  EXPECT_EQ(Name(Parse(bad)), "ok");
  // A corrupted payload is an ICRC error first.
  Bytes corrupt = f;
  corrupt[corrupt.size() - 6] ^= 0x40;
  EXPECT_EQ(Name(Parse(corrupt)), "icrc_err");
}

TEST(Ipv6, IndependentUdpChecksum) {
  // RFC 8200 8.1 pseudo header summed by hand, 16 bits at a time.
  Bytes f = V6();
  wire::finish_udp_checksum(f.data(), f.size());
  const uint8_t* ip = &f[wire::kEthLen];
  const size_t udp_len = f.size() - wire::kEthLen - wire::kIpv6Len;
  uint32_t sum = 0;
  for (size_t i = 8; i < 40; i += 2) sum += wire::load_be16(ip + i);
  sum += static_cast<uint32_t>(udp_len) + 17;
  Bytes udp(ip + 40, ip + 40 + udp_len);
  if (udp.size() % 2) udp.push_back(0);
  for (size_t i = 0; i < udp.size(); i += 2) sum += wire::load_be16(&udp[i]);
  while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
  EXPECT_EQ(sum, 0xFFFFu);
}

TEST(Ipv6, Ipv4UdpChecksumIsNotChecked) {
  // RoCEv2/IPv4: RNICs ignore the UDP checksum, and so does droce.
  Bytes f(std::begin(kHuaweiRcAck), std::end(kHuaweiRcAck));
  wire::store_be16(&f[wire::kEthLen + 26], 0x1234);
  EXPECT_EQ(Name(Parse(f)), "ok");
  // A builder asked for one writes a correct one.
  wire::finish_udp_checksum(f.data(), f.size());
  EXPECT_NE(wire::load_be16(&f[wire::kEthLen + 26]), 0x1234);
  EXPECT_EQ(Name(Parse(f)), "ok");
}

Bytes WithExtHeader(uint8_t ext_type, uint8_t inner_next, size_t ext_len = 8) {
  Bytes f = V6();
  const size_t at = wire::kEthLen + wire::kIpv6Len;
  Bytes ext(ext_len, 0);
  ext[0] = inner_next;
  ext[1] = static_cast<uint8_t>(ext_type == 51 ? ext_len / 4 - 2 : ext_len / 8 - 1);
  f.insert(f.begin() + static_cast<long>(at), ext.begin(), ext.end());
  f[wire::kEthLen + 6] = ext_type;
  wire::store_be16(&f[wire::kEthLen + 4],
                   static_cast<uint16_t>(wire::load_be16(&f[wire::kEthLen + 4]) + ext_len));
  return f;
}

TEST(Ipv6, ExtensionHeaders) {
  EXPECT_EQ(Name(Parse(WithExtHeader(0, 17))), "ipv6_ext_header");    // hop-by-hop
  EXPECT_EQ(Name(Parse(WithExtHeader(60, 17, 16))), "ipv6_ext_header");  // dest options
  EXPECT_EQ(Name(Parse(WithExtHeader(43, 17))), "ipv6_ext_header");   // routing
  EXPECT_EQ(Name(Parse(WithExtHeader(51, 17, 12))), "ipv6_ext_header");  // AH
  EXPECT_EQ(Name(Parse(WithExtHeader(44, 17))), "ip_fragment");
  EXPECT_EQ(Name(Parse(WithExtHeader(0, 58))), "not_udp");  // MLD: ICMPv6 after hop-by-hop
  EXPECT_EQ(Name(Parse(WithExtHeader(50, 17))), "not_udp");  // ESP is opaque
  Bytes other_port = WithExtHeader(0, 17);
  wire::store_be16(&other_port[wire::kEthLen + wire::kIpv6Len + 8 + 2], 53);
  EXPECT_EQ(Name(Parse(other_port)), "not_roce");
  // A header length running past the packet.
  Bytes runaway = WithExtHeader(0, 0);
  runaway[wire::kEthLen + wire::kIpv6Len + 1] = 0xFF;
  EXPECT_EQ(Name(Parse(runaway)), "ipv6_ext_header");
  // ICMPv6 (neighbour discovery) and TCP.
  for (uint8_t nh : {uint8_t{58}, uint8_t{6}}) {
    Bytes f = V6();
    f[wire::kEthLen + 6] = nh;
    EXPECT_EQ(Name(Parse(f)), "not_udp") << int{nh};
  }
}

TEST(Ipv6, MalformedHeaders) {
  {
    Bytes f = V6();
    f[wire::kEthLen] = 0x48;  // version 4 under the IPv6 EtherType
    EXPECT_EQ(Name(Parse(f)), "bad_ip_version");
  }
  for (int delta : {1, 100}) {
    Bytes f = V6();
    wire::store_be16(&f[wire::kEthLen + 4], static_cast<uint16_t>(wire::load_be16(&f[wire::kEthLen + 4]) + delta));
    EXPECT_EQ(Name(Parse(f)), "bad_ip_length") << delta;
  }
  {
    Bytes f = V6();
    wire::store_be16(&f[wire::kEthLen + 4], 4);  // shorter than a UDP header
    EXPECT_EQ(Name(Parse(f)), "truncated");
  }
  {
    Bytes f = V6();
    wire::store_be16(&f[wire::kEthLen + 4], static_cast<uint16_t>(wire::load_be16(&f[wire::kEthLen + 4]) - 1));
    EXPECT_EQ(Name(Parse(f)), "bad_udp_length");
  }
  for (size_t n = 0; n < sizeof(kV6SendOnlyImm); ++n) {
    Bytes f(kV6SendOnlyImm, kV6SendOnlyImm + n);
    EXPECT_NE(Name(Parse(f)), "ok") << n;
  }
  {
    // Ethernet padding after the datagram is ignored, as for IPv4.
    Bytes f = V6();
    f.resize(f.size() + 6, 0);
    EXPECT_EQ(Name(Parse(f)), "ok");
  }
  {
    Bytes f(std::begin(kHuaweiRcAck), std::end(kHuaweiRcAck));
    f[wire::kEthLen] = 0x65;  // version 6 under the IPv4 EtherType
    EXPECT_EQ(Name(Parse(f)), "bad_ip_version");
  }
}

// ---------------------------------------------------------------------------
// Builders

wire::Path V6Path() {
  wire::Path p;
  p.dmac = {2, 0, 0, 0, 0, 2};
  p.smac = {2, 0, 0, 0, 0, 1};
  p.ipv6 = true;
  p.sip6 = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  p.dip6 = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
  p.udp_sport = 0xc123;
  p.tos = 0x8a;
  p.flow_label = 0x12345;
  p.ttl = 64;
  return p;
}

TEST(Builder, ReproducesTheIpv6Vector) {
  wire::TransportHeaders h;
  h.bth.opcode = wire::kRcSendOnlyImm;
  h.bth.se = true;
  h.bth.migreq = true;
  h.bth.becn = true;
  h.bth.dqpn = 0x123;
  h.bth.ackreq = true;
  h.bth.psn = 0xabcdef;
  h.imm = 0x11223344;
  const std::string payload = "droce-v6!!!";
  Bytes f(256);
  const size_t n = wire::build_frame(
      f, V6Path(), h, {reinterpret_cast<const uint8_t*>(payload.data()), payload.size()});
  ASSERT_EQ(n, sizeof(kV6SendOnlyImm));
  f.resize(n);
  EXPECT_EQ(f, V6());
  EXPECT_EQ(wire::frame_len_for(V6Path(), wire::kRcSendOnlyImm, payload.size()), n);
}

TEST(Builder, WriteOuterMatchesWriteOuterV4) {
  wire::Ipv4Path p4;
  p4.dmac = {1, 2, 3, 4, 5, 6};
  p4.smac = {6, 5, 4, 3, 2, 1};
  p4.sip = 0x0a000001;
  p4.dip = 0x0a000002;
  p4.udp_sport = 0xd00d;
  p4.tos = 0x02;
  p4.ttl = 17;
  Bytes a(128, 0xAA), b(128, 0xAA);
  EXPECT_EQ(wire::write_outer_v4(a.data(), p4, 40, 0x1234), wire::kRoceV4HeadLen);
  const wire::Path p = wire::Path::from(p4);
  EXPECT_EQ(wire::write_outer(b.data(), p, 40, 0x1234), wire::kRoceV4HeadLen);
  EXPECT_EQ(a, b);
  EXPECT_EQ(wire::outer_len(p), wire::kRoceV4HeadLen);
  EXPECT_TRUE(wire::gid_is_ipv4_mapped(p.sip6.data()));
  EXPECT_EQ(wire::gid_to_ipv4(p.dip6.data()), p4.dip);
}

TEST(Builder, VlanTag) {
  for (bool v6 : {false, true}) {
    wire::Path p = V6Path();
    p.ipv6 = v6;
    p.sip = 0xc0a80001;
    p.dip = 0xc0a80002;
    p.vlan = true;
    p.vlan_tci = 0xA00B;  // PCP 5, VID 11
    wire::TransportHeaders h;
    h.bth.opcode = wire::kRcAck;
    h.aeth = wire::Aeth::ack(7);
    Bytes f(128);
    const size_t n = wire::build_frame(f, p, h, {});
    ASSERT_EQ(n, wire::outer_len(p) + wire::kBthLen + wire::kAethLen + wire::kIcrcLen);
    f.resize(n);
    EXPECT_EQ(wire::load_be16(&f[12]), wire::kEtherTypeVlan);
    EXPECT_EQ(wire::load_be16(&f[14]), 0xA00B);
    EXPECT_EQ(wire::load_be16(&f[16]), v6 ? wire::kEtherTypeIpv6 : wire::kEtherTypeIpv4);
    wire::PacketView v;
    ASSERT_EQ(Name(Parse(f, &v)), "ok") << v6;
    EXPECT_TRUE(v.has_vlan);
    EXPECT_EQ(v.vlan_tci, 0xA00B);
    EXPECT_EQ(v.l3_offset, wire::kEthLen + wire::kVlanLen);
    EXPECT_EQ(v.ipv6, v6);
    EXPECT_EQ(wire::read_aeth(v.ext(v.info->aeth)).msn, 7u);
  }
}

std::vector<uint8_t> KnownOpcodes() {
  std::vector<uint8_t> ops;
  for (int op = 0; op < 256; ++op) {
    if (wire::opcode_known(static_cast<uint8_t>(op))) ops.push_back(static_cast<uint8_t>(op));
  }
  return ops;
}

TEST(Builder, EveryOpcodeRoundTrips) {
  std::mt19937 rng(3);
  auto r32 = [&] { return static_cast<uint32_t>(rng()); };
  auto r64 = [&] { return (uint64_t{r32()} << 32) | r32(); };
  const auto ops = KnownOpcodes();
  EXPECT_EQ(ops.size(), 62u);  // 39 RC/UC/UD/CNP and 23 XRC
  for (uint8_t op : ops) {
    const wire::OpcodeInfo& info = wire::opcode_info(op);
    for (int variant = 0; variant < 8; ++variant) {
      wire::Path p = V6Path();
      p.ipv6 = variant & 1;
      p.vlan = variant & 2;
      p.udp_checksum = variant & 4;
      p.sip = r32();
      p.dip = r32();
      p.vlan_tci = static_cast<uint16_t>(r32());
      wire::TransportHeaders h;
      h.bth.opcode = op;
      h.bth.se = r32() & 1;
      h.bth.migreq = r32() & 1;
      h.bth.pkey = static_cast<uint16_t>(r32());
      h.bth.fecn = r32() & 1;
      h.bth.becn = r32() & 1;
      h.bth.dqpn = r32() & 0xFFFFFF;
      h.bth.ackreq = r32() & 1;
      h.bth.psn = r32() & 0xFFFFFF;
      h.deth = {r32(), r32() & 0xFFFFFF};
      h.reth = {r64(), r32(), r32()};
      h.atomic_eth = {r64(), r32(), r64(), r64()};
      h.aeth = {static_cast<uint8_t>(r32()), r32() & 0xFFFFFF};
      h.atomic_ack_eth = {r64()};
      h.imm = r32();
      h.ieth_rkey = r32();
      h.xrc_srqn = r32() & 0xFFFFFF;
      for (size_t len : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{4}, size_t{257}}) {
        if (len != 0 && !(info.mask & wire::kMaskPayload)) continue;
        Bytes payload(len);
        for (auto& b : payload) b = static_cast<uint8_t>(r32());
        Bytes f(512);
        const size_t n = wire::build_frame(f, p, h, payload);
        ASSERT_EQ(n, wire::frame_len_for(p, op, len)) << info.name;
        f.resize(n);
        wire::PacketView v;
        ASSERT_EQ(Name(Parse(f, &v)), "ok") << info.name << " variant " << variant << " len " << len;
        EXPECT_EQ(v.ipv6, p.ipv6);
        EXPECT_EQ(v.has_vlan, p.vlan);
        if (p.ipv6) {
          EXPECT_EQ(v.sip6, p.sip6);
          EXPECT_EQ(v.dip6, p.dip6);
          EXPECT_EQ(v.flow_label, p.flow_label);
        } else {
          EXPECT_EQ(v.sip, p.sip);
          EXPECT_EQ(v.dip, p.dip);
          EXPECT_EQ(v.sip6, wire::ipv4_to_gid(p.sip));
        }
        EXPECT_EQ(v.tos, p.tos);
        EXPECT_EQ(v.ttl, p.ttl);
        EXPECT_EQ(v.udp_checksum != 0, p.udp_checksum);
        const wire::TransportHeaders g = wire::read_transport_headers(v);
        EXPECT_EQ(g.bth.opcode, op);
        EXPECT_EQ(g.bth.se, h.bth.se);
        EXPECT_EQ(g.bth.migreq, h.bth.migreq);
        EXPECT_EQ(g.bth.pad, (4 - len % 4) % 4);
        EXPECT_EQ(g.bth.pkey, h.bth.pkey);
        EXPECT_EQ(g.bth.fecn, h.bth.fecn);
        EXPECT_EQ(g.bth.becn, h.bth.becn);
        EXPECT_EQ(g.bth.dqpn, h.bth.dqpn);
        EXPECT_EQ(g.bth.ackreq, h.bth.ackreq);
        EXPECT_EQ(g.bth.psn, h.bth.psn);
        if (info.mask & wire::kMaskXrceth) EXPECT_EQ(g.xrc_srqn, h.xrc_srqn) << info.name;
        if (info.mask & wire::kMaskDeth) {
          EXPECT_EQ(g.deth.qkey, h.deth.qkey);
          EXPECT_EQ(g.deth.src_qp, h.deth.src_qp);
        }
        if (info.mask & wire::kMaskReth) {
          EXPECT_EQ(g.reth.va, h.reth.va);
          EXPECT_EQ(g.reth.rkey, h.reth.rkey);
          EXPECT_EQ(g.reth.dma_len, h.reth.dma_len);
        }
        if (info.mask & wire::kMaskAtomicEth) {
          EXPECT_EQ(g.atomic_eth.va, h.atomic_eth.va);
          EXPECT_EQ(g.atomic_eth.rkey, h.atomic_eth.rkey);
          EXPECT_EQ(g.atomic_eth.swap_add, h.atomic_eth.swap_add);
          EXPECT_EQ(g.atomic_eth.compare, h.atomic_eth.compare);
        }
        if (info.mask & wire::kMaskAeth) {
          EXPECT_EQ(g.aeth.syndrome, h.aeth.syndrome);
          EXPECT_EQ(g.aeth.msn, h.aeth.msn);
        }
        if (info.mask & wire::kMaskAtomicAckEth) { EXPECT_EQ(g.atomic_ack_eth.orig, h.atomic_ack_eth.orig); }
        if (info.mask & wire::kMaskImmDt) { EXPECT_EQ(g.imm, h.imm); }
        if (info.mask & wire::kMaskIeth) { EXPECT_EQ(g.ieth_rkey, h.ieth_rkey); }
        ASSERT_EQ(v.payload_len, len);
        EXPECT_TRUE(std::equal(payload.begin(), payload.end(), v.payload));
      }
    }
  }
}

TEST(Builder, RejectsWhatCannotBeBuilt) {
  wire::TransportHeaders h;
  Bytes f(256);
  const uint8_t one = 1;
  h.bth.opcode = 0x15;  // reserved
  EXPECT_EQ(wire::build_frame(f, V6Path(), h, {}), 0u);
  EXPECT_EQ(wire::write_transport_headers(f.data(), h), 0u);
  h.bth.opcode = wire::kRcAck;  // no payload allowed
  EXPECT_EQ(wire::build_frame(f, V6Path(), h, {&one, 1}), 0u);
  h.bth.opcode = wire::kRcSendOnly;
  Bytes big(70000);
  Bytes out(80000);
  EXPECT_EQ(wire::build_frame(out, V6Path(), h, big), 0u);  // > 16-bit lengths
  EXPECT_EQ(wire::build_frame(std::span<uint8_t>(f.data(), 70), V6Path(), h, {}), 0u);  // too small
  // CNP: BTH and 16 reserved zero bytes.
  h.bth.opcode = wire::kCnp;
  f.assign(256, 0xEE);
  const size_t n = wire::build_frame(f, V6Path(), h, {});
  ASSERT_EQ(n, wire::kRoceV6HeadLen + wire::kBthLen + wire::kCnpPayloadLen + wire::kIcrcLen);
  for (size_t i = 0; i < wire::kCnpPayloadLen; ++i) EXPECT_EQ(f[wire::kRoceV6HeadLen + wire::kBthLen + i], 0);
}

TEST(Builder, GidsChooseTheIpVersion) {
  wire::Path p;
  const wire::Ipv6Addr a = wire::ipv4_to_gid(0x0a000001);
  const wire::Ipv6Addr b = wire::ipv4_to_gid(0x0a000002);
  wire::path_set_gids(&p, a.data(), b.data());
  EXPECT_FALSE(p.ipv6);
  EXPECT_EQ(p.sip, 0x0a000001u);
  EXPECT_EQ(p.dip, 0x0a000002u);
  const wire::Ipv6Addr c = V6Path().dip6;
  wire::path_set_gids(&p, a.data(), c.data());
  EXPECT_TRUE(p.ipv6);
  EXPECT_EQ(p.dip6, c);
  EXPECT_FALSE(wire::gid_is_ipv4_mapped(c.data()));
}

// ---------------------------------------------------------------------------
// Segmented parse

// Compares the fields of two views of the same frame.
void ExpectSameView(const wire::PacketView& a, const wire::PacketView& b, const std::string& what) {
  EXPECT_EQ(a.dmac, b.dmac) << what;
  EXPECT_EQ(a.smac, b.smac) << what;
  EXPECT_EQ(a.has_vlan, b.has_vlan) << what;
  EXPECT_EQ(a.ipv6, b.ipv6) << what;
  EXPECT_EQ(a.sip, b.sip) << what;
  EXPECT_EQ(a.dip, b.dip) << what;
  EXPECT_EQ(a.sip6, b.sip6) << what;
  EXPECT_EQ(a.dip6, b.dip6) << what;
  EXPECT_EQ(a.tos, b.tos) << what;
  EXPECT_EQ(a.ttl, b.ttl) << what;
  EXPECT_EQ(a.flow_label, b.flow_label) << what;
  EXPECT_EQ(a.udp_sport, b.udp_sport) << what;
  EXPECT_EQ(a.bth_offset, b.bth_offset) << what;
  EXPECT_EQ(a.bth.opcode, b.bth.opcode) << what;
  EXPECT_EQ(a.bth.psn, b.bth.psn) << what;
  EXPECT_EQ(a.bth.dqpn, b.bth.dqpn) << what;
  EXPECT_EQ(a.info, b.info) << what;
  EXPECT_EQ(a.payload_len, b.payload_len) << what;
  EXPECT_EQ(a.frame_len, b.frame_len) << what;
  if (a.info != nullptr && b.info != nullptr) {
    EXPECT_EQ(0, std::memcmp(a.ext(0), b.ext(0), a.info->length)) << what;
  }
}

Bytes PayloadOf(wire::Segments segs, const wire::PacketView& v) {
  Bytes out(v.payload_len);
  EXPECT_EQ(wire::copy_payload(segs, v, out.data()), v.payload_len);
  return out;
}

TEST(Segments, EveryTwoCutsOfEveryGoldenFrame) {
  std::vector<Golden> frames = Goldens();
  for (int corrupt = 0; corrupt < 2; ++corrupt) {
    for (const Golden& g : frames) {
      Bytes f = g.bytes;
      if (corrupt) f[f.size() - 5] ^= 0x10;  // last payload/header byte: ICRC error
      wire::PacketView whole;
      const ParseError want = Parse(f, &whole);
      const Bytes want_payload = want == ParseError::kOk ? PayloadOf({&whole.frame, 1}, whole) : Bytes{};
      for (size_t i = 0; i <= f.size(); ++i) {
        for (size_t j = i; j <= f.size(); j += 3) {
          const std::span<const uint8_t> segs[] = {
              {f.data(), i}, {f.data() + i, j - i}, {f.data() + j, f.size() - j}};
          wire::HeaderScratch scratch;
          wire::PacketView v;
          const std::string what = std::string(g.name) + " cuts " + std::to_string(i) + "," +
                                   std::to_string(j);
          const ParseError got = wire::parse_frame(wire::Segments(segs), &v, &scratch);
          ASSERT_EQ(Name(got), Name(want)) << what;
          if (got != ParseError::kOk) continue;
          ExpectSameView(v, whole, what);
          EXPECT_EQ(PayloadOf(segs, v), want_payload) << what;
          // payload is set exactly when the payload lies in one segment.
          const size_t start = whole.payload - f.data();
          const bool one = (start >= j || start + v.payload_len <= i ||
                            (start >= i && start + v.payload_len <= j));
          if (v.payload_len != 0) {
            EXPECT_EQ(v.payload != nullptr, one) << what;
            if (v.payload != nullptr) {
              EXPECT_EQ(v.payload, whole.payload) << what;
            }
          }
        }
      }
    }
  }
}

TEST(Segments, JumboFrameInManyPieces) {
  wire::Path p = V6Path();
  p.udp_checksum = true;
  wire::TransportHeaders h;
  h.bth.opcode = wire::kRcWriteOnlyImm;
  h.reth = {0x1000, 0x55, 9000};
  Bytes payload(9000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 7);
  Bytes f(10000);
  const size_t n = wire::build_frame(f, p, h, payload);
  ASSERT_GT(n, 9000u);
  f.resize(n);
  // Pieces of 2048 bytes, as a mempool with 2 KiB buffers would give, and
  // tiny ones straddling every header.
  for (size_t piece : {size_t{2048}, size_t{1000}, size_t{7}, size_t{1}}) {
    std::vector<std::span<const uint8_t>> segs;
    for (size_t off = 0; off < n; off += piece) segs.push_back({f.data() + off, std::min(piece, n - off)});
    wire::HeaderScratch scratch;
    wire::PacketView v;
    ASSERT_EQ(Name(wire::parse_frame(segs, &v, &scratch)), "ok") << piece;
    EXPECT_EQ(v.payload_len, 9000u);
    EXPECT_EQ(wire::read_reth(v.ext(v.info->reth)).dma_len, 9000u);
    EXPECT_EQ(PayloadOf(segs, v), payload);
    size_t pieces = 0;
    wire::for_each_payload_piece(segs, v, [&](const uint8_t*, size_t) { ++pieces; });
    const size_t start = v.bth_offset + v.info->length;
    EXPECT_EQ(pieces, (start + 9000 - 1) / piece - start / piece + 1) << piece;
    // A flipped payload bit in the last segment fails the chained ICRC.
    Bytes g = f;
    g[n - 100] ^= 1;
    std::vector<std::span<const uint8_t>> gsegs;
    for (size_t off = 0; off < n; off += piece) gsegs.push_back({g.data() + off, std::min(piece, n - off)});
    EXPECT_EQ(Name(wire::parse_frame(gsegs, &v, &scratch)), "icrc_err") << piece;
  }
}

TEST(Segments, ExtensionHeaderAnswerDoesNotDependOnCuts) {
  // Found by tests/fuzz/parse_fuzz: the extension header walk must look at
  // the same bytes whatever the segmentation (the first kMaxRoceHeadLen).
  for (size_t ext_len : {size_t{8}, size_t{40}, size_t{48}, size_t{200}}) {
    Bytes f = WithExtHeader(253, 17, ext_len);
    f.resize(f.size() + 300, 0);
    wire::store_be16(&f[wire::kEthLen + 4], static_cast<uint16_t>(f.size() - wire::kEthLen - wire::kIpv6Len));
    wire::PacketView whole;
    const std::string want = Name(Parse(f, &whole));
    for (size_t i = 0; i <= f.size(); ++i) {
      const std::span<const uint8_t> segs[] = {{f.data(), i}, {f.data() + i, f.size() - i}};
      wire::HeaderScratch scratch;
      wire::PacketView v;
      EXPECT_EQ(Name(wire::parse_frame(wire::Segments(segs), &v, &scratch)), want) << ext_len << " cut " << i;
    }
  }
}

TEST(Segments, EmptyAndDegenerate) {
  wire::HeaderScratch scratch;
  wire::PacketView v;
  EXPECT_EQ(Name(wire::parse_frame(wire::Segments{}, &v, &scratch)), "truncated");
  const Bytes f = V6();
  // Empty segments anywhere are skipped.
  const std::span<const uint8_t> segs[] = {{}, {f.data(), 10}, {}, {f.data() + 10, f.size() - 10}, {}};
  EXPECT_EQ(Name(wire::parse_frame(wire::Segments(segs), &v, &scratch)), "ok");
  EXPECT_EQ(PayloadOf(segs, v), Bytes(f.begin() + 78, f.begin() + 89));
}

// ---------------------------------------------------------------------------
// AETH, PSN/MSN, names

TEST(Aeth, CreditCountTable) {
  // IBA table 45.
  const int32_t table[31] = {0,    1,    2,    3,    4,     6,     8,     12,    16,    24,   32,
                             48,   64,   96,   128,  192,   256,   384,   512,   768,   1024, 1536,
                             2048, 3072, 4096, 6144, 8192,  12288, 16384, 24576, 32768};
  for (uint8_t c = 0; c < 31; ++c) {
    EXPECT_EQ(wire::aeth_credits(c), table[c]) << int{c};
    EXPECT_EQ(wire::aeth_credit_code(static_cast<uint32_t>(table[c])), c);
  }
  EXPECT_EQ(wire::aeth_credits(wire::kCreditInvalid), -1);
  EXPECT_EQ(wire::aeth_credit_code(5), 4);
  EXPECT_EQ(wire::aeth_credit_code(1u << 30), 30);
  const wire::Aeth a = wire::Aeth::ack(5, wire::aeth_credit_code(100));
  EXPECT_EQ(a.type(), wire::AckType::kAck);
  EXPECT_EQ(wire::aeth_credits(a.value()), 96);
  EXPECT_STREQ(wire::nak_code_name(wire::NakCode::kRemoteAccessError), "remote_access_error");
  EXPECT_STREQ(wire::nak_code_name(static_cast<wire::NakCode>(9)), "reserved");
}

TEST(Psn, MsnWraps) {
  EXPECT_EQ(wire::msn_add(wire::kMsnMask, 2), 1u);
  EXPECT_EQ(wire::msn_diff(1, wire::kMsnMask), 2);
  EXPECT_TRUE(wire::psn_gt(0, wire::kPsnMask));
  EXPECT_TRUE(wire::psn_ge(7, 7));
  EXPECT_FALSE(wire::psn_gt(0x800000, 0));  // exactly half the space away: "behind"
}

TEST(ParseErrors, NamesAreDistinct) {
  std::set<std::string> names;
  for (int e = 0; e < static_cast<int>(ParseError::kCount); ++e) {
    const std::string n = wire::parse_error_name(static_cast<ParseError>(e));
    EXPECT_NE(n, "unknown") << e;
    EXPECT_TRUE(names.insert(n).second) << n;
  }
}

TEST(Checksum, InetSumPiecesAtOddBoundaries) {
  Bytes data(101);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<uint8_t>(i * 31 + 7);
  wire::InetSum whole;
  whole.add(data.data(), data.size());
  for (size_t a = 0; a <= data.size(); ++a) {
    for (size_t b = a; b <= data.size(); b += 5) {
      wire::InetSum s;
      s.add(data.data(), a);
      s.add(data.data() + a, b - a);
      s.add(data.data() + b, data.size() - b);
      ASSERT_EQ(s.fold(), whole.fold()) << a << "," << b;
    }
  }
}

}  // namespace
}  // namespace droce::test
