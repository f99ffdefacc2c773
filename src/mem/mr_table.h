// Protection domains and memory regions as the engine sees them. The control
// path changes them only while the device's workers are stopped, so MR
// lookups on the fast path take no lock and an MR that has been
// deregistered can never be touched afterwards.
#pragma once

#include <cstdint>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/spin_lock.h"

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
  uint64_t host = 0;     // where those bytes live: in this process, or in process `pid`
  uint64_t length = 0;
  int32_t pid = 0;       // 0: this process; else droced's copy tier (process_vm_readv/writev)
};

// Where a checked range of an MR lives: a pointer in this process, or an
// address in another process (droced's tier C), reached only by copying.
struct Place {
  uint8_t* host = nullptr;
  int32_t pid = 0;
};
// Copies into / out of a Place; false if another process's memory could
// not be reached (it unmapped it, or exited): the caller treats it as a
// protection error.
bool WriteToProcess(const Place& p, const void* src, size_t n);
bool ReadFromProcess(void* dst, const Place& p, size_t n);
inline bool WriteTo(const Place& p, const void* src, size_t n) {
  if (p.pid != 0) return WriteToProcess(p, src, n);
  std::memcpy(p.host, src, n);
  return true;
}
inline bool ReadFrom(void* dst, const Place& p, size_t n) {
  if (p.pid != 0) return ReadFromProcess(dst, p, n);
  std::memcpy(dst, p.host, n);
  return true;
}
// An 8-byte atomic at p (IBV_ATOMIC_HCA): compare-and-swap or fetch-and-add,
// returning the original value. Between processes it is a read and a write
// (atomic only with respect to the engine's other atomics).
bool Atomic(const Place& p, bool cmp_swap, uint64_t compare, uint64_t swap_add, uint64_t* orig);

enum class AccessError : uint8_t { kOk = 0, kBadKey, kWrongPd, kNoRights, kOutOfBounds };

// A memory window (IBA 10.6.7): a remote-access window onto part of an MR,
// bound and unbound by work requests. Its rkey is (index << 8) | variant; the
// variant is chosen at each bind, so old rkeys stop matching.
struct Mw {
  uint32_t pd = 0;
  uint8_t type = 1;        // 1 or 2 (IBV_MW_TYPE_*)
  bool bound = false;
  uint32_t rkey = 0;       // current rkey
  uint32_t mr_key = 0;     // the MR it is bound to
  uint32_t qpn = 0;        // type 2: the QP it is bound through
  uint32_t access = 0;     // remote rights
  uint64_t iova = 0;
  uint64_t length = 0;
};

enum class BindError : uint8_t { kOk = 0, kBadMw, kBadMr, kWrongPd, kNoBindRight, kOutOfBounds, kBadRkey };

// Several worker threads of a device read the table at once; MRs and
// windows are added and removed only while every worker is stopped (the
// device's control calls), but windows are bound and invalidated by work
// requests and SENDs on any worker, so window state is read and written
// under the table's window lock (set_concurrent).
//
// Keys are (index << 8) | variant, as an RNIC's: the index names a slot of
// a dense table, so the check that every packet touching memory makes is an
// array access and a compare, not a search. A freed index waits in a FIFO
// until kQuarantine others have been freed after it, and each reuse of a
// slot steps its variant, so a stale key (a deregistered MR, a window's old
// binding) could match a slot's new occupant only after 256 reuses of that
// slot, that is after at least 256 × kQuarantine deregistrations.
class MrTable {
 public:
  void set_concurrent(bool on) { mw_lock_.set_enabled(on); }
  absl::StatusOr<Mr> Register(uint32_t pd, uint64_t host, uint64_t iova, uint64_t length,
                              uint32_t access, int32_t pid = 0);
  bool Deregister(uint32_t key);
  // ibv_rereg_mr: the MR named by `key` takes `m`'s PD, access and range,
  // its keys unchanged (control path, no turn running). Refused as
  // Register refuses; false if there is no such MR.
  absl::Status Update(uint32_t key, const Mr& m);
  const Mr* Find(uint32_t key) const {
    const Slot* s = SlotOf(key);
    return s != nullptr && s->kind == Slot::kMr && s->mr.key == key ? &s->mr : nullptr;
  }
  size_t size() const { return live_mrs_; }
  // Every registered MR, in key index order (control path).
  template <typename F>
  void ForEachMr(F f) const {
    for (const Slot& s : slots_) {
      if (s.kind == Slot::kMr) f(s.mr);
    }
  }

  // Memory windows.
  absl::StatusOr<uint32_t> AllocMw(uint32_t pd, uint8_t type);
  bool DeallocMw(uint32_t rkey);
  // The window whose index is rkey >> 8, whatever its current variant.
  const Mw* FindMw(uint32_t rkey) const {
    const Slot* s = SlotOf(rkey);
    return s != nullptr && s->kind == Slot::kMw ? &s->mw : nullptr;
  }
  // Binds (length != 0) or unbinds (length == 0) the window whose index is
  // new_rkey >> 8 to [iova, iova+length) of MR mr_key, giving it new_rkey.
  BindError Bind(uint32_t new_rkey, uint8_t type, uint32_t qp_pd, uint32_t qpn, uint32_t mr_key,
                 uint64_t iova, uint64_t length, uint32_t access);
  // LOCAL_INV / SEND with invalidate: only a bound type 2 window on `pd`.
  bool Invalidate(uint32_t rkey, uint32_t pd);
  // Windows still bound to an MR (the MR cannot be deregistered meanwhile).
  bool HasBoundWindows(uint32_t mr_key) const;

  // Checks that [iova, iova+len) lies inside the MR named by `key`, on `pd`,
  // with every right in `need`, and returns the host address of iova.
  AccessError Check(uint32_t key, uint32_t pd, uint64_t iova, uint64_t len, uint32_t need,
                    Place* place) const;
  // The same for callers that only check.
  AccessError Check(uint32_t key, uint32_t pd, uint64_t iova, uint64_t len, uint32_t need) const {
    Place p;
    return Check(key, pd, iova, len, need, &p);
  }

 private:
  static constexpr size_t kQuarantine = 1024;
  struct Slot {
    enum Kind : uint8_t { kFree, kMr, kMw } kind = kFree;
    uint8_t variant = 0;  // of the slot's latest key; kept while free
    Mr mr;                // kMr
    Mw mw;                // kMw
  };
  const Slot* SlotOf(uint32_t key) const {
    const uint32_t i = key >> 8;
    return i < slots_.size() ? &slots_[i] : nullptr;
  }
  Slot* SlotOf(uint32_t key) { return const_cast<Slot*>(std::as_const(*this).SlotOf(key)); }
  // A free slot and a fresh key for it; ResourceExhausted when every one of
  // the 2^24 indexes is in use or quarantined.
  absl::StatusOr<uint32_t> NewKey();
  void Free(uint32_t index);

  std::vector<Slot> slots_ = std::vector<Slot>(1);  // index 0 is never used
  std::deque<uint32_t> free_;  // freed indexes, oldest first
  size_t live_mrs_ = 0;
  mutable SpinLock mw_lock_;
  uint8_t RandomVariant();
  uint64_t rng_ = 0;  // xorshift state, seeded from getrandom
};

}  // namespace droce::mem
