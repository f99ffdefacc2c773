// The connection manager's id layer (manager.h): ids, port spaces, bind,
// address and route resolution, listen, options, multicast joins, QP
// attributes and events, and the half of each request's handling that
// finds its listener and makes its id. The IB CM protocol it sends and
// receives through is IbCm (ib_cm.cc).
#include "cm/manager.h"

#include <infiniband/verbs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace droce::cm {

namespace {
using cma::kHopLimit;
using cma::kPacketLifeTime;
constexpr size_t kMaxPendingPerListener = 4096;  // REQs not yet accepted or rejected
constexpr uint64_t kAddrPollNs = 1'000'000;      // while waiting for ARP/ND
constexpr uint64_t kMs = 1'000'000;

// The IP CM header's 16-byte form of an address (IPv4: 12 zero bytes first).
Gid header_form(const IpAddr& a) {
  Gid g = a.ip;
  if (!a.v6) std::memset(g.data(), 0, 12);
  return g;
}
IpAddr from_header(const Gid& g, bool v6, uint16_t port) {
  IpAddr a;
  a.v6 = v6;
  a.ip = g;
  a.port = port;
  if (!v6) {
    std::memset(a.ip.data(), 0, 10);
    a.ip[10] = a.ip[11] = 0xFF;
  }
  return a;
}
}  // namespace

// rdma_cm's part of an id; where its MADs go and the connection are the
// IB CM's Conn.
struct Manager::Id : Conn {
  uint32_t handle = 0;
  uint16_t ps = kRdmaPsTcp;
  IpAddr src, dst;
  bool bound = false;   // in bound_ (not conn ids made from a REQ)
  bool have_src = false, have_dst = false;
  bool route = false;   // route resolved (num_paths 1)
  size_t pending = 0;   // a listener's conn ids still in kReqRcvd
  // Options.
  bool reuseaddr = false, afonly = false;
  uint64_t addr_deadline = 0;
  std::vector<uint32_t> mcasts;
};

bool IpAddr::any() const {
  if (!v6) return ip[12] == 0 && ip[13] == 0 && ip[14] == 0 && ip[15] == 0;
  for (uint8_t b : ip) {
    if (b != 0) return false;
  }
  return true;
}

bool IpAddr::loopback() const {
  if (!v6) return ip[12] == 127;
  static constexpr uint8_t kOne[16] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1};
  return std::memcmp(ip.data(), kOne, 16) == 0;
}

Gid ipv4_gid(uint32_t ip) {
  Gid g{};
  g[10] = g[11] = 0xFF;
  g[12] = static_cast<uint8_t>(ip >> 24);
  g[13] = static_cast<uint8_t>(ip >> 16);
  g[14] = static_cast<uint8_t>(ip >> 8);
  g[15] = static_cast<uint8_t>(ip);
  return g;
}

bool from_sockaddr(const sockaddr* sa, size_t len, IpAddr* out) {
  if (sa == nullptr || len < sizeof(sa_family_t)) return false;
  if (sa->sa_family == AF_INET && len >= sizeof(sockaddr_in)) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    *out = IpAddr{};
    out->ip = ipv4_gid(ntohl(in->sin_addr.s_addr));
    out->port = ntohs(in->sin_port);
    return true;
  }
  if (sa->sa_family == AF_INET6 && len >= sizeof(sockaddr_in6)) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    *out = IpAddr{};
    std::memcpy(out->ip.data(), &in6->sin6_addr, 16);
    out->port = ntohs(in6->sin6_port);
    // An IPv4-mapped IPv6 address (getaddrinfo's AI_V4MAPPED) is the IPv4
    // address: the same GID, the same port.
    static constexpr uint8_t kMapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xFF, 0xFF};
    out->v6 = std::memcmp(out->ip.data(), kMapped, 12) != 0;
    return true;
  }
  return false;
}

