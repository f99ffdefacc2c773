#!/usr/bin/env bash
# Configures (once) and builds droce in build/.
#
# usage: scripts/build.sh [MESON SETUP ARGS...]
#   First run: `meson setup build ARGS...`. Later runs with no ARGS only build;
#   with ARGS the build directory is reconfigured with them.
#   DROCE_JOBS sets ninja's parallelism (default 2).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

builddir=build
jobs=${DROCE_JOBS:-2}

if [ ! -f "$builddir/meson-private/coredata.dat" ]; then
  meson setup "$builddir" "$@"
elif [ $# -gt 0 ]; then
  meson setup --reconfigure "$builddir" "$@"
fi
ninja -C "$builddir" -j "$jobs"
