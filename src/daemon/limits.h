// Per-client limits of droced (daemon/server.h enforces them), apart from
// the server so that the configuration file's parser (daemon/config_file.h)
// needs no engine.
#pragma once

#include <cstdint>

namespace droce::daemon {

// Per-client limits (0: none beyond the device's own).
struct ClientLimits {
  uint32_t max_qps = 4096;
  uint32_t max_cqs = 4096;
  uint32_t max_mrs = 65536;
  uint64_t max_cqes = 1u << 22;
  // Registered bytes: also at most the client's RLIMIT_MEMLOCK unless it has
  // CAP_IPC_LOCK.
  uint64_t max_mr_bytes = 0;
};

}  // namespace droce::daemon
