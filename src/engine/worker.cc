// The per-lcore poll loop: mailbox check (one load) → doorbells → rx burst →
// classify → transport → send work → timers → one tx flush. Backs off when
// idle so that two droce processes share a 2-core machine.
#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>

#include <cstring>

#include <rte_ethdev.h>
#include <rte_mbuf.h>
#include <rte_pause.h>

#include "engine/device.h"
#include "wire/bytes.h"

namespace droce::engine {
namespace {

constexpr uint16_t kRxBurst = 32;
constexpr size_t kTxBurst = 64;
// Frames queued for a link that is not taking them before the transport is
// told to wait (AllocFrame fails).
constexpr size_t kTxHighWater = 512;
constexpr unsigned kSendBudget = 32;
constexpr uint64_t kTimerTickNs = 50'000;
// Idle back-off: spin, then yield the CPU, then sleep (futex with timeout,
// woken early by doorbells and control calls).
constexpr unsigned kSpinLoops = 200;
// Keep yielding (not sleeping) this long after the last work: a peer's next
// packet in a ping-pong arrives within microseconds, and a sleeping worker
// cannot see it (no Rx interrupts on memif/af_xdp/af_packet).
constexpr uint64_t kYieldWindowNs = 5'000'000;
constexpr long kSleepNs = 200'000;
// While application threads drive the engine (ibv_poll_cq, ibv_post_*), the
// worker naps and takes over when they have not driven for this long, or at
// once when one of them is about to block (Device::Handoff). Every wakeup of
// the worker costs a context switch, which on a VM is tens of microseconds.
constexpr uint64_t kAppDriveWindowNs = 2'000'000;
constexpr long kAppNapNs = 1'000'000;

}  // namespace

// Progress: whoever holds drive_lock_ runs the loop body. The worker thread
// drives unless an application thread is driving from ibv_poll_cq or
// ibv_post_* (Device::TryDrive); then it steps aside and naps, so that on a
// busy-polling application the engine runs on the application's own thread
// with no hand-off between threads. Only one thread drives at a time, so the
// worker-owned state still has exactly one owner at any moment; the lock's
// acquire/release orders one driver's writes before the next driver's reads.
void Device::Loop() {
  unsigned idle = 0;
  while (!stop_.load(std::memory_order_relaxed)) {
    const uint64_t now = NowNs();
    if (now - last_app_drive_ns_.load(std::memory_order_relaxed) < kAppDriveWindowNs ||
        drive_lock_.exchange(true, std::memory_order_acquire)) {
      Nap(kAppNapNs);  // an application thread is driving
      idle = 0;
      continue;
    }
    const bool busy = PollOnceGuarded();
    drive_lock_.store(false, std::memory_order_release);
    if (busy) {
      idle = 0;
      last_busy_ns_ = last_timer_ns_;
    } else {
      IdleBackoff(++idle);
    }
  }
}

bool Device::TryDrive(bool polling) {
  if (!app_progress_ || drive_lock_.load(std::memory_order_relaxed) ||
      drive_lock_.exchange(true, std::memory_order_acquire)) {
    return false;
  }
  const bool busy = PollOnceGuarded();
  // Only a thread polling its CQ will come back for received packets; one
  // that just posted may spin on memory instead (ib_write_lat's receiver), so
  // posting does not send the worker to sleep.
  if (polling) last_app_drive_ns_.store(last_timer_ns_, std::memory_order_relaxed);
  drive_lock_.store(false, std::memory_order_release);
  return busy;
}

void Device::Handoff() {
  if (!app_progress_) return;
  last_app_drive_ns_.store(0, std::memory_order_relaxed);
  wake_seq_.fetch_add(1, std::memory_order_release);
  syscall(SYS_futex, &wake_seq_, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

void Device::Nap(long ns) {
  const uint32_t seq = wake_seq_.load(std::memory_order_acquire);
  sleeping_.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!mbox_pending_.load(std::memory_order_relaxed)) {
    timespec ts{0, ns};
    syscall(SYS_futex, &wake_seq_, FUTEX_WAIT_PRIVATE, seq, &ts, nullptr, 0);
  }
  sleeping_.store(0, std::memory_order_relaxed);
}

bool Device::PollOnce() {
  bool busy = false;
  if (mbox_pending_.load(std::memory_order_acquire)) {
    RunMailbox();
    busy = true;
  }
  if (doorbells_.MaybeNonEmpty()) {
    HandleDoorbells();
    busy = true;
  }
  rte_mbuf* rx[kRxBurst];
  const uint16_t n = dead() ? 0 : rte_eth_rx_burst(dpdk_.port_id(), 0, rx, kRxBurst);
  for (uint16_t i = 0; i < n; ++i) {
    if (i + 1 < n) rte_prefetch0(rte_pktmbuf_mtod(rx[i + 1], void*));
    HandleFrame(rx[i]);
  }
  busy |= n > 0;
  // Requesters with work. A QP leaves the list when it has nothing sendable.
  for (size_t i = 0; i < active_.size();) {
    QpEntry* e = active_[i];
    const bool more = e->qp->PollSend(kSendBudget);
    DeliverEvents(e);
    if (e->qp->HasOutstanding() && !e->timed) {
      e->timed = true;
      timed_.push_back(e);
    }
    if (more) {
      busy = true;
      ++i;
    } else {
      e->active = false;
      active_[i] = active_.back();
      active_.pop_back();
    }
  }
  if (!mcast_loop_.empty()) {
    LoopBackMulticast();
    busy = true;
  }
  const uint64_t now = NowNs();
  if (now - last_timer_ns_ >= kTimerTickNs) {
    last_timer_ns_ = now;
    RunTimers(now);
  }
  if (!tx_.empty()) {
    FlushTx();
    busy = true;
  }
  return busy;
}

void Device::IdleBackoff(unsigned idle) {
  if (idle < kSpinLoops) {
    rte_pause();
    return;
  }
  if (last_timer_ns_ - last_busy_ns_ < kYieldWindowNs || !timed_.empty() || !active_.empty() ||
      CqEventHeld()) {
    sched_yield();
    return;
  }
  // Announce the sleep, then re-check for work (pairs with Wake()).
  const uint32_t seq = wake_seq_.load(std::memory_order_acquire);
  sleeping_.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (!mbox_pending_.load(std::memory_order_relaxed) && !doorbells_.MaybeNonEmpty()) {
    timespec ts{0, kSleepNs};
    syscall(SYS_futex, &wake_seq_, FUTEX_WAIT_PRIVATE, seq, &ts, nullptr, 0);
  }
  sleeping_.store(0, std::memory_order_relaxed);
  last_busy_ns_ = NowNs() - kYieldWindowNs / 2;  // after a sleep, yield a while before sleeping again
}

void Device::RunMailbox() {
  std::deque<std::function<void()>> work;
  {
    std::lock_guard<std::mutex> l(mbox_mu_);
    work.swap(mbox_);
    mbox_pending_.store(false, std::memory_order_relaxed);
  }
  for (auto& fn : work) fn();
}

void Device::Activate(QpEntry* e) {
  if (!e->active) {
    e->active = true;
    active_.push_back(e);
  }
}

void Device::HandleDoorbells() {
  auto ring = [this](QpEntry* e) {
    // Clear the flag with an RMW so that it reads the provider's exchange and
    // its ring writes become visible (acquire); a doorbell rung after this
    // point enqueues the QP again.
    e->shared->doorbell_pending.exchange(0, std::memory_order_acq_rel);
    e->qp->OnRecvDoorbell();
    DeliverEvents(e);
    Activate(e);
  };
  uint32_t qpn;
  while (doorbells_.Pop(&qpn)) {
    auto it = qps_.find(qpn);
    if (it != qps_.end()) ring(it->second.get());
  }
  if (doorbells_.TakeOverflow()) {
    for (auto& [n, e] : qps_) ring(e.get());
  }
}

void Device::RunTimers(uint64_t now) {
  for (size_t i = 0; i < timed_.size();) {
    QpEntry* e = timed_[i];
    e->qp->OnTimer(now);
    DeliverEvents(e);
    Activate(e);  // a timeout or RNR expiry may have made packets sendable
    if (e->qp->HasOutstanding()) {
      ++i;
    } else {
      e->timed = false;
      timed_[i] = timed_.back();
      timed_.pop_back();
    }
  }
  for (cq::CqProducer* p : ticked_cqs_) p->Tick(now);
  PollLinkState();
}

bool Device::CqEventHeld() const {
  for (const cq::CqProducer* p : ticked_cqs_) {
    if (p->holding()) return true;
  }
  return false;
}

void Device::HandleFrame(rte_mbuf* m) {
  // Multi-segment frames (jumbo frames on memif) are linearised here; the
  // parser reads one contiguous buffer.
  alignas(64) static thread_local uint8_t scratch[9216 + 64];
  const uint32_t len = rte_pktmbuf_pkt_len(m);
  const uint8_t* f;
  if (m->nb_segs == 1) {
    f = rte_pktmbuf_mtod(m, const uint8_t*);
  } else if (len <= sizeof(scratch)) {
    f = static_cast<const uint8_t*>(rte_pktmbuf_read(m, 0, len, scratch));
  } else {
    ++stats_.malformed_pkts;
    rte_pktmbuf_free(m);
    return;
  }
  if (len >= wire::kEthLen) {
    // links & addressing: frames of another VLAN are not ours; ARP; ICMP and
    // ND below, where the RoCE parser turns them away as not UDP.
    if (!VlanAccepts(m, f, len)) {
      ++stats_.non_roce_drop;
      rte_pktmbuf_free(m);
      return;
    }
    uint16_t type = wire::load_be16(f + 12);
    if (type == wire::kEtherTypeVlan && len >= wire::kEthLen + wire::kVlanLen) type = wire::load_be16(f + 16);
    if (type == wire::kEtherTypeArp) {
      HandleArp(f, len);
      rte_pktmbuf_free(m);
      return;
    }
  }
  wire::PacketView v;
  const wire::ParseError err = wire::parse_frame({f, len}, &v);
  if (err != wire::ParseError::kOk) {
    if (err == wire::ParseError::kNotUdp && HandleLocal(f, len)) {
      rte_pktmbuf_free(m);
      return;
    }
    if (err == wire::ParseError::kBadIcrc) ++stats_.icrc_err;
    else if (err == wire::ParseError::kNotIpv4 || err == wire::ParseError::kNotUdp ||
             err == wire::ParseError::kNotRoce || err == wire::ParseError::kIpOptions ||
             err == wire::ParseError::kIpFragment) ++stats_.non_roce_drop;
    else ++stats_.malformed_pkts;
    rte_pktmbuf_free(m);
    return;
  }
  // dip6 is the IPv4-mapped address for IPv4 packets.
  if (wire::gid_is_multicast(v.dip6.data())) {
    HandleMulticast(v);
    rte_pktmbuf_free(m);
    return;
  }
  const bool for_port = v.ipv6 ? has_ip6_ && v.dip6 == ip6_ : v.dip == port_.ip;
  if (!for_port) {
    ++stats_.non_roce_drop;
    rte_pktmbuf_free(m);
    return;
  }
  auto it = qps_.find(v.bth.dqpn);
  if (it == qps_.end()) {
    ++stats_.unknown_qp;
    rte_pktmbuf_free(m);
    return;
  }
  LearnSender(v);
  DeliverPacket(it->second.get(), v);
  rte_pktmbuf_free(m);
}

// Multicast (UD only): the group is the destination address, and each
// attached QP gets the packet as if it had been addressed to it alone, with
// its own state, Q_Key and receive-queue checks (as rxe_rcv_mcast_pkt).
void Device::HandleMulticast(const wire::PacketView& v) {
  const std::vector<uint32_t>* members = nullptr;
  switch (mcast_.Route(v, &members)) {
    case McastGroups::Verdict::kNotMulticastUd: ++stats_.mcast_bad_drop; return;
    case McastGroups::Verdict::kNoGroup: ++stats_.mcast_no_group_drop; return;
    case McastGroups::Verdict::kDeliver: break;
  }
  ++stats_.mcast_rcvd_pkts;
  if (v.smac != port_.mac) LearnSender(v);  // not from our own sends
  // Delivering raises no control call, so the member list cannot change
  // while it is walked.
  for (uint32_t qpn : *members) {
    if (auto it = qps_.find(qpn); it != qps_.end()) DeliverPacket(it->second.get(), v);
  }
}

// RNICs deliver a multicast they send to their own QPs attached to the
// group as well (mlx5's multicast loopback); the internal loopback link
// returns every frame anyway, other links do not. The copies are delivered
// after the loop turn's sends, never from inside the sending QP; a group
// with no member here is no drop to count.
void Device::LoopBackMulticast() {
  for (rte_mbuf* m : mcast_loop_) {
    wire::PacketView v;
    const std::vector<uint32_t>* members = nullptr;
    if (m->nb_segs == 1 &&
        wire::parse_frame({rte_pktmbuf_mtod(m, const uint8_t*), rte_pktmbuf_data_len(m)}, &v) ==
            wire::ParseError::kOk &&
        wire::gid_is_multicast(v.dip6.data()) && mcast_.Route(v, &members) == McastGroups::Verdict::kDeliver) {
      HandleMulticast(v);
    }
    rte_pktmbuf_free(m);
  }
  mcast_loop_.clear();
}

void Device::LearnSender(const wire::PacketView& v) {
  // Learn the peer's MAC from its traffic: replies need no ARP or ND round
  // trip (off the IPv4 subnet, the gateway's MAC is what ARP resolves
  // instead; IPv6 destinations are all on the link).
  if (v.ipv6) LearnNeighbor6(v.sip6, v.smac, /*create=*/true);
  else if (NextHop(v.sip) == v.sip) LearnNeighbor(v.sip, v.smac, /*create=*/true);
}

void Device::DeliverPacket(QpEntry* e, const wire::PacketView& v) {
  e->qp->OnPacket(v);
  DeliverEvents(e);
  // An ACK may have opened the window; a request may have left READ
  // responses or ACKs to send.
  if ((v.info->mask & wire::kMaskResponse) || e->qp->HasResponses()) Activate(e);
  if (e->qp->HasOutstanding() && !e->timed) {
    e->timed = true;
    timed_.push_back(e);
  }
}

bool Device::AllocFrame(uint32_t len, transport::TxFrame* f) {
  // Back-pressure: while the link refuses frames, stop producing new ones;
  // the transport tries again on a later loop turn instead of losing them.
  if (len > dpdk_.data_room() || tx_.size() >= kTxHighWater || dead()) return false;
  rte_mbuf* m = rte_pktmbuf_alloc(dpdk_.pool());
  if (m == nullptr) return false;
  f->data = reinterpret_cast<uint8_t*>(rte_pktmbuf_append(m, static_cast<uint16_t>(len)));
  if (f->data == nullptr) {
    rte_pktmbuf_free(m);
    return false;
  }
  f->capacity = len;
  f->handle = m;
  return true;
}

void Device::SendFrame(const transport::TxFrame& f, uint32_t len) {
  auto* m = static_cast<rte_mbuf*>(f.handle);
  if (len == 0) {
    rte_pktmbuf_free(m);
    return;
  }
  rte_pktmbuf_trim(m, static_cast<uint16_t>(f.capacity - len));
  // IPv4 (01:00:5e) or IPv6 (33:33) multicast with groups attached here:
  // keep a copy, untagged, for LoopBackMulticast.
  const bool group_mac = (f.data[0] == 0x01 && f.data[1] == 0x00 && f.data[2] == 0x5E) ||
                         (f.data[0] == 0x33 && f.data[1] == 0x33);
  if (group_mac && !link_loops_back_ && mcast_.groups() != 0) {
    if (rte_mbuf* c = rte_pktmbuf_copy(m, dpdk_.pool(), 0, UINT32_MAX); c != nullptr) mcast_loop_.push_back(c);
  }
  TagFrame(m);  // links & addressing: the port's 802.1Q tag, if any (vlan.cc)
  tx_.push_back(m);
  if (tx_.size() >= kTxBurst) FlushTx();
}

void Device::FlushTx() {
  const uint16_t n = static_cast<uint16_t>(std::min<size_t>(tx_.size(), UINT16_MAX));
  uint16_t done = 0;
  for (int tries = 0; done < n && tries < 4; ++tries) {
    done += rte_eth_tx_burst(dpdk_.port_id(), 0, tx_.data() + done, n - done);
  }
  // What the link did not take stays queued, in order, for the next turn.
  tx_.erase(tx_.begin(), tx_.begin() + done);
}

}  // namespace droce::engine
