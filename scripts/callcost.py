#!/usr/bin/env python3
"""Instructions per call under the preload, counted by valgrind's callgrind.

This machine's timings swing by a factor of two from one minute to the
next; the instructions a call executes do not. Runs one workload over SDP
through a port mapper of its own, one end under `valgrind --tool=callgrind`,
and prints, per call of that end's program into the library, the
instructions of the whole process and of the library's layers (inclusive:
a layer's count holds what it calls):

  pingpong        sockperf ping-pong, 64-byte messages: the client
                  (per call: one send and one receive of a round trip)
  read  [--size]  qperf sdp_bw: the receiver (per read of --size bytes)
  write [--size]  qperf sdp_bw: the sender (per write of --size bytes)

  scripts/callcost.py --bin target/release pingpong
  scripts/callcost.py --bin target/release read --size 4096

Under valgrind the CRC runs its SSE path (no AVX-512), and the end under
it is some thirty times slower than its peer: compare counts between
builds, not with timings. The progress thread's kicks served by a call
depend on timing and vary by some hundreds of instructions per call
between runs.
"""

import argparse
import collections
import os
import re
import signal
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench import free_port  # noqa: E402  (the port checks bench.py makes)
from syscalls import start_port_mapper, wait_listening  # noqa: E402

# (label, function name exactly as callgrind prints it)
LAYERS = [
    ("library entry (send)", "<sdp_preload::backend::endpoint::Ep as sdp_preload::sdp::SdpEndpoint>::send"),
    ("library entry (recv)", "<sdp_preload::backend::endpoint::Ep as sdp_preload::sdp::SdpEndpoint>::recv"),
    ("stream send", "sdp_core::stream::SdpStream::send_vectored"),
    ("stream recv", "sdp_core::stream::SdpStream::recv_vectored"),
    ("pump: drive and write", "sdp_core::stream::shared::Inner::pump_out_lent"),
    ("pump: read the socket", "sdp_core::stream::shared::Inner::pump_io"),
    ("link drive", "sdp_core::link::Link::drive_all"),
    ("SDP connection work", "sdp_core::conn::Conn::work"),
    ("engine write", "iwarp::driver::Endpoint::pump_send"),
    ("engine read", "iwarp::driver::Endpoint::pump_recv_until"),
    ("engine framing", "iwarp::engine::qp::DataPath::poll_transmit"),
    ("CRC32c", "iwarp::wire::crc::Crc::update"),
    ("unlock", "<sdp_core::stream::shared::Locked as core::ops::drop::Drop>::drop"),
    ("progress kicks served", "sdp_core::stream::shared::Shared::serve_kicks"),
    ("copies (memcpy)", "__memcpy_avx_unaligned_erms"),
]


def parse(path):
    """Per function: (calls, inclusive instructions of those calls), and
    the process's total."""
    names, calls, incl = {}, collections.Counter(), collections.Counter()
    total, callee, expect = 0, None, False
    with open(path) as f:
        for line in f:
            m = re.match(r"(c?fn)=\((\d+)\)(?: (.*))?", line)
            if m:
                kind, key, name = m.groups()
                if name:
                    names[key] = name.strip()
                callee = key if kind == "cfn" else None
                expect = False
                continue
            m = re.match(r"calls=(\d+)", line)
            if m and callee:
                calls[callee] += int(m.group(1))
                expect = True
                continue
            if expect:
                cols = line.split()
                if len(cols) >= 2:
                    incl[callee] += int(cols[1])
                expect = False
            elif line.startswith(("summary:", "totals:")):
                total = int(line.split()[1])
    by_name = {}
    for key, n in calls.items():
        name = names.get(key, key)
        c, i = by_name.get(name, (0, 0))
        by_name[name] = (c + n, i + incl[key])
    return by_name, total


def run(work, env, sdprun, server_argv, client_argv, port, traced):
    """Runs the pair with `traced` ("server" or "client") under callgrind;
    returns the callgrind files written."""
    out = os.path.join(work, "callgrind.%p")
    grind = ["valgrind", "--tool=callgrind", "--trace-children=yes", f"--callgrind-out-file={out}"]
    srv = [sdprun] + (grind if traced == "server" else []) + server_argv
    cli = [sdprun] + (grind if traced == "client" else []) + client_argv
    server = subprocess.Popen(srv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    try:
        # valgrind takes seconds to start a program.
        wait_listening(port, server, deadline=60.0)
        client = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=300)
        if client.returncode != 0:
            sys.exit(f"client failed: {client.stderr[-2000:]}")
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    return [os.path.join(work, f) for f in os.listdir(work) if f.startswith("callgrind.")]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bin", required=True, help="directory with sdprun and sdp-portmapper")
    ap.add_argument("--seconds", type=int, default=5, help="length of the run (default 5)")
    ap.add_argument("--size", type=int, default=4096, help="message size for read and write (default 4096)")
    ap.add_argument("workload", choices=["pingpong", "read", "write"])
    args = ap.parse_args()
    bin_dir = os.path.abspath(args.bin)
    work = tempfile.mkdtemp(prefix="sdp-callcost-")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SDP_") and k != "LD_PRELOAD"}
    pm = start_port_mapper(bin_dir, work, env)
    env["SDP_LOCAL"] = "off"
    sdprun = os.path.join(bin_dir, "sdprun")
    try:
        port = free_port()
        secs = str(args.seconds)
        if args.workload == "pingpong":
            files = run(work, env, sdprun, ["sockperf", "sr", "--tcp", "-i", "127.0.0.1", "-p", str(port)],
                        ["sockperf", "pp", "--tcp", "-i", "127.0.0.1", "-p", str(port), "-m", "64", "-t", secs],
                        port, "client")
            per = LAYERS[0][1]
        else:
            data = free_port()
            files = run(work, env, sdprun, ["qperf", "-lp", str(port)],
                        ["qperf", "-lp", str(port), "-ip", str(data), "-t", secs, "-m", str(args.size),
                         "127.0.0.1", "sdp_bw"],
                        port, "server" if args.workload == "read" else "client")
            per = LAYERS[1][1] if args.workload == "read" else LAYERS[0][1]
        # The process that made the calls (qperf's server forks one per test).
        best = None
        for f in files:
            if os.path.getsize(f) == 0:
                continue
            by_name, total = parse(f)
            n = by_name.get(per, (0, 0))[0]
            if n and (best is None or n > best[0]):
                best = (n, by_name, total)
        if best is None:
            sys.exit(f"no calls of {per} in {files}")
        n, by_name, total = best
        what = {"pingpong": "round trip (one send, one receive)", "read": f"read of {args.size} bytes",
                "write": f"write of {args.size} bytes"}[args.workload]
        entries = sum(by_name.get(name, (0, 0))[1] for _, name in LAYERS[:2])
        print(f"{args.workload}: {n} calls; instructions per {what}")
        print(f"  {'whole process':28} {total / n:9.0f}   (the program and its start included)")
        print(f"  {'library':28} {entries / n:9.0f}")
        for label, name in LAYERS:
            c, i = by_name.get(name, (0, 0))
            if c:
                print(f"  {label:28} {i / n:9.0f}   ({c / n:.2f} calls)")
    finally:
        pm.terminate()
        pm.wait(timeout=10)


if __name__ == "__main__":
    main()
