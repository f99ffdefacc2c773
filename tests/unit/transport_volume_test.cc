// Volume over the simulated link (transport/sim/two_qp.h): hundreds of
// thousands of messages of every operation and of random sizes (mostly small,
// some several packets) at 0%, 1% and 10% loss, with reordering and
// duplication (and corruption where there is loss). Every byte and every
// completion is checked: status, opcode, byte_len, immediate data, invalidated
// rkey, wr_id order, atomic originals, and that each atomic ran exactly once.
//
//   DROCE_SIM_SCALE=N   multiplies the message counts (the slow suite runs 10)
//   DROCE_SIM_SEEDS=N   runs N seeds per case instead of 4 (RC) or 2 (UC, UD)
//   DROCE_SIM_SEED=S    runs only seed S: a failure's trace names its seed
//
// Timing is not asserted (benchmarks are in bench/); the message counts are
// printed so that a run's volume is visible in the log.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "queue/wqe_encode.h"
#include "transport/sim/two_qp.h"

namespace droce::test {
namespace {

using queue::WqeOp;
using transport::QpState;
using transport::QpType;
using transport::sim::ConnectOpts;
using transport::sim::kSimPd;
using transport::sim::LinkFaults;
using transport::sim::SimPair;
using transport::sim::SimQp;

uint32_t Scale() {
  const char* v = std::getenv("DROCE_SIM_SCALE");
  const long n = v != nullptr ? std::strtol(v, nullptr, 10) : 1;
  return n >= 1 && n <= 10000 ? static_cast<uint32_t>(n) : 1;
}

uint64_t Seeds(uint64_t fallback) {
  const char* v = std::getenv("DROCE_SIM_SEEDS");
  const long n = v != nullptr ? std::strtol(v, nullptr, 10) : 0;
  return n >= 1 && n <= 1000000 ? static_cast<uint64_t>(n) : fallback;
}

std::optional<uint64_t> OnlySeed() {
  const char* v = std::getenv("DROCE_SIM_SEED");
  if (v == nullptr || *v == '\0') return std::nullopt;
  return std::strtoull(v, nullptr, 10);
}

// The bytes of message `seq`: 8 at a time, a hash of (seq, offset / 8), so
// that another message's bytes, or the right bytes at a wrong offset, do not
// match.
uint64_t PatternWord(uint32_t seq, uint32_t word) {
  uint64_t x = ((uint64_t{seq} << 32) | word) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  return x ^ (x >> 32);
}
void Fill(uint8_t* dst, uint32_t len, uint32_t seq) {
  for (uint32_t i = 0; i < len; i += 8) {
    const uint64_t w = PatternWord(seq, i / 8);
    std::memcpy(dst + i, &w, std::min<uint32_t>(8, len - i));
  }
}
bool Matches(const uint8_t* p, uint32_t len, uint32_t seq) {
  for (uint32_t i = 0; i < len; i += 8) {
    const uint64_t w = PatternWord(seq, i / 8);
    if (std::memcmp(p + i, &w, std::min<uint32_t>(8, len - i)) != 0) return false;
  }
  return true;
}

uint8_t SendCqeOpcode(WqeOp op) {
  switch (op) {
    case WqeOp::kWrite:
    case WqeOp::kWriteImm: return queue::wc::kOpRdmaWrite;
    case WqeOp::kRead: return queue::wc::kOpRdmaRead;
    case WqeOp::kCmpSwap: return queue::wc::kOpCompSwap;
    case WqeOp::kFetchAdd: return queue::wc::kOpFetchAdd;
    default: return queue::wc::kOpSend;
  }
}
bool ConsumesRecv(WqeOp op) {
  return op == WqeOp::kSend || op == WqeOp::kSendImm || op == WqeOp::kSendInv || op == WqeOp::kWriteImm;
}

std::string Dump(const Counters& c) {
  std::string out;
  for (const auto& i : kCounterInfo) {
    if (c.*(i.field) != 0) out += std::string(i.name) + "=" + std::to_string(c.*(i.field)) + " ";
  }
  return out;
}

// Random sizes: mostly up to 64 bytes, some up to one MTU, a few of 2-4
// packets.
uint32_t RandomLen(std::mt19937_64& rng, uint32_t mtu) {
  const uint32_t r = rng() % 100;
  if (r < 75) return static_cast<uint32_t>(rng() % 65);
  if (r < 93) return 65 + static_cast<uint32_t>(rng() % (mtu - 64));
  return mtu + 1 + static_cast<uint32_t>(rng() % (2 * mtu + 17));
}
constexpr uint32_t kSlot = 16384;  // > 3 × 4096 + 17

// One message as posted, and what its completions must say.
struct Msg {
  WqeOp op = WqeOp::kSend;
  uint32_t seq = 0;
  uint32_t len = 0;
  uint32_t imm = 0;          // kSendImm, kWriteImm
  uint32_t inv_rkey = 0;     // kSendInv
  uint64_t expect_orig = 0;  // atomics
};

// Builds the send WQE for `m` with its local data at `local` (already
// filled for requests that carry data): one SGE, or the range split over
// two or three SGEs, or inline data when it fits.
void PostMsg(SimQp& q, std::mt19937_64& rng, const Msg& m, uint32_t local_off, uint64_t raddr,
             uint32_t rkey, uint64_t cmp = 0, uint64_t swp = 0) {
  queue::SendWqe w{};
  w.wr_id = m.seq;
  w.op = m.op;
  w.flags = queue::kWqeSignaled | ((rng() & 1) ? queue::kWqeSolicited : 0);
  w.imm_data = m.imm;
  SimQp::EncodeRemote(&w, raddr, m.op == WqeOp::kSendInv ? m.inv_rkey : rkey, cmp, swp);
  // UD (sends only): the peer's address handle (SimQp::Connect).
  if (q.qp->type() == transport::QpType::kUd) queue::EncodeUd(&w, 1, 0x22, ConnectOpts{}.qkey);
  const bool carries_data = m.op != WqeOp::kRead && m.op != WqeOp::kCmpSwap && m.op != WqeOp::kFetchAdd;
  if (carries_data && m.len <= SimQp::kMaxInline && rng() % 4 == 0) {
    w.flags |= queue::kWqeInline;
    w.inline_len = m.len;
    q.PostInline(w, q.buf.data() + local_off);
    return;
  }
  queue::Sge s[3];
  uint32_t n = 1;
  s[0] = {q.Addr(local_off), m.len, q.key};
  if (m.len >= 3 && rng() % 4 == 0) {
    const uint32_t cut1 = 1 + static_cast<uint32_t>(rng() % (m.len - 2));
    const uint32_t cut2 = cut1 + 1 + static_cast<uint32_t>(rng() % (m.len - cut1 - 1));
    s[0].length = cut1;
    s[1] = {q.Addr(local_off + cut1), cut2 - cut1, q.key};
    s[2] = {q.Addr(local_off + cut2), m.len - cut2, q.key};
    n = 3;
  }
  w.num_sge = static_cast<uint16_t>(n);
  q.Post(w, s);
}

#define VOLUME_CHECK(cond, what)                                                             \
  do {                                                                                      \
    if (!(cond)) {                                                                          \
      ADD_FAILURE() << "check failed: " #cond << " (" << what << ")\n  requester: "         \
                    << Dump(p.a.env->stats) << "\n  responder: " << Dump(p.b.env->stats);   \
      return 0;                                                                             \
    }                                                                                       \
  } while (0)

// RC: A posts every operation towards B with up to `depth` outstanding; B
// keeps its receive queue full. Returns the messages completed (0 after a
// failure, which has been reported).
uint64_t RcVolume(LinkFaults faults, uint8_t ibv_mtu, uint32_t nmsgs, uint64_t seed, uint32_t depth,
                  bool sr = false) {
  SimPair p(faults, seed);
  p.a.sr.on = p.b.sr.on = sr;  // selective repeat at both ends
  ConnectOpts opts;
  opts.mtu = ibv_mtu;
  opts.timeout = 8;  // 1 ms: several times the simulated RTT with jitter
  // B's buffer: receive slots, then READ/WRITE target slots, then the atomic word.
  const size_t target_area = size_t{depth} * kSlot;
  const size_t atomic_off = 2 * target_area;
  if (p.Init(depth, 2 * depth, atomic_off + 64, opts) != 0) {
    ADD_FAILURE() << "connect failed";
    return 0;
  }
  SimQp &a = p.a, &b = p.b;
  const uint32_t mtu = transport::mtu_bytes(ibv_mtu);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);

