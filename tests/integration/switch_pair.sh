#!/usr/bin/env bash
# droce-switch (tools/droce_switch/): ib_write_bw between
# two droce processes through a live congested switch port. The switch is the
# memif server of two links; the perftest server and client connect to it as
# memif clients. Its egress port toward the server runs at 2 Gb/s with RED/ECN
# (Kmin 10 KB, Kmax 100 KB, Pmax 20 %): it must mark, the server's QP must
# answer with CNPs (np_cnp_sent), the client's DCQCN must act on them
# (rp_cnp_handled), and the bandwidth must stay at or below the bottleneck.
# Then two flows share the bottleneck: two ib_write_bw servers as clients of
# one droced behind the switch's port 0, two senders on ports 1 and 2, with
# DCQCN at the paper's time constants (docs/LAB.md) and a 4 MB buffer: no
# drops, the two rates within 20 % of each other, their sum at most the
# bottleneck.
#
# usage: switch_pair.sh LAUNCHER DROCE_SWITCH IB_WRITE_BW DROCED
# Every process is bounded by `timeout` and killed on exit.
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 4 4 "LAUNCHER DROCE_SWITCH IB_WRITE_BW DROCED"
launcher=$1
switch=$2
program=$3
T_DROCED=$4 T_DROCED_TIMEOUT=60  # start_droced's
t_launcher "$launcher"
require_program "$program" perftest
t_setup switch 30

t_bg "$dir/switch.log" 60 "$switch" --port "$dir/a.sock" --port "$dir/b.sock" --rate 2gbit \
  --kmin 10000 --kmax 100000 --pmax 0.2 --duration 30
sw=$last_pid
for _ in $(seq 1 50); do
  [ -S "$dir/a.sock" ] && [ -S "$dir/b.sock" ] && break
  sleep 0.1
done
[ -S "$dir/a.sock" ] && [ -S "$dir/b.sock" ] || fail "the switch made no sockets"

port=$(( 20000 + RANDOM % 20000 ))
t_bg "$dir/server.log" 60 env DROCE_STATS=1 "$launcher" exec --link "net_memif0,role=client,socket=$dir/a.sock,socket-abstract=no" \
  --ip 10.78.0.1/24 -- "$program" -s 65536 -D 4 --report_gbits -p "$port"
srv=$last_pid
wait_tcp_listen "$port"
DROCE_STATS=1 timeout 60 "$launcher" exec --link "net_memif0,role=client,socket=$dir/b.sock,socket-abstract=no" \
  --ip 10.78.0.2/24 -- "$program" -s 65536 -D 4 --report_gbits -p "$port" 127.0.0.1 >"$dir/client.log" 2>&1
crc=$?
wait "$srv"
src=$?
kill -TERM "$sw" 2>/dev/null
wait "$sw"
[ "$crc" -eq 0 ] && [ "$src" -eq 0 ] || fail "ib_write_bw: client $crc, server $src"

bw=$(awk '$1 == 65536 && NF >= 4 { print $4 }' "$dir/client.log" | tail -n1)
np_sent=$(stat_of "$dir/server.log" np_cnp_sent)
np_marked=$(stat_of "$dir/server.log" np_ecn_marked_roce_packets)
rp_handled=$(stat_of "$dir/client.log" rp_cnp_handled)
marked=$(sed -nE 's/.*port 0 .* marked ([0-9]+),.*/\1/p' "$dir/switch.log")
grep -E "^droce-switch:" "$dir/switch.log" | sed 's/^/[switch] /'
echo "[client] BW average ${bw:-?} Gb/s, rp_cnp_handled ${rp_handled:-0}; [server] np_ecn_marked_roce_packets ${np_marked:-0}, np_cnp_sent ${np_sent:-0}"
[ -n "$bw" ] || fail "no bandwidth line from ib_write_bw"
[ -n "$marked" ] && [ "$marked" -gt 0 ] || fail "the switch marked nothing"
[ "${np_marked:-0}" -gt 0 ] && [ "${np_marked:-0}" -le "$marked" ] || fail "the server counted ${np_marked:-0} CE packets, the switch marked $marked"
[ "${np_sent:-0}" -gt 0 ] || fail "the server sent no CNP"
[ "${rp_handled:-0}" -gt 0 ] && [ "${rp_handled:-0}" -le "${np_sent:-0}" ] || fail "the client handled ${rp_handled:-0} of ${np_sent:-0} CNPs"
# Payload at most the bottleneck's 2 Gb/s of frames (1082-byte frames carry
# 1024 payload bytes), and not starved.
awk -v b="$bw" 'BEGIN { exit !(b <= 2.0 * 1024 / 1082 * 1.02 && b > 0.2) }' || fail "BW $bw Gb/s through a 2 Gb/s bottleneck"
one="$bw Gb/s, $marked marked, $np_sent CNPs, $rp_handled handled by DCQCN"