void to_sockaddr(const IpAddr& a, sockaddr_in6* out) {
  std::memset(out, 0, sizeof(*out));
  if (a.v6) {
    out->sin6_family = AF_INET6;
    out->sin6_port = htons(a.port);
    std::memcpy(&out->sin6_addr, a.ip.data(), 16);
    return;
  }
  auto* in = reinterpret_cast<sockaddr_in*>(out);
  in->sin_family = AF_INET;
  in->sin_port = htons(a.port);
  std::memcpy(&in->sin_addr, a.ip.data() + 12, 4);
}

Manager::Manager(EventFn events, Clock clock, uint64_t seed)
    : events_(std::move(events)), clock_(std::move(clock)), rng_(seed) {}

Manager::~Manager() = default;

void Manager::AddPort(const LocalPort& port, PortIo* io) { ports_.push_back({port, io}); }

void Manager::RemovePort(int dev) {
  for (auto& [h, id] : ids_) {
    if (id->dev == dev && id->state != St::kDisconnected) {
      IbCm::DropTimer(id.get());
      Emit(*id, kDeviceRemoval, 0);
    }
  }
  std::erase_if(ports_, [dev](const Port& p) { return p.info.dev == dev; });
  cm_.RemovePort(dev);
}

Manager::Id* Manager::Find(uint32_t id) const {
  auto it = ids_.find(id);
  return it == ids_.end() ? nullptr : it->second.get();
}

Manager::Port* Manager::PortOf(int dev) {
  for (auto& p : ports_) {
    if (p.info.dev == dev) return &p;
  }
  return nullptr;
}
const Manager::Port* Manager::PortOf(int dev) const { return const_cast<Manager*>(this)->PortOf(dev); }

// The port that owns address `a` (a bind to it), or nullptr.
const Manager::Port* Manager::PortForSource(const IpAddr& a) const {
  for (const auto& p : ports_) {
    if (!a.v6 && a.ip == ipv4_gid(p.info.ip4)) return &p;
    if (a.v6 && p.info.has_ip6 && a.ip == p.info.ip6) return &p;
  }
  return nullptr;
}

// The port to reach `a` from: the one that owns it, the one whose subnet
// holds it, else the first port of the family (its gateway).
const Manager::Port* Manager::PortForDestination(const IpAddr& a) const {
  if (const Port* p = PortForSource(a)) return p;
  const Port* first = nullptr;
  for (const auto& p : ports_) {
    if (a.v6) {
      if (!p.info.has_ip6) continue;
      if (first == nullptr) first = &p;
      if (std::memcmp(a.ip.data(), p.info.ip6.data(), 8) == 0) return &p;
      continue;
    }
    if (first == nullptr) first = &p;
    const uint32_t dip = uint32_t{a.ip[12]} << 24 | uint32_t{a.ip[13]} << 16 | uint32_t{a.ip[14]} << 8 | a.ip[15];
    const uint32_t mask = p.info.prefix_len == 0 ? 0 : ~uint32_t{0} << (32 - p.info.prefix_len);
    if ((dip & mask) == (p.info.ip4 & mask)) return &p;
  }
  return first;
}

Gid Manager::PortGid(const Port& p, bool v6) const { return v6 ? p.info.ip6 : ipv4_gid(p.info.ip4); }

uint32_t Manager::NewHandle() {
  while (next_handle_ == 0 || ids_.contains(next_handle_) || mcasts_.contains(next_handle_)) ++next_handle_;
  return next_handle_++;
}

int Manager::CreateId(uint16_t ps, uint8_t qp_type, uint32_t* out) {
  if (ps != kRdmaPsTcp && ps != kRdmaPsUdp && ps != kRdmaPsIb && ps != kRdmaPsIpoib) return -EINVAL;
  if (qp_type != kQpRc && qp_type != kQpUd) return -EINVAL;
  auto id = std::make_unique<Id>();
  id->handle = NewHandle();
  id->ps = ps;
  id->qp_type = qp_type;
  *out = id->handle;
  ids_.emplace(id->handle, std::move(id));
  ++stats_.ids;
  return 0;
}

