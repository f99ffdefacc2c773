// droced's configuration file (TOML, default /etc/droce/droced.toml): the
// daemon's own options ([daemon], [limits]) and the DROCE_* settings it
// serves with ([engine] for those of the whole process, one [[device]] table
// per device). Each [[device]] key becomes that device's entry of the
// setting's ';'-list, so the file says nothing the DROCE_* variables cannot,
// and every value goes through the settings' own parsers (config/settings.h):
// the file accepts what `droce exec` accepts. No DPDK, no engine: unit-tested
// alone. See docs/CONFIG.md, "droced configuration file".
#pragma once

#include <sys/types.h>

#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "config/settings.h"
#include "daemon/limits.h"

namespace droce::daemon {

// Read when --config is not given, if it exists.
inline constexpr const char* kDefaultConfigFile = "/etc/droce/droced.toml";

struct FileConfig {
  // The DROCE_* settings the file sets, as their variables would hold them
  // (empty: not set by the file).
  config::RawSettings settings;
  // [daemon]; unset: the daemon's default (or a flag's value).
  std::optional<std::string> socket;
  std::optional<std::string> socket_group;
  std::optional<mode_t> socket_mode;
  std::optional<std::string> metrics_address;
  std::optional<uint16_t> metrics_port;
  // [limits], defaults where the file says nothing.
  ClientLimits limits;
};

// Parses `text`, read from `path` (which the errors name). A syntax error,
// an unknown section or key, a value of the wrong type or a bad value fails
// with "PATH:LINE: KEY: PROBLEM" (KEY as "section.key"); worker CPUs are
// checked against `cpus`, as ParseSettings does.
absl::StatusOr<FileConfig> ParseConfigFile(std::string_view text, const std::string& path,
                                           const config::CpuSet& cpus);
// Reads the file and parses it ("PATH: cannot read: REASON" if unreadable).
absl::StatusOr<FileConfig> LoadConfigFile(const std::string& path, const config::CpuSet& cpus);

// The socket's mode: octal digits, e.g. "0660" or "660", at most 07777.
absl::StatusOr<mode_t> ParseSocketMode(const std::string& s);
// A group name, or its number in decimal digits; the group must exist.
absl::StatusOr<gid_t> ResolveGroup(const std::string& s);
// 0 (off) to 65535, decimal digits.
absl::StatusOr<uint16_t> ParseMetricsPort(const std::string& s);
// A dotted IPv4 address (what the metrics endpoint binds).
absl::Status CheckMetricsAddress(const std::string& s);

}  // namespace droce::daemon
