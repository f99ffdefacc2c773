#!/usr/bin/env bash
# A configured gateway (DROCE_GATEWAY): two droce processes on different
# subnets, with the Linux kernel routing between them.
#
#   ns A: droce 10.78.1.11/24 gw 10.78.1.2 on vA (kernel 10.78.1.1)
#   ns B: router, 10.78.1.2 on vB and 10.80.1.2 on vR, ip_forward=1
#   ns C: droce 10.80.1.12/24 gw 10.80.1.2 on vC (kernel 10.80.1.1)
#
# Each droce resolves the gateway's MAC (not the peer's) by ARP and sends
# its RoCE frames there; B's kernel forwards them (decrementing the TTL,
# which the ICRC does not cover) and resolves the far droce by ARP. The
# programs' TCP exchange takes the same routed path through the kernels
# (af_packet leaves them their frames).
#
# usage: netns_gateway.sh LAUNCHER PROGRAM [PROGRAM ARGS...]
#   PROGRAM must put a hop limit above 1 in its address vectors: perftest
#   does (0xFF); ibv_rc_pingpong sends with hop limit 1, which a router
#   rightly drops (rxe and RNICs copy the GRH hop limit into the IP TTL too).
#   DROCE_TEST_EXPECT: a regex the client's output must match (default:
#   rc_pingpong's summary line).
# shellcheck disable=SC2015  # `a && b || fail`: fail is right whichever failed
set -u
# shellcheck source=netns_common.sh
. "$(dirname "$0")/netns_common.sh"  # and lib.sh
t_usage $# 2 - "LAUNCHER PROGRAM [PROGRAM ARGS...]"
launcher=$1
program=$2
shift 2
prog_args=("$@")

netns_check_prereqs "$launcher" af_packet
require_program "$program" ibverbs-utils
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU DROCE_GATEWAY DROCE_IP6 DROCE_VLAN

# Its own namespaces (three, not netns_setup's two), netns_common's cleanup.
t_setup netns
on_exit netns_cleanup
ns_c="droceC.$$"
extra_ns=("$ns_c")
if_r="dvR$$"
if_c="dvC$$"
ip netns add "$ns_a" || skip "cannot create a network namespace"
ip netns add "$ns_b" && ip netns add "$ns_c" || fail "cannot create network namespaces"
ip link add "$if_a" type veth peer name "$if_b" && ip link add "$if_r" type veth peer name "$if_c" ||
  fail "cannot create veth pairs"
ip link set "$if_a" netns "$ns_a" && ip link set "$if_b" netns "$ns_b" &&
  ip link set "$if_r" netns "$ns_b" && ip link set "$if_c" netns "$ns_c" || fail "cannot move the veths"
for ns in "$ns_a" "$ns_b" "$ns_c"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" addr add 10.78.1.1/24 dev "$if_a"
ip -n "$ns_b" addr add 10.78.1.2/24 dev "$if_b"
ip -n "$ns_b" addr add 10.80.1.2/24 dev "$if_r"
ip -n "$ns_c" addr add 10.80.1.1/24 dev "$if_c"
ip -n "$ns_a" link set "$if_a" up && ip -n "$ns_b" link set "$if_b" up &&
  ip -n "$ns_b" link set "$if_r" up && ip -n "$ns_c" link set "$if_c" up || fail "cannot bring the veths up"
ip -n "$ns_a" route add 10.80.1.0/24 via 10.78.1.2 && ip -n "$ns_c" route add 10.78.1.0/24 via 10.80.1.2 ||
  fail "cannot add routes"
ip netns exec "$ns_b" sysctl -qw net.ipv4.ip_forward=1 || fail "cannot enable forwarding"

readonly port=18515
if [ -n "${DROCE_TEST_DEBUG:-}" ]; then
  ip netns exec "$ns_b" tcpdump -i any -nn -e -l >"/tmp/gw-tcpdump.txt" 2>&1 &
  tcpdump_pid=$!
  # shellcheck disable=SC2317  # run at exit (on_exit)
  stop_tcpdump() { [ "$(t_ppid "$tcpdump_pid")" = "$$" ] && kill_group "$tcpdump_pid"; }
  on_exit stop_tcpdump
  sleep 1
fi
run_bg "$dir/server.log" "$ns_a" env DROCE_GATEWAY=10.78.1.2 "$launcher" exec \
  --link "net_af_packet0,iface=$if_a" --ip 10.78.1.11/24 -- "$program" -p "$port" "${prog_args[@]}"
server_pid=$last_pid
wait_listen "$ns_a" "$port" "$server_pid" 15

# shellcheck disable=SC2317  # called by run_client
start_client() {
  run_bg "$1" "$ns_c" env DROCE_GATEWAY=10.80.1.2 "$launcher" exec \
    --link "net_af_packet0,iface=$if_c" --ip 10.80.1.12/24 -- "$program" -p "$port" "${prog_args[@]}" 10.78.1.1
}
run_client "$server_pid" 20 "$dir" start_client
end_server "$server_pid"

# Client output proving it finished: rc_pingpong's summary, or perftest's
# result row (DROCE_TEST_EXPECT).
expect=${DROCE_TEST_EXPECT:-'bytes in .* seconds'}
mac_gw_a=$(ip netns exec "$ns_b" cat "/sys/class/net/$if_b/address")
fwd=$(ip netns exec "$ns_b" cat /proc/net/snmp | awk '/^Ip:/ { if (h) print $7; h = 1 }')
failed=0
[ "$server_rc" -eq 0 ] || { echo "FAIL: server exit $server_rc"; failed=1; }
[ "$client_rc" -eq 0 ] || { echo "FAIL: client exit $client_rc"; failed=1; }
grep -Eq "$expect" "$dir/client.$attempt.log" 2>/dev/null || { echo "FAIL: client did not finish"; failed=1; }
if [ "$failed" -ne 0 ]; then
  echo "----- server (ns A) -----"
  cat "$dir/server.log"
  echo "----- client (ns C) -----"
  cat "$dir/client.$attempt.log" 2>/dev/null
  echo "----- router (ns B): neighbours, forwarded datagrams: $fwd -----"
  ip -n "$ns_b" neigh
  exit 1
fi
echo "PASS: $program ${prog_args[*]} between two droce ports on different subnets through a kernel router (B forwarded $fwd datagrams; A's gateway MAC $mac_gw_a)"
grep -E "$expect" "$dir/client.$attempt.log" | sed 's/^/[client] /'
exit 0
