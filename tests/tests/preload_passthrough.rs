//! Real programs under `libsdp_preload.so` with no port mapper answering
//! (the harness points them at a UDP port where nothing listens), so every
//! connection falls back to TCP at once: a program must behave exactly as
//! without the preload — same output bytes, same stream hashes, same exit
//! status. The state export must show each socket with the decision and
//! its reason. Readiness of servers is a line they print, never a sleep.
//! `preload_sdp.rs` runs programs over SDP.

use sdp_tests::portmapper::PortMapper;
use sdp_tests::preload::{
    artifacts, command, free_port, python, python_command, require, run_ok, Background, Mode,
    TempDir,
};
use sdp_tests::programs;
use sdp_tests::statfile;
use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;

// Values of the state export (docs/preload.md).
const TCP: u8 = 1;
const SDP: u8 = 2;
const CLIENT: u8 = 1;
const LISTENER: u8 = 2;
const ACCEPTED: u8 = 3;
const WANT_SDP: u8 = 1;
const WANT_TCP: u8 = 2;
const WANT_BOTH: u8 = 3;
const BY_DEFAULT: u8 = 1;
const BY_RULE: u8 = 2;
const BY_FORCED: u8 = 3;
const BY_LISTENER: u8 = 4;
const REASON_NONE: u8 = 0;
const REASON_RULE_TCP: u8 = 1;
const REASON_PM_UNREACHABLE: u8 = 5;
const FLAG_FORCED: u8 = 1;

/// Nonblocking connect, epoll (selectors) server, MSG_PEEK, sendall of
/// 100 MiB, shutdown(SHUT_WR), the hash echoed back.
const STREAM: &str = r#"
import errno, hashlib, selectors, socket, threading
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
                result.update(peek=peeked, n=n, sha=h.hexdigest())
                conn.setblocking(True)
                conn.sendall(h.hexdigest().encode())
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
t.join()
print("connect", rc in (0, errno.EINPROGRESS), "writable", len(ready), "so_error", err)
print("peek", len(result["peek"]) > 0 and block(0).startswith(result["peek"]))
print("received", result["n"], result["sha"])
print("sent", TOTAL, sent.hexdigest())
print("reply", reply.decode() == sent.hexdigest())
"#;

#[test]
fn python_stream_is_identical_with_and_without_the_preload() {
    let stat = TempDir::new("stream");
    let plain = run_ok(python_command(STREAM, Mode::Plain, stat.path()));
    let preloaded = run_ok(python_command(STREAM, Mode::Preload, stat.path()));
    let text = String::from_utf8(preloaded.stdout.clone()).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert_eq!(lines[0], "connect True writable 1 so_error 0");
    assert_eq!(lines[1], "peek True");
    let received = lines[2].strip_prefix("received ").unwrap();
    let sent = lines[3].strip_prefix("sent ").unwrap();
    assert_eq!(received, sent);
    assert!(sent.starts_with("104857600 "));
    assert_eq!(lines[4], "reply True");
    assert_eq!(preloaded.stdout, plain.stdout);
    assert_eq!(
        preloaded.stderr, b"",
        "the library logged at the default level"
    );
}

/// A 1 MiB file served by `python3 -m http.server` and fetched with curl
/// and wget, every process preloaded.
#[test]
fn http_server_with_curl_and_wget() {
    require("curl");
    require("wget");
    let stat = TempDir::new("http");
    let www = TempDir::new("www");
    let blob: Vec<u8> = (0..1u32 << 20)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    www.file("blob.bin", &blob);
    let mut server = command(python(), Mode::Preload, stat.path());
    server
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
    // "Serving HTTP on 127.0.0.1 port 41234 (http://127.0.0.1:41234/) ..."
    let port: u16 = line
        .split_whitespace()
        .skip_while(|w| *w != "port")
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    let url = format!("http://127.0.0.1:{port}/blob.bin");

    let mut curl = command("curl", Mode::Preload, stat.path());
    curl.args(["-sS", "--fail", &url]);
    assert!(run_ok(curl).stdout == blob, "curl got other bytes");

    let mut wget = command("wget", Mode::Preload, stat.path());
    wget.args(["-q", "-O", "-", &url]);
    assert!(run_ok(wget).stdout == blob, "wget got other bytes");
}

