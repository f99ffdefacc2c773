// librdmacm's kernel interface, served inside the process. Debian's
// unmodified librdmacm opens /dev/infiniband/rdma_cm (sysfs_view.cc hands
// the open here), checks with fstat that it is a character device, and then
// speaks rdma_ucm: fixed command structs written with write(), responses
// written back through the user pointer each command carries, events
// fetched with the blocking GET_EVENT command, the fd polled for POLLIN.
//
// Each channel is an eventfd in semaphore mode: it counts the channel's
// queued events, so poll/epoll/select and O_NONBLOCK behave as on the
// kernel's device, and a blocking GET_EVENT is a blocking read of it.
// write, close and fstat are interposed; on any other fd they cost one
// bitmap test. The commands go to one cm::Manager (src/cm/) per process,
// under one mutex, with a thread that feeds it the MADs the engine receives
// on QP1 and runs its timers.
//
// Embedded mode only: in client mode the engine (and QP1) is droced's, and
// opening the device fails with ENODEV (docs/FEATURES.md).
#undef _FORTIFY_SOURCE
#undef _FILE_OFFSET_BITS
#include "rdma_cm.h"

#include <fcntl.h>
// glibc's netinet/in.h first: the kernel's UAPI headers below then leave
// sockaddr_in6 & co. to it.
#include <netinet/in.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>
#include <rdma/rdma_user_cm.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cm/manager.h"
#include "common/log.h"
#include "engine/device.h"
#include "interpose.h"
#include "sessions.h"

extern "C" {
int __fxstat(int ver, int fd, struct stat* buf);
int __fxstat64(int ver, int fd, struct stat64* buf);
}

