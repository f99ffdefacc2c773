#include "cm/ucma.h"

// glibc's netinet/in.h first: the kernel's UAPI headers below then leave
// sockaddr_in6 & co. to it.
#include <netinet/in.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_cm.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>

namespace droce::cm {
namespace {

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

int Respond(Ucma::Result* r, uint64_t response, const void* bytes, size_t len) {
  r->response = response;
  r->len = static_cast<uint32_t>(len);
  std::memcpy(r->bytes, bytes, len);
  return 0;
}

void fill_ah(const AhInfo& a, ib_uverbs_ah_attr* out) {
  std::memset(out, 0, sizeof(*out));
  std::memcpy(out->grh.dgid, a.dgid.data(), 16);
  out->grh.flow_label = a.flow_label;
  out->grh.sgid_index = a.sgid_index;
  out->grh.hop_limit = a.hop_limit;
  out->grh.traffic_class = a.traffic_class;
  out->sl = a.sl;
  out->is_global = a.is_global;
  out->port_num = a.port_num;
}

void fill_conn(const ConnParam& p, rdma_ucm_conn_param* out) {
  std::memset(out, 0, sizeof(*out));
  out->qp_num = p.qp_num;
  out->qkey = p.qkey;
  std::memcpy(out->private_data, p.private_data, sizeof(out->private_data));
  out->private_data_len = p.private_data_len;
  out->srq = p.srq;
  out->responder_resources = p.responder_resources;
  out->initiator_depth = p.initiator_depth;
  out->flow_control = p.flow_control;
  out->retry_count = p.retry_count;
  out->rnr_retry_count = p.rnr_retry_count;
}

ConnParam conn_from(const rdma_ucm_conn_param& c) {
  ConnParam p;
  p.qp_num = c.qp_num;
  p.qkey = c.qkey;
  p.private_data_len = std::min<uint8_t>(c.private_data_len, RDMA_MAX_PRIVATE_DATA - 1);
  std::memcpy(p.private_data, c.private_data, p.private_data_len);
  p.srq = c.srq;
  p.responder_resources = c.responder_resources;
  p.initiator_depth = c.initiator_depth;
  p.flow_control = c.flow_control;
  p.retry_count = c.retry_count;
  p.rnr_retry_count = c.rnr_retry_count;
  p.valid = c.valid != 0;
  return p;
}

template <typename T>
T cmd_as(const uint8_t* in) {
  T t;
  std::memcpy(&t, in, sizeof(T));
  return t;
}

}  // namespace

Ucma::Ucma()
    : mgr_(std::make_unique<Manager>([this](const Event& e) { Deliver(e); }, now_ns,
                                     std::random_device{}() ^ now_ns())) {}

Ucma::~Ucma() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Ucma::AddPort(const LocalPort& port, PortIo* io) {
  std::lock_guard<std::mutex> l(mu_);
  mgr_->AddPort(port, io);
  ++nports_;
}

void Ucma::RemovePort(int dev) {
  std::lock_guard<std::mutex> l(mu_);
  mgr_->RemovePort(dev);
}

void Ucma::Start() {
  std::lock_guard<std::mutex> l(mu_);
  if (started_) return;
  started_ = true;
  thread_ = std::thread([this] { Loop(); });
}

void Ucma::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  uint64_t next = 0;
  while (!stop_) {
    auto ready = [this] { return !inbox_.empty() || rearm_ || stop_; };
    if (next == 0) {
      cv_.wait_for(l, std::chrono::seconds(1), ready);
    } else {
      const uint64_t now = now_ns();
      if (next > now) cv_.wait_for(l, std::chrono::nanoseconds(next - now), ready);
    }
    rearm_ = false;
    while (!inbox_.empty()) {
      In in = inbox_.front();
      inbox_.pop_front();
      mgr_->OnMad(in.dev, in.src, in.mad);
    }
    next = mgr_->OnTimer();
  }
}

void Ucma::Inbound(int dev, const MadSource& src, const uint8_t* mad) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (inbox_.size() >= 65536) return;  // a flood: the peers retry
    In in{dev, src, {}};
    std::memcpy(in.mad.data(), mad, kMadSize);
    inbox_.push_back(in);
  }
  cv_.notify_one();
}

