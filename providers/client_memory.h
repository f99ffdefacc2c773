// Client mode: makes registered memory reachable by droced (docs/ARCHITECTURE.md,
// "Application memory"). For each registration the pages it covers are
// described as pieces of files the daemon can map:
//   A  already shared: a MAP_SHARED memfd mapping whose fd this process still
//      holds (sealed against shrinking here if it is not yet);
//   B  private memory (malloc, the stack, anonymous or private file
//      mappings): the pages are copied onto a new memfd (sealed) mapped over
//      them at the same address, with MADV_DONTFORK; pages already moved by
//      an earlier registration are reused (reference-counted) and moved back
//      to private memory when the last registration using them goes;
//   C  anything else, or everything with DROCE_REMAP=0: no pieces, and the
//      daemon copies with process_vm_readv/writev.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "ctl/protocol.h"

namespace droce::provider {

struct Registration {
  uint32_t tier = ctl::kTierCopy;
  std::vector<ctl::Piece> pieces;  // fd: index into fds
  std::vector<int> fds;            // still owned by this module: send, do not close
  std::vector<uint64_t> chunks;    // moved chunks referenced (ReleaseMemory)
};

// Prepares [addr, addr+len) for registration with droced.
absl::StatusOr<Registration> PrepareMemory(uint64_t addr, uint64_t len);
// Drops the references a registration took (at deregistration, or when the
// daemon refused it).
void ReleaseMemory(const Registration& r);

}  // namespace droce::provider
