// The one place where each operation family's part of a send WQE (abi.h) is
// filled: the provider's ibv_post_send and ibv_wr_* paths both go through
// these, and so does the transport simulator (transport/sim/two_qp.h).
#pragma once

#include <cstdint>
#include <cstring>

#include "queue/abi.h"

namespace droce::queue {

// The header of a fresh WQE, the rest zeroed. `imm_data` (network byte order)
// is kept for kSendImm and kWriteImm only.
inline SendWqe SendWqeHeader(uint64_t wr_id, WqeOp op, uint8_t flags, uint32_t imm_data, uint32_t post_stamp) {
  SendWqe w{};
  w.wr_id = wr_id;
  w.op = op;
  w.flags = flags;
  if (op == WqeOp::kSendImm || op == WqeOp::kWriteImm) w.imm_data = imm_data;
  w.reserved = post_stamp;
  return w;
}

// kWrite, kWriteImm, kRead.
inline void EncodeRdma(SendWqe* w, uint64_t remote_addr, uint32_t rkey) {
  w->remote_addr = remote_addr;
  w->rkey = rkey;
}

// kCmpSwap (compare, swap), kFetchAdd (add, 0).
inline void EncodeAtomic(SendWqe* w, uint64_t remote_addr, uint32_t rkey, uint64_t compare_add, uint64_t swap) {
  w->remote_addr = remote_addr;
  w->rkey = rkey;
  w->compare_add = compare_add;
  w->swap = swap;
}

// kAtomicWrite: the 8 bytes at `data` are copied now and travel in the WQE;
// no SGE or inline data follows.
inline void EncodeAtomicWrite(SendWqe* w, uint64_t remote_addr, uint32_t rkey, const void* data) {
  w->remote_addr = remote_addr;
  w->rkey = rkey;
  std::memcpy(&w->compare_add, data, 8);
  w->num_sge = 0;
  w->flags &= static_cast<uint8_t>(~kWqeInline);
}

// A send on a UD QP: where it goes.
inline void EncodeUd(SendWqe* w, uint32_t ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  w->ah = ah;
  w->remote_qpn = remote_qpn;
  w->remote_qkey = remote_qkey;
}

// kBindMw: window `mw_rkey` (its new rkey) of `type` over [addr, addr +
// length) of MR `mr_lkey`; length 0 (and mr_lkey 0) unbinds a type 1 window.
inline void EncodeBind(SendWqe* w, uint32_t mw_rkey, uint8_t type, uint64_t addr, uint64_t length, uint32_t mr_lkey,
                       uint32_t access) {
  w->rkey = mw_rkey;
  w->remote_addr = addr;
  w->compare_add = length;
  w->swap = uint64_t{mr_lkey} | (uint64_t{access} << 32);
  w->ah = type;
}

}  // namespace droce::queue
