// An unmodified-style libibverbs program (run under `droce exec`) that checks
// the device's unaffiliated async events while netns_port_events.sh changes
// the link under it: IBV_EVENT_PORT_ERR when the link loses its carrier,
// IBV_EVENT_PORT_ACTIVE when it comes back, IBV_EVENT_DEVICE_FATAL when its
// interface is deleted. After DEVICE_FATAL, a posted receive is flushed and
// creating objects fails with EIO. Prints one line per stage for the script:
// ready, down, up, fatal. Exits 0 on success, 1 with a reason otherwise.
#include <infiniband/verbs.h>
#include <poll.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

[[noreturn]] void Fail(const char* what) {
  std::fprintf(stderr, "port_events: FAIL: %s\n", what);
  std::exit(1);
}

void Stage(const char* name) {
  std::printf("%s\n", name);
  std::fflush(stdout);
}

// Waits for the next async event, which must be `want` (or, when `skip` is
// given, any number of `skip` events first).
void WaitEvent(ibv_context* ctx, ibv_event_type want, int timeout_ms, int skip = -1) {
  for (;;) {
    pollfd p{ctx->async_fd, POLLIN, 0};
    if (poll(&p, 1, timeout_ms) != 1) {
      std::fprintf(stderr, "port_events: no event within %d ms, waiting for %s\n", timeout_ms,
                   ibv_event_type_str(want));
      std::exit(1);
    }
    ibv_async_event ev{};
    if (ibv_get_async_event(ctx, &ev) != 0) Fail("ibv_get_async_event");
    const ibv_event_type got = ev.event_type;
    const int port = ev.element.port_num;
    ibv_ack_async_event(&ev);
    if (got != IBV_EVENT_DEVICE_FATAL && port != 1) Fail("port event for a port other than 1");
    if (got == want) return;
    if (static_cast<int>(got) == skip) continue;
    std::fprintf(stderr, "port_events: got %s, want %s\n", ibv_event_type_str(got), ibv_event_type_str(want));
    std::exit(1);
  }
}

ibv_port_state PortState(ibv_context* ctx) {
  ibv_port_attr a{};
  if (ibv_query_port(ctx, 1, &a) != 0) Fail("ibv_query_port");
  return a.state;
}

// The sysfs view's ports/1/state (providers/sysfs_view.cc) once it says
// `want`: the worker rewrites it right after it raises the event, so allow it
// a moment.
void WaitSysfsState(const char* want) {
  char buf[32] = "";
  for (int i = 0; i < 1000; ++i) {
    if (FILE* f = std::fopen("/sys/class/infiniband/droce0/ports/1/state", "r")) {
      if (std::fgets(buf, sizeof(buf), f) == nullptr) buf[0] = '\0';
      std::fclose(f);
      buf[std::strcspn(buf, "\n")] = '\0';
      if (std::strcmp(buf, want) == 0) return;
    }
    poll(nullptr, 0, 1);
  }
  std::fprintf(stderr, "port_events: sysfs ports/1/state is '%s', want '%s'\n", buf, want);
  Fail("sysfs port state");
}

}  // namespace

int main() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n < 1) Fail("no device");
  ibv_context* ctx = ibv_open_device(list[0]);
  ibv_free_device_list(list);
  if (ctx == nullptr) Fail("ibv_open_device");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  std::vector<char> buf(4096);
  ibv_mr* mr = pd ? ibv_reg_mr(pd, buf.data(), buf.size(), IBV_ACCESS_LOCAL_WRITE) : nullptr;
  if (pd == nullptr || cq == nullptr || mr == nullptr) Fail("setup");
  ibv_qp_init_attr qa{};
  qa.send_cq = cq;
  qa.recv_cq = cq;
  qa.cap.max_send_wr = qa.cap.max_recv_wr = 4;
  qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
  qa.qp_type = IBV_QPT_RC;
  ibv_qp* qp = ibv_create_qp(pd, &qa);
  if (qp == nullptr) Fail("ibv_create_qp");
  ibv_qp_attr init{};
  init.qp_state = IBV_QPS_INIT;
  init.port_num = 1;
  if (ibv_modify_qp(qp, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    Fail("modify to INIT");
  }
  ibv_sge sge{reinterpret_cast<uint64_t>(buf.data()), 64, mr->lkey};
  ibv_recv_wr rwr{};
  rwr.wr_id = 42;
  rwr.sg_list = &sge;
  rwr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (ibv_post_recv(qp, &rwr, &bad) != 0) Fail("ibv_post_recv");
  if (PortState(ctx) != IBV_PORT_ACTIVE) Fail("the port is not active at start");
  WaitSysfsState("4: ACTIVE");
  Stage("ready");

  WaitEvent(ctx, IBV_EVENT_PORT_ERR, 20000);
  if (PortState(ctx) != IBV_PORT_DOWN) Fail("PORT_ERR but the port is not down");
  WaitSysfsState("1: DOWN");
  Stage("down");
  WaitEvent(ctx, IBV_EVENT_PORT_ACTIVE, 20000);
  if (PortState(ctx) != IBV_PORT_ACTIVE) Fail("PORT_ACTIVE but the port is not active");
  WaitSysfsState("4: ACTIVE");
  Stage("up");

  // Deleting an interface takes it down first: the 100 ms link poll may see
  // that (PORT_ERR) before the interface is gone (DEVICE_FATAL).
  WaitEvent(ctx, IBV_EVENT_DEVICE_FATAL, 20000, IBV_EVENT_PORT_ERR);
  if (PortState(ctx) == IBV_PORT_ACTIVE) Fail("DEVICE_FATAL but the port is still active");
  ibv_wc wc{};
  int got = 0;
  for (int i = 0; i < 5000 && got == 0; ++i) {
    got = ibv_poll_cq(cq, 1, &wc);
    if (got == 0) poll(nullptr, 0, 1);
  }
  if (got != 1 || wc.wr_id != 42 || wc.status != IBV_WC_WR_FLUSH_ERR) Fail("the posted receive was not flushed");
  errno = 0;
  if (ibv_alloc_pd(ctx) != nullptr || errno != EIO) Fail("ibv_alloc_pd on a dead device: want EIO");
  errno = 0;
  if (ibv_create_cq(ctx, 4, nullptr, nullptr, 0) != nullptr || errno != EIO) Fail("ibv_create_cq: want EIO");
  Stage("fatal");

  // Tearing down a dead device still works.
  if (ibv_destroy_qp(qp) != 0 || ibv_destroy_cq(cq) != 0 || ibv_dereg_mr(mr) != 0 || ibv_dealloc_pd(pd) != 0) {
    Fail("teardown");
  }
  if (ibv_close_device(ctx) != 0) Fail("ibv_close_device");
  return 0;
}
