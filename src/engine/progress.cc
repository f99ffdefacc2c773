// Progress: who runs a worker's turn, and when. Whoever holds a worker's
// drive lock runs it: the worker's own thread (Loop), or an application
// thread driving from ibv_poll_cq/ibv_post_* (TryDrive, Kick); the control
// path takes every drive lock (RunOnWorker, device.cc). An idle worker backs
// off (spin, yield, sleep; YieldCpu's naps for a spinner), and while
// applications drive it naps or watches the link at real-time priority
// (DROCE_WATCH_US), so that two droce processes share a 2-core machine.
#include <linux/futex.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_pause.h>
#include <rte_ring.h>

#include "common/log.h"
#include "engine/device.h"
#include "wire/bytes.h"

namespace droce::engine {
namespace {
// Idle back-off: spin, then yield the CPU, then sleep (futex with timeout,
// woken early by doorbells and control calls).
constexpr unsigned kSpinLoops = 200;
// Keep yielding (not sleeping) this long after the last work: a peer's next
// packet in a ping-pong arrives within microseconds, and a sleeping worker
// cannot see it (no Rx interrupts on memif/af_xdp/af_packet).
constexpr uint64_t kYieldWindowNs = 5'000'000;
constexpr long kSleepNs = 200'000;
// Where the idle back-off would yield, a worker whose yields a spinner
// takes for a whole time slice naps instead (engine/yield_policy.h,
// YieldCpu): daemon-mode ib_write_lat's median was 2.0 or 4.0 ms. The
// naps are DROCE_WATCH_US long while the link is busy: 10 us made that
// ib_write_lat 15 times slower than 20 us (the wakeups took the spinner's
// CPU), 30 or 50 us about the same as 20. They have timer slack 1 ns,
// doorbells end them, and no spin goes before them. YieldCpu reads the
// thread's CPU time at most once per kCpuRefNs.
constexpr uint64_t kCpuRefNs = 1'000'000;
// How long before a paced QP's next packet the worker stops sleeping and
// spins (transport/pacer.h): a futex sleep with 1 ns slack still wakes some
// tens of microseconds late on a busy machine.
constexpr uint64_t kPaceSpinNs = 60'000;
// While application threads drive the engine (ibv_poll_cq, ibv_post_*), the
// worker naps and takes over when they have not driven for this long, or at
// once when one of them is about to block (Device::Handoff). Every wakeup of
// the worker costs a context switch, which on a VM is tens of microseconds.
constexpr uint64_t kAppDriveWindowNs = 2'000'000;
// A post within this long of an application thread's drive from
// ibv_poll_cq is left for that thread's next poll (Device::Kick). The drive
// time is the worker's last timer tick, up to kTimerTickNs old.
constexpr uint64_t kKickDeferNs = 100'000;
constexpr long kAppNapNs = 1'000'000;
// Only threads that poll busily send the worker to sleep: at least
// kBusyPolls ibv_poll_cq calls in the last kBusyIntervalNs. A program that
// polls now and then (UCX's progress from its socket waits: a few polls
// every millisecond) does not, or a peer's RDMA READ or atomic, which only
// the engine answers, waited up to kAppNapNs for the next nap's end (UCX's
// ucp_get: 1.1 ms per READ).
constexpr uint64_t kBusyIntervalNs = 1'000'000;
constexpr uint64_t kBusyPolls = 20;
constexpr long kShortNapNs = 20'000;
// Watching (DROCE_WATCH_US) instead of napping while applications drive: an
// application thread that polls busily can stop calling into verbs at any
// moment and spin on memory instead (ib_write_lat: poll the send CQ, then
// spin until the peer's WRITE lands), and only the worker can receive that
// WRITE. On a CPU it shares with the spinner, a SCHED_OTHER worker waking
// from a nap waits for the scheduler to preempt the spinner (milliseconds:
// ib_write_lat's median was 1.6-2.7 ms); a SCHED_FIFO one preempts it on
// wake. So the watching worker runs at real-time priority, sleeps
// DROCE_WATCH_US between looks, and runs at most one engine turn per look:
// its busy time is bounded by a turn per sleep, it never spins or yields at
// that priority (sched_yield would not let the application run), and it
// leaves it (SCHED_OTHER) whenever it stops watching. A look is not cheap
// on this VM: a SCHED_FIFO thread waking from a 5-20 us futex sleep runs
// 4-6 us late and costs a spinning thread on its CPU ~13 us each time
// (docs/PERFORMANCE.md), so DROCE_WATCH_US much below 20 saturates the CPU
// with looks (5 us: ib_write_lat median 289 us instead of 18-30 us).
//
// The application was active at a look if it drove or posted within
// kWatchActiveNs before the look's timer fired. The gaps of a bandwidth loop
// are several microseconds (a turn of 32 packets, then 32 CQEs taken and
// as many receives reposted, the turn's clock reading being the stamp):
// with a 2 us window most looks took ib_send_bw's receiver for away and the
// looks stayed at DROCE_WATCH_US, which cost 13 % of its 64 B message rate;
// a spinning ib_write_lat receiver is away for tens of microseconds. After
// kWatchStreak looks in a row that find it active (a thread that polls
// continuously, e.g. ib_send_lat or a bandwidth loop, and needs no help)
// the period doubles up to kAppNapNs, so the looks cost it little; a look
// that finds it away starts over at DROCE_WATCH_US while the link is busy
// (a look found work in the last kWatchHotNs), and doubles towards
// kAppNapNs while it is idle (an application that computes).
constexpr uint64_t kWatchActiveNs = 10'000;
constexpr unsigned kWatchStreak = 8;
constexpr uint64_t kWatchHotNs = 200'000;
constexpr int kWatchPriority = 1;  // the lowest SCHED_FIFO priority
// The calling thread's CPU time (a system call, not the vDSO).
uint64_t ThreadCpuNs() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000 + static_cast<uint64_t>(ts.tv_nsec);
}
// Whether this thread (a watching worker) runs at real-time priority.
thread_local bool t_realtime = false;

// The calling thread to SCHED_FIFO (true) or back to SCHED_OTHER. Reset on
// fork, so that no thread or child it creates inherits the priority.
bool SetRealtime(bool on) {
  sched_param p{};
  p.sched_priority = on ? kWatchPriority : 0;
  // Timer slack 1 ns while watching (recent kernels give RT threads none
  // anyway), the default again after.
  prctl(PR_SET_TIMERSLACK, on ? 1UL : 0UL);
  return sched_setscheduler(0, on ? (SCHED_FIFO | SCHED_RESET_ON_FORK) : SCHED_OTHER, &p) == 0;
}

// The default timer slack again unless the thread still needs 1 ns: it
// watches at real-time priority, or it naps for a spinner (YieldCpu).
void RelaxTimerSlack(const Worker& w) {
  if (!t_realtime && !w.yield.active()) prctl(PR_SET_TIMERSLACK, 0UL);
}

}  // namespace


