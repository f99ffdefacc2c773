// Client mode: engine::Session over droced's control socket (src/ctl/).
//
// One connection at a time per process, opened on first use, shared by its
// devices. Each context holds its connection (session_for hands out a
// shared_ptr), so a connection whose daemon stopped or vanished stays until
// the last context on it is closed, while the next ibv_open_device (or
// ibv_get_device_list) opens a new one: a restarted droced serves the
// process again.
// Control verbs are request/reply on the socket; the datapath needs none:
// WQEs go into rings in memfds droced made and passed, doorbells into this
// process's doorbell queue (shared memory the daemon's worker drains),
// wakeups through the worker's shared futex words (WakeWorker), CQEs come
// back through the CQ's ring. Events (CQ notifications, CQ overflow, QP,
// SRQ and device events) are records in an event ring droced writes, with
// an eventfd poke; the event thread here drains it and calls the same
// notifier and sink objects the embedded engine calls on its worker thread,
// so the provider's channel, async-event and acknowledgement logic is the
// same in both modes. If the daemon goes away (SIGTERM, crash) the event
// thread sees the socket hang up and reports IBV_EVENT_DEVICE_FATAL; a stop
// is announced first (a DEVICE_FATAL record marked kEvDaemonStopping).
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "admin/serve.h"
#include "client_memory.h"
#include "ctl/protocol.h"
#include "daemon/server.h"
#include "engine/device.h"
#include "queue/doorbell.h"
#include "queue/shm.h"
#include "sessions.h"

namespace droce::provider {
namespace {

class DaemonSession;

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  // The process's connection, opened if there is none or the one there is
  // can serve no new device (its daemon stopped or vanished).
  static absl::StatusOr<std::shared_ptr<Connection>> Get();
  ~Connection();

  // One request, one reply. Returns 0 or the daemon's errno (EIO when the
  // connection is gone). The reply must have the payload and fds of its op
  // (ctl::ShapeOf): the payload goes to rep, the fds to out_fds (the caller
  // owns them).
  // rep_room: the size of *rep, which must be the op's reply payload.
  int Call(uint16_t op, uint16_t dev, const void* req, size_t req_len, const int* fds, int nfds, void* rep,
           size_t rep_room, int* out_fds = nullptr);
  // The same, typed by the op's entry in DROCE_CTL_OPS: a request or reply
  // of another type does not compile. fds: the request's (kRegMr, kHello).
  template <uint16_t op>
  int Call(uint16_t dev, const typename ctl::OpDef<op>::Req& req, typename ctl::OpDef<op>::Rep* rep = nullptr,
           int* out_fds = nullptr, const int* fds = nullptr, int nfds = 0) {
    using Def = ctl::OpDef<op>;
    return Call(op, dev, &req, ctl::kPayloadLen<typename Def::Req>, fds, nfds, rep,
                ctl::kPayloadLen<typename Def::Rep>, out_fds);
  }
  int devices() const { return static_cast<int>(hello_.ndev); }
  const ctl::DevInfo& info(int i) const { return hello_.devs[i]; }
  DaemonSession* session(int i);
  // The socket hung up: no call can succeed any more.
  bool gone() const { return gone_.load(std::memory_order_acquire); }
  // The daemon said it is stopping, or it is gone: no engine will run this
  // connection's queues again, and new opens need a new connection.
  bool stopping() const { return stopping_.load(std::memory_order_acquire) || gone(); }
  // In a forked child: the parent's connection is the parent's. Its
  // socket and eventfd are closed here (the daemon keeps serving the
  // parent on them) and every call on it fails with EIO; the child's first
  // open makes a connection of its own, as a new client of the daemon.
  void ForgetInChild();

 private:
  absl::Status Open(const std::string& path);
  void EventLoop();
  // The event thread, at its end: the process no longer offers this
  // connection to new opens.
  void Retire();

  int sock_ = -1;
  int event_fd_ = -1;
  std::mutex mu_;
  uint32_t seq_ = 0;
  ctl::HelloRep hello_{};
  queue::ShmRegion ev_shm_;
  queue::Ring ev_ring_;
  std::atomic<bool> gone_{false}, stopping_{false};
  std::thread events_;
  std::vector<std::unique_ptr<DaemonSession>> sessions_;
};

// The connection whose event thread this is (its sinks may ask for their
// session: they get this one, never a new connection made under them).
thread_local Connection* t_event_connection = nullptr;

class DaemonSession final : public engine::Session {
 public:
  DaemonSession(Connection* c, int index) : c_(c), index_(static_cast<uint16_t>(index)) {
    const ctl::DevInfo& i = c->info(index);
    port_.name.assign(i.name, strnlen(i.name, sizeof(i.name)));
    std::memcpy(port_.mac.data(), i.mac, 6);
    port_.ip = i.ip;
    port_.prefix_len = i.prefix_len;
    port_.active_mtu = i.active_mtu;
    port_.link_mtu = i.link_mtu;
    std::memcpy(port_.gids, i.gids, sizeof(port_.gids));
    port_.gid_count = std::min<uint32_t>(i.gid_count, 2);
    port_active_.store(i.port_active != 0);
    dead_.store(i.dead != 0);
  }

