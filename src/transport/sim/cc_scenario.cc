// The congestion-control scenario runner (transport/sim/cc_scenario.h).
#include "transport/sim/cc_scenario.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "transport/sim/two_qp.h"
#include "wire/bytes.h"
#include "wire/frame.h"

namespace droce::cc {
namespace {

using transport::sim::ConnectOpts;
using transport::sim::LinkFaults;
using transport::sim::SimNet;
using transport::sim::SimQp;

constexpr uint32_t kRecvIp = 0x0A000064;    // 10.0.0.100
constexpr uint32_t kSendBase = 0x0A000100;  // 10.0.1.0 + i
constexpr uint64_t kHopNs = 1000;           // NIC to switch

struct Flow {
  SimQp snd, rcv;
  bool endless = false;       // a long flow
  uint64_t start_ns = 0;
  uint64_t period_ns = 0;     // bursts repeat (mixed); 0: once
  uint64_t burst_bytes = 0;   // per burst
  uint64_t to_post = 0;       // bytes of the current burst not yet posted
  uint64_t burst_start_ns = 0, next_burst_ns = 0;
  uint32_t inflight = 0;
  bool in_burst = false;
  uint64_t wr = 0;
};

double Jain(const std::vector<double>& x) {
  double s = 0, s2 = 0;
  for (double v : x) s += v, s2 += v * v;
  return s2 == 0 ? 1.0 : s * s / (static_cast<double>(x.size()) * s2);
}

}  // namespace

const char* scenario_name(ScenarioKind k) {
  switch (k) {
    case ScenarioKind::kConverge: return "converge";
    case ScenarioKind::kIncast: return "incast";
    case ScenarioKind::kMixed: return "mixed";
  }
  return "?";
}

absl::StatusOr<ScenarioResult> RunScenario(const ScenarioOptions& o) {
  if (o.flows < 1 || o.flows > 64) return absl::InvalidArgumentError("flows: 1 to 64");
  if (o.kind == ScenarioKind::kMixed && (o.incast_senders < 1 || o.flows + o.incast_senders > 64)) {
    return absl::InvalidArgumentError("mixed: 1 to 64 senders in all");
  }
  if (o.sample_us == 0 || o.duration_us < o.sample_us || o.msg_bytes == 0 || o.outstanding == 0 ||
      o.outstanding > 256 || o.line_gbps <= 0 || o.bottleneck.rate_bps == 0) {
    return absl::InvalidArgumentError("sample, duration, message size, outstanding, rates must be positive");
  }
  SimNet net(LinkFaults{}, o.seed);
  const int n = o.kind == ScenarioKind::kMixed ? o.flows + o.incast_senders : o.flows;
  std::vector<std::unique_ptr<Flow>> flows;
  const uint32_t line_kbps = static_cast<uint32_t>(o.line_gbps * 1e6);
  for (int i = 0; i < n; ++i) {
    auto f = std::make_unique<Flow>();
    for (SimQp* q : {&f->snd, &f->rcv}) {
      q->cc = o.cc;
      q->dcqcn = o.dcqcn;
      q->line_mbps = line_kbps / 1000;
    }
    // The NIC: requests leave at most at the line rate, one frame at a time.
    f->snd.rate_kbps = line_kbps;
    f->snd.rate_burst = 1;
    f->snd.Init(&net.link, 0x100 + i, kSendBase + i, 512, 1024, o.msg_bytes);
    f->rcv.Init(&net.link, 0x200 + i, kRecvIp, 512, 1024, o.msg_bytes);
    for (size_t b = 0; b < f->snd.buf.size(); ++b) f->snd.buf[b] = static_cast<uint8_t>(b * 7 + i * 31 + o.seed);
    net.Attach(&f->snd);
    net.Attach(&f->rcv);
    ConnectOpts c;
    c.mtu = o.mtu;
    c.psn = static_cast<uint32_t>(0x100 * i);
    c.timeout = 12;  // 16.8 ms: never while the queue holds at most a few ms
    c.rnr_retry = 7;
    if (f->snd.Connect(f->rcv, c) != 0 || f->rcv.Connect(f->snd, c) != 0) {
      return absl::InternalError("connecting the simulated QPs failed");
    }
    switch (o.kind) {
      case ScenarioKind::kConverge:
        f->endless = true;
        f->start_ns = static_cast<uint64_t>(i) * o.stagger_us * 1000;
        break;
      case ScenarioKind::kIncast:
        f->start_ns = o.stagger_us * 1000;
        f->burst_bytes = o.incast_bytes;
        break;
      case ScenarioKind::kMixed:
        if (i < o.flows) {
          f->endless = true;
        } else {
          f->start_ns = o.stagger_us * 1000;
          f->burst_bytes = o.incast_bytes;
          f->period_ns = o.incast_period_us * 1000;
        }
        break;
    }
    f->next_burst_ns = f->start_ns;
    flows.push_back(std::move(f));
  }

  const uint64_t t0 = net.link.clock;
  const uint64_t end = t0 + o.duration_us * 1000;
  const size_t nsamples = o.duration_us / o.sample_us;
  // Bytes of frames leaving the bottleneck, per flow and sample period.
  std::vector<std::vector<double>> sent(n, std::vector<double>(nsamples + 1, 0.0));
  EgressPort bottleneck(o.bottleneck, o.seed * 0x9E3779B97F4A7C15ull + 1);
  std::vector<EgressPort> back;
  PortParams bp;
  bp.rate_bps = static_cast<uint64_t>(o.line_gbps * 1e9);
  bp.buffer_bytes = 64 << 20;
  bp.ecn = false;
  bp.delay_ns = o.bottleneck.delay_ns;
  for (int i = 0; i < n; ++i) back.emplace_back(bp, i + 1);
  ScenarioResult r;
  net.link.shaper = [&](uint8_t* d, uint32_t len, uint64_t now, uint64_t* due) {
    if (len < wire::kRoceV4HeadLen) return true;
    const uint32_t sip = wire::load_be32(d + wire::kEthLen + 12);
    const uint32_t dip = wire::load_be32(d + wire::kEthLen + 16);
    if (dip == kRecvIp) {
      const EgressPort::Verdict v = bottleneck.Enqueue(len, FrameEcn(d, len) != kEcnNotEct,
                                                       now + kHopNs);
      if (v.drop) return false;
      if (v.mark) MarkCe(d, len);
      *due = v.arrive_ns;
      r.max_queue_bytes = std::max(r.max_queue_bytes, bottleneck.QueueBytes(now + kHopNs));
      const uint64_t left = v.arrive_ns - o.bottleneck.delay_ns;
      const size_t s = (left - t0) / (o.sample_us * 1000);
      const uint32_t fi = sip - kSendBase;
      if (fi < static_cast<uint32_t>(n) && s < sent[fi].size()) sent[fi][s] += len;
      return true;
    }
    const uint32_t fi = dip - kSendBase;
    if (fi >= static_cast<uint32_t>(n)) return true;
    const EgressPort::Verdict v = back[fi].Enqueue(len, false, now + kHopNs);
    if (v.drop) return false;
    *due = v.arrive_ns;
    return true;
  };

  std::vector<queue::Cqe> cqes(64);
  uint64_t next_sample = t0;
  // After `end` nothing more is posted and the run continues until every
  // WRITE completed (at most a second of virtual time), so that the data
  // can be checked.
  const uint64_t drain_limit = end + 1'000'000'000;
  for (;;) {
    const uint64_t now = net.link.clock;
    const bool draining = now >= end;
    if (draining) {
      bool idle = true;
      for (auto& fp : flows) idle &= fp->inflight == 0;
      if (idle || now > drain_limit) break;
    }
    for (auto& fp : flows) {
      Flow& f = *fp;
      for (int k; (k = f.snd.scq_c->Poll(cqes.data(), 64)) > 0;) {
        for (int j = 0; j < k; ++j) {
          if (cqes[j].status != queue::wc::kSuccess) {
            return absl::InternalError(absl::StrCat("flow ", &fp - &flows[0], ": WRITE completed with status ",
                                                    cqes[j].status));
          }
        }
        f.inflight -= static_cast<uint32_t>(k);
      }
      if (!f.endless && f.in_burst && f.to_post == 0 && f.inflight == 0) {
        r.completion_us.push_back(static_cast<double>(now - f.burst_start_ns) / 1000);
        f.in_burst = false;
      }
      if (now < f.start_ns + t0) continue;
      if (!draining && !f.endless && !f.in_burst && f.next_burst_ns != UINT64_MAX && now >= f.next_burst_ns + t0) {
        f.in_burst = true;
        f.to_post = f.burst_bytes;
        f.burst_start_ns = now;
        f.next_burst_ns = f.period_ns != 0 ? f.next_burst_ns + f.period_ns : UINT64_MAX;
      }
      while (!draining && f.inflight < o.outstanding && (f.endless || f.to_post > 0) && f.snd.SqHasRoom()) {
        const uint32_t len = f.endless ? o.msg_bytes : static_cast<uint32_t>(std::min<uint64_t>(f.to_post, o.msg_bytes));
        f.snd.PostOp(queue::WqeOp::kWrite, ++f.wr, 0, len, f.rcv.Addr(0), f.rcv.key);
        ++f.inflight;
        if (!f.endless) f.to_post -= len;
      }
    }
    net.Step(16);
    while (next_sample <= net.link.clock && next_sample < end) {
      ScenarioSample s;
      s.t_us = (next_sample - t0) / 1000;
      s.queue_bytes = bottleneck.QueueBytes(net.link.clock + kHopNs);  // now: later frames are in the port
      for (auto& fp : flows) {
        const ReactionPoint& rp = fp->snd.qp->reaction_point();
        s.rp_mbps.push_back(rp.active() ? rp.rate_mbps() : rp.max_mbps());
      }
      r.samples.push_back(std::move(s));
      next_sample += o.sample_us * 1000;
    }
  }
  // Throughput per sample, from the bytes that left the bottleneck.
  const double period_s = static_cast<double>(o.sample_us) / 1e6;
  for (size_t k = 0; k < r.samples.size(); ++k) {
    for (int i = 0; i < n; ++i) r.samples[k].gbps.push_back(sent[i][k] * 8 / period_s / 1e9);
  }
  // Fairness and utilisation over windows after warm-up, among the long
  // flows that had started before the window.
  const double cap = static_cast<double>(o.bottleneck.rate_bps);
  double util_sum = 0;
  r.min_jain = 1;
  const uint64_t per_window = std::max<uint64_t>(1, o.window_us / o.sample_us);
  for (uint64_t w = o.warmup_us / o.sample_us; w + per_window <= r.samples.size(); w += per_window) {
    std::vector<double> x;
    double total = 0;
    for (int i = 0; i < n; ++i) {
      double b = 0;
      for (uint64_t k = w; k < w + per_window; ++k) b += sent[i][k];
      total += b;
      if (flows[i]->endless && flows[i]->start_ns <= w * o.sample_us * 1000) x.push_back(b);
    }
    ScenarioWindow win;
    win.start_us = w * o.sample_us;
    win.jain = x.empty() ? 1 : Jain(x);
    win.utilisation = total * 8 / (static_cast<double>(per_window) * period_s * cap);
    r.windows.push_back(win);
    r.min_jain = std::min(r.min_jain, win.jain);
    util_sum += win.utilisation;
  }
  r.mean_utilisation = r.windows.empty() ? 0 : util_sum / static_cast<double>(r.windows.size());
  r.bottleneck = bottleneck.stats;
  for (auto& fp : flows) {
    r.cnps += fp->rcv.env->stats.np_cnp_sent;
    r.cuts += fp->snd.qp->reaction_point().cuts();
    // Every WRITE carried the sender's buffer to the same place: once the
    // last completed, the receiver holds it.
    if (fp->inflight != 0) r.data_ok = false;  // not drained
    if (fp->inflight == 0 && fp->wr > 0) {
      const uint32_t len = fp->endless ? o.msg_bytes
                                       : static_cast<uint32_t>(std::min<uint64_t>(o.msg_bytes, fp->burst_bytes));
      r.data_ok &= std::memcmp(fp->rcv.buf.data(), fp->snd.buf.data(), len) == 0;
      r.bytes_verified += len;
    }
  }
  return r;
}

std::string ScenarioCsv(const ScenarioResult& r) {
  std::string out = "t_us,queue_bytes";
  const size_t n = r.samples.empty() ? 0 : r.samples[0].rp_mbps.size();
  for (size_t i = 0; i < n; ++i) absl::StrAppend(&out, ",gbps_", i);
  for (size_t i = 0; i < n; ++i) absl::StrAppend(&out, ",rp_mbps_", i);
  out += "\n";
  for (const ScenarioSample& s : r.samples) {
    absl::StrAppend(&out, s.t_us, ",", s.queue_bytes);
    for (double g : s.gbps) absl::StrAppend(&out, absl::StrFormat(",%.4f", g));
    for (double m : s.rp_mbps) absl::StrAppend(&out, absl::StrFormat(",%.1f", m));
    out += "\n";
  }
  return out;
}

std::string ScenarioGnuplot(const ScenarioOptions& o, const std::string& csv_path, const std::string& png_path) {
  const int n = o.kind == ScenarioKind::kMixed ? o.flows + o.incast_senders : o.flows;
  std::string s;
  absl::StrAppend(&s, "set terminal pngcairo size 1200,900 font ',10'\n", "set output '", png_path, "'\n",
                  "set datafile separator ','\n", "set key outside right\n", "set grid\n",
                  "set multiplot layout 3,1 title '", scenario_name(o.kind), ": ", n, " flows, bottleneck ",
                  absl::StrFormat("%.0f", static_cast<double>(o.bottleneck.rate_bps) / 1e9), " Gb/s, seed ", o.seed,
                  "'\n");
  absl::StrAppend(&s, "set ylabel 'throughput (Gb/s)'\n", "plot for [i=0:", n - 1, "] '", csv_path,
                  "' using ($1/1000):(column(3+i)) every ::1 with lines title sprintf('flow %d', i)\n");
  absl::StrAppend(&s, "set ylabel 'DCQCN rate (Gb/s)'\n", "plot for [i=0:", n - 1, "] '", csv_path,
                  "' using ($1/1000):(column(", 3 + n, "+i)/1000) every ::1 with lines title sprintf('flow %d', i)\n");
  absl::StrAppend(&s, "set xlabel 'time (ms)'\n", "set ylabel 'queue (KB)'\n", "plot '", csv_path,
                  "' using ($1/1000):($2/1000) every ::1 with lines title 'bottleneck queue'\n", "unset multiplot\n");
  return s;
}

std::string ScenarioSummary(const ScenarioOptions& o, const ScenarioResult& r) {
  std::string s = absl::StrFormat(
      "scenario %s, %d flows, seed %llu, %llu us: bottleneck %llu frames, %llu marked (%.2f%% of ECT), %llu "
      "dropped, max queue %llu B; %llu CNPs, %llu DCQCN cuts\n",
      scenario_name(o.kind), o.kind == ScenarioKind::kMixed ? o.flows + o.incast_senders : o.flows,
      static_cast<unsigned long long>(o.seed), static_cast<unsigned long long>(o.duration_us),
      static_cast<unsigned long long>(r.bottleneck.frames), static_cast<unsigned long long>(r.bottleneck.marked),
      r.bottleneck.ect ? 100.0 * static_cast<double>(r.bottleneck.marked) / static_cast<double>(r.bottleneck.ect) : 0.0,
      static_cast<unsigned long long>(r.bottleneck.dropped), static_cast<unsigned long long>(r.max_queue_bytes),
      static_cast<unsigned long long>(r.cnps), static_cast<unsigned long long>(r.cuts));
  if (!r.windows.empty()) {
    absl::StrAppend(&s, absl::StrFormat("after %llu us: %zu windows of %llu us, Jain's index min %.4f, utilisation mean %.2f%%\n",
                                        static_cast<unsigned long long>(o.warmup_us), r.windows.size(),
                                        static_cast<unsigned long long>(o.window_us), r.min_jain,
                                        100 * r.mean_utilisation));
  }
  if (!r.completion_us.empty()) {
    std::vector<double> c = r.completion_us;
    std::sort(c.begin(), c.end());
    absl::StrAppend(&s, absl::StrFormat("bursts: %zu, completion min %.1f us, median %.1f us, max %.1f us\n", c.size(),
                                        c.front(), c[c.size() / 2], c.back()));
  }
  absl::StrAppend(&s, "data: ", r.data_ok ? "verified" : "MISMATCH", " (", r.bytes_verified, " bytes compared)\n");
  return s;
}

}  // namespace droce::cc