void Ucma::Notify(Channel* ch) {
  const uint64_t one = 1;
  // The channel's eventfd; a full counter (2^64 - 2 events) cannot happen.
  // The raw system call: in embedded mode the provider interposes write()
  // on exactly this fd (it is the application's channel).
  (void)!syscall(SYS_write, ch->notify_fd, &one, sizeof(one));
}

// An event from the manager (mu_ held): onto the channel of its id.
void Ucma::Deliver(const Event& e) {
  Channel* ch = nullptr;
  if (e.event == kConnectRequest) {
    auto it = ids_.find(e.parent);
    if (it == ids_.end()) {
      mgr_->DestroyId(e.id);
      return;
    }
    ch = it->second.ch;
    ids_[e.id] = IdInfo{ch, 0, 0};
  } else {
    auto it = ids_.find(e.id);
    if (it == ids_.end()) return;
    ch = it->second.ch;
  }
  ch->events.push_back({e, false});
  Notify(ch);
}

// Voids the queued events of `id` (destroy, migrate); the CONNECT_REQUESTs
// it got that the application never saw take their new ids with them.
void Ucma::Purge(Channel* ch, uint32_t id) {
  for (Queued& q : ch->events) {
    if (q.dead) continue;
    if (q.ev.event == kConnectRequest && q.ev.parent == id) {
      q.dead = true;
      DestroyLocked(q.ev.id);
    } else if (q.ev.id == id) {
      q.dead = true;
    }
  }
}

void Ucma::DestroyLocked(uint32_t id) {
  auto it = ids_.find(id);
  if (it != ids_.end()) {
    Channel* ch = it->second.ch;
    ids_.erase(it);
    Purge(ch, id);
  }
  absl::erase_if(mcs_, [id](const auto& kv) { return kv.second.id == id; });
  mgr_->DestroyId(id);
}

int Ucma::OpenChannel(uint64_t key, int notify_fd) {
  std::lock_guard<std::mutex> l(mu_);
  if (channels_.contains(key)) return -EEXIST;
  auto ch = std::make_unique<Channel>();
  ch->key = key;
  ch->notify_fd = notify_fd;
  channels_[key] = std::move(ch);
  return 0;
}

void Ucma::CloseLocked(Channel* ch) {
  std::vector<uint32_t> mine;
  for (const auto& [id, info] : ids_) {
    if (info.ch == ch) mine.push_back(id);
  }
  for (uint32_t id : mine) DestroyLocked(id);
  channels_.erase(ch->key);
}

void Ucma::CloseChannel(uint64_t key) {
  std::lock_guard<std::mutex> l(mu_);
  if (Channel* ch = ChannelOf(key)) CloseLocked(ch);
}

void Ucma::ProcessExit() {
  std::lock_guard<std::mutex> l(mu_);
  // What already arrived first (a DREQ gets its DREP), then the farewells.
  while (!inbox_.empty()) {
    In in = inbox_.front();
    inbox_.pop_front();
    mgr_->OnMad(in.dev, in.src, in.mad);
  }
  mgr_->ProcessExit();
}

void Ucma::CloseChannelsOf(uint32_t owner) {
  std::lock_guard<std::mutex> l(mu_);
  std::vector<Channel*> theirs;
  for (auto& [key, ch] : channels_) {
    if ((key >> 32) == owner) theirs.push_back(ch.get());
  }
  for (Channel* ch : theirs) CloseLocked(ch);
}

CmStats Ucma::stats() {
  std::lock_guard<std::mutex> l(mu_);
  return mgr_->stats();
}

std::string Ucma::StatsText() {
  const CmStats st = stats();
  std::string out;
  char line[160];
#define DROCE_CM_STAT_LINE(name, desc)                                                                  \
  if (st.name != 0) {                                                                                   \
    std::snprintf(line, sizeof(line), "%-16s %12llu  %s\n", #name, static_cast<unsigned long long>(st.name), \
                  desc);                                                                                \
    out += line;                                                                                        \
  }
  DROCE_CM_STATS(DROCE_CM_STAT_LINE)
#undef DROCE_CM_STAT_LINE
  return out;
}

