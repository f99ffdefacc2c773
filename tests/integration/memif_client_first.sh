#!/usr/bin/env bash
# A memif client started before its server (issue 20: two programs that open
# their devices at the same moment, as ucx_perftest and MPI ranks do):
#   1. with no server, the client's device opens (after a bounded wait) and
#      its port reports PORT_DOWN, not ACTIVE;
#   2. a memif client started first, its server 1 s later and then at the
#      same moment, still connect, and ibv_rc_pingpong passes both ways.
# Before, the client's device failed to start ("start: Operation not
# permitted") and the program could not open it.
#
# usage: memif_client_first.sh LAUNCHER
# shellcheck disable=SC2317  # cleanup runs from traps
set -u
launcher=$1
if ! command -v ibv_rc_pingpong >/dev/null 2>&1; then
  echo "SKIP: ibv_rc_pingpong not found (install ibverbs-utils: scripts/setup.sh)"
  exit 77
fi
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU

dir=$(mktemp -d /tmp/droce-mcf.XXXXXX) || exit 1
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf -- "$dir"
}
trap cleanup EXIT
trap 'echo "interrupted" >&2; exit 130' INT TERM HUP

sock="$dir/memif.sock"
link_of() { echo "net_memif0,role=$1,socket=$sock,socket-abstract=no"; }
fail=0

# 1. No server at all.
out=$(timeout 30 "$launcher" exec --link "$(link_of client)" --ip 10.79.0.2/24 -- ibv_devinfo 2>&1)
if grep -q "PORT_DOWN" <<<"$out"; then
  echo "ok: a memif client without a server opens, port PORT_DOWN"
else
  echo "FAIL: memif client without a server:"; echo "$out"; fail=1
fi

# 2. Client first. The pingpong TCP server runs on the memif client's side;
# the pingpong client (memif server) retries its TCP connect, each try with a
# fresh memif socket (a memif server that exited leaves its socket file).
round() {
  local delay=$1 port=$(( 21000 + RANDOM % 20000 )) rc_a rc_b try
  rm -f "$sock"
  timeout -s KILL 40 "$launcher" exec --link "$(link_of client)" --ip 10.79.0.2/24 -- \
    ibv_rc_pingpong -g 0 -n 500 -p "$port" >"$dir/a.log" 2>&1 &
  local a=$!
  pids+=("$a")
  sleep "$delay"
  for try in $(seq 1 30); do
    rm -f "$sock"
    timeout -s KILL 30 "$launcher" exec --link "$(link_of server)" --ip 10.79.0.1/24 -- \
      ibv_rc_pingpong -g 0 -n 500 -p "$port" 127.0.0.1 >"$dir/b.log" 2>&1
    rc_b=$?
    if [ "$rc_b" -ne 0 ] && grep -q "Couldn't connect" "$dir/b.log" && kill -0 "$a" 2>/dev/null; then
      sleep 0.3
      continue
    fi
    break
  done
  wait "$a"; rc_a=$?
  if [ "$rc_a" -eq 0 ] && [ "$rc_b" -eq 0 ] && grep -q "iters in" "$dir/a.log" && grep -q "iters in" "$dir/b.log"; then
    echo "ok: server ${delay}s after the client: both sides passed (TCP tries: $try)"
  else
    echo "FAIL: server ${delay}s after the client: memif client rc=$rc_a, memif server rc=$rc_b"
    echo "--- memif client side ---"; cat "$dir/a.log"; echo "--- memif server side ---"; cat "$dir/b.log"
    fail=1
  fi
}
round 1
round 0
round 0
exit "$fail"
