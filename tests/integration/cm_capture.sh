#!/usr/bin/env bash
# The connection manager on the wire, as a third party reads it: two droce
# processes in two network namespaces over af_packet on a veth pair, with
# tcpdump on the veth while they connect, exchange data and disconnect
# (rping), are rejected (rping to a port nobody listens on) and resolve a
# UD service (udaddy: SIDR). tshark's InfiniBand dissector must decode every
# CM message with the expected fields (service ID, QPNs, PSNs, GIDs, the IP
# CM private-data header) and report nothing malformed, and `droce
# pcap-check` must accept every ICRC.
#
#   cm_capture.sh LAUNCHER
set -uo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 1 1 "LAUNCHER"
launcher=$1
t_launcher "$launcher"
[ "$(id -u)" -eq 0 ] || skip "needs root (network namespaces)"
require_program tshark tshark
require_program mergecap tshark
require_program tcpdump tcpdump
require_program rping rdmacm-utils
require_program udaddy rdmacm-utils

t_setup cmcap
ns_s="droce-caps-$$" ns_c="droce-capc-$$" if_s="caps$$" if_c="capc$$"
tcpdump_pid=""
pids=()  # the servers (t_bg), in the order started
# At exit: the captures, and the namespaces (each goes once lib.sh has
# killed the servers).
cm_capture_cleanup() {
  # shellcheck disable=SC2086  # two pids
  [ -n "$tcpdump_pid" ] && kill $tcpdump_pid 2>/dev/null && wait $tcpdump_pid 2>/dev/null
  t_kill_all
  ip netns del "$ns_s" 2>/dev/null
  ip netns del "$ns_c" 2>/dev/null
  return 0
}
on_exit cm_capture_cleanup

ip netns add "$ns_s" && ip netns add "$ns_c" || skip "cannot make namespaces"
ip link add "$if_s" type veth peer name "$if_c" || skip "no veth"
ip link set "$if_s" netns "$ns_s" && ip link set "$if_c" netns "$ns_c"
ip -n "$ns_s" link set "$if_s" up && ip -n "$ns_c" link set "$if_c" up
s_ip=10.79.0.1 c_ip=10.79.0.2
cap="$dir/cm.pcap"
# A side's own frames leave through its packet socket unseen by a capture
# on the same interface: each side records what it receives, and the two
# files are merged.
ip netns exec "$ns_c" tcpdump -i "$if_c" -w "$dir/c.pcap" -U -s 0 "udp port 4791 or arp" 2>"$dir/tcpdump.log" &
tcpdump_pid=$!
ip netns exec "$ns_s" tcpdump -i "$if_s" -w "$dir/s.pcap" -U -s 0 "udp port 4791 or arp" 2>>"$dir/tcpdump.log" &
tcpdump_pid="$tcpdump_pid $!"
sleep 1

# Servers in the background (t_bg): `timeout` leads a process group of its own ($last_pid).
s_exec=(ip netns exec "$ns_s" "$launcher" exec --link "net_af_packet0,iface=$if_s" --ip "$s_ip/24" --)
run_c() { timeout 30 ip netns exec "$ns_c" "$launcher" exec --link "net_af_packet0,iface=$if_c" --ip "$c_ip/24" -- "$@"; }

# 1. connect, 10 pings, disconnect.
t_bg "$dir/s1.log" 30 "${s_exec[@]}" rping -s -a "$s_ip" -C 10
pids+=("$last_pid")
sleep 1.5
run_c rping -c -a "$s_ip" -C 10 >"$dir/c1.log" 2>&1 || { cat "$dir"/s1.log "$dir"/c1.log; fail "rping failed"; }
wait "${pids[0]}" || fail "rping server failed"
# 2. a REQ for a port nobody listens on: a REJ (invalid service ID), and
#    the client exits with an error.
t_bg "$dir/s2.log" 30 "${s_exec[@]}" rping -s -a "$s_ip" -p 7174 -C 1
pids+=("$last_pid")
sleep 1.5
if run_c rping -c -a "$s_ip" -p 7999 -C 1 >"$dir/c2.log" 2>&1; then fail "a connect to no listener succeeded"; fi
# Gone before the next server starts: two processes on one veth would both answer.
kill -TERM -- "-${pids[1]}" 2>/dev/null
wait "${pids[1]}" 2>/dev/null
# 3. SIDR.
t_bg "$dir/s3.log" 30 "${s_exec[@]}" udaddy -b "$s_ip"
pids+=("$last_pid")
sleep 1.5
run_c udaddy -s "$s_ip" >"$dir/c3.log" 2>&1 || { cat "$dir"/s3.log "$dir"/c3.log; fail "udaddy failed"; }
wait "${pids[2]}" || fail "udaddy server failed"
sleep 1.5  # the captures' last frames
kill -INT $tcpdump_pid 2>/dev/null
wait $tcpdump_pid 2>/dev/null
tcpdump_pid=""
mergecap -F pcap -w "$cap" "$dir/c.pcap" "$dir/s.pcap" || fail "mergecap failed"

