#include "admin/query.h"

#include <arpa/inet.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/background.h"
#include "common/counters.h"
#include "ctl/protocol.h"
#include "queue/shm.h"

namespace droce::admin {
namespace {

std::string Guid(uint64_t g) {
  return absl::StrFormat("%04x:%04x:%04x:%04x", (g >> 48) & 0xFFFF, (g >> 32) & 0xFFFF, (g >> 16) & 0xFFFF,
                         g & 0xFFFF);
}

std::string Mac(const wire::MacAddr& m) {
  return absl::StrFormat("%02x:%02x:%02x:%02x:%02x:%02x", m[0], m[1], m[2], m[3], m[4], m[5]);
}

std::string Gid(const uint8_t* g) {
  char buf[INET6_ADDRSTRLEN];
  return inet_ntop(AF_INET6, g, buf, sizeof(buf)) != nullptr ? buf : "";
}

std::string Ip4(uint32_t host_order) {
  in_addr a{htonl(host_order)};
  char buf[INET_ADDRSTRLEN];
  return inet_ntop(AF_INET, &a, buf, sizeof(buf)) != nullptr ? buf : "";
}

int MtuBytes(uint8_t ibv_mtu) { return ibv_mtu >= 1 && ibv_mtu <= 5 ? 128 << ibv_mtu : 0; }

const char* QpTypeName(transport::QpType t) {
  switch (t) {
    case transport::QpType::kRc: return "RC";
    case transport::QpType::kUc: return "UC";
    case transport::QpType::kUd: return "UD";
    case transport::QpType::kXrcIni: return "XRC_INI";  // as `rdma res show qp` names them
    case transport::QpType::kXrcTgt: return "XRC_TGT";
  }
  return "?";
}

// rdma's state names (RESET, INIT, RTR, RTS, SQD, SQE, ERR).
const char* QpStateName(transport::QpState s) {
  switch (s) {
    case transport::QpState::kReset: return "RESET";
    case transport::QpState::kInit: return "INIT";
    case transport::QpState::kRtr: return "RTR";
    case transport::QpState::kRts: return "RTS";
    case transport::QpState::kSqd: return "SQD";
    case transport::QpState::kSqe: return "SQE";
    case transport::QpState::kErr: return "ERR";
  }
  return "?";
}

// The retransmission timer in force (Qp::RetransTimer).
const char* RetransName(transport::Qp::RetransTimer t) {
  switch (t) {
    case transport::Qp::RetransTimer::kSelectiveRepeat: return "sr";
    case transport::Qp::RetransTimer::kAdaptive: return "adaptive";
    case transport::Qp::RetransTimer::kLocalAck: return "local-ack";
    case transport::Qp::RetransTimer::kNone: break;
  }
  return "none";
}

absl::Status Bad(const std::string& what) { return absl::InvalidArgumentError(what); }

// Optional integer field; absent → -1.
absl::StatusOr<int64_t> IntField(const Json& req, const char* name) {
  auto it = req.find(name);
  if (it == req.end()) return -1;
  if (!it->is_number_integer() || it->get<int64_t>() < 0) return Bad(absl::StrCat("'", name, "' must be a number"));
  return it->get<int64_t>();
}

struct Filter {
  std::string dev;    // "" any
  int64_t pid = -1;   // -1 any
  int64_t qpn = -1;
};

absl::StatusOr<Filter> FilterOf(const Json& req, Host& host) {
  Filter f;
  if (auto it = req.find("dev"); it != req.end()) {
    if (!it->is_string()) return Bad("'dev' must be a device name");
    f.dev = it->get<std::string>();
    // rdma accepts DEV or DEV/PORT; the one port is 1.
    if (size_t slash = f.dev.find('/'); slash != std::string::npos) {
      if (f.dev.substr(slash + 1) != "1") return Bad(absl::StrCat("no port '", f.dev.substr(slash + 1), "' (droce devices have port 1)"));
      f.dev.resize(slash);
    }
    bool found = false;
    for (engine::Device* d : host.Devices()) found |= d->port().name == f.dev;
    if (!found) return Bad(absl::StrCat("no device '", f.dev, "'"));
  }
  auto pid = IntField(req, "pid");
  if (!pid.ok()) return pid.status();
  f.pid = *pid;
  auto qpn = IntField(req, "qpn");
  if (!qpn.ok()) return qpn.status();
  f.qpn = *qpn;
  return f;
}

// fn(index, device) for each device the filter keeps.
template <typename Fn>
void ForEachDevice(Host& host, const Filter& f, Fn&& fn) {
  auto devs = host.Devices();
  for (size_t i = 0; i < devs.size(); ++i) {
    if (f.dev.empty() || devs[i]->port().name == f.dev) fn(i, *devs[i]);
  }
}

Json DevHead(size_t index, const engine::Device& d) {
  Json j;
  j["ifindex"] = index;
  j["ifname"] = d.port().name;
  return j;
}

Json Devs(Host& host, const Filter& f) {
  Json out = Json::array();
  ForEachDevice(host, f, [&](size_t i, const engine::Device& d) {
    Json j = DevHead(i, d);
    j["node_type"] = "ca";
    j["fw"] = engine::kFirmwareVersion;
    j["node_guid"] = Guid(engine::node_guid(d.port()));
    j["sys_image_guid"] = Guid(engine::node_guid(d.port()));
    j["workers"] = d.workers();
    out.push_back(std::move(j));
  });
  return out;
}

Json Links(Host& host, const Filter& f) {
  Json out = Json::array();
  ForEachDevice(host, f, [&](size_t i, const engine::Device& d) {
    const engine::PortInfo& p = d.port();
    Json j = DevHead(i, d);
    j["port"] = 1;
    j["state"] = d.dead() ? "DOWN" : d.port_active() ? "ACTIVE" : "DOWN";
    j["physical_state"] = d.dead() ? "DISABLED" : d.port_active() ? "LINK_UP" : "POLLING";
    j["link_layer"] = "Ethernet";
    j["mac"] = Mac(p.mac);
    j["ip"] = absl::StrCat(Ip4(p.ip), "/", p.prefix_len);
    Json gids = Json::array();
    for (unsigned g = 0; g < p.gid_count && g < 2; ++g) gids.push_back(Gid(p.gids[g]));
    j["gids"] = std::move(gids);
    j["active_mtu"] = MtuBytes(p.active_mtu);
    j["link_mtu"] = p.link_mtu;
    j["dead"] = d.dead();
    out.push_back(std::move(j));
  });
  return out;
}

int32_t Owner(const Owners& o, const absl::flat_hash_map<uint32_t, int32_t>& by, uint32_t key) {
  auto it = by.find(key);
  return it != by.end() ? it->second : o.fallback;
}

void AddPid(Json& j, int32_t pid, absl::flat_hash_map<int32_t, std::string>& comms) {
  if (pid <= 0) return;
  j["pid"] = pid;
  auto [it, fresh] = comms.try_emplace(pid);
  if (fresh) it->second = CommOf(pid);
  j["comm"] = it->second;
}

absl::StatusOr<Json> Res(Host& host, const Json& req, const Filter& f) {
  std::string kind = "summary";
  if (auto it = req.find("kind"); it != req.end()) {
    if (!it->is_string()) return Bad("'kind' must be qp, cq, mr or pd");
    kind = it->get<std::string>();
  }
  if (kind != "summary" && kind != "qp" && kind != "cq" && kind != "mr" && kind != "pd") {
    return Bad(absl::StrCat("unknown resource '", kind, "' (qp, cq, mr or pd)"));
  }
  Json out = Json::array();
  absl::flat_hash_map<int32_t, std::string> comms;
  ForEachDevice(host, f, [&](size_t i, engine::Device& d) {
    const engine::Device::Resources r = d.ReadResources();
    const Owners o = host.OwnersOf(i);
    auto keep = [&](int32_t pid) { return f.pid < 0 || pid == f.pid; };
    if (kind == "summary") {
      Json j = DevHead(i, d);
      j["pd"] = r.pds.size();
      j["cq"] = r.cqs.size();
      j["qp"] = r.qps.size();
      j["mr"] = r.mrs.size();
      out.push_back(std::move(j));
      return;
    }
    if (kind == "qp") {
      for (const auto& q : r.qps) {
        auto it = o.qp_tag.find(q.owner);
        const int32_t pid = it != o.qp_tag.end() ? it->second : o.fallback;
        if (!keep(pid) || (f.qpn >= 0 && q.qpn != f.qpn)) continue;
        Json j = DevHead(i, d);
        j["port"] = 1;
        j["lqpn"] = q.qpn;
        if (q.type != transport::QpType::kUd) j["rqpn"] = q.dest_qpn;
        j["type"] = QpTypeName(q.type);
        j["state"] = QpStateName(q.state);
        j["rq-psn"] = q.rq_psn;
        j["sq-psn"] = q.sq_psn;
        j["path-mig-state"] = "MIGRATED";
        j["pdn"] = q.pd;
        j["send-cqn"] = q.send_cq;
        j["recv-cqn"] = q.recv_cq;
        if (q.srq != 0) j["srqn"] = q.srq;
        j["mtu"] = MtuBytes(q.path_mtu);
        if (q.retrans != transport::Qp::RetransTimer::kNone) {
          j["retrans"] = RetransName(q.retrans);
          j["rto-us"] = q.rto_ns / 1000;
          if (q.srtt_ns != 0) j["srtt-us"] = q.srtt_ns / 1000;
        }
        AddPid(j, pid, comms);
        out.push_back(std::move(j));
      }
    } else if (kind == "cq") {
      for (const auto& c : r.cqs) {
        const int32_t pid = Owner(o, o.cq, c.id);
        if (!keep(pid)) continue;
        Json j = DevHead(i, d);
        j["cqn"] = c.id;
        j["cqe"] = c.entries;
        j["users"] = c.users;
        AddPid(j, pid, comms);
        out.push_back(std::move(j));
      }
    } else if (kind == "mr") {
      for (const auto& m : r.mrs) {
        const int32_t pid = Owner(o, o.mr, m.key);
        if (!keep(pid)) continue;
        Json j = DevHead(i, d);
        j["mrn"] = m.key >> 8;
        j["rkey"] = absl::StrFormat("0x%x", m.key);
        j["lkey"] = absl::StrFormat("0x%x", m.key);
        j["mrlen"] = m.length;
        j["pdn"] = m.pd;
        AddPid(j, pid, comms);
        out.push_back(std::move(j));
      }
    } else {
      for (const auto& p : r.pds) {
        const int32_t pid = Owner(o, o.pd, p.id);
        if (!keep(pid)) continue;
        Json j = DevHead(i, d);
        j["pdn"] = p.id;
        j["users"] = p.users;
        AddPid(j, pid, comms);
        out.push_back(std::move(j));
      }
    }
  });
  return out;
}

void AddCounters(Json& j, const Counters& c) {
  for (const CounterInfo& i : kCounterInfo) j[i.name] = c.*i.field;
}

// The link's own counters (the PMD's), as link_<name>; none where the port
// has none.
void AddLinkStats(Json& j, const engine::Device& d) {
  io::DpdkPort::Stats s;
  if (!d.ReadLinkStats(&s)) return;
  for (const auto& f : io::DpdkPort::kStatFields) j[absl::StrCat("link_", f.name)] = s.*f.field;
}

Json Stats(Host& host, const Filter& f, bool qps) {
  Json out = Json::array();
  absl::flat_hash_map<int32_t, std::string> comms;
  ForEachDevice(host, f, [&](size_t i, engine::Device& d) {
    if (!qps) {
      Json j = DevHead(i, d);
      j["port"] = 1;
      AddCounters(j, d.PeekCounters());
      AddLinkStats(j, d);
      out.push_back(std::move(j));
      return;
    }
    const Owners o = host.OwnersOf(i);
    d.PeekQpCounters([&](uint32_t qpn, uint64_t owner, const QpCounters& c) {
      auto it = o.qp_tag.find(owner);
      const int32_t pid = it != o.qp_tag.end() ? it->second : o.fallback;
      if ((f.qpn >= 0 && qpn != f.qpn) || (f.pid >= 0 && pid != f.pid)) return;
      Json j = DevHead(i, d);
      j["port"] = 1;
      j["lqpn"] = qpn;
      AddPid(j, pid, comms);
      for (size_t k = 0; k < kNumQpCounters; ++k) j[kQpCounterInfo[k].name] = c.values[k];
      out.push_back(std::move(j));
    });
  });
  // Post-to-completion latency percentiles (µs), for QPs that measure them.
  if (qps) {
    ForEachDevice(host, f, [&](size_t i, engine::Device& d) {
      absl::flat_hash_map<uint32_t, Json> lat;
      d.PeekQpLatency([&](uint32_t qpn, int cls, const lab::LatencyHistogram& h) {
        if (h.count() == 0) return;
        Json l;
        l["count"] = h.count();
        l["mean_us"] = h.mean() / 1e3;
        for (double p : {50.0, 90.0, 99.0, 99.9, 99.99}) l[absl::StrCat("p", p, "_us")] = h.Percentile(p) / 1e3;
        l["max_us"] = static_cast<double>(h.max()) / 1e3;
        lat[qpn][transport::Qp::latency_class_name(cls)] = std::move(l);
      });
      for (Json& row : out) {
        if (row["ifindex"].get<size_t>() != i) continue;
        if (auto it = lat.find(row["lqpn"].get<uint32_t>()); it != lat.end()) row["latency"] = it->second;
      }
    });
  }
  // Sorted by QPN within a device, as `res show qp` lists them.
  if (qps) {
    std::stable_sort(out.begin(), out.end(), [](const Json& a, const Json& b) {
      return std::pair(a["ifindex"].get<int>(), a["lqpn"].get<uint32_t>()) <
             std::pair(b["ifindex"].get<int>(), b["lqpn"].get<uint32_t>());
    });
  }
  return out;
}

Json Clients(Host& host, const Filter& f) {
  Json out = Json::array();
  for (const ClientInfo& c : host.Clients()) {
    if (f.pid >= 0 && c.pid != f.pid) continue;
    Json j;
    j["pid"] = c.pid;
    j["comm"] = c.comm;
    j["uid"] = c.uid;
    j["qp"] = c.qps;
    j["cq"] = c.cqs;
    j["mr"] = c.mrs;
    j["pd"] = c.pds;
    j["mr_bytes"] = c.mr_bytes;
    out.push_back(std::move(j));
  }
  return out;
}

// Prometheus label values escape \, " and newline.
std::string Label(const std::string& v) {
  std::string s;
  for (char c : v) {
    if (c == '\\' || c == '"') s += '\\';
    if (c == '\n') {
      s += "\\n";
      continue;
    }
    s += c;
  }
  return s;
}

}  // namespace

std::string CommOf(int32_t pid) {
  std::ifstream f(absl::StrCat("/proc/", pid, "/comm"));
  std::string s;
  std::getline(f, s);
  return s;
}

Json CaptureRow(size_t index, const engine::Device& d, const std::optional<lab::CaptureStatus>& st, bool stopped) {
  Json j = DevHead(index, d);
  if (!st) {
    j["state"] = "off";
    return j;
  }
  j["state"] = stopped ? "stopped" : st->ended ? "ended" : "running";
  j["options"] = st->text;
  j["file"] = st->file;
  j["frames"] = st->frames;
  j["bytes"] = st->bytes;
  j["files"] = st->files_done;
  if (st->ended) j["why"] = st->why;
  return j;
}

Json TraceRow(size_t index, const engine::Device& d, const std::optional<lab::TraceStatus>& st, bool stopped) {
  Json j = DevHead(index, d);
  if (!st) {
    j["state"] = "off";
    return j;
  }
  j["state"] = stopped ? "stopped" : st->failed ? "failed" : "running";
  j["options"] = st->text;
  j["events"] = st->events;
  j["written"] = st->events_written;
  j["dropped"] = st->dropped;
  j["bytes"] = st->bytes;
  return j;
}

// What `capture` and `trace` share: `start SPEC`, `stop` and `show` of one
// Device facility per device, with its own spec parser, state row and
// words for the messages.
template <typename Options, typename State>
struct LabFacility {
  const char* name;       // "capture", "trace"
  const char* spec_hint;  // "PATH[,size=N,...]"
  absl::StatusOr<Options> (*parse)(std::string_view);
  Json (*row)(size_t, const engine::Device&, const std::optional<State>&, bool);
  absl::Status (engine::Device::*start)(const Options&);
  absl::StatusOr<State> (engine::Device::*stop)();
  std::optional<State> (engine::Device::*state)();
};

template <typename Options, typename State>
absl::StatusOr<Json> LabCmd(const LabFacility<Options, State>& l, Host& host, const Json& req, const Filter& f,
                            uint32_t uid) {
  const std::string action = req.contains("action") && req["action"].is_string() ? req["action"].get<std::string>()
                                                                                  : "show";
  Json out = Json::array();
  if (action == "show") {
    ForEachDevice(host, f, [&](size_t i, engine::Device& d) { out.push_back(l.row(i, d, (d.*l.state)(), false)); });
    return out;
  }
  if (action == "stop") {
    ForEachDevice(host, f, [&](size_t i, engine::Device& d) {
      absl::StatusOr<State> st = (d.*l.stop)();
      if (st.ok()) out.push_back(l.row(i, d, *st, /*stopped=*/true));
    });
    if (out.empty()) {
      return absl::NotFoundError(f.dev.empty() ? absl::StrCat("no ", l.name, " is on")
                                               : absl::StrCat("no ", l.name, " on ", f.dev));
    }
    return out;
  }
  if (action != "start") return Bad(absl::StrCat("unknown ", l.name, " action '", action, "' (start, stop, show)"));
  // The engine writes the file with its own rights: only its user (or
  // root) may name one.
  if (uid != 0 && uid != geteuid()) {
    return absl::PermissionDeniedError(
        absl::StrCat("a ", l.name, " writes files as the engine's user: only that user or root may start one"));
  }
  if (!req.contains("spec") || !req["spec"].is_string()) {
    return Bad(absl::StrCat("'", l.name, " start' needs a 'spec' (", l.spec_hint, ")"));
  }
  absl::StatusOr<Options> o = l.parse(req["spec"].get<std::string>());
  if (!o.ok()) return Bad(std::string(o.status().message()));
  if (o->path.empty() || o->path[0] != '/') return Bad(absl::StrCat("the ", l.name, " file must be an absolute path"));
  absl::Status err = absl::OkStatus();
  ForEachDevice(host, f, [&](size_t i, engine::Device& d) {
    if (!err.ok()) return;
    Options mine = *o;
    // One path for several devices: each its own file, as DROCE_CAPTURE
    // and DROCE_TRACE do.
    if (f.dev.empty() && i > 0) mine.path = lab::DevicePath(mine.path, d.port().name);
    err = (d.*l.start)(mine);
    if (err.ok()) out.push_back(l.row(i, d, (d.*l.state)(), false));
  });
  if (!err.ok()) return err;
  return out;
}

const LabFacility<lab::CaptureOptions, lab::CaptureStatus> kCapture = {
    "capture", "PATH[,size=N,...]", &lab::ParseCaptureSpec, &CaptureRow,
    &engine::Device::StartCapture, &engine::Device::StopCapture, &engine::Device::CaptureState};
const LabFacility<lab::TraceOptions, lab::TraceStatus> kTrace = {
    "trace", "PATH[,format=...]", &lab::ParseTraceSpec, &TraceRow,
    &engine::Device::StartTrace, &engine::Device::StopTrace, &engine::Device::TraceState};

// `fault show|set|clear`: the fault rules of live links (lab/fault_rules.h).
absl::StatusOr<Json> FaultCmd(Host& host, const Json& req, const Filter& f, uint32_t uid) {
  const std::string action = req.contains("action") && req["action"].is_string() ? req["action"].get<std::string>()
                                                                                  : "show";
  if (action == "set" || action == "clear") {
    // Rules change every client's traffic: the engine's user or root.
    if (uid != 0 && uid != geteuid()) {
      return absl::PermissionDeniedError("fault rules change every client's traffic: only the engine's user or root may set them");
    }
    std::vector<lab::FaultRule> rules;
    if (action == "set") {
      if (!req.contains("rules") || !req["rules"].is_string() || req["rules"].get<std::string>().empty()) {
        return Bad("'fault set' needs the rules ('fault clear' removes them)");
      }
      absl::StatusOr<std::vector<lab::FaultRule>> r = lab::ParseFaultRules(req["rules"].get<std::string>());
      if (!r.ok()) return Bad(std::string(r.status().message()));
      rules = *std::move(r);
    }
    ForEachDevice(host, f, [&](size_t, engine::Device& d) { d.SetFaultRules(rules); });
  } else if (action != "show") {
    return Bad(absl::StrCat("unknown fault action '", action, "' (show, set, clear)"));
  }
  Json out = Json::array();
  ForEachDevice(host, f, [&](size_t i, engine::Device& d) {
    const std::vector<engine::RuleTotals> rules = d.FaultRules();
    if (rules.empty()) {
      Json j = DevHead(i, d);
      j["rules"] = 0;
      out.push_back(std::move(j));
    }
    for (size_t r = 0; r < rules.size(); ++r) {
      Json j = DevHead(i, d);
      j["rule"] = r + 1;
      j["text"] = rules[r].text;
      for (const lab::RuleCounterField& c : lab::kRuleCounterFields) j[c.name] = rules[r].counters.*c.field;
      out.push_back(std::move(j));
    }
  });
  return out;
}

// `cc show|set`: congestion control (cc/dcqcn.h) of the devices (their
// defaults for new QPs, and every QP) or of one QP, with each QP's DCQCN
// state. `set` takes "mode" (dcqcn, off) and/or "params" (DROCE_DCQCN's
// list, over the current values).
absl::StatusOr<Json> CcCmd(Host& host, const Json& req, const Filter& f, uint32_t uid) {
  const std::string action = req.contains("action") && req["action"].is_string() ? req["action"].get<std::string>()
                                                                                  : "show";
  if (action == "set") {
    if (uid != 0 && uid != geteuid()) {
      return absl::PermissionDeniedError("congestion control changes every client's traffic: only the engine's user or root may set it");
    }
    const std::string mode = req.contains("mode") && req["mode"].is_string() ? req["mode"].get<std::string>() : "";
    const std::string params = req.contains("params") && req["params"].is_string() ? req["params"].get<std::string>() : "";
    if (mode.empty() && params.empty()) return Bad("'cc set' needs dcqcn, off and/or NAME=VALUE,... (docs/LAB.md)");
    if (!mode.empty() && mode != "dcqcn" && mode != "off") return Bad(absl::StrCat("'", mode, "' is not dcqcn or off"));
    absl::Status err = absl::OkStatus();
    bool any = false;
    ForEachDevice(host, f, [&](size_t, engine::Device& d) {
      if (!err.ok()) return;
      const std::vector<engine::Device::CcRow> rows = d.CongestionControl();
      const engine::Device::CcRow* base = &rows[0];
      if (f.qpn >= 0) {
        base = nullptr;
        for (const auto& r : rows) {
          if (r.qpn != 0 && r.qpn == f.qpn) base = &r;
        }
        if (base == nullptr) return;  // not on this device
      }
      cc::DcqcnParams p = base->params;
      if (absl::Status s = cc::ParseDcqcnParams(params, &p); !s.ok()) {
        err = Bad(std::string(s.message()));
        return;
      }
      const cc::CcMode m = mode.empty() ? base->mode : mode == "off" ? cc::CcMode::kOff : cc::CcMode::kDcqcn;
      err = d.SetCongestionControl(f.qpn >= 0 ? static_cast<uint32_t>(f.qpn) : 0, m, p);
      any = true;
    });
    if (!err.ok()) return err;
    if (!any) return absl::NotFoundError(absl::StrCat("no QP ", f.qpn));
  } else if (action != "show") {
    return Bad(absl::StrCat("unknown cc action '", action, "' (show, set)"));
  }
  Json out = Json::array();
  ForEachDevice(host, f, [&](size_t i, engine::Device& d) {
    for (const engine::Device::CcRow& r : d.CongestionControl()) {
      if (f.qpn >= 0 && r.qpn != f.qpn) continue;
      Json j = DevHead(i, d);
      if (r.qpn != 0) j["lqpn"] = r.qpn;
      j["cc"] = r.mode == cc::CcMode::kOff ? "off" : "dcqcn";
      if (r.qpn != 0) {
        j["limited"] = r.limited;
        // Rounded for reading: 0.1 Mb/s, alpha to 1e-6.
        j["rate_mbps"] = std::round(r.rate_mbps * 10) / 10;
        j["target_mbps"] = std::round(r.target_mbps * 10) / 10;
        j["alpha"] = std::round(r.alpha * 1e6) / 1e6;
        j["cuts"] = r.cuts;
        j["increases"] = r.increases;
      } else {
        j["dcqcn"] = cc::FormatDcqcnParams(r.params);
      }
      out.push_back(std::move(j));
    }
  });
  return out;
}

absl::StatusOr<Json> Query(Host& host, const Json& req, uint32_t uid) {
  if (!req.is_object()) return Bad("a request is a JSON object");
  auto cmd_it = req.find("cmd");
  if (cmd_it == req.end() || !cmd_it->is_string()) return Bad("no 'cmd'");
  const std::string cmd = cmd_it->get<std::string>();
  auto f = FilterOf(req, host);
  if (!f.ok()) return f.status();
  if (cmd == "dev") return Devs(host, *f);
  if (cmd == "link") return Links(host, *f);
  if (cmd == "res") return Res(host, req, *f);
  if (cmd == "stat") {
    const bool qps = req.contains("qpn") || (req.contains("kind") && req["kind"] == "qp");
    Json out = Stats(host, *f, qps);
    if (!qps && f->dev.empty()) {
      // Host-wide counters (droced's) as an entry of their own.
      Json h;
      host.AddHostStats(&h);
      if (!h.empty()) {
        h["ifname"] = "host";
        out.push_back(std::move(h));
      }
    }
    return out;
  }
  if (cmd == "client") return Clients(host, *f);
  if (cmd == "kill") {
    if (f->pid <= 0) return Bad("'kill' needs a 'pid'");
    absl::Status s = host.Kill(static_cast<int32_t>(f->pid), uid);
    if (!s.ok()) return s;
    return Json::object({{"killed", f->pid}});
  }
  if (cmd == "metrics") return Json(PrometheusText(host));
  if (cmd == "capture") return LabCmd(kCapture, host, req, *f, uid);
  if (cmd == "fault") return FaultCmd(host, req, *f, uid);
  if (cmd == "cc") return CcCmd(host, req, *f, uid);
  if (cmd == "trace") return LabCmd(kTrace, host, req, *f, uid);
  return Bad(absl::StrCat("unknown command '", cmd, "'"));
}

std::string PrometheusText(Host& host) {
  std::string out;
  auto devs = host.Devices();
  std::vector<Counters> dev_counters;
  for (engine::Device* d : devs) dev_counters.push_back(d->PeekCounters());
  for (const CounterInfo& i : kCounterInfo) {
    absl::StrAppend(&out, "# HELP droce_", i.name, "_total ", i.description, "\n# TYPE droce_", i.name,
                    "_total counter\n");
    for (size_t k = 0; k < devs.size(); ++k) {
      absl::StrAppend(&out, "droce_", i.name, "_total{device=\"", Label(devs[k]->port().name), "\",port=\"1\"} ",
                      dev_counters[k].*i.field, "\n");
    }
  }
  // The link's own counters (the PMD's rte_eth_stats).
  std::vector<io::DpdkPort::Stats> link(devs.size());
  std::vector<bool> has_link(devs.size());
  for (size_t k = 0; k < devs.size(); ++k) has_link[k] = devs[k]->ReadLinkStats(&link[k]);
  for (const auto& f : io::DpdkPort::kStatFields) {
    absl::StrAppend(&out, "# HELP droce_link_", f.name, "_total ", f.help, "\n# TYPE droce_link_", f.name,
                    "_total counter\n");
    for (size_t k = 0; k < devs.size(); ++k) {
      if (!has_link[k]) continue;
      absl::StrAppend(&out, "droce_link_", f.name, "_total{device=\"", Label(devs[k]->port().name),
                      "\",port=\"1\"} ", link[k].*f.field, "\n");
    }
  }
  // The fault rules' counters (DROCE_FAULT, droce ctl fault): a series per
  // rule, labelled with its number and text; nothing without rules.
  std::vector<std::vector<engine::RuleTotals>> rules_of;
  bool any_rule = false;
  for (engine::Device* d : devs) {
    rules_of.push_back(d->HasFaultRules() ? d->FaultRules() : std::vector<engine::RuleTotals>{});
    any_rule |= !rules_of.back().empty();
  }
  if (any_rule) {
    for (const lab::RuleCounterField& c : lab::kRuleCounterFields) {
      absl::StrAppend(&out, "# HELP droce_fault_rule_", c.name, "_total ", c.help, "\n# TYPE droce_fault_rule_",
                      c.name, "_total counter\n");
      for (size_t k = 0; k < devs.size(); ++k) {
        for (size_t r = 0; r < rules_of[k].size(); ++r) {
          absl::StrAppend(&out, "droce_fault_rule_", c.name, "_total{device=\"", Label(devs[k]->port().name),
                          "\",rule=\"", r + 1, "\",text=\"", Label(rules_of[k][r].text), "\"} ",
                          rules_of[k][r].counters.*c.field, "\n");
        }
      }
    }
  }
  absl::StrAppend(&out, "# HELP droce_port_active Whether the port is ACTIVE (1) or DOWN (0)\n",
                  "# TYPE droce_port_active gauge\n");
  for (engine::Device* d : devs) {
    absl::StrAppend(&out, "droce_port_active{device=\"", Label(d->port().name), "\",port=\"1\"} ",
                    d->port_active() && !d->dead() ? 1 : 0, "\n");
  }
  // Per QP: one family per counter, a series per QP.
  struct QpRow {
    std::string labels;
    QpCounters c;
  };
  std::vector<QpRow> rows;
  absl::flat_hash_map<int32_t, std::string> comms;
  std::vector<size_t> qps_of(devs.size(), 0);
  for (size_t k = 0; k < devs.size(); ++k) {
    const Owners o = host.OwnersOf(k);
    devs[k]->PeekQpCounters([&](uint32_t qpn, uint64_t owner, const QpCounters& c) {
      ++qps_of[k];
      auto it = o.qp_tag.find(owner);
      const int32_t pid = it != o.qp_tag.end() ? it->second : o.fallback;
      rows.push_back({absl::StrCat("device=\"", Label(devs[k]->port().name), "\",qpn=\"", qpn, "\",pid=\"", pid,
                                   "\""),
                      c});
    });
  }
  absl::StrAppend(&out, "# HELP droce_qps Queue pairs of the device\n# TYPE droce_qps gauge\n");
  for (size_t k = 0; k < devs.size(); ++k) {
    absl::StrAppend(&out, "droce_qps{device=\"", Label(devs[k]->port().name), "\"} ", qps_of[k], "\n");
  }
  for (size_t i = 0; i < kNumQpCounters; ++i) {
    absl::StrAppend(&out, "# HELP droce_qp_", kQpCounterInfo[i].name, "_total ", kQpCounterInfo[i].description,
                    " (this QP)\n# TYPE droce_qp_", kQpCounterInfo[i].name, "_total counter\n");
    for (const QpRow& r : rows) {
      absl::StrAppend(&out, "droce_qp_", kQpCounterInfo[i].name, "_total{", r.labels, "} ", r.c.values[i], "\n");
    }
  }
  Json h;
  host.AddHostStats(&h);
  // The host's (droced's): what is live now is a gauge, the rest counts.
  for (auto& [name, v] : h.items()) {
    if (!v.is_number_unsigned() && !v.is_number_integer()) continue;
    const bool gauge = name.ends_with("_live") || name == "cm_ids";
    const std::string metric = absl::StrCat("droced_", name, gauge ? "" : "_total");
    absl::StrAppend(&out, "# TYPE ", metric, gauge ? " gauge\n" : " counter\n", metric, " ", v.dump(), "\n");
  }
  return out;
}

bool AnswerAdmin(Host& host, int sock, uint32_t seq, const uint8_t* msg, size_t len, uint32_t uid) {
  // Questions are answered on CPU time the datapath does not want.
  MakeThreadBackground();
  ctl::Header h;
  std::memcpy(&h, msg, sizeof(h));
  ctl::AdminReq req;
  std::memcpy(&req, msg + sizeof(h), sizeof(req));
  (void)len;
  struct {
    ctl::Reply r;
    ctl::AdminRep a;
  } rep{};
  rep.r.h = {ctl::kMagic, static_cast<uint16_t>(ctl::kAdmin | ctl::kReplyBit), h.dev, seq, sizeof(rep)};
  Json parsed = Json::parse(std::string_view(req.json, req.len), nullptr, /*allow_exceptions=*/false);
  absl::StatusOr<Json> answer = parsed.is_discarded() ? Bad("the request is not JSON") : Query(host, parsed, uid);
  Json doc = answer.ok() ? Json{{"ok", true}, {"result", *answer}}
                         : Json{{"ok", false},
                                {"error", std::string(answer.status().message())},
                                {"code", absl::StatusCodeToString(answer.status().code())}};
  std::string text = doc.dump(-1, ' ', false, Json::error_handler_t::replace);
  auto shm = queue::ShmRegion::Create("droce-admin", text.size() + 1);
  if (!shm.ok()) {
    rep.r.err = ENOMEM;
    return ctl::SendMsg(sock, &rep, sizeof(rep), nullptr, 0) == static_cast<ssize_t>(sizeof(rep));
  }
  std::memcpy(shm->data(), text.data(), text.size());
  rep.a.len = text.size();
  const int fd = shm->fd();
  return ctl::SendMsg(sock, &rep, sizeof(rep), &fd, 1) == static_cast<ssize_t>(sizeof(rep));
}

}  // namespace droce::admin
