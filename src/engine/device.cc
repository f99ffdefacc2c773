#include "engine/device.h"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include <rte_errno.h>
#include <rte_lcore.h>
#include <rte_pause.h>
#include <rte_ring.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/stamp_clock.h"

namespace droce::engine {
namespace {

absl::Status DeadError() { return absl::UnavailableError("the device failed (IBV_EVENT_DEVICE_FATAL)"); }

// Frames one worker can hold for another (a burst of 32 from each of 16
// workers, many times over).
constexpr unsigned kInboxSize = 4096;

// IB MTU usable over an Ethernet MTU: room for IPv4/UDP/BTH, the largest
// extended header and the ICRC, as rxe computes it (1500 → 1024).
uint8_t ib_mtu_for_link(uint32_t link_mtu) {
  const uint32_t room = link_mtu > 100 ? link_mtu - 100 : 0;
  uint8_t m = 1;
  for (uint8_t c = 1; c <= 5; ++c) {
    if ((128u << c) <= room) m = c;
  }
  return m;
}

}  // namespace

absl::StatusOr<Config> Device::CheckConfig() {
  // ConfigFromEnv parses every device's entries, so that a bad one is
  // reported by ibv_get_device_list rather than later.
  return ConfigFromEnv(0);
}

int Device::Count() { return ConfiguredDeviceCount(); }

namespace {
std::atomic<Device*> g_started[config::kMaxDevices];
}  // namespace

Device* Device::Started(int index) {
  return index >= 0 && index < config::kMaxDevices ? g_started[index].load(std::memory_order_acquire) : nullptr;
}

absl::StatusOr<Device*> Device::Instance(int index) {
  // Each device is started once, droce0 first (its worker brings up EAL); a
  // failed start is remembered and reported to every caller.
  static std::mutex mu;
  static std::vector<std::optional<absl::StatusOr<Device*>>> devices;
  if (index != 0) {
    if (auto first = Instance(0); !first.ok()) return first.status();
  }
  std::lock_guard<std::mutex> l(mu);
  if (index < 0 || index >= Count()) return absl::NotFoundError("no such droce device");
  if (devices.size() <= static_cast<size_t>(index)) devices.resize(index + 1);
  if (!devices[index]) {
    devices[index] = [&]() -> absl::StatusOr<Device*> {
      auto cfg = ConfigFromEnv(index);
      if (!cfg.ok()) return cfg.status();
      auto* d = new Device();  // lives until exit: the worker may still run at exit
      if (absl::Status s = d->Start(*cfg); !s.ok()) return s;
      if (index < config::kMaxDevices) g_started[index].store(d, std::memory_order_release);
      return d;
    }();
  }
  return *devices[index];
}

absl::Status Device::Start(const Config& cfg) {
  set_log_level(cfg.log_level);
  std::promise<absl::Status> started;
  std::future<absl::Status> f = started.get_future();
  std::thread worker0([this, cfg, &started] { WorkerMain(cfg, &started); });
  absl::Status s = f.get();
  if (!s.ok()) {
    worker0.join();
    return s;
  }
  worker0.detach();  // the device lives until exit, as its workers do
  return absl::OkStatus();
}

transport::PortAddr Device::TransportPort() const {
  transport::PortAddr p;
  p.mac = port_.mac;
  p.ip = port_.ip;
  p.max_mtu = port_.active_mtu;
  p.has_ip6 = has_ip6_;
  p.ip6 = ip6_;
  return p;
}

void Device::WorkerMain(Config cfg, std::promise<absl::Status>* started) {
  pthread_setname_np(pthread_self(), absl::StrCat("droce", cfg.index, "-w0").c_str());
  absl::Status s = Setup(cfg);
  started->set_value(s);
  if (s.ok()) Loop(*workers_[0]);
}

namespace {

// A process that exits with a trace on (the usual end of DROCE_TRACE) gets
// its last events written: the device, and so the trace, is never
// destroyed, and its writer drains the rings only every few milliseconds
// (on a busy machine, far less often).
pid_t trace_owner = 0;  // the process whose exit flushes the traces

void FlushTracesAtExit() {
  // A child forked without exec that calls exit() has neither the writer
  // thread to join nor traces of its own: the parent's files are the
  // parent's.
  if (getpid() != trace_owner) return;
  for (int i = 0; i < config::kMaxDevices; ++i) {
    if (Device* d = Device::Started(i)) {
      if (std::optional<lab::TraceStatus> st = d->CloseTraceAtExit(); st && st->dropped != 0) {
        Log(LogLevel::kWarning, "%s: trace %s lost %llu events to a full ring (ring=N is larger)",
            d->port().name.c_str(), st->text.c_str(), static_cast<unsigned long long>(st->dropped));
      }
    }
  }
}

void FlushTracesAtExitOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    trace_owner = getpid();
    std::atexit(FlushTracesAtExit);
  });
}

// What turns the engine's CLOCK_MONOTONIC into ns since the epoch.
int64_t EpochOffsetNs() {
  timespec r{}, m{};
  clock_gettime(CLOCK_REALTIME, &r);
  clock_gettime(CLOCK_MONOTONIC, &m);
  return (int64_t{r.tv_sec} - int64_t{m.tv_sec}) * 1'000'000'000 + (int64_t{r.tv_nsec} - int64_t{m.tv_nsec});
}

}  // namespace

