// XRC through the verbs API: ibv_open_xrcd's file rules,
// XRC SRQs (ibv_create_srq_ex, ibv_get_srq_num), XRC initiator and target
// QPs (ibv_create_qp_ex), the remote SRQ number through both posting APIs,
// ibv_open_qp, and the errors ibv_*(3) and the kernel give. Runs embedded and
// as a droced client (verbs_loopback_daemon).
#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include "loopback_fixture.h"

namespace droce::test {
namespace {

class Xrc : public Loopback {
 protected:
  void SetUp() override {
    Loopback::SetUp();
    if (HasFatalFailure()) return;
    char path[] = "/tmp/droce-xrcd-XXXXXX";
    fd_ = mkstemp(path);
    ASSERT_GE(fd_, 0);
    unlink(path);
    xrcd_ = OpenXrcd(fd_, O_CREAT);
    ASSERT_NE(xrcd_, nullptr) << errno;
  }
  void TearDown() override {
    for (ibv_qp* q : xqps_) EXPECT_EQ(ibv_destroy_qp(q), 0);
    for (ibv_srq* s : srqs_) EXPECT_EQ(ibv_destroy_srq(s), 0);
    if (xrcd_ != nullptr) {
      EXPECT_EQ(ibv_close_xrcd(xrcd_), 0);
    }
    if (fd_ >= 0) close(fd_);
    Loopback::TearDown();
  }

