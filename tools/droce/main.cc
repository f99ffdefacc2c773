// droce: launcher for the droce userspace RoCEv2 verbs provider.
//
//   droce exec [flags] -- PROGRAM [ARGS...]   run PROGRAM with libdroce.so preloaded
//   droce demo [--iters N] [--size B] [--timeout S] [--workers N]
//                                             ibv_rc_pingpong server+client over memif
//   droce ctl [-j] OBJECT [show ...]          droce's `rdma`: devices, links, resources,
//                                             counters and clients of a running engine
//   droce version | help
//
// The launcher does not link DPDK or libibverbs: it only validates flags, turns
// them into DROCE_* environment variables, prepends the provider to LD_PRELOAD
// and execs the program. It validates with the engine's own parser
// (config/settings.h), so what it accepts the provider accepts. See
// docs/CONFIG.md.

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <charconv>
#include <cstdarg>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "config/settings.h"
#include "ctl.h"
#include "lab/trace.h"
#include "cc_scenario.h"
#include "pcap_check.h"

#ifndef DROCE_VERSION
#define DROCE_VERSION "unknown"
#endif
#ifndef DROCE_PROVIDER_INSTALL_PATH
#define DROCE_PROVIDER_INSTALL_PATH "/usr/local/lib/libdroce.so.0"
#endif

namespace fs = std::filesystem;

namespace {

constexpr int kExitUsage = 2;

// ---------------------------------------------------------------------------
// Small string helpers (std only: Debian's absl has its own string_view).

void AppendPiece(std::string& out, std::string_view v) { out.append(v); }
void AppendPiece(std::string& out, const char* v) { out.append(v); }
void AppendPiece(std::string& out, const std::string& v) { out.append(v); }
template <typename T>
  requires std::is_integral_v<T>
void AppendPiece(std::string& out, T v) {
  out.append(std::to_string(v));
}

template <typename... Args>
std::string StrCat(const Args&... args) {
  std::string out;
  (AppendPiece(out, args), ...);
  return out;
}

[[gnu::format(printf, 1, 2)]] std::string StrFormat(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  va_list ap2;
  va_copy(ap2, ap);
  int n = vsnprintf(nullptr, 0, fmt, ap);
  va_end(ap);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) vsnprintf(out.data(), out.size() + 1, fmt, ap2);
  va_end(ap2);
  return out;
}

// Splits on any of `seps`; empty pieces are dropped if skip_empty.
std::vector<std::string_view> Split(std::string_view s, std::string_view seps,
                                    bool skip_empty) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (;;) {
    size_t pos = s.find_first_of(seps, start);
    std::string_view piece = s.substr(start, pos == std::string_view::npos ? pos : pos - start);
    if (!piece.empty() || !skip_empty) out.push_back(piece);
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

std::string Join(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i != 0) out.append(sep);
    out.append(v[i]);
  }
  return out;
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Parses a non-empty string of decimal digits (no sign, no spaces).
bool ParseDecimal(std::string_view s, long& out) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsDigit(c)) return false;
  }
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && ptr == s.data() + s.size();
}

