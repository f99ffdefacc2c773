// One worker's turn: doorbells → rx burst → frames handed over by other
// workers → classify → transport → send work → timers → one tx flush; the
// receive dispatch to the QP's worker (inboxes and outboxes), the QPs'
// timers and activation, and the worker's transmit path. Who runs a turn
// and when (drive locks, the worker's thread, its back-off) is progress.cc.
#include <linux/futex.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_pause.h>
#include <rte_ring.h>

#include "common/log.h"
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
// A receive burst that came back full means frames are still waiting, and
// after a stall (the worker or its process descheduled for milliseconds)
// they hold the ACKs that the timers would otherwise take for lost: the
// timers wait for the ring to drain, up to this much longer than a tick.
// (Measured with bench/qp_sweep under a compile: every one of 100 QPs timed
// out and went back N at once after a 7 ms stall, none of its ACKs lost.)
constexpr uint64_t kTimerBacklogGraceNs = 1'000'000;

}  // namespace

bool Worker::Turn() {
  bool busy = false;
  // The turn's completions become visible when it ends, after FlushTx has
  // given the link the ACKs they owe (cq.h, CqTurnHold).
  cq::CqTurnHold hold;
  if (activate_all.load(std::memory_order_relaxed) && activate_all.exchange(false, std::memory_order_acquire)) {
    dev->ActivateOwnQps(*this);
  }
  if (doorbells.MaybeNonEmpty() || SourcesNonEmpty()) {
    HandleDoorbells();
    busy = true;
  }
  rte_mbuf* rx[kRxBurst];
  // A memif client not connected yet has no started port to poll.
  uint16_t n = dev->dead() || !dev->dpdk_.started() ? 0 : rte_eth_rx_burst(dev->dpdk_.port_id(), index, rx, kRxBurst);
  busy |= n > 0;
  const bool rx_backlog = n == kRxBurst;
  // The lab's fault stage and capture, receive side (fault_stage.h,
  // capture_tap.h): one branch each when off.
  CaptureTap* const tap = capture.get();
  if (fault != nullptr) [[unlikely]] n = fault->OnRx(rx, n, NowNs(), tap);
  if (tap != nullptr) [[unlikely]] tap->Frames(lab::Capture::kRxEngine, rx, n);
  for (uint16_t i = 0; i < n; ++i) {
    if (i + 1 < n) rte_prefetch0(rte_pktmbuf_mtod(rx[i + 1], void*));
    HandleFrame(rx[i], /*handed=*/false);
  }
  if (fault != nullptr) [[unlikely]] {
    fault->ReleaseRx(NowNs(), [this, tap](rte_mbuf* m) {
      if (tap != nullptr) [[unlikely]] tap->Add(lab::Capture::kRxEngine, m);
      HandleFrame(m, /*handed=*/false);
    });
    if (tap != nullptr) [[unlikely]] tap->Commit(lab::Capture::kRxEngine);
  }
  if (handoff_pending != 0) FlushHandoffs();
  if (inbox != nullptr) {
    n = static_cast<uint16_t>(rte_ring_sc_dequeue_burst(inbox, reinterpret_cast<void**>(rx), kRxBurst, nullptr));
    for (uint16_t i = 0; i < n; ++i) HandleFrame(rx[i], /*handed=*/true);
    busy |= n > 0;
  }
  // Paced QPs whose time has come send again (one comparison when none),
  // then every QP with work sends.
  auto find = [this](uint32_t qpn) { return Find(qpn); };
  if (sched.has_paced()) [[unlikely]] sched.RunPaced(NowNs(), find);
  busy |= sched.PollActive(kSendBudget, [this](QpEntry* e) { dev->DeliverEvents(e); }, find);
  if (index == 0 && dev->gsi_pending_.load(std::memory_order_relaxed)) busy |= dev->DrainGsi(*this);
  if (!mcast_loop.empty()) {
    LoopBackMulticast();
    busy = true;
  }
  if (!self_loop.empty()) {
    LoopBackSelf();
    busy = true;
  }
  const uint64_t now = turn_ns;  // the turn's one clock reading
  last_poll_ns = now;
  if (now - last_timer_ns >= kTimerTickNs) {
    // The tick also dates the turn for Kick and the watch (Turn::timer_ns),
    // so it moves on even while the timers wait.
    last_timer_ns = now;
    if (!rx_backlog || now - timers_ran_ns >= kTimerTickNs + kTimerBacklogGraceNs) {
      timers_ran_ns = now;
      RunTimers(now);
    }
  }
  if (!tx.empty() || (fault != nullptr && fault->holding())) {
    busy |= !tx.empty();  // frames only held are no work yet (Turn::pending keeps the loop awake)
    FlushTx();
  }
  // The workers handed frames this turn look at their inbox now (frames
  // handed after the receive step, e.g. by LoopBackSelf, go in first).
  if (handoff_pending != 0) FlushHandoffs();
  for (uint32_t t = handoff_targets; t != 0; t &= t - 1) dev->Wake(*dev->workers_[__builtin_ctz(t)]);
  handoff_targets = 0;
  // A capture that reached its bounds costs nothing more, nor a fault stage
  // whose rules were cleared (droce ctl fault clear) once it holds nothing.
  if (tap != nullptr && !tap->live()) [[unlikely]] capture.reset();
  if (fault != nullptr && fault->engine().rules() == 0 && !fault->holding()) [[unlikely]] fault.reset();
  return busy;
}

