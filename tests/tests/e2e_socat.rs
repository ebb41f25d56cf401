//! Issue 6, item 7: `socat TCP-LISTEN:PORT,fork,reuseaddr EXEC:cat`, an
//! accept-then-fork server, serves 50 sequential preloaded clients over
//! SDP. Each client sends its own payload and must get exactly it back;
//! while it holds the connection, the test reads the client's record and
//! the record of the forked socat child that serves it (socat's parent
//! closes its copy of the accepted socket right after the fork).

use sdp_tests::e2e::{expect_sdp, Env, Proc};
use sdp_tests::preload::{free_port, require, Mode};
use std::net::SocketAddr;

const CLIENTS: usize = 50;

/// 50 connections one after the other; for each, prints `hold I PID FD
/// LOCALPORT` once its payload came back and waits for a line, then ends
/// the connection and prints `ok I` (or `bad I ...`).
const CLIENT: &str = r#"
import hashlib, os, socket, sys
port, n = int(sys.argv[1]), int(sys.argv[2])
for i in range(n):
    payload = hashlib.sha512(b"client %d" % i).digest() * (1 + 97 * i)
    c = socket.create_connection(("127.0.0.1", port))
    c.sendall(payload)
    got = b""
    while len(got) < len(payload):
        d = c.recv(1 << 16)
        if not d:
            break
        got += d
    print("hold", i, os.getpid(), c.fileno(), c.getsockname()[1])
    sys.stdin.readline()
    c.shutdown(socket.SHUT_WR)
    rest = c.recv(1 << 16)
    c.close()
    if got == payload and rest == b"":
        print("ok", i)
    else:
        print("bad", i, len(got), len(payload), len(rest))
"#;

#[test]
fn socat_fork_serves_50_sequential_clients() {
    require("socat");
    let env = Env::new("socat");
    let port = free_port();
    let mut socat = env.preloaded("socat");
    socat
        .arg("-d")
        .arg("-d")
        .arg(format!("TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr"))
        .arg("EXEC:cat");
    let mut socat = Proc::spawn("socat", socat, false);
    // "... N listening on AF=2 127.0.0.1:PORT"
    socat.wait_line(|l| l.contains("listening on"));

    let mut cmd = env.python(CLIENT, Mode::Sdp);
    cmd.args([port.to_string(), CLIENTS.to_string()]);
    let mut client = Proc::spawn("clients", cmd, true);
    for i in 0..CLIENTS {
        let hold = client.wait_line(|l| l.starts_with("hold ") || l.starts_with("bad "));
        let w: Vec<&str> = hold.split_whitespace().collect();
        assert_eq!(w[0], "hold", "{hold}");
        assert_eq!(w[1], i.to_string());
        let (pid, fd): (u32, usize) = (w[2].parse().unwrap(), w[3].parse().unwrap());
        let local: SocketAddr = format!("127.0.0.1:{}", w[4]).parse().unwrap();
        let c = env.wait_records("client connection", pid, 1, |r| r.fd == fd);
        expect_sdp(&format!("client {i}"), &c[0]);
        let (_, s) = env.accepted_from(local);
        expect_sdp(&format!("socat child serving client {i}"), &s);
        client.send("\n");
        let done = client.line();
        assert_eq!(done, format!("ok {i}"), "{}", client.transcript());
    }
    client.finish_ok();
}

/// What socat (and qperf's server) do: accept, fork, and the parent closes
/// its copy at once. The child's export must still list the connection,
/// whatever the parent did after the fork.
const FORK_CLOSE: &str = r#"
import os, socket, sys
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen()
c = socket.create_connection(srv.getsockname())
a, _ = srv.accept()
r, w = os.pipe()
child = os.fork()
if child == 0:
    os.read(r, 1)
    print("child", os.getpid(), a.fileno(), flush=True)
    sys.stdin.readline()
    os._exit(0)
a.close()
os.write(w, b"x")
os.waitpid(child, 0)
"#;

#[test]
fn forked_child_keeps_the_record_the_parent_closed() {
    let env = Env::new("fork-close");
    let mut p = Proc::spawn("fork-close", env.python(FORK_CLOSE, Mode::Sdp), true);
    let line = p.wait_line(|l| l.starts_with("child "));
    let w: Vec<u32> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap())
        .collect();
    let f = env.snapshot(w[0]);
    assert!(
        f.record(w[1] as usize).is_some(),
        "the child's export lost fd {} when the parent closed its copy: {f:?}",
        w[1]
    );
    p.send("\n");
    p.finish_ok();
}
