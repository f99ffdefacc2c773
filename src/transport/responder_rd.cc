// Responder for RDMA READ and atomics (IBA 9.7.5.1.4 – 9.7.5.1.6), and the
// queue of responses it owes. READ responses are generated a burst at a time
// from PollSend, so a 2 GiB READ does not flood the link in one go; ACKs
// queued behind them keep PSN order.
#include <cstring>
#include <vector>

#include "transport/qp.h"
#include "wire/psn.h"

namespace droce::transport {

void Qp::OnReadRequest(const wire::PacketView& pkt, bool duplicate, uint32_t pd) {
  const wire::Reth reth = wire::read_reth(pkt.ext(pkt.info->reth));
  const uint32_t mtu = mtu_bytes(attr_.path_mtu);
  const uint32_t npkts = reth.dma_len == 0 ? 1 : (reth.dma_len + mtu - 1) / mtu;
  if (reth.dma_len != 0 &&
      env_->Mrs().Check(reth.rkey, pd, reth.va, reth.dma_len, mem::kRemoteRead) != mem::AccessError::kOk) {
    if (!duplicate) ResponderFatal(pkt, wire::NakCode::kRemoteAccessError, queue::wc::kRemAccessErr);
    return;
  }
  if (resp_tail_ - resp_head_ >= responses_.size()) {
    Count(QpCounter::tx_dropped);  // more than max_dest_rd_atomic outstanding: the requester retries
    return;
  }
  if (!duplicate) {
    epsn_ = wire::psn_add(epsn_, npkts);  // a READ occupies one PSN per response
    msn_ = (msn_ + 1) & wire::kPsnMask;
    Count(QpCounter::rx_read_requests);
  }
  Response& r = responses_[resp_tail_++ % responses_.size()];
  r = Response{};
  r.kind = Response::kRead;
  r.sr = sr_.on && pkt.bth.sr;  // tells a READ-only requester too
  r.psn = pkt.bth.psn;
  r.msn = msn_;
  r.va = reth.va;
  r.rkey = reth.rkey;
  r.pd = pd;
  r.remaining = reth.dma_len;
  r.dmac = pkt.smac;
  r.dgid = pkt.sip6;
}

void Qp::OnAtomicRequest(const wire::PacketView& pkt, bool duplicate) {
  const uint32_t psn = pkt.bth.psn;
  uint64_t orig = 0;
  if (duplicate) {
    // Never execute an atomic twice: replay the saved result, or drop the
    // request if it is older than what we remember.
    bool found = false;
    for (const AtomicRecord& a : atomic_history_) {
      if (a.valid && a.psn == psn) {
        orig = a.orig;
        found = true;
        break;
      }
    }
    if (!found) return;
  } else {
    const wire::AtomicEth a = wire::read_atomic_eth(pkt.ext(pkt.info->atomic_eth));
    if (a.va % 8 != 0) {  // atomics are naturally aligned (9.4.5)
      ResponderFatal(pkt, wire::NakCode::kInvalidRequest, queue::wc::kRemInvReqErr);
      return;
    }
    mem::Place place;
    if (env_->Mrs().Check(a.rkey, pd_, a.va, 8, mem::kRemoteAtomic, &place) != mem::AccessError::kOk) {
      ResponderFatal(pkt, wire::NakCode::kRemoteAccessError, queue::wc::kRemAccessErr);
      return;
    }
    if (resp_tail_ - resp_head_ >= responses_.size()) {
      Count(QpCounter::tx_dropped);
      return;
    }
    if (!mem::Atomic(place, wire::opcode_operation(pkt.bth.opcode) == wire::kRcCompareSwap, a.compare, a.swap_add, &orig)) {
      ResponderFatal(pkt, wire::NakCode::kRemoteAccessError, queue::wc::kRemAccessErr);
      return;
    }
    Count(QpCounter::rx_atomic_requests);
    AtomicRecord& rec = atomic_history_[atomic_next_++ % atomic_history_.size()];
    rec = {psn, orig, true};
    epsn_ = wire::psn_add(epsn_, 1);
    msn_ = (msn_ + 1) & wire::kPsnMask;
  }
  if (resp_tail_ - resp_head_ >= responses_.size()) return;
  Response& r = responses_[resp_tail_++ % responses_.size()];
  r = Response{};
  r.kind = Response::kAtomicAck;
  r.sr = sr_.on && pkt.bth.sr;
  r.psn = psn;
  r.msn = msn_;
  r.orig = orig;
  r.dmac = pkt.smac;
  r.dgid = pkt.sip6;
}

// An ACK/NAK (AETH with r's syndrome) or, for an atomic, an ATOMIC
// ACKNOWLEDGE carrying the original value.
bool Qp::BuildAck(const Response& r) {
  const bool atomic = r.kind == Response::kAtomicAck;
  const uint8_t opcode = op_base_ | (atomic ? wire::kRcAtomicAck : wire::kRcAck);
  const wire::OpcodeInfo& info = wire::opcode_info(opcode);
  const uint32_t roce_len = info.length + wire::kIcrcLen;
  const wire::Path path = PathTo(r.dmac, r.dgid, attr_.av);
  const uint32_t frame_len = wire::outer_len(path) + roce_len;
  TxFrame f;
  if (!env_->AllocFrame(frame_len, &f)) return false;
  const unsigned bth_off = wire::write_outer(f.data, path, roce_len, ip_id_++);
  wire::Bth b;
  b.opcode = opcode;
  b.dqpn = attr_.dest_qpn;
  b.psn = r.psn;
  b.sr = r.sr;
  b.sr_run = r.sack_run;
  wire::write_bth(f.data + bth_off, b);
  wire::write_aeth(f.data + bth_off + info.aeth, atomic ? wire::Aeth::ack(r.msn) : wire::Aeth{r.syndrome, r.msn});
  if (atomic) wire::store_be64(f.data + bth_off + info.atomic_ack_eth, r.orig);
  wire::finish_icrc(f.data, frame_len);
  Transmit(f, frame_len, b, atomic ? 0 : r.syndrome);
  return true;
}

// Sends the next packet of a READ response; r advances.
bool Qp::BuildReadResponse(Response& r) {
  const uint32_t mtu = mtu_bytes(attr_.path_mtu);
  const uint32_t len = std::min(r.remaining, mtu);
  const bool last = r.remaining <= mtu;
  uint8_t opcode;
  if (r.first && last) opcode = wire::kRcReadResponseOnly;
  else if (r.first) opcode = wire::kRcReadResponseFirst;
  else if (last) opcode = wire::kRcReadResponseLast;
  else opcode = wire::kRcReadResponseMiddle;
  opcode |= op_base_;
  const wire::OpcodeInfo& info = wire::opcode_info(opcode);
  mem::Place place;
  // Checked per packet: the MR may be deregistered while the READ runs.
  // Memory of another process (droced's copy tier) is read before a frame
  // is taken, so that a failed read becomes the same NAK.
  thread_local std::vector<uint8_t> remote;
  const uint8_t* src = nullptr;
  bool bad = len != 0 && env_->Mrs().Check(r.rkey, r.pd, r.va, len, mem::kRemoteRead, &place) != mem::AccessError::kOk;
  if (!bad && len != 0) {
    if (place.pid == 0) {
      src = place.host;
    } else {
      remote.resize(len);
      bad = !mem::ReadFrom(remote.data(), place, len);
      src = remote.data();
    }
  }
  if (bad) {
    Response nak = r;
    nak.syndrome = wire::Aeth::nak(r.msn, wire::NakCode::kRemoteAccessError).syndrome;
    Count(QpCounter::send_rem_access_err);
    if (!BuildAck(nak)) return false;
    r.finished = true;
    return true;
  }
  const uint32_t pad = (4 - (len & 3)) & 3;
  const uint32_t roce_len = info.length + len + pad + wire::kIcrcLen;
  wire::Path path = PathTo(r.dmac, r.dgid, attr_.av);
  MarkEct(&path);
  const uint32_t frame_len = wire::outer_len(path) + roce_len;
  TxFrame f;
  if (!env_->AllocFrame(frame_len, &f)) return false;
  const unsigned bth_off = wire::write_outer(f.data, path, roce_len, ip_id_++);
  uint8_t* bth = f.data + bth_off;
  wire::Bth b;
  b.opcode = opcode;
  b.pad = static_cast<uint8_t>(pad);
  b.dqpn = attr_.dest_qpn;
  b.psn = r.psn;
  b.sr = r.sr;
  wire::write_bth(bth, b);
  if (info.aeth) wire::write_aeth(bth + info.aeth, wire::Aeth::ack(r.msn));
  if (len != 0) std::memcpy(bth + info.payload, src, len);
  std::memset(bth + info.payload + len, 0, pad);
  wire::finish_icrc(f.data, frame_len);
  Transmit(f, frame_len, b);
  r.psn = wire::psn_add(r.psn, 1);
  r.va += len;
  r.remaining -= len;
  r.first = false;
  r.finished = last;
  return true;
}

// Drains owed responses in order; returns true while some remain.
bool Qp::SendResponses(unsigned* budget) {
  while (resp_head_ != resp_tail_ && *budget > 0) {
    Response& r = responses_[resp_head_ % responses_.size()];
    bool done = false;
    switch (r.kind) {
      case Response::kAck:
      case Response::kAtomicAck:
        if (!BuildAck(r)) return true;
        done = true;
        break;
      case Response::kRead:
        if (!BuildReadResponse(r)) return true;
        done = r.finished;
        break;
    }
    --*budget;
    if (done) ++resp_head_;
  }
  return resp_head_ != resp_tail_;
}

// Before the QP leaves for the error state (a modify to ERR: rdma_disconnect
// does one before the QP is destroyed), the plain ACKs still queued go out:
// they acknowledge requests already executed, a SEND's receive completion
// already visible to the application. Dropped, they would leave the peer
// resending a message that was delivered to a QP that is gone, until its
// retries run out (fio's server took its client's last SEND, disconnected
// and exited before the turn that would have sent the ACK; rxe ACKs on
// receipt). Stops at the first READ response or atomic ACK: a later ACK
// would claim their PSNs, and an erroring QP sends no more data.
void Qp::SendQueuedAcks() {
  while (resp_head_ != resp_tail_) {
    const Response& r = responses_[resp_head_ % responses_.size()];
    if (r.kind != Response::kAck || !BuildAck(r)) return;
    ++resp_head_;
  }
}

}  // namespace droce::transport
