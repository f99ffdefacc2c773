// One rule for "may work be posted now": every posting verb
// decides from the QP's state as the engine has it. After each way the
// engine moves a QP to ERR by itself — retry exceeded, a full CQ, a corrupt
// ring, an SRQ in error — receives and sends posted afterwards (without an
// ibv_query_qp or ibv_modify_qp in between, which would refresh the cached
// ibqp->state) are accepted and come back flushed at once. The dead-device
// path is in verbs_fatal_test.cc.
#include "loopback_fixture.h"

namespace droce::test {
namespace {

constexpr auto kPrompt = std::chrono::milliseconds(1000);

class PostRule : public Loopback {
 protected:
  void TearDown() override {
    for (ibv_qp* qp : qps_) EXPECT_EQ(ibv_destroy_qp(qp), 0);
    qps_.clear();
    for (ibv_cq* cq : own_cqs_) EXPECT_EQ(ibv_destroy_cq(cq), 0);
    Loopback::TearDown();
  }
  // A CQ for the QP under test alone, so that what it polls is that QP's.
  ibv_cq* OwnCq() {
    ibv_cq* cq = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
    EXPECT_NE(cq, nullptr);
    own_cqs_.push_back(cq);
    return cq;
  }
  std::vector<ibv_cq*> own_cqs_;
  // The next completion on cq is wr_id, flushed, within kPrompt.
  void ExpectFlushed(ibv_cq* cq, uint64_t wr_id, const char* what) {
    auto c = Poll(cq, 1, kPrompt);
    ASSERT_EQ(c.size(), 1u) << what << " was not flushed";
    EXPECT_EQ(c[0].wr_id, wr_id) << what;
    EXPECT_EQ(c[0].status, IBV_WC_WR_FLUSH_ERR) << what;
  }
  // Posts one receive (unless the QP uses an SRQ), one SEND, one ibv_wr_*
  // SEND (if the QP was made extended) and one type 1 bind on qp, then
  // expects each to complete as IBV_WC_WR_FLUSH_ERR.
  void ExpectPostsFlushed(ibv_qp* qp, ibv_cq* scq, ibv_cq* rcq, bool check_recv = true) {
    if (qp->srq == nullptr) {
      ASSERT_EQ(PostRecv(qp, 900, 8192, 64), 0) << "a receive posted in ERR is accepted (IBA 11.4.1.2)";
      if (check_recv) {
        ExpectFlushed(rcq, 900, "the receive posted in ERR");
      }
    }
    ASSERT_EQ(PostSend(qp, 901, 0, 16), 0) << "a send posted in ERR is accepted (IBA 11.4.1.1)";
    ExpectFlushed(scq, 901, "the send posted in ERR");

    ibv_qp_ex* qx = ibv_qp_to_qp_ex(qp);
    if (qx != nullptr && qx->wr_send != nullptr) {
      ASSERT_EQ(WrSend(qx, 902, IBV_SEND_SIGNALED), 0) << "ibv_wr_* in ERR is accepted";
      ExpectFlushed(scq, 902, "the ibv_wr_* SEND posted in ERR");
    }

    if (qp->qp_type != IBV_QPT_UD) {
      ibv_mr* mwmr = ibv_reg_mr(pd_, buf_.data() + 65536, 4096,
                                IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND);
      ASSERT_NE(mwmr, nullptr);
      ibv_mw* mw = ibv_alloc_mw(pd_, IBV_MW_TYPE_1);
      ASSERT_NE(mw, nullptr);
      ibv_mw_bind b{};
      b.wr_id = 903;
      b.send_flags = IBV_SEND_SIGNALED;
      b.bind_info.mr = mwmr;
      b.bind_info.addr = reinterpret_cast<uint64_t>(buf_.data() + 65536);
      b.bind_info.length = 4096;
      b.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
      ASSERT_EQ(ibv_bind_mw(qp, mw, &b), 0) << "ibv_bind_mw in ERR is accepted";
      ExpectFlushed(scq, 903, "the bind posted in ERR");
      EXPECT_EQ(ibv_dealloc_mw(mw), 0);
      EXPECT_EQ(ibv_dereg_mr(mwmr), 0);
    }
    // The cache is refreshed only now, by the query.
    EXPECT_EQ(State(qp), IBV_QPS_ERR);
    EXPECT_EQ(qp->state, IBV_QPS_ERR);
  }
  // One SEND of 16 bytes through ibv_wr_*; returns ibv_wr_complete's result.
  int WrSend(ibv_qp_ex* qx, uint64_t wr_id, unsigned flags) {
    ibv_wr_start(qx);
    qx->wr_id = wr_id;
    qx->wr_flags = flags;
    ibv_wr_send(qx);
    ibv_wr_set_sge(qx, mr_->lkey, reinterpret_cast<uint64_t>(buf_.data()), 16);
    return ibv_wr_complete(qx);
  }
  // An RC QP created through ibv_create_qp_ex, so that ibv_wr_* works on it.
  ibv_qp* CreateExQp(ibv_cq* scq, ibv_cq* rcq) {
    ibv_qp_init_attr_ex a{};
    a.send_cq = scq;
    a.recv_cq = rcq;
    a.cap.max_send_wr = a.cap.max_recv_wr = 16;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.qp_type = IBV_QPT_RC;
    a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    a.pd = pd_;
    a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_BIND_MW;
    ibv_qp* qp = ibv_create_qp_ex(ctx_, &a);
    if (qp != nullptr) qps_.push_back(qp);
    return qp;
  }
};

// Before RTS nothing may go to the send queue; before INIT nothing to the
// receive queue; SQD accepts sends for later (and ibv_wr_start and
// ibv_bind_mw follow the same rule as ibv_post_send).
TEST_F(PostRule, StatesBeforeRtsAreRefusedTheSameByEveryVerb) {
  ibv_qp* a = CreateExQp(scq_, rcq_);
  ASSERT_NE(a, nullptr);
  ibv_qp_ex* qx = ibv_qp_to_qp_ex(a);
  ASSERT_NE(qx, nullptr);
  ibv_mw* mw = ibv_alloc_mw(pd_, IBV_MW_TYPE_1);
  ASSERT_NE(mw, nullptr);
  ibv_mw_bind b{};
  auto expect_send_side = [&](int want, const char* state) {
    EXPECT_EQ(PostSend(a, 1, 0, 8), want) << "ibv_post_send in " << state;
    EXPECT_EQ(WrSend(qx, 2, 0), want) << "ibv_wr_* in " << state;
    const uint32_t rkey = mw->rkey;
    EXPECT_EQ(ibv_bind_mw(a, mw, &b), want) << "ibv_bind_mw in " << state;
    if (want != 0) {
      EXPECT_EQ(mw->rkey, rkey) << "a refused bind leaves the rkey";
    }
  };
  EXPECT_EQ(PostRecv(a, 3, 0, 8), EINVAL) << "ibv_post_recv in RESET";
  expect_send_side(EINVAL, "RESET");
  ToInit(a);
  EXPECT_EQ(PostRecv(a, 3, 0, 8), 0) << "ibv_post_recv in INIT";
  expect_send_side(EINVAL, "INIT");
  ToRtr(a, a->qp_num);
  expect_send_side(EINVAL, "RTR");
  EXPECT_EQ(ibv_dealloc_mw(mw), 0);
}

TEST_F(PostRule, SqdAcceptsWorkForLater) {
  ibv_qp* a = CreateExQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  ASSERT_NE(a, nullptr);
  Connect(a, b);
  ibv_qp_attr d{};
  d.qp_state = IBV_QPS_SQD;
  ASSERT_EQ(ibv_modify_qp(a, &d, IBV_QP_STATE), 0);
  ASSERT_EQ(PostRecv(b, 10, 4096, 64), 0);
  ASSERT_EQ(PostRecv(b, 11, 4096, 64), 0);
  EXPECT_EQ(PostSend(a, 20, 0, 8), 0) << "ibv_post_send in SQD";
  EXPECT_EQ(WrSend(ibv_qp_to_qp_ex(a), 21, IBV_SEND_SIGNALED), 0) << "ibv_wr_* in SQD";
  EXPECT_TRUE(Poll(scq_, 1, std::chrono::milliseconds(100)).empty()) << "SQD holds new work";
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RTS;
  ASSERT_EQ(ibv_modify_qp(a, &r, IBV_QP_STATE), 0);
  auto s = Poll(scq_, 2);
  ASSERT_EQ(s.size(), 2u);
  for (auto& w : s) EXPECT_EQ(w.status, IBV_WC_SUCCESS);
  EXPECT_EQ(Poll(rcq_, 2).size(), 2u);
}

TEST_F(PostRule, AfterRetryExceededPostsAreFlushed) {
  ibv_cq* own = OwnCq();
  ibv_qp* a = CreateExQp(own, own);
  ASSERT_NE(a, nullptr);
  ToInit(a);
  ToRtr(a, 0xABCDE);  // nobody there: every request is lost
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_RTS;
  r.timeout = 8;  // ~1 ms
  r.retry_cnt = 1;
  r.rnr_retry = 1;
  r.sq_psn = 100;
  r.max_rd_atomic = 1;
  ASSERT_EQ(ibv_modify_qp(a, &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
            0);
  ASSERT_EQ(PostSend(a, 1, 0, 16), 0);
  auto s = Poll(own, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(a->state, IBV_QPS_RTS) << "(the cached state is stale: the point of this test)";
  ExpectPostsFlushed(a, own, own);
}

TEST_F(PostRule, AfterAFullCqPostsAreFlushed) {
  ibv_cq* tiny = ibv_create_cq(ctx_, 2, nullptr, nullptr, 0);
  ASSERT_NE(tiny, nullptr);
  ibv_cq* own = OwnCq();
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(own, tiny);
  Connect(a, b);
  const int cap = tiny->cqe;
  for (int i = 0; i < cap + 1; ++i) ASSERT_EQ(PostRecv(b, i, 4096, 64), 0);
  for (int i = 0; i < cap + 1; ++i) ASSERT_EQ(PostSend(a, i, 0, 8), 0);
  bool fatal = false;
  for (int i = 0; i < 2 && !fatal; ++i) fatal = NextAsyncEvent().event_type == IBV_EVENT_QP_FATAL;
  ASSERT_TRUE(fatal);
  // b's receive CQ is the one that overflowed (IBA 11.4.2.1: in error for
  // good): its flushed receives cannot be seen, but the post is accepted
  // and its sends are flushed into the send CQ.
  ExpectPostsFlushed(b, own, tiny, /*check_recv=*/false);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  qps_.erase(std::find(qps_.begin(), qps_.end(), b));
  EXPECT_EQ(ibv_destroy_cq(tiny), 0);
}

TEST_F(PostRule, AfterACorruptRingPostsToTheOtherQueueAreFlushed) {
  // The receive ring is scribbled on: QP_FATAL, ERR. Sends still flush.
  ibv_cq* own = OwnCq();
  ibv_qp* c = CreateQp(scq_, scq_);
  ibv_qp* d = CreateQp(own, rcq_);
  Connect(c, d);
  droce::provider::Qp* pd = droce::provider::to_qp(d);
  pd->handle.rq.publish_prod(pd->rq_prod + 100000);
  ASSERT_EQ(PostSend(c, 1, 0, 16), 0);
  ASSERT_EQ(NextAsyncEvent().event_type, IBV_EVENT_QP_FATAL);
  ASSERT_EQ(PostSend(d, 5, 0, 16), 0);
  ExpectFlushed(own, 5, "a send after a corrupt receive ring");
  // The send ring is scribbled on: receives still flush.
  ibv_cq* own2 = OwnCq();
  ibv_qp* a = CreateQp(scq_, own2);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  droce::provider::Qp* pa = droce::provider::to_qp(a);
  pa->handle.sq.publish_prod(pa->sq_prod + 100000);
  droce::provider::to_ctx(ctx_)->s->engine->Doorbell(pa->handle);
  ASSERT_EQ(NextAsyncEvent().event_type, IBV_EVENT_QP_FATAL);
  ASSERT_EQ(PostRecv(a, 6, 8192, 64), 0);
  ExpectFlushed(own2, 6, "a receive after a corrupt send ring");
}

TEST_F(PostRule, AfterAnSrqErrorSendsAreFlushedAndReceivesRefused) {
  ibv_srq* srq = CreateSrq(8);
  ASSERT_NE(srq, nullptr);
  ibv_cq* own = OwnCq();
  ibv_qp_init_attr qa{};
  qa.send_cq = own;
  qa.recv_cq = rcq_;
  qa.srq = srq;
  qa.cap.max_send_wr = 16;
  qa.cap.max_send_sge = 1;
  qa.qp_type = IBV_QPT_RC;
  ibv_qp* r = ibv_create_qp(pd_, &qa);
  ASSERT_NE(r, nullptr);
  ibv_qp* s = CreateQp(scq_, scq_);
  Connect(s, r);
  droce::provider::Srq* ps = droce::provider::to_srq(srq);
  ps->handle.ring.publish_prod(ps->prod + 1000);
  ASSERT_EQ(PostSend(s, 1, 0, 32), 0);
  bool last_wqe = false;
  for (int i = 0; i < 2; ++i) last_wqe |= NextAsyncEvent().event_type == IBV_EVENT_QP_LAST_WQE_REACHED;
  ASSERT_TRUE(last_wqe);
  EXPECT_EQ(PostRecv(r, 1, 0, 8), EINVAL) << "a QP on an SRQ has no receive queue";
  ExpectPostsFlushed(r, own, rcq_);
  EXPECT_EQ(ibv_destroy_qp(r), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

}  // namespace
}  // namespace droce::test
