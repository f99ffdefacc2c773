#!/usr/bin/env bash
# The per-QP event trace (src/lab/trace.h, docs/LAB.md) between two processes
# over memif:
#
#   1. From the start (DROCE_TRACE): ibv_rc_pingpong -c, the server's engine
#      losing 5 % of what it sends; the server traces as JSON lines, the
#      client as CSV. Every JSON line parses; each side's tx and rx events are
#      as many as its sent_pkts and rcvd_pkts counters (DROCE_STATS), its NAK
#      events as rcvd_seq_err, its timeouts as completer_retry_err, and every
#      NAK or timeout is followed by a retransmit; each QP goes INIT, RTR, RTS.
#   2. While ib_send_bw runs (`droce ctl --pid P trace ...`, DROCE_CTL=1): a
#      CSV trace started and stopped, a binary one (clock=turn: events of
#      a turn share its time) printed by `droce
#      trace-dump`, and the refusals (a second trace, a bad format, stop
#      without one).
#
# usage: trace_pair.sh LAUNCHER IBV_RC_PINGPONG IB_SEND_BW
# shellcheck disable=SC2317  # stop_ctl_pair runs from the exit trap
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 3 3 "LAUNCHER IBV_RC_PINGPONG IB_SEND_BW"
launcher=$1
pingpong=$2
send_bw=$3
t_launcher "$launcher"
require_program "$pingpong" ibverbs-utils
require_program "$send_bw" perftest
require_program /usr/bin/python3
here=$(dirname "$0")
t_setup trace
server_pid=""
client_pid=""
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU DROCE_FAULT DROCE_CAPTURE DROCE_TRACE DROCE_CTL

# 1. From the start.
mkdir -p "$dir/start"
if ! DROCE_FAULT='loss random 5%' DROCE_STATS=1 DROCE_TRACE="$dir/start/server.json" \
     DROCE_TEST_CLIENT_ENV="DROCE_FAULT= DROCE_TRACE=$dir/start/client.csv,format=csv" DROCE_TEST_LOG_DIR="$dir/start" \
     bash "$here/pingpong_pair.sh" "$launcher" "$pingpong" -g 0 -n 200 -s 4096 -c; then
  fail "rc_pingpong -c through 5 % loss with traces on both sides"
fi
# The JSON lines as CSV rows (event,state,nak), so that both sides are
# checked by the same counting below.
/usr/bin/python3 - "$dir/start/server.json" "$dir/start/server.rows" <<'EOF' || fail "the server's trace is not JSON lines"
import json, sys
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for n, line in enumerate(f, 1):
        e = json.loads(line)
        for k in ("time_ns", "dev", "qpn", "event"):
            if k not in e:
                sys.exit(f"line {n}: no '{k}': {line}")
        out.write(f"{e['event']},{e.get('state', '')},{e.get('nak', '')}\n")
EOF
awk -F, 'NR > 1 { print $4 "," ($4 == "state" ? substr($7, 7) : "") "," ($4 == "nak" ? substr($7, 5) : "") }' \
  "$dir/start/client.csv" >"$dir/start/client.rows"
[ "$(head -n1 "$dir/start/client.csv")" = "time_ns,dev,qpn,event,opcode,psn,detail,bytes" ] || fail "the CSV header"
events() { awk -F, -v e="$2" '$1 == e { n++ } END { print n + 0 }' "$1"; }
for side in server client; do
  rows="$dir/start/$side.rows"
  log="$dir/start/$side.log"
  tx=$(events "$rows" tx); rx=$(events "$rows" rx); nak=$(events "$rows" nak); to=$(events "$rows" timeout)
  re=$(events "$rows" retransmit)
  sent=$(stat_of "$log" sent_pkts); rcvd=$(stat_of "$log" rcvd_pkts)
  seq=$(stat_of "$log" rcvd_seq_err); retry=$(stat_of "$log" completer_retry_err)
  echo "[$side] trace: tx $tx rx $rx nak $nak timeout $to retransmit $re; counters: sent_pkts $sent rcvd_pkts $rcvd" \
    "rcvd_seq_err ${seq:-0} completer_retry_err ${retry:-0}"
  [ -n "$sent" ] && [ -n "$rcvd" ] || { cat "$log"; fail "$side: no DROCE_STATS counters"; }
  [ "$tx" -eq "$sent" ] || fail "$side: $tx tx events, sent_pkts $sent"
  [ "$rx" -eq "$rcvd" ] || fail "$side: $rx rx events, rcvd_pkts $rcvd"
  [ "$nak" -eq "${seq:-0}" ] || fail "$side: $nak NAK events, rcvd_seq_err ${seq:-0}"
  [ "$to" -eq "${retry:-0}" ] || fail "$side: $to timeouts, completer_retry_err ${retry:-0}"
  [ "$re" -ge $(( nak + to )) ] || fail "$side: $re retransmits for $nak NAKs and $to timeouts"
  states=$(awk -F, '$1 == "state" { printf "%s ", $2 }' "$rows")
  [[ $states == "INIT RTR RTS "* ]] || fail "$side: states '$states'"
