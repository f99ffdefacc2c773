// What the transport needs from the engine around it. The transport has no
// DPDK in it: frames are plain byte buffers, time is a number, so a test can
// drive two QPs over a simulated link in virtual time.
#pragma once

#include <cstdint>

#include "common/counters.h"
#include "mem/mr_table.h"
#include "wire/frame.h"

namespace droce::transport {

struct AddressHandle;
class Srq;
}  // namespace droce::transport
namespace droce::cq {
class CqProducer;
}
namespace droce::transport {

// An XRC SRQ as an XRC target QP finds it by the number in a request's
// XRCETH: where the receive WQEs come from, where their completions go, and
// the PD that memory accesses of that request are checked against (IBA
// 9.8.3: an XRC request is executed on its SRQ's PD).
struct XrcSrqRef {
  Srq* srq = nullptr;
  cq::CqProducer* cq = nullptr;
  uint32_t pd = 0, xrcd = 0, id = 0;
};

struct TxFrame {
  uint8_t* data = nullptr;
  uint32_t capacity = 0;
  void* handle = nullptr;  // the engine's buffer (an mbuf)
  // The frame's 802.1p priority on a tagged link (a CNP's cnp_802p_prio);
  // -1: the port's (DROCE_VLAN's PCP).
  int8_t pcp = -1;
};

class TransportEnv {
 public:
  virtual ~TransportEnv() = default;
  virtual uint64_t NowNs() = 0;
  // The clock as read once at the start of the engine's current loop turn
  // (NowNs outside one): for completion timestamps and progress stamps,
  // where the turn's few microseconds do not matter and a clock read per
  // packet did (~150 ns through kvm-clock, 5 % of a 64 B receiver).
  virtual uint64_t TurnNs() { return NowNs(); }
  // A buffer for one frame of `len` bytes; false when none is available now
  // (the caller tries again on a later loop turn).
  virtual bool AllocFrame(uint32_t len, TxFrame* frame) = 0;
  // Queues a filled frame for transmission at the end of this loop turn.
  virtual void SendFrame(const TxFrame& frame, uint32_t len) = 0;
  // The next-hop MAC for a destination GID (IPv4-mapped: by ARP, else by
  // IPv6 neighbour discovery); false while it is being resolved.
  virtual bool ResolveMac(const wire::Ipv6Addr& dgid, wire::MacAddr* mac) = 0;
  virtual mem::MrTable& Mrs() = 0;
  // Invalidates a memory window or invalidatable MR named by `rkey` on `pd`
  // (SEND with invalidate, IBA 10.6.7.2); false if it cannot be invalidated.
  virtual bool InvalidateRkey(uint32_t rkey, uint32_t pd) = 0;
  // A UD address handle by id; nullptr if there is none.
  virtual const AddressHandle* FindAh(uint32_t id) = 0;
  // The XRC SRQ numbered `srqn`; false if there is none (an environment
  // without XRC has none).
  virtual bool FindXrcSrq(uint32_t srqn, XrcSrqRef* out) {
    (void)srqn;
    (void)out;
    return false;
  }
  virtual Counters& Stats() = 0;
};

}  // namespace droce::transport
