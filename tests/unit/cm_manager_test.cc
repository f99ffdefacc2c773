// The connection manager in virtual time: two managers (two hosts) whose
// MADs cross a simulated wire that can lose or duplicate them, driven by a
// virtual clock. Covers the connect/accept/RTU handshake and the QP
// attributes both sides get, disconnect and timewait, rejects, the REQ
// retries and what a vanished peer leads to, duplicates, stale connections,
// SIDR, a REQ flood and malformed MADs, and requests that come before
// their listener.
#include <gtest/gtest.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <infiniband/verbs.h>

#include "cm/manager.h"

namespace droce::cm {
namespace {

constexpr uint64_t kSec = 1'000'000'000;

struct Host;

struct Wire {
  uint64_t now = kSec;  // a monotonic clock is never 0
  struct Frame {
    Host* to;
    MadSource src;
    std::array<uint8_t, kMadSize> mad;
  };
  std::deque<Frame> inflight;
  // Decides each MAD's fate: true drops it.
  std::function<bool(const std::array<uint8_t, kMadSize>&)> drop = [](const auto&) { return false; };
  Host* a = nullptr;
  Host* b = nullptr;
  void Run();
  // Advances time by `ns` in 1 ms steps, delivering MADs and timers.
  void Advance(uint64_t ns);
};

uint16_t attr_of_bytes(const std::array<uint8_t, kMadSize>& m) { return static_cast<uint16_t>(m[16] << 8 | m[17]); }

struct Host : PortIo {
  Wire* wire;
  Gid gid;
  std::vector<Event> events;
  Manager mgr;
  Host* peer = nullptr;
  int sent = 0;

  Host(Wire* w, uint8_t last, uint64_t guid)
      : wire(w), gid(ipv4_gid(0x0A4E0000u | last)), mgr([this](const Event& e) { events.push_back(e); },
                                                         [w] { return w->now; }, last) {
    LocalPort p;
    p.dev = 0;
    p.node_guid = guid;
    p.ip4 = 0x0A4E0000u | last;
    p.prefix_len = 24;
    p.active_mtu = IBV_MTU_1024;
    mgr.AddPort(p, this);
  }
  void SendMad(const Gid& sgid, const Gid& dgid, uint32_t dqpn, uint8_t tclass,
               std::span<const uint8_t, kMadSize> mad) override {
    ++sent;
    EXPECT_EQ(sgid, gid);
    EXPECT_EQ(dgid, peer->gid);
    EXPECT_EQ(dqpn, kGsiQpn);
    Wire::Frame f{peer, {}, {}};
    f.src.sgid = sgid;
    f.src.dgid = dgid;
    f.src.src_qpn = kGsiQpn;
    f.src.tclass = tclass;
    std::copy(mad.begin(), mad.end(), f.mad.begin());
    if (!wire->drop(f.mad)) wire->inflight.push_back(f);
  }
  int Resolve(const Gid&) override { return 1; }

  // The last event of a type, or nullptr.
  const Event* Last(uint32_t type) const {
    for (auto it = events.rbegin(); it != events.rend(); ++it) {
      if (it->event == type) return &*it;
    }
    return nullptr;
  }
  IpAddr Addr(uint16_t port) const {
    IpAddr a;
    a.ip = gid;
    a.port = port;
    return a;
  }
};

void Wire::Run() {
  while (!inflight.empty()) {
    Frame f = inflight.front();
    inflight.pop_front();
    f.to->mgr.OnMad(0, f.src, f.mad);
  }
  a->mgr.OnTimer();
  b->mgr.OnTimer();
  while (!inflight.empty()) Run();
}

void Wire::Advance(uint64_t ns) {
  for (uint64_t t = 0; t < ns; t += 1'000'000) {
    now += 1'000'000;
    Run();
  }
}

class CmManager : public ::testing::Test {
 protected:
  CmManager() : a(&wire, 1, 0xA), b(&wire, 2, 0xB) {
    a.peer = &b;
    b.peer = &a;
    wire.a = &a;
    wire.b = &b;
  }

  uint32_t Listen(uint16_t port, uint16_t ps = kRdmaPsTcp, uint8_t qp = kQpRc) {
    uint32_t l;
    EXPECT_EQ(b.mgr.CreateId(ps, qp, &l), 0);
    IpAddr any;
    any.port = port;
    EXPECT_EQ(b.mgr.Bind(l, any), 0);
    EXPECT_EQ(b.mgr.Listen(l, 16), 0);
    return l;
  }

