// One droce device: a link (DPDK port), one port with its addresses, and its
// poll-mode workers (DROCE_WORKERS, 1 by default). Worker i receives on rx
// queue i and sends on tx queue i of the link; each QP is owned by one worker
// (the one with the fewest QPs when it is created), which alone runs its
// transport; a RoCE packet that arrives on another worker's queue is handed to
// the owner through the owner's inbox ring.
//
// Progress: whoever holds a worker's drive lock runs that worker's loop turn:
// its thread, or an application thread driving from ibv_poll_cq/ibv_post_*.
// The control path (PD/MR/CQ/QP create, modify, destroy) takes every
// worker's drive lock (RunOnWorker), so the device's tables change only while
// no turn runs, need no locks on the fast path, and once DeregMr/DestroyQp
// returns no worker can touch that memory. What QPs of different workers
// share while they run — CQ producers, SRQs, memory-window state, neighbour
// caches — has its own lock, enabled only with several workers. The datapath
// needs no control call: the provider writes WQEs into shared rings and rings
// the owner's doorbell.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <queue>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/counters.h"
#include "common/spin_lock.h"
#include "cq/cq.h"
#include "engine/config.h"
#include "engine/capture_tap.h"
#include "engine/fault_stage.h"
#include "lab/trace.h"
#include "engine/mcast.h"
#include "engine/neighbor.h"
#include "engine/objects.h"
#include "io/dpdk_port.h"
#include "mem/mr_table.h"
#include "queue/doorbell.h"
#include "queue/shm.h"
#include "transport/env.h"
#include "transport/qp.h"
#include "engine/session.h"
#include "engine/stall_meter.h"
#include "engine/yield_policy.h"

struct rte_mbuf;
struct rte_ring;

namespace droce::engine {

class Device;
struct Worker;

// droce's commands on DPDK's telemetry socket (telemetry.cc).
void RegisterTelemetry();

// droced: one client's doorbell queues (one per worker, in memory the client
// writes). A QPN popped from them is rung only if the QP has the same owner.
struct DoorbellSource {
  uint64_t owner = 0;
  std::vector<std::unique_ptr<queue::DoorbellQueue>> queues;  // [worker]
};

// A MAD received on QP1: where it came from and its 256 bytes.
struct GsiMad {
  wire::Ipv6Addr sgid{}, dgid{};
  uint32_t src_qpn = 0;
  uint8_t tclass = 0, hop_limit = 0;
  uint8_t mad[256];
};
class GsiSink {
 public:
  virtual ~GsiSink() = default;
  virtual void OnGsi(const GsiMad& mad) = 0;
};

// One worker of a device: its queues on the link, the QPs it runs and their
// transport environment, and its turn (worker.cc). Fields below
// `drive_lock` belong to whoever holds it; what the device's workers share
// (the object table, the port's addressing) it reaches through `dev`.
struct Worker final : transport::TransportEnv {
  Device* dev = nullptr;
  uint16_t index = 0;  // also its rx/tx queue on the link
  // The DPDK lcore id of the worker's thread (LCORE_ID_ANY until known, or
  // if EAL had none to give). Whichever thread drives the worker uses it for
  // the turn, so mbufs come from and go back to this worker's mempool cache.
  std::atomic<unsigned> lcore_id{~0u};
  // Wakeup: the worker's thread sleeps on wake->seq (a futex in the
  // device's shared wake page) when idle.
  WakeWords* wake = nullptr;
  alignas(queue::kCacheLine) std::atomic<bool> drive_lock{false};
  // Set by another worker: activate every QP of this worker (a neighbour they
  // may wait for was resolved).
  std::atomic<bool> activate_all{false};
  queue::DoorbellQueue doorbells{4096};
  // droced: the doorbell queues of client processes for this worker
  // (changed by the control path only).
  std::vector<DoorbellSource*> sources;
  // Frames for this worker's QPs received by another worker (multi-producer,
  // single-consumer); nullptr with a single worker.
  rte_ring* inbox = nullptr;
  // Frames this worker received for other workers' QPs, per target, put in
  // the targets' inboxes together after the receive step (FlushHandoffs):
  // one ring operation per target and turn, not one per frame (each takes
  // the ring's cache lines from the owner spinning on it; bench/handoff_bench).
  struct Outbox {
    static constexpr uint16_t kSize = 64;
    rte_mbuf* m[kSize];
    uint16_t n = 0;
  };
  std::vector<Outbox> outbox;  // one per worker; empty with a single worker

