// The file-system view of droce's devices: what a program that looks at
// files rather than asks libibverbs sees.
//
// - A real on-disk sysfs tree, made once per process the first time anything
//   asks (ibv_get_sysfs_path, ibv_read_sysfs_file, or an interposed call on a
//   droce path) in ${TMPDIR:-/tmp}/droce-sysfs-<pid>-XXXXXX, removed at exit
//   (trees of dead pids are swept when a new one is made). It holds
//   class/infiniband/droce<N>/ with the kernel's attributes (written from
//   sysfs_attr, the one source of the values), class/infiniband_verbs/
//   uverbs-droce<N>/ and abi_version; every other entry of the real /sys,
//   /sys/class, /sys/class/infiniband and /sys/class/infiniband_verbs is a
//   symlink to the real one, so a path built from ibv_get_sysfs_path() to a
//   real device or anything else still works.
// - Path interposition: libdroce.so exports open, stat, access, opendir...
//   Each maps a hard-coded /sys/class/infiniband/droce<N>... or
//   /sys/class/infiniband_verbs/uverbs-droce<N>... path to the tree and calls
//   the real function; /dev/infiniband/uverbs-droce<N> answers as the uverbs
//   character device (major 231, minor 192+N). UCX lists a device only if
//   that node is a character device it may open read-write. Every other path
//   goes through untouched after one strncmp, without allocating.
//
// The port's state and phys_state files are rewritten when the port goes up
// or down (an EventSink on each device, called on its worker thread).
// This file defines open & co.: no fortify wrappers, and no redirection of
// open to open64 (each name is defined as itself).
#undef _FORTIFY_SOURCE
#undef _FILE_OFFSET_BITS
#include "sysfs_view.h"
#include "hw_counters.h"
#include "interpose.h"
#include "rdma_cm.h"
#include "sessions.h"
#include "system_verbs.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <ftw.h>
#include <ifaddrs.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <mutex>
#include <string>

#include "common/counters.h"
#include "common/log.h"
#include "config/settings.h"
#include "engine/device.h"

// glibc declares these only with _FORTIFY_SOURCE.
extern "C" {
int __open_2(const char* path, int flags);
int __open64_2(const char* path, int flags);
int __openat_2(int dirfd, const char* path, int flags);
int __openat64_2(int dirfd, const char* path, int flags);
}

namespace droce::provider {
namespace {

// Linux's uverbs character devices: major 231, minors from 192
// (drivers/infiniband/core/uverbs_main.c, IB_UVERBS_BASE_MINOR).
constexpr unsigned kUverbsMajor = 231, kUverbsBaseMinor = 192;
constexpr char kClassIb[] = "/sys/class/infiniband";  // also the prefix of infiniband_verbs
constexpr char kVerbsAbi[] = "/sys/class/infiniband_verbs/abi_version";
constexpr char kDevIb[] = "/dev/infiniband";
constexpr char kDevNode[] = "/dev/infiniband/uverbs-droce";
constexpr char kCmNode[] = "/dev/infiniband/rdma_cm";
// The kernel's rdma_cm is a misc device (major 10, a dynamic minor).
constexpr unsigned kMiscMajor = 10, kCmMinor = 58;

// Set while this thread builds the tree: its own calls are not mapped (the
// tree does not exist yet), and nothing it calls can wait for itself.
__attribute__((tls_model("initial-exec"))) thread_local bool building = false;

char root[PATH_MAX];       // the tree; empty if it could not be made
std::atomic<size_t> root_len{0};  // strlen(root) once the tree is made, else 0
char real_sysfs[PATH_MAX];  // what the tree mirrors: SYSFS_PATH or /sys
pid_t owner = 0;           // the process that made the tree removes it

// A droce device index from "droce<N>" at p (the rest: "" or "/..."), or -1.
int parse_index(const char* p, const char* prefix) {
  const size_t n = strlen(prefix);
  if (strncmp(p, prefix, n) != 0) return -1;
  p += n;
  if (*p < '0' || *p > '9' || (*p == '0' && p[1] >= '0' && p[1] <= '9')) return -1;
  int index = 0;
  while (*p >= '0' && *p <= '9' && index < 1000) index = index * 10 + (*p++ - '0');
  return (*p == '\0' || *p == '/') ? index : -1;
}

// ---------------------------------------------------------------------------
// The tree.

void write_file(const std::string& path, const std::string& value) {
  const std::string tmp = path + ".new";
  const int fd = REAL(open)(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0444);
  if (fd < 0) return;
  const std::string text = value + "\n";
  const bool ok = write(fd, text.data(), text.size()) == static_cast<ssize_t>(text.size());
  close(fd);
  // rename: a reader sees the old content or the new, never a partial file.
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) unlink(tmp.c_str());
}

void make_dirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i == path.size() || path[i] == '/') mkdir(path.substr(0, i).c_str(), 0755);
  }
}

