// Work-queue and completion-queue entries as they sit in the shared rings.
// The provider writes WQEs and reads CQEs; the engine snapshots each WQE into
// private memory once (memcpy) before it validates and uses it, because the
// application can scribble on shared memory at any time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace droce::queue {

struct Sge {
  uint64_t addr;
  uint32_t length;
  uint32_t lkey;
};
static_assert(sizeof(Sge) == 16);

// Send WQE opcodes (droce's own numbering; the provider maps ibv_wr_opcode).
enum class WqeOp : uint8_t {
  kSend = 0,
  kSendImm = 1,
  kSendInv = 2,
  kWrite = 3,
  kWriteImm = 4,
  kRead = 5,
  kCmpSwap = 6,
  kFetchAdd = 7,
  kLocalInv = 8,
  kBindMw = 9,
  kAtomicWrite = 10,  // IBV_WR_ATOMIC_WRITE: 8 bytes (inline or one SGE), RC only
};

enum WqeFlags : uint8_t {
  kWqeSignaled = 1 << 0,
  kWqeSolicited = 1 << 1,
  kWqeInline = 1 << 2,
  kWqeFence = 1 << 3,
};

// The 64-byte send WQE; followed by num_sge Sge entries or by inline_len
// bytes. A 32-byte header every operation uses, then `wr`: one member per
// operation family, as rdma-core's struct rxe_send_wr (rdma_user_rxe.h).
// Each field has one meaning; the member a WQE uses follows from `op`
// (and, for `ud`, the QP type):
//   kWrite, kWriteImm, kRead   wr.rdma
//   kCmpSwap, kFetchAdd        wr.atomic
//   kAtomicWrite               wr.atomic_write
//   kSend, kSendImm on UD      wr.ud
//   kBindMw                    wr.bind
//   kSendInv, kLocalInv        none (invalidate_rkey, in the header)
// The provider fills them through queue/wqe_encode.h. A layout change that
// keeps the size must change ctl::AbiHash (src/ctl/protocol.cc), which
// hashes sizes and a few offsets, or droced and a client of another build
// would accept each other and read each other's WQEs wrong.
struct SendWqe {
  uint64_t wr_id;
  WqeOp op;
  uint8_t flags;             // WqeFlags
  uint16_t num_sge;
  uint32_t inline_len;
  uint32_t imm_data;         // kSendImm, kWriteImm: network byte order, as in ibv_send_wr
  uint32_t invalidate_rkey;  // kSendInv: the peer's rkey to invalidate (IETH); kLocalInv: ours
  // DROCE_LATENCY: when the provider's post began (lab::StampNow ticks, 0:
  // not stamped); the engine records post to completion entered and hands
  // it back in the completion's src_qp (Cqe).
  uint32_t post_stamp;
  // XRC initiator (IBV_QPT_XRC_SEND), every op: the remote SRQ number
  // (XRCETH, 24 bits). Not in `wr`: it goes with RDMA and atomic requests
  // too (rdma-core keeps it out of ibv_send_wr's `wr` union as well).
  uint32_t xrc_remote_srqn;
  union Wr {
    struct Rdma {
      uint64_t remote_addr;
      uint32_t rkey;
      uint32_t reserved;
    } rdma;
    struct Atomic {
      uint64_t remote_addr;
      uint64_t compare_add;  // kCmpSwap: compare; kFetchAdd: the addend
      uint64_t swap;         // kCmpSwap
      uint32_t rkey;
      uint32_t reserved;
    } atomic;
    // IBV_WR_ATOMIC_WRITE: the 8 bytes travel in the WQE, copied at post
    // time as inline data is (rxe does too); no SGE follows.
    struct AtomicWrite {
      uint64_t remote_addr;
      uint32_t rkey;
      uint32_t reserved;
      uint8_t data[8];  // in memory order
    } atomic_write;
    struct Ud {
      uint32_t remote_qpn;
      uint32_t remote_qkey;  // high bit set: the QP's own Q_Key (IBA 10.2.5)
      uint32_t ah;           // address handle id
    } ud;
    // A memory-window bind: `length` 0 unbinds (type 1 only).
    struct Bind {
      uint64_t addr;
      uint64_t length;
      uint32_t mw_rkey;  // the window's new rkey
      uint32_t mr_lkey;  // the MR it is bound to (0 unbinding)
      uint32_t access;   // ibv_access_flags
      uint8_t type;      // IBV_MW_TYPE_1 or IBV_MW_TYPE_2
      uint8_t reserved[3];
    } bind;
  } wr;
};
static_assert(sizeof(SendWqe) == 64);
static_assert(offsetof(SendWqe, wr) == 32);
static_assert(sizeof(SendWqe::Wr) == 32);
static_assert(sizeof(SendWqe::Wr::Rdma) == 16);
static_assert(sizeof(SendWqe::Wr::Atomic) == 32);
static_assert(sizeof(SendWqe::Wr::AtomicWrite) == 24);
static_assert(sizeof(SendWqe::Wr::Ud) == 12);
static_assert(sizeof(SendWqe::Wr::Bind) == 32);
static_assert(std::is_standard_layout_v<SendWqe>);
static_assert(std::is_trivially_copyable_v<SendWqe>);

