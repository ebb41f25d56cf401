//! Real programs under `libsdp_preload.so` with a port mapper of their own
//! ([`PortMapper`]): their connections run over SDP, and must give exactly
//! what they give over TCP. The state export must say SDP (and, for the
//! connections that fell back, TCP and why). Readiness of servers is a line
//! they print, never a sleep.

use sdp_tests::portmapper::PortMapper;
use sdp_tests::preload::{
    artifacts, command, python, python_command, require, run_ok, Background, Mode, TempDir,
};
use sdp_tests::programs;
use sdp_tests::statfile::{self, StatFile};
use std::io::BufRead;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

// Values of the state export (docs/preload.md).
const TCP: u8 = 1;
const SDP: u8 = 2;
const CLIENT: u8 = 1;
const LISTENER: u8 = 2;
const ACCEPTED: u8 = 3;
const REASON_NONE: u8 = 0;
const REASON_PM_DENY: u8 = 3;
const REASON_PM_UNREACHABLE: u8 = 5;
const REASON_REFUSED: u8 = 6;
const REASON_MPA_REJECT: u8 = 7;
const REASON_PEER_TCP: u8 = 11;

/// Reads the program's lines up to the one containing `needle`: (the lines
/// before, that line).
fn lines_until(bg: &mut Background, needle: &str) -> (Vec<String>, String) {
    let mut before = Vec::new();
    loop {
        let mut line = String::new();
        let n = bg.stdout.read_line(&mut line).expect("read program output");
        assert!(
            n > 0,
            "program ended before printing {needle:?}; it printed:\n{}",
            before.join("")
        );
        if line.contains(needle) {
            return (before, line);
        }
        before.push(line);
    }
}

/// The numbers on a line.
fn numbers(line: &str) -> Vec<u64> {
    line.split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect()
}

