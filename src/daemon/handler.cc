// The requests of one droced client (client.h): a handler per op of
// DROCE_CTL_OPS, and the teardown of everything the client owned.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "daemon/client.h"

namespace droce::daemon {
namespace {

constexpr uint64_t kPage = 4096;

// Whether `more` on top of `held` passes a client limit; 0 is no limit (the
// device's own still applies).
bool Over(uint64_t limit, uint64_t held, uint64_t more) { return limit != 0 && held + more > limit; }

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

}  // namespace

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

template <>
bool Handler::OnConn<ctl::kHello>(const ctl::Header& h, const ctl::Hello& hello, Msg& m) {
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

template <>
bool Handler::OnConn<ctl::kAttach>(const ctl::Header& h, const ctl::None&, Msg&) {
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

template <>
bool Handler::OnDev<ctl::kRegMr>(const ctl::Header& h, const ctl::RegMr& r, Msg& m, Server::Client::Dev& d) {
  if (!Owns(d, engine::ObjKind::kPd, r.pd)) return Reply(h, Foreign());
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

// The device ops: every handle a request names must be this client's.
template <>
bool Handler::OnDev<ctl::kAllocPd>(const ctl::Header& h, const ctl::None&, Msg&, Server::Client::Dev& d) {
  auto pd = d.dev->AllocPd();
  if (!pd.ok()) return Reply(h, ctl::ErrnoOf(pd.status()));
  Live(1);
  const ctl::IdRep rep{*pd, 0};
  return Reply(h, 0, &rep, sizeof(rep));
}

bool Handler::Owns(const Server::Client::Dev& d, engine::ObjKind kind, uint32_t id) {
  return d.dev->OwnerOf(kind, id) == c_.tag;
}

template <typename Destroy>
bool Handler::DestroyOwned(const ctl::Header& h, const Server::Client::Dev& d, engine::ObjKind kind, uint32_t id,
                           Destroy destroy) {
  if (!Owns(d, kind, id)) return Reply(h, Foreign());
  const int rc = ctl::ErrnoOf(destroy());
  if (rc == 0) Live(-1);
  return Reply(h, rc);
}

template <>
bool Handler::OnDev<ctl::kDeallocPd>(const ctl::Header& h, const ctl::Id& a, Msg&, Server::Client::Dev& d) {
  return DestroyOwned(h, d, engine::ObjKind::kPd, a.id, [&] { return d.dev->DeallocPd(a.id); });
}

template <>
bool Handler::OnDev<ctl::kDeregMr>(const ctl::Header& h, const ctl::Id& a, Msg&, Server::Client::Dev& d) {
  if (!Owns(d, engine::ObjKind::kMr, a.id)) return Reply(h, Foreign());
  const int rc = ctl::ErrnoOf(d.dev->DeregMr(a.id));
  if (rc == 0) DropMr(d, a.id);
  return Reply(h, rc);
}

template <>
bool Handler::OnDev<ctl::kReregMr>(const ctl::Header& h, const ctl::ReregMr& r, Msg&, Server::Client::Dev& d) {
  if (!Owns(d, engine::ObjKind::kMr, r.key) ||
      ((r.flags & engine::Session::kReregPd) && !Owns(d, engine::ObjKind::kPd, r.pd))) {
    return Reply(h, Foreign());
  }
  return Reply(h, ctl::ErrnoOf(d.dev->ReregMr(r.key, r.flags, r.pd, 0, 0, 0, r.access)));
}

template <>
bool Handler::OnDev<ctl::kAllocMw>(const ctl::Header& h, const ctl::AllocMw& a, Msg&, Server::Client::Dev& d) {
  if (!Owns(d, engine::ObjKind::kPd, a.pd)) return Reply(h, Foreign());
  auto rkey = d.dev->AllocMw(a.pd, static_cast<uint8_t>(a.type));
  if (!rkey.ok()) return Reply(h, ctl::ErrnoOf(rkey.status()));
  Live(1);
  const ctl::IdRep rep{*rkey, 0};
  return Reply(h, 0, &rep, sizeof(rep));
}

template <>
bool Handler::OnDev<ctl::kDeallocMw>(const ctl::Header& h, const ctl::Id& a, Msg&, Server::Client::Dev& d) {
  return DestroyOwned(h, d, engine::ObjKind::kMw, a.id, [&] { return d.dev->DeallocMw(a.id); });
}

template <>
bool Handler::OnDev<ctl::kCreateCq>(const ctl::Header& h, const ctl::CreateCq& a, Msg&, Server::Client::Dev& d) {
  if (Over(lim_.max_cqs, c_.ncqs, 1) || Over(lim_.max_cqes, c_.ncqes, a.min_cqe)) return Reply(h, ENOMEM);
  auto cq = d.dev->CreateCq(a.min_cqe, &d, a.cookie);
  if (!cq.ok()) return Reply(h, ctl::ErrnoOf(cq.status()));
  const uint32_t entries = cq->region->capacity();
  d.cqes[cq->id] = entries;
  ++c_.ncqs;
  c_.ncqes += entries;
  Live(1);
  const ctl::CqRep rep{cq->id, entries, cq->region->bytes()};
  const int fd = cq->region->fd();
  return Reply(h, 0, &rep, sizeof(rep), &fd, 1);
}

template <>
bool Handler::OnDev<ctl::kDestroyCq>(const ctl::Header& h, const ctl::Id& a, Msg&, Server::Client::Dev& d) {
  auto it = d.cqes.find(a.id);
  if (it == d.cqes.end() || !Owns(d, engine::ObjKind::kCq, a.id)) return Reply(h, Foreign());
  const int rc = ctl::ErrnoOf(d.dev->DestroyCq(a.id));
  if (rc == 0) {
    c_.ncqes -= it->second;
    --c_.ncqs;
    d.cqes.erase(it);
    Live(-1);
  }
  return Reply(h, rc);
}

template <>
bool Handler::OnDev<ctl::kResizeCq>(const ctl::Header& h, const ctl::ResizeCq& a, Msg&, Server::Client::Dev& d) {
  auto it = d.cqes.find(a.id);
  if (it == d.cqes.end() || !Owns(d, engine::ObjKind::kCq, a.id)) return Reply(h, Foreign());
  if (Over(lim_.max_cqes, c_.ncqes - it->second, a.min_cqe)) return Reply(h, ENOMEM);
  auto region = d.dev->ResizeCq(a.id, a.min_cqe);
  if (!region.ok()) return Reply(h, ctl::ErrnoOf(region.status()));
  c_.ncqes = c_.ncqes - it->second + (*region)->capacity();
  it->second = (*region)->capacity();
  const ctl::CqRep rep{a.id, (*region)->capacity(), (*region)->bytes()};
  const int fd = (*region)->fd();
  return Reply(h, 0, &rep, sizeof(rep), &fd, 1);
}

template <>
bool Handler::OnDev<ctl::kModifyCq>(const ctl::Header& h, const ctl::ModifyCq& a, Msg&, Server::Client::Dev& d) {
  if (!Owns(d, engine::ObjKind::kCq, a.id)) return Reply(h, Foreign());
  return Reply(h, ctl::ErrnoOf(d.dev->ModifyCq(a.id, a.count, a.period_us)));
}

template <>
bool Handler::OnDev<ctl::kCreateQp>(const ctl::Header& h, const ctl::CreateQp& a, Msg&, Server::Client::Dev& d) {
  // Every object named must be this client's; an XRC target names its
  // XRC domain (a PD id) and no CQ, an XRC initiator no receive CQ.
  const auto type = static_cast<transport::QpType>(a.type);
  const bool tgt = type == transport::QpType::kXrcTgt;
  const bool rcq_optional = tgt || type == transport::QpType::kXrcIni;
  if (!Owns(d, engine::ObjKind::kPd, tgt ? a.xrcd : a.pd) || (!tgt && !Owns(d, engine::ObjKind::kCq, a.send_cq)) ||
      ((!rcq_optional || a.recv_cq != 0) && !Owns(d, engine::ObjKind::kCq, a.recv_cq)) ||
      (a.srq != 0 && !Owns(d, engine::ObjKind::kSrq, a.srq))) {
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
  auto qp = d.dev->CreateQp(args);
  if (!qp.ok()) return Reply(h, ctl::ErrnoOf(qp.status()));
  ++c_.nqps;
  Live(1);
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

template <>
bool Handler::OnDev<ctl::kModifyQp>(const ctl::Header& h, const ctl::ModifyQp& a, Msg&, Server::Client::Dev& d) {
  if (!Owns(d, engine::ObjKind::kQp, a.qpn)) return Reply(h, Foreign());
  transport::QpAttr attr;
  (void)ctl::FromWire(ctl::Masked(a.attr, a.mask), &attr);  // checked by ValidateRequest
  return Reply(h, d.dev->ModifyQp(a.qpn, attr, a.mask));
}

template <>
bool Handler::OnDev<ctl::kQueryQp>(const ctl::Header& h, const ctl::Id& a, Msg&, Server::Client::Dev& d) {
  if (!Owns(d, engine::ObjKind::kQp, a.id)) return Reply(h, Foreign());
  auto attr = d.dev->QueryQp(a.id);
  if (!attr.ok()) return Reply(h, ctl::ErrnoOf(attr.status()));
  const ctl::WireQpAttr w = ctl::ToWire(*attr);
  return Reply(h, 0, &w, sizeof(w));
}

template <>
bool Handler::OnDev<ctl::kDestroyQp>(const ctl::Header& h, const ctl::Id& a, Msg&, Server::Client::Dev& d) {
  return DestroyOwned(h, d, engine::ObjKind::kQp, a.id, [&] {
    absl::Status s = d.dev->DestroyQp(a.id);
    if (s.ok()) --c_.nqps;
    return s;
  });
}

template <>
bool Handler::OnDev<ctl::kCreateSrq>(const ctl::Header& h, const ctl::CreateSrq& a, Msg&, Server::Client::Dev& d) {
  if (!Owns(d, engine::ObjKind::kPd, a.pd) ||
      (a.xrcd != 0 && (!Owns(d, engine::ObjKind::kPd, a.xrcd) || !Owns(d, engine::ObjKind::kCq, a.cq)))) {
    return Reply(h, Foreign());
  }
  auto srq = d.dev->CreateSrq(a.pd, a.max_wr, a.max_sge, a.limit, &d, a.cookie, a.xrcd, a.cq);
  if (!srq.ok()) return Reply(h, ctl::ErrnoOf(srq.status()));
  Live(1);
  const ctl::SrqRep rep{srq->id, srq->max_wr, srq->max_sge, 0, srq->map.size};
  const int fd = srq->map.fd;
  return Reply(h, 0, &rep, sizeof(rep), &fd, 1);
}

template <>
bool Handler::OnDev<ctl::kModifySrq>(const ctl::Header& h, const ctl::ModifySrq& a, Msg&, Server::Client::Dev& d) {
  if (!Owns(d, engine::ObjKind::kSrq, a.id)) return Reply(h, Foreign());
  return Reply(h, d.dev->ModifySrq(a.id, a.limit));
}

template <>
bool Handler::OnDev<ctl::kQuerySrq>(const ctl::Header& h, const ctl::Id& a, Msg&, Server::Client::Dev& d) {
  if (!Owns(d, engine::ObjKind::kSrq, a.id)) return Reply(h, Foreign());
  auto limit = d.dev->QuerySrqLimit(a.id);
  if (!limit.ok()) return Reply(h, ctl::ErrnoOf(limit.status()));
  const ctl::IdRep rep{*limit, 0};
  return Reply(h, 0, &rep, sizeof(rep));
}

template <>
bool Handler::OnDev<ctl::kDestroySrq>(const ctl::Header& h, const ctl::Id& a, Msg&, Server::Client::Dev& d) {
  return DestroyOwned(h, d, engine::ObjKind::kSrq, a.id, [&] { return d.dev->DestroySrq(a.id); });
}

template <>
bool Handler::OnDev<ctl::kCreateAh>(const ctl::Header& h, const ctl::CreateAh& a, Msg&, Server::Client::Dev& d) {
  if (!Owns(d, engine::ObjKind::kPd, a.pd)) return Reply(h, Foreign());
  transport::AddressVector av;
  (void)ctl::FromWire(a.av, &av);  // checked by ValidateRequest
  auto id = d.dev->CreateAh(a.pd, av);
  if (!id.ok()) return Reply(h, ctl::ErrnoOf(id.status()));
  Live(1);
  const ctl::IdRep rep{*id, 0};
  return Reply(h, 0, &rep, sizeof(rep));
}

template <>
bool Handler::OnDev<ctl::kDestroyAh>(const ctl::Header& h, const ctl::Id& a, Msg&, Server::Client::Dev& d) {
  return DestroyOwned(h, d, engine::ObjKind::kAh, a.id, [&] { return d.dev->DestroyAh(a.id); });
}

bool Handler::Mcast(const ctl::Header& h, const ctl::Mcast& a, Server::Client::Dev& d, bool attach) {
  if (!Owns(d, engine::ObjKind::kQp, a.qpn)) return Reply(h, Foreign());
  wire::Ipv6Addr gid;
  std::memcpy(gid.data(), a.gid, 16);
  return Reply(h, attach ? d.dev->AttachMcast(a.qpn, gid) : d.dev->DetachMcast(a.qpn, gid));
}

template <>
bool Handler::OnDev<ctl::kAttachMcast>(const ctl::Header& h, const ctl::Mcast& a, Msg&, Server::Client::Dev& d) {
  return Mcast(h, a, d, true);
}

template <>
bool Handler::OnDev<ctl::kDetachMcast>(const ctl::Header& h, const ctl::Mcast& a, Msg&, Server::Client::Dev& d) {
  return Mcast(h, a, d, false);
}

template <>
bool Handler::OnDev<ctl::kReadCounters>(const ctl::Header& h, const ctl::None&, Msg&, Server::Client::Dev& d) {
  const Counters cn = d.dev->ReadCounters();
  return Reply(h, 0, &cn, sizeof(cn));
}

template <>
bool Handler::OnDev<ctl::kReadQpCounters>(const ctl::Header& h, const ctl::Id& a, Msg&, Server::Client::Dev& d) {
  if (!Owns(d, engine::ObjKind::kQp, a.id)) return Reply(h, Foreign());
  auto cn = d.dev->ReadQpCounters(a.id);
  if (!cn.ok()) return Reply(h, ctl::ErrnoOf(cn.status()));
  return Reply(h, 0, &*cn, sizeof(*cn));
}

// librdmacm's commands, run by the shared connection manager on channels
// keyed by this client and its fd number; the client copies the responses
// to its pointers (the daemon never writes client memory for the CM).
template <>
bool Handler::OnConn<ctl::kCmOpen>(const ctl::Header& h, const ctl::CmChannel& c, Msg& m) {
  const int fd = m.fds[0];
  m.fds[0] = -1;
  m.nfds = 0;
  if (ucma_ == nullptr) {
    close(fd);
    return Reply(h, ENODEV);
  }
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

template <>
bool Handler::OnConn<ctl::kCmClose>(const ctl::Header& h, const ctl::CmChannel& c, Msg&) {
  if (ucma_ == nullptr) return Reply(h, ENODEV);
  auto it = cm_fds_.find(c.fd);
  if (it == cm_fds_.end()) return Reply(h, EBADF);
  ucma_->CloseChannel(uint64_t{cm_owner_} << 32 | c.fd);
  close(it->second);
  cm_fds_.erase(it);
  return Reply(h, 0);
}

template <>
bool Handler::OnConn<ctl::kCmCommand>(const ctl::Header& h, const ctl::CmCommand& c, Msg&) {
  if (ucma_ == nullptr) return Reply(h, ENODEV);
  const cm::Ucma::Result r =
      ucma_->Command(uint64_t{cm_owner_} << 32 | c.fd, c.cmd, c.in, c.in_len, c.out_len, {c.opt, c.opt_len});
  ctl::CmResult rep{};
  rep.rc = r.rc;
  rep.len = std::min<uint32_t>(r.len, ctl::kCmMaxOut);
  rep.response = r.response;
  std::memcpy(rep.bytes, r.bytes, rep.len);
  return Reply(h, 0, &rep, sizeof(rep));
}

// On a verbs client's connection, an administration request ends it (an
// administration connection's are answered before the dispatch).
template <>
bool Handler::OnConn<ctl::kAdmin>(const ctl::Header&, const ctl::AdminReq&, Msg&) {
  st_.bad_messages.fetch_add(1, std::memory_order_relaxed);
  return false;
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
  switch (h.op) {
#define DROCE_CTL_OP_CASE(name, ...) \
  case ctl::k##name:                 \
    return Dispatch<ctl::k##name>(h, m);
    DROCE_CTL_OPS(DROCE_CTL_OP_CASE)
#undef DROCE_CTL_OP_CASE
    default:
      return false;
  }
}

template <uint16_t op>
bool Handler::Dispatch(const ctl::Header& h, Msg& m) {
  using Def = ctl::OpDef<op>;
  const auto req = Payload<typename Def::Req>(m);
  if constexpr (Def::kScope == ctl::Scope::kConn) {
    return OnConn<op>(h, req, m);
  } else {
    if (h.dev >= c_.devs.size() || !c_.devs[h.dev]->attached) return Reply(h, ENODEV);
    // What the op creates is the client's (objects.h).
    engine::OwnerScope owner(c_.tag);
    return OnDev<op>(h, req, m, *c_.devs[h.dev]);
  }
}

// Everything the client owned, with the engine stopped from touching it
// before its memory goes: the doorbell queues leave the loops, then the
// engine destroys the client's objects in uverbs order (Device::DestroyAllOf:
// QPs out of their groups first, then SRQs, AHs, MWs, MRs, CQs and PDs), all
// with the workers stopped once, so when it returns no worker runs them; the
// MRs' pages are unmapped after that. Its QPNs are not handed out again
// until the 24-bit QPN space wraps (the engine counts up from the last one),
// so late packets from its peers find no QP and are dropped.
void Handler::Teardown() {
  // Its connection manager ids first (DREQ/REJ to their peers), as the
  // kernel's ucma_close does when the process goes.
  if (ucma_ != nullptr) ucma_->CloseChannelsOf(cm_owner_);
  for (auto& dp : c_.devs) {
    Server::Client::Dev& d = *dp;
    if (!d.attached) continue;
    engine::Device& dev = *d.dev;
    dev.RemoveDoorbellSource(&d.src);
    absl::flat_hash_set<uint32_t> kept_mrs;  // the engine would not let them go: their pages stay
    size_t failed = 0;
    const size_t gone = dev.DestroyAllOf(c_.tag, [&](engine::ObjKind kind, uint32_t id, const absl::Status& s) {
      Log(LogLevel::kWarning, "droced: client pid %d: %s %u: %s", static_cast<int>(c_.pid), engine::ObjKindName(kind),
          id, std::string(s.message()).c_str());
      if (kind == engine::ObjKind::kMr) kept_mrs.insert(id);
      ++failed;
    });
    std::vector<uint32_t> keys;
    for (const auto& [key, map] : d.mrs) {
      if (!kept_mrs.contains(key)) keys.push_back(key);
    }
    // DropMr counts its MR out of the live objects.
    for (uint32_t key : keys) DropMr(d, key);
    st_.objects_live.fetch_sub(gone + failed - keys.size(), std::memory_order_relaxed);
    d.cqes.clear();
    dev.RemoveDeviceSink(&d);
    d.attached = false;
  }
}

}  // namespace droce::daemon
