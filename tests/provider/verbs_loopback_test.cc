// The verbs provider in one process on droce0's default loopback link: two
// RC QPs connected to each other, as conformance suites run on a hardware
// NIC. Also checks the errors the verbs API specifies for bad calls.
// The binary links libdroce.so ahead of libibverbs, so ibv_* resolve to droce
// exactly as they do under LD_PRELOAD.
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>
#include <atomic>

#include "droce/droce.h"

namespace {

class Loopback : public ::testing::Test {
 protected:
  void SetUp() override {
    int n = 0;
    ibv_device** list = ibv_get_device_list(&n);
    ASSERT_NE(list, nullptr);
    ASSERT_EQ(n, 1);
    EXPECT_STREQ(ibv_get_device_name(list[0]), "droce0");
    ctx_ = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    ASSERT_NE(ctx_, nullptr);
    pd_ = ibv_alloc_pd(ctx_);
    ASSERT_NE(pd_, nullptr);
    buf_.resize(1 << 20);
    mr_ = ibv_reg_mr(pd_, buf_.data(), buf_.size(), IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr_, nullptr);
    channel_ = ibv_create_comp_channel(ctx_);
    ASSERT_NE(channel_, nullptr);
    scq_ = ibv_create_cq(ctx_, 64, this, nullptr, 0);
    rcq_ = ibv_create_cq(ctx_, 64, this, channel_, 0);
    ASSERT_NE(scq_, nullptr);
    ASSERT_NE(rcq_, nullptr);
  }
  void TearDown() override {
    for (ibv_qp* qp : qps_) EXPECT_EQ(ibv_destroy_qp(qp), 0);
    if (scq_) EXPECT_EQ(ibv_destroy_cq(scq_), 0);
    if (rcq_) EXPECT_EQ(ibv_destroy_cq(rcq_), 0);
    if (channel_) EXPECT_EQ(ibv_destroy_comp_channel(channel_), 0);
    if (mr_) EXPECT_EQ(ibv_dereg_mr(mr_), 0);
    if (pd_) EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
    if (ctx_) EXPECT_EQ(ibv_close_device(ctx_), 0);
  }

  ibv_qp* CreateQp(ibv_cq* scq, ibv_cq* rcq, uint32_t depth = 32) {
    ibv_qp_init_attr a{};
    a.send_cq = scq;
    a.recv_cq = rcq;
    a.cap.max_send_wr = depth;
    a.cap.max_recv_wr = depth;
    a.cap.max_send_sge = 2;
    a.cap.max_recv_sge = 2;
    a.cap.max_inline_data = 64;
    a.qp_type = IBV_QPT_RC;
    ibv_qp* qp = ibv_create_qp(pd_, &a);
    if (qp != nullptr) qps_.push_back(qp);
    return qp;
  }

  void ToInit(ibv_qp* qp) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = 1;
    a.qp_access_flags = 0;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  }
  void ToRtr(ibv_qp* qp, uint32_t dest) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = dest;
    a.rq_psn = 100;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.hop_limit = 1;
    ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &a.ah_attr.grh.dgid), 0);
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                        IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
  }
  void ToRts(ibv_qp* qp) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.sq_psn = 100;
    a.max_rd_atomic = 1;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
              0);
  }
  void Connect(ibv_qp* a, ibv_qp* b) {
    ToInit(a);
    ToInit(b);
    ToRtr(a, b->qp_num);
    ToRtr(b, a->qp_num);
    ToRts(a);
    ToRts(b);
  }

  int PostRecv(ibv_qp* qp, uint64_t wr_id, size_t off, uint32_t len) {
    ibv_sge s{reinterpret_cast<uint64_t>(buf_.data() + off), len, mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &s;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(qp, &wr, &bad);
  }
  int PostSend(ibv_qp* qp, uint64_t wr_id, size_t off, uint32_t len, unsigned flags = IBV_SEND_SIGNALED,
               uint32_t lkey = 0) {
    ibv_sge s{reinterpret_cast<uint64_t>(buf_.data() + off), len, lkey ? lkey : mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = flags;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(qp, &wr, &bad);
  }
  // Polls until n completions arrived or `limit` passed.
  std::vector<ibv_wc> Poll(ibv_cq* cq, int n, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    std::vector<ibv_wc> out;
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (static_cast<int>(out.size()) < n && std::chrono::steady_clock::now() < deadline) {
      ibv_wc wc[8];
      int k = ibv_poll_cq(cq, 8, wc);
      EXPECT_GE(k, 0);
      for (int i = 0; i < k; ++i) out.push_back(wc[i]);
      if (k == 0) usleep(1);
    }
    return out;
  }
  // Takes whatever completions arrive within a short while (e.g. flushes).
  void Drain(ibv_cq* cq) { Poll(cq, 1 << 20, std::chrono::milliseconds(200)); }

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_mr* mr_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* scq_ = nullptr;
  ibv_cq* rcq_ = nullptr;
  std::vector<ibv_qp*> qps_;
  std::vector<uint8_t> buf_;
};

TEST_F(Loopback, DeviceAndPortLookLikeARoceNic) {
  ibv_device_attr da{};
  ASSERT_EQ(ibv_query_device(ctx_, &da), 0);
  EXPECT_EQ(da.phys_port_cnt, 1);
  EXPECT_GT(da.max_qp_wr, 1000);
  ibv_port_attr pa{};
  ASSERT_EQ(ibv_query_port(ctx_, 1, &pa), 0);
  EXPECT_EQ(pa.state, IBV_PORT_ACTIVE);
  EXPECT_EQ(pa.link_layer, IBV_LINK_LAYER_ETHERNET);
  EXPECT_EQ(pa.active_mtu, IBV_MTU_1024);
  EXPECT_EQ(ibv_query_port(ctx_, 2, &pa), EINVAL);
  ibv_gid gid{};
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &gid), 0);
  const uint8_t mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 77, 0, 1};
  EXPECT_EQ(std::memcmp(gid.raw, mapped, 16), 0);  // default address 10.77.0.1
  EXPECT_EQ(ibv_query_gid(ctx_, 1, 1, &gid), -1);
  ibv_gid_entry e{};
  ASSERT_EQ(ibv_query_gid_ex(ctx_, 1, 0, &e, 0), 0);
  EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
  __be16 pkey = 0;
  ASSERT_EQ(ibv_query_pkey(ctx_, 1, 0, &pkey), 0);
  EXPECT_EQ(be16toh(pkey), 0xFFFF);
}

