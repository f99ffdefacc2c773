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
    workers_.push_back(std::move(w));
  }
  // The lab's hooks asked for from the start (DROCE_FAULT, DROCE_CAPTURE,
  // DROCE_TRACE).
  if (absl::Status s = StartLab(cfg); !s.ok()) return s;
  // QPNs start at a random place, as a kernel's move on from process to
  // process: a peer's CM refuses a REQ from a (CA GUID, QPN) it still holds
  // in timewait as stale (Linux: cm_insert_remote_qpn, REJ reason 10), and
  // every process here would otherwise hand out 0x11 first.
  objects_.StartQpnsAt(0x11 + std::random_device{}() % (0xFFFF00 - 0x11));
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

void Device::Shutdown(const char* why) {
  RunOnWorker([&] {
    shutting_down_ = true;  // a requested stop, not a failure: logged as such
    EnterFatal(why);
  });
}

uint64_t Device::NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

}  // namespace droce::engine
