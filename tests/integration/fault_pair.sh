#!/usr/bin/env bash
# Fault injection on a live link (DROCE_FAULT, src/lab/, docs/LAB.md): two
# processes over memif running ibv_rc_pingpong with buffer validation
# (`-c`), the server's engine injecting faults on what it sends.
#
#   1. loss random 10%; reorder 5% gap 3; duplicate 2% — RC recovers, every
#      buffer checks out, and the server's rule counters show each fault at
#      work.
#   2. corrupt 5% — the client's engine counts the corrupted frames in
#      icrc_err (read from its DROCE_STATS=1 report), as many as the server
#      corrupted (less any still in flight when the client closed).
#   3. rx loss random 20% ecn — congestion marks on a live link:
#      the server's stage sets ECN CE on ECN-capable frames it receives
#      (DROCE_CC=dcqcn, the default, sends data ECT(0)), its QPs count each
#      in np_ecn_marked_roce_packets and answer with CNPs, and the client's
#      DCQCN acts on them (rp_cnp_handled). Frames that are not ECN-capable
#      (ACKs) are dropped instead, as netem's ecn does.
#
# usage: fault_pair.sh LAUNCHER IBV_RC_PINGPONG
# Each pair is run by pingpong_pair.sh (bounded by `timeout`, every process
# group cleaned up). Exit 77 (skip) if the program is not installed.
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 2 2 "LAUNCHER IBV_RC_PINGPONG"
launcher=$1
program=$2
t_launcher "$launcher"
require_program "$program" ibverbs-utils
here=$(dirname "$0")
t_setup fault

# pair NAME RULES ARGS...: the server with DROCE_FAULT=RULES, the client
# without (an empty variable is an unset one), both with DROCE_STATS=1.
pair() {
  local name=$1 rules=$2
  shift 2
  mkdir -p "$dir/$name"
  if ! DROCE_FAULT=$rules DROCE_STATS=1 DROCE_TEST_CLIENT_ENV="DROCE_FAULT= ${client_extra:-}" DROCE_TEST_LOG_DIR="$dir/$name" \
       bash "$here/pingpong_pair.sh" "$launcher" "$program" "$@"; then
    fail "$name: the pair failed with '$rules'"
  fi
}

# counter FILE RULE WORD: the count after WORD on the server's report line of
# rule RULE ("droce: droce0 fault rule 1 '...': matched M, dropped D, ...").
counter() {
  grep -E "fault rule $2 " "$1" | sed -nE "s/.*[:,] $3 ([0-9]+).*/\1/p" | head -n1
}

# 1. loss, reordering, duplication: the data is checked by rc_pingpong -c.
pair recover 'loss random 10%; reorder 5% gap 3; duplicate 2%' -g 0 -n 300 -s 4096 -c
s="$dir/recover/server.log"
grep -E "fault rule" "$s" | sed 's/^/[server] /'
dropped=$(counter "$s" 1 dropped)
reordered=$(counter "$s" 2 reordered)
duplicated=$(counter "$s" 3 duplicated)
matched=$(counter "$s" 1 matched)
if [ -z "$dropped" ] || [ -z "$reordered" ] || [ -z "$duplicated" ] || [ -z "$matched" ]; then
  echo "FAIL: recover: no fault counters in the server's DROCE_STATS report"; cat "$s"; exit 1
fi
if [ "$dropped" -eq 0 ] || [ "$reordered" -eq 0 ] || [ "$duplicated" -eq 0 ]; then
  fail "recover: a fault never happened (dropped $dropped, reordered $reordered, duplicated $duplicated)"
fi
# 10 % of what was matched, give or take (a few hundred packets: wide bounds).
if [ $(( dropped * 100 )) -lt $(( matched * 4 )) ] || [ $(( dropped * 100 )) -gt $(( matched * 20 )) ]; then
  fail "recover: dropped $dropped of $matched, far from 10 %"
fi

# 2. corruption: the peer's ICRC check catches every corrupted frame.
pair corrupt 'corrupt 5%' -g 0 -n 300 -s 4096 -c
s="$dir/corrupt/server.log"
c="$dir/corrupt/client.log"
grep -E "fault rule" "$s" | sed 's/^/[server] /'
corrupted=$(counter "$s" 1 corrupted)
icrc=$(stat_of "$c" icrc_err)
echo "[client] icrc_err ${icrc:-0}"
if [ -z "$corrupted" ] || [ "$corrupted" -eq 0 ]; then
  echo "FAIL: corrupt: the server corrupted nothing"; cat "$s"; exit 1
