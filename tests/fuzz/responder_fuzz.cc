// libFuzzer target: the transport (responder and requester) fed arbitrary
// packets between the legitimate ones of a connected pair in the
// virtual-time simulator (transport/sim/two_qp.h). The input is a mode byte
// (bits 0-1: RC, UC or UD; bit 4: selective repeat on both), then packets,
// each a length byte, a target byte (bit 0: to a, else b; bit 6: to the QPN
// in bits 0-5 instead; bit 7: the opcode's transport bits set to the
// pair's) and that many bytes of BTH, extended headers and payload. Every
// packet gets outer headers from the other QP's address and a correct
// ICRC, so it reaches the QP's checks, not just the parser's. Meanwhile a
// posts a WRITE, a READ and a SEND to b (RC; UC: the WRITE and the SEND),
// and the simulator runs the pair. The oracle is AddressSanitizer and UBSan
// (a write outside the simulator's buffers, an overflow, a bad shift) and
// the transport's own asserts.
//
// Build and run: tests/fuzz/run.sh SECONDS (clang++ -fsanitize=fuzzer,...).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "transport/sim/two_qp.h"
#include "wire/build.h"
#include "wire/frame.h"

namespace {

using droce::transport::sim::ConnectOpts;
using droce::transport::sim::LinkFaults;
using droce::transport::sim::SimPair;
using droce::transport::sim::SimQp;
namespace wire = droce::wire;
namespace queue = droce::queue;

constexpr size_t kBuf = 40 * 1024;

// A frame from `from` to `to` around the fuzzed transport bytes, with the
// ICRC computed; empty if the bytes are too short for a BTH.
std::vector<uint8_t> Frame(const SimQp& from, const SimQp& to, uint32_t dqpn, const uint8_t* t, size_t n) {
  if (n < 12) return {};
  wire::Path path;
  path.sip = from.ip;
  path.dip = to.ip;
  const unsigned outer = wire::outer_len(path);
  std::vector<uint8_t> f(outer + n + 4);
  wire::write_outer(f.data(), path, n + 4);
  std::memcpy(&f[outer], t, n);
  f[outer + 5] = static_cast<uint8_t>(dqpn >> 16);
  f[outer + 6] = static_cast<uint8_t>(dqpn >> 8);
  f[outer + 7] = static_cast<uint8_t>(dqpn);
  wire::finish_icrc(f.data(), f.size());
  return f;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  // The first byte picks the QP type and options.
  const uint8_t mode = data[0];
  ++data;
  --size;
  const droce::transport::QpType types[] = {droce::transport::QpType::kRc, droce::transport::QpType::kUc,
                                            droce::transport::QpType::kUd};
  const droce::transport::QpType type = types[mode % 3];
  SimPair p(LinkFaults{}, 1);
  p.a.sr.on = p.b.sr.on = (mode & 0x10) != 0;
  ConnectOpts c;
  c.psn = 0;
  c.max_rd_atomic = c.max_dest_rd_atomic = 4;
  if (p.Init(16, 64, kBuf, c, type) != 0) return 0;
  for (size_t i = 0; i < kBuf; ++i) p.a.buf[i] = static_cast<uint8_t>(i * 13 + 5);
  for (int i = 0; i < 8; ++i) p.b.PostRecv(100 + i, static_cast<uint32_t>(i) * 1024, 1024);
  for (int i = 0; i < 8; ++i) p.a.PostRecv(200 + i, 32 * 1024 + static_cast<uint32_t>(i) * 1024, 1024);
  if (type == droce::transport::QpType::kRc) {
    p.a.PostOp(queue::WqeOp::kWrite, 1, 0, 4096, p.b.Addr(8192), p.b.key);
    p.a.PostOp(queue::WqeOp::kRead, 2, 16384, 2048, p.b.Addr(20000), p.b.key);
    p.a.PostOp(queue::WqeOp::kSend, 3, 0, 512);
  } else if (type == droce::transport::QpType::kUc) {
    p.a.PostOp(queue::WqeOp::kWrite, 1, 0, 4096, p.b.Addr(8192), p.b.key);
    p.a.PostOp(queue::WqeOp::kSend, 3, 0, 512);
  }

  // The fuzzed packets, one per step of the simulator, with the
  // legitimate traffic going on meanwhile.
  size_t off = 0;
  while (off < size) {
    const size_t n = data[off++];
    if (off >= size) break;
    // bit 0: to a (else b); bit 6: to QPN (bits 0-5) instead; bit 7: the
    // opcode's transport bits set to the pair's.
    const uint8_t target = data[off++];
    if (off >= size) break;
    const size_t len = std::min(n, size - off);
    std::vector<uint8_t> t(data + off, data + off + len);
    off += len;
    if (t.size() >= 12) {
      // The opcode's transport bits follow the pair's type most of the time.
      if (target & 0x80) t[0] = static_cast<uint8_t>((t[0] & 0x1F) | (type == droce::transport::QpType::kUc ? 0x20 : type == droce::transport::QpType::kUd ? 0x60 : 0x00));
    }
    SimQp& to = (target & 1) ? p.a : p.b;
    SimQp& from = (target & 1) ? p.b : p.a;
    const uint32_t dqpn = (target & 0x40) ? (target & 0x3F) : to.qp->qpn();
    std::vector<uint8_t> f = Frame(from, to, dqpn, t.data(), t.size());
    if (!f.empty()) {
      wire::PacketView v;
      if (wire::parse_frame({f.data(), f.size()}, &v) == wire::ParseError::kOk && v.bth.dqpn == to.qp->qpn()) {
        to.qp->OnPacket(v);
      }
    }
    for (int i = 0; i < 4; ++i) p.net.Step();
  }
  for (int i = 0; i < 64 && p.net.Step(); ++i) {
  }
  // Every completion readable (a CQE's fields are whatever the QP wrote).
  std::vector<queue::Cqe> cqe(64);
  while (p.a.scq_c->Poll(cqe.data(), 64) > 0) {
  }
  while (p.b.rcq_c->Poll(cqe.data(), 64) > 0) {
  }
  return 0;
}
