# shellcheck shell=bash disable=SC2015,SC2016
# Shared by the netns_*.sh tests (sourced, not run): two network namespaces
# that the test creates, joined by a veth pair that droce drives through a
# kernel-interface PMD (af_packet or af_xdp), plus a second veth pair for the
# programs' out-of-band TCP exchange (an AF_XDP socket takes every frame of
# its interface away from the kernel, so the data link cannot carry it).
#
#   ns A: vA (data, kernel 10.78.1.1/24, droce 10.78.1.11)   cA (10.79.1.1/24)
#   ns B: vB (data, kernel 10.78.1.2/24, droce 10.78.1.12)   cB (10.79.1.2/24)
#
# droce's addresses differ from the kernel's: both stacks see the frames of
# an af_packet link, and each answers ARP for its own address only.
# Everything is removed on exit (namespaces, hence interfaces; processes).
# DROCE_TEST_VETH_MTU sets the data veths' MTU; DROCE_TEST_LINK_ARGS adds PMD
# arguments to the links.
# shellcheck disable=SC2034,SC2317  # variables used by the sourcing scripts; trap handlers

readonly net_prefix=10.78.1 ctl_prefix=10.79.1
readonly droce_ip_a=$net_prefix.11 droce_ip_b=$net_prefix.12
readonly ip6_prefix=fd78:1
readonly droce_ip6_a=$ip6_prefix::11 droce_ip6_b=$ip6_prefix::12
readonly per_process_timeout=${DROCE_TEST_TIMEOUT:-60}

ns_a="droceA.$$"
ns_b="droceB.$$"
# Interface names: at most 15 characters, unique per run.
if_a="dvA$$"
if_b="dvB$$"
ctl_a="dcA$$"
ctl_b="dcB$$"
extra_ns=()  # more namespaces a test made (removed on exit too)

# fail, skip, t_setup, t_bg, kill_group, run_client, end_server, start_droced.
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# At exit (on_exit): the programs, then the namespaces.
netns_cleanup() {
  local p
  t_kill_all
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  for p in "${extra_ns[@]}"; do ip netns del "$p" 2>/dev/null; done
  # The veths die with their namespace; if setup failed halfway one may
  # still be in the root namespace.
  ip link del "$if_a" 2>/dev/null
  ip link del "$ctl_a" 2>/dev/null
  return 0
}

# netns_check_prereqs LAUNCHER KIND: skips unless everything needed is here.
netns_check_prereqs() {
  local launcher=$1 kind=$2
  [ -x "$launcher" ] || fail "launcher '$launcher' is not an executable file"
  [ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces)"
  command -v ip >/dev/null 2>&1 || skip "'ip' not found (iproute2)"
  case $kind in
    af_packet | af_xdp) ;;
    *) fail "unknown link kind '$kind' (af_packet or af_xdp)" ;;
  esac
  local pmd=${kind//_/-}
  if ! compgen -G "/usr/lib/*/dpdk/pmds-*/librte_net_${kind}.so*" >/dev/null &&
     ! compgen -G "/usr/lib/dpdk/pmds-*/librte_net_${kind}.so*" >/dev/null; then
    skip "DPDK's $kind PMD is not installed (librte-net-${pmd}23: scripts/setup.sh)"
  fi
}

# netns_setup: creates the namespaces and both veth pairs.
netns_setup() {
  t_setup netns
  on_exit netns_cleanup
  ip netns add "$ns_a" || skip "cannot create a network namespace"
  ip netns add "$ns_b" || fail "cannot create a second network namespace"
  ip link add "$if_a" type veth peer name "$if_b" || fail "cannot create a veth pair"
  ip link add "$ctl_a" type veth peer name "$ctl_b" || fail "cannot create a veth pair"
  ip link set "$if_a" netns "$ns_a" && ip link set "$ctl_a" netns "$ns_a" &&
    ip link set "$if_b" netns "$ns_b" && ip link set "$ctl_b" netns "$ns_b" ||
    fail "cannot move the veths into the namespaces"
  local ns
  for ns in "$ns_a" "$ns_b"; do
    ip -n "$ns" link set lo up
    # No router solicitations or DAD noise on the data link.
    ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.accept_ra=0 net.ipv6.conf.default.accept_ra=0 \
      net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0 >/dev/null 2>&1
  done
  if [ -n "${DROCE_TEST_VETH_MTU:-}" ]; then
    ip -n "$ns_a" link set "$if_a" mtu "$DROCE_TEST_VETH_MTU" &&
      ip -n "$ns_b" link set "$if_b" mtu "$DROCE_TEST_VETH_MTU" || fail "cannot set the veth MTU"
  fi
  ip -n "$ns_a" addr add "$net_prefix.1/24" dev "$if_a"
  ip -n "$ns_b" addr add "$net_prefix.2/24" dev "$if_b"
  ip -n "$ns_a" addr add "$ctl_prefix.1/24" dev "$ctl_a"
  ip -n "$ns_b" addr add "$ctl_prefix.2/24" dev "$ctl_b"
  ip -n "$ns_a" link set "$if_a" up && ip -n "$ns_a" link set "$ctl_a" up &&
    ip -n "$ns_b" link set "$if_b" up && ip -n "$ns_b" link set "$ctl_b" up ||
    fail "cannot bring the veths up"
}

# link_for KIND IFACE: the droce link devargs for a kernel interface, plus
# DROCE_TEST_LINK_ARGS (more PMD arguments) if set.
link_for() {
  case $1 in
    af_packet) echo "net_af_packet0,iface=$2${DROCE_TEST_LINK_ARGS:+,$DROCE_TEST_LINK_ARGS}" ;;
    af_xdp) echo "net_af_xdp0,iface=$2,start_queue=0${DROCE_TEST_LINK_ARGS:+,$DROCE_TEST_LINK_ARGS}" ;;
  esac
}

# wait_listen NS PORT PID SECONDS: waits until PID listens on PORT in NS.
wait_listen() {
  local deadline=$(( SECONDS + $4 ))
  while [ "$SECONDS" -lt "$deadline" ]; do
    ns_tcp_listening "$1" "$2" && return 0
    kill -0 "$3" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# run_bg LOG NS CMD...: runs CMD in namespace NS under a timeout
# (DROCE_TEST_TIMEOUT, default 60 s), in the background; its pid (the group
# to kill) is in $last_pid.
run_bg() {
  local log=$1 ns=$2
  shift 2
  t_bg "$log" "$per_process_timeout" ip netns exec "$ns" "$@"
}
