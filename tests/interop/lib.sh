# shellcheck shell=bash disable=SC2034,SC2317
# The interop suite's library (sourced by tests/interop/*.sh): droce on one
# side, Linux's Soft-RoCE (rdma_rxe in a QEMU guest, tools/linux-peer) on the
# other, one tap between them in a network namespace this script makes.
#
#   netns "dri.$$": tap "drt$$"   kernel 10.90.0.1/24 fd90::1/64   (TCP of the programs)
#                                 droce  10.90.0.11    fd90::11     (af_packet on the tap, MAC 02:00:0a:5a:00:0b)
#   guest:          eth0          kernel + rxe0 10.90.0.2 fd90::2
#
# droce's address differs from the host kernel's on the tap (both see the
# tap's frames; each answers ARP/ND for its own). Programs exchange their QP
# data over TCP between the kernel addresses (10.90.0.1 and .2); RoCE goes
# between droce and rxe0. GID indexes: droce's IPv4 GID is 0 and IPv6 1;
# rxe's are 1 (::ffff:10.90.0.2) and 2 (fd90::2), 0 being link-local.
#
# A group script: interop_setup LAUNCHER LOGDIR, then `case_run NAME FN
# ARGS...` for each case (FN returns 0 pass, 77 skip with a reason echoed,
# anything else fail), then interop_finish. Each case has a directory
# LOGDIR/GROUP/NAME with every process's output and a capture of the tap;
# the directory (and with it the capture) is removed when the case passes
# (kept with DROCE_INTEROP_KEEP=1, to compare with a failing run's).
# A failing case also gets the guest's dmesg and rxe's counters.
# DROCE_INTEROP_CASES=REGEX runs only the cases whose names match.

readonly host_ip=10.90.0.1 droce_ip=10.90.0.11 peer_ip=10.90.0.2
readonly host_ip6=fd90::1 droce_ip6=fd90::11 peer_ip6=fd90::2
# droce's own MAC, not the tap's: a second host on the wire (the kernel drops
# frames to it; droce receives them in promiscuous mode).
readonly droce_mac=02:00:0a:5a:00:0b
readonly droce_gid4=0 droce_gid6=1 peer_gid4=1 peer_gid6=2
interop_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
readonly interop_dir
readonly peer_tool="$interop_dir/../../tools/linux-peer/linux-peer"

ns="dri.$$"
tap="drt$$"
peer_dir=""
group=""
cdir=""
bg_pids=()
group_pids=()  # processes that serve the whole group (droced): kept between cases
passed=() failed=() skipped=()
link_mtu=${DROCE_INTEROP_MTU:-9000}

# kill_tree PID: PID's descendants, deepest first (a case's foreground
# commands when the group is stopped halfway).
kill_tree() {
  local c
  for c in $(pgrep -P "$1"); do kill_tree "$c"; kill -TERM "$c" 2>/dev/null; done
}

interop_cleanup() {
  local p
  for p in "${bg_pids[@]}" "${group_pids[@]}"; do kill_group "$p"; done
  kill_tree $$
  [ -n "$peer_dir" ] && "$peer_tool" stop --dir "$peer_dir" 2>/dev/null
  ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null
  ip netns del "$ns" 2>/dev/null
  return 0
}

skip_all() { echo "SKIP: $*"; exit 77; }

# kill_group PID: the process group of a `timeout` (tests/integration/lib.sh).
# shellcheck source=tests/integration/lib.sh
. "$interop_dir/../integration/lib.sh"

