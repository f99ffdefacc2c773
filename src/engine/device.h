// One droce device: a link (DPDK port), one port with its addresses, and the
// poll-mode worker that owns every QP, CQ producer and MR of the device.
//
// The control path (PD/MR/CQ/QP create, modify, destroy) runs on the worker
// through a mailbox: the caller blocks until the worker has executed it. So
// the worker's tables need no locks, and once DeregMr/DestroyQp returns the
// worker can no longer touch that memory. The datapath needs no control call:
// the provider writes WQEs into shared rings and rings a doorbell.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/counters.h"
#include "cq/cq.h"
#include "engine/config.h"
#include "engine/mcast.h"
#include "engine/neighbor.h"
#include "io/dpdk_port.h"
#include "mem/mr_table.h"
#include "queue/doorbell.h"
#include "queue/shm.h"
#include "transport/env.h"
#include "transport/qp.h"

struct rte_mbuf;

namespace droce::engine {

struct PortInfo {
  std::string name;   // "droce0"
  wire::MacAddr mac{};
  uint32_t ip = 0;    // host order
  uint8_t prefix_len = 24;
  uint8_t active_mtu = 3;  // enum ibv_mtu
  uint32_t link_mtu = 1500;
  // The GID table (all RoCE v2): index 0 the IPv4 address as an IPv4-mapped
  // GID, index 1 the IPv6 address when DROCE_IP6 is set (transport::PortAddr
  // routes by the same indexes).
  uint8_t gids[2][16] = {};
  unsigned gid_count = 1;
};

// Per-QP words shared with the provider (after the SQ and RQ rings).
struct QpShared {
  alignas(queue::kCacheLine) std::atomic<uint32_t> doorbell_pending;
};

// Receives asynchronous events (IBV_EVENT_*) for QPs and SRQs; called on the
// worker thread with the cookie given at creation.
class EventSink {
 public:
  virtual ~EventSink() = default;
  virtual void QpEvent(uint64_t cookie, int event_type) = 0;
  virtual void SrqEvent(uint64_t cookie, int event_type) = 0;
  // Unaffiliated events of the device: IBV_EVENT_PORT_ACTIVE, PORT_ERR (port
  // 1) and DEVICE_FATAL. Only sinks registered with AddDeviceSink get them.
  virtual void DeviceEvent(int event_type) { (void)event_type; }
};

struct QpCreateArgs {
  transport::QpType type = transport::QpType::kRc;
  uint32_t pd = 0;
  uint32_t send_cq = 0, recv_cq = 0;
  uint32_t srq = 0;  // 0: the QP has its own receive queue
  EventSink* events = nullptr;
  uint64_t cookie = 0;
  uint32_t max_send_wr = 0, max_recv_wr = 0, max_send_sge = 0, max_recv_sge = 0, max_inline = 0;
  bool sq_sig_all = false;
};

struct QpHandle {
  uint32_t qpn = 0;
  queue::Ring sq, rq;
  QpShared* shared = nullptr;
  transport::QpCaps caps;
};

struct SrqHandle {
  uint32_t id = 0;
  queue::Ring ring;
  uint32_t max_wr = 0, max_sge = 0;
};

struct CqHandle {
  uint32_t id = 0;
  cq::CqRegion* region = nullptr;
};

// Device limits reported through ibv_query_device.
struct Limits {
  static constexpr uint32_t kMaxQpWr = 16384;
  static constexpr uint32_t kMaxSge = 32;
  static constexpr uint32_t kMaxInline = 256;
  static constexpr uint32_t kMaxCqe = 1 << 20;
  static constexpr uint32_t kMaxQp = 1 << 16;
  static constexpr uint32_t kMaxCq = 1 << 16;
  static constexpr uint32_t kMaxMr = 1 << 20;
  static constexpr uint32_t kMaxPd = 1 << 16;
  static constexpr uint64_t kMaxMrSize = 1ull << 40;
};

class Device : public transport::TransportEnv {
 public:
  // The process's droce<index>, started on first use from the DROCE_*
  // environment.
  static absl::StatusOr<Device*> Instance(int index = 0);
  // Devices configured (DROCE_LINK entries separated by ';').
  static int Count();
  // Reads and validates the configuration without starting anything.
  static absl::StatusOr<Config> CheckConfig();