void Manager::Unbind(Id* id) {
  if (!id->bound) return;
  auto it = bound_.find({id->ps, id->src.port});
  if (it != bound_.end()) {
    std::erase(it->second, id->handle);
    if (it->second.empty()) bound_.erase(it);
  }
  id->bound = false;
}

int Manager::DestroyId(uint32_t handle) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  cm_.TellPeerGone(id);
  if (id->state == St::kReqRcvd && id->parent != 0) {
    if (Id* l = Find(id->parent)) --l->pending;
  }
  // A listener's children stay: each is the application's own id once its
  // CONNECT_REQUEST was delivered (the caller destroys undelivered ones).
  for (uint32_t mc : id->mcasts) mcasts_.erase(mc);
  Unbind(id);
  cm_.Release(*id);
  ids_.erase(handle);
  return 0;
}

void Manager::ProcessExit() {
  for (auto& [handle, id] : ids_) cm_.Abandon(id.get());
}

int Manager::BindPort(Id* id, const IpAddr& want) {
  IpAddr a = want;
  const Port* port = nullptr;
  // A loopback address binds no device yet, as a wildcard (rdma_cm gives
  // such an id a device only when it resolves or listens): libfabric's
  // verbs provider lists a device's addresses by binding each interface
  // address and keeping those that got one.
  if (!a.any() && !a.loopback()) {
    port = PortForSource(a);
    if (port == nullptr) return -EADDRNOTAVAIL;
  }
  auto conflicts = [&](uint16_t p) {
    auto it = bound_.find({id->ps, p});
    if (it == bound_.end()) return false;
    for (uint32_t other : it->second) {
      const Id* o = Find(other);
      if (o == nullptr || o == id) continue;
      const bool overlap = o->src.any() || a.any() || o->src.ip == a.ip;
      if (!overlap) continue;
      if (id->reuseaddr && o->reuseaddr && o->state != St::kListen) continue;
      return true;
    }
    return false;
  };
  if (a.port == 0) {
    // An ephemeral port from Linux's default range, as inet_get_local_port_range.
    std::uniform_int_distribution<int> pick(32768, 60999);
    int tries = 0;
    do {
      a.port = static_cast<uint16_t>(pick(rng_));
    } while (conflicts(a.port) && ++tries < 65536);
    if (tries >= 65536) return -EADDRNOTAVAIL;
  } else if (conflicts(a.port)) {
    return -EADDRINUSE;
  }
  Unbind(id);
  id->src = a;
  id->have_src = true;
  id->dev = port != nullptr ? port->info.dev : -1;
  if (port != nullptr) id->sgid = PortGid(*port, a.v6);
  id->bound = true;
  bound_[{id->ps, a.port}].push_back(id->handle);
  return 0;
}

int Manager::Bind(uint32_t handle, const IpAddr& addr) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  if (id->state != St::kIdle) return -EINVAL;
  const int rc = BindPort(id, addr);
  if (rc == 0) id->state = St::kAddrBound;
  return rc;
}

