#!/usr/bin/env bash
# droced's configuration file and systemd integration (the unit
# itself: droced_unit.sh):
#  - droced started with a file listens at the file's socket, with the
#    file's group and mode, tells NOTIFY_SOCKET READY=1 once it does and
#    STOPPING=1 on SIGTERM, and exits 0;
#  - flags override the file (--socket-mode);
#  - [limits]' counts are what a client gets (daemon_client count-limits);
#  - lines carry sd-daemon priorities when stderr is JOURNAL_STREAM's;
#  - a bad file (unknown key, bad value, syntax) or a missing --config file
#    exits 2 before anything starts, naming FILE:LINE: key.
#
# usage: droced_config.sh DROCED EXAMPLE_TOML LAUNCHER DAEMON_CLIENT
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 4 4 "DROCED EXAMPLE_TOML LAUNCHER DAEMON_CLIENT"
droced=$1 example=$2 launcher=$3 client=$4
t_launcher "$droced"
t_launcher "$launcher"
t_setup config
# Not lib.sh's start_droced: how droced starts (its file, NOTIFY_SOCKET,
# JOURNAL_STREAM, exit codes) is what this test checks.
dpid=""
fails=0
ok() { echo "ok: $*"; }
not_ok() { echo "FAIL: $*"; fails=$((fails + 1)); }

# --- a good file, with READY=1 over NOTIFY_SOCKET --------------------------
# A group other than ours, if the system has one (root may chown to any).
group=$(id -gn)
if [ "$(id -u)" -eq 0 ] && getent group daemon >/dev/null; then group=daemon; fi
cat >"$dir/good.toml" <<TOML
[daemon]
socket = "$dir/d.sock"
socket_group = "$group"
socket_mode = "0640"
log_level = "info"

[limits]
max_qps = 3
max_cqs = 2
max_mrs = 4

[[device]]
link = "net_memif0,role=server,socket=$dir/m.sock,socket-abstract=no"
ip = "10.77.61.1/24"
TOML

# run_good LOG ARGS...: droced with good.toml (and ARGS) under NOTIFY_SOCKET;
# waits for the socket file.
run_good() {
  local log=$1
  shift
  t_bg "$log" 120 env NOTIFY_SOCKET="$dir/notify.sock" "$droced" --config "$dir/good.toml" "$@"
  dpid=$last_pid
  for _ in $(seq 1 200); do
    [ -S "$dir/d.sock" ] && return 0
    kill -0 "$dpid" 2>/dev/null || break
    sleep 0.05
  done
  not_ok "droced did not listen at $dir/d.sock: $(cat "$log")"
  return 1
}

# stop_good LOG: SIGTERM, exit 0, nothing left.
stop_good() {
  kill -TERM "$dpid"
  wait "$dpid"
  local rc=$?
  dpid=""
  if [ "$rc" -ne 0 ]; then not_ok "droced exit $rc after SIGTERM: $(cat "$1")"
  elif ! grep -q 'stopped (clients 0 live.*objects 0, memory maps 0;' "$1"; then not_ok "droced did not stop cleanly: $(cat "$1")"
  else ok "droced stopped on SIGTERM"
  fi
  [ -e "$dir/d.sock" ] && not_ok "the socket file is left behind"
  # DPDK's memif server leaves its socket file (docs/CONFIG.md, Links).
  rm -f "$dir/m.sock"
}

listen_notify "$dir/notify.sock" "$dir/notify.log" || not_ok "the notify listener did not start"
if run_good "$dir/d.log"; then
  # READY=1 arrives once it listens (it is sent right after).
  for _ in $(seq 1 100); do grep -q 'READY=1' "$dir/notify.log" 2>/dev/null && break; sleep 0.05; done
  if grep -q 'READY=1' "$dir/notify.log"; then ok "READY=1: $(grep READY=1 "$dir/notify.log")"
  else not_ok "no READY=1 on NOTIFY_SOCKET (got: $(cat "$dir/notify.log"))"
  fi
  grep -q 'STATUS=1 device, listening on '"$dir/d.sock" "$dir/notify.log" || not_ok "no STATUS with the socket: $(cat "$dir/notify.log")"
  mode=$(stat -c %a "$dir/d.sock") grp=$(stat -c %G "$dir/d.sock")
  if [ "$mode" = 640 ] && [ "$grp" = "$group" ]; then ok "socket mode 0640, group $grp"
  else not_ok "socket mode $mode group $grp, want 640 $group"
  fi
  grep -q "droced: info: 1 device, listening on $dir/d.sock (configuration $dir/good.toml)" "$dir/d.log" ||
    not_ok "no listening line naming the file: $(cat "$dir/d.log")"
  # The file's limits reach the clients.
  if timeout 60 "$launcher" exec --daemon "$dir/d.sock" -- "$client" count-limits 3 2 4 >"$dir/limits.log" 2>&1; then
    ok "[limits] max_qps 3, max_cqs 2, max_mrs 4: $(tr '\n' ';' <"$dir/limits.log")"
  else
    not_ok "[limits] not applied: $(cat "$dir/limits.log")"
  fi
  stop_good "$dir/d.log"
  wait "$notify_pid"
  if grep -q 'STOPPING=1' "$dir/notify.log"; then ok "STOPPING=1 on SIGTERM"
  else not_ok "no STOPPING=1 (got: $(cat "$dir/notify.log"))"
  fi
