// XRC (IBA 9.8.3): XRC domains (ibv_open_xrcd), XRC SRQs
// (ibv_create_srq_ex, ibv_get_srq_num) and sharing an XRC target QP between
// contexts (ibv_open_qp). The QPs themselves are created with the others
// (verbs_qp.cc); the engine executes XRC (src/transport).
#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "provider.h"

namespace droce::provider {
namespace {

// XRC target QPs by (session, domain, QPN), for ibv_open_qp.
struct TgtKey {
  const void* session;
  uint32_t xrcd, qpn;
  bool operator==(const TgtKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const TgtKey& k) {
    return H::combine(std::move(h), k.session, k.xrcd, k.qpn);
  }
};
std::mutex& tgt_mu() {
  static std::mutex mu;
  return mu;
}
absl::flat_hash_map<TgtKey, Qp*>& tgt_qps() {
  static absl::flat_hash_map<TgtKey, Qp*> m;
  return m;
}
TgtKey key_of(Qp* qp) {
  return TgtKey{engine_of(qp->qpx.qp_base.context), qp->xrcd, qp->qpx.qp_base.qp_num};
}

}  // namespace

void xrc_tgt_add(Qp* qp) {
  std::lock_guard<std::mutex> l(tgt_mu());
  tgt_qps()[key_of(qp)] = qp;
}

int xrc_tgt_remove(Qp* qp) {
  std::lock_guard<std::mutex> l(tgt_mu());
  // The kernel lets the creator's handle go and keeps the QP until its last
  // handle closes; droce refuses instead (docs/FEATURES.md, XRC).
  if (qp->opens.load() != 0) return EBUSY;
  tgt_qps().erase(key_of(qp));
  return 0;
}

// verbs_context::create_srq_ex (ibv_create_srq_ex is an inline wrapper): a
// basic SRQ, or an XRC SRQ (IBV_SRQT_XRC, with an XRC domain and a CQ of
// this context, and a PD). Tag matching is an mlx5 offload: EOPNOTSUPP.
ibv_srq* create_srq_ex(ibv_context* c, ibv_srq_init_attr_ex* attr) {
  if (!context_is_ours(c) || attr == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  constexpr uint32_t kKnown = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
                              IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_TM;
  const ibv_srq_type type = (attr->comp_mask & IBV_SRQ_INIT_ATTR_TYPE) ? attr->srq_type : IBV_SRQT_BASIC;
  if ((attr->comp_mask & ~kKnown) || (attr->comp_mask & IBV_SRQ_INIT_ATTR_TM) || type == IBV_SRQT_TM) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (type != IBV_SRQT_BASIC && type != IBV_SRQT_XRC) {
    errno = EINVAL;
    return nullptr;
  }
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_PD) || attr->pd == nullptr || attr->pd->context != c) {
    errno = EINVAL;
    return nullptr;
  }
  if (type == IBV_SRQT_BASIC) return create_srq_common(attr->pd, &attr->attr, attr->srq_context, 0, nullptr);
  if (!(attr->comp_mask & IBV_SRQ_INIT_ATTR_XRCD) || !(attr->comp_mask & IBV_SRQ_INIT_ATTR_CQ) ||
      attr->xrcd == nullptr || attr->xrcd->context != c || attr->cq == nullptr || attr->cq->context != c) {
    errno = EINVAL;
    return nullptr;
  }
  return create_srq_common(attr->pd, &attr->attr, attr->srq_context, reinterpret_cast<Xrcd*>(attr->xrcd)->id,
                           attr->cq);
}

// The number an XRC initiator names the SRQ by (ibv_wr_set_xrc_srqn, the
// send WR's qp_type.xrc.remote_srqn); every SRQ has one, as on mlx5.
int get_srq_num(ibv_srq* srq, uint32_t* srq_num) {
  if (srq == nullptr || srq_num == nullptr) return EINVAL;
  *srq_num = to_srq(srq)->handle.id;
  return 0;
}

namespace {
// XRC domains opened on a file, by session and inode: {engine id, opens}.
struct XrcdFileKey {
  const void* session;
  dev_t dev;
  ino_t ino;
  bool operator==(const XrcdFileKey&) const = default;
  template <typename H>
  friend H AbslHashValue(H h, const XrcdFileKey& k) {
    return H::combine(std::move(h), k.session, k.dev, k.ino);
  }
};
struct XrcdFile {
  uint32_t id = 0;
  uint32_t opens = 0;
};
std::mutex& xrcd_mu() {
  static std::mutex mu;
  return mu;
}
absl::flat_hash_map<XrcdFileKey, XrcdFile>& xrcd_files() {
  static absl::flat_hash_map<XrcdFileKey, XrcdFile> m;
  return m;
}
}  // namespace