int Manager::ResolveAddr(uint32_t handle, const IpAddr* src, const IpAddr& dst_in, uint32_t timeout_ms) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  if (id->state != St::kIdle && id->state != St::kAddrBound && id->state != St::kAddrResolved) return -EINVAL;
  IpAddr dst = dst_in;
  if (dst.any()) return -EINVAL;
  const Port* port = nullptr;
  if (dst.loopback()) {
    // Loopback: the first port, to itself.
    if (ports_.empty()) return -ENODEV;
    port = &ports_.front();
    const uint16_t p = dst.port;
    dst.ip = PortGid(*port, dst.v6 && port->info.has_ip6);
    dst.v6 = dst.v6 && port->info.has_ip6;
    dst.port = p;
  }
  if (id->state == St::kIdle) {
    IpAddr s;
    if (src != nullptr && !src->any()) {
      s = *src;
    } else {
      if (port == nullptr) port = PortForDestination(dst);
      if (port == nullptr) return -ENODEV;
      s.v6 = dst.v6;
      s.ip = PortGid(*port, dst.v6);
      if (src != nullptr) s.port = src->port;
    }
    const int rc = BindPort(id, s);
    if (rc != 0) return rc;
  } else if (id->dev < 0) {
    // Bound to a wildcard: now to the port that reaches dst.
    if (port == nullptr) port = PortForDestination(dst);
    if (port == nullptr) return -ENODEV;
    id->dev = port->info.dev;
    id->sgid = PortGid(*port, dst.v6);
    id->src.ip = id->sgid;
    id->src.v6 = dst.v6;
  }
  if (id->src.v6 != dst.v6) return -EINVAL;
  id->dst = dst;
  id->have_dst = true;
  id->dgid = dst.ip;
  const bool multicast = dst.v6 ? dst.ip[0] == 0xFF : (dst.ip[12] & 0xF0) == 0xE0;
  if (multicast) {
    // A group address needs no neighbour: its MAC follows from it.
    id->state = St::kAddrResolved;
    Emit(*id, kAddrResolved, 0);
    return 0;
  }
  id->state = St::kAddrQuery;
  id->addr_deadline = clock_() + uint64_t{timeout_ms == 0 ? 2000u : timeout_ms} * kMs;
  id->deadline = std::max<uint64_t>(clock_(), 1);  // the first look now, in OnTimer (0: no timer)
  OnTimer();
  return 0;
}

int Manager::ResolveRoute(uint32_t handle, uint32_t) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  if (id->state != St::kAddrResolved && id->state != St::kRouteResolved) return -EINVAL;
  // RoCE has no SA: the route is the address vector itself.
  id->route = true;
  id->state = St::kRouteResolved;
  Emit(*id, kRouteResolved, 0);
  return 0;
}

int Manager::QueryRoute(uint32_t handle, RouteInfo* out) const {
  const Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  *out = RouteInfo{};
  const Port* port = PortOf(id->dev);
  out->dev = id->dev;
  if (port != nullptr) {
    out->node_guid = port->info.node_guid;
    out->mtu = port->info.active_mtu;
  }
  out->src = id->src;
  if (!id->have_src) out->src.v6 = false;
  out->dst = id->dst;
  if (!id->have_dst) {
    out->dst = IpAddr{};
    out->dst.v6 = id->src.v6;
  }
  out->sgid = id->sgid;
  out->dgid = id->dgid;
  out->num_paths = id->route ? 1 : 0;
  out->hop_limit = kHopLimit;
  out->traffic_class = id->tos;
  out->packet_life_time = kPacketLifeTime;
  return 0;
}

int Manager::Listen(uint32_t handle, int) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  if (id->state == St::kListen) {
    return 0;
  }
  if (id->state == St::kIdle) {
    IpAddr any;  // rdma_listen on an unbound id: the IPv4 wildcard, any port
    const int rc = BindPort(id, any);
    if (rc != 0) return rc;
  } else if (id->state != St::kAddrBound) {
    return -EINVAL;
  }
  id->state = St::kListen;  // the backlog: unused, as rdma_cm's over IB CM
  // A listener came: the requests held for want of one are handled again.
  cm_.ReplayEarly();
  return 0;
}

AhInfo Manager::AhTo(const Id& id, const Gid& dgid) const {
  AhInfo ah;
  ah.dgid = dgid;
  ah.sgid_index = id.src.v6 ? 1 : 0;  // droce's GID table: 0 IPv4-mapped, 1 IPv6
  ah.hop_limit = kHopLimit;
  ah.traffic_class = id.tos;
  ah.is_global = 1;
  ah.port_num = 1;
  return ah;
}

void Manager::Emit(const Id& id, uint32_t event, int32_t status, const ConnParam* p) {
  Event e;
  e.id = id.handle;
  e.event = event;
  e.status = status;
  e.ud = id.qp_type == kQpUd;
  if (p != nullptr) e.param = *p;
  events_(e);
}

