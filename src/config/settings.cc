#include "config/settings.h"

#include <arpa/inet.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace droce::config {
namespace {

absl::Status Invalid(const absl::string_view reason) { return absl::InvalidArgumentError(reason); }

// Decimal digits only: SimpleAtoi alone would also take " 2", "2 " and "+2",
// which the launcher used to refuse and the engine to accept. Overflow of T
// fails.
template <typename T>
bool ParseDigits(const absl::string_view s, T* out) {
  return !s.empty() && s.find_first_not_of("0123456789") == absl::string_view::npos &&
         absl::SimpleAtoi(s, out);
}

// Splits "addr/len" and parses len (0..max); no '/' leaves *len alone.
absl::Status SplitPrefix(const std::string& s, uint32_t max, std::string* addr, uint8_t* len) {
  const size_t slash = s.find('/');
  *addr = s.substr(0, slash);
  if (slash == std::string::npos) return absl::OkStatus();
  uint32_t v = 0;
  if (!ParseDigits(absl::string_view(s).substr(slash + 1), &v) || v > max) {
    return Invalid(absl::StrCat("invalid prefix length in '", s, "' (0 to ", max, ")"));
  }
  *len = static_cast<uint8_t>(v);
  return absl::OkStatus();
}

std::string FormatIpv4(uint32_t ip) {
  return absl::StrCat(ip >> 24, ".", (ip >> 16) & 0xFF, ".", (ip >> 8) & 0xFF, ".", ip & 0xFF);
}

// Device i without an address of its own gets 10.77.i.1/24.
void SetDefaultAddresses(Settings* out) {
  for (size_t i = 0; i < out->devices.size(); ++i) {
    out->devices[i].ip = (10u << 24) | (77u << 16) | (static_cast<uint32_t>(i) << 8) | 1u;
    out->devices[i].prefix_len = 24;
  }
}

absl::Status ParseLinks(const std::string& v, Settings* out) {
  std::vector<std::string> links = SplitDevices(v);
  if (links.size() > static_cast<size_t>(kMaxDevices)) {
    return Invalid(absl::StrCat("'", v, "' lists ", links.size(), " links, at most ", kMaxDevices,
                                " devices"));
  }
  if (links.empty()) links.emplace_back();  // the internal loopback link
  out->devices.resize(links.size());
  for (size_t i = 0; i < links.size(); ++i) out->devices[i].link = links[i];
  SetDefaultAddresses(out);
  return absl::OkStatus();
}

// One device's entry of a per-device list; never called with an empty one.
absl::Status ParseDeviceEntry(Setting s, const std::string& e, const CpuSet& cpus, DeviceSettings* d) {
  switch (s) {
    case Setting::kIp:
      return ParseIpv4Prefix(e, &d->ip, &d->prefix_len);
    case Setting::kIp6:
      if (absl::Status st = ParseIpv6Prefix(e, &d->ip6, &d->prefix6_len); !st.ok()) return st;
      d->has_ip6 = true;
      return absl::OkStatus();
    case Setting::kMac: {
      wire::MacAddr mac{};
      if (absl::Status st = ParseMac(e, &mac); !st.ok()) return st;
      d->mac = mac;
      return absl::OkStatus();
    }
    case Setting::kWorkers: {
      absl::StatusOr<int> w = ParseWorkers(e);
      if (!w.ok()) return w.status();
      d->workers = *w;
      return absl::OkStatus();
    }
    case Setting::kWorkerCpu: {
      absl::StatusOr<std::vector<int>> c = ParseWorkerCpus(e, cpus);
      if (!c.ok()) return c.status();
      d->worker_cpus = *std::move(c);
      return absl::OkStatus();
    }
    default:
      return absl::InternalError("not a per-device setting");
  }
}

absl::Status ParseSr(const std::string& v, transport::SelectiveRepeat* sr);
absl::Status ParseAdpRetrans(const std::string& v, transport::AdaptiveRetrans* adp);

// A per-device list has at most one entry per device, so that a value meant
// for a device that does not exist is not dropped silently.
absl::Status CheckEntryCount(const std::string& v, size_t entries, size_t n) {
  if (entries <= n) return absl::OkStatus();
  return Invalid(absl::StrCat("'", v, "' has ", entries, " entries, one per device, but there ",
                              n == 1 ? "is 1 device" : absl::StrCat("are ", n, " devices"), " (one per link)"));
}

// One device's DROCE_CC, DROCE_DCQCN, DROCE_SR or DROCE_ADP_RETRANS.
absl::Status ParseQpDefault(Setting s, const std::string& e, DeviceSettings* d) {
  switch (s) {
    case Setting::kCc:
      if (e == "dcqcn" || e == "on") {
        d->cc = cc::CcMode::kDcqcn;
      } else if (e == "off") {
        d->cc = cc::CcMode::kOff;
      } else {
        return Invalid(absl::StrCat("'", e, "' is not dcqcn or off"));
      }
      return absl::OkStatus();
    case Setting::kDcqcn: return cc::ParseDcqcnParams(e, &d->dcqcn);
    case Setting::kSr: return ParseSr(e, &d->sr);
    case Setting::kAdpRetrans: return ParseAdpRetrans(e, &d->adp);
    default: return absl::InternalError("not a QP default");
  }
}

// DROCE_CC, DROCE_DCQCN, DROCE_SR, DROCE_ADP_RETRANS: one value for every
// device, or a ';' list with at most one entry per device (an empty entry
// keeps the default).
absl::Status ParseEveryOrEachDevice(Setting s, const std::string& v, Settings* out) {
  if (v.find(';') == std::string::npos) {
    for (DeviceSettings& d : out->devices) {
      if (absl::Status st = ParseQpDefault(s, v, &d); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  const std::vector<std::string> entries = SplitDevices(v);
  if (absl::Status st = CheckEntryCount(v, entries.size(), out->devices.size()); !st.ok()) return st;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].empty()) continue;
    if (absl::Status st = ParseQpDefault(s, entries[i], &out->devices[i]); !st.ok()) {
      return absl::Status(st.code(), absl::StrCat("droce", i, ": ", st.message()));
    }
  }
  return absl::OkStatus();
}

// A per-device list other than DROCE_LINK: at most one entry per device, so
// that an address meant for a device that does not exist is not dropped
// silently; a device without an entry (or with an empty one) keeps its default.
absl::Status ParseDeviceList(Setting s, const std::string& v, const CpuSet& cpus, Settings* out) {
  const std::vector<std::string> entries = SplitDevices(v);
  if (absl::Status st = CheckEntryCount(v, entries.size(), out->devices.size()); !st.ok()) return st;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].empty()) continue;
    if (absl::Status st = ParseDeviceEntry(s, entries[i], cpus, &out->devices[i]); !st.ok()) return st;
  }
  return absl::OkStatus();
}

