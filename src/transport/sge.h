// Walking a scatter/gather list: the one place where the transport turns
// (SGE list, byte offset, length) into checked host memory.
#pragma once

#include <algorithm>
#include <cstdint>

#include "mem/mr_table.h"
#include "queue/abi.h"

namespace droce::transport {

enum class SgeResult : uint8_t { kOk, kAccess, kShort };

// Visits [offset, offset + len) of the list; every piece is checked against
// the MR table (lkey, PD, `need` rights, bounds) before `copy(place, done, n)`
// is called for it, `done` being the bytes visited so far; copy returns
// false if the memory could not be reached (kAccess). kShort: the list
// holds fewer than offset + len bytes. Checked on every use: an MR may have
// been deregistered since the WQE was posted.
template <typename Copy>
SgeResult WalkSges(const mem::MrTable& mrs, uint32_t pd, const queue::Sge* sges, unsigned nsge,
                   uint32_t offset, uint32_t len, uint32_t need, Copy&& copy) {
  uint32_t done = 0;
  for (unsigned i = 0; i < nsge && done < len; ++i) {
    const queue::Sge& s = sges[i];
    if (offset >= s.length) {
      offset -= s.length;
      continue;
    }
    const uint32_t n = std::min(s.length - offset, len - done);
    mem::Place place;
    if (mrs.Check(s.lkey, pd, s.addr + offset, n, need, &place) != mem::AccessError::kOk ||
        !copy(place, done, n)) {
      return SgeResult::kAccess;
    }
    done += n;
    offset = 0;
  }
  return done == len ? SgeResult::kOk : SgeResult::kShort;
}

}  // namespace droce::transport
