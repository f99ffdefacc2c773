// `droce cc-scenario` (cc_scenario.h).
#include "cc_scenario.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/strings/numbers.h"
#include "transport/sim/cc_scenario.h"

namespace droce::cc_scenario {
namespace {

constexpr const char* kUsage =
    "usage: droce cc-scenario [options]\n"
    "  A congestion-control experiment in virtual time: droce's transport (RC QPs\n"
    "  sending 64 KiB RDMA WRITEs) with DCQCN, senders paced at the line rate,\n"
    "  through one switch egress port with a buffer, tail drop and RED/ECN\n"
    "  marking, to one receiver. Seeded: the same options give the same CSV.\n"
    "  --scenario converge|incast|mixed  (converge)\n"
    "      converge: --flows long flows started --stagger-us apart;\n"
    "      incast: --flows senders each send --incast-bytes at once;\n"
    "      mixed: --flows long flows and --incast-senders bursting every --period-ms\n"
    "  --flows N (8)  --incast-senders N (8)  --seed N (1)\n"
    "  --duration-ms N (100)  --sample-us N (100)  --stagger-us N (1000)\n"
    "  --warmup-ms N (40)  --window-ms N (10)   fairness and utilisation windows\n"
    "  --incast-bytes N (524288)  --period-ms N (20)\n"
    "  --line-gbps G (25)  --bottleneck-gbps G (25)  --buffer BYTES (16777216: no drops)\n"
    "  --kmin BYTES (5120)  --kmax BYTES (204800)  --pmax P (0.01)  --delay-us N (1)\n"
    "  --cc dcqcn|off (dcqcn)  --dcqcn NAME=VALUE,...  (ConnectX's DCQCN knobs, docs/LAB.md)\n"
    "  --msg BYTES (65536)  --outstanding N (8)  --mtu 256|512|1024|2048|4096 (1024)\n"
    "  --csv FILE   the samples: t_us,queue_bytes,gbps_<flow>...,rp_mbps_<flow>...\n"
    "  --png FILE   a plot of the CSV (needs --csv and gnuplot)\n"
    "  --check      exit 1 unless Jain's index >= 0.99 and utilisation >= 95 % in\n"
    "               every window after warm-up (converge, mixed) and data verified\n";

bool Num(const char* s, uint64_t* v) { return absl::SimpleAtoi(s, v); }
bool Dbl(const char* s, double* v) { return absl::SimpleAtod(s, v) && *v >= 0; }

int Usage(const std::string& why) {
  std::fprintf(stderr, "droce cc-scenario: %s\n%s", why.c_str(), kUsage);
  return 2;
}

}  // namespace

int Main(int argc, char** argv) {
  cc::ScenarioOptions o;
  o.duration_us = 100'000;
  std::string csv, png;
  bool check = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--check") {
      check = true;
      continue;
    }
    if (i + 1 >= argc) return Usage("'" + a + "' needs a value");
    const char* v = argv[++i];
    uint64_t n = 0;
    double d = 0;
    bool ok = true;
    if (a == "--scenario") {
      const std::string s = v;
      if (s == "converge") o.kind = cc::ScenarioKind::kConverge;
      else if (s == "incast") o.kind = cc::ScenarioKind::kIncast;
      else if (s == "mixed") o.kind = cc::ScenarioKind::kMixed;
      else ok = false;
    } else if (a == "--flows") ok = Num(v, &n) && n >= 1 && n <= 64 && ((o.flows = static_cast<int>(n)), true);
    else if (a == "--incast-senders") ok = Num(v, &n) && n >= 1 && n <= 63 && ((o.incast_senders = static_cast<int>(n)), true);
    else if (a == "--seed") ok = Num(v, &o.seed);
    else if (a == "--duration-ms") ok = Num(v, &n) && n > 0 && n <= 100'000 && ((o.duration_us = n * 1000), true);
    else if (a == "--sample-us") ok = Num(v, &n) && n > 0 && ((o.sample_us = n), true);
    else if (a == "--stagger-us") ok = Num(v, &o.stagger_us);
    else if (a == "--warmup-ms") ok = Num(v, &n) && ((o.warmup_us = n * 1000), true);
    else if (a == "--window-ms") ok = Num(v, &n) && n > 0 && ((o.window_us = n * 1000), true);
    else if (a == "--incast-bytes") ok = Num(v, &n) && n > 0 && ((o.incast_bytes = n), true);
    else if (a == "--period-ms") ok = Num(v, &n) && n > 0 && ((o.incast_period_us = n * 1000), true);
    else if (a == "--line-gbps") ok = Dbl(v, &d) && d > 0 && d <= 400 && ((o.line_gbps = d), true);
    else if (a == "--bottleneck-gbps") ok = Dbl(v, &d) && d > 0 && d <= 400 && ((o.bottleneck.rate_bps = static_cast<uint64_t>(d * 1e9)), true);
    else if (a == "--buffer") ok = Num(v, &n) && n >= 4096 && n <= (1u << 30) && ((o.bottleneck.buffer_bytes = static_cast<uint32_t>(n)), true);
    else if (a == "--kmin") ok = Num(v, &n) && n <= (1u << 30) && ((o.bottleneck.red.kmin_bytes = static_cast<uint32_t>(n)), true);
    else if (a == "--kmax") ok = Num(v, &n) && n <= (1u << 30) && ((o.bottleneck.red.kmax_bytes = static_cast<uint32_t>(n)), true);
    else if (a == "--pmax") ok = Dbl(v, &d) && d <= 1 && ((o.bottleneck.red.pmax = d), true);
    else if (a == "--delay-us") ok = Num(v, &n) && n <= 1'000'000 && ((o.bottleneck.delay_ns = n * 1000), true);
    else if (a == "--cc") {
      const std::string s = v;
      if (s == "dcqcn") o.cc = cc::CcMode::kDcqcn;
      else if (s == "off") o.cc = cc::CcMode::kOff;
      else ok = false;
    } else if (a == "--dcqcn") {
      const absl::Status st = cc::ParseDcqcnParams(v, &o.dcqcn);
      if (!st.ok()) return Usage(std::string(st.message()));
    } else if (a == "--msg") ok = Num(v, &n) && n > 0 && n <= (1u << 24) && ((o.msg_bytes = static_cast<uint32_t>(n)), true);
    else if (a == "--outstanding") ok = Num(v, &n) && n >= 1 && n <= 256 && ((o.outstanding = static_cast<uint32_t>(n)), true);
    else if (a == "--mtu") {
      ok = Num(v, &n);
      uint8_t m = 0;
      for (uint8_t k = 1; k <= 5; ++k) {
        if (n == (128u << k)) m = k;
      }
      ok = ok && m != 0 && ((o.mtu = m), true);
    } else if (a == "--csv") csv = v;
    else if (a == "--png") png = v;
    else return Usage("unknown option '" + a + "'");
    if (!ok) return Usage("bad value '" + std::string(v) + "' for " + a);
  }
  if (o.bottleneck.red.kmax_bytes <= o.bottleneck.red.kmin_bytes) return Usage("--kmax must be above --kmin");
  if (!png.empty() && csv.empty()) return Usage("--png needs --csv");
  absl::StatusOr<cc::ScenarioResult> r = cc::RunScenario(o);
  if (!r.ok()) {
    std::fprintf(stderr, "droce cc-scenario: %s\n", std::string(r.status().message()).c_str());
    return 1;
  }
  std::fputs(cc::ScenarioSummary(o, *r).c_str(), stdout);
  if (!csv.empty()) {
    std::ofstream f(csv);
    f << cc::ScenarioCsv(*r);
    if (!f) {
      std::fprintf(stderr, "droce cc-scenario: cannot write %s\n", csv.c_str());
      return 1;
    }
    std::printf("csv: %s (%zu samples)\n", csv.c_str(), r->samples.size());
  }
  if (!png.empty()) {
    // gnuplot reads the script on its stdin (Debian's gnuplot-nox).
    const std::string script = cc::ScenarioGnuplot(o, csv, png);
    FILE* p = popen("gnuplot", "w");
    int st = -1;
    if (p != nullptr) {
      std::fputs(script.c_str(), p);
      st = pclose(p);
    }
    if (st != 0) {
      std::fprintf(stderr, "droce cc-scenario: gnuplot failed (is gnuplot installed? apt-get install gnuplot-nox)\n");
      return 1;
    }
    std::printf("png: %s\n", png.c_str());
  }
  if (check) {
    bool pass = r->data_ok;
    if (o.kind != cc::ScenarioKind::kIncast) {
      if (r->windows.empty()) {
        std::fprintf(stderr, "check: no window after warm-up (a longer --duration-ms)\n");
        pass = false;
      }
      for (const cc::ScenarioWindow& w : r->windows) {
        if (w.jain < 0.99 || w.utilisation < 0.95) {
          std::printf("check: window at %llu us: Jain %.4f, utilisation %.2f%%\n",
                      static_cast<unsigned long long>(w.start_us), w.jain, 100 * w.utilisation);
          pass = false;
        }
      }
    }
    std::printf("check: %s\n", pass ? "pass" : "FAIL");
    return pass ? 0 : 1;
  }
  return 0;
}

}  // namespace droce::cc_scenario
