// IBA 1.5 ATOMIC WRITE (RC opcode 0x1D) in the virtual-time
// simulator: the packet's layout, the 8 bytes landing in one store, the
// completion's opcode, the alignment rule, and loss and duplication.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "queue/wqe_encode.h"
#include "transport/sim/two_qp.h"
#include "wire/frame.h"

namespace droce::test {
namespace {

using transport::sim::LinkFaults;
using transport::sim::SimPair;
using transport::sim::SimQp;

void PostAtomicWrite(SimQp& a, uint64_t wr_id, uint64_t raddr, uint32_t rkey, uint64_t value) {
  queue::SendWqe w = queue::SendWqeHeader(wr_id, queue::WqeOp::kAtomicWrite, queue::kWqeSignaled, 0, 0);
  queue::EncodeAtomicWrite(&w, raddr, rkey, &value);  // the 8 bytes, in memory order
  a.Post(w, nullptr);
}

TEST(AtomicWrite, PacketLandsAndCompletes) {
  SimPair p(LinkFaults{}, 41);
  ASSERT_EQ(0, p.Init(16, 64, 4096, {.mtu = 3}));
  SimQp &a = p.a, &b = p.b;
  std::vector<uint8_t> seen;
  p.net.tap = [&](const wire::PacketView& v) {
    if (v.bth.opcode == wire::kRcAtomicWrite) seen.assign(v.frame.begin(), v.frame.end());
    return true;
  };
  const uint64_t value = 0x0123456789abcdefull;
  PostAtomicWrite(a, 7, b.Addr(64), b.key, value);
  std::vector<queue::Cqe> c(4);
  ASSERT_TRUE(p.net.Run([&] { return a.scq_c->Poll(c.data(), 4) == 1; }));
  EXPECT_EQ(c[0].status, queue::wc::kSuccess);
  EXPECT_EQ(c[0].opcode, queue::wc::kOpAtomicWrite);  // IBV_WC_ATOMIC_WRITE
  EXPECT_EQ(c[0].wr_id, 7u);
  uint64_t got = 0;
  std::memcpy(&got, b.buf.data() + 64, 8);
  EXPECT_EQ(got, value);
  EXPECT_EQ(b.env->stats.rx_write_requests, 1u);
  // On the wire: BTH opcode 0x1D with AckReq, then a RETH (va, rkey,
  // length 8), then the 8 bytes as the requester's memory holds them.
  ASSERT_FALSE(seen.empty());
  wire::PacketView v;
  ASSERT_EQ(wire::parse_frame(seen, &v), wire::ParseError::kOk);
  EXPECT_EQ(v.bth.opcode, 0x1D);
  EXPECT_TRUE(v.bth.ackreq);
  EXPECT_EQ(v.info->reth, 12);
  const wire::Reth reth = wire::read_reth(v.ext(v.info->reth));
  EXPECT_EQ(reth.va, b.Addr(64));
  EXPECT_EQ(reth.rkey, b.key);
  EXPECT_EQ(reth.dma_len, 8u);
  ASSERT_EQ(v.payload_len, 8u);
  EXPECT_EQ(std::memcmp(v.payload, &value, 8), 0);
}

// Not 8-byte aligned: the responder refuses it as an invalid request.
TEST(AtomicWrite, MisalignedIsRemoteInvalidRequest) {
  SimPair p(LinkFaults{}, 42);
  ASSERT_EQ(0, p.Init(16, 64, 4096, {.mtu = 3}));
  PostAtomicWrite(p.a, 1, p.b.Addr(65), p.b.key, 5);
  std::vector<queue::Cqe> c(4);
  ASSERT_TRUE(p.net.Run([&] { return p.a.scq_c->Poll(c.data(), 4) == 1; }));
  EXPECT_EQ(c[0].status, queue::wc::kRemInvReqErr);
}

// 200 ATOMIC WRITEs to one word under loss and duplication: each completes,
// in order, and the word holds the last value.
TEST(AtomicWrite, UnderLossAndDuplication) {
  LinkFaults f;
  f.loss = 0.05;
  f.dup = 0.2;
  SimPair p(f, 43);
  ASSERT_EQ(0, p.Init(64, 256, 4096, {.mtu = 3}));
  std::vector<queue::Cqe> c(64);
  uint64_t next = 1;
  for (int batch = 0; batch < 200 / 25; ++batch) {
    for (int i = 0; i < 25; ++i, ++next) PostAtomicWrite(p.a, next, p.b.Addr(128), p.b.key, next * 0x1111);
    int n = 0;
    ASSERT_TRUE(p.net.Run([&] {
      const int got = p.a.scq_c->Poll(c.data() + n, 64 - n);
      for (int k = n; k < n + got; ++k) EXPECT_EQ(c[k].status, queue::wc::kSuccess);
      n += got;
      return n == 25;
    }));
    EXPECT_EQ(c[24].wr_id, next - 1);  // in order
  }
  uint64_t got = 0;
  std::memcpy(&got, p.b.buf.data() + 128, 8);
  EXPECT_EQ(got, 200u * 0x1111);
  EXPECT_EQ(p.b.env->stats.rx_write_requests, 200u);
}

}  // namespace
}  // namespace droce::test
