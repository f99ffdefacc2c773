// Tests `droce pcap-check`: captures are written here at run time (classic
// pcap and pcapng, byte by byte) from the golden frames and frames built with
// wire::build_frame, and the launcher binary (DROCE_LAUNCHER) is run on them.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "golden_packets.h"
#include "pcap_check.h"
#include "wire/build.h"
#include "wire/frame.h"
#include "wire/icrc.h"

namespace droce::test {
namespace {

using Bytes = std::vector<uint8_t>;

struct Frame {
  Bytes bytes;
  uint32_t wire_len = 0;  // 0: bytes.size()
};

void Put16(Bytes& b, uint16_t v) {
  b.push_back(static_cast<uint8_t>(v));
  b.push_back(static_cast<uint8_t>(v >> 8));
}
void Put32(Bytes& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

// Classic pcap, little-endian, microsecond timestamps. `linktype_field` is
// the whole 32-bit field (link type plus the FCS bits).
Bytes Pcap(const std::vector<Frame>& frames, uint32_t linktype_field = 1, uint32_t snaplen = 65535) {
  Bytes b;
  Put32(b, 0xa1b2c3d4);
  Put16(b, 2);
  Put16(b, 4);
  Put32(b, 0);
  Put32(b, 0);
  Put32(b, snaplen);
  Put32(b, linktype_field);
  uint32_t t = 1700000000;
  for (const Frame& f : frames) {
    Put32(b, t++);
    Put32(b, 0);
    Put32(b, static_cast<uint32_t>(f.bytes.size()));
    Put32(b, f.wire_len ? f.wire_len : static_cast<uint32_t>(f.bytes.size()));
    b.insert(b.end(), f.bytes.begin(), f.bytes.end());
  }
  return b;
}

// pcapng, little-endian: a section header, one Ethernet interface, and an
// enhanced packet block per frame.
Bytes Pcapng(const std::vector<Frame>& frames) {
  Bytes b;
  Put32(b, 0x0A0D0D0A);
  Put32(b, 28);
  Put32(b, 0x1A2B3C4D);
  Put16(b, 1);
  Put16(b, 0);
  Put32(b, 0xFFFFFFFF);
  Put32(b, 0xFFFFFFFF);
  Put32(b, 28);
  Put32(b, 1);  // interface description block
  Put32(b, 20);
  Put16(b, 1);  // LINKTYPE_ETHERNET
  Put16(b, 0);
  Put32(b, 0);
  Put32(b, 20);
  for (const Frame& f : frames) {
    const uint32_t padded = static_cast<uint32_t>((f.bytes.size() + 3) & ~size_t{3});
    Put32(b, 6);  // enhanced packet block
    Put32(b, 32 + padded);
    Put32(b, 0);
    Put32(b, 0);
    Put32(b, 0);
    Put32(b, static_cast<uint32_t>(f.bytes.size()));
    Put32(b, f.wire_len ? f.wire_len : static_cast<uint32_t>(f.bytes.size()));
    b.insert(b.end(), f.bytes.begin(), f.bytes.end());
    b.resize(b.size() + (padded - f.bytes.size()), 0);
    Put32(b, 32 + padded);
  }
  return b;
}

Bytes Of(const uint8_t* p, size_t n) { return Bytes(p, p + n); }

// A RoCEv2/IPv6 WRITE with a VLAN tag and a UDP checksum, and a CNP over IPv4.
Bytes BuiltV6Write() {
  wire::Path p;
  p.dmac = {2, 0, 0, 0, 0, 2};
  p.smac = {2, 0, 0, 0, 0, 1};
  p.vlan = true;
  p.vlan_tci = 7;
  p.ipv6 = true;
  p.sip6[0] = p.dip6[0] = 0xfd;
  p.sip6[15] = 1;
  p.dip6[15] = 2;
  p.udp_checksum = true;
  wire::TransportHeaders h;
  h.bth.opcode = wire::kRcWriteOnly;
  h.bth.dqpn = 0x42;
  h.bth.psn = 77;
  h.reth = {0x1000, 9, 1000};
  Bytes payload(1000, 0x5A);
  Bytes f(1200);
  f.resize(wire::build_frame(f, p, h, payload));
  return f;
}

// An ARP request: not RoCE.
Bytes Arp() {
  Bytes f(42, 0);
  std::memset(f.data(), 0xFF, 6);
  f[12] = 0x08;
  f[13] = 0x06;
  return f;
}

std::vector<Frame> GoodFrames() {
  std::vector<Frame> v = {
      {Of(kCx4LxCnp, sizeof(kCx4LxCnp))},
      {Of(kHuaweiRcAck, sizeof(kHuaweiRcAck))},
      {Of(kHuaweiRcSendOnlyImm, sizeof(kHuaweiRcSendOnlyImm))},
      {Of(kHuaweiRcSendOnlyImmPad3, sizeof(kHuaweiRcSendOnlyImmPad3))},
      {Of(kRxeRcRdmaReadRequest, sizeof(kRxeRcRdmaReadRequest))},
      {Of(kScapyUcSendOnlyPad2, sizeof(kScapyUcSendOnlyPad2))},
      {Of(kHuaweiRcSendOnlyImmMutated, sizeof(kHuaweiRcSendOnlyImmMutated))},
      {BuiltV6Write()},
      {Arp()},
  };
  return v;
}

class PcapCheck : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* l = std::getenv("DROCE_LAUNCHER");
    if (l == nullptr) GTEST_SKIP() << "DROCE_LAUNCHER not set";
    launcher_ = l;
    char tmpl[] = "/tmp/droce_pcap_check_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    if (!dir_.empty()) std::system(("rm -rf '" + dir_ + "'").c_str());
  }