// One attribute of droce<index>, if droce provides it.
void write_attr(int index, const std::string& dev_dir, const std::string& file) {
  std::string value;
  if (!sysfs_attr(index, file, &value)) return;
  const std::string path = dev_dir + "/" + file;
  make_dirs(path.substr(0, path.rfind('/')));
  write_file(path, value);
}

// Each entry of real_dir as a symlink in tree_dir, except those in `skip`.
void link_entries(const std::string& real_dir, const std::string& tree_dir,
                  std::initializer_list<const char*> skip) {
  DIR* d = REAL(opendir)(real_dir.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    bool skipped = false;
    for (const char* s : skip) skipped |= strcmp(e->d_name, s) == 0;
    if (!skipped) (void)!symlink((real_dir + "/" + e->d_name).c_str(), (tree_dir + "/" + e->d_name).c_str());
  }
  closedir(d);
}

int remove_entry(const char* path, const struct stat*, int, FTW*) { return remove(path); }

void remove_tree(const char* dir) { nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

void remove_at_exit() {
  // A forked child inherits this handler; only the maker removes the tree.
  if (getpid() == owner && root[0] != '\0') remove_tree(root);
}

// Trees left by processes that died without running atexit (a signal,
// _exit): droce-sysfs-<pid>-* of ours whose pid no longer exists.
void sweep_stale(const std::string& tmpdir) {
  DIR* d = REAL(opendir)(tmpdir.c_str());
  if (d == nullptr) return;
  while (dirent* e = readdir(d)) {
    constexpr char kPrefix[] = "droce-sysfs-";
    if (strncmp(e->d_name, kPrefix, sizeof(kPrefix) - 1) != 0) continue;
    char* end = nullptr;
    const long pid = strtol(e->d_name + sizeof(kPrefix) - 1, &end, 10);
    if (end == nullptr || *end != '-' || pid <= 0) continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    const std::string path = tmpdir + "/" + e->d_name;
    struct stat st;
    if (REAL(lstat)(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == getuid()) {
      remove_tree(path.c_str());
    }
  }
  closedir(d);
}

std::string ib_dir(int index) { return std::string(root) + "/class/infiniband/droce" + std::to_string(index); }

// Rewrites the port files when the port goes up or down (or the device
// dies): called on the device's worker thread, a rare event.
struct PortStateSink : public engine::EventSink {
  int index = 0;
  void QpEvent(uint64_t, int) override {}
  void SrqEvent(uint64_t, int) override {}
  void DeviceEvent(int) override {
    write_attr(index, ib_dir(index), "ports/1/state");
    write_attr(index, ib_dir(index), "ports/1/phys_state");
  }
};

void write_device(int index) {
  const std::string dir = ib_dir(index);
  make_dirs(dir);
  for (const char* f : {"node_type", "node_guid", "sys_image_guid", "fw_ver", "hw_rev", "board_id",
                        "node_desc"}) {
    write_attr(index, dir, f);
  }
  for (const char* f : {"state", "phys_state", "link_layer", "lid", "sm_lid", "lid_mask_count", "sm_sl",
                        "cap_mask", "rate", "pkeys/0"}) {
    write_attr(index, dir, std::string("ports/1/") + f);
  }
  auto dev = session_for(index);
  const unsigned gids = dev.ok() ? (*dev)->port().gid_count : 0;
  for (unsigned i = 0; i < gids; ++i) {
    write_attr(index, dir, "ports/1/gids/" + std::to_string(i));
    write_attr(index, dir, "ports/1/gid_attrs/types/" + std::to_string(i));
  }
  // device/net/IFNAME for each kernel interface that carries the port's
  // IPv4 address, as a RoCE device lists its netdev there (rdma-core's
  // suite finds the address its rdma_cm tests use that way). Only a link
  // on a kernel interface (af_packet, af_xdp) or a test that gives one the
  // same address has one.
  if (dev.ok() && (*dev)->port().ip != 0) {
    ifaddrs* ifs = nullptr;
    if (getifaddrs(&ifs) == 0) {
      for (ifaddrs* a = ifs; a != nullptr; a = a->ifa_next) {
        if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
        const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
        if (ntohl(in->sin_addr.s_addr) == (*dev)->port().ip) make_dirs(dir + "/device/net/" + a->ifa_name);
      }
      freeifaddrs(ifs);
    }
  }
  // hw_counters/: one file per device counter; an open of one reads the
  // live value (hw_counters.cc), the files here answer stat and readdir.
  make_dirs(dir + "/ports/1/hw_counters");
  for (const CounterInfo& c : kCounterInfo) write_file(dir + "/ports/1/hw_counters/" + c.name, "0");
  for (const CounterAlias& a : kCounterAliases) write_file(dir + "/ports/1/hw_counters/" + a.name, "0");
  const std::string name = "droce" + std::to_string(index);
  const std::string uverbs = std::string(root) + "/class/infiniband_verbs/uverbs-" + name;
  make_dirs(uverbs);
  write_file(uverbs + "/ibdev", name);
  write_file(uverbs + "/abi_version", "1");
  write_file(uverbs + "/dev", std::to_string(kUverbsMajor) + ":" + std::to_string(kUverbsBaseMinor + index));
  if (dev.ok()) {
    static PortStateSink sinks[config::kMaxDevices];
    sinks[index].index = index;
    (*dev)->AddDeviceSink(&sinks[index]);
  }
}

void build_tree() {
  const char* env = getenv("SYSFS_PATH");  // as libibverbs' ibv_get_sysfs_path
  std::string base = env != nullptr && env[0] != '\0' ? env : "/sys";
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  snprintf(real_sysfs, sizeof(real_sysfs), "%s", base.c_str());
  const char* t = getenv("TMPDIR");
  const std::string tmpdir = t != nullptr && t[0] != '\0' ? t : "/tmp";
  sweep_stale(tmpdir);
  std::string tmpl = tmpdir + "/droce-sysfs-" + std::to_string(getpid()) + "-XXXXXX";
  if (mkdtemp(tmpl.data()) == nullptr) {
    Log(LogLevel::kError, "cannot make the sysfs view in %s: %s", tmpdir.c_str(), strerror(errno));
    return;
  }
  snprintf(root, sizeof(root), "%s", tmpl.c_str());
  owner = getpid();
  atexit(remove_at_exit);
  const std::string r = root;
  link_entries(base, r, {"class"});
  make_dirs(r + "/class/infiniband");
  make_dirs(r + "/class/infiniband_verbs");
  link_entries(base + "/class", r + "/class", {"infiniband", "infiniband_verbs"});
  link_entries(base + "/class/infiniband", r + "/class/infiniband", {});
  link_entries(base + "/class/infiniband_verbs", r + "/class/infiniband_verbs", {});
  struct stat st;
  if (REAL(lstat)((r + "/class/infiniband_verbs/abi_version").c_str(), &st) != 0) {
    write_file(r + "/class/infiniband_verbs/abi_version", "6");  // the kernel's uverbs ABI
  }
  // rdma_ucm's ABI (RDMA_USER_CM_ABI_VERSION), which librdmacm checks when
  // it cannot ask over netlink; the host's if it has rdma_ucm.
  if (REAL(lstat)((r + "/class/infiniband_ucma").c_str(), &st) != 0) {
    make_dirs(r + "/class/infiniband_ucma");
    write_file(r + "/class/infiniband_ucma/abi_version", "4");
  }
  const int n = std::min(device_count(), config::kMaxDevices);
  for (int i = 0; i < n; ++i) write_device(i);
  root_len.store(strlen(root), std::memory_order_release);
}

// The tree's root, made on the first call; nullptr if it could not be made
// or this thread is making it.
const char* tree() {
  if (building) return nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    building = true;
    build_tree();
    building = false;
  });
  return root[0] != '\0' ? root : nullptr;
}

