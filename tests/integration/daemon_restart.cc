// A client of droced across a restart of the daemon; run
// as a client (`droce exec --daemon SOCKET -- daemon_restart`) by
// daemon_restart.sh, which stops droced once "ready" is printed and starts
// it again on the same socket.
//
// 1. Opens droce0 with a PD, a CQ, two connected RC QPs (one made with
//    ibv_create_qp_ex for the ibv_wr_* calls), an MR, a type 1 MW and a UD
//    AH, checks one RDMA WRITE, prints "ready" and waits for an async event.
// 2. It must be IBV_EVENT_DEVICE_FATAL; then ibv_post_send, ibv_post_recv,
//    ibv_wr_complete and ibv_bind_mw fail with EIO, nothing new can be made,
//    the port is DOWN, and every destroy and ibv_close_device succeed.
// 3. Opens droce0 again (retrying while the daemon is away) and moves
//    messages of many sizes with RDMA WRITE and SEND between two RC QPs of
//    the new daemon, checking every byte.
#include <infiniband/verbs.h>
#include <poll.h>

#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "rc_to_rts.h"

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "daemon_restart: %s (errno %d %s)\n", what, errno, std::strerror(errno));
  std::exit(1);
}

void expect(bool ok, const char* what) {
  std::printf("%s: %s\n", what, ok ? "ok" : "WRONG");
  std::fflush(stdout);
  if (!ok) std::exit(1);
}

struct Objects {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* a = nullptr;  // made with ibv_create_qp_ex (SEND and WRITE through ibv_wr_*)
  ibv_qp* b = nullptr;
};

// droce0 opened, or nullptr while no daemon serves it.
ibv_context* open_droce0() {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr) return nullptr;
  ibv_context* ctx = nullptr;
  for (int i = 0; i < n && ctx == nullptr; ++i) {
    if (std::strcmp(ibv_get_device_name(list[i]), "droce0") == 0) ctx = ibv_open_device(list[i]);
  }
  ibv_free_device_list(list);
  return ctx;
}

void to_rts(ibv_qp* q, uint32_t dest, const ibv_gid& gid) {
  if (const char* step = RcToRts(q, dest, gid)) die(step);
}

Objects make_objects(ibv_context* ctx) {
  Objects o;
  o.ctx = ctx;
  o.pd = ibv_alloc_pd(ctx);
  o.cq = ibv_create_cq(ctx, 256, nullptr, nullptr, 0);
  if (o.pd == nullptr || o.cq == nullptr) die("pd/cq");
  ibv_qp_init_attr_ex ia{};
  ia.send_cq = ia.recv_cq = o.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 64;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  ia.pd = o.pd;
  ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
  ia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
  o.a = ibv_create_qp_ex(ctx, &ia);
  ibv_qp_init_attr ib{};
  ib.send_cq = ib.recv_cq = o.cq;
  ib.qp_type = IBV_QPT_RC;
  ib.cap = ia.cap;
  o.b = ibv_create_qp(o.pd, &ib);
  if (o.a == nullptr || o.b == nullptr) die("qp");
  ibv_gid gid;
  if (ibv_query_gid(ctx, 1, 0, &gid)) die("gid");
  to_rts(o.a, o.b->qp_num, gid);
  to_rts(o.b, o.a->qp_num, gid);
  return o;
}

// The next completion, which must be a success.
ibv_wc wait_one(ibv_cq* cq) {
  ibv_wc wc{};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    const int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) die("poll");
    if (n == 1) break;
    if (std::chrono::steady_clock::now() > deadline) die("no completion in time");
  }
  if (wc.status != IBV_WC_SUCCESS) {
    std::fprintf(stderr, "daemon_restart: completion %s (wr_id %llu)\n", ibv_wc_status_str(wc.status),
                 static_cast<unsigned long long>(wc.wr_id));
    std::exit(1);
  }
  return wc;
}

int post(ibv_qp* qp, ibv_wr_opcode op, ibv_sge sge, uint32_t rkey, uint64_t raddr, uint64_t wr_id) {
  ibv_send_wr wr{}, *bad = nullptr;
  wr.wr_id = wr_id;
  wr.opcode = op;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  return ibv_post_send(qp, &wr, &bad);
}

uint8_t pattern(size_t i, uint32_t seed) { return static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8)) & 0xFF); }

