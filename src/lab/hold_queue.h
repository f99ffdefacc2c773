// Frames held back by the fault stage (delay, rate, reorder), per
// direction: each leaves when its time comes, or — a reordered one — when
// enough later packets have passed it, whichever is first. Bounded: Push
// fails when full and the caller lets the frame go as it is. Released in
// order of (time, arrival). No DPDK, no allocation after construction.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace droce::lab {

template <typename T>
class HoldQueue {
 public:
  explicit HoldQueue(size_t capacity) : capacity_(capacity) { entries_.reserve(capacity); }

  bool empty() const { return entries_.empty(); }
  size_t size() const { return entries_.size(); }

  // Held until `due_ns`, or until `after_packets` (> 0) later packets have
  // passed (Passed).
  bool Push(T item, uint64_t due_ns, uint32_t after_packets) {
    if (entries_.size() >= capacity_) return false;
    entries_.push_back({due_ns, seq_++, after_packets, item});
    next_due_ = std::min(next_due_, due_ns);
    counting_ += after_packets != 0;
    return true;
  }

  // n packets went by (sent or delivered) in this direction. Costs nothing
  // while no entry waits for packets (only delayed ones are held).
  void Passed(uint32_t n) {
    if (n == 0 || counting_ == 0) return;
    for (Entry& e : entries_) {
      if (e.after == 0) continue;
      e.after = e.after > n ? e.after - n : 0;
      if (e.after == 0) {
        e.due = 0;
        next_due_ = 0;
        --counting_;
      }
    }
  }

  // Calls f(item) for every entry due by now, in (due, arrival) order.
  template <typename F>
  void Release(uint64_t now_ns, F&& f) {
    if (entries_.empty() || now_ns < next_due_) return;
    std::sort(entries_.begin(), entries_.end(),
              [](const Entry& a, const Entry& b) { return a.due != b.due ? a.due < b.due : a.seq < b.seq; });
    size_t n = 0;
    while (n < entries_.size() && entries_[n].due <= now_ns) ++n;
    for (size_t i = 0; i < n; ++i) {
      counting_ -= entries_[i].after != 0;  // released by its time before its packets came
      f(entries_[i].item);
    }
    entries_.erase(entries_.begin(), entries_.begin() + static_cast<std::ptrdiff_t>(n));
    next_due_ = entries_.empty() ? UINT64_MAX : entries_.front().due;
  }

  // Hands every entry to f, due or not (teardown).
  template <typename F>
  void Drain(F&& f) {
    for (Entry& e : entries_) f(e.item);
    entries_.clear();
    counting_ = 0;
    next_due_ = UINT64_MAX;
  }

 private:
  struct Entry {
    uint64_t due;
    uint64_t seq;
    uint32_t after;
    T item;
  };
  size_t capacity_;
  std::vector<Entry> entries_;
  uint64_t seq_ = 0;
  uint64_t next_due_ = UINT64_MAX;
  size_t counting_ = 0;  // entries with after != 0
};

}  // namespace droce::lab
