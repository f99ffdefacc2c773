// Completions and async events through the provider, with real traffic on
// droce0's loopback link: completion channels and arming, missed-event
// reporting, CQ moderation, a full CQ, extended CQs and resize, several
// threads polling one CQ, every async event the transport raises (including
// those for rings a hostile program corrupts), and the destroy/ack rules.
#include "loopback_fixture.h"

namespace droce::test {
namespace {

TEST_F(Loopback, CompletionChannelDeliversEventsAndHonoursNonblock) {
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  // Nothing pending: a non-blocking channel fd reports EAGAIN.
  const int fl = fcntl(channel_->fd, F_GETFL);
  ASSERT_EQ(fcntl(channel_->fd, F_SETFL, fl | O_NONBLOCK), 0);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  errno = 0;
  EXPECT_EQ(ibv_get_cq_event(channel_, &ev_cq, &ev_ctx), -1);
  EXPECT_EQ(errno, EAGAIN);
  ASSERT_EQ(fcntl(channel_->fd, F_SETFL, fl), 0);

  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(ibv_req_notify_cq(rcq_, 0), 0);
    ASSERT_EQ(PostRecv(b, i, 4096, 64), 0);
    ASSERT_EQ(PostSend(a, i, 0, 64), 0);
    pollfd p{channel_->fd, POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 10000), 1);  // readable while an event is pending
    ASSERT_EQ(ibv_get_cq_event(channel_, &ev_cq, &ev_ctx), 0);
    EXPECT_EQ(ev_cq, rcq_);
    EXPECT_EQ(ev_ctx, this);
    ibv_ack_cq_events(ev_cq, 1);
    EXPECT_EQ(Poll(rcq_, 1).size(), 1u);
    EXPECT_EQ(Poll(scq_, 1).size(), 1u);
  }
  // Arming is one-shot: with no re-arm, a completion raises no event.
  ASSERT_EQ(PostRecv(b, 99, 4096, 64), 0);
  ASSERT_EQ(PostSend(a, 99, 0, 64), 0);
  EXPECT_EQ(Poll(rcq_, 1).size(), 1u);
  pollfd p{channel_->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 50), 0);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);
}

TEST_F(Loopback, ReqNotifyExtensionReportsMissedEvents) {
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  EXPECT_EQ(droce_req_notify_cq(rcq_, 0), -EINVAL);
  EXPECT_EQ(droce_req_notify_cq(rcq_, DROCE_CQ_SOLICITED | DROCE_CQ_NEXT_COMP), -EINVAL);
  EXPECT_EQ(droce_req_notify_cq(rcq_, 8 | DROCE_CQ_NEXT_COMP), -EINVAL);
  EXPECT_EQ(droce_req_notify_cq(rcq_, DROCE_CQ_NEXT_COMP | DROCE_CQ_REPORT_MISSED_EVENTS), 0);
  ASSERT_EQ(PostRecv(b, 1, 4096, 64), 0);
  ASSERT_EQ(PostSend(a, 1, 0, 64), 0);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(channel_, &ev_cq, &ev_ctx), 0);
  ibv_ack_cq_events(ev_cq, 1);
  // The completion is still in the CQ: arming again must report it.
  EXPECT_GT(droce_req_notify_cq(rcq_, DROCE_CQ_NEXT_COMP | DROCE_CQ_REPORT_MISSED_EVENTS), 0);
  EXPECT_EQ(Poll(rcq_, 1).size(), 1u);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);
  // Consume the event the second arm may raise later, so destroy can finish.
  fcntl(channel_->fd, F_SETFL, fcntl(channel_->fd, F_GETFL) | O_NONBLOCK);
  while (ibv_get_cq_event(channel_, &ev_cq, &ev_ctx) == 0) ibv_ack_cq_events(ev_cq, 1);
}

