// RDMA WRITEs or SENDs between two processes with every byte checked, for
// the selective-repeat test over a lossy live link (sr_pair.sh) and the
// interop suite's loss cases (perftest does not check data, and
// ibv_rc_pingpong has no closing handshake). Run under droce (droce exec):
//   write_check server PORT
//   write_check client HOST PORT SECONDS
// (WRITE_CHECK_GID=N: the local GID index, default 0; WRITE_CHECK_TIMEOUT=T:
// the QP's local ACK timeout, default 10. On the client only, passed to the
// server: WRITE_CHECK_VERB=write|send, default write; WRITE_CHECK_MSG=B, the
// message size, a multiple of 8 up to 65536, default 65536.) It also runs
// on a kernel RDMA device (the interop suite runs it on Linux rxe).
// The client fills the server's 256 slots of one message each in passes,
// each pass with its own seeded contents and up to 32 messages in flight.
// WRITE: a SEND with the pass number in its immediate data ends a pass (RC:
// after all its WRITEs). SEND: every message is a SEND with the pass number
// in its immediate data, into the server's 256 receives, one per slot. The
// server checks every byte of every slot, posts the next pass's receives
// and answers with the number of bad 8-byte words. The client prints
//   passes P bytes B write_seconds S goodput G Gb/s bad_words W
// (send_seconds with SENDs; goodput over the time the messages took, not
// the checks) and exits 0 if every completion succeeded and no word was bad.
// The end: the client's last SEND (immediate 0xFFFFFFFF) completes, then it
// closes the TCP connection; the server destroys its QP only once it sees
// that close, so no side's last ACK can be owed to a QP already gone.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "rc_to_rts.h"
#include "tcp_pair.h"

