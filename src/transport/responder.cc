// RC responder: PSN checks, receive WQE consumption, placement and ACKs
// (IBA 9.7.5.1). Request packets arrive here already parsed and ICRC-checked.
#include <cstring>

#include "transport/qp.h"
#include "wire/psn.h"

namespace droce::transport {

void Qp::OnPacket(const wire::PacketView& pkt) {
  if (pkt.info->mask & wire::kMaskResponse) {
    OnResponse(pkt);
  } else if (pkt.info->mask & wire::kMaskRequest) {
    OnRequest(pkt);
  } else {
    ++env_->Stats().malformed_pkts;  // e.g. a CNP: congestion control comes later
  }
}

void Qp::SendAck(const wire::PacketView& req, wire::Aeth aeth, uint32_t psn) {
  const wire::OpcodeInfo& info = wire::opcode_info(wire::kRcAck);
  const uint32_t roce_len = info.length + wire::kIcrcLen;
  const uint32_t frame_len = wire::kRoceV4HeadLen + roce_len;
  TxFrame f;
  if (!env_->AllocFrame(frame_len, &f)) return;  // the requester's timer recovers
  // Responses go back the way the request came, to its source MAC.
  wire::Ipv4Path path = PathTo(req.smac);
  path.dip = req.sip;
  const unsigned bth_off = wire::write_outer_v4(f.data, path, roce_len, ip_id_++);
  wire::Bth b;
  b.opcode = wire::kRcAck;
  b.dqpn = attr_.dest_qpn;
  b.psn = psn;
  wire::write_bth(f.data + bth_off, b);
  wire::write_aeth(f.data + bth_off + info.aeth, aeth);
  wire::finish_icrc_v4(f.data, frame_len);
  env_->SendFrame(f, frame_len);
  ++env_->Stats().sent_pkts;
}

// Places `len` bytes at the receive WQE's current offset.
bool Qp::Scatter(const uint8_t* src, uint32_t len, uint8_t* status) {
  uint32_t offset = recv_.offset;
  uint32_t done = 0;
  for (unsigned i = 0; i < recv_.wqe.num_sge && done < len; ++i) {
    const queue::Sge& s = recv_sge_[i];
    if (offset >= s.length) {
      offset -= s.length;
      continue;
    }
    const uint32_t n = std::min(s.length - offset, len - done);
    uint8_t* host = nullptr;
    if (env_->Mrs().Check(s.lkey, pd_, s.addr + offset, n, mem::kLocalWrite, &host) !=
        mem::AccessError::kOk) {
      *status = queue::wc::kLocProtErr;
      return false;
    }
    std::memcpy(host, src + done, n);
    done += n;
    offset = 0;
  }
  if (done < len) {
    *status = queue::wc::kLocLenErr;  // the message is longer than the buffers
    return false;
  }
  recv_.offset += len;
  return true;
}

void Qp::CompleteRecv(uint8_t status, bool solicited, const wire::PacketView* pkt, bool with_imm) {
  queue::Cqe c{};
  c.wr_id = recv_.wqe.wr_id;
  c.status = status;
  c.opcode = queue::wc::kOpRecv;
  c.byte_len = recv_.offset;
  c.qp_num = qpn_;
  c.src_qp = attr_.dest_qpn;
  if (with_imm && pkt != nullptr) {
    std::memcpy(&c.imm_data, pkt->ext(pkt->info->immdt), 4);
    c.wc_flags |= queue::wc::kFlagWithImm;
  }
  recv_.active = false;
  PushRecvCqe(c, solicited);
}

void Qp::OnRequest(const wire::PacketView& pkt) {
  Counters& st = env_->Stats();
  if (attr_.state != QpState::kRtr && attr_.state != QpState::kRts && attr_.state != QpState::kSqd) {
    ++st.qp_state_drop;
    return;
  }
  const uint8_t op = pkt.bth.opcode;
  if ((op >> 5) != 0) {  // not an RC opcode on an RC QP (IBA 9.6.1.1.2)
    ++st.malformed_pkts;
    return;
  }
  const uint32_t psn = pkt.bth.psn;
  const int32_t d = wire::psn_diff(psn, epsn_);
  if (d > 0) {
    // A gap: NAK once, then drop until the expected PSN arrives (9.7.5.1.1).
    ++st.out_of_seq_request;
    if (!nak_sent_) {
      nak_sent_ = true;
      SendAck(pkt, wire::Aeth::nak(msn_, wire::NakCode::kPsnSeqError), epsn_);
    }
    return;
  }
  if (d < 0) {
    // A duplicate: it was executed already; acknowledge what we have
    // (9.7.5.1.2). The ACK names the last PSN received in order.
    ++st.duplicate_request;
    SendAck(pkt, wire::Aeth::ack(msn_), wire::psn_add(epsn_, wire::kPsnMask));
    return;
  }
  nak_sent_ = false;
  const uint32_t mask = pkt.info->mask;
  const uint32_t mtu = mtu_bytes(attr_.path_mtu);
  auto invalid = [&](uint8_t recv_status) {
    // Invalid request NAK; the QP goes to the error state (9.7.5.2.4).
    ++st.send_inv_req_err;
    SendAck(pkt, wire::Aeth::nak(msn_, wire::NakCode::kInvalidRequest), psn);
    if (recv_.active) CompleteRecv(recv_status, false, nullptr, false);
    EnterError();
  };
  if (!(mask & wire::kMaskSend)) {
    invalid(queue::wc::kRemInvReqErr);  // WRITE/READ/atomics come with the full transport
    return;
  }
  const bool first = mask & wire::kMaskFirst;
  const bool last = mask & wire::kMaskLast;
  // Opcode sequence (9.7.5.1.3): FIRST/ONLY only between messages,
  // MIDDLE/LAST only inside one.
  if (first == in_send_message_) {
    invalid(queue::wc::kRemInvReqErr);
    return;
  }
  // FIRST and MIDDLE carry exactly one path MTU; nothing carries more.
  if (pkt.payload_len > mtu || (!last && pkt.payload_len != mtu)) {
    invalid(queue::wc::kRemInvReqErr);
    return;
  }
  if (first) {
    if (rq_cons_ == rq_.load_prod_acquire()) {
      // No receive WQE: RNR NAK, the requester retries after min_rnr_timer.
      ++st.send_rnr_err;
      SendAck(pkt, wire::Aeth::rnr_nak(msn_, attr_.min_rnr_timer), psn);
      return;
    }
    const uint8_t* slot = rq_.slot(rq_cons_);
    std::memcpy(&recv_.wqe, slot, sizeof(recv_.wqe));
    const uint32_t nsge = recv_.wqe.num_sge;
    ++rq_cons_;
    recv_.active = true;
    recv_.offset = 0;
    if (nsge > caps_.max_recv_sge) {
      recv_.wqe.num_sge = 0;
      ++st.bad_wqe;
      rq_.publish_cons(rq_cons_);
      invalid(queue::wc::kLocLenErr);
      return;
    }
    std::memcpy(recv_sge_.data(), slot + sizeof(queue::RecvWqe), sizeof(queue::Sge) * nsge);
    rq_.publish_cons(rq_cons_);
  }
  uint8_t status = queue::wc::kSuccess;
  if (!Scatter(pkt.payload, pkt.payload_len, &status)) {
    // Local length or protection error at the responder (9.7.5.2.4 / 10.8.3).
    ++st.send_inv_req_err;
    SendAck(pkt, wire::Aeth::nak(msn_, status == queue::wc::kLocLenErr
                                           ? wire::NakCode::kInvalidRequest
                                           : wire::NakCode::kRemoteOperationalError),
            psn);
    CompleteRecv(status, false, nullptr, false);
    EnterError();
    return;
  }
  ++st.rcvd_pkts;
  epsn_ = wire::psn_add(epsn_, 1);
  in_send_message_ = !last;
  if (last) {
    msn_ = (msn_ + 1) & wire::kPsnMask;
    CompleteRecv(queue::wc::kSuccess, pkt.bth.se, &pkt, (mask & wire::kMaskImmDt) != 0);
    if (attr_.state == QpState::kErr) return;
  }
  if (pkt.bth.ackreq) SendAck(pkt, wire::Aeth::ack(msn_), psn);
}

}  // namespace droce::transport
