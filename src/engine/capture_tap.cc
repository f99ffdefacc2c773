#include "engine/capture_tap.h"

#include <time.h>

#include <algorithm>
#include <cstring>

#include <rte_mbuf.h>

namespace droce::engine {
namespace {

uint64_t RealtimeNs() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000ull + static_cast<uint64_t>(ts.tv_nsec);
}

}  // namespace

void CaptureTap::Add(lab::Capture::Point p, const rte_mbuf* m, const lab::Decision* d) {
  if (!c_->wants(p)) return;
  Batch& b = batch_[p];
  const uint32_t len = rte_pktmbuf_pkt_len(m);
  const size_t cap = std::min<size_t>(len, c_->snaplen());
  const size_t off = b.bytes.size();
  b.bytes.resize(off + cap);
  size_t done = 0;
  for (const rte_mbuf* s = m; s != nullptr && done < cap; s = s->next) {
    const size_t k = std::min<size_t>(s->data_len, cap - done);
    std::memcpy(b.bytes.data() + off + done, rte_pktmbuf_mtod(s, const uint8_t*), k);
    done += k;
  }
  b.bytes.resize(off + done);
  b.entries.push_back({off, done, len, d != nullptr, d != nullptr ? *d : lab::Decision{}});
}

void CaptureTap::Frames(lab::Capture::Point p, rte_mbuf* const* m, size_t n) {
  if (n == 0 || !c_->wants(p)) return;
  for (size_t i = 0; i < n; ++i) Add(p, m[i]);
  Commit(p);
}

void CaptureTap::Commit(lab::Capture::Point p) {
  Batch& b = batch_[p];
  if (b.entries.empty()) return;
  b.frames.clear();
  for (const Batch::Entry& e : b.entries) {
    b.frames.push_back({std::span<const uint8_t>(b.bytes.data() + e.off, e.cap), e.len, e.judged ? &e.d : nullptr});
  }
  c_->Record(p, RealtimeNs(), b.frames);
  b.entries.clear();
  b.bytes.clear();
}

}  // namespace droce::engine
