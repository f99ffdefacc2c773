// The IB Communication Manager protocol (ib_cm.h): the messages the id
// layer has sent and the handlers of those that come in, the comm IDs, the
// retransmission timers, timewait and the requests held for a listener.
#include "cm/ib_cm.h"

#include <infiniband/verbs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "cm/manager.h"

namespace droce::cm {

namespace {
using cma::kCmResponseTimeout;
using cma::kHopLimit;
using cma::kMaxCmRetries;
using cma::kMraServiceTimeout;
using cma::kPacketLifeTime;
// A REQ or SIDR_REQ for a service nobody listens on is held this long
// before it is refused (IB CM: REJ reason 8 at once), and handed to a
// listener that comes meanwhile. Programs that agree out of band and then
// connect at once race the passive side's rdma_listen: perftest -R's
// client sends its REQ right after the handshake over its first connection,
// whose last step on the server (a SEND's completion) comes a round trip
// later. On a kernel the active side's address and route resolution take
// longer than that; droce's take ~30 us, and the REQ often came before the
// listen (tests cm_ib_write_lat, cm_ib_send_bw: 3 in 10 runs). Debian's
// perftest 4.5-0.17 crashes on its own retry after such a REJ.
constexpr uint64_t kEarlyReqHoldNs = 100'000'000;
constexpr size_t kMaxEarlyReqs = 1024;  // beyond: refused at once, as before
constexpr uint64_t kMs = 1'000'000;

// IBA time (4.096 us << t) in ms, rounded as the kernel's cm_convert_to_ms.
uint64_t iba_ms(uint8_t t) { return uint64_t{1} << std::max(int{t} - 8, 0); }

// rdma_cm's rules for the QP's local ACK timeout (cm_ack_timeout).
uint8_t ack_timeout(uint8_t ca_ack_delay, uint8_t packet_life_time) {
  int t = packet_life_time + 1;
  if (t >= ca_ack_delay) t += (ca_ack_delay >= t - 1);
  else t = ca_ack_delay + (t >= ca_ack_delay - 1);
  return static_cast<uint8_t>(std::min(31, t));
}

// The QP's local ACK timeout: the id's option, else rdma_cm's rule.
uint8_t AckTimeout(const Conn& c) {
  if (c.ack_timeout_opt != 0) return c.ack_timeout_opt;
  return ack_timeout(c.remote_ack_delay, kPacketLifeTime);
}
}  // namespace

struct IbCm::EarlyReq {
  int dev = 0;
  MadSource src;
  MadHeader h;
  std::variant<Req, SidrReq> msg;
  uint64_t until = 0;
};

IbCm::IbCm(IdLayer* ids, const Clock* clock, std::mt19937_64* rng, CmStats* stats)
    : ids_(ids), clock_(*clock), rng_(rng), stats_(*stats) {}

IbCm::~IbCm() = default;

void IbCm::RemovePort(int dev) {
  std::erase_if(early_, [dev](const EarlyReq& e) { return e.dev == dev; });
}

Conn* IbCm::FindByComm(uint32_t comm) const {
  auto it = by_comm_.find(comm);
  return it == by_comm_.end() ? nullptr : it->second;
}

uint32_t IbCm::NewCommId() {
  for (;;) {
    const uint32_t c = static_cast<uint32_t>((*rng_)());
    if (c != 0 && !by_comm_.contains(c)) return c;
  }
}

void IbCm::Release(const Conn& c) {
  if (c.local_comm_id != 0) by_comm_.erase(c.local_comm_id);
}

void IbCm::DropTimer(Conn* id) {
  id->deadline = 0;
  id->retries_left = 0;
}

void IbCm::TellPeerGone(Conn* id) {
  // What the peer is told, as the kernel's cm_destroy_id.
  switch (id->state) {
    case St::kReqSent: {
      Rej rej;
      rej.local_comm_id = id->local_comm_id;
      rej.message_rejected = kMsgReq;
      rej.reason = kRejTimeout;
      Send(*id, rej, id->tid);
      break;
    }
    case St::kReqRcvd:
    case St::kRepSent:
    case St::kRepRcvd: {
      Rej rej;
      rej.local_comm_id = id->local_comm_id;
      rej.remote_comm_id = id->remote_comm_id;
      rej.message_rejected = id->state == St::kRepRcvd ? kMsgRep : kMsgOther;
      rej.reason = kRejConsumerDefined;
      Send(*id, rej, id->tid);
      ++stats_.rejects_sent;
      break;
    }
    case St::kEstablished: {
      Dreq d;
      d.local_comm_id = id->local_comm_id;
      d.remote_comm_id = id->remote_comm_id;
      d.remote_qpn = id->remote_qpn;
      Send(*id, d, id->tid);
      EnterTimewait(id);
      break;
    }
    default:
      break;
  }
}

void IbCm::Abandon(Conn* id) {
  TellPeerGone(id);
  // Nothing more is sent for it: no retries, no answer but a DREP to a
  // DREQ (HandleDreq, in timewait or disconnected).
  DropTimer(id);
  switch (id->state) {
    case St::kReqSent:
    case St::kReqRcvd:
    case St::kRepSent:
    case St::kRepRcvd:
      id->state = St::kDisconnected;  // rejected just now
      break;
    default:
      break;
  }
}

void IbCm::SendTo(int dev, const Gid& sgid, const Gid& dgid, uint32_t dqpn, uint8_t tclass, const Message& m,
                  uint64_t tid) {
  PortIo* io = ids_->Io(dev);
  if (io == nullptr) return;
  MadHeader h;
  h.tid = tid;
  std::array<uint8_t, kMadSize> buf;
  encode(h, m, buf);
  io->SendMad(sgid, dgid, dqpn, tclass, buf);
  ++stats_.mads_out;
}

void IbCm::Send(const Conn& id, const Message& m, uint64_t tid) {
  SendTo(id.dev, id.sgid, id.dgid, kGsiQpn, id.tos, m, tid);
}

void IbCm::SendRemembered(Conn* id, const Message& m, uint64_t timeout_ns, unsigned retries) {
  id->last = m;
  id->has_last = true;
  Send(*id, m, id->tid);
  id->deadline = clock_() + timeout_ns;
  id->retries_left = retries;
}

void IbCm::EnterTimewait(Conn* id) {
  Timewait tw;
  tw.remote_guid = id->remote_guid;
  tw.remote_comm_id = id->remote_comm_id;
  tw.remote_qpn = id->remote_qpn;
  tw.remote_gid = id->dgid;
  // As the kernel: the QP's ACK timeout, so that stray packets of the old
  // connection are gone before its QPN and comm ID may be seen again.
  tw.until = clock_() + iba_ms(AckTimeout(*id)) * kMs;
  timewait_.push_back(tw);
  id->state = St::kTimewait;
  id->deadline = tw.until;
  id->retries_left = 0;
}

// ---------------------------------------------------------------------------
// What the id layer sends.

void IbCm::Begin(Conn* id) {
  id->tid = (*rng_)();
  id->local_comm_id = NewCommId();
  by_comm_[id->local_comm_id] = id;
}

void IbCm::SendSidrReq(Conn* id, uint64_t service_id, const IpHeader& ih, const ConnParam& p) {
  Begin(id);
  SidrReq r;
  r.request_id = id->local_comm_id;
  r.service_id = service_id;
  encode_ip_header(ih, r.private_data.data());
  std::memcpy(r.private_data.data() + kIpHeaderSize, p.private_data, p.private_data_len);
  id->state = St::kSidrReqSent;
  // rdma_cm's SIDR timeout: 1 << (CMA_CM_RESPONSE_TIMEOUT - 8) ms.
  SendRemembered(id, r, (uint64_t{1} << (kCmResponseTimeout - 8)) * kMs, kMaxCmRetries);
}

void IbCm::SendReq(Conn* id, const LocalPort& port, uint64_t service_id, const IpHeader& ih, const ConnParam& p) {
  Begin(id);
  id->local_qpn = p.qp_num;
  id->local_psn = RandomPsn();
  id->responder_resources = p.responder_resources;
  id->initiator_depth = p.initiator_depth;
  id->retry_count = p.retry_count & 7;
  id->rnr_retry = p.rnr_retry_count & 7;
  id->srq = p.srq;
  id->flow_control = p.flow_control;
  id->path_mtu = port.active_mtu;
  Req r;
  r.local_comm_id = id->local_comm_id;
  r.service_id = service_id;
  r.local_ca_guid = port.node_guid;
  r.local_qpn = p.qp_num & 0xFFFFFF;
  r.responder_resources = p.responder_resources;
  r.initiator_depth = p.initiator_depth;
  r.remote_cm_response_timeout = kCmResponseTimeout;
  r.transport_type = 0;  // RC
  r.end_to_end_flow_control = p.flow_control != 0;
  r.starting_psn = id->local_psn;
  r.local_cm_response_timeout = kCmResponseTimeout;
  r.retry_count = id->retry_count;
  r.pkey = 0xFFFF;
  r.path_mtu = id->path_mtu;
  r.rnr_retry_count = id->rnr_retry;
  r.max_cm_retries = kMaxCmRetries;
  r.srq = p.srq != 0;
  r.primary.local_gid = id->sgid;
  r.primary.remote_gid = id->dgid;
  r.primary.traffic_class = id->tos;
  r.primary.hop_limit = kHopLimit;
  r.primary.packet_rate = 0;
  r.primary.local_ack_timeout = std::min(31, kPacketLifeTime + 1);
  encode_ip_header(ih, r.private_data.data());
  std::memcpy(r.private_data.data() + kIpHeaderSize, p.private_data, p.private_data_len);
  id->state = St::kReqSent;
  SendRemembered(id, r, (iba_ms(kPacketLifeTime) * 2 + iba_ms(kCmResponseTimeout)) * kMs, kMaxCmRetries);
}

void IbCm::SendRtu(Conn* id) {
  Rtu rtu;
  rtu.local_comm_id = id->local_comm_id;
  rtu.remote_comm_id = id->remote_comm_id;
  id->last = rtu;
  id->has_last = true;
  Send(*id, rtu, id->tid);
  id->state = St::kEstablished;
  DropTimer(id);
}

void IbCm::TakeReq(Conn* id, const LocalPort& port, const MadHeader& h, const Req& r) {
  id->tid = h.tid;
  id->local_comm_id = NewCommId();
  by_comm_[id->local_comm_id] = id;
  id->remote_comm_id = r.local_comm_id;
  id->remote_guid = r.local_ca_guid;
  id->remote_qpn = r.local_qpn;
  id->remote_psn = r.starting_psn;
  id->local_psn = RandomPsn();
  // In this side's terms: its responder resources serve the peer's
  // initiator depth and the other way round (cm_format_req_event).
  id->responder_resources = r.initiator_depth;
  id->initiator_depth = r.responder_resources;
  id->retry_count = r.retry_count;
  id->rnr_retry = r.rnr_retry_count;
  id->srq = r.srq;
  id->flow_control = r.end_to_end_flow_control;
  id->path_mtu = std::min(r.path_mtu, port.active_mtu);
  id->remote_cm_timeout = r.local_cm_response_timeout;
  id->max_cm_retries = r.max_cm_retries;
  id->remote_ack_delay = port.ack_delay;
  id->state = St::kReqRcvd;
}

void IbCm::TakeSidrReq(Conn* id, const MadHeader& h, const SidrReq& m) {
  id->tid = h.tid;
  id->remote_comm_id = m.request_id;
  id->state = St::kSidrReqRcvd;
}

void IbCm::SendSidrRep(Conn* id, uint64_t service_id, const ConnParam& p) {
  SidrRep r;
  r.request_id = id->remote_comm_id;
  r.status = kSidrSuccess;
  r.qpn = p.qp_num & 0xFFFFFF;
  r.service_id = service_id;
  r.qkey = p.qkey != 0 ? p.qkey : kUdpQkey;
  std::memcpy(r.private_data.data(), p.private_data, p.private_data_len);
  id->last = r;
  id->has_last = true;
  Send(*id, r, id->tid);
  id->state = St::kUdReady;
}

void IbCm::SendRep(Conn* id, const LocalPort& port, const ConnParam& p) {
  id->local_qpn = p.qp_num;
  id->responder_resources = p.responder_resources;
  id->initiator_depth = p.initiator_depth;
  id->srq = p.srq;
  Rep r;
  r.local_comm_id = id->local_comm_id;
  r.remote_comm_id = id->remote_comm_id;
  r.local_qpn = p.qp_num & 0xFFFFFF;
  r.starting_psn = id->local_psn;
  r.responder_resources = p.responder_resources;
  r.initiator_depth = p.initiator_depth;
  r.target_ack_delay = port.ack_delay;
  r.end_to_end_flow_control = p.flow_control != 0;
  r.rnr_retry_count = p.rnr_retry_count & 7;
  r.srq = p.srq != 0;
  r.local_ca_guid = port.node_guid;
  std::memcpy(r.private_data.data(), p.private_data, p.private_data_len);
  id->state = St::kRepSent;
  SendRemembered(id, r, (iba_ms(kPacketLifeTime) * 2 + iba_ms(id->remote_cm_timeout)) * kMs, id->max_cm_retries);
}

void IbCm::RejectSidr(Conn* id, uint64_t service_id, const uint8_t* data, uint8_t len) {
  SidrRep r;
  r.request_id = id->remote_comm_id;
  r.status = kSidrReject;
  r.service_id = service_id;
  std::memcpy(r.private_data.data(), data, std::min<size_t>(len, kSidrRepPrivate));
  Send(*id, r, id->tid);
  id->state = St::kDisconnected;
  DropTimer(id);
}

void IbCm::Reject(Conn* id, uint8_t reason, const uint8_t* data, uint8_t len) {
  Rej r;
  r.local_comm_id = id->local_comm_id;
  r.remote_comm_id = id->remote_comm_id;
  r.message_rejected = kMsgReq;
  r.reason = reason != 0 ? uint16_t{reason} : uint16_t{kRejConsumerDefined};
  std::memcpy(r.private_data.data(), data, std::min<size_t>(len, kRejPrivate));
  Send(*id, r, id->tid);
  ++stats_.rejects_sent;
  id->state = St::kDisconnected;
  DropTimer(id);
}

void IbCm::SendDreq(Conn* id) {
  if (id->state == St::kEstablished) {
    Dreq d;
    d.local_comm_id = id->local_comm_id;
    d.remote_comm_id = id->remote_comm_id;
    d.remote_qpn = id->remote_qpn & 0xFFFFFF;
    id->state = St::kDreqSent;
    SendRemembered(id, d, (iba_ms(kPacketLifeTime) * 2 + iba_ms(id->remote_cm_timeout)) * kMs,
                   id->max_cm_retries);
  }
}

void IbCm::CommEstablished(Conn* id) {
  if (id->state == St::kRepSent) {
    id->state = St::kEstablished;
    DropTimer(id);
    ids_->Deliver(*id, kEstablished, 0, nullptr);
  }
}

int IbCm::InitQpAttr(const Conn& c, uint32_t state, const AhInfo& ah, QpAttr* a) {
  const Conn* id = &c;
  const bool connected = id->state == St::kReqRcvd || id->state == St::kRepSent || id->state == St::kRepRcvd ||
                         id->state == St::kEstablished;
  switch (state) {
    case IBV_QPS_INIT:
      a->mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
      // Before a connection: no remote access yet (rdma_cm's cma_ib_init_qp_attr).
      if (connected) {
        a->access = IBV_ACCESS_REMOTE_WRITE;
        if (id->responder_resources != 0) a->access |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
      }
      return 0;
    case IBV_QPS_RTR: {
      if (!connected) return -EINVAL;
      a->mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      a->ah = ah;
      a->path_mtu = id->path_mtu;
      a->dest_qp_num = id->remote_qpn;
      // The Starting PSN this side put in its REQ or REP is the PSN its own
      // QP receives at; the peer sends with it. Linux: ib_send_cm_req and
      // ib_send_cm_rep keep their message's PSN as rq_psn, cm_req_handler
      // and cm_rep_handler take the peer's as sq_psn (cm.c).
      a->rq_psn = id->local_psn;
      a->max_dest_rd_atomic = id->responder_resources;
      a->min_rnr_timer = 0;
      return 0;
    }
    case IBV_QPS_RTS:
      if (!connected) return -EINVAL;
      a->mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                IBV_QP_MAX_QP_RD_ATOMIC;
      a->sq_psn = id->remote_psn;  // the Starting PSN of the peer's REQ or REP
      a->timeout = AckTimeout(*id);
      a->retry_cnt = id->retry_count;
      a->rnr_retry = id->rnr_retry;
      a->max_rd_atomic = id->initiator_depth;
      return 0;
    default:
      return -EINVAL;
  }
}

// ---------------------------------------------------------------------------
// MADs in.

void IbCm::OnMad(int dev, const MadSource& src, std::span<const uint8_t> bytes) {
  ++stats_.mads_in;
  Mad mad;
  if (decode(bytes, &mad) != MadError::kOk) {
    ++stats_.bad_mads;
    return;
  }
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, Req>) HandleReq(dev, src, mad.hdr, m);
        else if constexpr (std::is_same_v<T, Mra>) HandleMra(m);
        else if constexpr (std::is_same_v<T, Rej>) HandleRej(m);
        else if constexpr (std::is_same_v<T, Rep>) HandleRep(dev, src, mad.hdr, m);
        else if constexpr (std::is_same_v<T, Rtu>) HandleRtu(m);
        else if constexpr (std::is_same_v<T, Dreq>) HandleDreq(dev, src, mad.hdr, m);
        else if constexpr (std::is_same_v<T, Drep>) HandleDrep(m);
        else if constexpr (std::is_same_v<T, SidrReq>) HandleSidrReq(dev, src, mad.hdr, m);
        else if constexpr (std::is_same_v<T, SidrRep>) HandleSidrRep(m);
      },
      mad.msg);
}

