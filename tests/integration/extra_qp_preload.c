// A library preloaded after libdroce.so on ONE side of a pair
// (workers_pair.sh): before the program's main, it creates
// DROCE_TEST_EXTRA_QPS (default 1) RC QPs on the first device and keeps them
// for the life of the process. The program's own QPs are then created that
// many places later on this side than on its peer.
//
// Why: QPs go to a device's workers round-robin at creation, and over memif
// the peer's tx queue i is our rx queue i. Two copies of the same program
// create their QPs in the same order and pair QP k with QP k, so each pair
// sits on the same worker index on both sides and every packet arrives on its
// owner's queue: no hand-off ever happens. One extra QP on one side (with two
// workers) puts every pair across workers, so every packet is handed off.
//
// It links libdroce.so (DT_NEEDED), so libdroce's initialisers have run when
// this constructor calls into it. Kept QPs stay in RESET: no traffic.
//
// Put it in LD_PRELOAD before `droce exec`: the launcher itself then loads it
// too, but does nothing with it, since only the program's LD_PRELOAD has
// libdroce.so (the launcher prepends it); there the constructor acts.
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void fail(const char* what) {
  fprintf(stderr, "extra_qp_preload: %s failed\n", what);
  exit(1);
}

__attribute__((constructor)) static void create_extra_qps(void) {
  const char* preload = getenv("LD_PRELOAD");
  if (preload == NULL || strstr(preload, "libdroce.so") == NULL) return;  // the launcher
  const char* env = getenv("DROCE_TEST_EXTRA_QPS");
  const int n = env != NULL && *env != '\0' ? atoi(env) : 1;
  if (n <= 0) return;
  int num = 0;
  struct ibv_device** list = ibv_get_device_list(&num);
  if (list == NULL || num == 0) fail("ibv_get_device_list");
  struct ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (ctx == NULL) fail("ibv_open_device");
  struct ibv_pd* pd = ibv_alloc_pd(ctx);
  if (pd == NULL) fail("ibv_alloc_pd");
  struct ibv_cq* cq = ibv_create_cq(ctx, 1, NULL, NULL, 0);
  if (cq == NULL) fail("ibv_create_cq");
  for (int i = 0; i < n; ++i) {
    struct ibv_qp_init_attr attr = {
        .send_cq = cq,
        .recv_cq = cq,
        .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
        .qp_type = IBV_QPT_RC,
    };
    if (ibv_create_qp(pd, &attr) == NULL) fail("ibv_create_qp");
  }
  fprintf(stderr, "extra_qp_preload: %d QP(s) created on %s before the program's own\n", n,
          ibv_get_device_name(ctx->device));
}
