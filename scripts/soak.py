#!/usr/bin/env python3
"""Soak test of the SDP preload with real processes (run by scripts/soak.sh).

    soak.py drive --minutes N --work DIR --bin DIR [options]     the driver
    soak.py server|epserver|forkserver|client|fclient ...        workers (under sdprun)

Per Zcopy mode (SDP_ZCOPY off, read, write, both) the driver starts five
processes, each under sdprun:

  srv-MODE  "server": blocking accept in the main thread, a thread per
            connection (with --busy-fork-modes, accept-then-fork for some);
  eps-MODE  "epserver": one nonblocking epoll loop, level-triggered (with
            --epoll-et half of the connections edge-triggered);
  fsv-MODE  "forkserver": the classic accept-then-fork server, a child per
            connection;
  cli-MODE  "client": blocking threads and a poll loop of nonblocking
            connections, to all three servers;
  fcl-MODE  "fclient": forks children, two at a time, each running a few
            connections (a blocking thread and a poll loop), ending with
            _exit or exit.

It samples the open fds and RSS of these, stops them, and prints the
summary from the JSON lines the workers write to WORK/results/. Every
process takes SIGALRM every few milliseconds (setitimer), with or without
SA_RESTART, so that signals land inside the library's calls.

One connection: the client sends a request header (seeds, lengths,
flags), the request data, and the SHA-256 of what it sent; the server
answers with a response header, the response data, its SHA-256, and a
verdict carrying the SHA-256 of the request as the server received it;
both directions at once for "duplex" connections; the client closes, or
shuts down its side and waits for the server's end. A stream's bytes are
a slice of a fixed pseudo-random pool mapped through a byte permutation,
both chosen by its seed, so each receiver compares every chunk with what
it should be (on a difference: the offset, and whose bytes came instead),
hashes what it got and compares the hash with the sender's. Sizes are
log-uniform from 1 B to 16 MiB; sends and receives vary the call
(send/sendall/sendmsg/write, recv/recv_into/recvmsg_into/readv,
MSG_WAITALL) and the piece sizes, so large blocking calls with one buffer
go by Zcopy where the mode allows.

Cases the library gets wrong are kept out unless asked for (see
docs/soak.md): forks while other threads are inside calls
(--busy-fork-modes), edge-triggered epoll (--epoll-et), MSG_WAITALL reads
above the Bcopy threshold with Read Zcopy (--zcopy-waitall), reads above
it with Write Zcopy (--sink-reads).
"""

import argparse
import ctypes
import faulthandler
import hashlib
import itertools
import json
import math
import os
import random
import select
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import traceback
import zlib

MAX_MSG = 16 << 20
RECV_BUF = 4 << 20
POOL_SPAN = 32 << 20
POOL = b""
POOL_MV = memoryview(b"")

REQ_BODY = struct.Struct("<4sIQQQQQI")  # magic flags id req_seed req_len resp_seed resp_len pid
REQ_SIZE = REQ_BODY.size + 4  # + crc32
RESP_BODY = struct.Struct("<4sIQQ")  # magic flags id resp_len
RESP_SIZE = RESP_BODY.size + 4
VERDICT = struct.Struct("<4sI32s")  # magic status sha256(request as received)
DIGEST = 32
F_DUPLEX = 1
F_SHUTWR = 2

MODES = ["off", "read", "write", "both"]
TCP_REASONS = ["-", "rule-tcp", "no-sdp-engine", "pm-deny", "pm-timeout", "pm-unreachable",
               "refused", "mpa-reject", "hello-reject", "timeout", "internal-error", "peer-tcp"]


def make_pool():
    global POOL, POOL_MV
    POOL = random.Random(0x5D50AC).randbytes(POOL_SPAN + MAX_MSG)
    POOL_MV = memoryview(POOL)
    make_tables()


# Each stream is a slice of the pool, its bytes mapped through one of
# NTABLES byte permutations (both chosen by its seed): a receiver that gets
# another stream's bytes can tell which (the driver names the connection).
NTABLES = 64
TABLES = []
INVERSE = []


def make_tables():
    for j in range(NTABLES):
        perm = list(range(256))
        random.Random(0x7AB1E + j).shuffle(perm)
        TABLES.append(bytes(perm))
        inv = [0] * 256
        for i, v in enumerate(perm):
            inv[v] = i
        INVERSE.append(bytes(inv))


def stream_place(seed):
    """(pool offset, table) of the stream a seed names."""
    return seed % POOL_SPAN, (seed >> 32) % NTABLES


def stream_piece(seed, a, b):
    off, t = stream_place(seed)
    return POOL[off + a:off + b].translate(TABLES[t])


def stream_digest(seed, n):
    h = hashlib.sha256()
    for a in range(0, n, 4 << 20):
        h.update(stream_piece(seed, a, min(n, a + (4 << 20))))
    return h.digest()


def logu(rng, hi=MAX_MSG):
    """Log-uniform integer in [1, hi]."""
    return max(1, min(hi, int(math.exp(rng.uniform(0, math.log(hi + 1))))))


# ---------------------------------------------------------------- process state

class Ctx:
    name = "?"
    role = "?"
    mode = "?"
    work = "."
    conn_timeout = 60.0
    grace = 15.0
    ports = {}
    max_read = MAX_MSG
    max_waitall = MAX_MSG
    epoll_et = False
    sig_restart = False
    sig_interval = 0.0
    is_child = False
    listeners = []


C = Ctx()
SIGS = [0]
ERRORS = [0]
OK = [0]
STOP_REQ = [False]
IN_ACCEPT = [False]
ACTIVE = {}  # key -> ConnInfo
CHILDREN = {}  # pid -> [start, what, deadline, flagged]
BUFS = []
SEQ = itertools.count(1)
KEYS = itertools.count(1)


class Stop(Exception):
    pass


class SoakError(Exception):
    def __init__(self, kind, msg, **details):
        super().__init__(msg)
        self.kind = kind
        self.details = details


def now():
    return time.monotonic()


def count_fds():
    try:
        return len(os.listdir("/proc/self/fd"))
    except OSError:
        return -1


def rss_kb(pid="self"):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return -1


class Rec:
    """JSON lines, one file per process (a forked child opens its own)."""
    pid = None
    fd = None

    @staticmethod
    def write(obj):
        pid = os.getpid()
        if Rec.pid != pid:
            path = os.path.join(C.work, "results", f"{C.name}-{pid}.jsonl")
            Rec.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            Rec.pid = pid
        obj.setdefault("proc", C.name)
        obj.setdefault("pid", pid)
        obj.setdefault("mode", C.mode)
        obj.setdefault("time", round(time.time(), 3))
        os.write(Rec.fd, (json.dumps(obj) + "\n").encode())


class StatFile:
    """This process's own record in the preload's state export."""
    pid = None
    fd = None
    hdr = 4096
    rec = 192

    @staticmethod
    def record(sockfd):
        d = os.environ.get("SDP_STAT_DIR")
        if not d:
            return None
        pid = os.getpid()
        if StatFile.pid != pid:
            try:
                if StatFile.fd is not None:
                    os.close(StatFile.fd)
            except OSError:
                pass
            StatFile.fd = None
            try:
                fd = os.open(os.path.join(d, f"{pid}.stat"), os.O_RDONLY)
            except OSError:
                return None
            h = os.pread(fd, 24, 0)
            if len(h) < 24 or h[:8] != b"SDPSTAT1":
                os.close(fd)
                return None
            StatFile.hdr, StatFile.rec = struct.unpack_from("<II", h, 12)
            StatFile.fd, StatFile.pid = fd, pid
        off = StatFile.hdr + sockfd * StatFile.rec
        for _ in range(1000):
            b = os.pread(StatFile.fd, StatFile.rec, off)
            if len(b) < 192:
                return None
            if b[0] & 1 or os.pread(StatFile.fd, 4, off) != b[:4]:
                time.sleep(0.0005)
                continue
            if not b[4]:
                return None
            return {
                "transport": {1: "tcp", 2: "sdp"}.get(b[5], "undecided"),
                "why": TCP_REASONS[b[9]] if b[9] < len(TCP_REASONS) else str(b[9]),
                "modes": [b[12], b[13]],
                # bcopy tx/rx, read zcopy tx/rx, write zcopy tx/rx
                "bytes": list(struct.unpack_from("<6Q", b, 56)),
                # SrcAvail, SinkAvail, SendSm, cancels, ModeChange
                "msgs": list(struct.unpack_from("<5Q", b, 128)),
                # same host: written into the peer's ring, into ours
                "local": list(struct.unpack_from("<2Q", b, 192)) if len(b) >= 208 else [0, 0],
            }
        return None


def get_buf():
    try:
        return BUFS.pop()
    except IndexError:
        return bytearray(RECV_BUF)


def prefill_bufs(n):
    BUFS.extend(bytearray(RECV_BUF) for _ in range(n))


def put_buf(b):
    BUFS.append(b)


class ConnInfo:
    def __init__(self, side, style, target=None):
        self.key = next(KEYS)
        self.side = side
        self.style = style
        self.target = target
        self.start = now()
        self.deadline = self.start + C.conn_timeout
        self.stage = "start"
        self.sent = 0
        self.rcvd = 0
        self.sock = None
        self.hung = False
        self.params = {}
        self.ops = []
        ACTIVE[self.key] = self

    def op(self, what):
        self.ops.append(what)
        if len(self.ops) > 12:
            del self.ops[:4]

    def describe(self):
        return {"side": self.side, "style": self.style, "target": self.target,
                "stage": self.stage, "sent": self.sent, "rcvd": self.rcvd,
                "age": round(now() - self.start, 2), "params": self.params,
                "last_ops": self.ops[-8:]}


