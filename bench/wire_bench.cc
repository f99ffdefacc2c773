// Microbenchmarks of the wire code: the ICRC's CRC-32 (isa-l) in GB/s from
// 64 B to a 9 KiB jumbo frame, next to a byte-at-a-time table CRC as the
// baseline a hand-written one would give; and the cost per packet of
// parsing (contiguous, IPv6, segmented) and building frames.
//
//   build/bench/wire_bench [--benchmark_filter=REGEX]

#include <benchmark/benchmark.h>

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "wire/build.h"
#include "wire/frame.h"
#include "wire/icrc.h"

namespace {

namespace wire = droce::wire;

void Sizes(benchmark::internal::Benchmark* b) {
  for (int s : {64, 128, 256, 512, 1024, 2048, 4096, 8192, 9216}) b->Arg(s);
}

std::vector<uint8_t> Data(size_t n) {
  std::vector<uint8_t> d(n);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<uint8_t>(i * 131 + 7);
  return d;
}

void BM_Crc32Isal(benchmark::State& state) {
  const auto d = Data(static_cast<size_t>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(wire::crc32(0, d.data(), d.size()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_Crc32Isal)->Apply(Sizes);

// Sarwate's byte-at-a-time table CRC: what a hand-written ICRC would cost.
void BM_Crc32Table(benchmark::State& state) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1)));
      t[i] = c;
    }
    return t;
  }();
  const auto d = Data(static_cast<size_t>(state.range(0)));
  for (auto _ : state) {
    uint32_t c = 0xFFFFFFFF;
    for (uint8_t x : d) c = table[(c ^ x) & 0xFF] ^ (c >> 8);
    benchmark::DoNotOptimize(~c);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * state.range(0));
}
BENCHMARK(BM_Crc32Table)->Arg(64)->Arg(1024)->Arg(4096)->Arg(9216);

// A RoCEv2 RC SEND Only frame of `frame_len` bytes in total.
std::vector<uint8_t> Frame(size_t frame_len, bool ipv6, wire::Path* path_out = nullptr) {
  wire::Path p;
  p.ipv6 = ipv6;
  p.sip = 0x0a000001;
  p.dip = 0x0a000002;
  p.sip6[15] = 1;
  p.dip6[15] = 2;
  wire::TransportHeaders h;
  h.bth.opcode = wire::kRcSendOnly;
  h.bth.dqpn = 0x11;
  const size_t head = wire::outer_len(p) + wire::kBthLen + wire::kIcrcLen;
  const auto payload = Data(frame_len > head ? frame_len - head : 0);
  std::vector<uint8_t> f(frame_len + 64);
  f.resize(wire::build_frame(f, p, h, payload));
  if (path_out != nullptr) *path_out = p;
  return f;
}

// The whole ICRC of a frame: masked pseudo header, then the rest.
void BM_Icrc(benchmark::State& state) {
  const auto f = Frame(static_cast<size_t>(state.range(0)), false);
  const uint8_t* ip = f.data() + wire::kEthLen;
  for (auto _ : state) benchmark::DoNotOptimize(wire::compute_icrc(ip, f.size() - wire::kEthLen));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.size()));
}
BENCHMARK(BM_Icrc)->Apply(Sizes);

// The IPv4 header checksum (built and verified once per packet each), and
// the plain RFC 1071 16-bit loop it replaced, for the ratio.
std::array<uint8_t, 20> Ipv4HeaderBytes() {
  std::array<uint8_t, 20> h;
  for (size_t i = 0; i < h.size(); ++i) h[i] = static_cast<uint8_t>(i * 37 + 5);
  return h;
}

void BM_Ipv4Checksum(benchmark::State& state) {
  auto h = Ipv4HeaderBytes();
  for (auto _ : state) {
    benchmark::DoNotOptimize(h);
    benchmark::DoNotOptimize(wire::ipv4_checksum(h.data(), h.size()));
  }
}
BENCHMARK(BM_Ipv4Checksum);

