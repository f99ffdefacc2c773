// qp_sweep: message rate, latency and memory per QP as the number of active
// RC QPs between two processes grows (bench/qp_sweep runs
// it over memif for 1, 10, 100, 1000 and 10000 QPs). Run under droce:
//   qp_sweep server PORT
//   qp_sweep client HOST PORT NQPS SECONDS
// Both sides open the first verbs device, one PD, one MR and one CQ, then
// create NQPS RC QPs (send queue 64 WQEs, max_inline_data 64, one receive
// WQE; the server learns NQPS from the client), swap their QPNs, GID, rkey
// and address over one TCP connection (one write of the whole array each
// way) and bring every QP to RTS. The client then posts 64 B inline RDMA
// WRITEs, every one signaled, round-robin over the QPs (QP index = message
// counter % NQPS), into one 4 KiB region of the server's (QP i writes its
// (i % 64)-th 64 B slot), with W = min(256, 64 * NQPS) WRITEs in flight in
// all and at most 64 on one QP; it polls its one send CQ 32 entries at a
// time and posts as completions free slots. After a 1 s warm-up it measures
// SECONDS: the message rate is the completions in that time over the time,
// and each WRITE posted in it has its post-to-completion latency (TSC
// stamps at ibv_post_send and when ibv_poll_cq returned it) in a
// log-bucketed histogram (common/histogram.h) for p50 and p99.
// Memory per QP, on each side: (RSS after creating and connecting every QP
// - RSS before, with device, PD, MR and CQ open) / NQPS, before any traffic
// (send-queue pages that traffic touches later are not in it; with N=1 the
// figure is whole pages). The client asks the server for its figure at the
// end and prints one line
//   qps N window W msg_rate_M X p50_us Y p99_us Z mem_per_qp_client_B A
//   mem_per_qp_server_B B setup_s S
// (setup_s: on the client, from its first ibv_create_qp until its last QP
// is in RTS, the server's creating and connecting its QPs included), and
// on stderr the parameters and p90, p99.9 and the maximum latency. It
// exits 0 if every completion succeeded, else prints the first failure and
// exits 1. The server polls its (empty) CQ, which drives droce's engine
// from its own thread, until the client closes the connection, then
// destroys everything and exits.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
#include <x86intrin.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common/histogram.h"
#include "common/stamp_clock.h"
#include "rc_to_rts.h"
#include "tcp_pair.h"

namespace {

constexpr uint32_t kSqDepth = 64;
constexpr uint32_t kMaxInline = 64;
constexpr uint32_t kMsg = 64;
constexpr uint32_t kWindow = 256;
constexpr uint32_t kRegion = 4096;
constexpr int kPollBatch = 32;
constexpr uint32_t kMagic = 0x71707377;  // "qpsw"
constexpr uint32_t kStatsRequest = 0x53544154;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "qp_sweep: %s (errno %d %s)\n", what, errno, std::strerror(errno));
  std::exit(1);
}

// A protocol failure (no errno to report).
[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "qp_sweep: %s\n", what);
  std::exit(1);
}

struct Hello {
  uint32_t magic;
  uint32_t nqps;
  uint32_t rkey;
  uint32_t pad;
  uint64_t addr;
  uint8_t gid[16];
};

struct Stats {
  double mem_per_qp;
  double setup_s;
};

void WriteAll(int fd, const void* p, size_t n) {
  if (!TcpWriteAll(fd, p, n)) die("tcp write");
}

// False on end of file before the first byte; dies on a short read.
bool ReadAll(int fd, void* p, size_t n) {
  const int r = TcpReadAll(fd, p, n);
  if (r < 0) die("tcp read (or the peer closed the connection in mid-message)");
  return r == 1;
}

// Resident set size in bytes (/proc/self/statm, second field).
long Rss() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) die("/proc/self/statm");
  long size = 0, resident = 0;
  if (std::fscanf(f, "%ld %ld", &size, &resident) != 2) die("/proc/self/statm: parse");
  std::fclose(f);
  return resident * sysconf(_SC_PAGESIZE);
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Side {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
  ibv_mr* mr = nullptr;
  void* region = nullptr;
  std::vector<ibv_qp*> qps;
  ibv_gid gid{};
};

