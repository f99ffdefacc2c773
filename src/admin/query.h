// What `droce ctl`, the metrics endpoint and DPDK telemetry ask of a running
// engine: devices, links, resources, clients and counters, as JSON shaped
// like iproute2's `rdma -j` output. One implementation for droced (whose
// Host knows its client processes) and for an embedded process (DROCE_CTL=1:
// the process is the one client). Counters are read with Peek, so a query
// never stops the workers; `res show` copies the tables as a control call
// does (microseconds with the workers stopped).
//
// Requests are JSON objects: {"cmd": "dev"|"link"|"res"|"stat"|"client"|
// "kill"|"metrics", ...} with, where they apply, "dev" (device name),
// "kind" (res: "qp"|"cq"|"mr"|"pd"), "pid", "qpn".
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "engine/device.h"
#include "nlohmann/json.hpp"

namespace droce::admin {

using Json = nlohmann::ordered_json;

struct ClientInfo {
  int32_t pid = 0;
  uint32_t uid = 0;
  std::string comm;
  uint64_t tag = 0;  // owner tag of its QPs in the engine (embedded: 0)
  uint32_t qps = 0, cqs = 0, mrs = 0, pds = 0;
  uint64_t mr_bytes = 0;
};

// Who owns a device's objects: by QP owner tag, and by CQ id, MR key and PD
// id; anything not listed belongs to `fallback` (embedded: this process).
struct Owners {
  absl::flat_hash_map<uint64_t, int32_t> qp_tag;
  absl::flat_hash_map<uint32_t, int32_t> cq, mr, pd;
  int32_t fallback = 0;
};

class Host {
 public:
  virtual ~Host() = default;
  virtual std::vector<engine::Device*> Devices() = 0;
  virtual std::vector<ClientInfo> Clients() = 0;
  virtual Owners OwnersOf(size_t dev) = 0;
  // `client kill PID` asked by a process of `uid` (root may kill anyone).
  virtual absl::Status Kill(int32_t pid, uint32_t uid) = 0;
  // Host-wide counters beyond the devices' (droced: clients, messages, CM).
  virtual void AddHostStats(Json* out) { (void)out; }
};

// Answers one request (InvalidArgument names what is wrong with it). `uid`:
// the asking process's.
absl::StatusOr<Json> Query(Host& host, const Json& req, uint32_t uid);

// The Prometheus text exposition format (version 0.0.4) of every device and
// per-QP counter, with the descriptions of docs/COUNTERS.md as HELP.
std::string PrometheusText(Host& host);

// A process's name as /proc/PID/comm has it ("" if gone).
std::string CommOf(int32_t pid);

// The engine's answer to an admin message (ctl::kAdmin) read from `sock`'s
// peer `uid`: the reply, with the JSON in a sealed memfd. Returns false if
// the reply could not be sent.
bool AnswerAdmin(Host& host, int sock, uint32_t seq, const uint8_t* msg, size_t len, uint32_t uid);

}  // namespace droce::admin
