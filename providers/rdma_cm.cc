// librdmacm's kernel interface, served from libdroce.so. Debian's
// unmodified librdmacm opens /dev/infiniband/rdma_cm (sysfs_view.cc hands
// the open here), checks with fstat that it is a character device, and then
// speaks rdma_ucm: fixed command structs written with write(), responses
// written back through the user pointer each command carries, events
// fetched with the blocking GET_EVENT command, the fd polled for POLLIN.
//
// Each channel is an eventfd in semaphore mode: it counts the channel's
// queued events, so poll/epoll/select and O_NONBLOCK behave as on the
// kernel's device, and a blocking GET_EVENT is a blocking read of it.
// write, close and fstat are interposed; on any other fd they cost one
// bitmap test. The commands themselves are cm::Ucma's (src/cm/ucma.h):
// in embedded mode one in this process, over this process's engine; in
// client mode droced's, shared by all its clients (ctl kCmOpen/kCmClose/
// kCmCommand), this side only copying option values in and responses out.
#undef _FORTIFY_SOURCE
#undef _FILE_OFFSET_BITS
#include "rdma_cm.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <rdma/rdma_user_cm.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <memory>
#include <chrono>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "cm/engine_port.h"
#include "cm/ucma.h"
#include "ctl/protocol.h"
#include "engine/device.h"
#include "hw_counters.h"
#include "interpose.h"
#include "provider.h"
#include "sessions.h"

extern "C" {
int __fxstat(int ver, int fd, struct stat* buf);
int __fxstat64(int ver, int fd, struct stat64* buf);
}

