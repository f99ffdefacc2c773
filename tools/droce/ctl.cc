#include "ctl.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ctl/protocol.h"
#include "nlohmann/json.hpp"

namespace droce::tools {
namespace {

using Json = nlohmann::ordered_json;

constexpr int kExitFail = 1;
constexpr int kExitUsage = 2;

constexpr std::string_view kHelp =
    "usage: droce ctl [-j] [-p] [--socket PATH | --pid PID] OBJECT [COMMAND [ARGS]]\n"
    "  dev [show [DEV]]\n"
    "  link [show [DEV[/PORT]]]\n"
    "  res [show [qp|cq|mr|pd] [link DEV[/PORT] | dev DEV] [pid PID] [qpn|lqpn N]]\n"
    "  stat [show [link DEV[/PORT]] [qp [N]] [pid PID]]\n"
    "  client [show [pid PID]]\n"
    "  client kill PID\n"
    "  metrics                     the Prometheus text droced serves on /metrics\n"
    "  capture [show [dev DEV]]\n"
    "  capture start [dev DEV] FILE [size N[k|M|G]] [files N] [count N] [snaplen N] [point engine|wire|both]\n"
    "  capture stop [dev DEV]      pcapng of the link with a comment per frame (docs/LAB.md)\n"
    "  fault [show [dev DEV]]      the fault rules of the links and their counters\n"
    "  fault set [dev DEV] RULES   replace them (DROCE_FAULT's syntax, docs/LAB.md)\n"
    "  fault clear [dev DEV]\n"
    "  cc [show [dev DEV] [qpn N]]  congestion control: each QP's DCQCN rate, target, alpha\n"
    "  cc set [dev DEV] [qpn N] [dcqcn|off] [NAME=VALUE,...]\n"
    "                              change it live (DROCE_DCQCN's names; docs/LAB.md)\n"
    "  trace [show [dev DEV]]\n"
    "  trace start [dev DEV] FILE [format json|csv|binary] [qp N] [ring N] [clock event|turn]   the per-QP event trace\n"
    "  trace stop [dev DEV]\n"
    "-j: JSON (-p: pretty). Asks droced at --socket, $DROCE_DAEMON or /run/droce/droced.sock;\n"
    "--pid PID asks a program running embedded with DROCE_CTL=1. See docs/OPERATIONS.md.\n";

struct UsageError {
  std::string msg;
};

struct Request {
  Json req = Json::object();
  std::string object;  // dev, link, res, stat, client, metrics
  std::string kind;    // res: summary|qp|cq|mr|pd
};

std::optional<long long> Number(const std::string& s) {
  long long v = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < 0) return std::nullopt;
  return v;
}

// The arguments after OBJECT [show]: "NAME VALUE" pairs as rdma takes them.
class Args {
 public:
  Args(const std::vector<std::string>& v, size_t i) : v_(v), i_(i) {}
  bool done() const { return i_ >= v_.size(); }
  const std::string& peek() const { return v_[i_]; }
  std::string next() { return v_[i_++]; }
  std::string value(const std::string& of) {
    if (done()) throw UsageError{"'" + of + "' needs a value"};
    return next();
  }
  long long number(const std::string& of) {
    const std::string s = value(of);
    auto n = Number(s);
    if (!n) throw UsageError{"'" + of + "' needs a number, not '" + s + "'"};
    return *n;
  }

