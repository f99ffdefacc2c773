// Leveled logging to stderr, one line per event. Under systemd, when stderr
// is the journal's stream (JOURNAL_STREAM names stderr's device and inode,
// systemd.exec(5)), each line starts with its sd-daemon(3) priority ("<3>"
// error, "<4>" warning, "<6>" info, "<7>" debug) and journald files it at
// that priority; otherwise it reads "droce: error: ...". The fast path logs
// through DROCE_LOG_EVERY, a rate limit per call site.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "common/spin_lock.h"

namespace droce {

enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);

// "error", "warning", "info", "debug".
const char* LogLevelName(LogLevel level);
// Whether lines carry sd-daemon priorities: stderr is the journal's stream
// (decided once, from JOURNAL_STREAM and fstat(2)); tests may force it.
bool log_to_journal();
void set_log_to_journal(bool on);
// The whole line for `msg` as it goes to stderr, with its newline:
// "<3>tag: msg\n" for the journal, else "tag: error: msg\n".
std::string FormatLogLine(const char* tag, LogLevel level, const std::string& msg);
// Writes one line (one write(2), so lines of several threads never mix).
void LogLine(const char* tag, LogLevel level, const std::string& msg);

template <typename... Args>
void Log(LogLevel level, const absl::FormatSpec<Args...>& fmt, const Args&... args) {
  if (level > log_level()) return;
  LogLine("droce", level, absl::StrFormat(fmt, args...));
}

// At most `per_second` lines a second from one call site (a token bucket
// that holds up to `per_second` tokens, refilled continuously), for events
// that can repeat at packet rate. What it drops is counted and reported by
// the next line it lets through. Thread-safe: workers of one device share a
// call site; the lock is taken only when the level is enabled.
class LogRateLimiter {
 public:
  explicit LogRateLimiter(uint32_t per_second)
      : per_second_(per_second), tokens_(uint64_t{per_second} * kToken) {}
  // true: print now; *suppressed is then how many were dropped since the
  // last line printed (to be reported with it).
  bool Allow(uint64_t now_ns, uint64_t* suppressed);

 private:
  // One token in units of which a nanosecond refills per_second: the refill
  // is elapsed_ns * per_second, exact (no rounding lost on frequent calls).
  static constexpr uint64_t kToken = 1000000000;
  const uint32_t per_second_;
  SpinLock mu_{true};
  uint64_t tokens_;  // the bucket starts full
  uint64_t last_ns_ = 0;  // 0: no call yet
  uint64_t suppressed_ = 0;
};

uint64_t LogClockNs();  // CLOCK_MONOTONIC

// Prints "N messages suppressed" (as its own line, same level) before the
// line when the limiter dropped some since the last one.
template <typename... Args>
void LogLimited(LogRateLimiter& limiter, LogLevel level, const absl::FormatSpec<Args...>& fmt,
                const Args&... args) {
  if (level > log_level()) return;
  uint64_t suppressed = 0;
  if (!limiter.Allow(LogClockNs(), &suppressed)) return;
  if (suppressed != 0) {
    LogLine("droce", level, absl::StrFormat("%u message%s suppressed", suppressed, suppressed == 1 ? "" : "s"));
  }
  LogLine("droce", level, absl::StrFormat(fmt, args...));
}

}  // namespace droce

// Logs at most PER_SECOND lines a second from this call site.
#define DROCE_LOG_EVERY(level, per_second, ...)                      \
  do {                                                               \
    static ::droce::LogRateLimiter droce_log_limiter_(per_second);   \
    ::droce::LogLimited(droce_log_limiter_, level, __VA_ARGS__);     \
  } while (0)