TEST_F(Loopback, FullCqRaisesCqErrAndMovesTheQpToError) {
  ibv_cq* tiny = ibv_create_cq(ctx_, 2, nullptr, nullptr, 0);
  ASSERT_NE(tiny, nullptr);
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, tiny);
  Connect(a, b);
  const int cap = tiny->cqe;
  for (int i = 0; i < cap + 1; ++i) ASSERT_EQ(PostRecv(b, i, 4096, 64), 0);
  for (int i = 0; i < cap + 1; ++i) ASSERT_EQ(PostSend(a, i, 0, 8), 0);
  pollfd p{ctx_->async_fd, POLLIN, 0};
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  EXPECT_EQ(ev.event_type, IBV_EVENT_CQ_ERR);
  EXPECT_EQ(ev.element.cq, tiny);
  ibv_ack_async_event(&ev);
  // The QP whose completion did not fit goes to ERR with QP_FATAL.
  const AsyncEvent fatal = NextAsyncEvent();
  EXPECT_EQ(fatal.event_type, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(fatal.element.qp, b);
  // Nothing already in the CQ was lost.
  auto r = Poll(tiny, cap);
  EXPECT_EQ(static_cast<int>(r.size()), cap);
  for (auto& w : r) EXPECT_EQ(w.status, IBV_WC_SUCCESS);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(b, &q, IBV_QP_STATE, &qi), 0);
  EXPECT_EQ(q.qp_state, IBV_QPS_ERR);
  Poll(scq_, cap + 1);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  qps_.pop_back();
  EXPECT_EQ(ibv_destroy_cq(tiny), 0);
}

TEST_F(Loopback, RemoteAccessViolationRaisesAccessErrOnTheResponder) {
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  // The QP allows RDMA WRITE (without that the request itself is invalid);
  // the MR behind the rkey does not.
  GrantRemote(b, IBV_ACCESS_REMOTE_WRITE);
  ibv_sge s{reinterpret_cast<uint64_t>(buf_.data()), 64, mr_->lkey};
  ibv_send_wr wr{};
  wr.wr_id = 1;
  wr.sg_list = &s;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(buf_.data() + 4096);
  wr.wr.rdma.rkey = mr_->rkey;  // registered without REMOTE_WRITE
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(a, &wr, &bad), 0);
  auto c = Poll(scq_, 1);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(c[0].status, IBV_WC_REM_ACCESS_ERR);
  const AsyncEvent ev = NextAsyncEvent();
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_ACCESS_ERR);
  EXPECT_EQ(ev.element.qp, b);
  EXPECT_EQ(State(b), IBV_QPS_ERR);
  EXPECT_EQ(State(a), IBV_QPS_ERR);
}

TEST_F(Loopback, FirstPacketInRtrRaisesCommEstOnce) {
  // IBA 11.6.3.1: a QP in RTR that receives its first packet raises
  // COMM_EST (connection managers move it to RTS on that event).
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  ToInit(a);
  ToInit(b);
  ToRtr(a, b->qp_num);
  ToRtr(b, a->qp_num);
  ToRts(a);  // b stays in RTR
  for (int i = 0; i < 3; ++i) ASSERT_EQ(PostRecv(b, i, 4096 + i * 64, 64), 0);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(PostSend(a, i, 0, 64), 0);
  EXPECT_EQ(Poll(rcq_, 3).size(), 3u);
  EXPECT_EQ(Poll(scq_, 3).size(), 3u);
  const AsyncEvent ev = NextAsyncEvent();
  EXPECT_EQ(ev.event_type, IBV_EVENT_COMM_EST);
  EXPECT_EQ(ev.element.qp, b);
  EXPECT_EQ(NextAsyncEvent(50).event_type, -1) << "once per connection, not per packet";
  EXPECT_EQ(State(b), IBV_QPS_RTR);
}

