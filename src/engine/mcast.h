// The device's multicast groups: which UD QPs are attached to which group GID
// (ibv_attach_mcast), with the limits ibv_query_device reports. Kept apart
// from packets and DPDK so that a unit test can drive it
// (tests/unit/mcast_test.cc). Owned by the worker; no locks.
//
// The rules are Linux's for a RoCE device (uverbs, ib_attach_mcast,
// rxe_mcast.c): the GID must be multicast (EINVAL); attaching a QP to a group
// it is in already succeeds and changes nothing; detaching a QP from a group
// it is not in is EINVAL; a limit reached is ENOMEM. The multicast LID is
// ignored on RoCE (IBA A17.5.6), so it is not kept.
#pragma once

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "wire/frame.h"

namespace droce::engine {

class McastGroups {
 public:
  // rxe's limits (rxe_param.h), reported as max_mcast_grp,
  // max_mcast_qp_attach and max_total_mcast_qp_attach.
  static constexpr uint32_t kMaxGroups = 8192;
  static constexpr uint32_t kMaxQpsPerGroup = 56;
  static constexpr uint32_t kMaxAttachments = 0x70000;

  // Returns 0 or an errno.
  int Attach(const wire::Ipv6Addr& mgid, uint32_t qpn) {
    if (!wire::gid_is_multicast(mgid.data())) return EINVAL;
    auto it = groups_.find(mgid);
    if (it == groups_.end()) {
      if (groups_.size() >= kMaxGroups || total_ >= kMaxAttachments) return ENOMEM;
      groups_[mgid].push_back(qpn);
    } else {
      std::vector<uint32_t>& qps = it->second;
      if (std::find(qps.begin(), qps.end(), qpn) != qps.end()) return 0;
      if (qps.size() >= kMaxQpsPerGroup || total_ >= kMaxAttachments) return ENOMEM;
      qps.push_back(qpn);
    }
    ++total_;
    ++per_qp_[qpn];
    return 0;
  }

  // Returns 0 or an errno.
  int Detach(const wire::Ipv6Addr& mgid, uint32_t qpn) {
    auto it = groups_.find(mgid);
    if (it == groups_.end()) return EINVAL;
    std::vector<uint32_t>& qps = it->second;
    auto q = std::find(qps.begin(), qps.end(), qpn);
    if (q == qps.end()) return EINVAL;
    qps.erase(q);
    if (qps.empty()) groups_.erase(it);
    --total_;
    if (auto p = per_qp_.find(qpn); --p->second == 0) per_qp_.erase(p);
    return 0;
  }

  // Takes the QP out of every group it is in; returns how many.
  uint32_t DetachQp(uint32_t qpn) {
    const uint32_t n = AttachedTo(qpn);
    if (n == 0) return 0;
    std::vector<wire::Ipv6Addr> in;
    for (const auto& [mgid, qps] : groups_) {
      if (std::find(qps.begin(), qps.end(), qpn) != qps.end()) in.push_back(mgid);
    }
    for (const wire::Ipv6Addr& mgid : in) Detach(mgid, qpn);
    return n;
  }

  // The QPs attached to a group, in attach order; nullptr if none is.
  const std::vector<uint32_t>* Members(const wire::Ipv6Addr& mgid) const {
    auto it = groups_.find(mgid);
    return it == groups_.end() ? nullptr : &it->second;
  }

  // What becomes of a RoCE packet to a multicast address: only UD SENDs to
  // the multicast QPN are multicast (as rxe_rcv_mcast_pkt), and they go to
  // every QP attached to the destination group (*members).
  enum class Verdict : uint8_t { kDeliver, kNoGroup, kNotMulticastUd };
  Verdict Route(const wire::PacketView& v, const std::vector<uint32_t>** members) const {
    if (v.bth.dqpn != wire::kMulticastQpn || !(v.info->mask & wire::kMaskDeth)) return Verdict::kNotMulticastUd;
    *members = Members(v.dip6);
    return *members == nullptr ? Verdict::kNoGroup : Verdict::kDeliver;
  }

  // Groups the QP is attached to.
  uint32_t AttachedTo(uint32_t qpn) const {
    auto it = per_qp_.find(qpn);
    return it == per_qp_.end() ? 0 : it->second;
  }

  size_t groups() const { return groups_.size(); }
  uint32_t attachments() const { return total_; }

 private:
  absl::flat_hash_map<wire::Ipv6Addr, std::vector<uint32_t>> groups_;
  absl::flat_hash_map<uint32_t, uint32_t> per_qp_;  // qpn → groups it is in
  uint32_t total_ = 0;
};

}  // namespace droce::engine