constexpr std::string_view kUsage =
    "usage: droce <command> [options]\n"
    "\n"
    "commands:\n"
    "  exec [options] -- PROGRAM [ARGS...]\n"
    "        run PROGRAM with the droce verbs provider (libdroce.so) preloaded\n"
    "        --link DEVARGS        DPDK vdev devargs of the link (DROCE_LINK),\n"
    "                              e.g. net_memif0,role=server,socket=/tmp/m.sock,socket-abstract=no;\n"
    "                              default: internal loopback link\n"
    "        --ip ADDR[/PREFIX]    IPv4 address of the port (DROCE_IP), default 10.77.0.1/24\n"
    "        --mtu N               path MTU cap: 256 512 1024 2048 4096 (DROCE_MTU), default 1024\n"
    "        --mac xx:xx:xx:xx:xx:xx  MAC address (DROCE_MAC), default derived from the IP\n"
    "        --log-level LEVEL     error warning info debug (DROCE_LOG_LEVEL), default error\n"
    "        --gateway ADDR        next hop off the subnet, an address on it (DROCE_GATEWAY)\n"
    "        --vlan ID[:PCP]       802.1Q tag on every frame (DROCE_VLAN)\n"
    "        --ip6 ADDR[/LEN]      IPv6 address: GID index 1, ND, ping6 (DROCE_IP6)\n"
    "        --hugepages MODE      auto on off (DROCE_HUGEPAGES), default auto\n"
    "        --progress MODE       app thread (DROCE_PROGRESS), default app\n"
    "        --workers N           worker threads per device, 1 to 16 (DROCE_WORKERS), default 1\n"
    "        --worker-cpu CPUS     pin the worker threads to CPUS, e.g. 2 or 2,3: worker i on\n"
    "                              the (i mod count)-th CPU of the list (DROCE_WORKER_CPU)\n"
    "        --fault RULES         fault injection on the link, e.g. 'loss random 1%; delay 1ms'\n"
    "                              (DROCE_FAULT, docs/LAB.md)\n"
    "        --link, --ip, --ip6, --mac, --workers and --worker-cpu take one entry per device,\n"
    "        ';'-separated (one device per --link entry; no more entries than devices)\n"
    "        (--flag=value is accepted too; DROCE_PROVIDER overrides the provider path;\n"
    "        flags and DROCE_* variables are checked as the provider will check them)\n"
    "  demo [--iters N] [--size BYTES] [--timeout SECONDS] [--workers N]\n"
    "        run an unmodified ibv_rc_pingpong server and client through droce over a\n"
    "        memif link (defaults: --iters 1000 --size 4096 --timeout 60; --workers\n"
    "        is passed to both sides' exec)\n"
    "  ctl [-j] [--socket PATH | --pid PID] OBJECT [show ...]\n"
    "        what a running droced (or a program run with DROCE_CTL=1) has: dev, link,\n"
    "        res qp|cq|mr|pd, stat, client show|kill, metrics (see 'droce ctl help')\n"
    "  pcap-check [-v] FILE...\n"
    "        check every RoCEv2 packet of pcap/pcapng captures (headers, ICRC)\n"
    "  cc-scenario [--scenario converge|incast|mixed] [--flows N] [--seed N] [--csv FILE] [--png FILE] ...\n"
    "        a congestion-control experiment in virtual time: real droce QPs with DCQCN\n"
    "        through one congested switch port (see 'droce cc-scenario --help', docs/LAB.md)\n"
    "  trace-dump [--csv|--json] FILE\n"
    "        print a binary event trace (DROCE_TRACE=FILE,format=binary) as JSON lines\n"
    "        (the default) or CSV\n"
    "  version\n"
    "        print the version\n"
    "  help\n"
    "        print this help\n";

// Prints "droce: <msg>" as one line on stderr and returns kExitUsage.
[[nodiscard]] int UsageError(std::string_view msg) {
  std::string line = StrCat("droce: ", msg, "\n");
  // Guarantee a single line whatever the message contains.
  for (size_t i = 0; i + 1 < line.size(); ++i) {
    if (line[i] == '\n' || line[i] == '\r') line[i] = ' ';
  }
  fputs(line.c_str(), stderr);
  return kExitUsage;
}

// ---------------------------------------------------------------------------
// Provider lookup

std::optional<fs::path> SelfExe() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  if (ec) return std::nullopt;
  return p;
}

bool IsRegularFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);
}