int Manager::Connect(uint32_t handle, const ConnParam& p) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  if (id->state != St::kRouteResolved) return -EINVAL;
  const Port* port = PortOf(id->dev);
  if (port == nullptr) return -ENODEV;
  const size_t room = (id->qp_type == kQpUd ? kSidrReqPrivate : kReqPrivate) - kIpHeaderSize;
  if (p.private_data_len > room) return -EINVAL;
  IpHeader ih;
  ih.ip_version = id->src.v6 ? 6 : 4;
  ih.src_port = id->src.port;
  ih.src = header_form(id->src);
  ih.dst = header_form(id->dst);
  const uint16_t ps = id->ps == kRdmaPsIpoib ? kPsIpoib : id->ps;
  if (id->qp_type == kQpUd) {
    cm_.SendSidrReq(id, service_id(ps, id->dst.port), ih, p);
    return 0;
  }
  cm_.SendReq(id, port->info, service_id(ps, id->dst.port), ih, p);
  return 0;
}

int Manager::Accept(uint32_t handle, const ConnParam* p) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  if (p == nullptr) {
    // The active side, after CONNECT_RESPONSE: RTU.
    if (id->state != St::kRepRcvd) return -EINVAL;
    cm_.SendRtu(id);
    return 0;
  }
  const Port* port = PortOf(id->dev);
  if (port == nullptr) return -ENODEV;
  if (id->state == St::kSidrReqRcvd) {
    if (p->private_data_len > kSidrRepPrivate) return -EINVAL;
    cm_.SendSidrRep(id, service_id(id->ps == kRdmaPsIpoib ? kPsIpoib : id->ps, id->src.port), *p);
    if (Id* l = Find(id->parent)) --l->pending;
    return 0;
  }
  if (id->state != St::kReqRcvd) return -EINVAL;
  if (p->private_data_len > kRepPrivate) return -EINVAL;
  if (Id* l = Find(id->parent)) --l->pending;
  cm_.SendRep(id, port->info, *p);
  return 0;
}

int Manager::Reject(uint32_t handle, uint8_t reason, const uint8_t* data, uint8_t len) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  // Asked before the IB CM moves the id on: a REP already sent was counted
  // off its listener by the accept.
  Id* l = Find(id->parent);
  const bool settles = l != nullptr && id->state != St::kRepSent;
  if (id->state == St::kSidrReqRcvd) {
    cm_.RejectSidr(id, service_id(id->ps, id->src.port), data, len);
  } else if (id->state == St::kReqRcvd || id->state == St::kRepSent) {
    cm_.Reject(id, reason, data, len);
  } else {
    return -EINVAL;
  }
  if (settles) --l->pending;
  return 0;
}

int Manager::Disconnect(uint32_t handle) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  if (id->local_comm_id == 0) return -EINVAL;  // never connected: no CM id (as the kernel)
  // A DREQ when established. Otherwise there is nothing to send (DREQ
  // already out or answered, or the connection never got established): the
  // kernel returns 0 too.
  cm_.SendDreq(id);
  return 0;
}

int Manager::InitQpAttr(uint32_t handle, uint32_t state, QpAttr* a) const {
  const Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  if (id->dev < 0) return -EINVAL;
  *a = QpAttr{};
  a->qp_state = state;
  a->port_num = 1;
  a->pkey_index = 0;
  if (id->qp_type == kQpUd) {
    if (state != IBV_QPS_INIT && state != IBV_QPS_RTR && state != IBV_QPS_RTS) return -EINVAL;
    a->mask = IBV_QP_STATE;
    if (state == IBV_QPS_INIT) {
      a->mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY;
      a->qkey = kUdpQkey;
    } else if (state == IBV_QPS_RTS) {
      a->mask |= IBV_QP_SQ_PSN;
    }
    return 0;
  }
  // RC: the connection's, as the kernel's ib_cm_init_qp_attr.
  return IbCm::InitQpAttr(*id, state, AhTo(*id, id->dgid), a);
}

int Manager::Notify(uint32_t handle, uint32_t event) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  // IBV_EVENT_COMM_EST: traffic arrived before the RTU (ib_cm_notify).
  if (event == IBV_EVENT_COMM_EST) cm_.CommEstablished(id);
  return 0;
}

