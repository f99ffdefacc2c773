// The IB Communication Manager protocol on QP1 (IBTA Vol. 1 ch. 12), the
// lower of the connection manager's two layers, as Linux keeps it in
// drivers/infiniband/core/cm.c below cma.c: REQ/MRA/REJ/REP/RTU/DREQ/DREP
// and SIDR_REQ/SIDR_REP, comm IDs, retransmission and timeouts, timewait,
// the stale-connection and duplicate checks, and requests held until their
// listener comes. The id layer above it (Manager, manager.h) calls it to
// send and track messages; it calls the id layer back through IbCm::IdLayer
// to find listeners, make ids and deliver events. Single-threaded, as the
// Manager that owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <variant>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "cm/mad.h"

namespace droce::cm {

// Defined in manager.h (the cm library's public types).
class PortIo;
struct AhInfo;
struct LocalPort;
struct MadSource;
struct ConnParam;
struct CmStats;
struct QpAttr;

// The values Linux's rdma_cm puts in its CM messages for RoCE
// (drivers/infiniband/core/cma.c), so that a droce peer and a kernel peer
// time out and retry alike. Both layers use them.
namespace cma {
inline constexpr uint8_t kCmResponseTimeout = 20;  // CMA_CM_RESPONSE_TIMEOUT: 4.096 us << 20 = 4.3 s
inline constexpr uint8_t kMaxCmRetries = 15;       // CMA_MAX_CM_RETRIES
inline constexpr uint8_t kPacketLifeTime = 16;     // CMA_IBOE_PACKET_LIFETIME
inline constexpr uint8_t kMraServiceTimeout = 20;  // CMA_CM_MRA_SETTING
inline constexpr uint8_t kHopLimit = 64;
}  // namespace cma

// An id's state. droce keeps one state per id where the kernel keeps
// rdma_cm's and the IB CM's apart: the id layer moves an id through the
// states up to kListen, the IB CM through the connection's (kReqSent on);
// the id layer reads them all (which commands an id takes, its QP
// attributes).
enum class St : uint8_t {
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

// What the IB CM keeps of one id (the kernel's cm_id_private); the id
// layer's id extends it. The id layer sets the fields up to ack_timeout_opt
// (what the id is, where its MADs go and how), the IB CM those of the
// connection after deadline; each reads the other's.
struct Conn {
  St state = St::kIdle;
  uint8_t qp_type = 2;   // kQpRc or kQpUd (manager.h): REQ or SIDR_REQ
  uint32_t parent = 0;   // a conn id's listener (0: an active id)
  int dev = -1;
  Gid sgid{}, dgid{};
  uint8_t tos = 0;       // the traffic class of its MADs and its QP
  uint8_t ack_timeout_opt = 0;  // RDMA_OPTION_ID_ACK_TIMEOUT; 0: rdma_cm's rule
  // The id's one timer: the id layer's while it resolves an address
  // (kAddrQuery), else the IB CM's retransmission or timewait. 0: none.
  uint64_t deadline = 0;
  // The connection.
  uint32_t local_comm_id = 0, remote_comm_id = 0;
  uint64_t remote_guid = 0, tid = 0;
  uint32_t local_qpn = 0, remote_qpn = 0;
  // The Starting PSNs of the REQ/REP: ours is what our QP receives at, the
  // peer's is what our QP sends with.
  uint32_t local_psn = 0, remote_psn = 0;
  uint8_t responder_resources = 0, initiator_depth = 0, retry_count = 7, rnr_retry = 7, path_mtu = 3;
  uint8_t srq = 0, flow_control = 0, remote_ack_delay = 15;
  uint8_t remote_cm_timeout = cma::kCmResponseTimeout, max_cm_retries = cma::kMaxCmRetries;
  // The message to retransmit on timeout or resend on a duplicate.
  bool has_last = false;
  Message last;
  unsigned retries_left = 0;
};

class IbCm {
 public:
  using Clock = std::function<uint64_t()>;  // ns