  ibv_xrcd* OpenXrcd(int fd, int oflags) {
    ibv_xrcd_init_attr a{};
    a.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
    a.fd = fd;
    a.oflags = oflags;
    return ibv_open_xrcd(ctx_, &a);
  }
  ibv_srq* CreateXrcSrq(ibv_xrcd* xrcd, ibv_cq* cq, uint32_t max_wr = 32) {
    ibv_srq_init_attr_ex a{};
    a.attr.max_wr = max_wr;
    a.attr.max_sge = 1;
    a.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ;
    a.srq_type = IBV_SRQT_XRC;
    a.pd = pd_;
    a.xrcd = xrcd;
    a.cq = cq;
    ibv_srq* s = ibv_create_srq_ex(ctx_, &a);
    if (s != nullptr) srqs_.push_back(s);
    return s;
  }
  ibv_qp* CreateTgt(ibv_xrcd* xrcd) {
    ibv_qp_init_attr_ex a{};
    a.qp_type = IBV_QPT_XRC_RECV;
    a.comp_mask = IBV_QP_INIT_ATTR_XRCD;
    a.xrcd = xrcd;
    ibv_qp* q = ibv_create_qp_ex(ctx_, &a);
    if (q != nullptr) xqps_.push_back(q);
    return q;
  }
  ibv_qp* CreateIni() {
    ibv_qp_init_attr_ex a{};
    a.qp_type = IBV_QPT_XRC_SEND;
    a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
    a.pd = pd_;
    a.send_cq = scq_;
    a.cap.max_send_wr = 32;
    a.cap.max_send_sge = 1;
    a.sq_sig_all = 1;
    ibv_qp* q = ibv_create_qp_ex(ctx_, &a);
    if (q != nullptr) {
      xqps_.push_back(q);
      EXPECT_EQ(a.cap.max_recv_wr, 0u);  // an initiator has no receive queue
    }
    return q;
  }
  // Both ends to RTS with the attributes ib_modify_qp_is_ok requires of
  // each: a target has no requester attributes, an initiator no
  // responder ones.
  void ConnectXrc(ibv_qp* ini, ibv_qp* tgt) {
    for (ibv_qp* q : {ini, tgt}) {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_INIT;
      a.port_num = 1;
      a.qp_access_flags = q == tgt ? IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ : 0;
      ASSERT_EQ(ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
    }
    for (ibv_qp* q : {ini, tgt}) {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_RTR;
      a.path_mtu = IBV_MTU_1024;
      a.dest_qp_num = q == ini ? tgt->qp_num : ini->qp_num;
      a.rq_psn = 100;
      a.max_dest_rd_atomic = 1;
      a.min_rnr_timer = 1;
      a.ah_attr.is_global = 1;
      a.ah_attr.port_num = 1;
      a.ah_attr.grh.hop_limit = 1;
      ASSERT_EQ(ibv_query_gid(ctx_, 1, 0, &a.ah_attr.grh.dgid), 0);
      int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
      if (q == tgt) mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      ASSERT_EQ(ibv_modify_qp(q, &a, mask), 0);
    }
    for (ibv_qp* q : {ini, tgt}) {
      ibv_qp_attr a{};
      a.qp_state = IBV_QPS_RTS;
      a.sq_psn = 100;
      a.timeout = 14;
      a.retry_cnt = 7;
      a.rnr_retry = 7;
      a.max_rd_atomic = 1;
      int mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT;
      if (q == ini) mask |= IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
      ASSERT_EQ(ibv_modify_qp(q, &a, mask), 0);
    }
  }
  int PostXrcSend(ibv_qp* ini, uint64_t wr_id, uint32_t srqn, size_t off, uint32_t len,
                  ibv_wr_opcode op = IBV_WR_SEND) {
    ibv_sge sge{reinterpret_cast<uint64_t>(buf_.data() + off), len, mr_->lkey};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.qp_type.xrc.remote_srqn = srqn;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(ini, &wr, &bad);
  }

  int fd_ = -1;
  ibv_xrcd* xrcd_ = nullptr;
  std::vector<ibv_qp*> xqps_;
  std::vector<ibv_srq*> srqs_;
};

// Two XRC SRQs behind one target QP, each with its own CQ: SENDs go where
// their remote SRQ number says, through ibv_post_send and ibv_wr_*.
TEST_F(Xrc, SendsReachTheSrqTheyNameThroughBothApis) {
  ibv_cq* cq2 = ibv_create_cq(ctx_, 64, nullptr, nullptr, 0);
  ASSERT_NE(cq2, nullptr);
  ibv_srq* s1 = CreateXrcSrq(xrcd_, rcq_);
  ibv_srq* s2 = CreateXrcSrq(xrcd_, cq2);
  ASSERT_NE(s1, nullptr) << errno;
  ASSERT_NE(s2, nullptr) << errno;
  uint32_t n1 = 0, n2 = 0;
  ASSERT_EQ(ibv_get_srq_num(s1, &n1), 0);
  ASSERT_EQ(ibv_get_srq_num(s2, &n2), 0);
  EXPECT_NE(n1, n2);
  EXPECT_LT(n1, 1u << 24);
  ibv_qp* tgt = CreateTgt(xrcd_);
  ibv_qp* ini = CreateIni();
  ASSERT_NE(tgt, nullptr) << errno;
  ASSERT_NE(ini, nullptr) << errno;
  EXPECT_EQ(tgt->pd, nullptr);
  EXPECT_EQ(tgt->send_cq, nullptr);
  EXPECT_EQ(ini->recv_cq, nullptr);
  ConnectXrc(ini, tgt);
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(PostSrqRecv(s1, 10 + i, 65536 + 4096 * i, 4096), 0);
    ASSERT_EQ(PostSrqRecv(s2, 20 + i, 131072 + 4096 * i, 4096), 0);
  }
  for (int i = 0; i < 4; ++i) {
    std::memset(buf_.data() + 4096 * i, 'a' + i, 3000);
    ASSERT_EQ(PostXrcSend(ini, i, i % 2 ? n2 : n1, 4096 * i, 3000), 0);
  }
  // The extended API names the SRQ with ibv_wr_set_xrc_srqn.
  ibv_qp_ex* qx = ibv_qp_to_qp_ex(ini);
  ASSERT_NE(qx, nullptr);
  std::memset(buf_.data() + 20000, 'z', 100);
  ibv_wr_start(qx);
  qx->wr_id = 99;
  qx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(qx);
  ibv_wr_set_xrc_srqn(qx, n2);
  ibv_wr_set_sge(qx, mr_->lkey, reinterpret_cast<uint64_t>(buf_.data() + 20000), 100);
  ASSERT_EQ(ibv_wr_complete(qx), 0);