// The watching worker's state (its own thread only).
struct Device::WatchState {
  long period_ns = 0;
  unsigned active_streak = 0;
  uint64_t last_busy_ns = 0;
};

void Device::SetupWatch(const Config& cfg) {
  // Several workers share spin locks (CQ producers, SRQs) whose holder, a
  // driving application thread, a real-time worker on its CPU would never
  // let finish: watching is for a device with one worker.
  contended_nap_ns_ = uint64_t{cfg.watch_us} * 1000;
  if (!cfg.app_progress || cfg.watch_us == 0) return;
  if (cfg.workers != 1) {
    Log(LogLevel::kInfo,
        "%s: DROCE_WATCH_US applies to a device with one worker; %d workers nap while the application drives",
        port_.name.c_str(), cfg.workers);
    return;
  }
  watch_ns_.store(uint64_t{cfg.watch_us} * 1000, std::memory_order_relaxed);
}

void Device::LeaveRealtime() {
  if (!t_realtime) return;
  t_realtime = false;
  (void)SetRealtime(false);
}

// One look while applications drive (see kWatchActiveNs above).
void Device::Watch(Worker& w, WatchState& ws) {
  const uint64_t watch_ns = watch_ns_.load(std::memory_order_relaxed);
  if (!t_realtime) {
    if (!SetRealtime(true)) {
      // Not permitted (no CAP_SYS_NICE, RLIMIT_RTPRIO 0): a SCHED_OTHER
      // worker's wakeups would not preempt a spinning application, so nap as
      // before instead of paying for looks that do not help.
      Log(LogLevel::kWarning,
          "%s: DROCE_WATCH_US: real-time priority not permitted (%s); the worker naps while the application drives",
          port_.name.c_str(), std::strerror(errno));
      watch_ns_.store(0, std::memory_order_relaxed);
      return;
    }
    t_realtime = true;
    ws.period_ns = static_cast<long>(watch_ns);
    ws.active_streak = 0;
  }
  const uint64_t due = NowNs() + static_cast<uint64_t>(ws.period_ns);
  SleepUnless(w, ws.period_ns, [this] { return ctl_pending_.load(std::memory_order_relaxed) != 0; });
  if (ctl_pending_.load(std::memory_order_relaxed) != 0) return;  // Loop leaves real time first
  const uint64_t now = NowNs();
  // Whether the application was in the provider shortly before the timer
  // fired and preempted it: the worker itself runs several microseconds
  // after that on this VM (the wakeup's cost), which is not the
  // application's gap.
  const uint64_t fired = std::min(now, due);
  const bool app_active = app_seen_ns_.load(std::memory_order_relaxed) + kWatchActiveNs > fired;
  // Awake anyway: one turn if nobody is in one (a turn of an idle link is a
  // fraction of the wakeup's cost).
  const bool busy = TryTakeDrive(w) && DriveLocked(w);
  if (app_active) {
    if (++ws.active_streak >= kWatchStreak) ws.period_ns = std::min(ws.period_ns * 2, kAppNapNs);
    return;
  }
  ws.active_streak = 0;
  if (busy) ws.last_busy_ns = now;
  ws.period_ns = now - ws.last_busy_ns < kWatchHotNs ? static_cast<long>(watch_ns)
                                                     : std::min(ws.period_ns * 2, kAppNapNs);
}

