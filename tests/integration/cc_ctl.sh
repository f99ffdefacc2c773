#!/usr/bin/env bash
# Congestion control operated at run time (`droce ctl cc`, src/admin/query.cc
# CcCmd; src/cc/dcqcn.h): ib_write_bw -s 65536 between two processes over
# memif, both with DROCE_CTL=1 and DROCE_STATS=1, the server's engine marking
# CE on 2 % of the ECN-capable frames it receives (`--fault 'rx loss random
# 2% ecn'`), so that its QP (the notification point) sends CNPs to the
# client's (the reaction point). While it runs, on the client:
#
#   1. `cc show -j`: the QP is "dcqcn" and DCQCN cuts its rate (cuts > 0,
#      limited or under the line rate); `cc [show] [dev D] qpn N` its row
#      alone; the server's QP (not a reaction point) never cut;
#   2. `cc set off`: the QP and the device row say "off"; `cc set dcqcn
#      rpg_ai_rate=10`: back on, the parameter in the device row's list;
#      `cc set qpn N off|dcqcn` changes that QP alone.
#   3. `cc set rpg_nonsense=1` fails (exit != 0) naming the parameter.
#
# After the run: the client's DROCE_STATS report handled (or, while off,
# ignored) CNPs, the server's np_cnp_sent > 0.
#
# usage: cc_ctl.sh LAUNCHER IB_WRITE_BW
# Exit 77 (skip) if ib_write_bw is not installed.
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 2 2 "LAUNCHER IB_WRITE_BW"
launcher=$1
write_bw=$2
t_launcher "$launcher"
require_program "$write_bw" perftest
t_setup cc-ctl
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU DROCE_FAULT DROCE_CAPTURE DROCE_CTL DROCE_STATS DROCE_CC DROCE_DCQCN DROCE_TRACE
logs() {
  echo "--- server log"; cat "$dir/server.log"
  echo "--- client log"; cat "$dir/client.log"
}

seconds=10
port=$(( 20000 + RANDOM % 20000 ))
sock="$dir/memif.sock"
program=$(basename "$write_bw")

# program_of TIMEOUT_PID: the perftest under that `timeout` (the --pid for
# droce ctl) once it answers `droce ctl`; empty after 10 s.
program_of() {
  local p
  for _ in $(seq 1 100); do
    p=$(pgrep -P "$1" -x "$program" | head -n1)
    [ -n "$p" ] && "$launcher" ctl --pid "$p" dev show >/dev/null 2>&1 && { echo "$p"; return 0; }
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  return 1
}

t_bg "$dir/server.log" 60 env DROCE_CTL=1 DROCE_STATS=1 "$launcher" exec \
  --link "net_memif0,role=server,socket=$sock,socket-abstract=no" --ip 10.77.3.1/24 \
  --fault 'rx loss random 2% ecn' -- \
  "$write_bw" -s 65536 -D "$seconds" -p "$port"
server_pid=$last_pid
server=$(program_of "$server_pid") || { logs; fail "the $program server does not answer droce ctl"; }
wait_tcp_listen "$port" || { logs; fail "the $program server does not listen on $port"; }
t_bg "$dir/client.log" 60 env DROCE_CTL=1 DROCE_STATS=1 "$launcher" exec \
  --link "net_memif0,role=client,socket=$sock,socket-abstract=no" --ip 10.77.3.2/24 -- \
  "$write_bw" -s 65536 -D "$seconds" -p "$port" 127.0.0.1
client_pid=$last_pid
client=$(program_of "$client_pid") || { logs; fail "the $program client does not answer droce ctl"; }
ctl() { "$launcher" ctl --pid "$client" "$@"; }

# jq-free JSON checks (as ctl_live.sh): py EXPR with `j` the JSON on stdin;
# `qps` are its QP rows, `devs` its device rows.
py() {
  /usr/bin/python3 -c "import json,sys; j=json.load(sys.stdin); qps=[r for r in j if 'lqpn' in r]; devs=[r for r in j if 'lqpn' not in r]; $1"
}

