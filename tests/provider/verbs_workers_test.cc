// A device with two workers (meson runs this binary with DROCE_WORKERS=2,
// once with application-driven progress and once with DROCE_PROGRESS=thread)
// on the loopback link: QPs are spread over the workers, a packet received on
// the queue of a worker that does not own its QP is handed to the owner, and
// what QPs of different workers share — a CQ, an SRQ, a memory word hit by
// atomics — stays exact while both workers run.
#include "loopback_fixture.h"

namespace droce::test {
namespace {

uint16_t WorkerOf(ibv_qp* qp) {
  return reinterpret_cast<provider::Qp*>(ibv_qp_to_qp_ex(qp))->handle.worker;
}

class Workers : public Loopback {
 protected:
  void SetUp() override {
    Loopback::SetUp();
    ASSERT_EQ(provider::to_ctx(ctx_)->s->engine->workers(), 2) << "run with DROCE_WORKERS=2";
  }
  Counters DeviceCounters() { return provider::to_ctx(ctx_)->s->engine->ReadCounters(); }
};

TEST_F(Workers, QpsAreSpreadAndPacketsReachTheirOwner) {
  ibv_cq* cq = ibv_create_cq(ctx_, 1024, nullptr, nullptr, 0);
  ASSERT_NE(cq, nullptr);
  ibv_qp* a = CreateQp(cq, cq, 64);
  ibv_qp* b = CreateQp(cq, cq, 64);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  // The worker with the fewest QPs gets the next one.
  EXPECT_NE(WorkerOf(a), WorkerOf(b));
  Connect(a, b);
  const Counters before = DeviceCounters();
  // Requests from a arrive on a's worker's queue (the loopback link returns
  // frames on the queue that sent them) and belong to b; the ACKs go back.
  constexpr int kMsgs = 200;
  for (int done = 0; done < kMsgs; done += 16) {
    for (int i = 0; i < 16; ++i) {
      ASSERT_EQ(PostRecv(b, done + i, 65536 + (i * 256), 256), 0);
      buf_[i * 256] = static_cast<uint8_t>(done + i);
      ASSERT_EQ(PostSend(a, done + i, i * 256, 200), 0);
    }
    auto wcs = Poll(cq, 32);
    ASSERT_EQ(wcs.size(), 32u);
    for (const ibv_wc& wc : wcs) {
      ASSERT_EQ(wc.status, IBV_WC_SUCCESS);
      if (wc.opcode == IBV_WC_RECV) {
        EXPECT_EQ(wc.qp_num, b->qp_num);
        EXPECT_EQ(wc.byte_len, 200u);
        EXPECT_EQ(buf_[65536 + (wc.wr_id - done) * 256], static_cast<uint8_t>(wc.wr_id));
      }
    }
  }
  const Counters after = DeviceCounters();
  // Every request and every ACK crossed workers.
  EXPECT_GE(after.handoff_pkts - before.handoff_pkts, static_cast<uint64_t>(kMsgs));
  EXPECT_EQ(after.handoff_drop, before.handoff_drop);
  EXPECT_EQ(after.unknown_qp, before.unknown_qp);
  for (ibv_qp* q : {a, b}) EXPECT_EQ(ibv_destroy_qp(q), 0);
  qps_.clear();
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
}

// Four receivers on one SRQ and one receive CQ, two on each worker, fed by
// two application threads at once: every message lands exactly once.
TEST_F(Workers, OneCqAndOneSrqSharedByQpsOfBothWorkers) {
  constexpr int kSenders = 4, kPerSender = 400, kSlot = 64;
  ibv_cq* rcq = ibv_create_cq(ctx_, 4096, nullptr, nullptr, 0);
  ASSERT_NE(rcq, nullptr);
  ibv_srq_init_attr sa{};
  sa.attr.max_wr = 1024;
  sa.attr.max_sge = 1;
  ibv_srq* srq = ibv_create_srq(pd_, &sa);
  ASSERT_NE(srq, nullptr);
  std::vector<ibv_cq*> scqs;
  std::vector<ibv_qp*> senders, receivers;
  int on_worker[2] = {0, 0};
  for (int i = 0; i < kSenders; ++i) {
    scqs.push_back(ibv_create_cq(ctx_, 256, nullptr, nullptr, 0));
    ASSERT_NE(scqs.back(), nullptr);
    ibv_qp_init_attr a{};
    a.send_cq = scqs.back();
    a.recv_cq = rcq;
    a.srq = srq;
    a.cap.max_send_wr = 64;
    a.cap.max_send_sge = 1;
    a.qp_type = IBV_QPT_RC;
    // QPs alternate between the workers: receiver first on even rounds,
    // sender first on odd ones, so that two receivers land on each.
    if (i % 2 == 1) senders.push_back(CreateQp(scqs.back(), scqs.back(), 64));
    receivers.push_back(ibv_create_qp(pd_, &a));
    ASSERT_NE(receivers.back(), nullptr);
    ++on_worker[WorkerOf(receivers.back())];
    if (i % 2 == 0) senders.push_back(CreateQp(scqs.back(), scqs.back(), 64));
    ASSERT_NE(senders.back(), nullptr);
    Connect(senders.back(), receivers.back());
  }
  EXPECT_EQ(on_worker[0], 2);
  EXPECT_EQ(on_worker[1], 2);
  // The SRQ holds one WQE per message (1600 > 1024: posted in two rounds).
  auto post_srq = [&](int from, int n) {
    for (int i = from; i < from + n; ++i) ASSERT_EQ(PostSrqRecv(srq, i, 262144 + (i % 1024) * kSlot, kSlot), 0);
  };
  post_srq(0, 1000);
  std::atomic<int> failures{0};
  auto send_all = [&](int first, int count) {
    for (int s = first; s < first + count; ++s) {
      for (int done = 0; done < kPerSender;) {
        int posted = 0;
        for (; posted < 32 && done + posted < kPerSender; ++posted) {
          if (PostSend(senders[s], s * kPerSender + done + posted, s * kSlot, 32) != 0) ++failures;
        }
        auto wcs = Poll(scqs[s], posted);
        if (wcs.size() != static_cast<size_t>(posted)) ++failures;
        for (const ibv_wc& wc : wcs) failures += wc.status != IBV_WC_SUCCESS;
        done += posted;
      }
    }
  };
  std::thread t1(send_all, 0, 2), t2(send_all, 2, 2);
  std::vector<uint64_t> seen;
  std::vector<int> per_qp(kSenders, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int refilled = 1000;
  while (seen.size() < kSenders * kPerSender && std::chrono::steady_clock::now() < deadline) {
    ibv_wc wc[16];
    const int k = ibv_poll_cq(rcq, 16, wc);
    ASSERT_GE(k, 0);
    for (int i = 0; i < k; ++i) {
      EXPECT_EQ(wc[i].status, IBV_WC_SUCCESS);
      seen.push_back(wc[i].wr_id);
      for (int q = 0; q < kSenders; ++q) per_qp[q] += wc[i].qp_num == receivers[q]->qp_num;
    }
    if (refilled < kSenders * kPerSender && static_cast<int>(seen.size()) > refilled - 900) {
      const int n = std::min(kSenders * kPerSender - refilled, 100);
      post_srq(refilled, n);
      refilled += n;
    }
    if (k == 0) usleep(1);
  }
  t1.join();
  t2.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_EQ(seen.size(), static_cast<size_t>(kSenders * kPerSender));
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(std::adjacent_find(seen.begin(), seen.end()), seen.end()) << "an SRQ WQE completed twice";
  for (int q = 0; q < kSenders; ++q) EXPECT_EQ(per_qp[q], kPerSender) << "receiver " << q;
  for (ibv_qp* q : receivers) EXPECT_EQ(ibv_destroy_qp(q), 0);
  for (ibv_qp* q : senders) EXPECT_EQ(ibv_destroy_qp(q), 0);
  qps_.clear();
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
  for (ibv_cq* c : scqs) EXPECT_EQ(ibv_destroy_cq(c), 0);
  EXPECT_EQ(ibv_destroy_cq(rcq), 0);
}

// Two responders, one on each worker, execute FETCH_AND_ADDs on the same
// word at the same time: none is lost.
TEST_F(Workers, AtomicsOnOneWordFromResponderQpsOfBothWorkers) {
  alignas(8) static uint64_t word = 0;
  word = 0;
  ibv_mr* target = ibv_reg_mr(pd_, &word, sizeof(word),
                              IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_READ);
  ASSERT_NE(target, nullptr);
  ibv_cq* cq0 = ibv_create_cq(ctx_, 256, nullptr, nullptr, 0);
  ibv_cq* cq1 = ibv_create_cq(ctx_, 256, nullptr, nullptr, 0);
  ASSERT_NE(cq0, nullptr);
  ASSERT_NE(cq1, nullptr);
  // QPs alternate between the workers: r0 (w0) ← q0 (w1), r1 (w1) ← q1 (w0).
  ibv_qp* r0 = CreateQp(cq0, cq0);
  ibv_qp* q0 = CreateQp(cq0, cq0);
  ibv_qp* q1 = CreateQp(cq1, cq1);
  ibv_qp* r1 = CreateQp(cq1, cq1);
  for (ibv_qp* q : {r0, q0, q1, r1}) ASSERT_NE(q, nullptr);
  ASSERT_NE(WorkerOf(r0), WorkerOf(r1));
  Connect(q0, r0);
  Connect(q1, r1);
  for (ibv_qp* r : {r0, r1}) {
    ibv_qp_attr at{};
    at.qp_access_flags = IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_REMOTE_READ;
    ASSERT_EQ(ibv_modify_qp(r, &at, IBV_QP_ACCESS_FLAGS), 0);
  }
  constexpr int kAdds = 2000;
  std::atomic<int> failures{0};
  auto adder = [&](ibv_qp* qp, ibv_cq* cq, size_t off) {
    for (int done = 0; done < kAdds; done += 16) {
      for (int i = 0; i < 16; ++i) {
        ibv_sge s{reinterpret_cast<uint64_t>(buf_.data() + off), 8, mr_->lkey};
        ibv_send_wr wr{};
        wr.wr_id = done + i;
        wr.sg_list = &s;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.atomic.remote_addr = reinterpret_cast<uint64_t>(&word);
        wr.wr.atomic.compare_add = 1;
        wr.wr.atomic.rkey = target->rkey;
        ibv_send_wr* bad = nullptr;
        if (ibv_post_send(qp, &wr, &bad) != 0) ++failures;
      }
      auto wcs = Poll(cq, 16);
      if (wcs.size() != 16u) ++failures;
      for (const ibv_wc& wc : wcs) failures += wc.status != IBV_WC_SUCCESS;
    }
  };
  std::thread t0(adder, q0, cq0, 0), t1(adder, q1, cq1, 64);
  t0.join();
  t1.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(__atomic_load_n(&word, __ATOMIC_SEQ_CST), 2u * kAdds);
  for (ibv_qp* q : qps_) EXPECT_EQ(ibv_destroy_qp(q), 0);
  qps_.clear();
  EXPECT_EQ(ibv_destroy_cq(cq0), 0);
  EXPECT_EQ(ibv_destroy_cq(cq1), 0);
  EXPECT_EQ(ibv_dereg_mr(target), 0);
}

}  // namespace
}  // namespace droce::test
