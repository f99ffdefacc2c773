// RC completer: ACKs and NAKs retire send WQEs in order; timeouts and NAKs
// rewind the requester (go-back-N, IBA 9.7.5.2 and 9.9).
#include <cstring>

#include "transport/qp.h"
#include "wire/psn.h"

namespace droce::transport {

// Completes, in order, every sent WQE whose last packet is before `psn`.
void Qp::CompleteUpTo(uint32_t psn) {
  bool progressed = false;
  while (sq_comp_ != sq_send_) {
    SendCtx& ctx = send_ctx_[sq_comp_ & (sq_.size() - 1)];
    const uint32_t last_psn = wire::psn_add(ctx.first_psn, ctx.npkts - 1);
    if (!wire::psn_lt(last_psn, psn)) break;
    if (sq_sig_all_ || (ctx.wqe.flags & queue::kWqeSignaled)) {
      queue::Cqe c{};
      c.wr_id = ctx.wqe.wr_id;
      c.status = queue::wc::kSuccess;
      c.opcode = queue::wc::kOpSend;
      c.byte_len = ctx.total_len;
      c.qp_num = qpn_;
      if (!PushSendCqe(c)) return;  // the QP is now in error
    }
    ++sq_comp_;
    progressed = true;
  }
  if (progressed) sq_.publish_cons(sq_comp_);
}

void Qp::CompleteHeadWithError(uint8_t status) {
  if (sq_comp_ != sq_send_ || send_pkt_ != 0) {
    SendCtx& ctx = send_ctx_[sq_comp_ & (sq_.size() - 1)];
    queue::Cqe c{};
    c.wr_id = ctx.wqe.wr_id;
    c.status = status;
    c.qp_num = qpn_;
    if (PushSendCqe(c)) {
      ++sq_comp_;
      if (sq_send_ == sq_comp_ - 1) {
        sq_send_ = sq_comp_;
        send_pkt_ = 0;
      }
      sq_.publish_cons(sq_comp_);
    }
  }
  EnterError();
}

// Rewinds the requester so that the next packet sent has PSN `psn`.
void Qp::GoBackTo(uint32_t psn) {
  // WQEs sq_comp_ .. sq_send_ - 1 are fully sent; sq_send_ is partly sent
  // when send_pkt_ != 0.
  const uint32_t end = send_pkt_ != 0 ? sq_send_ + 1 : sq_send_;
  for (uint32_t i = sq_comp_; i != end; ++i) {
    const SendCtx& ctx = send_ctx_[i & (sq_.size() - 1)];
    const int32_t d = wire::psn_diff(psn, ctx.first_psn);
    if (d >= 0 && static_cast<uint32_t>(d) < ctx.npkts) {
      sq_send_ = i;
      send_pkt_ = static_cast<uint32_t>(d);
      next_psn_ = psn;
      return;
    }
  }
  // psn is not inside any sent WQE: nothing to resend.
}

void Qp::OnResponse(const wire::PacketView& pkt) {
  if (attr_.state != QpState::kRts && attr_.state != QpState::kSqd) {
    ++env_->Stats().qp_state_drop;
    return;
  }
  if (pkt.bth.opcode != wire::kRcAck) {
    // Read responses and atomic ACKs come with the full transport.
    ++env_->Stats().malformed_pkts;
    return;
  }
  const uint32_t psn = pkt.bth.psn;
  // An ACK must name a PSN in [unacked - 1, next - 1]; anything else is stale.
  if (wire::psn_diff(psn, unacked_psn_) < -1 || !wire::psn_lt(psn, next_psn_)) {
    ++env_->Stats().stale_ack;
    return;
  }
  const wire::Aeth aeth = wire::read_aeth(pkt.ext(pkt.info->aeth));
  switch (aeth.type()) {
    case wire::AckType::kAck: {
      const uint32_t next = wire::psn_add(psn, 1);
      CompleteUpTo(next);
      if (wire::psn_lt(unacked_psn_, next)) unacked_psn_ = next;
      retries_left_ = attr_.retry_cnt;
      rnr_retries_left_ = attr_.rnr_retry;
      last_progress_ns_ = env_->NowNs();
      break;
    }
    case wire::AckType::kRnrNak: {
      ++env_->Stats().rcvd_rnr_err;
      CompleteUpTo(psn);
      unacked_psn_ = psn;
      if (attr_.rnr_retry != 7) {  // 7 means retry forever (IBA 9.7.5.2.8)
        if (rnr_retries_left_ == 0) {
          ++env_->Stats().rnr_nak_retry_err;
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
      CompleteUpTo(psn);
      unacked_psn_ = psn;
      switch (static_cast<wire::NakCode>(aeth.value())) {
        case wire::NakCode::kPsnSeqError:
          ++env_->Stats().rcvd_seq_err;
          GoBackTo(psn);
          last_progress_ns_ = env_->NowNs();
          break;
        case wire::NakCode::kInvalidRequest:
          ++env_->Stats().rcvd_inv_req_err;
          CompleteHeadWithError(queue::wc::kRemInvReqErr);
          break;
        case wire::NakCode::kRemoteAccessError:
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
      ++env_->Stats().malformed_pkts;
      break;
  }
}

void Qp::OnTimer(uint64_t now) {
  if (attr_.state != QpState::kRts) return;
  if (rnr_wait_) {
    if (now >= rnr_resume_ns_) {
      rnr_wait_ = false;
      last_progress_ns_ = now;
    }
    return;
  }
  if (unacked_psn_ == next_psn_ || attr_.timeout == 0) return;  // 0: wait forever
  const uint64_t timeout_ns = 4096ull << attr_.timeout;  // 4.096 µs × 2^timeout
  if (now - last_progress_ns_ < timeout_ns) return;
  ++env_->Stats().completer_retry_err;
  if (retries_left_ == 0) {
    ++env_->Stats().retry_exceeded_err;
    CompleteHeadWithError(queue::wc::kRetryExcErr);
    return;
  }
  --retries_left_;
  GoBackTo(unacked_psn_);
  last_progress_ns_ = now;
}

}  // namespace droce::transport
