#include "wire/icrc.h"

#include <isa-l/crc.h>

namespace droce::wire {

// isa-l's crc32_gzip_refl is the reflected IEEE CRC-32 (poly 0x04C11DB7) with
// the pre- and post-inversion of gzip/Ethernet, and it chains; CRC-32C would
// be the wrong polynomial.
uint32_t crc32(uint32_t crc, const uint8_t* data, size_t len) {
  return crc32_gzip_refl(crc, data, len);
}

}  // namespace droce::wire