// ---------------------------------------------------------------------------
// Paths.

enum class Kind { kPass, kSysfs, kDevNode, kDevDir, kCmNode, kCounter };

struct Target {
  Kind kind = Kind::kPass;
  int index = -1;            // kDevNode, kCounter: the device; -1: not configured (ENOENT)
  int counter = -1;          // kCounter: its index in kCounterInfo
  char path[PATH_MAX] = "";  // kSysfs: the path inside the tree
};

// The one check on every interposed call: two character compares and, for
// /sys/... and /dev/... paths, one strncmp. Nothing is allocated.
inline bool maybe_ours(const char* p) {
  // The callers' paths are declared nonnull; a program may still pass null,
  // which the real function answers (EFAULT). Hide the attribute from the
  // compiler so that the check stays.
  asm("" : "+r"(p));
  if (p == nullptr || p[0] != '/') return false;
  // The system libibverbs scanning for its own devices sees the real files
  // (system_verbs.h): neither droce's entries nor an engine started for them.
  if (p[1] == 's') return strncmp(p, kClassIb, sizeof(kClassIb) - 1) == 0 && !in_system_scan();
  if (p[1] == 'd') return strncmp(p, kDevIb, sizeof(kDevIb) - 1) == 0 && !in_system_scan();
  // The tree itself (a path built from ibv_get_sysfs_path()): only its
  // hw_counters files are answered here.
  const size_t n = root_len.load(std::memory_order_acquire);
  return n != 0 && p[1] == root[1] && strncmp(p, root, n) == 0;
}

