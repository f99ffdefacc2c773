// What rdma-core's suite holds providers to, through the verbs
// API: on-demand paging (the caps, IBV_ACCESS_ON_DEMAND registrations that
// carry traffic, implicit ODP, ibv_advise_mr's answers with the kernel's mlx5 errnos),
// ibv_create_qp_ex's masks, and ibv_rereg_mr with a QP reset that drops the
// QP's unpolled completions.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "loopback_fixture.h"

namespace droce::test {
namespace {

using Odp = Loopback;

TEST_F(Odp, Caps) {
  ibv_device_attr_ex a{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &a), 0);
  EXPECT_EQ(a.odp_caps.general_caps, static_cast<uint64_t>(IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT));
  const uint32_t rc = a.odp_caps.per_transport_caps.rc_odp_caps;
  for (uint32_t bit : {IBV_ODP_SUPPORT_SEND, IBV_ODP_SUPPORT_RECV, IBV_ODP_SUPPORT_WRITE, IBV_ODP_SUPPORT_READ,
                       IBV_ODP_SUPPORT_ATOMIC, IBV_ODP_SUPPORT_SRQ_RECV}) {
    EXPECT_NE(rc & bit, 0u) << bit;
  }
  EXPECT_NE(a.odp_caps.per_transport_caps.ud_odp_caps & IBV_ODP_SUPPORT_SEND, 0u);
  // The whole address space needs IBV_ACCESS_ON_DEMAND.
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd_, nullptr, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

// Implicit ODP: one MR over the whole address space carries SENDs from and
// into buffers allocated after it was registered, and WRITEs and READs named
// by plain addresses; an access to an address where nothing is mapped is a
// protection error at the side that makes it, never a crash.
TEST_F(Odp, ImplicitMrCarriesTrafficAndSurvivesUnmappedAddresses) {
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_ON_DEMAND;
  ibv_mr* imr = ibv_reg_mr(pd_, nullptr, SIZE_MAX, access);
  ASSERT_NE(imr, nullptr) << errno;
  EXPECT_EQ(imr->addr, nullptr);
  EXPECT_EQ(imr->length, SIZE_MAX);
  constexpr size_t kLen = 256 * 1024;
  std::vector<uint8_t> src(kLen), dst(kLen), back(kLen);
  for (size_t i = 0; i < kLen; ++i) src[i] = static_cast<uint8_t>(i * 31 + 7);
  ibv_qp* a = CreateQp(scq_, rcq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(a, b);
  GrantRemote(b, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  auto post = [&](ibv_wr_opcode op, void* local, uint32_t len, uint64_t remote) {
    ibv_sge sge{reinterpret_cast<uint64_t>(local), len, imr->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote;
    wr.wr.rdma.rkey = imr->rkey;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(a, &wr, &bad);
  };
  // SEND into a receive buffer of the implicit MR.
  ibv_sge rs{reinterpret_cast<uint64_t>(dst.data()), 4096, imr->lkey};
  ibv_recv_wr rw{};
  rw.sg_list = &rs;
  rw.num_sge = 1;
  ibv_recv_wr* bad_r = nullptr;
  ASSERT_EQ(ibv_post_recv(b, &rw, &bad_r), 0);
  ASSERT_EQ(post(IBV_WR_SEND, src.data(), 4096, 0), 0);
  auto c = Poll(scq_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, IBV_WC_SUCCESS);
  ASSERT_EQ(Poll(rcq_, 1).size(), 1u);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), 4096), 0);
  // WRITE then READ back, multi-packet.
  ASSERT_EQ(post(IBV_WR_RDMA_WRITE, src.data(), kLen, reinterpret_cast<uint64_t>(dst.data())), 0);
  ASSERT_EQ(post(IBV_WR_RDMA_READ, back.data(), kLen, reinterpret_cast<uint64_t>(dst.data())), 0);
  c = Poll(scq_, 2);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(c[1].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(dst.data(), src.data(), kLen), 0);
  EXPECT_EQ(std::memcmp(back.data(), src.data(), kLen), 0);
  // A WRITE to a page nothing is mapped at: the responder refuses it
  // (remote access error) and the process lives on.
  void* hole = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(hole, MAP_FAILED);
  munmap(hole, 4096);
  ASSERT_EQ(post(IBV_WR_RDMA_WRITE, src.data(), 64, reinterpret_cast<uint64_t>(hole)), 0);
  c = Poll(scq_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(ibv_dereg_mr(imr), 0);
}

// A SEND gathered from an unmapped address through the implicit MR fails
// locally with a protection error.
TEST_F(Odp, ImplicitMrLocalUnmappedIsAProtectionError) {
  ibv_mr* imr = ibv_reg_mr(pd_, nullptr, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
  ASSERT_NE(imr, nullptr) << errno;
  ibv_qp* a = CreateQp(scq_, rcq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(a, b);
  ASSERT_EQ(PostRecv(b, 1, 0, 4096), 0);
  void* hole = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(hole, MAP_FAILED);
  munmap(hole, 4096);
  ibv_sge sge{reinterpret_cast<uint64_t>(hole), 64, imr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a, &wr, &bad), 0);
  auto c = Poll(scq_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(ibv_dereg_mr(imr), 0);
}

// An RDMA WRITE from one on-demand MR into another, on memory that was
// never touched before it was registered.
TEST_F(Odp, WriteBetweenOnDemandMrs) {
  constexpr size_t kLen = 1 << 20;
  void* src = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  void* dst = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(src, MAP_FAILED);
  ASSERT_NE(dst, MAP_FAILED);
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_ON_DEMAND;
  ibv_mr* smr = ibv_reg_mr(pd_, src, kLen, access);
  ibv_mr* dmr = ibv_reg_mr(pd_, dst, kLen, access);
  ASSERT_NE(smr, nullptr);
  ASSERT_NE(dmr, nullptr);
  std::memset(src, 0x5A, kLen);
  ibv_qp* a = CreateQp(scq_, rcq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(a, b);
  GrantRemote(b, IBV_ACCESS_REMOTE_WRITE);
  ibv_sge s{reinterpret_cast<uint64_t>(src), static_cast<uint32_t>(kLen), smr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(dst);
  wr.wr.rdma.rkey = dmr->rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a, &wr, &bad), 0);
  auto wcs = Poll(scq_, 1);
  ASSERT_EQ(wcs.size(), 1u);
  EXPECT_EQ(wcs[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(std::memcmp(src, dst, kLen), 0);
  EXPECT_EQ(ibv_dereg_mr(smr), 0);
  EXPECT_EQ(ibv_dereg_mr(dmr), 0);
  munmap(src, kLen);
  munmap(dst, kLen);
}

TEST_F(Odp, AdviseMr) {
  constexpr size_t kLen = 64 * 1024;
  void* p = mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  ibv_mr* odp = ibv_reg_mr(pd_, p, kLen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND);
  ibv_mr* ro = ibv_reg_mr(pd_, p, kLen, IBV_ACCESS_ON_DEMAND);  // no local write
  ASSERT_NE(odp, nullptr);
  ASSERT_NE(ro, nullptr);
  const uint64_t base = reinterpret_cast<uint64_t>(p);
  ibv_sge sge{base + 4096, 8192, odp->lkey};
  for (auto advice : {IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE,
                      IBV_ADVISE_MR_ADVICE_PREFETCH_NO_FAULT}) {
    EXPECT_EQ(ibv_advise_mr(pd_, advice, IBV_ADVISE_MR_FLAG_FLUSH, &sge, 1), 0) << advice;
    EXPECT_EQ(ibv_advise_mr(pd_, advice, 0, &sge, 1), 0) << advice;
  }
  EXPECT_EQ(ibv_advise_mr(pd_, static_cast<ibv_advise_mr_advice>(7), 0, &sge, 1), EOPNOTSUPP);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0x10, &sge, 1), EOPNOTSUPP);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 0), EINVAL);
  ibv_sge outside{base + kLen - 8, 16, odp->lkey};
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &outside, 1), ENOENT);
  ibv_sge pinned{reinterpret_cast<uint64_t>(buf_.data()), 64, mr_->lkey};  // not on demand
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &pinned, 1), ENOENT);
  ibv_sge ro_sge{base, 64, ro->lkey};
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &ro_sge, 1), 0);
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE, 0, &ro_sge, 1), ENOENT);
  ibv_pd* other = ibv_alloc_pd(ctx_);
  ASSERT_NE(other, nullptr);
  EXPECT_EQ(ibv_advise_mr(other, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &sge, 1), ENOENT);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
  const uint32_t lkey = odp->lkey;
  EXPECT_EQ(ibv_dereg_mr(odp), 0);
  ibv_sge gone{base, 64, lkey};
  EXPECT_EQ(ibv_advise_mr(pd_, IBV_ADVISE_MR_ADVICE_PREFETCH, 0, &gone, 1), ENOENT);
  EXPECT_EQ(ibv_dereg_mr(ro), 0);
  munmap(p, kLen);
}

}  // namespace
}  // namespace droce::test

