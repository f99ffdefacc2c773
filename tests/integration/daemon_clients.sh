#!/usr/bin/env bash
# droced under load, faults and hostile clients: one daemon; the
# memory tiers checked by a client; 16 concurrent clients with traffic; then
# two long-lived clients with traffic while 100 others are SIGKILLed at
# random moments (set-up, traffic) and hostile clients send random,
# truncated, replayed and out-of-order messages. Passes if every surviving
# client's data was byte-exact, the daemon never died, and once the clients
# are gone it holds no more fds or memory mappings than before them and
# stops on SIGTERM with no object left.
#
# usage: daemon_clients.sh DROCED LAUNCHER DAEMON_CLIENT
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 3 3 "DROCED LAUNCHER DAEMON_CLIENT"
droced=$1 launcher=$2 client=$3
t_launcher "$launcher"
t_setup daemon
sock=$dir/d.sock
pids=()
fail=0  # stop_daemons sets it
# dfail MESSAGE: FAIL with the end of droced's log.
dfail() { fail "$*"$'\n'"--- droced log ---"$'\n'"$(tail -20 "$dir/d.log")"; }

T_DROCED=$droced T_DROCED_TIMEOUT=600
start_droced d --ip 10.77.9.1/24
dpid=$last_pid
run() { timeout "$1" "$launcher" exec --daemon "$sock" -- "$client" "${@:2}"; }
# The daemon itself (timeout's child).
sleep 0.3
# (Read from /proc, not with pgrep: under the sanitizer runs every tool
# inherits the ASan runtime through LD_PRELOAD, and pgrep then hangs.)
read -r dproc _ <"/proc/$dpid/task/$dpid/children"  # no newline at its end: read "fails"
[ -n "$dproc" ] || dfail "no droced process under timeout"
fds() { ls "/proc/$dproc/fd" | wc -l; }
memfd_maps() { grep -c 'memfd:' "/proc/$dproc/maps"; }
base_fds=$(fds) base_maps=$(memfd_maps)

# Memory tiers.
run 60 memory >"$dir/memory.log" 2>&1 || { cat "$dir/memory.log"; dfail "memory tiers"; }
sed 's/^/[memory] /' "$dir/memory.log"
DROCE_REMAP=0 run 60 memory >"$dir/memory_c.log" 2>&1 || { cat "$dir/memory_c.log"; dfail "memory, copy tier"; }
sed 's/^/[memory, DROCE_REMAP=0] /' "$dir/memory_c.log"

# Isolation between two clients.
run 60 isolation >"$dir/iso.log" 2>&1 || { cat "$dir/iso.log"; dfail "isolation"; }
sed 's/^/[isolation] /' "$dir/iso.log"

# The RC peer of a SIGKILLed client sees RETRY_EXC_ERR.
run 60 peer-death >"$dir/peer.log" 2>&1 || { cat "$dir/peer.log"; dfail "peer of a dead client"; }
sed 's/^/[peer death] /' "$dir/peer.log"

# Registered bytes within RLIMIT_MEMLOCK (without CAP_IPC_LOCK).
if command -v setpriv >/dev/null && command -v prlimit >/dev/null; then
  timeout 60 prlimit --memlock=262144:262144 setpriv --bounding-set=-ipc_lock --inh-caps=-ipc_lock \
    "$launcher" exec --daemon "$sock" -- "$client" limits >"$dir/limits.log" 2>&1 ||
    { cat "$dir/limits.log"; dfail "RLIMIT_MEMLOCK"; }
  sed 's/^/[limits] /' "$dir/limits.log"
fi

# 16 concurrent clients.
for i in $(seq 1 16); do
  t_bg "$dir/c16.$i.log" 120 "$launcher" exec --daemon "$sock" -- "$client" traffic 2
  pids+=("$last_pid")
done
bad=0
for p in "${pids[@]}"; do wait "$p" || bad=$((bad + 1)); done
pids=()
[ "$bad" -eq 0 ] || { cat "$dir"/c16.*.log | grep -v rounds | head; dfail "$bad of 16 concurrent clients failed"; }
echo "16 concurrent clients: all byte-exact ($(cat "$dir"/c16.*.log | awk '{s += $2} END {print s}') rounds)"

