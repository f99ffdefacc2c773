// Devices, contexts and queries: ibv_get_device_list … ibv_query_gid.
#include <fcntl.h>
#include <limits.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <string>
#include <string_view>

#include "common/log.h"
#include "engine/config.h"
#include "engine/mcast.h"
#include "provider.h"
#include "sessions.h"
#include "sysfs_view.h"
#include "system_verbs.h"

using droce::provider::Context;
using droce::provider::ContextState;
using droce::provider::to_ctx;

namespace droce::provider {

uint64_t node_guid_host(const engine::PortInfo& p) { return engine::node_guid(p); }

namespace {

constexpr const char* kIbdevPrefix = "/sys/class/infiniband/droce";
// Devices droce can hand out: one per configured link (DROCE_LINK entries;
// the settings refuse more).
constexpr int kMaxDevices = config::kMaxDevices;

// droce<index>; the objects are static, so ibv_device pointers stay valid
// after ibv_free_device_list as libibverbs guarantees.
ibv_device* device_at(int index) {
  static ibv_device devs[kMaxDevices] = {};
  static std::once_flag once;
  std::call_once(once, [] {
    for (int i = 0; i < kMaxDevices; ++i) {
      ibv_device& d = devs[i];
      d.node_type = IBV_NODE_CA;
      d.transport_type = IBV_TRANSPORT_IB;
      std::snprintf(d.name, sizeof(d.name), "droce%d", i);
      std::snprintf(d.dev_name, sizeof(d.dev_name), "uverbs-droce%d", i);
      std::snprintf(d.dev_path, sizeof(d.dev_path), "/sys/class/infiniband_verbs/uverbs-droce%d", i);
      std::snprintf(d.ibdev_path, sizeof(d.ibdev_path), "%s%d", kIbdevPrefix, i);
    }
  });
  return &devs[index];
}

// The index of one of droce's devices, or -1.
int device_index(const ibv_device* device) {
  for (int i = 0; i < kMaxDevices; ++i) {
    if (device == device_at(i)) return i;
  }
  return -1;
}

bool is_ours(ibv_context* c) {
  return c != nullptr && device_index(c->device) >= 0 && c->abi_compat == __VERBS_ABI_IS_EXTENDED;
}

// Reports a configuration or start-up problem once, on one line.
void report_once(const std::string& msg) {
  static std::once_flag once;
  std::call_once(once, [&] { std::fprintf(stderr, "droce: %s\n", msg.c_str()); });
}

// The port's GID at `index`: 0 the IPv4-mapped address, 1 the IPv6 address
// (DROCE_IP6); nullptr beyond the table.
const uint8_t* port_gid(const engine::PortInfo& p, uint64_t index) {
  return index < p.gid_count ? p.gids[index] : nullptr;
}

// A GID as the kernel's sysfs shows it (ports/N/gids/M, "%pI6": eight
// groups of four hex digits).
std::string gid_text(const uint8_t* g) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x:%02x%02x",
                g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7], g[8], g[9], g[10], g[11], g[12], g[13],
                g[14], g[15]);
  return buf;
}

