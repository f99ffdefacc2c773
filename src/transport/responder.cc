// Responder for SEND and RDMA WRITE: PSN checks, receive WQE consumption,
// placement and ACKs (IBA 9.7.5.1) for RC, and the unreliable variants for UC
// and UD (IBA 9.8, 9.9). READ and atomics are in responder_rd.cc.
#include <algorithm>
#include <atomic>
#include <cstring>

#include "transport/qp.h"
#include "transport/sge.h"
#include "wire/psn.h"

namespace droce::transport {

void Qp::OnPacket(const wire::PacketView& pkt) {
  Count(QpCounter::rcvd_pkts);  // every packet for this QP, as rxe counts
  Trace(TraceKind::kRx, pkt.bth.opcode, pkt.bth.psn, 0, pkt.payload_len);
  const uint32_t mask = pkt.info->mask;
  if ((pkt.tos & cc::kEcnMask) == cc::kEcnCe) [[unlikely]] OnCongestionMark(pkt);
  if (mask & wire::kMaskResponse) {
    OnResponse(pkt);
  } else if (mask & wire::kMaskRequest) {
    switch (type_) {
      case QpType::kRc: OnRequest(pkt); break;
      case QpType::kUc: OnUnreliableRequest(pkt); break;
      case QpType::kUd: OnUdRequest(pkt); break;
      case QpType::kXrcTgt: OnRequest(pkt); break;
      case QpType::kXrcIni: Count(QpCounter::malformed_pkts); break;  // it only sends
    }
  } else if (mask & wire::kMaskCnp) {
    OnCnp(pkt);
  } else {
    Count(QpCounter::malformed_pkts);
  }
}

// DCQCN's notification point: a packet that met congestion on its way (a
// switch set CE) makes this QP tell the sender's QP with a CNP, at most one
// per min_time_between_cnps, formatted as ConnectX-4 Lx sends it (a captured
// CNP: tests/unit/cc_transport_test.cc): BTH opcode 0x81, P_Key 0xFFFF, BECN
// set, PSN 0, 16 reserved zero bytes, the ICRC; IP DSCP cnp_dscp with
// ECT(0), UDP source port 0.
void Qp::OnCongestionMark(const wire::PacketView& pkt) {
  Count(QpCounter::np_ecn_marked_roce_packets);
  if (cc_mode_ == cc::CcMode::kOff || (pkt.info->mask & wire::kMaskCnp)) return;
  const uint64_t now = env_->NowNs();
  if (!np_.ShouldSend(now, dcqcn_.min_time_between_cnps)) return;
  const uint32_t dqpn =
      type_ == QpType::kUd ? wire::read_deth(pkt.ext(pkt.info->deth)).src_qp : attr_.dest_qpn;
  wire::Path path = PathTo(pkt.smac, pkt.sip6, attr_.av);
  path.tos = static_cast<uint8_t>(dcqcn_.cnp_dscp << 2 | cc::kEct0);
  path.udp_sport = 0;
  const wire::OpcodeInfo& info = wire::opcode_info(wire::kCnp);
  const uint32_t roce_len = info.length + wire::kIcrcLen;
  const uint32_t frame_len = wire::outer_len(path) + roce_len;
  TxFrame f;
  if (!env_->AllocFrame(frame_len, &f)) return;  // a later mark sends one
  uint8_t* bth = f.data + wire::write_outer(f.data, path, roce_len, ip_id_++);
  wire::Bth b;
  b.opcode = wire::kCnp;
  b.becn = true;
  b.dqpn = dqpn;
  wire::write_bth(bth, b);
  std::memset(bth + wire::kBthLen, 0, wire::kCnpPayloadLen);
  wire::finish_icrc(f.data, frame_len);
  f.pcp = static_cast<int8_t>(dcqcn_.cnp_802p_prio);  // on a tagged link
  Transmit(f, frame_len, b);
  Count(QpCounter::np_cnp_sent);
}

// DCQCN's reaction point: a CNP for this QP cuts its rate (cc/dcqcn.h).
void Qp::OnCnp(const wire::PacketView& pkt) {
  (void)pkt;
  if (cc_mode_ == cc::CcMode::kOff) {
    Count(QpCounter::rp_cnp_ignored);
    return;
  }
  Count(QpCounter::rp_cnp_handled);
  const uint64_t now = env_->NowNs();
  rp_.OnCnp(now);
  ApplyCcRate(now);
}

void Qp::SendAck(const wire::PacketView& req, wire::Aeth aeth, uint32_t psn) {
  Response r;
  r.kind = Response::kAck;
  r.psn = psn;
  r.msn = aeth.msn;
  r.syndrome = aeth.syndrome;
  r.dmac = req.smac;
  r.dgid = req.sip6;
  BuildAck(r);  // if no buffer is free the requester's timer recovers
}

// ACKs go out through the response queue, never at once: they must not
// overtake READ responses or atomic ACKs still owed (IBA 9.7.5.1.5), and an
// ACK still queued when the next request of the same receive burst arrives
// is replaced by the later one (an ACK acknowledges every PSN up to its
// own), so a burst of requests costs one ACK frame, not one per message.
// The engine sends the queue in the same loop turn (PollSend on the QP,
// which HasResponses makes active).
void Qp::QueueAck(const wire::PacketView& req, wire::Aeth aeth, uint32_t psn, uint8_t dups) {
  if (resp_head_ != resp_tail_) {
    Response& tail = responses_[(resp_tail_ - 1) % responses_.size()];
    if (tail.kind == Response::kAck && (tail.syndrome >> 5) == 0 && aeth.type() == wire::AckType::kAck) {
      tail.psn = psn;  // coalesce: a later ACK acknowledges everything before it
      tail.msn = aeth.msn;
      if (tail.sr) tail.sack_run = static_cast<uint8_t>(std::min(63, tail.sack_run + dups));
      if (tail.sr) sr_announced_ = true;
      Count(QpCounter::ack_coalesced);
      return;
    }
    if (resp_tail_ - resp_head_ >= responses_.size()) {
      Count(QpCounter::tx_dropped);  // the requester's timer recovers
      return;
    }
  }
  Response& r = responses_[resp_tail_++ % responses_.size()];
  r = Response{};
  r.kind = Response::kAck;
  r.psn = psn;
  r.msn = aeth.msn;
  r.syndrome = aeth.syndrome;
  // Tells a selective-repeat requester that this responder has it too (a
  // NAK without it is plain go-back-N's).
  r.sr = sr_.on && req.bth.sr && aeth.type() == wire::AckType::kAck;
  if (r.sr) sr_announced_ = true;
  if (r.sr) r.sack_run = std::min<uint8_t>(dups, 63);
  r.dmac = req.smac;
  r.dgid = req.sip6;
}

bool Qp::TakeRecvWqe(bool* bad) {
  *bad = false;
  if (srq_ != nullptr) {
    if (!srq_->Take(&recv_.wqe, recv_sge_.data(), static_cast<uint32_t>(recv_sge_.size()), bad)) return false;
  } else {
    const uint32_t prod = rq_.load_prod_acquire();
    if (rq_cons_ == prod) return false;
    if (RingCorrupt(rq_, prod, rq_cons_)) {
      LocalCatastrophe();
      return false;
    }
    const uint8_t* slot = rq_.slot(rq_cons_);
    std::memcpy(&recv_.wqe, slot, sizeof(recv_.wqe));
    ++rq_cons_;
    *bad = recv_.wqe.num_sge > caps_.max_recv_sge;
    if (!*bad) std::memcpy(recv_sge_.data(), slot + sizeof(queue::RecvWqe), sizeof(queue::Sge) * recv_.wqe.num_sge);
    rq_.publish_cons(rq_cons_);
  }
  if (*bad) {
    Count(QpCounter::bad_wqe);
    recv_.wqe.num_sge = 0;
  }
  recv_.active = true;
  recv_.offset = 0;
  return true;
}

// Places `len` bytes at the receive WQE's current offset.
bool Qp::Scatter(const uint8_t* src, uint32_t len, uint8_t* status) {
  const SgeResult r = WalkSges(env_->Mrs(), pd_, recv_sge_.data(), recv_.wqe.num_sge, recv_.offset, len,
                               mem::kLocalWrite,
                               [&](const mem::Place& p, uint32_t done, uint32_t n) { return mem::WriteTo(p, src + done, n); });
  if (r == SgeResult::kAccess) {
    *status = queue::wc::kLocProtErr;
    return false;
  }
  if (r == SgeResult::kShort) {
    *status = queue::wc::kLocLenErr;  // the message is longer than the buffers
    return false;
  }
  recv_.offset += len;
  return true;
}

bool Qp::StartWrite(const wire::Reth& reth) {
  if (reth.dma_len != 0 &&
      env_->Mrs().Check(reth.rkey, pd_, reth.va, reth.dma_len, mem::kRemoteWrite) != mem::AccessError::kOk) {
    return false;
  }
  write_rkey_ = reth.rkey;
  write_va_ = reth.va;
  write_remaining_ = write_len_ = reth.dma_len;
  return true;
}

bool Qp::PlaceWrite(const uint8_t* src, uint32_t len, bool atomic) {
  if (len == 0) return true;
  mem::Place place;
  if (env_->Mrs().Check(write_rkey_, pd_, write_va_, len, mem::kRemoteWrite, &place) != mem::AccessError::kOk) {
    return false;
  }
  if (atomic && place.pid == 0 && reinterpret_cast<uintptr_t>(place.host) % 8 == 0) {
    // One 8-byte store that no reader sees half done (ATOMIC WRITE).
    uint64_t v;
    std::memcpy(&v, src, 8);
    std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(place.host)).store(v, std::memory_order_release);
  } else if (!mem::WriteTo(place, src, len)) {
    return false;
  }
  write_va_ += len;
  write_remaining_ -= len;
  return true;
}