// "/class/infiniband/droce<N>/ports/1/hw_counters/<name>" (a path relative
// to the sysfs root): sets the device and the counter.
bool counter_path(const char* rel, Target* t) {
  constexpr char kPrefix[] = "/class/infiniband/";
  if (strncmp(rel, kPrefix, sizeof(kPrefix) - 1) != 0) return false;
  const char* p = rel + sizeof(kPrefix) - 1;
  const int index = parse_index(p, "droce");
  if (index < 0) return false;
  p = strchr(p, '/');
  constexpr char kDir[] = "/ports/1/hw_counters/";
  if (p == nullptr || strncmp(p, kDir, sizeof(kDir) - 1) != 0) return false;
  const int counter = hw_counter_index(p + sizeof(kDir) - 1);
  if (counter < 0 || index >= device_count()) return false;
  t->index = index;
  t->counter = counter;
  return true;
}

// The droce part of the real sysfs: the two class directories themselves and
// what is under droce<N> and uverbs-droce<N>; the path relative to the sysfs
// root, or nullptr.
const char* sysfs_rel(const char* p) {
  const char* rest = p + sizeof(kClassIb) - 1;  // after /sys/class/infiniband
  if (strncmp(rest, "_verbs", 6) == 0) rest += 6;
  if (rest[0] == '\0' || (rest[0] == '/' && rest[1] == '\0')) return p + 4;  // the directory
  if (rest[0] != '/') return nullptr;
  if (strcmp(p, kVerbsAbi) == 0) {
    // The host's, if it has uverbs; else the tree's.
    struct stat st;
    return REAL(stat)(p, &st) == 0 ? nullptr : p + 4;
  }
  if (parse_index(rest + 1, "droce") < 0 && parse_index(rest + 1, "uverbs-droce") < 0) return nullptr;
  return p + 4;  // after "/sys"
}