QpEntry* Worker::Find(uint32_t qpn) const {
  auto it = dev->objects_.qps.find(qpn);
  return it != dev->objects_.qps.end() && it->second->worker == this ? it->second.get() : nullptr;
}

void Worker::HandleDoorbells() {
  auto ring = [this](QpEntry* e) {
    // Clear the flag with an RMW so that it reads the provider's exchange and
    // its ring writes become visible (acquire); a doorbell rung after this
    // point enqueues the QP again.
    e->shared->doorbell_pending.exchange(0, std::memory_order_acq_rel);
    e->qp->OnRecvDoorbell();
    dev->DeliverEvents(e);
    e->worker->sched.Activate(e);
  };
  uint32_t qpn;
  while (doorbells.Pop(&qpn)) {
    // A QPN rung before its QP was destroyed may name a new QP of another
    // worker by now; that one's doorbells go to its own worker.
    auto it = dev->objects_.qps.find(qpn);
    if (it != dev->objects_.qps.end() && it->second->worker == this) ring(it->second.get());
  }
  if (doorbells.TakeOverflow()) {
    for (auto& [n, e] : dev->objects_.qps) {
      if (e->worker == this) ring(e.get());
    }
  }
  // droced: each client's queue rings only that client's QPs; a QPN that is
  // not one of them (a stale one, or a client naming another's QP) is
  // ignored and counted.
  for (DoorbellSource* src : sources) {
    queue::DoorbellQueue& q = *src->queues[index];
    while (q.Pop(&qpn)) {
      auto it = dev->objects_.qps.find(qpn);
      if (it != dev->objects_.qps.end() && it->second->worker == this && it->second->owner == src->owner) {
        ring(it->second.get());
      } else {
        Bump(stats.foreign_doorbells);
      }
    }
    if (q.TakeOverflow()) {
      for (auto& [n, e] : dev->objects_.qps) {
        if (e->worker == this && e->owner == src->owner) ring(e.get());
      }
    }
  }
}

bool Worker::SourcesNonEmpty() const {
  for (const DoorbellSource* src : sources) {
    if (src->queues[index]->MaybeNonEmpty()) return true;
  }
  return false;
}

// Runs the transport timers that are due (at most once a tick for each QP).
void Worker::RunTimers(uint64_t now) {
  sched.RunTimers(
      now, kTimerTickNs, [this](uint32_t qpn) { return Find(qpn); }, [this](QpEntry* e) { dev->DeliverEvents(e); });
  if (index == 0) dev->TickDevice(*this, now);
}

void Device::TickDevice(Worker& w0, uint64_t now) {
  for (cq::CqProducer* p : objects_.ticked_cqs) p->Tick(now);
  PollLinkState(w0);
}

bool Device::CqEventHeld() const {
  for (const cq::CqProducer* p : objects_.ticked_cqs) {
    if (p->holding()) return true;
  }
  return false;
}

