#!/usr/bin/env bash
# Checks that UCX (ucx_info -d, Debian's ucx-utils) lists droce0 as a memory
# domain with its verbs transports. UCX lists a device only if
# /dev/infiniband/<dev_name> is a character device it may open read-write,
# and reads the RoCE version from /sys/class/infiniband/<dev>/ports/1/
# gid_attrs/types/<i>: the provider's file-system view (sysfs_view.cc).
#
# usage: ucx_info.sh LAUNCHER [UCX_INFO]
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 1 - "LAUNCHER [UCX_INFO]"
launcher=$1
ucx_info=${2:-ucx_info}
t_launcher "$launcher"
require_program "$ucx_info" ucx-utils

unset DROCE_LINK DROCE_IP DROCE_MAC DROCE_MTU DROCE_IP6
tmp=${TMPDIR:-/tmp}
before=$(ls -d "$tmp"/droce-sysfs-* 2>/dev/null | sort)

out=$(timeout 60 "$launcher" exec -- "$ucx_info" -d 2>&1 </dev/null)
rc=$?

fail=0
if [ "$rc" -ne 0 ]; then echo "FAIL: ucx_info -d exited $rc"; fail=1; fi
# The droce0 block: from its "Memory domain" line to the next one.
block=$(awk '/^# Memory domain:/ { on = ($4 == "droce0") } on' <<<"$out")
if [ -z "$block" ]; then
  echo "FAIL: ucx_info -d lists no memory domain droce0"
  fail=1
fi
for tl in rc_verbs ud_verbs; do
  # "#      Transport: rc_verbs" followed by "#         Device: droce0:1".
  if ! grep -A1 -E "^#[[:space:]]+Transport: $tl\$" <<<"$block" | grep -qE "^#[[:space:]]+Device: droce0:1\$"; then
    echo "FAIL: droce0 has no transport $tl on droce0:1"
    fail=1
  fi
done
# The process's sysfs tree is gone with it.
after=$(ls -d "$tmp"/droce-sysfs-* 2>/dev/null | sort)
if [ "$after" != "$before" ]; then
  echo "FAIL: ucx_info left a sysfs tree behind: $(comm -13 <(echo "$before") <(echo "$after"))"
  fail=1
fi

if [ "$fail" -ne 0 ]; then
  echo "----- ucx_info -d output -----"
  echo "$out"
  echo "-----"
  exit 1
fi
echo "PASS: ucx_info -d lists memory domain droce0 with rc_verbs and ud_verbs on droce0:1"
exit 0
