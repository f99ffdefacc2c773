// The verbs provider in one process on droce0's default loopback link: two
// RC QPs connected to each other, as conformance suites run on a hardware
// NIC. Also checks the errors the verbs API specifies for bad calls.
// The binary links libdroce.so ahead of libibverbs, so ibv_* resolve to droce
// exactly as they do under LD_PRELOAD.
#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <random>
#include <thread>
#include <vector>
#include <algorithm>
#include <atomic>

#include "droce/droce.h"
#include "provider.h"  // white-box: the hostile-ring tests
#include "ud_qp.h"

// libibverbs' private and sysfs calls that ibv_devinfo imports; their
// declarations are not in the installed headers.
extern "C" int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index, int* type);
extern "C" int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size);

namespace {

using droce::test::CreateUdQp;

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
  // To the device's own GID at gid_index (0: IPv4-mapped, 1: IPv6).
  void ToRtr(ibv_qp* qp, uint32_t dest, int gid_index = 0) {
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
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index);
    ASSERT_EQ(ibv_query_gid(ctx_, 1, gid_index, &a.ah_attr.grh.dgid), 0);
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
  void Connect(ibv_qp* a, ibv_qp* b, int gid_index = 0) {
    ToInit(a);
    ToInit(b);
    ToRtr(a, b->qp_num, gid_index);
    ToRtr(b, a->qp_num, gid_index);
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
  // Two UC QPs connected through the device's GID at gid_index exchange ten
  // 3000-byte SENDs.
  void UcSends(int gid_index) {
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
      r.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index);
      ASSERT_EQ(ibv_query_gid(ctx_, 1, gid_index, &r.ah_attr.grh.dgid), 0);
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
  ibv_srq* CreateSrq(uint32_t max_wr) {
    ibv_srq_init_attr sa{};
    sa.attr.max_wr = max_wr;
    sa.attr.max_sge = 1;
    return ibv_create_srq(pd_, &sa);
  }
  // An RC QP that receives from srq into rcq_ (the test destroys it before
  // the SRQ; it is not in qps_).
  ibv_qp* CreateSrqQp(ibv_srq* srq) {
    ibv_qp_init_attr a{};
    a.send_cq = scq_;
    a.recv_cq = rcq_;
    a.srq = srq;
    a.cap.max_send_wr = 16;
    a.cap.max_send_sge = 1;
    a.qp_type = IBV_QPT_RC;
    return ibv_create_qp(pd_, &a);
  }
  int PostSrqRecv(ibv_srq* srq, uint64_t wr_id, size_t off, uint32_t len) {
    ibv_sge sg{reinterpret_cast<uint64_t>(buf_.data() + off), len, mr_->lkey};
    ibv_recv_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sg;
    wr.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_srq_recv(srq, &wr, &bad);
  }
  // The next async event, acknowledged; event_type -1 (not a valid
  // ibv_event_type, hence an int) if none came in time.
  struct AsyncEvent {
    int event_type = -1;
    decltype(ibv_async_event::element) element{};
  };
  AsyncEvent NextAsyncEvent(int timeout_ms = 10000) {
    AsyncEvent out;
    ibv_async_event ev{};
    pollfd p{ctx_->async_fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) == 1 && ibv_get_async_event(ctx_, &ev) == 0) {
      out.event_type = ev.event_type;
      out.element = ev.element;
      ibv_ack_async_event(&ev);
    }
    return out;
  }
  ibv_qp_state State(ibv_qp* qp) {
    ibv_qp_attr q{};
    ibv_qp_init_attr qi{};
    EXPECT_EQ(ibv_query_qp(qp, &q, IBV_QP_STATE, &qi), 0);
    return q.qp_state;
  }

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
  EXPECT_EQ(ibv_query_gid(ctx_, 1, 1, &gid), -1);  // no DROCE_IP6: one GID
  EXPECT_EQ(pa.gid_tbl_len, 1);
  ibv_gid_entry e{};
  ASSERT_EQ(ibv_query_gid_ex(ctx_, 1, 0, &e, 0), 0);
  EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
  EXPECT_EQ(ibv_query_gid_ex(ctx_, 1, 1, &e, 0), ENODATA);
  // An IPv6 GID needs the port's IPv6 address at index 1.
  ibv_ah_attr ah{};
  ah.is_global = 1;
  ah.port_num = 1;
  ah.grh.sgid_index = 1;
  ah.grh.dgid.raw[0] = 0xfd;
  ah.grh.dgid.raw[15] = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_ah(pd_, &ah), nullptr);
  EXPECT_EQ(errno, EINVAL);
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
  // IBA 11.6.3.1: the responder reports an invalid request on its QP.
  const AsyncEvent ev = NextAsyncEvent();
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_REQ_ERR);
  EXPECT_EQ(ev.element.qp, b);
  EXPECT_EQ(NextAsyncEvent(50).event_type, -1) << "the requester's error is a completion, not an event";
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
  // The QP whose completion did not fit goes to ERR with QP_FATAL.
  const AsyncEvent fatal = NextAsyncEvent();
  EXPECT_EQ(fatal.event_type, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(fatal.element.qp, b);
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

TEST_F(Loopback, RemoteAccessViolationRaisesAccessErrOnTheResponder) {
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  // The QP allows RDMA WRITE (without that the request itself is invalid);
  // the MR behind the rkey does not.
  ibv_qp_attr acc{};
  acc.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  ASSERT_EQ(ibv_modify_qp(b, &acc, IBV_QP_ACCESS_FLAGS), 0);
  ibv_sge s{reinterpret_cast<uint64_t>(buf_.data()), 64, mr_->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(buf_.data() + 4096);
  wr.wr.rdma.rkey = mr_->rkey;  // registered without REMOTE_WRITE
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a, &wr, &bad), 0);
  auto c = Poll(scq_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, IBV_WC_REM_ACCESS_ERR);
  const AsyncEvent ev = NextAsyncEvent();
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
  EXPECT_EQ(ev.element.qp, b);
  EXPECT_EQ(State(b), IBV_QPS_ERR);
  EXPECT_EQ(State(a), IBV_QPS_ERR);
}

