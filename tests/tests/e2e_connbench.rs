//! `sdp-connbench`, the connection-setup and idle-memory program of
//! `scripts/bench.sh`, under the preload: its connections are SDP, every
//! one carries its byte there and back, and it reports what it did.

use sdp_tests::bins::cargo_bin;
use sdp_tests::e2e::{expect_sdp, field, Env, Proc};

/// The port in a line `"<word> PORT"`.
fn port_of(line: &str) -> u16 {
    line.split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"))
}

/// The number after `"key": ` in the result line.
fn number(json: &str, key: &str) -> f64 {
    json.split(&format!("\"{key}\": "))
        .nth(1)
        .and_then(|rest| rest.split([',', '}']).next())
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in {json}"))
}

/// How many descriptors process `pid` has open.
fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or_else(|e| panic!("/proc/{pid}/fd: {e}"))
}

#[test]
fn rate_connections_are_sdp_and_counted() {
    let bin = cargo_bin("sdp-tests", "sdp-connbench");
    let env = Env::new("connbench-rate");
    let mut server = env.preloaded(&bin);
    server.arg("server");
    let mut server = Proc::spawn("sdp-connbench server", server, false);
    let port = port_of(&server.wait_line(|l| l.starts_with("listening ")));
    env.wait_listener(server.pid(), port);

    // Plain TCP client against the preloaded server (the peer-TCP path).
    let mut plain = env.plain(&bin);
    plain.args(["rate", "--port", &port.to_string(), "--count", "20"]);
    let out = Proc::spawn("sdp-connbench rate (plain)", plain, false).finish_ok();
    assert_eq!(number(&out.stdout, "count"), 20.0, "{}", out.stdout);
    assert!(number(&out.stdout, "per_second") > 0.0, "{}", out.stdout);

    let mut client = env.preloaded(&bin);
    client.args([
        "rate",
        "--port",
        &port.to_string(),
        "--count",
        "20",
        "--check",
    ]);
    let mut client = Proc::spawn("sdp-connbench rate (SDP)", client, true);
    let result = client.wait_line(|l| l.starts_with('{'));
    assert_eq!(number(&result, "count"), 20.0, "{result}");
    let setup = number(&result, "p50");
    assert!(setup > 0.0, "{result}");
    let local = port_of(&client.wait_line(|l| l.starts_with("check ")));
    // The export shows its counters once the service thread published
    // them (every SDP_STAT_INTERVAL_MS).
    let rec = env
        .wait_records("the check connection", client.pid(), 1, |r| {
            r.role == field::CLIENT
                && r.local.is_some_and(|a| a.port() == local)
                && r.counters[0] > 0
                && r.counters[1] > 0
        })
        .remove(0);
    expect_sdp("sdp-connbench's check connection", &rec);
    // Its byte went both ways over SDP.
    assert_eq!(rec.counters[0], 1, "Bcopy bytes sent");
    assert_eq!(rec.counters[1], 1, "Bcopy bytes received");
    client.send("\n");
    client.finish_ok();

    // Eight clients at once, each connecting, exchanging and closing in
    // turn: the server's one event loop serves them all.
    let mut churn = env.preloaded(&bin);
    churn.args([
        "rate",
        "--port",
        &port.to_string(),
        "--count",
        "40",
        "--concurrency",
        "8",
    ]);
    let out = Proc::spawn("sdp-connbench rate --concurrency 8", churn, false).finish_ok();
    assert_eq!(number(&out.stdout, "count"), 40.0, "{}", out.stdout);
    assert_eq!(number(&out.stdout, "concurrency"), 8.0, "{}", out.stdout);
}

#[test]
fn hold_keeps_every_connection_open() {
    let bin = cargo_bin("sdp-tests", "sdp-connbench");
    let env = Env::new("connbench-hold");
    let mut server = env.preloaded(&bin);
    server.args(["server", "--hold"]);
    let mut server = Proc::spawn("sdp-connbench server --hold", server, false);
    let port = port_of(&server.wait_line(|l| l.starts_with("listening ")));
    env.wait_listener(server.pid(), port);

    let mut client = env.preloaded(&bin);
    client.args(["hold", "--port", &port.to_string(), "--count", "5"]);
    let mut client = Proc::spawn("sdp-connbench hold", client, true);
    client.wait_line(|l| l.starts_with("one "));
    server.wait_line(|l| l == "held 1");
    let before = (fds(client.pid()), fds(server.pid()));
    client.send("\n");
    client.wait_line(|l| l.starts_with("held 5 "));
    server.wait_line(|l| l == "held 6");
    // One descriptor per connection at each end, as over TCP: the engine
    // runs on the program's socket, and the server's epoll set keeps the
    // connections' readiness in its ready list (one eventfd for the set).
    // The library's other descriptors are per process, set or thread.
    let after = (fds(client.pid()), fds(server.pid()));
    assert!(
        after.0 - before.0 <= 5 && after.1 - before.1 <= 5,
        "descriptors for 5 connections: client {} -> {}, server {} -> {}",
        before.0,
        after.0,
        before.1,
        after.1
    );
    let (c, s) = env.connections(client.pid(), server.pid(), port, 6);
    for r in c.iter().chain(&s) {
        expect_sdp("a held connection", r);
    }
    // All six at once: a byte out on each, then every echo back.
    client.send("\n");
    client.wait_line(|l| l.starts_with("used 6 "));
    client.send("\n");
    client.finish_ok();
}
