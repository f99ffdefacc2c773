#!/usr/bin/env bash
# Adaptive retransmission on a live link (DROCE_ADP_RETRANS,
# docs/LAB.md "Adaptive retransmission"): perftest's ib_write_lat
# between two processes over memif, the client's fault rule dropping 2 % of
# its RDMA WRITEs. In a ping-pong every lost WRITE is a tail loss: no later
# packet makes the responder NAK, so only a timer repairs it.
#
#   1. Off (the default): each loss waits for the QP's local ACK timeout
#      (perftest's timeout 14, 67 ms): local_ack_timeout_err (droce's
#      completer_retry_err) at least the rule's dropped count.
#   2. On at both ends: every loss is resent by the adaptive timer
#      (roce_adp_retrans at least the dropped count) and none waits for the
#      ACK timeout (completer_retry_err and roce_adp_retrans_to 0).
# The run times are printed, not checked.
#
# usage: adp_pair.sh LAUNCHER IB_WRITE_LAT
# Every process is bounded by `timeout` and killed on exit.
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 2 2 "LAUNCHER IB_WRITE_LAT"
launcher=$1
perftest=$2
t_launcher "$launcher"
require_program "$perftest" perftest
t_setup adp 40
clear_droce_env

rule='opcode rc_write_only loss random 2% seed 7'
iters=2000

# run NAME ADP: ib_write_lat server and client, both with
# DROCE_ADP_RETRANS=ADP, the client dropping with $rule; logs in
# $dir/NAME.{server,client}.log; the client's wall time in $secs.
run() {
  local name=$1 adp=$2
  local port=$(( 20000 + RANDOM % 20000 ))
  rm -f "$dir/m.sock"
  t_bg "$dir/$name.server.log" 120 env DROCE_ADP_RETRANS="$adp" DROCE_STATS=1 "$launcher" exec \
    --link "net_memif0,role=server,socket=$dir/m.sock,socket-abstract=no" --ip 10.79.2.1/24 \
    -- "$perftest" -s 2 -n "$iters" -p "$port"
  local srv=$last_pid
  wait_tcp_listen "$port" || fail "$name: the server did not listen"
  local t0 t1
  t0=$(date +%s%N)
  DROCE_ADP_RETRANS=$adp DROCE_STATS=1 DROCE_FAULT=$rule timeout 120 "$launcher" exec \
    --link "net_memif0,role=client,socket=$dir/m.sock,socket-abstract=no" --ip 10.79.2.2/24 \
    -- "$perftest" -s 2 -n "$iters" -p "$port" 127.0.0.1 >"$dir/$name.client.log" 2>&1
  local crc=$?
  t1=$(date +%s%N)
  wait "$srv"
  local src=$?
  [ "$crc" -eq 0 ] || fail "$name: the client exited with $crc"
  [ "$src" -eq 0 ] || fail "$name: the server exited with $src"
  secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.2f", (b - a) / 1e9 }')
}

# report NAME: prints the run's figures; sets lost, adp, adp_to, to.
report() {
  local c="$dir/$1.client.log"
  lost=$(fault_dropped "$c")
  adp=$(stat_of "$c" roce_adp_retrans); adp=${adp:-0}
  adp_to=$(stat_of "$c" roce_adp_retrans_to); adp_to=${adp_to:-0}
  to=$(stat_of "$c" completer_retry_err); to=${to:-0}
  [ -n "$lost" ] && [ "$lost" -gt 0 ] || fail "$1: the rule dropped ${lost:-nothing}"
  echo "[$1] $iters iterations in ${secs}s; WRITEs dropped $lost, ACK timeouts $to," \
       "adaptive resends $adp, adaptive then timeout $adp_to; $(grep -E '^ *2 +[0-9]' "$c" | awk '{print "t_typical " $5 " us, p99 " $8 " us"}')"
}

run off off
report off
[ "$adp" -eq 0 ] || fail "off: $adp adaptive resends with adaptive retransmission off"
[ "$to" -ge "$lost" ] || fail "off: $to ACK timeouts for $lost tail losses"

# DROCE_STATS=1 ends with the link's own counters (the PMD's rte_eth_stats).
link=$(grep -m1 -E "^droce: droce0 link rx_packets [0-9]+ " "$dir/off.client.log")
[ -n "$link" ] || fail "off: no link counters in the client's DROCE_STATS report"
rx=$(echo "$link" | sed -nE 's/.* rx_packets ([0-9]+) .*/\1/p')
# The memif PMD starts its counters again when its link goes down, which it
# does when the server exits first (link_downed); droce carries them on from
# its last link poll (every 100 ms), so then they may miss the end of the run.
downed=$(grep -m1 -E "^droce: +link_downed +[0-9]+" "$dir/off.client.log" | awk '{print $3}')
if [ "${downed:-0}" -eq 0 ]; then
  [ "$rx" -gt "$iters" ] || fail "off: the link says it received $rx frames for $iters iterations: $link"
fi
echo "[off] client ${link#droce: }"

run on "on,min=500us,init=1ms"
report on
[ "$adp" -ge "$lost" ] || fail "on: $adp adaptive resends for $lost tail losses"
[ "$to" -eq 0 ] || fail "on: $to losses waited for the 67 ms ACK timeout"
[ "$adp_to" -eq 0 ] || fail "on: roce_adp_retrans_to $adp_to"
echo "PASS: adaptive retransmission over memif: every tail loss resent by the round-trip timer, none waited for the ACK timeout"