  const PortInfo& port() const { return port_; }
  // The port's state (ibv_query_port): active unless its link went down
  // after having been up, or the device died. A link that has not come up
  // yet (a memif waiting for its peer) counts as active: frames wait for it
  // and RC retries cover the gap, as on a NIC whose link is training.
  bool port_active() const { return port_active_.load(std::memory_order_relaxed); }
  // The engine died (IBV_EVENT_DEVICE_FATAL was raised): every QP is in the
  // error state, the link is no longer used, and calls that would create or
  // enable objects fail with EIO.
  bool dead() const { return dead_.load(std::memory_order_acquire); }
  // Runs fn on the engine as a control call does; for tests that need the
  // engine to fail from inside (an exception escaping fn kills the device).
  void RunOnWorkerForTesting(std::function<void()> fn) { RunOnWorker(std::move(fn)); }
  // Contexts receive the device's unaffiliated events (worker thread).
  void AddDeviceSink(EventSink* sink);
  void RemoveDeviceSink(EventSink* sink);

  absl::StatusOr<uint32_t> AllocPd();
  absl::Status DeallocPd(uint32_t pd);
  absl::StatusOr<mem::Mr> RegMr(uint32_t pd, uint64_t addr, uint64_t len, uint64_t iova,
                                uint32_t access);
  absl::Status DeregMr(uint32_t key);
  absl::StatusOr<uint32_t> AllocMw(uint32_t pd, uint8_t type);
  absl::Status DeallocMw(uint32_t rkey);
  absl::StatusOr<CqHandle> CreateCq(uint32_t min_cqe, cq::CqNotifier* notifier, uint64_t cookie);
  absl::Status DestroyCq(uint32_t id);
  // Replaces the CQ's region with one of at least min_cqe entries; the caller
  // holds the consumer idle and switches it to the returned region.
  absl::StatusOr<cq::CqRegion*> ResizeCq(uint32_t id, uint32_t min_cqe);
  // Event moderation (ibv_modify_cq; see cq::CqProducer::SetModeration).
  absl::Status ModifyCq(uint32_t id, uint16_t count, uint16_t period_us);
  absl::StatusOr<QpHandle> CreateQp(const QpCreateArgs& args);
  // Returns 0 or an errno.
  int ModifyQp(uint32_t qpn, const transport::QpAttr& attr, uint32_t mask);
  absl::StatusOr<transport::QpAttr> QueryQp(uint32_t qpn);
  absl::StatusOr<SrqHandle> CreateSrq(uint32_t pd, uint32_t max_wr, uint32_t max_sge, uint32_t limit,
                                      EventSink* events, uint64_t cookie);
  // Arms the SRQ limit; returns 0 or an errno.
  int ModifySrq(uint32_t id, uint32_t limit);
  absl::StatusOr<uint32_t> QuerySrqLimit(uint32_t id);
  absl::Status DestroySrq(uint32_t id);
  absl::StatusOr<uint32_t> CreateAh(uint32_t pd, const transport::AddressVector& av);
  absl::Status DestroyAh(uint32_t id);
  // Fails (FailedPrecondition, EBUSY at the verbs boundary) while the QP is
  // attached to a multicast group: IBA o10-2.2.3, as the kernel does.
  absl::Status DestroyQp(uint32_t qpn);
  // ibv_attach_mcast / ibv_detach_mcast for UD QPs (engine/mcast.h has the
  // rules). Return 0 or an errno.
  int AttachMcast(uint32_t qpn, const wire::Ipv6Addr& mgid);
  int DetachMcast(uint32_t qpn, const wire::Ipv6Addr& mgid);
  Counters ReadCounters();
  // One QP's counters, read on the worker (their only writer).
  absl::StatusOr<QpCounters> ReadQpCounters(uint32_t qpn);

  // Datapath, any thread: new WQEs are in the QP's rings.
  // With wake=false the caller drives or wakes the worker itself (Kick).
  void Doorbell(const QpHandle& qp, bool wake = true);
  // After doorbells: drive the engine on this thread if nobody is driving,
  // else make sure the worker is awake to see them.
  void Kick();
  // Application-driven progress: runs one turn of the engine loop on the
  // calling thread unless another thread is driving. Returns whether there
  // was work.
  bool TryDrive(bool polling = true);
  // An application thread that drove the engine is about to block (e.g. in
  // ibv_get_cq_event): the worker takes over now.
  void Handoff();

  // TransportEnv (worker thread only).
  uint64_t NowNs() override;
  bool AllocFrame(uint32_t len, transport::TxFrame* frame) override;
  void SendFrame(const transport::TxFrame& frame, uint32_t len) override;
  bool ResolveMac(const wire::Ipv6Addr& dgid, wire::MacAddr* mac) override;
  mem::MrTable& Mrs() override { return mrs_; }
  bool InvalidateRkey(uint32_t rkey, uint32_t pd) override;
  const transport::AddressHandle* FindAh(uint32_t id) override;
  Counters& Stats() override { return stats_; }

