#!/usr/bin/env bash
# droced's systemd unit (tools/droced/droced.service.in, configured with
# this build's droced in ExecStart) passes `systemd-analyze verify`, and is
# what droced expects of it: Type=notify (droced sends READY=1), the
# configuration file, /run/droce, unlimited locked memory, no restart after
# exit 2 (a bad file). Skips (77) only if systemd-analyze is not installed.
#
# usage: droced_unit.sh UNIT
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 1 1 "UNIT"
unit=$1
require_program systemd-analyze systemd
t_setup unit
fails=0
# verify wants the unit under its own name; it checks ExecStart's binary.
# --man=no: the pages its Documentation= names are installed, not here
# (debian_package verifies the installed unit with them).
cp "$unit" "$dir/droced.service"
if out=$(systemd-analyze verify --man=no "$dir/droced.service" 2>&1); then
  echo "ok: systemd-analyze verify droced.service${out:+ ($out)}"
else
  echo "FAIL: systemd-analyze verify: $out"
  fails=1
fi
for want in '^Type=notify$' '^ExecStart=/.*/droced --config /etc/droce/droced.toml$' '^RuntimeDirectory=droce$' \
            '^LimitMEMLOCK=infinity$' '^Restart=on-failure$' '^RestartPreventExitStatus=2$'; do
  grep -Eq -- "$want" "$unit" || { echo "FAIL: no line matching $want"; fails=1; }
done
[ "$fails" -eq 0 ] && echo "the unit verifies"
exit "$fails"