TEST_F(Loopback, FirstPacketInRtrRaisesCommEstOnce) {
  // IBA 11.6.3.1: a QP in RTR that receives its first packet raises
  // COMM_EST (connection managers move it to RTS on that event).
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  ToInit(a);
  ToInit(b);
  ToRtr(a, b->qp_num);
  ToRtr(b, a->qp_num);
  ToRts(a);  // b stays in RTR
  for (int i = 0; i < 3; ++i) ASSERT_EQ(PostRecv(b, i, 4096 + i * 64, 64), 0);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(PostSend(a, i, 0, 64), 0);
  EXPECT_EQ(Poll(rcq_, 3).size(), 3u);
  EXPECT_EQ(Poll(scq_, 3).size(), 3u);
  const AsyncEvent ev = NextAsyncEvent();
  EXPECT_EQ(ev.event_type, IBV_EVENT_COMM_EST);
  EXPECT_EQ(ev.element.qp, b);
  EXPECT_EQ(NextAsyncEvent(50).event_type, -1) << "once per connection, not per packet";
  EXPECT_EQ(State(b), IBV_QPS_RTR);
}

TEST_F(Loopback, SrqLimitAndLastWqeReached) {
  ibv_srq* srq = CreateSrq(16);
  ASSERT_NE(srq, nullptr);
  ibv_qp* r = CreateSrqQp(srq);
  ASSERT_NE(r, nullptr);
  ibv_qp* s = CreateQp(scq_, scq_);
  Connect(s, r);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(PostSrqRecv(srq, 100 + i, 8192 + i * 128, 128), 0);
  ibv_srq_attr lim{};
  lim.srq_limit = 5;
  ASSERT_EQ(ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT), 0);
  // 8 posted, limit 5: the 4th receive leaves 4 < 5 and fires the event once.
  for (int i = 0; i < 3; ++i) ASSERT_EQ(PostSend(s, i, 0, 32), 0);
  EXPECT_EQ(Poll(rcq_, 3).size(), 3u);
  EXPECT_EQ(NextAsyncEvent(100).event_type, -1) << "5 WQEs left: not below the limit yet";
  for (int i = 3; i < 6; ++i) ASSERT_EQ(PostSend(s, i, 0, 32), 0);
  EXPECT_EQ(Poll(rcq_, 3).size(), 3u);
  AsyncEvent ev = NextAsyncEvent();
  EXPECT_EQ(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
  EXPECT_EQ(ev.element.srq, srq);
  EXPECT_EQ(NextAsyncEvent(50).event_type, -1) << "the limit disarms when it fires";
  ibv_srq_attr q{};
  ASSERT_EQ(ibv_query_srq(srq, &q), 0);
  EXPECT_EQ(q.srq_limit, 0u);
  EXPECT_EQ(Poll(scq_, 6).size(), 6u);
  // A QP on an SRQ that enters ERR reports its last WQE (IBA 11.6.3.1).
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(r, &err, IBV_QP_STATE), 0);
  ev = NextAsyncEvent();
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
  EXPECT_EQ(ev.element.qp, r);
  EXPECT_EQ(ibv_destroy_qp(r), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

TEST_F(Loopback, CorruptSrqRingRaisesSrqErrAndFailsItsQps) {
  // A program that scribbles on the shared SRQ ring (a producer index far
  // beyond the capacity) breaks the SRQ, not the engine: IBV_EVENT_SRQ_ERR,
  // and the QPs on it go to ERR and report their last WQE.
  ibv_srq* srq = CreateSrq(8);
  ASSERT_NE(srq, nullptr);
  ibv_qp* r = CreateSrqQp(srq);
  ASSERT_NE(r, nullptr);
  ibv_qp* s = CreateQp(scq_, scq_);
  Connect(s, r);
  ASSERT_EQ(PostSrqRecv(srq, 1, 8192, 128), 0);
  ASSERT_EQ(PostSend(s, 1, 0, 32), 0);
  ASSERT_EQ(Poll(rcq_, 1).size(), 1u);
  ASSERT_EQ(Poll(scq_, 1).size(), 1u);

  droce::provider::Srq* ps = droce::provider::to_srq(srq);
  ps->handle.ring.publish_prod(ps->prod + 1000);
  ASSERT_EQ(PostSend(s, 2, 0, 32), 0);
  bool srq_err = false, last_wqe = false;
  for (int i = 0; i < 2; ++i) {
    const AsyncEvent ev = NextAsyncEvent();
    if (ev.event_type == IBV_EVENT_SRQ_ERR && ev.element.srq == srq) srq_err = true;
    if (ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && ev.element.qp == r) last_wqe = true;
  }
  EXPECT_TRUE(srq_err);
  EXPECT_TRUE(last_wqe);
  EXPECT_EQ(State(r), IBV_QPS_ERR);
  EXPECT_EQ(ibv_destroy_qp(r), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

TEST_F(Loopback, OneCqSharedByManyQpsPolledByManyThreads) {
  // Four QP pairs complete into one send CQ and one receive CQ, and four
  // threads poll each CQ at once (ibv_poll_cq is thread-safe per libibverbs):
  // every completion is seen exactly once, with the right QP.
  constexpr int kPairs = 4, kMsgs = 2000, kThreads = 4;
  ibv_cq* scq = ibv_create_cq(ctx_, 4096, nullptr, nullptr, 0);
  ibv_cq* rcq = ibv_create_cq(ctx_, 4096, nullptr, nullptr, 0);
  ASSERT_NE(scq, nullptr);
  ASSERT_NE(rcq, nullptr);
  std::vector<ibv_qp*> senders, receivers;
  for (int p = 0; p < kPairs; ++p) {
    senders.push_back(CreateQp(scq, scq, 256));
    receivers.push_back(CreateQp(scq, rcq, 256));
    ASSERT_NE(senders.back(), nullptr);
    ASSERT_NE(receivers.back(), nullptr);
    Connect(senders.back(), receivers.back());
  }
  std::vector<std::atomic<int>> seen(2 * kPairs * kMsgs);
  std::atomic<int> total{0}, bad{0};
  auto index_of = [&](const ibv_wc& wc) {
    // wr_id = pair * kMsgs + i; receives are offset by kPairs * kMsgs.
    return static_cast<int>(wc.wr_id);
  };
  std::atomic<bool> stop{false};
  auto poller = [&](ibv_cq* cq, bool recv) {
    ibv_wc wc[8];
    while (!stop.load()) {
      const int k = ibv_poll_cq(cq, 8, wc);
      if (k < 0) ++bad;
      for (int i = 0; i < k; ++i) {
        const int idx = index_of(wc[i]);
        const int pair = (idx % (kPairs * kMsgs)) / kMsgs;
        const ibv_qp* want = recv ? receivers[pair] : senders[pair];
        if (wc[i].status != IBV_WC_SUCCESS || idx < 0 || idx >= 2 * kPairs * kMsgs ||
            (idx >= kPairs * kMsgs) != recv || wc[i].qp_num != want->qp_num) {
          ++bad;
          continue;
        }
        seen[idx].fetch_add(1);
        total.fetch_add(1);
      }
      if (k == 0) std::this_thread::yield();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back(poller, scq, false);
    threads.emplace_back(poller, rcq, true);
  }
  // Keep at most 128 messages in flight per pair (the queues hold 256).
  for (int base = 0; base < kMsgs; base += 128) {
    for (int p = 0; p < kPairs; ++p) {
      for (int i = base; i < base + 128 && i < kMsgs; ++i) {
        ibv_sge sg{reinterpret_cast<uint64_t>(buf_.data() + 65536 + p * 4096), 64, mr_->lkey};
        ibv_recv_wr rw{};
        rw.wr_id = kPairs * kMsgs + p * kMsgs + i;
        rw.sg_list = &sg;
        rw.num_sge = 1;
        ibv_recv_wr* rbad = nullptr;
        ASSERT_EQ(ibv_post_recv(receivers[p], &rw, &rbad), 0);
        ASSERT_EQ(PostSend(senders[p], p * kMsgs + i, 0, 16), 0);
      }
    }
    const int want = 2 * kPairs * std::min(base + 128, kMsgs);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (total.load() < want && std::chrono::steady_clock::now() < deadline) usleep(100);
    ASSERT_EQ(total.load(), want) << "completions missing after batch " << base;
  }
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  int dup = 0;
  for (auto& c : seen) dup += c.load() != 1;
  EXPECT_EQ(dup, 0) << "completions seen zero or several times";
  for (auto* list : {&senders, &receivers}) {
    for (ibv_qp* q : *list) {
      std::erase(qps_, q);
      EXPECT_EQ(ibv_destroy_qp(q), 0);
    }
  }
  EXPECT_EQ(ibv_destroy_cq(scq), 0);
  EXPECT_EQ(ibv_destroy_cq(rcq), 0);
}

TEST_F(Loopback, CorruptSendOrReceiveRingIsAFatalQpErrorNotAFlood) {
  // A producer index far ahead of what the ring holds (a program writing the
  // shared rings behind the provider's back): the QP goes to ERR with
  // QP_FATAL; none of the bogus entries is executed, flushed or completed.
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  droce::provider::Qp* pa = droce::provider::to_qp(a);
  pa->handle.sq.publish_prod(pa->sq_prod + 100000);
  droce::provider::to_ctx(ctx_)->s->engine->Doorbell(pa->handle);
  AsyncEvent ev = NextAsyncEvent();
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(ev.element.qp, a);
  EXPECT_EQ(State(a), IBV_QPS_ERR);
  EXPECT_TRUE(Poll(scq_, 1, std::chrono::milliseconds(200)).empty()) << "nothing completes for a corrupt ring";

  // The receive side: d's RQ index is corrupted, then a request arrives.
  ibv_qp* c = CreateQp(scq_, scq_);
  ibv_qp* d = CreateQp(scq_, rcq_);
  Connect(c, d);
  droce::provider::Qp* pd = droce::provider::to_qp(d);
  pd->handle.rq.publish_prod(pd->rq_prod + 100000);
  ASSERT_EQ(PostSend(c, 1, 0, 16), 0);
  ev = NextAsyncEvent();
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(ev.element.qp, d);
  EXPECT_EQ(State(d), IBV_QPS_ERR);
  EXPECT_TRUE(Poll(rcq_, 1, std::chrono::milliseconds(200)).empty());
  EXPECT_EQ(State(b), IBV_QPS_RTS) << "other QPs are not affected";
}

TEST_F(Loopback, ModifyCqModeratesCompletionEvents) {
  ibv_device_attr_ex dx{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &dx), 0);
  EXPECT_EQ(dx.cq_mod_caps.max_cq_count, 65535);
  EXPECT_EQ(dx.cq_mod_caps.max_cq_period, 65535);
  ibv_modify_cq_attr bad{};
  bad.attr_mask = 2;
  EXPECT_EQ(ibv_modify_cq(rcq_, &bad), EINVAL);

  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  ibv_modify_cq_attr m{};
  m.attr_mask = IBV_CQ_ATTR_MODERATE;
  m.moderate.cq_count = 4;
  m.moderate.cq_period = 0;
  ASSERT_EQ(ibv_modify_cq(rcq_, &m), 0);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(PostRecv(b, i, 4096 + i * 64, 64), 0);
  ASSERT_EQ(ibv_req_notify_cq(rcq_, 0), 0);
  // Three completions: held back.
  for (int i = 0; i < 3; ++i) ASSERT_EQ(PostSend(a, i, 0, 16), 0);
  EXPECT_EQ(Poll(scq_, 3).size(), 3u);
  pollfd p{channel_->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 100), 0) << "3 of 4 completions";
  ASSERT_EQ(PostSend(a, 3, 0, 16), 0);
  ASSERT_EQ(poll(&p, 1, 10000), 1) << "the 4th releases the event";
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(channel_, &ev_cq, &ev_ctx), 0);
  ibv_ack_cq_events(ev_cq, 1);
  EXPECT_EQ(Poll(rcq_, 4).size(), 4u);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);

  // A period: one completion, far below the count, is reported when the
  // period runs out.
  m.moderate.cq_count = 1000;
  m.moderate.cq_period = 2000;  // 2 ms
  ASSERT_EQ(ibv_modify_cq(rcq_, &m), 0);
  ASSERT_EQ(ibv_req_notify_cq(rcq_, 0), 0);
  ASSERT_EQ(PostSend(a, 4, 0, 16), 0);
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  ASSERT_EQ(ibv_get_cq_event(channel_, &ev_cq, &ev_ctx), 0);
  ibv_ack_cq_events(ev_cq, 1);
  EXPECT_EQ(Poll(rcq_, 1).size(), 1u);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);

  // Count 1, period 0: every completion again.
  m.moderate.cq_count = 1;
  m.moderate.cq_period = 0;
  ASSERT_EQ(ibv_modify_cq(rcq_, &m), 0);
  ASSERT_EQ(ibv_req_notify_cq(rcq_, 0), 0);
  ASSERT_EQ(PostSend(a, 5, 0, 16), 0);
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  ASSERT_EQ(ibv_get_cq_event(channel_, &ev_cq, &ev_ctx), 0);
  ibv_ack_cq_events(ev_cq, 1);
  EXPECT_EQ(Poll(rcq_, 1).size(), 1u);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);
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

