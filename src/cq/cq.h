// Completion queues in shared memory: the engine produces CQEs, the
// application's threads consume them in ibv_poll_cq without a system call.
//
// Arm/notify ordering (no lost wakeup). The consumer arms, then checks for
// entries; the producer publishes an entry, then checks the arm:
//   consumer:  arm.fetch_or(A)  [seq_cst]  ; fence(seq_cst) ; load prod
//   producer:  store prod       [release]  ; fence(seq_cst) ; load arm
// The two seq_cst fences are totally ordered. If the consumer's fence comes
// first, the producer's load of `arm` sees A and the producer notifies; if the
// producer's fence comes first, the consumer's load of `prod` sees the new
// entry and (with DROCE_CQ_REPORT_MISSED_EVENTS) reports a missed event so the
// application polls again. Either way no completion is left without a wakeup.
// Clearing the arm is an exchange, so exactly one notification fires per arm
// (arming is one-shot, IBA 11.4.2.2).
//
// A turn's completions are held (CqTurnHold): entered in the ring but the
// producer index published, and the arm looked at, only when the hold ends,
// which the engine does after the turn's frames went to the link. So an
// application never sees a completion whose ACK is still only queued in the
// process: fio's server exits (_exit) the moment it has its last receive
// completion, and an ACK a turn later was never sent, the peer resending
// that message to a QP that is gone until its retries ran out (seen against
// Linux rxe). The kernel's rxe completes before it ACKs too, but its
// responder runs to the ACK whatever the process does.
//
// Moderation (ibv_modify_cq) only delays the producer's decision to fire: a
// held-back event stays owed (the arm stays set) until the count is reached
// or the period ends (CqProducer::Tick), so it cannot be lost either.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>

#include "absl/status/statusor.h"
#include "common/spin_lock.h"
#include "queue/abi.h"
#include "queue/ring.h"
#include "queue/shm.h"

namespace droce::cq {

inline constexpr uint32_t kArmSolicited = 1;  // IB_CQ_SOLICITED
inline constexpr uint32_t kArmNextComp = 2;   // IB_CQ_NEXT_COMP

struct CqControl {
  alignas(queue::kCacheLine) std::atomic<uint32_t> arm;
  std::atomic<uint32_t> overflowed;  // set once a completion could not be entered
};

// Called by the producer when an armed CQ gets a completion that matches.
class CqNotifier {
 public:
  virtual ~CqNotifier() = default;
  virtual void NotifyCq(uint64_t cq_cookie) = 0;
  // The CQ overflowed (IBV_EVENT_CQ_ERR).
  virtual void CqError(uint64_t cq_cookie) = 0;
};

// The shared part of one CQ: a memfd region holding the ring and control.
class CqRegion {
 public:
  static absl::StatusOr<std::unique_ptr<CqRegion>> Create(uint32_t min_entries);
  // The region another process created (droced), from its fd (taken) and
  // size; `entries` is the capacity it announced, checked against the ring.
  static absl::StatusOr<std::unique_ptr<CqRegion>> Attach(int fd, size_t size, uint32_t entries);
  queue::Ring ring() const { return ring_; }
  CqControl* control() const { return ctl_; }
  uint32_t capacity() const { return ring_.size(); }
  int fd() const { return shm_.fd(); }
  size_t bytes() const { return shm_.size(); }

 private:
  queue::ShmRegion shm_;
  queue::Ring ring_;
  CqControl* ctl_ = nullptr;
};

class CqProducer;

// Holds the completions this thread enters into any CQ from its construction
// until Release (or its destruction): see the top of this file. One per
// thread at a time; not nested. A CQ that QPs of several workers complete
// into (the shared producer) is published by the first hold that ends, which
// may then carry another worker's entries a little early.
class CqTurnHold {
 public:
  CqTurnHold();
  ~CqTurnHold() { Release(); }
  CqTurnHold(const CqTurnHold&) = delete;
  CqTurnHold& operator=(const CqTurnHold&) = delete;
  // Publishes what was held and goes on holding.
  void Release();

