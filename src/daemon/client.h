// droced's side of one client connection (src/daemon/server.cc accepts
// them): the client's state (Server::Client: its devices, objects and event
// ring) and the Handler that serves its requests, one handler per op of the
// control protocol's table (src/ctl/protocol.h, DROCE_CTL_OPS; handler.cc),
// and tears down what it owned when it goes.
#pragma once

#include <sys/types.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "common/spin_lock.h"
#include "ctl/protocol.h"
#include "daemon/server.h"
#include "queue/shm.h"

namespace droce::daemon {

// A registration's pages as mapped here.
struct MrMap {
  uint8_t* base = nullptr;
  size_t len = 0;
  uint64_t bytes = 0;  // counted against the client's limit
};

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
    // The engine knows what the client owns (Device::OwnerOf); droced
    // keeps what it spends on it: each CQ's entries (counted against the
    // client's limit) and each MR's pages as mapped here.
    absl::flat_hash_map<uint32_t, uint32_t> cqes;  // CQ id → entries
    absl::flat_hash_map<uint32_t, MrMap> mrs;       // by key

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

// One message as received: its bytes and the fds that came with it.
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
    T v{};
    if constexpr (!std::is_same_v<T, ctl::None>) std::memcpy(&v, m.buf + sizeof(ctl::Header), sizeof(T));
    return v;
  }
  bool Reply(const ctl::Header& h, int err, const void* payload = nullptr, size_t len = 0, const int* fds = nullptr,
             int nfds = 0);
  int Foreign() {
    st_.foreign_handles.fetch_add(1, std::memory_order_relaxed);
    return EINVAL;
  }
  // One handler per op of DROCE_CTL_OPS (src/ctl/protocol.h), with the
  // request's payload: OnConn for the connection's ops, OnDev for a
  // device's (attached: Dispatch checked). An op without its handler does
  // not compile.
  template <uint16_t op>
  bool Dispatch(const ctl::Header& h, Msg& m);
  template <uint16_t op>
  bool OnConn(const ctl::Header& h, const typename ctl::OpDef<op>::Req& req, Msg& m) = delete;
  template <uint16_t op>
  bool OnDev(const ctl::Header& h, const typename ctl::OpDef<op>::Req& req, Msg& m, Server::Client::Dev& d) = delete;
  bool Mcast(const ctl::Header& h, const ctl::Mcast& a, Server::Client::Dev& d, bool attach);
  // Whether the engine says the object is this client's.
  bool Owns(const Server::Client::Dev& d, engine::ObjKind kind, uint32_t id);
  // A destroy of one of the client's objects (else EINVAL, counted as
  // foreign): destroy() is the engine's call; on success it leaves the live
  // count.
  template <typename Destroy>
  bool DestroyOwned(const ctl::Header& h, const Server::Client::Dev& d, engine::ObjKind kind, uint32_t id,
                    Destroy destroy);
  void DropMr(Server::Client::Dev& d, uint32_t key);
  void Live(int delta) { st_.objects_live.fetch_add(static_cast<uint64_t>(delta), std::memory_order_relaxed); }

  Server::Client& c_;
  ServerStats& st_;
  const ClientLimits& lim_;
  cm::Ucma* ucma_;
  uint32_t cm_owner_;  // the high half of this client's channel keys
  admin::Host* admin_;
  absl::flat_hash_map<uint32_t, int> cm_fds_;  // the client's channel fd -> its eventfd here
};

}  // namespace droce::daemon
