// A learning Ethernet switch with a congested egress port model per port
// (cc/switch.h): the decisions of the live switch `droce-switch`
// (tools/droce_switch/) without its DPDK. A frame's source MAC is learned on
// its ingress port; a known unicast destination goes to its port, anything
// else (broadcast, multicast, unknown) floods to every other port. Each copy
// then meets its egress port: tail drop, RED/ECN marking, a departure time
// at the port's rate and an arrival time after its delay. Clock-free: the
// caller passes the time, so tests drive it in virtual time.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "cc/switch.h"

namespace droce::cc {

class Forwarder {
 public:
  // One egress model per port, all with the same parameters unless SetPort
  // changes one.
  Forwarder(int ports, const PortParams& p, uint64_t seed = 1) {
    for (int i = 0; i < ports; ++i) ports_.emplace_back(p, seed + static_cast<uint64_t>(i));
  }
  void SetPort(int port, const PortParams& p, uint64_t seed) { ports_[port] = EgressPort(p, seed); }
  int ports() const { return static_cast<int>(ports_.size()); }
  EgressPort& port(int i) { return ports_[i]; }

  struct Copy {
    int port = 0;
    bool mark = false;       // set CE on this copy
    uint64_t release_ns = 0;  // hand it to the port's link then
  };
  // A frame of `len` bytes (at least the Ethernet header) arrived on
  // `in_port` at now_ns; `ect`: it is ECN-capable. Fills `out` with the
  // copies to send (dropped ones are counted in their port's stats).
  void Ingress(int in_port, const uint8_t* frame, uint32_t len, bool ect, uint64_t now_ns, std::vector<Copy>* out) {
    out->clear();
    if (len < 14) return;
    Learn(frame + 6, in_port);
    const int to = (frame[0] & 1) ? -1 : Lookup(frame);
    for (int p = 0; p < ports(); ++p) {
      if (p == in_port || (to >= 0 && p != to)) continue;
      const EgressPort::Verdict v = ports_[p].Enqueue(len, ect, now_ns);
      if (v.drop) continue;
      out->push_back({p, v.mark, v.arrive_ns});
    }
    if (to < 0) ++flooded;
  }

  uint64_t flooded = 0;  // frames sent to every other port

 private:
  struct Entry {
    uint8_t mac[6];
    int port;
  };
  void Learn(const uint8_t* mac, int port) {
    if (mac[0] & 1) return;  // a group address is never a source
    for (Entry& e : table_) {
      if (std::memcmp(e.mac, mac, 6) == 0) {
        e.port = port;  // moved
        return;
      }
    }
    if (table_.size() >= kMaxEntries) return;
    Entry e;
    std::memcpy(e.mac, mac, 6);
    e.port = port;
    table_.push_back(e);
  }
  int Lookup(const uint8_t* mac) const {
    for (const Entry& e : table_) {
      if (std::memcmp(e.mac, mac, 6) == 0) return e.port;
    }
    return -1;
  }
  static constexpr size_t kMaxEntries = 1024;  // a lab switch: a few hosts

  std::vector<EgressPort> ports_;
  std::vector<Entry> table_;
};

}  // namespace droce::cc
