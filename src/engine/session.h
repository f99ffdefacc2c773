// The seam between the verbs provider and an engine: one Session per droce
// device a process uses. Two implementations: engine::Device, the engine
// running in this process (embedded mode), and the provider's DaemonSession,
// which speaks the control protocol (src/ctl/) to droced and maps the rings
// droced shares with it (daemon mode). Everything crossing the seam is plain
// data; shared memory is described by {fd, size, offsets} (MapInfo) so that
// the same handles can be rebuilt in another process; callbacks
// (EventSink, cq::CqNotifier) run on an engine thread in embedded mode and
// on the provider's event thread in daemon mode.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "common/counters.h"
#include "cq/cq.h"
#include "queue/ring.h"
#include "transport/qp.h"
#include "wire/headers.h"

namespace droce::engine {

// What droce reports as its firmware version (ibv_query_device's fw_ver,
// sysfs fw_ver, `droce ctl dev show`).
inline constexpr const char* kFirmwareVersion = "droce-0.1.0";

// The memfd behind a handle's shared memory, for a process that maps it
// (droced passes fd with SCM_RIGHTS; the offsets are of the handle's parts).
struct MapInfo {
  int fd = -1;
  uint64_t size = 0;
};

// A worker's wake words, one cache line per worker in a memfd page of the
// device (Device::wake_map), so that a client process can wake a sleeping
// worker of droced as an application thread wakes its own: bump `seq` and
// FUTEX_WAKE it (a shared futex) if `sleeping` is set.
struct WakeWords {
  alignas(queue::kCacheLine) std::atomic<uint32_t> seq;
  std::atomic<uint32_t> sleeping;
  // sched_yield calls by application threads whose ibv_poll_cq found
  // nothing (Session::NoteYield): the worker tells a program that waits in
  // verbs from one that spins on memory (Device::YieldCpu). Its own line:
  // the pollers write it, the worker reads it only when a yield came back
  // late.
  alignas(queue::kCacheLine) std::atomic<uint32_t> app_yields;
};
// Wakes a worker whose WakeWords these are if it announced a sleep; pairs
// with the sleeper's store of `sleeping`, fence, re-check (worker.cc).
void WakeWorker(WakeWords* w);
void WakeWorkerNow(WakeWords* w);

struct PortInfo {
  std::string name;   // "droce0"
  wire::MacAddr mac{};
  uint32_t ip = 0;    // host order
  uint8_t prefix_len = 24;
  uint8_t active_mtu = 3;  // enum ibv_mtu
  uint32_t link_mtu = 1500;
  // The GID table (all RoCE v2): index 0 the IPv4 address as an IPv4-mapped
  // GID, index 1 the IPv6 address when DROCE_IP6 is set (transport::PortAddr
  // routes by the same indexes).
  uint8_t gids[2][16] = {};
  unsigned gid_count = 1;
};

// Per-QP words shared with the provider (after the SQ and RQ rings).
// A port's node GUID (host order): EUI-64 from its MAC, as RoCE NICs
// derive it. libibverbs' and rdma_cm's device identity.
inline uint64_t node_guid(const PortInfo& p) {
  const auto& m = p.mac;
  return (uint64_t{static_cast<uint8_t>(m[0] ^ 2)} << 56) | (uint64_t{m[1]} << 48) | (uint64_t{m[2]} << 40) |
         (uint64_t{0xFF} << 32) | (uint64_t{0xFE} << 24) | (uint64_t{m[3]} << 16) | (uint64_t{m[4]} << 8) | m[5];
}

struct QpShared {
  alignas(queue::kCacheLine) std::atomic<uint32_t> doorbell_pending;
  // The QP's state (enum ibv_qp_state) as the engine has it, written by the
  // transport at every change, including those it makes by itself (retry
  // exceeded, a full CQ, a corrupt ring, an SRQ error, a dead device); the
  // provider's posting rule reads it. Same cache line as the doorbell flag,
  // which every post touches anyway.
  std::atomic<uint32_t> state;
};

// Receives asynchronous events (IBV_EVENT_*) for QPs and SRQs; called on the
// worker thread with the cookie given at creation.
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void QpEvent(uint64_t cookie, int event_type) = 0;
  virtual void SrqEvent(uint64_t cookie, int event_type) = 0;
  // Unaffiliated events of the device: IBV_EVENT_PORT_ACTIVE, PORT_ERR (port
  // 1) and DEVICE_FATAL. Only sinks registered with AddDeviceSink get them.
  virtual void DeviceEvent(int event_type) { (void)event_type; }
};

