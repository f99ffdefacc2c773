#include "lab/capture.h"

#include <charconv>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "lab/roce_peek.h"
#include "wire/headers.h"

namespace droce::lab {
namespace {

constexpr uint32_t kPsnMask = 0xFFFFFF;
// Retransmission counts kept before they are forgotten (they restart at 1).
constexpr size_t kMaxResent = 1 << 16;
// The file is flushed at least this often while frames come.
constexpr uint64_t kFlushEveryNs = 100'000'000;

absl::StatusOr<uint64_t> Number(std::string_view key, std::string_view v, bool sized) {
  uint64_t mult = 1;
  if (sized && !v.empty()) {
    switch (v.back()) {
      case 'k': case 'K': mult = 1ull << 10; break;
      case 'm': case 'M': mult = 1ull << 20; break;
      case 'g': case 'G': mult = 1ull << 30; break;
      default: break;
    }
    if (mult != 1) v.remove_suffix(1);
  }
  uint64_t n = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), n);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size() || n > UINT64_MAX / mult) {
    return absl::InvalidArgumentError(absl::StrCat("'", std::string(key), "' needs a number",
                                                   sized ? " (with k, M or G)" : "", ", not '", std::string(v), "'"));
  }
  return n * mult;
}

void Add(std::string* s, std::string_view part) {
  if (!s->empty()) s->append("; ");
  s->append(part);
}

}  // namespace

absl::StatusOr<CaptureOptions> ParseCaptureSpec(std::string_view spec) {
  CaptureOptions o;
  o.text = std::string(spec);
  const std::vector<std::string> parts = absl::StrSplit(std::string(spec), ',');
  if (parts.empty() || parts[0].empty()) return absl::InvalidArgumentError("no file to capture to (PATH[,size=N,...])");
  o.path = std::string(parts[0]);
  for (size_t i = 1; i < parts.size(); ++i) {
    const std::string_view kv = parts[i];  // NOLINT: parts outlives it
    const size_t eq = kv.find('=');
    const std::string_view k = kv.substr(0, eq), v = eq == std::string_view::npos ? "" : kv.substr(eq + 1);
    if (k == "point") {
      if (v == "engine") o.points = kCaptureEngine;
      else if (v == "wire") o.points = kCaptureWire;
      else if (v == "both") o.points = kCaptureBoth;
      else return absl::InvalidArgumentError(absl::StrCat("'point' is engine, wire or both, not '", std::string(v), "'"));
      continue;
    }
    const bool sized = k == "size";
    if (k != "size" && k != "files" && k != "count" && k != "snaplen") {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown capture option '", std::string(k), "' (size, files, count, snaplen, point)"));
    }
    absl::StatusOr<uint64_t> n = Number(k, v, sized);
    if (!n.ok()) return n.status();
    if (k == "size") {
      if (*n != 0 && *n < 4096) return absl::InvalidArgumentError("'size' is at least 4096 bytes (or 0: no limit)");
      o.file_bytes = *n;
    } else if (k == "files") {
      if (*n < 1 || *n > 1000) return absl::InvalidArgumentError("'files' is 1 to 1000");
      o.files = static_cast<uint32_t>(*n);
    } else if (k == "count") {
      o.count = *n;
    } else {
      if (*n < 64 || *n > 65535) return absl::InvalidArgumentError("'snaplen' is 64 to 65535");
      o.snaplen = static_cast<uint32_t>(*n);
    }
  }
  if (o.files > 1 && o.file_bytes == 0) {
    return absl::InvalidArgumentError("a ring of files ('files' above 1) needs 'size', the bytes of each file");
  }
  return o;
}

std::string DevicePath(const std::string& path, const std::string& dev) {
  const size_t slash = path.rfind('/');
  const size_t dot = path.rfind('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == slash + 1) {
    return absl::StrCat(path, "-", dev);
  }
  return absl::StrCat(path.substr(0, dot), "-", dev, path.substr(dot));
}

std::string PacketNotes::Retransmission(Flow& f, uint64_t key, uint32_t psn, const char* what) {
  const uint32_t ahead = (psn - f.next_psn) & kPsnMask;
  if (!f.seen || ahead < (1u << 23)) {
    f.seen = true;
    f.next_psn = (psn + 1) & kPsnMask;
    return {};
  }
  if (resent_.size() >= kMaxResent) resent_.clear();
  const uint32_t n = ++resent_[(key << 24) | psn];
  return absl::StrCat("retransmission ", n, " of ", what, "PSN ", psn);
}

