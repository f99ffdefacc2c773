// 24-bit packet sequence number arithmetic (IBA 9.7.1): PSNs wrap at 2^24 and
// are compared inside a 2^23 window.
#pragma once

#include <cstdint>

namespace droce::wire {

inline constexpr uint32_t kPsnMask = 0xFFFFFF;

inline constexpr uint32_t psn_add(uint32_t psn, uint32_t n) { return (psn + n) & kPsnMask; }

// Signed distance a - b in the 24-bit space, in [-2^23, 2^23).
inline constexpr int32_t psn_diff(uint32_t a, uint32_t b) {
  return static_cast<int32_t>(((a - b) & kPsnMask) << 8) >> 8;
}
inline constexpr bool psn_lt(uint32_t a, uint32_t b) { return psn_diff(a, b) < 0; }
inline constexpr bool psn_le(uint32_t a, uint32_t b) { return psn_diff(a, b) <= 0; }
inline constexpr bool psn_gt(uint32_t a, uint32_t b) { return psn_diff(a, b) > 0; }
inline constexpr bool psn_ge(uint32_t a, uint32_t b) { return psn_diff(a, b) >= 0; }

// Message sequence numbers (IBA 9.7.5.1.1, carried in the AETH) are 24 bits
// too and wrap the same way.
inline constexpr uint32_t kMsnMask = 0xFFFFFF;
inline constexpr uint32_t msn_add(uint32_t msn, uint32_t n) { return (msn + n) & kMsnMask; }
inline constexpr int32_t msn_diff(uint32_t a, uint32_t b) { return psn_diff(a, b); }

static_assert(psn_add(kPsnMask, 1) == 0 && psn_diff(0, kPsnMask) == 1 && psn_lt(kPsnMask, 0) &&
              psn_diff(0x800000, 0) == -0x800000 && psn_gt(5, 4) && psn_ge(4, 4));

}  // namespace droce::wire
