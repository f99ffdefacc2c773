// Two RC QPs over a simulated lossy link, in virtual time: every message
// arrives intact, in order, exactly once, and completes on both sides.
#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <map>
#include <random>

#include "cq/cq.h"
#include "queue/shm.h"
#include "sim_link.h"
#include "transport/qp.h"
#include "wire/frame.h"

namespace droce::test {
namespace {

using transport::Qp;
using transport::QpAttr;
using transport::QpState;

constexpr uint32_t kMaxSge = 4;
constexpr uint32_t kMaxInline = 64;

struct Endpoint {
  std::unique_ptr<SimEnv> env;
  queue::ShmRegion shm;
  queue::Ring sq, rq;
  std::unique_ptr<cq::CqRegion> scq_region, rcq_region;
  std::unique_ptr<cq::CqProducer> scq, rcq;
  std::unique_ptr<cq::CqConsumer> scq_c, rcq_c;
  std::unique_ptr<Qp> qp;
  std::vector<uint8_t> buf;
  uint32_t key = 0;
  uint32_t sq_prod = 0, rq_prod = 0;

  // With ip6, the port also has an IPv6 address (GID index 1).
  void Init(std::deque<SimFrame>* wire, uint64_t* clock, uint32_t qpn, uint32_t ip,
            uint32_t depth, uint32_t cq_depth, size_t buf_len, const wire::Ipv6Addr* ip6 = nullptr) {
    env = std::make_unique<SimEnv>(wire, clock);
    const uint32_t sstride = sizeof(queue::SendWqe) + kMaxSge * sizeof(queue::Sge);
    const uint32_t rstride = sizeof(queue::RecvWqe) + kMaxSge * sizeof(queue::Sge);
    const size_t sq_len = queue::ring_bytes(depth, sstride);
    shm = *queue::ShmRegion::Create("test-qp", sq_len + queue::ring_bytes(depth, rstride));
    sq = queue::Ring::Init(shm.data(), depth, sstride);
    rq = queue::Ring::Init(static_cast<uint8_t*>(shm.data()) + sq_len, depth, rstride);
    scq_region = *cq::CqRegion::Create(cq_depth);
    rcq_region = *cq::CqRegion::Create(cq_depth);
    scq = std::make_unique<cq::CqProducer>(scq_region.get(), nullptr, 1);
    rcq = std::make_unique<cq::CqProducer>(rcq_region.get(), nullptr, 2);
    scq_c = std::make_unique<cq::CqConsumer>(scq_region.get());
    rcq_c = std::make_unique<cq::CqConsumer>(rcq_region.get());
    transport::QpInit init;
    init.qpn = qpn;
    init.pd = 1;
    init.caps = {depth, depth, kMaxSge, kMaxSge, kMaxInline};
    init.sq = sq;
    init.rq = rq;
    init.send_cq = scq.get();
    init.recv_cq = rcq.get();
    init.port.mac = {2, 0, 0, 0, 0, static_cast<uint8_t>(qpn)};
    init.port.ip = ip;
    init.port.max_mtu = 5;
    if (ip6 != nullptr) {
      init.port.has_ip6 = true;
      init.port.ip6 = *ip6;
    }
    qp = std::make_unique<Qp>(init, env.get());
    buf.assign(buf_len, 0);
    auto mr = env->mrs.Register(1, reinterpret_cast<uint64_t>(buf.data()),
                                reinterpret_cast<uint64_t>(buf.data()), buf.size(), 15);
    key = mr->key;
  }

