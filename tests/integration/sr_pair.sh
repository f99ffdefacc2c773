#!/usr/bin/env bash
# Selective repeat on a live link (DROCE_SR, docs/LAB.md):
# two processes over memif, the client's engine dropping its own requests
# with the fault injector (DROCE_FAULT on what it sends).
#
#   1. write_check (64 KiB RDMA WRITEs, every byte checked by the server)
#      with selective repeat at both ends, at 1 % random loss and at
#      Gilbert-Elliott loss: every byte right, and the client resent at most
#      1.1 packets per packet the rule dropped (retransmitted_pkts against
#      the rule's dropped count) — plus, in a run where an engine stalled
#      (engine_stalls: a virtual CPU frozen by the host), a window of 512
#      per local ACK timeout the stall caused.
#   2. The same without selective repeat: every byte right, go-back-N
#      resending many packets per loss.
#   3. Only the client with it on: the server holds nothing and sends no
#      SACK, so the client never gets one (plain go-back-N both ways).
#   4. perftest's ib_write_bw with it on at both ends at 1 % loss: it runs
#      to the end and the client acted on SACKs.
# Goodput is printed, not checked (bench/sr compares it, alternated).
#
# usage: sr_pair.sh LAUNCHER WRITE_CHECK IB_WRITE_BW
# Every process is bounded by `timeout` and killed on exit.
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 3 3 "LAUNCHER WRITE_CHECK IB_WRITE_BW"
launcher=$1
check=$2
perftest=$3
t_launcher "$launcher"
t_setup sr 30
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU DROCE_FAULT DROCE_CAPTURE DROCE_CTL DROCE_STATS DROCE_SR DROCE_TRACE

# run NAME SERVER_SR CLIENT_SR RULE PROGRAM...: the server end of PROGRAM
# (write_check server PORT, or ib_write_bw -p PORT), then its client with
# DROCE_FAULT=RULE; logs in $dir/NAME.{server,client}.log. PORT in $port.
run() {
  local name=$1 ssr=$2 csr=$3 rule=$4 kind=$5
  port=$(( 20000 + RANDOM % 20000 ))
  rm -f "$dir/m.sock"
  local sargs cargs
  if [ "$kind" = check ]; then
    sargs=("$check" server "$port")
    cargs=("$check" client 127.0.0.1 "$port" 2)
  else
    sargs=("$perftest" -s 65536 -D 2 --report_gbits -p "$port")
    cargs=("$perftest" -s 65536 -D 2 --report_gbits -p "$port" 127.0.0.1)
  fi
  # With selective repeat at both ends the local ACK timeout is only the
  # dead-peer backstop, as it is for perftest (14: 67 ms): write_check's 4
  # ms default fired whenever a busy machine kept either end off its CPU for
  # that long (scripts/stress.sh: 2 of 3 runs beside two busy loops, with no
  # engine stall counted), and each firing went back N over a window the
  # responder had. Go-back-N keeps a short one, 12 (16.8 ms): there it is
  # the recovery of a lost last packet. Not write_check's 4 ms: a server
  # kept off its CPU for more than 8 of those (32 ms; a stress run saw 25
  # stalls totalling 344 ms) is, by the verbs' retry count of 7, a dead
  # peer, and the client ended in IBV_WC_RETRY_EXC_ERR.
  local ack_timeout=12
  [ "$ssr" != off ] && [ "$csr" != off ] && ack_timeout=14
  t_bg "$dir/$name.server.log" 60 env WRITE_CHECK_TIMEOUT="$ack_timeout" DROCE_SR="$ssr" DROCE_STATS=1 "$launcher" exec \
    --link "net_memif0,role=server,socket=$dir/m.sock,socket-abstract=no" --ip 10.79.0.1/24 \
    -- "${sargs[@]}"
  local srv=$last_pid
  wait_tcp_listen "$port" || fail "$name: the server did not listen"
  t_bg "$dir/$name.client.log" 60 env WRITE_CHECK_TIMEOUT="$ack_timeout" DROCE_SR="$csr" DROCE_STATS=1 DROCE_FAULT="$rule" \
    "$launcher" exec --link "net_memif0,role=client,socket=$dir/m.sock,socket-abstract=no" --ip 10.79.0.2/24 \
    -- "${cargs[@]}"
  local cli=$last_pid
  # A run takes a few seconds; one still going after 50 s has hung: say
  # where every thread of both ends is before timeout kills them.
  hang_watch 50 "$srv" "$cli"
  local watch=$!
  wait "$cli"
  local crc=$?
  kill "$watch" 2>/dev/null
  wait "$watch" 2>/dev/null
  wait "$srv"
  local src=$?
  [ "$crc" -eq 0 ] || fail "$name: the client exited with $crc"
  [ "$src" -eq 0 ] || fail "$name: the server exited with $src"
}

