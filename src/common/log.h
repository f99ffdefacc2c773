// Minimal leveled logging to stderr, for the control path only.
#pragma once

#include <cstdio>

#include "absl/strings/str_format.h"

namespace droce {

enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

LogLevel log_level();
void set_log_level(LogLevel level);

template <typename... Args>
void Log(LogLevel level, const absl::FormatSpec<Args...>& fmt, const Args&... args) {
  if (level > log_level()) return;
  std::fprintf(stderr, "droce: %s\n", absl::StrFormat(fmt, args...).c_str());
}

}  // namespace droce
