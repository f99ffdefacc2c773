// librdmacm's kernel interface, served in the process (rdma_cm.cc): the
// rdma_ucm character device /dev/infiniband/rdma_cm, whose open gives an
// event channel, and the write() commands of <rdma/rdma_user_cm.h> on it.
#pragma once

namespace droce::provider {

// A new event channel (open of /dev/infiniband/rdma_cm with these flags):
// a real, pollable file descriptor, or -1 with errno.
int cm_open_channel(int flags);

}  // namespace droce::provider