  // To the peer's IPv4 address, or with peer_ip6 to its IPv6 address (GID
  // index 1, with a traffic class, flow label and hop limit to check).
  void Connect(uint32_t peer_qpn, uint32_t peer_ip, uint8_t mtu, const wire::Ipv6Addr* peer_ip6 = nullptr) {
    QpAttr a;
    a.state = QpState::kInit;
    a.access_flags = 14;  // remote write, read, atomic
    ASSERT_EQ(0, qp->Modify(a, transport::kAttrState | transport::kAttrPkeyIndex |
                                   transport::kAttrPort | transport::kAttrAccessFlags));
    a.state = QpState::kRtr;
    a.av.is_global = true;
    a.av.dgid[10] = a.av.dgid[11] = 0xFF;
    a.av.dgid[12] = static_cast<uint8_t>(peer_ip >> 24);
    a.av.dgid[13] = static_cast<uint8_t>(peer_ip >> 16);
    a.av.dgid[14] = static_cast<uint8_t>(peer_ip >> 8);
    a.av.dgid[15] = static_cast<uint8_t>(peer_ip);
    if (peer_ip6 != nullptr) {
      std::memcpy(a.av.dgid, peer_ip6->data(), 16);
      a.av.sgid_index = transport::kGidIndexIpv6;
      a.av.traffic_class = 0x68;
      a.av.flow_label = 0xABCDE;
      a.av.hop_limit = 9;
    }
    a.path_mtu = mtu;
    a.dest_qpn = peer_qpn;
    a.rq_psn = 0xFFFFF0;  // wraps during the test
    a.min_rnr_timer = 1;
    ASSERT_EQ(0, qp->Modify(a, transport::kAttrState | transport::kAttrAv | transport::kAttrPathMtu |
                                   transport::kAttrDestQpn | transport::kAttrRqPsn |
                                   transport::kAttrMaxDestRdAtomic | transport::kAttrMinRnrTimer));
    a.state = QpState::kRts;
    a.sq_psn = 0xFFFFF0;
    a.timeout = 10;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 4;
    ASSERT_EQ(0, qp->Modify(a, transport::kAttrState | transport::kAttrSqPsn | transport::kAttrTimeout |
                                   transport::kAttrRetryCnt | transport::kAttrRnrRetry |
                                   transport::kAttrMaxQpRdAtomic));
  }

  void PostRecv(uint64_t wr_id, uint32_t off, uint32_t len) {
    uint8_t* slot = rq.slot(rq_prod);
    queue::RecvWqe w{wr_id, 1, 0};
    queue::Sge s{reinterpret_cast<uint64_t>(buf.data()) + off, len, key};
    std::memcpy(slot, &w, sizeof(w));
    std::memcpy(slot + sizeof(w), &s, sizeof(s));
    rq.publish_prod(++rq_prod);
  }
  void PostOp(queue::WqeOp op, uint64_t wr_id, uint32_t off, uint32_t len, uint64_t raddr, uint32_t rkey,
              uint64_t cmp = 0, uint64_t swp = 0) {
    uint8_t* slot = sq.slot(sq_prod);
    queue::SendWqe w{};
    w.wr_id = wr_id;
    w.op = op;
    w.flags = queue::kWqeSignaled;
    w.num_sge = 1;
    w.remote_addr = raddr;
    w.rkey = rkey;
    w.compare_add = cmp;
    w.swap = swp;
    queue::Sge s{reinterpret_cast<uint64_t>(buf.data()) + off, len, key};
    std::memcpy(slot, &w, sizeof(w));
    std::memcpy(slot + sizeof(w), &s, sizeof(s));
    sq.publish_prod(++sq_prod);
  }
  void PostSend(uint64_t wr_id, uint32_t off, uint32_t len, uint32_t lkey_override = 0) {
    uint8_t* slot = sq.slot(sq_prod);
    queue::SendWqe w{};
    w.wr_id = wr_id;
    w.op = queue::WqeOp::kSend;
    w.flags = queue::kWqeSignaled;
    w.num_sge = 1;
    queue::Sge s{reinterpret_cast<uint64_t>(buf.data()) + off, len, lkey_override ? lkey_override : key};
    std::memcpy(slot, &w, sizeof(w));
    std::memcpy(slot + sizeof(w), &s, sizeof(s));
    sq.publish_prod(++sq_prod);
  }
};

// The link: every frame may be lost, duplicated, corrupted (one byte
// flipped: the ICRC must catch it) or delayed by a random jitter, which also
// reorders frames. Time is virtual; a seed makes a run reproducible.
struct LinkFaults {
  double loss = 0, dup = 0, corrupt = 0, reorder = 0;
};

class SimNet {
 public:
  SimNet(double loss, double dup, uint32_t seed) : rng_(seed) {
    faults_.loss = loss;
    faults_.dup = dup;
  }
  SimNet(LinkFaults f, uint32_t seed) : faults_(f), rng_(seed) {}
  std::deque<SimFrame> wire;
  uint64_t clock = 1'000'000;
  uint64_t corrupted_caught = 0;