def record_error(kind, msg, info=None, **details):
    ERRORS[0] += 1
    obj = {"t": "error", "kind": kind, "msg": msg}
    if info is not None:
        obj.update(info.describe())
    if details:
        obj["details"] = details
    Rec.write(obj)
    print(f"soak[{C.name}/{os.getpid()}] {kind}: {msg}", file=sys.stderr, flush=True)


def conn_failed(info, e):
    if isinstance(e, SoakError):
        kind, msg, det = e.kind, str(e), e.details
    elif isinstance(e, OSError):
        kind, msg, det = "os-error", f"{type(e).__name__}: errno {e.errno} ({e.strerror})", {}
    else:
        kind, msg, det = "exception", repr(e), {"traceback": traceback.format_exc()}
    if info.hung:
        msg = "after the hang report: " + msg
    record_error(kind, msg, info, **det)


def conn_done(info, sock):
    st = None
    try:
        st = StatFile.record(sock.fileno())
    except OSError:
        pass
    obj = {"t": "conn", "side": info.side, "style": info.style, "target": info.target,
           "id": info.params.get("id"), "req": info.params.get("req_len"),
           "resp": info.params.get("resp_len"), "flags": info.params.get("flags"),
           "req_seed": info.params.get("req_seed"), "resp_seed": info.params.get("resp_seed"),
           "start": round(time.time() - (now() - info.start), 3),
           "secs": round(now() - info.start, 3), "ok": True}
    if st:
        obj.update(st)
    else:
        obj["transport"] = "unknown"
    OK[0] += 1
    Rec.write(obj)


# ---------------------------------------------------------------- signals

def on_alarm(signum, frame):
    SIGS[0] += 1
    if STOP_REQ[0] and IN_ACCEPT[0]:
        raise Stop()


def on_term(signum, frame):
    STOP_REQ[0] = True
    if IN_ACCEPT[0]:
        raise Stop()


def start_signals(rng):
    signal.signal(signal.SIGALRM, on_alarm)
    C.sig_restart = rng.random() < 0.5
    signal.siginterrupt(signal.SIGALRM, not C.sig_restart)
    C.sig_interval = round(rng.uniform(0.002, 0.008), 4)
    signal.setitimer(signal.ITIMER_REAL, C.sig_interval, C.sig_interval)


def watchdog():
    while True:
        time.sleep(1.0)
        t = now()
        for info in list(ACTIVE.values()):
            if not info.hung and t > info.deadline + C.grace:
                info.hung = True
                record_error("hang", f"connection not done after {t - info.start:.0f} s "
                             f"(stage {info.stage})", info)
                print(f"soak[{C.name}/{os.getpid()}] thread stacks:", file=sys.stderr, flush=True)
                faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
                try:
                    info.sock.shutdown(socket.SHUT_RDWR)
                except (OSError, AttributeError):
                    pass


def reaper():
    while True:
        time.sleep(0.2)
        reap_once()


def reap_once():
    t = now()
    for pid, ch in list(CHILDREN.items()):
        try:
            r, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            CHILDREN.pop(pid, None)
            continue
        if r == pid:
            CHILDREN.pop(pid, None)
            if os.WIFSIGNALED(status):
                sig = os.WTERMSIG(status)
                if not (ch[3] and sig == signal.SIGKILL):
                    record_error("child-exit", f"{ch[1]} child {pid} killed by signal {sig}")
            elif os.WEXITSTATUS(status) not in (0, 1):  # 1: its errors are recorded
                record_error("child-exit", f"{ch[1]} child {pid} exited with {os.WEXITSTATUS(status)}")
        elif not ch[3] and t > ch[2]:
            ch[3] = True
            record_error("hang", f"{ch[1]} child {pid} still running after {t - ch[0]:.0f} s; "
                         "its stacks follow in this log, then SIGKILL")
            try:
                os.kill(pid, signal.SIGUSR2)
                time.sleep(1.0)
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def after_fork_child():
    C.is_child = True
    ACTIVE.clear()
    CHILDREN.clear()
    ERRORS[0] = 0
    OK[0] = 0
    SIGS[0] = 0


def child_start(rng):
    start_signals(rng)
    threading.Thread(target=watchdog, daemon=True).start()


def libc_exit(status):
    """exit(3) without Python's finalization: the C atexit handlers run."""
    sys.stdout.flush()
    sys.stderr.flush()
    ctypes.CDLL(None).exit(status)


# ---------------------------------------------------------------- protocol

def pack_req(p):
    body = REQ_BODY.pack(b"SKRQ", p["flags"], p["id"], p["req_seed"], p["req_len"],
                         p["resp_seed"], p["resp_len"], os.getpid() & 0xFFFFFFFF)
    return body + struct.pack("<I", zlib.crc32(body))


def unpack_req(b):
    body, (crc,) = b[:REQ_BODY.size], struct.unpack("<I", b[REQ_BODY.size:])
    magic, flags, cid, rs, rl, ps, pl, pid = REQ_BODY.unpack(body)
    if magic != b"SKRQ" or crc != zlib.crc32(body) or rl > MAX_MSG or pl > MAX_MSG:
        raise SoakError("bad-header", "request header corrupt", got=b.hex())
    return {"id": cid, "flags": flags, "req_seed": rs, "req_len": rl, "resp_seed": ps,
            "resp_len": pl, "client_pid": pid}


def pack_resp(p):
    body = RESP_BODY.pack(b"SKRS", p["flags"], p["id"], p["resp_len"])
    return body + struct.pack("<I", zlib.crc32(body))


def check_resp(b, p):
    body, (crc,) = b[:RESP_BODY.size], struct.unpack("<I", b[RESP_BODY.size:])
    magic, flags, cid, pl = RESP_BODY.unpack(body)
    if magic != b"SKRS" or crc != zlib.crc32(body) or cid != p["id"] or pl != p["resp_len"]:
        raise SoakError("bad-header", "response header corrupt or not this connection's",
                        got=b.hex())


