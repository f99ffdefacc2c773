// Two droce devices in one process (DROCE_LINK lists two links): droce0 and
// droce1 joined by a memif pair inside the process behave as separate
// devices, and an RC QP on one talks to an RC QP on the other.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ud_qp.h"

namespace {

class TwoDevices : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // Set before the first verbs call: the provider reads it once.
    const std::string sock = "/tmp/droce-two-devices-" + std::to_string(getpid()) + ".sock";
    // The memif server leaves its socket file behind: one from an earlier
    // run whose pid this one reuses would make the server fail to bind.
    unlink(sock.c_str());
    static std::string at_exit_path;
    at_exit_path = sock;
    std::atexit([] { unlink(at_exit_path.c_str()); });
    const std::string link = "net_memif0,role=server,socket=" + sock + ",socket-abstract=no;" +
                             "net_memif1,role=client,socket=" + sock + ",socket-abstract=no";
    setenv("DROCE_LINK", link.c_str(), 1);
    setenv("DROCE_IP", "10.77.9.1/24;10.77.9.2/24", 1);
    setenv("DROCE_IP6", "fd78:9::1/64;fd78:9::2/64", 1);  // one each, like DROCE_IP
    unsetenv("DROCE_MAC");
  }
};

struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* qp = nullptr;
  ibv_mr* mr = nullptr;
  std::vector<uint8_t> buf = std::vector<uint8_t>(65536);
  ibv_gid gid{};

  int gid_index = 0;

  void Open(ibv_device* dev, int sgid_index = 0) {
    gid_index = sgid_index;
    ctx = ibv_open_device(dev);
    ASSERT_NE(ctx, nullptr);
    pd = ibv_alloc_pd(ctx);
    cq = ibv_create_cq(ctx, 64, nullptr, nullptr, 0);
    mr = ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE);
    ASSERT_NE(mr, nullptr);
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq;
    a.cap.max_send_wr = a.cap.max_recv_wr = 16;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.qp_type = IBV_QPT_RC;
    qp = ibv_create_qp(pd, &a);
    ASSERT_NE(qp, nullptr);
    ASSERT_EQ(ibv_query_gid(ctx, 1, gid_index, &gid), 0);
  }
  void Connect(const Side& peer) {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = peer.qp->qp_num;
    a.max_dest_rd_atomic = 1;
    a.min_rnr_timer = 1;
    a.ah_attr.is_global = 1;
    a.ah_attr.port_num = 1;
    a.ah_attr.grh.dgid = peer.gid;
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(gid_index);
    a.ah_attr.grh.hop_limit = 1;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                        IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER),
              0);
    a.qp_state = IBV_QPS_RTS;
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 1;
    ASSERT_EQ(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                        IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC),
              0);
  }
  ibv_wc WaitOne() {
    ibv_wc wc{};
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (ibv_poll_cq(cq, 1, &wc) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        wc.status = IBV_WC_GENERAL_ERR;
        break;
      }
    }
    return wc;
  }
  void Close() {
    ibv_destroy_qp(qp);
    ibv_dereg_mr(mr);
    ibv_destroy_cq(cq);
    ibv_dealloc_pd(pd);
    ibv_close_device(ctx);
  }
};

