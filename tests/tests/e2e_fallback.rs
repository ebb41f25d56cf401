//! Issue 6, item 5: mixed peers fall back to TCP and work.
//!
//! * A preloaded client and a plain server: the port mapper answers PMDeny
//!   (nothing registered the port), the connection is TCP.
//! * A plain client and a preloaded server: the server accepts it on its
//!   TCP listener ("peer used TCP").
//! * No port mapper on the server host (`SDP_PM_PORT` names a closed UDP
//!   port, so the query is answered by ICMP port unreachable): the
//!   connection is TCP ("port mapper unreachable"), and a connect costs
//!   less than 50 ms more than a plain one (medians of several processes,
//!   each timing its first connect — the negative cache is per process —
//!   and a second one).

use sdp_tests::e2e::{
    closed_udp_port, expect_tcp, field, median, Env, Proc, ECHO_CLIENT, ECHO_SERVER,
};
use sdp_tests::preload::Mode;
use std::net::SocketAddr;
use std::time::Duration;

/// Starts the echo server; returns it and its port.
fn echo_server(env: &Env, mode: Mode) -> (Proc, u16) {
    let mut server = Proc::spawn("echo server", env.python(ECHO_SERVER, mode), false);
    let line = server.wait_line(|l| l.starts_with("listening "));
    let port = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    (server, port)
}

/// Runs the echo client until it holds its connection; returns it, its pid,
/// fd and local address.
fn echo_client(env: &Env, mode: Mode, port: u16, seed: u32) -> (Proc, u32, usize, SocketAddr) {
    let mut cmd = env.python(ECHO_CLIENT, mode);
    cmd.args(["127.0.0.1", &port.to_string(), &seed.to_string(), "300000"]);
    let mut client = Proc::spawn("echo client", cmd, true);
    let line = client.wait_line(|l| l.starts_with("echo "));
    let w: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(w[1], "True", "the echo differs\n{}", client.transcript());
    let local: SocketAddr = format!("127.0.0.1:{}", w[4]).parse().unwrap();
    (client, w[2].parse().unwrap(), w[3].parse().unwrap(), local)
}

#[test]
fn preloaded_client_to_plain_server_is_tcp_by_pmdeny() {
    let env = Env::new("fallback-pmdeny");
    let (_server, port) = echo_server(&env, Mode::Plain);
    let (client, pid, fd, _) = echo_client(&env, Mode::Sdp, port, 1);
    let r = env.wait_records("the client's connection", pid, 1, |r| r.fd == fd);
    expect_tcp(
        "preloaded client, plain server",
        &r[0],
        field::REASON_PM_DENY,
    );
    assert_eq!(r[0].role, field::CLIENT);
    client.finish_ok();
}

#[test]
fn plain_client_to_preloaded_server_is_tcp_by_peer() {
    let env = Env::new("fallback-peer");
    let (_server, port) = echo_server(&env, Mode::Sdp);
    let (client, _, _, local) = echo_client(&env, Mode::Plain, port, 2);
    let (_, r) = env.accepted_from(local);
    expect_tcp("plain client, preloaded server", &r, field::REASON_PEER_TCP);
    client.finish_ok();
}

/// Times `connects` connects to `port` in one process; prints the times in
/// microseconds, then its pid and the first socket's fd, and holds the
/// sockets until a line arrives on standard input.
const CONNECTS: &str = r#"
import os, socket, sys, time
port, n = int(sys.argv[1]), int(sys.argv[2])
socks, times = [], []
for _ in range(n):
    s = socket.socket()
    t = time.perf_counter()
    s.connect(("127.0.0.1", port))
    times.append(time.perf_counter() - t)
    socks.append(s)
print("times", " ".join(str(int(t * 1e6)) for t in times), "pid", os.getpid(), socks[0].fileno())
sys.stdin.readline()
"#;

/// One process's first and second connect times, and its pid and fd.
fn connects(
    env: &Env,
    mode: Mode,
    port: u16,
    pm_port: u16,
) -> (Duration, Duration, Proc, u32, usize) {
    let mut cmd = env.python(CONNECTS, mode);
    cmd.env("SDP_PM_PORT", pm_port.to_string())
        .args([&port.to_string(), "2"]);
    let mut p = Proc::spawn("connects", cmd, true);
    let line = p.wait_line(|l| l.starts_with("times "));
    let w: Vec<&str> = line.split_whitespace().collect();
    let us = |s: &str| Duration::from_micros(s.parse().unwrap());
    (
        us(w[1]),
        us(w[2]),
        p,
        w[4].parse().unwrap(),
        w[5].parse().unwrap(),
    )
}

#[test]
fn no_port_mapper_is_tcp_and_costs_under_50_ms() {
    const ROUNDS: usize = 7;
    let env = Env::new("fallback-nopm");
    // A plain listener in the test itself, accepting and dropping.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || for _ in listener.incoming() {});
    let pm_port = closed_udp_port();

    let (mut plain, mut preloaded) = ((Vec::new(), Vec::new()), (Vec::new(), Vec::new()));
    for round in 0..ROUNDS {
        let (first, second, p, _, _) = connects(&env, Mode::Plain, port, pm_port);
        plain.0.push(first);
        plain.1.push(second);
        p.finish_ok();
        let (first, second, p, pid, fd) = connects(&env, Mode::Sdp, port, pm_port);
        preloaded.0.push(first);
        preloaded.1.push(second);
        if round == 0 {
            let r = env.wait_records("the connection", pid, 1, |r| r.fd == fd);
            expect_tcp("no port mapper", &r[0], field::REASON_PM_UNREACHABLE);
        }
        p.finish_ok();
    }
    let limit = Duration::from_millis(50);
    for (what, plain, preloaded) in [
        ("first connect", plain.0, preloaded.0),
        ("second connect", plain.1, preloaded.1),
    ] {
        let (p, l) = (median(plain.clone()), median(preloaded.clone()));
        assert!(
            l < p + limit,
            "{what}: preloaded median {l:?} vs plain {p:?} (plain {plain:?}, preloaded {preloaded:?})"
        );
    }
}
