// The test clients' RC connection: one QP of droce0 through INIT, RTR and
// RTS towards `dest` at `gid` from local GID `sgid_index` (MTU 1024, 4 reads and atomics in flight,
// retries 7, local ACK timeout `timeout`: 10 is 4 ms). Returns nullptr, or the name of the step that failed.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>

inline const char* RcToRts(ibv_qp* q, uint32_t dest, const ibv_gid& gid, uint8_t sgid_index = 0,
                           uint8_t timeout = 10) {
  ibv_qp_attr at{};
  at.qp_state = IBV_QPS_INIT;
  at.port_num = 1;
  at.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE;
  if (ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) return "INIT";
  at = {};
  at.qp_state = IBV_QPS_RTR;
  at.path_mtu = IBV_MTU_1024;
  at.dest_qp_num = dest;
  at.max_dest_rd_atomic = 4;
  at.min_rnr_timer = 1;
  at.ah_attr.is_global = 1;
  at.ah_attr.grh.dgid = gid;
  at.ah_attr.grh.sgid_index = sgid_index;
  at.ah_attr.grh.hop_limit = 64;
  at.ah_attr.port_num = 1;
  if (ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) {
    return "RTR";
  }
  at = {};
  at.qp_state = IBV_QPS_RTS;
  at.timeout = timeout;
  at.retry_cnt = 7;
  at.rnr_retry = 7;
  at.max_rd_atomic = 4;
  if (ibv_modify_qp(q, &at, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                IBV_QP_MAX_QP_RD_ATOMIC)) {
    return "RTS";
  }
  return nullptr;
}