void Worker::HandleFrame(rte_mbuf* m, bool handed) {
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
    Bump(stats.malformed_pkts);
    rte_pktmbuf_free(m);
    return;
  }
  if (len >= wire::kEthLen && !handed) {
    // A unicast frame to another station's MAC is not ours, as a NIC's
    // address filter (and the kernel, for PACKET_OTHERHOST) drops it: over
    // af_packet the socket also sees what other programs on the host send
    // through the interface, which must not count as bad RoCE here.
    if (!(f[0] & 1) && std::memcmp(f, dev->port_.mac.data(), 6) != 0) {
      Bump(stats.other_host_drop);
      rte_pktmbuf_free(m);
      return;
    }
    // links & addressing: frames of another VLAN are not ours; ARP; ICMP and
    // ND below, where the RoCE parser turns them away as not UDP.
    if (!dev->VlanAccepts(m, f, len)) {
      Bump(stats.non_roce_drop);
      rte_pktmbuf_free(m);
      return;
    }
    uint16_t type = wire::load_be16(f + 12);
    if (type == wire::kEtherTypeVlan && len >= wire::kEthLen + wire::kVlanLen) type = wire::load_be16(f + 16);
    if (type == wire::kEtherTypeArp) {
      dev->HandleArp(*this, f, len);
      rte_pktmbuf_free(m);
      return;
    }
  }
  wire::PacketView v;
  const wire::ParseError err = wire::parse_frame({f, len}, &v);
  if (err != wire::ParseError::kOk) {
    if (err == wire::ParseError::kNotUdp && dev->HandleLocal(*this, f, len)) {
      rte_pktmbuf_free(m);
      return;
    }
    // UDP to another host's address (a broadcast or multicast MAC, or
    // promiscuous neighbours) is not ours, whatever else is wrong with it.
    if (v.l4_offset != 0 && !wire::gid_is_multicast(v.dip6.data()) && !dev->ForPort(v)) Bump(stats.other_host_drop);
    else if (err == wire::ParseError::kBadIcrc) Bump(stats.icrc_err);
    else if (err == wire::ParseError::kNotIpv4 || err == wire::ParseError::kNotUdp ||
             err == wire::ParseError::kNotRoce || err == wire::ParseError::kIpOptions ||
             err == wire::ParseError::kIpFragment) Bump(stats.non_roce_drop);
    else Bump(stats.malformed_pkts);
    rte_pktmbuf_free(m);
    return;
  }
  // dip6 is the IPv4-mapped address for IPv4 packets.
  if (wire::gid_is_multicast(v.dip6.data())) {
    HandleMulticast(v, m, handed);
    rte_pktmbuf_free(m);
    return;
  }
  if (!dev->ForPort(v)) {
    Bump(stats.other_host_drop);
    rte_pktmbuf_free(m);
    return;
  }
  if (v.bth.dqpn == 1) {  // QP1: the connection manager's (gsi.cc)
    dev->HandleGsi(*this, v);
    rte_pktmbuf_free(m);
    return;
  }
  auto it = dev->objects_.qps.find(v.bth.dqpn);
  // A handed frame whose QP changed owners meanwhile (destroyed, its QPN
  // reused) is not passed on again.
  if (it == dev->objects_.qps.end() || (handed && it->second->worker != this)) {
    Bump(stats.unknown_qp);
    rte_pktmbuf_free(m);
    return;
  }
  if (!handed) LearnSender(v);
  QpEntry* e = it->second.get();
  if (e->worker != this) {
    HandOff(*e->worker, m);
    return;
  }
  DeliverPacket(e, v);
  rte_pktmbuf_free(m);
}

void Worker::HandOff(Worker& to, rte_mbuf* m) {
  Worker::Outbox& o = outbox[to.index];
  o.m[o.n++] = m;
  handoff_pending |= 1u << to.index;
  if (o.n == Worker::Outbox::kSize) [[unlikely]] FlushHandoff(to);
}

void Worker::FlushHandoffs() {
  for (uint32_t t = handoff_pending; t != 0; t &= t - 1) FlushHandoff(*dev->workers_[__builtin_ctz(t)]);
}

void Worker::FlushHandoff(Worker& to) {
  Worker::Outbox& o = outbox[to.index];
  const unsigned put = rte_ring_mp_enqueue_burst(to.inbox, reinterpret_cast<void**>(o.m), o.n, nullptr);
  // What a full inbox did not take is a loss on the wire as far as the
  // peers can tell: RC retransmits, UC and UD drop the message.
  if (put != o.n) [[unlikely]] {
    Bump(stats.handoff_drop, o.n - put);
    rte_pktmbuf_free_bulk(o.m + put, o.n - put);
  }
  Bump(stats.handoff_pkts, put);
  o.n = 0;
  handoff_pending &= ~(1u << to.index);
  if (put != 0) handoff_targets |= 1u << to.index;
}

