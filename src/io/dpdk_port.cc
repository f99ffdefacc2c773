#include "io/dpdk_port.h"

#include <dirent.h>
#include <getopt.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <rte_bus_vdev.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_log.h>
#include <rte_mbuf.h>
#include <rte_mbuf_pool_ops.h>
#include <rte_mempool.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/background.h"

namespace droce::io {
namespace {

int rte_level(LogLevel l) {
  switch (l) {
    case LogLevel::kError: return RTE_LOG_ERR;
    case LogLevel::kWarning: return RTE_LOG_WARNING;
    case LogLevel::kInfo: return RTE_LOG_INFO;
    case LogLevel::kDebug: return RTE_LOG_DEBUG;
  }
  return RTE_LOG_ERR;
}

// "0@(a,b,...)": one lcore that may float over every CPU in our affinity mask,
// so that EAL does not pin the engine to CPU 0 in every process.
std::string lcores_arg() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<std::string> cpus;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int i = 0; i < CPU_SETSIZE; ++i) {
      if (CPU_ISSET(i, &set)) cpus.push_back(std::to_string(i));
    }
  }
  if (cpus.empty()) cpus.push_back("0");
  return absl::StrCat("0@(", absl::StrJoin(cpus, ","), ")");
}

bool g_eal_hugepages = false;

// Free hugepage memory of the default size, in bytes, if a hugetlbfs is
// mounted to take it from; 0 otherwise.
uint64_t free_hugepage_bytes() {
  bool mounted = false;
  {
    std::ifstream mounts("/proc/mounts");
    std::string line;
    while (std::getline(mounts, line)) {
      std::vector<std::string> f = absl::StrSplit(line, ' ');
      if (f.size() > 2 && f[2] == "hugetlbfs") mounted = true;
    }
  }
  if (!mounted) return 0;
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  uint64_t free_pages = 0, page_kb = 0;
  while (std::getline(meminfo, line)) {
    std::vector<std::string> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (f.size() < 2) continue;
    if (f[0] == "HugePages_Free:") (void)absl::SimpleAtoi(f[1], &free_pages);
    if (f[0] == "Hugepagesize:") (void)absl::SimpleAtoi(f[1], &page_kb);
  }
  return free_pages * page_kb * 1024;
}

// What one droce process needs at least before hugepages are worth using:
// the mbuf pool (8191 mbufs of about 4.6 KiB) plus EAL's own heap.
constexpr uint64_t kMinHugepageBytes = 128ull << 20;

// "iface=NAME" among a vdev's comma-separated arguments.
std::string devarg_value(const std::string& params, const std::string& key) {
  for (absl::string_view kv : absl::StrSplit(params, ',')) {
    if (kv.size() > key.size() && kv.substr(0, key.size()) == key && kv[key.size()] == '=') {
      return std::string(kv.substr(key.size() + 1));
    }
  }
  return "";
}

// The MTU of a kernel network interface in this network namespace; 0 if it
// cannot be read.
uint32_t kernel_mtu(const std::string& iface) {
  if (iface.empty() || iface.size() >= IFNAMSIZ) return 0;
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  ifreq ifr{};
  std::memcpy(ifr.ifr_name, iface.data(), iface.size());
  const int rc = ioctl(fd, SIOCGIFMTU, &ifr);
  close(fd);
  return rc == 0 && ifr.ifr_mtu > 0 ? static_cast<uint32_t>(ifr.ifr_mtu) : 0;
}

// DPDK names a PCI port by its full address, domain included.
std::string pci_port_name(const std::string& devargs) {
  std::string addr = devargs.substr(0, devargs.find(','));
  if (std::count(addr.begin(), addr.end(), ':') == 1) addr = "0000:" + addr;
  return addr;
}