  // A's id, with its address and route resolved to B:port.
  uint32_t Resolved(uint16_t port, uint16_t ps = kRdmaPsTcp, uint8_t qp = kQpRc) {
    uint32_t id;
    EXPECT_EQ(a.mgr.CreateId(ps, qp, &id), 0);
    EXPECT_EQ(a.mgr.ResolveAddr(id, nullptr, b.Addr(port), 2000), 0);
    wire.Run();
    EXPECT_NE(a.Last(kAddrResolved), nullptr);
    EXPECT_EQ(a.mgr.ResolveRoute(id, 2000), 0);
    EXPECT_NE(a.Last(kRouteResolved), nullptr);
    return id;
  }

  ConnParam Param(uint32_t qpn) {
    ConnParam p;
    p.qp_num = qpn;
    p.responder_resources = 4;
    p.initiator_depth = 2;
    p.retry_count = 7;
    p.rnr_retry_count = 6;
    p.private_data_len = 3;
    p.private_data[0] = 'a';
    p.private_data[1] = 'b';
    p.private_data[2] = 'c';
    p.valid = true;
    return p;
  }

  // Connects A (QPN 0x20) to a listener on B (QPN 0x30); returns both ids.
  std::pair<uint32_t, uint32_t> Establish() {
    Listen(7174);
    const uint32_t ia = Resolved(7174);
    EXPECT_EQ(a.mgr.Connect(ia, Param(0x20)), 0);
    wire.Run();
    const Event* req = b.Last(kConnectRequest);
    EXPECT_NE(req, nullptr);
    const uint32_t ib = req->id;
    ConnParam acc = Param(0x30);
    acc.responder_resources = req->param.responder_resources;
    acc.initiator_depth = req->param.initiator_depth;
    EXPECT_EQ(b.mgr.Accept(ib, &acc), 0);
    wire.Run();
    EXPECT_NE(a.Last(kConnectResponse), nullptr);
    EXPECT_EQ(a.mgr.Accept(ia, nullptr), 0);  // librdmacm's accept after CONNECT_RESPONSE: RTU
    wire.Run();
    EXPECT_NE(b.Last(kEstablished), nullptr);
    return {ia, ib};
  }

  Wire wire;
  Host a, b;
};

TEST_F(CmManager, HandshakeGivesBothSidesMatchingQpAttributes) {
  auto [ia, ib] = Establish();
  const Event* req = b.Last(kConnectRequest);
  // The passive side sees the request in its own terms.
  EXPECT_EQ(req->param.qp_num, 0x20u);
  EXPECT_EQ(req->param.responder_resources, 2);  // A's initiator depth
  EXPECT_EQ(req->param.initiator_depth, 4);      // A's responder resources
  EXPECT_EQ(req->param.private_data_len, 56);    // 92 - the 36-byte IP CM header
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(req->param.private_data), 3), "abc");
  EXPECT_EQ(req->param.retry_count, 7);
  EXPECT_EQ(req->param.rnr_retry_count, 6);
  const Event* resp = a.Last(kConnectResponse);
  EXPECT_EQ(resp->param.qp_num, 0x30u);
  EXPECT_EQ(resp->param.private_data_len, 196);