namespace droce::provider {
namespace {

constexpr int kMaxFds = 1 << 16;

// Which fds are channels: one bit each, read without a lock on every write
// and close of the process.
std::atomic<uint64_t> channel_bits[kMaxFds / 64];

bool is_channel_fd(int fd) {
  return fd >= 0 && fd < kMaxFds &&
         (channel_bits[fd / 64].load(std::memory_order_acquire) & (uint64_t{1} << (fd % 64))) != 0;
}
void mark_fd(int fd, bool on) {
  const uint64_t bit = uint64_t{1} << (fd % 64);
  if (on) channel_bits[fd / 64].fetch_or(bit, std::memory_order_release);
  else channel_bits[fd / 64].fetch_and(~bit, std::memory_order_release);
}

uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000 + uint64_t(ts.tv_nsec);
}

// copy_from_user / copy_to_user: a bad pointer is EFAULT, not a crash.
bool copy_in(void* dst, const void* src, size_t n) {
  iovec local{dst, n}, remote{const_cast<void*>(src), n};
  return n == 0 || process_vm_readv(getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(n);
}
bool copy_out(uint64_t dst, const void* src, size_t n) {
  iovec local{const_cast<void*>(src), n}, remote{reinterpret_cast<void*>(dst), n};
  return n == 0 || process_vm_writev(getpid(), &local, 1, &remote, 1, 0) == static_cast<ssize_t>(n);
}

struct Queued {
  cm::Event ev;
  bool dead = false;  // its id was destroyed or migrated: skipped
};

struct Channel {
  int fd = -1;
  std::deque<Queued> events;
};

struct IdInfo {
  Channel* ch = nullptr;
  uint64_t uid = 0;
  uint32_t events_reported = 0;
};

struct McInfo {
  uint64_t uid = 0;
  uint32_t id = 0;
  uint32_t events_reported = 0;
};

class Cm;

// One droce port as the manager sees it.
class Port final : public cm::PortIo, public engine::GsiSink {
 public:
  Port(Cm* cm, int dev, engine::Device* device) : cm_(cm), dev_(dev), device_(device) {}
  void SendMad(const cm::Gid& sgid, const cm::Gid& dgid, uint32_t dqpn, uint8_t tclass,
               std::span<const uint8_t, cm::kMadSize> mad) override {
    wire::Ipv6Addr s, d;
    std::memcpy(s.data(), sgid.data(), 16);
    std::memcpy(d.data(), dgid.data(), 16);
    device_->SendGsi(s, d, dqpn, tclass, mad.data());
  }
  int Resolve(const cm::Gid& dgid) override {
    wire::Ipv6Addr d;
    std::memcpy(d.data(), dgid.data(), 16);
    return device_->ResolveNeighbor(d);
  }
  void OnGsi(const engine::GsiMad& mad) override;

 private:
  Cm* cm_;
  int dev_;
  engine::Device* device_;
};

class Cm {
 public:
  static Cm* Get(int* err);

  int Open(int flags);
  void Close(int fd);
  ssize_t Write(int fd, const void* buf, size_t len);
  void Inbound(int dev, const engine::GsiMad& mad);

 private:
  Cm();
  int Start();
  void Loop();
  void Deliver(const cm::Event& e);
  void Purge(Channel* ch, uint32_t id);
  void DestroyLocked(uint32_t id);
  void Kick() { cv_.notify_one(); }
  int Command(Channel* ch, uint32_t cmd, const uint8_t* in, size_t in_len, size_t out_len);
  int GetEvent(Channel* ch, uint64_t response, size_t out_len);
  Channel* ChannelOf(int fd) const {
    auto it = channels_.find(fd);
    return it == channels_.end() ? nullptr : it->second.get();
  }
  // The id if it belongs to this channel (the kernel's ucma_get_ctx).
  IdInfo* Own(Channel* ch, uint32_t id) {
    auto it = ids_.find(id);
    return it == ids_.end() || it->second.ch != ch ? nullptr : &it->second;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<cm::Manager> mgr_;
  std::vector<std::unique_ptr<Port>> ports_;
  absl::flat_hash_map<int, std::unique_ptr<Channel>> channels_;
  absl::flat_hash_map<uint32_t, IdInfo> ids_;
  absl::flat_hash_map<uint32_t, McInfo> mcs_;
  struct In {
    int dev;
    engine::GsiMad mad;
  };
  std::deque<In> inbox_;  // under mu_
  bool rearm_ = false;
};

void Port::OnGsi(const engine::GsiMad& mad) { cm_->Inbound(dev_, mad); }

Cm::Cm() = default;

Cm* Cm::Get(int* err) {
  static Cm* cm = nullptr;
  static int start_err = 0;
  static std::once_flag once;
  std::call_once(once, [] {
    cm = new Cm();  // lives until exit: the thread and the engines' sinks use it
    start_err = cm->Start();
  });
  *err = start_err;
  return start_err == 0 ? cm : nullptr;
}

int Cm::Start() {
  if (!daemon_socket().empty()) return ENODEV;  // the CM would be droced's (not built yet)
  if (!check_config().ok()) return ENODEV;
  mgr_ = std::make_unique<cm::Manager>([this](const cm::Event& e) { Deliver(e); }, now_ns,
                                       std::random_device{}() ^ now_ns());
  const int n = device_count();
  for (int i = 0; i < n; ++i) {
    auto s = session_for(i);
    if (!s.ok()) continue;
    auto* dev = dynamic_cast<engine::Device*>(*s);
    if (dev == nullptr) continue;
    const engine::PortInfo& p = dev->port();
    cm::LocalPort lp;
    lp.dev = i;
    lp.node_guid = node_guid_host(p);
    lp.ip4 = p.ip;
    lp.prefix_len = p.prefix_len;
    lp.has_ip6 = p.gid_count > 1;
    std::memcpy(lp.ip6.data(), p.gids[1], 16);
    lp.active_mtu = p.active_mtu;
    auto port = std::make_unique<Port>(this, i, dev);
    mgr_->AddPort(lp, port.get());
    dev->SetGsiSink(port.get());
    ports_.push_back(std::move(port));
  }
  if (ports_.empty()) return ENODEV;
  std::thread([this] { Loop(); }).detach();
  return 0;
}

void Cm::Loop() {
  std::unique_lock<std::mutex> l(mu_);
  uint64_t next = 0;
  for (;;) {
    auto ready = [this] { return !inbox_.empty() || rearm_; };
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
      cm::MadSource src;
      std::memcpy(src.sgid.data(), in.mad.sgid.data(), 16);
      std::memcpy(src.dgid.data(), in.mad.dgid.data(), 16);
      src.src_qpn = in.mad.src_qpn;
      src.tclass = in.mad.tclass;
      src.hop_limit = in.mad.hop_limit;
      mgr_->OnMad(in.dev, src, {in.mad.mad, cm::kMadSize});
    }
    next = mgr_->OnTimer();
  }
}

void Cm::Inbound(int dev, const engine::GsiMad& mad) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (inbox_.size() >= 65536) return;  // a flood: the peers retry
    inbox_.push_back({dev, mad});
  }
  Kick();
}

