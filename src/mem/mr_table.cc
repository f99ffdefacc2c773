#include "mem/mr_table.h"

#include <mutex>

namespace droce::mem {

absl::StatusOr<Mr> MrTable::Register(uint32_t pd, uint64_t host, uint64_t iova, uint64_t length,
                                     uint32_t access) {
  // IBA 10.6.3.1: remote write or atomic rights need local write.
  if ((access & (kRemoteWrite | kRemoteAtomic)) && !(access & kLocalWrite)) {
    return absl::InvalidArgumentError("remote write/atomic access requires local write");
  }
  if (length != 0 && iova + length < iova) return absl::InvalidArgumentError("range wraps");
  if (next_index_ >= (1u << 24)) return absl::ResourceExhaustedError("MR keys exhausted");
  // The low byte varies between registrations so that a stale key from a
  // deregistered MR does not silently match a new one.
  variant_ = static_cast<uint8_t>(variant_ * 37 + 11);
  const uint32_t key = (next_index_++ << 8) | variant_;
  Mr mr{pd, key, access, iova, host, length};
  mrs_.emplace(key, mr);
  return mr;
}

bool MrTable::Deregister(uint32_t key) { return mrs_.erase(key) == 1; }

absl::StatusOr<uint32_t> MrTable::AllocMw(uint32_t pd, uint8_t type) {
  if (type != 1 && type != 2) return absl::InvalidArgumentError("memory window type");
  if (next_index_ >= (1u << 24)) return absl::ResourceExhaustedError("keys exhausted");
  variant_ = static_cast<uint8_t>(variant_ * 37 + 11);
  const uint32_t rkey = (next_index_++ << 8) | variant_;
  Mw mw;
  mw.pd = pd;
  mw.type = type;
  mw.rkey = rkey;
  mws_.emplace(rkey >> 8, mw);
  return rkey;
}

bool MrTable::DeallocMw(uint32_t rkey) { return mws_.erase(rkey >> 8) == 1; }

BindError MrTable::Bind(uint32_t new_rkey, uint8_t type, uint32_t qp_pd, uint32_t qpn, uint32_t mr_key,
                        uint64_t iova, uint64_t length, uint32_t access) {
  std::lock_guard<SpinLock> l(mw_lock_);
  auto w = mws_.find(new_rkey >> 8);
  if (w == mws_.end() || w->second.type != type) return BindError::kBadMw;
  Mw& mw = w->second;
  // IBA 10.6.7.2: a type 2 window is bound only while invalid, through a QP
  // of its PD; the new rkey's index must stay the window's.
  if (type == 2 && mw.bound) return BindError::kBadRkey;
  if (mw.pd != qp_pd) return BindError::kWrongPd;
  if (length == 0 && type == 1) {  // unbind
    mw.bound = false;
    mw.rkey = new_rkey;
    return BindError::kOk;
  }
  auto m = mrs_.find(mr_key);
  if (m == mrs_.end()) return BindError::kBadMr;
  const Mr& mr = m->second;
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
  auto w = mws_.find(rkey >> 8);
  if (w == mws_.end() || w->second.type != 2 || !w->second.bound || w->second.rkey != rkey ||
      w->second.pd != pd) {
    return false;
  }
  w->second.bound = false;
  return true;
}

bool MrTable::HasBoundWindows(uint32_t mr_key) const {
  for (const auto& [i, w] : mws_) {
    if (w.bound && w.mr_key == mr_key) return true;
  }
  return false;
}

AccessError MrTable::Check(uint32_t key, uint32_t pd, uint64_t iova, uint64_t len, uint32_t need,
                           uint8_t** host) const {
  auto it = mrs_.find(key);
  if (it == mrs_.end()) {
    // A memory window: remote rights only, inside the window, then the MR.
    std::lock_guard<SpinLock> l(mw_lock_);
    auto w = mws_.find(key >> 8);
    if (w == mws_.end() || !w->second.bound || w->second.rkey != key || need == 0 ||
        (need & kLocalWrite)) {
      return AccessError::kBadKey;
    }
    const Mw& mw = w->second;
    if (mw.pd != pd) return AccessError::kWrongPd;
    if ((mw.access & need) != need) return AccessError::kNoRights;
    if (iova < mw.iova || len > mw.length || iova - mw.iova > mw.length - len) {
      return AccessError::kOutOfBounds;
    }
    it = mrs_.find(mw.mr_key);
    if (it == mrs_.end()) return AccessError::kBadKey;
    *host = reinterpret_cast<uint8_t*>(it->second.host + (iova - it->second.iova));
    return AccessError::kOk;
  }
  const Mr& mr = it->second;
  if (mr.pd != pd) return AccessError::kWrongPd;
  if ((mr.access & need) != need) return AccessError::kNoRights;
  if (iova < mr.iova || len > mr.length || iova - mr.iova > mr.length - len) {
    return AccessError::kOutOfBounds;
  }
  *host = reinterpret_cast<uint8_t*>(mr.host + (iova - mr.iova));
  return AccessError::kOk;
}

}  // namespace droce::mem