// Progress: whoever holds a worker's drive lock runs that worker's turn. The
// worker's thread drives unless an application thread is driving from
// ibv_poll_cq or ibv_post_* (Device::TryDrive); then it steps aside and naps
// or watches (Watch), so that on a busy-polling application the engine runs
// on the application's own thread with no hand-off between threads. Only one thread drives a
// worker at a time, so its state still has exactly one owner at any moment;
// the lock's acquire/release orders one driver's writes before the next
// driver's reads. A control call takes every drive lock (RunOnWorker); while
// it waits (ctl_pending_), drivers step aside.
void Device::Loop(Worker& w) {
  w.yield = YieldPolicy(contended_nap_ns_);
  unsigned idle = 0;
  uint64_t last_busy_ns = 0;
  Turn turn;
  // Whether application threads polled busily in the last interval.
  uint64_t interval_ns = 0, interval_polls = 0;
  bool apps_busy = false;
  WatchState ws;
  while (!stop_.load(std::memory_order_relaxed)) {
    if (ctl_pending_.load(std::memory_order_relaxed) != 0) {
      LeaveRealtime();  // a real-time yield would not let the control call's thread run
      sched_yield();
      w.cpu_ref_wall_ns = 0;  // not a yield lost (YieldCpu)
      continue;
    }
    const uint64_t now = NowNs();
    if (now - interval_ns >= kBusyIntervalNs) {
      const uint64_t polls = app_polls_.load(std::memory_order_relaxed);
      apps_busy = polls - interval_polls >= kBusyPolls;
      interval_ns = now;
      interval_polls = polls;
    }
    const uint64_t app_drove = std::max(last_app_drive_ns_.load(std::memory_order_relaxed),
                                        last_post_drive_ns_.load(std::memory_order_relaxed));
    if (apps_busy && now - app_drove < kAppDriveWindowNs) {
      // An application thread is busy polling: it drives; the worker watches
      // for the moment it stops without notice, or naps.
      if (watch_ns_.load(std::memory_order_relaxed) != 0) Watch(w, ws);
      else Nap(w, kAppNapNs);
      idle = 0;
      continue;
    }
    LeaveRealtime();
    if (w.drive_lock.exchange(true, std::memory_order_acquire)) {
      // A thread is in a turn right now: a busy poller will be back, one
      // that polls now and then is no reason to leave the engine for a
      // whole nap.
      Nap(w, apps_busy ? kAppNapNs : kShortNapNs);
      idle = 0;
      continue;
    }
    if (DriveLocked(w, &turn)) {
      idle = 0;
      last_busy_ns = turn.timer_ns;
    } else {
      IdleBackoff(w, ++idle, turn, &last_busy_ns);
    }
  }
}

