#!/usr/bin/env bash
# droce against Linux rxe: perftest's SEND, WRITE, READ and atomic tests,
# bandwidth and latency, both directions, 64 B to 1 MiB, 4 QPs, MTU 1024
# and 4096, IPv4 and IPv6 GIDs; the QP data goes over perftest's own TCP
# connection between the kernels' addresses.
#
# usage: perftest.sh LAUNCHER LOGDIR
set -u
# shellcheck source=tests/interop/lib.sh
. "$(dirname "$0")/lib.sh"
interop_setup "$@"

# perf SERVER_SIDE IPV EXPECT PROGRAM ARGS...: EXPECT is the size column the
# client's result line starts with.
perf() {
  local side=$1 ipv=$2 expect=$3 prog=$4
  shift 4
  command -v "$prog" >/dev/null || { echo "$prog not found (perftest)"; return 77; }
  local dg=$droce_gid4 pg=$peer_gid4
  [ "$ipv" = 6 ] && { dg=$droce_gid6; pg=$peer_gid6; }
  local port=$(( 18000 + RANDOM % 2000 )) s
  if [ "$side" = droce ]; then
    droce_bg server 90 -- "$prog" -F -x "$dg" -p "$port" "$@"
    s=$last_pid
    wait_host_listen "$port" "$s" || { echo "the droce server did not listen"; return 1; }
    guest -t 60 "$prog" -F -x "$pg" -p "$port" "$@" "$host_ip" >"$cdir/client.log" 2>&1 ||
      { echo "the Linux client failed"; return 1; }
  else
    guest_bg server 90 "$prog" -F -x "$pg" -p "$port" "$@"
    s=$last_pid
    wait_guest_listen "$port" "$s" || { echo "the Linux server did not listen"; return 1; }
    droce_fg client 60 -- "$prog" -F -x "$dg" -p "$port" "$@" "$peer_ip" ||
      { echo "the droce client failed"; return 1; }
  fi
  finish "$s" 20 || { echo "the server failed"; return 1; }
  grep -Eq "^ +$expect " "$cdir/client.log" || { echo "no result line for $expect"; return 1; }
  grep -Em1 "^ +$expect " "$cdir/client.log" | sed 's/droce: .*//' | tr -s ' \t' ' '
}

for side in droce linux; do
  case_run "send_bw_64.$side" perf "$side" 4 64 ib_send_bw -s 64 -D 2
  case_run "send_bw_1M_mtu1024.$side" perf "$side" 4 1048576 ib_send_bw -s 1048576 -n 50 -m 1024
  case_run "send_bw_ud.$side" perf "$side" 4 2048 ib_send_bw -c UD -s 2048 -D 2
  case_run "write_bw_64_q4.$side" perf "$side" 4 64 ib_write_bw -s 64 -q 4 -D 2
  case_run "write_bw_1M.$side" perf "$side" 4 1048576 ib_write_bw -s 1048576 -n 50
  case_run "write_bw_64K_ipv6.$side" perf "$side" 6 65536 ib_write_bw -s 65536 -D 2
  case_run "read_bw_64.$side" perf "$side" 4 64 ib_read_bw -s 64 -D 2
  case_run "read_bw_1M.$side" perf "$side" 4 1048576 ib_read_bw -s 1048576 -n 50
  case_run "atomic_bw_fadd.$side" perf "$side" 4 8 ib_atomic_bw -A FETCH_AND_ADD -D 2
  case_run "atomic_bw_cas.$side" perf "$side" 4 8 ib_atomic_bw -A CMP_AND_SWAP -D 2
  case_run "send_lat_2.$side" perf "$side" 4 2 ib_send_lat -s 2 -n 1000
  case_run "write_lat_2_ipv6.$side" perf "$side" 6 2 ib_write_lat -s 2 -n 1000
  case_run "read_lat_64.$side" perf "$side" 4 64 ib_read_lat -s 64 -n 1000
  case_run "atomic_lat.$side" perf "$side" 4 8 ib_atomic_lat -n 1000
done

interop_finish