// Finds libdroce.so; on failure prints a one-line error and returns nullopt.
std::optional<std::string> FindProvider() {
  const char* env = getenv("DROCE_PROVIDER");
  if (env != nullptr && *env != '\0') {
    if (!IsRegularFile(env)) {
      (void)UsageError(StrCat("DROCE_PROVIDER=", env, " does not exist or is not a file"));
      return std::nullopt;
    }
    std::error_code ec;
    fs::path abs = fs::absolute(env, ec);
    return ec ? std::string(env) : abs.lexically_normal().string();
  }
  std::vector<fs::path> candidates;
  if (std::optional<fs::path> exe = SelfExe()) {
    fs::path dir = exe->parent_path();
    candidates.push_back(dir / ".." / ".." / "providers" / "libdroce.so");  // build tree
    // (A build directory made before the library had a soname version can
    // lose its libdroce.so link when ninja cleans the old output away.)
    candidates.push_back(dir / ".." / ".." / "providers" / "libdroce.so.0");
    candidates.push_back(dir / ".." / "lib" / "libdroce.so.0");             // install tree
  }
  candidates.emplace_back(DROCE_PROVIDER_INSTALL_PATH);
  for (const fs::path& c : candidates) {
    if (IsRegularFile(c)) {
      // The directory made canonical, the name kept: LD_PRELOAD names
      // libdroce.so(.0) as found, not the versioned file it links to.
      std::error_code ec;
      fs::path dir = fs::canonical(c.parent_path(), ec);
      return ec ? c.lexically_normal().string() : (dir / c.filename()).string();
    }
  }
  std::vector<std::string> tried;
  for (const fs::path& c : candidates) tried.push_back(c.lexically_normal().string());
  (void)UsageError(StrCat("cannot find the provider libdroce.so (tried ",
                                Join(tried, ", "),
                                "); build it or set DROCE_PROVIDER"));
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// droce exec

struct ExecOptions {
  // The settings given as flags, by droce::config::Setting; unset: the
  // variable in the environment (if any) is passed through.
  std::array<std::optional<std::string>, droce::config::kNumSettings> flags;
  std::vector<std::string> program;  // PROGRAM [ARGS...]
  std::optional<std::string> daemon;  // --daemon SOCKET
};

// The setting whose flag is --name, or nullptr.
const droce::config::SettingInfo* SettingOfFlag(std::string_view name) {
  for (const droce::config::SettingInfo& info : droce::config::kSettings) {
    if (info.flag != nullptr && name == info.flag) return &info;
  }
  return nullptr;
}

// Checks the settings the program will run with: the flags over the DROCE_*
// variables already in the environment, by the parser the provider uses, so
// that anything the provider would refuse is refused here. The error names
// the flag if the bad value came from one, else the variable.
int ValidateSettings(const ExecOptions& opt) {
  using droce::config::Info;
  droce::config::RawSettings raw = droce::config::RawSettingsFromEnv();
  for (size_t i = 0; i < opt.flags.size(); ++i) {
    if (!opt.flags[i]) continue;
    const droce::config::SettingInfo& info = droce::config::kSettings[i];
    // For the provider an empty variable means unset; an empty flag is far
    // more likely an empty shell variable than a wish for the default.
    if (opt.flags[i]->empty()) {
      return UsageError(StrCat("exec: --", info.flag, " must not be empty (leave the flag out for the default)"));
    }
    raw[i] = *opt.flags[i];
  }
  droce::config::SettingError error;
  if (!droce::config::ParseSettings(raw, droce::config::AllowedCpus(), &error).ok()) {
    const droce::config::SettingInfo& info = Info(error.setting);
    const std::string name =
        opt.flags[static_cast<size_t>(error.setting)] ? StrCat("--", info.flag) : std::string(info.var);
    return UsageError(StrCat("exec: ", name, ": ", error.reason));
  }
  return 0;
}

// Parses `exec` arguments (everything after the word "exec"). Returns 0 on
// success, otherwise the exit status after printing a one-line error.
int ParseExec(const std::vector<std::string>& args, ExecOptions& opt, bool& help) {
  help = false;
  bool saw_dashdash = false;
  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      saw_dashdash = true;
      ++i;
      break;
    }
    if (a == "-h" || a == "--help") {
      help = true;
      return 0;
    }
    if (!a.starts_with("--")) {
      return UsageError(StrCat("exec: expected '--' before PROGRAM, got '", a,
                                     "' (usage: droce exec [options] -- PROGRAM [ARGS...])"));
    }
    std::string name = a.substr(2);
    std::optional<std::string> value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    const droce::config::SettingInfo* setting = SettingOfFlag(name);
    if (setting == nullptr && name != "daemon") {
      return UsageError(StrCat("exec: unknown option '--", name, "' (see 'droce help')"));
    }
    if (!value) {
      if (i + 1 >= args.size() || args[i + 1] == "--") {
        return UsageError(StrCat("exec: option '--", name, "' requires a value"));
      }
      value = args[++i];
    }
    if (setting == nullptr) {
      if (value->empty()) return UsageError("exec: --daemon must not be empty");
      opt.daemon = std::move(*value);
      continue;
    }
    opt.flags[static_cast<size_t>(setting->setting)] = std::move(*value);
  }
  if (!saw_dashdash) {
    return UsageError("exec: missing '-- PROGRAM' (usage: droce exec [options] -- PROGRAM [ARGS...])");
  }
  if (i >= args.size() || args[i].empty()) {
    return UsageError("exec: missing PROGRAM after '--' (usage: droce exec [options] -- PROGRAM [ARGS...])");
  }
  opt.program.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (opt.daemon) {
    // The daemon owns the links and their addresses.
    using droce::config::Setting;
    for (Setting s : {Setting::kLink, Setting::kIp, Setting::kIp6, Setting::kMac, Setting::kWorkers,
                      Setting::kWorkerCpu, Setting::kMtu, Setting::kGateway, Setting::kVlan, Setting::kFault,
                      Setting::kCapture, Setting::kTrace, Setting::kRate, Setting::kCc, Setting::kDcqcn,
                      Setting::kSr, Setting::kAdpRetrans}) {
      if (opt.flags[static_cast<size_t>(s)]) {
        return UsageError(StrCat("exec: --", droce::config::Info(s).flag,
                                 " cannot be used with --daemon: droced owns the link (give it to droced)"));
      }
    }
  }

  return ValidateSettings(opt);
}

