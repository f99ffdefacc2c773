// droced: one engine process that owns droce's links and serves many
// unmodified verbs programs (libdroce.so in client mode). Its configuration
// file (--config FILE, else /etc/droce/droced.toml if present; TOML,
// daemon/config_file.h) names the socket, the limits and the devices; flags
// override it: --link, --ip, --ip6, --mtu, --workers, ... are the DROCE_*
// settings with the launcher's syntax and parser, --socket, --socket-group,
// --socket-mode, --metrics-address, --metrics-port the daemon's own. Runs in
// the foreground; tells systemd when it is ready (sd_notify, Type=notify);
// SIGTERM or SIGINT stops it cleanly.
#include <signal.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "config/settings.h"
#include "daemon/config_file.h"
#include "daemon/server.h"
#include "engine/device.h"
#include "io/dpdk_port.h"

namespace {

constexpr int kExitUsage = 2;

droce::daemon::Server* g_server = nullptr;

void OnSignal(int) {
  if (g_server != nullptr) g_server->Stop();
}

void Say(droce::LogLevel level, const std::string& msg) { droce::LogLine("droced", level, msg); }

int Usage(const std::string& msg) {
  Say(droce::LogLevel::kError, msg);
  return kExitUsage;
}

constexpr std::string_view kHelp =
    "usage: droced [--config FILE] [--socket PATH] [--socket-group GROUP] [--socket-mode MODE]\n"
    "              [--metrics-address A] [--metrics-port N]\n"
    "              [--link DEVARGS] [--ip A.B.C.D/N] [--ip6 ADDR/N] [--mtu N] [--workers N]\n"
    "              [--worker-cpu N] [--mac MAC] [--gateway A] [--vlan N] [--log-level L]\n"
    "              [--fault RULES] ...\n"
    "The configuration file (default /etc/droce/droced.toml, read if present) is TOML;\n"
    "flags override it. Every setting flag is a DROCE_* setting with the same syntax\n"
    "(docs/CONFIG.md); ';'-separated lists give several devices.\n"
    "Default socket: /run/droce/droced.sock.\n";

// The daemon's own flags (the others are DROCE_* settings).
struct DaemonFlags {
  std::optional<std::string> config, socket, socket_group, socket_mode, metrics_address, metrics_port;
};

std::optional<std::string>* DaemonFlag(DaemonFlags& f, const std::string& name) {
  if (name == "config") return &f.config;
  if (name == "socket") return &f.socket;
  if (name == "socket-group") return &f.socket_group;
  if (name == "socket-mode") return &f.socket_mode;
  if (name == "metrics-address") return &f.metrics_address;
  if (name == "metrics-port") return &f.metrics_port;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  DaemonFlags flags;
  std::map<std::string, std::string> setting_flags;  // DROCE_* variable → value
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kHelp.data(), stdout);
      return 0;
    }
    if (!a.starts_with("--")) return Usage("unexpected argument '" + a + "' (see droced --help)");
    std::string name = a.substr(2), value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    } else {
      if (i + 1 >= argc) return Usage("option '--" + name + "' requires a value");
      value = argv[++i];
    }
    if (value.empty()) return Usage("--" + name + " must not be empty");
    if (std::optional<std::string>* f = DaemonFlag(flags, name)) {
      *f = value;
      continue;
    }
    const droce::config::SettingInfo* info = nullptr;
    for (const auto& s : droce::config::kSettings) {
      if (s.flag != nullptr && name == s.flag) info = &s;
    }
    if (info == nullptr) return Usage("unknown option '--" + name + "' (see droced --help)");
    setting_flags[info->var] = value;
  }

  // The file first (a --config that cannot be read is an error; the
  // default one only if it exists), then the flags over it. Its settings
  // override DROCE_* variables inherited from the environment.
  droce::daemon::FileConfig file;
  std::string config_path = flags.config.value_or(droce::daemon::kDefaultConfigFile);
  if (flags.config.has_value() || access(config_path.c_str(), F_OK) == 0) {
    auto f = droce::daemon::LoadConfigFile(config_path, droce::config::AllowedCpus());
    if (!f.ok()) return Usage(std::string(f.status().message()));
    file = *std::move(f);
  } else {
    config_path.clear();
  }
  for (const auto& info : droce::config::kSettings) {
    const std::string& v = file.settings[static_cast<size_t>(info.setting)];
    if (!v.empty()) setenv(info.var, v.c_str(), 1);
  }
  for (const auto& [var, value] : setting_flags) setenv(var.c_str(), value.c_str(), 1);

  droce::daemon::ServerOptions opt;
  opt.socket_path = flags.socket.value_or(file.socket.value_or(droce::daemon::kDefaultSocket));
  opt.socket_group = flags.socket_group.value_or(file.socket_group.value_or(""));
  if (flags.socket_group.has_value()) {
    if (auto g = droce::daemon::ResolveGroup(*flags.socket_group); !g.ok()) {
      return Usage("--socket-group: " + std::string(g.status().message()));
    }
  }
  opt.socket_mode = file.socket_mode.value_or(opt.socket_mode);
  if (flags.socket_mode.has_value()) {
    auto m = droce::daemon::ParseSocketMode(*flags.socket_mode);
    if (!m.ok()) return Usage("--socket-mode: " + std::string(m.status().message()));
    opt.socket_mode = *m;
  }
  opt.metrics_address = flags.metrics_address.value_or(file.metrics_address.value_or(opt.metrics_address));
  if (flags.metrics_address.has_value()) {
    if (absl::Status s = droce::daemon::CheckMetricsAddress(*flags.metrics_address); !s.ok()) {
      return Usage("--metrics-address: " + std::string(s.message()));
    }
  }
  opt.metrics_port = file.metrics_port.value_or(opt.metrics_port);
  if (flags.metrics_port.has_value()) {
    auto p = droce::daemon::ParseMetricsPort(*flags.metrics_port);
    if (!p.ok()) return Usage("--metrics-port: " + std::string(p.status().message()));
    opt.metrics_port = *p;
  }
  opt.limits = file.limits;
  opt.on_stopping = [] { sd_notify(0, "STOPPING=1\nSTATUS=stopping: clients are told DEVICE_FATAL"); };

  // The daemon is the engine: it must not itself be a client of a daemon.
  unsetenv("DROCE_DAEMON");
  // A setting refused is named as the flag that gave it (the file's were
  // checked with their lines), else as its variable.
  droce::config::SettingError bad;
  if (!droce::config::ParseSettings(droce::config::RawSettingsFromEnv(), droce::config::AllowedCpus(), &bad).ok()) {
    const droce::config::SettingInfo& info = droce::config::Info(bad.setting);
    if (setting_flags.contains(info.var)) return Usage(absl::StrCat("--", info.flag, ": ", bad.reason));
  }
  auto cfg = droce::engine::Device::CheckConfig();
  if (!cfg.ok()) return Usage(std::string(cfg.status().message()));
  // systemd makes /run/droce (RuntimeDirectory=droce); by hand, droced does.
  if (opt.socket_path.starts_with("/run/droce/")) mkdir("/run/droce", 0755);

  // A droced that was killed (or any droce process that was) left its EAL
  // runtime directory; a restart should not add to them.
  if (const int n = droce::io::SweepStaleEalRuntimeDirs(); n > 0) {
    std::fprintf(stderr, "droced: removed %d stale DPDK runtime director%s\n", n, n == 1 ? "y" : "ies");
  }
  std::vector<droce::engine::Device*> devices;
  for (int i = 0; i < droce::engine::Device::Count(); ++i) {
    auto d = droce::engine::Device::Instance(i);
    if (!d.ok()) {
      Say(droce::LogLevel::kError, absl::StrCat("droce", i, ": ", d.status().message()));
      return 1;
    }
    devices.push_back(*d);
  }
  const std::string socket_path = opt.socket_path;
  droce::daemon::Server server(devices, std::move(opt));
  if (absl::Status s = server.Listen(); !s.ok()) {
    Say(droce::LogLevel::kError, std::string(s.message()));
    return 1;
  }
  g_server = &server;
  struct sigaction sa{};
  sa.sa_handler = OnSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  const std::string status =
      absl::StrCat(devices.size(), " device", devices.size() == 1 ? "" : "s", ", listening on ", socket_path,
                   config_path.empty() ? "" : absl::StrCat(" (configuration ", config_path, ")"));
  Say(droce::LogLevel::kInfo, status);
  if (server.metrics_port() != 0) {
    Say(droce::LogLevel::kInfo,
        absl::StrCat("metrics on http://", server.options().metrics_address, ":", server.metrics_port(), "/metrics"));
  }
  // The devices are up (Instance waited for their links) and the socket
  // listens: clients may come.
  sd_notify(0, absl::StrCat("READY=1\nSTATUS=", status).c_str());
  server.Run();
  // What DROCE_FAULT's rules did (docs/LAB.md), as a program's DROCE_STATS
  // report gives it at close.
  for (droce::engine::Device* d : devices) {
    for (const std::string& line : d->FaultReport()) Say(droce::LogLevel::kInfo, absl::StrCat(d->port().name, " ", line));
  }
  Say(droce::LogLevel::kInfo, absl::StrCat("stopped (", server.StatusLine(), ")"));
  g_server = nullptr;
  // The engine's threads live until exit; leave without running their
  // destructors under them (nor the atexit handlers: what they would remove
  // goes here).
  droce::io::RemoveEalRuntimeDir();
  std::fflush(stderr);
  _exit(0);
}
