#!/usr/bin/env bash
# Several workers per device: two droce processes over memif, both with
# DROCE_WORKERS=2 (DROCE_TEST_WORKERS overrides), run unmodified perftest
# (ib_send_bw -q 4, ib_write_bw -q 4, ib_read_bw -q 2) and ibv_rc_pingpong
# through pingpong_pair.sh. Every run must succeed, and packets must really
# have been handed between workers: the device counter handoff_pkts
# (DROCE_STATS=1, printed on stderr when the device is closed) must be
# non-zero on at least one side of every skewed run.
#
# usage: workers_pair.sh LAUNCHER EXTRA_QP_LIB RC_PINGPONG IB_SEND_BW IB_WRITE_BW IB_READ_BW
#   EXTRA_QP_LIB: extra_qp_preload.so (see extra_qp_preload.c). Exit 77 (skip)
#   if one of the programs is not installed.
#
# Why skewed runs: QPs go to workers round-robin at creation and memif
# delivers the peer's tx queue i on our rx queue i, so two copies of one
# program (same QP creation order, QP k paired with QP k) keep each pair on
# the same worker index on both sides: nothing to hand off. In a skewed run
# the client creates one extra QP first (EXTRA_QP_LIB preloaded), which puts
# every pair across workers. The plain runs exercise the 2-worker datapath
# without hand-off, and check that: handoff_pkts must stay 0 on both sides
# there (a QP that sent on another worker's queue would show up).
#
# Progress modes: in every run one side uses DROCE_PROGRESS=app and the other
# DROCE_PROGRESS=thread, alternating which.
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 6 6 "LAUNCHER EXTRA_QP_LIB RC_PINGPONG IB_SEND_BW IB_WRITE_BW IB_READ_BW"
launcher=$1 extra_qp_lib=$2 rc_pingpong=$3 send_bw=$4 write_bw=$5 read_bw=$6

t_launcher "$launcher"
require_program "$rc_pingpong" ibverbs-utils
for p in "$send_bw" "$write_bw" "$read_bw"; do require_program "$p" perftest; done
# It goes into LD_PRELOAD (absolute, no ':' or spaces) of the client only.
[ -f "$extra_qp_lib" ] || fail "'$extra_qp_lib' does not exist"
extra_qp_lib=$(realpath -- "$extra_qp_lib")
case $extra_qp_lib in
  *[[:space:]:]*) fail "'$extra_qp_lib' contains ':' or whitespace" ;;
esac

pair="$(dirname "$0")/pingpong_pair.sh"
t_setup workers

export DROCE_WORKERS=${DROCE_TEST_WORKERS:-2} DROCE_STATS=1
unset DROCE_PROGRESS DROCE_WORKER_CPU
# What the caller preloads (scripts/sanitize.sh: the ASan runtime, without
# which an instrumented libdroce.so crashes) stays, on both sides.
inherited_preload=${LD_PRELOAD:-}
# A row of perftest's result table (message size, iterations, figures).
perftest_row='^ *[0-9]+ +[0-9]+ +[0-9]+\.[0-9]+'

# counter LOG NAME: the device counter NAME as DROCE_STATS printed it in LOG
# (0 if absent: only non-zero counters are printed). The line may follow the
# program's own unterminated output, hence no '^'. handoff_* are device
# counters only, so no QP block adds to them.
counter() {
  grep -Eo "droce: +$2 +[0-9]+" "$1" 2>/dev/null | awk '{ n += $3 } END { print n + 0 }'
}

passed=0 failed=0 n=0
# run NAME skew|plain PROGRAM ARGS...
run() {
  local name=$1 kind=$2
  shift 2
  local logs="$dir/$name" server_progress=app client_progress=thread
  mkdir -p "$logs"
  n=$((n + 1))
  if [ $((n % 2)) -eq 0 ]; then server_progress=thread client_progress=app; fi
  local client_env="DROCE_PROGRESS=$client_progress"
  if [ "$kind" = skew ]; then client_env+=" LD_PRELOAD=$extra_qp_lib${inherited_preload:+:$inherited_preload}"; fi
  local expect=()
  case ${1##*/} in
    ib_*) expect=(DROCE_TEST_EXPECT="$perftest_row" DROCE_TEST_EXPECT_SERVER=) ;;
  esac
  env "${expect[@]}" DROCE_TEST_LOG_DIR="$logs" DROCE_TEST_SERVER_ENV="DROCE_PROGRESS=$server_progress" \
    DROCE_TEST_CLIENT_ENV="$client_env" bash "$pair" "$launcher" "$@" >"$logs/pair.out" 2>&1
  local rc=$? s c
  s=$(counter "$logs/server.log" handoff_pkts)
  c=$(counter "$logs/client.log" handoff_pkts)
  local what="$name ($kind; server $server_progress, client $client_progress; handoff_pkts server $s, client $c;"
  what+=" handoff_drop server $(counter "$logs/server.log" handoff_drop), client $(counter "$logs/client.log" handoff_drop))"
  if [ "$rc" -ne 0 ]; then
    failed=$((failed + 1))
    echo "FAIL: $what: pingpong_pair.sh exit $rc"
    sed 's/^/    /' "$logs/pair.out"
  elif [ "$kind" = skew ] && ! grep -q '^extra_qp_preload: 1 QP(s) created' "$logs/client.log"; then
    failed=$((failed + 1))
    echo "FAIL: $what: the client did not create its extra QP (is $extra_qp_lib loaded?)"
    sed 's/^/    /' "$logs/client.log"
  elif [ "$kind" = skew ] && [ "$s" -eq 0 ] && [ "$c" -eq 0 ]; then
    failed=$((failed + 1))
    echo "FAIL: $what: no packet was handed to another worker on either side"
    grep -h 'droce:' "$logs/server.log" "$logs/client.log" | sed 's/^/    /'
  elif [ "$kind" = plain ] && { [ "$s" -ne 0 ] || [ "$c" -ne 0 ]; }; then
    failed=$((failed + 1))
    echo "FAIL: $what: packets were handed off although each QP pair shares a worker index"
    grep -h 'droce:' "$logs/server.log" "$logs/client.log" | sed 's/^/    /'
  else
    passed=$((passed + 1))
    echo "ok: $what"
  fi
}

run send_bw_q4 skew "$send_bw" -x 0 -q 4 -n 200
run write_bw_q4 skew "$write_bw" -x 0 -q 4 -n 200
run read_bw_q2 skew "$read_bw" -x 0 -q 2 -n 200
run rc_pingpong skew "$rc_pingpong" -g 0 -n 200 -s 4096
run send_bw_q4_plain plain "$send_bw" -x 0 -q 4 -n 200
run rc_pingpong_plain plain "$rc_pingpong" -g 0 -n 200 -s 4096

echo "$passed passed, $failed failed (DROCE_WORKERS=$DROCE_WORKERS)"
[ "$failed" -eq 0 ]
