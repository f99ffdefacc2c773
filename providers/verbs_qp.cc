// QPs, SRQs, address handles and UD multicast.
#include <cerrno>
#include <cstring>
#include <mutex>

#include "provider.h"
#include "system_verbs.h"

namespace droce::provider {

namespace {

// An enum field of the caller's struct as the integer it holds: fields the
// attribute mask leaves out are often uninitialised (librdmacm's
// ucma_modify_qp_err sets only qp_state), and loading an out-of-range value
// through the enum type is undefined behaviour. The engine checks the
// values the mask selects.
template <typename E>
uint32_t raw(const E& e) {
  static_assert(sizeof(E) == sizeof(uint32_t));
  uint32_t v;
  std::memcpy(&v, &e, sizeof(v));
  return v;
}

transport::QpAttr to_attr(const ibv_qp_attr& a) {
  transport::QpAttr t;
  t.state = static_cast<transport::QpState>(raw(a.qp_state));
  t.cur_state = static_cast<transport::QpState>(raw(a.cur_qp_state));
  t.access_flags = a.qp_access_flags;
  t.pkey_index = a.pkey_index;
  t.port_num = a.port_num;
  t.qkey = a.qkey;
  std::memcpy(t.av.dgid, a.ah_attr.grh.dgid.raw, 16);
  t.av.flow_label = a.ah_attr.grh.flow_label;
  t.av.sgid_index = a.ah_attr.grh.sgid_index;
  t.av.hop_limit = a.ah_attr.grh.hop_limit;
  t.av.traffic_class = a.ah_attr.grh.traffic_class;
  t.av.sl = a.ah_attr.sl;
  t.av.is_global = a.ah_attr.is_global;
  t.av.port_num = a.ah_attr.port_num;
  t.av.dlid = a.ah_attr.dlid;
  t.path_mtu = static_cast<uint8_t>(raw(a.path_mtu));
  t.timeout = a.timeout;
  t.retry_cnt = a.retry_cnt;
  t.rnr_retry = a.rnr_retry;
  t.rq_psn = a.rq_psn;
  t.max_rd_atomic = a.max_rd_atomic;
  t.min_rnr_timer = a.min_rnr_timer;
  t.sq_psn = a.sq_psn;
  t.max_dest_rd_atomic = a.max_dest_rd_atomic;
  t.dest_qpn = a.dest_qp_num;
  t.en_sqd_async_notify = a.en_sqd_async_notify != 0;
  t.rate_limit = a.rate_limit;
  return t;
}

void from_attr(const transport::QpAttr& t, ibv_qp_attr* a) {
  std::memset(a, 0, sizeof(*a));
  a->qp_state = static_cast<ibv_qp_state>(t.state);
  a->cur_qp_state = a->qp_state;
  a->path_mtu = static_cast<ibv_mtu>(t.path_mtu);
  a->path_mig_state = IBV_MIG_MIGRATED;
  a->qkey = t.qkey;
  a->rq_psn = t.rq_psn;
  a->sq_psn = t.sq_psn;
  a->dest_qp_num = t.dest_qpn;
  a->rate_limit = t.rate_limit;
  a->qp_access_flags = t.access_flags;
  std::memcpy(a->ah_attr.grh.dgid.raw, t.av.dgid, 16);
  a->ah_attr.grh.flow_label = t.av.flow_label;
  a->ah_attr.grh.sgid_index = t.av.sgid_index;
  a->ah_attr.grh.hop_limit = t.av.hop_limit;
  a->ah_attr.grh.traffic_class = t.av.traffic_class;
  a->ah_attr.sl = t.av.sl;
  a->ah_attr.is_global = t.av.is_global;
  a->ah_attr.port_num = t.av.port_num;
  a->ah_attr.dlid = t.av.dlid;
  a->pkey_index = t.pkey_index;
  a->max_rd_atomic = t.max_rd_atomic;
  a->max_dest_rd_atomic = t.max_dest_rd_atomic;
  a->min_rnr_timer = t.min_rnr_timer;
  a->port_num = t.port_num;
  a->timeout = t.timeout;
  a->retry_cnt = t.retry_cnt;
  a->rnr_retry = t.rnr_retry;
}

}  // namespace

ibv_qp* create_qp_common(ibv_context* c, ibv_pd* pd, ibv_qp_init_attr_ex* attr, bool ex) {
  // An XRC target QP (IBV_QPT_XRC_RECV) has an XRC domain and nothing
  // else: no PD, CQs, SRQ or queues. An XRC initiator (IBV_QPT_XRC_SEND)
  // has a PD and a send CQ only.
  const bool tgt = attr != nullptr && attr->qp_type == IBV_QPT_XRC_RECV;
  const bool ini = attr != nullptr && attr->qp_type == IBV_QPT_XRC_SEND;
  if (!context_is_ours(c) || attr == nullptr ||
      (tgt ? attr->xrcd == nullptr || attr->xrcd->context != c
           : pd == nullptr || attr->send_cq == nullptr || (!ini && attr->recv_cq == nullptr))) {
    errno = EINVAL;
    return nullptr;
  }
  if (attr->qp_type != IBV_QPT_RC && attr->qp_type != IBV_QPT_UC && attr->qp_type != IBV_QPT_UD && !tgt && !ini) {
    errno = EOPNOTSUPP;  // raw packet, driver QPs
    return nullptr;
  }
  if (attr->srq != nullptr && (attr->srq->context != c || tgt || ini)) {
    errno = EINVAL;
    return nullptr;
  }
  uint64_t kSupportedOps = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  if (attr->qp_type != IBV_QPT_UD) {
    kSupportedOps |= IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
                     IBV_QP_EX_WITH_BIND_MW | IBV_QP_EX_WITH_LOCAL_INV;
  }
  if (attr->qp_type == IBV_QPT_RC || ini) {
    kSupportedOps |= IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                     IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_SEND_WITH_INV;
  }
  if (attr->qp_type == IBV_QPT_RC) kSupportedOps |= IBV_QP_EX_WITH_ATOMIC_WRITE;
  if (tgt) kSupportedOps = 0;  // no send queue
  if (ex && (attr->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) &&
      (attr->send_ops_flags & ~kSupportedOps)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (tgt) attr->cap = {};  // it has no queues: nothing is asked or granted
  if (ini) attr->cap.max_recv_wr = attr->cap.max_recv_sge = 0;
  auto* qp = new Qp();
  engine::QpCreateArgs a;
  a.type = static_cast<transport::QpType>(attr->qp_type);
  a.srq = attr->srq != nullptr ? to_srq(attr->srq)->handle.id : 0;
  a.events = &to_ctx(c)->s->events;
  a.cookie = reinterpret_cast<uint64_t>(qp);
  a.pd = tgt ? 0 : reinterpret_cast<Pd*>(pd)->id;
  a.xrcd = tgt ? reinterpret_cast<Xrcd*>(attr->xrcd)->id : 0;
  a.send_cq = tgt ? 0 : to_cq(attr->send_cq)->handle.id;
  a.recv_cq = tgt || attr->recv_cq == nullptr ? 0 : to_cq(attr->recv_cq)->handle.id;
  a.max_send_wr = attr->cap.max_send_wr;
  a.max_recv_wr = attr->cap.max_recv_wr;
  a.max_send_sge = attr->cap.max_send_sge;
  a.max_recv_sge = attr->cap.max_recv_sge;
  a.max_inline = attr->cap.max_inline_data;
  a.sq_sig_all = attr->sq_sig_all != 0;
  auto h = engine_of(c)->CreateQp(a);
  if (!h.ok()) {
    delete qp;
    errno = status_errno(h.status());
    return nullptr;
  }
  std::memset(&qp->qpx, 0, sizeof(qp->qpx));
  qp->handle = *h;
  qp->max_send_sge = h->caps.max_send_sge;
  qp->max_recv_sge = h->caps.max_recv_sge;
  qp->max_inline = h->caps.max_inline;
  ibv_qp& q = qp->qpx.qp_base;
  q.context = c;
  q.qp_context = attr->qp_context;
  q.pd = tgt ? nullptr : pd;
  q.send_cq = tgt ? nullptr : attr->send_cq;
  q.recv_cq = tgt || ini ? nullptr : attr->recv_cq;
  q.srq = attr->srq;
  q.handle = h->qpn;
  q.qp_num = h->qpn;
  q.state = IBV_QPS_RESET;
  q.qp_type = attr->qp_type;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  init_qp_ex_ops(&qp->qpx);
  if (tgt) {
    qp->xrcd = a.xrcd;
    xrc_tgt_add(qp);
    return &q;
  }
  // Report the capabilities actually granted (ibv_create_qp(3)).
  attr->cap.max_send_wr = h->caps.max_send_wr;
  attr->cap.max_recv_wr = h->caps.max_recv_wr;
  attr->cap.max_send_sge = h->caps.max_send_sge;
  attr->cap.max_recv_sge = h->caps.max_recv_sge;
  attr->cap.max_inline_data = h->caps.max_inline;
  if (ini) attr->cap.max_recv_wr = attr->cap.max_recv_sge = 0;  // it has no receive queue
  return &q;
}

ibv_qp* create_qp_ex_impl(ibv_context* c, ibv_qp_init_attr_ex* attr) {
  // An XRC target QP names its XRC domain instead of a PD.
  const bool tgt = attr != nullptr && attr->qp_type == IBV_QPT_XRC_RECV;
  if (attr == nullptr || !(attr->comp_mask & (tgt ? IBV_QP_INIT_ATTR_XRCD : IBV_QP_INIT_ATTR_PD))) {
    errno = EINVAL;
    return nullptr;
  }
  // The masks a RoCE provider without raw packet QPs takes: PD, XRCD,
  // SEND_OPS_FLAGS and CREATE_FLAGS. MAX_TSO_HEADER (raw packet TSO),
  // IND_TABLE and RX_HASH (raw packet RSS) are EOPNOTSUPP, as is any
  // creation flag (rxe's answer to all of them): BLOCK_SELF_MCAST_LB and
  // SOURCE_QPN are UD features droce does not have, the rest are raw packet
  // offloads.
  if (attr->comp_mask & ~(uint32_t{IBV_QP_INIT_ATTR_PD} | IBV_QP_INIT_ATTR_XRCD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS |
                          IBV_QP_INIT_ATTR_CREATE_FLAGS)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if ((attr->comp_mask & IBV_QP_INIT_ATTR_CREATE_FLAGS) && attr->create_flags != 0) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  // An XRC domain is for XRC target QPs only.
  if ((attr->comp_mask & IBV_QP_INIT_ATTR_XRCD) && !tgt) {
    errno = EINVAL;
    return nullptr;
  }
  return create_qp_common(c, tgt ? nullptr : attr->pd, attr, true);
}

// ibv_modify_qp_rate_limit(3): the rate with its burst and typical packet
// size, on a QP in RTS (RTS to RTS, as mlx5 does it).
int modify_qp_rate_limit(ibv_qp* qp, ibv_qp_rate_limit_attr* attr) {
  if (qp == nullptr || attr == nullptr || attr->comp_mask != 0) return EINVAL;
  if (attr->rate_limit > droce::transport::kMaxRateLimitKbps) return EINVAL;
  Qp* q = to_qp(qp);
  std::scoped_lock l(q->sq_mu, q->rq_mu);
  droce::transport::QpAttr t;
  t.state = droce::transport::QpState::kRts;
  t.rate_limit = attr->rate_limit;
  t.max_burst_sz = attr->max_burst_sz;
  t.typical_pkt_sz = attr->typical_pkt_sz;
  return engine_of(qp->context)->ModifyQp(qp->qp_num, t, droce::transport::kAttrState | droce::transport::kAttrRateLimit);
}

// A basic SRQ (xrcd 0) or an XRC SRQ of domain `xrcd` completing to `cq`.
ibv_srq* create_srq_common(ibv_pd* pd, ibv_srq_attr* attr, void* srq_context, uint32_t xrcd, ibv_cq* cq) {
  auto* s = new Srq();
  auto h = engine_of(pd->context)
               ->CreateSrq(reinterpret_cast<Pd*>(pd)->id, attr->max_wr, attr->max_sge, attr->srq_limit,
                           &to_ctx(pd->context)->s->events, reinterpret_cast<uint64_t>(s), xrcd,
                           cq != nullptr ? to_cq(cq)->handle.id : 0);
  if (!h.ok()) {
    delete s;
    errno = status_errno(h.status());
    return nullptr;
  }
  s->handle = *h;
  s->srq.context = pd->context;
  s->srq.srq_context = srq_context;
  s->srq.pd = pd;
  s->srq.handle = h->id;
  pthread_mutex_init(&s->srq.mutex, nullptr);
  pthread_cond_init(&s->srq.cond, nullptr);
  s->srq.events_completed = 0;
  attr->max_wr = h->max_wr;
  attr->max_sge = h->max_sge;
  return &s->srq;
}

}  // namespace droce::provider

using namespace droce::provider;

extern "C" {

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  DROCE_FORWARD_FOREIGN(ctx_of(pd), ibv_create_qp, pd, attr);
  if (pd == nullptr || attr == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_qp_init_attr_ex ex{};
  ex.qp_context = attr->qp_context;
  ex.send_cq = attr->send_cq;
  ex.recv_cq = attr->recv_cq;
  ex.srq = attr->srq;
  ex.cap = attr->cap;
  ex.qp_type = attr->qp_type;
  ex.sq_sig_all = attr->sq_sig_all;
  ex.comp_mask = IBV_QP_INIT_ATTR_PD;
  ex.pd = pd;
  ibv_qp* qp = create_qp_common(pd->context, pd, &ex, false);
  if (qp != nullptr) attr->cap = ex.cap;
  return qp;
}

int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask) {
  DROCE_FORWARD_FOREIGN(ctx_of(qp), ibv_modify_qp, qp, attr, attr_mask);
  if (qp == nullptr || attr == nullptr) return EINVAL;
  Qp* q = to_qp(qp);
  // Bits libibverbs does not define, or droce does not take (IBV_QP_RATE_LIMIT
  // it does: packet pacing).
  if (attr_mask & ~(0x3FFFFF | IBV_QP_RATE_LIMIT)) return EINVAL;
  if (attr_mask & IBV_QP_CAP) return EINVAL;  // resizing a QP is not supported (nor by rxe)
  // Hold both queue locks so that posting sees a consistent state.
  std::scoped_lock l(q->sq_mu, q->rq_mu);
  int rc = engine_of(qp->context)->ModifyQp(qp->qp_num, to_attr(*attr), static_cast<uint32_t>(attr_mask));
  if (rc != 0) return rc;
  if (attr_mask & IBV_QP_STATE) {
    qp->state = attr->qp_state;
    if (attr->qp_state == IBV_QPS_RESET) {
      q->sq_prod = q->handle.sq.load_prod_relaxed();
      q->rq_prod = q->handle.rq.load_prod_relaxed();
      // Its completions not yet polled go, as libmlx5 removes them: a QP
      // brought back from the error state does not hand its old flushes to
      // the next poll. (On an SRQ, a removed receive's WQE is not returned.)
      for (ibv_cq* c : {qp->recv_cq, qp->send_cq}) {
        if (c == nullptr) continue;
        Cq* cq = to_cq(c);
        std::lock_guard<std::mutex> pl(cq->poll_mu);
        cq->consumer->Clean(qp->qp_num);
        if (qp->send_cq == qp->recv_cq) break;
      }
    }
  }
  return 0;
}

int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attr, int attr_mask, ibv_qp_init_attr* init_attr) {
  DROCE_FORWARD_FOREIGN(ctx_of(qp), ibv_query_qp, qp, attr, attr_mask, init_attr);
  (void)attr_mask;  // everything is returned, as providers may
  if (qp == nullptr || attr == nullptr || init_attr == nullptr) return EINVAL;
  Qp* q = to_qp(qp);
  auto a = engine_of(qp->context)->QueryQp(qp->qp_num);
  if (!a.ok()) return status_errno(a.status());
  from_attr(*a, attr);
  qp->state = attr->qp_state;  // as libibverbs' ibv_query_qp does
  attr->cap.max_send_wr = q->handle.caps.max_send_wr;
  attr->cap.max_recv_wr = q->handle.caps.max_recv_wr;
  attr->cap.max_send_sge = q->handle.caps.max_send_sge;
  attr->cap.max_recv_sge = q->handle.caps.max_recv_sge;
  attr->cap.max_inline_data = q->handle.caps.max_inline;
  std::memset(init_attr, 0, sizeof(*init_attr));
  init_attr->qp_context = qp->qp_context;
  init_attr->send_cq = qp->send_cq;
  init_attr->recv_cq = qp->recv_cq;
  init_attr->srq = qp->srq;
  init_attr->cap = attr->cap;
  init_attr->qp_type = qp->qp_type;
  return 0;
}

int ibv_destroy_qp(ibv_qp* qp) {
  DROCE_FORWARD_FOREIGN(ctx_of(qp), ibv_destroy_qp, qp);
  if (qp == nullptr) return EINVAL;
  Qp* q = to_qp(qp);
  if (q->real != nullptr) {
    // A handle ibv_open_qp made: only it goes (IBA 11.2.5.5: the QP stays
    // with its creator). It receives no events of its own.
    q->real->opens.fetch_sub(1);
    pthread_mutex_destroy(&qp->mutex);
    pthread_cond_destroy(&qp->cond);
    delete q;
    return 0;
  }
  if (qp->qp_type == IBV_QPT_XRC_RECV) {
    if (int rc = xrc_tgt_remove(q); rc != 0) return rc;
  }
  if (stats_enabled()) print_qp_counters(qp);
  if (int rc = status_errno(engine_of(qp->context)->DestroyQp(qp->qp_num)); rc != 0) {
    if (qp->qp_type == IBV_QPT_XRC_RECV) xrc_tgt_add(q);
    return rc;
  }
  if (latency_on()) to_ctx(qp->context)->s->latency.Report(ibv_get_device_name(qp->context->device), qp->qp_num);
  // No event can be raised for it any more: drop those not yet read, and
  // wait until those read are acknowledged, as the kernel and libibverbs do.
  drop_async_events(to_ctx(qp->context), [qp](const ibv_async_event& e) { return e.element.qp == qp; },
                    /*qp_events=*/true);
  wait_acks(&qp->mutex, &qp->cond, [qp] { return qp->events_completed == to_qp(qp)->events_reported.load(); });
  pthread_mutex_destroy(&qp->mutex);
  pthread_cond_destroy(&qp->cond);
  delete to_qp(qp);
  return 0;
}

// UD multicast (ibv_attach_mcast(3)): the MLID is ignored on RoCE (IBA
// A17.5.6); the errors are the kernel's (engine/mcast.h).
int ibv_attach_mcast(ibv_qp* qp, const union ibv_gid* gid, uint16_t lid) {
  DROCE_FORWARD_FOREIGN(ctx_of(qp), ibv_attach_mcast, qp, gid, lid);
  if (qp == nullptr || gid == nullptr || !context_is_ours(qp->context)) return EINVAL;
  droce::wire::Ipv6Addr mgid;
  std::memcpy(mgid.data(), gid->raw, 16);
  return engine_of(qp->context)->AttachMcast(qp->qp_num, mgid);
}

int ibv_detach_mcast(ibv_qp* qp, const union ibv_gid* gid, uint16_t lid) {
  DROCE_FORWARD_FOREIGN(ctx_of(qp), ibv_detach_mcast, qp, gid, lid);
  if (qp == nullptr || gid == nullptr || !context_is_ours(qp->context)) return EINVAL;
  droce::wire::Ipv6Addr mgid;
  std::memcpy(mgid.data(), gid->raw, 16);
  return engine_of(qp->context)->DetachMcast(qp->qp_num, mgid);
}

ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* qp) {
  DROCE_FORWARD_FOREIGN(ctx_of(qp), ibv_qp_to_qp_ex, qp);
  if (qp == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  return &to_qp(qp)->qpx;
}


ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  DROCE_FORWARD_FOREIGN(ctx_of(pd), ibv_create_srq, pd, attr);
  if (pd == nullptr || attr == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  return create_srq_common(pd, &attr->attr, attr->srq_context, 0, nullptr);
}


int ibv_modify_srq(ibv_srq* srq, ibv_srq_attr* attr, int mask) {
  DROCE_FORWARD_FOREIGN(ctx_of(srq), ibv_modify_srq, srq, attr, mask);
  if (srq == nullptr || attr == nullptr) return EINVAL;
  if (mask & IBV_SRQ_MAX_WR) return EINVAL;  // resizing is not supported (ibv_modify_srq(3): EINVAL)
  if (mask & IBV_SRQ_LIMIT) {
    Srq* s = to_srq(srq);
    if (attr->srq_limit > s->handle.max_wr) return EINVAL;
    return engine_of(srq->context)->ModifySrq(s->handle.id, attr->srq_limit);
  }
  return 0;
}

int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* attr) {
  DROCE_FORWARD_FOREIGN(ctx_of(srq), ibv_query_srq, srq, attr);
  if (srq == nullptr || attr == nullptr) return EINVAL;
  Srq* s = to_srq(srq);
  auto limit = engine_of(srq->context)->QuerySrqLimit(s->handle.id);
  if (!limit.ok()) return status_errno(limit.status());
  attr->max_wr = s->handle.max_wr;
  attr->max_sge = s->handle.max_sge;
  attr->srq_limit = *limit;
  return 0;
}