void Qp::CompleteRecv(uint8_t status, bool solicited, const wire::PacketView* pkt, bool with_imm,
                      uint8_t opcode) {
  queue::Cqe c{};
  c.wr_id = recv_.wqe.wr_id;
  c.status = status;
  c.opcode = opcode;
  c.byte_len = recv_.offset;
  c.qp_num = qpn_;
  c.src_qp = attr_.dest_qpn;
  if (with_imm && pkt != nullptr) {
    std::memcpy(&c.imm_data, pkt->ext(pkt->info->immdt), 4);
    c.wc_flags |= queue::wc::kFlagWithImm;
  }
  if (pkt != nullptr && pkt->info->ieth) {
    c.imm_data = wire::load_be32(pkt->ext(pkt->info->ieth));  // the invalidated rkey
    c.wc_flags |= queue::wc::kFlagWithInv;
  }
  recv_.active = false;
  if (status == queue::wc::kLocLenErr) Count(QpCounter::resp_local_length_error);
  PushRecvCqe(c, solicited);
}

// A class C/D error at the responder (IBA 9.9.3.1): NAK, fail the receive in
// progress, raise the async event and go to the error state.
void Qp::ResponderFatal(const wire::PacketView& pkt, wire::NakCode code, uint8_t recv_status) {
  if (code == wire::NakCode::kRemoteAccessError) {
    Count(QpCounter::send_rem_access_err);
    Raise(QpEvent::kAccessErr);
  } else if (code == wire::NakCode::kInvalidRequest) {
    Count(QpCounter::send_inv_req_err);
    Raise(QpEvent::kReqErr);
  }
  SendAck(pkt, wire::Aeth::nak(msn_, code), pkt.bth.psn);
  if (recv_.active) CompleteRecv(recv_status, false, nullptr, false);
  EnterError();
}