# interop_setup LAUNCHER LOGDIR: checks what is needed (a skip says what is
# missing), boots the guest and brings the tap up.
interop_setup() {
  launcher=$1
  group=$(basename "$0" .sh)
  logroot=$2/$group
  [ -x "$launcher" ] || { echo "FAIL: launcher '$launcher' is not an executable file"; exit 1; }
  [ "$(id -u)" -eq 0 ] || skip_all "needs root (network namespaces, tap)"
  command -v qemu-system-x86_64 >/dev/null || skip_all "qemu-system-x86_64 not found (scripts/setup.sh)"
  [ -e /dev/net/tun ] || skip_all "no /dev/net/tun"
  compgen -G "/usr/lib/*/dpdk/pmds-*/librte_net_af_packet.so*" >/dev/null ||
    skip_all "DPDK's af_packet PMD is not installed (scripts/setup.sh)"
  "$peer_tool" prepare >/dev/null || { echo "FAIL: linux-peer prepare failed"; exit 1; }
  unset DROCE_LINK DROCE_IP DROCE_IP6 DROCE_MAC DROCE_MTU DROCE_GATEWAY DROCE_VLAN DROCE_FAULT \
    DROCE_DAEMON DROCE_CAPTURE DROCE_TRACE DROCE_SR DROCE_ADP_RETRANS
  rm -rf "$logroot"
  mkdir -p "$logroot"
  peer_dir="$logroot/guest"
  trap interop_cleanup EXIT
  trap 'echo "interrupted" >&2; exit 130' INT TERM HUP
  ip netns add "$ns" || skip_all "cannot create a network namespace"
  ip -n "$ns" link set lo up
  ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.accept_dad=0 net.ipv6.conf.default.accept_dad=0 \
    net.ipv6.conf.all.accept_ra=0 net.ipv6.conf.default.accept_ra=0 >/dev/null 2>&1
  local t0=$SECONDS
  "$peer_tool" start --dir "$peer_dir" --netns "$ns" --tap "$tap" --ip "$peer_ip/24" \
    --ip6 "$peer_ip6/64" --mtu "$link_mtu" >"$logroot/start.log" 2>&1 &
  local starter=$!
  local i
  for i in $(seq 100); do
    ip -n "$ns" link show "$tap" >/dev/null 2>&1 && break
    kill -0 "$starter" 2>/dev/null || break
    sleep 0.2
  done
  ip -n "$ns" link set "$tap" mtu "$link_mtu"
  ip -n "$ns" addr add "$host_ip/24" dev "$tap"
  ip -n "$ns" addr add "$host_ip6/64" dev "$tap" nodad
  ip -n "$ns" link set "$tap" up
  if ! wait "$starter"; then
    cat "$logroot/start.log"
    echo "FAIL: the Linux peer did not boot"
    exit 1
  fi
  tap_mac=$(ip -n "$ns" -br link show "$tap" | awk '{ print $3 }')
  # shellcheck disable=SC1091
  . "$peer_dir/peer.env"
  echo "Linux peer: kernel $peer_kernel ($peer_accel), up in $(( SECONDS - t0 )) s; $(guest rdma link | head -n1)"
}

# guest [-t SECONDS] CMD...: runs CMD in the guest (one word: bash -c).
guest() {
  local bound=60
  [ "$1" = -t ] && { bound=$2; shift 2; }
  # In the background and waited for: bash runs a trap (the group stopped
  # by meson's timeout) only once its foreground command ends, a wait it
  # interrupts at once.
  timeout -k 5 $(( bound + 15 )) "$peer_tool" run --dir "$peer_dir" --timeout "$bound" -- "$@" &
  wait $!
}

# guest_bg NAME SECONDS CMD...: guest in the background, output in
# $cdir/NAME.log; its pid in last_pid.
guest_bg() {
  local name=$1 bound=$2
  shift 2
  setsid timeout -k 5 $(( bound + 15 )) "$peer_tool" run --dir "$peer_dir" --timeout "$bound" -- "$@" \
    </dev/null >"$cdir/$name.log" 2>&1 &
  last_pid=$!
  bg_pids+=("$last_pid")
}