int CmdExec(const std::vector<std::string>& args) {
  ExecOptions opt;
  bool help = false;
  if (int rc = ParseExec(args, opt, help); rc != 0) return rc;
  if (help) {
    fputs(kUsage.data(), stdout);
    return 0;
  }
  std::optional<std::string> provider = FindProvider();
  if (!provider) return kExitUsage;
  if (provider->find_first_of(": \t\n") != std::string::npos) {
    return UsageError(StrCat("provider path '", *provider,
                                   "' contains ':' or whitespace and cannot be used in LD_PRELOAD"));
  }

  for (size_t i = 0; i < opt.flags.size(); ++i) {
    if (opt.flags[i]) setenv(droce::config::kSettings[i].var, opt.flags[i]->c_str(), 1);
  }
  if (opt.daemon) setenv("DROCE_DAEMON", opt.daemon->c_str(), 1);

  // Prepend the provider, keep the other entries (dropping a duplicate of it).
  std::vector<std::string> preload = {*provider};
  if (const char* old = getenv("LD_PRELOAD"); old != nullptr) {
    for (std::string_view e : Split(old, ": \t", true)) {
      if (e != *provider) preload.emplace_back(e);
    }
  }
  setenv("LD_PRELOAD", Join(preload, ":").c_str(), 1);

  std::vector<char*> argv;
  argv.reserve(opt.program.size() + 1);
  for (std::string& s : opt.program) argv.push_back(s.data());
  argv.push_back(nullptr);
  fflush(stdout);
  execvp(argv[0], argv.data());
  int err = errno;
  (void)UsageError(StrCat("cannot execute '", opt.program[0], "': ", strerror(err)));
  return err == ENOENT ? 127 : 126;
}

// ---------------------------------------------------------------------------
// droce demo

volatile sig_atomic_t g_signal = 0;
int g_wake_pipe[2] = {-1, -1};

void OnSignal(int sig) {
  g_signal = sig;
  if (g_wake_pipe[1] >= 0) {
    int saved = errno;
    ssize_t r = write(g_wake_pipe[1], "x", 1);
    (void)r;
    errno = saved;
  }
}

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