fn json_u64_after(json: &str, section: &str, key: &str) -> u64 {
    let at = json
        .find(section)
        .unwrap_or_else(|| panic!("no {section} in iperf3 output"));
    let rest = &json[at..];
    let k = rest.find(key).expect("key in section");
    rest[k + key.len()..]
        .trim_start_matches([':', ' ', '\t'])
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a number")
}

#[test]
fn iperf3_transfers_exactly_under_the_preload() {
    require("iperf3");
    let stat = TempDir::new("iperf");
    let port = free_port().to_string();
    let mut server = command("iperf3", Mode::Preload, stat.path());
    server.args(["-s", "-1", "-p", &port, "--forceflush"]);
    let mut server = Background::start(server);
    server.wait_for_line("Server listening on");
    let mut client = command("iperf3", Mode::Preload, stat.path());
    client.args(["-c", "127.0.0.1", "-p", &port, "-n", "64M", "-J"]);
    let out = run_ok(client);
    let json = String::from_utf8_lossy(&out.stdout);
    assert_eq!(json_u64_after(&json, "\"sum_sent\"", "\"bytes\""), 64 << 20);
    // iperf3 snapshots the receiver's count when the sender reports the
    // end, with data still in flight: at most what was sent (so it is
    // checked for sanity, not equality; plain iperf3 does the same).
    let received = json_u64_after(&json, "\"sum_received\"", "\"bytes\"");
    assert!(received > 0 && received <= 64 << 20, "received {received}");
    let (status, _) = server.finish();
    assert!(status.success());
}

/// Accept-then-fork server: each connection served by a forked child, the
/// parent closing its copy; the client is a forked process too.
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
        print(data.decode().strip())
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
        conn.sendall(line.upper()[::-1])
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

#[test]
fn accept_then_fork_server() {
    let stat = TempDir::new("fork");
    let expected = "0 OLLEH\n1 OLLEH\n2 OLLEH\nserver done 0\n";
    let plain = run_ok(python_command(FORKING_SERVER, Mode::Plain, stat.path()));
    assert_eq!(String::from_utf8_lossy(&plain.stdout), expected);
    let preloaded = run_ok(python_command(FORKING_SERVER, Mode::Preload, stat.path()));
    assert_eq!(String::from_utf8_lossy(&preloaded.stdout), expected);
    assert_eq!(preloaded.stderr, b"");
}

#[test]
fn prefork_server() {
    let stat = TempDir::new("prefork");
    let expected = "reply:req0 reply:req1 reply:req2 reply:req3 reply:req4 reply:req5 [0, 0, 0]\n";
    let plain = run_ok(python_command(
        programs::PREFORK_SERVER,
        Mode::Plain,
        stat.path(),
    ));
    assert_eq!(String::from_utf8_lossy(&plain.stdout), expected);
    let preloaded = run_ok(python_command(
        programs::PREFORK_SERVER,
        Mode::Preload,
        stat.path(),
    ));
    assert_eq!(String::from_utf8_lossy(&preloaded.stdout), expected);
    assert_eq!(preloaded.stderr, b"");
}

/// Socket calls with everything logged, to stderr and to a file: standard
/// output stays the program's own, byte for byte.
const CHATTY: &str = r#"
import socket, sys
srv = socket.socket(socket.AF_INET6)
srv.bind(("::1", 0))
srv.listen()
c = socket.create_connection(srv.getsockname()[:2])
a, _ = srv.accept()
c.sendall(b"ping")
print("got", a.recv(4).decode())
sys.stdout.write("no newline at the end")
"#;

