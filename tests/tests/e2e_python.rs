//! Issue 6, item 6: a Python program using selectors (epoll), a
//! nonblocking connect, `MSG_PEEK`, `sendall` of 100 MiB and
//! `shutdown(SHUT_WR)` gives identical results with and without the
//! preload, and under the preload both ends of its connection are SDP.
//!
//! The program is the pass-through test's (preload_passthrough.rs), changed
//! only so that it holds its connection open after the exchange and prints
//! its pid and fds, for the test to read the state export.

use sdp_tests::e2e::{expect_sdp, field, Env, Proc};
use sdp_tests::preload::Mode;

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
release = threading.Event()

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
                result.update(peek=peeked, n=n, sha=h.hexdigest(), fd=conn.fileno())
                conn.setblocking(True)
                conn.sendall(h.hexdigest().encode())
                conn.shutdown(socket.SHUT_WR)
                release.wait()
                conn.close()
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
while True:
    d = c.recv(100)
    if not d:
        break
    reply += d
print("connect", rc in (0, errno.EINPROGRESS), "writable", len(ready), "so_error", err)
print("peek", len(result["peek"]) > 0 and block(0).startswith(result["peek"]))
print("received", result["n"], result["sha"])
print("sent", TOTAL, sent.hexdigest())
print("reply", reply.decode() == sent.hexdigest())
print("hold", os.getpid(), c.fileno(), result["fd"])
sys.stdin.readline()
release.set()
t.join()
"#;

/// The pid, client fd and accepted fd of a `hold PID CLIENT ACCEPTED`
/// line.
fn held(line: &str) -> (u32, usize, usize) {
    let n: Vec<u32> = line
        .split_whitespace()
        .skip(1)
        .map(|w| w.parse().unwrap())
        .collect();
    (n[0], n[1] as usize, n[2] as usize)
}

/// Runs the program; returns its result lines, and the records of its
/// client and accepted sockets while it holds them.
fn run(env: &Env, mode: Mode) -> (Vec<String>, Option<(u8, u8)>) {
    let mut p = Proc::spawn("python stream", env.python(STREAM, mode), true);
    let (pid, client, accepted) = held(&p.wait_line(|l| l.starts_with("hold ")));
    let roles = (mode == Mode::Sdp).then(|| {
        let c = env.wait_records("client socket", pid, 1, |r| r.fd == client);
        let a = env.wait_records("accepted socket", pid, 1, |r| r.fd == accepted);
        expect_sdp("python client socket (nonblocking connect)", &c[0]);
        expect_sdp("python accepted socket (epoll server)", &a[0]);
        (c[0].role, a[0].role)
    });
    p.send("\n");
    let out = p.finish_ok();
    let lines = out
        .stdout
        .lines()
        .filter(|l| !l.starts_with("hold "))
        .map(str::to_owned)
        .collect();
    (lines, roles)
}

#[test]
fn python_stream_is_identical_and_sdp_under_the_preload() {
    let env = Env::new("python-stream");
    let (plain, _) = run(&env, Mode::Plain);
    let (preloaded, roles) = run(&env, Mode::Sdp);
    assert_eq!(roles, Some((field::CLIENT, field::ACCEPTED)));
    assert_eq!(preloaded.len(), 5, "{preloaded:?}");
    assert_eq!(preloaded[0], "connect True writable 1 so_error 0");
    assert_eq!(preloaded[1], "peek True");
    let received = preloaded[2].strip_prefix("received ").unwrap();
    let sent = preloaded[3].strip_prefix("sent ").unwrap();
    assert_eq!(received, sent);
    assert!(sent.starts_with("104857600 "));
    assert_eq!(preloaded[4], "reply True");
    assert_eq!(preloaded, plain);
}

/// A nonblocking connect whose server's blocking `accept` returned is
/// complete, as over TCP: `epoll_wait` and `poll` with no wait report the
/// client writable, `SO_ERROR` is 0 and a send goes out. (CPython's
/// test_epoll relies on it.) The setup's last message is in the client's
/// socket by then; the program's own call reads it.
const CONNECT_DONE: &str = r#"
import os, select, socket, sys
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(8)
ROUNDS = 60
seen = {"epoll": 0, "poll": 0, "send": 0}
for i in range(ROUNDS):
    c = socket.socket()
    c.setblocking(False)
    rc = c.connect_ex(srv.getsockname())
    s, _ = srv.accept()
    how = ("epoll", "poll", "send")[i % 3]
    if how == "epoll":
        ep = select.epoll()
        ep.register(c.fileno(), select.EPOLLIN | select.EPOLLOUT)
        ok = ep.poll(0) == [(c.fileno(), select.EPOLLOUT)]
        ep.close()
    elif how == "poll":
        p = select.poll()
        p.register(c, select.POLLIN | select.POLLOUT)
        ok = p.poll(0) == [(c.fileno(), select.POLLOUT)]
    else:
        err = c.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        try:
            ok = err == 0 and c.send(b"x") == 1 and s.recv(1) == b"x"
        except BlockingIOError:
            ok = False
    seen[how] += ok
    if i < ROUNDS - 1:
        c.close()
        s.close()
