// Which of a loop's QPs run next, and when: the one scheduler that both the
// engine's workers (engine/worker.cc) and the transport simulator
// (transport/sim/two_qp.h) drive, so that a QP the transport leaves with
// work and nobody activates stalls a transport test, not only a live link.
//
// A QP is on one of three lists:
// - active: it may have something to send; PollActive gives each a send
//   budget and drops those that have nothing left (the transport says so);
// - timers: a min-heap of (ns, qpn) by when its transport timer is due
//   (Qp::TimerDue); an entry whose QP went or was rescheduled (its
//   timer_at differs) is dropped when it comes up, one that comes up early
//   (ACKs moved the deadline) is pushed again at the new time. Nothing is
//   scanned per QP per turn. `armed` counts the QPs with a live entry: while
//   any, the loop must not sleep. An entry is dropped as soon as its QP has
//   nothing in flight;
// - paced: a min-heap of (ns, qpn) by when its pacer lets it send again
//   (transport/pacer.h), stale entries dropped the same way.
// What activates a QP: a doorbell (new WQEs), a modify, a packet that
// leaves a response or ACK to send or opens the window (AfterPacket), a
// timer that fired, its pacing time.
//
// DPDK-free, single-threaded (the loop's owner), header-only so that the
// per-packet calls inline. `Entry` is the host's record of a QP: it derives
// from Schedulable and has `qp`, a pointer (or unique_ptr) to its Qp. The
// host's `find(qpn)` returns the Entry this scheduler runs for a QPN, or
// nullptr (gone, or run by another loop).
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <queue>
#include <vector>

#include "transport/qp.h"

namespace droce::transport {

// A QP's place in its scheduler.
struct Schedulable {
  bool active = false;    // on the active list
  uint64_t timer_at = 0;  // its live entry in the timer heap (ns), 0 if none
  uint64_t paced_at = 0;  // its live entry in the pacing heap (ns), 0 if none
};

template <typename Entry>
class QpScheduler {
 public:
  // A QP that may have something to send: polled at the next PollActive.
  void Activate(Entry* e) {
    if (!e->active) {
      e->active = true;
      active_.push_back(e);
    }
  }

  // A QP about to go: off the active list; its heap entries go stale.
  void Forget(Entry* e) {
    if (e->active) std::erase(active_, e);
    if (e->timer_at != 0) --armed_;
    e->active = false;
    e->timer_at = e->paced_at = 0;
  }

  // Queues e's transport timer if it has one and none is queued (or an RNR
  // wait may have made it earlier); drops it once nothing is in flight.
  template <typename Find>
  void ArmTimer(Entry* e, Find&& find) {
    Qp& q = *e->qp;
    if (!q.HasOutstanding()) {
      if (e->timer_at != 0) {  // everything acknowledged: its entry goes stale
        e->timer_at = 0;
        --armed_;
      }
      return;
    }
    if (e->timer_at != 0 && !q.timer_may_move_earlier()) return;
    const uint64_t due = std::max<uint64_t>(q.TimerDue(), 1);
    if (due == Qp::kNoTimer || (e->timer_at != 0 && e->timer_at <= due)) return;
    if (e->timer_at == 0) ++armed_;
    e->timer_at = due;
    timers_.push({due, q.qpn()});
    // Stale entries (QPs that finished or went) wait for their time; keep
    // them from piling up when QPs come and go faster than their timeouts.
    if (timers_.size() > 2 * size_t{armed_} + 1024) [[unlikely]] CompactTimers(find);
  }

  // After a packet was handed to e's QP (Qp::OnPacket) and its events
  // delivered: an ACK (a response packet) may have opened the window, a
  // request may have left READ responses or ACKs to send.
  template <typename Find>
  void AfterPacket(Entry* e, bool response, Find&& find) {
    if (response || e->qp->HasResponses()) Activate(e);
    ArmTimer(e, find);
  }