// RC SENDs from droce<from> to droce<to> through GID index gid_index (0:
// IPv4, 1: IPv6); each device has its own address at that index, ending in
// 1 and 2.
void SendsBetween(int from, int to, int gid_index) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(list, nullptr);
  ASSERT_EQ(n, 2);
  EXPECT_STREQ(ibv_get_device_name(list[0]), "droce0");
  EXPECT_STREQ(ibv_get_device_name(list[1]), "droce1");
  EXPECT_EQ(ibv_get_device_index(list[1]), 1);
  Side a, b;
  a.Open(list[from], gid_index);
  b.Open(list[to], gid_index);
  ibv_free_device_list(list);
  EXPECT_EQ(std::memcmp(a.gid.raw, b.gid.raw, 16) == 0, from == to);
  EXPECT_EQ(a.gid.raw[15], from + 1);
  EXPECT_EQ(b.gid.raw[15], to + 1);
  a.Connect(b);
  b.Connect(a);
  for (int i = 0; i < 50; ++i) {
    ibv_sge rs{reinterpret_cast<uint64_t>(b.buf.data()), 4096, b.mr->lkey};
    ibv_recv_wr rw{};
    rw.wr_id = i;
    rw.sg_list = &rs;
    rw.num_sge = 1;
    ibv_recv_wr* rbad = nullptr;
    ASSERT_EQ(ibv_post_recv(b.qp, &rw, &rbad), 0);
    std::memset(a.buf.data(), 'a' + i % 26, 3000);
    ibv_sge ss{reinterpret_cast<uint64_t>(a.buf.data()), 3000, a.mr->lkey};
    ibv_send_wr sw{};
    sw.wr_id = i;
    sw.sg_list = &ss;
    sw.num_sge = 1;
    sw.opcode = IBV_WR_SEND;
    sw.send_flags = IBV_SEND_SIGNALED;
    ibv_send_wr* sbad = nullptr;
    ASSERT_EQ(ibv_post_send(a.qp, &sw, &sbad), 0);
    ibv_wc r = b.WaitOne();
    ASSERT_EQ(r.status, IBV_WC_SUCCESS) << i;
    EXPECT_EQ(r.byte_len, 3000u);
    EXPECT_EQ(b.buf[2999], 'a' + i % 26);
    ASSERT_EQ(a.WaitOne().status, IBV_WC_SUCCESS) << i;
  }
  a.Close();
  b.Close();
}

TEST_F(TwoDevices, SeparateDevicesTalkOverTheirLink) { SendsBetween(0, 1, 0); }

// Two QPs of one device, the destination the port's own address: an RNIC
// delivers such packets internally. The memif link does not return frames,
// so they used to leave for droce1, which dropped them (not its address),
// and RC ended in IBV_WC_RETRY_EXC_ERR.
TEST_F(TwoDevices, TrafficToTheOwnAddressStaysInsideTheDevice) {
  SendsBetween(0, 0, 0);
  SendsBetween(1, 1, 1);
}

// DROCE_IP6 lists one address per device, as DROCE_IP does (before, every
// device got the same one).
TEST_F(TwoDevices, EachDeviceHasItsOwnIpv6Gid) {
  SendsBetween(0, 1, 1);
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_EQ(n, 2);
  for (int i = 0; i < 2; ++i) {
    ibv_context* ctx = ibv_open_device(list[i]);
    ASSERT_NE(ctx, nullptr);
    ibv_gid gid{};
    ASSERT_EQ(ibv_query_gid(ctx, 1, 1, &gid), 0);
    in6_addr want{};
    ASSERT_EQ(inet_pton(AF_INET6, i == 0 ? "fd78:9::1" : "fd78:9::2", &want), 1);
    EXPECT_EQ(std::memcmp(gid.raw, &want, 16), 0) << "droce" << i;
    EXPECT_EQ(ibv_close_device(ctx), 0);
  }
  ibv_free_device_list(list);
}

// A UD QP in RTS on pd, with Q_Key 7.
ibv_qp* UdQp(ibv_pd* pd, ibv_cq* cq) { return droce::test::CreateUdQp(pd, cq, cq, 7); }