# droce_link: the link's devargs. qdisc_bypass=0 lets a capture on the tap
# see what droce transmits.
droce_link() {
  echo "net_af_packet0,iface=$tap,qdisc_bypass=0,framesz=16384,blocksz=16384${DROCE_INTEROP_LINK_ARGS:+,$DROCE_INTEROP_LINK_ARGS}"
}

# droce_argv SECONDS [EXEC OPTIONS] -- PROGRAM ARGS...: sets argv to the
# command that runs a program through droce in the namespace, under timeout
# (whose pid is its process group). DROCE_STATS=1: counters at exit;
# DROCE_CTL=1: `droce ctl --pid` reaches it (droce_ctl below);
# droce_fault, if set, is its --fault (docs/LAB.md).
droce_argv() {
  local bound=$1
  shift
  local addr=(--ip "$droce_ip/24" --ip6 "$droce_ip6/64" --mac "$droce_mac")
  # droce_shares_host=1: droce takes the tap's own address and MAC, as rxe
  # takes its netdev's (for software that finds RDMA addresses among the
  # kernel's interfaces: tests/interop/middleware.sh).
  [ -n "${droce_shares_host:-}" ] && addr=(--ip "$host_ip/24" --ip6 "$host_ip6/64")
  local dev=(--link "$(droce_link)" "${addr[@]}" --mtu "${droce_mtu:-4096}" ${droce_fault:+--fault "$droce_fault"})
  # droce_daemon=SOCKET: the program attaches to the droced there, which
  # owns the link (tests/interop/daemon.sh).
  [ -n "${droce_daemon:-}" ] && dev=(--daemon "$droce_daemon")
  argv=(env DROCE_STATS=1 DROCE_CTL=1 timeout -k 5 "$bound" ip netns exec "$ns" "$launcher" exec "${dev[@]}" "$@")
}

# droce_bg NAME SECONDS [EXEC OPTIONS] -- PROGRAM ARGS...: in the background,
# output in $cdir/NAME.log, pid in last_pid.
droce_bg() {
  local name=$1 argv
  shift
  droce_argv "$@"
  echo "+ ${argv[*]}" >"$cdir/$name.log"
  "${argv[@]}" </dev/null >>"$cdir/$name.log" 2>&1 &
  last_pid=$!
  bg_pids+=("$last_pid")
}

# droce_fg NAME SECONDS [EXEC OPTIONS] -- PROGRAM ARGS...: output in
# $cdir/NAME.log; returns the program's status (waited for in the
# background: interruptible, as in guest()).
droce_fg() {
  droce_bg "$@"
  wait "$last_pid"
}

# serve_on SIDE CMD...: the server CMD on SIDE (droce or linux), in the
# background for at most 90 s, its output in $cdir/server.log, pid in
# last_pid.
serve_on() {
  local side=$1
  shift
  if [ "$side" = droce ]; then
    droce_bg server 90 -- "$@"
  else
    guest_bg server 90 "$@"
  fi
}

# finish PID [SECONDS]: waits for a background process (at most SECONDS,
# default 30, then kills its group); returns its status.
finish() {
  local pid=$1 secs=${2:-30} i
  for (( i = 0; i < secs * 10; i++ )); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$pid" 2>/dev/null && kill_group "$pid"
  wait "$pid"
}

# host_listening PORT: a TCP listener on PORT in the namespace (a droce-side
# server's out-of-band socket).
host_listening() {
  ns_tcp_listening "$ns" "$1"
}