void Open(Side* s, int cqe) {
  int n = 0;
  ibv_device** devs = ibv_get_device_list(&n);
  if (devs == nullptr || n == 0) die("no verbs device");
  s->ctx = ibv_open_device(devs[0]);
  if (s->ctx == nullptr) die("ibv_open_device");
  ibv_free_device_list(devs);
  s->pd = ibv_alloc_pd(s->ctx);
  s->cq = s->pd != nullptr ? ibv_create_cq(s->ctx, cqe, nullptr, nullptr, 0) : nullptr;
  if (s->cq == nullptr) die("ibv_alloc_pd/ibv_create_cq");
  s->region = std::aligned_alloc(kRegion, kRegion);
  std::memset(s->region, 0x5a, kRegion);
  s->mr = ibv_reg_mr(s->pd, s->region, kRegion, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (s->mr == nullptr) die("ibv_reg_mr");
  if (ibv_query_gid(s->ctx, 1, 0, &s->gid)) die("ibv_query_gid");
}

void CreateQps(Side* s, uint32_t n) {
  s->qps.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = s->cq;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = kSqDepth;
    a.cap.max_recv_wr = 1;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    a.cap.max_inline_data = kMaxInline;
    ibv_qp* q = ibv_create_qp(s->pd, &a);
    if (q == nullptr) {
      std::fprintf(stderr, "qp_sweep: ibv_create_qp: QP %u of %u: errno %d %s\n", i, n, errno,
                   std::strerror(errno));
      std::exit(1);
    }
    s->qps.push_back(q);
  }
}

void ConnectQps(Side* s, const std::vector<uint32_t>& peer_qpns, const Hello& peer) {
  ibv_gid gid;
  std::memcpy(gid.raw, peer.gid, 16);
  for (size_t i = 0; i < s->qps.size(); ++i) {
    if (const char* step = RcToRts(s->qps[i], peer_qpns[i], gid)) {
      std::fprintf(stderr, "qp_sweep: QP %zu of %zu: modify to %s failed (errno %d %s)\n", i, s->qps.size(),
                   step, errno, std::strerror(errno));
      std::exit(1);
    }
  }
}

Hello Local(const Side& s, uint32_t nqps) {
  Hello h{};
  h.magic = kMagic;
  h.nqps = nqps;
  h.rkey = s.mr->rkey;
  h.addr = reinterpret_cast<uint64_t>(s.region);
  std::memcpy(h.gid, s.gid.raw, 16);
  return h;
}

// Sends the hello and every QPN in one write.
void SendQpns(int fd, const Hello& h, const Side& s) {
  std::vector<uint32_t> buf(sizeof(Hello) / 4 + s.qps.size());
  std::memcpy(buf.data(), &h, sizeof(h));
  for (size_t i = 0; i < s.qps.size(); ++i) buf[sizeof(Hello) / 4 + i] = s.qps[i]->qp_num;
  WriteAll(fd, buf.data(), buf.size() * 4);
}

void Close(Side* s) {
  for (ibv_qp* q : s->qps) {
    if (ibv_destroy_qp(q)) die("ibv_destroy_qp");
  }
  s->qps.clear();
  if (ibv_dereg_mr(s->mr) || ibv_destroy_cq(s->cq) || ibv_dealloc_pd(s->pd) || ibv_close_device(s->ctx)) {
    die("teardown");
  }
  std::free(s->region);
}