#[test]
fn the_library_writes_nothing_to_stdout() {
    let stat = TempDir::new("stdout");
    let conf = stat.file("bad.conf", b"use nonsense\n");
    let plain = run_ok(python_command(CHATTY, Mode::Plain, stat.path()));
    let mut cmd = python_command(CHATTY, Mode::Preload, stat.path());
    cmd.env("SDP_LOG", "trace").env("SDP_CONFIG", &conf);
    let preloaded = run_ok(cmd);
    assert_eq!(preloaded.stdout, plain.stdout);
    assert_eq!(plain.stdout, b"got ping\nno newline at the end");
    let err = String::from_utf8_lossy(&preloaded.stderr);
    assert!(err.contains("libsdp["), "nothing logged to stderr: {err}");
    assert!(err.contains("connect [::1]:"), "{err}");

    let log = stat.path().join("sdp.log");
    let mut cmd = python_command(CHATTY, Mode::Preload, stat.path());
    cmd.env("SDP_LOG", "debug").env("SDP_LOG_FILE", &log);
    let to_file = run_ok(cmd);
    assert_eq!(to_file.stdout, plain.stdout);
    assert_eq!(to_file.stderr, b"");
    let text = std::fs::read_to_string(&log).expect("log file written");
    assert!(text.contains("listen [::1]:"), "{text}");
}

/// Connects to a listener of its own and echoes a line; prints the pid so
/// the test can find the export file, then waits until stdin closes.
const ECHO: &str = r#"
import os, socket, sys
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
c = socket.create_connection(srv.getsockname())
a, _ = srv.accept()
c.sendall(b"ok")
print("echo", a.recv(2).decode(), os.getpid(), srv.fileno(), c.fileno(), a.fileno(), srv.getsockname()[1])
sys.stdin.read()
"#;

#[test]
fn bad_rules_file_is_reported_with_line_numbers_and_the_program_works() {
    let stat = TempDir::new("badconf");
    let conf = stat.file(
        "libsdp.conf",
        b"# rules\nuse tcp client * *:22\nuse sdp sideways * *:*\nuse both connect python3* 127.0.0.1:1-65535\n",
    );
    let mut cmd = python_command(ECHO, Mode::Sdp, stat.path());
    cmd.env("SDP_CONFIG", &conf);
    cmd.stdin(Stdio::piped()).stderr(Stdio::piped());
    let mut program = Background::start(cmd);
    let line = program.wait_for_line("echo ok");
    let f: Vec<u32> = line
        .split_whitespace()
        .skip(2)
        .map(|w| w.parse().unwrap())
        .collect();
    let (pid, srv, client, accepted, port) = (
        f[0],
        f[1] as usize,
        f[2] as usize,
        f[3] as usize,
        f[4] as u16,
    );

    let state = statfile::read(stat.path(), pid).expect("state export file");
    assert!(state.program.starts_with("python3"), "{}", state.program);
    let srv_addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // The hidden SDP listener exists even without a port mapper.
    let l = state.record(srv).expect("listener record");
    assert_eq!(
        (l.transport, l.role, l.want, l.decided_by, l.reason, l.local),
        (
            SDP,
            LISTENER,
            WANT_BOTH,
            BY_DEFAULT,
            REASON_NONE,
            Some(srv_addr)
        )
    );
    // The third line is skipped, so the `use both connect` line is rule 2.
    let c = state.record(client).expect("client record");
    assert_eq!(
        (
            c.transport,
            c.role,
            c.want,
            c.decided_by,
            c.rule,
            c.reason,
            c.peer
        ),
        (
            TCP,
            CLIENT,
            WANT_BOTH,
            BY_RULE,
            2,
            REASON_PM_UNREACHABLE,
            Some(srv_addr)
        )
    );
    let a = state.record(accepted).expect("accepted record");
    assert_eq!(
        (a.role, a.decided_by, a.local),
        (ACCEPTED, BY_LISTENER, Some(srv_addr))
    );
    assert_eq!(a.peer, c.local);

    drop(program.child.stdin.take());
    let mut stderr = program.child.stderr.take().unwrap();
    let (status, _) = program.finish();
    assert!(status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut err).unwrap();
    let expected = format!(
        "{}: line 3: unknown role \"sideways\" (server, listen, client or connect) (line skipped)",
        conf.display()
    );
    assert!(err.contains(&expected), "stderr: {err}");
    assert_eq!(err.lines().count(), 1, "stderr: {err}");
    assert!(
        !stat.path().join(format!("{pid}.stat")).exists(),
        "export file left after exit"
    );
}