void fill_device_attr(const engine::PortInfo& p, ibv_device_attr* a) {
  std::memset(a, 0, sizeof(*a));
  std::snprintf(a->fw_ver, sizeof(a->fw_ver), "%s", engine::kFirmwareVersion);
  a->node_guid = htobe64(node_guid_host(p));
  a->sys_image_guid = a->node_guid;
  a->max_mr_size = engine::Limits::kMaxMrSize;
  a->page_size_cap = 0xFFFFF000;
  // No IEEE OUI of its own: the value Linux rxe reports (RXE_VENDOR_ID), so
  // that software which tells soft RoCE apart by its vendor treats droce as
  // rxe; rdma-core's suite requires it non-zero. Part 0, as rxe's. Neither
  // matches a vendor perftest or UCX special-cases.
  a->vendor_id = 0xFFFFFF;
  a->vendor_part_id = 0;
  a->hw_ver = 0;
  a->max_qp = engine::Limits::kMaxQp;
  a->max_qp_wr = engine::Limits::kMaxQpWr;
  a->device_cap_flags = IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT |
                        IBV_DEVICE_SYS_IMAGE_GUID | IBV_DEVICE_MEM_WINDOW |
                        IBV_DEVICE_MEM_WINDOW_TYPE_2B | IBV_DEVICE_XRC;
  a->max_mw = engine::Limits::kMaxMr;
  a->max_sge = engine::Limits::kMaxSge;
  a->max_sge_rd = engine::Limits::kMaxSge;
  a->max_cq = engine::Limits::kMaxCq;
  a->max_cqe = engine::Limits::kMaxCqe;
  a->max_mr = engine::Limits::kMaxMr;
  a->max_pd = engine::Limits::kMaxPd;
  a->max_qp_rd_atom = 16;
  a->max_res_rd_atom = 16 * engine::Limits::kMaxQp;
  a->max_qp_init_rd_atom = 16;
  a->atomic_cap = IBV_ATOMIC_HCA;  // atomic also against the host's own CPUs
  a->max_srq = engine::Limits::kMaxQp;
  a->max_srq_wr = engine::Limits::kMaxQpWr;
  a->max_srq_sge = engine::Limits::kMaxSge;
  a->max_ah = 1 << 20;
  a->max_mcast_grp = engine::McastGroups::kMaxGroups;
  a->max_mcast_qp_attach = engine::McastGroups::kMaxQpsPerGroup;
  a->max_total_mcast_qp_attach = engine::McastGroups::kMaxAttachments;
  a->max_pkeys = 1;
  a->local_ca_ack_delay = 15;
  a->phys_port_cnt = 1;
}

void fill_port_attr(const engine::Session& dev, ibv_port_attr* a) {
  const engine::PortInfo& p = dev.port();
  const bool active = dev.port_active();
  std::memset(a, 0, sizeof(*a));
  a->state = active ? IBV_PORT_ACTIVE : IBV_PORT_DOWN;
  a->max_mtu = IBV_MTU_4096;
  a->active_mtu = static_cast<ibv_mtu>(p.active_mtu);
  a->gid_tbl_len = static_cast<int>(p.gid_count);
  a->port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_DEVICE_MGMT_SUP | IBV_PORT_VENDOR_CLASS_SUP;
  a->max_msg_sz = 0x80000000u;
  a->pkey_tbl_len = 1;
  a->lid = 0;
  a->sm_lid = 0;
  a->lmc = 0;
  a->max_vl_num = 1;
  a->active_width = 1;   // 1X
  a->active_speed = 32;  // EDR-class lane, as rxe reports for 25G+ links
  a->phys_state = active ? 5 : 3;  // LinkUp : Disabled
  a->link_layer = IBV_LINK_LAYER_ETHERNET;
}

int query_port_ex(ibv_context* c, uint8_t port, ibv_port_attr* attr, size_t len) {
  if (!is_ours(c) || attr == nullptr) return EINVAL;
  if (port != 1) return EINVAL;
  ibv_port_attr a;
  fill_port_attr(*to_ctx(c)->s->engine, &a);
  std::memcpy(attr, &a, std::min(len, sizeof(a)));
  return 0;
}

int query_device_ex(ibv_context* c, const ibv_query_device_ex_input*, ibv_device_attr_ex* attr,
                    size_t len) {
  if (!is_ours(c) || attr == nullptr || len < sizeof(ibv_device_attr)) return EINVAL;
  ibv_device_attr_ex a{};
  fill_device_attr(to_ctx(c)->s->engine->port(), &a.orig_attr);
  a.phys_port_cnt_ex = a.orig_attr.phys_port_cnt;  // one port (the _ex field exists for more than 255)
  // Completion timestamps are nanoseconds of CLOCK_MONOTONIC: a 1 GHz clock.
  a.completion_timestamp_mask = ~uint64_t{0};
  a.hca_core_clock = 1'000'000;  // kHz
  a.cq_mod_caps.max_cq_count = UINT16_MAX;
  a.cq_mod_caps.max_cq_period = UINT16_MAX;  // microseconds
  // On-demand paging: every registration is on demand in user space
  // (verbs_objects.cc); not the implicit, whole-address-space kind.
  a.odp_caps.general_caps = IBV_ODP_SUPPORT | IBV_ODP_SUPPORT_IMPLICIT;  // implicit: RegMrImplicit
  a.odp_caps.per_transport_caps.rc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE |
                                              IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC | IBV_ODP_SUPPORT_SRQ_RECV;
  a.odp_caps.per_transport_caps.uc_odp_caps =
      IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_SRQ_RECV;
  a.odp_caps.per_transport_caps.ud_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_RECV | IBV_ODP_SUPPORT_SRQ_RECV;
  a.xrc_odp_caps = IBV_ODP_SUPPORT_SEND | IBV_ODP_SUPPORT_WRITE | IBV_ODP_SUPPORT_READ | IBV_ODP_SUPPORT_ATOMIC |
                   IBV_ODP_SUPPORT_SRQ_RECV;
  // Packet pacing (IBV_QP_RATE_LIMIT, ibv_modify_qp_rate_limit), kbps.
  a.packet_pacing_caps.qp_rate_limit_min = 1;
  a.packet_pacing_caps.qp_rate_limit_max = droce::transport::kMaxRateLimitKbps;
  a.packet_pacing_caps.supported_qpts = (1u << IBV_QPT_RC) | (1u << IBV_QPT_UC) | (1u << IBV_QPT_UD);
  std::memcpy(attr, &a, std::min(len, sizeof(a)));
  return 0;
}