// ibv_open_xrcd(3), with the kernel's rules (ib_uverbs_open_xrcd): fd -1
// makes a domain of its own (O_CREAT required); a file's domain is shared
// by every open of that file in this process's contexts of the device
// (O_CREAT makes it if none, O_EXCL refuses an existing one with EEXIST,
// neither on a file without one is EINVAL). As a droced client the domain
// is this process's: other processes opening the same file get their own.
ibv_xrcd* open_xrcd(ibv_context* c, ibv_xrcd_init_attr* attr) {
  if (!context_is_ours(c) || attr == nullptr) {
    errno = EINVAL;
    return nullptr;
  }
  if (attr->comp_mask & ~uint32_t{IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS}) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (!(attr->comp_mask & IBV_XRCD_INIT_ATTR_FD) || !(attr->comp_mask & IBV_XRCD_INIT_ATTR_OFLAGS) ||
      (attr->oflags & ~(O_CREAT | O_EXCL))) {
    errno = EINVAL;
    return nullptr;
  }
  engine::Session* e = engine_of(c);
  auto fail = [](int err) -> ibv_xrcd* {
    errno = err;
    return nullptr;
  };
  // A new engine domain; 0 (errno set) if the engine refused one.
  auto alloc = [e]() -> uint32_t {
    auto id = e->AllocXrcd();
    if (!id.ok()) errno = status_errno(id.status());
    return id.ok() ? *id : 0;
  };
  if (attr->fd == -1) {
    if (!(attr->oflags & O_CREAT)) return fail(EINVAL);
    const uint32_t id = alloc();
    if (id == 0) return nullptr;
    auto* x = new Xrcd();
    x->xrcd.context = c;
    x->id = id;
    return &x->xrcd;
  }
  struct stat st;
  if (fstat(attr->fd, &st) != 0) return fail(EBADF);
  std::lock_guard<std::mutex> l(xrcd_mu());
  const XrcdFileKey key{e, st.st_dev, st.st_ino};
  auto it = xrcd_files().find(key);
  if (it != xrcd_files().end()) {
    if (attr->oflags & O_EXCL) return fail(EEXIST);
  } else {
    if (!(attr->oflags & O_CREAT)) return fail(EINVAL);
    const uint32_t id = alloc();
    if (id == 0) return nullptr;
    it = xrcd_files().emplace(key, XrcdFile{id, 0}).first;
  }
  auto* x = new Xrcd();
  x->xrcd.context = c;
  ++it->second.opens;
  x->id = it->second.id;
  x->keyed = true;
  x->dev = st.st_dev;
  x->ino = st.st_ino;
  return &x->xrcd;
}

// ibv_close_xrcd(3): the last open of a domain frees it, EBUSY while XRC
// SRQs or target QPs use it.
int close_xrcd(ibv_xrcd* xrcd) {
  if (xrcd == nullptr) return EINVAL;
  Xrcd* x = reinterpret_cast<Xrcd*>(xrcd);
  engine::Session* e = engine_of(xrcd->context);
  std::unique_lock<std::mutex> l(xrcd_mu());
  if (x->keyed) {
    auto it = xrcd_files().find(XrcdFileKey{e, x->dev, x->ino});
    if (it != xrcd_files().end() && it->second.opens > 1) {
      --it->second.opens;
      delete x;
      return 0;
    }
    if (int rc = status_errno(e->DeallocXrcd(x->id)); rc != 0) return rc;
    if (it != xrcd_files().end()) xrcd_files().erase(it);
  } else {
    l.unlock();
    if (int rc = status_errno(e->DeallocXrcd(x->id)); rc != 0) return rc;
  }
  delete x;
  return 0;
}

// ibv_open_qp(3): another handle on an XRC target QP of a domain this
// context has open, found by number. Its modify and query reach the QP;
// destroying it drops only the handle.
ibv_qp* open_qp(ibv_context* c, ibv_qp_open_attr* attr) {
  constexpr uint32_t kNeeded = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
  if (!context_is_ours(c) || attr == nullptr || (attr->comp_mask & kNeeded) != kNeeded || attr->xrcd == nullptr ||
      attr->xrcd->context != c) {
    errno = EINVAL;
    return nullptr;
  }
  if (attr->comp_mask & ~(kNeeded | IBV_QP_OPEN_ATTR_CONTEXT)) {
    errno = EOPNOTSUPP;
    return nullptr;
  }
  if (attr->qp_type != IBV_QPT_XRC_RECV) {
    errno = EINVAL;  // only XRC target QPs are shared (IBA 11.2.5.5)
    return nullptr;
  }
  std::lock_guard<std::mutex> l(tgt_mu());
  auto it = tgt_qps().find(TgtKey{engine_of(c), reinterpret_cast<Xrcd*>(attr->xrcd)->id, attr->qp_num});
  if (it == tgt_qps().end()) {
    errno = EINVAL;
    return nullptr;
  }
  Qp* real = it->second;
  auto* qp = new Qp();
  std::memset(&qp->qpx, 0, sizeof(qp->qpx));
  qp->handle = real->handle;
  qp->xrcd = real->xrcd;
  qp->real = real;
  real->opens.fetch_add(1);
  ibv_qp& q = qp->qpx.qp_base;
  q.context = c;
  q.qp_context = (attr->comp_mask & IBV_QP_OPEN_ATTR_CONTEXT) ? attr->qp_context : nullptr;
  q.handle = real->qpx.qp_base.handle;
  q.qp_num = attr->qp_num;
  q.state = real->qpx.qp_base.state;
  q.qp_type = IBV_QPT_XRC_RECV;
  pthread_mutex_init(&q.mutex, nullptr);
  pthread_cond_init(&q.cond, nullptr);
  init_qp_ex_ops(&qp->qpx);
  return &q;
}

}  // namespace droce::provider
