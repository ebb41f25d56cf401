#!/usr/bin/env bash
# The main job on a fresh machine: iperf3 over SDP, side by side with plain
# TCP.
#
#   scripts/demo.sh              3-second runs
#   DEMO_SECONDS=10 scripts/demo.sh
#
# Installs iperf3 if it is missing, builds the workspace (release),
# starts a port mapper of its own, runs `iperf3 -s` and
# `iperf3 -c 127.0.0.1` both under `sdprun`, shows from `sdp-stat` which
# transport their connections use (SDP, or TCP and why), then runs plain
# iperf3 against a plain server, and prints both throughputs. Everything
# it starts is stopped at the end.
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_RUN=${DEMO_SECONDS:-3}
step() { printf '\n== %s\n' "$*"; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# What the demo runs, installed when missing (Debian/Ubuntu), as
# scripts/test.sh does.
if ! command -v iperf3 >/dev/null; then
    step "installing iperf3"
    echo "iperf3 iperf3/start_daemon boolean false" | as_root debconf-set-selections
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q iperf3
fi

step "cargo build --release"
cargo build --release --quiet
bin=$PWD/target/release
for f in sdprun libsdp_preload.so sdp-portmapper sdp-stat; do
    [ -e "$bin/$f" ] || { echo "demo: $bin/$f was not built" >&2; exit 1; }
done

work=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
    rm -rf "$work"
}
trap cleanup EXIT

# Waits (at most 10 s) until FILE contains TEXT.
wait_for() {
    local file=$1 text=$2
    for _ in $(seq 100); do
        grep -q -- "$text" "$file" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "demo: no \"$text\" in $file:" >&2
    cat "$file" >&2
    exit 1
}

free_port() {
    if command -v python3 >/dev/null; then
        python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
    else
        echo "$1"
    fi
}

# A port mapper of our own on a free UDP port, so that the demo leaves no
# daemon behind (sdprun would otherwise start one on UDP 3935 and keep it).
"$bin/sdp-portmapper" --port 0 --control "$work/pm.sock" --stats-interval-ms 0 \
    --log-level warn >"$work/pm.out" 2>&1 &
pids+=($!)
wait_for "$work/pm.out" "ready "
SDP_PM_PORT=$(sed -n 's/^ready udp=[^,]*:\([0-9]*\)[, ].*/\1/p' "$work/pm.out")
export SDP_PM_PORT SDP_PM_CONTROL=$work/pm.sock SDP_STAT_DIR=$work/stat

port=$(free_port 5201)
step "iperf3 over sdprun, port $port, $SECONDS_PER_RUN s"
"$bin/sdprun" iperf3 -s -p "$port" --forceflush >"$work/sdp-server.out" 2>&1 &
server=$!
pids+=("$server")
wait_for "$work/sdp-server.out" "Server listening"
"$bin/sdprun" iperf3 -c 127.0.0.1 -p "$port" -t "$SECONDS_PER_RUN" -f g \
    >"$work/sdp-client.out" 2>&1 &
client=$!
pids+=("$client")
# While the test runs: the client's connections to the server, once decided.
# Prints "TRANSPORT (why)" of the client's socket to the server port.
client_transport() {
    "$bin/sdp-stat" --json --pid "$client" 2>/dev/null | python3 -c '
import json, sys
port = sys.argv[1]
for proc in json.load(sys.stdin)["processes"]:
    for s in proc["sockets"]:
        if s["role"] == "client" and str(s["peer"]).endswith(":" + port) and s["transport"] != "-":
            print(s["transport"].upper(), "(" + s["why"] + ")")
            sys.exit(0)
sys.exit(1)' "$port"
}
transport=""
for _ in $(seq 100); do
    transport=$(client_transport) && break
    sleep 0.1
done
"$bin/sdp-stat" --pid "$client" --pid "$server" || true
wait "$client" || { cat "$work/sdp-client.out"; exit 1; }
kill "$server" 2>/dev/null || true

plain_port=$(free_port 5202)
step "plain iperf3, port $plain_port, $SECONDS_PER_RUN s"
iperf3 -s -p "$plain_port" --forceflush >"$work/plain-server.out" 2>&1 &
pids+=($!)
wait_for "$work/plain-server.out" "Server listening"
iperf3 -c 127.0.0.1 -p "$plain_port" -t "$SECONDS_PER_RUN" -f g >"$work/plain-client.out" 2>&1 ||
    { cat "$work/plain-client.out"; exit 1; }

# "[  5]   0.00-3.00   sec  7.00 GBytes  20.0 Gbits/sec                  receiver"
rate() { awk '/receiver$/ { print $(NF-2), $(NF-1) }' "$1" | tail -n 1; }

step "result"
printf '%-28s %s\n' "transport under sdprun:" "${transport:-not seen}"
printf '%-28s %s\n' "iperf3 under sdprun:" "$(rate "$work/sdp-client.out")"
printf '%-28s %s\n' "plain iperf3 (kernel TCP):" "$(rate "$work/plain-client.out")"