  QpAttr a_rtr, a_rts, b_rtr, b_rts, a_init;
  ASSERT_EQ(a.mgr.InitQpAttr(ia, IBV_QPS_INIT, &a_init), 0);
  EXPECT_EQ(a_init.access, unsigned(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC));
  ASSERT_EQ(a.mgr.InitQpAttr(ia, IBV_QPS_RTR, &a_rtr), 0);
  ASSERT_EQ(a.mgr.InitQpAttr(ia, IBV_QPS_RTS, &a_rts), 0);
  ASSERT_EQ(b.mgr.InitQpAttr(ib, IBV_QPS_RTR, &b_rtr), 0);
  ASSERT_EQ(b.mgr.InitQpAttr(ib, IBV_QPS_RTS, &b_rts), 0);
  EXPECT_EQ(a_rtr.dest_qp_num, 0x30u);
  EXPECT_EQ(b_rtr.dest_qp_num, 0x20u);
  EXPECT_EQ(a_rtr.rq_psn, b_rts.sq_psn);  // the PSNs each REQ/REP carried
  EXPECT_EQ(b_rtr.rq_psn, a_rts.sq_psn);
  EXPECT_LE(a_rts.sq_psn, 0xFFFFFFu);
  EXPECT_EQ(a_rtr.ah.dgid, b.gid);
  EXPECT_EQ(b_rtr.ah.dgid, a.gid);
  EXPECT_EQ(a_rtr.path_mtu, unsigned(IBV_MTU_1024));
  EXPECT_EQ(a_rts.timeout, 17);  // rdma_cm's RoCE rule: packet life 16, CA ACK delay 15
  EXPECT_EQ(b_rts.timeout, 17);
  EXPECT_EQ(a_rts.retry_cnt, 7);
  EXPECT_EQ(b_rts.retry_cnt, 7);
  EXPECT_EQ(a_rts.rnr_retry, 6);   // B's REP carried rnr 6
  EXPECT_EQ(b_rts.rnr_retry, 6);   // A's REQ carried rnr 6
  // Responder resources of one side serve the other's initiator depth.
  EXPECT_EQ(a_rts.max_rd_atomic, b_rtr.max_dest_rd_atomic);
  EXPECT_EQ(b_rts.max_rd_atomic, a_rtr.max_dest_rd_atomic);
  const uint32_t rc_rtr = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                          IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  EXPECT_EQ(a_rtr.mask, rc_rtr);
}

// The Starting PSN of a REQ or REP is the PSN the sender's own QP receives
// at (Linux cm.c: ib_send_cm_req/rep keep it as rq_psn, the handlers of the
// peer take it as sq_psn). Symmetry alone cannot catch the opposite reading:
// two droce ends that share it agree with each other and with no one else.
TEST_F(CmManager, StartingPsnIsTheSendersReceivePsn) {
  std::vector<Mad> seen;
  wire.drop = [&](const std::array<uint8_t, kMadSize>& m) {
    Mad d;
    if (decode(m, &d) == MadError::kOk) seen.push_back(d);
    return false;
  };
  auto [ia, ib] = Establish();
  const Req* req = nullptr;
  const Rep* rep = nullptr;
  for (const Mad& m : seen) {
    if (const auto* r = std::get_if<Req>(&m.msg)) req = r;
    if (const auto* r = std::get_if<Rep>(&m.msg)) rep = r;
  }
  ASSERT_NE(req, nullptr);
  ASSERT_NE(rep, nullptr);
  QpAttr a_rtr, a_rts, b_rtr, b_rts;
  ASSERT_EQ(a.mgr.InitQpAttr(ia, IBV_QPS_RTR, &a_rtr), 0);
  ASSERT_EQ(a.mgr.InitQpAttr(ia, IBV_QPS_RTS, &a_rts), 0);
  ASSERT_EQ(b.mgr.InitQpAttr(ib, IBV_QPS_RTR, &b_rtr), 0);
  ASSERT_EQ(b.mgr.InitQpAttr(ib, IBV_QPS_RTS, &b_rts), 0);
  EXPECT_EQ(a_rtr.rq_psn, req->starting_psn);  // the active side receives at its REQ's PSN
  EXPECT_EQ(b_rts.sq_psn, req->starting_psn);  // and the passive side sends with it
  EXPECT_EQ(b_rtr.rq_psn, rep->starting_psn);  // the passive side receives at its REP's PSN
  EXPECT_EQ(a_rts.sq_psn, rep->starting_psn);
  EXPECT_NE(req->starting_psn, rep->starting_psn);  // random 24-bit PSNs; a tie would hide a swap
}

TEST_F(CmManager, DisconnectThenTimewaitExit) {
  auto [ia, ib] = Establish();
  ASSERT_EQ(a.mgr.Disconnect(ia), 0);
  wire.Run();
  EXPECT_NE(b.Last(kDisconnected), nullptr);
  EXPECT_NE(a.Last(kDisconnected), nullptr);
  EXPECT_EQ(a.Last(kTimewaitExit), nullptr);
  wire.Advance(2 * kSec);  // 4.096 us << 17 = 537 ms
  EXPECT_NE(a.Last(kTimewaitExit), nullptr);
  EXPECT_NE(b.Last(kTimewaitExit), nullptr);
  EXPECT_EQ(a.mgr.DestroyId(ia), 0);
  EXPECT_EQ(b.mgr.DestroyId(ib), 0);
}

