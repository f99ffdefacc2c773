// What a device reports while it runs: its counters (summed over the
// workers, or peeked without stopping them), each QP's counters and latency
// histograms, the link's own counters, and `rdma res show`'s objects.
#include <algorithm>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "engine/device.h"

namespace droce::engine {

void Device::PrintLatency(const std::string& dev, uint32_t qpn, const transport::Qp& qp) {
  for (int c = 0; c < transport::Qp::kNumLatClasses; ++c) {
    const lab::LatencyHistogram* h = qp.latency(c);
    if (h == nullptr || h->count() == 0) continue;
    lab::PrintLatencyLine(stderr, dev.c_str(), qpn, c, "post to completion entered", *h);
  }
}

void Device::PeekQpLatency(
    const std::function<void(uint32_t qpn, int cls, const lab::LatencyHistogram&)>& f) {
  // Under the control lock (the QP cannot go meanwhile); the histograms are
  // read while the workers count into them (Peek).
  std::lock_guard<std::mutex> l(ctl_mu_);
  for (const auto& [qpn, e] : objects_.qps) {
    for (int c = 0; c < transport::Qp::kNumLatClasses; ++c) {
      if (const lab::LatencyHistogram* h = e->qp->latency(c); h != nullptr) f(qpn, c, *h);
    }
  }
}

std::string Device::LinkReport() {
  io::DpdkPort::Stats s;
  if (!ReadLinkStats(&s)) return {};
  std::string out = "link";
  for (const auto& f : io::DpdkPort::kStatFields) absl::StrAppend(&out, " ", f.name, " ", s.*f.field);
  return out;
}

Counters Device::ReadCounters() {
  Counters c;
  RunOnWorker([&] {
    for (const auto& w : workers_) {
      for (const CounterInfo& i : kCounterInfo) c.*i.field += w->stats.*i.field;
    }
  });
  return c;
}

Counters Device::PeekCounters() const {
  Counters c;
  for (const auto& w : workers_) {
    for (const CounterInfo& i : kCounterInfo) c.*i.field += Peek(w->stats.*i.field);
  }
  return c;
}

void Device::PeekQpCounters(const std::function<void(uint32_t, uint64_t, const QpCounters&)>& f) {
  // ctl_mu_ alone: the tables change only under it (RunOnWorker), and the
  // counters are read with Peek, so the workers keep running. The lock is
  // held for the copy only (a few µs per 1,000 QPs), not while `f` formats.
  struct Row {
    uint32_t qpn;
    uint64_t owner;
    QpCounters c;
  };
  std::vector<Row> rows;
  {
    std::lock_guard<std::mutex> l(ctl_mu_);
    rows.reserve(objects_.qps.size());
    for (const auto& [qpn, e] : objects_.qps) {
      Row& r = rows.emplace_back(Row{qpn, e->owner, {}});
      const QpCounters& live = e->qp->counters();
      for (size_t i = 0; i < kNumQpCounters; ++i) r.c.values[i] = Peek(live.values[i]);
    }
  }
  for (const Row& r : rows) f(r.qpn, r.owner, r.c);
}

Device::Resources Device::ReadResources() {
  Resources r;
  RunOnWorker([&] {
    r.qps.reserve(objects_.qps.size());
    for (const auto& [qpn, e] : objects_.qps) {
      const transport::Qp& q = *e->qp;
      r.qps.push_back({qpn, e->pd, e->send_cq, e->recv_cq, e->srq, q.attr().dest_qpn, q.next_psn(),
                       q.expected_psn(), q.type(), q.state(), q.attr().path_mtu, e->owner,
                       q.retrans_timer(), q.RetransTimeoutNs(), q.rtt().has_sample() ? q.rtt().srtt_ns() : 0});
    }
    for (const auto& [id, c] : objects_.cqs) r.cqs.push_back({id, c.region->capacity(), c.users});
    for (const auto& [id, pd] : objects_.pds) r.pds.push_back({id, pd.uses});
    objects_.mrs.ForEachMr([&](const mem::Mr& mr) { r.mrs.push_back(mr); });
  });
  auto by = [](auto& v, auto key) { std::sort(v.begin(), v.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); }); };
  by(r.qps, [](const QpRes& q) { return q.qpn; });
  by(r.cqs, [](const CqRes& c) { return c.id; });
  by(r.pds, [](const PdRes& p) { return p.id; });
  return r;
}

absl::StatusOr<QpCounters> Device::ReadQpCounters(uint32_t qpn) {
  absl::StatusOr<QpCounters> r = absl::NotFoundError("no such QP");
  RunOnWorker([&] {
    if (auto it = objects_.qps.find(qpn); it != objects_.qps.end()) r = it->second->qp->counters();
  });
  return r;
}

}  // namespace droce::engine
