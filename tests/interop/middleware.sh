#!/usr/bin/env bash
# droce against Linux rxe under middleware that connects through rdma_cm:
# UCX's rdmacm connection manager (io_demo, data checked) and libfabric's
# verbs MSG endpoints (fi_pingpong), both directions. Both look for RDMA
# addresses among the kernel's interfaces, so here droce shares the tap's own
# address and MAC (10.90.0.1), as rxe shares eth0's: the kernel answers ARP
# for both, and droce takes the RoCE frames (the kernel's ICMP port
# unreachable for them is ignored by rxe).
#
# usage: middleware.sh LAUNCHER LOGDIR
set -u
# shellcheck source=tests/interop/lib.sh
. "$(dirname "$0")/lib.sh"
interop_setup "$@"
droce_shares_host=1

readonly ucx_common=(UCX_SOCKADDR_TLS_PRIORITY=rdmacm UCX_TLS=rc_verbs,ud_verbs,self)

# mw SERVER_SIDE EXPECT STAYS -- SERVER_CMD -- CLIENT_CMD: @S@ is the
# server's address; @DEV@ the side's RDMA device (droce0 or rxe0).
mw() {
  local side=$1 expect=$2 stays=$3
  shift 4
  local server=() client=()
  while [ "$1" != -- ]; do server+=("$1"); shift; done
  shift
  client=("$@")
  local s_addr=$host_ip s_dev=droce0 c_dev=rxe0
  [ "$side" = linux ] && { s_addr=$peer_ip; s_dev=rxe0; c_dev=droce0; }
  server=("${server[@]//@S@/$s_addr}"); server=("${server[@]//@DEV@/$s_dev}")
  client=("${client[@]//@S@/$s_addr}"); client=("${client[@]//@DEV@/$c_dev}")
  command -v "${server[1]}" >/dev/null || command -v "${server[0]}" >/dev/null ||
    { echo "${server[0]} not found"; return 77; }
  local s
  serve_on "$side" "${server[@]}"
  s=$last_pid
  sleep 3
  if [ "$side" = droce ]; then
    retry 5 "$s" guest_client "${client[@]}" || { echo "the Linux client failed"; return 1; }
  else
    retry 5 "$s" droce_fg client 60 -- "${client[@]}" || { echo "the droce client failed"; return 1; }
  fi
  if [ "$stays" = stays ]; then
    kill_group "$s"
  else
    finish "$s" 30 || { echo "the server failed"; return 1; }
  fi
  grep -Eq -- "$expect" "$cdir/client.log" || { echo "the client did not print /$expect/"; return 1; }
  grep -Em1 -- "$expect" "$cdir/client.log" | sed 's/droce: .*//'
}

guest_client() {
  guest -t 60 "$@" >"$cdir/client.log" 2>&1
}

for side in droce linux; do
  case_run "ucx_io_demo.$side" mw "$side" 'Client exit with status .OK.' stays -- \
    env "${ucx_common[@]}" UCX_NET_DEVICES=@DEV@:1 io_demo -q -d 1024:65536 -i 200 -- \
    env "${ucx_common[@]}" UCX_NET_DEVICES=@DEV@:1 io_demo -q -d 1024:65536 -i 200 @S@
  case_run "fi_pingpong_msg.$side" mw "$side" '^1k +100 ' exits -- \
    fi_pingpong -p verbs -e msg -I 100 -- fi_pingpong -p verbs -e msg -I 100 @S@
done

interop_finish
