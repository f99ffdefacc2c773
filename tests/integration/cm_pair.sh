#!/usr/bin/env bash
# Runs an unmodified librdmacm program as a server and a client, two
# processes under droce over a memif link (embedded mode, the connection
# manager in each process), and checks that both exit 0:
#
#   cm_pair.sh LAUNCHER [--expect REGEX]... [--server-stays] -- SERVER ARGS... -- CLIENT ARGS...
#
# @S@ in the arguments is the server's address (10.78.0.1), @C@ the
# client's. The client is started again while it fails and the server
# lives (at most 5 times: it may come before the server listens). --expect REGEX: a line the client's or the
# server's output must have. DROCE_TEST_DAEMON=one|two (with
# DROCE_TEST_DROCED): the programs are clients of droced, whose connection
# manager serves them: one daemon for both (both on its address), or one
# each, linked over memif. With DROCE_TEST_NETNS=1 the two run in two
# network namespaces on a veth pair over af_packet instead of memif, and
# with DROCE_TEST_KERNEL_IP=1 as well the veths carry the same addresses.
# DROCE_TEST_MEMIF_NS=1: memif, but both processes in one namespace of
# their own where an interface carries both addresses (for programs that
# also talk TCP to the peer's address, or list the kernel's).
set -uo pipefail
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 2 - "LAUNCHER [--expect RE] -- SERVER... -- CLIENT..."

launcher=$1
shift
t_launcher "$launcher"
expects=()
server_stays=0
while :; do
  case ${1:-} in
    --expect) expects+=("$2"); shift 2 ;;
    --server-stays) server_stays=1; shift ;;  # a server that never exits (io_demo): stopped after the client
    *) break ;;
  esac
done
[ "${1:-}" = -- ] || { echo "usage: cm_pair.sh LAUNCHER [--expect RE] -- SERVER... -- CLIENT..." >&2; exit 2; }
shift
server_cmd=()
while [ $# -gt 0 ] && [ "$1" != -- ]; do server_cmd+=("$1"); shift; done
shift
client_cmd=("$@")

s_ip=10.78.0.1 c_ip=10.78.0.2
subst() { local a; for a in "$@"; do a=${a//@S@/$s_ip}; printf '%s\n' "${a//@C@/$c_ip}"; done; }
mapfile -t server_cmd < <(subst "${server_cmd[@]}")
mapfile -t client_cmd < <(subst "${client_cmd[@]}")

t_setup cm
sock="$dir/memif.sock"
netns=${DROCE_TEST_NETNS:-0}
ns_s="" ns_c=""
server_pid="" client_pid=""
# At exit: the programs, then the namespaces.
cm_netns_cleanup() {
  t_kill_all
  [ -n "$ns_s" ] && ip netns del "$ns_s" 2>/dev/null
  [ -n "$ns_c" ] && ip netns del "$ns_c" 2>/dev/null
  return 0
}
on_exit cm_netns_cleanup

if [ "$netns" = 1 ]; then
  ns_s="droce-cms-$$" ns_c="droce-cmc-$$"
  ip netns add "$ns_s" && ip netns add "$ns_c" || skip "cannot make namespaces"
  ip link add "cms$$" type veth peer name "cmc$$" || skip "no veth"
  ip link set "cms$$" netns "$ns_s" && ip link set "cmc$$" netns "$ns_c"
  ip -n "$ns_s" link set "cms$$" up && ip -n "$ns_c" link set "cmc$$" up
  ip -n "$ns_s" link set lo up && ip -n "$ns_c" link set lo up
  if [ "${DROCE_TEST_KERNEL_IP:-0}" = 1 ]; then
    # The kernel's interface carries droce's address too (af_packet shares
    # its MAC): for programs that find RDMA addresses among the kernel's
    # interfaces (libfabric's verbs provider) or talk TCP to the peer first.
    ip -n "$ns_s" addr add "$s_ip/24" dev "cms$$" && ip -n "$ns_c" addr add "$c_ip/24" dev "cmc$$"
  fi
  s_link="net_af_packet0,iface=cms$$" c_link="net_af_packet0,iface=cmc$$"
  s_run=(ip netns exec "$ns_s") c_run=(ip netns exec "$ns_c")
elif [ "${DROCE_TEST_MEMIF_NS:-0}" = 1 ]; then
  ns_s="droce-cmm-$$"
  ip netns add "$ns_s" || skip "cannot make a namespace"
  # Not on lo: libfabric skips loopback interfaces. A veth pair inside the
  # namespace (no dummy interfaces on every kernel).
  ip -n "$ns_s" link set lo up
  ip -n "$ns_s" link add "cmv$$" type veth peer name "cmw$$" || skip "no veth"
  ip -n "$ns_s" link set "cmv$$" up && ip -n "$ns_s" link set "cmw$$" up
  ip -n "$ns_s" addr add "$s_ip/32" dev "cmv$$" && ip -n "$ns_s" addr add "$c_ip/32" dev "cmv$$"
  s_link="net_memif0,role=server,socket=$sock,socket-abstract=no"
  c_link="net_memif0,role=client,socket=$sock,socket-abstract=no"
  s_run=(ip netns exec "$ns_s") c_run=(ip netns exec "$ns_s")
else
  s_link="net_memif0,role=server,socket=$sock,socket-abstract=no"
  c_link="net_memif0,role=client,socket=$sock,socket-abstract=no"
  s_run=() c_run=()
fi

s_flags=(--link "$s_link" --ip "$s_ip/24")
c_flags=(--link "$c_link" --ip "$c_ip/24")
fail=0
case ${DROCE_TEST_DAEMON:-} in
  '') ;;
  one)
    start_droced d0 --ip "$s_ip/24"
    s_flags=(--daemon "$dir/d0.sock"); c_flags=(--daemon "$dir/d0.sock") ;;
  two)
    start_droced d0 --link "$s_link" --ip "$s_ip/24"
    start_droced d1 --link "$c_link" --ip "$c_ip/24"
    s_flags=(--daemon "$dir/d0.sock"); c_flags=(--daemon "$dir/d1.sock") ;;
  *) fail "DROCE_TEST_DAEMON: one or two" ;;