// Part 1 and 2: the objects of the first daemon, its stop, the clean-up.
void across_the_stop() {
  ibv_context* ctx = open_droce0();
  if (ctx == nullptr) die("open droce0");
  Objects o = make_objects(ctx);
  constexpr size_t kLen = 4096;
  std::vector<uint8_t> src(kLen, 0x5A), dst(kLen, 0);
  const int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_MW_BIND;
  ibv_mr* ms = ibv_reg_mr(o.pd, src.data(), kLen, acc);
  ibv_mr* md = ibv_reg_mr(o.pd, dst.data(), kLen, acc);
  if (ms == nullptr || md == nullptr) die("reg_mr");
  ibv_mw* mw = ibv_alloc_mw(o.pd, IBV_MW_TYPE_1);
  if (mw == nullptr) die("alloc_mw");
  ibv_ah_attr aa{};
  aa.is_global = 1;
  if (ibv_query_gid(ctx, 1, 0, &aa.grh.dgid)) die("gid");
  aa.grh.hop_limit = 64;
  aa.port_num = 1;
  ibv_ah* ah = ibv_create_ah(o.pd, &aa);
  if (ah == nullptr) die("create_ah");
  if (post(o.a, IBV_WR_RDMA_WRITE, {reinterpret_cast<uint64_t>(src.data()), kLen, ms->lkey}, md->rkey,
           reinterpret_cast<uint64_t>(dst.data()), 1) != 0) {
    die("post WRITE");
  }
  wait_one(o.cq);
  expect(dst == src, "a WRITE on the first daemon");
  std::printf("ready\n");
  std::fflush(stdout);

  // The daemon stops now: DEVICE_FATAL (no other event is expected here).
  pollfd p{ctx->async_fd, POLLIN, 0};
  if (poll(&p, 1, 60000) != 1) die("no async event within 60 s");
  ibv_async_event ev{};
  if (ibv_get_async_event(ctx, &ev) != 0) die("get_async_event");
  const ibv_event_type type = ev.event_type;
  ibv_ack_async_event(&ev);
  std::printf("async event: %s\n", ibv_event_type_str(type));
  expect(type == IBV_EVENT_DEVICE_FATAL, "IBV_EVENT_DEVICE_FATAL");

  // As on an RNIC being reset: posting fails with EIO.
  expect(post(o.a, IBV_WR_RDMA_WRITE, {reinterpret_cast<uint64_t>(src.data()), kLen, ms->lkey}, md->rkey,
              reinterpret_cast<uint64_t>(dst.data()), 2) == EIO,
         "ibv_post_send: EIO");
  ibv_sge rs{reinterpret_cast<uint64_t>(dst.data()), kLen, md->lkey};
  ibv_recv_wr rwr{};
  rwr.sg_list = &rs;
  rwr.num_sge = 1;
  ibv_recv_wr* rbad = nullptr;
  expect(ibv_post_recv(o.b, &rwr, &rbad) == EIO, "ibv_post_recv: EIO");
  ibv_qp_ex* qpx = ibv_qp_to_qp_ex(o.a);
  if (qpx == nullptr) die("qp_to_qp_ex");
  ibv_wr_start(qpx);
  qpx->wr_id = 3;
  qpx->wr_flags = IBV_SEND_SIGNALED;
  ibv_wr_send(qpx);
  ibv_wr_set_sge(qpx, ms->lkey, reinterpret_cast<uint64_t>(src.data()), 64);
  expect(ibv_wr_complete(qpx) == EIO, "ibv_wr_complete: EIO");
  ibv_mw_bind bind{};
  bind.wr_id = 4;
  bind.send_flags = IBV_SEND_SIGNALED;
  bind.bind_info.mr = ms;
  bind.bind_info.addr = reinterpret_cast<uint64_t>(src.data());
  bind.bind_info.length = kLen;
  bind.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_READ;
  expect(ibv_bind_mw(o.a, mw, &bind) == EIO, "ibv_bind_mw: EIO");
  errno = 0;
  ibv_pd* pd2 = ibv_alloc_pd(ctx);
  expect(pd2 == nullptr && errno == EIO, "ibv_alloc_pd: EIO");
  ibv_port_attr pa{};
  expect(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_DOWN, "port DOWN");

  // Cleaning up still works.
  expect(ibv_destroy_ah(ah) == 0, "ibv_destroy_ah");
  expect(ibv_dealloc_mw(mw) == 0, "ibv_dealloc_mw");
  expect(ibv_destroy_qp(o.a) == 0 && ibv_destroy_qp(o.b) == 0, "ibv_destroy_qp");
  expect(ibv_dereg_mr(ms) == 0 && ibv_dereg_mr(md) == 0, "ibv_dereg_mr");
  expect(ibv_destroy_cq(o.cq) == 0, "ibv_destroy_cq");
  expect(ibv_dealloc_pd(o.pd) == 0, "ibv_dealloc_pd");
  expect(ibv_close_device(ctx) == 0, "ibv_close_device");
  std::printf("cleaned\n");
  std::fflush(stdout);
}

