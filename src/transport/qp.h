// One queue pair, owned by one worker thread. The requester (requester.cc)
// turns send WQEs into packets, the completer (completer.cc) retires them on
// ACKs and retransmits on NAKs and timeouts, the responder (responder.cc)
// executes incoming requests; qp.cc holds creation, the IBA state machine
// (modify) and error flushing.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "common/counters.h"
#include "cc/dcqcn.h"
#include "common/spin_lock.h"
#include "common/histogram.h"
#include "cq/cq.h"
#include "queue/abi.h"
#include "queue/ring.h"
#include "transport/adaptive_retrans.h"
#include "transport/env.h"
#include "transport/pacer.h"
#include "transport/selective_repeat.h"
#include "transport/trace.h"
#include "wire/frame.h"

namespace droce::transport {

// Numbered as enum ibv_qp_state.
enum class QpState : uint8_t { kReset = 0, kInit, kRtr, kRts, kSqd, kSqe, kErr };
const char* qp_state_name(QpState s);

// Numbered as enum ibv_qp_type. XRC (IBA 9.8.3): an initiator QP
// (IBV_QPT_XRC_SEND) sends RC-style to any XRC SRQ behind its peer, a target
// QP (IBV_QPT_XRC_RECV) executes what reaches it on the SRQ each request
// names; the target has no send queue and no receive queue of its own.
enum class QpType : uint8_t { kRc = 2, kUc = 3, kUd = 4, kXrcIni = 9, kXrcTgt = 10 };

// Bits of enum ibv_qp_attr_mask.
enum AttrMask : uint32_t {
  kAttrState = 1 << 0,
  kAttrCurState = 1 << 1,
  kAttrEnSqdAsyncNotify = 1 << 2,
  kAttrAccessFlags = 1 << 3,
  kAttrPkeyIndex = 1 << 4,
  kAttrPort = 1 << 5,
  kAttrQkey = 1 << 6,
  kAttrAv = 1 << 7,
  kAttrPathMtu = 1 << 8,
  kAttrTimeout = 1 << 9,
  kAttrRetryCnt = 1 << 10,
  kAttrRnrRetry = 1 << 11,
  kAttrRqPsn = 1 << 12,
  kAttrMaxQpRdAtomic = 1 << 13,
  kAttrAltPath = 1 << 14,
  kAttrMinRnrTimer = 1 << 15,
  kAttrSqPsn = 1 << 16,
  kAttrMaxDestRdAtomic = 1 << 17,
  kAttrPathMigState = 1 << 18,
  kAttrCap = 1 << 19,
  kAttrDestQpn = 1 << 20,
  kAttrRateLimit = 1 << 25,  // IBV_QP_RATE_LIMIT
};

struct AddressVector {
  uint8_t dgid[16] = {};
  uint32_t flow_label = 0;
  uint8_t sgid_index = 0;
  uint8_t hop_limit = 64;
  uint8_t traffic_class = 0;
  uint8_t sl = 0;
  bool is_global = false;
  uint8_t port_num = 1;
  uint16_t dlid = 0;
};

// The attributes of ibv_qp_attr that droce implements, host order.
struct QpAttr {
  QpState state = QpState::kReset;
  QpState cur_state = QpState::kReset;
  uint32_t access_flags = 0;
  uint16_t pkey_index = 0;
  uint8_t port_num = 1;
  uint32_t qkey = 0;
  AddressVector av;
  uint8_t path_mtu = 3;  // enum ibv_mtu: 1=256 ... 5=4096
  uint8_t timeout = 14;
  uint8_t retry_cnt = 7;
  uint8_t rnr_retry = 7;
  uint32_t rq_psn = 0;
  uint8_t max_rd_atomic = 1;
  uint8_t min_rnr_timer = 12;
  uint32_t sq_psn = 0;
  uint8_t max_dest_rd_atomic = 1;
  uint32_t dest_qpn = 0;
  bool en_sqd_async_notify = false;
  // Packet pacing (kAttrRateLimit): kbps, 0 unlimited; the burst in bytes
  // (0: one frame) and the typical packet size (ibv_modify_qp_rate_limit;
  // kept and reported, the pacer needs no hint).
  uint32_t rate_limit = 0;
  uint32_t max_burst_sz = 0;
  uint16_t typical_pkt_sz = 0;
};
// The fastest a QP may be paced at, kbps (ibv_query_device_ex's
// packet_pacing_caps.qp_rate_limit_max): 100 Gb/s, as a ConnectX-5.
inline constexpr uint32_t kMaxRateLimitKbps = 100'000'000;

struct QpCaps {
  uint32_t max_send_wr = 0, max_recv_wr = 0;  // ring sizes (powers of two)
  uint32_t max_send_sge = 0, max_recv_sge = 0;
  uint32_t max_inline = 0;
};

// The port a QP sends from. Its GID table (the provider reports the same):
// index 0 is the IPv4 address as an IPv4-mapped GID, index 1 the IPv6
// address if the port has one; both are RoCE v2 GIDs.
struct PortAddr {
  wire::MacAddr mac{};
  uint32_t ip = 0;        // host order
  uint8_t max_mtu = 3;    // active_mtu as enum ibv_mtu
  bool has_ip6 = false;
  wire::Ipv6Addr ip6{};
};
inline constexpr uint8_t kGidIndexIpv4 = 0;
inline constexpr uint8_t kGidIndexIpv6 = 1;
// The L3 header type a UD receive reports in wc.sl (mlx5's CQE values).
inline constexpr uint8_t kRoceL3Ipv6 = 1;
inline constexpr uint8_t kRoceL3Ipv4 = 2;

// A shared receive queue: one ring of receive WQEs that several QPs of one
// worker consume (IBA 10.2.9). Owned by the worker.
class Srq {
 public:
  // `shared`: QPs owned by several worker threads take from it; every
  // member below then runs under the SRQ's lock.
  Srq(queue::Ring ring, uint32_t max_sge, bool shared = false)
      : ring_(ring), max_sge_(max_sge), lock_(shared) {}
  // Takes the next WQE into private memory; false if none is posted.
  bool Take(queue::RecvWqe* wqe, queue::Sge* sges, uint32_t max_sge, bool* bad);
  // Arms the limit event (IBV_SRQ_LIMIT): fires once when fewer than `limit`
  // WQEs remain.
  void SetLimit(uint32_t limit) {
    std::lock_guard<SpinLock> l(lock_);
    limit_ = limit;
  }
  uint32_t limit() {
    std::lock_guard<SpinLock> l(lock_);
    return limit_;
  }
  uint32_t max_sge() const { return max_sge_; }
  uint32_t posted() {
    std::lock_guard<SpinLock> l(lock_);
    return ring_.load_prod_acquire() - cons_;
  }
  // Set by Take when the limit fired; the engine raises the async event.
  bool TakeLimitEvent() {
    std::lock_guard<SpinLock> l(lock_);
    return std::exchange(limit_fired_, false);
  }
  // The ring was found corrupt (its producer index more than its capacity
  // ahead): the SRQ is in error for good and hands out no more WQEs. Set by
  // Take; the engine raises IBV_EVENT_SRQ_ERR once and fails the QPs on it.
  bool failed() {
    std::lock_guard<SpinLock> l(lock_);
    return failed_;
  }
  bool TakeErrorEvent() {
    std::lock_guard<SpinLock> l(lock_);
    return std::exchange(error_event_, false);
  }

