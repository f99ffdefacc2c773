// Remote access after deregistration: once an MR is deregistered
// or a memory window invalidated or unbound, no packet — not even the rest
// of a message whose first packet was checked — may touch that memory. The
// engine changes the MR table only between loop turns (every worker
// stopped), so in the simulator a deregistration between two Steps is the
// same event as an ibv_dereg_mr that returns between two packets.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "transport/qp.h"
#include "transport/sim/two_qp.h"
#include "wire/frame.h"
#include "wire/opcode.h"

namespace droce::test {
namespace {

using transport::QpState;
using transport::QpType;
using transport::sim::kSimPd;
using transport::sim::LinkFaults;
using transport::sim::SimPair;
using transport::sim::SimQp;

constexpr uint8_t kOutside = 0xEE;  // never registered: must never change
constexpr uint8_t kReused = 0x5A;   // written by the "application" after dereg
constexpr uint32_t kRemote = mem::kLocalWrite | mem::kRemoteWrite | mem::kRemoteRead;

// A pair at a 256-byte MTU. The responder's whole-buffer MR is gone: its
// memory is registered only where a test registers it; the requester keeps
// its own (a.key) unless a test needs it bare.
struct Bare {
  explicit Bare(uint64_t seed, QpType type = QpType::kRc, LinkFaults f = {}) : p(f, seed) {
    EXPECT_EQ(0, p.Init(16, 64, 64 * 1024, {.mtu = 1}, type));
    EXPECT_TRUE(p.b.env->mrs.Deregister(p.b.key));
    std::mt19937 rng(static_cast<uint32_t>(seed));
    for (auto& x : p.a.buf) x = static_cast<uint8_t>(rng());
    std::memset(p.b.buf.data(), kOutside, p.b.buf.size());
  }
  uint32_t Reg(SimQp& q, size_t off, size_t len, uint32_t access = kRemote) {
    return q.env->mrs.Register(kSimPd, q.Addr(off), q.Addr(off), len, access)->key;
  }
  // Holds back every frame with one of `ops` after the first `pass` of them.
  void Hold(std::vector<uint8_t> ops, int pass = 0) {
    p.net.tap = [this, ops, pass, seen = 0](const wire::PacketView& v) mutable {
      for (uint8_t op : ops) {
        if (v.bth.opcode == op && seen++ >= pass) {
          held.emplace_back(v.frame.begin(), v.frame.end());
          return false;
        }
      }
      return true;
    };
  }
  void Release() {
    p.net.tap = nullptr;
    for (const auto& f : held) p.net.link.Inject(f);
    held.clear();
  }
  // Runs until `q` has n send completions; returns them.
  std::vector<queue::Cqe> SendCqes(SimQp& q, int n) {
    std::vector<queue::Cqe> c(8);
    int got = 0;
    EXPECT_TRUE(p.net.Run([&] {
      got += q.scq_c->Poll(c.data() + got, 8 - got);
      return got >= n;
    }, p.net.link.clock + 2'000'000'000ull));
    c.resize(got);
    return c;
  }
  SimPair p;
  std::vector<std::vector<uint8_t>> held;
};

// Counts bytes of [off, off+len) of q's buffer that differ from `v`.
size_t Changed(const SimQp& q, size_t off, size_t len, uint8_t v) {
  size_t n = 0;
  for (size_t i = off; i < off + len; ++i) n += q.buf[i] != v;
  return n;
}

// One 8 KiB WRITE (32 packets) from a into b's [4096, 12288) with `rkey`:
// the FIRST packet lands, the rest is held back while `revoke` takes the
// access away and the application reuses the memory, then released.
// Returns a's completions.
std::vector<queue::Cqe> WriteAcrossRevocation(Bare& t, uint32_t rkey, const std::function<void()>& revoke) {
  SimQp &a = t.p.a, &b = t.p.b;
  const bool uc = a.qp->type() == QpType::kUc;
  t.Hold(uc ? std::vector<uint8_t>{wire::kUcWriteMiddle, wire::kUcWriteLast}
            : std::vector<uint8_t>{wire::kRcWriteMiddle, wire::kRcWriteLast});
  a.PostOp(queue::WqeOp::kWrite, 7, 0, 8192, b.Addr(4096), rkey);
  EXPECT_TRUE(t.p.net.Run([&] { return t.held.size() == 31; }));
  EXPECT_EQ(0, std::memcmp(b.buf.data() + 4096, a.buf.data(), 256));  // FIRST landed
  revoke();
  std::memset(b.buf.data() + 4096, kReused, 8192);  // the application reuses it
  t.Release();
  auto c = t.SendCqes(a, 1);
  t.p.net.Run([&] { return t.p.net.link.idle(); });
  return c;
}

// The MR is deregistered after the FIRST packet was placed and before the
// MIDDLE ones arrive.
TEST(DeregMidMessage, RcWriteAfterDeregNaksAndWritesNothing) {
  Bare t(1);
  SimQp& b = t.p.b;
  const uint32_t rkey = t.Reg(b, 4096, 8192);
  const auto c = WriteAcrossRevocation(t, rkey, [&] { ASSERT_TRUE(b.env->mrs.Deregister(rkey)); });
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].wr_id, 7u);
  EXPECT_EQ(c[0].status, queue::wc::kRemAccessErr);
  EXPECT_EQ(Changed(b, 4096, 8192, kReused), 0u) << "bytes written after ibv_dereg_mr";
  EXPECT_EQ(Changed(b, 0, 4096, kOutside) + Changed(b, 4096 + 8192, b.buf.size() - 4096 - 8192, kOutside), 0u);
  EXPECT_EQ(b.qp->state(), QpState::kErr);  // class C error at the responder (IBA 9.9.3.1.3)
  EXPECT_EQ(b.qp->counters().values[static_cast<size_t>(QpCounter::send_rem_access_err)], 1u);
}

// The same with a type 2 window invalidated (LOCAL_INV or SEND with
// invalidate on the responder's side) between two packets.
TEST(DeregMidMessage, RcWriteAfterWindowInvalidateWritesNothing) {
  Bare t(2);
  SimQp& b = t.p.b;
  const uint32_t mr = t.Reg(b, 0, 32768, kRemote | mem::kMwBind);
  const uint32_t mw = *b.env->mrs.AllocMw(kSimPd, 2);
  ASSERT_EQ(b.env->mrs.Bind(mw, 2, kSimPd, b.qp->qpn(), mr, b.Addr(4096), 8192, mem::kRemoteWrite),
            mem::BindError::kOk);
  const auto c = WriteAcrossRevocation(t, mw, [&] { ASSERT_TRUE(b.env->mrs.Invalidate(mw, kSimPd)); });
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, queue::wc::kRemAccessErr);
  EXPECT_EQ(Changed(b, 4096, 8192, kReused), 0u) << "bytes written through an invalidated window";
}

// A type 1 window unbound (a bind of length 0) between two packets.
TEST(DeregMidMessage, RcWriteAfterWindowUnbindWritesNothing) {
  Bare t(3);
  SimQp& b = t.p.b;
  const uint32_t mr = t.Reg(b, 0, 32768, kRemote | mem::kMwBind);
  const uint32_t mw = *b.env->mrs.AllocMw(kSimPd, 1);
  const uint32_t bound = (mw & ~0xFFu) | ((mw + 1) & 0xFF);
  ASSERT_EQ(b.env->mrs.Bind(bound, 1, kSimPd, 0, mr, b.Addr(4096), 8192, mem::kRemoteWrite),
            mem::BindError::kOk);
  const uint32_t unbound = (bound & ~0xFFu) | ((bound + 1) & 0xFF);
  const auto c = WriteAcrossRevocation(
      t, bound, [&] { ASSERT_EQ(b.env->mrs.Bind(unbound, 1, kSimPd, 0, 0, 0, 0, 0), mem::BindError::kOk); });
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, queue::wc::kRemAccessErr);
  EXPECT_EQ(Changed(b, 4096, 8192, kReused), 0u) << "bytes written through an unbound window";
}