// An mbuf pool whose objects lie back to back at a fixed stride from the
// first one. The af_xdp PMD registers the pool's memory as the AF_XDP UMEM by
// that arithmetic (base + index * object size); rte_pktmbuf_pool_create keeps
// objects from crossing page boundaries, which on 4 KiB pages (no hugepages)
// spreads them one per page, so that mbufs past ~60% of the pool fall
// outside the UMEM: the kernel rejects them as invalid Tx descriptors and the
// link goes silent. AF_XDP needs no IOVA-contiguous objects (the kernel
// copies, or maps the UMEM pages itself), so give up that property here.
rte_mempool* create_packed_pool(const std::string& name, uint32_t n, uint16_t buf_size) {
  const unsigned elt = sizeof(rte_mbuf) + buf_size;
  rte_mempool* mp = rte_mempool_create_empty(name.c_str(), n, elt, 256, sizeof(rte_pktmbuf_pool_private),
                                             SOCKET_ID_ANY, RTE_MEMPOOL_F_NO_IOVA_CONTIG);
  if (mp == nullptr) return nullptr;
  rte_pktmbuf_pool_private priv{};
  priv.mbuf_data_room_size = buf_size;
  priv.mbuf_priv_size = 0;
  if (rte_mempool_set_ops_byname(mp, rte_mbuf_best_mempool_ops(), nullptr) != 0) {
    rte_mempool_free(mp);
    return nullptr;
  }
  rte_pktmbuf_pool_init(mp, &priv);
  if (rte_mempool_populate_default(mp) < 0) {
    rte_mempool_free(mp);
    return nullptr;
  }
  rte_mempool_obj_iter(mp, rte_pktmbuf_init, nullptr);
  return mp;
}

// This process's EAL runtime directory, once InitEal made it.
std::string& runtime_dir() {
  static std::string* dir = new std::string();  // read by an atexit handler: never destroyed
  return *dir;
}

// Where EAL puts the runtime directories (eal_create_runtime_dir).
std::string eal_runtime_base() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  const std::string dir = getuid() == 0 ? "/var/run" : (xdg != nullptr && *xdg != '\0' ? xdg : "/tmp");
  return dir + "/dpdk";
}

// The files of one runtime directory (sockets, no subdirectories).
void remove_dir_files(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return;
  while (const dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      unlink((dir + "/" + e->d_name).c_str());
    }
  }
  closedir(d);
}

}  // namespace

bool IsPciAddress(const std::string& devargs) {
  static const std::regex re("^([0-9a-fA-F]{4}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\\.[0-7](,.*)?$");
  return std::regex_match(devargs, re);
}

bool EalUsesHugepages() { return g_eal_hugepages; }