struct QpCreateArgs {
  transport::QpType type = transport::QpType::kRc;
  uint32_t pd = 0;    // 0 for an XRC target QP
  uint32_t xrcd = 0;  // an XRC target QP's XRC domain (OpenXrcd)
  // 0 where the type has none: both for an XRC target, recv_cq for an XRC
  // initiator.
  uint32_t send_cq = 0, recv_cq = 0;
  uint32_t srq = 0;  // 0: the QP has its own receive queue
  EventSink* events = nullptr;
  uint64_t cookie = 0;
  uint32_t max_send_wr = 0, max_recv_wr = 0, max_send_sge = 0, max_recv_sge = 0, max_inline = 0;
  bool sq_sig_all = false;
};

struct QpHandle {
  uint32_t qpn = 0;
  uint16_t worker = 0;  // the worker that owns the QP (its doorbells go there)
  queue::Ring sq, rq;
  QpShared* shared = nullptr;
  transport::QpCaps caps;
  // The memfd holding, in this order, the SQ ring (offset 0), the RQ ring
  // and the QpShared words.
  MapInfo map;
  uint64_t rq_offset = 0, shared_offset = 0;
};

struct SrqHandle {
  uint32_t id = 0;
  queue::Ring ring;
  uint32_t max_wr = 0, max_sge = 0;
  MapInfo map;  // the ring, at offset 0
};

struct CqHandle {
  uint32_t id = 0;
  cq::CqRegion* region = nullptr;
};

// Device limits reported through ibv_query_device.
struct Limits {
  static constexpr uint32_t kMaxQpWr = 16384;
  static constexpr uint32_t kMaxSge = 32;
  static constexpr uint32_t kMaxInline = 256;
  static constexpr uint32_t kMaxCqe = 1 << 20;
  static constexpr uint32_t kMaxQp = 1 << 16;
  static constexpr uint32_t kMaxCq = 1 << 16;
  static constexpr uint32_t kMaxMr = 1 << 20;
  static constexpr uint32_t kMaxPd = 1 << 16;
  static constexpr uint64_t kMaxMrSize = 1ull << 40;
};

class Session {
 public:
  virtual ~Session() = default;

  virtual const PortInfo& port() const = 0;
  // The port's state (ibv_query_port) and whether the device died
  // (IBV_EVENT_DEVICE_FATAL was raised; calls that create or enable objects
  // fail with EIO).
  virtual bool port_active() const = 0;
  virtual bool dead() const = 0;
  // No engine will run this device's queues again: a client whose droced
  // stopped or vanished (an embedded engine that died still flushes what is
  // posted). Posting verbs then fail with EIO, as on an RNIC being reset;
  // destroying objects still succeeds, and a new ibv_open_device gets a new
  // session. Asked only on a QP in ERR (every QP of such a session is).
  virtual bool engine_gone() const { return false; }
  // One line per fault rule with its counters (DROCE_FAULT; docs/LAB.md);
  // empty without rules, or where the engine is another process's.
  virtual std::vector<std::string> FaultReport() { return {}; }
  // The link's own counters as one line (DpdkPort::Stats); empty where the
  // engine is another process's.
  virtual std::string LinkReport() { return {}; }
  virtual int workers() const = 0;
  // Unaffiliated events (PORT_ACTIVE, PORT_ERR, DEVICE_FATAL) go to every
  // registered sink.
  virtual void AddDeviceSink(EventSink* sink) = 0;
  virtual void RemoveDeviceSink(EventSink* sink) = 0;