  // Which of its QPs run next: active, awaiting a transport timer, held
  // by their pacer (transport/scheduler.h).
  transport::QpScheduler<QpEntry> sched;
  // The worker's QP with that QPN; nullptr if there is none, or another
  // worker runs it (the scheduler's lookup).
  QpEntry* Find(uint32_t qpn) const;
  std::vector<rte_mbuf*> tx;
  // The fault stage (DROCE_FAULT); nullptr without rules. tx[0..tx_judged)
  // went through it already (frames the link did not take wait in tx).
  std::unique_ptr<FaultStage> fault;
  size_t tx_judged = 0;
  // The link refused frames at the last flush (tx_link_full counts each
  // time this becomes true).
  bool tx_link_blocked = false;
  // The live capture's tap (lab/capture.h, Device::StartCapture); nullptr
  // while none runs, or once it has ended.
  std::unique_ptr<CaptureTap> capture;
  // Copies of multicast frames sent on a link that does not return them
  // (every link but the internal loopback), for LoopBackMulticast.
  std::vector<rte_mbuf*> mcast_loop;
  // Frames to the port's own address (a QP talking to another QP of this
  // device, or to itself) on such a link, for LoopBackSelf; `self_scratch`
  // is the batch being delivered while new ones queue.
  std::vector<rte_mbuf*> self_loop, self_scratch;
  Counters stats;
  uint64_t last_timer_ns = 0;
  // Whether the idle worker naps instead of yielding a CPU that a spinner
  // holds (Device::YieldCpu), and the thread's CPU time and the clock read
  // together for it (0: stale). Its own thread only.
  YieldPolicy yield;
  uint64_t cpu_ref_ns = 0, cpu_ref_wall_ns = 0;
  uint64_t timers_ran_ns = 0;  // RunTimers' last run (it may wait for a receive backlog)
  uint64_t last_poll_ns = 0;  // the clock reading of the last turn
  uint32_t handoff_targets = 0;  // bit per worker handed a frame this turn
  uint32_t handoff_pending = 0;  // bit per worker with frames in its outbox
  uint32_t qps = 0;              // QPs owned (guarded by the control path)
  // Work found during a turn that touches other workers' QPs (an SRQ error,
  // a device failure): run with every worker stopped, after the turn.
  std::vector<std::function<void()>> exclusive;

  // TransportEnv, for this worker's QPs.
  uint64_t NowNs() override;
  uint64_t TurnNs() override;
  // The clock at the start of the turn running now (Device::PollOnceGuarded);
  // 0 between turns.
  uint64_t turn_ns = 0;
  // Gaps between this worker's turns (engine_stalls, engine/stall_meter.h).
  StallMeter stalls;
  // The trace ring this worker's turns stamp (DROCE_TRACE clock=turn;
  // transport/trace.h), else nullptr. Set with every worker stopped.
  transport::TraceSink* trace_turn = nullptr;

  // The turn (worker.cc), run by whoever holds drive_lock: doorbells, the
  // receive burst and the frames other workers handed over, the QPs'
  // sends, the timers, one transmit flush. Returns whether it found work.
  bool Turn();
  void HandleDoorbells();
  bool SourcesNonEmpty() const;
  // Receive dispatch. `handed`: the frame was received by another worker
  // and handed to this one.
  void HandleFrame(rte_mbuf* m, bool handed);
  // A RoCE packet to a multicast address: to every QP attached to its group
  // (this worker's; other workers get a copy of `m` unless it was handed).
  void HandleMulticast(const wire::PacketView& v, rte_mbuf* m, bool handed);
  // A validated packet for one of this worker's QPs.
  void DeliverPacket(QpEntry* e, const wire::PacketView& v);
  // Learns the MAC of a RoCE packet's sender (replies need no ARP or ND).
  void LearnSender(const wire::PacketView& v);
  // Passes a received frame to the worker that runs its QP (outbox), and
  // puts the outboxes' frames into their targets' inboxes.
  void HandOff(Worker& to, rte_mbuf* m);
  void FlushHandoffs();
  void FlushHandoff(Worker& to);
  // Delivers the multicast frames this worker sent to the device's
  // attached QPs, and the frames it sent to the port's own address.
  void LoopBackMulticast();
  void LoopBackSelf();
  // The transport timers due (and, on worker 0, the device's).
  void RunTimers(uint64_t now);
  // Transmit: the queued frames to the link (through the fault stage and
  // capture).
  void FlushTx();
  // DestroyQp, every drive lock held: sends what was posted on e's send
  // queue and not yet seen by a turn.
  void SendBeforeDestroy(QpEntry* e);

