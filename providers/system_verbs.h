// Beside real devices: libdroce.so exports the ibv_*
// functions a program calls, and the system libibverbs is the next
// definition of each (RTLD_NEXT: under LD_PRELOAD libdroce.so comes first
// and libibverbs after it). ibv_get_device_list lists droce's devices and
// then the system library's; every call on a device, context or object
// that is not droce's goes to the system library unchanged, and droce's
// own objects never do. Calls that inline functions of verbs.h make
// through the context's op tables (ibv_post_send, ibv_poll_cq, ...) reach
// each device's own provider without passing here.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <type_traits>

#include "interpose.h"

namespace droce::provider {

bool context_is_ours(ibv_context* c);
bool device_is_ours(ibv_device* d);

inline bool is_foreign_context(ibv_context* c) { return c != nullptr && !context_is_ours(c); }
inline bool is_foreign_device(ibv_device* d) { return d != nullptr && !device_is_ours(d); }

// The context of an object, or null for a null object.
template <typename T>
ibv_context* ctx_of(T* object) {
  return object != nullptr ? object->context : nullptr;
}

// What a forwarded call answers when the system library lacks the
// function (a libibverbs older than the program's API).
template <typename R>
R system_missing() {
  if constexpr (std::is_void_v<R>) {
    return;
  } else if constexpr (std::is_pointer_v<R>) {
    errno = EOPNOTSUPP;
    return nullptr;
  } else {
    return static_cast<R>(EOPNOTSUPP);
  }
}

// The system library's device list (nullptr if it has none, as on a
// machine without kernel RDMA; errno is left as it was). While it runs,
// ibv_get_sysfs_path answers the real sysfs root and the interposed file
// calls pass every path through (sysfs_view.cc), so the system library
// neither finds droce's devices nor starts their engines.
ibv_device** system_device_list(int* n);
// True on a thread inside system_device_list.
bool in_system_scan();

}  // namespace droce::provider

// Returns from the calling function with the system library's answer for
// `name`(ARGS...) when `foreign` holds.
#define DROCE_FORWARD_IF(foreign, name, ...)                                                          \
  do {                                                                                                \
    if (foreign) {                                                                                    \
      auto* fwd_fn_ = REAL(name);                                                                     \
      if (fwd_fn_ == nullptr) return ::droce::provider::system_missing<decltype(fwd_fn_(__VA_ARGS__))>(); \
      return fwd_fn_(__VA_ARGS__);                                                                    \
    }                                                                                                 \
  } while (0)

// ... when `ctx` (an ibv_context*, possibly null) is not one of droce's.
#define DROCE_FORWARD_FOREIGN(ctx, name, ...) \
  DROCE_FORWARD_IF(::droce::provider::is_foreign_context(ctx), name, __VA_ARGS__)
// ... when `dev` (an ibv_device*, possibly null) is not one of droce's.
#define DROCE_FORWARD_FOREIGN_DEVICE(dev, name, ...) \
  DROCE_FORWARD_IF(::droce::provider::is_foreign_device(dev), name, __VA_ARGS__)
