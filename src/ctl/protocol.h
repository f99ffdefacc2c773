// The control protocol between libdroce.so in client mode and droced: one
// Unix SOCK_SEQPACKET connection per client process, one request at a time,
// each answered by one reply. Every message is a Header followed by the
// fixed payload of its op; file descriptors (memfds, eventfds) travel with
// SCM_RIGHTS. Payloads hold integers only (no bool, no enum, no pointer), so
// that decoding is a length check, a copy and a range check of each field
// (Validate), never an interpretation of a client's bytes as a C++ object.
//
// Sequence: the client's first message is kHello (version, ABI check, its
// event eventfd); the daemon answers with the devices and the event ring.
// kAttach(dev) then gives a device's doorbell queues and wake page. Every
// request carries seq = previous + 1: a replayed or reordered message is
// refused with a disconnect, as is anything before kHello or a second one.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/session.h"

namespace droce::ctl {

inline constexpr uint32_t kMagic = 0x434f5244;  // "DROC"
// droced's control socket unless told otherwise (droced --socket,
// DROCE_DAEMON).
inline constexpr const char* kDefaultSocket = "/run/droce/droced.sock";
inline constexpr uint16_t kVersion = 1;
inline constexpr uint16_t kReplyBit = 0x8000;
inline constexpr int kMaxFds = 8;
inline constexpr uint32_t kMaxDevices = 16;
// Pieces of one registration (tier A/B mappings that make up its pages).
inline constexpr uint32_t kMaxPieces = 6;
inline constexpr size_t kMaxMessage = 2048;

// Every control operation, declared once, in wire order (an op's number is
// its place here: add new ones at the end): its name (the Op is k<Name>),
// whether it needs an attached device (Dev) or belongs to the connection
// (Conn), its request payload and fd count, and its reply payload and fd
// count. None: no payload; kVaryFds: the request says (kRegMr's pieces).
// From this list come the Op enum, the shape table the daemon and the
// client check every message against (ShapeOf), request validation
// (ValidateRequest: the payload type's Check overload), the daemon's
// dispatch (src/daemon/handler.cc: one handler per op, a missing one does not
// compile) and the client's typed calls (providers/daemon_session.cc).
#define DROCE_CTL_OPS(X)                                  \
  X(Hello, Conn, Hello, 1, HelloRep, 1)                   \
  X(Attach, Conn, None, 0, AttachRep, 2)                  \
  X(AllocPd, Dev, None, 0, IdRep, 0)                      \
  X(DeallocPd, Dev, Id, 0, None, 0)                       \
  X(RegMr, Dev, RegMr, kVaryFds, IdRep, 0)                \
  X(DeregMr, Dev, Id, 0, None, 0)                         \
  X(AllocMw, Dev, AllocMw, 0, IdRep, 0)                   \
  X(DeallocMw, Dev, Id, 0, None, 0)                       \
  X(CreateCq, Dev, CreateCq, 0, CqRep, 1)                 \
  X(DestroyCq, Dev, Id, 0, None, 0)                       \
  X(ResizeCq, Dev, ResizeCq, 0, CqRep, 1)                 \
  X(ModifyCq, Dev, ModifyCq, 0, None, 0)                  \
  X(CreateQp, Dev, CreateQp, 0, QpRep, 1)                 \
  X(ModifyQp, Dev, ModifyQp, 0, None, 0)                  \
  X(QueryQp, Dev, Id, 0, WireQpAttr, 0)                   \
  X(DestroyQp, Dev, Id, 0, None, 0)                       \
  X(CreateSrq, Dev, CreateSrq, 0, SrqRep, 1)              \
  X(ModifySrq, Dev, ModifySrq, 0, None, 0)                \
  X(QuerySrq, Dev, Id, 0, IdRep, 0)                       \
  X(DestroySrq, Dev, Id, 0, None, 0)                      \
  X(CreateAh, Dev, CreateAh, 0, IdRep, 0)                 \
  X(DestroyAh, Dev, Id, 0, None, 0)                       \
  X(AttachMcast, Dev, Mcast, 0, None, 0)                  \
  X(DetachMcast, Dev, Mcast, 0, None, 0)                  \
  X(ReadCounters, Dev, None, 0, Counters, 0)              \
  X(ReadQpCounters, Dev, Id, 0, QpCounters, 0)            \
  X(CmOpen, Conn, CmChannel, 1, None, 0)                  \
  X(CmClose, Conn, CmChannel, 0, None, 0)                 \
  X(CmCommand, Conn, CmCommand, 0, CmResult, 0)           \
  X(Admin, Conn, AdminReq, 0, AdminRep, 1)                \
  X(ReregMr, Dev, ReregMr, 0, None, 0)

// The connection manager's ops (droced hosts it) are librdmacm's rdma_ucm
// commands from one of the client's event channels, named by the client's
// fd of it (cm/ucma.h). kAdmin: administration (`droce ctl`, src/admin/): a
// connection whose first message is kAdmin instead of kHello asks questions
// only; it creates no objects and gets no events.
enum Op : uint16_t {
  kOpNone = 0,
#define DROCE_CTL_OP_ENUM(name, ...) k##name,
  DROCE_CTL_OPS(DROCE_CTL_OP_ENUM)
#undef DROCE_CTL_OP_ENUM
  kOpEnd,
};

struct Header {
  uint32_t magic;
  uint16_t op;   // Op; | kReplyBit in a reply
  uint16_t dev;  // device index (droce<dev>)
  uint32_t seq;
  uint32_t len;  // bytes of the whole message
};

struct Reply {
  Header h;
  int32_t err;  // 0 or a positive errno
  uint32_t pad;
};

// A build must talk to a daemon built with the same layouts.
uint32_t AbiHash();

// ---- payloads (request unless named *Rep) ----
struct Hello {
  uint16_t version;
  uint16_t pad;
  uint32_t abi;
  // fd 0: the client's event eventfd (the daemon writes it after queueing
  // event records).
};
struct DevInfo {
  char name[16];
  uint8_t mac[6];
  uint8_t prefix_len;
  uint8_t active_mtu;
  uint32_t ip;
  uint32_t link_mtu;
  uint8_t gids[2][16];
  uint32_t gid_count;
  uint32_t workers;
  uint32_t port_active;
  uint32_t dead;
};
struct HelloRep {
  uint16_t version;
  uint16_t ndev;
  uint32_t abi;
  uint64_t event_ring_size;  // fd 0: the event ring's memfd
  DevInfo devs[kMaxDevices];
};
struct AttachRep {
  uint32_t workers;
  uint32_t doorbell_cells;  // per worker queue
  uint64_t doorbell_size;   // fd 0: the queues, DoorbellQueue::Bytes(cells) each, in worker order
  uint64_t wake_size;       // fd 1: the workers' WakeWords
};
struct Id {  // DeallocPd, DeregMr, DeallocMw, DestroyCq, QueryQp, DestroyQp, QuerySrq, DestroySrq, DestroyAh, ReadQpCounters
  uint32_t id;
  uint32_t pad;
};
struct IdRep {  // AllocPd, RegMr (key), AllocMw (rkey), CreateAh, QuerySrq (limit)
  uint32_t id;
  uint32_t pad;
};

// Memory tiers of a registration.
enum Tier : uint32_t {
  kTierShared = 1,  // A: pages of an already shared mapping (memfd, MAP_SHARED file, SysV shm)
  kTierMoved = 2,   // B: private anonymous pages moved onto a memfd by the client
  kTierCopy = 3,    // C: no fd: the daemon copies with process_vm_readv/writev
  kTierImplicit = 4,  // an implicit on-demand MR: the whole address space, copied as C
};
struct Piece {
  uint64_t start;   // client address, page aligned
  uint64_t len;     // page multiple
  uint64_t offset;  // in the piece's fd (page aligned)
  uint32_t fd;      // index among the message's fds
  uint32_t pad;
};
struct RegMr {
  uint32_t pd;
  uint32_t access;
  uint64_t addr, len, iova;
  uint32_t tier;
  uint32_t npieces;  // tiers A and B: pieces covering [addr & ~page, addr+len) in order, contiguous
  Piece pieces[kMaxPieces];
};
struct AllocMw {
  uint32_t pd;
  uint32_t type;
};
struct ReregMr {
  uint32_t key;
  uint32_t flags;  // engine::Session::kReregPd | kReregAccess
  uint32_t pd;
  uint32_t access;  // mem::Access bits
};
struct CreateCq {
  uint32_t min_cqe;
  uint32_t cookie;  // the client's name for it in event records
};
struct ResizeCq {
  uint32_t id;
  uint32_t min_cqe;
};
struct CqRep {  // CreateCq, ResizeCq; fd 0: the region
  uint32_t id;
  uint32_t entries;
  uint64_t size;
};
struct ModifyCq {
  uint32_t id;
  uint16_t count, period_us;
};
struct CreateQp {
  uint32_t type;  // transport::QpType
  uint32_t pd, send_cq, recv_cq, srq;
  uint32_t xrcd;  // an XRC target QP's XRC domain (a PD id of the client's)
  uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline;
  uint32_t sq_sig_all;
  uint32_t cookie;  // the client's name for it in event records
};
struct QpRep {  // fd 0: SQ ring, RQ ring, QpShared
  uint32_t qpn;
  uint32_t worker;
  uint32_t max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline;
  uint32_t pad;
  uint64_t size, rq_offset, shared_offset;
};
struct WireAv {
  uint8_t dgid[16];
  uint32_t flow_label;
  uint8_t sgid_index, hop_limit, traffic_class, sl;
  uint8_t is_global, port_num;
  uint16_t dlid;
};
struct WireQpAttr {
  uint32_t state, cur_state, access_flags;
  uint16_t pkey_index;
  uint8_t port_num, path_mtu;
  uint32_t qkey;
  WireAv av;
  uint8_t timeout, retry_cnt, rnr_retry, max_rd_atomic;
  uint8_t min_rnr_timer, max_dest_rd_atomic, en_sqd_async_notify, pad;
  uint32_t rq_psn, sq_psn, dest_qpn;
  uint32_t rate_limit, max_burst_sz;  // kbps, bytes (IBV_QP_RATE_LIMIT)
  uint16_t typical_pkt_sz, pad2;
  uint32_t pad3;
};
struct ModifyQp {
  uint32_t qpn;
  uint32_t mask;
  WireQpAttr attr;
};
struct CreateSrq {
  uint32_t pd, max_wr, max_sge, limit;
  uint32_t cookie;  // the client's name for it in event records
  uint32_t xrcd, cq;  // an XRC SRQ's domain and CQ (xrcd 0: a basic SRQ)
};
struct SrqRep {  // fd 0: the ring
  uint32_t id, max_wr, max_sge, pad;
  uint64_t size;
};
struct ModifySrq {
  uint32_t id, limit;
};
struct CreateAh {
  uint32_t pd;
  uint32_t pad;
  WireAv av;
};
struct Mcast {
  uint32_t qpn;
  uint32_t pad;
  uint8_t gid[16];
};

struct CmChannel {
  uint32_t fd;  // the client's fd of the channel
  uint32_t pad;
};
inline constexpr uint32_t kCmMaxIn = 320, kCmMaxOpt = 256, kCmMaxOut = 512;
struct CmCommand {
  uint32_t fd;
  uint32_t cmd;      // RDMA_USER_CM_CMD_*
  uint32_t in_len;   // bytes of `in` used (the command struct)
  uint32_t out_len;  // the command header's `out`
  uint32_t opt_len;  // SET_OPTION: the option's value, read by the client
  uint32_t pad;
  uint8_t in[kCmMaxIn];
  uint8_t opt[kCmMaxOpt];
};
struct CmResult {
  int32_t rc;         // 0 or -errno
  uint32_t len;       // response bytes
  uint64_t response;  // the client's pointer they go to
  uint8_t bytes[kCmMaxOut];
};

// A request in JSON (src/admin/query.h has the commands); the answer is a
// JSON document of any size in a sealed memfd.
inline constexpr uint32_t kAdminMaxReq = 1024;
struct AdminReq {
  uint32_t len;  // bytes of json used
  uint32_t pad;
  char json[kAdminMaxReq];
};
struct AdminRep {
  uint64_t len;  // bytes of the answer in fd 0
};
// The abstract socket name an embedded process with DROCE_CTL=1 answers
// admin requests on ("\0droce-ctl.<pid>", no file): connect with
// offsetof(sockaddr_un, sun_path) + the string's size.
std::string EmbeddedCtlName(pid_t pid);

// Events, daemon → client, in the event ring (an SPSC queue::Ring of
// EventRecord slots in a memfd the daemon made and sealed).
enum EventKind : uint32_t { kEvCqNotify = 1, kEvCqError, kEvQp, kEvSrq, kEvDevice };
// kEvDevice's flags: the DEVICE_FATAL comes from droced stopping (SIGTERM),
// not from a failed device; the connection ends next, and the client opens a
// new one for its next ibv_open_device.
inline constexpr uint16_t kEvDaemonStopping = 1;
struct EventRecord {
  uint32_t kind;
  uint16_t dev;
  uint16_t flags;  // kEvDevice: kEvDaemonStopping; others 0
  uint32_t id;    // the object's cookie (kEvDevice: 0)
  int32_t type;   // enum ibv_event_type (kEvQp, kEvSrq, kEvDevice)
};
inline constexpr uint32_t kEventRingSlots = 4096;

// What DROCE_CTL_OPS says of each op, as types: OpDef<kX>::Req and ::Rep
// (None for no payload), the fds each carries, whether the op needs an
// attached device, and its name.
struct None {};
inline constexpr int kVaryFds = -1;
enum class Scope { kConn, kDev };
template <typename T>
inline constexpr uint32_t kPayloadLen = sizeof(T);
template <>
inline constexpr uint32_t kPayloadLen<None> = 0;
template <uint16_t op>
struct OpDef;
#define DROCE_CTL_OP_DEF(name, scope, req, req_fds, rep, rep_fds) \
  template <>                                                     \
  struct OpDef<k##name> {                                         \
    using Req = req;                                              \
    using Rep = rep;                                              \
    static constexpr int kReqFds = req_fds;                       \
    static constexpr int kRepFds = rep_fds;                       \
    static constexpr Scope kScope = Scope::k##scope;              \
    static constexpr const char* kName = #name;                   \
  };