TEST_F(Loopback, SrqLimitAndLastWqeReached) {
  ibv_srq* srq = CreateSrq(16);
  ASSERT_NE(srq, nullptr);
  ibv_qp* r = CreateSrqQp(srq);
  ASSERT_NE(r, nullptr);
  ibv_qp* s = CreateQp(scq_, scq_);
  Connect(s, r);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(PostSrqRecv(srq, 100 + i, 8192 + i * 128, 128), 0);
  ibv_srq_attr lim{};
  lim.srq_limit = 5;
  ASSERT_EQ(ibv_modify_srq(srq, &lim, IBV_SRQ_LIMIT), 0);
  // 8 posted, limit 5: the 4th receive leaves 4 < 5 and fires the event once.
  for (int i = 0; i < 3; ++i) ASSERT_EQ(PostSend(s, i, 0, 32), 0);
  EXPECT_EQ(Poll(rcq_, 3).size(), 3u);
  EXPECT_EQ(NextAsyncEvent(100).event_type, -1) << "5 WQEs left: not below the limit yet";
  for (int i = 3; i < 6; ++i) ASSERT_EQ(PostSend(s, i, 0, 32), 0);
  EXPECT_EQ(Poll(rcq_, 3).size(), 3u);
  AsyncEvent ev = NextAsyncEvent();
  EXPECT_EQ(ev.event_type, IBV_EVENT_SRQ_LIMIT_REACHED);
  EXPECT_EQ(ev.element.srq, srq);
  EXPECT_EQ(NextAsyncEvent(50).event_type, -1) << "the limit disarms when it fires";
  ibv_srq_attr q{};
  ASSERT_EQ(ibv_query_srq(srq, &q), 0);
  EXPECT_EQ(q.srq_limit, 0u);
  EXPECT_EQ(Poll(scq_, 6).size(), 6u);
  // A QP on an SRQ that enters ERR reports its last WQE (IBA 11.6.3.1).
  ibv_qp_attr err{};
  err.qp_state = IBV_QPS_ERR;
  ASSERT_EQ(ibv_modify_qp(r, &err, IBV_QP_STATE), 0);
  ev = NextAsyncEvent();
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_LAST_WQE_REACHED);
  EXPECT_EQ(ev.element.qp, r);
  EXPECT_EQ(ibv_destroy_qp(r), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

TEST_F(Loopback, CorruptSrqRingRaisesSrqErrAndFailsItsQps) {
  // A program that scribbles on the shared SRQ ring (a producer index far
  // beyond the capacity) breaks the SRQ, not the engine: IBV_EVENT_SRQ_ERR,
  // and the QPs on it go to ERR and report their last WQE.
  ibv_srq* srq = CreateSrq(8);
  ASSERT_NE(srq, nullptr);
  ibv_qp* r = CreateSrqQp(srq);
  ASSERT_NE(r, nullptr);
  ibv_qp* s = CreateQp(scq_, scq_);
  Connect(s, r);
  ASSERT_EQ(PostSrqRecv(srq, 1, 8192, 128), 0);
  ASSERT_EQ(PostSend(s, 1, 0, 32), 0);
  ASSERT_EQ(Poll(rcq_, 1).size(), 1u);
  ASSERT_EQ(Poll(scq_, 1).size(), 1u);

  droce::provider::Srq* ps = droce::provider::to_srq(srq);
  ps->handle.ring.publish_prod(ps->prod + 1000);
  ASSERT_EQ(PostSend(s, 2, 0, 32), 0);
  bool srq_err = false, last_wqe = false;
  for (int i = 0; i < 2; ++i) {
    const AsyncEvent ev = NextAsyncEvent();
    if (ev.event_type == IBV_EVENT_SRQ_ERR && ev.element.srq == srq) srq_err = true;
    if (ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED && ev.element.qp == r) last_wqe = true;
  }
  EXPECT_TRUE(srq_err);
  EXPECT_TRUE(last_wqe);
  EXPECT_EQ(State(r), IBV_QPS_ERR);
  EXPECT_EQ(ibv_destroy_qp(r), 0);
  EXPECT_EQ(ibv_destroy_srq(srq), 0);
}

TEST_F(Loopback, OneCqSharedByManyQpsPolledByManyThreads) {
  // Four QP pairs complete into one send CQ and one receive CQ, and four
  // threads poll each CQ at once (ibv_poll_cq is thread-safe per libibverbs):
  // every completion is seen exactly once, with the right QP.
  constexpr int kPairs = 4, kMsgs = 2000, kThreads = 4;
  ibv_cq* scq = ibv_create_cq(ctx_, 4096, nullptr, nullptr, 0);
  ibv_cq* rcq = ibv_create_cq(ctx_, 4096, nullptr, nullptr, 0);
  ASSERT_NE(scq, nullptr);
  ASSERT_NE(rcq, nullptr);
  std::vector<ibv_qp*> senders, receivers;
  for (int p = 0; p < kPairs; ++p) {
    senders.push_back(CreateQp(scq, scq, 256));
    receivers.push_back(CreateQp(scq, rcq, 256));
    ASSERT_NE(senders.back(), nullptr);
    ASSERT_NE(receivers.back(), nullptr);
    Connect(senders.back(), receivers.back());
  }
  std::vector<std::atomic<int>> seen(2 * kPairs * kMsgs);
  std::atomic<int> total{0}, bad{0};
  auto index_of = [&](const ibv_wc& wc) {
    // wr_id = pair * kMsgs + i; receives are offset by kPairs * kMsgs.
    return static_cast<int>(wc.wr_id);
  };
  std::atomic<bool> stop{false};
  auto poller = [&](ibv_cq* cq, bool recv) {
    ibv_wc wc[8];
    while (!stop.load()) {
      const int k = ibv_poll_cq(cq, 8, wc);
      if (k < 0) ++bad;
      for (int i = 0; i < k; ++i) {
        const int idx = index_of(wc[i]);
        const int pair = (idx % (kPairs * kMsgs)) / kMsgs;
        const ibv_qp* want = recv ? receivers[pair] : senders[pair];
        if (wc[i].status != IBV_WC_SUCCESS || idx < 0 || idx >= 2 * kPairs * kMsgs ||
            (idx >= kPairs * kMsgs) != recv || wc[i].qp_num != want->qp_num) {
          ++bad;
          continue;
        }
        seen[idx].fetch_add(1);
        total.fetch_add(1);
      }
      if (k == 0) std::this_thread::yield();
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back(poller, scq, false);
    threads.emplace_back(poller, rcq, true);
  }
  // Keep at most 128 messages in flight per pair (the queues hold 256).
  for (int base = 0; base < kMsgs; base += 128) {
    for (int p = 0; p < kPairs; ++p) {
      for (int i = base; i < base + 128 && i < kMsgs; ++i) {
        ibv_sge sg{reinterpret_cast<uint64_t>(buf_.data() + 65536 + p * 4096), 64, mr_->lkey};
        ibv_recv_wr rw{};
        rw.wr_id = kPairs * kMsgs + p * kMsgs + i;
        rw.sg_list = &sg;
        rw.num_sge = 1;
        ibv_recv_wr* rbad = nullptr;
        ASSERT_EQ(ibv_post_recv(receivers[p], &rw, &rbad), 0);
        ASSERT_EQ(PostSend(senders[p], p * kMsgs + i, 0, 16), 0);
      }
    }
    const int want = 2 * kPairs * std::min(base + 128, kMsgs);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (total.load() < want && std::chrono::steady_clock::now() < deadline) usleep(100);
    ASSERT_EQ(total.load(), want) << "completions missing after batch " << base;
  }
  stop = true;
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
  int dup = 0;
  for (auto& c : seen) dup += c.load() != 1;
  EXPECT_EQ(dup, 0) << "completions seen zero or several times";
  for (auto* list : {&senders, &receivers}) {
    for (ibv_qp* q : *list) {
      std::erase(qps_, q);
      EXPECT_EQ(ibv_destroy_qp(q), 0);
    }
  }
  EXPECT_EQ(ibv_destroy_cq(scq), 0);
  EXPECT_EQ(ibv_destroy_cq(rcq), 0);
}

TEST_F(Loopback, CorruptSendOrReceiveRingIsAFatalQpErrorNotAFlood) {
  // A producer index far ahead of what the ring holds (a program writing the
  // shared rings behind the provider's back): the QP goes to ERR with
  // QP_FATAL; none of the bogus entries is executed, flushed or completed.
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  droce::provider::Qp* pa = droce::provider::to_qp(a);
  pa->handle.sq.publish_prod(pa->sq_prod + 100000);
  droce::provider::to_ctx(ctx_)->s->engine->Doorbell(pa->handle);
  AsyncEvent ev = NextAsyncEvent();
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(ev.element.qp, a);
  EXPECT_EQ(State(a), IBV_QPS_ERR);
  EXPECT_TRUE(Poll(scq_, 1, std::chrono::milliseconds(200)).empty()) << "nothing completes for a corrupt ring";

  // The receive side: d's RQ index is corrupted, then a request arrives.
  ibv_qp* c = CreateQp(scq_, scq_);
  ibv_qp* d = CreateQp(scq_, rcq_);
  Connect(c, d);
  droce::provider::Qp* pd = droce::provider::to_qp(d);
  pd->handle.rq.publish_prod(pd->rq_prod + 100000);
  ASSERT_EQ(PostSend(c, 1, 0, 16), 0);
  ev = NextAsyncEvent();
  EXPECT_EQ(ev.event_type, IBV_EVENT_QP_FATAL);
  EXPECT_EQ(ev.element.qp, d);
  EXPECT_EQ(State(d), IBV_QPS_ERR);
  EXPECT_TRUE(Poll(rcq_, 1, std::chrono::milliseconds(200)).empty());
  EXPECT_EQ(State(b), IBV_QPS_RTS) << "other QPs are not affected";
}

TEST_F(Loopback, ModifyCqModeratesCompletionEvents) {
  ibv_device_attr_ex dx{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &dx), 0);
  EXPECT_EQ(dx.cq_mod_caps.max_cq_count, 65535);
  EXPECT_EQ(dx.cq_mod_caps.max_cq_period, 65535);
  ibv_modify_cq_attr bad{};
  bad.attr_mask = 2;
  EXPECT_EQ(ibv_modify_cq(rcq_, &bad), EINVAL);

  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  ibv_modify_cq_attr m{};
  m.attr_mask = IBV_CQ_ATTR_MODERATE;
  m.moderate.cq_count = 4;
  m.moderate.cq_period = 0;
  ASSERT_EQ(ibv_modify_cq(rcq_, &m), 0);
  for (int i = 0; i < 8; ++i) ASSERT_EQ(PostRecv(b, i, 4096 + i * 64, 64), 0);
  ASSERT_EQ(ibv_req_notify_cq(rcq_, 0), 0);
  // Three completions: held back.
  for (int i = 0; i < 3; ++i) ASSERT_EQ(PostSend(a, i, 0, 16), 0);
  EXPECT_EQ(Poll(scq_, 3).size(), 3u);
  pollfd p{channel_->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 100), 0) << "3 of 4 completions";
  ASSERT_EQ(PostSend(a, 3, 0, 16), 0);
  ASSERT_EQ(poll(&p, 1, 10000), 1) << "the 4th releases the event";
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(channel_, &ev_cq, &ev_ctx), 0);
  ibv_ack_cq_events(ev_cq, 1);
  EXPECT_EQ(Poll(rcq_, 4).size(), 4u);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);

  // A period: one completion, far below the count, is reported when the
  // period runs out.
  m.moderate.cq_count = 1000;
  m.moderate.cq_period = 2000;  // 2 ms
  ASSERT_EQ(ibv_modify_cq(rcq_, &m), 0);
  ASSERT_EQ(ibv_req_notify_cq(rcq_, 0), 0);
  ASSERT_EQ(PostSend(a, 4, 0, 16), 0);
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  ASSERT_EQ(ibv_get_cq_event(channel_, &ev_cq, &ev_ctx), 0);
  ibv_ack_cq_events(ev_cq, 1);
  EXPECT_EQ(Poll(rcq_, 1).size(), 1u);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);

  // Count 1, period 0: every completion again.
  m.moderate.cq_count = 1;
  m.moderate.cq_period = 0;
  ASSERT_EQ(ibv_modify_cq(rcq_, &m), 0);
  ASSERT_EQ(ibv_req_notify_cq(rcq_, 0), 0);
  ASSERT_EQ(PostSend(a, 5, 0, 16), 0);
  ASSERT_EQ(poll(&p, 1, 10000), 1);
  ASSERT_EQ(ibv_get_cq_event(channel_, &ev_cq, &ev_ctx), 0);
  ibv_ack_cq_events(ev_cq, 1);
  EXPECT_EQ(Poll(rcq_, 1).size(), 1u);
  EXPECT_EQ(Poll(scq_, 1).size(), 1u);
}

