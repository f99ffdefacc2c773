// queue::Ring over queue::ShmRegion: geometry, slot indexing with wrapping
// free-running 32-bit indices, and the SPSC ordering contract in ring.h
// (P0/P1/C1/C2) under a two-thread stress.
//
// DROCE_STRESS_ITERS overrides the number of items the stress test moves
// (e.g. smaller under ThreadSanitizer). For TSan, build with
// -fno-builtin-memcpy: GCC 12 does not instrument a fixed-size memcpy that it
// expands into vector moves, so a race on slot contents would go unseen.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "queue/ring.h"
#include "queue/shm.h"

namespace droce::test {
namespace {

using queue::Ring;
using queue::RingHeader;
using queue::ShmRegion;

uint64_t StressIters(uint64_t dflt) {
  if (const char* e = std::getenv("DROCE_STRESS_ITERS")) {
    const uint64_t v = std::strtoull(e, nullptr, 0);
    if (v > 0) return v;
  }
  return dflt;
}

// Maps an existing memfd a second time, as the other process would.
struct SecondMapping {
  explicit SecondMapping(const ShmRegion& r) : len(r.size()) {
    p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, r.fd(), 0);
  }
  ~SecondMapping() {
    if (p != MAP_FAILED) munmap(p, len);
  }
  void* p;
  size_t len;
};

TEST(ShmRegion, CreateRoundsToPagesAndIsZeroed) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto r = ShmRegion::Create("ring-test", 100);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->size(), page);
  EXPECT_GE(r->fd(), 0);
  ASSERT_NE(r->data(), nullptr);
  const auto* p = static_cast<const uint8_t*>(r->data());
  for (size_t i = 0; i < r->size(); ++i) ASSERT_EQ(p[i], 0) << i;  // memfd pages start zeroed

  auto r2 = ShmRegion::Create("ring-test", page + 1);
  ASSERT_TRUE(r2.ok());
  EXPECT_EQ(r2->size(), 2 * page);
}

TEST(ShmRegion, SecondMappingSharesBytes) {
  // The ring is the ABI between two address spaces: a write through one
  // mapping of the memfd is visible through another.
  auto r = ShmRegion::Create("ring-test", 8192);
  ASSERT_TRUE(r.ok());
  SecondMapping m(*r);
  ASSERT_NE(m.p, MAP_FAILED);
  ASSERT_NE(m.p, r->data());
  static_cast<uint8_t*>(r->data())[4097] = 0x5A;
  EXPECT_EQ(static_cast<uint8_t*>(m.p)[4097], 0x5A);
}

TEST(ShmRegion, MoveTransfersOwnership) {
  auto r = ShmRegion::Create("ring-test", 4096);
  ASSERT_TRUE(r.ok());
  void* data = r->data();
  const int fd = r->fd();
  ShmRegion a = std::move(*r);
  EXPECT_EQ(r->data(), nullptr);
  EXPECT_EQ(r->fd(), -1);
  EXPECT_EQ(a.data(), data);
  EXPECT_EQ(a.fd(), fd);
  ShmRegion b;
  b = std::move(a);
  EXPECT_EQ(b.data(), data);
  EXPECT_EQ(a.data(), nullptr);
  static_cast<uint8_t*>(b.data())[0] = 1;  // still mapped
  EXPECT_EQ(static_cast<uint8_t*>(data)[0], 1);
}

TEST(Ring, HeaderLayoutIsThreeCacheLines) {
  // prod, cons and the geometry each own a cache line so that the two sides
  // do not false-share; the layout is ABI.
  auto r = ShmRegion::Create("ring-test", queue::ring_bytes(8, 64));
  ASSERT_TRUE(r.ok());
  Ring ring = Ring::Init(r->data(), 8, 64);
  auto* base = static_cast<uint8_t*>(r->data());
  RingHeader* h = ring.header();
  EXPECT_EQ(reinterpret_cast<uint8_t*>(&h->prod) - base, 0);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(&h->cons) - base, 64);
  EXPECT_EQ(reinterpret_cast<uint8_t*>(&h->size) - base, 128);
  EXPECT_EQ(queue::ring_bytes(8, 64), 3 * 64 + 8 * 64u);
}

