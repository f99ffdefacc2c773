#!/usr/bin/env bash
# Runs a command as a client of a droced started for it (the
# provider's own test suites in daemon mode):
#   with_droced.sh DROCED [DROCED ARGS...] -- CMD [ARGS...]
# The daemon gets a socket in a temporary directory (@DIR@ in its
# arguments names that directory, e.g. for a memif socket); CMD runs with
# DROCE_DAEMON pointing at it (and no DROCE_LINK). Passes if CMD passes and
# the daemon then stops on SIGTERM with nothing left.
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 3 - "DROCED [DROCED ARGS...] -- CMD [ARGS...]"
T_DROCED=$1 T_DROCED_TIMEOUT=600  # start_droced's
shift
dargs=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do dargs+=("$1"); shift; done
shift
t_setup withd
dargs=("${dargs[@]//@DIR@/$dir}")
start_droced d "${dargs[@]}"
env -u DROCE_LINK DROCE_DAEMON="$dir/d.sock" "$@"
rc=$?
fail=0
stop_daemons  # SIGTERM: exit 0, nothing left (else fail=1)
tail -3 "$dir/d.log"
[ "$rc" -eq 0 ] || fail "the command exited $rc"
[ "$fail" -eq 0 ] || exit 1
exit 0