// The gateway must be another address on every port's subnet: a next hop
// the port can reach directly.
absl::Status ParseGateway(const std::string& v, Settings* out) {
  uint32_t gw = 0;
  if (absl::Status st = ParseIpv4(v, &gw); !st.ok()) return st;
  for (size_t i = 0; i < out->devices.size(); ++i) {
    const DeviceSettings& d = out->devices[i];
    const uint32_t mask = d.prefix_len == 0 ? 0 : ~0u << (32 - d.prefix_len);
    if ((gw & mask) != (d.ip & mask) || gw == d.ip) {
      return Invalid(absl::StrCat("'", v, "' is not another address on the port's subnet (droce", i, ": ",
                                  FormatIpv4(d.ip), "/", d.prefix_len, ")"));
    }
  }
  out->global.gateway = gw;
  return absl::OkStatus();
}

// The first word of DROCE_SR and DROCE_ADP_RETRANS: "on" (options may
// follow) or "off" (alone).
absl::Status ParseOnOff(const std::vector<std::string>& parts, bool* on) {
  if (parts[0] == "off") {
    if (parts.size() != 1) return Invalid("'off' takes no options");
    *on = false;
    return absl::OkStatus();
  }
  if (parts[0] != "on") return Invalid(absl::StrCat("'", parts[0], "' is not on or off"));
  *on = true;
  return absl::OkStatus();
}

