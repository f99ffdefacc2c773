// Packet pacing through the verbs API (transport/pacer.h): the caps
// ibv_query_device_ex announces, IBV_QP_RATE_LIMIT in ibv_modify_qp and
// ibv_query_qp, ibv_modify_qp_rate_limit, and a paced transfer that cannot
// finish sooner than its rate allows. The rate's accuracy and spacing are
// measured over memif by bench/pacing.sh, not asserted here.
#include <chrono>
#include <cstdlib>

#include "loopback_fixture.h"

namespace droce::test {
namespace {

using Pacing = Loopback;

TEST_F(Pacing, CapsAnnounceRcUcUd) {
  ibv_device_attr_ex a{};
  ASSERT_EQ(ibv_query_device_ex(ctx_, nullptr, &a), 0);
  EXPECT_EQ(a.packet_pacing_caps.qp_rate_limit_min, 1u);
  EXPECT_EQ(a.packet_pacing_caps.qp_rate_limit_max, 100'000'000u);
  EXPECT_EQ(a.packet_pacing_caps.supported_qpts, (1u << IBV_QPT_RC) | (1u << IBV_QPT_UC) | (1u << IBV_QPT_UD));
}

TEST_F(Pacing, RateLimitInModifyAndQuery) {
  ibv_qp* a = CreateQp(scq_, rcq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ToInit(a);
  ToInit(b);
  ToRtr(a, b->qp_num);
  ToRtr(b, a->qp_num);
  // RTR to RTS with a rate, as perftest's packet pacing does.
  ibv_qp_attr m{};
  m.qp_state = IBV_QPS_RTS;
  m.timeout = 14;
  m.retry_cnt = 7;
  m.rnr_retry = 7;
  m.sq_psn = 100;
  m.max_rd_atomic = 1;
  m.rate_limit = 50'000;  // kbps
  ASSERT_EQ(ibv_modify_qp(a, &m, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                     IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_RATE_LIMIT),
            0);
  ToRts(b);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(a, &q, IBV_QP_RATE_LIMIT, &qi), 0);
  EXPECT_EQ(q.rate_limit, 50'000u);
  // RTS to RTS changes it; beyond the announced maximum is EINVAL; only in
  // the transitions that take it (not INIT to INIT).
  m = {};
  m.rate_limit = 100'000'001;
  EXPECT_EQ(ibv_modify_qp(a, &m, IBV_QP_RATE_LIMIT), EINVAL);
  m.rate_limit = 0;
  EXPECT_EQ(ibv_modify_qp(a, &m, IBV_QP_RATE_LIMIT), 0);
  ASSERT_EQ(ibv_query_qp(a, &q, IBV_QP_RATE_LIMIT, &qi), 0);
  EXPECT_EQ(q.rate_limit, 0u);
  ibv_qp* c = CreateQp(scq_, rcq_);
  ASSERT_NE(c, nullptr);
  ToInit(c);
  m.rate_limit = 1000;
  EXPECT_EQ(ibv_modify_qp(c, &m, IBV_QP_RATE_LIMIT), EINVAL);
  // ibv_modify_qp_rate_limit: on a QP in RTS, with a burst.
  ibv_qp_rate_limit_attr r{};
  r.rate_limit = 20'000;
  r.max_burst_sz = 8192;
  r.typical_pkt_sz = 1024;
  EXPECT_EQ(ibv_modify_qp_rate_limit(a, &r), 0);
  ASSERT_EQ(ibv_query_qp(a, &q, IBV_QP_RATE_LIMIT, &qi), 0);
  EXPECT_EQ(q.rate_limit, 20'000u);
  EXPECT_EQ(ibv_modify_qp_rate_limit(c, &r), EINVAL);  // INIT
  r.comp_mask = 1;
  EXPECT_EQ(ibv_modify_qp_rate_limit(a, &r), EINVAL);
}

// DROCE_RATE paces every QP from its creation: a new QP reports the rate
// the process was started with (verbs_pacing_env runs this with
// DROCE_RATE=20mbit,burst=8k and DROCE_TEST_RATE_KBPS=20000; unset, 0).
TEST_F(Pacing, RateFromTheEnvironment) {
  const char* want = std::getenv("DROCE_TEST_RATE_KBPS");
  ibv_qp* a = CreateQp(scq_, rcq_);
  ASSERT_NE(a, nullptr);
  ibv_qp_attr q{};
  ibv_qp_init_attr qi{};
  ASSERT_EQ(ibv_query_qp(a, &q, IBV_QP_RATE_LIMIT, &qi), 0);
  EXPECT_EQ(q.rate_limit, want != nullptr ? std::strtoul(want, nullptr, 10) : 0u);
}

// 512 KiB SENT at 40 Mb/s: at least 100 ms on the wire (about 110 with the
// headers), however fast the loopback link is.
TEST_F(Pacing, APacedTransferTakesItsTime) {
  ibv_qp* a = CreateQp(scq_, rcq_);
  ibv_qp* b = CreateQp(scq_, rcq_);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Connect(a, b);
  ibv_qp_attr m{};
  m.rate_limit = 40'000;
  ASSERT_EQ(ibv_modify_qp(a, &m, IBV_QP_RATE_LIMIT), 0);
  constexpr uint32_t kLen = 64 * 1024;
  constexpr int kMsgs = 8;
  for (int i = 0; i < kMsgs; ++i) ASSERT_EQ(PostRecv(b, i, 512 * 1024, kLen), 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < kMsgs; ++i) ASSERT_EQ(PostSend(a, i, 0, kLen), 0);
  auto wcs = Poll(rcq_, kMsgs, std::chrono::seconds(20));
  const auto took = std::chrono::steady_clock::now() - t0;
  ASSERT_EQ(wcs.size(), static_cast<size_t>(kMsgs));
  for (const ibv_wc& wc : wcs) EXPECT_EQ(wc.status, IBV_WC_SUCCESS);
  // The first burst (50 µs at the rate, two frames at least) is free.
  EXPECT_GE(took, std::chrono::milliseconds(100));
  Drain(scq_);
}

}  // namespace
}  // namespace droce::test