void IbCm::RejectReq(int dev, const MadSource& src, const MadHeader& h, uint32_t remote_comm_id, uint16_t reason) {
  Rej r;
  r.local_comm_id = 0;
  r.remote_comm_id = remote_comm_id;
  r.message_rejected = kMsgReq;
  r.reason = reason;
  SendTo(dev, src.dgid, src.sgid, src.src_qpn, src.tclass, r, h.tid);
  ++stats_.rejects_sent;
}

void IbCm::RefuseSidrReq(int dev, const MadSource& src, const MadHeader& h, const SidrReq& m, uint8_t status) {
  SidrRep rep;
  rep.request_id = m.request_id;
  rep.service_id = m.service_id;
  rep.status = status;
  SendTo(dev, src.dgid, src.sgid, src.src_qpn, src.tclass, rep, h.tid);
}

void IbCm::HandleReq(int dev, const MadSource& src, const MadHeader& h, const Req& r, uint64_t held_until) {
  // A duplicate of a REQ being handled: resend what was answered, or an MRA
  // while the application has not decided yet.
  bool duplicate = false;
  ids_->ForEachConn([&](Conn& c) {
    Conn* id = &c;
    if (id->remote_comm_id != r.local_comm_id || id->remote_guid != r.local_ca_guid || id->parent == 0) return false;
    ++stats_.duplicates;
    if (id->state == St::kReqRcvd) {
      Mra m;
      m.local_comm_id = id->local_comm_id;
      m.remote_comm_id = id->remote_comm_id;
      m.message_mraed = kMsgReq;
      m.service_timeout = kMraServiceTimeout;
      Send(*id, m, id->tid);
    } else if (id->state == St::kRepSent && id->has_last) {
      Send(*id, id->last, id->tid);
    }
    return duplicate = true;
  });
  if (duplicate) return;
  // A REQ of a connection in timewait, or from a QP still connected here.
  const uint64_t now = clock_();
  std::erase_if(timewait_, [now](const Timewait& t) { return t.until <= now; });
  for (const Timewait& t : timewait_) {
    if ((t.remote_guid == r.local_ca_guid && t.remote_comm_id == r.local_comm_id) ||
        (t.remote_qpn == r.local_qpn && t.remote_gid == src.sgid)) {
      ++stats_.stale;
      RejectReq(dev, src, h, r.local_comm_id, kRejStaleConn);
      return;
    }
  }
  bool stale = false;
  ids_->ForEachConn([&](Conn& c) {
    const Conn* id = &c;
    return stale = id->state == St::kEstablished && id->remote_qpn == r.local_qpn && id->dgid == src.sgid;
  });
  if (stale) {
    ++stats_.stale;
    RejectReq(dev, src, h, r.local_comm_id, kRejStaleConn);
    return;
  }
  ids_->ReqReceived(dev, src, h, r, held_until);
}

