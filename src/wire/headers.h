// Base and extended transport headers (IBA 9.2 – 9.5) in host order, with
// readers and writers over raw bytes. Callers check lengths first (see
// frame.h); these functions never check.
#pragma once

#include <cstdint>

#include "wire/bytes.h"
#include "wire/opcode.h"

namespace droce::wire {

inline constexpr uint16_t kDefaultPkey = 0xFFFF;

struct Bth {
  uint8_t opcode = 0;
  bool se = false;       // solicited event
  bool migreq = false;
  uint8_t pad = 0;       // pad count 0..3
  uint8_t tver = 0;      // transport header version, must be 0
  uint16_t pkey = kDefaultPkey;
  bool fecn = false;
  bool becn = false;
  uint32_t dqpn = 0;     // 24 bits
  bool ackreq = false;
  // droce's selective-repeat flag (docs/LAB.md "Selective
  // repeat"): the top bit of the 7 reserved bits after AckReq, which IBA
  // has senders zero and receivers ignore (rxe and RNICs read only AckReq
  // and the PSN from that word). A droce requester with selective repeat on
  // sets it on its requests; a droce responder with it on answers such a
  // requester with it set, and its SACKs are NAKs carrying it.
  bool sr = false;
  // In the other 6 reserved bits of that byte (0..63), with sr on: on a
  // SACK, how many PSNs before this one are held too; on a positive ACK, how
  // many duplicate requests the responder received since its last ACK (a
  // DSACK, RFC 2883's idea: each a resend that was not needed); 0 on every
  // other packet.
  uint8_t sr_run = 0;
  uint32_t psn = 0;      // 24 bits
};

inline Bth read_bth(const uint8_t* p) {
  Bth b;
  b.opcode = p[0];
  b.se = p[1] & 0x80;
  b.migreq = p[1] & 0x40;
  b.pad = (p[1] >> 4) & 0x3;
  b.tver = p[1] & 0xF;
  b.pkey = load_be16(p + 2);
  b.fecn = p[4] & 0x80;
  b.becn = p[4] & 0x40;
  b.dqpn = load_be24(p + 5);
  b.ackreq = p[8] & 0x80;
  b.sr = p[8] & 0x40;
  b.sr_run = p[8] & 0x3F;
  b.psn = load_be24(p + 9);
  return b;
}

inline void write_bth(uint8_t* p, const Bth& b) {
  p[0] = b.opcode;
  p[1] = static_cast<uint8_t>((b.se ? 0x80 : 0) | (b.migreq ? 0x40 : 0) | ((b.pad & 3) << 4) |
                              (b.tver & 0xF));
  store_be16(p + 2, b.pkey);
  p[4] = static_cast<uint8_t>((b.fecn ? 0x80 : 0) | (b.becn ? 0x40 : 0));
  store_be24(p + 5, b.dqpn);
  p[8] = static_cast<uint8_t>((b.ackreq ? 0x80 : 0) | (b.sr ? 0x40 : 0) | (b.sr_run & 0x3F));
  store_be24(p + 9, b.psn);
}

struct Reth {
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint32_t dma_len = 0;
};
inline Reth read_reth(const uint8_t* p) { return {load_be64(p), load_be32(p + 8), load_be32(p + 12)}; }
inline void write_reth(uint8_t* p, const Reth& r) {
  store_be64(p, r.va);
  store_be32(p + 8, r.rkey);
  store_be32(p + 12, r.dma_len);
}

// AETH syndrome (IBA 9.4.3, table 43): bits 7..5 select ACK / RNR NAK / NAK.
enum class AckType : uint8_t { kAck = 0, kRnrNak = 1, kReserved = 2, kNak = 3 };
enum class NakCode : uint8_t {
  kPsnSeqError = 0,
  kInvalidRequest = 1,
  kRemoteAccessError = 2,
  kRemoteOperationalError = 3,
  kInvalidRdRequest = 4,
};
// A NAK code's name (IBA table 44), for captures and traces.
inline const char* nak_code_name(uint32_t code) {
  switch (code) {
    case 0: return "PSN sequence error";
    case 1: return "invalid request";
    case 2: return "remote access error";
    case 3: return "remote operational error";
    case 4: return "invalid RD request";
    default: return "reserved code";
  }
}
inline constexpr uint8_t kCreditInvalid = 0x1F;  // "credit count not valid"

struct Aeth {
  uint8_t syndrome = 0;
  uint32_t msn = 0;  // 24 bits

