#!/usr/bin/env bash
# A restart of droced: a client with objects waits while
# droced is stopped (SIGTERM) and started again on the same socket. The
# client must see IBV_EVENT_DEVICE_FATAL, get EIO from its posting verbs,
# destroy everything and close, then open droce0 again and move data
# byte-exact on the new daemon (daemon_restart.cc). Then the same with droced
# SIGKILLed instead. Every daemon stopped must stop with nothing left: no
# object or memory map, no socket file, no DPDK runtime directory of its
# own, nothing of droce's in /dev/shm; a starting one must sweep the runtime
# directories of dead processes (one planted, one of the killed droced).
#
# usage: daemon_restart.sh DROCED LAUNCHER DAEMON_RESTART
# shellcheck disable=SC2317  # remove_stale runs from the exit trap
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 3 3 "DROCED LAUNCHER DAEMON_RESTART"
droced=$1 launcher=$2 client=$3
t_launcher "$droced"
t_launcher "$launcher"
t_setup restart 30  # FAIL prints the last 30 lines of each log
sock=$dir/d.sock
dpid="" cpid="" stale=""
# Where EAL makes its runtime directories (as eal_create_runtime_dir does).
if [ "$(id -u)" = 0 ]; then eal_base=/var/run/dpdk; else eal_base=${XDG_RUNTIME_DIR:-/tmp}/dpdk; fi
# (The daemons and clients are t_bg's: their groups are killed at exit.)
remove_stale() { [ -n "$stale" ] && rm -rf -- "$stale"; return 0; }
on_exit remove_stale
droce_shm() { ls /dev/shm 2>/dev/null | grep -Ei 'droce|dpdk|rte|memif' | sort; }
shm_before=$(droce_shm)

# up_droced NAME: droced on $sock (log $dir/NAME.log); sets dpid (timeout)
# and dproc (droced itself). (Not lib.sh's start_droced: the starts on one
# socket, what they sweep and what they leave are what this test checks.)
up_droced() {
  t_bg "$dir/$1.log" 120 "$droced" --config /dev/null --socket "$sock" --ip 10.77.11.1/24
  dpid=$last_pid
  # (Its log, not the socket file: a killed droced's file is still there.)
  for _ in $(seq 1 200); do grep -q 'listening on' "$dir/$1.log" && break; sleep 0.05; done
  grep -q 'listening on' "$dir/$1.log" && [ -S "$sock" ] || fail "droced $1 did not listen"
  # (From /proc, not pgrep: under the sanitizer runs pgrep inherits the
  # ASan runtime through LD_PRELOAD and hangs.)
  dproc=""
  read -r dproc _ <"/proc/$dpid/task/$dpid/children"
  [ -n "$dproc" ] || fail "no droced process under timeout"
}
# stop_droced NAME: SIGTERM; it must exit 0 with nothing left.
stop_droced() {
  kill -TERM "$dpid"
  wait "$dpid"
  local rc=$?
  dpid=""
  [ "$rc" -eq 0 ] || fail "droced $1 exit $rc"
  grep -q 'stopped (clients 0 live.*objects 0, memory maps 0;' "$dir/$1.log" || fail "droced $1 left objects behind"
  [ ! -e "$sock" ] || fail "droced $1 left its socket file"
  [ ! -e "$eal_base/droce-$dproc" ] || fail "droced $1 left $eal_base/droce-$dproc"
}
wait_for() {  # LINE SECONDS
  for _ in $(seq 1 $(( $2 * 20 ))); do
    grep -qx "$1" "$dir/client.log" && return 0
    kill -0 "$cpid" 2>/dev/null || break
    sleep 0.05
  done
  fail "the client did not print '$1'"
}

wait_client() {
  wait "$cpid"
  local rc=$?
  cpid=""
  sed "s/^/[client, $1] /" "$dir/client.log"
  [ "$rc" -eq 0 ] || fail "client ($1) exit $rc"
  grep -qx done "$dir/client.log" || fail "the client ($1) did not finish"
}
start_client() {
  t_bg "$dir/client.log" 100 "$launcher" exec --daemon "$sock" -- "$client"
  cpid=$last_pid
  wait_for ready 30
}

# Round 1: a clean stop (SIGTERM) and a start on the same socket.
up_droced d1
d1=$dproc
start_client
stop_droced d1
# A runtime directory as a killed droce process leaves it, of a pid that is
# gone: the next droced removes it.
sh -c 'exit 0' &
dead=$!
wait "$dead"
if ! kill -0 "$dead" 2>/dev/null && [ ! -e "$eal_base/droce-$dead" ]; then
  stale=$eal_base/droce-$dead
  mkdir -p "$stale" && touch "$stale/dpdk_telemetry.v2"
fi
# The restart, while the client cleans up and retries.
up_droced d2
d2=$dproc
if [ -n "$stale" ]; then
  [ ! -e "$stale" ] || fail "droced d2 did not sweep the stale $stale"
  grep -q 'removed [0-9]* stale DPDK runtime director' "$dir/d2.log" || fail "droced d2 did not report the sweep"
  stale=""
fi
wait_client SIGTERM

# Round 2: droced dies (SIGKILL): the client sees the socket hang up; the
# socket file and the runtime directory stay until the next droced, which
# replaces the one and sweeps the other.
start_client
kill -KILL "$d2"
{ wait "$dpid"; } 2>/dev/null  # (bash would report the kill)
dpid=""
[ -e "$eal_base/droce-$d2" ] || echo "(note: the killed droced left no runtime directory)"
up_droced d3
d3=$dproc
[ ! -e "$eal_base/droce-$d2" ] || fail "droced d3 did not sweep the killed droced's $eal_base/droce-$d2"
wait_client SIGKILL
stop_droced d3
grep stopped "$dir/d1.log" "$dir/d3.log"

# Nothing left anywhere.
for p in "$d1" "$d2" "$d3"; do
  [ ! -e "$eal_base/droce-$p" ] || fail "a DPDK runtime directory is left: $eal_base/droce-$p"
done
shm_after=$(droce_shm)
[ "$shm_after" = "$shm_before" ] || fail "/dev/shm changed: $(comm -13 <(echo "$shm_before") <(echo "$shm_after"))"
echo "PASS"
