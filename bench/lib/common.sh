# shellcheck shell=bash
# shellcheck disable=SC2034  # spawned_pid, fifo_fd, reaped_rc, waited_rc are for the caller
# Helpers for bench/run: bounded processes, ports, waiting, statistics.
# Sourced; expects $work (a scratch directory) to be set by the caller.
#
# Every process is started through `timeout`, which puts itself and its child
# in a process group of their own (the group id is timeout's pid); they are
# recorded in bench_groups and killed as a group by bench_cleanup.

bench_groups=()

# bench_spawn LOG SECONDS CPU CMD...: starts CMD in the background, pinned to
# CPU, bounded by SECONDS, stdout+stderr to LOG, stdin from /dev/null. Sets
# spawned_pid (the group id).
bench_spawn() {
  local log=$1 secs=$2 cpu=$3
  shift 3
  timeout -k 3 "$secs" taskset -c "$cpu" "$@" </dev/null >"$log" 2>&1 &
  spawned_pid=$!
  bench_groups+=("$spawned_pid")
}

# bench_spawn_fifo FIFO LOG SECONDS CPU CMD...: like bench_spawn, with stdin
# from a new FIFO whose write end stays open in fifo_fd. Closing fifo_fd
# (exec {fifo_fd}>&-) gives the command end-of-file: dpdk-testpmd, started
# without --stats-period, then stops forwarding and exits cleanly.
bench_spawn_fifo() {
  local fifo=$1 log=$2 secs=$3 cpu=$4
  shift 4
  mkfifo "$fifo" || return 1
  timeout -k 3 "$secs" taskset -c "$cpu" "$@" <"$fifo" >"$log" 2>&1 &
  spawned_pid=$!
  bench_groups+=("$spawned_pid")
  exec {fifo_fd}>"$fifo"
}

# bench_forget PID: drops PID from bench_groups once it has been reaped.
bench_forget() {
  local i
  for i in "${!bench_groups[@]}"; do
    [ "${bench_groups[i]}" = "$1" ] && unset 'bench_groups[i]'
  done
  bench_groups=("${bench_groups[@]}")
}

# bench_reap PID: waits for PID; sets reaped_rc.
bench_reap() {
  wait "$1" 2>/dev/null
  reaped_rc=$?
  bench_forget "$1"
}

# bench_kill PID [SIGNAL]: signals the process group, waits up to 5 s, then
# kills it.
bench_kill() {
  local pid=$1 sig=${2:-TERM} i
  [ -n "$pid" ] || return 0
  kill -"$sig" -- "-$pid" 2>/dev/null || kill -"$sig" "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return 0; }
  for ((i = 0; i < 50; i++)); do
    kill -0 -- "-$pid" 2>/dev/null || kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL -- "-$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  bench_forget "$pid"
  return 0
}

# bench_wait_exit PID SECONDS: waits for PID to exit by itself for up to
# SECONDS, then kills it. Sets waited_rc. (dpdk-testpmd 22.11 sometimes
# crashes while closing a memif port, after its work is done: bash's report
# of that is silenced here; waited_rc says 139.)
bench_wait_exit() {
  local pid=$1 secs=$2 deadline
  deadline=$((SECONDS + secs))
  {
    while kill -0 "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    if kill -0 "$pid"; then bench_kill "$pid"; fi
    wait "$pid"
    waited_rc=$?
  } 2>/dev/null
  bench_forget "$pid"
}

bench_cleanup() {
  local pid
  for pid in "${bench_groups[@]}"; do
    kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null
  done
  for pid in "${bench_groups[@]}"; do bench_kill "$pid" TERM; done
  bench_groups=()
}

# tcp_listening PORT: true if a local socket listens on PORT (no forks: bash
# reads /proc/net/tcp*).
tcp_listening() {
  local want f sl local_addr rem st rest
  printf -v want ':%04X' "$1"
  for f in /proc/net/tcp /proc/net/tcp6; do
    [ -r "$f" ] || continue
    while read -r sl local_addr rem st rest; do
      [ "${local_addr: -5}" = "$want" ] && [ "$st" = 0A ] && return 0
    done <"$f"
  done
  return 1
}

# tcp_port_used PORT
tcp_port_used() {
  local want f sl local_addr rest
  printf -v want ':%04X' "$1"
  for f in /proc/net/tcp /proc/net/tcp6; do
    [ -r "$f" ] || continue
    while read -r sl local_addr rest; do
      [ "${local_addr: -5}" = "$want" ] && return 0
    done <"$f"
  done
  return 1
}

# free_port: sets port to an unused TCP port in 20000-49999.
free_port() {
  local i
  for ((i = 0; i < 200; i++)); do
    port=$((20000 + (RANDOM * 32768 + RANDOM) % 30000))
    tcp_port_used "$port" || return 0
  done
  return 1
}

# wait_listen PORT PID SECONDS: until something listens on PORT (true), PID
# died or SECONDS passed (false).
wait_listen() {
  local p=$1 pid=$2 deadline=$((SECONDS + $3))
  while [ "$SECONDS" -lt "$deadline" ]; do
    tcp_listening "$p" && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# wait_file PATH PID SECONDS: until PATH exists.
wait_file() {
  local f=$1 pid=$2 deadline=$((SECONDS + $3))
  while [ "$SECONDS" -lt "$deadline" ]; do
    [ -e "$f" ] && return 0
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.05
  done
  return 1
}

# wait_grep PATTERN FILE PID SECONDS: until FILE has a line matching the ERE.
wait_grep() {
  local re=$1 f=$2 pid=$3 deadline=$((SECONDS + $4)) line
  while [ "$SECONDS" -lt "$deadline" ]; do
    if [ -r "$f" ]; then
        while IFS= read -r line || [ -n "$line" ]; do
        [[ $line =~ $re ]] && return 0
      done <"$f"
    fi
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# Results: res[KEY] holds the values of every successful run, space
# separated.
declare -gA res=()
add_result() {  # KEY VALUE
  [ -n "$2" ] || return 0
  res[$1]="${res[$1]:-}${res[$1]:+ }$2"
}

# log MESSAGE: to stderr, prefixed with the seconds since bench/run started.
log() { printf '[%4d s] %s\n' "$SECONDS" "$*" >&2; }

# failed WHAT REASON: a ceiling or baseline measurement that did not run is a
# failure of the benchmark: logged now, listed with its reason under the
# table, and the run's exit status is 1.
failures=()
failed() {
  failures+=("round ${round:-?}: $1: $2")
  log "  $1 FAILED: $2"
}
