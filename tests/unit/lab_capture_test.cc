// The lab's capture (src/lab/capture.h, pcapng.h): the option parser and
// its refusals, the pcapng blocks as the format defines them (walked by
// hand, and read back by libpcap), the per-frame comments (fault decisions,
// retransmissions, NAKs, CNPs), and the bounds: frame count, file size, a
// ring of files. No DPDK.
#include <gtest/gtest.h>
#include <pcap/pcap.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "lab/capture.h"
#include "lab/pcapng.h"

namespace droce::lab {
namespace {

// Eth + IPv4 + UDP(4791) + BTH [+ AETH] + ICRC (zeros: nothing here checks it).
std::vector<uint8_t> RoceFrame(uint8_t opcode, uint32_t dqpn, uint32_t psn, int aeth = -1) {
  const size_t payload = 12 + (aeth >= 0 ? 4 : 0) + 4;
  std::vector<uint8_t> f(14 + 20 + 8 + payload, 0);
  f[12] = 0x08;
  uint8_t* ip = f.data() + 14;
  ip[0] = 0x45;
  const size_t ip_len = 20 + 8 + payload;
  ip[2] = static_cast<uint8_t>(ip_len >> 8);
  ip[3] = static_cast<uint8_t>(ip_len);
  ip[8] = 64;
  ip[9] = 17;
  uint8_t* udp = ip + 20;
  udp[2] = 0x12;
  udp[3] = 0xB7;  // 4791
  udp[4] = static_cast<uint8_t>((8 + payload) >> 8);
  udp[5] = static_cast<uint8_t>(8 + payload);
  uint8_t* bth = udp + 8;
  bth[0] = opcode;
  bth[5] = static_cast<uint8_t>(dqpn >> 16);
  bth[6] = static_cast<uint8_t>(dqpn >> 8);
  bth[7] = static_cast<uint8_t>(dqpn);
  bth[9] = static_cast<uint8_t>(psn >> 16);
  bth[10] = static_cast<uint8_t>(psn >> 8);
  bth[11] = static_cast<uint8_t>(psn);
  if (aeth >= 0) bth[12] = static_cast<uint8_t>(aeth);
  return f;
}

std::string TempPath(const std::string& name) {
  return ::testing::TempDir() + "droce_capture_" + std::to_string(getpid()) + "_" + name;
}

std::vector<uint8_t> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), {});
}

uint32_t U32(const std::vector<uint8_t>& b, size_t off) {
  uint32_t v;
  std::memcpy(&v, b.data() + off, 4);
  return v;
}
uint16_t U16(const std::vector<uint8_t>& b, size_t off) {
  uint16_t v;
  std::memcpy(&v, b.data() + off, 2);
  return v;
}

struct Block {
  uint32_t type;
  size_t off, len;
};

// Walks the file's blocks: each length a multiple of 4, repeated at its end.
std::vector<Block> Blocks(const std::vector<uint8_t>& b) {
  std::vector<Block> out;
  size_t off = 0;
  while (off < b.size()) {
    EXPECT_LE(off + 12, b.size());
    if (off + 12 > b.size()) break;
    const uint32_t len = U32(b, off + 4);
    EXPECT_EQ(len % 4, 0u);
    EXPECT_LE(off + len, b.size());
    if (len < 12 || off + len > b.size()) break;
    EXPECT_EQ(U32(b, off + len - 4), len) << "trailing length of the block at " << off;
    out.push_back({U32(b, off), off, len});
    off += len;
  }
  return out;
}

// The options of a block from `first` (its offset in the block) on: code ->
// values.
std::vector<std::pair<uint16_t, std::string>> Options(const std::vector<uint8_t>& b, const Block& blk, size_t first) {
  std::vector<std::pair<uint16_t, std::string>> out;
  size_t off = blk.off + first;
  const size_t end = blk.off + blk.len - 4;
  while (off + 4 <= end) {
    const uint16_t code = U16(b, off), len = U16(b, off + 2);
    if (code == 0) break;
    out.emplace_back(code, std::string(reinterpret_cast<const char*>(b.data() + off + 4), len));
    off += 4 + ((len + 3u) & ~3u);
  }
  return out;
}

