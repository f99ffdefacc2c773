// `droce pcap-check [-v] FILE...`: checks every RoCEv2 packet (UDP to port
// 4791, over IPv4 or IPv6, tagged or not) in pcap and pcapng captures:
// headers valid for the opcode and ICRC correct. See docs/TOOLS.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace droce::pcap_check {

// What the checker found in one captured frame.
struct FrameReport {
  bool roce = false;  // a UDP datagram to port 4791, however malformed otherwise
  bool ok = false;    // roce, and valid: headers, lengths and ICRC
  // When roce && !ok: a wire::parse_error_name() value, "capture_truncated"
  // (the capture kept fewer bytes than the frame had), "fcs_err" or
  // "vlan_stack" (two VLAN tags: the parser, like the engine, takes one).
  const char* reason = "";
  bool has_bth = false;  // the BTH was captured: the fields below are set
  uint8_t opcode = 0;
  uint32_t dqpn = 0;
  uint32_t psn = 0;
};

// Checks one captured Ethernet frame. `wire_len` is its length on the wire
// (pcap's len; the capture may hold fewer bytes), `fcs_len` the bytes of
// Ethernet FCS at its end when the capture says so (0 when absent or unknown;
// a 4-byte FCS is verified).
FrameReport CheckEthernetFrame(std::span<const uint8_t> captured, size_t wire_len, unsigned fcs_len);

// The -v line for a RoCE packet (without the newline), e.g.
// "7 RC_SEND_ONLY dqpn=0x000011 psn=5557091 ok".
std::string FormatReport(const std::string& index, const FrameReport& r);

}  // namespace droce::pcap_check

// The subcommand; argv[0] is the command name. Returns the exit status: 0
// when every RoCE packet is valid, 1 when any is not, 2 for a usage or file
// error.
int PcapCheckMain(int argc, char** argv);