  // Runs until `done` or the virtual-time limit; returns false on timeout.
  template <typename Done>
  bool Run(Endpoint& a, Endpoint& b, Done done, uint64_t limit_ns = 60'000'000'000ull) {
    std::uniform_real_distribution<double> u(0, 1);
    while (!done()) {
      if (clock > limit_ns) return false;
      a.qp->PollSend(16);
      b.qp->PollSend(16);
      // Frames just sent enter the link with a delivery time.
      while (!wire.empty()) {
        SimFrame f = std::move(wire.front());
        wire.pop_front();
        if (u(rng_) < faults_.loss) continue;
        const uint64_t jitter = u(rng_) < faults_.reorder ? 1000 + rng_() % 20000 : 0;
        if (u(rng_) < faults_.dup) in_flight_.emplace(clock + 1000 + rng_() % 5000, f);
        in_flight_.emplace(clock + 1000 + jitter, std::move(f));
      }
      bool moved = false;
      while (!in_flight_.empty() && in_flight_.begin()->first <= clock) {
        SimFrame f = std::move(in_flight_.begin()->second);
        in_flight_.erase(in_flight_.begin());
        moved = true;
        const bool corrupt = u(rng_) < faults_.corrupt;
        if (corrupt) f.bytes[14 + rng_() % (f.bytes.size() - 14)] ^= static_cast<uint8_t>(1 + rng_() % 255);
        wire::PacketView v;
        const wire::ParseError e = wire::parse_frame(f.bytes, &v);
        if (corrupt) {
          if (e != wire::ParseError::kOk) {
            ++corrupted_caught;
            continue;
          }
        } else {
          EXPECT_EQ(e, wire::ParseError::kOk) << wire::parse_error_name(e);
          if (e != wire::ParseError::kOk) continue;
        }
        if (v.bth.dqpn != a.qp->qpn() && v.bth.dqpn != b.qp->qpn()) continue;  // a corrupted QPN
        Endpoint& dst = v.bth.dqpn == a.qp->qpn() ? a : b;
        dst.qp->OnPacket(v);
      }
      clock += (moved || !in_flight_.empty()) ? 1000 : 100'000;
      a.qp->OnTimer(clock);
      b.qp->OnTimer(clock);
    }
    return true;
  }

 private:
  LinkFaults faults_;
  std::mt19937 rng_;
  std::multimap<uint64_t, SimFrame> in_flight_;
};

void TransferWith(LinkFaults faults, uint8_t mtu, uint32_t msg_len, int nmsgs, uint32_t seed);
void Transfer(double loss, double dup, uint8_t mtu, uint32_t msg_len, int nmsgs, uint32_t seed) {
  LinkFaults f;
  f.loss = loss;
  f.dup = dup;
  TransferWith(f, mtu, msg_len, nmsgs, seed);
}

void TransferWith(LinkFaults faults, uint8_t mtu, uint32_t msg_len, int nmsgs, uint32_t seed) {
  const double loss = faults.loss, dup = faults.dup;
  SimNet net(faults, seed);
  Endpoint a, b;
  const uint32_t ipa = 0x0A000001, ipb = 0x0A000002;
  a.Init(&net.wire, &net.clock, 0x11, ipa, 64, 256, size_t{msg_len} * 2);
  b.Init(&net.wire, &net.clock, 0x22, ipb, 64, 256, size_t{msg_len} * 2);
  a.Connect(0x22, ipb, mtu);
  b.Connect(0x11, ipa, mtu);
  std::mt19937 rng(seed);
  int sent = 0, received = 0, send_done = 0;
  std::vector<queue::Cqe> cqes(64);
  for (int m = 0; m < nmsgs; ++m) {
    for (uint32_t i = 0; i < msg_len; ++i) a.buf[i] = static_cast<uint8_t>(rng());
    std::memset(b.buf.data(), 0, msg_len);
    b.PostRecv(1000 + m, 0, msg_len);
    a.PostSend(m, 0, msg_len);
    ++sent;
    bool ok = net.Run(a, b, [&] {
      int n = a.scq_c->Poll(cqes.data(), 64);
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(cqes[i].status, queue::wc::kSuccess);
        EXPECT_EQ(cqes[i].wr_id, static_cast<uint64_t>(m));
        ++send_done;
      }
      n = b.rcq_c->Poll(cqes.data(), 64);
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(cqes[i].status, queue::wc::kSuccess);
        EXPECT_EQ(cqes[i].byte_len, msg_len);
        EXPECT_EQ(cqes[i].wr_id, static_cast<uint64_t>(1000 + m));
        ++received;
      }
      return send_done == sent && received == sent;
    });
    ASSERT_TRUE(ok) << "message " << m << " never completed";
    ASSERT_EQ(0, std::memcmp(a.buf.data(), b.buf.data(), msg_len)) << "message " << m;
  }
  EXPECT_EQ(a.qp->state(), QpState::kRts);
  EXPECT_EQ(b.qp->state(), QpState::kRts);
  if (loss == 0 && dup == 0) {
    EXPECT_EQ(a.env->stats.completer_retry_err, 0u);
    EXPECT_EQ(b.env->stats.duplicate_request, 0u);
  }
}