  // kAttach once per connection (on first use of the device); later calls
  // return the first one's result.
  absl::Status EnsureAttached() {
    std::lock_guard<std::mutex> l(attach_mu_);
    if (!attached_) {
      attached_ = true;
      attach_status_ = Attach();
    }
    return attach_status_;
  }

  absl::Status Attach() {
    ctl::AttachRep rep{};
    int fds[2] = {-1, -1};
    if (int e = c_->Call<ctl::kAttach>(index_, {}, &rep, fds); e != 0) {
      return ctl::StatusOf(e, "attach");
    }
    workers_ = static_cast<int>(rep.workers);
    const size_t per = queue::DoorbellQueue::Bytes(rep.doorbell_cells);
    if (rep.workers == 0 || rep.workers > 64 || rep.doorbell_size < per * rep.workers ||
        rep.wake_size < sizeof(engine::WakeWords) * rep.workers) {
      close(fds[0]);
      close(fds[1]);
      return absl::InternalError("the daemon's attach reply does not add up");
    }
    auto db = queue::ShmRegion::Adopt(fds[0], rep.doorbell_size);
    auto wake = queue::ShmRegion::Adopt(fds[1], rep.wake_size);
    if (!db.ok() || !wake.ok()) return absl::InternalError("cannot map the daemon's doorbell pages");
    db_shm_ = std::move(*db);
    wake_shm_ = std::move(*wake);
    for (uint32_t w = 0; w < rep.workers; ++w) {
      queues_.push_back(std::make_unique<queue::DoorbellQueue>(static_cast<uint8_t*>(db_shm_.data()) + per * w,
                                                               rep.doorbell_cells, false));
    }
    return absl::OkStatus();
  }

  const engine::PortInfo& port() const override { return port_; }
  bool port_active() const override { return port_active_.load(std::memory_order_relaxed); }
  bool dead() const override { return dead_.load(std::memory_order_acquire) || c_->gone(); }
  bool engine_gone() const override { return c_->stopping(); }
  int workers() const override { return workers_; }
  void AddDeviceSink(engine::EventSink* s) override {
    std::lock_guard<std::mutex> l(ev_mu_);
    sinks_.push_back(s);
  }
  void RemoveDeviceSink(engine::EventSink* s) override {
    std::lock_guard<std::mutex> l(ev_mu_);
    std::erase(sinks_, s);
  }

  absl::StatusOr<uint32_t> AllocPd() override {
    ctl::IdRep rep{};
    if (int e = Call<ctl::kAllocPd>({}, &rep); e != 0) return ctl::StatusOf(e, "alloc PD");
    return rep.id;
  }
  // Destroying succeeds on a dead device (its daemon gone): the objects are
  // gone with it, and the program must be able to clean up.
  absl::Status DeallocPd(uint32_t pd) override { return Destroy<ctl::kDeallocPd>(pd, "dealloc PD"); }

