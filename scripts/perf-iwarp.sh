#!/usr/bin/env bash
# Acceptance 7: throughput of iWARP (iwarp-perf, RDMA Write and Send, CRC
# on) against kernel TCP (iperf3), side by side on loopback in one run.
#
#   scripts/perf-iwarp.sh                       sizes 64K 256K 1M, 5 rounds
#   SIZES="65536 1048576" ROUNDS=3 scripts/perf-iwarp.sh
#   VERIFY=full scripts/perf-iwarp.sh          check every octet (slower)
#
# Each round runs TCP, Write and Send for every size, interleaved, moving
# BYTES (default 2 GiB) each, so that load from other processes hits all
# three alike. The table gives the median over the rounds (and the best)
# in Gbit/s and the ratios iwarp/TCP.
#
# iwarp-perf runs with --verify stamps by default: iperf3 never looks at
# the data it moves, so neither should the compared run touch every octet
# (stamps still catch lost, stale and misplaced pages; the CRC covers every
# octet on the wire). --depth 4 keeps four messages in flight.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES=${SIZES:-"65536 262144 1048576"}
ROUNDS=${ROUNDS:-5}
BYTES=${BYTES:-$((2 << 30))}
VERIFY=${VERIFY:-stamps}
DEPTH=${DEPTH:-4}
TCP_PORT=${TCP_PORT:-18516}
IWARP_PORT=${IWARP_PORT:-18517}

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}
if ! command -v iperf3 >/dev/null; then
    echo "iperf3 iperf3/start_daemon boolean false" | as_root debconf-set-selections
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q iperf3
fi

cargo build --release -q -p iwarp --bin iwarp-perf
PERF=target/release/iwarp-perf

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
iperf3 -s -p "$TCP_PORT" >/dev/null 2>&1 &
pids+=($!)
"$PERF" server --port "$IWARP_PORT" --bind 127.0.0.1 >target/perf-iwarp-server.log 2>&1 &
pids+=($!)
# Wait until both servers listen.
for port in "$TCP_PORT" "$IWARP_PORT"; do
    for _ in $(seq 200); do
        [ -n "$(ss -Hltn "sport = :$port")" ] && break
        sleep 0.05
    done
done

# iperf3's receiver line, in Gbit/s.
tcp_gbps() {
    iperf3 -c 127.0.0.1 -p "$TCP_PORT" -n "$BYTES" -l "$1" -f g |
        awk '/receiver/ { for (i = 1; i < NF; i++) if ($(i+1) == "Gbits/sec") print $i }'
}

# iwarp-perf's Gbit/s column; fails the script on any data mismatch.
iwarp_gbps() {
    local op=$1 size=$2 out
    out=$("$PERF" client "127.0.0.1:$IWARP_PORT" --op "$op" --size "$size" \
        --iters $((BYTES / size)) --depth "$DEPTH" --verify "$VERIFY") || {
        echo "$out" >&2
        echo "iwarp-perf $op $size failed" >&2
        exit 1
    }
    echo "$out" | awk 'NR == 3 { print $3 }'
}

declare -A results
for round in $(seq "$ROUNDS"); do
    for size in $SIZES; do
        results[tcp,$size]+="$(tcp_gbps "$size") "
        results[write,$size]+="$(iwarp_gbps write "$size") "
        results[send,$size]+="$(iwarp_gbps send "$size") "
    done
    echo "round $round of $ROUNDS done" >&2
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
best() { tr ' ' '\n' | grep . | sort -g | tail -1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }'; }

echo
echo "loopback, $((BYTES >> 20)) MiB per run, $ROUNDS rounds; iwarp: CRC on, markers off, --depth $DEPTH --verify $VERIFY"
echo "Gbit/s: median (best)"
printf '%10s  %17s  %17s  %7s  %17s  %7s\n' size "TCP (iperf3)" "iWARP Write" "W/TCP" "iWARP Send" "S/TCP"
for size in $SIZES; do
    t=$(echo "${results[tcp,$size]}" | median)
    w=$(echo "${results[write,$size]}" | median)
    s=$(echo "${results[send,$size]}" | median)
    tb=$(echo "${results[tcp,$size]}" | best)
    wb=$(echo "${results[write,$size]}" | best)
    sb=$(echo "${results[send,$size]}" | best)
    printf '%10s  %8.2f (%6.2f)  %8.2f (%6.2f)  %7s  %8.2f (%6.2f)  %7s\n' \
        "$size" "$t" "$tb" "$w" "$wb" "$(ratio "$w" "$t")" "$s" "$sb" "$(ratio "$s" "$t")"
done