 private:
  const std::vector<std::string>& v_;
  size_t i_;
};

// OBJECT [show ...]: the request the engine answers.
Request Parse(const std::vector<std::string>& words) {
  if (words.empty()) throw UsageError{"no object (dev, link, res, stat, client, metrics, capture, fault, trace, cc; see droce ctl help)"};
  Request r;
  r.object = words[0];
  size_t i = 1;
  const bool kill = r.object == "client" && words.size() > 1 && words[1] == "kill";
  const bool capture_act = (r.object == "capture" || r.object == "trace") && words.size() > 1 &&
                           (words[1] == "start" || words[1] == "stop");
  const bool fault_act = r.object == "fault" && words.size() > 1 && (words[1] == "set" || words[1] == "clear");
  const bool cc_act = r.object == "cc" && words.size() > 1 && words[1] == "set";
  if (i < words.size() && (words[i] == "show" || words[i] == "list" || kill || capture_act || fault_act || cc_act)) ++i;
  else if (i < words.size() && (r.object == "capture" || r.object == "trace")) {
    throw UsageError{"unknown command '" + words[i] + "' for '" + r.object + "' (show, start or stop)"};
  } else if (i < words.size() && r.object == "cc") {
    // `cc dev D` / `cc qpn N`: a show with its filters (read below).
    if (words[i] != "dev" && words[i] != "link" && words[i] != "qpn" && words[i] != "lqpn") {
      throw UsageError{"unknown command '" + words[i] + "' for 'cc' (show or set)"};
    }
  } else if (i < words.size() && r.object == "fault") {
    throw UsageError{"unknown command '" + words[i] + "' for 'fault' (show, set or clear)"};
  } else if (i < words.size() && r.object != "metrics") {
    throw UsageError{"unknown command '" + words[i] + "' for '" + r.object + "' (show" +
                     (r.object == "client" ? std::string(" or kill") : std::string()) + ")"};
  }
  Args a(words, i);
  auto set_dev = [&](std::string dev) { r.req["dev"] = std::move(dev); };
  if (r.object == "dev" || r.object == "link") {
    r.req["cmd"] = r.object;
    if (!a.done()) set_dev(a.next());
  } else if (r.object == "res") {
    r.req["cmd"] = "res";
    r.kind = "summary";
    if (!a.done() && (a.peek() == "qp" || a.peek() == "cq" || a.peek() == "mr" || a.peek() == "pd")) {
      r.kind = a.next();
    }
    r.req["kind"] = r.kind;
    while (!a.done()) {
      const std::string k = a.next();
      if (k == "link" || k == "dev") set_dev(a.value(k));
      else if (k == "pid") r.req["pid"] = a.number(k);
      else if ((k == "qpn" || k == "lqpn") && r.kind == "qp") r.req["qpn"] = a.number(k);
      else throw UsageError{"unknown filter '" + k + "' for 'res show" + (r.kind == "summary" ? "" : " " + r.kind) + "'"};
    }
  } else if (r.object == "stat") {
    r.req["cmd"] = "stat";
    while (!a.done()) {
      const std::string k = a.next();
      if (k == "link" || k == "dev") set_dev(a.value(k));
      else if (k == "pid") r.req["pid"] = a.number(k);
      else if (k == "qp") {
        r.req["kind"] = "qp";
        r.kind = "qp";
        if (!a.done() && Number(a.peek())) r.req["qpn"] = a.number(k);
      } else if (k == "qpn" || k == "lqpn") {
        r.req["kind"] = "qp";
        r.kind = "qp";
        r.req["qpn"] = a.number(k);
      } else {
        throw UsageError{"unknown argument '" + k + "' for 'stat show' (link L, qp [N], pid P)"};
      }
    }
  } else if (r.object == "client") {
    if (kill) {
      r.req["cmd"] = "kill";
      r.kind = "kill";
      r.req["pid"] = a.number("client kill");
      if (r.req["pid"].get<long long>() == 0) throw UsageError{"'client kill' needs a PID other than 0"};
    } else {
      r.req["cmd"] = "client";
      while (!a.done()) {
        const std::string k = a.next();
        if (k == "pid") r.req["pid"] = a.number(k);
        else throw UsageError{"unknown filter '" + k + "' for 'client show' (pid P)"};
      }
    }
  } else if (r.object == "capture" || r.object == "trace") {
    const bool trace = r.object == "trace";
    r.req["cmd"] = r.object;
    r.kind = capture_act ? words[1] : "show";
    r.req["action"] = r.kind;
    std::string spec;
    while (!a.done()) {
      const std::string k = a.next();
      if (k == "dev" || k == "link") {
        set_dev(a.value(k));
      } else if (r.kind == "start" && !trace &&
                 (k == "size" || k == "files" || k == "count" || k == "snaplen" || k == "point")) {
        if (spec.empty()) throw UsageError{"'capture start' needs the FILE before '" + k + "'"};
        const std::string v = a.value(k);
        if (k != "size" && k != "point" && !Number(v)) throw UsageError{"'" + k + "' needs a number, not '" + v + "'"};
        spec += "," + k + "=" + v;
      } else if (r.kind == "start" && trace && (k == "format" || k == "qp" || k == "ring" || k == "clock")) {
        if (spec.empty()) throw UsageError{"'trace start' needs the FILE before '" + k + "'"};
        spec += "," + k + "=" + a.value(k);
      } else if (r.kind == "start" && spec.empty()) {
        if (k.find(',') != std::string::npos) throw UsageError{"a " + r.object + " file name cannot contain ','"};
        std::error_code ec;
        const std::filesystem::path abs = std::filesystem::absolute(k, ec);
        if (ec) throw UsageError{"bad " + r.object + " file '" + k + "'"};
        spec = abs.string();
      } else {
        throw UsageError{"unexpected argument '" + k + "' for '" + r.object + " " + r.kind + "'"};
      }
    }
    if (r.kind == "start" && spec.empty()) throw UsageError{"'" + r.object + " start' needs a FILE"};
    if (r.kind == "start") r.req["spec"] = spec;
  } else if (r.object == "fault") {
    r.req["cmd"] = "fault";
    r.kind = fault_act ? words[1] : "show";
    r.req["action"] = r.kind;
    if (!a.done() && a.peek() == "dev") {
      a.next();
      set_dev(a.value("dev"));
    }
    if (r.kind == "set") {
      // The rest is the rules, as one would write DROCE_FAULT.
      std::string rules;
      while (!a.done()) rules += (rules.empty() ? "" : " ") + a.next();
      if (rules.empty()) throw UsageError{"'fault set' needs the rules ('fault clear' removes them)"};
      r.req["rules"] = rules;
    }
  } else if (r.object == "cc") {
    r.req["cmd"] = "cc";
    r.kind = cc_act ? "set" : "show";
    r.req["action"] = r.kind;
    std::string params;
    while (!a.done()) {
      const std::string k = a.next();
      if (k == "dev" || k == "link") set_dev(a.value(k));
      else if (k == "qpn" || k == "lqpn") r.req["qpn"] = a.number(k);
      else if (r.kind == "set" && (k == "dcqcn" || k == "off")) r.req["mode"] = k;
      else if (r.kind == "set" && k.find('=') != std::string::npos) params += (params.empty() ? "" : ",") + k;
      else throw UsageError{"unexpected argument '" + k + "' for 'cc " + r.kind + "'"};
    }
    if (r.kind == "set" && !r.req.contains("mode") && params.empty()) {
      throw UsageError{"'cc set' needs dcqcn, off and/or NAME=VALUE,..."};
    }
    if (!params.empty()) r.req["params"] = params;
  } else if (r.object == "metrics") {
    r.req["cmd"] = "metrics";
    if (!a.done()) throw UsageError{"'metrics' takes no arguments"};
  } else {
    throw UsageError{"unknown object '" + r.object + "' (dev, link, res, stat, client, metrics, capture, fault, trace, cc)"};
  }
  if (!a.done()) throw UsageError{"unexpected argument '" + a.peek() + "'"};
  return r;
}

// One admin round trip; the answer document ({"ok":..}) or an error line.
std::optional<Json> Ask(const std::string& target, bool abstract, const Json& req, std::string* err) {
  const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (s < 0) {
    *err = std::string("socket: ") + std::strerror(errno);
    return std::nullopt;
  }
  sockaddr_un sa{};
  sa.sun_family = AF_UNIX;
  if (target.size() >= sizeof(sa.sun_path)) {
    close(s);
    *err = "socket path too long: " + target;
    return std::nullopt;
  }
  std::memcpy(sa.sun_path, target.data(), target.size());
  const socklen_t sl = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + target.size() + (abstract ? 0 : 1));
  if (connect(s, reinterpret_cast<sockaddr*>(&sa), sl) != 0) {
    const int e = errno;
    close(s);
    *err = abstract ? "cannot reach process " + target.substr(target.find('.') + 1) + ": " + std::strerror(e) +
                          " (was it started with DROCE_CTL=1, and is it yours?)"
                    : "cannot reach droced at " + target + ": " + std::strerror(e) +
                          " (is droced running? a program running embedded answers with DROCE_CTL=1 and --pid PID)";
    return std::nullopt;
  }
  const std::string text = req.dump();
  struct {
    ctl::Header h;
    ctl::AdminReq a;
  } m{};
  if (text.size() > ctl::kAdminMaxReq) {
    close(s);
    *err = "request too long";
    return std::nullopt;
  }
  m.h = {ctl::kMagic, ctl::kAdmin, 0, 1, sizeof(m)};
  m.a.len = static_cast<uint32_t>(text.size());
  std::memcpy(m.a.json, text.data(), text.size());
  struct {
    ctl::Reply r;
    ctl::AdminRep a;
  } rep{};
  int fds[ctl::kMaxFds];
  int nfds = 0;
  ssize_t n = -1;
  if (ctl::SendMsg(s, &m, sizeof(m), nullptr, 0) == static_cast<ssize_t>(sizeof(m))) {
    n = ctl::RecvMsg(s, &rep, sizeof(rep), fds, &nfds);
  }
  const int e = errno;
  close(s);
  auto close_fds = [&] {
    for (int i = 0; i < nfds; ++i) close(fds[i]);
  };
  if (n != static_cast<ssize_t>(sizeof(rep)) || rep.r.h.magic != ctl::kMagic ||
      rep.r.h.op != (ctl::kAdmin | ctl::kReplyBit)) {
    close_fds();
    *err = n < 0 ? std::string("no answer: ") + std::strerror(e)
                 : std::string("the engine did not answer (an older droced without droce ctl?)");
    return std::nullopt;
  }
  if (rep.r.err != 0 || nfds != 1) {
    close_fds();
    *err = std::string("the engine could not answer: ") + std::strerror(rep.r.err != 0 ? rep.r.err : EPROTO);
    return std::nullopt;
  }
  struct stat st{};
  const bool sized = fstat(fds[0], &st) == 0 && static_cast<uint64_t>(st.st_size) >= rep.a.len;
  void* p = sized && rep.a.len > 0 ? mmap(nullptr, rep.a.len, PROT_READ, MAP_PRIVATE, fds[0], 0) : MAP_FAILED;
  close(fds[0]);
  if (p == MAP_FAILED) {
    *err = "the engine's answer is unreadable";
    return std::nullopt;
  }
  Json doc = Json::parse(std::string_view(static_cast<const char*>(p), rep.a.len), nullptr, false);
  munmap(p, rep.a.len);
  if (doc.is_discarded() || !doc.is_object() || !doc.contains("ok")) {
    *err = "the engine's answer is not JSON";
    return std::nullopt;
  }
  return doc;
}

