#include "poll_latency.h"

#include <cstdio>

#include "engine/config.h"
#include "common/stamp_clock.h"

namespace droce::provider {

bool latency_on() {
  static const bool on = [] {
    auto cfg = engine::ConfigFromEnv(0);
    const bool yes = cfg.ok() && cfg->latency;
    if (yes) lab::StampCalibrate();  // once, before the first stamp
    return yes;
  }();
  return on;
}

uint32_t post_stamp() { return latency_on() ? lab::StampNow() : 0; }

uint32_t PollLatency::Now() { return lab::StampNow(); }

void PollLatency::Record(const Sample* s, int n, uint32_t now) {
  std::lock_guard<std::mutex> l(mu_);
  for (int i = 0; i < n; ++i) {
    auto& h = by_qp_[s[i].qpn][lab::LatencyClassOfWc(s[i].wc_opcode)];
    if (h == nullptr) h = std::make_unique<lab::LatencyHistogram>();
    h->Record(lab::StampSpanNs(s[i].stamp, now));
  }
}

void PollLatency::Report(const char* dev, uint32_t qpn) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = by_qp_.find(qpn);
  if (it == by_qp_.end()) return;
  for (int c = 0; c < lab::kNumLatencyClasses; ++c) {
    if (it->second[c] != nullptr && it->second[c]->count() != 0) {
      lab::PrintLatencyLine(stderr, dev, qpn, c, "post to poll", *it->second[c]);
    }
  }
  by_qp_.erase(it);
}

}  // namespace droce::provider
