// The kernel's rdma_ucm interface (<rdma/rdma_user_cm.h>), as a library:
// event channels, the ids and multicast joins each channel owns, the
// command structs decoded and answered, events queued per channel in the
// order they happened. Whoever serves librdmacm wraps it: the provider in
// embedded mode (providers/rdma_cm.cc: one process, channel key = the fd),
// droced in daemon mode (src/daemon/server.cc: every client's channels,
// key = client << 32 | the client's fd), so that listeners and port spaces
// are shared by all clients of the endpoint. It never touches the
// caller's memory: responses come back as bytes with the user pointer they
// are for, and an option's value is passed in. Thread-safe (one mutex); a
// thread of its own feeds the manager its MADs and timers. DPDK-free.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cm/manager.h"

namespace droce::cm {

class Ucma {
 public:
  static constexpr size_t kMaxResponse = 512;
  struct Result {
    int rc = 0;              // 0 or -errno, as ucma_write
    uint64_t response = 0;   // the user pointer the bytes are for (0: none)
    uint32_t len = 0;
    uint8_t bytes[kMaxResponse];
  };

  Ucma();
  ~Ucma();
  Ucma(const Ucma&) = delete;
  Ucma& operator=(const Ucma&) = delete;

  // Ports before Start (the manager's; io must outlive this object).
  void AddPort(const LocalPort& port, PortIo* io);
  int ports() const { return static_cast<int>(nports_); }
  // The port's device is gone: DEVICE_REMOVAL to its ids (any thread).
  void RemovePort(int dev);
  // Starts the thread that runs the manager's MADs and timers.
  void Start();
  // A MAD received on QP1 of `dev` (any thread).
  void Inbound(int dev, const MadSource& src, const uint8_t* mad);

  // A new channel: `notify_fd` (an eventfd in semaphore mode, not owned) is
  // written 1 for every event queued on it.
  int OpenChannel(uint64_t key, int notify_fd);
  // Destroys every id of the channel (the kernel's ucma_close).
  void CloseChannel(uint64_t key);
  // droced: every channel whose key's high 32 bits are `owner`.
  void CloseChannelsOf(uint32_t owner);
  // The process is exiting with its embedded connection manager: the MADs
  // that arrived are handled, then every peer is told (Manager::ProcessExit).
  // The caller then lets the ports send them (engine::Device::FlushGsi).
  void ProcessExit();
  bool HasChannel(uint64_t key);

  // One command (its struct after rdma_ucm_cmd_hdr, in_len bytes; out_len
  // the header's `out`). SET_OPTION's value is `optval` (read by the
  // caller from the user's pointer). GET_EVENT pops the channel's next
  // event: the caller has taken one count from notify_fd first; -EAGAIN if
  // what it popped was void (its id was destroyed): take another count.
  Result Command(uint64_t key, uint32_t cmd, const uint8_t* in, size_t in_len, size_t out_len,
                 std::span<const uint8_t> optval = {});
  // The manager's counts (DROCE_STATS=1 prints them when a channel closes).
  CmStats stats();
  // Lines "name value  description" for the non-zero counts.
  std::string StatsText();

 private:
  struct Queued {
    Event ev;
    bool dead = false;
  };
  struct Channel {
    uint64_t key = 0;
    int notify_fd = -1;
    std::deque<Queued> events;
  };
  struct IdInfo {
    Channel* ch = nullptr;
    uint64_t uid = 0;
    uint32_t events_reported = 0;
  };
  struct McInfo {
    uint64_t uid = 0;
    uint32_t id = 0;
    uint32_t events_reported = 0;
  };
  struct In {
    int dev;
    MadSource src;
    std::array<uint8_t, kMadSize> mad;
  };

  void Loop();
  void Deliver(const Event& e);
  void Notify(Channel* ch);
  void Purge(Channel* ch, uint32_t id);
  void DestroyLocked(uint32_t id);
  void CloseLocked(Channel* ch);
  int Dispatch(Channel* ch, uint32_t cmd, const uint8_t* in, size_t in_len, size_t out_len,
               std::span<const uint8_t> optval, Result* r);
  int GetEvent(Channel* ch, const uint8_t* in, size_t in_len, size_t out_len, Result* r);
  Channel* ChannelOf(uint64_t key) const {
    auto it = channels_.find(key);
    return it == channels_.end() ? nullptr : it->second.get();
  }
  IdInfo* Own(Channel* ch, uint32_t id) {
    auto it = ids_.find(id);
    return it == ids_.end() || it->second.ch != ch ? nullptr : &it->second;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::unique_ptr<Manager> mgr_;
  size_t nports_ = 0;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Channel>> channels_;
  absl::flat_hash_map<uint32_t, IdInfo> ids_;
  absl::flat_hash_map<uint32_t, McInfo> mcs_;
  std::deque<In> inbox_;
  bool rearm_ = false;
  bool stop_ = false;
  bool started_ = false;
  std::thread thread_;
};

}  // namespace droce::cm
