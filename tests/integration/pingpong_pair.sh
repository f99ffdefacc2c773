#!/usr/bin/env bash
# Runs a server/client pair of an ibverbs example program (ibv_rc_pingpong,
# ibv_ud_pingpong, ...) through the droce launcher over a memif link, the same
# way `droce demo` does, and checks that both sides complete.
#
# usage: pingpong_pair.sh LAUNCHER PROGRAM [PROGRAM ARGS...]
#   The server runs `PROGRAM -p PORT ARGS...`, the client the same plus
#   127.0.0.1. Passes if both exit 0 and both print a line matching
#   `bytes in .* seconds`. Exit 77 (skip) if PROGRAM is not installed.
#   DROCE_TEST_EXPECT (client) and DROCE_TEST_EXPECT_SERVER (server; empty =
#   no check) override the expected line, e.g. for perftest's result table.
#   DROCE_TEST_SERVER_ENV / DROCE_TEST_CLIENT_ENV: space-separated VAR=VALUE
#   settings for that side only (e.g. DROCE_PROGRESS=thread on one side).
#   DROCE_TEST_LOG_DIR: if set, the server's output and the last client's are
#   copied there as server.log and client.log (for checks made by a caller,
#   e.g. on DROCE_STATS counters).
#   DROCE_TEST_DAEMON=one|two (with DROCE_TEST_DROCED, the droced binary):
#   the programs attach to droced instead of running engines: `one` daemon
#   serving both (one RoCE endpoint, two processes, like two processes on
#   one RNIC), or `two` daemons linked over memif, one per side. Each daemon
#   must stop cleanly on SIGTERM with no object or memory map left.
# shellcheck disable=SC2317  # start_client runs from run_client
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 2 - "LAUNCHER PROGRAM [PROGRAM ARGS...]"
launcher=$1
program=$2
shift 2
prog_args=("$@")

t_launcher "$launcher"
require_program "$program" ibverbs-utils

# Links and addresses come from the flags below; a stray MAC or MTU from the
# caller's environment must not make the two peers identical.
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU

readonly per_process_timeout=${DROCE_TEST_TIMEOUT:-60}  # seconds, for each of server and client
readonly listen_wait=10           # seconds to wait for the server's TCP listen
readonly max_client_attempts=20   # client retries while the server is not listening

t_setup it
server_pid=""

# port_state PORT: prints the hex TCP states of local sockets bound to PORT.
port_state() {
  local hex
  hex=$(printf ':%04X' "$1")
  awk -v p="$hex" 'FNR > 1 && substr($2, length($2) - 4) == p { print $4 }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# A free TCP port from a random range, without python: check /proc/net/tcp*.
pick_port() {
  port=""
  for _ in $(seq 1 100); do
    candidate=$(( 20000 + (RANDOM * 32768 + RANDOM) % 30000 ))
    if [ -z "$(port_state "$candidate")" ]; then
      port=$candidate
      break
    fi
  done
  [ -n "$port" ] || fail "could not find a free TCP port"
}
pick_port

read -ra server_env <<<"${DROCE_TEST_SERVER_ENV:-}"
read -ra client_env <<<"${DROCE_TEST_CLIENT_ENV:-}"

sock="$dir/memif.sock"
link_of() { echo "net_memif0,role=$1,socket=$sock,socket-abstract=no"; }

# Daemon mode: the daemons own the links; the programs name a socket.
daemon_mode=${DROCE_TEST_DAEMON:-}
server_flags=(--link "$(link_of server)" --ip 10.77.1.1/24)
client_flags=(--link "$(link_of client)" --ip 10.77.1.2/24)
case $daemon_mode in
  '') ;;
  one)
    start_droced d0 --ip 10.77.1.1/24
    server_flags=(--daemon "$dir/d0.sock"); client_flags=(--daemon "$dir/d0.sock") ;;
  two)
    start_droced d0 --link "$(link_of server)" --ip 10.77.1.1/24
    start_droced d1 --link "$(link_of client)" --ip 10.77.1.2/24
    server_flags=(--daemon "$dir/d0.sock"); client_flags=(--daemon "$dir/d1.sock") ;;
  *) fail "DROCE_TEST_DAEMON=$daemon_mode: one or two" ;;
esac