// DROCE_SR: "off", or "on[,window=PKTS][,rto=TIME|auto]" (PKTS a power of
// two from 16 to 512; TIME as the fault rules write it, 10us to 1s; auto,
// the default: from the measured round trip).
absl::Status ParseSr(const std::string& v, transport::SelectiveRepeat* sr) {
  std::vector<std::string> parts = absl::StrSplit(v, ',');
  transport::SelectiveRepeat out;
  if (absl::Status st = ParseOnOff(parts, &out.on); !st.ok() || !out.on) {
    if (st.ok()) *sr = out;
    return st;
  }
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    uint32_t n = 0;
    uint64_t ns = 0;
    if (absl::StartsWith(p, "window=")) {
      if (!absl::SimpleAtoi(p.substr(7), &n) || n < 16 || n > 512 || (n & (n - 1)) != 0) {
        return Invalid(absl::StrCat("'", p, "': the window is a power of two from 16 to 512 packets"));
      }
      out.window = n;
    } else if (p == "rto=auto") {
      out.rto_us = 0;
    } else if (absl::StartsWith(p, "rto=")) {
      if (!lab::ParseTime(p.substr(4), &ns) || ns < 10'000 || ns > 1'000'000'000) {
        return Invalid(absl::StrCat("'", p, "': the timeout is auto or a time from 10us to 1s (e.g. rto=500us)"));
      }
      out.rto_us = static_cast<uint32_t>(ns / 1000);
    } else {
      return Invalid(absl::StrCat("'", p, "': the options are window=PKTS and rto=TIME|auto"));
    }
  }
  *sr = out;
  return absl::OkStatus();
}

// DROCE_ADP_RETRANS: "off", or "on[,min=TIME][,init=TIME]" (TIME as the
// fault rules write it, 10us to 1s).
absl::Status ParseAdpRetrans(const std::string& v, transport::AdaptiveRetrans* adp) {
  std::vector<std::string> parts = absl::StrSplit(v, ',');
  transport::AdaptiveRetrans out;
  if (absl::Status st = ParseOnOff(parts, &out.on); !st.ok() || !out.on) {
    if (st.ok()) *adp = out;
    return st;
  }
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    const size_t eq = p.find('=');
    const std::string key = p.substr(0, eq);
    uint64_t ns = 0;
    if ((key != "min" && key != "init") || eq == std::string::npos) {
      return Invalid(absl::StrCat("'", p, "': the options are min=TIME and init=TIME"));
    }
    if (!lab::ParseTime(p.substr(eq + 1), &ns) || ns < 10'000 || ns > 1'000'000'000) {
      return Invalid(absl::StrCat("'", p, "': a time from 10us to 1s (e.g. ", key, "=500us)"));
    }
    (key == "min" ? out.min_us : out.init_us) = static_cast<uint32_t>(ns / 1000);
  }
  *adp = out;
  return absl::OkStatus();
}

// DROCE_RATE: "RATE[,burst=BYTES]"; RATE in bit/s as tc writes it (at
// least 1kbit, at most 100gbit: ibv_query_device_ex's pacing caps), BYTES
// a count with tc's k/m (1024, 1048576).
absl::Status ParseRate(const std::string& v, uint32_t* kbps, uint32_t* burst) {
  std::vector<std::string> parts = absl::StrSplit(v, ',');
  uint64_t bps = 0;
  if (!lab::ParseRate(parts[0], &bps) || bps < 1000 || bps > 100'000'000'000ull) {
    return Invalid(absl::StrCat("'", parts[0], "' is not a rate from 1kbit to 100gbit (e.g. 1gbit, 100M, 500kbit)"));
  }
  *kbps = static_cast<uint32_t>(bps / 1000);
  *burst = 0;
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& p = parts[i];
    if (!absl::StartsWith(p, "burst=")) return Invalid(absl::StrCat("'", p, "': the only option is burst=BYTES"));
    std::string n = p.substr(6);
    uint64_t scale = 1;
    if (!n.empty() && (n.back() == 'k' || n.back() == 'K')) scale = 1024, n.pop_back();
    else if (!n.empty() && (n.back() == 'm' || n.back() == 'M')) scale = 1024 * 1024, n.pop_back();
    uint64_t b = 0;
    if (!absl::SimpleAtoi(n, &b) || b * scale > UINT32_MAX) {
      return Invalid(absl::StrCat("'", p, "': burst is a byte count (e.g. burst=65536 or burst=64k)"));
    }
    *burst = static_cast<uint32_t>(b * scale);
  }
  return absl::OkStatus();
}

