// A hostile peer on a live link (hostile_peer.sh): RoCEv2 frames from a raw
// packet socket into a running droce, and the victim QPs they are aimed at.
//
//   hostile_peer victim FILE PEER_IP
//     Run under droce. Opens droce0 and makes victims: RC QPs in RESET, INIT,
//     RTR, RTS and ERR, a UC and a UD QP in RTS (the connected ones towards
//     PEER_IP, remote QPN 0xABCDE, PSNs 0), and in one 192 KiB buffer two
//     MRs: the middle 64 KiB with every remote right, the first 64 KiB
//     remote-read only; the last 64 KiB is in no MR. The buffer is filled
//     with a pattern. Writes FILE (`NAME VALUE...` lines: the QPNs, the MRs'
//     addresses, rkeys and lengths, the UD Q_Key), then keeps every receive
//     queue full, drains the CQ and brings an RTR or RTS victim that a
//     refused request put in error back to its state at PSN 0, until
//     FILE.stop exists. Then checks that no byte outside the read-write MR
//     changed and prints
//       victim: guard bytes changed G, granted bytes changed W, completions C
//       (E in error), QPs brought back from error B
//     Exit 0 if G is 0.
//
//   hostile_peer attack IFACE DST_MAC DST_IP SRC_IP FILE SECONDS SEED [PPS] [FLOOD]
//     From a packet socket on IFACE, for SECONDS (at most PPS frames a second,
//     default 5000), frames to DST_MAC/DST_IP from SRC_IP, drawn at random
//     (SEED):
//     - valid: every known opcode, correct ICRC, to a victim QPN, a random
//       QPN or QP1 (a random MAD); PSNs in sequence or random; the victims'
//       rkeys or random ones; addresses inside, across and outside the MRs;
//       random lengths and Q_Keys;
//     - mutated: such a frame with bits flipped (ICRC kept or recomputed),
//       cut short, its pad count or lengths wrong, grown past the MTU, its
//       IP or UDP header broken;
//     - replays of the legitimate RoCE frames it sees on IFACE going to
//       DST_MAC, with bits flipped or cut short (the ICRC then fails), or
//       with the ICRC recomputed after moving an RC request's PSN 2^22 into
//       the past (a duplicate) or its QPN to a random one: nothing that could
//       pass as the next packet of a legitimate flow, which RoCE cannot tell
//       from its own (it has no authentication);
//     - valid frames for another station: a unicast MAC or an IP address
//       that is not the target's (other_host_drop there);
//     - with FLOOD=1, bursts of 2,000 frames as fast as the socket takes them.
//     Prints how many frames of each kind it sent.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "wire/build.h"
#include "wire/frame.h"
#include "wire/opcode.h"