 private:
  struct QpEntry {
    std::unique_ptr<transport::Qp> qp;
    queue::ShmRegion shm;
    QpShared* shared = nullptr;
    bool active = false;  // on active_ (has something to send)
    bool timed = false;   // on timed_ (awaits ACKs)
    uint32_t pd = 0, send_cq = 0, recv_cq = 0, srq = 0;
    EventSink* events = nullptr;
    uint64_t cookie = 0;
  };
  struct SrqEntry {
    std::unique_ptr<transport::Srq> srq;
    queue::ShmRegion shm;
    uint32_t pd = 0;
    uint32_t users = 0;
    EventSink* events = nullptr;
    uint64_t cookie = 0;
  };
  struct CqEntry {
    std::unique_ptr<cq::CqRegion> region;
    std::vector<std::unique_ptr<cq::CqRegion>> retired;  // regions before ibv_resize_cq
    std::unique_ptr<cq::CqProducer> producer;
    uint32_t users = 0;
  };
  Device() = default;
  absl::Status Start(const Config& cfg);
  transport::PortAddr TransportPort() const;
  void WorkerMain(Config cfg, std::promise<absl::Status>* started);
  // Runs fn on the worker and waits for it.
  void RunOnWorker(std::function<void()> fn);
  void Wake();

  // worker.cc
  void Loop();
  bool PollOnce();
  void RunMailbox();
  void HandleDoorbells();
  void HandleFrame(rte_mbuf* m);
  // A RoCE packet to a multicast address: to every QP attached to its group.
  void HandleMulticast(const wire::PacketView& v);
  // A validated packet for one of the device's QPs.
  void DeliverPacket(QpEntry* e, const wire::PacketView& v);
  // Learns the MAC of a RoCE packet's sender (replies need no ARP or ND).
  void LearnSender(const wire::PacketView& v);
  // Delivers the multicast frames this device sent to its own attached QPs.
  void LoopBackMulticast();
  void FlushTx();
  void Activate(QpEntry* e);
  void RunTimers(uint64_t now);
  // port_state.cc: link polling, PORT_ACTIVE/PORT_ERR, DEVICE_FATAL.
  void PollLinkState();
  void RaiseDeviceEvent(int event_type);
  void EnterFatal(const char* why);
  // PollOnce, turning an exception that escapes the engine into a dead
  // device instead of unwinding into the application.
  bool PollOnceGuarded();
  // Whether a CQ holds back a moderated event (the worker must not sleep).
  bool CqEventHeld() const;
  void IdleBackoff(unsigned idle_loops);
  void Nap(long ns);
  void DeliverEvents(QpEntry* e);
  // Objects count as users of their PD (worker thread): PdUses is nullptr for
  // an unknown PD; ReleasePd drops one use.
  uint32_t* PdUses(uint32_t pd);
  void ReleasePd(uint32_t pd);
  // Runs create() on the worker for a new object on `pd` (NotFound if there
  // is no such PD); a successful one counts as a use of the PD.
  template <typename T, typename Create>
  absl::StatusOr<T> CreateOnPd(uint32_t pd, Create create) {
    absl::StatusOr<T> r = absl::NotFoundError("no such PD");
    RunOnWorker([&] {
      uint32_t* uses = PdUses(pd);
      if (uses == nullptr) return;
      r = create();
      if (r.ok()) ++*uses;
    });
    return r;
  }
  // arp.cc
  void HandleArp(const uint8_t* f, size_t len);
  void SendArp(uint16_t op, const wire::MacAddr& tha, uint32_t tip);

  PortInfo port_;
  io::DpdkPort dpdk_;
  std::thread worker_;
  std::atomic<bool> stop_{false};

  // Mailbox (control path).
  std::mutex mbox_mu_;
  std::deque<std::function<void()>> mbox_;
  std::atomic<bool> mbox_pending_{false};

  // Wakeup: the worker sleeps on `wake_seq_` (futex) when idle.
  alignas(queue::kCacheLine) std::atomic<uint32_t> wake_seq_{0};
  std::atomic<uint32_t> sleeping_{0};
  std::atomic<bool> drive_lock_{false};
  std::atomic<uint64_t> last_app_drive_ns_{0};
  bool app_progress_ = true;
  queue::DoorbellQueue doorbells_{4096};

