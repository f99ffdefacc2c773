#include "daemon/config_file.h"

#include <arpa/inet.h>
#include <grp.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <limits>
#include <sstream>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "toml++/toml.h"

namespace droce::daemon {
namespace {

using config::Setting;

const char* TypeName(toml::node_type t) {
  switch (t) {
    case toml::node_type::none: return "nothing";
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return "a string";
    case toml::node_type::integer: return "an integer";
    case toml::node_type::floating_point: return "a float";
    case toml::node_type::boolean: return "a boolean";
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
  }
  return "?";
}

// The value's type; its text is what the DROCE_* variable would hold.
enum class Kind : uint8_t {
  kString,
  kInteger,
  kBool,
  kIntegerOrString,       // vlan: 100 or "100:3"
  kCpuList,               // worker_cpu: 2, [2, 3] or "2,3"
};

// A key that is a DROCE_* setting.
struct SettingKey {
  const char* key;
  Setting setting;
  Kind kind;
};

constexpr SettingKey kEngineKeys[] = {
    {"mtu", Setting::kMtu, Kind::kInteger},
    {"gateway", Setting::kGateway, Kind::kString},
    {"vlan", Setting::kVlan, Kind::kIntegerOrString},
    {"hugepages", Setting::kHugepages, Kind::kString},
    {"progress", Setting::kProgress, Kind::kString},
    {"poll_yield", Setting::kPollYield, Kind::kInteger},
    {"watch_us", Setting::kWatch, Kind::kInteger},
    {"stats", Setting::kStats, Kind::kBool},
    {"telemetry", Setting::kTelemetry, Kind::kBool},
    {"ctl", Setting::kCtl, Kind::kBool},
    {"fault", Setting::kFault, Kind::kString},
    {"capture", Setting::kCapture, Kind::kString},
    {"trace", Setting::kTrace, Kind::kString},
    {"rate", Setting::kRate, Kind::kString},
    {"cc", Setting::kCc, Kind::kString},
    {"dcqcn", Setting::kDcqcn, Kind::kString},
    {"sr", Setting::kSr, Kind::kString},
    {"adp_retrans", Setting::kAdpRetrans, Kind::kString},
};

constexpr SettingKey kDeviceKeys[] = {
    {"link", Setting::kLink, Kind::kString},
    {"ip", Setting::kIp, Kind::kString},
    {"ip6", Setting::kIp6, Kind::kString},
    {"mac", Setting::kMac, Kind::kString},
    {"workers", Setting::kWorkers, Kind::kInteger},
    {"worker_cpu", Setting::kWorkerCpu, Kind::kCpuList},
};

class Parser {
 public:
  Parser(const std::string& path, const config::CpuSet& cpus) : path_(path), cpus_(cpus) {}

  absl::StatusOr<FileConfig> Run(std::string_view text);

 private:
  absl::Status Error(const toml::source_region& where, absl::string_view key, absl::string_view problem) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ":", where.begin.line, ": ", key, ": ", problem));
  }
  absl::Status WrongType(const toml::node& v, absl::string_view key, absl::string_view want) const {
    return Error(v.source(), key, absl::StrCat("expected ", want, ", got ", TypeName(v.type())));
  }
  absl::Status Daemon(const toml::table& t);
  absl::Status Limits(const toml::table& t);
  absl::Status Engine(const toml::table& t);
  absl::Status Devices(const toml::node& v);
  // The text of a setting's value, as its DROCE_* variable would hold it.
  absl::StatusOr<std::string> SettingText(const toml::node& v, const std::string& key, Kind kind) const;
  // Checks one value (one device's entry of a per-device setting) with the
  // settings' own parser.
  absl::Status CheckSetting(const toml::node& v, const std::string& key, Setting s, const std::string& text) const;
  absl::StatusOr<std::string> String(const toml::node& v, const std::string& key) const {
    const auto* s = v.as_string();
    if (s == nullptr) return WrongType(v, key, "a string");
    return s->get();
  }
  absl::StatusOr<int64_t> Integer(const toml::node& v, const std::string& key, int64_t max) const {
    const auto* i = v.as_integer();
    if (i == nullptr) return WrongType(v, key, "an integer");
    if (i->get() < 0 || i->get() > max) {
      return Error(v.source(), key, absl::StrCat(i->get(), " is out of range (0 to ", max, ")"));
    }
    return i->get();
  }

  const std::string& path_;
  const config::CpuSet& cpus_;
  FileConfig out_;
  // Where each setting was set (the last key that did, for a per-device
  // one), for the errors of the final cross-check.
  std::array<toml::source_region, config::kNumSettings> where_{};
};