/// The state of `pid` once `ok` holds for it (statistics are published
/// after the program's calls and every 200 ms), or the last one read.
fn state_when(dir: &Path, pid: u32, ok: impl Fn(&StatFile) -> bool) -> StatFile {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        let s = statfile::read(dir, pid).expect("state export file");
        if ok(&s) || Instant::now() >= until {
            return s;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The STREAM program of `preload_passthrough.rs` (epoll server,
/// nonblocking connect, MSG_PEEK, 100 MiB `sendall`, SHUT_WR, the hash
/// echoed back), holding its connections open at the end until stdin
/// closes, so the state export can be read.
const STREAM: &str = r#"
import errno, hashlib, os, selectors, socket, sys, threading
TOTAL = 100 * 1024 * 1024
BLOCK = 65536

def block(i):
    return hashlib.sha256(i.to_bytes(8, "little")).digest() * (BLOCK // 32)

srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
srv.setblocking(False)
result = {}

def server():
    sel = selectors.EpollSelector()
    sel.register(srv, selectors.EVENT_READ)
    conn = None
    h = hashlib.sha256()
    n = 0
    peeked = None
    while True:
        for key, _ in sel.select(timeout=60):
            if key.fileobj is srv:
                conn, _ = srv.accept()
                conn.setblocking(False)
                sel.unregister(srv)
                sel.register(conn, selectors.EVENT_READ)
                continue
            if peeked is None:
                peeked = conn.recv(16, socket.MSG_PEEK)
            data = conn.recv(1 << 20)
            if not data:
                sel.unregister(conn)
                result.update(peek=peeked, n=n, sha=h.hexdigest(), conn=conn)
                conn.setblocking(True)
                conn.sendall(h.hexdigest().encode())
                return
            h.update(data)
            n += len(data)

t = threading.Thread(target=server)
t.start()
c = socket.socket()
c.setblocking(False)
rc = c.connect_ex(srv.getsockname())
sel = selectors.EpollSelector()
sel.register(c, selectors.EVENT_WRITE)
ready = sel.select(timeout=60)
err = c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
c.setblocking(True)
sent = hashlib.sha256()
for i in range(TOTAL // BLOCK):
    b = block(i)
    sent.update(b)
    c.sendall(b)
c.shutdown(socket.SHUT_WR)
reply = b""
while len(reply) < 64:
    d = c.recv(100)
    if not d:
        break
    reply += d
t.join()
print("connect", rc in (0, errno.EINPROGRESS), "writable", len(ready), "so_error", err)
print("peek", len(result["peek"]) > 0 and block(0).startswith(result["peek"]))
print("received", result["n"], result["sha"])
print("sent", TOTAL, sent.hexdigest())
print("reply", reply.decode() == sent.hexdigest())
print("fds", os.getpid(), srv.fileno(), c.fileno(), result["conn"].fileno(), flush=True)
sys.stdin.read()
result["conn"].close()
c.close()
"#;

/// A pre-forking server: the parent listens and forks, the child
/// accepts and reads what the parent sends, the hash going back. Holds the
/// child's connection open until stdin closes.
const FORKED_WORKER: &str = r#"
import hashlib, os, socket, sys
TOTAL = 4 * 1024 * 1024
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(4)
pid = os.fork()
if pid == 0:
    conn, _ = srv.accept()
    h = hashlib.sha256()
    n = 0
    while n < TOTAL:
        d = conn.recv(1 << 20)
        if not d:
            break
        h.update(d)
        n += len(d)
    conn.sendall(h.hexdigest().encode())
    # One write per line: both processes share the pipe and `-u` would
    # write print's pieces one by one, interleaving them.
    os.write(1, f"worker {os.getpid()} {conn.fileno()} {n}\n".encode())
    sys.stdin.read()
    os._exit(0)
c = socket.create_connection(srv.getsockname())
data = bytes(i % 251 for i in range(TOTAL))
c.sendall(data)
reply = b""
while len(reply) < 64:
    d = c.recv(64 - len(reply))
    if not d:
        break
    reply += d
os.write(1, f"reply {reply.decode() == hashlib.sha256(data).hexdigest()}\n".encode())
os.waitpid(pid, 0)
"#;

/// A worker that only accepts (nginx's, forked from the process that
/// listened) publishes its connections' statistics and its count of SDP
/// connections, as the process that listened would: `sdp-stat` shows
/// what moved on the server's side too.
#[test]
fn a_forked_worker_publishes_what_its_connections_moved() {
    let stat = TempDir::new("sdp-forked");
    let pm = PortMapper::start();
    let mut cmd = python_command(FORKED_WORKER, Mode::Sdp, stat.path());
    pm.apply(&mut cmd).stdin(Stdio::piped());
    let mut program = Background::start(cmd);
    // Each process prints one line, in either order: the parent may read
    // the reply before the worker's line is out.
    let lines = [
        lines_until(&mut program, "").1,
        lines_until(&mut program, "").1,
    ];
    let line = |prefix: &str| {
        let l = lines.iter().find(|l| l.starts_with(prefix));
        l.unwrap_or_else(|| panic!("no {prefix:?} line in {lines:?}"))
            .clone()
    };
    let worker = line("worker ");
    let n = numbers(&worker);
    let (pid, fd, got) = (n[0] as u32, n[1] as usize, n[2]);
    const TOTAL: u64 = 4 << 20;
    assert_eq!(got, TOTAL);
    let state = state_when(stat.path(), pid, |s| {
        s.sdp_connections == 1 && s.record(fd).is_some_and(|r| r.counters[..2] == [64, TOTAL])
    });
    let r = state.record(fd).expect("the worker's connection");
    assert_eq!((r.transport, r.role), (SDP, ACCEPTED), "{r:?}");
    assert_eq!(r.counters[..2], [64, TOTAL], "{r:?}");
    assert_eq!(state.sdp_connections, 1, "{state:?}");
    assert_eq!(line("reply ").trim_end(), "reply True");
    drop(program.child.stdin.take());
    let (status, _) = program.finish();
    assert!(status.success());
}

/// A client with a socket timeout, as Python's: CPython polls the socket
/// before each `recv`, so every wait for an answer is a `poll`. Holds its
/// connection open at the end until stdin closes.
const TIMEOUT_PING_PONG: &str = r#"
import hashlib, os, socket, sys, threading
ROUNDS = 1000
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
def echo():
    a, _ = srv.accept()
    while True:
        d = a.recv(64)
        if not d:
            break
        a.sendall(d)
    a.close()
t = threading.Thread(target=echo)
t.start()
c = socket.create_connection(srv.getsockname())
c.settimeout(10)
sent, got = hashlib.sha256(), hashlib.sha256()
for i in range(ROUNDS):
    m = (b"%08d" % i) * 8
    sent.update(m)
    c.sendall(m)
    back = b""
    while len(back) < 64:
        back += c.recv(64 - len(back))
    got.update(back)
print("echoed", sent.hexdigest() == got.hexdigest())
print("fds", os.getpid(), c.fileno(), flush=True)
sys.stdin.read()
c.close()
t.join()
"#;

/// DESIGN §7 "Latency": a `poll` waiting for a connection's input polls
/// before it sleeps, as a blocking read and `epoll_wait` do; the waits
/// show in the connection's statistics (sdp-stat's WAITS POLLED/SLEPT).
/// The budget is 2 ms here, so that an answer the echo thread sends at
/// once is caught by the polling on a loaded machine too.
#[test]
fn a_poll_waiting_for_an_answer_polls_first_and_counts_its_waits() {
    let stat = TempDir::new("sdp-poll-waits");
    let pm = PortMapper::start();
    let mut cmd = python_command(TIMEOUT_PING_PONG, Mode::Sdp, stat.path());
    pm.apply(&mut cmd)
        .env("SDP_BUSY_POLL_US", "2000")
        .stdin(Stdio::piped());
    let mut program = Background::start(cmd);
    let (lines, fds) = lines_until(&mut program, "fds ");
    assert_eq!(lines[0].trim_end(), "echoed True", "{lines:?}");
    let n = numbers(&fds);
    let (pid, client) = (n[0] as u32, n[1] as usize);
    let state = state_when(stat.path(), pid, |s| {
        s.record(client)
            .is_some_and(|r| r.counters[..2] == [64_000, 64_000])
    });
    let r = state.record(client).expect("the client's record");
    assert_eq!((r.transport, r.role), (SDP, CLIENT), "{r:?}");
    assert_eq!(r.counters[..2], [64_000, 64_000], "{r:?}");
    // [polled, slept]: at most one wait per answer (none when it was
    // there before the poll), answers caught while polling; the connect's
    // waits for the MPA Reply and the HelloAck count too, two at most.
    let [polled, slept] = r.waits;
    assert!(polled > 2, "{r:?}");
    assert!(polled + slept <= 1000 + 2, "{r:?}");
    drop(program.child.stdin.take());
    let (status, _) = program.finish();
    assert!(status.success());
}

#[test]
fn python_stream_over_sdp_is_identical_to_tcp() {
    let stat = TempDir::new("sdp-stream");
    let plain = run_ok(python_command(STREAM, Mode::Plain, stat.path()));
    let plain = String::from_utf8(plain.stdout).unwrap();
    let plain: Vec<&str> = plain.lines().take(5).collect();
    assert_eq!(plain[4], "reply True", "{plain:?}");

    let pm = PortMapper::start();
    let mut cmd = python_command(STREAM, Mode::Sdp, stat.path());
    pm.apply(&mut cmd)
        .stdin(Stdio::piped())
        .stderr(Stdio::piped());
    let mut program = Background::start(cmd);
    let (lines, fds) = lines_until(&mut program, "fds ");
    assert_eq!(
        lines.iter().map(|l| l.trim_end()).collect::<Vec<_>>(),
        plain
    );
    let n = numbers(&fds);
    let (pid, srv, client, accepted) = (n[0] as u32, n[1] as usize, n[2] as usize, n[3] as usize);

    const TOTAL: u64 = 100 << 20;
    // The figures are published every SDP_STAT_INTERVAL_MS: wait for an
    // export taken after the reply, not one from between the end of the
    // bulk and the reply (a busy machine stretches that gap).
    let state = state_when(stat.path(), pid, |s| {
        s.record(client)
            .is_some_and(|r| r.counters[..2] == [TOTAL, 64])
            && s.record(accepted)
                .is_some_and(|r| r.counters[..2] == [64, TOTAL])
    });
    let l = state.record(srv).expect("listener record");
    assert_eq!((l.transport, l.role), (SDP, LISTENER));
    let c = state.record(client).expect("client record");
    assert_eq!((c.transport, c.role, c.reason), (SDP, CLIENT, REASON_NONE));
    let a = state.record(accepted).expect("accepted record");
    assert_eq!(
        (a.transport, a.role, a.reason),
        (SDP, ACCEPTED, REASON_NONE)
    );
    // Bcopy: 100 MiB one way, the 64-byte hash the other.
    assert_eq!((c.counters[0], c.counters[1]), (TOTAL, 64));
    assert_eq!((a.counters[0], a.counters[1]), (64, TOTAL));
    // DESIGN §7: the reply went straight from the program's buffer (the
    // socket took it at once); the first blocks of the bulk did too, the
    // rest waited in the staging ring while the socket was full.
    assert_eq!(a.direct[0], 64, "{a:?}");
    assert!(c.direct[0] > 0 && c.direct[0] <= TOTAL, "{c:?}");
    assert!(a.direct[1] <= TOTAL && c.direct[1] <= 64, "{a:?} {c:?}");
    // getsockname/getpeername as TCP: the listening port, not the SDP one.
    assert_eq!(a.local, l.local);
    assert_eq!(c.peer, l.local);
    assert_eq!(a.peer, c.local);

    // sdp-stat shows the same.
    let out = std::process::Command::new(&artifacts().sdp_stat)
        .arg("--dir")
        .arg(stat.path())
        .args(["--pid", &pid.to_string(), "--json"])
        .output()
        .expect("run sdp-stat");
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{json}");
    for (fd, role) in [(client, "client"), (accepted, "accepted")] {
        let needle = format!("{{\"fd\": {fd}, \"role\": \"{role}\", \"transport\": \"sdp\"");
        assert!(json.contains(&needle), "{needle} not in {json}");
    }
    assert!(json.contains("\"tx_mode\": \"combined\""), "{json}");
    assert!(json.contains(&format!("\"bcopy_tx\": {TOTAL}")), "{json}");
    assert!(json.contains("\"bcopy_tx_direct\": 64"), "{json}");
    // The process's count: its client and its accepted connection (the
    // listener is not one), written by the pass that published the
    // counters above.
    assert!(json.contains("\"sdp_connections\": 2,"), "{json}");
    let out = std::process::Command::new(&artifacts().sdp_stat)
        .arg("--dir")
        .arg(stat.path())
        .output()
        .expect("run sdp-stat");
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.contains(" client ") && l.contains(" sdp ") && l.contains("combined")),
        "{table}"
    );

    drop(program.child.stdin.take());
    let mut stderr = program.child.stderr.take().unwrap();
    let (status, _) = program.finish();
    assert!(status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut err).unwrap();
    assert_eq!(err, "", "the library logged at the default level");
}

/// Connects to a listener of its own and echoes a line; prints the pid and
/// fds, then waits until stdin closes.
const ECHO: &str = r#"
import os, socket, sys
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
c = socket.create_connection(srv.getsockname())
a, _ = srv.accept()
c.sendall(b"ok")
print("echo", a.recv(2).decode(), os.getpid(), srv.fileno(), c.fileno(), a.fileno(), flush=True)
sys.stdin.read()
"#;

#[test]
fn without_a_port_mapper_connections_fall_back_to_tcp_at_once() {
    let stat = TempDir::new("sdp-nopm");
    let mut cmd = python_command(ECHO, Mode::Sdp, stat.path());
    cmd.stdin(Stdio::piped());
    let start = Instant::now();
    let mut program = Background::start(cmd);
    let line = program.wait_for_line("echo ok");
    let elapsed = start.elapsed();
    let n = numbers(&line);
    let (pid, srv, client, accepted) = (n[0] as u32, n[1] as usize, n[2] as usize, n[3] as usize);
    let state = statfile::read(stat.path(), pid).expect("state export file");
    // The hidden SDP listener exists (not registered anywhere).
    let l = state.record(srv).unwrap();
    assert_eq!((l.transport, l.role), (SDP, LISTENER));
    // ICMP port unreachable from the port mapper's port: TCP at once.
    let c = state.record(client).unwrap();
    assert_eq!((c.transport, c.reason), (TCP, REASON_PM_UNREACHABLE));
    let a = state.record(accepted).unwrap();
    assert_eq!((a.transport, a.reason), (TCP, REASON_PEER_TCP));
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
    drop(program.child.stdin.take());
    let (status, _) = program.finish();
    assert!(status.success());
}

/// A plain (not preloaded) TCP echo server on the loopback: prints its port.
const PLAIN_SERVER: &str = r#"
import socket, sys
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
print("port", srv.getsockname()[1], flush=True)
while True:
    a, _ = srv.accept()
    d = a.recv(100)
    if d == b"quit":
        break
    a.sendall(d.upper())
    a.close()
"#;

/// Connects to 127.0.0.1:PORT `N` times (blocking or nonblocking), checks
/// the echo, prints the pid and the fds, waits for stdin to close.
const ECHO_CLIENT: &str = r#"
import os, selectors, socket, sys
port, count, nonblocking = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "nb"
fds = []
for i in range(count):
    c = socket.socket()
    if nonblocking:
        c.setblocking(False)
        c.connect_ex(("127.0.0.1", port))
        sel = selectors.EpollSelector()
        sel.register(c, selectors.EVENT_WRITE)
        assert sel.select(timeout=30)
        assert c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0
        c.setblocking(True)
    else:
        c.connect(("127.0.0.1", port))
    c.sendall(b"hello %d" % i)
    assert c.recv(100) == b"HELLO %d" % i
    fds.append(c)
print("fds", os.getpid(), *[c.fileno() for c in fds], flush=True)
sys.stdin.read()
"#;

fn client(stat: &Path, pm: &PortMapper, port: u16, count: u32, nonblocking: bool) -> Background {
    let mut cmd = python_command(ECHO_CLIENT, Mode::Sdp, stat);
    pm.apply(&mut cmd)
        .args([
            port.to_string(),
            count.to_string(),
            if nonblocking { "nb" } else { "b" }.into(),
        ])
        .stdin(Stdio::piped());
    Background::start(cmd)
}

fn stop_plain_server(port: u16) {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(b"quit").unwrap();
}

#[test]
fn a_plain_server_is_reached_over_tcp_after_pmdeny() {
    let stat = TempDir::new("sdp-deny");
    let pm = PortMapper::start();
    let mut server = Background::start(python_command(PLAIN_SERVER, Mode::Plain, stat.path()));
    let port = numbers(&server.wait_for_line("port"))[0] as u16;
    let mut c = client(stat.path(), &pm, port, 2, true);
    let n = numbers(&c.wait_for_line("fds"));
    let state = statfile::read(stat.path(), n[0] as u32).unwrap();
    for fd in &n[1..] {
        let r = state.record(*fd as usize).unwrap();
        // The first from the port mapper, the second from its cache.
        assert_eq!(
            (r.transport, r.role, r.reason),
            (TCP, CLIENT, REASON_PM_DENY)
        );
    }
    drop(c.child.stdin.take());
    assert!(c.finish().0.success());
    stop_plain_server(port);
    assert!(server.finish().0.success());
}

/// A preloaded echo server: prints its port, serves `N` connections, prints
/// the accepted fds, waits for stdin to close.
const SERVER: &str = r#"
import os, socket, sys
count = int(sys.argv[1])
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
print("port", srv.getsockname()[1], flush=True)
conns = []
for i in range(count):
    a, _ = srv.accept()
    a.sendall(a.recv(100).upper())
    conns.append(a)
print("served", os.getpid(), srv.fileno(), *[a.fileno() for a in conns], flush=True)
sys.stdin.read()
"#;

#[test]
fn plain_and_sdp_clients_of_a_preloaded_server() {
    let stat = TempDir::new("sdp-mixed");
    let pm = PortMapper::start();
    let mut cmd = python_command(SERVER, Mode::Sdp, stat.path());
    pm.apply(&mut cmd).arg("2").stdin(Stdio::piped());
    let mut server = Background::start(cmd);
    let port = numbers(&server.wait_for_line("port"))[0] as u16;

    // A plain client: TCP to P, as without the preload.
    let mut plain = python_command(ECHO_CLIENT, Mode::Plain, stat.path());
    plain.args([port.to_string(), "1".into(), "b".into()]);
    let plain = run_ok(plain);
    assert!(String::from_utf8_lossy(&plain.stdout).starts_with("fds "));
    // A preloaded client: SDP.
    let mut sdp = client(stat.path(), &pm, port, 1, false);
    let n = numbers(&sdp.wait_for_line("fds"));
    let cs = statfile::read(stat.path(), n[0] as u32).unwrap();
    let c = cs.record(n[1] as usize).unwrap();
    assert_eq!((c.transport, c.reason), (SDP, REASON_NONE));

    let s = numbers(&server.wait_for_line("served"));
    let ss = statfile::read(stat.path(), s[0] as u32).unwrap();
    let l = ss.record(s[1] as usize).unwrap();
    assert_eq!((l.transport, l.role), (SDP, LISTENER));
    let mut seen: Vec<(u8, u8)> = s[2..]
        .iter()
        .map(|fd| {
            let a = ss.record(*fd as usize).unwrap();
            assert_eq!(a.local, l.local);
            (a.transport, a.reason)
        })
        .collect();
    seen.sort_unstable();
    assert_eq!(seen, vec![(TCP, REASON_PEER_TCP), (SDP, REASON_NONE)]);
    drop(sdp.child.stdin.take());
    assert!(sdp.finish().0.success());
    drop(server.child.stdin.take());
    assert!(server.finish().0.success());
}

/// Not a preloaded program: listens on P (an echo server) and on Q, and
/// registers P→Q with the port mapper itself, so clients are sent to Q.
/// `close`: Q closes after the registration (a connection to it gets a
/// reset); `reject`: Q answers every MPA Request with an MPA reject.
const FAKE_SDP_SERVER: &str = r#"
import os, socket, sys, threading
mode, control = sys.argv[1], sys.argv[2]
p = socket.socket(); p.bind(("127.0.0.1", 0)); p.listen(8)
q = socket.socket(); q.bind(("127.0.0.1", 0)); q.listen(8)
ctl = socket.socket(socket.AF_UNIX)
ctl.connect(control)
ctl.sendall(b"REGISTER 127.0.0.1 %d %d\n" % (p.getsockname()[1], q.getsockname()[1]))
assert ctl.recv(100) == b"OK\n"
def drain(a):
    try:
        a.recv(100)
    except ConnectionResetError:
        pass  # the client resets a connection it gave up
def rejecter():
    while True:
        a, _ = q.accept()
        req = a.recv(1000)
        assert req.startswith(b"MPA ID Req Frame")
        if mode == "hold":
            # Until the test says so (a line on standard input).
            print("request", flush=True)
            sys.stdin.readline()
        # MPA Reply: key, R (reject) set, revision 2, no private data.
        a.sendall(b"MPA ID Rep Frame" + bytes([0x20, 2, 0, 0]))
        threading.Thread(target=drain, args=(a,), daemon=True).start()
if mode == "close":
    q.close()
else:
    threading.Thread(target=rejecter, daemon=True).start()
print("port", p.getsockname()[1], flush=True)
while True:
    a, _ = p.accept()
    d = a.recv(100)
    if d == b"quit":
        break
    a.sendall(d.upper())
    a.close()
"#;

fn fallback_after_pmaccept(mode: &str, nonblocking: bool, first: u8) {
    let stat = TempDir::new("sdp-fallback");
    let pm = PortMapper::start();
    let mut cmd = python_command(FAKE_SDP_SERVER, Mode::Plain, stat.path());
    cmd.arg(mode).arg(pm.control());
    let mut server = Background::start(cmd);
    let port = numbers(&server.wait_for_line("port"))[0] as u16;
    let mut c = client(stat.path(), &pm, port, 2, nonblocking);
    let n = numbers(&c.wait_for_line("fds"));
    let state = statfile::read(stat.path(), n[0] as u32).unwrap();
    let r1 = state.record(n[1] as usize).unwrap();
    let r2 = state.record(n[2] as usize).unwrap();
    // The same fd number, now plain TCP to P; the reason recorded. The
    // failure turned the cached PMAccept into a denial for the second.
    assert_eq!((r1.transport, r1.reason), (TCP, first), "{mode}");
    assert_eq!((r2.transport, r2.reason), (TCP, REASON_PM_DENY), "{mode}");
    assert_eq!(r1.peer, Some(SocketAddr::from(([127, 0, 0, 1], port))));
    drop(c.child.stdin.take());
    assert!(c.finish().0.success());
    stop_plain_server(port);
    assert!(server.finish().0.success());
}

/// A nonblocking connect, a duplicate of the fd made while it is in
/// progress, then the original closed and the exchange through the
/// duplicate.
const DUP_WHILE_CONNECTING: &str = r#"
import os, selectors, socket, sys
port = int(sys.argv[1])
c = socket.socket()
c.setblocking(False)
try:
    c.connect(("127.0.0.1", port))
except BlockingIOError:
    pass
d = socket.socket(fileno=os.dup(c.fileno()))
sel = selectors.DefaultSelector()
sel.register(c, selectors.EVENT_WRITE)
print("writable", len(sel.select(5)), flush=True)
print("SO_ERROR", c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR), flush=True)
print("dup peer is the server", d.getpeername()[1] == port, flush=True)
c.close()
d.setblocking(True)
d.sendall(b"hello")
print("reply", d.recv(100), flush=True)
"#;

#[test]
fn a_duplicate_made_during_the_fallback_is_the_same_socket() {
    let stat = TempDir::new("sdp-dup-fallback");
    let pm = PortMapper::start();
    let mut cmd = python_command(FAKE_SDP_SERVER, Mode::Plain, stat.path());
    // Q answers with an MPA reject: the socket was connected to Q, so
    // the fallback puts a fresh one on the fd number.
    cmd.arg("reject").arg(pm.control());
    let mut server = Background::start(cmd);
    let port = numbers(&server.wait_for_line("port"))[0] as u16;
    let expected = "writable 1\nSO_ERROR 0\ndup peer is the server True\nreply b'HELLO'\n";
    for _ in 0..5 {
        let mut cmd = python_command(DUP_WHILE_CONNECTING, Mode::Sdp, stat.path());
        pm.apply(&mut cmd).arg(port.to_string());
        let out = String::from_utf8(run_ok(cmd).stdout).unwrap();
        assert_eq!(out, expected);
    }
    stop_plain_server(port);
    assert!(server.finish().0.success());
}

/// A blocking connect on one thread; another thread looks at and reads
/// the same socket meanwhile. `go` lines on standard input pace it.
const READ_WHILE_CONNECTING: &str = r#"
import select, socket, sys, threading
port = int(sys.argv[1])
c = socket.socket()
def connector():
    c.connect(("127.0.0.1", port))
    c.sendall(b"hello")
a = threading.Thread(target=connector)
a.start()
sys.stdin.readline()
print("readable while connecting", select.select([c], [], [], 0)[0] == [c], flush=True)
got = []
b = threading.Thread(target=lambda: got.append(c.recv(100)))
b.start()
print("reading", flush=True)
a.join()
b.join()
print("read", got[0], flush=True)
"#;

/// The program's other threads see a connecting socket while the SDP
/// setup runs, never the setup's own bytes: a blocked `recv` gets the
/// first bytes of the connection the `connect` ends with (here, the TCP
/// fallback after an MPA reject), as over TCP.
#[test]
fn another_thread_reads_what_the_connection_brings_not_its_setup() {
    use std::io::Write;
    let stat = TempDir::new("sdp-read-connecting");
    let pm = PortMapper::start();
    let mut cmd = python_command(FAKE_SDP_SERVER, Mode::Plain, stat.path());
    cmd.arg("hold").arg(pm.control()).stdin(Stdio::piped());
    let mut server = Background::start(cmd);
    let port = numbers(&server.wait_for_line("port"))[0] as u16;
    let mut cmd = python_command(READ_WHILE_CONNECTING, Mode::Sdp, stat.path());
    pm.apply(&mut cmd)
        .arg(port.to_string())
        .stdin(Stdio::piped());
    let mut c = Background::start(cmd);
    // The client's MPA Request is in; its Reply is held.
    server.wait_for_line("request");
    let mut to_client = c.child.stdin.take().unwrap();
    writeln!(to_client, "go").unwrap();
    let line = c.wait_for_line("readable while connecting");
    assert_eq!(line, "readable while connecting False\n");
    c.wait_for_line("reading");
    writeln!(server.child.stdin.as_mut().unwrap(), "go").unwrap();
    let line = c.wait_for_line("read ");
    assert_eq!(line, "read b'HELLO'\n");
    assert!(c.finish().0.success());
    stop_plain_server(port);
    drop(server.child.stdin.take());
    assert!(server.finish().0.success());
}

#[test]
fn a_reset_on_the_sdp_port_falls_back_to_tcp_on_the_same_fd() {
    fallback_after_pmaccept("close", false, REASON_REFUSED);
    fallback_after_pmaccept("close", true, REASON_REFUSED);
}

#[test]
fn an_mpa_reject_falls_back_to_tcp_on_the_same_fd() {
    fallback_after_pmaccept("reject", false, REASON_MPA_REJECT);
    fallback_after_pmaccept("reject", true, REASON_MPA_REJECT);
}

/// Accept-then-fork server, and a forked client, over SDP (the program of
/// `preload_passthrough.rs`).
const FORKING_SERVER: &str = r#"
import os, socket, sys
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
addr = srv.getsockname()
client = os.fork()
if client == 0:
    srv.close()
    for i in range(3):
        c = socket.create_connection(addr)
        c.sendall(b"hello %d\n" % i)
        c.shutdown(socket.SHUT_WR)
        data = b""
        while True:
            d = c.recv(100)
            if not d:
                break
            data += d
        print(data.decode().strip(), flush=True)
        c.close()
    os._exit(0)
children = []
for i in range(3):
    conn, _ = srv.accept()
    child = os.fork()
    if child == 0:
        srv.close()
        line = b""
        while True:
            d = conn.recv(100)
            if not d:
                break
            line += d
        conn.sendall(line.upper()[::-1] * 1000)
        conn.close()
        os._exit(0)
    conn.close()
    children.append(child)
for c in children:
    _, status = os.waitpid(c, 0)
    assert status == 0
_, status = os.waitpid(client, 0)
print("server done", status)
"#;

/// Runs `source` with and without SDP: same output, and `sdp` connections
/// made over SDP (the library's log says so).
fn same_over_sdp(tag: &str, source: &str, sdp: usize) {
    same_over_sdp_with(tag, source, sdp, &[]);
}

/// [`same_over_sdp`] with more settings of the preload.
fn same_over_sdp_with(tag: &str, source: &str, sdp: usize, env: &[(&str, &str)]) {
    let stat = TempDir::new(tag);
    let plain = run_ok(python_command(source, Mode::Plain, stat.path()));
    let pm = PortMapper::start();
    let log = stat.path().join("sdp.log");
    let mut cmd = python_command(source, Mode::Sdp, stat.path());
    pm.apply(&mut cmd)
        .envs(env.iter().copied())
        .env("SDP_LOG", "info")
        .env("SDP_LOG_FILE", &log);
    let start = Instant::now();
    let preloaded = run_ok(cmd);
    let elapsed = start.elapsed();
    assert_eq!(
        String::from_utf8_lossy(&preloaded.stdout),
        String::from_utf8_lossy(&plain.stdout)
    );
    let log = std::fs::read_to_string(&log).unwrap();
    let over_sdp = log.lines().filter(|l| l.ends_with("-> SDP")).count();
    assert_eq!(over_sdp, sdp, "{log}");
    assert!(!log.contains("warn"), "{log}");
    // No close waited for its exit-flush deadline.
    assert!(elapsed < Duration::from_secs(5), "{elapsed:?}");
}

#[test]
fn accept_then_fork_server_over_sdp() {
    same_over_sdp("sdp-fork", FORKING_SERVER, 3);
}

/// A server thread that forks a handler for each connection while a client
/// thread of the same process waits in `select` on its own connection (the
/// shape of `socketserver.ForkingTCPServer`'s tests): the fork must leave
/// the waiting client's connection to this process — the child never uses
/// it — or the client sleeps on a connection nobody moves.
const FORK_WHILE_A_THREAD_WAITS: &str = r#"
import os, select, socket, threading
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
addr = srv.getsockname()
def serve():
    for i in range(3):
        conn, _ = srv.accept()
        if os.fork() == 0:
            data = conn.recv(100)
            conn.sendall(data.upper())
            conn.close()
            os._exit(0)
        conn.close()
        os.wait()
t = threading.Thread(target=serve)
t.start()
for i in range(3):
    c = socket.create_connection(addr)
    c.sendall(b"hello %d" % i)
    r, _, _ = select.select([c], [], [], 10)
    print(c.recv(100).decode() if r else "select timed out", flush=True)
    c.close()
t.join()
"#;

#[test]
fn a_fork_leaves_a_connection_a_thread_waits_on_to_the_parent() {
    same_over_sdp("sdp-fork-waiting", FORK_WHILE_A_THREAD_WAITS, 3);
}

/// The main thread forks, for 12 s or 200 children, while eight threads
/// are inside blocking sends and receives of up to 4 MiB on SDP
/// connections (Read Zcopy on: those calls hold a connection's lock
/// between their waits, outside the fork gate) and another makes
/// nonblocking connects in a loop. Each child makes three nonblocking
/// connects of its own, a poll for `POLLOUT` of at most 10 s each, the
/// later ones after the library's service thread in the child started
/// and published statistics (`SDP_STAT_INTERVAL_MS` 20), exchanges a
/// few bytes and `_exit`s. The soak's busy-fork client saw about one
/// connect in 800 never turn writable.
const FORK_WHILE_THREADS_ARE_IN_SDP_CALLS: &str = r#"
import os, random, select, socket, sys, threading, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(64)
addr = srv.getsockname()
stop = threading.Event()
DATA = bytes(range(256)) * 16384  # 4 MiB
def recv_exact(c, n):
    got = b""
    while len(got) < n:
        d = c.recv(n - len(got))
        if not d:
            break
        got += d
    return got
def pour(c, rng):
    while not stop.is_set():
        c.sendall(DATA[:rng.randint(1, len(DATA))])
def drain(c, rng):
    buf = bytearray(len(DATA))
    while c.recv_into(buf, rng.randint(1, len(buf))):
        pass
def handle(c):
    rng = random.Random()
    try:
        kind = c.recv(1)
        if kind == b"S":
            drain(c, rng)
        elif kind == b"R":
            pour(c, rng)
        elif kind == b"E":
            c.sendall(recv_exact(c, 5))
    except OSError:
        pass
    c.close()
def serve():
    while True:
        c, _ = srv.accept()
        threading.Thread(target=handle, args=(c,), daemon=True).start()
threading.Thread(target=serve, daemon=True).start()
def busy(i):
    # Blocking sends and receives of random sizes, most above the Bcopy
    # Threshold, so that the threads are inside SDP calls (Zcopy ones with
    # SDP_ZCOPY=read) whenever the main thread forks.
    rng = random.Random(i)
    c = socket.create_connection(addr)
    if i % 2:
        c.sendall(b"S")
        pour(c, rng)
        c.shutdown(socket.SHUT_WR)
        drain(c, rng)
    else:
        c.sendall(b"R")
        buf = bytearray(len(DATA))
        while not stop.is_set():
            c.recv_into(buf, rng.randint(1, len(buf)))
    c.close()
def connects():
    # Nonblocking connects in a loop: setups under way at the forks.
    while not stop.is_set():
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(addr)
        select.select([], [s], [], 10)
        s.close()
threads = [threading.Thread(target=busy, args=(i,)) for i in range(8)]
threads.append(threading.Thread(target=connects))
for t in threads:
    t.start()
def child():
    # Nonblocking connects of its own, the later ones after the library's
    # service thread in this process published statistics.
    for i in range(3):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(addr)
        p = select.poll()
        p.register(s, select.POLLOUT)
        if not p.poll(10000):
            return 3
        if s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR):
            return 4
        s.setblocking(True)
        s.sendall(b"Ehello")
        if recv_exact(s, 5) != b"hello":
            return 5
        s.close()
        time.sleep(0.03)
    return 0
start = time.monotonic()
forks, failed, live = 0, 0, []
def reap(pid):
    global failed
    _, status = os.waitpid(pid, 0)
    if status:
        failed += 1
        print("child %d: status %d" % (pid, os.waitstatus_to_exitcode(status)), file=sys.stderr)
while forks < 200 and time.monotonic() - start < 12:
    pid = os.fork()
    if pid == 0:
        try:
            code = child()
        except BaseException:
            code = 6
        os._exit(code)
    forks += 1
    live.append(pid)
    if len(live) == 6:
        reap(live.pop(0))
for pid in live:
    reap(pid)
stop.set()
for t in threads:
    t.join()
print("%d forks in %.1f s" % (forks, time.monotonic() - start), file=sys.stderr)
print("children whose connect did not complete:", failed)
"#;

#[test]
fn children_forked_while_threads_are_in_sdp_calls_connect() {
    let stat = TempDir::new("sdp-busy-fork");
    let pm = PortMapper::start();
    let log = stat.path().join("sdp.log");
    let mut cmd = python_command(FORK_WHILE_THREADS_ARE_IN_SDP_CALLS, Mode::Sdp, stat.path());
    pm.apply(&mut cmd)
        .env("SDP_ZCOPY", "read")
        .env("SDP_STAT_INTERVAL_MS", "20")
        .env("SDP_LOG", "info")
        .env("SDP_LOG_FILE", &log);
    let out = run_ok(cmd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "children whose connect did not complete: 0\n",
        "{stderr}"
    );
    let log = std::fs::read_to_string(&log).unwrap();
    let nonblocking = log
        .lines()
        .filter(|l| l.ends_with("(nonblocking) -> SDP"))
        .count();
    assert!(nonblocking >= 3, "{stderr}\n{log}");
    assert!(!log.contains("-> TCP"), "{log}");
}

/// `sendmsg` of two buffers is one operation on the stream: the reader,
/// already waiting, gets both in one `recv` (CPython's
/// `testRecvmsgFromSendmsg`), as over TCP.
const GATHER_WRITE: &str = r#"
import socket, threading
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
s, _ = srv.accept()
got = []
for i in range(20):
    t = threading.Thread(target=lambda: got.append(s.recv(1024)))
    t.start()
    c.sendmsg([b"Mic", b"hael Gilfix was here %2d\r\n" % i])
    t.join()
print(set(len(g) for g in got))
"#;

#[test]
fn a_gather_write_reaches_a_waiting_reader_whole() {
    same_over_sdp("sdp-gather", GATHER_WRITE, 1);
}

/// A listener's `TCP_NODELAY` goes on to the connections it accepts, as
/// the kernel passes it on: `getsockopt` says so on the accepted socket
/// (over SDP the connection came through the hidden listener); a client
/// reads what it set, before connect or not.
const NODELAY_FROM_THE_LISTENER: &str = r#"
import socket
srv = socket.socket()
srv.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
s, _ = srv.accept()
c.sendall(b"ping")
print(s.recv(4), s.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0)
print(c.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0)
# Set before connect, it stays (curl does this).
d = socket.socket()
d.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
d.connect(srv.getsockname())
print(d.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0)
"#;

#[test]
fn a_listeners_nodelay_goes_on_to_what_it_accepts() {
    same_over_sdp("sdp-nodelay", NODELAY_FROM_THE_LISTENER, 2);
}

/// `SO_RCVTIMEO` as TCP has it: set before connect, a blocking read of an
/// idle connection ends with EAGAIN; never set, it waits for the peer; a
/// listener's, set before or after `listen`, goes on to the connections it
/// accepts (over SDP through the hidden listener).
const TIMEOUTS_AS_TCP: &str = r#"
import errno, socket, struct, threading
TV = struct.pack("ll", 0, 200000)
def read(s):
    try:
        return s.recv(4)
    except OSError as e:
        return errno.errorcode[e.errno]
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(4)
c = socket.socket()
c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, TV)
c.connect(srv.getsockname())
a, _ = srv.accept()
print("set before connect:", read(c))
d = socket.create_connection(srv.getsockname())
b, _ = srv.accept()
t = threading.Timer(0.3, lambda: b.sendall(b"late"))
t.start()
print("never set:", read(d))
t.join()
timed = socket.socket()
timed.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, TV)
timed.bind(("127.0.0.1", 0))
timed.listen(2)
e = socket.create_connection(timed.getsockname())
f, _ = timed.accept()
print("the listener's:", read(f))
srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, TV)
g = socket.create_connection(srv.getsockname())
h, _ = srv.accept()
print("set after listen:", read(h))
"#;

