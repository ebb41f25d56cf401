#!/usr/bin/env bash
# Runs every check of the project on a fresh machine: installs what is
# missing, then format, lints, unit/integration/doc tests, end-to-end tests
# (each under a time limit, by cargo-nextest), CPython's socket test
# suites plain and under the preload, a short fuzz run of every parser,
# and the benchmark suite's smoke run
# (scripts/bench.sh --quick: every workload once, no thresholds).
#
#   scripts/test.sh            everything
#   FUZZ_SECONDS=60 scripts/test.sh    longer fuzz run per target (default 10)
#   SKIP_FUZZ=1 scripts/test.sh        everything but the fuzz run
#   SKIP_BENCH=1 scripts/test.sh       everything but the benchmark smoke run
set -euo pipefail
cd "$(dirname "$0")/.."

FUZZ_SECONDS=${FUZZ_SECONDS:-10}
step() { printf '\n== %s\n' "$*"; }

as_root() {
    if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

# Debian packages the tests drive. tshark checks our wire format; the
# preload tests run iperf3, curl, wget, python3 and a C program (built
# with cc, its imports checked with nm) under the library; the end-to-end
# suite (tests/tests/e2e_*.rs) adds redis, qperf, sockperf and socat;
# scripts/bench.sh also runs nginx under wrk and draws its charts with
# gnuplot.
need_pkgs=()
command -v tshark >/dev/null || need_pkgs+=(tshark)
command -v iperf3 >/dev/null || need_pkgs+=(iperf3)
command -v redis-server >/dev/null || need_pkgs+=(redis-server)
{ command -v redis-cli && command -v redis-benchmark; } >/dev/null || need_pkgs+=(redis-tools)
command -v qperf >/dev/null || need_pkgs+=(qperf)
command -v sockperf >/dev/null || need_pkgs+=(sockperf)
command -v socat >/dev/null || need_pkgs+=(socat)
command -v nginx >/dev/null || need_pkgs+=(nginx-light)
command -v wrk >/dev/null || need_pkgs+=(wrk)
command -v curl >/dev/null || need_pkgs+=(curl)
command -v wget >/dev/null || need_pkgs+=(wget)
command -v python3 >/dev/null || need_pkgs+=(python3)
command -v cc >/dev/null || need_pkgs+=(gcc)
command -v nm >/dev/null || need_pkgs+=(binutils)
# The manual pages are rendered by man (man-db, groff); the systemd unit
# is checked by systemd-analyze (package systemd; nothing is started).
command -v man >/dev/null || need_pkgs+=(man-db)
command -v groff >/dev/null || need_pkgs+=(groff-base)
command -v systemd-analyze >/dev/null || need_pkgs+=(systemd)
# gnuplot's recommends (ImageMagick, Ghostscript, groff) are not needed
# for PNG charts; it gets a font instead.
bare_pkgs=()
command -v gnuplot >/dev/null || bare_pkgs+=(gnuplot-nox fonts-liberation)
if [ $((${#need_pkgs[@]} + ${#bare_pkgs[@]})) -gt 0 ]; then
    step "installing ${need_pkgs[*]} ${bare_pkgs[*]}"
    # Do not ask whether non-root users may capture.
    echo "wireshark-common wireshark-common/install-setuid boolean false" | as_root debconf-set-selections
    echo "iperf3 iperf3/start_daemon boolean false" | as_root debconf-set-selections
    as_root apt-get update -q
fi
if [ ${#need_pkgs[@]} -gt 0 ]; then
    # A package's service (nginx's) is not started here: the benchmark
    # runs its own on a free port.
    policy=/usr/sbin/policy-rc.d
    made_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | as_root tee "$policy" >/dev/null
        as_root chmod +x "$policy"
        made_policy=1
    fi
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_pkgs[@]}"
    if [ "$made_policy" = 1 ]; then as_root rm -f "$policy"; fi
fi
if [ ${#bare_pkgs[@]} -gt 0 ]; then
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${bare_pkgs[@]}"
fi

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy"
cargo clippy --workspace --all-targets -- -D warnings

# Every test runs under a time limit (.config/nextest.toml): a hang fails
# within two minutes with its state printed, instead of running until CI
# gives up.
if ! cargo nextest --version >/dev/null 2>&1; then
    step "installing cargo-nextest"
    cargo install --locked cargo-nextest
fi

# The programs the end-to-end tests run, built here with the very commands
# the tests use (tests/src/preload.rs, tests/src/bins.rs,
# tests/tests/sdp_sdpcat.rs), so that no test spends its time limit
# compiling.
step "cargo build (the programs the end-to-end tests run)"
cargo nextest run --workspace --profile ci --no-run
cargo build --quiet -p preload --lib --bins -p portmapper --bin sdp-portmapper
cargo build --quiet -p sdp-tests --bin sdp-connbench
cargo build --quiet -p sdp-tools --bin iwarp-perf
cargo build --release --quiet -p sdp-tools --bin sdpcat

step "cargo nextest run (unit, integration, end-to-end; each test time-limited)"
cargo nextest run --workspace --profile ci

step "cargo test --doc"
cargo test --workspace --doc --quiet

# Each option of each program's --help is in its manual page, and every
# page renders without a warning.
step "manual pages against --help"
scripts/check-man.sh

# Installed like a system tool: the .deb installed, iperf3 over SDP by
# sdprun from PATH, then removed and purged with nothing left behind.
step "Debian package: install, iperf3 over SDP from PATH, remove, purge"
as_root scripts/package-test.sh

# A program under the preload behaves exactly as over TCP: CPython's own
# socket test suites, plain against preloaded (docs/testing.md).
step "CPython socket test suites, plain and under the preload"
scripts/cpython-suites.sh

# Many connections at once for half a minute: every byte hashed at both
# ends, fds and memory watched (docs/soak.md; the long run is 10 minutes).
step "soak, 30 s"
scripts/soak.sh --minutes 0.5

if [ "${SKIP_FUZZ:-0}" != 1 ]; then
    scripts/fuzz.sh "$FUZZ_SECONDS"
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
    step "scripts/bench.sh --quick (smoke run, no thresholds)"
    scripts/bench.sh --quick
fi

step "all checks passed"
