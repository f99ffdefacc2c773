// The lab's hooks on a live device: the packet capture (lab/capture.h), the
// fault stage's rules (lab/fault_rules.h), congestion control's settings
// (cc/dcqcn.h) and the per-QP event trace (lab/trace.h), each started and
// stopped while traffic runs (installed on the workers with them stopped
// for a moment), or from the start by DROCE_CAPTURE, DROCE_FAULT and
// DROCE_TRACE.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "engine/device.h"

namespace droce::engine {
namespace {

// A process that exits with a trace on (the usual end of DROCE_TRACE) gets
// its last events written: the device, and so the trace, is never
// destroyed, and its writer drains the rings only every few milliseconds
// (on a busy machine, far less often).
pid_t trace_owner = 0;  // the process whose exit flushes the traces

void FlushTracesAtExit() {
  // A child forked without exec that calls exit() has neither the writer
  // thread to join nor traces of its own: the parent's files are the
  // parent's.
  if (getpid() != trace_owner) return;
  for (int i = 0; i < config::kMaxDevices; ++i) {
    if (Device* d = Device::Started(i)) {
      if (std::optional<lab::TraceStatus> st = d->CloseTraceAtExit(); st && st->dropped != 0) {
        Log(LogLevel::kWarning, "%s: trace %s lost %llu events to a full ring (ring=N is larger)",
            d->port().name.c_str(), st->text.c_str(), static_cast<unsigned long long>(st->dropped));
      }
    }
  }
}

void FlushTracesAtExitOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    trace_owner = getpid();
    std::atexit(FlushTracesAtExit);
  });
}

// What turns the engine's CLOCK_MONOTONIC into ns since the epoch.
int64_t EpochOffsetNs() {
  timespec r{}, m{};
  clock_gettime(CLOCK_REALTIME, &r);
  clock_gettime(CLOCK_MONOTONIC, &m);
  return (int64_t{r.tv_sec} - int64_t{m.tv_sec}) * 1'000'000'000 + (int64_t{r.tv_nsec} - int64_t{m.tv_nsec});
}

}  // namespace

absl::Status Device::StartLab(const Config& cfg) {
  // The fault stage (DROCE_FAULT): only with rules, so that without them
  // the loop's test of `fault` is all it costs. The worker index salts the
  // rules' seeds: two workers do not draw the same dice.
  if (!cfg.fault.empty()) {
    for (size_t i = 0; i < workers_.size(); ++i) {
      workers_[i]->fault = std::make_unique<FaultStage>(cfg.fault, i, dpdk_.pool(), NowNs());
    }
    has_fault_rules_.store(true, std::memory_order_relaxed);
  }
  // DROCE_CAPTURE: a capture from the first frame (droce<N>, N > 0, writes
  // its own file: "-droce<N>" before the path's extension).
  if (cfg.capture) {
    lab::CaptureOptions o = *cfg.capture;
    if (cfg.index > 0) o.path = lab::DevicePath(o.path, port_.name);
    absl::StatusOr<std::unique_ptr<lab::Capture>> c = lab::Capture::Start(o, port_.name, !cfg.fault.empty());
    if (!c.ok()) return absl::Status(c.status().code(), absl::StrCat("DROCE_CAPTURE: ", c.status().message()));
    capture_ = *std::move(c);
    for (const auto& w : workers_) w->capture = std::make_unique<CaptureTap>(capture_);
  }
  // DROCE_TRACE: the event trace of every QP from the first.
  if (cfg.trace) {
    lab::TraceOptions o = *cfg.trace;
    if (cfg.index > 0) o.path = lab::DevicePath(o.path, port_.name);
    absl::StatusOr<std::unique_ptr<lab::Trace>> t =
        lab::Trace::Start(o, port_.name, static_cast<int>(workers_.size()), EpochOffsetNs());
    if (!t.ok()) return absl::Status(t.status().code(), absl::StrCat("DROCE_TRACE: ", t.status().message()));
    trace_ = *std::move(t);
    RunOnWorker([&] { SetQpTraceSinks(); });  // no QP yet: the workers' turn stamps (clock=turn)
    FlushTracesAtExitOnce();
  }
  return absl::OkStatus();
}

