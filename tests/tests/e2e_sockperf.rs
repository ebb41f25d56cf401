//! Issue 6, item 4: `sockperf` ping-pong and throughput over TCP, server
//! (`sockperf sr`) and client preloaded.
//!
//! sockperf numbers its messages and checks the replies: ping-pong must
//! report no dropped, duplicated or out-of-order message and as many
//! replies as requests. In throughput mode the server counts what it
//! received, printed when it is interrupted; it must equal what the client
//! says it sent. The connection must be SDP on both sides, read from the
//! state export while the one-second test runs (after sockperf's warm-up,
//! so the client is mid-test when the test looks).

use sdp_tests::e2e::{expect_sdp, Env, Finished, Proc};
use sdp_tests::preload::{free_port, require};

/// The number after `key=` in `line` ("SentMessages=85251;").
fn number(text: &str, key: &str) -> u64 {
    text.split(key)
        .nth(1)
        .and_then(|rest| {
            rest.trim_start()
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .unwrap_or_else(|| panic!("no {key:?} in sockperf's output:\n{text}"))
}

/// Runs `sockperf MODE` against a preloaded server; returns the client's
/// and the server's output.
fn run(tag: &str, mode: &str, size: &str) -> (Finished, Finished) {
    require("sockperf");
    let env = Env::new(tag);
    let port = free_port();
    let p = port.to_string();
    let mut server = env.preloaded("sockperf");
    server.args(["sr", "--tcp", "-i", "127.0.0.1", "-p", &p]);
    let server = Proc::spawn("sockperf sr", server, false);
    env.wait_listener(server.pid(), port);

    let mut client = env.preloaded("sockperf");
    client.args([
        mode,
        "--tcp",
        "-i",
        "127.0.0.1",
        "-p",
        &p,
        "-t",
        "1",
        "-m",
        size,
    ]);
    let mut client = Proc::spawn(&format!("sockperf {mode}"), client, false);
    client.wait_line(|l| l.contains("Starting test"));
    let (c, s) = env.connections(client.pid(), server.pid(), port, 1);
    expect_sdp(&format!("sockperf {mode} connection"), &c[0]);
    expect_sdp("sockperf sr accepted connection", &s[0]);
    let client = client.finish_ok();
    // sockperf sr prints its count when interrupted.
    server.signal(libc::SIGINT);
    let server = server.finish();
    (client, server)
}

#[test]
fn sockperf_ping_pong() {
    let (client, _) = run("sockperf-pp", "pp", "64");
    let out = &client.stdout;
    let valid = out
        .lines()
        .find(|l| l.contains("[Valid Duration]"))
        .unwrap_or_else(|| panic!("no [Valid Duration] line:\n{out}"));
    let sent = number(valid, "SentMessages=");
    assert!(sent > 0, "{valid}");
    assert_eq!(number(valid, "ReceivedMessages="), sent, "{valid}");
    assert_eq!(number(out, "dropped messages ="), 0, "{out}");
    assert_eq!(number(out, "duplicated messages ="), 0, "{out}");
    assert_eq!(number(out, "out-of-order messages ="), 0, "{out}");
}

#[test]
fn sockperf_throughput() {
    let (client, server) = run("sockperf-tp", "tp", "1400");
    let sent = number(&client.stdout, "Total of ");
    assert!(sent > 0, "{}", client.stdout);
    let all = format!("{}\n{}", server.stdout, server.stderr);
    assert_eq!(number(&all, "Total "), sent, "server:\n{all}");
}