// The extended CQ: start/next/end polling, the fields asked for, completion
// timestamps that grow; ibv_resize_cq keeps completions not yet polled.
TEST_F(Loopback, ExtendedCqPollingTimestampsAndResize) {
  ibv_cq_init_attr_ex ca{};
  ca.cqe = 8;
  ca.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
  ibv_cq_ex* cqx = ibv_create_cq_ex(ctx_, &ca);
  ASSERT_NE(cqx, nullptr);
  ibv_cq* cq = ibv_cq_ex_to_cq(cqx);
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, cq);
  Connect(a, b);
  ibv_poll_cq_attr pa{};
  EXPECT_EQ(ibv_start_poll(cqx, &pa), ENOENT);  // empty: no ibv_end_poll
  for (int i = 0; i < 6; ++i) ASSERT_EQ(PostRecv(b, 100 + i, 4096 + i * 128, 128), 0);
  for (int i = 0; i < 3; ++i) ASSERT_EQ(PostSend(a, i, 0, 10 + i), 0);
  ASSERT_EQ(Poll(scq_, 3).size(), 3u);
  // Grow the CQ while three completions wait in it; none may be lost.
  usleep(20000);
  ASSERT_EQ(ibv_resize_cq(cq, 100), 0);
  EXPECT_GE(cq->cqe, 100);
  for (int i = 3; i < 6; ++i) ASSERT_EQ(PostSend(a, i, 0, 10 + i), 0);
  ASSERT_EQ(Poll(scq_, 3).size(), 3u);
  usleep(20000);
  std::vector<uint64_t> ids;
  uint64_t last_ts = 0;
  int rc = ibv_start_poll(cqx, &pa);
  ASSERT_EQ(rc, 0);
  while (rc == 0) {
    EXPECT_EQ(cqx->status, IBV_WC_SUCCESS);
    EXPECT_EQ(ibv_wc_read_opcode(cqx), IBV_WC_RECV);
    EXPECT_EQ(ibv_wc_read_qp_num(cqx), b->qp_num);
    EXPECT_EQ(ibv_wc_read_byte_len(cqx), 10 + (cqx->wr_id - 100));
    const uint64_t ts = ibv_wc_read_completion_ts(cqx);
    EXPECT_GE(ts, last_ts);
    last_ts = ts;
    ids.push_back(cqx->wr_id);
    rc = ibv_next_poll(cqx);
  }
  EXPECT_EQ(rc, ENOENT);
  ibv_end_poll(cqx);
  ASSERT_EQ(ids.size(), 6u);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(ids[i], 100u + i);
  ibv_device_attr_ex dx{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &dx), 0);
  EXPECT_EQ(dx.hca_core_clock, 1000000u);
  // ibv_query_rt_values_ex reads the same clock: at or after the last
  // completion's timestamp; bits it does not know come back cleared.
  ibv_values_ex v{};
  v.comp_mask = IBV_VALUES_MASK_RAW_CLOCK | 0x80;
  ASSERT_EQ(ibv_query_rt_values_ex(ctx_, &v), 0);
  EXPECT_EQ(v.comp_mask, static_cast<uint32_t>(IBV_VALUES_MASK_RAW_CLOCK));
  EXPECT_EQ(v.raw_clock.tv_sec, 0);
  EXPECT_GE(static_cast<uint64_t>(v.raw_clock.tv_nsec), last_ts);
  // Shrinking below what is pending is refused.
  for (int i = 0; i < 4; ++i) ASSERT_EQ(PostRecv(b, 200 + i, 4096, 128), 0);
  for (int i = 0; i < 4; ++i) ASSERT_EQ(PostSend(a, 10 + i, 0, 8), 0);
  ASSERT_EQ(Poll(scq_, 4).size(), 4u);
  usleep(20000);
  EXPECT_EQ(ibv_resize_cq(cq, 2), EINVAL);
  Drain(cq);
  EXPECT_EQ(ibv_destroy_qp(b), 0);
  qps_.pop_back();
  EXPECT_EQ(ibv_destroy_cq(cq), 0);
  // Unsupported extended fields are refused at creation.
  ca.wc_flags = IBV_WC_EX_WITH_FLOW_TAG;
  errno = 0;
  EXPECT_EQ(ibv_create_cq_ex(ctx_, &ca), nullptr);
  EXPECT_EQ(errno, EOPNOTSUPP);
}

