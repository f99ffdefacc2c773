// The device's verbs objects: PDs, MRs, memory windows, CQs, SRQs, AHs and
// QPs, each with its id, its references (what uses a PD, a CQ, an SRQ) and
// its owner: who created it (OwnerScope). The table's rules are the verbs'
// ones: an object in use cannot go (EBUSY at the verbs boundary), ids are
// handed out as rxe does, and ObjKind lists the kinds in the order an
// owner's objects are torn down (the kernel's uverbs_destroy_ufile_hw: what
// uses an object goes before it).
//
// DPDK-free and unlocked: the Device changes it only with every worker
// stopped (its control path), and the workers' turns only read it. Tested
// alone in tests/unit/engine_objects_test.cc.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "cq/cq.h"
#include "engine/mcast.h"
#include "engine/session.h"
#include "mem/mr_table.h"
#include "queue/shm.h"
#include "transport/qp.h"
#include "transport/scheduler.h"

namespace droce::engine {

struct Worker;

// Who an object belongs to: 0 for the process itself (embedded mode), a
// droced client's tag (Server::Client::tag) for the objects its requests
// create. The objects a thread creates while an OwnerScope lives on it
// belong to that scope's owner, as a kernel object belongs to the file its
// ioctl came in on.
uint64_t CurrentOwner();
class OwnerScope {
 public:
  explicit OwnerScope(uint64_t owner);
  ~OwnerScope();
  OwnerScope(const OwnerScope&) = delete;
  OwnerScope& operator=(const OwnerScope&) = delete;

 private:
  uint64_t prev_;
};

// The kinds of object, in the order an owner's objects are destroyed.
enum class ObjKind : uint8_t { kQp, kSrq, kAh, kMw, kMr, kCq, kPd };
inline constexpr int kNumObjKinds = 7;
const char* ObjKindName(ObjKind k);

// A QP: its transport, its rings, and its place in its worker's scheduler
// (transport/scheduler.h).
struct QpEntry : transport::Schedulable {
  std::unique_ptr<transport::Qp> qp;
  queue::ShmRegion shm;
  QpShared* shared = nullptr;
  Worker* worker = nullptr;  // the worker that runs it
  // pd: an XRC target QP's XRC domain (it holds that use).
  uint32_t pd = 0, send_cq = 0, recv_cq = 0, srq = 0;
  EventSink* events = nullptr;
  uint64_t cookie = 0;
  uint64_t owner = 0;
};

struct SrqEntry {
  std::unique_ptr<transport::Srq> srq;
  queue::ShmRegion shm;
  uint32_t pd = 0;
  uint32_t xrcd = 0, cq = 0;  // an XRC SRQ's domain and CQ (0: a basic SRQ)
  uint32_t users = 0;
  EventSink* events = nullptr;
  uint64_t cookie = 0;
  uint64_t owner = 0;
};

struct CqEntry {
  std::unique_ptr<cq::CqRegion> region;
  std::vector<std::unique_ptr<cq::CqRegion>> retired;  // regions before ibv_resize_cq
  std::unique_ptr<cq::CqProducer> producer;
  uint32_t users = 0;
  uint64_t owner = 0;
};

struct PdEntry {
  uint32_t uses = 0;  // objects on it
  uint64_t owner = 0;
};

struct AhEntry {
  transport::AddressHandle ah;
  uint64_t owner = 0;
};

// One owner's objects, by kind (ObjKind order), each list sorted.
struct OwnedObjects {
  std::array<std::vector<uint32_t>, kNumObjKinds> ids;
  const std::vector<uint32_t>& of(ObjKind k) const { return ids[static_cast<int>(k)]; }
  size_t total() const;
};

// What a new QP refers to, checked (ObjectTable::ResolveQpRefs).
struct QpRefs {
  uint32_t holds = 0;  // the PD (an XRC target: its XRC domain) it uses
  CqEntry* send_cq = nullptr;
  CqEntry* recv_cq = nullptr;
  SrqEntry* srq = nullptr;
};

class ObjectTable {
 public:
  // PDs. Objects count as users of their PD: PdUses is nullptr for an
  // unknown PD; ReleasePd drops one use.
  uint32_t AllocPd(uint64_t owner);
  absl::Status DeallocPd(uint32_t pd);
  uint32_t* PdUses(uint32_t pd);
  void ReleasePd(uint32_t pd);