TEST_F(Loopback, SendRecvEverySizeAcrossSegmentBoundaries) {
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(a, b);
  std::mt19937 rng(7);
  const uint32_t sizes[] = {0, 1, 3, 4, 63, 64, 65, 1023, 1024, 1025, 4096, 65536, 300000};
  const size_t rx_off = 512 * 1024;
  uint64_t id = 0;
  for (uint32_t len : sizes) {
    for (uint32_t i = 0; i < len; ++i) buf_[i] = static_cast<uint8_t>(rng());
    std::memset(buf_.data() + rx_off, 0, len + 16);
    ASSERT_EQ(PostRecv(b, 1000 + id, rx_off, len + 16), 0);
    ASSERT_EQ(PostSend(a, id, 0, len, len <= 64 ? IBV_SEND_SIGNALED | IBV_SEND_INLINE : IBV_SEND_SIGNALED), 0);
    auto r = Poll(rcq_, 1);
    ASSERT_EQ(r.size(), 1u) << "len " << len;
    EXPECT_EQ(r[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(r[0].status);
    EXPECT_EQ(r[0].opcode, IBV_WC_RECV);
    EXPECT_EQ(r[0].byte_len, len);
    EXPECT_EQ(r[0].wr_id, 1000 + id);
    EXPECT_EQ(r[0].qp_num, b->qp_num);
    auto s = Poll(scq_, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(s[0].opcode, IBV_WC_SEND);
    EXPECT_EQ(s[0].wr_id, id);
    EXPECT_EQ(std::memcmp(buf_.data(), buf_.data() + rx_off, len), 0) << "len " << len;
    ++id;
  }
}

TEST_F(Loopback, CompletionChannelDeliversEventsAndHonoursNonblock) {
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  // Nothing pending: a non-blocking channel fd reports EAGAIN.
  const int fl = fcntl(channel_->fd, F_GETFL);
  ASSERT_EQ(fcntl(channel_->fd, F_SETFL, fl | O_NONBLOCK), 0);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(channel_, &ev_cq, &ev_ctx), -1);
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_EQ(fcntl(channel_->fd, F_SETFL, fl), 0);

  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(ibv_req_notify_cq(rcq_, 0), 0);
    ASSERT_EQ(PostRecv(b, i, 4096, 64), 0);
    ASSERT_EQ(PostSend(a, i, 0, 64), 0);
    pollfd p{channel_->fd, POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 10000), 1);  // readable while an event is pending
    ASSERT_EQ(ibv_get_cq_event(channel_, &ev_cq, &ev_ctx), 0);
    EXPECT_EQ(ev_cq, rcq_);
    EXPECT_EQ(ev_ctx, this);
    ibv_ack_cq_events(ev_cq, 1);
    EXPECT_EQ(Poll(rcq_, 1).size(), 1u);
    EXPECT_EQ(Poll(scq_, 1).size(), 1u);
  }
  // Arming is one-shot: with no re-arm, a completion raises no event.
  ASSERT_EQ(PostRecv(b, 99, 4096, 64), 0);
  ASSERT_EQ(PostSend(a, 99, 0, 64), 0);
  EXPECT_EQ(Poll(rcq_, 1).size(), 1u);
  pollfd p{channel_->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 50), 0);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);
}

