#include "common/log.h"

#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace droce {
namespace {

std::atomic<int> g_level{static_cast<int>(LogLevel::kError)};
// -1: not decided yet; 0: text; 1: journal priorities.
std::atomic<int> g_journal{-1};

// systemd.exec(5): JOURNAL_STREAM is "DEVICE:INODE" of the stream it gave the
// service; a program that redirected stderr elsewhere sees another pair and
// writes plain text.
bool StderrIsJournal() {
  const char* v = std::getenv("JOURNAL_STREAM");
  if (v == nullptr) return false;
  std::pair<std::string, std::string> parts = absl::StrSplit(v, absl::MaxSplits(':', 1));
  uint64_t dev = 0, ino = 0;
  if (!absl::SimpleAtoi(parts.first, &dev) || !absl::SimpleAtoi(parts.second, &ino)) return false;
  struct stat st{};
  if (fstat(STDERR_FILENO, &st) != 0) return false;
  return static_cast<uint64_t>(st.st_dev) == dev && static_cast<uint64_t>(st.st_ino) == ino;
}

// sd-daemon(3) prefixes: SD_ERR, SD_WARNING, SD_INFO, SD_DEBUG.
const char* JournalPrefix(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "<3>";
    case LogLevel::kWarning:
      return "<4>";
    case LogLevel::kInfo:
      return "<6>";
    case LogLevel::kDebug:
      return "<7>";
  }
  return "<6>";
}

}  // namespace

LogLevel log_level() { return static_cast<LogLevel>(g_level.load(std::memory_order_relaxed)); }
void set_log_level(LogLevel level) { g_level.store(static_cast<int>(level), std::memory_order_relaxed); }

const char* LogLevelName(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarning:
      return "warning";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "?";
}

bool log_to_journal() {
  int j = g_journal.load(std::memory_order_relaxed);
  if (j < 0) {
    j = StderrIsJournal() ? 1 : 0;
    g_journal.store(j, std::memory_order_relaxed);
  }
  return j == 1;
}
void set_log_to_journal(bool on) { g_journal.store(on ? 1 : 0, std::memory_order_relaxed); }

std::string FormatLogLine(const char* tag, LogLevel level, const std::string& msg) {
  // One event, one line: a message with newlines in it would be several
  // journal entries, the later ones at the default priority.
  std::string body = msg;
  for (char& c : body) {
    if (c == '\n') c = ' ';
  }
  if (log_to_journal()) return absl::StrCat(JournalPrefix(level), tag, ": ", body, "\n");
  return absl::StrCat(tag, ": ", LogLevelName(level), ": ", body, "\n");
}

void LogLine(const char* tag, LogLevel level, const std::string& msg) {
  const std::string line = FormatLogLine(tag, level, msg);
  (void)!write(STDERR_FILENO, line.data(), line.size());
}

uint64_t LogClockNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000u + static_cast<uint64_t>(ts.tv_nsec);
}

bool LogRateLimiter::Allow(uint64_t now_ns, uint64_t* suppressed) {
  std::lock_guard<SpinLock> l(mu_);
  const uint64_t cap = uint64_t{per_second_} * kToken;
  if (last_ns_ != 0 && now_ns > last_ns_) {
    // A second refills the whole bucket: capping there keeps the product
    // below 2^64 for any per_second.
    const uint64_t elapsed = std::min<uint64_t>(now_ns - last_ns_, kToken);
    tokens_ = std::min(cap, tokens_ + elapsed * per_second_);
  }
  // A clock reading older than the last (another thread's) refills nothing.
  if (now_ns > last_ns_) last_ns_ = now_ns;
  if (tokens_ < kToken) {
    ++suppressed_;
    return false;
  }
  tokens_ -= kToken;
  *suppressed = suppressed_;
  suppressed_ = 0;
  return true;
}

}  // namespace droce
