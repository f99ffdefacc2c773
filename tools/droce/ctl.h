// `droce ctl`: the operator's view of a running engine, shaped like iproute2's
// `rdma` tool (dev, link, res, stat) plus droced's clients. It asks droced over
// its control socket, or an embedded process started with DROCE_CTL=1 over
// that process's own socket (--pid), with the admin requests of
// src/admin/query.h; -j prints the engine's JSON as is.
#pragma once

#include <string>
#include <vector>

namespace droce::tools {

// `args`: what follows `droce ctl`. Returns the exit status: 0, 1 (the
// engine cannot be reached or refused), 2 (bad arguments: one line says
// which).
int CtlMain(const std::vector<std::string>& args);

}  // namespace droce::tools
