// Protection domains, memory regions, completion channels, CQs and QPs.
#include <fcntl.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <new>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "ctl/protocol.h"
#include "provider.h"
#include "system_verbs.h"

namespace droce::provider {

bool context_is_ours(ibv_context* c);

int status_errno(const absl::Status& s) { return ctl::ErrnoOf(s); }

engine::Session* engine_of(ibv_context* c) { return to_ctx(c)->s->engine.get(); }

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

// Drops the completion events queued on `ch` for `cq` that the application
// never read (ibv_destroy_cq; the kernel's ib_uverbs_release_ucq does the
// same), and takes their tokens off the eventfd without blocking, so that
// poll() on the channel does not report them. A token another thread took
// meanwhile, or one RWF_NOWAIT cannot take, is left to ibv_get_cq_event,
// which reads again when it finds the queue empty.
void drop_comp_events(Channel* ch, Cq* cq) {
  std::lock_guard<std::mutex> l(ch->mu);
  const auto dropped = std::erase(ch->events, cq);
  for (size_t i = 0; i < dropped; ++i) {
    uint64_t v;
    iovec io{&v, sizeof(v)};
    if (preadv2(ch->ch.fd, &io, 1, -1, RWF_NOWAIT) != sizeof(v)) break;
  }
}

}  // namespace

// An event counts as reported to the application when ibv_get_cq_event
// returns it, as in the kernel (ib_uverbs_comp_event_handler queues it,
// ib_uverbs_get_event counts it): ibv_destroy_cq waits only for those.
void ChannelNotifier::NotifyCq(uint64_t cookie) {
  Cq* cq = reinterpret_cast<Cq*>(cookie);
  {
    std::lock_guard<std::mutex> l(channel->mu);
    channel->events.push_back(cq);
  }
  const uint64_t one = 1;
  (void)!write(channel->ch.fd, &one, sizeof(one));
}

void ChannelNotifier::CqError(uint64_t cookie) {
  Cq* cq = reinterpret_cast<Cq*>(cookie);
  ibv_async_event ev{};
  ev.element.cq = &cq->cq;
  ev.event_type = IBV_EVENT_CQ_ERR;
  push_async_event(to_ctx(cq->cq.context), ev);
}

void ContextEvents::QpEvent(uint64_t cookie, int event_type) {
  Qp* qp = reinterpret_cast<Qp*>(cookie);
  ibv_async_event ev{};
  ev.element.qp = &qp->qpx.qp_base;
  ev.event_type = static_cast<ibv_event_type>(event_type);
  push_async_event(ctx, ev);
}

void ContextEvents::SrqEvent(uint64_t cookie, int event_type) {
  Srq* srq = reinterpret_cast<Srq*>(cookie);
  ibv_async_event ev{};
  ev.element.srq = &srq->srq;
  ev.event_type = static_cast<ibv_event_type>(event_type);
  push_async_event(ctx, ev);
}

void ContextEvents::DeviceEvent(int event_type) {
  ibv_async_event ev{};
  ev.event_type = static_cast<ibv_event_type>(event_type);
  if (event_type != IBV_EVENT_DEVICE_FATAL) ev.element.port_num = 1;
  push_async_event(ctx, ev);
}

void CqAsync::CqError(uint64_t cookie) {
  Cq* cq = reinterpret_cast<Cq*>(cookie);
  ibv_async_event ev{};
  ev.element.cq = &cq->cq;
  ev.event_type = IBV_EVENT_CQ_ERR;
  push_async_event(to_ctx(cq->cq.context), ev);
}


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

