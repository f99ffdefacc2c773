#!/usr/bin/env bash
# Builds the libFuzzer targets in this directory with clang++ against the
# src/wire sources and runs each for a bounded time, failing on any crash.
#
#   tests/fuzz/run.sh SECONDS [WORKDIR]
#   tests/fuzz/run.sh --long [RUNS] [WORKDIR]
#
# SECONDS is per target (default 10). --long runs each target for RUNS
# executions instead (default 10,000,000; not part of any suite: hours on
# this machine) and prints each one's count and time. Binaries and the grown corpora live in
# WORKDIR (`meson test` passes build/fuzz; default: a temporary directory,
# removed after a clean run); binaries are rebuilt only when a source changed. The
# seed corpora in tests/fuzz/corpus*/ are read, never written. Exit status: 0
# when every target ran without a crash, 1 on a crash or build failure, 77
# (skip) when clang++ is missing. Crash inputs are left in WORKDIR.
set -euo pipefail

runs=""
if [ "${1:-}" = --long ]; then
  shift
  runs=${1:-10000000}
  [ $# -gt 0 ] && shift
  set -- 0 "$@"
fi
secs=${1:-10}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cxx=${FUZZ_CXX:-clang++}

if ! command -v "$cxx" >/dev/null 2>&1; then
  echo "SKIP: $cxx not found (install clang and libclang-rt-14-dev)"
  exit 77
fi

tmp_work=
if [ $# -ge 2 ]; then
  work=$2
else
  work=$(mktemp -d)
  tmp_work=$work
fi
mkdir -p "$work"

wire_srcs=("$root"/src/wire/*.cc)
flags=(-std=c++20 -O1 -g -fno-omit-frame-pointer
       -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all
       -I"$root/src" -DNOMINMAX)

# Does $1 need rebuilding from the sources that follow?
stale() {
  local bin=$1; shift
  [ -x "$bin" ] || return 0
  local f
  for f in "$@" "$root"/src/wire/*.h; do
    [ "$f" -nt "$bin" ] && return 0
  done
  return 1
}

# ctl_fuzz: droced's decoder of client messages (src/ctl/), over abseil.
ctl_srcs=("$root"/src/ctl/protocol.cc)
ctl_libs=(-labsl_status -labsl_strings -labsl_cord -labsl_cord_internal -labsl_cordz_info -labsl_str_format_internal
          -labsl_strings_internal -labsl_throw_delegate -labsl_raw_logging_internal -labsl_int128 -labsl_base
          -labsl_spinlock_wait)
# cm_fuzz: the CM MAD decoder and the connection manager (src/cm/).
cm_srcs=("$root"/src/cm/mad.cc "$root"/src/cm/ib_cm.cc "$root"/src/cm/manager.cc)
cm_libs=(-labsl_hash -labsl_city -labsl_low_level_hash -labsl_raw_hash_set -labsl_base -labsl_raw_logging_internal
         -labsl_spinlock_wait -labsl_throw_delegate)
# responder_fuzz: the transport (src/transport/ and what it stands on) in
# the simulator, fed packets between a connected pair's.
resp_srcs=("$root"/src/transport/*.cc "$root"/src/cq/cq.cc "$root"/src/mem/mr_table.cc "$root"/src/queue/shm.cc
           "$root"/src/cc/dcqcn.cc "$root"/src/common/log.cc "${wire_srcs[@]}")
resp_libs=(-lisal -labsl_strings -labsl_str_format_internal -labsl_strings_internal -labsl_int128
           -labsl_throw_delegate -labsl_raw_logging_internal -labsl_base -labsl_spinlock_wait
           -labsl_hash -labsl_city -labsl_low_level_hash -labsl_raw_hash_set -labsl_synchronization
           -labsl_time -labsl_time_zone -labsl_stacktrace -labsl_symbolize -labsl_debugging_internal
           -labsl_demangle_internal -labsl_malloc_internal -labsl_graphcycles_internal -labsl_statusor -labsl_status -labsl_cord
           -labsl_cord_internal -labsl_cordz_info -labsl_cordz_functions -labsl_cordz_handle -labsl_exponential_biased
           -lpthread)
targets=(parse_fuzz build_fuzz ctl_fuzz cm_fuzz responder_fuzz)
for t in "${targets[@]}"; do
  bin=$work/$t
  case $t in
    ctl_fuzz) srcs=("${ctl_srcs[@]}"); libs=("${ctl_libs[@]}") ;;
    cm_fuzz) srcs=("${cm_srcs[@]}"); libs=("${cm_libs[@]}") ;;
    responder_fuzz) srcs=("${resp_srcs[@]}"); libs=("${resp_libs[@]}") ;;
    *) srcs=("${wire_srcs[@]}"); libs=(-lisal) ;;
  esac
  if stale "$bin" "$here/$t.cc" "${srcs[@]}" "$root"/src/ctl/*.h "$root"/src/cm/*.h "$root"/src/transport/*.h \
       "$root"/src/transport/sim/*.h; then
    echo "fuzz: building $t"
    if ! "$cxx" "${flags[@]}" -o "$bin.tmp" "$here/$t.cc" "${srcs[@]}" "${libs[@]}"; then
      echo "fuzz: FAILED to build $t"
      exit 1
    fi
    mv "$bin.tmp" "$bin"
  fi
done

status=0
for t in "${targets[@]}"; do
  corpus=$work/corpus_$t
  mkdir -p "$corpus"
  log=$work/$t.log
  if [ -n "$runs" ]; then
    echo "fuzz: running $t for $runs executions"
    bound=(-runs="$runs")
  else
    echo "fuzz: running $t for ${secs}s"
    bound=(-max_total_time="$secs")
  fi
  start=$SECONDS
  # New inputs go to $corpus (first directory); the seed corpus is read only.
  if (cd "$work" && "./$t" "${bound[@]}" -timeout=10 -rss_limit_mb=2048 \
        -max_len=10000 -print_final_stats=1 -artifact_prefix="$work/$t-" \
        "$corpus" "$here/$(case $t in ctl_fuzz) echo corpus_ctl ;; cm_fuzz) echo corpus_cm ;; responder_fuzz) echo corpus_resp ;; *) echo corpus ;; esac)") >"$log" 2>&1; then
    execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || true)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 || true)
    echo "fuzz: $t ok: ${execs:-?} executions in $((SECONDS - start)) s, ${cov:-cov: ?}"
  else
    echo "fuzz: $t FAILED; log follows (crash input: $work/$t-*)"
    tail -60 "$log"
    status=1
  fi
done
if [ $status -eq 0 ] && [ -n "$tmp_work" ]; then
  rm -rf "$tmp_work"
fi
exit $status
