#!/usr/bin/env bash
# The install test of the Debian package (run as root, on a machine where
# the package may be installed and removed; CI's is one):
#
#   1. builds the package (scripts/package.sh) and installs it (dpkg -i);
#   2. checks that sdprun is /usr/bin/sdprun on a system PATH and finds the
#      installed library, and that it starts /usr/bin/sdp-portmapper when
#      no port mapper answers;
#   3. starts `sdp-portmapper daemon` by hand on a free port and a private
#      control socket (no systemd here), runs `iperf3 -s -1` and
#      `iperf3 -c` both under sdprun from PATH, with no variable pointing
#      into the build tree, and checks with `sdp-stat --json`, sampled
#      while the transfer runs (a process's state goes when it exits), that
#      the connection went over SDP at both ends;
#   4. `systemd-analyze verify` on the unit (when systemd-analyze is
#      there), `man -w` of every page;
#   5. stops everything, `dpkg -r` (only the conffiles may stay), `dpkg -P`
#      (they go too), and checks that no process it started is left.
#
#   scripts/package-test.sh [--deb FILE]     (--deb: test this package)
#
# Every wait has a time limit; a failure prints what was seen. Leaves the
# package uninstalled, whatever happens. Needs iperf3, python3, man-db.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
started=$SECONDS
deb=""
while [ $# -gt 0 ]; do
    case $1 in
    --deb) deb=${2:?--deb needs a file}; shift 2 ;;
    *) echo "package-test: unknown argument $1" >&2; exit 2 ;;
    esac
done

step() { echo "== package-test: $*"; }
die() {
    echo "package-test: FAILED: $*" >&2
    exit 1
}

[ "$(id -u)" = 0 ] || die "run as root (dpkg -i)"
for tool in dpkg iperf3 python3 man; do
    command -v "$tool" >/dev/null || die "$tool is missing"
done

if [ -z "$deb" ]; then
    step "building the package"
    deb=$("$root/scripts/package.sh" | tail -n 1)
fi
[ -f "$deb" ] || die "no package at $deb"
pkg=$(dpkg-deb -f "$deb" Package)
if dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'installed\|config-files'; then
    die "$pkg is already on this machine: remove it first (dpkg -P $pkg)"
fi

