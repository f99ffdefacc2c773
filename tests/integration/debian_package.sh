#!/usr/bin/env bash
# The Debian packages (debian/), as an operator gets them:
#  - dpkg-buildpackage -b -us -uc builds libdroce0, libdroce-dev, droce and
#    droced from a clean copy of the checkout (its tracked and untracked,
#    not ignored, files), and lintian reports no error on them;
#  - apt installs them (dependencies from apt); the installed droce runs
#    `droce exec -- ibv_devinfo` (droce0, through /usr/lib/.../libdroce.so.0);
#    man finds droce(1), droce(7), droced(8), droced.toml(5); the group rdma
#    exists; /etc/droce/droced.toml is a conffile;
#  - the installed unit passes `systemd-analyze verify`, and droced runs as
#    the unit runs it (ExecStart from the unit, NOTIFY_SOCKET, /run/droce as
#    RuntimeDirectory, unlimited locked memory): READY=1, its socket in group
#    rdma with mode 0660, a client sees droce0 through it, and SIGTERM (the
#    unit's stop, KillMode=mixed) ends it with exit 0 and STOPPING=1;
#  - apt purge removes every file the packages installed, the conffile,
#    /etc/droce, the unit and the sysusers file, and leaves no droced.
# systemd is not PID 1 on the machines this runs on (a container), so the
# unit's start and stop are done here as systemd does them; the maintainer
# scripts' own `deb-systemd-invoke stop` runs only under systemd.
#
# Skips (77) unless root, when a tool is missing, or when droce packages are
# already installed (the test would replace an operator's own).
#
# usage: debian_package.sh SOURCE_ROOT
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 1 1 "SOURCE_ROOT"
root=$1
[ "$(id -u)" -eq 0 ] || skip "installing packages needs root"
require_program dpkg-buildpackage dpkg-dev
require_program dh debhelper
require_program lintian lintian
require_program systemd-analyze systemd
require_program ibv_devinfo ibverbs-utils
require_program python3 python3
packages=(libdroce0 libdroce-dev droce droced)
for p in "${packages[@]}"; do
  if dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^.i'; then
    skip "the package $p is installed on this machine; this test would replace it"
  fi
done
[ -e /run/droce ] && skip "/run/droce exists (a droced runs here?); this test's droced would take it"
clear_droce_env
t_setup package 40
fails=0
ok() { echo "ok: $*"; }
not_ok() { echo "FAIL: $*"; fails=$((fails + 1)); }

installed=no
purge_all() {
  if [ "$installed" = yes ]; then
    DEBIAN_FRONTEND=noninteractive apt-get purge -y -o DPkg::Lock::Timeout=120 "${packages[@]}" >>"$dir/purge.log" 2>&1
    installed=no
  fi
  rm -rf /run/droce
}
on_exit purge_all

# --- build ---------------------------------------------------------------
src=$dir/droce-src
mkdir -p "$src"
if git -C "$root" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  (cd "$root" && git ls-files -z --cached --others --exclude-standard | tar -c --null -T - -f -) | tar -x -C "$src" -f - ||
    fail "copying the checkout failed"
else
  tar -C "$root" --exclude='./build*' --exclude='./obj-*' -c -f - . | tar -x -C "$src" -f - || fail "copying the source failed"
fi
rm -rf "$src"/build*  # (a checkout's files only; an untracked build dir is ignored by .gitignore)
start=$SECONDS
if ! (cd "$src" && DEB_BUILD_OPTIONS="parallel=${DROCE_JOBS:-2}" dpkg-buildpackage -b -us -uc) >"$dir/build.log" 2>&1; then
  tail -n 60 "$dir/build.log"
  fail "dpkg-buildpackage failed"
fi
debs=()
for p in "${packages[@]}"; do
  f=$(ls "$dir/${p}_"*.deb 2>/dev/null | head -n1)
  [ -n "$f" ] || fail "dpkg-buildpackage made no $p package: $(ls "$dir")"
  debs+=("$f")
