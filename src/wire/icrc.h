// CRC-32 (IEEE 802.3 polynomial, reflected) as the ICRC uses it. Chaining:
// crc32(crc32(0, a), b) == crc32(0, a ++ b).
#pragma once

#include <cstddef>
#include <cstdint>

namespace droce::wire {

uint32_t crc32(uint32_t crc, const uint8_t* data, size_t len);

}  // namespace droce::wire