TEST_F(Loopback, ReqNotifyExtensionReportsMissedEvents) {
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  EXPECT_EQ(droce_req_notify_cq(rcq_, 0), -EINVAL);
  EXPECT_EQ(droce_req_notify_cq(rcq_, DROCE_CQ_SOLICITED | DROCE_CQ_NEXT_COMP), -EINVAL);
  EXPECT_EQ(droce_req_notify_cq(rcq_, 8 | DROCE_CQ_NEXT_COMP), -EINVAL);
  EXPECT_EQ(droce_req_notify_cq(rcq_, DROCE_CQ_NEXT_COMP | DROCE_CQ_REPORT_MISSED_EVENTS), 0);
  ASSERT_EQ(PostRecv(b, 1, 4096, 64), 0);
  ASSERT_EQ(PostSend(a, 1, 0, 64), 0);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(channel_, &ev_cq, &ev_ctx), 0);
  ibv_ack_cq_events(ev_cq, 1);
  // The completion is still in the CQ: arming again must report it.
  EXPECT_GT(droce_req_notify_cq(rcq_, DROCE_CQ_NEXT_COMP | DROCE_CQ_REPORT_MISSED_EVENTS), 0);
  EXPECT_EQ(Poll(rcq_, 1).size(), 1u);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);
  // Consume the event the second arm may raise later, so destroy can finish.
  fcntl(channel_->fd, F_SETFL, fcntl(channel_->fd, F_GETFL) | O_NONBLOCK);
  while (ibv_get_cq_event(channel_, &ev_cq, &ev_ctx) == 0) ibv_ack_cq_events(ev_cq, 1);
}

TEST_F(Loopback, BadCallsGetTheDocumentedErrors) {
  ibv_qp* a = CreateQp(scq_, scq_);
  ASSERT_NE(a, nullptr);
  // Posting a send before RTS fails (EINVAL) and names the bad WR.
  EXPECT_EQ(PostSend(a, 1, 0, 8), EINVAL);
  // Posting a receive in RESET fails.
  EXPECT_EQ(PostRecv(a, 1, 0, 8), EINVAL);
  // RESET → RTR skips INIT.
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  EXPECT_EQ(ibv_modify_qp(a, &attr, IBV_QP_STATE), EINVAL);
  // A missing required attribute.
  attr.qp_state = IBV_QPS_INIT;
  EXPECT_EQ(ibv_modify_qp(a, &attr, IBV_QP_STATE | IBV_QP_PORT), EINVAL);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(a, &q, IBV_QP_STATE | IBV_QP_CAP, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_RESET);
  EXPECT_GE(qi.cap.max_inline_data, 64u);
  // Too many SGEs.
  ToInit(a);
  ibv_sge sges[8] = {};
  ibv_recv_wr rwr{};
  rwr.sg_list = sges;
  rwr.num_sge = 8;
  ibv_recv_wr* rbad = nullptr;
  EXPECT_EQ(ibv_post_recv(a, &rwr, &rbad), EINVAL);
  EXPECT_EQ(rbad, &rwr);
  // Unsupported QP types and objects fail cleanly.
  ibv_qp_init_attr raw{};
  raw.send_cq = scq_;
  raw.recv_cq = scq_;
  raw.qp_type = IBV_QPT_RAW_PACKET;
  raw.cap.max_send_wr = raw.cap.max_recv_wr = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd_, &raw), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);

  // An RDMA READ or atomic on a UC QP is not a valid opcode.
  ibv_qp_init_attr uc{};
  uc.send_cq = scq_;
  uc.recv_cq = scq_;
  uc.qp_type = IBV_QPT_UC;
  uc.cap.max_send_wr = uc.cap.max_recv_wr = 4;
  uc.cap.max_send_sge = uc.cap.max_recv_sge = 1;
  ibv_qp* ucqp = ibv_create_qp(pd_, &uc);
  ASSERT_NE(ucqp, nullptr);
  qps_.push_back(ucqp);
  // Objects still in use cannot be destroyed.
  EXPECT_EQ(ibv_destroy_cq(scq_), EBUSY);
  EXPECT_EQ(ibv_dealloc_pd(pd_), EBUSY);
  EXPECT_EQ(ibv_destroy_comp_channel(channel_), EBUSY);
  // Bad CQ sizes.
  errno = 0;
  EXPECT_EQ(ibv_create_cq(ctx_, 0, nullptr, nullptr, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // MR rights: remote write needs local write.
  errno = 0;
  EXPECT_EQ(ibv_reg_mr(pd_, buf_.data(), 64, IBV_ACCESS_REMOTE_WRITE), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

TEST_F(Loopback, BadLkeyFailsTheWqeAndFlushesTheRest) {
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  ASSERT_EQ(PostSend(a, 1, 0, 100, IBV_SEND_SIGNALED, 0xdead00), 0);
  ASSERT_EQ(PostSend(a, 2, 0, 100, 0), 0);  // unsignaled, still flushed
  auto c = Poll(scq_, 2);
  ASSERT_EQ(c.size(), 2u);
  EXPECT_EQ(c[0].wr_id, 1u);
  EXPECT_EQ(c[0].status, IBV_WC_LOC_PROT_ERR);
  EXPECT_EQ(c[1].wr_id, 2u);
  EXPECT_EQ(c[1].status, IBV_WC_WR_FLUSH_ERR);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(a, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_ERR);
}

TEST_F(Loopback, ReceiveTooSmallIsLengthErrorOnBothSides) {
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  ASSERT_EQ(PostRecv(b, 5, 4096, 10), 0);
  ASSERT_EQ(PostRecv(b, 6, 4096, 10), 0);
  ASSERT_EQ(PostSend(a, 7, 0, 100), 0);
  auto r = Poll(rcq_, 2);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].status, IBV_WC_LOC_LEN_ERR);
  EXPECT_EQ(r[1].status, IBV_WC_WR_FLUSH_ERR);  // the responder QP went to ERR
  auto s = Poll(scq_, 1);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].status, IBV_WC_REM_INV_REQ_ERR);
}

