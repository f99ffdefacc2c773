// The connection manager, in two layers as Linux's rdma_cm (cma.c) over its
// IB CM (cm.c):
// - the id layer, Manager (this file, manager.cc): the RDMA CM's
//   identifiers, port spaces, bind, address and route resolution, listen,
//   options, multicast joins, QP attributes and the events to the
//   application (what Linux's rdma_cm offers librdmacm through rdma_ucm);
//   it finds the listener of a request and makes its id;
// - the IB Communication Manager protocol on QP1, IbCm (ib_cm.h,
//   ib_cm.cc): the CM messages (mad.h), comm IDs, retransmissions,
//   timewait, MRA, the duplicate and stale checks and requests held until
//   their listener comes. The id layer calls it to send and track messages;
//   it calls the id layer back (IbCm::IdLayer) with what came in. Each id
//   is one Manager::Id, which extends the IB CM's Conn.
// One Manager serves every droce port of a process (embedded mode). It is
// DPDK-free and single-threaded: its owner serialises the calls (the
// provider's CM thread and the application's rdma_ucm writes under one
// mutex) and gives it the time; tests drive it in virtual time with two
// managers wired to each other (tests/unit/cm_manager_test.cc).
//
// Each command returns 0 or a negative errno, as the kernel's ucma_write
// does. Events go to the EventFn as they happen, inside the call that made
// them (a command, OnMad or OnTimer).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cm/ib_cm.h"
#include "cm/mad.h"

