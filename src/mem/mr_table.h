// Protection domains and memory regions as the engine sees them. Owned by the
// worker thread: the control path changes them only through the worker's
// mailbox, so lookups on the fast path take no lock and an MR that has been
// deregistered can never be touched afterwards.
#pragma once

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

namespace droce::mem {

// Values of enum ibv_access_flags (stable verbs ABI).
enum Access : uint32_t {
  kLocalWrite = 1,
  kRemoteWrite = 2,
  kRemoteRead = 4,
  kRemoteAtomic = 8,
  kMwBind = 16,
};

struct Mr {
  uint32_t pd = 0;
  uint32_t key = 0;      // lkey == rkey: (index << 8) | variant
  uint32_t access = 0;
  uint64_t iova = 0;     // address the keys' users name
  uint64_t host = 0;     // where those bytes live in this process
  uint64_t length = 0;
};

enum class AccessError : uint8_t { kOk = 0, kBadKey, kWrongPd, kNoRights, kOutOfBounds };

class MrTable {
 public:
  absl::StatusOr<Mr> Register(uint32_t pd, uint64_t host, uint64_t iova, uint64_t length,
                              uint32_t access);
  bool Deregister(uint32_t key);
  const Mr* Find(uint32_t key) const {
    auto it = mrs_.find(key);
    return it == mrs_.end() ? nullptr : &it->second;
  }
  size_t size() const { return mrs_.size(); }

  // Checks that [iova, iova+len) lies inside the MR named by `key`, on `pd`,
  // with every right in `need`, and returns the host address of iova.
  AccessError Check(uint32_t key, uint32_t pd, uint64_t iova, uint64_t len, uint32_t need,
                    uint8_t** host) const;

 private:
  absl::flat_hash_map<uint32_t, Mr> mrs_;
  uint32_t next_index_ = 1;
  uint8_t variant_ = 0;
};

}  // namespace droce::mem