absl::StatusOr<std::string> Parser::SettingText(const toml::node& v, const std::string& key, Kind kind) const {
  switch (kind) {
    case Kind::kString:
      return String(v, key);
    case Kind::kInteger: {
      const auto* i = v.as_integer();
      if (i == nullptr) return WrongType(v, key, "an integer");
      return absl::StrCat(i->get());  // a negative one fails the setting's parser
    }
    case Kind::kBool: {
      const auto* b = v.as_boolean();
      if (b == nullptr) return WrongType(v, key, "true or false");
      return std::string(b->get() ? "1" : "0");
    }
    case Kind::kIntegerOrString: {
      if (const auto* i = v.as_integer()) return absl::StrCat(i->get());
      if (const auto* s = v.as_string()) return s->get();
      return WrongType(v, key, "an integer or a string");
    }
    case Kind::kCpuList: {
      if (const auto* i = v.as_integer()) return absl::StrCat(i->get());
      if (const auto* s = v.as_string()) return s->get();
      const auto* a = v.as_array();
      if (a == nullptr) return WrongType(v, key, "a CPU number or an array of them");
      if (a->empty()) return Error(v.source(), key, "an empty list of CPUs (leave the key out for floating workers)");
      std::vector<std::string> cpus;
      for (const toml::node& e : *a) {
        const auto* i = e.as_integer();
        if (i == nullptr) return WrongType(e, key, "CPU numbers (integers)");
        cpus.push_back(absl::StrCat(i->get()));
      }
      return absl::StrJoin(cpus, ",");
    }
  }
  return absl::InternalError("kind");
}

absl::Status Parser::CheckSetting(const toml::node& v, const std::string& key, Setting s,
                                  const std::string& text) const {
  if (text.empty()) return Error(v.source(), key, "empty (leave the key out for the default)");
  if (s == Setting::kGateway) {
    // Alone: whether it is on every port's subnet is the cross-check's.
    uint32_t gw = 0;
    if (absl::Status st = config::ParseIpv4(text, &gw); !st.ok()) return Error(v.source(), key, st.message());
    return absl::OkStatus();
  }
  if (config::Info(s).per_device && text.find(';') != std::string::npos) {
    return Error(v.source(), key, absl::StrCat("'", text, "' has a ';': one [[device]] table per device"));
  }
  if (config::EveryOrEachDevice(s) && text.find(';') != std::string::npos) {
    // One entry per device: each checked alone; their count against the
    // [[device]] tables by the final cross-check.
    for (const std::string& e : config::SplitDevices(text)) {
      if (e.empty()) continue;
      if (absl::Status st = CheckSetting(v, key, s, e); !st.ok()) return st;
    }
    return absl::OkStatus();
  }
  // The value alone, as if it were the only DROCE_* variable set (one
  // device): exactly the engine's check, with its reason.
  config::RawSettings one;
  one[static_cast<size_t>(s)] = text;
  config::SettingError err;
  if (!config::ParseSettings(one, cpus_, &err).ok()) return Error(v.source(), key, err.reason);
  return absl::OkStatus();
}

absl::Status Parser::Daemon(const toml::table& t) {
  for (const auto& [k, v] : t) {
    const std::string name(k.str());
    const std::string key = "daemon." + name;
    if (name == "socket") {
      auto s = String(v, key);
      if (!s.ok()) return s.status();
      if (s->empty() || s->size() >= 108) {
        return Error(v.source(), key, absl::StrCat("'", *s, "' is empty or too long for a unix socket (107 bytes)"));
      }
      out_.socket = *s;
    } else if (name == "socket_group") {
      auto s = String(v, key);
      if (!s.ok()) return s.status();
      if (auto g = ResolveGroup(*s); !g.ok()) return Error(v.source(), key, g.status().message());
      out_.socket_group = *s;
    } else if (name == "socket_mode") {
      if (v.is_integer()) {
        return Error(v.source(), key, "write the mode as a string of octal digits, e.g. \"0660\"");
      }
      auto s = String(v, key);
      if (!s.ok()) return s.status();
      auto m = ParseSocketMode(*s);
      if (!m.ok()) return Error(v.source(), key, m.status().message());
      out_.socket_mode = *m;
    } else if (name == "metrics_address") {
      auto s = String(v, key);
      if (!s.ok()) return s.status();
      if (absl::Status st = CheckMetricsAddress(*s); !st.ok()) return Error(v.source(), key, st.message());
      out_.metrics_address = *s;
    } else if (name == "metrics_port") {
      auto p = Integer(v, key, 65535);
      if (!p.ok()) return p.status();
      out_.metrics_port = static_cast<uint16_t>(*p);
    } else if (name == "log_level") {
      auto s = SettingText(v, key, Kind::kString);
      if (!s.ok()) return s.status();
      if (absl::Status st = CheckSetting(v, key, Setting::kLogLevel, *s); !st.ok()) return st;
      out_.settings[static_cast<size_t>(Setting::kLogLevel)] = *s;
      where_[static_cast<size_t>(Setting::kLogLevel)] = v.source();
    } else {
      return Error(k.source(), key, "unknown key");
    }
  }
  return absl::OkStatus();
}