// The process of A exits (its embedded CM dies with it): B hears a DREQ for
// the connection, as when the kernel closes a dead process's rdma_cm file;
// A's ids stay (its other threads may hold them) and nothing more leaves A.
TEST_F(CmManager, ProcessExitTellsThePeer) {
  auto [ia, ib] = Establish();
  a.mgr.ProcessExit();
  wire.Run();
  const Event* disc = b.Last(kDisconnected);
  ASSERT_NE(disc, nullptr);
  EXPECT_EQ(disc->id, ib);
  EXPECT_TRUE(a.mgr.Exists(ia));
  const uint64_t out = a.mgr.stats().mads_out;
  wire.Advance(30 * kSec);
  EXPECT_EQ(a.mgr.stats().mads_out, out);
}

TEST_F(CmManager, NoListenerIsRejectedWithReason8) {
  const uint32_t ia = Resolved(9999);
  ASSERT_EQ(a.mgr.Connect(ia, Param(0x20)), 0);
  wire.Run();
  // Held for 100 ms in case a listener comes, then refused.
  wire.Advance(99'000'000);
  EXPECT_EQ(a.Last(kRejected), nullptr);
  EXPECT_EQ(b.mgr.stats().early_reqs, 1u);
  wire.Advance(2'000'000);
  const Event* rej = a.Last(kRejected);
  ASSERT_NE(rej, nullptr);
  EXPECT_EQ(rej->status, kRejInvalidServiceId);
  EXPECT_EQ(rej->param.private_data_len, 148);
  EXPECT_EQ(b.mgr.stats().no_listener, 1u);
}

TEST_F(CmManager, ReqBeforeItsListenerIsHandedToTheListener) {
  const uint32_t ia = Resolved(7174);
  ASSERT_EQ(a.mgr.Connect(ia, Param(0x20)), 0);
  ASSERT_EQ(wire.inflight.size(), 1u);
  wire.inflight.push_back(wire.inflight.front());  // and a duplicate of the REQ
  wire.Run();
  wire.Advance(5'000'000);
  EXPECT_EQ(b.Last(kConnectRequest), nullptr);
  Listen(7000);  // another service's listener does not take it
  EXPECT_EQ(b.Last(kConnectRequest), nullptr);
  Listen(7174);
  const Event* req = b.Last(kConnectRequest);
  ASSERT_NE(req, nullptr);  // at once, inside rdma_listen
  EXPECT_EQ(req->param.qp_num, 0x20u);
  EXPECT_EQ(std::count_if(b.events.begin(), b.events.end(),
                          [](const Event& e) { return e.event == kConnectRequest; }),
            1);
  ConnParam acc = Param(0x30);
  ASSERT_EQ(b.mgr.Accept(req->id, &acc), 0);
  wire.Run();
  ASSERT_NE(a.Last(kConnectResponse), nullptr);
  ASSERT_EQ(a.mgr.Accept(ia, nullptr), 0);
  wire.Run();
  EXPECT_NE(b.Last(kEstablished), nullptr);
  wire.Advance(200'000'000);
  EXPECT_EQ(a.Last(kRejected), nullptr);
  EXPECT_EQ(b.mgr.stats().early_reqs, 1u);
  EXPECT_EQ(b.mgr.stats().duplicates, 1u);
  EXPECT_EQ(b.mgr.stats().no_listener, 0u);
  EXPECT_EQ(b.mgr.stats().rejects_sent, 0u);
}

TEST_F(CmManager, SidrBeforeItsListenerIsHandedToTheListener) {
  const uint32_t ia = Resolved(7000, kRdmaPsUdp, kQpUd);
  ConnParam p;
  p.valid = true;
  ASSERT_EQ(a.mgr.Connect(ia, p), 0);
  wire.Run();
  wire.Advance(50'000'000);
  Listen(7000, kRdmaPsUdp, kQpUd);
  const Event* req = b.Last(kConnectRequest);
  ASSERT_NE(req, nullptr);
  EXPECT_TRUE(req->ud);
  ConnParam acc;
  acc.qp_num = 0x44;
  acc.valid = true;
  ASSERT_EQ(b.mgr.Accept(req->id, &acc), 0);
  wire.Run();
  ASSERT_NE(a.Last(kEstablished), nullptr);
  EXPECT_EQ(a.Last(kEstablished)->param.qp_num, 0x44u);
  EXPECT_EQ(a.Last(kUnreachable), nullptr);
}