  bool AllocFrame(uint32_t len, transport::TxFrame* frame) override;
  void SendFrame(const transport::TxFrame& frame, uint32_t len) override;
  bool ResolveMac(const wire::Ipv6Addr& dgid, wire::MacAddr* mac) override;
  mem::MrTable& Mrs() override;
  bool InvalidateRkey(uint32_t rkey, uint32_t pd) override;
  const transport::AddressHandle* FindAh(uint32_t id) override;
  bool FindXrcSrq(uint32_t srqn, transport::XrcSrqRef* out) override;
  Counters& Stats() override { return stats; }
};

class Device final : public Session {
 public:
  // The process's droce<index>, started on first use from the DROCE_*
  // environment.
  static absl::StatusOr<Device*> Instance(int index = 0);
  // Devices configured (DROCE_LINK entries separated by ';').
  static int Count();
  // droce<index> if it has started (nullptr otherwise): for observers that
  // must not start one (telemetry, `droce ctl`).
  static Device* Started(int index);
  // Reads and validates the configuration without starting anything.
  static absl::StatusOr<Config> CheckConfig();

  const PortInfo& port() const override { return port_; }
  // The port's state (ibv_query_port): active unless its link went down
  // after having been up, or the device died. A link that has not come up
  // yet (a memif waiting for its peer) counts as active: frames wait for it
  // and RC retries cover the gap, as on a NIC whose link is training.
  bool port_active() const override { return port_active_.load(std::memory_order_relaxed); }
  // The engine died (IBV_EVENT_DEVICE_FATAL was raised): every QP is in the
  // error state, the link is no longer used, and calls that would create or
  // enable objects fail with EIO.
  bool dead() const override { return dead_.load(std::memory_order_acquire); }
  // Runs fn on the engine as a control call does; for tests that need the
  // engine to fail from inside (an exception escaping fn kills the device).
  bool RunOnWorkerForTesting(std::function<void()> fn) override {
    RunOnWorker(std::move(fn));
    return true;
  }
  int workers() const override { return static_cast<int>(workers_.size()); }
  // Contexts receive the device's unaffiliated events (worker thread).
  void AddDeviceSink(EventSink* sink) override;
  void RemoveDeviceSink(EventSink* sink) override;

