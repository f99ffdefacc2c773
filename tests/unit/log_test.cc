// Logging (src/common/log.h): the line formats (plain text, journald
// priorities) and the per-call-site rate limit, in virtual time.
#include "common/log.h"

#include <unistd.h>

#include <string>

#include "gtest/gtest.h"

namespace droce {
namespace {

constexpr uint64_t kSec = 1000000000;

TEST(Log, TextLines) {
  set_log_to_journal(false);
  EXPECT_EQ(FormatLogLine("droce", LogLevel::kError, "droce0: device failed"), "droce: error: droce0: device failed\n");
  EXPECT_EQ(FormatLogLine("droce", LogLevel::kWarning, "w"), "droce: warning: w\n");
  EXPECT_EQ(FormatLogLine("droced", LogLevel::kInfo, "i"), "droced: info: i\n");
  EXPECT_EQ(FormatLogLine("droce", LogLevel::kDebug, "d"), "droce: debug: d\n");
}

TEST(Log, JournalPriorities) {
  set_log_to_journal(true);
  EXPECT_EQ(FormatLogLine("droce", LogLevel::kError, "e"), "<3>droce: e\n");
  EXPECT_EQ(FormatLogLine("droce", LogLevel::kWarning, "w"), "<4>droce: w\n");
  EXPECT_EQ(FormatLogLine("droce", LogLevel::kInfo, "i"), "<6>droce: i\n");
  EXPECT_EQ(FormatLogLine("droce", LogLevel::kDebug, "d"), "<7>droce: d\n");
  set_log_to_journal(false);
}

TEST(Log, OneLinePerEvent) {
  set_log_to_journal(true);
  EXPECT_EQ(FormatLogLine("droce", LogLevel::kError, "a\nb"), "<3>droce: a b\n");
  set_log_to_journal(false);
}

TEST(LogRateLimiter, BurstThenSteadyRate) {
  LogRateLimiter l(5);
  uint64_t suppressed = 99;
  const uint64_t t0 = 10 * kSec;
  // The bucket starts full: 5 lines at once, then nothing.
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE(l.Allow(t0, &suppressed)) << i;
    EXPECT_EQ(suppressed, 0u);
  }
  for (int i = 0; i < 100; ++i) EXPECT_FALSE(l.Allow(t0 + i, &suppressed));
  // One token per 200 ms; the line that gets through reports the drops.
  EXPECT_FALSE(l.Allow(t0 + kSec / 5 - 1000, &suppressed));
  ASSERT_TRUE(l.Allow(t0 + kSec / 5, &suppressed));
  EXPECT_EQ(suppressed, 101u);
  EXPECT_FALSE(l.Allow(t0 + kSec / 5 + 1, &suppressed));
  ASSERT_TRUE(l.Allow(t0 + 2 * kSec / 5, &suppressed));
  EXPECT_EQ(suppressed, 1u);
}

TEST(LogRateLimiter, AtMostNPerSecondUnderFlood) {
  LogRateLimiter l(10);
  uint64_t suppressed = 0, printed = 0, dropped = 0;
  const uint64_t t0 = kSec;
  // 1 million events over 10 s (one every 10 µs).
  for (uint64_t i = 0; i < 1000000; ++i) {
    if (l.Allow(t0 + i * 10000, &suppressed)) {
      ++printed;
      dropped += suppressed;
    }
  }
  // 10 at the start, then 10 a second.
  EXPECT_GE(printed, 100u);
  EXPECT_LE(printed, 110u);
  EXPECT_LE(dropped, 1000000u - printed);
  // Those after the last print are still pending: at most a tenth of a
  // second's worth.
  EXPECT_GE(dropped + 10000, 1000000u - printed);
}

TEST(LogRateLimiter, RefillsToBurstOnlyAfterQuiet) {
  LogRateLimiter l(3);
  uint64_t s = 0;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(l.Allow(kSec, &s));
  ASSERT_FALSE(l.Allow(kSec, &s));
  // An hour of quiet refills three tokens, not more.
  const uint64_t later = kSec + 3600 * kSec;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(l.Allow(later, &s)) << i;
  EXPECT_FALSE(l.Allow(later, &s));
  // A clock that goes back (another thread's older reading) takes no token.
  EXPECT_FALSE(l.Allow(later - kSec, &s));
}

TEST(LogEvery, CallSiteLimitPrintsSuppressedCount) {
  set_log_to_journal(false);
  set_log_level(LogLevel::kWarning);
  testing::internal::CaptureStderr();
  for (int i = 0; i < 50; ++i) DROCE_LOG_EVERY(LogLevel::kWarning, 2, "event %d", i);
  const std::string out = testing::internal::GetCapturedStderr();
  // Two in the burst; the rest within microseconds are dropped.
  EXPECT_EQ(out, "droce: warning: event 0\ndroce: warning: event 1\n");
  // Below the level: nothing at all.
  testing::internal::CaptureStderr();
  DROCE_LOG_EVERY(LogLevel::kDebug, 2, "quiet %d", 1);
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  set_log_level(LogLevel::kError);
}

TEST(LogEvery, SuppressedLineBeforeTheNextOne) {
  set_log_to_journal(false);
  set_log_level(LogLevel::kWarning);
  LogRateLimiter l(1);
  testing::internal::CaptureStderr();
  LogLimited(l, LogLevel::kWarning, "first");
  LogLimited(l, LogLevel::kWarning, "dropped");
  LogLimited(l, LogLevel::kWarning, "dropped");
  const std::string burst = testing::internal::GetCapturedStderr();
  EXPECT_EQ(burst, "droce: warning: first\n");
  // A second later the next line reports the two before it.
  testing::internal::CaptureStderr();
  usleep(1100000);
  LogLimited(l, LogLevel::kWarning, "again");
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "droce: warning: 2 messages suppressed\ndroce: warning: again\n");
  set_log_level(LogLevel::kError);
}

}  // namespace
}  // namespace droce