bool Qp::FindXrcSrqOf(const wire::PacketView& pkt, XrcSrqRef* r) {
  const uint32_t srqn = wire::load_be32(pkt.ext(pkt.info->xrceth)) & 0xFFFFFF;
  return env_->FindXrcSrq(srqn, r) && r->xrcd == xrcd_;
}

Qp::RespStep Qp::SelectXrcSrq(const wire::PacketView& pkt) {
  const uint32_t srqn = wire::load_be32(pkt.ext(pkt.info->xrceth)) & 0xFFFFFF;
  // Looked up on every request: an SRQ may go between two packets (the
  // control path drops it from this QP first: DropXrcSrq).
  XrcSrqRef r;
  const bool found = FindXrcSrqOf(pkt, &r);
  // A message continues on the SRQ it started on (its receive WQE is that
  // SRQ's).
  const bool switched = (in_send_message_ || in_write_message_) && srqn != xrc_srqn_;
  if (!found || switched) {
    // IBA 9.8.3: an XRCETH naming no SRQ of the target's domain is an
    // invalid request (class C): NAK, error. The WQE in progress, if any,
    // completes in error on its own SRQ's CQ.
    Count(QpCounter::xrc_bad_srqn);
    if (recv_.active && recv_cq_ == nullptr) recv_.active = false;
    return RespStep::kInvalidRequest;
  }
  srq_ = r.srq;
  recv_cq_ = r.cq;
  pd_ = r.pd;
  xrc_srqn_ = srqn;
  xrc_srq_id_ = r.id;
  return RespStep::kNext;
}

// Selective repeat (docs/LAB.md): a request from a selective-repeat
// requester that arrives after a gap is held, not dropped, and SACKed; once
// the gap is filled the held requests run in PSN order, as if they had just
// arrived, so every ordering rule of the in-order responder holds (READ and
// atomic execution order, RNR, the opcode sequence, WRITE placement).
void Qp::OnRequest(const wire::PacketView& pkt) {
  if (sr_held_count_ == 0) {
    ExecuteRequest(pkt);
    return;
  }
  const uint32_t before = epsn_;
  const bool expected = pkt.bth.psn == epsn_;
  if (expected) {
    // Resent while a copy was held: run this one, forget the copy.
    SrHeld& h = sr_held_[pkt.bth.psn & (sr_.window - 1)];
    if (h.view.frame_len != 0 && h.psn == pkt.bth.psn) {
      h.view.frame_len = 0;
      --sr_held_count_;
    }
  }
  ExecuteRequest(pkt);
  if (epsn_ != before) {
    if (!sr_draining_) SrDrain(pkt);
  } else if (expected) {
    // Not executed (RNR, an error): the requester goes back to this PSN
    // and sends everything after it again.
    SrDropHeld();
  }
}