int Manager::SetOption(uint32_t handle, uint32_t level, uint32_t name, const void* value, size_t len) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  constexpr uint32_t kLevelId = 0, kLevelIb = 1;
  constexpr uint32_t kTos = 0, kReuseAddr = 1, kAfOnly = 2, kAckTimeout = 3, kIbPath = 1;
  if (level == kLevelId) {
    switch (name) {
      case kTos:
        if (len != 1) return -EINVAL;
        id->tos = *static_cast<const uint8_t*>(value);
        return 0;
      case kReuseAddr:
        if (len != sizeof(int)) return -EINVAL;
        if (id->state != St::kIdle) return -EINVAL;
        id->reuseaddr = *static_cast<const int*>(value) != 0;
        return 0;
      case kAfOnly:
        if (len != sizeof(int)) return -EINVAL;
        if (id->state != St::kIdle) return -EINVAL;
        id->afonly = *static_cast<const int*>(value) != 0;
        return 0;
      case kAckTimeout:
        if (len != 1) return -EINVAL;
        id->ack_timeout_opt = std::min<uint8_t>(31, *static_cast<const uint8_t*>(value));
        return 0;
      default:
        return -ENOSYS;
    }
  }
  if (level == kLevelIb && name == kIbPath) return -EINVAL;  // RoCE routes are not SA path records
  return -ENOSYS;
}

int Manager::JoinMulticast(uint32_t handle, const IpAddr& group, uint32_t* out) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  if (id->qp_type != kQpUd) return -EINVAL;
  if (id->dev < 0) return -EINVAL;  // rdma_cm needs a bound device (an address)
  // RoCE: the MGID is the group's IP address (IPv4-mapped for IPv4).
  const bool multicast = group.v6 ? group.ip[0] == 0xFF : (group.ip[12] & 0xF0) == 0xE0;
  if (!multicast) return -EINVAL;
  uint32_t mc = NewHandle();
  mcasts_[mc] = Mcast{id->handle, group.ip};
  id->mcasts.push_back(mc);
  *out = mc;
  Event e;
  e.id = id->handle;
  e.mc = mc;
  e.event = kMulticastJoin;
  e.ud = true;
  e.param.ah = AhTo(*id, group.ip);
  e.param.qp_num = kIbMulticastQpn;
  e.param.qkey = kUdpQkey;
  events_(e);
  return 0;
}

int Manager::LeaveMulticast(uint32_t mc, uint32_t* id_out) {
  auto it = mcasts_.find(mc);
  if (it == mcasts_.end()) return -ENOENT;
  *id_out = it->second.id;
  if (Id* id = Find(it->second.id)) std::erase(id->mcasts, mc);
  mcasts_.erase(it);
  return 0;
}

// ---------------------------------------------------------------------------
// MADs in: the IB CM handles them and asks the id layer for what is its.

void Manager::OnMad(int dev, const MadSource& src, std::span<const uint8_t> bytes) { cm_.OnMad(dev, src, bytes); }

PortIo* Manager::Io(int dev) {
  Port* port = PortOf(dev);
  return port == nullptr ? nullptr : port->io;
}

void Manager::ForEachConn(absl::FunctionRef<bool(Conn&)> fn) {
  for (auto& [handle, id] : ids_) {
    if (fn(*id)) return;
  }
}

void Manager::Deliver(const Conn& c, uint32_t event, int32_t status, const ConnParam* p) {
  Emit(static_cast<const Id&>(c), event, status, p);
}

void Manager::RequestSettled(const Conn& c) {
  if (Id* l = Find(c.parent)) --l->pending;
}

