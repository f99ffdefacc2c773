// The frame builder and parser: build -> parse round trips, and the malformed frames the parser rejects.
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
#include "wire_references.h"

namespace droce::test {
namespace {

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

}  // namespace
}  // namespace droce::test
