#!/usr/bin/env bash
# droce against Linux rxe in daemon mode: droced owns the af_packet link (as
# an operator runs it) and the programs attach to it with `droce exec
# --daemon`. RC and UD pingpongs with every buffer checked, ib_write_bw and
# rping (rdma_cm through droced's connection manager), both directions;
# then droced stops cleanly with no client, object or mapping left.
#
# usage: daemon.sh LAUNCHER LOGDIR DROCED
set -u
# shellcheck source=tests/interop/lib.sh
. "$(dirname "$0")/lib.sh"
droced=$(readlink -f "${3:-}")
interop_setup "$1" "$2"
[ -x "$droced" ] || skip_all "droced not built"

droce_daemon="$logroot/droced.sock"
ip netns exec "$ns" setsid "$droced" --config /dev/null --socket "$droce_daemon" --link "$(droce_link)" \
  --ip "$droce_ip/24" --ip6 "$droce_ip6/64" --mac "$droce_mac" --mtu 4096 --log-level info \
  </dev/null >"$logroot/droced.log" 2>&1 &
droced_pid=$!
group_pids+=("$droced_pid")
for _ in $(seq 100); do [ -S "$droce_daemon" ] && break; sleep 0.1; done
[ -S "$droce_daemon" ] || { cat "$logroot/droced.log"; echo "FAIL: droced did not start"; exit 1; }

# verbs SERVER_SIDE PROGRAM ARGS...: a pingpong or perftest pair whose
# server runs on SERVER_SIDE (droce or linux); IPv4 GIDs.
verbs() {
  local side=$1 prog=$2
  shift 2
  command -v "$prog" >/dev/null || { echo "$prog not found"; return 77; }
  local port=$(( 18000 + RANDOM % 2000 )) s g=-g
  case $prog in ib_*) g=-x ;; esac
  serve_on "$side" "$prog" "$g" "$([ "$side" = droce ] && echo "$droce_gid4" || echo "$peer_gid4")" -p "$port" "$@"
  s=$last_pid
  if [ "$side" = droce ]; then
    wait_host_listen "$port" "$s" || { echo "the droce server did not listen"; return 1; }
    guest -t 60 "$prog" "$g" "$peer_gid4" -p "$port" "$@" "$host_ip" >"$cdir/client.log" 2>&1 ||
      { echo "the Linux client failed"; return 1; }
  else
    wait_guest_listen "$port" "$s" || { echo "the Linux server did not listen"; return 1; }
    droce_fg client 60 -- "$prog" "$g" "$droce_gid4" -p "$port" "$@" "$peer_ip" ||
      { echo "the droce client failed"; return 1; }
  fi
  finish "$s" 20 || { echo "the server failed"; return 1; }
  grep -hE "bytes in|^ +65536 " "$cdir/client.log" | tail -n 1
}

# rping_pair SERVER_SIDE: rping -V through rdma_cm (droced's CM on droce's side).
rping_pair() {
  local side=$1 port=$(( 7000 + RANDOM % 1000 )) s addr=$droce_ip
  [ "$side" = linux ] && addr=$peer_ip
  serve_on "$side" rping -s -V -a "$addr" -p "$port" -C 50
  s=$last_pid
  if [ "$side" = droce ]; then
    sleep 2
    guest -t 60 rping -c -V -a "$addr" -p "$port" -C 50 >"$cdir/client.log" 2>&1 ||
      { echo "the Linux client failed"; return 1; }
  else
    wait_guest_cm_listen "$port" "$s" || { echo "the Linux server did not listen"; return 1; }
    droce_fg client 60 -- rping -c -V -a "$addr" -p "$port" -C 50 || { echo "the droce client failed"; return 1; }
  fi
  finish "$s" 20 || { echo "the server failed"; return 1; }
  echo "50 pings verified"
}

for side in droce linux; do
  case_run "rc_check.$side" verbs "$side" ibv_rc_pingpong -n 500 -s 4096 -c
  case_run "ud.$side" verbs "$side" ibv_ud_pingpong -n 500 -s 1024 -c
  case_run "write_bw.$side" verbs "$side" ib_write_bw -F -s 65536 -n 2000
  case_run "rping.$side" rping_pair "$side"
done

# droced_stops: SIGTERM, and droced says it stopped with nothing left.
droced_stops() {
  # (Not finish: the case runs in a subshell, and droced is not its child.)
  kill -TERM "$droced_pid"
  local i
  for i in $(seq 200); do kill -0 "$droced_pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$droced_pid" 2>/dev/null && { echo "droced still runs 20 s after SIGTERM"; return 1; }
  grep -q 'stopped (clients 0 live.*objects 0, memory maps 0;' "$logroot/droced.log" ||
    { tail -n 5 "$logroot/droced.log"; echo "droced left something behind"; return 1; }
  grep -o 'stopped (clients 0 live[^)]*)' "$logroot/droced.log" | tail -n 1
}
case_run droced_stops droced_stops

interop_finish
