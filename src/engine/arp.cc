// ARP (RFC 826) for the device's IPv4 address: answer requests, resolve
// destinations, learn from what we see.
#include <cstring>

#include <rte_mbuf.h>

#include "engine/device.h"
#include "wire/bytes.h"

namespace droce::engine {
namespace {

constexpr unsigned kArpLen = 28;
constexpr uint64_t kArpRetryNs = 100'000'000;  // re-ask every 100 ms while unresolved
const wire::MacAddr kBroadcast = {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF};

}  // namespace

bool Device::ResolveMac(uint32_t dip, wire::MacAddr* mac) {
  if (dip == port_.ip) {
    *mac = port_.mac;  // loopback: the link brings our own frames back
    return true;
  }
  Neighbor& n = neighbors_[dip];
  if (n.valid) {
    *mac = n.mac;
    return true;
  }
  const uint64_t now = NowNs();
  if (n.requested_ns == 0 || now - n.requested_ns >= kArpRetryNs) {
    n.requested_ns = now;
    SendArp(1, wire::MacAddr{}, dip);
    ++stats_.arp_requests;
  }
  return false;
}

void Device::SendArp(uint16_t op, const wire::MacAddr& tha, uint32_t tip) {
  transport::TxFrame f;
  const uint32_t len = 60;  // minimum Ethernet frame without FCS
  if (!AllocFrame(len, &f)) return;
  uint8_t* p = f.data;
  std::memset(p, 0, len);
  std::memcpy(p, op == 1 ? kBroadcast.data() : tha.data(), 6);
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
  std::memcpy(a + 18, tha.data(), 6);
  wire::store_be32(a + 24, tip);
  SendFrame(f, len);
}

void Device::HandleArp(const uint8_t* f, size_t len) {
  if (len < wire::kEthLen + kArpLen) return;
  const uint8_t* a = f + wire::kEthLen;
  if (wire::load_be16(a) != 1 || wire::load_be16(a + 2) != 0x0800 || a[4] != 6 || a[5] != 4) return;
  const uint16_t op = wire::load_be16(a + 6);
  wire::MacAddr sha;
  std::memcpy(sha.data(), a + 8, 6);
  const uint32_t spa = wire::load_be32(a + 14);
  const uint32_t tpa = wire::load_be32(a + 24);
  if (tpa != port_.ip) return;
  // RFC 826: a packet addressed to us updates (or adds) the sender's entry.
  Neighbor& n = neighbors_[spa];
  n.mac = sha;
  n.valid = true;
  if (op == 1) {
    SendArp(2, sha, spa);
    ++stats_.arp_replies;
  }
  // A resolved neighbour unblocks every requester waiting on it.
  for (auto& [qpn, e] : qps_) {
    (void)qpn;
    Activate(e.get());
  }
}

}  // namespace droce::engine