/// `socket(AF_INET_SDP, ...)` through ctypes (Python's own socket module
/// does not know family 27), then used as an ordinary socket. SDP only:
/// without a port mapper the connect is refused.
const AF_INET_SDP: &str = r#"
import ctypes, os, socket, sys
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.socket(27, socket.SOCK_STREAM, 0)
if fd < 0:
    print("socket failed", os.strerror(ctypes.get_errno()))
    sys.exit(0)
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
s = socket.socket(fileno=fd)
try:
    s.connect(srv.getsockname())
except OSError as e:
    print("connect failed", e.errno == 111)
    sys.exit(0)
a, _ = srv.accept()
a.sendall(b"sdp?")
print("family", s.family == socket.AF_INET, "echo", s.recv(4).decode(), os.getpid(), fd, srv.getsockname()[1])
sys.stdin.read()
"#;

#[test]
fn af_inet_sdp_socket_is_accepted_and_forced() {
    let stat = TempDir::new("afsdp");
    // Without the preload the kernel refuses family 27 (AF_IB).
    let plain = run_ok(python_command(AF_INET_SDP, Mode::Plain, stat.path()));
    assert!(String::from_utf8_lossy(&plain.stdout).starts_with("socket failed"));

    // SDP only, and no port mapper answers: ECONNREFUSED, no fallback.
    let refused = run_ok(python_command(AF_INET_SDP, Mode::Sdp, stat.path()));
    assert_eq!(
        String::from_utf8_lossy(&refused.stdout),
        "connect failed True\n"
    );

    let pm = PortMapper::start();
    let mut cmd = python_command(AF_INET_SDP, Mode::Sdp, stat.path());
    pm.apply(&mut cmd).stdin(Stdio::piped());
    let mut program = Background::start(cmd);
    let line = program.wait_for_line("family True echo sdp?");
    let f: Vec<u32> = line
        .split_whitespace()
        .skip(4)
        .map(|w| w.parse().unwrap())
        .collect();
    let (pid, fd, port) = (f[0], f[1] as usize, f[2] as u16);
    let state = statfile::read(stat.path(), pid).expect("state export file");
    let r = state.record(fd).expect("record of the AF_INET_SDP socket");
    assert_eq!(
        (
            r.transport,
            r.role,
            r.want,
            r.decided_by,
            r.reason,
            r.flags & FLAG_FORCED
        ),
        (SDP, CLIENT, WANT_SDP, BY_FORCED, REASON_NONE, FLAG_FORCED)
    );
    assert_eq!(r.peer, Some(format!("127.0.0.1:{port}").parse().unwrap()));
    drop(program.child.stdin.take());
    let (status, _) = program.finish();
    assert!(status.success());
}

/// dup2, close and fork keep the table (and so the export) right: the
/// parent's and the child's files each list exactly their own sockets.
const DUP_FORK: &str = r#"
import os, socket, sys
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
tcp_only = socket.socket(socket.AF_INET6)
tcp_only.bind(("::1", 0))
tcp_only.listen()
c = socket.create_connection(srv.getsockname())
a, _ = srv.accept()
t = socket.create_connection(tcp_only.getsockname()[:2])
os.dup2(c.fileno(), 100)
old = c.fileno()
c.close()
r, w = os.pipe()
child = os.fork()
if child == 0:
    srv.close()
    os.write(w, b"x")
    sys.stdin.read()
    sys.exit(0)