int ibv_destroy_srq(ibv_srq* srq) {
  DROCE_FORWARD_FOREIGN(ctx_of(srq), ibv_destroy_srq, srq);
  if (srq == nullptr) return EINVAL;
  Srq* s = to_srq(srq);
  if (int rc = status_errno(engine_of(srq->context)->DestroySrq(s->handle.id)); rc != 0) return rc;
  drop_async_events(to_ctx(srq->context), [srq](const ibv_async_event& e) { return e.element.srq == srq; },
                    /*qp_events=*/false);
  wait_acks(&srq->mutex, &srq->cond, [srq, s] { return srq->events_completed == s->events_reported.load(); });
  pthread_mutex_destroy(&srq->mutex);
  pthread_cond_destroy(&srq->cond);
  delete s;
  return 0;
}

ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attr) {
  DROCE_FORWARD_FOREIGN(ctx_of(pd), ibv_create_ah, pd, attr);
  if (pd == nullptr || attr == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  droce::transport::AddressVector av;
  std::memcpy(av.dgid, attr->grh.dgid.raw, 16);
  av.flow_label = attr->grh.flow_label;
  av.sgid_index = attr->grh.sgid_index;
  av.hop_limit = attr->grh.hop_limit;
  av.traffic_class = attr->grh.traffic_class;
  av.sl = attr->sl;
  av.is_global = attr->is_global;
  av.port_num = attr->port_num;
  auto id = engine_of(pd->context)->CreateAh(reinterpret_cast<Pd*>(pd)->id, av);
  if (!id.ok()) {
    errno = status_errno(id.status());
    return nullptr;
  }
  auto* ah = new Ah();
  ah->id = *id;
  ah->ah.context = pd->context;
  ah->ah.pd = pd;
  ah->ah.handle = *id;
  return &ah->ah;
}

int ibv_destroy_ah(ibv_ah* ah) {
  DROCE_FORWARD_FOREIGN(ctx_of(ah), ibv_destroy_ah, ah);
  if (ah == nullptr) return EINVAL;
  Ah* a = reinterpret_cast<Ah*>(ah);
  if (int rc = status_errno(engine_of(ah->context)->DestroyAh(a->id)); rc != 0) return rc;
  delete a;
  return 0;
}

// The 40-byte GRH area of a UD receive holds, for RoCEv2 over IPv6, the IPv6
// header (version 6 in the first nibble) and, over IPv4, 20 zero bytes and
// then the IPv4 header (see responder.cc). The AH points back at the sender
// from the port's address of the same family (GID index 0 or 1).
int ibv_init_ah_from_wc(ibv_context* context, uint8_t port_num, ibv_wc* wc, ibv_grh* grh,
                        ibv_ah_attr* ah_attr) {
  DROCE_FORWARD_FOREIGN(context, ibv_init_ah_from_wc, context, port_num, wc, grh, ah_attr);
  if (context == nullptr || wc == nullptr || grh == nullptr || ah_attr == nullptr || port_num != 1) {
    errno = EINVAL;
    return -1;
  }
  std::memset(ah_attr, 0, sizeof(*ah_attr));
  ah_attr->port_num = port_num;
  // wc->sl of a RoCE UD receive is the L3 header type (responder.cc), not a
  // service level to send back with: the AH keeps SL 0.
  if (!(wc->wc_flags & IBV_WC_GRH)) {
    errno = EINVAL;  // RoCE always carries a GRH
    return -1;
  }
  const auto* raw = reinterpret_cast<const uint8_t*>(grh);
  ah_attr->is_global = 1;
  ah_attr->grh.hop_limit = 64;
  if ((raw[0] >> 4) == 6) {
    const uint32_t vtf = be32toh(grh->version_tclass_flow);
    std::memcpy(ah_attr->grh.dgid.raw, grh->sgid.raw, 16);
    ah_attr->grh.traffic_class = static_cast<uint8_t>(vtf >> 20);
    ah_attr->grh.flow_label = vtf & 0xFFFFF;
    ah_attr->grh.sgid_index = droce::transport::kGidIndexIpv6;
  } else if ((raw[20] >> 4) == 4) {
    const uint8_t* ip = raw + 20;
    uint8_t* d = ah_attr->grh.dgid.raw;
    d[10] = d[11] = 0xFF;
    std::memcpy(d + 12, ip + 12, 4);  // the sender's address
    ah_attr->grh.traffic_class = ip[1];
    ah_attr->grh.sgid_index = droce::transport::kGidIndexIpv4;
  } else {
    errno = EINVAL;  // not a GRH droce wrote
    return -1;
  }
  return 0;
}

ibv_ah* ibv_create_ah_from_wc(ibv_pd* pd, ibv_wc* wc, ibv_grh* grh, uint8_t port_num) {
  DROCE_FORWARD_FOREIGN(ctx_of(pd), ibv_create_ah_from_wc, pd, wc, grh, port_num);
  if (pd == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  ibv_ah_attr attr;
  if (ibv_init_ah_from_wc(pd->context, port_num, wc, grh, &attr) != 0) return nullptr;
  return ibv_create_ah(pd, &attr);
}

}  // extern "C"
