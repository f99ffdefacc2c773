// Internal objects of the verbs provider. Every object droce hands to an
// application embeds the libibverbs struct it stands for as its first member
// (for the context: verbs_context as its last, as libibverbs requires), so
// the pointer converts back without a lookup. droce never touches
// libibverbs' private structures.
#pragma once

#include <infiniband/verbs.h>
#include <sys/types.h>

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>

#include "cq/cq.h"
#include "engine/session.h"
#include "poll_latency.h"

namespace droce::provider {

struct Context;

// Turns engine events into ibv_async_event entries on the context's queue.
struct ContextEvents : public engine::EventSink {
  Context* ctx = nullptr;
  void QpEvent(uint64_t cookie, int event_type) override;
  void SrqEvent(uint64_t cookie, int event_type) override;
  void DeviceEvent(int event_type) override;
};

struct ContextState {
  // The context's own reference: in client mode it keeps the connection to
  // droced (a dead one goes with the last context on it).
  std::shared_ptr<engine::Session> engine;
  std::mutex async_mu;
  std::deque<ibv_async_event> async_events;
  ContextEvents events;
  PollLatency latency;  // DROCE_LATENCY: post to poll, per QP (poll_latency.h)
};

// Standard layout, so that offsetof is well defined.
struct Context {
  ContextState* s;
  verbs_context vctx;  // must be last (verbs_get_ctx)
};

inline Context* to_ctx(ibv_context* c) {
  return reinterpret_cast<Context*>(reinterpret_cast<char*>(c) -
                                    offsetof(Context, vctx) - offsetof(verbs_context, context));
}

struct Pd {
  ibv_pd pd;
  uint32_t id = 0;
  // A parent domain (ibv_alloc_parent_domain): the engine's PD is its
  // parent's (`id` the same), which cannot be deallocated before it.
  Pd* parent = nullptr;
  ibv_td* td = nullptr;
  std::atomic<uint32_t> children{0};  // parent domains over this PD
  bool imported = false;  // ibv_import_pd: ibv_unimport_pd frees only this
};

struct Mr {
  ibv_mr mr;
  bool imported = false;  // ibv_import_mr: ibv_unimport_mr frees only this
};

struct Cq;

// A completion channel: an eventfd (semaphore mode, so it stays readable
// while events are pending) and the queue of CQs that have fired.
struct Channel;
struct ChannelNotifier : public cq::CqNotifier {
  Channel* channel = nullptr;
  void NotifyCq(uint64_t cookie) override;
  void CqError(uint64_t cookie) override;
};

struct Channel {
  ibv_comp_channel ch;  // first member: ibv_comp_channel* converts back
  std::mutex mu;
  std::deque<Cq*> events;
  ChannelNotifier notifier;
};

// The notifier of a CQ without a channel: still reports overflow.
struct CqAsync : public cq::CqNotifier {
  void NotifyCq(uint64_t) override {}
  void CqError(uint64_t cookie) override;
};

struct Cq {
  // ibv_cq is the prefix of ibv_cq_ex; a CQ made by ibv_create_cq_ex is
  // handed out as &cqx, converted back by ibv_cq_ex_to_cq's cast.
  union {
    ibv_cq cq;
    ibv_cq_ex cqx;
  };
  engine::CqHandle handle;
  // Extended polling (ibv_start_poll ... ibv_end_poll).
  queue::Cqe cur{};
  uint64_t wc_flags = 0;
  bool single_threaded = false;
  std::unique_ptr<cq::CqConsumer> consumer;
  std::mutex poll_mu;
  std::atomic<uint32_t> events_reported{0};
  std::atomic<uint32_t> async_reported{0};  // IBV_EVENT_CQ_ERR queued for it
  CqAsync async_notifier;
};

inline Cq* to_cq(ibv_cq* c) { return reinterpret_cast<Cq*>(c); }

struct Ah {
  ibv_ah ah;
  uint32_t id = 0;
};

struct Mw {
  ibv_mw mw;
};

// An XRC domain (ibv_open_xrcd). Opens of the same file share the engine's
// domain (`id`); each open is its own Xrcd, closed by ibv_close_xrcd.
struct Xrcd {
  ibv_xrcd xrcd;  // first member: ibv_xrcd* converts back
  uint32_t id = 0;
  bool keyed = false;  // opened on a file (dev, ino)
  dev_t dev = 0;
  ino_t ino = 0;
};

struct Srq {
  ibv_srq srq;
  engine::SrqHandle handle;
  std::atomic<uint32_t> events_reported{0};
  std::mutex mu;
  uint32_t prod = 0;
};

inline Srq* to_srq(ibv_srq* s) { return reinterpret_cast<Srq*>(s); }

struct Qp {
  ibv_qp_ex qpx;  // qpx.qp_base is the ibv_qp
  engine::QpHandle handle;
  std::atomic<uint32_t> events_reported{0};  // async events queued for it
  uint32_t max_send_sge = 0, max_recv_sge = 0, max_inline = 0;
  std::mutex sq_mu, rq_mu;
  uint32_t sq_prod = 0, rq_prod = 0;
  // ibv_wr_* batch state (valid between wr_start and wr_complete/abort).
  uint32_t wr_start_prod = 0;
  uint8_t* wr_cur = nullptr;
  int wr_err = 0;
  // XRC target QPs: the domain, and the handles ibv_open_qp made of it
  // (`real` is the creator's handle in each of those; the QP goes with it,
  // which cannot be destroyed while they are open: EBUSY).
  uint32_t xrcd = 0;
  Qp* real = nullptr;
  std::atomic<uint32_t> opens{0};
};

inline Qp* to_qp(ibv_qp* q) { return reinterpret_cast<Qp*>(q); }
inline Qp* to_qp(ibv_qp_ex* q) { return reinterpret_cast<Qp*>(q); }

// The posting rule (verbs_datapath.cc): 0 if work may be posted to that
// queue of q now, else EINVAL. From the state the engine publishes.
enum class WorkQueue : uint8_t { kSend, kRecv };
int post_allowed(const Qp* q, WorkQueue wq);
// The QP's state as the engine has it now (not the cached ibqp->state).
ibv_qp_state engine_state(const Qp* q);

// Datapath entry points placed in context->ops (verbs_datapath.cc).
int poll_cq(ibv_cq* cq, int n, ibv_wc* wc);
int req_notify_cq(ibv_cq* cq, int solicited_only);
int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);
ibv_mw* alloc_mw(ibv_pd* pd, ibv_mw_type type);
int dealloc_mw(ibv_mw* mw);
int bind_mw(ibv_qp* qp, ibv_mw* mw, ibv_mw_bind* bind);
void init_qp_ex_ops(ibv_qp_ex* qpx);
void init_cq_ex_ops(Cq* cq);
int modify_cq(ibv_cq* cq, ibv_modify_cq_attr* attr);
Cq* create_cq_common(ibv_context* context, int cqe, void* cq_context, ibv_comp_channel* channel,
                     int comp_vector);
