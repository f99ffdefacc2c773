#!/usr/bin/env bash
# Two droce processes, each in a network namespace of its own, run an
# unmodified ibverbs example program (ibv_rc_pingpong, ...) against each other
# over a veth pair driven through DPDK's af_packet or af_xdp PMD. The
# programs' out-of-band TCP exchange uses a second veth pair (see
# netns_common.sh for the layout).
#
# usage: netns_pingpong.sh LAUNCHER KIND PROGRAM [PROGRAM ARGS...]
#   KIND: af_packet or af_xdp. The server runs `PROGRAM -p PORT ARGS...` in
#   namespace A, the client the same plus the server's control address in B.
#   Passes if both exit 0 and print a line matching `bytes in .* seconds`.
#   DROCE_TEST_VLAN=ID: both droce ports tag their frames with 802.1Q VLAN ID
#   (DROCE_VLAN) and accept only that VLAN.
#   DROCE_TEST_IP6=1: both ports also get an IPv6 address (DROCE_IP6, GID
#   index 1: pass `-g 1` to use it); on af_packet the RoCE frames A sends
#   are checked on the wire to be IPv6.
#   DROCE_TEST_MTU=N: both ports get DROCE_MTU=N.
#   DROCE_TEST_WORKERS=N: both devices run N workers (DROCE_WORKERS; on
#   af_packet the kernel's fanout hash picks each frame's queue, so packets
#   reach QPs through hand-off or directly); the hand-off counters are
#   reported and no hand-off may be dropped.
#   DROCE_TEST_ACTIVE_MTU=N: the server's port must report active MTU N
#   (see also DROCE_TEST_VETH_MTU and DROCE_TEST_LINK_ARGS, netns_common.sh).
#   Needs root; exit 77 (skip) without it, without PROGRAM or without the PMD.
set -u
# shellcheck source=netns_common.sh
. "$(dirname "$0")/netns_common.sh"  # and lib.sh
t_usage $# 3 - "LAUNCHER KIND PROGRAM [PROGRAM ARGS...]"
launcher=$1
kind=$2
program=$3
shift 3
prog_args=("$@")

netns_check_prereqs "$launcher" "$kind"
require_program "$program" ibverbs-utils
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU DROCE_GATEWAY DROCE_IP6
# DROCE_TEST_MTU: the MTU cap both ports are given (DROCE_MTU).
[ -n "${DROCE_TEST_MTU:-}" ] && export DROCE_MTU=$DROCE_TEST_MTU
workers=${DROCE_TEST_WORKERS:-}
if [ -n "$workers" ]; then export DROCE_WORKERS=$workers DROCE_STATS=1; else unset DROCE_WORKERS; fi
vlan=${DROCE_TEST_VLAN:-}
if [ -n "$vlan" ]; then export DROCE_VLAN=$vlan; else unset DROCE_VLAN; fi
ip6=${DROCE_TEST_IP6:-}
ip6_a=() ip6_b=()
if [ -n "$ip6" ]; then ip6_a=(--ip6 "$droce_ip6_a/64"); ip6_b=(--ip6 "$droce_ip6_b/64"); fi

netns_setup
readonly port=18515  # the namespaces are ours: no other listener there
readonly max_client_attempts=20

# With a VLAN or IPv6 on af_packet, B's kernel sees the frames A sends:
# check on the wire that they carry the tag or are IPv6 (an AF_XDP socket
# hides them from taps). (Not run_bg: tcpdump's stderr must stay out of its
# listing.)
capture_pid=""
# At exit, if it still runs (our child: not a pid given to another since).
# shellcheck disable=SC2317  # run at exit (on_exit)
stop_capture() { [ "$(t_ppid "$capture_pid")" = "$$" ] && kill_group "$capture_pid"; }
if [ -n "$vlan$ip6" ] && [ "$kind" = af_packet ] && command -v tcpdump >/dev/null 2>&1; then
  timeout "$per_process_timeout" ip netns exec "$ns_b" tcpdump -i "$if_b" -nn -e -l \
    "ether src $(ip netns exec "$ns_a" cat "/sys/class/net/$if_a/address") and udp port 4791" \
    >"$dir/tcpdump.txt" 2>/dev/null &
  capture_pid=$!
  on_exit stop_capture
  sleep 1
fi

# DROCE_TEST_DROCED (a droced binary): a daemon in each namespace owns the
# link; the programs attach to it.
side_a=(--link "$(link_for "$kind" "$if_a")" --ip "$droce_ip_a/24" "${ip6_a[@]}")
side_b=(--link "$(link_for "$kind" "$if_b")" --ip "$droce_ip_b/24" "${ip6_b[@]}")
daemon_mode=0
if [ -n "${DROCE_TEST_DROCED:-}" ]; then
  daemon_mode=1
  T_DROCED_TIMEOUT=$per_process_timeout
  T_DROCED_NETNS=$ns_a
  start_droced a "${side_a[@]}" --log-level info
  T_DROCED_NETNS=$ns_b
  start_droced b "${side_b[@]}"
  cp "$dir/a.log" "$dir/daemon_a_start.log"
  side_a=(--daemon "$dir/a.sock")
  side_b=(--daemon "$dir/b.sock")
