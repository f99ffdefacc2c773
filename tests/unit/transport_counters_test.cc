// The ConnectX-named counters (docs/COUNTERS.md), each
// triggered an exact number of times in the virtual-time simulator.
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

// Polls a's send CQ until n completions arrived; returns them.
std::vector<queue::Cqe> SendCompletions(SimPair& p, int n) {
  std::vector<queue::Cqe> c(64);
  int got = 0;
  EXPECT_TRUE(p.net.Run([&] {
    got += p.a.scq_c->Poll(c.data() + got, 64 - got);
    return got >= n;
  }));
  c.resize(got);
  return c;
}

// 7 WRITEs (some of several packets), 5 READs and 4 atomics: the responder
// counts each request message once, also when the link duplicates packets
// (duplicates are duplicate_request, not requests).
void RequestCounts(double dup, uint64_t seed) {
  LinkFaults f;
  f.dup = dup;
  SimPair p(f, seed);
  ASSERT_EQ(0, p.Init(64, 256, 64 * 1024, {.mtu = 1}));  // 256-byte MTU
  SimQp &a = p.a, &b = p.b;
  for (int i = 0; i < 7; ++i) a.PostOp(queue::WqeOp::kWrite, i, 0, 100 + 300 * i, b.Addr(0), b.key);
  for (int i = 0; i < 5; ++i) a.PostOp(queue::WqeOp::kRead, 10 + i, 8192, 700, b.Addr(4096), b.key);
  for (int i = 0; i < 4; ++i) a.PostOp(queue::WqeOp::kFetchAdd, 20 + i, 16384, 8, b.Addr(32768), b.key, 1);
  const auto c = SendCompletions(p, 16);
  ASSERT_EQ(c.size(), 16u);
  for (const auto& e : c) EXPECT_EQ(e.status, queue::wc::kSuccess) << e.wr_id;
  EXPECT_EQ(b.env->stats.rx_write_requests, 7u);
  EXPECT_EQ(b.env->stats.rx_read_requests, 5u);
  EXPECT_EQ(b.env->stats.rx_atomic_requests, 4u);
  // The requester received none.
  EXPECT_EQ(a.env->stats.rx_write_requests + a.env->stats.rx_read_requests + a.env->stats.rx_atomic_requests, 0u);
  uint64_t word = 0;
  std::memcpy(&word, b.buf.data() + 32768, 8);
  EXPECT_EQ(word, 4u);
  if (dup > 0) {
    EXPECT_GT(b.env->stats.duplicate_request, 0u);
  }
}

TEST(TransportCounters, RxRequestsLossless) { RequestCounts(0, 31); }
TEST(TransportCounters, RxRequestsNotRecountedForDuplicates) { RequestCounts(0.3, 32); }

// A WRITE with immediate that finds no receive WQE is RNR-NAKed and sent
// again: it is one WRITE request, counted when accepted.
TEST(TransportCounters, RnrRefusedWriteCountsOnce) {
  SimPair p(LinkFaults{}, 33);
  ASSERT_EQ(0, p.Init(16, 64, 4096, {.mtu = 3}));
  SimQp &a = p.a, &b = p.b;
  a.PostOp(queue::WqeOp::kWriteImm, 1, 0, 64, b.Addr(0), b.key);
  p.net.Run([&] { return b.env->stats.send_rnr_err >= 2; });
  EXPECT_EQ(b.env->stats.rx_write_requests, 0u);
  b.PostRecv(9, 0, 0);
  const auto c = SendCompletions(p, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, queue::wc::kSuccess);
  EXPECT_EQ(b.env->stats.rx_write_requests, 1u);
}