bool Qp::SrHold(const wire::PacketView& pkt) {
  const uint32_t d = static_cast<uint32_t>(wire::psn_diff(pkt.bth.psn, epsn_));
  if (d >= sr_.window) return false;  // beyond the window: plain go-back-N's NAK
  if (sr_frames_ == nullptr) {
    // Allocated at the first hold: a frame of the path MTU with any headers.
    sr_frame_cap_ = mtu_bytes(attr_.path_mtu) + 256;
    sr_frames_ = std::make_unique<uint8_t[]>(size_t{sr_.window} * sr_frame_cap_);
    sr_held_.assign(sr_.window, SrHeld{});
  }
  if (pkt.frame_len > sr_frame_cap_) return false;
  const uint32_t slot = pkt.bth.psn & (sr_.window - 1);
  SrHeld& h = sr_held_[slot];
  if (h.view.frame_len == 0 || h.psn != pkt.bth.psn) {
    if (h.view.frame_len == 0) ++sr_held_count_;
    uint8_t* copy = &sr_frames_[size_t{slot} * sr_frame_cap_];
    std::memcpy(copy, pkt.frame.data(), pkt.frame_len);
    h.psn = pkt.bth.psn;
    // The parse holds: the view points into the copy (no second parse and
    // ICRC check when it runs).
    h.view = pkt;
    h.view.frame = std::span<const uint8_t>(copy, pkt.frame_len);
    h.view.payload = pkt.payload != nullptr ? copy + (pkt.payload - pkt.frame.data()) : nullptr;
    Count(QpCounter::sr_held_pkts);
  }
  // The SACK: a PSN sequence error NAK with the selective-repeat bit, whose
  // BTH PSN is the request received, whose MSN field is the cumulative
  // acknowledgement (the PSN expected next), and whose sr_run says how many
  // PSNs right before it are held too: a SACK still queued for the PSN
  // before grows instead of a new one (one per receive burst, not one per
  // packet). Sent again for every copy, in case the last one was lost.
  if (resp_head_ != resp_tail_) {
    Response& tail = responses_[(resp_tail_ - 1) % responses_.size()];
    if (tail.kind == Response::kAck && tail.sr && (tail.syndrome >> 5) == 3 && tail.msn == epsn_ &&
        wire::psn_add(tail.psn, 1) == pkt.bth.psn && tail.sack_run < 63) {
      tail.psn = pkt.bth.psn;
      ++tail.sack_run;
      return true;
    }
  }
  if (resp_tail_ - resp_head_ >= responses_.size()) {
    Count(QpCounter::tx_dropped);
    return true;
  }
  Response& r = responses_[resp_tail_++ % responses_.size()];
  r = Response{};
  r.kind = Response::kAck;
  r.psn = pkt.bth.psn;
  r.msn = epsn_;
  r.syndrome = wire::Aeth::nak(0, wire::NakCode::kPsnSeqError).syndrome;
  r.sr = true;
  r.dmac = pkt.smac;
  r.dgid = pkt.sip6;
  Count(QpCounter::sr_sack_sent);
  return true;
}

// Runs the held requests that follow the expected PSN, in order, then
// acknowledges everything done.
void Qp::SrDrain(const wire::PacketView& pkt) {
  sr_draining_ = true;
  bool ran = false;  // and every one ran: an RNR NAK must not be followed by an ACK
  while (sr_held_count_ != 0 && attr_.state != QpState::kErr) {
    SrHeld& h = sr_held_[epsn_ & (sr_.window - 1)];
    if (h.view.frame_len == 0 || h.psn != epsn_) break;
    h.view.frame_len = 0;
    --sr_held_count_;
    const uint32_t before = epsn_;
    ExecuteRequest(h.view);
    ran = true;
    if (epsn_ == before) {
      SrDropHeld();
      ran = false;
      break;
    }
  }
  sr_draining_ = false;
  if (ran && attr_.state != QpState::kErr) {
    QueueAck(pkt, wire::Aeth::ack(msn_), wire::psn_add(epsn_, wire::kPsnMask));
  }
}

void Qp::SrDropHeld() {
  if (sr_held_count_ == 0) return;
  for (SrHeld& h : sr_held_) h.view.frame_len = 0;
  sr_held_count_ = 0;
}

// An RC or XRC request, step by step as rxe_resp.c's states: its checks,
// its execution, its completion and its acknowledgement. The checks run in
// droce's order, which is not quite rxe's: the access flags before the
// opcode sequence (READ and atomics leave there), the length before the
// receive WQE. A step returns kNext to go on, or how the request ends,
// which EndRequest carries out when a NAK or an answer is owed.
void Qp::ExecuteRequest(const wire::PacketView& pkt) {
  const RespStep end = RequestSteps(pkt);
  if (end != RespStep::kDone) EndRequest(pkt, end);
}

