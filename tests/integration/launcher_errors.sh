#!/usr/bin/env bash
# Checks the launcher's flag validation and environment setup, and that the
# launcher and the provider agree on what is valid.
#
# usage: launcher_errors.sh LAUNCHER [PROVIDER]
#   - bad flags and a missing program exit 2 with exactly one line on stderr
#     starting with "droce: " (and nothing on stdout);
#   - `exec -- env` runs env with LD_PRELOAD starting with libdroce.so and the
#     DROCE_* variables of the flags given;
#   - every value the launcher refuses, the provider refuses too, with the same
#     reason (`droce: exec: --FLAG: REASON` / `droce: DROCE_VAR: REASON`, the
#     provider preloaded into ibv_devinfo without the launcher), and every value
#     the launcher accepts, the provider accepts (`exec --FLAG VALUE --
#     ibv_devinfo -l` lists the devices: the provider parsed every setting).
#   PROVIDER defaults to the build tree's, next to the launcher.
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 1 2 "LAUNCHER [PROVIDER]"
launcher=$1
provider=${2:-$(dirname "$launcher")/../../providers/libdroce.so}
t_launcher "$launcher"

# Nothing from the caller's environment: the launcher checks the DROCE_*
# variables it passes through as well.
unset "${!DROCE_@}"
t_setup launcher-test

# Extra VAR=VALUE settings for the next launcher run only (see run_launcher).
with_env=()
run_launcher() {  # run_launcher TIMEOUT ARGS...: stdout/stderr to $dir/out, $dir/err
  local t=$1
  shift
  timeout "$t" env "${with_env[@]}" "$launcher" "$@" </dev/null >"$dir/out" 2>"$dir/err"
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
  lines=$(wc -l <"$dir/err")
  if [ "$rc" -ne 2 ]; then
    not_ok "$desc: exit status $rc, want 2 (stderr: $(cat "$dir/err"))"
  elif [ "$lines" -ne 1 ]; then
    not_ok "$desc: $lines lines on stderr, want 1:"; cat "$dir/err"
  elif ! head -n1 "$dir/err" | grep -q '^droce: '; then
    not_ok "$desc: stderr does not start with 'droce: ': $(cat "$dir/err")"
  elif [ -s "$dir/out" ]; then
    not_ok "$desc: unexpected output on stdout: $(cat "$dir/out")"
  else
    ok "$desc -> $(cat "$dir/err")"
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
with_env=(DROCE_PROVIDER="$dir/nonexistent.so")
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
    not_ok "$desc: exit status $rc (stderr: $(cat "$dir/err"))"
  elif ! grep -Eq -- "$pattern" "$dir/out"; then
    not_ok "$desc: no line matching '$pattern' in:"; cat "$dir/out"
  else
    ok "$desc -> $(grep -E -- "$pattern" "$dir/out" | head -n1)"
  fi
}

expect_env "exec -- env: LD_PRELOAD has libdroce.so" \
  '^LD_PRELOAD=/[^:]*/libdroce\.so(\.0)?(:|$)' exec -- env
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
# What the caller already preloads (the sanitizer run: the ASan runtime,
# which an instrumented launcher needs) stays, before the test's entry.
inherited=${LD_PRELOAD:+$LD_PRELOAD:}
with_env=(LD_PRELOAD="${inherited}/nonexistent/keep-me.so")
expect_env "existing LD_PRELOAD entries are kept after the provider" \
  "^LD_PRELOAD=/[^:]*/libdroce\\.so(\\.0)?:${inherited//./\\.}/nonexistent/keep-me\\.so\$" exec -- env
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
  if grep -Eq -- "$pattern" "$dir/err"; then
    ok "$desc -> $(grep -E -- "$pattern" "$dir/err" | head -n1)"
  else
    not_ok "$desc: no line matching '$pattern' on stderr:"; cat "$dir/err"
  fi
}
if command -v ibv_devices >/dev/null 2>&1; then
  expect_stderr "--worker-cpu pins the worker" \
    'droce0 up: .*worker on CPU 0' exec --worker-cpu 0 --log-level info -- ibv_devices
  # A CPU list: each element must be a CPU of the process; repeats are fine.
  expect_stderr "--worker-cpu 0,0 is accepted" \
    '^droce: info: droce0 up: ' exec --worker-cpu 0,0 --log-level info -- ibv_devices
  expect_stderr "--workers 2 is accepted" \
    '^droce: info: droce0 up: ' exec --workers 2 --log-level info -- ibv_devices
