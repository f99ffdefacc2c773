#!/usr/bin/env bash
# droce against Linux rxe: the ibverbs-utils pingpongs, both directions (a
# droce server with a Linux client, and the reverse), IPv4 and IPv6 GIDs,
# with -c (every received buffer checked) where the program has it.
#
# usage: verbs.sh LAUNCHER LOGDIR
set -u
# shellcheck source=tests/interop/lib.sh
. "$(dirname "$0")/lib.sh"
interop_setup "$@"

# pingpong SERVER_SIDE PROGRAM IPV ARGS...: SERVER_SIDE droce or linux; the
# client runs on the other side.
pingpong() {
  local side=$1 prog=$2 ipv=$3
  shift 3
  command -v "$prog" >/dev/null || { echo "$prog not found (ibverbs-utils)"; return 77; }
  local dg=$droce_gid4 pg=$peer_gid4
  [ "$ipv" = 6 ] && { dg=$droce_gid6; pg=$peer_gid6; }
  local port=$(( 18000 + RANDOM % 2000 )) s
  if [ "$side" = droce ]; then
    droce_bg server 90 -- "$prog" -g "$dg" -p "$port" "$@"
    s=$last_pid
    wait_host_listen "$port" "$s" || { echo "the droce server did not listen"; return 1; }
    guest -t 60 "$prog" -g "$pg" -p "$port" "$@" "$host_ip" >"$cdir/client.log" 2>&1 ||
      { echo "the Linux client failed"; return 1; }
  else
    guest_bg server 90 "$prog" -g "$pg" -p "$port" "$@"
    s=$last_pid
    wait_guest_listen "$port" "$s" || { echo "the Linux server did not listen"; return 1; }
    droce_fg client 60 -- "$prog" -g "$dg" -p "$port" "$@" "$peer_ip" ||
      { echo "the droce client failed"; return 1; }
  fi
  finish "$s" 20 || { echo "the server failed"; return 1; }
  grep -h "bytes in" "$cdir/client.log" | tail -n 1
}

for side in droce linux; do
  case_run "rc_check.$side" pingpong "$side" ibv_rc_pingpong 4 -n 500 -s 4096 -c
  case_run "rc_events.$side" pingpong "$side" ibv_rc_pingpong 4 -n 500 -s 1024 -e -c
  case_run "rc_mtu4096.$side" pingpong "$side" ibv_rc_pingpong 4 -n 200 -s 65536 -m 4096 -c
  case_run "rc_ipv6.$side" pingpong "$side" ibv_rc_pingpong 6 -n 500 -s 4096 -c
  case_run "uc.$side" pingpong "$side" ibv_uc_pingpong 4 -n 500 -s 4096 -c
  case_run "ud.$side" pingpong "$side" ibv_ud_pingpong 4 -n 500 -s 1024 -c
  case_run "ud_ipv6.$side" pingpong "$side" ibv_ud_pingpong 6 -n 500 -s 1024 -c
  case_run "srq.$side" pingpong "$side" ibv_srq_pingpong 4 -n 500 -s 4096 -q 8 -c
done

interop_finish