Qp::RespStep Qp::RequestSteps(const wire::PacketView& pkt) {
  using enum RespStep;
  RespStep s;
  if ((s = CheckQpState()) != kNext) return s;
  if ((s = CheckTransport(pkt)) != kNext) return s;
  if ((s = CheckPsn(pkt)) != kNext) return s;
  // The expected request: an XRC target takes the SRQ it names (not
  // before: duplicates and requests past a gap name SRQs of other messages).
  if (type_ == QpType::kXrcTgt && (s = SelectXrcSrq(pkt)) != kNext) return s;
  NoteInSequence();
  // The opcode's headers and kind, read once: every step after this needs
  // them, and the calls between steps would make the compiler read them again.
  const uint32_t mask = pkt.info->mask;
  if ((s = CheckOpValid(mask)) != kNext) return s;
  // READ and atomics go their own way from here (responder_rd.cc): their
  // R_Key, their place in the queue of owed responses, their execution.
  if (mask & wire::kMaskRead) {
    OnReadRequest(pkt, false, pd_);
    return kDone;
  }
  if (mask & wire::kMaskAtomic) {
    OnAtomicRequest(pkt, false);
    return kDone;
  }
  if ((s = CheckOpSeq(mask)) != kNext) return s;
  if ((s = CheckLength(pkt, mask)) != kNext) return s;
  if ((s = CheckResource(mask)) != kNext) return s;
  if (mask & wire::kMaskSend) {
    if ((s = ExecuteSend(pkt)) != kNext) return s;
  } else {
    // Accepted (a WRITE that needed a receive WQE has one): one more WRITE
    // message, counted at its FIRST or ONLY packet.
    if (mask & wire::kMaskFirst) Count(QpCounter::rx_write_requests);
    if ((s = CheckRkey(pkt, mask)) != kNext) return s;
    if ((s = ExecuteWrite(pkt, mask)) != kNext) return s;
  }
  if ((s = CompleteRequest(pkt, mask)) != kNext) return s;
  AcknowledgeRequest(pkt);
  return kDone;
}

// Requests reach a QP in RTR, RTS or SQD only.
Qp::RespStep Qp::CheckQpState() {
  if (attr_.state != QpState::kRtr && attr_.state != QpState::kRts && attr_.state != QpState::kSqd) {
    Count(QpCounter::qp_state_drop);
    return RespStep::kDone;
  }
  return RespStep::kNext;
}

// Only its transport's opcodes reach a QP (IBA 9.6.1.1.2): RC on RC, XRC
// on an XRC target.
Qp::RespStep Qp::CheckTransport(const wire::PacketView& pkt) {
  if (wire::opcode_transport(pkt.bth.opcode) != wire::opcode_transport(op_base_)) {
    Count(QpCounter::malformed_pkts);
    return RespStep::kDone;
  }
  return RespStep::kNext;
}

// The request's PSN against the one expected: the expected request goes on;
// one past it is out of sequence (9.7.5.1.1), one before it a duplicate
// (9.7.5.1.2).
Qp::RespStep Qp::CheckPsn(const wire::PacketView& pkt) const {
  const int32_t d = wire::psn_diff(pkt.bth.psn, epsn_);
  if (d > 0) return RespStep::kOutOfSequence;
  if (d < 0) return RespStep::kDuplicate;
  return RespStep::kNext;
}

// The expected PSN arrived: a later gap is NAKed again, and the first
// request received in RTR establishes communication.
void Qp::NoteInSequence() {
  nak_sent_ = false;
  if (attr_.state == QpState::kRtr && !comm_est_raised_) {
    comm_est_raised_ = true;  // once: the first request received in RTR (IBA 11.6.3)
    Raise(QpEvent::kCommEst);
  }
}

// The QP's access flags gate incoming RDMA (IBA 10.2.3; rxe: invalid request).
Qp::RespStep Qp::CheckOpValid(uint32_t mask) {
  const uint32_t need = (mask & wire::kMaskRead) ? mem::kRemoteRead
                        : (mask & wire::kMaskWrite) ? mem::kRemoteWrite
                        : (mask & wire::kMaskAtomic) ? mem::kRemoteAtomic : 0u;
  if (need != 0 && !(attr_.access_flags & need)) return RespStep::kInvalidRequest;
  return RespStep::kNext;
}

// Opcode sequence (9.7.5.1.3): FIRST/ONLY only between messages,
// MIDDLE/LAST only inside a message of the same kind.
Qp::RespStep Qp::CheckOpSeq(uint32_t mask) const {
  const bool first = mask & wire::kMaskFirst;
  const bool is_send = mask & wire::kMaskSend;
  const bool in_msg = in_send_message_ || in_write_message_;
  if (first == in_msg || (!first && (is_send ? !in_send_message_ : !in_write_message_))) {
    return RespStep::kInvalidRequest;
  }
  return RespStep::kNext;
}

// FIRST and MIDDLE carry exactly one path MTU; nothing carries more.
Qp::RespStep Qp::CheckLength(const wire::PacketView& pkt, uint32_t mask) const {
  const uint32_t mtu = mtu_bytes(attr_.path_mtu);
  const bool last = mask & wire::kMaskLast;
  if (pkt.payload_len > mtu || (!last && pkt.payload_len != mtu)) return RespStep::kInvalidRequest;
  return RespStep::kNext;
}

// The receive WQE a message consumes: a SEND's at its FIRST packet, a
// WRITE with immediate's at its LAST.
Qp::RespStep Qp::CheckResource(uint32_t mask) {
  const bool first = mask & wire::kMaskFirst;
  const bool last = mask & wire::kMaskLast;
  const bool is_send = mask & wire::kMaskSend;
  const bool needs_wqe = (mask & wire::kMaskRecvWqe) && (is_send ? first : last);
  if (!needs_wqe) return RespStep::kNext;
  bool bad = false;
  if (!TakeRecvWqe(&bad)) return RespStep::kRnr;
  if (bad) return RespStep::kLocalLength;
  return RespStep::kNext;
}