bool IbCm::HoldEarly(int dev, const MadSource& src, const MadHeader& h, const std::variant<Req, SidrReq>& msg,
                     uint64_t held_until) {
  // The same request again (the peer's retransmission): one is held.
  auto same = [&](const EarlyReq& e) {
    if (e.msg.index() != msg.index() || !(e.src.sgid == src.sgid)) return false;
    if (const Req* r = std::get_if<Req>(&msg)) {
      const Req& o = std::get<Req>(e.msg);
      return o.local_comm_id == r->local_comm_id && o.local_ca_guid == r->local_ca_guid;
    }
    return std::get<SidrReq>(e.msg).request_id == std::get<SidrReq>(msg).request_id;
  };
  if (held_until == 0 && std::any_of(early_.begin(), early_.end(), same)) {
    ++stats_.duplicates;
    return true;
  }
  if (early_.size() >= kMaxEarlyReqs) return false;
  if (held_until == 0) ++stats_.early_reqs;
  early_.push_back({dev, src, h, msg, held_until != 0 ? held_until : clock_() + kEarlyReqHoldNs});
  return true;
}

void IbCm::RefuseNoListener(const EarlyReq& e) {
  ++stats_.no_listener;
  if (const Req* r = std::get_if<Req>(&e.msg)) {
    RejectReq(e.dev, e.src, e.h, r->local_comm_id, kRejInvalidServiceId);
    return;
  }
  RefuseSidrReq(e.dev, e.src, e.h, std::get<SidrReq>(e.msg), kSidrUnsupported);
}