  // MRs and memory windows (in mrs; the owner kept here by MR key and by
  // window index, which a window keeps across binds).
  absl::StatusOr<mem::Mr> RegMr(uint32_t pd, uint64_t addr, uint64_t iova, uint64_t len, uint32_t access,
                                int32_t pid, uint64_t owner);
  absl::Status ReregMr(uint32_t key, uint32_t flags, uint32_t pd, uint64_t addr, uint64_t len, uint64_t iova,
                       uint32_t access);
  absl::Status DeregMr(uint32_t key);
  absl::StatusOr<uint32_t> AllocMw(uint32_t pd, uint8_t type, uint64_t owner);
  absl::Status DeallocMw(uint32_t rkey);

  // CQs: the entry is made by the caller (it holds the region).
  uint32_t AddCq(CqEntry e);
  absl::Status DestroyCq(uint32_t id);
  CqEntry* FindCq(uint32_t id);
  // CQs with a moderation period (ticked by worker 0).
  void SetTicked(cq::CqProducer* p);

  // SRQs: checks pd (and an XRC SRQ's domain and CQ) and takes their uses.
  absl::StatusOr<uint32_t> AddSrq(SrqEntry e);
  absl::Status DestroySrq(uint32_t id);
  SrqEntry* FindSrq(uint32_t id);

  // AHs.
  absl::StatusOr<uint32_t> AddAh(const transport::AddressHandle& ah, uint64_t owner);
  absl::Status DestroyAh(uint32_t id);
  const transport::AddressHandle* FindAh(uint32_t id) const;

  // QPs, in three steps: the references checked, a QPN chosen, the entry
  // added (taking the uses); RemoveQp drops them. A QP attached to a
  // multicast group cannot go.
  absl::Status ResolveQpRefs(const QpCreateArgs& a, QpRefs* out);
  absl::StatusOr<uint32_t> NextQpn();
  void StartQpnsAt(uint32_t qpn) { next_qpn_ = qpn; }
  void AddQp(uint32_t qpn, std::unique_ptr<QpEntry> e, const QpRefs& refs);
  absl::Status CheckQpRemovable(uint32_t qpn) const;
  std::unique_ptr<QpEntry> RemoveQp(uint32_t qpn);
  QpEntry* FindQp(uint32_t qpn) const;

  // An XRC target's SRQ by number: its CQ and domain too.
  bool FindXrcSrq(uint32_t srqn, transport::XrcSrqRef* out);

  // Ownership: the owner of one object (nullopt if there is none with that
  // id; an MW by rkey), and everything an owner has.
  std::optional<uint64_t> OwnerOf(ObjKind k, uint32_t id) const;
  OwnedObjects Owned(uint64_t owner) const;

  // Read by the workers' turns and the device's reports.
  absl::flat_hash_map<uint32_t, std::unique_ptr<QpEntry>> qps;
  absl::flat_hash_map<uint32_t, CqEntry> cqs;
  absl::flat_hash_map<uint32_t, PdEntry> pds;
  absl::flat_hash_map<uint32_t, SrqEntry> srqs;
  absl::flat_hash_map<uint32_t, AhEntry> ahs;
  mem::MrTable mrs;
  McastGroups mcast;
  std::vector<cq::CqProducer*> ticked_cqs;

 private:
  absl::flat_hash_map<uint32_t, uint64_t> mr_owner_;  // by key
  absl::flat_hash_map<uint32_t, uint64_t> mw_owner_;  // by index (rkey >> 8)
  uint32_t next_qpn_ = 0x11;
  uint32_t next_cq_ = 1;
  uint32_t next_pd_ = 1;
  uint32_t next_srq_ = 1;
  uint32_t next_ah_ = 1;
};

}  // namespace droce::engine