TEST_F(Loopback, FullCqRaisesCqErrAndMovesTheQpToError) {
  ibv_cq* tiny = ibv_create_cq(ctx_, 2, nullptr, nullptr, 0);
  ASSERT_NE(tiny, nullptr);
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, tiny);
  Connect(a, b);
  const int cap = tiny->cqe;
  for (int i = 0; i < cap + 1; ++i) ASSERT_EQ(PostRecv(b, i, 4096, 64), 0);
  for (int i = 0; i < cap + 1; ++i) ASSERT_EQ(PostSend(a, i, 0, 8), 0);
  pollfd p{ctx_->async_fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(ev.element.cq, tiny);
  ibv_ack_async_event(&ev);
  // Nothing already in the CQ was lost.
  auto r = Poll(tiny, cap);
  EXPECT_EQ(static_cast<int>(r.size()), cap);
  for (auto& w : r) EXPECT_EQ(w.status, IBV_WC_SUCCESS);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(b, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_ERR);
  Poll(scq_, cap + 1);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  qps_.pop_back();
  EXPECT_EQ(ibv_destroy_cq(tiny), 0);
}

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
  const uint64_t value = 1;
  ibv_wr_atomic_write(x, 1, 0, &value);
  EXPECT_EQ(ibv_wr_complete(x), EOPNOTSUPP);
  // Asking for an operation droce does not implement refuses the QP.
  ax.send_ops_flags = IBV_QP_EX_WITH_ATOMIC_WRITE;
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(ctx_, &ax), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}