// UC has no NAK: the rest of the message is dropped and counted.
TEST(DeregMidMessage, UcWriteAfterDeregDropsTheRest) {
  Bare t(4, QpType::kUc);
  SimQp& b = t.p.b;
  const uint32_t rkey = t.Reg(b, 4096, 8192);
  WriteAcrossRevocation(t, rkey, [&] { ASSERT_TRUE(b.env->mrs.Deregister(rkey)); });
  EXPECT_EQ(Changed(b, 4096, 8192, kReused), 0u) << "bytes written after ibv_dereg_mr";
  EXPECT_EQ(b.qp->state(), QpState::kRts);
  EXPECT_GE(b.qp->counters().values[static_cast<size_t>(QpCounter::dropped_msgs)], 1u);
}

// A SEND whose receive buffer's MR goes away mid-message: a local
// protection error at the responder (IBA 10.8.3), remote operational error
// at the requester.
TEST(DeregMidMessage, SendAfterRecvBufferDeregWritesNothing) {
  Bare t(5);
  SimQp &a = t.p.a, &b = t.p.b;
  const uint32_t lkey = t.Reg(b, 4096, 8192, mem::kLocalWrite);
  const queue::RecvWqe rw{50, 1, 0};
  const queue::Sge rs{b.Addr(4096), 8192, lkey};
  std::memcpy(b.rq.slot(b.rq_prod), &rw, sizeof(rw));
  std::memcpy(b.rq.slot(b.rq_prod) + sizeof(rw), &rs, sizeof(rs));
  b.rq.publish_prod(++b.rq_prod);
  t.Hold({wire::kRcSendMiddle, wire::kRcSendLast});
  a.PostSend(11, 0, 8192);
  ASSERT_TRUE(t.p.net.Run([&] { return t.held.size() == 31; }));
  ASSERT_TRUE(b.env->mrs.Deregister(lkey));
  std::memset(b.buf.data() + 4096, kReused, 8192);
  t.Release();
  const auto c = t.SendCqes(a, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, queue::wc::kRemOpErr);
  std::vector<queue::Cqe> r(4);
  ASSERT_EQ(b.rcq_c->Poll(r.data(), 4), 1);
  EXPECT_EQ(r[0].wr_id, 50u);
  EXPECT_EQ(r[0].status, queue::wc::kLocProtErr);
  EXPECT_EQ(Changed(b, 4096, 8192, kReused), 0u);
}

