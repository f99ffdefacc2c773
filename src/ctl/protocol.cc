#include "ctl/protocol.h"

#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "queue/abi.h"
#include "queue/doorbell.h"

namespace droce::ctl {
namespace {

constexpr uint64_t kPage = 4096;

constexpr OpShape kShapes[kOpEnd] = {
    {},  // kOpNone
#define DROCE_CTL_OP_SHAPE(name, scope, req, req_fds, rep, rep_fds) \
  {kPayloadLen<req>, req_fds, kPayloadLen<rep>, rep_fds, #name},
    DROCE_CTL_OPS(DROCE_CTL_OP_SHAPE)
#undef DROCE_CTL_OP_SHAPE
};

absl::Status Bad(const char* what) { return absl::InvalidArgumentError(what); }

// Each request payload's own checks, found by its type: every op whose
// request is a T gets Check(T). A type without one needs none beyond its
// length (the generic one).
template <typename T>
absl::Status Check(const T&, int) {
  return absl::OkStatus();
}

absl::Status Check(const RegMr& r, int nfds) {
  if (r.tier == kTierImplicit) {
    if (r.addr != 0 || r.len != UINT64_MAX || r.iova != 0 || r.npieces != 0 || nfds != 0) {
      return Bad("an implicit registration is the whole address space, with no pieces");
    }
    return absl::OkStatus();
  }
  if (r.len > engine::Limits::kMaxMrSize || r.addr + r.len < r.addr) return Bad("registration out of range");
  if (r.tier == kTierCopy) {
    if (r.npieces != 0 || nfds != 0) return Bad("a copied registration has no pieces");
    return absl::OkStatus();
  }
  if (r.tier != kTierShared && r.tier != kTierMoved) return Bad("unknown memory tier");
  if (r.npieces == 0 || r.npieces > kMaxPieces || nfds < 1 || nfds > static_cast<int>(r.npieces)) {
    return Bad("piece count");
  }
  uint64_t at = r.addr & ~(kPage - 1);
  for (uint32_t i = 0; i < r.npieces; ++i) {
    const Piece& p = r.pieces[i];
    if (p.start != at || p.len == 0 || p.len % kPage != 0 || p.offset % kPage != 0 || p.fd >= static_cast<uint32_t>(nfds) ||
        p.start + p.len < p.start || p.offset + p.len < p.offset) {
      return Bad("pieces are not contiguous whole pages");
    }
    at += p.len;
  }
  if (at < r.addr + r.len) return Bad("pieces do not cover the registration");
  return absl::OkStatus();
}

absl::Status Check(const CreateQp& c, int) {
  if (c.type != 2 && c.type != 3 && c.type != 4 && c.type != 9 && c.type != 10) return Bad("QP type");
  if (c.sq_sig_all > 1) return Bad("sq_sig_all");
  return absl::OkStatus();
}

absl::Status Check(const ModifyQp& m, int) {
  transport::QpAttr a;
  return FromWire(Masked(m.attr, m.mask), &a);
}

absl::Status Check(const CreateAh& c, int) {
  transport::AddressVector av;
  return FromWire(c.av, &av);
}

absl::Status Check(const AdminReq& a, int) {
  return a.len > kAdminMaxReq ? Bad("admin request length") : absl::OkStatus();
}

absl::Status Check(const CmCommand& c, int) {
  return c.in_len > kCmMaxIn || c.opt_len > kCmMaxOpt ? Bad("CM command length") : absl::OkStatus();
}

absl::Status Check(const AllocMw& a, int) {
  return a.type != 1 && a.type != 2 ? Bad("MW type") : absl::OkStatus();
}

absl::Status Check(const ReregMr& r, int) {
  if (r.flags == 0 || (r.flags & ~uint32_t{engine::Session::kReregPd | engine::Session::kReregAccess})) {
    return Bad("rereg flags");
  }
  if (r.access & ~uint32_t{0x1F}) return Bad("access");
  return absl::OkStatus();
}

template <typename T>
absl::Status CheckPayload(const uint8_t* p, int nfds) {
  if constexpr (std::is_same_v<T, None>) {
    return absl::OkStatus();
  } else {
    T v;
    std::memcpy(&v, p, sizeof(v));
    return Check(v, nfds);
  }
}

}  // namespace

uint32_t AbiHash() {
  // Sizes of everything both sides lay out in shared memory or messages,
  // and offsets where a layout changed but its size did not (the send WQE's
  // union per operation family: a client from before it has the same
  // 64-byte WQE with other fields at those places).
  uint32_t h = 2166136261u;
  for (size_t v : {sizeof(Header), sizeof(HelloRep), sizeof(RegMr), sizeof(CreateQp), sizeof(QpRep), sizeof(CreateSrq),
                   sizeof(WireQpAttr), sizeof(EventRecord), sizeof(Counters), sizeof(QpCounters),
                   sizeof(queue::SendWqe), sizeof(queue::RecvWqe), sizeof(queue::Cqe), sizeof(queue::RingHeader),
                   sizeof(engine::QpShared), sizeof(cq::CqControl), sizeof(engine::WakeWords),
                   sizeof(queue::DoorbellQueue::Cell), offsetof(queue::SendWqe, post_stamp),
                   offsetof(queue::SendWqe, wr)}) {
    h = (h ^ static_cast<uint32_t>(v)) * 16777619u;
  }
  return h;
}

const OpShape* ShapeOf(uint16_t op) { return op > 0 && op < kOpEnd ? &kShapes[op] : nullptr; }

absl::Status ValidateRequest(const uint8_t* msg, size_t len, int nfds) {
  Header h;
  if (len < sizeof(h)) return Bad("truncated header");
  std::memcpy(&h, msg, sizeof(h));
  if (h.magic != kMagic) return Bad("bad magic");
  if (h.len != len) return Bad("length field differs from the message");
  const OpShape* s = ShapeOf(h.op);
  if (s == nullptr) return Bad("unknown op");
  if (len != sizeof(h) + s->req_len) return Bad("payload length");
  if (s->req_fds >= 0 && nfds != s->req_fds) return Bad("fd count");
  if (h.op != kHello && h.dev >= kMaxDevices) return Bad("device index");
  const uint8_t* p = msg + sizeof(h);
  switch (h.op) {
#define DROCE_CTL_OP_CHECK(name, scope, req, ...) \
  case k##name:                                   \
    return CheckPayload<req>(p, nfds);
    DROCE_CTL_OPS(DROCE_CTL_OP_CHECK)
#undef DROCE_CTL_OP_CHECK
    default:
      return Bad("unknown op");
  }
}

WireAv ToWire(const transport::AddressVector& av) {
  WireAv w{};
  std::memcpy(w.dgid, av.dgid, 16);
  w.flow_label = av.flow_label;
  w.sgid_index = av.sgid_index;
  w.hop_limit = av.hop_limit;
  w.traffic_class = av.traffic_class;
  w.sl = av.sl;
  w.is_global = av.is_global ? 1 : 0;
  w.port_num = av.port_num;
  w.dlid = av.dlid;
  return w;
}

absl::Status FromWire(const WireAv& w, transport::AddressVector* av) {
  if (w.is_global > 1) return Bad("is_global");
  std::memcpy(av->dgid, w.dgid, 16);
  av->flow_label = w.flow_label;
  av->sgid_index = w.sgid_index;
  av->hop_limit = w.hop_limit;
  av->traffic_class = w.traffic_class;
  av->sl = w.sl;
  av->is_global = w.is_global != 0;
  av->port_num = w.port_num;
  av->dlid = w.dlid;
  return absl::OkStatus();
}

WireQpAttr ToWire(const transport::QpAttr& a) {
  WireQpAttr w{};
  w.state = static_cast<uint32_t>(a.state);
  w.cur_state = static_cast<uint32_t>(a.cur_state);
  w.access_flags = a.access_flags;
  w.pkey_index = a.pkey_index;
  w.port_num = a.port_num;
  w.path_mtu = a.path_mtu;
  w.qkey = a.qkey;
  w.av = ToWire(a.av);
  w.timeout = a.timeout;
  w.retry_cnt = a.retry_cnt;
  w.rnr_retry = a.rnr_retry;
  w.max_rd_atomic = a.max_rd_atomic;
  w.min_rnr_timer = a.min_rnr_timer;
  w.max_dest_rd_atomic = a.max_dest_rd_atomic;
  w.en_sqd_async_notify = a.en_sqd_async_notify ? 1 : 0;
  w.rq_psn = a.rq_psn;
  w.sq_psn = a.sq_psn;
  w.dest_qpn = a.dest_qpn;
  w.rate_limit = a.rate_limit;
  w.max_burst_sz = a.max_burst_sz;
  w.typical_pkt_sz = a.typical_pkt_sz;
  return w;
}

WireQpAttr Masked(const WireQpAttr& w, uint32_t mask) {
  using namespace transport;
  WireQpAttr a = ToWire(QpAttr{});
  if (mask & kAttrState) a.state = w.state;
  if (mask & kAttrCurState) a.cur_state = w.cur_state;
  if (mask & kAttrEnSqdAsyncNotify) a.en_sqd_async_notify = w.en_sqd_async_notify;
  if (mask & kAttrAccessFlags) a.access_flags = w.access_flags;
  if (mask & kAttrPkeyIndex) a.pkey_index = w.pkey_index;
  if (mask & kAttrPort) a.port_num = w.port_num;
  if (mask & kAttrQkey) a.qkey = w.qkey;
  if (mask & kAttrAv) a.av = w.av;
  if (mask & kAttrPathMtu) a.path_mtu = w.path_mtu;
  if (mask & kAttrTimeout) a.timeout = w.timeout;
  if (mask & kAttrRetryCnt) a.retry_cnt = w.retry_cnt;
  if (mask & kAttrRnrRetry) a.rnr_retry = w.rnr_retry;
  if (mask & kAttrRqPsn) a.rq_psn = w.rq_psn;
  if (mask & kAttrMaxQpRdAtomic) a.max_rd_atomic = w.max_rd_atomic;
  if (mask & kAttrMinRnrTimer) a.min_rnr_timer = w.min_rnr_timer;
  if (mask & kAttrSqPsn) a.sq_psn = w.sq_psn;
  if (mask & kAttrMaxDestRdAtomic) a.max_dest_rd_atomic = w.max_dest_rd_atomic;
  if (mask & kAttrDestQpn) a.dest_qpn = w.dest_qpn;
  if (mask & kAttrRateLimit) {
    a.rate_limit = w.rate_limit;
    a.max_burst_sz = w.max_burst_sz;
    a.typical_pkt_sz = w.typical_pkt_sz;
  }
  return a;
}

absl::Status FromWire(const WireQpAttr& w, transport::QpAttr* a) {
  constexpr uint32_t kMaxState = static_cast<uint32_t>(transport::QpState::kErr);
  if (w.state > kMaxState || w.cur_state > kMaxState) return Bad("QP state");
  if (w.en_sqd_async_notify > 1) return Bad("en_sqd_async_notify");
  a->state = static_cast<transport::QpState>(w.state);
  a->cur_state = static_cast<transport::QpState>(w.cur_state);
  a->access_flags = w.access_flags;
  a->pkey_index = w.pkey_index;
  a->port_num = w.port_num;
  a->path_mtu = w.path_mtu;
  a->qkey = w.qkey;
  if (absl::Status s = FromWire(w.av, &a->av); !s.ok()) return s;
  a->timeout = w.timeout;
  a->retry_cnt = w.retry_cnt;
  a->rnr_retry = w.rnr_retry;
  a->max_rd_atomic = w.max_rd_atomic;
  a->min_rnr_timer = w.min_rnr_timer;
  a->max_dest_rd_atomic = w.max_dest_rd_atomic;
  a->en_sqd_async_notify = w.en_sqd_async_notify != 0;
  a->rq_psn = w.rq_psn;
  a->sq_psn = w.sq_psn;
  a->dest_qpn = w.dest_qpn;
  if (w.rate_limit > transport::kMaxRateLimitKbps) return Bad("rate_limit");
  if (w.pad2 != 0 || w.pad3 != 0) return Bad("padding");
  a->rate_limit = w.rate_limit;
  a->max_burst_sz = w.max_burst_sz;
  a->typical_pkt_sz = w.typical_pkt_sz;
  return absl::OkStatus();
}

int ErrnoOf(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk: return 0;
    case absl::StatusCode::kInvalidArgument: return EINVAL;
    case absl::StatusCode::kNotFound: return EINVAL;
    case absl::StatusCode::kFailedPrecondition: return EBUSY;
    case absl::StatusCode::kResourceExhausted: return ENOMEM;
    case absl::StatusCode::kUnimplemented: return EOPNOTSUPP;
    default: return EIO;
  }
}

absl::Status StatusOf(int err, const char* what) {
  switch (err) {
    case 0: return absl::OkStatus();
    case ENOMEM: return absl::ResourceExhaustedError(what);
    case EBUSY: return absl::FailedPreconditionError(what);
    case EOPNOTSUPP: return absl::UnimplementedError(what);
    case EIO: return absl::UnavailableError(what);
    default: return absl::InvalidArgumentError(absl::StrCat(what, ": ", std::strerror(err)));
  }
}

ssize_t SendMsg(int sock, const void* buf, size_t len, const int* fds, int nfds) {
  if (nfds < 0 || nfds > kMaxFds) {
    errno = EINVAL;
    return -1;
  }
  iovec iov{const_cast<void*>(buf), len};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * kMaxFds)];
  if (nfds > 0) {
    m.msg_control = ctl;
    m.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
    cmsghdr* c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
    std::memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
  }
  ssize_t n;
  do n = sendmsg(sock, &m, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n;
}

