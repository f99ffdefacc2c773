#!/usr/bin/env bash
# Checks the launcher's flag validation and environment setup.
#
# usage: launcher_errors.sh LAUNCHER
#   - bad flags and a missing program exit 2 with exactly one line on stderr
#     starting with "droce: " (and nothing on stdout);
#   - `exec -- env` runs env with LD_PRELOAD starting with libdroce.so and the
#     DROCE_* variables of the flags given.
set -u

if [ $# -ne 1 ]; then
  echo "usage: $0 LAUNCHER" >&2
  exit 2
fi
launcher=$1
if [ ! -x "$launcher" ]; then
  echo "FAIL: launcher '$launcher' is not an executable file" >&2
  exit 1
fi

unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU DROCE_LOG_LEVEL DROCE_WORKERS DROCE_WORKER_CPU
tmp=$(mktemp -d /tmp/droce-launcher-test.XXXXXX) || exit 1
trap 'rm -rf -- "$tmp"' EXIT

# Extra VAR=VALUE settings for the next launcher run only (see run_launcher).
with_env=()
run_launcher() {  # run_launcher TIMEOUT ARGS...: stdout/stderr to $tmp/out, $tmp/err
  local t=$1
  shift
  timeout "$t" env "${with_env[@]}" "$launcher" "$@" </dev/null >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  with_env=()
  return "$rc"
}

passed=0
failed=0
ok() { passed=$((passed + 1)); echo "ok: $*"; }
not_ok() { failed=$((failed + 1)); echo "FAIL: $*"; }

# expect_usage_error DESCRIPTION ARGS...: exit 2, one "droce: " line on stderr.
expect_usage_error() {
  local desc=$1
  shift
  local rc lines
  run_launcher 10 "$@"
  rc=$?
  lines=$(wc -l <"$tmp/err")
  if [ "$rc" -ne 2 ]; then
    not_ok "$desc: exit status $rc, want 2 (stderr: $(cat "$tmp/err"))"
  elif [ "$lines" -ne 1 ]; then
    not_ok "$desc: $lines lines on stderr, want 1:"; cat "$tmp/err"
  elif ! head -n1 "$tmp/err" | grep -q '^droce: '; then
    not_ok "$desc: stderr does not start with 'droce: ': $(cat "$tmp/err")"
  elif [ -s "$tmp/out" ]; then
    not_ok "$desc: unexpected output on stdout: $(cat "$tmp/out")"
  else
    ok "$desc -> $(cat "$tmp/err")"
  fi
}

expect_usage_error "--mtu 1000" exec --mtu 1000 -- true
expect_usage_error "--mtu=1000" exec --mtu=1000 -- true
expect_usage_error "--ip 300.1.1.1" exec --ip 300.1.1.1 -- true
expect_usage_error "--ip 10.0.0.1/33" exec --ip 10.0.0.1/33 -- true
expect_usage_error "--ip 10.0.0" exec --ip 10.0.0 -- true
expect_usage_error "--mac zz" exec --mac zz -- true
expect_usage_error "--mac 02:00:0a:00:00" exec --mac 02:00:0a:00:00 -- true
expect_usage_error "--log-level loud" exec --log-level loud -- true
expect_usage_error "--link ''" exec --link '' -- true
expect_usage_error "unknown flag" exec --bogus 1 -- true
expect_usage_error "flag without value" exec --ip
expect_usage_error "missing program after --" exec --
expect_usage_error "missing -- and program" exec
expect_usage_error "missing -- and program after flags" exec --ip 10.0.0.1
expect_usage_error "program without --" exec true
expect_usage_error "unknown command" frobnicate
with_env=(DROCE_PROVIDER="$tmp/nonexistent.so")
expect_usage_error "DROCE_PROVIDER that does not exist" exec -- true

# expect_env DESCRIPTION PATTERN ARGS...: `LAUNCHER ARGS...` exits 0 and its
# stdout has a line matching the extended regex PATTERN.
expect_env() {
  local desc=$1 pattern=$2
  shift 2
  local rc
  run_launcher 30 "$@"
  rc=$?
  if [ "$rc" -ne 0 ]; then
    not_ok "$desc: exit status $rc (stderr: $(cat "$tmp/err"))"
  elif ! grep -Eq -- "$pattern" "$tmp/out"; then
    not_ok "$desc: no line matching '$pattern' in:"; cat "$tmp/out"
  else
    ok "$desc -> $(grep -E -- "$pattern" "$tmp/out" | head -n1)"
  fi
}

expect_env "exec -- env: LD_PRELOAD has libdroce.so" \
  '^LD_PRELOAD=/[^:]*/libdroce\.so(:|$)' exec -- env
expect_env "exec --ip: DROCE_IP set" \
  '^DROCE_IP=10\.9\.8\.7/24$' exec --ip 10.9.8.7/24 -- env
expect_env "exec --ip=: DROCE_IP set" \
  '^DROCE_IP=10\.9\.8\.7$' exec --ip=10.9.8.7 -- env
expect_env "exec --mtu --mac --log-level --link" \
  '^DROCE_MTU=2048$' exec --mtu 2048 --mac 02:00:0a:09:08:07 --log-level debug \
  --link net_memif0,role=server,socket=/tmp/x.sock -- env
expect_env "exec --mac: DROCE_MAC set" \
  '^DROCE_MAC=02:00:0a:09:08:07$' exec --mac=02:00:0a:09:08:07 -- env
expect_env "exec --log-level: DROCE_LOG_LEVEL set" \
  '^DROCE_LOG_LEVEL=info$' exec --log-level info -- env
expect_env "exec --link: DROCE_LINK set verbatim" \
  '^DROCE_LINK=net_memif0,role=client,socket=/tmp/x\.sock,socket-abstract=no$' \
  exec --link net_memif0,role=client,socket=/tmp/x.sock,socket-abstract=no -- env
# (ld.so complains on stderr about the missing file; only stdout is checked)
with_env=(LD_PRELOAD=/nonexistent/keep-me.so)
expect_env "existing LD_PRELOAD entries are kept after the provider" \
  '^LD_PRELOAD=/[^:]*/libdroce\.so:/nonexistent/keep-me\.so$' exec -- env
expect_env "exec --worker-cpu: DROCE_WORKER_CPU set" \
  '^DROCE_WORKER_CPU=0$' exec --worker-cpu 0 -- env
expect_env "exec --worker-cpu with a list: DROCE_WORKER_CPU set verbatim" \
  '^DROCE_WORKER_CPU=0,1$' exec --worker-cpu 0,1 -- env
expect_env "exec --workers: DROCE_WORKERS set" \
  '^DROCE_WORKERS=2$' exec --workers 2 -- env
expect_env "exec --workers=: DROCE_WORKERS set" \
  '^DROCE_WORKERS=16$' exec --workers=16 -- env

# expect_stderr DESCRIPTION PATTERN ARGS...: `LAUNCHER ARGS...` prints a line
# matching PATTERN on stderr (the provider's own validation and log).
expect_stderr() {
  local desc=$1 pattern=$2
  shift 2
  run_launcher 30 "$@"
  if grep -Eq -- "$pattern" "$tmp/err"; then
    ok "$desc -> $(grep -E -- "$pattern" "$tmp/err" | head -n1)"
  else
    not_ok "$desc: no line matching '$pattern' on stderr:"; cat "$tmp/err"
  fi
}
if command -v ibv_devices >/dev/null 2>&1; then
  expect_stderr "--worker-cpu outside the process's CPUs is refused by the provider" \
    "^droce: DROCE_WORKER_CPU: '4096' is not a CPU this process may run on" exec --worker-cpu 4096 -- ibv_devices
  expect_stderr "--worker-cpu pins the worker" \
    'droce0 up: .*worker on CPU 0' exec --worker-cpu 0 --log-level info -- ibv_devices
  # A CPU list: each element must be a CPU of the process; repeats are fine.
  expect_stderr "--worker-cpu 0,0 is accepted" \
    '^droce: droce0 up: ' exec --worker-cpu 0,0 --log-level info -- ibv_devices
  expect_stderr "--worker-cpu 0,4096 is refused naming the bad element" \
    "^droce: DROCE_WORKER_CPU: '4096' is not a CPU this process may run on" exec --worker-cpu 0,4096 -- ibv_devices
  expect_stderr "--workers 2 is accepted" \
    '^droce: droce0 up: ' exec --workers 2 --log-level info -- ibv_devices
  # Out of 1..16 or not a number: the provider refuses it, naming the variable.
  expect_stderr "--workers 0 is refused by the provider" \
    "^droce: DROCE_WORKERS: '0' is not a worker count \\(1 to 16\\)$" exec --workers 0 -- ibv_devices
  for bad in 0 17 abc +2; do
    with_env=(DROCE_WORKERS="$bad")
    expect_stderr "DROCE_WORKERS=$bad is refused by the provider" \
      "^droce: DROCE_WORKERS: '${bad//+/\\+}' is not a worker count \\(1 to 16\\)$" exec -- ibv_devices
  done
fi
if command -v ibv_rc_pingpong >/dev/null 2>&1; then
  # demo passes --workers to both sides' exec: the server's provider refuses 0
  # (the client is never started) and demo fails.
  run_launcher 30 demo --workers 0 --iters 1
  rc=$?
  pattern="^\\[server\\] droce: DROCE_WORKERS: '0' is not a worker count"
  if [ "$rc" -ne 0 ] && grep -Eq -- "$pattern" "$tmp/out"; then
    ok "demo --workers 0 reaches the provider (exit $rc) -> $(grep -E -- "$pattern" "$tmp/out" | head -n1)"
  else
    not_ok "demo --workers 0: exit $rc, want non-zero and a line matching '$pattern' on stdout:"; cat "$tmp/out" "$tmp/err"
  fi
fi
expect_env "version" '^droce [0-9]' version
expect_env "help" '^usage: droce' help

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
