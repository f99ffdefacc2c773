#!/usr/bin/env bash
# The man pages (docs/man/*.md) against the programs, so that they cannot
# drift: every DROCE_* variable the code reads is in droce(7); every setting
# flag is in droce(1) and droced(8); droced's own flags (its --help) in
# droced(8); every droce command (droce help) and ctl object (droce ctl help)
# in droce(1); every key droced's configuration parser knows in
# droced.toml(5); droce-switch's and droce-rank's flags in their own pages;
# the bash completion offers the commands, flags and ctl objects and
# completes. Where pandoc built the pages, each renders with
# man without a warning.
#
# usage: man_pages.sh LAUNCHER DROCED SOURCE_ROOT [BUILT_MAN_DIR]
set -u
# shellcheck source=lib.sh
. "$(dirname "$0")/lib.sh"
t_usage $# 3 4 "LAUNCHER DROCED SOURCE_ROOT [BUILT_MAN_DIR]"
launcher=$1
droced=$2
root=$3
built=${4:-}
t_launcher "$launcher"
t_launcher "$droced"
man_src=$root/docs/man
[ -d "$man_src" ] || fail "no $man_src"

missing=0
# has PAGE WORD WHAT: PAGE (docs/man/PAGE.md, Markdown escapes removed)
# names WORD in bold.
has() {
  if ! sed 's/\\//g' "$man_src/$1.md" | grep -qF -- "**$2**"; then
    echo "MISSING: $1 does not name $3 '$2'"
    missing=$(( missing + 1 ))
  fi
}

# Every DROCE_* variable the engine, the provider and the tools read.
vars=$(grep -rhoE '"DROCE_[A-Z0-9_]+"' "$root/src" "$root/providers" "$root/tools" | tr -d '"' | sort -u)
[ -n "$vars" ] || fail "found no DROCE_* variable in the sources"
for v in $vars; do has droce.7 "$v" "the variable"; done

# The setting flags (src/config/settings.h: {Setting::kX, "DROCE_X", "flag", ...}).
flags=$(sed -nE 's/^ *\{Setting::k[A-Za-z]+, "DROCE_[A-Z0-9_]+", "([a-z0-9-]+)",.*/\1/p' "$root/src/config/settings.h")
[ "$(wc -w <<<"$flags")" -ge 15 ] || fail "found only $(wc -w <<<"$flags") setting flags in settings.h"
for f in $flags; do
  has droce.1 "--$f" "the exec flag"
  has droced.8 "--$f" "the setting flag"
done
has droce.1 "--daemon" "the exec flag"

# droced's own flags, from its usage.
own=$("$droced" --help 2>&1 | grep -oE '\[--[a-z-]+' | tr -d '[' | sort -u)
[ -n "$own" ] || fail "droced --help names no flag"
for f in $own; do has droced.8 "$f" "droced's flag"; done

# droce-switch's flags (its --help) and droce-rank's (its usage line), in
# their own pages; both are installed beside droce.
switch=$(dirname "$launcher")/../droce_switch/droce-switch
rank=$(dirname "$launcher")/droce-rank
[ -x "$switch" ] || fail "no droce-switch at $switch"
[ -x "$rank" ] || fail "no droce-rank at $rank"
sw=$("$switch" --help 2>&1 | grep -E -- '^(usage:| +--)' | grep -oE -- '--[a-z][a-z-]+' | sort -u)
[ "$(wc -w <<<"$sw")" -ge 8 ] || fail "droce-switch --help names only: $sw"
for f in $sw; do has droce-switch.1 "$f" "droce-switch's flag"; done
rk=$("$rank" 2>&1 | grep -oE -- '--[a-z][a-z-]+' | sort -u)
[ "$(wc -w <<<"$rk")" -ge 4 ] || fail "droce-rank's usage names only: $rk"
for f in $rk; do has droce-rank.1 "$f" "droce-rank's flag"; done

# droce's commands and ctl's objects, from their help.
cmds=$("$launcher" help 2>&1 | sed -nE 's/^  ([a-z][a-z-]+)( .*)?$/\1/p' | sort -u)
[ "$(wc -w <<<"$cmds")" -ge 6 ] || fail "droce help lists only: $cmds"
for c in $cmds; do
  grep -qE "^## $c\$" "$man_src/droce.1.md" || { echo "MISSING: droce.1 has no section for the command '$c'"; missing=$(( missing + 1 )); }
