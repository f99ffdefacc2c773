#!/usr/bin/env bash
# rdma-core's own conformance suite (Debian's python3-pyverbs, the tests in
# /usr/share/doc/rdma-core/tests) against droce0 on the default loopback
# link, run as a new user runs it (`run_tests.py --dev droce0`):
#
#   pyverbs_suite.sh LAUNCHER embedded|daemon [DROCED] [SEED...]
#
# embedded: one process, its own engine. daemon: the suite as a client of a
# droced started for it; in a network namespace of the test's own where a
# veth carries the port's address (10.77.0.1), so that the suite finds the
# device's net interface (device/net in the sysfs view) and runs its
# rdma_cm tests, whose two forked processes are two clients of the daemon.
# Each SEED seeds Python's random (the suite draws QP caps and creation
# masks at random) for one run. Fails on any failure or error, and on any
# skip whose reason is not one of the known ones below (hardware droce
# cannot be, or a gap of droce's listed in docs/FEATURES.md): a test that
# passed and now skips is a regression.
# shellcheck disable=SC2317  # pyverbs_cleanup runs from the exit trap
set -uo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 2 - "LAUNCHER embedded|daemon [DROCED] [SEED...]"
here=$(cd "$(dirname "$0")" && pwd)
launcher=$1 mode=$2
shift 2
droced=""
if [ "$mode" = daemon ]; then droced=$1; shift; fi
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(1)
t_launcher "$launcher"
[ "$mode" = daemon ] && t_launcher "$droced"
src=/usr/share/doc/rdma-core/tests
[ -f "$src/run_tests.py" ] || skip "python3-pyverbs is not installed"

# Known skip reasons (a regular expression per line, matched against the
# reason unittest prints).
known=(
  # hardware or a kernel droce cannot be
  "Can not run the test over non MLX5 device"
  "Could not open mlx5 context"
  "Can not run the test over non EFA device"
  "Device memory is not supported"
  "Allocating dmabuf is not supported"
  "cuda-python .* must be installed"
  "There are no huge pages of size 2M allocated"
  "PCI device must be passed by the user"
  "Create QP type 8 is not supported"               # raw packet QPs on a NIC
  "Create Raw Packet QP .* is not supported"
  "Converting timestamp to nanoseconds is not supported"  # mlx5dv's clock conversion
  # Tag matching (an mlx5 offload; rxe has none): its CQ asks for
  # IBV_WC_EX_WITH_TM_INFO, which droce refuses
  "^Extended CQ is not supported$"
  # droce's gaps (docs/FEATURES.md, "rdma-core's pyverbs suite")
  "All gid indices populated, cannot check bad flow"
)
# Embedded mode only: the rdma_cm tests fork a passive and an active
# process, which an embedded engine cannot serve (docs/FEATURES.md).
[ "$mode" = embedded ] && known+=("Device droce0 doesn't have net interface")
# Daemon mode only: ibv_rereg_mr with a new range (IBV_REREG_MR_CHANGE_TRANSLATION)
# is not offered to droced's clients.
[ "$mode" = daemon ] && known+=("Rereg MR is not supported")

t_setup pyverbs
ns=""
# The daemon mode's namespace: what runs in it, then itself.
pyverbs_cleanup() {
  t_kill_all
  [ -n "$ns" ] && ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  [ -n "$ns" ] && ip netns del "$ns" 2>/dev/null
  return 0
}
on_exit pyverbs_cleanup
cp -r "$src" "$dir/tests"
gunzip -f "$dir"/tests/*.gz
# run_tests.py after random.seed(SEED).
cat >"$dir/seeded.py" <<'EOF'
import random, runpy, sys
random.seed(int(sys.argv[1]))
sys.argv = [sys.argv[2]] + sys.argv[3:]
sys.path.insert(0, __import__('os').path.dirname(sys.argv[0]))
runpy.run_path(sys.argv[0], run_name='__main__')
EOF

run=()
if [ "$mode" = daemon ]; then
  ns="droce-pyv-$$"
  ip netns add "$ns" || skip "cannot make a namespace"
  ip -n "$ns" link set lo up
  ip -n "$ns" link add "pyv$$" type veth peer name "pyw$$" || skip "no veth"
  ip -n "$ns" link set "pyv$$" up && ip -n "$ns" link set "pyw$$" up
  ip -n "$ns" addr add 10.77.0.1/24 dev "pyv$$"
  run=(ip netns exec "$ns" bash "$here/with_droced.sh" "$droced" --)
fi

fail=0
for seed in "${seeds[@]}"; do
  log="$dir/seed$seed.log"
  timeout 600 "${run[@]}" "$launcher" exec -- /usr/bin/python3 "$dir/seeded.py" "$seed" \
    "$dir/tests/run_tests.py" --dev droce0 -v >"$log" 2>&1
  rc=$?
  summary=$(grep -E '^(OK|FAILED)( \(|$)' "$log" | tail -1)
  passed=$(grep -cE ' \.\.\. ok$' "$log")
  echo "seed $seed ($mode): $summary, $passed passed (exit $rc)"
  if [ "$rc" -ne 0 ] || [[ "$summary" != OK* ]]; then
    echo "FAIL: the suite did not pass with seed $seed"
    grep -E '^(FAIL|ERROR): ' "$log"
    tail -40 "$log"
    fail=1
    continue
  fi
  # Every skip reason must be a known one.
  while IFS= read -r reason; do
    ok=0
    for k in "${known[@]}"; do [[ "$reason" =~ $k ]] && { ok=1; break; }; done
    [ "$ok" = 1 ] || { echo "FAIL: seed $seed: a skip with an unknown reason: $reason"; grep -F -- "$reason" "$log" | head -3; fail=1; }
  done < <(grep -oE "skipped '.*'$|skipped \".*\"$" "$log" | sed -E "s/^skipped ['\"](.*)['\"]$/\1/" | sort -u)
  # The skips, counted by reason, for whoever reads the log.
  grep -oE "skipped ['\"].*['\"]$" "$log" | sort | uniq -c | sort -rn
done
[ "$fail" = 0 ] && echo "PASS"
exit "$fail"