absl::Status Parser::Limits(const toml::table& t) {
  constexpr int64_t kU32 = std::numeric_limits<uint32_t>::max();
  constexpr int64_t kI64 = std::numeric_limits<int64_t>::max();
  for (const auto& [k, v] : t) {
    const std::string name(k.str());
    const std::string key = "limits." + name;
    ClientLimits& l = out_.limits;
    const bool wide = name == "max_cqes" || name == "max_mr_bytes";
    if (name != "max_qps" && name != "max_cqs" && name != "max_mrs" && !wide) {
      return Error(k.source(), key, "unknown key");
    }
    auto n = Integer(v, key, wide ? kI64 : kU32);
    if (!n.ok()) return n.status();
    if (name == "max_qps") l.max_qps = static_cast<uint32_t>(*n);
    if (name == "max_cqs") l.max_cqs = static_cast<uint32_t>(*n);
    if (name == "max_mrs") l.max_mrs = static_cast<uint32_t>(*n);
    if (name == "max_cqes") l.max_cqes = static_cast<uint64_t>(*n);
    if (name == "max_mr_bytes") l.max_mr_bytes = static_cast<uint64_t>(*n);
  }
  return absl::OkStatus();
}

absl::Status Parser::Engine(const toml::table& t) {
  for (const auto& [k, v] : t) {
    const std::string name(k.str());
    const std::string key = "engine." + name;
    const SettingKey* sk = nullptr;
    for (const SettingKey& e : kEngineKeys) {
      if (name == e.key) sk = &e;
    }
    if (sk == nullptr) {
      if (name == "log_level") return Error(k.source(), key, "set it in [daemon]");
      return Error(k.source(), key, "unknown key");
    }
    auto text = SettingText(v, key, sk->kind);
    if (!text.ok()) return text.status();
    if (absl::Status st = CheckSetting(v, key, sk->setting, *text); !st.ok()) return st;
    out_.settings[static_cast<size_t>(sk->setting)] = *text;
    where_[static_cast<size_t>(sk->setting)] = v.source();
  }
  return absl::OkStatus();
}

absl::Status Parser::Devices(const toml::node& node) {
  const auto* devices = node.as_array();
  if (devices == nullptr || !devices->is_array_of_tables()) {
    return Error(node.source(), "device", "expected [[device]] tables, one per device");
  }
  if (devices->size() > static_cast<size_t>(config::kMaxDevices)) {
    return Error((*devices)[config::kMaxDevices].source(), "device",
                 absl::StrCat(devices->size(), " devices, at most ", config::kMaxDevices));
  }
  // entries[setting][device]: the per-device lists, joined below.
  std::array<std::vector<std::string>, config::kNumSettings> entries;
  for (auto& e : entries) e.resize(devices->size());
  for (size_t i = 0; i < devices->size(); ++i) {
    const toml::table& t = *(*devices)[i].as_table();
    for (const auto& [k, v] : t) {
      const std::string name(k.str());
      const std::string key = "device." + name;
      const SettingKey* sk = nullptr;
      for (const SettingKey& e : kDeviceKeys) {
        if (name == e.key) sk = &e;
      }
      if (sk == nullptr) {
        for (const SettingKey& e : kEngineKeys) {
          if (name == e.key) {
            return Error(k.source(), key,
                         config::EveryOrEachDevice(e.setting)
                             ? "set it in [engine]: one value for every device, or a ';' list with one entry per device"
                             : "one value for every device (the engine has one): set it in [engine]");
          }
        }
        return Error(k.source(), key, "unknown key");
      }
      auto text = SettingText(v, key, sk->kind);
      if (!text.ok()) return text.status();
      if (sk->setting == Setting::kLink) {
        // An empty link is the internal loopback, as an empty DROCE_LINK
        // entry; only ';' would break the list.
        if (text->find(';') != std::string::npos) {
          return Error(v.source(), key, absl::StrCat("'", *text, "' has a ';': one [[device]] table per device"));
        }
      } else if (absl::Status st = CheckSetting(v, key, sk->setting, *text); !st.ok()) {
        return st;
      }
      entries[static_cast<size_t>(sk->setting)][i] = *text;
      where_[static_cast<size_t>(sk->setting)] = v.source();
    }
  }
  // DROCE_LINK drops trailing empty entries ("a;" is one device): a last
  // device on the loopback link after others cannot be said in it.
  const auto& links = entries[static_cast<size_t>(Setting::kLink)];
  if (links.size() > 1 && links.back().empty()) {
    return Error((*devices)[devices->size() - 1].source(), "device.link",
                 "the last of several devices needs a link (only a device before others can be the internal "
                 "loopback link)");
  }
  for (const SettingKey& e : kDeviceKeys) {
    const auto& list = entries[static_cast<size_t>(e.setting)];
    std::string joined = absl::StrJoin(list, ";");
    // "" entries are the device's default; an all-default list is unset.
    if (joined.find_first_not_of(';') == std::string::npos) joined.clear();
    out_.settings[static_cast<size_t>(e.setting)] = joined;
  }
  return absl::OkStatus();
}

