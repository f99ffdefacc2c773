// ARP (RFC 826) for the device's IPv4 address: answer requests, resolve next
// hops (the destination on the subnet, else the configured gateway), learn
// from what we see, expire what is no longer confirmed (the policy is
// NeighborCache's, engine/neighbor.h), and announce the address with a
// gratuitous ARP when the port comes up.
#include <cstring>
#include <mutex>

#include <rte_mbuf.h>

#include "engine/device.h"
#include "wire/bytes.h"

namespace droce::engine {
namespace {

constexpr unsigned kArpLen = 28;
const wire::MacAddr kBroadcast = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};

}  // namespace

uint32_t Device::NextHop(uint32_t dip) const {
  if (gateway_ == 0 || (dip & subnet_mask_) == (port_.ip & subnet_mask_)) return dip;
  return gateway_;
}

bool Device::ResolveMac(Worker& w, const wire::Ipv6Addr& dgid, wire::MacAddr* mac) {
  if (wire::gid_is_ipv4_mapped(dgid.data())) return ResolveMac4(w, wire::gid_to_ipv4(dgid.data()), mac);
  return ResolveMac6(w, dgid, mac);
}

bool Device::ResolveMac4(Worker& w, uint32_t dip, wire::MacAddr* mac) {
  if (dip == port_.ip) {
    *mac = port_.mac;  // loopback: the link brings our own frames back
    return true;
  }
  const uint32_t hop = NextHop(dip);
  ArpCache::Lookup r;
  {
    std::lock_guard<SpinLock> l(neighbor_lock_);
    r = arp_.Resolve(hop, NowNs());
  }
  if (r.request != ArpCache::Request::kNone) {
    // A refresh asks the known MAC directly and keeps using it meanwhile.
    SendArp(w, 1, r.request == ArpCache::Request::kUnicastProbe ? r.mac : wire::MacAddr{}, hop);
    Bump(w.stats.arp_requests);
  }
  if (r.resolved) *mac = r.mac;
  return r.resolved;
}

void Device::LearnNeighbor(Worker& w, uint32_t ip, const wire::MacAddr& mac, bool create) {
  if (ip == 0 || ip == port_.ip) return;
  // The loop's last timer tick is recent enough and cheaper than reading the
  // clock for every received packet.
  const uint64_t now = w.last_timer_ns != 0 ? w.last_timer_ns : NowNs();
  bool changed;
  {
    std::lock_guard<SpinLock> l(neighbor_lock_);
    changed = arp_.Confirm(ip, mac, now, create);
  }
  if (changed) ActivateAllQps(w);
}

void Device::ActivateAllQps(Worker& w) {
  // A resolved neighbour unblocks every requester waiting on it: w's now,
  // the other workers' at their next turn.
  ActivateOwnQps(w);
  for (auto& other : workers_) {
    if (other.get() == &w) continue;
    other->activate_all.store(true, std::memory_order_release);
    Wake(*other);
  }
}

void Device::ActivateOwnQps(Worker& w) {
  for (auto& [qpn, e] : objects_.qps) {
    if (e->worker == &w) w.sched.Activate(e.get());
  }
}

void Device::SendArp(Worker& w, uint16_t op, const wire::MacAddr& tha, uint32_t tip) {
  transport::TxFrame f;
  const uint32_t len = 60;  // minimum Ethernet frame without FCS
  if (!w.AllocFrame(len, &f)) return;
  uint8_t* p = f.data;
  std::memset(p, 0, len);
  // Requests go to the broadcast address unless they probe a known MAC.
  const bool unicast = op == 2 || tha != wire::MacAddr{};
  std::memcpy(p, unicast ? tha.data() : kBroadcast.data(), 6);
  std::memcpy(p + 6, port_.mac.data(), 6);
  wire::store_be16(p + 12, wire::kEtherTypeArp);
  uint8_t* a = p + wire::kEthLen;
  wire::store_be16(a, 1);        // Ethernet
  wire::store_be16(a + 2, 0x0800);
  a[4] = 6;
  a[5] = 4;
  wire::store_be16(a + 6, op);
  std::memcpy(a + 8, port_.mac.data(), 6);
  wire::store_be32(a + 14, port_.ip);
  // A request's target hardware address is left zero (RFC 5227 probes do the
  // same), also when it is sent unicast.
  if (op == 2) std::memcpy(a + 18, tha.data(), 6);
  wire::store_be32(a + 24, tip);
  w.SendFrame(f, len);
}

void Device::SendGratuitousArp(Worker& w) {
  // RFC 5227 announcement: a request for our own address, sender = target.
  // Neighbours that already have an entry for the address update it; the
  // kernel does not create new entries from it unless arp_accept is set.
  SendArp(w, 1, wire::MacAddr{}, port_.ip);
}

void Device::HandleArp(Worker& w, const uint8_t* f, size_t len) {
  // f points at the Ethernet header; a VLAN tag, if any, is skipped here.
  size_t off = wire::kEthLen;
  if (len >= wire::kEthLen + wire::kVlanLen && wire::load_be16(f + 12) == wire::kEtherTypeVlan) {
    off += wire::kVlanLen;
  }
  if (len < off + kArpLen) return;
  const uint8_t* a = f + off;
  if (wire::load_be16(a) != 1 || wire::load_be16(a + 2) != 0x0800 || a[4] != 6 || a[5] != 4) return;
  const uint16_t op = wire::load_be16(a + 6);
  if (op != 1 && op != 2) return;
  wire::MacAddr sha;
  std::memcpy(sha.data(), a + 8, 6);
  const uint32_t spa = wire::load_be32(a + 14);
  const uint32_t tpa = wire::load_be32(a + 24);
  if (spa == port_.ip) return;  // our own announcement, or someone claiming our address
  // RFC 826: a sender we know is updated whatever the target (this is how a
  // gratuitous ARP moves an address); one addressed to us is added.
  LearnNeighbor(w, spa, sha, /*create=*/tpa == port_.ip);
  if (tpa != port_.ip) return;
  if (op == 1) {
    SendArp(w, 2, sha, spa);
    Bump(w.stats.arp_replies);
  }
}

}  // namespace droce::engine