namespace {

constexpr uint32_t kMaxMsg = 64 * 1024;
constexpr uint32_t kSlots = 256;
constexpr uint32_t kInFlight = 32;
constexpr uint32_t kEnd = 0xFFFFFFFF;

[[noreturn]] void die(const char* what) {
  std::fprintf(stderr, "write_check: %s (errno %d %s)\n", what, errno, std::strerror(errno));
  std::exit(1);
}

// The word at index i of slot s in pass p (SplitMix64 of the three).
uint64_t Word(uint32_t p, uint32_t s, uint32_t i) {
  uint64_t z = (uint64_t{p} << 40 ^ uint64_t{s} << 20 ^ i) + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

enum Verb : uint32_t { kWrite = 0, kSend = 1 };

struct Wire {
  uint32_t qpn;
  uint32_t rkey;
  uint64_t addr;
  uint8_t gid[16];
  uint32_t verb;  // the client's choice; the server follows it
  uint32_t msg;
};

void WriteAll(int fd, const void* p, size_t n) {
  if (!TcpWriteAll(fd, p, n)) die("tcp write");
}
void ReadAll(int fd, void* p, size_t n) {
  if (TcpReadAll(fd, p, n) != 1) die("tcp read");
}

struct Ends {
  ibv_context* ctx;
  ibv_pd* pd;
  ibv_cq* cq;
  ibv_qp* qp;
  ibv_mr* mr;
  ibv_mr* ctl_mr;
  std::vector<uint64_t> buf;
  uint32_t ctl[2] = {};  // [0]: receive, [1]: send
  uint32_t verb = kWrite;
  uint32_t msg = kMaxMsg;
  uint64_t* Slot(uint32_t s) { return &buf[size_t{s} * msg / 8]; }
};

void Open(Ends* e) {
  int n = 0;
  ibv_device** devs = ibv_get_device_list(&n);
  if (devs == nullptr || n == 0) die("no device");
  e->ctx = ibv_open_device(devs[0]);
  if (e->ctx == nullptr) die("ibv_open_device");
  e->pd = ibv_alloc_pd(e->ctx);
  // Room for a pass of receive completions beside the sends in flight.
  e->cq = ibv_create_cq(e->ctx, 2 * kSlots + 2 * kInFlight, nullptr, nullptr, 0);
  if (e->pd == nullptr || e->cq == nullptr) die("pd/cq");
  ibv_qp_init_attr a{};
  a.send_cq = a.recv_cq = e->cq;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = 64;
  a.cap.max_recv_wr = kSlots + 4;
  a.cap.max_send_sge = a.cap.max_recv_sge = 1;
  e->qp = ibv_create_qp(e->pd, &a);
  if (e->qp == nullptr) die("ibv_create_qp");
  e->buf.assign(size_t{kSlots} * kMaxMsg / 8, 0);
  e->mr = ibv_reg_mr(e->pd, e->buf.data(), e->buf.size() * 8,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  e->ctl_mr = ibv_reg_mr(e->pd, e->ctl, sizeof(e->ctl), IBV_ACCESS_LOCAL_WRITE);
  if (e->mr == nullptr || e->ctl_mr == nullptr) die("ibv_reg_mr");
}

// The port's GID to use (WRITE_CHECK_GID, default 0): another stack's
// RoCEv2 IPv4 GID may sit elsewhere (Linux rxe: 1, after the link-local).
uint8_t GidIndex() {
  const char* v = std::getenv("WRITE_CHECK_GID");
  return v != nullptr ? static_cast<uint8_t>(std::atoi(v)) : 0;
}

// The local ACK timeout (WRITE_CHECK_TIMEOUT, default 10: 4 ms, as on
// memif; a peer in a VM under TCG stalls for longer than 8 such timeouts).
uint8_t AckTimeout() {
  const char* v = std::getenv("WRITE_CHECK_TIMEOUT");
  return v != nullptr ? static_cast<uint8_t>(std::atoi(v)) : 10;
}

Wire Local(const Ends& e) {
  Wire w{};
  w.qpn = e.qp->qp_num;
  w.rkey = e.mr->rkey;
  w.addr = reinterpret_cast<uint64_t>(e.buf.data());
  ibv_gid gid;
  if (ibv_query_gid(e.ctx, 1, GidIndex(), &gid)) die("ibv_query_gid");
  std::memcpy(w.gid, gid.raw, 16);
  w.verb = e.verb;
  w.msg = e.msg;
  return w;
}

// Everything released, the device closed (droce prints DROCE_STATS then).
void Close(Ends* e) {
  if (ibv_destroy_qp(e->qp) || ibv_dereg_mr(e->mr) || ibv_dereg_mr(e->ctl_mr) || ibv_destroy_cq(e->cq) ||
      ibv_dealloc_pd(e->pd) || ibv_close_device(e->ctx)) {
    die("teardown");
  }
}

void Connect(Ends* e, const Wire& peer) {
  ibv_gid gid;
  std::memcpy(gid.raw, peer.gid, 16);
  if (const char* step = RcToRts(e->qp, peer.qpn, gid, GidIndex(), AckTimeout())) {
    std::fprintf(stderr, "write_check: modify to %s failed\n", step);
    std::exit(1);
  }
}

void PostRecvBuf(Ends* e, const void* buf, uint32_t len, uint32_t lkey, uint64_t wr_id) {
  ibv_sge s{reinterpret_cast<uint64_t>(buf), len, lkey};
  ibv_recv_wr w{};
  ibv_recv_wr* bad;
  w.wr_id = wr_id;
  w.sg_list = &s;
  w.num_sge = 1;
  if (ibv_post_recv(e->qp, &w, &bad)) die("ibv_post_recv");
}

// The receive of a 4-byte control message (wr_id kSlots).
void PostRecv(Ends* e) { PostRecvBuf(e, &e->ctl[0], 4, e->ctl_mr->lkey, kSlots); }

// The server's receives for the next pass: with SENDs, slot s's buffer as
// wr_id s; with WRITEs, the one control receive for the pass's end.
void PostPassRecvs(Ends* e) {
  if (e->verb != kSend) return PostRecv(e);
  for (uint32_t slot = 0; slot < kSlots; ++slot) PostRecvBuf(e, e->Slot(slot), e->msg, e->mr->lkey, slot);
}

void PostSendImm(Ends* e, uint32_t imm, uint32_t value) {
  e->ctl[1] = value;
  ibv_sge s{reinterpret_cast<uint64_t>(&e->ctl[1]), 4, e->ctl_mr->lkey};
  ibv_send_wr w{};
  ibv_send_wr* bad;
  w.wr_id = 1ull << 63 | imm;
  w.sg_list = &s;
  w.num_sge = 1;
  w.opcode = IBV_WR_SEND_WITH_IMM;
  w.imm_data = htonl(imm);
  w.send_flags = IBV_SEND_SIGNALED;
  if (ibv_post_send(e->qp, &w, &bad)) die("ibv_post_send");
}

// Polls until a receive completes and returns it. Send completions on the
// way are checked and counted in *sends.
ibv_wc AwaitRecv(Ends* e, uint32_t* sends) {
  for (;;) {
    ibv_wc wc;
    const int k = ibv_poll_cq(e->cq, 1, &wc);
    if (k < 0) die("ibv_poll_cq");
    if (k == 0) continue;
    if (wc.status != IBV_WC_SUCCESS) {
      std::fprintf(stderr, "write_check: completion %s (wr_id %llu)\n", ibv_wc_status_str(wc.status),
                   static_cast<unsigned long long>(wc.wr_id));
      std::exit(1);
    }
    if (wc.opcode == IBV_WC_RECV) return wc;
    if (sends != nullptr) ++*sends;
  }
}

// The number of bad words in the slots after pass `pass`.
uint32_t CheckSlots(Ends* e, uint32_t pass) {
  uint32_t bad = 0;
  for (uint32_t s = 0; s < kSlots; ++s) {
    const uint64_t* slot = e->Slot(s);
    for (uint32_t i = 0; i < e->msg / 8; ++i) bad += slot[i] != Word(pass, s, i);
  }
  return bad;
}

int Server(int port) {
  Ends e;
  Open(&e);
  const int fd = TcpAcceptOne(port);
  if (fd < 0) die("listen/accept");
  Wire peer;
  ReadAll(fd, &peer, sizeof(peer));
  if (peer.verb > kSend || peer.msg == 0 || peer.msg % 8 != 0 || peer.msg > kMaxMsg) die("bad verb or size");
  e.verb = peer.verb;
  e.msg = peer.msg;
  const Wire me = Local(e);
  Connect(&e, peer);
  PostPassRecvs(&e);
  WriteAll(fd, &me, sizeof(me));
  uint64_t bad_total = 0;
  uint32_t passes = 0;
  for (;;) {
    uint32_t pass = 0;
    bool end = false;
    if (e.verb == kSend) {
      // The pass's messages arrive into the slots in order; the end SEND
      // into the next pass's first.
      for (uint32_t s = 0; s < kSlots; ++s) {
        const ibv_wc wc = AwaitRecv(&e, nullptr);
        const uint32_t imm = ntohl(wc.imm_data);
        if (imm == kEnd) {
          end = true;
          break;
        }
        if (wc.wr_id != s || wc.byte_len != e.msg || (s > 0 && imm != pass)) {
          std::fprintf(stderr, "write_check: slot %u: wr_id %llu, %u bytes, pass %u\n", s,
                       static_cast<unsigned long long>(wc.wr_id), wc.byte_len, imm);
          std::exit(1);
        }
        pass = imm;
      }
      if (end) break;
    } else {
      pass = ntohl(AwaitRecv(&e, nullptr).imm_data);
      if (pass == kEnd) break;
    }
    const uint32_t bad = CheckSlots(&e, pass);
    PostPassRecvs(&e);
    bad_total += bad;
    ++passes;
    PostSendImm(&e, pass, bad);
  }
  std::printf("server: passes %u bad_words %llu\n", passes, static_cast<unsigned long long>(bad_total));
  std::fflush(stdout);
  // The QP stays until the client has its last completion and closes.
  char c;
  while (read(fd, &c, 1) > 0) {
  }
  close(fd);
  Close(&e);
  return bad_total == 0 ? 0 : 1;
}

int Client(const char* host, int port, double seconds) {
  Ends e;
  if (const char* v = std::getenv("WRITE_CHECK_VERB")) {
    if (std::strcmp(v, "send") == 0) {
      e.verb = kSend;
    } else if (std::strcmp(v, "write") != 0) {
      die("WRITE_CHECK_VERB: write or send");
    }
  }
  if (const char* v = std::getenv("WRITE_CHECK_MSG")) {
    e.msg = static_cast<uint32_t>(std::atoi(v));
    if (e.msg == 0 || e.msg % 8 != 0 || e.msg > kMaxMsg) die("WRITE_CHECK_MSG: a multiple of 8 up to 65536");
  }
  Open(&e);
  const int fd = TcpConnect(host, port);
  if (fd < 0) die("connect");
  const Wire me = Local(e);
  WriteAll(fd, &me, sizeof(me));
  Wire peer;
  ReadAll(fd, &peer, sizeof(peer));
  Connect(&e, peer);
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  double busy_s = 0;
  uint64_t bytes = 0, bad_total = 0;
  uint32_t pass = 0;
  while (std::chrono::duration<double>(Clock::now() - start).count() < seconds) {
    ++pass;
    for (uint32_t s = 0; s < kSlots; ++s) {
      uint64_t* slot = e.Slot(s);
      for (uint32_t i = 0; i < e.msg / 8; ++i) slot[i] = Word(pass, s, i);
    }
    PostRecv(&e);
    const auto t0 = Clock::now();
    uint32_t posted = 0, done = 0;
    bool answered = false;  // with SENDs, the answer may beat the last ACKs
    while (done < kSlots) {
      while (posted < kSlots && posted - done < kInFlight) {
        ibv_sge sg{reinterpret_cast<uint64_t>(e.Slot(posted)), e.msg, e.mr->lkey};
        ibv_send_wr w{};
        ibv_send_wr* badwr;
        w.wr_id = posted;
        w.sg_list = &sg;
        w.num_sge = 1;
        w.send_flags = IBV_SEND_SIGNALED;
        if (e.verb == kSend) {
          w.opcode = IBV_WR_SEND_WITH_IMM;
          w.imm_data = htonl(pass);
        } else {
          w.opcode = IBV_WR_RDMA_WRITE;
          w.wr.rdma.remote_addr = peer.addr + uint64_t{posted} * e.msg;
          w.wr.rdma.rkey = peer.rkey;
        }
        if (ibv_post_send(e.qp, &w, &badwr)) die("ibv_post_send");
        ++posted;
      }
      ibv_wc wc[32];
      const int k = ibv_poll_cq(e.cq, 32, wc);
      if (k < 0) die("ibv_poll_cq");
      for (int i = 0; i < k; ++i) {
        if (wc[i].status != IBV_WC_SUCCESS) {
          std::fprintf(stderr, "write_check: %s %llu: %s\n", e.verb == kSend ? "SEND" : "WRITE",
                       static_cast<unsigned long long>(wc[i].wr_id), ibv_wc_status_str(wc[i].status));
          return 1;
        }
        if (wc[i].opcode == IBV_WC_RECV) {
          if (e.verb != kSend || ntohl(wc[i].imm_data) != pass) die("an answer before its pass ended");
          answered = true;
        } else {
          ++done;
        }
      }
    }
    busy_s += std::chrono::duration<double>(Clock::now() - t0).count();
    bytes += uint64_t{kSlots} * e.msg;
    if (e.verb == kWrite) PostSendImm(&e, pass, 0);
    uint32_t sends = 0;
    if (!answered && ntohl(AwaitRecv(&e, &sends).imm_data) != pass) {
      std::fprintf(stderr, "write_check: pass %u: the server answered another pass\n", pass);
      return 1;
    }
    bad_total += e.ctl[0];
  }
  PostSendImm(&e, kEnd, 0);
  for (uint32_t sends = 0; sends == 0;) {
    ibv_wc wc;
    const int k = ibv_poll_cq(e.cq, 1, &wc);
    if (k < 0 || (k == 1 && wc.status != IBV_WC_SUCCESS)) die("end SEND");
    if (k == 1 && wc.wr_id == (1ull << 63 | kEnd)) ++sends;  // not an earlier pass's end
  }
  std::printf("passes %u bytes %llu %s_seconds %.3f goodput %.3f Gb/s bad_words %llu\n", pass,
              static_cast<unsigned long long>(bytes), e.verb == kSend ? "send" : "write", busy_s,
              busy_s > 0 ? bytes * 8 / busy_s / 1e9 : 0.0, static_cast<unsigned long long>(bad_total));
  std::fflush(stdout);
  close(fd);
  Close(&e);
  return bad_total == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Line by line, so that a run killed for hanging shows how far it got.
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc == 3 && std::strcmp(argv[1], "server") == 0) return Server(std::atoi(argv[2]));
  if (argc == 5 && std::strcmp(argv[1], "client") == 0) return Client(argv[2], std::atoi(argv[3]), std::atof(argv[4]));
  std::fprintf(stderr, "usage: write_check server PORT | write_check client HOST PORT SECONDS\n");
  return 2;
}