ibv_qp* create_qp_ex_op(ibv_context* c, ibv_qp_init_attr_ex* attr);

// ibv_query_rt_values_ex(3): the device clock completion timestamps use
// (CLOCK_MONOTONIC in ns, hca_core_clock 1 GHz), as mlx5 reports its raw
// clock: the count in tv_nsec, tv_sec 0. Bits it does not know are cleared.
int query_rt_values(ibv_context* c, ibv_values_ex* values) {
  if (!is_ours(c) || values == nullptr) return EINVAL;
  uint32_t done = 0;
  if (values->comp_mask & IBV_VALUES_MASK_RAW_CLOCK) {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    values->raw_clock.tv_sec = 0;
    values->raw_clock.tv_nsec = static_cast<long>(uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec));
    done |= IBV_VALUES_MASK_RAW_CLOCK;
  }
  values->comp_mask = done;
  return 0;
}


}  // namespace

// Every attribute's value, as the kernel's drivers/infiniband/core/sysfs.c
// formats it. Attributes that depend on the port start the device (as
// ibv_get_device_guid does): the MAC, the GID table and the link come from
// its configuration and its link. gid_attrs/ndevs/N is not provided:
// droce's GIDs belong to no kernel net device, and the kernel fails that
// read for such a GID too (libibverbs then reports ndev_ifindex 0).
bool sysfs_attr(int index, std::string_view file, std::string* value) {
  char buf[64];
  if (file == "board_id") *value = "droce";
  else if (file == "fw_ver") *value = engine::kFirmwareVersion;
  else if (file == "node_type") *value = "1: CA";
  else if (file == "hw_rev") *value = "0";
  else if (file == "node_desc") *value = "droce" + std::to_string(index);
  else {
    auto dev = session_for(index);
    if (!dev.ok()) return false;
    const engine::PortInfo& p = (*dev)->port();
    if (file == "node_guid" || file == "sys_image_guid") {
      const uint64_t g = node_guid_host(p);
      std::snprintf(buf, sizeof(buf), "%04x:%04x:%04x:%04x", static_cast<unsigned>(g >> 48),
                    static_cast<unsigned>(g >> 32) & 0xFFFF, static_cast<unsigned>(g >> 16) & 0xFFFF,
                    static_cast<unsigned>(g) & 0xFFFF);
      *value = buf;
      return true;
    }
    constexpr std::string_view kPort = "ports/1/";
    if (!file.starts_with(kPort)) return false;
    file.remove_prefix(kPort.size());
    ibv_port_attr a;
    fill_port_attr(**dev, &a);
    if (file == "state") *value = a.state == IBV_PORT_ACTIVE ? "4: ACTIVE" : "1: DOWN";
    else if (file == "phys_state") *value = a.phys_state == 5 ? "5: LinkUp" : "3: Disabled";
    else if (file == "link_layer") *value = "Ethernet";
    else if (file == "lid") *value = "0x0";
    else if (file == "sm_lid") *value = "0x0";
    else if (file == "lid_mask_count") *value = "0";
    else if (file == "sm_sl") *value = "0";
    else if (file == "cap_mask") {
      std::snprintf(buf, sizeof(buf), "0x%08x", a.port_cap_flags);
      *value = buf;
    } else if (file == "rate") {
      // active_speed 32 (EDR): 25 Gb/s a lane, times the width (1X).
      *value = "25 Gb/sec (1X EDR)";
    } else if (file == "pkeys/0") *value = "0xffff";
    else {
      constexpr std::string_view kGids = "gids/", kTypes = "gid_attrs/types/";
      const bool gid = file.starts_with(kGids);
      if (!gid && !file.starts_with(kTypes)) return false;
      const std::string_view num = file.substr(gid ? kGids.size() : kTypes.size());
      if (num.empty() || num.size() > 3 || num.find_first_not_of("0123456789") != std::string::npos) {
        return false;
      }
      const uint8_t* g = port_gid(p, std::stoul(std::string(num)));
      if (g == nullptr) return false;
      *value = gid ? gid_text(g) : "RoCE v2";
    }
  }
  return true;
}

