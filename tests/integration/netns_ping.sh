#!/usr/bin/env bash
# The Linux kernel as an independent ARP/ND/ICMP peer: a droce process in
# namespace A (on a veth driven through DPDK's af_packet or af_xdp PMD), the
# kernel's `ping` in namespace B. See netns_common.sh for the layout.
#
# usage: netns_ping.sh LAUNCHER KIND CHECK
#   KIND:  af_packet or af_xdp
#   CHECK: ipv4  gratuitous ARP on start (B learns droce's MAC with
#                arp_accept=1 before anything asks), ARP reply, ICMP echo
#                (small and 1400-byte), B's neighbour entry = droce's MAC
#          ipv6  neighbour solicitation/advertisement and ICMPv6 echo for
#                droce's IPv6 address (DROCE_IP6)
#          vlan  B pings over a VLAN subinterface (802.1Q ID 100); droce runs
#                on the untagged veth with DROCE_VLAN=100, so only correctly
#                tagged frames in both directions make the ping work
#   droce runs `ibv_rc_pingpong -g 0` as a server that waits for a client
#   which never comes: the device is up while the program waits.
#   Needs root and ping; exit 77 (skip) without them or without the PMD.
# shellcheck disable=SC2015  # `a && b || fail`: fail is right whichever failed
set -u
# shellcheck source=netns_common.sh
. "$(dirname "$0")/netns_common.sh"  # and lib.sh
t_usage $# 3 3 "LAUNCHER KIND ipv4|ipv6|vlan"
launcher=$1
kind=$2
check=$3

netns_check_prereqs "$launcher" "$kind"
require_program ping iputils-ping
require_program ibv_rc_pingpong ibverbs-utils
case $check in ipv4 | ipv6 | vlan) ;; *) fail "unknown check '$check'" ;; esac
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU DROCE_GATEWAY DROCE_IP6 DROCE_VLAN

netns_setup
readonly port=18515 vlan_id=100

target=$droce_ip_a
droce_v4=$droce_ip_a  # droce's IPv4 address (with IPv6, unused but required)
ping_flags=(-4)
case $check in
  ipv4)
    # Let B's kernel create entries from gratuitous ARP (default: only update).
    ip netns exec "$ns_b" sysctl -qw net.ipv4.conf.all.arp_accept=1 "net.ipv4.conf.$if_b.arp_accept=1" ||
      fail "cannot set arp_accept"
    ;;
  ipv6)
    ip -n "$ns_b" addr add "$ip6_prefix::2/64" dev "$if_b" nodad || fail "cannot add an IPv6 address"
    export DROCE_IP6="$droce_ip6_a/64"
    target=$droce_ip6_a
    ping_flags=(-6)
    ;;
  vlan)
    ip -n "$ns_b" link add link "$if_b" name "vl$$" type vlan id "$vlan_id" 2>"$dir/vlan.err" ||
      skip "this kernel cannot create VLAN interfaces (8021q): $(cat "$dir/vlan.err")"
    ip -n "$ns_b" addr add 10.78.2.2/24 dev "vl$$" && ip -n "$ns_b" link set "vl$$" up ||
      fail "cannot configure the VLAN subinterface"
    export DROCE_VLAN=$vlan_id
    target=10.78.2.11
    droce_v4=$target
    ;;
esac
mac_a=$(ip netns exec "$ns_a" cat "/sys/class/net/$if_a/address")

run_bg "$dir/droce.log" "$ns_a" "$launcher" exec --link "$(link_for "$kind" "$if_a")" \
  --ip "$droce_v4/24" --log-level info -- ibv_rc_pingpong -g 0 -p "$port"
droce_pid=$last_pid
wait_listen "$ns_a" "$port" "$droce_pid" 20 || {
  cat "$dir/droce.log"
  fail "droce's server did not come up"
}

failed=0
if [ "$check" = ipv4 ]; then
  # The gratuitous ARP sent on start; nobody has asked for the address yet.
  sleep 0.2
  learned=$(ip -n "$ns_b" neigh show "$target" dev "$if_b" | awk '{for (i = 1; i < NF; ++i) if ($i == "lladdr") print $(i + 1)}')
  if [ "$learned" != "$mac_a" ]; then
    echo "FAIL: no neighbour entry from droce's gratuitous ARP in B (got '$learned', want $mac_a)"
    failed=1
  fi
fi

ping_out=$(ip netns exec "$ns_b" ping "${ping_flags[@]}" -c 5 -i 0.2 -w 15 "$target" 2>&1)
echo "$ping_out" | grep -q " 5 received" || { echo "FAIL: ping $target"; failed=1; }
big_out=""
if [ "$check" = ipv4 ]; then
  big_out=$(ip netns exec "$ns_b" ping -4 -c 3 -i 0.2 -w 15 -s 1400 "$target" 2>&1)
  echo "$big_out" | grep -q " 3 received" || { echo "FAIL: ping -s 1400 $target"; failed=1; }
fi
dev_b=$if_b
[ "$check" = vlan ] && dev_b="vl$$"
neigh=$(ip -n "$ns_b" neigh show "$target" dev "$dev_b")
echo "$neigh" | grep -qi "lladdr $mac_a" || { echo "FAIL: B's neighbour entry for $target is '$neigh', want lladdr $mac_a"; failed=1; }

if [ "$failed" -ne 0 ]; then
  echo "----- ping -----"
  echo "$ping_out"
  [ -n "$big_out" ] && echo "$big_out"
  echo "----- droce -----"
  cat "$dir/droce.log"
  echo "----- B -----"
  ip -n "$ns_b" neigh
  ip -n "$ns_b" -s link show "$if_b"
  exit 1
fi
echo "PASS: kernel ping ($check) reaches droce over $kind; B's neighbour entry: $neigh"
echo "$ping_out" | tail -2
[ -n "$big_out" ] && echo "$big_out" | tail -1 | sed 's/^/(1400 bytes) /'
exit 0
