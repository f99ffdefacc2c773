// A stand-in for the system libibverbs (this machine has
// no kernel RDMA device to test beside): one device, "standin0", whose
// context and objects are plain structs of this library. Every ibv_*
// function libdroce.so forwards for a device that is not droce's is defined
// here, records its name and first argument, and answers a value the test
// can recognise. The test links libdroce.so first and this library second,
// so this is what libdroce.so's RTLD_NEXT finds, as libibverbs under
// LD_PRELOAD. Not a model of libibverbs: nothing here is checked for
// meaning, only for arriving unchanged.
#include "system_standin.h"

#include <infiniband/verbs.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

namespace {

std::mutex mu;
std::vector<StandinCall> calls;

ibv_device device = [] {
  ibv_device d{};
  std::strcpy(d.name, "standin0");
  std::strcpy(d.dev_name, "uverbs9");
  d.node_type = IBV_NODE_CA;
  d.transport_type = IBV_TRANSPORT_IB;
  return d;
}();
ibv_context context = [] {
  ibv_context c{};
  c.device = &device;
  c.cmd_fd = -1;
  c.async_fd = -1;
  return c;
}();
ibv_pd pd{&context, 1};
ibv_mr mr{&context, &pd, nullptr, 0, 2, 0x77, 0x77};
ibv_comp_channel channel{&context, -1, 0};
ibv_cq cq{};
ibv_qp qp{};
ibv_srq srq{};
ibv_ah ah{&context, &pd, 3};
ibv_dm dm{};
ibv_qp_ex qpx{};

void record(const char* name, const void* arg) {
  std::lock_guard<std::mutex> l(mu);
  calls.push_back({name, arg});
}

struct Init {
  Init() {
    cq.context = &context;
    qp.context = &context;
    qp.pd = &pd;
    srq.context = &context;
    srq.pd = &pd;
    dm.context = &context;
    qpx.qp_base = qp;
  }
} init;

}  // namespace

std::vector<StandinCall> standin_calls() {
  std::lock_guard<std::mutex> l(mu);
  return calls;
}
void standin_reset() {
  std::lock_guard<std::mutex> l(mu);
  calls.clear();
}
StandinObjects standin_objects() {
  return {&device, &context, &pd, &mr, &channel, &cq, &qp, &srq, &ah, &dm, &qpx};
}