  // Type 2 memory windows on B for SEND with invalidate: bound (as if B had
  // posted a bind) just before a SEND_INV names one, invalid again after.
  std::vector<uint32_t> free_mws;
  for (int i = 0; i < 8; ++i) free_mws.push_back(*b.env->mrs.AllocMw(kSimPd, 2));

  uint64_t word = 0;  // what B's atomic word must hold
  std::memset(b.buf.data() + atomic_off, 0, 8);
  std::vector<Msg> msgs(depth);
  std::vector<uint8_t> busy(depth);          // completions still owed per slot
  std::vector<uint32_t> recv_order(depth);   // seqs of receive-consuming messages, in order
  uint32_t posted = 0, a_done = 0, b_done = 0, recv_posted = 0, recv_expected = 0;
  std::vector<queue::Cqe> cqes(2 * depth);

  while (a_done < nmsgs || b_done < recv_expected) {
    // Post while the next slot is free.
    while (posted < nmsgs && a.SqHasRoom() && busy[posted % depth] == 0) {
      const uint32_t slot = posted % depth;
      Msg& m = msgs[slot];
      m = Msg{};
      m.seq = posted;
      const uint32_t r = static_cast<uint32_t>(rng() % 100);
      m.op = r < 18   ? WqeOp::kSend
             : r < 28 ? WqeOp::kSendImm
             : r < 33 ? WqeOp::kSendInv
             : r < 51 ? WqeOp::kWrite
             : r < 61 ? WqeOp::kWriteImm
             : r < 76 ? WqeOp::kRead
             : r < 88 ? WqeOp::kCmpSwap
                      : WqeOp::kFetchAdd;
      if (m.op == WqeOp::kSendInv && free_mws.empty()) m.op = WqeOp::kSend;
      const bool atomic = m.op == WqeOp::kCmpSwap || m.op == WqeOp::kFetchAdd;
      m.len = atomic ? 8 : RandomLen(rng, mtu);
      m.imm = static_cast<uint32_t>(rng());
      const uint32_t local = slot * kSlot;
      const size_t target = target_area + size_t{slot} * kSlot;
      uint64_t cmp = 0, swp = 0, raddr = b.Addr(target);
      if (m.op == WqeOp::kSendInv) {
        const uint32_t mw = free_mws.back();
        free_mws.pop_back();
        m.inv_rkey = (mw & ~0xFFu) | ((mw + 1 + static_cast<uint32_t>(rng() % 255)) & 0xFFu);
        VOLUME_CHECK(b.env->mrs.Bind(m.inv_rkey, 2, kSimPd, b.qp->qpn(), b.key, b.Addr(0), 64,
                                     mem::kRemoteWrite) == mem::BindError::kOk,
                     "bind");
      }
      if (m.op == WqeOp::kRead) {
        Fill(b.buf.data() + target, m.len, m.seq);  // B's memory, READ by A
      } else if (atomic) {
        raddr = b.Addr(atomic_off);
        m.expect_orig = word;
        if (m.op == WqeOp::kFetchAdd) {
          cmp = rng() % 1000;
          word += cmp;
        } else {
          cmp = (rng() & 1) ? word : rng();  // equal half the time: the swap happens
          swp = rng();
          if (cmp == word) word = swp;
        }
      } else {
        Fill(a.buf.data() + local, m.len, m.seq);
      }
      PostMsg(a, rng, m, local, raddr, b.key, cmp, swp);
      busy[slot] = 1;
      if (ConsumesRecv(m.op)) {
        recv_order[recv_expected++ % depth] = m.seq;
        busy[slot] = 2;
      }
      ++posted;
    }
    // B's receive queue stays full; a receive slot is reused once polled.
    while (b.RqHasRoom() && recv_posted - b_done < depth) {
      b.PostRecv(recv_posted, (recv_posted % depth) * kSlot, kSlot);
      ++recv_posted;
    }
    p.net.Step();
    VOLUME_CHECK(p.net.link.clock < 3'600'000'000'000ull, "stuck at message " << a_done);

    int n = a.scq_c->Poll(cqes.data(), static_cast<int>(cqes.size()));
    for (int i = 0; i < n; ++i) {
      const queue::Cqe& c = cqes[i];
      const Msg& m = msgs[a_done % depth];
      VOLUME_CHECK(c.wr_id == a_done, "send wr_id " << c.wr_id << " expected " << a_done);
      VOLUME_CHECK(c.status == queue::wc::kSuccess, "send status " << int{c.status} << " seq " << m.seq << " op " << int(m.op) << " len " << m.len);
      VOLUME_CHECK(c.opcode == SendCqeOpcode(m.op), "send opcode seq " << m.seq);
      VOLUME_CHECK(c.byte_len == m.len, "send byte_len seq " << m.seq);
      VOLUME_CHECK(c.qp_num == a.qp->qpn(), "send qp_num");
      const uint32_t slot = m.seq % depth;
      const uint8_t* target = b.buf.data() + target_area + size_t{slot} * kSlot;
      if (m.op == WqeOp::kWrite || m.op == WqeOp::kWriteImm) {
        VOLUME_CHECK(Matches(target, m.len, m.seq), "WRITE data seq " << m.seq << " len " << m.len);
      } else if (m.op == WqeOp::kRead) {
        VOLUME_CHECK(Matches(a.buf.data() + size_t{slot} * kSlot, m.len, m.seq),
                     "READ data seq " << m.seq << " len " << m.len);
      } else if (m.op == WqeOp::kCmpSwap || m.op == WqeOp::kFetchAdd) {
        uint64_t orig;
        std::memcpy(&orig, a.buf.data() + size_t{slot} * kSlot, 8);
        VOLUME_CHECK(orig == m.expect_orig, "atomic original seq " << m.seq);
      }
      --busy[slot];
      ++a_done;
    }
    n = b.rcq_c->Poll(cqes.data(), static_cast<int>(cqes.size()));
    for (int i = 0; i < n; ++i) {
      const queue::Cqe& c = cqes[i];
      VOLUME_CHECK(b_done < recv_expected, "unexpected receive completion");
      const Msg& m = msgs[recv_order[b_done % depth] % depth];
      VOLUME_CHECK(c.wr_id == b_done, "recv wr_id " << c.wr_id << " expected " << b_done);
      VOLUME_CHECK(c.status == queue::wc::kSuccess, "recv status " << int{c.status} << " seq " << m.seq);
      VOLUME_CHECK(c.byte_len == m.len, "recv byte_len " << c.byte_len << " seq " << m.seq << " len " << m.len);
      VOLUME_CHECK(c.qp_num == b.qp->qpn() && c.src_qp == a.qp->qpn(), "recv qp numbers");
      const bool imm = m.op == WqeOp::kSendImm || m.op == WqeOp::kWriteImm;
      const bool inv = m.op == WqeOp::kSendInv;
      VOLUME_CHECK(c.opcode == (m.op == WqeOp::kWriteImm ? queue::wc::kOpRecvRdmaWithImm : queue::wc::kOpRecv),
                   "recv opcode seq " << m.seq);
      VOLUME_CHECK(((c.wc_flags & queue::wc::kFlagWithImm) != 0) == imm, "recv imm flag seq " << m.seq);
      VOLUME_CHECK(((c.wc_flags & queue::wc::kFlagWithInv) != 0) == inv, "recv inv flag seq " << m.seq);
      if (imm) VOLUME_CHECK(c.imm_data == m.imm, "imm_data seq " << m.seq);
      const uint32_t slot = m.seq % depth;
      if (m.op == WqeOp::kWriteImm) {
        VOLUME_CHECK(Matches(b.buf.data() + target_area + size_t{slot} * kSlot, m.len, m.seq),
                     "WRITE_IMM data seq " << m.seq);
      } else {
        VOLUME_CHECK(Matches(b.buf.data() + (c.wr_id % depth) * kSlot, m.len, m.seq),
                     "SEND data seq " << m.seq << " len " << m.len);
      }
      if (inv) {
        VOLUME_CHECK(c.imm_data == m.inv_rkey, "invalidated rkey seq " << m.seq);
        const mem::Mw* mw = b.env->mrs.FindMw(m.inv_rkey);
        VOLUME_CHECK(mw != nullptr && !mw->bound, "window still bound after SEND_INV seq " << m.seq);
        free_mws.push_back(m.inv_rkey);
      }
      --busy[slot];
      ++b_done;
    }
  }
  uint64_t final_word;
  std::memcpy(&final_word, b.buf.data() + atomic_off, 8);
  VOLUME_CHECK(final_word == word, "atomic word: an atomic ran twice or not at all");
  VOLUME_CHECK(a.qp->state() == QpState::kRts && b.qp->state() == QpState::kRts, "QP states");
  VOLUME_CHECK(p.net.link.stats.parse_errors == 0 && p.net.unrouted == 0, "link");
  // One QP per environment: each QP counter equals the device counter.
  for (size_t i = 0; i < kNumQpCounters; ++i) {
    VOLUME_CHECK(a.qp->counters().values[i] == a.env->stats.*kQpCounterInfo[i].field &&
                     b.qp->counters().values[i] == b.env->stats.*kQpCounterInfo[i].field,
                 "QP counter " << kQpCounterInfo[i].name);
  }
  VOLUME_CHECK(b.qp->counters()[QpCounter::rcvd_pkts] >= nmsgs && a.qp->counters()[QpCounter::sent_pkts] >= nmsgs,
               "packet counters");
  const transport::sim::LinkStats& ls = p.net.link.stats;
  std::printf("  RC seed %llu MTU %u: %u messages, %llu frames (%llu lost, %llu duplicated, %llu corrupted), "
              "%llu timeouts, %llu sequence NAKs, %llu duplicate requests, %llu retransmitted, "
              "%llu SACKs, %llu RTOs\n",
              static_cast<unsigned long long>(seed), mtu, a_done, static_cast<unsigned long long>(ls.sent),
              static_cast<unsigned long long>(ls.lost), static_cast<unsigned long long>(ls.duplicated),
              static_cast<unsigned long long>(ls.corrupted),
              static_cast<unsigned long long>(a.env->stats.completer_retry_err),
              static_cast<unsigned long long>(a.env->stats.rcvd_seq_err),
              static_cast<unsigned long long>(b.env->stats.duplicate_request),
              static_cast<unsigned long long>(a.env->stats.retransmitted_pkts),
              static_cast<unsigned long long>(a.env->stats.sr_sack_rcvd),
              static_cast<unsigned long long>(a.env->stats.sr_timeouts));
  return a_done;
}

// UC and UD, in batches: A sends a batch, the link drains, then every
// completion is checked. A receive must be one of the batch's messages,
// intact (duplicates may be delivered twice: UC and UD do not detect them,
// as rxe does not); with no loss and no corruption UD delivers every message.
uint64_t UnreliableVolume(QpType type, LinkFaults faults, uint8_t ibv_mtu, uint32_t nmsgs, uint64_t seed) {
  constexpr uint32_t kDepth = 64, kBatch = 16;
  constexpr uint32_t kGrh = 40;
  SimPair p(faults, seed);
  ConnectOpts opts;
  opts.mtu = ibv_mtu;
  // A: one local slot per batch entry. B: receive slots, then WRITE targets.
  const size_t target_area = size_t{kDepth} * kSlot;
  if (p.Init(kDepth, 4 * kDepth, target_area + size_t{kBatch} * kSlot, opts, type) != 0) {
    ADD_FAILURE() << "connect failed";
    return 0;
  }
  SimQp &a = p.a, &b = p.b;
  const bool ud = type == QpType::kUd;
  const uint32_t mtu = transport::mtu_bytes(ibv_mtu);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 2);
  Msg batch[kBatch];
  uint32_t received[kBatch];
  std::vector<queue::Cqe> cqes(4 * kDepth);
  uint32_t seq = 0, recv_posted = 0, recv_done = 0;
  uint64_t delivered = 0;
  while (seq < nmsgs) {
    while (b.RqHasRoom() && recv_posted - recv_done < kDepth) {
      b.PostRecv(recv_posted, (recv_posted % kDepth) * kSlot, kSlot);
      ++recv_posted;
    }
    const uint32_t count = std::min(kBatch, nmsgs - seq);
    for (uint32_t i = 0; i < count; ++i) {
      Msg& m = batch[i];
      m = Msg{};
      m.seq = seq++;
      const uint32_t r = static_cast<uint32_t>(rng() % 100);
      if (ud) {
        m.op = r < 50 ? WqeOp::kSend : WqeOp::kSendImm;
        m.len = std::min(RandomLen(rng, mtu), mtu);  // UD: one packet
      } else {
        m.op = r < 35 ? WqeOp::kSend : r < 60 ? WqeOp::kSendImm : r < 75 ? WqeOp::kWrite : WqeOp::kWriteImm;
        m.len = RandomLen(rng, mtu);
      }
      m.imm = static_cast<uint32_t>(rng());
      received[i] = 0;
      Fill(a.buf.data() + size_t{i} * kSlot, m.len, m.seq);
      PostMsg(a, rng, m, i * kSlot, b.Addr(target_area + size_t{i} * kSlot), b.key);
    }
    while (p.net.Step()) {
    }
    int n = a.scq_c->Poll(cqes.data(), static_cast<int>(cqes.size()));
    VOLUME_CHECK(n == static_cast<int>(count), "send completions " << n << " of " << count);
    for (int i = 0; i < n; ++i) {
      const queue::Cqe& c = cqes[i];
      const Msg& m = batch[i];
      VOLUME_CHECK(c.wr_id == m.seq && c.status == queue::wc::kSuccess, "send completion seq " << m.seq);
      VOLUME_CHECK(c.opcode == SendCqeOpcode(m.op) && c.byte_len == m.len, "send opcode/len seq " << m.seq);
    }
    n = b.rcq_c->Poll(cqes.data(), static_cast<int>(cqes.size()));
    for (int i = 0; i < n; ++i) {
      const queue::Cqe& c = cqes[i];
      VOLUME_CHECK(c.wr_id == recv_done, "recv wr_id " << c.wr_id << " expected " << recv_done);
      ++recv_done;
      VOLUME_CHECK(c.status == queue::wc::kSuccess, "recv status " << int{c.status});
      const uint8_t* data = b.buf.data() + (c.wr_id % kDepth) * kSlot;
      if (ud) {
        VOLUME_CHECK(c.wc_flags & queue::wc::kFlagGrh, "UD GRH flag");
        VOLUME_CHECK(c.src_qp == a.qp->qpn() && c.byte_len >= kGrh && data[kGrh / 2] == 0x45, "UD GRH, src_qp");
        data += kGrh;
      }
      const uint32_t len = ud ? c.byte_len - kGrh : c.byte_len;
      const bool imm = (c.wc_flags & queue::wc::kFlagWithImm) != 0;
      const bool write = c.opcode == queue::wc::kOpRecvRdmaWithImm;
      VOLUME_CHECK(write ? imm : c.opcode == queue::wc::kOpRecv, "recv opcode");
      // Which message of the batch is it? Duplicates may match one twice;
      // messages that cannot be told apart (empty, no immediate) are
      // credited to one not yet received first.
      int found = -1;
      for (uint32_t k = 0; k < count; ++k) {
        const Msg& m = batch[k];
        if (m.len != len || (m.op == WqeOp::kWriteImm) != write ||
            (m.op == WqeOp::kSendImm || m.op == WqeOp::kWriteImm) != imm || (imm && c.imm_data != m.imm)) {
          continue;
        }
        const uint8_t* at = write ? b.buf.data() + target_area + size_t{k} * kSlot : data;
        if (Matches(at, len, m.seq)) {
          if (found < 0 || received[found] != 0) found = static_cast<int>(k);
          if (received[k] == 0) break;
        }
      }
      VOLUME_CHECK(found >= 0, "a received message matches none sent (len " << len << ")");
      ++received[found];
      ++delivered;
    }
    if (ud && faults.loss == 0 && faults.corrupt == 0) {
      for (uint32_t k = 0; k < count; ++k) VOLUME_CHECK(received[k] != 0, "UD lost seq " << batch[k].seq);
    }
  }
  VOLUME_CHECK(a.qp->state() == QpState::kRts && b.qp->state() == QpState::kRts, "QP states");
  VOLUME_CHECK(p.net.link.stats.parse_errors == 0 && p.net.unrouted == 0, "link");
  std::printf("  %s seed %llu: %u sent, %llu delivered\n", ud ? "UD" : "UC",
              static_cast<unsigned long long>(seed), nmsgs, static_cast<unsigned long long>(delivered));
  return nmsgs;
}

