#include "cm/manager.h"

#include <infiniband/verbs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace droce::cm {

// The values Linux's rdma_cm puts in its CM messages for RoCE
// (drivers/infiniband/core/cma.c), so that a droce peer and a kernel peer
// time out and retry alike.
namespace {
constexpr uint8_t kCmResponseTimeout = 20;  // CMA_CM_RESPONSE_TIMEOUT: 4.096 us << 20 = 4.3 s
constexpr uint8_t kMaxCmRetries = 15;       // CMA_MAX_CM_RETRIES
constexpr uint8_t kPacketLifeTime = 16;     // CMA_IBOE_PACKET_LIFETIME
constexpr uint8_t kMraServiceTimeout = 20;  // CMA_CM_MRA_SETTING
constexpr uint8_t kHopLimit = 64;
constexpr size_t kMaxPendingPerListener = 4096;  // REQs not yet accepted or rejected
constexpr uint64_t kAddrPollNs = 1'000'000;      // while waiting for ARP/ND
// A REQ or SIDR_REQ for a service nobody listens on is held this long
// before it is refused (IB CM: REJ reason 8 at once), and handed to a
// listener that comes meanwhile. Programs that agree out of band and then
// connect at once race the passive side's rdma_listen: perftest -R's
// client sends its REQ right after the handshake over its first connection,
// whose last step on the server (a SEND's completion) comes a round trip
// later. On a kernel the active side's address and route resolution take
// longer than that; droce's take ~30 us, and the REQ often came before the
// listen (tests cm_ib_write_lat, cm_ib_send_bw: 3 in 10 runs). Debian's
// perftest 4.5-0.17 crashes on its own retry after such a REJ.
constexpr uint64_t kEarlyReqHoldNs = 100'000'000;
constexpr size_t kMaxEarlyReqs = 1024;  // beyond: refused at once, as before
constexpr uint64_t kMs = 1'000'000;

// IBA time (4.096 us << t) in ms, rounded as the kernel's cm_convert_to_ms.
uint64_t iba_ms(uint8_t t) { return uint64_t{1} << std::max(int{t} - 8, 0); }

// rdma_cm's rules for the QP's local ACK timeout (cm_ack_timeout).
uint8_t ack_timeout(uint8_t ca_ack_delay, uint8_t packet_life_time) {
  int t = packet_life_time + 1;
  if (t >= ca_ack_delay) t += (ca_ack_delay >= t - 1);
  else t = ca_ack_delay + (t >= ca_ack_delay - 1);
  return static_cast<uint8_t>(std::min(31, t));
}

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

enum class Manager::St : uint8_t {
  kIdle,
  kAddrBound,
  kAddrQuery,
  kAddrResolved,
  kRouteResolved,
  kListen,
  kReqSent,       // active: REQ out, waiting for REP
  kRepRcvd,       // active: CONNECT_RESPONSE given, waiting for the accept (RTU)
  kReqRcvd,       // passive: CONNECT_REQUEST given, waiting for accept/reject
  kRepSent,       // passive: REP out, waiting for RTU
  kEstablished,
  kDreqSent,
  kTimewait,
  kDisconnected,  // after timewait, or rejected/unreachable: only destroy is left
  kSidrReqSent,
  kSidrReqRcvd,
  kUdReady,       // SIDR done (either side)
};

struct Manager::Id {
  uint32_t handle = 0;
  uint16_t ps = kRdmaPsTcp;
  uint8_t qp_type = kQpRc;
  St state = St::kIdle;
  int dev = -1;
  IpAddr src, dst;
  bool bound = false;   // in bound_ (not conn ids made from a REQ)
  bool have_src = false, have_dst = false;
  bool route = false;   // route resolved (num_paths 1)
  uint32_t parent = 0;  // a conn id's listener
  size_t pending = 0;   // a listener's conn ids still in kReqRcvd
  // Options.
  uint8_t tos = 0;
  bool reuseaddr = false, afonly = false;
  uint8_t ack_timeout_opt = 0;  // RDMA_OPTION_ID_ACK_TIMEOUT; 0: rdma_cm's rule
  // The connection.
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint64_t remote_guid = 0, tid = 0;
  uint32_t local_qpn = 0, remote_qpn = 0;
  // The Starting PSNs of the REQ/REP: ours is what our QP receives at, the
  // peer's is what our QP sends with.
  uint32_t local_psn = 0, remote_psn = 0;
  uint8_t responder_resources = 0, initiator_depth = 0, retry_count = 7, rnr_retry = 7, path_mtu = 3;
  uint8_t srq = 0, flow_control = 0, remote_ack_delay = 15;
  uint8_t remote_cm_timeout = kCmResponseTimeout, max_cm_retries = kMaxCmRetries;
  Gid sgid{}, dgid{};
  // The message to retransmit on timeout or resend on a duplicate.
  bool has_last = false;
  Message last;
  uint64_t deadline = 0;  // 0: no timer
  unsigned retries_left = 0;
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
      DropTimer(id.get());
      Emit(*id, kDeviceRemoval, 0);
    }
  }
  std::erase_if(ports_, [dev](const Port& p) { return p.info.dev == dev; });
  std::erase_if(early_, [dev](const EarlyReq& e) { return e.dev == dev; });
}