std::string Text(const Json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_array()) {
    std::string s;
    for (const Json& e : v) s += (s.empty() ? "" : ",") + Text(e);
    return s.empty() ? "-" : s;
  }
  return v.dump();
}

// rdma's line shapes: "0: mlx5_0: k v ..." for dev and the res summary,
// "link mlx5_0/1 k v ..." for ports and QPs, "dev mlx5_0 k v ..." for
// the other resources.
void PrintText(const Request& r, const Json& result) {
  if (r.object == "metrics") {
    std::fputs(result.get<std::string>().c_str(), stdout);
    return;
  }
  if (r.kind == "kill") return;
  for (const Json& row : result) {
    std::string line;
    if (row.contains("ifname") && row["ifname"] == "host") {
      line = "host";
    } else if (row.contains("ifname")) {
      const std::string name = row["ifname"].get<std::string>();
      if (r.object == "dev" || (r.object == "res" && r.kind == "summary")) {
        line = std::to_string(row["ifindex"].get<int>()) + ": " + name + ":";
      } else if (r.object == "link" || r.object == "stat" || r.kind == "qp") {
        line = "link " + name + "/1";
      } else {
        line = "dev " + name;
      }
    }
    for (const auto& [k, v] : row.items()) {
      if (k == "ifindex" || k == "ifname" || k == "port") continue;
      line += (line.empty() ? "" : " ") + k + " " + Text(v);
    }
    std::printf("%s\n", line.c_str());
  }
}

}  // namespace

