// The per-worker poll loop: doorbells → rx burst → frames handed over by
// other workers → classify → transport → send work → timers → one tx flush.
// Backs off when idle so that two droce processes share a 2-core machine.
#include <linux/futex.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
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

constexpr uint16_t kRxBurst = 32;
constexpr size_t kTxBurst = 64;
// Frames queued for a link that is not taking them before the transport is
// told to wait (AllocFrame fails).
constexpr size_t kTxHighWater = 512;
constexpr unsigned kSendBudget = 32;
constexpr uint64_t kTimerTickNs = 50'000;
// A receive burst that came back full means frames are still waiting, and
// after a stall (the worker or its process descheduled for milliseconds)
// they hold the ACKs that the timers would otherwise take for lost: the
// timers wait for the ring to drain, up to this much longer than a tick.
// (Measured with bench/qp_sweep under a compile: every one of 100 QPs timed
// out and went back N at once after a 7 ms stall, none of its ACKs lost.)
constexpr uint64_t kTimerBacklogGraceNs = 1'000'000;
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
    turn->pending = w.armed != 0 || !w.active.empty() || (w.index == 0 && CqEventHeld()) ||
                    (w.fault != nullptr && w.fault->holding());
    turn->pace_due_ns = w.paced.empty() ? 0 : w.paced.top().ns;
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

