#include "engine/config.h"

#include <arpa/inet.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace droce::engine {

absl::Status ParseIpv4Prefix(const std::string& s, uint32_t* ip, uint8_t* prefix_len) {
  std::string addr = s;
  *prefix_len = 24;
  if (auto slash = s.find('/'); slash != std::string::npos) {
    addr = s.substr(0, slash);
    uint32_t len = 0;
    if (!absl::SimpleAtoi(s.substr(slash + 1), &len) || len > 32) {
      return absl::InvalidArgumentError(absl::StrCat("invalid prefix length in '", s, "'"));
    }
    *prefix_len = static_cast<uint8_t>(len);
  }
  in_addr a{};
  if (inet_pton(AF_INET, addr.c_str(), &a) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("invalid IPv4 address '", s, "'"));
  }
  *ip = ntohl(a.s_addr);
  return absl::OkStatus();
}

absl::Status ParseIpv6Prefix(const std::string& s, wire::Ipv6Addr* ip, uint8_t* prefix_len) {
  std::string addr = s;
  *prefix_len = 64;
  if (auto slash = s.find('/'); slash != std::string::npos) {
    addr = s.substr(0, slash);
    uint32_t len = 0;
    if (!absl::SimpleAtoi(s.substr(slash + 1), &len) || len > 128) {
      return absl::InvalidArgumentError(absl::StrCat("invalid prefix length in '", s, "'"));
    }
    *prefix_len = static_cast<uint8_t>(len);
  }
  in6_addr a{};
  if (inet_pton(AF_INET6, addr.c_str(), &a) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("invalid IPv6 address '", s, "'"));
  }
  std::memcpy(ip->data(), a.s6_addr, 16);
  if ((*ip)[0] == 0xFF || std::all_of(ip->begin(), ip->end(), [](uint8_t b) { return b == 0; })) {
    return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not a unicast address"));
  }
  return absl::OkStatus();
}

