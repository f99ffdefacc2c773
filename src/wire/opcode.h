// The IBA transport opcode table (IBA 9.2, table 35; RoCEv2 annex A17 for the
// CNP): for every opcode droce knows, which extended headers follow the BTH,
// their offsets, and what the packet means to the transport.
#pragma once

#include <cstdint>

namespace droce::wire {

inline constexpr unsigned kBthLen = 12;
inline constexpr unsigned kRethLen = 16;
inline constexpr unsigned kAethLen = 4;
inline constexpr unsigned kAtomicEthLen = 28;
inline constexpr unsigned kAtomicAckEthLen = 8;
inline constexpr unsigned kDethLen = 8;
inline constexpr unsigned kImmDtLen = 4;
inline constexpr unsigned kIethLen = 4;
inline constexpr unsigned kXrcEthLen = 4;
inline constexpr unsigned kIcrcLen = 4;
inline constexpr unsigned kCnpPayloadLen = 16;

enum Opcode : uint8_t {
  kRcSendFirst = 0x00,
  kRcSendMiddle = 0x01,
  kRcSendLast = 0x02,
  kRcSendLastImm = 0x03,
  kRcSendOnly = 0x04,
  kRcSendOnlyImm = 0x05,
  kRcWriteFirst = 0x06,
  kRcWriteMiddle = 0x07,
  kRcWriteLast = 0x08,
  kRcWriteLastImm = 0x09,
  kRcWriteOnly = 0x0A,
  kRcWriteOnlyImm = 0x0B,
  kRcReadRequest = 0x0C,
  kRcReadResponseFirst = 0x0D,
  kRcReadResponseMiddle = 0x0E,
  kRcReadResponseLast = 0x0F,
  kRcReadResponseOnly = 0x10,
  kRcAck = 0x11,
  kRcAtomicAck = 0x12,
  kRcCompareSwap = 0x13,
  kRcFetchAdd = 0x14,
  kRcSendLastInv = 0x16,
  kRcSendOnlyInv = 0x17,
  // IBA 1.5 (Linux rxe has it): an 8-byte WRITE placed atomically, RETH +
  // 8 bytes of payload, answered by an ACK.
  kRcAtomicWrite = 0x1D,
  kUcSendFirst = 0x20,
  kUcSendMiddle = 0x21,
  kUcSendLast = 0x22,
  kUcSendLastImm = 0x23,
  kUcSendOnly = 0x24,
  kUcSendOnlyImm = 0x25,
  kUcWriteFirst = 0x26,
  kUcWriteMiddle = 0x27,
  kUcWriteLast = 0x28,
  kUcWriteLastImm = 0x29,
  kUcWriteOnly = 0x2A,
  kUcWriteOnlyImm = 0x2B,
  // XRC (IBA 9.2, transport 101b): the RC opcodes | 0xA0; every request
  // carries an XRCETH (the responder's XRC SRQ) right after the BTH,
  // responses (ACK, READ responses, atomic ACK) carry none.
  kXrcBase = 0xA0,
  kUdSendOnly = 0x64,
  kUdSendOnlyImm = 0x65,
  kCnp = 0x81,
};

// Bits of OpcodeInfo::mask.
enum OpcodeMask : uint32_t {
  kMaskReth = 1u << 0,
  kMaskAeth = 1u << 1,
  kMaskAtomicEth = 1u << 2,
  kMaskAtomicAckEth = 1u << 3,
  kMaskDeth = 1u << 4,
  kMaskImmDt = 1u << 5,
  kMaskIeth = 1u << 6,
  kMaskPayload = 1u << 7,   // the packet may carry payload
  kMaskFirst = 1u << 8,     // first packet of a message (also set for "only")
  kMaskMiddle = 1u << 9,
  kMaskLast = 1u << 10,     // last packet of a message (also set for "only")
  kMaskRecvWqe = 1u << 11,  // consumes a receive WQE at the responder
  kMaskSend = 1u << 12,
  kMaskWrite = 1u << 13,
  kMaskRead = 1u << 14,
  kMaskAtomic = 1u << 15,
  kMaskRequest = 1u << 16,   // requester → responder
  kMaskResponse = 1u << 17,  // responder → requester (ACKs, read responses)
  kMaskCnp = 1u << 18,
  kMaskAtomicWrite = 1u << 19,  // with kMaskWrite: the 8 bytes are stored atomically
  kMaskXrceth = 1u << 20,       // an XRC request: XRCETH after the BTH
  kMaskOnly = kMaskFirst | kMaskLast,
};

struct OpcodeInfo {
  const char* name;  // nullptr: opcode unknown or unsupported
  uint32_t mask;
  uint8_t length;  // BTH plus every extended header, in bytes
  // Offsets from the start of the BTH; 0 when the header is absent.
  uint8_t reth, aeth, atomic_eth, atomic_ack_eth, deth, immdt, ieth, xrceth;
  uint8_t payload;  // offset of the payload (== length)
};

// Info for an opcode byte; info.name == nullptr for an unknown opcode.
const OpcodeInfo& opcode_info(uint8_t opcode);

inline bool opcode_known(uint8_t opcode) { return opcode_info(opcode).name != nullptr; }

// The transport of an opcode (its top 3 bits, IBA 9.2): 0 RC, 1 UC, 2 RD,
// 3 UD, 4 CNP, 5 XRC. The low 5 bits name the operation, the same for RC,
// UC and XRC (an XRC opcode & 0x1F is its RC twin).
inline uint8_t opcode_transport(uint8_t opcode) { return opcode >> 5; }
inline constexpr uint8_t kTransportRc = 0, kTransportUc = 1, kTransportUd = 3, kTransportXrc = 5;
inline uint8_t opcode_operation(uint8_t opcode) { return opcode & 0x1F; }

}  // namespace droce::wire