TEST_F(Loopback, UcSendAndWrite) { UcSends(0); }

TEST_F(Loopback, UdSendWithGrhAndAddressHandles) {
  ibv_qp* x = CreateUdQp(pd_, scq_, rcq_, 0x11111111);
  ibv_qp* y = CreateUdQp(pd_, scq_, rcq_, 0x11111111);
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  qps_.push_back(x);
  qps_.push_back(y);
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

// One UD SEND of `len` bytes from buf through `ah`.
int PostUdSend(ibv_qp* qp, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey, const void* buf, uint32_t len,
               uint32_t lkey) {
  ibv_sge s{reinterpret_cast<uint64_t>(buf), len, lkey};
  ibv_send_wr wr{};
  wr.wr_id = remote_qkey;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.ud.ah = ah;
  wr.wr.ud.remote_qpn = remote_qpn;
  wr.wr.ud.remote_qkey = remote_qkey;
  ibv_send_wr* bad = nullptr;
  return ibv_post_send(qp, &wr, &bad);
}

// IBA 10.2.5: a send WR whose Q_Key has the high-order bit set sends the
// sending QP's own Q_Key instead.
TEST_F(Loopback, UdPrivilegedQkeyBitSendsTheQpsOwnQkey) {
  ibv_qp* rx = CreateUdQp(pd_, scq_, rcq_, 0x11111111);
  ibv_qp* same = CreateUdQp(pd_, scq_, rcq_, 0x11111111);
  ibv_qp* other = CreateUdQp(pd_, scq_, rcq_, 0x22222222);
  for (ibv_qp* q : {rx, same, other}) {
    ASSERT_NE(q, nullptr);
    qps_.push_back(q);
  }
  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 1;
  ah_attr.port_num = 1;
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &ah_attr.grh.dgid), 0);
  ibv_ah* ah = ibv_create_ah(pd_, &ah_attr);
  ASSERT_NE(ah, nullptr);
  std::memcpy(buf_.data(), "privileged", 10);
  ASSERT_EQ(PostRecv(rx, 1, 8192, 40 + 64), 0);
  ASSERT_EQ(PostRecv(rx, 2, 16384, 40 + 64), 0);
  // From a QP whose own Q_Key is the receiver's: delivered, although the
  // WR's Q_Key (with the bit cleared) is not the receiver's.
  ASSERT_EQ(PostUdSend(same, ah, rx->qp_num, 0x80000000u, buf_.data(), 10, mr_->lkey), 0);
  auto r = Poll(rcq_, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(r[0].wr_id, 1u);
  EXPECT_EQ(r[0].src_qp, same->qp_num);
  EXPECT_EQ(std::memcmp(buf_.data() + 8192 + 40, "privileged", 10), 0);
  // From a QP with another Q_Key: that one goes out, and is dropped.
  ASSERT_EQ(PostUdSend(other, ah, rx->qp_num, 0x91111111u, buf_.data(), 10, mr_->lkey), 0);
  EXPECT_EQ(Poll(scq_, 2).size(), 2u);
  usleep(20000);
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(rcq_, 1, &wc), 0);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
}