TEST(CaptureSpec, ParsesEveryOption) {
  auto o = ParseCaptureSpec("/tmp/x.pcapng,size=2M,files=4,count=1000,snaplen=128,point=both");
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->path, "/tmp/x.pcapng");
  EXPECT_EQ(o->file_bytes, 2u << 20);
  EXPECT_EQ(o->files, 4u);
  EXPECT_EQ(o->count, 1000u);
  EXPECT_EQ(o->snaplen, 128u);
  EXPECT_EQ(o->points, kCaptureBoth);
  auto d = ParseCaptureSpec("/tmp/y");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->file_bytes, 0u);
  EXPECT_EQ(d->files, 1u);
  EXPECT_EQ(d->count, 0u);
  EXPECT_EQ(d->snaplen, 65535u);
  EXPECT_EQ(d->points, kCaptureEngine);
  EXPECT_EQ(ParseCaptureSpec("/a,size=64k")->file_bytes, 65536u);
  EXPECT_EQ(ParseCaptureSpec("/a,size=1G")->file_bytes, 1ull << 30);
  EXPECT_EQ(ParseCaptureSpec("/a,point=wire")->points, kCaptureWire);
}

TEST(CaptureSpec, RefusesWithTheReason) {
  auto msg = [](const char* s) {
    auto o = ParseCaptureSpec(s);
    EXPECT_FALSE(o.ok()) << s;
    return o.ok() ? std::string() : std::string(o.status().message());
  };
  EXPECT_EQ(msg(""), "no file to capture to (PATH[,size=N,...])");
  EXPECT_EQ(msg(",size=1M"), "no file to capture to (PATH[,size=N,...])");
  EXPECT_EQ(msg("/a,sise=1M"), "unknown capture option 'sise' (size, files, count, snaplen, point)");
  EXPECT_EQ(msg("/a,size=lots"), "'size' needs a number (with k, M or G), not 'lots'");
  EXPECT_EQ(msg("/a,count=-1"), "'count' needs a number, not '-1'");
  EXPECT_EQ(msg("/a,size=100"), "'size' is at least 4096 bytes (or 0: no limit)");
  EXPECT_EQ(msg("/a,files=0,size=1M"), "'files' is 1 to 1000");
  EXPECT_EQ(msg("/a,files=3"), "a ring of files ('files' above 1) needs 'size', the bytes of each file");
  EXPECT_EQ(msg("/a,snaplen=10"), "'snaplen' is 64 to 65535");
  EXPECT_EQ(msg("/a,point=middle"), "'point' is engine, wire or both, not 'middle'");
}

TEST(CaptureSpec, DevicePathGoesBeforeTheExtension) {
  EXPECT_EQ(DevicePath("/tmp/a.pcapng", "droce1"), "/tmp/a-droce1.pcapng");
  EXPECT_EQ(DevicePath("/tmp/a", "droce1"), "/tmp/a-droce1");
  EXPECT_EQ(DevicePath("/tmp.d/a", "droce2"), "/tmp.d/a-droce2");
  EXPECT_EQ(DevicePath("/tmp/.hidden", "droce1"), "/tmp/.hidden-droce1");
}