TEST_F(CmManager, ApplicationRejectCarriesPrivateData) {
  Listen(7174);
  const uint32_t ia = Resolved(7174);
  ASSERT_EQ(a.mgr.Connect(ia, Param(0x20)), 0);
  wire.Run();
  const uint8_t why[] = {'n', 'o'};
  ASSERT_EQ(b.mgr.Reject(b.Last(kConnectRequest)->id, 0, why, 2), 0);
  wire.Run();
  const Event* rej = a.Last(kRejected);
  ASSERT_NE(rej, nullptr);
  EXPECT_EQ(rej->status, kRejConsumerDefined);
  EXPECT_EQ(rej->param.private_data[0], 'n');
  EXPECT_EQ(rej->param.private_data[1], 'o');
}

TEST_F(CmManager, LostReqIsRetriedAndALostRtuIsCoveredByTheResentRep) {
  Listen(7174);
  const uint32_t ia = Resolved(7174);
  int reqs = 0, rtus = 0;
  wire.drop = [&](const auto& m) {
    if (attr_of_bytes(m) == 0x0010) return ++reqs == 1;  // the first REQ
    if (attr_of_bytes(m) == 0x0014) return ++rtus == 1;  // the first RTU
    return false;
  };
  ASSERT_EQ(a.mgr.Connect(ia, Param(0x20)), 0);
  wire.Run();
  EXPECT_EQ(b.Last(kConnectRequest), nullptr);
  wire.Advance(5 * kSec);  // REQ timeout: 2 x 268 ms + 4.3 s
  ASSERT_NE(b.Last(kConnectRequest), nullptr);
  EXPECT_EQ(a.mgr.stats().retransmits, 1u);
  ConnParam acc = Param(0x30);
  ASSERT_EQ(b.mgr.Accept(b.Last(kConnectRequest)->id, &acc), 0);
  wire.Run();
  ASSERT_EQ(a.mgr.Accept(ia, nullptr), 0);
  wire.Run();
  EXPECT_EQ(b.Last(kEstablished), nullptr);  // the RTU was lost
  wire.Advance(6 * kSec);                    // B resends its REP; A answers with the RTU again
  EXPECT_NE(b.Last(kEstablished), nullptr);
  EXPECT_GE(a.mgr.stats().duplicates, 1u);
}

TEST_F(CmManager, DuplicateReqBeforeTheAcceptGetsAnMra) {
  Listen(7174);
  const uint32_t ia = Resolved(7174);
  int reps = 0;
  wire.drop = [&](const auto& m) { return attr_of_bytes(m) == 0x0013 && ++reps < 100; };
  ASSERT_EQ(a.mgr.Connect(ia, Param(0x20)), 0);
  wire.Run();
  // B's application is slow: A retries its REQ; B answers the duplicate
  // with an MRA, so A waits B's service timeout instead of retrying.
  wire.Advance(5 * kSec);
  EXPECT_EQ(b.mgr.stats().duplicates, 1u);
  const uint64_t retries = a.mgr.stats().retransmits;
  wire.Advance(4 * kSec);  // the MRA's 4.3 s + 2 x 268 ms are not over yet
  EXPECT_EQ(a.mgr.stats().retransmits, retries);
}

TEST_F(CmManager, VanishedPeerEndsAsUnreachableOnBothSides) {
  Listen(7174);
  const uint32_t ia = Resolved(7174);
  ASSERT_EQ(a.mgr.Connect(ia, Param(0x20)), 0);
  wire.Run();
  ConnParam acc = Param(0x30);
  ASSERT_EQ(b.mgr.Accept(b.Last(kConnectRequest)->id, &acc), 0);
  // From here A is gone: nothing of B's reaches it, and it sends nothing.
  wire.drop = [](const auto&) { return true; };
  wire.Advance(90 * kSec);  // 15 retries of ~4.8 s
  const Event* u = b.Last(kUnreachable);
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(u->status, -ETIMEDOUT);
  EXPECT_EQ(b.mgr.stats().retransmits, 15u);
  EXPECT_NE(a.Last(kConnectResponse), nullptr);  // A got the first REP before it went
}

