#!/usr/bin/env bash
# droce against Linux rxe through rdma_cm (droce's userspace CM on one side,
# the kernel's ib_cm/rdma_cm on the other), both directions: rdmacm-utils'
# programs, perftest with -R, rsockets, cmtime with 100 connections, a
# connection with no listener, a disconnect from either side and a peer that
# vanishes while connected.
#
# usage: cm.sh LAUNCHER LOGDIR
set -u
# shellcheck source=tests/interop/lib.sh
. "$(dirname "$0")/lib.sh"
interop_setup "$@"

# cm_pair SERVER_SIDE EXPECT SERVER_CMD -- CLIENT_CMD: @S@ in either command
# is the server's RDMA address, @C@ the client's; EXPECT an extended regular
# expression the client's output (or, with EXPECT prefixed by "server:", the
# server's) must match. The client is retried while it cannot connect (the
# server binds its rdma_cm listener after it started) and the server lives.
cm_pair() {
  local side=$1 expect=$2
  shift 2
  local server=() client=()
  while [ $# -gt 0 ] && [ "$1" != -- ]; do server+=("$1"); shift; done
  shift
  client=("$@")
  command -v "${server[0]}" >/dev/null || { echo "${server[0]} not found"; return 77; }
  local s_addr=$droce_ip c_addr=$peer_ip
  [ "$side" = linux ] && { s_addr=$peer_ip; c_addr=$droce_ip; }
  server=("${server[@]//@S@/$s_addr}"); server=("${server[@]//@C@/$c_addr}")
  client=("${client[@]//@S@/$s_addr}"); client=("${client[@]//@C@/$c_addr}")
  local s
  if [ "$side" = droce ]; then
    droce_bg server 90 -- "${server[@]}"
  else
    guest_bg server 90 "${server[@]}"
  fi
  s=$last_pid
  sleep 1
  retry 10 "$s" run_client "$side" "${client[@]}" || { echo "the client failed"; return 1; }
  finish "$s" 30 || { echo "the server failed"; return 1; }
  local where=client
  case $expect in server:*) where=server; expect=${expect#server:} ;; esac
  grep -Eq -- "$expect" "$cdir/$where.log" || { echo "the $where did not print /$expect/"; return 1; }
  grep -Em1 -- "$expect" "$cdir/$where.log"
}

# run_client SERVER_SIDE CMD...: the client on the side that is not the server.
run_client() {
  local side=$1
  shift
  if [ "$side" = droce ]; then
    guest -t 60 "$@" >"$cdir/client.log" 2>&1
  else
    droce_fg client 60 -- "$@"
  fi
}

# no_listener CLIENT_SIDE: a connection to a port nobody listens on is
# rejected at once (reason 8, invalid service ID: rping says "REJECTED"),
# not timed out.
no_listener() {
  local t0=$SECONDS
  if [ "$1" = linux ]; then
    guest -t 60 rping -c -a "$droce_ip" -p 7 -C 1 -v >"$cdir/client.log" 2>&1 && return 1
  else
    droce_fg client 60 -- rping -c -a "$peer_ip" -p 7 -C 1 -v && return 1
  fi
  grep -q "REJECTED\|event: RDMA_CM_EVENT_REJECTED\|connect error" "$cdir/client.log" ||
    { echo "no reject seen"; return 1; }
  [ $(( SECONDS - t0 )) -lt 20 ] || { echo "the reject took $(( SECONDS - t0 )) s"; return 1; }
  echo "rejected in $(( SECONDS - t0 )) s"
}

# vanish SERVER_SIDE: a connected rping whose peer (the client) is killed
# mid-connection; the server side must see the connection end (a
# DISCONNECTED or an error completion) and exit, not hang, within the
# transport's retry time.
vanish() {
  local side=$1 s c
  if [ "$side" = droce ]; then
    droce_bg server 120 -- rping -s -a "$droce_ip" -C 100000 -v
    s=$last_pid
    sleep 1
    guest_bg client 120 rping -c -a "$droce_ip" -C 100000 -v
  else
    guest_bg server 120 rping -s -a "$peer_ip" -C 100000 -v
    s=$last_pid
    sleep 1
    droce_bg client 120 -- rping -c -a "$peer_ip" -C 100000 -v
  fi
  c=$last_pid
  local i
  for i in $(seq 100); do
    [ "$(grep -c 'ping data' "$cdir/client.log" 2>/dev/null)" -gt 5 ] && break
    sleep 0.2
  done
  [ "$(grep -c 'ping data' "$cdir/client.log" 2>/dev/null)" -gt 5 ] || { echo "never connected"; return 1; }
  kill_group "$c"
  # The client's rdma_cm goes with it; a Linux client's kernel CM sends a
  # DREQ when its process dies, a droce client's cannot (its CM is in the
  # process): the server then learns it from the transport's retries.
  local t0=$SECONDS
  finish "$s" 90
  local took=$(( SECONDS - t0 ))
  kill -0 "$s" 2>/dev/null && { echo "the server still runs"; return 1; }
  grep -Eq "DISCONNECT|error|status|RETRY|cq completion failed" "$cdir/server.log" ||
    { echo "the server ended without a word"; return 1; }
  echo "the server ended $took s after its client vanished: $(grep -Em1 "DISCONNECT|error|status" "$cdir/server.log")"
}

for side in droce linux; do
  case_run "rping.$side" cm_pair "$side" 'ping data: rdma-ping-499' \
    rping -s -a @S@ -C 500 -v -V -- rping -c -a @S@ -C 500 -v -V
  case_run "ucmatose.$side" cm_pair "$side" 'test complete' \
    ucmatose -b @S@ -c 4 -- ucmatose -s @S@ -c 4
  case_run "udaddy.$side" cm_pair "$side" 'data transfers complete' \
    udaddy -b @S@ -- udaddy -s @S@
  case_run "mckey.$side" cm_pair "$side" 'joined dgid: ::ffff:239.1.2.3' \
    mckey -m 239.1.2.3 -b @S@ -C 10 -- mckey -m 239.1.2.3 -s -b @C@ -C 10
  case_run "rdma_server.$side" cm_pair "$side" 'rdma_client: end 0' \
    rdma_server -s @S@ -- rdma_client -s @S@
  case_run "ib_send_bw_R.$side" cm_pair "$side" '^ 65536 ' \
    ib_send_bw -R -D 2 -- ib_send_bw -R -D 2 @S@
  case_run "ib_write_lat_R.$side" cm_pair "$side" '^ 2 +1000 ' \
    ib_write_lat -R -n 1000 -- ib_write_lat -R -n 1000 @S@
  case_run "ib_read_bw_R.$side" cm_pair "$side" '^ 65536 ' \
    ib_read_bw -R -D 2 -- ib_read_bw -R -D 2 @S@
  case_run "rstream.$side" cm_pair "$side" '^custom +4k +1k' \
    rstream -b @S@ -S 4096 -C 1000 -- rstream -s @S@ -S 4096 -C 1000
  case_run "riostream.$side" cm_pair "$side" '^custom +4k +1k' \
    riostream -b @S@ -S 4096 -C 1000 -- riostream -s @S@ -S 4096 -C 1000
  case_run "cmtime_100.$side" cm_pair "$side" 'connect' \
    cmtime -b @S@ -c 100 -- cmtime -s @S@ -c 100
  # rping's client disconnects at its end: with both directions, droce's CM
  # and the kernel's each send the DREQ once and answer it once.
  case_run "no_listener.$side" no_listener "$side"
  case_run "vanish.$side" vanish "$side"
done

interop_finish