bool context_is_ours(ibv_context* c);
// The errno of a control-path status (ctl::ErrnoOf), and a context's engine
// session (verbs_objects.cc).
int status_errno(const absl::Status& s);
engine::Session* engine_of(ibv_context* c);
// A basic SRQ (xrcd 0) or an XRC SRQ of engine domain `xrcd` completing to
// `cq` (verbs_qp.cc).
ibv_srq* create_srq_common(ibv_pd* pd, ibv_srq_attr* attr, void* srq_context, uint32_t xrcd, ibv_cq* cq);
// XRC (verbs_xrc.cc): verbs_context's open_xrcd, close_xrcd, create_srq_ex,
// get_srq_num and open_qp; the XRC target QPs ibv_open_qp finds (added at
// creation, removed at destruction: EBUSY while another handle is open).
void xrc_tgt_add(Qp* qp);
int xrc_tgt_remove(Qp* qp);
ibv_xrcd* open_xrcd(ibv_context* c, ibv_xrcd_init_attr* attr);
int close_xrcd(ibv_xrcd* xrcd);
ibv_srq* create_srq_ex(ibv_context* c, ibv_srq_init_attr_ex* attr);
int get_srq_num(ibv_srq* srq, uint32_t* srq_num);
ibv_qp* open_qp(ibv_context* c, ibv_qp_open_attr* attr);

// DROCE_STATS=1: counters on stderr, a QP's at ibv_destroy_qp and the
// device's at ibv_close_device (verbs_counters.cc).
bool stats_enabled();
void print_qp_counters(ibv_qp* qp);
void print_device_counters(ibv_context* context);

// Queues an async event; false if the queue is full (the event is dropped).
bool push_async_event(Context* ctx, const ibv_async_event& ev);

bool is_qp_event(ibv_event_type t);

// The libibverbs acknowledgement protocol for events (comp and async): the
// ack side adds to a counter under the object's mutex and signals its cond;
// destroy waits until the counter reaches what was handed out.
inline void count_acks(pthread_mutex_t* mu, pthread_cond_t* cond, uint32_t* completed, uint32_t n) {
  pthread_mutex_lock(mu);
  *completed += n;
  pthread_cond_signal(cond);
  pthread_mutex_unlock(mu);
}
template <typename Done>
void wait_acks(pthread_mutex_t* mu, pthread_cond_t* cond, Done done) {
  pthread_mutex_lock(mu);
  while (!done()) pthread_cond_wait(cond, mu);
  pthread_mutex_unlock(mu);
}

// Removes queued, unread events that `match` (the object is being destroyed).
template <typename Match>
void drop_async_events(Context* ctx, Match match, bool qp_events) {
  std::lock_guard<std::mutex> l(ctx->s->async_mu);
  auto& q = ctx->s->async_events;
  for (auto it = q.begin(); it != q.end();) {
    const bool kind_ok = qp_events ? is_qp_event(it->event_type) : !is_qp_event(it->event_type);
    if (kind_ok && match(*it)) it = q.erase(it);
    else ++it;
  }
}

}  // namespace droce::provider
