#!/usr/bin/env bash
# Engine stalls on a live link (engine_stalls, engine_stalled_us;
# engine/stall_meter.h, docs/COUNTERS.md): perftest's ib_write_bw between
# two processes over memif, the server's whole process stopped (SIGSTOP)
# for STOP_MS in the middle of the run, as a hypervisor freezes a virtual
# CPU or a busy host keeps a process off its CPU.
#
#   - the server counts the stall: engine_stalls at least 1, engine_stalled_us
#     at least the stop less 10 %;
#   - the client meanwhile reaches perftest's local ACK timeout (timeout 14,
#     67 ms): completer_retry_err at least 1;
#   - the flow goes on afterwards: both programs exit 0.
#
# usage: stall_pair.sh LAUNCHER IB_WRITE_BW
# Every process is bounded by `timeout` and killed on exit.
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 2 2 "LAUNCHER IB_WRITE_BW"
launcher=$1
perftest=$2
t_launcher "$launcher"
require_program "$perftest" perftest
t_setup stall 40
clear_droce_env
srv=""
resume_server() { [ -n "$srv" ] && kill -CONT -- "-$srv" 2>/dev/null; }
on_exit resume_server  # a stopped group cannot take the TERM

stop_ms=300
port=$(( 20000 + RANDOM % 20000 ))
t_bg "$dir/server.log" 120 env DROCE_STATS=1 "$launcher" exec \
  --link "net_memif0,role=server,socket=$dir/m.sock,socket-abstract=no" --ip 10.79.3.1/24 \
  -- "$perftest" -s 65536 -D 3 -F -p "$port"
srv=$last_pid
wait_tcp_listen "$port" || fail "the server did not listen"
t_bg "$dir/client.log" 120 env DROCE_STATS=1 "$launcher" exec \
  --link "net_memif0,role=client,socket=$dir/m.sock,socket-abstract=no" --ip 10.79.3.2/24 \
  -- "$perftest" -s 65536 -D 3 -F -p "$port" 127.0.0.1
cli=$last_pid
# perftest's two seconds of warm-up and setup, then the stop, well inside
# its three measured seconds.
sleep 2.5
kill -STOP -- "-$srv" || fail "could not stop the server"
sleep "$(awk -v m="$stop_ms" 'BEGIN { print m / 1000 }')"
kill -CONT -- "-$srv"
wait "$cli"
crc=$?
wait "$srv"
src=$?
srv=""
[ "$crc" -eq 0 ] || fail "the client exited with $crc"
[ "$src" -eq 0 ] || fail "the server exited with $src"

stalls=$(stat_of "$dir/server.log" engine_stalls); stalls=${stalls:-0}
stalled=$(stat_of "$dir/server.log" engine_stalled_us); stalled=${stalled:-0}
to=$(stat_of "$dir/client.log" completer_retry_err); to=${to:-0}
cstalls=$(stat_of "$dir/client.log" engine_stalls)
echo "server stopped ${stop_ms} ms: server engine_stalls $stalls, engine_stalled_us $stalled;" \
     "client ACK timeouts $to, engine_stalls ${cstalls:-0}"
[ "$stalls" -ge 1 ] || fail "the server counted no engine stall"
[ "$stalled" -ge $(( stop_ms * 900 )) ] || fail "the server's stalls add up to $stalled us for a ${stop_ms} ms stop"
[ "$to" -ge 1 ] || fail "the client reached no ACK timeout while its peer was stopped ${stop_ms} ms"
echo "PASS: a stopped engine is counted as a stall by its own side; its peer timed out and the flow went on"
