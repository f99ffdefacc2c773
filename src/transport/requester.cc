// RC requester: send WQEs → packets (IBA 9.7.1 – 9.7.4).
#include <cstring>

#include "transport/qp.h"
#include "wire/psn.h"

namespace droce::transport {
namespace {

// Packets in flight before the requester waits for an ACK.
constexpr uint32_t kMaxInflightPkts = 512;
// Ask for an ACK at least this often inside a long message.
constexpr uint32_t kAckReqEvery = 64;
// Largest message: IBA allows 2^31 bytes.
constexpr uint64_t kMaxMessage = 1ull << 31;

}  // namespace

// Snapshots the next posted WQE into private memory and validates it.
// Returns false if there is none or it failed (it is then completed in error).
bool Qp::FetchSendWqe() {
  if (sq_fetched_ == sq_.load_prod_acquire()) return false;
  const uint32_t slot = sq_fetched_ & (sq_.size() - 1);
  SendCtx& ctx = send_ctx_[slot];
  const uint8_t* src = sq_.slot(sq_fetched_);
  std::memcpy(&ctx.wqe, src, sizeof(ctx.wqe));
  const queue::SendWqe& w = ctx.wqe;
  uint8_t status = queue::wc::kSuccess;
  uint64_t total = 0;
  if (w.op != queue::WqeOp::kSend && w.op != queue::WqeOp::kSendImm) {
    status = queue::wc::kLocQpOpErr;  // other opcodes arrive with the full transport
  } else if (w.flags & queue::kWqeInline) {
    if (w.inline_len > caps_.max_inline) {
      status = queue::wc::kLocLenErr;
    } else {
      std::memcpy(&send_inline_[size_t{slot} * caps_.max_inline], src + sizeof(queue::SendWqe),
                  w.inline_len);
      total = w.inline_len;
    }
  } else if (w.num_sge > caps_.max_send_sge) {
    status = queue::wc::kLocLenErr;
  } else {
    queue::Sge* sges = &send_sge_[size_t{slot} * caps_.max_send_sge];
    std::memcpy(sges, src + sizeof(queue::SendWqe), sizeof(queue::Sge) * w.num_sge);
    for (unsigned i = 0; i < w.num_sge; ++i) total += sges[i].length;
  }
  if (status == queue::wc::kSuccess && total > kMaxMessage) status = queue::wc::kLocLenErr;
  ++sq_fetched_;
  ctx.total_len = static_cast<uint32_t>(total);
  const uint32_t mtu = mtu_bytes(attr_.path_mtu);
  ctx.npkts = total == 0 ? 1 : static_cast<uint32_t>((total + mtu - 1) / mtu);
  if (status != queue::wc::kSuccess) {
    // A hostile or malformed WQE: complete it in error, and the QP goes to
    // the error state as a local QP operation error requires (IBA 10.8.3.1).
    ++env_->Stats().bad_wqe;
    ctx.npkts = 0;
    // Every earlier WQE has been sent; this one completes after them.
    if (sq_comp_ == sq_send_ && unacked_psn_ == next_psn_) {
      queue::Cqe c{};
      c.wr_id = w.wr_id;
      c.status = status;
      c.qp_num = qpn_;
      PushSendCqe(c);
      ++sq_comp_;
      ++sq_send_;
      sq_.publish_cons(sq_comp_);
      EnterError();
    } else {
      --sq_fetched_;  // retry once the earlier WQEs have completed
    }
    return false;
  }
  return true;
}

uint32_t Qp::Gather(const SendCtx& ctx, uint32_t slot, uint32_t offset, uint32_t len, uint8_t* dst,
                    bool* prot_err) {
  if (ctx.wqe.flags & queue::kWqeInline) {
    std::memcpy(dst, &send_inline_[size_t{slot} * caps_.max_inline + offset], len);
    return len;
  }
  const queue::Sge* sges = &send_sge_[size_t{slot} * caps_.max_send_sge];
  uint32_t done = 0;
  for (unsigned i = 0; i < ctx.wqe.num_sge && done < len; ++i) {
    const queue::Sge& s = sges[i];
    if (offset >= s.length) {
      offset -= s.length;
      continue;
    }
    const uint32_t n = std::min(s.length - offset, len - done);
    uint8_t* host = nullptr;
    // Checked on every use: the MR may have been deregistered since posting.
    if (env_->Mrs().Check(s.lkey, pd_, s.addr + offset, n, 0, &host) != mem::AccessError::kOk) {
      *prot_err = true;
      return done;
    }
    std::memcpy(dst + done, host, n);
    done += n;
    offset = 0;
  }
  return done;
}

bool Qp::BuildRequestPacket(SendCtx& ctx, uint32_t pkt) {
  const uint32_t mtu = mtu_bytes(attr_.path_mtu);
  const bool first = pkt == 0;
  const bool last = pkt + 1 == ctx.npkts;
  const bool imm = ctx.wqe.op == queue::WqeOp::kSendImm && last;
  uint8_t opcode;
  if (first && last) opcode = imm ? wire::kRcSendOnlyImm : wire::kRcSendOnly;
  else if (first) opcode = wire::kRcSendFirst;
  else if (last) opcode = imm ? wire::kRcSendLastImm : wire::kRcSendLast;
  else opcode = wire::kRcSendMiddle;
  const wire::OpcodeInfo& info = wire::opcode_info(opcode);

  const uint32_t offset = pkt * mtu;
  const uint32_t len = last ? ctx.total_len - offset : mtu;
  const uint32_t pad = (4 - (len & 3)) & 3;
  const uint32_t roce_len = info.length + len + pad + wire::kIcrcLen;
  const uint32_t frame_len = wire::kRoceV4HeadLen + roce_len;
  TxFrame f;
  if (!env_->AllocFrame(frame_len, &f)) return false;

  const unsigned bth_off = wire::write_outer_v4(f.data, PathTo(dmac_), roce_len, ip_id_++);
  uint8_t* bth = f.data + bth_off;
  wire::Bth b;
  b.opcode = opcode;
  b.se = last && (ctx.wqe.flags & queue::kWqeSolicited);
  b.pad = static_cast<uint8_t>(pad);
  b.dqpn = attr_.dest_qpn;
  b.psn = wire::psn_add(ctx.first_psn, pkt);
  b.ackreq = last || (pkt % kAckReqEvery) == kAckReqEvery - 1;
  wire::write_bth(bth, b);
  if (info.immdt) std::memcpy(bth + info.immdt, &ctx.wqe.imm_data, 4);  // already big-endian
  uint8_t* payload = bth + info.payload;
  bool prot_err = false;
  const uint32_t slot = static_cast<uint32_t>(&ctx - send_ctx_.data());
  Gather(ctx, slot, offset, len, payload, &prot_err);
  if (prot_err) {
    // Nothing is sent from memory the WQE may not read; the buffer goes back
    // with zero length. The WQE fails once it is the oldest outstanding one,
    // so that earlier WQEs keep their in-order completions.
    env_->SendFrame(f, 0);
    if (sq_send_ == sq_comp_) {
      ++env_->Stats().bad_wqe;
      queue::Cqe c{};
      c.wr_id = ctx.wqe.wr_id;
      c.status = queue::wc::kLocProtErr;
      c.qp_num = qpn_;
      PushSendCqe(c);
      ++sq_comp_;
      sq_send_ = sq_comp_;
      send_pkt_ = 0;
      sq_.publish_cons(sq_comp_);
      EnterError();
    }
    return false;
  }
  std::memset(payload + len, 0, pad);
  wire::finish_icrc_v4(f.data, frame_len);
  env_->SendFrame(f, frame_len);
  ++env_->Stats().sent_pkts;
  return true;
}

bool Qp::PollSend(unsigned budget) {
  if (attr_.state != QpState::kRts) {
    if (attr_.state == QpState::kErr) FlushAll();
    return false;
  }
  if (rnr_wait_) return false;
  if (!mac_valid_) {
    if (!env_->ResolveMac(dip_, &dmac_)) return true;  // keep polling while ARP resolves
    mac_valid_ = true;
  }
  unsigned sent = 0;
  while (sent < budget) {
    if (wire::psn_diff(next_psn_, unacked_psn_) >= static_cast<int32_t>(kMaxInflightPkts)) {
      return false;  // the window reopens on an ACK
    }
    if (sq_send_ == sq_fetched_) {
      if (!FetchSendWqe()) return false;
    }
    const uint32_t slot = sq_send_ & (sq_.size() - 1);
    SendCtx& ctx = send_ctx_[slot];
    if (send_pkt_ == 0 && next_psn_ == unacked_psn_ && sq_send_ == sq_comp_) {
      last_progress_ns_ = env_->NowNs();  // the timer starts with the first packet
    }
    if (send_pkt_ == 0) ctx.first_psn = next_psn_;
    if (!BuildRequestPacket(ctx, send_pkt_)) return attr_.state == QpState::kRts;
    ++sent;
    next_psn_ = wire::psn_add(next_psn_, 1);
    if (++send_pkt_ == ctx.npkts) {
      send_pkt_ = 0;
      ++sq_send_;
    }
  }
  return true;
}

}  // namespace droce::transport
