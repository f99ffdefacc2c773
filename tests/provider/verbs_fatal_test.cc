// IBV_EVENT_DEVICE_FATAL from an internal failure: an exception escaping the
// engine (here thrown from inside a control call, as an allocation failure
// would be) must neither unwind into the application nor leave the caller
// waiting; the device dies instead. Its own process, because droce0 stays
// dead. (A deleted link interface is covered by netns_port_events.sh.)
#include <infiniband/verbs.h>
#include <poll.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <new>
#include <vector>

#include "provider.h"  // white-box: reaches the engine to make it fail

namespace {

TEST(DeviceFatal, AnExceptionInTheEngineKillsTheDeviceCleanly) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(list, nullptr);
  ASSERT_GE(n, 1);
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  ASSERT_NE(ctx, nullptr);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  std::vector<char> buf(4096);
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  qa.qp_type = IBV_QPT_RC;
  ibv_qp* qp = ibv_create_qp(pd, &qa);
  ASSERT_NE(qp, nullptr);
  ibv_qp_attr init{};
  init.qp_state = IBV_QPS_INIT;
  init.port_num = 1;
  ASSERT_EQ(ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  ibv_sge sge{reinterpret_cast<uint64_t>(buf.data()), 64, mr->lkey};
  ibv_recv_wr rwr{};
  rwr.wr_id = 7;
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_recv(qp, &rwr, &bad), 0);

  if (!droce::provider::to_ctx(ctx)->s->engine->RunOnWorkerForTesting([] { throw std::bad_alloc(); })) {
    // Client mode: the engine is droced's; daemon_client fatal checks the
    // same path when droced stops.
    GTEST_SKIP() << "the engine is not in this process";
  }

  pollfd p{ctx->async_fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(ctx, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_DEVICE_FATAL);
  ibv_ack_async_event(&ev);
  ibv_port_attr pa{};
  ASSERT_EQ(ibv_query_port(ctx, 1, &pa), 0);
  EXPECT_EQ(pa.state, IBV_PORT_DOWN);
  ibv_wc wc{};
  int got = 0;
  for (int i = 0; i < 10000 && got == 0; ++i) got = ibv_poll_cq(cq, 1, &wc);
  ASSERT_EQ(got, 1);
  EXPECT_EQ(wc.wr_id, 7u);
  EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR);
  // The one posting rule reads the engine's state (ERR), not the cached one
  // (INIT, refreshed only by the ibv_query_qp below): a receive and a send
  // posted now are accepted and flushed at once.
  EXPECT_EQ(qp->state, IBV_QPS_INIT);
  rwr.wr_id = 8;
  ASSERT_EQ(ibv_post_recv(qp, &rwr, &bad), 0);
  ibv_send_wr swr{};
  swr.wr_id = 9;
  swr.sg_list = &sge;
  swr.num_sge = 1;
  swr.opcode = IBV_WR_SEND;
  swr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* sbad = nullptr;
  ASSERT_EQ(ibv_post_send(qp, &swr, &sbad), 0);
  std::vector<uint64_t> flushed;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  while (flushed.size() < 2 && std::chrono::steady_clock::now() < deadline) {
    if (ibv_poll_cq(cq, 1, &wc) == 1) {
      EXPECT_EQ(wc.status, IBV_WC_WR_FLUSH_ERR) << "wr " << wc.wr_id;
      flushed.push_back(wc.wr_id);
    }
  }
  std::sort(flushed.begin(), flushed.end());
  EXPECT_EQ(flushed, (std::vector<uint64_t>{8, 9})) << "posts on a dead device are flushed at once";
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(qp, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_ERR);
  // Nothing new on a dead device; moving a QP anywhere but ERR/RESET fails.
  errno = 0;
  EXPECT_EQ(ibv_alloc_pd(ctx), nullptr);
  EXPECT_EQ(errno, EIO);
  errno = 0;
  EXPECT_EQ(ibv_create_qp(pd, &qa), nullptr);
  EXPECT_EQ(errno, EIO);
  ibv_qp_attr rtr{};
  rtr.qp_state = IBV_QPS_INIT;
  EXPECT_EQ(ibv_modify_qp(qp, &rtr, IBV_QP_STATE), EIO);
  ibv_qp_attr reset{};
  reset.qp_state = IBV_QPS_RESET;
  EXPECT_EQ(ibv_modify_qp(qp, &reset, IBV_QP_STATE), 0);
  // Tearing down still works.
  EXPECT_EQ(ibv_destroy_qp(qp), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_close_device(ctx), 0);
}

}  // namespace
