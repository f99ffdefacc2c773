// The MR/MW table: dense slots indexed by key, reused oldest first with a
// new variant, so that the per-packet check is an array access and a stale
// key never matches what took its slot.
#include "mem/mr_table.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace droce::mem {
namespace {

constexpr uint32_t kRw = kLocalWrite | kRemoteWrite | kRemoteRead;

// Fills the quarantine so that the next registration reuses a slot.
std::vector<uint32_t> Churn(MrTable& t, int n) {
  std::vector<uint32_t> keys;
  for (int i = 0; i < n; ++i) keys.push_back(t.Register(1, 0x1000, 0x1000, 16, kRw)->key);
  for (uint32_t k : keys) EXPECT_TRUE(t.Deregister(k));
  return keys;
}

// droced's clients share one table: a key must not be predictable from the
// index alone. The first variant of each slot is random (as with 16 fresh
// tables, whose first keys would all be equal with a fixed start: a false
// failure has probability 256^-15).
TEST(MrTable, FirstKeysOfFreshTablesDifferInTheirVariant) {
  std::set<uint32_t> variants;
  for (int i = 0; i < 16; ++i) {
    MrTable t;
    const uint32_t key = t.Register(1, 0x1000, 0x1000, 16, kRw)->key;
    EXPECT_EQ(key >> 8, 1u);
    variants.insert(key & 0xFF);
  }
  EXPECT_GT(variants.size(), 1u);
}

TEST(MrTable, StaleKeysNeverMatchTheSlotsNewOccupant) {
  MrTable t;
  uint8_t buf[64];
  const uint64_t a = reinterpret_cast<uint64_t>(buf);
  const uint32_t k1 = t.Register(1, a, a, 64, kRw)->key;
  ASSERT_TRUE(t.Deregister(k1));
  EXPECT_FALSE(t.Deregister(k1));
  const uint32_t fresh = t.Register(1, a, a, 64, kRw)->key;
  EXPECT_NE(fresh >> 8, k1 >> 8) << "a freed slot waits in quarantine";
  ASSERT_TRUE(t.Deregister(fresh));
  Churn(t, 1100);
  const uint32_t k2 = t.Register(1, a, a, 64, kRw)->key;
  EXPECT_EQ(k2 >> 8, k1 >> 8) << "after the quarantine the oldest freed slot is reused";
  EXPECT_NE(k2, k1);
  Place host;
  EXPECT_EQ(t.Check(k1, 1, a, 8, kRemoteWrite, &host), AccessError::kBadKey);
  EXPECT_EQ(t.Check(k2, 1, a, 8, kRemoteWrite, &host), AccessError::kOk);
  EXPECT_EQ(host.host, buf);
  EXPECT_EQ(host.pid, 0);
  EXPECT_EQ(t.Find(k1), nullptr);
  // A window in a slot an MR used to have: the MR's key names nothing.
  ASSERT_TRUE(t.Deregister(k2));
  Churn(t, 1100);
  uint32_t mw = 0;
  for (int i = 0; i < 2000 && (mw >> 8) != (k2 >> 8); ++i) mw = *t.AllocMw(1, 2);
  ASSERT_EQ(mw >> 8, k2 >> 8);
  EXPECT_EQ(t.Check(k2, 1, a, 8, kRemoteWrite, &host), AccessError::kBadKey);
  EXPECT_EQ(t.Find(mw), nullptr);
  EXPECT_NE(t.FindMw(mw), nullptr);
  EXPECT_EQ(t.size(), 0u);
}

TEST(MrTable, AStaleKeyMatchesOnlyAfter256ReusesOfItsSlot) {
  MrTable t;
  const uint32_t k = t.Register(1, 0x1000, 0x1000, 16, kRw)->key;
  ASSERT_TRUE(t.Deregister(k));
  int reuses = 0;
  for (int round = 0; round < 1000 && reuses < 256; ++round) {
    for (uint32_t key : Churn(t, 1100)) {
      if ((key >> 8) != (k >> 8)) continue;
      ++reuses;
      if (reuses < 256) ASSERT_NE(key, k) << "reuse " << reuses;
      else EXPECT_EQ(key, k) << "the variant wraps after 256 reuses (as an RNIC's 8-bit key)";
    }
  }
  EXPECT_EQ(reuses, 256);
}

// Keys used to come from a counter that never went back: a program that
// registered and deregistered 2^24 times could register no more.
TEST(MrTable, RegistrationsNeverRunOutWhileSlotsAreFreed) {
  MrTable t;
  std::set<uint32_t> slots;
  for (int i = 0; i < 300000; ++i) {
    auto mr = t.Register(1, 0x1000, 0x1000, 16, kRw);
    ASSERT_TRUE(mr.ok()) << i;
    slots.insert(mr->key >> 8);
    ASSERT_TRUE(t.Deregister(mr->key));
  }
  EXPECT_LE(slots.size(), 1100u) << "slots are reused once out of quarantine";
}

}  // namespace
}  // namespace droce::mem