Cq* create_cq_common(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                     int comp_vector) {
  if (!context_is_ours(context) || cqe <= 0 || comp_vector < 0 ||
      comp_vector >= context->num_comp_vectors) {
    errno = EINVAL;
    return nullptr;
  }
  auto* cq = new Cq();
  std::memset(&cq->cqx, 0, sizeof(cq->cqx));
  droce::cq::CqNotifier* notifier = &cq->async_notifier;
  if (channel != nullptr) notifier = &reinterpret_cast<Channel*>(channel)->notifier;
  auto h = to_ctx(context)->s->engine->CreateCq(static_cast<uint32_t>(cqe), notifier,
                                                reinterpret_cast<uint64_t>(cq));
  if (!h.ok()) {
    delete cq;
    errno = status_errno(h.status());
    return nullptr;
  }
  if (channel != nullptr) {
    Channel* ch = reinterpret_cast<Channel*>(channel);
    std::lock_guard<std::mutex> l(ch->mu);
    ++channel->refcnt;
  }
  cq->handle = *h;
  cq->consumer = std::make_unique<droce::cq::CqConsumer>(h->region);
  cq->cq.context = context;
  cq->cq.channel = channel;
  cq->cq.cq_context = cq_context;
  cq->cq.handle = h->id;
  cq->cq.cqe = static_cast<int>(h->region->capacity());
  pthread_mutex_init(&cq->cq.mutex, nullptr);
  pthread_cond_init(&cq->cq.cond, nullptr);
  cq->cq.comp_events_completed = 0;
  cq->cq.async_events_completed = 0;
  return cq;
}

