// The neighbour cache policy that ARP (arp.cc) and IPv6 neighbour discovery
// (nd.cc) share, kept apart from packets and clocks so that a unit test can
// drive it in virtual time (tests/unit/neighbor_test.cc).
//
// While a next hop is unresolved, a broadcast (ARP) or multicast (ND)
// request goes out every kRetryNs for as long as someone asks. A confirmed
// entry (a reply, a request addressed to us, RoCE traffic from it) is used
// without question for kReachableNs; after that it is still used, but
// re-probed with a unicast request every kProbeNs, and dropped after
// kMaxProbes unanswered probes, when resolution starts afresh. Linux's
// base_reachable_time is 30 s (randomised to 15–45 s); rxe uses the kernel's.
#pragma once

#include <cstdint>

#include "absl/container/flat_hash_map.h"
#include "wire/frame.h"

namespace droce::engine {

template <typename Addr>
class NeighborCache {
 public:
  static constexpr uint64_t kRetryNs = 100'000'000;
  static constexpr uint64_t kReachableNs = 60'000'000'000;
  static constexpr uint64_t kProbeNs = 1'000'000'000;
  static constexpr uint8_t kMaxProbes = 3;

  enum class Request : uint8_t { kNone, kBroadcast, kUnicastProbe };
  struct Lookup {
    bool resolved = false;
    wire::MacAddr mac{};               // the MAC to send to (and to probe)
    Request request = Request::kNone;  // the request the caller sends now
  };

  // Someone wants to send to `addr` at `now`.
  Lookup Resolve(const Addr& addr, uint64_t now) {
    Entry& n = map_[addr];
    Lookup r;
    if (n.valid) {
      if (now - n.confirmed_ns >= kReachableNs && now - n.requested_ns >= kProbeNs) {
        if (n.probes >= kMaxProbes) {
          n = Entry{};  // gone: resolve again from scratch (below)
        } else {
          ++n.probes;
          n.requested_ns = now;
          r.request = Request::kUnicastProbe;
        }
      }
      if (n.valid) {
        r.resolved = true;
        r.mac = n.mac;
        return r;
      }
    }
    if (n.requested_ns == 0 || now - n.requested_ns >= kRetryNs) {
      n.requested_ns = now;
      r.request = Request::kBroadcast;
    }
    return r;
  }

  // A confirmation of addr → mac at `now`. With create=false only an entry
  // that exists (a resolved one, or one Resolve is waiting for) is updated.
  // Multicast and broadcast MACs are ignored. Returns true if the entry is
  // new or its MAC moved: whoever waits for it should look again.
  bool Confirm(const Addr& addr, const wire::MacAddr& mac, uint64_t now, bool create) {
    if ((mac[0] & 1) != 0) return false;
    Entry* n;
    if (create) {
      n = &map_[addr];
    } else {
      auto it = map_.find(addr);
      if (it == map_.end()) return false;
      n = &it->second;
    }
    const bool changed = !n->valid || n->mac != mac;
    n->mac = mac;
    n->valid = true;
    n->probes = 0;
    n->confirmed_ns = now;
    return changed;
  }

 private:
  struct Entry {
    wire::MacAddr mac{};
    bool valid = false;
    uint8_t probes = 0;         // unanswered requests since the last confirmation
    uint64_t confirmed_ns = 0;  // last confirmation
    uint64_t requested_ns = 0;  // last request sent
  };
  absl::flat_hash_map<Addr, Entry> map_;
};

}  // namespace droce::engine
