// A deterministic in-memory network for transport tests: two or more QPs'
// frames go through a queue that can drop, duplicate and reorder them, in
// virtual time.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "transport/env.h"
#include "transport/qp.h"
#include "wire/frame.h"

namespace droce::test {

struct SimFrame {
  std::vector<uint8_t> bytes;
};

class SimEnv : public transport::TransportEnv {
 public:
  explicit SimEnv(std::deque<SimFrame>* wire, uint64_t* clock) : wire_(wire), clock_(clock) {}
  uint64_t NowNs() override { return *clock_; }
  bool AllocFrame(uint32_t len, transport::TxFrame* f) override {
    auto* buf = new std::vector<uint8_t>(len);
    f->data = buf->data();
    f->capacity = len;
    f->handle = buf;
    return true;
  }
  void SendFrame(const transport::TxFrame& f, uint32_t len) override {
    auto* buf = static_cast<std::vector<uint8_t>*>(f.handle);
    if (len != 0) {
      buf->resize(len);
      wire_->push_back(SimFrame{std::move(*buf)});
    }
    delete buf;
  }
  bool ResolveMac(const wire::Ipv6Addr&, wire::MacAddr* mac) override {
    *mac = {2, 0, 0, 0, 0, 9};
    return resolvable;
  }
  bool resolvable = true;  // false: the destination never answers ARP
  mem::MrTable& Mrs() override { return mrs; }
  bool InvalidateRkey(uint32_t rkey, uint32_t pd) override { return mrs.Invalidate(rkey, pd); }
  const transport::AddressHandle* FindAh(uint32_t id) override {
    auto it = ahs.find(id);
    return it == ahs.end() ? nullptr : &it->second;
  }
  std::map<uint32_t, transport::AddressHandle> ahs;
  Counters& Stats() override { return stats; }

  mem::MrTable mrs;
  Counters stats;

 private:
  std::deque<SimFrame>* wire_;
  uint64_t* clock_;
};

}  // namespace droce::test
