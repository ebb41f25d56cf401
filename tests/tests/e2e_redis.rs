//! Issue 6, item 2: `redis-server` with `redis-benchmark -t set,get`,
//! also pipelined (`-P 16`), every process preloaded. [`REQUESTS`] per
//! test keeps a run within a quarter of its time limit on a debug build
//! on two cores (100 000 took most of a minute there).
//!
//! Values are checked through a `redis-cli` session (also preloaded) held
//! open across the benchmark: it stores 1000 keys with distinct values and
//! one 1 MiB value before, and reads every one back after. The benchmark's
//! own connections are made visible deterministically: the session pauses
//! writes (`CLIENT PAUSE ... WRITE`), so the benchmark's 50 clients connect
//! and wait with their first SET; the test reads the state export of both
//! sides, then unpauses.

use sdp_tests::e2e::{expect_sdp, field, text, Env, Proc};
use sdp_tests::preload::{free_port, require};

const KEYS: u64 = 1000;
const CLIENTS: usize = 50;
/// Requests per benchmark test (`-n`), and the key space (`-r`).
const REQUESTS: u64 = 30_000;

fn value(i: u64) -> String {
    text(i, 1 + (i as usize * 37) % 300)
}

/// Sends one command line to the session and returns its one-line reply.
fn ask(cli: &mut Proc, line: &str) -> String {
    cli.send(line);
    cli.send("\n");
    cli.line()
}

fn run(tag: &str, options: &[&str]) {
    require("redis-server");
    require("redis-cli");
    require("redis-benchmark");
    let env = Env::new(tag);
    let port = free_port();
    let p = port.to_string();
    let mut server = env.preloaded("redis-server");
    server.args(["--port", &p, "--bind", "127.0.0.1", "--save", ""]);
    server.args(["--appendonly", "no", "--protected-mode", "no"]);
    let mut server = Proc::spawn("redis-server", server, false);
    server.wait_line(|l| l.contains("Ready to accept connections"));

    let mut cli = env.preloaded("redis-cli");
    cli.args(["-h", "127.0.0.1", "-p", &p]);
    let mut cli = Proc::spawn("redis-cli", cli, true);
    assert_eq!(ask(&mut cli, "PING"), "PONG");
    let (c, s) = env.connections(cli.pid(), server.pid(), port, 1);
    expect_sdp("redis-cli connection", &c[0]);
    expect_sdp("redis-server's end of the redis-cli connection", &s[0]);

    for i in 0..KEYS {
        assert_eq!(ask(&mut cli, &format!("SET e2e:{i} {}", value(i))), "OK");
    }
    let big = text(u64::MAX, 1 << 20);
    assert_eq!(ask(&mut cli, &format!("SET e2e:big {big}")), "OK");

    assert_eq!(ask(&mut cli, "CLIENT PAUSE 60000 WRITE"), "OK");
    let mut bench = env.preloaded("redis-benchmark");
    bench.args(["-h", "127.0.0.1", "-p", &p, "-c", &CLIENTS.to_string()]);
    let n = REQUESTS.to_string();
    bench.args(["-t", "set,get", "-n", &n, "-r", &n, "--csv"]);
    bench.args(options);
    let bench = Proc::spawn("redis-benchmark", bench, false);
    // All clients are connected and waiting for their first SET.
    let b = env.wait_records("redis-benchmark's clients", bench.pid(), CLIENTS, |r| {
        r.role == field::CLIENT && r.peer.is_some_and(|a| a.port() == port)
    });
    for r in &b {
        expect_sdp("redis-benchmark connection", r);
    }
    let accepted = env.wait_records(
        "redis-server's accepted connections",
        server.pid(),
        CLIENTS + 1,
        |r| r.role == field::ACCEPTED && r.local.is_some_and(|a| a.port() == port),
    );
    for r in &accepted {
        expect_sdp("redis-server accepted connection", r);
    }
    assert_eq!(ask(&mut cli, "CLIENT UNPAUSE"), "OK");

    let out = bench.finish_ok();
    // "test","rps",... then one line per test.
    for test in ["SET", "GET"] {
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with(&format!("\"{test}\",")))
            .unwrap_or_else(|| panic!("no {test} result:\n{}", out.stdout));
        let rps: f64 = line
            .split(',')
            .nth(1)
            .and_then(|v| v.trim_matches('"').parse().ok())
            .unwrap_or_else(|| panic!("no rate in {line}"));
        assert!(rps > 0.0, "{line}");
    }

    for i in 0..KEYS {
        assert_eq!(
            ask(&mut cli, &format!("GET e2e:{i}")),
            value(i),
            "key e2e:{i}"
        );
    }
    assert!(
        ask(&mut cli, "GET e2e:big") == big,
        "the 1 MiB value changed"
    );
    // The benchmark's SETs landed: at most REQUESTS random keys, and its
    // GETs read them (the GET test ran after the SET test).
    let keys: u64 = ask(&mut cli, "DBSIZE").parse().expect("DBSIZE");
    assert!(
        keys > KEYS + 1 && keys <= KEYS + 1 + REQUESTS,
        "DBSIZE {keys}"
    );
    cli.finish_ok();
    server.signal(libc::SIGTERM);
    server.finish_ok();
}

#[test]
fn redis_benchmark_set_get() {
    run("redis", &[]);
}

#[test]
fn redis_benchmark_pipelined() {
    run("redis-P16", &["-P", "16"]);
}
