// libibverbs entry points that droce does not implement yet. Each is defined
// here, because libibverbs' own implementation would reach into provider
// private state that droce's objects do not have (and crash). Each fails the
// way its man page documents: NULL with errno, or an errno return.
#include <cerrno>

#include "provider.h"

namespace {
template <typename T>
T* fail_null(int e = EOPNOTSUPP) {
  errno = e;
  return nullptr;
}
}  // namespace

extern "C" {

int ibv_resolve_eth_l2_from_gid(ibv_context*, ibv_ah_attr*, uint8_t*, uint16_t*) {
  errno = EOPNOTSUPP;
  return -1;
}

ibv_mr* ibv_reg_dmabuf_mr(ibv_pd*, uint64_t, size_t, uint64_t, int, int) { return fail_null<ibv_mr>(); }

int ibv_set_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
int ibv_query_ece(ibv_qp*, ibv_ece*) { return EOPNOTSUPP; }
int ibv_query_qp_data_in_order(ibv_qp*, enum ibv_wr_opcode, uint32_t) { return 0; }

ibv_dm* ibv_import_dm(ibv_context*, uint32_t) { return fail_null<ibv_dm>(); }
void ibv_unimport_dm(ibv_dm*) {}

}  // extern "C"
