#!/usr/bin/env bash
# A hostile peer on a live link: a raw packet socket on B's veth sends
# RoCEv2 frames into droced A (af_packet) — valid ones with random QPNs,
# PSNs, opcodes, rkeys, addresses, lengths and Q_Keys, mutated ones (bits
# flipped, cut short, wrong pad, ICRC or lengths, over the MTU), replays of
# the legitimate flows' frames changed so that they cannot pass as their next
# packet, MADs to QP1, then floods — while legitimate RC, UC and UD traffic
# runs between droced A and droced B and victim QPs of every type and state
# wait on A with registered memory whose every byte outside the read-write MR
# is checked afterwards (hostile_peer.cc says what is sent). Must hold: no
# crash or hang; the legitimate flows finish byte-exact (write_check's WRITEs
# and SENDs, ibv_uc_pingpong -c, ibv_ud_pingpong -c); no byte outside what a
# valid rkey granted changed; each kind of bad frame shows in its named
# counter; droced A still carries a new connection afterwards and stops
# cleanly with no object left.
#
# usage: hostile_peer.sh LAUNCHER DROCED HOSTILE_PEER WRITE_CHECK
#   DROCE_TEST_HOSTILE_SEED: the attack's seed (default: random, printed);
#   DROCE_TEST_HOSTILE_PPS: its paced rate (default 5000 frames a second).
set -u
# The daemons live through the whole test (netns_common.sh reads it when
# sourced: run_bg's timeout).
export DROCE_TEST_TIMEOUT=${DROCE_TEST_TIMEOUT:-150}
# lib.sh comes with it.
# shellcheck source=netns_common.sh
. "$(dirname "$0")/netns_common.sh"
t_usage $# 4 4 "LAUNCHER DROCED HOSTILE_PEER WRITE_CHECK"
launcher=$1
droced=$2
hostile=$(readlink -f "$3")
write_check=$(readlink -f "$4")

netns_check_prereqs "$launcher" af_packet
t_launcher "$droced"
[ -x "$hostile" ] && [ -x "$write_check" ] || fail "hostile_peer or write_check not built"
for p in ibv_uc_pingpong ibv_ud_pingpong ibv_rc_pingpong; do require_program "$p" ibverbs-utils; done
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU DROCE_GATEWAY DROCE_IP6 DROCE_WORKERS DROCE_VLAN
seed=${DROCE_TEST_HOSTILE_SEED:-$(( (RANDOM << 15) | RANDOM ))}
readonly mac_a=02:00:0a:4e:01:0b
readonly peer_ip=$net_prefix.2  # B's kernel address: the victims' peer and the attack's source

netns_setup
# droced a on $dir/a.sock (log $dir/a.log) in A, b in B, under run_bg's
# timeout.
T_DROCED=$droced T_DROCED_TIMEOUT=$per_process_timeout T_DROCED_NETNS=$ns_a
start_droced a --link "$(link_for af_packet "$if_a")" --ip "$droce_ip_a/24" --mac "$mac_a"
droced_a=$last_pid
# B's frames pass the qdisc, so the attacker's socket on the same veth sees
# them (qdisc_bypass skips the taps) and can replay them.
T_DROCED_NETNS=$ns_b
start_droced b --link "$(link_for af_packet "$if_b"),qdisc_bypass=0" --ip "$droce_ip_b/24"

on_a() { local log=$1; shift; run_bg "$dir/$log" "$ns_a" "$launcher" exec --daemon "$dir/a.sock" -- "$@"; }
on_b() { local log=$1; shift; run_bg "$dir/$log" "$ns_b" "$launcher" exec --daemon "$dir/b.sock" -- "$@"; }
ctl_a() { ip netns exec "$ns_a" "$launcher" ctl --socket "$dir/a.sock" "$@"; }
ctl_b() { ip netns exec "$ns_b" "$launcher" ctl --socket "$dir/b.sock" "$@"; }

on_a victim.log "$hostile" victim "$dir/victims" "$peer_ip"
victim=$last_pid
for _ in $(seq 1 200); do [ -f "$dir/victims" ] && break; sleep 0.05; done
[ -f "$dir/victims" ] || fail "the victim did not start: $(cat "$dir/victim.log")"

