// Protection domains, memory regions, thread and parent domains, the
// context's async-event sink, and the helpers every object file shares.
// Completion channels and CQs are in verbs_cq.cc; QPs, SRQs, AHs and
// multicast in verbs_qp.cc.
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <span>

#include "absl/container/flat_hash_map.h"
#include "ctl/protocol.h"
#include "provider.h"
#include "system_verbs.h"

namespace droce::provider {

bool context_is_ours(ibv_context* c);

int status_errno(const absl::Status& s) { return ctl::ErrnoOf(s); }

engine::Session* engine_of(ibv_context* c) { return to_ctx(c)->s->engine.get(); }

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

}  // extern "C"