absl::Status InitEal(const EalOptions& opts) {
  bool huge = opts.hugepages == HugepageMode::kOn;
  if (opts.hugepages == HugepageMode::kAuto) huge = free_hugepage_bytes() >= kMinHugepageBytes;
  std::vector<std::string> args = {"droce"};
  if (huge) {
    // No runtime files, hugepage files unlinked at once: nothing left behind
    // and several droce processes side by side, as with --no-huge.
    args.push_back("--in-memory");
  } else {
    // (--in-memory conflicts with --no-huge; --no-shconf gives the same.)
    for (const char* a : {"--no-huge", "-m", "256", "--no-shconf"}) args.push_back(a);
  }
  if (!opts.telemetry) args.push_back("--no-telemetry");
  args.push_back(absl::StrCat("--file-prefix=droce-", getpid()));
  args.push_back(absl::StrCat("--lcores=", lcores_arg()));
  args.push_back(absl::StrCat("--log-level=", rte_level(opts.log_level)));
  if (IsPciAddress(opts.link)) {
    // Probe only the NIC named by the link (with its driver arguments), never
    // the machine's other PCI devices.
    args.push_back("-a");
    args.push_back(opts.link);
  } else {
    args.push_back("--no-pci");
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  // EAL parses with getopt; keep the application's getopt state intact.
  const int saved_optind = optind, saved_opterr = opterr, saved_optopt = optopt;
  char* saved_optarg = optarg;
  const int rc = rte_eal_init(static_cast<int>(argv.size() - 1), argv.data());
  optind = saved_optind;
  opterr = saved_opterr;
  optopt = saved_optopt;
  optarg = saved_optarg;
  if (rc < 0) {
    return absl::InternalError(absl::StrCat("DPDK EAL init failed: ", rte_strerror(rte_errno)));
  }
  rte_log_set_global_level(static_cast<uint32_t>(rte_level(opts.log_level)));
  // EAL leaves its runtime directory behind even with --no-shconf; remove it
  // when the process exits (the telemetry sockets too: their own atexit runs
  // after this one and finds them gone, which it ignores).
  runtime_dir() = rte_eal_get_runtime_dir();
  std::atexit(RemoveEalRuntimeDir);
  g_eal_hugepages = huge;
  return absl::OkStatus();
}

void RemoveEalRuntimeDir() {
  if (runtime_dir().empty()) return;
  remove_dir_files(runtime_dir());
  rmdir(runtime_dir().c_str());
}

int SweepStaleEalRuntimeDirs() {
  const std::string base = eal_runtime_base();
  DIR* d = opendir(base.c_str());
  if (d == nullptr) return 0;
  int removed = 0;
  while (const dirent* e = readdir(d)) {
    const std::string_view name = e->d_name;
    constexpr std::string_view kPrefix = "droce-";
    int pid = 0;
    if (!name.starts_with(kPrefix) || !absl::SimpleAtoi(absl::string_view(e->d_name + kPrefix.size()), &pid) ||
        pid <= 0 || pid == getpid()) {
      continue;
    }
    // EPERM: alive, another user's. Only ESRCH says the process is gone.
    if (kill(pid, 0) == 0 || errno != ESRCH) continue;
    const std::string dir = base + "/" + std::string(name);
    remove_dir_files(dir);
    if (rmdir(dir.c_str()) == 0) ++removed;
  }
  closedir(d);
  return removed;
}

absl::Status DpdkPort::Open(const PortOptions& opts) {
  const std::string& devargs = opts.devargs;
  const std::string name = devargs.substr(0, devargs.find(','));
  const std::string params = devargs.find(',') == std::string::npos ? "" : devargs.substr(devargs.find(',') + 1);
  std::string vdev_params = params;
  if (name.rfind("net_af_xdp", 0) == 0 && devarg_value(params, "busy_budget").empty()) {
    // The PMD's default preferred busy polling (busy_budget=64) leaves the
    // kernel's NAPI processing to the socket owner's recvfrom calls; with the
    // kernel's defaults (napi_defer_hard_irqs=0) and an engine that backs off
    // when idle, frames then wait for tens of milliseconds and RC QPs time
    // out (measured on veth: 64 us/iteration without it, retransmission
    // storms with it). The engine polls the rings itself: turn it off unless
    // the devargs ask for it.
    vdev_params += vdev_params.empty() ? "busy_budget=0" : ",busy_budget=0";
  }
  if (name.rfind("net_af_packet", 0) == 0 && opts.queues > 1 && devarg_value(params, "qpairs").empty()) {
    // af_packet makes one socket per queue pair, and only as many as asked.
    vdev_params += absl::StrCat(vdev_params.empty() ? "" : ",", "qpairs=", opts.queues);
  }
  // The memif client lays out the shared memory, and with the PMD's
  // 2048-byte buffers a frame of a 4096-byte path MTU took three
  // descriptors, each side copying it in three pieces: 64 KiB RDMA WRITE at
  // MTU 4096 went from 27-36 to 35-42 Gb/s with one buffer per frame
  // (docs/PERFORMANCE.md). Only where frames need it: larger buffers spread
  // the ring over more pages (a little more latency at the tail). The
  // server copies into whatever buffers the client's descriptors give it.
  constexpr uint32_t kMemifDefaultBuffer = 2048;
  constexpr uint32_t kFrameOverhead = 256;  // Ethernet, VLAN, IPv6, UDP, BTH, RETH, ImmDt, ICRC, and to spare
  const uint32_t memif_buffer =
      std::min<uint32_t>(opts.mbuf_data_room, opts.max_path_mtu != 0 ? opts.max_path_mtu + kFrameOverhead
                                                                      : opts.mbuf_data_room);
  if (name.rfind("net_memif", 0) == 0 && devarg_value(params, "role") == "client" &&
      devarg_value(params, "bsize").empty() && memif_buffer > kMemifDefaultBuffer) {
    vdev_params += absl::StrCat(vdev_params.empty() ? "" : ",", "bsize=", memif_buffer);
  }
  if (name.rfind("net_", 0) == 0 || name.rfind("eth_", 0) == 0) {
    if (int rc = rte_vdev_init(name.c_str(), vdev_params.c_str()); rc != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("link '", devargs, "': cannot create the DPDK device (unknown driver or bad arguments)"));
    }
    memif_ = name.rfind("net_memif", 0) == 0;
    virtual_mac_ = memif_ || name.rfind("net_ring", 0) == 0;
    reconnects_ = name.rfind("net_memif", 0) == 0 && devarg_value(params, "role") == "client";
    iface_ = devarg_value(params, "iface");
  }
  const std::string port_name = IsPciAddress(devargs) ? pci_port_name(devargs) : name;
  if (rte_eth_dev_get_port_by_name(port_name.c_str(), &port_id_) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "link '", devargs, "': no such DPDK port",
        IsPciAddress(devargs) ? " (is the NIC bound to vfio-pci? see docs/CONFIG.md)" : ""));
  }
  rte_eth_dev_info info{};
  if (int rc = rte_eth_dev_info_get(port_id_, &info); rc != 0) {
    return absl::InternalError(absl::StrCat("dev_info: ", rte_strerror(-rc)));
  }
  driver_ = info.driver_name != nullptr ? info.driver_name : "";
  if (info.max_rx_queues < opts.queues || info.max_tx_queues < opts.queues) {
    return absl::InvalidArgumentError(absl::StrCat(
        "link '", devargs, "': ", opts.queues, " workers need as many rx and tx queues, and the port (driver ",
        driver_, ") has ", info.max_rx_queues, " rx and ", info.max_tx_queues,
        " tx (af_xdp: queue_count=N on an interface with N queues; see docs/CONFIG.md)"));
  }
  uint16_t room = opts.mbuf_data_room;
  if (driver_ == "net_af_xdp") {
    // The PMD hands the mbufs themselves to the kernel as AF_XDP frames, and
    // an XDP frame (mbuf header, headroom and data) must fit in one page.
    room = std::min<uint16_t>(room, RTE_MBUF_DEFAULT_DATAROOM);
  }
  if (driver_ == "net_af_packet") {
    // Each ring slot (framesz, less a 32-byte header) must fit one mbuf: a
    // larger framesz for jumbo frames needs larger mbufs.
    uint32_t framesz = 0;
    if (absl::SimpleAtoi(devarg_value(params, "framesz"), &framesz) && framesz > 32 && framesz <= 16384) {
      room = std::max<uint16_t>(room, static_cast<uint16_t>(framesz - 32));
    }
  }
  data_room_ = room;
  const std::string pool_name = absl::StrCat("droce_pool_", port_id_);
  const uint16_t buf_size = static_cast<uint16_t>(data_room_ + RTE_PKTMBUF_HEADROOM);
  // Every further queue pair holds up to 2048 more mbufs in its descriptors.
  const uint32_t nb_mbufs = opts.nb_mbufs + (opts.queues - 1u) * 2048u;
  pool_ = driver_ == "net_af_xdp" ? create_packed_pool(pool_name, nb_mbufs, buf_size)
                                  : rte_pktmbuf_pool_create(pool_name.c_str(), nb_mbufs, 256, 0, buf_size,
                                                            SOCKET_ID_ANY);
  if (pool_ == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("mbuf pool: ", rte_strerror(rte_errno)));
  }
  rte_eth_conf conf{};
  if (int rc = rte_eth_dev_configure(port_id_, opts.queues, opts.queues, &conf); rc != 0) {
    return absl::InternalError(absl::StrCat("configure: ", rte_strerror(-rc)));
  }
  uint16_t nrx = opts.rx_desc, ntx = opts.tx_desc;
  rte_eth_dev_adjust_nb_rx_tx_desc(port_id_, &nrx, &ntx);
  const int socket = rte_eth_dev_socket_id(port_id_);
  for (uint16_t q = 0; q < opts.queues; ++q) {
    if (int rc = rte_eth_rx_queue_setup(port_id_, q, nrx, socket < 0 ? SOCKET_ID_ANY : socket, nullptr, pool_);
        rc != 0) {
      return absl::InternalError(absl::StrCat("rx queue ", q, ": ", rte_strerror(-rc)));
    }
    if (int rc = rte_eth_tx_queue_setup(port_id_, q, ntx, socket < 0 ? SOCKET_ID_ANY : socket, nullptr);
        rc != 0) {
      return absl::InternalError(absl::StrCat("tx queue ", q, ": ", rte_strerror(-rc)));
    }
  }
  if (int rc = rte_eth_dev_start(port_id_); rc != 0) {
    // A memif client whose server is not listening yet: the link is down
    // until Reconnect() gets through.
    if (!reconnects_) return absl::InternalError(absl::StrCat("start: ", rte_strerror(-rc)));
  } else {
    started_ = true;
  }
  rte_eth_promiscuous_enable(port_id_);  // not every vdev supports it; harmless
  rte_ether_addr a{};
  rte_eth_macaddr_get(port_id_, &a);
  std::memcpy(mac_.data(), a.addr_bytes, 6);
  // af_packet, af_xdp and tap sit on a kernel interface whose MTU is the
  // real bound (DPDK reports its own default of 1500 for them); other ports
  // report theirs.
  uint16_t mtu = 1500;
  if (const uint32_t k = kernel_mtu(iface_); k != 0) {
    link_mtu_ = k;
  } else if (rte_eth_dev_get_mtu(port_id_, &mtu) == 0) {
    link_mtu_ = mtu;
  }
  // A frame must also fit one mbuf (and, on af_packet, one slot of the
  // PMD's packet ring, framesz bytes less its 32-byte slot header: bigger
  // frames are dropped on transmit), with an Ethernet header and a VLAN tag.
  uint32_t frame_max = data_room_;
  if (driver_ == "net_af_packet") {
    uint32_t framesz = 2048, v = 0;  // the PMD's default
    if (absl::SimpleAtoi(devarg_value(params, "framesz"), &v) && v != 0) framesz = v;
    frame_max = std::min(frame_max, framesz > 32 ? framesz - 32 : 0);
  }
  const uint32_t overhead = wire::kEthLen + wire::kVlanLen;
  link_mtu_ = std::min(link_mtu_, frame_max > overhead ? frame_max - overhead : 0);
  open_ = true;
  return absl::OkStatus();
}

