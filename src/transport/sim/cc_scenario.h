// Congestion-control experiments in virtual time: real
// transport QPs (src/transport, the simulator of src/transport/sim) sending
// RDMA WRITEs through one congested switch port (cc/switch.h) to one
// receiver, with DCQCN (cc/dcqcn.h) at every QP. Seeded and deterministic:
// the same options give the same samples, byte for byte in the CSV.
//
// Topology: sender i (10.0.1.i) ── its NIC, paced at the line rate ──┐
//                                                                     ├─ switch egress port (rate, buffer, RED/ECN, delay) ── receiver 10.0.0.100
//           ACKs and CNPs back to each sender: a port of its own, uncongested
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cc/dcqcn.h"
#include "cc/switch.h"

namespace droce::cc {

enum class ScenarioKind : uint8_t {
  kConverge,  // N long flows, started `stagger` apart, share the bottleneck
  kIncast,    // k senders each send one burst at the same moment
  kMixed,     // long flows, and k incast senders bursting every `incast_period`
};
const char* scenario_name(ScenarioKind k);

struct ScenarioOptions {
  ScenarioKind kind = ScenarioKind::kConverge;
  int flows = 8;                     // converge: flows; incast: senders; mixed: long flows
  int incast_senders = 8;            // mixed: bursting senders
  uint64_t seed = 1;
  uint64_t duration_us = 100'000;
  uint64_t sample_us = 100;          // one CSV row per sample period
  uint64_t stagger_us = 1000;        // converge: flow i starts at i * stagger
  uint64_t warmup_us = 40'000;       // fairness and utilisation are measured after this
  uint64_t window_us = 10'000;       // fairness windows
  uint64_t incast_bytes = 512 * 1024;   // incast, mixed: each sender's burst
  uint64_t incast_period_us = 20'000;   // mixed
  double line_gbps = 25;             // each NIC
  // The switch port toward the receiver; 16 MB of buffer by default, so
  // that it does not drop (DCQCN runs on lossless fabrics, with PFC, which
  // this switch does not model): --buffer makes it shallow and lossy.
  PortParams bottleneck = {.buffer_bytes = 16u << 20};
  CcMode cc = CcMode::kDcqcn;
  DcqcnParams dcqcn;
  uint32_t msg_bytes = 64 * 1024;    // each WRITE
  uint32_t outstanding = 8;          // WRITEs in flight per flow
  uint8_t mtu = 3;                   // enum ibv_mtu: 3 = 1024
};

struct ScenarioSample {
  uint64_t t_us = 0;
  uint64_t queue_bytes = 0;           // the bottleneck's queue at t
  std::vector<double> gbps;           // per flow: delivered through the bottleneck in the period
  std::vector<double> rp_mbps;        // per flow: DCQCN's rate at t (the line rate when not limited)
};

struct ScenarioWindow {
  uint64_t start_us = 0;
  double jain = 0;         // Jain's fairness index of the flows active in the whole window
  double utilisation = 0;  // delivered / bottleneck capacity
};

struct ScenarioResult {
  std::vector<ScenarioSample> samples;
  std::vector<ScenarioWindow> windows;  // after warm-up
  double min_jain = 0, mean_utilisation = 0;
  std::vector<double> completion_us;    // incast: each burst's completion time (from its start)
  PortStats bottleneck;
  uint64_t cnps = 0, cuts = 0;
  uint64_t max_queue_bytes = 0;
  uint64_t bytes_verified = 0;          // WRITE payload checked at the receiver
  bool data_ok = true;
};

absl::StatusOr<ScenarioResult> RunScenario(const ScenarioOptions& o);

// The samples as CSV: t_us,queue_bytes,gbps_0..,rp_mbps_0..
std::string ScenarioCsv(const ScenarioResult& r);
// A gnuplot script that draws the CSV at csv_path into png_path: per-flow
// throughput and DCQCN rate, and the bottleneck queue, over time.
std::string ScenarioGnuplot(const ScenarioOptions& o, const std::string& csv_path, const std::string& png_path);
// A few lines of summary (fairness, utilisation, marks, drops, CNPs).
std::string ScenarioSummary(const ScenarioOptions& o, const ScenarioResult& r);

}  // namespace droce::cc
