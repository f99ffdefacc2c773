// Requester: send WQEs → packets (IBA 9.7.1 – 9.7.4). RC keeps every WQE
// until the completer retires it; UC and UD complete a WQE once its last
// packet is on the wire.
#include <algorithm>
#include <cstring>

#include "transport/qp.h"
#include "transport/sge.h"
#include "wire/psn.h"

namespace droce::transport {
namespace {

// Ask for an ACK at least this often inside a long message.
constexpr uint32_t kAckReqEvery = 64;
// Largest message: IBA allows 2^31 bytes.
constexpr uint64_t kMaxMessage = 1ull << 31;

bool is_read(queue::WqeOp op) { return op == queue::WqeOp::kRead; }
bool is_atomic(queue::WqeOp op) { return op == queue::WqeOp::kCmpSwap || op == queue::WqeOp::kFetchAdd; }
bool is_write(queue::WqeOp op) {
  return op == queue::WqeOp::kWrite || op == queue::WqeOp::kWriteImm || op == queue::WqeOp::kAtomicWrite;
}
bool is_local(queue::WqeOp op) { return op == queue::WqeOp::kBindMw || op == queue::WqeOp::kLocalInv; }

// The opcode of packet (first, last) of a WQE on a QP whose transport's
// opcodes start at `base` (RC 0x00, UC 0x20, XRC 0xA0).
uint8_t request_opcode(uint8_t base, queue::WqeOp op, bool first, bool last) {
  using namespace wire;
  switch (op) {
    case queue::WqeOp::kSend:
      return base + (first && last ? kRcSendOnly : first ? kRcSendFirst : last ? kRcSendLast : kRcSendMiddle);
    case queue::WqeOp::kSendImm:
      return base + (first && last ? kRcSendOnlyImm : first ? kRcSendFirst : last ? kRcSendLastImm : kRcSendMiddle);
    case queue::WqeOp::kSendInv:
      return base + (first && last ? kRcSendOnlyInv : first ? kRcSendFirst : last ? kRcSendLastInv : kRcSendMiddle);
    case queue::WqeOp::kWrite:
      return base + (first && last ? kRcWriteOnly : first ? kRcWriteFirst : last ? kRcWriteLast : kRcWriteMiddle);
    case queue::WqeOp::kWriteImm:
      return base + (first && last ? kRcWriteOnlyImm : first ? kRcWriteFirst : last ? kRcWriteLastImm : kRcWriteMiddle);
    case queue::WqeOp::kRead: return base + kRcReadRequest;
    case queue::WqeOp::kCmpSwap: return base + kRcCompareSwap;
    case queue::WqeOp::kFetchAdd: return base + kRcFetchAdd;
    case queue::WqeOp::kAtomicWrite: return kRcAtomicWrite;  // RC only
    default: return 0xFF;
  }
}

}  // namespace

// Checks a snapshotted WQE against the QP type and capabilities; returns a
// completion status (kSuccess if it may be sent).
uint8_t Qp::ValidateSendWqe(SendCtx& ctx, uint32_t slot) {
  const queue::SendWqe& w = ctx.wqe;
  const uint8_t* src = sq_.slot(sq_fetched_);
  bool op_ok = false;
  switch (type_) {
    case QpType::kRc:
      op_ok = w.op <= queue::WqeOp::kAtomicWrite;
      break;
    case QpType::kUc:
      op_ok = w.op == queue::WqeOp::kSend || w.op == queue::WqeOp::kSendImm ||
              (is_write(w.op) && w.op != queue::WqeOp::kAtomicWrite) || is_local(w.op);
      break;
    case QpType::kUd:
      op_ok = w.op == queue::WqeOp::kSend || w.op == queue::WqeOp::kSendImm;
      break;
    case QpType::kXrcIni:
      // RC's operations; ATOMIC WRITE is defined for RC (and RD) only.
      op_ok = w.op <= queue::WqeOp::kAtomicWrite && w.op != queue::WqeOp::kAtomicWrite;
      // The XRC SRQ behind the peer (XRCETH), 24 bits.
      ctx.remote_qpn = w.xrc_remote_srqn & 0xFFFFFF;
      break;
    case QpType::kXrcTgt:
      break;  // no send queue
  }
  if (!op_ok) return queue::wc::kLocQpOpErr;
  if (is_local(w.op)) {
    // Memory-window binds and local invalidation send nothing (IBA 10.6.7).
    ctx.total_len = 0;
    ctx.npkts = 0;
    ctx.resp_pkts = 0;
    ctx.issued_at_resp = false;
    ctx.done = false;
    ctx.rd_counted = false;
    return queue::wc::kSuccess;
  }
  uint64_t total = 0;
  if (w.op == queue::WqeOp::kAtomicWrite) {
    total = 8;  // its data is in the WQE (wr.atomic_write.data), never in SGEs
  } else if (w.flags & queue::kWqeInline) {
    if (is_read(w.op) || is_atomic(w.op)) return queue::wc::kLocQpOpErr;
    if (w.inline_len > caps_.max_inline) return queue::wc::kLocLenErr;
    std::memcpy(&send_inline_[size_t{slot} * caps_.max_inline], src + sizeof(queue::SendWqe), w.inline_len);
    total = w.inline_len;
  } else {
    if (w.num_sge > caps_.max_send_sge) return queue::wc::kLocLenErr;
    queue::Sge* sges = &send_sge_[size_t{slot} * caps_.max_send_sge];
    std::memcpy(sges, src + sizeof(queue::SendWqe), sizeof(queue::Sge) * w.num_sge);
    for (unsigned i = 0; i < w.num_sge; ++i) total += sges[i].length;
  }
  if (total > kMaxMessage) return queue::wc::kLocLenErr;
  // Atomics operate on exactly 8 naturally aligned bytes (IBA 9.4.5).
  if ((is_atomic(w.op) || w.op == queue::WqeOp::kAtomicWrite) && total != 8) return queue::wc::kLocLenErr;
  const uint32_t mtu = mtu_bytes(attr_.path_mtu);
  ctx.total_len = static_cast<uint32_t>(total);
  ctx.npkts = is_atomic(w.op) || total == 0 ? 1 : static_cast<uint32_t>((total + mtu - 1) / mtu);
  ctx.resp_pkts = 0;
  ctx.issued_at_resp = false;
  ctx.done = false;
  ctx.rd_counted = false;
  if (type_ == QpType::kUd) {
    const queue::SendWqe::Wr::Ud& ud = w.wr.ud;  // UD takes sends only (op_ok)
    const AddressHandle* ah = env_->FindAh(ud.ah);
    if (ah == nullptr || ah->pd != pd_) return queue::wc::kLocQpOpErr;
    if (total > mtu) return queue::wc::kLocLenErr;  // one packet per UD message
    ctx.dgid = ah->dgid;
    ctx.av = ah->av;
    // A multicast packet always carries the multicast QPN; the members'
    // QPNs are the receiving devices' business.
    ctx.remote_qpn = wire::gid_is_multicast(ah->dgid.data()) ? wire::kMulticastQpn : ud.remote_qpn & wire::kPsnMask;
    // A Q_Key with the high bit set means "use the QP's own" (IBA 10.2.5).
    ctx.remote_qkey = (ud.remote_qkey & 0x80000000u) ? attr_.qkey : ud.remote_qkey;
  }
  return queue::wc::kSuccess;
}

// Snapshots the next posted WQE into private memory and validates it.
// Returns false if there is none or it failed (it is then completed in error).
bool Qp::FetchSendWqe() {
  const uint32_t prod = sq_.load_prod_acquire();
  if (sq_fetched_ == prod) return false;
  if (RingCorrupt(sq_, prod, sq_comp_)) {
    LocalCatastrophe();
    return false;
  }
  const uint32_t slot = sq_fetched_ & (sq_.size() - 1);
  SendCtx& ctx = send_ctx_[slot];
  std::memcpy(&ctx.wqe, sq_.slot(sq_fetched_), sizeof(ctx.wqe));
  const uint8_t status = ValidateSendWqe(ctx, slot);
  if (status == queue::wc::kSuccess) {
    ++sq_fetched_;
    return true;
  }
  // A hostile or malformed WQE completes in error once every earlier WQE has
  // completed, and the QP goes to the error state (IBA 10.8.3.1).
  if (sq_comp_ == sq_fetched_ && unacked_psn_ == next_psn_) {
    Count(QpCounter::bad_wqe);
    ++sq_fetched_;
    ++sq_send_;
    ctx.npkts = 0;
    queue::Cqe c{};
    c.wr_id = ctx.wqe.wr_id;
    c.status = status;
    c.qp_num = qpn_;
    RetireSendWqe(&c);
    EnterError();
  }
  return false;
}

uint32_t Qp::Gather(const SendCtx& ctx, uint32_t slot, uint32_t offset, uint32_t len, uint8_t* dst,
                    bool* prot_err) {
  if (ctx.wqe.flags & queue::kWqeInline) {
    std::memcpy(dst, &send_inline_[size_t{slot} * caps_.max_inline + offset], len);
    return len;
  }
  const queue::Sge* sges = &send_sge_[size_t{slot} * caps_.max_send_sge];
  uint32_t copied = 0;
  const SgeResult r = WalkSges(env_->Mrs(), pd_, sges, ctx.wqe.num_sge, offset, len, 0,
                               [&](const mem::Place& p, uint32_t done, uint32_t n) {
                                 if (!mem::ReadFrom(dst + done, p, n)) return false;
                                 copied = done + n;
                                 return true;
                               });
  if (r == SgeResult::kAccess) *prot_err = true;
  return copied;
}

// The WQE at the head failed locally: complete it with `status`, error the QP.
bool Qp::FailHead(SendCtx& ctx, uint8_t status) {
  if (sq_send_ != sq_comp_) return false;  // earlier WQEs complete first
  Count(QpCounter::bad_wqe);
  queue::Cqe c{};
  c.wr_id = ctx.wqe.wr_id;
  c.status = status;
  c.qp_num = qpn_;
  RetireSendWqe(&c);
  sq_send_ = sq_comp_;
  send_pkt_ = 0;
  EnterError();
  return true;
}

bool Qp::BuildRequestPacket(SendCtx& ctx, uint32_t pkt) {
  const queue::WqeOp op = ctx.wqe.op;
  const uint32_t mtu = mtu_bytes(attr_.path_mtu);
  const bool rd = is_read(op) || is_atomic(op);
  const bool first = pkt == 0;
  const bool last = rd || pkt + 1 == ctx.npkts;
  const uint8_t opcode = type_ == QpType::kUd
                             ? static_cast<uint8_t>(op == queue::WqeOp::kSendImm ? wire::kUdSendOnlyImm : wire::kUdSendOnly)
                             : request_opcode(op_base_, op, first, last);
  const wire::OpcodeInfo& info = wire::opcode_info(opcode);
  const uint32_t offset = pkt * mtu;
  const uint32_t len = rd ? 0 : (last ? ctx.total_len - offset : mtu);
  const uint32_t pad = (4 - (len & 3)) & 3;
  const uint32_t roce_len = info.length + len + pad + wire::kIcrcLen;
  wire::Path path;
  if (type_ == QpType::kUd) {
    path = PathTo(dmac_, ctx.dgid, ctx.av);
    path.udp_sport = wire::udp_sport_for_qp(qpn_, ctx.remote_qpn);
  } else {
    path = PathTo(dmac_, dgid_, attr_.av);
  }
  MarkEct(&path);
  const uint32_t frame_len = wire::outer_len(path) + roce_len;
  TxFrame f;
  if (!env_->AllocFrame(frame_len, &f)) return false;
  const unsigned bth_off = wire::write_outer(f.data, path, roce_len, ip_id_++);
  uint8_t* bth = f.data + bth_off;
  wire::Bth b;
  b.opcode = opcode;
  b.se = last && (ctx.wqe.flags & queue::kWqeSolicited) && !rd && !is_write(op);
  if (op == queue::WqeOp::kWriteImm && last) b.se = ctx.wqe.flags & queue::kWqeSolicited;
  b.pad = static_cast<uint8_t>(pad);
  b.dqpn = type_ == QpType::kUd ? ctx.remote_qpn : attr_.dest_qpn;
  b.psn = wire::psn_add(ctx.first_psn, pkt);
  // Ask at least twice per window (selective repeat's, or go-back-N's after
  // a loss cut it), and with the packet that fills it: a window smaller than
  // a message would otherwise fill with nothing asking, and stall until the
  // local ACK timeout.
  const uint32_t window = sr_.on ? sr_.window : gbn_window_;
  const uint32_t every = std::min(kAckReqEvery, std::max(window / 2, 1u));
  b.ackreq = reliable() && !rd &&
             (last || (pkt % every) == every - 1 ||
              wire::psn_diff(wire::psn_add(b.psn, 1), unacked_psn_) >= static_cast<int32_t>(window));
  b.sr = sr_.on;  // only ever on for a reliable QP
  // With selective repeat every resend asks for an ACK: whether it filled
  // a hole or was a duplicate, the answer says where the responder is.
  if (SrActive() && !rd && wire::psn_lt(b.psn, high_psn_)) b.ackreq = true;
  if (reliable() && !rd && pacer_.on() && (attr_.timeout != 0 || SrActive())) [[unlikely]] {
    // Paced, 64 packets can take longer than the local ACK timeout (at
    // 4 Mb/s, 64 KiB is 140 ms; timeout 14 is 67 ms): ask for an ACK at
    // least every quarter of the timeout as well, or the requester would
    // time out and resend what the responder has (timeout 0 waits forever).
    // With selective repeat, at least every half of its retransmission
    // timeout too (a slowed flow would time out spuriously).
    uint64_t interval = attr_.timeout != 0 ? (4096ull << attr_.timeout) / 4 : UINT64_MAX;
    if (SrActive()) interval = std::min<uint64_t>(interval, SrRtoNs() / 2);
    if (b.ackreq || pace_now_ns_ - last_ackreq_ns_ >= interval) {
      b.ackreq = true;
      last_ackreq_ns_ = pace_now_ns_;
    }
  }
  wire::write_bth(bth, b);
  if (info.xrceth) wire::store_be32(bth + info.xrceth, ctx.remote_qpn);  // XRCETH: reserved byte, SRQ number
  if (info.reth) {
    // WRITE and READ (wr.rdma), ATOMIC WRITE (wr.atomic_write). A READ
    // resent after lost responses asks only for what is missing.
    const bool aw = op == queue::WqeOp::kAtomicWrite;
    const uint64_t va = aw ? ctx.wqe.wr.atomic_write.remote_addr : ctx.wqe.wr.rdma.remote_addr;
    const uint32_t rkey = aw ? ctx.wqe.wr.atomic_write.rkey : ctx.wqe.wr.rdma.rkey;
    wire::write_reth(bth + info.reth, {va + offset, rkey, ctx.total_len - offset});
  }
  if (info.atomic_eth) {
    const queue::SendWqe::Wr::Atomic& at = ctx.wqe.wr.atomic;
    wire::AtomicEth a;
    a.va = at.remote_addr;
    a.rkey = at.rkey;
    if (op == queue::WqeOp::kCmpSwap) {
      a.swap_add = at.swap;
      a.compare = at.compare_add;
    } else {
      a.swap_add = at.compare_add;
    }
    wire::write_atomic_eth(bth + info.atomic_eth, a);
  }
  if (info.deth) wire::write_deth(bth + info.deth, {ctx.remote_qkey, qpn_});
  if (info.immdt) std::memcpy(bth + info.immdt, &ctx.wqe.imm_data, 4);  // already big-endian
  if (info.ieth) wire::store_be32(bth + info.ieth, ctx.wqe.invalidate_rkey);
  uint8_t* payload = bth + info.payload;
  if (op == queue::WqeOp::kAtomicWrite) {
    std::memcpy(payload, ctx.wqe.wr.atomic_write.data, 8);
  } else if (len != 0) {
    bool prot_err = false;
    const uint32_t slot = static_cast<uint32_t>(&ctx - send_ctx_.data());
    Gather(ctx, slot, offset, len, payload, &prot_err);
    if (prot_err) {
      // Nothing is sent from memory the WQE may not read; the buffer goes
      // back with zero length.
      env_->SendFrame(f, 0);
      FailHead(ctx, queue::wc::kLocProtErr);
      return false;
    }
  }
  std::memset(payload + len, 0, pad);
  wire::finish_icrc(f.data, frame_len);
  Transmit(f, frame_len, b);
  if (reliable()) {
    // A PSN below the highest ever sent goes again: a retransmission.
    if (wire::psn_lt(b.psn, high_psn_)) {
      Count(QpCounter::retransmitted_pkts);
    } else if ((adp_.on || (sr_.on && sr_.rto_us == 0)) && !adp_timing_) [[unlikely]] {
      // Adaptive retransmission, and selective repeat's adaptive timeout,
      // time one packet sent once per round trip.
      adp_timing_ = true;
      adp_timed_psn_ = b.psn;
      adp_timed_ns_ = env_->TurnNs();
    }
    const uint32_t end = wire::psn_add(b.psn, rd ? ctx.npkts - pkt : 1);
    if (wire::psn_lt(high_psn_, end)) high_psn_ = end;
  }
  return true;
}

// Executes a bind or local invalidate in SQ order; it completes once every
// earlier WQE has. Returns false if the requester must stop for now.
bool Qp::ExecuteLocalOp(SendCtx& ctx) {
  const queue::SendWqe& w = ctx.wqe;
  if (w.flags & queue::kWqeFence) {
    if (sq_comp_ != sq_send_) return false;  // fence: wait for earlier WQEs
  }
  bool ok;
  uint8_t status = queue::wc::kSuccess;
  if (w.op == queue::WqeOp::kBindMw) {
    const queue::SendWqe::Wr::Bind& b = w.wr.bind;
    ok = env_->Mrs().Bind(b.mw_rkey, b.type, pd_, qpn_, b.mr_lkey, b.addr, b.length, b.access) ==
         mem::BindError::kOk;
    if (!ok) status = queue::wc::kMwBindErr;
  } else {
    ok = env_->Mrs().Invalidate(w.invalidate_rkey, pd_);
    if (!ok) status = queue::wc::kLocProtErr;
  }
  if (!ok) {
    // The failing WQE completes in error after the earlier ones.
    if (sq_send_ != sq_comp_) return false;
    FailHead(ctx, status);
    return false;
  }
  ctx.first_psn = next_psn_;
  ctx.done = true;
  ++sq_send_;
  if (!reliable() || sq_comp_ + 1 == sq_send_) {
    // Nothing before it is outstanding: complete it now.
    if (CompleteWqe(ctx, queue::wc::kSuccess)) sq_.publish_cons(sq_comp_);
  }
  return attr_.state != QpState::kErr;
}

// The next hop is not resolved yet. Work waits, but not forever: an RC QP
// whose destination stays unresolved for as long as its retries would take
// fails the oldest WQE with IBV_WC_RETRY_EXC_ERR, as if every try had been
// lost (timeout 0 means wait forever, as for ACKs).
bool Qp::WaitForNeighbor() {
  const bool has_work = sq_send_ != sq_fetched_ || sq_fetched_ != sq_.load_prod_acquire();
  if (!has_work || !reliable() || attr_.timeout == 0) return has_work;
  const uint64_t now = env_->NowNs();
  if (resolving_since_ns_ == 0) {
    resolving_since_ns_ = now;
    return true;
  }
  const uint64_t limit = (4096ull << attr_.timeout) * (uint64_t{attr_.retry_cnt} + 1);
  if (now - resolving_since_ns_ < limit) return true;
  resolving_since_ns_ = 0;
  if (sq_send_ == sq_fetched_ && !FetchSendWqe()) return false;
  if (sq_send_ == sq_comp_ && send_pkt_ == 0) {
    Count(QpCounter::retry_exceeded_err);
    FailHead(send_ctx_[sq_send_ & (sq_.size() - 1)], queue::wc::kRetryExcErr);
  }
  return false;
}

// UC and UD: a WQE is complete once its last packet is sent (IBA 9.8).
void Qp::CompleteUnreliable(SendCtx& ctx) {
  if (sq_sig_all_ || (ctx.wqe.flags & queue::kWqeSignaled)) {
    queue::Cqe c{};
    c.wr_id = ctx.wqe.wr_id;
    c.status = queue::wc::kSuccess;
    c.opcode = is_write(ctx.wqe.op) ? queue::wc::kOpRdmaWrite : queue::wc::kOpSend;
    c.byte_len = ctx.total_len;
    c.qp_num = qpn_;
    RetireSendWqe(&c);
    return;
  }
  RetireSendWqe(nullptr);
}

// Packet pacing (pacer.h): one clock reading per request when on. DCQCN
// (cc/dcqcn.h) limits through the pacer while its reaction point is active:
// its timers run here, lazily, before each request. False: not yet
// (paced_until_ns_ says when).
bool Qp::PaceReady() {
  if (!pacer_.on()) return true;
  pace_now_ns_ = env_->NowNs();
  if (rp_.active()) {
    rp_.Advance(pace_now_ns_);
    ApplyCcRate(pace_now_ns_);
  }
  if (pacer_.on() && !pacer_.Ready(pace_now_ns_, &paced_until_ns_)) {
    if (rp_.active()) paced_until_ns_ = std::min(paced_until_ns_, std::max(rp_.next_increase_ns(), pace_now_ns_ + 1));
    return false;
  }
  paced_until_ns_ = 0;
  return true;
}

// A paced request left (last_tx_len_ bytes).
void Qp::PaceSent() {
  if (!pacer_.on()) return;
  pacer_.Sent(last_tx_len_);
  if (rp_.active()) {
    rp_.OnSent(last_tx_len_, pace_now_ns_);
    ApplyCcRate(pace_now_ns_);
  }
}

bool Qp::PollSend(unsigned budget) {
  if (!pacer_.on()) [[likely]] return SendSome(budget);
  // The pacer learns whether this pass ended waiting for it or for the
  // next pass (pacer.h, catch-up): only then is the time until the next
  // pass the sender's loss.
  paced_until_ns_ = 0;
  send_budget_out_ = false;
  const bool more = SendSome(budget);
  if (pacer_.on()) pacer_.SetWaiting(paced_until_ns_ != 0 || send_budget_out_);
  return more;
}

bool Qp::SendSome(unsigned budget) {
  if (attr_.state == QpState::kErr) {
    FlushAll();
    return false;
  }
  bool more = false;
  // Responses first: they retire the peer's WQEs.
  if (resp_head_ != resp_tail_) more = SendResponses(&budget);
  if (attr_.state != QpState::kRts && attr_.state != QpState::kSqd) return more;
  // An XRC target has no send queue: whatever a (hostile) client writes
  // into its SQ ring is ignored (its send CQ is null).
  if (type_ == QpType::kXrcTgt) return more;
  if (rnr_wait_) return more;
  if (attr_.state == QpState::kSqd && send_pkt_ == 0) {
    // Drained: a partly sent message is finished, nothing new starts.
    if (sqd_notify_ && sq_comp_ == sq_send_ && unacked_psn_ == next_psn_) {
      sqd_notify_ = false;
      Raise(QpEvent::kSqDrained);
    }
    return more;
  }
  if (type_ != QpType::kUd && !mac_valid_) {
    if (!env_->ResolveMac(dgid_, &dmac_)) return WaitForNeighbor();
    mac_valid_ = true;
    resolving_since_ns_ = 0;
  }
  unsigned sent = 0;
  if (sr_recovery_ || sr_resend_head_) [[unlikely]] {
    // Selective repeat: the holes SACKs revealed go before new requests.
    if (!SrResend(budget, &sent)) return paced_until_ns_ != 0 ? more : attr_.state == QpState::kRts;
  }
  // Selective repeat caps what is in flight at its window (the responder
  // holds that many), from the first packet, before the peer has said it
  // does selective repeat too: beyond it a gap would be NAKed and go back
  // N. Go-back-N alone sends up to its window (gbn_window_, qp.h).
  const int32_t window = static_cast<int32_t>(sr_.on ? sr_.window : gbn_window_);
  while (sent < budget) {
    if (reliable() && wire::psn_diff(next_psn_, unacked_psn_) >= window) {
      return more;  // the window reopens on an ACK
    }
    if (sq_send_ == sq_fetched_) {
      if (!FetchSendWqe()) return more;
    }
    const uint32_t slot = sq_send_ & (sq_.size() - 1);
    SendCtx& ctx = send_ctx_[slot];
    const queue::WqeOp op = ctx.wqe.op;
    if (is_local(op)) {
      if (!ExecuteLocalOp(ctx)) return more;
      continue;
    }
    const bool rd = is_read(op) || is_atomic(op);
    if (send_pkt_ == 0 && reliable()) {
      // Fence (IBA 10.8.3.3): wait until every earlier WQE has completed.
      if ((ctx.wqe.flags & queue::kWqeFence) && sq_comp_ != sq_send_) return more;
      // max_rd_atomic bounds outstanding READ/atomic requests (0 acts as 1).
      if (rd && !ctx.rd_counted) {
        if (rd_atomic_inflight_ >= std::max<uint32_t>(attr_.max_rd_atomic, 1)) return more;
      }
      // Selective repeat: a READ's PSNs (one per response) stay inside the
      // window too, or requests after it would land beyond what the
      // responder can hold. A READ longer than the window goes alone.
      if (rd && sr_.on && next_psn_ != unacked_psn_ &&
          wire::psn_diff(next_psn_, unacked_psn_) + static_cast<int32_t>(ctx.npkts - ctx.resp_pkts) > window) {
        return more;
      }
    }
    if (type_ == QpType::kUd && send_pkt_ == 0) {
      // A group has no neighbour to ask: its MAC is computed from it.
      if (wire::gid_is_multicast(ctx.dgid.data())) dmac_ = wire::multicast_mac(ctx.dgid.data());
      else if (!env_->ResolveMac(ctx.dgid, &dmac_)) return true;
    }
    // The timers start with the first packet after an idle spell (not with
    // a resend after a rewind: that is no progress).
    if (send_pkt_ == 0 && next_psn_ == unacked_psn_ && sq_send_ == sq_comp_ && next_psn_ == high_psn_) {
      last_progress_ns_ = sr_timer_ns_ = env_->TurnNs();
    }
    if (send_pkt_ == 0 && ctx.resp_pkts == 0) ctx.first_psn = next_psn_;
    if (pacer_.on() && !PaceReady()) [[unlikely]] return more;
    if (!BuildRequestPacket(ctx, send_pkt_)) return attr_.state == QpState::kRts;
    if (pacer_.on()) [[unlikely]] PaceSent();
    ++sent;
    if (rd) {
      // Requests start at most at resp_pkts (every rewind names the first
      // missing response); one starting earlier does not make a FIRST
      // at resp_pkts valid.
      if (send_pkt_ == ctx.resp_pkts) ctx.issued_at_resp = true;
      if (!ctx.rd_counted) {
        ctx.rd_counted = true;
        ++rd_atomic_inflight_;
      }
      // One request occupies as many PSNs as it has response packets.
      next_psn_ = wire::psn_add(next_psn_, ctx.npkts - send_pkt_);
      send_pkt_ = 0;
      ++sq_send_;
      continue;
    }
    next_psn_ = wire::psn_add(next_psn_, 1);
    if (++send_pkt_ == ctx.npkts) {
      send_pkt_ = 0;
      ++sq_send_;
      if (!reliable()) {
        unacked_psn_ = next_psn_;
        CompleteUnreliable(ctx);
        if (attr_.state == QpState::kErr) return false;
      }
    }
  }
  send_budget_out_ = true;  // more to send, only the budget stopped it
  return true;
}

}  // namespace droce::transport
