#include "admin/serve.h"

#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/background.h"
#include "common/log.h"
#include "config/settings.h"
#include "ctl/protocol.h"

namespace droce::admin {
namespace {

MHD_Result Handle(void* cls, MHD_Connection* conn, const char* url, const char* method, const char*,
                  const char*, size_t*, void**) {
  MakeThreadBackground();
  auto* host = static_cast<Host*>(cls);
  const bool get = std::strcmp(method, MHD_HTTP_METHOD_GET) == 0 || std::strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
  const bool metrics = std::strcmp(url, "/metrics") == 0;
  std::string body = !get ? "only GET\n" : !metrics ? "droce: GET /metrics\n" : PrometheusText(*host);
  MHD_Response* r = MHD_create_response_from_buffer(body.size(), body.data(), MHD_RESPMEM_MUST_COPY);
  if (r == nullptr) return MHD_NO;
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE,
                          metrics && get ? "text/plain; version=0.0.4; charset=utf-8" : "text/plain");
  const unsigned code = !get ? MHD_HTTP_METHOD_NOT_ALLOWED : !metrics ? MHD_HTTP_NOT_FOUND : MHD_HTTP_OK;
  const MHD_Result q = MHD_queue_response(conn, code, r);
  MHD_destroy_response(r);
  return q;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(Host* host, const std::string& address,
                                                                   uint16_t port) {
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(port);
  if (inet_pton(AF_INET, address.c_str(), &sa.sin_addr) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("metrics address '", address, "' is not an IPv4 address"));
  }
  std::unique_ptr<MetricsServer> m(new MetricsServer());
  m->host_ = host;
  // One thread of its own, blocked in poll while nobody scrapes; at most a
  // few connections (a scraper or two) so it cannot grow into the engine's
  // CPUs.
  m->mhd_ = MHD_start_daemon(MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL, port, nullptr, nullptr, &Handle, host,
                             MHD_OPTION_SOCK_ADDR, &sa, MHD_OPTION_CONNECTION_LIMIT, 8u,
                             MHD_OPTION_CONNECTION_TIMEOUT, 10u, MHD_OPTION_END);
  if (m->mhd_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", address, ":", port,
                                               " (port in use or not allowed)"));
  }
  const MHD_DaemonInfo* info = MHD_get_daemon_info(m->mhd_, MHD_DAEMON_INFO_BIND_PORT);
  m->port_ = info != nullptr ? info->port : port;
  return m;
}

MetricsServer::~MetricsServer() {
  if (mhd_ != nullptr) MHD_stop_daemon(mhd_);
}


std::vector<engine::Device*> EmbeddedHost::Devices() {
  std::vector<engine::Device*> v;
  for (int i = 0; i < config::kMaxDevices; ++i) {
    if (engine::Device* d = engine::Device::Started(i)) v.push_back(d);
  }
  return v;
}

std::vector<ClientInfo> EmbeddedHost::Clients() {
  ClientInfo c;
  c.pid = getpid();
  c.uid = getuid();
  c.comm = CommOf(c.pid);
  for (engine::Device* d : Devices()) {
    const engine::Device::Resources r = d->ReadResources();
    c.qps += r.qps.size();
    c.cqs += r.cqs.size();
    c.pds += r.pds.size();
    c.mrs += r.mrs.size();
    for (const mem::Mr& m : r.mrs) c.mr_bytes += m.length;
  }
  return {c};
}

Owners EmbeddedHost::OwnersOf(size_t) {
  Owners o;
  o.fallback = getpid();
  return o;
}

absl::Status EmbeddedHost::Kill(int32_t, uint32_t) {
  return absl::FailedPreconditionError("an embedded process has no clients to detach (client kill is droced's)");
}

void ServeAdminConnection(Host& host, int sock, uint32_t uid) {
  uint8_t buf[ctl::kMaxMessage];
  uint32_t seq = 0;
  for (;;) {
    int fds[ctl::kMaxFds];
    int nfds = 0;
    const ssize_t n = ctl::RecvMsg(sock, buf, sizeof(buf), fds, &nfds);
    for (int i = 0; i < nfds; ++i) close(fds[i]);
    if (n <= 0) return;
    if (!ctl::ValidateRequest(buf, static_cast<size_t>(n), nfds).ok()) return;
    ctl::Header h;
    std::memcpy(&h, buf, sizeof(h));
    if (h.op != ctl::kAdmin || h.seq != seq + 1) return;
    seq = h.seq;
    if (!AnswerAdmin(host, sock, seq, buf, static_cast<size_t>(n), uid)) return;
  }
}

void StartEmbeddedCtl() {
  static std::once_flag once;
  std::call_once(once, [] {
    const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (s < 0) return;
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    const std::string name = ctl::EmbeddedCtlName(getpid());
    std::memcpy(sa.sun_path, name.data(), name.size());
    const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
    if (bind(s, reinterpret_cast<sockaddr*>(&sa), len) != 0 || listen(s, 8) != 0) {
      Log(LogLevel::kWarning, "DROCE_CTL: cannot listen on @%s: %s", name.substr(1), std::strerror(errno));
      close(s);
      return;
    }
    Log(LogLevel::kInfo, "DROCE_CTL: answering `droce ctl --pid %d` on @%s", getpid(), name.substr(1));
    // Blocked in accept while nobody asks; one question at a time.
    std::thread([s] {
      static EmbeddedHost host;
      for (;;) {
        const int c = accept4(s, nullptr, nullptr, SOCK_CLOEXEC);
        if (c < 0) {
          if (errno == EINTR || errno == ECONNABORTED) continue;
          return;
        }
        ucred cred{};
        socklen_t cl = sizeof(cred);
        if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0 && (cred.uid == 0 || cred.uid == getuid())) {
          ServeAdminConnection(host, c, cred.uid);
        }
        close(c);
      }
    }).detach();
  });
}

}  // namespace droce::admin
