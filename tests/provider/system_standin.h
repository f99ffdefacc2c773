// The stand-in system libibverbs of system_verbs_test.cc (system_standin.cc).
#pragma once

#include <infiniband/verbs.h>

#include <vector>

// What a stand-in function answers where it returns an int.
inline constexpr int kStandinRc = 4242;

struct StandinCall {
  const char* name;
  const void* arg;  // the first argument
};

struct StandinObjects {
  ibv_device* device;
  ibv_context* context;
  ibv_pd* pd;
  ibv_mr* mr;
  ibv_comp_channel* channel;
  ibv_cq* cq;
  ibv_qp* qp;
  ibv_srq* srq;
  ibv_ah* ah;
  ibv_dm* dm;
  ibv_qp_ex* qpx;
};

std::vector<StandinCall> standin_calls();
void standin_reset();
StandinObjects standin_objects();
