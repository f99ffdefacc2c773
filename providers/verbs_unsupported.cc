// libibverbs entry points that droce does not implement yet. Each is defined
// here, because libibverbs' own implementation would reach into provider
// private state that droce's objects do not have (and crash). Each fails the
// way its man page documents: NULL with errno, or an errno return.
#include <cerrno>

#include "provider.h"
#include "system_verbs.h"

namespace {
template <typename T>
T* fail_null(int e = EOPNOTSUPP) {
  errno = e;
  return nullptr;
}
}  // namespace

using droce::provider::ctx_of;

extern "C" {

int ibv_resolve_eth_l2_from_gid(ibv_context* context, ibv_ah_attr* attr, uint8_t eth_mac[6], uint16_t* vid) {
  DROCE_FORWARD_FOREIGN(context, ibv_resolve_eth_l2_from_gid, context, attr, eth_mac, vid);
  errno = EOPNOTSUPP;
  return -1;
}

ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* pd, uint64_t offset, size_t length, uint64_t iova, int fd, int access) {
  DROCE_FORWARD_FOREIGN(ctx_of(pd), ibv_reg_dmabuf_mr, pd, offset, length, iova, fd, access);
  return fail_null<ibv_mr>();
}

int ibv_set_ece(ibv_qp* qp, ibv_ece* ece) {
  DROCE_FORWARD_FOREIGN(ctx_of(qp), ibv_set_ece, qp, ece);
  return EOPNOTSUPP;
}
int ibv_query_ece(ibv_qp* qp, ibv_ece* ece) {
  DROCE_FORWARD_FOREIGN(ctx_of(qp), ibv_query_ece, qp, ece);
  return EOPNOTSUPP;
}
int ibv_query_qp_data_in_order(ibv_qp* qp, enum ibv_wr_opcode op, uint32_t flags) {
  DROCE_FORWARD_FOREIGN(ctx_of(qp), ibv_query_qp_data_in_order, qp, op, flags);
  return 0;
}

ibv_dm* ibv_import_dm(ibv_context* context, uint32_t handle) {
  DROCE_FORWARD_FOREIGN(context, ibv_import_dm, context, handle);
  return fail_null<ibv_dm>();
}
void ibv_unimport_dm(ibv_dm* dm) { DROCE_FORWARD_FOREIGN(ctx_of(dm), ibv_unimport_dm, dm); }

}  // extern "C"