  absl::StatusOr<mem::Mr> RegMr(uint32_t pd, uint64_t addr, uint64_t len, uint64_t iova, uint32_t access) override {
    if (dead()) return absl::UnavailableError("the daemon is gone");
    auto reg = PrepareMemory(addr, len);
    if (!reg.ok()) return reg.status();
    ctl::RegMr r{};
    r.pd = pd;
    r.access = access;
    r.addr = addr;
    r.len = len;
    r.iova = iova;
    r.tier = reg->tier;
    r.npieces = static_cast<uint32_t>(reg->pieces.size());
    for (size_t i = 0; i < reg->pieces.size(); ++i) r.pieces[i] = reg->pieces[i];
    ctl::IdRep rep{};
    const int e =
        c_->Call<ctl::kRegMr>(index_, r, &rep, nullptr, reg->fds.data(), static_cast<int>(reg->fds.size()));
    if (e != 0) {
      ReleaseMemory(*reg);
      return ctl::StatusOf(e, "register MR");
    }
    {
      std::lock_guard<std::mutex> l(obj_mu_);
      mrs_[rep.id] = std::move(*reg);
    }
    mem::Mr mr;
    mr.pd = pd;
    mr.key = rep.id;
    mr.access = access;
    mr.iova = iova;
    mr.host = addr;
    mr.length = len;
    return mr;
  }
  absl::StatusOr<mem::Mr> RegMrImplicit(uint32_t pd, uint32_t access) override {
    if (dead()) return absl::UnavailableError("the daemon is gone");
    ctl::RegMr r{};
    r.pd = pd;
    r.access = access;
    r.len = UINT64_MAX;
    r.tier = ctl::kTierImplicit;
    ctl::IdRep rep{};
    if (const int e = c_->Call<ctl::kRegMr>(index_, r, &rep); e != 0) {
      return ctl::StatusOf(e, "register an implicit MR");
    }
    {
      std::lock_guard<std::mutex> l(obj_mu_);
      mrs_[rep.id] = Registration{};  // tier C's: nothing to release
    }
    mem::Mr mr;
    mr.pd = pd;
    mr.key = rep.id;
    mr.access = access;
    mr.length = UINT64_MAX;
    return mr;
  }
  absl::Status DeregMr(uint32_t key) override {
    if (absl::Status s = Destroy<ctl::kDeregMr>(key, "deregister MR"); !s.ok()) return s;
    std::lock_guard<std::mutex> l(obj_mu_);
    if (auto it = mrs_.find(key); it != mrs_.end()) {
      ReleaseMemory(it->second);
      mrs_.erase(it);
    }
    return absl::OkStatus();
  }
  // A new PD or access in droced; a new range would need the registration
  // path's memory tiers again (client_memory.h): not offered.
  absl::Status ReregMr(uint32_t key, uint32_t flags, uint32_t pd, uint64_t, uint64_t, uint64_t,
                       uint32_t access) override {
    if (flags & kReregTranslation) {
      return absl::UnimplementedError("a new translation is not offered in client mode");
    }
    const ctl::ReregMr r{key, flags, pd, access};
    if (int e = Call<ctl::kReregMr>(r); e != 0) return ctl::StatusOf(e, "rereg MR");
    return absl::OkStatus();
  }
  absl::StatusOr<uint32_t> AllocMw(uint32_t pd, uint8_t type) override {
    const ctl::AllocMw a{pd, type};
    ctl::IdRep rep{};
    if (int e = Call<ctl::kAllocMw>(a, &rep); e != 0) return ctl::StatusOf(e, "alloc MW");
    return rep.id;
  }
  absl::Status DeallocMw(uint32_t rkey) override { return Destroy<ctl::kDeallocMw>(rkey, "dealloc MW"); }

  absl::StatusOr<engine::CqHandle> CreateCq(uint32_t min_cqe, cq::CqNotifier* notifier, uint64_t cookie) override {
    const uint32_t mine = next_cookie_.fetch_add(1);
    const ctl::CreateCq a{min_cqe, mine};
    ctl::CqRep rep{};
    int fd = -1;
    if (int e = Call<ctl::kCreateCq>(a, &rep, &fd); e != 0) {
      return ctl::StatusOf(e, "create CQ");
    }
    auto region = cq::CqRegion::Attach(fd, rep.size, rep.entries);
    if (!region.ok()) return region.status();
    engine::CqHandle h;
    h.id = rep.id;
    h.region = region->get();
    std::lock_guard<std::mutex> l(ev_mu_);
    CqEntry& e = cqs_[rep.id];
    e.notifier = notifier;
    e.cookie = cookie;
    e.regions.push_back(std::move(*region));
    e.mine = mine;
    cq_cookies_[mine] = rep.id;
    return h;
  }
  absl::Status DestroyCq(uint32_t id) override {
    if (absl::Status s = Destroy<ctl::kDestroyCq>(id, "destroy CQ"); !s.ok()) return s;
    std::lock_guard<std::mutex> l(ev_mu_);
    if (auto it = cqs_.find(id); it != cqs_.end()) {
      cq_cookies_.erase(it->second.mine);
      cqs_.erase(it);
    }
    return absl::OkStatus();
  }
  absl::StatusOr<cq::CqRegion*> ResizeCq(uint32_t id, uint32_t min_cqe) override {
    const ctl::ResizeCq a{id, min_cqe};
    ctl::CqRep rep{};
    int fd = -1;
    if (int e = Call<ctl::kResizeCq>(a, &rep, &fd); e != 0) {
      return ctl::StatusOf(e, "resize CQ");
    }
    auto region = cq::CqRegion::Attach(fd, rep.size, rep.entries);
    if (!region.ok()) return region.status();
    std::lock_guard<std::mutex> l(ev_mu_);
    cq::CqRegion* r = region->get();
    cqs_[id].regions.push_back(std::move(*region));  // the old ones stay mapped until destroy
    return r;
  }
  absl::Status ModifyCq(uint32_t id, uint16_t count, uint16_t period_us) override {
    const ctl::ModifyCq a{id, count, period_us};
    if (int e = Call<ctl::kModifyCq>(a); e != 0) return ctl::StatusOf(e, "modify CQ");
    return absl::OkStatus();
  }

