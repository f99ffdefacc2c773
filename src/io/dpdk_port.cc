#include "io/dpdk_port.h"

#include <getopt.h>
#include <sched.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <vector>

#include <rte_bus_vdev.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_log.h>
#include <rte_mbuf.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

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

}  // namespace

absl::Status InitEal(const EalOptions& opts) {
  std::vector<std::string> args = {
      "droce",
      "--no-huge",
      "-m", "256",
      "--no-shconf",
      "--no-telemetry",
      absl::StrCat("--file-prefix=droce-", getpid()),
      absl::StrCat("--lcores=", lcores_arg()),
      absl::StrCat("--log-level=", rte_level(opts.log_level)),
  };
  if (!opts.use_pci) args.push_back("--no-pci");
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
  return absl::OkStatus();
}

absl::Status DpdkPort::Open(const PortOptions& opts) {
  const std::string& devargs = opts.devargs;
  const std::string name = devargs.substr(0, devargs.find(','));
  const std::string params = devargs.find(',') == std::string::npos ? "" : devargs.substr(devargs.find(',') + 1);
  if (name.rfind("net_", 0) == 0 || name.rfind("eth_", 0) == 0) {
    if (int rc = rte_vdev_init(name.c_str(), params.c_str()); rc != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("link '", devargs, "': cannot create the DPDK device (unknown driver or bad arguments)"));
    }
    virtual_mac_ = name.rfind("net_memif", 0) == 0 || name.rfind("net_ring", 0) == 0;
  }
  if (rte_eth_dev_get_port_by_name(name.c_str(), &port_id_) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("link '", devargs, "': no such DPDK port"));
  }
  data_room_ = static_cast<uint16_t>(opts.mbuf_data_room);
  pool_ = rte_pktmbuf_pool_create(absl::StrCat("droce_pool_", port_id_).c_str(), opts.nb_mbufs, 256, 0,
                                  static_cast<uint16_t>(opts.mbuf_data_room + RTE_PKTMBUF_HEADROOM),
                                  SOCKET_ID_ANY);
  if (pool_ == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("mbuf pool: ", rte_strerror(rte_errno)));
  }
  rte_eth_dev_info info{};
  if (int rc = rte_eth_dev_info_get(port_id_, &info); rc != 0) {
    return absl::InternalError(absl::StrCat("dev_info: ", rte_strerror(-rc)));
  }
  rte_eth_conf conf{};
  if (int rc = rte_eth_dev_configure(port_id_, 1, 1, &conf); rc != 0) {
    return absl::InternalError(absl::StrCat("configure: ", rte_strerror(-rc)));
  }
  uint16_t nrx = opts.rx_desc, ntx = opts.tx_desc;
  rte_eth_dev_adjust_nb_rx_tx_desc(port_id_, &nrx, &ntx);
  const int socket = rte_eth_dev_socket_id(port_id_);
  if (int rc = rte_eth_rx_queue_setup(port_id_, 0, nrx, socket < 0 ? SOCKET_ID_ANY : socket, nullptr, pool_);
      rc != 0) {
    return absl::InternalError(absl::StrCat("rx queue: ", rte_strerror(-rc)));
  }
  if (int rc = rte_eth_tx_queue_setup(port_id_, 0, ntx, socket < 0 ? SOCKET_ID_ANY : socket, nullptr);
      rc != 0) {
    return absl::InternalError(absl::StrCat("tx queue: ", rte_strerror(-rc)));
  }
  if (int rc = rte_eth_dev_start(port_id_); rc != 0) {
    return absl::InternalError(absl::StrCat("start: ", rte_strerror(-rc)));
  }
  rte_eth_promiscuous_enable(port_id_);  // not every vdev supports it; harmless
  rte_ether_addr a{};
  rte_eth_macaddr_get(port_id_, &a);
  std::memcpy(mac_.data(), a.addr_bytes, 6);
  uint16_t mtu = 1500;
  if (rte_eth_dev_get_mtu(port_id_, &mtu) == 0) link_mtu_ = mtu;
  open_ = true;
  return absl::OkStatus();
}

absl::Status DpdkPort::SetMac(const wire::MacAddr& mac) {
  rte_ether_addr a{};
  std::memcpy(a.addr_bytes, mac.data(), 6);
  // Virtual ports may not support changing it; droce then just sends from
  // this address and accepts frames to it.
  rte_eth_dev_default_mac_addr_set(port_id_, &a);
  mac_ = mac;
  return absl::OkStatus();
}

void DpdkPort::Close() {
  if (!open_) return;
  rte_eth_dev_stop(port_id_);
  rte_eth_dev_close(port_id_);
  open_ = false;
}

}  // namespace droce::io