// Multicast (UD only): the group is the destination address, and each
// attached QP gets the packet as if it had been addressed to it alone, with
// its own state, Q_Key and receive-queue checks (as rxe_rcv_mcast_pkt).
// Members owned by other workers get a copy of the frame each worker.
void Worker::HandleMulticast(const wire::PacketView& v, rte_mbuf* m, bool handed) {
  const std::vector<uint32_t>* members = nullptr;
  switch (dev->objects_.mcast.Route(v, &members)) {
    case McastGroups::Verdict::kNotMulticastUd: Bump(stats.mcast_bad_drop); return;
    case McastGroups::Verdict::kNoGroup: Bump(stats.mcast_no_group_drop); return;
    case McastGroups::Verdict::kDeliver: break;
  }
  if (!handed) {
    Bump(stats.mcast_rcvd_pkts);
    if (v.smac != dev->port_.mac) LearnSender(v);  // not from our own sends
  }
  // Delivering raises no control call, so the member list cannot change
  // while it is walked.
  uint32_t others = 0;
  for (uint32_t qpn : *members) {
    auto it = dev->objects_.qps.find(qpn);
    if (it == dev->objects_.qps.end()) continue;
    if (it->second->worker == this) DeliverPacket(it->second.get(), v);
    else others |= 1u << it->second->worker->index;
  }
  if (handed) return;
  for (; others != 0; others &= others - 1) {
    if (rte_mbuf* c = rte_pktmbuf_copy(m, dev->dpdk_.pool(), 0, UINT32_MAX); c != nullptr) {
      HandOff(*dev->workers_[__builtin_ctz(others)], c);
    } else {
      Bump(stats.handoff_drop);
    }
  }
}

// RNICs deliver a multicast they send to their own QPs attached to the
// group as well (mlx5's multicast loopback); the internal loopback link
// returns every frame anyway, other links do not. The copies are delivered
// after the loop turn's sends, never from inside the sending QP; a group
// with no member here is no drop to count.
void Worker::LoopBackMulticast() {
  for (rte_mbuf* m : mcast_loop) {
    wire::PacketView v;
    const std::vector<uint32_t>* members = nullptr;
    if (m->nb_segs == 1 &&
        wire::parse_frame({rte_pktmbuf_mtod(m, const uint8_t*), rte_pktmbuf_data_len(m)}, &v) ==
            wire::ParseError::kOk &&
        wire::gid_is_multicast(v.dip6.data()) && dev->objects_.mcast.Route(v, &members) == McastGroups::Verdict::kDeliver) {
      HandleMulticast(v, m, /*handed=*/false);
    }
    rte_pktmbuf_free(m);
  }
  mcast_loop.clear();
}

// Whether an untagged frame goes to the port's own MAC and IPv4 or IPv6
// address.
bool Device::IsOwnAddress(const uint8_t* f, uint32_t len) const {
  if (len < wire::kEthLen + wire::kIpv6Len || std::memcmp(f, port_.mac.data(), 6) != 0) return false;
  const uint16_t type = wire::load_be16(f + 12);
  if (type == wire::kEtherTypeIpv4) return wire::load_be32(f + wire::kEthLen + 16) == port_.ip;
  return type == wire::kEtherTypeIpv6 && has_ip6_ && std::memcmp(f + wire::kEthLen + 24, ip6_.data(), 16) == 0;
}

// An RNIC (and rxe) delivers a packet for its own address internally; on
// a link that does not return our frames it would otherwise leave on the
// wire and be lost (Open MPI's rank-to-self endpoint, UCX's self-connected
// QPs). The frames go through the receive path as sent, after the turn's
// sends, never from inside the sending QP; what they make (ACKs to
// ourselves) is delivered the next turn.
void Worker::LoopBackSelf() {
  std::swap(self_loop, self_scratch);
  for (rte_mbuf* m : self_scratch) HandleFrame(m, /*handed=*/false);
  self_scratch.clear();
}

void Worker::LearnSender(const wire::PacketView& v) {
  // Learn the peer's MAC from its traffic: replies need no ARP or ND round
  // trip (off the IPv4 subnet, the gateway's MAC is what ARP resolves
  // instead; IPv6 destinations are all on the link).
  if (v.ipv6) dev->LearnNeighbor6(*this, v.sip6, v.smac, /*create=*/true);
  else if (dev->NextHop(v.sip) == v.sip) dev->LearnNeighbor(*this, v.sip, v.smac, /*create=*/true);
}

void Worker::DeliverPacket(QpEntry* e, const wire::PacketView& v) {
  e->qp->OnPacket(v);
  dev->DeliverEvents(e);
  sched.AfterPacket(e, v.info->mask & wire::kMaskResponse, [this](uint32_t qpn) { return Find(qpn); });
}

uint64_t Worker::NowNs() { return Device::NowNs(); }
uint64_t Worker::TurnNs() { return turn_ns != 0 ? turn_ns : Device::NowNs(); }

