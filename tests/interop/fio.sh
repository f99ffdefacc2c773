#!/usr/bin/env bash
# droce against Linux rxe: fio's rdma engine (rdma_cm, RC) with verb=write,
# read and send, both directions. fio's server job is rw=read, its client's
# rw=write (the engine's own convention); 16 MiB in 64 KiB blocks.
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
  if [ "$side" = droce ]; then
    droce_bg server 90 -- fio --name=srv "${common[@]}" --rw=read
  else
    guest_bg server 90 fio --name=srv "${common[@]}" --rw=read
  fi
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

for side in droce linux; do
  for verb in write read send; do
    case_run "fio_$verb.$side" fio_pair "$side" "$verb"
  done
done

interop_finish
