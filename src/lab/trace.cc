#include "lab/trace.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "transport/qp.h"
#include "wire/headers.h"
#include "wire/opcode.h"

namespace droce::lab {
namespace {

using transport::TraceEvent;
using transport::TraceKind;

constexpr auto kDrainEvery = std::chrono::milliseconds(5);

const char* KindName(TraceKind k) {
  switch (k) {
    case TraceKind::kTx: return "tx";
    case TraceKind::kRx: return "rx";
    case TraceKind::kAck: return "ack";
    case TraceKind::kNak: return "nak";
    case TraceKind::kRnr: return "rnr";
    case TraceKind::kRetransmit: return "retransmit";
    case TraceKind::kTimeout: return "timeout";
    case TraceKind::kState: return "state";
    case TraceKind::kAdpTimeout: return "adp_timeout";
  }
  return "?";
}

bool HasOpcode(TraceKind k) {
  return k == TraceKind::kTx || k == TraceKind::kRx || k == TraceKind::kAck || k == TraceKind::kNak ||
         k == TraceKind::kRnr;
}

std::string OpcodeName(uint8_t op) {
  const char* n = wire::opcode_info(op).name;
  return n != nullptr ? n : absl::StrCat("0x", absl::Hex(op, absl::kZeroPad2));
}

// The event's detail as (JSON key, text value, numeric?) for both formats.
struct Detail {
  const char* key = nullptr;
  std::string value;
  bool number = false;
};

Detail DetailOf(const TraceEvent& e) {
  Detail d;
  switch (e.kind) {
    case TraceKind::kTx: {
      const uint8_t syn = static_cast<uint8_t>(e.arg);
      if (e.opcode == 0x11 && (syn >> 5) == 3) d = {"nak", wire::nak_code_name(syn & 0x1F), false};
      else if (e.opcode == 0x11 && (syn >> 5) == 1) d = {"rnr_timer", absl::StrCat(syn & 0x1F), true};
      break;
    }
    case TraceKind::kAck: d = {"msn", absl::StrCat(e.arg), true}; break;
    case TraceKind::kNak: d = {"nak", wire::nak_code_name(e.arg), false}; break;
    case TraceKind::kRnr: d = {"rnr_timer", absl::StrCat(e.arg), true}; break;
    case TraceKind::kTimeout: d = {"retries_left", absl::StrCat(e.arg), true}; break;
    case TraceKind::kAdpTimeout: d = {"adp_resend", absl::StrCat(e.arg), true}; break;
    case TraceKind::kState:
      d = {"state", transport::qp_state_name(static_cast<transport::QpState>(e.arg)), false};
      break;
    default: break;
  }
  return d;
}

uint64_t MonotonicNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

}  // namespace

absl::StatusOr<uint64_t> DumpTrace(const std::string& path, TraceFormat f, std::FILE* out) {
  std::FILE* in = std::fopen(path.c_str(), "rb");
  if (in == nullptr) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
  TraceFileHeader h{};
  if (std::fread(&h, sizeof(h), 1, in) != 1 || std::memcmp(h.magic, "DROCETRC", 8) != 0) {
    std::fclose(in);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a binary droce trace (format=binary)"));
  }
  if (h.version != 1 || h.record_size != sizeof(TraceEvent)) {
    std::fclose(in);
    return absl::InvalidArgumentError(absl::StrCat(path, ": trace version ", h.version, " with ", h.record_size,
                                                   "-byte records (this droce reads version 1, 32 bytes)"));
  }
  const std::string dev(h.dev, strnlen(h.dev, sizeof(h.dev)));
  if (f == TraceFormat::kCsv) std::fprintf(out, "%s\n", std::string(TraceCsvHeader()).c_str());
  uint64_t n = 0;
  TraceEvent e;
  while (std::fread(&e, sizeof(e), 1, in) == 1) {
    const std::string line = FormatTraceEvent(e, f, dev, 0);
    std::fprintf(out, "%s\n", line.c_str());
    ++n;
  }
  const bool partial = !std::feof(in) || std::ferror(in);
  std::fclose(in);
  if (partial) return absl::DataLossError(absl::StrCat(path, ": a read failed after ", n, " events"));
  return n;
}

absl::StatusOr<TraceOptions> ParseTraceSpec(std::string_view spec) {
  TraceOptions o;
  o.text = std::string(spec);
  const std::vector<std::string> parts = absl::StrSplit(std::string(spec), ',');
  if (parts.empty() || parts[0].empty()) return absl::InvalidArgumentError("no file to trace to (PATH[,format=json|csv,...])");
  o.path = parts[0];
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string& kv = parts[i];
    const size_t eq = kv.find('=');
    const std::string k = kv.substr(0, eq), v = eq == std::string::npos ? "" : kv.substr(eq + 1);
    if (k == "format") {
      if (v == "json") o.format = TraceFormat::kJson;
      else if (v == "csv") o.format = TraceFormat::kCsv;
      else if (v == "binary") o.format = TraceFormat::kBinary;
      else return absl::InvalidArgumentError(absl::StrCat("'format' is json, csv or binary, not '", v, "'"));
      continue;
    }
    if (k == "clock") {
      if (v == "event") o.turn_clock = false;
      else if (v == "turn") o.turn_clock = true;
      else return absl::InvalidArgumentError(absl::StrCat("'clock' is event or turn, not '", v, "'"));
      continue;
    }
    if (k != "qp" && k != "ring") {
      return absl::InvalidArgumentError(absl::StrCat("unknown trace option '", k, "' (format, qp, ring, clock)"));
    }
    uint64_t n = 0;
    const bool hex = k == "qp" && v.size() > 2 && v.starts_with("0x");  // QPNs are often written in hex
    auto [p, ec] = std::from_chars(v.data() + (hex ? 2 : 0), v.data() + v.size(), n, hex ? 16 : 10);
    if (v.empty() || ec != std::errc() || p != v.data() + v.size()) {
      return absl::InvalidArgumentError(absl::StrCat("'", k, "' needs a number, not '", v, "'"));
    }
    if (k == "qp") {
      if (n > 0xFFFFFF) return absl::InvalidArgumentError("'qp' is a 24-bit QP number");
      o.has_qp = true;
      o.qp = static_cast<uint32_t>(n);
    } else {
      if (n < 1024 || n > (1u << 24) || (n & (n - 1)) != 0) {
        return absl::InvalidArgumentError("'ring' is a power of two from 1024 to 16777216 events");
      }
      o.ring = static_cast<uint32_t>(n);
    }
  }
  return o;
}

