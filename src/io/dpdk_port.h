// The packet-I/O seam on DPDK: EAL bring-up (hugepages when the machine has
// them, anonymous memory otherwise), one mbuf pool and one port with an
// rx/tx queue pair per worker. Cold code only; the burst calls are inline DPDK functions
// used directly by the worker loop.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "common/log.h"
#include "config/settings.h"
#include "wire/frame.h"

struct rte_mempool;

namespace droce::io {

// The setting's own type (DROCE_HUGEPAGES), in the DPDK-free parser.
using HugepageMode = config::HugepageMode;

struct EalOptions {
  LogLevel log_level = LogLevel::kError;
  // The link's devargs: a PCI address ("0000:01:00.0[,args]") makes EAL probe
  // that one device (allow-list); anything else runs EAL with --no-pci.
  std::string link;
  HugepageMode hugepages = HugepageMode::kAuto;
  // DPDK's telemetry socket (<runtime dir>/dpdk_telemetry.v2); off: --no-telemetry.
  bool telemetry = false;
};

// Whether a link string names a PCI device ("DDDD:BB:DD.F" or "BB:DD.F").
bool IsPciAddress(const std::string& devargs);

// Initialises DPDK's EAL once per process, on the calling thread (which EAL
// then treats as its main lcore). No shared config files (--no-shconf, or
// --in-memory with hugepages), no PCI probing unless the link is a PCI
// device, a per-process file prefix, lcore 0 allowed on every CPU this
// process may use.
absl::Status InitEal(const EalOptions& opts);
// After InitEal: whether EAL runs on hugepages.
bool EalUsesHugepages();

// EAL makes a runtime directory per process (<base>/droce-<pid>, base
// /var/run/dpdk for root, else $XDG_RUNTIME_DIR/dpdk or /tmp/dpdk) even with
// --no-shconf/--in-memory, holding at most the telemetry sockets, and never
// removes it. Removes this process's (its files, then the directory); a
// no-op before InitEal. Runs at exit (atexit); a program that leaves with
// _exit (droced) calls it itself.
void RemoveEalRuntimeDir();
// Removes the droce-<pid> directories under the base whose process is gone
// (killed, or exited without RemoveEalRuntimeDir): a long-running droced
// calls it at start so that restarts and crashes do not pile them up. A
// directory whose pid was reused by a live process stays. Returns how many
// were removed.
int SweepStaleEalRuntimeDirs();

struct PortOptions {
  std::string devargs;     // e.g. "net_memif0,role=server,socket=/tmp/x.sock"
  uint16_t mbuf_data_room = 4096 + 256;  // fits a 4096-byte path MTU frame
  // The largest path MTU the device will use (DROCE_MTU), in bytes; 0: as
  // large as an mbuf holds. Sizes a memif client's buffers.
  uint32_t max_path_mtu = 0;
  uint32_t nb_mbufs = 8191;
  uint16_t rx_desc = 1024, tx_desc = 1024;
  // rx/tx queue pairs, one per worker (af_packet gets qpairs=N unless the
  // devargs set it).
  uint16_t queues = 1;
};

class DpdkPort {
 public:
  // Probes the vdev named by devargs (or finds the PCI port EAL probed),
  // configures and starts it.
  absl::Status Open(const PortOptions& opts);
  void Close();

  // The link's state, polled for the port state: a kernel interface's
  // (administratively up and with carrier) for af_packet/af_xdp/tap, else
  // the PMD's link status. kGone: the kernel interface no longer exists.
  // kUnknown: it could not be read this time.
  enum class LinkState : uint8_t { kUp, kDown, kGone, kUnknown };
  LinkState PollLink();

  // A memif client connects to its server once per rte_eth_dev_start, and
  // the PMD never tries again by itself: not when the server was not
  // listening yet, nor after it went away. For such a port (reconnects())
  // Open does not fail when the first try does, and Reconnect() stops and
  // starts the port to try again. The caller keeps every other user of the
  // port's queues away meanwhile. True if the port is started.
  bool reconnects() const { return reconnects_; }
  bool started() const { return started_; }
  bool Reconnect();
  // A memif link's shared memory (rings and packet buffers, 4-9 MB) is
  // mapped by the PMD without its pages: each is faulted in by the first
  // frame through its slot, on each side, which put a page fault on every
  // frame of the first pass through the ring (a short ib_write_lat is all
  // first pass). Called once the link is up: populates this process's
  // mappings of every memif region, on a background thread (returns at
  // once). No-op for other ports.
  void PrefaultSharedMemory();
  // The PMD's own counters (rte_eth_stats), for reports: what the link
  // delivered and sent, and what it dropped before the engine saw it
  // (imissed: its receive ring was full; rx_nombuf: no mbuf to receive
  // into) or refused (oerrors). False where the port has none. Monotonic,
  // which the PMD's are not: the memif PMD starts its counters again when
  // its link comes back, so a count found lower than at the last read adds
  // that last value to a base carried on; the engine reads them every link
  // poll while the link is up and before a reconnection (Reconnect), so
  // little of what came since the last report is lost.
  struct Stats {
    uint64_t ipackets = 0, opackets = 0, imissed = 0, ierrors = 0, oerrors = 0, rx_nombuf = 0;
  };
  bool ReadStats(Stats* s) const;
  // Each field as reports name it ("link_" + name in droce ctl and the
  // metrics), with what a non-zero value means.
  struct StatField {
    const char* name;
    const char* help;
    uint64_t Stats::*field;
  };
  static constexpr StatField kStatFields[] = {
      {"rx_packets", "frames the link delivered to the engine", &Stats::ipackets},
      {"tx_packets", "frames the link took from the engine", &Stats::opackets},
      {"rx_missed", "frames the link dropped because its receive ring was full (the engine fell behind)",
       &Stats::imissed},
      {"rx_errors", "frames the link received in error", &Stats::ierrors},
      {"rx_nombuf", "frames the link could not receive for want of an mbuf", &Stats::rx_nombuf},
      {"tx_errors", "frames the link failed to send", &Stats::oerrors},
  };

  uint16_t port_id() const { return port_id_; }
  rte_mempool* pool() const { return pool_; }
  wire::MacAddr mac() const { return mac_; }
  absl::Status SetMac(const wire::MacAddr& mac);
  // The Ethernet MTU (IP datagram bytes) that frames on this port may carry:
  // the kernel interface's MTU for af_packet/af_xdp, the port's for others,
  // capped by what one mbuf holds.
  uint32_t link_mtu() const { return link_mtu_; }
  uint16_t data_room() const { return data_room_; }
  // Virtual links (memif, ring) have no MAC worth keeping and carry any
  // frame that fits an mbuf.
  bool is_virtual_mac() const { return virtual_mac_; }
  const std::string& driver() const { return driver_; }
  // The kernel interface behind an af_packet/af_xdp/tap port ("" if none).
  const std::string& kernel_iface() const { return iface_; }

 private:
  // ReadStats' carried base and the PMD's values at the last read (any
  // thread: reports, the worker at link down).
  mutable std::mutex stats_mu_;
  mutable Stats stats_raw_{}, stats_base_{};
  uint16_t port_id_ = 0;
  rte_mempool* pool_ = nullptr;
  wire::MacAddr mac_{};
  uint32_t link_mtu_ = 1500;
  uint16_t data_room_ = 0;
  bool virtual_mac_ = false;
  bool memif_ = false;
  bool open_ = false;
  bool reconnects_ = false;
  bool started_ = false;
  int ctl_fd_ = -1;  // for SIOCGIFFLAGS on iface_
  std::string driver_;
  std::string iface_;
};

}  // namespace droce::io