bool Device::PollOnce(Worker& w) {
  bool busy = false;
  // The turn's completions become visible when it ends, after FlushTx has
  // given the link the ACKs they owe (cq.h, CqTurnHold).
  cq::CqTurnHold hold;
  if (w.activate_all.load(std::memory_order_relaxed) && w.activate_all.exchange(false, std::memory_order_acquire)) {
    ActivateOwnQps(w);
  }
  if (w.doorbells.MaybeNonEmpty() || SourcesNonEmpty(w)) {
    HandleDoorbells(w);
    busy = true;
  }
  rte_mbuf* rx[kRxBurst];
  // A memif client not connected yet has no started port to poll.
  uint16_t n = dead() || !dpdk_.started() ? 0 : rte_eth_rx_burst(dpdk_.port_id(), w.index, rx, kRxBurst);
  busy |= n > 0;
  const bool rx_backlog = n == kRxBurst;
  // The lab's fault stage and capture, receive side (fault_stage.h,
  // capture_tap.h): one branch each when off.
  CaptureTap* const tap = w.capture.get();
  if (w.fault != nullptr) [[unlikely]] n = w.fault->OnRx(rx, n, NowNs(), tap);
  if (tap != nullptr) [[unlikely]] tap->Frames(lab::Capture::kRxEngine, rx, n);
  for (uint16_t i = 0; i < n; ++i) {
    if (i + 1 < n) rte_prefetch0(rte_pktmbuf_mtod(rx[i + 1], void*));
    HandleFrame(w, rx[i], /*handed=*/false);
  }
  if (w.fault != nullptr) [[unlikely]] {
    w.fault->ReleaseRx(NowNs(), [this, &w, tap](rte_mbuf* m) {
      if (tap != nullptr) [[unlikely]] tap->Add(lab::Capture::kRxEngine, m);
      HandleFrame(w, m, /*handed=*/false);
    });
    if (tap != nullptr) [[unlikely]] tap->Commit(lab::Capture::kRxEngine);
  }
  if (w.handoff_pending != 0) FlushHandoffs(w);
  if (w.inbox != nullptr) {
    n = static_cast<uint16_t>(rte_ring_sc_dequeue_burst(w.inbox, reinterpret_cast<void**>(rx), kRxBurst, nullptr));
    for (uint16_t i = 0; i < n; ++i) HandleFrame(w, rx[i], /*handed=*/true);
    busy |= n > 0;
  }
  // Paced QPs whose time has come send again (one comparison when none).
  if (!w.paced.empty()) [[unlikely]] {
    const uint64_t t = NowNs();
    while (!w.paced.empty() && w.paced.top().ns <= t) {
      const Worker::Paced p = w.paced.top();
      w.paced.pop();
      auto it = objects_.qps.find(p.qpn);
      if (it == objects_.qps.end() || it->second->worker != &w || it->second->paced_at != p.ns) continue;
      it->second->paced_at = 0;
      Activate(it->second.get());
    }
  }
  // Requesters with work. A QP leaves the list when it has nothing sendable.
  for (size_t i = 0; i < w.active.size();) {
    QpEntry* e = w.active[i];
    const bool more = e->qp->PollSend(kSendBudget);
    DeliverEvents(e);
    if (const uint64_t until = e->qp->paced_until(); until != 0 && e->paced_at != until) [[unlikely]] {
      e->paced_at = until;
      w.paced.push({until, e->qp->qpn()});
    }
    ArmTimer(e);
    if (more) {
      busy = true;
      ++i;
    } else {
      e->active = false;
      w.active[i] = w.active.back();
      w.active.pop_back();
    }
  }
  if (w.index == 0 && gsi_pending_.load(std::memory_order_relaxed)) busy |= DrainGsi(w);
  if (!w.mcast_loop.empty()) {
    LoopBackMulticast(w);
    busy = true;
  }
  if (!w.self_loop.empty()) {
    LoopBackSelf(w);
    busy = true;
  }
  const uint64_t now = w.turn_ns;  // the turn's one clock reading
  w.last_poll_ns = now;
  if (now - w.last_timer_ns >= kTimerTickNs) {
    // The tick also dates the turn for Kick and the watch (Turn::timer_ns),
    // so it moves on even while the timers wait.
    w.last_timer_ns = now;
    if (!rx_backlog || now - w.timers_ran_ns >= kTimerTickNs + kTimerBacklogGraceNs) {
      w.timers_ran_ns = now;
      RunTimers(w, now);
    }
  }
  if (!w.tx.empty() || (w.fault != nullptr && w.fault->holding())) {
    busy |= !w.tx.empty();  // frames only held are no work yet (Turn::pending keeps the loop awake)
    FlushTx(w);
  }
  // The workers handed frames this turn look at their inbox now (frames
  // handed after the receive step, e.g. by LoopBackSelf, go in first).
  if (w.handoff_pending != 0) FlushHandoffs(w);
  for (uint32_t t = w.handoff_targets; t != 0; t &= t - 1) Wake(*workers_[__builtin_ctz(t)]);
  w.handoff_targets = 0;
  // A capture that reached its bounds costs nothing more, nor a fault stage
  // whose rules were cleared (droce ctl fault clear) once it holds nothing.
  if (tap != nullptr && !tap->live()) [[unlikely]] w.capture.reset();
  if (w.fault != nullptr && w.fault->engine().rules() == 0 && !w.fault->holding()) [[unlikely]] w.fault.reset();
  return busy;
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
  return ctl_pending_.load(std::memory_order_relaxed) != 0 || w.doorbells.MaybeNonEmpty() || SourcesNonEmpty(w) ||
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

void Device::Activate(QpEntry* e) {
  if (!e->active) {
    e->active = true;
    e->worker->active.push_back(e);
  }
}

void Device::HandleDoorbells(Worker& w) {
  auto ring = [this](QpEntry* e) {
    // Clear the flag with an RMW so that it reads the provider's exchange and
    // its ring writes become visible (acquire); a doorbell rung after this
    // point enqueues the QP again.
    e->shared->doorbell_pending.exchange(0, std::memory_order_acq_rel);
    e->qp->OnRecvDoorbell();
    DeliverEvents(e);
    Activate(e);
  };
  uint32_t qpn;
  while (w.doorbells.Pop(&qpn)) {
    // A QPN rung before its QP was destroyed may name a new QP of another
    // worker by now; that one's doorbells go to its own worker.
    auto it = objects_.qps.find(qpn);
    if (it != objects_.qps.end() && it->second->worker == &w) ring(it->second.get());
  }
  if (w.doorbells.TakeOverflow()) {
    for (auto& [n, e] : objects_.qps) {
      if (e->worker == &w) ring(e.get());
    }
  }
  // droced: each client's queue rings only that client's QPs; a QPN that is
  // not one of them (a stale one, or a client naming another's QP) is
  // ignored and counted.
  for (DoorbellSource* src : w.sources) {
    queue::DoorbellQueue& q = *src->queues[w.index];
    while (q.Pop(&qpn)) {
      auto it = objects_.qps.find(qpn);
      if (it != objects_.qps.end() && it->second->worker == &w && it->second->owner == src->owner) {
        ring(it->second.get());
      } else {
        Bump(w.stats.foreign_doorbells);
      }
    }
    if (q.TakeOverflow()) {
      for (auto& [n, e] : objects_.qps) {
        if (e->worker == &w && e->owner == src->owner) ring(e.get());
      }
    }
  }
}

bool Device::SourcesNonEmpty(const Worker& w) const {
  for (const DoorbellSource* src : w.sources) {
    if (src->queues[w.index]->MaybeNonEmpty()) return true;
  }
  return false;
}

void Device::ArmTimer(QpEntry* e) {
  Worker& w = *e->worker;
  if (!e->qp->HasOutstanding()) {
    if (e->timer_at != 0) {  // everything acknowledged: its entry goes stale
      e->timer_at = 0;
      --w.armed;
    }
    return;
  }
  if (e->timer_at != 0 && !e->qp->timer_may_move_earlier()) return;
  const uint64_t due = std::max<uint64_t>(e->qp->TimerDue(), 1);
  if (due == transport::Qp::kNoTimer || (e->timer_at != 0 && e->timer_at <= due)) return;
  if (e->timer_at == 0) ++w.armed;
  e->timer_at = due;
  w.timers.push({due, e->qp->qpn()});
  // Stale entries (QPs that finished or went) wait for their time; keep
  // them from piling up when QPs come and go faster than their timeouts.
  if (w.timers.size() > 2 * size_t{w.armed} + 1024) [[unlikely]] CompactTimers(w);
}

void Device::CompactTimers(Worker& w) {
  std::vector<Worker::Timer> live;
  live.reserve(w.armed);
  for (; !w.timers.empty(); w.timers.pop()) {
    const Worker::Timer& t = w.timers.top();
    auto it = objects_.qps.find(t.qpn);
    if (it != objects_.qps.end() && it->second->worker == &w && it->second->timer_at == t.ns) live.push_back(t);
  }
  for (const Worker::Timer& t : live) w.timers.push(t);
}

// Runs the transport timers that are due (at most once a tick for each QP).
void Device::RunTimers(Worker& w, uint64_t now) {
  while (!w.timers.empty() && w.timers.top().ns <= now) {
    const Worker::Timer t = w.timers.top();
    w.timers.pop();
    auto it = objects_.qps.find(t.qpn);
    if (it == objects_.qps.end() || it->second->worker != &w || it->second->timer_at != t.ns) continue;
    QpEntry* e = it->second.get();
    e->timer_at = 0;
    --w.armed;
    if (e->qp->TimerDue() <= now) {
      e->qp->OnTimer(now);
      DeliverEvents(e);
      Activate(e);  // a timeout or RNR expiry may have made packets sendable
    }
    uint64_t due = e->qp->TimerDue();
    if (due == transport::Qp::kNoTimer) continue;
    due = std::max(due, now + kTimerTickNs);  // a state that ignores its timer: look again next tick
    e->timer_at = due;
    ++w.armed;
    w.timers.push({due, t.qpn});
  }
  if (w.index != 0) return;
  // Device-wide timers run on worker 0.
  for (cq::CqProducer* p : objects_.ticked_cqs) p->Tick(now);
  PollLinkState(w);
}

bool Device::CqEventHeld() const {
  for (const cq::CqProducer* p : objects_.ticked_cqs) {
    if (p->holding()) return true;
  }
  return false;
}

void Device::HandleFrame(Worker& w, rte_mbuf* m, bool handed) {
  // Multi-segment frames (jumbo frames on memif) are linearised here; the
  // parser reads one contiguous buffer.
  alignas(64) static thread_local uint8_t scratch[9216 + 64];
  const uint32_t len = rte_pktmbuf_pkt_len(m);
  const uint8_t* f;
  if (m->nb_segs == 1) {
    f = rte_pktmbuf_mtod(m, const uint8_t*);
  } else if (len <= sizeof(scratch)) {
    f = static_cast<const uint8_t*>(rte_pktmbuf_read(m, 0, len, scratch));
  } else {
    Bump(w.stats.malformed_pkts);
    rte_pktmbuf_free(m);
    return;
  }
  if (len >= wire::kEthLen && !handed) {
    // A unicast frame to another station's MAC is not ours, as a NIC's
    // address filter (and the kernel, for PACKET_OTHERHOST) drops it: over
    // af_packet the socket also sees what other programs on the host send
    // through the interface, which must not count as bad RoCE here.
    if (!(f[0] & 1) && std::memcmp(f, port_.mac.data(), 6) != 0) {
      Bump(w.stats.other_host_drop);
      rte_pktmbuf_free(m);
      return;
    }
    // links & addressing: frames of another VLAN are not ours; ARP; ICMP and
    // ND below, where the RoCE parser turns them away as not UDP.
    if (!VlanAccepts(m, f, len)) {
      Bump(w.stats.non_roce_drop);
      rte_pktmbuf_free(m);
      return;
    }
    uint16_t type = wire::load_be16(f + 12);
    if (type == wire::kEtherTypeVlan && len >= wire::kEthLen + wire::kVlanLen) type = wire::load_be16(f + 16);
    if (type == wire::kEtherTypeArp) {
      HandleArp(w, f, len);
      rte_pktmbuf_free(m);
      return;
    }
  }
  wire::PacketView v;
  const wire::ParseError err = wire::parse_frame({f, len}, &v);
  if (err != wire::ParseError::kOk) {
    if (err == wire::ParseError::kNotUdp && HandleLocal(w, f, len)) {
      rte_pktmbuf_free(m);
      return;
    }
    // UDP to another host's address (a broadcast or multicast MAC, or
    // promiscuous neighbours) is not ours, whatever else is wrong with it.
    if (v.l4_offset != 0 && !wire::gid_is_multicast(v.dip6.data()) && !ForPort(v)) Bump(w.stats.other_host_drop);
    else if (err == wire::ParseError::kBadIcrc) Bump(w.stats.icrc_err);
    else if (err == wire::ParseError::kNotIpv4 || err == wire::ParseError::kNotUdp ||
             err == wire::ParseError::kNotRoce || err == wire::ParseError::kIpOptions ||
             err == wire::ParseError::kIpFragment) Bump(w.stats.non_roce_drop);
    else Bump(w.stats.malformed_pkts);
    rte_pktmbuf_free(m);
    return;
  }
  // dip6 is the IPv4-mapped address for IPv4 packets.
  if (wire::gid_is_multicast(v.dip6.data())) {
    HandleMulticast(w, v, m, handed);
    rte_pktmbuf_free(m);
    return;
  }
  if (!ForPort(v)) {
    Bump(w.stats.other_host_drop);
    rte_pktmbuf_free(m);
    return;
  }
  if (v.bth.dqpn == 1) {  // QP1: the connection manager's (gsi.cc)
    HandleGsi(w, v);
    rte_pktmbuf_free(m);
    return;
  }
  auto it = objects_.qps.find(v.bth.dqpn);
  // A handed frame whose QP changed owners meanwhile (destroyed, its QPN
  // reused) is not passed on again.
  if (it == objects_.qps.end() || (handed && it->second->worker != &w)) {
    Bump(w.stats.unknown_qp);
    rte_pktmbuf_free(m);
    return;
  }
  if (!handed) LearnSender(w, v);
  QpEntry* e = it->second.get();
  if (e->worker != &w) {
    HandOff(w, *e->worker, m);
    return;
  }
  DeliverPacket(e, v);
  rte_pktmbuf_free(m);
}

void Device::HandOff(Worker& from, Worker& to, rte_mbuf* m) {
  Worker::Outbox& o = from.outbox[to.index];
  o.m[o.n++] = m;
  from.handoff_pending |= 1u << to.index;
  if (o.n == Worker::Outbox::kSize) [[unlikely]] FlushHandoff(from, to);
}

void Device::FlushHandoffs(Worker& from) {
  for (uint32_t t = from.handoff_pending; t != 0; t &= t - 1) FlushHandoff(from, *workers_[__builtin_ctz(t)]);
}

void Device::FlushHandoff(Worker& from, Worker& to) {
  Worker::Outbox& o = from.outbox[to.index];
  const unsigned put = rte_ring_mp_enqueue_burst(to.inbox, reinterpret_cast<void**>(o.m), o.n, nullptr);
  // What a full inbox did not take is a loss on the wire as far as the
  // peers can tell: RC retransmits, UC and UD drop the message.
  if (put != o.n) [[unlikely]] {
    Bump(from.stats.handoff_drop, o.n - put);
    rte_pktmbuf_free_bulk(o.m + put, o.n - put);
  }
  Bump(from.stats.handoff_pkts, put);
  o.n = 0;
  from.handoff_pending &= ~(1u << to.index);
  if (put != 0) from.handoff_targets |= 1u << to.index;
}

// Multicast (UD only): the group is the destination address, and each
// attached QP gets the packet as if it had been addressed to it alone, with
// its own state, Q_Key and receive-queue checks (as rxe_rcv_mcast_pkt).
// Members owned by other workers get a copy of the frame each worker.
void Device::HandleMulticast(Worker& w, const wire::PacketView& v, rte_mbuf* m, bool handed) {
  const std::vector<uint32_t>* members = nullptr;
  switch (objects_.mcast.Route(v, &members)) {
    case McastGroups::Verdict::kNotMulticastUd: Bump(w.stats.mcast_bad_drop); return;
    case McastGroups::Verdict::kNoGroup: Bump(w.stats.mcast_no_group_drop); return;
    case McastGroups::Verdict::kDeliver: break;
  }
  if (!handed) {
    Bump(w.stats.mcast_rcvd_pkts);
    if (v.smac != port_.mac) LearnSender(w, v);  // not from our own sends
  }
  // Delivering raises no control call, so the member list cannot change
  // while it is walked.
  uint32_t others = 0;
  for (uint32_t qpn : *members) {
    auto it = objects_.qps.find(qpn);
    if (it == objects_.qps.end()) continue;
    if (it->second->worker == &w) DeliverPacket(it->second.get(), v);
    else others |= 1u << it->second->worker->index;
  }
  if (handed) return;
  for (; others != 0; others &= others - 1) {
    if (rte_mbuf* c = rte_pktmbuf_copy(m, dpdk_.pool(), 0, UINT32_MAX); c != nullptr) {
      HandOff(w, *workers_[__builtin_ctz(others)], c);
    } else {
      Bump(w.stats.handoff_drop);
    }
  }
}

// RNICs deliver a multicast they send to their own QPs attached to the
// group as well (mlx5's multicast loopback); the internal loopback link
// returns every frame anyway, other links do not. The copies are delivered
// after the loop turn's sends, never from inside the sending QP; a group
// with no member here is no drop to count.
void Device::LoopBackMulticast(Worker& w) {
  for (rte_mbuf* m : w.mcast_loop) {
    wire::PacketView v;
    const std::vector<uint32_t>* members = nullptr;
    if (m->nb_segs == 1 &&
        wire::parse_frame({rte_pktmbuf_mtod(m, const uint8_t*), rte_pktmbuf_data_len(m)}, &v) ==
            wire::ParseError::kOk &&
        wire::gid_is_multicast(v.dip6.data()) && objects_.mcast.Route(v, &members) == McastGroups::Verdict::kDeliver) {
      HandleMulticast(w, v, m, /*handed=*/false);
    }
    rte_pktmbuf_free(m);
  }
  w.mcast_loop.clear();
}

// Whether an untagged frame goes to the port's own MAC and IPv4 or IPv6
// address.
bool Device::IsOwnAddress(const uint8_t* f, uint32_t len) const {
  if (len < wire::kEthLen + wire::kIpv6Len || std::memcmp(f, port_.mac.data(), 6) != 0) return false;
  const uint16_t type = wire::load_be16(f + 12);
  if (type == wire::kEtherTypeIpv4) return wire::load_be32(f + wire::kEthLen + 16) == port_.ip;
  return type == wire::kEtherTypeIpv6 && has_ip6_ && std::memcmp(f + wire::kEthLen + 24, ip6_.data(), 16) == 0;
}

// An RNIC (and rxe) delivers a packet for its own address internally; on
// a link that does not return our frames it would otherwise leave on the
// wire and be lost (Open MPI's rank-to-self endpoint, UCX's self-connected
// QPs). The frames go through the receive path as sent, after the turn's
// sends, never from inside the sending QP; what they make (ACKs to
// ourselves) is delivered the next turn.
void Device::LoopBackSelf(Worker& w) {
  std::swap(w.self_loop, w.self_scratch);
  for (rte_mbuf* m : w.self_scratch) HandleFrame(w, m, /*handed=*/false);
  w.self_scratch.clear();
}

void Device::LearnSender(Worker& w, const wire::PacketView& v) {
  // Learn the peer's MAC from its traffic: replies need no ARP or ND round
  // trip (off the IPv4 subnet, the gateway's MAC is what ARP resolves
  // instead; IPv6 destinations are all on the link).
  if (v.ipv6) LearnNeighbor6(w, v.sip6, v.smac, /*create=*/true);
  else if (NextHop(v.sip) == v.sip) LearnNeighbor(w, v.sip, v.smac, /*create=*/true);
}

void Device::DeliverPacket(QpEntry* e, const wire::PacketView& v) {
  e->qp->OnPacket(v);
  DeliverEvents(e);
  // An ACK may have opened the window; a request may have left READ
  // responses or ACKs to send.
  if ((v.info->mask & wire::kMaskResponse) || e->qp->HasResponses()) Activate(e);
  ArmTimer(e);
}

uint64_t Worker::NowNs() { return Device::NowNs(); }
uint64_t Worker::TurnNs() { return turn_ns != 0 ? turn_ns : Device::NowNs(); }

bool Worker::AllocFrame(uint32_t len, transport::TxFrame* f) {
  // Back-pressure: while the link refuses frames, stop producing new ones;
  // the transport tries again on a later loop turn instead of losing them.
  if (len > dev->dpdk_.data_room() || tx.size() >= kTxHighWater || dev->dead()) return false;
  rte_mbuf* m = rte_pktmbuf_alloc(dev->dpdk_.pool());
  if (m == nullptr) return false;
  f->data = reinterpret_cast<uint8_t*>(rte_pktmbuf_append(m, static_cast<uint16_t>(len)));
  if (f->data == nullptr) {
    rte_pktmbuf_free(m);
    return false;
  }
  f->capacity = len;
  f->handle = m;
  return true;
}

void Worker::SendFrame(const transport::TxFrame& f, uint32_t len) {
  auto* m = static_cast<rte_mbuf*>(f.handle);
  if (len == 0) {
    rte_pktmbuf_free(m);
    return;
  }
  rte_pktmbuf_trim(m, static_cast<uint16_t>(f.capacity - len));
  // IPv4 (01:00:5e) or IPv6 (33:33) multicast with groups attached here:
  // keep a copy, untagged, for LoopBackMulticast.
  const bool group_mac = (f.data[0] == 0x01 && f.data[1] == 0x00 && f.data[2] == 0x5E) ||
                         (f.data[0] == 0x33 && f.data[1] == 0x33);
  if (group_mac && !dev->link_loops_back_ && dev->objects_.mcast.groups() != 0) {
    if (rte_mbuf* c = rte_pktmbuf_copy(m, dev->dpdk_.pool(), 0, UINT32_MAX); c != nullptr) mcast_loop.push_back(c);
  }
  // Read before tagging (the tag moves the Ethernet header). The MAC alone
  // is not enough: on a tap link the kernel's side has the port's MAC, and
  // what droce sends to the kernel's address must leave.
  const bool to_self = !dev->link_loops_back_ && dev->IsOwnAddress(f.data, len);
  dev->TagFrame(m, f.pcp);  // links & addressing: the port's 802.1Q tag, if any (vlan.cc)
  if (to_self) {
    Bump(stats.self_loop_pkts);
    self_loop.push_back(m);
    return;
  }
  tx.push_back(m);
  if (tx.size() >= kTxBurst) dev->FlushTx(*this);
}

bool Worker::ResolveMac(const wire::Ipv6Addr& dgid, wire::MacAddr* mac) { return dev->ResolveMac(*this, dgid, mac); }
mem::MrTable& Worker::Mrs() { return dev->objects_.mrs; }
bool Worker::InvalidateRkey(uint32_t rkey, uint32_t pd) { return dev->InvalidateRkey(rkey, pd); }
const transport::AddressHandle* Worker::FindAh(uint32_t id) { return dev->FindAh(id); }
bool Worker::FindXrcSrq(uint32_t srqn, transport::XrcSrqRef* out) { return dev->FindXrcSrq(srqn, out); }

void Device::SendBeforeDestroy(QpEntry* e) {
  // Posts whose doorbell no turn has seen yet (rung just before, or left
  // by Kick for the thread's next poll) go out before the QP goes: a
  // program that posts and then destroys its QP without polling
  // (unsignaled UD SENDs; mckey's sender) would otherwise lose them. With
  // every drive lock held (RunOnWorker), as a turn would. Only from RTS: a
  // QP in another state would complete them in error, and a destroyed QP's
  // WQEs get no completions.
  Worker& w = *e->worker;
  if (e->qp->state() != transport::QpState::kRts) {
    // What the QP queued before it left RTS (the ACKs a modify to ERR
    // sent, transport/responder_rd.cc) leaves now, not with a later turn
    // that a process about to exit may never run.
    if (!w.tx.empty()) FlushTx(w);
    return;
  }
  HandleDoorbells(w);
  for (int i = 0; i < 64 && e->qp->PollSend(kSendBudget); ++i) {
  }
  DeliverEvents(e);
  if (!w.tx.empty()) FlushTx(w);
}

void Device::FlushTx(Worker& w) {
  if (!dpdk_.started()) return;  // held until the link is (memif client: Reconnect)
  // The lab's fault stage, transmit side (fault_stage.h): the frames queued
  // since the last flush, then the held ones now due. The capture records
  // them as the engine sent them and as they go to the link (not after
  // tx_burst: the link may own the mbufs by then).
  const size_t from = w.tx_judged;
  CaptureTap* const tap = w.capture.get();
  if (w.fault != nullptr) [[unlikely]] {
    w.fault->OnTx(&w.tx, from, NowNs(), tap);
    if (tap != nullptr) [[unlikely]] tap->Frames(lab::Capture::kTxWire, w.tx.data() + from, w.tx.size() - from);
  } else if (tap != nullptr) [[unlikely]] {
    tap->Frames(lab::Capture::kTxEngine, w.tx.data() + from, w.tx.size() - from);
  }
  const uint16_t n = static_cast<uint16_t>(std::min<size_t>(w.tx.size(), UINT16_MAX));
  uint16_t done = 0;
  for (int tries = 0; done < n && tries < 4; ++tries) {
    done += rte_eth_tx_burst(dpdk_.port_id(), w.index, w.tx.data() + done, n - done);
  }
  // What the link did not take stays queued, in order, for the next turn.
  const bool blocked = done < n;
  if (blocked && !w.tx_link_blocked) [[unlikely]] Bump(w.stats.tx_link_full);
  w.tx_link_blocked = blocked;
  w.tx.erase(w.tx.begin(), w.tx.begin() + done);
  w.tx_judged = w.tx.size();
}

}  // namespace droce::engine