#[test]
fn receive_timeouts_are_tcps_wherever_they_were_set() {
    same_over_sdp("sdp-timeouts", TIMEOUTS_AS_TCP, 4);
}

/// What a listener passes on as TCP's does: its `SO_RCVTIMEO` ends a
/// blocking `accept` with EAGAIN when nobody connects; its `SO_LINGER`
/// (0: an abortive close, the peer reads ECONNRESET), `SO_OOBINLINE` (the
/// urgent byte read in the stream) and keepalive hold on the connections
/// it accepts, which come through the hidden listener. A connection has
/// keepalive off unless the program turns it on, as TCP's.
const WHAT_A_LISTENER_PASSES_ON: &str = r#"
import errno, socket, struct, time
def outcome(f):
    try:
        return f()
    except OSError as e:
        return errno.errorcode[e.errno]
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, struct.pack("ll", 0, 200000))
srv.bind(("127.0.0.1", 0))
srv.listen(4)
t0 = time.monotonic()
print("accept, nobody connecting:", outcome(lambda: srv.accept()[1]))
print("waited the timeout:", time.monotonic() - t0 >= 0.19)
c = socket.create_connection(srv.getsockname())
a, _ = srv.accept()
c.sendall(b"x")
print("accepted once one came:", a.recv(1))
lst = socket.socket()
lst.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
lst.bind(("127.0.0.1", 0))
lst.listen(4)
d = socket.create_connection(lst.getsockname())
b, _ = lst.accept()
print("linger of the accepted:", struct.unpack("ii", b.getsockopt(socket.SOL_SOCKET, socket.SO_LINGER, 8)))
d.sendall(b"ping")
print(b.recv(4))
b.close()
print("after the abortive close:", outcome(lambda: d.recv(4)))
inl = socket.socket()
inl.setsockopt(socket.SOL_SOCKET, socket.SO_OOBINLINE, 1)
inl.bind(("127.0.0.1", 0))
inl.listen(4)
e = socket.create_connection(inl.getsockname())
f, _ = inl.accept()
print("oobinline of the accepted:", f.getsockopt(socket.SOL_SOCKET, socket.SO_OOBINLINE))
e.sendall(b"ab")
e.send(b"!", socket.MSG_OOB)
e.sendall(b"cd")
e.close()
got = b""
while True:
    d = f.recv(16)
    if not d:
        break
    got += d