bool Device::DriveLocked(Worker& w, Turn* turn) {
  // Another thread driving (an application's) takes the worker's lcore id
  // for the turn: DPDK's mempool keeps one cache per lcore id, unlocked, and
  // the drive lock makes this thread its only user meanwhile; a thread
  // without an id would take every mbuf from the pool's shared ring.
  const unsigned own_lcore = RTE_PER_LCORE(_lcore_id);
  const unsigned lcore = w.lcore_id.load(std::memory_order_relaxed);
  const bool borrow = lcore != own_lcore;
  if (borrow) RTE_PER_LCORE(_lcore_id) = lcore;
  const bool busy = PollOnceGuarded(w);
  if (borrow) RTE_PER_LCORE(_lcore_id) = own_lcore;
  if (turn != nullptr) {
    // What the thread needs to decide whether to sleep, read while the
    // worker's state is still its own.
    turn->timer_ns = w.last_timer_ns;
    turn->now_ns = w.last_poll_ns;
    turn->pending = w.sched.busy() || (w.index == 0 && CqEventHeld()) ||
                    (w.fault != nullptr && w.fault->holding());
    turn->pace_due_ns = w.sched.next_paced();
  }
  std::vector<std::function<void()>> exclusive;
  if (!w.exclusive.empty()) exclusive.swap(w.exclusive);
  w.drive_lock.store(false, std::memory_order_release);
  // RunOnWorker waits for drive locks by yielding, which at real-time
  // priority would never let a preempted holder on this CPU finish: the
  // watching worker drops it first (Loop takes it again at the next look).
  if (!exclusive.empty()) LeaveRealtime();
  for (auto& fn : exclusive) RunOnWorker(std::move(fn));
  return busy;
}

bool Device::TryDrive(bool polling) {
  if (!app_progress_) return false;
  // Before the turns: a post deferred after this is seen by them or sets it
  // again for the next poll.
  if (kick_deferred_.load(std::memory_order_relaxed)) kick_deferred_.store(false, std::memory_order_relaxed);
  bool busy = false;
  Turn turn;  // of the last worker driven here
  for (auto& w : workers_) {
    if (TryTakeDrive(*w)) busy |= DriveLocked(*w, &turn);
  }
  // Only a thread polling its CQ will come back for received packets; one
  // that just posted may spin on memory instead (ib_write_lat's receiver), so
  // posting does not send the workers to sleep.
  if (polling) {
    app_polls_.fetch_add(1, std::memory_order_relaxed);
    if (turn.timer_ns != 0) last_app_drive_ns_.store(turn.timer_ns, std::memory_order_relaxed);
  }
  // For a watching worker (Watch): the clock reading of the turn, no
  // reading of its own.
  if (turn.now_ns != 0) app_seen_ns_.store(turn.now_ns, std::memory_order_relaxed);
  return busy;
}