TEST_F(CmManager, ReqThatNeverArrivesIsUnreachable) {
  Listen(7174);
  const uint32_t ia = Resolved(7174);
  wire.drop = [](const auto&) { return true; };
  ASSERT_EQ(a.mgr.Connect(ia, Param(0x20)), 0);
  wire.Advance(90 * kSec);
  const Event* u = a.Last(kUnreachable);
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(u->status, -ETIMEDOUT);
  EXPECT_EQ(a.mgr.DestroyId(ia), 0);
}

TEST_F(CmManager, DreqWithoutDrepStillDisconnects) {
  auto [ia, ib] = Establish();
  wire.drop = [](const auto&) { return true; };
  ASSERT_EQ(a.mgr.Disconnect(ia), 0);
  wire.Advance(90 * kSec);
  EXPECT_NE(a.Last(kDisconnected), nullptr);
  EXPECT_EQ(b.Last(kDisconnected), nullptr);
  (void)ib;
}

TEST_F(CmManager, ReqFromAConnectedQpIsStale) {
  auto [ia, ib] = Establish();
  (void)ib;
  // A second REQ from the same QPN and GID while connected: REJ stale.
  const uint32_t again = Resolved(7174);
  ASSERT_EQ(a.mgr.Connect(again, Param(0x20)), 0);
  wire.Run();
  const Event* rej = a.Last(kRejected);
  ASSERT_NE(rej, nullptr);
  EXPECT_EQ(rej->status, kRejStaleConn);
  EXPECT_EQ(b.mgr.stats().stale, 1u);
  (void)ia;
}

TEST_F(CmManager, SidrResolvesAUdService) {
  Listen(7000, kRdmaPsUdp, kQpUd);
  const uint32_t ia = Resolved(7000, kRdmaPsUdp, kQpUd);
  ConnParam p;
  p.valid = true;
  ASSERT_EQ(a.mgr.Connect(ia, p), 0);
  wire.Run();
  const Event* req = b.Last(kConnectRequest);
  ASSERT_NE(req, nullptr);
  EXPECT_TRUE(req->ud);
  EXPECT_EQ(req->param.ah.dgid, a.gid);
  EXPECT_EQ(req->param.private_data_len, 180);  // 216 - 36
  ConnParam acc;
  acc.qp_num = 0x44;
  acc.valid = true;
  ASSERT_EQ(b.mgr.Accept(req->id, &acc), 0);
  wire.Run();
  const Event* est = a.Last(kEstablished);
  ASSERT_NE(est, nullptr);
  EXPECT_EQ(est->param.qp_num, 0x44u);
  EXPECT_EQ(est->param.qkey, kUdpQkey);
  EXPECT_EQ(est->param.ah.dgid, b.gid);
  QpAttr init;
  ASSERT_EQ(a.mgr.InitQpAttr(ia, IBV_QPS_INIT, &init), 0);
  EXPECT_EQ(init.qkey, kUdpQkey);
}

TEST_F(CmManager, SidrForNoServiceIsUnreachable) {
  const uint32_t ia = Resolved(7000, kRdmaPsUdp, kQpUd);
  ConnParam p;
  ASSERT_EQ(a.mgr.Connect(ia, p), 0);
  wire.Run();
  wire.Advance(101'000'000);  // held 100 ms for a listener first
  const Event* u = a.Last(kUnreachable);
  ASSERT_NE(u, nullptr);
  EXPECT_EQ(u->status, kSidrUnsupported);
}

TEST_F(CmManager, ReqFloodIsBoundedPerListener) {
  Listen(7174);
  // 5000 REQs from distinct comm IDs and QPNs that nobody accepts.
  for (uint32_t i = 0; i < 5000; ++i) {
    Req r;
    r.local_comm_id = 1000 + i;
    r.service_id = service_id(kPsTcp, 7174);
    r.local_ca_guid = 0xA;
    r.local_qpn = 0x100 + i;
    IpHeader ih;
    ih.src_port = 40000;
    ih.src = a.gid;
    std::memset(ih.src.data(), 0, 12);
    ih.dst = b.gid;
    std::memset(ih.dst.data(), 0, 12);
    encode_ip_header(ih, r.private_data.data());
    std::array<uint8_t, kMadSize> m;
    encode(MadHeader{}, r, m);
    MadSource s;
    s.sgid = a.gid;
    s.dgid = b.gid;
    s.src_qpn = 1;
    b.mgr.OnMad(0, s, m);
  }
  EXPECT_EQ(b.mgr.stats().flood_rejects, 5000u - 4096u);
  wire.inflight.clear();
}

