// Completion channels and CQs: creation, moderation, resize, destruction and completion events.
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>

#include "provider.h"
#include "system_verbs.h"

namespace droce::provider {

namespace {

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

void CqAsync::CqError(uint64_t cookie) {
  Cq* cq = reinterpret_cast<Cq*>(cookie);
  ibv_async_event ev{};
  ev.element.cq = &cq->cq;
  ev.event_type = IBV_EVENT_CQ_ERR;
  push_async_event(to_ctx(cq->cq.context), ev);
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

// verbs_context::modify_cq (ibv_modify_cq is an inline wrapper around it).
int modify_cq(ibv_cq* cq, ibv_modify_cq_attr* attr) {
  if (cq == nullptr || attr == nullptr) return EINVAL;
  if (attr->attr_mask & ~uint32_t{IBV_CQ_ATTR_MODERATE}) return EINVAL;
  if (!(attr->attr_mask & IBV_CQ_ATTR_MODERATE)) return 0;
  // cq_mod_caps advertises the whole uint16_t ranges of count and period.
  return status_errno(to_ctx(cq->context)->s->engine->ModifyCq(
      to_cq(cq)->handle.id, attr->moderate.cq_count, attr->moderate.cq_period));
}

}  // namespace droce::provider

using namespace droce::provider;

extern "C" {

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

int droce_req_notify_cq(ibv_cq* cq, unsigned int flags);

}  // extern "C"