print("read inline:", got)
keep = socket.socket()
keep.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
keep.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 77)
keep.bind(("127.0.0.1", 0))
keep.listen(4)
g = socket.create_connection(keep.getsockname())
h, _ = keep.accept()
def keepalive(s):
    return (s.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
            s.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE))
print("keepalive of the client, of the accepted:", keepalive(g), keepalive(h))
"#;

#[test]
fn a_listeners_accept_timeout_linger_oobinline_and_keepalive_are_tcps() {
    same_over_sdp("sdp-listener-options", WHAT_A_LISTENER_PASSES_ON, 4);
}

/// `splice` to and from an SDP socket moves the stream's bytes, not the
/// SDP messages the kernel socket carries (1 MiB from a pipe, hashed on
/// the other side; the other way to the end of the stream), with the
/// kernel's errors and its answers for an empty pipe, two splices into a
/// pipe before it is read each keeping its bytes; and `FIONREAD`
/// counts bytes still in the kernel socket, which a reader that took the
/// socket over leaves there between its reads.
const SPLICE_AND_FIONREAD: &str = r#"
import array, errno, fcntl, hashlib, os, socket, termios, threading, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(4)
c = socket.create_connection(srv.getsockname())
a, _ = srv.accept()
# 1 MiB from a pipe into the socket by splice, a writer thread feeding
# the pipe; read back and hashed on the other side.
data = bytes(i % 251 for i in range(1 << 20))
r, w = os.pipe()
def feed():
    os.write(w, data)
    os.close(w)
t = threading.Thread(target=feed)
t.start()
got = []
def drain(total):
    h, n = hashlib.sha256(), 0
    while n < total:
        d = a.recv(65536)
        if not d:
            break
        h.update(d)
        n += len(d)
    got.append((n, h.hexdigest() == hashlib.sha256(data).hexdigest()))
d = threading.Thread(target=drain, args=(len(data),))
d.start()
moved = 0
while True:
    n = os.splice(r, c.fileno(), 1 << 20)
    if n == 0:
        break
    moved += n
t.join(); d.join(); os.close(r)
print("pipe -> socket:", moved, got)
# The other way: the socket's bytes into a pipe, then the end of stream.
r, w = os.pipe()
c.sendall(b"the other way")
c.shutdown(socket.SHUT_WR)
out = b""
while True:
    n = os.splice(a.fileno(), w, 4096)
    if n == 0:
        break
    out += os.read(r, n)
print("socket -> pipe:", out)
# Neither end a pipe, an offset on the socket's end.
f = open("/dev/null", "rb")
for what, call in (("no pipe", lambda: os.splice(f.fileno(), c.fileno(), 10)),
                   ("offset", lambda: os.splice(r, c.fileno(), 10, offset_dst=0))):
    try:
        call()
    except OSError as e:
        print(what, errno.errorcode[e.errno])
# An empty nonblocking pipe, a full-stop from the writer's side.
r2, w2 = os.pipe()
os.set_blocking(r2, False)
try:
    os.splice(r2, c.fileno(), 10)
except OSError as e:
    print("empty nonblocking pipe", errno.errorcode[e.errno])
os.close(w2)
print("empty pipe, no writer:", os.splice(r2, c.fileno(), 10))
# FIONREAD counts what the socket holds though nobody read it yet (after
# a blocking read, which takes arrivals over from the progress thread).
x = socket.create_connection(srv.getsockname())
y, _ = srv.accept()
x.sendall(b"0")
print(y.recv(1))
x.sendall(b"12345")
buf = array.array("i", [0])
deadline = time.monotonic() + 5
while time.monotonic() < deadline:
    fcntl.ioctl(y.fileno(), termios.FIONREAD, buf)
    if buf[0]:
        break
    time.sleep(0.01)
print("FIONREAD:", buf[0], y.recv(16))
# Two splices into a pipe before it is read: each keeps its own bytes.
r3, w3 = os.pipe()
for word in (b"first", b"second"):
    x.sendall(word)
    moved = 0
    while moved < len(word):
        moved += os.splice(y.fileno(), w3, len(word) - moved)
print("two splices, then read:", os.read(r3, 64))
"#;

#[test]
fn splice_and_fionread_see_the_stream_as_tcp_has_it() {
    same_over_sdp("sdp-splice", SPLICE_AND_FIONREAD, 2);
}

/// `accept` returns a connection once it answered the MPA Request; the
/// RTR and the HelloAck follow. A server that closes what it accepted at
/// once, or shuts its writing half and reads, still lets each client's
/// connect succeed over SDP, as TCP's did before the accept: the client
/// reads the end of the stream, and what it sent arrives.
const CLOSED_AT_ONCE_AFTER_ACCEPT: &str = r#"
import socket, threading
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
got = []
def serve():
    for i in range(20):
        a, _ = srv.accept()
        if i % 2:
            a.shutdown(socket.SHUT_WR)
            got.append(a.recv(16))
        a.close()
t = threading.Thread(target=serve)
t.start()
for i in range(20):
    c = socket.create_connection(srv.getsockname())
    if i % 2:
        c.sendall(b"x%d" % i)
    print(i, c.recv(16))
    c.close()
t.join()
print(got)
"#;

#[test]
fn a_connection_closed_at_once_after_accept_still_connects_its_client() {
    same_over_sdp("sdp-closed-at-once", CLOSED_AT_ONCE_AFTER_ACCEPT, 20);
}

/// A stream that an epoll set holds has that set's waiter read its socket
/// (the progress thread leaves arrivals to it): a `select` on the stream
/// still sees each arrival — with the stream deleted from the set, while
/// the set holds it, and after an `EPOLLONESHOT` report disarmed it.
const EPOLL_THEN_SELECT: &str = r#"
import select, socket
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
s, _ = srv.accept()
ep = select.epoll()
ep.register(s.fileno(), select.EPOLLIN)
def by_select(data):
    c.sendall(data)
    r = select.select([s], [], [], 5)[0]
    print(data, bool(r), s.recv(16) if r else None)
c.sendall(b"one")
print([e for _, e in ep.poll(5)], s.recv(16))
ep.unregister(s.fileno())
by_select(b"two")
ep.register(s.fileno(), select.EPOLLIN)
by_select(b"three")
ep.modify(s.fileno(), select.EPOLLIN | select.EPOLLONESHOT)
c.sendall(b"four")
print([e for _, e in ep.poll(5)], s.recv(16))
by_select(b"five")
"#;

#[test]
fn select_sees_arrivals_on_a_stream_an_epoll_set_holds() {
    same_over_sdp("sdp-epoll-select", EPOLL_THEN_SELECT, 1);
}

/// A `select` that slept on a stream polls its socket itself, and the
/// progress thread leaves that socket to the program from then on; so a
/// later `select` that finds another fd ready at once, and does not sleep,
/// must still look at the socket: here the client is always writable, and
/// each byte sent to the server's stream shows as readable within the
/// program's loop (it never did when such calls skipped the socket), also
/// when the stream itself is ready for another thing asked (writable).
const SELECT_WITH_ANOTHER_FD_READY: &str = r#"
import select, socket, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
s, _ = srv.accept()
print(select.select([s], [], [], 0.2)[0])
seen = 0
for b in (b"a", b"b", b"c"):
    c.sendall(b)
    end = time.monotonic() + 5
    while time.monotonic() < end:
        r, w, _ = select.select([s], [c], [], 5)
        if r:
            seen += 1
            break
    print(w == [c], s.recv(16))
print(seen)
# A stream writable at once, asked for input too: the bytes that come
# show, though the call finds the stream ready without them.
c.sendall(b"d")
end = time.monotonic() + 5
while time.monotonic() < end:
    r, w, _ = select.select([s], [s], [], 5)
    if r:
        break
print(r == [s], w == [s], s.recv(16))
"#;

#[test]
fn select_sees_arrivals_while_another_fd_is_ready() {
    same_over_sdp("sdp-select-ready", SELECT_WITH_ANOTHER_FD_READY, 1);
}

/// A `poll` that asks for nothing of a stream holding unread bytes (only
/// errors and hang-ups are reported then) sleeps to its timeout, as over
/// TCP. It used to ask the wake fd for its readable level whatever the
/// call asked for, and the unread bytes woke it again and again: a
/// `select` for writing on a stream with unread input burnt a core the
/// same way. The calling thread's CPU time is measured.
const POLL_ASKING_NOTHING_OF_A_READABLE_STREAM: &str = r#"
import resource, select, socket, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
s, _ = srv.accept()
c.sendall(b"unread")
print(select.select([s], [], [], 5)[0] == [s])
p = select.poll()
p.register(s, 0)
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_THREAD)[:2])
before, start = cpu(), time.monotonic()
got = p.poll(1000)
slept, used = time.monotonic() - start, cpu() - before
print(got, slept > 0.9, used < 0.5, s.recv(16))
"#;

#[test]
fn a_poll_asking_nothing_sleeps_beside_unread_bytes() {
    same_over_sdp(
        "sdp-poll-nothing",
        POLL_ASKING_NOTHING_OF_A_READABLE_STREAM,
        1,
    );
}

/// A level-triggered epoll registration for writing only, on a stream that
/// cannot take a byte and holds bytes the program has not read: it sleeps
/// until its timeout, as over TCP. The wake fd was registered for its
/// readable level whatever the program asked, and that level, set by the
/// unread bytes, woke the set again and again with nothing to report.
const EPOLL_FOR_WRITING_BESIDE_UNREAD_BYTES: &str = r#"
import resource, select, socket, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
s, _ = srv.accept()
c.setblocking(False)
chunk = b"x" * (1 << 20)
def fill():
    while True:
        try:
            c.send(chunk)
        except BlockingIOError:
            return
ep = select.epoll()
ep.register(c.fileno(), select.EPOLLIN | select.EPOLLOUT)
fill()
s.sendall(b"unread")
print([e for _, e in ep.poll(5)])
# Full, and for a while (TCP may find room once more).
while select.select([], [c], [], 0.2)[1]:
    fill()
ep.modify(c.fileno(), select.EPOLLOUT)
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_THREAD)[:2])
before, start = cpu(), time.monotonic()
got = ep.poll(1)
slept, used = time.monotonic() - start, cpu() - before
print(got, slept > 0.9, used < 0.5, c.recv(16))
"#;

#[test]
fn epoll_for_writing_sleeps_beside_unread_bytes() {
    same_over_sdp("sdp-epoll-out", EPOLL_FOR_WRITING_BESIDE_UNREAD_BYTES, 1);
}

/// Level-triggered epoll reports a stream again while bytes wait unread —
/// whether the program read none or part of them — and not once it read
/// them all (the waiter that pumped the socket leaves the wake fd's levels
/// to the program's next call or its next wait).
const EPOLL_LEVELS: &str = r#"
import select, socket
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
s, _ = srv.accept()
ep = select.epoll()
ep.register(s.fileno(), select.EPOLLIN)
c.sendall(b"0123456789")
print([e for _, e in ep.poll(5)])
print([e for _, e in ep.poll(5)])
print(s.recv(4))
print([e for _, e in ep.poll(5)])
print(s.recv(16))
print([e for _, e in ep.poll(0.2)])
c.sendall(b"x")
print([e for _, e in ep.poll(5)], s.recv(4))
"#;

#[test]
fn level_triggered_epoll_reports_unread_bytes_again() {
    same_over_sdp("sdp-epoll-levels", EPOLL_LEVELS, 1);
}