ssize_t RecvMsg(int sock, void* buf, size_t cap, int* fds, int* nfds) {
  *nfds = 0;
  iovec iov{buf, cap};
  msghdr m{};
  m.msg_iov = &iov;
  m.msg_iovlen = 1;
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int) * kMaxFds)];
  m.msg_control = ctl;
  m.msg_controllen = sizeof(ctl);
  ssize_t n;
  do n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n < 0) return n;
  for (cmsghdr* c = CMSG_FIRSTHDR(&m); c != nullptr; c = CMSG_NXTHDR(&m, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const int k = static_cast<int>((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
    int got[kMaxFds];
    std::memcpy(got, CMSG_DATA(c), sizeof(int) * std::min(k, kMaxFds));
    for (int i = 0; i < k && i < kMaxFds; ++i) {
      if (*nfds < kMaxFds) fds[(*nfds)++] = got[i];
      else close(got[i]);
    }
  }
  if ((m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
    for (int i = 0; i < *nfds; ++i) close(fds[i]);
    *nfds = 0;
    errno = EMSGSIZE;
    return -1;
  }
  return n;
}

std::string EmbeddedCtlName(pid_t pid) { return absl::StrCat(std::string(1, '\0'), "droce-ctl.", pid); }

}  // namespace droce::ctl
