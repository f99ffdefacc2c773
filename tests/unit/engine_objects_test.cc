// The engine's object table (src/engine/objects.h): who owns what, the
// references that keep an object from going, and an owner's teardown in
// ObjKind order.
#include "engine/objects.h"

#include <gtest/gtest.h>

namespace droce::engine {
namespace {

constexpr uint64_t kAlice = 7, kBob = 9;

// What Device::DestroyAllOf does with the table (the QPs' worker
// bookkeeping aside): every object of `owner`, in ObjKind order.
size_t DestroyAll(ObjectTable& t, uint64_t owner, std::vector<std::string>* failed = nullptr) {
  const OwnedObjects o = t.Owned(owner);
  for (uint32_t qpn : o.of(ObjKind::kQp)) t.mcast.DetachQp(qpn);
  size_t gone = 0;
  for (int k = 0; k < kNumObjKinds; ++k) {
    for (uint32_t id : o.ids[k]) {
      absl::Status s;
      switch (static_cast<ObjKind>(k)) {
        case ObjKind::kQp:
          s = t.CheckQpRemovable(id);
          if (s.ok()) t.RemoveQp(id);
          break;
        case ObjKind::kSrq: s = t.DestroySrq(id); break;
        case ObjKind::kAh: s = t.DestroyAh(id); break;
        case ObjKind::kMw: s = t.DeallocMw(id); break;
        case ObjKind::kMr: s = t.DeregMr(id); break;
        case ObjKind::kCq: s = t.DestroyCq(id); break;
        case ObjKind::kPd: s = t.DeallocPd(id); break;
      }
      if (s.ok()) ++gone;
      else if (failed != nullptr) failed->push_back(ObjKindName(static_cast<ObjKind>(k)));
    }
  }
  return gone;
}

uint32_t AddCq(ObjectTable& t, uint64_t owner) {
  CqEntry e;
  e.owner = owner;
  return t.AddCq(std::move(e));
}

// A QP entry without its transport (the table never runs it).
absl::StatusOr<uint32_t> AddQp(ObjectTable& t, uint64_t owner, uint32_t pd, uint32_t cq, uint32_t srq = 0) {
  QpCreateArgs a;
  a.type = transport::QpType::kUd;
  a.pd = pd;
  a.send_cq = a.recv_cq = cq;
  a.srq = srq;
  QpRefs refs;
  if (absl::Status s = t.ResolveQpRefs(a, &refs); !s.ok()) return s;
  absl::StatusOr<uint32_t> qpn = t.NextQpn();
  if (!qpn.ok()) return qpn;
  auto e = std::make_unique<QpEntry>();
  e->pd = refs.holds;
  e->send_cq = e->recv_cq = cq;
  e->srq = srq;
  e->owner = owner;
  t.AddQp(*qpn, std::move(e), refs);
  return qpn;
}

TEST(EngineObjects, EveryObjectKnowsItsOwner) {
  ObjectTable t;
  const uint32_t pd = t.AllocPd(kAlice);
  const uint32_t other_pd = t.AllocPd(kBob);
  static uint8_t buf[4096];
  auto mr = t.RegMr(pd, reinterpret_cast<uint64_t>(buf), reinterpret_cast<uint64_t>(buf), sizeof(buf), 0, 0, kAlice);
  ASSERT_TRUE(mr.ok());
  auto mw = t.AllocMw(pd, 2, kAlice);
  ASSERT_TRUE(mw.ok());
  const uint32_t cq = AddCq(t, kAlice);
  SrqEntry se;
  se.pd = pd;
  se.owner = kAlice;
  auto srq = t.AddSrq(std::move(se));
  ASSERT_TRUE(srq.ok());
  transport::AddressHandle ah;
  ah.pd = pd;
  auto ah_id = t.AddAh(ah, kAlice);
  ASSERT_TRUE(ah_id.ok());
  auto qpn = AddQp(t, kAlice, pd, cq);
  ASSERT_TRUE(qpn.ok());

  EXPECT_EQ(t.OwnerOf(ObjKind::kPd, pd), kAlice);
  EXPECT_EQ(t.OwnerOf(ObjKind::kPd, other_pd), kBob);
  EXPECT_EQ(t.OwnerOf(ObjKind::kMr, mr->key), kAlice);
  EXPECT_EQ(t.OwnerOf(ObjKind::kMw, *mw), kAlice);
  // A window keeps its owner whatever key variant a bind gave it.
  EXPECT_EQ(t.OwnerOf(ObjKind::kMw, (*mw & ~0xFFu) | ((*mw + 1) & 0xFF)), kAlice);
  EXPECT_EQ(t.OwnerOf(ObjKind::kCq, cq), kAlice);
  EXPECT_EQ(t.OwnerOf(ObjKind::kSrq, *srq), kAlice);
  EXPECT_EQ(t.OwnerOf(ObjKind::kAh, *ah_id), kAlice);
  EXPECT_EQ(t.OwnerOf(ObjKind::kQp, *qpn), kAlice);
  EXPECT_EQ(t.OwnerOf(ObjKind::kQp, *qpn + 1), std::nullopt);
  EXPECT_EQ(t.OwnerOf(ObjKind::kCq, cq + 1), std::nullopt);

  const OwnedObjects a = t.Owned(kAlice);
  EXPECT_EQ(a.total(), 7u);
  EXPECT_EQ(a.of(ObjKind::kPd), std::vector<uint32_t>{pd});
  EXPECT_EQ(a.of(ObjKind::kQp), std::vector<uint32_t>{*qpn});
  EXPECT_EQ(t.Owned(kBob).total(), 1u);
  EXPECT_EQ(t.Owned(42).total(), 0u);
}

TEST(EngineObjects, AnObjectInUseCannotGo) {
  ObjectTable t;
  const uint32_t pd = t.AllocPd(0);
  const uint32_t cq = AddCq(t, 0);
  SrqEntry se;
  se.pd = pd;
  auto srq = t.AddSrq(std::move(se));
  ASSERT_TRUE(srq.ok());
  auto qpn = AddQp(t, 0, pd, cq, *srq);
  ASSERT_TRUE(qpn.ok());
  EXPECT_EQ(t.DeallocPd(pd).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.DestroyCq(cq).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.DestroySrq(*srq).code(), absl::StatusCode::kFailedPrecondition);
  // A QP in a multicast group stays until it leaves.
  wire::Ipv6Addr group{};
  group[0] = 0xFF;
  group[15] = 1;
  ASSERT_EQ(t.mcast.Attach(group, *qpn), 0);
  EXPECT_EQ(t.CheckQpRemovable(*qpn).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(t.mcast.DetachQp(*qpn), 1u);
  EXPECT_EQ(t.mcast.groups(), 0u);
  ASSERT_TRUE(t.CheckQpRemovable(*qpn).ok());
  t.RemoveQp(*qpn);
  // Its references went with it.
  EXPECT_TRUE(t.DestroySrq(*srq).ok());
  EXPECT_TRUE(t.DestroyCq(cq).ok());
  EXPECT_TRUE(t.DeallocPd(pd).ok());
  EXPECT_EQ(t.DeallocPd(pd).code(), absl::StatusCode::kNotFound);
}

TEST(EngineObjects, MissingReferencesAreRefused) {
  ObjectTable t;
  const uint32_t pd = t.AllocPd(0);
  const uint32_t cq = AddCq(t, 0);
  EXPECT_EQ(AddQp(t, 0, pd + 1, cq).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(AddQp(t, 0, pd, cq + 1).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(AddQp(t, 0, pd, cq, 99).status().code(), absl::StatusCode::kNotFound);
  SrqEntry xrc;
  xrc.pd = pd;
  xrc.xrcd = pd + 5;  // no such domain
  xrc.cq = cq;
  EXPECT_EQ(t.AddSrq(std::move(xrc)).status().code(), absl::StatusCode::kNotFound);
  transport::AddressHandle ah;
  ah.pd = pd + 1;
  EXPECT_EQ(t.AddAh(ah, 0).status().code(), absl::StatusCode::kNotFound);
  // Nothing was counted against the PD.
  EXPECT_EQ(*t.PdUses(pd), 0u);
}

TEST(EngineObjects, AnOwnersTeardownTakesEverythingInOrderAndNothingElse) {
  ObjectTable t;
  static uint8_t buf[8192];
  const uint64_t addr = reinterpret_cast<uint64_t>(buf);
  // Alice: a PD with an MR, a window, an AH, two CQs, an SRQ, QPs (one in
  // a multicast group); Bob: a PD, a CQ and a QP.
  const uint32_t pd = t.AllocPd(kAlice);
  ASSERT_TRUE(t.RegMr(pd, addr, addr, sizeof(buf), 0, 0, kAlice).ok());
  ASSERT_TRUE(t.AllocMw(pd, 1, kAlice).ok());
  transport::AddressHandle ah;
  ah.pd = pd;
  ASSERT_TRUE(t.AddAh(ah, kAlice).ok());
  const uint32_t cq1 = AddCq(t, kAlice), cq2 = AddCq(t, kAlice);
  SrqEntry se;
  se.pd = pd;
  se.owner = kAlice;
  auto srq = t.AddSrq(std::move(se));
  ASSERT_TRUE(srq.ok());
  auto q1 = AddQp(t, kAlice, pd, cq1, *srq);
  auto q2 = AddQp(t, kAlice, pd, cq2);
  ASSERT_TRUE(q1.ok() && q2.ok());
  wire::Ipv6Addr group{};
  group[0] = 0xFF;
  ASSERT_EQ(t.mcast.Attach(group, *q2), 0);
  const uint32_t bob_pd = t.AllocPd(kBob);
  const uint32_t bob_cq = AddCq(t, kBob);
  auto bob_qp = AddQp(t, kBob, bob_pd, bob_cq);
  ASSERT_TRUE(bob_qp.ok());

  std::vector<std::string> failed;
  EXPECT_EQ(DestroyAll(t, kAlice, &failed), 9u);
  EXPECT_TRUE(failed.empty());
  EXPECT_EQ(t.Owned(kAlice).total(), 0u);
  EXPECT_EQ(t.mrs.size(), 0u);
  // Bob's objects are untouched and still work together.
  EXPECT_EQ(t.Owned(kBob).total(), 3u);
  EXPECT_EQ(t.DestroyCq(bob_cq).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(DestroyAll(t, kBob), 3u);
  EXPECT_TRUE(t.qps.empty() && t.cqs.empty() && t.pds.empty());
}

TEST(EngineObjects, AnObjectOnAnotherOwnersPdKeepsThatPd) {
  // droced refuses it (a handle must be the client's), but the engine's
  // rule stands alone: a PD in use does not go, whoever uses it.
  ObjectTable t;
  const uint32_t pd = t.AllocPd(kAlice);
  const uint32_t cq = AddCq(t, kBob);
  ASSERT_TRUE(AddQp(t, kBob, pd, cq).ok());
  std::vector<std::string> failed;
  EXPECT_EQ(DestroyAll(t, kAlice, &failed), 0u);
  EXPECT_EQ(failed, std::vector<std::string>{"PD"});
  EXPECT_EQ(DestroyAll(t, kBob), 2u);
  EXPECT_EQ(DestroyAll(t, kAlice), 1u);
}

TEST(EngineObjects, OwnerScopeNests) {
  EXPECT_EQ(CurrentOwner(), 0u);
  {
    OwnerScope a(kAlice);
    EXPECT_EQ(CurrentOwner(), kAlice);
    {
      OwnerScope b(kBob);
      EXPECT_EQ(CurrentOwner(), kBob);
    }
    EXPECT_EQ(CurrentOwner(), kAlice);
  }
  EXPECT_EQ(CurrentOwner(), 0u);
}

}  // namespace
}  // namespace droce::engine