bool context_is_ours(ibv_context* c) { return is_ours(c); }
bool device_is_ours(ibv_device* d) { return device_index(d) >= 0; }

namespace {
thread_local bool system_scan = false;
}  // namespace

bool in_system_scan() { return system_scan; }

ibv_device** system_device_list(int* n) {
  *n = 0;
  auto* list_fn = REAL(ibv_get_device_list);
  if (list_fn == nullptr) return nullptr;
  const int saved = errno;
  system_scan = true;
  int count = 0;
  ibv_device** sys = list_fn(&count);
  system_scan = false;
  errno = saved;
  if (sys == nullptr || count <= 0) {
    if (sys != nullptr) REAL(ibv_free_device_list)(sys);
    return nullptr;
  }
  *n = count;
  return sys;
}
ibv_qp* create_qp_ex_impl(ibv_context* c, ibv_qp_init_attr_ex* attr);
ibv_cq_ex* create_cq_ex_impl(ibv_context* c, ibv_cq_init_attr_ex* attr);
int modify_qp_rate_limit(ibv_qp* qp, ibv_qp_rate_limit_attr* attr);
int advise_mr(ibv_pd* pd, ibv_advise_mr_advice advice, uint32_t flags, ibv_sge* sg_list, uint32_t num_sge);
ibv_pd* alloc_parent_domain(ibv_context* c, ibv_parent_domain_init_attr* attr);
ibv_td* alloc_td(ibv_context* c, ibv_td_init_attr* attr);
int dealloc_td(ibv_td* td);

bool is_qp_event(ibv_event_type t) {
  switch (t) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_COMM_EST:
    case IBV_EVENT_SQ_DRAINED:
    case IBV_EVENT_PATH_MIG:
    case IBV_EVENT_PATH_MIG_ERR:
    case IBV_EVENT_QP_LAST_WQE_REACHED:
      return true;
    default:
      return false;
  }
}

bool push_async_event(Context* ctx, const ibv_async_event& ev) {
  {
    // Bounded: an application that never reads its async events must not
    // make the queue grow without limit; the oldest are kept.
    constexpr size_t kMaxAsyncEvents = 4096;
    std::lock_guard<std::mutex> l(ctx->s->async_mu);
    if (ctx->s->async_events.size() >= kMaxAsyncEvents) return false;
    ctx->s->async_events.push_back(ev);
  }
  const uint64_t one = 1;
  (void)!write(ctx->vctx.context.async_fd, &one, sizeof(one));
  return true;
}

namespace {
ibv_qp* create_qp_ex_op(ibv_context* c, ibv_qp_init_attr_ex* attr) { return create_qp_ex_impl(c, attr); }
}  // namespace

}  // namespace droce::provider

using namespace droce::provider;