  std::string Write(const std::string& name, const Bytes& b) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
    return path;
  }

  // Runs `droce pcap-check ARGS`; returns the exit status, stdout in *out.
  int Run(const std::string& args, std::string* out, std::string* err = nullptr) {
    const std::string errfile = dir_ + "/stderr";
    const std::string cmd = "'" + launcher_ + "' pcap-check " + args + " 2>'" + errfile + "'";
    FILE* p = popen(cmd.c_str(), "r");
    EXPECT_NE(p, nullptr);
    out->clear();
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out->append(buf, n);
    const int st = pclose(p);
    if (err != nullptr) {
      std::ifstream in(errfile);
      err->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  }

  static std::string LastLine(const std::string& s) {
    const size_t end = s.find_last_not_of('\n');
    if (end == std::string::npos) return "";
    const size_t start = s.rfind('\n', end);
    return s.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
  }

  std::string launcher_, dir_;
};

TEST_F(PcapCheck, GoldenCaptureIsAllOk) {
  const std::string f = Write("good.pcap", Pcap(GoodFrames()));
  std::string out;
  EXPECT_EQ(Run("'" + f + "'", &out), 0) << out;
  EXPECT_EQ(out, "packets: 9 roce: 8 ok: 8 bad: 0\n");
}

TEST_F(PcapCheck, VerboseLines) {
  const std::string f = Write("good.pcap", Pcap(GoodFrames()));
  std::string out;
  EXPECT_EQ(Run("-v '" + f + "'", &out), 0);
  EXPECT_EQ(out,
            "1 CNP dqpn=0x000118 psn=0 ok\n"
            "2 RC_ACKNOWLEDGE dqpn=0x000045 psn=0 ok\n"
            "3 RC_SEND_ONLY_WITH_IMMEDIATE dqpn=0x000045 psn=66 ok\n"
            "4 RC_SEND_ONLY_WITH_IMMEDIATE dqpn=0x000048 psn=0 ok\n"
            "5 RC_RDMA_READ_REQUEST dqpn=0x000011 psn=5557091 ok\n"
            "6 UC_SEND_ONLY dqpn=0x0000d3 psn=13571856 ok\n"
            "7 RC_SEND_ONLY_WITH_IMMEDIATE dqpn=0x000045 psn=66 ok\n"
            "8 RC_RDMA_WRITE_ONLY dqpn=0x000042 psn=77 ok\n"
            "packets: 9 roce: 8 ok: 8 bad: 0\n");
}

TEST_F(PcapCheck, PcapngIsRead) {
  const std::string f = Write("good.pcapng", Pcapng(GoodFrames()));
  std::string out;
  EXPECT_EQ(Run("'" + f + "'", &out), 0) << out;
  EXPECT_EQ(out, "packets: 9 roce: 8 ok: 8 bad: 0\n");
}

TEST_F(PcapCheck, EveryCorruptedPacketIsBad) {
  // One flipped bit in every RoCE frame, at an offset that the ICRC (or the
  // IPv4 header checksum) covers: in the IP addresses, the BTH, the payload
  // or the ICRC itself.
  std::vector<Frame> frames = GoodFrames();
  size_t k = 0;
  for (Frame& f : frames) {
    if (f.bytes.size() == 42) continue;  // the ARP frame
    const size_t offs[] = {f.bytes.size() - 1, f.bytes.size() - 6, 30, 43};
    f.bytes[offs[k++ % 4]] ^= 0x04;
  }
  const std::string path = Write("bad.pcap", Pcap(frames));
  std::string out;
  EXPECT_EQ(Run("-v '" + path + "'", &out), 1) << out;
  EXPECT_EQ(LastLine(out), "packets: 9 roce: 8 ok: 0 bad: 8");
  EXPECT_NE(out.find("bad icrc_err"), std::string::npos) << out;
  EXPECT_EQ(out.find(" ok\n"), std::string::npos) << out;
}

TEST_F(PcapCheck, HeaderErrorsAreReportedWithTheirReason) {
  std::vector<Frame> frames;
  Bytes ipsum = Of(kRxeRcRdmaReadRequest, sizeof(kRxeRcRdmaReadRequest));
  ipsum[wire::kEthLen + 10] ^= 1;  // IPv4 header checksum
  frames.push_back({ipsum});
  Bytes op = Of(kHuaweiRcAck, sizeof(kHuaweiRcAck));
  op[wire::kRoceV4HeadLen] = 0x1F;  // reserved opcode
  frames.push_back({op});
  Bytes v6 = BuiltV6Write();
  v6[wire::kEthLen + wire::kVlanLen + wire::kIpv6Len + 6] ^= 0x10;  // UDP checksum
  frames.push_back({v6});
  const std::string path = Write("hdr.pcap", Pcap(frames));
  std::string out;
  EXPECT_EQ(Run("-v '" + path + "'", &out), 1);
  EXPECT_EQ(out,
            "1 RC_RDMA_READ_REQUEST dqpn=0x000011 psn=5557091 bad bad_ip_checksum\n"
            "2 UNKNOWN_0x1f dqpn=0x000045 psn=0 bad unknown_opcode\n"
            "3 RC_RDMA_WRITE_ONLY dqpn=0x000042 psn=77 bad bad_udp_checksum\n"
            "packets: 3 roce: 3 ok: 0 bad: 3\n");
}

TEST_F(PcapCheck, FcsFlagInPcapHeader) {
  std::vector<Frame> frames;
  for (const Frame& f : GoodFrames()) {
    Bytes b = f.bytes;
    const uint32_t fcs = wire::crc32(0, b.data(), b.size());
    for (int i = 0; i < 4; ++i) b.push_back(static_cast<uint8_t>(fcs >> (8 * i)));
    frames.push_back({b});
  }
  // LinkType field: Ethernet, FCS length known (bit 26), 2 x 16 bits.
  const uint32_t lt = 1 | 0x04000000 | (2u << 28);
  std::string out;
  EXPECT_EQ(Run("'" + Write("fcs.pcap", Pcap(frames, lt)) + "'", &out), 0) << out;
  EXPECT_EQ(out, "packets: 9 roce: 8 ok: 8 bad: 0\n");
  frames[0].bytes.back() ^= 0xFF;  // a bad FCS on the CNP
  EXPECT_EQ(Run("-v '" + Write("badfcs.pcap", Pcap(frames, lt)) + "'", &out), 1);
  EXPECT_EQ(out.substr(0, out.find('\n')), "1 CNP dqpn=0x000118 psn=0 bad fcs_err");
  EXPECT_EQ(LastLine(out), "packets: 9 roce: 8 ok: 7 bad: 1");
  // The same frames with an FCS but without the flag: the trailing 4 bytes
  // are ignored, nothing is misreported.
  frames[0].bytes.back() ^= 0xFF;
  EXPECT_EQ(Run("'" + Write("fcs_unflagged.pcap", Pcap(frames)) + "'", &out), 0) << out;
  EXPECT_EQ(Run("'" + Write("fcs_unflagged.pcapng", Pcapng(frames)) + "'", &out), 0) << out;
}

TEST_F(PcapCheck, SnaplenTruncatedPacketsCannotBeVouchedFor) {
  std::vector<Frame> frames = GoodFrames();
  Frame& f = frames[3];  // the 206-byte SEND with pad
  f.wire_len = static_cast<uint32_t>(f.bytes.size());
  f.bytes.resize(96);
  std::string out;
  EXPECT_EQ(Run("-v '" + Write("snap.pcap", Pcap(frames)) + "'", &out), 1);
  EXPECT_NE(out.find("4 RC_SEND_ONLY_WITH_IMMEDIATE dqpn=0x000048 psn=0 bad capture_truncated\n"),
            std::string::npos)
      << out;
  EXPECT_EQ(LastLine(out), "packets: 9 roce: 8 ok: 7 bad: 1");
}

TEST_F(PcapCheck, CookedAndRawIpLinkTypes) {
  std::vector<Frame> sll, raw;
  for (const Frame& f : GoodFrames()) {
    size_t l3 = wire::kEthLen;
    uint16_t type = wire::load_be16(&f.bytes[12]);
    if (type == wire::kEtherTypeVlan) {
      l3 += wire::kVlanLen;
      type = wire::load_be16(&f.bytes[16]);
    }
    Bytes s(16, 0);  // Linux cooked header v1: protocol in the last 2 bytes
    wire::store_be16(&s[14], type);
    s.insert(s.end(), f.bytes.begin() + static_cast<long>(l3), f.bytes.end());
    sll.push_back({s});
    if (type != wire::kEtherTypeArp) raw.push_back({Bytes(f.bytes.begin() + static_cast<long>(l3), f.bytes.end())});
  }
  std::string out;
  EXPECT_EQ(Run("'" + Write("sll.pcap", Pcap(sll, 113)) + "'", &out), 0) << out;
  EXPECT_EQ(out, "packets: 9 roce: 8 ok: 8 bad: 0\n");
  EXPECT_EQ(Run("'" + Write("raw.pcap", Pcap(raw, 101)) + "'", &out), 0) << out;
  EXPECT_EQ(out, "packets: 8 roce: 8 ok: 8 bad: 0\n");
}

TEST_F(PcapCheck, SeveralFilesArePrefixedAndSummed) {
  const std::string a = Write("a.pcap", Pcap({{Of(kHuaweiRcAck, sizeof(kHuaweiRcAck))}}));
  const std::string b = Write("b.pcapng", Pcapng({{Arp()}, {Of(kCx4LxCnp, sizeof(kCx4LxCnp))}}));
  std::string out;
  EXPECT_EQ(Run("-v '" + a + "' '" + b + "'", &out), 0);
  EXPECT_EQ(out, a + ":1 RC_ACKNOWLEDGE dqpn=0x000045 psn=0 ok\n" + b +
                     ":2 CNP dqpn=0x000118 psn=0 ok\npackets: 3 roce: 2 ok: 2 bad: 0\n");
}

TEST_F(PcapCheck, FileAndUsageErrors) {
  std::string out, err;
  EXPECT_EQ(Run("'" + dir_ + "/does-not-exist.pcap'", &out, &err), 2);
  EXPECT_NE(err.find("does-not-exist.pcap"), std::string::npos) << err;
  EXPECT_EQ(out, "packets: 0 roce: 0 ok: 0 bad: 0\n");
  // A file error wins over bad packets in other files.
  Bytes bad = Of(kHuaweiRcAck, sizeof(kHuaweiRcAck));
  bad.back() ^= 1;
  EXPECT_EQ(Run("'" + Write("bad.pcap", Pcap({{bad}})) + "' '" + dir_ + "/nope'", &out, &err), 2);
  EXPECT_EQ(out, "packets: 1 roce: 1 ok: 0 bad: 1\n");
  EXPECT_EQ(Run("'" + Write("junk.pcap", Bytes(100, 7)) + "'", &out, &err), 2);
  EXPECT_FALSE(err.empty());
  // A capture cut off in the middle of a record.
  Bytes cut = Pcap(GoodFrames());
  cut.resize(cut.size() - 10);
  EXPECT_EQ(Run("'" + Write("cut.pcap", cut) + "'", &out, &err), 2);
  EXPECT_EQ(LastLine(out), "packets: 8 roce: 8 ok: 8 bad: 0");
  EXPECT_EQ(Run("", &out, &err), 2);
  EXPECT_NE(err.find("usage"), std::string::npos);
  EXPECT_EQ(Run("-x foo.pcap", &out, &err), 2);
  EXPECT_EQ(Run("--help", &out, &err), 0);
  EXPECT_NE(out.find("usage: droce pcap-check"), std::string::npos);
}

// The frame check itself, without files.
TEST(PcapCheckFrame, Classification) {
  using pcap_check::CheckEthernetFrame;
  const Bytes ack = Of(kHuaweiRcAck, sizeof(kHuaweiRcAck));
  auto r = CheckEthernetFrame(ack, ack.size(), 0);
  EXPECT_TRUE(r.roce && r.ok && r.has_bth);
  EXPECT_FALSE(CheckEthernetFrame(Arp(), 42, 0).roce);
  // UDP to another port is not RoCE; to 4791 with IPv4 options it is, and bad.
  Bytes other = ack;
  wire::store_be16(&other[wire::kEthLen + 22], 4790);
  EXPECT_FALSE(CheckEthernetFrame(other, other.size(), 0).roce);
  Bytes opts = ack;
  opts[wire::kEthLen] = 0x46;
  opts.insert(opts.begin() + wire::kEthLen + 20, 4, 0);
  r = CheckEthernetFrame(opts, opts.size(), 0);
  EXPECT_TRUE(r.roce);
  EXPECT_FALSE(r.ok);
  EXPECT_STREQ(r.reason, "ip_options");
  EXPECT_EQ(r.dqpn, 0x45u);
  // Two tags: found as RoCE, refused with a clear reason.
  Bytes qinq = ack;
  const uint8_t tags[] = {0x88, 0xA8, 0x00, 0x05, 0x81, 0x00, 0x00, 0x07};
  qinq.insert(qinq.begin() + 12, std::begin(tags), std::end(tags));
  r = CheckEthernetFrame(qinq, qinq.size(), 0);
  EXPECT_TRUE(r.roce);
  EXPECT_STREQ(r.reason, "vlan_stack");
  // Every prefix of a RoCE frame is handled (no BTH: "?" fields).
  for (size_t n = 0; n <= ack.size(); ++n) {
    const Bytes p(ack.begin(), ack.begin() + static_cast<long>(n));
    r = CheckEthernetFrame(p, ack.size(), 0);
    EXPECT_EQ(r.ok, n == ack.size()) << n;
    if (r.roce && !r.has_bth) {
      EXPECT_EQ(pcap_check::FormatReport("3", r), "3 ? dqpn=? psn=? bad capture_truncated");
    }
  }
}

}  // namespace
}  // namespace droce::test