// RC over IPv6 GIDs: frames are IPv6 between the ports' IPv6 addresses with
// the address vector's traffic class, flow label and hop limit (ACKs and
// READ responses too), and SENDs and READs survive loss.
TEST(TransportSim, RcOverIpv6Gids) {
  SimNet net(LinkFaults{0.05, 0, 0, 0}, 11);
  const wire::Ipv6Addr ip6a = {0xfd, 0x78, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x11};
  const wire::Ipv6Addr ip6b = {0xfd, 0x78, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12};
  const uint32_t len = 5000;
  Endpoint a, b;
  a.Init(&net.wire, &net.clock, 0x11, 0x0A000001, 64, 256, len * 2, &ip6a);
  b.Init(&net.wire, &net.clock, 0x22, 0x0A000002, 64, 256, len * 2, &ip6b);
  a.Connect(0x22, 0x0A000002, 3, &ip6b);
  b.Connect(0x11, 0x0A000001, 3, &ip6a);
  auto expect_v6 = [&](const SimFrame& f, const wire::Ipv6Addr& src, const wire::Ipv6Addr& dst) {
    wire::PacketView v;
    ASSERT_EQ(wire::parse_frame(f.bytes, &v), wire::ParseError::kOk);
    EXPECT_TRUE(v.ipv6);
    EXPECT_EQ(v.sip6, src);
    EXPECT_EQ(v.dip6, dst);
    EXPECT_EQ(v.traffic_class, 0x68);
    EXPECT_EQ(v.flow_label, 0xABCDEu);
    EXPECT_EQ(v.hop_limit, 9);
  };
  std::mt19937 rng(11);
  std::vector<queue::Cqe> c(64);
  for (int m = 0; m < 20; ++m) {
    for (uint32_t i = 0; i < len; ++i) a.buf[i] = static_cast<uint8_t>(rng());
    b.PostRecv(m, 0, len);
    a.PostSend(m, 0, len);
    if (m == 0) {
      // The first request and the responder's ACK, before the lossy link.
      a.qp->PollSend(16);
      ASSERT_FALSE(net.wire.empty());
      expect_v6(net.wire.front(), ip6a, ip6b);
      std::deque<SimFrame> sent;
      sent.swap(net.wire);
      for (const SimFrame& f : sent) {
        wire::PacketView v;
        ASSERT_EQ(wire::parse_frame(f.bytes, &v), wire::ParseError::kOk);
        b.qp->OnPacket(v);
      }
      b.qp->PollSend(16);
      ASSERT_FALSE(net.wire.empty());
      expect_v6(net.wire.back(), ip6b, ip6a);
    }
    int done = 0;
    ASSERT_TRUE(net.Run(a, b, [&] {
      for (int i = a.scq_c->Poll(c.data(), 64); i > 0; --i, ++done) EXPECT_EQ(c[i - 1].status, queue::wc::kSuccess);
      for (int i = b.rcq_c->Poll(c.data(), 64); i > 0; --i, ++done) EXPECT_EQ(c[i - 1].byte_len, len);
      return done == 2;
    })) << "message " << m;
    ASSERT_EQ(0, std::memcmp(a.buf.data(), b.buf.data(), len)) << "message " << m;
  }
  // A READ back from b's buffer: responses travel over IPv6 too.
  std::memset(a.buf.data() + len, 0, len);
  a.PostOp(queue::WqeOp::kRead, 99, len, len, reinterpret_cast<uint64_t>(b.buf.data()), b.key);
  ASSERT_TRUE(net.Run(a, b, [&] { return a.scq_c->Poll(c.data(), 64) == 1; }));
  EXPECT_EQ(c[0].status, queue::wc::kSuccess);
  EXPECT_EQ(0, std::memcmp(a.buf.data() + len, b.buf.data(), len));
}