void Device::Kick(const QpHandle& qp) {
  Worker& w = *workers_[qp.worker];
  if (app_progress_) {
    // A thread that has just driven from ibv_poll_cq polls again within
    // microseconds (a bandwidth loop: post, post, ..., poll): that poll's
    // turn sends what was posted meanwhile, many WQEs per turn, instead of
    // one turn per post. Measured: 64 B SEND 0.8 -> 2.0 Mmsg/s over memif,
    // latency unchanged. If it does not poll again, the worker takes over
    // when the drive window ends, as for receives, or sends it at its next
    // look if it watches (Watch).
    const uint64_t now = NowNs();
    app_seen_ns_.store(now, std::memory_order_relaxed);  // for a watching worker (Watch)
    if (now - last_app_drive_ns_.load(std::memory_order_relaxed) < kKickDeferNs) {
      if (!kick_deferred_.load(std::memory_order_relaxed)) kick_deferred_.store(true, std::memory_order_relaxed);
      return;
    }
    if (TryTakeDrive(w)) {
      // The application drives, as from ibv_poll_cq, as far as the worker's
      // loop is concerned. Without this a thread whose polls always find
      // completions (ib_write_bw at MTU 4096, a completion per 64 KiB
      // message) drove only from here, unseen: the worker drove too and
      // napped 20 us whenever the application held the lock, ~20,000
      // wakeups a second taking a quarter of the application's CPU (12-20
      // Gb/s; 28-35 with this, docs/PERFORMANCE.md). Posting alone still
      // sends no worker to sleep: that takes busy polls (kBusyPolls), and a
      // watching worker looks after a thread that posts and then spins
      // (Watch). Not last_app_drive_ns_: the next posts would be deferred to
      // a poll that a thread that only posts never makes (mckey's sender
      // posts ten unsignaled UD SENDs and destroys its QP: two went out).
      Turn turn;
      DriveLocked(w, &turn);
      if (turn.timer_ns != 0) last_post_drive_ns_.store(turn.timer_ns, std::memory_order_relaxed);
      return;
    }
  }
  Wake(w);
}

void Device::CompletionsPolled() {
  if (!app_progress_) return;
  if (kick_deferred_.load(std::memory_order_relaxed)) {
    TryDrive();  // counts the poll
  } else {
    // Not a locked add on every poll of a fast receiver: an increment lost
    // to another polling thread only undercounts a count that needs 20.
    app_polls_.store(app_polls_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    // A thread that drove from its posts polls too: its next posts can wait
    // for its next poll (Kick), as after a turn run from a poll. (64 KiB
    // WRITE at MTU 4096: 30-32 Gb/s without this, 34-37 with it.)
    const uint64_t posted = last_post_drive_ns_.load(std::memory_order_relaxed);
    if (posted > last_app_drive_ns_.load(std::memory_order_relaxed)) {
      last_app_drive_ns_.store(posted, std::memory_order_relaxed);
    }
  }
}

bool Device::TryTakeDrive(Worker& w) {
  // Not while a control call waits for the locks; test before the RMW so
  // that a held lock's cache line is not stolen.
  return ctl_pending_.load(std::memory_order_relaxed) == 0 && !w.drive_lock.load(std::memory_order_relaxed) &&
         !w.drive_lock.exchange(true, std::memory_order_acquire);
}

void Device::Handoff() {
  if (!app_progress_) return;
  last_app_drive_ns_.store(0, std::memory_order_relaxed);
  last_post_drive_ns_.store(0, std::memory_order_relaxed);
  for (auto& w : workers_) WakeNow(*w);
}

void Device::WakeNow(Worker& w) { WakeWorkerNow(w.wake); }

void Device::NoteYield() {
  for (auto& w : workers_) w->wake->app_yields.fetch_add(1, std::memory_order_relaxed);
}

// Sleeps up to ns on w's futex unless has_work() says otherwise once the
// sleep is announced (`sleeping` then a seq_cst fence; pairs with Wake).
template <typename HasWork>
void Device::SleepUnless(Worker& w, long ns, HasWork has_work) {
  const uint32_t seq = w.wake->seq.load(std::memory_order_acquire);
  w.wake->sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!has_work()) {
    timespec ts{0, ns};
    // Shared (not FUTEX_PRIVATE): droced's clients wake it (WakeWorkerNow).
    syscall(SYS_futex, &w.wake->seq, FUTEX_WAIT, seq, &ts, nullptr, 0);
  }
  w.wake->sleeping.store(0, std::memory_order_relaxed);
  w.cpu_ref_wall_ns = 0;  // off the CPU on purpose: not a yield lost (YieldCpu)
}