int Server(int port) {
  Side s;
  Open(&s, 16);
  const int fd = TcpAcceptOne(port);
  if (fd < 0) die("listen/accept");
  Hello peer;
  if (!ReadAll(fd, &peer, sizeof(peer)) || peer.magic != kMagic || peer.nqps == 0) {
    fail("no or bad hello from the client");
  }
  const uint32_t n = peer.nqps;
  std::vector<uint32_t> peer_qpns(n);
  if (!ReadAll(fd, peer_qpns.data(), size_t{n} * 4)) fail("no QPNs from the client");
  const long before = Rss();
  const auto t0 = std::chrono::steady_clock::now();
  CreateQps(&s, n);
  ConnectQps(&s, peer_qpns, peer);
  const Stats st{static_cast<double>(Rss() - before) / n, Seconds(t0, std::chrono::steady_clock::now())};
  SendQpns(fd, Local(s, n), s);
  std::printf("server: qps %u mem_per_qp_B %.0f setup_s %.3f\n", n, st.mem_per_qp, st.setup_s);
  std::fflush(stdout);
  // Poll the CQ (nothing completes here: the server's QPs only respond),
  // looking at the connection every 1024 polls.
  pollfd pfd{fd, POLLIN, 0};
  for (uint64_t it = 0;; ++it) {
    ibv_wc wc[4];
    const int k = ibv_poll_cq(s.cq, 4, wc);
    if (k < 0) die("ibv_poll_cq");
    for (int i = 0; i < k; ++i) {
      std::fprintf(stderr, "qp_sweep: server: unexpected completion %s on QP %u\n",
                   ibv_wc_status_str(wc[i].status), wc[i].qp_num);
    }
    if ((it & 1023) != 0) continue;
    const int r = poll(&pfd, 1, 0);
    if (r < 0) die("poll");
    if (r == 0) continue;
    uint32_t req;
    if (!ReadAll(fd, &req, sizeof(req))) break;  // the client is done
    if (req != kStatsRequest) fail("bad request from the client");
    WriteAll(fd, &st, sizeof(st));
  }
  close(fd);
  Close(&s);
  return 0;
}