  absl::StatusOr<uint32_t> AllocPd() override;
  absl::Status DeallocPd(uint32_t pd) override;
  absl::StatusOr<mem::Mr> RegMrImplicit(uint32_t pd, uint32_t access) override;
  absl::StatusOr<mem::Mr> RegMr(uint32_t pd, uint64_t addr, uint64_t len, uint64_t iova,
                                uint32_t access) override;
  absl::Status DeregMr(uint32_t key) override;
  // A new range is this process's memory (droced offers its clients only a
  // new PD or access: DaemonSession::ReregMr).
  absl::Status ReregMr(uint32_t key, uint32_t flags, uint32_t pd, uint64_t addr, uint64_t len, uint64_t iova,
                       uint32_t access) override;
  absl::StatusOr<uint32_t> AllocMw(uint32_t pd, uint8_t type) override;
  absl::Status DeallocMw(uint32_t rkey) override;
  absl::StatusOr<CqHandle> CreateCq(uint32_t min_cqe, cq::CqNotifier* notifier, uint64_t cookie) override;
  absl::Status DestroyCq(uint32_t id) override;
  // Replaces the CQ's region with one of at least min_cqe entries; the caller
  // holds the consumer idle and switches it to the returned region.
  absl::StatusOr<cq::CqRegion*> ResizeCq(uint32_t id, uint32_t min_cqe) override;
  // Event moderation (ibv_modify_cq; see cq::CqProducer::SetModeration).
  absl::Status ModifyCq(uint32_t id, uint16_t count, uint16_t period_us) override;
  absl::StatusOr<QpHandle> CreateQp(const QpCreateArgs& args) override;
  // Returns 0 or an errno.
  int ModifyQp(uint32_t qpn, const transport::QpAttr& attr, uint32_t mask) override;
  absl::StatusOr<transport::QpAttr> QueryQp(uint32_t qpn) override;
  absl::StatusOr<SrqHandle> CreateSrq(uint32_t pd, uint32_t max_wr, uint32_t max_sge, uint32_t limit,
                                      EventSink* events, uint64_t cookie, uint32_t xrcd, uint32_t cq) override;
  // Arms the SRQ limit; returns 0 or an errno.
  int ModifySrq(uint32_t id, uint32_t limit) override;
  absl::StatusOr<uint32_t> QuerySrqLimit(uint32_t id) override;
  absl::Status DestroySrq(uint32_t id) override;
  absl::StatusOr<uint32_t> CreateAh(uint32_t pd, const transport::AddressVector& av) override;
  absl::Status DestroyAh(uint32_t id) override;
  // Fails (FailedPrecondition, EBUSY at the verbs boundary) while the QP is
  // attached to a multicast group: IBA o10-2.2.3, as the kernel does.
  absl::Status DestroyQp(uint32_t qpn) override;
  // ibv_attach_mcast / ibv_detach_mcast for UD QPs (engine/mcast.h has the
  // rules). Return 0 or an errno.
  int AttachMcast(uint32_t qpn, const wire::Ipv6Addr& mgid) override;
  int DetachMcast(uint32_t qpn, const wire::Ipv6Addr& mgid) override;
  Counters ReadCounters() override;
  // The fault rules' counters, summed over the workers (DROCE_STATS at
  // close); empty without rules.
  std::vector<std::string> FaultReport() override;
  std::string LinkReport() override;
  // The link's own counters (the PMD's, read without stopping the workers);
  // false where the port has none (not open).
  bool ReadLinkStats(io::DpdkPort::Stats* s) const { return dpdk_.ReadStats(s); }
  // The lab's packet capture (lab/capture.h) on this device's link, started
  // and stopped while the workers run (installed with them stopped for a
  // moment). One at a time: FailedPrecondition while one runs.
  absl::Status StartCapture(const lab::CaptureOptions& o);
  // NotFound without one. Returns what it wrote; the file is closed.
  absl::StatusOr<lab::CaptureStatus> StopCapture();
  // The running (or ended, not yet stopped) capture's state.
  std::optional<lab::CaptureStatus> CaptureState();
  // The fault rules now (droce ctl fault): replaced on every worker at once
  // (their counters start again from 0; frames already held keep their
  // release times). Empty: no rules (the stage goes once it holds nothing).
  void SetFaultRules(std::vector<lab::FaultRule> rules);
  // Each rule with its counters summed over the workers (their stages
  // stopped for the copy).
  std::vector<RuleTotals> FaultRules();
  // Whether the device has fault rules now: a reader that only wants their
  // counters (the metrics endpoint) stops no worker for a device without.
  bool HasFaultRules() const { return has_fault_rules_.load(std::memory_order_relaxed); }
  // Congestion control (cc/dcqcn.h; droce ctl cc): the mode and DCQCN
  // parameters of one QP (qpn != 0) or of every QP and every QP created
  // later (qpn 0), changed live; each QP's reaction point starts again at
  // the line rate. NotFound if the QP does not exist.
  absl::Status SetCongestionControl(uint32_t qpn, cc::CcMode mode, const cc::DcqcnParams& p);
  struct CcRow {
    uint32_t qpn = 0;
    cc::CcMode mode = cc::CcMode::kOff;
    cc::DcqcnParams params;
    bool limited = false;  // the reaction point limits the QP now
    double rate_mbps = 0, target_mbps = 0, alpha = 0;
    uint64_t cuts = 0, increases = 0;
  };
  // The device's defaults (qpn 0) then each QP, with the workers stopped
  // for the copy.
  std::vector<CcRow> CongestionControl();
  // The per-QP event trace (lab/trace.h): every QP of the device (or the
  // one its filter names), started and stopped while traffic runs. One at a
  // time: FailedPrecondition while one runs; NotFound to stop none.
  absl::Status StartTrace(const lab::TraceOptions& o);
  absl::StatusOr<lab::TraceStatus> StopTrace();
  std::optional<lab::TraceStatus> TraceState();
  // At exit: the trace's last events written and its file closed.
  std::optional<lab::TraceStatus> CloseTraceAtExit();
  // The same, read while the workers run (Peek): for the live statistics.
  Counters PeekCounters() const;
  // Every QP's counters now, with its QPN and owner tag, read while the
  // workers run: a snapshot copied under the control lock (no QP is created
  // or destroyed meanwhile), then handed to `f` after the lock is released.
  void PeekQpCounters(const std::function<void(uint32_t qpn, uint64_t owner, const QpCounters&)>& f);
  // Every QP's latency histograms (DROCE_LATENCY), by class
  // (transport::Qp::LatencyClass), read while the workers run; `f` runs
  // under the control lock, so it should only summarise.
  void PeekQpLatency(const std::function<void(uint32_t qpn, int cls, const lab::LatencyHistogram&)>& f);
  // `rdma res show`: the device's objects as they are, taken as a control
  // call (workers stopped for the copy).
  struct QpRes {
    uint32_t qpn, pd, send_cq, recv_cq, srq, dest_qpn, sq_psn, rq_psn;
    transport::QpType type;
    transport::QpState state;
    uint8_t path_mtu;
    uint64_t owner;
    transport::Qp::RetransTimer retrans;
    uint64_t rto_ns;   // Qp::RetransTimeoutNs
    uint64_t srtt_ns;  // the smoothed round trip; 0 before the first sample
  };
  struct CqRes {
    uint32_t id, entries, users;
  };
  struct PdRes {
    uint32_t id, users;
  };
  struct Resources {
    std::vector<QpRes> qps;
    std::vector<CqRes> cqs;
    std::vector<mem::Mr> mrs;
    std::vector<PdRes> pds;
  };
  Resources ReadResources();
  // One QP's counters, read on the worker (their only writer).
  absl::StatusOr<QpCounters> ReadQpCounters(uint32_t qpn) override;