// Every held request is handled again, in the order they came; those the
// new listener is not for are held again until their own deadline.
void IbCm::ReplayEarly() {
  if (early_.empty()) return;
  std::vector<EarlyReq> held;
  held.swap(early_);
  for (const EarlyReq& e : held) {
    if (const Req* r = std::get_if<Req>(&e.msg)) HandleReq(e.dev, e.src, e.h, *r, e.until);
    else HandleSidrReq(e.dev, e.src, e.h, std::get<SidrReq>(e.msg), e.until);
  }
}

uint64_t IbCm::ExpireEarly(uint64_t now) {
  if (early_.empty()) return 0;
  uint64_t next = 0;
  std::vector<EarlyReq> keep, due;
  for (EarlyReq& e : early_) {
    if (e.until > now) {
      if (next == 0 || e.until < next) next = e.until;
      keep.push_back(std::move(e));
    } else {
      due.push_back(std::move(e));
    }
  }
  early_.swap(keep);
  for (const EarlyReq& e : due) RefuseNoListener(e);
  return next;
}

void IbCm::HandleMra(const Mra& m) {
  Conn* id = FindByComm(m.remote_comm_id);
  if (id == nullptr) {
    ++stats_.unknown_comm_id;
    return;
  }
  const bool for_req = id->state == St::kReqSent && m.message_mraed == kMsgReq;
  const bool for_rep = id->state == St::kRepSent && m.message_mraed == kMsgRep;
  if (!for_req && !for_rep) return;
  // The peer needs longer: wait its service timeout before trying again.
  id->deadline = clock_() + (iba_ms(m.service_timeout) + iba_ms(kPacketLifeTime) * 2) * kMs;
}