os.read(r, 1)
print("pids", os.getpid(), child, "fds", srv.fileno(), old, a.fileno(), t.fileno())
sys.stdin.read()
os.waitpid(child, 0)
"#;

#[test]
fn dup2_close_and_fork_keep_the_state_right() {
    let stat = TempDir::new("dupfork");
    // Connections to [::1] are TCP by rule 1; the others by default.
    let conf = stat.file("rules.conf", b"use tcp connect * [::1]:*\n");
    let mut cmd = python_command(DUP_FORK, Mode::Preload, stat.path());
    cmd.env("SDP_CONFIG", &conf).stdin(Stdio::piped());
    let mut program = Background::start(cmd);
    let line = program.wait_for_line("pids");
    let n: Vec<u32> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let (parent, child) = (n[0], n[1]);
    let (srv, old, accepted, tcp) = (n[2] as usize, n[3] as usize, n[4] as usize, n[5] as usize);

    let p = statfile::read(stat.path(), parent).expect("parent export");
    assert!(p.record(old).is_none(), "closed fd {old} still listed");
    let dup = p.record(100).expect("dup2 target listed");
    assert_eq!((dup.role, dup.transport), (CLIENT, TCP));
    assert!(p.record(srv).is_some() && p.record(accepted).is_some());
    let t = p.record(tcp).expect("rule-tcp connection");
    assert_eq!(
        (t.want, t.decided_by, t.rule, t.reason),
        (WANT_TCP, BY_RULE, 1, REASON_RULE_TCP)
    );

    let c = statfile::read(stat.path(), child).expect("child export");
    assert_eq!(c.pid, child);
    assert!(
        c.record(srv).is_none(),
        "listener closed in the child still listed"
    );
    assert_eq!(c.record(100), p.record(100));
    assert_eq!(c.record(tcp), p.record(tcp));

    drop(program.child.stdin.take());
    let (status, _) = program.finish();
    assert!(status.success());
    assert!(!stat.path().join(format!("{parent}.stat")).exists());
    assert!(!stat.path().join(format!("{child}.stat")).exists());
}