absl::Status DpdkPort::SetMac(const wire::MacAddr& mac) {
  rte_ether_addr a{};
  std::memcpy(a.addr_bytes, mac.data(), 6);
  // af_packet and af_xdp sit on a kernel interface that the kernel keeps
  // using: their PMDs would change that interface's own MAC (SIOCSIFHWADDR)
  // under the kernel's feet and its neighbours' caches. droce instead sends
  // from its address and receives frames to it in promiscuous mode, as a
  // second host on the wire. Other virtual ports may not support changing
  // it either; droce then does the same.
  if (driver_ != "net_af_packet" && driver_ != "net_af_xdp") rte_eth_dev_default_mac_addr_set(port_id_, &a);
  mac_ = mac;
  return absl::OkStatus();
}

DpdkPort::LinkState DpdkPort::PollLink() {
  if (!iface_.empty() && iface_.size() < IFNAMSIZ) {
    if (ctl_fd_ < 0) ctl_fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (ctl_fd_ < 0) return LinkState::kUnknown;
    ifreq ifr{};
    std::memcpy(ifr.ifr_name, iface_.data(), iface_.size());
    if (ioctl(ctl_fd_, SIOCGIFFLAGS, &ifr) != 0) return errno == ENODEV ? LinkState::kGone : LinkState::kUnknown;
    return (ifr.ifr_flags & IFF_UP) && (ifr.ifr_flags & IFF_RUNNING) ? LinkState::kUp : LinkState::kDown;
  }
  rte_eth_link link{};
  if (rte_eth_link_get_nowait(port_id_, &link) != 0) return LinkState::kUnknown;
  return link.link_status == RTE_ETH_LINK_UP ? LinkState::kUp : LinkState::kDown;
}