/// The program's descriptor numbers are those TCP gives it: the library's
/// own descriptors (a stream's socket duplicate, eventfd, readiness pair)
/// sit high in the table, so 20 connection pairs take about 40 numbers, as
/// over TCP (an event loop sized by its connection count, such as wrk's,
/// lost connects to numbers past its table when each pair took 15).
const FD_NUMBERS: &str = r#"
import select, socket
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(64)
fds = []
for i in range(20):
    c = socket.socket()
    c.setblocking(False)
    try:
        c.connect(srv.getsockname())
    except BlockingIOError:
        pass
    select.select([], [c], [], 5)
    s, _ = srv.accept()
    s.sendall(b"x")
    c.setblocking(True)
    assert c.recv(1) == b"x"
    fds += [c, s]
numbers = [f.fileno() for f in fds]
print(len(numbers), max(numbers) - min(numbers) < 2 * len(numbers))
"#;

#[test]
fn descriptor_numbers_are_those_of_tcp() {
    same_over_sdp("sdp-fd-numbers", FD_NUMBERS, 20);
}

/// A server that closes its listener and listens again on the same port
/// (as CPython's tests do, one after another): the next client connects at
/// once, as over TCP, and over SDP. The port mapper's cached answer still
/// names the first listener's hidden SDP port; that port stopped listening
/// with the program's listener, so the client is refused there at once,
/// forgets the answer and asks the port mapper again. It used to be taken
/// into a queue nobody accepted from and wait 5 s for an MPA Reply before
/// falling back, and then to go by TCP until the denial it cached expired.
const LISTEN_AGAIN_ON_THE_SAME_PORT: &str = r#"
import socket, time
port = 0
for round in range(3):
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", port))
    port = srv.getsockname()[1]
    srv.listen(1)
    start = time.monotonic()
    c = socket.create_connection(("127.0.0.1", port))
    s, _ = srv.accept()
    c.sendall(b"x")
    got = s.recv(1)
    took = time.monotonic() - start
    print(round, got, "at once" if took < 2 else "after %.1f s" % took)
    c.close(); s.close(); srv.close()
"#;

#[test]
fn a_listener_opened_again_on_its_port_is_reached_at_once() {
    same_over_sdp("sdp-listen-again", LISTEN_AGAIN_ON_THE_SAME_PORT, 3);
}

/// A program that makes its socket buffers small (SO_SNDBUF, and
/// SO_RCVBUF on the listener, inherited by the accepted socket) gets flow
/// control early, as over TCP: a nonblocking sender facing a reader that
/// does not read is told EAGAIN after some KiB, not after SDP buffered
/// megabytes it never asked for.
const SMALL_SOCKET_BUFFERS: &str = r#"
import socket
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
s, _ = srv.accept()
c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
c.setblocking(False)
sent = 0
try:
    while sent < 8 << 20:
        sent += c.send(b"z" * 4096)
except BlockingIOError:
    pass
print("bounded:", sent < 256 << 10)
"#;

#[test]
fn small_socket_buffers_bound_what_a_sender_may_queue() {
    same_over_sdp("sdp-small-buffers", SMALL_SOCKET_BUFFERS, 1);
}

/// A receiver closes with data unread: the connection is reset, as TCP
/// sends an RST, so the sender's next sends fail with ECONNRESET or EPIPE
/// (MSG_NOSIGNAL) instead of going nowhere.
const CLOSE_WITH_UNREAD_DATA: &str = r#"
import errno, socket, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
s, _ = srv.accept()
c.sendall(b"x" * 2048)
assert len(s.recv(1024)) > 0
s.close()
deadline = time.monotonic() + 10
try:
    while time.monotonic() < deadline:
        c.send(b"y" * 1024, socket.MSG_NOSIGNAL)
        time.sleep(0.001)
    print("no error")
except OSError as e:
    print("sender:", errno.errorcode[e.errno] in ("ECONNRESET", "EPIPE"))
"#;

#[test]
fn a_close_with_unread_data_resets_the_sender() {
    same_over_sdp("sdp-unread-close", CLOSE_WITH_UNREAD_DATA, 1);
}

#[test]
fn prefork_server_over_sdp() {
    same_over_sdp("sdp-prefork", programs::PREFORK_SERVER, 6);
}

/// A prefork worker that served its connection and idles (holding the
/// listener, accepting no more) until it exits, while the next client's
/// connect waits: the connection must wait for the next worker, as it
/// waits in the kernel's queue with TCP, not be set up by the idle worker
/// and reset when it exits. The 300 ms give an idle worker's service
/// thread the time to take it; the output is the same whether it connected
/// meanwhile or not.
const IDLE_WORKER: &str = r#"
import os, select, socket
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(16)
addr = srv.getsockname()
go_r, go_w = os.pipe()
def worker(idle):
    if not idle:
        # Fails, rather than hangs, if the connection is gone.
        srv.settimeout(10)
    conn, _ = srv.accept()
    conn.sendall(b"reply:" + conn.recv(100))
    conn.close()
    if idle:
        os.read(go_r, 1)
    os._exit(0)
a = os.fork()
if a == 0:
    worker(True)
c1 = socket.create_connection(addr)
c1.sendall(b"one")
r1 = c1.recv(100).decode()
c1.close()
c2 = socket.socket()
c2.setblocking(False)
c2.connect_ex(addr)
select.select([], [c2], [], 0.3)
os.write(go_w, b"x")
status_a = os.waitpid(a, 0)[1]
b = os.fork()
if b == 0:
    worker(False)
srv.close()
c2.settimeout(10)
select.select([], [c2], [], 10)
err = c2.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
c2.sendall(b"two")
r2 = c2.recv(100).decode()
c2.close()
print(r1, r2, err, status_a, os.waitpid(b, 0)[1])
"#;

#[test]
fn an_idle_prefork_worker_leaves_the_next_connection_to_the_others() {
    same_over_sdp("sdp-idle-worker", IDLE_WORKER, 2);
}

/// The same with epoll workers (nginx's shape): a worker with the
/// listener in its epoll set serves one connection, then idles and exits
/// while the next client's connect waits. The connection must stay in the
/// hidden listener's queue for the next worker, as it stays in the
/// kernel's with TCP — taken by the exiting worker ahead of any `accept`,
/// it was reset. The 300 ms give an idle worker's threads the time to take
/// it; the output is the same whether the connect completed meanwhile or
/// not.
const EPOLL_WORKER_EXITS: &str = r#"
import os, select, socket
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(16)
srv.setblocking(False)
addr = srv.getsockname()
go_r, go_w = os.pipe()
def worker(idle):
    ep = select.epoll()
    ep.register(srv.fileno(), select.EPOLLIN)
    while True:
        ep.poll(10)
        try:
            conn, _ = srv.accept()
            break
        except BlockingIOError:
            pass
    conn.setblocking(True)
    conn.sendall(b"reply:" + conn.recv(100))
    conn.close()
    if idle:
        os.read(go_r, 1)
    os._exit(0)
a = os.fork()
if a == 0:
    worker(True)
c1 = socket.create_connection(addr)
c1.sendall(b"one")
r1 = c1.recv(100).decode()
c1.close()
c2 = socket.socket()
c2.setblocking(False)
c2.connect_ex(addr)
select.select([], [c2], [], 0.3)
os.write(go_w, b"x")
status_a = os.waitpid(a, 0)[1]
b = os.fork()
if b == 0:
    worker(False)
srv.close()
c2.settimeout(10)
select.select([], [c2], [], 10)
err = c2.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
c2.sendall(b"two")
r2 = c2.recv(100).decode()
c2.close()
print(r1, r2, err, status_a, os.waitpid(b, 0)[1])
"#;

#[test]
fn an_exiting_epoll_worker_leaves_the_next_connection_to_the_others() {
    same_over_sdp("sdp-epoll-worker", EPOLL_WORKER_EXITS, 2);
}

/// A child of `fork` that closes its copy of a listener in its parent's
/// epoll set, and exits: the parent's registration stays, as the
/// kernel's does when one of several fds of a socket closes — the next
/// connection still wakes the parent's `epoll_wait`.
const CHILD_CLOSES_AN_EPOLL_LISTENER: &str = r#"
import os, select, socket
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
srv.setblocking(False)
ep = select.epoll()
ep.register(srv.fileno(), select.EPOLLIN)
child = os.fork()
if child == 0:
    srv.close()
    os._exit(0)
os.waitpid(child, 0)
c = socket.socket()
c.setblocking(False)
c.connect_ex(srv.getsockname())
events = ep.poll(10)
conn, _ = srv.accept()
conn.setblocking(True)
c.setblocking(True)
c.settimeout(10)
c.sendall(b"ping")
print([fd == srv.fileno() for fd, _ in events], conn.recv(4))
"#;

#[test]
fn a_child_closing_its_copy_of_an_epoll_listener_leaves_the_parents_registration() {
    same_over_sdp("sdp-child-closes-epoll", CHILD_CLOSES_AN_EPOLL_LISTENER, 1);
}

/// A nonblocking listener that `select` reports readable has a connection
/// for `accept`, as TCP's queue does (CPython's
/// `NonBlockingTCPTests.testAccept`): over SDP the connection may still be
/// in its setup, by the `accept` or by the service thread taking it ahead,
/// and the `accept` waits for it instead of failing with `EAGAIN`. Clients
/// in a thread, as in the CPython test; 50 rounds, each one connection.
const READABLE_LISTENER_ACCEPTS: &str = r#"
import select, socket, threading
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
srv.setblocking(False)
results = []
for i in range(50):
    go = threading.Event()
    def client():
        go.wait()
        c = socket.create_connection(srv.getsockname())
        c.sendall(b"%d" % i)
        c.close()
    t = threading.Thread(target=client)
    t.start()
    try:
        srv.accept()
        results.append("accepted before connect")
    except BlockingIOError:
        pass
    go.set()
    r, _, _ = select.select([srv], [], [], 10)
    conn, _ = srv.accept()
    conn.setblocking(True)
    results.append(conn.recv(8) == b"%d" % i)
    conn.close()
    t.join()
print(results.count(True), [r for r in results if r is not True])
"#;

#[test]
fn a_readable_nonblocking_listener_accepts() {
    same_over_sdp("sdp-readable-accepts", READABLE_LISTENER_ACCEPTS, 50);
}

/// A sender writes 10 MiB and then sleeps without any call to the library:
/// the receiver (another process) must get every byte meanwhile.
const SLEEPY_SENDER: &str = r#"
import socket, sys, time
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
data = bytes(range(256)) * (10 * 4096)
c.sendall(data)
print("sent", len(data), flush=True)
time.sleep(30)
"#;

const COUNTING_RECEIVER: &str = r#"
import socket, sys
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
print("port", srv.getsockname()[1], flush=True)
a, _ = srv.accept()
n = 0
ok = True
while n < 10 * 1024 * 1024:
    d = a.recv(1 << 20)
    if not d:
        break
    ok = ok and all(d[i] == (n + i) % 256 for i in range(0, len(d), 4099))
    n += len(d)
print("received", n, ok, flush=True)
"#;

/// Starts the `receiver` program (it prints its port), then the `sender`
/// program with that port, logging at `info` to the returned file.
fn receiver_then_sender(
    stat: &TempDir,
    pm: &PortMapper,
    receiver: &str,
    sender: &str,
) -> (Background, Background, std::path::PathBuf) {
    let mut cmd = python_command(receiver, Mode::Sdp, stat.path());
    pm.apply(&mut cmd);
    let mut receiver = Background::start(cmd);
    let port = numbers(&receiver.wait_for_line("port"))[0];
    let log = stat.path().join("sender.log");
    let mut cmd = python_command(sender, Mode::Sdp, stat.path());
    pm.apply(&mut cmd)
        .arg(port.to_string())
        .env("SDP_LOG", "info")
        .env("SDP_LOG_FILE", &log);
    (receiver, Background::start(cmd), log)
}

#[test]
fn bytes_reach_the_peer_while_the_sender_sleeps() {
    let stat = TempDir::new("sdp-sleepy");
    let pm = PortMapper::start();
    let (mut receiver, mut sender, log) =
        receiver_then_sender(&stat, &pm, COUNTING_RECEIVER, SLEEPY_SENDER);
    sender.wait_for_line("sent 10485760");
    let start = Instant::now();
    let line = receiver.wait_for_line("received");
    assert_eq!(line.trim(), "received 10485760 True");
    assert!(start.elapsed() < Duration::from_secs(20));
    assert!(std::fs::read_to_string(&log).unwrap().contains("-> SDP"));
    // The receiver exits with its connection open and the peer asleep:
    // like TCP's, its close does not wait for the peer's (SDP_EXIT_FLUSH_MS
    // is 10 s here).
    let start = Instant::now();
    assert!(receiver.finish().0.success());
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

/// Writes 10 MiB, closes and exits at once.
const HASTY_SENDER: &str = r#"
import socket, sys
c = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
c.sendall(bytes(range(256)) * (10 * 4096))
# A nonblocking close returns at once, whatever is still queued.
c.setblocking(False)
c.close()
print("closed", flush=True)
"#;

/// Reads to EOF, then prints the count and whether the digest is the
/// sender's.
const READER_TO_EOF: &str = r#"
import hashlib, socket, sys, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
print("port", srv.getsockname()[1], flush=True)
a, _ = srv.accept()
h = hashlib.sha256()
n = 0
while True:
    d = a.recv(1 << 16)
    if not d:
        break
    h.update(d)
    n += len(d)
    time.sleep(0.002)  # a slow reader: the sender's close leaves bytes queued
sent = hashlib.sha256(bytes(range(256)) * (10 * 4096)).hexdigest()
print("eof", n, h.hexdigest() == sent, flush=True)
"#;

#[test]
fn a_sender_that_exits_after_close_delivers_everything_then_eof() {
    let stat = TempDir::new("sdp-hasty");
    let pm = PortMapper::start();
    let (mut receiver, mut sender, log) =
        receiver_then_sender(&stat, &pm, READER_TO_EOF, HASTY_SENDER);
    // What the close left queued (up to the peer's credits and the staging
    // ring) goes out during the exit, before the process ends.
    sender.wait_for_line("closed");
    let line = receiver.wait_for_line("eof");
    assert_eq!(line.trim(), "eof 10485760 True");
    assert!(sender.finish().0.success());
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("-> SDP"), "{log}");
    assert!(!log.contains("exit:"), "{log}");
    assert!(receiver.finish().0.success());
}

