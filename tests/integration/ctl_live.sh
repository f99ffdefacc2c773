#!/usr/bin/env bash
# Operating droce (docs/OPERATIONS.md): while ib_send_bw runs between two
# clients of one droced, `droce ctl -j` shows the devices, links, clients,
# QPs, CQs, MRs, PDs and counters; the Prometheus endpoint and DPDK's
# telemetry socket serve the same counters, which move during the run and,
# once it is over, agree exactly and account for every packet perftest sent.
# Then an embedded program with DROCE_CTL=1 answers `droce ctl --pid`, and
# bad arguments get one line and exit status 2.
#
# usage: ctl_live.sh LAUNCHER DROCED IB_SEND_BW IBV_RC_PINGPONG
set -uo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 4 4 "LAUNCHER DROCED IB_SEND_BW IBV_RC_PINGPONG"
launcher=$1 droced=$2 send_bw=$3 rc_pingpong=$4
t_launcher "$launcher"
T_DROCED=$droced
t_setup ctl 20
fail=0

ctl() { "$launcher" ctl --socket "$dir/d0.sock" "$@"; }
# jq-free JSON checks: py EXPR with `j` the JSON on stdin.
py() { /usr/bin/python3 -c "import json,sys; j=json.load(sys.stdin); $1"; }

mport=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
start_droced d0 --ip 10.77.1.1/24 --metrics-port "$mport" --telemetry 1
dpid=$last_pid
# timeout's child is droced.
for _ in $(seq 1 50); do
  droced_pid=$(pgrep -P "$dpid" -x droced) && break
  sleep 0.05
done
tsock=/var/run/dpdk/droce-$droced_pid/dpdk_telemetry.v2
[ -S "$tsock" ] || fail "no telemetry socket at $tsock"

scrape() { curl -sf "http://127.0.0.1:$mport/metrics"; }
# telemetry CMD: one command's JSON answer on DPDK's telemetry socket.
telemetry() {
  /usr/bin/python3 - "$tsock" "$1" <<'EOF'
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
s.connect(sys.argv[1])
s.recv(1024)
s.send(sys.argv[2].encode())
print(s.recv(1 << 20).decode())
EOF
}
dev_ctr() { ctl -j stat show link droce0/1 | py "print(j[0]['$1'])"; }
prom_ctr() { scrape | awk -v m="droce_$1_total{device=\"droce0\",port=\"1\"}" '$1 == m { print $2 }'; }
tele_ctr() { telemetry /droce/stats,droce0 | py "print(j['/droce/stats']['$1'])"; }