bool FindInPath(const std::string& prog) {
  if (prog.find('/') != std::string::npos) return access(prog.c_str(), X_OK) == 0;
  const char* path = getenv("PATH");
  if (path == nullptr) path = "/usr/local/bin:/usr/bin:/bin";
  for (std::string_view d : Split(path, ":", true)) {
    std::string full = StrCat(d, "/", prog);
    if (access(full.c_str(), X_OK) == 0) return true;
  }
  return false;
}

// Returns a TCP port that is currently free on 127.0.0.1, or 0.
int FindFreeTcpPort() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  int port = 0;
  socklen_t len = sizeof(addr);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

// True if some socket is in LISTEN state on `port` (IPv4 or IPv6). Reading
// /proc avoids probing the port with a connect, which rc_pingpong's server
// would accept as its one and only client.
bool TcpPortListening(int port) {
  std::string want = StrFormat(":%04X", port);
  for (const char* file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(file);
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::vector<std::string_view> f =
          Split(line, " \t", true);
      if (f.size() < 4) continue;
      if (f[1].ends_with(want) && f[3] == "0A") return true;
    }
  }
  return false;
}

struct Child {
  explicit Child(std::string n) : name(n), prefix("[" + n + "] ") {}
  std::string name;    // "server" / "client"
  std::string prefix;  // "[server] "
  pid_t pid = -1;      // also the process group id
  int out_fd = -1;     // read end of the stdout+stderr pipe
  std::string partial; // incomplete last line
  std::string captured;
  bool running = false;
  int status = -1;     // exit status; 128+sig when signalled
  Clock::time_point started;
};

void EmitLine(const Child& c, std::string_view line) {
  std::string out = StrCat(c.prefix, line, "\n");
  fwrite(out.data(), 1, out.size(), stdout);
  fflush(stdout);
}

void Note(std::string_view msg) {
  std::string out = StrCat("[droce] ", msg, "\n");
  fwrite(out.data(), 1, out.size(), stdout);
  fflush(stdout);
}

// Reads what is available from the child's pipe; prints complete lines.
void DrainChild(Child& c, bool final_flush) {
  if (c.out_fd < 0) return;
  char buf[4096];
  for (;;) {
    ssize_t n = read(c.out_fd, buf, sizeof(buf));
    if (n > 0) {
      c.partial.append(buf, static_cast<size_t>(n));
      c.captured.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = c.partial.find('\n')) != std::string::npos) {
        EmitLine(c, std::string_view(c.partial).substr(0, nl));
        c.partial.erase(0, nl + 1);
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) {
      close(c.out_fd);
      c.out_fd = -1;
      final_flush = true;
    }
    break;
  }
  if (final_flush && !c.partial.empty()) {
    EmitLine(c, c.partial);
    c.partial.clear();
  }
}

// Starts `self exec ARGS...` in a new process group with stdout+stderr piped.
bool SpawnChild(Child& c, const std::string& self, const std::vector<std::string>& args) {
  if (c.out_fd >= 0) {  // a previous attempt's pipe
    close(c.out_fd);
    c.out_fd = -1;
  }
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return false;
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return false;
  }
  if (pid == 0) {
    setpgid(0, 0);
    struct sigaction sa{};
    sa.sa_handler = SIG_DFL;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGPIPE}) sigaction(sig, &sa, nullptr);
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0) {
      dup2(devnull, STDIN_FILENO);
      close(devnull);
    }
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    std::vector<std::string> full = {self};
    full.insert(full.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& s : full) argv.push_back(s.data());
    argv.push_back(nullptr);
    execv(self.c_str(), argv.data());
    dprintf(STDERR_FILENO, "droce: cannot execute %s: %s\n", self.c_str(), strerror(errno));
    _exit(127);
  }
  setpgid(pid, pid);  // also done in the child; whichever runs first wins
  close(fds[1]);
  fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
  c.pid = pid;
  c.out_fd = fds[0];
  c.partial.clear();
  c.captured.clear();
  c.running = true;
  c.status = -1;
  c.started = Clock::now();
  return true;
}