  auto sent = Poll(scq_, 5);
  ASSERT_EQ(sent.size(), 5u);
  for (const auto& wc : sent) EXPECT_EQ(wc.status, IBV_WC_SUCCESS) << wc.wr_id;
  auto r1 = Poll(rcq_, 2);
  auto r2 = Poll(cq2, 3);
  ASSERT_EQ(r1.size(), 2u);
  ASSERT_EQ(r2.size(), 3u);
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(r1[k].status, IBV_WC_SUCCESS);
    EXPECT_EQ(r1[k].wr_id, 10u + k);
    EXPECT_EQ(r1[k].byte_len, 3000u);
    EXPECT_EQ(r1[k].opcode, IBV_WC_RECV);
    EXPECT_EQ(r1[k].qp_num, tgt->qp_num);
    EXPECT_EQ(buf_[65536 + 4096 * k + 2999], 'a' + 2 * k);
  }
  EXPECT_EQ(r2[0].wr_id, 20u);
  EXPECT_EQ(r2[1].wr_id, 21u);
  EXPECT_EQ(r2[2].wr_id, 22u);
  EXPECT_EQ(r2[2].byte_len, 100u);
  EXPECT_EQ(buf_[131072 + 4096 + 2999], 'b' + 2);
  EXPECT_EQ(buf_[131072 + 8192 + 99], 'z');
  // ibv_wr_set_xrc_srqn on a QP that is not an XRC initiator fails the batch.
  ibv_qp* rc = CreateQp(scq_, rcq_);
  ASSERT_NE(rc, nullptr);
  ibv_qp_ex* rx = ibv_qp_to_qp_ex(rc);
  ibv_wr_start(rx);
  ibv_wr_send(rx);
  ibv_wr_set_xrc_srqn(rx, n1);
  EXPECT_NE(ibv_wr_complete(rx), 0);
  EXPECT_EQ(ibv_destroy_srq(s2), 0);
  srqs_.erase(std::find(srqs_.begin(), srqs_.end(), s2));
  EXPECT_EQ(ibv_destroy_cq(cq2), 0);
}

// WRITE and READ through the target need no receive WQE.
TEST_F(Xrc, RdmaThroughTheTarget) {
  ibv_mr* rmr = ibv_reg_mr(pd_, buf_.data() + 262144, 65536,
                           IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(rmr, nullptr);
  ibv_srq* s = CreateXrcSrq(xrcd_, rcq_);
  ASSERT_NE(s, nullptr);
  uint32_t n = 0;
  ASSERT_EQ(ibv_get_srq_num(s, &n), 0);
  ibv_qp* tgt = CreateTgt(xrcd_);
  ibv_qp* ini = CreateIni();
  ASSERT_NE(tgt, nullptr);
  ASSERT_NE(ini, nullptr);
  ConnectXrc(ini, tgt);
  std::memset(buf_.data(), 'w', 5000);
  ibv_sge sge{reinterpret_cast<uint64_t>(buf_.data()), 5000, mr_->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.qp_type.xrc.remote_srqn = n;
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(buf_.data() + 262144);
  wr.wr.rdma.rkey = rmr->rkey;
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(ini, &wr, &bad), 0);
  auto c = Poll(scq_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(buf_[262144 + 4999], 'w');
  sge.addr = reinterpret_cast<uint64_t>(buf_.data() + 8192);
  wr.wr_id = 2;
  wr.opcode = IBV_WR_RDMA_READ;
  ASSERT_EQ(ibv_post_send(ini, &wr, &bad), 0);
  c = Poll(scq_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(c[0].opcode, IBV_WC_RDMA_READ);
  EXPECT_EQ(buf_[8192 + 4999], 'w');
  EXPECT_EQ(ibv_dereg_mr(rmr), 0);
}

// An SRQ number that is no SRQ of the target's domain: the request is
// invalid (IBA 9.8.3), the initiator's WQE completes with REM_INV_REQ_ERR.
TEST_F(Xrc, UnknownSrqNumberIsARemoteInvalidRequest) {
  ibv_qp* tgt = CreateTgt(xrcd_);
  ibv_qp* ini = CreateIni();
  ASSERT_NE(tgt, nullptr);
  ASSERT_NE(ini, nullptr);
  ConnectXrc(ini, tgt);
  ASSERT_EQ(PostXrcSend(ini, 7, 0xABCDE, 0, 64), 0);
  auto c = Poll(scq_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, IBV_WC_REM_INV_REQ_ERR);
}

// ibv_open_xrcd(3) with the kernel's rules, and sharing by file.
TEST_F(Xrc, OpenXrcdFileRules) {
  // The file already has a domain: O_EXCL refuses it, no flags share it.
  errno = 0;
  EXPECT_EQ(OpenXrcd(fd_, O_CREAT | O_EXCL), nullptr);
  EXPECT_EQ(errno, EEXIST);
  ibv_xrcd* again = OpenXrcd(fd_, 0);
  ASSERT_NE(again, nullptr);
  // A file with no domain yet, without O_CREAT: EINVAL; fd -1 needs O_CREAT.
  char path[] = "/tmp/droce-xrcd-XXXXXX";
  int other = mkstemp(path);
  ASSERT_GE(other, 0);
  unlink(path);
  errno = 0;
  EXPECT_EQ(OpenXrcd(other, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  errno = 0;
  EXPECT_EQ(OpenXrcd(-1, 0), nullptr);
  EXPECT_EQ(errno, EINVAL);
  ibv_xrcd* anon = OpenXrcd(-1, O_CREAT);
  ASSERT_NE(anon, nullptr);
  close(other);
  // An SRQ made through one open is reachable by a target QP made through
  // the other: one domain.
  ibv_srq* s = CreateXrcSrq(again, rcq_);
  ASSERT_NE(s, nullptr);
  ibv_qp* tgt = CreateTgt(xrcd_);
  ibv_qp* ini = CreateIni();
  ASSERT_NE(tgt, nullptr);
  ASSERT_NE(ini, nullptr);
  ConnectXrc(ini, tgt);
  uint32_t n = 0;
  ASSERT_EQ(ibv_get_srq_num(s, &n), 0);
  ASSERT_EQ(PostSrqRecv(s, 5, 65536, 256), 0);
  ASSERT_EQ(PostXrcSend(ini, 1, n, 0, 100), 0);
  auto r = Poll(rcq_, 1);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status, IBV_WC_SUCCESS);
  // The anonymous domain is another: its SRQ is not the target's.
  ibv_srq* foreign = CreateXrcSrq(anon, rcq_);
  ASSERT_NE(foreign, nullptr);
  ASSERT_EQ(ibv_get_srq_num(foreign, &n), 0);
  ASSERT_EQ(PostSrqRecv(foreign, 6, 65536, 256), 0);
  ASSERT_EQ(PostXrcSend(ini, 2, n, 0, 100), 0);
  auto sent = Poll(scq_, 2);
  ASSERT_EQ(sent.size(), 2u);
  EXPECT_EQ(sent[1].status, IBV_WC_REM_INV_REQ_ERR);
  // A domain in use cannot close (the last open of it); a shared one can.
  EXPECT_EQ(ibv_close_xrcd(anon), EBUSY);
  EXPECT_EQ(ibv_destroy_srq(foreign), 0);
  srqs_.erase(std::find(srqs_.begin(), srqs_.end(), foreign));
  EXPECT_EQ(ibv_close_xrcd(anon), 0);
  EXPECT_EQ(ibv_close_xrcd(again), 0);  // xrcd_ still holds the domain
}

// ibv_open_qp: another handle on a target QP; the creator's handle cannot
// go while it is open (EBUSY, as the kernel), the opened one goes alone.
TEST_F(Xrc, OpenQpSharesTheTarget) {
  ibv_qp* tgt = CreateTgt(xrcd_);
  ASSERT_NE(tgt, nullptr);
  ibv_qp_open_attr oa{};
  oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  oa.qp_num = tgt->qp_num;
  oa.xrcd = xrcd_;
  oa.qp_type = IBV_QPT_XRC_RECV;
  ibv_qp* opened = ibv_open_qp(ctx_, &oa);
  ASSERT_NE(opened, nullptr) << errno;
  EXPECT_EQ(opened->qp_num, tgt->qp_num);
  // A modify through the opened handle reaches the QP.
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  ASSERT_EQ(ibv_modify_qp(opened, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS), 0);
  ibv_qp_init_attr ia{};
  ASSERT_EQ(ibv_query_qp(tgt, &a, IBV_QP_STATE, &ia), 0);
  EXPECT_EQ(a.qp_state, IBV_QPS_INIT);
  EXPECT_EQ(ibv_destroy_qp(tgt), EBUSY);
  EXPECT_EQ(ibv_destroy_qp(opened), 0);
  // No such QP in the domain; only target QPs are opened.
  oa.qp_num = tgt->qp_num + 1000;
  errno = 0;
  EXPECT_EQ(ibv_open_qp(ctx_, &oa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  oa.qp_num = tgt->qp_num;
  oa.qp_type = IBV_QPT_RC;
  errno = 0;
  EXPECT_EQ(ibv_open_qp(ctx_, &oa), nullptr);
  EXPECT_EQ(errno, EINVAL);
}

// What XRC QPs refuse: receives on either, ATOMIC WRITE and a receive queue
// on an initiator, an XRC domain on other QP types, an SRQ on XRC QPs.
TEST_F(Xrc, Refusals) {
  ibv_srq* s = CreateXrcSrq(xrcd_, rcq_);
  ASSERT_NE(s, nullptr);
  ibv_qp* tgt = CreateTgt(xrcd_);
  ibv_qp* ini = CreateIni();
  ASSERT_NE(tgt, nullptr);
  ASSERT_NE(ini, nullptr);
  ConnectXrc(ini, tgt);
  EXPECT_EQ(PostRecv(tgt, 1, 0, 64), EINVAL);
  EXPECT_EQ(PostRecv(ini, 1, 0, 64), EINVAL);
  EXPECT_EQ(PostXrcSend(ini, 1, 0, 0, 8, IBV_WR_ATOMIC_WRITE), EINVAL);
  EXPECT_EQ(PostXrcSend(tgt, 1, 0, 0, 8), EINVAL);
  ibv_qp_init_attr_ex a{};
  a.qp_type = IBV_QPT_RC;
  a.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_XRCD;
  a.pd = pd_;
  a.xrcd = xrcd_;
  a.send_cq = a.recv_cq = scq_;
  a.cap.max_send_wr = a.cap.max_recv_wr = 4;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  a.qp_type = IBV_QPT_XRC_SEND;
  a.comp_mask = IBV_QP_INIT_ATTR_PD;
  a.srq = s;
  errno = 0;
  EXPECT_EQ(ibv_create_qp_ex(ctx_, &a), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // An XRC SRQ needs its domain and CQ.
  ibv_srq_init_attr_ex sa{};
  sa.attr.max_wr = 4;
  sa.attr.max_sge = 1;
  sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD;
  sa.srq_type = IBV_SRQT_XRC;
  sa.pd = pd_;
  sa.xrcd = xrcd_;
  errno = 0;
  EXPECT_EQ(ibv_create_srq_ex(ctx_, &sa), nullptr);
  EXPECT_EQ(errno, EINVAL);
  // A domain with SRQs and target QPs cannot close.
  EXPECT_EQ(ibv_close_xrcd(xrcd_), EBUSY);
}

}  // namespace
}  // namespace droce::test