// A READ of 4 responses whose first response is lost: the requester decides
// once that responses were lost (an implied NAK) and asks again; the
// responder sees the reissue as a duplicate of the READ (executed again,
// not a new request).
TEST(TransportCounters, ImpliedNakOncePerGap) {
  SimPair p(LinkFaults{}, 34);
  ASSERT_EQ(0, p.Init(16, 64, 8192, {.mtu = 1}));  // 256-byte MTU: 1000 bytes = 4 responses
  SimQp &a = p.a, &b = p.b;
  for (uint32_t i = 0; i < 1000; ++i) b.buf[4096 + i] = static_cast<uint8_t>(i * 13 + 5);
  bool dropped = false;
  p.net.tap = [&](const wire::PacketView& v) {
    if (v.bth.opcode == wire::kRcReadResponseFirst && !dropped) {
      dropped = true;
      return false;
    }
    return true;
  };
  a.PostOp(queue::WqeOp::kRead, 1, 0, 1000, b.Addr(4096), b.key);
  const auto c = SendCompletions(p, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, queue::wc::kSuccess);
  EXPECT_EQ(0, std::memcmp(a.buf.data(), b.buf.data() + 4096, 1000));
  EXPECT_EQ(a.env->stats.implied_nak_seq_err, 1u);
  EXPECT_EQ(b.env->stats.rx_read_requests, 1u);
  EXPECT_GE(b.env->stats.duplicate_request, 1u);
}

// A bad lkey fails its WQE and flushes the next: one error CQE, one flushed,
// on the requester; nothing on the responder.
TEST(TransportCounters, RequesterCqeErrors) {
  SimPair p(LinkFaults{}, 35);
  ASSERT_EQ(0, p.Init(16, 64, 4096, {.mtu = 3}));
  SimQp &a = p.a, &b = p.b;
  a.PostSend(1, 0, 100, /*lkey_override=*/0xBAD00);
  a.PostSend(2, 0, 100);
  a.PostSend(3, 0, 100);
  const auto c = SendCompletions(p, 3);
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(a.env->stats.req_cqe_error, 1u);
  EXPECT_EQ(a.env->stats.req_cqe_flush_error, 2u);
  EXPECT_EQ(a.env->stats.resp_cqe_error + a.env->stats.resp_cqe_flush_error, 0u);
  EXPECT_EQ(b.env->stats.req_cqe_error + b.env->stats.resp_cqe_error, 0u);
}

// A receive buffer too small: the responder completes it with a local length
// error and flushes the two receives behind it; the requester's SEND ends in
// a remote invalid request error.
TEST(TransportCounters, ResponderCqeErrors) {
  SimPair p(LinkFaults{}, 36);
  ASSERT_EQ(0, p.Init(16, 64, 4096, {.mtu = 3}));
  SimQp &a = p.a, &b = p.b;
  b.PostRecv(5, 0, 10);
  b.PostRecv(6, 0, 1000);
  b.PostRecv(7, 0, 1000);
  a.PostSend(8, 0, 100);
  const auto c = SendCompletions(p, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, queue::wc::kRemInvReqErr);
  std::vector<queue::Cqe> r(8);
  int n = 0;
  ASSERT_TRUE(p.net.Run([&] {
    n += b.rcq_c->Poll(r.data() + n, 8 - n);
    return n == 3;
  }));
  EXPECT_EQ(r[0].status, queue::wc::kLocLenErr);
  EXPECT_EQ(b.env->stats.resp_cqe_error, 1u);
  EXPECT_EQ(b.env->stats.resp_cqe_flush_error, 2u);
  EXPECT_EQ(a.env->stats.req_cqe_error, 1u);
  EXPECT_EQ(a.env->stats.req_cqe_flush_error, 0u);
  // The one length error, seen by the responder only.
  EXPECT_EQ(b.env->stats.resp_local_length_error, 1u);
  EXPECT_EQ(b.qp->counters().values[static_cast<size_t>(QpCounter::resp_local_length_error)], 1u);
  EXPECT_EQ(a.env->stats.resp_local_length_error, 0u);
}