TEST(TransportSim, LosslessSmallMessages) { Transfer(0, 0, 3, 1, 200, 1); }
TEST(TransportSim, LosslessSegmented) { Transfer(0, 0, 3, 4096 * 3 + 5, 50, 2); }
TEST(TransportSim, LossyRetransmits) { Transfer(0.05, 0, 1, 5000, 100, 3); }
TEST(TransportSim, DuplicatesAreNotExecutedTwice) { Transfer(0, 0.1, 3, 3000, 100, 4); }
TEST(TransportSim, LossAndDuplicates4096Mtu) { Transfer(0.03, 0.03, 5, 20000, 50, 5); }

std::string Dump(const Counters& c) {
  std::string out;
  for (const auto& i : kCounterInfo) {
    if (c.*(i.field) != 0) out += std::string(i.name) + "=" + std::to_string(c.*(i.field)) + " ";
  }
  return out;
}

// RDMA WRITE, READ and atomics under loss and duplication: data lands
// exactly, READs that lose responses are reissued for the missing part, and a
// duplicated atomic is never executed twice.
void RdmaOps(double loss, double dup, uint8_t mtu, uint32_t len, int rounds, uint32_t seed,
             double reorder = 0, double corrupt = 0) {
  LinkFaults faults;
  faults.loss = loss;
  faults.dup = dup;
  faults.reorder = reorder;
  faults.corrupt = corrupt;
  SimNet net(faults, seed);
  Endpoint a, b;
  a.Init(&net.wire, &net.clock, 0x11, 0x0A000001, 64, 256, size_t{len} * 3 + 72);
  b.Init(&net.wire, &net.clock, 0x22, 0x0A000002, 64, 256, size_t{len} * 3 + 72);
  a.Connect(0x22, 0x0A000002, mtu);
  b.Connect(0x11, 0x0A000001, mtu);
  std::mt19937 rng(seed);
  const uint64_t rbase = reinterpret_cast<uint64_t>(b.buf.data());
  const size_t word_off = (size_t{len} * 3 + 7) & ~size_t{7};  // atomics need 8-byte alignment
  uint64_t expect_word = 0;
  std::memcpy(b.buf.data() + word_off, &expect_word, 8);
  std::vector<queue::Cqe> c(64);
  for (int r = 0; r < rounds; ++r) {
    for (uint32_t i = 0; i < len; ++i) a.buf[i] = static_cast<uint8_t>(rng());
    a.PostOp(queue::WqeOp::kWrite, 1, 0, len, rbase, b.key);
    a.PostOp(queue::WqeOp::kRead, 2, len, len, rbase, b.key);
    a.PostOp(queue::WqeOp::kFetchAdd, 3, 2 * len, 8, rbase + word_off, b.key, 3);
    int done = 0;
    ASSERT_TRUE(net.Run(a, b, [&] {
      int n = a.scq_c->Poll(c.data(), 64);
      for (int i = 0; i < n; ++i) EXPECT_EQ(c[i].status, queue::wc::kSuccess) << "round " << r << " wr " << c[i].wr_id << " " << Dump(a.env->stats) << " / " << Dump(b.env->stats);
      done += n;
      return done == 3;
    })) << "round " << r << " done " << done << " a: " << transport::qp_state_name(a.qp->state())
        << " b: " << transport::qp_state_name(b.qp->state()) << "\n" << Dump(a.env->stats) << "\n"
        << Dump(b.env->stats);
    ASSERT_EQ(0, std::memcmp(a.buf.data(), b.buf.data(), len)) << "WRITE, round " << r;
    ASSERT_EQ(0, std::memcmp(a.buf.data(), a.buf.data() + len, len)) << "READ, round " << r;
    uint64_t orig = 0;
    std::memcpy(&orig, a.buf.data() + 2 * len, 8);
    EXPECT_EQ(orig, expect_word) << "round " << r;
    expect_word += 3;
  }
  uint64_t word = 0;
  std::memcpy(&word, b.buf.data() + word_off, 8);
  EXPECT_EQ(word, expect_word);  // each FETCH_ADD executed exactly once
}