void Device::Nap(Worker& w, long ns) {
  SleepUnless(w, ns, [this] { return ctl_pending_.load(std::memory_order_relaxed) != 0; });
}
void Device::IdleBackoff(Worker& w, unsigned idle, const Turn& turn, uint64_t* last_busy_ns) {
  // Spinning while another thread waits for this CPU (YieldCpu) is time
  // taken from it.
  if (idle < kSpinLoops && !w.yield.active()) {
    rte_pause();
    return;
  }
  if (turn.pace_due_ns != 0) [[unlikely]] {
    // A paced QP sends at pace_due_ns: spin for the last stretch (a sleep
    // or a yield could overshoot it by far more than the spacing), sleep
    // until then if nothing else is pending.
    const uint64_t now = NowNs();
    if (turn.pace_due_ns <= now + kPaceSpinNs) {
      rte_pause();
      return;
    }
    if (!turn.pending) {
      const long ns = static_cast<long>(std::min<uint64_t>(turn.pace_due_ns - now - kPaceSpinNs, kSleepNs));
      PaceSleep(w, ns);
      return;
    }
  }
  if (turn.timer_ns - *last_busy_ns < kYieldWindowNs || turn.pending) {
    YieldCpu(w, turn.timer_ns - *last_busy_ns < kWatchHotNs);
    return;
  }
  // (A worker napping for a spinner goes on napping after these sleeps:
  // the ping-pong it serves stalls while its yields are lost, so its link
  // looks idle, and stopping the naps here ended them within 30-70 us of
  // their start, every 4 ms, in a daemon-mode ib_write_lat.)
  SleepUnless(w, kSleepNs, [this, &w] { return WakeReason(w); });
  *last_busy_ns = NowNs() - kYieldWindowNs / 2;  // after a sleep, yield a while before sleeping again
}

// Whether a sleeping worker has a reason to wake at once: a control call,
// doorbells, frames from another worker, QPs to activate.
bool Device::WakeReason(const Worker& w) const {
  return ctl_pending_.load(std::memory_order_relaxed) != 0 || w.doorbells.MaybeNonEmpty() || w.SourcesNonEmpty() ||
         w.activate_all.load(std::memory_order_relaxed) || (w.inbox != nullptr && !rte_ring_empty(w.inbox));
}

// sched_yield, or a nap while yields give the CPU away (engine/yield_policy.h).
void Device::YieldCpu(Worker& w, bool hot) {
  const uint64_t now = NowNs();
  if (w.yield.Napping(now)) {
    SleepUnless(w, static_cast<long>(w.yield.NextNap(hot)), [this, &w] { return WakeReason(w); });
    return;
  }
  // Whether the thread was off its CPU during the yield: its CPU time and
  // the clock, read together at most once a millisecond (reading CPU time
  // is a system call, 1.3-1.5 us here, as long as the yield; reading it
  // around every yield made daemon-mode ib_send_lat 15 % slower) and after
  // every sleep (SleepUnless clears it), against the same after the yield.
  if (now - w.cpu_ref_wall_ns > kCpuRefNs) {
    w.cpu_ref_ns = ThreadCpuNs();
    w.cpu_ref_wall_ns = NowNs();
  }
  const uint32_t app_yields = w.wake->app_yields.load(std::memory_order_relaxed);
  sched_yield();
  const uint64_t after = NowNs();
  if (after - now <= YieldPolicy::kLostNs && !w.yield.active()) return;
  const int64_t off_cpu = static_cast<int64_t>((after - w.cpu_ref_wall_ns) - (ThreadCpuNs() - w.cpu_ref_ns));
  switch (w.yield.AfterYield(after, after - now, static_cast<uint64_t>(std::max<int64_t>(off_cpu, 0)),
                             w.wake->app_yields.load(std::memory_order_relaxed) != app_yields, hot)) {
    case YieldPolicy::Change::kStart: prctl(PR_SET_TIMERSLACK, 1UL); break;
    case YieldPolicy::Change::kStop: RelaxTimerSlack(w); break;
    case YieldPolicy::Change::kNone: break;
  }
}