void IbCm::HandleRej(const Rej& m) {
  Conn* id = FindByComm(m.remote_comm_id);
  if (id == nullptr) {
    ++stats_.unknown_comm_id;
    return;
  }
  if (id->remote_comm_id != 0 && m.local_comm_id != 0 && m.local_comm_id != id->remote_comm_id) return;
  switch (id->state) {
    case St::kReqSent:
    case St::kRepRcvd:
    case St::kRepSent:
    case St::kReqRcvd:
    case St::kEstablished: {
      const bool was_pending = id->state == St::kReqRcvd;
      if (m.reason == kRejStaleConn && id->state == St::kEstablished) EnterTimewait(id);
      else {
        id->state = St::kDisconnected;
        DropTimer(id);
      }
      if (was_pending) ids_->RequestSettled(*id);
      ConnParam p;
      p.private_data_len = static_cast<uint8_t>(kRejPrivate);
      std::memcpy(p.private_data, m.private_data.data(), kRejPrivate);
      ids_->Deliver(*id, kRejected, m.reason, &p);
      return;
    }
    default:
      return;
  }
}

void IbCm::HandleRep(int dev, const MadSource& src, const MadHeader& h, const Rep& m) {
  Conn* id = FindByComm(m.remote_comm_id);
  if (id == nullptr) {
    ++stats_.unknown_comm_id;
    Rej r;
    r.remote_comm_id = m.local_comm_id;
    r.message_rejected = kMsgRep;
    r.reason = kRejInvalidCommId;
    SendTo(dev, src.dgid, src.sgid, src.src_qpn, src.tclass, r, h.tid);
    ++stats_.rejects_sent;
    return;
  }
  if (id->state == St::kEstablished && id->remote_comm_id == m.local_comm_id) {
    // Our RTU was lost: send it again.
    ++stats_.duplicates;
    if (id->has_last) Send(*id, id->last, id->tid);
    return;
  }
  if (id->state != St::kReqSent) {
    ++stats_.duplicates;
    return;
  }
  id->remote_comm_id = m.local_comm_id;
  id->remote_guid = m.local_ca_guid;
  id->remote_qpn = m.local_qpn;
  id->remote_psn = m.starting_psn;
  // This side's terms (cm_rep_handler).
  id->initiator_depth = m.responder_resources;
  id->responder_resources = m.initiator_depth;
  id->rnr_retry = m.rnr_retry_count;
  id->remote_ack_delay = m.target_ack_delay;
  id->state = St::kRepRcvd;
  DropTimer(id);
  ConnParam p;
  p.qp_num = m.local_qpn;
  p.responder_resources = id->responder_resources;
  p.initiator_depth = id->initiator_depth;
  p.flow_control = m.end_to_end_flow_control;
  p.rnr_retry_count = m.rnr_retry_count;
  p.srq = m.srq;
  p.private_data_len = static_cast<uint8_t>(kRepPrivate);
  std::memcpy(p.private_data, m.private_data.data(), kRepPrivate);
  ids_->Deliver(*id, kConnectResponse, 0, &p);
}

