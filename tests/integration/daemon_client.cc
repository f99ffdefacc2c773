// A client of droced for the daemon tests (daemon_clients.sh), run under
// libdroce.so with DROCE_DAEMON set:
//   daemon_client traffic SECONDS   two RC QPs of one device connected to each
//                                   other, SENDs and RDMA WRITEs of patterned
//                                   data, every byte checked; exit 0 if all
//                                   arrived intact and every completion was a
//                                   success
//   daemon_client victim            the same until it is killed
//   daemon_client memory            each kind of registered memory (malloc,
//                                   stack, private file mapping, memfd
//                                   MAP_SHARED, two overlapping registrations,
//                                   a buffer freed while registered, fork after
//                                   registration, a MAP_SHARED file, SysV shm)
//                                   written by RDMA WRITE and read back by
//                                   RDMA READ (with DROCE_REMAP=0: all by the
//                                   copy tier)
//   daemon_client isolation         two clients; one uses the other's keys
//   daemon_client peer-death        an RC peer SIGKILLed: RETRY_EXC_ERR
//   daemon_client limits            RLIMIT_MEMLOCK bounds registrations
//   daemon_client fatal             waits for IBV_EVENT_DEVICE_FATAL (droced stops)
//   daemon_client hostile SOCKET SEED
//                                   speaks the control protocol itself:
//                                   random, truncated, replayed and
//                                   out-of-order messages, foreign handles;
//                                   exit 0 once done (the daemon must survive)
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>

#include <csignal>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ctl/protocol.h"
#include "queue/doorbell.h"
#include "rc_to_rts.h"

namespace {

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "daemon_client: %s (errno %d %s)\n", what, errno, std::strerror(errno));
  std::exit(1);
}

struct Pair {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_qp* a = nullptr;
  ibv_qp* b = nullptr;
};

void to_rts(ibv_qp* q, uint32_t dest, const ibv_gid& gid) {
  if (const char* step = RcToRts(q, dest, gid)) die(step);
}

// A device, PD, CQ and one RC QP (a), or two (a, b) in RESET.
Pair open_qps(bool two) {
  Pair p;
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n < 1) die("no device");
  p.ctx = ibv_open_device(list[0]);
  if (p.ctx == nullptr) die("open");
  p.pd = ibv_alloc_pd(p.ctx);
  p.cq = ibv_create_cq(p.ctx, 256, nullptr, nullptr, 0);
  if (p.pd == nullptr || p.cq == nullptr) die("pd/cq");
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = p.cq;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 64;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  p.a = ibv_create_qp(p.pd, &ia);
  p.b = two ? ibv_create_qp(p.pd, &ia) : nullptr;
  if (p.a == nullptr || (two && p.b == nullptr)) die("qp");
  return p;
}

// Two RC QPs of one device connected to each other.
Pair open_pair() {
  Pair p = open_qps(true);
  ibv_gid gid;
  if (ibv_query_gid(p.ctx, 1, 0, &gid)) die("gid");
  to_rts(p.a, p.b->qp_num, gid);
  to_rts(p.b, p.a->qp_num, gid);
  return p;
}

// The next completion, whatever its status (dies after `secs` without one).
ibv_wc poll_one(ibv_cq* cq, int secs = 10) {
  ibv_wc wc{};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(secs);
  for (;;) {
    const int n = ibv_poll_cq(cq, 1, &wc);
    if (n < 0) die("poll");
    if (n == 1) return wc;
    if (std::chrono::steady_clock::now() > deadline) die("no completion in time");
  }
}

// The next completion, which must be a success.
ibv_wc wait_one(ibv_cq* cq) {
  const ibv_wc wc = poll_one(cq);
  if (wc.status != IBV_WC_SUCCESS) {
    std::fprintf(stderr, "daemon_client: completion %s (wr_id %llu)\n", ibv_wc_status_str(wc.status),
                 static_cast<unsigned long long>(wc.wr_id));
    std::exit(1);
  }
  return wc;
}

