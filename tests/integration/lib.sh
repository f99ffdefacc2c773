# shellcheck shell=bash
# The integration tests' library, sourced first by every script in this
# directory (and by netns_common.sh and tests/interop/lib.sh), so that a test
# is its own steps and nothing else:
#
#   . "$(dirname "$0")/lib.sh"
#   t_usage $# 2 2 "LAUNCHER IB_WRITE_BW"   # exits 2 with the usage line
#   t_launcher "$1"                         # FAIL unless it is an executable
#   require_program ib_write_bw "ibverbs-utils"   # SKIP (77) unless installed
#   t_setup stall                           # $dir, cleanup at exit
#   clear_droce_env                         # or unset the DROCE_* it sets itself
#   t_bg "$dir/server.log" 120 "$launcher" exec ... -- ib_write_bw ...
#   start_droced d0 --ip 10.77.1.1/24      # droced on $dir/d0.sock
#   ... fail "what went wrong" ...          # FAIL: ..., exit 1
#   stop_daemons                            # each must exit 0, no object left
#
# Cleanup at exit (t_setup's trap, whatever way the script ends): the
# functions given to on_exit (last first), then every process group started
# with t_bg or start_droced (kill_group: TERM, then KILL), then $dir.
# Process groups: `timeout` puts itself, and so the program it runs, in a
# group of its own whose id is its pid; t_bg and start_droced start
# everything under one.
# shellcheck disable=SC2034,SC2154  # client_rc, server_rc, attempt, last_pid: read and set by the sourcing scripts

dir=""
t_groups=()      # process groups killed at exit
t_on_exit=()     # functions run at exit, last first
daemon_pids=()   # start_droced's, for stop_daemons
daemon_names=()
# FAIL prints the last lines of each $dir/*.log when this is not 0 (t_setup's
# second argument).
t_fail_log_lines=0

skip() { echo "SKIP: $*"; exit 77; }
fail() {
  echo "FAIL: $*"
  local f
  if [ "$t_fail_log_lines" -gt 0 ] && [ -n "$dir" ]; then
    for f in "$dir"/*.log; do
      [ -e "$f" ] && { echo "== $f"; tail -n "$t_fail_log_lines" "$f"; }
    done
    # Once more after the logs: meson prints only a long output's end.
    echo "FAIL: $*"
  fi
  exit 1
}

# t_usage NARGS MIN MAX USAGE: exits 2 with "usage: SCRIPT USAGE" unless
# MIN <= NARGS <= MAX (MAX "-": no upper bound).
t_usage() {
  local n=$1 min=$2 max=$3
  if [ "$n" -lt "$min" ] || { [ "$max" != - ] && [ "$n" -gt "$max" ]; }; then
    echo "usage: $0 $4" >&2
    exit 2
  fi
}

# t_launcher PATH: FAIL unless PATH (the droce launcher, droced, a test
# program) is an executable file.
t_launcher() {
  [ -x "$1" ] || fail "'$1' is not an executable file"
}

# require_program PROGRAM [PACKAGE]: SKIP (exit 77, meson's skip) unless
# PROGRAM is installed; PACKAGE names what scripts/setup.sh installs for it.
require_program() {
  command -v "$1" >/dev/null 2>&1 && return 0
  skip "'$1' is not installed${2:+ (install $2: scripts/setup.sh)}"
}

# clear_droce_env: no DROCE_* setting of the caller's environment reaches
# the test's programs (each run sets its own); DROCE_TEST_* stay.
clear_droce_env() {
  local v
  for v in "${!DROCE_@}"; do
    case $v in DROCE_TEST_*) ;; *) unset "$v" ;; esac
  done
}

# on_exit FUNCTION: FUNCTION runs at exit, before the process groups are
# killed (functions given later run first).
on_exit() { t_on_exit=("$1" "${t_on_exit[@]}"); }

# The parent pid of process $1 ("" if it is gone).
t_ppid() {
  sed -nE 's/.*\) [A-Za-z] ([0-9]+) .*/\1/p' "/proc/$1/stat" 2>/dev/null
}

# t_kill_all: kills every process group t_bg and start_droced started: a
# group that is still there, or our own child that has not made its group
# yet; never the bare id of a process that ended and whose pid the system
# may have given to another. An on_exit function that removes a network
# namespace calls it first (a namespace outlives its removal while a
# process is in it).
t_kill_all() {
  local p
  for p in "${t_groups[@]}"; do
    if kill -0 -- "-$p" 2>/dev/null || [ "$(t_ppid "$p")" = "$$" ]; then kill_group "$p"; fi
  done
  t_groups=()
}

t_cleanup() {
  local f
  for f in "${t_on_exit[@]}"; do "$f"; done
  t_kill_all
  [ -n "$dir" ] && rm -rf -- "$dir"
  return 0
}

# t_setup NAME [LOG_LINES]: the test's directory $dir
# (${TMPDIR:-/tmp}/droce-NAME.XXXXXX) and the cleanup trap. With LOG_LINES,
# FAIL prints that many last lines of each $dir/*.log.
t_setup() {
  dir=$(mktemp -d "${TMPDIR:-/tmp}/droce-$1.XXXXXX") || { echo "FAIL: mktemp -d failed"; exit 1; }
  t_fail_log_lines=${2:-0}
  trap t_cleanup EXIT
  trap 'echo "interrupted" >&2; exit 130' INT TERM HUP
}