fi
# demo checks --workers as exec does, before starting anything.
expect_usage_error "demo --workers 0" demo --workers 0 --iters 1
if ! grep -Fxq "droce: demo: --workers: '0' is not a worker count (1 to 16)" "$dir/err"; then
  not_ok "demo --workers 0: unexpected message: $(cat "$dir/err")"
fi
# ---------------------------------------------------------------------------
# The launcher and the provider agree: they share one parser
# (src/config/settings.h), and these pin it down from the outside.
devinfo=$(command -v ibv_devinfo || true)
if [ -z "$devinfo" ] || [ ! -f "$provider" ]; then
  echo "SKIP (agreement checks): need ibv_devinfo and the provider '$provider'"
else
  var_of() { local f=${1^^}; echo "DROCE_${f//-/_}"; }  # ip6 -> DROCE_IP6, worker-cpu -> DROCE_WORKER_CPU

  # ibv_devinfo -l with the provider preloaded directly, no launcher:
  # ibv_get_device_list parses every setting of every device (no device is
  # opened, so nothing needs hugepages or a real link).
  run_provider() {  # run_provider VAR=VALUE...: stdout/stderr to $dir/out, $dir/err
    # What the caller preloads stays after the provider (the sanitizer run's
    # runtime), as the launcher keeps it.
    timeout 30 env "$@" LD_PRELOAD="$provider${LD_PRELOAD:+:$LD_PRELOAD}" "$devinfo" -l </dev/null >"$dir/out" 2>"$dir/err"
  }

  # expect_both_refuse FLAG VALUE [FLAG2 VALUE2 ...]: `droce exec --FLAG VALUE
  # [--FLAG2 VALUE2 ...]` exits 2 with `droce: exec: --FLAG: REASON`, and the
  # provider given DROCE_FLAG=VALUE [DROCE_FLAG2=VALUE2 ...] fails with
  # `droce: DROCE_FLAG: REASON`, the same REASON.
  expect_both_refuse() {
    local flag=$1 value=$2 var reason
    var=$(var_of "$flag")
    local flags=() vars=()
    while [ $# -ge 2 ]; do
      flags+=("--$1" "$2")
      vars+=("$(var_of "$1")=$2")
      shift 2
    done
    local desc="--$flag '$value'${flags[2]:+ (with ${flags[*]:2})}"
    run_launcher 10 exec "${flags[@]}" -- true
    local rc=$?
    if [ "$rc" -ne 2 ] || [ "$(wc -l <"$dir/err")" -ne 1 ] || ! grep -q -- "^droce: exec: --$flag: " "$dir/err"; then
      not_ok "$desc: launcher exit $rc, want 2 and one line 'droce: exec: --$flag: ...': $(cat "$dir/err")"
      return
    fi
    reason=$(sed "s/^droce: exec: --$flag: //" "$dir/err")
    run_provider "${vars[@]}"
    rc=$?
    if [ "$rc" -eq 0 ]; then
      not_ok "$desc: the launcher refuses it ($reason) but the provider accepts $var='$value'"
    elif ! grep -Fxq -- "droce: $var: $reason" "$dir/err"; then
      not_ok "$desc: the provider refuses $var='$value' for another reason: $(cat "$dir/err"), launcher: $reason"
    else
      ok "$desc refused by both: $reason"
    fi
  }

  # expect_both_accept HCAS FLAG VALUE [FLAG2 VALUE2 ...]: the launcher takes
  # the flags and the provider, given the variables they set, lists HCAS
  # devices.
  expect_both_accept() {
    local hcas=$1
    shift
    local flags=()
    while [ $# -ge 2 ]; do
      flags+=("--$1" "$2")
      shift 2
    done
    run_launcher 30 exec "${flags[@]}" -- "$devinfo" -l
    local rc=$?
    if [ "$rc" -ne 0 ]; then
      not_ok "${flags[*]}: exit $rc, want 0 (stderr: $(cat "$dir/err"))"
    elif ! grep -Eq "^$hcas HCAs? found" "$dir/out"; then
      not_ok "${flags[*]}: want $hcas devices listed, got: $(cat "$dir/out")"
    else
      ok "${flags[*]} accepted by both ($hcas device(s))"
    fi
  }

  memif() { echo "net_memif$1,role=$2,socket=$dir/memif.sock,socket-abstract=no"; }
  two_links="$(memif 0 server);$(memif 1 client)"
  seventeen=$(for i in $(seq 0 16); do printf 'net_ring%d;' "$i"; done)

  # Refused by both. Two past regressions first: a gateway with a
  # prefix length (the launcher took it, the engine did not) and address
  # lists longer than the device list (the engine ignored the extra entries
  # unchecked).
  expect_both_refuse gateway 10.77.0.254/24
  expect_both_refuse ip '10.77.9.1/24;10.77.9.2/24'
  expect_both_refuse ip '10.77.9.1/24;10.77.9.2/24;10.77.9.3/24' link "$two_links"
  expect_both_refuse ip '10.77.9.1/24;10.77.9' link "$two_links"
  expect_both_refuse link "$seventeen"
  for v in 300.1.1.1 10.0.0.1/33 10.0.0 010.0.0.1 10.0.0.1/+24 10.0.0.1/ ' 10.0.0.1'; do
    expect_both_refuse ip "$v"
  done
  for v in zz ff02::1 :: fd78::1/129 'fd78:1::1;fd78:1::2'; do expect_both_refuse ip6 "$v"; done
  for v in zz 02:00:0a:00:00 +2:00:0a:00:00:01 '02:00:0a:00:00:01;02:00:0a:00:00:02'; do
    expect_both_refuse mac "$v"
  done
  for v in 1000 ' 1024' +1024 0x400; do expect_both_refuse mtu "$v"; done
  for v in 10.1.1.1 10.77.0.1 10.77.0 10.77.0.254,; do expect_both_refuse gateway "$v"; done
  expect_both_refuse gateway 10.77.0.254 link "$two_links"  # droce1 is on 10.77.1.0/24
  expect_both_refuse gateway 10.78.1.2 ip 10.78.2.11/24
  for v in 0 4095 +5 5:8 5:; do expect_both_refuse vlan "$v"; done
  expect_both_refuse hugepages yes
  expect_both_refuse progress App
  expect_both_refuse log-level loud
  for v in 0 17 abc +2 ' 2' '2;2'; do expect_both_refuse workers "$v"; done
  for v in 4096 0,4096 +0 0,; do expect_both_refuse worker-cpu "$v"; done
  for v in 'loss randum 10%' 'loss 1%; delay 5 parsecs' 'drop' 'corrupt 101%'; do expect_both_refuse fault "$v"; done
  expect_both_refuse worker-cpu '0;0;0' link "$two_links"

  # Accepted by both. The regression: one address per device, ';'-separated,
  # as DROCE_IP always took it (the launcher refused the ';').
  expect_both_accept 2 link "$two_links" ip '10.77.9.1/24;10.77.9.2/24'
  expect_both_accept 2 link "$two_links" ip ';10.77.9.2/24' ip6 'fd78:9::1/64;fd78:9::2/64' \
    mac '02:00:00:00:09:01;02:00:00:00:09:02' workers '1;2' worker-cpu '0;0,0'
  expect_both_accept 1 link "$(memif 0 server);"
  expect_both_accept 1 link "$(memif 0 server)" ip 10.78.1.11/24 gateway 10.78.1.2
  expect_both_accept 2 link "$two_links" ip '10.5.0.1/16;10.5.1.1/16' gateway 10.5.0.254
  for v in 10.9.8.7 10.9.8.7/16 10.9.8.7/0 10.9.8.7/32; do expect_both_accept 1 ip "$v"; done
  for v in fd78:1::11/64 fd78:1::11 ::ffff:10.0.0.1/96; do expect_both_accept 1 ip6 "$v"; done
  for v in 02:00:0a:09:08:07 02:AB:cd:00:00:01; do expect_both_accept 1 mac "$v"; done
  for v in 256 512 1024 2048 4096; do expect_both_accept 1 mtu "$v"; done
  expect_both_accept 1 gateway 10.77.0.254
  for v in 1 4094 100:7; do expect_both_accept 1 vlan "$v"; done
  for v in auto on off; do expect_both_accept 1 hugepages "$v"; done
  for v in app thread; do expect_both_accept 1 progress "$v"; done
  for v in error warning info debug; do expect_both_accept 1 log-level "$v"; done
  for v in 1 16; do expect_both_accept 1 workers "$v"; done
  last_cpu=$(sed -n 's/^Cpus_allowed_list:.*[-,\t]//p' /proc/self/status)  # "0-3" -> 3
  for v in 0 0,0 "$last_cpu"; do expect_both_accept 1 worker-cpu "$v"; done

  # Settings without a flag, and variables the launcher passes through: it
  # checks them too, naming the variable, with the provider's reason.
  for setting in DROCE_POLL_YIELD=abc DROCE_STATS=yes DROCE_IP6=zz DROCE_WORKERS=0; do
    var=${setting%%=*}
    with_env=("$setting")
    run_launcher 10 exec -- true
    rc=$?
    reason=$(sed -n "s/^droce: exec: $var: //p" "$dir/err")
    run_provider "$setting"
    if [ "$rc" -eq 2 ] && [ -n "$reason" ] && grep -Fxq -- "droce: $var: $reason" "$dir/err"; then
      ok "$setting in the environment refused by both: $reason"
    else
      not_ok "$setting in the environment: launcher exit $rc ($reason), provider: $(cat "$dir/err")"
    fi
  done
  with_env=(DROCE_POLL_YIELD=0 DROCE_STATS=1)
  expect_env "DROCE_POLL_YIELD=0 DROCE_STATS=1 accepted by both" '^1 HCA found' exec -- "$devinfo" -l
  # A flag overrides a bad variable.
  with_env=(DROCE_MTU=1000)
  expect_env "--mtu overrides a bad DROCE_MTU" '^1 HCA found' exec --mtu 2048 -- "$devinfo" -l
  # The launcher alone refuses an empty flag (likely an unset shell variable);
  # for the provider an empty variable is an unset one.
  for flag in link ip gateway workers; do
    expect_usage_error "--$flag ''" exec "--$flag" '' -- true
  done
  run_provider DROCE_IP= DROCE_LINK=
  if [ $? -eq 0 ]; then ok "empty DROCE_IP and DROCE_LINK mean unset for the provider"; else not_ok "empty variables refused: $(cat "$dir/err")"; fi

  # The same regression with the devices opened: two memif-linked devices
  # with one address each come up.
  if command -v ibv_devices >/dev/null 2>&1; then
    expect_stderr "two links, one address each: both devices come up" \
      '^droce: info: droce1 up: .*MAC 02:00:0a:4d:09:02' \
      exec --link "$two_links" --ip '10.77.9.1/24;10.77.9.2/24' --log-level info -- ibv_devices
  fi
fi

expect_env "version" '^droce [0-9]' version
expect_env "help" '^usage: droce' help

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