  // The id layer as the IB CM sees it (cm.c's view of cma.c through each
  // cm_id's handler). Every Conn the IB CM is given or finds is one of the
  // id layer's ids.
  class IdLayer {
   public:
    virtual ~IdLayer() = default;
    // Where device dev's MADs go; nullptr when it has no port (or no io).
    virtual PortIo* Io(int dev) = 0;
    // Calls fn for each id until it returns true (the duplicate and stale
    // checks, which cm.c makes with its tables of remote ids and QPs).
    virtual void ForEachConn(absl::FunctionRef<bool(Conn&)> fn) = 0;
    // A REQ (SIDR_REQ) that is no duplicate, of no connection in timewait
    // and from no QP connected here: the id layer finds its listener and
    // makes its id (TakeReq, TakeSidrReq), or has it held (HoldEarly) or
    // refused (RejectReq, RefuseSidrReq). held_until: as in HoldEarly.
    virtual void ReqReceived(int dev, const MadSource& src, const MadHeader& h, const Req& r,
                             uint64_t held_until) = 0;
    virtual void SidrReqReceived(int dev, const MadSource& src, const MadHeader& h, const SidrReq& m,
                                 uint64_t held_until) = 0;
    // The SIDR_REP that answers c's SIDR_REQ; c is kUdReady or, for a
    // refusal, kDisconnected already. The id layer reports it.
    virtual void SidrRepReceived(const Conn& c, const SidrRep& m) = 0;
    // c, whose CONNECT_REQUEST its listener counts as unanswered, was
    // rejected by the peer.
    virtual void RequestSettled(const Conn& c) = 0;
    // An event for the application about c.
    virtual void Deliver(const Conn& c, uint32_t event, int32_t status, const ConnParam* p) = 0;
  };

  // ids, clock, rng and stats outlive the IbCm; rng is the id layer's too
  // (one sequence of comm IDs, PSNs, TIDs and ports for a seed).
  IbCm(IdLayer* ids, const Clock* clock, std::mt19937_64* rng, CmStats* stats);
  IbCm(const IbCm&) = delete;
  IbCm& operator=(const IbCm&) = delete;
  ~IbCm();

  // The port of device dev went away: requests held for it are dropped.
  void RemovePort(int dev);

  // The active side. Connect: a REQ (SendReq) or SIDR_REQ (SendSidrReq) to
  // service_id whose private data is the IP CM header then the caller's.
  void SendReq(Conn* c, const LocalPort& port, uint64_t service_id, const IpHeader& ih, const ConnParam& p);
  void SendSidrReq(Conn* c, uint64_t service_id, const IpHeader& ih, const ConnParam& p);
  // The accept after CONNECT_RESPONSE (c is kRepRcvd): RTU.
  void SendRtu(Conn* c);

  // The passive side. A request the id layer made c for (the listener's
  // new id): its comm ID, the peer's parameters, kReqRcvd (kSidrReqRcvd).
  void TakeReq(Conn* c, const LocalPort& port, const MadHeader& h, const Req& r);
  void TakeSidrReq(Conn* c, const MadHeader& h, const SidrReq& m);
  // The application's accept (c is kReqRcvd; kSidrReqRcvd).
  void SendRep(Conn* c, const LocalPort& port, const ConnParam& p);
  void SendSidrRep(Conn* c, uint64_t service_id, const ConnParam& p);
  // The application's reject (c is kReqRcvd or kRepSent; kSidrReqRcvd):
  // c ends kDisconnected.
  void Reject(Conn* c, uint8_t reason, const uint8_t* data, uint8_t len);
  void RejectSidr(Conn* c, uint64_t service_id, const uint8_t* data, uint8_t len);
  // A request refused before it has an id: REJ (reason) to the REQ's
  // sender; SIDR_REP with status to the SIDR_REQ's.
  void RejectReq(int dev, const MadSource& src, const MadHeader& h, uint32_t remote_comm_id, uint16_t reason);
  void RefuseSidrReq(int dev, const MadSource& src, const MadHeader& h, const SidrReq& m, uint8_t status);
  // Holds a request that found no listener (true), or leaves it to be
  // refused now (false: too many held already). held_until: a held request
  // handed over again (when a listener came), with the time it is held
  // until; 0 for one just received.
  bool HoldEarly(int dev, const MadSource& src, const MadHeader& h, const std::variant<Req, SidrReq>& msg,
                 uint64_t held_until);
  // A listener came: every held request is handled again.
  void ReplayEarly();

