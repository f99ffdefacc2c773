// Packet pacing of one QP's requests (IBV_QP_RATE_LIMIT,
// ibv_modify_qp_rate_limit, DROCE_RATE): a token bucket in bytes of the
// frames handed to the link (Ethernet header to ICRC; no preamble, gap or
// FCS), refilled at the rate and holding at most the burst.
//
// A packet may leave while the bucket is not in deficit; it then takes its
// frame's bytes, which may put the bucket in deficit, and the next packet
// waits until the refill has paid that back. So the long-run rate is exact
// whatever the packet sizes, and the bytes that leave back to back after an
// idle spell are at most the burst (the bucket's depth is the burst less
// one largest frame, since the last packet of a burst may take the bucket
// from 0 to minus a frame). Time is the transport's (ns, virtual in tests).
//
// Catch-up: a QP that was waiting for the pacer and is served late (its
// thread descheduled: on this VM a thread that never sleeps loses its CPU
// for 20 µs to several ms 600-1,000 times a second, 2-4 % of its time,
// bench/host_gaps) would lose for good whatever the refill earned beyond
// the bucket's depth, and a paced flow would run 1-3 % below its rate at
// 10 Gb/s. What overflows the bucket while the QP waits goes to a reserve
// instead (at most kCatchUpNs at the rate), which is paid back on top of
// the refill, so at most at twice the rate, never as a burst: the bytes
// back to back stay within the burst. An idle QP (nothing to send, or held
// by anything but the pacer: window, fence, no WQE) earns no reserve, and
// a rate change (DCQCN moves it often) drops it: congestion control
// decides the rate then.
#pragma once

#include <algorithm>
#include <cstdint>

namespace droce::transport {

class Pacer {
 public:
  // rate_kbps 0: unlimited (the pacer is off). burst_bytes: at most this
  // many bytes back to back (at least one frame: 1 spaces every packet
  // from the last); 0: the default, DefaultBurst. max_frame: the largest
  // frame the QP sends (its path MTU's payload plus headers).
  void Set(uint32_t rate_kbps, uint32_t burst_bytes, uint32_t max_frame, uint64_t now_ns) {
    rate_kbps_ = rate_kbps;
    burst_bytes_ = burst_bytes;
    max_frame_ = max_frame;
    depth_ = Depth();
    tokens_ = depth_;  // a new rate starts with a full bucket
    reserve_ = 0;
    waiting_ = false;
    last_ns_ = now_ns;
  }
  // A new rate for a running bucket (congestion control moves it often):
  // what the old rate earned up to now stays, the depth follows the rate.
  // From off, or to 0, this is Set.
  void SetRate(uint32_t rate_kbps, uint64_t now_ns) {
    if (rate_kbps_ == 0 || rate_kbps == 0) {
      Set(rate_kbps, burst_bytes_, max_frame_, now_ns);
      return;
    }
    Refill(now_ns);
    if (rate_kbps != rate_kbps_) reserve_ = 0;
    rate_kbps_ = rate_kbps;
    depth_ = Depth();
    tokens_ = std::min(tokens_, depth_);
  }
  // The path MTU changed: the depth follows.
  void SetMaxFrame(uint32_t max_frame, uint64_t now_ns) {
    if (max_frame != max_frame_) Set(rate_kbps_, burst_bytes_, max_frame, now_ns);
  }
  // The burst when none is given: 50 µs at the rate, at least two frames.
  // A bucket that holds nothing loses for good every nanosecond a packet
  // leaves late (a loop turn, a preempted thread): on a live link that
  // was 3 % below the rate at 1 Gb/s; this much depth pays such delays
  // back, at the price of up to that many bytes back to back after one.
  static uint64_t DefaultBurst(uint32_t rate_kbps, uint32_t max_frame) {
    return std::max<uint64_t>(2ull * max_frame, rate_kbps / 160);  // kbps * 1000 / 8 * 50e-6
  }
  // How much a late QP may catch up: this long at the rate.
  static constexpr uint64_t kCatchUpNs = 10'000'000;
  bool on() const { return rate_kbps_ != 0; }
  uint32_t rate_kbps() const { return rate_kbps_; }
  uint32_t burst_bytes() const { return burst_bytes_; }

  // May a packet leave at now? If not, *ready_ns says when one may.
  bool Ready(uint64_t now_ns, uint64_t* ready_ns) {
    Refill(now_ns);
    if (tokens_ >= 0) return true;
    // Bytes owed, at rate_kbps * 1000 / 8 bytes per second, twice that
    // while the reserve lasts.
    const double owed = -tokens_, per_ns = static_cast<double>(rate_kbps_) / 8e6;
    const double wait_ns = owed <= 2 * reserve_ ? owed / (2 * per_ns) : (owed - reserve_) / per_ns;
    *ready_ns = now_ns + static_cast<uint64_t>(wait_ns) + 1;
    return false;
  }
  // A frame of `bytes` left at now (after Ready said so).
  void Sent(uint32_t bytes) { tokens_ -= bytes; }
  // Whether the QP now waits only for its next chance to send (its last
  // Ready said no, or its pass ran out of budget) or for anything else
  // (nothing to send, its window, a fence); set as its send pass ends.
  void SetWaiting(bool waiting) { waiting_ = waiting; }
  double reserve_bytes() const { return reserve_; }

 private:
  // The bucket's depth at the current rate, burst and largest frame.
  double Depth() const {
    const uint64_t burst = burst_bytes_ != 0 ? burst_bytes_ : DefaultBurst(rate_kbps_, max_frame_);
    return burst > max_frame_ ? static_cast<double>(burst - max_frame_) : 0.0;
  }
  void Refill(uint64_t now_ns) {
    if (now_ns <= last_ns_) return;
    const double earned = static_cast<double>(now_ns - last_ns_) * rate_kbps_ / 8e6;
    double t = tokens_ + earned;
    if (reserve_ > 0 && t < depth_) {
      const double extra = std::min({reserve_, earned, depth_ - t});
      t += extra;
      reserve_ -= extra;
    }
    if (t > depth_) {
      if (waiting_) reserve_ = std::min(reserve_ + (t - depth_), ReserveDepth());
      t = depth_;
    }
    tokens_ = t;
    last_ns_ = now_ns;
  }
  double ReserveDepth() const { return static_cast<double>(kCatchUpNs) * rate_kbps_ / 8e6; }

  uint32_t rate_kbps_ = 0;
  uint32_t burst_bytes_ = 0;
  uint32_t max_frame_ = 0;
  double depth_ = 0;
  double tokens_ = 0;  // bytes; negative: owed
  double reserve_ = 0;  // bytes earned while late, paid back on top of the refill
  bool waiting_ = false;
  uint64_t last_ns_ = 0;
};

}  // namespace droce::transport