std::string PacketNotes::Note(std::span<const uint8_t> frame, const Decision* d) {
  RocePeek p;
  if (!PeekRoce(frame.data(), static_cast<uint32_t>(frame.size()), &p)) return {};
  std::string s;
  if (d != nullptr) {
    if (d->drop) Add(&s, absl::StrCat("dropped by rule ", d->drop_rule));
    if (d->corrupt) Add(&s, absl::StrCat("ICRC corrupted by rule ", d->corrupt_rule));
    if (d->mark_ce) Add(&s, absl::StrCat("ECN CE set by rule ", d->ce_rule));
    if (d->duplicate) Add(&s, absl::StrCat("duplicated by rule ", d->duplicate_rule));
    if (d->hold_packets != 0) {
      Add(&s, absl::StrCat("held behind ", d->hold_packets, " packets by rule ", d->reorder_rule, " (reorder)"));
    } else if (d->release_ns > d->at_ns) {
      Add(&s, absl::StrFormat("delayed %.1f us by rule %u", static_cast<double>(d->release_ns - d->at_ns) / 1e3,
                              d->delay_rule));
    }
  }
  const uint8_t op = p.opcode;
  if (op == 0x81) {
    Add(&s, absl::StrFormat("CNP for QP 0x%06x", p.dqpn));
    return s;
  }
  if (op >= 0x20) return s;  // only RC is retransmitted
  const bool acked = op == 0x11 || op == 0x12;
  if (acked && p.bth_offset + 13 <= frame.size()) {
    const uint8_t syn = frame[p.bth_offset + 12];
    const uint8_t kind = syn >> 5, code = syn & 0x1F;
    if (kind == 1) Add(&s, absl::StrFormat("RNR NAK for PSN %u (timer code %u)", p.psn, code));
    else if (kind == 3 && code == 0) Add(&s, absl::StrFormat("NAK (PSN sequence error): expected PSN %u", p.psn));
    else if (kind == 3) Add(&s, absl::StrFormat("NAK (%s) for PSN %u", wire::nak_code_name(code), p.psn));
    return s;
  }
  if (acked) return s;
  const bool response = op >= 0x0D && op <= 0x10;  // RDMA READ response
  const uint64_t key = (uint64_t{p.dqpn} << 1) | (response ? 1 : 0);
  const std::string r = Retransmission(flows_[key], key, p.psn, response ? "READ response " : "");
  if (!r.empty()) Add(&s, r);
  return s;
}

absl::StatusOr<std::unique_ptr<Capture>> Capture::Start(const CaptureOptions& o, const std::string& dev, bool fault) {
  std::unique_ptr<Capture> c(new Capture());
  c->o_ = o;
  auto add = [&](Point p, std::string name, std::string desc) {
    c->iface_[p] = static_cast<int>(c->ifs_.size());
    c->ifs_.push_back({std::move(name), std::move(desc), o.snaplen});
  };
  if (!fault) {
    add(kTxEngine, dev + " tx", "frames the engine sent (no fault stage: as on the link)");
    add(kRxEngine, dev + " rx", "frames the engine received (no fault stage: as on the link)");
  } else {
    if (o.points & kCaptureEngine) add(kTxEngine, dev + " tx", "frames the engine sent, before the fault stage");
    if (o.points & kCaptureWire) add(kTxWire, dev + " tx wire", "frames handed to the link, after the fault stage");
    if (o.points & kCaptureWire) add(kRxWire, dev + " rx wire", "frames from the link, before the fault stage");
    if (o.points & kCaptureEngine) add(kRxEngine, dev + " rx", "frames the engine took, after the fault stage");
  }
  c->st_.text = o.text;
  std::lock_guard<std::mutex> l(c->mu_);
  absl::StatusOr<std::unique_ptr<PcapngWriter>> w = PcapngWriter::Create(c->FileName(0), c->ifs_);
  if (!w.ok()) return w.status();
  c->w_ = *std::move(w);
  c->st_.file = c->FileName(0);
  c->st_.files_done = 1;
  return c;
}

std::string Capture::FileName(uint32_t n) const {
  return o_.files <= 1 ? o_.path : absl::StrCat(o_.path, ".", n);
}

bool Capture::NextFile() {
  st_.bytes += w_->bytes();
  w_.reset();
  if (o_.files <= 1) {
    st_.ended = true;
    st_.why = "file size reached";
    return false;
  }
  const std::string name = FileName(st_.files_done % o_.files);
  absl::StatusOr<std::unique_ptr<PcapngWriter>> w = PcapngWriter::Create(name, ifs_);
  if (!w.ok()) {
    st_.ended = true;
    st_.why = std::string(w.status().message());
    return false;
  }
  w_ = *std::move(w);
  st_.file = name;
  ++st_.files_done;
  return true;
}

bool Capture::Record(Point p, uint64_t ts_ns, std::span<const Frame> frames) {
  const int iface = iface_[p];
  if (iface < 0) return live();
  std::lock_guard<std::mutex> l(mu_);
  if (st_.ended) return false;
  const PcapngDir dir = p == kTxEngine || p == kTxWire ? PcapngDir::kOutbound : PcapngDir::kInbound;
  for (const Frame& f : frames) {
    if (o_.file_bytes != 0 && w_->bytes() >= o_.file_bytes && !NextFile()) break;
    const std::string note = notes_[p].Note(f.bytes, f.decision);
    if (!w_->Packet(static_cast<uint32_t>(iface), ts_ns, f.bytes, f.len, dir, note)) {
      st_.ended = true;
      st_.why = "a write failed";
      break;
    }
    if (++st_.frames == o_.count) {
      st_.ended = true;
      st_.why = "frame count reached";
      break;
    }
  }
  if (!st_.ended && ts_ns - last_flush_ns_ >= kFlushEveryNs) {
    // A capture of a quiet link is readable while it runs.
    w_->Flush();
    last_flush_ns_ = ts_ns;
  }
  if (st_.ended) {
    if (w_ != nullptr) {
      w_->Flush();
      st_.bytes += w_->bytes();
      w_.reset();
    }
    ended_.store(true, std::memory_order_relaxed);
    return false;
  }
  return true;
}

CaptureStatus Capture::Status() {
  std::lock_guard<std::mutex> l(mu_);
  CaptureStatus s = st_;
  if (w_ != nullptr) {
    w_->Flush();
    s.bytes += w_->bytes();
  }
  return s;
}

}  // namespace droce::lab