absl::Status Device::StartCapture(const lab::CaptureOptions& o) {
  std::lock_guard<std::mutex> l(capture_mu_);
  if (capture_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("a capture of ", port_.name, " to ", capture_->Status().file,
                                                      " is on: stop it first"));
  }
  // Whether the workers have a fault stage now (the same on every worker;
  // read with them stopped: a cleared stage goes on its worker's turn).
  bool fault = false;
  RunOnWorker([&] { fault = workers_[0]->fault != nullptr; });
  absl::StatusOr<std::unique_ptr<lab::Capture>> c = lab::Capture::Start(o, port_.name, fault);
  if (!c.ok()) return c.status();
  std::shared_ptr<lab::Capture> sc = *std::move(c);
  RunOnWorker([&] {
    for (const auto& w : workers_) w->capture = std::make_unique<CaptureTap>(sc);
  });
  capture_ = std::move(sc);
  Log(LogLevel::kInfo, "%s: capture to %s started", port_.name.c_str(), o.text.c_str());
  return absl::OkStatus();
}

absl::StatusOr<lab::CaptureStatus> Device::StopCapture() {
  std::lock_guard<std::mutex> l(capture_mu_);
  if (capture_ == nullptr) return absl::NotFoundError(absl::StrCat("no capture on ", port_.name));
  RunOnWorker([&] {
    for (const auto& w : workers_) w->capture.reset();
  });
  lab::CaptureStatus st = capture_->Status();
  capture_.reset();  // the last reference: the file is closed
  Log(LogLevel::kInfo, "%s: capture to %s stopped: %llu frames, %llu bytes", port_.name.c_str(), st.text.c_str(),
      static_cast<unsigned long long>(st.frames), static_cast<unsigned long long>(st.bytes));
  return st;
}

std::optional<lab::CaptureStatus> Device::CaptureState() {
  std::lock_guard<std::mutex> l(capture_mu_);
  if (capture_ == nullptr) return std::nullopt;
  return capture_->Status();
}

void Device::SetFaultRules(std::vector<lab::FaultRule> rules) {
  const size_t n = rules.size();
  RunOnWorker([&] {
    const uint64_t now = NowNs();
    for (size_t i = 0; i < workers_.size(); ++i) {
      Worker& w = *workers_[i];
      if (w.fault != nullptr) {
        w.fault->SetRules(rules, now);
      } else if (!rules.empty()) {
        w.fault = std::make_unique<FaultStage>(rules, i, dpdk_.pool(), now);
      }
    }
  });
  has_fault_rules_.store(n != 0, std::memory_order_relaxed);
  Log(LogLevel::kInfo, "%s: %u fault rule%s now", port_.name.c_str(), static_cast<unsigned>(n), n == 1 ? "" : "s");
}

std::vector<RuleTotals> Device::FaultRules() {
  std::vector<RuleTotals> out;
  RunOnWorker([&] {
    std::vector<const FaultStage*> stages;
    for (const auto& w : workers_) {
      if (w->fault) stages.push_back(w->fault.get());
    }
    out = SumRules(stages);
  });
  return out;
}

absl::Status Device::SetCongestionControl(uint32_t qpn, cc::CcMode mode, const cc::DcqcnParams& p) {
  bool found = qpn == 0;
  RunOnWorker([&] {
    if (qpn == 0) {
      cc_mode_ = mode;
      dcqcn_ = p;
    }
    for (auto& [n, e] : objects_.qps) {
      if (qpn != 0 && n != qpn) continue;
      e->qp->SetCongestionControl(mode, p);
      found = true;
    }
  });
  if (!found) return absl::NotFoundError(absl::StrCat(port_.name, " has no QP ", qpn));
  return absl::OkStatus();
}

