// Which engine the provider talks to: the one it runs itself (embedded, the
// default) or droced (client mode: DROCE_DAEMON=PATH, or the default socket
// when a daemon answers there and no DROCE_LINK is given). Everything else in
// the provider goes through engine::Session and does not know which.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/session.h"

namespace droce::provider {

// The daemon's socket, or "" in embedded mode (decided once per process).
const std::string& daemon_socket();
// The configuration is usable: embedded, the DROCE_* settings parse; client
// mode, the daemon answered the hello.
absl::Status check_config();
// Devices there are (embedded: DROCE_LINK entries; client mode: the daemon's).
int device_count();
// droce<index>'s session, started (embedded) or attached (client mode) on
// first use. Embedded, it lives until exit. In client mode the reference
// keeps its connection to droced: a context holds one, and once that
// daemon stopped or vanished the next call opens a new connection (a
// restarted droced), while the old one stays until its last reference goes.
absl::StatusOr<std::shared_ptr<engine::Session>> session_for(int index);
// One request to droced outside any device session (the connection
// manager's ops): 0 or the errno, as the session calls; ENODEV in embedded
// mode or without a daemon.
int daemon_call(uint16_t op, const void* req, size_t len, const int* fds, int nfds, void* rep, size_t rep_room);
// A port's node GUID (host order): EUI-64 from its MAC, as RoCE NICs do.
uint64_t node_guid_host(const engine::PortInfo& p);

}  // namespace droce::provider
