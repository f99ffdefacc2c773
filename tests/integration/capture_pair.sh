#!/usr/bin/env bash
# The lab's capture (src/lab/capture.h, docs/LAB.md) on live links between two
# processes over memif:
#
#   1. From the start (DROCE_CAPTURE): ibv_rc_pingpong -c, the server's engine
#      losing 3 % of its frames each way (rules 1 and 2) and capturing before and after its
#      fault stage (point=both), the client capturing what it sends and
#      receives. tshark reads both files; on the server every frame the rule
#      dropped is in "droce0 tx" (or "droce0 rx wire") with the comment
#      "dropped by rule 1" (2) and missing from the other side of the stage, their
#      number is the rule's own count; the client's retransmissions are
#      commented; droce pcap-check accepts every ICRC.
#   2. While it runs (`droce ctl --pid P capture ...`, DROCE_CTL=1): ib_send_bw
#      with a capture of exactly 500 frames that ends by itself, a ring of two
#      64 KiB files, and the refusals (no file, bad size, a second capture).
#   3. Fault rules set and cleared while it runs (`droce ctl fault`): 1 % rx loss
#      counted by `fault show` near 1 %, the drops in a capture taken meanwhile,
#      no rules after `fault clear`, a bad rule refused with its reason.
#
# usage: capture_pair.sh LAUNCHER IBV_RC_PINGPONG IB_SEND_BW
# Exit 77 (skip) if a program is not installed.
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
require_program tshark tshark
here=$(dirname "$0")
t_setup capture
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU DROCE_FAULT DROCE_CAPTURE DROCE_CTL

# count FILE IFACE [REGEX]: frames of interface IFACE (whose comment matches
# REGEX) in tshark's "interface<TAB>comment" listing FILE.
count() {
  awk -F'\t' -v i="$2" -v re="${3:-}" '$1 == i && (re == "" || $2 ~ re) { n++ } END { print n + 0 }' "$1"
}
listing() {  # PCAPNG OUT
  tshark -r "$1" -T fields -e frame.interface_name -e frame.comment >"$2" 2>"$2.err" ||
    { cat "$2.err"; fail "tshark cannot read $1"; }
}

# 1. A capture from the start, with a fault stage.
mkdir -p "$dir/start"
if ! DROCE_FAULT='loss random 3%; rx loss random 3%' DROCE_STATS=1 DROCE_CAPTURE="$dir/start/server.pcapng,point=both" \
     DROCE_TEST_CLIENT_ENV="DROCE_FAULT= DROCE_CAPTURE=$dir/start/client.pcapng" DROCE_TEST_LOG_DIR="$dir/start" \
     bash "$here/pingpong_pair.sh" "$launcher" "$pingpong" -g 0 -n 300 -s 4096 -c; then
  fail "rc_pingpong -c through 3 % loss with captures on both sides"
fi
s="$dir/start/server.txt"
c="$dir/start/client.txt"
listing "$dir/start/server.pcapng" "$s"
listing "$dir/start/client.pcapng" "$c"
tx=$(count "$s" "droce0 tx"); txw=$(count "$s" "droce0 tx wire")
rxw=$(count "$s" "droce0 rx wire"); rx=$(count "$s" "droce0 rx")
dtx=$(count "$s" "droce0 tx" "dropped by rule 1"); drx=$(count "$s" "droce0 rx wire" "dropped by rule 2")
echo "[server capture] tx $tx (dropped $dtx), tx wire $txw, rx wire $rxw (dropped $drx), rx $rx"
[ "$tx" -gt 300 ] && [ "$rxw" -gt 300 ] || fail "the server's capture has too few frames"
[ "$dtx" -gt 0 ] && [ "$drx" -gt 0 ] || fail "no 'dropped by rule 1' (tx) or 'dropped by rule 2' (rx) comment"
# The stage's two sides differ by exactly the frames it dropped.
[ $(( tx - dtx )) -eq "$txw" ] || fail "tx: $tx before the stage, $dtx dropped, but $txw after it"
[ $(( rxw - drx )) -eq "$rx" ] || fail "rx: $rxw before the stage, $drx dropped, but $rx after it"
# The rule's own count (DROCE_STATS at close; the capture runs to exit, so it
# may see a frame or two more).
rule_dropped() {
  grep -E "fault rule $1 " "$dir/start/server.log" | sed -nE 's/.*, dropped ([0-9]+).*/\1/p' | head -n1
}
r1=$(rule_dropped 1); r2=$(rule_dropped 2)
[ -n "$r1" ] && [ -n "$r2" ] || { cat "$dir/start/server.log"; fail "no fault rule report from the server"; }
reported=$(( r1 + r2 ))
captured=$(( dtx + drx ))
echo "[server] rules 1 and 2 dropped $r1 + $r2; the capture commented $dtx + $drx"
[ "$captured" -ge "$reported" ] && [ $(( captured - reported )) -le 4 ] ||
  fail "the rule dropped $reported frames, the capture says $captured"