TEST_F(Loopback, RdmaWriteReadAndAtomics) {
  ibv_mr* remote = ibv_reg_mr(pd_, buf_.data() + 256 * 1024, 256 * 1024,
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                  IBV_ACCESS_REMOTE_ATOMIC);
  ASSERT_NE(remote, nullptr);
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  ibv_qp_attr acc{};
  acc.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  Connect(a, b);
  ASSERT_EQ(ibv_modify_qp(b, &acc, IBV_QP_ACCESS_FLAGS), 0);
  uint8_t* rbuf = buf_.data() + 256 * 1024;
  std::mt19937 rng(3);
  auto post = [&](ibv_wr_opcode op, uint64_t wr_id, size_t loff, uint32_t len, uint64_t raddr,
                  uint64_t cmp = 0, uint64_t swp = 0) {
    ibv_sge s{reinterpret_cast<uint64_t>(buf_.data() + loff), len, mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      wr.wr.atomic.remote_addr = raddr;
      wr.wr.atomic.rkey = remote->rkey;
      wr.wr.atomic.compare_add = cmp;
      wr.wr.atomic.swap = swp;
    } else {
      wr.wr.rdma.remote_addr = raddr;
      wr.wr.rdma.rkey = remote->rkey;
    }
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(a, &wr, &bad);
  };
  for (uint32_t len : {1u, 1024u, 5000u, 65536u}) {
    for (uint32_t i = 0; i < len; ++i) buf_[i] = static_cast<uint8_t>(rng());
    ASSERT_EQ(post(IBV_WR_RDMA_WRITE, 1, 0, len, reinterpret_cast<uint64_t>(rbuf)), 0);
    auto w = Poll(scq_, 1);
    ASSERT_EQ(w.size(), 1u);
    EXPECT_EQ(w[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(w[0].opcode, IBV_WC_RDMA_WRITE);
    EXPECT_EQ(std::memcmp(buf_.data(), rbuf, len), 0) << len;
    // Read it back into another local buffer.
    std::memset(buf_.data() + 128 * 1024, 0, len);
    ASSERT_EQ(post(IBV_WR_RDMA_READ, 2, 128 * 1024, len, reinterpret_cast<uint64_t>(rbuf)), 0);
    auto r = Poll(scq_, 1);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].status, IBV_WC_SUCCESS) << ibv_wc_status_str(r[0].status);
    EXPECT_EQ(r[0].opcode, IBV_WC_RDMA_READ);
    EXPECT_EQ(std::memcmp(buf_.data() + 128 * 1024, rbuf, len), 0) << len;
  }
  // Atomics on an aligned remote word; the original value comes back in host order.
  uint64_t word = 100;
  std::memcpy(rbuf + 64, &word, 8);
  ASSERT_EQ(post(IBV_WR_ATOMIC_FETCH_AND_ADD, 3, 1000, 8, reinterpret_cast<uint64_t>(rbuf + 64), 5), 0);
  auto f = Poll(scq_, 1);
  ASSERT_EQ(f.size(), 1u);
  EXPECT_EQ(f[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(f[0].opcode, IBV_WC_FETCH_ADD);
  uint64_t orig = 0;
  std::memcpy(&orig, buf_.data() + 1000, 8);
  EXPECT_EQ(orig, 100u);
  std::memcpy(&word, rbuf + 64, 8);
  EXPECT_EQ(word, 105u);
  ASSERT_EQ(post(IBV_WR_ATOMIC_CMP_AND_SWP, 4, 1000, 8, reinterpret_cast<uint64_t>(rbuf + 64), 105, 7), 0);
  ASSERT_EQ(Poll(scq_, 1).size(), 1u);
  std::memcpy(&word, rbuf + 64, 8);
  EXPECT_EQ(word, 7u);
  ASSERT_EQ(post(IBV_WR_ATOMIC_CMP_AND_SWP, 5, 1000, 8, reinterpret_cast<uint64_t>(rbuf + 64), 1, 9), 0);
  ASSERT_EQ(Poll(scq_, 1).size(), 1u);
  std::memcpy(&word, rbuf + 64, 8);
  EXPECT_EQ(word, 7u);  // compare failed: unchanged
  // A WRITE outside the remote MR gets a remote access error.
  ASSERT_EQ(post(IBV_WR_RDMA_WRITE, 6, 0, 64, reinterpret_cast<uint64_t>(rbuf) + 256 * 1024 - 32), 0);
  auto e = Poll(scq_, 1);
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].status, IBV_WC_REM_ACCESS_ERR);
  EXPECT_EQ(ibv_destroy_qp(a), 0);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  qps_.clear();
  EXPECT_EQ(ibv_dereg_mr(remote), 0);
}

TEST_F(Loopback, WriteWithImmediateConsumesAReceive) {
  ibv_mr* remote = ibv_reg_mr(pd_, buf_.data() + 256 * 1024, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  ibv_qp_attr acc{};
  acc.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ASSERT_EQ(ibv_modify_qp(b, &acc, IBV_QP_ACCESS_FLAGS), 0);
  ASSERT_EQ(PostRecv(b, 77, 8192, 16), 0);
  std::memcpy(buf_.data(), "0123456789", 10);
  ibv_sge s{reinterpret_cast<uint64_t>(buf_.data()), 10, mr_->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.imm_data = htobe32(0xabcdef);
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(buf_.data() + 256 * 1024);
  wr.wr.rdma.rkey = remote->rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a, &wr, &bad), 0);
  auto r = Poll(rcq_, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(r[0].opcode, IBV_WC_RECV_RDMA_WITH_IMM);
  EXPECT_EQ(r[0].wr_id, 77u);
  EXPECT_EQ(r[0].byte_len, 10u);
  EXPECT_EQ(be32toh(r[0].imm_data), 0xabcdefu);
  EXPECT_EQ(std::memcmp(buf_.data() + 256 * 1024, "0123456789", 10), 0);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);
  EXPECT_EQ(ibv_destroy_qp(a), 0);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  qps_.clear();
  EXPECT_EQ(ibv_dereg_mr(remote), 0);
}