namespace droce::test {
namespace {

// ibv_create_qp_ex's masks and creation flags.
TEST_F(Loopback, CreateQpExMasksAndFlags) {
  auto attr = [&](uint32_t mask) {
    ibv_qp_init_attr_ex a{};
    a.qp_type = IBV_QPT_RC;
    a.send_cq = scq_;
    a.recv_cq = rcq_;
    a.cap.max_send_wr = a.cap.max_recv_wr = 8;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.comp_mask = mask;
    a.pd = pd_;
    return a;
  };
  for (ibv_qp_type t : {IBV_QPT_RC, IBV_QPT_UC, IBV_QPT_UD}) {
    ibv_qp_init_attr_ex a = attr(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS);
    a.qp_type = t;
    ibv_qp* qp = ibv_create_qp_ex(ctx_, &a);
    ASSERT_NE(qp, nullptr) << t << " " << errno;
    EXPECT_EQ(ibv_destroy_qp(qp), 0);
    a.create_flags = IBV_QP_CREATE_BLOCK_SELF_MCAST_LB;
    errno = 0;
    EXPECT_EQ(ibv_create_qp_ex(ctx_, &a), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP) << t;
  }
  for (uint32_t m : {IBV_QP_INIT_ATTR_MAX_TSO_HEADER, IBV_QP_INIT_ATTR_IND_TABLE, IBV_QP_INIT_ATTR_RX_HASH}) {
    ibv_qp_init_attr_ex a = attr(IBV_QP_INIT_ATTR_PD | m);
    errno = 0;
    EXPECT_EQ(ibv_create_qp_ex(ctx_, &a), nullptr);
    EXPECT_EQ(errno, EOPNOTSUPP) << m;
  }
  // An XRC domain belongs to XRC target QPs only (verbs_xrc_test.cc).
  {
    ibv_qp_init_attr_ex a = attr(IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD);
    errno = 0;
    EXPECT_EQ(ibv_create_qp_ex(ctx_, &a), nullptr);
    EXPECT_EQ(errno, EINVAL);
  }
  ibv_qp_init_attr_ex a = attr(IBV_QP_INIT_ATTR_CREATE_FLAGS);  // no PD
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

}  // namespace
}  // namespace droce::test

namespace droce::test {
namespace {

// ibv_rereg_mr: the keys stay; a new access, PD or range is what the next
// access is checked against; libibverbs' input rules.
TEST_F(Loopback, ReregMrAccessPdAndTranslation) {
  ibv_qp* a = CreateQp(scq_, rcq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(a, b);
  GrantRemote(b, IBV_ACCESS_REMOTE_WRITE);
  std::vector<uint8_t> target(4096, 0);
  ibv_mr* t = ibv_reg_mr(pd_, target.data(), target.size(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(t, nullptr);
  const uint32_t lkey = t->lkey, rkey = t->rkey;
  auto write = [&](uint64_t to, uint32_t key) {
    ibv_sge s{reinterpret_cast<uint64_t>(buf_.data()), 64, mr_->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = to;
    wr.wr.rdma.rkey = key;
    ibv_send_wr* bad = nullptr;
    EXPECT_EQ(ibv_post_send(a, &wr, &bad), 0);
    auto wcs = Poll(scq_, 1);
    return wcs.empty() ? -1 : static_cast<int>(wcs[0].status);
  };
  auto reset = [&] {  // both QPs back to RTS after an error
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RESET;
    ASSERT_EQ(ibv_modify_qp(a, &r, IBV_QP_STATE), 0);
    ASSERT_EQ(ibv_modify_qp(b, &r, IBV_QP_STATE), 0);
    Connect(a, b);
    GrantRemote(b, IBV_ACCESS_REMOTE_WRITE);
  };
  const uint64_t at = reinterpret_cast<uint64_t>(target.data());
  EXPECT_EQ(write(at, rkey), IBV_WC_SUCCESS);
  // Input errors: no flag, an unknown one, a range without the flag.
  EXPECT_EQ(ibv_rereg_mr(t, 0, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(ibv_rereg_mr(t, 0x100, nullptr, nullptr, 0, 0), IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(ibv_rereg_mr(t, IBV_REREG_MR_CHANGE_ACCESS, nullptr, target.data(), 8, IBV_ACCESS_LOCAL_WRITE),
            IBV_REREG_MR_ERR_INPUT);
  EXPECT_EQ(errno, EINVAL);
  // Remote write without local write is refused by the command.
  EXPECT_EQ(ibv_rereg_mr(t, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_REMOTE_WRITE),
            IBV_REREG_MR_ERR_CMD);
  EXPECT_EQ(errno, EINVAL);
  // No remote write any more: the peer's WRITE is refused.
  ASSERT_EQ(ibv_rereg_mr(t, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, IBV_ACCESS_LOCAL_WRITE), 0);
  EXPECT_EQ(t->lkey, lkey);
  EXPECT_EQ(t->rkey, rkey);
  EXPECT_EQ(write(at, rkey), IBV_WC_REM_ACCESS_ERR);
  reset();
  ASSERT_EQ(ibv_rereg_mr(t, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0,
                         IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE),
            0);
  EXPECT_EQ(write(at, rkey), IBV_WC_SUCCESS);
  // Another PD: the QP's PD no longer matches.
  ibv_pd* other = ibv_alloc_pd(ctx_);
  ASSERT_NE(other, nullptr);
  ASSERT_EQ(ibv_rereg_mr(t, IBV_REREG_MR_CHANGE_PD, other, nullptr, 0, 0), 0);
  EXPECT_EQ(t->pd, other);
  EXPECT_EQ(ibv_dealloc_pd(other), EBUSY);  // the MR is on it now
  EXPECT_EQ(write(at, rkey), IBV_WC_REM_ACCESS_ERR);
  reset();
  ASSERT_EQ(ibv_rereg_mr(t, IBV_REREG_MR_CHANGE_PD, pd_, nullptr, 0, 0), 0);
  EXPECT_EQ(ibv_dealloc_pd(other), 0);
  // A new range: the old address is outside it, the new one inside. As a
  // droced client (verbs_loopback_daemon) that is not offered.
  std::vector<uint8_t> moved(4096, 0);
  const char* daemon = std::getenv("DROCE_DAEMON");
  if (daemon != nullptr && *daemon != '\0') {
    EXPECT_EQ(ibv_rereg_mr(t, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, moved.data(), moved.size(), 0),
              IBV_REREG_MR_ERR_CMD);
    EXPECT_EQ(errno, EOPNOTSUPP);
    EXPECT_EQ(ibv_dereg_mr(t), 0);
    return;
  }
  ASSERT_EQ(ibv_rereg_mr(t, IBV_REREG_MR_CHANGE_TRANSLATION, nullptr, moved.data(), moved.size(), 0), 0);
  EXPECT_EQ(t->addr, moved.data());
  EXPECT_EQ(write(reinterpret_cast<uint64_t>(moved.data()), rkey), IBV_WC_SUCCESS);
  EXPECT_EQ(write(at, rkey), IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(ibv_dereg_mr(t), 0);
}

// A QP moved to RESET takes its unpolled completions with it (libmlx5's
// rule): flushes of its error state do not reach the next poll; another
// QP's completions on the same CQ stay.
TEST_F(Loopback, ResetDropsTheQpsUnpolledCompletions) {
  ibv_qp* a = CreateQp(scq_, rcq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  ibv_qp* c = CreateQp(scq_, scq_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(c, nullptr);
  Connect(a, b);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(PostRecv(b, 10 + i, 0, 64), 0);
  ibv_qp_attr e{};
  e.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(b, &e, IBV_QP_STATE), 0);
  ToInit(c);
  ASSERT_EQ(PostRecv(c, 99, 0, 64), 0);
  ASSERT_EQ(ibv_modify_qp(c, &e, IBV_QP_STATE), 0);  // c's flush goes to scq_
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the flushes are in
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RESET;
  ASSERT_EQ(ibv_modify_qp(b, &r, IBV_QP_STATE), 0);
  ibv_wc wc[8];
  EXPECT_EQ(ibv_poll_cq(rcq_, 8, wc), 0) << "b's four flushed receives are gone";
  ASSERT_EQ(ibv_poll_cq(scq_, 8, wc), 1);
  EXPECT_EQ(wc[0].wr_id, 99u);
  EXPECT_EQ(wc[0].status, IBV_WC_WR_FLUSH_ERR);
}

}  // namespace
}  // namespace droce::test

namespace droce::test {
namespace {

void* never_alloc(ibv_pd*, void*, size_t, size_t, uint64_t) { return IBV_ALLOCATOR_USE_DEFAULT; }
void never_free(ibv_pd*, void*, void*, uint64_t) {}

// Parent domains and thread domains: interchangeable with their PD, which
// cannot go first; the checks on their attributes.
TEST_F(Loopback, ParentDomain) {
  ibv_td_init_attr ta{};
  ibv_td* td = ibv_alloc_td(ctx_, &ta);
  ASSERT_NE(td, nullptr);
  ibv_parent_domain_init_attr pa{};
  pa.pd = pd_;
  pa.td = td;
  pa.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS | IBV_PARENT_DOMAIN_INIT_ATTR_PD_CONTEXT;
  pa.alloc = never_alloc;
  pa.free = never_free;
  pa.pd_context = this;
  ibv_pd* parent = ibv_alloc_parent_domain(ctx_, &pa);
  ASSERT_NE(parent, nullptr) << errno;
  // A QP and an MR on the parent domain talk to ones on the PD itself.
  ibv_mr* mr = ibv_reg_mr(parent, buf_.data() + 4096, 4096, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 16;
  ca.wc_flags = IBV_WC_STANDARD_FLAGS;
  ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_PD;
  ca.parent_domain = parent;
  ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &ca);
  ASSERT_NE(cqx, nullptr) << errno;
  ca.parent_domain = pd_;  // not a parent domain
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &ca), nullptr);
  EXPECT_EQ(errno, EINVAL);
  SendFromNewQp(parent, ibv_cq_ex_to_cq(cqx), reinterpret_cast<uint64_t>(buf_.data() + 4096), mr->lkey);
  EXPECT_EQ(ibv_dealloc_pd(pd_), EBUSY);  // a parent domain (and an MR) on it
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)), 0);
  EXPECT_EQ(ibv_dealloc_pd(parent), 0);
  EXPECT_EQ(ibv_dealloc_td(td), 0);
  // Refused: no PD, a parent domain as the PD, allocators without functions,
  // an unknown mask bit.
  ibv_parent_domain_init_attr bad_attr{};
  errno = 0;
  EXPECT_EQ(ibv_alloc_parent_domain(ctx_, &bad_attr), nullptr);
  EXPECT_EQ(errno, EINVAL);
  bad_attr.pd = pd_;
  bad_attr.comp_mask = IBV_PARENT_DOMAIN_INIT_ATTR_ALLOCATORS;
  EXPECT_EQ(ibv_alloc_parent_domain(ctx_, &bad_attr), nullptr);
  bad_attr.comp_mask = 1u << 7;
  EXPECT_EQ(ibv_alloc_parent_domain(ctx_, &bad_attr), nullptr);
  bad_attr.comp_mask = 0;
  ibv_pd* p2 = ibv_alloc_parent_domain(ctx_, &bad_attr);
  ASSERT_NE(p2, nullptr);
  bad_attr.pd = p2;
  EXPECT_EQ(ibv_alloc_parent_domain(ctx_, &bad_attr), nullptr);
  EXPECT_EQ(ibv_dealloc_pd(p2), 0);
}

}  // namespace
}  // namespace droce::test

namespace droce::test {
namespace {

// ibv_import_device/_pd/_mr within this process: a dup of a context's
// command fd opens another context of the device, on which the first
// context's PD and MR can be imported; the command fd takes no command.
TEST_F(Loopback, ImportDevicePdAndMr) {
  EXPECT_EQ(write(ctx_->cmd_fd, "x", 1), -1);
  EXPECT_EQ(errno, EBADF);
  const int fd = dup(ctx_->cmd_fd);
  ASSERT_GE(fd, 0);
  ibv_context* other = ibv_import_device(fd);  // owns fd from here on
  ASSERT_NE(other, nullptr) << errno;
  EXPECT_EQ(other->cmd_fd, fd);
  EXPECT_EQ(other->device, ctx_->device);
  ibv_pd* pd = ibv_import_pd(other, pd_->handle);
  ASSERT_NE(pd, nullptr) << errno;
  EXPECT_EQ(pd->handle, pd_->handle);
  ibv_mr* mr = ibv_import_mr(pd, mr_->handle);
  ASSERT_NE(mr, nullptr) << errno;
  EXPECT_EQ(mr->lkey, mr_->lkey);
  EXPECT_EQ(mr->addr, mr_->addr);
  EXPECT_EQ(mr->length, mr_->length);
  // A QP on the other context, with the imported PD and MR, sends to one
  // on this context.
  ibv_cq* ocq = ibv_create_cq(other, 16, nullptr, nullptr, 0);
  ASSERT_NE(ocq, nullptr);
  SendFromNewQp(pd, ocq, reinterpret_cast<uint64_t>(buf_.data()), mr->lkey);
  EXPECT_EQ(ibv_destroy_cq(ocq), 0);
  // Refused: a handle that names nothing, an MR on another PD, a descriptor
  // that is not a droce context's.
  errno = 0;
  EXPECT_EQ(ibv_import_pd(other, 0xFFFFFF), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_pd* pd2 = ibv_alloc_pd(other);
  ASSERT_NE(pd2, nullptr);
  EXPECT_EQ(ibv_import_mr(pd2, mr_->handle), nullptr);
  EXPECT_EQ(errno, EINVAL);
  EXPECT_EQ(ibv_dealloc_pd(pd2), 0);
  const int null_fd = open("/dev/null", O_RDONLY);
  ASSERT_GE(null_fd, 0);
  errno = 0;
  EXPECT_EQ(ibv_import_device(null_fd), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
  close(null_fd);
  ibv_unimport_mr(mr);
  ibv_unimport_pd(pd);
  EXPECT_EQ(ibv_close_device(other), 0);
  // The originals are untouched.
  SendFromNewQp(pd_, scq_, reinterpret_cast<uint64_t>(buf_.data()), mr_->lkey);
}

}  // namespace
}  // namespace droce::test
