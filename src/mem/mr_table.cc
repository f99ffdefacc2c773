#include "mem/mr_table.h"

#include <sys/random.h>
#include <sys/uio.h>

#include <cstring>

#include <mutex>

namespace droce::mem {

uint8_t MrTable::RandomVariant() {
  if (rng_ == 0) {
    if (getrandom(&rng_, sizeof(rng_), 0) != sizeof(rng_) || rng_ == 0) rng_ = 0x9E3779B97F4A7C15ull;
  }
  // xorshift64
  rng_ ^= rng_ << 13;
  rng_ ^= rng_ >> 7;
  rng_ ^= rng_ << 17;
  return static_cast<uint8_t>(rng_ >> 32);
}

absl::StatusOr<uint32_t> MrTable::NewKey() {
  uint32_t index;
  if (free_.size() > kQuarantine || (slots_.size() >= (1u << 24) && !free_.empty())) {
    index = free_.front();
    free_.pop_front();
    ++slots_[index].variant;  // a stale key of this slot no longer matches
  } else {
    if (slots_.size() >= (1u << 24)) return absl::ResourceExhaustedError("MR and MW keys exhausted");
    index = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
    // New slots start from random variants (droced's clients must not guess
    // each other's keys from their own); each reuse then steps it.
    slots_[index].variant = RandomVariant();
  }
  return (index << 8) | slots_[index].variant;
}

void MrTable::Free(uint32_t index) {
  Slot& s = slots_[index];
  s.kind = Slot::kFree;
  s.mr = Mr{};
  s.mw = Mw{};
  free_.push_back(index);
}

absl::StatusOr<Mr> MrTable::Register(uint32_t pd, uint64_t host, uint64_t iova, uint64_t length,
                                     uint32_t access, int32_t pid) {
  // IBA 10.6.3.1: remote write or atomic rights need local write.
  if ((access & (kRemoteWrite | kRemoteAtomic)) && !(access & kLocalWrite)) {
    return absl::InvalidArgumentError("remote write/atomic access requires local write");
  }
  if (length != 0 && iova + length < iova) return absl::InvalidArgumentError("range wraps");
  absl::StatusOr<uint32_t> key = NewKey();
  if (!key.ok()) return key.status();
  Slot& s = slots_[*key >> 8];
  s.kind = Slot::kMr;
  s.mr = Mr{pd, *key, access, iova, host, length, pid};
  ++live_mrs_;
  return s.mr;
}

absl::Status MrTable::Update(uint32_t key, const Mr& m) {
  if ((m.access & (kRemoteWrite | kRemoteAtomic)) && !(m.access & kLocalWrite)) {
    return absl::InvalidArgumentError("remote write/atomic access requires local write");
  }
  if (m.length != 0 && m.iova + m.length < m.iova) return absl::InvalidArgumentError("range wraps");
  if (Find(key) == nullptr) return absl::NotFoundError("no such MR");
  Slot& s = slots_[key >> 8];
  s.mr = Mr{m.pd, key, m.access, m.iova, m.host, m.length, m.pid};
  return absl::OkStatus();
}

bool MrTable::Deregister(uint32_t key) {
  if (Find(key) == nullptr) return false;
  Free(key >> 8);
  --live_mrs_;
  return true;
}

absl::StatusOr<uint32_t> MrTable::AllocMw(uint32_t pd, uint8_t type) {
  if (type != 1 && type != 2) return absl::InvalidArgumentError("memory window type");
  absl::StatusOr<uint32_t> rkey = NewKey();
  if (!rkey.ok()) return rkey.status();
  Slot& s = slots_[*rkey >> 8];
  s.kind = Slot::kMw;
  s.mw = Mw{};
  s.mw.pd = pd;
  s.mw.type = type;
  s.mw.rkey = *rkey;
  return *rkey;
}

bool MrTable::DeallocMw(uint32_t rkey) {
  if (FindMw(rkey) == nullptr) return false;
  Free(rkey >> 8);
  return true;
}

BindError MrTable::Bind(uint32_t new_rkey, uint8_t type, uint32_t qp_pd, uint32_t qpn, uint32_t mr_key,
                        uint64_t iova, uint64_t length, uint32_t access) {
  std::lock_guard<SpinLock> l(mw_lock_);
  Slot* w = SlotOf(new_rkey);
  if (w == nullptr || w->kind != Slot::kMw || w->mw.type != type) return BindError::kBadMw;
  Mw& mw = w->mw;
  // IBA 10.6.7.2: a type 2 window is bound only while invalid, through a QP
  // of its PD; the new rkey's index must stay the window's.
  if (type == 2 && mw.bound) return BindError::kBadRkey;
  if (mw.pd != qp_pd) return BindError::kWrongPd;
  if (length == 0 && type == 1) {  // unbind
    mw.bound = false;
    mw.rkey = new_rkey;
    return BindError::kOk;
  }
  const Mr* m = Find(mr_key);
  if (m == nullptr) return BindError::kBadMr;
  const Mr& mr = *m;
  if (mr.pd != mw.pd) return BindError::kWrongPd;
  if (!(mr.access & kMwBind)) return BindError::kNoBindRight;
  // Remote write/atomic rights through a window need local write on the MR.
  if ((access & (kRemoteWrite | kRemoteAtomic)) && !(mr.access & kLocalWrite)) return BindError::kNoBindRight;
  if (iova < mr.iova || length > mr.length || iova - mr.iova > mr.length - length) {
    return BindError::kOutOfBounds;
  }
  mw.bound = true;
  mw.rkey = new_rkey;
  mw.mr_key = mr_key;
  mw.qpn = qpn;
  mw.access = access & (kRemoteWrite | kRemoteRead | kRemoteAtomic);
  mw.iova = iova;
  mw.length = length;
  return BindError::kOk;
}

bool MrTable::Invalidate(uint32_t rkey, uint32_t pd) {
  std::lock_guard<SpinLock> l(mw_lock_);
  Slot* w = SlotOf(rkey);
  if (w == nullptr || w->kind != Slot::kMw || w->mw.type != 2 || !w->mw.bound || w->mw.rkey != rkey ||
      w->mw.pd != pd) {
    return false;
  }
  w->mw.bound = false;
  return true;
}

bool MrTable::HasBoundWindows(uint32_t mr_key) const {
  for (const Slot& s : slots_) {
    if (s.kind == Slot::kMw && s.mw.bound && s.mw.mr_key == mr_key) return true;
  }
  return false;
}

AccessError MrTable::Check(uint32_t key, uint32_t pd, uint64_t iova, uint64_t len, uint32_t need,
                           Place* place) const {
  const Slot* s = SlotOf(key);
  if (s == nullptr) return AccessError::kBadKey;
  const Mr* mr = s->kind == Slot::kMr && s->mr.key == key ? &s->mr : nullptr;
  if (mr == nullptr) {
    if (s->kind != Slot::kMw) return AccessError::kBadKey;
    // A memory window: remote rights only, inside the window, then the MR.
    std::lock_guard<SpinLock> l(mw_lock_);
    const Mw& mw = s->mw;
    if (!mw.bound || mw.rkey != key || need == 0 || (need & kLocalWrite)) return AccessError::kBadKey;
    if (mw.pd != pd) return AccessError::kWrongPd;
    if ((mw.access & need) != need) return AccessError::kNoRights;
    if (iova < mw.iova || len > mw.length || iova - mw.iova > mw.length - len) {
      return AccessError::kOutOfBounds;
    }
    mr = Find(mw.mr_key);
    if (mr == nullptr) return AccessError::kBadKey;
    *place = {reinterpret_cast<uint8_t*>(mr->host + (iova - mr->iova)), mr->pid};
    return AccessError::kOk;
  }
  if (mr->pd != pd) return AccessError::kWrongPd;
  if ((mr->access & need) != need) return AccessError::kNoRights;
  if (iova < mr->iova || len > mr->length || iova - mr->iova > mr->length - len) {
    return AccessError::kOutOfBounds;
  }
  *place = {reinterpret_cast<uint8_t*>(mr->host + (iova - mr->iova)), mr->pid};
  return AccessError::kOk;
}

bool WriteToProcess(const Place& p, const void* src, size_t n) {
  iovec local{const_cast<void*>(src), n}, remote{p.host, n};
  return process_vm_writev(p.pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(n);
}

bool ReadFromProcess(void* dst, const Place& p, size_t n) {
  iovec local{dst, n}, remote{p.host, n};
  return process_vm_readv(p.pid, &local, 1, &remote, 1, 0) == static_cast<ssize_t>(n);
}

bool Atomic(const Place& p, bool cmp_swap, uint64_t compare, uint64_t swap_add, uint64_t* orig) {
  if (p.pid == 0) {
    // Atomic with respect to this host's CPUs too (IBV_ATOMIC_HCA).
    auto* word = reinterpret_cast<uint64_t*>(p.host);
    if (cmp_swap) {
      uint64_t expected = compare;
      __atomic_compare_exchange_n(word, &expected, swap_add, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
      *orig = expected;
    } else {
      *orig = __atomic_fetch_add(word, swap_add, __ATOMIC_SEQ_CST);
    }
    return true;
  }
  uint64_t v = 0;
  if (!ReadFrom(&v, p, 8)) return false;
  *orig = v;
  const uint64_t next = cmp_swap ? (v == compare ? swap_add : v) : v + swap_add;
  return next == v || WriteTo(p, &next, 8);
}

}  // namespace droce::mem