TEST(TransportSim, RdmaLossless) { RdmaOps(0, 0, 3, 10000, 20, 21); }
TEST(TransportSim, RdmaUnderLoss) { RdmaOps(0.05, 0, 1, 20000, 30, 22); }
TEST(TransportSim, RdmaUnderDuplication) { RdmaOps(0, 0.1, 3, 9000, 30, 23); }
TEST(TransportSim, RdmaUnderLossAndDuplication) { RdmaOps(0.03, 0.05, 5, 50000, 20, 24); }

// Many seeds, every MTU: the combinations single seeds miss.
TEST(TransportSim, RdmaManySeeds) {
  for (uint32_t seed = 100; seed < 300; ++seed) {
    SCOPED_TRACE(seed);
    RdmaOps(0.02 + (seed % 5) * 0.01, (seed % 3) * 0.04, static_cast<uint8_t>(1 + seed % 5),
            1000 + (seed * 7919) % 30000, 6, seed, /*reorder=*/(seed % 2) * 0.05, /*corrupt=*/0.01);
    if (HasFatalFailure()) return;
  }
}

TEST(TransportSim, SendManySeeds) {
  for (uint32_t seed = 1000; seed < 1200; ++seed) {
    SCOPED_TRACE(seed);
    Transfer(0.02 + (seed % 4) * 0.01, (seed % 3) * 0.04, static_cast<uint8_t>(1 + seed % 5),
             1 + (seed * 7919) % 20000, 10, seed);
    if (HasFatalFailure()) return;
  }
}

// Everything at once: 1% and 10% loss with reordering, duplication and
// corruption; every byte and completion checked. A failing seed is in the
// trace so it can be replayed.
TEST(TransportSim, HostileLinkManySeeds) {
  for (double loss : {0.0, 0.01, 0.10}) {
    for (uint32_t seed = 3000; seed < 3040; ++seed) {
      SCOPED_TRACE(testing::Message() << "loss " << loss << " seed " << seed);
      LinkFaults f;
      f.loss = loss;
      f.dup = 0.02;
      f.reorder = 0.05;
      f.corrupt = 0.01;
      TransferWith(f, static_cast<uint8_t>(1 + seed % 5), 1 + (seed * 7919) % 12000, 12, seed);
      if (HasFatalFailure()) return;
    }
  }
}

// A destination that never resolves: the WQE fails with RETRY_EXC_ERR after
// what its retries would have taken, instead of waiting forever.
TEST(TransportSim, UnresolvableNeighborEndsInRetryExceeded) {
  SimNet net(0, 0, 12);
  Endpoint a, b;
  a.Init(&net.wire, &net.clock, 0x11, 0x0A000001, 16, 64, 4096);
  b.Init(&net.wire, &net.clock, 0x22, 0x0A000002, 16, 64, 4096);
  a.Connect(0x22, 0x0A000002, 3);
  b.Connect(0x11, 0x0A000001, 3);
  a.env->resolvable = false;
  a.PostSend(1, 0, 100);
  a.PostSend(2, 0, 100);
  std::vector<queue::Cqe> c(8);
  int n = 0;
  ASSERT_TRUE(net.Run(a, b, [&] {
    n += a.scq_c->Poll(c.data() + n, 8 - n);
    return n == 2;
  }));
  EXPECT_EQ(c[0].wr_id, 1u);
  EXPECT_EQ(c[0].status, queue::wc::kRetryExcErr);
  EXPECT_EQ(c[1].status, queue::wc::kWrFlushErr);
  EXPECT_EQ(a.qp->state(), QpState::kErr);
}