done
ok "dpkg-buildpackage -b made ${#debs[@]} packages in $((SECONDS - start)) s: $(cd "$dir" && ls ./*.deb | tr '\n' ' ')"
changes=$(ls "$dir"/droce_*.changes | head -n1)
lintian --fail-on error --tag-display-limit 0 "$changes" >"$dir/lintian.log" 2>&1
lrc=$?
errors=$(grep -c '^E: ' "$dir/lintian.log")
warnings=$(grep -c '^W: ' "$dir/lintian.log")
if [ "$lrc" -eq 0 ] && [ "$errors" -eq 0 ]; then ok "lintian: no errors ($warnings warnings)"
else not_ok "lintian exit $lrc, $errors errors: $(grep '^E: ' "$dir/lintian.log")"
fi
sed 's/^/  lintian: /' "$dir/lintian.log"

# --- install -------------------------------------------------------------
installed=yes
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y -o DPkg::Lock::Timeout=120 "${debs[@]}" >"$dir/install.log" 2>&1; then
  tail -n 30 "$dir/install.log"
  fail "apt-get install of the packages failed"
fi
ok "installed: $(dpkg-query -W -f='${Package} ${Version}, ' "${packages[@]}")"
dpkg -L "${packages[@]}" 2>/dev/null | sort -u >"$dir/files.txt"
droce=/usr/bin/droce  # the installed one, whatever else PATH has first

out=$(timeout 60 "$droce" exec -- ibv_devinfo 2>&1)
if grep -qE 'hca_id:[[:space:]]+droce0' <<<"$out"; then ok "droce exec -- ibv_devinfo: $(grep -E 'hca_id|state' <<<"$out" | tr -s ' \t\n' ' ')"
else not_ok "the installed droce exec -- ibv_devinfo: $out"
fi
out=$(timeout 30 "$droce" exec -- env 2>&1 | grep '^LD_PRELOAD=')
grep -qE '^LD_PRELOAD=/usr/lib/[^:]*/libdroce\.so\.0(:|$)' <<<"$out" && ok "droce preloads $out" ||
  not_ok "droce exec preloads '$out', not the installed libdroce.so.0"