int Client(const char* host, int port, uint32_t n, double seconds) {
  if (n == 0 || seconds <= 0) {
    std::fprintf(stderr, "qp_sweep: NQPS and SECONDS must be positive\n");
    return 2;
  }
  const uint32_t window = std::min(kWindow, kSqDepth * n);
  Side s;
  Open(&s, 4 * kWindow);
  const int fd = TcpConnect(host, port);
  if (fd < 0) die("connect");
  std::vector<uint32_t> peer_qpns(n);
  // Everything the traffic loop needs, allocated before the RSS readings.
  std::vector<uint32_t> outstanding(n, 0);
  std::vector<uint64_t> posted_at(window);
  std::vector<uint32_t> slot_qp(window);
  std::vector<uint32_t> free_slots(window);
  for (uint32_t i = 0; i < window; ++i) free_slots[i] = window - 1 - i;
  auto* hist = new droce::lab::LatencyHistogram();  // in TSC ticks
  const double hz = droce::lab::StampCalibrate() * 1e9;  // TSC ticks per second

  const long before = Rss();
  const auto t0 = std::chrono::steady_clock::now();
  CreateQps(&s, n);
  SendQpns(fd, Local(s, n), s);
  Hello peer;
  if (!ReadAll(fd, &peer, sizeof(peer)) || peer.magic != kMagic || peer.nqps != n) {
    fail("no or bad hello from the server");
  }
  if (!ReadAll(fd, peer_qpns.data(), size_t{n} * 4)) fail("no QPNs from the server");
  ConnectQps(&s, peer_qpns, peer);
  const double setup_s = Seconds(t0, std::chrono::steady_clock::now());
  const double mem_per_qp = static_cast<double>(Rss() - before) / n;
  std::fprintf(stderr,
               "qp_sweep: %u RC QPs (sq depth %u, max_inline_data %u), %u B inline RDMA WRITEs, all signaled, "
               "window %u (at most %u per QP), warm-up 1 s, %.1f s measured, TSC %.3f GHz\n",
               n, kSqDepth, kMaxInline, kMsg, window, kSqDepth, seconds, hz / 1e9);

  const uint64_t start = __rdtsc();
  const uint64_t warm_end = start + static_cast<uint64_t>(hz);
  const uint64_t meas_end = warm_end + static_cast<uint64_t>(seconds * hz);
  const uint64_t stall = static_cast<uint64_t>(30 * hz);
  bool measuring = false, stopping = false;
  uint64_t meas_start = 0, meas_stop = 0, done = 0, done_at_start = 0, done_measured = 0;
  uint64_t next = 0, last_progress = start;
  uint32_t inflight = 0, qi = 0;
  ibv_sge sge{reinterpret_cast<uint64_t>(s.region), kMsg, s.mr->lkey};
  ibv_send_wr wr{};
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  wr.wr.rdma.rkey = peer.rkey;
  for (;;) {
    const uint64_t now = __rdtsc();
    if (!measuring && now >= warm_end) {
      measuring = true;
      meas_start = now;
      done_at_start = done;
    } else if (measuring && !stopping && now >= meas_end) {
      stopping = true;
      meas_stop = now;
      done_measured = done - done_at_start;
    }
    if (stopping && inflight == 0) break;
    while (!stopping && inflight < window && outstanding[qi] < kSqDepth) {
      const uint32_t slot = free_slots.back();
      free_slots.pop_back();
      wr.wr_id = slot;
      wr.wr.rdma.remote_addr = peer.addr + (qi % (kRegion / kMsg)) * kMsg;
      slot_qp[slot] = qi;
      posted_at[slot] = __rdtsc();
      ibv_send_wr* bad;
      if (const int e = ibv_post_send(s.qps[qi], &wr, &bad)) {
        std::fprintf(stderr, "qp_sweep: ibv_post_send on QP %u (message %llu): %s\n", qi,
                     static_cast<unsigned long long>(next), std::strerror(e));
        return 1;
      }
      ++outstanding[qi];
      ++inflight;
      ++next;
      if (++qi == n) qi = 0;
    }
    ibv_wc wc[kPollBatch];
    const int k = ibv_poll_cq(s.cq, kPollBatch, wc);
    if (k < 0) die("ibv_poll_cq");
    const uint64_t t = __rdtsc();
    if (k == 0) {
      if (t - last_progress > stall) {
        std::fprintf(stderr, "qp_sweep: no completion for 30 s with %u WRITEs in flight\n", inflight);
        return 1;
      }
      continue;
    }
    last_progress = t;
    for (int i = 0; i < k; ++i) {
      if (wc[i].status != IBV_WC_SUCCESS) {
        const uint32_t slot = static_cast<uint32_t>(wc[i].wr_id);
        std::fprintf(stderr, "qp_sweep: WRITE on QP index %u (qpn %u): completion %s (vendor_err %u)\n",
                     slot < window ? slot_qp[slot] : ~0u, wc[i].qp_num, ibv_wc_status_str(wc[i].status),
                     wc[i].vendor_err);
        return 1;
      }
      const uint32_t slot = static_cast<uint32_t>(wc[i].wr_id);
      --outstanding[slot_qp[slot]];
      --inflight;
      ++done;
      if (measuring && posted_at[slot] >= meas_start) hist->Record(t - posted_at[slot]);
      free_slots.push_back(slot);
    }
  }
  const double meas_s = static_cast<double>(meas_stop - meas_start) / hz;
  const double rate_m = static_cast<double>(done_measured) / meas_s / 1e6;
  const double us_per_tick = 1e6 / hz;

  std::fprintf(stderr,
               "qp_sweep: %llu completions in %.3f s measured; latency us: p50 %.2f p90 %.2f p99 %.2f p99.9 %.2f "
               "max %.2f (%llu samples)\n",
               static_cast<unsigned long long>(done_measured), meas_s, hist->Percentile(50) * us_per_tick,
               hist->Percentile(90) * us_per_tick, hist->Percentile(99) * us_per_tick,
               hist->Percentile(99.9) * us_per_tick, static_cast<double>(hist->max()) * us_per_tick,
               static_cast<unsigned long long>(hist->count()));
  const uint32_t req = kStatsRequest;
  WriteAll(fd, &req, sizeof(req));
  Stats server{};
  if (!ReadAll(fd, &server, sizeof(server))) fail("the server closed the connection");
  std::printf(
      "qps %u window %u msg_rate_M %.4f p50_us %.2f p99_us %.2f mem_per_qp_client_B %.0f mem_per_qp_server_B %.0f "
      "setup_s %.3f\n",
      n, window, rate_m, hist->Percentile(50) * us_per_tick, hist->Percentile(99) * us_per_tick, mem_per_qp,
      server.mem_per_qp, setup_s);
  std::fflush(stdout);
  close(fd);
  Close(&s);
  delete hist;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::strcmp(argv[1], "server") == 0) return Server(std::atoi(argv[2]));
  if (argc == 6 && std::strcmp(argv[1], "client") == 0) {
    return Client(argv[2], std::atoi(argv[3]), static_cast<uint32_t>(std::strtoul(argv[4], nullptr, 10)),
                  std::atof(argv[5]));
  }
  std::fprintf(stderr, "usage: qp_sweep server PORT | qp_sweep client HOST PORT NQPS SECONDS\n");
  return 2;
}