// Part 3: the restarted daemon, through a new connection.
void after_the_restart() {
  ibv_context* ctx = nullptr;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int tries = 0;
  while ((ctx = open_droce0()) == nullptr) {
    if (std::chrono::steady_clock::now() > deadline) die("droce0 did not come back within 60 s");
    ++tries;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::printf("reopened droce0 (%s)\n", tries == 0 ? "at once" : "after retries");
  ibv_port_attr pa{};
  expect(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE, "port ACTIVE again");
  Objects o = make_objects(ctx);
  constexpr size_t kLen = 65536;
  std::vector<uint8_t> src(kLen), dst(kLen), recv(kLen);
  const int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  ibv_mr* ms = ibv_reg_mr(o.pd, src.data(), kLen, acc);
  ibv_mr* md = ibv_reg_mr(o.pd, dst.data(), kLen, acc);
  ibv_mr* mr = ibv_reg_mr(o.pd, recv.data(), kLen, acc);
  if (ms == nullptr || md == nullptr || mr == nullptr) die("reg_mr");
  size_t bytes = 0;
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    const uint32_t len = 1 + (seed * 2654435761u) % kLen;
    for (size_t i = 0; i < len; ++i) src[i] = pattern(i, seed);
    // RDMA WRITE from a to b's buffer.
    if (post(o.a, IBV_WR_RDMA_WRITE, {reinterpret_cast<uint64_t>(src.data()), len, ms->lkey}, md->rkey,
             reinterpret_cast<uint64_t>(dst.data()), seed) != 0) {
      die("post WRITE");
    }
    wait_one(o.cq);
    // SEND from a into a receive posted on b.
    ibv_sge rs{reinterpret_cast<uint64_t>(recv.data()), kLen, mr->lkey};
    ibv_recv_wr rwr{};
    rwr.wr_id = 1000000 + seed;
    rwr.sg_list = &rs;
    rwr.num_sge = 1;
    ibv_recv_wr* rbad = nullptr;
    if (ibv_post_recv(o.b, &rwr, &rbad) != 0) die("post_recv");
    if (post(o.a, IBV_WR_SEND, {reinterpret_cast<uint64_t>(src.data()), len, ms->lkey}, 0, 0, seed) != 0) {
      die("post SEND");
    }
    uint32_t got_len = 0;
    for (int k = 0; k < 2; ++k) {
      const ibv_wc wc = wait_one(o.cq);
      if (wc.opcode == IBV_WC_RECV) got_len = wc.byte_len;
    }
    if (got_len != len || std::memcmp(dst.data(), src.data(), len) != 0 ||
        std::memcmp(recv.data(), src.data(), len) != 0) {
      std::fprintf(stderr, "daemon_restart: message %u (%u bytes) differs after the restart\n", seed, len);
      std::exit(1);
    }
    bytes += 2 * len;
  }
  std::printf("200 WRITEs and 200 SENDs byte-exact on the restarted daemon (%zu bytes)\n", bytes);
  if (ibv_dereg_mr(ms) || ibv_dereg_mr(md) || ibv_dereg_mr(mr) || ibv_destroy_qp(o.a) || ibv_destroy_qp(o.b) ||
      ibv_destroy_cq(o.cq) || ibv_dealloc_pd(o.pd) || ibv_close_device(ctx)) {
    die("teardown on the restarted daemon");
  }
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  across_the_stop();
  after_the_restart();
  std::printf("done\n");
  return 0;
}
