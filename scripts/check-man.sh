#!/usr/bin/env bash
# Checks the manual pages against the programs: builds the pages
# (scripts/man.py) into a temporary directory, renders each with `man -l`
# (any groff warning is a failure), and checks that every `--option` the
# --help of sdprun, sdp-stat and sdp-portmapper prints appears in that
# program's rendered page. Exits non-zero naming what is missing.
#
#   scripts/check-man.sh [--bin DIR] [--pages DIR]
#
# --bin DIR    the built programs (default: target/release, built here
#              with `cargo build --release` first)
# --pages DIR  check these pages instead of generating them (to see the
#              check fail on a page edited by hand)
#
# Needs python3, man-db and groff-base.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
bin=""
pages=""
while [ $# -gt 0 ]; do
    case $1 in
    --bin) bin=${2:?--bin needs a directory}; shift 2 ;;
    --pages) pages=${2:?--pages needs a directory}; shift 2 ;;
    -h | --help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "check-man: unknown argument $1" >&2; exit 2 ;;
    esac
done

for tool in man groff python3; do
    command -v "$tool" >/dev/null || { echo "check-man: $tool is missing (apt-get install man-db groff-base python3)" >&2; exit 2; }
done

if [ -z "$bin" ]; then
    (cd "$root" && cargo build --release -p preload -p portmapper --bins >&2)
    bin=$root/target/release
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -z "$pages" ]; then
    pages=$work/pages
    python3 "$root/scripts/man.py" --bin "$bin" "$pages" >/dev/null
fi

failures=0
fail() {
    echo "check-man: $*" >&2
    failures=$((failures + 1))
}

# Every page renders, without a warning.
for page in "$pages"/*.[0-9]*; do
    [ -f "$page" ] || continue
    name=$(basename "$page")
    if ! MANWIDTH=1000 man -l --warnings -E UTF-8 "$page" >"$work/$name.txt" 2>"$work/$name.err"; then
        fail "$name: man -l failed: $(cat "$work/$name.err")"
    elif [ -s "$work/$name.err" ]; then
        fail "$name: warnings: $(cat "$work/$name.err")"
    fi
done

# Every option of --help in the program's page. The page is rendered one
# paragraph a line (MANWIDTH=1000, no hyphenation in the pages), so that an
# option is never split.
for pair in sdprun:1 sdp-stat:8 sdp-portmapper:8; do
    program=${pair%%:*}
    page=$program.${pair#*:}
    rendered=$work/$page.txt
    if [ ! -s "$rendered" ]; then
        fail "$page: no page (or it rendered empty) in $pages"
        continue
    fi
    if ! help=$("$bin/$program" --help 2>&1); then
        fail "$program --help failed: $help"
        continue
    fi
    options=$(grep -oE -- '(^|[^A-Za-z0-9-])--[A-Za-z0-9][A-Za-z0-9-]*' <<<"$help" | grep -oE -- '--[A-Za-z0-9-]+' | sort -u)
    if [ -z "$options" ]; then
        fail "$program --help names no --option: is it the right program?"
        continue
    fi
    missing=()
    for option in $options; do
        grep -qE -- "(^|[^A-Za-z0-9-])${option}([^A-Za-z0-9-]|\$)" "$rendered" || missing+=("$option")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        fail "$page lacks ${missing[*]} (named by $program --help)"
    else
        echo "check-man: $page: all $(wc -w <<<"$options") options of $program --help are there"
    fi
done

if [ "$failures" -gt 0 ]; then
    echo "check-man: $failures problem(s)" >&2
    exit 1
fi
echo "check-man: ok"