  // Gives each active QP a send budget; after(e) runs after each (its
  // events). A QP whose pacer holds it goes on the pacing heap; one with
  // nothing left leaves the list. Returns whether any has more to send.
  template <typename After, typename Find>
  bool PollActive(unsigned budget, After&& after, Find&& find) {
    bool more_any = false;
    for (size_t i = 0; i < active_.size();) {
      Entry* e = active_[i];
      const bool more = e->qp->PollSend(budget);
      after(e);
      if (const uint64_t until = e->qp->paced_until(); until != 0 && e->paced_at != until) [[unlikely]] {
        e->paced_at = until;
        paced_.push({until, e->qp->qpn()});
      }
      ArmTimer(e, find);
      if (more) {
        more_any = true;
        ++i;
      } else {
        e->active = false;
        active_[i] = active_.back();
        active_.pop_back();
      }
    }
    return more_any;
  }

  // Paced QPs whose time has come go back on the active list (one
  // comparison when none is paced).
  template <typename Find>
  void RunPaced(uint64_t now, Find&& find) {
    while (!paced_.empty() && paced_.top().ns <= now) {
      const Due p = paced_.top();
      paced_.pop();
      Entry* e = find(p.qpn);
      if (e == nullptr || e->paced_at != p.ns) continue;
      e->paced_at = 0;
      Activate(e);
    }
  }

  // Runs the transport timers due by `now`: Qp::OnTimer, fired(e) (its
  // events), and the QP back on the active list (a timeout or an RNR
  // expiry may have made packets sendable). A QP whose state ignores its
  // timer is looked at again `min_step` later, not in a loop.
  template <typename Find, typename Fired>
  void RunTimers(uint64_t now, uint64_t min_step, Find&& find, Fired&& fired) {
    while (!timers_.empty() && timers_.top().ns <= now) {
      const Due t = timers_.top();
      timers_.pop();
      Entry* e = find(t.qpn);
      if (e == nullptr || e->timer_at != t.ns) continue;
      e->timer_at = 0;
      --armed_;
      if (e->qp->TimerDue() <= now) {
        e->qp->OnTimer(now);
        fired(e);
        Activate(e);
      }
      uint64_t due = e->qp->TimerDue();
      if (due == Qp::kNoTimer) continue;
      due = std::max(due, now + min_step);
      e->timer_at = due;
      ++armed_;
      timers_.push({due, t.qpn});
    }
  }

  // Work that keeps the loop from sleeping: QPs that may send, or wait for
  // ACKs.
  bool busy() const { return armed_ != 0 || !active_.empty(); }
  // The first paced QP's time to send, 0 if none.
  uint64_t next_paced() const { return paced_.empty() ? 0 : paced_.top().ns; }
  bool has_paced() const { return !paced_.empty(); }
  // The first timer's time (stale entries included), 0 if none.
  uint64_t next_timer() const { return timers_.empty() ? 0 : timers_.top().ns; }
  uint32_t armed() const { return armed_; }
  size_t active() const { return active_.size(); }

 private:
  struct Due {
    uint64_t ns;
    uint32_t qpn;
    bool operator>(const Due& o) const { return ns > o.ns; }
  };
  using Heap = std::priority_queue<Due, std::vector<Due>, std::greater<Due>>;

  // Rebuilds the timer heap without the entries of QPs gone or rescheduled.
  template <typename Find>
  void CompactTimers(Find&& find) {
    std::vector<Due> live;
    live.reserve(armed_);
    for (; !timers_.empty(); timers_.pop()) {
      const Due& t = timers_.top();
      if (Entry* e = find(t.qpn); e != nullptr && e->timer_at == t.ns) live.push_back(t);
    }
    for (const Due& t : live) timers_.push(t);
  }

  std::vector<Entry*> active_;
  Heap timers_;
  Heap paced_;
  uint32_t armed_ = 0;
};

}  // namespace droce::transport