TEST(TransportSim, RnrNakThenRetry) {
  SimNet net(0, 0, 9);
  Endpoint a, b;
  a.Init(&net.wire, &net.clock, 0x11, 0x0A000001, 16, 64, 4096);
  b.Init(&net.wire, &net.clock, 0x22, 0x0A000002, 16, 64, 4096);
  a.Connect(0x22, 0x0A000002, 3);
  b.Connect(0x11, 0x0A000001, 3);
  a.PostSend(7, 0, 100);
  std::vector<queue::Cqe> c(8);
  // No receive posted: the responder RNR-NAKs until one appears.
  net.Run(a, b, [&] { return b.env->stats.send_rnr_err >= 3; });
  b.PostRecv(70, 0, 100);
  ASSERT_TRUE(net.Run(a, b, [&] { return a.scq_c->Poll(c.data(), 8) == 1; }));
  EXPECT_EQ(c[0].status, queue::wc::kSuccess);
  ASSERT_EQ(b.rcq_c->Poll(c.data(), 8), 1);
  EXPECT_EQ(c[0].wr_id, 70u);
}

TEST(TransportSim, BadLkeyCompletesWithProtectionErrorAndFlushes) {
  SimNet net(0, 0, 10);
  Endpoint a, b;
  a.Init(&net.wire, &net.clock, 0x11, 0x0A000001, 16, 64, 4096);
  b.Init(&net.wire, &net.clock, 0x22, 0x0A000002, 16, 64, 4096);
  a.Connect(0x22, 0x0A000002, 3);
  b.Connect(0x11, 0x0A000001, 3);
  a.PostSend(1, 0, 100, /*lkey_override=*/0xBAD00);
  a.PostSend(2, 0, 100);
  std::vector<queue::Cqe> c(8);
  int n = 0;
  ASSERT_TRUE(net.Run(a, b, [&] {
    n += a.scq_c->Poll(c.data() + n, 8 - n);
    return n == 2;
  }));
  EXPECT_EQ(c[0].wr_id, 1u);
  EXPECT_EQ(c[0].status, queue::wc::kLocProtErr);
  EXPECT_EQ(c[1].wr_id, 2u);
  EXPECT_EQ(c[1].status, queue::wc::kWrFlushErr);
  EXPECT_EQ(a.qp->state(), QpState::kErr);
}

TEST(TransportSim, RecvTooSmallIsLocalLengthErrorAndRemoteInvalidRequest) {
  SimNet net(0, 0, 11);
  Endpoint a, b;
  a.Init(&net.wire, &net.clock, 0x11, 0x0A000001, 16, 64, 4096);
  b.Init(&net.wire, &net.clock, 0x22, 0x0A000002, 16, 64, 4096);
  a.Connect(0x22, 0x0A000002, 3);
  b.Connect(0x11, 0x0A000001, 3);
  b.PostRecv(5, 0, 10);
  a.PostSend(6, 0, 100);
  std::vector<queue::Cqe> c(8);
  ASSERT_TRUE(net.Run(a, b, [&] { return a.scq_c->Poll(c.data(), 8) == 1; }));
  EXPECT_EQ(c[0].status, queue::wc::kRemInvReqErr);
  ASSERT_EQ(b.rcq_c->Poll(c.data(), 8), 1);
  EXPECT_EQ(c[0].status, queue::wc::kLocLenErr);
}

TEST(QpStateMachine, RejectsMissingAndExtraAttributes) {
  std::deque<SimFrame> wire;
  uint64_t clock = 0;
  Endpoint a;
  a.Init(&wire, &clock, 0x11, 1, 16, 16, 64);
  QpAttr attr;
  attr.state = QpState::kInit;
  // RESET→INIT for RC needs PKEY_INDEX, PORT and ACCESS_FLAGS.
  EXPECT_EQ(EINVAL, a.qp->Modify(attr, transport::kAttrState | transport::kAttrPort));
  // QKEY is not an RC attribute.
  EXPECT_EQ(EINVAL, a.qp->Modify(attr, transport::kAttrState | transport::kAttrPkeyIndex |
                                           transport::kAttrPort | transport::kAttrAccessFlags |
                                           transport::kAttrQkey));
  EXPECT_EQ(QpState::kReset, a.qp->state());
  // RESET→RTR skips INIT.
  attr.state = QpState::kRtr;
  EXPECT_EQ(EINVAL, a.qp->Modify(attr, transport::kAttrState));
  attr.state = QpState::kErr;
  EXPECT_EQ(0, a.qp->Modify(attr, transport::kAttrState));
  EXPECT_EQ(QpState::kErr, a.qp->state());
}

}  // namespace
}  // namespace droce::test