 private:
  queue::Ring ring_;
  uint32_t max_sge_;
  SpinLock lock_;
  uint32_t cons_ = 0;
  uint32_t limit_ = 0;
  bool limit_fired_ = false;
  bool failed_ = false;
  bool error_event_ = false;
};

// An address handle (UD destinations).
struct AddressHandle {
  AddressVector av;
  wire::Ipv6Addr dgid{};  // from av_destination
  uint32_t pd = 0;
};


struct QpInit {
  uint32_t qpn = 0;
  QpType type = QpType::kRc;
  uint32_t pd = 0;    // an XRC target QP has none: each request uses its SRQ's
  uint32_t xrcd = 0;  // an XRC target QP's domain: the SRQs it may reach
  bool sq_sig_all = false;
  QpCaps caps;
  queue::Ring sq, rq;  // rq is unused when srq is set
  Srq* srq = nullptr;
  cq::CqProducer* send_cq = nullptr;  // nullptr for an XRC target QP
  cq::CqProducer* recv_cq = nullptr;  // nullptr for XRC QPs (a target's are its SRQs')
  PortAddr port;
  // Where the QP publishes its state (enum ibv_qp_state) for the provider,
  // which decides from it whether work may be posted; nullptr: nowhere.
  std::atomic<uint32_t>* state_word = nullptr;
  // Record post-to-completion latencies of WQEs the provider stamped.
  bool measure_latency = false;
  // Pacing from creation (and again after a reset), as IBV_QP_RATE_LIMIT
  // with this rate (kbps, 0: none) and burst (DROCE_RATE).
  uint32_t rate_kbps = 0, rate_burst = 0;
  // Congestion control (cc/dcqcn.h; DROCE_CC, DROCE_DCQCN): off, or DCQCN
  // with these parameters, under the port's line rate (Mb/s; ibv_query_port
  // reports 25 Gb/s).
  cc::CcMode cc = cc::CcMode::kOff;
  cc::DcqcnParams dcqcn;
  uint32_t line_mbps = 25000;
  SelectiveRepeat sr;  // DROCE_SR
  AdaptiveRetrans adp;  // DROCE_ADP_RETRANS
};

inline uint32_t mtu_bytes(uint8_t ibv_mtu) { return 128u << ibv_mtu; }
// What an address vector is for: a connected (RC/UC) QP's peer, or a UD
// address handle, which may also name a multicast group.
enum class AvUse : uint8_t { kConnected, kUdHandle };
// The destination GID of an address vector, checked against the port's GID
// table: RoCE needs a GRH, and the source GID index must name the port's
// address of the destination's family (an IPv4-mapped GID goes from index
// 0, any other from index 1). An unspecified IPv6 destination is refused,
// and so is a multicast one (wire::gid_is_multicast) unless `use` is a UD
// address handle. False means EINVAL.
bool av_destination(const AddressVector& av, const PortAddr& port, AvUse use, wire::Ipv6Addr* dgid);

// Asynchronous events a QP raises (values of enum ibv_event_type).
enum class QpEvent : uint8_t { kFatal = 1, kReqErr = 2, kAccessErr = 3, kCommEst = 4, kSqDrained = 5, kLastWqeReached = 16 };

class Qp {
 public:
  Qp(const QpInit& init, TransportEnv* env);