 private:
  friend class CqProducer;
  static thread_local CqTurnHold* current_;
  CqProducer* held_[16];
  unsigned n_ = 0;  // CQs beyond held_'s 16 are not held: they publish at once
};

// Engine side. Owned by exactly one worker thread.
class CqProducer {
 public:
  // `shared`: QPs owned by several worker threads complete into this CQ;
  // every member below then runs under the CQ's producer lock (the consumer
  // side is unchanged: one producer index, published in order).
  CqProducer(CqRegion* region, CqNotifier* notifier, uint64_t cookie, bool shared = false)
      : ring_(region->ring()), ctl_(region->control()), notifier_(notifier), cookie_(cookie), lock_(shared) {}

  // Enters one completion. `solicited` marks a received message with the SE
  // bit; unsuccessful completions also satisfy a solicited-only arm
  // (IBA 11.4.2.2). Returns false if the CQ is full: the completion is not
  // entered, the CQ is marked overflowed and CQ_ERR is raised; the caller must
  // move its QP to the error state.
  bool Push(const queue::Cqe& cqe, bool solicited);
  // Publishes the entries a CqTurnHold kept back (called by the hold).
  void Publish();

  // Event moderation (ibv_modify_cq): while armed for the next completion, a
  // successful completion fires the event only when it is the `count`-th
  // entered since the arm (count 0: no count limit), or when `period_ns` has
  // passed since the first of them (period 0: no time limit; checked by
  // Tick). Unsuccessful completions, and solicited ones on a solicited-only
  // arm, fire at once. Both 0, or count 1: no moderation.
  void SetModeration(uint32_t count, uint64_t period_ns);
  // Whether Tick must be called (a period is set).
  bool needs_tick() const { return mod_period_ns_ != 0; }
  // Fires a held-back event whose period has run out. The period is measured
  // from the first Tick that saw the event held, so it ends up to one tick
  // late. Returns whether an event is still held.
  bool Tick(uint64_t now_ns);
  bool holding() const {
    std::lock_guard<SpinLock> l(lock_);
    return held_ != 0;
  }

  bool full() const {
    std::lock_guard<SpinLock> l(lock_);
    return prod_ - ring_.load_cons_acquire() >= ring_.size();
  }
  // Moves to a new region (ibv_resize_cq), carrying over the completions not
  // yet polled and the arm state. The consumer must be idle meanwhile.
  // Returns false if they do not fit.
  bool MoveTo(CqRegion* region);
  uint64_t cookie() const { return cookie_; }

 private:
  queue::Ring ring_;
  CqControl* ctl_;
  CqNotifier* notifier_;
  uint64_t cookie_;
  mutable SpinLock lock_;
  uint32_t prod_ = 0;
  void Fire();
  // After entries are published: fires or holds the event they owe.
  void Announce(bool error, bool solicited, uint32_t successes);
  // Entered under a CqTurnHold, not yet published.
  bool staged_ = false;
  bool staged_solicited_ = false;
  uint32_t staged_ok_ = 0;
  uint32_t mod_count_ = 0;
  uint64_t mod_period_ns_ = 0;
  uint32_t held_ = 0;           // completions whose event moderation holds back
  uint64_t held_since_ns_ = 0;  // first Tick that saw them; 0: not yet
};

// Application side. Callers serialise Poll/Arm per CQ (the provider's lock).
class CqConsumer {
 public:
  explicit CqConsumer(CqRegion* region) : ring_(region->ring()), ctl_(region->control()) {}

  // Copies up to n completions out; returns how many.
  int Poll(queue::Cqe* out, int n);
  // Arms (kArmSolicited or kArmNextComp). Returns 1 if a completion may have
  // arrived since the last poll (the caller must poll again), else 0.
  int Arm(uint32_t how);
  // Removes every completion of QP `qpn` not yet polled, keeping the others
  // in order (libmlx5's mlx5_cq_clean, for a QP moved to RESET); returns
  // how many. The producer only ever writes past the producer index, so the
  // consumer may rearrange what lies between the indexes.
  uint32_t Clean(uint32_t qpn);
  bool overflowed() const { return ctl_->overflowed.load(std::memory_order_acquire) != 0; }

 private:
  queue::Ring ring_;
  CqControl* ctl_;
};

}  // namespace droce::cq