// ibv_create_cq_ex (through verbs_context): the standard completion fields,
// plus completion timestamps (nanoseconds; hca_core_clock is 1 GHz).
ibv_cq_ex* create_cq_ex_impl(ibv_context* c, ibv_cq_init_attr_ex* attr) {
  if (attr == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  constexpr uint64_t kSupported = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
                                  IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
  if ((attr->wc_flags & ~kSupported) ||
      (attr->comp_mask & ~uint32_t{IBV_CQ_INIT_ATTR_MASK_FLAGS | IBV_CQ_INIT_ATTR_MASK_PD})) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  // IBV_CQ_INIT_ATTR_MASK_PD names a parent domain of this context (as
  // mlx5 requires); it changes nothing else here.
  if ((attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_PD) &&
      (attr->parent_domain == nullptr || attr->parent_domain->context != c ||
       reinterpret_cast<Pd*>(attr->parent_domain)->parent == nullptr)) {
    errno = EINVAL;
    return nullptr;
  }
  uint32_t flags = (attr->comp_mask & IBV_CQ_INIT_ATTR_MASK_FLAGS) ? attr->flags : 0;
  if (flags & ~uint32_t{IBV_CREATE_CQ_ATTR_SINGLE_THREADED}) {
    errno = EOPNOTSUPP;  // IGNORE_OVERRUN: droce never drops completions silently
    return nullptr;
  }
  if (attr->cqe == 0 || attr->cqe > static_cast<uint32_t>(engine::Limits::kMaxCqe)) {
    errno = EINVAL;
    return nullptr;
  }
  Cq* cq = create_cq_common(c, static_cast<int>(attr->cqe), attr->cq_context, attr->channel,
                            static_cast<int>(attr->comp_vector));
  if (cq == nullptr) return nullptr;
  cq->wc_flags = attr->wc_flags;
  cq->single_threaded = flags & IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
  init_cq_ex_ops(cq);
  return &cq->cqx;
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

// verbs_context::modify_cq (ibv_modify_cq is an inline wrapper around it).
int modify_cq(ibv_cq* cq, ibv_modify_cq_attr* attr) {
  if (cq == nullptr || attr == nullptr) return EINVAL;
  if (attr->attr_mask & ~uint32_t{IBV_CQ_ATTR_MODERATE}) return EINVAL;
  if (!(attr->attr_mask & IBV_CQ_ATTR_MODERATE)) return 0;
  // cq_mod_caps advertises the whole uint16_t ranges of count and period.
  return status_errno(to_ctx(cq->context)->s->engine->ModifyCq(
      to_cq(cq)->handle.id, attr->moderate.cq_count, attr->moderate.cq_period));
}

// Live PDs and MRs by (engine session, handle): ibv_import_pd and
// ibv_import_mr find them from another context of the same device, and
// ibv_advise_mr (which names MRs by lkey) their range and access.
struct SharedKey {
  const void* session;
  uint32_t handle;
  bool operator==(const SharedKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const SharedKey& k) {
    return H::combine(std::move(h), k.session, k.handle);
  }
};
struct MrRecord {
  uint32_t pd;  // the engine's PD (a parent domain's is its parent's)
  void* addr;
  size_t length;
  unsigned access;  // IBV_ACCESS_* as registered
};
std::mutex& shared_mu() {
  static auto* mu = new std::mutex();
  return *mu;
}
absl::flat_hash_map<SharedKey, int>& shared_pds() {  // live wrappers per PD
  static auto* m = new absl::flat_hash_map<SharedKey, int>();
  return *m;
}
absl::flat_hash_map<SharedKey, MrRecord>& shared_mrs() {
  static auto* m = new absl::flat_hash_map<SharedKey, MrRecord>();
  return *m;
}
const void* session_key(ibv_context* c) { return engine_of(c); }
// After registration and re-registration: the MR as it is now.
void mr_record(const ibv_mr& mr, unsigned access) {
  std::lock_guard<std::mutex> l(shared_mu());
  shared_mrs()[{session_key(mr.context), mr.lkey}] = {reinterpret_cast<Pd*>(mr.pd)->id, mr.addr, mr.length, access};
}
void mr_forget(const ibv_mr& mr) {
  std::lock_guard<std::mutex> l(shared_mu());
  shared_mrs().erase(SharedKey{session_key(mr.context), mr.lkey});
}

// ibv_advise_mr(3), as the kernel's mlx5 answers it: an advice or flag it
// does not know is EOPNOTSUPP; no SGE is EINVAL; an lkey that is not an
// on-demand MR of this PD, a range outside it, or PREFETCH_WRITE on an MR
// without local write is ENOENT. A prefetch populates the pages
// (MADV_POPULATE_READ/WRITE; with IBV_ADVISE_MR_FLAG_FLUSH before it
// returns, which it always does here); PREFETCH_NO_FAULT maps nothing new.
int advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list, uint32_t num_sge) {
  if (pd == nullptr) return EINVAL;
  if (advice != IBV_ADVISE_MR_ADVICE_PREFETCH && advice != IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE &&
      advice != IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT) {
    return EOPNOTSUPP;
  }
  if (flags & ~static_cast<uint32_t>(IBV_ADVISE_MR_FLAG_FLUSH)) return EOPNOTSUPP;
  if (sg_list == nullptr || num_sge == 0) return EINVAL;
  const std::span<const ibv_sge> sges(sg_list, num_sge);
  {
    std::lock_guard<std::mutex> l(shared_mu());
    for (const ibv_sge& sge : sges) {
      auto it = shared_mrs().find(SharedKey{session_key(pd->context), sge.lkey});
      if (it == shared_mrs().end() || it->second.pd != reinterpret_cast<Pd*>(pd)->id) return ENOENT;
      const MrRecord& m = it->second;
      const uint64_t base = reinterpret_cast<uint64_t>(m.addr);
      if (!(m.access & IBV_ACCESS_ON_DEMAND)) return ENOENT;
      if (sge.addr < base || sge.length > m.length || sge.addr - base > m.length - sge.length) return ENOENT;
      if (advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE && !(m.access & IBV_ACCESS_LOCAL_WRITE)) return ENOENT;
    }
  }
  if (advice == IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT) return 0;
  const long page = sysconf(_SC_PAGESIZE);
  for (const ibv_sge& sge : sges) {
    if (sge.length == 0) continue;
    const uint64_t start = sge.addr & ~static_cast<uint64_t>(page - 1);
    const uint64_t end = sge.addr + sge.length;
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#define MADV_POPULATE_WRITE 23
#endif
    // Advice: a range the kernel cannot populate (a file mapping it may
    // not write, say) is left to fault in when used.
    (void)madvise(reinterpret_cast<void*>(start), end - start,
                  advice == IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE ? MADV_POPULATE_WRITE : MADV_POPULATE_READ);
  }
  return 0;
}

// ibv_alloc_parent_domain(3): a PD that is its parent PD for every verb
// (objects made with it are on the parent's PD), with an optional thread
// domain. The custom allocators are kept but never called: droce's queues
// are not buffers the provider allocates in the application's heap but
// rings the engine maps (shared memory droced can map too), as a device's
// own memory would be; there is nothing for them to place.
ibv_pd* alloc_parent_domain(ibv_context* c, ibv_parent_domain_init_attr* attr) {
  constexpr uint32_t kKnown = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
  if (attr == nullptr || attr->pd == nullptr || attr->pd->context != c || (attr->comp_mask & ~kKnown) ||
      reinterpret_cast<Pd*>(attr->pd)->parent != nullptr || (attr->td != nullptr && attr->td->context != c) ||
      ((attr->comp_mask & IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS) && (attr->alloc == nullptr || attr->free == nullptr))) {
    errno = EINVAL;
    return nullptr;
  }
  Pd* parent = reinterpret_cast<Pd*>(attr->pd);
  auto* pd = new Pd();
  pd->pd.context = c;
  pd->pd.handle = parent->pd.handle;
  pd->id = parent->id;
  pd->parent = parent;
  pd->td = attr->td;
  parent->children.fetch_add(1, std::memory_order_relaxed);
  return &pd->pd;
}

// Thread domains (ibv_alloc_td(3)): a hint that objects are used by one
// thread; droce's locks do not depend on it.
ibv_td* alloc_td(ibv_context* c, ibv_td_init_attr* attr) {
  if (attr == nullptr || attr->comp_mask != 0) {
    errno = EINVAL;
    return nullptr;
  }
  auto* td = new ibv_td();
  td->context = c;
  return td;
}
int dealloc_td(ibv_td* td) {
  if (td == nullptr) return EINVAL;
  delete td;
  return 0;
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

ibv_pd* ibv_alloc_pd(ibv_context* context) {
  DROCE_FORWARD_FOREIGN(context, ibv_alloc_pd, context);
  if (!context_is_ours(context)) {
    errno = EINVAL;
    return nullptr;
  }
  auto id = engine_of(context)->AllocPd();
  if (!id.ok()) {
    errno = status_errno(id.status());
    return nullptr;
  }
  auto* pd = new Pd();
  pd->pd.context = context;
  pd->pd.handle = *id;
  pd->id = *id;
  {
    std::lock_guard<std::mutex> l(shared_mu());
    shared_pds()[{session_key(context), *id}] = 1;
  }
  return &pd->pd;
}

// ibv_import_pd(3): the PD `handle` of another context of this device in
// this process (ibv_import_device), the same object.
ibv_pd* ibv_import_pd(ibv_context* context, uint32_t handle) {
  DROCE_FORWARD_FOREIGN(context, ibv_import_pd, context, handle);
  if (!context_is_ours(context)) {
    errno = EINVAL;
    return nullptr;
  }
  {
    std::lock_guard<std::mutex> l(shared_mu());
    if (!shared_pds().contains({session_key(context), handle})) {
      errno = EINVAL;
      return nullptr;
    }
  }
  auto* pd = new Pd();
  pd->pd.context = context;
  pd->pd.handle = handle;
  pd->id = handle;
  pd->imported = true;
  return &pd->pd;
}

void ibv_unimport_pd(ibv_pd* pd) {
  DROCE_FORWARD_FOREIGN(ctx_of(pd), ibv_unimport_pd, pd);
  if (pd != nullptr && reinterpret_cast<Pd*>(pd)->imported) delete reinterpret_cast<Pd*>(pd);
}

int ibv_dealloc_pd(ibv_pd* pd) {
  DROCE_FORWARD_FOREIGN(ctx_of(pd), ibv_dealloc_pd, pd);
  if (pd == nullptr) return EINVAL;
  Pd* p = reinterpret_cast<Pd*>(pd);
  if (p->parent != nullptr) {  // a parent domain: its PD stays
    p->parent->children.fetch_sub(1, std::memory_order_relaxed);
    delete p;
    return 0;
  }
  if (p->children.load(std::memory_order_relaxed) != 0) return EBUSY;
  if (int rc = status_errno(engine_of(pd->context)->DeallocPd(p->id)); rc != 0) return rc;
  {
    std::lock_guard<std::mutex> l(shared_mu());
    shared_pds().erase(SharedKey{session_key(pd->context), p->id});
  }
  delete p;
  return 0;
}

ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, uint64_t iova, unsigned int access) {
  DROCE_FORWARD_FOREIGN(ctx_of(pd), ibv_reg_mr_iova2, pd, addr, length, iova, access);
  // Implicit ODP (ibv_reg_mr(3): NULL, SIZE_MAX and IBV_ACCESS_ON_DEMAND):
  // the whole address space, reached by fault-safe copies in the engine.
  const bool implicit = addr == nullptr && length == SIZE_MAX && iova == 0 && (access & IBV_ACCESS_ON_DEMAND);
  if (pd == nullptr || (addr == nullptr && length != 0 && !implicit)) {
    errno = EINVAL;
    return nullptr;
  }
  // IBV_ACCESS_ON_DEMAND: every registration here is on demand already (the
  // engine reaches the memory through the process's own page tables and
  // pins nothing), so it is taken and remembered for ibv_advise_mr.
  constexpr unsigned kKnown = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                              IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
                              IBV_ACCESS_MW_BIND | IBV_ACCESS_RELAXED_ORDERING | IBV_ACCESS_ON_DEMAND;
  if (access & ~kKnown & ~static_cast<unsigned>(IBV_ACCESS_OPTIONAL_RANGE)) {
    errno = EINVAL;
    return nullptr;
  }
  auto mr = implicit ? engine_of(pd->context)->RegMrImplicit(reinterpret_cast<Pd*>(pd)->id, access & 0x1F)
                     : engine_of(pd->context)
                           ->RegMr(reinterpret_cast<Pd*>(pd)->id, reinterpret_cast<uint64_t>(addr), length,
                                   iova, access & 0x1F);
  if (!mr.ok()) {
    errno = status_errno(mr.status());
    return nullptr;
  }
  auto* m = new Mr();
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = addr;
  m->mr.length = length;
  m->mr.handle = mr->key;
  m->mr.lkey = mr->key;
  m->mr.rkey = mr->key;
  mr_record(m->mr, access);
  return &m->mr;
}

// ibv_import_mr(3): the MR `handle` of another context of this device in
// this process, on `pd` (which must be that MR's PD, imported or not).
ibv_mr* ibv_import_mr(ibv_pd* pd, uint32_t handle) {
  DROCE_FORWARD_FOREIGN(ctx_of(pd), ibv_import_mr, pd, handle);
  if (pd == nullptr || !context_is_ours(pd->context)) {
    errno = EINVAL;
    return nullptr;
  }
  MrRecord found;
  {
    std::lock_guard<std::mutex> l(shared_mu());
    auto it = shared_mrs().find(SharedKey{session_key(pd->context), handle});
    if (it == shared_mrs().end() || it->second.pd != reinterpret_cast<Pd*>(pd)->id) {
      errno = EINVAL;
      return nullptr;
    }
    found = it->second;
  }
  auto* m = new Mr();
  m->mr.context = pd->context;
  m->mr.pd = pd;
  m->mr.addr = found.addr;
  m->mr.length = found.length;
  m->mr.handle = handle;
  m->mr.lkey = handle;
  m->mr.rkey = handle;
  m->imported = true;
  return &m->mr;
}

void ibv_unimport_mr(ibv_mr* mr) {
  DROCE_FORWARD_FOREIGN(ctx_of(mr), ibv_unimport_mr, mr);
  if (mr != nullptr && reinterpret_cast<Mr*>(mr)->imported) delete reinterpret_cast<Mr*>(mr);
}

ibv_mr* (ibv_reg_mr)(ibv_pd* pd, void* addr, size_t length, int access) {
  DROCE_FORWARD_FOREIGN(ctx_of(pd), ibv_reg_mr, pd, addr, length, access);
  return ibv_reg_mr_iova2(pd, addr, length, reinterpret_cast<uint64_t>(addr),
                          static_cast<unsigned>(access));
}

ibv_mr* (ibv_reg_mr_iova)(ibv_pd* pd, void* addr, size_t length, uint64_t iova, int access) {
  DROCE_FORWARD_FOREIGN(ctx_of(pd), ibv_reg_mr_iova, pd, addr, length, iova, access);
  return ibv_reg_mr_iova2(pd, addr, length, iova, static_cast<unsigned>(access));
}

// ibv_rereg_mr(3): the input checks are libibverbs' own (IBV_REREG_MR_ERR_INPUT
// with EINVAL); the engine then changes the MR in place, its lkey and rkey
// unchanged, or refuses (IBV_REREG_MR_ERR_CMD with its errno: EINVAL for a
// bad PD or access, EBUSY with windows bound, EOPNOTSUPP for a new range in
// client mode).
int ibv_rereg_mr(ibv_mr* mr, int flags, ibv_pd* pd, void* addr, size_t length, int access) {
  DROCE_FORWARD_FOREIGN(ctx_of(mr), ibv_rereg_mr, mr, flags, pd, addr, length, access);
  constexpr int kAll = IBV_REREG_MR_CHANGE_TRANSLATION | IBV_REREG_MR_CHANGE_PD | IBV_REREG_MR_CHANGE_ACCESS;
  const bool translation = flags & IBV_REREG_MR_CHANGE_TRANSLATION;
  if (mr == nullptr || !context_is_ours(mr->context) || flags == 0 || (flags & ~kAll) ||
      (translation && (addr == nullptr || length == 0)) || (!translation && (addr != nullptr || length != 0)) ||
      ((flags & IBV_REREG_MR_CHANGE_PD) && (pd == nullptr || pd->context != mr->context))) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_INPUT;
  }
  constexpr unsigned kKnown = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                              IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND | IBV_ACCESS_RELAXED_ORDERING |
                              IBV_ACCESS_ON_DEMAND;
  if ((flags & IBV_REREG_MR_CHANGE_ACCESS) && (static_cast<unsigned>(access) & ~kKnown)) {
    errno = EINVAL;
    return IBV_REREG_MR_ERR_CMD;
  }
  uint32_t f = 0;
  using droce::engine::Session;
  if (translation) f |= Session::kReregTranslation;
  if (flags & IBV_REREG_MR_CHANGE_PD) f |= Session::kReregPd;
  if (flags & IBV_REREG_MR_CHANGE_ACCESS) f |= Session::kReregAccess;
  const uint64_t a = reinterpret_cast<uint64_t>(addr);
  const absl::Status s = engine_of(mr->context)
                             ->ReregMr(mr->lkey, f, pd != nullptr ? reinterpret_cast<Pd*>(pd)->id : 0, a, length, a,
                                       static_cast<unsigned>(access) & 0x1F);
  if (!s.ok()) {
    errno = status_errno(s);
    return IBV_REREG_MR_ERR_CMD;
  }
  if (flags & IBV_REREG_MR_CHANGE_PD) mr->pd = pd;
  if (translation) {
    mr->addr = addr;
    mr->length = length;
  }
  unsigned now_access = static_cast<unsigned>(access);
  if (!(flags & IBV_REREG_MR_CHANGE_ACCESS)) {
    std::lock_guard<std::mutex> l(shared_mu());
    auto it = shared_mrs().find(SharedKey{session_key(mr->context), mr->lkey});
    now_access = it != shared_mrs().end() ? it->second.access : 0;
  }
  mr_record(*mr, now_access);
  return 0;
}