// ibv_destroy_qp waits for the async events of the QP that the application
// read but did not acknowledge; events never read are dropped (the kernel's
// and libibverbs' rule).
TEST_F(Loopback, DestroyQpWaitsForReadButUnackedEvents) {
  auto drain_to_sqd = [&](ibv_qp* q) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_SQD;
    attr.en_sqd_async_notify = 1;
    ASSERT_EQ(ibv_modify_qp(q, &attr, IBV_QP_STATE | IBV_QP_EN_SQD_ASYNC_NOTIFY), 0);
    pollfd p{ctx_->async_fd, POLLIN, 0};
    ASSERT_EQ(poll(&p, 1, 5000), 1);
  };
  ibv_qp* a = CreateQp(scq_, scq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  Connect(a, b);
  drain_to_sqd(a);  // an SQ_DRAINED event is queued, never read
  EXPECT_EQ(ibv_destroy_qp(a), 0);
  std::erase(qps_, a);
  ibv_qp* c = CreateQp(scq_, scq_);
  ibv_qp* d = CreateQp(scq_, rcq_);
  Connect(c, d);
  drain_to_sqd(c);
  ibv_async_event ev{};
  ASSERT_EQ(ibv_get_async_event(ctx_, &ev), 0);
  ASSERT_EQ(ev.element.qp, c);
  std::atomic<bool> acked{false};
  std::thread acker([&] {
    usleep(100000);
    acked = true;
    ibv_ack_async_event(&ev);
  });
  EXPECT_EQ(ibv_destroy_qp(c), 0);
  EXPECT_TRUE(acked.load());  // it returned only after the acknowledgement
  acker.join();
  std::erase(qps_, c);
}

