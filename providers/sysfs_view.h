// The file-system view of droce's devices (sysfs_view.cc): a private sysfs
// tree that looks like an RNIC's, and the device nodes
// /dev/infiniband/uverbs-droce<N>, for programs that look at files rather
// than ask libibverbs (UCX, Open MPI's openib, scripts).
#pragma once

#include <string>
#include <string_view>

namespace droce::provider {

// verbs_device.cc: the value of one of droce<index>'s attributes, relative
// to class/infiniband/droce<index>/ ("node_guid", "ports/1/gids/0"), as the
// kernel's sysfs shows it without the trailing newline; false for a file
// droce does not provide. The one source of the values: the tree is written
// from it and ibv_read_sysfs_file reads the tree.
bool sysfs_attr(int index, std::string_view file, std::string* value);

// The root of the tree (what ibv_get_sysfs_path returns), materialised on
// the first call; the real sysfs root if it could not be made.
const char* sysfs_root();

// If `path` names a droce file of the real sysfs (/sys/class/infiniband/
// droce<N>..., /sys/class/infiniband_verbs/uverbs-droce<N>..., or those two
// class directories), writes the same path inside the tree to out (size
// bytes) and returns true. Materialises the tree.
bool sysfs_map(const char* path, char* out, size_t size);

}  // namespace droce::provider
