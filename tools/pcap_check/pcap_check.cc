#include "pcap_check.h"

#include <pcap/pcap.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <vector>

#include "wire/bytes.h"
#include "wire/frame.h"
#include "wire/icrc.h"
#include "wire/opcode.h"

namespace droce::pcap_check {
namespace {

constexpr int kExitOk = 0;
constexpr int kExitBad = 1;
constexpr int kExitUsage = 2;

constexpr char kUsage[] =
    "usage: droce pcap-check [-v] FILE...\n"
    "\n"
    "Checks every RoCEv2 packet (UDP to port 4791, IPv4 or IPv6, 802.1Q tag\n"
    "or not) in pcap and pcapng files: headers valid for the opcode, lengths,\n"
    "IPv4 header checksum, IPv6 UDP checksum if non-zero, and the ICRC.\n"
    "\n"
    "  -v   one line per RoCE packet: index, opcode, destination QP, PSN,\n"
    "       'ok' or 'bad REASON'\n"
    "\n"
    "Ends with 'packets: N roce: N ok: N bad: N'. Exit status 0 if every RoCE\n"
    "packet is valid, 1 if any is not, 2 for a usage or file error.\n";

bool Ipv6ExtHeader(uint8_t nh) {
  switch (nh) {
    case 0: case 43: case 44: case 51: case 60: case 135: case 139: case 140: case 253: case 254:
      return true;
    default:
      return false;
  }
}

// Finds a UDP header to port 4791 the way a permissive sniffer would, so
// that a RoCE packet with a bad IP checksum, IPv4 options, extension headers
// or a wrong IP version still counts as RoCE (and then as bad). Sets
// *bth_off to the byte after the UDP header.
bool FindRoce(const uint8_t* p, size_t n, size_t* bth_off) {
  if (n < wire::kEthLen) return false;
  size_t off = 12;
  uint16_t type = wire::load_be16(p + off);
  for (int tags = 0; tags < 2 && (type == wire::kEtherTypeVlan || type == 0x88A8); ++tags) {
    if (n < off + 6) return false;
    off += 4;
    type = wire::load_be16(p + off);
  }
  off += 2;
  size_t udp;
  if (type == wire::kEtherTypeIpv4) {
    if (n < off + wire::kIpv4Len) return false;
    const size_t ihl = size_t{p[off] & 0xFu} * 4;
    if (ihl < wire::kIpv4Len || p[off + 9] != wire::kIpProtoUdp) return false;
    if ((wire::load_be16(p + off + 6) & 0x1FFF) != 0) return false;  // a later fragment: no UDP header
    udp = off + ihl;
  } else if (type == wire::kEtherTypeIpv6) {
    if (n < off + wire::kIpv6Len) return false;
    uint8_t nh = p[off + 6];
    size_t q = off + wire::kIpv6Len;
    for (int i = 0; i < 8 && nh != wire::kIpProtoUdp; ++i) {
      if (!Ipv6ExtHeader(nh) || n < q + 8) return false;
      if (nh == 44 && (wire::load_be16(p + q + 2) & 0xFFF8) != 0) return false;  // later fragment
      const size_t len = nh == 44 ? 8 : nh == 51 ? (size_t{p[q + 1]} + 2) * 4 : (size_t{p[q + 1]} + 1) * 8;
      nh = p[q];
      q += len;
    }
    if (nh != wire::kIpProtoUdp) return false;
    udp = q;
  } else {
    return false;
  }
  if (n < udp + wire::kUdpLen || wire::load_be16(p + udp + 2) != wire::kRoceV2Port) return false;
  *bth_off = udp + wire::kUdpLen;
  return true;
}

}  // namespace

FrameReport CheckEthernetFrame(std::span<const uint8_t> captured, size_t wire_len, unsigned fcs_len) {
  FrameReport r;
  size_t bth = 0;
  r.roce = FindRoce(captured.data(), captured.size(), &bth);
  if (!r.roce) return r;
  if (captured.size() >= bth + wire::kBthLen) {
    const wire::Bth b = wire::read_bth(captured.data() + bth);
    r.has_bth = true;
    r.opcode = b.opcode;
    r.dqpn = b.dqpn;
    r.psn = b.psn;
  }
  if (captured.size() < wire_len) {
    r.reason = "capture_truncated";
    return r;
  }
  std::span<const uint8_t> frame = captured;
  if (fcs_len != 0 && frame.size() >= wire::kEthLen + fcs_len) {
    frame = frame.first(frame.size() - fcs_len);
    if (fcs_len == 4) {
      const uint8_t* f = frame.data() + frame.size();
      const uint32_t stored = uint32_t{f[0]} | uint32_t{f[1]} << 8 | uint32_t{f[2]} << 16 | uint32_t{f[3]} << 24;
      if (wire::crc32(0, frame.data(), frame.size()) != stored) {
        r.reason = "fcs_err";
        return r;
      }
    }
  }
  wire::PacketView v;
  const wire::ParseError e = wire::parse_frame(frame, &v);
  r.ok = e == wire::ParseError::kOk;
  if (!r.ok) r.reason = wire::parse_error_name(e);
  // RoCE behind two VLAN tags (802.1ad): the parser, like the engine, takes one.
  if (e == wire::ParseError::kNotIpv4) r.reason = "vlan_stack";
  return r;
}

std::string FormatReport(const std::string& index, const FrameReport& r) {
  char buf[160];
  if (!r.has_bth) {
    std::snprintf(buf, sizeof(buf), "%s ? dqpn=? psn=? %s%s", index.c_str(), r.ok ? "ok" : "bad ", r.ok ? "" : r.reason);
    return buf;
  }
  const char* name = wire::opcode_info(r.opcode).name;
  char unknown[24];
  if (name == nullptr) {
    std::snprintf(unknown, sizeof(unknown), "UNKNOWN_0x%02x", r.opcode);
    name = unknown;
  }
  std::snprintf(buf, sizeof(buf), "%s %s dqpn=0x%06" PRIx32 " psn=%" PRIu32 " %s%s", index.c_str(), name, r.dqpn,
                r.psn, r.ok ? "ok" : "bad ", r.ok ? "" : r.reason);
  return buf;
}

namespace {

struct Counts {
  uint64_t packets = 0, roce = 0, ok = 0, bad = 0;
};

// Bytes in front of the network-layer packet for the link types other than
// Ethernet that captures of RoCE traffic come in (tcpdump -i any, raw IP
// tunnels, loopback), and how to learn its EtherType; -1 if unsupported.
int LinkHeaderLen(int dlt) {
  switch (dlt) {
    case DLT_EN10MB: return 0;
    case DLT_LINUX_SLL: return 16;
    case DLT_LINUX_SLL2: return 20;
    case DLT_RAW: case DLT_IPV4: case DLT_IPV6: return 0;
    case DLT_NULL: case DLT_LOOP: return 4;
    default: return -1;
  }
}

// Rewrites a non-Ethernet frame as Ethernet (zero MACs) into `out`; returns
// false if it carries no IP.
bool ToEthernet(int dlt, const uint8_t* p, size_t caplen, std::vector<uint8_t>* out) {
  const int hl = LinkHeaderLen(dlt);
  if (hl < 0 || caplen < static_cast<size_t>(hl)) return false;
  uint16_t type = 0;
  if (dlt == DLT_LINUX_SLL) {
    type = wire::load_be16(p + 14);
  } else if (dlt == DLT_LINUX_SLL2) {
    type = wire::load_be16(p);
  } else {
    if (caplen <= static_cast<size_t>(hl)) return false;
    const uint8_t version = p[hl] >> 4;
    type = version == 4 ? wire::kEtherTypeIpv4 : version == 6 ? wire::kEtherTypeIpv6 : 0;
  }
  if (type == 0) return false;
  out->assign(wire::kEthLen, 0);
  wire::store_be16(out->data() + 12, type);
  out->insert(out->end(), p + hl, p + caplen);
  return true;
}

int Usage(const char* msg) {
  if (msg != nullptr) std::fprintf(stderr, "droce pcap-check: %s\n", msg);
  std::fputs(kUsage, stderr);
  return kExitUsage;
}

// Returns false on a file error (reported on stderr).
bool CheckFile(const char* path, const std::string& prefix, bool verbose, Counts* c) {
  char errbuf[PCAP_ERRBUF_SIZE] = {};
  pcap_t* pc = pcap_open_offline(path, errbuf);
  if (pc == nullptr) {
    // libpcap names the file in some messages ("PATH: No such file ...").
    const bool named = std::strncmp(errbuf, path, std::strlen(path)) == 0;
    std::fprintf(stderr, "droce pcap-check: %s%s%s\n", named ? "" : path, named ? "" : ": ", errbuf);
    return false;
  }
  const int dlt = pcap_datalink(pc);
  if (LinkHeaderLen(dlt) < 0) {
    const char* name = pcap_datalink_val_to_name(dlt);
    std::fprintf(stderr, "droce pcap-check: %s: unsupported link type %d (%s)\n", path, dlt,
                 name ? name : "unknown");
    pcap_close(pc);
    return false;
  }
  // A pcap file may say that every frame ends with an FCS (the link type's
  // upper bits, in 16-bit units); pcapng's if_fcslen is not exposed by
  // libpcap. Without that information an FCS is left in place, which is
  // harmless: the parser ignores bytes after the IP datagram.
  const int ext = pcap_datalink_ext(pc);
  const unsigned fcs = dlt == DLT_EN10MB && LT_FCS_LENGTH_PRESENT(ext) ? LT_FCS_LENGTH(ext) * 2 : 0;
  std::vector<uint8_t> eth;
  uint64_t index = 0;
  bool ok = true;
  for (;;) {
    pcap_pkthdr* h = nullptr;
    const u_char* data = nullptr;
    const int rc = pcap_next_ex(pc, &h, &data);
    if (rc == PCAP_ERROR_BREAK) break;  // end of file
    if (rc != 1) {
      std::fprintf(stderr, "droce pcap-check: %s: %s\n", path, pcap_geterr(pc));
      ok = false;
      break;
    }
    ++index;
    ++c->packets;
    std::span<const uint8_t> frame(data, h->caplen);
    size_t wire_len = h->len;
    if (dlt != DLT_EN10MB) {
      if (!ToEthernet(dlt, data, h->caplen, &eth)) continue;
      frame = eth;
      const size_t hl = static_cast<size_t>(LinkHeaderLen(dlt));
      wire_len = wire_len >= hl ? wire_len - hl + wire::kEthLen : frame.size();
    }
    const FrameReport r = CheckEthernetFrame(frame, wire_len, fcs);
    if (!r.roce) continue;
    ++c->roce;
    ++(r.ok ? c->ok : c->bad);
    if (verbose) std::printf("%s\n", FormatReport(prefix + std::to_string(index), r).c_str());
  }
  pcap_close(pc);
  return ok;
}

}  // namespace
}  // namespace droce::pcap_check

