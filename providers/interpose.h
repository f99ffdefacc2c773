// Calling the real libc function behind one libdroce.so interposes
// (sysfs_view.cc: open & co.; rdma_cm.cc: write, close, fstat).
#pragma once

#include <dlfcn.h>

#include <atomic>

// The real function behind one of ours, looked up once (the pointer is
// constant-initialised, so this works before any constructor has run and
// from any thread; two threads racing store the same value).
#define REAL(name)                                                                  \
  ([]() {                                                                           \
    static std::atomic<void*> fn{nullptr};                                          \
    void* f = fn.load(std::memory_order_relaxed);                                   \
    if (f == nullptr) {                                                             \
      f = dlsym(RTLD_NEXT, #name);                                                  \
      fn.store(f, std::memory_order_relaxed);                                       \
    }                                                                               \
    return reinterpret_cast<decltype(&::name)>(f);                                  \
  }())
