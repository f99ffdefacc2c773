// libFuzzer target, differential: fuzz-chosen path, opcode, header fields
// and payload → wire::build_frame → wire::parse_frame (contiguous and in
// segments) → the same fields and payload. Any difference aborts.
//
// Build and run: tests/fuzz/run.sh SECONDS.

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <vector>

#include "wire/build.h"
#include "wire/frame.h"

namespace {

namespace wire = droce::wire;

void Check(bool ok) {
  if (!ok) std::abort();
}

bool SameHeaders(const wire::TransportHeaders& a, const wire::TransportHeaders& b, const wire::OpcodeInfo& info) {
  const wire::Bth &x = a.bth, &y = b.bth;
  if (x.opcode != y.opcode || x.se != y.se || x.migreq != y.migreq || x.pkey != y.pkey ||
      x.fecn != y.fecn || x.becn != y.becn || x.dqpn != y.dqpn || x.ackreq != y.ackreq ||
      x.psn != y.psn || x.tver != y.tver) {
    return false;
  }
  if ((info.mask & wire::kMaskDeth) && (a.deth.qkey != b.deth.qkey || a.deth.src_qp != b.deth.src_qp)) return false;
  if ((info.mask & wire::kMaskReth) &&
      (a.reth.va != b.reth.va || a.reth.rkey != b.reth.rkey || a.reth.dma_len != b.reth.dma_len)) {
    return false;
  }
  if ((info.mask & wire::kMaskAtomicEth) &&
      (a.atomic_eth.va != b.atomic_eth.va || a.atomic_eth.rkey != b.atomic_eth.rkey ||
       a.atomic_eth.swap_add != b.atomic_eth.swap_add || a.atomic_eth.compare != b.atomic_eth.compare)) {
    return false;
  }
  if ((info.mask & wire::kMaskAeth) && (a.aeth.syndrome != b.aeth.syndrome || a.aeth.msn != b.aeth.msn)) return false;
  if ((info.mask & wire::kMaskAtomicAckEth) && a.atomic_ack_eth.orig != b.atomic_ack_eth.orig) return false;
  if ((info.mask & wire::kMaskImmDt) && a.imm != b.imm) return false;
  if ((info.mask & wire::kMaskIeth) && a.ieth_rkey != b.ieth_rkey) return false;
  return true;
}

void CheckView(const wire::PacketView& v, const wire::Path& p, const wire::TransportHeaders& h,
               const wire::OpcodeInfo& info, size_t payload_len) {
  Check(v.ipv6 == p.ipv6 && v.has_vlan == p.vlan);
  if (p.vlan) Check(v.vlan_tci == p.vlan_tci);
  Check(v.dmac == p.dmac && v.smac == p.smac);
  Check(v.tos == p.tos && v.ttl == p.ttl && v.udp_sport == p.udp_sport);
  if (p.ipv6) {
    Check(v.sip6 == p.sip6 && v.dip6 == p.dip6 && v.flow_label == (p.flow_label & 0xFFFFF));
    Check(v.traffic_class == p.tos && v.hop_limit == p.ttl);
  } else {
    Check(v.sip == p.sip && v.dip == p.dip);
  }
  Check((v.udp_checksum != 0) == p.udp_checksum);
  Check(v.info == &info && v.payload_len == payload_len);
  Check(v.bth.pad == (4 - payload_len % 4) % 4);
  Check(SameHeaders(wire::read_transport_headers(v), h, info));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  wire::Path p;
  for (auto& b : p.dmac) b = in.ConsumeIntegral<uint8_t>();
  for (auto& b : p.smac) b = in.ConsumeIntegral<uint8_t>();
  p.vlan = in.ConsumeBool();
  p.vlan_tci = in.ConsumeIntegral<uint16_t>();
  p.ipv6 = in.ConsumeBool();
  p.sip = in.ConsumeIntegral<uint32_t>();
  p.dip = in.ConsumeIntegral<uint32_t>();
  for (auto& b : p.sip6) b = in.ConsumeIntegral<uint8_t>();
  for (auto& b : p.dip6) b = in.ConsumeIntegral<uint8_t>();
  p.udp_sport = in.ConsumeIntegral<uint16_t>();
  p.tos = in.ConsumeIntegral<uint8_t>();
  p.ttl = in.ConsumeIntegral<uint8_t>();
  p.flow_label = in.ConsumeIntegral<uint32_t>() & 0xFFFFF;
  p.udp_checksum = in.ConsumeBool();

  wire::TransportHeaders h;
  h.bth.opcode = in.ConsumeIntegral<uint8_t>();
  h.bth.se = in.ConsumeBool();
  h.bth.migreq = in.ConsumeBool();
  h.bth.pkey = in.ConsumeIntegral<uint16_t>();
  h.bth.fecn = in.ConsumeBool();
  h.bth.becn = in.ConsumeBool();
  h.bth.dqpn = in.ConsumeIntegral<uint32_t>() & 0xFFFFFF;
  h.bth.ackreq = in.ConsumeBool();
  h.bth.psn = in.ConsumeIntegral<uint32_t>() & 0xFFFFFF;
  h.deth = {in.ConsumeIntegral<uint32_t>(), in.ConsumeIntegral<uint32_t>() & 0xFFFFFF};
  h.reth = {in.ConsumeIntegral<uint64_t>(), in.ConsumeIntegral<uint32_t>(), in.ConsumeIntegral<uint32_t>()};
  h.atomic_eth = {in.ConsumeIntegral<uint64_t>(), in.ConsumeIntegral<uint32_t>(),
                  in.ConsumeIntegral<uint64_t>(), in.ConsumeIntegral<uint64_t>()};
  h.aeth = {in.ConsumeIntegral<uint8_t>(), in.ConsumeIntegral<uint32_t>() & 0xFFFFFF};
  h.atomic_ack_eth = {in.ConsumeIntegral<uint64_t>()};
  h.imm = in.ConsumeIntegral<uint32_t>();
  h.ieth_rkey = in.ConsumeIntegral<uint32_t>();
  const size_t cut1 = in.ConsumeIntegralInRange<size_t>(0, 200);
  const size_t cut2 = in.ConsumeIntegralInRange<size_t>(0, 10000);
  const std::vector<uint8_t> payload = in.ConsumeRemainingBytes<uint8_t>();

  const wire::OpcodeInfo& info = wire::opcode_info(h.bth.opcode);
  std::vector<uint8_t> frame(wire::kMaxRoceHeadLen + payload.size() + 8);
  const size_t n = wire::build_frame(frame, p, h, payload);
  if (info.name == nullptr || (!payload.empty() && !(info.mask & wire::kMaskPayload))) {
    Check(n == 0);
    return 0;
  }
  if (payload.size() > 60000) return 0;  // may exceed the 16-bit lengths
  Check(n == wire::frame_len_for(p, h.bth.opcode, payload.size()));
  frame.resize(n);

  wire::PacketView v;
  Check(wire::parse_frame(std::span<const uint8_t>(frame), &v) == wire::ParseError::kOk);
  CheckView(v, p, h, info, payload.size());
  Check(payload.empty() || std::memcmp(v.payload, payload.data(), payload.size()) == 0);

  // Three segments, each in its own exact-size allocation.
  const size_t a = cut1 < n ? cut1 : n;
  const size_t b = a + (cut2 < n - a ? cut2 : n - a);
  std::vector<uint8_t> s0(frame.begin(), frame.begin() + a), s1(frame.begin() + a, frame.begin() + b),
      s2(frame.begin() + b, frame.end());
  const std::span<const uint8_t> segs[] = {s0, s1, s2};
  wire::HeaderScratch scratch;
  wire::PacketView sv;
  Check(wire::parse_frame(wire::Segments(segs), &sv, &scratch) == wire::ParseError::kOk);
  CheckView(sv, p, h, info, payload.size());
  std::vector<uint8_t> got(sv.payload_len);
  Check(wire::copy_payload(segs, sv, got.data()) == got.size());
  Check(got == payload);
  return 0;
}