Manager::Id* Manager::Find(uint32_t id) const {
  auto it = ids_.find(id);
  return it == ids_.end() ? nullptr : it->second.get();
}

Manager::Id* Manager::FindByComm(uint32_t comm) const {
  auto it = by_comm_.find(comm);
  return it == by_comm_.end() ? nullptr : Find(it->second);
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

uint32_t Manager::NewCommId() {
  for (;;) {
    const uint32_t c = static_cast<uint32_t>(rng_());
    if (c != 0 && !by_comm_.contains(c)) return c;
  }
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

void Manager::DropTimer(Id* id) {
  id->deadline = 0;
  id->retries_left = 0;
}

void Manager::TellPeerGone(Id* id) {
  // What the peer is told, as the kernel's cm_destroy_id.
  switch (id->state) {
    case St::kReqSent: {
      Rej rej;
      rej.local_comm_id = id->local_comm_id;
      rej.message_rejected = kMsgReq;
      rej.reason = kRejTimeout;
      Send(*id, rej, id->tid);
      break;
    }
    case St::kReqRcvd:
    case St::kRepSent:
    case St::kRepRcvd: {
      Rej rej;
      rej.local_comm_id = id->local_comm_id;
      rej.remote_comm_id = id->remote_comm_id;
      rej.message_rejected = id->state == St::kRepRcvd ? kMsgRep : kMsgOther;
      rej.reason = kRejConsumerDefined;
      Send(*id, rej, id->tid);
      ++stats_.rejects_sent;
      break;
    }
    case St::kEstablished: {
      Dreq d;
      d.local_comm_id = id->local_comm_id;
      d.remote_comm_id = id->remote_comm_id;
      d.remote_qpn = id->remote_qpn;
      Send(*id, d, id->tid);
      EnterTimewait(id);
      break;
    }
    default:
      break;
  }
}

int Manager::DestroyId(uint32_t handle) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  TellPeerGone(id);
  if (id->state == St::kReqRcvd && id->parent != 0) {
    if (Id* l = Find(id->parent)) --l->pending;
  }
  // A listener's children stay: each is the application's own id once its
  // CONNECT_REQUEST was delivered (the caller destroys undelivered ones).
  for (uint32_t mc : id->mcasts) mcasts_.erase(mc);
  Unbind(id);
  if (id->local_comm_id != 0) by_comm_.erase(id->local_comm_id);
  ids_.erase(handle);
  return 0;
}

void Manager::ProcessExit() {
  for (auto& [handle, id] : ids_) {
    TellPeerGone(id.get());
    // Nothing more is sent for it: no retries, no answer but a DREP to a
    // DREQ (HandleDreq, in timewait or disconnected).
    DropTimer(id.get());
    switch (id->state) {
      case St::kReqSent:
      case St::kReqRcvd:
      case St::kRepSent:
      case St::kRepRcvd:
        id->state = St::kDisconnected;  // rejected just now
        break;
      default:
        break;
    }
  }
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
  ReplayEarly();
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

uint8_t Manager::AckTimeout(const Id& id) const {
  if (id.ack_timeout_opt != 0) return id.ack_timeout_opt;
  return ack_timeout(id.remote_ack_delay, kPacketLifeTime);
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

void Manager::SendTo(int dev, const Gid& sgid, const Gid& dgid, uint32_t dqpn, uint8_t tclass, const Message& m,
                     uint64_t tid) {
  Port* port = PortOf(dev);
  if (port == nullptr || port->io == nullptr) return;
  MadHeader h;
  h.tid = tid;
  std::array<uint8_t, kMadSize> buf;
  encode(h, m, buf);
  port->io->SendMad(sgid, dgid, dqpn, tclass, buf);
  ++stats_.mads_out;
}

void Manager::Send(const Id& id, const Message& m, uint64_t tid) {
  SendTo(id.dev, id.sgid, id.dgid, kGsiQpn, id.tos, m, tid);
}

void Manager::SendRemembered(Id* id, const Message& m, uint64_t timeout_ns, unsigned retries) {
  id->last = m;
  id->has_last = true;
  Send(*id, m, id->tid);
  id->deadline = clock_() + timeout_ns;
  id->retries_left = retries;
}

void Manager::EnterTimewait(Id* id) {
  Timewait tw;
  tw.remote_guid = id->remote_guid;
  tw.remote_comm_id = id->remote_comm_id;
  tw.remote_qpn = id->remote_qpn;
  tw.remote_gid = id->dgid;
  // As the kernel: the QP's ACK timeout, so that stray packets of the old
  // connection are gone before its QPN and comm ID may be seen again.
  tw.until = clock_() + iba_ms(AckTimeout(*id)) * kMs;
  timewait_.push_back(tw);
  id->state = St::kTimewait;
  id->deadline = tw.until;
  id->retries_left = 0;
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
  id->tid = rng_();
  id->local_comm_id = NewCommId();
  by_comm_[id->local_comm_id] = id->handle;
  const uint16_t ps = id->ps == kRdmaPsIpoib ? kPsIpoib : id->ps;
  if (id->qp_type == kQpUd) {
    SidrReq r;
    r.request_id = id->local_comm_id;
    r.service_id = service_id(ps, id->dst.port);
    encode_ip_header(ih, r.private_data.data());
    std::memcpy(r.private_data.data() + kIpHeaderSize, p.private_data, p.private_data_len);
    id->state = St::kSidrReqSent;
    // rdma_cm's SIDR timeout: 1 << (CMA_CM_RESPONSE_TIMEOUT - 8) ms.
    SendRemembered(id, r, (uint64_t{1} << (kCmResponseTimeout - 8)) * kMs, kMaxCmRetries);
    return 0;
  }
  id->local_qpn = p.qp_num;
  id->local_psn = RandomPsn();
  id->responder_resources = p.responder_resources;
  id->initiator_depth = p.initiator_depth;
  id->retry_count = p.retry_count & 7;
  id->rnr_retry = p.rnr_retry_count & 7;
  id->srq = p.srq;
  id->flow_control = p.flow_control;
  id->path_mtu = port->info.active_mtu;
  Req r;
  r.local_comm_id = id->local_comm_id;
  r.service_id = service_id(ps, id->dst.port);
  r.local_ca_guid = port->info.node_guid;
  r.local_qpn = p.qp_num & 0xFFFFFF;
  r.responder_resources = p.responder_resources;
  r.initiator_depth = p.initiator_depth;
  r.remote_cm_response_timeout = kCmResponseTimeout;
  r.transport_type = 0;  // RC
  r.end_to_end_flow_control = p.flow_control != 0;
  r.starting_psn = id->local_psn;
  r.local_cm_response_timeout = kCmResponseTimeout;
  r.retry_count = id->retry_count;
  r.pkey = 0xFFFF;
  r.path_mtu = id->path_mtu;
  r.rnr_retry_count = id->rnr_retry;
  r.max_cm_retries = kMaxCmRetries;
  r.srq = p.srq != 0;
  r.primary.local_gid = id->sgid;
  r.primary.remote_gid = id->dgid;
  r.primary.traffic_class = id->tos;
  r.primary.hop_limit = kHopLimit;
  r.primary.packet_rate = 0;
  r.primary.local_ack_timeout = std::min(31, kPacketLifeTime + 1);
  encode_ip_header(ih, r.private_data.data());
  std::memcpy(r.private_data.data() + kIpHeaderSize, p.private_data, p.private_data_len);
  id->state = St::kReqSent;
  SendRemembered(id, r, (iba_ms(kPacketLifeTime) * 2 + iba_ms(kCmResponseTimeout)) * kMs, kMaxCmRetries);
  return 0;
}

int Manager::Accept(uint32_t handle, const ConnParam* p) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  if (p == nullptr) {
    // The active side, after CONNECT_RESPONSE: RTU.
    if (id->state != St::kRepRcvd) return -EINVAL;
    Rtu rtu;
    rtu.local_comm_id = id->local_comm_id;
    rtu.remote_comm_id = id->remote_comm_id;
    id->last = rtu;
    id->has_last = true;
    Send(*id, rtu, id->tid);
    id->state = St::kEstablished;
    DropTimer(id);
    return 0;
  }
  const Port* port = PortOf(id->dev);
  if (port == nullptr) return -ENODEV;
  if (id->state == St::kSidrReqRcvd) {
    if (p->private_data_len > kSidrRepPrivate) return -EINVAL;
    SidrRep r;
    r.request_id = id->remote_comm_id;
    r.status = kSidrSuccess;
    r.qpn = p->qp_num & 0xFFFFFF;
    r.service_id = service_id(id->ps == kRdmaPsIpoib ? kPsIpoib : id->ps, id->src.port);
    r.qkey = p->qkey != 0 ? p->qkey : kUdpQkey;
    std::memcpy(r.private_data.data(), p->private_data, p->private_data_len);
    id->last = r;
    id->has_last = true;
    Send(*id, r, id->tid);
    id->state = St::kUdReady;
    if (Id* l = Find(id->parent)) --l->pending;
    return 0;
  }
  if (id->state != St::kReqRcvd) return -EINVAL;
  if (p->private_data_len > kRepPrivate) return -EINVAL;
  id->local_qpn = p->qp_num;
  id->responder_resources = p->responder_resources;
  id->initiator_depth = p->initiator_depth;
  id->srq = p->srq;
  Rep r;
  r.local_comm_id = id->local_comm_id;
  r.remote_comm_id = id->remote_comm_id;
  r.local_qpn = p->qp_num & 0xFFFFFF;
  r.starting_psn = id->local_psn;
  r.responder_resources = p->responder_resources;
  r.initiator_depth = p->initiator_depth;
  r.target_ack_delay = port->info.ack_delay;
  r.end_to_end_flow_control = p->flow_control != 0;
  r.rnr_retry_count = p->rnr_retry_count & 7;
  r.srq = p->srq != 0;
  r.local_ca_guid = port->info.node_guid;
  std::memcpy(r.private_data.data(), p->private_data, p->private_data_len);
  id->state = St::kRepSent;
  if (Id* l = Find(id->parent)) --l->pending;
  SendRemembered(id, r, (iba_ms(kPacketLifeTime) * 2 + iba_ms(id->remote_cm_timeout)) * kMs, id->max_cm_retries);
  return 0;
}

int Manager::Reject(uint32_t handle, uint8_t reason, const uint8_t* data, uint8_t len) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  if (id->state == St::kSidrReqRcvd) {
    SidrRep r;
    r.request_id = id->remote_comm_id;
    r.status = kSidrReject;
    r.service_id = service_id(id->ps, id->src.port);
    std::memcpy(r.private_data.data(), data, std::min<size_t>(len, kSidrRepPrivate));
    Send(*id, r, id->tid);
  } else if (id->state == St::kReqRcvd || id->state == St::kRepSent) {
    Rej r;
    r.local_comm_id = id->local_comm_id;
    r.remote_comm_id = id->remote_comm_id;
    r.message_rejected = kMsgReq;
    r.reason = reason != 0 ? uint16_t{reason} : uint16_t{kRejConsumerDefined};
    std::memcpy(r.private_data.data(), data, std::min<size_t>(len, kRejPrivate));
    Send(*id, r, id->tid);
    ++stats_.rejects_sent;
  } else {
    return -EINVAL;
  }
  if (Id* l = Find(id->parent); l != nullptr && id->state != St::kRepSent) --l->pending;
  id->state = St::kDisconnected;
  DropTimer(id);
  return 0;
}

int Manager::Disconnect(uint32_t handle) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  if (id->local_comm_id == 0) return -EINVAL;  // never connected: no CM id (as the kernel)
  if (id->state == St::kEstablished) {
    Dreq d;
    d.local_comm_id = id->local_comm_id;
    d.remote_comm_id = id->remote_comm_id;
    d.remote_qpn = id->remote_qpn & 0xFFFFFF;
    id->state = St::kDreqSent;
    SendRemembered(id, d, (iba_ms(kPacketLifeTime) * 2 + iba_ms(id->remote_cm_timeout)) * kMs,
                   id->max_cm_retries);
  }
  // Otherwise there is nothing to send (DREQ already out or answered, or the
  // connection never got established): the kernel returns 0 too.
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
  const bool connected = id->state == St::kReqRcvd || id->state == St::kRepSent || id->state == St::kRepRcvd ||
                         id->state == St::kEstablished;
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
  switch (state) {
    case IBV_QPS_INIT:
      a->mask = IBV_QP_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
      // Before a connection: no remote access yet (rdma_cm's cma_ib_init_qp_attr).
      if (connected) {
        a->access = IBV_ACCESS_REMOTE_WRITE;
        if (id->responder_resources != 0) a->access |= IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
      }
      return 0;
    case IBV_QPS_RTR: {
      if (!connected) return -EINVAL;
      a->mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
      a->ah = AhTo(*id, id->dgid);
      a->path_mtu = id->path_mtu;
      a->dest_qp_num = id->remote_qpn;
      // The Starting PSN this side put in its REQ or REP is the PSN its own
      // QP receives at; the peer sends with it. Linux: ib_send_cm_req and
      // ib_send_cm_rep keep their message's PSN as rq_psn, cm_req_handler
      // and cm_rep_handler take the peer's as sq_psn (cm.c).
      a->rq_psn = id->local_psn;
      a->max_dest_rd_atomic = id->responder_resources;
      a->min_rnr_timer = 0;
      return 0;
    }
    case IBV_QPS_RTS:
      if (!connected) return -EINVAL;
      a->mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                IBV_QP_MAX_QP_RD_ATOMIC;
      a->sq_psn = id->remote_psn;  // the Starting PSN of the peer's REQ or REP
      a->timeout = AckTimeout(*id);
      a->retry_cnt = id->retry_count;
      a->rnr_retry = id->rnr_retry;
      a->max_rd_atomic = id->initiator_depth;
      return 0;
    default:
      return -EINVAL;
  }
}