  uint32_t qpn() const { return qpn_; }
  QpType type() const { return type_; }
  QpState state() const { return attr_.state; }
  const QpAttr& attr() const { return attr_; }
  const QpCaps& caps() const { return caps_; }
  Srq* srq() const { return srq_; }
  // Acknowledged service: RC and both XRC ends (IBA 9.7).
  bool reliable() const { return type_ == QpType::kRc || type_ == QpType::kXrcIni || type_ == QpType::kXrcTgt; }
  // An XRC target QP: the SRQ the last request named (0: none yet), for its
  // limit event; DropXrcSrq forgets an SRQ being destroyed (control path).
  uint32_t xrc_srq_id() const { return xrc_srq_id_; }
  void DropXrcSrq(const Srq* srq);

  // Control path (on the worker). Returns 0 or an errno (EINVAL).
  int Modify(const QpAttr& a, uint32_t mask);

  // Datapath. PollSend sends up to `budget` packets (responses first, then
  // requests); returns true while it has more to send right now.
  bool PollSend(unsigned budget);
  // A validated packet whose destination QPN is this QP.
  void OnPacket(const wire::PacketView& pkt);
  // Retransmission and RNR timers; call at TimerDue() or later (calling
  // earlier does nothing).
  void OnTimer(uint64_t now_ns);
  // True while sent packets await acknowledgement (timers matter).
  bool HasOutstanding() const { return unacked_psn_ != next_psn_ || rnr_wait_; }
  // The earliest time (the env's clock) OnTimer may act: the RNR wait's end,
  // the selective-repeat RTO, the adaptive retransmission timer or the local
  // ACK timeout, whichever comes first; kNoTimer while nothing is timed (no
  // ACK awaited, an unreliable QP, a state without timers, timeout 0 and
  // neither SR nor adaptive retransmission). It only moves later as ACKs
  // come, except when an RNR wait begins or adaptive retransmission is on
  // (timer_may_move_earlier()).
  static constexpr uint64_t kNoTimer = ~uint64_t{0};
  uint64_t TimerDue() const {
    if (!HasOutstanding() || !reliable() || (attr_.state != QpState::kRts && attr_.state != QpState::kSqd)) {
      return kNoTimer;
    }
    if (rnr_wait_) return rnr_resume_ns_;
    uint64_t due = kNoTimer;
    if (SrActive()) due = sr_timer_ns_ + SrRtoNs();
    if (attr_.timeout != 0) due = std::min<uint64_t>(due, last_progress_ns_ + (uint64_t{4096} << attr_.timeout));
    if (AdpActive()) due = std::min(due, AdpDue());
    return due;
  }
  bool rnr_waiting() const { return rnr_wait_; }
  // TimerDue may now be earlier than when it was last read: an RNR wait
  // began, adaptive retransmission is on, or selective repeat is (its RTO,
  // shorter than the ACK timeout, starts to count once the peer agreed to
  // it, which may be after the timer was read).
  bool timer_may_move_earlier() const { return rnr_wait_ || adp_.on || sr_.on; }
  // Selective repeat's retransmission timeout now (SelectiveRepeat::rto_us),
  // in ns: the fixed one, or the estimate backed off by the timeouts since
  // the last progress.
  uint64_t SrRtoNs() const {
    if (sr_.rto_us != 0) return uint64_t{sr_.rto_us} * 1000;
    const uint64_t max = uint64_t{sr_.rto_max_us} * 1000;
    uint64_t rto = std::min(rtt_.Rto(uint64_t{sr_.rto_min_us} * 1000, uint64_t{sr_.rto_init_us} * 1000), max);
    for (unsigned i = 0; i < sr_backoff_ && rto < max; ++i) rto <<= 1;
    return std::min(rto, max);
  }
  // Adaptive retransmission's round-trip estimate (on the worker).
  const RttEstimator& rtt() const { return rtt_; }
  // PollSend stopped for the pacer: when the next request may leave (ns,
  // the env's clock); 0 when not held by it.
  uint64_t paced_until() const { return paced_until_ns_; }
  // True while the responder owes READ responses or ACKs.
  bool HasResponses() const { return resp_head_ != resp_tail_; }
  // New receive WQEs were posted (flushes them in the error state).
  void OnRecvDoorbell();
  // Congestion control, changed live (control path): the reaction point
  // starts again at the line rate.
  void SetCongestionControl(cc::CcMode mode, const cc::DcqcnParams& p);
  cc::CcMode cc_mode() const { return cc_mode_; }
  const cc::DcqcnParams& dcqcn() const { return dcqcn_; }
  // DCQCN's reaction point (rate, target, alpha), read on the worker.
  const cc::ReactionPoint& reaction_point() const { return rp_; }
  // The event trace's sink (nullptr: off). Set with the QP's worker stopped.
  void SetTrace(TraceSink* sink) { trace_ = sink; }
  // This QP's counters (common/counters.h): on the worker, or with Peek.
  const QpCounters& counters() const { return counters_; }
  // Post-to-completion latencies (DROCE_LATENCY): by the kind of WQE;
  // nullptr until one of that kind completed.
  enum LatencyClass { kLatSend, kLatWrite, kLatRead, kLatAtomic, kNumLatClasses };
  static_assert(kNumLatClasses == lab::kNumLatencyClasses);
  static const char* latency_class_name(int c) { return lab::kLatencyClassNames[c]; }
  // Safe from another thread while the worker records (the histogram is
  // published once, then only counted into).
  const lab::LatencyHistogram* latency(int c) const { return latency_pub_[c].load(std::memory_order_acquire); }
  // The next PSN the requester sends and the one the responder expects
  // (`rdma res show qp`'s sq-psn and rq-psn); read on the worker.
  uint32_t next_psn() const { return next_psn_; }
  uint32_t expected_psn() const { return epsn_; }
  // The retransmission timer in force (`droce ctl res show qp`), read on the
  // worker: selective repeat's RTO once the peer has it too, else adaptive
  // retransmission's next wait, else the IBA local ACK timeout; kNone for an
  // unreliable QP, one that sends nothing (not RTS or SQD), or timeout 0
  // (wait forever) with neither.
  enum class RetransTimer : uint8_t { kNone, kLocalAck, kAdaptive, kSelectiveRepeat };
  RetransTimer retrans_timer() const;
  // That timer's timeout now (ns; 0 with kNone): the wait from the last
  // progress before the oldest unacknowledged packet goes again.
  uint64_t RetransTimeoutNs() const;
  // Events raised since the last call (bit i = QpEvent value i).
  uint32_t TakeEvents() {
    uint32_t e = events_;
    events_ = 0;
    return e;
  }