// Assigns a parsed value, or passes its error on.
template <typename T, typename U>
absl::Status Assign(absl::StatusOr<T> v, U* field) {
  if (!v.ok()) return v.status();
  *field = *v;
  return absl::OkStatus();
}

// One setting with a non-empty value; DROCE_LINK (the device count) and
// DROCE_IP (the subnets) come before the settings checked against them.
absl::Status ParseOne(Setting s, const std::string& v, const CpuSet& cpus, Settings* out) {
  GlobalSettings& g = out->global;
  switch (s) {
    case Setting::kLink: return ParseLinks(v, out);
    case Setting::kIp:
    case Setting::kIp6:
    case Setting::kMac:
    case Setting::kWorkers:
    case Setting::kWorkerCpu: return ParseDeviceList(s, v, cpus, out);
    case Setting::kMtu: return Assign(ParseMtu(v), &g.mtu);
    case Setting::kGateway: return ParseGateway(v, out);
    case Setting::kVlan: return ParseVlan(v, &g.vlan, &g.vlan_pcp);
    case Setting::kHugepages: return Assign(ParseHugepages(v), &g.hugepages);
    case Setting::kProgress: return Assign(ParseProgress(v), &g.app_progress);
    case Setting::kLogLevel: return Assign(ParseLogLevel(v), &g.log_level);
    case Setting::kPollYield: return Assign(ParsePollYield(v), &g.poll_yield);
    case Setting::kStats: return Assign(ParseStats(v), &g.stats);
    case Setting::kTelemetry: return Assign(ParseStats(v), &g.telemetry);
    case Setting::kCtl: return Assign(ParseStats(v), &g.ctl);
    case Setting::kFault: {
      absl::StatusOr<std::vector<lab::FaultRule>> rules = ParseFault(v);
      if (!rules.ok()) return rules.status();
      g.fault = *std::move(rules);
      return absl::OkStatus();
    }
    case Setting::kLatency: return Assign(ParseStats(v), &g.latency);
    case Setting::kWatch: return Assign(ParseWatch(v), &g.watch_us);
    case Setting::kCapture: {
      absl::StatusOr<lab::CaptureOptions> o = lab::ParseCaptureSpec(v);
      if (!o.ok()) return o.status();
      g.capture = *std::move(o);
      return absl::OkStatus();
    }
    case Setting::kTrace: {
      absl::StatusOr<lab::TraceOptions> o = lab::ParseTraceSpec(v);
      if (!o.ok()) return o.status();
      g.trace = *std::move(o);
      return absl::OkStatus();
    }
    case Setting::kRate: return ParseRate(v, &g.rate_kbps, &g.rate_burst);
    case Setting::kCc:
    case Setting::kDcqcn:
    case Setting::kSr:
    case Setting::kAdpRetrans: return ParseEveryOrEachDevice(s, v, out);
  }
  return absl::InternalError("unknown setting");
}

}  // namespace

RawSettings RawSettingsFromEnv() {
  RawSettings raw;
  for (const SettingInfo& info : kSettings) {
    const char* v = std::getenv(info.var);
    if (v != nullptr) raw[static_cast<size_t>(info.setting)] = v;
  }
  return raw;
}