// Places a SEND packet's payload in the receive WQE's buffers.
Qp::RespStep Qp::ExecuteSend(const wire::PacketView& pkt) {
  uint8_t status = queue::wc::kSuccess;
  if (!Scatter(pkt.payload, pkt.payload_len, &status)) {
    // Local length or protection error at the responder (9.7.5.2.4 / 10.8.3).
    return status == queue::wc::kLocLenErr ? RespStep::kLocalLength : RespStep::kLocalProtection;
  }
  return RespStep::kNext;
}

// A WRITE packet against its RETH and the WRITE in progress: the rkey of
// the whole range at the FIRST packet, what is left of it at every packet.
Qp::RespStep Qp::CheckRkey(const wire::PacketView& pkt, uint32_t mask) {
  if (mask & wire::kMaskAtomicWrite) {
    // IBA 1.5 ATOMIC WRITE: exactly 8 naturally aligned bytes (as atomics,
    // 9.4.5), needing remote write rights like any WRITE.
    const wire::Reth reth = wire::read_reth(pkt.ext(pkt.info->reth));
    if (reth.dma_len != 8 || reth.va % 8 != 0 || pkt.payload_len != 8) return RespStep::kInvalidRequest;
  }
  if ((mask & wire::kMaskFirst) && !StartWrite(wire::read_reth(pkt.ext(pkt.info->reth)))) {
    return RespStep::kRemoteAccess;
  }
  // The packets must add up to exactly the RETH's length (9.7.5.1.3).
  if (pkt.payload_len > write_remaining_ || ((mask & wire::kMaskLast) && pkt.payload_len != write_remaining_)) {
    return RespStep::kInvalidRequest;
  }
  return RespStep::kNext;
}

// Places a WRITE packet's payload.
Qp::RespStep Qp::ExecuteWrite(const wire::PacketView& pkt, uint32_t mask) {
  // The region may have been deregistered, or the window invalidated or
  // unbound, since the FIRST packet: that is an invalid R_Key now (class C,
  // NAK remote access error), and not a byte of this packet is placed.
  const bool atomic_write = mask & wire::kMaskAtomicWrite;
  if (!PlaceWrite(pkt.payload, pkt.payload_len, atomic_write)) {
    return RespStep::kRemoteAccess;
  }
  return RespStep::kNext;
}

// The packet is executed: the next PSN is expected and the message goes on,
// or at its LAST packet ends: the MSN counts it, a SEND with invalidate
// invalidates, and its receive WQE (a SEND's, a WRITE with immediate's)
// completes.
Qp::RespStep Qp::CompleteRequest(const wire::PacketView& pkt, uint32_t mask) {
  const bool last = mask & wire::kMaskLast;
  const bool is_send = mask & wire::kMaskSend;
  epsn_ = wire::psn_add(epsn_, 1);
  if (is_send) in_send_message_ = !last;
  else in_write_message_ = !last;
  if (!last) return RespStep::kNext;
  msn_ = (msn_ + 1) & wire::kPsnMask;
  if (is_send && pkt.info->ieth) {
    // SEND with invalidate (IBA 10.6.7.2.1): the rkey must name something
    // invalidatable on this QP's PD.
    if (!env_->InvalidateRkey(wire::load_be32(pkt.ext(pkt.info->ieth)), pd_)) {
      msn_ = (msn_ - 1) & wire::kPsnMask;
      epsn_ = wire::psn_add(epsn_, wire::kPsnMask);
      return RespStep::kRemoteOperational;
    }
  }
  if (is_send) {
    CompleteRecv(queue::wc::kSuccess, pkt.bth.se, &pkt, (mask & wire::kMaskImmDt) != 0);
  } else if (mask & wire::kMaskImmDt) {
    recv_.offset = write_len_;
    CompleteRecv(queue::wc::kSuccess, pkt.bth.se, &pkt, true, queue::wc::kOpRecvRdmaWithImm);
  }
  if (attr_.state == QpState::kErr) return RespStep::kDone;  // the completion could not be entered: no ACK
  return RespStep::kNext;
}

// A selective-repeat requester's first request is acknowledged at once,
// AckReq or not: the ACK carries the bit, which turns selective repeat on
// at the requester before its first loss (its retransmission timeout
// then covers a lost last packet of the first message too).
void Qp::AcknowledgeRequest(const wire::PacketView& pkt) {
  if (pkt.bth.ackreq || (pkt.bth.sr && sr_.on && !sr_announced_)) {
    QueueAck(pkt, wire::Aeth::ack(msn_), pkt.bth.psn);
  }
}