bool Ucma::HasChannel(uint64_t key) {
  std::lock_guard<std::mutex> l(mu_);
  return ChannelOf(key) != nullptr;
}

Ucma::Result Ucma::Command(uint64_t key, uint32_t cmd, const uint8_t* in, size_t in_len, size_t out_len,
                           std::span<const uint8_t> optval) {
  Result r;
  {
    std::lock_guard<std::mutex> l(mu_);
    Channel* ch = ChannelOf(key);
    if (ch == nullptr) {
      r.rc = -EBADF;
    } else if (cmd == RDMA_USER_CM_CMD_GET_EVENT) {
      r.rc = GetEvent(ch, in, in_len, out_len, &r);
    } else {
      r.rc = Dispatch(ch, cmd, in, in_len, out_len, optval, &r);
      rearm_ = true;
    }
    if (r.rc != 0) r.len = 0, r.response = 0;
  }
  cv_.notify_one();
  return r;
}

int Ucma::GetEvent(Channel* ch, const uint8_t* in, size_t in_len, size_t out_len, Result* r) {
  if (in_len < sizeof(rdma_ucm_get_event)) return -EINVAL;
  const auto c = cmd_as<rdma_ucm_get_event>(in);
  if (out_len < sizeof(rdma_ucm_event_resp)) return -ENOSPC;
  if (ch->events.empty()) return -EAGAIN;
  Queued q = ch->events.front();
  ch->events.pop_front();
  if (q.dead) return -EAGAIN;
  const Event& e = q.ev;
  rdma_ucm_event_resp resp{};
  resp.id = e.mc != 0 ? e.mc : e.id;
  resp.event = e.event;
  resp.status = static_cast<uint32_t>(e.status);
  if (e.event == kConnectRequest) {
    auto p = ids_.find(e.parent);
    resp.uid = p != ids_.end() ? p->second.uid : 0;
    resp.id = e.id;
  } else if (e.mc != 0) {
    auto m = mcs_.find(e.mc);
    if (m == mcs_.end()) return -EAGAIN;
    resp.uid = m->second.uid;
    ++m->second.events_reported;
  } else {
    auto it = ids_.find(e.id);
    if (it == ids_.end()) return -EAGAIN;
    resp.uid = it->second.uid;
  }
  if (e.ud) {
    resp.param.ud.qp_num = e.param.qp_num;
    resp.param.ud.qkey = e.param.qkey;
    fill_ah(e.param.ah, &resp.param.ud.ah_attr);
    std::memcpy(resp.param.ud.private_data, e.param.private_data, sizeof(resp.param.ud.private_data));
    resp.param.ud.private_data_len = e.param.private_data_len;
  } else {
    fill_conn(e.param, &resp.param.conn);
  }
  // The event counts for its id (the listener's, for CONNECT_REQUEST; the
  // join's and its id's for a multicast event), as the kernel's ucma.
  const uint32_t counted = e.event == kConnectRequest ? e.parent : e.id;
  if (auto it = ids_.find(counted); it != ids_.end()) ++it->second.events_reported;
  return Respond(r, c.response, &resp, sizeof(resp));
}

