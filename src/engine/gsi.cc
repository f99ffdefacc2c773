// QP1, the GSI QP (IBTA 13.5.1), for the connection manager: received UD
// SENDs to QPN 1 are checked (Q_Key 0x80010000, a 256-byte MAD) and handed
// to the sink; MADs to send wait in a queue that worker 0 drains, resolving
// each destination's MAC first (ARP/ND), so that a REQ to a peer nobody
// has talked to yet still leaves. Control traffic only: the queue takes a
// mutex.
#include <rte_mbuf.h>

#include <time.h>

#include <cstring>

#include "engine/device.h"
#include "wire/build.h"

namespace droce::engine {
namespace {
constexpr uint32_t kGsiQpn = 1;
constexpr uint32_t kGsiQkey = 0x80010000;
constexpr size_t kMadLen = 256;
constexpr uint64_t kGsiHoldNs = 3'000'000'000;  // waiting for a MAC
constexpr size_t kGsiQueueMax = 4096;
constexpr size_t kKnownMax = 1024;
}  // namespace

void Device::HandleGsi(Worker& w, const wire::PacketView& v) {
  GsiSink* sink = gsi_sink_.load(std::memory_order_acquire);
  if (v.bth.opcode != static_cast<uint8_t>(wire::Opcode::kUdSendOnly) || v.payload == nullptr ||
      v.payload_len < kMadLen || sink == nullptr) {
    Bump(w.stats.gsi_drop);
    return;
  }
  const wire::Deth deth = wire::read_deth(v.ext(wire::kBthLen));
  if (deth.qkey != kGsiQkey) {
    Bump(w.stats.gsi_drop);
    return;
  }
  w.LearnSender(v);
  GsiMad mad;
  mad.sgid = v.sip6;
  mad.dgid = v.dip6;
  mad.src_qpn = deth.src_qp;
  mad.tclass = v.tos;
  mad.hop_limit = v.ttl;
  std::memcpy(mad.mad, v.payload, kMadLen);
  Bump(w.stats.gsi_rcvd);
  sink->OnGsi(mad);
}

void Device::SendGsi(const wire::Ipv6Addr& sgid, const wire::Ipv6Addr& dgid, uint32_t dqpn, uint8_t tclass,
                     const uint8_t* mad) {
  {
    std::lock_guard<std::mutex> l(gsi_mu_);
    if (gsi_out_.size() >= kGsiQueueMax) return;  // a CM flooding its own link: drop (the CM retries)
    GsiOut o;
    o.sgid = sgid;
    o.dgid = dgid;
    o.dqpn = dqpn;
    o.tclass = tclass;
    o.since_ns = NowNs();
    std::memcpy(o.mad.data(), mad, kMadLen);
    gsi_out_.push_back(o);
    ++gsi_queued_;
    gsi_pending_.store(true, std::memory_order_release);
  }
  WakeWorkerNow(workers_[0]->wake);
}

bool Device::FlushGsi(uint64_t timeout_ns) {
  uint64_t target;
  {
    std::lock_guard<std::mutex> l(gsi_mu_);
    target = gsi_queued_;
  }
  const uint64_t deadline = NowNs() + timeout_ns;
  while (gsi_done_.load(std::memory_order_acquire) < target) {
    if (NowNs() >= deadline) return false;
    WakeWorkerNow(workers_[0]->wake);
    const timespec step{0, 200'000};
    nanosleep(&step, nullptr);
  }
  return true;
}

int Device::ResolveNeighbor(const wire::Ipv6Addr& dgid) {
  {
    std::lock_guard<std::mutex> l(gsi_mu_);
    for (const auto& k : gsi_known_) {
      if (k == dgid) return 1;
    }
    bool asked = false;
    for (const auto& o : gsi_out_) asked |= o.resolve_only && o.dgid == dgid;
    if (!asked) {
      GsiOut o;
      o.dgid = dgid;
      o.resolve_only = true;
      o.since_ns = NowNs();
      gsi_out_.push_back(o);
      gsi_pending_.store(true, std::memory_order_release);
    }
  }
  WakeWorkerNow(workers_[0]->wake);
  return 0;
}

bool Device::DrainGsi(Worker& w) {
  std::vector<GsiOut> out;
  {
    std::lock_guard<std::mutex> l(gsi_mu_);
    out.swap(gsi_out_);
    gsi_pending_.store(false, std::memory_order_relaxed);
  }
  const uint64_t now = NowNs();
  std::vector<GsiOut> waiting;
  std::vector<wire::Ipv6Addr> resolved;
  bool sent = false;
  uint64_t done = 0;  // MADs sent or dropped
  for (GsiOut& o : out) {
    wire::MacAddr mac;
    if (!ResolveMac(w, o.dgid, &mac)) {
      if (now - o.since_ns < kGsiHoldNs) {
        waiting.push_back(o);
      } else if (!o.resolve_only) {
        Bump(w.stats.gsi_drop);
        ++done;
      }
      continue;
    }
    resolved.push_back(o.dgid);
    if (o.resolve_only) continue;
    wire::Path path;
    wire::path_set_gids(&path, o.sgid.data(), o.dgid.data());
    path.smac = port_.mac;
    path.dmac = mac;
    path.tos = o.tclass;
    path.udp_sport = wire::udp_sport_for_qp(kGsiQpn, o.dqpn);
    wire::TransportHeaders h;
    h.bth.opcode = static_cast<uint8_t>(wire::Opcode::kUdSendOnly);
    h.bth.pkey = 0xFFFF;
    h.bth.dqpn = o.dqpn;
    h.bth.psn = gsi_psn_++ & 0xFFFFFF;
    h.deth.qkey = kGsiQkey;
    h.deth.src_qp = kGsiQpn;
    const size_t len = wire::frame_len_for(path, h.bth.opcode, kMadLen);
    transport::TxFrame f;
    if (!w.AllocFrame(static_cast<uint32_t>(len), &f)) {
      waiting.push_back(o);  // the link pushes back: next turn
      continue;
    }
    const size_t n = wire::build_frame({f.data, f.capacity}, path, h, {o.mad.data(), kMadLen});
    w.SendFrame(f, static_cast<uint32_t>(n));
    Bump(w.stats.gsi_sent);
    sent = true;
    ++done;
  }
  // On the link now, not at the end of the turn: FlushGsi's waiter may be a
  // process about to exit.
  if (sent) w.FlushTx();
  if (done != 0) gsi_done_.fetch_add(done, std::memory_order_release);
  std::lock_guard<std::mutex> l(gsi_mu_);
  for (const auto& g : resolved) {
    bool have = false;
    for (const auto& k : gsi_known_) have |= k == g;
    if (!have) {
      if (gsi_known_.size() >= kKnownMax) gsi_known_.erase(gsi_known_.begin());
      gsi_known_.push_back(g);
    }
  }
  if (!waiting.empty()) {
    gsi_out_.insert(gsi_out_.begin(), waiting.begin(), waiting.end());
    gsi_pending_.store(true, std::memory_order_relaxed);
  }
  return sent;
}

}  // namespace droce::engine