// A request that did not reach the end of the steps: what it still owes.
void Qp::EndRequest(const wire::PacketView& pkt, RespStep end) {
  switch (end) {
    case RespStep::kNext:
    case RespStep::kDone:
      return;
    case RespStep::kOutOfSequence:
      OutOfSequenceRequest(pkt);
      return;
    case RespStep::kDuplicate:
      DuplicateRequest(pkt);
      return;
    case RespStep::kRnr:
      // No receive WQE: RNR NAK, the requester retries after min_rnr_timer.
      Count(QpCounter::send_rnr_err);
      if (attr_.state != QpState::kErr) Count(QpCounter::out_of_buffer);  // not a corrupt ring
      QueueAck(pkt, wire::Aeth::rnr_nak(msn_, attr_.min_rnr_timer), pkt.bth.psn);
      return;
    case RespStep::kInvalidRequest:
      ResponderFatal(pkt, wire::NakCode::kInvalidRequest, queue::wc::kRemInvReqErr);
      return;
    case RespStep::kLocalLength:
      ResponderFatal(pkt, wire::NakCode::kInvalidRequest, queue::wc::kLocLenErr);
      return;
    case RespStep::kLocalProtection:
      ResponderFatal(pkt, wire::NakCode::kRemoteOperationalError, queue::wc::kLocProtErr);
      return;
    case RespStep::kRemoteAccess:
      ResponderFatal(pkt, wire::NakCode::kRemoteAccessError, queue::wc::kRemAccessErr);
      return;
    case RespStep::kRemoteOperational:
      ResponderFatal(pkt, wire::NakCode::kRemoteOperationalError, queue::wc::kRemOpErr);
      return;
  }
}

// A gap: NAK once, then drop until the expected PSN arrives (9.7.5.1.1);
// a selective-repeat requester's request is held and SACKed instead.
void Qp::OutOfSequenceRequest(const wire::PacketView& pkt) {
  Count(QpCounter::out_of_seq_request);
  if (pkt.bth.sr && sr_.on && SrHold(pkt)) return;
  if (!nak_sent_) {
    nak_sent_ = true;
    QueueAck(pkt, wire::Aeth::nak(msn_, wire::NakCode::kPsnSeqError), epsn_);
  }
}

// A duplicate (9.7.5.1.2): a READ is executed again, an atomic replays its
// saved result, anything else is acknowledged without executing.
void Qp::DuplicateRequest(const wire::PacketView& pkt) {
  Count(QpCounter::duplicate_request);
  const uint32_t mask = pkt.info->mask;
  if (mask & wire::kMaskRead) {
    // An XRC READ is executed again on the PD of the SRQ it names, which
    // need not be the message in progress's (nor exist any more).
    XrcSrqRef r;
    if (type_ != QpType::kXrcTgt) OnReadRequest(pkt, true, pd_);
    else if (FindXrcSrqOf(pkt, &r)) OnReadRequest(pkt, true, r.pd);
  }
  else if (mask & wire::kMaskAtomic) OnAtomicRequest(pkt, true);
  // A selective-repeat requester resends a packet only when it took it
  // for lost: this one was not, and the ACK says so (its needless resends,
  // sr_spurious_resends there).
  else QueueAck(pkt, wire::Aeth::ack(msn_), wire::psn_add(epsn_, wire::kPsnMask), (pkt.bth.sr && sr_.on) ? 1 : 0);
}

// UC (IBA 9.8.3): no ACKs; a PSN gap drops the message in progress and
// everything up to the next FIRST or ONLY.
void Qp::OnUnreliableRequest(const wire::PacketView& pkt) {
  if (attr_.state != QpState::kRtr && attr_.state != QpState::kRts && attr_.state != QpState::kSqd) {
    Count(QpCounter::qp_state_drop);
    return;
  }
  if ((pkt.bth.opcode >> 5) != 1) {
    Count(QpCounter::malformed_pkts);
    return;
  }
  const uint32_t mask = pkt.info->mask;
  const bool first = mask & wire::kMaskFirst;
  const bool last = mask & wire::kMaskLast;
  const bool is_send = mask & wire::kMaskSend;
  auto abort_message = [&] {
    if (in_send_message_ && recv_.active) recv_.offset = 0;  // the WQE is reused
    in_send_message_ = in_write_message_ = false;
  };
  const bool in_msg = in_send_message_ || in_write_message_;
  if (pkt.bth.psn != epsn_ || (first && in_msg)) {
    // A gap, or a new message before the last one ended: the message in
    // progress is lost; resynchronise on this packet's PSN.
    if (in_msg) {
      Count(QpCounter::dropped_msgs);
      abort_message();
    }
  }
  epsn_ = wire::psn_add(pkt.bth.psn, 1);
  if (!first && !(is_send ? in_send_message_ : in_write_message_)) {
    return;  // the rest of a dropped message
  }
  const uint32_t mtu = mtu_bytes(attr_.path_mtu);
  if (pkt.payload_len > mtu || (!last && pkt.payload_len != mtu)) {
    Count(QpCounter::dropped_msgs);
    abort_message();
    return;
  }
  if (is_send) {
    if (first && !recv_.active) {
      bool bad = false;
      if (!TakeRecvWqe(&bad)) {
        Count(QpCounter::dropped_msgs);  // UC has no RNR: the message is lost
        if (attr_.state != QpState::kErr) Count(QpCounter::out_of_buffer);
        return;
      }
      if (bad) {
        CompleteRecv(queue::wc::kLocLenErr, false, nullptr, false);
        return;
      }
    }
    if (first) recv_.offset = 0;
    uint8_t status = queue::wc::kSuccess;
    if (!Scatter(pkt.payload, pkt.payload_len, &status)) {
      Count(QpCounter::dropped_msgs);
      abort_message();
      return;
    }
    in_send_message_ = !last;
    if (last) CompleteRecv(queue::wc::kSuccess, pkt.bth.se, &pkt, (mask & wire::kMaskImmDt) != 0);
  } else {
    if (first && (!(attr_.access_flags & mem::kRemoteWrite) ||
                  !StartWrite(wire::read_reth(pkt.ext(pkt.info->reth))))) {
      Count(QpCounter::dropped_msgs);
      return;
    }
    if (pkt.payload_len > write_remaining_ || (last && pkt.payload_len != write_remaining_)) {
      Count(QpCounter::dropped_msgs);
      abort_message();
      return;
    }
    if (last && (mask & wire::kMaskImmDt) && !recv_.active) {
      bool bad = false;
      if (!TakeRecvWqe(&bad) || bad) {
        Count(QpCounter::dropped_msgs);
        if (!bad && attr_.state != QpState::kErr) Count(QpCounter::out_of_buffer);
        abort_message();
        return;
      }
    }
    // UC has no NAK (IBA 9.8.3): a region gone since the FIRST packet drops
    // the rest of the message, silently but counted.
    if (!PlaceWrite(pkt.payload, pkt.payload_len)) {
      Count(QpCounter::dropped_msgs);
      abort_message();
      return;
    }
    in_write_message_ = !last;
    if (last && (mask & wire::kMaskImmDt)) {
      recv_.offset = write_len_;
      CompleteRecv(queue::wc::kSuccess, pkt.bth.se, &pkt, true, queue::wc::kOpRecvRdmaWithImm);
    }
  }
}