// 16-byte header, followed by num_sge Sge entries.
struct RecvWqe {
  uint64_t wr_id;
  uint32_t num_sge;
  uint32_t reserved;
};
static_assert(sizeof(RecvWqe) == 16);

// Completion status and opcode use libibverbs' numeric values
// (enum ibv_wc_status, enum ibv_wc_opcode, IBV_WC_* flags), which are part of
// the stable verbs ABI; the engine does not include verbs.h.
struct Cqe {
  uint64_t wr_id;
  uint32_t byte_len;
  uint32_t imm_data;  // network byte order (or the invalidated rkey)
  uint32_t qp_num;
  // Receive completions: the source QP (UD). Successful send completions:
  // the WQE's post stamp (SendWqe::post_stamp, DROCE_LATENCY), which the
  // provider consumes and reports as 0.
  uint32_t src_qp;
  uint32_t wc_flags;
  uint8_t status;
  uint8_t opcode;
  uint8_t sl;
  uint8_t dlid_path_bits;
  uint16_t slid;
  uint16_t pkey_index;
  uint32_t vendor_err;
  uint64_t timestamp_ns;  // when the engine entered it (CLOCK_MONOTONIC)
};
static_assert(sizeof(Cqe) == 48);

// Values from enum ibv_wc_status / ibv_wc_opcode / ibv_wc_flags.
namespace wc {
inline constexpr uint8_t kSuccess = 0;
inline constexpr uint8_t kLocLenErr = 1;
inline constexpr uint8_t kLocQpOpErr = 2;
inline constexpr uint8_t kLocProtErr = 4;
inline constexpr uint8_t kMwBindErr = 6;
inline constexpr uint8_t kWrFlushErr = 5;
inline constexpr uint8_t kBadRespErr = 7;
inline constexpr uint8_t kLocAccessErr = 8;
inline constexpr uint8_t kRemInvReqErr = 9;
inline constexpr uint8_t kRemAccessErr = 10;
inline constexpr uint8_t kRemOpErr = 11;
inline constexpr uint8_t kRetryExcErr = 12;
inline constexpr uint8_t kRnrRetryExcErr = 13;
inline constexpr uint8_t kFatalErr = 19;
inline constexpr uint8_t kGeneralErr = 21;

inline constexpr uint8_t kOpSend = 0;
inline constexpr uint8_t kOpRdmaWrite = 1;
inline constexpr uint8_t kOpRdmaRead = 2;
inline constexpr uint8_t kOpCompSwap = 3;
inline constexpr uint8_t kOpFetchAdd = 4;
inline constexpr uint8_t kOpBindMw = 5;
inline constexpr uint8_t kOpLocalInv = 6;
inline constexpr uint8_t kOpAtomicWrite = 9;  // IBV_WC_ATOMIC_WRITE
inline constexpr uint8_t kOpRecv = 128;
inline constexpr uint8_t kOpRecvRdmaWithImm = 129;

inline constexpr uint32_t kFlagGrh = 1 << 0;
inline constexpr uint32_t kFlagWithImm = 1 << 1;
inline constexpr uint32_t kFlagWithInv = 1 << 3;
}  // namespace wc

}  // namespace droce::queue
