// A worker's tap into a live capture (lab/capture.h): copies the frames of
// a burst out of their mbufs (up to the snap length) and hands them to the
// capture in one call, so its lock is taken once per burst. The worker and
// its fault stage call it only while a capture runs: without one the worker
// has no tap and pays one branch per burst. Owned by its worker.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "lab/capture.h"
#include "lab/fault_engine.h"

struct rte_mbuf;

namespace droce::engine {

class CaptureTap {
 public:
  explicit CaptureTap(std::shared_ptr<lab::Capture> c) : c_(std::move(c)) {}
  bool live() const { return c_->live(); }
  // Copies m (as it is now) into the batch for point p, with the fault
  // stage's decision if it judged the frame.
  void Add(lab::Capture::Point p, const rte_mbuf* m, const lab::Decision* d = nullptr);
  // Adds m[0..n) and records them.
  void Frames(lab::Capture::Point p, rte_mbuf* const* m, size_t n);
  // Records the batch of point p.
  void Commit(lab::Capture::Point p);

 private:
  struct Batch {
    std::vector<uint8_t> bytes;
    struct Entry {
      size_t off, cap;
      uint32_t len;
      bool judged;
      lab::Decision d;
    };
    std::vector<Entry> entries;
    std::vector<lab::Capture::Frame> frames;
  };
  std::shared_ptr<lab::Capture> c_;
  Batch batch_[4];
};

}  // namespace droce::engine