TEST_F(CmManager, MalformedMadsAreCountedAndDropped) {
  MadSource s;
  s.sgid = a.gid;
  s.dgid = b.gid;
  std::array<uint8_t, kMadSize> junk{};
  b.mgr.OnMad(0, s, junk);                                   // base version 0
  b.mgr.OnMad(0, s, std::span<const uint8_t>(junk.data(), 10));  // truncated
  junk = {1, 7, 2, 3};
  junk[17] = 0x16;  // a DREP for no connection: dropped, counted
  b.mgr.OnMad(0, s, junk);
  EXPECT_EQ(b.mgr.stats().bad_mads, 2u);
  EXPECT_EQ(b.mgr.stats().unknown_comm_id, 1u);
  EXPECT_TRUE(b.events.empty());
}

TEST_F(CmManager, DeviceRemovalReachesTheIdsOnThePort) {
  auto [ia, ib] = Establish();
  const uint32_t l = b.Last(kConnectRequest)->parent;
  b.mgr.RemovePort(0);
  int removals = 0;
  for (const Event& e : b.events) {
    if (e.event == kDeviceRemoval) {
      ++removals;
      EXPECT_EQ(e.id, ib);
    }
  }
  // The connection; not its wildcard listener, which spans every device
  // (as the kernel's, whose per-device listeners are its own).
  EXPECT_EQ(removals, 1);
  EXPECT_EQ(b.mgr.DestroyId(ib), 0);
  EXPECT_EQ(b.mgr.DestroyId(l), 0);
  (void)ia;
}

TEST_F(CmManager, RepAndDreqForNoConnectionAreAnswered) {
  MadSource s;
  s.sgid = a.gid;
  s.dgid = b.gid;
  s.src_qpn = kGsiQpn;
  std::array<uint8_t, kMadSize> m;
  Rep rep;
  rep.local_comm_id = 77;
  rep.remote_comm_id = 12345;  // no such connection on B
  encode(MadHeader{}, rep, m);
  b.mgr.OnMad(0, s, m);
  ASSERT_EQ(wire.inflight.size(), 1u);
  Mad out;
  ASSERT_EQ(decode(wire.inflight.back().mad, &out), MadError::kOk);
  const Rej& rej = std::get<Rej>(out.msg);
  EXPECT_EQ(rej.reason, kRejInvalidCommId);
  EXPECT_EQ(rej.message_rejected, kMsgRep);
  EXPECT_EQ(rej.remote_comm_id, 77u);
  wire.inflight.clear();
  Dreq dreq;
  dreq.local_comm_id = 78;
  dreq.remote_comm_id = 12346;
  encode(MadHeader{}, dreq, m);
  b.mgr.OnMad(0, s, m);
  ASSERT_EQ(wire.inflight.size(), 1u);
  ASSERT_EQ(decode(wire.inflight.back().mad, &out), MadError::kOk);
  EXPECT_EQ(std::get<Drep>(out.msg).remote_comm_id, 78u);
  wire.inflight.clear();
}