Target classify(const char* p) {
  Target t;
  const size_t n = root_len.load(std::memory_order_acquire);
  if (n != 0 && p[1] == root[1] && strncmp(p, root, n) == 0) {
    if (counter_path(p + n, &t)) {
      t.kind = Kind::kCounter;  // else the tree's own file, as it is
      snprintf(t.path, sizeof(t.path), "%s", p);
    }
    return t;
  }
  if (p[1] == 's') {
    const char* rel = sysfs_rel(p);
    if (rel == nullptr) return t;
    const char* r = tree();
    if (r == nullptr) return t;
    if (snprintf(t.path, sizeof(t.path), "%s%s", r, rel) >= static_cast<int>(sizeof(t.path))) return t;
    t.kind = counter_path(rel, &t) ? Kind::kCounter : Kind::kSysfs;
    return t;
  }
  const char* rest = p + sizeof(kDevIb) - 1;
  if (rest[0] == '\0' || (rest[0] == '/' && rest[1] == '\0')) {
    // /dev/infiniband itself: a directory, if the host has none.
    struct stat st;
    if (REAL(stat)(kDevIb, &st) != 0) t.kind = Kind::kDevDir;
    return t;
  }
  if (rest[0] != '/') return t;
  if (strcmp(rest + 1, "rdma_cm") == 0) {
    t.kind = Kind::kCmNode;  // librdmacm's rdma_ucm device (rdma_cm.cc)
    return t;
  }
  const int index = parse_index(rest + 1, "uverbs-droce");
  if (index < 0 || strchr(rest + 1, '/') != nullptr) return t;
  t.kind = Kind::kDevNode;
  t.index = index < device_count() ? index : -1;
  return t;
}

// The device node: a character device with uverbs' numbers, mode 0666.
int fake_stat(const Target& t, struct stat* st) {
  if (t.kind == Kind::kDevNode && t.index < 0) {
    errno = ENOENT;
    return -1;
  }
  if (t.kind == Kind::kCmNode) {
    // The host's rdma_cm numbers if it has that device (librdmacm may have
    // learnt them over netlink and compares), else misc's major.
    struct stat real;
    const bool host = REAL(stat)(kCmNode, &real) == 0 && S_ISCHR(real.st_mode);
    if (REAL(stat)("/dev/null", st) != 0) return -1;
    st->st_mode = S_IFCHR | 0666;
    st->st_rdev = host ? real.st_rdev : makedev(kMiscMajor, kCmMinor);
    st->st_ino = 0x72636d;
    return 0;
  }
  const bool node = t.kind == Kind::kDevNode;
  if (REAL(stat)(node ? "/dev/null" : "/dev", st) != 0) return -1;
  if (node) {
    st->st_mode = S_IFCHR | 0666;
    st->st_rdev = makedev(kUverbsMajor, kUverbsBaseMinor + t.index);
    st->st_ino = 0x64726f63 + t.index;  // not /dev/null's
  } else {
    st->st_mode = S_IFDIR | 0755;
  }
  return 0;
}

int fake_access(const Target& t, int mode) {
  if (t.kind == Kind::kDevNode && t.index < 0) {
    errno = ENOENT;
    return -1;
  }
  if (((t.kind == Kind::kDevNode || t.kind == Kind::kCmNode) && (mode & X_OK)) || (t.kind == Kind::kDevDir && (mode & W_OK))) {
    errno = EACCES;
    return -1;
  }
  return 0;
}