// ibv_attach_mcast: one SEND to a group reaches every attached UD QP whose
// Q_Key matches, and nothing else; detach stops delivery.
TEST_F(Loopback, UdMulticastReachesEveryAttachedQp) {
  ibv_device_attr dev{};
  ASSERT_EQ(ibv_query_device(ctx_, &dev), 0);
  EXPECT_GT(dev.max_mcast_grp, 0);
  EXPECT_GT(dev.max_mcast_qp_attach, 1);
  EXPECT_GE(dev.max_total_mcast_qp_attach, dev.max_mcast_qp_attach);

  ibv_qp* tx = CreateUdQp(pd_, scq_, rcq_, 0x11111111);
  ibv_qp* m1 = CreateUdQp(pd_, scq_, rcq_, 0x11111111);
  ibv_qp* m2 = CreateUdQp(pd_, scq_, rcq_, 0x11111111);
  ibv_qp* wrong_qkey = CreateUdQp(pd_, scq_, rcq_, 0x33333333);
  ibv_qp* outsider = CreateUdQp(pd_, scq_, rcq_, 0x11111111);
  for (ibv_qp* q : {tx, m1, m2, wrong_qkey, outsider}) {
    ASSERT_NE(q, nullptr);
    qps_.push_back(q);
  }
  ibv_gid group{};  // ::ffff:239.1.2.3
  group.raw[10] = group.raw[11] = 0xFF;
  group.raw[12] = 239;
  group.raw[13] = 1;
  group.raw[14] = 2;
  group.raw[15] = 3;
  for (ibv_qp* q : {m1, m2, wrong_qkey}) ASSERT_EQ(ibv_attach_mcast(q, &group, 0), 0);
  EXPECT_EQ(ibv_attach_mcast(m1, &group, 0), 0);  // attached already: no change

  // The documented errors.
  ibv_gid unicast{};
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &unicast), 0);
  EXPECT_EQ(ibv_attach_mcast(outsider, &unicast, 0), EINVAL);
  ibv_qp* rc = CreateQp(scq_, rcq_);
  ASSERT_NE(rc, nullptr);
  EXPECT_EQ(ibv_attach_mcast(rc, &group, 0), EINVAL);
  EXPECT_EQ(ibv_detach_mcast(outsider, &group, 0), EINVAL);
  EXPECT_EQ(ibv_attach_mcast(nullptr, &group, 0), EINVAL);
  EXPECT_EQ(ibv_attach_mcast(m1, nullptr, 0), EINVAL);
  EXPECT_EQ(ibv_destroy_qp(m1), EBUSY);  // IBA o10-2.2.3: detach first
  // A connected QP's peer is never a group.
  ToInit(rc);
  {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = rc->qp_num;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.dgid = group;
    EXPECT_EQ(ibv_modify_qp(rc, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              EINVAL);
  }

  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 1;
  ah_attr.port_num = 1;
  ah_attr.grh.hop_limit = 1;
  ah_attr.grh.dgid = group;
  ibv_ah* ah = ibv_create_ah(pd_, &ah_attr);
  ASSERT_NE(ah, nullptr);
  droce::Counters before = droce::provider::to_ctx(ctx_)->s->engine->ReadCounters();
  const std::vector<ibv_qp*> receivers = {m1, m2, wrong_qkey, outsider};
  for (size_t i = 0; i < receivers.size(); ++i) {
    ASSERT_EQ(PostRecv(receivers[i], 100 + i, 8192 + 1024 * i, 40 + 64), 0);
  }
  std::memcpy(buf_.data(), "to the group", 12);
  // remote_qpn is whatever the application puts; the wire carries 0xFFFFFF.
  ASSERT_EQ(PostUdSend(tx, ah, 0xFFFFFF, 0x11111111, buf_.data(), 12, mr_->lkey), 0);
  auto r = Poll(rcq_, 2);
  ASSERT_EQ(r.size(), 2u);
  std::vector<uint32_t> got;
  for (const ibv_wc& wc : r) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.byte_len, 40u + 12);
    EXPECT_EQ(wc.src_qp, tx->qp_num);
    EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
    got.push_back(wc.qp_num);
    ASSERT_GE(wc.wr_id, 100u);
    const uint8_t* b = buf_.data() + 8192 + 1024 * (wc.wr_id - 100);
    EXPECT_EQ(std::memcmp(b + 40, "to the group", 12), 0);
    EXPECT_EQ(b[20] >> 4, 4);
    EXPECT_EQ(std::memcmp(b + 20 + 16, group.raw + 12, 4), 0);  // the IPv4 header's destination
  }
  std::sort(got.begin(), got.end());
  std::vector<uint32_t> want = {m1->qp_num, m2->qp_num};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(got, want);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);
  usleep(20000);
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(rcq_, 1, &wc), 0);  // not the outsider, not the wrong Q_Key
  droce::Counters after = droce::provider::to_ctx(ctx_)->s->engine->ReadCounters();
  EXPECT_EQ(after.mcast_rcvd_pkts - before.mcast_rcvd_pkts, 1u);
  EXPECT_EQ(after.qkey_viol - before.qkey_viol, 1u);

  // Detached, m2 gets nothing; m1 still does.
  ASSERT_EQ(ibv_detach_mcast(m2, &group, 0), 0);
  EXPECT_EQ(ibv_detach_mcast(m2, &group, 0), EINVAL);
  ASSERT_EQ(PostRecv(m1, 200, 8192, 40 + 64), 0);
  ASSERT_EQ(PostRecv(m2, 201, 9216, 40 + 64), 0);
  ASSERT_EQ(PostUdSend(tx, ah, 0, 0x11111111, buf_.data(), 12, mr_->lkey), 0);
  r = Poll(rcq_, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].qp_num, m1->qp_num);
  EXPECT_EQ(r[0].wr_id, 200u);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);
  usleep(20000);
  EXPECT_EQ(ibv_poll_cq(rcq_, 1, &wc), 0);

  // With every member gone the group is gone: the packet is counted as such.
  ASSERT_EQ(ibv_detach_mcast(m1, &group, 0), 0);
  ASSERT_EQ(ibv_detach_mcast(wrong_qkey, &group, 0), 0);
  before = after;
  ASSERT_EQ(PostUdSend(tx, ah, 0, 0x11111111, buf_.data(), 12, mr_->lkey), 0);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  do {
    usleep(1000);
    after = droce::provider::to_ctx(ctx_)->s->engine->ReadCounters();
  } while (after.mcast_no_group_drop == before.mcast_no_group_drop && std::chrono::steady_clock::now() < deadline);
  EXPECT_EQ(after.mcast_no_group_drop - before.mcast_no_group_drop, 1u);
  EXPECT_EQ(ibv_poll_cq(rcq_, 1, &wc), 0);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
}