CpuSet AllowedCpus() {
  CpuSet out;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int cpu = 0; cpu < kMaxCpus && cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) out.set(static_cast<size_t>(cpu));
  }
  return out;
}

absl::StatusOr<Settings> ParseSettings(const RawSettings& raw, const CpuSet& cpus, SettingError* error) {
  Settings out;
  (void)ParseLinks("", &out);  // one device on the loopback link unless DROCE_LINK says otherwise
  for (const SettingInfo& info : kSettings) {
    const std::string& v = raw[static_cast<size_t>(info.setting)];
    if (v.empty()) continue;
    if (absl::Status s = ParseOne(info.setting, v, cpus, &out); !s.ok()) {
      if (error != nullptr) *error = {info.setting, std::string(s.message())};
      return absl::InvalidArgumentError(absl::StrCat(info.var, ": ", s.message()));
    }
  }
  return out;
}

std::vector<std::string> SplitDevices(const std::string& value) {
  std::vector<std::string> out;
  if (value.empty()) return out;
  for (absl::string_view part : absl::StrSplit(value, ';')) out.emplace_back(part);
  while (!out.empty() && out.back().empty()) out.pop_back();
  return out;
}

absl::Status ParseIpv4Prefix(const std::string& s, uint32_t* ip, uint8_t* prefix_len) {
  std::string addr;
  uint8_t len = 24;
  if (absl::Status st = SplitPrefix(s, 32, &addr, &len); !st.ok()) return st;
  // inet_pton takes dotted decimal only: no leading zeros (inet_aton would
  // read them as octal), no shortened forms.
  in_addr a{};
  if (inet_pton(AF_INET, addr.c_str(), &a) != 1) {
    return Invalid(absl::StrCat("invalid IPv4 address '", s, "'"));
  }
  *ip = ntohl(a.s_addr);
  *prefix_len = len;
  return absl::OkStatus();
}

absl::Status ParseIpv4(const std::string& s, uint32_t* ip) {
  if (s.find('/') != std::string::npos) {
    return Invalid(absl::StrCat("'", s, "' has a prefix length: a gateway is one address (the subnet is the port's)"));
  }
  uint8_t len = 0;
  return ParseIpv4Prefix(s, ip, &len);
}

absl::Status ParseIpv6Prefix(const std::string& s, wire::Ipv6Addr* ip, uint8_t* prefix_len) {
  std::string addr;
  uint8_t len = 64;
  if (absl::Status st = SplitPrefix(s, 128, &addr, &len); !st.ok()) return st;
  in6_addr a{};
  if (inet_pton(AF_INET6, addr.c_str(), &a) != 1) {
    return Invalid(absl::StrCat("invalid IPv6 address '", s, "'"));
  }
  wire::Ipv6Addr v{};
  std::memcpy(v.data(), a.s6_addr, v.size());
  if (v[0] == 0xFF || std::all_of(v.begin(), v.end(), [](uint8_t b) { return b == 0; })) {
    return Invalid(absl::StrCat("'", s, "' is not a unicast address"));
  }
  *ip = v;
  *prefix_len = len;
  return absl::OkStatus();
}

absl::Status ParseMac(const std::string& s, wire::MacAddr* mac) {
  const std::vector<absl::string_view> parts = absl::StrSplit(s, ':');
  wire::MacAddr m{};
  bool ok = parts.size() == m.size();
  for (size_t i = 0; ok && i < m.size(); ++i) {
    uint32_t v = 0;
    // Two hex digits: SimpleHexAtoi alone would also take " a", "+a" and "0x".
    ok = parts[i].size() == 2 && std::isxdigit(static_cast<unsigned char>(parts[i][0])) &&
         std::isxdigit(static_cast<unsigned char>(parts[i][1])) && absl::SimpleHexAtoi(parts[i], &v);
    m[i] = static_cast<uint8_t>(v);
  }
  if (!ok) return Invalid(absl::StrCat("invalid MAC '", s, "' (xx:xx:xx:xx:xx:xx, hex)"));
  *mac = m;
  return absl::OkStatus();
}