  // Datapath, any thread: new WQEs are in the QP's rings.
  // With wake=false the caller drives or wakes the worker itself (Kick).
  void Doorbell(const QpHandle& qp, bool wake = true) override;
  // After doorbells on `qp`: drive its worker on this thread if nobody is
  // driving it, else make sure that worker is awake to see them.
  void Kick(const QpHandle& qp) override;
  // Application-driven progress: runs one turn of each worker's loop whose
  // drive lock is free on the calling thread. Returns whether there was work.
  bool TryDrive(bool polling = true) override;
  void CompletionsPolled() override;
  // An application thread that drove the engine is about to block (e.g. in
  // ibv_get_cq_event): the worker takes over now.
  void Handoff() override;
  void NoteYield() override;

  // droced. The memfd of the workers' wake words (one WakeWords per worker,
  // in worker order) that clients map to wake a sleeping worker.
  MapInfo wake_map() const { return {wake_shm_.fd(), wake_shm_.size()}; }
  // A client's doorbell queues join (and leave) the workers' loops.
  void AddDoorbellSource(DoorbellSource* src);
  void RemoveDoorbellSource(DoorbellSource* src);
  // droced's copy tier: an MR over [addr, addr+len) of process `pid`, which
  // the engine reaches with process_vm_readv/writev.
  absl::StatusOr<mem::Mr> RegMrOfProcess(int32_t pid, uint32_t pd, uint64_t addr, uint64_t len, uint64_t iova,
                                         uint32_t access);
  // Ownership (objects.h): who created an object (nullopt: no such
  // object), and what an owner has now.
  std::optional<uint64_t> OwnerOf(ObjKind kind, uint32_t id);
  OwnedObjects Owned(uint64_t owner);
  // Destroys everything `owner` has, in ObjKind's order (its QPs leave their
  // multicast groups first): droced's teardown of a client that went.
  // `failed` hears of any object that would not go (still in use by
  // another owner's object); returns how many went.
  size_t DestroyAllOf(uint64_t owner,
                      const std::function<void(ObjKind, uint32_t id, const absl::Status&)>& failed);
  // Kills the device as an engine failure does (droced's shutdown): every
  // QP in error, IBV_EVENT_DEVICE_FATAL to every sink.
  void Shutdown(const char* why);

  // QP1, the GSI QP, for the connection manager (gsi.cc): a UD QP with the
  // well-known Q_Key 0x80010000 whose MADs go to one sink instead of a
  // receive queue. The sink is called on a worker thread and must only hand
  // the MAD on; without one, MADs to QP1 are dropped (gsi_drop).
  void SetGsiSink(GsiSink* sink) { gsi_sink_.store(sink, std::memory_order_release); }
  // Queues a MAD from QP1 to (dgid, dqpn); worker 0 sends it once the
  // destination's MAC is known (ARP/ND), or drops it after 3 s. Any thread.
  void SendGsi(const wire::Ipv6Addr& sgid, const wire::Ipv6Addr& dgid, uint32_t dqpn, uint8_t tclass,
               const uint8_t* mad);
  // Whether dgid's MAC has been resolved (1), or not yet (0: asked, worker 0
  // resolves it). Any thread.
  int ResolveNeighbor(const wire::Ipv6Addr& dgid);
  // Waits (at most timeout_ns) until every MAD queued so far is on the link
  // or dropped: a process that exits after its connection manager's last
  // words (cm::Ucma::ProcessExit). Returns whether they all went.
  bool FlushGsi(uint64_t timeout_ns);

