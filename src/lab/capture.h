// Packet capture on a live link (DROCE_CAPTURE, `droce ctl capture`): what
// the engine sends and receives, before and after the fault stage, into
// pcapng files (lab/pcapng.h) bounded by size and count, optionally a ring
// of files, each frame with a comment naming what happened to it ("dropped
// by rule 2", "retransmission 3 of PSN 1234", "CNP for QP 0x11", "NAK: PSN
// sequence error, expected PSN 7"). No DPDK: the engine's tap
// (engine/capture_tap.h) hands frames as bytes; the unit tests do too.
//
// Capture points, one pcapng interface each per device:
//   "<dev> tx"      the frames the engine sends, before the fault stage
//                   (with what the rules do to them)
//   "<dev> tx wire" what reaches the link, after the fault stage
//   "<dev> rx wire" what the link delivers, before the fault stage
//   "<dev> rx"      what the engine takes, after the fault stage
// `point engine` keeps the first and last, `wire` the middle two, `both` all
// four. Without fault rules, engine and wire are the same frames: each is
// written once, on the engine interface.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "lab/fault_engine.h"
#include "lab/pcapng.h"

namespace droce::lab {

enum CapturePoint : uint8_t { kCaptureEngine = 1, kCaptureWire = 2, kCaptureBoth = 3 };

struct CaptureOptions {
  std::string path;           // PATH, or PATH.0 .. PATH.<files-1> for a ring
  uint64_t file_bytes = 0;    // size: a file ends past this many bytes; 0 = no limit
  uint32_t files = 1;         // files: >1 = a ring, the oldest overwritten
  uint64_t count = 0;         // count: the capture ends after this many frames; 0 = no limit
  uint32_t snaplen = 65535;   // bytes kept of each frame
  uint8_t points = kCaptureEngine;
  std::string text;  // as given, for reports
};

// "PATH[,size=N[k|M|G]][,files=N][,count=N][,snaplen=N][,point=engine|wire|both]".
absl::StatusOr<CaptureOptions> ParseCaptureSpec(std::string_view spec);
// The file of device `dev` when one path is given for several: "-<dev>"
// before the file name's extension ("/tmp/a.pcapng" -> "/tmp/a-droce1.pcapng").
std::string DevicePath(const std::string& path, const std::string& dev);

// The comments of one capture point and direction: follows each RC QP's
// PSNs to tell a retransmission from a first send. Not thread-safe.
class PacketNotes {
 public:
  // The comment for `frame` (a full Ethernet frame) and, if the fault stage
  // judged it, the decision `d` (nullptr: not judged here). "" = nothing
  // to say.
  std::string Note(std::span<const uint8_t> frame, const Decision* d);

 private:
  struct Flow {
    uint32_t next_psn = 0;  // one past the highest PSN seen
    bool seen = false;
  };
  std::string Retransmission(Flow& f, uint64_t key, uint32_t psn, const char* what);

  // By (destination QP, request or response).
  absl::flat_hash_map<uint64_t, Flow> flows_;
  // Times each (flow, PSN) was seen again; cleared when it grows large.
  absl::flat_hash_map<uint64_t, uint32_t> resent_;
};

struct CaptureStatus {
  std::string text;        // the options as given
  std::string file;        // the file being written (or last written)
  uint64_t frames = 0;     // written
  uint64_t bytes = 0;      // written, over every file
  uint32_t files_done = 0; // files started
  bool ended = false;      // count reached, a single file full, or a write failed
  std::string why;         // why it ended
};

// One capture of one device. Record is called by the device's workers with
// the frames of a burst; a mutex orders them into one file.
class Capture {
 public:
  // Interfaces: `dev` names them; `fault` whether the device has a fault
  // stage (otherwise wire = engine).
  static absl::StatusOr<std::unique_ptr<Capture>> Start(const CaptureOptions& o, const std::string& dev,
                                                        bool fault);

  enum Point : uint8_t { kTxEngine = 0, kTxWire = 1, kRxWire = 2, kRxEngine = 3 };
  // Whether frames at p are written (fixed for the capture's life).
  bool wants(Point p) const { return iface_[p] >= 0; }
  uint32_t snaplen() const { return o_.snaplen; }
  // Whether the capture still takes frames.
  bool live() const { return !ended_.load(std::memory_order_relaxed); }

  struct Frame {
    std::span<const uint8_t> bytes;  // captured (at least the headers)
    uint32_t len = 0;                // on the wire
    const Decision* decision = nullptr;
  };
  // Writes frames seen at p at ts_ns (ns since the epoch). Returns false
  // once the capture has ended.
  bool Record(Point p, uint64_t ts_ns, std::span<const Frame> frames);
  // Flushes what is buffered (the capture stays open).
  CaptureStatus Status();

 private:
  Capture() = default;
  bool NextFile();  // with mu_ held
  std::string FileName(uint32_t n) const;

  CaptureOptions o_;
  std::vector<PcapngInterface> ifs_;
  int iface_[4] = {-1, -1, -1, -1};
  std::atomic<bool> ended_{false};
  std::mutex mu_;
  std::unique_ptr<PcapngWriter> w_;
  PacketNotes notes_[4];
  CaptureStatus st_;
  uint64_t last_flush_ns_ = 0;
};

}  // namespace droce::lab
