// The send queue on the loopback link: the ibv_wr_* API, ATOMIC WRITE, memory windows, SQD, posts around polls.
#include "loopback_fixture.h"

namespace droce::test {
namespace {

TEST_F(Loopback, ExtendedQpPostsThroughWrApi) {
  ibv_qp_init_attr_ex ax{};
  ax.send_cq = scq_;
  ax.recv_cq = scq_;
  ax.cap.max_send_wr = ax.cap.max_recv_wr = 16;
  ax.cap.max_send_sge = ax.cap.max_recv_sge = 1;
  ax.qp_type = IBV_QPT_RC;
  ax.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  ax.pd = pd_;
  ax.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
  ibv_qp* a = ibv_create_qp_ex(ctx_, &ax);
  ASSERT_NE(a, nullptr);
  qps_.push_back(a);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(a);
  ASSERT_NE(x, nullptr);
  std::memcpy(buf_.data(), "hello droce", 11);
  ASSERT_EQ(PostRecv(b, 1, 4096, 64), 0);
  ibv_wr_start(x);
  x->wr_id = 42;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send_imm(x, htobe32(0x1234));
  ibv_wr_set_sge(x, mr_->lkey, reinterpret_cast<uint64_t>(buf_.data()), 11);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  auto r = Poll(rcq_, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
  EXPECT_TRUE(r[0].wc_flags & IBV_WC_WITH_IMM);
  EXPECT_EQ(be32toh(r[0].imm_data), 0x1234u);
  EXPECT_EQ(std::memcmp(buf_.data() + 4096, "hello droce", 11), 0);
  auto s = Poll(scq_, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].wr_id, 42u);
  // An operation droce does not implement fails the whole batch.
  ibv_wr_start(x);
  x->wr_id = 43;
  char hdr[64] = {};
  ibv_wr_send_tso(x, hdr, sizeof(hdr), 1000);
  EXPECT_EQ(ibv_wr_complete(x), EOPNOTSUPP);
  // Asking for an operation droce does not implement refuses the QP.
  ax.send_ops_flags = IBV_QP_EX_WITH_TSO;
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(ctx_, &ax), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

// IBA 1.5 ATOMIC WRITE, as Linux rxe has it: through ibv_wr_atomic_write and
// through ibv_post_send with IBV_WR_ATOMIC_WRITE (one 8-byte SGE), completing
// with IBV_WC_ATOMIC_WRITE; other lengths are refused at post time.
TEST_F(Loopback, AtomicWriteThroughBothApis) {
  uint8_t* region = buf_.data() + 512 * 1024;
  ibv_mr* remote = ibv_reg_mr(pd_, region, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(remote, nullptr);
  ibv_qp_init_attr_ex ax{};
  ax.send_cq = ax.recv_cq = scq_;
  ax.cap.max_send_wr = ax.cap.max_recv_wr = 16;
  ax.cap.max_send_sge = ax.cap.max_recv_sge = 1;
  ax.qp_type = IBV_QPT_RC;
  ax.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  ax.pd = pd_;
  ax.send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE | IBV_QP_EX_WITH_RDMA_WRITE;
  ibv_qp* a = ibv_create_qp_ex(ctx_, &ax);
  ASSERT_NE(a, nullptr);
  qps_.push_back(a);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  GrantRemote(b, IBV_ACCESS_REMOTE_WRITE);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(a);
  const uint64_t v1 = 0x1122334455667788ull;
  ibv_wr_start(x);
  x->wr_id = 1;
  x->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_atomic_write(x, remote->rkey, reinterpret_cast<uint64_t>(region + 8), &v1);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  auto c = Poll(scq_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(c[0].opcode, IBV_WC_ATOMIC_WRITE);
  uint64_t got = 0;
  std::memcpy(&got, region + 8, 8);
  EXPECT_EQ(got, v1);

  const uint64_t v2 = 0xfeedfacecafebeefull;
  std::memcpy(buf_.data() + 64, &v2, 8);
  ibv_sge sge{reinterpret_cast<uint64_t>(buf_.data() + 64), 8, mr_->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 2;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_ATOMIC_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(region + 16);
  wr.wr.rdma.rkey = remote->rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a, &wr, &bad), 0);
  c = Poll(scq_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(c[0].opcode, IBV_WC_ATOMIC_WRITE);
  std::memcpy(&got, region + 16, 8);
  EXPECT_EQ(got, v2);
  sge.length = 4;  // an ATOMIC WRITE is 8 bytes
  EXPECT_EQ(ibv_post_send(a, &wr, &bad), EINVAL);
  EXPECT_EQ(bad, &wr);
  EXPECT_EQ(ibv_destroy_qp(a), 0);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  qps_.clear();
  EXPECT_EQ(ibv_dereg_mr(remote), 0);
}

// Memory windows (IBA 10.6.7): a type 1 window bound with ibv_bind_mw, a
// type 2 window bound with IBV_WR_BIND_MW, remote access through them only
// inside their bounds and rights, local and remote invalidation.
TEST_F(Loopback, MemoryWindowsBindAccessAndInvalidate) {
  uint8_t* region = buf_.data() + 256 * 1024;
  ibv_mr* base = ibv_reg_mr(pd_, region, 64 * 1024,
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND);
  ASSERT_NE(base, nullptr);
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  GrantRemote(b, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  auto write = [&](uint64_t wr_id, uint64_t raddr, uint32_t rkey, uint32_t len) {
    ibv_sge s{reinterpret_cast<uint64_t>(buf_.data()), len, mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = rkey;
    ibv_send_wr* bad = nullptr;
    EXPECT_EQ(ibv_post_send(a, &wr, &bad), 0);
    auto c = Poll(scq_, 1);
    return c.empty() ? IBV_WC_GENERAL_ERR : c[0].status;
  };
  // Type 1, bound through QP b's send queue to 4 KiB of the region.
  ibv_mw* mw1 = ibv_alloc_mw(pd_, IBV_MW_TYPE_1);
  ASSERT_NE(mw1, nullptr);
  const uint32_t old_rkey = mw1->rkey;
  ibv_mw_bind bind{};
  bind.wr_id = 7;
  bind.send_flags = IBV_SEND_SIGNALED;
  bind.bind_info.mr = base;
  bind.bind_info.addr = reinterpret_cast<uint64_t>(region) + 4096;
  bind.bind_info.length = 4096;
  bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ASSERT_EQ(ibv_bind_mw(b, mw1, &bind), 0);
  EXPECT_NE(mw1->rkey, old_rkey);
  auto bc = Poll(scq_, 1);
  ASSERT_EQ(bc.size(), 1u);
  EXPECT_EQ(bc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(bc[0].opcode, IBV_WC_BIND_MW);
  std::memset(buf_.data(), 0x5a, 64);
  EXPECT_EQ(write(1, reinterpret_cast<uint64_t>(region) + 4096, mw1->rkey, 64), IBV_WC_SUCCESS);
  EXPECT_EQ(region[4096], 0x5a);
  // The MR cannot be deregistered while a window is bound to it.
  EXPECT_EQ(ibv_dereg_mr(base), EBUSY);
  // Outside the window: remote access error, and the QPs go to error.
  EXPECT_EQ(write(2, reinterpret_cast<uint64_t>(region), mw1->rkey, 64), IBV_WC_REM_ACCESS_ERR);
  Drain(rcq_);
  Drain(scq_);
  // New QPs; a type 2 window bound with a work request, then invalidated by
  // SEND with invalidate: afterwards its rkey no longer works.
  for (ibv_qp* q : qps_) EXPECT_EQ(ibv_destroy_qp(q), 0);
  qps_.clear();
  a = CreateQp(scq_, scq_);
  b = CreateQp(scq_, rcq_);
  Connect(a, b);
  GrantRemote(b, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  ibv_mw* mw2 = ibv_alloc_mw(pd_, IBV_MW_TYPE_2);
  ASSERT_NE(mw2, nullptr);
  const uint32_t rkey2 = ibv_inc_rkey(mw2->rkey);
  ibv_send_wr bw{};
  bw.wr_id = 8;
  bw.opcode = IBV_WR_BIND_MW;
  bw.send_flags = IBV_SEND_SIGNALED;
  bw.bind_mw.mw = mw2;
  bw.bind_mw.rkey = rkey2;
  bw.bind_mw.bind_info.mr = base;
  bw.bind_mw.bind_info.addr = reinterpret_cast<uint64_t>(region);
  bw.bind_mw.bind_info.length = 8192;
  bw.bind_mw.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(b, &bw, &bad), 0);
  bc = Poll(scq_, 1);
  ASSERT_EQ(bc.size(), 1u);
  EXPECT_EQ(bc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(write(3, reinterpret_cast<uint64_t>(region) + 100, rkey2, 64), IBV_WC_SUCCESS);
  // SEND with invalidate from a to b.
  ASSERT_EQ(PostRecv(b, 9, 16384, 64), 0);
  ibv_sge s{reinterpret_cast<uint64_t>(buf_.data()), 8, mr_->lkey};
  ibv_send_wr iw{};
  iw.wr_id = 10;
  iw.sg_list = &s;
  iw.num_sge = 1;
  iw.opcode = IBV_WR_SEND_WITH_INV;
  iw.send_flags = IBV_SEND_SIGNALED;
  iw.invalidate_rkey = rkey2;
  ASSERT_EQ(ibv_post_send(a, &iw, &bad), 0);
  auto r = Poll(rcq_, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
  EXPECT_TRUE(r[0].wc_flags & IBV_WC_WITH_INV);
  EXPECT_EQ(r[0].invalidated_rkey, rkey2);
  ASSERT_EQ(Poll(scq_, 1).size(), 1u);
  EXPECT_EQ(write(4, reinterpret_cast<uint64_t>(region) + 100, rkey2, 64), IBV_WC_REM_ACCESS_ERR);
  Drain(rcq_);
  Drain(scq_);
  for (ibv_qp* q : qps_) EXPECT_EQ(ibv_destroy_qp(q), 0);
  qps_.clear();
  // Unbind the type 1 window (a bind with no MR) before the MR goes away.
  a = CreateQp(scq_, scq_);
  b = CreateQp(scq_, rcq_);
  Connect(a, b);
  ibv_mw_bind unbind{};
  unbind.wr_id = 11;
  unbind.send_flags = IBV_SEND_SIGNALED;
  ASSERT_EQ(ibv_bind_mw(b, mw1, &unbind), 0);
  ASSERT_EQ(Poll(scq_, 1).size(), 1u);
  EXPECT_EQ(ibv_dealloc_mw(mw1), 0);
  EXPECT_EQ(ibv_dealloc_mw(mw2), 0);
  EXPECT_EQ(ibv_dereg_mr(base), 0);
}

// SQD (IBA 10.3.1): no new WQE starts while drained; SQ_DRAINED is raised
// when the outstanding ones are done; back in RTS the posted WQEs go out.
TEST_F(Loopback, SendQueueDrainRaisesSqDrainedAndHoldsNewWork) {
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_SQD;
  attr.en_sqd_async_notify = 1;
  ASSERT_EQ(ibv_modify_qp(a, &attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY), 0);
  pollfd p{ctx_->async_fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 5000), 1);
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_SQ_DRAINED);
  EXPECT_EQ(ev.element.qp, a);
  ibv_ack_async_event(&ev);
  ASSERT_EQ(PostRecv(b, 1, 4096, 64), 0);
  ASSERT_EQ(PostSend(a, 2, 0, 64), 0);
  EXPECT_TRUE(Poll(rcq_, 1, std::chrono::milliseconds(100)).empty());
  attr.qp_state = IBV_QPS_RTS;
  ASSERT_EQ(ibv_modify_qp(a, &attr, IBV_QP_STATE), 0);
  EXPECT_EQ(Poll(rcq_, 1).size(), 1u);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);
}

// A polled send completion means the WR is no longer outstanding: with a
// one-entry send queue, posting right after polling must succeed (the slot is
// freed before the completion becomes visible). Regression test.
TEST_F(Loopback, PostRightAfterPollingTheSendCompletionSucceeds) {
  ibv_qp* a = CreateQp(scq_, scq_, /*depth=*/1);
  ibv_qp* b = CreateQp(scq_, rcq_, /*depth=*/1);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(a, b);
  for (int i = 0; i < 2000; ++i) {
    ASSERT_EQ(PostRecv(b, i, 4096, 64), 0) << i;
    ASSERT_EQ(PostSend(a, i, 0, 8), 0) << i;
    ASSERT_EQ(Poll(scq_, 1).size(), 1u) << i;
    ASSERT_EQ(Poll(rcq_, 1).size(), 1u) << i;
  }
}

// A post made right after ibv_poll_cq drove the engine is left for the
// application's next poll (batching, Device::Kick). An application that then
// never polls again, e.g. one that spins on memory for the result, still
// gets its WRITE executed: the worker takes over when the drive window ends.
TEST_F(Loopback, PostRightAfterPollingIsSentWithoutAnotherPoll) {
  uint8_t* target = buf_.data() + 512 * 1024;
  ibv_mr* remote = ibv_reg_mr(pd_, target, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ASSERT_NE(remote, nullptr);
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(a, b);
  GrantRemote(b, IBV_ACCESS_REMOTE_WRITE);
  for (int round = 1; round <= 5; ++round) {
    std::memset(buf_.data(), round, 64);
    ibv_wc wc;
    EXPECT_EQ(ibv_poll_cq(scq_, 1, &wc), 0);  // drives: the next post is deferred
    ibv_sge sg{reinterpret_cast<uint64_t>(buf_.data()), 64, mr_->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sg;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(target);
    wr.wr.rdma.rkey = remote->rkey;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(a, &wr, &bad), 0);
    const auto start = std::chrono::steady_clock::now();
    while (__atomic_load_n(&target[63], __ATOMIC_ACQUIRE) != round &&
           std::chrono::steady_clock::now() - start < std::chrono::seconds(5)) {
    }
    // A liveness bound, not a speed check: the worker takes over within the
    // 2 ms drive window (measured 1-2 ms per round).
    ASSERT_EQ(target[63], round) << "the WRITE never landed without a poll";
  }
  EXPECT_EQ(ibv_dereg_mr(remote), 0);
}

// Posts left for the next poll's turn (Kick) are sent before the QP is
// destroyed: a program that posts unsignaled UD SENDs and destroys its QP
// at once, without polling (mckey's sender), loses none of them.
TEST_F(Loopback, DeferredPostsGoOutBeforeTheQpIsDestroyed) {
  ibv_qp* x = CreateUdQp(pd_, scq_, rcq_, 0x11111111);
  ibv_qp* y = CreateUdQp(pd_, scq_, rcq_, 0x11111111);
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  qps_.push_back(y);
  ibv_ah* ah = CreateSelfAh(ctx_, pd_);
  ASSERT_NE(ah, nullptr);
  constexpr int kSends = 8;
  for (int i = 0; i < kSends; ++i) ASSERT_EQ(PostRecv(y, i, 8192 + 256 * i, 40 + 64), 0);
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(scq_, 1, &wc), 0);  // drives: the posts below are deferred
  ibv_sge s{reinterpret_cast<uint64_t>(buf_.data()), 16, mr_->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = y->qp_num;
  wr.wr.ud.remote_qkey = 0x11111111;
  ibv_send_wr* bad = nullptr;
  for (int i = 0; i < kSends; ++i) ASSERT_EQ(ibv_post_send(x, &wr, &bad), 0) << i;
  ASSERT_EQ(ibv_destroy_qp(x), 0);
  const auto r = Poll(rcq_, kSends, std::chrono::seconds(5));
  EXPECT_EQ(r.size(), static_cast<size_t>(kSends)) << "SENDs posted before ibv_destroy_qp were lost";
  for (const ibv_wc& c : r) EXPECT_EQ(c.status, IBV_WC_SUCCESS);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
}

// The extended QP API for RDMA: ibv_wr_rdma_write with inline data,
// ibv_wr_rdma_read and ibv_wr_atomic_fetch_add, in one batch.
TEST_F(Loopback, WrApiRdmaReadWriteAndAtomics) {
  uint8_t* region = buf_.data() + 256 * 1024;
  ibv_mr* remote = ibv_reg_mr(pd_, region, 4096,
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                  IBV_ACCESS_REMOTE_ATOMIC);
  ASSERT_NE(remote, nullptr);
  ibv_qp_init_attr_ex ax{};
  ax.send_cq = ax.recv_cq = scq_;
  ax.cap.max_send_wr = ax.cap.max_recv_wr = 16;
  ax.cap.max_send_sge = ax.cap.max_recv_sge = 1;
  ax.cap.max_inline_data = 64;
  ax.qp_type = IBV_QPT_RC;
  ax.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  ax.pd = pd_;
  ax.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
  ibv_qp* a = ibv_create_qp_ex(ctx_, &ax);
  ASSERT_NE(a, nullptr);
  qps_.push_back(a);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  GrantRemote(b, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
  uint64_t word = 40;
  std::memcpy(region + 2048, &word, 8);
  std::memset(buf_.data() + 1024, 0, 64);
  ibv_qp_ex* x = ibv_qp_to_qp_ex(a);
  char text[] = "written inline";
  ibv_wr_start(x);
  x->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  x->wr_id = 1;
  ibv_wr_rdma_write(x, remote->rkey, reinterpret_cast<uint64_t>(region));
  ibv_wr_set_inline_data(x, text, sizeof(text));
  x->wr_flags = IBV_SEND_SIGNALED;
  x->wr_id = 2;
  ibv_wr_rdma_read(x, remote->rkey, reinterpret_cast<uint64_t>(region));
  ibv_wr_set_sge(x, mr_->lkey, reinterpret_cast<uint64_t>(buf_.data() + 1024), sizeof(text));
  x->wr_id = 3;
  ibv_wr_atomic_fetch_add(x, remote->rkey, reinterpret_cast<uint64_t>(region + 2048), 2);
  ibv_wr_set_sge(x, mr_->lkey, reinterpret_cast<uint64_t>(buf_.data() + 2048), 8);
  ASSERT_EQ(ibv_wr_complete(x), 0);
  auto c = Poll(scq_, 3);
  ASSERT_EQ(c.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(c[i].status, IBV_WC_SUCCESS) << i;
    EXPECT_EQ(c[i].wr_id, static_cast<uint64_t>(i + 1));
  }
  EXPECT_EQ(std::memcmp(region, text, sizeof(text)), 0);
  EXPECT_EQ(std::memcmp(buf_.data() + 1024, text, sizeof(text)), 0);
  uint64_t orig = 0;
  std::memcpy(&orig, buf_.data() + 2048, 8);
  EXPECT_EQ(orig, 40u);
  std::memcpy(&word, region + 2048, 8);
  EXPECT_EQ(word, 42u);
  EXPECT_EQ(ibv_destroy_qp(a), 0);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  qps_.clear();
  EXPECT_EQ(ibv_dereg_mr(remote), 0);
}

}  // namespace
}  // namespace droce::test