TEST_F(Loopback, SharedReceiveQueueFeedsSeveralQps) {
  ibv_srq* srq = CreateSrq(64);
  ASSERT_NE(srq, nullptr);
  ibv_qp* r1 = CreateSrqQp(srq);
  ibv_qp* r2 = CreateSrqQp(srq);
  ibv_qp* s1 = CreateQp(scq_, scq_);
  ibv_qp* s2 = CreateQp(scq_, scq_);
  ASSERT_NE(r1, nullptr);
  ASSERT_NE(r2, nullptr);
  Connect(s1, r1);
  Connect(s2, r2);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(PostSrqRecv(srq, 500 + i, 8192 + i * 128, 128), 0);
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

// The same device with an IPv6 address (DROCE_IP6; the `verbs_loopback_ipv6`
// test in tests/provider/meson.build runs only these): GID index 1 is that
// address, and RC and UD traffic addressed to it goes out and comes back as
// RoCEv2 over IPv6.
class LoopbackIpv6 : public Loopback {
 protected:
  void SetUp() override {
    const char* v = std::getenv("DROCE_IP6");
    ASSERT_NE(v, nullptr) << "run with DROCE_IP6 set";
    const std::string addr(v, std::strcspn(v, "/"));
    ASSERT_EQ(inet_pton(AF_INET6, addr.c_str(), ip6_), 1);
    Loopback::SetUp();
  }
  uint8_t ip6_[16] = {};
};

TEST_F(LoopbackIpv6, GidTableHasTheIpv6AddressAtIndexOne) {
  ibv_port_attr pa{};
  ASSERT_EQ(ibv_query_port(ctx_, 1, &pa), 0);
  EXPECT_EQ(pa.gid_tbl_len, 2);
  ibv_gid g{};
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &g), 0);
  const uint8_t mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF, 10, 77, 0, 1};
  EXPECT_EQ(std::memcmp(g.raw, mapped, 16), 0);  // index 0 unchanged
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 1, &g), 0);
  EXPECT_EQ(std::memcmp(g.raw, ip6_, 16), 0);
  EXPECT_EQ(ibv_query_gid(ctx_, 1, 2, &g), -1);
  ibv_gid_entry e{};
  ASSERT_EQ(ibv_query_gid_ex(ctx_, 1, 1, &e, 0), 0);
  EXPECT_EQ(e.gid_index, 1u);
  EXPECT_EQ(e.gid_type, IBV_GID_TYPE_ROCE_V2);
  EXPECT_EQ(std::memcmp(e.gid.raw, ip6_, 16), 0);
  EXPECT_EQ(ibv_query_gid_ex(ctx_, 1, 2, &e, 0), ENODATA);
  ibv_gid_entry table[4] = {};
  ASSERT_EQ(ibv_query_gid_table(ctx_, table, 4, 0), 2);
  EXPECT_EQ(table[0].gid_index, 0u);
  EXPECT_EQ(std::memcmp(table[0].gid.raw, mapped, 16), 0);
  EXPECT_EQ(table[1].gid_index, 1u);
  EXPECT_EQ(std::memcmp(table[1].gid.raw, ip6_, 16), 0);
  EXPECT_EQ(ibv_query_gid_table(ctx_, table, 1, 0), -EINVAL);
  int type = -1;
  ASSERT_EQ(ibv_query_gid_type(ctx_, 1, 1, &type), 0);
  EXPECT_EQ(type, 1);  // IBV_GID_TYPE_SYSFS_ROCE_V2
  EXPECT_EQ(ibv_query_gid_type(ctx_, 1, 2, &type), -1);
  // The sysfs files ibv_devinfo -v reads, in the kernel's format.
  const char* dir = ctx_->device->ibdev_path;
  char buf[64];
  char expect[40];
  std::snprintf(expect, sizeof(expect), "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x",
                ip6_[0], ip6_[1], ip6_[2], ip6_[3], ip6_[4], ip6_[5], ip6_[6], ip6_[7], ip6_[8], ip6_[9], ip6_[10],
                ip6_[11], ip6_[12], ip6_[13], ip6_[14], ip6_[15]);
  ASSERT_EQ(ibv_read_sysfs_file(dir, "ports/1/gids/1", buf, sizeof(buf)), 39);
  EXPECT_STREQ(buf, expect);
  ASSERT_GT(ibv_read_sysfs_file(dir, "ports/1/gids/0", buf, sizeof(buf)), 0);
  EXPECT_STREQ(buf, "0000:0000:0000:0000:0000:ffff:0a4d:0001");
  ASSERT_GT(ibv_read_sysfs_file(dir, "ports/1/gid_attrs/types/1", buf, sizeof(buf)), 0);
  EXPECT_STREQ(buf, "RoCE v2");
  EXPECT_EQ(ibv_read_sysfs_file(dir, "ports/1/gids/2", buf, sizeof(buf)), -1);
  EXPECT_EQ(ibv_read_sysfs_file(dir, "ports/1/gid_attrs/types/2", buf, sizeof(buf)), -1);
  EXPECT_EQ(ibv_read_sysfs_file(dir, "ports/1/gids/x", buf, sizeof(buf)), -1);
}

