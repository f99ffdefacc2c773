#include "wire/build.h"

#include <cstring>

namespace droce::wire {

unsigned write_transport_headers(uint8_t* p, const TransportHeaders& h) {
  const OpcodeInfo& info = opcode_info(h.bth.opcode);
  if (info.name == nullptr) return 0;
  write_bth(p, h.bth);
  // XRCETH (IBA 9.3.4): 8 reserved bits, then the XRC SRQ number.
  if (info.mask & kMaskXrceth) store_be32(p + info.xrceth, h.xrc_srqn & 0xFFFFFF);
  if (info.mask & kMaskDeth) write_deth(p + info.deth, h.deth);
  if (info.mask & kMaskReth) write_reth(p + info.reth, h.reth);
  if (info.mask & kMaskAtomicEth) write_atomic_eth(p + info.atomic_eth, h.atomic_eth);
  if (info.mask & kMaskAeth) write_aeth(p + info.aeth, h.aeth);
  if (info.mask & kMaskAtomicAckEth) write_atomic_ack_eth(p + info.atomic_ack_eth, h.atomic_ack_eth);
  if (info.mask & kMaskImmDt) write_immdt(p + info.immdt, h.imm);
  if (info.mask & kMaskIeth) write_ieth(p + info.ieth, h.ieth_rkey);
  // RoCEv2 annex A17.9.4: a CNP's BTH is followed by 16 reserved bytes.
  if (info.mask & kMaskCnp) std::memset(p + kBthLen, 0, kCnpPayloadLen);
  return info.length;
}

TransportHeaders read_transport_headers(const uint8_t* p, const OpcodeInfo& info) {
  TransportHeaders h;
  h.bth = read_bth(p);
  if (info.mask & kMaskXrceth) h.xrc_srqn = load_be32(p + info.xrceth) & 0xFFFFFF;
  if (info.mask & kMaskDeth) h.deth = read_deth(p + info.deth);
  if (info.mask & kMaskReth) h.reth = read_reth(p + info.reth);
  if (info.mask & kMaskAtomicEth) h.atomic_eth = read_atomic_eth(p + info.atomic_eth);
  if (info.mask & kMaskAeth) h.aeth = read_aeth(p + info.aeth);
  if (info.mask & kMaskAtomicAckEth) h.atomic_ack_eth = read_atomic_ack_eth(p + info.atomic_ack_eth);
  if (info.mask & kMaskImmDt) h.imm = read_immdt(p + info.immdt);
  if (info.mask & kMaskIeth) h.ieth_rkey = read_ieth(p + info.ieth);
  return h;
}

size_t frame_len_for(const Path& path, uint8_t opcode, size_t payload_len) {
  const OpcodeInfo& info = opcode_info(opcode);
  if (info.name == nullptr) return 0;
  const size_t pad = (4 - payload_len % 4) % 4;
  return outer_len(path) + info.length + payload_len + pad + kIcrcLen;
}

size_t build_frame(std::span<uint8_t> out, const Path& path, const TransportHeaders& h,
                   std::span<const uint8_t> payload, uint16_t ip_id) {
  const OpcodeInfo& info = opcode_info(h.bth.opcode);
  if (info.name == nullptr) return 0;
  if (!payload.empty() && !(info.mask & kMaskPayload)) return 0;
  const size_t pad = (4 - payload.size() % 4) % 4;
  const size_t roce_len = info.length + payload.size() + pad + kIcrcLen;
  // The IPv4 total length, the IPv6 payload length and the UDP length are
  // 16 bits.
  if (roce_len + kUdpLen + (path.ipv6 ? 0 : kIpv4Len) > 0xFFFF) return 0;
  const size_t len = outer_len(path) + roce_len;
  if (out.size() < len) return 0;
  uint8_t* f = out.data();
  const unsigned bth_off = write_outer(f, path, roce_len, ip_id);
  TransportHeaders hh = h;
  hh.bth.pad = static_cast<uint8_t>(pad);
  write_transport_headers(f + bth_off, hh);
  uint8_t* data = f + bth_off + info.length;
  if (!payload.empty()) std::memcpy(data, payload.data(), payload.size());
  std::memset(data + payload.size(), 0, pad);
  finish_frame(f, len, path);
  return len;
}

}  // namespace droce::wire
