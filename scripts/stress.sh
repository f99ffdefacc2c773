#!/usr/bin/env bash
# scripts/stress.sh [N] [TEST...]: runs the default suite (or the named
# tests) N times (default 3) beside a CPU hog, and prints each test's
# failures out of N. A test that depends on timing must pass here before it
# is trusted (README.md, "Building and testing").
#
# The hog: one busy loop per CPU at nice 10, started before the first run
# and stopped at the end, so the suite meets a machine as busy as a build
# beside it makes it (the CI history: sr_memif, cm_mckey, ctl_live,
# trace_memif and pyverbs_suite_daemon each failed on timing on such a
# machine before it was fixed). DROCE_STRESS_HOG=0 runs without it.
#
# Environment: BUILD (default build), DROCE_STRESS_HOG (busy loops; default
# the number of CPUs). The interop, package and slow suites are left out unless
# tests of theirs are named.
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/.."
n=${1:-3}
[ $# -gt 0 ] && shift
case $n in '' | *[!0-9]*) echo "usage: $0 [N] [TEST...]" >&2; exit 2 ;; esac
build=${BUILD:-build}
[ -d "$build" ] || { echo "stress: no build in '$build' (scripts/build.sh)" >&2; exit 1; }
hogs=${DROCE_STRESS_HOG:-$(nproc)}
logs=$(mktemp -d /tmp/droce-stress.XXXXXX)

hog_pids=()
stop_hogs() {
  local p
  for p in "${hog_pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
}
trap stop_hogs EXIT
trap 'exit 130' INT TERM HUP
for (( i = 0; i < hogs; i++ )); do
  nice -n 10 bash -c 'while :; do :; done' &
  hog_pids+=("$!")
done

select=(--no-suite slow --no-suite interop --no-suite package)
[ $# -gt 0 ] && select=("$@")
declare -A fails=() seen=()
for (( r = 1; r <= n; r++ )); do
  t0=$SECONDS
  meson test -C "$build" --print-errorlogs "${select[@]}" >"$logs/run$r.log" 2>&1
  cp "$build/meson-logs/testlog.json" "$logs/run$r.json" 2>/dev/null
  # Each test's result from meson's JSON log (one object per line).
  failed_now=0
  while IFS=$'\t' read -r name result; do
    seen[$name]=1
    case $result in
      OK | SKIP | EXPECTEDFAIL) ;;
      *) fails[$name]=$(( ${fails[$name]:-0} + 1 )); failed_now=$(( failed_now + 1 )) ;;
    esac
  done < <(/usr/bin/python3 -c '
import json, sys
for line in open(sys.argv[1]):
    t = json.loads(line)
    print(t["name"] + "\t" + t["result"])' "$logs/run$r.json")
  echo "run $r of $n: $(( SECONDS - t0 )) s, $failed_now failed"
done
stop_hogs
trap - EXIT

echo
echo "tests run: ${#seen[@]}; with $hogs busy loops at nice 10 beside them; logs in $logs"
if [ ${#fails[@]} -eq 0 ]; then
  echo "0 failures in $n runs"
  exit 0
fi
echo "failures out of $n:"
for name in "${!fails[@]}"; do echo "  ${fails[$name]}/$n  $name"; done | sort -t/ -k1,1nr
exit 1