absl::Status Device::Setup(const Config& cfg) {
  // EAL makes the calling thread its main lcore, so droce0's worker 0 brings
  // it up; the other workers and devices are plain threads on the same EAL.
  if (cfg.index == 0) {
    if (absl::Status s = io::InitEal({cfg.log_level, cfg.link, cfg.hugepages, cfg.telemetry}); !s.ok()) return s;
    if (cfg.telemetry) RegisterTelemetry();
  } else {
    RegisterWithEal(absl::StrCat("droce", cfg.index, "-w0"));
  }
  auto pin = [&](pthread_t t, int i) -> absl::Status {
    if (cfg.worker_cpus.empty()) return absl::OkStatus();
    const int cpu = cfg.worker_cpus[i % cfg.worker_cpus.size()];
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (int rc = pthread_setaffinity_np(t, sizeof(set), &set); rc != 0) {
      return absl::InternalError(absl::StrCat("cannot pin worker ", i, " to CPU ", cpu, ": ", std::strerror(rc)));
    }
    return absl::OkStatus();
  };
  // After EAL, which gives its main lcore thread the process's CPU set.
  if (absl::Status s = pin(pthread_self(), 0); !s.ok()) return s;
  io::PortOptions po;
  const bool loopback = cfg.link.empty();
  po.devargs = loopback ? absl::StrCat("net_ring_droce", cfg.index) : cfg.link;
  po.queues = static_cast<uint16_t>(cfg.workers);
  po.max_path_mtu = 128u << cfg.mtu;  // enum ibv_mtu: 1 is 256 bytes
  if (absl::Status s = dpdk_.Open(po); !s.ok()) return s;
  port_.name = absl::StrCat("droce", cfg.index);
  link_loops_back_ = loopback;
  app_progress_ = cfg.app_progress;
  measure_latency_ = cfg.latency;
  if (measure_latency_) lab::StampCalibrate();  // 10 ms, now rather than at the first completion
  rate_kbps_ = cfg.rate_kbps;
  rate_burst_ = cfg.rate_burst;
  cc_mode_ = cfg.cc;
  dcqcn_ = cfg.dcqcn;
  sr_ = cfg.sr;
  adp_ = cfg.adp;
  SetupWatch(cfg);
  port_.ip = cfg.ip;
  port_.prefix_len = cfg.prefix_len;
  port_.link_mtu = dpdk_.link_mtu();
  if (cfg.mac) {
    (void)dpdk_.SetMac(*cfg.mac);
  } else if (loopback || dpdk_.is_virtual_mac()) {
    // Virtual links have no MAC of their own worth keeping; derive a locally
    // administered one from the address so that two processes differ.
    (void)dpdk_.SetMac({0x02, 0x00, static_cast<uint8_t>(cfg.ip >> 24), static_cast<uint8_t>(cfg.ip >> 16),
                  static_cast<uint8_t>(cfg.ip >> 8), static_cast<uint8_t>(cfg.ip)});
  }
  port_.mac = dpdk_.mac();
  WaitForLink();
  // Virtual links carry any frame that fits an mbuf; real ones are bounded by
  // their Ethernet MTU.
  const uint8_t link_cap = (loopback || dpdk_.is_virtual_mac()) ? 5 : ib_mtu_for_link(port_.link_mtu);
  port_.active_mtu = std::min(cfg.mtu, link_cap);
  const wire::Ipv6Addr gid4 = wire::ipv4_to_gid(cfg.ip);
  std::memcpy(port_.gids[transport::kGidIndexIpv4], gid4.data(), 16);
  if (cfg.has_ip6) {
    std::memcpy(port_.gids[transport::kGidIndexIpv6], cfg.ip6.data(), 16);
    port_.gid_count = 2;
  }
  // Workers. With several, what their QPs share gets its locks, and each
  // gets an inbox for the frames the others receive for its QPs.
  const bool shared = cfg.workers > 1;
  auto wake = queue::ShmRegion::Create("droce-wake", sizeof(WakeWords) * cfg.workers);
  if (!wake.ok()) return wake.status();
  wake_shm_ = std::move(*wake);
  objects_.mrs.set_concurrent(shared);
  neighbor_lock_.set_enabled(shared);
  for (int i = 0; i < cfg.workers; ++i) {
    auto w = std::make_unique<Worker>();
    w->dev = this;
    w->index = static_cast<uint16_t>(i);
    w->wake = new (static_cast<WakeWords*>(wake_shm_.data()) + i) WakeWords();
    w->tx.reserve(1024);
    w->mcast_loop.reserve(64);
    w->self_loop.reserve(64);
    w->self_scratch.reserve(64);
    if (shared) {
      const std::string ring = absl::StrCat("droce", cfg.index, "_inbox", i);
      w->inbox = rte_ring_create(ring.c_str(), kInboxSize, SOCKET_ID_ANY, RING_F_SC_DEQ);
      if (w->inbox == nullptr) {
        return absl::ResourceExhaustedError(absl::StrCat("worker inbox ", ring, ": ", rte_strerror(rte_errno)));
      }
      w->outbox.resize(static_cast<size_t>(cfg.workers));
    }
    // The fault stage (DROCE_FAULT): only with rules, so that without them
    // the loop's test of `fault` is all it costs. The worker index salts
    // the rules' seeds: two workers do not draw the same dice.
    if (!cfg.fault.empty()) w->fault = std::make_unique<FaultStage>(cfg.fault, i, dpdk_.pool(), NowNs());
    if (!cfg.fault.empty()) has_fault_rules_.store(true, std::memory_order_relaxed);
    workers_.push_back(std::move(w));
  }
  // DROCE_CAPTURE: a capture from the first frame (droce<N>, N > 0, writes
  // its own file: "-droce<N>" before the path's extension).
  if (cfg.capture) {
    lab::CaptureOptions o = *cfg.capture;
    if (cfg.index > 0) o.path = lab::DevicePath(o.path, port_.name);
    absl::StatusOr<std::unique_ptr<lab::Capture>> c = lab::Capture::Start(o, port_.name, !cfg.fault.empty());
    if (!c.ok()) return absl::Status(c.status().code(), absl::StrCat("DROCE_CAPTURE: ", c.status().message()));
    capture_ = *std::move(c);
    for (const auto& w : workers_) w->capture = std::make_unique<CaptureTap>(capture_);
  }
  // QPNs start at a random place, as a kernel's move on from process to
  // process: a peer's CM refuses a REQ from a (CA GUID, QPN) it still holds
  // in timewait as stale (Linux: cm_insert_remote_qpn, REJ reason 10), and
  // every process here would otherwise hand out 0x11 first.
  objects_.StartQpnsAt(0x11 + std::random_device{}() % (0xFFFF00 - 0x11));
  // DROCE_TRACE: the event trace of every QP from the first.
  if (cfg.trace) {
    lab::TraceOptions o = *cfg.trace;
    if (cfg.index > 0) o.path = lab::DevicePath(o.path, port_.name);
    absl::StatusOr<std::unique_ptr<lab::Trace>> t =
        lab::Trace::Start(o, port_.name, static_cast<int>(workers_.size()), EpochOffsetNs());
    if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat("DROCE_TRACE: ", t.status().message()));
    trace_ = *std::move(t);
    SetQpTraceSinks();  // no QP yet: the workers' turn stamps (clock=turn)
    FlushTracesAtExitOnce();
  }
  // links & addressing (io/arp/icmp/nd): gateway, VLAN, IPv6, and the
  // announcements neighbours use to refresh stale entries for us.
  subnet_mask_ = cfg.prefix_len == 0 ? 0 : ~0u << (32 - cfg.prefix_len);
  gateway_ = cfg.gateway;
  vlan_tci_ = cfg.vlan == 0 ? 0 : static_cast<uint16_t>(cfg.vlan_pcp << 13 | cfg.vlan);
  has_ip6_ = cfg.has_ip6;
  ip6_ = cfg.ip6;
  prefix6_len_ = cfg.prefix6_len;
  Worker& w0 = *workers_[0];
  w0.lcore_id.store(rte_lcore_id(), std::memory_order_relaxed);  // this thread is worker 0's
  SendGratuitousArp(w0);
  if (has_ip6_) SendNeighborAdvert(w0, {0x33, 0x33, 0, 0, 0, 1}, {0xFF, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1}, false);
  for (int i = 1; i < cfg.workers; ++i) {
    Worker& w = *workers_[i];
    std::thread t([this, &w, name = absl::StrCat("droce", cfg.index, "-w", i)] {
      pthread_setname_np(pthread_self(), name.c_str());
      RegisterWithEal(name);
      w.lcore_id.store(rte_lcore_id(), std::memory_order_relaxed);
      Loop(w);
    });
    absl::Status s = pin(t.native_handle(), i);
    t.detach();  // the device lives until exit, as its workers do
    if (!s.ok()) {
      stop_.store(true, std::memory_order_relaxed);  // the started workers leave their loops
      return s;
    }
  }
  std::string cpus;
  for (int c : cfg.worker_cpus) absl::StrAppend(&cpus, cpus.empty() ? "" : ",", c);
  std::string extra;
  if (io::EalUsesHugepages()) extra += ", hugepages";
  if (cfg.vlan != 0) absl::StrAppend(&extra, ", VLAN ", cfg.vlan);
  if (cfg.workers > 1) absl::StrAppend(&extra, ", ", cfg.workers, " workers");
  if (!cfg.fault.empty()) absl::StrAppend(&extra, ", ", cfg.fault.size(), " fault rule", cfg.fault.size() == 1 ? "" : "s");
  if (capture_ != nullptr) absl::StrAppend(&extra, ", capture to ", capture_->Status().file);
  if (trace_ != nullptr) absl::StrAppend(&extra, ", trace to ", trace_->Status().text);
  if (!cfg.worker_cpus.empty()) {
    absl::StrAppend(&extra, cfg.workers > 1 ? ", workers on CPUs " : ", worker on CPU ");
    for (size_t i = 0; i < cfg.worker_cpus.size(); ++i) absl::StrAppend(&extra, i ? "," : "", cfg.worker_cpus[i]);
  }
  Log(LogLevel::kInfo, "%s up: link %s (driver %s, MAC %02x:%02x:%02x:%02x:%02x:%02x, link MTU %u, active MTU %u%s)",
      port_.name.c_str(), po.devargs.c_str(), dpdk_.driver().c_str(), port_.mac[0], port_.mac[1], port_.mac[2], port_.mac[3], port_.mac[4], port_.mac[5],
      port_.link_mtu, 128u << port_.active_mtu, extra.c_str());
  return absl::OkStatus();
}