// UD (IBA 9.8.4, annex A17.4.5.1): one packet per message; the receive
// buffer starts with a 40-byte GRH: for RoCEv2 over IPv6 the IPv6 header as
// received, over IPv4 20 zero bytes followed by the IPv4 header, as rxe and
// RoCE NICs write them.
void Qp::OnUdRequest(const wire::PacketView& pkt) {
  if (attr_.state != QpState::kRtr && attr_.state != QpState::kRts && attr_.state != QpState::kSqd) {
    Count(QpCounter::qp_state_drop);
    return;
  }
  if (pkt.bth.opcode != wire::kUdSendOnly && pkt.bth.opcode != wire::kUdSendOnlyImm) {
    Count(QpCounter::malformed_pkts);
    return;
  }
  const wire::Deth deth = wire::read_deth(pkt.ext(pkt.info->deth));
  if (deth.qkey != attr_.qkey) {
    Count(QpCounter::qkey_viol);
    return;
  }
  if (pkt.payload_len > mtu_bytes(attr_.path_mtu)) {
    Count(QpCounter::dropped_msgs);
    return;
  }
  bool bad = false;
  if (!TakeRecvWqe(&bad)) {
    Count(QpCounter::dropped_msgs);  // no receive WQE: UD drops the message
    if (attr_.state != QpState::kErr) Count(QpCounter::out_of_buffer);
    return;
  }
  if (bad) {
    CompleteRecv(queue::wc::kLocLenErr, false, nullptr, false);
    return;
  }
  uint8_t grh[40] = {};
  if (pkt.ipv6) std::memcpy(grh, pkt.frame.data() + pkt.l3_offset, wire::kIpv6Len);
  else std::memcpy(grh + 20, pkt.frame.data() + pkt.l3_offset, wire::kIpv4Len);
  uint8_t status = queue::wc::kSuccess;
  if (!Scatter(grh, sizeof(grh), &status) || !Scatter(pkt.payload, pkt.payload_len, &status)) {
    CompleteRecv(status, false, nullptr, false);
    return;
  }
  queue::Cqe c{};
  c.wr_id = recv_.wqe.wr_id;
  c.status = queue::wc::kSuccess;
  c.opcode = queue::wc::kOpRecv;
  c.byte_len = recv_.offset;
  c.qp_num = qpn_;
  c.src_qp = deth.src_qp;
  c.wc_flags = queue::wc::kFlagGrh;
  // RoCE UD completions carry the frame's L3 header type where IB carries
  // the SL (A17.4.5.1: the CQE tells IPv4 from IPv6), with mlx5's values:
  // 2 IPv4, 1 IPv6. Software that finds the GRH's addresses by it (UCX's
  // ud_verbs) reads wc.sl; rxe leaves it 0 and UCX then reads the wrong bytes.
  c.sl = pkt.ipv6 ? kRoceL3Ipv6 : kRoceL3Ipv4;
  if (pkt.info->immdt) {
    std::memcpy(&c.imm_data, pkt.ext(pkt.info->immdt), 4);
    c.wc_flags |= queue::wc::kFlagWithImm;
  }
  recv_.active = false;
  PushRecvCqe(c, pkt.bth.se);
}

}  // namespace droce::transport