std::string_view TraceCsvHeader() { return "time_ns,dev,qpn,event,opcode,psn,detail,bytes"; }

// Appends one event's line (without its newline) to *s: no temporary
// strings, so that the writer keeps up with a busy link (a full ring is
// 65,536 events; the writer drains it every few ms).
void AppendTraceEvent(std::string* s, const TraceEvent& e, TraceFormat f, const std::string& dev,
                      int64_t epoch_offset_ns) {
  const int64_t t = static_cast<int64_t>(e.ns) + epoch_offset_ns;
  if (f == TraceFormat::kBinary) f = TraceFormat::kJson;
  const bool op = HasOpcode(e.kind);
  const bool psn = e.kind != TraceKind::kState;
  const bool bytes = e.kind == TraceKind::kTx || e.kind == TraceKind::kRx;
  const Detail d = DetailOf(e);
  if (f == TraceFormat::kCsv) {
    absl::StrAppend(s, t, ",", dev, ",", e.qpn, ",", KindName(e.kind), ",", op ? OpcodeName(e.opcode) : "", ",");
    if (psn) absl::StrAppend(s, e.psn);
    s->push_back(',');
    if (d.key != nullptr) absl::StrAppend(s, d.key, " ", d.value);
    s->push_back(',');
    if (bytes) absl::StrAppend(s, e.len);
    return;
  }
  absl::StrAppend(s, "{\"time_ns\":", t, ",\"dev\":\"", dev, "\",\"qpn\":", e.qpn, ",\"event\":\"",
                  KindName(e.kind), "\"");
  if (op) absl::StrAppend(s, ",\"opcode\":\"", OpcodeName(e.opcode), "\"");
  if (psn) absl::StrAppend(s, ",\"psn\":", e.psn);
  if (d.key != nullptr) {
    if (d.number) absl::StrAppend(s, ",\"", d.key, "\":", d.value);
    else absl::StrAppend(s, ",\"", d.key, "\":\"", d.value, "\"");
  }
  if (bytes) absl::StrAppend(s, ",\"bytes\":", e.len);
  s->push_back('}');
}