int ibv_dereg_mr(ibv_mr* mr) {
  DROCE_FORWARD_FOREIGN(ctx_of(mr), ibv_dereg_mr, mr);
  if (mr == nullptr) return EINVAL;
  if (int rc = status_errno(engine_of(mr->context)->DeregMr(mr->lkey)); rc != 0) return rc;
  mr_forget(*mr);
  delete reinterpret_cast<Mr*>(mr);
  return 0;
}

ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
  DROCE_FORWARD_FOREIGN(context, ibv_create_comp_channel, context);
  if (!context_is_ours(context)) {
    errno = EINVAL;
    return nullptr;
  }
  int fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (fd < 0) return nullptr;
  auto* ch = new Channel();
  ch->ch.context = context;
  ch->ch.fd = fd;
  ch->ch.refcnt = 0;
  ch->notifier.channel = ch;
  return &ch->ch;
}

int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
  DROCE_FORWARD_FOREIGN(ctx_of(channel), ibv_destroy_comp_channel, channel);
  if (channel == nullptr) return EINVAL;
  Channel* ch = reinterpret_cast<Channel*>(channel);
  {
    std::lock_guard<std::mutex> l(ch->mu);
    if (channel->refcnt != 0) return EBUSY;  // CQs still use it
  }
  close(channel->fd);
  delete ch;
  return 0;
}