fi

# --- flags override the file ----------------------------------------------
listen_notify "$dir/notify.sock" "$dir/notify2.log" || not_ok "the notify listener did not start"
if run_good "$dir/d2.log" --socket-mode 0600; then
  mode=$(stat -c %a "$dir/d.sock")
  [ "$mode" = 600 ] && ok "--socket-mode 0600 overrides the file" || not_ok "--socket-mode 0600 gave mode $mode"
  stop_good "$dir/d2.log"
fi
kill "$notify_pid" 2>/dev/null; wait "$notify_pid" 2>/dev/null

# --- bad files exit 2 before anything starts --------------------------------
# expect_bad NAME WANT ARGS...: droced ARGS exits 2, one line containing WANT,
# and it made no socket.
expect_bad() {
  local name=$1 want=$2
  shift 2
  rm -f "$dir/d.sock" "$dir/m.sock"
  timeout 30 "$droced" "$@" </dev/null >"$dir/bad.out" 2>"$dir/bad.err"
  local rc=$?
  if [ "$rc" -ne 2 ]; then not_ok "$name: exit $rc, want 2: $(cat "$dir/bad.err")"
  elif ! grep -Fq -- "$want" "$dir/bad.err"; then not_ok "$name: stderr lacks '$want': $(cat "$dir/bad.err")"
  elif [ "$(wc -l <"$dir/bad.err")" -ne 1 ]; then not_ok "$name: more than one line: $(cat "$dir/bad.err")"
  elif [ -e "$dir/d.sock" ] || [ -e "$dir/m.sock" ]; then not_ok "$name: something started"
  else ok "$name: $(cat "$dir/bad.err")"
  fi
}
bad() {  # NAME WANT TOML-TEXT
  printf '%s\n' "$3" >"$dir/$1.toml"
  expect_bad "$1" "$2" --config "$dir/$1.toml"
}
dev="[[device]]
link = \"net_memif0,role=server,socket=$dir/m.sock,socket-abstract=no\""
bad unknown_key "$dir/unknown_key.toml:3: daemon.sockets: unknown key" "[daemon]
socket = \"$dir/d.sock\"
sockets = \"x\"
$dev"
bad bad_ip "$dir/bad_ip.toml:5: device.ip: invalid IPv4 address '10.77.61.300'" "[daemon]
socket = \"$dir/d.sock\"
$dev
ip = \"10.77.61.300\""
bad wrong_type "$dir/wrong_type.toml:2: daemon.metrics_port: expected an integer, got a string" "[daemon]
metrics_port = \"9100\"
$dev"
bad bad_mode "$dir/bad_mode.toml:2: daemon.socket_mode: '0999' is not an octal mode" "[daemon]
socket_mode = \"0999\"
$dev"
bad syntax "$dir/syntax.toml:2: syntax error:" "[daemon]
socket = 
$dev"
expect_bad missing_config "$dir/none.toml: cannot read: No such file or directory" --config "$dir/none.toml"
expect_bad bad_flag_mode "--socket-mode: 'rw' is not an octal mode" --config "$dir/good.toml" --socket-mode rw

# --- journald priorities ---------------------------------------------------
# With stderr the stream JOURNAL_STREAM names (device:inode, as systemd sets
# it), each line starts with its sd-daemon priority instead of the level.
: >"$dir/journal.err"
printf '[daemon]\nsockets = 1\n' >"$dir/j.toml"
JOURNAL_STREAM=$(stat -c '%d:%i' "$dir/journal.err") timeout 30 "$droced" --config "$dir/j.toml" \
  </dev/null >/dev/null 2>>"$dir/journal.err"
if grep -Fxq "<3>droced: $dir/j.toml:2: daemon.sockets: unknown key" "$dir/journal.err"; then
  ok "journald priority: $(cat "$dir/journal.err")"
else
  not_ok "no '<3>' line with JOURNAL_STREAM set: $(cat "$dir/journal.err")"
fi
# Another stream (stderr redirected elsewhere): plain text.
JOURNAL_STREAM=1:1 timeout 30 "$droced" --config "$dir/j.toml" </dev/null >/dev/null 2>"$dir/text.err"
grep -q '^droced: error: ' "$dir/text.err" || not_ok "JOURNAL_STREAM of another stream: $(cat "$dir/text.err")"

# --- the shipped example is accepted as droced reads it --------------------
# droced reads the file before it checks its flags: refused for the flag
# alone, it accepted the file.
expect_bad example_loads "--socket-mode: 'rw' is not an octal mode" --config "$example" --socket-mode rw

if [ "$fails" -ne 0 ]; then echo "$fails check(s) failed"; exit 1; fi
echo "all droced configuration checks passed"
exit 0