// A sleep that must end on time: timer slack 1 ns for it (the default 50 µs
// would overshoot the spacing of a paced flow), woken early by work.
void Device::PaceSleep(Worker& w, long ns) {
  prctl(PR_SET_TIMERSLACK, 1UL);
  SleepUnless(w, ns, [this, &w] { return WakeReason(w); });
  RelaxTimerSlack(w);
}


void WakeWorker(WakeWords* w) {
  // Pairs with the sleeper's store of `sleeping` then re-check (worker.cc).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (w->sleeping.load(std::memory_order_relaxed) != 0) WakeWorkerNow(w);
}

void WakeWorkerNow(WakeWords* w) {
  w->seq.fetch_add(1, std::memory_order_release);
  // Not FUTEX_PRIVATE: droced's clients wake its workers through the same
  // words, mapped in their own address space.
  syscall(SYS_futex, &w->seq, FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

void Device::Wake(Worker& w) { WakeWorker(w.wake); }

void Device::WakeAll() {
  for (auto& w : workers_) Wake(*w);
}

namespace {

// The device whose workers the calling thread has stopped (RunOnWorker).
thread_local const Device* t_stopped = nullptr;

}  // namespace

void Device::AssertStopped(const char* what) const {
  if (t_stopped == this) return;
  Log(LogLevel::kError, "%s: %s runs without the workers stopped (RunOnWorker)", port_.name.c_str(), what);
  std::abort();
}

void Device::RunOnWorker(std::function<void()> fn) {
  if (t_stopped == this) {
    // ctl_mu_ is held by this very thread: locking it again would hang.
    Log(LogLevel::kError, "%s: RunOnWorker inside RunOnWorker", port_.name.c_str());
    std::abort();
  }
  std::lock_guard<std::mutex> l(ctl_mu_);
  // Drivers step aside while ctl_pending_ is set; a turn in progress ends
  // within microseconds (the holder may be preempted: yield, do not spin).
  ctl_pending_.fetch_add(1, std::memory_order_relaxed);
  for (auto& w : workers_) {
    for (unsigned spins = 0; w->drive_lock.load(std::memory_order_relaxed) ||
                             w->drive_lock.exchange(true, std::memory_order_acquire);
         ++spins) {
      if (spins < 64) rte_pause();
      else sched_yield();
    }
  }
  // An exception must not unwind through the engine into the application:
  // the device dies instead (the calls below check dead() after this
  // returns).
  t_stopped = this;
  try {
    fn();
  } catch (const std::exception& ex) {
    EnterFatal(ex.what());
  } catch (...) {
    EnterFatal("unknown exception");
  }
  t_stopped = nullptr;
  for (auto& w : workers_) w->drive_lock.store(false, std::memory_order_release);
  ctl_pending_.fetch_sub(1, std::memory_order_relaxed);
  // The call may have left work (a QP made ready to send, frames queued).
  WakeAll();
}

void Device::Doorbell(const QpHandle& qp, bool wake) {
  // Only the first doorbell since the worker last looked enqueues the QPN;
  // see HandleDoorbells for the other half.
  Worker& w = *workers_[qp.worker];
  if (qp.shared->doorbell_pending.exchange(1, std::memory_order_acq_rel) == 0) {
    w.doorbells.Push(qp.qpn);
  }
  if (wake) Wake(w);
}

void Device::DriveEachOnce() {
  for (auto& w : workers_) {
    // A turn in progress ends within microseconds; a preempted holder
    // gets the CPU back by yielding. Bounded: never block a control call.
    for (unsigned tries = 0; tries < 1000; ++tries) {
      if (TryTakeDrive(*w)) {
        DriveLocked(*w);
        break;
      }
      sched_yield();
    }
  }
}

}  // namespace droce::engine