fn json_number_after(json: &str, section: &str, key: &str) -> f64 {
    let at = json
        .find(section)
        .unwrap_or_else(|| panic!("no {section} in iperf3 output"));
    let rest = &json[at..];
    let k = rest.find(key).expect("key in section");
    rest[k + key.len()..]
        .trim_start_matches([':', ' ', '\t'])
        .split(|c: char| !(c.is_ascii_digit() || c == '.' || c == 'e' || c == '+'))
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a number")
}

/// iperf3 moving 256 MiB over SDP, then over TCP (preloaded, no port
/// mapper), in one run: the figures are printed (`--nocapture`); the byte
/// counts are checked.
#[test]
fn iperf3_over_sdp_and_over_tcp() {
    require("iperf3");
    let stat = TempDir::new("sdp-iperf");
    let pm = PortMapper::start();
    let mut rates = Vec::new();
    for sdp in [true, false] {
        let port = sdp_tests::preload::free_port().to_string();
        let log = stat.path().join(format!("iperf-{sdp}.log"));
        let mut server = command("iperf3", Mode::Sdp, stat.path());
        server.args(["-s", "-1", "-p", &port, "--forceflush"]);
        let mut client = command("iperf3", Mode::Sdp, stat.path());
        client.args(["-c", "127.0.0.1", "-p", &port, "-n", "256M", "-J"]);
        for cmd in [&mut server, &mut client] {
            if sdp {
                pm.apply(cmd);
            }
            cmd.env("SDP_LOG", "info").env("SDP_LOG_FILE", &log);
        }
        let mut server = Background::start(server);
        server.wait_for_line("Server listening on");
        let out = run_ok(client);
        let json = String::from_utf8_lossy(&out.stdout);
        // iperf3 may finish the block it was sending past -n (128 KiB
        // blocks).
        let sent = json_number_after(&json, "\"sum_sent\"", "\"bytes\"") as u64;
        assert!(
            (256 << 20..=(256 << 20) + (128 << 10)).contains(&sent),
            "{sent}"
        );
        let rate = json_number_after(&json, "\"sum_received\"", "\"bits_per_second\"");
        rates.push(rate);
        assert!(server.finish().0.success());
        let log = std::fs::read_to_string(&log).unwrap();
        let over_sdp = log.lines().filter(|l| l.ends_with("-> SDP")).count();
        assert_eq!(over_sdp, if sdp { 2 } else { 0 }, "{log}");
    }
    eprintln!(
        "iperf3 256 MiB on loopback: SDP {:.2} Gbit/s, TCP {:.2} Gbit/s (ratio {:.2})",
        rates[0] / 1e9,
        rates[1] / 1e9,
        rates[0] / rates[1]
    );
}

/// `python3 -m http.server` over SDP to a preloaded curl.
#[test]
fn http_server_and_curl_over_sdp() {
    require("curl");
    let stat = TempDir::new("sdp-http");
    let www = TempDir::new("sdp-www");
    let blob: Vec<u8> = (0..3u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    www.file("blob.bin", &blob);
    let pm = PortMapper::start();
    let log = stat.path().join("sdp.log");
    let mut server = command(python(), Mode::Sdp, stat.path());
    pm.apply(&mut server)
        .args([
            "-u",
            "-m",
            "http.server",
            "--bind",
            "127.0.0.1",
            "--directory",
        ])
        .arg(www.path())
        .arg("0")
        .stderr(Stdio::null());
    let mut server = Background::start(server);
    let line = server.wait_for_line("Serving HTTP on");
    let port: u16 = line
        .split_whitespace()
        .skip_while(|w| *w != "port")
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap();
    let mut curl = command("curl", Mode::Sdp, stat.path());
    pm.apply(&mut curl)
        .env("SDP_LOG", "info")
        .env("SDP_LOG_FILE", &log)
        .args([
            "-sS",
            "--fail",
            &format!("http://127.0.0.1:{port}/blob.bin"),
        ]);
    assert!(run_ok(curl).stdout == blob, "curl got other bytes");
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.lines().any(|l| l.ends_with("-> SDP")), "{log}");
}

/// A listening socket made without the preload and inherited across
/// `exec` (as from systemd): the preloaded program never calls `listen`;
/// its first `accept` gives the socket its hidden SDP listener.
const INHERITED_LISTENER: &str = r#"
import os, socket, sys
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
os.set_inheritable(srv.fileno(), True)
print("port", srv.getsockname()[1], flush=True)
child = r'''
import os, socket, sys
srv = socket.socket(fileno=int(sys.argv[1]))
srv.setblocking(False)
try:
    srv.accept()
except BlockingIOError:
    pass
srv.setblocking(True)
print("accepting", flush=True)
a, _ = srv.accept()
a.sendall(a.recv(100).upper())
print("served", os.getpid(), srv.fileno(), a.fileno(), flush=True)
sys.stdin.read()
'''
env = dict(os.environ)
env["LD_PRELOAD"] = sys.argv[1]
os.execve(sys.executable, [sys.executable, "-c", child, str(srv.fileno())], env)
"#;

#[test]
fn an_inherited_listener_gets_its_sdp_listener_at_the_first_accept() {
    let stat = TempDir::new("sdp-inherit");
    let pm = PortMapper::start();
    let mut cmd = python_command(INHERITED_LISTENER, Mode::Plain, stat.path());
    pm.apply(&mut cmd)
        .arg(&artifacts().library)
        .stdin(Stdio::piped());
    let mut server = Background::start(cmd);
    let port = numbers(&server.wait_for_line("port"))[0] as u16;
    server.wait_for_line("accepting");
    let mut c = client(stat.path(), &pm, port, 1, false);
    let n = numbers(&c.wait_for_line("fds"));
    let cs = statfile::read(stat.path(), n[0] as u32).unwrap();
    assert_eq!(cs.record(n[1] as usize).unwrap().transport, SDP);
    let s = numbers(&server.wait_for_line("served"));
    let ss = statfile::read(stat.path(), s[0] as u32).unwrap();
    let l = ss.record(s[1] as usize).unwrap();
    assert_eq!((l.transport, l.role), (SDP, LISTENER));
    let a = ss.record(s[2] as usize).unwrap();
    assert_eq!((a.transport, a.role, a.local), (SDP, ACCEPTED, l.local));
    drop(c.child.stdin.take());
    assert!(c.finish().0.success());
    drop(server.child.stdin.take());
    assert!(server.finish().0.success());
}

/// Edge-triggered epoll on an accepted socket: an edge for the first data,
/// none while nothing new comes, a new one for data arriving while unread
/// data waits, and one after a partial read when more comes.
const EDGES: &str = r#"
import select, socket
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
a, _ = srv.accept()
ep = select.epoll()
ep.register(a.fileno(), select.EPOLLIN | select.EPOLLET)
c.sendall(b"a")
print("first data", len(ep.poll(5)), flush=True)
print("nothing new", len(ep.poll(0.2)), flush=True)
c.sendall(b"b")
print("data while unread data waits", len(ep.poll(5)), flush=True)
print("read", a.recv(10), flush=True)
c.sendall(b"c")
print("data after the read", len(ep.poll(5)), flush=True)
print("read", a.recv(10), flush=True)
"#;

#[test]
fn edge_triggered_epoll_sees_each_arrival_as_over_tcp() {
    let stat = TempDir::new("sdp-edges");
    let plain = run_ok(python_command(EDGES, Mode::Plain, stat.path()));
    let plain = String::from_utf8(plain.stdout).unwrap();
    assert_eq!(
        plain,
        "first data 1\nnothing new 0\ndata while unread data waits 1\nread b'ab'\n\
         data after the read 1\nread b'c'\n"
    );
    let pm = PortMapper::start();
    let log = stat.path().join("edges.log");
    let mut cmd = python_command(EDGES, Mode::Sdp, stat.path());
    pm.apply(&mut cmd)
        .env("SDP_LOG", "info")
        .env("SDP_LOG_FILE", &log);
    let sdp = String::from_utf8(run_ok(cmd).stdout).unwrap();
    assert_eq!(sdp, plain);
    let log = std::fs::read_to_string(&log).unwrap();
    assert!(log.contains("-> SDP"), "{log}");
}

/// An edge-triggered epoll server with `SIGALRM` every 1–3 ms (Python's
/// handler, without `SA_RESTART`): eight nonblocking connections, each
/// 64 rounds of a 256 KiB request read until `EAGAIN` and a 256 KiB
/// response sent until `EAGAIN` (128 MiB each way in all), every byte
/// checked; the peer (a child process) runs a blocking thread per
/// connection. A ninth connection is written to by another thread of the
/// server with 1 MiB sends while its peer trickles bytes to the epoll
/// loop, so the loop often finds a stream's lock taken when a signal
/// comes. Each phase has one edge to wait for: a connection with no
/// progress for 5 s, while not runnable, prints its state and fails the
/// program.
const ET_EPOLL_SIGNALS: &str = r#"
import os, random, select, signal, socket, sys, threading, time
CONNS, MSG, ROUNDS, STALL = 8, 256 << 10, 64, 5.0
POOL = 1 << 20
pool = os.urandom(POOL)
pool2 = pool + pool

def piece(pos, k):
    o = pos % POOL
    return pool2[o:o + min(k, POOL)]

