// The sysfs view's hw_counters files (sysfs_view.cc): class/infiniband/
// droce<N>/ports/1/hw_counters/<name>, one per device counter of
// src/common/counters.h, as the kernel's rxe has them. Programs read them as
// sysfs files: perftest --report-counters opens each once and reads it again
// after lseek(0) at the end of the run. So an open returns a memfd holding
// the value, and a read on it first writes the value of that moment
// (read, pread and their fortified forms are interposed with one bitmap test,
// like rdma_cm.cc's write and close).
// Defines read & co. as themselves: no fortify wrappers, no pread → pread64.
#undef _FORTIFY_SOURCE
#undef _FILE_OFFSET_BITS
#include "hw_counters.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/counters.h"
#include "interpose.h"
#include "sessions.h"

extern "C" {
ssize_t __read_chk(int fd, void* buf, size_t nbytes, size_t buflen);
ssize_t __pread_chk(int fd, void* buf, size_t nbytes, off_t offset, size_t buflen);
ssize_t __pread64_chk(int fd, void* buf, size_t nbytes, off64_t offset, size_t buflen);
}

namespace droce::provider {
namespace {

constexpr int kMaxFds = 1 << 16;

std::atomic<uint64_t> counter_bits[kMaxFds / 64];
// dev << 8 | counter index, for the fds whose bit is set.
std::atomic<uint16_t> counter_of[kMaxFds];

inline bool is_counter_fd(int fd) {
  return fd >= 0 && fd < kMaxFds &&
         (counter_bits[fd / 64].load(std::memory_order_acquire) & (uint64_t{1} << (fd % 64))) != 0;
}

constexpr char kLiveName[] = "droce-hw-counter";

// Whether fd is still the memfd hw_counter_open made: a program may close it
// without our close (fclose, close_range) and the number be reused, so the
// bit alone is not trusted before writing.
bool still_ours(int fd) {
  char link[64], target[64];
  std::snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
  const ssize_t n = readlink(link, target, sizeof(target) - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  return std::strncmp(target, "/memfd:", 7) == 0 && std::strncmp(target + 7, kLiveName, sizeof(kLiveName) - 1) == 0;
}

// Writes counter `counter` of device `dev` now ("N\n", as sysfs prints it)
// over fd's contents; false if it could not.
bool write_value(int fd, int dev, size_t counter) {
  uint64_t value = 0;
  auto s = session_for(dev);
  if (s.ok() && counter < kNumCounters) value = (*s)->ReadCounters().*kCounterInfo[counter].field;
  char buf[32];
  const int n = std::snprintf(buf, sizeof(buf), "%llu\n", static_cast<unsigned long long>(value));
  return pwrite(fd, buf, static_cast<size_t>(n), 0) == n && ftruncate(fd, n) == 0;
}

void refresh(int fd) {
  if (!still_ours(fd)) {
    counter_bits[fd / 64].fetch_and(~(uint64_t{1} << (fd % 64)), std::memory_order_release);
    return;
  }
  const uint16_t c = counter_of[fd].load(std::memory_order_relaxed);
  (void)write_value(fd, c >> 8, c & 0xFF);
}

}  // namespace

int hw_counter_index(const char* name) {
  for (const CounterAlias& a : kCounterAliases) {
    if (std::strcmp(a.name, name) == 0) name = a.target;
  }
  for (size_t i = 0; i < kNumCounters; ++i) {
    if (std::strcmp(kCounterInfo[i].name, name) == 0) return static_cast<int>(i);
  }
  return -1;
}

int hw_counter_open(int dev, int counter, int flags, bool live) {
  if ((flags & O_ACCMODE) != O_RDONLY) {
    errno = EACCES;  // sysfs counters are read-only (mode 0444)
    return -1;
  }
  if (!live) {
    // A snapshot (fopen: glibc reads and closes it with calls we do not
    // see): the value now, in a memfd nobody refreshes.
    const int fd = memfd_create("droce-hw-snapshot", (flags & O_CLOEXEC) ? MFD_CLOEXEC : 0);
    if (fd < 0) return -1;
    if (!write_value(fd, dev, static_cast<size_t>(counter))) {
      close(fd);
      return -1;
    }
    return fd;
  }
  const int fd = memfd_create(kLiveName, (flags & O_CLOEXEC) ? MFD_CLOEXEC : 0);
  if (fd < 0) return -1;
  if (fd >= kMaxFds) {
    close(fd);
    errno = EMFILE;
    return -1;
  }
  counter_of[fd].store(static_cast<uint16_t>(dev << 8 | counter), std::memory_order_relaxed);
  counter_bits[fd / 64].fetch_or(uint64_t{1} << (fd % 64), std::memory_order_release);
  refresh(fd);
  return fd;
}

void hw_counter_closed(int fd) {
  if (is_counter_fd(fd)) counter_bits[fd / 64].fetch_and(~(uint64_t{1} << (fd % 64)), std::memory_order_release);
}

}  // namespace droce::provider

using droce::provider::is_counter_fd;
using droce::provider::refresh;

extern "C" {

ssize_t read(int fd, void* buf, size_t n) {
  if (is_counter_fd(fd)) refresh(fd);
  return REAL(read)(fd, buf, n);
}
ssize_t __read_chk(int fd, void* buf, size_t n, size_t buflen) {
  if (is_counter_fd(fd)) refresh(fd);
  return REAL(__read_chk)(fd, buf, n, buflen);
}
ssize_t pread(int fd, void* buf, size_t n, off_t off) {
  if (is_counter_fd(fd)) refresh(fd);
  return REAL(pread)(fd, buf, n, off);
}
ssize_t pread64(int fd, void* buf, size_t n, off64_t off) {
  if (is_counter_fd(fd)) refresh(fd);
  return REAL(pread64)(fd, buf, n, off);
}
ssize_t __pread_chk(int fd, void* buf, size_t n, off_t off, size_t buflen) {
  if (is_counter_fd(fd)) refresh(fd);
  return REAL(__pread_chk)(fd, buf, n, off, buflen);
}
ssize_t __pread64_chk(int fd, void* buf, size_t n, off64_t off, size_t buflen) {
  if (is_counter_fd(fd)) refresh(fd);
  return REAL(__pread64_chk)(fd, buf, n, off, buflen);
}

}  // extern "C"