std::vector<Device::CcRow> Device::CongestionControl() {
  std::vector<CcRow> out;
  RunOnWorker([&] {
    CcRow d;
    d.mode = cc_mode_;
    d.params = dcqcn_;
    out.push_back(d);
    for (const auto& [n, e] : objects_.qps) {
      const transport::Qp& q = *e->qp;
      const cc::ReactionPoint& rp = q.reaction_point();
      CcRow r;
      r.qpn = n;
      r.mode = q.cc_mode();
      r.params = q.dcqcn();
      r.limited = rp.active();
      r.rate_mbps = rp.rate_mbps();
      r.target_mbps = rp.target_mbps();
      r.alpha = rp.alpha();
      r.cuts = rp.cuts();
      r.increases = rp.increases();
      out.push_back(r);
    }
  });
  std::sort(out.begin() + 1, out.end(), [](const CcRow& a, const CcRow& b) { return a.qpn < b.qpn; });
  return out;
}

void Device::SetQpTraceSinks() {
  AssertStopped("SetQpTraceSinks");
  for (auto& [qpn, e] : objects_.qps) {
    e->qp->SetTrace(trace_ != nullptr ? trace_->SinkFor(qpn, e->worker->index) : nullptr);
  }
  for (auto& w : workers_) w->trace_turn = trace_ != nullptr ? trace_->TurnClockRing(static_cast<int>(w->index)) : nullptr;
}

absl::Status Device::StartTrace(const lab::TraceOptions& o) {
  std::lock_guard<std::mutex> l(trace_mu_);
  if (trace_ != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("a trace of ", port_.name, " (", trace_->Status().text,
                                                      ") is on: stop it first"));
  }
  absl::StatusOr<std::unique_ptr<lab::Trace>> t =
      lab::Trace::Start(o, port_.name, static_cast<int>(workers_.size()), EpochOffsetNs());
  if (!t.ok()) return t.status();
  RunOnWorker([&] {
    trace_ = *std::move(t);
    SetQpTraceSinks();
  });
  FlushTracesAtExitOnce();
  Log(LogLevel::kInfo, "%s: trace to %s started", port_.name.c_str(), o.text.c_str());
  return absl::OkStatus();
}

absl::StatusOr<lab::TraceStatus> Device::StopTrace() {
  std::lock_guard<std::mutex> l(trace_mu_);
  if (trace_ == nullptr) return absl::NotFoundError(absl::StrCat("no trace on ", port_.name));
  std::unique_ptr<lab::Trace> t;
  RunOnWorker([&] {
    t = std::move(trace_);
    SetQpTraceSinks();
  });
  const lab::TraceStatus st = t->Close();  // the last events written, the file closed
  t.reset();
  Log(LogLevel::kInfo, "%s: trace to %s stopped: %llu events (%llu lost)", port_.name.c_str(), st.text.c_str(),
      static_cast<unsigned long long>(st.events), static_cast<unsigned long long>(st.dropped));
  return st;
}

std::optional<lab::TraceStatus> Device::CloseTraceAtExit() {
  std::lock_guard<std::mutex> l(trace_mu_);
  if (trace_ == nullptr) return std::nullopt;
  // The trace stays: workers still running may record into its rings,
  // which nobody drains any more.
  trace_->Close();
  return trace_->Status();
}

std::optional<lab::TraceStatus> Device::TraceState() {
  std::lock_guard<std::mutex> l(trace_mu_);
  if (trace_ == nullptr) return std::nullopt;
  return trace_->Status();
}

std::vector<std::string> Device::FaultReport() {
  std::vector<std::string> out;
  RunOnWorker([&] {
    std::vector<const FaultStage*> stages;
    for (const auto& w : workers_) {
      if (w->fault) stages.push_back(w->fault.get());
    }
    out = SumFaultReports(stages);
  });
  return out;
}

}  // namespace droce::engine