Manager::Id* Manager::FindListener(uint16_t ps, const IpAddr& dst, int dev) const {
  auto it = bound_.find({ps, dst.port});
  if (it == bound_.end()) return nullptr;
  Id* wildcard = nullptr;
  for (uint32_t h : it->second) {
    Id* l = Find(h);
    if (l == nullptr || l->state != St::kListen) continue;
    if (l->dev >= 0 && l->dev != dev) continue;
    if (!l->src.any() && !l->src.loopback() && !(l->src.ip == dst.ip)) continue;
    if (l->src.any()) {
      // An IPv6 wildcard takes IPv4 too unless AFONLY; an IPv4 one only IPv4.
      if (!l->src.v6 && dst.v6) continue;
      if (l->src.v6 && !dst.v6 && l->afonly) continue;
      wildcard = l;
      continue;
    }
    return l;
  }
  return wildcard;
}

// The id of a request a listener got (REQ or SIDR_REQ): bound where the
// request went, routed back to where it came from, with the listener's
// options.
Manager::Id* Manager::NewConnId(const Id& l, uint8_t qp_type, int dev, const MadSource& src, const IpAddr& dst,
                                const IpHeader& ih) {
  uint32_t handle;
  if (CreateId(l.ps, qp_type, &handle) != 0) return nullptr;
  Id* id = Find(handle);
  id->parent = l.handle;
  id->dev = dev;
  id->src = dst;
  id->src.ip = src.dgid;
  id->have_src = true;
  id->dst = from_header(ih.src, dst.v6, ih.src_port);
  id->dst.ip = src.sgid;  // reply to where it came from
  id->have_dst = true;
  id->route = true;
  id->sgid = src.dgid;
  id->dgid = src.sgid;
  id->tos = l.tos;
  id->ack_timeout_opt = l.ack_timeout_opt;
  return id;
}

void Manager::ReqReceived(int dev, const MadSource& src, const MadHeader& h, const Req& r, uint64_t held_until) {
  uint16_t ps = 0, port = 0;
  IpHeader ih;
  if (!parse_service_id(r.service_id, &ps, &port) || !decode_ip_header(r.private_data.data(), &ih)) {
    ++stats_.no_listener;
    cm_.RejectReq(dev, src, h, r.local_comm_id, kRejInvalidServiceId);
    return;
  }
  const bool v6 = ih.ip_version == 6;
  const IpAddr dst = from_header(ih.dst, v6, port);
  const uint16_t rdma_ps = ps == kPsIpoib ? kRdmaPsIpoib : ps;
  Id* l = FindListener(rdma_ps, dst, dev);
  if (l == nullptr && cm_.HoldEarly(dev, src, h, r, held_until)) return;
  if (l == nullptr || l->qp_type != kQpRc) {
    ++stats_.no_listener;
    cm_.RejectReq(dev, src, h, r.local_comm_id, kRejInvalidServiceId);
    return;
  }
  if (r.transport_type != 0) {
    cm_.RejectReq(dev, src, h, r.local_comm_id, kRejInvalidTransportType);
    return;
  }
  if (l->pending >= kMaxPendingPerListener) {
    ++stats_.flood_rejects;
    cm_.RejectReq(dev, src, h, r.local_comm_id, kRejNoResources);
    return;
  }
  const Port* p = PortOf(dev);
  if (p == nullptr) return;
  Id* id = NewConnId(*l, kQpRc, dev, src, dst, ih);
  if (id == nullptr) return;
  const uint32_t handle = id->handle;
  cm_.TakeReq(id, p->info, h, r);
  ++l->pending;
  Event e;
  e.id = handle;
  e.parent = l->handle;
  e.event = kConnectRequest;
  e.param.qp_num = r.local_qpn;
  e.param.responder_resources = id->responder_resources;
  e.param.initiator_depth = id->initiator_depth;
  e.param.flow_control = r.end_to_end_flow_control;
  e.param.retry_count = r.retry_count;
  e.param.rnr_retry_count = r.rnr_retry_count;
  e.param.srq = r.srq;
  e.param.private_data_len = static_cast<uint8_t>(kReqPrivate - kIpHeaderSize);
  std::memcpy(e.param.private_data, r.private_data.data() + kIpHeaderSize, kReqPrivate - kIpHeaderSize);
  events_(e);
}