TEST_F(LoopbackIpv6, RcSendWriteReadAndAtomicsOverGidIndexOne) {
  ibv_mr* remote = ibv_reg_mr(pd_, buf_.data() + 256 * 1024, 256 * 1024,
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                  IBV_ACCESS_REMOTE_ATOMIC);
  ASSERT_NE(remote, nullptr);
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(a, b, 1);
  ibv_qp_attr acc{};
  acc.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
  ASSERT_EQ(ibv_modify_qp(b, &acc, IBV_QP_ACCESS_FLAGS), 0);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(a, &q, IBV_QP_AV, &qi), 0);
  EXPECT_EQ(q.ah_attr.grh.sgid_index, 1);
  EXPECT_EQ(std::memcmp(q.ah_attr.grh.dgid.raw, ip6_, 16), 0);

  std::mt19937 rng(6);
  const size_t rx_off = 512 * 1024;
  for (uint32_t len : {1u, 1025u, 65536u}) {
    for (uint32_t i = 0; i < len; ++i) buf_[i] = static_cast<uint8_t>(rng());
    ASSERT_EQ(PostRecv(b, len, rx_off, len), 0);
    ASSERT_EQ(PostSend(a, len, 0, len), 0);
    auto s = Poll(scq_, 1);
    auto r = Poll(rcq_, 1);
    ASSERT_EQ(s.size(), 1u);
    ASSERT_EQ(r.size(), 1u);
    EXPECT_EQ(s[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(r[0].byte_len, len);
    EXPECT_EQ(std::memcmp(buf_.data(), buf_.data() + rx_off, len), 0) << len;
  }

  uint8_t* rbuf = buf_.data() + 256 * 1024;
  auto post = [&](ibv_wr_opcode op, size_t loff, uint32_t len, uint64_t raddr, uint64_t add = 0) {
    ibv_sge s{reinterpret_cast<uint64_t>(buf_.data() + loff), len, mr_->lkey};
    ibv_send_wr wr{};
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    if (op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      wr.wr.atomic.remote_addr = raddr;
      wr.wr.atomic.rkey = remote->rkey;
      wr.wr.atomic.compare_add = add;
    } else {
      wr.wr.rdma.remote_addr = raddr;
      wr.wr.rdma.rkey = remote->rkey;
    }
    ibv_send_wr* bad = nullptr;
    EXPECT_EQ(ibv_post_send(a, &wr, &bad), 0);
    auto w = Poll(scq_, 1);
    EXPECT_EQ(w.size(), 1u);
    return w.empty() ? IBV_WC_GENERAL_ERR : w[0].status;
  };
  for (uint32_t len : {1u, 5000u, 65536u}) {
    for (uint32_t i = 0; i < len; ++i) buf_[i] = static_cast<uint8_t>(rng());
    EXPECT_EQ(post(IBV_WR_RDMA_WRITE, 0, len, reinterpret_cast<uint64_t>(rbuf)), IBV_WC_SUCCESS);
    EXPECT_EQ(std::memcmp(buf_.data(), rbuf, len), 0) << len;
    std::memset(buf_.data() + 128 * 1024, 0, len);
    EXPECT_EQ(post(IBV_WR_RDMA_READ, 128 * 1024, len, reinterpret_cast<uint64_t>(rbuf)), IBV_WC_SUCCESS);
    EXPECT_EQ(std::memcmp(buf_.data() + 128 * 1024, rbuf, len), 0) << len;
  }
  uint64_t word = 40;
  std::memcpy(rbuf + 64, &word, 8);
  EXPECT_EQ(post(IBV_WR_ATOMIC_FETCH_AND_ADD, 1000, 8, reinterpret_cast<uint64_t>(rbuf + 64), 2), IBV_WC_SUCCESS);
  std::memcpy(&word, buf_.data() + 1000, 8);
  EXPECT_EQ(word, 40u);
  std::memcpy(&word, rbuf + 64, 8);
  EXPECT_EQ(word, 42u);
  EXPECT_EQ(ibv_destroy_qp(a), 0);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  qps_.clear();
  EXPECT_EQ(ibv_dereg_mr(remote), 0);
}

TEST_F(LoopbackIpv6, UdOverGidIndexOneCarriesTheIpv6HeaderAsGrh) {
  ibv_qp* x = CreateUdQp(pd_, scq_, rcq_, 0x11111111);
  ibv_qp* y = CreateUdQp(pd_, scq_, rcq_, 0x11111111);
  ASSERT_NE(x, nullptr);
  ASSERT_NE(y, nullptr);
  qps_.push_back(x);
  qps_.push_back(y);
  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 1;
  ah_attr.port_num = 1;
  ah_attr.grh.sgid_index = 1;
  ah_attr.grh.hop_limit = 7;
  ah_attr.grh.traffic_class = 0x28;
  ah_attr.grh.flow_label = 0x12345;
  std::memcpy(ah_attr.grh.dgid.raw, ip6_, 16);
  ibv_ah* ah = ibv_create_ah(pd_, &ah_attr);
  ASSERT_NE(ah, nullptr);
  auto send = [&](ibv_qp* from, ibv_ah* to, uint32_t remote_qpn, const char* msg) {
    ibv_sge s{reinterpret_cast<uint64_t>(buf_.data()), static_cast<uint32_t>(std::strlen(msg)), mr_->lkey};
    std::memcpy(buf_.data(), msg, s.length);
    ibv_send_wr wr{};
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.ud.ah = to;
    wr.wr.ud.remote_qpn = remote_qpn;
    wr.wr.ud.remote_qkey = 0x11111111;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(from, &wr, &bad), 0);
    auto c = Poll(scq_, 1);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].status, IBV_WC_SUCCESS);
  };
  ASSERT_EQ(PostRecv(y, 9, 8192, 40 + 64), 0);
  send(x, ah, y->qp_num, "ud over ipv6");
  auto r = Poll(rcq_, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(r[0].byte_len, 40u + 12);
  EXPECT_EQ(r[0].src_qp, x->qp_num);
  EXPECT_TRUE(r[0].wc_flags & IBV_WC_GRH);
  EXPECT_EQ(std::memcmp(buf_.data() + 8192 + 40, "ud over ipv6", 12), 0);
  // The GRH is the IPv6 header as sent: the AH's traffic class, flow label
  // and hop limit, UDP, and the port's address as source and destination.
  const uint8_t* g = buf_.data() + 8192;
  const uint32_t vtf = uint32_t{g[0]} << 24 | uint32_t{g[1]} << 16 | uint32_t{g[2]} << 8 | g[3];
  EXPECT_EQ(vtf >> 28, 6u);
  EXPECT_EQ((vtf >> 20) & 0xFF, 0x28u);
  EXPECT_EQ(vtf & 0xFFFFF, 0x12345u);
  EXPECT_EQ(g[4] << 8 | g[5], 8 + 12 + 8 + 12 + 4);  // UDP, BTH, DETH, payload, ICRC
  EXPECT_EQ(g[6], 17);
  EXPECT_EQ(g[7], 7);
  EXPECT_EQ(std::memcmp(g + 8, ip6_, 16), 0);
  EXPECT_EQ(std::memcmp(g + 24, ip6_, 16), 0);
  // An AH from the completion points back at the sender over IPv6.
  auto* grh = reinterpret_cast<ibv_grh*>(buf_.data() + 8192);
  ibv_ah_attr back_attr{};
  ASSERT_EQ(ibv_init_ah_from_wc(ctx_, 1, &r[0], grh, &back_attr), 0);
  EXPECT_EQ(back_attr.is_global, 1);
  EXPECT_EQ(back_attr.grh.sgid_index, 1);
  EXPECT_EQ(std::memcmp(back_attr.grh.dgid.raw, ip6_, 16), 0);
  EXPECT_EQ(back_attr.grh.traffic_class, 0x28);
  EXPECT_EQ(back_attr.grh.flow_label, 0x12345u);
  ibv_ah* back = ibv_create_ah_from_wc(pd_, &r[0], grh, 1);
  ASSERT_NE(back, nullptr);
  ASSERT_EQ(PostRecv(x, 10, 16384, 40 + 64), 0);
  send(y, back, x->qp_num, "and back");
  auto r2 = Poll(rcq_, 1);
  ASSERT_EQ(r2.size(), 1u);
  EXPECT_EQ(r2[0].wr_id, 10u);
  EXPECT_EQ(r2[0].src_qp, y->qp_num);
  EXPECT_EQ(buf_[16384] >> 4, 6);
  EXPECT_EQ(std::memcmp(buf_.data() + 16384 + 40, "and back", 8), 0);
  // The IPv4 GID still works beside it: its GRH is 20 zeros and IPv4.
  ibv_ah_attr v4{};
  v4.is_global = 1;
  v4.port_num = 1;
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &v4.grh.dgid), 0);
  ibv_ah* ah4 = ibv_create_ah(pd_, &v4);
  ASSERT_NE(ah4, nullptr);
  ASSERT_EQ(PostRecv(y, 11, 8192, 40 + 64), 0);
  send(x, ah4, y->qp_num, "ipv4");
  auto r3 = Poll(rcq_, 1);
  ASSERT_EQ(r3.size(), 1u);
  EXPECT_EQ(buf_[8192], 0);
  EXPECT_EQ(buf_[8192 + 20] >> 4, 4);
  ibv_ah_attr back4{};
  ASSERT_EQ(ibv_init_ah_from_wc(ctx_, 1, &r3[0], grh, &back4), 0);
  EXPECT_EQ(back4.grh.sgid_index, 0);
  EXPECT_EQ(std::memcmp(back4.grh.dgid.raw, v4.grh.dgid.raw, 16), 0);
  EXPECT_EQ(ibv_destroy_ah(ah4), 0);
  EXPECT_EQ(ibv_destroy_ah(back), 0);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
}

