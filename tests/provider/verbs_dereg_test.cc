// ibv_dereg_mr while a remote peer is in the middle of an RDMA WRITE to the
// region: once the call returns, no byte of the region may
// change, and the WRITE completes with IBV_WC_REM_ACCESS_ERR. The engine
// checks the rkey again on every packet; before it did, about 16 million of
// the 16 MiB were written after ibv_dereg_mr had returned, in 8 of 8 trials.
#include <sys/mman.h>

#include "loopback_fixture.h"

namespace droce::test {
namespace {

constexpr size_t kLen = 16u << 20;
constexpr uint8_t kReused = 0x5A;

class Dereg : public Loopback {};

TEST_F(Dereg, RegionIsNeverWrittenAfterIbvDeregMrReturns) {
  auto* src = static_cast<uint8_t*>(mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  auto* dst = static_cast<uint8_t*>(mmap(nullptr, kLen, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(src, MAP_FAILED);
  ASSERT_NE(dst, MAP_FAILED);
  std::memset(src, 0xC3, kLen);
  ibv_mr* smr = ibv_reg_mr(pd_, src, kLen, IBV_ACCESS_LOCAL_WRITE);
  ASSERT_NE(smr, nullptr);
  int interrupted = 0;
  for (int trial = 0; trial < 8; ++trial) {
    std::memset(dst, 0, kLen);
    ibv_mr* dmr = ibv_reg_mr(pd_, dst, kLen, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    ASSERT_NE(dmr, nullptr);
    ibv_qp* a = CreateQp(scq_, scq_);
    ibv_qp* b = CreateQp(scq_, rcq_);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    Connect(a, b);
    GrantRemote(b, IBV_ACCESS_REMOTE_WRITE);

    ibv_sge s{reinterpret_cast<uint64_t>(src), static_cast<uint32_t>(kLen), smr->lkey};
    ibv_send_wr wr{};
    wr.wr_id = 100 + trial;
    wr.sg_list = &s;
    wr.num_sge = 1;
    wr.opcode = IBV_WR_RDMA_WRITE;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = reinterpret_cast<uint64_t>(dst);
    wr.wr.rdma.rkey = dmr->rkey;
    ibv_send_wr* bad = nullptr;
    ASSERT_EQ(ibv_post_send(a, &wr, &bad), 0);
    // Drive the engine (application progress) for a fraction of the WRITE.
    std::vector<ibv_wc> early;
    const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(150 + 100 * trial);
    while (early.empty() && std::chrono::steady_clock::now() < until) {
      ibv_wc wc;
      if (ibv_poll_cq(scq_, 1, &wc) == 1) early.push_back(wc);
    }
    ASSERT_EQ(ibv_dereg_mr(dmr), 0);
    std::memset(dst, kReused, kLen);  // the application reuses the memory at once
    auto c = early.empty() ? Poll(scq_, 1) : early;
    ASSERT_EQ(c.size(), 1u) << "trial " << trial;
    EXPECT_EQ(c[0].wr_id, static_cast<uint64_t>(100 + trial));
    if (early.empty()) {
      ++interrupted;
      EXPECT_EQ(c[0].status, IBV_WC_REM_ACCESS_ERR) << "trial " << trial << ": " << ibv_wc_status_str(c[0].status);
    } else {
      EXPECT_EQ(c[0].status, IBV_WC_SUCCESS);  // it finished before the deregistration
    }
    Drain(scq_);
    size_t written = 0;
    for (size_t i = 0; i < kLen; ++i) written += dst[i] != kReused;
    EXPECT_EQ(written, 0u) << "trial " << trial << ": bytes written after ibv_dereg_mr returned";
    // The responder's QP is in the error state (class C error, IBA 9.9.3.1).
    if (early.empty()) {
      EXPECT_EQ(State(b), IBV_QPS_ERR);
    }
    for (ibv_qp* q : {a, b}) {
      EXPECT_EQ(ibv_destroy_qp(q), 0);
      qps_.erase(std::find(qps_.begin(), qps_.end(), q));
    }
  }
  EXPECT_GT(interrupted, 0) << "every WRITE finished before the deregistration: the test checked nothing";
  EXPECT_EQ(ibv_dereg_mr(smr), 0);
  munmap(src, kLen);
  munmap(dst, kLen);
}

}  // namespace
}  // namespace droce::test