void IbCm::HandleRtu(const Rtu& m) {
  Conn* id = FindByComm(m.remote_comm_id);
  if (id == nullptr) {
    ++stats_.unknown_comm_id;
    return;
  }
  if (id->state != St::kRepSent || m.local_comm_id != id->remote_comm_id) return;
  id->state = St::kEstablished;
  DropTimer(id);
  ids_->Deliver(*id, kEstablished, 0, nullptr);
}

void IbCm::HandleDreq(int dev, const MadSource& src, const MadHeader& h, const Dreq& m) {
  Conn* id = FindByComm(m.remote_comm_id);
  Drep d;
  d.local_comm_id = m.remote_comm_id;
  d.remote_comm_id = m.local_comm_id;
  if (id == nullptr || id->remote_comm_id != m.local_comm_id) {
    // As the kernel: answer anyway, so a peer whose partner went away can
    // finish its disconnect.
    ++stats_.unknown_comm_id;
    SendTo(dev, src.dgid, src.sgid, src.src_qpn, src.tclass, d, h.tid);
    return;
  }
  if (m.remote_qpn != (id->local_qpn & 0xFFFFFF)) return;
  switch (id->state) {
    case St::kEstablished:
    case St::kRepSent:
    case St::kRepRcvd:
    case St::kDreqSent:
      Send(*id, d, h.tid);
      EnterTimewait(id);
      id->last = d;
      id->has_last = true;
      ids_->Deliver(*id, kDisconnected, 0, nullptr);
      return;
    case St::kTimewait:
    case St::kDisconnected:
      ++stats_.duplicates;
      Send(*id, d, h.tid);
      return;
    default:
      return;
  }
}

