#include "cq/cq.h"

#include <unistd.h>

#include <cstring>
#include <iterator>

namespace droce::cq {

namespace {
// CqControl is cache-line aligned and must not share a line with a CQE.
size_t cq_ring_len(uint32_t size) {
  return (queue::ring_bytes(size, sizeof(queue::Cqe)) + queue::kCacheLine - 1) & ~(queue::kCacheLine - 1);
}
}  // namespace

absl::StatusOr<std::unique_ptr<CqRegion>> CqRegion::Attach(int fd, size_t size, uint32_t entries) {
  if (entries < 2 || entries > (1u << 24) || (entries & (entries - 1)) != 0 ||
      size < cq_ring_len(entries) + sizeof(CqControl)) {
    if (fd >= 0) close(fd);
    return absl::InvalidArgumentError("CQ region does not match its size");
  }
  auto shm = queue::ShmRegion::Adopt(fd, size);
  if (!shm.ok()) return shm.status();
  auto r = std::make_unique<CqRegion>();
  r->shm_ = std::move(*shm);
  r->ring_ = queue::Ring(r->shm_.data());
  if (r->ring_.size() != entries || r->ring_.stride() != sizeof(queue::Cqe)) {
    return absl::InvalidArgumentError("CQ ring geometry differs from the one announced");
  }
  r->ctl_ = reinterpret_cast<CqControl*>(static_cast<uint8_t*>(r->shm_.data()) + cq_ring_len(entries));
  return r;
}

absl::StatusOr<std::unique_ptr<CqRegion>> CqRegion::Create(uint32_t min_entries) {
  const uint32_t size = queue::round_up_pow2(min_entries < 2 ? 2 : min_entries);
  if (size == 0 || size > (1u << 24)) return absl::InvalidArgumentError("CQ size out of range");
  const size_t ring_len = cq_ring_len(size);
  auto shm = queue::ShmRegion::Create("droce-cq", ring_len + sizeof(CqControl));
  if (!shm.ok()) return shm.status();
  auto r = std::make_unique<CqRegion>();
  r->shm_ = std::move(*shm);
  r->ring_ = queue::Ring::Init(r->shm_.data(), size, sizeof(queue::Cqe));
  r->ctl_ = new (static_cast<uint8_t*>(r->shm_.data()) + ring_len) CqControl();
  r->ctl_->arm.store(0, std::memory_order_relaxed);
  r->ctl_->overflowed.store(0, std::memory_order_relaxed);
  return r;
}

thread_local CqTurnHold* CqTurnHold::current_ = nullptr;

CqTurnHold::CqTurnHold() { current_ = this; }

void CqTurnHold::Release() {
  for (unsigned i = 0; i < n_; ++i) held_[i]->Publish();
  n_ = 0;
  if (current_ == this) current_ = nullptr;
}

bool CqProducer::Push(const queue::Cqe& cqe, bool solicited) {
  std::lock_guard<SpinLock> l(lock_);
  if (prod_ - ring_.load_cons_acquire() >= ring_.size()) {
    if (ctl_->overflowed.exchange(1, std::memory_order_acq_rel) == 0 && notifier_ != nullptr) {
      notifier_->CqError(cookie_);
    }
    return false;
  }
  std::memcpy(ring_.slot(prod_), &cqe, sizeof(cqe));
  ++prod_;
  const bool error = cqe.status != queue::wc::kSuccess;
  CqTurnHold* hold = CqTurnHold::current_;
  if (hold != nullptr && !error && (staged_ || hold->n_ < std::size(hold->held_))) {
    // Held for the end of the turn (cq.h). An error completion is not held:
    // it announces a QP gone to the error state, which no ACK of ours is
    // owed for, and is published with what was held before it.
    if (!staged_) {
      staged_ = true;
      hold->held_[hold->n_++] = this;
    }
    staged_solicited_ |= solicited;
    ++staged_ok_;
    return true;
  }
  // (Entries held before it are published with it; the CQ stays on its
  // hold's list for later ones.)
  const bool was_solicited = staged_solicited_ || solicited;
  const uint32_t ok = staged_ok_ + (error ? 0 : 1);
  staged_solicited_ = false;
  staged_ok_ = 0;
  ring_.publish_prod(prod_);
  Announce(error, was_solicited, ok);
  return true;
}

void CqProducer::Publish() {
  std::lock_guard<SpinLock> l(lock_);
  if (!staged_) return;
  staged_ = false;
  if (staged_ok_ == 0) return;  // an error completion published them already
  const bool solicited = staged_solicited_;
  const uint32_t ok = staged_ok_;
  staged_solicited_ = false;
  staged_ok_ = 0;
  ring_.publish_prod(prod_);
  Announce(false, solicited, ok);
}

void CqProducer::Announce(bool error, bool solicited, uint32_t successes) {
  // Producer half of the Dekker pair described in cq.h.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  const uint32_t arm = ctl_->arm.load(std::memory_order_relaxed);
  if (arm == 0) return;
  const bool urgent = error || (solicited && !(arm & kArmNextComp));
  if (urgent) {
    Fire();
  } else if (arm & kArmNextComp) {
    // Moderated: hold the event until the count is reached (or Tick fires it
    // when the period ends).
    held_ += successes;
    if (mod_count_ != 0 ? held_ >= mod_count_ : mod_period_ns_ == 0) Fire();
  }
}

void CqProducer::Fire() {
  held_ = 0;
  held_since_ns_ = 0;
  if (ctl_->arm.exchange(0, std::memory_order_acq_rel) != 0 && notifier_ != nullptr) {
    notifier_->NotifyCq(cookie_);
  }
}

void CqProducer::SetModeration(uint32_t count, uint64_t period_ns) {
  std::lock_guard<SpinLock> l(lock_);
  mod_count_ = count;
  mod_period_ns_ = period_ns;
  // Events held under the old setting are owed now.
  if (held_ != 0) Fire();
}

bool CqProducer::Tick(uint64_t now_ns) {
  std::lock_guard<SpinLock> l(lock_);
  if (held_ == 0) return false;
  if (held_since_ns_ == 0) {
    held_since_ns_ = now_ns;
    return true;
  }
  if (mod_period_ns_ != 0 && now_ns - held_since_ns_ >= mod_period_ns_) {
    Fire();
    return false;
  }
  return true;
}

bool CqProducer::MoveTo(CqRegion* region) {
  std::lock_guard<SpinLock> l(lock_);
  const uint32_t cons = ring_.load_cons_acquire();
  const uint32_t pending = prod_ - cons;
  queue::Ring next = region->ring();
  if (pending > next.size()) return false;
  for (uint32_t i = 0; i < pending; ++i) std::memcpy(next.slot(i), ring_.slot(cons + i), sizeof(queue::Cqe));
  next.publish_prod(pending);
  region->control()->arm.store(ctl_->arm.load(std::memory_order_acquire), std::memory_order_release);
  ring_ = next;
  ctl_ = region->control();
  prod_ = pending;
  return true;
}

int CqConsumer::Poll(queue::Cqe* out, int n) {
  uint32_t cons = ring_.load_cons_relaxed();
  const uint32_t prod = ring_.load_prod_acquire();
  int got = 0;
  while (got < n && cons != prod) {
    std::memcpy(&out[got], ring_.slot(cons), sizeof(queue::Cqe));
    ++cons;
    ++got;
  }
  if (got > 0) ring_.publish_cons(cons);
  return got;
}

uint32_t CqConsumer::Clean(uint32_t qpn) {
  const uint32_t cons = ring_.load_cons_relaxed();
  const uint32_t prod = ring_.load_prod_acquire();
  uint32_t freed = 0;
  // From the newest down: each kept entry moves up past the removed ones.
  for (uint32_t i = prod; i != cons;) {
    --i;
    const auto* c = reinterpret_cast<const queue::Cqe*>(ring_.slot(i));
    if (c->qp_num == qpn) {
      ++freed;
    } else if (freed != 0) {
      std::memmove(ring_.slot(i + freed), c, sizeof(queue::Cqe));
    }
  }
  if (freed != 0) ring_.publish_cons(cons + freed);
  return freed;
}

int CqConsumer::Arm(uint32_t how) {
  ctl_->arm.fetch_or(how, std::memory_order_seq_cst);
  // Consumer half of the Dekker pair described in cq.h.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return ring_.load_prod_acquire() != ring_.load_cons_relaxed() ? 1 : 0;
}

}  // namespace droce::cq