extern "C" {

ibv_device** ibv_get_device_list(int* num_devices) {
  const absl::Status cfg = droce::provider::check_config();
  if (!cfg.ok()) {
    report_once(std::string(cfg.message()));
    if (num_devices) *num_devices = 0;
    errno = EINVAL;
    return nullptr;
  }
  const int n = std::min(droce::provider::device_count(), kMaxDevices);
  // The system library's devices (kernel RDMA devices) follow droce's. The
  // system list itself is kept after the terminating null, for
  // ibv_free_device_list to give back.
  int nsys = 0;
  ibv_device** sys = droce::provider::system_device_list(&nsys);
  auto** list = static_cast<ibv_device**>(calloc(n + nsys + 2, sizeof(ibv_device*)));
  if (list == nullptr) {
    if (sys != nullptr) REAL(ibv_free_device_list)(sys);
    errno = ENOMEM;
    return nullptr;
  }
  for (int i = 0; i < n; ++i) list[i] = device_at(i);
  for (int i = 0; i < nsys; ++i) list[n + i] = sys[i];
  list[n + nsys + 1] = reinterpret_cast<ibv_device*>(sys);
  if (num_devices) *num_devices = n + nsys;
  return list;
}

void ibv_free_device_list(ibv_device** list) {
  if (list == nullptr) return;
  size_t end = 0;
  while (list[end] != nullptr) ++end;
  if (auto* sys = reinterpret_cast<ibv_device**>(list[end + 1]); sys != nullptr) REAL(ibv_free_device_list)(sys);
  free(list);
}

const char* ibv_get_device_name(ibv_device* device) {
  DROCE_FORWARD_FOREIGN_DEVICE(device, ibv_get_device_name, device);
  return device ? device->name : nullptr;
}

int ibv_get_device_index(ibv_device* device) {
  DROCE_FORWARD_FOREIGN_DEVICE(device, ibv_get_device_index, device);
  return device_index(device);
}

__be64 ibv_get_device_guid(ibv_device* device) {
  DROCE_FORWARD_FOREIGN_DEVICE(device, ibv_get_device_guid, device);
  const int index = device_index(device);
  if (index < 0) return 0;
  auto dev = droce::provider::session_for(index);
  if (!dev.ok()) return 0;
  return htobe64(node_guid_host((*dev)->port()));
}

namespace {
// The contexts' command fds, by inode: each is a read-only descriptor of a
// memfd of its own, so ibv_import_device can tell from a dup of one (in
// this process) which device it opened.
struct CmdFdEntry {
  ibv_device* device;
  int refs;
};
std::mutex& cmd_fds_mu() {
  static auto* mu = new std::mutex();
  return *mu;
}
std::map<std::pair<dev_t, ino_t>, CmdFdEntry>& cmd_fds() {
  static auto* m = new std::map<std::pair<dev_t, ino_t>, CmdFdEntry>();
  return *m;
}
bool fd_inode(int fd, std::pair<dev_t, ino_t>* id) {
  struct stat st;
  if (fstat(fd, &st) != 0) return false;
  *id = {st.st_dev, st.st_ino};
  return true;
}
// A descriptor that takes no command (a write fails with EBADF, an ioctl
// with ENOTTY) but is a file of its own: a memfd reopened read-only.
int new_cmd_fd() {
  const int m = memfd_create("droce-context", MFD_CLOEXEC);
  if (m < 0) return -1;
  char path[64];
  std::snprintf(path, sizeof(path), "/proc/self/fd/%d", m);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  close(m);
  return fd;
}
void cmd_fd_ref(int fd, ibv_device* device, int delta) {
  std::pair<dev_t, ino_t> id;
  if (!fd_inode(fd, &id)) return;
  std::lock_guard<std::mutex> l(cmd_fds_mu());
  auto& m = cmd_fds();
  if (delta > 0) {
    auto [it, fresh] = m.try_emplace(id, CmdFdEntry{device, 0});
    it->second.refs += delta;
  } else if (auto it = m.find(id); it != m.end() && (it->second.refs += delta) <= 0) {
    m.erase(it);
  }
}
}  // namespace

namespace {
// A context of `device` whose command fd is `cmd_fd`, which it owns once
// made; on failure closed if `close_on_failure` (else the caller's still).
ibv_context* open_context(ibv_device* device, int cmd_fd, bool close_on_failure);
}  // namespace

ibv_context* ibv_open_device(ibv_device* device) {
  DROCE_FORWARD_FOREIGN_DEVICE(device, ibv_open_device, device);
  // A real descriptor, as a kernel context has (programs dup it to import
  // the device: ibv_import_device), but one that takes no command (a
  // libibverbs path droce does not interpose fails instead of reading a
  // reply nobody wrote): new_cmd_fd.
  const int fd = new_cmd_fd();
  if (fd < 0) return nullptr;
  return open_context(device, fd, true);
}

namespace {
ibv_context* open_context(ibv_device* device, int cmd_fd, bool close_on_failure) {
  const int index = device_index(device);
  auto fail = [cmd_fd, close_on_failure](int e) -> ibv_context* {
    if (close_on_failure) close(cmd_fd);
    errno = e;
    return nullptr;
  };
  if (index < 0) return fail(ENODEV);
  auto dev = droce::provider::session_for(index);
  if (!dev.ok()) {
    report_once(std::string(dev.status().message()));
    return fail(dev.status().code() == absl::StatusCode::kInvalidArgument ? EINVAL : EIO);
  }
  auto* ctx = new (std::nothrow) Context();
  if (ctx == nullptr) return fail(ENOMEM);
  std::memset(&ctx->vctx, 0, sizeof(ctx->vctx));
  ctx->s = new ContextState();
  ctx->s->engine = *dev;
  ctx->s->events.ctx = ctx;
  verbs_context& v = ctx->vctx;
  ibv_context& c = v.context;
  c.device = device;
  c.cmd_fd = cmd_fd;
  c.async_fd = eventfd(0, EFD_CLOEXEC | EFD_SEMAPHORE);
  if (c.async_fd < 0) {
    const int e = errno;
    delete ctx->s;
    delete ctx;
    return fail(e);
  }
  c.num_comp_vectors = 1;
  pthread_mutex_init(&c.mutex, nullptr);
  c.abi_compat = __VERBS_ABI_IS_EXTENDED;
  c.ops.poll_cq = poll_cq;
  c.ops.req_notify_cq = req_notify_cq;
  c.ops.post_send = post_send;
  c.ops.post_recv = post_recv;
  c.ops.post_srq_recv = post_srq_recv;
  c.ops.alloc_mw = alloc_mw;
  c.ops.bind_mw = bind_mw;
  c.ops.dealloc_mw = dealloc_mw;
  v.sz = sizeof(verbs_context);
  v.query_port = query_port_ex;
  v.query_device_ex = query_device_ex;
  v.create_qp_ex = create_qp_ex_op;
  v.create_cq_ex = create_cq_ex_impl;
  v.modify_cq = modify_cq;
  v.modify_qp_rate_limit = modify_qp_rate_limit;
  v.advise_mr = advise_mr;
  v.query_rt_values = query_rt_values;
  v.alloc_parent_domain = alloc_parent_domain;
  v.alloc_td = alloc_td;
  v.dealloc_td = dealloc_td;
  v.open_xrcd = open_xrcd;
  v.close_xrcd = close_xrcd;
  v.create_srq_ex = create_srq_ex;
  v.get_srq_num = get_srq_num;
  v.open_qp = open_qp;
  // Port and device events (after async_fd exists: they are queued on it).
  ctx->s->engine->AddDeviceSink(&ctx->s->events);
  cmd_fd_ref(c.cmd_fd, device, 1);
  return &c;
}
}  // namespace

// ibv_import_device(3): a new context of the device whose context's command
// fd `fd` duplicates, owning `fd`. The objects of every context of a
// device in one process are the same engine's (or droced's, for this
// client), so ibv_import_pd/_mr find them. A descriptor that is not a droce
// context's of this process (another process's, or not droce's) is
// EOPNOTSUPP: that context's objects live in another engine.
ibv_context* ibv_import_device(int fd) {
  std::pair<dev_t, ino_t> id;
  ibv_device* device = nullptr;
  if (fd_inode(fd, &id)) {
    std::lock_guard<std::mutex> l(cmd_fds_mu());
    if (auto it = cmd_fds().find(id); it != cmd_fds().end()) device = it->second.device;
  }
  if (device == nullptr) {
    // A kernel context's command fd (a uverbs character device, major 231)
    // is the system library's to import.
    struct stat st;
    if (fstat(fd, &st) == 0 && S_ISCHR(st.st_mode) && major(st.st_rdev) == 231) {
      if (auto* import_fn = REAL(ibv_import_device); import_fn != nullptr) return import_fn(fd);
    }
    errno = EOPNOTSUPP;
    return nullptr;
  }
  return open_context(device, fd, false);  // a failed import leaves fd to the caller
}

int ibv_close_device(ibv_context* context) {
  DROCE_FORWARD_FOREIGN(context, ibv_close_device, context);
  if (!is_ours(context)) return EINVAL;
  Context* ctx = to_ctx(context);
  if (stats_enabled()) print_device_counters(context);
  ctx->s->engine->RemoveDeviceSink(&ctx->s->events);
  close(context->async_fd);
  cmd_fd_ref(context->cmd_fd, context->device, -1);
  close(context->cmd_fd);
  pthread_mutex_destroy(&context->mutex);
  delete ctx->s;
  delete ctx;
  return 0;
}

int ibv_query_device(ibv_context* context, ibv_device_attr* attr) {
  DROCE_FORWARD_FOREIGN(context, ibv_query_device, context, attr);
  if (!is_ours(context) || attr == nullptr) return EINVAL;
  fill_device_attr(to_ctx(context)->s->engine->port(), attr);
  return 0;
}

// The exported symbol behind the ibv_query_port() macro's fallback path.
int (ibv_query_port)(ibv_context* context, uint8_t port_num, struct _compat_ibv_port_attr* attr) {
  DROCE_FORWARD_FOREIGN(context, ibv_query_port, context, port_num, attr);
  return query_port_ex(context, port_num, reinterpret_cast<ibv_port_attr*>(attr), sizeof(ibv_port_attr));
}

int ibv_query_gid(ibv_context* context, uint8_t port_num, int index, union ibv_gid* gid) {
  DROCE_FORWARD_FOREIGN(context, ibv_query_gid, context, port_num, index, gid);
  if (!is_ours(context) || port_num != 1 || index < 0 || gid == nullptr) return -1;
  const uint8_t* g = port_gid(to_ctx(context)->s->engine->port(), static_cast<unsigned>(index));
  if (g == nullptr) return -1;
  std::memcpy(gid->raw, g, 16);
  return 0;
}

int _ibv_query_gid_ex(ibv_context* context, uint32_t port_num, uint32_t gid_index,
                      ibv_gid_entry* entry, uint32_t flags, size_t entry_size) {
  DROCE_FORWARD_FOREIGN(context, _ibv_query_gid_ex, context, port_num, gid_index, entry, flags, entry_size);
  if (!is_ours(context) || flags != 0 || entry == nullptr) return EINVAL;
  if (port_num != 1) return EINVAL;
  const uint8_t* g = port_gid(to_ctx(context)->s->engine->port(), gid_index);
  if (g == nullptr) return ENODATA;  // beyond the table, as libibverbs documents
  ibv_gid_entry e{};
  std::memcpy(e.gid.raw, g, 16);
  e.gid_index = gid_index;
  e.port_num = 1;
  e.gid_type = IBV_GID_TYPE_ROCE_V2;
  e.ndev_ifindex = 0;
  std::memcpy(entry, &e, std::min(entry_size, sizeof(e)));
  return 0;
}

// Every valid GID; -EINVAL if they do not fit in max_entries (as libibverbs'
// own implementation answers).
ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries,
                             uint32_t flags, size_t entry_size) {
  DROCE_FORWARD_FOREIGN(context, _ibv_query_gid_table, context, entries, max_entries, flags, entry_size);
  if (!is_ours(context) || flags != 0 || entries == nullptr) return -EINVAL;
  const unsigned n = to_ctx(context)->s->engine->port().gid_count;
  if (max_entries < n) return -EINVAL;
  for (unsigned i = 0; i < n; ++i) {
    auto* e = reinterpret_cast<ibv_gid_entry*>(reinterpret_cast<char*>(entries) + i * entry_size);
    if (int rc = _ibv_query_gid_ex(context, 1, i, e, 0, entry_size); rc != 0) return -rc;
  }
  return n;
}