// Posts one signaled work request of one SGE on qp and returns its
// completion, whatever the status.
ibv_wc post_one(ibv_qp* qp, ibv_cq* cq, ibv_wr_opcode op, ibv_sge sge, uint32_t rkey = 0, uint64_t raddr = 0,
                int secs = 10) {
  ibv_send_wr wr{}, *bad;
  wr.opcode = op;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = raddr;
  wr.wr.rdma.rkey = rkey;
  if (ibv_post_send(qp, &wr, &bad)) die("post");
  return poll_one(cq, secs);
}

void rdma(Pair& p, ibv_wr_opcode op, ibv_mr* local, void* laddr, ibv_mr* remote, void* raddr, uint32_t len) {
  const ibv_wc wc = post_one(p.a, p.cq, op, {reinterpret_cast<uint64_t>(laddr), len, local->lkey}, remote->rkey,
                             reinterpret_cast<uint64_t>(raddr));
  if (wc.status != IBV_WC_SUCCESS) {
    std::fprintf(stderr, "daemon_client: completion %s\n", ibv_wc_status_str(wc.status));
    std::exit(1);
  }
}

void fill(uint8_t* b, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8)) & 0xFF);
}

bool check(const uint8_t* b, size_t n, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) {
    if (b[i] != static_cast<uint8_t>((i * 131 + seed * 7 + (i >> 8)) & 0xFF)) return false;
  }
  return true;
}

int traffic(double seconds) {
  Pair p = open_pair();
  constexpr size_t kLen = 16384;
  std::vector<uint8_t> src(kLen), dst(kLen), back(kLen);
  const int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  ibv_mr* ms = ibv_reg_mr(p.pd, src.data(), kLen, acc);
  ibv_mr* md = ibv_reg_mr(p.pd, dst.data(), kLen, acc);
  ibv_mr* mb = ibv_reg_mr(p.pd, back.data(), kLen, acc);
  if (ms == nullptr || md == nullptr || mb == nullptr) die("reg_mr");
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  uint64_t rounds = 0;
  for (uint32_t seed = 1; seconds < 0 || std::chrono::steady_clock::now() < end; ++seed) {
    const uint32_t len = 1 + (seed * 2654435761u) % kLen;
    fill(src.data(), len, seed);
    // SEND a → b into dst, then READ it back from b's dst into back.
    ibv_sge rs{reinterpret_cast<uint64_t>(dst.data()), static_cast<uint32_t>(kLen), md->lkey};
    ibv_recv_wr rw{}, *rbad;
    rw.sg_list = &rs;
    rw.num_sge = 1;
    if (ibv_post_recv(p.b, &rw, &rbad)) die("post_recv");
    ibv_sge ss{reinterpret_cast<uint64_t>(src.data()), len, ms->lkey};
    ibv_send_wr sw{}, *sbad;
    sw.opcode = IBV_WR_SEND;
    sw.sg_list = &ss;
    sw.num_sge = 1;
    sw.send_flags = IBV_SEND_SIGNALED;
    if (ibv_post_send(p.a, &sw, &sbad)) die("post_send");
    wait_one(p.cq);
    wait_one(p.cq);
    if (!check(dst.data(), len, seed)) die("SEND data differs");
    std::memset(back.data(), 0, len);
    rdma(p, IBV_WR_RDMA_READ, mb, back.data(), md, dst.data(), len);
    if (!check(back.data(), len, seed)) die("READ data differs");
    ++rounds;
  }
  std::printf("traffic: %llu rounds byte-exact\n", static_cast<unsigned long long>(rounds));
  std::fflush(stdout);
  // An orderly close (DROCE_STATS=1 prints the device's counters here).
  ibv_dereg_mr(ms);
  ibv_dereg_mr(md);
  ibv_dereg_mr(mb);
  if (ibv_destroy_qp(p.a) || ibv_destroy_qp(p.b) || ibv_destroy_cq(p.cq) || ibv_dealloc_pd(p.pd) ||
      ibv_close_device(p.ctx)) {
    die("teardown");
  }
  return 0;
}