TEST(Pcapng, BlocksAsTheFormatSays) {
  const std::string path = TempPath("blocks.pcapng");
  {
    auto w = PcapngWriter::Create(path, {{"droce0 tx", "before the fault stage", 128}, {"droce0 rx", "", 128}});
    ASSERT_TRUE(w.ok()) << w.status();
    const std::vector<uint8_t> f = RoceFrame(0x04, 0x11, 7);
    std::vector<uint8_t> big(300, 0xAB);
    EXPECT_TRUE((*w)->Packet(0, 1'700'000'000'123'456'789ull, f, static_cast<uint32_t>(f.size()),
                             PcapngDir::kOutbound, "dropped by rule 2"));
    EXPECT_TRUE((*w)->Packet(1, 1'700'000'001'000'000'000ull, big, 300, PcapngDir::kInbound, ""));
    EXPECT_TRUE((*w)->Packet(0, 1'700'000'002'000'000'000ull, f, static_cast<uint32_t>(f.size()),
                             PcapngDir::kUnknown, ""));
    EXPECT_TRUE((*w)->Flush());
    EXPECT_EQ((*w)->bytes(), ReadFile(path).size());
  }
  const std::vector<uint8_t> b = ReadFile(path);
  const std::vector<Block> blocks = Blocks(b);
  ASSERT_EQ(blocks.size(), 6u);
  // Section header: byte-order magic, version 1.0, unknown section length.
  EXPECT_EQ(blocks[0].type, 0x0A0D0D0Au);
  EXPECT_EQ(U32(b, 8), 0x1A2B3C4Du);
  EXPECT_EQ(U16(b, 12), 1u);
  EXPECT_EQ(U16(b, 14), 0u);
  int64_t section = 0;
  std::memcpy(&section, b.data() + 16, 8);
  EXPECT_EQ(section, -1);
  EXPECT_EQ(Options(b, blocks[0], 24), (std::vector<std::pair<uint16_t, std::string>>{{4, "droce"}}));
  // Interfaces: Ethernet, snaplen, name, description, nanosecond resolution.
  EXPECT_EQ(blocks[1].type, 1u);
  EXPECT_EQ(U16(b, blocks[1].off + 8), 1u);
  EXPECT_EQ(U32(b, blocks[1].off + 12), 128u);
  EXPECT_EQ(Options(b, blocks[1], 16), (std::vector<std::pair<uint16_t, std::string>>{
                                           {2, "droce0 tx"}, {3, "before the fault stage"}, {9, std::string(1, 9)}}));
  EXPECT_EQ(blocks[2].type, 1u);
  EXPECT_EQ(U32(b, blocks[2].off + 12), 128u);
  // Packets: interface, 64-bit timestamp, lengths, data, comment, flags.
  const Block& p0 = blocks[3];
  EXPECT_EQ(p0.type, 6u);
  EXPECT_EQ(U32(b, p0.off + 8), 0u);
  const uint64_t ts = (uint64_t{U32(b, p0.off + 12)} << 32) | U32(b, p0.off + 16);
  EXPECT_EQ(ts, 1'700'000'000'123'456'789ull);
  const uint32_t cap = U32(b, p0.off + 20);
  EXPECT_EQ(cap, RoceFrame(0x04, 0x11, 7).size());
  EXPECT_EQ(U32(b, p0.off + 24), cap);
  EXPECT_EQ(0, std::memcmp(b.data() + p0.off + 28, RoceFrame(0x04, 0x11, 7).data(), cap));
  uint32_t outbound = 2;
  EXPECT_EQ(Options(b, p0, 28 + ((cap + 3) & ~3u)),
            (std::vector<std::pair<uint16_t, std::string>>{
                {1, "dropped by rule 2"}, {2, std::string(reinterpret_cast<const char*>(&outbound), 4)}}));
  // Truncated to its interface's snaplen, original length kept.
  EXPECT_EQ(U32(b, blocks[4].off + 20), 128u);
  EXPECT_EQ(U32(b, blocks[4].off + 24), 300u);
  // No direction and no comment: no options at all.
  EXPECT_EQ(blocks[5].len, 32 + ((cap + 3) & ~3u));

  // libpcap reads it back: three frames, nanosecond timestamps.
  char err[PCAP_ERRBUF_SIZE] = {};
  pcap_t* pc = pcap_open_offline_with_tstamp_precision(path.c_str(), PCAP_TSTAMP_PRECISION_NANO, err);
  ASSERT_NE(pc, nullptr) << err;
  EXPECT_EQ(pcap_datalink(pc), DLT_EN10MB);
  pcap_pkthdr* h = nullptr;
  const u_char* data = nullptr;
  ASSERT_EQ(pcap_next_ex(pc, &h, &data), 1) << pcap_geterr(pc);
  EXPECT_EQ(h->ts.tv_sec, 1'700'000'000);
  EXPECT_EQ(h->ts.tv_usec, 123'456'789);  // nanoseconds at this precision
  EXPECT_EQ(h->caplen, cap);
  ASSERT_EQ(pcap_next_ex(pc, &h, &data), 1) << pcap_geterr(pc);
  EXPECT_EQ(h->caplen, 128u);
  EXPECT_EQ(h->len, 300u);
  ASSERT_EQ(pcap_next_ex(pc, &h, &data), 1);
  EXPECT_EQ(pcap_next_ex(pc, &h, &data), PCAP_ERROR_BREAK);
  pcap_close(pc);
  std::remove(path.c_str());
}

TEST(Pcapng, RefusesASymlinkAndAMissingDirectory) {
  const std::string target = TempPath("target"), link = TempPath("link.pcapng");
  std::remove(link.c_str());
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  auto w = PcapngWriter::Create(link, {{"x", "", 65535}});
  EXPECT_FALSE(w.ok());
  std::remove(link.c_str());
  auto m = PcapngWriter::Create("/nonexistent-droce-dir/x.pcapng", {{"x", "", 65535}});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), "cannot create /nonexistent-droce-dir/x.pcapng: No such file or directory");
}

