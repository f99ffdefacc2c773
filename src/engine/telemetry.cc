// droce's commands on DPDK's telemetry socket (DROCE_TELEMETRY=1), for
// dpdk-telemetry.py and the tools built on it:
//   /droce/devices            the started devices' names
//   /droce/stats,DEV          a device's counters (DEV: index or name; default droce0)
//   /droce/qps,DEV            its QPNs
//   /droce/qp_stats,[DEV,]QPN one QP's counters
//   /droce/faults,DEV         its fault rules (DROCE_FAULT, droce ctl fault):
//                             {"1": {"text": ..., "matched": ..., ...}, ...}
// Read with Peek on the telemetry thread: the workers keep running (the
// fault rules' counters are summed with the fault stages stopped for the
// copy, only on a device that has rules).
#include <rte_telemetry.h>

#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "common/background.h"
#include "common/counters.h"
#include "engine/device.h"

namespace droce::engine {
namespace {

Device* DeviceOf(std::string_view p) {
  if (p.empty()) return Device::Started(0);
  for (int i = 0; i < config::kMaxDevices; ++i) {
    Device* d = Device::Started(i);
    if (d == nullptr) continue;
    if (p == d->port().name || p == std::to_string(i)) return d;
  }
  return nullptr;
}

int Devices(const char*, const char*, rte_tel_data* d) {
  MakeThreadBackground();
  rte_tel_data_start_array(d, RTE_TEL_STRING_VAL);
  for (int i = 0; i < config::kMaxDevices; ++i) {
    if (Device* dev = Device::Started(i)) rte_tel_data_add_array_string(d, dev->port().name.c_str());
  }
  return 0;
}

int Stats(const char*, const char* params, rte_tel_data* d) {
  MakeThreadBackground();
  Device* dev = DeviceOf(params != nullptr ? params : "");
  if (dev == nullptr) return -EINVAL;
  const Counters c = dev->PeekCounters();
  rte_tel_data_start_dict(d);
  for (const CounterInfo& i : kCounterInfo) rte_tel_data_add_dict_u64(d, i.name, c.*i.field);
  return 0;
}

int Qps(const char*, const char* params, rte_tel_data* d) {
  MakeThreadBackground();
  Device* dev = DeviceOf(params != nullptr ? params : "");
  if (dev == nullptr) return -EINVAL;
  rte_tel_data_start_array(d, RTE_TEL_INT_VAL);
  dev->PeekQpCounters([&](uint32_t qpn, uint64_t, const QpCounters&) { rte_tel_data_add_array_int(d, static_cast<int>(qpn)); });
  return 0;
}

int QpStats(const char*, const char* params, rte_tel_data* d) {
  MakeThreadBackground();
  std::string_view p = params != nullptr ? params : "";
  std::string_view dev_name;
  if (size_t comma = p.find(','); comma != std::string_view::npos) {
    dev_name = p.substr(0, comma);
    p.remove_prefix(comma + 1);
  }
  Device* dev = DeviceOf(dev_name);
  if (dev == nullptr || p.empty()) return -EINVAL;
  const std::string s(p);
  char* end = nullptr;
  const unsigned long qpn = std::strtoul(s.c_str(), &end, 0);
  if (*end != '\0') return -EINVAL;
  bool found = false;
  dev->PeekQpCounters([&](uint32_t n, uint64_t, const QpCounters& c) {
    if (n != qpn) return;
    found = true;
    rte_tel_data_start_dict(d);
    for (size_t i = 0; i < kNumQpCounters; ++i) rte_tel_data_add_dict_u64(d, kQpCounterInfo[i].name, c.values[i]);
  });
  return found ? 0 : -EINVAL;
}

int Faults(const char*, const char* params, rte_tel_data* d) {
  MakeThreadBackground();
  Device* dev = DeviceOf(params != nullptr ? params : "");
  if (dev == nullptr) return -EINVAL;
  const std::vector<RuleTotals> rules = dev->HasFaultRules() ? dev->FaultRules() : std::vector<RuleTotals>{};
  rte_tel_data_start_dict(d);
  for (size_t r = 0; r < rules.size(); ++r) {
    rte_tel_data* c = rte_tel_data_alloc();
    if (c == nullptr) return -ENOMEM;
    rte_tel_data_start_dict(c);
    rte_tel_data_add_dict_string(c, "text", rules[r].text.substr(0, RTE_TEL_MAX_STRING_LEN - 1).c_str());
    for (const lab::RuleCounterField& f : lab::kRuleCounterFields) {
      rte_tel_data_add_dict_u64(c, f.name, rules[r].counters.*f.field);
    }
    rte_tel_data_add_dict_container(d, std::to_string(r + 1).c_str(), c, 0);  // frees c
  }
  return 0;
}

}  // namespace

void RegisterTelemetry() {
  rte_telemetry_register_cmd("/droce/devices", Devices, "droce's started devices. No parameters");
  rte_telemetry_register_cmd("/droce/stats", Stats, "A droce device's counters. Parameter: device name or index");
  rte_telemetry_register_cmd("/droce/qps", Qps, "A droce device's QPNs. Parameter: device name or index");
  rte_telemetry_register_cmd("/droce/qp_stats", QpStats, "One QP's counters. Parameters: [device,]qpn");
  rte_telemetry_register_cmd("/droce/faults", Faults, "A droce device's fault rules and their counters. Parameter: device name or index");
}

}  // namespace droce::engine