ctx=$(count "$c" "droce0 tx"); cre=$(count "$c" "droce0 tx" "^retransmission [0-9]+ of PSN [0-9]+$")
crx=$(count "$c" "droce0 rx"); cnak=$(count "$c" "droce0 rx" "^NAK \\(PSN sequence error\\): expected PSN [0-9]+$")
echo "[client capture] tx $ctx ($cre retransmissions), rx $crx ($cnak NAKs)"
[ "$cre" -gt 0 ] || fail "the client's capture shows no retransmission"
[ "$(count "$c" "droce0 tx wire")" -eq 0 ] || fail "a device without fault rules has a wire interface"
for f in server client; do
  "$launcher" pcap-check "$dir/start/$f.pcapng" >"$dir/start/$f.check" 2>&1 ||
    { cat "$dir/start/$f.check"; fail "pcap-check refused the $f's capture"; }
  echo "[$f] $(cat "$dir/start/$f.check")"
done

# 2. Captures started and stopped while ib_send_bw runs.
# Only the control calls happen while it runs; the files are read once it
# has ended (tshark is slow on a busy machine, and the run is bounded).
start_ctl_pair "$launcher" "$send_bw" 20 "$dir" || fail "ib_send_bw with DROCE_CTL=1"
pid=$ctl_pid
ctl() { "$launcher" ctl --pid "$pid" "$@"; }
sleep 3  # traffic flowing
ctl capture show | grep -q '^dev droce0 state off$' || fail "capture show before any: $(ctl capture show)"
ctl capture start "$dir/count.pcapng" count 500 || fail "capture start count 500"
out=$(ctl capture start "$dir/other.pcapng" 2>&1); rc=$?
[ "$rc" -eq 1 ] && [[ $out == *"is on: stop it first"* ]] || fail "a second capture: rc $rc, '$out'"
for _ in $(seq 1 50); do
  ctl capture show | grep -q 'state ended' && break
  sleep 0.1
done
show=$(ctl -j capture show)
echo "[capture show] $show"
[[ $show == *'"state":"ended"'* && $show == *'"frames":500'* && $show == *'"why":"frame count reached"'* ]] ||
  fail "the count capture did not end at 500 frames: $show"
