// droce-switch: a congested Ethernet switch on live links.
// Each --port is a memif server socket that a droce process (droce exec
// --link net_memif0,role=client,socket=PATH) or any memif peer connects to;
// frames are switched by learned MAC (flooded when unknown) and leave each
// port through the egress model of src/cc/switch.h — its rate, buffer with
// tail drop, RED/ECN marking and delay — held in software until their
// departure time. Several real perftest processes then share one
// bottleneck. See docs/LAB.md, "Congestion control".
#include <signal.h>
#include <time.h>

#include <cstdio>
#include <cstdlib>
#include <deque>
#include <string>
#include <vector>

#include <rte_ethdev.h>
#include <rte_mbuf.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cc/forwarder.h"
#include "cc/switch.h"
#include "io/dpdk_port.h"
#include "lab/fault_rules.h"

namespace {

volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }

uint64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

constexpr const char* kUsage =
    "usage: droce-switch --port SOCKET [--port SOCKET ...] [options]\n"
    "  A learning Ethernet switch between memif links whose egress ports are\n"
    "  congested on purpose: a rate, a buffer with tail drop, RED/ECN marking\n"
    "  (probability 0 up to Kmin, Pmax at Kmax, 1 above) and a delay.\n"
    "  Each --port SOCKET is a memif server socket (peers connect as\n"
    "  role=client, e.g. droce exec --link net_memif0,role=client,socket=SOCKET,socket-abstract=no).\n"
    "  --rate R        every egress port's rate (tc's units: 1gbit, 500M; default 10gbit)\n"
    "  --port-rate I=R port I's rate instead (0-based, in --port order)\n"
    "  --buffer BYTES  each port's buffer (default 524288)\n"
    "  --kmin BYTES (5120) --kmax BYTES (204800) --pmax P (0.01)   RED/ECN\n"
    "  --no-ecn        tail drop only\n"
    "  --delay-us N    propagation delay after each port (default 1)\n"
    "  --seed N        the marking dice (default 1)\n"
    "  --duration S    stop after S seconds (default: until SIGINT/SIGTERM)\n"
    "  Per-port counters are printed when it stops.\n";

int Usage(const std::string& why) {
  std::fprintf(stderr, "droce-switch: %s\n%s", why.c_str(), kUsage);
  return 2;
}

struct Held {
  rte_mbuf* m;
  uint64_t release_ns;
  uint32_t len;  // read before the PMD owns the mbuf
};