def pieces(rng, n):
    """Cuts [0, n) into the pieces a sender hands to its calls."""
    if n == 0:
        return []
    if rng.random() < 0.5:
        return [(0, n)]
    out, pos, least = [], 0, max(1, n // 64)
    while pos < n:
        k = max(least, logu(rng, n - pos))
        out.append((pos, min(n, pos + k)))
        pos += k
    return out


def where_from(raw):
    """Which stream the bytes a receiver got belong to: (table, pool
    offset), or why not known."""
    raw = bytes(raw)
    if len(raw) < 24:
        return {"unknown": "too few bytes to place"}
    if not any(raw):
        return {"unknown": "zeros"}
    for t in range(NTABLES):
        x = POOL.find(raw.translate(INVERSE[t]))
        if 0 <= x < POOL_SPAN + MAX_MSG:
            return {"table": t, "pool_offset": x}
    return {"unknown": "not stream data"}


class Checker:
    """Compares a received stream with the one its seed names, byte for
    byte, and hashes what it got."""

    def __init__(self, seed, length, what):
        self.seed, self.n, self.what = seed, length, what
        self.off, self.table = stream_place(seed)
        self.inv = INVERSE[self.table]
        self.pos = 0
        self.h = hashlib.sha256()

    @property
    def remaining(self):
        return self.n - self.pos

    def feed(self, mv, api):
        n = len(mv)
        e = POOL_MV[self.off + self.pos:self.off + self.pos + n]
        got = bytearray(mv).translate(self.inv)
        if got != e:
            lo, hi = 0, n
            while hi - lo > 32:
                mid = (lo + hi) // 2
                if got[lo:mid] == e[lo:mid]:
                    lo = mid
                else:
                    hi = mid
            i = lo
            while i < hi and got[i] == e[i]:
                i += 1
            at = self.pos + i
            src = where_from(mv[i:i + 48])
            if src.get("table") == self.table and self.off <= src["pool_offset"] < self.off + self.n:
                src["this_stream_byte"] = src["pool_offset"] - self.off
            raise SoakError(
                "mismatch",
                f"{self.what} byte {at} of {self.n} differs (chunk of {n} at {self.pos} from {api})",
                offset=at, length=self.n, seed=self.seed, chunk_start=self.pos, chunk_len=n,
                api=api, got=bytes(mv[i:i + 16]).hex(),
                expected=bytes(e[i:i + 16]).translate(TABLES[self.table]).hex(), got_is=src)
        self.h.update(mv)
        self.pos += n

    def digest(self):
        return self.h.digest()


def client_gen(p, info, rng):
    req_digest = stream_digest(p["req_seed"], p["req_len"])

    def tx():
        yield ("send", pack_req(p), "req-header")
        for a, b in pieces(rng, p["req_len"]):
            yield ("send", stream_piece(p["req_seed"], a, b), "req-data")
        yield ("send", req_digest, "req-trailer")

    def rx():
        h = yield ("recvexact", RESP_SIZE, "resp-header")
        check_resp(h, p)
        chk = Checker(p["resp_seed"], p["resp_len"], "response")
        yield ("recvdata", chk, "resp-data")
        t = yield ("recvexact", DIGEST, "resp-trailer")
        if t != chk.digest():
            raise SoakError("hash", "response SHA-256 differs from the server's",
                            got=chk.digest().hex(), sender=t.hex())
        v = yield ("recvexact", VERDICT.size, "verdict")
        magic, status, dig = VERDICT.unpack(v)
        if magic != b"SKVD" or status != 0 or dig != req_digest:
            raise SoakError("verdict", "the server received another request than was sent",
                            verdict=v.hex(), sent_digest=req_digest.hex())

    if p["flags"] & F_DUPLEX:
        yield ("spawn", tx())
        yield from rx()
        yield ("join",)
    else:
        yield from tx()
        yield from rx()
    if p["flags"] & F_SHUTWR:
        yield ("shutdown", "shutdown")
        yield ("eof", "eof")


def server_gen(info, rng):
    h = yield ("recvexact", REQ_SIZE, "req-header")
    p = unpack_req(h)
    info.params = p
    resp_digest = stream_digest(p["resp_seed"], p["resp_len"])
    chk = Checker(p["req_seed"], p["req_len"], "request")

    def rx():
        yield ("recvdata", chk, "req-data")
        t = yield ("recvexact", DIGEST, "req-trailer")
        if t != chk.digest():
            raise SoakError("hash", "request SHA-256 differs from the client's",
                            got=chk.digest().hex(), sender=t.hex())

    def tx():
        yield ("send", pack_resp(p), "resp-header")
        for a, b in pieces(rng, p["resp_len"]):
            yield ("send", stream_piece(p["resp_seed"], a, b), "resp-data")
        yield ("send", resp_digest, "resp-trailer")

    if p["flags"] & F_DUPLEX:
        yield ("spawn", tx())
        yield from rx()
        yield ("join",)
    else:
        yield from rx()
        yield from tx()
    yield ("send", VERDICT.pack(b"SKVD", 0, chk.digest()), "verdict")
    yield ("eof", "eof")


# ---------------------------------------------------------------- blocking runner

def set_timeouts(sock, secs):
    tv = struct.pack("ll", int(secs), int((secs % 1) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


class Blocking:
    """Runs a protocol generator with blocking calls of every kind."""

    def __init__(self, sock, info, rng, buf):
        self.sock, self.info, self.rng, self.buf = sock, info, rng, buf
        self.mv = memoryview(buf) if buf is not None else None

    def run(self, gen):
        value, child = None, None
        while True:
            try:
                req = gen.send(value)
            except StopIteration:
                return
            value = None
            kind = req[0]
            if isinstance(req[-1], str):
                self.info.stage = req[-1]
            try:
                if kind == "send":
                    self.send(req[1])
                elif kind == "recvexact":
                    value = self.recv_exact(req[1])
                elif kind == "recvdata":
                    self.recv_data(req[1])
                elif kind == "eof":
                    self.expect_eof()
                elif kind == "shutdown":
                    self.sock.shutdown(socket.SHUT_WR)
                elif kind == "spawn":
                    child = self.spawn(req[1])
                elif kind == "join":
                    child.join(max(0.0, self.info.deadline + C.grace - now()))
                    if child.is_alive():
                        raise SoakError("hang", "the sending thread did not finish")
                    if child.exc is not None:
                        raise child.exc
            except BlockingIOError as e:
                raise SoakError("timeout", f"{self.info.stage}: SO_RCVTIMEO/SO_SNDTIMEO expired "
                                f"({e.strerror})") from e
            except SoakError:
                if child is not None and child.is_alive():
                    self.stop_child(child)
                raise
            except OSError:
                if child is not None and child.is_alive():
                    self.stop_child(child)
                raise

    def stop_child(self, child):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        child.join(5.0)

    def spawn(self, gen):
        r = Blocking(self.sock, self.info, random.Random(self.rng.random()), None)

        def body():
            try:
                r.run(gen)
            except BaseException as e:  # noqa: B902 - handed to the joining thread
                t.exc = e

        t = threading.Thread(target=body, daemon=True)
        t.exc = None
        t.start()
        return t

    def send(self, mv):
        mv = memoryview(mv)
        pos, n, s, rng = 0, len(mv), self.sock, self.rng
        while pos < n:
            rest = mv[pos:]
            r = rng.random()
            if r < 0.4:
                s.sendall(rest)
                k, api = len(rest), "sendall"
            elif r < 0.7:
                k, api = s.send(rest), "send"
            elif r < 0.85 and len(rest) > 1:
                cut = rng.randrange(1, len(rest))
                k, api = s.sendmsg([rest[:cut], rest[cut:]]), "sendmsg2"
            else:
                k, api = os.write(s.fileno(), rest), "write"
            self.info.op(f"{api}({len(rest)})={k}")
            pos += k
            self.info.sent += k

    def recv_exact(self, n):
        out = bytearray()
        while len(out) < n:
            if self.rng.random() < 0.5:
                b = self.sock.recv(n - len(out))
                k, api = len(b), "recv"
            else:
                b = bytearray(n - len(out))
                k, api = self.sock.recv_into(b), "recv_into"
                b = b[:k]
            self.info.op(f"{api}({n - len(out)})={k}")
            if k == 0:
                raise SoakError("short", f"{self.info.stage}: end of stream after {len(out)} of {n} bytes")
            out += b
            self.info.rcvd += k
        return bytes(out)

    def recv_data(self, chk):
        s, rng, mv, fd = self.sock, self.rng, self.mv, self.sock.fileno()
        while chk.remaining:
            want = min(chk.remaining, len(mv), C.max_read)
            if rng.random() < 0.5:
                want = logu(rng, want)
            r = rng.random()
            if r < 0.45:
                k, api = s.recv_into(mv[:want], want), "recv_into"
                got = mv[:k]
            elif r < 0.6:
                want = min(want, 1 << 20)
                got = s.recv(want)
                k, api = len(got), "recv"
            elif r < 0.7 and want > 1:
                cut = rng.randrange(1, want)
                k = s.recvmsg_into([mv[:cut], mv[cut:want]])[0]
                got, api = mv[:k], "recvmsg_into2"
            elif r < 0.85:
                k, api = os.readv(fd, [mv[:want]]), "readv"
                got = mv[:k]
            else:
                want = min(want, C.max_waitall)
                k, api = s.recv_into(mv[:want], want, socket.MSG_WAITALL), "recv_into_waitall"
                got = mv[:k]
            self.info.op(f"{api}({want})={k}")
            if k == 0:
                raise SoakError("short", f"{chk.what}: end of stream after {chk.pos} of {chk.n} bytes",
                                seed=chk.seed)
            chk.feed(got, api)
            self.info.rcvd += k

    def expect_eof(self):
        b = self.sock.recv(64)
        self.info.op(f"recv(64)={len(b)}")
        if b:
            raise SoakError("unexpected-data", f"{len(b)} bytes where the peer's end was due",
                            got=b[:32].hex())


# ---------------------------------------------------------------- nonblocking runner

RECV_KINDS = ("recvexact", "recvdata", "eof")


class Task:
    __slots__ = ("gen", "req", "pos", "acc", "done", "waiting", "child", "main")

    def __init__(self, gen, main):
        self.gen, self.main = gen, main
        self.req, self.pos, self.acc = None, 0, None
        self.done, self.waiting, self.child = False, False, None


class NonBlocking:
    """Runs a protocol generator on a nonblocking socket: progress() moves
    what can move without blocking, until every call says EAGAIN."""

    def __init__(self, sock, info, rng, buf, gen):
        self.sock, self.info, self.rng = sock, info, rng
        self.mv = memoryview(buf)
        self.tasks = []
        self.finished = False
        self.gen = gen
        self.main = None

    def begin(self):
        self.main = self._start(self.gen, True)

    def _start(self, gen, main):
        t = Task(gen, main)
        self.tasks.append(t)
        self._step(t, None)
        return t

    def _step(self, t, value):
        while True:
            try:
                req = t.gen.send(value)
            except StopIteration:
                t.done, t.req = True, None
                self.tasks.remove(t)
                if t.main:
                    self.finished = True
                elif self.main is not None and self.main.waiting:
                    self.main.waiting = False
                    self._step(self.main, None)
                return
            value = None
            kind = req[0]
            if kind == "spawn":
                t.child = self._start(req[1], False)
                continue
            if kind == "join":
                if t.child is None or t.child.done:
                    continue
                t.waiting, t.req = True, None
                return
            if kind == "shutdown":
                self.sock.shutdown(socket.SHUT_WR)
                continue
            t.req, t.pos, t.acc = req, 0, bytearray()
            self.info.stage = req[-1]
            return

    def interest(self):
        ev = 0
        for t in self.tasks:
            if t.req is not None:
                ev |= select.POLLIN if t.req[0] in RECV_KINDS else select.POLLOUT
        return ev

    def progress(self):
        while not self.finished:
            moved = False
            for t in list(self.tasks):
                if t.req is None:
                    continue
                try:
                    moved |= self._io(t)
                except BlockingIOError:
                    pass
            if not moved:
                return

    def _io(self, t):
        kind, s, rng, info = t.req[0], self.sock, self.rng, self.info
        if kind == "send":
            mv = memoryview(t.req[1])
            rest = mv[t.pos:]
            if rng.random() < 0.5 and len(rest) > 1:
                rest = rest[:logu(rng, len(rest))]
            if rng.random() < 0.1 and len(rest) > 1:
                cut = rng.randrange(1, len(rest))
                k, api = s.sendmsg([rest[:cut], rest[cut:]]), "sendmsg2"
            else:
                k, api = s.send(rest), "send"
            info.op(f"{api}({len(rest)})={k}")
            t.pos += k
            info.sent += k
            if t.pos == len(mv):
                self._step(t, None)
            return True
        if kind == "recvexact":
            need = t.req[1] - len(t.acc)
            k = s.recv_into(self.mv[:need], need)
            info.op(f"recv_into({need})={k}")
            if k == 0:
                raise SoakError("short", f"{info.stage}: end of stream after {len(t.acc)} of "
                                f"{t.req[1]} bytes")
            t.acc += self.mv[:k]
            info.rcvd += k
            if len(t.acc) == t.req[1]:
                self._step(t, bytes(t.acc))
            return True
        if kind == "recvdata":
            chk = t.req[1]
            want = min(chk.remaining, len(self.mv), C.max_read)
            if rng.random() < 0.3:
                want = logu(rng, want)
            k = s.recv_into(self.mv[:want], want)
            info.op(f"recv_into({want})={k}")
            if k == 0:
                raise SoakError("short", f"{chk.what}: end of stream after {chk.pos} of {chk.n} bytes",
                                seed=chk.seed)
            chk.feed(self.mv[:k], "recv_into(nonblocking)")
            info.rcvd += k
            if chk.remaining == 0:
                self._step(t, None)
            return True
        if kind == "eof":
            k = s.recv_into(self.mv[:64], 64)
            info.op(f"recv_into(64)={k}")
            if k:
                raise SoakError("unexpected-data", f"{k} bytes where the peer's end was due",
                                got=bytes(self.mv[:min(k, 32)]).hex())
            self._step(t, None)
            return True
        raise AssertionError(kind)


# ---------------------------------------------------------------- client

def new_params(rng):
    return {"id": (os.getpid() << 32) | next(SEQ), "req_len": logu(rng), "resp_len": logu(rng),
            "req_seed": rng.getrandbits(62), "resp_seed": rng.getrandbits(62),
            "flags": (F_DUPLEX if rng.random() < 0.4 else 0) | (F_SHUTWR if rng.random() < 0.3 else 0)}


TARGETS = (("thr", 0.4), ("epoll", 0.4), ("fork", 0.2))


def pick_target(rng):
    r, acc = rng.random(), 0.0
    for name, w in TARGETS:
        acc += w
        if r < acc:
            return name
    return TARGETS[-1][0]


def client_blocking_conn(rng, buf, style):
    target = pick_target(rng)
    info = ConnInfo("client", style, target)
    info.params = new_params(rng)
    sock = None
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        info.sock = sock
        set_timeouts(sock, C.conn_timeout)
        info.stage = "connect"
        sock.connect(("127.0.0.1", C.ports[target]))
        Blocking(sock, info, rng, buf).run(client_gen(info.params, info, rng))
        conn_done(info, sock)
    except Exception as e:
        conn_failed(info, e)
    finally:
        ACTIVE.pop(info.key, None)
        if sock is not None:
            sock.close()


def client_thread(stop_at, limit, style):
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    buf = get_buf()
    n = 0
    while now() < stop_at and (limit is None or n < limit):
        client_blocking_conn(rng, buf, style)
        n += 1
    put_buf(buf)


def poll_loop(nconns, stop_at, limit, style):
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    buf = get_buf()
    poller = select.poll()
    conns = {}  # fd -> (sock, NonBlocking, registered mask, connecting)
    started = 0

    def finish(fd, err=None):
        sock, nb, _, _ = conns.pop(fd)
        try:
            poller.unregister(fd)
        except (KeyError, ValueError):
            pass
        if err is None:
            conn_done(nb.info, sock)
        else:
            conn_failed(nb.info, err)
        ACTIVE.pop(nb.info.key, None)
        sock.close()

    while True:
        while len(conns) < nconns and now() < stop_at and (limit is None or started < limit):
            started += 1
            target = pick_target(rng)
            info = ConnInfo("client", style, target)
            info.params = new_params(rng)
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setblocking(False)
            info.sock, info.stage = sock, "connect"
            nb = NonBlocking(sock, info, rng, buf, client_gen(info.params, info, rng))
            fd = sock.fileno()
            err = sock.connect_ex(("127.0.0.1", C.ports[target]))
            conns[fd] = [sock, nb, select.POLLOUT, True]
            poller.register(fd, select.POLLOUT)
            if err not in (0, 115, 4):  # EINPROGRESS, EINTR
                finish(fd, OSError(err, os.strerror(err)))
        if not conns:
            break
        for fd, ev in poller.poll(200):
            c = conns.get(fd)
            if c is None:
                continue
            sock, nb = c[0], c[1]
            try:
                if ev & select.POLLNVAL:
                    raise SoakError("poll", "POLLNVAL on an open connection")
                if c[3]:
                    err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    if err:
                        raise OSError(err, f"nonblocking connect: {os.strerror(err)}")
                    nb.info.op(f"connected(poll ev {ev:#x})")
                    c[3] = False
                    nb.begin()
                nb.progress()
                if nb.finished:
                    finish(fd)
                    continue
                want = nb.interest()
                if want != c[2]:
                    poller.modify(fd, want)
                    c[2] = want
            except Exception as e:
                finish(fd, e)
        t = now()
        for fd, c in list(conns.items()):
            info = c[1].info
            if t > info.deadline or info.hung:
                finish(fd, SoakError("timeout", f"no end after {t - info.start:.0f} s "
                                     f"(stage {info.stage}; poll mask {c[2]:#x})"))
    put_buf(buf)


def fork_client_child(rng, nconns):
    rng = random.Random(rng.getrandbits(64))  # each child its own draws
    pid = os.fork()
    if pid:
        CHILDREN[pid] = [now(), "client", now() + C.conn_timeout * 2 + C.grace, False]
        return
    status = 2
    use_libc_exit = rng.random() < 0.5
    try:
        child_start(rng)
        k1 = rng.randint(0, nconns)
        t = threading.Thread(target=client_thread, args=(math.inf, k1, "fork-thr"), daemon=True)
        t.start()
        poll_loop(2, math.inf, nconns - k1, "fork-poll")
        t.join(C.conn_timeout + C.grace)
        if t.is_alive():
            record_error("hang", "the forked client's blocking thread did not finish")
        status = 0 if ERRORS[0] == 0 else 1
    except BaseException:
        traceback.print_exc()
    finally:
        if use_libc_exit:
            libc_exit(status)
        os._exit(status)


def quiesce_fds(limit=8.0):
    """fds once the background closes are done: until the count stops falling."""
    end = now() + limit
    last = count_fds()
    while now() < end:
        time.sleep(0.5)
        n = count_fds()
        if n >= last:
            return n
        last = n
    return last


def client_main(a):
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    make_pool()
    idle_start, rss_start = count_fds(), rss_kb()
    start_signals(rng)
    threading.Thread(target=watchdog, daemon=True).start()
    threading.Thread(target=reaper, daemon=True).start()
    os.register_at_fork(after_in_child=after_fork_child)
    t0 = now()
    stop_at = t0 + a.seconds
    threads = [threading.Thread(target=client_thread, args=(stop_at, None, "thr"), daemon=True)
               for _ in range(a.threads)]
    threads.append(threading.Thread(target=poll_loop, args=(a.poll_conns, stop_at, None, "poll"),
                                    daemon=True))
    for t in threads:
        t.start()
    forks = 0
    next_fork = t0 + rng.uniform(0.5, a.fork_every)
    while now() < stop_at:
        time.sleep(min(0.2, max(0.0, stop_at - now())))
        if a.busy_forks and now() >= next_fork and now() < stop_at - 1:
            # A fork while the other threads are inside their calls.
            fork_client_child(rng, a.fork_conns)
            forks += 1
            next_fork = now() + a.fork_every * rng.uniform(0.5, 1.5)
    stuck = False
    end = stop_at + C.conn_timeout + 2 * C.grace
    for t in threads:
        t.join(max(0.0, end - now()))
        stuck |= t.is_alive()
    while CHILDREN and now() < end + C.grace:
        time.sleep(0.2)
    reap_once()
    if stuck or CHILDREN:
        record_error("hang", f"client did not finish: {sum(t.is_alive() for t in threads)} threads, "
                     f"{len(CHILDREN)} children still running",
                     active=[i.describe() for i in ACTIVE.values()])
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        for pid in CHILDREN:
            os.kill(pid, signal.SIGKILL)
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    exit_record("client", idle_start, rss_start, forks)
    if stuck:
        os._exit(1)
    sys.exit(1 if ERRORS[0] else 0)


def fclient_main(a):
    """A process that only forks: children that run a few connections
    each (a blocking thread and a poll loop), two at a time."""
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    make_pool()
    idle_start, rss_start = count_fds(), rss_kb()
    start_signals(rng)
    threading.Thread(target=watchdog, daemon=True).start()
    threading.Thread(target=reaper, daemon=True).start()
    os.register_at_fork(after_in_child=after_fork_child)
    stop_at = now() + a.seconds
    forks = 0
    while now() < stop_at:
        if len(CHILDREN) < a.children:
            fork_client_child(rng, a.fork_conns)
            forks += 1
        else:
            time.sleep(0.05)
    end = now() + C.conn_timeout * 2 + 3 * C.grace
    while CHILDREN and now() < end:
        time.sleep(0.2)
    reap_once()
    if CHILDREN:
        record_error("hang", f"forking client: {len(CHILDREN)} children still running")
        for pid in CHILDREN:
            os.kill(pid, signal.SIGKILL)
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    exit_record("fclient", idle_start, rss_start, forks)
    sys.exit(1 if ERRORS[0] else 0)


# ---------------------------------------------------------------- server

def serve_blocking(sock, rng, style):
    info = ConnInfo("server", style)
    info.sock = sock
    buf = get_buf()
    try:
        set_timeouts(sock, C.conn_timeout)
        Blocking(sock, info, rng, buf).run(server_gen(info, rng))
        conn_done(info, sock)
    except Exception as e:
        conn_failed(info, e)
    finally:
        ACTIVE.pop(info.key, None)
        put_buf(buf)
        sock.close()


def fork_server_child(sock, rng):
    pid = os.fork()
    if pid:
        CHILDREN[pid] = [now(), "server", now() + C.conn_timeout + 2 * C.grace, False]
        sock.close()  # the child's now (it uses it first)
        return
    status = 2
    use_libc_exit = rng.random() < 0.5
    try:
        child_start(rng)
        if rng.random() < 0.5:
            for lst in C.listeners:
                lst.close()
        serve_blocking(sock, rng, "fork")
        status = 0 if ERRORS[0] == 0 else 1
    except BaseException:
        traceback.print_exc()
    finally:
        if use_libc_exit:
            libc_exit(status)
        os._exit(status)


def epoll_server(lsock, stopping):
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    buf = get_buf()
    ep = select.epoll()
    lfd = lsock.fileno()
    lsock.setblocking(False)
    ep.register(lfd, select.EPOLLIN)
    accepting = True
    conns = {}  # fd -> [sock, nb, mask or None (edge-triggered)]

    def finish(fd, err=None):
        sock, nb, _ = conns.pop(fd)
        if rng.random() < 0.5:
            ep.unregister(fd)  # else closing the fd ends the registration
        if err is None:
            conn_done(nb.info, sock)
        else:
            conn_failed(nb.info, err)
        ACTIVE.pop(nb.info.key, None)
        sock.close()

    def step(fd):
        c = conns[fd]
        nb = c[1]
        try:
            nb.progress()
            if nb.finished:
                finish(fd)
                return
            if c[2] is not None:
                want = nb.interest()
                if want != c[2]:
                    ep.modify(fd, want)
                    c[2] = want
        except Exception as e:
            finish(fd, e)

    while True:
        if stopping() and accepting:
            ep.unregister(lfd)
            accepting = False
        if not accepting and not conns:
            break
        for fd, ev in ep.poll(0.2):
            if fd == lfd:
                if not accepting:
                    continue
                while True:
                    try:
                        sock, _ = lsock.accept()
                    except BlockingIOError:
                        break
                    except OSError as e:
                        record_error("accept", f"epoll accept: errno {e.errno} ({e.strerror})")
                        break
                    sock.setblocking(False)
                    et = C.epoll_et and rng.random() < 0.5
                    info = ConnInfo("server", "epoll-et" if et else "epoll-lt")
                    info.sock = sock
                    nb = NonBlocking(sock, info, rng, buf, server_gen(info, rng))
                    fd2 = sock.fileno()
                    if et:
                        ep.register(fd2, select.EPOLLIN | select.EPOLLOUT | select.EPOLLET)
                        conns[fd2] = [sock, nb, None]
                    else:
                        ep.register(fd2, select.EPOLLIN)
                        conns[fd2] = [sock, nb, select.EPOLLIN]
                    try:
                        nb.begin()
                    except Exception as e:
                        finish(fd2, e)
                        continue
                    step(fd2)
            elif fd in conns:
                step(fd)
        t = now()
        for fd, c in list(conns.items()):
            info = c[1].info
            if t > info.deadline or info.hung:
                finish(fd, SoakError("timeout", f"no end after {t - info.start:.0f} s "
                                     f"(stage {info.stage}; epoll mask {c[2]})"))
    put_buf(buf)
    ep.close()


def listen_socket():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("127.0.0.1", 0))
    s.listen(128)
    return s


def write_ready(port):
    ready = os.path.join(C.work, f"{C.name}.ready")
    with open(ready + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "port": port}, f)
    os.rename(ready + ".tmp", ready)


def exit_record(role, idle_start, rss_start, forks):
    Rec.write({"t": "exit", "role": role, "signals": SIGS[0], "sig_restart": C.sig_restart,
               "sig_interval": C.sig_interval, "ok": OK[0], "errors": ERRORS[0], "forks": forks,
               "idle_fds_start": idle_start, "idle_fds_end": quiesce_fds(),
               "rss_start": rss_start, "rss_end": rss_kb()})


def server_main(a):
    """Blocking accept in the main thread; a thread per connection, or
    accept-then-fork for some."""
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    make_pool()
    lthr = listen_socket()
    C.listeners = [lthr]
    prefill_bufs(8)
    idle_start, rss_start = count_fds(), rss_kb()
    signal.signal(signal.SIGTERM, on_term)
    start_signals(rng)
    threading.Thread(target=watchdog, daemon=True).start()
    threading.Thread(target=reaper, daemon=True).start()
    os.register_at_fork(after_in_child=after_fork_child)
    write_ready(lthr.getsockname()[1])
    handlers = []
    forks = 0
    try:
        while not STOP_REQ[0]:
            try:
                IN_ACCEPT[0] = True
                try:
                    sock, _ = lthr.accept()
                finally:
                    IN_ACCEPT[0] = False
            except OSError as e:
                record_error("accept", f"blocking accept: errno {e.errno} ({e.strerror})")
                time.sleep(0.1)
                continue
            if rng.random() < a.fork_ratio:
                forks += 1
                fork_server_child(sock, random.Random(rng.random()))
            else:
                t = threading.Thread(target=serve_blocking,
                                     args=(sock, random.Random(rng.random()), "thr"), daemon=True)
                t.start()
                handlers.append(t)
                if len(handlers) > 64:
                    handlers = [h for h in handlers if h.is_alive()]
    except Stop:
        pass
    end = now() + C.conn_timeout + 2 * C.grace
    stuck = False
    for t in handlers:
        t.join(max(0.0, end - now()))
        stuck |= t.is_alive()
    while CHILDREN and now() < end:
        time.sleep(0.2)
    reap_once()
    if stuck or CHILDREN:
        record_error("hang", "server did not finish its connections",
                     active=[i.describe() for i in ACTIVE.values()], children=list(CHILDREN))
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    lthr.close()
    exit_record("server", idle_start, rss_start, forks)
    if stuck:
        os._exit(1)
    sys.exit(1 if ERRORS[0] else 0)


def forkserver_main(a):
    """The classic accept-then-fork server: one thread accepts and forks a
    child per connection, and closes its own copy."""
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    make_pool()
    lsock = listen_socket()
    C.listeners = [lsock]
    idle_start, rss_start = count_fds(), rss_kb()
    signal.signal(signal.SIGTERM, on_term)
    start_signals(rng)
    threading.Thread(target=watchdog, daemon=True).start()
    threading.Thread(target=reaper, daemon=True).start()
    os.register_at_fork(after_in_child=after_fork_child)
    write_ready(lsock.getsockname()[1])
    forks = 0
    try:
        while not STOP_REQ[0]:
            try:
                IN_ACCEPT[0] = True
                try:
                    sock, _ = lsock.accept()
                finally:
                    IN_ACCEPT[0] = False
            except OSError as e:
                record_error("accept", f"blocking accept: errno {e.errno} ({e.strerror})")
                time.sleep(0.1)
                continue
            forks += 1
            fork_server_child(sock, random.Random(rng.random()))
    except Stop:
        pass
    end = now() + C.conn_timeout + 3 * C.grace
    while CHILDREN and now() < end:
        time.sleep(0.2)
    reap_once()
    if CHILDREN:
        record_error("hang", f"fork server: {len(CHILDREN)} children still running")
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    lsock.close()
    exit_record("forkserver", idle_start, rss_start, forks)
    sys.exit(1 if ERRORS[0] else 0)


def epserver_main(a):
    """One thread: a nonblocking epoll loop, each connection level- or
    edge-triggered."""
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    make_pool()
    lep = listen_socket()
    idle_start, rss_start = count_fds(), rss_kb()
    signal.signal(signal.SIGTERM, on_term)
    start_signals(rng)
    threading.Thread(target=watchdog, daemon=True).start()
    write_ready(lep.getsockname()[1])
    epoll_server(lep, lambda: STOP_REQ[0])
    signal.setitimer(signal.ITIMER_REAL, 0, 0)
    lep.close()
    exit_record("epserver", idle_start, rss_start, 0)
    sys.exit(1 if ERRORS[0] else 0)


def worker(a):
    C.name, C.role, C.work = a.name, a.cmd, a.work
    C.mode = os.environ.get("SDP_ZCOPY", "off")
    C.conn_timeout = a.conn_timeout
    faulthandler.enable(file=sys.stderr, all_threads=True)
    faulthandler.register(signal.SIGUSR2, file=sys.stderr, all_threads=True)
    C.max_read = a.max_read
    C.max_waitall = a.max_waitall
    if a.cmd == "server":
        server_main(a)
    elif a.cmd == "epserver":
        C.epoll_et = a.epoll_et
        epserver_main(a)
    elif a.cmd == "forkserver":
        forkserver_main(a)
    elif a.cmd == "fclient":
        C.ports = dict(zip(["thr", "epoll", "fork"], map(int, a.ports.split(","))))
        fclient_main(a)
    else:
        C.ports = dict(zip(["thr", "epoll", "fork"], map(int, a.ports.split(","))))
        client_main(a)


# ---------------------------------------------------------------- driver

class Proc:
    def __init__(self, name, role, mode, popen, log_out, log_err, preload_log):
        self.name, self.role, self.mode, self.p = name, role, mode, popen
        self.out, self.err, self.preload_log = log_out, log_err, preload_log
        self.samples = []  # (t, fds, rss_kb, threads)
        self.killed = False

    def sample(self, t):
        pid = self.p.pid
        try:
            fds = len(os.listdir(f"/proc/{pid}/fd"))
            rss, thr = -1, -1
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        rss = int(line.split()[1])
                    elif line.startswith("Threads:"):
                        thr = int(line.split()[1])
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
            self.samples.append((t, fds, rss, thr))
        except (OSError, IndexError, ValueError):
            pass


def tail(path, n=40):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no file)\n"


