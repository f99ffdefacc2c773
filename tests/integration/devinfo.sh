#!/usr/bin/env bash
# Checks that an unmodified ibv_devices / ibv_devinfo see the droce device when
# run through the launcher with no configuration (default link: the internal
# loopback link), and that ibv_devinfo -v shows GID index 1 once DROCE_IP6 is
# set.
#
# usage: devinfo.sh LAUNCHER [IBV_DEVICES] [IBV_DEVINFO]
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 1 - "LAUNCHER [IBV_DEVICES] [IBV_DEVINFO]"
launcher=$1
ibv_devices=${2:-ibv_devices}
ibv_devinfo=${3:-ibv_devinfo}

t_launcher "$launcher"
require_program "$ibv_devices" ibverbs-utils
require_program "$ibv_devinfo" ibverbs-utils

# No configuration: default link, address, MTU and MAC.
unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU

fail=0
check() {  # check NAME OUTPUT FIXED-STRING
  if ! grep -qF -- "$3" <<<"$2"; then
    echo "FAIL: $1 output lacks '$3'"
    fail=1
  fi
}

devices_out=$(timeout 30 "$launcher" exec -- "$ibv_devices" 2>&1 </dev/null)
devices_rc=$?
devinfo_out=$(timeout 30 "$launcher" exec -- "$ibv_devinfo" 2>&1 </dev/null)
devinfo_rc=$?
# With an IPv6 address the GID table has two entries (ibv_devinfo -v reads
# them through ibv_query_gid and ibv_query_gid_type).
verbose_out=$(DROCE_IP6=fd78:1::1/64 timeout 30 "$launcher" exec -- "$ibv_devinfo" -v 2>&1 </dev/null)
verbose_rc=$?

if [ "$devices_rc" -ne 0 ]; then echo "FAIL: ibv_devices exited $devices_rc"; fail=1; fi
if [ "$devinfo_rc" -ne 0 ]; then echo "FAIL: ibv_devinfo exited $devinfo_rc"; fail=1; fi
if [ "$verbose_rc" -ne 0 ]; then echo "FAIL: ibv_devinfo -v exited $verbose_rc"; fail=1; fi
# ibv_devices prints "    droce0          	<node GUID>".
if ! grep -Eq '^[[:space:]]*droce0[[:space:]]' <<<"$devices_out"; then
  echo "FAIL: ibv_devices does not list droce0"
  fail=1
fi
check ibv_devinfo "$devinfo_out" $'hca_id:\tdroce0'
check ibv_devinfo "$devinfo_out" 'PORT_ACTIVE'
check ibv_devinfo "$devinfo_out" $'link_layer:\t\tEthernet'
check "ibv_devinfo -v" "$verbose_out" $'gid_tbl_len:\t\t2'
check "ibv_devinfo -v" "$verbose_out" $'GID[  0]:\t\t::ffff:10.77.0.1, RoCE v2'
check "ibv_devinfo -v" "$verbose_out" $'GID[  1]:\t\tfd78:1::1, RoCE v2'

if [ "$fail" -ne 0 ]; then
  echo "----- ibv_devices output -----"
  echo "$devices_out"
  echo "----- ibv_devinfo output -----"
  echo "$devinfo_out"
  echo "----- ibv_devinfo -v output (DROCE_IP6 set) -----"
  echo "$verbose_out"
  echo "-----"
  exit 1
fi
echo "PASS: ibv_devices lists droce0; ibv_devinfo shows droce0, PORT_ACTIVE, Ethernet; -v shows both GIDs"
exit 0
