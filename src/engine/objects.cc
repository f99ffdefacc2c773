// The device's object table (objects.h): ids, references and owners.
#include "engine/objects.h"

#include <algorithm>

#include "wire/frame.h"

namespace droce::engine {
namespace {

thread_local uint64_t current_owner = 0;

}  // namespace

uint64_t CurrentOwner() { return current_owner; }

OwnerScope::OwnerScope(uint64_t owner) : prev_(current_owner) { current_owner = owner; }

OwnerScope::~OwnerScope() { current_owner = prev_; }

const char* ObjKindName(ObjKind k) {
  static constexpr const char* kNames[kNumObjKinds] = {"QP", "SRQ", "AH", "MW", "MR", "CQ", "PD"};
  return kNames[static_cast<int>(k)];
}

size_t OwnedObjects::total() const {
  size_t n = 0;
  for (const auto& v : ids) n += v.size();
  return n;
}

uint32_t ObjectTable::AllocPd(uint64_t owner) {
  const uint32_t pd = next_pd_++;
  pds[pd] = PdEntry{0, owner};
  return pd;
}

absl::Status ObjectTable::DeallocPd(uint32_t pd) {
  auto it = pds.find(pd);
  if (it == pds.end()) return absl::NotFoundError("no such PD");
  if (it->second.uses != 0) return absl::FailedPreconditionError("PD in use");
  pds.erase(it);
  return absl::OkStatus();
}

uint32_t* ObjectTable::PdUses(uint32_t pd) {
  auto it = pds.find(pd);
  return it == pds.end() ? nullptr : &it->second.uses;
}

void ObjectTable::ReleasePd(uint32_t pd) {
  if (uint32_t* uses = PdUses(pd); uses != nullptr && *uses > 0) --*uses;
}

absl::StatusOr<mem::Mr> ObjectTable::RegMr(uint32_t pd, uint64_t addr, uint64_t iova, uint64_t len,
                                           uint32_t access, int32_t pid, uint64_t owner) {
  uint32_t* uses = PdUses(pd);
  if (uses == nullptr) return absl::NotFoundError("no such PD");
  absl::StatusOr<mem::Mr> mr = mrs.Register(pd, addr, iova, len, access, pid);
  if (!mr.ok()) return mr;
  ++*uses;
  mr_owner_[mr->key] = owner;
  return mr;
}

absl::Status ObjectTable::ReregMr(uint32_t key, uint32_t flags, uint32_t pd, uint64_t addr, uint64_t len,
                                  uint64_t iova, uint32_t access) {
  const mem::Mr* old = mrs.Find(key);
  if (old == nullptr) return absl::InvalidArgumentError("no such MR");
  // A window bound to it keeps its rights and range (the kernel's rule:
  // such an MR cannot be re-registered).
  if (mrs.HasBoundWindows(key)) return absl::FailedPreconditionError("memory windows are bound to this MR");
  mem::Mr m = *old;
  if (flags & Session::kReregPd) {
    if (PdUses(pd) == nullptr) return absl::InvalidArgumentError("no such PD");
    m.pd = pd;
  }
  if (flags & Session::kReregAccess) m.access = access;
  if (flags & Session::kReregTranslation) {
    m.host = addr;
    m.iova = iova;
    m.length = len;
    m.pid = 0;
  }
  const uint32_t old_pd = old->pd;
  absl::Status s = mrs.Update(key, m);
  if (s.ok() && m.pd != old_pd) {
    ++*PdUses(m.pd);
    ReleasePd(old_pd);
  }
  return s;
}

absl::Status ObjectTable::DeregMr(uint32_t key) {
  const mem::Mr* mr = mrs.Find(key);
  const uint32_t pd = mr != nullptr ? mr->pd : 0;
  if (mr != nullptr && mrs.HasBoundWindows(key)) {
    return absl::FailedPreconditionError("memory windows are bound to this MR");
  }
  if (!mrs.Deregister(key)) return absl::NotFoundError("no such MR");
  mr_owner_.erase(key);
  ReleasePd(pd);
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> ObjectTable::AllocMw(uint32_t pd, uint8_t type, uint64_t owner) {
  uint32_t* uses = PdUses(pd);
  if (uses == nullptr) return absl::NotFoundError("no such PD");
  absl::StatusOr<uint32_t> rkey = mrs.AllocMw(pd, type);
  if (!rkey.ok()) return rkey;
  ++*uses;
  mw_owner_[*rkey >> 8] = owner;
  return rkey;
}

absl::Status ObjectTable::DeallocMw(uint32_t rkey) {
  const mem::Mw* mw = mrs.FindMw(rkey);
  const uint32_t pd = mw != nullptr ? mw->pd : 0;
  if (!mrs.DeallocMw(rkey)) return absl::NotFoundError("no such memory window");
  mw_owner_.erase(rkey >> 8);
  ReleasePd(pd);
  return absl::OkStatus();
}

uint32_t ObjectTable::AddCq(CqEntry e) {
  const uint32_t id = next_cq_++;
  cqs.emplace(id, std::move(e));
  return id;
}

absl::Status ObjectTable::DestroyCq(uint32_t id) {
  auto it = cqs.find(id);
  if (it == cqs.end()) return absl::NotFoundError("no such CQ");
  if (it->second.users != 0) return absl::FailedPreconditionError("CQ in use by a QP");
  std::erase(ticked_cqs, it->second.producer.get());
  cqs.erase(it);
  return absl::OkStatus();
}

CqEntry* ObjectTable::FindCq(uint32_t id) {
  auto it = cqs.find(id);
  return it == cqs.end() ? nullptr : &it->second;
}

void ObjectTable::SetTicked(cq::CqProducer* p) {
  std::erase(ticked_cqs, p);
  if (p->needs_tick()) ticked_cqs.push_back(p);
}

absl::StatusOr<uint32_t> ObjectTable::AddSrq(SrqEntry e) {
  uint32_t* uses = PdUses(e.pd);
  uint32_t* xrcd_uses = e.xrcd != 0 ? PdUses(e.xrcd) : nullptr;
  CqEntry* c = e.xrcd != 0 ? FindCq(e.cq) : nullptr;
  if (uses == nullptr || (e.xrcd != 0 && (xrcd_uses == nullptr || c == nullptr))) {
    return absl::NotFoundError("no such PD, XRC domain or CQ");
  }
  // SRQ numbers are 24 bits on the wire (XRCETH), never 0.
  while (srqs.contains(next_srq_) || next_srq_ == 0) next_srq_ = (next_srq_ + 1) & 0xFFFFFF;
  const uint32_t id = next_srq_;
  next_srq_ = (next_srq_ + 1) & 0xFFFFFF;
  if (e.xrcd == 0) e.cq = 0;
  ++*uses;
  if (xrcd_uses != nullptr) {
    ++*xrcd_uses;
    ++c->users;
  }
  srqs.emplace(id, std::move(e));
  return id;
}

absl::Status ObjectTable::DestroySrq(uint32_t id) {
  auto it = srqs.find(id);
  if (it == srqs.end()) return absl::NotFoundError("no such SRQ");
  if (it->second.users != 0) return absl::FailedPreconditionError("SRQ in use by a QP");
  SrqEntry& e = it->second;
  ReleasePd(e.pd);
  if (e.xrcd != 0) {
    // XRC target QPs reach it by number, holding no reference: the ones
    // that used it last forget it.
    for (auto& [qpn, q] : qps) {
      if (q->qp->type() == transport::QpType::kXrcTgt && q->pd == e.xrcd) q->qp->DropXrcSrq(e.srq.get());
    }
    ReleasePd(e.xrcd);
    if (CqEntry* c = FindCq(e.cq); c != nullptr) --c->users;
  }
  srqs.erase(it);
  return absl::OkStatus();
}

SrqEntry* ObjectTable::FindSrq(uint32_t id) {
  auto it = srqs.find(id);
  return it == srqs.end() ? nullptr : &it->second;
}

absl::StatusOr<uint32_t> ObjectTable::AddAh(const transport::AddressHandle& ah, uint64_t owner) {
  uint32_t* uses = PdUses(ah.pd);
  if (uses == nullptr) return absl::NotFoundError("no such PD");
  const uint32_t id = next_ah_++;
  ahs.emplace(id, AhEntry{ah, owner});
  ++*uses;
  return id;
}

absl::Status ObjectTable::DestroyAh(uint32_t id) {
  auto it = ahs.find(id);
  if (it == ahs.end()) return absl::NotFoundError("no such AH");
  ReleasePd(it->second.ah.pd);
  ahs.erase(it);
  return absl::OkStatus();
}

const transport::AddressHandle* ObjectTable::FindAh(uint32_t id) const {
  auto it = ahs.find(id);
  return it == ahs.end() ? nullptr : &it->second.ah;
}

absl::Status ObjectTable::ResolveQpRefs(const QpCreateArgs& a, QpRefs* out) {
  // An XRC target QP holds its XRC domain where others hold their PD, and
  // has no CQ; an XRC initiator has no receive CQ.
  const bool tgt = a.type == transport::QpType::kXrcTgt;
  const bool has_rcq = !tgt && a.type != transport::QpType::kXrcIni;
  out->holds = tgt ? a.xrcd : a.pd;
  const bool pd_ok = out->holds != 0 && PdUses(out->holds) != nullptr;
  out->send_cq = tgt ? nullptr : FindCq(a.send_cq);
  out->recv_cq = has_rcq || a.recv_cq != 0 ? FindCq(a.recv_cq) : nullptr;
  if (!pd_ok || (!tgt && out->send_cq == nullptr) || ((has_rcq || a.recv_cq != 0) && out->recv_cq == nullptr)) {
    return absl::NotFoundError("no such PD, XRC domain or CQ");
  }
  if ((tgt || a.type == transport::QpType::kXrcIni) && a.srq != 0) {
    return absl::InvalidArgumentError("an XRC QP takes no SRQ");
  }
  out->srq = nullptr;
  if (a.srq != 0) {
    out->srq = FindSrq(a.srq);
    if (out->srq == nullptr) return absl::NotFoundError("no such SRQ");
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> ObjectTable::NextQpn() {
  if (qps.size() >= Limits::kMaxQp) return absl::ResourceExhaustedError("too many QPs");
  // QPNs below 0x11 are special (0, 1) or never handed out as rxe does;
  // 0xFFFFFF is the multicast QPN.
  while (qps.contains(next_qpn_) || next_qpn_ < 0x11 || next_qpn_ == wire::kMulticastQpn) {
    next_qpn_ = (next_qpn_ + 1) & 0xFFFFFF;
  }
  const uint32_t qpn = next_qpn_;
  next_qpn_ = (next_qpn_ + 1) & 0xFFFFFF;
  return qpn;
}

void ObjectTable::AddQp(uint32_t qpn, std::unique_ptr<QpEntry> e, const QpRefs& refs) {
  if (refs.srq != nullptr) ++refs.srq->users;
  ++*PdUses(refs.holds);
  if (refs.send_cq != nullptr) ++refs.send_cq->users;
  if (refs.recv_cq != nullptr) ++refs.recv_cq->users;
  qps.emplace(qpn, std::move(e));
}

absl::Status ObjectTable::CheckQpRemovable(uint32_t qpn) const {
  if (!qps.contains(qpn)) return absl::NotFoundError("no such QP");
  if (mcast.AttachedTo(qpn) != 0) return absl::FailedPreconditionError("QP is attached to a multicast group");
  return absl::OkStatus();
}

std::unique_ptr<QpEntry> ObjectTable::RemoveQp(uint32_t qpn) {
  auto it = qps.find(qpn);
  std::unique_ptr<QpEntry> e = std::move(it->second);
  qps.erase(it);
  // Drop the QP's references on its CQs, PD and SRQ.
  if (CqEntry* c = FindCq(e->send_cq); c != nullptr) --c->users;
  if (CqEntry* c = FindCq(e->recv_cq); c != nullptr) --c->users;
  ReleasePd(e->pd);
  if (SrqEntry* q = FindSrq(e->srq); q != nullptr) --q->users;
  return e;
}

QpEntry* ObjectTable::FindQp(uint32_t qpn) const {
  auto it = qps.find(qpn);
  return it == qps.end() ? nullptr : it->second.get();
}

bool ObjectTable::FindXrcSrq(uint32_t srqn, transport::XrcSrqRef* out) {
  const SrqEntry* e = FindSrq(srqn);
  if (e == nullptr || e->xrcd == 0) return false;
  const CqEntry* c = FindCq(e->cq);
  if (c == nullptr) return false;
  *out = {e->srq.get(), c->producer.get(), e->pd, e->xrcd, srqn};
  return true;
}

std::optional<uint64_t> ObjectTable::OwnerOf(ObjKind k, uint32_t id) const {
  auto in = [id](const auto& map) -> std::optional<uint64_t> {
    auto it = map.find(id);
    if (it == map.end()) return std::nullopt;
    if constexpr (requires { it->second->owner; }) {
      return it->second->owner;
    } else if constexpr (requires { it->second.owner; }) {
      return it->second.owner;
    } else {
      return it->second;
    }
  };
  switch (k) {
    case ObjKind::kQp: return in(qps);
    case ObjKind::kSrq: return in(srqs);
    case ObjKind::kAh: return in(ahs);
    case ObjKind::kCq: return in(cqs);
    case ObjKind::kPd: return in(pds);
    case ObjKind::kMr: return in(mr_owner_);
    case ObjKind::kMw: {
      auto it = mw_owner_.find(id >> 8);
      if (it == mw_owner_.end()) return std::nullopt;
      return it->second;
    }
  }
  return std::nullopt;
}

OwnedObjects ObjectTable::Owned(uint64_t owner) const {
  OwnedObjects o;
  auto add = [&](ObjKind k, uint32_t id, uint64_t who) {
    if (who == owner) o.ids[static_cast<int>(k)].push_back(id);
  };
  for (const auto& [id, e] : qps) add(ObjKind::kQp, id, e->owner);
  for (const auto& [id, e] : srqs) add(ObjKind::kSrq, id, e.owner);
  for (const auto& [id, e] : ahs) add(ObjKind::kAh, id, e.owner);
  // A window goes by its rkey now (DeallocMw takes any variant of its index).
  for (const auto& [index, who] : mw_owner_) add(ObjKind::kMw, index << 8, who);
  for (const auto& [key, who] : mr_owner_) add(ObjKind::kMr, key, who);
  for (const auto& [id, e] : cqs) add(ObjKind::kCq, id, e.owner);
  for (const auto& [id, e] : pds) add(ObjKind::kPd, id, e.owner);
  for (auto& v : o.ids) std::sort(v.begin(), v.end());
  return o;
}

}  // namespace droce::engine