// rdma-core's private ibv_query_gid_type (IBVERBS_PRIVATE_*), which
// ibv_devinfo imports; 1 is IBV_GID_TYPE_SYSFS_ROCE_V2.
int ibv_query_gid_type(ibv_context* context, uint8_t port_num, unsigned int index, int* type) {
  DROCE_FORWARD_FOREIGN(context, ibv_query_gid_type, context, port_num, index, type);
  if (!is_ours(context) || port_num != 1 || type == nullptr ||
      port_gid(to_ctx(context)->s->engine->port(), index) == nullptr) {
    errno = EINVAL;
    return -1;
  }
  *type = 1;
  return 0;
}

int ibv_query_pkey(ibv_context* context, uint8_t port_num, int index, __be16* pkey) {
  DROCE_FORWARD_FOREIGN(context, ibv_query_pkey, context, port_num, index, pkey);
  if (!is_ours(context) || port_num != 1 || index != 0 || pkey == nullptr) return -1;
  *pkey = htobe16(0xFFFF);
  return 0;
}

int ibv_get_pkey_index(ibv_context* context, uint8_t port_num, __be16 pkey) {
  DROCE_FORWARD_FOREIGN(context, ibv_get_pkey_index, context, port_num, pkey);
  if (!is_ours(context) || port_num != 1) return -1;
  return (be16toh(pkey) & 0x7FFF) == 0x7FFF ? 0 : -1;
}

