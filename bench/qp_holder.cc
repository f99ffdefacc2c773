// qp_holder N: opens the first verbs device, creates N RC QPs (moved to
// INIT, so they sit in the engine's tables as any idle connection does),
// prints "ready N" and holds them until SIGTERM/SIGINT. bench/scrape_impact
// runs it under droce so that a scrape has N QPs' counters to read.
#include <infiniband/verbs.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {
volatile sig_atomic_t g_stop = 0;
void OnSignal(int) { g_stop = 1; }
}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 1000;
  int num = 0;
  ibv_device** list = ibv_get_device_list(&num);
  if (list == nullptr || num == 0) {
    std::fprintf(stderr, "qp_holder: no verbs device\n");
    return 1;
  }
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_pd* pd = ctx != nullptr ? ibv_alloc_pd(ctx) : nullptr;
  ibv_cq* cq = pd != nullptr ? ibv_create_cq(ctx, 16, nullptr, nullptr, 0) : nullptr;
  if (cq == nullptr) {
    std::fprintf(stderr, "qp_holder: cannot open %s\n", ibv_get_device_name(list[0]));
    return 1;
  }
  std::vector<ibv_qp*> qps;
  for (int i = 0; i < n; ++i) {
    ibv_qp_init_attr ia{};
    ia.send_cq = cq;
    ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 1;
    ia.cap.max_recv_wr = 1;
    ia.cap.max_send_sge = 1;
    ia.cap.max_recv_sge = 1;
    ibv_qp* qp = ibv_create_qp(pd, &ia);
    if (qp == nullptr) {
      std::fprintf(stderr, "qp_holder: QP %d of %d: cannot create\n", i, n);
      return 1;
    }
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.port_num = 1;
    a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
      std::fprintf(stderr, "qp_holder: QP %d: cannot move to INIT\n", i);
      return 1;
    }
    qps.push_back(qp);
  }
  signal(SIGTERM, OnSignal);
  signal(SIGINT, OnSignal);
  std::printf("ready %d\n", n);
  std::fflush(stdout);
  while (g_stop == 0) pause();
  for (ibv_qp* qp : qps) ibv_destroy_qp(qp);
  ibv_destroy_cq(cq);
  ibv_dealloc_pd(pd);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  return 0;
}