print("complete", seen["epoll"], seen["poll"], seen["send"], "of", ROUNDS // 3)
print("hold", os.getpid(), c.fileno(), s.fileno())
sys.stdin.readline()
"#;

/// Runs `script` (in `mode`), which prints a line starting with `result`
/// and then `hold PID CLIENT ACCEPTED` and waits: under the preload both
/// ends of its connection must be SDP. Returns the result line.
fn run_pair(env: &Env, name: &str, script: &str, mode: Mode, result: &str) -> String {
    let mut p = Proc::spawn(name, env.python(script, mode), true);
    let line = p.wait_line(|l| l.starts_with(result));
    let (pid, client, accepted) = held(&p.wait_line(|l| l.starts_with("hold ")));
    if mode == Mode::Sdp {
        let c = env.wait_records("client socket", pid, 1, |r| r.fd == client);
        let a = env.wait_records("accepted socket", pid, 1, |r| r.fd == accepted);
        expect_sdp(&format!("{name}: client socket"), &c[0]);
        expect_sdp(&format!("{name}: accepted socket"), &a[0]);
    }
    p.send("\n");
    p.finish_ok();
    line
}

fn run_connect_done(env: &Env, mode: Mode) -> String {
    run_pair(env, "python connect", CONNECT_DONE, mode, "complete ")
}

#[test]
fn a_nonblocking_connect_is_complete_once_its_server_accepted() {
    let env = Env::new("python-connect");
    let plain = run_connect_done(&env, Mode::Plain);
    assert_eq!(plain, "complete 20 20 20 of 20", "over TCP");
    let preloaded = run_connect_done(&env, Mode::Sdp);
    assert_eq!(preloaded, plain);
}

/// A connection accepted from a listener whose SO_RCVBUF and SO_SNDBUF
/// the program set, before `listen` or after it, has the same buffer sizes
/// under the preload as over TCP (the kernel copies them from the
/// listener; the hidden SDP listener takes them from the program's). A
/// program that makes its buffers small relies on flow control reaching
/// it early, and SDP sizes its receive buffers by them.
const BUFFERS: &str = r#"
import os, socket, sys, threading
SOL, RCV, SND = socket.SOL_SOCKET, socket.SO_RCVBUF, socket.SO_SNDBUF
held = []
def accepted_sizes(before):
    srv = socket.socket()
    if before:
        srv.setsockopt(SOL, RCV, 4096)
        srv.setsockopt(SOL, SND, 8192)
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    if not before:
        srv.setsockopt(SOL, RCV, 6144)
        srv.setsockopt(SOL, SND, 12288)
    c = socket.socket()
    t = threading.Thread(target=c.connect, args=(srv.getsockname(),))
    t.start()
    s, _ = srv.accept()
    t.join()
    held.extend([srv, c, s])
    return s.fileno(), s.getsockopt(SOL, RCV), s.getsockopt(SOL, SND)
fb, rb, sb = accepted_sizes(True)
fa, ra, sa = accepted_sizes(False)
print("sizes", rb, sb, ra, sa)
print("hold", os.getpid(), fb, fa)
sys.stdin.readline()
"#;

fn run_buffers(env: &Env, mode: Mode) -> String {
    let mut p = Proc::spawn("python buffers", env.python(BUFFERS, mode), true);
    let sizes = p.wait_line(|l| l.starts_with("sizes "));
    let (pid, before, after) = held(&p.wait_line(|l| l.starts_with("hold ")));
    if mode == Mode::Sdp {
        for (what, fd) in [("set before listen", before), ("set after listen", after)] {
            let r = env.wait_records("accepted socket", pid, 1, |r| r.fd == fd);
            expect_sdp(&format!("accepted socket, buffer sizes {what}"), &r[0]);
        }
    }
    p.send("\n");
    p.finish_ok();
    sizes
}

#[test]
fn an_accepted_connection_has_its_listeners_buffer_sizes() {
    let env = Env::new("python-buffers");
    let plain = run_buffers(&env, Mode::Plain);
    // Linux reports twice what was asked.
    assert_eq!(plain, "sizes 8192 16384 12288 24576", "over TCP");
    let preloaded = run_buffers(&env, Mode::Sdp);
    assert_eq!(preloaded, plain);
}

/// A threaded server whose threads block in `recv` on connections that
/// stay quiet: the process spends no CPU while they wait, as over TCP.
/// (The accepted connections' first grace ran out while their readers
/// slept, and the progress thread spun on it until the first byte came.)
const QUIET: &str = r#"
import os, socket, sys, threading, time
N = 8
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(N)
got, accepted = [], []
def serve(s):
    got.append(s.recv(100))
    s.sendall(b"back")
def accept_all():
    # Blocked in accept before each connect comes, as a server is.
    for _ in range(N):
        s, _ = srv.accept()
        accepted.append(s)
        threading.Thread(target=serve, args=(s,)).start()
acceptor = threading.Thread(target=accept_all)
acceptor.start()
clients = [socket.create_connection(srv.getsockname()) for _ in range(N)]
acceptor.join()
time.sleep(0.1)
cpu = time.process_time()
time.sleep(1.0)
spent = time.process_time() - cpu
for c in clients:
    c.sendall(b"hello")
replies = [c.recv(100) for c in clients]
print("quiet", "busy" if spent > 0.1 else "idle", len(got), got.count(b"hello"), replies.count(b"back"))
print("hold", os.getpid(), clients[0].fileno(), accepted[0].fileno())
sys.stdin.readline()
"#;

fn run_quiet(env: &Env, mode: Mode) -> String {
    run_pair(env, "python quiet", QUIET, mode, "quiet ")
}

#[test]
fn quiet_connections_with_blocked_readers_cost_no_cpu() {
    let env = Env::new("python-quiet");
    let plain = run_quiet(&env, Mode::Plain);
    assert_eq!(plain, "quiet idle 8 8 8", "over TCP");
    let preloaded = run_quiet(&env, Mode::Sdp);
    assert_eq!(preloaded, plain);
}
