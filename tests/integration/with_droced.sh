#!/usr/bin/env bash
# Runs a command as a client of a droced started for it (the
# provider's own test suites in daemon mode):
#   with_droced.sh DROCED [DROCED ARGS...] -- CMD [ARGS...]
# The daemon gets a socket in a temporary directory (@DIR@ in its
# arguments names that directory, e.g. for a memif socket); CMD runs with
# DROCE_DAEMON pointing at it (and no DROCE_LINK). Passes if CMD passes and
# the daemon then stops on SIGTERM with nothing left.
set -u
droced=$1
shift
dargs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do dargs+=("$1"); shift; done
shift
dir=$(mktemp -d /tmp/droce-withd.XXXXXX) || exit 1
dpid=""
cleanup() {
  [ -n "$dpid" ] && kill -KILL -- "-$dpid" 2>/dev/null
  wait 2>/dev/null
  rm -rf -- "$dir"
}
trap cleanup EXIT
dargs=("${dargs[@]//@DIR@/$dir}")
timeout 600 "$droced" --config /dev/null --socket "$dir/d.sock" "${dargs[@]}" </dev/null >"$dir/d.log" 2>&1 &
dpid=$!
for _ in $(seq 1 100); do [ -S "$dir/d.sock" ] && break; sleep 0.05; done
[ -S "$dir/d.sock" ] || { echo "FAIL: droced did not listen"; cat "$dir/d.log"; exit 1; }
env -u DROCE_LINK DROCE_DAEMON="$dir/d.sock" "$@"
rc=$?
kill -TERM "$dpid"
wait "$dpid"
drc=$?
dpid=""
tail -3 "$dir/d.log"
[ "$rc" -eq 0 ] || { echo "FAIL: the command exited $rc"; exit 1; }
[ "$drc" -eq 0 ] || { echo "FAIL: droced exited $drc"; exit 1; }
grep -q 'stopped (clients 0 live.*objects 0, memory maps 0;' "$dir/d.log" || { echo "FAIL: droced left objects"; exit 1; }
exit 0
