#!/usr/bin/env bash
# Soak test of the preload: real server and client processes, every one
# under sdprun, for N minutes, with every stream checked end to end.
#
#   scripts/soak.sh --minutes 10             the long run
#   scripts/soak.sh --minutes 0.5            a short run (CI)
#   scripts/soak.sh --minutes 1 --keep DIR   keep the logs, results and summary in DIR
#   scripts/soak.sh --minutes 1 -- --threads 4 --modes off,both   options of scripts/soak.py drive
#
# Builds the preload and the port mapper (release), starts a port mapper
# of its own on a free UDP port with its own control socket and state
# export directory, and runs scripts/soak.py: per Zcopy mode (SDP_ZCOPY
# off, read, write, both) a threaded blocking server, an epoll server, an
# accept-then-fork server, a client of blocking threads and a poll loop of
# nonblocking connections, and a client that forks children to run
# connections; every process under sdprun, with SIGALRM arriving every few
# milliseconds. Messages are 1 B to 16 MiB (log-uniform), one way or both
# ways at once; each receiver compares every byte with the stream its seed
# names and checks the sender's SHA-256. The open fds and RSS of every
# long-lived process are sampled; at the end the summary gives the
# connections (SDP or TCP and why, from the state export and the preload
# logs), the bytes checked, the bytes by Zcopy mechanism, the fd and RSS
# levels and growth, and every error. Exits 0 only if everything passed.
# docs/soak.md has the details, and the cases kept out.
#
# Everything it starts is stopped at the end, on error and on Ctrl-C.
# Without --keep the logs are removed after a run that passed and kept
# (the path is printed) after one that failed.
set -euo pipefail
cd "$(dirname "$0")/.."

minutes=
keep=
extra=()
usage() { sed -n '2,9p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
    case $1 in
        --minutes) minutes=${2:?}; shift 2 ;;
        --minutes=*) minutes=${1#*=}; shift ;;
        --keep) keep=${2:?}; shift 2 ;;
        --keep=*) keep=${1#*=}; shift ;;
        --) shift; extra=("$@"); break ;;
        -h|--help) usage ;;
        *) echo "soak: unknown argument $1" >&2; usage ;;
    esac
done
[ -n "$minutes" ] || usage
case $minutes in
    ''|*[!0-9.]*|*.*.*|.) echo "soak: --minutes takes a number, not \"$minutes\"" >&2; exit 2 ;;
esac

command -v python3 >/dev/null || { echo "soak: python3 is needed" >&2; exit 1; }
# The interpreter itself, not a version manager's shell shim (which would
# run a shell under the preload first).
py=$(python3 -c 'import sys; print(sys.executable)')

cargo build --release --quiet -p preload -p portmapper
bin=${CARGO_TARGET_DIR:-$PWD/target}/release
for f in sdprun libsdp_preload.so sdp-portmapper sdp-stat; do
    [ -e "$bin/$f" ] || { echo "soak: $bin/$f was not built" >&2; exit 1; }
done

if [ -n "$keep" ]; then
    mkdir -p "$keep"
    work=$(cd "$keep" && pwd)
    rm -rf "$work/logs" "$work/results" "$work/stat" "$work/pgids" "$work"/*.ready "$work/summary.txt"
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/sdp-soak.XXXXXX")
fi
mkdir -p "$work/logs"

pm=
driver=
status=1
cleanup() {
    trap - EXIT INT TERM
    if [ -n "$driver" ] && kill -0 "$driver" 2>/dev/null; then
        kill -TERM "$driver" 2>/dev/null || true
        for _ in $(seq 50); do kill -0 "$driver" 2>/dev/null || break; sleep 0.2; done
        kill -KILL "$driver" 2>/dev/null || true
    fi
    # Worker process groups the driver started, should it have been killed.
    if [ -f "$work/pgids" ]; then
        while read -r g; do kill -KILL -- "-$g" 2>/dev/null || true; done <"$work/pgids"
    fi
    if [ -n "$pm" ]; then
        kill "$pm" 2>/dev/null || true
        wait "$pm" 2>/dev/null || true
    fi
    if [ -z "$keep" ]; then
        if [ "$status" -eq 0 ]; then rm -rf "$work"; else echo "soak: logs kept in $work" >&2; fi
    fi
}
trap cleanup EXIT
trap 'echo "soak: SIGINT: stopping" >&2; status=130; exit 130' INT
trap 'echo "soak: SIGTERM: stopping" >&2; status=143; exit 143' TERM

# A port mapper of our own on a free UDP port.
"$bin/sdp-portmapper" --port 0 --control "$work/pm.sock" --stats-interval-ms 0 \
    --log-level info >"$work/logs/portmapper.log" 2>&1 &
pm=$!
for _ in $(seq 100); do
    grep -q "^ready " "$work/logs/portmapper.log" 2>/dev/null && break
    kill -0 "$pm" 2>/dev/null || break
    sleep 0.1
done
port=$(sed -n 's/^ready udp=[^,]*:\([0-9]*\)[, ].*/\1/p' "$work/logs/portmapper.log")
if [ -z "$port" ]; then
    echo "soak: the port mapper did not start:" >&2
    cat "$work/logs/portmapper.log" >&2
    exit 1
fi
export SDP_PM_PORT=$port SDP_PM_CONTROL=$work/pm.sock SDP_STAT_DIR=$work/stat
echo "soak: port mapper on UDP $port; $minutes min; work dir $work"

# The driver in the background so that the traps run at once on a signal.
set +e
nice -n 5 "$py" scripts/soak.py drive --minutes "$minutes" --work "$work" --bin "$bin" \
    --python "$py" "${extra[@]}" &
driver=$!
wait "$driver"
status=$?
set -e
driver=
exit "$status"