TEST_F(Loopback, UcSendAndWrite) {
  ibv_qp_init_attr a{};
  a.send_cq = scq_;
  a.recv_cq = rcq_;
  a.cap.max_send_wr = a.cap.max_recv_wr = 16;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  a.qp_type = IBV_QPT_UC;
  ibv_qp* x = ibv_create_qp(pd_, &a);
  ibv_qp* y = ibv_create_qp(pd_, &a);
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  qps_.push_back(x);
  qps_.push_back(y);
  for (ibv_qp* q : {x, y}) ToInit(q);
  // UC RTR needs no MAX_DEST_RD_ATOMIC/MIN_RNR_TIMER; RTS only SQ_PSN.
  for (auto [q, peer] : {std::pair{x, y}, std::pair{y, x}}) {
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTR;
    r.path_mtu = IBV_MTU_1024;
    r.dest_qp_num = peer->qp_num;
    r.ah_attr.is_global = 1;
    r.ah_attr.port_num = 1;
    ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &r.ah_attr.grh.dgid), 0);
    ASSERT_EQ(ibv_modify_qp(q, &r, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN), 0);
  }
  for (ibv_qp* q : {x, y}) {
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_RTS;
    ASSERT_EQ(ibv_modify_qp(q, &r, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
  }
  for (int i = 0; i < 10; ++i) {
    std::memset(buf_.data(), 'a' + i, 3000);
    ASSERT_EQ(PostRecv(y, 100 + i, 8192, 4096), 0);
    ASSERT_EQ(PostSend(x, i, 0, 3000), 0);
    auto s = Poll(scq_, 1);
    ASSERT_EQ(s.size(), 1u);
    EXPECT_EQ(s[0].status, IBV_WC_SUCCESS);
    auto r = Poll(rcq_, 1);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(r[0].byte_len, 3000u);
    EXPECT_EQ(buf_[8192 + 2999], 'a' + i);
  }
}

TEST_F(Loopback, UdSendWithGrhAndAddressHandles) {
  ibv_qp_init_attr a{};
  a.send_cq = scq_;
  a.recv_cq = rcq_;
  a.cap.max_send_wr = a.cap.max_recv_wr = 16;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  a.qp_type = IBV_QPT_UD;
  ibv_qp* x = ibv_create_qp(pd_, &a);
  ibv_qp* y = ibv_create_qp(pd_, &a);
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  qps_.push_back(x);
  qps_.push_back(y);
  for (ibv_qp* q : {x, y}) {
    ibv_qp_attr r{};
    r.qp_state = IBV_QPS_INIT;
    r.port_num = 1;
    r.qkey = 0x11111111;
    ASSERT_EQ(ibv_modify_qp(q, &r, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
    r.qp_state = IBV_QPS_RTR;
    ASSERT_EQ(ibv_modify_qp(q, &r, IBV_QP_STATE), 0);
    r.qp_state = IBV_QPS_RTS;
    ASSERT_EQ(ibv_modify_qp(q, &r, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
  }
  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 1;
  ah_attr.port_num = 1;
  ah_attr.grh.hop_limit = 1;
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &ah_attr.grh.dgid), 0);
  ibv_ah* ah = ibv_create_ah(pd_, &ah_attr);
  ASSERT_NE(ah, nullptr);
  std::memcpy(buf_.data(), "ud payload", 10);
  ASSERT_EQ(PostRecv(y, 9, 8192, 40 + 64), 0);
  ibv_sge s{reinterpret_cast<uint64_t>(buf_.data()), 10, mr_->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = y->qp_num;
  wr.wr.ud.remote_qkey = 0x11111111;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(x, &wr, &bad), 0);
  auto r = Poll(rcq_, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(r[0].byte_len, 50u);
  EXPECT_EQ(r[0].src_qp, x->qp_num);
  EXPECT_TRUE(r[0].wc_flags & IBV_WC_GRH);
  EXPECT_EQ(std::memcmp(buf_.data() + 8192 + 40, "ud payload", 10), 0);
  EXPECT_EQ(buf_[8192 + 20] >> 4, 4);  // the IPv4 header sits in the GRH's last 20 bytes
  // An AH built from the completion points back at the sender.
  ibv_ah* back = ibv_create_ah_from_wc(pd_, &r[0], reinterpret_cast<ibv_grh*>(buf_.data() + 8192), 1);
  ASSERT_NE(back, nullptr);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);
  // A wrong Q_Key is dropped silently (IBA 10.2.5).
  ASSERT_EQ(PostRecv(y, 10, 8192, 40 + 64), 0);
  wr.wr.ud.remote_qkey = 0x22222222;
  ASSERT_EQ(ibv_post_send(x, &wr, &bad), 0);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);
  usleep(20000);
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(rcq_, 1, &wc), 0);
  EXPECT_EQ(ibv_destroy_ah(back), 0);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
}

TEST_F(Loopback, SharedReceiveQueueFeedsSeveralQps) {
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 64;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd_, &sa);
  ASSERT_NE(srq, nullptr);
  ibv_qp_init_attr a{};
  a.send_cq = scq_;
  a.recv_cq = rcq_;
  a.srq = srq;
  a.cap.max_send_wr = 16;
  a.cap.max_send_sge = 1;
  a.qp_type = IBV_QPT_RC;
  ibv_qp* r1 = ibv_create_qp(pd_, &a);
  ibv_qp* r2 = ibv_create_qp(pd_, &a);
  ibv_qp* s1 = CreateQp(scq_, scq_);
  ibv_qp* s2 = CreateQp(scq_, scq_);
  ASSERT_NE(r1, nullptr);
  ASSERT_NE(r2, nullptr);
  Connect(s1, r1);
  Connect(s2, r2);
  for (int i = 0; i < 8; ++i) {
    ibv_sge s{reinterpret_cast<uint64_t>(buf_.data() + 8192 + i * 128), 128, mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = 500 + i;
    wr.sg_list = &s;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_srq_recv(srq, &wr, &bad), 0);
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(PostSend(s1, i, 0, 64), 0);
    ASSERT_EQ(PostSend(s2, 10 + i, 0, 64), 0);
  }
  auto r = Poll(rcq_, 8);
  ASSERT_EQ(r.size(), 8u);
  int on1 = 0;
  for (auto& w : r) {
    EXPECT_EQ(w.status, IBV_WC_SUCCESS);
    on1 += w.qp_num == r1->qp_num;
  }
  EXPECT_EQ(on1, 4);
  EXPECT_EQ(Poll(scq_, 8).size(), 8u);
  ibv_srq_attr q{};
  ASSERT_EQ(ibv_query_srq(srq, &q), 0);
  EXPECT_GE(q.max_wr, 64u);
  EXPECT_EQ(ibv_destroy_srq(srq), EBUSY);
  EXPECT_EQ(ibv_destroy_qp(r1), 0);
  EXPECT_EQ(ibv_destroy_qp(r2), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
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
  ibv_qp_attr acc{};
  acc.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ASSERT_EQ(ibv_modify_qp(b, &acc, IBV_QP_ACCESS_FLAGS), 0);
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
  ASSERT_EQ(ibv_modify_qp(b, &acc, IBV_QP_ACCESS_FLAGS), 0);
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


// The extended CQ: start/next/end polling, the fields asked for, completion
// timestamps that grow; ibv_resize_cq keeps completions not yet polled.
TEST_F(Loopback, ExtendedCqPollingTimestampsAndResize) {
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 8;
  ca.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
  ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &ca);
  ASSERT_NE(cqx, nullptr);
  ibv_cq* cq = ibv_cq_ex_to_cq(cqx);
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, cq);
  Connect(a, b);
  ibv_poll_cq_attr pa{};
  EXPECT_EQ(ibv_start_poll(cqx, &pa), ENOENT);  // empty: no ibv_end_poll
  for (int i = 0; i < 6; ++i) ASSERT_EQ(PostRecv(b, 100 + i, 4096 + i * 128, 128), 0);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(PostSend(a, i, 0, 10 + i), 0);
  ASSERT_EQ(Poll(scq_, 3).size(), 3u);
  // Grow the CQ while three completions wait in it; none may be lost.
  usleep(20000);
  ASSERT_EQ(ibv_resize_cq(cq, 100), 0);
  EXPECT_GE(cq->cqe, 100);
  for (int i = 3; i < 6; ++i) ASSERT_EQ(PostSend(a, i, 0, 10 + i), 0);
  ASSERT_EQ(Poll(scq_, 3).size(), 3u);
  usleep(20000);
  std::vector<uint64_t> ids;
  uint64_t last_ts = 0;
  int rc = ibv_start_poll(cqx, &pa);
  ASSERT_EQ(rc, 0);
  while (rc == 0) {
    EXPECT_EQ(cqx->status, IBV_WC_SUCCESS);
    EXPECT_EQ(ibv_wc_read_opcode(cqx), IBV_WC_RECV);
    EXPECT_EQ(ibv_wc_read_qp_num(cqx), b->qp_num);
    EXPECT_EQ(ibv_wc_read_byte_len(cqx), 10 + (cqx->wr_id - 100));
    const uint64_t ts = ibv_wc_read_completion_ts(cqx);
    EXPECT_GE(ts, last_ts);
    last_ts = ts;
    ids.push_back(cqx->wr_id);
    rc = ibv_next_poll(cqx);
  }
  EXPECT_EQ(rc, ENOENT);
  ibv_end_poll(cqx);
  ASSERT_EQ(ids.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(ids[i], 100u + i);
  ibv_device_attr_ex dx{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &dx), 0);
  EXPECT_EQ(dx.hca_core_clock, 1000000u);
  // Shrinking below what is pending is refused.
  for (int i = 0; i < 4; ++i) ASSERT_EQ(PostRecv(b, 200 + i, 4096, 128), 0);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(PostSend(a, 10 + i, 0, 8), 0);
  ASSERT_EQ(Poll(scq_, 4).size(), 4u);
  usleep(20000);
  EXPECT_EQ(ibv_resize_cq(cq, 2), EINVAL);
  Drain(cq);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  qps_.pop_back();
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  // Unsupported extended fields are refused at creation.
  ca.wc_flags = IBV_WC_EX_WITH_FLOW_TAG;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &ca), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
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