  absl::StatusOr<engine::QpHandle> CreateQp(const engine::QpCreateArgs& args) override {
    const uint32_t mine = next_cookie_.fetch_add(1);
    ctl::CreateQp a{};
    a.type = static_cast<uint32_t>(args.type);
    a.pd = args.pd;
    a.xrcd = args.xrcd;
    a.send_cq = args.send_cq;
    a.recv_cq = args.recv_cq;
    a.srq = args.srq;
    a.max_send_wr = args.max_send_wr;
    a.max_recv_wr = args.max_recv_wr;
    a.max_send_sge = args.max_send_sge;
    a.max_recv_sge = args.max_recv_sge;
    a.max_inline = args.max_inline;
    a.sq_sig_all = args.sq_sig_all ? 1 : 0;
    a.cookie = mine;
    ctl::QpRep rep{};
    int fd = -1;
    if (int e = Call<ctl::kCreateQp>(a, &rep, &fd); e != 0) {
      return ctl::StatusOf(e, "create QP");
    }
    if (rep.worker >= queues_.size() || rep.rq_offset >= rep.size || rep.shared_offset + sizeof(engine::QpShared) > rep.size) {
      close(fd);
      return absl::InternalError("the daemon's QP reply does not add up");
    }
    auto shm = queue::ShmRegion::Adopt(fd, rep.size);
    if (!shm.ok()) return shm.status();
    uint8_t* base = static_cast<uint8_t*>(shm->data());
    engine::QpHandle h;
    h.qpn = rep.qpn;
    h.worker = static_cast<uint16_t>(rep.worker);
    h.sq = queue::Ring(base);
    h.rq = queue::Ring(base + rep.rq_offset);
    h.shared = reinterpret_cast<engine::QpShared*>(base + rep.shared_offset);
    h.caps = {rep.max_send_wr, rep.max_recv_wr, rep.max_send_sge, rep.max_recv_sge, rep.max_inline};
    std::lock_guard<std::mutex> l(ev_mu_);
    QpEntry& e = qps_[rep.qpn];
    e.sink = args.events;
    e.cookie = args.cookie;
    e.shm = std::move(*shm);
    e.shared = h.shared;
    e.mine = mine;
    qp_cookies_[mine] = rep.qpn;
    return h;
  }
  int ModifyQp(uint32_t qpn, const transport::QpAttr& attr, uint32_t mask) override {
    ctl::ModifyQp a{};
    a.qpn = qpn;
    a.mask = mask;
    a.attr = ctl::Masked(ctl::ToWire(attr), mask);
    return Call<ctl::kModifyQp>(a);
  }
  absl::StatusOr<transport::QpAttr> QueryQp(uint32_t qpn) override {
    const ctl::Id a{qpn, 0};
    ctl::WireQpAttr w{};
    if (int e = Call<ctl::kQueryQp>(a, &w); e != 0) return ctl::StatusOf(e, "query QP");
    transport::QpAttr attr;
    if (absl::Status s = ctl::FromWire(w, &attr); !s.ok()) return s;
    return attr;
  }
  absl::Status DestroyQp(uint32_t qpn) override {
    if (absl::Status s = Destroy<ctl::kDestroyQp>(qpn, "destroy QP"); !s.ok()) return s;
    std::lock_guard<std::mutex> l(ev_mu_);
    if (auto it = qps_.find(qpn); it != qps_.end()) {
      qp_cookies_.erase(it->second.mine);
      qps_.erase(it);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<engine::SrqHandle> CreateSrq(uint32_t pd, uint32_t max_wr, uint32_t max_sge, uint32_t limit,
                                              engine::EventSink* events, uint64_t cookie, uint32_t xrcd,
                                              uint32_t cq) override {
    const uint32_t mine = next_cookie_.fetch_add(1);
    const ctl::CreateSrq a{pd, max_wr, max_sge, limit, mine, xrcd, cq};
    ctl::SrqRep rep{};
    int fd = -1;
    if (int e = Call<ctl::kCreateSrq>(a, &rep, &fd); e != 0) {
      return ctl::StatusOf(e, "create SRQ");
    }
    auto shm = queue::ShmRegion::Adopt(fd, rep.size);
    if (!shm.ok()) return shm.status();
    engine::SrqHandle h;
    h.id = rep.id;
    h.ring = queue::Ring(shm->data());
    h.max_wr = rep.max_wr;
    h.max_sge = rep.max_sge;
    std::lock_guard<std::mutex> l(ev_mu_);
    SrqEntry& e = srqs_[rep.id];
    e.sink = events;
    e.cookie = cookie;
    e.shm = std::move(*shm);
    e.mine = mine;
    srq_cookies_[mine] = rep.id;
    return h;
  }
  int ModifySrq(uint32_t id, uint32_t limit) override {
    const ctl::ModifySrq a{id, limit};
    return Call<ctl::kModifySrq>(a);
  }
  absl::StatusOr<uint32_t> QuerySrqLimit(uint32_t id) override {
    const ctl::Id a{id, 0};
    ctl::IdRep rep{};
    if (int e = Call<ctl::kQuerySrq>(a, &rep); e != 0) return ctl::StatusOf(e, "query SRQ");
    return rep.id;
  }
  absl::Status DestroySrq(uint32_t id) override {
    if (absl::Status s = Destroy<ctl::kDestroySrq>(id, "destroy SRQ"); !s.ok()) return s;
    std::lock_guard<std::mutex> l(ev_mu_);
    if (auto it = srqs_.find(id); it != srqs_.end()) {
      srq_cookies_.erase(it->second.mine);
      srqs_.erase(it);
    }
    return absl::OkStatus();
  }
  absl::StatusOr<uint32_t> CreateAh(uint32_t pd, const transport::AddressVector& av) override {
    ctl::CreateAh a{};
    a.pd = pd;
    a.av = ctl::ToWire(av);
    ctl::IdRep rep{};
    if (int e = Call<ctl::kCreateAh>(a, &rep); e != 0) return ctl::StatusOf(e, "create AH");
    return rep.id;
  }
  absl::Status DestroyAh(uint32_t id) override { return Destroy<ctl::kDestroyAh>(id, "destroy AH"); }
  int AttachMcast(uint32_t qpn, const wire::Ipv6Addr& mgid) override { return Mcast<ctl::kAttachMcast>(qpn, mgid); }
  int DetachMcast(uint32_t qpn, const wire::Ipv6Addr& mgid) override { return Mcast<ctl::kDetachMcast>(qpn, mgid); }
  Counters ReadCounters() override {
    Counters c;
    (void)Call<ctl::kReadCounters>({}, &c);
    return c;
  }
  absl::StatusOr<QpCounters> ReadQpCounters(uint32_t qpn) override {
    const ctl::Id a{qpn, 0};
    QpCounters c;
    if (int e = Call<ctl::kReadQpCounters>(a, &c); e != 0) {
      return ctl::StatusOf(e, "read QP counters");
    }
    return c;
  }

  // The datapath: no system call unless the worker sleeps.
  void Doorbell(const engine::QpHandle& qp, bool wake) override {
    if (qp.shared->doorbell_pending.exchange(1, std::memory_order_acq_rel) == 0) queues_[qp.worker]->Push(qp.qpn);
    if (wake) Kick(qp);
  }
  void Kick(const engine::QpHandle& qp) override {
    engine::WakeWorker(static_cast<engine::WakeWords*>(wake_shm_.data()) + qp.worker);
  }
  bool TryDrive(bool) override { return false; }
  void Handoff() override {}
  void NoteYield() override {
    auto* words = static_cast<engine::WakeWords*>(wake_shm_.data());
    for (int w = 0; w < workers_; ++w) words[w].app_yields.fetch_add(1, std::memory_order_relaxed);
  }
  bool RunOnWorkerForTesting(std::function<void()>) override { return false; }

  // The event thread.
  void OnEvent(const ctl::EventRecord& r) {
    std::lock_guard<std::mutex> l(ev_mu_);
    switch (r.kind) {
      case ctl::kEvCqNotify:
      case ctl::kEvCqError: {
        auto id = cq_cookies_.find(r.id);
        if (id == cq_cookies_.end()) return;  // destroyed meanwhile: dropped, as destroy drops unread events
        CqEntry& e = cqs_[id->second];
        if (e.notifier == nullptr) return;
        if (r.kind == ctl::kEvCqNotify) e.notifier->NotifyCq(e.cookie);
        else e.notifier->CqError(e.cookie);
        return;
      }
      case ctl::kEvQp: {
        auto id = qp_cookies_.find(r.id);
        if (id == qp_cookies_.end()) return;
        QpEntry& e = qps_[id->second];
        if (e.sink != nullptr) e.sink->QpEvent(e.cookie, r.type);
        return;
      }
      case ctl::kEvSrq: {
        auto id = srq_cookies_.find(r.id);
        if (id == srq_cookies_.end()) return;
        SrqEntry& e = srqs_[id->second];
        if (e.sink != nullptr) e.sink->SrqEvent(e.cookie, r.type);
        return;
      }
      case ctl::kEvDevice:
        DeviceEventLocked(r.type);
        return;
      default:
        return;
    }
  }
  // The daemon is gone: the device is dead, once.
  void Lost() {
    std::lock_guard<std::mutex> l(ev_mu_);
    if (!dead_.load()) DeviceEventLocked(IBV_EVENT_DEVICE_FATAL);
  }

 private:
  struct CqEntry {
    cq::CqNotifier* notifier = nullptr;
    uint64_t cookie = 0;
    uint32_t mine = 0;  // its name in event records
    std::vector<std::unique_ptr<cq::CqRegion>> regions;
  };
  struct QpEntry {
    engine::EventSink* sink = nullptr;
    uint64_t cookie = 0;
    queue::ShmRegion shm;
    engine::QpShared* shared = nullptr;
    uint32_t mine = 0;
  };
  struct SrqEntry {
    engine::EventSink* sink = nullptr;
    uint64_t cookie = 0;
    queue::ShmRegion shm;
    uint32_t mine = 0;
  };

  void DeviceEventLocked(int type) {
    if (type == IBV_EVENT_PORT_ACTIVE) port_active_.store(true);
    if (type == IBV_EVENT_PORT_ERR) port_active_.store(false);
    if (type == IBV_EVENT_DEVICE_FATAL) {
      if (dead_.exchange(true)) return;
      port_active_.store(false);
      // The daemon moved every QP to error before it said so; if it died
      // instead, nobody will: mark them here, so that posting fails.
      for (auto& [qpn, e] : qps_) e.shared->state.store(IBV_QPS_ERR, std::memory_order_release);
    }
    for (engine::EventSink* s : sinks_) s->DeviceEvent(type);
  }
  // rep and fds: room for the op's reply (ctl::ShapeOf), checked below.
  // A call of op on this device (Connection::Call, typed).
  template <uint16_t op>
  int Call(const typename ctl::OpDef<op>::Req& req, typename ctl::OpDef<op>::Rep* rep = nullptr,
           int* fds = nullptr) {
    return c_->Call<op>(index_, req, rep, fds);
  }
  // A destroy by id: it succeeds on a dead device whatever the daemon
  // answered (or if it cannot answer).
  template <uint16_t op>
  absl::Status Destroy(uint32_t id, const char* what) {
    if (int e = Call<op>(ctl::Id{id, 0}); e != 0 && !dead()) return ctl::StatusOf(e, what);
    return absl::OkStatus();
  }
  template <uint16_t op>
  int Mcast(uint32_t qpn, const wire::Ipv6Addr& gid) {
    ctl::Mcast a{};
    a.qpn = qpn;
    std::memcpy(a.gid, gid.data(), 16);
    return Call<op>(a);
  }

  Connection* c_;
  uint16_t index_;
  std::mutex attach_mu_;
  bool attached_ = false;
  absl::Status attach_status_;
  engine::PortInfo port_;
  std::atomic<bool> port_active_{true}, dead_{false};
  int workers_ = 1;
  queue::ShmRegion db_shm_, wake_shm_;
  std::vector<std::unique_ptr<queue::DoorbellQueue>> queues_;
  std::atomic<uint32_t> next_cookie_{1};
  // Objects and the callbacks events go to (the event thread reads them).
  std::mutex ev_mu_;
  std::vector<engine::EventSink*> sinks_;
  absl::flat_hash_map<uint32_t, CqEntry> cqs_;
  absl::flat_hash_map<uint32_t, QpEntry> qps_;
  absl::flat_hash_map<uint32_t, SrqEntry> srqs_;
  absl::flat_hash_map<uint32_t, uint32_t> cq_cookies_, qp_cookies_, srq_cookies_;
  std::mutex obj_mu_;
  absl::flat_hash_map<uint32_t, Registration> mrs_;
};

// The process's current connection. Never destroyed: a live connection
// lives until exit, as the embedded engine does (its event thread would
// otherwise be joined by a static destructor while it waits).
std::mutex& current_mu() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::shared_ptr<Connection>& current() {
  static auto* c = new std::shared_ptr<Connection>();
  return *c;
}

// fork(): the child gets a copy of the parent's connection without its
// event thread. It is dropped (and leaked: its std::thread is not the
// child's to join) so that the child's first call connects afresh; the
// lock is held across fork so the child never inherits it taken.
void fork_prepare() { current_mu().lock(); }
void fork_parent() { current_mu().unlock(); }
void fork_child() {
  new (&current_mu()) std::mutex();
  std::shared_ptr<Connection>& cur = current();
  if (cur != nullptr) {
    cur->ForgetInChild();
    new std::shared_ptr<Connection>(std::move(cur));  // never released
    cur = nullptr;
  }
}

void Connection::ForgetInChild() {
  gone_.store(true, std::memory_order_release);
  // events_ stays as it is: the thread is the parent's, and this object is
  // never destroyed.
  if (sock_ >= 0) close(sock_);
  if (event_fd_ >= 0) close(event_fd_);
  sock_ = event_fd_ = -1;
}

absl::StatusOr<std::shared_ptr<Connection>> Connection::Get() {
  static const int atfork = pthread_atfork(fork_prepare, fork_parent, fork_child);
  (void)atfork;
  std::shared_ptr<Connection> old;  // released after the lock: it may be the last reference
  std::lock_guard<std::mutex> l(current_mu());
  std::shared_ptr<Connection>& cur = current();
  if (cur != nullptr && !cur->stopping()) return cur;
  old = std::move(cur);
  auto c = std::make_shared<Connection>();
  if (absl::Status s = c->Open(daemon_socket()); !s.ok()) return s;
  cur = c;
  return c;
}

void Connection::Retire() {
  std::shared_ptr<Connection> mine;  // released after the lock
  std::lock_guard<std::mutex> l(current_mu());
  if (current().get() == this) mine = std::move(current());
}

Connection::~Connection() {
  if (events_.joinable()) {
    if (events_.get_id() == std::this_thread::get_id()) {
      events_.detach();  // the event thread's own last reference, at its very end
    } else {
      // The thread ends when the socket does (it holds a reference while it
      // runs, so it is ending now or the socket is still up: hang it up).
      shutdown(sock_, SHUT_RDWR);
      events_.join();
    }
  }
  sessions_.clear();
  if (sock_ >= 0) close(sock_);
  if (event_fd_ >= 0) close(event_fd_);
}

absl::Status Connection::Open(const std::string& path) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof(a.sun_path)) return absl::InvalidArgumentError("DROCE_DAEMON: socket path too long");
  std::memcpy(a.sun_path, path.c_str(), path.size() + 1);
  sock_ = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (sock_ < 0 || connect(sock_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    return absl::UnavailableError(absl::StrCat("no droced answers on ", path, ": ", std::strerror(errno)));
  }
  event_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (event_fd_ < 0) return absl::ErrnoToStatus(errno, "eventfd");
  const ctl::Hello h{ctl::kVersion, 0, ctl::AbiHash()};
  int fd = -1;
  if (int e = Call<ctl::kHello>(0, h, &hello_, &fd, &event_fd_, 1); e != 0) {
    return absl::UnavailableError(absl::StrCat("droced on ", path, " refused the hello: ", std::strerror(e),
                                               e == EPROTO ? " (a daemon of another droce build)" : ""));
  }
  if (hello_.ndev > ctl::kMaxDevices) return absl::InternalError("droced announced too many devices");
  auto shm = queue::ShmRegion::Adopt(fd, hello_.event_ring_size);
  if (!shm.ok()) return shm.status();
  ev_shm_ = std::move(*shm);
  ev_ring_ = queue::Ring(ev_shm_.data());
  if (ev_ring_.stride() != sizeof(ctl::EventRecord) || ev_ring_.size() == 0 ||
      queue::ring_bytes(ev_ring_.size(), ev_ring_.stride()) > ev_shm_.size()) {
    return absl::InternalError("droced's event ring does not match");
  }
  for (int i = 0; i < hello_.ndev; ++i) sessions_.push_back(std::make_unique<DaemonSession>(this, i));
  // The thread keeps the connection while it runs: its sessions' event
  // sinks are called from it until the socket hangs up.
  events_ = std::thread([self = shared_from_this()] {
    self->EventLoop();
    self->Retire();
  });
  return absl::OkStatus();
}

DaemonSession* Connection::session(int i) { return sessions_[static_cast<size_t>(i)].get(); }

int Connection::Call(uint16_t op, uint16_t dev, const void* req, size_t req_len, const int* fds, int nfds, void* rep,
                     size_t rep_room, int* out_fds) {
  const ctl::OpShape& shape = *ctl::ShapeOf(op);
  if (rep_room != shape.rep_len) return EINVAL;  // a caller that disagrees with the protocol table
  uint8_t buf[ctl::kMaxMessage];
  if (gone()) return EIO;  // before the lock: a forked child's copy may have it taken
  std::lock_guard<std::mutex> l(mu_);
  if (gone()) return EIO;
  ctl::Header h{ctl::kMagic, op, dev, ++seq_, static_cast<uint32_t>(sizeof(ctl::Header) + req_len)};
  std::memcpy(buf, &h, sizeof(h));
  if (req_len != 0) std::memcpy(buf + sizeof(h), req, req_len);
  if (ctl::SendMsg(sock_, buf, h.len, fds, nfds) != static_cast<ssize_t>(h.len)) return EIO;
  int got[ctl::kMaxFds];
  int ngot = 0;
  const ssize_t n = ctl::RecvMsg(sock_, buf, sizeof(buf), got, &ngot);
  ctl::Reply r;
  int err = 0;
  if (n < static_cast<ssize_t>(sizeof(r))) {
    err = EIO;
  } else {
    std::memcpy(&r, buf, sizeof(r));
    if (r.h.magic != ctl::kMagic || r.h.op != (op | ctl::kReplyBit) || r.h.seq != h.seq || r.h.len != n) {
      err = EIO;
    } else if (r.err != 0) {
      err = r.err;
    } else if (static_cast<size_t>(n) != sizeof(r) + shape.rep_len || ngot != shape.rep_fds) {
      err = EIO;
    } else {
      if (shape.rep_len != 0) std::memcpy(rep, buf + sizeof(r), shape.rep_len);
      for (int i = 0; i < ngot; ++i) out_fds[i] = got[i];
      ngot = 0;
    }
  }
  for (int i = 0; i < ngot; ++i) close(got[i]);
  return err;
}

void Connection::EventLoop() {
  pthread_setname_np(pthread_self(), "droce-events");
  t_event_connection = this;
  uint32_t cons = 0;
  for (;;) {
    pollfd p[2] = {{event_fd_, POLLIN, 0}, {sock_, 0, 0}};
    if (poll(p, 2, -1) < 0 && errno != EINTR) break;
    uint64_t v;
    (void)!read(event_fd_, &v, sizeof(v));
    // C1: the records up to prod are visible (the daemon published them
    // before poking the eventfd).
    const uint32_t prod = ev_ring_.load_prod_acquire();
    while (cons != prod) {
      ctl::EventRecord r;
      std::memcpy(&r, ev_ring_.slot(cons), sizeof(r));
      ++cons;
      ev_ring_.publish_cons(cons);  // C2
      // Before anyone hears the DEVICE_FATAL: posting already fails with
      // EIO and a new open already makes a new connection.
      if (r.kind == ctl::kEvDevice && (r.flags & ctl::kEvDaemonStopping) != 0) {
        stopping_.store(true, std::memory_order_release);
      }
      if (r.dev < sessions_.size()) sessions_[r.dev]->OnEvent(r);
    }
    if ((p[1].revents & (POLLHUP | POLLERR)) != 0) break;
  }
  gone_.store(true, std::memory_order_release);
  for (auto& s : sessions_) s->Lost();
}

}  // namespace

const std::string& daemon_socket() {
  static const std::string path = [] {
    const char* d = std::getenv("DROCE_DAEMON");
    if (d != nullptr && *d != '\0') return std::string(d);
    const char* link = std::getenv("DROCE_LINK");
    if (link != nullptr && *link != '\0') return std::string();
    // The default socket, if a daemon answers there.
    sockaddr_un a{};
    a.sun_family = AF_UNIX;
    std::strcpy(a.sun_path, daemon::kDefaultSocket);
    const int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    const bool live = s >= 0 && connect(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    if (s >= 0) close(s);
    return live ? std::string(daemon::kDefaultSocket) : std::string();
  }();
  return path;
}

absl::Status check_config() {
  if (daemon_socket().empty()) return engine::Device::CheckConfig().status();
  return Connection::Get().status();
}

int daemon_call(uint16_t op, const void* req, size_t len, const int* fds, int nfds, void* rep, size_t rep_room) {
  if (daemon_socket().empty()) return ENODEV;
  auto c = Connection::Get();
  if (!c.ok()) return ENODEV;
  return (*c)->Call(op, 0, req, len, fds, nfds, rep, rep_room);
}

int device_count() {
  if (daemon_socket().empty()) return engine::Device::Count();
  auto c = Connection::Get();
  return c.ok() ? (*c)->devices() : 0;
}

absl::StatusOr<std::shared_ptr<engine::Session>> session_for(int index) {
  if (daemon_socket().empty()) {
    auto d = engine::Device::Instance(index);
    if (!d.ok()) return d.status();
    // DROCE_CTL=1: answer `droce ctl --pid` once a device runs.
    static const bool ctl = [] {
      auto cfg = engine::Device::CheckConfig();
      return cfg.ok() && cfg->ctl;
    }();
    if (ctl) admin::StartEmbeddedCtl();
    // The embedded device lives until exit: a reference that owns nothing.
    return std::shared_ptr<engine::Session>(std::shared_ptr<void>(), *d);
  }
  std::shared_ptr<Connection> c;
  if (t_event_connection != nullptr) {
    c = t_event_connection->shared_from_this();  // a sink on the event thread
  } else {
    auto got = Connection::Get();
    if (!got.ok()) return got.status();
    c = std::move(*got);
  }
  if (index < 0 || index >= c->devices()) return absl::NotFoundError("no such device on the daemon");
  DaemonSession* s = c->session(index);
  if (absl::Status st = s->EnsureAttached(); !st.ok()) return st;
  // Aliasing: the session's reference keeps its connection.
  return std::shared_ptr<engine::Session>(std::move(c), s);
}

}  // namespace droce::provider