void BM_Ipv4Checksum16BitLoop(benchmark::State& state) {
  auto h = Ipv4HeaderBytes();
  for (auto _ : state) {
    benchmark::DoNotOptimize(h);
    uint32_t sum = 0;
    for (size_t i = 0; i + 1 < h.size(); i += 2) sum += wire::load_be16(h.data() + i);
    while (sum >> 16) sum = (sum & 0xFFFF) + (sum >> 16);
    benchmark::DoNotOptimize(static_cast<uint16_t>(~sum));
  }
}
BENCHMARK(BM_Ipv4Checksum16BitLoop);

void BM_ParseV4(benchmark::State& state) {
  const auto f = Frame(static_cast<size_t>(state.range(0)), false);
  wire::PacketView v;
  for (auto _ : state) {
    benchmark::DoNotOptimize(wire::parse_frame(std::span<const uint8_t>(f), &v));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.size()));
}
BENCHMARK(BM_ParseV4)->Arg(64)->Arg(1024)->Arg(4096)->Arg(9216);

void BM_ParseV6(benchmark::State& state) {
  const auto f = Frame(static_cast<size_t>(state.range(0)), true);
  wire::PacketView v;
  for (auto _ : state) {
    benchmark::DoNotOptimize(wire::parse_frame(std::span<const uint8_t>(f), &v));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.size()));
}
BENCHMARK(BM_ParseV6)->Arg(80)->Arg(1024)->Arg(4096)->Arg(9216);

// A jumbo frame in 2 KiB segments, as a DPDK mempool would chain it.
void BM_ParseSegmented(benchmark::State& state) {
  const auto f = Frame(static_cast<size_t>(state.range(0)), false);
  std::vector<std::span<const uint8_t>> segs;
  for (size_t off = 0; off < f.size(); off += 2048) segs.push_back({f.data() + off, std::min<size_t>(2048, f.size() - off)});
  wire::PacketView v;
  wire::HeaderScratch scratch;
  for (auto _ : state) {
    benchmark::DoNotOptimize(wire::parse_frame(segs, &v, &scratch));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.size()));
}
BENCHMARK(BM_ParseSegmented)->Arg(4096)->Arg(9216);

// build_frame: outer headers, transport headers, payload copy, ICRC.
void BM_Build(benchmark::State& state) {
  wire::Path p;
  const auto f0 = Frame(static_cast<size_t>(state.range(0)), false, &p);
  wire::TransportHeaders h;
  h.bth.opcode = wire::kRcSendOnly;
  const size_t head = wire::outer_len(p) + wire::kBthLen + wire::kIcrcLen;
  const auto payload = Data(f0.size() - head);
  std::vector<uint8_t> out(f0.size());
  for (auto _ : state) {
    benchmark::DoNotOptimize(wire::build_frame(out, p, h, payload));
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * out.size()));
}
BENCHMARK(BM_Build)->Arg(64)->Arg(1024)->Arg(4096)->Arg(9216);

// Headers only, as the requester does it: write_outer + BTH + finish_icrc
// over a frame whose payload is already in place.
void BM_OuterAndIcrc(benchmark::State& state) {
  wire::Path p;
  auto f = Frame(static_cast<size_t>(state.range(0)), false, &p);
  const size_t roce_len = f.size() - wire::outer_len(p);
  wire::Bth b;
  b.opcode = wire::kRcSendOnly;
  for (auto _ : state) {
    const unsigned off = wire::write_outer(f.data(), p, roce_len, 1);
    wire::write_bth(f.data() + off, b);
    wire::finish_icrc(f.data(), f.size());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.size()));
}
BENCHMARK(BM_OuterAndIcrc)->Arg(64)->Arg(1024)->Arg(4096)->Arg(9216);

}  // namespace

BENCHMARK_MAIN();
