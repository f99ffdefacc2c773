#!/usr/bin/env bash
# ucx_perftest between two processes over a memif link: UCT tests
# on rc_verbs and ud_verbs and UCP tests, with UCX_TLS=rc_verbs,ud_verbs,self
# and UCX's defaults otherwise. Each test must pass on both sides and exit
# cleanly within the bound; prints each test's "Final:" line.
#
# usage: ucx_perftest.sh DROCE_RANK [ITERATIONS]
# shellcheck disable=SC2317  # kill_server runs from the exit trap
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 1 2 "DROCE_RANK [ITERATIONS]"
rank_tool=$1
iters=${2:-2000}
t_launcher "$rank_tool"
require_program ucx_perftest ucx-utils
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU
export UCX_TLS=rc_verbs,ud_verbs,self

t_setup ucx
# The server runs under `timeout -s KILL` (not t_bg's plain timeout): its
# group is killed at exit here.
server=""
kill_server() { kill_group "$server"; }
on_exit kill_server

fail=0
# one NAME ARGS...: a server/client pair of ucx_perftest ARGS.
one() {
  local name=$1 port=$(( 21000 + RANDOM % 20000 )) rc_s rc_c
  shift
  rm -f "$dir/m.sock"
  DROCE_RANK=0 timeout -s KILL 60 "$rank_tool" --memif "$dir/m.sock" -- \
    ucx_perftest -p "$port" -n "$iters" "$@" >"$dir/s.log" 2>&1 &
  server=$!
  # The client retries while the server's TCP port is not listening yet.
  for _ in $(seq 1 40); do
    DROCE_RANK=1 timeout -s KILL 60 "$rank_tool" --memif "$dir/m.sock" -- \
      ucx_perftest -p "$port" -n "$iters" "$@" 127.0.0.1 >"$dir/c.log" 2>&1
    rc_c=$?
    grep -q "connect() failed\|Connection refused" "$dir/c.log" && kill -0 "$server" 2>/dev/null && { sleep 0.25; continue; }
    break
  done
  wait "$server"; rc_s=$?
  server=""
  if [ "$rc_s" -eq 0 ] && [ "$rc_c" -eq 0 ] && grep -q "^Final:" "$dir/c.log"; then
    printf 'ok: %-28s %s\n' "$name" "$(grep '^Final:' "$dir/c.log" | tr -s ' ')"
  else
    echo "FAIL: $name (server rc=$rc_s, client rc=$rc_c)"
    echo "--- server ---"; tail -15 "$dir/s.log"; echo "--- client ---"; tail -15 "$dir/c.log"
    fail=1
  fi
}

# UCT. rc_verbs has no 'get short' nor a 64-bit swap (IB verbs atomics are
# fetch-add and compare-swap): those combinations are refused by UCX itself,
# on any RNIC.
for t in am_lat am_bw put_lat put_bw add_lat add_mr fadd cswap; do one "uct rc_verbs $t" -t "$t" -d droce0:1 -x rc_verbs; done
one "uct rc_verbs get bcopy" -t get -D bcopy -d droce0:1 -x rc_verbs
one "uct rc_verbs get zcopy 64K" -t get -D zcopy -s 65536 -d droce0:1 -x rc_verbs
one "uct rc_verbs put_bw zcopy 64K" -t put_bw -D zcopy -s 65536 -d droce0:1 -x rc_verbs
for t in am_lat am_bw; do one "uct ud_verbs $t" -t "$t" -d droce0:1 -x ud_verbs; done
# UCP.
for t in tag_lat tag_bw tag_sync_lat stream_lat stream_bw ucp_put_lat ucp_put_bw ucp_get ucp_add ucp_fadd ucp_swap ucp_cswap ucp_am_lat ucp_am_bw; do
  one "ucp $t" -t "$t"
done
one "ucp tag_bw 1M" -t tag_bw -s 1048576
exit "$fail"