  AckType type() const { return static_cast<AckType>(syndrome >> 5); }
  uint8_t value() const { return syndrome & 0x1F; }  // credits, RNR timer or NAK code
  static Aeth ack(uint32_t msn, uint8_t credits = kCreditInvalid) {
    return {static_cast<uint8_t>(credits & 0x1F), msn & 0xFFFFFF};
  }
  static Aeth rnr_nak(uint32_t msn, uint8_t timer) {
    return {static_cast<uint8_t>(0x20 | (timer & 0x1F)), msn & 0xFFFFFF};
  }
  static Aeth nak(uint32_t msn, NakCode code) {
    return {static_cast<uint8_t>(0x60 | static_cast<uint8_t>(code)), msn & 0xFFFFFF};
  }
};
inline Aeth read_aeth(const uint8_t* p) { return {p[0], load_be24(p + 1)}; }
inline void write_aeth(uint8_t* p, const Aeth& a) {
  p[0] = a.syndrome;
  store_be24(p + 1, a.msn);
}

struct AtomicEth {
  uint64_t va = 0;
  uint32_t rkey = 0;
  uint64_t swap_add = 0;
  uint64_t compare = 0;
};
inline AtomicEth read_atomic_eth(const uint8_t* p) {
  return {load_be64(p), load_be32(p + 8), load_be64(p + 12), load_be64(p + 20)};
}
inline void write_atomic_eth(uint8_t* p, const AtomicEth& a) {
  store_be64(p, a.va);
  store_be32(p + 8, a.rkey);
  store_be64(p + 12, a.swap_add);
  store_be64(p + 20, a.compare);
}

struct Deth {
  uint32_t qkey = 0;
  uint32_t src_qp = 0;  // 24 bits
};
inline Deth read_deth(const uint8_t* p) { return {load_be32(p), load_be24(p + 5)}; }
inline void write_deth(uint8_t* p, const Deth& d) {
  store_be32(p, d.qkey);
  p[4] = 0;
  store_be24(p + 5, d.src_qp);
}

// AtomicAckETH (IBA 9.5.4): the original value at the target address.
struct AtomicAckEth {
  uint64_t orig = 0;
};
inline AtomicAckEth read_atomic_ack_eth(const uint8_t* p) { return {load_be64(p)}; }
inline void write_atomic_ack_eth(uint8_t* p, const AtomicAckEth& a) { store_be64(p, a.orig); }

// ImmDt (IBA 9.6): 4 opaque bytes, handled here as the big-endian value on the
// wire (ibv_wc.imm_data is the same bytes in network order).
inline uint32_t read_immdt(const uint8_t* p) { return load_be32(p); }
inline void write_immdt(uint8_t* p, uint32_t imm) { store_be32(p, imm); }

// IETH (IBA 9.7.4.1.7 / SEND with invalidate): the R_Key to invalidate.
inline uint32_t read_ieth(const uint8_t* p) { return load_be32(p); }
inline void write_ieth(uint8_t* p, uint32_t rkey) { store_be32(p, rkey); }

// AETH credit count (IBA 9.7.5.1.1, table 45 "Encoding of the credit count"):
// the 5-bit field of an ACK is a logarithmic code for the number of receive
// WQEs the responder has; 0x1F means "not valid" (no flow control, as rxe and
// most RNICs send). Returns -1 for 0x1F.
inline constexpr int32_t aeth_credits(uint8_t code) {
  code &= 0x1F;
  if (code == kCreditInvalid) return -1;
  if (code <= 4) return code;
  // Even codes are powers of two (6 -> 8, 8 -> 16, ...), odd codes 1.5 times
  // the power below (5 -> 6, 7 -> 12, ...).
  if ((code & 1) == 0) return int32_t{1} << (code / 2);
  return (int32_t{3} << ((code - 1) / 2)) / 2;
}
// The largest code whose credit count does not exceed `credits` (so that a
// requester never sends more than the responder can take); 30 for >= 32768.
inline constexpr uint8_t aeth_credit_code(uint32_t credits) {
  uint8_t code = 0;
  for (uint8_t c = 1; c < kCreditInvalid; ++c) {
    if (static_cast<uint32_t>(aeth_credits(c)) <= credits) code = c;
  }
  return code;
}
static_assert(aeth_credits(4) == 4 && aeth_credits(5) == 6 && aeth_credits(6) == 8 &&
              aeth_credits(7) == 12 && aeth_credits(8) == 16 && aeth_credits(29) == 24576 &&
              aeth_credits(30) == 32768 && aeth_credits(31) == -1);
static_assert(aeth_credit_code(0) == 0 && aeth_credit_code(7) == 5 && aeth_credit_code(12) == 7 &&
              aeth_credit_code(100000) == 30);

inline const char* nak_code_name(NakCode c) {
  switch (c) {
    case NakCode::kPsnSeqError: return "psn_sequence_error";
    case NakCode::kInvalidRequest: return "invalid_request";
    case NakCode::kRemoteAccessError: return "remote_access_error";
    case NakCode::kRemoteOperationalError: return "remote_operational_error";
    case NakCode::kInvalidRdRequest: return "invalid_rd_request";
  }
  return "reserved";
}

}  // namespace droce::wire