ctl capture stop | grep -q 'state stopped' || fail "capture stop"
out=$(ctl capture stop 2>&1); rc=$?
[ "$rc" -eq 1 ] && [ "$out" = "droce ctl: no capture is on" ] || fail "stop without a capture: rc $rc, '$out'"
ctl capture start "$dir/ring.pcapng" size 64k files 2 >/dev/null || fail "capture start of a ring"
sleep 1
ring=$(ctl capture stop)
echo "[capture stop] $ring"
[[ $ring =~ files\ ([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge 3 ] || fail "the ring did not turn: $ring"
out=$(ctl capture start 2>&1); rc=$?
[ "$rc" -eq 2 ] && [ "$out" = "droce ctl: 'capture start' needs a FILE" ] || fail "start without a file: rc $rc, '$out'"
out=$(ctl capture start "$dir/x.pcapng" size 10 2>&1); rc=$?
[ "$rc" -eq 2 ] && [ "$out" = "droce ctl: 'size' is at least 4096 bytes (or 0: no limit)" ] ||
  fail "a bad size: rc $rc, '$out'"
[ ! -e "$dir/x.pcapng" ] || fail "a refused capture created its file"

# 3. Fault rules changed while it runs, and captured with their comments.
out=$(ctl fault show)
[ "$out" = "dev droce0 rules 0" ] || fail "fault show without rules: '$out'"
ctl fault set rx loss random 1% >/dev/null || fail "fault set"
sleep 1
show=$(ctl -j fault show)
echo "[fault show] $show"
[[ $show =~ \"matched\":([0-9]+),\"dropped\":([0-9]+) ]] || fail "fault show: $show"
matched=${BASH_REMATCH[1]}; dropped=${BASH_REMATCH[2]}
[ "$dropped" -gt 0 ] && [ $(( dropped * 100 )) -ge $(( matched / 2 )) ] && [ $(( dropped * 100 )) -le $(( matched * 2 )) ] ||
  fail "1 % loss set live dropped $dropped of $matched"
# The same counters in the Prometheus text (droce ctl metrics, the metrics
# endpoint): a series per rule, at least what fault show said a moment ago.
metrics=$(ctl metrics)
line=$(grep -E '^droce_fault_rule_dropped_total\{device="droce0",rule="1",text="rx loss random 1%"\} [0-9]+$' <<<"$metrics")
[ -n "$line" ] || fail "no fault rule series in the metrics: $(grep fault_rule <<<"$metrics" | head -n 3)"
echo "[metrics] $line"
[ "${line##* }" -ge "$dropped" ] || fail "metrics say ${line##* } dropped, fault show said $dropped before"
ctl capture start "$dir/fault.pcapng" count 3000 point both >/dev/null || fail "capture start with rules on"
for _ in $(seq 1 50); do
  ctl capture show | grep -q 'state ended' && break
  sleep 0.1
done
ctl capture stop >/dev/null || fail "capture stop (fault)"
ctl fault clear >/dev/null || fail "fault clear"
out=$(ctl fault show)
[ "$out" = "dev droce0 rules 0" ] || fail "fault show after clear: '$out'"
out=$(ctl fault set 'loss randum 1%' 2>&1); rc=$?
[ "$rc" -eq 2 ] && [[ $out == *"unknown loss model 'randum'"* ]] || fail "a bad rule: rc $rc, '$out'"
out=$(ctl fault frob 2>&1); rc=$?
[ "$rc" -eq 2 ] || fail "fault frob: rc $rc, '$out'"

wait "$client_pid"
client_rc=$?
end_server "$server_pid"
[ "$client_rc" -eq 0 ] && [ "$server_rc" -eq 0 ] ||
  { cat "$dir/ctl_server.log" "$dir/ctl_client.log"; fail "ib_send_bw: server $server_rc, client $client_rc"; }

# The files of part 2 and 3.
n=$(tshark -r "$dir/count.pcapng" 2>/dev/null | wc -l)
[ "$n" -eq 500 ] || fail "count.pcapng has $n frames, not 500"
"$launcher" pcap-check "$dir/count.pcapng" >/dev/null || fail "pcap-check refused count.pcapng"
for f in "$dir/ring.pcapng.0" "$dir/ring.pcapng.1"; do
  [ "$(stat -c %s "$f")" -le $(( 64 * 1024 + 70000 )) ] || fail "$f is larger than its bound"
  tshark -r "$f" >/dev/null 2>&1 || fail "tshark cannot read $f"
done
[ ! -e "$dir/ring.pcapng.2" ] || fail "a ring of two files wrote a third"
listing "$dir/fault.pcapng" "$dir/fault.txt"
ld=$(count "$dir/fault.txt" "droce0 rx wire" "^dropped by rule 1")
lw=$(count "$dir/fault.txt" "droce0 rx wire"); le=$(count "$dir/fault.txt" "droce0 rx")
echo "[live capture] rx wire $lw (dropped $ld), rx $le"
[ "$ld" -gt 0 ] || fail "a capture under a live rule shows no drop"
# The capture ends mid-burst: the last burst's engine side may be missing.
[ $(( lw - ld - le )) -ge 0 ] && [ $(( lw - ld - le )) -le 32 ] ||
  fail "rx: $lw before the stage, $ld dropped, $le after it"
echo "PASS: captures from the start (stage sides differ by the $captured dropped frames, rule count $reported)" \
  "and at run time (500-frame count, a ring of two files, refusals); live fault rules ($dropped of $matched)"
