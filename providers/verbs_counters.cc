// Counters as applications see them: the per-QP extension API of
// include/droce/droce.h, and the DROCE_STATS=1 reports on stderr (a QP's
// counters when it is destroyed, the device's when it is closed).
#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "droce/droce.h"
#include "engine/config.h"
#include "provider.h"

namespace droce::provider {

bool stats_enabled() {
  // Parsed with every other setting (config/settings.h): a value other than
  // 0 or 1 already failed ibv_get_device_list, so no context gets here.
  static const bool on = [] {
    const auto cfg = engine::ConfigFromEnv(0);
    return cfg.ok() && cfg->stats;
  }();
  return on;
}

void print_qp_counters(ibv_qp* qp) {
  const auto c = to_ctx(qp->context)->s->engine->ReadQpCounters(qp->qp_num);
  if (!c.ok() || std::all_of(std::begin(c->values), std::end(c->values), [](uint64_t v) { return v == 0; })) {
    return;
  }
  std::fprintf(stderr, "droce: %s QP %u counters (non-zero):\n", qp->context->device->name, qp->qp_num);
  for (size_t i = 0; i < kNumQpCounters; ++i) {
    if (c->values[i] != 0) {
      std::fprintf(stderr, "droce:   %-22s %12llu  %s\n", kQpCounterInfo[i].name,
                   static_cast<unsigned long long>(c->values[i]), kQpCounterInfo[i].description);
    }
  }
}

void print_device_counters(ibv_context* context) {
  const Counters c = to_ctx(context)->s->engine->ReadCounters();
  std::fprintf(stderr, "droce: %s counters (non-zero):\n", context->device->name);
  for (const auto& info : kCounterInfo) {
    const uint64_t n = c.*(info.field);
    if (n != 0) {
      std::fprintf(stderr, "droce:   %-22s %12llu  %s\n", info.name, static_cast<unsigned long long>(n),
                   info.description);
    }
  }
  // The link's own counters: frames it dropped before the engine saw them.
  if (const std::string link = to_ctx(context)->s->engine->LinkReport(); !link.empty()) {
    std::fprintf(stderr, "droce: %s %s\n", context->device->name, link.c_str());
  }
  // DROCE_FAULT's rules (docs/LAB.md), each with what it did.
  for (const std::string& line : to_ctx(context)->s->engine->FaultReport()) {
    std::fprintf(stderr, "droce: %s %s\n", context->device->name, line.c_str());
  }
}

}  // namespace droce::provider

extern "C" int droce_query_qp_counters(ibv_qp* qp, uint64_t* values, unsigned int n) {
  using namespace droce;
  if (qp == nullptr || qp->context == nullptr || !provider::context_is_ours(qp->context) ||
      (values == nullptr && n != 0)) {
    return -EINVAL;
  }
  const auto c = provider::to_ctx(qp->context)->s->engine->ReadQpCounters(qp->qp_num);
  if (!c.ok()) return -EINVAL;
  if (n != 0) std::memcpy(values, c->values, sizeof(uint64_t) * std::min<size_t>(n, kNumQpCounters));
  return static_cast<int>(kNumQpCounters);
}

extern "C" const char* droce_qp_counter_name(unsigned int i) {
  return i < droce::kNumQpCounters ? droce::kQpCounterInfo[i].name : nullptr;
}

extern "C" const char* droce_qp_counter_description(unsigned int i) {
  return i < droce::kNumQpCounters ? droce::kQpCounterInfo[i].description : nullptr;
}