work=$(mktemp -d /tmp/sdp-package-test.XXXXXX)
chmod 755 "$work"
pids=()
installed=0
cleanup() {
    local rc=$?
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${pids[@]}"; do
        for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
        kill -KILL "$p" 2>/dev/null || true
        wait "$p" 2>/dev/null || true
    done
    if [ "$installed" = 1 ]; then
        dpkg -P "$pkg" >/dev/null 2>&1 || echo "package-test: dpkg -P $pkg failed" >&2
    fi
    rm -rf "$work"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Waits (at most $3 s, default 10) until FILE contains TEXT.
wait_for() {
    local file=$1 text=$2 limit=${3:-10}
    local deadline=$((SECONDS + limit))
    while [ "$SECONDS" -lt "$deadline" ]; do
        grep -q -- "$text" "$file" 2>/dev/null && return 0
        sleep 0.1
    done
    echo "package-test: no \"$text\" in $file within $limit s; it holds:" >&2
    cat "$file" >&2 || true
    exit 1
}

# Waits (at most $2 s) for background process $1 to end; its exit status.
wait_pid() {
    local pid=$1 limit=$2
    local deadline=$((SECONDS + limit))
    while kill -0 "$pid" 2>/dev/null; do
        [ "$SECONDS" -lt "$deadline" ] || { echo "package-test: process $pid still runs after $limit s" >&2; return 124; }
        sleep 0.1
    done
    local rc=0
    wait "$pid" || rc=$?
    return "$rc"
}

free_port() {
    python3 -c 'import socket, sys
s = socket.socket(socket.AF_INET, getattr(socket, sys.argv[1]))
s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' "$1"
}

step "installing $deb"
dpkg-deb -c "$deb" | awk '{print $NF}' | sed 's|^\./|/|' >"$work/contents"
dpkg-deb -I "$deb" conffiles >"$work/conffiles" 2>/dev/null || : >"$work/conffiles"
installed=1
dpkg -i "$deb" >"$work/dpkg-i.out" 2>&1 || { cat "$work/dpkg-i.out" >&2; die "dpkg -i"; }

# From here on: the system's PATH, and no variable of the build tree.
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
unset SDP_PRELOAD_LIB LD_PRELOAD SDP_CONFIG LIBSDP_CONFIG_FILE SDP_NO_PORTMAPPER \
    SDP_PM_PORT SDP_PM_CONTROL SDP_STAT_DIR SDP_LOG SDP_LOG_FILE CARGO_TARGET_DIR
export SDP_STAT_DIR=$work/stat

step "sdprun from PATH"
where=$(command -v sdprun || true)
[ "$where" = /usr/bin/sdprun ] || die "command -v sdprun is '$where', not /usr/bin/sdprun"
lib=$(dpkg -L "$pkg" | grep '/libsdp_preload\.so$' || true)
[ -n "$lib" ] || die "the package has no libsdp_preload.so"
seen=$(SDP_NO_PORTMAPPER=1 timeout 20 sdprun /bin/sh -c 'printf %s "$LD_PRELOAD"') ||
    die "sdprun /bin/sh failed: $seen"
[ "$seen" = "$lib" ] || die "sdprun preloads '$seen', not $lib"
echo "sdprun preloads $seen"

step "sdprun starts /usr/bin/sdp-portmapper when none answers"
auto_port=$(free_port SOCK_DGRAM)
SDP_PM_PORT=$auto_port SDP_PM_CONTROL=$work/auto.sock timeout 30 sdprun /bin/true ||
    die "sdprun /bin/true failed"
# sdprun started it in its own process group, so it is not our child: find
# it by its command line (our free port), then end it by its pid.
auto_pid=$(ps -eo pid=,args= | awk -v want="/usr/bin/sdp-portmapper --port $auto_port" \
    '{pid = $1; $1 = ""; sub(/^ /, ""); if ($0 == want) print pid}')
if [ -z "$auto_pid" ]; then
    ps -eo pid,args | grep '[s]dp-portmapper' >&2 || true
    die "no /usr/bin/sdp-portmapper --port $auto_port runs after sdprun"
fi
echo "sdprun started /usr/bin/sdp-portmapper (pid $auto_pid) on UDP $auto_port"
kill "$auto_pid"
for _ in $(seq 50); do kill -0 "$auto_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$auto_pid" 2>/dev/null && { kill -KILL "$auto_pid"; die "sdp-portmapper $auto_pid ignored SIGTERM"; }

step "port mapper by hand"
sdp-portmapper daemon --port 0 --control "$work/pm.sock" --stats-interval-ms 0 \
    --log-level warn >"$work/pm.out" 2>"$work/pm.err" &
pm=$!
pids+=("$pm")
wait_for "$work/pm.out" "^ready "
SDP_PM_PORT=$(sed -n 's/^ready udp=[^,]*:\([0-9]*\)[, ].*/\1/p' "$work/pm.out")
[ -n "$SDP_PM_PORT" ] || die "no port on the ready line: $(cat "$work/pm.out")"
export SDP_PM_PORT SDP_PM_CONTROL=$work/pm.sock
cat "$work/pm.out"

step "iperf3 under sdprun"
port=$(free_port SOCK_STREAM)
seconds=3
sdprun iperf3 -s -1 -p "$port" --forceflush >"$work/server.out" 2>&1 &
server=$!
pids+=("$server")
wait_for "$work/server.out" "Server listening"
sdprun iperf3 -c 127.0.0.1 -p "$port" -t "$seconds" >"$work/client.out" 2>&1 &
client=$!
pids+=("$client")

# "PID FD ROLE TRANSPORT why" of each decided socket of the client and the
# server on the iperf3 port, sampled until the client ends (iperf3 makes
# a control connection, then the data connection): every one seen.
sample() {
    sdp-stat --json --pid "$client" --pid "$server" 2>"$work/stat.err" | python3 -c '
import json, sys
port = sys.argv[1]
doc = json.load(sys.stdin)
for proc in (doc["processes"] if isinstance(doc, dict) else doc):
    for s in proc["sockets"]:
        ends = (str(s.get("peer")), str(s.get("local")))
        if s["role"] in ("client", "accepted") and any(e.endswith(":" + port) for e in ends) \
                and s["transport"] not in ("-", "undecided"):
            print(proc["pid"], s["fd"], s["role"], s["transport"], s["why"])' "$port"
}
: >"$work/seen"
deadline=$((SECONDS + seconds + 15))
while kill -0 "$client" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
    sample >>"$work/seen" || true
    # The last table that showed iperf3, to print at the end.
    if sdp-stat --pid "$client" --pid "$server" >"$work/stat.now" 2>&1 && grep -q iperf3 "$work/stat.now"; then
        mv "$work/stat.now" "$work/stat.table"
    fi
    sleep 0.2
done
touch "$work/stat.table"
client_rc=0
wait_pid "$client" $((seconds + 30)) || client_rc=$?
server_rc=0
wait_pid "$server" 30 || server_rc=$?
sort -u -o "$work/seen" "$work/seen"
show() {
    echo "--- sdp-stat during the test:"; cat "$work/stat.table"
    echo "--- sockets seen (pid fd role transport why):"; cat "$work/seen"
    echo "--- iperf3 client:"; tail -n 8 "$work/client.out"
    echo "--- iperf3 server:"; tail -n 4 "$work/server.out"
    echo "--- port mapper:"; cat "$work/pm.err"
}
show
[ "$client_rc" = 0 ] || die "iperf3 -c exited with $client_rc"
[ "$server_rc" = 0 ] || die "iperf3 -s -1 exited with $server_rc"
grep -q "receiver" "$work/client.out" || die "iperf3 printed no receiver line"
clients=$(awk '$3 == "client"' "$work/seen" | wc -l)
accepted=$(awk '$3 == "accepted"' "$work/seen" | wc -l)
[ "$clients" -ge 2 ] || die "sdp-stat showed $clients of the client's 2 connections"
[ "$accepted" -ge 2 ] || die "sdp-stat showed $accepted of the server's 2 connections"
if awk '$4 != "sdp"' "$work/seen" | grep -q .; then
    die "a connection did not go over SDP"
fi
echo "every iperf3 connection went over SDP"

if command -v systemd-analyze >/dev/null; then
    step "systemd-analyze verify"
    timeout 60 systemd-analyze verify /lib/systemd/system/sdp-portmapper.service >"$work/verify.out" 2>&1 ||
        { cat "$work/verify.out" >&2; die "systemd-analyze verify"; }
    cat "$work/verify.out"
else
    step "systemd-analyze is not here: the unit is not verified"
fi

step "man -w"
for page in sdprun libsdp.conf libsdp_preload sdp-stat sdp-portmapper; do
    timeout 20 man -w "$page" || die "man -w $page"
done

step "stopping"
kill "$pm"
wait_pid "$pm" 10 || true
for p in "${pids[@]}"; do
    kill -0 "$p" 2>/dev/null && die "process $p is still running: $(ps -o args= -p "$p")"
done
pids=()

step "dpkg -r"
dpkg -r "$pkg" >"$work/dpkg-r.out" 2>&1 || { cat "$work/dpkg-r.out" >&2; die "dpkg -r"; }
left=()
while read -r path; do
    [ -n "$path" ] && [ "${path%/}" = "$path" ] || continue   # directories
    if grep -qxF -- "$path" "$work/conffiles"; then
        [ -e "$path" ] || die "conffile $path went with dpkg -r"
    elif [ -e "$path" ] || [ -L "$path" ]; then
        left+=("$path")
    fi
done <"$work/contents"
[ ${#left[@]} = 0 ] || die "left after dpkg -r: ${left[*]}"
echo "only the conffiles stay: $(tr '\n' ' ' <"$work/conffiles")"

step "dpkg -P"
dpkg -P "$pkg" >"$work/dpkg-p.out" 2>&1 || { cat "$work/dpkg-p.out" >&2; die "dpkg -P"; }
installed=0
while read -r path; do
    [ -z "$path" ] || [ ! -e "$path" ] || die "conffile $path is left after dpkg -P"
done <"$work/conffiles"
if dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'installed\|config-files'; then
    die "dpkg still knows $pkg: $(dpkg-query -W -f '${Status}' "$pkg")"
fi
stray=$(ps -eo pid=,args= | grep -F -e "$work" -e "--port $auto_port" | grep -v grep || true)
[ -z "$stray" ] || die "processes left: $stray"

step "ok ($((SECONDS - started)) s)"
