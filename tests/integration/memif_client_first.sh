#!/usr/bin/env bash
# A memif client started before its server (two programs that open
# their devices at the same moment, as ucx_perftest and MPI ranks do):
#   1. with no server, the client's device opens (after a bounded wait) and
#      its port reports PORT_DOWN, not ACTIVE;
#   2. a memif client started first, its server 1 s later and then at the
#      same moment, still connect, and ibv_rc_pingpong passes both ways;
#   3. a client whose server goes away sees PORT_ERR, and PORT_ACTIVE when a
#      new server comes on the same socket (tests/integration/port_events.cc).
# Before, the client's device failed to start ("start: Operation not
# permitted") and the program could not open it.
#
# usage: memif_client_first.sh LAUNCHER PORT_EVENTS_PROGRAM
# shellcheck disable=SC2317  # cleanup runs from traps
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 2 2 "LAUNCHER PORT_EVENTS_PROGRAM"
launcher=$1
port_events=$2
t_launcher "$launcher"
require_program ibv_rc_pingpong ibverbs-utils
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU

t_setup mcf
# The background programs run under `timeout -s KILL` (a hung memif
# program must not keep `wait` waiting), which t_bg does not do: their
# groups are killed here at exit, those still there (as lib.sh's own).
pids=()
kill_pids() {
  local p
  for p in "${pids[@]}"; do
    if kill -0 -- "-$p" 2>/dev/null || [ "$(t_ppid "$p")" = "$$" ]; then
      kill -KILL -- "-$p" 2>/dev/null || kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null
    fi
  done
  return 0
}
on_exit kill_pids

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

# 2. Client first. The memif client runs the pingpong TCP client, started
# first; the memif server (the pingpong TCP server) `delay` seconds later.
# The TCP client retries while the server is not listening yet; each retry
# is a new memif client process, which the same memif server accepts (the
# memif server is never restarted: one that exits leaves its socket file).
round() {
  local delay=$1 port=$(( 21000 + RANDOM % 20000 )) rc_a rc_b try
  rm -f "$sock"
  (sleep "$delay"; exec timeout -s KILL 40 "$launcher" exec --link "$(link_of server)" --ip 10.79.0.1/24 -- \
    ibv_rc_pingpong -g 0 -n 500 -p "$port") >"$dir/b.log" 2>&1 &
  local b=$!
  pids+=("$b")
  for try in $(seq 1 30); do
    timeout -s KILL 30 "$launcher" exec --link "$(link_of client)" --ip 10.79.0.2/24 -- \
      ibv_rc_pingpong -g 0 -n 500 -p "$port" 127.0.0.1 >"$dir/a.log" 2>&1
    rc_a=$?
    if [ "$rc_a" -ne 0 ] && grep -q "Couldn't connect" "$dir/a.log" && kill -0 "$b" 2>/dev/null; then
      sleep 0.3
      continue
    fi
    break
  done
  wait "$b"; rc_b=$?
  if [ "$rc_a" -eq 0 ] && [ "$rc_b" -eq 0 ] && grep -q "iters in" "$dir/a.log" && grep -q "iters in" "$dir/b.log"; then
    echo "ok: server ${delay}s after the client: both sides passed (client processes: $try)"
  else
    echo "FAIL: server ${delay}s after the client: memif client rc=$rc_a, memif server rc=$rc_b"
    echo "--- memif client side ---"; cat "$dir/a.log"; echo "--- memif server side ---"; cat "$dir/b.log"
    fail=1
  fi
}
round 1
round 0
round 0

# 3. The server goes away and another comes. A memif server is any program
# holding its device open: ibv_rc_pingpong waiting for its TCP client.
memif_server() {
  rm -f "$sock"
  timeout -s KILL 40 "$launcher" exec --link "$(link_of server)" --ip 10.79.0.1/24 -- \
    ibv_rc_pingpong -g 0 -p $(( 21000 + RANDOM % 20000 )) >>"$dir/holder.log" 2>&1 &
  holder=$!
  pids+=("$holder")
  for _ in $(seq 1 100); do [ -S "$sock" ] && break; sleep 0.05; done
}
# stage NAME: waits up to 20 s for port_events to print NAME.
stage() {
  for _ in $(seq 1 200); do grep -qx "$1" "$dir/events.log" && return 0; sleep 0.1; done
  return 1
}
memif_server
timeout -s KILL 60 "$launcher" exec --link "$(link_of client)" --ip 10.79.0.2/24 -- "$port_events" \
  >"$dir/events.log" 2>&1 &
pids+=("$!")
if stage ready; then
  kill -KILL -- "-$holder" 2>/dev/null || kill -KILL "$holder"
  if stage down; then
    memif_server
    if stage up; then
      echo "ok: server gone: PORT_ERR; a new server on the socket: PORT_ACTIVE (the client reconnected)"
    else
      echo "FAIL: no PORT_ACTIVE after a new server came"; fail=1
    fi
  else
    echo "FAIL: no PORT_ERR after the server went away"; fail=1
  fi
else
  echo "FAIL: port_events did not start with an ACTIVE port"; fail=1
fi
[ "$fail" -eq 0 ] || { echo "--- port_events ---"; cat "$dir/events.log"; }
exit "$fail"