absl::StatusOr<FileConfig> Parser::Run(std::string_view text) {
  toml::table root;
  try {
    root = toml::parse(text, path_);
  } catch (const toml::parse_error& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ":", e.source().begin.line, ": syntax error: ", std::string(e.description())));
  }
  for (const auto& [k, v] : root) {
    const std::string name(k.str());
    absl::Status st;
    if (name == "device") {
      st = Devices(v);
    } else if (name == "daemon" || name == "limits" || name == "engine") {
      const toml::table* t = v.as_table();
      if (t == nullptr) {
        st = Error(v.source(), name, absl::StrCat("expected a [", name, "] table, got ", TypeName(v.type())));
      } else if (name == "daemon") {
        st = Daemon(*t);
      } else if (name == "limits") {
        st = Limits(*t);
      } else {
        st = Engine(*t);
      }
    } else {
      st = Error(k.source(), name, v.is_table() ? "unknown section" : "unknown key");
    }
    if (!st.ok()) return st;
  }
  // The settings together, as the engine will check them (the gateway on
  // every port's subnet, with the file's addresses).
  config::SettingError err;
  if (!config::ParseSettings(out_.settings, cpus_, &err).ok()) {
    const config::SettingInfo& info = config::Info(err.setting);
    std::string key;
    for (const SettingKey& e : kEngineKeys) {
      if (e.setting == err.setting) key = absl::StrCat("engine.", e.key);
    }
    for (const SettingKey& e : kDeviceKeys) {
      if (e.setting == err.setting) key = absl::StrCat("device.", e.key);
    }
    if (err.setting == Setting::kLogLevel) key = "daemon.log_level";
    if (key.empty()) key = info.var;
    return Error(where_[static_cast<size_t>(err.setting)], key, err.reason);
  }
  return std::move(out_);
}

}  // namespace

absl::StatusOr<FileConfig> ParseConfigFile(std::string_view text, const std::string& path,
                                           const config::CpuSet& cpus) {
  Parser p(path, cpus);
  return p.Run(text);
}

absl::StatusOr<FileConfig> LoadConfigFile(const std::string& path, const config::CpuSet& cpus) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": cannot read: ", std::strerror(errno)));
  return ParseConfigFile(text.str(), path, cpus);
}

absl::StatusOr<mode_t> ParseSocketMode(const std::string& s) {
  if (s.empty() || s.size() > 4 || s.find_first_not_of("01234567") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not an octal mode (e.g. 0660)"));
  }
  return static_cast<mode_t>(std::stoul(s, nullptr, 8));
}

absl::StatusOr<gid_t> ResolveGroup(const std::string& s) {
  if (s.empty()) return absl::InvalidArgumentError("an empty group name");
  std::vector<char> buf(16384);
  group g{};
  group* found = nullptr;
  uint32_t gid = 0;
  int rc = 0;
  if (s.find_first_not_of("0123456789") == std::string::npos) {
    if (!absl::SimpleAtoi(s, &gid)) return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not a group"));
    rc = getgrgid_r(gid, &g, buf.data(), buf.size(), &found);
    // A number names a group even without an entry in the group database.
    if (found == nullptr && rc == 0) return static_cast<gid_t>(gid);
  } else {
    rc = getgrnam_r(s.c_str(), &g, buf.data(), buf.size(), &found);
  }
  if (found == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("no group '", s, "'", rc != 0 ? absl::StrCat(" (", std::strerror(rc), ")") : ""));
  }
  return found->gr_gid;
}

absl::StatusOr<uint16_t> ParseMetricsPort(const std::string& s) {
  uint32_t v = 0;
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || !absl::SimpleAtoi(s, &v) ||
      v > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not a port (0 to 65535)"));
  }
  return static_cast<uint16_t>(v);
}

absl::Status CheckMetricsAddress(const std::string& s) {
  in_addr a{};
  if (inet_pton(AF_INET, s.c_str(), &a) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("'", s, "' is not an IPv4 address"));
  }
  return absl::OkStatus();
}

}  // namespace droce::daemon