TEST(PacketNotes, RetransmissionsArePerQpAndPerPsn) {
  PacketNotes n;
  auto note = [&](uint8_t op, uint32_t qp, uint32_t psn) { return n.Note(RoceFrame(op, qp, psn), nullptr); };
  EXPECT_EQ(note(0x06, 0x11, 100), "");  // WRITE FIRST
  EXPECT_EQ(note(0x07, 0x11, 101), "");
  EXPECT_EQ(note(0x08, 0x11, 102), "");
  EXPECT_EQ(note(0x06, 0x11, 100), "retransmission 1 of PSN 100");  // go-back-N from 100
  EXPECT_EQ(note(0x07, 0x11, 101), "retransmission 1 of PSN 101");
  EXPECT_EQ(note(0x06, 0x11, 100), "retransmission 2 of PSN 100");
  EXPECT_EQ(note(0x04, 0x11, 103), "");  // new again
  // Another QP has its own PSNs.
  EXPECT_EQ(note(0x04, 0x12, 100), "");
  EXPECT_EQ(note(0x04, 0x12, 100), "retransmission 1 of PSN 100");
  // READ responses are followed apart from the requests to the same QP.
  EXPECT_EQ(note(0x0D, 0x11, 50), "");
  EXPECT_EQ(note(0x0F, 0x11, 51), "");
  EXPECT_EQ(note(0x0D, 0x11, 50), "retransmission 1 of READ response PSN 50");
  // The PSN wraps at 2^24: 0 after 0xFFFFFF is new.
  EXPECT_EQ(note(0x04, 0x13, 0xFFFFFF), "");
  EXPECT_EQ(note(0x04, 0x13, 0), "");
  EXPECT_EQ(note(0x04, 0x13, 0xFFFFFF), "retransmission 1 of PSN 16777215");
  // UD and UC are not retransmitted: nothing to say.
  EXPECT_EQ(note(0x64, 0x14, 5), "");
  EXPECT_EQ(note(0x64, 0x14, 5), "");
  EXPECT_EQ(note(0x24, 0x15, 5), "");
  EXPECT_EQ(note(0x24, 0x15, 5), "");
}

TEST(PacketNotes, AcksNaksAndCnps) {
  PacketNotes n;
  EXPECT_EQ(n.Note(RoceFrame(0x11, 0x11, 7, 0x1F), nullptr), "");  // a plain ACK
  EXPECT_EQ(n.Note(RoceFrame(0x11, 0x11, 7, 0x60), nullptr), "NAK (PSN sequence error): expected PSN 7");
  EXPECT_EQ(n.Note(RoceFrame(0x11, 0x11, 8, 0x62), nullptr), "NAK (remote access error) for PSN 8");
  EXPECT_EQ(n.Note(RoceFrame(0x11, 0x11, 9, 0x61), nullptr), "NAK (invalid request) for PSN 9");
  EXPECT_EQ(n.Note(RoceFrame(0x11, 0x11, 9, 0x63), nullptr), "NAK (remote operational error) for PSN 9");
  EXPECT_EQ(n.Note(RoceFrame(0x11, 0x11, 10, 0x20 | 14), nullptr), "RNR NAK for PSN 10 (timer code 14)");
  EXPECT_EQ(n.Note(RoceFrame(0x12, 0x11, 11, 0x00), nullptr), "");  // ATOMIC ACK
  EXPECT_EQ(n.Note(RoceFrame(0x81, 0x0123AB, 0), nullptr), "CNP for QP 0x0123ab");
  // Not RoCE: nothing.
  std::vector<uint8_t> arp(60, 0);
  arp[12] = 0x08;
  arp[13] = 0x06;
  EXPECT_EQ(n.Note(arp, nullptr), "");
}