LinkFaults Faults(double loss) {
  LinkFaults f;
  f.loss = loss;
  f.dup = 0.02;
  f.reorder = 0.05;
  f.corrupt = loss > 0 ? 0.005 : 0;
  return f;
}

// Each seed's path MTU is 1 + seed % 5 (256-4096); the first seeds of each
// case are chosen so that every MTU occurs.
// Runs `run(seed)` for each seed (or only DROCE_SIM_SEED), with the seed and
// loss rate in the trace; returns the messages completed.
template <typename Run>
uint64_t ForSeeds(double loss, uint64_t first, uint64_t count, Run&& run) {
  uint64_t total = 0;
  const std::optional<uint64_t> only = OnlySeed();
  for (uint64_t seed = first; seed < first + Seeds(count); ++seed) {
    if (only && *only != seed) continue;
    SCOPED_TRACE(testing::Message() << "loss " << loss << " seed " << seed
                                    << " (replay: DROCE_SIM_SEED=" << seed << ")");
    total += run(seed);
    if (testing::Test::HasFailure()) break;
  }
  return total;
}

class RcVolumeTest : public testing::TestWithParam<double> {};

// Every RC operation mixed, each seed with its own path MTU (256-4096).
TEST_P(RcVolumeTest, EveryOperation) {
  const double loss = GetParam();
  // Go-back-N resends the window after each loss: fewer outstanding at 10%.
  const uint32_t depth = loss >= 0.05 ? 16 : 64;
  const uint32_t per_seed = (loss >= 0.05 ? 25000 : 50000) * Scale();
  const uint64_t first = loss == 0 ? 1'000'000 : loss < 0.05 ? 2'000'001 : 3'000'002;
  const uint64_t total = ForSeeds(loss, first, 4, [&](uint64_t seed) {
    return RcVolume(Faults(loss), static_cast<uint8_t>(1 + seed % 5), per_seed, seed, depth);
  });
  std::printf("  RC at %.0f%% loss: %llu messages\n", loss * 100, static_cast<unsigned long long>(total));
}
INSTANTIATE_TEST_SUITE_P(Loss, RcVolumeTest, testing::Values(0.0, 0.01, 0.10));

