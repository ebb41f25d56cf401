#!/usr/bin/env bash
# Runs every cargo-fuzz target for SECONDS each (default 60), or for N
# executions each, and prints the number of executions and the time of
# each. Installs cargo-fuzz when missing.
#
#   scripts/fuzz.sh [SECONDS] [TARGET...]
#   scripts/fuzz.sh --runs N [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --runs ]; then
    limit=(-runs="$2")
    what="$2 runs"
    shift 2
else
    limit=(-max_total_time="${1:-60}")
    what="${1:-60}s"
    shift || true
fi

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "== installing cargo-fuzz"
    cargo install cargo-fuzz --locked
fi

# libFuzzer's instrumentation needs unstable rustc flags: use a nightly
# toolchain when one is installed, otherwise let the stable compiler accept them.
if rustup run nightly rustc --version >/dev/null 2>&1; then
    fuzz=(cargo +nightly fuzz)
else
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
fi

targets=("$@")
[ ${#targets[@]} -gt 0 ] || mapfile -t targets < <(cd fuzz && "${fuzz[@]}" list)

echo "== fuzzing ${#targets[@]} targets, $what each"
"${fuzz[@]}" build -O --fuzz-dir fuzz
for t in "${targets[@]}"; do
    log=$(mktemp)
    start=$(date +%s)
    if ! "${fuzz[@]}" run -O --fuzz-dir fuzz "$t" -- "${limit[@]}" >"$log" 2>&1; then
        tail -n 60 "$log"
        echo "fuzz target $t FAILED"
        exit 1
    fi
    printf '%-20s %s in %ss\n' "$t" "$(grep -Eo 'Done [0-9]+ runs' "$log" | tail -n1)" "$(($(date +%s) - start))"
    rm -f "$log"
done