/// A C program built with `-D_FORTIFY_SOURCE=2`, so that it calls the
/// `_chk` variants, exercises the calls Python does not make: the same
/// output with and without the preload, except that `socket(27, ...)`
/// works only with it (the address may carry family 27 too).
#[test]
fn fortified_c_program_is_identical_with_and_without_the_preload() {
    require("cc");
    require("nm");
    let stat = TempDir::new("cprog");
    let exe = stat.path().join("passthrough");
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("c/passthrough.c");
    let status = std::process::Command::new("cc")
        .args(["-O2", "-D_FORTIFY_SOURCE=2", "-Wall", "-Werror", "-o"])
        .arg(&exe)
        .arg(&source)
        .status()
        .expect("run cc");
    assert!(status.success());
    let nm = std::process::Command::new("nm")
        .arg("-D")
        .arg(&exe)
        .output()
        .unwrap();
    let imports = String::from_utf8_lossy(&nm.stdout);
    for chk in [
        "__read_chk",
        "__recv_chk",
        "__recvfrom_chk",
        "__poll_chk",
        "__ppoll_chk",
    ] {
        assert!(imports.contains(chk), "{chk} not imported:\n{imports}");
    }

    let mut plain = command(&exe, Mode::Plain, stat.path());
    plain.arg("sdp");
    let plain = String::from_utf8(run_ok(plain).stdout).unwrap();
    // With a port mapper: every connection of the program is SDP (the
    // AF_INET_SDP one has no fallback).
    let pm = PortMapper::start();
    let mut preloaded = command(&exe, Mode::Sdp, stat.path());
    pm.apply(&mut preloaded).arg("sdp");
    let preloaded = run_ok(preloaded);
    let text = String::from_utf8(preloaded.stdout).unwrap();
    let sdp_line = |t: &str| {
        t.lines()
            .find(|l| l.starts_with("AF_INET_SDP"))
            .map(str::to_owned)
    };
    assert_eq!(
        sdp_line(&plain).as_deref(),
        Some("AF_INET_SDP: Address family not supported by protocol")
    );
    assert_eq!(
        sdp_line(&text).as_deref(),
        Some("AF_INET_SDP: connected, peer family 2")
    );
    let others = |t: &str| -> Vec<String> {
        t.lines()
            .filter(|l| !l.starts_with("AF_INET_SDP"))
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(others(&text), others(&plain));
    assert_eq!(
        others(&text).join("\n"),
        "nonblocking connect: in progress or done\npoll writable: 1 1\nSO_ERROR: 0\n\
         ppoll readable: 1\nFIONREAD: 11\npeek: hello\nread: hello\nrecvfrom:  world\n\
         readv: 4 ab cd\nrecvmsg: 4 ab cd\nselect: 1 1\npselect: 1\nepoll_pwait: 1 42\n\
         epoll_wait drained: 0\ndups: 50 60 70\nsendfile: 10\nafter sendfile: file-bytes\n\
         eof: 0\ndone"
    );
    assert_eq!(
        String::from_utf8_lossy(&preloaded.stderr),
        "",
        "the library logged at the default level"
    );
}

#[test]
fn sdprun_execs_the_program_with_the_preload() {
    let a = artifacts();
    let stat = TempDir::new("sdprun");
    let conf = stat.file("r.conf", b"use tcp client * *:22\n");
    let probe = "import os, sys; print(os.environ['LD_PRELOAD']); print(os.environ['SDP_CONFIG']); print(os.environ['SDP_LOG']); sys.exit(3)";
    let mut cmd = command(&a.sdprun, Mode::Plain, stat.path());
    cmd.env("LD_PRELOAD", "libc.so.6")
        .current_dir(stat.path())
        .args(["--config", "r.conf", "--log", "error"])
        .arg(python())
        .args(["-c", probe]);
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lib = std::fs::canonicalize(&a.library).unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("libc.so.6 {}\n{}\nerror\n", lib.display(), conf.display())
    );

    // exec: a signal that kills the program is sdprun's own end.
    let mut cmd = command(&a.sdprun, Mode::Plain, stat.path());
    cmd.arg(python()).args([
        "-c",
        "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
    ]);
    let out = cmd.output().unwrap();
    assert_eq!(out.status.signal(), Some(15));

    let mut cmd = command(&a.sdprun, Mode::Plain, stat.path());
    cmd.args(["--log", "loud", "true"]);
    let out = cmd.output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("sdprun: unknown log level \"loud\""));
}

/// DESIGN §5: "sdprun starts a daemon in the background when none answers
/// on the host", and leaves one that answers alone.
#[test]
fn sdprun_starts_a_port_mapper_when_none_answers() {
    let a = artifacts();
    let stat = TempDir::new("sdprun-pm");
    let control = stat.path().join("pm.sock");
    // A UDP port nobody serves: bind one, note it, let it go.
    let port = std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("free UDP port")
        .port();
    let query = || {
        std::process::Command::new(&a.portmapper)
            .args(["query", "--port", &port.to_string(), "127.0.0.1", "9"])
            .output()
            .expect("run sdp-portmapper query")
    };
    assert_eq!(
        String::from_utf8_lossy(&query().stdout).trim(),
        "unreachable"
    );

    let run = || {
        let mut cmd = command(&a.sdprun, Mode::Plain, stat.path());
        cmd.env_remove("SDP_NO_PORTMAPPER")
            .env("SDP_PM_PORT", port.to_string())
            .env("SDP_PM_CONTROL", &control)
            .arg("true");
        run_ok(cmd)
    };
    run();
    // The daemon sdprun started answers (PMDeny: nothing is registered).
    assert_eq!(String::from_utf8_lossy(&query().stdout).trim(), "deny");
    let daemons = || daemon_pids(&port.to_string());
    let started = daemons();
    assert_eq!(started.len(), 1, "one daemon on port {port}");
    // A second run finds it answering and starts no other.
    run();
    assert_eq!(daemons(), started);
    for pid in started {
        let _ = std::process::Command::new("kill")
            .arg(pid.to_string())
            .status();
    }
}