void IbCm::HandleDrep(const Drep& m) {
  Conn* id = FindByComm(m.remote_comm_id);
  if (id == nullptr) {
    ++stats_.unknown_comm_id;
    return;
  }
  if (id->state != St::kDreqSent) return;
  EnterTimewait(id);
  ids_->Deliver(*id, kDisconnected, 0, nullptr);
}

void IbCm::HandleSidrReq(int dev, const MadSource& src, const MadHeader& h, const SidrReq& m, uint64_t held_until) {
  bool duplicate = false;
  ids_->ForEachConn([&](Conn& c) {
    Conn* id = &c;
    if (id->parent == 0 || id->qp_type != kQpUd || id->remote_comm_id != m.request_id || !(id->dgid == src.sgid))
      return false;
    ++stats_.duplicates;
    if (id->state == St::kUdReady && id->has_last) Send(*id, id->last, id->tid);
    return duplicate = true;
  });
  if (duplicate) return;
  ids_->SidrReqReceived(dev, src, h, m, held_until);
}

void IbCm::HandleSidrRep(const SidrRep& m) {
  Conn* id = FindByComm(m.request_id);
  if (id == nullptr || id->state != St::kSidrReqSent) {
    ++stats_.unknown_comm_id;
    return;
  }
  DropTimer(id);
  id->state = m.status != kSidrSuccess ? St::kDisconnected : St::kUdReady;
  ids_->SidrRepReceived(*id, m);
}