void Device::RegisterWithEal(const std::string& name) {
  // A registered thread gets an lcore id of its own, hence its own mbuf
  // cache in the mempool: allocations and frees stay off the pool's shared
  // ring most of the time. (EAL's main lcore, droce0's worker 0, has one.)
  if (rte_thread_register() != 0) {
    Log(LogLevel::kWarning, "%s: no free DPDK lcore id (%s): its mbufs bypass the mempool cache", name.c_str(),
        rte_strerror(rte_errno));
  }
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

void Device::AddDoorbellSource(DoorbellSource* src) {
  RunOnWorker([&] {
    for (auto& w : workers_) w->sources.push_back(src);
  });
}

void Device::RemoveDoorbellSource(DoorbellSource* src) {
  RunOnWorker([&] {
    for (auto& w : workers_) std::erase(w->sources, src);
  });
}

void Device::Shutdown(const char* why) {
  RunOnWorker([&] {
    shutting_down_ = true;  // a requested stop, not a failure: logged as such
    EnterFatal(why);
  });
}

void Device::WakeAll() {
  for (auto& w : workers_) Wake(*w);
}

void Device::RunOnWorker(std::function<void()> fn) {
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
  try {
    fn();
  } catch (const std::exception& ex) {
    EnterFatal(ex.what());
  } catch (...) {
    EnterFatal("unknown exception");
  }
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

uint64_t Device::NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

absl::StatusOr<uint32_t> Device::AllocPd() {
  if (dead()) return DeadError();
  const uint64_t owner = CurrentOwner();
  uint32_t pd = 0;
  RunOnWorker([&] { pd = objects_.AllocPd(owner); });
  return pd;
}

absl::Status Device::DeallocPd(uint32_t pd) {
  absl::Status s;
  RunOnWorker([&] { s = objects_.DeallocPd(pd); });
  return s;
}

absl::StatusOr<mem::Mr> Device::RegMr(uint32_t pd, uint64_t addr, uint64_t len, uint64_t iova,
                                      uint32_t access) {
  if (dead()) return DeadError();
  const uint64_t owner = CurrentOwner();
  absl::StatusOr<mem::Mr> r;
  RunOnWorker([&] { r = objects_.RegMr(pd, addr, iova, len, access, 0, owner); });
  return r;
}

absl::StatusOr<mem::Mr> Device::RegMrImplicit(uint32_t pd, uint32_t access) {
  // This process's own memory through the copy tier: a peer's WRITE to an
  // address nothing is mapped at fails the copy (EFAULT), it does not fault.
  return RegMrOfProcess(static_cast<int32_t>(getpid()), pd, 0, UINT64_MAX, 0, access);
}

absl::StatusOr<mem::Mr> Device::RegMrOfProcess(int32_t pid, uint32_t pd, uint64_t addr, uint64_t len,
                                               uint64_t iova, uint32_t access) {
  if (dead()) return DeadError();
  if (pid <= 0) return absl::InvalidArgumentError("no such process");
  const uint64_t owner = CurrentOwner();
  absl::StatusOr<mem::Mr> r;
  RunOnWorker([&] { r = objects_.RegMr(pd, addr, iova, len, access, pid, owner); });
  return r;
}

absl::Status Device::ReregMr(uint32_t key, uint32_t flags, uint32_t pd, uint64_t addr, uint64_t len, uint64_t iova,
                            uint32_t access) {
  if (dead()) return DeadError();
  absl::Status s;
  RunOnWorker([&] { s = objects_.ReregMr(key, flags, pd, addr, len, iova, access); });
  return s;
}

absl::Status Device::DeregMr(uint32_t key) {
  absl::Status s;
  RunOnWorker([&] { s = objects_.DeregMr(key); });
  return s;
}

absl::StatusOr<CqHandle> Device::CreateCq(uint32_t min_cqe, cq::CqNotifier* notifier,
                                          uint64_t cookie) {
  if (dead()) return DeadError();
  if (min_cqe == 0 || min_cqe > Limits::kMaxCqe) return absl::InvalidArgumentError("cqe out of range");
  auto region = cq::CqRegion::Create(min_cqe);
  if (!region.ok()) return region.status();
  CqHandle h;
  h.region = region->get();
  CqEntry e;
  e.producer = std::make_unique<cq::CqProducer>(region->get(), notifier, cookie, workers_.size() > 1);
  e.region = std::move(*region);
  e.owner = CurrentOwner();
  RunOnWorker([&] { h.id = objects_.AddCq(std::move(e)); });
  if (dead()) return DeadError();
  return h;
}

absl::Status Device::DestroyCq(uint32_t id) {
  absl::Status s;
  RunOnWorker([&] { s = objects_.DestroyCq(id); });
  return s;
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

absl::StatusOr<cq::CqRegion*> Device::ResizeCq(uint32_t id, uint32_t min_cqe) {
  if (min_cqe == 0 || min_cqe > Limits::kMaxCqe) return absl::InvalidArgumentError("cqe out of range");
  auto region = cq::CqRegion::Create(min_cqe);
  if (!region.ok()) return region.status();
  // Completions of work posted before this call that one turn produces
  // (a UD or UC send completes when it is sent) count as pending, as they
  // would have arrived on an RNIC by now: without this turn, a resize below
  // them succeeded or not depending on whether a worker had looked yet
  // (rdma-core's test_resize_cq, as a droced client on a busy machine).
  DriveEachOnce();
  absl::StatusOr<cq::CqRegion*> r = absl::NotFoundError("no such CQ");
  RunOnWorker([&] {
    CqEntry* c = objects_.FindCq(id);
    if (c == nullptr) return;
    if (!c->producer->MoveTo(region->get())) {
      r = absl::InvalidArgumentError("more completions pending than the new size holds");
      return;
    }
    // The old region stays mapped until the CQ is destroyed: the consumer
    // may still hold a view of it until it switches.
    c->retired.push_back(std::move(c->region));
    c->region = std::move(*region);
    r = c->region.get();
  });
  return r;
}

absl::Status Device::ModifyCq(uint32_t id, uint16_t count, uint16_t period_us) {
  absl::Status s = absl::NotFoundError("no such CQ");
  RunOnWorker([&] {
    CqEntry* c = objects_.FindCq(id);
    if (c == nullptr) return;
    c->producer->SetModeration(count, uint64_t{period_us} * 1000);
    objects_.SetTicked(c->producer.get());
    s = absl::OkStatus();
  });
  return s;
}

absl::StatusOr<QpHandle> Device::CreateQp(const QpCreateArgs& a) {
  if (dead()) return DeadError();
  if (a.max_send_wr > Limits::kMaxQpWr || a.max_recv_wr > Limits::kMaxQpWr ||
      a.max_send_sge > Limits::kMaxSge || a.max_recv_sge > Limits::kMaxSge ||
      a.max_inline > Limits::kMaxInline) {
    return absl::InvalidArgumentError("QP capabilities exceed the device limits");
  }
  transport::QpCaps caps;
  caps.max_send_wr = queue::round_up_pow2(std::max(a.max_send_wr, 1u));
  caps.max_recv_wr = queue::round_up_pow2(std::max(a.max_recv_wr, 1u));
  caps.max_send_sge = std::max(a.max_send_sge, 1u);
  caps.max_recv_sge = std::max(a.max_recv_sge, 1u);
  // An XRC target takes receive WQEs from SRQs of any SGE count.
  if (a.type == transport::QpType::kXrcTgt) caps.max_recv_sge = Limits::kMaxSge;
  // Inline data shares the WQE slot with the SGE list; report what fits.
  caps.max_inline = std::max<uint32_t>(a.max_inline, caps.max_send_sge * sizeof(queue::Sge));
  const uint32_t sstride = (sizeof(queue::SendWqe) +
                            std::max<uint32_t>(caps.max_send_sge * sizeof(queue::Sge), caps.max_inline) + 15) & ~15u;
  const uint32_t rstride = sizeof(queue::RecvWqe) + caps.max_recv_sge * sizeof(queue::Sge);
  const size_t sq_len = queue::ring_bytes(caps.max_send_wr, sstride);
  const size_t rq_len = queue::ring_bytes(caps.max_recv_wr, rstride);
  auto shm = queue::ShmRegion::Create("droce-qp", sq_len + rq_len + sizeof(QpShared));
  if (!shm.ok()) return shm.status();
  auto entry = std::make_unique<QpEntry>();
  QpHandle h;
  h.sq = queue::Ring::Init(shm->data(), caps.max_send_wr, sstride);
  h.rq = queue::Ring::Init(static_cast<uint8_t*>(shm->data()) + sq_len, caps.max_recv_wr, rstride);
  h.shared = new (static_cast<uint8_t*>(shm->data()) + sq_len + rq_len) QpShared();
  h.shared->doorbell_pending.store(0, std::memory_order_relaxed);
  h.shared->state.store(static_cast<uint32_t>(transport::QpState::kReset), std::memory_order_relaxed);
  h.caps = caps;
  h.map = {shm->fd(), shm->size()};
  h.rq_offset = sq_len;
  h.shared_offset = sq_len + rq_len;
  entry->shm = std::move(*shm);
  entry->shared = h.shared;
  entry->events = a.events;
  entry->cookie = a.cookie;
  entry->owner = CurrentOwner();
  absl::Status s;
  RunOnWorker([&] {
    QpRefs refs;
    s = objects_.ResolveQpRefs(a, &refs);
    if (!s.ok()) return;
    absl::StatusOr<uint32_t> qpn = objects_.NextQpn();
    if (!qpn.ok()) {
      s = qpn.status();
      return;
    }
    h.qpn = *qpn;
    // The worker with the fewest QPs runs the new one.
    Worker* worker = workers_[0].get();
    for (auto& w : workers_) {
      if (w->qps < worker->qps) worker = w.get();
    }
    h.worker = worker->index;
    const bool tgt = a.type == transport::QpType::kXrcTgt;
    transport::QpInit init;
    init.qpn = h.qpn;
    init.type = a.type;
    init.pd = tgt ? 0 : a.pd;
    init.xrcd = tgt ? a.xrcd : 0;
    init.sq_sig_all = a.sq_sig_all;
    init.caps = caps;
    init.state_word = &h.shared->state;
    init.sq = h.sq;
    init.rq = h.rq;
    init.send_cq = refs.send_cq != nullptr ? refs.send_cq->producer.get() : nullptr;
    init.recv_cq = refs.recv_cq != nullptr ? refs.recv_cq->producer.get() : nullptr;
    init.srq = refs.srq != nullptr ? refs.srq->srq.get() : nullptr;
    init.port = TransportPort();
    init.measure_latency = measure_latency_;
    init.rate_kbps = rate_kbps_;
    init.rate_burst = rate_burst_;
    init.cc = cc_mode_;
    init.dcqcn = dcqcn_;
    init.sr = sr_;
    init.adp = adp_;
    entry->qp = std::make_unique<transport::Qp>(init, worker);
    if (trace_ != nullptr) entry->qp->SetTrace(trace_->SinkFor(h.qpn, worker->index));
    entry->worker = worker;
    ++worker->qps;
    entry->pd = refs.holds;
    entry->send_cq = refs.send_cq != nullptr ? a.send_cq : 0;
    entry->recv_cq = refs.recv_cq != nullptr ? a.recv_cq : 0;
    entry->srq = a.srq;
    objects_.AddQp(h.qpn, std::move(entry), refs);
  });
  if (!s.ok()) return s;
  if (dead()) return DeadError();
  return h;
}

int Device::ModifyQp(uint32_t qpn, const transport::QpAttr& attr, uint32_t mask) {
  // A dead device's QPs may only be reset or left in error.
  if (dead() && !((mask & transport::kAttrState) &&
                  (attr.state == transport::QpState::kErr || attr.state == transport::QpState::kReset))) {
    return EIO;
  }
  int rc = 0;
  RunOnWorker([&] {
    QpEntry* e = objects_.FindQp(qpn);
    if (e == nullptr) {
      rc = EINVAL;
      return;
    }
    rc = e->qp->Modify(attr, mask);
    if (rc == 0) Activate(e);
    DeliverEvents(e);
  });
  return rc;
}

absl::StatusOr<transport::QpAttr> Device::QueryQp(uint32_t qpn) {
  absl::StatusOr<transport::QpAttr> r = absl::NotFoundError("no such QP");
  RunOnWorker([&] {
    if (QpEntry* e = objects_.FindQp(qpn); e != nullptr) r = e->qp->attr();
  });
  return r;
}

absl::Status Device::DestroyQp(uint32_t qpn) {
  absl::Status s;
  RunOnWorker([&] { s = DestroyQpStopped(qpn); });
  return s;
}

absl::Status Device::DestroyQpStopped(uint32_t qpn) {
  if (absl::Status s = objects_.CheckQpRemovable(qpn); !s.ok()) return s;
  QpEntry* e = objects_.FindQp(qpn);
  SendBeforeDestroy(e);
  if (e->active) std::erase(e->worker->active, e);
  if (e->timer_at != 0) --e->worker->armed;  // its timer entry is dropped when it comes up
  --e->worker->qps;
  if (measure_latency_) PrintLatency(port_.name, qpn, *e->qp);
  objects_.RemoveQp(qpn);
  return absl::OkStatus();
}

void Device::PrintLatency(const std::string& dev, uint32_t qpn, const transport::Qp& qp) {
  for (int c = 0; c < transport::Qp::kNumLatClasses; ++c) {
    const lab::LatencyHistogram* h = qp.latency(c);
    if (h == nullptr || h->count() == 0) continue;
    lab::PrintLatencyLine(stderr, dev.c_str(), qpn, c, "post to completion entered", *h);
  }
}

void Device::PeekQpLatency(
    const std::function<void(uint32_t qpn, int cls, const lab::LatencyHistogram&)>& f) {
  // Under the control lock (the QP cannot go meanwhile); the histograms are
  // read while the workers count into them (Peek).
  std::lock_guard<std::mutex> l(ctl_mu_);
  for (const auto& [qpn, e] : objects_.qps) {
    for (int c = 0; c < transport::Qp::kNumLatClasses; ++c) {
      if (const lab::LatencyHistogram* h = e->qp->latency(c); h != nullptr) f(qpn, c, *h);
    }
  }
}

int Device::AttachMcast(uint32_t qpn, const wire::Ipv6Addr& mgid) {
  if (dead()) return EIO;
  int rc = EINVAL;
  RunOnWorker([&] {
    QpEntry* e = objects_.FindQp(qpn);
    // Only UD QPs join groups (ib_attach_mcast: EINVAL otherwise).
    if (e != nullptr && e->qp->type() == transport::QpType::kUd) rc = objects_.mcast.Attach(mgid, qpn);
  });
  return rc;
}

int Device::DetachMcast(uint32_t qpn, const wire::Ipv6Addr& mgid) {
  int rc = EINVAL;
  RunOnWorker([&] { rc = objects_.mcast.Detach(mgid, qpn); });
  return rc;
}

absl::StatusOr<SrqHandle> Device::CreateSrq(uint32_t pd, uint32_t max_wr, uint32_t max_sge, uint32_t limit,
                                            EventSink* events, uint64_t cookie, uint32_t xrcd, uint32_t cq) {
  if (dead()) return DeadError();
  if (max_wr == 0 || max_wr > Limits::kMaxQpWr || max_sge == 0 || max_sge > Limits::kMaxSge ||
      limit > max_wr) {
    return absl::InvalidArgumentError("SRQ attributes out of range");
  }
  SrqHandle h;
  h.max_wr = queue::round_up_pow2(max_wr);
  h.max_sge = max_sge;
  const uint32_t stride = sizeof(queue::RecvWqe) + max_sge * sizeof(queue::Sge);
  auto shm = queue::ShmRegion::Create("droce-srq", queue::ring_bytes(h.max_wr, stride));
  if (!shm.ok()) return shm.status();
  h.ring = queue::Ring::Init(shm->data(), h.max_wr, stride);
  h.map = {shm->fd(), shm->size()};
  SrqEntry e;
  e.srq = std::make_unique<transport::Srq>(h.ring, max_sge, workers_.size() > 1);
  e.srq->SetLimit(limit);
  e.shm = std::move(*shm);
  e.pd = pd;
  e.xrcd = xrcd;
  e.cq = cq;
  e.events = events;
  e.cookie = cookie;
  e.owner = CurrentOwner();
  absl::StatusOr<uint32_t> id;
  RunOnWorker([&] { id = objects_.AddSrq(std::move(e)); });
  if (!id.ok()) return id.status();
  h.id = *id;
  if (dead()) return DeadError();
  return h;
}

int Device::ModifySrq(uint32_t id, uint32_t limit) {
  int rc = 0;
  RunOnWorker([&] {
    SrqEntry* e = objects_.FindSrq(id);
    if (e == nullptr) rc = EINVAL;
    else e->srq->SetLimit(limit);
  });
  return rc;
}

absl::StatusOr<uint32_t> Device::QuerySrqLimit(uint32_t id) {
  absl::StatusOr<uint32_t> r = absl::NotFoundError("no such SRQ");
  RunOnWorker([&] {
    if (SrqEntry* e = objects_.FindSrq(id); e != nullptr) r = e->srq->limit();
  });
  return r;
}

absl::Status Device::DestroySrq(uint32_t id) {
  absl::Status s;
  RunOnWorker([&] { s = objects_.DestroySrq(id); });
  return s;
}

absl::StatusOr<uint32_t> Device::CreateAh(uint32_t pd, const transport::AddressVector& av) {
  if (dead()) return DeadError();
  transport::AddressHandle ah;
  ah.av = av;
  ah.pd = pd;
  if (!transport::av_destination(av, TransportPort(), transport::AvUse::kUdHandle, &ah.dgid)) {
    return absl::InvalidArgumentError(
        "address handle needs a GRH, an IPv4-mapped GID with sgid_index 0 or an IPv6 GID with sgid_index 1");
  }
  const uint64_t owner = CurrentOwner();
  absl::StatusOr<uint32_t> r;
  RunOnWorker([&] { r = objects_.AddAh(ah, owner); });
  return r;
}

absl::Status Device::DestroyAh(uint32_t id) {
  absl::Status s;
  RunOnWorker([&] { s = objects_.DestroyAh(id); });
  return s;
}

const transport::AddressHandle* Device::FindAh(uint32_t id) { return objects_.FindAh(id); }

bool Device::InvalidateRkey(uint32_t rkey, uint32_t pd) {
  // Only type 2 memory windows are invalidatable; ordinary MRs are not
  // (droce has no fast-registration MRs).
  return objects_.mrs.Invalidate(rkey, pd);
}

absl::StatusOr<uint32_t> Device::AllocMw(uint32_t pd, uint8_t type) {
  if (dead()) return DeadError();
  const uint64_t owner = CurrentOwner();
  absl::StatusOr<uint32_t> r;
  RunOnWorker([&] { r = objects_.AllocMw(pd, type, owner); });
  return r;
}

absl::Status Device::DeallocMw(uint32_t rkey) {
  absl::Status s;
  RunOnWorker([&] { s = objects_.DeallocMw(rkey); });
  return s;
}

bool Device::FindXrcSrq(uint32_t srqn, transport::XrcSrqRef* out) { return objects_.FindXrcSrq(srqn, out); }

std::optional<uint64_t> Device::OwnerOf(ObjKind kind, uint32_t id) {
  // The control lock alone: the table changes only under it.
  std::lock_guard<std::mutex> l(ctl_mu_);
  return objects_.OwnerOf(kind, id);
}

OwnedObjects Device::Owned(uint64_t owner) {
  std::lock_guard<std::mutex> l(ctl_mu_);
  return objects_.Owned(owner);
}

size_t Device::DestroyAllOf(uint64_t owner,
                            const std::function<void(ObjKind, uint32_t, const absl::Status&)>& failed) {
  size_t gone = 0;
  // One stop of the workers for the lot: when it returns, no worker runs
  // anything the owner had, so its memory may go.
  RunOnWorker([&] {
    const OwnedObjects o = objects_.Owned(owner);
    for (uint32_t qpn : o.of(ObjKind::kQp)) objects_.mcast.DetachQp(qpn);
    for (int k = 0; k < kNumObjKinds; ++k) {
      const auto kind = static_cast<ObjKind>(k);
      for (uint32_t id : o.ids[k]) {
        absl::Status s;
        switch (kind) {
          case ObjKind::kQp: s = DestroyQpStopped(id); break;
          case ObjKind::kSrq: s = objects_.DestroySrq(id); break;
          case ObjKind::kAh: s = objects_.DestroyAh(id); break;
          case ObjKind::kMw: s = objects_.DeallocMw(id); break;
          case ObjKind::kMr: s = objects_.DeregMr(id); break;
          case ObjKind::kCq: s = objects_.DestroyCq(id); break;
          case ObjKind::kPd: s = objects_.DeallocPd(id); break;
        }
        if (s.ok()) ++gone;
        else failed(kind, id, s);
      }
    }
  });
  return gone;
}

void Device::DeliverEvents(QpEntry* e) {
  const uint32_t ev = e->qp->TakeEvents();
  if (ev != 0 && e->events != nullptr) {
    for (int t = 0; t < 32; ++t) {
      if (ev & (1u << t)) e->events->QpEvent(e->cookie, t);
    }
  }
  transport::Srq* srq = e->qp->srq();
  if (srq == nullptr) return;
  // An XRC target QP: the SRQ its last request named.
  const uint32_t srq_id = e->srq != 0 ? e->srq : e->qp->xrc_srq_id();
  const SrqEntry* se = objects_.FindSrq(srq_id);
  EventSink* sink = se != nullptr ? se->events : nullptr;
  if (srq->TakeLimitEvent() && sink != nullptr) sink->SrqEvent(se->cookie, 15 /* IBV_EVENT_SRQ_LIMIT_REACHED */);
  if (srq->TakeErrorEvent()) {
    // IBA 10.2.9.5: an SRQ in error takes every QP attached to it to the
    // error state (each then reports its last WQE). Those QPs may belong to
    // other workers: done with all of them stopped, after this turn.
    Bump(e->worker->stats.srq_err);
    if (sink != nullptr) sink->SrqEvent(se->cookie, 14 /* IBV_EVENT_SRQ_ERR */);
    e->worker->exclusive.push_back([this, id = srq_id] { FailSrqQps(id); });
  }
}

void Device::FailSrqQps(uint32_t srq) {
  transport::QpAttr err;
  err.state = transport::QpState::kErr;
  for (auto& [qpn, e] : objects_.qps) {
    if (e->srq != srq) continue;
    e->qp->Modify(err, transport::kAttrState);
    DeliverEvents(e.get());
    Activate(e.get());
  }
}

absl::Status Device::StartCapture(const lab::CaptureOptions& o) {
  std::lock_guard<std::mutex> l(capture_mu_);
  if (capture_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("a capture of ", port_.name, " to ", capture_->Status().file,
                                                      " is on: stop it first"));
  }
  // Whether the workers have a fault stage now (the same on every worker;
  // read with them stopped: a cleared stage goes on its worker's turn).
  bool fault = false;
  RunOnWorker([&] { fault = workers_[0]->fault != nullptr; });
  absl::StatusOr<std::unique_ptr<lab::Capture>> c = lab::Capture::Start(o, port_.name, fault);
  if (!c.ok()) return c.status();
  std::shared_ptr<lab::Capture> sc = *std::move(c);
  RunOnWorker([&] {
    for (const auto& w : workers_) w->capture = std::make_unique<CaptureTap>(sc);
  });
  capture_ = std::move(sc);
  Log(LogLevel::kInfo, "%s: capture to %s started", port_.name.c_str(), o.text.c_str());
  return absl::OkStatus();
}

absl::StatusOr<lab::CaptureStatus> Device::StopCapture() {
  std::lock_guard<std::mutex> l(capture_mu_);
  if (capture_ == nullptr) return absl::NotFoundError(absl::StrCat("no capture on ", port_.name));
  RunOnWorker([&] {
    for (const auto& w : workers_) w->capture.reset();
  });
  lab::CaptureStatus st = capture_->Status();
  capture_.reset();  // the last reference: the file is closed
  Log(LogLevel::kInfo, "%s: capture to %s stopped: %llu frames, %llu bytes", port_.name.c_str(), st.text.c_str(),
      static_cast<unsigned long long>(st.frames), static_cast<unsigned long long>(st.bytes));
  return st;
}

std::optional<lab::CaptureStatus> Device::CaptureState() {
  std::lock_guard<std::mutex> l(capture_mu_);
  if (capture_ == nullptr) return std::nullopt;
  return capture_->Status();
}

void Device::SetFaultRules(std::vector<lab::FaultRule> rules) {
  const size_t n = rules.size();
  RunOnWorker([&] {
    const uint64_t now = NowNs();
    for (size_t i = 0; i < workers_.size(); ++i) {
      Worker& w = *workers_[i];
      if (w.fault != nullptr) {
        w.fault->SetRules(rules, now);
      } else if (!rules.empty()) {
        w.fault = std::make_unique<FaultStage>(rules, i, dpdk_.pool(), now);
      }
    }
  });
  has_fault_rules_.store(n != 0, std::memory_order_relaxed);
  Log(LogLevel::kInfo, "%s: %u fault rule%s now", port_.name.c_str(), static_cast<unsigned>(n), n == 1 ? "" : "s");
}

std::vector<RuleTotals> Device::FaultRules() {
  std::vector<RuleTotals> out;
  RunOnWorker([&] {
    std::vector<const FaultStage*> stages;
    for (const auto& w : workers_) {
      if (w->fault) stages.push_back(w->fault.get());
    }
    out = SumRules(stages);
  });
  return out;
}

absl::Status Device::SetCongestionControl(uint32_t qpn, cc::CcMode mode, const cc::DcqcnParams& p) {
  bool found = qpn == 0;
  RunOnWorker([&] {
    if (qpn == 0) {
      cc_mode_ = mode;
      dcqcn_ = p;
    }
    for (auto& [n, e] : objects_.qps) {
      if (qpn != 0 && n != qpn) continue;
      e->qp->SetCongestionControl(mode, p);
      found = true;
    }
  });
  if (!found) return absl::NotFoundError(absl::StrCat(port_.name, " has no QP ", qpn));
  return absl::OkStatus();
}

std::vector<Device::CcRow> Device::CongestionControl() {
  std::vector<CcRow> out;
  RunOnWorker([&] {
    CcRow d;
    d.mode = cc_mode_;
    d.params = dcqcn_;
    out.push_back(d);
    for (const auto& [n, e] : objects_.qps) {
      const transport::Qp& q = *e->qp;
      const cc::ReactionPoint& rp = q.reaction_point();
      CcRow r;
      r.qpn = n;
      r.mode = q.cc_mode();
      r.params = q.dcqcn();
      r.limited = rp.active();
      r.rate_mbps = rp.rate_mbps();
      r.target_mbps = rp.target_mbps();
      r.alpha = rp.alpha();
      r.cuts = rp.cuts();
      r.increases = rp.increases();
      out.push_back(r);
    }
  });
  std::sort(out.begin() + 1, out.end(), [](const CcRow& a, const CcRow& b) { return a.qpn < b.qpn; });
  return out;
}

void Device::SetQpTraceSinks() {
  for (auto& [qpn, e] : objects_.qps) {
    e->qp->SetTrace(trace_ != nullptr ? trace_->SinkFor(qpn, e->worker->index) : nullptr);
  }
  for (auto& w : workers_) w->trace_turn = trace_ != nullptr ? trace_->TurnClockRing(static_cast<int>(w->index)) : nullptr;
}

absl::Status Device::StartTrace(const lab::TraceOptions& o) {
  std::lock_guard<std::mutex> l(trace_mu_);
  if (trace_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("a trace of ", port_.name, " (", trace_->Status().text,
                                                      ") is on: stop it first"));
  }
  absl::StatusOr<std::unique_ptr<lab::Trace>> t =
      lab::Trace::Start(o, port_.name, static_cast<int>(workers_.size()), EpochOffsetNs());
  if (!t.ok()) return t.status();
  RunOnWorker([&] {
    trace_ = *std::move(t);
    SetQpTraceSinks();
  });
  FlushTracesAtExitOnce();
  Log(LogLevel::kInfo, "%s: trace to %s started", port_.name.c_str(), o.text.c_str());
  return absl::OkStatus();
}

absl::StatusOr<lab::TraceStatus> Device::StopTrace() {
  std::lock_guard<std::mutex> l(trace_mu_);
  if (trace_ == nullptr) return absl::NotFoundError(absl::StrCat("no trace on ", port_.name));
  std::unique_ptr<lab::Trace> t;
  RunOnWorker([&] {
    t = std::move(trace_);
    SetQpTraceSinks();
  });
  const lab::TraceStatus st = t->Close();  // the last events written, the file closed
  t.reset();
  Log(LogLevel::kInfo, "%s: trace to %s stopped: %llu events (%llu lost)", port_.name.c_str(), st.text.c_str(),
      static_cast<unsigned long long>(st.events), static_cast<unsigned long long>(st.dropped));
  return st;
}

std::optional<lab::TraceStatus> Device::CloseTraceAtExit() {
  std::lock_guard<std::mutex> l(trace_mu_);
  if (trace_ == nullptr) return std::nullopt;
  // The trace stays: workers still running may record into its rings,
  // which nobody drains any more.
  trace_->Close();
  return trace_->Status();
}

std::optional<lab::TraceStatus> Device::TraceState() {
  std::lock_guard<std::mutex> l(trace_mu_);
  if (trace_ == nullptr) return std::nullopt;
  return trace_->Status();
}

std::vector<std::string> Device::FaultReport() {
  std::vector<std::string> out;
  RunOnWorker([&] {
    std::vector<const FaultStage*> stages;
    for (const auto& w : workers_) {
      if (w->fault) stages.push_back(w->fault.get());
    }
    out = SumFaultReports(stages);
  });
  return out;
}

std::string Device::LinkReport() {
  io::DpdkPort::Stats s;
  if (!ReadLinkStats(&s)) return {};
  std::string out = "link";
  for (const auto& f : io::DpdkPort::kStatFields) absl::StrAppend(&out, " ", f.name, " ", s.*f.field);
  return out;
}

Counters Device::ReadCounters() {
  Counters c;
  RunOnWorker([&] {
    for (const auto& w : workers_) {
      for (const CounterInfo& i : kCounterInfo) c.*i.field += w->stats.*i.field;
    }
  });
  return c;
}

Counters Device::PeekCounters() const {
  Counters c;
  for (const auto& w : workers_) {
    for (const CounterInfo& i : kCounterInfo) c.*i.field += Peek(w->stats.*i.field);
  }
  return c;
}

void Device::PeekQpCounters(const std::function<void(uint32_t, uint64_t, const QpCounters&)>& f) {
  // ctl_mu_ alone: the tables change only under it (RunOnWorker), and the
  // counters are read with Peek, so the workers keep running. The lock is
  // held for the copy only (a few µs per 1,000 QPs), not while `f` formats.
  struct Row {
    uint32_t qpn;
    uint64_t owner;
    QpCounters c;
  };
  std::vector<Row> rows;
  {
    std::lock_guard<std::mutex> l(ctl_mu_);
    rows.reserve(objects_.qps.size());
    for (const auto& [qpn, e] : objects_.qps) {
      Row& r = rows.emplace_back(Row{qpn, e->owner, {}});
      const QpCounters& live = e->qp->counters();
      for (size_t i = 0; i < kNumQpCounters; ++i) r.c.values[i] = Peek(live.values[i]);
    }
  }
  for (const Row& r : rows) f(r.qpn, r.owner, r.c);
}

Device::Resources Device::ReadResources() {
  Resources r;
  RunOnWorker([&] {
    r.qps.reserve(objects_.qps.size());
    for (const auto& [qpn, e] : objects_.qps) {
      const transport::Qp& q = *e->qp;
      r.qps.push_back({qpn, e->pd, e->send_cq, e->recv_cq, e->srq, q.attr().dest_qpn, q.next_psn(),
                       q.expected_psn(), q.type(), q.state(), q.attr().path_mtu, e->owner,
                       q.retrans_timer(), q.RetransTimeoutNs(), q.rtt().has_sample() ? q.rtt().srtt_ns() : 0});
    }
    for (const auto& [id, c] : objects_.cqs) r.cqs.push_back({id, c.region->capacity(), c.users});
    for (const auto& [id, pd] : objects_.pds) r.pds.push_back({id, pd.uses});
    objects_.mrs.ForEachMr([&](const mem::Mr& mr) { r.mrs.push_back(mr); });
  });
  auto by = [](auto& v, auto key) { std::sort(v.begin(), v.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); }); };
  by(r.qps, [](const QpRes& q) { return q.qpn; });
  by(r.cqs, [](const CqRes& c) { return c.id; });
  by(r.pds, [](const PdRes& p) { return p.id; });
  return r;
}

absl::StatusOr<QpCounters> Device::ReadQpCounters(uint32_t qpn) {
  absl::StatusOr<QpCounters> r = absl::NotFoundError("no such QP");
  RunOnWorker([&] {
    if (auto it = objects_.qps.find(qpn); it != objects_.qps.end()) r = it->second->qp->counters();
  });
  return r;
}

}  // namespace droce::engine
