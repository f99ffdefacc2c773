// The one place where each operation family's part of a send WQE (abi.h) is
// filled: the provider's ibv_post_send and ibv_wr_* paths both go through
// these, and so does the transport simulator (transport/sim/two_qp.h). The
// engine reads the member that matches the WQE's op (transport/requester.cc).
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
  w.post_stamp = post_stamp;
  return w;
}

// kWrite, kWriteImm, kRead.
inline void EncodeRdma(SendWqe* w, uint64_t remote_addr, uint32_t rkey) {
  w->wr.rdma = SendWqe::Wr::Rdma{remote_addr, rkey, 0};
}

// kCmpSwap (compare, swap), kFetchAdd (add, 0).
inline void EncodeAtomic(SendWqe* w, uint64_t remote_addr, uint32_t rkey, uint64_t compare_add, uint64_t swap) {
  w->wr.atomic = SendWqe::Wr::Atomic{remote_addr, compare_add, swap, rkey, 0};
}

// kAtomicWrite: the 8 bytes at `data` are copied now and travel in the WQE;
// no SGE or inline data follows.
inline void EncodeAtomicWrite(SendWqe* w, uint64_t remote_addr, uint32_t rkey, const void* data) {
  SendWqe::Wr::AtomicWrite a{remote_addr, rkey, 0, {}};
  std::memcpy(a.data, data, sizeof(a.data));
  w->wr.atomic_write = a;
  w->num_sge = 0;
  w->flags &= static_cast<uint8_t>(~kWqeInline);
}

// A send on a UD QP: where it goes.
inline void EncodeUd(SendWqe* w, uint32_t ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  w->wr.ud = SendWqe::Wr::Ud{remote_qpn, remote_qkey, ah};
}

// kBindMw: window `mw_rkey` (its new rkey) of `type` over [addr, addr +
// length) of MR `mr_lkey`; length 0 (and mr_lkey 0) unbinds a type 1 window.
inline void EncodeBind(SendWqe* w, uint32_t mw_rkey, uint8_t type, uint64_t addr, uint64_t length, uint32_t mr_lkey,
                       uint32_t access) {
  w->wr.bind = SendWqe::Wr::Bind{addr, length, mw_rkey, mr_lkey, access, type, {}};
}

}  // namespace droce::queue
