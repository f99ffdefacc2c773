// The port's state and the device's unaffiliated async events: the link is
// polled every kLinkPollNs (one ioctl or one PMD read), a change raises
// IBV_EVENT_PORT_ERR or IBV_EVENT_PORT_ACTIVE; a link whose kernel interface
// disappeared, or an exception escaping the engine, kills the device with
// IBV_EVENT_DEVICE_FATAL (IBA 11.6.3.3: unaffiliated catastrophic error).
#include <rte_mbuf.h>

#include <algorithm>
#include <exception>
#include <string>

#include "common/log.h"
#include "engine/device.h"

namespace droce::engine {
namespace {

constexpr uint64_t kLinkPollNs = 100'000'000;
// enum ibv_event_type
constexpr int kEventDeviceFatal = 8, kEventPortActive = 9, kEventPortErr = 10;

}  // namespace

void Device::AddDeviceSink(EventSink* sink) {
  RunOnWorker([&] { device_sinks_.push_back(sink); });
}

void Device::RemoveDeviceSink(EventSink* sink) {
  RunOnWorker([&] { std::erase(device_sinks_, sink); });
}

void Device::RaiseDeviceEvent(int event_type) {
  for (EventSink* s : device_sinks_) s->DeviceEvent(event_type);
}

void Device::PollLinkState(Worker& w) {
  const uint64_t now = w.last_timer_ns;
  if (dead() || now - last_link_poll_ns_ < kLinkPollNs) return;
  last_link_poll_ns_ = now;
  using LinkState = io::DpdkPort::LinkState;
  const LinkState s = dpdk_.PollLink();
  if (s == LinkState::kUnknown) return;
  if (s == LinkState::kGone) {
    w.exclusive.push_back([this] { EnterFatal("the link's kernel interface is gone"); });
    return;
  }
  const bool up = s == LinkState::kUp;
  if (up) link_seen_up_ = true;
  const bool active = up || !link_seen_up_;
  if (active == port_active()) return;
  port_active_.store(active, std::memory_order_relaxed);
  if (!active) ++w.stats.link_downed;
  Log(active ? LogLevel::kInfo : LogLevel::kWarning, "%s: link %s", port_.name.c_str(), active ? "up" : "down");
  RaiseDeviceEvent(active ? kEventPortActive : kEventPortErr);
}

void Device::EnterFatal(const char* why) {
  if (dead()) return;
  Log(LogLevel::kError, "%s: device failed: %s; every QP is flushed", port_.name.c_str(), why);
  dead_.store(true, std::memory_order_release);
  port_active_.store(false, std::memory_order_relaxed);
  // What the link holds or was about to take is gone with it.
  for (auto& w : workers_) {
    for (rte_mbuf* m : w->tx) rte_pktmbuf_free(m);
    w->tx.clear();
  }
  RaiseDeviceEvent(kEventDeviceFatal);
  transport::QpAttr err;
  err.state = transport::QpState::kErr;
  for (auto& [qpn, e] : qps_) {
    e->qp->Modify(err, transport::kAttrState);
    DeliverEvents(e.get());
  }
}

bool Device::PollOnceGuarded(Worker& w) {
  // The device dies with every worker stopped, after this turn (DriveLocked).
  try {
    return PollOnce(w);
  } catch (const std::exception& ex) {
    w.exclusive.push_back([this, why = std::string(ex.what())] { EnterFatal(why.c_str()); });
  } catch (...) {
    w.exclusive.push_back([this] { EnterFatal("unknown exception"); });
  }
  return false;
}

}  // namespace droce::engine
