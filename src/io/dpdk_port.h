// The packet-I/O seam on DPDK: EAL bring-up without hugepages, one mbuf pool
// and one port with a single rx/tx queue pair. Cold code only; the burst
// calls are inline DPDK functions used directly by the worker loop.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "common/log.h"
#include "wire/frame.h"

struct rte_mempool;

namespace droce::io {

struct EalOptions {
  LogLevel log_level = LogLevel::kError;
  bool use_pci = false;
};

// Initialises DPDK's EAL once per process, on the calling thread (which EAL
// then treats as its main lcore). No hugepages, no shared config files, no
// PCI probing, a per-process file prefix, lcore 0 allowed on every CPU this
// process may use.
absl::Status InitEal(const EalOptions& opts);

struct PortOptions {
  std::string devargs;     // e.g. "net_memif0,role=server,socket=/tmp/x.sock"
  uint16_t mbuf_data_room = 4096 + 256;  // fits a 4096-byte path MTU frame
  uint32_t nb_mbufs = 8191;
  uint16_t rx_desc = 1024, tx_desc = 1024;
};

class DpdkPort {
 public:
  // Probes the vdev named by devargs, configures and starts it.
  absl::Status Open(const PortOptions& opts);
  void Close();

  uint16_t port_id() const { return port_id_; }
  rte_mempool* pool() const { return pool_; }
  wire::MacAddr mac() const { return mac_; }
  absl::Status SetMac(const wire::MacAddr& mac);
  uint32_t link_mtu() const { return link_mtu_; }
  uint16_t data_room() const { return data_room_; }
  bool is_virtual_mac() const { return virtual_mac_; }

 private:
  uint16_t port_id_ = 0;
  rte_mempool* pool_ = nullptr;
  wire::MacAddr mac_{};
  uint32_t link_mtu_ = 1500;
  uint16_t data_room_ = 0;
  bool virtual_mac_ = false;
  bool open_ = false;
};

}  // namespace droce::io