int Ucma::Dispatch(Channel* ch, uint32_t cmd, const uint8_t* in, size_t in_len, size_t out_len,
                   std::span<const uint8_t> optval, Result* r) {
  auto need = [&](size_t n) { return in_len >= n; };
  switch (cmd) {
    case RDMA_USER_CM_CMD_CREATE_ID: {
      if (!need(sizeof(rdma_ucm_create_id))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_create_id>(in);
      if (out_len < sizeof(rdma_ucm_create_id_resp)) return -ENOSPC;
      uint32_t id;
      const int rc = mgr_->CreateId(c.ps, c.qp_type, &id);
      if (rc != 0) return rc;
      rdma_ucm_create_id_resp resp{id};
      ids_[id] = IdInfo{ch, c.uid, 0};
      return Respond(r, c.response, &resp, sizeof(resp));
    }
    case RDMA_USER_CM_CMD_DESTROY_ID: {
      if (!need(sizeof(rdma_ucm_destroy_id))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_destroy_id>(in);
      if (out_len < sizeof(rdma_ucm_destroy_id_resp)) return -ENOSPC;
      IdInfo* info = Own(ch, c.id);
      if (info == nullptr) return -EINVAL;
      rdma_ucm_destroy_id_resp resp{info->events_reported};
      DestroyLocked(c.id);
      return Respond(r, c.response, &resp, sizeof(resp));
    }
    case RDMA_USER_CM_CMD_BIND_IP: {
      if (!need(sizeof(rdma_ucm_bind_ip))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_bind_ip>(in);
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      IpAddr a;
      if (!from_sockaddr(reinterpret_cast<const sockaddr*>(&c.addr), sizeof(c.addr), &a)) return -EAFNOSUPPORT;
      return mgr_->Bind(c.id, a);
    }
    case RDMA_USER_CM_CMD_BIND: {
      if (!need(sizeof(rdma_ucm_bind))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_bind>(in);
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      IpAddr a;
      // AF_IB addresses are not offered (librdmacm then uses the IP commands).
      if (!from_sockaddr(reinterpret_cast<const sockaddr*>(&c.addr), std::min<size_t>(c.addr_size, sizeof(c.addr)), &a))
        return -EAFNOSUPPORT;
      return mgr_->Bind(c.id, a);
    }
    case RDMA_USER_CM_CMD_RESOLVE_IP: {
      if (!need(sizeof(rdma_ucm_resolve_ip))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_resolve_ip>(in);
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      IpAddr src, dst;
      const bool has_src = from_sockaddr(reinterpret_cast<const sockaddr*>(&c.src_addr), sizeof(c.src_addr), &src);
      if (!from_sockaddr(reinterpret_cast<const sockaddr*>(&c.dst_addr), sizeof(c.dst_addr), &dst))
        return -EAFNOSUPPORT;
      return mgr_->ResolveAddr(c.id, has_src ? &src : nullptr, dst, c.timeout_ms);
    }
    case RDMA_USER_CM_CMD_RESOLVE_ADDR: {
      if (!need(sizeof(rdma_ucm_resolve_addr))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_resolve_addr>(in);
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      IpAddr src, dst;
      const bool has_src = c.src_size != 0 &&
                           from_sockaddr(reinterpret_cast<const sockaddr*>(&c.src_addr),
                                             std::min<size_t>(c.src_size, sizeof(c.src_addr)), &src);
      if (!from_sockaddr(reinterpret_cast<const sockaddr*>(&c.dst_addr),
                             std::min<size_t>(c.dst_size, sizeof(c.dst_addr)), &dst))
        return -EAFNOSUPPORT;
      return mgr_->ResolveAddr(c.id, has_src ? &src : nullptr, dst, c.timeout_ms);
    }
    case RDMA_USER_CM_CMD_RESOLVE_ROUTE: {
      if (!need(sizeof(rdma_ucm_resolve_route))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_resolve_route>(in);
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      return mgr_->ResolveRoute(c.id, c.timeout_ms);
    }
    case RDMA_USER_CM_CMD_QUERY_ROUTE: {
      if (!need(sizeof(rdma_ucm_query))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_query>(in);
      if (out_len < sizeof(rdma_ucm_query_route_resp)) return -ENOSPC;
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      RouteInfo route;
      const int rc = mgr_->QueryRoute(c.id, &route);
      if (rc != 0) return rc;
      rdma_ucm_query_route_resp resp{};
      resp.node_guid = htobe64(route.node_guid);
      to_sockaddr(route.src, &resp.src_addr);
      to_sockaddr(route.dst, &resp.dst_addr);
      resp.num_paths = route.num_paths;
      resp.port_num = route.dev >= 0 ? 1 : 0;
      resp.ibdev_index = route.dev >= 0 ? static_cast<uint32_t>(route.dev) : 0xFFFFFFFFu;
      ib_user_path_rec& path = resp.ib_route[0];
      std::memcpy(path.sgid, route.sgid.data(), 16);
      std::memcpy(path.dgid, route.dgid.data(), 16);
      path.pkey = htons(0xFFFF);
      path.mtu = route.mtu;
      path.mtu_selector = 2;
      path.hop_limit = route.hop_limit;
      path.traffic_class = route.traffic_class;
      path.numb_path = 1;
      path.reversible = 1;
      path.rate = 0;
      path.rate_selector = 2;
      path.packet_life_time = route.packet_life_time;
      path.packet_life_time_selector = 2;
      return Respond(r, c.response, &resp, sizeof(resp));
    }
    case RDMA_USER_CM_CMD_CONNECT: {
      if (!need(offsetof(rdma_ucm_connect, ece))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_connect>(in);
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      if (!c.conn_param.valid) return -EINVAL;
      return mgr_->Connect(c.id, conn_from(c.conn_param));
    }
    case RDMA_USER_CM_CMD_LISTEN: {
      if (!need(sizeof(rdma_ucm_listen))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_listen>(in);
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      return mgr_->Listen(c.id, static_cast<int>(c.backlog));
    }
    case RDMA_USER_CM_CMD_ACCEPT: {
      if (!need(offsetof(rdma_ucm_accept, ece))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_accept>(in);
      IdInfo* info = Own(ch, c.id);
      if (info == nullptr) return -EINVAL;
      if (!c.conn_param.valid) return mgr_->Accept(c.id, nullptr);
      const ConnParam p = conn_from(c.conn_param);
      const int rc = mgr_->Accept(c.id, &p);
      if (rc == 0) info->uid = c.uid;
      return rc;
    }
    case RDMA_USER_CM_CMD_REJECT: {
      if (!need(sizeof(rdma_ucm_reject))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_reject>(in);
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      return mgr_->Reject(c.id, c.reason, c.private_data, c.private_data_len);
    }
    case RDMA_USER_CM_CMD_DISCONNECT: {
      if (!need(sizeof(rdma_ucm_disconnect))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_disconnect>(in);
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      return mgr_->Disconnect(c.id);
    }
    case RDMA_USER_CM_CMD_INIT_QP_ATTR: {
      if (!need(sizeof(rdma_ucm_init_qp_attr))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_init_qp_attr>(in);
      if (out_len < sizeof(ib_uverbs_qp_attr)) return -ENOSPC;
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      QpAttr a;
      const int rc = mgr_->InitQpAttr(c.id, c.qp_state, &a);
      if (rc != 0) return rc;
      ib_uverbs_qp_attr resp{};
      resp.qp_attr_mask = a.mask;
      resp.qp_state = a.qp_state;
      resp.path_mtu = a.path_mtu;
      resp.qkey = a.qkey;
      resp.rq_psn = a.rq_psn;
      resp.sq_psn = a.sq_psn;
      resp.dest_qp_num = a.dest_qp_num;
      resp.qp_access_flags = a.access;
      fill_ah(a.ah, &resp.ah_attr);
      resp.pkey_index = a.pkey_index;
      resp.max_rd_atomic = a.max_rd_atomic;
      resp.max_dest_rd_atomic = a.max_dest_rd_atomic;
      resp.min_rnr_timer = a.min_rnr_timer;
      resp.port_num = a.port_num;
      resp.timeout = a.timeout;
      resp.retry_cnt = a.retry_cnt;
      resp.rnr_retry = a.rnr_retry;
      return Respond(r, c.response, &resp, sizeof(resp));
    }
    case RDMA_USER_CM_CMD_SET_OPTION: {
      if (!need(sizeof(rdma_ucm_set_option))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_set_option>(in);
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      if (optval.size() != c.optlen) return -EINVAL;
      return mgr_->SetOption(c.id, c.level, c.optname, optval.data(), optval.size());
    }
    case RDMA_USER_CM_CMD_NOTIFY: {
      if (!need(sizeof(rdma_ucm_notify))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_notify>(in);
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      return mgr_->Notify(c.id, c.event);
    }
    case RDMA_USER_CM_CMD_JOIN_IP_MCAST:
    case RDMA_USER_CM_CMD_JOIN_MCAST: {
      uint64_t response, uid;
      uint32_t id;
      IpAddr group;
      bool ok;
      if (cmd == RDMA_USER_CM_CMD_JOIN_IP_MCAST) {
        if (!need(sizeof(rdma_ucm_join_ip_mcast))) return -EINVAL;
        auto c = cmd_as<rdma_ucm_join_ip_mcast>(in);
        response = c.response, uid = c.uid, id = c.id;
        ok = from_sockaddr(reinterpret_cast<const sockaddr*>(&c.addr), sizeof(c.addr), &group);
      } else {
        if (!need(sizeof(rdma_ucm_join_mcast))) return -EINVAL;
        auto c = cmd_as<rdma_ucm_join_mcast>(in);
        if (c.join_flags >= RDMA_MC_JOIN_FLAG_RESERVED) return -EINVAL;
        response = c.response, uid = c.uid, id = c.id;
        ok = from_sockaddr(reinterpret_cast<const sockaddr*>(&c.addr),
                               std::min<size_t>(c.addr_size, sizeof(c.addr)), &group);
      }
      if (out_len < sizeof(rdma_ucm_create_id_resp)) return -ENOSPC;
      if (Own(ch, id) == nullptr) return -EINVAL;
      if (!ok) return -EAFNOSUPPORT;
      // The join's own entry first: its MULTICAST_JOIN event names it.
      uint32_t mc = 0;
      const int rc = mgr_->JoinMulticast(id, group, &mc);
      if (rc != 0) return rc;
      mcs_[mc] = McInfo{uid, id, 0};
      rdma_ucm_create_id_resp resp{mc};
      return Respond(r, response, &resp, sizeof(resp));
    }
    case RDMA_USER_CM_CMD_LEAVE_MCAST: {
      if (!need(sizeof(rdma_ucm_destroy_id))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_destroy_id>(in);
      if (out_len < sizeof(rdma_ucm_destroy_id_resp)) return -ENOSPC;
      auto it = mcs_.find(c.id);
      if (it == mcs_.end() || Own(ch, it->second.id) == nullptr) return -ENOENT;
      uint32_t parent;
      const int rc = mgr_->LeaveMulticast(c.id, &parent);
      if (rc != 0) return rc;
      rdma_ucm_destroy_id_resp resp{it->second.events_reported};
      for (Queued& q : ch->events) q.dead |= q.ev.mc == c.id;
      mcs_.erase(it);
      return Respond(r, c.response, &resp, sizeof(resp));
    }
    case RDMA_USER_CM_CMD_MIGRATE_ID: {
      // Written to the new channel; fd names the id's current one.
      if (!need(sizeof(rdma_ucm_migrate_id))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_migrate_id>(in);
      if (out_len < sizeof(rdma_ucm_migrate_resp)) return -ENOSPC;
      // The old channel's key: this one's with the fd the command names.
      Channel* from = ChannelOf((ch->key & ~uint64_t{0xFFFFFFFF}) | c.fd);
      if (from == nullptr) return -ENOENT;
      IdInfo* info = Own(from, c.id);
      if (info == nullptr) return -EINVAL;
      if (from != ch) {
        // Its queued events move along, in order.
        for (Queued& q : from->events) {
          if (q.dead || (q.ev.id != c.id && !(q.ev.event == kConnectRequest && q.ev.parent == c.id))) continue;
          q.dead = true;
          ch->events.push_back({q.ev, false});
          Notify(ch);
        }
        for (auto& [id, other] : ids_) {
          if (other.ch == from && id != c.id) {
            // Conn ids whose CONNECT_REQUEST moved follow it.
            for (const Queued& q : ch->events) {
              if (q.ev.event == kConnectRequest && q.ev.id == id && q.ev.parent == c.id) other.ch = ch;
            }
          }
        }
        info->ch = ch;
      }
      rdma_ucm_migrate_resp resp{info->events_reported};
      return Respond(r, c.response, &resp, sizeof(resp));
    }
    case RDMA_USER_CM_CMD_QUERY:
    case RDMA_USER_CM_CMD_GET_OPTION:
      // Only librdmacm's AF_IB paths use QUERY, and droce offers no AF_IB.
      return -ENOSYS;
    default:
      return -ENOSYS;
  }
}

}  // namespace droce::cm
