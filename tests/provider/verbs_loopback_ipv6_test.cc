// The loopback fixture with an IPv6 address on the port (DROCE_IP6; run by
// the `verbs_loopback_ipv6` test, tests/provider/meson.build): GID index 1,
// RC, UC and UD over it, IPv6 multicast, and the GID-family checks.
#include "loopback_fixture.h"

namespace droce::test {
namespace {

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
  GrantRemote(b, IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
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
  EXPECT_EQ(r[0].sl, 1);  // the L3 header type, as mlx5 reports it: IPv6
  EXPECT_EQ(std::memcmp(buf_.data() + 8192 + 40, "ud over ipv6", 12), 0);
  // The GRH is the IPv6 header as sent: the AH's traffic class, flow label
  // and hop limit, UDP, and the port's address as source and destination.
  const uint8_t* g = buf_.data() + 8192;
  const uint32_t vtf = uint32_t{g[0]} << 24 | uint32_t{g[1]} << 16 | uint32_t{g[2]} << 8 | g[3];
  EXPECT_EQ(vtf >> 28, 6u);
  // The AH's DSCP; its ECN bits were 0, so the packet left ECN-capable,
  // ECT(0), as DROCE_CC=dcqcn (the default) sends data.
  EXPECT_EQ((vtf >> 20) & 0xFF, 0x28u | 0x2);
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
  EXPECT_EQ(back_attr.grh.traffic_class, 0x28 | 0x2);
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
}  // namespace droce::test