TEST(Ring, InitGeometryAndAttach) {
  const uint32_t size = 16, stride = 48;
  auto r = ShmRegion::Create("ring-test", queue::ring_bytes(size, stride));
  ASSERT_TRUE(r.ok());
  Ring ring = Ring::Init(r->data(), size, stride);
  ASSERT_TRUE(ring.valid());
  EXPECT_EQ(ring.size(), size);
  EXPECT_EQ(ring.stride(), stride);
  EXPECT_EQ(ring.header()->magic, queue::kRingMagic);
  EXPECT_EQ(ring.header()->version, queue::kRingVersion);
  EXPECT_EQ(ring.load_prod_relaxed(), 0u);
  EXPECT_EQ(ring.load_cons_relaxed(), 0u);

  // Slots start right after the header, `stride` apart, and stay inside
  // ring_bytes().
  auto* base = static_cast<uint8_t*>(r->data());
  for (uint32_t i = 0; i < size; ++i) {
    EXPECT_EQ(ring.slot(i), base + sizeof(RingHeader) + size_t{i} * stride) << i;
  }
  EXPECT_EQ(ring.slot(size - 1) + stride, base + queue::ring_bytes(size, stride));

  // The other side attaches through its own mapping and reads the geometry
  // from the header; a default Ring is invalid.
  SecondMapping m(*r);
  ASSERT_NE(m.p, MAP_FAILED);
  Ring other(m.p);
  EXPECT_EQ(other.size(), size);
  EXPECT_EQ(other.stride(), stride);
  std::memset(ring.slot(5), 0x77, stride);
  EXPECT_EQ(other.slot(5)[stride - 1], 0x77);
  ring.publish_prod(3);
  EXPECT_EQ(other.load_prod_acquire(), 3u);
  EXPECT_FALSE(Ring().valid());
}

TEST(Ring, RoundUpPow2) {
  EXPECT_EQ(queue::round_up_pow2(0), 1u);
  EXPECT_EQ(queue::round_up_pow2(1), 1u);
  EXPECT_EQ(queue::round_up_pow2(2), 2u);
  EXPECT_EQ(queue::round_up_pow2(3), 4u);
  EXPECT_EQ(queue::round_up_pow2(1000), 1024u);
  EXPECT_EQ(queue::round_up_pow2(1024), 1024u);
  EXPECT_EQ(queue::round_up_pow2(1025), 2048u);
  EXPECT_EQ(queue::round_up_pow2(0x80000000u), 0x80000000u);
}

TEST(Ring, RoundUpPow2AboveTwoToThe31) {
  // Was a bug (found by this test), fixed.
  // No uint32 power of two >= v exists: terminating with 0 (or clamping) is
  // acceptable, hanging is not.
  const uint32_t r = queue::round_up_pow2(0x80000001u);
  EXPECT_TRUE(r == 0 || r == 0x80000000u) << r;
}

// A minimal SPSC queue over the ring primitives, exactly as ring.h says the
// two sides must use them.
struct Producer {
  Ring r;
  uint32_t prod;
  bool TryPush(const void* item, size_t len) {
    if (prod - r.load_cons_acquire() >= r.size()) return false;  // P0
    std::memcpy(r.slot(prod), item, len);
    r.publish_prod(++prod);                                        // P1
    return true;
  }
};
struct Consumer {
  Ring r;
  uint32_t cons;
  bool TryPop(void* item, size_t len) {
    if (cons == r.load_prod_acquire()) return false;  // C1
    std::memcpy(item, r.slot(cons), len);
    r.publish_cons(++cons);                            // C2
    return true;
  }
};

TEST(Ring, FreeRunningIndicesWrapAt2To32) {
  // Indices are free-running uint32 counters; slot = index & (size - 1), and
  // prod - cons is the fill level even after prod wraps past 0.
  const uint32_t size = 16, stride = 16;
  auto r = ShmRegion::Create("ring-test", queue::ring_bytes(size, stride));
  ASSERT_TRUE(r.ok());
  Ring ring = Ring::Init(r->data(), size, stride);
  const uint32_t start = 0xFFFFFFF0u;
  ring.header()->prod.store(start, std::memory_order_relaxed);
  ring.header()->cons.store(start, std::memory_order_relaxed);

  EXPECT_EQ(ring.slot(0xFFFFFFFFu), ring.slot(size - 1));
  EXPECT_EQ(ring.slot(0), ring.slot(size));
  EXPECT_EQ(ring.slot(0xFFFFFFFFu) + stride, ring.slot(0) + size * stride) << "last slot, then first";

  Producer p{ring, ring.load_prod_relaxed()};
  Consumer c{ring, ring.load_cons_relaxed()};
  uint64_t next_in = 0, next_out = 0;
  // Fill to exactly full across the wrap, then drain, for several laps.
  for (int lap = 0; lap < 6; ++lap) {
    for (uint32_t i = 0; i < size; ++i) {
      ASSERT_TRUE(p.TryPush(&next_in, 8)) << lap << " " << i;
      ++next_in;
    }
    EXPECT_FALSE(p.TryPush(&next_in, 8)) << "full ring must refuse";
    EXPECT_EQ(ring.load_prod_relaxed() - ring.load_cons_relaxed(), size);
    for (uint32_t i = 0; i < size / 2; ++i) {
      uint64_t v = 0;
      ASSERT_TRUE(c.TryPop(&v, 8));
      ASSERT_EQ(v, next_out++);
    }
    for (uint32_t i = 0; i < size / 2; ++i) {
      ASSERT_TRUE(p.TryPush(&next_in, 8));
      ++next_in;
    }
    uint64_t v = 0;
    while (c.TryPop(&v, 8)) ASSERT_EQ(v, next_out++);
    EXPECT_EQ(next_out, next_in);
  }
  EXPECT_LT(ring.load_prod_relaxed(), start) << "prod wrapped past 2^32";
  EXPECT_EQ(ring.load_prod_relaxed(), start + static_cast<uint32_t>(next_in));
}