esac

run_pair() {
  rm -f -- "$dir"/client.*.log
  t_bg "$dir/server.log" 60 "${s_run[@]}" "$launcher" exec "${s_flags[@]}" -- "${server_cmd[@]}"
  server_pid=$last_pid
  sleep 1

  start_client() {
    t_bg "$1" 45 "${c_run[@]}" "$launcher" exec "${c_flags[@]}" -- "${client_cmd[@]}"
  }
  client_rc=255
  attempt=0
  while :; do
    attempt=$((attempt + 1))
    log="$dir/client.$attempt.log"
    start_client "$log"
    client_pid=$last_pid
    wait "$client_pid"
    client_rc=$?
    client_pid=""
    # Not listening yet (a memif server's device, and so its listener, comes
    # up only once a client has connected the link): the client's REQ gets a
    # REJ (reason 8) and the program exits non-zero, each in its own words.
    if [ "$client_rc" -ne 0 ] && [ "$attempt" -lt 5 ] && kill -0 "$server_pid" 2>/dev/null; then
      sleep 1
      continue
    fi
    break
  done
  if [ "$server_stays" = 1 ] && [ "$client_rc" -eq 0 ]; then
    kill_group "$server_pid"
    server_rc=0
  else
    end_server "$server_pid"
  fi
}
run_pair
# perftest measures the CPU's clock itself before it reports and gives up
# when its samples do not fit a line ("Can't produce a report"): a busy
# machine, not droce. Once, the pair runs again.
if grep -qs "Can't produce a report" "$dir/server.log" "$dir"/client.*.log; then
  echo "note: perftest could not calibrate its clock on this busy machine; running the pair once more"
  [ "${#daemon_pids[@]}" -eq 0 ] && rm -f -- "$sock"  # the last server's memif socket (daemons keep theirs)
  run_pair
fi

echo "--- server: ${server_cmd[*]}"
cat "$dir/server.log"
for i in $(seq 1 "$attempt"); do
  echo "--- client (attempt $i): ${client_cmd[*]}"
  cat "$dir/client.$i.log"
done
[ "${#daemon_pids[@]}" -gt 0 ] && stop_daemons
[ "$server_rc" -eq 0 ] || { echo "FAIL: server exited $server_rc"; fail=1; }
[ "$client_rc" -eq 0 ] || { echo "FAIL: client exited $client_rc"; fail=1; }
for re in "${expects[@]}"; do
  grep -qE -- "$re" "$dir/server.log" "$dir/client.$attempt.log" || { echo "FAIL: no line matches: $re"; fail=1; }
done
[ "$fail" -eq 0 ] && echo "OK"
exit "$fail"
