#!/usr/bin/env python3
"""The benchmark suite behind scripts/bench.sh (Python 3, standard library).

Runs the same workloads over kernel TCP and over SDP through the preload,
TCP and SDP alternating, and prints a table, writes JSON and draws PNG
charts. See scripts/bench.sh for the usage and README.md ("Benchmarks")
for what each figure means.
"""

import argparse
import datetime
import json
import os
import platform
import queue
import re
import select
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

KIB = 1024
MIB = 1024 * 1024
# How often a running client's sockets are sampled with sdp-stat (after a
# first look at 0.2 s). Each sample costs some milliseconds of CPU.
SAMPLE_EVERY = 1.0

# DESIGN §7 targets.
THROUGHPUT_TARGET = 0.95  # SDP/TCP at 64 KiB+ messages, at least
LATENCY_TARGET = 1.10  # SDP/TCP at 64-byte ping-pong, at most
SETUP_TARGET = 2.0  # SDP/TCP connection setup time, warm PM cache, at most
SERVER_TARGET = 0.95  # SDP/TCP requests per second of real servers, at least
CHURN_TARGET = 0.5  # SDP/TCP connections per second, 100 clients at once, at least
SAME_HOST_TARGET = 1.5  # SDP/TCP throughput with the same-host path, 64 KiB to 4 MiB, at least
SAME_HOST_CPU_TARGET = 0.6  # SDP/TCP CPU s/GB with the same-host path, at most
MEMORY_TARGET = 16.0  # KiB per idle SDP connection, both ends together, at most
BURST_IDLE = 3  # seconds a connection waits idle after a burst before its RSS is read again

FULL = {
    "reps": 3,
    "seconds": 2,
    "bw_sizes": [64, 256, KIB, 4 * KIB, 16 * KIB, 64 * KIB, 256 * KIB, MIB, 4 * MIB],
    "lat_sizes": [64, KIB, 8 * KIB, 32 * KIB],
    "connections": 1000,
    "idle": 1000,
    "churn": 5000,
    "scale": 10000,
    "burst_conns": 100,
    "redis_requests": 200000,
}
QUICK = {
    "reps": 1,
    "seconds": 1,
    "bw_sizes": [64, 64 * KIB, MIB],
    "lat_sizes": [64],
    "connections": 200,
    "idle": 100,
    "churn": 500,
    "scale": 300,
    "burst_conns": 20,
    "redis_requests": 20000,
}


class BenchError(Exception):
    """A run that failed: the message says which and why."""


def size_name(n):
    if n is None:
        return ""
    for unit, div in (("MiB", MIB), ("KiB", KIB)):
        if n >= div and n % div == 0:
            return f"{n // div} {unit}"
    return f"{n} B"


def median(values):
    return statistics.median(values) if values else None


def tail(text, lines=15):
    return "\n".join(text.rstrip().splitlines()[-lines:])


class Lines:
    """A child's standard output, line by line, readable with a deadline."""

    def __init__(self, stream, keep):
        self.q = queue.Queue()
        self.keep = keep
        self.thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        self.thread.start()

    def _pump(self, stream):
        for raw in stream:
            line = raw.decode(errors="replace").rstrip("\n")
            self.keep.append(line)
            self.q.put(line)
        self.q.put(None)

    def wait(self, pred, deadline, what):
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BenchError(f"timed out waiting for {what}")
            try:
                line = self.q.get(timeout=left)
            except queue.Empty:
                continue
            if line is None:
                raise BenchError(f"output ended before {what}")
            if pred(line):
                return line


class Proc:
    """A child in its own process group, output to a file (or a pipe)."""

    def __init__(self, bench, name, argv, env, pipe=False):
        self.name = name
        self.argv = argv
        stem = os.path.join(bench.work, f"{len(bench.procs)}-{re.sub(r'[^A-Za-z0-9]+', '-', name)}")
        self.out_path = stem + ".out"
        self.err_path = stem + ".err"
        self.lines = []
        self.rusage = None
        out = open(self.out_path, "wb")
        err = open(self.err_path, "wb")
        self.p = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.PIPE if pipe else subprocess.DEVNULL,
            stdout=subprocess.PIPE if pipe else out,
            stderr=err,
            start_new_session=True,
        )
        out.close()
        err.close()
        self.pid = self.p.pid
        self.reader = Lines(self.p.stdout, self.lines) if pipe else None
        bench.procs.append(self)

    def output(self):
        """Standard output, then standard error."""
        text = "\n".join(self.lines)
        for path in (self.out_path, self.err_path):
            with open(path, errors="replace") as f:
                text += ("\n" if text else "") + f.read()
        return text

    def poll(self):
        """Reaps the child if it ended (keeping its rusage); its exit code or None."""
        if self.p.returncode is None:
            try:
                pid, status, ru = os.wait4(self.pid, os.WNOHANG)
            except ChildProcessError:
                return self.p.poll()
            if pid == 0:
                return None
            self.rusage = ru
            self.p.returncode = os.waitstatus_to_exitcode(status)
        return self.p.returncode

    def send_line(self):
        self.p.stdin.write(b"\n")
        self.p.stdin.flush()

    def stop(self):
        if self.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            end = time.monotonic() + 3
            while self.poll() is None and time.monotonic() < end:
                time.sleep(0.02)
        # Whatever is left of the group (qperf's forked children too).
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if self.poll() is None:
            try:
                self.p.wait(timeout=3)
            except subprocess.TimeoutExpired:
                pass

    def failed(self, why):
        return BenchError(f"{self.name}: {why}\n  command: {' '.join(self.argv)}\n  output:\n{tail(self.output())}")


def cpu_seconds(pid):
    """User + system time of a live process (all threads), in seconds."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise BenchError(f"no VmRSS for pid {pid}")


def listening(port):
    """Whether some socket listens on TCP `port` (any address)."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    parts = line.split()
                    if parts[3] == "0A" and int(parts[1].rsplit(":", 1)[1], 16) == port:
                        return True
        except OSError:
            pass
    return False


def free_port():
    # Checked free for TCP on both families, the way the servers bind.
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket(socket.AF_INET6) as s6:
                s6.bind(("::", port))
        except OSError:
            continue
        return port


