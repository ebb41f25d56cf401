#!/usr/bin/env bash
# The benchmark suite: the same workloads over kernel TCP and over SDP
# through the preload, TCP and SDP alternating in one run,
# on loopback. Prints a table, writes JSON and draws PNG charts.
#
#   scripts/bench.sh                 the full run (about 8 minutes)
#   scripts/bench.sh --quick         a smoke run, well under 2 minutes (CI)
#   scripts/bench.sh --out DIR       outputs in DIR (default target/bench):
#                                    bench.json, bench.md (the table),
#                                    throughput.png, latency.png, ratio.png
#   scripts/bench.sh --reps N --seconds S   repetitions and run length
#   scripts/bench.sh --only sockperf,qperf-lat   some steps only (iperf3,
#                                    qperf-bw, sockperf, qperf-lat, redis,
#                                    nginx, setup, churn, memory, scale);
#                                    no charts
#   scripts/bench.sh --replot FILE   the table and charts of an earlier bench.json
#
# What it measures (details in README.md, "Benchmarks"):
#   * throughput by message size: iperf3 -l SIZE, plain against preloaded;
#     qperf tcp_bw (plain, kernel TCP) against sdp_bw (preloaded, SDP);
#   * CPU seconds per GB moved: user + system of both iperf3 processes;
#   * latency by message size: sockperf ping-pong p50/p99, plain against
#     preloaded; qperf tcp_lat (plain) against sdp_lat (preloaded);
#   * real servers: redis-benchmark SET and GET requests per second against
#     redis-server, 50 clients, one request at a time and 16 pipelined;
#     wrk against nginx, 10 keep-alive connections, 64 KiB and 1 MiB files,
#     and 64 KiB with sendfile on;
#   * connection setup rate (sdp-connbench): kernel TCP, SDP with a warm
#     port mapper cache, SDP with every connection asking the port mapper;
#   * churn: 100 clients at once, each connecting, one request, closing
#     (sdp-connbench rate --concurrency 100; wrk against nginx with
#     Connection: close);
#   * RSS per idle connection, client and server (sdp-connbench hold);
#   * scale: 10 000 connections at once between one client and one server
#     process, each used: time to open them, a byte over every one, RSS.
# Every SDP run is checked with sdp-stat: a row whose client connections
# were not SDP says "fell back to TCP" instead of counting as SDP. Each
# figure is the median of the repetitions, with the median SDP/TCP ratio
# of the pairs, and the DESIGN §7 targets marked met or missed. A run that
# fails is reported with its command and output, and the script exits 1.
#
# It starts its own port mappers and servers on free loopback ports and
# stops them at the end, on error and on Ctrl-C.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
for tool in iperf3 qperf sockperf gnuplot python3 redis-server redis-benchmark nginx wrk; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "bench: missing ${missing[*]} (Debian: apt-get install iperf3 qperf sockperf gnuplot-nox python3 redis-server nginx-light wrk)" >&2
    exit 1
fi

cargo build --release --quiet --workspace --lib --bins
bin=${CARGO_TARGET_DIR:-$PWD/target}/release
for f in sdprun libsdp_preload.so sdp-portmapper sdp-stat sdp-connbench; do
    [ -e "$bin/$f" ] || { echo "bench: $bin/$f was not built" >&2; exit 1; }
done

# Thousands of connections per process, with the SDP side's extra fds
# (sdp-connbench raises its own limit too).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

exec python3 scripts/bench.py --bin "$bin" --root "$PWD" "$@"