// A multicast from droce0 crosses the memif link to droce1's attached QPs,
// and reaches droce0's own attached QP too, as an RNIC loops multicast back
// to its own QPs (the memif link does not return frames).
TEST_F(TwoDevices, MulticastReachesMembersOnBothDevices) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ASSERT_NE(list, nullptr);
  ASSERT_EQ(n, 2);
  Side a, b;
  a.Open(list[0]);
  b.Open(list[1]);
  ibv_free_device_list(list);
  ibv_qp* tx = UdQp(a.pd, a.cq);
  ibv_qp* a_member = UdQp(a.pd, a.cq);
  ibv_qp* b_members[2] = {UdQp(b.pd, b.cq), UdQp(b.pd, b.cq)};
  ibv_qp* b_outsider = UdQp(b.pd, b.cq);
  ASSERT_TRUE(tx && a_member && b_members[0] && b_members[1] && b_outsider);
  ibv_gid group{};  // ::ffff:239.7.7.7
  group.raw[10] = group.raw[11] = 0xFF;
  group.raw[12] = 239;
  group.raw[13] = group.raw[14] = group.raw[15] = 7;
  ASSERT_EQ(ibv_attach_mcast(a_member, &group, 0), 0);
  for (ibv_qp* q : b_members) ASSERT_EQ(ibv_attach_mcast(q, &group, 0), 0);
  auto post_recv = [](Side& s, ibv_qp* q, uint64_t id) {
    ibv_sge rs{reinterpret_cast<uint64_t>(s.buf.data() + 1024 * id), 1024, s.mr->lkey};
    ibv_recv_wr rw{};
    rw.wr_id = id;
    rw.sg_list = &rs;
    rw.num_sge = 1;
    ibv_recv_wr* bad = nullptr;
    return ibv_post_recv(q, &rw, &bad);
  };
  ASSERT_EQ(post_recv(a, a_member, 1), 0);
  ASSERT_EQ(post_recv(b, b_members[0], 2), 0);
  ASSERT_EQ(post_recv(b, b_members[1], 3), 0);
  ASSERT_EQ(post_recv(b, b_outsider, 4), 0);
  ibv_ah_attr ah_attr{};
  ah_attr.is_global = 1;
  ah_attr.port_num = 1;
  ah_attr.grh.hop_limit = 1;
  ah_attr.grh.dgid = group;
  ibv_ah* ah = ibv_create_ah(a.pd, &ah_attr);
  ASSERT_NE(ah, nullptr);
  std::memcpy(a.buf.data() + 32768, "group", 5);
  ibv_sge ss{reinterpret_cast<uint64_t>(a.buf.data() + 32768), 5, a.mr->lkey};
  ibv_send_wr sw{};
  sw.wr_id = 99;
  sw.sg_list = &ss;
  sw.num_sge = 1;
  sw.opcode = IBV_WR_SEND;
  sw.send_flags = IBV_SEND_SIGNALED;
  sw.wr.ud.ah = ah;
  sw.wr.ud.remote_qpn = 0xFFFFFF;
  sw.wr.ud.remote_qkey = 7;
  ibv_send_wr* sbad = nullptr;
  ASSERT_EQ(ibv_post_send(tx, &sw, &sbad), 0);
  // droce0: the send completion and its own member's receive, in any order.
  std::vector<uint64_t> a_ids;
  for (int i = 0; i < 2; ++i) {
    ibv_wc wc = a.WaitOne();
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    a_ids.push_back(wc.wr_id);
    if (wc.wr_id == 1) {
      EXPECT_EQ(wc.qp_num, a_member->qp_num);
      EXPECT_EQ(wc.src_qp, tx->qp_num);
      EXPECT_EQ(std::memcmp(a.buf.data() + 1024 + 40, "group", 5), 0);
    }
  }
  std::sort(a_ids.begin(), a_ids.end());
  EXPECT_EQ(a_ids, (std::vector<uint64_t>{1, 99}));
  std::vector<uint32_t> b_qps;
  for (int i = 0; i < 2; ++i) {
    ibv_wc wc = b.WaitOne();
    ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
    EXPECT_EQ(wc.byte_len, 40u + 5);
    EXPECT_EQ(wc.src_qp, tx->qp_num);
    EXPECT_EQ(std::memcmp(b.buf.data() + 1024 * wc.wr_id + 40, "group", 5), 0);
    b_qps.push_back(wc.qp_num);
  }
  std::sort(b_qps.begin(), b_qps.end());
  std::vector<uint32_t> want = {b_members[0]->qp_num, b_members[1]->qp_num};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(b_qps, want);
  usleep(20000);
  ibv_wc wc;
  EXPECT_EQ(ibv_poll_cq(b.cq, 1, &wc), 0);  // not the outsider
  EXPECT_EQ(ibv_poll_cq(a.cq, 1, &wc), 0);
  EXPECT_EQ(ibv_detach_mcast(a_member, &group, 0), 0);
  for (ibv_qp* q : b_members) EXPECT_EQ(ibv_detach_mcast(q, &group, 0), 0);
  EXPECT_EQ(ibv_destroy_ah(ah), 0);
  for (ibv_qp* q : {tx, a_member, b_members[0], b_members[1], b_outsider}) EXPECT_EQ(ibv_destroy_qp(q), 0);
  a.Close();
  b.Close();
}

}  // namespace