// READ responses into a local buffer whose MR is deregistered mid-READ: the
// READ fails with a local protection error, the rest is not placed.
TEST(DeregMidMessage, ReadResponsesAfterLocalDeregWriteNothing) {
  Bare t(6);
  SimQp &a = t.p.a, &b = t.p.b;
  ASSERT_TRUE(a.env->mrs.Deregister(a.key));
  const uint32_t src = t.Reg(b, 0, 8192);
  const uint32_t sink = t.Reg(a, 16384, 8192, mem::kLocalWrite);
  t.Hold({wire::kRcReadResponseMiddle, wire::kRcReadResponseLast});
  a.PostOp(queue::WqeOp::kRead, 12, 16384, 8192, b.Addr(0), src, 0, 0, sink);
  ASSERT_TRUE(t.p.net.Run([&] { return t.held.size() == 31; }));
  ASSERT_TRUE(a.env->mrs.Deregister(sink));
  std::memset(a.buf.data() + 16384, kReused, 8192);
  t.Release();
  const auto c = t.SendCqes(a, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, queue::wc::kLocProtErr);
  EXPECT_EQ(Changed(a, 16384, 8192, kReused), 0u);
}

// READ from a responder MR deregistered mid-READ: no byte of it is read
// after the deregistration (the requester never sees the new contents).
TEST(DeregMidMessage, ReadFromDeregisteredSourceSendsNothingNew) {
  Bare t(7);
  SimQp &a = t.p.a, &b = t.p.b;
  ASSERT_TRUE(a.env->mrs.Deregister(a.key));
  const uint32_t sink = t.Reg(a, 16384, 16384, mem::kLocalWrite);
  std::memset(a.buf.data() + 16384, kOutside, 16384);
  std::memset(b.buf.data(), 0x11, 16384);
  const uint32_t src = t.Reg(b, 0, 16384);
  // Responses go out a burst at a time: deregister once the first burst
  // has arrived, with later ones still to be built.
  int responses = 0;
  t.p.net.tap = [&](const wire::PacketView& v) {
    if (v.bth.opcode >= wire::kRcReadResponseFirst && v.bth.opcode <= wire::kRcReadResponseOnly) ++responses;
    return true;
  };
  a.PostOp(queue::WqeOp::kRead, 13, 16384, 16384, b.Addr(0), src, 0, 0, sink);
  ASSERT_TRUE(t.p.net.Run([&] { return responses >= 1; }));
  ASSERT_TRUE(b.env->mrs.Deregister(src));
  std::memset(b.buf.data(), 0x99, 16384);  // reused: its new contents must not leave
  const auto c = t.SendCqes(a, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, queue::wc::kRemAccessErr);
  EXPECT_GT(Changed(a, 16384, 16384, kOutside), 0u);  // the first responses landed
  for (size_t i = 16384; i < 32768; ++i) ASSERT_NE(a.buf[i], 0x99) << "byte " << i - 16384;
}