for page in droce.1 droce.7 droce-rank.1 droce-switch.1 droced.8 droced.toml.5; do
  name=${page%.*} section=${page##*.}
  if ! man -w "$section" "$name" >/dev/null 2>&1; then not_ok "man $section $name: no page"; fi
done
text=$(MANWIDTH=80 man 1 droce 2>/dev/null)
grep -q 'droce exec' <<<"$text" && ok "man droce renders ($(wc -l <<<"$text") lines)" || not_ok "man droce: $text"
getent group rdma >/dev/null && ok "group rdma: $(getent group rdma)" || not_ok "no group rdma after install"
grep -qx '/etc/droce/droced.toml' /var/lib/dpkg/info/droced.conffiles 2>/dev/null &&
  ok "/etc/droce/droced.toml is a conffile" || not_ok "/etc/droce/droced.toml is not droced's conffile"
[ -f /usr/share/bash-completion/completions/droce ] || not_ok "no bash completion installed"

# --- droced as its unit runs it --------------------------------------------
unit=/lib/systemd/system/droced.service
[ -f "$unit" ] || fail "no $unit"
if v=$(systemd-analyze verify "$unit" 2>&1); then ok "systemd-analyze verify $unit${v:+ ($v)}"
else not_ok "systemd-analyze verify: $v"
fi
grep -qx 'Type=notify' "$unit" || not_ok "the unit is not Type=notify"
exec_start=$(sed -n 's/^ExecStart=//p' "$unit")
read -r -a cmd <<<"$exec_start"
[ "${cmd[0]}" = /usr/sbin/droced ] || not_ok "ExecStart runs '${cmd[0]}', not /usr/sbin/droced"
mkdir -m 0755 /run/droce  # RuntimeDirectory=droce
listen_notify "$dir/notify.sock" "$dir/notify.log" || not_ok "the notify listener did not start"
# LimitMEMLOCK=infinity, where this machine lets root raise it (a container
# may not: then droced runs with the limit it has).
t_bg "$dir/droced.log" 120 bash -c 'ulimit -l unlimited 2>/dev/null || echo "(LimitMEMLOCK=infinity: not permitted here, $(ulimit -l) kept)"
  exec env NOTIFY_SOCKET="$0" "$@"' "$dir/notify.sock" "${cmd[@]}"
dpid=$last_pid
for _ in $(seq 1 400); do grep -q 'READY=1' "$dir/notify.log" 2>/dev/null && break; kill -0 "$dpid" 2>/dev/null || break; sleep 0.05; done
if grep -q 'READY=1' "$dir/notify.log" 2>/dev/null; then
  ok "droced: $(grep READY=1 "$dir/notify.log")"
  sock=/run/droce/droced.sock
  st=$(stat -c '%a %G' "$sock" 2>/dev/null)
  [ "$st" = "660 rdma" ] && ok "$sock: mode 0660, group rdma" || not_ok "$sock is '$st', want '660 rdma'"
  # With neither DROCE_DAEMON nor DROCE_LINK, the default socket's daemon.
  out=$(timeout 60 "$droce" exec -- ibv_devinfo -v 2>&1)
  if grep -qE 'hca_id:[[:space:]]+droce0' <<<"$out"; then ok "a client of the packaged droced: $(grep -E 'hca_id' <<<"$out" | tr -s ' \t' ' ')"
  else not_ok "ibv_devinfo through droced: $out"
  fi
  # A program that stays (an ibv_rc_pingpong server waiting for its peer)
  # is one of droced's clients while it runs.
  port=$(( 20000 + RANDOM % 20000 ))
  t_bg "$dir/pingpong.log" 60 "$droce" exec -- ibv_rc_pingpong -g 0 -p "$port"
  ppid_=$last_pid
  clients=""
  for _ in $(seq 1 100); do
    clients=$(timeout 30 "$droce" ctl --socket "$sock" client show 2>&1)
    grep -q 'ibv_rc_pingpong' <<<"$clients" && break
    sleep 0.1
  done
  if grep -q 'ibv_rc_pingpong' <<<"$clients"; then ok "droce ctl client show: $(grep ibv_rc_pingpong <<<"$clients" | tr -s ' ' ' ')"
  else not_ok "ibv_rc_pingpong is not droced's client: $clients $(cat "$dir/pingpong.log")"
  fi
  kill_group "$ppid_"
  # systemd's stop with KillMode=mixed: SIGTERM to the main process.
  # (t_bg's timeout runs bash, which execs env, which execs droced.)
  kill -TERM "$(pgrep -P "$dpid" | head -n1)" 2>/dev/null
  wait "$dpid"
  rc=$?
  [ "$rc" -eq 0 ] && ok "droced exit 0 on SIGTERM" || not_ok "droced exit $rc after SIGTERM: $(tail -n 5 "$dir/droced.log")"
  wait "$notify_pid"
  grep -q 'STOPPING=1' "$dir/notify.log" && ok "STOPPING=1" || not_ok "no STOPPING=1: $(cat "$dir/notify.log")"
  [ -e "$sock" ] && not_ok "droced left $sock"
else
  not_ok "droced sent no READY=1: $(tail -n 20 "$dir/droced.log")"
fi
rm -rf /run/droce  # RuntimeDirectory= is removed when the unit stops

# --- purge ---------------------------------------------------------------
if DEBIAN_FRONTEND=noninteractive apt-get purge -y -o DPkg::Lock::Timeout=120 "${packages[@]}" >"$dir/purge.log" 2>&1; then
  installed=no
  ok "purged"
else
  not_ok "apt-get purge failed: $(tail -n 10 "$dir/purge.log")"
fi
left=0
while IFS= read -r f; do
  # Directories other packages own (/usr/bin, /usr/share/man/man1) stay.
  if [ -e "$f" ] && [ ! -d "$f" ]; then echo "  left behind: $f"; left=$((left + 1)); fi
done <"$dir/files.txt"
for f in /etc/droce /lib/systemd/system/droced.service /usr/lib/sysusers.d/droced.conf /usr/sbin/droced /run/droce; do
  [ -e "$f" ] && { echo "  left behind: $f"; left=$((left + 1)); }
done
pgrep -f '^/usr/sbin/droced' >/dev/null && { echo "  left running: /usr/sbin/droced $(pgrep -f '^/usr/sbin/droced')"; left=$((left + 1)); }
[ "$left" -eq 0 ] && ok "nothing of the packages is left ($(wc -l <"$dir/files.txt") paths checked)" || not_ok "$left things left after purge"

[ "$fails" -eq 0 ] || fail "$fails checks failed"
echo "PASS: built, linted, installed, ran and purged droce's packages"