# --- at rest ---------------------------------------------------------------
ctl -j dev show | py "assert j[0]['ifname'] == 'droce0' and j[0]['node_type'] == 'ca', j" || fail "dev show"
ctl -j link show | py "assert j[0]['state'] == 'ACTIVE' and j[0]['ip'] == '10.77.1.1/24', j" || fail "link show"
ctl -j res show | py "assert (j[0]['qp'], j[0]['cq'], j[0]['mr'], j[0]['pd']) == (0, 0, 0, 0), j" || fail "res show"
s0=$(dev_ctr sent_pkts) r0=$(dev_ctr rcvd_pkts)
[ "$(prom_ctr sent_pkts)" = "$s0" ] && [ "$(tele_ctr sent_pkts)" = "$s0" ] || fail "the three views disagree at rest"
# The link's own counters (the PMD's): in stat show and as metrics.
lr=$(dev_ctr link_rx_missed) lt=$(dev_ctr link_tx_packets)
[ "$lr" = 0 ] && [ -n "$lt" ] && [ "$(scrape | awk '$1 == "droce_link_tx_packets_total{device=\"droce0\",port=\"1\"}" { print $2 }')" = "$lt" ] ||
  fail "the link's counters: stat show rx_missed '$lr' tx_packets '$lt', metrics '$(scrape | grep '^droce_link_tx_packets')'"

# --- during ib_send_bw -------------------------------------------------------
# Long enough (about 4 s at 2 GB/s) for the samples below to fall inside the run.
iters=120000 size=65536 mtu=1024
pkts=$(( iters * (size / mtu) ))
t_bg "$dir/server.log" 60 "$launcher" exec --daemon "$dir/d0.sock" -- "$send_bw" -x 0 -p 18621 -s $size -n $iters
server=$last_pid
start_client() {
  t_bg "$1" 60 "$launcher" exec --daemon "$dir/d0.sock" -- "$send_bw" -x 0 -p 18621 -s $size -n $iters 127.0.0.1
}
sleep 0.3
start_client "$dir/client.log"
client=$last_pid
# Two QPs, one per client, in RTS/RTR, before the traffic ends.
for _ in $(seq 1 100); do
  n=$(ctl -j res show qp | py "print(len(j))" 2>/dev/null)
  [ "$n" = 2 ] && [ "$(ctl -j stat show qp | py "print(max(q['sent_pkts'] for q in j))")" -gt 0 ] && break
  sleep 0.05
done
ctl -j client show | py "
assert len(j) == 2, j
assert all(c['comm'] == 'ib_send_bw' and c['qp'] == 1 and c['mr'] == 1 and c['pd'] == 1 for c in j), j
" || fail "client show during the run"
ctl -j res show qp | py "
pids = sorted(c for c in [q['pid'] for q in j])
assert len(j) == 2 and all(q['type'] == 'RC' for q in j), j
assert {q['state'] for q in j} <= {'RTS', 'RTR'}, j
assert j[0]['rqpn'] == j[1]['lqpn'] and j[1]['rqpn'] == j[0]['lqpn'], j
" || fail "res show qp during the run"
ctl -j res show cq | py "assert len(j) == 4 and all(c['cqe'] > 0 for c in j), j" || fail "res show cq"
ctl -j res show mr | py "assert len(j) == 2 and all(m['mrlen'] >= $size for m in j), j" || fail "res show mr"
cpid=$(ctl -j client show | py "print(j[0]['pid'])")
ctl -j res show qp pid "$cpid" | py "assert len(j) == 1 and j[0]['pid'] == $cpid, j" || fail "res show qp pid"
# The counters move while the traffic runs, in every view.
a=$(ctl -j stat show qp | py "print(max(q['sent_pkts'] for q in j))")
pa=$(scrape | awk '/^droce_qp_sent_pkts_total/ { if ($2 > m) m = $2 } END { print m + 0 }')
ta=$(tele_ctr sent_pkts)
sleep 0.4
b=$(ctl -j stat show qp | py "print(max(q['sent_pkts'] for q in j))")
pb=$(scrape | awk '/^droce_qp_sent_pkts_total/ { if ($2 > m) m = $2 } END { print m + 0 }')
tb=$(tele_ctr sent_pkts)
kill -0 "$client" 2>/dev/null || fail "the run ended before the second sample (make it longer)"
echo "during the run: QP sent_pkts $a -> $b (ctl), $pa -> $pb (Prometheus); device $ta -> $tb (telemetry)"
[ "$b" -gt "$a" ] && [ "$pb" -gt "$pa" ] && [ "$tb" -gt "$ta" ] || fail "a counter did not move during the run"
[ "$b" -le "$pkts" ] || fail "the client's QP sent $b packets, more than the $pkts of the run"
telemetry /droce/qps,droce0 | py "assert len(j['/droce/qps']) == 2, j" || fail "telemetry /droce/qps"
qpn=$(ctl -j res show qp | py "print(j[0]['lqpn'])")
telemetry "/droce/qp_stats,droce0,$qpn" | py "assert j['/droce/qp_stats']['sent_pkts'] >= 0, j" ||
  fail "telemetry /droce/qp_stats"
ctl stat show qp "$qpn" | grep "^link droce0/1 lqpn $qpn pid [0-9]* comm ib_send_bw sent_pkts" >/dev/null ||
  fail "stat show qp N (text)"

wait "$client"; crc=$?
wait "$server"; src=$?
[ "$crc" -eq 0 ] && [ "$src" -eq 0 ] || fail "ib_send_bw exited $src/$crc"
grep -qE "^ *$size +$iters " "$dir/client.log" || fail "ib_send_bw printed no result"

# --- after: the views agree, and account for the run's packets --------------
for _ in $(seq 1 50); do
  [ "$(ctl -j res show | py "print(j[0]['qp'])")" = 0 ] && break
  sleep 0.1
done
s1=$(dev_ctr sent_pkts) r1=$(dev_ctr rcvd_pkts)
ps1=$(prom_ctr sent_pkts) ts1=$(tele_ctr sent_pkts)
echo "after: device sent_pkts +$(( s1 - s0 )), rcvd_pkts +$(( r1 - r0 )) for $pkts data packets;" \
  "Prometheus $ps1, telemetry $ts1, ctl $s1"
[ "$ps1" = "$s1" ] && [ "$ts1" = "$s1" ] || fail "ctl, Prometheus and telemetry disagree at rest"
[ $(( s1 - s0 )) -ge "$pkts" ] && [ $(( r1 - r0 )) -ge "$pkts" ] || fail "fewer packets counted than the run sent"
# droced notices a client's exit on its socket, a moment after the QPs go.
for _ in $(seq 1 50); do
  scrape | grep '^droced_clients_live 0$' >/dev/null && break
  sleep 0.1
done
scrape | grep '^droced_clients_live 0$' >/dev/null || fail "droced_clients_live is not 0 after the run"

# --- fault rules' counters in the three views ------------------------------------
telemetry /droce/faults,droce0 | py "assert j['/droce/faults'] in ({}, []), j" || fail "telemetry /droce/faults without rules"
ctl fault set 'tx loss random 0%' >/dev/null || fail "fault set"
ctl -j fault show | py "assert j[0]['rule'] == 1 and j[0]['text'] == 'tx loss random 0%', j" || fail "fault show"
telemetry /droce/faults,droce0 |
  py "r = j['/droce/faults']['1']; assert r['text'] == 'tx loss random 0%' and r['dropped'] == 0, j" ||
  fail "telemetry /droce/faults: $(telemetry /droce/faults,droce0)"
scrape | grep -E '^droce_fault_rule_matched_total\{device="droce0",rule="1",text="tx loss random 0%"\} [0-9]+$' >/dev/null ||
  fail "no fault rule series in the metrics: $(scrape | grep fault_rule | head -n 4)"
ctl fault clear >/dev/null || fail "fault clear"
scrape | grep '^droce_fault_rule' >/dev/null && fail "fault rule series left after fault clear"
ctl -j client show | py "assert j == [], j" || fail "clients left after the run"

# --- client kill: the daemon detaches a client and tears its objects down ------
t_bg "$dir/victim.log" 30 "$launcher" exec --daemon "$dir/d0.sock" -- "$rc_pingpong" -g 0 -p 18623
victim=$last_pid
vpid=""
for _ in $(seq 1 100); do
  vpid=$(ctl -j client show | py "print(j[0]['pid'] if j and j[0]['qp'] == 1 else '')" 2>/dev/null)
  [ -n "$vpid" ] && break
  sleep 0.05
done
[ -n "$vpid" ] || fail "the ibv_rc_pingpong client did not appear"
td0=$(ctl -j stat show | py "print([e for e in j if e['ifname'] == 'host'][0]['teardowns'])")
ctl client kill "$vpid" || fail "client kill $vpid failed"
for _ in $(seq 1 100); do
  [ "$(ctl -j client show | py "print(len(j))")" = 0 ] && break
  sleep 0.05
done
ctl -j client show | py "assert j == [], j" || fail "client $vpid still listed after client kill"
ctl -j res show | py "assert j[0]['qp'] == 0, j" || fail "client $vpid's QP left after client kill"
ctl -j stat show | py "assert [e for e in j if e['ifname'] == 'host'][0]['teardowns'] == $td0 + 1, j" ||
  fail "client kill did not tear the client down once"
err=$(ctl client kill 999999 2>&1); [ $? -eq 1 ] && [[ $err == *"no client with pid 999999"* ]] ||
  fail "client kill of no client: '$err'"
kill_group "$victim"

# --- bad arguments -------------------------------------------------------------
for args in "res show bogus" "dev show droce9" "stat show qp x" "client kill" "frob" "--pid 0 dev" "dev list extra"; do
  # shellcheck disable=SC2086
  err=$(ctl $args 2>&1 >/dev/null); rc=$?
  [ "$rc" -eq 2 ] && [ "$(printf '%s\n' "$err" | wc -l)" -eq 1 ] && [[ $err == "droce ctl: "* ]] ||
    fail "droce ctl $args: exit $rc, '$err' (want one line, exit 2)"
done
"$launcher" ctl --socket "$dir/none.sock" dev >/dev/null 2>&1; [ $? -eq 1 ] || fail "no daemon: want exit 1"

# --- embedded, DROCE_CTL=1 -------------------------------------------------------
t_bg "$dir/embedded.log" 30 env DROCE_CTL=1 "$launcher" exec -- "$rc_pingpong" -g 0 -p 18622
embedded=$last_pid
epid=""
for _ in $(seq 1 100); do
  epid=$(pgrep -P "$embedded" -x ibv_rc_pingpong) &&
    "$launcher" ctl --pid "$epid" -j res show qp 2>/dev/null | py "assert len(j) == 1" 2>/dev/null && break
  sleep 0.05
done
"$launcher" ctl --pid "$epid" -j res show qp | py "assert j[0]['pid'] == $epid and j[0]['type'] == 'RC', j" ||
  fail "embedded res show qp"
"$launcher" ctl --pid "$epid" -j client show | py "assert [c['pid'] for c in j] == [$epid], j" ||
  fail "embedded client show"
"$launcher" ctl --pid "$epid" -j stat show | py "assert j[0]['ifname'] == 'droce0', j" || fail "embedded stat show"
"$launcher" ctl --pid "$epid" client kill "$epid" >/dev/null 2>&1; [ $? -eq 1 ] || fail "embedded client kill: want 1"
kill_group "$embedded"
# Killed by a signal, it could not remove its (empty) EAL runtime directory.
rmdir "/var/run/dpdk/droce-$epid" 2>/dev/null

stop_daemons
[ "$fail" -eq 0 ] || exit 1
echo "PASS"