ibv_cq* ibv_create_cq(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                      int comp_vector) {
  DROCE_FORWARD_FOREIGN(context, ibv_create_cq, context, cqe, cq_context, channel, comp_vector);
  Cq* cq = create_cq_common(context, cqe, cq_context, channel, comp_vector);
  return cq != nullptr ? &cq->cq : nullptr;
}

int ibv_resize_cq(ibv_cq* cq, int cqe) {
  DROCE_FORWARD_FOREIGN(ctx_of(cq), ibv_resize_cq, cq, cqe);
  if (cq == nullptr || cqe <= 0) return EINVAL;
  Cq* c = to_cq(cq);
  std::lock_guard<std::mutex> l(c->poll_mu);  // the consumer is idle while the ring moves
  auto region = to_ctx(cq->context)->s->engine->ResizeCq(c->handle.id, static_cast<uint32_t>(cqe));
  if (!region.ok()) return status_errno(region.status());
  c->handle.region = *region;
  c->consumer = std::make_unique<droce::cq::CqConsumer>(*region);
  cq->cqe = static_cast<int>((*region)->capacity());
  return 0;
}

int ibv_destroy_cq(ibv_cq* cq) {
  DROCE_FORWARD_FOREIGN(ctx_of(cq), ibv_destroy_cq, cq);
  if (cq == nullptr) return EINVAL;
  Cq* c = to_cq(cq);
  if (int rc = status_errno(to_ctx(cq->context)->s->engine->DestroyCq(c->handle.id)); rc != 0) {
    return rc;
  }
  // As libibverbs does: wait until every event reported for this CQ has been
  // acknowledged with ibv_ack_cq_events (ibv_destroy_cq(3)); completion and
  // async events not yet read are dropped.
  if (cq->channel != nullptr) drop_comp_events(reinterpret_cast<Channel*>(cq->channel), c);
  drop_async_events(to_ctx(cq->context),
                    [cq](const ibv_async_event& e) { return e.event_type == IBV_EVENT_CQ_ERR && e.element.cq == cq; },
                    false);
  wait_acks(&cq->mutex, &cq->cond, [cq, c] {
    return cq->comp_events_completed == c->events_reported.load(std::memory_order_relaxed) &&
           cq->async_events_completed == c->async_reported.load(std::memory_order_relaxed);
  });
  if (cq->channel != nullptr) {
    Channel* ch = reinterpret_cast<Channel*>(cq->channel);
    std::lock_guard<std::mutex> l(ch->mu);
    --cq->channel->refcnt;
  }
  delete c;
  return 0;
}

