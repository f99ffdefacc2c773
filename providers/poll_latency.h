// DROCE_LATENCY, as the application sees it: post to the ibv_poll_cq (or
// ibv_start_poll/ibv_next_poll) that returns the completion, the span
// perftest's latency tests time. The engine's own histograms
// (transport::Qp, read live with `droce ctl stat`) stop when the engine
// enters the completion; this one stops when the application has it, so it
// also holds the wait for the poll and the poll itself.
//
// The provider stamps each send WQE as the post begins (common/stamp_clock.h;
// 0: not stamped), the engine returns the stamp in a
// successful send completion's src_qp (which verbs defines for UD receive
// completions only; the provider reports 0 there), and the polling thread
// records the span up to the end of the poll here, per QP and kind of WQE
// (the two edges placed as perftest's clock reads are: before the post,
// after the poll). Printed on stderr
// when the QP is destroyed, after the engine's line. Off: nothing is read
// or recorded.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "common/histogram.h"

namespace droce::provider {

// Whether DROCE_LATENCY is on (read once).
bool latency_on();
// The stamp for a WQE posted now (0 when off).
uint32_t post_stamp();

class PollLatency {
 public:
  // Records the completions of one poll (wc opcode, stamp; status success)
  // as polled at `now` (Now(), read as the poll returns). Takes the lock
  // once per call.
  struct Sample {
    uint32_t qpn;
    uint8_t wc_opcode;
    uint32_t stamp;
  };
  static uint32_t Now();
  void Record(const Sample* s, int n, uint32_t now);
  // Prints the QP's lines (one per kind that has samples) and forgets them.
  void Report(const char* dev, uint32_t qpn);

 private:
  using Set = std::array<std::unique_ptr<lab::LatencyHistogram>, lab::kNumLatencyClasses>;
  std::mutex mu_;
  absl::flat_hash_map<uint32_t, Set> by_qp_;
};

}  // namespace droce::provider