/// Processes running `sdp-portmapper --port PORT`.
fn daemon_pids(port: &str) -> Vec<u32> {
    let mut pids = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
        let is_daemon = args.first().is_some_and(|a| a.ends_with(b"sdp-portmapper"));
        if is_daemon
            && args
                .windows(2)
                .any(|w| w[0] == b"--port" && w[1] == port.as_bytes())
        {
            pids.push(pid);
        }
    }
    pids.sort_unstable();
    pids
}

/// Programs the library cannot reach still run, over TCP, and `sdprun`
/// says why on standard error (never standard output): a statically linked
/// one, one that makes its socket calls without the C library (a Go
/// program: here a C program carrying the Go toolchain's build-id section,
/// which is how sdprun tells), one setuid to another user, and a script
/// whose interpreter is one of those. A plain dynamic program gets no
/// word.
#[test]
fn sdprun_names_programs_the_library_cannot_reach() {
    require("cc");
    require("objcopy");
    let a = artifacts();
    let stat = TempDir::new("unreachable");
    let source = stat.file(
        "hello.c",
        b"#include <stdio.h>\nint main(void) { puts(\"hello\"); return 0; }\n",
    );
    let build = |name: &str, extra: &[&str]| {
        let exe = stat.path().join(name);
        let status = std::process::Command::new("cc")
            .args(extra)
            .arg("-o")
            .arg(&exe)
            .arg(&source)
            .status()
            .expect("run cc");
        assert!(status.success(), "cc {extra:?}");
        exe
    };
    let dynamic = build("dynamic", &[]);
    let fully_static = build("static", &["-static"]);
    let go = stat.path().join("go");
    let note = stat.file("buildid", b"Go build ID: \"test\"\0");
    let status = std::process::Command::new("objcopy")
        .arg("--add-section")
        .arg(format!(".note.go.buildid={}", note.display()))
        .arg(&dynamic)
        .arg(&go)
        .status()
        .expect("run objcopy");
    assert!(status.success());
    let script = stat.file(
        "script",
        format!("#!{}\n", fully_static.display()).as_bytes(),
    );
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    let run = |exe: &std::path::Path| {
        let mut cmd = command(&a.sdprun, Mode::Plain, stat.path());
        cmd.env("SDP_NO_PORTMAPPER", "1").arg(exe);
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "{exe:?}: {out:?}");
        assert_eq!(String::from_utf8_lossy(&out.stdout), "hello\n", "{exe:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert_eq!(run(&dynamic), "");
    assert!(run(&fully_static).contains("it is statically linked"));
    assert!(run(&go).contains("a Go program, which makes its socket calls without the C library"));
    assert!(run(&script).contains("it is statically linked"));
    for stderr in [run(&fully_static), run(&go)] {
        assert!(stderr.contains("its connections stay TCP"), "{stderr}");
    }

    // setuid to another user: only root can make one here.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let setuid = stat.path().join("setuid");
        std::fs::copy(&dynamic, &setuid).unwrap();
        // SAFETY: a path we own, the nobody user's id.
        let c = std::ffi::CString::new(setuid.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::chown(c.as_ptr(), 65534, 65534) }, 0);
        std::fs::set_permissions(
            &setuid,
            std::os::unix::fs::PermissionsExt::from_mode(0o4755),
        )
        .unwrap();
        let stderr = run(&setuid);
        assert!(stderr.contains("setuid to another user"), "{stderr}");
    }
}
