// memfd-backed shared memory. Every ring droce shares between an application
// and an engine lives in one of these, so that moving the engine into a daemon
// is a matter of passing the fd (SCM_RIGHTS), not of changing the layout.
#pragma once

#include <cstddef>
#include <string_view>

#include "absl/status/statusor.h"

namespace droce::queue {

class ShmRegion {
 public:
  static absl::StatusOr<ShmRegion> Create(std::string_view name, size_t size);
  // Maps `size` bytes of a memfd another process made (droced's, passed
  // with SCM_RIGHTS); takes the fd, which the region closes. Fails if the
  // file is smaller than `size`.
  static absl::StatusOr<ShmRegion> Adopt(int fd, size_t size);
  ShmRegion() = default;
  ShmRegion(ShmRegion&& o) noexcept { *this = std::move(o); }
  ShmRegion& operator=(ShmRegion&& o) noexcept;
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;
  ~ShmRegion();

  void* data() const { return base_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  // Maps fd (taken: closed on failure) read-write and shared.
  static absl::StatusOr<ShmRegion> MapShared(int fd, size_t size);
  void* base_ = nullptr;
  size_t size_ = 0;
  int fd_ = -1;
};

}  // namespace droce::queue