  // Shared by every worker's TransportEnv.
  bool InvalidateRkey(uint32_t rkey, uint32_t pd);
  const transport::AddressHandle* FindAh(uint32_t id);
  bool FindXrcSrq(uint32_t srqn, transport::XrcSrqRef* out);

 private:
  friend struct Worker;
  Device() = default;
  static uint64_t NowNs();
  std::mutex capture_mu_;  // over capture_ (control threads)
  std::shared_ptr<lab::Capture> capture_;
  std::mutex trace_mu_;  // over changes of trace_ (read by CreateQp under RunOnWorker)
  std::unique_ptr<lab::Trace> trace_;
  // Hands every QP its sink of trace_ (or none); workers stopped.
  void SetQpTraceSinks();
  // lab_hooks.cc: DROCE_FAULT, DROCE_CAPTURE and DROCE_TRACE from the start
  // (Setup, once the workers exist).
  absl::Status StartLab(const Config& cfg);
  absl::Status Start(const Config& cfg);
  transport::PortAddr TransportPort() const;
  void WorkerMain(Config cfg, std::promise<absl::Status>* started);
  // Brings up the link and the workers (on worker 0's thread).
  absl::Status Setup(const Config& cfg);
  // Gives the calling worker thread a DPDK lcore id (a mempool cache).
  static void RegisterWithEal(const std::string& name);

  // progress.cc: who runs a worker's turn, and when.
  // Runs fn with every worker stopped (all drive locks held) on the calling
  // thread and waits for it: the control path. An exception escaping fn
  // kills the device. Not re-entrant (it aborts rather than deadlock).
  void RunOnWorker(std::function<void()> fn);
  // Aborts unless the calling thread is inside this device's RunOnWorker:
  // the first line of what must only run with every worker stopped.
  void AssertStopped(const char* what) const;
  // Wakes w's thread if it announced a sleep; WakeNow wakes it regardless.
  void Wake(Worker& w);
  void WakeNow(Worker& w);
  void WakeAll();
  // Takes w's drive lock if it is free and no control call waits for it.
  bool TryTakeDrive(Worker& w);
  // The worker's thread.
  void Loop(Worker& w);
  // What a driver learns from a turn, for after it released the lock.
  struct Turn {
    uint64_t timer_ns = 0;  // the worker's last timer tick
    uint64_t now_ns = 0;    // the turn's clock reading
    bool pending = false;   // QPs with work or awaiting ACKs, or a held CQ event
    uint64_t pace_due_ns = 0;  // the first paced QP's time to send, 0 if none
  };
  // One turn of w's loop by a thread that holds w's drive lock, which it
  // releases; then runs the work the turn left for all workers stopped.
  bool DriveLocked(Worker& w, Turn* turn = nullptr);
  // One turn of every worker on the calling thread (a control call that
  // must see what was posted before it).
  void DriveEachOnce();
  void PaceSleep(Worker& w, long ns);
  // Spin, yield or sleep after an idle turn (without w's drive lock).
  void IdleBackoff(Worker& w, unsigned idle_loops, const Turn& turn, uint64_t* last_busy_ns);
  void YieldCpu(Worker& w, bool hot);
  bool WakeReason(const Worker& w) const;
  void Nap(Worker& w, long ns);
  template <typename HasWork>
  void SleepUnless(Worker& w, long ns, HasWork has_work);
  // DROCE_WATCH_US: one look at the link while applications drive, at
  // real-time priority; LeaveRealtime drops that priority.
  struct WatchState;
  void SetupWatch(const Config& cfg);
  void Watch(Worker& w, WatchState& ws);
  static void LeaveRealtime();

  // worker.cc
  // Worker::Turn, turning an exception that escapes the engine into a dead
  // device instead of unwinding into the application (port_state.cc).
  bool PollOnceGuarded(Worker& w);
  // A parsed packet's destination IP is the port's.
  bool ForPort(const wire::PacketView& v) const { return v.ipv6 ? has_ip6_ && v.dip6 == ip6_ : v.dip == port_.ip; }
  bool IsOwnAddress(const uint8_t* frame, uint32_t len) const;
  // Whether a CQ holds back a moderated event (worker 0 must not sleep).
  bool CqEventHeld() const;
  // Device-wide timers, on worker 0's turn: moderated CQs, the link state.
  void TickDevice(Worker& w0, uint64_t now);