show_logs() {
  echo "----- server output ($program, port $port) -----"
  cat "$dir/server.log" 2>/dev/null
  local f
  for f in "$dir"/client.*.log; do
    [ -e "$f" ] || continue
    local n=${f##*/client.}
    echo "----- client output (attempt ${n%.log}) -----"
    cat "$f"
  done
  echo "-----"
}

start_client() {  # LOG (run_client's START_FN: sets last_pid)
  t_bg "$1" "$per_process_timeout" env "${client_env[@]}" "$launcher" exec "${client_flags[@]}" \
    -- "$program" -p "$port" "${prog_args[@]}" 127.0.0.1
}
run_pair() {
  t_bg "$dir/server.log" "$per_process_timeout" env "${server_env[@]}" "$launcher" exec "${server_flags[@]}" \
    -- "$program" -p "$port" "${prog_args[@]}"
  server_pid=$last_pid
  # rc_pingpong's client does not retry its TCP connect: start it once the
  # server listens (and at least 0.5 s after the server), and retry it if it
  # still came too early.
  sleep 0.5
  listen_deadline=$(( SECONDS + listen_wait ))
  while [ "$SECONDS" -lt "$listen_deadline" ]; do
    if port_state "$port" | grep -qx 0A; then break; fi
    kill -0 "$server_pid" 2>/dev/null || break
    sleep 0.1
  done
  rm -f -- "$dir"/client.*.log
  run_client "$server_pid" "$max_client_attempts" "$dir" start_client
  end_server "$server_pid"
  server_pid=""
}
run_pair
# perftest measures the CPU's clock itself before it reports, and gives up
# when its samples do not fit a line ("Correlation coefficient r^2: ... <
# 0.9", "Can't produce a report"): a busy machine, not droce. Once, the pair
# runs again (the transfer itself had succeeded).
if grep -qs "Can't produce a report" "$dir/server.log" "$dir"/client.*.log; then
  echo "note: perftest could not calibrate its clock on this busy machine; running the pair once more"
  grep -hs "Correlation coefficient" "$dir/server.log" "$dir"/client.*.log | sed 's/^/note: /'
  pick_port
  [ "${#daemon_pids[@]}" -eq 0 ] && rm -f -- "$sock"  # the last server's memif socket (daemons keep theirs)
  run_pair
fi

if [ -n "${DROCE_TEST_LOG_DIR:-}" ]; then
  cp -- "$dir/server.log" "$DROCE_TEST_LOG_DIR/server.log"
  if [ "$attempt" -gt 0 ]; then cp -- "$dir/client.$attempt.log" "$DROCE_TEST_LOG_DIR/client.log"; fi
fi

fail=0
describe() {
  case $1 in
    0) echo "exit 0" ;;
    124) echo "timed out after ${per_process_timeout}s (exit 124)" ;;
    *) echo "exit $1" ;;
  esac
}
if [ "$server_rc" -ne 0 ]; then echo "FAIL: server: $(describe "$server_rc")"; fail=1; fi
if [ "$attempt" -eq 0 ]; then echo "FAIL: client: never started"; fail=1
elif [ "$client_rc" -ne 0 ]; then echo "FAIL: client: $(describe "$client_rc")"; fail=1; fi
expect_client=${DROCE_TEST_EXPECT:-'bytes in .* seconds'}
expect_server=${DROCE_TEST_EXPECT_SERVER-$expect_client}
if [ -n "$expect_server" ] && ! grep -Eq "$expect_server" "$dir/server.log"; then
  echo "FAIL: server output has no line matching '$expect_server'"; fail=1
fi
if [ "$attempt" -eq 0 ] || ! grep -Eq "$expect_client" "$dir/client.$attempt.log"; then
  echo "FAIL: client output has no line matching '$expect_client'"; fail=1
fi
stop_daemons

if [ "$fail" -ne 0 ]; then
  show_logs
  exit 1
fi
echo "PASS: $program ${prog_args[*]} (server and client over memif${daemon_mode:+, daemon mode $daemon_mode}, TCP port $port, client attempts: $attempt)"
grep -E "bytes in .* seconds|iters in .* seconds|$expect_client" "$dir/server.log" | sed 's/^/[server] /'
grep -E "bytes in .* seconds|iters in .* seconds|$expect_client" "$dir/client.$attempt.log" | sed 's/^/[client] /'
exit 0
