#include "transport/qp.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>

#include "wire/psn.h"

namespace droce::transport {

// Responses (ACKs, READ responses, atomic ACKs) a responder can owe at once,
// and atomic results it remembers for duplicates.
constexpr uint32_t kMaxResponses = 64;

const char* qp_state_name(QpState s) {
  switch (s) {
    case QpState::kReset: return "RESET";
    case QpState::kInit: return "INIT";
    case QpState::kRtr: return "RTR";
    case QpState::kRts: return "RTS";
    case QpState::kSqd: return "SQD";
    case QpState::kSqe: return "SQE";
    case QpState::kErr: return "ERR";
  }
  return "?";
}

uint64_t rnr_timer_ns(uint8_t code) {
  // IBA 9.7.5.2.8, table 45, in units of 0.01 ms: code 0 is the longest,
  // 655.36 ms.
  static constexpr uint32_t kTable[32] = {
      65536,    1,      2,      3,      4,      6,       8,       12,
      16,       24,     32,     48,     64,     96,      128,     192,
      256,      384,    512,    768,    1024,   1536,    2048,    3072,
      4096,     6144,   8192,   12288,  16384,  24576,   32768,   49152};
  return uint64_t{kTable[code & 31]} * 10000;  // table is in 0.01 ms
}

namespace {
// The transport bits of a QP type's opcodes (IBA 9.2): RC 000, UC 001,
// UD 011, XRC 101.
uint8_t OpBase(QpType t) {
  switch (t) {
    case QpType::kRc: return wire::kTransportRc << 5;
    case QpType::kUc: return wire::kTransportUc << 5;
    case QpType::kUd: return wire::kTransportUd << 5;
    case QpType::kXrcIni:
    case QpType::kXrcTgt: return wire::kTransportXrc << 5;
  }
  return 0;
}
}  // namespace

Qp::Qp(const QpInit& init, TransportEnv* env)
    : qpn_(init.qpn),
      type_(init.type),
      op_base_(static_cast<uint8_t>(OpBase(init.type))),
      pd_(init.pd),
      xrcd_(init.xrcd),
      sq_sig_all_(init.sq_sig_all),
      caps_(init.caps),
      sq_(init.sq),
      rq_(init.rq),
      srq_(init.srq),
      send_cq_(init.send_cq),
      recv_cq_(init.recv_cq),
      port_(init.port),
      env_(env),
      state_word_(init.state_word) {
  measure_latency_ = init.measure_latency;
  send_ctx_.resize(sq_.size());
  send_sge_.resize(size_t{sq_.size()} * caps_.max_send_sge);
  send_inline_.resize(size_t{sq_.size()} * caps_.max_inline);
  recv_sge_.resize(srq_ != nullptr ? srq_->max_sge() : caps_.max_recv_sge);
  responses_.resize(kMaxResponses);
  atomic_history_.resize(kMaxResponses);
  ResetUdMtu();
  default_rate_kbps_ = init.rate_kbps;
  default_rate_burst_ = init.rate_burst;
  cc_mode_ = init.cc;
  dcqcn_ = init.dcqcn;
  line_mbps_ = init.line_mbps;
  DefaultPacing();
  if (reliable()) adp_ = init.adp;
  if (reliable() && init.sr.on) {
    sr_ = init.sr;
    sr_sacked_.assign(sr_.window, kNoSack);
    sr_resent_.assign(sr_.window, SrResent{});
    // Room for a SACK per held request on top of the responses owed, so
    // SACKs never crowd out a READ or atomic (a power of two: the ring's
    // indexes run free).
    responses_.resize(std::bit_ceil(kMaxResponses + sr_.window));
  }
}

// UD has no path MTU attribute: a UD message may be as long as the port's
// active MTU (IBA 9.8.4; rxe uses the port's MTU).
void Qp::ResetUdMtu() {
  if (type_ == QpType::kUd) attr_.path_mtu = port_.max_mtu;
}

bool Srq::Take(queue::RecvWqe* wqe, queue::Sge* sges, uint32_t max_sge, bool* bad) {
  std::lock_guard<SpinLock> l(lock_);
  if (failed_) return false;
  const uint32_t prod = ring_.load_prod_acquire();
  if (prod == cons_) return false;
  if (prod - cons_ > ring_.size()) {
    // Only a program writing the shared ring behind the provider's back can
    // do this; which WQEs are real is unknowable (IBA 10.2.9.5: SRQ error).
    failed_ = error_event_ = true;
    return false;
  }
  const uint8_t* slot = ring_.slot(cons_);
  std::memcpy(wqe, slot, sizeof(*wqe));
  *bad = wqe->num_sge > std::min(max_sge, max_sge_);
  if (!*bad) std::memcpy(sges, slot + sizeof(queue::RecvWqe), sizeof(queue::Sge) * wqe->num_sge);
  ++cons_;
  ring_.publish_cons(cons_);
  // IBA 11.2.3: the limit event fires once when the WQE count drops below it.
  if (limit_ != 0 && ring_.load_prod_acquire() - cons_ < limit_) {
    limit_ = 0;
    limit_fired_ = true;
  }
  return true;
}

namespace {

struct Transition {
  uint32_t required;
  uint32_t optional;
  bool valid;
};

// The IBA 10.3.1 / ib_modify_qp_is_ok table for the connected service types
// (RC; UC differs only in RDMA-read attributes; an XRC initiator has RC's
// requester attributes and UC's responder ones, an XRC target the reverse)
// and for UD.
Transition transition(QpType type, QpState cur, QpState next) {
  const bool ud = type == QpType::kUd;
  const bool tgt = type == QpType::kXrcTgt;
  // The requester's RDMA-read and retry attributes (timeouts, retry counts,
  // initiator depth) and the responder's (RNR timer, responder depth).
  const bool req = type == QpType::kRc || type == QpType::kXrcIni;
  const bool resp = type == QpType::kRc || tgt;
  using S = QpState;
  if (next == S::kReset || next == S::kErr) return {0, 0, true};
  switch (cur) {
    case S::kReset:
      if (next == S::kInit) {
        if (ud) return {kAttrPkeyIndex | kAttrPort | kAttrQkey, 0, true};
        return {kAttrPkeyIndex | kAttrPort | kAttrAccessFlags, 0, true};
      }
      break;
    case S::kInit:
      if (next == S::kInit) {
        if (ud) return {0, kAttrPkeyIndex | kAttrPort | kAttrQkey, true};
        return {0, kAttrPkeyIndex | kAttrPort | kAttrAccessFlags, true};
      }
      if (next == S::kRtr) {
        if (ud) return {0, kAttrPkeyIndex | kAttrQkey, true};
        uint32_t required = kAttrAv | kAttrPathMtu | kAttrDestQpn | kAttrRqPsn;
        if (resp) required |= kAttrMaxDestRdAtomic | kAttrMinRnrTimer;
        return {required, kAttrAltPath | kAttrAccessFlags | kAttrPkeyIndex, true};
      }
      break;
    case S::kRtr:
      if (next == S::kRts) {
        // IBV_QP_RATE_LIMIT: optional here and RTS->RTS, as the kernel's
        // ib_modify_qp_is_ok has it.
        if (ud) return {kAttrSqPsn, kAttrCurState | kAttrQkey | kAttrRateLimit, true};
        uint32_t required = kAttrSqPsn;
        if (req) required |= kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic;
        if (tgt) required |= kAttrTimeout;
        uint32_t opt = kAttrCurState | kAttrAltPath | kAttrAccessFlags | kAttrPathMigState | kAttrRateLimit;
        if (resp) opt |= kAttrMinRnrTimer;
        return {required, opt, true};
      }
      break;
    case S::kRts:
    case S::kSqe:
      if (next == S::kRts) {
        if (ud) return {0, kAttrCurState | kAttrQkey | kAttrRateLimit, true};
        uint32_t opt = kAttrCurState | kAttrAccessFlags | kAttrAltPath | kAttrPathMigState | kAttrRateLimit;
        if (resp) opt |= kAttrMinRnrTimer;
        return {0, opt, true};
      }
      if (cur == S::kRts && next == S::kSqd) return {0, kAttrEnSqdAsyncNotify, true};
      break;
    case S::kSqd:
      if (next == S::kRts) {
        if (ud) return {0, kAttrCurState | kAttrQkey, true};
        uint32_t opt = kAttrCurState | kAttrAccessFlags | kAttrAltPath | kAttrPathMigState;
        if (resp) opt |= kAttrMinRnrTimer;
        return {0, opt, true};
      }
      if (next == S::kSqd) {
        // IBA 10.3.1: path and timing attributes may change while drained.
        if (ud) return {0, kAttrPkeyIndex | kAttrQkey, true};
        uint32_t opt = kAttrCurState | kAttrAv | kAttrPathMtu | kAttrAccessFlags | kAttrPkeyIndex |
                       kAttrAltPath | kAttrPathMigState;
        if (req) opt |= kAttrPort | kAttrTimeout | kAttrRetryCnt | kAttrRnrRetry | kAttrMaxQpRdAtomic;
        if (resp) opt |= kAttrPort | kAttrTimeout | kAttrMaxDestRdAtomic | kAttrMinRnrTimer;
        return {0, opt, true};
      }
      break;
    default:
      break;
  }
  return {0, 0, false};
}

}  // namespace

bool av_destination(const AddressVector& av, const PortAddr& port, AvUse use, wire::Ipv6Addr* dgid) {
  if (!av.is_global) return false;
  if (wire::gid_is_ipv4_mapped(av.dgid)) {
    if (av.sgid_index != kGidIndexIpv4) return false;
  } else {
    if (av.sgid_index != kGidIndexIpv6 || !port.has_ip6) return false;
    static constexpr uint8_t kUnspecified[16] = {};
    if (std::memcmp(av.dgid, kUnspecified, 16) == 0) return false;
  }
  // Multicast is a UD service; a connected QP's peer is one port.
  if (use != AvUse::kUdHandle && wire::gid_is_multicast(av.dgid)) return false;
  std::memcpy(dgid->data(), av.dgid, 16);
  return true;
}

bool Qp::ModifyAllowed(QpState cur, QpState next, uint32_t mask) const {
  Transition t = transition(type_, cur, next);
  if (!t.valid) return false;
  const uint32_t attrs = mask & ~(kAttrState);
  if ((attrs & t.required) != t.required) return false;
  return (attrs & ~(t.required | t.optional | kAttrCurState)) == 0;
}

int Qp::Modify(const QpAttr& a, uint32_t mask) {
  const QpState cur = attr_.state;
  if ((mask & kAttrCurState) && a.cur_state != cur) return EINVAL;
  const QpState next = (mask & kAttrState) ? a.state : cur;
  if (!ModifyAllowed(cur, next, mask)) return EINVAL;
  if ((mask & kAttrPathMtu) && (a.path_mtu < 1 || a.path_mtu > 5)) return EINVAL;
  if ((mask & kAttrPort) && a.port_num != 1) return EINVAL;
  if ((mask & kAttrPkeyIndex) && a.pkey_index != 0) return EINVAL;
  if ((mask & kAttrTimeout) && a.timeout > 31) return EINVAL;
  if ((mask & kAttrRetryCnt) && a.retry_cnt > 7) return EINVAL;
  if ((mask & kAttrRnrRetry) && a.rnr_retry > 7) return EINVAL;
  if ((mask & kAttrMinRnrTimer) && a.min_rnr_timer > 31) return EINVAL;
  wire::Ipv6Addr dgid = dgid_;
  if ((mask & kAttrAv) && !av_destination(a.av, port_, AvUse::kConnected, &dgid)) return EINVAL;
  if ((mask & kAttrQkey) && type_ != QpType::kUd) return EINVAL;
  if ((mask & kAttrRateLimit) && a.rate_limit > kMaxRateLimitKbps) return EINVAL;

  if (mask & kAttrAccessFlags) attr_.access_flags = a.access_flags;
  if (mask & kAttrPkeyIndex) attr_.pkey_index = a.pkey_index;
  if (mask & kAttrPort) attr_.port_num = a.port_num;
  if (mask & kAttrQkey) attr_.qkey = a.qkey;
  if (mask & kAttrAv) {
    attr_.av = a.av;
    dgid_ = dgid;
    mac_valid_ = false;
  }
  if (mask & kAttrPathMtu) {
    attr_.path_mtu = a.path_mtu < port_.max_mtu ? a.path_mtu : port_.max_mtu;
    if (pacer_.on()) pacer_.SetMaxFrame(MaxFrame(), env_->NowNs());
  }
  if (mask & kAttrRateLimit) {
    attr_.rate_limit = a.rate_limit;
    attr_.max_burst_sz = a.max_burst_sz;
    attr_.typical_pkt_sz = a.typical_pkt_sz;
    pacer_.Set(a.rate_limit, a.max_burst_sz, MaxFrame(), env_->NowNs());
    if (rp_.active()) ApplyCcRate(env_->NowNs());
    if (!pacer_.on()) paced_until_ns_ = 0;
  }
  if (mask & kAttrTimeout) attr_.timeout = a.timeout;
  if (mask & kAttrRetryCnt) attr_.retry_cnt = a.retry_cnt;
  if (mask & kAttrRnrRetry) attr_.rnr_retry = a.rnr_retry;
  if (mask & kAttrRqPsn) {
    attr_.rq_psn = a.rq_psn & wire::kPsnMask;
    epsn_ = attr_.rq_psn;
  }
  if (mask & kAttrMaxQpRdAtomic) attr_.max_rd_atomic = a.max_rd_atomic;
  if (mask & kAttrMinRnrTimer) attr_.min_rnr_timer = a.min_rnr_timer;
  if (mask & kAttrSqPsn) {
    attr_.sq_psn = a.sq_psn & wire::kPsnMask;
    next_psn_ = unacked_psn_ = high_psn_ = attr_.sq_psn;
    adp_timing_ = false;
    gbn_window_ = gbn_ssthresh_ = kGbnMaxWindow;
    gbn_grow_ = 0;
    gbn_recovering_ = false;
    sr_backoff_ = 0;
    if (!sr_sacked_.empty()) SrForgetSacks();
  }
  if (mask & kAttrMaxDestRdAtomic) attr_.max_dest_rd_atomic = a.max_dest_rd_atomic;
  if (mask & kAttrDestQpn) {
    attr_.dest_qpn = a.dest_qpn & wire::kPsnMask;
    udp_sport_ = wire::udp_sport_for_qp(qpn_, attr_.dest_qpn);
  }

  if (next != cur) {
    if (next != QpState::kErr) SetState(next);  // EnterError publishes ERR itself
    if (next == QpState::kReset) {
      ResetQueues();
    } else if (next == QpState::kErr) {
      if (cur == QpState::kRtr || cur == QpState::kRts || cur == QpState::kSqd) SendQueuedAcks();
      EnterError();
    } else if (next == QpState::kRts && cur != QpState::kSqd) {
      retries_left_ = attr_.retry_cnt;
      rnr_retries_left_ = attr_.rnr_retry;
      last_progress_ns_ = sr_timer_ns_ = env_->NowNs();
    } else if (next == QpState::kSqd) {
      // Drain: no new WQE starts; SQ_DRAINED once the outstanding ones are
      // done, if asked for (IBA 10.3.1, 11.6.3).
      sqd_notify_ = (mask & kAttrEnSqdAsyncNotify) != 0 && a.en_sqd_async_notify;
    }
  }
  return 0;
}

void Qp::DefaultPacing() {
  attr_.rate_limit = default_rate_kbps_;
  attr_.max_burst_sz = default_rate_burst_;
  attr_.typical_pkt_sz = 0;
  pacer_.Set(default_rate_kbps_, default_rate_burst_, MaxFrame(), env_->NowNs());
  rp_.Configure(dcqcn_, line_mbps_);
}

void Qp::SetCongestionControl(cc::CcMode mode, const cc::DcqcnParams& p) {
  cc_mode_ = mode;
  dcqcn_ = p;
  rp_.Configure(p, line_mbps_);
  ApplyCcRate(env_->NowNs());
}

// The pacer runs at the QP's own rate limit, or DCQCN's rate while its
// reaction point limits the QP, whichever is lower; it keeps the QP's burst.
void Qp::ApplyCcRate(uint64_t now_ns) {
  uint32_t want = attr_.rate_limit;
  if (rp_.active()) {
    const uint32_t cc_kbps = std::max<uint32_t>(1, static_cast<uint32_t>(rp_.rate_mbps() * 1000));
    want = want != 0 ? std::min(want, cc_kbps) : cc_kbps;
  }
  if (want == pacer_.rate_kbps()) return;
  if (pacer_.on()) {
    pacer_.SetRate(want, now_ns);
  } else {
    pacer_.Set(want, attr_.max_burst_sz, MaxFrame(), now_ns);
  }
  if (!pacer_.on()) paced_until_ns_ = 0;
}

void Qp::DropXrcSrq(const Srq* srq) {
  if (type_ != QpType::kXrcTgt || srq_ != srq) return;
  // The WQE in progress went with its SRQ: the rest of that message finds
  // no SRQ and fails (SelectXrcSrq).
  recv_.active = false;
  srq_ = nullptr;
  recv_cq_ = nullptr;
  xrc_srqn_ = xrc_srq_id_ = 0;
}

void Qp::ResetQueues() {
  // Moving to RESET discards every WQE without a completion (IBA 10.3.1).
  const uint32_t sq_prod = sq_.load_prod_acquire();
  sq_comp_ = sq_send_ = sq_fetched_ = sq_prod;
  sq_.publish_cons(sq_prod);
  if (srq_ == nullptr) {
    rq_cons_ = rq_.load_prod_acquire();
    rq_.publish_cons(rq_cons_);
  }
  send_pkt_ = 0;
  rd_atomic_inflight_ = 0;
  in_write_message_ = false;
  comm_est_raised_ = false;
  resp_head_ = resp_tail_ = 0;
  for (auto& a : atomic_history_) a.valid = false;
  recv_ = RecvCtx{};
  if (type_ == QpType::kXrcTgt) {
    srq_ = nullptr;
    recv_cq_ = nullptr;
    pd_ = 0;
    xrc_srqn_ = xrc_srq_id_ = 0;
  }
  rnr_wait_ = false;
  nak_sent_ = false;
  in_send_message_ = false;
  msn_ = 0;
  mac_valid_ = false;
  attr_ = QpAttr{};  // state RESET, already published by Modify
  paced_until_ns_ = 0;
  sr_peer_ = sr_announced_ = false;
  rtt_ = RttEstimator{};  // the next connection may be to another peer
  adp_timing_ = false;
  adp_fired_ = 0;
  if (!sr_sacked_.empty()) SrForgetSacks();
  SrDropHeld();
  sr_frames_.reset();  // sized by the path MTU, which the next RTR may change
  ResetUdMtu();
  DefaultPacing();
}

void Qp::SetState(QpState s) {
  if (s != attr_.state) Trace(TraceKind::kState, 0, 0, static_cast<uint32_t>(s));
  attr_.state = s;
  if (state_word_ == nullptr) return;
  // S1 (seq_cst, with the fence after it): the provider's post_recv
  // publishes its producer index, fences (P1), then reads this word; we
  // store the word, fence, then read the producer index (FlushAll, the
  // doorbell path). Dekker: at least one side sees the other, so a receive
  // posted while the QP enters ERR is either flushed here or rung for by
  // the provider (providers/verbs_datapath.cc, post_allowed).
  state_word_->store(static_cast<uint32_t>(s), std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

void Qp::EnterError() {
  SetState(QpState::kErr);
  rnr_wait_ = false;
  unacked_psn_ = next_psn_;
  resp_head_ = resp_tail_ = 0;
  rd_atomic_inflight_ = 0;
  FlushAll();
  // IBA 11.6.3.1: a QP on an SRQ reports its last WQE once it is in error.
  if (srq_ != nullptr && type_ != QpType::kXrcTgt) Raise(QpEvent::kLastWqeReached);
}

void Qp::LocalCatastrophe() {
  Count(QpCounter::bad_wqe);
  Raise(QpEvent::kFatal);
  EnterError();
}

void Qp::FlushAll() {
  // IBA 10.3.1 / 11.4.2.1: in the error state every outstanding and newly
  // posted WR completes with IBV_WC_WR_FLUSH_ERR, signaled or not. Of a
  // corrupt ring only the WQEs already fetched are real.
  uint32_t sq_prod = sq_.load_prod_acquire();
  if (RingCorrupt(sq_, sq_prod, sq_comp_)) sq_prod = sq_fetched_;
  if (send_cq_ == nullptr) sq_prod = sq_comp_;  // an XRC target has no send queue to flush
  while (sq_comp_ != sq_prod) {
    queue::SendWqe w;
    std::memcpy(&w, sq_.slot(sq_comp_), sizeof(w));
    queue::Cqe c{};
    c.wr_id = w.wr_id;
    c.status = queue::wc::kWrFlushErr;
    c.qp_num = qpn_;
    if (!RetireSendWqe(&c)) break;
  }
  sq_send_ = sq_fetched_ = sq_comp_;
  send_pkt_ = 0;
  sq_.publish_cons(sq_comp_);

  if (recv_.active && recv_cq_ != nullptr) {
    queue::Cqe c{};
    c.wr_id = recv_.wqe.wr_id;
    c.status = queue::wc::kWrFlushErr;
    c.qp_num = qpn_;
    c.opcode = queue::wc::kOpRecv;
    if (recv_cq_->Push(c, false)) {
      recv_.active = false;
      Count(QpCounter::resp_cqe_flush_error);
    }
  }
  OnRecvDoorbell();
}

void Qp::OnRecvDoorbell() {
  // SRQ WQEs belong to every QP on the SRQ; an erroring QP does not flush
  // them. XRC QPs have no receive queue.
  if (attr_.state != QpState::kErr || srq_ != nullptr || recv_cq_ == nullptr) return;
  const uint32_t prod = rq_.load_prod_acquire();
  if (RingCorrupt(rq_, prod, rq_cons_)) return;  // nothing in it is known to be real
  while (rq_cons_ != prod) {
    queue::RecvWqe w;
    std::memcpy(&w, rq_.slot(rq_cons_), sizeof(w));
    queue::Cqe c{};
    c.wr_id = w.wr_id;
    c.status = queue::wc::kWrFlushErr;
    c.qp_num = qpn_;
    c.opcode = queue::wc::kOpRecv;
    if (!recv_cq_->Push(c, false)) break;
    Count(QpCounter::resp_cqe_flush_error);
    ++rq_cons_;
  }
  rq_.publish_cons(rq_cons_);
}

// Frees the oldest SQ slot, then enters its completion (if any). An
// application may post into that slot as soon as it polls the completion (a
// polled WR is no longer outstanding), so the slot must be free first. The
// CQ is checked for room before (it has one producer: the room cannot
// vanish), so a full CQ still leaves the WQE in place for the flush.
bool Qp::RetireSendWqe(const queue::Cqe* cqe) {
  if (cqe != nullptr && send_cq_->full()) {
    PushSendCqe(*cqe);  // fails: CQ_ERR, QP_FATAL, error state
    return false;
  }
  ++sq_comp_;
  sq_.publish_cons(sq_comp_);
  if (cqe != nullptr) PushSendCqe(*cqe);
  return true;
}

bool Qp::PushSendCqe(const queue::Cqe& in) {
  queue::Cqe cqe = in;
  cqe.timestamp_ns = env_->TurnNs();
  if (cqe.status != queue::wc::kSuccess) {
    Count(cqe.status == queue::wc::kWrFlushErr ? QpCounter::req_cqe_flush_error : QpCounter::req_cqe_error);
  }
  if (send_cq_->Push(cqe, false)) return true;
  // A completion that cannot be entered is never dropped silently: the CQ
  // raised CQ_ERR, and the QP goes to error with QP_FATAL (IBA 11.6.2).
  Count(QpCounter::cq_overflow);
  if (attr_.state != QpState::kErr) {
    Raise(QpEvent::kFatal);
    EnterError();
  }
  return false;
}

bool Qp::PushRecvCqe(const queue::Cqe& in, bool solicited) {
  queue::Cqe cqe = in;
  cqe.timestamp_ns = env_->TurnNs();
  if (cqe.status != queue::wc::kSuccess) {
    Count(cqe.status == queue::wc::kWrFlushErr ? QpCounter::resp_cqe_flush_error : QpCounter::resp_cqe_error);
  }
  if (recv_cq_->Push(cqe, solicited)) return true;
  Count(QpCounter::cq_overflow);
  if (attr_.state != QpState::kErr) {
    Raise(QpEvent::kFatal);
    EnterError();
  }
  return false;
}

wire::Path Qp::PathTo(const wire::MacAddr& dmac, const wire::Ipv6Addr& dgid, const AddressVector& av) const {
  wire::Path p;
  p.dmac = dmac;
  p.smac = port_.mac;
  p.ipv6 = !wire::gid_is_ipv4_mapped(dgid.data());
  if (p.ipv6) {
    p.sip6 = port_.ip6;
    p.dip6 = dgid;
    p.flow_label = av.flow_label;
  } else {
    p.sip = port_.ip;
    p.dip = wire::gid_to_ipv4(dgid.data());
  }
  p.udp_sport = udp_sport_;
  p.tos = av.traffic_class;
  p.ttl = av.hop_limit ? av.hop_limit : 64;
  return p;
}

}  // namespace droce::transport
