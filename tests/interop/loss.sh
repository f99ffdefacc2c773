#!/usr/bin/env bash
# droce against Linux rxe on a lossy link: droce's fault injector drops
# random frames on droce's receive side, on its transmit side, or on both,
# at 0.1 %, 1 % and 5 %, while SENDs both ways (write_check's SEND mode:
# every byte of 1 MiB per pass checked), WRITEs (write_check: every byte of
# 16 MiB per pass checked) and READs (ib_read_bw) run between droce and the
# kernel. droce serves the READs to a Linux client and writes to a Linux server:
# rxe's retransmissions meet droce's NAKs and droce's meet rxe's. Prints the
# goodput and droce's retransmission counters of each case.
#
# usage: loss.sh LAUNCHER LOGDIR WRITE_CHECK
set -u
# shellcheck source=tests/interop/lib.sh
. "$(dirname "$0")/lib.sh"
write_check=$(readlink -f "${3:-}")
interop_setup "$1" "$2"

# counters LOG: droce's retransmission and NAK counters from its DROCE_STATS.
counters() {
  local c v out=""
  for c in dropped_by_fault rcvd_seq_err duplicate_request completer_retry_err retry_exceeded_err; do
    v=$(stat_of "$1" "$c")
    [ -n "$v" ] && out+=" $c=$v"
  done
  local d
  d=$(fault_dropped "$1")
  echo "fault dropped ${d:-0};$out"
}

# lossy VERB DIRECTIONS PERCENT
lossy() {
  local verb=$1 dirs=$2 pct=$3
  local droce_fault="loss random $pct% $dirs"
  local port=$(( 18000 + RANDOM % 2000 )) s
  case $verb in
    recv)
      # rxe sends, droce receives: 256 SENDs of 4 KiB per pass into as many
      # receives, every byte checked (write_check's SEND mode, whose closing
      # handshake keeps each QP until the other side has its last ACK:
      # ibv_rc_pingpong's lack of one lost the last ACK now and then here).
      [ -x "$write_check" ] || { echo "write_check not built"; return 77; }
      droce_bg server 180 -- env TCP_PAIR_ANY=1 WRITE_CHECK_TIMEOUT=16 "$write_check" server "$port"
      s=$last_pid
      wait_host_listen "$port" "$s" || { echo "the droce server did not listen"; return 1; }
      guest -t 150 env WRITE_CHECK_VERB=send WRITE_CHECK_MSG=4096 WRITE_CHECK_GID="$peer_gid4" \
        WRITE_CHECK_TIMEOUT=16 "$write_check" client "$host_ip" "$port" 1 \
        >"$cdir/client.log" 2>&1 || { echo "the Linux client failed"; return 1; }
      finish "$s" 20 || { echo "the droce server failed"; return 1; }
      grep -q "server: passes [1-9][0-9]* bad_words 0$" "$cdir/server.log" || { echo "bad words"; return 1; }
      echo "$(grep -h '^passes' "$cdir/client.log" | tail -n 1); $(counters "$cdir/server.log")"
      ;;
    send | write)
      # droce sends SENDs (as above) or 64 KiB WRITEs, rxe receives. The other
      # way round, rxe 6.1's go-back-N retry of a multi-packet WRITE can send
      # a 0-byte WRITE ONLY at the message's first PSN and the message again
      # one PSN later; droce refuses the now overlong message (NAK invalid
      # request, IBA 9.7.5.1.3) and the WRITE fails (docs/FEATURES.md,
      # "Against Linux rxe").
      [ -x "$write_check" ] || { echo "write_check not built"; return 77; }
      # Local ACK timeout 16 (268 ms) both ways: the TCG guest stalls for
      # longer than write_check's default (4 ms) times its 8 tries.
      local seconds=3 send_mode=()
      [ "$verb" = send ] && { seconds=1; send_mode=(WRITE_CHECK_VERB=send WRITE_CHECK_MSG=4096); }
      guest_bg server 180 env TCP_PAIR_ANY=1 WRITE_CHECK_GID="$peer_gid4" WRITE_CHECK_TIMEOUT=16 \
        "$write_check" server "$port"
      s=$last_pid
      wait_guest_listen "$port" "$s" || { echo "the Linux server did not listen"; return 1; }
      droce_fg client 150 -- env "${send_mode[@]}" WRITE_CHECK_TIMEOUT=16 \
        "$write_check" client "$peer_ip" "$port" "$seconds" || { echo "the droce client failed"; return 1; }
      finish "$s" 20 || { echo "the Linux server failed"; return 1; }
      grep -q "bad_words 0$" "$cdir/client.log" || { echo "bad words"; return 1; }
      echo "$(grep -h '^passes' "$cdir/client.log" | tail -n 1); $(counters "$cdir/client.log")"
      ;;
    read)
      droce_bg server 180 -- ib_read_bw -F -x "$droce_gid4" -p "$port" -s 65536 -D 3
      s=$last_pid
      wait_host_listen "$port" "$s" || { echo "the droce server did not listen"; return 1; }
      guest -t 150 ib_read_bw -F -x "$peer_gid4" -p "$port" -s 65536 -D 3 "$host_ip" \
        >"$cdir/client.log" 2>&1 || { echo "the Linux client failed"; return 1; }
      finish "$s" 20 || { echo "the droce server failed"; return 1; }
      grep -Eq "^ +65536 " "$cdir/client.log" || { echo "no result line"; return 1; }
      echo "$(grep -Em1 '^ +65536 ' "$cdir/client.log" | tr -s ' \t' ' ') MB/s; $(counters "$cdir/server.log")"
      ;;
  esac
}

for pct in 0.1 1 5; do
  for dirs in rx tx "tx rx"; do
    for verb in recv send write read; do
      case_run "${verb}_${pct}pct_${dirs// /_}" lossy "$verb" "$dirs" "$pct"
    done
  done
done

interop_finish