// ---------------------------------------------------------------------------
// Time.

void IbCm::OnDeadline(Conn* id, uint64_t now) {
  switch (id->state) {
    case St::kReqSent:
    case St::kRepSent:
    case St::kDreqSent:
    case St::kSidrReqSent:
      if (id->retries_left > 0 && id->has_last) {
        --id->retries_left;
        ++stats_.retransmits;
        Send(*id, id->last, id->tid);
        const uint64_t timeout = id->state == St::kSidrReqSent
                                     ? (uint64_t{1} << (kCmResponseTimeout - 8)) * kMs
                                     : (iba_ms(kPacketLifeTime) * 2 + iba_ms(id->remote_cm_timeout)) * kMs;
        id->deadline = now + timeout;
        break;
      }
      if (id->state == St::kDreqSent) {
        // No DREP: the connection is over all the same.
        EnterTimewait(id);
        ids_->Deliver(*id, kDisconnected, 0, nullptr);
      } else {
        id->state = St::kDisconnected;
        id->deadline = 0;
        ids_->Deliver(*id, kUnreachable, -ETIMEDOUT, nullptr);
      }
      break;
    case St::kTimewait:
      id->state = St::kDisconnected;
      id->deadline = 0;
      ids_->Deliver(*id, kTimewaitExit, 0, nullptr);
      break;
    default:
      id->deadline = 0;
      break;
  }
}

}  // namespace droce::cm