fi

run_bg "$dir/server.log" "$ns_a" "$launcher" exec "${side_a[@]}" \
  --log-level info -- "$program" -p "$port" "${prog_args[@]}"
server_pid=$last_pid
wait_listen "$ns_a" "$port" "$server_pid" 15

# shellcheck disable=SC2317  # called by run_client
start_client() {
  run_bg "$1" "$ns_b" "$launcher" exec "${side_b[@]}" -- "$program" -p "$port" "${prog_args[@]}" "$ctl_prefix.1"
}
run_client "$server_pid" "$max_client_attempts" "$dir" start_client
end_server "$server_pid"

on_wire=""
wire_failed=0
if [ -n "$capture_pid" ]; then
  sleep 0.5
  kill_group "$capture_pid"
  total=$(grep -c . "$dir/tcpdump.txt")
  if [ -n "$vlan" ]; then
    what="tagged" pattern="vlan $vlan,"
  else
    what="IPv6" pattern="ethertype IPv6"
  fi
  matching=$(grep -c "$pattern" "$dir/tcpdump.txt")
  if [ "$total" -eq 0 ] || [ "$matching" -ne "$total" ]; then
    echo "FAIL: of $total RoCE frames from A seen on B's veth, $matching are $what"
    head -5 "$dir/tcpdump.txt"
    wire_failed=1
  fi
  on_wire=" ($matching of $total frames seen on the wire $what)"
fi

describe() {
  case $1 in
    0) echo "exit 0" ;;
    124) echo "timed out after ${per_process_timeout}s (exit 124)" ;;
    *) echo "exit $1" ;;
  esac
}
failed=$wire_failed
# Each droced (namespace a, b) must exit 0 with no object left.
fail=0
stop_daemons
[ "$fail" -eq 0 ] || failed=1
# The server's port line (active MTU) is in its daemon's log in daemon mode.
[ "$daemon_mode" -eq 1 ] && cat "$dir/daemon_a_start.log" >>"$dir/server.log"
if [ -n "${DROCE_TEST_ACTIVE_MTU:-}" ] && ! grep -Eq "active MTU ${DROCE_TEST_ACTIVE_MTU}[,)]" "$dir/server.log"; then
  echo "FAIL: the server's port does not report active MTU $DROCE_TEST_ACTIVE_MTU"
  failed=1
fi
[ "$server_rc" -eq 0 ] || { echo "FAIL: server: $(describe "$server_rc")"; failed=1; }
[ "$client_rc" -eq 0 ] || { echo "FAIL: client: $(describe "$client_rc")"; failed=1; }
expect='bytes in .* seconds'
grep -Eq "$expect" "$dir/server.log" || { echo "FAIL: server output has no line matching '$expect'"; failed=1; }
grep -Eq "$expect" "$dir/client.$attempt.log" 2>/dev/null ||
  { echo "FAIL: client output has no line matching '$expect'"; failed=1; }
if [ -n "$workers" ]; then
  # DROCE_STATS prints the device counters at exit (non-zero ones only).
  for side in server client; do
    log=$dir/server.log
    [ "$side" = client ] && log=$dir/client.$attempt.log
    handed=$(grep -Eo "handoff_pkts +[0-9]+" "$log" 2>/dev/null | tail -n1 | awk '{print $2}')
    dropped=$(grep -Eo "handoff_drop +[0-9]+" "$log" 2>/dev/null | tail -n1 | awk '{print $2}')
    echo "[$side] $workers workers: handoff_pkts ${handed:-0}, handoff_drop ${dropped:-0}"
    if [ "${dropped:-0}" -ne 0 ]; then echo "FAIL: $side dropped hand-offs"; failed=1; fi
  done
fi
if [ "$failed" -ne 0 ]; then
  echo "----- server output -----"
  cat "$dir/server.log"
  for f in "$dir"/client.*.log; do
    [ -e "$f" ] || continue
    echo "----- client output (${f##*/}) -----"
    cat "$f"
  done
  echo "----- links -----"
  ip -n "$ns_a" -s link show "$if_a"
  ip -n "$ns_b" -s link show "$if_b"
  exit 1
fi
echo "PASS: $program ${prog_args[*]} over $kind on a veth pair between two namespaces${vlan:+ (VLAN $vlan)}${ip6:+ (IPv6 addresses)}$on_wire"
grep -o "link MTU [0-9]*, active MTU [0-9]*" "$dir/server.log" | head -1 | sed 's/^/[server] /'
grep -E "bytes in .* seconds|iters in .* seconds" "$dir/server.log" | sed 's/^/[server] /'
grep -E "bytes in .* seconds|iters in .* seconds" "$dir/client.$attempt.log" | sed 's/^/[client] /'
exit 0