struct PortState {
  std::string socket;
  droce::io::DpdkPort port;
  std::deque<Held> pending;
  uint64_t rx = 0, tx = 0, tx_bytes = 0, tx_refused = 0;
  uint64_t first_tx_ns = 0, last_tx_ns = 0;
};

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> sockets;
  std::vector<std::pair<int, uint64_t>> port_rates;
  droce::cc::PortParams pp;
  pp.rate_bps = 10'000'000'000ull;
  pp.buffer_bytes = 512 * 1024;
  pp.delay_ns = 1000;
  uint64_t seed = 1, duration_s = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--no-ecn") {
      pp.ecn = false;
      continue;
    }
    if (i + 1 >= argc) return Usage("'" + a + "' needs a value");
    const std::string v = argv[++i];
    uint64_t n = 0;
    double d = 0;
    if (a == "--port") {
      sockets.push_back(v);
    } else if (a == "--rate") {
      if (!droce::lab::ParseRate(v, &pp.rate_bps) || pp.rate_bps == 0) return Usage("bad --rate '" + v + "'");
    } else if (a == "--port-rate") {
      const size_t eq = v.find('=');
      uint64_t idx = 0, bps = 0;
      if (eq == std::string::npos || !absl::SimpleAtoi(v.substr(0, eq), &idx) ||
          !droce::lab::ParseRate(v.substr(eq + 1), &bps) || bps == 0) {
        return Usage("bad --port-rate '" + v + "' (I=RATE)");
      }
      port_rates.emplace_back(static_cast<int>(idx), bps);
    } else if (a == "--buffer" && absl::SimpleAtoi(v, &n) && n >= 2048 && n <= (1u << 30)) {
      pp.buffer_bytes = static_cast<uint32_t>(n);
    } else if (a == "--kmin" && absl::SimpleAtoi(v, &n) && n <= (1u << 30)) {
      pp.red.kmin_bytes = static_cast<uint32_t>(n);
    } else if (a == "--kmax" && absl::SimpleAtoi(v, &n) && n <= (1u << 30)) {
      pp.red.kmax_bytes = static_cast<uint32_t>(n);
    } else if (a == "--pmax" && absl::SimpleAtod(v, &d) && d >= 0 && d <= 1) {
      pp.red.pmax = d;
    } else if (a == "--delay-us" && absl::SimpleAtoi(v, &n) && n <= 1'000'000) {
      pp.delay_ns = n * 1000;
    } else if (a == "--seed" && absl::SimpleAtoi(v, &n)) {
      seed = n;
    } else if (a == "--duration" && absl::SimpleAtoi(v, &n) && n > 0) {
      duration_s = n;
    } else {
      return Usage("bad option or value: " + a + " " + v);
    }
  }
  if (sockets.size() < 2) return Usage("at least two --port");
  if (sockets.size() > 16) return Usage("at most 16 ports");
  if (pp.red.kmax_bytes <= pp.red.kmin_bytes) return Usage("--kmax must be above --kmin");
  for (const auto& [idx, bps] : port_rates) {
    if (idx < 0 || idx >= static_cast<int>(sockets.size())) return Usage("--port-rate: no such port");
  }

  droce::io::EalOptions eo;
  eo.link = "net_memif0";
  if (absl::Status s = droce::io::InitEal(eo); !s.ok()) {
    std::fprintf(stderr, "droce-switch: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  std::vector<PortState> ports(sockets.size());
  for (size_t i = 0; i < sockets.size(); ++i) {
    ports[i].socket = sockets[i];
    droce::io::PortOptions po;
    po.devargs = absl::StrCat("net_memif", i, ",role=server,socket=", sockets[i], ",socket-abstract=no");
    if (absl::Status s = ports[i].port.Open(po); !s.ok()) {
      std::fprintf(stderr, "droce-switch: port %zu (%s): %s\n", i, sockets[i].c_str(), std::string(s.message()).c_str());
      return 1;
    }
  }
  droce::cc::Forwarder fwd(static_cast<int>(ports.size()), pp, seed);
  for (const auto& [idx, bps] : port_rates) {
    droce::cc::PortParams p = pp;
    p.rate_bps = bps;
    fwd.SetPort(idx, p, seed + static_cast<uint64_t>(idx));
  }
  signal(SIGINT, OnSignal);
  signal(SIGTERM, OnSignal);
  std::printf("droce-switch: %zu ports, %.3f Gb/s, buffer %u B, RED %s (Kmin %u B, Kmax %u B, Pmax %.4f), delay %llu us\n",
              ports.size(), static_cast<double>(pp.rate_bps) / 1e9, pp.buffer_bytes, pp.ecn ? "on" : "off",
              pp.red.kmin_bytes, pp.red.kmax_bytes, pp.red.pmax, static_cast<unsigned long long>(pp.delay_ns / 1000));
  std::fflush(stdout);

  const uint64_t start = NowNs();
  const uint64_t end = duration_s != 0 ? start + duration_s * 1'000'000'000ull : UINT64_MAX;
  std::vector<droce::cc::Forwarder::Copy> copies;
  rte_mbuf* burst[32];
  uint32_t idle = 0;
  while (!g_stop) {
    uint64_t now = NowNs();
    if (now >= end) break;
    bool busy = false;
    for (size_t p = 0; p < ports.size(); ++p) {
      const uint16_t n = rte_eth_rx_burst(ports[p].port.port_id(), 0, burst, 32);
      if (n == 0) continue;
      busy = true;
      now = NowNs();
      ports[p].rx += n;
      for (uint16_t k = 0; k < n; ++k) {
        rte_mbuf* m = burst[k];
        if (m->nb_segs > 1 && rte_pktmbuf_linearize(m) != 0) {
          rte_pktmbuf_free(m);
          continue;
        }
        uint8_t* f = rte_pktmbuf_mtod(m, uint8_t*);
        const uint32_t len = rte_pktmbuf_pkt_len(m);
        fwd.Ingress(static_cast<int>(p), f, len, droce::cc::FrameEcn(f, len) != droce::cc::kEcnNotEct, now, &copies);
        if (copies.empty()) {
          rte_pktmbuf_free(m);
          continue;
        }
        for (size_t c = 0; c < copies.size(); ++c) {
          rte_mbuf* x = c + 1 == copies.size() ? m : rte_pktmbuf_copy(m, ports[p].port.pool(), 0, UINT32_MAX);
          if (x == nullptr) continue;
          if (copies[c].mark) droce::cc::MarkCe(rte_pktmbuf_mtod(x, uint8_t*), x->data_len);
          ports[copies[c].port].pending.push_back({x, copies[c].release_ns, len});
        }
      }
    }
    // Each port's frames leave in order once their time has come.
    uint64_t next_release = UINT64_MAX;
    for (PortState& ps : ports) {
      rte_mbuf* out[32];
      uint16_t k = 0;
      while (k < 32 && k < ps.pending.size() && ps.pending[k].release_ns <= now) ++k;
      if (k > 0) {
        for (uint16_t j = 0; j < k; ++j) out[j] = ps.pending[j].m;
        const uint16_t sent = rte_eth_tx_burst(ps.port.port_id(), 0, out, k);
        for (uint16_t j = 0; j < sent; ++j) {
          ps.tx_bytes += ps.pending.front().len;
          ps.pending.pop_front();
        }
        if (sent > 0) {
          if (ps.first_tx_ns == 0) ps.first_tx_ns = now;
          ps.last_tx_ns = now;
          ps.tx += sent;
          busy = true;
        }
        if (sent < k) ++ps.tx_refused;  // the peer's ring is full: the rest goes next turn
      }
      if (!ps.pending.empty()) next_release = std::min(next_release, ps.pending.front().release_ns);
    }
    if (busy) {
      idle = 0;
      continue;
    }
    // Idle: spin while a departure is near (the model's timing), else back
    // off so that the endpoints on the same CPUs can run.
    if (next_release != UINT64_MAX && next_release <= now + 20'000) continue;
    if (++idle < 64 && next_release == UINT64_MAX) continue;
    uint64_t nap = 50'000;
    if (next_release != UINT64_MAX) nap = std::min<uint64_t>(nap, next_release - now - 10'000);
    const timespec ts{0, static_cast<long>(nap)};
    nanosleep(&ts, nullptr);
  }
  for (size_t p = 0; p < ports.size(); ++p) {
    const PortState& ps = ports[p];
    const droce::cc::PortStats& st = fwd.port(static_cast<int>(p)).stats;
    const double secs = ps.last_tx_ns > ps.first_tx_ns ? static_cast<double>(ps.last_tx_ns - ps.first_tx_ns) / 1e9 : 0;
    std::printf("droce-switch: port %zu (%s): rx %llu frames; egress accepted %llu frames %llu bytes, ECN-capable %llu, "
                "marked %llu, dropped %llu; sent %llu frames %llu bytes, %.4f Gb/s while sending, refused by the link %llu times\n",
                p, ps.socket.c_str(), static_cast<unsigned long long>(ps.rx), static_cast<unsigned long long>(st.frames),
                static_cast<unsigned long long>(st.bytes), static_cast<unsigned long long>(st.ect),
                static_cast<unsigned long long>(st.marked), static_cast<unsigned long long>(st.dropped),
                static_cast<unsigned long long>(ps.tx), static_cast<unsigned long long>(ps.tx_bytes),
                secs > 0 ? static_cast<double>(ps.tx_bytes) * 8 / secs / 1e9 : 0.0,
                static_cast<unsigned long long>(ps.tx_refused));
  }
  for (PortState& ps : ports) {
    for (const Held& h : ps.pending) rte_pktmbuf_free(h.m);
    ps.pending.clear();
    ps.port.Close();
  }
  std::printf("droce-switch: flooded %llu frames\n", static_cast<unsigned long long>(fwd.flooded));
  return 0;
}
