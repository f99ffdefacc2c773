// DCQCN (Zhu et al., "Congestion Control for Large-Scale RDMA Deployments",
// SIGCOMM 2015) as ConnectX NICs run it, with their parameter names, units
// and defaults (docs/LAB.md, "Congestion control", says where each default
// comes from and which choices were made where sources disagree).
//
// Two roles per QP:
// - the notification point (receiver): a packet that arrives with ECN CE
//   makes it send a CNP (BTH opcode 0x81) to the sender's QP, at most one
//   per min_time_between_cnps per QP (NotificationPoint);
// - the reaction point (sender): each CNP cuts the rate, a congestion
//   estimate alpha follows how often CNPs come, and a timer and a byte
//   counter raise the rate back in stages (ReactionPoint). The rate is
//   enforced by the QP's pacer (transport/pacer.h).
//
// Pure functions of (state, event, time): no clock of its own, no threads,
// no DPDK, so virtual-time tests can check every step against the
// equations (tests/unit/cc_dcqcn_test.cc).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"

namespace droce::cc {

// ConnectX's knobs (/sys/class/net/<if>/ecn/roce_rp/* and roce_np/*, mlx5's
// cong.c, mlxconfig), same names and units. Rates in Mb/s, times in µs.
struct DcqcnParams {
  // Reaction point.
  uint32_t rpg_time_reset = 300;      // µs between timer rate-increase events
  uint32_t rpg_byte_reset = 32767;    // bytes sent between byte-counter increase events (0: off)
  uint32_t rpg_threshold = 1;         // F: increase events of fast recovery before additive increase
  uint32_t rpg_max_rate = 0;          // Mb/s, the highest rate (0: the line rate)
  uint32_t rpg_ai_rate = 5;           // Mb/s added to the target per additive-increase event
  uint32_t rpg_hai_rate = 50;         // Mb/s per hyper-increase event
  uint32_t rpg_gd = 11;               // a CNP cuts the rate by alpha / 2^rpg_gd (alpha in 1/1024)
  uint32_t rpg_min_dec_fac = 50;      // % : one cut keeps at least this much of the rate
  uint32_t rpg_min_rate = 1;          // Mb/s, the lowest rate
  uint32_t rate_to_set_on_first_cnp = 0;  // Mb/s set at the first CNP (0: keep the rate)
  uint32_t dce_tcp_g = 1019;          // alpha = (g * alpha + (1024 - g) * 1024 * cnp) / 1024
  uint32_t dce_tcp_rtt = 1;           // µs between alpha updates
  uint32_t initial_alpha_value = 1023;  // alpha at the first CNP, in 1/1024
  uint32_t rate_reduce_monitor_period = 4;  // µs, the least time between two cuts
  uint32_t clamp_tgt_rate = 0;        // 1: every cut sets the target to the rate
  uint32_t clamp_tgt_rate_after_time_inc = 1;  // 1: a cut sets the target only if the timer raised the rate since
  // Notification point.
  uint32_t min_time_between_cnps = 4;  // µs between two CNPs of one QP
  uint32_t cnp_dscp = 48;              // the CNP's DSCP
  uint32_t cnp_802p_prio = 6;          // the CNP's 802.1p priority (tagged links)

  bool operator==(const DcqcnParams&) const = default;
};

// Parses "name=value,name=value" over `out` (names as above; unknown
// names, values out of range refused with the reason).
absl::Status ParseDcqcnParams(const std::string& text, DcqcnParams* out);
// Every parameter as "name=value,..." (what ParseDcqcnParams reads back).
std::string FormatDcqcnParams(const DcqcnParams& p);

// The congestion-control switch of a device or QP (DROCE_CC).
enum class CcMode : uint8_t {
  kOff,     // no ECT marking, CNPs neither sent nor acted on (counted as ignored)
  kDcqcn,   // ECT(0) on data packets, CNPs sent on CE, DCQCN on received CNPs
};

// The reaction point of one QP. Rates in Mb/s (double: the equations are
// ConnectX's, not rounded here); alpha in [0, 1] (the knobs' 1/1024 units
// divided out).
class ReactionPoint {
 public:
  // line_mbps: the port's rate, the ceiling when rpg_max_rate is 0.
  void Configure(const DcqcnParams& p, double line_mbps);
  // A CNP arrived at now_ns: the rate is cut at the start of the next
  // monitor period (at once with rate_reduce_monitor_period 0).
  void OnCnp(uint64_t now_ns);
  // `bytes` of requests left at now_ns (the byte counter).
  void OnSent(uint32_t bytes, uint64_t now_ns);
  // Runs every timer due by now_ns, in time order.
  void Advance(uint64_t now_ns);

  // False until the first CNP, and again once the rate is back at the
  // ceiling: the QP is not limited then.
  bool active() const { return active_; }
  double rate_mbps() const { return rc_; }
  double target_mbps() const { return rt_; }
  double alpha() const { return alpha_; }
  double max_mbps() const { return max_; }
  // The next timer (ns), UINT64_MAX when inactive.
  uint64_t next_event_ns() const;
  // The next timer that may raise the rate (ns), UINT64_MAX when inactive:
  // a QP held back by its pacer at the old rate looks again then.
  uint64_t next_increase_ns() const { return active_ ? next_timer_ns_ : UINT64_MAX; }
  // Counts for the tests and counters.
  uint64_t cuts() const { return cuts_; }
  uint64_t increases() const { return increases_; }
  uint32_t time_stage() const { return t_stage_; }
  uint32_t byte_stage() const { return b_stage_; }

 private:
  void Cut(uint64_t at_ns);
  void Increase(bool from_timer);
  void Deactivate();

  DcqcnParams p_;
  double max_ = 0, min_ = 0;
  double g_ = 0;  // the weight of a new sample, (1024 - dce_tcp_g) / 1024
  bool active_ = false;
  double rc_ = 0, rt_ = 0, alpha_ = 0;
  bool cnp_for_alpha_ = false;  // a CNP since the last alpha update
  // Cuts happen at the start of monitor periods (rate_reduce_monitor_period
  // long, counted from the first CNP) that follow a period with a CNP.
  bool cut_pending_ = false;
  uint64_t period_origin_ns_ = 0, cut_at_ns_ = 0;
  uint64_t next_alpha_ns_ = 0, next_timer_ns_ = 0;
  uint64_t bytes_ = 0;          // since the last byte-counter event
  uint32_t t_stage_ = 0, b_stage_ = 0;
  uint64_t cuts_ = 0, increases_ = 0;
};

// The notification point of one QP: whether a CE-marked packet arriving at
// now_ns gets a CNP.
class NotificationPoint {
 public:
  bool ShouldSend(uint64_t now_ns, uint32_t min_gap_us) {
    if (sent_any_ && now_ns - last_ns_ < uint64_t{min_gap_us} * 1000) return false;
    sent_any_ = true;
    last_ns_ = now_ns;
    return true;
  }

 private:
  bool sent_any_ = false;
  uint64_t last_ns_ = 0;
};

// ECN codepoints (RFC 3168) in the low two bits of the IPv4 TOS / IPv6
// traffic class.
inline constexpr uint8_t kEcnMask = 0x03;
inline constexpr uint8_t kEcnNotEct = 0x00;
inline constexpr uint8_t kEct1 = 0x01;
inline constexpr uint8_t kEct0 = 0x02;
inline constexpr uint8_t kEcnCe = 0x03;

}  // namespace droce::cc