// Reaps the child if it has exited. Returns true if it just exited.
bool ReapChild(Child& c) {
  if (!c.running) return false;
  int st = 0;
  pid_t r = waitpid(c.pid, &st, WNOHANG);
  if (r != c.pid) return false;
  c.running = false;
  if (WIFEXITED(st)) c.status = WEXITSTATUS(st);
  else if (WIFSIGNALED(st)) c.status = 128 + WTERMSIG(st);
  else c.status = 255;
  DrainChild(c, true);
  return true;
}

void KillChildren(std::vector<Child*> children) {
  for (Child* c : children) {
    if (c->running) kill(-c->pid, SIGTERM);
  }
  auto until = Clock::now() + std::chrono::seconds(2);
  for (;;) {
    bool any = false;
    for (Child* c : children) {
      DrainChild(*c, false);
      ReapChild(*c);
      any = any || c->running;
    }
    if (!any || Clock::now() >= until) break;
    usleep(20 * 1000);
  }
  for (Child* c : children) {
    if (c->running) {
      kill(-c->pid, SIGKILL);
      int st;
      waitpid(c->pid, &st, 0);
      c->running = false;
      c->status = 128 + SIGKILL;
      DrainChild(*c, true);
    }
  }
}

std::string DescribeStatus(int status) {
  if (status > 128) return StrCat("killed by signal ", status - 128);
  return StrCat("exit status ", status);
}

bool ParsePositive(std::string_view s, long max, long& out) {
  long v = 0;
  if (s.size() > 12 || !ParseDecimal(s, v) || v <= 0 || v > max) return false;
  out = v;
  return true;
}

