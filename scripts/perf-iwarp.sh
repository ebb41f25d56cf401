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
# three alike. The table gives, over the rounds, the median (and best)
# throughput in Gbit/s with the ratios iwarp/TCP, and the median CPU time
# both ends spent per GiB moved (client and server, user and system),
# which other load on the machine disturbs less than throughput.
#
# iwarp-perf runs with --verify stamps by default: iperf3 never looks at
# the data it moves, so neither should the compared run touch every octet
# (stamps still catch lost, stale and misplaced pages; the CRC covers every
# octet on the wire). Its default depth keeps about 2 MiB of buffers per
# side and at least two messages in flight.
set -euo pipefail
cd "$(dirname "$0")/.."

SIZES=${SIZES:-"65536 262144 1048576"}
ROUNDS=${ROUNDS:-5}
BYTES=${BYTES:-$((2 << 30))}
VERIFY=${VERIFY:-stamps}
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

cargo build --release -q -p sdp-tools --bin iwarp-perf
PERF=target/release/iwarp-perf

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
}
trap cleanup EXIT
iperf3 -s -p "$TCP_PORT" >/dev/null 2>&1 &
tcp_server=$!
pids+=($tcp_server)
"$PERF" server --port "$IWARP_PORT" --bind 127.0.0.1 >target/perf-iwarp-server.log 2>&1 &
iwarp_server=$!
pids+=($iwarp_server)
# Wait until both servers listen.
for port in "$TCP_PORT" "$IWARP_PORT"; do
    for _ in $(seq 200); do
        [ -n "$(ss -Hltn "sport = :$port")" ] && break
        sleep 0.05
    done
done

TCK=$(getconf CLK_TCK)
tmp=$(mktemp -d)
trap 'cleanup; rm -rf "$tmp"' EXIT
# CPU seconds (user + system) a process has used.
cpu_of() { awk -v t="$TCK" '{ print ($14 + $15) / t }' "/proc/$1/stat"; }
# Runs a client against the server with pid $1: its output goes to
# $tmp/out; CPU is set to the CPU seconds per GiB of client and server.
run_client() {
    local server=$1 s0 s1
    shift
    s0=$(cpu_of "$server")
    local TIMEFORMAT='%U %S'
    if ! { time "$@" >"$tmp/out" 2>"$tmp/err"; } 2>"$tmp/time"; then
        cat "$tmp/out" "$tmp/err" >&2
        echo "failed: $*" >&2
        exit 1
    fi
    s1=$(cpu_of "$server")
    CPU=$(awk -v a="$s0" -v b="$s1" -v g="$BYTES" '{ printf "%.3f", ($1 + $2 + b - a) / (g / 2^30) }' "$tmp/time")
}

tcp_run() {
    run_client "$tcp_server" iperf3 -c 127.0.0.1 -p "$TCP_PORT" -n "$BYTES" -l "$1" -f g
    GBPS=$(awk '/receiver/ { for (i = 1; i < NF; i++) if ($(i+1) == "Gbits/sec") print $i }' "$tmp/out")
}

# Fails the script on any data mismatch (iwarp-perf exits non-zero).
iwarp_run() {
    run_client "$iwarp_server" "$PERF" client "127.0.0.1:$IWARP_PORT" --op "$1" \
        --size "$2" --iters $((BYTES / $2)) --verify "$VERIFY"
    GBPS=$(awk 'NR == 3 { print $3 }' "$tmp/out")
}

declare -A gbps cpu
for round in $(seq "$ROUNDS"); do
    for size in $SIZES; do
        tcp_run "$size"
        gbps[tcp,$size]+="$GBPS "
        cpu[tcp,$size]+="$CPU "
        for op in write send; do
            iwarp_run "$op" "$size"
            gbps[$op,$size]+="$GBPS "
            cpu[$op,$size]+="$CPU "
        done
    done
    echo "round $round of $ROUNDS done" >&2
done

median() { tr ' ' '\n' | grep . | sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
best() { tr ' ' '\n' | grep . | sort -g | tail -1; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", (b > 0) ? a / b : 0 }'; }

echo
echo "loopback, $((BYTES >> 20)) MiB per run, $ROUNDS rounds; iwarp: CRC on, markers off, --verify $VERIFY"
echo "Gbit/s: median (best) over the rounds; cpu: median CPU seconds per GiB, both ends"
printf '%8s | %15s %5s | %15s %5s %5s %5s | %15s %5s %5s %5s\n' \
    size "TCP Gbit/s" cpu "Write Gbit/s" cpu W/TCP cpu/ "Send Gbit/s" cpu S/TCP cpu/
for size in $SIZES; do
    row=()
    for k in tcp write send; do
        g=$(echo "${gbps[$k,$size]}" | median)
        b=$(echo "${gbps[$k,$size]}" | best)
        c=$(echo "${cpu[$k,$size]}" | median)
        row+=("$(printf '%6.2f (%6.2f) %5.2f' "$g" "$b" "$c")")
        eval "g_$k=$g c_$k=$c"
    done
    printf '%8s | %s | %s %5s %5s | %s %5s %5s\n' "$size" "${row[0]}" \
        "${row[1]}" "$(ratio "$g_write" "$g_tcp")" "$(ratio "$c_tcp" "$c_write")" \
        "${row[2]}" "$(ratio "$g_send" "$g_tcp")" "$(ratio "$c_tcp" "$c_send")"
done
echo "W/TCP, S/TCP: throughput ratio iwarp/TCP (median); cpu/: TCP's CPU per GiB over iwarp's (1 = as cheap as TCP)"
