// The verbs provider in one process on droce0's default loopback link: two
// QPs connected to each other, as conformance suites run on a hardware NIC.
// Device and port attributes, every operation of RC, UC and UD, SRQs,
// per-QP counters, and the errors the verbs API specifies for bad calls.
// The ibv_wr_* API, memory windows, SQD and posting around polls are in
// verbs_send_queue_test.cc, completion and async-event semantics in
// verbs_events_test.cc, RoCEv2 over IPv6 in verbs_loopback_ipv6_test.cc.
#include "loopback_fixture.h"

namespace droce::test {
namespace {

TEST_F(Loopback, DeviceAndPortLookLikeARoceNic) {
  ibv_device_attr da{};
  ASSERT_EQ(ibv_query_device(ctx_, &da), 0);
  EXPECT_EQ(da.phys_port_cnt, 1);
  EXPECT_GT(da.max_qp_wr, 1000);
  EXPECT_EQ(da.vendor_id, 0xFFFFFFu);  // rxe's (RXE_VENDOR_ID): no OUI of its own
  EXPECT_EQ(da.vendor_part_id, 0u);
  ibv_device_attr_ex dx{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &dx), 0);
  EXPECT_EQ(dx.phys_port_cnt_ex, 1u);  // rdma-core's test_phys_port_cnt_ex
  EXPECT_EQ(dx.orig_attr.vendor_id, da.vendor_id);
  // A command fd that exists (rdma-core's shared-PD tests dup it to import
  // the device: Loopback.ImportDevicePdAndMr) but takes no command.
  ASSERT_GE(ctx_->cmd_fd, 0);
  const char cmd[8] = {};
  errno = 0;
  EXPECT_EQ(write(ctx_->cmd_fd, cmd, sizeof(cmd)), -1);
  EXPECT_EQ(errno, EBADF);
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
  GrantRemote(b, IBV_ACCESS_REMOTE_WRITE);
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
  ibv_ah* ah = CreateSelfAh(ctx_, pd_);
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
  EXPECT_EQ(r[0].sl, 2);  // the L3 header type, as mlx5 reports it: IPv4
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

}  // namespace droce::test