int CtlMain(const std::vector<std::string>& args) {
  bool json = false, pretty = false;
  std::string socket_path;
  long long pid = -1;
  std::vector<std::string> words;
  try {
    for (size_t i = 0; i < args.size(); ++i) {
      const std::string& a = args[i];
      if (a == "-h" || a == "--help" || a == "help") {
        std::fputs(kHelp.data(), stdout);
        return 0;
      }
      if (a == "-j" || a == "--json") json = true;
      else if (a == "-p" || a == "--pretty") pretty = json = true;
      else if (a == "-jp" || a == "-pj") pretty = json = true;
      else if (a == "--socket" || a.starts_with("--socket=")) {
        socket_path = a == "--socket" ? (i + 1 < args.size() ? args[++i] : "") : a.substr(9);
        if (socket_path.empty()) throw UsageError{"--socket needs a path"};
      } else if (a == "--pid" || a.starts_with("--pid=")) {
        const std::string v = a == "--pid" ? (i + 1 < args.size() ? args[++i] : "") : a.substr(6);
        auto n = Number(v);
        if (!n || *n == 0) throw UsageError{"--pid needs a process id, not '" + v + "'"};
        pid = *n;
      } else if (a.starts_with("-")) {
        throw UsageError{"unknown option '" + a + "' (see droce ctl help)"};
      } else {
        words.push_back(a);
      }
    }
    if (pid > 0 && !socket_path.empty()) throw UsageError{"--socket and --pid name different engines: give one"};
    Request r = Parse(words);
    std::string target;
    const bool abstract = pid > 0;
    if (abstract) {
      target = ctl::EmbeddedCtlName(static_cast<pid_t>(pid));
    } else if (!socket_path.empty()) {
      target = socket_path;
    } else if (const char* d = std::getenv("DROCE_DAEMON"); d != nullptr && *d != '\0') {
      target = d;
    } else {
      target = ctl::kDefaultSocket;
    }
    std::string err;
    std::optional<Json> doc = Ask(target, abstract, r.req, &err);
    if (!doc) {
      std::fprintf(stderr, "droce ctl: %s\n", err.c_str());
      return kExitFail;
    }
    if (!(*doc)["ok"].get<bool>()) {
      const std::string msg = doc->value("error", std::string("refused"));
      std::fprintf(stderr, "droce ctl: %s\n", msg.c_str());
      // What is wrong with the question (no such device, bad filter) is a
      // usage error, as rdma's; anything else the engine refused is not.
      return doc->value("code", std::string()) == "INVALID_ARGUMENT" ? kExitUsage : kExitFail;
    }
    const Json& result = (*doc)["result"];
    if (json && r.object != "metrics") {
      std::printf("%s\n", result.dump(pretty ? 4 : -1).c_str());
    } else {
      PrintText(r, result);
    }
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "droce ctl: %s\n", e.msg.c_str());
    return kExitUsage;
  }
}

}  // namespace droce::tools