// Deregisters at random points of multi-packet WRITEs, SENDs and READs
// (RC and UC, with some loss, so retransmissions cross the deregistration
// too) and checks, after every loop turn, that no byte outside live
// registrations changed: memory that was never registered keeps its fill,
// deregistered memory keeps what the application wrote after deregistering.
TEST(DeregMidMessage, RandomDeregistrationPointsNeverWriteDeadMemory) {
  const int seeds = 400;
  int errors = 0, successes = 0;
  for (int seed = 1; seed <= seeds; ++seed) {
    std::mt19937 rng(seed);
    const int kind = static_cast<int>(rng() % 5);  // 0 RC WRITE, 1 UC WRITE, 2 SEND, 3 READ local, 4 READ remote
    const QpType type = kind == 1 ? QpType::kUc : QpType::kRc;
    LinkFaults f;
    f.loss = (rng() % 3) * 0.01;
    f.reorder = (rng() % 2) * 0.02;
    f.dup = (rng() % 2) * 0.02;
    Bare t(seed, type, f);
    SimQp &a = t.p.a, &b = t.p.b;
    const uint32_t len = 1 + rng() % 16384;
    const uint32_t off = 4096 + (rng() % 64) * 8;
    // The side whose memory is deregistered, and the range that dies.
    SimQp& victim = kind == 3 ? a : b;
    ASSERT_TRUE(a.env->mrs.Deregister(a.key));
    const uint32_t a_key = t.Reg(a, 0, 4096 + 16384 + 1024, mem::kLocalWrite);
    if (kind == 3) std::memset(a.buf.data() + off, kOutside, len);
    uint32_t dead_key = 0;
    switch (kind) {
      case 0:
      case 1:
        dead_key = t.Reg(b, off, len);
        a.PostOp(queue::WqeOp::kWrite, 1, 0, len, b.Addr(off), dead_key, 0, 0, a_key);
        break;
      case 2: {
        dead_key = t.Reg(b, off, len, mem::kLocalWrite);
        const queue::RecvWqe rw{2, 1, 0};
        const queue::Sge rs{b.Addr(off), len, dead_key};
        std::memcpy(b.rq.slot(b.rq_prod), &rw, sizeof(rw));
        std::memcpy(b.rq.slot(b.rq_prod) + sizeof(rw), &rs, sizeof(rs));
        b.rq.publish_prod(++b.rq_prod);
        a.PostOp(queue::WqeOp::kSend, 1, 0, len, 0, 0, 0, 0, a_key);
        break;
      }
      case 3: {
        // The READ's sink on A is the a_key MR... replaced by its own MR.
        ASSERT_TRUE(a.env->mrs.Deregister(a_key));
        dead_key = t.Reg(a, off, len, mem::kLocalWrite);
        const uint32_t src = t.Reg(b, 0, 20480);
        a.PostOp(queue::WqeOp::kRead, 1, off, len, b.Addr(0), src, 0, 0, dead_key);
        break;
      }
      case 4: {
        dead_key = t.Reg(b, off, len);
        std::memset(b.buf.data() + off, 0x11, len);
        std::memset(a.buf.data() + off, kOutside, len);
        a.PostOp(queue::WqeOp::kRead, 1, off, len, b.Addr(off), dead_key, 0, 0, a_key);
        break;
      }
    }
    const int dereg_at = static_cast<int>(rng() % 40);
    std::vector<uint8_t> snapshot;  // the victim's buffer right after dereg
    std::vector<queue::Cqe> c(4);
    int done = 0;
    for (int step = 0; step < 200000 && done == 0; ++step) {
      if (step == dereg_at) {
        ASSERT_TRUE(victim.env->mrs.Deregister(dead_key));
        std::memset(victim.buf.data() + off, kReused, len);
        if (kind == 4) std::memset(b.buf.data() + off, 0x99, len);
        snapshot = victim.buf;
      }
      t.p.net.Step();
      if (!snapshot.empty() && kind != 4) {
        ASSERT_EQ(0, std::memcmp(snapshot.data(), victim.buf.data(), snapshot.size()))
            << "seed " << seed << " kind " << kind << ": dead memory written at step " << step;
      }
      done = a.scq_c->Poll(c.data(), 4);
    }
    ASSERT_EQ(done, 1) << "seed " << seed << " kind " << kind << " never completed";
    // Memory never registered on the writing side kept its fill.
    if (kind != 3 && kind != 4) {
      ASSERT_EQ(Changed(b, 0, off, kOutside), 0u) << "seed " << seed;
      ASSERT_EQ(Changed(b, off + len, b.buf.size() - off - len, kOutside), 0u) << "seed " << seed;
    }
    if (kind == 4) {
      for (size_t i = off; i < off + len; ++i) ASSERT_NE(a.buf[i], 0x99) << "seed " << seed;
    }
    if (c[0].status == queue::wc::kSuccess) {
      ++successes;
    } else {
      ++errors;
      const uint8_t s = c[0].status;
      EXPECT_TRUE(s == queue::wc::kRemAccessErr || s == queue::wc::kRemOpErr || s == queue::wc::kLocProtErr ||
                  s == queue::wc::kRetryExcErr)
          << "seed " << seed << " status " << int{s};
    }
    ASSERT_EQ(t.p.net.link.stats.parse_errors, 0u);
  }
  // Both outcomes happen: the sweep deregisters before, during and after.
  EXPECT_GT(errors, seeds / 10);
  EXPECT_GT(successes, seeds / 10);
}

}  // namespace
}  // namespace droce::test
