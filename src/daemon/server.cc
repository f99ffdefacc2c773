#include "daemon/server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/spin_lock.h"
#include "ctl/protocol.h"
#include "daemon/config_file.h"
#include "queue/shm.h"

namespace droce::daemon {
namespace {

constexpr uint64_t kPage = 4096;

// Whether `more` on top of `held` passes a client limit; 0 is no limit (the
// device's own still applies).
bool Over(uint64_t limit, uint64_t held, uint64_t more) { return limit != 0 && held + more > limit; }

// The client's RLIMIT_MEMLOCK, or 0 for none (CAP_IPC_LOCK or unlimited).
uint64_t memlock_limit(pid_t pid) {
  std::ifstream st(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(st, line)) {
    if (line.rfind("CapEff:", 0) == 0) {
      const uint64_t caps = std::strtoull(line.c_str() + 7, nullptr, 16);
      if (caps & (uint64_t{1} << 14)) return 0;  // CAP_IPC_LOCK
    }
  }
  rlimit rl{};
  if (prlimit(pid, RLIMIT_MEMLOCK, nullptr, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return 0;
  return rl.rlim_cur;
}

ctl::DevInfo dev_info(const engine::Device& d) {
  ctl::DevInfo i{};
  const engine::PortInfo& p = d.port();
  std::snprintf(i.name, sizeof(i.name), "%s", p.name.c_str());
  std::memcpy(i.mac, p.mac.data(), 6);
  i.prefix_len = p.prefix_len;
  i.active_mtu = p.active_mtu;
  i.ip = p.ip;
  i.link_mtu = p.link_mtu;
  std::memcpy(i.gids, p.gids, sizeof(i.gids));
  i.gid_count = p.gid_count;
  i.workers = static_cast<uint32_t>(d.workers());
  i.port_active = d.port_active() ? 1 : 0;
  i.dead = d.dead() ? 1 : 0;
  return i;
}

// A registration's pages as mapped here.
struct MrMap {
  uint8_t* base = nullptr;
  size_t len = 0;
  uint64_t bytes = 0;  // counted against the client's limit
};

}  // namespace

class Server::Client {
 public:
  // One device as this client uses it: its objects, its doorbell queues,
  // and the sink through which the engine reports the client's events.
  struct Dev final : engine::EventSink, cq::CqNotifier {
    Client* c = nullptr;
    uint16_t index = 0;
    engine::Device* dev = nullptr;
    bool attached = false;
    engine::DoorbellSource src;
    queue::ShmRegion db_shm;
    absl::flat_hash_set<uint32_t> pds, mws, qps, srqs, ahs;  // mws by index (rkey >> 8)
    absl::flat_hash_map<uint32_t, uint32_t> cqs;              // id → entries
    absl::flat_hash_map<uint32_t, MrMap> mrs;
    std::vector<std::pair<uint32_t, wire::Ipv6Addr>> mcast;

    void QpEvent(uint64_t cookie, int type) override { c->PushEvent(ctl::kEvQp, index, cookie, type); }
    void SrqEvent(uint64_t cookie, int type) override { c->PushEvent(ctl::kEvSrq, index, cookie, type); }
    // A DEVICE_FATAL of the daemon's stop says so (Server::Run sets
    // stopping_ before it shuts the devices down): the client then opens a
    // new connection for its next device, rather than reuse this one.
    void DeviceEvent(int type) override {
      const bool stopping = type == IBV_EVENT_DEVICE_FATAL && c->srv->stopping_.load(std::memory_order_acquire);
      c->PushEvent(ctl::kEvDevice, index, 0, type, stopping ? ctl::kEvDaemonStopping : 0);
    }
    void NotifyCq(uint64_t cookie) override { c->PushEvent(ctl::kEvCqNotify, index, cookie, 0); }
    void CqError(uint64_t cookie) override { c->PushEvent(ctl::kEvCqError, index, cookie, 0); }
  };

  Client(Server* s, int sock) : srv(s), sock(sock) {}
  ~Client() { Release(); }
  void Release() {
    for (int* fd : {&event_fd, &pidfd, &sock}) {
      if (*fd >= 0) close(*fd);
      *fd = -1;
    }
    ev_ring = queue::Ring();
    ev_shm = queue::ShmRegion();
    for (auto& d : devs) d->db_shm = queue::ShmRegion();
  }

  // Engine threads (and the client's thread): queue one event and poke the
  // client's eventfd. A full ring drops the event (counted); the client
  // reads its ring whenever the eventfd fires.
  void PushEvent(uint32_t kind, uint16_t dev, uint64_t id, int type, uint16_t flags = 0) {
    if (!ev_ring.valid()) return;
    {
      std::lock_guard<SpinLock> l(ev_lock);
      // ev_prod is ours; cons is the client's and only bounds the space.
      if (ev_prod - ev_ring.load_cons_acquire() >= ev_ring.size()) {
        ++ev_dropped;
        return;
      }
      ctl::EventRecord r{kind, dev, flags, static_cast<uint32_t>(id), type};
      std::memcpy(ev_ring.slot(ev_prod), &r, sizeof(r));
      ev_ring.publish_prod(++ev_prod);
    }
    const uint64_t one = 1;
    (void)!write(event_fd, &one, sizeof(one));
  }

  Server* srv;
  int sock;
  int pidfd = -1;
  pid_t pid = 0;
  uid_t uid = 0;
  uint64_t tag = 0;  // owner of its QPs in the engine
  int event_fd = -1;
  queue::ShmRegion ev_shm;
  queue::Ring ev_ring;
  SpinLock ev_lock{true};
  uint32_t ev_prod = 0;
  uint64_t ev_dropped = 0;
  uint32_t seq = 0;
  std::atomic<bool> hello{false};
  // An administration connection (`droce ctl`): kAdmin requests only.
  std::atomic<bool> admin{false};
  // Held by the client's thread while it handles a request or tears down;
  // `droce ctl` reads the client's object sets under it.
  std::mutex objs_mu;
  std::atomic<bool> done{false};  // its thread finished the teardown
  uint64_t memlock = 0;
  uint32_t nqps = 0, ncqs = 0, nmrs = 0;
  uint64_t ncqes = 0, mr_bytes = 0;
  std::vector<std::unique_ptr<Dev>> devs;
};

namespace {

struct Msg {
  uint8_t buf[ctl::kMaxMessage];
  size_t len = 0;
  int fds[ctl::kMaxFds];
  int nfds = 0;
  void CloseFds() {
    for (int i = 0; i < nfds; ++i) {
      if (fds[i] >= 0) close(fds[i]);
    }
    nfds = 0;
  }
};

// Handles one client's requests; knows the client's objects.
class Handler {
 public:
  Handler(Server::Client& c, ServerStats& st, const ClientLimits& lim, cm::Ucma* ucma, uint32_t cm_owner,
          admin::Host* admin)
      : c_(c), st_(st), lim_(lim), ucma_(ucma), cm_owner_(cm_owner), admin_(admin) {}
  ~Handler() {
    for (auto& [fd, mine] : cm_fds_) close(mine);
  }

  // Returns false to disconnect the client.
  bool Handle(Msg& m);
  void Teardown();

 private:
  template <typename T>
  T Payload(const Msg& m) {
    T v;
    std::memcpy(&v, m.buf + sizeof(ctl::Header), sizeof(T));
    return v;
  }
  bool Reply(const ctl::Header& h, int err, const void* payload = nullptr, size_t len = 0, const int* fds = nullptr,
             int nfds = 0);
  int Foreign() {
    st_.foreign_handles.fetch_add(1, std::memory_order_relaxed);
    return EINVAL;
  }
  bool Hello(const ctl::Header& h, Msg& m);
  bool Attach(const ctl::Header& h);
  bool Cm(const ctl::Header& h, Msg& m);
  bool RegMr(const ctl::Header& h, Server::Client::Dev& d, Msg& m);
  void DropMr(Server::Client::Dev& d, uint32_t key);

  Server::Client& c_;
  ServerStats& st_;
  const ClientLimits& lim_;
  cm::Ucma* ucma_;
  uint32_t cm_owner_;  // the high half of this client's channel keys
  admin::Host* admin_;
  absl::flat_hash_map<uint32_t, int> cm_fds_;  // the client's channel fd -> its eventfd here
};

bool Handler::Reply(const ctl::Header& h, int err, const void* payload, size_t len, const int* fds, int nfds) {
  uint8_t out[ctl::kMaxMessage];
  ctl::Reply r{};
  r.h = h;
  r.h.op = static_cast<uint16_t>(h.op | ctl::kReplyBit);
  r.h.len = static_cast<uint32_t>(sizeof(r) + (err == 0 ? len : 0));
  r.err = err;
  std::memcpy(out, &r, sizeof(r));
  if (err == 0 && len != 0) std::memcpy(out + sizeof(r), payload, len);
  return ctl::SendMsg(c_.sock, out, r.h.len, fds, err == 0 ? nfds : 0) == static_cast<ssize_t>(r.h.len);
}

bool Handler::Hello(const ctl::Header& h, Msg& m) {
  const auto hello = Payload<ctl::Hello>(m);
  if (hello.version != ctl::kVersion || hello.abi != ctl::AbiHash()) {
    // Any process that may open the socket can repeat this at will.
    DROCE_LOG_EVERY(LogLevel::kWarning, 10,
                    "droced: client pid %d speaks version %u (abi %08x); this daemon %u (abi %08x)",
                    static_cast<int>(c_.pid), hello.version, hello.abi, ctl::kVersion, ctl::AbiHash());
    Reply(h, EPROTO);
    return false;
  }
  // The event fd must be an eventfd: the daemon writes 8 bytes to it per
  // event, which would grow any other file.
  char link[64] = {};
  const std::string self = absl::StrCat("/proc/self/fd/", m.fds[0]);
  if (readlink(self.c_str(), link, sizeof(link) - 1) < 0 || std::strcmp(link, "anon_inode:[eventfd]") != 0) {
    st_.bad_messages.fetch_add(1, std::memory_order_relaxed);
    Reply(h, EINVAL);
    return false;
  }
  c_.event_fd = m.fds[0];
  m.fds[0] = -1;
  auto shm = queue::ShmRegion::Create("droce-events", queue::ring_bytes(ctl::kEventRingSlots, sizeof(ctl::EventRecord)));
  if (!shm.ok()) {
    Reply(h, ENOMEM);
    return false;
  }
  c_.ev_shm = std::move(*shm);
  queue::Ring::Init(c_.ev_shm.data(), ctl::kEventRingSlots, sizeof(ctl::EventRecord));
  ctl::HelloRep rep{};
  rep.version = ctl::kVersion;
  rep.abi = ctl::AbiHash();
  rep.ndev = static_cast<uint16_t>(c_.devs.size());
  rep.event_ring_size = c_.ev_shm.size();
  for (size_t i = 0; i < c_.devs.size(); ++i) rep.devs[i] = dev_info(*c_.devs[i]->dev);
  const int fd = c_.ev_shm.fd();
  if (!Reply(h, 0, &rep, sizeof(rep), &fd, 1)) return false;
  // Our own view: the geometry is ours, whatever the client writes there.
  c_.ev_ring = queue::Ring(c_.ev_shm.data());
  c_.hello.store(true, std::memory_order_release);
  return true;
}

bool Handler::Attach(const ctl::Header& h) {
  if (h.dev >= c_.devs.size()) return Reply(h, ENODEV);
  Server::Client::Dev& d = *c_.devs[h.dev];
  if (d.attached) return Reply(h, EEXIST);
  const int workers = d.dev->workers();
  constexpr uint32_t kCells = 4096;
  const size_t per = queue::DoorbellQueue::Bytes(kCells);
  auto shm = queue::ShmRegion::Create("droce-doorbells", per * workers);
  if (!shm.ok()) return Reply(h, ENOMEM);
  d.db_shm = std::move(*shm);
  d.src.owner = c_.tag;
  for (int w = 0; w < workers; ++w) {
    d.src.queues.push_back(std::make_unique<queue::DoorbellQueue>(static_cast<uint8_t*>(d.db_shm.data()) + per * w,
                                                                  kCells, true));
  }
  d.dev->AddDoorbellSource(&d.src);
  d.dev->AddDeviceSink(&d);
  d.attached = true;
  const engine::MapInfo wake = d.dev->wake_map();
  ctl::AttachRep rep{static_cast<uint32_t>(workers), kCells, d.db_shm.size(), wake.size};
  const int fds[2] = {d.db_shm.fd(), wake.fd};
  return Reply(h, 0, &rep, sizeof(rep), fds, 2);
}

bool Handler::RegMr(const ctl::Header& h, Server::Client::Dev& d, Msg& m) {
  const auto r = Payload<ctl::RegMr>(m);
  if (!d.pds.contains(r.pd)) return Reply(h, Foreign());
  if (Over(lim_.max_mrs, c_.nmrs, 1)) return Reply(h, ENOMEM);
  if (r.tier == ctl::kTierImplicit) {
    // Implicit ODP: the client's whole address space through the copy
    // tier. Nothing is mapped or pinned, so it counts against no byte limit.
    auto mr = d.dev->RegMrOfProcess(c_.pid, r.pd, 0, UINT64_MAX, 0, r.access);
    if (!mr.ok()) return Reply(h, ctl::ErrnoOf(mr.status()));
    d.mrs.emplace(mr->key, MrMap{nullptr, 0, 0});
    ++c_.nmrs;
    st_.objects_live.fetch_add(1, std::memory_order_relaxed);
    st_.mr_copied.fetch_add(1, std::memory_order_relaxed);
    const ctl::IdRep rep{mr->key, 0};
    return Reply(h, 0, &rep, sizeof(rep));
  }
  const uint64_t bytes = ((r.addr + r.len + kPage - 1) & ~(kPage - 1)) - (r.addr & ~(kPage - 1));
  uint64_t cap = lim_.max_mr_bytes;
  if (c_.memlock != 0 && (cap == 0 || c_.memlock < cap)) cap = c_.memlock;
  if (cap != 0 && c_.mr_bytes + bytes > cap) return Reply(h, ENOMEM);
  if (r.tier == ctl::kTierCopy) {
    // Tier C: nothing to map; the engine copies with process_vm_readv/writev
    // (the client's memory must be readable by the daemon: same user, or
    // the daemon privileged). Checked once here so that a registration the
    // engine could never reach fails now.
    uint8_t probe;
    iovec local{&probe, 1}, remote{reinterpret_cast<void*>(r.addr), 1};
    if (r.len != 0 && process_vm_readv(c_.pid, &local, 1, &remote, 1, 0) != 1) {
      return Reply(h, errno == EPERM ? EPERM : EFAULT);
    }
    auto mr = d.dev->RegMrOfProcess(c_.pid, r.pd, r.addr, r.len, r.iova, r.access);
    if (!mr.ok()) return Reply(h, ctl::ErrnoOf(mr.status()));
    d.mrs.emplace(mr->key, MrMap{nullptr, 0, bytes});
    ++c_.nmrs;
    c_.mr_bytes += bytes;
    st_.objects_live.fetch_add(1, std::memory_order_relaxed);
    st_.mr_copied.fetch_add(1, std::memory_order_relaxed);
    const ctl::IdRep rep{mr->key, 0};
    return Reply(h, 0, &rep, sizeof(rep));
  }
  // Every piece must be a sealed file (the client cannot shrink it under
  // us: a SIGBUS here would kill every client) long enough for its range.
  for (uint32_t i = 0; i < r.npieces; ++i) {
    const ctl::Piece& p = r.pieces[i];
    const int fd = m.fds[p.fd];
    struct stat sb;
    const int seals = fcntl(fd, F_GET_SEALS);
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || seals < 0 || !(seals & F_SEAL_SHRINK) ||
        static_cast<uint64_t>(sb.st_size) < p.offset + p.len) {
      st_.bad_messages.fetch_add(1, std::memory_order_relaxed);
      return Reply(h, EINVAL);
    }
  }
  MrMap map;
  map.len = 0;
  for (uint32_t i = 0; i < r.npieces; ++i) map.len += r.pieces[i].len;
  void* base = mmap(nullptr, map.len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (base == MAP_FAILED) return Reply(h, ENOMEM);
  map.base = static_cast<uint8_t*>(base);
  size_t off = 0;
  for (uint32_t i = 0; i < r.npieces; ++i) {
    const ctl::Piece& p = r.pieces[i];
    if (mmap(map.base + off, p.len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, m.fds[p.fd],
             static_cast<off_t>(p.offset)) == MAP_FAILED) {
      munmap(base, map.len);
      return Reply(h, ENOMEM);
    }
    off += p.len;
  }
  // Never inherited by anything the daemon might fork.
  madvise(base, map.len, MADV_DONTFORK);
  const uint64_t host = reinterpret_cast<uint64_t>(map.base) + (r.addr - r.pieces[0].start);
  auto mr = d.dev->RegMr(r.pd, host, r.len, r.iova, r.access);
  if (!mr.ok()) {
    munmap(base, map.len);
    return Reply(h, ctl::ErrnoOf(mr.status()));
  }
  map.bytes = bytes;
  d.mrs.emplace(mr->key, map);
  ++c_.nmrs;
  c_.mr_bytes += bytes;
  st_.objects_live.fetch_add(1, std::memory_order_relaxed);
  st_.mr_maps_live.fetch_add(1, std::memory_order_relaxed);
  (r.tier == ctl::kTierShared ? st_.mr_shared : st_.mr_moved).fetch_add(1, std::memory_order_relaxed);
  const ctl::IdRep rep{mr->key, 0};
  return Reply(h, 0, &rep, sizeof(rep));
}

void Handler::DropMr(Server::Client::Dev& d, uint32_t key) {
  auto it = d.mrs.find(key);
  // The engine can no longer touch the memory (DeregMr returned): unmap.
  if (it->second.base != nullptr) {
    munmap(it->second.base, it->second.len);
    st_.mr_maps_live.fetch_sub(1, std::memory_order_relaxed);
  }
  c_.mr_bytes -= it->second.bytes;
  --c_.nmrs;
  d.mrs.erase(it);
  st_.objects_live.fetch_sub(1, std::memory_order_relaxed);
}

bool Handler::Handle(Msg& m) {
  if (!ctl::ValidateRequest(m.buf, m.len, m.nfds).ok()) {
    st_.bad_messages.fetch_add(1, std::memory_order_relaxed);
    // A message whose header is sound gets an error reply; anything else
    // (or anything before the hello) ends the connection.
    ctl::Header h;
    if (!c_.hello || m.len < sizeof(h)) return false;
    std::memcpy(&h, m.buf, sizeof(h));
    if (h.magic != ctl::kMagic || h.seq != c_.seq + 1) return false;
    c_.seq = h.seq;
    return Reply(h, EINVAL);
  }
  ctl::Header h;
  std::memcpy(&h, m.buf, sizeof(h));
  // An administration connection asks questions and nothing else; its
  // first message says so instead of a hello.
  if (h.op == ctl::kAdmin && !c_.hello && (h.seq == c_.seq + 1)) {
    if (!c_.admin.load(std::memory_order_relaxed)) {
      // Not a verbs client after all: it is counted apart.
      c_.admin.store(true, std::memory_order_relaxed);
      st_.clients_accepted.fetch_sub(1, std::memory_order_relaxed);
      st_.clients_live.fetch_sub(1, std::memory_order_relaxed);
    }
    c_.seq = h.seq;
    st_.admin_requests.fetch_add(1, std::memory_order_relaxed);
    return admin::AnswerAdmin(*admin_, c_.sock, h.seq, m.buf, m.len, c_.uid);
  }
  if (c_.admin.load(std::memory_order_relaxed)) {
    st_.bad_messages.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  // Replayed, reordered or skipped messages: the stream is not trustworthy.
  if (h.seq != c_.seq + 1 || (h.op == ctl::kHello) == c_.hello) {
    st_.bad_messages.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  c_.seq = h.seq;
  if (h.op == ctl::kHello) return Hello(h, m);
  if (h.op == ctl::kAttach) return Attach(h);
  if (h.op == ctl::kCmOpen || h.op == ctl::kCmClose || h.op == ctl::kCmCommand) return Cm(h, m);
  if (h.dev >= c_.devs.size() || !c_.devs[h.dev]->attached) return Reply(h, ENODEV);
  Server::Client::Dev& d = *c_.devs[h.dev];
  engine::Device& dev = *d.dev;
  auto live = [&](int delta) { st_.objects_live.fetch_add(static_cast<uint64_t>(delta), std::memory_order_relaxed); };
  switch (h.op) {
    case ctl::kAllocPd: {
      auto pd = dev.AllocPd();
      if (!pd.ok()) return Reply(h, ctl::ErrnoOf(pd.status()));
      d.pds.insert(*pd);
      live(1);
      const ctl::IdRep rep{*pd, 0};
      return Reply(h, 0, &rep, sizeof(rep));
    }
    case ctl::kDeallocPd: {
      const uint32_t pd = Payload<ctl::Id>(m).id;
      if (!d.pds.contains(pd)) return Reply(h, Foreign());
      const int rc = ctl::ErrnoOf(dev.DeallocPd(pd));
      if (rc == 0) {
        d.pds.erase(pd);
        live(-1);
      }
      return Reply(h, rc);
    }
    case ctl::kRegMr:
      return RegMr(h, d, m);
    case ctl::kDeregMr: {
      const uint32_t key = Payload<ctl::Id>(m).id;
      if (!d.mrs.contains(key)) return Reply(h, Foreign());
      const int rc = ctl::ErrnoOf(dev.DeregMr(key));
      if (rc == 0) DropMr(d, key);
      return Reply(h, rc);
    }
    case ctl::kReregMr: {
      const auto r = Payload<ctl::ReregMr>(m);
      if (!d.mrs.contains(r.key) || ((r.flags & engine::Session::kReregPd) && !d.pds.contains(r.pd))) {
        return Reply(h, Foreign());
      }
      return Reply(h, ctl::ErrnoOf(dev.ReregMr(r.key, r.flags, r.pd, 0, 0, 0, r.access)));
    }
    case ctl::kAllocMw: {
      const auto a = Payload<ctl::AllocMw>(m);
      if (!d.pds.contains(a.pd)) return Reply(h, Foreign());
      auto rkey = dev.AllocMw(a.pd, static_cast<uint8_t>(a.type));
      if (!rkey.ok()) return Reply(h, ctl::ErrnoOf(rkey.status()));
      d.mws.insert(*rkey >> 8);
      live(1);
      const ctl::IdRep rep{*rkey, 0};
      return Reply(h, 0, &rep, sizeof(rep));
    }
    case ctl::kDeallocMw: {
      const uint32_t rkey = Payload<ctl::Id>(m).id;
      if (!d.mws.contains(rkey >> 8)) return Reply(h, Foreign());
      const int rc = ctl::ErrnoOf(dev.DeallocMw(rkey));
      if (rc == 0) {
        d.mws.erase(rkey >> 8);
        live(-1);
      }
      return Reply(h, rc);
    }
    case ctl::kCreateCq: {
      const auto a = Payload<ctl::CreateCq>(m);
      if (Over(lim_.max_cqs, c_.ncqs, 1) || Over(lim_.max_cqes, c_.ncqes, a.min_cqe)) return Reply(h, ENOMEM);
      auto cq = dev.CreateCq(a.min_cqe, &d, a.cookie);
      if (!cq.ok()) return Reply(h, ctl::ErrnoOf(cq.status()));
      const uint32_t entries = cq->region->capacity();
      d.cqs[cq->id] = entries;
      ++c_.ncqs;
      c_.ncqes += entries;
      live(1);
      const ctl::CqRep rep{cq->id, entries, cq->region->bytes()};
      const int fd = cq->region->fd();
      return Reply(h, 0, &rep, sizeof(rep), &fd, 1);
    }
    case ctl::kDestroyCq: {
      const uint32_t id = Payload<ctl::Id>(m).id;
      auto it = d.cqs.find(id);
      if (it == d.cqs.end()) return Reply(h, Foreign());
      const int rc = ctl::ErrnoOf(dev.DestroyCq(id));
      if (rc == 0) {
        c_.ncqes -= it->second;
        --c_.ncqs;
        d.cqs.erase(it);
        live(-1);
      }
      return Reply(h, rc);
    }
    case ctl::kResizeCq: {
      const auto a = Payload<ctl::ResizeCq>(m);
      auto it = d.cqs.find(a.id);
      if (it == d.cqs.end()) return Reply(h, Foreign());
      if (Over(lim_.max_cqes, c_.ncqes - it->second, a.min_cqe)) return Reply(h, ENOMEM);
      auto region = dev.ResizeCq(a.id, a.min_cqe);
      if (!region.ok()) return Reply(h, ctl::ErrnoOf(region.status()));
      c_.ncqes = c_.ncqes - it->second + (*region)->capacity();
      it->second = (*region)->capacity();
      const ctl::CqRep rep{a.id, (*region)->capacity(), (*region)->bytes()};
      const int fd = (*region)->fd();
      return Reply(h, 0, &rep, sizeof(rep), &fd, 1);
    }
    case ctl::kModifyCq: {
      const auto a = Payload<ctl::ModifyCq>(m);
      if (!d.cqs.contains(a.id)) return Reply(h, Foreign());
      return Reply(h, ctl::ErrnoOf(dev.ModifyCq(a.id, a.count, a.period_us)));
    }
    case ctl::kCreateQp: {
      const auto a = Payload<ctl::CreateQp>(m);
      // Every object named must be this client's; an XRC target names its
      // XRC domain (a PD id) and no CQ, an XRC initiator no receive CQ.
      const auto type = static_cast<transport::QpType>(a.type);
      const bool tgt = type == transport::QpType::kXrcTgt;
      const bool rcq_optional = tgt || type == transport::QpType::kXrcIni;
      if (!d.pds.contains(tgt ? a.xrcd : a.pd) || (!tgt && !d.cqs.contains(a.send_cq)) ||
          ((!rcq_optional || a.recv_cq != 0) && !d.cqs.contains(a.recv_cq)) ||
          (a.srq != 0 && !d.srqs.contains(a.srq))) {
        return Reply(h, Foreign());
      }
      if (Over(lim_.max_qps, c_.nqps, 1)) return Reply(h, ENOMEM);
      engine::QpCreateArgs args;
      args.type = type;
      args.pd = tgt ? 0 : a.pd;
      args.xrcd = tgt ? a.xrcd : 0;
      args.send_cq = a.send_cq;
      args.recv_cq = a.recv_cq;
      args.srq = a.srq;
      args.events = &d;
      args.cookie = a.cookie;
      args.max_send_wr = a.max_send_wr;
      args.max_recv_wr = a.max_recv_wr;
      args.max_send_sge = a.max_send_sge;
      args.max_recv_sge = a.max_recv_sge;
      args.max_inline = a.max_inline;
      args.sq_sig_all = a.sq_sig_all != 0;
      args.owner = c_.tag;
      auto qp = dev.CreateQp(args);
      if (!qp.ok()) return Reply(h, ctl::ErrnoOf(qp.status()));
      d.qps.insert(qp->qpn);
      ++c_.nqps;
      live(1);
      ctl::QpRep rep{};
      rep.qpn = qp->qpn;
      rep.worker = qp->worker;
      rep.max_send_wr = qp->caps.max_send_wr;
      rep.max_recv_wr = qp->caps.max_recv_wr;
      rep.max_send_sge = qp->caps.max_send_sge;
      rep.max_recv_sge = qp->caps.max_recv_sge;
      rep.max_inline = qp->caps.max_inline;
      rep.size = qp->map.size;
      rep.rq_offset = qp->rq_offset;
      rep.shared_offset = qp->shared_offset;
      const int fd = qp->map.fd;
      return Reply(h, 0, &rep, sizeof(rep), &fd, 1);
    }
    case ctl::kModifyQp: {
      const auto a = Payload<ctl::ModifyQp>(m);
      if (!d.qps.contains(a.qpn)) return Reply(h, Foreign());
      transport::QpAttr attr;
      (void)ctl::FromWire(ctl::Masked(a.attr, a.mask), &attr);  // checked by ValidateRequest
      return Reply(h, dev.ModifyQp(a.qpn, attr, a.mask));
    }
    case ctl::kQueryQp: {
      const uint32_t qpn = Payload<ctl::Id>(m).id;
      if (!d.qps.contains(qpn)) return Reply(h, Foreign());
      auto attr = dev.QueryQp(qpn);
      if (!attr.ok()) return Reply(h, ctl::ErrnoOf(attr.status()));
      const ctl::WireQpAttr w = ctl::ToWire(*attr);
      return Reply(h, 0, &w, sizeof(w));
    }
    case ctl::kDestroyQp: {
      const uint32_t qpn = Payload<ctl::Id>(m).id;
      if (!d.qps.contains(qpn)) return Reply(h, Foreign());
      const int rc = ctl::ErrnoOf(dev.DestroyQp(qpn));
      if (rc == 0) {
        d.qps.erase(qpn);
        --c_.nqps;
        live(-1);
      }
      return Reply(h, rc);
    }
    case ctl::kCreateSrq: {
      const auto a = Payload<ctl::CreateSrq>(m);
      if (!d.pds.contains(a.pd) || (a.xrcd != 0 && (!d.pds.contains(a.xrcd) || !d.cqs.contains(a.cq)))) {
        return Reply(h, Foreign());
      }
      auto srq = dev.CreateSrq(a.pd, a.max_wr, a.max_sge, a.limit, &d, a.cookie, a.xrcd, a.cq);
      if (!srq.ok()) return Reply(h, ctl::ErrnoOf(srq.status()));
      d.srqs.insert(srq->id);
      live(1);
      const ctl::SrqRep rep{srq->id, srq->max_wr, srq->max_sge, 0, srq->map.size};
      const int fd = srq->map.fd;
      return Reply(h, 0, &rep, sizeof(rep), &fd, 1);
    }
    case ctl::kModifySrq: {
      const auto a = Payload<ctl::ModifySrq>(m);
      if (!d.srqs.contains(a.id)) return Reply(h, Foreign());
      return Reply(h, dev.ModifySrq(a.id, a.limit));
    }
    case ctl::kQuerySrq: {
      const uint32_t id = Payload<ctl::Id>(m).id;
      if (!d.srqs.contains(id)) return Reply(h, Foreign());
      auto limit = dev.QuerySrqLimit(id);
      if (!limit.ok()) return Reply(h, ctl::ErrnoOf(limit.status()));
      const ctl::IdRep rep{*limit, 0};
      return Reply(h, 0, &rep, sizeof(rep));
    }
    case ctl::kDestroySrq: {
      const uint32_t id = Payload<ctl::Id>(m).id;
      if (!d.srqs.contains(id)) return Reply(h, Foreign());
      const int rc = ctl::ErrnoOf(dev.DestroySrq(id));
      if (rc == 0) {
        d.srqs.erase(id);
        live(-1);
      }
      return Reply(h, rc);
    }
    case ctl::kCreateAh: {
      const auto a = Payload<ctl::CreateAh>(m);
      if (!d.pds.contains(a.pd)) return Reply(h, Foreign());
      transport::AddressVector av;
      (void)ctl::FromWire(a.av, &av);  // checked by ValidateRequest
      auto id = dev.CreateAh(a.pd, av);
      if (!id.ok()) return Reply(h, ctl::ErrnoOf(id.status()));
      d.ahs.insert(*id);
      live(1);
      const ctl::IdRep rep{*id, 0};
      return Reply(h, 0, &rep, sizeof(rep));
    }
    case ctl::kDestroyAh: {
      const uint32_t id = Payload<ctl::Id>(m).id;
      if (!d.ahs.contains(id)) return Reply(h, Foreign());
      const int rc = ctl::ErrnoOf(dev.DestroyAh(id));
      if (rc == 0) {
        d.ahs.erase(id);
        live(-1);
      }
      return Reply(h, rc);
    }
    case ctl::kAttachMcast:
    case ctl::kDetachMcast: {
      const auto a = Payload<ctl::Mcast>(m);
      if (!d.qps.contains(a.qpn)) return Reply(h, Foreign());
      wire::Ipv6Addr gid;
      std::memcpy(gid.data(), a.gid, 16);
      const bool attach = h.op == ctl::kAttachMcast;
      const int rc = attach ? dev.AttachMcast(a.qpn, gid) : dev.DetachMcast(a.qpn, gid);
      if (rc == 0) {
        if (attach) d.mcast.emplace_back(a.qpn, gid);
        else std::erase(d.mcast, std::make_pair(a.qpn, gid));
      }
      return Reply(h, rc);
    }
    case ctl::kReadCounters: {
      const Counters cn = dev.ReadCounters();
      return Reply(h, 0, &cn, sizeof(cn));
    }
    case ctl::kReadQpCounters: {
      const uint32_t qpn = Payload<ctl::Id>(m).id;
      if (!d.qps.contains(qpn)) return Reply(h, Foreign());
      auto cn = dev.ReadQpCounters(qpn);
      if (!cn.ok()) return Reply(h, ctl::ErrnoOf(cn.status()));
      return Reply(h, 0, &*cn, sizeof(*cn));
    }
    default:
      return false;
  }
}

// librdmacm's commands, run by the shared connection manager on channels
// keyed by this client and its fd number; the client copies the responses
// to its pointers (the daemon never writes client memory for the CM).
bool Handler::Cm(const ctl::Header& h, Msg& m) {
  if (ucma_ == nullptr) {
    m.CloseFds();
    return Reply(h, ENODEV);
  }
  if (h.op == ctl::kCmOpen) {
    const auto c = Payload<ctl::CmChannel>(m);
    const int fd = m.fds[0];
    m.fds[0] = -1;
    m.nfds = 0;
    // An eventfd, as for the hello's event fd: anything else is refused.
    char link[64] = "";
    const std::string path = "/proc/self/fd/" + std::to_string(fd);
    const ssize_t n = readlink(path.c_str(), link, sizeof(link) - 1);
    if (n <= 0 || std::string(link, static_cast<size_t>(n)) != "anon_inode:[eventfd]" || cm_fds_.contains(c.fd) ||
        cm_fds_.size() >= 1024) {
      close(fd);
      return Reply(h, EINVAL);
    }
    const int rc = ucma_->OpenChannel(uint64_t{cm_owner_} << 32 | c.fd, fd);
    if (rc != 0) {
      close(fd);
      return Reply(h, -rc);
    }
    cm_fds_[c.fd] = fd;
    return Reply(h, 0);
  }
  if (h.op == ctl::kCmClose) {
    const auto c = Payload<ctl::CmChannel>(m);
    auto it = cm_fds_.find(c.fd);
    if (it == cm_fds_.end()) return Reply(h, EBADF);
    ucma_->CloseChannel(uint64_t{cm_owner_} << 32 | c.fd);
    close(it->second);
    cm_fds_.erase(it);
    return Reply(h, 0);
  }
  const auto c = Payload<ctl::CmCommand>(m);
  const cm::Ucma::Result r =
      ucma_->Command(uint64_t{cm_owner_} << 32 | c.fd, c.cmd, c.in, c.in_len, c.out_len, {c.opt, c.opt_len});
  ctl::CmResult rep{};
  rep.rc = r.rc;
  rep.len = std::min<uint32_t>(r.len, ctl::kCmMaxOut);
  rep.response = r.response;
  std::memcpy(rep.bytes, r.bytes, rep.len);
  return Reply(h, 0, &rep, sizeof(rep));
}

// Everything the client owned, in uverbs order, with the engine stopped from
// touching it before its memory goes: the doorbell queues leave the loops,
// QPs (out of their groups first) are destroyed — a control call, so when it
// returns no worker runs them — then SRQs, AHs, MWs, MRs (unmapped once the
// engine can no longer reach them), CQs and PDs. Its QPNs are not handed out
// again until the 24-bit QPN space wraps (the engine counts up from the last
// one), so late packets from its peers find no QP and are dropped.
void Handler::Teardown() {
  // Its connection manager ids first (DREQ/REJ to their peers), as the
  // kernel's ucma_close does when the process goes.
  if (ucma_ != nullptr) ucma_->CloseChannelsOf(cm_owner_);
  for (auto& dp : c_.devs) {
    Server::Client::Dev& d = *dp;
    if (!d.attached) continue;
    engine::Device& dev = *d.dev;
    dev.RemoveDoorbellSource(&d.src);
    for (const auto& [qpn, gid] : d.mcast) (void)dev.DetachMcast(qpn, gid);
    d.mcast.clear();
    auto gone = [&](const absl::Status& s, const char* what, uint32_t id) {
      if (!s.ok()) {
        Log(LogLevel::kWarning, "droced: client pid %d: %s %u: %s", static_cast<int>(c_.pid), what, id,
            std::string(s.message()).c_str());
      }
      st_.objects_live.fetch_sub(1, std::memory_order_relaxed);
    };
    for (uint32_t qpn : d.qps) gone(dev.DestroyQp(qpn), "QP", qpn);
    d.qps.clear();
    for (uint32_t id : d.srqs) gone(dev.DestroySrq(id), "SRQ", id);
    d.srqs.clear();
    for (uint32_t id : d.ahs) gone(dev.DestroyAh(id), "AH", id);
    d.ahs.clear();
    // DeallocMw goes by the window's index, whatever its current variant.
    for (uint32_t index : d.mws) gone(dev.DeallocMw(index << 8), "MW", index);
    d.mws.clear();
    std::vector<uint32_t> keys;
    for (const auto& [key, map] : d.mrs) keys.push_back(key);
    for (uint32_t key : keys) {
      const absl::Status s = dev.DeregMr(key);
      if (s.ok()) {
        DropMr(d, key);
      } else {
        gone(s, "MR", key);
      }
    }
    for (const auto& [id, entries] : d.cqs) gone(dev.DestroyCq(id), "CQ", id);
    d.cqs.clear();
    for (uint32_t pd : d.pds) gone(dev.DeallocPd(pd), "PD", pd);
    d.pds.clear();
    dev.RemoveDeviceSink(&d);
    d.attached = false;
  }
}

}  // namespace

// The daemon as `droce ctl` sees it: its devices, and its client
// processes with their objects (read under each client's objs_mu, so a
// query waits for a control call in progress, never the other way round for
// long: a query copies sets and returns).
class Server::AdminHost final : public admin::Host {
 public:
  explicit AdminHost(Server* s) : s_(s) {}
  std::vector<engine::Device*> Devices() override { return s_->devices_; }

  std::vector<admin::ClientInfo> Clients() override {
    std::vector<admin::ClientInfo> out;
    for (auto& c : Live()) {
      admin::ClientInfo i;
      i.pid = c->pid;
      i.uid = c->uid;
      i.comm = admin::CommOf(c->pid);
      i.tag = c->tag;
      std::lock_guard<std::mutex> l(c->objs_mu);
      i.qps = c->nqps;
      i.cqs = c->ncqs;
      i.mrs = c->nmrs;
      for (auto& d : c->devs) i.pds += static_cast<uint32_t>(d->pds.size());
      i.mr_bytes = c->mr_bytes;
      out.push_back(std::move(i));
    }
    return out;
  }

  admin::Owners OwnersOf(size_t dev) override {
    admin::Owners o;
    for (auto& c : Live()) {
      o.qp_tag[c->tag] = c->pid;
      std::lock_guard<std::mutex> l(c->objs_mu);
      if (dev >= c->devs.size()) continue;
      const Client::Dev& d = *c->devs[dev];
      for (const auto& [id, entries] : d.cqs) o.cq[id] = c->pid;
      for (const auto& [key, map] : d.mrs) o.mr[key] = c->pid;
      for (uint32_t pd : d.pds) o.pd[pd] = c->pid;
    }
    return o;
  }

  absl::Status Kill(int32_t pid, uint32_t uid) override {
    bool found = false;
    for (auto& c : Live()) {
      if (c->pid != pid) continue;
      if (uid != 0 && uid != c->uid) {
        return absl::PermissionDeniedError(absl::StrCat("client ", pid, " is another user's (uid ", c->uid, ")"));
      }
      // Its thread sees the connection end and tears it down as if the
      // process had gone; the process gets IBV_EVENT_DEVICE_FATAL. Under
      // objs_mu the socket is still this client's (Release takes it too).
      std::lock_guard<std::mutex> l(c->objs_mu);
      if (c->sock >= 0) shutdown(c->sock, SHUT_RDWR);
      found = true;
    }
    if (!found) return absl::NotFoundError(absl::StrCat("no client with pid ", pid));
    return absl::OkStatus();
  }

  void AddHostStats(admin::Json* out) override {
    const ServerStats& st = s_->stats_;
    admin::Json& j = *out;
    j["clients_live"] = st.clients_live.load();
    j["clients_accepted"] = st.clients_accepted.load();
    j["clients_refused"] = st.clients_refused.load();
    j["bad_messages"] = st.bad_messages.load();
    j["foreign_handles"] = st.foreign_handles.load();
    j["objects_live"] = st.objects_live.load();
    j["mr_maps_live"] = st.mr_maps_live.load();
    j["mr_shared"] = st.mr_shared.load();
    j["mr_moved"] = st.mr_moved.load();
    j["mr_copied"] = st.mr_copied.load();
    j["teardowns"] = st.teardowns.load();
    j["admin_requests"] = st.admin_requests.load();
    if (s_->ucma_ != nullptr) {
      const cm::CmStats cs = s_->ucma_->stats();
#define DROCE_CM_STAT_JSON(name, desc) j["cm_" #name] = cs.name;
      DROCE_CM_STATS(DROCE_CM_STAT_JSON)
#undef DROCE_CM_STAT_JSON
    }
  }

 private:
  using Live_ = Server::Live;
  // The verbs clients now (not the administration connections).
  std::vector<std::shared_ptr<Client>> Live() {
    std::vector<std::shared_ptr<Client>> v;
    std::lock_guard<std::mutex> l(s_->mu_);
    for (const Live_& x : s_->live_) {
      if (!x.client->admin.load(std::memory_order_relaxed) && !x.client->done.load(std::memory_order_acquire) &&
          x.client->hello.load(std::memory_order_acquire)) {
        v.push_back(x.client);
      }
    }
    return v;
  }
  Server* s_;
};

Server::Server(std::vector<engine::Device*> devices, ServerOptions opt)
    : devices_(std::move(devices)), opt_(std::move(opt)) {
  ucma_ = std::make_unique<cm::Ucma>();
  cm_ports_ = cm::AttachPorts(ucma_.get(), devices_);
  ucma_->Start();
  admin_ = std::make_unique<AdminHost>(this);
}

Server::~Server() {
  metrics_.reset();
  if (listen_fd_ >= 0) close(listen_fd_);
  if (stop_fd_ >= 0) close(stop_fd_);
}

absl::Status Server::Listen() {
  stop_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd_ < 0) return absl::ErrnoToStatus(errno, "eventfd");
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (opt_.socket_path.empty() || opt_.socket_path.size() >= sizeof(a.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path '", opt_.socket_path, "' is empty or too long"));
  }
  std::memcpy(a.sun_path, opt_.socket_path.c_str(), opt_.socket_path.size() + 1);
  listen_fd_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return absl::ErrnoToStatus(errno, "socket");
  if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    if (errno != EADDRINUSE) return absl::ErrnoToStatus(errno, absl::StrCat("bind ", opt_.socket_path));
    // A socket file: live daemon, or left by one that died?
    const int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    const bool live = connect(probe, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    close(probe);
    if (live) return absl::AlreadyExistsError(absl::StrCat("a daemon already listens on ", opt_.socket_path));
    unlink(opt_.socket_path.c_str());
    if (bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
      return absl::ErrnoToStatus(errno, absl::StrCat("bind ", opt_.socket_path));
    }
  }
  // The group before the mode: a mode of 0660 must never apply to the
  // daemon's own group, even for an instant.
  if (!opt_.socket_group.empty()) {
    absl::StatusOr<gid_t> gid = ResolveGroup(opt_.socket_group);
    if (!gid.ok()) {
      unlink(opt_.socket_path.c_str());
      return absl::InvalidArgumentError(absl::StrCat("socket group: ", gid.status().message()));
    }
    if (chown(opt_.socket_path.c_str(), static_cast<uid_t>(-1), *gid) != 0) {
      const int e = errno;
      unlink(opt_.socket_path.c_str());
      return absl::ErrnoToStatus(e, absl::StrCat("chown ", opt_.socket_path, " to group ", opt_.socket_group));
    }
  }
  if (chmod(opt_.socket_path.c_str(), opt_.socket_mode) != 0 || listen(listen_fd_, 128) != 0) {
    const int e = errno;
    unlink(opt_.socket_path.c_str());
    return absl::ErrnoToStatus(e, absl::StrCat("listen ", opt_.socket_path));
  }
  if (opt_.metrics_port != 0) {
    auto m = admin::MetricsServer::Start(admin_.get(), opt_.metrics_address, opt_.metrics_port);
    if (!m.ok()) {
      unlink(opt_.socket_path.c_str());
      return m.status();
    }
    metrics_ = std::move(*m);
  }
  return absl::OkStatus();
}

void Server::Run() {
  uint64_t next_tag = 1;
  while (!stopping_.load(std::memory_order_acquire)) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    if (poll(p, 2, 1000) < 0 && errno != EINTR) break;
    if (p[1].revents != 0) break;
    {
      // Reap the threads of clients that are gone.
      std::lock_guard<std::mutex> l(mu_);
      for (Live& x : live_) {
        if (x.client->done.load(std::memory_order_acquire)) x.thread.join();
      }
      std::erase_if(live_, [](const Live& x) { return !x.thread.joinable(); });
    }
    if ((p[0].revents & POLLIN) == 0) continue;
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    ucred cred{};
    socklen_t cl = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || cred.pid <= 0) {
      stats_.clients_refused.fetch_add(1, std::memory_order_relaxed);
      close(fd);
      continue;
    }
    auto c = std::make_shared<Client>(this, fd);
    c->pid = cred.pid;
    c->uid = cred.uid;
    c->tag = next_tag++;
    // The process, not the socket: a child forked without exec keeps the
    // socket open but must not keep its parent alive here.
    c->pidfd = static_cast<int>(syscall(SYS_pidfd_open, cred.pid, 0));
    c->memlock = memlock_limit(cred.pid);
    for (size_t i = 0; i < devices_.size(); ++i) {
      auto d = std::make_unique<Client::Dev>();
      d->c = c.get();
      d->index = static_cast<uint16_t>(i);
      d->dev = devices_[i];
      c->devs.push_back(std::move(d));
    }
    stats_.clients_accepted.fetch_add(1, std::memory_order_relaxed);
    stats_.clients_live.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard<std::mutex> l(mu_);
    live_.push_back({c, std::thread([this, c] { Serve(c); })});
  }
  if (opt_.on_stopping) opt_.on_stopping();
  // Shutting down. The socket goes first: a client that reconnects at once
  // (a restart) fails fast instead of queueing on a listener nobody
  // accepts on, and a daemon started meanwhile on the same path keeps its
  // own socket file. Then every client hears DEVICE_FATAL (marked as the
  // daemon's stop), its connection ends and its thread tears it down.
  stopping_.store(true, std::memory_order_release);
  close(listen_fd_);
  listen_fd_ = -1;
  unlink(opt_.socket_path.c_str());
  metrics_.reset();
  for (engine::Device* d : devices_) d->Shutdown("droced is stopping");
  const uint64_t one = 1;
  (void)!write(stop_fd_, &one, sizeof(one));
  std::vector<Live> live;
  {
    std::lock_guard<std::mutex> l(mu_);
    live.swap(live_);
  }
  for (Live& x : live) x.thread.join();
}

void Server::Stop() {
  stopping_.store(true, std::memory_order_release);
  const uint64_t one = 1;
  if (stop_fd_ >= 0) (void)!write(stop_fd_, &one, sizeof(one));
}

void Server::Serve(std::shared_ptr<Client> c) {
  pthread_setname_np(pthread_self(), "droced-client");
  Handler h(*c, stats_, opt_.limits, ucma_.get(), next_cm_owner_.fetch_add(1, std::memory_order_relaxed),
            admin_.get());
  auto m = std::make_unique<Msg>();
  const char* why = "disconnected";
  for (;;) {
    pollfd p[3] = {{c->sock, POLLIN, 0}, {stop_fd_, POLLIN, 0}, {c->pidfd, POLLIN, 0}};
    const int np = c->pidfd >= 0 ? 3 : 2;
    if (poll(p, np, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (p[1].revents != 0) {
      why = "daemon stopping";
      // Hang up before the teardown: the client's event thread sees the
      // end now, and a request it has sent meanwhile fails with EIO
      // instead of waiting for a reply that will not come.
      shutdown(c->sock, SHUT_RDWR);
      break;
    }
    if (np == 3 && p[2].revents != 0) {
      why = "process exited";
      break;
    }
    if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    const ssize_t n = ctl::RecvMsg(c->sock, m->buf, sizeof(m->buf), m->fds, &m->nfds);
    // An empty message may still carry fds: they are not kept either.
    if (n == 0) m->CloseFds();
    if (n <= 0) {
      if (n < 0) {
        why = "bad message";
        stats_.bad_messages.fetch_add(1, std::memory_order_relaxed);
      }
      break;
    }
    m->len = static_cast<size_t>(n);
    bool ok;
    if (c->admin.load(std::memory_order_relaxed) || c->seq == 0) {
      // Administration (or the first message, which may make it so): its
      // queries take the other clients' objs_mu, never its own.
      ok = h.Handle(*m);
    } else {
      std::lock_guard<std::mutex> l(c->objs_mu);
      ok = h.Handle(*m);
    }
    m->CloseFds();
    if (!ok) {
      why = "protocol error";
      break;
    }
  }
  if (c->admin.load(std::memory_order_relaxed)) {
    Log(LogLevel::kDebug, "droced: droce ctl pid %d (uid %u): %s", static_cast<int>(c->pid),
        static_cast<unsigned>(c->uid), why);
  } else {
    Log(LogLevel::kInfo, "droced: client pid %d (uid %u): %s; tearing down its objects (%llu events dropped)",
        static_cast<int>(c->pid), static_cast<unsigned>(c->uid), why, static_cast<unsigned long long>(c->ev_dropped));
    {
      std::lock_guard<std::mutex> l(c->objs_mu);
      h.Teardown();
    }
    stats_.teardowns.fetch_add(1, std::memory_order_relaxed);
    stats_.clients_live.fetch_sub(1, std::memory_order_relaxed);
  }
  // Nothing of the engine refers to the client any more: its fds and shared
  // memory go now, not when its thread is reaped (under objs_mu: `client
  // kill` may be about to shut the socket down).
  {
    std::lock_guard<std::mutex> l(c->objs_mu);
    c->Release();
  }
  c->done.store(true, std::memory_order_release);
}

std::string Server::StatusLine() const {
  return absl::StrCat("clients ", stats_.clients_live.load(), " live, ", stats_.clients_accepted.load(), " accepted, ",
                      stats_.clients_refused.load(), " refused, ",
                      stats_.teardowns.load(), " torn down; objects ", stats_.objects_live.load(), ", memory maps ",
                      stats_.mr_maps_live.load(), "; bad messages ", stats_.bad_messages.load(), ", foreign handles ",
                      stats_.foreign_handles.load(), "; registrations shared ", stats_.mr_shared.load(), ", moved ",
                      stats_.mr_moved.load(), ", copied ", stats_.mr_copied.load());
}

}  // namespace droce::daemon