  // Worker-owned state.
  absl::flat_hash_map<uint32_t, std::unique_ptr<QpEntry>> qps_;
  absl::flat_hash_map<uint32_t, CqEntry> cqs_;
  absl::flat_hash_map<uint32_t, uint32_t> pds_;  // pd → objects using it
  absl::flat_hash_map<uint32_t, SrqEntry> srqs_;
  absl::flat_hash_map<uint32_t, transport::AddressHandle> ahs_;
  McastGroups mcast_;
  // Copies of multicast frames sent on a link that does not return them
  // (every link but the internal loopback), for LoopBackMulticast.
  bool link_loops_back_ = false;
  std::vector<rte_mbuf*> mcast_loop_;
  uint32_t next_srq_ = 1;
  uint32_t next_ah_ = 1;
  mem::MrTable mrs_;
  std::vector<QpEntry*> active_, timed_;
  std::vector<cq::CqProducer*> ticked_cqs_;  // CQs with a moderation period
  uint32_t next_qpn_ = 0x11;
  uint32_t next_cq_ = 1;
  uint32_t next_pd_ = 1;
  Counters stats_;
  std::vector<rte_mbuf*> tx_;
  uint64_t last_timer_ns_ = 0;
  uint64_t last_busy_ns_ = 0;
  // port_state.cc
  std::atomic<bool> port_active_{true};
  std::atomic<bool> dead_{false};
  bool link_seen_up_ = false;
  uint64_t last_link_poll_ns_ = 0;
  std::vector<EventSink*> device_sinks_;

  // links & addressing (io/arp/icmp/nd)
  // The next hop for an IPv4 destination: itself on the subnet (or with no
  // gateway configured), else the gateway.
  uint32_t NextHop(uint32_t dip) const;
  bool ResolveMac4(uint32_t dip, wire::MacAddr* mac);
  // A confirmed IPv4 → MAC mapping; wakes the QPs waiting on it if it is new.
  void LearnNeighbor(uint32_t ip, const wire::MacAddr& mac, bool create);
  void SendGratuitousArp();
  // Frames that are not RoCE but may be for the port (icmp.cc): ICMP echo,
  // ICMPv6 echo and neighbour discovery. Returns true if the frame was
  // consumed (answered or deliberately ignored).
  bool HandleLocal(const uint8_t* f, size_t len);
  void HandleIcmp4(const uint8_t* f, size_t len, unsigned l3);
  // IPv6 (nd.cc): ICMPv6 echo and neighbour discovery (RFC 4861) for the
  // port's IPv6 address (DROCE_IP6), and a resolver for IPv6 next hops.
  void HandleIcmp6(const uint8_t* f, size_t len, unsigned l3);
  void SendNeighborSolicit(const wire::Ipv6Addr& target, const wire::MacAddr* unicast);
  void SendNeighborAdvert(const wire::MacAddr& dmac, const wire::Ipv6Addr& dip, bool solicited);
  bool ResolveMac6(const wire::Ipv6Addr& dip, wire::MacAddr* mac);
  // A confirmed IPv6 → MAC mapping (ND, RoCE traffic); wakes the QPs waiting
  // on it if it is new, as LearnNeighbor does.
  void LearnNeighbor6(const wire::Ipv6Addr& ip, const wire::MacAddr& mac, bool create);
  // Puts every QP on the active list (cold path: a neighbour some may wait
  // for was resolved or moved).
  void ActivateAllQps();
  // Puts the port's 802.1Q tag in front of a frame about to be sent (no-op
  // without DROCE_VLAN).
  void TagFrame(rte_mbuf* m);
  // Whether a received frame belongs to this port's VLAN (or, without one,
  // is untagged or priority-tagged). `m` may carry a tag the PMD stripped.
  bool VlanAccepts(const rte_mbuf* m, const uint8_t* f, size_t len) const;
  // Neighbour caches (engine/neighbor.h): IPv4 next hops by ARP, IPv6 by ND.
  using ArpCache = NeighborCache<uint32_t>;
  using NdCache = NeighborCache<wire::Ipv6Addr>;
  ArpCache arp_;
  NdCache nd_;
  bool has_ip6_ = false;
  wire::Ipv6Addr ip6_{};
  uint8_t prefix6_len_ = 64;
  uint32_t gateway_ = 0;
  uint32_t subnet_mask_ = 0;
  uint16_t vlan_tci_ = 0;  // 0: untagged
  uint16_t ip_id_ = 0;     // IPv4 identification for ICMP replies
};

}  // namespace droce::engine