void DpdkPort::PrefaultSharedMemory() {
  if (!memif_) return;
  // On a thread of its own, at SCHED_IDLE: populating 4-9 MB takes 1-5 ms
  // here, a stall the worker's turn should not take just when the link
  // comes up and the first exchanges (ARP, CM) are due.
  std::thread([] {
    pthread_setname_np(pthread_self(), "droce-prefault");
    MakeThreadBackground();
    // The PMD's regions are memfds named memif_region_N; it exposes no
    // addresses, so they are found among this process's mappings. One the
    // PMD unmaps meanwhile (the link went down again) fails with ENOMEM.
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
      if (line.find("/memfd:memif_region_") == std::string::npos) continue;
      uintptr_t lo = 0, hi = 0;
      if (std::sscanf(line.c_str(), "%" SCNxPTR "-%" SCNxPTR, &lo, &hi) != 2 || hi <= lo) continue;
      // One byte of each page read through process_vm_readv on this very
      // process: the kernel faults the page in (a shared, writable memfd
      // mapping gets a writable entry on a read fault), and a range the PMD
      // unmaps meanwhile is an EFAULT, not a SIGSEGV. Not
      // MADV_POPULATE_WRITE: on this platform's PVM guest kernel it killed
      // the process now and then with SIGSEGV (SEGV_ACCERR on the syscall
      // instruction itself; cm_fi_pingpong_msg under scripts/stress.sh).
      constexpr uintptr_t kPage = 4096;
      constexpr size_t kBatch = 512;
      char sink[kBatch];
      iovec local{sink, sizeof(sink)};
      iovec remote[kBatch];
      const pid_t self = getpid();
      for (uintptr_t a = lo; a < hi;) {
        size_t n = 0;
        for (; n < kBatch && a < hi; ++n, a += kPage) remote[n] = {reinterpret_cast<void*>(a), 1};
        local.iov_len = n;
        if (process_vm_readv(self, &local, 1, remote, n, 0) < 0) break;  // unmapped meanwhile
      }
    }
  }).detach();
}