int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
  DROCE_FORWARD_FOREIGN(ctx_of(channel), ibv_get_cq_event, channel, cq, cq_context);
  if (channel == nullptr || cq == nullptr || cq_context == nullptr) {
    errno = EINVAL;
    return -1;
  }
  // This thread may have been driving the engine; it is about to block, so
  // the worker takes over.
  to_ctx(channel->context)->s->engine->Handoff();
  Channel* ch = reinterpret_cast<Channel*>(channel);
  for (;;) {
    uint64_t v;
    // Blocks, or fails with EAGAIN if the application made the fd O_NONBLOCK.
    if (read(channel->fd, &v, sizeof(v)) != sizeof(v)) return -1;
    std::lock_guard<std::mutex> l(ch->mu);
    // The queue may be shorter than the eventfd count: the event of a CQ
    // destroyed unread was dropped (drop_comp_events). Wait for the next.
    if (ch->events.empty()) continue;
    Cq* c = ch->events.front();
    ch->events.pop_front();
    c->events_reported.fetch_add(1, std::memory_order_relaxed);
    *cq = &c->cq;
    *cq_context = c->cq.cq_context;
    return 0;
  }
}

void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
  DROCE_FORWARD_FOREIGN(ctx_of(cq), ibv_ack_cq_events, cq, nevents);
  if (cq == nullptr) return;
  count_acks(&cq->mutex, &cq->cond, &cq->comp_events_completed, nevents);
}

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

int droce_req_notify_cq(ibv_cq* cq, unsigned int flags);

}  // extern "C"