 private:
  struct SendCtx {
    queue::SendWqe wqe;
    uint32_t total_len = 0;
    uint32_t first_psn = 0;
    uint32_t npkts = 0;       // PSNs the WQE occupies (READ: response packets)
    uint32_t resp_pkts = 0;   // READ responses received so far
    // READ: a request starting at response index resp_pkts has been sent
    // since resp_pkts took its value, so a FIRST/ONLY there is expected.
    bool issued_at_resp = false;
    bool done = false;        // READ/atomic: response received
    bool rd_counted = false;  // counted in rd_atomic_inflight_
    wire::Ipv6Addr dgid{};    // UD: destination
    uint32_t remote_qpn = 0;  // UD: the destination QP; XRC initiator: the remote SRQ number
    uint32_t remote_qkey = 0; // UD
    AddressVector av;         // UD
  };
  struct RecvCtx {
    queue::RecvWqe wqe;
    uint32_t offset = 0;  // bytes already placed
    bool active = false;
  };
  // A response the responder owes, in PSN order (IBA 9.7.5.1: responses to
  // READ and atomic requests and ACKs go back in the order of the requests).
  struct Response {
    enum Kind : uint8_t { kAck, kRead, kAtomicAck } kind = kAck;
    uint32_t psn = 0;        // next PSN to send
    uint32_t msn = 0;
    uint8_t syndrome = 0;    // ACK
    uint64_t va = 0;         // READ: next address (iova)
    uint32_t rkey = 0;
    uint32_t pd = 0;         // READ: the PD its memory is checked against (XRC: its SRQ's)
    uint32_t remaining = 0;  // READ: bytes still to send
    bool first = true;       // READ: next packet is the first
    bool finished = false;   // READ: the last packet has been sent
    uint64_t orig = 0;       // atomic result
    bool sr = false;         // ACK: to a selective-repeat requester (carries wire::Bth::sr)
    uint8_t sack_run = 0;    // SACK: PSNs before psn held too; ACK: duplicates received (wire::Bth::sr_run)
    wire::MacAddr dmac{};
    wire::Ipv6Addr dgid{};   // the requester's address (the request's source)
  };
  struct AtomicRecord {
    uint32_t psn = 0;
    uint64_t orig = 0;
    bool valid = false;
  };