// The same with selective repeat at both ends (transport_sr_test.cc checks
// what it saves): every operation still byte-exact and in order, with
// loss, duplicates, reordering and corruption.
class RcVolumeSrTest : public testing::TestWithParam<double> {};

TEST_P(RcVolumeSrTest, EveryOperation) {
  const double loss = GetParam();
  const uint32_t depth = 64;
  const uint32_t per_seed = 25000 * Scale();
  const uint64_t first = loss < 0.05 ? 4'000'001 : 5'000'002;
  const uint64_t total = ForSeeds(loss, first, 4, [&](uint64_t seed) {
    return RcVolume(Faults(loss), static_cast<uint8_t>(1 + seed % 5), per_seed, seed, depth, true);
  });
  std::printf("  RC with selective repeat at %.0f%% loss: %llu messages\n", loss * 100,
              static_cast<unsigned long long>(total));
}
INSTANTIATE_TEST_SUITE_P(Loss, RcVolumeSrTest, testing::Values(0.01, 0.10));

class UnreliableVolumeTest : public testing::TestWithParam<double> {};

TEST_P(UnreliableVolumeTest, Uc) {
  const double loss = GetParam();
  const uint64_t first = loss == 0 ? 4'000'000 : loss < 0.05 ? 5'000'002 : 6'000'003;
  ForSeeds(loss, first, 2, [&](uint64_t seed) {
    return UnreliableVolume(QpType::kUc, Faults(loss), static_cast<uint8_t>(1 + seed % 5), 20000 * Scale(), seed);
  });
}
TEST_P(UnreliableVolumeTest, Ud) {
  const double loss = GetParam();
  const uint64_t first = loss == 0 ? 7'000'003 : loss < 0.05 ? 8'000'001 : 9'000'002;
  ForSeeds(loss, first, 2, [&](uint64_t seed) {
    return UnreliableVolume(QpType::kUd, Faults(loss), static_cast<uint8_t>(1 + seed % 5), 20000 * Scale(), seed);
  });
}
INSTANTIATE_TEST_SUITE_P(Loss, UnreliableVolumeTest, testing::Values(0.0, 0.01, 0.10));

}  // namespace
}  // namespace droce::test