# t_bg LOG SECONDS CMD...: CMD in the background under `timeout SECONDS`,
# its output in LOG, its stdin /dev/null; its process group is killed at
# exit. Sets last_pid (the group: kill_group, wait).
t_bg() {
  local log=$1 secs=$2
  shift 2
  timeout "$secs" "$@" </dev/null >"$log" 2>&1 &
  last_pid=$!
  t_groups+=("$last_pid")
}

# listen_notify SOCK FILE: systemd's side of sd_notify: a unix datagram
# socket at SOCK (give it to a daemon as NOTIFY_SOCKET) that writes each
# message it receives to FILE, one a line, until STOPPING=1 or 60 s. A t_bg
# process (notify_pid, to wait for); returns 1 if the socket did not appear.
listen_notify() {
  rm -f "$1" "$2"
  t_bg "$2.listener" 70 python3 -c '
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(sys.argv[1])
s.settimeout(60)
with open(sys.argv[2], "w", buffering=1) as out:
    try:
        while True:
            msg = s.recv(4096).decode()
            out.write(msg.replace("\n", " | ") + "\n")
            if "STOPPING=1" in msg:
                break
    except socket.timeout:
        pass
' "$1" "$2"
  notify_pid=$last_pid
  local i
  for (( i = 0; i < 100; i++ )); do [ -S "$1" ] && return 0; sleep 0.05; done
  return 1
}

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

# start_droced NAME [ARGS...]: droced ($T_DROCED, else DROCE_TEST_DROCED)
# listening on $dir/NAME.sock, its log $dir/NAME.log, under `timeout
# ${T_DROCED_TIMEOUT:-300}`; inside namespace $T_DROCED_NETNS if set.
# --config /dev/null: an empty file, so that the machine's
# /etc/droce/droced.toml, if any, is not read. FAIL if it does not listen
# within 10 s. Sets last_pid; stop_daemons checks its end.
start_droced() {
  local name=$1 bin=${T_DROCED:-${DROCE_TEST_DROCED:-}} in_ns=()
  shift
  [ -x "$bin" ] || fail "droced '$bin' is not an executable file"
  [ -n "${T_DROCED_NETNS:-}" ] && in_ns=(ip netns exec "$T_DROCED_NETNS")
  t_bg "$dir/$name.log" "${T_DROCED_TIMEOUT:-300}" "${in_ns[@]}" "$bin" --config /dev/null --socket "$dir/$name.sock" "$@"
  daemon_pids+=("$last_pid")
  daemon_names+=("$name")
  for _ in $(seq 1 200); do
    [ -S "$dir/$name.sock" ] && return 0
    kill -0 "$last_pid" 2>/dev/null || break
    sleep 0.05
  done
  fail "droced $name did not listen: $(tail -n 20 "$dir/$name.log")"
}
# The name the scripts of before used.
start_daemon() { start_droced "$@"; }

# stop_daemons: SIGTERM each droced start_droced started; each must exit 0
# having torn everything down (sets fail=1 otherwise).
stop_daemons() {
  local i pid rc name
  for i in "${!daemon_pids[@]}"; do
    pid=${daemon_pids[$i]} name=${daemon_names[$i]}
    kill -TERM "$pid" 2>/dev/null
    wait "$pid"
    rc=$?
    if [ "$rc" -ne 0 ]; then echo "FAIL: droced $name: exit $rc"; tail -n 30 "$dir/$name.log"; fail=1
    elif ! grep -q 'stopped (clients 0 live.*objects 0, memory maps 0;' "$dir/$name.log"; then
      echo "FAIL: droced $name left objects behind"; tail -n 30 "$dir/$name.log"; fail=1
    fi
  done
  daemon_pids=()
  daemon_names=()
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
  t_bg "$dir/ctl_server.log" 60 env DROCE_CTL=1 "$launcher" exec \
    --link "net_memif0,role=server,socket=$sock,socket-abstract=no" --ip 10.77.3.1/24 \
    -- "$program" -D "$seconds" -p "$port"
  server_pid=$last_pid
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
  t_bg "$dir/ctl_client.log" 60 "$launcher" exec --link "net_memif0,role=client,socket=$sock,socket-abstract=no" \
    --ip 10.77.3.2/24 -- "$program" -D "$seconds" -p "$port" 127.0.0.1
  client_pid=$last_pid
}

# proc_tree PID...: the pids and all their descendants, from /proc (not
# pgrep: under the sanitizer runs it inherits the ASan runtime and hangs).
proc_tree() {
  local queue=("$@") tree=() p c
  while [ ${#queue[@]} -gt 0 ]; do
    p=${queue[0]}
    queue=("${queue[@]:1}")
    [ -n "$p" ] && [ -d "/proc/$p" ] || continue
    tree+=("$p")
    for c in $(cat /proc/"$p"/task/*/children 2>/dev/null); do queue+=("$c"); done
  done
  echo "${tree[@]}"
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