done
# Loss on the server's frames: the client saw NAKs or timed out.
[ $(( $(events "$dir/start/client.rows" nak) + $(events "$dir/start/client.rows" timeout) )) -gt 0 ] ||
  fail "5 % loss left no NAK or timeout in the client's trace"

# 2. While ib_send_bw runs.
start_ctl_pair "$launcher" "$send_bw" 10 "$dir" || fail "ib_send_bw with DROCE_CTL=1"
pid=$ctl_pid
ctl() { "$launcher" ctl --pid "$pid" "$@"; }
sleep 3
[ "$(ctl trace show)" = "dev droce0 state off" ] || fail "trace show before any: $(ctl trace show)"
ctl trace start "$dir/live.csv" format csv >/dev/null || fail "trace start"
out=$(ctl trace start "$dir/other.csv" 2>&1); rc=$?
[ "$rc" -eq 1 ] && [[ $out == *"is on: stop it first"* ]] || fail "a second trace: rc $rc, '$out'"
sleep 0.5
show=$(ctl -j trace show)
echo "[trace show] $show"
[[ $show =~ \"events\":([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -gt 1000 ] || fail "a running trace wrote too little: $show"
ctl trace stop | grep -q 'state stopped' || fail "trace stop"
out=$(ctl trace stop 2>&1); rc=$?
[ "$rc" -eq 1 ] && [ "$out" = "droce ctl: no trace is on" ] || fail "stop without a trace: rc $rc, '$out'"
lines=$(wc -l <"$dir/live.csv")
[ "$lines" -gt 1000 ] || fail "live.csv has $lines lines"
[ "$(awk -F, 'NR > 1 && $4 == "rx" { n++ } END { print n + 0 }' "$dir/live.csv")" -gt 1000 ] ||
  fail "the live trace has no rx events"
# The binary one with clock=turn: events of one engine turn share its time.
ctl trace start "$dir/live.bin" format binary clock turn >/dev/null || fail "trace start (binary, clock turn)"
sleep 0.5
ctl trace stop >/dev/null || fail "trace stop (binary)"
# The refusals while the run surely lasts; the binary trace is read after.
out=$(ctl trace start "$dir/x.trace" format xml 2>&1); rc=$?
[ "$rc" -eq 2 ] && [ "$out" = "droce ctl: 'format' is json, csv or binary, not 'xml'" ] ||
  fail "a bad format: rc $rc, '$out'"
[ ! -e "$dir/x.trace" ] || fail "a refused trace created its file"
"$launcher" trace-dump "$dir/live.bin" >"$dir/live.json" || fail "trace-dump"
/usr/bin/python3 -c '
import json, sys
n = 0
times = set()
for line in open(sys.argv[1]):
    e = json.loads(line); n += 1
    assert e["dev"] == "droce0" and e["event"] in ("tx", "rx", "ack", "nak", "rnr", "retransmit", "timeout", "state"), line
    times.add(e["time_ns"])
assert n > 1000, n
# A turn takes up to 32 received frames: far fewer times than events.
assert len(times) * 2 < n, (len(times), n)
print("[trace-dump]", n, "events at", len(times), "turn times (clock=turn)")
' "$dir/live.json" || fail "trace-dump's JSON"
wait "$client_pid"
client_rc=$?
client_pid=""
end_server "$server_pid"
server_pid=""
[ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] ||
  { cat "$dir/ctl_server.log" "$dir/ctl_client.log"; fail "ib_send_bw: server $server_rc, client $client_rc"; }
echo "PASS: traces from the start match the counters on both sides; live CSV and binary traces ($lines lines)"
