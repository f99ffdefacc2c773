// droce's settings: the one parser of their values, shared by every program
// that accepts them. The engine reads them from DROCE_* variables
// (engine::ConfigFromEnv), the launcher from its flags and the environment
// (`droce exec`), both through ParseSettings, so that one can never accept
// what the other refuses. No DPDK here: a daemon will reuse it.
// See docs/CONFIG.md.
#pragma once

#include <array>
#include <bitset>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cc/dcqcn.h"
#include "transport/adaptive_retrans.h"
#include "transport/selective_repeat.h"
#include "common/log.h"
#include "lab/capture.h"
#include "lab/fault_rules.h"
#include "lab/trace.h"
#include "wire/frame.h"

namespace droce::config {

enum class HugepageMode : uint8_t {
  kAuto,  // use hugepages if enough are free and hugetlbfs is mounted
  kOn,    // require them (EAL init fails without)
  kOff,   // never (--no-huge)
};

// Upper bound on DROCE_WORKERS.
inline constexpr int kMaxWorkers = 16;
// Devices a process can have (DROCE_LINK entries): the provider hands out
// droce0..droce15.
inline constexpr int kMaxDevices = 16;
// CPU numbers DROCE_WORKER_CPU can name (glibc's CPU_SETSIZE).
inline constexpr int kMaxCpus = 1024;

// Settings of the whole process (one value each).
struct GlobalSettings {
  LogLevel log_level = LogLevel::kError;  // DROCE_LOG_LEVEL
  // true: application threads drive the engine from ibv_poll_cq/ibv_post_*
  // and the worker thread takes over when they stop (DROCE_PROGRESS=app);
  // false: only the worker thread drives (DROCE_PROGRESS=thread).
  bool app_progress = true;
  uint8_t mtu = 3;  // enum ibv_mtu cap for the port's active MTU (DROCE_MTU)
  // Next hop for destinations outside a port's subnet (DROCE_GATEWAY); 0 =
  // none (off-subnet destinations are then resolved directly, as on-link).
  uint32_t gateway = 0;
  // 802.1Q VLAN ID to tag every transmitted frame with (DROCE_VLAN); 0 = none.
  uint16_t vlan = 0;
  uint8_t vlan_pcp = 0;  // priority code point of the tag
  HugepageMode hugepages = HugepageMode::kAuto;  // DROCE_HUGEPAGES
  // Empty ibv_poll_cq calls in a row before the polling thread yields its
  // CPU, 0 = never (DROCE_POLL_YIELD).
  uint32_t poll_yield = 16;
  // While application threads drive the engine, the worker polls the link
  // every this many microseconds at real-time priority, for a thread that
  // stops calling into verbs without notice (spins on memory RDMA writes
  // into); 0 = off: the worker naps 1 ms at a time (DROCE_WATCH_US).
  uint32_t watch_us = 20;
  bool stats = false;  // DROCE_STATS=1: counters on stderr at destroy/close
  // DROCE_TELEMETRY=1: DPDK's telemetry socket, with droce's commands.
  bool telemetry = false;
  // DROCE_CTL=1: an embedded process answers `droce ctl --pid` (src/admin/).
  bool ctl = false;
  // DROCE_FAULT: fault rules applied to every device's frames just before
  // rte_eth_tx_burst and just after rte_eth_rx_burst (src/lab/, docs/LAB.md);
  // empty: none, and the stage costs one branch.
  std::vector<lab::FaultRule> fault;
  // DROCE_CAPTURE: a pcapng capture of every device's link from the start
  // (lab/capture.h: "PATH[,size=N,files=N,count=N,snaplen=N,point=P]").
  std::optional<lab::CaptureOptions> capture;
  // DROCE_TRACE: the per-QP event trace from the start (lab/trace.h:
  // "PATH[,format=json|csv,qp=N,ring=N]").
  std::optional<lab::TraceOptions> trace;
  // DROCE_LATENCY=1: post-to-completion latency histograms per QP and
  // opcode (common/histogram.h): the provider stamps each send WQE, the engine
  // records it at completion.
  bool latency = false;
  // DROCE_RATE: packet pacing of every QP from its creation
  // ("RATE[,burst=BYTES]", RATE as tc's: "1gbit", "100M", "500kbit"), as if
  // each were given IBV_QP_RATE_LIMIT; 0: unpaced. A program's own
  // ibv_modify_qp(IBV_QP_RATE_LIMIT) overrides it for its QP.
  uint32_t rate_kbps = 0;
  uint32_t rate_burst = 0;  // bytes; 0: one frame
};

// Settings of one device droce<i>: the i-th entry of each per-device list.
struct DeviceSettings {
  std::string link;  // DPDK devargs (DROCE_LINK); empty = internal loopback
  uint32_t ip = 0;   // host order (DROCE_IP; default 10.77.<i>.1/24)
  uint8_t prefix_len = 24;
  std::optional<wire::MacAddr> mac;  // DROCE_MAC; none = derived by the engine
  // The port's IPv6 address (DROCE_IP6), answered by ND and ICMPv6 echo.
  bool has_ip6 = false;
  wire::Ipv6Addr ip6{};
  uint8_t prefix6_len = 64;
  // The CPUs the device's worker threads are pinned to (DROCE_WORKER_CPU, a
  // ','-separated list per device): worker i runs on worker_cpus[i % size].
  // Empty: they float over the process's CPUs.
  std::vector<int> worker_cpus;
  // Worker threads of the device (DROCE_WORKERS), each with its own rx/tx
  // queue pair on the link and its own QPs.
  int workers = 1;
  // What the device's new QPs start with. DROCE_CC, DROCE_DCQCN and
  // DROCE_SR take one value for every device, or a ';' list with one entry
  // per device (an empty entry: the default).
  // DROCE_CC: congestion control (cc/dcqcn.h): "dcqcn" (the default: data
  // packets ECN-capable, CNPs sent on CE and acted on) or "off".
  // DROCE_DCQCN: its parameters over ConnectX's defaults
  // ("rpg_ai_rate=10,min_time_between_cnps=0,...").
  cc::CcMode cc = cc::CcMode::kDcqcn;
  cc::DcqcnParams dcqcn;
  // DROCE_SR: selective repeat for RC/XRC QPs (transport/
  // selective_repeat.h; docs/LAB.md): "off" (the default) or
  // "on[,window=PKTS][,rto=TIME]". Used with a peer that has it on too;
  // with any other, plain go-back-N.
  transport::SelectiveRepeat sr;
  // DROCE_ADP_RETRANS: adaptive retransmission for RC/XRC QPs (transport/
  // adaptive_retrans.h; docs/LAB.md): "off" (the default) or
  // "on[,min=TIME][,init=TIME]".
  transport::AdaptiveRetrans adp;
};

struct Settings {
  GlobalSettings global;
  std::vector<DeviceSettings> devices;  // one per DROCE_LINK entry, at least one
};

enum class Setting : uint8_t {
  kLink,
  kIp,
  kIp6,
  kMac,
  kWorkers,
  kWorkerCpu,
  kMtu,
  kGateway,
  kVlan,
  kHugepages,
  kProgress,
  kLogLevel,
  kPollYield,
  kStats,
  kTelemetry,
  kCtl,
  kFault,
  kLatency,
  kWatch,
  kCapture,
  kTrace,
  kRate,
  kCc,
  kDcqcn,
  kSr,
  kAdpRetrans,
};
inline constexpr size_t kNumSettings = 26;

struct SettingInfo {
  Setting setting;
  const char* var;   // the environment variable, e.g. "DROCE_IP"
  const char* flag;  // the launcher's flag without "--", e.g. "ip"; nullptr: none
  // A ';'-separated list with one entry per device (DROCE_LINK's count).
  bool per_device;
};

// Every setting, in the order ParseSettings checks them.
inline constexpr std::array<SettingInfo, kNumSettings> kSettings = {{
    {Setting::kLink, "DROCE_LINK", "link", true},
    {Setting::kIp, "DROCE_IP", "ip", true},
    {Setting::kIp6, "DROCE_IP6", "ip6", true},
    {Setting::kMac, "DROCE_MAC", "mac", true},
    {Setting::kWorkers, "DROCE_WORKERS", "workers", true},
    {Setting::kWorkerCpu, "DROCE_WORKER_CPU", "worker-cpu", true},
    {Setting::kMtu, "DROCE_MTU", "mtu", false},
    {Setting::kGateway, "DROCE_GATEWAY", "gateway", false},
    {Setting::kVlan, "DROCE_VLAN", "vlan", false},
    {Setting::kHugepages, "DROCE_HUGEPAGES", "hugepages", false},
    {Setting::kProgress, "DROCE_PROGRESS", "progress", false},
    {Setting::kLogLevel, "DROCE_LOG_LEVEL", "log-level", false},
    {Setting::kPollYield, "DROCE_POLL_YIELD", nullptr, false},
    {Setting::kStats, "DROCE_STATS", nullptr, false},
    {Setting::kTelemetry, "DROCE_TELEMETRY", "telemetry", false},
    {Setting::kCtl, "DROCE_CTL", nullptr, false},
    {Setting::kFault, "DROCE_FAULT", "fault", false},
    {Setting::kLatency, "DROCE_LATENCY", "latency", false},
    {Setting::kWatch, "DROCE_WATCH_US", nullptr, false},
    {Setting::kCapture, "DROCE_CAPTURE", "capture", false},
    {Setting::kTrace, "DROCE_TRACE", "trace", false},
    {Setting::kRate, "DROCE_RATE", "rate", false},
    {Setting::kCc, "DROCE_CC", "cc", false},
    {Setting::kDcqcn, "DROCE_DCQCN", "dcqcn", false},
    {Setting::kSr, "DROCE_SR", "sr", false},
    {Setting::kAdpRetrans, "DROCE_ADP_RETRANS", "adp-retrans", false},
}};

// kSettings is indexed by Setting.
constexpr bool SettingsInEnumOrder() {
  for (size_t i = 0; i < kSettings.size(); ++i) {
    if (static_cast<size_t>(kSettings[i].setting) != i) return false;
  }
  return true;
}
static_assert(SettingsInEnumOrder());

constexpr const SettingInfo& Info(Setting s) { return kSettings[static_cast<size_t>(s)]; }
// DROCE_CC, DROCE_DCQCN, DROCE_SR, DROCE_ADP_RETRANS: one value for every
// device, or a ';' list with one entry per device.
constexpr bool EveryOrEachDevice(Setting s) {
  return s == Setting::kCc || s == Setting::kDcqcn || s == Setting::kSr || s == Setting::kAdpRetrans;
}

// The text of each setting, indexed by Setting; empty = unset (the default
// applies), as for an empty environment variable.
using RawSettings = std::array<std::string, kNumSettings>;

// The DROCE_* variables of this process's environment.
RawSettings RawSettingsFromEnv();

// CPUs a process may run on, by number.
using CpuSet = std::bitset<kMaxCpus>;
// The calling thread's affinity (taskset, cgroup cpusets); empty if unknown.
CpuSet AllowedCpus();

// Why ParseSettings refused: the setting and the reason, which quotes the bad
// value (or list entry) and does not name the setting, so that the engine can
// prefix the variable and the launcher the flag.
struct SettingError {
  Setting setting = Setting::kLink;
  std::string reason;
};

// Parses and cross-checks every setting: each per-device list has at most one
// entry per DROCE_LINK entry (a device without an entry of its own gets the
// default), there are at most kMaxDevices devices, each worker CPU is in
// `cpus`, the gateway is another address on every port's subnet. On failure
// the status message is "<variable>: <reason>" and *error, if given, says
// which setting.
absl::StatusOr<Settings> ParseSettings(const RawSettings& raw, const CpuSet& cpus,
                                       SettingError* error = nullptr);

// A ';'-separated per-device list: one entry per device, trailing empty
// entries dropped ("a;" is one device, ";b" two, the first with the default).
std::vector<std::string> SplitDevices(const std::string& value);

// The value parsers ParseSettings uses, one per setting (a per-device
// setting's for one entry). Each error message quotes the bad value.

// "a.b.c.d[/len]" (default /24): dotted decimal, no leading zeros, len 0..32.
absl::Status ParseIpv4Prefix(const std::string& s, uint32_t* ip, uint8_t* prefix_len);
// "a.b.c.d" without a prefix length (a gateway is one address).
absl::Status ParseIpv4(const std::string& s, uint32_t* ip);
// "x:x::x[/len]" (default /64), a unicast address.
absl::Status ParseIpv6Prefix(const std::string& s, wire::Ipv6Addr* ip, uint8_t* prefix_len);
// "xx:xx:xx:xx:xx:xx", two hex digits each.
absl::Status ParseMac(const std::string& s, wire::MacAddr* mac);
// IB MTU in bytes (256, 512, 1024, 2048, 4096) → enum ibv_mtu.
absl::StatusOr<uint8_t> ParseMtu(const std::string& s);
// "ID" or "ID:PCP" (ID 1..4094, PCP 0..7).
absl::Status ParseVlan(const std::string& s, uint16_t* id, uint8_t* pcp);
// 1..kMaxWorkers.
absl::StatusOr<int> ParseWorkers(const std::string& s);
// "c[,c...]", each a CPU in `cpus`; repeats allowed.
absl::StatusOr<std::vector<int>> ParseWorkerCpus(const std::string& s, const CpuSet& cpus);
absl::StatusOr<HugepageMode> ParseHugepages(const std::string& s);
// "app" → true, "thread" → false.
absl::StatusOr<bool> ParseProgress(const std::string& s);
absl::StatusOr<LogLevel> ParseLogLevel(const std::string& s);
// Empty polls before a yield: 0 (never) to 4294967295.
absl::StatusOr<uint32_t> ParsePollYield(const std::string& s);
// Microseconds, 0..kMaxWatchUs.
inline constexpr uint32_t kMaxWatchUs = 1000;
absl::StatusOr<uint32_t> ParseWatch(const std::string& s);
// "0" or "1".
absl::StatusOr<bool> ParseStats(const std::string& s);
// Fault rules, ';'-separated (lab/fault_rules.h; the one ';' list that is
// not per device: the rules apply to every device).
absl::StatusOr<std::vector<lab::FaultRule>> ParseFault(const std::string& s);

}  // namespace droce::config
