// The control protocol's op table (src/ctl/protocol.h, DROCE_CTL_OPS): the
// numbers on the wire, the shapes derived from it, and the request checks
// found by payload type.
#include "ctl/protocol.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

namespace droce::ctl {
namespace {

// A message as a client sends it: header and payload.
template <typename T>
std::vector<uint8_t> Message(uint16_t op, const T& payload, uint16_t dev = 0) {
  constexpr size_t n = std::is_same_v<T, None> ? 0 : sizeof(T);
  std::vector<uint8_t> m(sizeof(Header) + n);
  const Header h{kMagic, op, dev, 1, static_cast<uint32_t>(m.size())};
  std::memcpy(m.data(), &h, sizeof(h));
  if constexpr (n != 0) std::memcpy(m.data() + sizeof(h), &payload, n);
  return m;
}

template <typename T>
absl::Status Validate(uint16_t op, const T& payload, int nfds = 0) {
  const std::vector<uint8_t> m = Message(op, payload);
  return ValidateRequest(m.data(), m.size(), nfds);
}

// The numbers are the wire's: a daemon and a client of one build agree by
// construction, but the table may only grow at its end.
TEST(CtlProtocol, OpNumbersAreTheWires) {
  EXPECT_EQ(kHello, 1);
  EXPECT_EQ(kAttach, 2);
  EXPECT_EQ(kRegMr, 5);
  EXPECT_EQ(kCreateQp, 13);
  EXPECT_EQ(kReadQpCounters, 26);
  EXPECT_EQ(kCmOpen, 27);
  EXPECT_EQ(kAdmin, 30);
  EXPECT_EQ(kReregMr, 31);
  EXPECT_EQ(kOpEnd, 32);
}

TEST(CtlProtocol, EveryOpHasItsShapeAndName) {
  EXPECT_EQ(ShapeOf(0), nullptr);
  EXPECT_EQ(ShapeOf(kOpEnd), nullptr);
  for (uint16_t op = 1; op < kOpEnd; ++op) {
    const OpShape* s = ShapeOf(op);
    ASSERT_NE(s, nullptr) << op;
    ASSERT_NE(s->name, nullptr) << op;
    EXPECT_FALSE(std::string(s->name).empty());
    EXPECT_LE(sizeof(Header) + s->req_len, kMaxMessage) << s->name;
    EXPECT_LE(sizeof(Reply) + s->rep_len, kMaxMessage) << s->name;
    EXPECT_LE(s->req_fds, kMaxFds);
    EXPECT_LE(s->rep_fds, kMaxFds);
  }
  EXPECT_STREQ(ShapeOf(kCreateQp)->name, "CreateQp");
  EXPECT_EQ(ShapeOf(kCreateQp)->req_len, sizeof(CreateQp));
  EXPECT_EQ(ShapeOf(kCreateQp)->rep_len, sizeof(QpRep));
  EXPECT_EQ(ShapeOf(kCreateQp)->rep_fds, 1);
  EXPECT_EQ(ShapeOf(kAllocPd)->req_len, 0u);
  EXPECT_EQ(ShapeOf(kDestroyQp)->rep_len, 0u);
  EXPECT_EQ(ShapeOf(kRegMr)->req_fds, kVaryFds);
  static_assert(std::is_same_v<OpDef<kResizeCq>::Rep, CqRep>);
  static_assert(OpDef<kHello>::kScope == Scope::kConn && OpDef<kAllocPd>::kScope == Scope::kDev);
}

TEST(CtlProtocol, RequestsAreCheckedByShape) {
  EXPECT_TRUE(Validate(kAllocPd, None{}).ok());
  EXPECT_TRUE(Validate(kDestroyQp, Id{7, 0}).ok());
  // A payload of another op's size, a missing or extra fd.
  EXPECT_FALSE(Validate(kAllocPd, Id{7, 0}).ok());
  EXPECT_FALSE(Validate(kDestroyQp, None{}).ok());
  EXPECT_FALSE(Validate(kDestroyQp, Id{7, 0}, 1).ok());
  EXPECT_FALSE(Validate(kCmOpen, CmChannel{3, 0}, 0).ok());
  EXPECT_TRUE(Validate(kCmOpen, CmChannel{3, 0}, 1).ok());
  EXPECT_FALSE(Validate(uint16_t{0}, None{}).ok());
  EXPECT_FALSE(Validate(uint16_t{kOpEnd}, None{}).ok());
  // A device index beyond any (except in the hello).
  const std::vector<uint8_t> m = Message(kAllocPd, None{}, kMaxDevices);
  EXPECT_FALSE(ValidateRequest(m.data(), m.size(), 0).ok());
}

TEST(CtlProtocol, RequestsAreCheckedByPayloadType) {
  CreateQp q{};
  q.type = 2;  // RC
  EXPECT_TRUE(Validate(kCreateQp, q).ok());
  q.type = 5;
  EXPECT_FALSE(Validate(kCreateQp, q).ok());
  q.type = 2;
  q.sq_sig_all = 2;
  EXPECT_FALSE(Validate(kCreateQp, q).ok());
  EXPECT_TRUE(Validate(kAllocMw, AllocMw{1, 2}).ok());
  EXPECT_FALSE(Validate(kAllocMw, AllocMw{1, 3}).ok());
  EXPECT_FALSE(Validate(kReregMr, ReregMr{1, 0, 0, 0}).ok());
  EXPECT_TRUE(Validate(kReregMr, ReregMr{1, engine::Session::kReregAccess, 0, 1}).ok());
  EXPECT_FALSE(Validate(kReregMr, ReregMr{1, engine::Session::kReregAccess, 0, 0x20}).ok());
  AdminReq a{};
  a.len = kAdminMaxReq + 1;
  EXPECT_FALSE(Validate(kAdmin, a).ok());
  RegMr r{};
  r.tier = kTierCopy;
  r.len = 4096;
  EXPECT_TRUE(Validate(kRegMr, r).ok());
  EXPECT_FALSE(Validate(kRegMr, r, 1).ok());  // a copied registration carries no fd
}

}  // namespace
}  // namespace droce::ctl