# 2. Two flows through one bottleneck.
tuned=min_time_between_cnps=30,rate_reduce_monitor_period=50,clamp_tgt_rate=1,rpg_byte_reset=0,rpg_time_reset=55
t_bg "$dir/switch2.log" 60 "$switch" --port "$dir/r.sock" --port "$dir/s1.sock" --port "$dir/s2.sock" --rate 2gbit \
  --kmin 10000 --kmax 100000 --pmax 0.2 --buffer 4194304 --duration 40
sw=$last_pid
for _ in $(seq 1 50); do [ -S "$dir/s2.sock" ] && break; sleep 0.1; done
# droced on $dir/d.sock, its log $dir/d.log.
start_droced d --dcqcn "$tuned" --link "net_memif0,role=client,socket=$dir/r.sock,socket-abstract=no" --ip 10.78.0.1/24
dp=$last_pid
p1=$(( 20000 + RANDOM % 10000 ))
p2=$(( p1 + 1 ))
for p in "$p1" "$p2"; do
  t_bg "$dir/server_$p.log" 60 "$launcher" exec --daemon "$dir/d.sock" -- "$program" -s 65536 -D 6 --report_gbits -p "$p"
done
wait_tcp_listen "$p1"
wait_tcp_listen "$p2"
t_bg "$dir/client1.log" 60 env DROCE_STATS=1 "$launcher" exec --link "net_memif0,role=client,socket=$dir/s1.sock,socket-abstract=no" \
  --ip 10.78.0.2/24 --dcqcn "$tuned" -- "$program" -s 65536 -D 6 --report_gbits -p "$p1" 127.0.0.1
c1=$last_pid
t_bg "$dir/client2.log" 60 env DROCE_STATS=1 "$launcher" exec --link "net_memif0,role=client,socket=$dir/s2.sock,socket-abstract=no" \
  --ip 10.78.0.3/24 --dcqcn "$tuned" -- "$program" -s 65536 -D 6 --report_gbits -p "$p2" 127.0.0.1
c2=$last_pid
wait "$c1"
rc1=$?
wait "$c2"
rc2=$?
[ "$rc1" -eq 0 ] && [ "$rc2" -eq 0 ] || fail "two flows: clients exited $rc1 and $rc2"
kill -TERM "$sw" "$dp" 2>/dev/null
wait "$sw" "$dp"
bw1=$(awk '$1 == 65536 && NF >= 4 { print $4 }' "$dir/client1.log" | tail -n1)
bw2=$(awk '$1 == 65536 && NF >= 4 { print $4 }' "$dir/client2.log" | tail -n1)
dropped=$(sed -nE 's/.*port 0 .* dropped ([0-9]+);.*/\1/p' "$dir/switch2.log")
grep -E "^droce-switch: port 0" "$dir/switch2.log" | sed 's/^/[switch] /'
echo "[two flows] ${bw1:-?} and ${bw2:-?} Gb/s, dropped ${dropped:-?}"
[ -n "$bw1" ] && [ -n "$bw2" ] || fail "two flows: no bandwidth lines"
[ "${dropped:-1}" -eq 0 ] || fail "two flows: the 4 MB buffer dropped $dropped frames"
awk -v a="$bw1" -v b="$bw2" 'BEGIN { exit !(a > 0.2 && b > 0.2 && a <= 1.2 * b && b <= 1.2 * a && a + b <= 2.0 * 1024 / 1082 * 1.02) }' ||
  fail "two flows: $bw1 and $bw2 Gb/s through a 2 Gb/s bottleneck"
echo "PASS: ib_write_bw through droce-switch at 2 Gb/s: $one; two flows: $bw1 + $bw2 Gb/s, no drops"
