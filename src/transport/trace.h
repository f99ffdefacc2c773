// The per-QP event trace (DROCE_TRACE, lab/trace.h): what a QP's transport
// did, one fixed-size record per event, copied into its worker's ring (a
// file writer thread of the lab drains it). A QP without a sink pays one
// pointer test per event site.
#pragma once

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

namespace droce::transport {

// The trace's clock: the TSC where there is one (about 7 ns to read here,
// against 16 for clock_gettime), converted to time by the trace's writer,
// which calibrates it against CLOCK_MONOTONIC; elsewhere CLOCK_MONOTONIC.
inline uint64_t TraceClock() {
#if defined(__x86_64__) || defined(__i386__)
  return __rdtsc();
#else
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
#endif
}

enum class TraceKind : uint8_t {
  kTx,          // a packet sent: opcode, PSN, frame bytes; arg: AETH syndrome for ACKs and NAKs
  kRx,          // a packet for this QP: opcode, PSN, payload bytes
  kAck,         // an ACK processed by the requester: PSN; arg: MSN
  kNak,         // a NAK received: PSN; arg: the NAK code (IBA table 44)
  kRnr,         // an RNR NAK received: PSN; arg: the timer code
  kRetransmit,  // the requester goes back to PSN (NAK, RNR or timeout)
  kTimeout,     // the ACK timer expired: PSN unacknowledged; arg: retries left
  kState,       // the QP's state changed: arg: the new state (QpState)
  kAdpTimeout,  // the adaptive retransmission timer expired: PSN unacknowledged; arg: which resend since progress (1, 2...)
};

struct TraceEvent {
  uint64_t ns;  // TraceClock() when recorded; ns since the epoch once written
  uint32_t qpn;
  TraceKind kind;
  uint8_t opcode;
  uint16_t reserved;
  uint32_t psn;
  uint32_t arg;
  uint32_t len;
  uint32_t reserved2;
};
static_assert(sizeof(TraceEvent) == 32);

// Where a QP's events go: a single-producer, single-consumer ring (the
// producer is whoever runs the QP, its worker's drive lock held; the
// consumer the trace's writer thread, lab/trace.h). Inline and not virtual:
// recording is a clock read and a 32-byte store (in a loop here: rdtsc
// ~11 ns, the store ~3 ns; in the engine the ring's lines moving between
// the worker's and the writer's CPUs weigh as much, docs/PERFORMANCE.md).
// With `turn_clock` (DROCE_TRACE's clock=turn) events take the stamp their
// worker took once at the start of its turn (StartTurn) instead.
class TraceSink {
 public:
  explicit TraceSink(uint32_t size, bool turn_clock = false)
      : slots_(new TraceEvent[size]), size_(size), mask_(size - 1), turn_clock_(turn_clock) {}
  ~TraceSink() { delete[] slots_; }
  TraceSink(const TraceSink&) = delete;
  TraceSink& operator=(const TraceSink&) = delete;

  // The time for an event recorded now (the producer's): outside a turn
  // (a state change by a control call) the clock's own.
  uint64_t Stamp() const { return turn_clock_ && turn_stamp_ != 0 ? turn_stamp_ : TraceClock(); }
  // A turn of the worker starts and ends (the producer's; turn_clock only).
  void StartTurn() { turn_stamp_ = TraceClock(); }
  void EndTurn() { turn_stamp_ = 0; }
  bool turn_clock() const { return turn_clock_; }

  void Record(const TraceEvent& e) {
    const uint64_t h = head_.load(std::memory_order_relaxed);
    if (h - cached_tail_ >= size_) [[unlikely]] {
      cached_tail_ = tail_.load(std::memory_order_acquire);
      if (h - cached_tail_ >= size_) {
        dropped_.store(dropped_.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        return;
      }
    }
    slots_[h & mask_] = e;
    head_.store(h + 1, std::memory_order_release);
  }
  // Consumer: calls f(TraceEvent*, n) for what is there (in at most two
  // pieces, which f may rewrite in place); returns how many.
  template <typename F>
  uint64_t Drain(F&& f) {
    const uint64_t t = tail_.load(std::memory_order_relaxed);
    const uint64_t h = head_.load(std::memory_order_acquire);
    if (h == t) return 0;
    const uint64_t first = std::min<uint64_t>(h - t, size_ - (t & mask_));
    f(slots_ + (t & mask_), static_cast<size_t>(first));
    if (first != h - t) f(slots_, static_cast<size_t>(h - t - first));
    tail_.store(h, std::memory_order_release);
    return h - t;
  }
  uint64_t dropped() const { return dropped_.load(std::memory_order_relaxed); }
  // Events recorded so far (not dropped), drained or not; any thread.
  uint64_t recorded() const { return head_.load(std::memory_order_acquire); }

 private:
  TraceEvent* slots_;
  uint64_t size_, mask_;
  bool turn_clock_;
  alignas(64) std::atomic<uint64_t> head_{0};
  uint64_t cached_tail_ = 0;
  uint64_t turn_stamp_ = 0;
  std::atomic<uint64_t> dropped_{0};
  alignas(64) std::atomic<uint64_t> tail_{0};
};

}  // namespace droce::transport