def native_stacks(pid):
    """Every thread's native stack (gdb), without the Rust std and
    CPython interpreter frames."""
    noise = ("std::", "core::", "_PyEval", "pycore_", "ceval", "methodobject.c", "call.c",
             "classobject.c", "thread_run", "pythread", "start_thread", "clone3", "pymain",
             "libc_start", "_start ()", "pythonrun", "Modules/main.c", "Py_RunMain", "Py_BytesMain",
             "PyObject_Vectorcall", "_PyObject_Vectorcall", "cfunction_vectorcall", "method_vectorcall")
    try:
        r = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 40"],
                           capture_output=True, text=True, timeout=120)
        return "\n".join(l[:240] for l in r.stdout.splitlines()
                         if l.startswith(("#", "Thread")) and not any(n in l for n in noise))
    except (OSError, subprocess.TimeoutExpired):
        return "(gdb not available or timed out)"


def stop_proc(pr, sig, wait, problems):
    """Signals a worker and waits (bounded); a stuck one gets its stacks
    dumped (Python and native) and is killed with its process group."""
    if pr.p.poll() is None and sig is not None:
        pr.p.send_signal(sig)
    try:
        pr.p.wait(timeout=wait)
        return
    except subprocess.TimeoutExpired:
        pass
    pr.killed = True
    msg = f"{pr.name} (pid {pr.p.pid}) still running after {wait:.0f} s: killed"
    try:
        os.kill(pr.p.pid, signal.SIGUSR2)  # faulthandler: Python stacks to its .err log
        time.sleep(1.0)
    except ProcessLookupError:
        pass
    stacks = native_stacks(pr.p.pid) if shutil_which("gdb") else "(no gdb)"
    kill_group(pr)
    problems.append(f"{msg}\n--- native stacks:\n{stacks}\n--- {pr.err} (tail):\n{tail(pr.err, 80)}")