TEST_F(CmManager, OptionsReachTheQpAttributesAndTheBinds) {
  Listen(7174);
  const uint32_t ia = Resolved(7174);
  const uint8_t tos = 0x60, ack = 20;
  ASSERT_EQ(a.mgr.SetOption(ia, 0, 0, &tos, 1), 0);  // RDMA_OPTION_ID_TOS
  ASSERT_EQ(a.mgr.SetOption(ia, 0, 3, &ack, 1), 0);  // RDMA_OPTION_ID_ACK_TIMEOUT
  EXPECT_EQ(a.mgr.SetOption(ia, 0, 0, &tos, 2), -EINVAL);
  EXPECT_EQ(a.mgr.SetOption(ia, 1, 1, &tos, 1), -EINVAL);  // RDMA_OPTION_IB_PATH
  ASSERT_EQ(a.mgr.Connect(ia, Param(0x20)), 0);
  wire.Run();
  ConnParam acc = Param(0x30);
  ASSERT_EQ(b.mgr.Accept(b.Last(kConnectRequest)->id, &acc), 0);
  wire.Run();
  QpAttr rtr, rts;
  ASSERT_EQ(a.mgr.InitQpAttr(ia, IBV_QPS_RTR, &rtr), 0);
  ASSERT_EQ(a.mgr.InitQpAttr(ia, IBV_QPS_RTS, &rts), 0);
  EXPECT_EQ(rtr.ah.traffic_class, tos);
  EXPECT_EQ(rts.timeout, ack);
  // REUSEADDR: two ids on one port if both ask (and neither listens).
  const int on = 1;
  uint32_t x, y;
  ASSERT_EQ(a.mgr.CreateId(kRdmaPsTcp, kQpRc, &x), 0);
  ASSERT_EQ(a.mgr.CreateId(kRdmaPsTcp, kQpRc, &y), 0);
  ASSERT_EQ(a.mgr.SetOption(x, 0, 1, &on, sizeof(on)), 0);
  ASSERT_EQ(a.mgr.SetOption(y, 0, 1, &on, sizeof(on)), 0);
  EXPECT_EQ(a.mgr.Bind(x, a.Addr(6000)), 0);
  EXPECT_EQ(a.mgr.Bind(y, a.Addr(6000)), 0);
}

TEST_F(CmManager, AfOnlyKeepsAnIpv6WildcardListenerFromIpv4) {
  for (int afonly : {1, 0}) {
    uint32_t l;
    ASSERT_EQ(b.mgr.CreateId(kRdmaPsTcp, kQpRc, &l), 0);
    ASSERT_EQ(b.mgr.SetOption(l, 0, 2, &afonly, sizeof(afonly)), 0);  // RDMA_OPTION_ID_AFONLY
    IpAddr any6;
    any6.v6 = true;
    any6.port = 7200;
    ASSERT_EQ(b.mgr.Bind(l, any6), 0);
    ASSERT_EQ(b.mgr.Listen(l, 1), 0);
    const uint32_t ia = Resolved(7200);
    ASSERT_EQ(a.mgr.Connect(ia, Param(0x20 + afonly)), 0);
    wire.Run();
    if (afonly) {
      wire.Advance(101'000'000);  // no listener it may go to: held 100 ms, then refused
      ASSERT_NE(a.Last(kRejected), nullptr);
      EXPECT_EQ(a.Last(kRejected)->status, kRejInvalidServiceId);
    } else {
      EXPECT_NE(b.Last(kConnectRequest), nullptr);
    }
    ASSERT_EQ(b.mgr.DestroyId(l), 0);
  }
}

TEST_F(CmManager, CommandsCheckTheirState) {
  uint32_t id;
  ASSERT_EQ(a.mgr.CreateId(kRdmaPsTcp, kQpRc, &id), 0);
  EXPECT_EQ(a.mgr.ResolveRoute(id, 100), -EINVAL);  // no address yet
  EXPECT_EQ(a.mgr.Connect(id, Param(1)), -EINVAL);
  EXPECT_EQ(a.mgr.Accept(id, nullptr), -EINVAL);
  EXPECT_EQ(a.mgr.Disconnect(id), -EINVAL);
  QpAttr q;
  EXPECT_EQ(a.mgr.InitQpAttr(id, IBV_QPS_INIT, &q), -EINVAL);  // no device
  IpAddr other = b.Addr(1);  // not ours
  EXPECT_EQ(a.mgr.Bind(id, other), -EADDRNOTAVAIL);
  EXPECT_EQ(a.mgr.Bind(id, a.Addr(5000)), 0);
  uint32_t id2;
  ASSERT_EQ(a.mgr.CreateId(kRdmaPsTcp, kQpRc, &id2), 0);
  EXPECT_EQ(a.mgr.Bind(id2, a.Addr(5000)), -EADDRINUSE);
  EXPECT_EQ(a.mgr.DestroyId(12345), -EINVAL);
  EXPECT_EQ(a.mgr.CreateId(0x9999, kQpRc, &id2), -EINVAL);
}

}  // namespace
}  // namespace droce::cm
