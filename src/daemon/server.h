// droced's side of the control protocol (src/ctl/): the listening socket, one
// thread per client process, the client's objects, its limits, and its
// teardown when it goes away. The engine devices it serves are the same
// engine::Device the embedded mode runs; a client's objects are its own
// (every handle it names is checked against what it created), its QPs are
// created with the client as owner (doorbells from its queues reach only
// them), and its registered memory is mapped here from the memfds it passes.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "admin/query.h"
#include "admin/serve.h"
#include "cm/engine_port.h"
#include "ctl/protocol.h"
#include "cm/ucma.h"
#include "daemon/limits.h"
#include "engine/device.h"

namespace droce::daemon {

// Where droced listens and clients look when DROCE_DAEMON is not set.
inline constexpr const char* kDefaultSocket = ctl::kDefaultSocket;

struct ServerOptions {
  std::string socket_path;
  mode_t socket_mode = 0666;
  // The socket file's group, a name or a number (empty: the daemon's own
  // group); Listen gives the file this group, then socket_mode.
  std::string socket_group;
  ClientLimits limits;
  // Prometheus text endpoint (GET /metrics) on metrics_address:metrics_port;
  // port 0: off.
  std::string metrics_address = "127.0.0.1";
  uint16_t metrics_port = 0;
  // Called on Run's thread when it begins to stop, before the clients hear
  // of it (droced tells systemd STOPPING=1).
  std::function<void()> on_stopping;
};

// What the daemon holds, for tests and logs (also in `droced` status lines).
struct ServerStats {
  std::atomic<uint64_t> clients_accepted{0};
  std::atomic<uint64_t> clients_live{0};
  std::atomic<uint64_t> clients_refused{0};   // bad hello, credentials
  std::atomic<uint64_t> bad_messages{0};      // refused requests (error reply or disconnect)
  std::atomic<uint64_t> foreign_handles{0};   // handles that were not the client's
  std::atomic<uint64_t> objects_live{0};      // PDs, MRs, MWs, CQs, QPs, SRQs, AHs of live clients
  std::atomic<uint64_t> mr_maps_live{0};      // client memory mapped into the daemon
  std::atomic<uint64_t> mr_shared{0}, mr_moved{0}, mr_copied{0};  // registrations per tier
  std::atomic<uint64_t> teardowns{0};
  std::atomic<uint64_t> admin_requests{0};    // `droce ctl` questions (not clients)
};

class Server {
 public:
  Server(std::vector<engine::Device*> devices, ServerOptions opt);
  ~Server();
  // Binds and listens (removing a stale socket file no daemon answers on).
  absl::Status Listen();
  // Accepts clients until Stop; returns after every client thread ended.
  void Run();
  // Any thread or a signal handler's helper: makes Run return. Clients get
  // IBV_EVENT_DEVICE_FATAL (the devices are shut down) and are disconnected.
  void Stop();
  const ServerStats& stats() const { return stats_; }
  std::string StatusLine() const;

  const ServerOptions& options() const { return opt_; }
  // Where the metrics endpoint listens (0: off).
  uint16_t metrics_port() const { return metrics_ != nullptr ? metrics_->port() : 0; }

  class Client;
  class AdminHost;

 private:
  void Serve(std::shared_ptr<Client> c);

  std::vector<engine::Device*> devices_;
  ServerOptions opt_;
  int listen_fd_ = -1;
  int stop_fd_ = -1;  // eventfd
  std::atomic<bool> stopping_{false};
  ServerStats stats_;
  std::mutex mu_;
  struct Live {
    std::shared_ptr<Client> client;
    std::thread thread;
  };
  std::vector<Live> live_;  // a thread per client; joined once it is done
  // The connection manager of every device, shared by all clients (their
  // listeners and port spaces are one endpoint's), started with the server.
  std::unique_ptr<cm::Ucma> ucma_;
  std::vector<std::unique_ptr<cm::EnginePort>> cm_ports_;
  std::atomic<uint32_t> next_cm_owner_{1};
  // `droce ctl` and the metrics endpoint (admin/query.h) see the devices
  // and the clients through it.
  std::unique_ptr<AdminHost> admin_;
  std::unique_ptr<admin::MetricsServer> metrics_;
};

}  // namespace droce::daemon