attack() {
  timeout 60 ip netns exec "$ns_b" "$hostile" attack "$if_b" "$mac_a" "$droce_ip_a" "$peer_ip" \
    "$dir/victims" "$@" >>"$dir/attack.log" 2>&1
}
check_exit() {  # NAME PID
  wait "$2"
  local rc=$?
  [ "$rc" -eq 0 ] || { echo "FAIL: $1 exited $rc"; failed=1; }
}
failed=0
echo "seed $seed"
pps=${DROCE_TEST_HOSTILE_PPS:-5000}

# Phase 1, UC and UD: A serves, B runs the clients over the control veth,
# while the attack runs paced (5,000 frames a second). They have no
# retransmission, so nothing else runs beside them: a veth drops frames
# when its peer's backlog is full (net.core.netdev_max_backlog), which a
# bulk RC flow or a flood does now and then.
on_a uc_server.log ibv_uc_pingpong -g 0 -p 18602 -n 10000 -s 1024 -c
s_uc=$last_pid
on_a ud_server.log ibv_ud_pingpong -g 0 -p 18603 -n 10000 -s 512 -c
s_ud=$last_pid
wait_listen "$ns_a" 18602 "$s_uc" 30 && wait_listen "$ns_a" 18603 "$s_ud" 30 ||
  { tail -n 5 "$dir"/*.log; fail "the UC or UD server did not listen in A"; }
on_b uc_client.log ibv_uc_pingpong -g 0 -p 18602 -n 10000 -s 1024 -c "$ctl_prefix.1"
c_uc=$last_pid
on_b ud_client.log ibv_ud_pingpong -g 0 -p 18603 -n 10000 -s 512 -c "$ctl_prefix.1"
c_ud=$last_pid
attack 4 "$seed" "$pps" || { echo "FAIL: the paced attack: $(cat "$dir/attack.log")"; failed=1; }
check_exit "the UC client" "$c_uc"
check_exit "the UC server" "$s_uc"
check_exit "the UD client" "$c_ud"
check_exit "the UD server" "$s_ud"

# Phase 2, RC: 64 KiB WRITEs and 4 KiB SENDs with every byte checked, while
# the attack runs paced, then floods. Local ACK timeout 14 (67 ms, as
# perftest's): beside a CPU hog the engines stall for tens of milliseconds,
# which write_check's 4 ms times 8 tries does not outlast.
export WRITE_CHECK_TIMEOUT=14
on_a wc_write_server.log env TCP_PAIR_ANY=1 "$write_check" server 18600
s_write=$last_pid
on_a wc_send_server.log env TCP_PAIR_ANY=1 "$write_check" server 18601
s_send=$last_pid
wait_listen "$ns_a" 18600 "$s_write" 30 && wait_listen "$ns_a" 18601 "$s_send" 30 ||
  { tail -n 5 "$dir"/*.log; fail "a write_check server did not listen in A"; }
on_b wc_write_client.log "$write_check" client "$ctl_prefix.1" 18600 8
c_write=$last_pid
on_b wc_send_client.log env WRITE_CHECK_VERB=send WRITE_CHECK_MSG=4096 "$write_check" client "$ctl_prefix.1" 18601 8
c_send=$last_pid
attack 3 "$((seed + 1))" "$pps" || { echo "FAIL: the paced attack: $(cat "$dir/attack.log")"; failed=1; }
ctl_a -j stat show link droce0/1 >"$dir/stat_paced.json" 2>&1
attack 3 "$((seed + 2))" 20000 1 || { echo "FAIL: the flood: $(cat "$dir/attack.log")"; failed=1; }
for x in "write client:$c_write" "write server:$s_write" "send client:$c_send" "send server:$s_send"; do
  check_exit "write_check ${x%%:*}" "${x##*:}"
done
touch "$dir/victims.stop"
check_exit "the victim" "$victim"

for log in wc_write_server wc_send_server; do
  grep -q "server: passes [1-9][0-9]* bad_words 0$" "$dir/$log.log" || { echo "FAIL: $log: bad words or no pass"; failed=1; }
done
for log in wc_write_client wc_send_client; do
  grep -q "bad_words 0$" "$dir/$log.log" || { echo "FAIL: $log: bad words or no pass"; failed=1; }
done
for log in uc_server uc_client ud_server ud_client; do
  grep -Eq "bytes in .* seconds" "$dir/$log.log" || { echo "FAIL: $log: no result line"; failed=1; }
done
grep -q "victim: guard bytes changed 0," "$dir/victim.log" || { echo "FAIL: bytes outside the granted MR changed"; failed=1; }

# After the attack: droced A still alive and carrying a new connection.
kill -0 "$droced_a" 2>/dev/null || { echo "FAIL: droced A is gone"; failed=1; }
on_a rc_server.log ibv_rc_pingpong -g 0 -p 18604 -n 200 -c
s_rc=$last_pid
wait_listen "$ns_a" 18604 "$s_rc" 15 || { echo "FAIL: the last server did not listen"; failed=1; }
on_b rc_client.log ibv_rc_pingpong -g 0 -p 18604 -n 200 -c "$ctl_prefix.1"
check_exit "the last RC client" "$last_pid"
check_exit "the last RC server" "$s_rc"

# Each kind of bad frame counted under its name on A.
ctl_a -j stat show link droce0/1 >"$dir/stat.json" 2>&1 || { echo "FAIL: droce ctl stat: $(cat "$dir/stat.json")"; failed=1; }
counted=""
for c in icrc_err malformed_pkts unknown_qp qp_state_drop qkey_viol gsi_rcvd send_rem_access_err \
         send_inv_req_err duplicate_request out_of_seq_request other_host_drop; do
  v=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[0].get(sys.argv[2], 0))" "$dir/stat.json" "$c" 2>/dev/null)
  counted+=" $c=${v:-?}"
  [ "${v:-0}" -gt 0 ] 2>/dev/null || { echo "FAIL: A counted no $c"; failed=1; }
done

# B's af_packet socket sees the attack's frames leave through its own veth:
# they are for A's MAC, so B takes none of them for a bad frame of its own,
# except those a bit flip made group-addressed (every station takes those).
ctl_b -j stat show link droce0/1 >"$dir/stat_b.json" 2>&1 || { echo "FAIL: droce ctl stat B: $(cat "$dir/stat_b.json")"; failed=1; }
group=$(awk '/^attack:/ { for (i = 1; i < NF; ++i) if ($i == "group-addressed") n += $(i + 1) } END { print n + 0 }' "$dir/attack.log")
b_bad=$(python3 -c "import json,sys; j=json.load(open(sys.argv[1]))[0]; print(j.get('icrc_err', 0) + j.get('malformed_pkts', 0))" "$dir/stat_b.json" 2>/dev/null)
[ "${b_bad:-x}" -le "$group" ] 2>/dev/null ||
  { echo "FAIL: B counted ${b_bad:-?} bad frames (icrc_err, malformed_pkts) of the attack's on A; $group were group-addressed"; failed=1; }
b_other=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[0].get('other_host_drop', 0))" "$dir/stat_b.json" 2>/dev/null)
counted+=" (B: other_host_drop=${b_other:-?}, bad ${b_bad:-?} of $group group-addressed)"

fail=0
stop_daemons  # a and b: SIGTERM, exit 0, no object left (else fail=1)
[ "$fail" -eq 0 ] || failed=1

if [ "$failed" -ne 0 ]; then
  for f in "$dir"/*.log; do echo "----- ${f##*/}"; tail -n 15 "$f"; done
  for f in "$dir"/stat*.json; do
    echo "----- ${f##*/} (non-zero)"
    python3 -c "import json,sys; print(' '.join(f'{k}={v}' for k, v in json.load(open(sys.argv[1]))[0].items() if v))" "$f" 2>&1
  done
  exit 1
fi
echo "PASS: a hostile peer on A's link (seed $seed)"
sed 's/^/[attack] /' "$dir/attack.log"
echo "[victim] $(grep '^victim: guard' "$dir/victim.log")"
echo "[flows] $(grep -h '^passes' "$dir/wc_write_client.log") | $(grep -h '^passes' "$dir/wc_send_client.log")"
echo "[flows] UC $(grep -h 'bytes in' "$dir/uc_client.log") | UD $(grep -h 'bytes in' "$dir/ud_client.log")"
echo "[A counted]$counted"
exit 0