  // requester.cc
  bool FetchSendWqe();
  uint8_t ValidateSendWqe(SendCtx& ctx, uint32_t slot);
  bool BuildRequestPacket(SendCtx& ctx, uint32_t pkt);
  uint32_t Gather(const SendCtx& ctx, uint32_t slot, uint32_t offset, uint32_t len, uint8_t* dst,
                  bool* prot_err);
  bool FailHead(SendCtx& ctx, uint8_t status);
  bool ExecuteLocalOp(SendCtx& ctx);
  bool WaitForNeighbor();
  void CompleteUnreliable(SendCtx& ctx);
  // completer.cc
  void OnResponse(const wire::PacketView& pkt);
  void OnReadResponse(const wire::PacketView& pkt);
  void OnAtomicAck(const wire::PacketView& pkt);
  void CompleteUpTo(uint32_t psn_exclusive);
  // An ACK (or a SACK's cumulative part) for every PSN before `next`.
  void AckUpTo(uint32_t next);
  void AdvanceUnacked(uint32_t next, uint64_t now);
  bool CompleteWqe(SendCtx& ctx, uint8_t status);
  void CompleteHeadWithError(uint8_t status);
  void GoBackTo(uint32_t psn);
  void SkipAckedTo(uint32_t psn);
  // Go-back-N's window (completer.cc): a loss found (a NAK sequence error,
  // a READ's response gap, a timeout) cuts it, acknowledgements grow it.
  void GbnLoss(bool timeout);
  void GbnAcked(uint32_t pkts);
  bool ScatterToSend(SendCtx& ctx, uint32_t offset, const uint8_t* src, uint32_t len);
  // Selective repeat, requester side (completer.cc): a SACK, the resends
  // it calls for (from PollSend), the retransmission timeout, and
  // forgetting every SACK when the requester rewinds.
  bool SrActive() const { return sr_.on && sr_peer_; }
  void OnSack(const wire::PacketView& pkt, const wire::Aeth& aeth);
  bool SrResend(unsigned budget, unsigned* sent);
  bool SrSendAgain(SendCtx& ctx, uint32_t pkt);
  void SrTimeout(uint64_t now);
  void SrForgetSacks();
  // Adaptive retransmission (transport/adaptive_retrans.h; completer.cc):
  // on for go-back-N (selective repeat has its own timeout).
  bool AdpActive() const { return adp_.on && !SrActive(); }
  uint64_t AdpInterval() const;  // the wait before the next adaptive resend; kNoTimer: none
  uint64_t AdpDue() const;
  void AdpTimeout(uint64_t now);
  // A timeout's go-back-N: from the oldest unacknowledged packet (a READ:
  // its first missing response).
  void RewindForTimeout();
  // A READ's responses were lost (a gap, or an ACK beyond it): rewind to
  // its first missing response (go-back-N), or with selective repeat ask
  // for just the rest of that READ (SrResend, sr_resend_head_).
  void ReadLost(uint32_t first_missing);
  bool SrSacked(uint32_t psn) const { return sr_sacked_[psn & (sr_.window - 1)] == psn; }
  // Selective repeat, responder side (responder.cc): hold a request that
  // came early and SACK it; run the held ones once the gap is filled.
  bool SrHold(const wire::PacketView& pkt);
  void SrDrain(const wire::PacketView& pkt);
  void SrDropHeld();
  // The request scheduler's pacer check and bookkeeping, shared by new
  // requests and resends (requester.cc).
  bool PaceReady();
  void PaceSent();
  // PollSend's work, PollSend itself telling the pacer how it ended.
  bool SendSome(unsigned budget);
  // responder.cc
  void OnRequest(const wire::PacketView& pkt);
  // The RC and XRC request path: ExecuteRequest runs the steps below, in
  // this order, on one request (Linux rxe's responder, rxe_resp.c, has the
  // same checks as the states of a loop: RESPST_CHK_PSN, RESPST_CHK_OP_SEQ,
  // ...). Each returns kNext to go on to the next step, or how the request
  // ends; EndRequest carries out an end that still owes something. The
  // steps are pieces of ExecuteRequest, always inlined into it: the
  // per-packet path makes no call that the one function did not.
  enum class RespStep : uint8_t {
    kNext,           // passed: on to the next step
    kDone,           // ended, nothing owed: dropped and counted, answered, or executed and acknowledged
    kOutOfSequence,  // a PSN past the expected one: NAK once, or held for selective repeat
    kDuplicate,      // a PSN before it: answered again, not executed again
    kRnr,            // no receive WQE: RNR NAK
    // Class C/D errors (ResponderFatal): the NAK, and the status the
    // receive in progress completes with.
    kInvalidRequest,     // NAK invalid request; remote invalid request error
    kLocalLength,        // NAK invalid request; local length error
    kLocalProtection,    // NAK remote operational error; local protection error
    kRemoteAccess,       // NAK remote access error; remote access error
    kRemoteOperational,  // NAK remote operational error; remote operation error
  };
  void ExecuteRequest(const wire::PacketView& pkt);
  [[gnu::always_inline]] inline RespStep RequestSteps(const wire::PacketView& pkt);
  [[gnu::always_inline]] inline RespStep CheckQpState();
  [[gnu::always_inline]] inline RespStep CheckTransport(const wire::PacketView& pkt);
  [[gnu::always_inline]] inline RespStep CheckPsn(const wire::PacketView& pkt) const;
  // XRC target: takes the SRQ, CQ and PD of the request's XRCETH;
  // kInvalidRequest (counted in xrc_bad_srqn) if it names no SRQ of this
  // QP's domain, or another SRQ than the message in progress.
  [[gnu::always_inline]] inline RespStep SelectXrcSrq(const wire::PacketView& pkt);
  [[gnu::always_inline]] inline void NoteInSequence();
  [[gnu::always_inline]] inline RespStep CheckOpValid(uint32_t mask);
  [[gnu::always_inline]] inline RespStep CheckOpSeq(uint32_t mask) const;
  [[gnu::always_inline]] inline RespStep CheckLength(const wire::PacketView& pkt, uint32_t mask) const;
  [[gnu::always_inline]] inline RespStep CheckResource(uint32_t mask);
  [[gnu::always_inline]] inline RespStep ExecuteSend(const wire::PacketView& pkt);
  [[gnu::always_inline]] inline RespStep CheckRkey(const wire::PacketView& pkt, uint32_t mask);
  [[gnu::always_inline]] inline RespStep ExecuteWrite(const wire::PacketView& pkt, uint32_t mask);
  [[gnu::always_inline]] inline RespStep CompleteRequest(const wire::PacketView& pkt, uint32_t mask);
  [[gnu::always_inline]] inline void AcknowledgeRequest(const wire::PacketView& pkt);
  void EndRequest(const wire::PacketView& pkt, RespStep end);
  void OutOfSequenceRequest(const wire::PacketView& pkt);
  void DuplicateRequest(const wire::PacketView& pkt);
  // The XRC SRQ of this QP's domain that a request's XRCETH names; false if
  // there is none.
  bool FindXrcSrqOf(const wire::PacketView& pkt, XrcSrqRef* r);
  void OnUnreliableRequest(const wire::PacketView& pkt);
  void OnUdRequest(const wire::PacketView& pkt);
  bool TakeRecvWqe(bool* bad);
  void SendAck(const wire::PacketView& req, wire::Aeth aeth, uint32_t psn);
  // `dups`: duplicate requests of a selective-repeat requester this ACK
  // answers (carried in wire::Bth::sr_run; ACKs that coalesce add theirs up).
  void QueueAck(const wire::PacketView& req, wire::Aeth aeth, uint32_t psn, uint8_t dups = 0);
  bool Scatter(const uint8_t* src, uint32_t len, uint8_t* status);
  // Starts an RDMA WRITE (the RETH of its FIRST or ONLY packet): the whole
  // range must be writable now, so a bad R_Key is refused before any byte
  // lands. False: an invalid R_Key, PD, rights or bounds.
  bool StartWrite(const wire::Reth& reth);
  // Places one packet's payload of the current WRITE, after checking that
  // piece of the range against the MR table as it is now.
  // atomic: an ATOMIC WRITE's 8 bytes, stored in one go.
  bool PlaceWrite(const uint8_t* src, uint32_t len, bool atomic = false);
  void CompleteRecv(uint8_t status, bool solicited, const wire::PacketView* pkt, bool with_imm,
                    uint8_t opcode = queue::wc::kOpRecv);
  void ResponderFatal(const wire::PacketView& pkt, wire::NakCode code, uint8_t recv_status);
  // responder_rd.cc (READ and atomics)
  void OnReadRequest(const wire::PacketView& pkt, bool duplicate, uint32_t pd);
  void OnAtomicRequest(const wire::PacketView& pkt, bool duplicate);
  bool SendResponses(unsigned* budget);
  void SendQueuedAcks();
  bool BuildReadResponse(Response& r);
  bool BuildAck(const Response& r);
  // qp.cc
  bool ModifyAllowed(QpState cur, QpState next, uint32_t mask) const;
  // Every state change goes through here: it publishes the new state.
  void SetState(QpState s);
  void EnterError();
  void FlushAll();
  // A work queue whose shared producer index is more than its capacity ahead
  // of the consumer was written behind the provider's back: which WQEs are
  // real is unknowable. The QP goes to the error state with QP_FATAL (IBA
  // 11.6.3.1, local work queue catastrophic error); the bogus entries are
  // never read, flushed or completed.
  static bool RingCorrupt(const queue::Ring& r, uint32_t prod, uint32_t cons) { return prod - cons > r.size(); }
  void LocalCatastrophe();
  void ResetQueues();
  void ResetUdMtu();
  bool PushSendCqe(const queue::Cqe& cqe);
  bool RetireSendWqe(const queue::Cqe* cqe);
  bool PushRecvCqe(const queue::Cqe& cqe, bool solicited);
  // Outer headers to `dgid` (IPv4-mapped: IPv4, else IPv6) from the port's
  // address of that family, with the GRH fields of `av`.
  wire::Path PathTo(const wire::MacAddr& dmac, const wire::Ipv6Addr& dgid, const AddressVector& av) const;
  void Raise(QpEvent e) { events_ |= 1u << static_cast<uint8_t>(e); }
  // The event trace (transport/trace.h): one pointer test when off.
  void Trace(TraceKind k, uint8_t opcode, uint32_t psn, uint32_t arg = 0, uint32_t len = 0) {
    if (trace_ != nullptr) [[unlikely]] {
      trace_->Record({trace_->Stamp(), qpn_, k, opcode, 0, psn, arg, len, 0});
    }
  }
  // A built frame goes out: sent, counted, traced.
  void Transmit(const TxFrame& f, uint32_t frame_len, const wire::Bth& b, uint32_t syndrome = 0) {
    env_->SendFrame(f, frame_len);
    last_tx_len_ = frame_len;
    Count(QpCounter::sent_pkts);
    Trace(TraceKind::kTx, b.opcode, b.psn, syndrome, frame_len);
  }
  // One event, in this QP's counters and in the device's.
  void Count(QpCounter c, uint64_t n = 1) {
    const size_t i = static_cast<size_t>(c);
    Bump(counters_.values[i], n);
    Bump(env_->Stats().*kQpCounterInfo[i].field, n);
  }

