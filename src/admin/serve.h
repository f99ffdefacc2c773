// Where the admin queries (admin/query.h) are answered besides droced's
// control socket: the Prometheus endpoint (HTTP, libmicrohttpd) and, in an
// embedded process with DROCE_CTL=1, a per-process socket for `droce ctl
// --pid PID`.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "admin/query.h"

struct MHD_Daemon;

namespace droce::admin {

// GET /metrics on address:port answers PrometheusText(host); anything else
// is 404. Serves from one thread of its own until destroyed.
class MetricsServer {
 public:
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(Host* host, const std::string& address,
                                                              uint16_t port);
  ~MetricsServer();
  // The port it listens on (the one asked for, or the kernel's pick for 0).
  uint16_t port() const { return port_; }

 private:
  MetricsServer() = default;
  Host* host_ = nullptr;
  MHD_Daemon* mhd_ = nullptr;
  uint16_t port_ = 0;
};

// The host of an embedded process: its started devices, itself as the one
// client. Kill is refused (there is no daemon to detach it from).
class EmbeddedHost final : public Host {
 public:
  std::vector<engine::Device*> Devices() override;
  std::vector<ClientInfo> Clients() override;
  Owners OwnersOf(size_t dev) override;
  absl::Status Kill(int32_t pid, uint32_t uid) override;
};

// Starts the per-process socket's thread once (DROCE_CTL=1). Only
// processes of the same user (or root) get answers.
void StartEmbeddedCtl();

// A connected admin socket's conversation: every message a kAdmin request
// (ValidateRequest'ed), answered until EOF or a bad message. `uid` is the
// peer's.
void ServeAdminConnection(Host& host, int sock, uint32_t uid);

}  // namespace droce::admin
