#include "daemon/server.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "ctl/protocol.h"
#include "daemon/client.h"
#include "daemon/config_file.h"
#include "queue/shm.h"

namespace droce::daemon {
namespace {

// The client's RLIMIT_MEMLOCK, or 0 for none (CAP_IPC_LOCK or unlimited).
uint64_t memlock_limit(pid_t pid) {
  std::ifstream st(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(st, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      const uint64_t caps = std::strtoull(line.c_str() + 7, nullptr, 16);
      if (caps & (uint64_t{1} << 14)) return 0;  // CAP_IPC_LOCK
    }
  }
  rlimit rl{};
  if (prlimit(pid, RLIMIT_MEMLOCK, nullptr, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 0;
  return rl.rlim_cur;
}

}  // namespace

// The daemon as `droce ctl` sees it: its devices, and its client
// processes with their objects (read under each client's objs_mu, so a
// query waits for a control call in progress, never the other way round for
// long: a query copies sets and returns).
class Server::AdminHost final : public admin::Host {
 public:
  explicit AdminHost(Server* s) : s_(s) {}
  std::vector<engine::Device*> Devices() override { return s_->devices_; }

  std::vector<admin::ClientInfo> Clients() override {
    std::vector<admin::ClientInfo> out;
    for (auto& c : Live()) {
      admin::ClientInfo i;
      i.pid = c->pid;
      i.uid = c->uid;
      i.comm = admin::CommOf(c->pid);
      i.tag = c->tag;
      std::lock_guard<std::mutex> l(c->objs_mu);
      i.qps = c->nqps;
      i.cqs = c->ncqs;
      i.mrs = c->nmrs;
      for (auto& d : c->devs) {
        if (d->attached) i.pds += static_cast<uint32_t>(d->dev->Owned(c->tag).of(engine::ObjKind::kPd).size());
      }
      i.mr_bytes = c->mr_bytes;
      out.push_back(std::move(i));
    }
    return out;
  }

  admin::Owners OwnersOf(size_t dev) override {
    admin::Owners o;
    for (auto& c : Live()) {
      o.qp_tag[c->tag] = c->pid;
      std::lock_guard<std::mutex> l(c->objs_mu);
      if (dev >= c->devs.size()) continue;
      const Client::Dev& d = *c->devs[dev];
      if (!d.attached) continue;
      const engine::OwnedObjects owned = d.dev->Owned(c->tag);
      for (uint32_t id : owned.of(engine::ObjKind::kCq)) o.cq[id] = c->pid;
      for (uint32_t key : owned.of(engine::ObjKind::kMr)) o.mr[key] = c->pid;
      for (uint32_t pd : owned.of(engine::ObjKind::kPd)) o.pd[pd] = c->pid;
    }
    return o;
  }

  absl::Status Kill(int32_t pid, uint32_t uid) override {
    bool found = false;
    for (auto& c : Live()) {
      if (c->pid != pid) continue;
      if (uid != 0 && uid != c->uid) {
        return absl::PermissionDeniedError(absl::StrCat("client ", pid, " is another user's (uid ", c->uid, ")"));
      }
      // Its thread sees the connection end and tears it down as if the
      // process had gone; the process gets IBV_EVENT_DEVICE_FATAL. Under
      // objs_mu the socket is still this client's (Release takes it too).
      std::lock_guard<std::mutex> l(c->objs_mu);
      if (c->sock >= 0) shutdown(c->sock, SHUT_RDWR);
      found = true;
    }
    if (!found) return absl::NotFoundError(absl::StrCat("no client with pid ", pid));
    return absl::OkStatus();
  }

  void AddHostStats(admin::Json* out) override {
    const ServerStats& st = s_->stats_;
    admin::Json& j = *out;
    j["clients_live"] = st.clients_live.load();
    j["clients_accepted"] = st.clients_accepted.load();
    j["clients_refused"] = st.clients_refused.load();
    j["bad_messages"] = st.bad_messages.load();
    j["foreign_handles"] = st.foreign_handles.load();
    j["objects_live"] = st.objects_live.load();
    j["mr_maps_live"] = st.mr_maps_live.load();
    j["mr_shared"] = st.mr_shared.load();
    j["mr_moved"] = st.mr_moved.load();
    j["mr_copied"] = st.mr_copied.load();
    j["teardowns"] = st.teardowns.load();
    j["admin_requests"] = st.admin_requests.load();
    if (s_->ucma_ != nullptr) {
      const cm::CmStats cs = s_->ucma_->stats();
#define DROCE_CM_STAT_JSON(name, desc) j["cm_" #name] = cs.name;
      DROCE_CM_STATS(DROCE_CM_STAT_JSON)
#undef DROCE_CM_STAT_JSON
    }
  }

 private:
  using Live_ = Server::Live;
  // The verbs clients now (not the administration connections).
  std::vector<std::shared_ptr<Client>> Live() {
    std::vector<std::shared_ptr<Client>> v;
    std::lock_guard<std::mutex> l(s_->mu_);
    for (const Live_& x : s_->live_) {
      if (!x.client->admin.load(std::memory_order_relaxed) && !x.client->done.load(std::memory_order_acquire) &&
          x.client->hello.load(std::memory_order_acquire)) {
        v.push_back(x.client);
      }
    }
    return v;
  }
  Server* s_;
};

Server::Server(std::vector<engine::Device*> devices, ServerOptions opt)
    : devices_(std::move(devices)), opt_(std::move(opt)) {
  ucma_ = std::make_unique<cm::Ucma>();
  cm_ports_ = cm::AttachPorts(ucma_.get(), devices_);
  ucma_->Start();
  admin_ = std::make_unique<AdminHost>(this);
}

Server::~Server() {
  metrics_.reset();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

absl::Status Server::Listen() {
  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) return absl::ErrnoToStatus(errno, "eventfd");
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (opt_.socket_path.empty() || opt_.socket_path.size() >= sizeof(a.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", opt_.socket_path, "' is empty or too long"));
  }
  std::memcpy(a.sun_path, opt_.socket_path.c_str(), opt_.socket_path.size() + 1);
  listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return absl::ErrnoToStatus(errno, "socket");
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    if (errno != EADDRINUSE) return absl::ErrnoToStatus(errno, absl::StrCat("bind ", opt_.socket_path));
    // A socket file: live daemon, or left by one that died?
    const int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    const bool live = connect(probe, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    close(probe);
    if (live) return absl::AlreadyExistsError(absl::StrCat("a daemon already listens on ", opt_.socket_path));
    unlink(opt_.socket_path.c_str());
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("bind ", opt_.socket_path));
    }
  }
  // The group before the mode: a mode of 0660 must never apply to the
  // daemon's own group, even for an instant.
  if (!opt_.socket_group.empty()) {
    absl::StatusOr<gid_t> gid = ResolveGroup(opt_.socket_group);
    if (!gid.ok()) {
      unlink(opt_.socket_path.c_str());
      return absl::InvalidArgumentError(absl::StrCat("socket group: ", gid.status().message()));
    }
    if (chown(opt_.socket_path.c_str(), static_cast<uid_t>(-1), *gid) != 0) {
      const int e = errno;
      unlink(opt_.socket_path.c_str());
      return absl::ErrnoToStatus(e, absl::StrCat("chown ", opt_.socket_path, " to group ", opt_.socket_group));
    }
  }
  if (chmod(opt_.socket_path.c_str(), opt_.socket_mode) != 0 || listen(listen_fd_, 128) != 0) {
    const int e = errno;
    unlink(opt_.socket_path.c_str());
    return absl::ErrnoToStatus(e, absl::StrCat("listen ", opt_.socket_path));
  }
  if (opt_.metrics_port != 0) {
    auto m = admin::MetricsServer::Start(admin_.get(), opt_.metrics_address, opt_.metrics_port);
    if (!m.ok()) {
      unlink(opt_.socket_path.c_str());
      return m.status();
    }
    metrics_ = std::move(*m);
  }
  return absl::OkStatus();
}

void Server::Run() {
  uint64_t next_tag = 1;
  while (!stopping_.load(std::memory_order_acquire)) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(p, 2, 1000) < 0 && errno != EINTR) break;
    if (p[1].revents != 0) break;
    {
      // Reap the threads of clients that are gone.
      std::lock_guard<std::mutex> l(mu_);
      for (Live& x : live_) {
        if (x.client->done.load(std::memory_order_acquire)) x.thread.join();
      }
      std::erase_if(live_, [](const Live& x) { return !x.thread.joinable(); });
    }
    if ((p[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    ucred cred{};
    socklen_t cl = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.pid <= 0) {
      stats_.clients_refused.fetch_add(1, std::memory_order_relaxed);
      close(fd);
      continue;
    }
    auto c = std::make_shared<Client>(this, fd);
    c->pid = cred.pid;
    c->uid = cred.uid;
    c->tag = next_tag++;
    // The process, not the socket: a child forked without exec keeps the
    // socket open but must not keep its parent alive here.
    c->pidfd = static_cast<int>(syscall(SYS_pidfd_open, cred.pid, 0));
    c->memlock = memlock_limit(cred.pid);
    for (size_t i = 0; i < devices_.size(); ++i) {
      auto d = std::make_unique<Client::Dev>();
      d->c = c.get();
      d->index = static_cast<uint16_t>(i);
      d->dev = devices_[i];
      c->devs.push_back(std::move(d));
    }
    stats_.clients_accepted.fetch_add(1, std::memory_order_relaxed);
    stats_.clients_live.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> l(mu_);
    live_.push_back({c, std::thread([this, c] { Serve(c); })});
  }
  if (opt_.on_stopping) opt_.on_stopping();
  // Shutting down. The socket goes first: a client that reconnects at once
  // (a restart) fails fast instead of queueing on a listener nobody
  // accepts on, and a daemon started meanwhile on the same path keeps its
  // own socket file. Then every client hears DEVICE_FATAL (marked as the
  // daemon's stop), its connection ends and its thread tears it down.
  stopping_.store(true, std::memory_order_release);
  close(listen_fd_);
  listen_fd_ = -1;
  unlink(opt_.socket_path.c_str());
  metrics_.reset();
  for (engine::Device* d : devices_) d->Shutdown("droced is stopping");
  const uint64_t one = 1;
  (void)!write(stop_fd_, &one, sizeof(one));
  std::vector<Live> live;
  {
    std::lock_guard<std::mutex> l(mu_);
    live.swap(live_);
  }
  for (Live& x : live) x.thread.join();
}

void Server::Stop() {
  stopping_.store(true, std::memory_order_release);
  const uint64_t one = 1;
  if (stop_fd_ >= 0) (void)!write(stop_fd_, &one, sizeof(one));
}

void Server::Serve(std::shared_ptr<Client> c) {
  pthread_setname_np(pthread_self(), "droced-client");
  Handler h(*c, stats_, opt_.limits, ucma_.get(), next_cm_owner_.fetch_add(1, std::memory_order_relaxed),
            admin_.get());
  auto m = std::make_unique<Msg>();
  const char* why = "disconnected";
  for (;;) {
    pollfd p[3] = {{c->sock, POLLIN, 0}, {stop_fd_, POLLIN, 0}, {c->pidfd, POLLIN, 0}};
    const int np = c->pidfd >= 0 ? 3 : 2;
    if (poll(p, np, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[1].revents != 0) {
      why = "daemon stopping";
      // Hang up before the teardown: the client's event thread sees the
      // end now, and a request it has sent meanwhile fails with EIO
      // instead of waiting for a reply that will not come.
      shutdown(c->sock, SHUT_RDWR);
      break;
    }
    if (np == 3 && p[2].revents != 0) {
      why = "process exited";
      break;
    }
    if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    const ssize_t n = ctl::RecvMsg(c->sock, m->buf, sizeof(m->buf), m->fds, &m->nfds);
    // An empty message may still carry fds: they are not kept either.
    if (n == 0) m->CloseFds();
    if (n <= 0) {
      if (n < 0) {
        why = "bad message";
        stats_.bad_messages.fetch_add(1, std::memory_order_relaxed);
      }
      break;
    }
    m->len = static_cast<size_t>(n);
    bool ok;
    if (c->admin.load(std::memory_order_relaxed) || c->seq == 0) {
      // Administration (or the first message, which may make it so): its
      // queries take the other clients' objs_mu, never its own.
      ok = h.Handle(*m);
    } else {
      std::lock_guard<std::mutex> l(c->objs_mu);
      ok = h.Handle(*m);
    }
    m->CloseFds();
    if (!ok) {
      why = "protocol error";
      break;
    }
  }
  if (c->admin.load(std::memory_order_relaxed)) {
    Log(LogLevel::kDebug, "droced: droce ctl pid %d (uid %u): %s", static_cast<int>(c->pid),
        static_cast<unsigned>(c->uid), why);
  } else {
    Log(LogLevel::kInfo, "droced: client pid %d (uid %u): %s; tearing down its objects (%llu events dropped)",
        static_cast<int>(c->pid), static_cast<unsigned>(c->uid), why, static_cast<unsigned long long>(c->ev_dropped));
    {
      std::lock_guard<std::mutex> l(c->objs_mu);
      h.Teardown();
    }
    stats_.teardowns.fetch_add(1, std::memory_order_relaxed);
    stats_.clients_live.fetch_sub(1, std::memory_order_relaxed);
  }
  // Nothing of the engine refers to the client any more: its fds and shared
  // memory go now, not when its thread is reaped (under objs_mu: `client
  // kill` may be about to shut the socket down).
  {
    std::lock_guard<std::mutex> l(c->objs_mu);
    c->Release();
  }
  c->done.store(true, std::memory_order_release);
}

std::string Server::StatusLine() const {
  return absl::StrCat("clients ", stats_.clients_live.load(), " live, ", stats_.clients_accepted.load(), " accepted, ",
                      stats_.clients_refused.load(), " refused, ",
                      stats_.teardowns.load(), " torn down; objects ", stats_.objects_live.load(), ", memory maps ",
                      stats_.mr_maps_live.load(), "; bad messages ", stats_.bad_messages.load(), ", foreign handles ",
                      stats_.foreign_handles.load(), "; registrations shared ", stats_.mr_shared.load(), ", moved ",
                      stats_.mr_moved.load(), ", copied ", stats_.mr_copied.load());
}

}  // namespace droce::daemon