// ibv_destroy_qp waits for the async events of the QP that the application
// read but did not acknowledge; events never read are dropped (the kernel's
// and libibverbs' rule).
TEST_F(Loopback, DestroyQpWaitsForReadButUnackedEvents) {
  auto drain_to_sqd = [&](ibv_qp* q) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_SQD;
    attr.en_sqd_async_notify = 1;
    ASSERT_EQ(ibv_modify_qp(q, &attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY), 0);
    pollfd p{ctx_->async_fd, POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 5000), 1);
  };
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  drain_to_sqd(a);  // an SQ_DRAINED event is queued, never read
  EXPECT_EQ(ibv_destroy_qp(a), 0);
  std::erase(qps_, a);
  ibv_qp* c = CreateQp(scq_, scq_);
  ibv_qp* d = CreateQp(scq_, rcq_);
  Connect(c, d);
  drain_to_sqd(c);
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  ASSERT_EQ(ev.element.qp, c);
  std::atomic<bool> acked{false};
  std::thread acker([&] {
    usleep(100000);
    acked = true;
    ibv_ack_async_event(&ev);
  });
  EXPECT_EQ(ibv_destroy_qp(c), 0);
  EXPECT_TRUE(acked.load());  // it returned only after the acknowledgement
  acker.join();
  std::erase(qps_, c);
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
  ibv_qp_attr acc{};
  acc.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  ASSERT_EQ(ibv_modify_qp(b, &acc, IBV_QP_ACCESS_FLAGS), 0);
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