// Three SENDs into a UD QP with one receive WQE: one delivered, two dropped
// for want of a buffer (out_of_buffer 2), and a message longer than its
// buffer completes with a length error (resp_local_length_error 1).
TEST(TransportCounters, UdOutOfBufferAndLengthError) {
  SimPair p(LinkFaults{}, 37);
  ASSERT_EQ(0, p.Init(16, 64, 8192, {.mtu = 3}, transport::QpType::kUd));
  SimQp &a = p.a, &b = p.b;
  // A 100-byte UD SEND to b through address handle 1.
  auto send = [&](uint64_t wr_id) {
    queue::SendWqe w{};
    w.wr_id = wr_id;
    w.op = queue::WqeOp::kSend;
    w.flags = queue::kWqeSignaled;
    w.num_sge = 1;
    queue::EncodeUd(&w, 1, b.qp->qpn(), 0x1111);
    const queue::Sge sge{a.Addr(0), 100, a.key};
    a.Post(w, &sge);
  };
  b.PostRecv(1, 0, 40 + 100);
  for (int i = 0; i < 3; ++i) send(10 + i);
  ASSERT_EQ(SendCompletions(p, 3).size(), 3u);
  p.net.Run([&] { return p.net.link.idle(); });
  EXPECT_EQ(b.env->stats.out_of_buffer, 2u);
  EXPECT_EQ(b.env->stats.resp_local_length_error, 0u);
  b.PostRecv(2, 4096, 40 + 50);  // 100 bytes do not fit in 50
  send(20);
  ASSERT_EQ(SendCompletions(p, 1).size(), 1u);
  std::vector<queue::Cqe> r(4);
  int n = 0;
  ASSERT_TRUE(p.net.Run([&] {
    n += b.rcq_c->Poll(r.data() + n, 4 - n);
    return n == 2;
  }));
  EXPECT_EQ(r[1].status, queue::wc::kLocLenErr);
  EXPECT_EQ(b.env->stats.resp_local_length_error, 1u);
  EXPECT_EQ(b.env->stats.out_of_buffer, 2u);
}

// An RC SEND that finds no receive WQE is RNR-NAKed each time it arrives:
// out_of_buffer counts each refusal, as send_rnr_err does.
TEST(TransportCounters, RcOutOfBufferPerRnrNak) {
  SimPair p(LinkFaults{}, 38);
  ASSERT_EQ(0, p.Init(16, 64, 4096, {.mtu = 3}));
  SimQp &a = p.a, &b = p.b;
  a.PostSend(1, 0, 64);
  p.net.Run([&] { return b.env->stats.send_rnr_err >= 3; });
  b.PostRecv(9, 0, 64);
  ASSERT_EQ(SendCompletions(p, 1).size(), 1u);
  EXPECT_EQ(b.env->stats.out_of_buffer, b.env->stats.send_rnr_err);
  EXPECT_GE(b.env->stats.out_of_buffer, 3u);
  EXPECT_EQ(a.env->stats.out_of_buffer, 0u);
}

// A WRITE with a bad rkey: one remote access error NAK, counted once by the
// requester that receives it (and as sent by the responder).
TEST(TransportCounters, RequesterRemoteAccessError) {
  SimPair p(LinkFaults{}, 39);
  ASSERT_EQ(0, p.Init(16, 64, 4096, {.mtu = 3}));
  SimQp &a = p.a, &b = p.b;
  a.PostOp(queue::WqeOp::kWrite, 1, 0, 64, b.Addr(0), b.key ^ 0x100);
  a.PostOp(queue::WqeOp::kWrite, 2, 0, 64, b.Addr(0), b.key);
  const auto c = SendCompletions(p, 2);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].status, queue::wc::kRemAccessErr);
  EXPECT_EQ(c[1].status, queue::wc::kWrFlushErr);
  EXPECT_EQ(a.env->stats.req_remote_access_errors, 1u);
  EXPECT_EQ(b.env->stats.send_rem_access_err, 1u);
  EXPECT_EQ(b.env->stats.req_remote_access_errors, 0u);
}

}  // namespace
}  // namespace droce::test
