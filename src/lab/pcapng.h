// A pcapng writer (the IETF draft "PCAP Next Generation Dump File Format",
// draft-ietf-opsawg-pcapng): a Section Header Block, one Interface
// Description Block per capture point and an Enhanced Packet Block per
// frame, with nanosecond timestamps (if_tsresol 9), the direction in
// epb_flags and, where there is one, a comment (opt_comment) saying what
// happened to the frame. Written by droce because DPDK 22.11's rte_pcapng
// cannot comment a single packet. Host byte order, as the format allows
// (the byte-order magic tells readers). No DPDK.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace droce::lab {

struct PcapngInterface {
  std::string name;         // if_name, e.g. "droce0 tx"
  std::string description;  // if_description; "" = none
  // libpcap (tcpdump, droce pcap-check) reads a file only if every
  // interface has the same one.
  uint32_t snaplen = 65535;
};

enum class PcapngDir : uint8_t { kUnknown = 0, kInbound = 1, kOutbound = 2 };

class PcapngWriter {
 public:
  // Creates (truncates) `path` and writes the section header and the
  // interfaces. The file is created with mode 0640 and never through a
  // symbolic link.
  static absl::StatusOr<std::unique_ptr<PcapngWriter>> Create(const std::string& path,
                                                              const std::vector<PcapngInterface>& ifs);
  ~PcapngWriter();
  PcapngWriter(const PcapngWriter&) = delete;
  PcapngWriter& operator=(const PcapngWriter&) = delete;

  // One frame seen at `ts_ns` (ns since the Unix epoch) on interface
  // `iface`: `data` is what was captured (at most the interface's snaplen
  // is kept), `orig_len` the frame's length. Returns false once a write has
  // failed (the file is then left as it is).
  bool Packet(uint32_t iface, uint64_t ts_ns, std::span<const uint8_t> data, uint32_t orig_len,
              PcapngDir dir, std::string_view comment);
  bool Flush();
  // Bytes written so far (blocks, including those still buffered).
  uint64_t bytes() const { return bytes_; }

 private:
  PcapngWriter() = default;
  void Put(const void* p, size_t n);
  void Pad(size_t n);
  void Option(uint16_t code, std::string_view value);

  std::FILE* f_ = nullptr;
  std::vector<uint32_t> snaplens_;
  uint64_t bytes_ = 0;
  bool failed_ = false;
};

}  // namespace droce::lab
