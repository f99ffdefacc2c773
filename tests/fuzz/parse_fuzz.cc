// libFuzzer target: wire::parse_frame on arbitrary bytes, contiguous and in
// segments. Each segment is a separate exact-size heap block, so that
// AddressSanitizer catches any read past a segment. The two parsers must
// agree: same result, same fields, same payload bytes.
//
// Build and run: tests/fuzz/run.sh SECONDS (clang++ -fsanitize=fuzzer,...).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "wire/build.h"
#include "wire/bytes.h"
#include "wire/frame.h"

namespace {

using droce::wire::PacketView;
using droce::wire::ParseError;

void Check(bool ok) {
  if (!ok) std::abort();
}

// Cut points derived from the data, so that the input alone decides them
// (and the contiguous frame is exactly the input).
std::vector<size_t> Cuts(const uint8_t* data, size_t size) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < size; ++i) h = (h ^ data[i]) * 16777619u;
  std::vector<size_t> cuts;
  if (size == 0) return cuts;
  const unsigned n = 1 + h % 5;
  for (unsigned i = 0; i < n; ++i) {
    h = h * 1103515245u + 12345u;
    // Bias towards the header region, where straddling is interesting.
    cuts.push_back((h >> 8) % (size < 128 || (h & 1) ? size + 1 : 128));
  }
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

}  // namespace

void CheckBytes(const uint8_t* data, size_t size);

// Random bytes rarely carry a valid ICRC, so most inputs stop there. When
// the parse got as far as the ICRC (or the IPv6 UDP checksum), also check a
// copy with both repaired, so that mutated headers reach the success paths.
void Repair(const uint8_t* data, size_t size, const PacketView& v) {
  std::vector<uint8_t> f(data, data + size);
  uint8_t* ip = f.data() + v.l3_offset;
  const size_t ip_total = v.ipv6 ? droce::wire::kIpv6Len + droce::wire::load_be16(ip + 4)
                                  : droce::wire::load_be16(ip + 2);
  const uint32_t icrc = droce::wire::compute_icrc(ip, ip_total);
  uint8_t* p = ip + ip_total - 4;
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(icrc >> (8 * i));
  if (v.ipv6 && v.udp_checksum != 0) {
    droce::wire::store_be16(ip + droce::wire::kIpv6Len + 6, droce::wire::udp_checksum(ip, ip_total));
  }
  PacketView r;
  Check(droce::wire::parse_frame(std::span<const uint8_t>(f), &r) == ParseError::kOk);
  CheckBytes(f.data(), f.size());
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  PacketView v;
  const ParseError e = droce::wire::parse_frame(std::span<const uint8_t>(data, size), &v);
  if (e == ParseError::kBadIcrc || e == ParseError::kBadUdpChecksum) Repair(data, size, v);
  CheckBytes(data, size);
  return 0;
}

void CheckBytes(const uint8_t* data, size_t size) {
  PacketView v;
  const ParseError e = droce::wire::parse_frame(std::span<const uint8_t>(data, size), &v);
  Check(droce::wire::parse_error_name(e) != nullptr);
  std::vector<uint8_t> payload;
  if (e == ParseError::kOk) {
    Check(v.info != nullptr && v.info->name != nullptr);
    Check(v.payload >= data && v.payload + v.payload_len <= data + size);
    Check(v.bth_offset + v.info->length + v.payload_len + v.bth.pad + 4 <= size);
    payload.assign(v.payload, v.payload + v.payload_len);
    const auto h = droce::wire::read_transport_headers(v);
    Check(h.bth.opcode == v.bth.opcode);
  }

  // The same bytes in segments, each in its own allocation.
  const std::vector<size_t> cuts = Cuts(data, size);
  std::vector<std::unique_ptr<uint8_t[]>> blocks;
  std::vector<std::span<const uint8_t>> segs;
  size_t prev = 0;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    const size_t end = i < cuts.size() ? cuts[i] : size;
    const size_t len = end - prev;
    blocks.emplace_back(new uint8_t[len ? len : 1]);
    if (len) std::memcpy(blocks.back().get(), data + prev, len);
    segs.emplace_back(blocks.back().get(), len);
    prev = end;
  }
  droce::wire::HeaderScratch scratch;
  PacketView s;
  const ParseError es = droce::wire::parse_frame(droce::wire::Segments(segs), &s, &scratch);
  Check(es == e);
  if (es == ParseError::kOk) {
    Check(s.bth_offset == v.bth_offset && s.payload_len == v.payload_len && s.info == v.info);
    Check(s.bth.psn == v.bth.psn && s.bth.dqpn == v.bth.dqpn && s.ipv6 == v.ipv6);
    Check(std::memcmp(s.ext(0), v.ext(0), v.info->length) == 0);
    std::vector<uint8_t> p(s.payload_len);
    Check(droce::wire::copy_payload(segs, s, p.data()) == p.size());
    Check(p == payload);
    if (s.payload != nullptr && !payload.empty()) Check(std::memcmp(s.payload, payload.data(), payload.size()) == 0);
  }
}
