// libFuzzer target: the CM MAD decoder (src/cm/mad.cc) and the connection
// manager's handling of whatever it decodes (src/cm/ib_cm.cc and
// manager.cc). Any input must decode or be refused without a crash; a
// decoded MAD must re-encode to bytes that decode to the same encoding; and
// a manager with a listener and a connecting id must take it (and the
// timers after it) without a crash, a leak or an id that outlives its
// destroy.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "cm/mad.h"
#include "cm/manager.h"

namespace {
using namespace droce::cm;

struct NullPort : PortIo {
  uint64_t sent = 0;
  void SendMad(const Gid&, const Gid&, uint32_t, uint8_t, std::span<const uint8_t, kMadSize>) override { ++sent; }
  int Resolve(const Gid&) override { return 1; }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Mad m;
  if (decode({data, size}, &m) == MadError::kOk) {
    std::array<uint8_t, kMadSize> once, twice;
    encode(m.hdr, m.msg, once);
    Mad again;
    if (decode(once, &again) != MadError::kOk) __builtin_trap();
    encode(again.hdr, again.msg, twice);
    if (once != twice) __builtin_trap();
  }
  uint64_t now = 1'000'000'000;
  NullPort port;
  std::vector<Event> events;
  Manager mgr([&](const Event& e) { events.push_back(e); }, [&] { return now; }, 1);
  LocalPort lp;
  lp.ip4 = 0x0A000001;
  mgr.AddPort(lp, &port);
  uint32_t listener, active, ud;
  IpAddr any;
  any.port = 7174;
  mgr.CreateId(kRdmaPsTcp, kQpRc, &listener);
  mgr.Bind(listener, any);
  mgr.Listen(listener, 8);
  mgr.CreateId(kRdmaPsUdp, kQpUd, &ud);
  mgr.Bind(ud, any);
  mgr.Listen(ud, 8);
  mgr.CreateId(kRdmaPsTcp, kQpRc, &active);
  IpAddr dst;
  dst.ip = ipv4_gid(0x0A000002);
  dst.port = 7174;
  mgr.ResolveAddr(active, nullptr, dst, 1000);
  mgr.ResolveRoute(active, 1000);
  ConnParam p;
  p.valid = true;
  mgr.Connect(active, p);
  MadSource src;
  src.sgid = ipv4_gid(0x0A000002);
  src.dgid = ipv4_gid(0x0A000001);
  src.src_qpn = 1;
  // The input as one MAD, then again (a duplicate), then in 256-byte pieces.
  mgr.OnMad(0, src, {data, size});
  mgr.OnMad(0, src, {data, size});
  for (size_t off = 0; off + kMadSize <= size && off < 16 * kMadSize; off += kMadSize) {
    mgr.OnMad(0, src, {data + off, kMadSize});
  }
  for (const Event& e : events) {
    if (e.event == kConnectRequest) {
      ConnParam acc;
      acc.valid = true;
      acc.qp_num = 0x55;
      mgr.Accept(e.id, &acc);
    }
  }
  for (int i = 0; i < 20; ++i) {
    now += 5'000'000'000;
    mgr.OnTimer();
  }
  for (const Event& e : events) mgr.DestroyId(e.id);
  mgr.DestroyId(active);
  mgr.DestroyId(listener);
  mgr.DestroyId(ud);
  return 0;
}
