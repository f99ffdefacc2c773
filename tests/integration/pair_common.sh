# shellcheck shell=bash
# Shared by the scripts that run a server/client pair of an ibverbs program
# (pingpong_pair.sh, netns_pingpong.sh, netns_gateway.sh; sourced, not run):
# process-group cleanup, TCP listener checks, the client's connect retries,
# the server's end (tests/interop/lib.sh uses it too).
# shellcheck disable=SC2034,SC2154  # client_rc, server_rc, attempt: read by the sourcing scripts; last_pid: set by START_FN

# stat_of LOG COUNTER: the first "droce:   COUNTER   N" line's N (a
# DROCE_STATS=1 report); empty if the counter is not there (0 is not printed).
stat_of() {
  sed -nE "s/^droce: +$2 +([0-9]+).*/\1/p" "$1" | head -n1
}

# fault_dropped LOG: fault rule 1's dropped count in a DROCE_STATS=1 report.
fault_dropped() {
  grep -E "fault rule 1 " "$1" | sed -nE 's/.*, dropped ([0-9]+),.*/\1/p' | head -n1
}

# wait_tcp_listen PORT: until a TCP socket listens on PORT (a perftest server's
# control connection), 10 s at most; false if none did.
wait_tcp_listen() {
  local hex
  hex=$(printf ':%04X' "$1")
  for _ in $(seq 1 100); do
    awk -v p="$hex" 'FNR > 1 && substr($2, length($2) - 4) == p && $4 == "0A" { f = 1 } END { exit !f }' \
      /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

# ns_tcp_listening NS PORT: true if a socket listens on TCP PORT in NS.
ns_tcp_listening() {
  local hex
  hex=$(printf ':%04X' "$2")
  ip netns exec "$1" awk -v p="$hex" \
    'FNR > 1 && substr($2, length($2) - 4) == p && $4 == "0A" { found = 1 } END { exit !found }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# `timeout` puts itself (and so the launched program) into a process group of
# its own, whose id is its pid: kill_group PID kills the whole group.
kill_group() {
  local pid=$1
  [ -n "$pid" ] || return 0
  # Fall back to the pid alone if timeout has not made its group yet.
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || return 0
  for _ in 1 2 3 4 5 6 7 8 9 10; do
    kill -0 -- "-$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL -- "-$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return 0
}

# run_client SERVER_PID MAX_ATTEMPTS DIR START_FN: the example programs'
# clients do not retry their TCP connect, so start one (`START_FN LOG`, which
# starts it in the background with its output in LOG and sets last_pid) and
# start it again while it fails with "Couldn't connect to" and the server
# lives. Sets client_rc (255 if no client ran) and attempt (the last client's
# log is DIR/client.$attempt.log); client_pid is the running client, for
# cleanup traps.
run_client() {
  local server=$1 max=$2 logdir=$3 start=$4 log
  client_rc=255
  attempt=0
  while :; do
    if ! kill -0 "$server" 2>/dev/null; then
      echo "server exited before the client could connect" >&2
      break
    fi
    attempt=$(( attempt + 1 ))
    log="$logdir/client.$attempt.log"
    "$start" "$log"
    client_pid=$last_pid
    wait "$client_pid"
    client_rc=$?
    client_pid=""
    if [ "$client_rc" -ne 0 ] && grep -q "Couldn't connect to" "$log" &&
       [ "$attempt" -lt "$max" ] && kill -0 "$server" 2>/dev/null; then
      sleep 0.5
      continue
    fi
    break
  done
}

# end_server SERVER_PID: a healthy server finishes right after its client; if
# the client failed the server may wait forever, so it gets 3 s, then its
# group is terminated. Sets server_rc.
end_server() {
  local server=$1
  if [ "$client_rc" -ne 0 ]; then
    for _ in $(seq 1 30); do
      kill -0 "$server" 2>/dev/null || break
      sleep 0.1
    done
    kill -0 "$server" 2>/dev/null && kill -TERM -- "-$server" 2>/dev/null
  fi
  wait "$server"
  server_rc=$?
}

# Daemon mode (DROCE_TEST_DROCED, the droced binary): start_daemon NAME
# ARGS... starts one listening on $dir/NAME.sock (its log $dir/NAME.log,
# its pid appended to daemon_pids). --config /dev/null: an empty file, so
# that the machine's /etc/droce/droced.toml, if any, is not read.
start_daemon() {  # NAME DROCED-ARGS...
  local name=$1
  shift
  timeout 300 "$DROCE_TEST_DROCED" --config /dev/null --socket "$dir/$name.sock" "$@" </dev/null >"$dir/$name.log" 2>&1 &
  daemon_pids+=($!)
  for _ in $(seq 1 100); do
    [ -S "$dir/$name.sock" ] && return 0
    sleep 0.05
  done
  echo "FAIL: droced $name did not listen"; cat "$dir/$name.log"; exit 1
}
# stop_daemons: SIGTERM each; each must exit 0 having torn everything down.
stop_daemons() {
  local i pid rc
  for i in "${!daemon_pids[@]}"; do
    pid=${daemon_pids[$i]}
    kill -TERM "$pid" 2>/dev/null
    wait "$pid"
    rc=$?
    if [ "$rc" -ne 0 ]; then echo "FAIL: droced d$i: exit $rc"; cat "$dir/d$i.log"; fail=1
    elif ! grep -q 'stopped (clients 0 live.*objects 0, memory maps 0;' "$dir/d$i.log"; then
      echo "FAIL: droced d$i left objects behind"; cat "$dir/d$i.log"; fail=1
    fi
  done
  daemon_pids=()
}

# start_ctl_pair LAUNCHER PROGRAM SECONDS DIR: PROGRAM (a perftest) as an
# embedded server answering `droce ctl --pid` (DROCE_CTL=1) and its client,
# `-D SECONDS`, over memif in DIR (logs DIR/ctl_server.log and
# DIR/ctl_client.log). Returns once the client runs; sets server_pid and
# client_pid (their `timeout` groups) and ctl_pid (the server program, for
# --pid). Returns 1, with the server's log printed, if the server never
# answers or listens.
start_ctl_pair() {
  local launcher=$1 program=$2 seconds=$3 dir=$4 port sock
  port=$(( 20000 + RANDOM % 20000 ))
  sock="$dir/ctl_memif.sock"
  DROCE_CTL=1 timeout 60 "$launcher" exec --link "net_memif0,role=server,socket=$sock,socket-abstract=no" \
    --ip 10.77.3.1/24 -- "$program" -D "$seconds" -p "$port" >"$dir/ctl_server.log" 2>&1 &
  server_pid=$!
  ctl_pid=""
  for _ in $(seq 1 100); do
    ctl_pid=$(pgrep -P "$server_pid" -x "$(basename "$program")" | head -n1)
    [ -n "$ctl_pid" ] && "$launcher" ctl --pid "$ctl_pid" dev show >/dev/null 2>&1 && break
    ctl_pid=""
    sleep 0.1
  done
  if [ -z "$ctl_pid" ]; then
    echo "the $program server does not answer droce ctl"; cat "$dir/ctl_server.log"; return 1
  fi
  if ! wait_tcp_listen "$port"; then
    echo "the $program server does not listen on $port"; cat "$dir/ctl_server.log"; return 1
  fi
  timeout 60 "$launcher" exec --link "net_memif0,role=client,socket=$sock,socket-abstract=no" \
    --ip 10.77.3.2/24 -- "$program" -D "$seconds" -p "$port" 127.0.0.1 >"$dir/ctl_client.log" 2>&1 &
  client_pid=$!
}

# require_program PROGRAM: exits 77 (meson's SKIP) unless PROGRAM is installed.
require_program() {
  command -v "$1" >/dev/null 2>&1 && return 0
  echo "SKIP: '$1' is not installed"
  exit 77
}

# clear_droce_env: no DROCE_* setting of the caller's environment reaches
# the pair (each run sets its own).
clear_droce_env() {
  local v
  for v in "${!DROCE_@}"; do unset "$v"; done
}

# proc_tree PID...: the pids and all their descendants, from /proc (not
# pgrep: under the sanitizer runs it inherits the ASan runtime and hangs).
proc_tree() {
  local queue=("$@") out=() p c
  while [ ${#queue[@]} -gt 0 ]; do
    p=${queue[0]}
    queue=("${queue[@]:1}")
    [ -n "$p" ] && [ -d "/proc/$p" ] || continue
    out+=("$p")
    for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do queue+=("$c"); done
  done
  echo "${out[@]}"
}

# hang_dump PID...: what every thread of the pids and their descendants is
# doing — state, kernel wait channel, system call, and the user stack where
# gdb is installed — on stderr, for a test about to kill a hung pair.
hang_dump() {
  local p t
  for p in $(proc_tree "$@"); do
    echo "== hang: pid $p: $(tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | cut -c1-200)" >&2
    for t in /proc/"$p"/task/*; do
      echo "   tid ${t##*/} $(cat "$t/comm" 2>/dev/null) state $(awk '{print $3}' "$t/stat" 2>/dev/null)" \
           "wchan $(cat "$t/wchan" 2>/dev/null) syscall $(cut -d' ' -f1-3 "$t/syscall" 2>/dev/null)" >&2
    done
    if command -v gdb >/dev/null 2>&1; then
      env -u LD_PRELOAD timeout 30 gdb -batch -nx -p "$p" -ex 'thread apply all bt 12' 2>/dev/null |
        grep -E '^(Thread|#)' | sed 's/^/   /' >&2
    fi
  done
}

# hang_watch SECS PID...: in the background, hang_dump the pids after SECS
# if any still runs; the caller kills the watch when the run ends in time.
hang_watch() {
  local secs=$1
  shift
  (
    local nap
    trap 'kill "$nap" 2>/dev/null; exit 0' TERM
    sleep "$secs" &
    nap=$!
    wait "$nap"
    for p in "$@"; do
      if [ -d "/proc/$p" ]; then
        echo "== hang: still running after ${secs}s" >&2
        hang_dump "$@"
        break
      fi
    done
  ) &
}
