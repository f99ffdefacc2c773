// Engine configuration, from DROCE_* environment variables (the launcher's
// flags set the same variables). See docs/CONFIG.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/log.h"
#include "io/dpdk_port.h"
#include "wire/frame.h"

namespace droce::engine {

struct Config {
  int index = 0;           // device droce<index>
  std::string link;        // DPDK devargs; empty = internal loopback
  uint32_t ip = 0;         // host order
  uint8_t prefix_len = 24;
  uint8_t mtu = 3;         // enum ibv_mtu cap for the port's active MTU
  std::optional<wire::MacAddr> mac;
  LogLevel log_level = LogLevel::kError;
  // true: application threads drive the engine from ibv_poll_cq/ibv_post_*
  // and the worker thread takes over when they stop (DROCE_PROGRESS=app);
  // false: only the worker thread drives (DROCE_PROGRESS=thread).
  bool app_progress = true;
  // Next hop for destinations outside ip/prefix_len (DROCE_GATEWAY); 0 = none
  // (off-subnet destinations are then resolved directly, as on-link).
  uint32_t gateway = 0;
  // 802.1Q VLAN ID to tag every transmitted frame with (DROCE_VLAN); 0 = none.
  uint16_t vlan = 0;
  uint8_t vlan_pcp = 0;  // priority code point of the tag
  io::HugepageMode hugepages = io::HugepageMode::kAuto;  // DROCE_HUGEPAGES
  // The port's IPv6 address (DROCE_IP6), answered by ND and ICMPv6 echo.
  bool has_ip6 = false;
  wire::Ipv6Addr ip6{};
  uint8_t prefix6_len = 64;
  // The CPUs the device's worker threads are pinned to (DROCE_WORKER_CPU,
  // a ','-separated list per device): worker i runs on worker_cpus[i % size].
  // Empty: they float over the process's CPUs.
  std::vector<int> worker_cpus;
  // Worker threads of the device (DROCE_WORKERS), each with its own rx/tx
  // queue pair on the link and its own QPs; 1 unless set.
  int workers = 1;
};

// Upper bound on DROCE_WORKERS.
inline constexpr int kMaxWorkers = 16;

inline constexpr const char* kDefaultIp = "10.77.0.1/24";

// Parses "a.b.c.d[/len]".
absl::Status ParseIpv4Prefix(const std::string& s, uint32_t* ip, uint8_t* prefix_len);
absl::Status ParseMac(const std::string& s, wire::MacAddr* mac);
// IB MTU in bytes (256..4096) → enum ibv_mtu.
absl::StatusOr<uint8_t> ParseMtu(const std::string& s);

// Parses "x:x::x[/len]" (default /64).
absl::Status ParseIpv6Prefix(const std::string& s, wire::Ipv6Addr* ip, uint8_t* prefix_len);
// "ID" or "ID:PCP" (ID 1..4094, PCP 0..7).
absl::Status ParseVlan(const std::string& s, uint16_t* id, uint8_t* pcp);

// Reads DROCE_LINK, DROCE_IP, DROCE_MTU, DROCE_MAC, DROCE_LOG_LEVEL,
// DROCE_PROGRESS, DROCE_GATEWAY, DROCE_VLAN, DROCE_HUGEPAGES, DROCE_IP6, DROCE_WORKER_CPU, DROCE_WORKERS. The error
// message names the variable and the bad value.
absl::StatusOr<Config> ConfigFromEnv(int index = 0);
// Devices configured: one per ';'-separated DROCE_LINK entry (at least one).
int ConfiguredDeviceCount();

}  // namespace droce::engine