// Reads droce's attributes from the tree (sysfs_view.cc), which is written
// from sysfs_attr, so this and a program reading the files agree; other
// paths read the real file, as libibverbs' version does.
int ibv_read_sysfs_file(const char* dir, const char* file, char* buf, size_t size) {
  if (dir == nullptr || file == nullptr || buf == nullptr || size == 0) return -1;
  std::string path = std::string(dir) + "/" + file;
  char mapped[PATH_MAX];
  const char* name = sysfs_map(path.c_str(), mapped, sizeof(mapped)) ? mapped : path.c_str();
  int fd = open(name, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t len = read(fd, buf, size);
  close(fd);
  if (len <= 0) return -1;
  if (static_cast<size_t>(len) < size) buf[len] = '\0';
  if (buf[len - 1] == '\n') buf[--len] = '\0';
  return static_cast<int>(len);
}

const char* ibv_get_sysfs_path(void) {
  // The system library scanning for its own devices sees the real tree.
  if (droce::provider::in_system_scan()) {
    if (auto* real_fn = REAL(ibv_get_sysfs_path); real_fn != nullptr) return real_fn();
  }
  return sysfs_root();
}

int ibv_get_async_event(ibv_context* context, ibv_async_event* event) {
  DROCE_FORWARD_FOREIGN(context, ibv_get_async_event, context, event);
  if (!is_ours(context) || event == nullptr) {
    errno = EINVAL;
    return -1;
  }
  Context* ctx = to_ctx(context);
  for (;;) {
    uint64_t v;
    if (read(context->async_fd, &v, sizeof(v)) != sizeof(v)) return -1;  // errno: EAGAIN if O_NONBLOCK
    std::lock_guard<std::mutex> l(ctx->s->async_mu);
    // The queue may be shorter than the eventfd count: events of destroyed
    // objects are dropped unread. Then wait for the next one.
    if (ctx->s->async_events.empty()) continue;
    *event = ctx->s->async_events.front();
    ctx->s->async_events.pop_front();
    // Counted as reported once read: destroy waits for these to be acked.
    if (is_qp_event(event->event_type)) {
      ++to_qp(event->element.qp)->events_reported;
    } else if (event->event_type == IBV_EVENT_SRQ_LIMIT_REACHED || event->event_type == IBV_EVENT_SRQ_ERR) {
      ++to_srq(event->element.srq)->events_reported;
    } else if (event->event_type == IBV_EVENT_CQ_ERR) {
      ++to_cq(event->element.cq)->async_reported;
    }
    return 0;
  }
}

void ibv_ack_async_event(ibv_async_event* event) {
  if (event == nullptr) return;
  // The context of the event's object; a port or device event has none
  // (acknowledging one does nothing, here and in libibverbs).
  ibv_context* owner = nullptr;
  if (event->event_type == IBV_EVENT_CQ_ERR) owner = ctx_of(event->element.cq);
  else if (is_qp_event(event->event_type)) owner = ctx_of(event->element.qp);
  else if (event->event_type == IBV_EVENT_SRQ_ERR || event->event_type == IBV_EVENT_SRQ_LIMIT_REACHED)
    owner = ctx_of(event->element.srq);
  DROCE_FORWARD_FOREIGN(owner, ibv_ack_async_event, event);
  // Events for CQs, QPs and SRQs are counted, so that destroying one waits
  // until its events have been acknowledged (as libibverbs does).
  if (event->event_type == IBV_EVENT_CQ_ERR) {
    ibv_cq* cq = event->element.cq;
    count_acks(&cq->mutex, &cq->cond, &cq->async_events_completed, 1);
  } else if (is_qp_event(event->event_type)) {
    ibv_qp* qp = event->element.qp;
    count_acks(&qp->mutex, &qp->cond, &qp->events_completed, 1);
  } else if (event->event_type == IBV_EVENT_SRQ_ERR || event->event_type == IBV_EVENT_SRQ_LIMIT_REACHED) {
    ibv_srq* srq = event->element.srq;
    count_acks(&srq->mutex, &srq->cond, &srq->events_completed, 1);
  }
}

}  // extern "C"
