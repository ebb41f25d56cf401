#!/usr/bin/env python3
"""System calls per message under the preload, counted by `strace -c -f`.

Runs, each end under strace, over SDP through a port mapper of its own:
  iperf3 -l 128K -t 2          (bulk: calls per 128 KiB message)
  sockperf ping-pong -m 64 -t 2 (latency: calls per 64-byte round trip)
and prints, for each end, all system calls and the futex calls per message.
`--tcp` runs the same without the preload, for comparison.

  scripts/syscalls.py --bin target/release [--tcp]
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import free_port, listening  # noqa: E402  (the port checks bench.py makes)


def strace_totals(path):
    """(all calls, futex calls) from an `strace -c` summary."""
    calls = futex = 0
    with open(path) as f:
        for line in f:
            cols = line.split()
            # seconds usecs/call calls [errors] syscall
            if len(cols) >= 5 and cols[-1] not in ("syscall", "total") and re.match(r"^[\d.]+$", cols[0]):
                n = int(cols[3])
                calls += n
                if cols[-1] == "futex":
                    futex += n
    return calls, futex


def wait_listening(port, proc, deadline=10.0):
    end = time.monotonic() + deadline
    while not listening(port):
        if proc.poll() is not None:
            sys.exit(f"server exited early ({proc.returncode})")
        if time.monotonic() > end:
            sys.exit(f"nothing listens on {port}")
        time.sleep(0.05)


def start_port_mapper(bin_dir, work, env):
    """A port mapper of this run's own, on a port the kernel picks; `env`
    gains what a preloaded program needs to use it."""
    control = os.path.join(work, "pm.sock")
    pm = subprocess.Popen([os.path.join(bin_dir, "sdp-portmapper"), "--port", "0", "--control", control,
                           "--stats-interval-ms", "0", "--log-level", "warn"],
                          stdout=subprocess.PIPE, text=True, env=env)
    line = pm.stdout.readline()
    m = re.search(r"udp=[^,\s]*:(\d+)", line)
    if not m:
        sys.exit(f"unexpected port mapper line {line!r}")
    env.update(SDP_PM_PORT=m.group(1), SDP_PM_CONTROL=control, SDP_LOG="error")
    return pm


def run_pair(work, name, prefix, env, server_argv, client_argv, port):
    srv_out = os.path.join(work, f"{name}-server.strace")
    cli_out = os.path.join(work, f"{name}-client.strace")
    # A session of its own: the server is stopped by a SIGINT to its group,
    # so that strace sees it exit and prints its counts.
    server = subprocess.Popen(["strace", "-c", "-f", "-o", srv_out] + prefix + server_argv, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_listening(port, server)
        client = subprocess.run(["strace", "-c", "-f", "-o", cli_out] + prefix + client_argv, env=env,
                                capture_output=True, text=True, timeout=60)
        if client.returncode != 0:
            sys.exit(f"{name} client failed: {client.stderr[-2000:]}")
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
        server.wait(timeout=20)
    return client.stdout, strace_totals(srv_out), strace_totals(cli_out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True, help="directory with sdprun and sdp-portmapper")
    ap.add_argument("--tcp", action="store_true", help="without the preload")
    args = ap.parse_args()
    bin_dir = os.path.abspath(args.bin)
    work = tempfile.mkdtemp(prefix="sdp-syscalls-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SDP_") and k != "LD_PRELOAD"}
    prefix = []
    pm = None
    if not args.tcp:
        pm = start_port_mapper(bin_dir, work, env)
        prefix = [os.path.join(bin_dir, "sdprun")]
    try:
        port = free_port()
        out, srv, cli = run_pair(work, "iperf3", prefix, env, ["iperf3", "-s", "-1", "-p", str(port)],
                                 ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-l", "128K", "-t", "2", "-J"],
                                 port)
        end = json.loads(out).get("end", {})
        if "sum_sent" not in end:
            sys.exit(f"iperf3 printed no totals: {out[-2000:]}")
        sent = end["sum_sent"]["bytes"]
        msgs = sent / (128 << 10)
        print(f"iperf3 -l 128K -t 2: {msgs:.0f} messages of 128 KiB")
        for end, (calls, futex) in (("client", cli), ("server", srv)):
            print(f"  {end}: {calls} calls, {calls / msgs:.2f} per message; futex {futex}, {futex / msgs:.3f} per message")
        port = free_port()
        out, srv, cli = run_pair(work, "sockperf", prefix, env, ["sockperf", "sr", "--tcp", "-i", "127.0.0.1", "-p", str(port)],
                                 ["sockperf", "pp", "--tcp", "-i", "127.0.0.1", "-p", str(port), "-m", "64", "-t", "2"],
                                 port)
        out = re.sub(r"\x1b\[[0-9;]*m", "", out)
        m = re.search(r"\[Valid Duration\].*SentMessages=(\d+); ReceivedMessages=(\d+)", out)
        if not m:
            sys.exit("no message counts in sockperf's output")
        msgs = int(m.group(1))
        print(f"sockperf ping-pong -m 64 -t 2: {msgs} round trips")
        for end, (calls, futex) in (("client", cli), ("server", srv)):
            print(f"  {end}: {calls} calls, {calls / msgs:.2f} per round trip; futex {futex}, {futex / msgs:.3f} per round trip")
        if pm is not None:
            listing = subprocess.run([os.path.join(bin_dir, "sdp-portmapper"), "list", "--control",
                                      env["SDP_PM_CONTROL"]], capture_output=True, text=True, env=env).stdout
            m = re.search(r"\baccepts=(\d+)", listing)
            print(f"port mapper: {m.group(1) if m else '?'} SDP connections accepted")
    finally:
        if pm is not None:
            pm.terminate()
            pm.wait(timeout=10)


if __name__ == "__main__":
    main()
