#!/usr/bin/env bash
# The preload library under valgrind memcheck, with real programs over SDP
# (both ends preloaded, both under valgrind):
#
#   * iperf3, server and client, 2 seconds;
#   * curl fetching 4 MiB from a Python HTTP server;
#   * a Python echo server and client moving 4 MiB in blocks of 1 B-64 KiB.
#
# A memcheck error whose stack passes through libsdp_preload.so fails the
# run; errors in the programs' own frames (iperf3 has some) are listed, not
# counted. Each run must also have gone over SDP (the preload's log).
#
#   scripts/memcheck.sh            # logs in target/memcheck
set -euo pipefail
cd "$(dirname "$0")/.."

step() { printf '\n== %s\n' "$*"; }
as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}
need=()
for p in valgrind iperf3 curl python3; do
    command -v "$p" >/dev/null || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    step "installing ${need[*]}"
    echo "iperf3 iperf3/start_daemon boolean false" | as_root debconf-set-selections
    as_root apt-get update -q
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}"
fi

step "cargo build --release (preload, port mapper)"
cargo build --release --quiet -p preload -p portmapper
bin=$PWD/target/release
out=$PWD/target/memcheck
rm -rf "$out"
mkdir -p "$out/stat"
# The distribution's interpreter: it is clean under memcheck (a
# self-built one may not be), and it is a real binary, not a version
# manager's shell shim.
python=/usr/bin/python3
[ -x /usr/bin/python3.11 ] && python=/usr/bin/python3.11

pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

free_port() { "$python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

pm_port=$("$python" -c 'import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$bin/sdp-portmapper" --port "$pm_port" --control "$out/pm.sock" --log-level warn >"$out/pm.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [ -S "$out/pm.sock" ] && break; sleep 0.1; done

export SDP_PM_PORT=$pm_port SDP_PM_CONTROL=$out/pm.sock SDP_STAT_DIR=$out/stat
export SDP_LOG=info SDP_LOG_FILE=$out/sdp.log
# Python's own allocator hides heap errors from memcheck.
export PYTHONMALLOC=malloc

# Runs a command under memcheck with the preload; its valgrind log is
# $out/NAME.vg.
vg() {
    local name=$1
    shift
    LD_PRELOAD=$bin/libsdp_preload.so valgrind --tool=memcheck --error-exitcode=0 \
        --num-callers=40 --log-file="$out/$name.vg" "$@"
}

# Waits (at most 60 s: valgrind is slow to start) until FILE contains TEXT.
wait_for() {
    for _ in $(seq 600); do
        grep -q -- "$2" "$1" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "memcheck: no \"$2\" in $1" >&2
    cat "$1" >&2
    exit 1
}

step "iperf3, 2 s"
port=$(free_port)
vg iperf3-server iperf3 -s -1 --forceflush -p "$port" >"$out/iperf3-server.out" 2>&1 &
pids+=($!)
wait_for "$out/iperf3-server.out" "Server listening"
vg iperf3-client iperf3 -c 127.0.0.1 -p "$port" -t 2 >"$out/iperf3-client.out" 2>&1
wait "${pids[-1]}"
grep -E "sender|receiver" "$out/iperf3-client.out"

step "curl, 4 MiB from a Python HTTP server"
mkdir -p "$out/www"
head -c $((4 << 20)) /dev/urandom >"$out/www/blob"
port=$(free_port)
# One request, then it exits (so that valgrind writes its summary).
vg http-server "$python" -u -c '
import functools, http.server, sys
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[2])
server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), handler)
print("Serving HTTP", flush=True)
server.handle_request()
server.server_close()
' "$port" "$out/www" >"$out/http-server.out" 2>&1 &
pids+=($!)
wait_for "$out/http-server.out" "Serving HTTP"
vg curl curl -sS -o "$out/blob.got" "http://127.0.0.1:$port/blob"
cmp "$out/www/blob" "$out/blob.got"
echo "4 MiB fetched, identical"
wait "${pids[-1]}"

step "Python echo server and client, 4 MiB"
port=$(free_port)
vg echo-server "$python" -u -c '
import socket, sys, threading
srv = socket.socket()
srv.bind(("127.0.0.1", int(sys.argv[1])))
srv.listen(8)
print("listening", flush=True)
c, _ = srv.accept()
while True:
    d = c.recv(1 << 16)
    if not d:
        break
    c.sendall(d)
c.close()
' "$port" >"$out/echo-server.out" 2>&1 &
pids+=($!)
wait_for "$out/echo-server.out" "listening"
vg echo-client "$python" -u -c '
import hashlib, random, socket, sys, threading
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
rng = random.Random(7)
total = 4 << 20
sent = hashlib.sha256()
def send():
    left = total
    while left:
        n = min(left, int(2 ** rng.uniform(0, 16)))
        block = rng.randbytes(n)
        sent.update(block)
        c.sendall(block)
        left -= n
    c.shutdown(socket.SHUT_WR)
t = threading.Thread(target=send)
t.start()
got = hashlib.sha256()
n = 0
while True:
    d = c.recv(1 << 16)
    if not d:
        break
    got.update(d)
    n += len(d)
t.join()
print("echoed", n, "bytes, hashes equal:", got.digest() == sent.digest())
' "$port" >"$out/echo-client.out" 2>&1
wait "${pids[-1]}"
cat "$out/echo-client.out"
grep -q "echoed $((4 << 20)) bytes, hashes equal: True" "$out/echo-client.out"

step "results"
sdp=$(grep -c -- "-> SDP" "$out/sdp.log" || true)
echo "connections over SDP (preload log): $sdp"
[ "$sdp" -ge 4 ] || { echo "memcheck: expected at least 4 SDP connections" >&2; exit 1; }
fail=0
for log in "$out"/*.vg; do
    name=$(basename "$log" .vg)
    total=$(grep -Eo "ERROR SUMMARY: [0-9]+" "$log" | grep -Eo "[0-9]+$" || echo "?")
    # Each error is a block of stack lines ending at an empty "==PID==" line.
    ours=$(awk '/^==[0-9]+== [A-Z]/ { inblock = 1; hit = 0 }
                inblock && /libsdp_preload/ { hit = 1 }
                /^==[0-9]+== *$/ { if (inblock && hit) n++; inblock = 0 }
                END { print n + 0 }' "$log")
    printf '%-14s memcheck errors: %s, in the library'"'"'s frames: %s\n' "$name" "$total" "$ours"
    [ "$ours" -eq 0 ] || fail=1
done
if [ "$fail" -ne 0 ]; then
    echo "memcheck: errors in libsdp_preload.so frames (logs in $out)" >&2
    exit 1
fi
echo "no memcheck error in the library's frames (logs in $out)"
