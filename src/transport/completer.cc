// RC completer: ACKs, READ responses and atomic ACKs retire send WQEs in
// order; NAKs and timeouts rewind the requester (go-back-N, IBA 9.7.5.2, 9.9).
#include <algorithm>
#include <cstring>

#include "common/stamp_clock.h"
#include "transport/qp.h"
#include "transport/sge.h"
#include "wire/psn.h"

namespace droce::transport {
namespace {

bool needs_response(queue::WqeOp op) {
  return op == queue::WqeOp::kRead || op == queue::WqeOp::kCmpSwap || op == queue::WqeOp::kFetchAdd;
}

uint8_t wc_opcode(queue::WqeOp op) {
  switch (op) {
    case queue::WqeOp::kWrite:
    case queue::WqeOp::kWriteImm: return queue::wc::kOpRdmaWrite;
    case queue::WqeOp::kRead: return queue::wc::kOpRdmaRead;
    case queue::WqeOp::kCmpSwap: return queue::wc::kOpCompSwap;
    case queue::WqeOp::kFetchAdd: return queue::wc::kOpFetchAdd;
    case queue::WqeOp::kAtomicWrite: return queue::wc::kOpAtomicWrite;
    case queue::WqeOp::kBindMw: return queue::wc::kOpBindMw;
    case queue::WqeOp::kLocalInv: return queue::wc::kOpLocalInv;
    default: return queue::wc::kOpSend;
  }
}

}  // namespace

// Retires the head WQE with `status`; false if its completion could not be
// entered (the QP is then in error).
// The provider stamped the WQE at post time (DROCE_LATENCY, common/stamp_clock.h;
// 0: not stamped): post to completion entered.
void Qp::RecordLatency(const SendCtx& ctx) {
  const uint32_t posted = ctx.wqe.post_stamp;
  if (posted == 0) return;
  const uint64_t ns = lab::StampSpanNs(posted, lab::StampNow());
  const queue::WqeOp op = ctx.wqe.op;
  const int c = op == queue::WqeOp::kRead                                       ? kLatRead
                : op == queue::WqeOp::kCmpSwap || op == queue::WqeOp::kFetchAdd ? kLatAtomic
                : op == queue::WqeOp::kWrite || op == queue::WqeOp::kWriteImm ||
                        op == queue::WqeOp::kAtomicWrite
                    ? kLatWrite
                    : kLatSend;
  if (latency_[c] == nullptr) {
    latency_[c] = std::make_unique<lab::LatencyHistogram>();
    latency_pub_[c].store(latency_[c].get(), std::memory_order_release);
  }
  latency_[c]->Record(ns);
}

bool Qp::CompleteWqe(SendCtx& ctx, uint8_t status) {
  if (ctx.rd_counted) {
    ctx.rd_counted = false;
    --rd_atomic_inflight_;
  }
  if (measure_latency_ && status == queue::wc::kSuccess) RecordLatency(ctx);
  if (status != queue::wc::kSuccess || sq_sig_all_ || (ctx.wqe.flags & queue::kWqeSignaled)) {
    queue::Cqe c{};
    c.wr_id = ctx.wqe.wr_id;
    c.status = status;
    c.opcode = wc_opcode(ctx.wqe.op);
    c.byte_len = ctx.total_len;
    c.qp_num = qpn_;
    // The provider's post stamp back to the polling thread (its post-to-poll
    // latency, providers/poll_latency.h); verbs reads src_qp for UD
    // receive completions only.
    if (status == queue::wc::kSuccess) c.src_qp = ctx.wqe.post_stamp;
    return RetireSendWqe(&c);
  }
  return RetireSendWqe(nullptr);
}

// Completes, in order, every sent WQE whose last PSN is before `psn`. A READ
// or atomic completes only with its response; an ACK beyond one whose
// response never came means the response was lost: resend it.
void Qp::CompleteUpTo(uint32_t psn) {
  const uint32_t before = sq_comp_;
  while (sq_comp_ != sq_send_) {
    SendCtx& ctx = send_ctx_[sq_comp_ & (sq_.size() - 1)];
    if (ctx.npkts == 0) {
      // An executed bind/invalidate: complete once everything before it has.
      if (!CompleteWqe(ctx, queue::wc::kSuccess)) return;
      continue;
    }
    const uint32_t last_psn = wire::psn_add(ctx.first_psn, ctx.npkts - 1);
    if (!wire::psn_lt(last_psn, psn)) break;
    if (needs_response(ctx.wqe.op) && !ctx.done) {
      const uint32_t missing = wire::psn_add(ctx.first_psn, ctx.resp_pkts);
      // Once per gap with selective repeat (later ACKs say the same);
      // go-back-N's rewind makes later ACKs stale by itself.
      if (wire::psn_lt(missing, psn) && (!SrActive() || last_read_goback_psn_ != missing)) {
        if (SrActive()) last_read_goback_psn_ = missing;
        ReadLost(missing);
      }
      break;
    }
    if (!CompleteWqe(ctx, queue::wc::kSuccess)) return;
  }
  if (sq_comp_ != before) sq_.publish_cons(sq_comp_);
}

void Qp::CompleteHeadWithError(uint8_t status) {
  if (sq_comp_ != sq_send_ || send_pkt_ != 0) {
    SendCtx& ctx = send_ctx_[sq_comp_ & (sq_.size() - 1)];
    const bool was_sending = sq_send_ == sq_comp_;
    if (CompleteWqe(ctx, status)) {
      if (was_sending) {
        sq_send_ = sq_comp_;
        send_pkt_ = 0;
      }
      sq_.publish_cons(sq_comp_);
    }
  }
  EnterError();
}

// Everything before `next` is acknowledged: retire what that completes and
// move the window. A READ or atomic still waiting for its response stays
// unacknowledged from its first missing response on, whatever later ACKs
// say.
void Qp::AckUpTo(uint32_t next) {
  // Beyond what was sent again since a rewind, within what was ever sent:
  // the responder had the first transmission (a peer that stopped for
  // longer than the ACK timeout acknowledges its backlog when it runs
  // again).
  if (wire::psn_lt(next_psn_, next) && !wire::psn_lt(high_psn_, next)) SkipAckedTo(next);
  CompleteUpTo(next);
  if (sq_comp_ != sq_send_ || send_pkt_ != 0) {
    const SendCtx& head = send_ctx_[sq_comp_ & (sq_.size() - 1)];
    if (needs_response(head.wqe.op) && !head.done) {
      const uint32_t missing = wire::psn_add(head.first_psn, head.resp_pkts);
      if (wire::psn_lt(missing, next)) next = missing;
    }
  }
  const uint64_t now = env_->TurnNs();
  if (wire::psn_lt(unacked_psn_, next) && !wire::psn_lt(next_psn_, next)) AdvanceUnacked(next, now);
  retries_left_ = attr_.retry_cnt;
  rnr_retries_left_ = attr_.rnr_retry;
  last_progress_ns_ = now;
}

// Everything before `next` (ahead of unacked_psn_) is acknowledged. With
// selective repeat the SACK marks of those PSNs are done with (a slot must
// never claim a PSN 2^24 later) and the retransmission timer restarts.
void Qp::AdvanceUnacked(uint32_t next, uint64_t now) {
  if (adp_timing_ && wire::psn_lt(adp_timed_psn_, next)) [[unlikely]] {
    adp_timing_ = false;
    if (now >= adp_timed_ns_) rtt_.Sample(now - adp_timed_ns_);
  }
  if (!sr_sacked_.empty()) {
    for (uint32_t p = unacked_psn_; p != next; p = wire::psn_add(p, 1)) {
      uint32_t& slot = sr_sacked_[p & (sr_.window - 1)];
      if (slot == p) slot = kNoSack;
    }
    sr_timer_ns_ = now;
    sr_backoff_ = 0;
    if (sr_recovery_ && !wire::psn_lt(next, sr_recover_psn_)) sr_recovery_ = false;
  }
  GbnAcked(static_cast<uint32_t>(wire::psn_diff(next, unacked_psn_)));
  unacked_psn_ = next;
}

// A SACK (SrHold at the responder): everything before its MSN field is
// acknowledged, and its PSN and the sr_run PSNs before it are held there.
// Holes below the highest SACKed PSN are resent once each (SrResend, from
// PollSend). A resend lost again: if it is the oldest hole and this SACK
// names a PSN first sent after it, at once; otherwise at the
// retransmission timeout (SrTimeout).
void Qp::OnSack(const wire::PacketView& pkt, const wire::Aeth& aeth) {
  Count(QpCounter::sr_sack_rcvd);
  Trace(TraceKind::kNak, pkt.bth.opcode, pkt.bth.psn, aeth.value());
  const uint32_t cum = aeth.msn & wire::kPsnMask;
  if (wire::psn_lt(unacked_psn_, cum) && !wire::psn_lt(next_psn_, cum)) AckUpTo(cum);
  if (attr_.state == QpState::kErr) return;
  const uint32_t s = pkt.bth.psn;
  if (wire::psn_lt(s, unacked_psn_) || !wire::psn_lt(s, next_psn_)) return;
  // s and the sr_run PSNs right before it are held at the responder.
  for (uint32_t k = 0, p = s; k <= pkt.bth.sr_run && !wire::psn_lt(p, unacked_psn_); ++k) {
    sr_sacked_[p & (sr_.window - 1)] = p;
    p = wire::psn_add(p, wire::kPsnMask);  // p - 1
  }
  const SrResent& head = sr_resent_[unacked_psn_ & (sr_.window - 1)];
  if (head.psn == unacked_psn_ && !wire::psn_lt(s, head.next)) sr_resend_head_ = true;
  const uint32_t above = wire::psn_add(s, 1);
  if (!sr_recovery_) {
    // A new recovery looks from the oldest unacknowledged PSN on, but not
    // again at PSNs the last one resent (they may still be on their way).
    sr_recovery_ = true;
    sr_recover_psn_ = next_psn_;
    if (wire::psn_lt(sr_retx_psn_, unacked_psn_) || !wire::psn_lt(sr_retx_psn_, next_psn_)) {
      sr_retx_psn_ = unacked_psn_;
    }
    sr_retx_wqe_ = sq_comp_;
    sr_high_sack_ = above;
  } else if (wire::psn_lt(sr_high_sack_, above)) {
    sr_high_sack_ = above;
  }
}

// Nothing was acknowledged for rto_us: resend the oldest unacknowledged
// packet (the responder's cumulative acknowledgement stops there; a READ or
// atomic asks again for its missing response). Only that one: the other
// holes were resent once already, and their SACKs or the cumulative
// acknowledgement say soon enough which of those were lost as well.
void Qp::SrTimeout(uint64_t now) {
  sr_timer_ns_ = now;
  if (sr_backoff_ < 16) ++sr_backoff_;
  adp_timing_ = false;  // Karn: the timed packet may be the one resent
  last_read_goback_psn_ = 0xFFFFFFFF;  // a READ's missing responses may be asked for again
  Count(QpCounter::sr_timeouts);
  Trace(TraceKind::kTimeout, 0, unacked_psn_, retries_left_);
  sr_resend_head_ = true;
  // The SACK marks may be stale: the responder drops what it holds when it
  // cannot run a request (RNR, no room for a response), and the NAK that
  // tells may have been lost. Its next SACKs mark again what it has. The
  // scan of this recovery (long done after a timeout) does not go on over
  // PSNs that lost their marks.
  std::fill(sr_sacked_.begin(), sr_sacked_.end(), kNoSack);
  if (wire::psn_lt(sr_retx_psn_, sr_high_sack_)) sr_retx_psn_ = sr_high_sack_;
}

// The requester rewinds (an RNR NAK, a NAK, the local ACK timeout, a lost
// READ response): everything from there is sent again in order, and the
// responder dropped what it held, so no SACK stands.
void Qp::SrForgetSacks() {
  std::fill(sr_sacked_.begin(), sr_sacked_.end(), kNoSack);
  sr_recovery_ = sr_resend_head_ = false;
  std::fill(sr_resent_.begin(), sr_resent_.end(), SrResent{});
  sr_retx_psn_ = sr_high_sack_ = unacked_psn_;  // nothing to scan
}

// Sends the holes of the recovery, oldest first, each once: PSNs in
// [sr_retx_psn_, sr_high_sack_) not SACKed (the oldest unacknowledged one
// whatever the table says). Returns false when the requester must stop (the
// pacer, no frame, an error).
bool Qp::SrResend(unsigned budget, unsigned* sent) {
  const uint32_t mask = sq_.size() - 1;
  const uint32_t end = send_pkt_ != 0 ? sq_send_ + 1 : sq_send_;
  if (sr_resend_head_) {
    // The oldest unacknowledged packet: its resend was lost, or it is a
    // READ or atomic whose response was (a request for the part still
    // missing; an atomic's result is replayed, never executed again).
    for (uint32_t i = sq_comp_; i != end; ++i) {
      SendCtx& ctx = send_ctx_[i & mask];
      if (ctx.npkts == 0 || wire::psn_lt(wire::psn_add(ctx.first_psn, ctx.npkts - 1), unacked_psn_)) continue;
      if (needs_response(ctx.wqe.op) && ctx.done) break;
      const uint32_t pkt = needs_response(ctx.wqe.op) ? ctx.resp_pkts
                           : wire::psn_lt(unacked_psn_, ctx.first_psn)
                               ? 0
                               : static_cast<uint32_t>(wire::psn_diff(unacked_psn_, ctx.first_psn));
      if (!PaceReady() || !SrSendAgain(ctx, pkt)) return false;
      ++*sent;
      const uint32_t psn = wire::psn_add(ctx.first_psn, pkt);
      // The recovery's scan does not send it a second time.
      const uint32_t done_to = needs_response(ctx.wqe.op) ? wire::psn_add(ctx.first_psn, ctx.npkts) : wire::psn_add(psn, 1);
      if (!wire::psn_lt(sr_retx_psn_, psn) && wire::psn_lt(sr_retx_psn_, done_to)) sr_retx_psn_ = done_to;
      break;
    }
    sr_resend_head_ = false;
  }
  while (*sent < budget && wire::psn_lt(sr_retx_psn_, sr_high_sack_)) {
    if (wire::psn_lt(sr_retx_psn_, unacked_psn_)) sr_retx_psn_ = unacked_psn_;
    if (!wire::psn_lt(sr_retx_psn_, sr_high_sack_)) break;
    const uint32_t psn = sr_retx_psn_;
    if (psn != unacked_psn_ && SrSacked(psn)) {
      sr_retx_psn_ = wire::psn_add(psn, 1);
      continue;
    }
    // The WQE holding psn: the cursor only moves forward, from the oldest.
    if (static_cast<int32_t>(sr_retx_wqe_ - sq_comp_) < 0) sr_retx_wqe_ = sq_comp_;
    while (sr_retx_wqe_ != end) {
      const SendCtx& c = send_ctx_[sr_retx_wqe_ & mask];
      if (c.npkts != 0 && !wire::psn_lt(wire::psn_add(c.first_psn, c.npkts - 1), psn)) break;
      ++sr_retx_wqe_;
    }
    if (sr_retx_wqe_ == end) {
      sr_retx_psn_ = sr_high_sack_;  // beyond what was sent: nothing to resend
      break;
    }
    SendCtx& ctx = send_ctx_[sr_retx_wqe_ & mask];
    const uint32_t wqe_end = wire::psn_add(ctx.first_psn, ctx.npkts);
    uint32_t pkt;
    if (needs_response(ctx.wqe.op)) {
      // One request for all of a READ's PSNs: sent again (for what is
      // missing) only if it is the oldest unacknowledged, or neither held
      // at the responder nor answered at all; never for a done one.
      const bool resend = !ctx.done && (wire::psn_diff(unacked_psn_, ctx.first_psn) >= 0 ||
                                        (ctx.resp_pkts == 0 && !SrSacked(ctx.first_psn)));
      if (!resend) {
        sr_retx_psn_ = wqe_end;
        continue;
      }
      pkt = ctx.resp_pkts;
      sr_retx_psn_ = wqe_end;
    } else {
      if (wire::psn_lt(psn, ctx.first_psn)) {
        sr_retx_psn_ = ctx.first_psn;
        continue;
      }
      pkt = static_cast<uint32_t>(wire::psn_diff(psn, ctx.first_psn));
      sr_retx_psn_ = wire::psn_add(psn, 1);
    }
    if (!PaceReady() || !SrSendAgain(ctx, pkt)) {
      sr_retx_psn_ = psn;  // again when the pacer allows, or a frame is free
      return false;
    }
    ++*sent;
  }
  return true;
}

// Packet `pkt` of a sent WQE goes again (a READ: its request from there on,
// a FIRST/ONLY response then expected at resp_pkts); false if it could not.
bool Qp::SrSendAgain(SendCtx& ctx, uint32_t pkt) {
  const uint32_t psn = wire::psn_add(ctx.first_psn, pkt);
  Trace(TraceKind::kRetransmit, 0, psn);
  // Karn: a round trip timed across a resend (the cumulative ACK waits for
  // the hole) would be the recovery's, not the path's.
  adp_timing_ = false;
  if (!BuildRequestPacket(ctx, pkt)) return false;
  PaceSent();
  sr_resent_[psn & (sr_.window - 1)] = {psn, next_psn_};
  if (needs_response(ctx.wqe.op)) ctx.issued_at_resp = true;
  return true;
}

void Qp::ReadLost(uint32_t first_missing) {
  if (SrActive()) {
    sr_resend_head_ = true;  // SrResend, from PollSend
    return;
  }
  GbnLoss(/*timeout=*/false);
  GoBackTo(first_missing);
}

// Rewinds the requester so that the next packet sent has PSN `psn`.
void Qp::GoBackTo(uint32_t psn) {
  Trace(TraceKind::kRetransmit, 0, psn);
  adp_timing_ = false;  // Karn: the timed packet may go again
  if (!sr_sacked_.empty()) SrForgetSacks();
  // WQEs sq_comp_ .. sq_send_ - 1 are fully sent; sq_send_ is partly sent
  // when send_pkt_ != 0.
  const uint32_t end = send_pkt_ != 0 ? sq_send_ + 1 : sq_send_;
  for (uint32_t i = sq_comp_; i != end; ++i) {
    SendCtx& ctx = send_ctx_[i & (sq_.size() - 1)];
    const int32_t d = wire::psn_diff(psn, ctx.first_psn);
    if (d >= 0 && static_cast<uint32_t>(d) < ctx.npkts) {
      sq_send_ = i;
      send_pkt_ = static_cast<uint32_t>(d);
      next_psn_ = psn;
      // Invariant: unacked_psn_ <= next_psn_ (everything from psn on is unsent).
      if (wire::psn_lt(psn, unacked_psn_)) unacked_psn_ = psn;
      return;
    }
  }
  // psn is not inside any sent WQE: nothing to resend.
}

// Moves the requester on to `psn` (after next_psn_, at most high_psn_):
// what lies before it was sent before the last rewind and is acknowledged
// now, and is not sent again. Without it an ACK beyond what the smaller
// window had resent was ignored, and the requester resent its window until
// retry exceeded while the responder answered every resend with that ACK
// (stall_memif: a server stopped for 300 ms).
void Qp::SkipAckedTo(uint32_t psn) {
  const uint32_t mask = sq_.size() - 1;
  uint32_t i = sq_send_;
  uint32_t first = wire::psn_add(next_psn_, (0u - send_pkt_) & wire::kPsnMask);  // WQE sq_send_'s first PSN
  while (i != sq_fetched_) {
    const uint32_t n = send_ctx_[i & mask].npkts;
    const int32_t d = wire::psn_diff(psn, first);
    if (d < static_cast<int32_t>(n)) {
      sq_send_ = i;
      send_pkt_ = static_cast<uint32_t>(d);
      next_psn_ = psn;
      return;
    }
    first = wire::psn_add(first, n);
    ++i;
  }
  sq_send_ = i;
  send_pkt_ = 0;
  next_psn_ = psn;
}

// A loss was found: go-back-N's window (qp.h) is cut before the rewind. A
// timeout, which says the path delivered nothing for a while, starts again
// from the floor; a NAK halves the window once per window of data.
void Qp::GbnLoss(bool timeout) {
  if (sr_.on) return;  // selective repeat's window is the responder's buffer
  if (!timeout && gbn_recovering_ && wire::psn_lt(unacked_psn_, gbn_recover_psn_)) return;
  gbn_ssthresh_ = std::max(gbn_window_ / 2, kGbnMinWindow);
  gbn_window_ = timeout ? kGbnMinWindow : gbn_ssthresh_;
  gbn_grow_ = 0;
  gbn_recovering_ = true;
  gbn_recover_psn_ = high_psn_;
  Count(QpCounter::gbn_window_cuts);
}

// `pkts` more PSNs were acknowledged: below gbn_ssthresh_ the window grows
// by as many (doubling per round trip), above it by one per window's worth.
void Qp::GbnAcked(uint32_t pkts) {
  if (gbn_recovering_ && !wire::psn_lt(wire::psn_add(unacked_psn_, pkts), gbn_recover_psn_)) gbn_recovering_ = false;
  if (gbn_window_ >= kGbnMaxWindow) return;
  if (gbn_window_ < gbn_ssthresh_) {
    gbn_window_ = std::min(gbn_window_ + pkts, gbn_ssthresh_);
    return;
  }
  gbn_grow_ += pkts;
  while (gbn_grow_ >= gbn_window_ && gbn_window_ < kGbnMaxWindow) {
    gbn_grow_ -= gbn_window_;
    ++gbn_window_;
  }
}

// Places response data (READ payload, atomic original value) into the WQE's
// local buffers, with local-write rights.
bool Qp::ScatterToSend(SendCtx& ctx, uint32_t offset, const uint8_t* src, uint32_t len) {
  const uint32_t slot = static_cast<uint32_t>(&ctx - send_ctx_.data());
  const queue::Sge* sges = &send_sge_[size_t{slot} * caps_.max_send_sge];
  return WalkSges(env_->Mrs(), pd_, sges, ctx.wqe.num_sge, offset, len, mem::kLocalWrite,
                  [&](const mem::Place& p, uint32_t done, uint32_t n) { return mem::WriteTo(p, src + done, n); }) ==
         SgeResult::kOk;
}

void Qp::OnReadResponse(const wire::PacketView& pkt) {
  const uint32_t psn = pkt.bth.psn;
  CompleteUpTo(psn);
  if (attr_.state == QpState::kErr || (sq_comp_ == sq_send_ && send_pkt_ == 0)) return;
  SendCtx& ctx = send_ctx_[sq_comp_ & (sq_.size() - 1)];
  if (ctx.wqe.op != queue::WqeOp::kRead || ctx.done) {
    Count(QpCounter::stale_ack);
    return;
  }
  const uint32_t expected = wire::psn_add(ctx.first_psn, ctx.resp_pkts);
  const int32_t d = wire::psn_diff(psn, expected);
  if (d < 0) {
    Count(QpCounter::stale_ack);  // a duplicate response
    return;
  }
  if (d > 0) {
    // A response was lost: ask again for the rest, once per gap.
    Count(QpCounter::rcvd_seq_err);
    if (last_read_goback_psn_ != expected) {
      Count(QpCounter::implied_nak_seq_err);  // decided once per gap, as ConnectX counts it
      last_read_goback_psn_ = expected;
      ReadLost(expected);
    }
    return;
  }
  const uint32_t mtu = mtu_bytes(attr_.path_mtu);
  const uint32_t offset = ctx.resp_pkts * mtu;
  const bool first = pkt.info->mask & wire::kMaskFirst;
  const bool last = pkt.info->mask & wire::kMaskLast;
  const uint32_t remaining = ctx.total_len - offset;
  const bool should_be_last = remaining <= mtu;
  // IBA 9.7.5.1.4: responses come as FIRST/MIDDLE/LAST or ONLY and carry
  // exactly a path MTU except the last. A READ reissued for its missing part
  // is a new request to the responder, so its first response is FIRST/ONLY;
  // a MIDDLE/LAST of the original stream at the same PSN is as good. Several
  // requests may be in flight (a reissue, then a rewind that resends the
  // whole READ): a FIRST is valid wherever any of them started.
  const bool first_ok = ctx.resp_pkts == 0 || ctx.issued_at_resp;
  if ((first && !first_ok) || (!first && ctx.resp_pkts == 0) || last != should_be_last ||
      pkt.payload_len != (last ? remaining : mtu)) {
    CompleteHeadWithError(queue::wc::kBadRespErr);
    return;
  }
  if (pkt.payload_len != 0 && !ScatterToSend(ctx, offset, pkt.payload, pkt.payload_len)) {
    CompleteHeadWithError(queue::wc::kLocProtErr);
    return;
  }
  ++ctx.resp_pkts;
  ctx.issued_at_resp = false;
  last_progress_ns_ = sr_timer_ns_ = env_->NowNs();
  retries_left_ = attr_.retry_cnt;
  if (wire::psn_lt(unacked_psn_, wire::psn_add(psn, 1))) AdvanceUnacked(wire::psn_add(psn, 1), env_->NowNs());
  if (last) {
    ctx.done = true;
    if (CompleteWqe(ctx, queue::wc::kSuccess)) sq_.publish_cons(sq_comp_);
  }
}

void Qp::OnAtomicAck(const wire::PacketView& pkt) {
  const uint32_t psn = pkt.bth.psn;
  CompleteUpTo(psn);
  if (attr_.state == QpState::kErr || (sq_comp_ == sq_send_ && send_pkt_ == 0)) return;
  SendCtx& ctx = send_ctx_[sq_comp_ & (sq_.size() - 1)];
  if ((ctx.wqe.op != queue::WqeOp::kCmpSwap && ctx.wqe.op != queue::WqeOp::kFetchAdd) ||
      ctx.done || ctx.first_psn != psn) {
    Count(QpCounter::stale_ack);
    return;
  }
  // The original value goes to the local buffer in host order (verbs).
  const uint64_t orig = wire::load_be64(pkt.ext(pkt.info->atomic_ack_eth));
  uint8_t bytes[8];
  std::memcpy(bytes, &orig, 8);
  if (!ScatterToSend(ctx, 0, bytes, 8)) {
    CompleteHeadWithError(queue::wc::kLocProtErr);
    return;
  }
  ctx.done = true;
  last_progress_ns_ = sr_timer_ns_ = env_->NowNs();
  retries_left_ = attr_.retry_cnt;
  if (wire::psn_lt(unacked_psn_, wire::psn_add(psn, 1))) AdvanceUnacked(wire::psn_add(psn, 1), env_->NowNs());
  if (CompleteWqe(ctx, queue::wc::kSuccess)) sq_.publish_cons(sq_comp_);
}

void Qp::OnResponse(const wire::PacketView& pkt) {
  // Responses exist only for an RC or XRC initiator QP, in its transport's
  // opcodes (IBA 9.6.1.1.2).
  if ((type_ != QpType::kRc && type_ != QpType::kXrcIni) ||
      wire::opcode_transport(pkt.bth.opcode) != wire::opcode_transport(op_base_)) {
    Count(QpCounter::malformed_pkts);
    return;
  }
  if (attr_.state != QpState::kRts && attr_.state != QpState::kSqd) {
    Count(QpCounter::qp_state_drop);
    return;
  }
  const uint32_t psn = pkt.bth.psn;
  // A response must name a PSN in [unacked - 1, next - 1]; anything else is
  // stale. A plain ACK may name one up to high - 1: after a rewind, what
  // was sent before it (SkipAckedTo).
  const bool plain_ack = !(pkt.info->mask & wire::kMaskRead) &&
                         wire::opcode_operation(pkt.bth.opcode) != wire::kRcAtomicAck &&
                         wire::read_aeth(pkt.ext(pkt.info->aeth)).type() == wire::AckType::kAck;
  if (wire::psn_diff(psn, unacked_psn_) < -1 || !wire::psn_lt(psn, plain_ack ? high_psn_ : next_psn_)) {
    Count(QpCounter::stale_ack);
    return;
  }
  // The peer's responder does selective repeat too (the bit is only ever
  // on answers to requests that carried it).
  if (pkt.bth.sr && sr_.on) sr_peer_ = true;
  if (pkt.info->mask & wire::kMaskRead) {
    OnReadResponse(pkt);
    return;
  }
  if (wire::opcode_operation(pkt.bth.opcode) == wire::kRcAtomicAck) {
    OnAtomicAck(pkt);
    return;
  }
  const wire::Aeth aeth = wire::read_aeth(pkt.ext(pkt.info->aeth));
  switch (aeth.type()) {
    case wire::AckType::kAck: {
      // A selective-repeat responder's count of duplicates received: resends
      // of packets that had arrived (wire::Bth::sr_run).
      if (pkt.bth.sr && sr_.on && pkt.bth.sr_run != 0) Count(QpCounter::sr_spurious_resends, pkt.bth.sr_run);
      AckUpTo(wire::psn_add(psn, 1));
      Trace(TraceKind::kAck, pkt.bth.opcode, psn, aeth.msn);
      break;
    }
    case wire::AckType::kRnrNak: {
      Count(QpCounter::rcvd_rnr_err);
      Trace(TraceKind::kRnr, pkt.bth.opcode, psn, aeth.value());
      CompleteUpTo(psn);
      unacked_psn_ = psn;
      if (attr_.rnr_retry != 7) {  // 7 means retry forever (IBA 9.7.5.2.8)
        if (rnr_retries_left_ == 0) {
          Count(QpCounter::rnr_nak_retry_err);
          CompleteHeadWithError(queue::wc::kRnrRetryExcErr);
          return;
        }
        --rnr_retries_left_;
      }
      GoBackTo(psn);
      rnr_wait_ = true;
      rnr_resume_ns_ = env_->NowNs() + rnr_timer_ns(aeth.value());
      break;
    }
    case wire::AckType::kNak: {
      if (pkt.bth.sr && sr_.on &&
          static_cast<wire::NakCode>(aeth.value()) == wire::NakCode::kPsnSeqError) {
        OnSack(pkt, aeth);
        break;
      }
      Trace(TraceKind::kNak, pkt.bth.opcode, psn, aeth.value());
      CompleteUpTo(psn);
      if (attr_.state == QpState::kErr) return;
      unacked_psn_ = psn;
      switch (static_cast<wire::NakCode>(aeth.value())) {
        case wire::NakCode::kPsnSeqError:
          Count(QpCounter::rcvd_seq_err);
          GbnLoss(/*timeout=*/false);
          GoBackTo(psn);
          last_progress_ns_ = sr_timer_ns_ = env_->NowNs();
          break;
        case wire::NakCode::kInvalidRequest:
          Count(QpCounter::rcvd_inv_req_err);
          CompleteHeadWithError(queue::wc::kRemInvReqErr);
          break;
        case wire::NakCode::kRemoteAccessError:
          Count(QpCounter::req_remote_access_errors);
          CompleteHeadWithError(queue::wc::kRemAccessErr);
          break;
        case wire::NakCode::kRemoteOperationalError:
        default:
          CompleteHeadWithError(queue::wc::kRemOpErr);
          break;
      }
      break;
    }
    case wire::AckType::kReserved:
      Count(QpCounter::malformed_pkts);
      break;
  }
}

// Adaptive retransmission (transport/adaptive_retrans.h). The schedule
// restarts whenever the QP makes progress (any acknowledgement, the end of
// an RNR wait, the first packet after an idle spell: a new
// last_progress_ns_): the first resend comes one RTO after it, each further
// one twice as long after the one before, until that wait would reach the
// QP's local ACK timeout; from there on only that timeout acts (with
// timeout 0, "wait forever", the waits stop growing at 67 ms, timeout 14's).
uint64_t Qp::AdpInterval() const {
  const unsigned k = last_progress_ns_ != adp_progress_seen_ ? 0 : adp_fired_;
  const uint64_t rto = rtt_.Rto(uint64_t{adp_.min_us} * 1000, uint64_t{adp_.init_us} * 1000);
  const uint64_t limit = attr_.timeout != 0 ? uint64_t{4096} << attr_.timeout : uint64_t{4096} << 14;
  uint64_t wait = rto;  // rto << k, stopping at the limit (no overflow)
  for (unsigned i = 0; i < k && wait < limit; ++i) wait <<= 1;
  if (wait < limit) return wait;
  return attr_.timeout != 0 ? kNoTimer : limit;
}

Qp::RetransTimer Qp::retrans_timer() const {
  if (!reliable() || (attr_.state != QpState::kRts && attr_.state != QpState::kSqd)) return RetransTimer::kNone;
  if (SrActive()) return RetransTimer::kSelectiveRepeat;
  if (AdpActive() && AdpInterval() != kNoTimer) return RetransTimer::kAdaptive;
  return attr_.timeout != 0 ? RetransTimer::kLocalAck : RetransTimer::kNone;
}

uint64_t Qp::RetransTimeoutNs() const {
  switch (retrans_timer()) {
    case RetransTimer::kSelectiveRepeat: return SrRtoNs();
    case RetransTimer::kAdaptive: return AdpInterval();
    case RetransTimer::kLocalAck: return uint64_t{4096} << attr_.timeout;
    case RetransTimer::kNone: break;
  }
  return 0;
}

uint64_t Qp::AdpDue() const {
  const uint64_t wait = AdpInterval();
  if (wait == kNoTimer) return kNoTimer;
  return (last_progress_ns_ != adp_progress_seen_ ? last_progress_ns_ : adp_from_ns_) + wait;
}

// The adaptive timer expired: go back N as the local ACK timeout would, but
// spend no retry and leave that timeout running from the last progress.
void Qp::AdpTimeout(uint64_t now) {
  if (last_progress_ns_ != adp_progress_seen_) {
    adp_progress_seen_ = last_progress_ns_;
    adp_fired_ = 0;
  }
  if (adp_fired_ < 255) ++adp_fired_;
  adp_from_ns_ = now;
  Count(QpCounter::roce_adp_retrans);
  Trace(TraceKind::kAdpTimeout, 0, unacked_psn_, adp_fired_);
  GbnLoss(/*timeout=*/false);  // early, and maybe spurious: a halving, not the floor
  RewindForTimeout();
}

void Qp::RewindForTimeout() {
  last_read_goback_psn_ = 0xFFFFFFFF;
  // Resend from the oldest packet not acknowledged (for a READ: from its
  // first missing response).
  uint32_t from = unacked_psn_;
  if (sq_comp_ != sq_send_ || send_pkt_ != 0) {
    const SendCtx& head = send_ctx_[sq_comp_ & (sq_.size() - 1)];
    if (head.wqe.op == queue::WqeOp::kRead) from = wire::psn_add(head.first_psn, head.resp_pkts);
    else if (wire::psn_lt(from, head.first_psn)) from = head.first_psn;
  }
  GoBackTo(from);
}

void Qp::OnTimer(uint64_t now) {
  if ((attr_.state != QpState::kRts && attr_.state != QpState::kSqd) || !reliable()) return;
  if (rnr_wait_) {
    if (now >= rnr_resume_ns_) {
      rnr_wait_ = false;
      last_progress_ns_ = sr_timer_ns_ = now;
    }
    return;
  }
  if (unacked_psn_ == next_psn_) return;
  if (SrActive() && now - sr_timer_ns_ >= SrRtoNs()) SrTimeout(now);
  const bool iba_due = attr_.timeout != 0 && now - last_progress_ns_ >= (4096ull << attr_.timeout);  // 4.096 µs × 2^timeout
  if (!iba_due) {
    if (AdpActive() && now >= AdpDue()) AdpTimeout(now);
    return;
  }
  Count(QpCounter::completer_retry_err);
  if (AdpActive()) Count(QpCounter::roce_adp_retrans_to);
  Trace(TraceKind::kTimeout, 0, unacked_psn_, retries_left_);
  if (retries_left_ == 0) {
    Count(QpCounter::retry_exceeded_err);
    CompleteHeadWithError(queue::wc::kRetryExcErr);
    return;
  }
  --retries_left_;
  GbnLoss(/*timeout=*/true);
  RewindForTimeout();
  last_progress_ns_ = sr_timer_ns_ = now;
  // The adaptive schedule is spent until the next acknowledgement: only
  // this timeout acts from here on.
  adp_progress_seen_ = adp_from_ns_ = now;
  adp_fired_ = 255;
  // The peer may have moved (a new MAC after ARP expiry or a gratuitous
  // ARP): look the next hop up again before resending.
  mac_valid_ = false;
}

}  // namespace droce::transport