# 1. The client's QP under DCQCN, cut by the server's CNPs. Polled (up to
# about 20 s): the QP exists once perftest has connected, the cuts come with
# the traffic.
t0=$(date +%s%N)
row=""
for _ in $(seq 1 200); do
  row=$(ctl -j cc show 2>/dev/null | py "m = [r for r in qps if r['cc'] == 'dcqcn' and r['cuts'] > 0 and (r['limited'] or r['rate_mbps'] < 25000)]
if m: print(m[0]['lqpn'], m[0]['cuts'], str(m[0]['limited']).lower(), round(m[0]['rate_mbps']))" 2>/dev/null)
  [ -n "$row" ] && break
  kill -0 "$client_pid" 2>/dev/null || break
  sleep 0.1
done
[ -n "$row" ] || { ctl cc show; logs; fail "the client's QP shows no DCQCN cut: $(ctl -j cc show)"; }
waited=$(( ($(date +%s%N) - t0) / 1000000 ))
read -r lqpn cuts limited rate <<<"$row"
echo "[cc show] $(ctl cc show | tr '\n' '|')"
echo "[cc show -j] $(ctl -j cc show)"
# The filters, with or without "show": the QP's row alone.
for words in "show qpn $lqpn" "qpn $lqpn" "show dev droce0 qpn $lqpn" "dev droce0 qpn $lqpn"; do
  # shellcheck disable=SC2086  # the words are split on purpose
  out=$(ctl cc $words 2>&1) || fail "cc $words: $out"
  [ "$(wc -l <<<"$out")" -eq 1 ] && [[ $out == "dev droce0 lqpn $lqpn cc dcqcn "* ]] || fail "cc $words: '$out'"
done

# 2. Off, then back on with a parameter.
out=$(ctl cc set off 2>&1) || fail "cc set off: $out"
echo "[cc set off] $(tr '\n' '|' <<<"$out")"
show=$(ctl -j cc show)
py "sys.exit(not (devs and all(r['cc'] == 'off' for r in devs) and [r['cc'] for r in qps if r['lqpn'] == $lqpn] == ['off']))" \
  <<<"$show" || fail "after cc set off, the QP $lqpn and the device row are not off: $show"
sleep 1  # off for a while: CNPs still in flight are ignored
out=$(ctl cc set dcqcn rpg_ai_rate=10 2>&1) || fail "cc set dcqcn rpg_ai_rate=10: $out"
show=$(ctl -j cc show)
echo "[cc set dcqcn rpg_ai_rate=10] $show"
py "sys.exit(not (devs and all(r['cc'] == 'dcqcn' and 'rpg_ai_rate=10' in r['dcqcn'].split(',') for r in devs)))" \
  <<<"$show" || fail "after cc set dcqcn rpg_ai_rate=10, the device row is: $show"
py "sys.exit([r['cc'] for r in qps if r['lqpn'] == $lqpn] != ['dcqcn'])" <<<"$show" ||
  fail "after cc set dcqcn, the QP $lqpn is not dcqcn: $show"

# One QP alone: off while the device stays dcqcn, then on again.
out=$(ctl cc set qpn "$lqpn" off 2>&1) || fail "cc set qpn $lqpn off: $out"
show=$(ctl -j cc show)
py "sys.exit(not (all(r['cc'] == 'dcqcn' for r in devs) and [r['cc'] for r in qps if r['lqpn'] == $lqpn] == ['off']))" \
  <<<"$show" || fail "after cc set qpn $lqpn off: $show"
out=$(ctl cc set qpn "$lqpn" dcqcn 2>&1) || fail "cc set qpn $lqpn dcqcn: $out"
py "sys.exit([r['cc'] for r in qps if r['lqpn'] == $lqpn] != ['dcqcn'])" <<<"$(ctl -j cc show)" ||
  fail "after cc set qpn $lqpn dcqcn, the QP is not dcqcn"

# The server's QP is a notification point only: no CNP comes to it.
show=$("$launcher" ctl --pid "$server" -j cc show)
echo "[server cc show -j] $show"
py "sys.exit(not (qps and all(r['cc'] == 'dcqcn' and r['cuts'] == 0 for r in qps)))" <<<"$show" ||
  fail "the server's QP should be dcqcn and never cut: $show"

# 3. A parameter that does not exist.
out=$(ctl cc set rpg_nonsense=1 2>&1); rc=$?
echo "[cc set rpg_nonsense=1] exit $rc: $out"
[ "$rc" -ne 0 ] && [[ $out == *rpg_nonsense* ]] || fail "a bad parameter: rc $rc, '$out'"
show=$(ctl -j cc show)
py "sys.exit(not all('rpg_ai_rate=10' in r['dcqcn'].split(',') for r in devs))" <<<"$show" ||
  fail "a refused cc set changed the parameters: $show"

# 4. The run's end and the counters reported at close.
wait "$client_pid"
client_rc=$?
server_rc=255
end_server "$server_pid"
[ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] || { logs; fail "$program: server $server_rc, client $client_rc"; }
handled=$(stat_of "$dir/client.log" rp_cnp_handled)
ignored=$(stat_of "$dir/client.log" rp_cnp_ignored)
sent=$(stat_of "$dir/server.log" np_cnp_sent)
marked=$(stat_of "$dir/server.log" np_ecn_marked_roce_packets)
echo "[client] rp_cnp_handled ${handled:-none} rp_cnp_ignored ${ignored:-none};" \
  "[server] np_ecn_marked_roce_packets ${marked:-none} np_cnp_sent ${sent:-none}"
[ -n "$sent" ] && [ "$sent" -gt 0 ] || { logs; fail "the server sent no CNP"; }
[ $(( ${handled:-0} + ${ignored:-0} )) -gt 0 ] || { logs; fail "the client neither handled nor ignored a CNP"; }
[ $(( ${handled:-0} + ${ignored:-0} )) -le "$sent" ] ||
  { logs; fail "the client counted $(( ${handled:-0} + ${ignored:-0} )) CNPs, the server sent $sent"; }
bw=$(awk '$1 == 65536 && NF >= 4 { print $4; exit }' "$dir/client.log")
echo "PASS: ib_write_bw ${bw:-?} MB/s through 2 % CE marks: the client's QP $lqpn cut $cuts times within $waited ms" \
  "(limited $limited, rate $rate Mb/s); cc set off / dcqcn rpg_ai_rate=10 shown, rpg_nonsense refused;" \
  "CNPs: server sent $sent, client handled ${handled:-0} ignored ${ignored:-0}"
