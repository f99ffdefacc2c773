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
droced=$1 launcher=$2 client=$3
dir=$(mktemp -d /tmp/droce-daemon.XXXXXX) || exit 1
sock=$dir/d.sock
pids=()
dpid=""
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; done
  # timeout leads droced's process group: kill the group, not just timeout.
  [ -n "$dpid" ] && kill -KILL -- "-$dpid" 2>/dev/null
  wait 2>/dev/null
  rm -rf -- "$dir"
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; echo "--- droced log ---"; tail -20 "$dir/d.log"; exit 1; }

timeout 600 "$droced" --config /dev/null --socket "$sock" --ip 10.77.9.1/24 </dev/null >"$dir/d.log" 2>&1 &
dpid=$!
for _ in $(seq 1 100); do [ -S "$sock" ] && break; sleep 0.05; done
[ -S "$sock" ] || fail "droced did not listen"
run() { timeout "$1" "$launcher" exec --daemon "$sock" -- "$client" "${@:2}"; }
# The daemon itself (timeout's child).
sleep 0.3
# (Read from /proc, not with pgrep: under the sanitizer runs every tool
# inherits the ASan runtime through LD_PRELOAD, and pgrep then hangs.)
read -r dproc _ <"/proc/$dpid/task/$dpid/children"  # no newline at its end: read "fails"
[ -n "$dproc" ] || fail "no droced process under timeout"
fds() { ls "/proc/$dproc/fd" | wc -l; }
memfd_maps() { grep -c 'memfd:' "/proc/$dproc/maps"; }
base_fds=$(fds) base_maps=$(memfd_maps)

# Memory tiers.
run 60 memory >"$dir/memory.log" 2>&1 || { cat "$dir/memory.log"; fail "memory tiers"; }
sed 's/^/[memory] /' "$dir/memory.log"
DROCE_REMAP=0 run 60 memory >"$dir/memory_c.log" 2>&1 || { cat "$dir/memory_c.log"; fail "memory, copy tier"; }
sed 's/^/[memory, DROCE_REMAP=0] /' "$dir/memory_c.log"

# Isolation between two clients.
run 60 isolation >"$dir/iso.log" 2>&1 || { cat "$dir/iso.log"; fail "isolation"; }
sed 's/^/[isolation] /' "$dir/iso.log"

# The RC peer of a SIGKILLed client sees RETRY_EXC_ERR.
run 60 peer-death >"$dir/peer.log" 2>&1 || { cat "$dir/peer.log"; fail "peer of a dead client"; }
sed 's/^/[peer death] /' "$dir/peer.log"

# Registered bytes within RLIMIT_MEMLOCK (without CAP_IPC_LOCK).
if command -v setpriv >/dev/null && command -v prlimit >/dev/null; then
  timeout 60 prlimit --memlock=262144:262144 setpriv --bounding-set=-ipc_lock --inh-caps=-ipc_lock \
    "$launcher" exec --daemon "$sock" -- "$client" limits >"$dir/limits.log" 2>&1 ||
    { cat "$dir/limits.log"; fail "RLIMIT_MEMLOCK"; }
  sed 's/^/[limits] /' "$dir/limits.log"
fi

# 16 concurrent clients.
for i in $(seq 1 16); do run 120 traffic 2 >"$dir/c16.$i.log" 2>&1 & pids+=($!); done
bad=0
for p in "${pids[@]}"; do wait "$p" || bad=$((bad + 1)); done
pids=()
[ "$bad" -eq 0 ] || { cat "$dir"/c16.*.log | grep -v rounds | head; fail "$bad of 16 concurrent clients failed"; }
echo "16 concurrent clients: all byte-exact ($(cat "$dir"/c16.*.log | awk '{s += $2} END {print s}') rounds)"

# Survivors, the kill storm and hostile clients at once.
# s1 prints the device's counters when it closes it (DROCE_STATS=1).
DROCE_STATS=1 run 300 traffic 12 >"$dir/s1.log" 2>&1 & s1=$!
run 300 traffic 12 >"$dir/s2.log" 2>&1 & s2=$!
for seed in 1 2 3; do
  timeout 120 "$client" hostile "$sock" "$seed" >"$dir/h.$seed.log" 2>&1 & pids+=($!)
