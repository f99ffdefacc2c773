// The per-QP event trace (DROCE_TRACE, `droce ctl trace`): every transmit,
// receive, ACK, NAK, RNR NAK, retransmission, ACK timeout and state change
// of the traced QPs (transport/trace.h), with nanosecond timestamps, as CSV
// or JSON lines. The datapath only copies a 32-byte record into its
// worker's ring (single producer: whoever holds the worker's drive lock);
// a writer thread of the trace drains the rings every few milliseconds and
// formats and writes the lines. A full ring drops the event and counts it.
// No DPDK.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "transport/trace.h"

namespace droce::lab {

// kBinary: a header (TraceFileHeader) and the 32-byte records as they are,
// their times in ns since the epoch; `droce trace-dump` prints it as JSON
// lines or CSV. The cheapest to write on a fast flow.
enum class TraceFormat : uint8_t { kJson, kCsv, kBinary };

struct TraceFileHeader {
  char magic[8];  // "DROCETRC"
  uint32_t version;      // 1
  uint32_t record_size;  // sizeof(transport::TraceEvent)
  char dev[32];          // the device's name, NUL-padded
  uint8_t reserved[16];
};
static_assert(sizeof(TraceFileHeader) == 64);

struct TraceOptions {
  std::string path;
  TraceFormat format = TraceFormat::kJson;
  bool has_qp = false;  // only this QP (qp=N)
  uint32_t qp = 0;
  uint32_t ring = 1u << 16;  // events per worker ring (a power of two; 2 MiB)
  // clock=turn: an event's time is the start of the worker's turn that
  // recorded it (one clock read per turn, not per event: about a third of
  // the datapath's share of the trace's cost, docs/PERFORMANCE.md); events
  // of one turn keep their order in the file.
  bool turn_clock = false;
  std::string text;          // as given
};

// "PATH[,format=json|csv|binary][,qp=N][,ring=N][,clock=event|turn]".
absl::StatusOr<TraceOptions> ParseTraceSpec(std::string_view spec);

// One event as a line (no newline): `epoch_offset_ns` turns the engine's
// monotonic time into ns since the Unix epoch.
std::string FormatTraceEvent(const transport::TraceEvent& e, TraceFormat f, const std::string& dev,
                             int64_t epoch_offset_ns);
void AppendTraceEvent(std::string* s, const transport::TraceEvent& e, TraceFormat f, const std::string& dev,
                      int64_t epoch_offset_ns);
// The CSV header line.
std::string_view TraceCsvHeader();
// `droce trace-dump`: a binary trace file printed to `out` as JSON lines or
// CSV. Returns the number of events, or why the file cannot be read.
absl::StatusOr<uint64_t> DumpTrace(const std::string& path, TraceFormat f, std::FILE* out);

struct TraceStatus {
  std::string text;
  uint64_t events = 0;          // recorded: written, or in the rings to be written
  uint64_t events_written = 0;  // of those, written to the file so far
  uint64_t dropped = 0;         // lost to a full ring
  uint64_t bytes = 0;           // written so far
  bool failed = false;          // a write failed (the trace writes nothing more)
};

// One device's trace: a ring per worker and the writer thread.
class Trace {
 public:
  static absl::StatusOr<std::unique_ptr<Trace>> Start(const TraceOptions& o, const std::string& dev, int workers,
                                                      int64_t epoch_offset_ns);
  // Drains the rings a last time, writes and closes the file (Close).
  ~Trace();
  // Stops the writer, writes what the rings hold and closes the file: the
  // final status. Sinks must no longer be recorded into.
  TraceStatus Close();
  // The sink for QP `qpn` owned by worker `w`; nullptr if the filter leaves
  // it out.
  transport::TraceSink* SinkFor(uint32_t qpn, int w);
  // Worker w's ring if its turns must stamp it (clock=turn), else nullptr.
  transport::TraceSink* TurnClockRing(int w);
  TraceStatus Status();

 private:
  Trace() = default;
  void Run();
  void DrainOnce();  // with io_mu_ held
  // TraceClock() readings to ns since the epoch, calibrated against
  // CLOCK_MONOTONIC from the trace's start to now.
  void Calibrate();

  TraceOptions o_;
  std::string dev_;
  int64_t epoch_offset_ns_ = 0;
  uint64_t clock0_ = 0, mono0_ = 0;  // at the start
  uint64_t ns_per_tick_q32_ = 1ull << 32;  // ns per clock tick, times 2^32
  uint64_t mono_now_ = 0, clock_now_ = 0;
  std::vector<std::unique_ptr<transport::TraceSink>> rings_;
  std::FILE* f_ = nullptr;
  std::mutex io_mu_;  // f_, failed_, scratch_, line_ (the writer's)
  bool failed_ = false;
  std::mutex st_mu_;  // st_: held only to update or copy it
  TraceStatus st_;
  std::vector<transport::TraceEvent> scratch_;
  std::string line_;  // a drain's text, written at once
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread writer_;
};

}  // namespace droce::lab