std::string FormatTraceEvent(const TraceEvent& e, TraceFormat f, const std::string& dev, int64_t epoch_offset_ns) {
  std::string s;
  AppendTraceEvent(&s, e, f, dev, epoch_offset_ns);
  return s;
}

absl::StatusOr<std::unique_ptr<Trace>> Trace::Start(const TraceOptions& o, const std::string& dev, int workers,
                                                    int64_t epoch_offset_ns) {
  const int fd = open(o.path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0640);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot create ", o.path, ": ", std::strerror(errno)));
  std::unique_ptr<Trace> t(new Trace());
  t->f_ = fdopen(fd, "w");
  if (t->f_ == nullptr) {
    close(fd);
    return absl::UnavailableError(absl::StrCat("cannot write ", o.path, ": ", std::strerror(errno)));
  }
  // Unbuffered: binary records are written from the rings as they are, the
  // text of a drain is gathered and written at once (DrainOnce). Nothing
  // waits in a stdio buffer, which a child forked without exec would write
  // a second time when it calls exit().
  std::setvbuf(t->f_, nullptr, _IONBF, 0);
  t->o_ = o;
  t->dev_ = dev;
  t->epoch_offset_ns_ = epoch_offset_ns;
  t->st_.text = o.text;
  for (int i = 0; i < workers; ++i) t->rings_.push_back(std::make_unique<transport::TraceSink>(o.ring, o.turn_clock));
  // The clock's rate, first over 2 ms, then over the whole trace (Calibrate).
  t->clock0_ = transport::TraceClock();
  t->mono0_ = MonotonicNs();
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  t->Calibrate();
  if (o.format == TraceFormat::kBinary) {
    TraceFileHeader h{};  // (st_mu_ need not be held: the writer has not started)
    std::memcpy(h.magic, "DROCETRC", 8);
    h.version = 1;
    h.record_size = sizeof(TraceEvent);
    std::memcpy(h.dev, dev.data(), std::min(dev.size(), sizeof(h.dev) - 1));
    std::fwrite(&h, sizeof(h), 1, t->f_);
    t->st_.bytes += sizeof(h);
  }
  if (o.format == TraceFormat::kCsv) {
    const std::string h = std::string(TraceCsvHeader()) + '\n';
    std::fwrite(h.data(), 1, h.size(), t->f_);
    t->st_.bytes += h.size();
  }
  t->writer_ = std::thread([p = t.get()] { p->Run(); });
  return t;
}

TraceStatus Trace::Close() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (writer_.joinable()) writer_.join();
  {
    std::lock_guard<std::mutex> l(io_mu_);
    DrainOnce();
    if (f_ != nullptr && std::fclose(f_) != 0) {
      std::lock_guard<std::mutex> st(st_mu_);
      st_.failed = true;
    }
    f_ = nullptr;
  }
  return Status();
}

Trace::~Trace() { Close(); }