# Survivors, the kill storm and hostile clients at once.
# s1 prints the device's counters when it closes it (DROCE_STATS=1).
t_bg "$dir/s1.log" 300 env DROCE_STATS=1 "$launcher" exec --daemon "$sock" -- "$client" traffic 12
s1=$last_pid
t_bg "$dir/s2.log" 300 "$launcher" exec --daemon "$sock" -- "$client" traffic 12
s2=$last_pid
for seed in 1 2 3; do
  t_bg "$dir/h.$seed.log" 120 "$client" hostile "$sock" "$seed"
  pids+=("$last_pid")
done
killed=0
for i in $(seq 1 100); do
  # timeout leads a process group of its own: the kill reaches the client.
  t_bg /dev/null 60 "$launcher" exec --daemon "$sock" -- "$client" victim
  v=$last_pid
  # 20 ms to 600 ms: some die opening the device, most mid-traffic.
  sleep "0.$(printf '%03d' $(( 20 + RANDOM % 580 )))"
  # On a loaded machine timeout may not have made its group yet (then it
  # has not started the client either): kill timeout itself.
  kill -KILL -- "-$v" 2>/dev/null || kill -KILL "$v" 2>/dev/null || dfail "could not kill victim $i"
  wait "$v" 2>/dev/null
  killed=$((killed + 1))
  kill -0 "$dpid" 2>/dev/null || dfail "droced died during the kill storm (after $killed clients)"
done
for p in "${pids[@]}"; do wait "$p" || dfail "a hostile client failed to run: $(cat "$dir"/h.*.log)"; done
pids=()
wait "$s1" || { cat "$dir/s1.log"; dfail "survivor 1's traffic"; }
wait "$s2" || { cat "$dir/s2.log"; dfail "survivor 2's traffic"; }
echo "kill storm: $killed clients SIGKILLed; survivors $(grep rounds "$dir/s1.log") / $(cat "$dir/s2.log")"
# The hostile clients' doorbells for QPs not theirs were ignored and counted.
foreign=$(grep -Eo 'foreign_doorbells +[0-9]+' "$dir/s1.log" | awk '{print $2}' | tail -1)
[ "${foreign:-0}" -gt 0 ] || { cat "$dir/s1.log"; dfail "no foreign doorbell was counted"; }
echo "foreign doorbells ignored and counted by the engine: $foreign"
cat "$dir"/h.*.log | sed 's/^/[hostile] /'
kill -0 "$dpid" 2>/dev/null || dfail "droced died"

# Nothing leaked: fds and memfd mappings back to where they were.
for _ in $(seq 1 50); do
  [ "$(fds)" -le "$base_fds" ] && [ "$(memfd_maps)" -le "$base_maps" ] && break
  sleep 0.1
done
[ "$(fds)" -le "$base_fds" ] || { ls -l "/proc/$dproc/fd"; dfail "droced holds $(fds) fds, $base_fds before the clients"; }
[ "$(memfd_maps)" -le "$base_maps" ] || { grep memfd "/proc/$dproc/maps" | head; dfail "droced maps $(memfd_maps) memfds, $base_maps before"; }
echo "after the clients: $(fds) fds ($base_fds before), $(memfd_maps) memfd mappings ($base_maps before)"

# A client waiting when the daemon stops hears DEVICE_FATAL.
t_bg "$dir/fatal.log" 60 "$launcher" exec --daemon "$sock" -- "$client" fatal
fpid=$last_pid
for _ in $(seq 1 100); do grep -q ready "$dir/fatal.log" && break; sleep 0.05; done
# SIGTERM: droced must exit 0 with no object left.
stop_daemons
wait "$fpid" || { cat "$dir/fatal.log"; dfail "the waiting client did not see DEVICE_FATAL"; }
grep -v ready "$dir/fatal.log" | sed 's/^/[fatal] /'
[ "$fail" -eq 0 ] || exit 1
# Every tier was used, and the hostile clients' foreign handles were counted.
grep -Eq 'foreign handles [1-9][0-9]*; registrations shared [1-9][0-9]*, moved [1-9][0-9]*, copied [1-9]' "$dir/d.log" ||
  dfail "a memory tier went unused, or no foreign handle was counted"
grep 'stopped' "$dir/d.log"
[ ! -e "$sock" ] || dfail "the socket file is left behind"
echo "PASS"