// The device node opens as /dev/null with the caller's flags: reads see end
// of file, writes are discarded. A later issue gives it a real protocol; for
// now a program may check that it can open the node, and droce's own verbs
// never use it.
int fake_open(const Target& t, int flags, int (*real_open)(const char*, int, ...)) {
  if (t.kind == Kind::kCmNode && !(flags & O_DIRECTORY)) return cm_open_channel(flags);
  if (t.kind == Kind::kCounter) {
    if (flags & O_DIRECTORY) {
      errno = ENOTDIR;
      return -1;
    }
    return hw_counter_open(t.index, t.counter, flags);
  }
  if (t.kind != Kind::kDevNode || t.index < 0) {
    errno = ENOENT;
    return -1;
  }
  if ((flags & O_CREAT) && (flags & O_EXCL)) {
    errno = EEXIST;
    return -1;
  }
  if (flags & O_DIRECTORY) {
    errno = ENOTDIR;
    return -1;
  }
  return real_open("/dev/null", flags & ~(O_CREAT | O_TRUNC), 0);
}

// A path answered by the tree's file (stat, access, readdir...).
inline bool in_tree(Kind k) { return k == Kind::kSysfs || k == Kind::kCounter; }

inline bool needs_mode(int flags) { return (flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE; }

}  // namespace

const char* sysfs_root() {
  const char* r = tree();
  if (r != nullptr) return r;
  return real_sysfs[0] != '\0' ? real_sysfs : "/sys";
}

bool sysfs_map(const char* path, char* out, size_t size) {
  if (!maybe_ours(path) || path[1] != 's') return false;
  Target t = classify(path);
  if (t.kind != Kind::kSysfs) return false;
  return snprintf(out, size, "%s", t.path) < static_cast<int>(size);
}

}  // namespace droce::provider

using droce::provider::Kind;
using droce::provider::Target;
using namespace droce::provider;