fi
if [ -z "$icrc" ] || [ "$icrc" -gt "$corrupted" ] || [ $(( corrupted - icrc )) -gt 2 ]; then
  echo "FAIL: corrupt: the server corrupted $corrupted frames, the client counted icrc_err ${icrc:-0}"
  cat "$c"
  exit 1
fi
# 3. ECN marks: CNPs from the server's notification point to the client's
# reaction point, on a tagged link (VLAN 100, priority 3) with the server
# capturing what it sends: its CNPs carry cnp_802p_prio (6), its data the
# link's priority.
DROCE_VLAN=100:3 DROCE_CAPTURE="$dir/ecn.pcapng" client_extra='DROCE_CAPTURE=' \
  pair ecn 'rx loss random 20% ecn' -g 0 -n 300 -s 4096 -c
s="$dir/ecn/server.log"
c="$dir/ecn/client.log"
grep -E "fault rule" "$s" | sed 's/^/[server] /'
marked=$(counter "$s" 1 marked)
np_marked=$(stat_of "$s" np_ecn_marked_roce_packets)
np_sent=$(stat_of "$s" np_cnp_sent)
rp_handled=$(stat_of "$c" rp_cnp_handled)
echo "[server] marked ${marked:-?}, np_ecn_marked_roce_packets ${np_marked:-?}, np_cnp_sent ${np_sent:-?}; [client] rp_cnp_handled ${rp_handled:-?}"
if [ -z "$marked" ] || [ "$marked" -eq 0 ] || [ "${np_marked:-0}" -ne "$marked" ]; then
  echo "FAIL: ecn: the stage marked ${marked:-0} frames, the QPs counted ${np_marked:-0}"; cat "$s"; exit 1
fi
if [ -z "$np_sent" ] || [ "$np_sent" -eq 0 ] || [ "$np_sent" -gt "$np_marked" ]; then
  fail "ecn: ${np_sent:-0} CNPs for $np_marked marked packets"
fi
if [ -z "$rp_handled" ] || [ "$rp_handled" -gt "$np_sent" ] || [ $(( np_sent - rp_handled )) -gt 2 ]; then
  echo "FAIL: ecn: the server sent $np_sent CNPs, the client handled ${rp_handled:-0}"; cat "$c"; exit 1
fi
if command -v tshark >/dev/null 2>&1; then
  # "interface<TAB>priority<TAB>comment" of what the server sent on the wire.
  tshark -r "$dir/ecn.pcapng" -T fields -e frame.interface_name -e vlan.priority -e frame.comment \
    >"$dir/ecn.txt" 2>"$dir/ecn.err" || { cat "$dir/ecn.err"; fail "ecn: tshark cannot read the capture"; }
  cnp_prios=$(awk -F'\t' '$1 ~ / tx( wire)?$/ && $3 ~ /CNP for QP/ { print $2 }' "$dir/ecn.txt" | sort | uniq -c | tr -s ' ' | tr '\n' ';')
  data_prios=$(awk -F'\t' '$1 ~ / tx( wire)?$/ && $3 !~ /CNP for QP/ { print $2 }' "$dir/ecn.txt" | sort | uniq -c | tr -s ' ' | tr '\n' ';')
  echo "[server capture] CNP priorities:${cnp_prios:- none} other frames:${data_prios:- none}"
  [ "$(awk -F'\t' '$1 ~ / tx( wire)?$/ && $3 ~ /CNP for QP/ && $2 == 6' "$dir/ecn.txt" | wc -l)" -gt 0 ] &&
    [ "$(awk -F'\t' '$1 ~ / tx( wire)?$/ && $3 ~ /CNP for QP/ && $2 != 6' "$dir/ecn.txt" | wc -l)" -eq 0 ] &&
    [ "$(awk -F'\t' '$1 ~ / tx( wire)?$/ && $3 !~ /CNP for QP/ && $2 != 3' "$dir/ecn.txt" | wc -l)" -eq 0 ] ||
    fail "ecn: CNPs must leave with priority 6, every other frame with the link's 3"
fi

echo "PASS: rc_pingpong -c recovered from loss/reorder/duplicate (dropped $dropped, reordered $reordered," \
  "duplicated $duplicated); corrupt: $corrupted corrupted, peer icrc_err $icrc;" \
  "ecn: $marked marked, $np_sent CNPs sent, $rp_handled handled by DCQCN"
