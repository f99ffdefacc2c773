// The verbs fast path: post_send / post_recv write WQEs into the shared rings
// and ring one doorbell per call; poll_cq reads CQEs without a system call.
#include <sched.h>
#include <time.h>

#include <cerrno>
#include <cstring>

#include "droce/droce.h"
#include "engine/config.h"
#include "provider.h"
#include "queue/wqe_encode.h"

namespace droce::provider {
namespace {

// DROCE_POLL_YIELD: after this many empty ibv_poll_cq calls in a row a
// polling thread yields its CPU once (0: never), so that a busy-polling
// application and droce's worker can share a core. See docs/CONFIG.md.
unsigned empty_polls_before_yield() {
  // Parsed with every other setting: a bad value already failed opening the
  // device, so a CQ to poll means it parsed.
  static const unsigned n = [] {
    const auto cfg = engine::ConfigFromEnv(0);
    return cfg.ok() ? cfg->poll_yield : config::GlobalSettings{}.poll_yield;
  }();
  return n;
}

// DROCE_LATENCY: each send WQE carries post_stamp() (SendWqe::post_stamp)
// (poll_latency.h); the engine records post to completion entered
// (common/histogram.h) and hands the stamp back in the send completion's
// src_qp, from which the polling thread records post to poll.
bool is_send_completion(const queue::Cqe& c) { return c.opcode < queue::wc::kOpRecv; }

// Which opcodes each QP type accepts (IBA table 74 / ibv_post_send(3)). An
// XRC initiator takes RC's but ATOMIC WRITE (RC and RD only in IBA 1.5); an
// XRC target has no send queue.
bool map_send_op(ibv_qp_type type, ibv_wr_opcode op, queue::WqeOp* out) {
  if (type == IBV_QPT_XRC_RECV) return false;
  const bool rc = type == IBV_QPT_RC || type == IBV_QPT_XRC_SEND;
  switch (op) {
    case IBV_WR_SEND: *out = queue::WqeOp::kSend; return true;
    case IBV_WR_SEND_WITH_IMM: *out = queue::WqeOp::kSendImm; return true;
    case IBV_WR_RDMA_WRITE: *out = queue::WqeOp::kWrite; return type != IBV_QPT_UD;
    case IBV_WR_RDMA_WRITE_WITH_IMM: *out = queue::WqeOp::kWriteImm; return type != IBV_QPT_UD;
    case IBV_WR_SEND_WITH_INV: *out = queue::WqeOp::kSendInv; return rc;
    case IBV_WR_RDMA_READ: *out = queue::WqeOp::kRead; return rc;
    case IBV_WR_ATOMIC_CMP_AND_SWP: *out = queue::WqeOp::kCmpSwap; return rc;
    case IBV_WR_ATOMIC_FETCH_AND_ADD: *out = queue::WqeOp::kFetchAdd; return rc;
    case IBV_WR_BIND_MW: *out = queue::WqeOp::kBindMw; return type != IBV_QPT_UD;
    case IBV_WR_LOCAL_INV: *out = queue::WqeOp::kLocalInv; return type != IBV_QPT_UD;
    case IBV_WR_ATOMIC_WRITE: *out = queue::WqeOp::kAtomicWrite; return type == IBV_QPT_RC;
    default: return false;  // TSO, driver opcodes
  }
}

uint8_t map_send_flags(unsigned flags) {
  uint8_t f = 0;
  if (flags & IBV_SEND_SIGNALED) f |= queue::kWqeSignaled;
  if (flags & IBV_SEND_SOLICITED) f |= queue::kWqeSolicited;
  if (flags & IBV_SEND_INLINE) f |= queue::kWqeInline;
  if (flags & IBV_SEND_FENCE) f |= queue::kWqeFence;
  return f;
}

bool sq_full(Qp* q) { return q->sq_prod - q->handle.sq.load_cons_acquire() >= q->handle.sq.size(); }

// Tells the QP's worker that its rings changed and has it run now.
void ring_doorbell(Qp* q) {
  engine::Session* eng = to_ctx(q->qpx.qp_base.context)->s->engine.get();
  eng->Doorbell(q->handle, /*wake=*/false);
  eng->Kick(q->handle);  // send now on this thread rather than wake the worker
}

}  // namespace

ibv_qp_state engine_state(const Qp* q) {
  return static_cast<ibv_qp_state>(q->handle.shared->state.load(std::memory_order_acquire));
}

// The one rule for "may work be posted now", for every posting verb
// (ibv_post_send, ibv_wr_start, ibv_bind_mw, ibv_post_recv). It reads the
// state the engine publishes, not ibqp->state, which only ibv_modify_qp and
// ibv_query_qp update while the engine moves a QP to ERR by itself.
// Send queue: RTS, SQD (held until RTS), SQE and ERR (flushed) — IBA
// 11.4.1.1; earlier states are an immediate error, as rxe's `state < RTS`
// check. Receive queue: any state but RESET (IBA 11.4.1.2), never on a QP
// that uses an SRQ. EIO on either when no engine will flush the work any
// more (droced stopped or vanished: every QP is in ERR then, so the
// question is asked only in ERR), as on an RNIC being reset.
int post_allowed(const Qp* q, WorkQueue wq) {
  const ibv_qp_state s = engine_state(q);
  if (s == IBV_QPS_ERR && to_ctx(q->qpx.qp_base.context)->s->engine->engine_gone()) [[unlikely]] {
    return EIO;
  }
  if (wq == WorkQueue::kSend) {
    return s == IBV_QPS_RTS || s == IBV_QPS_SQD || s == IBV_QPS_SQE || s == IBV_QPS_ERR ? 0 : EINVAL;
  }
  // XRC QPs have no receive queue (a target's receives are its SRQs').
  const ibv_qp_type t = q->qpx.qp_base.qp_type;
  if (t == IBV_QPT_XRC_SEND || t == IBV_QPT_XRC_RECV) return EINVAL;
  return s != IBV_QPS_RESET && q->qpx.qp_base.srq == nullptr ? 0 : EINVAL;
}

int poll_cq(ibv_cq* ibcq, int n, ibv_wc* wc) {
  if (ibcq == nullptr || n < 0 || (n > 0 && wc == nullptr)) return -EINVAL;
  Cq* cq = to_cq(ibcq);
  queue::Cqe cqes[16];
  int got = 0;
  PollLatency::Sample stamped[64];  // DROCE_LATENCY: recorded as the poll returns
  int nstamped = 0;
  for (int attempt = 0; attempt < 2 && got == 0; ++attempt) {
    // Nothing yet: advance the engine on this thread (application-driven
    // progress), then look again.
    if (attempt == 1 && !to_ctx(ibcq->context)->s->engine->TryDrive()) break;
    std::lock_guard<std::mutex> l(cq->poll_mu);
    while (got < n) {
      const int want = std::min(n - got, 16);
      const int k = cq->consumer->Poll(cqes, want);
      if (nstamped + k > 64) [[unlikely]] {
        to_ctx(ibcq->context)->s->latency.Record(stamped, nstamped, PollLatency::Now());
        nstamped = 0;
      }
      for (int i = 0; i < k; ++i) {
        const queue::Cqe& c = cqes[i];
        ibv_wc& w = wc[got + i];
        if (is_send_completion(c)) {
          if (c.src_qp != 0 && c.status == queue::wc::kSuccess && latency_on()) [[unlikely]] {
            stamped[nstamped++] = {c.qp_num, c.opcode, c.src_qp};
          }
          w.src_qp = 0;
        } else {
          w.src_qp = c.src_qp;
        }
        w.wr_id = c.wr_id;
        w.status = static_cast<ibv_wc_status>(c.status);
        w.opcode = static_cast<ibv_wc_opcode>(c.opcode);
        w.vendor_err = c.vendor_err;
        w.byte_len = c.byte_len;
        w.imm_data = c.imm_data;
        w.qp_num = c.qp_num;
        w.wc_flags = c.wc_flags;
        w.pkey_index = c.pkey_index;
        w.slid = c.slid;
        w.sl = c.sl;
        w.dlid_path_bits = c.dlid_path_bits;
      }
      got += k;
      if (k < want) break;
    }
  }
  if (nstamped != 0) [[unlikely]] to_ctx(ibcq->context)->s->latency.Record(stamped, nstamped, PollLatency::Now());
  // A poll that found completions did not drive: it still counts as busy
  // polling, and sends the posts left for this thread's polls (Kick), one
  // turn for all of them.
  if (got > 0) to_ctx(ibcq->context)->s->engine->CompletionsPolled();
  if (got == 0) {
    static thread_local unsigned empty = 0;
    const unsigned limit = empty_polls_before_yield();
    if (limit != 0 && ++empty >= limit) {
      empty = 0;
      to_ctx(ibcq->context)->s->engine->NoteYield();
      sched_yield();
    }
  }
  return got;
}

int req_notify_cq(ibv_cq* ibcq, int solicited_only) {
  if (ibcq == nullptr) return EINVAL;
  to_cq(ibcq)->consumer->Arm(solicited_only ? cq::kArmSolicited : cq::kArmNextComp);
  return 0;
}

namespace {

// Shared by ibv_post_send and ibv_wr_*: what each takes from its verbs
// arguments for the families that need more than a copy (queue/wqe_encode.h
// lays the WQE out).

// A bind of `mw` to `rkey` as `bi` asks is well formed. A type 2 window
// needs an MR and a length (it is unbound by invalidation); a type 1 window
// is unbound by a bind without an MR. `type1`: the request comes from
// ibv_bind_mw, the only way a type 1 window is bound (ibv_post_send and
// ibv_wr_bind_mw bind type 2 windows only).
bool bind_valid(const ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* bi, bool type1) {
  return mw != nullptr && bi != nullptr && mw->type == (type1 ? IBV_MW_TYPE_1 : IBV_MW_TYPE_2) &&
         (rkey >> 8) == (mw->rkey >> 8) && (type1 || (bi->mr != nullptr && bi->length != 0));
}

void encode_bind(queue::SendWqe* w, const ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info& bi) {
  queue::EncodeBind(w, rkey, static_cast<uint8_t>(mw->type), bi.addr, bi.mr != nullptr ? bi.length : 0,
                    bi.mr != nullptr ? bi.mr->lkey : 0, bi.mw_access_flags);
}

void encode_ud(queue::SendWqe* w, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  queue::EncodeUd(w, reinterpret_cast<Ah*>(ah)->id, remote_qpn, remote_qkey);
}

}  // namespace

// Writes one send WQE at the producer index; returns 0 or an errno.
// `type1_bind`: the request comes from ibv_bind_mw (bind_valid).
static int write_send_wqe(Qp* q, const ibv_send_wr* wr, bool type1_bind) {
  const uint32_t stamp = post_stamp();  // first: the span starts where the application's post does
  queue::WqeOp op;
  const ibv_qp_type type = q->qpx.qp_base.qp_type;
  if (!map_send_op(type, wr->opcode, &op)) return EINVAL;
  if (type == IBV_QPT_UD && wr->wr.ud.ah == nullptr) return EINVAL;
  if (wr->num_sge < 0) return EINVAL;
  const bool inl = (wr->send_flags & IBV_SEND_INLINE) != 0;
  if (!inl && static_cast<uint32_t>(wr->num_sge) > q->max_send_sge) return EINVAL;
  if (sq_full(q)) return ENOMEM;
  uint8_t* slot = q->handle.sq.slot(q->sq_prod);
  queue::SendWqe w = queue::SendWqeHeader(wr->wr_id, op, map_send_flags(wr->send_flags), wr->imm_data, stamp);
  // The XRC SRQ behind the peer that this request is for (XRCETH).
  if (type == IBV_QPT_XRC_SEND) w.xrc_remote_srqn = wr->qp_type.xrc.remote_srqn;
  switch (op) {
    case queue::WqeOp::kSendInv:
    case queue::WqeOp::kLocalInv:
      w.invalidate_rkey = wr->invalidate_rkey;
      break;
    case queue::WqeOp::kBindMw:
      if (!bind_valid(wr->bind_mw.mw, wr->bind_mw.rkey, &wr->bind_mw.bind_info, type1_bind)) return EINVAL;
      encode_bind(&w, wr->bind_mw.mw, wr->bind_mw.rkey, wr->bind_mw.bind_info);
      break;
    case queue::WqeOp::kWrite:
    case queue::WqeOp::kWriteImm:
    case queue::WqeOp::kRead:
      queue::EncodeRdma(&w, wr->wr.rdma.remote_addr, wr->wr.rdma.rkey);
      break;
    case queue::WqeOp::kCmpSwap:
    case queue::WqeOp::kFetchAdd:
      queue::EncodeAtomic(&w, wr->wr.atomic.remote_addr, wr->wr.atomic.rkey, wr->wr.atomic.compare_add,
                          wr->wr.atomic.swap);
      break;
    case queue::WqeOp::kAtomicWrite:
      // The 8 bytes (one 8-byte SGE, or inline) are read now, as inline
      // data is (rxe also takes them at post time).
      if (wr->num_sge != 1 || wr->sg_list == nullptr || wr->sg_list[0].length != 8) return EINVAL;
      queue::EncodeAtomicWrite(&w, wr->wr.rdma.remote_addr, wr->wr.rdma.rkey,
                               reinterpret_cast<const void*>(wr->sg_list[0].addr));
      break;
    case queue::WqeOp::kSend:
    case queue::WqeOp::kSendImm:
      if (type == IBV_QPT_UD) encode_ud(&w, wr->wr.ud.ah, wr->wr.ud.remote_qpn, wr->wr.ud.remote_qkey);
      break;
  }
  // Binds and local invalidations carry no data; an ATOMIC WRITE's is in
  // the WQE already.
  if (op == queue::WqeOp::kBindMw || op == queue::WqeOp::kLocalInv || op == queue::WqeOp::kAtomicWrite) {
    w.num_sge = 0;
    std::memcpy(slot, &w, sizeof(w));
    ++q->sq_prod;
    return 0;
  }
  if (inl && (op == queue::WqeOp::kRead || op == queue::WqeOp::kCmpSwap || op == queue::WqeOp::kFetchAdd)) {
    return EINVAL;  // inline data is for data the requester sends
  }
  if (inl) {
    // Inline data is copied now; the application may reuse its buffers as
    // soon as ibv_post_send returns.
    size_t total = 0;
    for (int i = 0; i < wr->num_sge; ++i) total += wr->sg_list[i].length;
    if (total > q->max_inline) return EINVAL;
    uint8_t* dst = slot + sizeof(queue::SendWqe);
    for (int i = 0; i < wr->num_sge; ++i) {
      std::memcpy(dst, reinterpret_cast<const void*>(wr->sg_list[i].addr), wr->sg_list[i].length);
      dst += wr->sg_list[i].length;
    }
    w.inline_len = static_cast<uint32_t>(total);
    w.num_sge = 0;
  } else {
    w.num_sge = static_cast<uint16_t>(wr->num_sge);
    auto* sges = reinterpret_cast<queue::Sge*>(slot + sizeof(queue::SendWqe));
    for (int i = 0; i < wr->num_sge; ++i) {
      queue::Sge s{wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
      std::memcpy(&sges[i], &s, sizeof(s));
    }
  }
  std::memcpy(slot, &w, sizeof(w));
  ++q->sq_prod;
  return 0;
}

// The one path onto the send queue (ibv_post_send, ibv_bind_mw).
static int post_send_wrs(Qp* q, const ibv_send_wr* wr, ibv_send_wr** bad, bool type1_bind) {
  int rc = 0;
  {
    std::lock_guard<std::mutex> l(q->sq_mu);
    if ((rc = post_allowed(q, WorkQueue::kSend)) != 0) {
      if (bad) *bad = const_cast<ibv_send_wr*>(wr);
      return rc;
    }
    const uint32_t start = q->sq_prod;
    for (; wr != nullptr; wr = wr->next) {
      if ((rc = write_send_wqe(q, wr, type1_bind)) != 0) {
        if (bad) *bad = const_cast<ibv_send_wr*>(wr);
        break;
      }
    }
    // One release store publishes the whole list (ring.h P1), then one doorbell.
    if (q->sq_prod != start) q->handle.sq.publish_prod(q->sq_prod);
    else return rc;
  }
  ring_doorbell(q);  // in ERR the engine flushes what was posted
  return rc;
}

int post_send(ibv_qp* ibqp, ibv_send_wr* wr, ibv_send_wr** bad) {
  if (ibqp == nullptr) return EINVAL;
  return post_send_wrs(to_qp(ibqp), wr, bad, /*type1_bind=*/false);
}

int post_recv(ibv_qp* ibqp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  if (ibqp == nullptr) return EINVAL;
  Qp* q = to_qp(ibqp);
  int rc = 0;
  {
    std::lock_guard<std::mutex> l(q->rq_mu);
    if ((rc = post_allowed(q, WorkQueue::kRecv)) != 0) {
      if (bad) *bad = wr;
      return rc;
    }
    const uint32_t start = q->rq_prod;
    queue::Ring& rq = q->handle.rq;
    for (; wr != nullptr; wr = wr->next) {
      if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > q->max_recv_sge) {
        rc = EINVAL;
      } else if (q->rq_prod - rq.load_cons_acquire() >= rq.size()) {
        rc = ENOMEM;
      }
      if (rc != 0) {
        if (bad) *bad = wr;
        break;
      }
      uint8_t* slot = rq.slot(q->rq_prod);
      queue::RecvWqe w{wr->wr_id, static_cast<uint32_t>(wr->num_sge), 0};
      std::memcpy(slot, &w, sizeof(w));
      auto* sges = reinterpret_cast<queue::Sge*>(slot + sizeof(queue::RecvWqe));
      for (int i = 0; i < wr->num_sge; ++i) {
        queue::Sge s{wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
        std::memcpy(&sges[i], &s, sizeof(s));
      }
      ++q->rq_prod;
    }
    if (q->rq_prod != start) rq.publish_prod(q->rq_prod);
    else return rc;
  }
  // The responder reads the RQ when a request arrives: no doorbell (and no
  // wakeup) is needed, except in the error state, where new receive WQEs
  // must be flushed. P1 (with the producer store above): pairs with S1 in
  // transport::Qp::SetState — either the engine entering ERR sees these
  // WQEs and flushes them, or we see ERR here and ring.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (engine_state(q) == IBV_QPS_ERR) ring_doorbell(q);
  return rc;
}

int post_srq_recv(ibv_srq* ibsrq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  if (ibsrq == nullptr) return EINVAL;
  Srq* s = to_srq(ibsrq);
  int rc = 0;
  std::lock_guard<std::mutex> l(s->mu);
  queue::Ring& ring = s->handle.ring;
  const uint32_t start = s->prod;
  for (; wr != nullptr; wr = wr->next) {
    if (wr->num_sge < 0 || static_cast<uint32_t>(wr->num_sge) > s->handle.max_sge) rc = EINVAL;
    else if (s->prod - ring.load_cons_acquire() >= ring.size()) rc = ENOMEM;
    if (rc != 0) {
      if (bad) *bad = wr;
      break;
    }
    uint8_t* slot = ring.slot(s->prod);
    queue::RecvWqe w{wr->wr_id, static_cast<uint32_t>(wr->num_sge), 0};
    std::memcpy(slot, &w, sizeof(w));
    auto* sges = reinterpret_cast<queue::Sge*>(slot + sizeof(queue::RecvWqe));
    for (int i = 0; i < wr->num_sge; ++i) {
      queue::Sge sg{wr->sg_list[i].addr, wr->sg_list[i].length, wr->sg_list[i].lkey};
      std::memcpy(&sges[i], &sg, sizeof(sg));
    }
    ++s->prod;
  }
  // The worker reads the SRQ when a request needs a WQE; no doorbell needed.
  if (s->prod != start) ring.publish_prod(s->prod);
  return rc;
}

// ---- ibv_wr_* (extended QP API) ----
// The QP's send lock is held from wr_start to wr_complete/wr_abort, as
// rdma-core's providers do; WQEs become visible only at wr_complete.

namespace {

queue::SendWqe* cur_wqe(Qp* q) { return reinterpret_cast<queue::SendWqe*>(q->wr_cur); }

// Starts a WQE at the producer index (wr_cur); false if the batch has
// failed (then nothing was written).
bool wr_begin(ibv_qp_ex* qpx, queue::WqeOp op, uint32_t imm) {
  Qp* q = to_qp(qpx);
  if (q->wr_err) return false;
  if (sq_full(q)) {
    q->wr_err = ENOMEM;
    return false;
  }
  q->wr_cur = q->handle.sq.slot(q->sq_prod);
  const queue::SendWqe w = queue::SendWqeHeader(qpx->wr_id, op, map_send_flags(qpx->wr_flags), imm, post_stamp());
  std::memcpy(q->wr_cur, &w, sizeof(w));
  ++q->sq_prod;
  return true;
}

void wr_start(ibv_qp_ex* qpx) {
  Qp* q = to_qp(qpx);
  q->sq_mu.lock();
  q->wr_start_prod = q->sq_prod;
  q->wr_cur = nullptr;
  q->wr_err = post_allowed(q, WorkQueue::kSend);
}

int wr_complete(ibv_qp_ex* qpx) {
  Qp* q = to_qp(qpx);
  const int err = q->wr_err;
  bool ring = false;
  if (err != 0) {
    q->sq_prod = q->wr_start_prod;  // nothing of the batch is posted
  } else if (q->sq_prod != q->wr_start_prod) {
    q->handle.sq.publish_prod(q->sq_prod);
    ring = true;
  }
  q->wr_cur = nullptr;
  q->sq_mu.unlock();
  if (ring) {
    ring_doorbell(q);
  }
  return err;
}

void wr_abort(ibv_qp_ex* qpx) {
  Qp* q = to_qp(qpx);
  q->sq_prod = q->wr_start_prod;
  q->wr_cur = nullptr;
  q->sq_mu.unlock();
}

void wr_send(ibv_qp_ex* qpx) { wr_begin(qpx, queue::WqeOp::kSend, 0); }
void wr_send_imm(ibv_qp_ex* qpx, __be32 imm) { wr_begin(qpx, queue::WqeOp::kSendImm, imm); }

void wr_set_sge_list(ibv_qp_ex* qpx, size_t n, const ibv_sge* list) {
  Qp* q = to_qp(qpx);
  if (q->wr_err || q->wr_cur == nullptr) {
    if (!q->wr_err) q->wr_err = EINVAL;
    return;
  }
  if (n > q->max_send_sge) {
    q->wr_err = EINVAL;
    return;
  }
  queue::SendWqe* w = cur_wqe(q);
  auto* sges = reinterpret_cast<queue::Sge*>(q->wr_cur + sizeof(queue::SendWqe));
  for (size_t i = 0; i < n; ++i) {
    queue::Sge s{list[i].addr, list[i].length, list[i].lkey};
    std::memcpy(&sges[i], &s, sizeof(s));
  }
  w->num_sge = static_cast<uint16_t>(n);
  w->flags &= static_cast<uint8_t>(~queue::kWqeInline);
}

void wr_set_sge(ibv_qp_ex* qpx, uint32_t lkey, uint64_t addr, uint32_t length) {
  ibv_sge s{addr, length, lkey};
  wr_set_sge_list(qpx, 1, &s);
}

void wr_set_inline_data_list(ibv_qp_ex* qpx, size_t n, const ibv_data_buf* bufs) {
  Qp* q = to_qp(qpx);
  if (q->wr_err || q->wr_cur == nullptr) {
    if (!q->wr_err) q->wr_err = EINVAL;
    return;
  }
  size_t total = 0;
  for (size_t i = 0; i < n; ++i) total += bufs[i].length;
  if (total > q->max_inline) {
    q->wr_err = EINVAL;
    return;
  }
  uint8_t* dst = q->wr_cur + sizeof(queue::SendWqe);
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(dst, bufs[i].addr, bufs[i].length);
    dst += bufs[i].length;
  }
  queue::SendWqe* w = cur_wqe(q);
  w->inline_len = static_cast<uint32_t>(total);
  w->num_sge = 0;
  w->flags |= queue::kWqeInline;
}

void wr_set_inline_data(ibv_qp_ex* qpx, void* addr, size_t length) {
  ibv_data_buf b{addr, length};
  wr_set_inline_data_list(qpx, 1, &b);
}

// Operations this release does not implement make the batch fail with
// EOPNOTSUPP at wr_complete, instead of doing nothing silently.
void wr_unsupported(ibv_qp_ex* qpx) {
  Qp* q = to_qp(qpx);
  if (!q->wr_err) q->wr_err = EOPNOTSUPP;
}
bool wr_allowed(ibv_qp_ex* qpx, ibv_wr_opcode op) {
  queue::WqeOp unused;
  if (map_send_op(qpx->qp_base.qp_type, op, &unused)) return true;
  Qp* q = to_qp(qpx);
  if (!q->wr_err) q->wr_err = EINVAL;
  return false;
}
void wr_rdma_common(ibv_qp_ex* qpx, queue::WqeOp op, uint32_t rkey, uint64_t addr, uint32_t imm) {
  if (wr_begin(qpx, op, imm)) queue::EncodeRdma(cur_wqe(to_qp(qpx)), addr, rkey);
}
void wr_rdma_write(ibv_qp_ex* q, uint32_t rkey, uint64_t addr) {
  if (wr_allowed(q, IBV_WR_RDMA_WRITE)) wr_rdma_common(q, queue::WqeOp::kWrite, rkey, addr, 0);
}
void wr_rdma_write_imm(ibv_qp_ex* q, uint32_t rkey, uint64_t addr, __be32 imm) {
  if (wr_allowed(q, IBV_WR_RDMA_WRITE_WITH_IMM)) wr_rdma_common(q, queue::WqeOp::kWriteImm, rkey, addr, imm);
}
void wr_rdma_read(ibv_qp_ex* q, uint32_t rkey, uint64_t addr) {
  if (wr_allowed(q, IBV_WR_RDMA_READ)) wr_rdma_common(q, queue::WqeOp::kRead, rkey, addr, 0);
}
void wr_cmp_swp(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, uint64_t compare, uint64_t swap) {
  if (!wr_allowed(qpx, IBV_WR_ATOMIC_CMP_AND_SWP)) return;
  if (wr_begin(qpx, queue::WqeOp::kCmpSwap, 0)) queue::EncodeAtomic(cur_wqe(to_qp(qpx)), addr, rkey, compare, swap);
}
void wr_fetch_add(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, uint64_t add) {
  if (!wr_allowed(qpx, IBV_WR_ATOMIC_FETCH_AND_ADD)) return;
  if (wr_begin(qpx, queue::WqeOp::kFetchAdd, 0)) queue::EncodeAtomic(cur_wqe(to_qp(qpx)), addr, rkey, add, 0);
}
void wr_send_inv(ibv_qp_ex* qpx, uint32_t rkey) {
  if (!wr_allowed(qpx, IBV_WR_SEND_WITH_INV)) return;
  if (wr_begin(qpx, queue::WqeOp::kSendInv, 0)) cur_wqe(to_qp(qpx))->invalidate_rkey = rkey;
}
void wr_set_ud_addr(ibv_qp_ex* qpx, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey) {
  Qp* q = to_qp(qpx);
  if (q->wr_err) return;
  if (q->wr_cur == nullptr || ah == nullptr || qpx->qp_base.qp_type != IBV_QPT_UD) {
    q->wr_err = EINVAL;
    return;
  }
  encode_ud(cur_wqe(q), ah, remote_qpn, remote_qkey);
}
void wr_bind_mw(ibv_qp_ex* qpx, ibv_mw* mw, uint32_t rkey, const ibv_mw_bind_info* bi) {
  if (!wr_allowed(qpx, IBV_WR_BIND_MW)) return;
  Qp* q = to_qp(qpx);
  if (!bind_valid(mw, rkey, bi, /*type1=*/false)) {
    if (!q->wr_err) q->wr_err = EINVAL;
    return;
  }
  if (wr_begin(qpx, queue::WqeOp::kBindMw, 0)) encode_bind(cur_wqe(q), mw, rkey, *bi);
}
void wr_local_inv(ibv_qp_ex* qpx, uint32_t rkey) {
  if (!wr_allowed(qpx, IBV_WR_LOCAL_INV)) return;
  if (wr_begin(qpx, queue::WqeOp::kLocalInv, 0)) cur_wqe(to_qp(qpx))->invalidate_rkey = rkey;
}
void wr_send_tso(ibv_qp_ex* q, void*, uint16_t, uint16_t) { wr_unsupported(q); }
void wr_set_xrc_srqn(ibv_qp_ex* qpx, uint32_t remote_srqn) {
  Qp* q = to_qp(qpx);
  if (q->wr_cur == nullptr || qpx->qp_base.qp_type != IBV_QPT_XRC_SEND) {
    if (!q->wr_err) q->wr_err = EINVAL;
    return;
  }
  if (!q->wr_err) cur_wqe(q)->xrc_remote_srqn = remote_srqn;
}
void wr_atomic_write(ibv_qp_ex* qpx, uint32_t rkey, uint64_t addr, const void* atomic_wr) {
  if (!wr_allowed(qpx, IBV_WR_ATOMIC_WRITE)) return;
  Qp* q = to_qp(qpx);
  if (atomic_wr == nullptr) {
    if (!q->wr_err) q->wr_err = EINVAL;
    return;
  }
  if (wr_begin(qpx, queue::WqeOp::kAtomicWrite, 0)) queue::EncodeAtomicWrite(cur_wqe(q), addr, rkey, atomic_wr);
}

}  // namespace

void init_qp_ex_ops(ibv_qp_ex* x) {
  x->wr_start = wr_start;
  x->wr_complete = wr_complete;
  x->wr_abort = wr_abort;
  x->wr_send = wr_send;
  x->wr_send_imm = wr_send_imm;
  x->wr_set_sge = wr_set_sge;
  x->wr_set_sge_list = wr_set_sge_list;
  x->wr_set_inline_data = wr_set_inline_data;
  x->wr_set_inline_data_list = wr_set_inline_data_list;
  x->wr_rdma_write = wr_rdma_write;
  x->wr_rdma_write_imm = wr_rdma_write_imm;
  x->wr_rdma_read = wr_rdma_read;
  x->wr_atomic_cmp_swp = wr_cmp_swp;
  x->wr_atomic_fetch_add = wr_fetch_add;
  x->wr_bind_mw = wr_bind_mw;
  x->wr_local_inv = wr_local_inv;
  x->wr_send_inv = wr_send_inv;
  x->wr_send_tso = wr_send_tso;
  x->wr_set_ud_addr = wr_set_ud_addr;
  x->wr_set_xrc_srqn = wr_set_xrc_srqn;
  x->wr_atomic_write = wr_atomic_write;
}

// ---- extended CQ polling (ibv_start_poll / ibv_next_poll / ibv_end_poll) ----
// As in rdma-core's providers, the CQ lock is held from start_poll until
// end_poll (not for CQs created single-threaded).

namespace {

Cq* to_cqx(ibv_cq_ex* c) { return reinterpret_cast<Cq*>(c); }

bool take_one(Cq* cq) {
  if (cq->consumer->Poll(&cq->cur, 1) != 1) return false;
  if (is_send_completion(cq->cur)) {
    if (cq->cur.src_qp != 0 && cq->cur.status == queue::wc::kSuccess && latency_on()) [[unlikely]] {
      const PollLatency::Sample s{cq->cur.qp_num, cq->cur.opcode, cq->cur.src_qp};
      to_ctx(cq->cqx.context)->s->latency.Record(&s, 1, PollLatency::Now());
    }
    cq->cur.src_qp = 0;
  }
  cq->cqx.status = static_cast<ibv_wc_status>(cq->cur.status);
  cq->cqx.wr_id = cq->cur.wr_id;
  return true;
}

int cqx_start_poll(ibv_cq_ex* c, ibv_poll_cq_attr* attr) {
  if (attr == nullptr || attr->comp_mask != 0) return EINVAL;
  Cq* cq = to_cqx(c);
  if (!cq->single_threaded) cq->poll_mu.lock();
  if (take_one(cq)) return 0;
  if (to_ctx(c->context)->s->engine->TryDrive() && take_one(cq)) return 0;
  if (!cq->single_threaded) cq->poll_mu.unlock();
  return ENOENT;  // ibv_end_poll must not be called (ibv_create_cq_ex(3))
}

int cqx_next_poll(ibv_cq_ex* c) { return take_one(to_cqx(c)) ? 0 : ENOENT; }

void cqx_end_poll(ibv_cq_ex* c) {
  Cq* cq = to_cqx(c);
  if (!cq->single_threaded) cq->poll_mu.unlock();
}

ibv_wc_opcode cqx_read_opcode(ibv_cq_ex* c) { return static_cast<ibv_wc_opcode>(to_cqx(c)->cur.opcode); }
uint32_t cqx_read_vendor_err(ibv_cq_ex* c) { return to_cqx(c)->cur.vendor_err; }
uint32_t cqx_read_byte_len(ibv_cq_ex* c) { return to_cqx(c)->cur.byte_len; }
__be32 cqx_read_imm_data(ibv_cq_ex* c) { return to_cqx(c)->cur.imm_data; }
uint32_t cqx_read_qp_num(ibv_cq_ex* c) { return to_cqx(c)->cur.qp_num; }
uint32_t cqx_read_src_qp(ibv_cq_ex* c) { return to_cqx(c)->cur.src_qp; }
unsigned int cqx_read_wc_flags(ibv_cq_ex* c) { return to_cqx(c)->cur.wc_flags; }
uint32_t cqx_read_slid(ibv_cq_ex* c) { return to_cqx(c)->cur.slid; }
uint8_t cqx_read_sl(ibv_cq_ex* c) { return to_cqx(c)->cur.sl; }
uint8_t cqx_read_dlid_path_bits(ibv_cq_ex* c) { return to_cqx(c)->cur.dlid_path_bits; }
uint64_t cqx_read_completion_ts(ibv_cq_ex* c) { return to_cqx(c)->cur.timestamp_ns; }
uint64_t cqx_read_completion_wallclock_ns(ibv_cq_ex* c) {
  // The engine stamps CLOCK_MONOTONIC; convert with the current offset.
  timespec mono, real;
  clock_gettime(CLOCK_MONOTONIC, &mono);
  clock_gettime(CLOCK_REALTIME, &real);
  const int64_t offset = (int64_t{real.tv_sec} - mono.tv_sec) * 1'000'000'000 + (real.tv_nsec - mono.tv_nsec);
  return static_cast<uint64_t>(static_cast<int64_t>(to_cqx(c)->cur.timestamp_ns) + offset);
}

}  // namespace

void init_cq_ex_ops(Cq* cq) {
  ibv_cq_ex& x = cq->cqx;
  x.start_poll = cqx_start_poll;
  x.next_poll = cqx_next_poll;
  x.end_poll = cqx_end_poll;
  x.read_opcode = cqx_read_opcode;
  x.read_vendor_err = cqx_read_vendor_err;
  // Only what was asked for at creation is readable (ibv_create_cq_ex(3)).
  if (cq->wc_flags & IBV_WC_EX_WITH_BYTE_LEN) x.read_byte_len = cqx_read_byte_len;
  if (cq->wc_flags & IBV_WC_EX_WITH_IMM) x.read_imm_data = cqx_read_imm_data;
  if (cq->wc_flags & IBV_WC_EX_WITH_QP_NUM) x.read_qp_num = cqx_read_qp_num;
  if (cq->wc_flags & IBV_WC_EX_WITH_SRC_QP) x.read_src_qp = cqx_read_src_qp;
  x.read_wc_flags = cqx_read_wc_flags;
  if (cq->wc_flags & IBV_WC_EX_WITH_SLID) x.read_slid = cqx_read_slid;
  if (cq->wc_flags & IBV_WC_EX_WITH_SL) x.read_sl = cqx_read_sl;
  if (cq->wc_flags & IBV_WC_EX_WITH_DLID_PATH_BITS) x.read_dlid_path_bits = cqx_read_dlid_path_bits;
  if (cq->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) x.read_completion_ts = cqx_read_completion_ts;
  if (cq->wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK) {
    x.read_completion_wallclock_ns = cqx_read_completion_wallclock_ns;
  }
}

ibv_mw* alloc_mw(ibv_pd* pd, ibv_mw_type type) {
  if (pd == nullptr || (type != IBV_MW_TYPE_1 && type != IBV_MW_TYPE_2)) {
    errno = EINVAL;
    return nullptr;
  }
  auto rkey = to_ctx(pd->context)->s->engine->AllocMw(reinterpret_cast<Pd*>(pd)->id,
                                                       static_cast<uint8_t>(type));
  if (!rkey.ok()) {
    errno = rkey.status().code() == absl::StatusCode::kResourceExhausted ? ENOMEM : EINVAL;
    return nullptr;
  }
  auto* mw = new Mw();
  mw->mw.context = pd->context;
  mw->mw.pd = pd;
  mw->mw.rkey = *rkey;
  mw->mw.handle = *rkey >> 8;
  mw->mw.type = type;
  return &mw->mw;
}

int dealloc_mw(ibv_mw* mw) {
  if (mw == nullptr) return EINVAL;
  if (!to_ctx(mw->context)->s->engine->DeallocMw(mw->rkey).ok()) return EINVAL;
  delete reinterpret_cast<Mw*>(mw);
  return 0;
}

// ibv_bind_mw (type 1): a bind work request on the QP, posted as
// ibv_post_send posts one (rdma-core's providers do the same); the window's
// rkey changes as the verb returns (ibv_bind_mw(3)).
int bind_mw(ibv_qp* ibqp, ibv_mw* mw, ibv_mw_bind* bind) {
  if (ibqp == nullptr || mw == nullptr || bind == nullptr) return EINVAL;
  ibv_send_wr wr{};
  wr.wr_id = bind->wr_id;
  wr.opcode = IBV_WR_BIND_MW;
  wr.send_flags = bind->send_flags;
  wr.bind_mw.mw = mw;
  wr.bind_mw.rkey = ibv_inc_rkey(mw->rkey);
  wr.bind_mw.bind_info = bind->bind_info;
  ibv_send_wr* bad = nullptr;
  if (int rc = post_send_wrs(to_qp(ibqp), &wr, &bad, /*type1_bind=*/true); rc != 0) return rc;
  mw->rkey = wr.bind_mw.rkey;
  return 0;
}

}  // namespace droce::provider

extern "C" int droce_req_notify_cq(ibv_cq* cq, unsigned int flags) {
  using namespace droce;
  if (cq == nullptr || cq->context == nullptr || !provider::context_is_ours(cq->context)) {
    return -EINVAL;
  }
  const unsigned how = flags & (DROCE_CQ_SOLICITED | DROCE_CQ_NEXT_COMP);
  if ((flags & ~(DROCE_CQ_SOLICITED | DROCE_CQ_NEXT_COMP | DROCE_CQ_REPORT_MISSED_EVENTS)) ||
      (how != DROCE_CQ_SOLICITED && how != DROCE_CQ_NEXT_COMP)) {
    return -EINVAL;
  }
  const int missed = provider::to_cq(cq)->consumer->Arm(how);
  return (flags & DROCE_CQ_REPORT_MISSED_EVENTS) ? missed : 0;
}