# checked NAME RULE SERVER_SR CLIENT_SR: a write_check run; prints its
# figures, checks the bytes, sets lost, resent, timeouts, stalls and
# timeout_allowance.
checked() {
  local name=$1 rule=$2
  run "$name" "$3" "$4" "$rule" check
  local c="$dir/$name.client.log" s="$dir/$name.server.log"
  grep -q "bad_words 0$" "$c" || fail "$name: the client saw bad words"
  grep -q "server: passes [1-9][0-9]* bad_words 0$" "$s" || fail "$name: the server found bad words"
  lost=$(fault_dropped "$c")
  resent=$(stat_of "$c" retransmitted_pkts)
  [ -n "$lost" ] && [ "$lost" -gt 100 ] || fail "$name: the rule dropped ${lost:-nothing}"
  resent=${resent:-0}
  # A stalled engine (engine_stalls: a frozen virtual CPU on a busy VM,
  # docs/PERFORMANCE.md) sends its peer into local ACK timeouts, and each
  # resends up to a window (512 packets) the responder already has: those
  # are allowed beyond selective repeat's own bound, only in such a run.
  timeouts=$(stat_of "$c" completer_retry_err); timeouts=${timeouts:-0}
  local cstalls sstalls cstall_us sstall_us
  cstalls=$(stat_of "$c" engine_stalls); sstalls=$(stat_of "$s" engine_stalls)
  cstall_us=$(stat_of "$c" engine_stalled_us); sstall_us=$(stat_of "$s" engine_stalled_us)
  stalls=$(( ${cstalls:-0} + ${sstalls:-0} ))
  timeout_allowance=0
  [ "$stalls" -gt 0 ] && timeout_allowance=$(( timeouts * 512 ))
  echo "[$name] $(grep -E '^passes' "$c"); dropped $lost, retransmitted $resent," \
       "SACKs $(stat_of "$c" sr_sack_rcvd), held $(stat_of "$s" sr_held_pkts), RTOs $(stat_of "$c" sr_timeouts), needless $(stat_of "$c" sr_spurious_resends)," \
       "ACK timeouts $timeouts, engine stalls $stalls (server ${sstall_us:-0} us, client ${cstall_us:-0} us)," \
       "server duplicates $(stat_of "$s" duplicate_request)"
}

# 1. Selective repeat at both ends.
for case in "random:loss random 1%" "gemodel:loss gemodel 0.5% 30% 50% 0%"; do
  name=${case%%:*}
  checked "sr_$name" "${case#*:}" on on
  [ $(( resent * 10 )) -le $(( lost * 11 + timeout_allowance * 10 )) ] ||
    fail "sr_$name: $resent retransmitted for $lost lost (more than 1.1 per loss," \
         "$timeout_allowance allowed for $timeouts ACK timeouts after $stalls engine stalls)"
  [ -n "$(stat_of "$dir/sr_$name.client.log" sr_sack_rcvd)" ] || fail "sr_$name: no SACK reached the client"
done

# 2. Go-back-N.
checked gbn "loss random 1%" off off
[ "$resent" -gt $(( lost * 2 )) ] || fail "gbn: only $resent retransmitted for $lost lost: is go-back-N still going back?"
[ -z "$(stat_of "$dir/gbn.client.log" sr_sack_rcvd)" ] || fail "gbn: SACKs without selective repeat"

# 3. The client alone: nothing held, no SACK, go-back-N.
checked half "loss random 1%" off on
[ -z "$(stat_of "$dir/half.server.log" sr_held_pkts)" ] || fail "half: a server without selective repeat held requests"
[ -z "$(stat_of "$dir/half.client.log" sr_sack_rcvd)" ] || fail "half: SACKs from a server without selective repeat"
[ -n "$(stat_of "$dir/half.client.log" rcvd_seq_err)" ] || fail "half: no go-back-N NAK at 1 % loss"

# 4. perftest.
if command -v "$perftest" >/dev/null 2>&1; then
  run perftest on on "loss random 1%" perftest
  grep -E '^ *65536 ' "$dir/perftest.client.log" | sed 's/^/[perftest] /'
  [ -n "$(stat_of "$dir/perftest.client.log" sr_sack_rcvd)" ] || fail "perftest: no SACK reached ib_write_bw's QP"
else
  echo "perftest: '$perftest' not installed, not run"
fi
echo "PASS: selective repeat over memif: byte-exact at random and Gilbert-Elliott loss, at most 1.1 resends per loss, go-back-N with a peer without it"