class Bench:
    def __init__(self, args, cfg, bin_dir):
        self.args = args
        self.cfg = cfg
        self.bin = bin_dir
        self.work = tempfile.mkdtemp(prefix="sdp-bench-")
        self.procs = []
        self.rows = []
        self.failures = []
        base = {k: v for k, v in os.environ.items() if not k.startswith("SDP_") and k != "LD_PRELOAD"}
        base["SDP_STAT_DIR"] = os.path.join(self.work, "stat")
        self.plain_env = {k: v for k, v in base.items() if k != "SDP_STAT_DIR"}
        self.base_env = base
        self.pm = {}
        # The same-host path (SDP_LOCAL) only in the "same host" step: the
        # other rows measure the wire path, as between two hosts.
        self.local = False
        # SDP_ZCOPY for the SDP runs of the "same host zcopy" rows.
        self.zcopy = None

    # ---- processes ------------------------------------------------------

    def sdp_env(self, pm="warm"):
        env = dict(self.base_env)
        env.update(
            SDP_PM_PORT=str(self.pm[pm]["port"]),
            SDP_PM_CONTROL=self.pm[pm]["control"],
            SDP_LOG="error",
            SDP_LOCAL="on" if self.local else "off",
        )
        if self.zcopy:
            env.update(SDP_ZCOPY=self.zcopy, SDP_ZCOPY_THRESHOLD="256K")
        return env

    def spawn(self, name, argv, sdp, pm="warm", pipe=False):
        if sdp:
            return Proc(self, name, [os.path.join(self.bin, "sdprun")] + argv, self.sdp_env(pm), pipe)
        return Proc(self, name, argv, self.plain_env, pipe)

    def cleanup(self):
        for p in reversed(self.procs):
            p.stop()
        shutil.rmtree(self.work, ignore_errors=True)

    def start_portmappers(self):
        # Two port mappers of our own on free UDP ports: "warm" lets
        # clients cache its PMAccepts (PmTime 30 s), "cold" forbids it
        # (PmTime 0, §7.3.1.4 "MUST NOT cache"), so every connection of a
        # client that asks it sends a PMReq. The rate limit is lifted so
        # that the connection-rate runs are not throttled.
        for name, extra in (("warm", []), ("cold", ["--pm-time", "0"])):
            control = os.path.join(self.work, f"pm-{name}.sock")
            p = Proc(
                self,
                f"sdp-portmapper ({name})",
                [os.path.join(self.bin, "sdp-portmapper"), "--port", "0", "--control", control,
                 "--stats-interval-ms", "0", "--log-level", "warn",
                 "--rate", "1000000", "--burst", "1000000"] + extra,
                self.plain_env,
                pipe=True,
            )
            line = p.reader.wait(lambda l: l.startswith("ready "), time.monotonic() + 10, "the port mapper's ready line")
            m = re.search(r"udp=[^,\s]*:(\d+)", line)
            if not m:
                raise p.failed(f"unexpected ready line {line!r}")
            self.pm[name] = {"port": int(m.group(1)), "control": control}

    def pm_list(self, pm):
        out = subprocess.run(
            [os.path.join(self.bin, "sdp-portmapper"), "list", "--control", self.pm[pm]["control"]],
            capture_output=True, text=True, timeout=10, env=self.plain_env,
        )
        return out.stdout

    def pm_accepts(self, pm):
        m = re.search(r"\baccepts=(\d+)", self.pm_list(pm))
        if not m:
            raise BenchError(f"sdp-portmapper list ({pm}) printed no stats line")
        return int(m.group(1))

    def wait_server(self, proc, port, sdp, pm="warm"):
        """Until `proc` listens on `port` (and, for SDP, registered it)."""
        deadline = time.monotonic() + 15
        while True:
            if proc.poll() is not None:
                raise proc.failed(f"exited with {proc.p.returncode} before listening on {port}")
            if listening(port) and (not sdp or re.search(rf"^registration .* port={port} ", self.pm_list(pm), re.M)):
                return
            if time.monotonic() > deadline:
                what = "registered with the port mapper" if sdp and listening(port) else "listening"
                raise proc.failed(f"not {what} on port {port} after 15 s")
            time.sleep(0.05)

    def server(self, name, argv, port, sdp, pm="warm"):
        p = self.spawn(name, argv, sdp, pm)
        self.wait_server(p, port, sdp, pm)
        return p

    # ---- sdp-stat -------------------------------------------------------

    def stat_sockets(self, pid=None, counts=None):
        """The sockets sdp-stat shows of process `pid`, or of every process.
        `counts` (a Transport), if given, takes the processes' own counts
        of connections that went over SDP and over TCP."""
        which = ["--pid", str(pid)] if pid is not None else []
        out = subprocess.run(
            [os.path.join(self.bin, "sdp-stat"), "--json"] + which,
            capture_output=True, text=True, timeout=10, env=self.base_env,
        )
        if out.returncode != 0:
            return []
        try:
            procs = json.loads(out.stdout)
        except json.JSONDecodeError:
            return []
        if counts is not None:
            for p in procs["processes"]:
                counts.count(p.get("sdp_connections", 0), sum(p.get("tcp_by_reason", {}).values()))
        return [s for p in procs["processes"] for s in p["sockets"]]

    def run_client(self, name, argv, sdp, timeout, watch_ports=(), servers=(), pm="warm"):
        """Runs a client to its end, sampling sdp-stat while it runs: for
        SDP, the client's connections to `watch_ports` and, for the
        mechanism, the `servers`' ends of them. A TCP run is
        sampled the same way (and the answer ignored), so that the
        observer's own CPU time, on a machine of two cores, weighs on
        both sides of a pair alike. Returns (Proc, Transport)."""
        seen = Transport()
        p = self.spawn(name, argv, sdp, pm)
        deadline = time.monotonic() + timeout
        next_look = time.monotonic() + 0.2
        while p.poll() is None:
            now = time.monotonic()
            if now > deadline:
                p.stop()
                raise p.failed(f"still running after {timeout:.0f} s")
            for s in servers:
                if s.poll() is not None:
                    p.stop()
                    raise s.failed(f"server exited with {s.p.returncode} during the run")
            if now >= next_look:
                socks = self.stat_sockets(p.pid, seen if sdp else None)
                # A server may accept in a child (qperf forks): all of them.
                server_socks = self.stat_sockets() if servers else []
                if sdp:
                    seen.add(socks, watch_ports)
                    seen.add_accepted(server_socks, watch_ports)
                next_look = time.monotonic() + SAMPLE_EVERY
            time.sleep(0.02)
        if p.p.returncode != 0:
            raise p.failed(f"exited with {p.p.returncode}")
        return p, seen

    # ---- measurements ---------------------------------------------------

    def pairs(self, label, run, reps=None):
        """Runs `run(sdp, rep)` for TCP and SDP, `reps` times (default the
        configured), alternating the order; returns {"tcp": [...], "sdp":
        [...], "transport": ...} or raises the first failure."""
        got = {"tcp": [], "sdp": []}
        transport = Transport()
        for rep in range(reps or self.cfg["reps"]):
            order = (False, True) if rep % 2 == 0 else (True, False)
            for sdp in order:
                value, seen = run(sdp, rep)
                got["sdp" if sdp else "tcp"].append(value)
                if sdp:
                    transport.merge(seen)
        got["transport"] = transport
        return got

    def row(self, section, tool, size, metric, better, label, run, extract=None, reps=None):
        """One table row: `run(sdp, rep)` returns (value, Transport), where
        value is a number or a dict from which `extract` rows are made."""
        name = f"{tool} {size_name(size)}".strip() if section not in ("memory", "burst", "scale") else f"{size} {tool}"
        print(f"bench: {section}: {name} ...", file=sys.stderr, flush=True)
        try:
            got = self.pairs(label, run, reps)
        except BenchError as e:
            msg = f"{section}: {name}: {e}"
            print(f"bench: FAILED {msg}", file=sys.stderr, flush=True)
            self.failures.append(msg)
            self.rows.append({"section": section, "tool": tool, "size": size, "metric": metric,
                              "better": better, "error": str(e).splitlines()[0]})
            return []
        out = []
        specs = extract or [(section, tool, metric, better, None)]
        for sec, tl, met, bet, key in specs:
            tcp = [v[key] if key else v for v in got["tcp"]]
            sdp = [v[key] if key else v for v in got["sdp"]]
            ratios = [s / t for s, t in zip(sdp, tcp) if t]
            r = {
                "section": sec, "tool": tl, "size": size, "metric": met, "better": better if bet is None else bet,
                "tcp": {"values": tcp, "median": median(tcp)},
                "sdp": {"values": sdp, "median": median(sdp)},
                "ratios": ratios, "ratio": median(ratios),
                "sdp_transport": got["transport"].verdict(),
                "mechanism": got["transport"].mechanism(),
                "error": None,
            }
            self.rows.append(r)
            out.append(r)
        return out

    def same_host(self):
        """iperf3 and qperf from 64 KiB up with the same-host path on
        (DESIGN §9), against TCP on loopback; then qperf's blocking writes
        by Read Zcopy and by Write Zcopy, the peer moving the bytes itself."""
        self.local = True
        try:
            self.iperf3(section="same host", min_size=64 * KIB)
            self.qperf("bw", section="same host", min_size=64 * KIB)
            for mode in ("read", "write"):
                self.zcopy = mode
                self.qperf("bw", section="same host zcopy", min_size=MIB, tool=f"qperf {mode} Zcopy")
        finally:
            self.local = False
            self.zcopy = None

    def iperf3(self, section="throughput", min_size=0):
        cpu_section = "cpu" if section == "throughput" else f"{section} cpu"
        sec = self.cfg["seconds"]
        ports = {False: free_port(), True: free_port()}
        servers = {
            sdp: self.server(f"iperf3 server ({'SDP' if sdp else 'TCP'})",
                             ["iperf3", "-s", "-p", str(ports[sdp])], ports[sdp], sdp)
            for sdp in (False, True)
        }
        # iperf3 refuses blocks above 1 MiB ("block size too large").
        for size in [s for s in self.cfg["bw_sizes"] if min_size <= s <= MIB]:
            def run(sdp, rep, size=size):
                srv = servers[sdp]
                before = cpu_seconds(srv.pid)
                p, seen = self.run_client(
                    f"iperf3 {'SDP' if sdp else 'TCP'} {size}",
                    ["iperf3", "-c", "127.0.0.1", "-p", str(ports[sdp]), "-t", str(sec), "-l", str(size), "-J"],
                    sdp, sec + 30, watch_ports=(ports[sdp],), servers=(srv,),
                )
                after = cpu_seconds(srv.pid)
                try:
                    with open(p.out_path) as f:
                        end = json.load(f)["end"]
                    received = end["sum_received"]
                    nbytes, bps = received["bytes"], received["bits_per_second"]
                except (OSError, ValueError, KeyError, TypeError) as e:
                    raise p.failed(f"no result in iperf3's JSON ({e})")
                if nbytes <= 0 or bps <= 0:
                    raise p.failed("iperf3 moved no bytes")
                if before is None or after is None or p.rusage is None:
                    raise p.failed("CPU time of the client or the server not readable")
                cpu = p.rusage.ru_utime + p.rusage.ru_stime + (after - before)
                return {"gbps": bps / 1e9, "cpu_s_per_gb": cpu / (nbytes / 1e9)}, seen

            self.row(section, "iperf3", size, "Gbit/s", "higher", "iperf3", run, extract=[
                (section, "iperf3", "Gbit/s", "higher", "gbps"),
                (cpu_section, "iperf3", "CPU s/GB", "lower", "cpu_s_per_gb"),
            ])
        for s in servers.values():
            s.stop()

    def qperf(self, kind, section=None, min_size=0, tool="qperf"):
        """qperf tcp_bw/tcp_lat (plain) against sdp_bw/sdp_lat (preloaded)."""
        section = section or ("throughput" if kind == "bw" else "latency")
        sec = self.cfg["seconds"]
        lp = {False: free_port(), True: free_port()}
        ip = {False: free_port(), True: free_port()}
        servers = {
            sdp: self.server(f"qperf server ({'SDP' if sdp else 'TCP'})",
                             ["qperf", "-lp", str(lp[sdp])], lp[sdp], sdp)
            for sdp in (False, True)
        }
        sizes = self.cfg["bw_sizes"] if kind == "bw" else self.cfg["lat_sizes"]
        for size in [s for s in sizes if s >= min_size]:
            def run(sdp, rep, size=size):
                test = f"{'sdp' if sdp else 'tcp'}_{kind}"
                p, seen = self.run_client(
                    f"qperf {test} {size}",
                    ["qperf", "-lp", str(lp[sdp]), "-ip", str(ip[sdp]), "-t", str(sec), "-m", str(size),
                     "-e", "5", "-uu", "127.0.0.1", test],
                    sdp, sec + 30, watch_ports=(lp[sdp], ip[sdp]), servers=(servers[sdp],),
                )
                text = p.output()
                key, unit = ("bw", "bytes/sec") if kind == "bw" else ("latency", "ns")
                m = re.search(rf"^\s*{key}\s*=\s*([\d.,]+)\s*{re.escape(unit)}", text, re.M)
                if not m or float(m.group(1).replace(",", "")) <= 0:
                    raise p.failed(f"no {key} in {unit} in qperf's output")
                v = float(m.group(1).replace(",", ""))
                return (v * 8 / 1e9 if kind == "bw" else v / 1e3), seen

            if kind == "bw":
                self.row(section, tool, size, "Gbit/s", "higher", "qperf", run)
            else:
                self.row(section, tool, size, "µs", "lower", "qperf", run)
        for s in servers.values():
            s.stop()

    def sockperf(self):
        sec = self.cfg["seconds"]
        ports = {False: free_port(), True: free_port()}
        servers = {
            sdp: self.server(f"sockperf server ({'SDP' if sdp else 'TCP'})",
                             ["sockperf", "sr", "--tcp", "-i", "127.0.0.1", "-p", str(ports[sdp])], ports[sdp], sdp)
            for sdp in (False, True)
        }
        for size in self.cfg["lat_sizes"]:
            def run(sdp, rep, size=size):
                p, seen = self.run_client(
                    f"sockperf pp {'SDP' if sdp else 'TCP'} {size}",
                    ["sockperf", "pp", "--tcp", "-i", "127.0.0.1", "-p", str(ports[sdp]), "-t", str(sec),
                     "-m", str(size)],
                    sdp, sec + 30, watch_ports=(ports[sdp],), servers=(servers[sdp],),
                )
                text = re.sub(r"\x1b\[[0-9;]*m", "", p.output())
                got = {}
                for key, pct in (("p50", "50.000"), ("p99", "99.000")):
                    m = re.search(rf"percentile {re.escape(pct)} =\s*([\d.]+)", text)
                    if not m:
                        raise p.failed(f"no {pct} percentile in sockperf's output")
                    got[key] = float(m.group(1))
                m = re.search(r"\[Valid Duration\].*SentMessages=(\d+); ReceivedMessages=(\d+)", text)
                if not m or int(m.group(1)) == 0 or m.group(1) != m.group(2):
                    raise p.failed("sockperf's message counts are missing or differ")
                return got, seen

            self.row("latency", "sockperf", size, "µs", "lower", "sockperf", run, extract=[
                ("latency", "sockperf p50", "µs", "lower", "p50"),
                ("latency", "sockperf p99", "µs", "lower", "p99"),
            ])
        for s in servers.values():
            s.stop()

    def redis(self):
        """redis-benchmark SET and GET against redis-server, 50 clients, one
        request at a time and 16 in a pipeline (-P 16)."""
        if not shutil.which("redis-server") or not shutil.which("redis-benchmark"):
            raise BenchError("redis: redis-server or redis-benchmark missing (Debian: apt-get install redis-server)")
        ports = {False: free_port(), True: free_port()}
        servers = {
            sdp: self.server(f"redis-server ({'SDP' if sdp else 'TCP'})",
                             ["redis-server", "--port", str(ports[sdp]), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--protected-mode", "no"], ports[sdp], sdp)
            for sdp in (False, True)
        }
        n = self.cfg["redis_requests"]
        for pipeline in (1, 16):
            def run(sdp, rep, pipeline=pipeline):
                p, seen = self.run_client(
                    f"redis-benchmark {'SDP' if sdp else 'TCP'} -P {pipeline}",
                    ["redis-benchmark", "-p", str(ports[sdp]), "-t", "set,get", "-n", str(n * pipeline),
                     "-c", "50", "-P", str(pipeline), "-q", "--csv"],
                    sdp, 120, watch_ports=(ports[sdp],), servers=(servers[sdp],),
                )
                got = {}
                for m in re.finditer(r'^"(SET|GET)","([\d.]+)"', p.output(), re.M):
                    got[m.group(1)] = float(m.group(2))
                if set(got) != {"SET", "GET"} or min(got.values()) <= 0:
                    raise p.failed("no SET and GET requests per second in redis-benchmark's output")
                return got, seen

            label = "50 clients" if pipeline == 1 else "50 clients, -P 16"
            self.row("servers", f"redis {label}", None, "requests/s", "higher", "redis", run, extract=[
                ("servers", f"redis SET, {label}", "requests/s", "higher", "SET"),
                ("servers", f"redis GET, {label}", "requests/s", "higher", "GET"),
            ])
        for s in servers.values():
            s.stop()

    def nginx(self):
        """wrk against nginx, keep-alive: 10 connections fetching a 64 KiB and
        a 1 MiB file (one worker process, no sendfile), and the 64 KiB file
        again from an nginx with `sendfile on` (Debian's own configuration
        has it: the kernel sends a TCP response from the page cache without
        a copy, where SDP reads the file and frames it)."""
        if not shutil.which("nginx") or not shutil.which("wrk"):
            raise BenchError("nginx: nginx or wrk missing (Debian: apt-get install nginx-light wrk)")
        sec = self.cfg["seconds"]
        # (SDP, sendfile) -> port
        ports = {(sdp, sf): free_port() for sdp in (False, True) for sf in (False, True)}
        root = os.path.join(self.work, "nginx")
        os.makedirs(os.path.join(root, "www"), exist_ok=True)
        sizes = (64 * KIB, MIB)
        for size in (KIB,) + sizes:
            with open(os.path.join(root, "www", size_name(size).replace(" ", "")), "wb") as f:
                f.write(os.urandom(size))
        servers = {}
        for (sdp, sf), port in ports.items():
            what = ("SDP" if sdp else "TCP") + (", sendfile" if sf else "")
            d = os.path.join(root, ("sdp" if sdp else "tcp") + ("-sendfile" if sf else ""))
            os.makedirs(d, exist_ok=True)
            temps = " ".join(f"{t}_temp_path {d};" for t in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
            conf = os.path.join(d, "nginx.conf")
            with open(conf, "w") as f:
                f.write(f"daemon off; master_process off; worker_processes 1;\n"
                        f"error_log {d}/error.log; pid {d}/nginx.pid;\n"
                        f"events {{ worker_connections 1024; }}\n"
                        f"http {{ access_log off; sendfile {'on' if sf else 'off'}; {temps}\n"
                        f"  server {{ listen 127.0.0.1:{port}; root {root}/www; }} }}\n")
            servers[(sdp, sf)] = self.server(f"nginx ({what})", ["nginx", "-c", conf, "-p", d], port, sdp)

        def wrk(sdp, name, args, path, errors, sf=False):
            """One wrk run against the TCP or SDP nginx: requests/s, and
            what sdp-stat saw. Output matching `errors` fails the run."""
            p, seen = self.run_client(
                f"wrk {name} {'SDP' if sdp else 'TCP'}",
                ["wrk"] + args + ["-d", f"{sec}s", f"http://127.0.0.1:{ports[(sdp, sf)]}/{path}"],
                sdp, sec + 30, watch_ports=(ports[(sdp, sf)],), servers=(servers[(sdp, sf)],),
            )
            out = p.output()
            if re.search(errors, out):
                raise p.failed("wrk counted errors")
            m = re.search(r"^Requests/sec:\s+([\d.]+)", out, re.M)
            if not m or float(m.group(1)) <= 0:
                raise p.failed("no requests per second in wrk's output")
            return float(m.group(1)), seen

        for size in sizes:
            def run(sdp, rep, size=size):
                name = size_name(size)
                return wrk(sdp, name, ["-t", "1", "-c", "10"], name.replace(" ", ""), r"Socket errors|Non-2xx")

            self.row("servers", "nginx keep-alive", size, "requests/s", "higher", "nginx", run)

        def sendfile_run(sdp, rep):
            return wrk(sdp, "64 KiB, sendfile", ["-t", "1", "-c", "10"], "64KiB", r"Socket errors|Non-2xx", sf=True)

        self.row("servers", "nginx keep-alive, sendfile on", 64 * KIB, "requests/s", "higher", "nginx",
                 sendfile_run)

        # Churn: 100 clients, a new connection for every request.
        def close_run(sdp, rep):
            return wrk(sdp, "Connection: close", ["-t", "2", "-c", "100", "-H", "Connection: close"], "1KiB",
                       r"Non-2xx")

        self.row("churn", "nginx Connection: close, 100 clients", KIB, "requests/s", "higher", "nginx", close_run)
        for s in servers.values():
            s.stop()

    def connbench(self):
        """Connection setup: plain TCP, SDP with a warm PM cache, SDP with
        every connection asking the port mapper."""
        n = self.cfg["connections"]
        cb = os.path.join(self.bin, "sdp-connbench")
        kinds = {"tcp": (False, "warm"), "warm": (True, "warm"), "cold": (True, "cold")}
        ports = {k: free_port() for k in kinds}
        servers = {
            k: self.server(f"sdp-connbench server ({k})", [cb, "server", "--port", str(ports[k])], ports[k], sdp, pm)
            for k, (sdp, pm) in kinds.items()
        }

        def one(kind):
            sdp, pm = kinds[kind]
            argv = [cb, "rate", "--port", str(ports[kind]), "--count", str(n)] + (["--check"] if sdp else [])
            accepts = self.pm_accepts(pm) if sdp else 0
            p = self.spawn(f"sdp-connbench rate ({kind})", argv, sdp, pm, pipe=True)
            deadline = time.monotonic() + 60 + n * 0.05
            try:
                result = json.loads(p.reader.wait(lambda l: l.startswith("{"), deadline, "the result line"))
                seen = Transport()
                if sdp:
                    line = p.reader.wait(lambda l: l.startswith("check "), deadline, "the check line")
                    local = int(line.split()[1])
                    socks = [s for s in self.stat_sockets(p.pid)
                             if s["role"] == "client" and str(s["local"]).endswith(f":{local}")]
                    seen.add(socks, (ports[kind],))
                    p.send_line()
                    # Each connection of a cold run asked the port mapper.
                    asked = self.pm_accepts(pm) - accepts
                    if kind == "cold" and asked < n:
                        seen.note(f"cache not cold: {asked} PMAccepts for {n} connections")
                    seen.pm_queries.append(asked)
            except BenchError as e:
                p.stop()
                raise p.failed(str(e))
            while p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            if p.poll() != 0:
                p.stop()
                raise p.failed(f"exited with {p.p.returncode}")
            return result, seen

        # Each repetition: TCP, warm and cold, order rotating.
        got = {k: [] for k in kinds}
        seen = {k: Transport() for k in kinds}
        print("bench: connections: setup rate ...", file=sys.stderr, flush=True)
        try:
            for rep in range(self.cfg["reps"]):
                order = list(kinds)
                order = order[rep % 3:] + order[:rep % 3]
                for k in order:
                    r, s = one(k)
                    got[k].append(r)
                    seen[k].merge(s)
        except BenchError as e:
            msg = f"connections: {e}"
            print(f"bench: FAILED {msg}", file=sys.stderr, flush=True)
            self.failures.append(msg)
            self.rows.append({"section": "connections", "tool": "sdp-connbench", "size": None,
                              "metric": "connections/s", "better": "higher", "error": str(e).splitlines()[0]})
            return
        finally:
            for s in servers.values():
                s.stop()
        for k in ("warm", "cold"):
            for metric, better, key in (("connections/s", "higher", lambda r: r["per_second"]),
                                        ("setup p50 µs", "lower", lambda r: r["setup_us"]["p50"])):
                tcp = [key(r) for r in got["tcp"]]
                sdp = [key(r) for r in got[k]]
                ratios = [s / t for s, t in zip(sdp, tcp) if t]
                self.rows.append({
                    "section": "connections", "tool": f"PM cache {k}", "size": None, "metric": metric,
                    "better": better,
                    "tcp": {"values": tcp, "median": median(tcp)},
                    "sdp": {"values": sdp, "median": median(sdp)},
                    "ratios": ratios, "ratio": median(ratios),
                    "sdp_transport": seen[k].verdict(), "mechanism": seen[k].mechanism(),
                    "pm_queries": [q for t in seen[k].merged for q in t.pm_queries], "connections": n,
                    "raw": {"tcp": got["tcp"], "sdp": got[k]}, "error": None,
                })

    def hold(self, sdp, n, burst=0):
        """`sdp-connbench hold`: opens 1, then `n` more connections, each
        carrying a byte both ways, then one more byte over every one at
        once. Returns the RSS growth per connection of client and server
        (KiB), the seconds the `n` took to open and the round took, and
        what sdp-stat saw of the client's connections. With `burst`, each
        connection then moves that many bytes there and back, and the RSS
        growth per connection is read again right after and once the
        connections have been idle for `BURST_IDLE` seconds."""
        cb = os.path.join(self.bin, "sdp-connbench")
        port = free_port()
        what = "SDP" if sdp else "TCP"
        srv = self.spawn(f"sdp-connbench hold server ({what})", [cb, "server", "--hold", "--port", str(port)],
                         sdp, pipe=True)
        cl = None
        try:
            self.wait_server(srv, port, sdp)
            deadline = time.monotonic() + 60 + n * 0.05
            argv = [cb, "hold", "--port", str(port), "--count", str(n)]
            if burst:
                argv += ["--burst", str(burst)]
                deadline += n * burst / 50e6
            cl = self.spawn(f"sdp-connbench hold ({what}, {n})", argv, sdp, pipe=True)
            try:
                cl.reader.wait(lambda l: l.startswith("one "), deadline, "the first connection")
                srv.reader.wait(lambda l: l == "held 1", deadline, "the server's first connection")
                base = (rss_kib(cl.pid), rss_kib(srv.pid))
                cl.send_line()
                held = cl.reader.wait(lambda l: l.startswith(f"held {n} "), deadline, f"{n} connections")
                srv.reader.wait(lambda l: l == f"held {n + 1}", deadline, f"the server's {n + 1} connections")
                full = (rss_kib(cl.pid), rss_kib(srv.pid))
                seen = Transport()
                if sdp:
                    seen.add(self.stat_sockets(cl.pid), (port,))
                    if seen.sdp != n + 1:
                        seen.note(f"{seen.sdp} of {n + 1} connections seen as SDP")
                cl.send_line()
                used = cl.reader.wait(lambda l: l.startswith(f"used {n + 1} "), deadline, "the round over all")
                if burst:
                    cl.send_line()
                    cl.reader.wait(lambda l: l.startswith(f"burst {n + 1} "), deadline, "the bursts")
                    after = (rss_kib(cl.pid), rss_kib(srv.pid))
                    time.sleep(BURST_IDLE)
                    idle = (rss_kib(cl.pid), rss_kib(srv.pid))
            except BenchError as e:
                bad = cl if cl.poll() is not None else srv
                raise bad.failed(str(e))
            cl.send_line()
        finally:
            if cl:
                cl.stop()
            srv.stop()
        client = (full[0] - base[0]) / n
        server = (full[1] - base[1]) / n
        out = {"client": client, "server": server, "both": client + server,
               "open": float(held.split()[2]), "used": float(used.split()[2])}
        if burst:
            for key, (c, v) in (("burst", after), ("idle", idle)):
                out[f"{key} client"] = (c - full[0]) / (n + 1)
                out[f"{key} server"] = (v - full[1]) / (n + 1)
        return out, seen

    def memory(self):
        """RSS per idle connection, client and server, `idle` connections."""
        self.row("memory", "idle connections", self.cfg["idle"], "KiB/connection", "lower", "memory",
                 lambda sdp, rep: self.hold(sdp, self.cfg["idle"]), extract=[
                     ("memory", "client", "KiB/connection", "lower", "client"),
                     ("memory", "server", "KiB/connection", "lower", "server"),
                     ("memory", "both", "KiB/connection", "lower", "both"),
                 ])

    def burst(self):
        """The memory a burst takes and what of it stays once idle:
        `burst_conns` connections, each moving 4 MiB there and back in
        turn, then idle (the same-host path off, as in the rows above)."""
        n = self.cfg["burst_conns"]
        self.row("burst", "connections after a 4 MiB burst", n, "KiB/connection", "lower", "memory",
                 lambda sdp, rep: self.hold(sdp, n, burst=4 * MIB), extract=[
                     ("burst", "burst, client", "KiB/connection", "lower", "burst client"),
                     ("burst", "burst, server", "KiB/connection", "lower", "burst server"),
                     ("burst", f"burst, then idle {BURST_IDLE} s, client", "KiB/connection", "lower",
                      "idle client"),
                     ("burst", f"burst, then idle {BURST_IDLE} s, server", "KiB/connection", "lower",
                      "idle server"),
                 ])

    def scale(self):
        """`scale` connections at once between one client and one server
        process: the time to open them, a round over all of them, and the
        RSS per connection. One pair: each run opens every connection."""
        n = self.cfg["scale"]
        self.row("scale", "connections at once", n, "", "lower", "scale",
                 lambda sdp, rep: self.hold(sdp, n), reps=1, extract=[
                     ("scale", "time to open", "s", "lower", "open"),
                     ("scale", "a byte over each", "s", "lower", "used"),
                     ("scale", "RSS, client", "KiB/connection", "lower", "client"),
                     ("scale", "RSS, server", "KiB/connection", "lower", "server"),
                 ])

    def churn(self):
        """100 clients at once, each connecting, exchanging one request and
        closing, over and over: sdp-connbench rate --concurrency 100, and
        wrk against nginx with `Connection: close`."""
        n = self.cfg["churn"]
        cb = os.path.join(self.bin, "sdp-connbench")
        ports = {False: free_port(), True: free_port()}
        servers = {sdp: self.server(f"sdp-connbench server ({'SDP' if sdp else 'TCP'})",
                                    [cb, "server", "--port", str(ports[sdp])], ports[sdp], sdp)
                   for sdp in (False, True)}

        def run(sdp, rep):
            argv = [cb, "rate", "--port", str(ports[sdp]), "--count", str(n), "--concurrency", "100"]
            p = self.spawn(f"sdp-connbench rate --concurrency 100 ({'SDP' if sdp else 'TCP'})",
                           argv + (["--check"] if sdp else []), sdp, pipe=True)
            deadline = time.monotonic() + 60 + n * 0.02
            try:
                result = json.loads(p.reader.wait(lambda l: l.startswith("{"), deadline, "the result line"))
                seen = Transport()
                if sdp:
                    line = p.reader.wait(lambda l: l.startswith("check "), deadline, "the check line")
                    local = int(line.split()[1])
                    seen.add([s for s in self.stat_sockets(p.pid) if str(s["local"]).endswith(f":{local}")],
                             (ports[sdp],))
                    p.send_line()
            except BenchError as e:
                p.stop()
                raise p.failed(str(e))
            while p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            if p.poll() != 0:
                p.stop()
                raise p.failed(f"exited with {p.p.returncode}")
            return result["per_second"], seen

        try:
            self.row("churn", "sdp-connbench, 100 clients", None, "connections/s", "higher", "churn", run)
        finally:
            for s in servers.values():
                s.stop()

    # ---- targets, output    # ---- targets, output ------------------------------------------------

    def targets(self):
        out = []

        def judge(name, rows, ok, limit):
            measured = [r for r in rows if r.get("ratio") is not None and r["sdp_transport"] == "SDP"]
            fell = [r for r in rows if r.get("ratio") is not None and r["sdp_transport"] != "SDP"]
            failed = [r for r in rows if r.get("error")]
            if not measured:
                status = "not measured"
                worst = None
            else:
                worst = max(measured, key=lambda r: r["ratio"]) if limit[0] == "<=" else min(measured, key=lambda r: r["ratio"])
                status = "met" if all(ok(r["ratio"]) for r in measured) and not fell and not failed else "missed"
            out.append({
                "target": name, "limit": f"SDP/TCP {limit[0]} {limit[1]}", "status": status,
                "worst": None if worst is None else {
                    "tool": worst["tool"], "size": worst["size"], "metric": worst["metric"], "ratio": worst["ratio"]},
                "rows": len(rows), "fell_back": len(fell), "failed": len(failed),
            })
            for r in measured:
                r["target"] = "met" if ok(r["ratio"]) else "missed"

        judge("throughput at 64 KiB+ messages",
              [r for r in self.rows if r["section"] == "throughput" and (r["size"] or 0) >= 64 * KIB],
              lambda x: x >= THROUGHPUT_TARGET, (">=", THROUGHPUT_TARGET))
        judge("same host: throughput at 64 KiB+",
              [r for r in self.rows if r["section"] == "same host"],
              lambda x: x >= SAME_HOST_TARGET, (">=", SAME_HOST_TARGET))
        judge("same host: CPU per byte at 64 KiB+",
              [r for r in self.rows if r["section"] == "same host cpu"],
              lambda x: x <= SAME_HOST_CPU_TARGET, ("<=", SAME_HOST_CPU_TARGET))
        judge("64-byte ping-pong latency",
              [r for r in self.rows if r["section"] == "latency" and r["size"] == 64
               and r["tool"] in ("sockperf p50", "qperf", "sockperf")],
              lambda x: x <= LATENCY_TARGET, ("<=", LATENCY_TARGET))
        judge("real servers' requests/s",
              [r for r in self.rows if r["section"] == "servers"],
              lambda x: x >= SERVER_TARGET, (">=", SERVER_TARGET))
        judge("churn, 100 clients at once",
              [r for r in self.rows if r["section"] == "churn"],
              lambda x: x >= CHURN_TARGET, (">=", CHURN_TARGET))
        # Memory: an absolute limit on the SDP figure, not a ratio (TCP's
        # connection memory is in the kernel, about 0 in RSS).
        both = [r for r in self.rows if r["section"] == "memory" and r["tool"] == "both" and not r.get("error")]
        worst = max(both, key=lambda r: r["sdp"]["median"], default=None)
        ok = bool(both) and all(r["sdp"]["median"] <= MEMORY_TARGET and r["sdp_transport"] == "SDP" for r in both)
        out.append({
            "target": "memory per idle connection, both ends", "limit": f"SDP <= {MEMORY_TARGET:g} KiB",
            "status": "not measured" if not both else ("met" if ok else "missed"),
            "worst": None if worst is None else {
                "tool": "both ends", "size": None, "metric": "KiB/connection", "ratio": worst["sdp"]["median"]},
            "rows": len(both), "fell_back": sum(r["sdp_transport"] != "SDP" for r in both), "failed": 0,
        })
        for r in both:
            r["target"] = "met" if r["sdp"]["median"] <= MEMORY_TARGET else "missed"
        # Scale: every connection of the row held over SDP and used (no
        # ratio: TCP's figure is the reference for the time and RSS).
        held = [r for r in self.rows if r["section"] == "scale"]
        ran = [r for r in held if not r.get("error")]
        ok = bool(ran) and len(ran) == len(held) and all(r["sdp_transport"] == "SDP" for r in ran)
        out.append({
            "target": "connections at once, each used", "limit": f"SDP: all {self.cfg.get('scale', '-')}",
            "status": "not measured" if not held else ("met" if ok else "missed"),
            "worst": None, "rows": len(held),
            "fell_back": sum(r["sdp_transport"] != "SDP" for r in ran), "failed": len(held) - len(ran),
        })
        judge("connection setup, warm PM cache",
              [r for r in self.rows if r["section"] == "connections"
               and (r.get("error") or (r["tool"] == "PM cache warm" and r["metric"] == "setup p50 µs"))],
              lambda x: x <= SETUP_TARGET, ("<=", SETUP_TARGET))
        return out

    def table(self, targets):
        cfg = self.cfg
        lines = []
        heads = {
            "throughput": "Throughput by message size",
            "cpu": "CPU seconds per GB moved (iperf3; user + system of client and server)",
            "latency": "Latency by message size (one way: half the round trip)",
            "connections": f"Connection setup ({cfg['connections']} connections one after the other: connect, "
                           "1 byte there and back, close)",
            "churn": "Churn (100 clients at once, each connecting, one request, closing, again)",
            "memory": f"Memory per idle connection (RSS growth from 1 to {cfg['idle'] + 1} connections)",
            "burst": f"Memory after a burst ({cfg.get('burst_conns', '-')} connections, each moving 4 MiB there "
                     f"and back in turn; RSS growth per connection beyond the idle connections', right after "
                     f"and {BURST_IDLE} s later)",
            "scale": f"Connections at once ({cfg.get('scale', '-')} opened one after the other, each used, "
                     "then a byte over every one; one pair)",
            "servers": "Real servers (redis-server and redis-benchmark; nginx and wrk; both under the preload for SDP)",
            "same host": "Same host, one copy (SDP_LOCAL=on: payload written into the peer process; "
                         "the rows above run with it off)",
            "same host cpu": "Same host: CPU seconds per GB moved (iperf3; user + system of client and server)",
            "same host zcopy": "Same host, Zcopy (SDP_ZCOPY=read or write, threshold 256 KiB: the peer reads "
                               "the writer's buffer or writes the reader's itself, one copy in all; no target)",
        }
        for section in ("throughput", "cpu", "same host", "same host cpu", "same host zcopy", "latency", "servers",
                        "connections",
                        "churn", "memory", "burst", "scale"):
            rows = [r for r in self.rows if r["section"] == section]
            if not rows:
                continue
            lines.append("")
            lines.append(f"{heads[section]}; median of {cfg['reps']}, TCP and SDP alternating")
            lines.append("")
            lines.append("| test | size | unit | TCP | SDP | SDP/TCP | target | SDP ran as |")
            lines.append("|---|---|---|---:|---:|---:|---|---|")
            for r in rows:
                size = size_name(r["size"]) if isinstance(r["size"], int) and section not in ("memory", "burst", "scale") else "-"
                if r.get("error"):
                    lines.append(f"| {r['tool']} | {size} | {r['metric']} | FAILED | FAILED | - | - | {r['error']} |")
                    continue
                ran = r["sdp_transport"] + (f", {r['mechanism']}" if r["sdp_transport"] == "SDP" and r["mechanism"] else "")
                lines.append(
                    f"| {r['tool']} | {size} | {r['metric']} | {fmt(r['tcp']['median'])} | {fmt(r['sdp']['median'])} "
                    f"| {fmt(r['ratio'], ratio=True)} | {r.get('target', '-')} | {ran} |"
                )
        lines.append("")
        lines.append("DESIGN §7 targets (loopback, CRC on)")
        lines.append("")
        lines.append("| target | limit | status | worst row |")
        lines.append("|---|---|---|---|")
        for t in targets:
            w = t["worst"]
            worst = "-" if not w else f"{w['tool']} {size_name(w['size']) if isinstance(w['size'], int) else ''} {w['ratio']:.2f}".replace("  ", " ")
            extra = []
            if t["fell_back"]:
                extra.append(f"{t['fell_back']} fell back to TCP")
            if t["failed"]:
                extra.append(f"{t['failed']} failed")
            lines.append(f"| {t['target']} | {t['limit']} | {t['status']}{' (' + ', '.join(extra) + ')' if extra else ''} | {worst} |")
        return "\n".join(lines) + "\n"

    def charts(self, out_dir):
        gp = shutil.which("gnuplot")
        charts = []

        def dat(name, cols, series):
            path = os.path.join(out_dir, name)
            with open(path, "w") as f:
                f.write("# size " + " ".join(cols) + "\n")
                for size, vals in series:
                    f.write(f"{size} " + " ".join("NaN" if v is None else f"{v:.6g}" for v in vals) + "\n")
            return path

        def med(section, tool, size, which):
            for r in self.rows:
                if r["section"] == section and r["tool"] == tool and r["size"] == size and not r.get("error"):
                    return r[which]["median"] if which != "ratio" else r["ratio"]
            return None

        bw = dat("throughput.dat", ["iperf3_tcp", "iperf3_sdp", "qperf_tcp", "qperf_sdp"], [
            (s, [med("throughput", "iperf3", s, "tcp"), med("throughput", "iperf3", s, "sdp"),
                 med("throughput", "qperf", s, "tcp"), med("throughput", "qperf", s, "sdp")])
            for s in self.cfg["bw_sizes"]])
        lat = dat("latency.dat", ["sp50_tcp", "sp50_sdp", "sp99_tcp", "sp99_sdp", "q_tcp", "q_sdp"], [
            (s, [med("latency", "sockperf p50", s, "tcp"), med("latency", "sockperf p50", s, "sdp"),
                 med("latency", "sockperf p99", s, "tcp"), med("latency", "sockperf p99", s, "sdp"),
                 med("latency", "qperf", s, "tcp"), med("latency", "qperf", s, "sdp")])
            for s in self.cfg["lat_sizes"]])
        ratio_sizes = sorted(set(self.cfg["bw_sizes"]) | set(self.cfg["lat_sizes"]))
        rat = dat("ratio.dat", ["iperf3", "qperf_bw", "sockperf_p50", "qperf_lat", "cpu"], [
            (s, [med("throughput", "iperf3", s, "ratio"), med("throughput", "qperf", s, "ratio"),
                 med("latency", "sockperf p50", s, "ratio"), med("latency", "qperf", s, "ratio"),
                 med("cpu", "iperf3", s, "ratio")])
            for s in ratio_sizes])
        title = f"SDP (preload) vs kernel TCP on loopback, median of {self.cfg['reps']}"
        def xtics(sizes):
            # A margin on both sides, so that the end ticks keep their labels.
            return (f"set xrange [{min(sizes) / 1.4}:{max(sizes) * 1.4}]\n"
                    "set xtics (" + ", ".join(f'"{size_name(n)}" {n}' for n in sizes) + ")")

        xaxis = 'set logscale x 2; set xlabel "message size"; set grid; set key outside right top box'
        bw_tics, lat_tics, rat_tics = xtics(self.cfg["bw_sizes"]), xtics(self.cfg["lat_sizes"]), xtics(self.cfg["bw_sizes"])
        script = f"""
set terminal pngcairo size 1100,650 noenhanced font ",11"
set datafile missing "NaN"
set linetype 1 lc rgb "#1f77b4"
set linetype 2 lc rgb "#d62728"
set linetype 3 lc rgb "#2ca02c"
set linetype 4 lc rgb "#9467bd"
set linetype 5 lc rgb "#8c564b"
set linetype 6 lc rgb "#ff7f0e"
{xaxis}
set output "{os.path.join(out_dir, 'throughput.png')}"
set title "Throughput by message size — {title}"
{bw_tics}
set ylabel "throughput (Gbit/s)"
set yrange [0:*]
plot "{bw}" using 1:2 with linespoints lw 2 title "iperf3, kernel TCP", \\
     "{bw}" using 1:3 with linespoints lw 2 title "iperf3, SDP", \\
     "{bw}" using 1:4 with linespoints lw 2 dt 2 title "qperf tcp_bw, kernel TCP", \\
     "{bw}" using 1:5 with linespoints lw 2 dt 2 title "qperf sdp_bw, SDP"
set output "{os.path.join(out_dir, 'latency.png')}"
set title "Latency by message size (one way) — {title}"
{lat_tics}
set ylabel "latency (µs)"
set logscale y
set yrange [*:*]
plot "{lat}" using 1:2 with linespoints lw 2 title "sockperf p50, kernel TCP", \\
     "{lat}" using 1:3 with linespoints lw 2 title "sockperf p50, SDP", \\
     "{lat}" using 1:4 with linespoints lw 1 dt 3 title "sockperf p99, kernel TCP", \\
     "{lat}" using 1:5 with linespoints lw 1 dt 3 title "sockperf p99, SDP", \\
     "{lat}" using 1:6 with linespoints lw 2 dt 2 title "qperf tcp_lat, kernel TCP", \\
     "{lat}" using 1:7 with linespoints lw 2 dt 2 title "qperf sdp_lat, SDP"
set output "{os.path.join(out_dir, 'ratio.png')}"
set title "SDP / TCP by message size — {title}"
{rat_tics}
set ylabel "SDP / TCP (median of the pairs' ratios)"
set yrange [*:*]
plot "{rat}" using 1:2 with linespoints lw 2 title "iperf3 throughput", \\
     "{rat}" using 1:3 with linespoints lw 2 title "qperf throughput", \\
     "{rat}" using 1:4 with linespoints lw 2 title "sockperf p50 latency", \\
     "{rat}" using 1:5 with linespoints lw 2 title "qperf latency", \\
     "{rat}" using 1:6 with linespoints lw 2 lc rgb "black" dt 2 title "iperf3 CPU s/GB", \\
     {THROUGHPUT_TARGET} with lines lc rgb "dark-green" dt 4 title "throughput target ≥ {THROUGHPUT_TARGET}", \\
     {LATENCY_TARGET} with lines lc rgb "red" dt 4 title "latency target ≤ {LATENCY_TARGET}", \\
     1 with lines lc rgb "gray40" lw 2 title "parity (1)"
"""
        gp_path = os.path.join(out_dir, "charts.gp")
        with open(gp_path, "w") as f:
            f.write(script)
        r = subprocess.run([gp, gp_path], capture_output=True, text=True)
        if r.returncode != 0:
            raise BenchError(f"gnuplot failed:\n{tail(r.stderr)}")
        for name in ("throughput.png", "latency.png", "ratio.png"):
            charts.append(os.path.join(out_dir, name))
        return charts


def fmt(v, ratio=False):
    if v is None:
        return "-"
    if ratio:
        return f"{v:.2f}" if v < 100 else f"{v:.0f}"
    if v >= 100:
        return f"{v:.0f}"
    if v >= 10:
        return f"{v:.1f}"
    return f"{v:.3g}" if v >= 0.01 else f"{v:.2g}"


class Transport:
    """What sdp-stat showed of an SDP run's client connections."""

    def __init__(self):
        self.sockets = {}  # (fd, local) -> last record
        # The servers' ends of those connections: only for the mechanism
        # (a Read Zcopy reader moves the bytes on the same host, and only
        # its end counts them).
        self.accepted = {}
        self.notes = []
        self.pm_queries = []
        self.merged = []
        # The client process's own counts (sdp-stat's sdp_connections and
        # tcp_by_reason): they include connections that lived between two
        # samples, as a churn's do.
        self.counted_sdp = 0
        self.counted_tcp = 0

    def count(self, sdp, tcp):
        self.counted_sdp = max(self.counted_sdp, sdp)
        self.counted_tcp = max(self.counted_tcp, tcp)

    @property
    def sdp(self):
        return sum(1 for s in self.sockets.values() if s["transport"] == "sdp")

    def add(self, sockets, ports):
        for s in sockets:
            if s["role"] != "client" or not any(str(s["peer"]).endswith(f":{p}") for p in ports):
                continue
            if s["transport"] == "-":
                continue
            self.sockets[(s["fd"], s["local"])] = s

    def add_accepted(self, sockets, ports):
        for s in sockets:
            if s["role"] == "accepted" and any(str(s["local"]).endswith(f":{p}") for p in ports):
                self.accepted[(s["fd"], s["local"])] = s

    def note(self, text):
        self.notes.append(text)

    def merge(self, other):
        self.merged.append(other)

    def verdict(self):
        """"SDP", or why the row does not count as SDP."""
        runs = self.merged or [self]
        bad = []
        for t in runs:
            socks = list(t.sockets.values())
            tcp = [s for s in socks if s["transport"] == "tcp"]
            if tcp:
                bad.append(f"fell back to TCP ({tcp[0]['why']})")
            elif not socks and t.counted_tcp:
                bad.append(f"fell back to TCP ({t.counted_tcp} connections counted by sdp-stat)")
            elif not socks and not t.counted_sdp:
                bad.append("fell back to TCP (no SDP connection seen by sdp-stat)")
            bad.extend(t.notes)
        if not bad:
            return "SDP"
        return bad[0] + (f" (in {len(bad)} of {len(runs)} runs)" if len(runs) > 1 else "")

    def mechanism(self):
        total = {}
        for t in self.merged or [self]:
            for s in t.sockets.values():
                for k, v in s["bytes"].items():
                    total[k] = total.get(k, 0) + v
            for s in list(t.sockets.values()) + list(t.accepted.values()):
                for k, v in (s.get("same_host") or {}).items():
                    if k.startswith("bytes_"):
                        total["same_host_" + k] = total.get("same_host_" + k, 0) + v
        names = [("Bcopy", ("bcopy_tx", "bcopy_rx")), ("Read Zcopy", ("read_zcopy_tx", "read_zcopy_rx")),
                 ("Write Zcopy", ("write_zcopy_tx", "write_zcopy_rx")),
                 ("same host", ("same_host_bytes_tx", "same_host_bytes_rx"))]
        used = [n for n, keys in names if any(total.get(k, 0) > 0 for k in keys)]
        return " + ".join(used)

    def to_json(self):
        return self.verdict()


def host_info():
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {"cpu": model, "cpus": os.cpu_count(), "kernel": platform.release(),
            "loadavg_at_start": os.getloadavg()}


def git_commit(root):
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


# The steps of a run, in order.
STEPS = {
    "iperf3": lambda b: b.iperf3(),
    "qperf-bw": lambda b: b.qperf("bw"),
    "same-host": lambda b: b.same_host(),
    "sockperf": lambda b: b.sockperf(),
    "qperf-lat": lambda b: b.qperf("lat"),
    "redis": lambda b: b.redis(),
    "nginx": lambda b: b.nginx(),
    "setup": lambda b: b.connbench(),
    "churn": lambda b: b.churn(),
    "memory": lambda b: b.memory(),
    "burst": lambda b: b.burst(),
    "scale": lambda b: b.scale(),
}


def main():
    ap = argparse.ArgumentParser(prog="scripts/bench.sh", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smoke run in well under 2 minutes")
    ap.add_argument("--out", default=None, help="output directory (default target/bench)")
    ap.add_argument("--reps", type=int, help="repetitions of each TCP/SDP pair")
    ap.add_argument("--seconds", type=int, help="duration of each timed run")
    ap.add_argument("--only", metavar="STEPS",
                    help="comma-separated steps to run: " + ", ".join(STEPS) + " (default all)")
    ap.add_argument("--replot", metavar="JSON", help="only draw the charts (and print the table) of an earlier run")
    ap.add_argument("--bin", required=True, help=argparse.SUPPRESS)
    ap.add_argument("--root", required=True, help=argparse.SUPPRESS)
    args = ap.parse_args()
    steps = list(STEPS) if not args.only else [n.strip() for n in args.only.split(",") if n.strip()]
    unknown = [n for n in steps if n not in STEPS]
    if unknown:
        ap.error(f"unknown step(s) {', '.join(unknown)}; the steps are {', '.join(STEPS)}")
    cfg = dict(QUICK if args.quick else FULL)
    if args.reps:
        cfg["reps"] = args.reps
    if args.seconds:
        cfg["seconds"] = args.seconds
    out_dir = os.path.abspath(args.out or os.path.join(args.root, "target", "bench"))
    os.makedirs(out_dir, exist_ok=True)

    bench = Bench(args, cfg, args.bin)
    if args.replot:
        with open(args.replot) as f:
            doc = json.load(f)
        bench.rows, bench.cfg = doc["rows"], doc["config"]
        bench.cleanup()
        print(bench.table(doc["targets"]))
        for c in bench.charts(out_dir):
            print(f"chart: {c}")
        return 0

    def on_signal(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    started = time.time()
    try:
        bench.start_portmappers()
        for name in steps:
            try:
                STEPS[name](bench)
            except BenchError as e:
                # A server that would not start: the step's rows are lost.
                msg = str(e)
                print(f"bench: FAILED {msg}", file=sys.stderr, flush=True)
                bench.failures.append(msg)
    except KeyboardInterrupt:
        print("\nbench: interrupted; servers stopped", file=sys.stderr)
        return 130
    except BenchError as e:
        print(f"bench: FAILED {e}", file=sys.stderr)
        return 1
    finally:
        # Every exit, an unexpected exception too, stops what was started.
        bench.cleanup()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)

    targets = bench.targets()
    table = bench.table(targets)
    doc = {
        "suite": "scripts/bench.sh",
        "mode": "quick" if args.quick else "full",
        "started": datetime.datetime.fromtimestamp(started, datetime.timezone.utc).isoformat(timespec="seconds"),
        "wall_seconds": round(time.time() - started, 1),
        "commit": git_commit(args.root),
        "host": host_info(),
        "config": cfg,
        "notes": {
            "ratio": "median over repetitions of SDP/TCP per TCP/SDP pair",
            "qperf": "tcp_bw/tcp_lat without the preload (kernel TCP) against sdp_bw/sdp_lat under sdprun "
                     "(AF_INET_SDP sockets, which only the preload makes work)",
            "latency": "one way, half the round trip, as sockperf and qperf report it",
            "connections": "setup = connect() plus one byte there and back; warm: one PMReq per client "
                           "process (PmTime 30 s), cold: a port mapper with PmTime 0, one PMReq per connection",
            "memory": "VmRSS growth of client and server from 1 to idle+1 connections, divided by idle",
            "burst": "VmRSS of client and server after a burst over each connection, and BURST_IDLE s later, "
                     "less their VmRSS with the connections idle before it, divided by the connections",
        },
        "rows": bench.rows,
        "targets": targets,
        "failures": bench.failures,
    }
    print(table)
    json_path = os.path.join(out_dir, "bench.json")
    with open(json_path, "w") as f:
        json.dump(doc, f, indent=2, default=lambda o: o.to_json() if hasattr(o, "to_json") else str(o))
        f.write("\n")
    with open(os.path.join(out_dir, "bench.md"), "w") as f:
        f.write(table)
    charts = []
    if len(steps) == len(STEPS):
        # The charts need every step's rows.
        try:
            charts = bench.charts(out_dir)
        except BenchError as e:
            bench.failures.append(str(e))
    print(f"JSON: {json_path}")
    for c in charts:
        print(f"chart: {c}")
    print(f"wall time: {time.time() - started:.0f} s")
    if bench.failures:
        print(f"\nbench: {len(bench.failures)} run(s) failed:", file=sys.stderr)
        for f in bench.failures:
            print(f"  - {f.splitlines()[0]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