TEST(PacketNotes, FaultDecisions) {
  PacketNotes n;
  Decision d;
  d.drop = true;
  d.drop_rule = 2;
  EXPECT_EQ(n.Note(RoceFrame(0x04, 0x11, 1), &d), "dropped by rule 2");
  Decision c;
  c.corrupt = true;
  c.corrupt_rule = 1;
  c.duplicate = true;
  c.duplicate_rule = 3;
  c.at_ns = 1000;
  c.release_ns = 121'000;
  c.delay_rule = 4;
  EXPECT_EQ(n.Note(RoceFrame(0x04, 0x11, 2), &c),
            "ICRC corrupted by rule 1; duplicated by rule 3; delayed 120.0 us by rule 4");
  Decision r;
  r.hold_packets = 3;
  r.release_ns = 5'000'000;
  r.reorder_rule = 1;
  EXPECT_EQ(n.Note(RoceFrame(0x04, 0x11, 3), &r), "held behind 3 packets by rule 1 (reorder)");
  // A decision and a retransmission together.
  EXPECT_EQ(n.Note(RoceFrame(0x04, 0x11, 1), &d), "dropped by rule 2; retransmission 1 of PSN 1");
  // A judged frame that passes: nothing.
  Decision pass;
  EXPECT_EQ(n.Note(RoceFrame(0x04, 0x11, 4), &pass), "");
}

std::vector<Capture::Frame> Frames(const std::vector<std::vector<uint8_t>>& fs) {
  std::vector<Capture::Frame> out;
  for (const auto& f : fs) out.push_back({f, static_cast<uint32_t>(f.size()), nullptr});
  return out;
}

TEST(Capture, InterfacesFollowThePointsAndTheFaultStage) {
  const std::string path = TempPath("points.pcapng");
  CaptureOptions o = *ParseCaptureSpec(path + ",point=wire");
  auto c = Capture::Start(o, "droce0", /*fault=*/true);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE((*c)->wants(Capture::kTxEngine));
  EXPECT_TRUE((*c)->wants(Capture::kTxWire));
  EXPECT_TRUE((*c)->wants(Capture::kRxWire));
  EXPECT_FALSE((*c)->wants(Capture::kRxEngine));
  // Without a fault stage, engine and wire are one: written once.
  auto n = Capture::Start(o, "droce0", /*fault=*/false);
  ASSERT_TRUE(n.ok());
  EXPECT_TRUE((*n)->wants(Capture::kTxEngine));
  EXPECT_FALSE((*n)->wants(Capture::kTxWire));
  EXPECT_FALSE((*n)->wants(Capture::kRxWire));
  EXPECT_TRUE((*n)->wants(Capture::kRxEngine));
  n->reset();
  const std::vector<uint8_t> b = ReadFile(path);
  const std::vector<Block> blocks = Blocks(b);
  ASSERT_EQ(blocks.size(), 3u);
  EXPECT_EQ(Options(b, blocks[1], 16)[0].second, "droce0 tx");
  EXPECT_EQ(Options(b, blocks[2], 16)[0].second, "droce0 rx");
  std::remove(path.c_str());
}

TEST(Capture, EndsAtItsFrameCount) {
  const std::string path = TempPath("count.pcapng");
  auto c = Capture::Start(*ParseCaptureSpec(path + ",count=5"), "droce0", false);
  ASSERT_TRUE(c.ok());
  std::vector<std::vector<uint8_t>> fs;
  for (uint32_t i = 0; i < 3; ++i) fs.push_back(RoceFrame(0x04, 0x11, i));
  EXPECT_TRUE((*c)->Record(Capture::kTxEngine, 1, Frames(fs)));
  EXPECT_FALSE((*c)->Record(Capture::kRxEngine, 2, Frames(fs)));  // 2 of these 3 fit
  EXPECT_FALSE((*c)->live());
  EXPECT_FALSE((*c)->Record(Capture::kTxEngine, 3, Frames(fs)));
  const CaptureStatus st = (*c)->Status();
  EXPECT_TRUE(st.ended);
  EXPECT_EQ(st.why, "frame count reached");
  EXPECT_EQ(st.frames, 5u);
  // The file is complete once the capture ended (closed, not only flushed).
  const std::vector<Block> blocks = Blocks(ReadFile(path));
  ASSERT_EQ(blocks.size(), 3u + 5u);
  EXPECT_EQ(st.bytes, ReadFile(path).size());
  std::remove(path.c_str());
}