absl::Status ParseMac(const std::string& s, wire::MacAddr* mac) {
  std::vector<std::string> parts = absl::StrSplit(s, ':');
  if (parts.size() != 6) return absl::InvalidArgumentError(absl::StrCat("invalid MAC '", s, "'"));
  for (int i = 0; i < 6; ++i) {
    uint32_t v = 0;
    if (parts[i].size() != 2 || !absl::SimpleHexAtoi(parts[i], &v)) {
      return absl::InvalidArgumentError(absl::StrCat("invalid MAC '", s, "'"));
    }
    (*mac)[i] = static_cast<uint8_t>(v);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint8_t> ParseMtu(const std::string& s) {
  uint32_t v = 0;
  if (absl::SimpleAtoi(s, &v)) {
    for (uint8_t m = 1; m <= 5; ++m) {
      if ((128u << m) == v) return m;
    }
  }
  return absl::InvalidArgumentError(
      absl::StrCat("invalid MTU '", s, "' (one of 256, 512, 1024, 2048, 4096)"));
}

absl::Status ParseVlan(const std::string& s, uint16_t* id, uint8_t* pcp) {
  std::vector<std::string> parts = absl::StrSplit(s, ':');
  uint32_t v = 0, p = 0;
  if (parts.size() > 2 || !absl::SimpleAtoi(parts[0], &v) || v < 1 || v > 4094 ||
      (parts.size() == 2 && (!absl::SimpleAtoi(parts[1], &p) || p > 7))) {
    return absl::InvalidArgumentError(
        absl::StrCat("invalid VLAN '", s, "' (ID 1..4094, optionally :PCP 0..7)"));
  }
  *id = static_cast<uint16_t>(v);
  *pcp = static_cast<uint8_t>(p);
  return absl::OkStatus();
}

namespace {

// DROCE_LINK, DROCE_IP, DROCE_IP6, DROCE_MAC, DROCE_WORKERS and
// DROCE_WORKER_CPU may list one value per device, separated by ';' (DPDK
// devargs themselves use ',').
std::vector<std::string> split_devices(const char* value) {
  std::vector<std::string> out;
  if (value == nullptr) return out;
  for (absl::string_view part : absl::StrSplit(value, ';')) {
    out.emplace_back(part);
  }
  while (!out.empty() && out.back().empty()) out.pop_back();
  return out;
}

}  // namespace

int ConfiguredDeviceCount() {
  const auto links = split_devices(std::getenv("DROCE_LINK"));
  return links.empty() ? 1 : static_cast<int>(links.size());
}

absl::StatusOr<Config> ConfigFromEnv(int index) {
  if (index < 0 || index >= ConfiguredDeviceCount()) return absl::NotFoundError("no such device");
  Config c;
  c.index = index;
  auto env = [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  };
  auto prefixed = [](const char* var, const absl::Status& s) {
    return absl::InvalidArgumentError(absl::StrCat(var, ": ", s.message()));
  };
  if (auto v = env("DROCE_LOG_LEVEL")) {
    if (*v == "error") c.log_level = LogLevel::kError;
    else if (*v == "warning") c.log_level = LogLevel::kWarning;
    else if (*v == "info") c.log_level = LogLevel::kInfo;
    else if (*v == "debug") c.log_level = LogLevel::kDebug;
    else return absl::InvalidArgumentError(absl::StrCat("DROCE_LOG_LEVEL: invalid level '", *v, "'"));
  }
  if (auto links = split_devices(std::getenv("DROCE_LINK")); !links.empty()) c.link = links[index];
  if (auto v = env("DROCE_PROGRESS")) {
    if (*v == "app") c.app_progress = true;
    else if (*v == "thread") c.app_progress = false;
    else return absl::InvalidArgumentError(absl::StrCat("DROCE_PROGRESS: invalid mode '", *v, "' (app or thread)"));
  }
  {
    // Device i without an address of its own gets 10.77.i.1/24.
    const auto ips = split_devices(std::getenv("DROCE_IP"));
    const std::string ip = static_cast<size_t>(index) < ips.size() && !ips[index].empty()
                               ? ips[index]
                               : (index == 0 ? std::string(kDefaultIp) : absl::StrCat("10.77.", index, ".1/24"));
    if (absl::Status s = ParseIpv4Prefix(ip, &c.ip, &c.prefix_len); !s.ok()) return prefixed("DROCE_IP", s);
  }
  if (auto v = env("DROCE_MTU")) {
    auto m = ParseMtu(*v);
    if (!m.ok()) return prefixed("DROCE_MTU", m.status());
    c.mtu = *m;
  }
  if (auto macs = split_devices(std::getenv("DROCE_MAC"));
      static_cast<size_t>(index) < macs.size() && !macs[index].empty()) {
    wire::MacAddr mac;
    if (absl::Status s = ParseMac(macs[index], &mac); !s.ok()) return prefixed("DROCE_MAC", s);
    c.mac = mac;
  }
  if (auto v = env("DROCE_GATEWAY")) {
    uint8_t len = 0;
    absl::Status s = ParseIpv4Prefix(*v, &c.gateway, &len);
    if (s.ok() && v->find('/') != std::string::npos) s = absl::InvalidArgumentError("no prefix length expected");
    if (!s.ok()) return prefixed("DROCE_GATEWAY", s);
    const uint32_t mask = c.prefix_len == 0 ? 0 : ~0u << (32 - c.prefix_len);
    if ((c.gateway & mask) != (c.ip & mask) || c.gateway == c.ip) {
      return absl::InvalidArgumentError(
          absl::StrCat("DROCE_GATEWAY: '", *v, "' is not another address on the port's subnet"));
    }
  }
  if (auto v = env("DROCE_VLAN")) {
    if (absl::Status s = ParseVlan(*v, &c.vlan, &c.vlan_pcp); !s.ok()) return prefixed("DROCE_VLAN", s);
  }
  // One address per device, like DROCE_IP; a device without an entry of its
  // own has no IPv6 address (two devices must not share one).
  if (auto ip6s = split_devices(std::getenv("DROCE_IP6"));
      static_cast<size_t>(index) < ip6s.size() && !ip6s[index].empty()) {
    if (absl::Status s = ParseIpv6Prefix(ip6s[index], &c.ip6, &c.prefix6_len); !s.ok()) {
      return prefixed("DROCE_IP6", s);
    }
    c.has_ip6 = true;
  }
  if (auto v = env("DROCE_HUGEPAGES")) {
    if (*v == "auto") c.hugepages = io::HugepageMode::kAuto;
    else if (*v == "on") c.hugepages = io::HugepageMode::kOn;
    else if (*v == "off") c.hugepages = io::HugepageMode::kOff;
    else return absl::InvalidArgumentError(absl::StrCat("DROCE_HUGEPAGES: invalid mode '", *v, "' (auto, on or off)"));
  }
  if (auto cpus = split_devices(std::getenv("DROCE_WORKER_CPU"));
      static_cast<size_t>(index) < cpus.size() && !cpus[index].empty()) {
    // CPUs this process may run on (taskset, cgroup cpusets).
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    const bool have_set = sched_getaffinity(0, sizeof(allowed), &allowed) == 0;
    for (absl::string_view one : absl::StrSplit(cpus[index], ',')) {
      int cpu = -1;
      if (!absl::SimpleAtoi(one, &cpu) || cpu < 0 || cpu >= CPU_SETSIZE || !have_set || !CPU_ISSET(cpu, &allowed)) {
        return absl::InvalidArgumentError(
            absl::StrCat("DROCE_WORKER_CPU: '", one, "' is not a CPU this process may run on"));
      }
      c.worker_cpus.push_back(cpu);
    }
  }
  if (auto w = split_devices(std::getenv("DROCE_WORKERS"));
      static_cast<size_t>(index) < w.size() && !w[index].empty()) {
    // Digits only: SimpleAtoi would also take " 2" and "+2".
    if (w[index].find_first_not_of("0123456789") != std::string::npos || !absl::SimpleAtoi(w[index], &c.workers) ||
        c.workers < 1 || c.workers > kMaxWorkers) {
      return absl::InvalidArgumentError(
          absl::StrCat("DROCE_WORKERS: '", w[index], "' is not a worker count (1 to ", kMaxWorkers, ")"));
    }
  }
  return c;
}

}  // namespace droce::engine