// An IPv6 group (ff0e::/16, sgid_index 1): the GRH is the IPv6 header with
// the group as destination.
TEST_F(LoopbackIpv6, UdMulticastToAnIpv6Group) {
  ibv_qp* tx = CreateUdQp(pd_, scq_, rcq_, 0x4242);
  ibv_qp* m1 = CreateUdQp(pd_, scq_, rcq_, 0x4242);
  ibv_qp* m2 = CreateUdQp(pd_, scq_, rcq_, 0x4242);
  for (ibv_qp* q : {tx, m1, m2}) {
    ASSERT_NE(q, nullptr);
    qps_.push_back(q);
  }
  ibv_gid group{};
  group.raw[0] = 0xFF;
  group.raw[1] = 0x0E;
  group.raw[14] = 0x12;
  group.raw[15] = 0x34;
  ASSERT_EQ(ibv_attach_mcast(m1, &group, 0), 0);
  ASSERT_EQ(ibv_attach_mcast(m2, &group, 0), 0);
  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 1;
  ah_attr.port_num = 1;
  ah_attr.grh.sgid_index = 1;
  ah_attr.grh.hop_limit = 5;
  ah_attr.grh.dgid = group;
  ibv_ah* ah = ibv_create_ah(pd_, &ah_attr);
  ASSERT_NE(ah, nullptr);
  ASSERT_EQ(PostRecv(m1, 1, 8192, 40 + 64), 0);
  ASSERT_EQ(PostRecv(m2, 2, 9216, 40 + 64), 0);
  std::memcpy(buf_.data(), "v6 group", 8);
  ASSERT_EQ(PostUdSend(tx, ah, 0xFFFFFF, 0x4242, buf_.data(), 8, mr_->lkey), 0);
  auto r = Poll(rcq_, 2);
  ASSERT_EQ(r.size(), 2u);
  for (const ibv_wc& wc : r) {
    EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.src_qp, tx->qp_num);
    EXPECT_TRUE(wc.wc_flags & IBV_WC_GRH);
    const uint8_t* g = buf_.data() + (wc.wr_id == 1 ? 8192 : 9216);
    EXPECT_EQ(g[0] >> 4, 6);
    EXPECT_EQ(g[7], 5);                                  // hop limit
    EXPECT_EQ(std::memcmp(g + 8, ip6_, 16), 0);          // from the port's address
    EXPECT_EQ(std::memcmp(g + 24, group.raw, 16), 0);    // to the group
    EXPECT_EQ(std::memcmp(g + 40, "v6 group", 8), 0);
  }
  EXPECT_NE(r[0].qp_num, r[1].qp_num);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);
  EXPECT_EQ(ibv_detach_mcast(m1, &group, 0), 0);
  EXPECT_EQ(ibv_detach_mcast(m2, &group, 0), 0);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
}