namespace droce::cm {

// rdma_cm's event numbers (enum rdma_cm_event_type).
enum EventType : uint32_t {
  kAddrResolved = 0,
  kAddrError,
  kRouteResolved,
  kRouteError,
  kConnectRequest,
  kConnectResponse,
  kConnectError,
  kUnreachable,
  kRejected,
  kEstablished,
  kDisconnected,
  kDeviceRemoval,
  kMulticastJoin,
  kMulticastError,
  kAddrChange,
  kTimewaitExit,
};

// Port spaces (enum rdma_ucm_port_space) and QP types (enum ibv_qp_type).
inline constexpr uint16_t kRdmaPsIpoib = 0x0002, kRdmaPsIb = 0x013F, kRdmaPsTcp = 0x0106, kRdmaPsUdp = 0x0111;
inline constexpr uint8_t kQpRc = 2, kQpUd = 4;
inline constexpr uint32_t kUdpQkey = 0x01234567;  // RDMA_UDP_QKEY
inline constexpr uint32_t kIbMulticastQpn = 0xFFFFFF;

// An IP address and port as the CM keeps them: IPv4 as the IPv4-mapped GID.
struct IpAddr {
  bool v6 = false;
  Gid ip{};
  uint16_t port = 0;  // host order
  bool any() const;
  bool loopback() const;
  bool operator==(const IpAddr&) const = default;
};
// sockaddr_in / sockaddr_in6 <-> IpAddr; false for other families or lengths.
bool from_sockaddr(const sockaddr* sa, size_t len, IpAddr* out);
void to_sockaddr(const IpAddr& a, sockaddr_in6* out);  // sockaddr_in for IPv4 (it fits)
Gid ipv4_gid(uint32_t ip_host);

// What the manager needs of a droce port, and how it reaches QP1 there.
struct LocalPort {
  int dev = 0;              // the device index (droce<dev>)
  uint64_t node_guid = 0;   // host order
  uint32_t ip4 = 0;         // host order
  uint8_t prefix_len = 24;
  bool has_ip6 = false;
  Gid ip6{};
  uint8_t active_mtu = 3;   // enum ibv_mtu
  uint8_t ack_delay = 15;   // local_ca_ack_delay
};
class PortIo {
 public:
  virtual ~PortIo() = default;
  // Sends a MAD from QP1 to (dgid, dqpn) with Q_Key kGsiQkey.
  virtual void SendMad(const Gid& sgid, const Gid& dgid, uint32_t dqpn, uint8_t tclass,
                       std::span<const uint8_t, kMadSize> mad) = 0;
  // Whether dgid's link-layer address is known: 1 yes, 0 not yet (asked),
  // <0 an errno (no route).
  virtual int Resolve(const Gid& dgid) = 0;
};

// Where a MAD came from (its IP header and DETH).
struct MadSource {
  Gid sgid{}, dgid{};
  uint32_t src_qpn = 0;
  uint8_t tclass = 0, hop_limit = 0;
};

// An address vector as rdma_cm reports it (struct ib_uverbs_ah_attr).
struct AhInfo {
  Gid dgid{};
  uint32_t flow_label = 0;
  uint8_t sgid_index = 0, hop_limit = 64, traffic_class = 0;
  uint8_t sl = 0, is_global = 1, port_num = 1;
};

// rdma_ucm_conn_param / rdma_ucm_ud_param, both ways.
struct ConnParam {
  uint32_t qp_num = 0;
  uint32_t qkey = 0;
  uint8_t private_data[256] = {};
  uint8_t private_data_len = 0;
  uint8_t srq = 0;
  uint8_t responder_resources = 0;
  uint8_t initiator_depth = 0;
  uint8_t flow_control = 0;
  uint8_t retry_count = 0;
  uint8_t rnr_retry_count = 0;
  bool valid = false;
  AhInfo ah;  // UD events
};

struct Event {
  uint32_t id = 0;      // the identifier it is for (a new one for CONNECT_REQUEST)
  uint32_t parent = 0;  // CONNECT_REQUEST: the listener
  uint32_t mc = 0;      // MULTICAST_JOIN/ERROR: the join
  uint32_t event = 0;
  int32_t status = 0;
  bool ud = false;      // param is rdma_ucm_ud_param
  ConnParam param;
};
using EventFn = std::function<void(const Event&)>;

// QP attributes rdma_init_qp_attr gives (a subset of ib_uverbs_qp_attr).
struct QpAttr {
  uint32_t mask = 0;  // IBV_QP_* bits
  uint32_t qp_state = 0, path_mtu = 0, qkey = 0, rq_psn = 0, sq_psn = 0, dest_qp_num = 0, access = 0;
  AhInfo ah;
  uint16_t pkey_index = 0;
  uint8_t max_rd_atomic = 0, max_dest_rd_atomic = 0, min_rnr_timer = 0, port_num = 1, timeout = 0,
          retry_cnt = 0, rnr_retry = 0;
};

// What QUERY_ROUTE reports.
struct RouteInfo {
  uint64_t node_guid = 0;  // host order; 0 while the id has no device
  int dev = -1;
  IpAddr src, dst;
  Gid sgid{}, dgid{};
  uint32_t num_paths = 0;
  uint8_t mtu = 0, hop_limit = 64, traffic_class = 0, packet_life_time = 0;
};

#define DROCE_CM_STATS(X)                                                                 \
  X(mads_in, "CM MADs received")                                                          \
  X(mads_out, "CM MADs sent")                                                             \
  X(retransmits, "REQ, REP, DREQ and SIDR_REQ sent again after their timeout")            \
  X(bad_mads, "MADs the decoder refused (not a CM Send, unknown attribute, reserved value)") \
  X(unknown_comm_id, "MRA, REJ, REP, RTU, DREQ, DREP or SIDR_REP for no connection here")  \
  X(rejects_sent, "REJs sent")                                                            \
  X(no_listener, "REQs and SIDR_REQs for a service nobody listens on")                   \
  X(early_reqs, "REQs and SIDR_REQs held until their listener came (or refused after 100 ms)") \
  X(duplicates, "duplicate REQs, REPs, DREQs and SIDR_REQs (answered again)")            \
  X(stale, "REQs rejected as stale (connection in timewait or QP still connected)")      \
  X(flood_rejects, "REQs refused because a listener had 4096 unanswered")                \
  X(ids, "ids created")
struct CmStats {
#define DROCE_CM_STAT_FIELD(name, desc) uint64_t name = 0;
  DROCE_CM_STATS(DROCE_CM_STAT_FIELD)
#undef DROCE_CM_STAT_FIELD
};

class Manager : private IbCm::IdLayer {
 public:
  using Clock = std::function<uint64_t()>;  // ns
  Manager(EventFn events, Clock clock, uint64_t seed);
  ~Manager();

  void AddPort(const LocalPort& port, PortIo* io);
  // The port went away: DEVICE_REMOVAL to every id on it.
  void RemovePort(int dev);

