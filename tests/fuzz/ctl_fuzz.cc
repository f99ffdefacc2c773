// libFuzzer target: droced's decoder of client messages
// (ctl::ValidateRequest). Any byte string, with any number of fds, must be
// either refused or accepted with exactly the payload length and fd count of
// its op and every field in range (checked again here from the bytes).
#include <cstdint>
#include <cstring>

#include "ctl/protocol.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace droce::ctl;
  if (size < 1) return 0;
  const int nfds = data[0] % (kMaxFds + 1);
  const uint8_t* msg = data + 1;
  const size_t len = size - 1;
  if (!ValidateRequest(msg, len, nfds).ok()) return 0;
  Header h;
  if (len < sizeof(h)) __builtin_trap();
  std::memcpy(&h, msg, sizeof(h));
  const OpShape* s = ShapeOf(h.op);
  if (s == nullptr || h.magic != kMagic || h.len != len || len != sizeof(h) + s->req_len) __builtin_trap();
  if (s->req_fds >= 0 && s->req_fds != nfds) __builtin_trap();
  const uint8_t* p = msg + sizeof(h);
  if (h.op == kRegMr) {
    RegMr r;
    std::memcpy(&r, p, sizeof(r));
    if (r.tier == kTierImplicit) {
      // The whole address space, nothing else: addr 0, every byte, no pieces.
      if (r.addr != 0 || r.len != UINT64_MAX || r.iova != 0 || r.npieces != 0 || nfds != 0) __builtin_trap();
    } else if (r.tier == kTierCopy) {
      if (r.npieces != 0 || nfds != 0) __builtin_trap();
    } else {
      if (r.npieces == 0 || r.npieces > kMaxPieces) __builtin_trap();
      uint64_t end = r.pieces[0].start;
      for (uint32_t i = 0; i < r.npieces; ++i) {
        if (r.pieces[i].fd >= static_cast<uint32_t>(nfds) || r.pieces[i].start != end || r.pieces[i].len % 4096) {
          __builtin_trap();
        }
        end += r.pieces[i].len;
      }
      if (end < r.addr + r.len) __builtin_trap();
    }
  } else if (h.op == kModifyQp) {
    ModifyQp m;
    std::memcpy(&m, p, sizeof(m));
    // Accepted: the fields the mask selects are in range (the others are
    // not looked at, ctl::Masked).
    const WireQpAttr w = Masked(m.attr, m.mask);
    droce::transport::QpAttr a;
    if (!FromWire(w, &a).ok()) __builtin_trap();
    // Round trip.
    const WireQpAttr back = ToWire(a);
    if (back.state != w.state || back.dest_qpn != w.dest_qpn) __builtin_trap();
  }
  return 0;
}