TEST_F(LoopbackIpv6, UcSendOverGidIndexOne) { UcSends(1); }

TEST_F(LoopbackIpv6, SgidIndexMustMatchTheDestinationFamily) {
  ibv_gid g4{}, g6{}, multicast{}, unspecified{};
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &g4), 0);
  ASSERT_EQ(ibv_query_gid(ctx_, 1, 1, &g6), 0);
  multicast.raw[0] = 0xFF;
  multicast.raw[1] = 0x02;
  multicast.raw[15] = 1;
  ibv_qp* qp = CreateQp(scq_, scq_);
  ASSERT_NE(qp, nullptr);
  ToInit(qp);
  auto rtr = [&](const ibv_gid& dgid, uint8_t sgid_index, uint8_t is_global) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = qp->qp_num;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = is_global;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.dgid = dgid;
    a.ah_attr.grh.sgid_index = sgid_index;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                     IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER);
  };
  auto ah = [&](const ibv_gid& dgid, uint8_t sgid_index, uint8_t is_global) {
    ibv_ah_attr a{};
    a.is_global = is_global;
    a.port_num = 1;
    a.grh.dgid = dgid;
    a.grh.sgid_index = sgid_index;
    errno = 0;
    ibv_ah* h = ibv_create_ah(pd_, &a);
    const int err = h == nullptr ? errno : 0;
    if (h != nullptr) {
      EXPECT_EQ(ibv_destroy_ah(h), 0);
    }
    return err;
  };
  struct Case {
    const ibv_gid* dgid;
    uint8_t sgid_index;
    uint8_t is_global;
  };
  for (const Case& c : {Case{&g6, 0, 1}, Case{&g4, 1, 1}, Case{&g6, 2, 1}, Case{&g4, 2, 1},
                        Case{&unspecified, 1, 1}, Case{&g6, 1, 0}, Case{&multicast, 0, 1}}) {
    EXPECT_EQ(rtr(*c.dgid, c.sgid_index, c.is_global), EINVAL) << int{c.sgid_index};
    EXPECT_EQ(ah(*c.dgid, c.sgid_index, c.is_global), EINVAL) << int{c.sgid_index};
  }
  // A group is a UD destination only.
  EXPECT_EQ(rtr(multicast, 1, 1), EINVAL);
  EXPECT_EQ(ah(multicast, 1, 1), 0);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(qp, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_INIT);  // the failed transitions changed nothing
  EXPECT_EQ(ah(g6, 1, 1), 0);
  EXPECT_EQ(ah(g4, 0, 1), 0);
  EXPECT_EQ(rtr(g6, 1, 1), 0);
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