  uint32_t qpn_;
  QpType type_;
  uint8_t op_base_;  // the transport's opcode bits: RC 0x00, UC 0x20, UD 0x60, XRC 0xA0
  uint32_t pd_;
  uint32_t xrcd_ = 0;
  uint32_t xrc_srqn_ = 0, xrc_srq_id_ = 0;  // XRC target: the SRQ in use
  bool sq_sig_all_;
  QpCaps caps_;
  queue::Ring sq_, rq_;
  Srq* srq_;
  cq::CqProducer* send_cq_;
  cq::CqProducer* recv_cq_;
  PortAddr port_;
  TransportEnv* env_;
  std::atomic<uint32_t>* state_word_;
  QpAttr attr_;
  wire::Ipv6Addr dgid_{};  // RC/UC destination, from the address vector
  uint16_t udp_sport_ = 0xC000;
  uint16_t ip_id_ = 0;
  uint32_t events_ = 0;
  QpCounters counters_;
  TraceSink* trace_ = nullptr;
  Pacer pacer_;
  uint32_t default_rate_kbps_ = 0, default_rate_burst_ = 0;  // QpInit's
  void DefaultPacing();  // QpInit's rate, in attr_ and the pacer
  // Congestion control (cc/dcqcn.h): the two DCQCN roles, and the pacer at
  // the lower of the QP's rate limit and the reaction point's rate.
  cc::CcMode cc_mode_ = cc::CcMode::kOff;
  cc::DcqcnParams dcqcn_;
  uint32_t line_mbps_ = 25000;
  cc::ReactionPoint rp_;
  cc::NotificationPoint np_;
  void ApplyCcRate(uint64_t now_ns);
  void OnCongestionMark(const wire::PacketView& pkt);  // a CE-marked packet arrived
  void OnCnp(const wire::PacketView& pkt);
  // Data packets (requests, READ responses) leave ECN-capable with CC on,
  // unless the address vector's traffic class chose ECN bits itself.
  void MarkEct(wire::Path* path) const {
    if (cc_mode_ == cc::CcMode::kDcqcn && (path->tos & cc::kEcnMask) == cc::kEcnNotEct) path->tos |= cc::kEct0;
  }
  // Selective repeat (SelectiveRepeat above).
  SelectiveRepeat sr_;
  bool sr_peer_ = false;          // a response from the peer carried wire::Bth::sr
  std::vector<uint32_t> sr_sacked_;  // requester: slot psn & (window-1) holds the PSN SACKed there
  bool sr_recovery_ = false;      // SACKs showed holes that are being resent
  // What next_psn_ was when a PSN was last resent (slot psn & (window-1)):
  // a SACK for a PSN first sent after that, while the resent one is still
  // the oldest unacknowledged, means the resend was lost too (the path
  // keeps order): it goes again at once, not at the timeout.
  struct SrResent {
    uint32_t psn = kNoSack;
    uint32_t next = 0;
  };
  std::vector<SrResent> sr_resent_;
  bool sr_resend_head_ = false;   // resend the oldest unacknowledged packet (a READ: ask for the rest)
  uint32_t sr_recover_psn_ = 0;   // recovery ends once everything before it is acknowledged
  uint32_t sr_high_sack_ = 0;     // one past the highest PSN SACKed in this recovery
  uint32_t sr_retx_psn_ = 0;      // the next PSN the recovery looks at
  uint32_t sr_retx_wqe_ = 0;      // the SQ index of the WQE holding it, or before it
  uint64_t sr_timer_ns_ = 0;      // last cumulative progress or timeout
  uint8_t sr_backoff_ = 0;        // timeouts since the last progress (SrRtoNs doubles per each)
  uint32_t high_psn_ = 0;         // one past the highest request PSN ever sent
  // Go-back-N's window: the PSNs that may be in flight without selective
  // repeat. Every loss makes go-back-N resend what was sent after it, so
  // the cost of one loss is the window: at 2 % loss against Linux rxe a
  // fixed 512 made each NAK resend ~284 packets and 64 KiB WRITEs fall from
  // 39.8 to 1.2 MB/s. It halves on a loss (once per window of data: losses
  // before gbn_recover_psn_ belong to the cut already made), falls to its
  // floor at a timeout, and grows as TCP Reno's congestion window does (by
  // each acknowledged packet up to gbn_ssthresh_, then by one per window).
  // A lossless path keeps it at its ceiling, kGbnMaxWindow. The floor, 64,
  // is where go-back-N's waste stops paying for itself: live against rxe in
  // a TCG guest at 1 % loss (bench/linux-loss) a floor of 8 resent 3,811
  // packets and a floor of 64 17,213 for 4,096 delivered (a fixed 512:
  // 81,585), but the small window left the tail of each message waiting for
  // the local ACK timeout more often, and that decides the goodput; in the
  // simulator (transport_sr_test) 64 kept bursty (Gilbert-Elliott) loss near
  // selective repeat's goodput where 8-32 fell 10x.
  static constexpr uint32_t kGbnMaxWindow = 512;
  static constexpr uint32_t kGbnMinWindow = 64;
  uint32_t gbn_window_ = kGbnMaxWindow;
  uint32_t gbn_ssthresh_ = kGbnMaxWindow;
  uint32_t gbn_grow_ = 0;         // packets acknowledged towards the next +1 above gbn_ssthresh_
  uint32_t gbn_recover_psn_ = 0;  // while gbn_recovering_, a loss before it makes no new cut
  bool gbn_recovering_ = false;
  struct SrHeld {
    uint32_t psn = 0;
    wire::PacketView view;  // as parsed, pointing into the copy; frame_len 0: empty
  };
  std::vector<SrHeld> sr_held_;          // responder: requests held, slot psn & (window-1)
  std::unique_ptr<uint8_t[]> sr_frames_;  // their frames, sr_frame_cap_ bytes each
  uint32_t sr_frame_cap_ = 0;
  uint32_t sr_held_count_ = 0;
  bool sr_draining_ = false;
  bool sr_announced_ = false;  // an ACK with the bit went to the requester
  uint64_t paced_until_ns_ = 0;
  bool send_budget_out_ = false;  // SendSome stopped at its budget
  uint64_t last_ackreq_ns_ = 0;  // paced RC: when a request last asked for an ACK
  uint64_t pace_now_ns_ = 0;     // the clock reading of the pacer's last check
  uint32_t last_tx_len_ = 0;  // the last frame Transmit sent
  // The largest frame of a request at the path MTU (headers included, with
  // room for a VLAN tag and an IPv6 header): the pacer's burst accounting.
  uint32_t MaxFrame() const { return mtu_bytes(attr_.path_mtu) + 128; }
  bool measure_latency_ = false;
  std::unique_ptr<lab::LatencyHistogram> latency_[kNumLatClasses];
  std::atomic<const lab::LatencyHistogram*> latency_pub_[kNumLatClasses] = {};
  void RecordLatency(const SendCtx& ctx);
  bool sqd_notify_ = false;
  bool comm_est_raised_ = false;

