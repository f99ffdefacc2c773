// ICMP echo (RFC 792) for the device's IPv4 address, so that `ping` reaches
// a droce port. Cold path: only frames the RoCE parser turned away as "not
// UDP" come here.
#include <algorithm>
#include <cstring>

#include <rte_mbuf.h>

#include "engine/device.h"
#include "engine/inet.h"
#include "wire/bytes.h"

namespace droce::engine {
namespace {

constexpr uint8_t kIpProtoIcmp = 1;
constexpr uint8_t kIpProtoIcmp6 = 58;
constexpr uint8_t kIcmpEchoReply = 0;
constexpr uint8_t kIcmpEchoRequest = 8;

}  // namespace

bool Device::HandleLocal(Worker& w, const uint8_t* f, size_t len) {
  if (len < wire::kEthLen) return false;
  unsigned l3 = wire::kEthLen;
  uint16_t type = wire::load_be16(f + 12);
  if (type == wire::kEtherTypeVlan) {
    if (len < wire::kEthLen + wire::kVlanLen) return false;
    type = wire::load_be16(f + 16);
    l3 += wire::kVlanLen;
  }
  if (type == wire::kEtherTypeIpv4) {
    if (len < l3 + wire::kIpv4Len || f[l3 + 9] != kIpProtoIcmp) return false;
    HandleIcmp4(w, f, len, l3);
    return true;
  }
  if (type == wire::kEtherTypeIpv6) {
    if (len < l3 + wire::kIpv6Len || f[l3 + 6] != kIpProtoIcmp6) return false;
    HandleIcmp6(w, f, len, l3);
    return true;
  }
  return false;
}

void Device::HandleIcmp4(Worker& w, const uint8_t* f, size_t len, unsigned l3) {
  const uint8_t* ip = f + l3;
  const unsigned hl = (ip[0] & 0xF) * 4u;
  if ((ip[0] >> 4) != 4 || hl < wire::kIpv4Len || len < l3 + hl) return;
  const unsigned total = wire::load_be16(ip + 2);
  if (total < hl + 8 || total > len - l3) return;
  if (inet_checksum(ip, hl) != 0) return;
  if ((wire::load_be16(ip + 6) & 0x3FFF) != 0) return;  // fragments: not reassembled
  if (wire::load_be32(ip + 16) != port_.ip) return;      // no broadcast/multicast echo
  const uint8_t* icmp = ip + hl;
  const unsigned icmp_len = total - hl;
  if (icmp[0] != kIcmpEchoRequest || icmp[1] != 0) return;
  if (inet_checksum(icmp, icmp_len) != 0) return;

  // The reply: to the sender's MAC (as the RoCE responder does), without the
  // request's IP options, with the request's identifier, sequence and data.
  const uint32_t frame_len = std::max<uint32_t>(wire::kEthLen + wire::kIpv4Len + icmp_len, 60);
  transport::TxFrame out;
  if (!w.AllocFrame(frame_len, &out)) return;
  uint8_t* p = out.data;
  std::memset(p, 0, frame_len);
  std::memcpy(p, f + 6, 6);
  std::memcpy(p + 6, port_.mac.data(), 6);
  wire::store_be16(p + 12, wire::kEtherTypeIpv4);
  uint8_t* oip = p + wire::kEthLen;
  oip[0] = 0x45;
  oip[1] = ip[1];  // same TOS
  wire::store_be16(oip + 2, static_cast<uint16_t>(wire::kIpv4Len + icmp_len));
  wire::store_be16(oip + 4, ip_id_.fetch_add(1, std::memory_order_relaxed));
  wire::store_be16(oip + 6, 0);
  oip[8] = 64;
  oip[9] = kIpProtoIcmp;
  wire::store_be32(oip + 12, port_.ip);
  std::memcpy(oip + 16, ip + 12, 4);
  wire::store_be16(oip + 10, inet_checksum(oip, wire::kIpv4Len));
  uint8_t* oicmp = oip + wire::kIpv4Len;
  std::memcpy(oicmp, icmp, icmp_len);
  oicmp[0] = kIcmpEchoReply;
  wire::store_be16(oicmp + 2, 0);
  wire::store_be16(oicmp + 2, inet_checksum(oicmp, icmp_len));
  w.SendFrame(out, frame_len);
}

}  // namespace droce::engine