TEST(Capture, OneFileEndsAtItsSize) {
  const std::string path = TempPath("size.pcapng");
  auto c = Capture::Start(*ParseCaptureSpec(path + ",size=4096"), "droce0", false);
  ASSERT_TRUE(c.ok());
  std::vector<std::vector<uint8_t>> fs(1, std::vector<uint8_t>(1000, 0x55));
  int taken = 0;
  while ((*c)->Record(Capture::kTxEngine, 1, Frames(fs)) && taken < 100) ++taken;
  const CaptureStatus st = (*c)->Status();
  EXPECT_EQ(st.why, "file size reached");
  // 1000-byte frames (1032-byte blocks) after a ~250-byte header: the one
  // that crosses 4096 is the last.
  EXPECT_EQ(st.frames, 4u);
  EXPECT_GE(ReadFile(path).size(), 4096u);
  EXPECT_LT(ReadFile(path).size(), 4096u + 1100u);
  std::remove(path.c_str());
}

// A running capture is readable: the file is flushed at least every 100 ms
// of frames (and by Status()).
TEST(Capture, FlushesEvery100Ms) {
  const std::string path = TempPath("flush.pcapng");
  auto c = Capture::Start(*ParseCaptureSpec(path), "droce0", false);
  ASSERT_TRUE(c.ok());
  std::vector<std::vector<uint8_t>> fs(1, RoceFrame(0x04, 0x11, 1));
  const uint64_t t0 = 1'700'000'000'000'000'000ull;
  ASSERT_TRUE((*c)->Record(Capture::kTxEngine, t0, Frames(fs)));  // the first flushes
  const size_t first = ReadFile(path).size();
  ASSERT_TRUE((*c)->Record(Capture::kTxEngine, t0 + 1'000'000, Frames(fs)));
  EXPECT_EQ(ReadFile(path).size(), first);  // 1 ms later: still buffered
  ASSERT_TRUE((*c)->Record(Capture::kTxEngine, t0 + 100'000'000, Frames(fs)));
  EXPECT_EQ(Blocks(ReadFile(path)).size(), 3u + 3u);  // 100 ms after the last flush: all on disk
  c->reset();
  std::remove(path.c_str());
}

TEST(Capture, ARingOfFilesKeepsTheNewest) {
  const std::string path = TempPath("ring.pcapng");
  auto c = Capture::Start(*ParseCaptureSpec(path + ",size=4096,files=3"), "droce0", false);
  ASSERT_TRUE(c.ok());
  std::vector<std::vector<uint8_t>> fs(1, std::vector<uint8_t>(1000, 0x55));
  for (uint32_t i = 0; i < 40; ++i) {
    fs[0][0] = static_cast<uint8_t>(i);
    ASSERT_TRUE((*c)->Record(Capture::kTxEngine, i, Frames(fs)));
  }
  const CaptureStatus st = (*c)->Status();
  EXPECT_FALSE(st.ended);
  EXPECT_EQ(st.frames, 40u);
  EXPECT_EQ(st.files_done, 10u);  // 4 frames a file
  EXPECT_EQ(st.file, path + ".0");  // the 10th file is .0 again
  c->reset();
  // Each file is a whole capture of its own: header and interfaces first.
  uint64_t frames = 0;
  for (int i = 0; i < 3; ++i) {
    const std::string f = path + "." + std::to_string(i);
    const std::vector<uint8_t> b = ReadFile(f);
    const std::vector<Block> blocks = Blocks(b);
    ASSERT_EQ(blocks.size(), 3u + 4u) << f;
    EXPECT_EQ(blocks[0].type, 0x0A0D0D0Au);
    // The 8th, 9th and 10th files (.1, .2, .0): frames 28..39 survive.
    const uint8_t first[3] = {36, 28, 32};
    EXPECT_EQ(b[blocks[3].off + 28], first[i]) << f;
    frames += blocks.size() - 3;
    std::remove(f.c_str());
  }
  EXPECT_EQ(frames, 12u);
}

}  // namespace
}  // namespace droce::lab