int PcapCheckMain(int argc, char** argv) {
  using namespace droce::pcap_check;
  bool verbose = false;
  std::vector<const char*> files;
  bool opts = true;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (opts && a == "--") {
      opts = false;
    } else if (opts && (a == "-v" || a == "--verbose")) {
      verbose = true;
    } else if (opts && (a == "-h" || a == "--help")) {
      std::fputs(kUsage, stdout);
      return kExitOk;
    } else if (opts && a.size() > 1 && a[0] == '-') {
      return Usage(("unknown option '" + std::string(a) + "'").c_str());
    } else {
      files.push_back(argv[i]);  // "-" is standard input, as libpcap reads it
    }
  }
  if (files.empty()) return Usage("no capture file given");
  Counts c;
  bool file_error = false;
  for (const char* f : files) {
    const std::string prefix = files.size() > 1 ? std::string(f) + ":" : std::string();
    if (!CheckFile(f, prefix, verbose, &c)) file_error = true;
  }
  std::printf("packets: %" PRIu64 " roce: %" PRIu64 " ok: %" PRIu64 " bad: %" PRIu64 "\n", c.packets, c.roce,
              c.ok, c.bad);
  std::fflush(stdout);
  if (file_error) return kExitUsage;
  return c.bad != 0 ? kExitBad : kExitOk;
}
