// Base and extended transport headers (IBA 9.2 – 9.5) in host order, with
// readers and writers over raw bytes. Callers check lengths first (see
// parse.h); these functions never check.
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
  p[8] = b.ackreq ? 0x80 : 0;
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

}  // namespace droce::wire