  // Either side, connected: DREQ (when c is kEstablished).
  void SendDreq(Conn* c);
  // Traffic arrived before the RTU (ib_cm_notify's COMM_EST): a kRepSent c
  // is established.
  void CommEstablished(Conn* c);
  // The peer learns that c is gone (REJ or DREQ as its state calls for),
  // as the kernel's cm_destroy_id.
  void TellPeerGone(Conn* c);
  // The process exits: the peer is told, nothing more is sent for c.
  void Abandon(Conn* c);
  // c is destroyed: its comm ID is free.
  void Release(const Conn& c);
  // c's retransmission (or address poll) is off.
  static void DropTimer(Conn* c);
  // An RC QP's attributes for state (IBV_QPS_INIT, _RTR, _RTS) from c's
  // connection, as the kernel's ib_cm_init_qp_attr; ah is the path to the
  // peer. The caller cleared *a and set its state, port and P_Key index.
  static int InitQpAttr(const Conn& c, uint32_t state, const AhInfo& ah, QpAttr* a);

  void OnMad(int dev, const MadSource& src, std::span<const uint8_t> mad);
  // Refuses the held requests that are due; returns the next such time, or 0.
  uint64_t ExpireEarly(uint64_t now);
  // c's deadline (an IB CM state's) passed: retransmit, time out or leave
  // timewait.
  void OnDeadline(Conn* c, uint64_t now);

 private:
  struct Timewait {
    uint64_t remote_guid = 0;
    uint32_t remote_comm_id = 0, remote_qpn = 0;
    Gid remote_gid{};
    uint64_t until = 0;
  };
  // A REQ or SIDR_REQ that found no listener, held for a while (see
  // kEarlyReqHoldNs in ib_cm.cc) in case its listener is about to come.
  struct EarlyReq;

  Conn* FindByComm(uint32_t local_comm_id) const;
  uint32_t NewCommId();
  uint32_t RandomPsn() { return static_cast<uint32_t>((*rng_)()) & 0xFFFFFF; }
  // c's TID and comm ID, for a request it sends.
  void Begin(Conn* c);
  void Send(const Conn& c, const Message& m, uint64_t tid);
  void SendTo(int dev, const Gid& sgid, const Gid& dgid, uint32_t dqpn, uint8_t tclass, const Message& m,
              uint64_t tid);
  void SendRemembered(Conn* c, const Message& m, uint64_t timeout_ns, unsigned retries);
  void EnterTimewait(Conn* c);

  // held_until: as in HoldEarly.
  void HandleReq(int dev, const MadSource& src, const MadHeader& h, const Req& r, uint64_t held_until = 0);
  void HandleMra(const Mra& m);
  void HandleRej(const Rej& m);
  void HandleRep(int dev, const MadSource& src, const MadHeader& h, const Rep& m);
  void HandleRtu(const Rtu& m);
  void HandleDreq(int dev, const MadSource& src, const MadHeader& h, const Dreq& m);
  void HandleDrep(const Drep& m);
  void HandleSidrReq(int dev, const MadSource& src, const MadHeader& h, const SidrReq& m,
                     uint64_t held_until = 0);
  void HandleSidrRep(const SidrRep& m);
  // The answer for no listener: REJ reason 8, or SIDR_REP "unsupported".
  void RefuseNoListener(const EarlyReq& e);

  IdLayer* ids_;
  const Clock& clock_;
  std::mt19937_64* rng_;
  CmStats& stats_;
  absl::flat_hash_map<uint32_t, Conn*> by_comm_;  // local comm id -> its id
  std::vector<Timewait> timewait_;
  std::vector<EarlyReq> early_;
};

}  // namespace droce::cm
