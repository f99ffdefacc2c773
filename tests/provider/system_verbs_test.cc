// Beside real devices (providers/system_verbs.h): with a
// stand-in for the system libibverbs behind libdroce.so (system_standin.cc,
// one device "standin0"), a program sees droce's devices and the system's;
// every call on the system device's objects reaches the system library
// unchanged, with its answer passed back; droce's own objects never reach
// it.
#include <infiniband/verbs.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "system_standin.h"

extern "C" int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index, int* type);

namespace {

// The name and argument of the one call the stand-in saw since the last
// reset, or "" if it saw none or several.
std::string OnlyCall(const void** arg = nullptr) {
  const auto c = standin_calls();
  if (c.size() != 1) return c.empty() ? "" : "several: " + std::string(c[0].name) + ", " + c[1].name;
  if (arg != nullptr) *arg = c[0].arg;
  return c[0].name;
}

// Runs `call`, then expects the stand-in to have seen exactly `name` with
// first argument `arg`.
template <typename Call>
void ExpectForwarded(const char* name, const void* arg, Call&& call) {
  standin_reset();
  call();
  const void* got = nullptr;
  EXPECT_EQ(OnlyCall(&got), name);
  EXPECT_EQ(got, arg) << name;
}

TEST(SystemVerbs, DevicesOfBothAreListedAndFreed) {
  standin_reset();
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(list, nullptr);
  ASSERT_EQ(n, 2);
  EXPECT_STREQ(ibv_get_device_name(list[0]), "droce0");
  EXPECT_EQ(list[1], standin_objects().device);
  EXPECT_EQ(list[2], nullptr);
  standin_reset();
  ibv_free_device_list(list);
  EXPECT_EQ(OnlyCall(), "ibv_free_device_list");
}

TEST(SystemVerbs, DeviceCallsAreForwarded) {
  const StandinObjects o = standin_objects();
  ExpectForwarded("ibv_get_device_name", o.device, [&] { EXPECT_STREQ(ibv_get_device_name(o.device), "standin0"); });
  ExpectForwarded("ibv_get_device_index", o.device, [&] { EXPECT_EQ(ibv_get_device_index(o.device), 9); });
  ExpectForwarded("ibv_get_device_guid", o.device, [&] { EXPECT_EQ(ibv_get_device_guid(o.device), 0x1234u); });
  ExpectForwarded("ibv_open_device", o.device, [&] { EXPECT_EQ(ibv_open_device(o.device), o.context); });
}

TEST(SystemVerbs, EveryObjectCallIsForwarded) {
  const StandinObjects o = standin_objects();
  ibv_context* c = o.context;
  // Argument blocks the stand-in never reads.
  ibv_device_attr dattr{};
  ibv_port_attr pattr{};
  ibv_gid gid{};
  ibv_gid_entry gentry{};
  int type = 0;
  __be16 pkey = 0;
  ibv_async_event ev{};
  ibv_ah_attr ahattr{};
  uint8_t mac[6];
  uint16_t vid = 0;
  ibv_qp_attr qattr{};
  ibv_qp_init_attr qinit{};
  ibv_srq_attr sattr{};
  ibv_srq_init_attr sinit{};
  ibv_wc wc{};
  ibv_grh grh{};
  ibv_ece ece{};
  ibv_cq* got_cq = nullptr;
  void* got_ctx = nullptr;
  char buf[64];
  const int R = kStandinRc;

  ExpectForwarded("ibv_query_device", c, [&] { EXPECT_EQ(ibv_query_device(c, &dattr), R); });
  ExpectForwarded("ibv_query_port", c, [&] { EXPECT_EQ(ibv_query_port(c, 1, &pattr), R); });
  ExpectForwarded("ibv_query_gid", c, [&] { EXPECT_EQ(ibv_query_gid(c, 1, 0, &gid), R); });
  ExpectForwarded("_ibv_query_gid_ex", c, [&] { EXPECT_EQ(ibv_query_gid_ex(c, 1, 0, &gentry, 0), R); });
  ExpectForwarded("_ibv_query_gid_table", c, [&] { EXPECT_EQ(ibv_query_gid_table(c, &gentry, 1, 0), R); });
  ExpectForwarded("ibv_query_gid_type", c, [&] { EXPECT_EQ(ibv_query_gid_type(c, 1, 0, &type), R); });
  ExpectForwarded("ibv_query_pkey", c, [&] { EXPECT_EQ(ibv_query_pkey(c, 1, 0, &pkey), R); });
  ExpectForwarded("ibv_get_pkey_index", c, [&] { EXPECT_EQ(ibv_get_pkey_index(c, 1, pkey), R); });
  ExpectForwarded("ibv_get_async_event", c, [&] { EXPECT_EQ(ibv_get_async_event(c, &ev), R); });
  ev.event_type = IBV_EVENT_QP_FATAL;
  ev.element.qp = o.qp;
  ExpectForwarded("ibv_ack_async_event", &ev, [&] { ibv_ack_async_event(&ev); });
  ExpectForwarded("ibv_resolve_eth_l2_from_gid", c,
                  [&] { EXPECT_EQ(ibv_resolve_eth_l2_from_gid(c, &ahattr, mac, &vid), R); });

  ExpectForwarded("ibv_alloc_pd", c, [&] { EXPECT_EQ(ibv_alloc_pd(c), o.pd); });
  ExpectForwarded("ibv_import_pd", c, [&] { EXPECT_EQ(ibv_import_pd(c, 1), o.pd); });
  ExpectForwarded("ibv_unimport_pd", o.pd, [&] { ibv_unimport_pd(o.pd); });
  ExpectForwarded("ibv_dealloc_pd", o.pd, [&] { EXPECT_EQ(ibv_dealloc_pd(o.pd), R); });
  ExpectForwarded("ibv_reg_mr", o.pd, [&] { EXPECT_EQ((ibv_reg_mr)(o.pd, buf, sizeof(buf), 0), o.mr); });
  ExpectForwarded("ibv_reg_mr_iova", o.pd, [&] { EXPECT_EQ((ibv_reg_mr_iova)(o.pd, buf, sizeof(buf), 0, 0), o.mr); });
  ExpectForwarded("ibv_reg_mr_iova2", o.pd, [&] { EXPECT_EQ(ibv_reg_mr_iova2(o.pd, buf, sizeof(buf), 0, 0), o.mr); });
  ExpectForwarded("ibv_reg_dmabuf_mr", o.pd, [&] { EXPECT_EQ(ibv_reg_dmabuf_mr(o.pd, 0, 64, 0, 3, 0), o.mr); });
  ExpectForwarded("ibv_import_mr", o.pd, [&] { EXPECT_EQ(ibv_import_mr(o.pd, 2), o.mr); });
  ExpectForwarded("ibv_unimport_mr", o.mr, [&] { ibv_unimport_mr(o.mr); });
  ExpectForwarded("ibv_rereg_mr", o.mr, [&] { EXPECT_EQ(ibv_rereg_mr(o.mr, IBV_REREG_MR_CHANGE_ACCESS, nullptr, nullptr, 0, 0), R); });
  ExpectForwarded("ibv_dereg_mr", o.mr, [&] { EXPECT_EQ(ibv_dereg_mr(o.mr), R); });

  ExpectForwarded("ibv_create_comp_channel", c, [&] { EXPECT_EQ(ibv_create_comp_channel(c), o.channel); });
  ExpectForwarded("ibv_destroy_comp_channel", o.channel, [&] { EXPECT_EQ(ibv_destroy_comp_channel(o.channel), R); });
  ExpectForwarded("ibv_create_cq", c, [&] { EXPECT_EQ(ibv_create_cq(c, 16, nullptr, o.channel, 0), o.cq); });
  ExpectForwarded("ibv_resize_cq", o.cq, [&] { EXPECT_EQ(ibv_resize_cq(o.cq, 32), R); });
  ExpectForwarded("ibv_get_cq_event", o.channel, [&] { EXPECT_EQ(ibv_get_cq_event(o.channel, &got_cq, &got_ctx), R); });
  ExpectForwarded("ibv_ack_cq_events", o.cq, [&] { ibv_ack_cq_events(o.cq, 1); });
  ExpectForwarded("ibv_destroy_cq", o.cq, [&] { EXPECT_EQ(ibv_destroy_cq(o.cq), R); });

  ExpectForwarded("ibv_create_qp", o.pd, [&] { EXPECT_EQ(ibv_create_qp(o.pd, &qinit), o.qp); });
  ExpectForwarded("ibv_modify_qp", o.qp, [&] { EXPECT_EQ(ibv_modify_qp(o.qp, &qattr, IBV_QP_STATE), R); });
  ExpectForwarded("ibv_query_qp", o.qp, [&] { EXPECT_EQ(ibv_query_qp(o.qp, &qattr, IBV_QP_STATE, &qinit), R); });
  ExpectForwarded("ibv_qp_to_qp_ex", o.qp, [&] { EXPECT_EQ(ibv_qp_to_qp_ex(o.qp), o.qpx); });
  ExpectForwarded("ibv_query_qp_data_in_order", o.qp,
                  [&] { EXPECT_EQ(ibv_query_qp_data_in_order(o.qp, IBV_WR_SEND, 0), R); });
  ExpectForwarded("ibv_set_ece", o.qp, [&] { EXPECT_EQ(ibv_set_ece(o.qp, &ece), R); });
  ExpectForwarded("ibv_query_ece", o.qp, [&] { EXPECT_EQ(ibv_query_ece(o.qp, &ece), R); });
  ExpectForwarded("ibv_attach_mcast", o.qp, [&] { EXPECT_EQ(ibv_attach_mcast(o.qp, &gid, 0), R); });
  ExpectForwarded("ibv_detach_mcast", o.qp, [&] { EXPECT_EQ(ibv_detach_mcast(o.qp, &gid, 0), R); });
  ExpectForwarded("ibv_destroy_qp", o.qp, [&] { EXPECT_EQ(ibv_destroy_qp(o.qp), R); });

  ExpectForwarded("ibv_create_srq", o.pd, [&] { EXPECT_EQ(ibv_create_srq(o.pd, &sinit), o.srq); });
  ExpectForwarded("ibv_modify_srq", o.srq, [&] { EXPECT_EQ(ibv_modify_srq(o.srq, &sattr, IBV_SRQ_LIMIT), R); });
  ExpectForwarded("ibv_query_srq", o.srq, [&] { EXPECT_EQ(ibv_query_srq(o.srq, &sattr), R); });
  ExpectForwarded("ibv_destroy_srq", o.srq, [&] { EXPECT_EQ(ibv_destroy_srq(o.srq), R); });

  ExpectForwarded("ibv_create_ah", o.pd, [&] { EXPECT_EQ(ibv_create_ah(o.pd, &ahattr), o.ah); });
  ExpectForwarded("ibv_destroy_ah", o.ah, [&] { EXPECT_EQ(ibv_destroy_ah(o.ah), R); });
  ExpectForwarded("ibv_init_ah_from_wc", c, [&] { EXPECT_EQ(ibv_init_ah_from_wc(c, 1, &wc, &grh, &ahattr), R); });
  ExpectForwarded("ibv_create_ah_from_wc", o.pd, [&] { EXPECT_EQ(ibv_create_ah_from_wc(o.pd, &wc, &grh, 1), o.ah); });

  ExpectForwarded("ibv_import_dm", c, [&] { EXPECT_EQ(ibv_import_dm(c, 4), o.dm); });
  ExpectForwarded("ibv_unimport_dm", o.dm, [&] { ibv_unimport_dm(o.dm); });
  ExpectForwarded("ibv_close_device", c, [&] { EXPECT_EQ(ibv_close_device(c), R); });
}

// droce's own objects, through a whole RC exchange on droce0, never reach
// the system library.
TEST(SystemVerbs, DroceObjectsStayWithDroce) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(list, nullptr);
  ASSERT_GE(n, 1);
  standin_reset();
  ibv_context* ctx = ibv_open_device(list[0]);
  ASSERT_NE(ctx, nullptr);
  ibv_device_attr dattr{};
  ASSERT_EQ(ibv_query_device(ctx, &dattr), 0);
  ibv_port_attr pattr{};
  ASSERT_EQ(ibv_query_port(ctx, 1, &pattr), 0);
  ibv_gid gid{};
  ASSERT_EQ(ibv_query_gid(ctx, 1, 0, &gid), 0);
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ASSERT_NE(pd, nullptr);
  std::vector<char> buf(8192);
  ibv_mr* mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(mr, nullptr);
  ibv_comp_channel* ch = ibv_create_comp_channel(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, ch, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp_init_attr qa{};
  qa.send_cq = qa.recv_cq = cq;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  qa.qp_type = IBV_QPT_RC;
  ibv_qp* a = ibv_create_qp(pd, &qa);
  ibv_qp* b = ibv_create_qp(pd, &qa);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  for (ibv_qp* q : {a, b}) {
    ibv_qp_attr x{};
    x.qp_state = IBV_QPS_INIT;
    x.port_num = 1;
    ASSERT_EQ(ibv_modify_qp(q, &x, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  }
  for (auto [q, peer] : {std::pair{a, b}, std::pair{b, a}}) {
    ibv_qp_attr x{};
    x.qp_state = IBV_QPS_RTR;
    x.path_mtu = IBV_MTU_1024;
    x.dest_qp_num = peer->qp_num;
    x.max_dest_rd_atomic = 1;
    x.min_rnr_timer = 1;
    x.ah_attr.is_global = 1;
    x.ah_attr.port_num = 1;
    x.ah_attr.grh.dgid = gid;
    ASSERT_EQ(ibv_modify_qp(q, &x, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
    x.qp_state = IBV_QPS_RTS;
    x.timeout = 14;
    x.retry_cnt = 7;
    x.rnr_retry = 7;
    x.max_rd_atomic = 1;
    ASSERT_EQ(ibv_modify_qp(q, &x, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
              0);
  }
  ibv_sge rs{reinterpret_cast<uint64_t>(buf.data() + 4096), 64, mr->lkey};
  ibv_recv_wr rw{};
  rw.sg_list = &rs;
  rw.num_sge = 1;
  ibv_recv_wr* bad_r = nullptr;
  ASSERT_EQ(ibv_post_recv(b, &rw, &bad_r), 0);
  std::strcpy(buf.data(), "through droce");
  ibv_sge ss{reinterpret_cast<uint64_t>(buf.data()), 64, mr->lkey};
  ibv_send_wr sw{};
  sw.sg_list = &ss;
  sw.num_sge = 1;
  sw.opcode = IBV_WR_SEND;
  sw.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad_s = nullptr;
  ASSERT_EQ(ibv_post_send(a, &sw, &bad_s), 0);
  ASSERT_EQ(ibv_req_notify_cq(cq, 0), 0);
  int got = 0;
  for (int i = 0; i < 1000000 && got < 2; ++i) {
    ibv_wc wc[2];
    const int k = ibv_poll_cq(cq, 2, wc);
    ASSERT_GE(k, 0);
    for (int j = 0; j < k; ++j) EXPECT_EQ(wc[j].status, IBV_WC_SUCCESS);
    got += k;
  }
  EXPECT_EQ(got, 2);
  EXPECT_STREQ(buf.data() + 4096, "through droce");
  EXPECT_EQ(ibv_destroy_qp(a), 0);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  EXPECT_EQ(ibv_destroy_comp_channel(ch), 0);
  EXPECT_EQ(ibv_dereg_mr(mr), 0);
  EXPECT_EQ(ibv_dealloc_pd(pd), 0);
  EXPECT_EQ(ibv_close_device(ctx), 0);
  EXPECT_TRUE(standin_calls().empty()) << standin_calls()[0].name;
  ibv_free_device_list(list);
}

}  // namespace