def shutil_which(cmd):
    return any(os.access(os.path.join(d, cmd), os.X_OK)
               for d in os.environ.get("PATH", "").split(os.pathsep) if d)


def kill_group(pr):
    try:
        os.killpg(pr.p.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        pr.p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def spawn(a, name, role, mode, args, procs):
    logs = os.path.join(a.work, "logs")
    env = dict(os.environ)
    # glibc raises its mmap threshold to the largest block freed (up to 32
    # MiB); with the workers' transient buffers of up to 16 MiB in many
    # threads, the heaps then grow for a long time: fixed, RSS shows what
    # is kept.
    env.setdefault("MALLOC_MMAP_THRESHOLD_", "131072")
    env.update({"SDP_ZCOPY": mode, "SDP_LOG": os.environ.get("SOAK_SDP_LOG", "info"),
                "SDP_LOG_FILE": os.path.join(logs, f"{name}.preload.log"),
                "SDP_STAT_DIR": os.path.join(a.work, "stat"), "PYTHONUNBUFFERED": "1",
                "PYTHONFAULTHANDLER": "1"})
    out = os.path.join(logs, f"{name}.out")
    err = os.path.join(logs, f"{name}.err")
    cmd = [os.path.join(a.bin, "sdprun"), a.python, os.path.abspath(__file__), role,
           "--name", name, "--work", a.work, "--conn-timeout", str(a.conn_timeout)] + args
    with open(out, "w") as fo, open(err, "w") as fe:
        p = subprocess.Popen(cmd, env=env, stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                             start_new_session=True)
    pr = Proc(name, role, mode, p, out, err, env["SDP_LOG_FILE"])
    procs.append(pr)
    with open(os.path.join(a.work, "pgids"), "a") as f:
        f.write(f"{p.pid}\n")
    return pr


def warmup(secs):
    """Seconds of warm-up before the levels count: a minute, or half of a
    short run."""
    return 60.0 if secs >= 240 else 0.5 * secs


def growth(pr, secs):
    """Levels of fds and RSS over the load after warm-up, in three windows
    of equal time: the fewest fds of each (the moments with the fewest
    connections open) and the median RSS of each; with the peaks."""
    s = [x for x in pr.samples if warmup(secs) <= x[0] <= secs]
    if len(s) < 3:
        s = [x for x in pr.samples if x[0] <= secs] or pr.samples
    if not s:
        return None
    t0, t1 = s[0][0], s[-1][0]
    third = max((t1 - t0) / 3, 1e-9)
    win = [[x for x in s if t0 + i * third <= x[0] <= t0 + (i + 1) * third + 1e-6] or [s[-1]]
           for i in range(3)]
    med = statistics.median
    return {"fd": [min(x[1] for x in w) for w in win], "fd_first_max": max(x[1] for x in win[0]),
            "rss": [med(x[2] for x in w) for w in win],
            "thr": [med(x[3] for x in w) for w in win],
            "fd_peak": max(x[1] for x in pr.samples), "rss_peak": max(x[2] for x in pr.samples),
            "n": len(s), "series_fd": [x[1] for x in s], "series_rss": [x[2] // 1024 for x in s]}


def load_results(work):
    recs = []
    d = os.path.join(work, "results")
    for fn in sorted(os.listdir(d)):
        with open(os.path.join(d, fn), errors="replace") as f:
            for line in f:
                try:
                    recs.append(json.loads(line))
                except ValueError:
                    recs.append({"t": "error", "kind": "bad-record", "msg": line[:200], "proc": fn})
    return recs


def fmt_bytes(n):
    for unit in ["B", "KiB", "MiB", "GiB", "TiB"]:
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024


def drive(a):
    a.work = os.path.abspath(a.work)
    for d in ("logs", "results", "stat"):
        os.makedirs(os.path.join(a.work, d), exist_ok=True)
    secs = a.minutes * 60.0
    procs, problems = [], []
    servers, clients = [], []
    modes = a.modes.split(",")
    t_start = now()
    snapshots = {"n": 0, "sdp": 0, "tcp": 0, "undecided": 0, "tcp_why": {}, "failed": 0}

    def on_signal(signum, frame):
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    try:
        busy = set(a.busy_fork_modes.split(",")) if a.busy_fork_modes else set()
        for mode in modes:
            cap = caps(a, mode)
            ratio = a.server_fork_ratio if mode in busy else 0.0
            servers.append(spawn(a, f"srv-{mode}", "server", mode,
                                 ["--fork-ratio", str(ratio)] + cap, procs))
            servers.append(spawn(a, f"eps-{mode}", "epserver", mode,
                                 cap + (["--epoll-et"] if a.epoll_et else []), procs))
            servers.append(spawn(a, f"fsv-{mode}", "forkserver", mode, cap, procs))
        for pr in servers:
            ready = os.path.join(a.work, f"{pr.name}.ready")
            end = now() + 30
            while not os.path.exists(ready) and pr.p.poll() is None and now() < end:
                time.sleep(0.05)
            if not os.path.exists(ready):
                raise SystemExit(f"soak: {pr.name} did not start:\n{tail(pr.err)}")
            with open(ready) as f:
                pr.port = json.load(f)["port"]
        t_load = now()
        ports = {pr.name: pr.port for pr in servers}
        for mode in modes:
            common = ["--ports", ",".join(str(ports[f"{k}-{mode}"]) for k in ("srv", "eps", "fsv")),
                      "--seconds", str(secs), "--fork-conns", str(a.fork_conns)] + caps(a, mode)
            clients.append(spawn(a, f"cli-{mode}", "client", mode, common +
                                 ["--threads", str(a.threads), "--poll-conns", str(a.poll_conns),
                                  "--fork-every", str(a.fork_every)] +
                                 (["--busy-forks"] if mode in busy else []), procs))
            clients.append(spawn(a, f"fcl-{mode}", "fclient", mode, common +
                                 ["--children", str(a.fork_children)], procs))
        print(f"soak: {len(servers)} servers and {len(clients)} clients running for "
              f"{secs:.0f} s (SDP_ZCOPY {'/'.join(modes)}); logs in {a.work}/logs", flush=True)
        client_end = t_load + secs + a.conn_timeout + 60
        next_snap = now() + 5
        next_note = now() + 60
        while any(c.p.poll() is None for c in clients) and now() < client_end:
            t = now() - t_load
            for pr in procs:
                if pr.p.poll() is None:
                    pr.sample(t)
            if now() >= next_snap:
                next_snap = now() + 10
                take_snapshot(a, snapshots)
            if now() >= next_note:
                next_note = now() + 60
                ok = sum(1 for r in load_results(a.work) if r.get("t") == "conn" and r["side"] == "client")
                errs = sum(1 for r in load_results(a.work) if r.get("t") == "error")
                print(f"soak: {t / 60:.1f} min: {ok} connections done, {errs} errors", flush=True)
            for pr in servers:
                if pr.p.poll() is not None:
                    problems.append(f"{pr.name} exited early ({pr.p.returncode}):\n{tail(pr.err)}")
                    servers.remove(pr)
                    break
            time.sleep(a.sample_every)
        t_stop = now() - t_load
        for pr in clients:
            stop_proc(pr, None, max(1.0, client_end - now()), problems)
        for pr in servers:
            pr.sample(now() - t_load)
        for pr in servers:
            stop_proc(pr, signal.SIGTERM, a.conn_timeout + 45, problems)
    except KeyboardInterrupt as e:
        print(f"soak: interrupted ({e or 'SIGINT'}); stopping the workers", file=sys.stderr)
        for pr in procs:
            kill_group(pr)
        return 130
    finally:
        for pr in procs:
            if pr.p.poll() is None:
                kill_group(pr)
    return report(a, procs, problems, snapshots, secs, t_stop, now() - t_start)


def waitall_cap(a, mode):
    """The largest MSG_WAITALL read. With Read Zcopy, a blocking
    recv(MSG_WAITALL) above the Bcopy threshold that a signal interrupts
    after part of its data came returns EINTR and drops that part (the
    retried call gets the stream's later bytes); unless --zcopy-waitall
    such reads stay at the threshold with SDP_ZCOPY read or both."""
    if mode in ("read", "both") and not a.zcopy_waitall:
        return 256 << 10
    return MAX_MSG


def caps(a, mode):
    return ["--max-read", str(read_cap(a, mode)), "--max-waitall", str(waitall_cap(a, mode))]


def read_cap(a, mode):
    """The largest read a receiver posts. With Write Zcopy (SDP_ZCOPY write
    or both), reads above the Bcopy threshold (256K) are advertised by
    SinkAvail; a peer sending by Bcopy meanwhile aborts the connection
    ("SinkAvail beyond MaxAdverts"), so unless --sink-reads they stay at
    the threshold there."""
    if mode in ("write", "both") and not a.sink_reads:
        return 256 << 10
    return MAX_MSG


def take_snapshot(a, snap):
    try:
        r = subprocess.run([os.path.join(a.bin, "sdp-stat"), "--json", "--dir",
                            os.path.join(a.work, "stat")], capture_output=True, text=True, timeout=10)
        doc = json.loads(r.stdout)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        snap["failed"] += 1
        return
    snap["n"] += 1
    for proc in doc["processes"]:
        for s in proc["sockets"]:
            if s["role"] not in ("client", "accepted"):
                continue
            if s["transport"] == "sdp":
                snap["sdp"] += 1
            elif s["transport"] == "tcp":
                snap["tcp"] += 1
                snap["tcp_why"][s["why"]] = snap["tcp_why"].get(s["why"], 0) + 1
            else:
                snap["undecided"] += 1


def report(a, procs, problems, snap, secs, t_stop, elapsed):
    recs = load_results(a.work)
    conns = [r for r in recs if r.get("t") == "conn"]
    errors = [r for r in recs if r.get("t") == "error"]
    exits = {r["pid"]: r for r in recs if r.get("t") == "exit"}
    cli = [r for r in conns if r["side"] == "client"]
    srv = [r for r in conns if r["side"] == "server"]
    fails = []
    out = []
    p = out.append

    p("")
    p("== soak summary")
    p(f"duration: {secs / 60:.2f} min of load, the last connections done after {t_stop / 60:.2f} min; "
      f"{elapsed / 60:.2f} min in all")
    # Transport, from each end's own record in the state export.
    def by_transport(rs):
        sdp = sum(1 for r in rs if r.get("transport") == "sdp")
        why = {}
        for r in rs:
            if r.get("transport") != "sdp":
                k = r.get("why", "?") if r.get("transport") == "tcp" else r.get("transport", "?")
                why[k] = why.get(k, 0) + 1
        return sdp, why
    c_sdp, c_why = by_transport(cli)
    s_sdp, s_why = by_transport(srv)
    tcp_txt = ", ".join(f"{k} {v}" for k, v in sorted(c_why.items())) or "-"
    p(f"connections: {len(cli)} (SDP: {c_sdp}, TCP: {len(cli) - c_sdp} by reason: {tcp_txt})")
    p(f"  server ends: {len(srv)} (SDP: {s_sdp}, other: "
      f"{', '.join(f'{k} {v}' for k, v in sorted(s_why.items())) or '-'})")
    if not cli:
        fails.append("no connection completed")
    if c_sdp != len(cli) or s_sdp != len(srv):
        fails.append(f"connections not over SDP: client ends {c_why}, server ends {s_why}")
    ids_c = {r["id"] for r in cli}
    ids_s = {r["id"] for r in srv}
    missing = ids_c - ids_s
    if missing:
        fails.append(f"{len(missing)} connections the client completed have no server record "
                     f"(e.g. {sorted(missing)[:3]})")
    # The preload's own log: one line per connect.
    log_sdp, log_tcp, warn = 0, {}, {}
    for pr in procs:
        try:
            with open(pr.preload_log, errors="replace") as f:
                for line in f:
                    if "-> SDP" in line:
                        log_sdp += 1
                    elif "-> TCP (" in line:
                        why = line.rsplit("-> TCP (", 1)[1].split(")")[0]
                        log_tcp[why] = log_tcp.get(why, 0) + 1
                    if " warn: " in line or " error: " in line:
                        key = " ".join(w if not any(ch.isdigit() for ch in w) else "N"
                                       for w in line.split("] ", 1)[-1].split())[:150]
                        warn[key] = warn.get(key, 0) + 1
        except OSError:
            pass
    attempts = len(cli) + sum(1 for e in errors if e.get("side") == "client" and e.get("stage") != "connect")
    p(f"preload logs: {log_sdp} connects -> SDP, {sum(log_tcp.values())} -> TCP "
      f"{log_tcp or ''} (client connections attempted: {attempts})")
    if log_tcp:
        fails.append(f"preload logs show TCP connects: {log_tcp}")
    p(f"sdp-stat snapshots: {snap['n']} taken, connection sockets seen: SDP {snap['sdp']}, "
      f"TCP {snap['tcp']} {snap['tcp_why'] or ''}, undecided {snap['undecided']}")
    if snap["tcp"]:
        fails.append(f"sdp-stat snapshots show TCP connections: {snap['tcp_why']}")
    if warn:
        p("preload warnings/errors logged:")
        for k, v in sorted(warn.items(), key=lambda kv: -kv[1])[:10]:
            p(f"  {v:6d}  {k}")
    # Coverage.
    req_b = sum(r["req"] for r in srv)
    resp_b = sum(r["resp"] for r in cli)
    p(f"bytes hashed and compared: {fmt_bytes(req_b + resp_b)} (requests {fmt_bytes(req_b)} at the "
      f"servers, responses {fmt_bytes(resp_b)} at the clients); largest message "
      f"{fmt_bytes(max([r['req'] for r in srv] + [r['resp'] for r in cli] + [0]))}")
    styles = {}
    for r in conns:
        styles[r["side"] + ":" + r["style"]] = styles.get(r["side"] + ":" + r["style"], 0) + 1
    p("by style: " + ", ".join(f"{k} {v}" for k, v in sorted(styles.items())))
    dup = sum(1 for r in cli if r["flags"] & F_DUPLEX)
    p(f"duplex connections: {dup}; clients closing by shutdown(SHUT_WR): "
      f"{sum(1 for r in cli if r['flags'] & F_SHUTWR)}")
    p("by Zcopy mode (bytes sent by mechanism, both ends, as the state export last showed them; "
      "of the Bcopy bytes, those written into the peer's memory on the same-host path; Zcopy "
      "messages sent):")
    p(f"  {'mode':5} {'conns':>6} {'Bcopy':>11} {'same host':>11} {'Read Zcopy':>11} {'Write Zcopy':>11} "
      f"{'SrcAvail':>9} {'SinkAvail':>9} {'SendSm':>7} {'cancels':>7}")
    local_total = 0
    for mode in a.modes.split(","):
        rs = [r for r in conns if r.get("mode") == mode and r.get("bytes")]
        b = [sum(r["bytes"][i] for r in rs) for i in range(6)]
        m = [sum(r["msgs"][i] for r in rs) for i in range(5)]
        local = sum(r.get("local", [0, 0])[0] for r in rs)
        local_total += local
        n = sum(1 for r in cli if r.get("mode") == mode)
        p(f"  {mode:5} {n:6d} {fmt_bytes(b[0]):>11} {fmt_bytes(local):>11} {fmt_bytes(b[2]):>11} "
          f"{fmt_bytes(b[4]):>11} {m[0]:9d} {m[1]:9d} {m[2]:7d} {m[3]:7d}")
        if n == 0:
            fails.append(f"no connection completed with SDP_ZCOPY={mode}")
        elif (mode == "read" or mode == "both" and a.sink_reads) and b[2] == 0:
            fails.append(f"SDP_ZCOPY={mode}: no byte went by Read Zcopy")
        elif mode in ("write", "both") and a.sink_reads and b[4] == 0:
            fails.append(f"SDP_ZCOPY={mode}: no byte went by Write Zcopy")
    # Every process runs on this host: unless it is turned off, the
    # same-host path carries the large messages (DESIGN §9).
    if os.environ.get("SDP_LOCAL", "on") != "off" and local_total == 0:
        fails.append("no byte went by the same-host path (SDP_LOCAL is not off)")
    if not a.sink_reads and any(m in ("write", "both") for m in a.modes.split(",")):
        p("  (write, both: reads of at most 256K, so no SinkAvail and no Write Zcopy, and "
          "SrcAvails are answered by SendSm; --sink-reads posts larger ones)")
    # Processes.
    warm = warmup(secs)
    # Growth over the load is judged once it lasts two minutes past the
    # warm-up; the idle fds (no connection open) always.
    judged = secs - warm >= 120
    if not judged:
        p("(a run this short shows the levels; growth is judged from 3 minutes on, the idle fds always)")
    p(f"processes (fds and RSS sampled every {a.sample_every:g} s; after {warm:.0f} s of warm-up "
      f"the load is cut in three windows: fds are each window's fewest, RSS its median; "
      f"idle: fds with no connection, at the start and at the end):")
    p(f"  {'name':9} {'pid':>7} {'fds':>14} {'peak':>5} {'idle':>7} {'RSS MiB':>15} {'peak':>5} "
      f"{'threads':>7} {'signals':>8}  verdict")
    for pr in procs:
        g = growth(pr, secs)
        ex = exits.get(pr.p.pid, {})
        if g is None:
            p(f"  {pr.name:9} {pr.p.pid:7d} no samples")
            fails.append(f"{pr.name}: no samples")
            continue
        verdict = []
        f0, f1, f2 = g["fd"]
        r0, r1, r2 = g["rss"]
        if judged:
            # The fewest fds of the last window above the most of the first
            # (connections open make the count swing).
            if f2 - f0 > a.fd_slack and f1 >= f0 and f2 > g["fd_first_max"]:
                verdict.append(f"leak? fds +{f2 - f0:g}")
            if r2 - r0 > 0.2 * r0 and r2 - r0 > 16 * 1024 and r2 > r1:
                verdict.append(f"leak? RSS +{(r2 - r0) / 1024:.0f} MiB")
        idle = ""
        if ex:
            idle = f"{ex['idle_fds_start']}→{ex['idle_fds_end']}"
            if ex["idle_fds_end"] - ex["idle_fds_start"] > a.fd_slack:
                verdict.append(f"leak? idle fds {idle}")
        if verdict:
            fails.append(f"{pr.name}: {'; '.join(verdict)}\n    fds: {g['series_fd']}\n"
                         f"    RSS MiB: {g['series_rss']}")
        fds = "→".join(f"{v:g}" for v in g["fd"])
        rss = "→".join(f"{v / 1024:.0f}" for v in g["rss"])
        thr = "→".join(f"{v:g}" for v in (g["thr"][0], g["thr"][2]))
        p(f"  {pr.name:9} {pr.p.pid:7d} {fds:>14} {g['fd_peak']:5d} {idle:>7} {rss:>15} "
          f"{g['rss_peak'] / 1024:5.0f} {thr:>7} {ex.get('signals', 0):8d}  "
          f"{'; '.join(verdict) or 'ok'}")
        if pr.p.returncode not in (0, None) and not pr.killed:
            fails.append(f"{pr.name} exited with {pr.p.returncode}\n{tail(pr.err, 30)}")
        if not ex and not pr.killed:
            fails.append(f"{pr.name} wrote no exit record\n{tail(pr.err, 30)}")
    forks = sum(e.get("forks", 0) for e in exits.values())
    p(f"forks: {forks} (accept-then-fork servers and forking clients); signals with SA_RESTART in "
      f"{sum(1 for e in exits.values() if e.get('sig_restart'))} of {len(exits)} processes")
    # Errors; the foreign bytes of a mismatch named by their stream.
    streams = {}
    for r in recs:
        if r.get("t") == "conn":
            q = {"id": r.get("id"), "req_seed": r.get("req_seed"), "resp_seed": r.get("resp_seed"),
                 "req_len": r.get("req"), "resp_len": r.get("resp")}
        elif r.get("t") == "error" and r.get("params"):
            q = r["params"]
        else:
            continue
        for d in ("req", "resp"):
            if q.get(f"{d}_seed") is not None and q.get(f"{d}_len"):
                off, t = stream_place(q[f"{d}_seed"])
                streams[(q["id"], d)] = (off, t, q[f"{d}_len"], r.get("proc"), r.get("start"))
    for e in errors:
        src = (e.get("details") or {}).get("got_is") or {}
        if "table" in src:
            x = src["pool_offset"]
            e["got_from"] = [
                f"{'request' if d == 'req' else 'response'} of connection {cid} "
                f"(client pid {cid >> 32 if cid else '?'}), its byte {x - off}"
                for (cid, d), (off, t, n, proc, st) in streams.items()
                if t == src["table"] and off <= x < off + n][:5] or ["no known stream"]
    p(f"errors: {len(errors)}")
    by_kind = {}
    for e in errors:
        by_kind.setdefault(e["kind"], []).append(e)
    for kind, es in sorted(by_kind.items()):
        p(f"  {kind}: {len(es)}")
        for e in es[:a.show_errors]:
            p("    " + json.dumps(e)[:1500])
    if errors:
        fails.append(f"{len(errors)} errors")
    fails.extend(problems)
    p("")
    if fails:
        p("FAIL:")
        for f in fails:
            p("  - " + f.replace("\n", "\n    "))
    else:
        p("PASS")
    text = "\n".join(out)
    print(text, flush=True)
    with open(os.path.join(a.work, "summary.txt"), "w") as f:
        f.write(text + "\n")
    return 1 if fails else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("drive")
    d.add_argument("--minutes", type=float, required=True)
    d.add_argument("--work", required=True)
    d.add_argument("--bin", required=True)
    d.add_argument("--python", default=sys.executable)
    d.add_argument("--modes", default=",".join(MODES))
    d.add_argument("--threads", type=int, default=8, help="blocking client threads per client")
    d.add_argument("--poll-conns", type=int, default=8, help="connections of each client's poll loop")
    d.add_argument("--fork-every", type=float, default=5.0,
                   help="seconds between the busy client's forks (--busy-fork-modes)")
    d.add_argument("--fork-children", type=int, default=2,
                   help="children of each forking client at a time")
    d.add_argument("--busy-fork-modes", default=",".join(MODES),
                   help="modes whose threaded server and client also fork while their other "
                        "threads are in calls ('' for none)")
    d.add_argument("--fork-conns", type=int, default=4, help="connections of a forked client")
    d.add_argument("--server-fork-ratio", type=float, default=0.125)
    d.add_argument("--conn-timeout", type=float, default=60.0)
    d.add_argument("--sample-every", type=float, default=2.0)
    d.add_argument("--fd-slack", type=float, default=16)
    d.add_argument("--show-errors", type=int, default=5)
    d.add_argument("--epoll-et", action="store_true",
                   help="half of the epoll server's connections edge-triggered")
    d.add_argument("--zcopy-waitall", action=argparse.BooleanOptionalAction, default=True,
                   help="MSG_WAITALL reads above 256K with SDP_ZCOPY read/both too")
    d.add_argument("--sink-reads", action=argparse.BooleanOptionalAction, default=True,
                   help="reads above 256K with SDP_ZCOPY write/both too (SinkAvail)")
    for role in ("server", "epserver", "forkserver", "client", "fclient"):
        w = sub.add_parser(role)
        w.add_argument("--name", required=True)
        w.add_argument("--work", required=True)
        w.add_argument("--conn-timeout", type=float, default=60.0)
        w.add_argument("--max-read", type=int, default=MAX_MSG)
        w.add_argument("--max-waitall", type=int, default=MAX_MSG)
        if role == "server":
            w.add_argument("--fork-ratio", type=float, default=0.125)
        elif role == "epserver":
            w.add_argument("--epoll-et", action="store_true")
        elif role in ("client", "fclient"):
            w.add_argument("--ports", required=True)
            w.add_argument("--seconds", type=float, required=True)
            w.add_argument("--threads", type=int, default=8)
            w.add_argument("--poll-conns", type=int, default=8)
            w.add_argument("--fork-every", type=float, default=5.0)
            w.add_argument("--fork-conns", type=int, default=4)
            w.add_argument("--busy-forks", action="store_true")
            w.add_argument("--children", type=int, default=2)
    a = ap.parse_args()
    if a.cmd == "drive":
        sys.exit(drive(a))
    worker(a)


if __name__ == "__main__":
    main()