  // verbs.cc
  // DestroyQp with every worker stopped.
  absl::Status DestroyQpStopped(uint32_t qpn);
  // A QP's and its SRQ's events to their sinks (the QP's worker).
  void DeliverEvents(QpEntry* e);
  // An SRQ went to error: every QP on it goes to error (all workers stopped).
  void FailSrqQps(uint32_t srq);

  // port_state.cc: link polling, PORT_ACTIVE/PORT_ERR, DEVICE_FATAL.
  void PollLinkState(Worker& w);
  void WaitForLink();
  bool ReconnectDue(uint64_t now) const;
  void RaiseDeviceEvent(int event_type);
  // All workers stopped (RunOnWorker, or a turn's exclusive work).
  void EnterFatal(const char* why);
  // arp.cc
  void HandleArp(Worker& w, const uint8_t* f, size_t len);
  void SendArp(Worker& w, uint16_t op, const wire::MacAddr& tha, uint32_t tip);

  PortInfo port_;
  queue::ShmRegion wake_shm_;
  io::DpdkPort dpdk_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<bool> stop_{false};

  // Control path: one call at a time; while one waits for the drive locks,
  // drivers step aside.
  std::mutex ctl_mu_;
  std::atomic<uint32_t> ctl_pending_{0};

  // An application thread's last turn from ibv_poll_cq (Kick defers posts
  // for that thread's next poll after one), and from ibv_post_* (only the
  // worker's loop counts it as the application driving).
  std::atomic<uint64_t> last_app_drive_ns_{0};
  std::atomic<uint64_t> last_post_drive_ns_{0};
  std::atomic<bool> kick_deferred_{false};  // Kick left posts for the next poll's turn
  std::atomic<uint64_t> app_polls_{0};  // ibv_poll_cq calls, empty or not (kBusyPolls)
  // DROCE_WATCH_US in ns (0: off, or real-time priority was refused), and the
  // time an application thread last drove or posted (Watch).
  std::atomic<uint64_t> watch_ns_{0};
  // The nap of a worker whose yields a spinner takes (YieldCpu,
  // engine/yield_policy.h): DROCE_WATCH_US; 0: always yield.
  uint64_t contended_nap_ns_ = 0;
  std::atomic<uint64_t> app_seen_ns_{0};
  bool app_progress_ = true;
  bool measure_latency_ = false;  // DROCE_LATENCY: QPs record post-to-completion latencies
  uint32_t rate_kbps_ = 0, rate_burst_ = 0;  // DROCE_RATE: every QP's pacing from its creation
  cc::CcMode cc_mode_ = cc::CcMode::kDcqcn;   // DROCE_CC, DROCE_DCQCN: every new QP's congestion control
  transport::SelectiveRepeat sr_;             // DROCE_SR: every new RC/XRC QP's loss recovery
  transport::AdaptiveRetrans adp_;            // DROCE_ADP_RETRANS: every new RC/XRC QP's early timeout
  std::atomic<bool> has_fault_rules_{false};  // HasFaultRules
  cc::DcqcnParams dcqcn_;
  static void PrintLatency(const std::string& dev, uint32_t qpn, const transport::Qp& qp);

  // The device's objects: changed only by the control path (every worker
  // stopped), read by the workers' turns.
  ObjectTable objects_;
  bool link_loops_back_ = false;
  // port_state.cc (worker 0)
  std::atomic<bool> port_active_{true};
  std::atomic<bool> dead_{false};
  bool shutting_down_ = false;  // Shutdown (changed with every worker stopped)
  bool link_seen_up_ = false;
  uint64_t last_link_poll_ns_ = 0;
  uint64_t last_reconnect_ns_ = 0;  // the last try of a memif client (dpdk_.reconnects())
  bool link_up_since_try_ = false;  // the link came up after that try
  bool link_raw_up_ = false;        // at the last poll (PrefaultSharedMemory on the way up)
  std::vector<EventSink*> device_sinks_;

