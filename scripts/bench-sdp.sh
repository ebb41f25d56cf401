#!/usr/bin/env bash
# SdpStream against kernel TCP on loopback, in one run (DESIGN §7):
# throughput with 64 KiB writes and 64-byte ping-pong latency, with the
# ratios SDP/TCP (targets: throughput >= 0.95, latency <= 1.10).
#
#   scripts/bench-sdp.sh                      defaults: 2 GiB, 20000 round trips, 3 rounds
#   scripts/bench-sdp.sh --bytes N --iters N --rounds N
#   scripts/bench-sdp.sh --mechanisms [--bytes N] [--rounds N]
#       throughput by write size (4 KiB .. 16 MiB) over TCP, Bcopy, Read
#       Zcopy and Write Zcopy, with the ratios to TCP and the share of the
#       bytes each mechanism really carried (defaults: 256 MiB, 2 rounds)
#
# Each measurement alternates TCP and SDP and keeps the best round, so that
# other load on the machine hits both alike. The servers run as child
# processes (each with its own SDP progress thread), as real peers would.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p sdp-tools --bin sdp-bench
exec "${CARGO_TARGET_DIR:-target}/release/sdp-bench" "$@"
