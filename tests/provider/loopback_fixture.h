// The fixture of the provider tests that run in one process on droce0's
// default loopback link: a context, a PD, a 1 MiB registered buffer, a send
// CQ and a receive CQ on a completion channel, and helpers to create and
// connect QPs, post and poll. LoopbackIpv6 adds the port's IPv6 address
// (DROCE_IP6). The test binary links libdroce.so ahead of libibverbs, so ibv_*
// resolve to droce exactly as they do under LD_PRELOAD.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "droce/droce.h"
#include "provider.h"  // white-box: the hostile-ring tests
#include "ud_qp.h"

// libibverbs' private and sysfs calls that ibv_devinfo imports; their
// declarations are not in the installed headers.
extern "C" int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index, int* type);
extern "C" int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size);

namespace droce::test {

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
    if (scq_) {
      EXPECT_EQ(ibv_destroy_cq(scq_), 0);
    }
    if (rcq_) {
      EXPECT_EQ(ibv_destroy_cq(rcq_), 0);
    }
    if (channel_) {
      EXPECT_EQ(ibv_destroy_comp_channel(channel_), 0);
    }
    if (mr_) {
      EXPECT_EQ(ibv_dereg_mr(mr_), 0);
    }
    if (pd_) {
      EXPECT_EQ(ibv_dealloc_pd(pd_), 0);
    }
    if (ctx_) {
      EXPECT_EQ(ibv_close_device(ctx_), 0);
    }
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
  // Lets the peer's requests in with `access` (IBV_ACCESS_REMOTE_*).
  void GrantRemote(ibv_qp* q, unsigned access) {
    ibv_qp_attr a{};
    a.qp_access_flags = access;
    ASSERT_EQ(ibv_modify_qp(q, &a, IBV_QP_ACCESS_FLAGS), 0);
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
  // A 64-byte SEND from [addr, addr+64) in `lkey` by a new RC QP on `pd`
  // (its CQ `cq`, possibly another context's) to a new QP of the fixture's;
  // both sides complete successfully. The sending QP is destroyed after.
  void SendFromNewQp(ibv_pd* pd, ibv_cq* cq, uint64_t addr, uint32_t lkey) {
    ibv_qp_init_attr qa{};
    qa.send_cq = cq;
    qa.recv_cq = cq;
    qa.cap.max_send_wr = qa.cap.max_recv_wr = 8;
    qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
    qa.qp_type = IBV_QPT_RC;
    ibv_qp* a = ibv_create_qp(pd, &qa);
    ASSERT_NE(a, nullptr) << errno;
    ibv_qp* b = CreateQp(scq_, rcq_);
    ASSERT_NE(b, nullptr);
    Connect(a, b);
    ASSERT_EQ(PostRecv(b, 1, 8192, 64), 0);
    ibv_sge sge{addr, 64, lkey};
    ibv_send_wr wr{};
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(a, &wr, &bad), 0);
    auto got = Poll(rcq_, 1);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0].status, IBV_WC_SUCCESS);
    auto sent = Poll(cq, 1);
    ASSERT_EQ(sent.size(), 1u);
    EXPECT_EQ(sent[0].status, IBV_WC_SUCCESS);
    EXPECT_EQ(ibv_destroy_qp(a), 0);
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

// One UD SEND of `len` bytes from buf through `ah`.
inline int PostUdSend(ibv_qp* qp, ibv_ah* ah, uint32_t remote_qpn, uint32_t remote_qkey, const void* buf, uint32_t len,
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

}  // namespace droce::test