  virtual absl::StatusOr<uint32_t> AllocPd() = 0;
  virtual absl::Status DeallocPd(uint32_t pd) = 0;
  // [addr, addr+len) of the calling process, named by iova.
  virtual absl::StatusOr<mem::Mr> RegMr(uint32_t pd, uint64_t addr, uint64_t len, uint64_t iova,
                                        uint32_t access) = 0;
  // An implicit on-demand MR (ibv_reg_mr(pd, NULL, SIZE_MAX, ON_DEMAND)):
  // the calling process's whole address space, iova = address. Every access
  // through it is a fault-safe copy (process_vm_readv/writev), so an
  // unmapped address is a protection error, never a crash.
  virtual absl::StatusOr<mem::Mr> RegMrImplicit(uint32_t pd, uint32_t access) = 0;
  virtual absl::Status DeregMr(uint32_t key) = 0;
  // ibv_rereg_mr: kReregPd, kReregAccess and kReregTranslation (the values
  // of IBV_REREG_MR_CHANGE_*) say which of pd, access and [addr, addr+len)
  // named by iova replace the MR's; its keys stay. A session that cannot
  // change some of them answers Unimplemented (EOPNOTSUPP).
  enum ReregFlags : uint32_t { kReregTranslation = 1, kReregPd = 2, kReregAccess = 4 };
  virtual absl::Status ReregMr(uint32_t key, uint32_t flags, uint32_t pd, uint64_t addr, uint64_t len, uint64_t iova,
                               uint32_t access) = 0;
  virtual absl::StatusOr<uint32_t> AllocMw(uint32_t pd, uint8_t type) = 0;
  virtual absl::Status DeallocMw(uint32_t rkey) = 0;
  virtual absl::StatusOr<CqHandle> CreateCq(uint32_t min_cqe, cq::CqNotifier* notifier, uint64_t cookie) = 0;
  virtual absl::Status DestroyCq(uint32_t id) = 0;
  // Replaces the CQ's region with one of at least min_cqe entries; the caller
  // holds the consumer idle and switches it to the returned region.
  virtual absl::StatusOr<cq::CqRegion*> ResizeCq(uint32_t id, uint32_t min_cqe) = 0;
  virtual absl::Status ModifyCq(uint32_t id, uint16_t count, uint16_t period_us) = 0;
  virtual absl::StatusOr<QpHandle> CreateQp(const QpCreateArgs& args) = 0;
  // Returns 0 or an errno.
  virtual int ModifyQp(uint32_t qpn, const transport::QpAttr& attr, uint32_t mask) = 0;
  virtual absl::StatusOr<transport::QpAttr> QueryQp(uint32_t qpn) = 0;
  virtual absl::Status DestroyQp(uint32_t qpn) = 0;
  // xrcd 0: a basic SRQ; else an XRC SRQ of that XRC domain whose
  // completions go to CQ `cq` (its number is the handle's id: ibv_get_srq_num).
  virtual absl::StatusOr<SrqHandle> CreateSrq(uint32_t pd, uint32_t max_wr, uint32_t max_sge, uint32_t limit,
                                              EventSink* events, uint64_t cookie, uint32_t xrcd, uint32_t cq) = 0;
  // XRC domains (ibv_open_xrcd): an engine object that XRC SRQs and target
  // QPs name and count as its users. Held in the PD table (an XRC domain is
  // a protection domain no memory is registered on), so the default is the
  // PD calls; DeallocXrcd is FailedPrecondition while it has users.
  virtual absl::StatusOr<uint32_t> AllocXrcd() { return AllocPd(); }
  virtual absl::Status DeallocXrcd(uint32_t xrcd) { return DeallocPd(xrcd); }
  virtual int ModifySrq(uint32_t id, uint32_t limit) = 0;
  virtual absl::StatusOr<uint32_t> QuerySrqLimit(uint32_t id) = 0;
  virtual absl::Status DestroySrq(uint32_t id) = 0;
  virtual absl::StatusOr<uint32_t> CreateAh(uint32_t pd, const transport::AddressVector& av) = 0;
  virtual absl::Status DestroyAh(uint32_t id) = 0;
  virtual int AttachMcast(uint32_t qpn, const wire::Ipv6Addr& mgid) = 0;
  virtual int DetachMcast(uint32_t qpn, const wire::Ipv6Addr& mgid) = 0;
  virtual Counters ReadCounters() = 0;
  virtual absl::StatusOr<QpCounters> ReadQpCounters(uint32_t qpn) = 0;

  // Datapath, any thread: new WQEs are in the QP's rings. With wake=false
  // the caller drives or wakes the worker itself (Kick).
  virtual void Doorbell(const QpHandle& qp, bool wake = true) = 0;
  // After doorbells on `qp`: make sure its worker sees them (drive it here,
  // or wake it).
  virtual void Kick(const QpHandle& qp) = 0;
  // Application-driven progress (embedded only; false elsewhere): runs one
  // turn of each free worker on the calling thread.
  virtual bool TryDrive(bool polling = true) = 0;
  // An ibv_poll_cq call returned completions (application-driven progress;
  // nothing elsewhere): the thread counts as polling busily, as one whose
  // polls find their CQ empty does, and the posts Kick left for its next
  // turn are sent now, in one turn (else a thread whose polls keep finding
  // completions would send one turn per post).
  virtual void CompletionsPolled() {}
  // The calling thread is about to block: the worker takes over now.
  virtual void Handoff() = 0;
  // The calling thread, polling an empty CQ, yields its CPU
  // (DROCE_POLL_YIELD): counted in every worker's WakeWords::app_yields.
  virtual void NoteYield() {}
  // Runs fn with the engine stopped, as a control call does (tests that make
  // the engine fail from inside); false where the engine is not in this
  // process.
  virtual bool RunOnWorkerForTesting(std::function<void()> fn) = 0;
};

}  // namespace droce::engine
