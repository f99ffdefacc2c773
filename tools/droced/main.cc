// droced: one engine process that owns droce's links and serves many
// unmodified verbs programs (libdroce.so in client mode). Links are given as
// the launcher gives them (--link, --ip, --ip6, --mtu, --workers, ...: the
// DROCE_* settings, same syntax, same parser); --socket names the control
// socket (default /run/droce/droced.sock). Runs in the foreground; SIGTERM
// or SIGINT stops it cleanly.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "config/settings.h"
#include "daemon/server.h"
#include "engine/device.h"
#include "io/dpdk_port.h"

namespace {

constexpr int kExitUsage = 2;

droce::daemon::Server* g_server = nullptr;

void OnSignal(int) {
  if (g_server != nullptr) g_server->Stop();
}

int Usage(const std::string& msg) {
  std::fprintf(stderr, "droced: %s\n", msg.c_str());
  return kExitUsage;
}

constexpr std::string_view kHelp =
    "usage: droced [--socket PATH] [--link DEVARGS] [--ip A.B.C.D/N] [--ip6 ADDR/N] [--mtu N]\n"
    "              [--workers N] [--worker-cpu N] [--mac MAC] [--gateway A] [--vlan N] [--log-level L] ...\n"
    "Every option but --socket is a DROCE_* setting with the same syntax (docs/CONFIG.md);\n"
    "';'-separated lists give several devices. Default socket: /run/droce/droced.sock.\n";

}  // namespace

int main(int argc, char** argv) {
  std::string socket_path = droce::daemon::kDefaultSocket;
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
    if (name == "socket") {
      socket_path = value;
      continue;
    }
    const droce::config::SettingInfo* info = nullptr;
    for (const auto& s : droce::config::kSettings) {
      if (s.flag != nullptr && name == s.flag) info = &s;
    }
    if (info == nullptr) return Usage("unknown option '--" + name + "' (see droced --help)");
    setenv(info->var, value.c_str(), 1);
  }
  // The daemon is the engine: it must not itself be a client of a daemon.
  unsetenv("DROCE_DAEMON");
  auto cfg = droce::engine::Device::CheckConfig();
  if (!cfg.ok()) return Usage(std::string(cfg.status().message()));
  if (socket_path == droce::daemon::kDefaultSocket) mkdir("/run/droce", 0755);

  // A droced that was killed (or any droce process that was) left its EAL
  // runtime directory; a restart should not add to them.
  if (const int n = droce::io::SweepStaleEalRuntimeDirs(); n > 0) {
    std::fprintf(stderr, "droced: removed %d stale DPDK runtime director%s\n", n, n == 1 ? "y" : "ies");
  }
  std::vector<droce::engine::Device*> devices;
  for (int i = 0; i < droce::engine::Device::Count(); ++i) {
    auto d = droce::engine::Device::Instance(i);
    if (!d.ok()) {
      std::fprintf(stderr, "droced: droce%d: %s\n", i, std::string(d.status().message()).c_str());
      return 1;
    }
    devices.push_back(*d);
  }
  droce::daemon::ServerOptions opt;
  opt.socket_path = socket_path;
  droce::daemon::Server server(devices, opt);
  if (absl::Status s = server.Listen(); !s.ok()) {
    std::fprintf(stderr, "droced: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  g_server = &server;
  struct sigaction sa{};
  sa.sa_handler = OnSignal;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  std::fprintf(stderr, "droced: %zu device%s, listening on %s\n", devices.size(), devices.size() == 1 ? "" : "s",
               socket_path.c_str());
  server.Run();
  std::fprintf(stderr, "droced: stopped (%s)\n", server.StatusLine().c_str());
  g_server = nullptr;
  // The engine's threads live until exit; leave without running their
  // destructors under them (nor the atexit handlers: what they would remove
  // goes here).
  droce::io::RemoveEalRuntimeDir();
  std::fflush(stderr);
  _exit(0);
}