ts() { tshark -r "$cap" "$@" 2>/dev/null; }
attrs=$(ts -Y "infiniband.bth.destqp == 1" -T fields -e infiniband.mad.attributeid | sort | uniq -c)
echo "CM MADs by attribute:"
echo "$attrs"
for a in 0x0010 0x0012 0x0013 0x0014 0x0015 0x0016 0x0017 0x0018; do
  grep -q "$a" <<<"$attrs" || fail "no CM message with attribute $a in the capture"
done
bad=$(ts -Y "_ws.malformed || _ws.expert.severity >= error" | wc -l)
[ "$bad" -eq 0 ] || { ts -Y "_ws.malformed || _ws.expert.severity >= error"; fail "$bad malformed packets"; }
# The REQ of rping's connection: service ID 0x0000000001061c06 (TCP port
# space, port 7174), the IP CM header with both addresses, the GIDs.
req=$(ts -Y "infiniband.cm.req.serviceid == 0x0000000001061c06" -T fields -E separator=' ' \
  -e infiniband.cm.req.localqpn -e infiniband.cm.req.startpsn -e infiniband.cm.req.ip_cm.ipv \
  -e infiniband.cm.req.ip_cm.sip4 -e infiniband.cm.req.ip_cm.dip4 -e infiniband.cm.req.prim_localgid_ipv4 \
  -e infiniband.cm.req.prim_remotegid_ipv4 -e infiniband.mad.mgmtclass -e infiniband.mad.classversion | head -1)
echo "REQ (localqpn startpsn ipv sip dip localgid remotegid class version): $req"
read -r qpn psn ipv sip dip lgid rgid class ver <<<"$req"
[ -n "$qpn" ] && [ "$qpn" != 0x000000 ] || fail "REQ without a QPN"
[ -n "$psn" ] || fail "REQ without a starting PSN"
[ "$ipv" = 4 ] || [ "$ipv" = 0x04 ] || fail "IP CM header IP version '$ipv'"
[ "$sip" = "$c_ip" ] && [ "$dip" = "$s_ip" ] || fail "IP CM header addresses $sip -> $dip"
[ "$lgid" = "$c_ip" ] && [ "$rgid" = "$s_ip" ] || fail "REQ primary GIDs $lgid -> $rgid"
[ "$class" = 0x07 ] && [ "$ver" = 2 ] || [ "$ver" = 0x02 ] || fail "MAD class $class version $ver"
rep=$(ts -Y "infiniband.cm.rep" -T fields -E separator=' ' -e infiniband.cm.rep.localqpn -e infiniband.cm.rep.startpsn | head -1)
echo "REP (localqpn startpsn): $rep"
[ -n "$rep" ] || fail "no REP decoded"
# (tshark 4.0 shows the REJ reason but leaves its field empty in -T fields.)
rej=$(ts -Y "infiniband.mad.attributeid == 0x0012" -V | grep -o "Reason: 0x[0-9a-f]*" | head -1)
echo "REJ $rej"
[ "$rej" = "Reason: 0x0008" ] || fail "REJ '$rej', not reason 8 (invalid service ID)"
sidr=$(ts -Y "infiniband.mad.attributeid == 0x0017" -V | grep -iE "Queue Key|Source Queue Pair" | head -2 | tr -s ' ' | tr '\n' ';')
echo "SIDR_REQ: $sidr"
grep -qiE "Queue Key: 0x0*80010000" <<<"$sidr" || fail "SIDR_REQ not sent with the GSI Q_Key"
"$launcher" pcap-check "$cap" || fail "droce pcap-check refused the capture"
echo "OK"
