// The verbs a Device serves (engine/session.h): each checks its arguments,
// makes what lives outside the table (rings in shared memory, CQ regions,
// a QP's transport on the worker that will run it), and changes the object
// table (engine/objects.h) with every worker stopped (RunOnWorker). Objects
// belong to the caller's OwnerScope.
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <new>

#include "absl/strings/str_cat.h"
#include "engine/device.h"

namespace droce::engine {
namespace {

absl::Status DeadError() { return absl::UnavailableError("the device failed (IBV_EVENT_DEVICE_FATAL)"); }

}  // namespace

absl::StatusOr<uint32_t> Device::AllocPd() {
  if (dead()) return DeadError();
  const uint64_t owner = CurrentOwner();
  uint32_t pd = 0;
  RunOnWorker([&] { pd = objects_.AllocPd(owner); });
  return pd;
}

absl::Status Device::DeallocPd(uint32_t pd) {
  absl::Status s;
  RunOnWorker([&] { s = objects_.DeallocPd(pd); });
  return s;
}

absl::StatusOr<mem::Mr> Device::RegMr(uint32_t pd, uint64_t addr, uint64_t len, uint64_t iova,
                                      uint32_t access) {
  if (dead()) return DeadError();
  const uint64_t owner = CurrentOwner();
  absl::StatusOr<mem::Mr> r;
  RunOnWorker([&] { r = objects_.RegMr(pd, addr, iova, len, access, 0, owner); });
  return r;
}

absl::StatusOr<mem::Mr> Device::RegMrImplicit(uint32_t pd, uint32_t access) {
  // This process's own memory through the copy tier: a peer's WRITE to an
  // address nothing is mapped at fails the copy (EFAULT), it does not fault.
  return RegMrOfProcess(static_cast<int32_t>(getpid()), pd, 0, UINT64_MAX, 0, access);
}

absl::StatusOr<mem::Mr> Device::RegMrOfProcess(int32_t pid, uint32_t pd, uint64_t addr, uint64_t len,
                                               uint64_t iova, uint32_t access) {
  if (dead()) return DeadError();
  if (pid <= 0) return absl::InvalidArgumentError("no such process");
  const uint64_t owner = CurrentOwner();
  absl::StatusOr<mem::Mr> r;
  RunOnWorker([&] { r = objects_.RegMr(pd, addr, iova, len, access, pid, owner); });
  return r;
}

absl::Status Device::ReregMr(uint32_t key, uint32_t flags, uint32_t pd, uint64_t addr, uint64_t len, uint64_t iova,
                            uint32_t access) {
  if (dead()) return DeadError();
  absl::Status s;
  RunOnWorker([&] { s = objects_.ReregMr(key, flags, pd, addr, len, iova, access); });
  return s;
}

absl::Status Device::DeregMr(uint32_t key) {
  absl::Status s;
  RunOnWorker([&] { s = objects_.DeregMr(key); });
  return s;
}

absl::StatusOr<CqHandle> Device::CreateCq(uint32_t min_cqe, cq::CqNotifier* notifier,
                                          uint64_t cookie) {
  if (dead()) return DeadError();
  if (min_cqe == 0 || min_cqe > Limits::kMaxCqe) return absl::InvalidArgumentError("cqe out of range");
  auto region = cq::CqRegion::Create(min_cqe);
  if (!region.ok()) return region.status();
  CqHandle h;
  h.region = region->get();
  CqEntry e;
  e.producer = std::make_unique<cq::CqProducer>(region->get(), notifier, cookie, workers_.size() > 1);
  e.region = std::move(*region);
  e.owner = CurrentOwner();
  RunOnWorker([&] { h.id = objects_.AddCq(std::move(e)); });
  if (dead()) return DeadError();
  return h;
}

absl::Status Device::DestroyCq(uint32_t id) {
  absl::Status s;
  RunOnWorker([&] { s = objects_.DestroyCq(id); });
  return s;
}

absl::StatusOr<cq::CqRegion*> Device::ResizeCq(uint32_t id, uint32_t min_cqe) {
  if (min_cqe == 0 || min_cqe > Limits::kMaxCqe) return absl::InvalidArgumentError("cqe out of range");
  auto region = cq::CqRegion::Create(min_cqe);
  if (!region.ok()) return region.status();
  // Completions of work posted before this call that one turn produces
  // (a UD or UC send completes when it is sent) count as pending, as they
  // would have arrived on an RNIC by now: without this turn, a resize below
  // them succeeded or not depending on whether a worker had looked yet
  // (rdma-core's test_resize_cq, as a droced client on a busy machine).
  DriveEachOnce();
  absl::StatusOr<cq::CqRegion*> r = absl::NotFoundError("no such CQ");
  RunOnWorker([&] {
    CqEntry* c = objects_.FindCq(id);
    if (c == nullptr) return;
    if (!c->producer->MoveTo(region->get())) {
      r = absl::InvalidArgumentError("more completions pending than the new size holds");
      return;
    }
    // The old region stays mapped until the CQ is destroyed: the consumer
    // may still hold a view of it until it switches.
    c->retired.push_back(std::move(c->region));
    c->region = std::move(*region);
    r = c->region.get();
  });
  return r;
}

absl::Status Device::ModifyCq(uint32_t id, uint16_t count, uint16_t period_us) {
  absl::Status s = absl::NotFoundError("no such CQ");
  RunOnWorker([&] {
    CqEntry* c = objects_.FindCq(id);
    if (c == nullptr) return;
    c->producer->SetModeration(count, uint64_t{period_us} * 1000);
    objects_.SetTicked(c->producer.get());
    s = absl::OkStatus();
  });
  return s;
}

absl::StatusOr<QpHandle> Device::CreateQp(const QpCreateArgs& a) {
  if (dead()) return DeadError();
  if (a.max_send_wr > Limits::kMaxQpWr || a.max_recv_wr > Limits::kMaxQpWr ||
      a.max_send_sge > Limits::kMaxSge || a.max_recv_sge > Limits::kMaxSge ||
      a.max_inline > Limits::kMaxInline) {
    return absl::InvalidArgumentError("QP capabilities exceed the device limits");
  }
  transport::QpCaps caps;
  caps.max_send_wr = queue::round_up_pow2(std::max(a.max_send_wr, 1u));
  caps.max_recv_wr = queue::round_up_pow2(std::max(a.max_recv_wr, 1u));
  caps.max_send_sge = std::max(a.max_send_sge, 1u);
  caps.max_recv_sge = std::max(a.max_recv_sge, 1u);
  // An XRC target takes receive WQEs from SRQs of any SGE count.
  if (a.type == transport::QpType::kXrcTgt) caps.max_recv_sge = Limits::kMaxSge;
  // Inline data shares the WQE slot with the SGE list; report what fits.
  caps.max_inline = std::max<uint32_t>(a.max_inline, caps.max_send_sge * sizeof(queue::Sge));
  const uint32_t sstride = (sizeof(queue::SendWqe) +
                            std::max<uint32_t>(caps.max_send_sge * sizeof(queue::Sge), caps.max_inline) + 15) & ~15u;
  const uint32_t rstride = sizeof(queue::RecvWqe) + caps.max_recv_sge * sizeof(queue::Sge);
  const size_t sq_len = queue::ring_bytes(caps.max_send_wr, sstride);
  const size_t rq_len = queue::ring_bytes(caps.max_recv_wr, rstride);
  auto shm = queue::ShmRegion::Create("droce-qp", sq_len + rq_len + sizeof(QpShared));
  if (!shm.ok()) return shm.status();
  auto entry = std::make_unique<QpEntry>();
  QpHandle h;
  h.sq = queue::Ring::Init(shm->data(), caps.max_send_wr, sstride);
  h.rq = queue::Ring::Init(static_cast<uint8_t*>(shm->data()) + sq_len, caps.max_recv_wr, rstride);
  h.shared = new (static_cast<uint8_t*>(shm->data()) + sq_len + rq_len) QpShared();
  h.shared->doorbell_pending.store(0, std::memory_order_relaxed);
  h.shared->state.store(static_cast<uint32_t>(transport::QpState::kReset), std::memory_order_relaxed);
  h.caps = caps;
  h.map = {shm->fd(), shm->size()};
  h.rq_offset = sq_len;
  h.shared_offset = sq_len + rq_len;
  entry->shm = std::move(*shm);
  entry->shared = h.shared;
  entry->events = a.events;
  entry->cookie = a.cookie;
  entry->owner = CurrentOwner();
  absl::Status s;
  RunOnWorker([&] {
    QpRefs refs;
    s = objects_.ResolveQpRefs(a, &refs);
    if (!s.ok()) return;
    absl::StatusOr<uint32_t> qpn = objects_.NextQpn();
    if (!qpn.ok()) {
      s = qpn.status();
      return;
    }
    h.qpn = *qpn;
    // The worker with the fewest QPs runs the new one.
    Worker* worker = workers_[0].get();
    for (auto& w : workers_) {
      if (w->qps < worker->qps) worker = w.get();
    }
    h.worker = worker->index;
    const bool tgt = a.type == transport::QpType::kXrcTgt;
    transport::QpInit init;
    init.qpn = h.qpn;
    init.type = a.type;
    init.pd = tgt ? 0 : a.pd;
    init.xrcd = tgt ? a.xrcd : 0;
    init.sq_sig_all = a.sq_sig_all;
    init.caps = caps;
    init.state_word = &h.shared->state;
    init.sq = h.sq;
    init.rq = h.rq;
    init.send_cq = refs.send_cq != nullptr ? refs.send_cq->producer.get() : nullptr;
    init.recv_cq = refs.recv_cq != nullptr ? refs.recv_cq->producer.get() : nullptr;
    init.srq = refs.srq != nullptr ? refs.srq->srq.get() : nullptr;
    init.port = TransportPort();
    init.measure_latency = measure_latency_;
    init.rate_kbps = rate_kbps_;
    init.rate_burst = rate_burst_;
    init.cc = cc_mode_;
    init.dcqcn = dcqcn_;
    init.sr = sr_;
    init.adp = adp_;
    entry->qp = std::make_unique<transport::Qp>(init, worker);
    if (trace_ != nullptr) entry->qp->SetTrace(trace_->SinkFor(h.qpn, worker->index));
    entry->worker = worker;
    ++worker->qps;
    entry->pd = refs.holds;
    entry->send_cq = refs.send_cq != nullptr ? a.send_cq : 0;
    entry->recv_cq = refs.recv_cq != nullptr ? a.recv_cq : 0;
    entry->srq = a.srq;
    objects_.AddQp(h.qpn, std::move(entry), refs);
  });
  if (!s.ok()) return s;
  if (dead()) return DeadError();
  return h;
}

int Device::ModifyQp(uint32_t qpn, const transport::QpAttr& attr, uint32_t mask) {
  // A dead device's QPs may only be reset or left in error.
  if (dead() && !((mask & transport::kAttrState) &&
                  (attr.state == transport::QpState::kErr || attr.state == transport::QpState::kReset))) {
    return EIO;
  }
  int rc = 0;
  RunOnWorker([&] {
    QpEntry* e = objects_.FindQp(qpn);
    if (e == nullptr) {
      rc = EINVAL;
      return;
    }
    rc = e->qp->Modify(attr, mask);
    if (rc == 0) e->worker->sched.Activate(e);
    DeliverEvents(e);
  });
  return rc;
}

absl::StatusOr<transport::QpAttr> Device::QueryQp(uint32_t qpn) {
  absl::StatusOr<transport::QpAttr> r = absl::NotFoundError("no such QP");
  RunOnWorker([&] {
    if (QpEntry* e = objects_.FindQp(qpn); e != nullptr) r = e->qp->attr();
  });
  return r;
}

absl::Status Device::DestroyQp(uint32_t qpn) {
  absl::Status s;
  RunOnWorker([&] { s = DestroyQpStopped(qpn); });
  return s;
}

absl::Status Device::DestroyQpStopped(uint32_t qpn) {
  AssertStopped("DestroyQpStopped");
  if (absl::Status s = objects_.CheckQpRemovable(qpn); !s.ok()) return s;
  QpEntry* e = objects_.FindQp(qpn);
  e->worker->SendBeforeDestroy(e);
  e->worker->sched.Forget(e);  // its heap entries are dropped when they come up
  --e->worker->qps;
  if (measure_latency_) PrintLatency(port_.name, qpn, *e->qp);
  objects_.RemoveQp(qpn);
  return absl::OkStatus();
}

int Device::AttachMcast(uint32_t qpn, const wire::Ipv6Addr& mgid) {
  if (dead()) return EIO;
  int rc = EINVAL;
  RunOnWorker([&] {
    QpEntry* e = objects_.FindQp(qpn);
    // Only UD QPs join groups (ib_attach_mcast: EINVAL otherwise).
    if (e != nullptr && e->qp->type() == transport::QpType::kUd) rc = objects_.mcast.Attach(mgid, qpn);
  });
  return rc;
}

int Device::DetachMcast(uint32_t qpn, const wire::Ipv6Addr& mgid) {
  int rc = EINVAL;
  RunOnWorker([&] { rc = objects_.mcast.Detach(mgid, qpn); });
  return rc;
}

absl::StatusOr<SrqHandle> Device::CreateSrq(uint32_t pd, uint32_t max_wr, uint32_t max_sge, uint32_t limit,
                                            EventSink* events, uint64_t cookie, uint32_t xrcd, uint32_t cq) {
  if (dead()) return DeadError();
  if (max_wr == 0 || max_wr > Limits::kMaxQpWr || max_sge == 0 || max_sge > Limits::kMaxSge ||
      limit > max_wr) {
    return absl::InvalidArgumentError("SRQ attributes out of range");
  }
  SrqHandle h;
  h.max_wr = queue::round_up_pow2(max_wr);
  h.max_sge = max_sge;
  const uint32_t stride = sizeof(queue::RecvWqe) + max_sge * sizeof(queue::Sge);
  auto shm = queue::ShmRegion::Create("droce-srq", queue::ring_bytes(h.max_wr, stride));
  if (!shm.ok()) return shm.status();
  h.ring = queue::Ring::Init(shm->data(), h.max_wr, stride);
  h.map = {shm->fd(), shm->size()};
  SrqEntry e;
  e.srq = std::make_unique<transport::Srq>(h.ring, max_sge, workers_.size() > 1);
  e.srq->SetLimit(limit);
  e.shm = std::move(*shm);
  e.pd = pd;
  e.xrcd = xrcd;
  e.cq = cq;
  e.events = events;
  e.cookie = cookie;
  e.owner = CurrentOwner();
  absl::StatusOr<uint32_t> id;
  RunOnWorker([&] { id = objects_.AddSrq(std::move(e)); });
  if (!id.ok()) return id.status();
  h.id = *id;
  if (dead()) return DeadError();
  return h;
}

int Device::ModifySrq(uint32_t id, uint32_t limit) {
  int rc = 0;
  RunOnWorker([&] {
    SrqEntry* e = objects_.FindSrq(id);
    if (e == nullptr) rc = EINVAL;
    else e->srq->SetLimit(limit);
  });
  return rc;
}

absl::StatusOr<uint32_t> Device::QuerySrqLimit(uint32_t id) {
  absl::StatusOr<uint32_t> r = absl::NotFoundError("no such SRQ");
  RunOnWorker([&] {
    if (SrqEntry* e = objects_.FindSrq(id); e != nullptr) r = e->srq->limit();
  });
  return r;
}

absl::Status Device::DestroySrq(uint32_t id) {
  absl::Status s;
  RunOnWorker([&] { s = objects_.DestroySrq(id); });
  return s;
}

absl::StatusOr<uint32_t> Device::CreateAh(uint32_t pd, const transport::AddressVector& av) {
  if (dead()) return DeadError();
  transport::AddressHandle ah;
  ah.av = av;
  ah.pd = pd;
  if (!transport::av_destination(av, TransportPort(), transport::AvUse::kUdHandle, &ah.dgid)) {
    return absl::InvalidArgumentError(
        "address handle needs a GRH, an IPv4-mapped GID with sgid_index 0 or an IPv6 GID with sgid_index 1");
  }
  const uint64_t owner = CurrentOwner();
  absl::StatusOr<uint32_t> r;
  RunOnWorker([&] { r = objects_.AddAh(ah, owner); });
  return r;
}

absl::Status Device::DestroyAh(uint32_t id) {
  absl::Status s;
  RunOnWorker([&] { s = objects_.DestroyAh(id); });
  return s;
}

const transport::AddressHandle* Device::FindAh(uint32_t id) { return objects_.FindAh(id); }

bool Device::InvalidateRkey(uint32_t rkey, uint32_t pd) {
  // Only type 2 memory windows are invalidatable; ordinary MRs are not
  // (droce has no fast-registration MRs).
  return objects_.mrs.Invalidate(rkey, pd);
}

absl::StatusOr<uint32_t> Device::AllocMw(uint32_t pd, uint8_t type) {
  if (dead()) return DeadError();
  const uint64_t owner = CurrentOwner();
  absl::StatusOr<uint32_t> r;
  RunOnWorker([&] { r = objects_.AllocMw(pd, type, owner); });
  return r;
}

absl::Status Device::DeallocMw(uint32_t rkey) {
  absl::Status s;
  RunOnWorker([&] { s = objects_.DeallocMw(rkey); });
  return s;
}

bool Device::FindXrcSrq(uint32_t srqn, transport::XrcSrqRef* out) { return objects_.FindXrcSrq(srqn, out); }

std::optional<uint64_t> Device::OwnerOf(ObjKind kind, uint32_t id) {
  // The control lock alone: the table changes only under it.
  std::lock_guard<std::mutex> l(ctl_mu_);
  return objects_.OwnerOf(kind, id);
}

OwnedObjects Device::Owned(uint64_t owner) {
  std::lock_guard<std::mutex> l(ctl_mu_);
  return objects_.Owned(owner);
}

size_t Device::DestroyAllOf(uint64_t owner,
                            const std::function<void(ObjKind, uint32_t, const absl::Status&)>& failed) {
  size_t gone = 0;
  // One stop of the workers for the lot: when it returns, no worker runs
  // anything the owner had, so its memory may go.
  RunOnWorker([&] {
    const OwnedObjects o = objects_.Owned(owner);
    for (uint32_t qpn : o.of(ObjKind::kQp)) objects_.mcast.DetachQp(qpn);
    for (int k = 0; k < kNumObjKinds; ++k) {
      const auto kind = static_cast<ObjKind>(k);
      for (uint32_t id : o.ids[k]) {
        absl::Status s;
        switch (kind) {
          case ObjKind::kQp: s = DestroyQpStopped(id); break;
          case ObjKind::kSrq: s = objects_.DestroySrq(id); break;
          case ObjKind::kAh: s = objects_.DestroyAh(id); break;
          case ObjKind::kMw: s = objects_.DeallocMw(id); break;
          case ObjKind::kMr: s = objects_.DeregMr(id); break;
          case ObjKind::kCq: s = objects_.DestroyCq(id); break;
          case ObjKind::kPd: s = objects_.DeallocPd(id); break;
        }
        if (s.ok()) ++gone;
        else failed(kind, id, s);
      }
    }
  });
  return gone;
}

void Device::DeliverEvents(QpEntry* e) {
  const uint32_t ev = e->qp->TakeEvents();
  if (ev != 0 && e->events != nullptr) {
    for (int t = 0; t < 32; ++t) {
      if (ev & (1u << t)) e->events->QpEvent(e->cookie, t);
    }
  }
  transport::Srq* srq = e->qp->srq();
  if (srq == nullptr) return;
  // An XRC target QP: the SRQ its last request named.
  const uint32_t srq_id = e->srq != 0 ? e->srq : e->qp->xrc_srq_id();
  const SrqEntry* se = objects_.FindSrq(srq_id);
  EventSink* sink = se != nullptr ? se->events : nullptr;
  if (srq->TakeLimitEvent() && sink != nullptr) sink->SrqEvent(se->cookie, 15 /* IBV_EVENT_SRQ_LIMIT_REACHED */);
  if (srq->TakeErrorEvent()) {
    // IBA 10.2.9.5: an SRQ in error takes every QP attached to it to the
    // error state (each then reports its last WQE). Those QPs may belong to
    // other workers: done with all of them stopped, after this turn.
    Bump(e->worker->stats.srq_err);
    if (sink != nullptr) sink->SrqEvent(se->cookie, 14 /* IBV_EVENT_SRQ_ERR */);
    e->worker->exclusive.push_back([this, id = srq_id] { FailSrqQps(id); });
  }
}

void Device::FailSrqQps(uint32_t srq) {
  AssertStopped("FailSrqQps");
  transport::QpAttr err;
  err.state = transport::QpState::kErr;
  for (auto& [qpn, e] : objects_.qps) {
    if (e->srq != srq) continue;
    e->qp->Modify(err, transport::kAttrState);
    DeliverEvents(e.get());
    e->worker->sched.Activate(e.get());
  }
}

}  // namespace droce::engine