// Writes `len` patterned bytes from a scratch MR into [buf, buf+len) (MR mr)
// with RDMA WRITE, checks them in place, changes them locally and reads
// them back with RDMA READ.
bool roundtrip(Pair& p, ibv_mr* mr, uint8_t* buf, uint32_t len, uint32_t seed) {
  static std::vector<uint8_t> scratch(1 << 20);
  static ibv_mr* smr = ibv_reg_mr(p.pd, scratch.data(), scratch.size(),
                                  IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (smr == nullptr) die("scratch MR");
  fill(scratch.data(), len, seed);
  rdma(p, IBV_WR_RDMA_WRITE, smr, scratch.data(), mr, buf, len);
  if (!check(buf, len, seed)) return false;
  fill(buf, len, seed + 1);
  std::memset(scratch.data(), 0, len);
  rdma(p, IBV_WR_RDMA_READ, smr, scratch.data(), mr, buf, len);
  return check(scratch.data(), len, seed + 1);
}

int memory() {
  Pair p = open_pair();
  const int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  int failed = 0;
  auto expect = [&](bool ok, const char* what) {
    std::printf("%s: %s\n", what, ok ? "ok" : "FAILED");
    failed += ok ? 0 : 1;
  };
  {  // malloc
    auto* b = static_cast<uint8_t*>(std::malloc(10000));
    ibv_mr* mr = ibv_reg_mr(p.pd, b + 3, 9000, acc);
    expect(mr != nullptr && roundtrip(p, mr, b + 3, 9000, 1), "malloc buffer");
    if (mr) ibv_dereg_mr(mr);
    std::free(b);
  }
  {  // the stack
    alignas(64) uint8_t b[6000];
    ibv_mr* mr = ibv_reg_mr(p.pd, b, sizeof(b), acc);
    expect(mr != nullptr && roundtrip(p, mr, b, sizeof(b), 2), "stack buffer");
    if (mr) ibv_dereg_mr(mr);
  }
  {  // a private file mapping
    char path[] = "/tmp/droce-memtest-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0 || ftruncate(fd, 1 << 16) != 0) die("tmp file");
    auto* b = static_cast<uint8_t*>(mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0));
    ibv_mr* mr = ibv_reg_mr(p.pd, b + 100, 30000, acc);
    expect(mr != nullptr && roundtrip(p, mr, b + 100, 30000, 3), "private file mapping");
    if (mr) ibv_dereg_mr(mr);
    munmap(b, 1 << 16);
    close(fd);
    unlink(path);
  }
  {  // a memfd mapped shared (tier A: mapped by the daemon as it is)
    const int fd = memfd_create("app-buffer", MFD_ALLOW_SEALING);
    if (fd < 0 || ftruncate(fd, 1 << 16) != 0) die("memfd");
    auto* b = static_cast<uint8_t*>(mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    auto* alias = static_cast<uint8_t*>(mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ibv_mr* mr = ibv_reg_mr(p.pd, b, 1 << 16, acc);
    // Written through the daemon's own mapping of the file: the app's other
    // mapping of it sees the bytes (nothing was copied).
    expect(mr != nullptr && roundtrip(p, mr, b, 1 << 16, 4) && check(alias, 1 << 16, 5), "memfd MAP_SHARED");
    if (mr) ibv_dereg_mr(mr);
    munmap(b, 1 << 16);
    munmap(alias, 1 << 16);
    close(fd);
  }
  {  // two overlapping registrations, deregistered in turn
    auto* b = static_cast<uint8_t*>(std::aligned_alloc(4096, 1 << 16));
    ibv_mr* m1 = ibv_reg_mr(p.pd, b, 40000, acc);
    ibv_mr* m2 = ibv_reg_mr(p.pd, b + 20000, 40000, acc);
    bool ok = m1 != nullptr && m2 != nullptr && roundtrip(p, m1, b, 40000, 6) && roundtrip(p, m2, b + 20000, 40000, 8);
    if (m1) ibv_dereg_mr(m1);
    ok = ok && roundtrip(p, m2, b + 20000, 40000, 10);  // m2 still works without m1
    if (m2) ibv_dereg_mr(m2);
    // Back in private memory, with the data.
    ok = ok && check(b + 20000, 40000, 11);
    expect(ok, "overlapping registrations");
    std::free(b);
  }
  {  // freed (unmapped) while registered: the daemon must not crash, the MR
     // can still be deregistered
    auto* b = static_cast<uint8_t*>(mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    ibv_mr* mr = ibv_reg_mr(p.pd, b, 1 << 16, acc);
    bool ok = mr != nullptr && roundtrip(p, mr, b, 4096, 12);
    munmap(b, 1 << 16);
    static std::vector<uint8_t> s2(4096);
    ibv_mr* smr = ibv_reg_mr(p.pd, s2.data(), s2.size(), acc);
    // Into memory no longer mapped: harmless. Moved or shared pages are still
    // mapped by the daemon (the WRITE succeeds and nobody sees it). With the
    // copy tier (DROCE_REMAP=0) the responder cannot write there and answers
    // a remote access error (the pair would go to error): not tried.
    const char* remap = std::getenv("DROCE_REMAP");
    if (ok && smr && !(remap != nullptr && std::strcmp(remap, "0") == 0)) {
      rdma(p, IBV_WR_RDMA_WRITE, smr, s2.data(), mr, b, 4096);
    }
    ok = ok && ibv_dereg_mr(mr) == 0;
    if (smr) ibv_dereg_mr(smr);
    expect(ok, "buffer unmapped while registered");
  }
  {  // fork after registration: the parent's traffic goes on and the child
     // cannot change the parent's registered pages: moved pages (tier B) are
     // not inherited (MADV_DONTFORK, as with rdma-core: the child faults),
     // others are copied on write as usual
    auto* b = static_cast<uint8_t*>(std::aligned_alloc(4096, 8192));
    ibv_mr* mr = ibv_reg_mr(p.pd, b, 8192, acc);
    fill(b, 8192, 20);
    const pid_t child = fork();
    if (child == 0) {
      signal(SIGSEGV, SIG_DFL);  // a sanitizer's handler would turn the fault into an abort
      b[0] ^= 0xFF;
      _exit(0);
    }
    int status = 0;
    waitpid(child, &status, 0);
    const bool child_ok = (WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) || (WIFEXITED(status) && WEXITSTATUS(status) == 0);
    expect(mr != nullptr && child_ok && check(b, 8192, 20) && roundtrip(p, mr, b, 8192, 14), "fork after registration");
    if (mr) ibv_dereg_mr(mr);
    std::free(b);
  }
  {  // a MAP_SHARED regular file: the bytes reach the file
    char path[] = "/tmp/droce-memtest-XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0 || ftruncate(fd, 1 << 16) != 0) die("tmp file");
    auto* b = static_cast<uint8_t*>(mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    ibv_mr* mr = ibv_reg_mr(p.pd, b + 64, 20000, acc);
    bool ok = mr != nullptr && roundtrip(p, mr, b + 64, 20000, 16);
    std::vector<uint8_t> file(20000);
    ok = ok && pread(fd, file.data(), file.size(), 64) == 20000 && check(file.data(), 20000, 17);
    expect(ok, "MAP_SHARED file");
    if (mr) ibv_dereg_mr(mr);
    munmap(b, 1 << 16);
    close(fd);
    unlink(path);
  }
  {  // SysV shared memory, as perftest --use_hugepages allocates it
    const int id = shmget(IPC_PRIVATE, 1 << 16, IPC_CREAT | 0600);
    auto* b = id < 0 ? nullptr : static_cast<uint8_t*>(shmat(id, nullptr, 0));
    if (id >= 0) shmctl(id, IPC_RMID, nullptr);
    ibv_mr* mr = b == nullptr ? nullptr : ibv_reg_mr(p.pd, b, 1 << 16, acc);
    expect(mr != nullptr && roundtrip(p, mr, b, 1 << 16, 18), "SysV shm");
    if (mr) ibv_dereg_mr(mr);
    if (b) shmdt(b);
  }
  return failed == 0 ? 0 : 1;
}

// Two clients of one daemon: the child registers memory, the parent tries
// to use the child's keys with its own QPs. Both must fail as the verbs
// rules say: a foreign lkey in a local SGE is a protection error
// (IBV_WC_LOC_PROT_ERR), a foreign rkey at the responder a remote access
// error; the child's memory is untouched.
int isolation() {
  int to_parent[2], to_child[2];
  if (pipe(to_parent) != 0 || pipe(to_child) != 0) die("pipe");
  const pid_t child = fork();
  if (child == 0) {
    Pair p = open_pair();
    static uint8_t secret[8192];
    fill(secret, sizeof(secret), 77);
    ibv_mr* mr = ibv_reg_mr(p.pd, secret, sizeof(secret),
                            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (mr == nullptr) _exit(2);
    const uint64_t msg[3] = {mr->lkey, mr->rkey, reinterpret_cast<uint64_t>(secret)};
    if (write(to_parent[1], msg, sizeof(msg)) != sizeof(msg)) _exit(3);
    char done;
    if (read(to_child[0], &done, 1) != 1) _exit(4);
    _exit(check(secret, sizeof(secret), 77) ? 0 : 5);  // untouched
  }
  uint64_t msg[3];
  if (read(to_parent[0], msg, sizeof(msg)) != sizeof(msg)) die("child");
  Pair p = open_pair();
  static uint8_t mine[8192];
  ibv_mr* mr = ibv_reg_mr(p.pd, mine, sizeof(mine),
                          IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
  if (mr == nullptr) die("reg_mr");
  int failed = 0;
  auto post = [&](ibv_qp* qp, ibv_cq* cq, uint32_t lkey, uint64_t laddr, uint32_t rkey, uint64_t raddr) {
    return post_one(qp, cq, IBV_WR_RDMA_WRITE, {laddr, 64, lkey}, rkey, raddr).status;
  };
  // The child's lkey as a local buffer of ours.
  const ibv_wc_status s1 = post(p.a, p.cq, static_cast<uint32_t>(msg[0]), msg[2], mr->rkey,
                                reinterpret_cast<uint64_t>(mine));
  std::printf("foreign lkey: %s\n", ibv_wc_status_str(s1));
  failed += s1 != IBV_WC_LOC_PROT_ERR;
  // The child's rkey as the target of an RDMA WRITE through our own QPs
  // (on a fresh pair: the first is in error now).
  Pair q = open_pair();
  ibv_mr* mr2 = ibv_reg_mr(q.pd, mine, sizeof(mine), IBV_ACCESS_LOCAL_WRITE);
  const ibv_wc_status s2 = post(q.a, q.cq, mr2->lkey, reinterpret_cast<uint64_t>(mine),
                                static_cast<uint32_t>(msg[1]), msg[2]);
  std::printf("foreign rkey: %s\n", ibv_wc_status_str(s2));
  failed += s2 != IBV_WC_REM_ACCESS_ERR;
  if (write(to_child[1], "x", 1) != 1) die("pipe");
  int status = 0;
  waitpid(child, &status, 0);
  const bool untouched = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  std::printf("the other client's memory: %s\n", untouched ? "untouched" : "CHANGED or child failed");
  failed += !untouched;
  return failed == 0 ? 0 : 1;
}

// A client's RC peer dies (SIGKILL) mid-connection: droced tears the dead
// client's QP down, and the survivor's next SEND ends with
// IBV_WC_RETRY_EXC_ERR, as with a dead host — not with data going anywhere.
int peer_death() {
  int up[2], down[2];
  if (pipe(up) != 0 || pipe(down) != 0) die("pipe");
  const pid_t child = fork();
  // Both processes: the child's connection to droced is its own (made after fork).
  Pair p = open_qps(false);
  uint32_t mine = p.a->qp_num, theirs = 0;
  if (child == 0) {
    if (write(up[1], &mine, 4) != 4 || read(down[0], &theirs, 4) != 4) _exit(2);
  } else {
    if (read(up[0], &theirs, 4) != 4 || write(down[1], &mine, 4) != 4) die("pipe");
  }
  ibv_gid gid;
  ibv_query_gid(p.ctx, 1, 0, &gid);
  to_rts(p.a, theirs, gid);
  if (child == 0) {
    pause();  // until killed
    _exit(0);
  }
  usleep(100000);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  usleep(200000);  // droced notices at once (socket EOF, pidfd) and destroys the QP
  static uint8_t buf[64];
  ibv_mr* mr = ibv_reg_mr(p.pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
  const ibv_wc wc = post_one(p.a, p.cq, IBV_WR_SEND, {reinterpret_cast<uint64_t>(buf), sizeof(buf), mr->lkey}, 0, 0, 20);
  std::printf("SEND to a dead client's QP: %s\n", ibv_wc_status_str(wc.status));
  return wc.status == IBV_WC_RETRY_EXC_ERR ? 0 : 1;
}

// Registered bytes are bounded by the client's RLIMIT_MEMLOCK (run without
// CAP_IPC_LOCK and with a 256 KiB limit): 64 KiB registers, 1 MiB more
// fails with ENOMEM, as ibv_reg_mr(3) says.
int limits() {
  Pair p = open_pair();
  static uint8_t small[65536], big[1 << 20];
  ibv_mr* a = ibv_reg_mr(p.pd, small, sizeof(small), IBV_ACCESS_LOCAL_WRITE);
  errno = 0;
  ibv_mr* b = ibv_reg_mr(p.pd, big, sizeof(big), IBV_ACCESS_LOCAL_WRITE);
  const int err = errno;
  std::printf("64 KiB: %s; 1 MiB more: %s (errno %s)\n", a ? "registered" : "FAILED", b ? "REGISTERED" : "refused",
              std::strerror(err));
  return a != nullptr && b == nullptr && err == ENOMEM ? 0 : 1;
}

// The count limits of droced's [limits] (tests/integration/droced_config.sh
// runs droced with max_qps = QPS, max_cqs = CQS, max_mrs = MRS): that many
// of each are created, one more fails with ENOMEM, and after one is
// destroyed one can be created again.
int count_limits(int qps, int cqs, int mrs) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (list == nullptr || n < 1) die("no device");
  ibv_context* ctx = ibv_open_device(list[0]);
  if (ctx == nullptr) die("open");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  if (pd == nullptr) die("pd");
  bool ok = true;
  auto over = [&](const char* what, bool created, int limit) {
    const int err = errno;
    std::printf("%s %d: %s (errno %s)\n", what, limit + 1, created ? "CREATED" : "refused", std::strerror(err));
    ok = ok && !created && err == ENOMEM;
  };
  std::vector<ibv_cq*> cq;
  for (int i = 0; i < cqs; ++i) {
    cq.push_back(ibv_create_cq(ctx, 16, nullptr, nullptr, 0));
    if (cq.back() == nullptr) die("cq under the limit");
  }
  errno = 0;
  ibv_cq* extra_cq = ibv_create_cq(ctx, 16, nullptr, nullptr, 0);
  over("CQ", extra_cq != nullptr, cqs);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = cq[0];
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = ia.cap.max_recv_wr = 4;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  std::vector<ibv_qp*> qp;
  for (int i = 0; i < qps; ++i) {
    qp.push_back(ibv_create_qp(pd, &ia));
    if (qp.back() == nullptr) die("qp under the limit");
  }
  errno = 0;
  ibv_qp* extra_qp = ibv_create_qp(pd, &ia);
  over("QP", extra_qp != nullptr, qps);
  static uint8_t buf[4096];
  std::vector<ibv_mr*> mr;
  for (int i = 0; i < mrs; ++i) {
    mr.push_back(ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE));
    if (mr.back() == nullptr) die("mr under the limit");
  }
  errno = 0;
  ibv_mr* extra_mr = ibv_reg_mr(pd, buf, sizeof(buf), IBV_ACCESS_LOCAL_WRITE);
  over("MR", extra_mr != nullptr, mrs);
  // A slot freed is a slot again.
  if (ibv_destroy_qp(qp.back()) != 0) die("destroy qp");
  qp.back() = ibv_create_qp(pd, &ia);
  std::printf("QP after one was destroyed: %s\n", qp.back() != nullptr ? "created" : "REFUSED");
  ok = ok && qp.back() != nullptr;
  return ok ? 0 : 1;
}

// Waits for droced to stop (the test sends it SIGTERM once "ready" is
// printed): the client must get IBV_EVENT_DEVICE_FATAL, and then control
// verbs fail.
int fatal() {
  Pair p = open_pair();
  std::printf("ready\n");
  std::fflush(stdout);
  ibv_async_event ev;
  if (ibv_get_async_event(p.ctx, &ev) != 0) die("get_async_event");
  const ibv_event_type type = ev.event_type;
  ibv_ack_async_event(&ev);
  std::printf("async event: %s\n", ibv_event_type_str(type));
  if (type != IBV_EVENT_DEVICE_FATAL) return 1;
  ibv_pd* pd = ibv_alloc_pd(p.ctx);
  std::printf("ibv_alloc_pd after the daemon stopped: %s\n", pd == nullptr ? "fails" : "SUCCEEDED");
  return pd == nullptr ? 0 : 1;
}

// The control protocol spoken by a program that means harm.
int hostile(const char* path, unsigned seed) {
  std::mt19937 rng(seed);
  auto connect_to = [&] {
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::snprintf(a.sun_path, sizeof(a.sun_path), "%s", path);
    const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0 || connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) die("connect");
    return s;
  };
  int kept_fd = -1;  // the first fd of the last reply, if asked to keep it
  auto exchange = [&](int s, const void* buf, size_t len, const int* fds, int nfds, bool keep = false) {
    if (droce::ctl::SendMsg(s, buf, len, fds, nfds) < 0) return false;
    uint8_t rep[droce::ctl::kMaxMessage];
    int got[droce::ctl::kMaxFds], ngot = 0;
    timeval tv{2, 0};
    setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    const ssize_t n = droce::ctl::RecvMsg(s, rep, sizeof(rep), got, &ngot);
    for (int i = 0; i < ngot; ++i) {
      if (keep && i == 0) kept_fd = got[i];
      else close(got[i]);
    }
    return n > 0;
  };
  auto hello = [&](int s, uint32_t* seq) {
    uint8_t buf[64];
    droce::ctl::Header h{droce::ctl::kMagic, droce::ctl::kHello, 0, ++*seq,
                         static_cast<uint32_t>(sizeof(droce::ctl::Header) + sizeof(droce::ctl::Hello))};
    droce::ctl::Hello he{droce::ctl::kVersion, 0, droce::ctl::AbiHash()};
    std::memcpy(buf, &h, sizeof(h));
    std::memcpy(buf + sizeof(h), &he, sizeof(he));
    // Mostly a real eventfd (to reach the object calls), sometimes not.
    const int efd = rng() % 4 != 0 ? eventfd(0, 0) : memfd_create("not-an-eventfd", 0);
    const bool ok = exchange(s, buf, h.len, &efd, 1);
    close(efd);
    return ok;
  };
  unsigned sent = 0, doorbells = 0;
  for (int round = 0; round < 200; ++round) {
    const int s = connect_to();
    uint32_t seq = 0;
    const bool greeted = (rng() % 4) != 0 && hello(s, &seq);
    // Attach device 0 so that object ops reach the engine.
    if (greeted) {
      droce::ctl::Header h{droce::ctl::kMagic, droce::ctl::kAttach, 0, ++seq, sizeof(droce::ctl::Header)};
      kept_fd = -1;
      exchange(s, &h, sizeof(h), nullptr, 0, true);
      // Our doorbell queue: ring other clients' QPNs (small numbers, as
      // theirs are), then scribble over the cells and indices.
      struct stat st;
      if (kept_fd >= 0 && fstat(kept_fd, &st) == 0 && st.st_size > 0) {
        void* m = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, kept_fd, 0);
        if (m != MAP_FAILED) {
          droce::queue::DoorbellQueue q(m, 4096, false);
          for (int k = 0; k < 64; ++k) q.Push(0x11 + rng() % 256);
          auto* words = static_cast<uint32_t*>(m);
          for (int k = 0; k < 256; ++k) words[rng() % (st.st_size / 4)] = static_cast<uint32_t>(rng());
          doorbells += 64;
          munmap(m, st.st_size);
        }
      }
      if (kept_fd >= 0) close(kept_fd);
    }
    for (int i = 0; i < 50; ++i) {
      uint8_t buf[droce::ctl::kMaxMessage] = {};
      droce::ctl::Header h{droce::ctl::kMagic, static_cast<uint16_t>(rng() % (droce::ctl::kOpEnd + 2)),
                           static_cast<uint16_t>(rng() % 3), seq + 1, 0};
      const droce::ctl::OpShape* shape = droce::ctl::ShapeOf(h.op);
      size_t len = sizeof(h) + (shape != nullptr ? shape->req_len : rng() % 64);
      switch (rng() % 6) {
        case 0: len = rng() % sizeof(h); break;                 // truncated
        case 1: h.seq = seq; break;                              // replayed
        case 2: h.seq = seq + 2 + rng() % 5; break;              // out of order
        case 3: h.magic ^= 1u << (rng() % 32); break;            // broken header
        default: break;                                          // well formed, random fields
      }
      h.len = static_cast<uint32_t>(len);
      std::memcpy(buf, &h, std::min(len, sizeof(h)));
      for (size_t k = sizeof(h); k < len; ++k) buf[k] = static_cast<uint8_t>(rng());
      // Handles that are plausible: small ids, like another client's.
      if (len >= sizeof(h) + 8 && rng() % 2) {
        const uint32_t id = 1 + rng() % 64;
        std::memcpy(buf + sizeof(h), &id, 4);
      }
      int fds[2] = {-1, -1};
      int nfds = 0;
      if (rng() % 8 == 0) {  // a memfd that shrinks after being passed
        fds[0] = memfd_create("shrinking", 0);
        if (ftruncate(fds[0], 1 << 20) == 0) nfds = 1;
      }
      const bool alive = exchange(s, buf, len, fds, nfds);
      if (nfds) {
        (void)!ftruncate(fds[0], 0);
        close(fds[0]);
      }
      ++sent;
      if (!alive) break;  // disconnected: a new connection next round
      if (h.seq == seq + 1 && h.magic == droce::ctl::kMagic && len >= sizeof(h)) ++seq;
    }
    close(s);
  }
  std::printf("hostile: %u messages sent, %u foreign doorbells rung (and the queue scribbled over)\n", sent,
              doorbells);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr,
                 "usage: daemon_client traffic SECONDS | victim | memory | limits | count-limits QPS CQS MRS"
                 " | hostile SOCKET SEED\n");
    return 2;
  }
  const std::string mode = argv[1];
  if (mode == "traffic" && argc == 3) return traffic(std::atof(argv[2]));
  if (mode == "victim") return traffic(-1);
  if (mode == "memory") return memory();
  if (mode == "isolation") return isolation();
  if (mode == "fatal") return fatal();
  if (mode == "peer-death") return peer_death();
  if (mode == "limits") return limits();
  if (mode == "count-limits" && argc == 5) {
    return count_limits(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]));
  }
  if (mode == "hostile" && argc == 4) return hostile(argv[2], static_cast<unsigned>(std::atoi(argv[3])));
  std::fprintf(stderr, "daemon_client: bad arguments\n");
  return 2;
}
