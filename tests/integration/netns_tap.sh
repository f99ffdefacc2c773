#!/usr/bin/env bash
# droce on DPDK's tap PMD (net_tap): the PMD creates a kernel tap interface
# in droce's network namespace; the kernel on that interface pings droce.
#
# usage: netns_tap.sh LAUNCHER
#   Needs root; exit 77 (skip) without it, without ping or the tap PMD.
# shellcheck disable=SC2015  # `a && b || fail`: fail is right whichever failed
set -u
# lib.sh comes with it.
# shellcheck source=netns_common.sh
. "$(dirname "$0")/netns_common.sh"
t_usage $# 1 1 "LAUNCHER"
launcher=$1

t_launcher "$launcher"
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces)"
require_program ip iproute2
require_program ping iputils-ping
require_program ibv_rc_pingpong ibverbs-utils
compgen -G "/usr/lib/*/dpdk/pmds-*/librte_net_tap.so*" >/dev/null ||
  skip "DPDK's tap PMD is not installed (librte-net-tap23: scripts/setup.sh)"
[ -e /dev/net/tun ] || skip "no /dev/net/tun"
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU DROCE_GATEWAY DROCE_IP6 DROCE_VLAN

# One namespace of netns_common.sh's (not netns_setup: no veths here).
t_setup netns
on_exit netns_cleanup
ip netns add "$ns_a" || skip "cannot create a network namespace"
tap="dtp$$"
readonly port=18515

run_bg "$dir/droce.log" "$ns_a" "$launcher" exec --link "net_tap0,iface=$tap" --ip 10.78.3.11/24 \
  --log-level info -- ibv_rc_pingpong -g 0 -p "$port"
droce_pid=$last_pid
wait_listen "$ns_a" "$port" "$droce_pid" 20 || { cat "$dir/droce.log"; fail "droce did not come up"; }
ip -n "$ns_a" addr add 10.78.3.1/24 dev "$tap" && ip -n "$ns_a" link set "$tap" up ||
  fail "cannot configure the tap interface"
out=$(ip netns exec "$ns_a" ping -c 5 -i 0.2 -w 15 10.78.3.11 2>&1)
if ! echo "$out" | grep -q " 5 received"; then
  echo "FAIL: ping over the tap interface"
  echo "$out"
  cat "$dir/droce.log"
  exit 1
fi
echo "PASS: kernel ping reaches droce on net_tap ($(grep -o 'link MTU [0-9]*, active MTU [0-9]*' "$dir/droce.log"))"
echo "$out" | tail -2
exit 0