  // Requester / completer. Ring indices (free-running): sq_comp_ <= sq_send_
  // <= sq_fetched_ <= provider's prod.
  std::vector<SendCtx> send_ctx_;
  std::vector<queue::Sge> send_sge_;     // caps_.max_send_sge per slot
  std::vector<uint8_t> send_inline_;     // caps_.max_inline per slot
  uint32_t sq_comp_ = 0;
  uint32_t sq_send_ = 0;     // WQE being sent
  uint32_t send_pkt_ = 0;    // next packet of that WQE
  uint32_t sq_fetched_ = 0;
  uint32_t next_psn_ = 0;
  uint32_t unacked_psn_ = 0;
  uint32_t retries_left_ = 7;
  uint32_t rnr_retries_left_ = 7;
  uint32_t rd_atomic_inflight_ = 0;
  uint32_t last_read_goback_psn_ = 0xFFFFFFFF;
  uint64_t last_progress_ns_ = 0;
  // Adaptive retransmission (AdaptiveRetrans above). The k-th adaptive
  // resend since the QP last made progress comes rto << k after the one
  // before; progress is seen as a new last_progress_ns_.
  AdaptiveRetrans adp_;
  RttEstimator rtt_;
  bool adp_timing_ = false;        // a packet sent once is being timed
  uint32_t adp_timed_psn_ = 0;
  uint64_t adp_timed_ns_ = 0;
  uint64_t adp_progress_seen_ = 0;  // last_progress_ns_ when the schedule last restarted
  uint64_t adp_from_ns_ = 0;        // the schedule's last step (progress, an adaptive resend or a timeout)
  uint8_t adp_fired_ = 0;           // adaptive resends since then
  bool rnr_wait_ = false;
  uint64_t rnr_resume_ns_ = 0;
  bool mac_valid_ = false;
  uint64_t resolving_since_ns_ = 0;
  wire::MacAddr dmac_{};

  // Responder.
  std::vector<queue::Sge> recv_sge_;  // max receive SGEs, for the active WQE
  RecvCtx recv_;
  uint32_t rq_cons_ = 0;
  uint32_t epsn_ = 0;
  uint32_t msn_ = 0;
  bool nak_sent_ = false;
  bool in_send_message_ = false;
  bool in_write_message_ = false;
  // The current RDMA WRITE: its rkey and the address its next packet is
  // for. Never a host pointer: every packet is checked against the MR table
  // again (PlaceWrite), because the MR or window may go away between two
  // packets of one message.
  uint32_t write_rkey_ = 0;
  uint64_t write_va_ = 0;
  uint32_t write_remaining_ = 0;
  uint32_t write_len_ = 0;
  std::vector<Response> responses_;  // ring, kMaxResponses
  uint32_t resp_head_ = 0, resp_tail_ = 0;
  std::vector<AtomicRecord> atomic_history_;
  uint32_t atomic_next_ = 0;
};

// IBA table 45: RNR NAK timer code → nanoseconds.
uint64_t rnr_timer_ns(uint8_t code);

}  // namespace droce::transport
