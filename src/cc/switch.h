// A congested switch's egress port: a FIFO drained at a set rate, with a
// buffer (tail drop), a propagation delay, and instantaneous RED/ECN marking
// as data-centre switches do it for DCQCN (Zhu et al. 2015, section 5: the
// marking probability rises linearly from 0 at Kmin to Pmax at Kmax, and
// every ECN-capable packet is marked above Kmax). No clock of its own: the
// caller says when each frame arrives, in non-decreasing order, so the same
// element serves the virtual-time simulator and a live forwarder.
#pragma once

#include <cstdint>

namespace droce::cc {

struct RedParams {
  uint32_t kmin_bytes = 5 * 1024;    // DCQCN paper: 5 KB
  uint32_t kmax_bytes = 200 * 1024;  // 200 KB
  double pmax = 0.01;                // 1 %
};

// The probability that a packet arriving at a queue of `queue_bytes` is
// marked.
inline double RedMarkProbability(const RedParams& r, uint64_t queue_bytes) {
  if (queue_bytes <= r.kmin_bytes) return 0;
  if (queue_bytes > r.kmax_bytes) return 1;
  return r.pmax * static_cast<double>(queue_bytes - r.kmin_bytes) / static_cast<double>(r.kmax_bytes - r.kmin_bytes);
}

struct PortParams {
  uint64_t rate_bps = 25'000'000'000;  // egress rate, bits of frame per second
  uint32_t buffer_bytes = 1 << 20;     // queue capacity; a frame that does not fit is dropped
  uint64_t delay_ns = 1000;            // propagation delay after the port
  bool ecn = true;                     // RED/ECN marking on (else only tail drop)
  RedParams red;
};

struct PortStats {
  uint64_t frames = 0, bytes = 0;  // accepted
  uint64_t dropped = 0, marked = 0;
  uint64_t ect = 0;  // accepted ECN-capable frames (the ones that could be marked)
};

class EgressPort {
 public:
  explicit EgressPort(const PortParams& p, uint64_t seed = 1) : p_(p), rng_(seed) {}

  // The bytes waiting (the one in transmission included) at now_ns.
  uint64_t QueueBytes(uint64_t now_ns) const {
    if (free_at_ps_ <= now_ns * 1000) return 0;
    return ((free_at_ps_ - now_ns * 1000) * p_.rate_bps + 8'000'000'000'000ull - 1) / 8'000'000'000'000ull;
  }

  struct Verdict {
    bool drop = false;
    bool mark = false;       // set CE (the caller rewrites the frame)
    uint64_t arrive_ns = 0;  // at the far end of the link: departure + delay
  };
  // A frame of `len` bytes arrives at now_ns; `ect`: it is ECN-capable.
  Verdict Enqueue(uint32_t len, bool ect, uint64_t now_ns) {
    Verdict v;
    const uint64_t q = QueueBytes(now_ns);
    if (q + len > p_.buffer_bytes) {
      v.drop = true;
      ++stats.dropped;
      return v;
    }
    if (p_.ecn && ect) {
      ++stats.ect;
      const double pm = RedMarkProbability(p_.red, q);
      if (pm >= 1 || (pm > 0 && Uniform() < pm)) {
        v.mark = true;
        ++stats.marked;
      }
    }
    // Picoseconds, so that 25 Gb/s (320 ps a byte) adds up without drift.
    const uint64_t start = free_at_ps_ > now_ns * 1000 ? free_at_ps_ : now_ns * 1000;
    free_at_ps_ = start + uint64_t{len} * 8'000'000'000'000ull / p_.rate_bps;
    v.arrive_ns = (free_at_ps_ + 999) / 1000 + p_.delay_ns;
    ++stats.frames;
    stats.bytes += len;
    return v;
  }

  const PortParams& params() const { return p_; }
  PortStats stats;

 private:
  double Uniform() {  // SplitMix64 (Steele, Lea, Flood 2014), 53 bits
    uint64_t z = (rng_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return static_cast<double>(z >> 11) * 0x1.0p-53;
  }

  PortParams p_;
  uint64_t rng_;
  uint64_t free_at_ps_ = 0;
};

// Sets ECN CE on a RoCEv2 frame (Ethernet, optional 802.1Q, IPv4 or IPv6)
// that is ECN-capable, fixing the IPv4 header checksum; the ICRC does not
// cover these bits. Returns the frame's ECN bits before (0 if it is not
// IP); only ECT(0)/ECT(1) frames are changed.
uint8_t MarkCe(uint8_t* frame, uint32_t len);
// The frame's ECN bits (0 if not IP).
uint8_t FrameEcn(const uint8_t* frame, uint32_t len);

}  // namespace droce::cc