bool DpdkPort::ReadStats(Stats* s) const {
  if (!open_) return false;
  rte_eth_stats st{};
  if (rte_eth_stats_get(port_id_, &st) != 0) return false;
  const Stats raw{st.ipackets, st.opackets, st.imissed, st.ierrors, st.oerrors, st.rx_nombuf};
  std::lock_guard<std::mutex> lock(stats_mu_);
  for (const StatField& f : kStatFields) {
    if (raw.*f.field < stats_raw_.*f.field) stats_base_.*f.field += stats_raw_.*f.field;  // restarted
    stats_raw_.*f.field = raw.*f.field;
    s->*f.field = stats_base_.*f.field + raw.*f.field;
  }
  return true;
}

bool DpdkPort::Reconnect() {
  if (!reconnects_) return started_;
  // Each failed try logs "Failed to connect socket" at ERR: the first one
  // (in Open) is worth seeing, a retry every 100 ms is not.
  const int type = rte_log_register("pmd.net.memif");
  const int level = type >= 0 ? rte_log_get_level(type) : -1;
  if (level > 0) rte_log_set_level(type, RTE_LOG_CRIT);
  Stats carried;
  (void)ReadStats(&carried);  // what came before the stop restarts the PMD's counts
  if (started_) rte_eth_dev_stop(port_id_);
  started_ = rte_eth_dev_start(port_id_) == 0;
  if (level > 0) rte_log_set_level(type, static_cast<uint32_t>(level));
  return started_;
}

void DpdkPort::Close() {
  if (ctl_fd_ >= 0) close(ctl_fd_);
  ctl_fd_ = -1;
  if (!open_) return;
  rte_eth_dev_stop(port_id_);
  rte_eth_dev_close(port_id_);
  open_ = false;
}

}  // namespace droce::io
