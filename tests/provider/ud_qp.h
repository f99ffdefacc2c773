// Test helper shared by the provider tests: a UD QP brought to RTS.
#pragma once

#include <infiniband/verbs.h>

#include <gtest/gtest.h>

#include <cstdint>

namespace droce::test {

// A UD QP on pd (16 send and receive WRs, one SGE each), in RTS with Q_Key
// qkey; nullptr if it cannot be created.
inline ibv_qp* CreateUdQp(ibv_pd* pd, ibv_cq* scq, ibv_cq* rcq, uint32_t qkey) {
  ibv_qp_init_attr a{};
  a.send_cq = scq;
  a.recv_cq = rcq;
  a.cap.max_send_wr = a.cap.max_recv_wr = 16;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  a.qp_type = IBV_QPT_UD;
  ibv_qp* q = ibv_create_qp(pd, &a);
  if (q == nullptr) return nullptr;
  ibv_qp_attr r{};
  r.qp_state = IBV_QPS_INIT;
  r.port_num = 1;
  r.qkey = qkey;
  EXPECT_EQ(ibv_modify_qp(q, &r, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY), 0);
  r.qp_state = IBV_QPS_RTR;
  EXPECT_EQ(ibv_modify_qp(q, &r, IBV_QP_STATE), 0);
  r.qp_state = IBV_QPS_RTS;
  EXPECT_EQ(ibv_modify_qp(q, &r, IBV_QP_STATE | IBV_QP_SQ_PSN), 0);
  return q;
}

// An address handle to the device's own GID 0 on port 1 (a UD SEND to a
// QP of the same device); nullptr if it cannot be created.
inline ibv_ah* CreateSelfAh(ibv_context* ctx, ibv_pd* pd) {
  ibv_ah_attr a{};
  a.is_global = 1;
  a.port_num = 1;
  a.grh.hop_limit = 1;
  if (ibv_query_gid(ctx, 1, 0, &a.grh.dgid) != 0) return nullptr;
  return ibv_create_ah(pd, &a);
}

}  // namespace droce::test