namespace droce::provider {
namespace {

constexpr int kMaxFds = 1 << 16;

// Which fds are channels: one bit each, read without a lock on every write
// and close of the process.
std::atomic<uint64_t> channel_bits[kMaxFds / 64];

bool is_channel_fd(int fd) {
  return fd >= 0 && fd < kMaxFds &&
         (channel_bits[fd / 64].load(std::memory_order_acquire) & (uint64_t{1} << (fd % 64))) != 0;
}
void mark_fd(int fd, bool on) {
  const uint64_t bit = uint64_t{1} << (fd % 64);
  if (on) channel_bits[fd / 64].fetch_or(bit, std::memory_order_release);
  else channel_bits[fd / 64].fetch_and(~bit, std::memory_order_release);
}

// Which thread last fetched a channel's events, and whether it is back in
// GET_EVENT. On the kernel's device an event thread returns to its blocking
// GET_EVENT within a microsecond of handling an event, so programs (rping)
// destroy the channel from another thread and free it while that thread
// waits, relying on it never waking. Here the event thread can be a
// scheduling turn behind (on a busy 2-CPU machine, a millisecond: the
// thread it wakes takes its CPU), would read the freed channel and exit
// from the middle of the other thread's exit. So close() gives another,
// live thread that fetches this channel's events up to kCloseGrace to get
// back into its wait, as it would have on the kernel's device.
struct Getter {
  pid_t tid = 0;    // the last thread to issue GET_EVENT, 0 if none
  int inside = 0;   // threads now in GET_EVENT
};
std::mutex getters_mu;
std::unordered_map<int, Getter> getters;  // by fd, guarded by getters_mu
constexpr auto kCloseGrace = std::chrono::milliseconds(50);

pid_t self_tid() { return static_cast<pid_t>(syscall(SYS_gettid)); }

void getter_enter(int fd) {
  std::lock_guard<std::mutex> l(getters_mu);
  Getter& g = getters[fd];
  g.tid = self_tid();
  ++g.inside;
}
void getter_leave(int fd) {
  std::lock_guard<std::mutex> l(getters_mu);
  if (auto it = getters.find(fd); it != getters.end() && it->second.inside > 0) --it->second.inside;
}
// Before fd is closed: wait (bounded) for another live event thread to be
// back in GET_EVENT; then forget the channel.
void getter_settle(int fd) {
  const auto deadline = std::chrono::steady_clock::now() + kCloseGrace;
  for (;;) {
    pid_t tid;
    {
      std::lock_guard<std::mutex> l(getters_mu);
      auto it = getters.find(fd);
      if (it == getters.end()) return;
      if (it->second.inside > 0 || it->second.tid == 0 || it->second.tid == self_tid() ||
          std::chrono::steady_clock::now() >= deadline) {
        getters.erase(it);
        return;
      }
      tid = it->second.tid;
    }
    if (syscall(SYS_tgkill, getpid(), tid, 0) != 0) {  // that thread has ended
      std::lock_guard<std::mutex> l(getters_mu);
      getters.erase(fd);
      return;
    }
    const timespec step{0, 100'000};
    nanosleep(&step, nullptr);
  }
}

// copy_from_user / copy_to_user: a bad pointer is EFAULT, not a crash.
bool copy_in(void* dst, const void* src, size_t n) {
  iovec local{dst, n}, remote{const_cast<void*>(src), n};
  return n == 0 || process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(n);
}
bool copy_out(uint64_t dst, const void* src, size_t n) {
  iovec local{const_cast<void*>(src), n}, remote{reinterpret_cast<void*>(dst), n};
  return n == 0 || process_vm_writev(getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(n);
}

// Where the commands go.
class Backend {
 public:
  virtual ~Backend() = default;
  virtual int Open(int fd) = 0;  // 0 or -errno
  virtual void Close(int fd) = 0;
  virtual cm::Ucma::Result Command(int fd, uint32_t cmd, const uint8_t* in, size_t in_len, size_t out_len,
                                   std::span<const uint8_t> optval) = 0;
};

// How long a process's exit waits for its connection manager's last MADs.
constexpr uint64_t kExitFlushNs = 200'000'000;

// Embedded: this process's engine and connection manager.
class Local final : public Backend {
 public:
  int Start() {
    std::vector<engine::Device*> devs;
    for (int i = 0; i < device_count(); ++i) {
      auto s = session_for(i);
      devs.push_back(s.ok() ? dynamic_cast<engine::Device*>(s->get()) : nullptr);
    }
    ports_ = cm::AttachPorts(&ucma_, devs);
    if (ports_.empty()) return ENODEV;
    ucma_.Start();
    return 0;
  }
  // The process exits, and its connection manager with it: as the kernel
  // when a process's rdma_cm file closes, every peer gets its DREQ or REJ
  // (a peer left waiting for a DREP would retry its DREQ for a minute and
  // more: perftest's -R client did), and they are let out on the link.
  void ProcessExit() {
    ucma_.ProcessExit();
    for (const auto& p : ports_) (void)p->device()->FlushGsi(kExitFlushNs);
  }
  int Open(int fd) override { return ucma_.OpenChannel(static_cast<uint64_t>(fd), fd); }
  void Close(int fd) override {
    ucma_.CloseChannel(static_cast<uint64_t>(fd));
    if (stats_enabled()) {
      std::string text = ucma_.StatsText();
      std::fprintf(stderr, "droce: connection manager counters (non-zero):\n");
      for (size_t at = 0; at < text.size();) {
        const size_t nl = text.find('\n', at);
        std::fprintf(stderr, "droce:   %s\n", text.substr(at, nl - at).c_str());
        at = nl + 1;
      }
    }
  }
  cm::Ucma::Result Command(int fd, uint32_t cmd, const uint8_t* in, size_t in_len, size_t out_len,
                           std::span<const uint8_t> optval) override {
    return ucma_.Command(static_cast<uint64_t>(fd), cmd, in, in_len, out_len, optval);
  }

 private:
  cm::Ucma ucma_;
  std::vector<std::unique_ptr<cm::EnginePort>> ports_;
};

// Client mode: droced's connection manager.
class Remote final : public Backend {
 public:
  int Open(int fd) override {
    const ctl::CmChannel c{static_cast<uint32_t>(fd), 0};
    return -daemon_call(ctl::kCmOpen, &c, sizeof(c), &fd, 1, nullptr, 0);
  }
  void Close(int fd) override {
    const ctl::CmChannel c{static_cast<uint32_t>(fd), 0};
    (void)daemon_call(ctl::kCmClose, &c, sizeof(c), nullptr, 0, nullptr, 0);
  }
  cm::Ucma::Result Command(int fd, uint32_t cmd, const uint8_t* in, size_t in_len, size_t out_len,
                           std::span<const uint8_t> optval) override {
    cm::Ucma::Result r;
    auto req = std::make_unique<ctl::CmCommand>();
    std::memset(req.get(), 0, sizeof(*req));
    if (in_len > sizeof(req->in) || optval.size() > sizeof(req->opt)) {
      r.rc = -EINVAL;
      return r;
    }
    req->fd = static_cast<uint32_t>(fd);
    req->cmd = cmd;
    req->in_len = static_cast<uint32_t>(in_len);
    req->out_len = static_cast<uint32_t>(out_len);
    req->opt_len = static_cast<uint32_t>(optval.size());
    std::memcpy(req->in, in, in_len);
    if (!optval.empty()) std::memcpy(req->opt, optval.data(), optval.size());
    auto rep = std::make_unique<ctl::CmResult>();
    if (int e = daemon_call(ctl::kCmCommand, req.get(), sizeof(*req), nullptr, 0, rep.get(), sizeof(*rep)); e != 0) {
      r.rc = -e;
      return r;
    }
    r.rc = rep->rc;
    r.response = rep->response;
    r.len = std::min<uint32_t>(rep->len, sizeof(r.bytes));
    std::memcpy(r.bytes, rep->bytes, r.len);
    return r;
  }
};

Backend* backend(int* err) {
  static Backend* b = nullptr;
  static int start_err = 0;
  static std::once_flag once;
  std::call_once(once, [] {
    if (!check_config().ok()) {
      start_err = ENODEV;
      return;
    }
    if (!daemon_socket().empty()) {
      b = new Remote();
      return;
    }
    static Local* local = new Local();  // lives until exit: its thread and the engines' sinks use it
    start_err = local->Start();
    if (start_err == 0) {
      b = local;
      // Only the process that started it: a child forked without exec
      // that calls exit() must not say goodbye for its parent's
      // connections (nor wait for a worker it does not have).
      static const pid_t owner = getpid();
      std::atexit([] {
        if (getpid() == owner) local->ProcessExit();
      });
    }
  });
  *err = start_err;
  return b;
}

ssize_t cm_write(Backend* b, int fd, const void* buf, size_t len) {
  rdma_ucm_cmd_hdr hdr;
  if (len < sizeof(hdr)) {
    errno = EINVAL;
    return -1;
  }
  if (!copy_in(&hdr, buf, sizeof(hdr))) {
    errno = EFAULT;
    return -1;
  }
  if (hdr.in + sizeof(hdr) > len) {
    errno = EINVAL;
    return -1;
  }
  uint8_t in[ctl::kCmMaxIn] = {};
  const size_t in_len = std::min<size_t>(hdr.in, sizeof(in));
  if (!copy_in(in, static_cast<const uint8_t*>(buf) + sizeof(hdr), in_len)) {
    errno = EFAULT;
    return -1;
  }
  // SET_OPTION names its value by pointer: read here, passed as bytes.
  std::vector<uint8_t> optval;
  if (hdr.cmd == RDMA_USER_CM_CMD_SET_OPTION && in_len >= sizeof(rdma_ucm_set_option)) {
    rdma_ucm_set_option c;
    std::memcpy(&c, in, sizeof(c));
    if (c.optlen > ctl::kCmMaxOpt) {
      errno = EINVAL;
      return -1;
    }
    optval.resize(c.optlen);
    if (!copy_in(optval.data(), reinterpret_cast<const void*>(c.optval), c.optlen)) {
      errno = EFAULT;
      return -1;
    }
  }
  cm::Ucma::Result r;
  for (;;) {
    if (hdr.cmd != RDMA_USER_CM_CMD_GET_EVENT) {
      r = b->Command(fd, hdr.cmd, in, in_len, hdr.out, optval);
      break;
    }
    // One queued event per count: blocks (or EAGAIN) as the device's read.
    // EBADF: the channel was closed while this command waited.
    uint64_t one;
    getter_enter(fd);
    const ssize_t got = read(fd, &one, sizeof(one));
    const int read_err = errno;
    getter_leave(fd);
    if (got == sizeof(one)) r = b->Command(fd, hdr.cmd, in, in_len, hdr.out, optval);
    else if (read_err == EBADF) r.rc = -EBADF;
    else {
      errno = read_err;
      return -1;
    }
    // A popped event whose id was destroyed meanwhile: wait for the next.
    if (r.rc == -EAGAIN) continue;
    if (r.rc == -EBADF) {
      // Another thread closed the channel while this one waited. On the
      // kernel's device the waiting write holds the file, which no event
      // will reach any more: it waits until a signal or the process ends
      // (rping's event thread, whose main thread closes the channel
      // before it returns 0, relies on that).
      pause();
      errno = EINTR;
      return -1;
    }
    break;
  }
  if (r.rc == 0 && r.len > 0 && !copy_out(r.response, r.bytes, r.len)) {
    if (hdr.cmd == RDMA_USER_CM_CMD_CREATE_ID && r.len >= sizeof(rdma_ucm_create_id_resp)) {
      // The id was made but the application cannot learn it: undo.
      rdma_ucm_destroy_id d{};
      d.id = reinterpret_cast<const rdma_ucm_create_id_resp*>(r.bytes)->id;
      (void)b->Command(fd, RDMA_USER_CM_CMD_DESTROY_ID, reinterpret_cast<const uint8_t*>(&d), sizeof(d),
                       sizeof(rdma_ucm_destroy_id_resp), {});
    }
    errno = EFAULT;
    return -1;
  }
  if (r.rc < 0) {
    errno = -r.rc;
    return -1;
  }
  return static_cast<ssize_t>(len);
}

}  // namespace

int cm_open_channel(int flags) {
  int err = 0;
  Backend* b = backend(&err);
  if (b == nullptr) {
    errno = err;
    return -1;
  }
  int efd_flags = EFD_SEMAPHORE;
  if (flags & O_CLOEXEC) efd_flags |= EFD_CLOEXEC;
  if (flags & O_NONBLOCK) efd_flags |= EFD_NONBLOCK;
  const int fd = eventfd(0, efd_flags);
  if (fd < 0) return -1;
  int rc = fd >= kMaxFds ? -EMFILE : b->Open(fd);
  if (rc != 0) {
    REAL(close)(fd);
    errno = -rc;
    return -1;
  }
  mark_fd(fd, true);
  return fd;
}

}  // namespace droce::provider

using droce::provider::is_channel_fd;

extern "C" {

ssize_t write(int fd, const void* buf, size_t len) {
  if (is_channel_fd(fd)) {
    int err = 0;
    if (auto* b = droce::provider::backend(&err)) return droce::provider::cm_write(b, fd, buf, len);
  }
  return REAL(write)(fd, buf, len);
}

// The kernel's ucma_close: closing a channel destroys its ids.
int close(int fd) {
  droce::provider::hw_counter_closed(fd);
  if (is_channel_fd(fd)) {
    droce::provider::getter_settle(fd);
    int err = 0;
    if (auto* b = droce::provider::backend(&err)) b->Close(fd);
    droce::provider::mark_fd(fd, false);
  }
  return REAL(close)(fd);
}

static void cm_fake_stat(struct stat* st) {
  st->st_mode = S_IFCHR | 0666;
  struct stat real;
  st->st_rdev = REAL(stat)("/dev/infiniband/rdma_cm", &real) == 0 && S_ISCHR(real.st_mode) ? real.st_rdev
                                                                                          : makedev(10, 58);
}

int fstat(int fd, struct stat* st) {
  const int rc = REAL(fstat)(fd, st);
  if (rc == 0 && is_channel_fd(fd)) cm_fake_stat(st);
  return rc;
}

int fstat64(int fd, struct stat64* st) {
  const int rc = REAL(fstat64)(fd, st);
  if (rc == 0 && is_channel_fd(fd)) cm_fake_stat(reinterpret_cast<struct stat*>(st));
  return rc;
}

int __fxstat(int ver, int fd, struct stat* st) {
  const int rc = REAL(__fxstat)(ver, fd, st);
  if (rc == 0 && is_channel_fd(fd)) cm_fake_stat(st);
  return rc;
}

int __fxstat64(int ver, int fd, struct stat64* st) {
  const int rc = REAL(__fxstat64)(ver, fd, st);
  if (rc == 0 && is_channel_fd(fd)) cm_fake_stat(reinterpret_cast<struct stat*>(st));
  return rc;
}

}  // extern "C"