namespace {

constexpr size_t kRegion = 64 * 1024;
constexpr uint32_t kPeerQpn = 0xABCDE;
constexpr uint32_t kQkey = 0x11223344;
constexpr uint8_t kPattern = 0x5A;

// `err`: the error number a verbs call returned, or errno's.
[[noreturn]] void die(const char* what, int err = -1) {
  if (err < 0) err = errno;
  std::fprintf(stderr, "hostile_peer: %s (error %d %s)\n", what, err, std::strerror(err));
  std::exit(1);
}

// ---- victim ----------------------------------------------------------------

struct Victim {
  const char* name;
  ibv_qp_type type;
  ibv_qp_state state;
  ibv_qp* qp = nullptr;
};

// Returns the verbs error of the step that failed (0: done). A victim being
// brought back can be put in error again by the attack between two steps
// (then the next step is refused): the caller tries again.
int ToState(ibv_qp* qp, ibv_qp_type type, ibv_qp_state target, const ibv_gid& peer) {
  if (target == IBV_QPS_RESET) return 0;
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
  if (type == IBV_QPT_UD) {
    a.qkey = kQkey;
    mask |= IBV_QP_QKEY;
  } else {
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                        (type == IBV_QPT_RC ? IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC : 0);
    mask |= IBV_QP_ACCESS_FLAGS;
  }
  if (int rc = ibv_modify_qp(qp, &a, mask); rc != 0) return rc;
  if (target == IBV_QPS_ERR) {
    a = {};
    a.qp_state = IBV_QPS_ERR;
    return ibv_modify_qp(qp, &a, IBV_QP_STATE);
  }
  if (target == IBV_QPS_INIT) return 0;
  a = {};
  a.qp_state = IBV_QPS_RTR;
  mask = IBV_QP_STATE;
  if (type != IBV_QPT_UD) {
    a.path_mtu = IBV_MTU_1024;
    a.dest_qp_num = kPeerQpn;
    a.rq_psn = 0;
    a.ah_attr.is_global = 1;
    a.ah_attr.grh.dgid = peer;
    a.ah_attr.grh.hop_limit = 64;
    a.ah_attr.port_num = 1;
    mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
    if (type == IBV_QPT_RC) {
      a.max_dest_rd_atomic = 16;
      a.min_rnr_timer = 1;
      mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    }
  }
  if (int rc = ibv_modify_qp(qp, &a, mask); rc != 0) return rc;
  if (target == IBV_QPS_RTR) return 0;
  a = {};
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = 0;
  mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
  if (type == IBV_QPT_RC) {
    a.timeout = 14;
    a.retry_cnt = 7;
    a.rnr_retry = 7;
    a.max_rd_atomic = 16;
    mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
  }
  return ibv_modify_qp(qp, &a, mask);
}

int RunVictim(const char* file, const char* peer_ip) {
  in_addr ip4{};
  if (inet_pton(AF_INET, peer_ip, &ip4) != 1) die("PEER_IP");
  ibv_gid peer{};
  peer.raw[10] = peer.raw[11] = 0xFF;
  std::memcpy(&peer.raw[12], &ip4, 4);

  int n = 0;
  ibv_device** devs = ibv_get_device_list(&n);
  if (devs == nullptr || n == 0) die("no device");
  ibv_context* ctx = ibv_open_device(devs[0]);
  if (ctx == nullptr) die("ibv_open_device");
  ibv_pd* pd = ibv_alloc_pd(ctx);
  ibv_cq* cq = ibv_create_cq(ctx, 4096, nullptr, nullptr, 0);
  if (pd == nullptr || cq == nullptr) die("pd/cq");
  std::vector<uint8_t> buf(3 * kRegion, kPattern);
  uint8_t* const ro = buf.data();
  uint8_t* const rw = buf.data() + kRegion;
  ibv_mr* mr_ro = ibv_reg_mr(pd, ro, kRegion, IBV_ACCESS_REMOTE_READ);
  ibv_mr* mr_rw = ibv_reg_mr(pd, rw, kRegion,
                             IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                                 IBV_ACCESS_REMOTE_ATOMIC);
  // Receive buffers apart from the checked buffer: SENDs may fill them.
  std::vector<uint8_t> rbuf(4096 + 40);
  ibv_mr* mr_recv = ibv_reg_mr(pd, rbuf.data(), rbuf.size(), IBV_ACCESS_LOCAL_WRITE);
  if (mr_ro == nullptr || mr_rw == nullptr || mr_recv == nullptr) die("ibv_reg_mr");

  Victim victims[] = {
      {"rc_reset", IBV_QPT_RC, IBV_QPS_RESET}, {"rc_init", IBV_QPT_RC, IBV_QPS_INIT},
      {"rc_rtr", IBV_QPT_RC, IBV_QPS_RTR},     {"rc_rts", IBV_QPT_RC, IBV_QPS_RTS},
      {"rc_err", IBV_QPT_RC, IBV_QPS_ERR},     {"uc_rts", IBV_QPT_UC, IBV_QPS_RTS},
      {"ud_rts", IBV_QPT_UD, IBV_QPS_RTS},
  };
  for (Victim& v : victims) {
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq;
    a.qp_type = v.type;
    a.cap.max_send_wr = 16;
    a.cap.max_recv_wr = 64;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    v.qp = ibv_create_qp(pd, &a);
    if (v.qp == nullptr) die("ibv_create_qp");
    if (int rc = ToState(v.qp, v.type, v.state, peer); rc != 0) die("modify QP", rc);
  }
  auto post_recvs = [&](Victim& v, int count) {
    for (int i = 0; i < count; ++i) {
      ibv_sge s{reinterpret_cast<uint64_t>(rbuf.data()), static_cast<uint32_t>(rbuf.size()), mr_recv->lkey};
      ibv_recv_wr w{};
      ibv_recv_wr* bad;
      w.wr_id = v.qp->qp_num;
      w.sg_list = &s;
      w.num_sge = 1;
      if (ibv_post_recv(v.qp, &w, &bad)) return;  // RESET refuses, ERR flushes: both fine
    }
  };
  for (Victim& v : victims) {
    if (v.state != IBV_QPS_RESET) post_recvs(v, 64);
  }

  {
    std::ofstream out(std::string(file) + ".tmp");
    for (const Victim& v : victims) out << v.name << ' ' << v.qp->qp_num << '\n';
    out << "mr_rw " << reinterpret_cast<uint64_t>(rw) << ' ' << mr_rw->rkey << ' ' << kRegion << '\n';
    out << "mr_ro " << reinterpret_cast<uint64_t>(ro) << ' ' << mr_ro->rkey << ' ' << kRegion << '\n';
    out << "qkey " << kQkey << '\n';
    out.close();
    if (std::rename((std::string(file) + ".tmp").c_str(), file) != 0) die("rename");
  }
  std::printf("victim: ready\n");

  const std::string stop = std::string(file) + ".stop";
  uint64_t completions = 0, errors = 0, rearmed = 0;
  std::set<Victim*> rearm;
  std::map<uint32_t, Victim*> by_qpn;
  for (Victim& v : victims) by_qpn[v.qp->qp_num] = &v;
  for (;;) {
    const bool last = access(stop.c_str(), F_OK) == 0;
    ibv_wc wc[64];
    int k;
    while ((k = ibv_poll_cq(cq, 64, wc)) > 0) {
      for (int i = 0; i < k; ++i) {
        ++completions;
        if (wc[i].status != IBV_WC_SUCCESS) ++errors;
        auto it = by_qpn.find(static_cast<uint32_t>(wc[i].wr_id));
        if (it == by_qpn.end()) continue;
        Victim& v = *it->second;
        if (wc[i].status == IBV_WC_WR_FLUSH_ERR) {
          // A request the responder refused (an invalid opcode sequence, a
          // bad rkey, bounds or rights) put the QP in error, as IBA says,
          // and flushed its receives.
          if (v.state == IBV_QPS_RTR || v.state == IBV_QPS_RTS) rearm.insert(&v);
        } else {
          post_recvs(v, 1);
        }
      }
    }
    if (k < 0) die("ibv_poll_cq");
    if (last) break;
    // Bring the RTR and RTS victims that went to error back, to PSN 0
    // again, so that the attack keeps reaching their checks (a flush seen
    // is the sign: no polling of the QP state, each query a control call).
    for (auto it = rearm.begin(); it != rearm.end();) {
      Victim* v = *it;
      ibv_qp_attr r{};
      r.qp_state = IBV_QPS_RESET;
      if (int rc = ibv_modify_qp(v->qp, &r, IBV_QP_STATE); rc != 0) die("to RESET", rc);
      if (ToState(v->qp, v->type, v->state, peer) != 0) {
        ++it;  // put in error again on the way: next time
        continue;
      }
      post_recvs(*v, 64);
      ++rearmed;
      it = rearm.erase(it);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  uint64_t guard = 0, granted = 0;
  for (size_t i = 0; i < buf.size(); ++i) {
    if (buf[i] == kPattern) continue;
    if (i >= kRegion && i < 2 * kRegion) {
      ++granted;
    } else {
      ++guard;
    }
  }
  std::printf(
      "victim: guard bytes changed %llu, granted bytes changed %llu, completions %llu (%llu in error), "
      "QPs brought back from error %llu\n",
      static_cast<unsigned long long>(guard), static_cast<unsigned long long>(granted),
      static_cast<unsigned long long>(completions), static_cast<unsigned long long>(errors),
      static_cast<unsigned long long>(rearmed));
  for (Victim& v : victims) {
    if (int rc = ibv_destroy_qp(v.qp); rc != 0) die("ibv_destroy_qp", rc);
  }
  if (ibv_dereg_mr(mr_ro) || ibv_dereg_mr(mr_rw) || ibv_dereg_mr(mr_recv) || ibv_destroy_cq(cq) ||
      ibv_dealloc_pd(pd) || ibv_close_device(ctx)) {
    die("teardown");
  }
  ibv_free_device_list(devs);
  return guard == 0 ? 0 : 1;
}

// ---- attacker ----------------------------------------------------------------

struct Target {
  std::map<std::string, uint32_t> qpn;
  uint64_t rw_addr = 0, ro_addr = 0;
  uint32_t rw_rkey = 0, ro_rkey = 0;
  uint32_t qkey = 0;
};

Target ReadTarget(const char* file) {
  Target t;
  std::ifstream in(file);
  std::string name;
  while (in >> name) {
    if (name == "mr_rw" || name == "mr_ro") {
      uint64_t addr, len;
      uint32_t rkey;
      in >> addr >> rkey >> len;
      (name == "mr_rw" ? t.rw_addr : t.ro_addr) = addr;
      (name == "mr_rw" ? t.rw_rkey : t.ro_rkey) = rkey;
    } else if (name == "qkey") {
      in >> t.qkey;
    } else {
      in >> t.qpn[name];
    }
  }
  if (t.qpn.empty() || t.rw_rkey == 0) die("victim file");
  return t;
}

bool ParseMac(const char* s, droce::wire::MacAddr* m) {
  unsigned b[6];
  if (std::sscanf(s, "%x:%x:%x:%x:%x:%x", &b[0], &b[1], &b[2], &b[3], &b[4], &b[5]) != 6) return false;
  for (int i = 0; i < 6; ++i) (*m)[i] = static_cast<uint8_t>(b[i]);
  return true;
}

class Attacker {
 public:
  Attacker(const Target& t, const droce::wire::Path& path, uint64_t seed) : t_(t), path_(path), rng_(seed) {
    for (int op = 0; op < 256; ++op) {
      if (droce::wire::opcode_known(static_cast<uint8_t>(op))) opcodes_.push_back(static_cast<uint8_t>(op));
    }
    for (const auto& [name, qpn] : t_.qpn) {
      victims_.push_back(qpn);
      transport_[qpn] = name.rfind("uc_", 0) == 0 ? 0x20 : name.rfind("ud_", 0) == 0 ? 0x60 : 0x00;
    }
  }

  uint32_t R(uint32_t n) { return static_cast<uint32_t>(rng_() % n); }
  bool P(uint32_t percent) { return R(100) < percent; }

  // A frame with a correct ICRC, drawn at random.
  std::vector<uint8_t> Valid() {
    using namespace droce::wire;
    TransportHeaders h;
    const bool gsi = P(8);
    h.bth.opcode = gsi ? 0x64 /* UD SEND ONLY */ : opcodes_[R(static_cast<uint32_t>(opcodes_.size()))];
    const bool victim = !gsi && P(60);
    const uint32_t qpn = gsi ? 1 : victim ? victims_[R(static_cast<uint32_t>(victims_.size()))] : R(1u << 24);
    h.bth.dqpn = qpn;
    h.bth.psn = R(1u << 24);
    if (victim && P(60)) {
      // A whole-message request of the QP's own transport at the PSN it
      // expects (0 after the victim brought it back from error, or the
      // next): the responder's rkey, bounds, rights and length checks.
      static constexpr uint8_t kRequests[] = {0x04, 0x05, 0x0A, 0x0B, 0x0C, 0x12, 0x13, 0x14};
      h.bth.opcode = static_cast<uint8_t>(transport_[qpn] | kRequests[R(sizeof(kRequests))]);
      if (!droce::wire::opcode_known(h.bth.opcode)) h.bth.opcode = static_cast<uint8_t>(transport_[qpn] | 0x04);
      uint32_t& next = next_psn_[qpn];
      if (P(50)) next = 0;
      h.bth.psn = next++ & 0xFFFFFF;
    }
    h.bth.ackreq = P(50);
    h.bth.se = P(10);
    h.bth.pkey = P(95) ? 0xFFFF : static_cast<uint16_t>(R(0x10000));
    h.bth.tver = P(97) ? 0 : static_cast<uint8_t>(R(16));
    const bool rw = P(60);
    const uint64_t base = rw ? t_.rw_addr : t_.ro_addr;
    h.reth.rkey = P(80) ? (rw ? t_.rw_rkey : t_.ro_rkey) : static_cast<uint32_t>(rng_());
    switch (R(4)) {
      case 0: h.reth.va = base + R(kRegion); break;                   // inside
      case 1: h.reth.va = base + kRegion - R(2048); break;            // across the end
      case 2: h.reth.va = base - R(4096); break;                      // before it
      default: h.reth.va = rng_(); break;
    }
    h.reth.dma_len = P(80) ? R(4096) : static_cast<uint32_t>(rng_());
    h.atomic_eth.va = P(70) ? h.reth.va & ~uint64_t{7} : h.reth.va;
    h.atomic_eth.rkey = h.reth.rkey;
    h.atomic_eth.swap_add = rng_();
    h.atomic_eth.compare = rng_();
    h.deth.qkey = gsi ? (P(80) ? 0x80010000u : static_cast<uint32_t>(rng_())) : P(50) ? t_.qkey : static_cast<uint32_t>(rng_());
    h.deth.src_qp = gsi ? 1 : R(1u << 24);
    h.aeth.syndrome = static_cast<uint8_t>(R(256));
    h.aeth.msn = R(1u << 24);
    h.imm = static_cast<uint32_t>(rng_());
    h.ieth_rkey = P(50) ? t_.rw_rkey : static_cast<uint32_t>(rng_());
    const OpcodeInfo& info = opcode_info(h.bth.opcode);
    size_t len = 0;
    if (info.mask & kMaskPayload) len = gsi ? (P(80) ? 256 : R(512)) : P(70) ? R(1025) : R(1500);
    std::vector<uint8_t> payload(len);
    for (auto& b : payload) b = static_cast<uint8_t>(rng_());
    if (gsi && len >= 24) {
      // A MAD header that looks like the CM's (class 7, version 2) half the time.
      payload[0] = 1;
      payload[1] = P(50) ? 7 : static_cast<uint8_t>(R(256));
      payload[2] = 2;
    }
    std::vector<uint8_t> f(frame_len_for(path_, h.bth.opcode, len) + 16);
    const size_t n = build_frame(f, path_, h, payload, static_cast<uint16_t>(rng_()));
    if (n == 0) return Valid();  // a combination the builder refuses: draw again
    f.resize(n);
    return f;
  }

  // A frame broken in one of several ways.
  std::vector<uint8_t> Mutated() {
    std::vector<uint8_t> f = Valid();
    const unsigned outer = droce::wire::outer_len(path_);
    switch (R(7)) {
      case 0: {  // bit flips anywhere, ICRC kept (wrong) or recomputed
        for (uint32_t i = 0, k = 1 + R(8); i < k; ++i) f[R(static_cast<uint32_t>(f.size()))] ^= static_cast<uint8_t>(1u << R(8));
        // (finish_icrc reads the IP header: only while it still says IPv4
        // without options, or it could read past a short frame.)
        if (P(50) && f[12] == 0x08 && f[13] == 0x00 && f[14] == 0x45) droce::wire::finish_icrc(f.data(), f.size());
        break;
      }
      case 1:  // cut short: anywhere from the Ethernet header on
        f.resize(R(static_cast<uint32_t>(f.size())));
        if (f.size() < 14) f.resize(14);
        break;
      case 2:  // a wrong pad count, the ICRC recomputed
        if (f.size() > outer + 2) {
          f[outer + 1] = static_cast<uint8_t>((f[outer + 1] & ~0x30) | (R(4) << 4));
          droce::wire::finish_icrc(f.data(), f.size());
        }
        break;
      case 3: {  // grown past the path MTU, headers' lengths left or fixed
        const size_t extra = 1100 + R(300);
        for (size_t i = 0; i < extra && f.size() < 1514; ++i) f.push_back(static_cast<uint8_t>(rng_()));
        if (P(50)) droce::wire::finish_icrc(f.data(), f.size());
        break;
      }
      case 4:  // IPv4 total length, IHL or version wrong
        if (P(33)) {
          f[16] = static_cast<uint8_t>(rng_());
          f[17] = static_cast<uint8_t>(rng_());
        } else {
          f[14] = static_cast<uint8_t>(rng_());
        }
        break;
      case 5:  // UDP length wrong
        f[14 + 20 + 4] = static_cast<uint8_t>(rng_());
        f[14 + 20 + 5] = static_cast<uint8_t>(rng_());
        break;
      default:  // the ICRC alone wrong
        f[f.size() - 1 - R(4)] ^= static_cast<uint8_t>(1 + R(255));
        break;
    }
    return f;
  }

  // A valid frame for another station: to a unicast MAC that is not
  // DST_MAC, or to DST_MAC with another IP address (broken or not).
  std::vector<uint8_t> Elsewhere() {
    const droce::wire::Path saved = path_;
    if (P(50)) {
      path_.dmac[5] ^= static_cast<uint8_t>(1 + R(255));
      path_.dmac[0] &= 0xFE;  // unicast
    } else {
      path_.dip ^= 1 + R(255);
    }
    std::vector<uint8_t> f = Valid();
    path_ = saved;
    if (P(25)) f[f.size() - 1] ^= 0x5A;  // its ICRC wrong too: still not ours, not a bad ICRC
    return f;
  }

  // A legitimate frame seen on the link, changed so that it cannot pass as
  // the next packet of its flow; empty if none was seen yet.
  std::vector<uint8_t> Replay() {
    if (seen_.empty()) return {};
    std::vector<uint8_t> f = seen_[R(static_cast<uint32_t>(seen_.size()))];
    const unsigned outer = droce::wire::outer_len(path_);
    const uint8_t opcode = f[outer];
    switch (R(4)) {
      case 0:  // bits flipped, ICRC wrong
        for (uint32_t i = 0, k = 1 + R(4); i < k; ++i) f[R(static_cast<uint32_t>(f.size()))] ^= static_cast<uint8_t>(1u << R(8));
        f[f.size() - 1] ^= 0x80;
        break;
      case 1:  // cut short
        f.resize(14 + R(static_cast<uint32_t>(f.size() - 14)));
        break;
      case 2:  // an RC request moved 2^22 PSNs into the past: a duplicate
        if ((opcode >> 5) == 0 && opcode <= 0x14) {
          uint32_t psn = (uint32_t{f[outer + 9]} << 16 | uint32_t{f[outer + 10]} << 8 | f[outer + 11]);
          psn = (psn - (1u << 22)) & 0xFFFFFF;
          f[outer + 9] = static_cast<uint8_t>(psn >> 16);
          f[outer + 10] = static_cast<uint8_t>(psn >> 8);
          f[outer + 11] = static_cast<uint8_t>(psn);
          droce::wire::finish_icrc(f.data(), f.size());
        } else {
          f[f.size() - 2] ^= 0x01;
        }
        break;
      default: {  // to a random QPN (not a legitimate one, 1 in 2^24 aside)
        const uint32_t q = R(1u << 24);
        f[outer + 5] = static_cast<uint8_t>(q >> 16);
        f[outer + 6] = static_cast<uint8_t>(q >> 8);
        f[outer + 7] = static_cast<uint8_t>(q);
        droce::wire::finish_icrc(f.data(), f.size());
        break;
      }
    }
    return f;
  }

  // Keeps a copy of a RoCE frame (IPv4, UDP 4791, to the target's MAC).
  void Saw(const uint8_t* p, size_t n) {
    if (n < 14 + 20 + 8 + 12 + 4 || std::memcmp(p, path_.dmac.data(), 6) != 0) return;
    if (p[12] != 0x08 || p[13] != 0x00 || p[23] != 17 || p[36] != 0x12 || p[37] != 0xB7) return;
    if (seen_.size() < 512) {
      seen_.emplace_back(p, p + n);
    } else {
      seen_[R(512)].assign(p, p + n);
    }
  }

 private:
  Target t_;
  droce::wire::Path path_;
  std::mt19937_64 rng_;
  std::vector<uint8_t> opcodes_;
  std::vector<uint32_t> victims_;
  std::map<uint32_t, uint32_t> next_psn_;
  std::map<uint32_t, uint8_t> transport_;  // a victim's opcode high bits
  std::vector<std::vector<uint8_t>> seen_;
};

int RunAttack(int argc, char** argv) {
  const char* iface = argv[2];
  droce::wire::Path path;
  if (!ParseMac(argv[3], &path.dmac)) die("DST_MAC");
  in_addr dip{}, sip{};
  if (inet_pton(AF_INET, argv[4], &dip) != 1 || inet_pton(AF_INET, argv[5], &sip) != 1) die("DST_IP/SRC_IP");
  path.dip = ntohl(dip.s_addr);
  path.sip = ntohl(sip.s_addr);
  const Target target = ReadTarget(argv[6]);
  const double seconds = std::atof(argv[7]);
  const uint64_t seed = std::strtoull(argv[8], nullptr, 0);
  const double pps = argc > 9 ? std::atof(argv[9]) : 5000;
  const bool flood = argc > 10 && std::strcmp(argv[10], "1") == 0;

  const int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK, htons(ETH_P_ALL));
  if (fd < 0) die("packet socket");
  ifreq ifr{};
  std::snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", iface);
  if (ioctl(fd, SIOCGIFHWADDR, &ifr) != 0) die("SIOCGIFHWADDR");
  std::memcpy(path.smac.data(), ifr.ifr_hwaddr.sa_data, 6);
  sockaddr_ll sll{};
  sll.sll_family = AF_PACKET;
  sll.sll_protocol = htons(ETH_P_ALL);
  sll.sll_ifindex = static_cast<int>(if_nametoindex(iface));
  if (sll.sll_ifindex == 0 || bind(fd, reinterpret_cast<sockaddr*>(&sll), sizeof(sll)) != 0) die("bind");

  Attacker a(target, path, seed);
  std::map<std::string, uint64_t> sent;
  uint64_t refused = 0, group = 0;
  auto send = [&](const std::vector<uint8_t>& f, const char* kind) {
    if (f.empty()) return;
    if (::send(fd, f.data(), f.size(), 0) == static_cast<ssize_t>(f.size())) {
      ++sent[kind];
      if (f[0] & 1) ++group;  // a flip made it group-addressed: every station on the link takes it
    } else {
      ++refused;  // the socket's queue full (a flood), or a frame the kernel will not send
    }
  };
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  uint64_t paced = 0;
  for (;;) {
    const double t = std::chrono::duration<double>(Clock::now() - start).count();
    if (t >= seconds) break;
    // What the link carries meanwhile, for the replays.
    uint8_t rx[2048];
    for (int i = 0; i < 64; ++i) {
      const ssize_t n = recv(fd, rx, sizeof(rx), 0);
      if (n <= 0) break;
      a.Saw(rx, static_cast<size_t>(n));
    }
    if (paced >= t * pps) {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      continue;
    }
    const uint32_t k = a.R(100);
    if (flood && k < 2) {
      std::vector<uint8_t> f = a.Valid();
      for (int i = 0; i < 2000; ++i) send(f, "flood");
      paced += 2000;
    } else if (k < 40) {
      send(a.Valid(), "valid");
      ++paced;
    } else if (k < 76) {
      send(a.Mutated(), "mutated");
      ++paced;
    } else if (k < 80) {
      send(a.Elsewhere(), "elsewhere");
      ++paced;
    } else {
      send(a.Replay(), "replay");
      ++paced;
    }
  }
  uint64_t total = 0;
  std::printf("attack:");
  for (const auto& [kind, n] : sent) {
    std::printf(" %s %llu", kind.c_str(), static_cast<unsigned long long>(n));
    total += n;
  }
  std::printf(" total %llu refused %llu group-addressed %llu\n", static_cast<unsigned long long>(total),
              static_cast<unsigned long long>(refused), static_cast<unsigned long long>(group));
  close(fd);
  return total > 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (argc == 4 && std::strcmp(argv[1], "victim") == 0) return RunVictim(argv[2], argv[3]);
  if (argc >= 9 && argc <= 11 && std::strcmp(argv[1], "attack") == 0) return RunAttack(argc, argv);
  std::fprintf(stderr,
               "usage: hostile_peer victim FILE PEER_IP\n"
               "       hostile_peer attack IFACE DST_MAC DST_IP SRC_IP FILE SECONDS SEED [PPS] [FLOOD]\n");
  return 2;
}