// The interposed calls. Each: one cheap check, then the real function with
// the path or the mapped path; the device node answered here.
extern "C" {

// The mode argument of open & co., present only with O_CREAT or O_TMPFILE.
#define DROCE_OPEN_MODE(flags)  \
  mode_t mode = 0;              \
  if (needs_mode(flags)) {      \
    va_list ap;                 \
    va_start(ap, flags);        \
    mode = va_arg(ap, mode_t);  \
    va_end(ap);                 \
  }

#define DROCE_OPEN_BODY(real_fn, call_path, ...)                    \
  if (maybe_ours(call_path)) {                                      \
    const Target t = classify(call_path);                           \
    if (t.kind == Kind::kSysfs) return real_fn(t.path, __VA_ARGS__); \
    if (t.kind == Kind::kDevNode || t.kind == Kind::kCmNode || t.kind == Kind::kCounter) \
      return fake_open(t, flags, REAL(open));                       \
  }                                                                 \
  return real_fn(call_path, __VA_ARGS__)

int open(const char* path, int flags, ...) {
  DROCE_OPEN_MODE(flags);
  DROCE_OPEN_BODY(REAL(open), path, flags, mode);
}

int open64(const char* path, int flags, ...) {
  DROCE_OPEN_MODE(flags);
  DROCE_OPEN_BODY(REAL(open64), path, flags, mode);
}

int __open_2(const char* path, int flags) { DROCE_OPEN_BODY(REAL(__open_2), path, flags); }
int __open64_2(const char* path, int flags) { DROCE_OPEN_BODY(REAL(__open64_2), path, flags); }

#define DROCE_OPENAT_BODY(real_fn, ...)                                   \
  if (maybe_ours(path)) {            \
    const Target t = classify(path);                                      \
    if (t.kind == Kind::kSysfs) return real_fn(dirfd, t.path, __VA_ARGS__); \
    if (t.kind == Kind::kDevNode || t.kind == Kind::kCmNode || t.kind == Kind::kCounter) \
      return fake_open(t, flags, REAL(open));                             \
  }                                                                       \
  return real_fn(dirfd, path, __VA_ARGS__)

int openat(int dirfd, const char* path, int flags, ...) {
  DROCE_OPEN_MODE(flags);
  DROCE_OPENAT_BODY(REAL(openat), flags, mode);
}

int openat64(int dirfd, const char* path, int flags, ...) {
  DROCE_OPEN_MODE(flags);
  DROCE_OPENAT_BODY(REAL(openat64), flags, mode);
}

int __openat_2(int dirfd, const char* path, int flags) { DROCE_OPENAT_BODY(REAL(__openat_2), flags); }
int __openat64_2(int dirfd, const char* path, int flags) { DROCE_OPENAT_BODY(REAL(__openat64_2), flags); }

// glibc's fopen and opendir open the file with internal calls that no
// interposed open sees.
#define DROCE_FOPEN_BODY(real_fn)                                   \
  if (maybe_ours(path)) {                                           \
    const Target t = classify(path);                                \
    if (t.kind == Kind::kSysfs) return real_fn(t.path, mode);       \
    if (t.kind == Kind::kCounter) {                                 \
      const int fd = hw_counter_open(t.index, t.counter,            \
                                     strchr(mode, '+') || mode[0] != 'r' ? O_RDWR : O_RDONLY, \
                                     /*live=*/false);               \
      return fd < 0 ? nullptr : fdopen(fd, mode);                   \
    }                                                               \
    if (t.kind == Kind::kDevNode) {                                 \
      if (t.index < 0) {                                            \
        errno = ENOENT;                                             \
        return nullptr;                                             \
      }                                                             \
      return real_fn("/dev/null", mode); /* as fake_open */         \
    }                                                               \
  }                                                                 \
  return real_fn(path, mode)

FILE* fopen(const char* path, const char* mode) { DROCE_FOPEN_BODY(REAL(fopen)); }
FILE* fopen64(const char* path, const char* mode) { DROCE_FOPEN_BODY(REAL(fopen64)); }

DIR* opendir(const char* path) {
  if (maybe_ours(path)) {
    const Target t = classify(path);
    if (in_tree(t.kind)) return REAL(opendir)(t.path);
    if (t.kind == Kind::kDevNode || t.kind == Kind::kCmNode) {
      errno = t.kind == Kind::kDevNode && t.index < 0 ? ENOENT : ENOTDIR;
      return nullptr;
    }
  }
  return REAL(opendir)(path);
}

#define DROCE_STAT_BODY(real_fn)                                 \
  if (maybe_ours(path)) {                                                 \
    const Target t = classify(path);                                      \
    if (in_tree(t.kind)) return real_fn(t.path, buf);              \
    if (t.kind != Kind::kPass) return fake_stat(t, reinterpret_cast<struct stat*>(buf)); \
  }                                                                       \
  return real_fn(path, buf)

static_assert(sizeof(struct stat) == sizeof(struct stat64), "x86_64: one stat layout");

int stat(const char* path, struct stat* buf) { DROCE_STAT_BODY(REAL(stat)); }
int stat64(const char* path, struct stat64* buf) { DROCE_STAT_BODY(REAL(stat64)); }
int lstat(const char* path, struct stat* buf) { DROCE_STAT_BODY(REAL(lstat)); }
int lstat64(const char* path, struct stat64* buf) { DROCE_STAT_BODY(REAL(lstat64)); }

#define DROCE_FSTATAT_BODY(real_fn)                                       \
  if (maybe_ours(path)) {            \
    const Target t = classify(path);                                      \
    if (in_tree(t.kind)) return real_fn(dirfd, t.path, buf, flags); \
    if (t.kind != Kind::kPass) return fake_stat(t, reinterpret_cast<struct stat*>(buf)); \
  }                                                                       \
  return real_fn(dirfd, path, buf, flags)

int fstatat(int dirfd, const char* path, struct stat* buf, int flags) { DROCE_FSTATAT_BODY(REAL(fstatat)); }
int fstatat64(int dirfd, const char* path, struct stat64* buf, int flags) {
  DROCE_FSTATAT_BODY(REAL(fstatat64));
}

int statx(int dirfd, const char* path, int flags, unsigned int mask, struct statx* buf) {
  if (maybe_ours(path)) {
    const Target t = classify(path);
    if (in_tree(t.kind)) return REAL(statx)(dirfd, t.path, flags, mask, buf);
    if (t.kind != Kind::kPass) {
      struct stat st;
      if (fake_stat(t, &st) != 0) return -1;
      if (REAL(statx)(AT_FDCWD, t.kind != Kind::kDevDir ? "/dev/null" : "/dev", flags, mask, buf) != 0) {
        return -1;
      }
      buf->stx_mode = static_cast<uint16_t>(st.st_mode);
      buf->stx_ino = st.st_ino;
      buf->stx_rdev_major = major(st.st_rdev);
      buf->stx_rdev_minor = minor(st.st_rdev);
      return 0;
    }
  }
  return REAL(statx)(dirfd, path, flags, mask, buf);
}

int access(const char* path, int mode) {
  if (maybe_ours(path)) {
    const Target t = classify(path);
    if (in_tree(t.kind)) return REAL(access)(t.path, mode);
    if (t.kind != Kind::kPass) return fake_access(t, mode);
  }
  return REAL(access)(path, mode);
}

int faccessat(int dirfd, const char* path, int mode, int flags) {
  if (maybe_ours(path)) {
    const Target t = classify(path);
    if (in_tree(t.kind)) return REAL(faccessat)(dirfd, t.path, mode, flags);
    if (t.kind != Kind::kPass) return fake_access(t, mode);
  }
  return REAL(faccessat)(dirfd, path, mode, flags);
}

// glibc's realpath walks the path with internal lstat and readlink calls
// that no interposed function sees, so a droce path would not resolve:
// inside the view a droce path is its own canonical name (perftest's
// --report-counters resolves each counter's path before it opens it).
// Lexical: "//", "." and ".." folded, as the kernel's view has no symlinks
// there.
char* droce_realpath(const char* path, char* resolved) {
  char out[PATH_MAX];
  size_t n = 0;
  for (const char* p = path; *p != '\0';) {
    while (*p == '/') ++p;
    const char* end = p;
    while (*end != '\0' && *end != '/') ++end;
    const size_t len = static_cast<size_t>(end - p);
    if (len == 0 || (len == 1 && p[0] == '.')) {
    } else if (len == 2 && p[0] == '.' && p[1] == '.') {
      while (n > 0 && out[n - 1] != '/') --n;
      if (n > 0) --n;
    } else {
      if (n + 1 + len >= sizeof(out)) {
        errno = ENAMETOOLONG;
        return nullptr;
      }
      out[n++] = '/';
      memcpy(out + n, p, len);
      n += len;
    }
    p = end;
  }
  if (n == 0) out[n++] = '/';
  out[n] = '\0';
  if (resolved == nullptr) return strdup(out);
  memcpy(resolved, out, n + 1);
  return resolved;
}

char* realpath(const char* path, char* resolved) {
  if (maybe_ours(path)) {
    const Target t = classify(path);
    struct stat st;
    if (in_tree(t.kind) && REAL(stat)(t.path, &st) == 0) return droce_realpath(path, resolved);
  }
  return REAL(realpath)(path, resolved);
}

char* __realpath_chk(const char* path, char* resolved, size_t resolvedlen) {
  if (resolvedlen < PATH_MAX) abort();  // as glibc's fortified check
  return realpath(path, resolved);
}

char* canonicalize_file_name(const char* path) { return realpath(path, nullptr); }

ssize_t readlink(const char* path, char* buf, size_t size) {
  if (maybe_ours(path)) {
    const Target t = classify(path);
    if (in_tree(t.kind)) return REAL(readlink)(t.path, buf, size);
    if (t.kind != Kind::kPass) {
      errno = (t.kind == Kind::kDevNode && t.index < 0) ? ENOENT : EINVAL;  // not a symlink
      return -1;
    }
  }
  return REAL(readlink)(path, buf, size);
}

}  // extern "C"
