#!/usr/bin/env bash
# Builds droce with sanitizers, each in its own build directory, and runs
# tests there.
#
# usage: scripts/sanitize.sh [asan|tsan|all] [BUILD_PARENT]
#   asan  -Db_sanitize=address,undefined; runs the default suite
#         (`meson test --no-suite slow`): unit, provider, integration, fuzz.
#   tsan  -Db_sanitize=thread; builds and runs only the DPDK-free unit tests
#         whose threads share memory: cq (CqStress.*), ring, doorbell.
#   all   both (the default).
#   BUILD_PARENT  where the build directories go (default: build-sanitize/
#         in the source tree); they are reused, so a second run only rebuilds
#         what changed.
#   DROCE_JOBS sets ninja's parallelism (default 2).
#
# Registered as the test `sanitize` in the slow suite:
#   meson test -C build --suite slow sanitize
set -euo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
which=${1:-all}
parent=${2:-$src/build-sanitize}
jobs=${DROCE_JOBS:-2}

configure() {  # DIR MESON-OPTIONS...
  local dir=$1
  shift
  if [ ! -f "$dir/meson-private/coredata.dat" ]; then
    meson setup "$dir" "$src" -Dbench=false "$@"
  fi
}

run_asan() {
  local dir=$parent/asan
  configure "$dir" -Db_sanitize=address,undefined -Db_lundef=false
  ninja -C "$dir" -j "$jobs"
  # The provider is preloaded into uninstrumented programs (ibv_rc_pingpong,
  # perftest) by the launcher, which puts libdroce.so first in LD_PRELOAD;
  # the ASan runtime must come before libc in symbol lookup, so it is
  # preloaded too (after libdroce.so: hence verify_asan_link_order=0).
  # Leaks are not checked in those programs (theirs are not ours). The fuzz
  # suite is built by clang with its own ASan runtime (tests/fuzz/run.sh),
  # which gcc's must not be preloaded into: it runs apart.
  local libasan
  libasan=$(g++ -print-file-name=libasan.so)
  export ASAN_OPTIONS=verify_asan_link_order=0:detect_leaks=0:abort_on_error=1:halt_on_error=1
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
  LD_PRELOAD="$libasan" \
    meson test -C "$dir" --no-rebuild --print-errorlogs --no-suite slow --no-suite fuzz \
      --timeout-multiplier 4
  meson test -C "$dir" --no-rebuild --print-errorlogs --suite fuzz --timeout-multiplier 4
}

run_tsan() {
  local dir=$parent/tsan
  configure "$dir" -Db_sanitize=thread -Db_lundef=false
  ninja -C "$dir" -j "$jobs" tests/unit/cq_test tests/unit/ring_test tests/unit/doorbell_test tests/unit/shared_queues_test
  TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
    meson test -C "$dir" --no-rebuild --print-errorlogs --timeout-multiplier 4 cq ring doorbell shared_queues
}

case "$which" in
  asan) run_asan ;;
  tsan) run_tsan ;;
  all) run_tsan && run_asan ;;
  *) echo "usage: $0 [asan|tsan|all] [BUILD_PARENT]" >&2; exit 2 ;;
esac
