// Builders for every opcode: the transport headers of a packet as one value,
// written at the opcode table's offsets, and whole frames (outer headers,
// transport headers, payload, pad, ICRC). The requester and responder write
// their few opcodes directly; these serve tests, the differential fuzzer and
// tools that need any packet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "wire/frame.h"
#include "wire/headers.h"
#include "wire/opcode.h"

namespace droce::wire {

// The BTH and every extended header an opcode may carry. The writer uses the
// ones bth.opcode carries and ignores the rest; the reader leaves the rest at
// their defaults.
struct TransportHeaders {
  Bth bth;
  Deth deth;
  Reth reth;
  AtomicEth atomic_eth;
  Aeth aeth;
  AtomicAckEth atomic_ack_eth;
  uint32_t imm = 0;        // ImmDt, as the big-endian value on the wire
  uint32_t ieth_rkey = 0;  // IETH
  uint32_t xrc_srqn = 0;   // XRCETH: the responder's XRC SRQ (24 bits)
};

// Writes the BTH and the extended headers of h.bth.opcode at the table's
// offsets (a CNP's 16 reserved bytes as zeros). Returns the bytes written,
// opcode_info(opcode).length, or 0 (nothing written) for an unknown opcode.
unsigned write_transport_headers(uint8_t* bth, const TransportHeaders& h);

// Reads the BTH and the extended headers `info` lists from `bth`; the caller
// has checked that info.length bytes are readable (parse_frame did).
TransportHeaders read_transport_headers(const uint8_t* bth, const OpcodeInfo& info);
// The headers of a parsed packet.
inline TransportHeaders read_transport_headers(const PacketView& v) {
  return read_transport_headers(v.bth_ptr(), *v.info);
}

// Bytes of a whole frame: outer headers, transport headers, payload, pad to a
// multiple of 4, ICRC. 0 for an unknown opcode.
size_t frame_len_for(const Path& path, uint8_t opcode, size_t payload_len);

// Builds a whole frame into `out`: write_outer, the transport headers with
// bth.pad set for the payload (the pad count in h.bth is ignored), the
// payload, zero pad bytes, the ICRC and, if path.udp_checksum, the UDP
// checksum. Returns the frame length, or 0 if the opcode is unknown, carries
// no payload but `payload` is not empty, the datagram would exceed 65535
// bytes, or `out` is too small.
size_t build_frame(std::span<uint8_t> out, const Path& path, const TransportHeaders& h,
                   std::span<const uint8_t> payload, uint16_t ip_id = 0);

}  // namespace droce::wire