done
killed=0
for i in $(seq 1 100); do
  # timeout leads a process group of its own: the kill reaches the client.
  timeout 60 "$launcher" exec --daemon "$sock" -- "$client" victim >/dev/null 2>&1 &
  v=$!
  # 20 ms to 600 ms: some die opening the device, most mid-traffic.
  sleep "0.$(printf '%03d' $(( 20 + RANDOM % 580 )))"
  # On a loaded machine timeout may not have made its group yet (then it
  # has not started the client either): kill timeout itself.
  kill -KILL -- "-$v" 2>/dev/null || kill -KILL "$v" 2>/dev/null || fail "could not kill victim $i"
  wait "$v" 2>/dev/null
  killed=$((killed + 1))
  kill -0 "$dpid" 2>/dev/null || fail "droced died during the kill storm (after $killed clients)"
done
for p in "${pids[@]}"; do wait "$p" || fail "a hostile client failed to run: $(cat "$dir"/h.*.log)"; done
pids=()
wait "$s1" || { cat "$dir/s1.log"; fail "survivor 1's traffic"; }
wait "$s2" || { cat "$dir/s2.log"; fail "survivor 2's traffic"; }
echo "kill storm: $killed clients SIGKILLed; survivors $(grep rounds "$dir/s1.log") / $(cat "$dir/s2.log")"
# The hostile clients' doorbells for QPs not theirs were ignored and counted.
foreign=$(grep -Eo 'foreign_doorbells +[0-9]+' "$dir/s1.log" | awk '{print $2}' | tail -1)
[ "${foreign:-0}" -gt 0 ] || { cat "$dir/s1.log"; fail "no foreign doorbell was counted"; }
echo "foreign doorbells ignored and counted by the engine: $foreign"
cat "$dir"/h.*.log | sed 's/^/[hostile] /'
kill -0 "$dpid" 2>/dev/null || fail "droced died"

# Nothing leaked: fds and memfd mappings back to where they were.
for _ in $(seq 1 50); do
  [ "$(fds)" -le "$base_fds" ] && [ "$(memfd_maps)" -le "$base_maps" ] && break
  sleep 0.1
done
[ "$(fds)" -le "$base_fds" ] || { ls -l "/proc/$dproc/fd"; fail "droced holds $(fds) fds, $base_fds before the clients"; }
[ "$(memfd_maps)" -le "$base_maps" ] || { grep memfd "/proc/$dproc/maps" | head; fail "droced maps $(memfd_maps) memfds, $base_maps before"; }
echo "after the clients: $(fds) fds ($base_fds before), $(memfd_maps) memfd mappings ($base_maps before)"

# A client waiting when the daemon stops hears DEVICE_FATAL.
run 60 fatal >"$dir/fatal.log" 2>&1 &
fpid=$!
for _ in $(seq 1 100); do grep -q ready "$dir/fatal.log" && break; sleep 0.05; done
kill -TERM "$dpid"
wait "$dpid"
rc=$?
dpid=""
wait "$fpid" || { cat "$dir/fatal.log"; fail "the waiting client did not see DEVICE_FATAL"; }
grep -v ready "$dir/fatal.log" | sed 's/^/[fatal] /'
[ "$rc" -eq 0 ] || fail "droced exit $rc"
grep -q 'stopped (clients 0 live.*objects 0, memory maps 0;' "$dir/d.log" || fail "droced left objects behind"
# Every tier was used, and the hostile clients' foreign handles were counted.
grep -Eq 'foreign handles [1-9][0-9]*; registrations shared [1-9][0-9]*, moved [1-9][0-9]*, copied [1-9]' "$dir/d.log" ||
  fail "a memory tier went unused, or no foreign handle was counted"
grep 'stopped' "$dir/d.log"
[ ! -e "$sock" ] || fail "the socket file is left behind"
echo "PASS"