done
objs=$("$launcher" ctl help 2>&1 | sed -nE 's/^  ([a-z]+)( .*)?$/\1/p' | sort -u)
[ "$(wc -w <<<"$objs")" -ge 8 ] || fail "droce ctl help lists only: $objs"
for o in $objs; do has droce.1 "$o" "the ctl object"; done

# The configuration file's keys: its parser's tables and names.
keys=$( { sed -nE 's/^ *\{"([a-z_0-9]+)", Setting::.*/\1/p' "$root/src/daemon/config_file.cc"
          grep -oE 'name == "[a-z_0-9]+"' "$root/src/daemon/config_file.cc" | sed -E 's/.*"(.*)"/\1/'; } | sort -u)
[ "$(wc -w <<<"$keys")" -ge 20 ] || fail "found only $(wc -w <<<"$keys") keys in config_file.cc"
for k in $keys; do
  case $k in
    daemon | limits | engine | device) grep -qF -- "[$k]" "$man_src/droced.toml.5.md" || grep -qF -- "[[$k]]" "$man_src/droced.toml.5.md" ||
      { echo "MISSING: droced.toml.5 has no table [$k]"; missing=$(( missing + 1 )); } ;;
    *) has droced.toml.5 "$k" "the key" ;;
  esac
done

# The bash completion offers every command, exec flag and ctl object, and
# completes as bash-completion runs it.
comp=$root/tools/droce/droce.bash-completion
words=$(tr -s ' "()' '\n' <"$comp")
for w in $cmds $objs --daemon; do
  grep -qxF -- "$w" <<<"$words" || { echo "MISSING: the bash completion does not offer '$w'"; missing=$(( missing + 1 )); }
done
for f in $flags; do
  grep -qxF -- "--$f" <<<"$words" || { echo "MISSING: the bash completion does not offer '--$f'"; missing=$(( missing + 1 )); }
done
completed=no
if [ -f /usr/share/bash-completion/bash_completion ]; then
  # complete WORDS...: what _droce offers for the last word.
  complete_words() {
    bash -c 'source /usr/share/bash-completion/bash_completion; source "$1"; shift
      COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); COMP_LINE="$*"; COMP_POINT=${#COMP_LINE}
      _droce; echo "${COMPREPLY[*]}"' _ "$comp" "$@"
  }
  [ "$(complete_words droce ex)" = exec ] || { echo "MISSING: 'droce ex' does not complete to exec"; missing=$(( missing + 1 )); }
  [ "$(complete_words droce ctl res show q)" = "qp qpn" ] ||
    { echo "MISSING: 'droce ctl res show q' completes to '$(complete_words droce ctl res show q)'"; missing=$(( missing + 1 )); }
  completed=yes
fi

# The built pages render.
rendered=0
if [ -n "$built" ] && [ -f "$built/droce.1" ]; then
  if command -v man >/dev/null 2>&1; then
    for p in droce.1 droce.7 droce-rank.1 droce-switch.1 droced.8 droced.toml.5; do
      [ -f "$built/$p" ] || fail "$built/$p was not built"
      out=$(MANWIDTH=80 man --warnings -l "$built/$p" 2>&1 >/dev/null)
      [ -z "$out" ] || { echo "MISSING: man warns about $p: $out"; missing=$(( missing + 1 )); }
      rendered=$(( rendered + 1 ))
    done
  fi
fi

[ "$missing" -eq 0 ] || fail "$missing things the programs have are not in the man pages"
echo "PASS: the man pages name $(wc -w <<<"$vars") variables, $(wc -w <<<"$flags") setting flags," \
     "$(wc -w <<<"$own") droced flags, $(wc -w <<<"$sw") droce-switch and $(wc -w <<<"$rk") droce-rank flags, $(wc -w <<<"$cmds") commands, $(wc -w <<<"$objs") ctl objects," \
     "$(wc -w <<<"$keys") configuration keys; $rendered pages rendered by man; completion run: $completed"