void Manager::SidrReqReceived(int dev, const MadSource& src, const MadHeader& h, const SidrReq& m,
                              uint64_t held_until) {
  uint16_t ps = 0, port = 0;
  IpHeader ih;
  if (!parse_service_id(m.service_id, &ps, &port) || !decode_ip_header(m.private_data.data(), &ih)) {
    ++stats_.no_listener;
    cm_.RefuseSidrReq(dev, src, h, m, kSidrUnsupported);
    return;
  }
  const bool v6 = ih.ip_version == 6;
  const IpAddr dst = from_header(ih.dst, v6, port);
  Id* l = FindListener(ps == kPsIpoib ? kRdmaPsIpoib : ps, dst, dev);
  if (l == nullptr && cm_.HoldEarly(dev, src, h, m, held_until)) return;
  if (l == nullptr || l->qp_type != kQpUd) {
    ++stats_.no_listener;
    cm_.RefuseSidrReq(dev, src, h, m, kSidrUnsupported);
    return;
  }
  if (l->pending >= kMaxPendingPerListener) {
    ++stats_.flood_rejects;
    cm_.RefuseSidrReq(dev, src, h, m, kSidrReject);
    return;
  }
  Id* id = NewConnId(*l, kQpUd, dev, src, dst, ih);
  if (id == nullptr) return;
  const uint32_t handle = id->handle;
  cm_.TakeSidrReq(id, h, m);
  ++l->pending;
  Event e;
  e.id = handle;
  e.parent = l->handle;
  e.event = kConnectRequest;
  e.ud = true;
  e.param.ah = AhTo(*id, id->dgid);
  e.param.private_data_len = static_cast<uint8_t>(kSidrReqPrivate - kIpHeaderSize);
  std::memcpy(e.param.private_data, m.private_data.data() + kIpHeaderSize, kSidrReqPrivate - kIpHeaderSize);
  events_(e);
}

void Manager::SidrRepReceived(const Conn& c, const SidrRep& m) {
  const Id& id = static_cast<const Id&>(c);
  ConnParam p;
  if (m.status != kSidrSuccess) {
    Emit(id, kUnreachable, m.status, &p);
    return;
  }
  p.ah = AhTo(id, id.dgid);
  p.qp_num = m.qpn;
  p.qkey = m.qkey;
  p.private_data_len = static_cast<uint8_t>(kSidrRepPrivate);
  std::memcpy(p.private_data, m.private_data.data(), kSidrRepPrivate);
  Emit(id, kEstablished, 0, &p);
}

// ---------------------------------------------------------------------------
// Time.

uint64_t Manager::OnTimer() {
  const uint64_t now = clock_();
  uint64_t next = 0;
  auto want = [&next](uint64_t t) {
    if (t != 0 && (next == 0 || t < next)) next = t;
  };
  want(cm_.ExpireEarly(now));
  std::vector<uint32_t> handles;
  handles.reserve(ids_.size());
  for (auto& [h, id] : ids_) {
    if (id->deadline != 0) handles.push_back(h);
  }
  for (uint32_t h : handles) {
    Id* id = Find(h);
    if (id == nullptr || id->deadline == 0) continue;
    if (id->deadline > now) {
      want(id->deadline);
      continue;
    }
    if (id->state == St::kAddrQuery) {
      const Port* port = PortOf(id->dev);
      const int r = port != nullptr && port->io != nullptr ? port->io->Resolve(id->dgid) : -ENODEV;
      if (r > 0) {
        id->state = St::kAddrResolved;
        id->deadline = 0;
        Emit(*id, kAddrResolved, 0);
      } else if (r < 0 || now >= id->addr_deadline) {
        id->state = id->bound ? St::kAddrBound : St::kIdle;
        id->deadline = 0;
        Emit(*id, kAddrError, r < 0 ? r : -ETIMEDOUT);
      } else {
        id->deadline = now + kAddrPollNs;
      }
    } else {
      cm_.OnDeadline(id, now);  // retransmission, timeout, timewait
    }
    if (Id* still = Find(h)) want(still->deadline);
  }
  return next;
}

}  // namespace droce::cm