bool Worker::AllocFrame(uint32_t len, transport::TxFrame* f) {
  // Back-pressure: while the link refuses frames, stop producing new ones;
  // the transport tries again on a later loop turn instead of losing them.
  if (len > dev->dpdk_.data_room() || tx.size() >= kTxHighWater || dev->dead()) return false;
  rte_mbuf* m = rte_pktmbuf_alloc(dev->dpdk_.pool());
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

void Worker::SendFrame(const transport::TxFrame& f, uint32_t len) {
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
  if (group_mac && !dev->link_loops_back_ && dev->objects_.mcast.groups() != 0) {
    if (rte_mbuf* c = rte_pktmbuf_copy(m, dev->dpdk_.pool(), 0, UINT32_MAX); c != nullptr) mcast_loop.push_back(c);
  }
  // Read before tagging (the tag moves the Ethernet header). The MAC alone
  // is not enough: on a tap link the kernel's side has the port's MAC, and
  // what droce sends to the kernel's address must leave.
  const bool to_self = !dev->link_loops_back_ && dev->IsOwnAddress(f.data, len);
  dev->TagFrame(m, f.pcp);  // links & addressing: the port's 802.1Q tag, if any (vlan.cc)
  if (to_self) {
    Bump(stats.self_loop_pkts);
    self_loop.push_back(m);
    return;
  }
  tx.push_back(m);
  if (tx.size() >= kTxBurst) FlushTx();
}

bool Worker::ResolveMac(const wire::Ipv6Addr& dgid, wire::MacAddr* mac) { return dev->ResolveMac(*this, dgid, mac); }
mem::MrTable& Worker::Mrs() { return dev->objects_.mrs; }
bool Worker::InvalidateRkey(uint32_t rkey, uint32_t pd) { return dev->InvalidateRkey(rkey, pd); }
const transport::AddressHandle* Worker::FindAh(uint32_t id) { return dev->FindAh(id); }
bool Worker::FindXrcSrq(uint32_t srqn, transport::XrcSrqRef* out) { return dev->FindXrcSrq(srqn, out); }

void Worker::SendBeforeDestroy(QpEntry* e) {
  // Posts whose doorbell no turn has seen yet (rung just before, or left
  // by Kick for the thread's next poll) go out before the QP goes: a
  // program that posts and then destroys its QP without polling
  // (unsignaled UD SENDs; mckey's sender) would otherwise lose them. With
  // every drive lock held (RunOnWorker), as a turn would. Only from RTS: a
  // QP in another state would complete them in error, and a destroyed QP's
  // WQEs get no completions.
  if (e->qp->state() != transport::QpState::kRts) {
    // What the QP queued before it left RTS (the ACKs a modify to ERR
    // sent, transport/responder_rd.cc) leaves now, not with a later turn
    // that a process about to exit may never run.
    if (!tx.empty()) FlushTx();
    return;
  }
  HandleDoorbells();
  for (int i = 0; i < 64 && e->qp->PollSend(kSendBudget); ++i) {
  }
  dev->DeliverEvents(e);
  if (!tx.empty()) FlushTx();
}

void Worker::FlushTx() {
  if (!dev->dpdk_.started()) return;  // held until the link is (memif client: Reconnect)
  // The lab's fault stage, transmit side (fault_stage.h): the frames queued
  // since the last flush, then the held ones now due. The capture records
  // them as the engine sent them and as they go to the link (not after
  // tx_burst: the link may own the mbufs by then).
  const size_t from = tx_judged;
  CaptureTap* const tap = capture.get();
  if (fault != nullptr) [[unlikely]] {
    fault->OnTx(&tx, from, NowNs(), tap);
    if (tap != nullptr) [[unlikely]] tap->Frames(lab::Capture::kTxWire, tx.data() + from, tx.size() - from);
  } else if (tap != nullptr) [[unlikely]] {
    tap->Frames(lab::Capture::kTxEngine, tx.data() + from, tx.size() - from);
  }
  const uint16_t n = static_cast<uint16_t>(std::min<size_t>(tx.size(), UINT16_MAX));
  uint16_t done = 0;
  for (int tries = 0; done < n && tries < 4; ++tries) {
    done += rte_eth_tx_burst(dev->dpdk_.port_id(), index, tx.data() + done, n - done);
  }
  // What the link did not take stays queued, in order, for the next turn.
  const bool blocked = done < n;
  if (blocked && !tx_link_blocked) [[unlikely]] Bump(stats.tx_link_full);
  tx_link_blocked = blocked;
  tx.erase(tx.begin(), tx.begin() + done);
  tx_judged = tx.size();
}


void Device::AddDoorbellSource(DoorbellSource* src) {
  RunOnWorker([&] {
    for (auto& w : workers_) w->sources.push_back(src);
  });
}

void Device::RemoveDoorbellSource(DoorbellSource* src) {
  RunOnWorker([&] {
    for (auto& w : workers_) std::erase(w->sources, src);
  });
}

}  // namespace droce::engine