// An event from the manager (mu_ held): onto the channel of its id.
void Cm::Deliver(const cm::Event& e) {
  Channel* ch = nullptr;
  if (e.event == cm::kConnectRequest) {
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
  const uint64_t one = 1;
  (void)!REAL(write)(ch->fd, &one, sizeof(one));
}

// Drops the queued events of `id` (destroy, migrate); the CONNECT_REQUESTs
// it got that the application never saw take their new ids with them.
void Cm::Purge(Channel* ch, uint32_t id) {
  for (Queued& q : ch->events) {
    if (q.dead) continue;
    if (q.ev.event == cm::kConnectRequest && q.ev.parent == id) {
      q.dead = true;
      DestroyLocked(q.ev.id);
    } else if (q.ev.id == id) {
      q.dead = true;
    }
  }
}

void Cm::DestroyLocked(uint32_t id) {
  auto it = ids_.find(id);
  if (it != ids_.end()) {
    Channel* ch = it->second.ch;
    ids_.erase(it);
    Purge(ch, id);
  }
  absl::erase_if(mcs_, [id](const auto& kv) { return kv.second.id == id; });
  mgr_->DestroyId(id);
}

int Cm::Open(int flags) {
  int efd_flags = EFD_SEMAPHORE;
  if (flags & O_CLOEXEC) efd_flags |= EFD_CLOEXEC;
  if (flags & O_NONBLOCK) efd_flags |= EFD_NONBLOCK;
  const int fd = eventfd(0, efd_flags);
  if (fd < 0) return -1;
  if (fd >= kMaxFds) {
    REAL(close)(fd);
    errno = EMFILE;
    return -1;
  }
  std::lock_guard<std::mutex> l(mu_);
  auto ch = std::make_unique<Channel>();
  ch->fd = fd;
  channels_[fd] = std::move(ch);
  mark_fd(fd, true);
  return fd;
}

// The kernel's ucma_close: every id of the channel is destroyed.
void Cm::Close(int fd) {
  std::lock_guard<std::mutex> l(mu_);
  Channel* ch = ChannelOf(fd);
  if (ch == nullptr) return;
  std::vector<uint32_t> mine;
  for (const auto& [id, info] : ids_) {
    if (info.ch == ch) mine.push_back(id);
  }
  for (uint32_t id : mine) DestroyLocked(id);
  mark_fd(fd, false);
  channels_.erase(fd);
}

ssize_t Cm::Write(int fd, const void* buf, size_t len) {
  rdma_ucm_cmd_hdr hdr;
  if (len < sizeof(hdr)) {
    errno = EINVAL;
    return -1;
  }
  if (!copy_in(&hdr, buf, sizeof(hdr))) {
    errno = EFAULT;
    return -1;
  }
  if (hdr.in + sizeof(hdr) > len) {
    errno = EINVAL;
    return -1;
  }
  uint8_t in[512] = {};
  const size_t in_len = std::min<size_t>(hdr.in, sizeof(in));
  if (!copy_in(in, static_cast<const uint8_t*>(buf) + sizeof(hdr), in_len)) {
    errno = EFAULT;
    return -1;
  }
  int rc;
  if (hdr.cmd == RDMA_USER_CM_CMD_GET_EVENT) {
    rdma_ucm_get_event c{};
    std::memcpy(&c, in, std::min(sizeof(c), in_len));
    Channel* ch;
    {
      std::lock_guard<std::mutex> l(mu_);
      ch = ChannelOf(fd);
    }
    rc = ch == nullptr ? -EBADF : GetEvent(ch, c.response, hdr.out);
  } else {
    std::lock_guard<std::mutex> l(mu_);
    Channel* ch = ChannelOf(fd);
    rc = ch == nullptr ? -EBADF : Command(ch, hdr.cmd, in, in_len, hdr.out);
    rearm_ = true;
  }
  Kick();
  if (rc < 0) {
    errno = -rc;
    return -1;
  }
  return static_cast<ssize_t>(len);
}

void fill_ah(const cm::AhInfo& a, ib_uverbs_ah_attr* out) {
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

void fill_conn(const cm::ConnParam& p, rdma_ucm_conn_param* out) {
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

cm::ConnParam conn_from(const rdma_ucm_conn_param& c) {
  cm::ConnParam p;
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

int Cm::GetEvent(Channel* ch, uint64_t response, size_t out_len) {
  if (out_len < sizeof(rdma_ucm_event_resp)) return -ENOSPC;
  for (;;) {
    // One queued event per count: blocks (or EAGAIN) as the device's read.
    uint64_t one;
    if (read(ch->fd, &one, sizeof(one)) != sizeof(one)) return errno == EINTR ? -EINTR : -errno;
    std::lock_guard<std::mutex> l(mu_);
    if (ChannelOf(ch->fd) != ch) return -EBADF;  // closed meanwhile
    if (ch->events.empty()) continue;
    Queued q = ch->events.front();
    ch->events.pop_front();
    if (q.dead) continue;
    const cm::Event& e = q.ev;
    rdma_ucm_event_resp resp{};
    resp.id = e.mc != 0 ? e.mc : e.id;
    resp.event = e.event;
    resp.status = static_cast<uint32_t>(e.status);
    if (e.event == cm::kConnectRequest) {
      auto p = ids_.find(e.parent);
      resp.uid = p != ids_.end() ? p->second.uid : 0;
      resp.id = e.id;
    } else if (e.mc != 0) {
      auto m = mcs_.find(e.mc);
      if (m == mcs_.end()) continue;
      resp.uid = m->second.uid;
      ++m->second.events_reported;
    } else {
      auto it = ids_.find(e.id);
      if (it == ids_.end()) continue;
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
    // The event counts for its id (the listener's, for CONNECT_REQUEST).
    const uint32_t counted = e.event == cm::kConnectRequest ? e.parent : e.id;
    if (auto it = ids_.find(counted); it != ids_.end()) ++it->second.events_reported;
    if (!copy_out(response, &resp, sizeof(resp))) return -EFAULT;
    return 0;
  }
}

template <typename T>
T cmd_as(const uint8_t* in) {
  T t;
  std::memcpy(&t, in, sizeof(T));
  return t;
}

int Cm::Command(Channel* ch, uint32_t cmd, const uint8_t* in, size_t in_len, size_t out_len) {
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
      if (!copy_out(c.response, &resp, sizeof(resp))) {
        mgr_->DestroyId(id);
        return -EFAULT;
      }
      ids_[id] = IdInfo{ch, c.uid, 0};
      return 0;
    }
    case RDMA_USER_CM_CMD_DESTROY_ID: {
      if (!need(sizeof(rdma_ucm_destroy_id))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_destroy_id>(in);
      if (out_len < sizeof(rdma_ucm_destroy_id_resp)) return -ENOSPC;
      IdInfo* info = Own(ch, c.id);
      if (info == nullptr) return -EINVAL;
      rdma_ucm_destroy_id_resp resp{info->events_reported};
      DestroyLocked(c.id);
      return copy_out(c.response, &resp, sizeof(resp)) ? 0 : -EFAULT;
    }
    case RDMA_USER_CM_CMD_BIND_IP: {
      if (!need(sizeof(rdma_ucm_bind_ip))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_bind_ip>(in);
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      cm::IpAddr a;
      if (!cm::from_sockaddr(reinterpret_cast<const sockaddr*>(&c.addr), sizeof(c.addr), &a)) return -EAFNOSUPPORT;
      return mgr_->Bind(c.id, a);
    }
    case RDMA_USER_CM_CMD_BIND: {
      if (!need(sizeof(rdma_ucm_bind))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_bind>(in);
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      cm::IpAddr a;
      // AF_IB addresses are not offered (librdmacm then uses the IP commands).
      if (!cm::from_sockaddr(reinterpret_cast<const sockaddr*>(&c.addr), std::min<size_t>(c.addr_size, sizeof(c.addr)), &a))
        return -EAFNOSUPPORT;
      return mgr_->Bind(c.id, a);
    }
    case RDMA_USER_CM_CMD_RESOLVE_IP: {
      if (!need(sizeof(rdma_ucm_resolve_ip))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_resolve_ip>(in);
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      cm::IpAddr src, dst;
      const bool has_src = cm::from_sockaddr(reinterpret_cast<const sockaddr*>(&c.src_addr), sizeof(c.src_addr), &src);
      if (!cm::from_sockaddr(reinterpret_cast<const sockaddr*>(&c.dst_addr), sizeof(c.dst_addr), &dst))
        return -EAFNOSUPPORT;
      return mgr_->ResolveAddr(c.id, has_src ? &src : nullptr, dst, c.timeout_ms);
    }
    case RDMA_USER_CM_CMD_RESOLVE_ADDR: {
      if (!need(sizeof(rdma_ucm_resolve_addr))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_resolve_addr>(in);
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      cm::IpAddr src, dst;
      const bool has_src = c.src_size != 0 &&
                           cm::from_sockaddr(reinterpret_cast<const sockaddr*>(&c.src_addr),
                                             std::min<size_t>(c.src_size, sizeof(c.src_addr)), &src);
      if (!cm::from_sockaddr(reinterpret_cast<const sockaddr*>(&c.dst_addr),
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
      cm::RouteInfo r;
      const int rc = mgr_->QueryRoute(c.id, &r);
      if (rc != 0) return rc;
      rdma_ucm_query_route_resp resp{};
      resp.node_guid = htobe64(r.node_guid);
      cm::to_sockaddr(r.src, &resp.src_addr);
      cm::to_sockaddr(r.dst, &resp.dst_addr);
      resp.num_paths = r.num_paths;
      resp.port_num = r.dev >= 0 ? 1 : 0;
      resp.ibdev_index = r.dev >= 0 ? static_cast<uint32_t>(r.dev) : 0xFFFFFFFFu;
      ib_user_path_rec& path = resp.ib_route[0];
      std::memcpy(path.sgid, r.sgid.data(), 16);
      std::memcpy(path.dgid, r.dgid.data(), 16);
      path.pkey = htons(0xFFFF);
      path.mtu = r.mtu;
      path.mtu_selector = 2;
      path.hop_limit = r.hop_limit;
      path.traffic_class = r.traffic_class;
      path.numb_path = 1;
      path.reversible = 1;
      path.rate = 0;
      path.rate_selector = 2;
      path.packet_life_time = r.packet_life_time;
      path.packet_life_time_selector = 2;
      return copy_out(c.response, &resp, sizeof(resp)) ? 0 : -EFAULT;
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
      const cm::ConnParam p = conn_from(c.conn_param);
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
      cm::QpAttr a;
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
      return copy_out(c.response, &resp, sizeof(resp)) ? 0 : -EFAULT;
    }
    case RDMA_USER_CM_CMD_SET_OPTION: {
      if (!need(sizeof(rdma_ucm_set_option))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_set_option>(in);
      if (Own(ch, c.id) == nullptr) return -EINVAL;
      if (c.optlen > 4096) return -EINVAL;
      std::vector<uint8_t> value(c.optlen);
      if (!copy_in(value.data(), reinterpret_cast<const void*>(c.optval), c.optlen)) return -EFAULT;
      return mgr_->SetOption(c.id, c.level, c.optname, value.data(), value.size());
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
      cm::IpAddr group;
      bool ok;
      if (cmd == RDMA_USER_CM_CMD_JOIN_IP_MCAST) {
        if (!need(sizeof(rdma_ucm_join_ip_mcast))) return -EINVAL;
        auto c = cmd_as<rdma_ucm_join_ip_mcast>(in);
        response = c.response, uid = c.uid, id = c.id;
        ok = cm::from_sockaddr(reinterpret_cast<const sockaddr*>(&c.addr), sizeof(c.addr), &group);
      } else {
        if (!need(sizeof(rdma_ucm_join_mcast))) return -EINVAL;
        auto c = cmd_as<rdma_ucm_join_mcast>(in);
        if (c.join_flags >= RDMA_MC_JOIN_FLAG_RESERVED) return -EINVAL;
        response = c.response, uid = c.uid, id = c.id;
        ok = cm::from_sockaddr(reinterpret_cast<const sockaddr*>(&c.addr),
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
      return copy_out(response, &resp, sizeof(resp)) ? 0 : -EFAULT;
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
      return copy_out(c.response, &resp, sizeof(resp)) ? 0 : -EFAULT;
    }
    case RDMA_USER_CM_CMD_MIGRATE_ID: {
      // Written to the new channel; fd names the id's current one.
      if (!need(sizeof(rdma_ucm_migrate_id))) return -EINVAL;
      auto c = cmd_as<rdma_ucm_migrate_id>(in);
      if (out_len < sizeof(rdma_ucm_migrate_resp)) return -ENOSPC;
      Channel* from = ChannelOf(static_cast<int>(c.fd));
      if (from == nullptr) return -ENOENT;
      IdInfo* info = Own(from, c.id);
      if (info == nullptr) return -EINVAL;
      if (from != ch) {
        // Its queued events move along, in order.
        for (Queued& q : from->events) {
          if (q.dead || (q.ev.id != c.id && !(q.ev.event == cm::kConnectRequest && q.ev.parent == c.id))) continue;
          q.dead = true;
          ch->events.push_back({q.ev, false});
          const uint64_t one = 1;
          (void)!REAL(write)(ch->fd, &one, sizeof(one));
        }
        for (auto& [id, other] : ids_) {
          if (other.ch == from && id != c.id) {
            // Conn ids whose CONNECT_REQUEST moved follow it.
            for (const Queued& q : ch->events) {
              if (q.ev.event == cm::kConnectRequest && q.ev.id == id && q.ev.parent == c.id) other.ch = ch;
            }
          }
        }
        info->ch = ch;
      }
      rdma_ucm_migrate_resp resp{info->events_reported};
      return copy_out(c.response, &resp, sizeof(resp)) ? 0 : -EFAULT;
    }
    case RDMA_USER_CM_CMD_QUERY:
    case RDMA_USER_CM_CMD_GET_OPTION:
      // Only librdmacm's AF_IB paths use QUERY, and droce offers no AF_IB.
      return -ENOSYS;
    default:
      return -ENOSYS;
  }
}

}  // namespace

int cm_open_channel(int flags) {
  int err = 0;
  Cm* cm = Cm::Get(&err);
  if (cm == nullptr) {
    errno = err;
    return -1;
  }
  return cm->Open(flags);
}

}  // namespace droce::provider

using droce::provider::is_channel_fd;

extern "C" {

ssize_t write(int fd, const void* buf, size_t len) {
  if (is_channel_fd(fd)) {
    int err = 0;
    if (auto* cm = droce::provider::Cm::Get(&err)) return cm->Write(fd, buf, len);
  }
  return REAL(write)(fd, buf, len);
}

int close(int fd) {
  if (is_channel_fd(fd)) {
    int err = 0;
    if (auto* cm = droce::provider::Cm::Get(&err)) cm->Close(fd);
  }
  return REAL(close)(fd);
}

static void cm_fake_stat(struct stat* st) {
  st->st_mode = S_IFCHR | 0666;
  struct stat real;
  st->st_rdev = REAL(stat)("/dev/infiniband/rdma_cm", &real) == 0 && S_ISCHR(real.st_mode) ? real.st_rdev
                                                                                          : makedev(10, 58);
}

int fstat(int fd, struct stat* st) {
  const int rc = REAL(fstat)(fd, st);
  if (rc == 0 && is_channel_fd(fd)) cm_fake_stat(st);
  return rc;
}

int fstat64(int fd, struct stat64* st) {
  const int rc = REAL(fstat64)(fd, st);
  if (rc == 0 && is_channel_fd(fd)) cm_fake_stat(reinterpret_cast<struct stat*>(st));
  return rc;
}

int __fxstat(int ver, int fd, struct stat* st) {
  const int rc = REAL(__fxstat)(ver, fd, st);
  if (rc == 0 && is_channel_fd(fd)) cm_fake_stat(st);
  return rc;
}

int __fxstat64(int ver, int fd, struct stat64* st) {
  const int rc = REAL(__fxstat64)(ver, fd, st);
  if (rc == 0 && is_channel_fd(fd)) cm_fake_stat(reinterpret_cast<struct stat*>(st));
  return rc;
}

}  // extern "C"