extern "C" {

ibv_device** ibv_get_device_list(int* n) {
  record("ibv_get_device_list", n);
  auto** list = static_cast<ibv_device**>(calloc(2, sizeof(ibv_device*)));
  list[0] = &device;
  if (n != nullptr) *n = 1;
  return list;
}
void ibv_free_device_list(ibv_device** list) {
  record("ibv_free_device_list", list);
  free(list);
}
const char* ibv_get_device_name(ibv_device* d) {
  record("ibv_get_device_name", d);
  return d->name;
}
int ibv_get_device_index(ibv_device* d) {
  record("ibv_get_device_index", d);
  return 9;
}
__be64 ibv_get_device_guid(ibv_device* d) {
  record("ibv_get_device_guid", d);
  return 0x1234;
}
ibv_context* ibv_open_device(ibv_device* d) {
  record("ibv_open_device", d);
  return &context;
}
int ibv_close_device(ibv_context* c) {
  record("ibv_close_device", c);
  return kStandinRc;
}
int ibv_query_device(ibv_context* c, ibv_device_attr*) {
  record("ibv_query_device", c);
  return kStandinRc;
}
int (ibv_query_port)(ibv_context* c, uint8_t, struct _compat_ibv_port_attr*) {
  record("ibv_query_port", c);
  return kStandinRc;
}
int ibv_query_gid(ibv_context* c, uint8_t, int, union ibv_gid*) {
  record("ibv_query_gid", c);
  return kStandinRc;
}
int _ibv_query_gid_ex(ibv_context* c, uint32_t, uint32_t, ibv_gid_entry*, uint32_t, size_t) {
  record("_ibv_query_gid_ex", c);
  return kStandinRc;
}
ssize_t _ibv_query_gid_table(ibv_context* c, ibv_gid_entry*, size_t, uint32_t, size_t) {
  record("_ibv_query_gid_table", c);
  return kStandinRc;
}
int ibv_query_gid_type(ibv_context* c, uint8_t, unsigned int, int*) {
  record("ibv_query_gid_type", c);
  return kStandinRc;
}
int ibv_query_pkey(ibv_context* c, uint8_t, int, __be16*) {
  record("ibv_query_pkey", c);
  return kStandinRc;
}
int ibv_get_pkey_index(ibv_context* c, uint8_t, __be16) {
  record("ibv_get_pkey_index", c);
  return kStandinRc;
}
int ibv_get_async_event(ibv_context* c, ibv_async_event*) {
  record("ibv_get_async_event", c);
  return kStandinRc;
}
void ibv_ack_async_event(ibv_async_event* e) { record("ibv_ack_async_event", e); }
int ibv_resolve_eth_l2_from_gid(ibv_context* c, ibv_ah_attr*, uint8_t*, uint16_t*) {
  record("ibv_resolve_eth_l2_from_gid", c);
  return kStandinRc;
}
ibv_pd* ibv_alloc_pd(ibv_context* c) {
  record("ibv_alloc_pd", c);
  return &pd;
}
ibv_pd* ibv_import_pd(ibv_context* c, uint32_t) {
  record("ibv_import_pd", c);
  return &pd;
}
void ibv_unimport_pd(ibv_pd* p) { record("ibv_unimport_pd", p); }
int ibv_dealloc_pd(ibv_pd* p) {
  record("ibv_dealloc_pd", p);
  return kStandinRc;
}
ibv_mr* (ibv_reg_mr)(ibv_pd* p, void*, size_t, int) {
  record("ibv_reg_mr", p);
  return &mr;
}
ibv_mr* (ibv_reg_mr_iova)(ibv_pd* p, void*, size_t, uint64_t, int) {
  record("ibv_reg_mr_iova", p);
  return &mr;
}
ibv_mr* ibv_reg_mr_iova2(ibv_pd* p, void*, size_t, uint64_t, unsigned int) {
  record("ibv_reg_mr_iova2", p);
  return &mr;
}
ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* p, uint64_t, size_t, uint64_t, int, int) {
  record("ibv_reg_dmabuf_mr", p);
  return &mr;
}
ibv_mr* ibv_import_mr(ibv_pd* p, uint32_t) {
  record("ibv_import_mr", p);
  return &mr;
}
void ibv_unimport_mr(ibv_mr* m) { record("ibv_unimport_mr", m); }
int ibv_rereg_mr(ibv_mr* m, int, ibv_pd*, void*, size_t, int) {
  record("ibv_rereg_mr", m);
  return kStandinRc;
}
int ibv_dereg_mr(ibv_mr* m) {
  record("ibv_dereg_mr", m);
  return kStandinRc;
}
ibv_comp_channel* ibv_create_comp_channel(ibv_context* c) {
  record("ibv_create_comp_channel", c);
  return &channel;
}
int ibv_destroy_comp_channel(ibv_comp_channel* ch) {
  record("ibv_destroy_comp_channel", ch);
  return kStandinRc;
}
ibv_cq* ibv_create_cq(ibv_context* c, int, void*, ibv_comp_channel*, int) {
  record("ibv_create_cq", c);
  return &cq;
}
int ibv_resize_cq(ibv_cq* q, int) {
  record("ibv_resize_cq", q);
  return kStandinRc;
}
int ibv_destroy_cq(ibv_cq* q) {
  record("ibv_destroy_cq", q);
  return kStandinRc;
}
int ibv_get_cq_event(ibv_comp_channel* ch, ibv_cq**, void**) {
  record("ibv_get_cq_event", ch);
  return kStandinRc;
}
void ibv_ack_cq_events(ibv_cq* q, unsigned int) { record("ibv_ack_cq_events", q); }
ibv_qp* ibv_create_qp(ibv_pd* p, ibv_qp_init_attr*) {
  record("ibv_create_qp", p);
  return &qp;
}
int ibv_modify_qp(ibv_qp* q, ibv_qp_attr*, int) {
  record("ibv_modify_qp", q);
  return kStandinRc;
}
int ibv_query_qp(ibv_qp* q, ibv_qp_attr*, int, ibv_qp_init_attr*) {
  record("ibv_query_qp", q);
  return kStandinRc;
}
int ibv_destroy_qp(ibv_qp* q) {
  record("ibv_destroy_qp", q);
  return kStandinRc;
}
int ibv_attach_mcast(ibv_qp* q, const union ibv_gid*, uint16_t) {
  record("ibv_attach_mcast", q);
  return kStandinRc;
}
int ibv_detach_mcast(ibv_qp* q, const union ibv_gid*, uint16_t) {
  record("ibv_detach_mcast", q);
  return kStandinRc;
}
ibv_qp_ex* ibv_qp_to_qp_ex(ibv_qp* q) {
  record("ibv_qp_to_qp_ex", q);
  return &qpx;
}
int ibv_query_qp_data_in_order(ibv_qp* q, enum ibv_wr_opcode, uint32_t) {
  record("ibv_query_qp_data_in_order", q);
  return kStandinRc;
}
int ibv_set_ece(ibv_qp* q, ibv_ece*) {
  record("ibv_set_ece", q);
  return kStandinRc;
}
int ibv_query_ece(ibv_qp* q, ibv_ece*) {
  record("ibv_query_ece", q);
  return kStandinRc;
}
ibv_srq* ibv_create_srq(ibv_pd* p, ibv_srq_init_attr*) {
  record("ibv_create_srq", p);
  return &srq;
}
int ibv_modify_srq(ibv_srq* s, ibv_srq_attr*, int) {
  record("ibv_modify_srq", s);
  return kStandinRc;
}
int ibv_query_srq(ibv_srq* s, ibv_srq_attr*) {
  record("ibv_query_srq", s);
  return kStandinRc;
}
int ibv_destroy_srq(ibv_srq* s) {
  record("ibv_destroy_srq", s);
  return kStandinRc;
}
ibv_ah* ibv_create_ah(ibv_pd* p, ibv_ah_attr*) {
  record("ibv_create_ah", p);
  return &ah;
}
int ibv_destroy_ah(ibv_ah* a) {
  record("ibv_destroy_ah", a);
  return kStandinRc;
}
int ibv_init_ah_from_wc(ibv_context* c, uint8_t, ibv_wc*, ibv_grh*, ibv_ah_attr*) {
  record("ibv_init_ah_from_wc", c);
  return kStandinRc;
}
ibv_ah* ibv_create_ah_from_wc(ibv_pd* p, ibv_wc*, ibv_grh*, uint8_t) {
  record("ibv_create_ah_from_wc", p);
  return &ah;
}
ibv_dm* ibv_import_dm(ibv_context* c, uint32_t) {
  record("ibv_import_dm", c);
  return &dm;
}
void ibv_unimport_dm(ibv_dm* d) { record("ibv_unimport_dm", d); }

}  // extern "C"