  int CreateId(uint16_t ps, uint8_t qp_type, uint32_t* id);
  // Destroys an id as rdma_destroy_id does (REJ or DREQ to a peer as the
  // state calls for); unknown ids: -EINVAL.
  int DestroyId(uint32_t id);
  // The process ends (the embedded connection manager dies with it): every
  // peer is told as if each id were destroyed (DREQ, REJ), as the kernel
  // does when a process's rdma_cm file closes; the ids stay, so the process's
  // other threads find what they held until it is gone.
  void ProcessExit();
  int Bind(uint32_t id, const IpAddr& addr);
  int ResolveAddr(uint32_t id, const IpAddr* src, const IpAddr& dst, uint32_t timeout_ms);
  int ResolveRoute(uint32_t id, uint32_t timeout_ms);
  int QueryRoute(uint32_t id, RouteInfo* out) const;
  int Listen(uint32_t id, int backlog);
  int Connect(uint32_t id, const ConnParam& p);
  // p == nullptr: the active side's accept after CONNECT_RESPONSE (sends RTU).
  int Accept(uint32_t id, const ConnParam* p);
  int Reject(uint32_t id, uint8_t reason, const uint8_t* data, uint8_t len);
  int Disconnect(uint32_t id);
  int InitQpAttr(uint32_t id, uint32_t state, QpAttr* out) const;
  int Notify(uint32_t id, uint32_t event);
  int SetOption(uint32_t id, uint32_t level, uint32_t name, const void* value, size_t len);
  int JoinMulticast(uint32_t id, const IpAddr& group, uint32_t* mc);
  int LeaveMulticast(uint32_t mc, uint32_t* id);
  bool Exists(uint32_t id) const { return ids_.contains(id); }

  void OnMad(int dev, const MadSource& src, std::span<const uint8_t> mad);
  // Runs what is due; returns the next deadline (ns), or 0 for none.
  uint64_t OnTimer();

  const CmStats& stats() const { return stats_; }

 private:
  // The id layer's id: the IB CM's part (Conn) and rdma_cm's.
  struct Id;
  struct Port {
    LocalPort info;
    PortIo* io = nullptr;
  };
  struct Mcast {
    uint32_t id = 0;
    Gid mgid{};
  };

  Id* Find(uint32_t id) const;
  Port* PortOf(int dev);
  const Port* PortOf(int dev) const;
  const Port* PortForSource(const IpAddr& a) const;
  const Port* PortForDestination(const IpAddr& a) const;
  Gid PortGid(const Port& p, bool v6) const;
  int BindPort(Id* id, const IpAddr& addr);
  void Unbind(Id* id);
  uint32_t NewHandle();
  void Emit(const Id& id, uint32_t event, int32_t status, const ConnParam* p = nullptr);
  AhInfo AhTo(const Id& id, const Gid& dgid) const;
  Id* FindListener(uint16_t ps, const IpAddr& dst, int dev) const;
  Id* NewConnId(const Id& listener, uint8_t qp_type, int dev, const MadSource& src, const IpAddr& dst,
                const IpHeader& ih);

  // What the IB CM asks of the id layer (IbCm::IdLayer).
  PortIo* Io(int dev) override;
  void ForEachConn(absl::FunctionRef<bool(Conn&)> fn) override;
  void ReqReceived(int dev, const MadSource& src, const MadHeader& h, const Req& r, uint64_t held_until) override;
  void SidrReqReceived(int dev, const MadSource& src, const MadHeader& h, const SidrReq& m,
                       uint64_t held_until) override;
  void SidrRepReceived(const Conn& c, const SidrRep& m) override;
  void RequestSettled(const Conn& c) override;
  void Deliver(const Conn& c, uint32_t event, int32_t status, const ConnParam* p) override;

  EventFn events_;
  Clock clock_;
  std::mt19937_64 rng_;
  std::vector<Port> ports_;
  absl::flat_hash_map<uint32_t, std::unique_ptr<Id>> ids_;
  std::map<std::pair<uint16_t, uint16_t>, std::vector<uint32_t>> bound_;  // (ps, port) -> ids
  absl::flat_hash_map<uint32_t, Mcast> mcasts_;
  uint32_t next_handle_ = 1;
  CmStats stats_;
  IbCm cm_{this, &clock_, &rng_, &stats_};  // the protocol below
};

}  // namespace droce::cm
