// IPv6 for the device's address (DROCE_IP6): neighbour discovery (RFC 4861:
// answer neighbour solicitations, resolve next hops, learn from
// advertisements) and ICMPv6 echo (RFC 4443), so that `ping -6` reaches a
// droce port. Cold path: only frames the RoCE parser turned away as "not
// UDP" come here.
//
// The neighbour cache follows the same policy as ARP (NeighborCache,
// engine/neighbor.h): reachable for a while after a confirmation, then
// re-probed with unicast solicitations and dropped if they go unanswered.
#include <algorithm>
#include <cstring>
#include <mutex>

#include <rte_mbuf.h>

#include "engine/device.h"
#include "engine/inet.h"
#include "wire/bytes.h"

namespace droce::engine {
namespace {

constexpr uint8_t kIpProtoIcmp6 = 58;
constexpr uint8_t kEchoRequest = 128;
constexpr uint8_t kEchoReply = 129;
constexpr uint8_t kNeighborSolicit = 135;
constexpr uint8_t kNeighborAdvert = 136;
constexpr uint8_t kOptSourceLl = 1;
constexpr uint8_t kOptTargetLl = 2;
constexpr unsigned kNdLen = 4 + 4 + 16 + 8;  // header, flags, target, one link-layer option

const wire::Ipv6Addr kAllNodes = {0xFF, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};

bool is_unspecified(const uint8_t* a) {
  return std::all_of(a, a + 16, [](uint8_t b) { return b == 0; });
}

// The ICMPv6 pseudo-header's sum (RFC 8200 8.1).
uint32_t pseudo_sum(const uint8_t* src, const uint8_t* dst, uint32_t len) {
  uint8_t tail[8] = {};
  wire::store_be32(tail, len);
  tail[7] = kIpProtoIcmp6;
  return inet_sum(tail, 8, inet_sum(dst, 16, inet_sum(src, 16)));
}

// Writes Ethernet and IPv6 headers for an ICMPv6 message of `plen` bytes;
// returns the start of the ICMPv6 message.
uint8_t* write_ip6(uint8_t* p, const wire::MacAddr& dmac, const wire::MacAddr& smac, const uint8_t* src,
                   const uint8_t* dst, uint32_t plen, uint8_t hop_limit) {
  std::memcpy(p, dmac.data(), 6);
  std::memcpy(p + 6, smac.data(), 6);
  wire::store_be16(p + 12, wire::kEtherTypeIpv6);
  uint8_t* ip = p + wire::kEthLen;
  wire::store_be32(ip, 6u << 28);
  wire::store_be16(ip + 4, static_cast<uint16_t>(plen));
  ip[6] = kIpProtoIcmp6;
  ip[7] = hop_limit;
  std::memcpy(ip + 8, src, 16);
  std::memcpy(ip + 24, dst, 16);
  return ip + wire::kIpv6Len;
}

void finish_icmp6(uint8_t* icmp, const uint8_t* src, const uint8_t* dst, uint32_t plen) {
  wire::store_be16(icmp + 2, 0);
  wire::store_be16(icmp + 2, inet_checksum(icmp, plen, pseudo_sum(src, dst, plen)));
}

// 33:33 and the low 32 bits of a multicast IPv6 address (RFC 2464 7).
wire::MacAddr multicast_mac(const wire::Ipv6Addr& a) {
  return {0x33, 0x33, a[12], a[13], a[14], a[15]};
}

}  // namespace

void Device::SendNeighborAdvert(Worker& w, const wire::MacAddr& dmac, const wire::Ipv6Addr& dip, bool solicited) {
  const uint32_t frame_len = wire::kEthLen + wire::kIpv6Len + kNdLen;
  transport::TxFrame out;
  if (!w.AllocFrame(frame_len, &out)) return;
  std::memset(out.data, 0, frame_len);
  uint8_t* icmp = write_ip6(out.data, dmac, port_.mac, ip6_.data(), dip.data(), kNdLen, 255);
  icmp[0] = kNeighborAdvert;
  icmp[4] = static_cast<uint8_t>((solicited ? 0x40 : 0) | 0x20);  // S, O (not a router)
  std::memcpy(icmp + 8, ip6_.data(), 16);
  icmp[24] = kOptTargetLl;
  icmp[25] = 1;  // in units of 8 bytes
  std::memcpy(icmp + 26, port_.mac.data(), 6);
  finish_icmp6(icmp, ip6_.data(), dip.data(), kNdLen);
  w.SendFrame(out, frame_len);
}

void Device::SendNeighborSolicit(Worker& w, const wire::Ipv6Addr& target, const wire::MacAddr* unicast) {
  // Multicast to the target's solicited-node group, or a unicast probe.
  wire::Ipv6Addr dip = target;
  if (unicast == nullptr) {
    dip = {0xFF, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xFF, target[13], target[14], target[15]};
  }
  const wire::MacAddr dmac = unicast != nullptr ? *unicast : multicast_mac(dip);
  const uint32_t frame_len = wire::kEthLen + wire::kIpv6Len + kNdLen;
  transport::TxFrame out;
  if (!w.AllocFrame(frame_len, &out)) return;
  std::memset(out.data, 0, frame_len);
  uint8_t* icmp = write_ip6(out.data, dmac, port_.mac, ip6_.data(), dip.data(), kNdLen, 255);
  icmp[0] = kNeighborSolicit;
  std::memcpy(icmp + 8, target.data(), 16);
  icmp[24] = kOptSourceLl;
  icmp[25] = 1;
  std::memcpy(icmp + 26, port_.mac.data(), 6);
  finish_icmp6(icmp, ip6_.data(), dip.data(), kNdLen);
  w.SendFrame(out, frame_len);
}

bool Device::ResolveMac6(Worker& w, const wire::Ipv6Addr& dip, wire::MacAddr* mac) {
  if (!has_ip6_) return false;
  if (dip == ip6_) {
    *mac = port_.mac;
    return true;
  }
  NdCache::Lookup r;
  {
    std::lock_guard<SpinLock> l(neighbor_lock_);
    r = nd_.Resolve(dip, NowNs());
  }
  if (r.request == NdCache::Request::kUnicastProbe) SendNeighborSolicit(w, dip, &r.mac);
  else if (r.request == NdCache::Request::kBroadcast) SendNeighborSolicit(w, dip, nullptr);
  if (r.resolved) *mac = r.mac;
  return r.resolved;
}

void Device::LearnNeighbor6(Worker& w, const wire::Ipv6Addr& ip, const wire::MacAddr& mac, bool create) {
  // Not our own address, no multicast or unspecified source.
  if (ip == ip6_ || ip[0] == 0xFF || is_unspecified(ip.data())) return;
  const uint64_t now = w.last_timer_ns != 0 ? w.last_timer_ns : NowNs();
  bool changed;
  {
    std::lock_guard<SpinLock> l(neighbor_lock_);
    changed = nd_.Confirm(ip, mac, now, create);
  }
  if (changed) ActivateAllQps(w);
}

void Device::HandleIcmp6(Worker& w, const uint8_t* f, size_t len, unsigned l3) {
  if (!has_ip6_) return;
  const uint8_t* ip = f + l3;
  if ((ip[0] >> 4) != 6) return;
  const uint32_t plen = wire::load_be16(ip + 4);
  if (plen < 8 || plen > len - l3 - wire::kIpv6Len) return;
  const uint8_t* src = ip + 8;
  const uint8_t* dst = ip + 24;
  const uint8_t* icmp = ip + wire::kIpv6Len;
  if (inet_checksum(icmp, plen, pseudo_sum(src, dst, plen)) != 0) return;
  const uint8_t type = icmp[0];
  wire::MacAddr smac;
  std::memcpy(smac.data(), f + 6, 6);
  wire::Ipv6Addr sip;
  std::memcpy(sip.data(), src, 16);

  if (type == kEchoRequest && icmp[1] == 0) {
    if (std::memcmp(dst, ip6_.data(), 16) != 0) return;  // no multicast echo
    const uint32_t frame_len = std::max<uint32_t>(wire::kEthLen + wire::kIpv6Len + plen, 60);
    transport::TxFrame out;
    if (!w.AllocFrame(frame_len, &out)) return;
    std::memset(out.data, 0, frame_len);
    uint8_t* oicmp = write_ip6(out.data, smac, port_.mac, ip6_.data(), src, plen, 64);
    std::memcpy(oicmp, icmp, plen);
    oicmp[0] = kEchoReply;
    finish_icmp6(oicmp, ip6_.data(), src, plen);
    w.SendFrame(out, frame_len);
    return;
  }
  if (type != kNeighborSolicit && type != kNeighborAdvert) return;
  // RFC 4861 7.1: hop limit 255 (the sender is on the link), code 0, room
  // for the target address.
  if (ip[7] != 255 || icmp[1] != 0 || plen < 24) return;
  const uint8_t* target = icmp + 8;
  // The link-layer address option, if any (options are 8-byte units).
  const uint8_t want = type == kNeighborSolicit ? kOptSourceLl : kOptTargetLl;
  const uint8_t* ll = nullptr;
  for (uint32_t off = 24; off + 2 <= plen;) {
    const uint32_t olen = icmp[off + 1] * 8u;
    if (olen == 0 || off + olen > plen) return;  // malformed options: drop (7.1.1)
    if (icmp[off] == want && olen >= 8) ll = icmp + off + 2;
    off += olen;
  }
  auto learn = [&](const wire::Ipv6Addr& ip6, const uint8_t* mac, bool create) {
    if (mac == nullptr) return;
    wire::MacAddr m;
    std::memcpy(m.data(), mac, 6);
    LearnNeighbor6(w, ip6, m, create);
  };
  if (type == kNeighborSolicit) {
    if (std::memcmp(target, ip6_.data(), 16) != 0) return;
    if (is_unspecified(src)) {
      // Duplicate address detection by someone else: defend the address.
      SendNeighborAdvert(w, multicast_mac(kAllNodes), kAllNodes, false);
      return;
    }
    learn(sip, ll, /*create=*/true);
    wire::MacAddr to = smac;
    if (ll != nullptr) std::memcpy(to.data(), ll, 6);
    SendNeighborAdvert(w, to, sip, true);
    return;
  }
  // An advertisement updates an entry we have (a solicited one completes the
  // entry ResolveMac6 made); it never creates one.
  wire::Ipv6Addr t;
  std::memcpy(t.data(), target, 16);
  learn(t, ll, /*create=*/false);
}

}  // namespace droce::engine
