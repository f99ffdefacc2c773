#include "mem/mr_table.h"

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

AccessError MrTable::Check(uint32_t key, uint32_t pd, uint64_t iova, uint64_t len, uint32_t need,
                           uint8_t** host) const {
  auto it = mrs_.find(key);
  if (it == mrs_.end()) return AccessError::kBadKey;
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