// Per-QP counters through the extension API (include/droce/droce.h): real
// traffic moves the right QP's counters, an RNR NAK shows on both sides, an
// idle QP stays at zero.
TEST_F(Loopback, PerQpCountersCountTrafficAndRnr) {
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  ibv_qp* idle = CreateQp(scq_, rcq_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(idle, nullptr);
  Connect(a, b);

  const int count = droce_query_qp_counters(a, nullptr, 0);
  ASSERT_GT(count, 0);
  EXPECT_STREQ(droce_qp_counter_name(0), "sent_pkts");
  EXPECT_EQ(droce_qp_counter_name(count), nullptr);
  EXPECT_EQ(droce_qp_counter_description(count), nullptr);
  for (int i = 0; i < count; ++i) {
    ASSERT_NE(droce_qp_counter_name(i), nullptr);
    ASSERT_NE(droce_qp_counter_description(i), nullptr);
  }
  auto index = [&](const char* name) {
    for (int i = 0; i < count; ++i) {
      if (std::strcmp(droce_qp_counter_name(i), name) == 0) return i;
    }
    ADD_FAILURE() << "no counter " << name;
    return 0;
  };
  auto read = [&](ibv_qp* qp) {
    std::vector<uint64_t> v(count);
    EXPECT_EQ(droce_query_qp_counters(qp, v.data(), count), count);
    return v;
  };
  EXPECT_EQ(droce_query_qp_counters(nullptr, nullptr, 0), -EINVAL);
  EXPECT_EQ(droce_query_qp_counters(a, nullptr, 1), -EINVAL);
  uint64_t one = 12345;
  EXPECT_EQ(droce_query_qp_counters(a, &one, 1), count);  // a prefix only
  EXPECT_EQ(one, 0u);

  const int sent = index("sent_pkts"), rcvd = index("rcvd_pkts");
  constexpr int kMsgs = 10;
  for (int i = 0; i < kMsgs; ++i) ASSERT_EQ(PostRecv(b, 100 + i, 4096 + 64 * i, 64), 0);
  for (int i = 0; i < kMsgs; ++i) ASSERT_EQ(PostSend(a, i, 0, 64), 0);
  ASSERT_EQ(Poll(rcq_, kMsgs).size(), static_cast<size_t>(kMsgs));
  ASSERT_EQ(Poll(scq_, kMsgs).size(), static_cast<size_t>(kMsgs));
  std::vector<uint64_t> va = read(a), vb = read(b);
  EXPECT_GE(va[sent], static_cast<uint64_t>(kMsgs));  // retransmissions would add to it
  EXPECT_EQ(vb[rcvd], static_cast<uint64_t>(kMsgs));  // no loss on the loopback link
  EXPECT_GE(vb[sent], 1u);  // ACKs
  EXPECT_GE(va[rcvd], 1u);
  EXPECT_EQ(va[index("rcvd_rnr_err")], 0u);

  // No receive posted: b answers with RNR NAKs until one is.
  ASSERT_EQ(PostSend(a, 50, 0, 64), 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (read(b)[index("send_rnr_err")] == 0 && std::chrono::steady_clock::now() < deadline) {
    ibv_wc wc;
    EXPECT_EQ(ibv_poll_cq(scq_, 1, &wc), 0);  // drives the engine
    usleep(100);
  }
  ASSERT_EQ(PostRecv(b, 200, 8192, 64), 0);
  ASSERT_EQ(Poll(rcq_, 1).size(), 1u);
  ASSERT_EQ(Poll(scq_, 1).size(), 1u);
  va = read(a);
  vb = read(b);
  EXPECT_GE(vb[index("send_rnr_err")], 1u);
  EXPECT_GE(va[index("rcvd_rnr_err")], 1u);
  EXPECT_GE(vb[rcvd], static_cast<uint64_t>(kMsgs + 2));  // the RNR-NAKed try and the retry
  for (uint64_t v : read(idle)) EXPECT_EQ(v, 0u);
}