int CmdDemo(const std::vector<std::string>& args) {
  long iters = 1000, size = 4096, timeout_s = 60;
  // Passed to both sides' `exec --workers`, checked here as exec would.
  std::optional<std::string> workers;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string a = args[i];
    if (a == "-h" || a == "--help") {
      fputs(kUsage.data(), stdout);
      return 0;
    }
    if (!a.starts_with("--")) {
      return UsageError(StrCat("demo: unexpected argument '", a, "' (see 'droce help')"));
    }
    std::string name = a.substr(2);
    std::optional<std::string> value;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name.resize(eq);
    }
    long* slot = nullptr;
    long max = 0;
    if (name == "iters") { slot = &iters; max = 100000000; }
    else if (name == "size") { slot = &size; max = 1L << 30; }
    else if (name == "timeout") { slot = &timeout_s; max = 86400; }
    else if (name != "workers") return UsageError(StrCat("demo: unknown option '--", name, "' (see 'droce help')"));
    if (!value) {
      if (i + 1 >= args.size()) {
        return UsageError(StrCat("demo: option '--", name, "' requires a value"));
      }
      value = args[++i];
    }
    if (slot == nullptr) {
      if (absl::StatusOr<int> w = droce::config::ParseWorkers(*value); !w.ok()) {
        return UsageError(StrCat("demo: --workers: ", std::string(w.status().message())));
      }
      workers = std::move(*value);
    } else if (!ParsePositive(*value, max, *slot)) {
      return UsageError(StrCat("demo: invalid --", name, " '", *value,
                                     "': expected a positive integer <= ", max));
    }
  }

  const std::string program = "ibv_rc_pingpong";
  if (!FindInPath(program)) {
    return UsageError("demo: ibv_rc_pingpong not found in PATH (install ibverbs-utils, see scripts/setup.sh)");
  }
  if (!FindProvider()) return kExitUsage;
  std::optional<fs::path> self = SelfExe();
  if (!self) return UsageError("demo: cannot resolve /proc/self/exe");

  int port = FindFreeTcpPort();
  if (port == 0) return UsageError("demo: cannot find a free TCP port on 127.0.0.1");
  char tmpl[] = "/tmp/droce-demo.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    return UsageError(StrCat("demo: mkdtemp failed: ", strerror(errno)));
  }
  const std::string tmpdir = tmpl;
  const std::string sock = tmpdir + "/memif.sock";

  if (pipe2(g_wake_pipe, O_CLOEXEC | O_NONBLOCK) != 0) {
    fs::remove_all(tmpdir);
    return UsageError(StrCat("demo: pipe failed: ", strerror(errno)));
  }
  struct sigaction sa{};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = 0;  // no SA_RESTART: let poll() return
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) sigaction(sig, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto exec_args = [&](const std::string& role, const std::string& ip,
                       bool client) -> std::vector<std::string> {
    std::vector<std::string> v = {
        "exec",
        "--link", StrCat("net_memif0,role=", role, ",socket=", sock, ",socket-abstract=no"),
        "--ip", ip};
    if (workers) v.insert(v.end(), {"--workers", *workers});
    v.insert(v.end(), {"--", program, "-g", "0", "-p", StrCat(port),
                       "-n", StrCat(iters), "-s", StrCat(size)});
    if (client) v.push_back("127.0.0.1");
    return v;
  };
  const std::vector<std::string> server_args = exec_args("server", "10.77.1.1/24", false);
  const std::vector<std::string> client_args = exec_args("client", "10.77.1.2/24", true);

  Note(StrFormat("%s server+client over memif (%s), TCP port %d, %ld iters of %ld bytes",
                 program.c_str(), sock.c_str(), port, iters, size));

  Child server("server");
  Child client("client");
  const Clock::time_point t0 = Clock::now();
  const auto deadline = t0 + std::chrono::seconds(timeout_s);
  // The client starts once the server listens on the TCP port (at least 0.5 s
  // after the server), or after kMaxListenWait in any case.
  constexpr double kMinClientDelay = 0.5;
  constexpr double kMaxListenWait = 5.0;
  constexpr int kMaxClientRetries = 20;
  // How long the other side may keep running once one side has exited.
  constexpr auto kPeerGrace = std::chrono::seconds(10);
  constexpr auto kPeerGraceAfterFailure = std::chrono::seconds(3);
  int client_attempts = 0;
  constexpr Clock::time_point kNever = Clock::time_point::max();
  Clock::time_point client_start_at = kNever;  // when to (re)start the client
  std::optional<Clock::time_point> peer_grace_until;
  bool timed_out = false;
  int exit_code = 1;

  if (!SpawnChild(server, self->string(), server_args)) {
    (void)UsageError(StrCat("demo: cannot start the server: ", strerror(errno)));
    fs::remove_all(tmpdir);
    return 1;
  }

  for (;;) {
    // Wait for output, a signal or the next check (at most 50 ms).
    std::vector<pollfd> pfds;
    pfds.push_back({g_wake_pipe[0], POLLIN, 0});
    if (server.out_fd >= 0) pfds.push_back({server.out_fd, POLLIN, 0});
    if (client.out_fd >= 0) pfds.push_back({client.out_fd, POLLIN, 0});
    int pr = poll(pfds.data(), pfds.size(), 50);
    (void)pr;
    char drain[64];
    while (read(g_wake_pipe[0], drain, sizeof(drain)) > 0) {
    }
    DrainChild(server, false);
    DrainChild(client, false);

    if (g_signal != 0) {
      fprintf(stderr, "droce: demo interrupted by signal %d, stopping server and client\n",
              static_cast<int>(g_signal));
      KillChildren({&server, &client});
      exit_code = 128 + g_signal;
      break;
    }
    if (Clock::now() >= deadline) {
      timed_out = true;
      KillChildren({&server, &client});
      fprintf(stderr, "droce: demo timed out after %ld s, server and client killed\n", timeout_s);
      exit_code = 1;
      break;
    }

    if (ReapChild(server)) {
      Note(StrCat("server finished: ", DescribeStatus(server.status)));
      if (client.running && !peer_grace_until) {
        peer_grace_until = Clock::now() + (server.status == 0 ? kPeerGrace : kPeerGraceAfterFailure);
      }
    }
    if (ReapChild(client)) {
      Note(StrCat("client finished: ", DescribeStatus(client.status)));
      const bool refused = client.captured.find("Couldn't connect to") != std::string::npos;
      if (client.status != 0 && refused && server.running &&
          client_attempts < kMaxClientRetries) {
        Note("server not accepting connections yet, retrying the client");
        client_start_at = Clock::now() + std::chrono::milliseconds(500);
      } else if (server.running && !peer_grace_until) {
        peer_grace_until = Clock::now() + (client.status == 0 ? kPeerGrace : kPeerGraceAfterFailure);
      }
    }

    // Start (or restart) the client.
    if (client_attempts == 0 && server.running && client_start_at == kNever) {
      double waited = SecondsSince(server.started);
      if (waited >= kMinClientDelay && (TcpPortListening(port) || waited >= kMaxListenWait)) {
        client_start_at = Clock::now();
      }
    }
    if (client_start_at != kNever && Clock::now() >= client_start_at && server.running &&
        !client.running) {
      client_start_at = kNever;
      ++client_attempts;
      if (!SpawnChild(client, self->string(), client_args)) {
        fprintf(stderr, "droce: demo: cannot start the client: %s\n", strerror(errno));
        KillChildren({&server});
        exit_code = 1;
        break;
      }
    }

    // One side is done and the other one hangs around: stop it.
    if (peer_grace_until && Clock::now() >= *peer_grace_until &&
        (server.running || client.running)) {
      Note("the other side did not finish in time; stopping it");
      KillChildren({&server, &client});
    }

    if (!server.running && !client.running) {
      if (client_attempts == 0) Note("server exited before the client was started");
      exit_code = (server.status == 0 && client.status == 0) ? 0 : 1;
      break;
    }
  }

  // Final drain and cleanup.
  DrainChild(server, true);
  DrainChild(client, true);
  if (server.out_fd >= 0) close(server.out_fd);
  if (client.out_fd >= 0) close(client.out_fd);
  std::error_code ec;
  fs::remove_all(tmpdir, ec);
  close(g_wake_pipe[0]);
  close(g_wake_pipe[1]);
  g_wake_pipe[0] = g_wake_pipe[1] = -1;

  if (exit_code == 0) {
    Note("demo PASSED: server and client both exited 0");
  } else if (!timed_out && g_signal == 0) {
    fprintf(stderr, "droce: demo FAILED (server: %s, client: %s)\n",
            server.status < 0 ? "not run" : DescribeStatus(server.status).c_str(),
            client.status < 0 ? "not run" : DescribeStatus(client.status).c_str());
  }
  return exit_code;
}

