#!/usr/bin/env bash
# Port state and the device's unaffiliated async events against a real link:
# tests/integration/port_events.cc runs under droce in namespace A on an
# af_packet veth (see netns_common.sh); this script takes the peer end of the
# veth down (A's end loses carrier: PORT_ERR, port DOWN), up again
# (PORT_ACTIVE), then deletes the veth (DEVICE_FATAL). The program checks
# each event and the port state it sees, and what a dead device does.
#
# usage: netns_port_events.sh LAUNCHER PORT_EVENTS_PROGRAM
# shellcheck disable=SC2015
set -u
# shellcheck source=netns_common.sh
. "$(dirname "$0")/netns_common.sh"  # and lib.sh
t_usage $# 2 2 "LAUNCHER PORT_EVENTS_PROGRAM"
launcher=$1
prog=$2
kind=af_packet

netns_check_prereqs "$launcher" "$kind"
t_launcher "$prog"
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU DROCE_GATEWAY DROCE_IP6 DROCE_VLAN
netns_setup

run_bg "$dir/droce.log" "$ns_a" "$launcher" exec --link "$(link_for "$kind" "$if_a")" \
  --ip "$droce_ip_a/24" --log-level info -- "$prog"
droce_pid=$last_pid

# wait_stage NAME SECONDS: waits until the program printed NAME.
wait_stage() {
  local deadline=$(( SECONDS + $2 ))
  while [ "$SECONDS" -lt "$deadline" ]; do
    grep -qx "$1" "$dir/droce.log" && return 0
    kill -0 "$droce_pid" 2>/dev/null || break
    sleep 0.1
  done
  echo "----- droce -----"
  cat "$dir/droce.log"
  fail "the program did not reach stage '$1'"
}

wait_stage ready 30
ip -n "$ns_b" link set "$if_b" down || fail "cannot take the peer veth down"
wait_stage down 20
ip -n "$ns_b" link set "$if_b" up || fail "cannot bring the peer veth up"
wait_stage up 20
ip -n "$ns_a" link del "$if_a" || fail "cannot delete the veth"
wait_stage fatal 20
wait "$droce_pid"
rc=$?
if [ "$rc" -ne 0 ]; then
  cat "$dir/droce.log"
  fail "the program exited with $rc"
fi
grep -q "link down" "$dir/droce.log" || fail "droce did not log the link going down"
echo "PASS: PORT_ERR, PORT_ACTIVE and DEVICE_FATAL over $kind"
exit 0