// Slot payload for the stress test: a sequence number, words derived from it,
// and a checksum over them, so a torn or stale slot is detected.
struct Item {
  uint64_t seq;
  uint64_t words[5];
  uint64_t check;
};
static_assert(sizeof(Item) == 56);

uint64_t Mix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdull;
  x ^= x >> 33;
  return x;
}
void Fill(Item* it, uint64_t seq) {
  it->seq = seq;
  uint64_t c = seq;
  for (int i = 0; i < 5; ++i) {
    it->words[i] = Mix(seq * 5 + i);
    c = Mix(c ^ it->words[i]);
  }
  it->check = c;
}
bool Valid(const Item& it) {
  uint64_t c = it.seq;
  for (int i = 0; i < 5; ++i) {
    if (it.words[i] != Mix(it.seq * 5 + i)) return false;
    c = Mix(c ^ it.words[i]);
  }
  return c == it.check;
}

TEST(Ring, SpscStressOrderAndContent) {
  // One producer and one consumer thread move N items through a small ring
  // (many laps, indices crossing 2^32). Any missing release/acquire edge
  // shows up as a torn item (bad checksum), a wrong sequence number, or a
  // TSan report; a producer overwriting a slot before the consumer released
  // it (broken P0/C2) shows up as a skipped sequence number.
  const uint64_t n = StressIters(4'000'000);
  const uint32_t size = 64, stride = 64;
  auto r = ShmRegion::Create("ring-test", queue::ring_bytes(size, stride));
  ASSERT_TRUE(r.ok());
  Ring ring = Ring::Init(r->data(), size, stride);
  const uint32_t start = 0xFFFFFFFFu - static_cast<uint32_t>(n / 2);  // wrap mid-run
  ring.header()->prod.store(start, std::memory_order_relaxed);
  ring.header()->cons.store(start, std::memory_order_relaxed);

  // No wall-clock limit: a side that makes no progress for this many
  // consecutive polls gives up, so a bug fails the test instead of hanging.
  constexpr uint64_t kMaxStall = 200'000'000;
  std::atomic<bool> producer_stalled{false};

  std::thread producer([&] {
    Producer p{ring, ring.load_prod_relaxed()};
    Item it;
    uint64_t stall = 0;
    for (uint64_t seq = 0; seq < n;) {
      Fill(&it, seq);
      if (p.TryPush(&it, sizeof(it))) {
        ++seq;
        stall = 0;
      } else if (++stall > kMaxStall) {
        producer_stalled = true;
        return;
      } else if (stall > 64) {
        std::this_thread::yield();
      }
    }
  });

  Consumer c{ring, ring.load_cons_relaxed()};
  uint64_t expect = 0, bad = 0, out_of_order = 0, stall = 0;
  Item it;
  while (expect < n && stall <= kMaxStall) {
    if (!c.TryPop(&it, sizeof(it))) {
      if (++stall > 64) std::this_thread::yield();
      continue;
    }
    stall = 0;
    if (!Valid(it)) ++bad;
    if (it.seq != expect) ++out_of_order;
    ++expect;
  }
  producer.join();
  EXPECT_FALSE(producer_stalled);
  EXPECT_EQ(expect, n) << "consumer stalled";
  EXPECT_EQ(bad, 0u) << "torn or stale slots";
  EXPECT_EQ(out_of_order, 0u);
  EXPECT_EQ(ring.load_prod_relaxed(), start + static_cast<uint32_t>(n));
  EXPECT_EQ(ring.load_cons_relaxed(), ring.load_prod_relaxed());
}

}  // namespace
}  // namespace droce::test