DROCE_CTL_OPS(DROCE_CTL_OP_DEF)
#undef DROCE_CTL_OP_DEF

// The payload size each op's request must have (0 for none), the fds it
// carries, and the same for its reply.
struct OpShape {
  uint32_t req_len;
  int req_fds;   // kVaryFds: varies (kRegMr: its pieces name them)
  uint32_t rep_len;
  int rep_fds;
  const char* name;
};
const OpShape* ShapeOf(uint16_t op);

// Checks a request as received: header, op, length, fd count and every
// field's range. The caller then copies the payload (Payload<T>).
absl::Status ValidateRequest(const uint8_t* msg, size_t len, int nfds);

// transport types ↔ wire, with range checks on the way in.
WireAv ToWire(const transport::AddressVector& av);
absl::Status FromWire(const WireAv& w, transport::AddressVector* av);
WireQpAttr ToWire(const transport::QpAttr& a);
// Only the attributes `mask` (transport::AttrMask) selects; the others at
// their defaults. ibv_modify_qp callers leave unselected fields
// uninitialised (librdmacm's ucma_modify_qp_err sets only the state), and
// they must neither travel nor fail the range checks.
WireQpAttr Masked(const WireQpAttr& w, uint32_t mask);
absl::Status FromWire(const WireQpAttr& w, transport::QpAttr* a);

// Errors across the boundary: the daemon sends an errno (the verbs
// boundary's), the client turns it back into the Status the provider's
// code expects; the two are inverse for every errno the engine produces.
int ErrnoOf(const absl::Status& s);
absl::Status StatusOf(int err, const char* what);

// Socket I/O. Send: one message with up to kMaxFds fds. Recv: one message
// into buf (cap bytes); fds received (CLOEXEC) go to fds/nfds; a message
// longer than cap, or carrying more than kMaxFds fds, is an error (its fds
// are closed). Returns the length, 0 at EOF, -1 with errno on error.
ssize_t SendMsg(int sock, const void* buf, size_t len, const int* fds, int nfds);
ssize_t RecvMsg(int sock, void* buf, size_t cap, int* fds, int* nfds);

}  // namespace droce::ctl