// The same rule for completion events (the kernel's ib_uverbs_release_ucq):
// ibv_destroy_cq waits for the events of the CQ that ibv_get_cq_event
// returned and that are not acknowledged; an event queued on the channel and
// never read is dropped, and the channel stops reporting it. It used to be
// counted when queued, and destroy waited for an acknowledgement that could
// never come (UCX and Open MPI hung in MPI_Finalize).
TEST_F(Loopback, DestroyCqDropsUnreadCompletionEvents) {
  // A hang is the failure: end the test rather than the suite's timeout.
  std::atomic<bool> done{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 100 && !done; ++i) usleep(50000);
    if (!done) {
      std::fprintf(stderr, "ibv_destroy_cq did not return\n");
      std::_Exit(1);
    }
  });
  auto raise_event = [&](ibv_cq* cq) {
    ibv_qp* a = CreateQp(scq_, scq_);
    ibv_qp* b = CreateQp(scq_, cq);
    Connect(a, b);
    EXPECT_EQ(ibv_req_notify_cq(cq, 0), 0);
    EXPECT_EQ(PostRecv(b, 1, 4096, 64), 0);
    EXPECT_EQ(PostSend(a, 1, 0, 64), 0);
    pollfd p{channel_->fd, POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, 5000), 1);
    EXPECT_EQ(Poll(cq, 1).size(), 1u);
    EXPECT_EQ(Poll(scq_, 1).size(), 1u);
    for (ibv_qp* q : {a, b}) {
      EXPECT_EQ(ibv_destroy_qp(q), 0);
      std::erase(qps_, q);
    }
  };
  ibv_cq* unread = ibv_create_cq(ctx_, 16, nullptr, channel_, 0);
  ASSERT_NE(unread, nullptr);
  raise_event(unread);
  EXPECT_EQ(ibv_destroy_cq(unread), 0);
  pollfd p{channel_->fd, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 0), 0);  // the dropped event is not reported

  // Read but not acknowledged: destroy waits for the acknowledgement.
  ibv_cq* read = ibv_create_cq(ctx_, 16, nullptr, channel_, 0);
  ASSERT_NE(read, nullptr);
  raise_event(read);
  ibv_cq* ev_cq = nullptr;
  void* ev_ctx = nullptr;
  ASSERT_EQ(ibv_get_cq_event(channel_, &ev_cq, &ev_ctx), 0);
  ASSERT_EQ(ev_cq, read);
  std::atomic<bool> acked{false};
  std::thread acker([&] {
    usleep(100000);
    acked = true;
    ibv_ack_cq_events(ev_cq, 1);
  });
  EXPECT_EQ(ibv_destroy_cq(read), 0);
  EXPECT_TRUE(acked.load());  // it returned only after the acknowledgement
  acker.join();
  done = true;
  watchdog.join();
}

}  // namespace
}  // namespace droce::test