transport::TraceSink* Trace::SinkFor(uint32_t qpn, int w) {
  if (o_.has_qp && qpn != o_.qp) return nullptr;
  if (w < 0 || static_cast<size_t>(w) >= rings_.size()) return nullptr;
  return rings_[static_cast<size_t>(w)].get();
}

transport::TraceSink* Trace::TurnClockRing(int w) {
  if (!o_.turn_clock || w < 0 || static_cast<size_t>(w) >= rings_.size()) return nullptr;
  return rings_[static_cast<size_t>(w)].get();
}

void Trace::Run() {
  pthread_setname_np(pthread_self(), "droce-trace");
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    cv_.wait_for(l, kDrainEvery, [this] { return stop_; });
    l.unlock();
    {
      std::lock_guard<std::mutex> io(io_mu_);
      DrainOnce();
      if (f_ != nullptr && std::fflush(f_) != 0) {
        failed_ = true;
        std::lock_guard<std::mutex> st(st_mu_);
        st_.failed = true;
      }
    }
    l.lock();
  }
}

void Trace::Calibrate() {
  clock_now_ = transport::TraceClock();
  mono_now_ = MonotonicNs();
  if (clock_now_ > clock0_ && mono_now_ > mono0_) {
    ns_per_tick_q32_ = static_cast<uint64_t>(static_cast<long double>(mono_now_ - mono0_) * 4294967296.0L /
                                             static_cast<long double>(clock_now_ - clock0_));
  }
}

void Trace::DrainOnce() {
  if (f_ == nullptr) return;  // closed
  Calibrate();
  const int64_t base = static_cast<int64_t>(mono_now_) + epoch_offset_ns_;
  // Clock readings to monotonic ns (from the latest calibration point: the
  // events are at most a few ms older, so the product fits), then to the
  // epoch; in the ring's own slots, which are the consumer's until drained.
  auto convert = [&](TraceEvent* e, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      const int64_t ticks = static_cast<int64_t>(e[i].ns - clock_now_);
      const __int128 d = static_cast<__int128>(ticks) * static_cast<__int128>(ns_per_tick_q32_);
      e[i].ns = static_cast<uint64_t>(base + static_cast<int64_t>(d >> 32));
    }
  };
  uint64_t events = 0, bytes = 0;
  for (const auto& r : rings_) {
    if (o_.format == TraceFormat::kBinary) {
      // Straight from the ring to the file (unbuffered: one write per piece).
      r->Drain([&](TraceEvent* e, size_t n) {
        if (failed_) return;
        convert(e, n);
        if (std::fwrite(e, sizeof(TraceEvent), n, f_) != n) {
          failed_ = true;
          return;
        }
        bytes += n * sizeof(TraceEvent);
        events += n;
      });
      continue;
    }
    scratch_.clear();
    r->Drain([&](TraceEvent* e, size_t n) {
      convert(e, n);
      scratch_.insert(scratch_.end(), e, e + n);
    });
    if (failed_ || scratch_.empty()) continue;
    line_.clear();
    for (const TraceEvent& e : scratch_) {
      AppendTraceEvent(&line_, e, o_.format, dev_, 0);
      line_ += '\n';
    }
    if (std::fwrite(line_.data(), 1, line_.size(), f_) != line_.size()) {
      failed_ = true;
      continue;
    }
    bytes += line_.size();
    events += scratch_.size();
  }
  std::lock_guard<std::mutex> l(st_mu_);
  st_.events_written += events;
  st_.bytes += bytes;
  st_.failed = failed_;
}

// Does not wait for the writer: `trace show` stays instant however far
// behind the writer is (it formats and writes a busy link's events at a few
// hundred thousand a second, less on a loaded machine).
TraceStatus Trace::Status() {
  std::lock_guard<std::mutex> l(st_mu_);
  TraceStatus s = st_;
  for (const auto& r : rings_) {
    s.dropped += r->dropped();
    s.events += r->recorded();
  }
  return s;
}

}  // namespace droce::lab
