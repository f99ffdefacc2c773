#!/usr/bin/env bash
# droce against Linux rxe: fio's rdma engine (rdma_cm, RC) with verb=write
# and read, both directions (verb=send: below). fio's server job is rw=read,
# its client's rw=write (the engine's own convention); 16 MiB in 64 KiB
# blocks.
#
# usage: fio.sh LAUNCHER LOGDIR
set -u
# shellcheck source=tests/interop/lib.sh
. "$(dirname "$0")/lib.sh"
interop_setup "$@"

# fio_pair SERVER_SIDE VERB
fio_pair() {
  local side=$1 verb=$2
  command -v fio >/dev/null || { echo "fio not found"; return 77; }
  local port=$(( 9000 + RANDOM % 1000 )) s addr=$droce_ip
  [ "$side" = linux ] && addr=$peer_ip
  local common=(--ioengine=rdma --port="$port" --verb="$verb" --bs=64k --size=16m)
  serve_on "$side" fio --name=srv "${common[@]}" --rw=read
  s=$last_pid
  if [ "$side" = droce ]; then
    sleep 2
  else
    wait_guest_cm_listen "$port" "$s" || { echo "the Linux server did not listen"; return 1; }
  fi
  # fio exits 0 when its connection is rejected: a run counts once it wrote.
  retry 3 "$s" fio_client "$side" --name=cli "${common[@]}" --hostname="$addr" --rw=write ||
    { echo "the client failed"; return 1; }
  finish "$s" 30 || { echo "the server failed"; return 1; }
  grep -q "WRITE: bw=" "$cdir/client.log" || { echo "the client reported no WRITE"; return 1; }
  grep -Eq "err= *0" "$cdir/client.log" || { echo "the client reported an error"; return 1; }
  grep -om1 "WRITE: bw=[^,]*" "$cdir/client.log"
}

# fio_client SERVER_SIDE FIO-ARGS...: the client on the other side.
fio_client() {
  local side=$1
  shift
  if [ "$side" = droce ]; then
    guest -t 60 fio "$@" >"$cdir/client.log" 2>&1
  else
    droce_fg client 60 -- fio "$@"
  fi
  grep -q "WRITE: bw=" "$cdir/client.log"
}

# fio's verb=send is not run: fio's rdma engine races itself. Its client
# SENDs the next block as soon as the last one completed, its server reposts
# the receive only after it handled the last block, and neither fio's REQ nor
# its REP asks for RNR retries (both carry 0; Linux's cm.c gives each QP the
# peer's value), so the first RNR NAK ends the client with
# IBV_WC_RNR_RETRY_EXC_ERR. Seen here in both directions (a droce server's
# RNR NAK and rxe's, with timer code 0, in the captures); between two droce
# processes over memif it passes or fails as the timing falls, and Linux
# against Linux is exposed the same way whenever the client is the faster.
fio_send_skipped() {
  echo "fio's rdma engine asks for 0 RNR retries and SENDs before its server reposts (fio's race, not the stack's)"
  return 77
}

for side in droce linux; do
  for verb in write read; do
    case_run "fio_$verb.$side" fio_pair "$side" "$verb"
  done
  case_run "fio_send.$side" fio_send_skipped
done

interop_finish