  // links & addressing (io/arp/icmp/nd)
  // The next hop for an IPv4 destination: itself on the subnet (or with no
  // gateway configured), else the gateway.
  uint32_t NextHop(uint32_t dip) const;
  bool ResolveMac(Worker& w, const wire::Ipv6Addr& dgid, wire::MacAddr* mac);
  bool ResolveMac4(Worker& w, uint32_t dip, wire::MacAddr* mac);
  // A confirmed IPv4 → MAC mapping; wakes the QPs waiting on it if it is new.
  void LearnNeighbor(Worker& w, uint32_t ip, const wire::MacAddr& mac, bool create);
  void SendGratuitousArp(Worker& w);
  // Frames that are not RoCE but may be for the port (icmp.cc): ICMP echo,
  // ICMPv6 echo and neighbour discovery. Returns true if the frame was
  // consumed (answered or deliberately ignored).
  bool HandleLocal(Worker& w, const uint8_t* f, size_t len);
  void HandleIcmp4(Worker& w, const uint8_t* f, size_t len, unsigned l3);
  // IPv6 (nd.cc): ICMPv6 echo and neighbour discovery (RFC 4861) for the
  // port's IPv6 address (DROCE_IP6), and a resolver for IPv6 next hops.
  void HandleIcmp6(Worker& w, const uint8_t* f, size_t len, unsigned l3);
  void SendNeighborSolicit(Worker& w, const wire::Ipv6Addr& target, const wire::MacAddr* unicast);
  void SendNeighborAdvert(Worker& w, const wire::MacAddr& dmac, const wire::Ipv6Addr& dip, bool solicited);
  bool ResolveMac6(Worker& w, const wire::Ipv6Addr& dip, wire::MacAddr* mac);
  // A confirmed IPv6 → MAC mapping (ND, RoCE traffic); wakes the QPs waiting
  // on it if it is new, as LearnNeighbor does.
  void LearnNeighbor6(Worker& w, const wire::Ipv6Addr& ip, const wire::MacAddr& mac, bool create);
  // Puts every QP on its owner's active list (cold path: a neighbour some may
  // wait for was resolved or moved). Other workers do it at their next turn.
  void ActivateAllQps(Worker& w);
  void ActivateOwnQps(Worker& w);
  // Puts the port's 802.1Q tag in front of a frame about to be sent (no-op
  // without DROCE_VLAN).
  // pcp >= 0: that 802.1p priority instead of the port's (a CNP's).
  void TagFrame(rte_mbuf* m, int pcp = -1);
  // Whether a received frame belongs to this port's VLAN (or, without one,
  // is untagged or priority-tagged). `m` may carry a tag the PMD stripped.
  bool VlanAccepts(const rte_mbuf* m, const uint8_t* f, size_t len) const;
  // Neighbour caches (engine/neighbor.h): IPv4 next hops by ARP, IPv6 by ND;
  // every worker resolves and learns, under neighbor_lock_.
  using ArpCache = NeighborCache<uint32_t>;
  using NdCache = NeighborCache<wire::Ipv6Addr>;
  SpinLock neighbor_lock_;
  ArpCache arp_;
  NdCache nd_;
  bool has_ip6_ = false;
  wire::Ipv6Addr ip6_{};
  uint8_t prefix6_len_ = 64;
  uint32_t gateway_ = 0;
  uint32_t subnet_mask_ = 0;
  uint16_t vlan_tci_ = 0;  // 0: untagged
  std::atomic<uint16_t> ip_id_{0};  // IPv4 identification for ICMP replies
  // QP1 (gsi.cc).
  struct GsiOut {
    wire::Ipv6Addr sgid{}, dgid{};
    uint32_t dqpn = 0;
    uint8_t tclass = 0;
    bool resolve_only = false;
    uint64_t since_ns = 0;
    std::array<uint8_t, 256> mad{};
  };
  void HandleGsi(Worker& w, const wire::PacketView& v);
  bool DrainGsi(Worker& w);
  std::atomic<GsiSink*> gsi_sink_{nullptr};
  std::atomic<bool> gsi_pending_{false};
  std::mutex gsi_mu_;
  std::vector<GsiOut> gsi_out_;               // under gsi_mu_
  uint64_t gsi_queued_ = 0;                   // MADs accepted by SendGsi, under gsi_mu_
  std::atomic<uint64_t> gsi_done_{0};         // of them, sent (the link has them) or dropped
  std::vector<wire::Ipv6Addr> gsi_known_;     // resolved neighbours, under gsi_mu_
  uint32_t gsi_psn_ = 0;                      // worker 0's
};

}  // namespace droce::engine