// `droce trace-dump [--csv|--json] FILE`.
int CmdTraceDump(const std::vector<std::string>& args) {
  droce::lab::TraceFormat f = droce::lab::TraceFormat::kJson;
  std::string file;
  for (const std::string& a : args) {
    if (a == "--csv") f = droce::lab::TraceFormat::kCsv;
    else if (a == "--json") f = droce::lab::TraceFormat::kJson;
    else if (a.starts_with("-")) return UsageError(StrCat("trace-dump: unknown option '", a, "' (--csv or --json)"));
    else if (!file.empty()) return UsageError("trace-dump: one FILE");
    else file = a;
  }
  if (file.empty()) return UsageError("trace-dump: missing FILE (usage: droce trace-dump [--csv|--json] FILE)");
  absl::StatusOr<uint64_t> n = droce::lab::DumpTrace(file, f, stdout);
  if (!n.ok()) {
    fprintf(stderr, "droce trace-dump: %s\n", std::string(n.status().message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty() || args[0] == "help" || args[0] == "--help" || args[0] == "-h") {
    fputs(kUsage.data(), stdout);
    return 0;
  }
  const std::string cmd = args[0];
  args.erase(args.begin());
  if (cmd == "version" || cmd == "--version") {
    printf("droce %s\n", DROCE_VERSION);
    return 0;
  }
  if (cmd == "exec") return CmdExec(args);
  if (cmd == "demo") return CmdDemo(args);
  if (cmd == "pcap-check") return PcapCheckMain(argc - 1, argv + 1);
  if (cmd == "cc-scenario") return droce::cc_scenario::Main(argc - 1, argv + 1);
  if (cmd == "ctl") return droce::tools::CtlMain(args);
  if (cmd == "trace-dump") return CmdTraceDump(args);
  return UsageError(StrCat("unknown command '", cmd, "' (see 'droce help')"));
}