int Manager::Notify(uint32_t handle, uint32_t event) {
  Id* id = Find(handle);
  if (id == nullptr) return -EINVAL;
  // IBV_EVENT_COMM_EST: traffic arrived before the RTU (ib_cm_notify).
  if (event == IBV_EVENT_COMM_EST && id->state == St::kRepSent) {
    id->state = St::kEstablished;
    DropTimer(id);
    Emit(*id, kEstablished, 0);
  }
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
// MADs in.

void Manager::OnMad(int dev, const MadSource& src, std::span<const uint8_t> bytes) {
  ++stats_.mads_in;
  Mad mad;
  if (decode(bytes, &mad) != MadError::kOk) {
    ++stats_.bad_mads;
    return;
  }
  std::visit(
      [&](const auto& m) {
        using T = std::decay_t<decltype(m)>;
        if constexpr (std::is_same_v<T, Req>) HandleReq(dev, src, mad.hdr, m);
        else if constexpr (std::is_same_v<T, Mra>) HandleMra(m);
        else if constexpr (std::is_same_v<T, Rej>) HandleRej(m);
        else if constexpr (std::is_same_v<T, Rep>) HandleRep(dev, src, mad.hdr, m);
        else if constexpr (std::is_same_v<T, Rtu>) HandleRtu(m);
        else if constexpr (std::is_same_v<T, Dreq>) HandleDreq(dev, src, mad.hdr, m);
        else if constexpr (std::is_same_v<T, Drep>) HandleDrep(m);
        else if constexpr (std::is_same_v<T, SidrReq>) HandleSidrReq(dev, src, mad.hdr, m);
        else if constexpr (std::is_same_v<T, SidrRep>) HandleSidrRep(m);
      },
      mad.msg);
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

void Manager::RejectReq(int dev, const MadSource& src, const MadHeader& h, uint32_t remote_comm_id,
                        uint16_t reason) {
  Rej r;
  r.local_comm_id = 0;
  r.remote_comm_id = remote_comm_id;
  r.message_rejected = kMsgReq;
  r.reason = reason;
  SendTo(dev, src.dgid, src.sgid, src.src_qpn, src.tclass, r, h.tid);
  ++stats_.rejects_sent;
}

// The id of a request a listener got (REQ or SIDR_REQ): bound where the
// request went, routed back to where it came from, with the listener's
// options.
Manager::Id* Manager::NewConnId(const Id& l, uint8_t qp_type, int dev, const MadSource& src, const IpAddr& dst,
                                const IpHeader& ih, uint64_t tid) {
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
  id->tid = tid;
  return id;
}

void Manager::HandleReq(int dev, const MadSource& src, const MadHeader& h, const Req& r, uint64_t held_until) {
  // A duplicate of a REQ being handled: resend what was answered, or an MRA
  // while the application has not decided yet.
  for (auto& [handle, idp] : ids_) {
    Id* id = idp.get();
    if (id->remote_comm_id != r.local_comm_id || id->remote_guid != r.local_ca_guid || id->parent == 0) continue;
    ++stats_.duplicates;
    if (id->state == St::kReqRcvd) {
      Mra m;
      m.local_comm_id = id->local_comm_id;
      m.remote_comm_id = id->remote_comm_id;
      m.message_mraed = kMsgReq;
      m.service_timeout = kMraServiceTimeout;
      Send(*id, m, id->tid);
    } else if (id->state == St::kRepSent && id->has_last) {
      Send(*id, id->last, id->tid);
    }
    return;
  }
  // A REQ of a connection in timewait, or from a QP still connected here.
  const uint64_t now = clock_();
  std::erase_if(timewait_, [now](const Timewait& t) { return t.until <= now; });
  for (const Timewait& t : timewait_) {
    if ((t.remote_guid == r.local_ca_guid && t.remote_comm_id == r.local_comm_id) ||
        (t.remote_qpn == r.local_qpn && t.remote_gid == src.sgid)) {
      ++stats_.stale;
      RejectReq(dev, src, h, r.local_comm_id, kRejStaleConn);
      return;
    }
  }
  for (auto& [handle, idp] : ids_) {
    const Id* id = idp.get();
    if (id->state == St::kEstablished && id->remote_qpn == r.local_qpn && id->dgid == src.sgid) {
      ++stats_.stale;
      RejectReq(dev, src, h, r.local_comm_id, kRejStaleConn);
      return;
    }
  }
  uint16_t ps = 0, port = 0;
  IpHeader ih;
  if (!parse_service_id(r.service_id, &ps, &port) || !decode_ip_header(r.private_data.data(), &ih)) {
    ++stats_.no_listener;
    RejectReq(dev, src, h, r.local_comm_id, kRejInvalidServiceId);
    return;
  }
  const bool v6 = ih.ip_version == 6;
  const IpAddr dst = from_header(ih.dst, v6, port);
  const uint16_t rdma_ps = ps == kPsIpoib ? kRdmaPsIpoib : ps;
  Id* l = FindListener(rdma_ps, dst, dev);
  if (l == nullptr && HoldEarly(dev, src, h, r, held_until)) return;
  if (l == nullptr || l->qp_type != kQpRc) {
    ++stats_.no_listener;
    RejectReq(dev, src, h, r.local_comm_id, kRejInvalidServiceId);
    return;
  }
  if (r.transport_type != 0) {
    RejectReq(dev, src, h, r.local_comm_id, kRejInvalidTransportType);
    return;
  }
  if (l->pending >= kMaxPendingPerListener) {
    ++stats_.flood_rejects;
    RejectReq(dev, src, h, r.local_comm_id, kRejNoResources);
    return;
  }
  const Port* p = PortOf(dev);
  if (p == nullptr) return;
  Id* id = NewConnId(*l, kQpRc, dev, src, dst, ih, h.tid);
  if (id == nullptr) return;
  const uint32_t handle = id->handle;
  id->local_comm_id = NewCommId();
  by_comm_[id->local_comm_id] = handle;
  id->remote_comm_id = r.local_comm_id;
  id->remote_guid = r.local_ca_guid;
  id->remote_qpn = r.local_qpn;
  id->remote_psn = r.starting_psn;
  id->local_psn = RandomPsn();
  // In this side's terms: its responder resources serve the peer's
  // initiator depth and the other way round (cm_format_req_event).
  id->responder_resources = r.initiator_depth;
  id->initiator_depth = r.responder_resources;
  id->retry_count = r.retry_count;
  id->rnr_retry = r.rnr_retry_count;
  id->srq = r.srq;
  id->flow_control = r.end_to_end_flow_control;
  id->path_mtu = std::min(r.path_mtu, p->info.active_mtu);
  id->remote_cm_timeout = r.local_cm_response_timeout;
  id->max_cm_retries = r.max_cm_retries;
  id->remote_ack_delay = p->info.ack_delay;
  id->state = St::kReqRcvd;
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

bool Manager::HoldEarly(int dev, const MadSource& src, const MadHeader& h, const std::variant<Req, SidrReq>& msg,
                        uint64_t held_until) {
  // The same request again (the peer's retransmission): one is held.
  auto same = [&](const EarlyReq& e) {
    if (e.msg.index() != msg.index() || !(e.src.sgid == src.sgid)) return false;
    if (const Req* r = std::get_if<Req>(&msg)) {
      const Req& o = std::get<Req>(e.msg);
      return o.local_comm_id == r->local_comm_id && o.local_ca_guid == r->local_ca_guid;
    }
    return std::get<SidrReq>(e.msg).request_id == std::get<SidrReq>(msg).request_id;
  };
  if (held_until == 0 && std::any_of(early_.begin(), early_.end(), same)) {
    ++stats_.duplicates;
    return true;
  }
  if (early_.size() >= kMaxEarlyReqs) return false;
  if (held_until == 0) ++stats_.early_reqs;
  early_.push_back({dev, src, h, msg, held_until != 0 ? held_until : clock_() + kEarlyReqHoldNs});
  return true;
}

void Manager::RefuseNoListener(const EarlyReq& e) {
  ++stats_.no_listener;
  if (const Req* r = std::get_if<Req>(&e.msg)) {
    RejectReq(e.dev, e.src, e.h, r->local_comm_id, kRejInvalidServiceId);
    return;
  }
  const SidrReq& m = std::get<SidrReq>(e.msg);
  SidrRep rep;
  rep.request_id = m.request_id;
  rep.service_id = m.service_id;
  rep.status = kSidrUnsupported;
  SendTo(e.dev, e.src.dgid, e.src.sgid, e.src.src_qpn, e.src.tclass, rep, e.h.tid);
}

// A listener came: every held request is handled again, in the order they
// came; those it is not for are held again until their own deadline.
void Manager::ReplayEarly() {
  if (early_.empty()) return;
  std::vector<EarlyReq> held;
  held.swap(early_);
  for (const EarlyReq& e : held) {
    if (const Req* r = std::get_if<Req>(&e.msg)) HandleReq(e.dev, e.src, e.h, *r, e.until);
    else HandleSidrReq(e.dev, e.src, e.h, std::get<SidrReq>(e.msg), e.until);
  }
}

uint64_t Manager::ExpireEarly(uint64_t now) {
  if (early_.empty()) return 0;
  uint64_t next = 0;
  std::vector<EarlyReq> keep, due;
  for (EarlyReq& e : early_) {
    if (e.until > now) {
      if (next == 0 || e.until < next) next = e.until;
      keep.push_back(std::move(e));
    } else {
      due.push_back(std::move(e));
    }
  }
  early_.swap(keep);
  for (const EarlyReq& e : due) RefuseNoListener(e);
  return next;
}

void Manager::HandleMra(const Mra& m) {
  Id* id = FindByComm(m.remote_comm_id);
  if (id == nullptr) {
    ++stats_.unknown_comm_id;
    return;
  }
  const bool for_req = id->state == St::kReqSent && m.message_mraed == kMsgReq;
  const bool for_rep = id->state == St::kRepSent && m.message_mraed == kMsgRep;
  if (!for_req && !for_rep) return;
  // The peer needs longer: wait its service timeout before trying again.
  id->deadline = clock_() + (iba_ms(m.service_timeout) + iba_ms(kPacketLifeTime) * 2) * kMs;
}

void Manager::HandleRej(const Rej& m) {
  Id* id = FindByComm(m.remote_comm_id);
  if (id == nullptr) {
    ++stats_.unknown_comm_id;
    return;
  }
  if (id->remote_comm_id != 0 && m.local_comm_id != 0 && m.local_comm_id != id->remote_comm_id) return;
  switch (id->state) {
    case St::kReqSent:
    case St::kRepRcvd:
    case St::kRepSent:
    case St::kReqRcvd:
    case St::kEstablished: {
      const bool was_pending = id->state == St::kReqRcvd;
      if (m.reason == kRejStaleConn && id->state == St::kEstablished) EnterTimewait(id);
      else {
        id->state = St::kDisconnected;
        DropTimer(id);
      }
      if (was_pending) {
        if (Id* l = Find(id->parent)) --l->pending;
      }
      ConnParam p;
      p.private_data_len = static_cast<uint8_t>(kRejPrivate);
      std::memcpy(p.private_data, m.private_data.data(), kRejPrivate);
      Emit(*id, kRejected, m.reason, &p);
      return;
    }
    default:
      return;
  }
}

void Manager::HandleRep(int dev, const MadSource& src, const MadHeader& h, const Rep& m) {
  Id* id = FindByComm(m.remote_comm_id);
  if (id == nullptr) {
    ++stats_.unknown_comm_id;
    Rej r;
    r.remote_comm_id = m.local_comm_id;
    r.message_rejected = kMsgRep;
    r.reason = kRejInvalidCommId;
    SendTo(dev, src.dgid, src.sgid, src.src_qpn, src.tclass, r, h.tid);
    ++stats_.rejects_sent;
    return;
  }
  if (id->state == St::kEstablished && id->remote_comm_id == m.local_comm_id) {
    // Our RTU was lost: send it again.
    ++stats_.duplicates;
    if (id->has_last) Send(*id, id->last, id->tid);
    return;
  }
  if (id->state != St::kReqSent) {
    ++stats_.duplicates;
    return;
  }
  id->remote_comm_id = m.local_comm_id;
  id->remote_guid = m.local_ca_guid;
  id->remote_qpn = m.local_qpn;
  id->remote_psn = m.starting_psn;
  // This side's terms (cm_rep_handler).
  id->initiator_depth = m.responder_resources;
  id->responder_resources = m.initiator_depth;
  id->rnr_retry = m.rnr_retry_count;
  id->remote_ack_delay = m.target_ack_delay;
  id->state = St::kRepRcvd;
  DropTimer(id);
  ConnParam p;
  p.qp_num = m.local_qpn;
  p.responder_resources = id->responder_resources;
  p.initiator_depth = id->initiator_depth;
  p.flow_control = m.end_to_end_flow_control;
  p.rnr_retry_count = m.rnr_retry_count;
  p.srq = m.srq;
  p.private_data_len = static_cast<uint8_t>(kRepPrivate);
  std::memcpy(p.private_data, m.private_data.data(), kRepPrivate);
  Emit(*id, kConnectResponse, 0, &p);
}

void Manager::HandleRtu(const Rtu& m) {
  Id* id = FindByComm(m.remote_comm_id);
  if (id == nullptr) {
    ++stats_.unknown_comm_id;
    return;
  }
  if (id->state != St::kRepSent || m.local_comm_id != id->remote_comm_id) return;
  id->state = St::kEstablished;
  DropTimer(id);
  Emit(*id, kEstablished, 0);
}

void Manager::HandleDreq(int dev, const MadSource& src, const MadHeader& h, const Dreq& m) {
  Id* id = FindByComm(m.remote_comm_id);
  Drep d;
  d.local_comm_id = m.remote_comm_id;
  d.remote_comm_id = m.local_comm_id;
  if (id == nullptr || id->remote_comm_id != m.local_comm_id) {
    // As the kernel: answer anyway, so a peer whose partner went away can
    // finish its disconnect.
    ++stats_.unknown_comm_id;
    SendTo(dev, src.dgid, src.sgid, src.src_qpn, src.tclass, d, h.tid);
    return;
  }
  if (m.remote_qpn != (id->local_qpn & 0xFFFFFF)) return;
  switch (id->state) {
    case St::kEstablished:
    case St::kRepSent:
    case St::kRepRcvd:
    case St::kDreqSent:
      Send(*id, d, h.tid);
      EnterTimewait(id);
      id->last = d;
      id->has_last = true;
      Emit(*id, kDisconnected, 0);
      return;
    case St::kTimewait:
    case St::kDisconnected:
      ++stats_.duplicates;
      Send(*id, d, h.tid);
      return;
    default:
      return;
  }
}

void Manager::HandleDrep(const Drep& m) {
  Id* id = FindByComm(m.remote_comm_id);
  if (id == nullptr) {
    ++stats_.unknown_comm_id;
    return;
  }
  if (id->state != St::kDreqSent) return;
  EnterTimewait(id);
  Emit(*id, kDisconnected, 0);
}

void Manager::HandleSidrReq(int dev, const MadSource& src, const MadHeader& h, const SidrReq& m,
                            uint64_t held_until) {
  for (auto& [handle, idp] : ids_) {
    Id* id = idp.get();
    if (id->parent == 0 || id->qp_type != kQpUd || id->remote_comm_id != m.request_id || !(id->dgid == src.sgid))
      continue;
    ++stats_.duplicates;
    if (id->state == St::kUdReady && id->has_last) Send(*id, id->last, id->tid);
    return;
  }
  uint16_t ps = 0, port = 0;
  IpHeader ih;
  SidrRep rep;
  rep.request_id = m.request_id;
  rep.service_id = m.service_id;
  if (!parse_service_id(m.service_id, &ps, &port) || !decode_ip_header(m.private_data.data(), &ih)) {
    ++stats_.no_listener;
    rep.status = kSidrUnsupported;
    SendTo(dev, src.dgid, src.sgid, src.src_qpn, src.tclass, rep, h.tid);
    return;
  }
  const bool v6 = ih.ip_version == 6;
  const IpAddr dst = from_header(ih.dst, v6, port);
  Id* l = FindListener(ps == kPsIpoib ? kRdmaPsIpoib : ps, dst, dev);
  if (l == nullptr && HoldEarly(dev, src, h, m, held_until)) return;
  if (l == nullptr || l->qp_type != kQpUd) {
    ++stats_.no_listener;
    rep.status = kSidrUnsupported;
    SendTo(dev, src.dgid, src.sgid, src.src_qpn, src.tclass, rep, h.tid);
    return;
  }
  if (l->pending >= kMaxPendingPerListener) {
    ++stats_.flood_rejects;
    rep.status = kSidrReject;
    SendTo(dev, src.dgid, src.sgid, src.src_qpn, src.tclass, rep, h.tid);
    return;
  }
  Id* id = NewConnId(*l, kQpUd, dev, src, dst, ih, h.tid);
  if (id == nullptr) return;
  const uint32_t handle = id->handle;
  id->remote_comm_id = m.request_id;
  id->state = St::kSidrReqRcvd;
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

void Manager::HandleSidrRep(const SidrRep& m) {
  Id* id = FindByComm(m.request_id);
  if (id == nullptr || id->state != St::kSidrReqSent) {
    ++stats_.unknown_comm_id;
    return;
  }
  DropTimer(id);
  ConnParam p;
  if (m.status != kSidrSuccess) {
    id->state = St::kDisconnected;
    Emit(*id, kUnreachable, m.status, &p);
    return;
  }
  id->state = St::kUdReady;
  p.ah = AhTo(*id, id->dgid);
  p.qp_num = m.qpn;
  p.qkey = m.qkey;
  p.private_data_len = static_cast<uint8_t>(kSidrRepPrivate);
  std::memcpy(p.private_data, m.private_data.data(), kSidrRepPrivate);
  Emit(*id, kEstablished, 0, &p);
}

// ---------------------------------------------------------------------------
// Time.

uint64_t Manager::OnTimer() {
  const uint64_t now = clock_();
  uint64_t next = 0;
  auto want = [&next](uint64_t t) {
    if (t != 0 && (next == 0 || t < next)) next = t;
  };
  want(ExpireEarly(now));
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
    switch (id->state) {
      case St::kAddrQuery: {
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
        break;
      }
      case St::kReqSent:
      case St::kRepSent:
      case St::kDreqSent:
      case St::kSidrReqSent:
        if (id->retries_left > 0 && id->has_last) {
          --id->retries_left;
          ++stats_.retransmits;
          Send(*id, id->last, id->tid);
          const uint64_t timeout = id->state == St::kSidrReqSent
                                       ? (uint64_t{1} << (kCmResponseTimeout - 8)) * kMs
                                       : (iba_ms(kPacketLifeTime) * 2 + iba_ms(id->remote_cm_timeout)) * kMs;
          id->deadline = now + timeout;
          break;
        }
        if (id->state == St::kDreqSent) {
          // No DREP: the connection is over all the same.
          EnterTimewait(id);
          Emit(*id, kDisconnected, 0);
        } else {
          id->state = St::kDisconnected;
          id->deadline = 0;
          Emit(*id, kUnreachable, -ETIMEDOUT);
        }
        break;
      case St::kTimewait:
        id->state = St::kDisconnected;
        id->deadline = 0;
        Emit(*id, kTimewaitExit, 0);
        break;
      default:
        id->deadline = 0;
        break;
    }
    if (Id* still = Find(h)) want(still->deadline);
  }
  return next;
}

}  // namespace droce::cm