absl::StatusOr<uint8_t> ParseMtu(const std::string& s) {
  uint32_t v = 0;
  if (ParseDigits(s, &v)) {
    for (uint8_t m = 1; m <= 5; ++m) {
      if ((128u << m) == v) return m;
    }
  }
  return Invalid(absl::StrCat("invalid MTU '", s, "' (one of 256, 512, 1024, 2048, 4096)"));
}

absl::Status ParseVlan(const std::string& s, uint16_t* id, uint8_t* pcp) {
  const std::vector<absl::string_view> parts = absl::StrSplit(s, ':');
  uint32_t v = 0, p = 0;
  if (parts.size() > 2 || !ParseDigits(parts[0], &v) || v < 1 || v > 4094 ||
      (parts.size() == 2 && (!ParseDigits(parts[1], &p) || p > 7))) {
    return Invalid(absl::StrCat("invalid VLAN '", s, "' (ID 1..4094, optionally :PCP 0..7)"));
  }
  *id = static_cast<uint16_t>(v);
  *pcp = static_cast<uint8_t>(p);
  return absl::OkStatus();
}

absl::StatusOr<int> ParseWorkers(const std::string& s) {
  int n = 0;
  if (!ParseDigits(s, &n) || n < 1 || n > kMaxWorkers) {
    return Invalid(absl::StrCat("'", s, "' is not a worker count (1 to ", kMaxWorkers, ")"));
  }
  return n;
}

absl::StatusOr<std::vector<int>> ParseWorkerCpus(const std::string& s, const CpuSet& cpus) {
  std::vector<int> out;
  for (absl::string_view one : absl::StrSplit(s, ',')) {
    int cpu = -1;
    if (!ParseDigits(one, &cpu) || cpu >= kMaxCpus || !cpus.test(static_cast<size_t>(cpu))) {
      return Invalid(absl::StrCat("'", one, "' is not a CPU this process may run on"));
    }
    out.push_back(cpu);
  }
  return out;
}

absl::StatusOr<HugepageMode> ParseHugepages(const std::string& s) {
  if (s == "auto") return HugepageMode::kAuto;
  if (s == "on") return HugepageMode::kOn;
  if (s == "off") return HugepageMode::kOff;
  return Invalid(absl::StrCat("invalid mode '", s, "' (auto, on or off)"));
}

absl::StatusOr<bool> ParseProgress(const std::string& s) {
  if (s == "app") return true;
  if (s == "thread") return false;
  return Invalid(absl::StrCat("invalid mode '", s, "' (app or thread)"));
}

absl::StatusOr<LogLevel> ParseLogLevel(const std::string& s) {
  if (s == "error") return LogLevel::kError;
  if (s == "warning") return LogLevel::kWarning;
  if (s == "info") return LogLevel::kInfo;
  if (s == "debug") return LogLevel::kDebug;
  return Invalid(absl::StrCat("invalid level '", s, "' (error, warning, info or debug)"));
}

absl::StatusOr<uint32_t> ParsePollYield(const std::string& s) {
  uint32_t n = 0;
  if (!ParseDigits(s, &n)) {
    return Invalid(absl::StrCat("'", s, "' is not a count of empty polls (0 to 4294967295)"));
  }
  return n;
}

absl::StatusOr<uint32_t> ParseWatch(const std::string& s) {
  uint32_t n = 0;
  if (!ParseDigits(s, &n) || n > kMaxWatchUs) {
    return Invalid(absl::StrCat("'", s, "' is not a poll interval in microseconds (0 to ", kMaxWatchUs, ")"));
  }
  return n;
}

absl::StatusOr<bool> ParseStats(const std::string& s) {
  if (s == "0") return false;
  if (s == "1") return true;
  return Invalid(absl::StrCat("invalid value '", s, "' (0 or 1)"));
}

absl::StatusOr<std::vector<lab::FaultRule>> ParseFault(const std::string& s) { return lab::ParseFaultRules(s); }

}  // namespace droce::config