# wait_host_listen PORT PID: until PORT listens in the namespace (20 s).
wait_host_listen() {
  local i
  for i in $(seq 200); do
    host_listening "$1" && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# wait_guest_listen PORT PID: until PORT listens in the guest (30 s).
wait_guest_listen() {
  local i hex
  hex=$(printf ':%04X' "$1")
  for i in $(seq 60); do
    guest -t 5 "awk 'FNR > 1 && substr(\$2, length(\$2) - 4) == \"$hex\" && \$4 == \"0A\" { f = 1 } END { exit !f }' /proc/net/tcp /proc/net/tcp6" && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.3
  done
  return 1
}

# wait_guest_cm_listen PORT PID: until an rdma_cm id listens on PORT in the
# guest (30 s).
wait_guest_cm_listen() {
  local i
  for i in $(seq 60); do
    guest -t 5 rdma res show cm_id 2>/dev/null | grep -q "state LISTEN .*:$1\b" && return 0
    kill -0 "$2" 2>/dev/null || return 1
    sleep 0.3
  done
  return 1
}

# retry N PID FN ARGS...: runs FN until it succeeds, N times at most, while
# the server PID lives (clients that do not retry their connect).
retry() {
  local n=$1 pid=$2 i rc=1
  shift 2
  for (( i = 1; i <= n; i++ )); do
    "$@" && return 0
    rc=$?
    kill -0 "$pid" 2>/dev/null || return "$rc"
    sleep 1
  done
  return "$rc"
}

case_capture_start() {
  # --immediate-mode: frames reach tcpdump as they come, not when a block of
  # the kernel's ring fills or times out (the last block would be lost at
  # the interrupt below).
  ip netns exec "$ns" tcpdump --immediate-mode -i "$tap" -s 512 -U -w "$cdir/tap.pcap" \
    "not (tcp port 7777)" >"$cdir/tcpdump.log" 2>&1 &
  capture_pid=$!
  local i
  for i in $(seq 50); do
    grep -q "listening on" "$cdir/tcpdump.log" 2>/dev/null && return 0
    sleep 0.1
  done
}

case_capture_stop() {
  [ -n "${capture_pid:-}" ] || return 0
  # tcpdump may be behind the link (by hundreds of frames after a
  # bandwidth test), and drops what it has not written when interrupted:
  # the case's last frames, which tell how it ended. Let it catch up
  # (the file stops growing; at most 3 s).
  local i size=-1 now
  for i in $(seq 30); do
    now=$(stat -c %s "$cdir/tap.pcap" 2>/dev/null || echo 0)
    [ "$now" = "$size" ] && break
    size=$now
    sleep 0.1
  done
  kill -INT "$capture_pid" 2>/dev/null
  wait "$capture_pid" 2>/dev/null
  capture_pid=""
}

# What a failing case keeps besides its programs' output: the guest's dmesg,
# rxe's counters and a decode of the capture's RoCE/CM packets.
case_dump() {
  {
    echo "--- guest dmesg (last 40 lines)"
    guest -t 10 "dmesg | tail -n 40"
    echo "--- rxe0 hw_counters (non-zero)"
    guest -t 10 "cd /sys/class/infiniband/rxe0/ports/1/hw_counters && grep -v '^0\$' -r . | sed 's|^./||'"
  } >"$cdir/guest-state.log" 2>&1
  if [ -s "$cdir/tap.pcap" ] && command -v tshark >/dev/null; then
    tshark -r "$cdir/tap.pcap" -d udp.port==4791,infiniband 'udp.port == 4791' 2>/dev/null |
      head -n 60 >"$cdir/capture.txt"
  fi
  local f
  for f in "$cdir"/*.log "$cdir/capture.txt"; do
    [ -f "$f" ] || continue
    echo "----- $(basename "$f")"
    tail -n 60 "$f"
  done
}

# case_run NAME FN ARGS...
case_run() {
  local name=$1 rc t0=$SECONDS
  shift
  if [ -n "${DROCE_INTEROP_CASES:-}" ] && ! [[ $name =~ $DROCE_INTEROP_CASES ]]; then
    return 0
  fi
  cdir="$logroot/$name"
  mkdir -p "$cdir"
  bg_pids=()
  case_capture_start
  ( "$@" ) >"$cdir/case.log" 2>&1 &
  wait $!  # interruptible, as in guest()
  rc=$?
  local p
  for p in "${bg_pids[@]}"; do kill_group "$p"; done
  bg_pids=()
  case_capture_stop
  # Nothing of the case may outlive it: a droce process left on the tap
  # answers the next case's CM messages too (a server whose client failed,
  # one that serves until stopped). The case function ran in a subshell, so
  # its background processes are not in bg_pids here: everything in the
  # namespace but the guest and the group's own servers (group_pids) goes,
  # and is reported.
  local left=""
  for p in $(ip netns pids "$ns" 2>/dev/null); do
    [[ " ${group_pids[*]} " == *" $p "* ]] && continue
    case $(cat "/proc/$p/comm" 2>/dev/null) in
      qemu-system-x86 | "") ;;
      *) left+=" $p:$(cat "/proc/$p/comm" 2>/dev/null)"; kill -9 "$p" 2>/dev/null ;;
    esac
  done
  [ -n "$left" ] && echo "NOTE: $name: killed what it left running in the namespace:$left"
  local took=$(( SECONDS - t0 ))
  if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] && [ -n "${case_retry:-}" ] && [ -z "${case_retrying:-}" ]; then
    # A case marked flaky (case_retry, with the reason where it is set) runs
    # once more; the first attempt's logs stay in NAME.first-attempt.
    echo "RETRY: $name (${took} s, status $rc): $(tail -n 1 "$cdir/case.log"); logs in $cdir.first-attempt"
    rm -rf "$cdir.first-attempt"
    mv "$cdir" "$cdir.first-attempt"
    case_retrying=1 case_run "$name" "$@"
    return
  fi
  if [ "$rc" -eq 0 ]; then
    echo "PASS: $name (${took} s) $(tail -n 1 "$cdir/case.log")"
    passed+=("$name")
    [ -n "${DROCE_INTEROP_KEEP:-}" ] || rm -rf "$cdir"
  elif [ "$rc" -eq 77 ]; then
    echo "SKIP: $name: $(tail -n 1 "$cdir/case.log")"
    skipped+=("$name")
    rm -rf "$cdir"
  else
    echo "FAIL: $name (${took} s, status $rc); logs and capture in $cdir"
    case_dump | sed 's/^/    /'
    failed+=("$name")
  fi
}

interop_finish() {
  case_run mac_kept mac_kept
  echo "interop $group: ${#passed[@]} passed, ${#failed[@]} failed, ${#skipped[@]} skipped"
  [ ${#failed[@]} -eq 0 ] || { echo "failed: ${failed[*]}"; exit 1; }
  [ ${#passed[@]} -gt 0 ] || exit 77
  exit 0
}

# mac_kept: the case that ends a group: droce (with its own --mac) left the
# kernel interface's MAC as it was, and the kernels still reach each other.
mac_kept() {
  local now
  now=$(ip -n "$ns" -br link show "$tap" | awk '{ print $3 }')
  [ "$now" = "$tap_mac" ] || { echo "the tap's MAC changed from $tap_mac to $now"; return 1; }
  guest -t 10 ping -c 1 -W 3 "$host_ip" >/dev/null || { echo "the guest no longer reaches $host_ip"; return 1; }
  local used=$droce_mac
  [ -n "${droce_shares_host:-}" ] && used="the same (it shares the address)"
  echo "the tap kept its MAC $now (droce used $used)"
}

# droce_ctl TIMEOUT_PID PROGRAM CTL-ARGS...: `droce ctl` on the droce program
# PROGRAM started by droce_bg (pid TIMEOUT_PID).
droce_ctl() {
  local tpid=$1 prog=$2 pid
  shift 2
  pid=$(pgrep -P "$tpid" -x "$prog" | head -n 1)
  [ -n "$pid" ] || { echo "no $prog under $tpid"; return 1; }
  ip netns exec "$ns" "$launcher" ctl --pid "$pid" "$@"  # an abstract socket: per namespace
}

