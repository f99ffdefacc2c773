// The port's state and the device's unaffiliated async events: the link is
// polled every kLinkPollNs (one ioctl or one PMD read), a change raises
// IBV_EVENT_PORT_ERR or IBV_EVENT_PORT_ACTIVE; a link whose kernel interface
// disappeared, or an exception escaping the engine, kills the device with
// IBV_EVENT_DEVICE_FATAL (IBA 11.6.3.3: unaffiliated catastrophic error).
#include <unistd.h>

#include <rte_mbuf.h>

#include <algorithm>
#include <exception>
#include <string>

#include "common/log.h"
#include "engine/device.h"

namespace droce::engine {
namespace {

constexpr uint64_t kLinkPollNs = 100'000'000;
// A memif client tries its server again this long after a failed try or a
// link that was up and went down (the PMD dropped the connection), and
// this long after a try that connected but brought no link up yet (a
// server still busy with the client before, which ignores the new one
// until it tries again).
constexpr uint64_t kReconnectNs = 100'000'000, kHandshakeNs = 1'000'000'000;
// How long opening a memif client's device waits for its server: two
// programs started together (ucx_perftest, an MPI job's ranks) find each
// other without a lost first message.
constexpr uint64_t kLinkWaitNs = 3'000'000'000;
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

bool Device::ReconnectDue(uint64_t now) const {
  const bool handshaking = dpdk_.started() && !link_up_since_try_;
  return dpdk_.reconnects() && now - last_reconnect_ns_ >= (handshaking ? kHandshakeNs : kReconnectNs);
}

// Setup, before any worker runs: a memif client tries its server until the
// link is up or kLinkWaitNs have passed. Then the port reports what it is
// (PollLinkState goes on trying).
void Device::WaitForLink() {
  if (!dpdk_.reconnects()) return;
  const uint64_t start = NowNs();
  last_reconnect_ns_ = start;
  for (uint64_t now = start; now - start < kLinkWaitNs; now = NowNs()) {
    if (dpdk_.PollLink() == io::DpdkPort::LinkState::kUp) break;
    if (ReconnectDue(now)) {
      last_reconnect_ns_ = now;
      link_up_since_try_ = false;
      dpdk_.Reconnect();
    }
    usleep(5000);
  }
  const bool up = dpdk_.PollLink() == io::DpdkPort::LinkState::kUp;
  if (up) dpdk_.PrefaultSharedMemory();
  link_seen_up_ = link_up_since_try_ = link_raw_up_ = up;
  port_active_.store(up, std::memory_order_relaxed);
  if (!up) Log(LogLevel::kWarning, "%s: memif server not reachable yet; the port is DOWN until it is", port_.name.c_str());
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
  if (up && !link_raw_up_) dpdk_.PrefaultSharedMemory();  // a new connection's memory
  if (link_raw_up_) {
    // The link's own counts so far, read each poll while it is up: the memif
    // PMD restarts them when its link goes (DpdkPort::ReadStats carries on).
    io::DpdkPort::Stats carried;
    (void)dpdk_.ReadStats(&carried);
  }
  link_raw_up_ = up;
  if (up) link_seen_up_ = link_up_since_try_ = true;
  if (!up && ReconnectDue(now)) {
    // Stopping and starting the port needs every worker away from its queues.
    last_reconnect_ns_ = now;
    link_up_since_try_ = false;
    w.exclusive.push_back([this] { dpdk_.Reconnect(); });
  }
  // A port whose link was never up counts as ACTIVE (a memif server waiting
  // for its first client: perftest and the ibverbs examples refuse a port
  // that is not ACTIVE, and nothing can reach it before a client comes). A
  // memif client knows better: it reports DOWN until its server answers.
  const bool active = up || (!link_seen_up_ && !dpdk_.reconnects());
  if (active == port_active()) return;
  port_active_.store(active, std::memory_order_relaxed);
  if (!active) Bump(w.stats.link_downed);
  Log(active ? LogLevel::kInfo : LogLevel::kWarning, "%s: link %s", port_.name.c_str(), active ? "up" : "down");
  RaiseDeviceEvent(active ? kEventPortActive : kEventPortErr);
}

void Device::EnterFatal(const char* why) {
  AssertStopped("EnterFatal");
  if (dead()) return;
  if (shutting_down_) Log(LogLevel::kInfo, "%s: %s; every QP is flushed", port_.name.c_str(), why);
  else Log(LogLevel::kError, "%s: device failed: %s; every QP is flushed", port_.name.c_str(), why);
  dead_.store(true, std::memory_order_release);
  port_active_.store(false, std::memory_order_relaxed);
  // What the link holds or was about to take is gone with it.
  for (auto& w : workers_) {
    for (rte_mbuf* m : w->tx) rte_pktmbuf_free(m);
    w->tx.clear();
    w->tx_judged = 0;
  }
  RaiseDeviceEvent(kEventDeviceFatal);
  transport::QpAttr err;
  err.state = transport::QpState::kErr;
  for (auto& [qpn, e] : objects_.qps) {
    e->qp->Modify(err, transport::kAttrState);
    DeliverEvents(e.get());
  }
}

bool Device::PollOnceGuarded(Worker& w) {
  // One clock reading per turn for what needs no better (TransportEnv::TurnNs).
  w.turn_ns = NowNs();
  if (const uint64_t stalled = w.stalls.Turn(w.turn_ns); stalled != 0) [[unlikely]] {
    Bump(w.stats.engine_stalls);
    Bump(w.stats.engine_stalled_us, stalled / 1000);
  }
  if (w.trace_turn != nullptr) [[unlikely]] w.trace_turn->StartTurn();
  struct EndTurn {
    Worker& w;
    ~EndTurn() {
      w.turn_ns = 0;
      if (w.trace_turn != nullptr) [[unlikely]] w.trace_turn->EndTurn();
    }
  } end_turn{w};
  // The device dies with every worker stopped, after this turn (DriveLocked).
  try {
    return w.Turn();
  } catch (const std::exception& ex) {
    w.exclusive.push_back([this, why = std::string(ex.what())] { EnterFatal(why.c_str()); });
  } catch (...) {
    w.exclusive.push_back([this] { EnterFatal("unknown exception"); });
  }
  return false;
}

}  // namespace droce::engine
