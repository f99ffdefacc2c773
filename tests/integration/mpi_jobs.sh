#!/usr/bin/env bash
# Open MPI jobs over droce with `--mca pml ucx`, each rank with
# its own droce link and address through droce-rank, data checked by
# mpi_check (ping-pong, allreduce, a non-blocking ring exchange):
#   1. 2 ranks joined by a memif link;
#   2. 4 ranks, each on its own veth on one Linux bridge, inside a network
#      namespace this test makes (af_packet links).
# Both must start, pass and finalize within the time bound; every rank's
# traffic must have gone through droce (DROCE_STATS counters).
#
# usage: mpi_jobs.sh DROCE_RANK MPI_CHECK
# shellcheck disable=SC2317  # cleanup runs from traps
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 2 2 "DROCE_RANK MPI_CHECK"
rank_tool=$1
check=$2
t_launcher "$rank_tool"
require_program mpirun openmpi-bin
require_program ucx_info ucx-utils
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU

t_setup mpi
ns="droce-mpi-$$"
mpi_netns_cleanup() {
  t_kill_all
  ip netns pids "$ns" 2>/dev/null | xargs -r kill -KILL 2>/dev/null
  ip netns del "$ns" 2>/dev/null
  return 0
}
on_exit mpi_netns_cleanup

# UCX's defaults except the transports it may pick: droce's, and self.
mpi=(mpirun --allow-run-as-root --oversubscribe --mca pml ucx --mca btl self
     -x UCX_TLS=rc_verbs,ud_verbs,self -x DROCE_STATS=1)
fail=0
# run_job NAME NP [ns exec prefix...] -- droce-rank args...
run_job() {
  local name=$1 np=$2 rc
  shift 2
  local prefix=()
  while [ "$1" != "--" ]; do prefix+=("$1"); shift; done
  shift
  timeout -s KILL 120 "${prefix[@]}" "${mpi[@]}" -np "$np" "$rank_tool" "$@" -- "$check" >"$dir/$name.log" 2>&1
  rc=$?
  local ranks_with_traffic
  ranks_with_traffic=$(grep -cE "droce:   rcvd_pkts +[1-9][0-9]{2,}" "$dir/$name.log")
  if [ "$rc" -eq 0 ] && grep -q "mpi_check: $np ranks: ping-pong, allreduce, exchange OK" "$dir/$name.log" &&
     [ "$ranks_with_traffic" -ge "$np" ]; then
    echo "ok: $name: $np ranks passed and finalized ($ranks_with_traffic device reports with traffic)"
  else
    echo "FAIL: $name (rc=$rc, device reports with traffic: $ranks_with_traffic of $np)"
    grep -v "^droce:   " "$dir/$name.log" | tail -40
    fail=1
  fi
}

run_job memif_2_ranks 2 -- --memif "$dir/job.sock"

if ip netns add "$ns" 2>/dev/null; then
  ip -n "$ns" link set lo up
  ip -n "$ns" link add br0 type bridge
  ip -n "$ns" link set br0 up
  for r in 0 1 2 3; do
    # DPDK's af_packet PMD names its fanout group pid ^ ifindex, and groups
    # are per namespace: ranks with consecutive pids on consecutive ifindexes
    # collide (EINVAL). Interface indexes 4096 apart keep them distinct.
    ip -n "$ns" link add "rank$r" index $(( (r + 1) * 4096 )) type veth peer name "port$r"
    ip -n "$ns" link set "port$r" master br0
    ip -n "$ns" link set "port$r" up
    ip -n "$ns" link set "rank$r" up
  done
  run_job bridge_4_ranks 4 ip netns exec "$ns" -- --link "net_af_packet0,iface=rank%r"
else
  echo "SKIP part: cannot create a network namespace (the 4-rank job needs one)"
fi
exit "$fail"
