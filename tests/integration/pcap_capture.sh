#!/usr/bin/env bash
# A capture written through DPDK's pcap PMD (net_pcap, tx_pcap=FILE) is
# accepted by `droce pcap-check`.
#
# usage: pcap_capture.sh LAUNCHER RC_PINGPONG
#   An ibv_rc_pingpong server runs on droce's default loopback link; the
#   client's link is `net_pcap0,rx_pcap=IN,tx_pcap=OUT`. IN (written here)
#   replays one ARP reply that tells the client the server's MAC, so the
#   client sends its RC SENDs, and their retransmissions, into OUT; no peer
#   ever answers, so the client ends with a retry-exceeded error, as expected.
#   Passes if OUT holds RC SEND packets and `droce pcap-check` accepts OUT.
#   No root needed. Exit 77 (skip) without ibv_rc_pingpong or the pcap PMD.
# shellcheck disable=SC2059  # MACs are printf escapes
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 2 2 "LAUNCHER RC_PINGPONG"
launcher=$1
program=$2
t_launcher "$launcher"
require_program "$program" ibverbs-utils
compgen -G "/usr/lib/*/dpdk/pmds-*/librte_net_pcap.so*" >/dev/null ||
  skip "DPDK's pcap PMD is not installed (librte-net-pcap23: scripts/setup.sh)"
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU DROCE_GATEWAY DROCE_IP6 DROCE_VLAN

t_setup pcap

readonly server_ip=10.77.9.1 client_ip=10.77.9.2
readonly server_mac='\x02\x00\x0a\x4d\x09\x01'  # the derived MAC droce gives 10.77.9.1
# The pcap PMD's default MAC for port 0 of a file-backed device.
readonly client_mac='\x02\x70\x63\x61\x70\x00'

# IN: a little-endian pcap file (Ethernet) with one 60-byte frame: the ARP
# reply "10.77.9.1 is at 02:00:0a:4d:09:01" addressed to the client.
{
  printf '\xd4\xc3\xb2\xa1\x02\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\xff\xff\x00\x00\x01\x00\x00\x00'
  printf '\x00\x00\x00\x00\x00\x00\x00\x00\x3c\x00\x00\x00\x3c\x00\x00\x00'
  printf "$client_mac$server_mac"'\x08\x06'
  printf '\x00\x01\x08\x00\x06\x04\x00\x02'
  printf "$server_mac"'\x0a\x4d\x09\x01'
  printf "$client_mac"'\x0a\x4d\x09\x02'
  printf '\x00%.0s' $(seq 1 18)
} >"$dir/in.pcap"

# A free TCP port for the programs' exchange.
port=""
for _ in $(seq 1 100); do
  candidate=$(( 20000 + (RANDOM * 32768 + RANDOM) % 30000 ))
  if ! awk -v p="$(printf ':%04X' "$candidate")" 'FNR > 1 && substr($2, length($2) - 4) == p { f = 1 } END { exit !f }' \
      /proc/net/tcp /proc/net/tcp6 2>/dev/null; then
    port=$candidate
    break
  fi
done
[ -n "$port" ] || fail "no free TCP port"

t_bg "$dir/server.log" 60 "$launcher" exec --ip "$server_ip/24" -- "$program" -g 0 -p "$port" -n 5
wait_tcp_listen "$port"

timeout 60 "$launcher" exec --link "net_pcap0,rx_pcap=$dir/in.pcap,tx_pcap=$dir/out.pcap" \
  --ip "$client_ip/24" -- "$program" -g 0 -p "$port" -n 5 127.0.0.1 </dev/null >"$dir/client.log" 2>&1
client_rc=$?

failed=0
if ! grep -q "retry counter exceeded" "$dir/client.log"; then
  echo "FAIL: the client should end with a retry-exceeded error (exit $client_rc)"
  failed=1
fi
check_out=$("$(dirname "$launcher")/droce" pcap-check -v "$dir/out.pcap" 2>&1)
check_rc=$?
sends=$(echo "$check_out" | grep -c "RC_SEND_[A-Z]* .* ok")
if [ "$check_rc" -ne 0 ]; then echo "FAIL: droce pcap-check exit $check_rc"; failed=1; fi
if [ "$sends" -lt 2 ]; then echo "FAIL: expected RC SEND packets (a first send and retransmissions) in the capture, found $sends"; failed=1; fi
if [ "$failed" -ne 0 ]; then
  echo "----- pcap-check -----"
  echo "$check_out"
  echo "----- client -----"
  cat "$dir/client.log"
  echo "----- server -----"
  cat "$dir/server.log"
  exit 1
fi
echo "PASS: capture written through net_pcap ($(stat -c %s "$dir/out.pcap") bytes, $sends RC SEND packets) accepted by droce pcap-check"
echo "$check_out" | tail -3
exit 0