rd, wr = os.pipe()
child = os.fork()
if child == 0:
    os.close(wr)
    port = int(os.read(rd, 64).decode())
    errors = []

    def run(i):
        rng = random.Random(i)
        s = socket.create_connection(("127.0.0.1", port))
        mv = memoryview(bytearray(POOL))
        pos_out = pos_in = 0
        for _ in range(ROUNDS):
            end = pos_out + MSG
            while pos_out < end:
                k = min(end - pos_out, rng.choice((1, 100, 4096, 65536, POOL)))
                s.sendall(piece(pos_out, k))
                pos_out += k
            end = pos_in + MSG
            while pos_in < end:
                n = s.recv_into(mv[:min(end - pos_in, rng.choice((512, 65536, POOL)))])
                if n == 0 or mv[:n] != piece(pos_in, n):
                    errors.append(f"connection {i}: short or different at {pos_in}")
                    return
                pos_in += n
                if rng.random() < 0.05:
                    time.sleep(0.001)
        s.close()

    done = threading.Event()
    z = socket.create_connection(("127.0.0.1", port))

    def trickle():
        while not done.is_set():
            z.sendall(b"z" * 100)
            time.sleep(0.0005)
        z.shutdown(socket.SHUT_WR)

    def sink():
        b = bytearray(POOL)
        while z.recv_into(b):
            pass

    noise = [threading.Thread(target=trickle), threading.Thread(target=sink)]
    for t in noise:
        t.start()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(CONNS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    for t in noise:
        t.join()
    print("peer", "ok" if not errors else errors, flush=True)
    os._exit(0 if not errors else 1)

os.close(rd)
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(CONNS + 1)
os.write(wr, str(srv.getsockname()[1]).encode())
os.close(wr)
z, _ = srv.accept()
srv.setblocking(False)
z.setblocking(False)
rng = random.Random(1)
signals = [0]

def on_alarm(*_):
    signals[0] += 1
    signal.setitimer(signal.ITIMER_REAL, rng.uniform(0.001, 0.003))

signal.signal(signal.SIGALRM, on_alarm)
signal.setitimer(signal.ITIMER_REAL, 0.002)
ep = select.epoll()
ep.register(srv.fileno(), select.EPOLLIN)
ep.register(z.fileno(), select.EPOLLIN | select.EPOLLET)
z_eof = False
blob = os.urandom(POOL)

def z_writer():
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    p = select.poll()
    p.register(z.fileno(), select.POLLOUT)
    while not z_eof:
        try:
            z.send(blob)
        except BlockingIOError:
            p.poll(100)

writer = threading.Thread(target=z_writer)
writer.start()
mv = memoryview(bytearray(MSG))

class Conn:
    def __init__(self, s):
        self.s, self.round, self.sending, self.pos, self.total = s, 0, False, 0, 0
        self.progress, self.last = time.monotonic(), "accepted"

def serve(c):
    # Until EAGAIN ("blocked"), the end ("done"), or 64 calls ("more").
    for _ in range(64):
        if c.round == ROUNDS:
            return "done"
        at = c.round * MSG + c.pos
        try:
            if c.sending:
                n = c.s.send(piece(at, MSG - c.pos))
            else:
                n = c.s.recv_into(mv[:MSG - c.pos])
                if n == 0 or mv[:n] != piece(at, n):
                    raise RuntimeError(f"request short or different at {at}")
        except BlockingIOError:
            c.last = "send" if c.sending else "recv"
            return "blocked"
        c.pos, c.total, c.progress = c.pos + n, c.total + n, time.monotonic()
        if c.pos == MSG:
            c.pos, c.sending = 0, not c.sending
            c.round += not c.sending
    return "more"

conns, runnable, accepted = {}, set(), 0
while accepted < CONNS or conns or not z_eof:
    for fd, ev in ep.poll(0 if runnable else 0.5):
        if fd == srv.fileno():
            while True:
                try:
                    s, _ = srv.accept()
                except BlockingIOError:
                    break
                s.setblocking(False)
                accepted += 1
                conns[s.fileno()] = Conn(s)
                ep.register(s.fileno(), select.EPOLLIN | select.EPOLLOUT | select.EPOLLET)
                runnable.add(s.fileno())
        elif fd == z.fileno():
            while not z_eof:
                try:
                    z_eof = not z.recv(1 << 16)
                except BlockingIOError:
                    break
        elif fd in conns:
            runnable.add(fd)
    for fd in list(runnable):
        c = conns[fd]
        r = serve(c)
        if r != "more":
            runnable.discard(fd)
        if r == "done":
            ep.unregister(fd)
            del conns[fd]
            c.s.close()
    now = time.monotonic()
    for fd, c in conns.items():
        if fd not in runnable and now - c.progress > STALL:
            p = select.poll()
            p.register(fd, select.POLLIN | select.POLLOUT)
            print(f"stalled: connection {fd} waited {now - c.progress:.1f} s for an edge after "
                  f"{c.total} bytes (round {c.round}, {c.last} said EAGAIN); poll says "
                  f"{p.poll(0)}; {signals[0]} signals", flush=True)
            os.kill(child, signal.SIGKILL)
            os._exit(1)
signal.setitimer(signal.ITIMER_REAL, 0)
writer.join()
z.close()
_, status = os.waitpid(child, 0)
print("server done", status, flush=True)
"#;

#[test]
fn an_edge_triggered_epoll_loop_with_signals_never_loses_an_edge() {
    let stat = TempDir::new("sdp-et-signals");
    let plain = run_ok(python_command(ET_EPOLL_SIGNALS, Mode::Plain, stat.path()));
    let plain = String::from_utf8(plain.stdout).unwrap();
    assert_eq!(plain, "peer ok\nserver done 0\n");
    let pm = PortMapper::start();
    let log = stat.path().join("et-signals.log");
    let mut cmd = python_command(ET_EPOLL_SIGNALS, Mode::Sdp, stat.path());
    pm.apply(&mut cmd)
        .env("SDP_LOG", "info")
        .env("SDP_LOG_FILE", &log);
    let sdp = String::from_utf8(run_ok(cmd).stdout).unwrap();
    assert_eq!(sdp, plain);
    let log = std::fs::read_to_string(&log).unwrap();
    let over_sdp = log.lines().filter(|l| l.ends_with("-> SDP")).count();
    assert_eq!(over_sdp, 9, "{log}");
}

/// 64 MiB of blocking 4 MiB `sendall`s from one thread against blocking
/// 16 MiB `recv_into`s in another, over one connection of the process's
/// own; both hashes, then the pid and fds, then it waits for stdin.
const ZCOPY_STREAM: &str = r#"
import hashlib, os, socket, sys, threading
CHUNK = 4 << 20
TOTAL = 64 << 20
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
a, _ = srv.accept()
sent = hashlib.sha256()

def writer():
    for i in range(TOTAL // CHUNK):
        b = hashlib.sha256(i.to_bytes(8, "little")).digest() * (CHUNK // 32)
        sent.update(b)
        c.sendall(b)
    c.shutdown(socket.SHUT_WR)

t = threading.Thread(target=writer)
t.start()
buf = bytearray(16 << 20)
view = memoryview(buf)
got = hashlib.sha256()
n = 0
while True:
    k = a.recv_into(view)
    if k == 0:
        break
    got.update(view[:k])
    n += k
t.join()
print("received", n, got.hexdigest() == sent.hexdigest())
print("fds", os.getpid(), c.fileno(), a.fileno(), flush=True)
sys.stdin.read()
"#;

/// [`ZCOPY_STREAM`] under `SDP_ZCOPY=mode` (Bcopy Threshold 1 MiB): the
/// bytes arrive whole, and the export's counters of the sending and the
/// accepted fd, once they account for all of them.
fn zcopy_stream(mode: &str) -> (statfile::Record, statfile::Record) {
    zcopy_stream_lending(mode, "off")
}

/// [`zcopy_stream`] with `SDP_LEND_ABOVE=lend`.
fn zcopy_stream_lending(mode: &str, lend: &str) -> (statfile::Record, statfile::Record) {
    const TOTAL: u64 = 64 << 20;
    let stat = TempDir::new(&format!("sdp-zcopy-{mode}"));
    let pm = PortMapper::start();
    let mut cmd = python_command(ZCOPY_STREAM, Mode::Sdp, stat.path());
    pm.apply(&mut cmd)
        .env("SDP_ZCOPY", mode)
        .env("SDP_ZCOPY_THRESHOLD", "1M")
        .env("SDP_LEND_ABOVE", lend)
        .stdin(Stdio::piped());
    let mut program = Background::start(cmd);
    let (before, fds) = lines_until(&mut program, "fds ");
    assert_eq!(
        before.iter().map(|l| l.trim_end()).collect::<Vec<_>>(),
        [format!("received {TOTAL} True")]
    );
    let n = numbers(&fds);
    let (pid, client, accepted) = (n[0] as u32, n[1] as usize, n[2] as usize);
    let sum =
        |r: &statfile::Record, i: usize| r.counters[i] + r.counters[i + 2] + r.counters[i + 4];
    let state = state_when(stat.path(), pid, |s| {
        s.record(client).is_some_and(|r| sum(r, 0) == TOTAL)
            && s.record(accepted).is_some_and(|r| sum(r, 1) == TOTAL)
    });
    drop(program.child.stdin.take());
    let (status, out) = program.finish();
    assert!(status.success(), "{out}");
    let c = state.record(client).expect("client record").clone();
    let a = state.record(accepted).expect("accepted record").clone();
    assert_eq!((c.transport, a.transport), (SDP, SDP));
    // Sent as received, mechanism by mechanism.
    assert_eq!(sum(&c, 0), TOTAL, "{c:?}");
    assert_eq!(
        [c.counters[0], c.counters[2], c.counters[4]],
        [a.counters[1], a.counters[3], a.counters[5]],
        "{c:?} {a:?}"
    );
    (c, a)
}

/// With Zcopy off, each blocking 4 MiB `sendall` lends its buffer (by
/// default, and with `SDP_LEND_ABOVE=256K`): its bytes go by Bcopy
/// straight from it, none copied into the send buffer — unless the reader
/// stalled for `LENT_STALL` (20 ms) on this loaded machine, when the rest
/// of that write is copied: so nine tenths at least. With
/// `SDP_LEND_ABOVE=off`, most are copied.
#[test]
fn blocking_bcopy_writes_go_straight_from_the_buffer() {
    for lend in ["256K", ""] {
        let (c, _) = zcopy_stream_lending("off", lend);
        assert_eq!(c.counters[0], 64 << 20, "{lend}: {c:?}");
        assert!(c.direct[0] >= (64 << 20) / 10 * 9, "{lend}: {c:?}");
    }
    let (c, _) = zcopy_stream_lending("off", "off");
    assert!(c.direct[0] < 64 << 20, "{c:?}");
}

#[test]
fn read_zcopy_under_the_preload() {
    let (c, a) = zcopy_stream("read");
    // Each 4 MiB write is a Combined Mode SrcAvail carrying its first
    // bytes; the reader took the rest by RDMA Read.
    assert_eq!((c.tx_mode, a.rx_mode), (1, 1));
    assert!(c.counters[2] >= (64 << 20) - 16 * 1024, "{c:?}");
    assert_eq!(c.counters[4], 0, "{c:?}");
    // Both ends on this host: the reader read the writer's buffers itself
    // (DESIGN §9), every byte the RDMA Reads would have carried.
    assert!(a.same_host_bytes[1] >= a.counters[3], "{a:?}");
}

#[test]
fn write_zcopy_under_the_preload() {
    let (c, a) = zcopy_stream("write");
    // Pipelined Mode towards the reader; its posted reads are advertised
    // and written into. (Copied receive bytes are bcopy_rx less
    // bcopy_rx_direct: a write whose SrcAvail reached the reader before
    // its SinkAvail went by SendSm and Bcopy into a posted buffer, copied
    // from a Private Buffer, so they are not asserted to be 0 here.)
    assert_eq!((c.tx_mode, a.rx_mode), (3, 3));
    assert!(c.counters[4] > 0, "{c:?}");
    assert_eq!(c.counters[2], 0, "{c:?}");
    // Both ends on this host: the writer wrote into the reader's buffers
    // itself (DESIGN §9), every byte the RDMA Writes would have carried.
    assert!(c.same_host_bytes[0] >= c.counters[4], "{c:?}");
}

/// `MSG_WAITALL` reads of 4 MiB under Read Zcopy while `SIGALRM` comes
/// every 2 ms: a read that a signal cuts short returns the bytes it placed
/// (Python then reads on), never `EINTR` with them lost. The writer sends
/// 512 KiB pieces a little apart, so reads are often part filled when a
/// signal comes.
const WAITALL_SIGNALS: &str = r#"
import hashlib, signal, socket, threading, time
PIECE = 512 << 10
TOTAL = 24 << 20
signal.signal(signal.SIGALRM, lambda *a: None)
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
a, _ = srv.accept()
sent = hashlib.sha256()

def writer():
    for i in range(TOTAL // PIECE):
        b = hashlib.sha256(i.to_bytes(8, "little")).digest() * (PIECE // 32)
        sent.update(b)
        c.sendall(b)
        time.sleep(0.003)
    c.shutdown(socket.SHUT_WR)

t = threading.Thread(target=writer)
t.start()
signal.setitimer(signal.ITIMER_REAL, 0.002, 0.002)
buf = bytearray(4 << 20)
view = memoryview(buf)
got = hashlib.sha256()
n = 0
while True:
    k = a.recv_into(view, len(view), socket.MSG_WAITALL)
    if k == 0:
        break
    got.update(view[:k])
    n += k
signal.setitimer(signal.ITIMER_REAL, 0)
t.join()
print("received", n, got.hexdigest() == sent.hexdigest())
"#;

#[test]
fn a_signal_in_a_waitall_zcopy_read_keeps_its_bytes() {
    same_over_sdp_with(
        "sdp-waitall-signals",
        WAITALL_SIGNALS,
        1,
        &[("SDP_ZCOPY", "read"), ("SDP_ZCOPY_THRESHOLD", "256K")],
    );
}

/// Forks, one after the other, while two threads of the process move
/// 32 MiB over a connection of its own with Read Zcopy (4 MiB writes and
/// reads): each child exits at once. A child must never hang in the fork
/// handler on the lock of a stream that a Zcopy call of the parent held at
/// the fork (the parent keeps such a connection; the child leaves it be).
const FORKS_DURING_ZCOPY: &str = r#"
import hashlib, os, socket, threading, time
CHUNK = 4 << 20
TOTAL = 32 << 20
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
a, _ = srv.accept()
sent, got = hashlib.sha256(), hashlib.sha256()
n = [0]

def writer():
    for i in range(TOTAL // CHUNK):
        b = hashlib.sha256(i.to_bytes(8, "little")).digest() * (CHUNK // 32)
        sent.update(b)
        c.sendall(b)
    c.shutdown(socket.SHUT_WR)

def reader():
    view = memoryview(bytearray(CHUNK))
    while True:
        k = a.recv_into(view)
        if k == 0:
            break
        got.update(view[:k])
        n[0] += k

threads = [threading.Thread(target=f) for f in (writer, reader)]
for t in threads:
    t.start()
forks = hung = 0
while threads[1].is_alive():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    forks += 1
    deadline = time.monotonic() + 10
    while os.waitpid(pid, os.WNOHANG)[0] == 0:
        if time.monotonic() > deadline:
            hung += 1
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            break
        time.sleep(0.001)
for t in threads:
    t.join()
print("received", n[0], got.digest() == sent.digest(), "forks", forks > 0, "hung", hung)
"#;

#[test]
fn forks_while_a_zcopy_receive_runs_never_hang() {
    same_over_sdp_with(
        "sdp-fork-zcopy",
        FORKS_DURING_ZCOPY,
        1,
        &[("SDP_ZCOPY", "read"), ("SDP_ZCOPY_THRESHOLD", "256K")],
    );
}

/// A server that forks a child (which exits, or execs, at once or only
/// after the parent closed) and then closes, without another use, a
/// connection it served: the child never uses the connection either.
/// Over TCP the client sees the end of the stream once both let go; over
/// SDP the last holder of the connection closes it (DisConn), whoever
/// that is — never a reset, never a hang.
const FORK_THEN_CLOSE_UNUSED: &str = r#"
import os, socket, sys
CASES = ["_exit", "exit", "exec", "_exit-late", "exit-late", "exec-late"]
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
port = srv.getsockname()[1]
rd, wr = os.pipe()
client = os.fork()
if client == 0:
    srv.close()
    out = []
    for case in CASES:
        c = socket.create_connection(("127.0.0.1", port))
        c.settimeout(20)
        c.sendall(b"hello")
        got = b""
        try:
            while True:
                b = c.recv(100)
                if not b:
                    break
                got += b
            out.append(f"{case}: {got.decode()} EOF")
        except OSError as e:
            out.append(f"{case}: {got.decode()} {type(e).__name__}")
        c.close()
    os.write(wr, ("\n".join(out) + "\n").encode())
    os._exit(0)
os.close(wr)
for case in CASES:
    conn, _ = srv.accept()
    assert conn.recv(5) == b"hello"
    conn.sendall(b"reply")
    gate_r, gate_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(gate_w)
        if case.endswith("-late"):
            os.read(gate_r, 1)
        if case.startswith("_exit"):
            os._exit(0)
        if case.startswith("exit"):
            sys.exit(0)
        os.execv("/bin/true", ["true"])
    os.close(gate_r)
    conn.close()
    try:
        os.write(gate_w, b"x")
    except BrokenPipeError:
        pass  # the child is gone already
    os.close(gate_w)
    os.waitpid(child, 0)
out = b""
while True:
    b = os.read(rd, 4096)
    if not b:
        break
    out += b
print(out.decode(), end="")
os.waitpid(client, 0)
"#;

#[test]
fn the_last_process_to_let_go_of_a_forked_connection_closes_it() {
    same_over_sdp("sdp-fork-close-unused", FORK_THEN_CLOSE_UNUSED, 6);
}

/// A 16 MiB `recv_into` posted before the peer writes: the harness lets
/// the writer go once the export shows the reader's SinkAvail, and the
/// payload lands in the reader's buffer by RDMA Write, not one byte of it
/// copied on receive.
const POSTED_FIRST: &str = r#"
import hashlib, os, socket, sys, threading
N = 16 << 20
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
a, _ = srv.accept()
# One byte there and back: the writer's ModeChange to Pipelined Mode,
# sent first, has reached the reader.
c.sendall(b"x")
assert a.recv(1) == b"x"
buf = bytearray(N)
got = []
t = threading.Thread(target=lambda: got.append(a.recv_into(memoryview(buf))))
t.start()
print("fds", os.getpid(), c.fileno(), a.fileno(), flush=True)
sys.stdin.readline()
data = hashlib.sha256(b"posted first").digest() * (N // 32)
c.sendall(data)
t.join()
print("received", got[0], bytes(buf[:got[0]]) == data, flush=True)
sys.stdin.read()
"#;

#[test]
fn a_receive_posted_before_the_send_is_written_into_without_a_copy() {
    const N: u64 = 16 << 20;
    let stat = TempDir::new("sdp-zcopy-posted");
    let pm = PortMapper::start();
    let mut cmd = python_command(POSTED_FIRST, Mode::Sdp, stat.path());
    pm.apply(&mut cmd)
        .env("SDP_ZCOPY", "write")
        .env("SDP_ZCOPY_THRESHOLD", "1M")
        .stdin(Stdio::piped());
    let mut program = Background::start(cmd);
    let (_, fds) = lines_until(&mut program, "fds ");
    let n = numbers(&fds);
    let (pid, client, accepted) = (n[0] as u32, n[1] as usize, n[2] as usize);
    // The export's SinkAvail count: the reader's buffer is advertised.
    let posted = state_when(stat.path(), pid, |s| {
        s.record(accepted).is_some_and(|r| r.messages[1] == 1)
    });
    let before = posted.record(accepted).expect("accepted record").clone();
    assert_eq!(before.messages[1], 1, "no SinkAvail: {before:?}");
    let mut stdin = program.child.stdin.take().unwrap();
    std::io::Write::write_all(&mut stdin, b"go\n").unwrap();
    let (_, received) = lines_until(&mut program, "received ");
    assert_eq!(received.trim_end(), format!("received {N} True"));
    let state = state_when(stat.path(), pid, |s| {
        s.record(client).is_some_and(|r| r.counters[4] == N)
    });
    drop(stdin);
    let (status, out) = program.finish();
    assert!(status.success(), "{out}");
    let c = state.record(client).expect("client record");
    let a = state.record(accepted).expect("accepted record");
    assert_eq!((c.tx_mode, a.rx_mode), (3, 3));
    // All of it by RDMA Write into the posted buffer ...
    assert_eq!((c.counters[4], a.counters[5]), (N, N), "{c:?} {a:?}");
    // ... and none of it copied on receive (the one byte before it was).
    assert_eq!(a.counters[1], 1, "{a:?}");
    assert_eq!(a.copied, before.copied, "{a:?}");
    assert!(a.copied[0] <= 1, "{a:?}");
}

/// A blocking 8 MiB `recv_into` whose buffer is advertised, interrupted
/// by a signal whose handler raises: the call ends with EINTR (Python
/// raises the handler's exception) after the SinkAvail is canceled, and
/// the stream goes on intact.
const ZCOPY_SIGNAL: &str = r#"
import hashlib, os, signal, socket, sys, threading
N = 8 << 20
class Interrupted(Exception):
    pass
armed = True
def on_usr1(sig, frame):
    global armed
    if armed:
        armed = False
        raise Interrupted()
signal.signal(signal.SIGUSR1, on_usr1)
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
a, _ = srv.accept()
c.sendall(b"x")
assert a.recv(1) == b"x"
print("fds", os.getpid(), c.fileno(), a.fileno(), flush=True)
buf = bytearray(N)
try:
    n = a.recv_into(memoryview(buf))
    print("not interrupted", n, flush=True)
except Interrupted:
    print("interrupted", flush=True)
data = hashlib.sha256(b"after the signal").digest() * (N // 32)
def write():
    c.sendall(data)
    c.shutdown(socket.SHUT_WR)
t = threading.Thread(target=write)
t.start()
got = bytearray()
while True:
    k = a.recv_into(memoryview(buf))
    if k == 0:
        break
    got += buf[:k]
t.join()
print("received", len(got), bytes(got) == data, flush=True)
sys.stdin.read()
"#;

#[test]
fn a_signal_interrupts_a_zcopy_receive_with_eintr() {
    zcopy_signal(ZCOPY_SIGNAL);
}

/// The same, the writer's end having read once before, blocking: the
/// progress thread then leaves arrivals to its program, which sits in
/// the other end's read — the SinkCancelAck the cancel waits for must
/// come all the same (it hung before).
#[test]
fn a_zcopy_receive_is_canceled_while_the_writers_program_reads_elsewhere() {
    let script = ZCOPY_SIGNAL.replace(
        "assert a.recv(1) == b\"x\"\n",
        "assert a.recv(1) == b\"x\"\na.sendall(b\"y\")\nassert c.recv(1) == b\"y\"\n",
    );
    assert_ne!(script, ZCOPY_SIGNAL);
    zcopy_signal(&script);
}

/// Runs a [`ZCOPY_SIGNAL`] program: signals it until its receive was
/// interrupted, and checks what came after.
fn zcopy_signal(script: &str) {
    let stat = TempDir::new("sdp-zcopy-signal");
    let pm = PortMapper::start();
    let mut cmd = python_command(script, Mode::Sdp, stat.path());
    pm.apply(&mut cmd)
        .env("SDP_ZCOPY", "write")
        .env("SDP_ZCOPY_THRESHOLD", "1M")
        .stdin(Stdio::piped());
    let mut program = Background::start(cmd);
    let (_, fds) = lines_until(&mut program, "fds ");
    let n = numbers(&fds);
    let (pid, accepted) = (n[0] as u32, n[2] as usize);
    let posted = state_when(stat.path(), pid, |s| {
        s.record(accepted).is_some_and(|r| r.messages[1] == 1)
    });
    assert_eq!(posted.record(accepted).map(|r| r.messages[1]), Some(1));
    // A signal that lands just before the call sleeps interrupts nothing:
    // again until the export shows the SinkAvailCancel it led to.
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid as i32, libc::SIGUSR1) };
        let s = state_when(stat.path(), pid, |_| true);
        if s.record(accepted).is_some_and(|r| r.messages[3] == 1) || Instant::now() > until {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let (before, received) = lines_until(&mut program, "received ");
    assert_eq!(before, ["interrupted\n"]);
    assert_eq!(received.trim_end(), format!("received {} True", 8 << 20));
    let state = state_when(stat.path(), pid, |_| true);
    let a = state.record(accepted).expect("accepted record").clone();
    drop(program.child.stdin.take());
    let (status, out) = program.finish();
    assert!(status.success(), "{out}");
    // The interrupted read's SinkAvail, canceled (§9.5.5); the next
    // read's may be advertised too, or the writer's SrcAvail come first
    // (SendSm). The 8 MiB after the signal all arrived.
    assert!(a.messages[1] >= 1 && a.messages[3] == 1, "{a:?}");
    assert_eq!(
        a.counters[1] + a.counters[3] + a.counters[5],
        1 + (8 << 20),
        "{a:?}"
    );
}

/// 32 MiB of blocking 4 MiB `sendall`s in Pipelined Mode (SrcAvails with
/// no payload) against an epoll reader of a nonblocking socket: each
/// SrcAvail alone wakes the reader, whose read finds nothing, answers
/// with SendSm and gets the bytes by Bcopy.
const ZCOPY_TO_EPOLL: &str = r#"
import hashlib, selectors, socket, threading
CHUNK = 4 << 20
TOTAL = 32 << 20
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname())
a, _ = srv.accept()
sent = hashlib.sha256()
def writer():
    for i in range(TOTAL // CHUNK):
        b = hashlib.sha256(i.to_bytes(8, "little")).digest() * (CHUNK // 32)
        sent.update(b)
        c.sendall(b)
    c.shutdown(socket.SHUT_WR)
# A daemon: should the reader give up, the program ends anyway.
t = threading.Thread(target=writer, daemon=True)
t.start()
a.setblocking(False)
sel = selectors.EpollSelector()
sel.register(a, selectors.EVENT_READ)
got = hashlib.sha256()
n = 0
eof = False
while not eof:
    assert sel.select(timeout=20), "no readiness in 20 s"
    while True:
        try:
            b = a.recv(65536)
        except BlockingIOError:
            break
        if not b:
            eof = True
            break
        got.update(b)
        n += len(b)
t.join()
print("received", n, got.hexdigest() == sent.hexdigest(), flush=True)
"#;

#[test]
fn an_epoll_reader_gets_a_zcopy_writers_bytes() {
    let stat = TempDir::new("sdp-zcopy-epoll");
    let pm = PortMapper::start();
    let mut cmd = python_command(ZCOPY_TO_EPOLL, Mode::Sdp, stat.path());
    // Both: the reader would take a SrcAvail by RDMA Read into a posted
    // buffer, so it waits for a read instead of answering at once.
    pm.apply(&mut cmd)
        .env("SDP_ZCOPY", "both")
        .env("SDP_ZCOPY_THRESHOLD", "1M");
    let out = run_ok(cmd);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim_end(),
        format!("received {} True", 32 << 20)
    );
}

/// An echo server whose accepting process is a child (which takes no
/// connection ahead of its `accept`: only the process that called
/// `listen` does): prints its port, forks on the first line of input, the
/// parent closing its listener; the child prints `accepting` and, on the
/// next line, accepts (upper-case echo, until `quit` or the end of its input).
const CHILD_SERVER: &str = r#"
import os, socket, sys, threading
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
print("port", srv.getsockname()[1], flush=True)
sys.stdin.readline()
pid = os.fork()
if pid:
    srv.close()
    _, status = os.waitpid(pid, 0)
    sys.exit(os.waitstatus_to_exitcode(status))
print("accepting", flush=True)
sys.stdin.readline()
# Gone with the test: its end closes our standard input.
threading.Thread(target=lambda: (sys.stdin.read(), os._exit(1)), daemon=True).start()
while True:
    a, _ = srv.accept()
    try:
        d = a.recv(100)
    except ConnectionResetError:
        # The silent client, reset at the MPA startup timer.
        print("reset", flush=True)
        a.close()
        continue
    if d == b"quit":
        break
    a.sendall(d.upper())
    a.close()
"#;

/// A client that sends its MPA Request and then nothing more (no RTR) is
/// handed out by `accept` once answered, as TCP hands out a client that
/// connected and sends nothing: the program's read on it waits, and ends
/// in ECONNRESET when the MPA startup timer ends the stalled setup; the
/// next client is served after it.
#[test]
fn a_client_silent_after_its_mpa_request_is_reset_at_the_startup_timer() {
    use portmapper::client::{ClientConfig, Decision};
    use portmapper::net::PmClient;
    use sdp_core::stream::{Driver, SdpStream};
    use std::io::{Read, Write};

    let stat = TempDir::new("sdp-silent-rtr");
    let pm = PortMapper::start();
    let mut cmd = python_command(CHILD_SERVER, Mode::Sdp, stat.path());
    pm.apply(&mut cmd).stdin(Stdio::piped());
    let mut server = Background::start(cmd);
    let port = numbers(&server.wait_for_line("port"))[0] as u16;
    let mut input = server.child.stdin.take().unwrap();
    input.write_all(b"fork\n").unwrap();
    server.wait_for_line("accepting");
    let ap: SocketAddr = ([127, 0, 0, 1], port).into();
    let pmc = PmClient::new(ClientConfig {
        server_port: pm.port,
        ..ClientConfig::default()
    });
    let Decision::Sdp(q) = pmc.query(ap, ([127, 0, 0, 1], 0).into()) else {
        panic!("the server's listener is not registered with the port mapper");
    };

    // The MPA Request goes as the stream is made, before the server
    // accepts; its caller never drives it on, so nothing reads the Reply
    // or sends the RTR.
    let start = Instant::now();
    let tcp = std::net::TcpStream::connect(q).unwrap();
    let silent =
        SdpStream::start_connect_by(tcp, &sdp_core::conn::Config::default(), Driver::Caller)
            .unwrap();
    input.write_all(b"accept\n").unwrap();
    server.wait_for_line("reset");
    let reset = start.elapsed();
    assert!(
        reset >= iwarp::mpa::startup::DEFAULT_TIMEOUT - Duration::from_millis(100)
            && reset < iwarp::mpa::startup::DEFAULT_TIMEOUT + Duration::from_secs(5),
        "the silent client's read ended after {reset:?}, not at the MPA startup timer"
    );

    let mut good = SdpStream::connect(q).unwrap();
    good.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    good.write_all(b"hello").unwrap();
    let mut got = [0u8; 5];
    good.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"HELLO");

    drop(good);
    drop(silent);
    let mut quit = SdpStream::connect(q).unwrap();
    quit.write_all(b"quit").unwrap();
    let (status, _) = server.finish();
    drop(input);
    assert!(status.success());
}
