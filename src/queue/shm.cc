#include "queue/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace droce::queue {

absl::StatusOr<ShmRegion> ShmRegion::MapShared(int fd, size_t size) {
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int e = errno;
    close(fd);
    return absl::ErrnoToStatus(e, "mmap");
  }
  ShmRegion r;
  r.base_ = p;
  r.size_ = size;
  r.fd_ = fd;
  return r;
}

absl::StatusOr<ShmRegion> ShmRegion::Create(std::string_view name, size_t size) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  size = (size + page - 1) / page * page;
  std::string n(name);
  int fd = memfd_create(n.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return absl::ErrnoToStatus(errno, "memfd_create");
  // Sealed at its size: a process the fd is passed to (a droced client) can
  // neither shrink it under the engine (SIGBUS) nor grow it.
  if (ftruncate(fd, static_cast<off_t>(size)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    int e = errno;
    close(fd);
    return absl::ErrnoToStatus(e, "ftruncate");
  }
  return MapShared(fd, size);
}

absl::StatusOr<ShmRegion> ShmRegion::Adopt(int fd, size_t size) {
  struct stat st;
  if (fd < 0 || size == 0 || fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < size) {
    if (fd >= 0) close(fd);
    return absl::InvalidArgumentError("shared memory smaller than announced");
  }
  return MapShared(fd, size);
}

ShmRegion& ShmRegion::operator=(ShmRegion&& o) noexcept {
  if (this != &o) {
    this->~ShmRegion();
    base_ = o.base_;
    size_ = o.size_;
    fd_ = o.fd_;
    o.base_ = nullptr;
    o.size_ = 0;
    o.fd_ = -1;
  }
  return *this;
}

ShmRegion::~ShmRegion() {
  if (base_ != nullptr) munmap(base_, size_);
  if (fd_ >= 0) close(fd_);
  base_ = nullptr;
  fd_ = -1;
}

}  // namespace droce::queue
