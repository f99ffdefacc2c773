// The neighbour cache policy shared by ARP and ND (engine/neighbor.h), in
// virtual time: requests while unresolved, trust after a confirmation, then
// unicast re-probing, expiry after unanswered probes, and fresh resolution.
#include "engine/neighbor.h"

#include <gtest/gtest.h>

namespace droce::engine {
namespace {

using Cache = NeighborCache<uint32_t>;
using Request = Cache::Request;

constexpr uint32_t kPeer = 0x0A000002;
constexpr wire::MacAddr kMac = {2, 0, 0, 0, 0, 2};
constexpr wire::MacAddr kMoved = {2, 0, 0, 0, 0, 3};
constexpr uint64_t kSec = 1'000'000'000;

TEST(NeighborCache, UnresolvedAsksEveryRetryInterval) {
  Cache c;
  uint64_t t = 5 * kSec;
  auto r = c.Resolve(kPeer, t);
  EXPECT_FALSE(r.resolved);
  EXPECT_EQ(r.request, Request::kBroadcast);
  EXPECT_EQ(c.Resolve(kPeer, t + Cache::kRetryNs - 1).request, Request::kNone);
  EXPECT_EQ(c.Resolve(kPeer, t + Cache::kRetryNs).request, Request::kBroadcast);
  // The answer completes the entry Resolve made, even without create.
  EXPECT_TRUE(c.Confirm(kPeer, kMac, t + Cache::kRetryNs + 1, /*create=*/false));
  r = c.Resolve(kPeer, t + Cache::kRetryNs + 2);
  EXPECT_TRUE(r.resolved);
  EXPECT_EQ(r.mac, kMac);
  EXPECT_EQ(r.request, Request::kNone);
}

TEST(NeighborCache, ConfirmWithoutCreateIgnoresStrangers) {
  Cache c;
  EXPECT_FALSE(c.Confirm(kPeer, kMac, kSec, /*create=*/false));
  EXPECT_FALSE(c.Resolve(kPeer, kSec).resolved);
  // Multicast and broadcast MACs are never learned.
  EXPECT_FALSE(c.Confirm(kPeer, {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF}, kSec, /*create=*/true));
  EXPECT_FALSE(c.Confirm(kPeer, {0x33, 0x33, 0, 0, 0, 1}, kSec, /*create=*/true));
  EXPECT_FALSE(c.Resolve(kPeer, kSec + Cache::kRetryNs).resolved);
}

TEST(NeighborCache, ConfirmReportsNewAndMovedEntriesOnly) {
  Cache c;
  EXPECT_TRUE(c.Confirm(kPeer, kMac, kSec, /*create=*/true));
  EXPECT_FALSE(c.Confirm(kPeer, kMac, 2 * kSec, /*create=*/false));  // a refresh
  EXPECT_TRUE(c.Confirm(kPeer, kMoved, 3 * kSec, /*create=*/false));  // e.g. a gratuitous ARP
  EXPECT_EQ(c.Resolve(kPeer, 3 * kSec).mac, kMoved);
}

// After kReachableNs without a confirmation the entry is still used but
// probed (unicast, at its MAC) once per kProbeNs; kMaxProbes unanswered
// probes drop it, and resolution starts again with a broadcast.
TEST(NeighborCache, StaleEntryIsProbedThenExpires) {
  Cache c;
  const uint64_t t0 = 10 * kSec;
  ASSERT_TRUE(c.Confirm(kPeer, kMac, t0, /*create=*/true));
  auto r = c.Resolve(kPeer, t0 + Cache::kReachableNs - 1);
  EXPECT_TRUE(r.resolved);
  EXPECT_EQ(r.request, Request::kNone);
  uint64_t t = t0 + Cache::kReachableNs;
  for (int probe = 0; probe < Cache::kMaxProbes; ++probe, t += Cache::kProbeNs) {
    r = c.Resolve(kPeer, t);
    EXPECT_TRUE(r.resolved) << probe;
    EXPECT_EQ(r.mac, kMac);
    EXPECT_EQ(r.request, Request::kUnicastProbe) << probe;
    // Between probes the entry is used quietly.
    r = c.Resolve(kPeer, t + Cache::kProbeNs - 1);
    EXPECT_TRUE(r.resolved);
    EXPECT_EQ(r.request, Request::kNone);
  }
  r = c.Resolve(kPeer, t);
  EXPECT_FALSE(r.resolved);
  EXPECT_EQ(r.request, Request::kBroadcast);
  EXPECT_EQ(c.Resolve(kPeer, t + 1).request, Request::kNone);
  // A late answer brings it back (the new entry counts as changed).
  EXPECT_TRUE(c.Confirm(kPeer, kMac, t + 2, /*create=*/false));
  EXPECT_TRUE(c.Resolve(kPeer, t + 3).resolved);
}

TEST(NeighborCache, AnsweredProbeMakesTheEntryReachableAgain) {
  Cache c;
  ASSERT_TRUE(c.Confirm(kPeer, kMac, kSec, /*create=*/true));
  uint64_t t = kSec + Cache::kReachableNs;
  EXPECT_EQ(c.Resolve(kPeer, t).request, Request::kUnicastProbe);
  EXPECT_EQ(c.Resolve(kPeer, t + Cache::kProbeNs).request, Request::kUnicastProbe);
  EXPECT_FALSE(c.Confirm(kPeer, kMac, t + Cache::kProbeNs + 1, /*create=*/false));
  // Trusted for a full interval from the answer, and the probe count is reset.
  t += Cache::kProbeNs + 1;
  EXPECT_EQ(c.Resolve(kPeer, t + Cache::kReachableNs - 1).request, Request::kNone);
  for (int probe = 0; probe < Cache::kMaxProbes; ++probe) {
    auto r = c.Resolve(kPeer, t + Cache::kReachableNs + probe * Cache::kProbeNs);
    EXPECT_TRUE(r.resolved) << probe;
    EXPECT_EQ(r.request, Request::kUnicastProbe) << probe;
  }
}

TEST(NeighborCache, Ipv6KeysWorkTheSame) {
  NeighborCache<wire::Ipv6Addr> c;
  const wire::Ipv6Addr a = {0xfd, 0x78, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12};
  EXPECT_EQ(c.Resolve(a, kSec).request, NeighborCache<wire::Ipv6Addr>::Request::kBroadcast);
  EXPECT_TRUE(c.Confirm(a, kMac, kSec + 1, /*create=*/false));
  EXPECT_EQ(c.Resolve(a, kSec + 2).mac, kMac);
}

}  // namespace
}  // namespace droce::engine
