//! Issue 6, item 3: `qperf` with `sdp_bw`, `sdp_lat` and `tcp_bw`, server
//! and client preloaded; `sdp_bw` with 1 MiB messages by Read Zcopy
//! (issue 7). qperf's `sdp_*` tests make their data sockets with
//! `socket(AF_INET_SDP = 27, ...)`, which only the preload turns into
//! something that works; `tcp_bw` uses ordinary sockets, which the preload
//! carries over SDP too.
//!
//! The qperf server forks a child per client. Its synchronisation
//! connection goes to the listen port (`-lp`), the test's data connection
//! to the socket test port (`-ip`); both must be SDP, on the client and in
//! whichever server process accepted them. Each test runs one second
//! (`-t 1`), long enough for the test to read the state export mid-run.

use sdp_tests::e2e::{expect_sdp, field, Env, Proc};
use sdp_tests::preload::{free_port, require};

/// The value qperf prints for `name` ("    bw  =  2.71 GB/sec"), in the
/// unit it prints.
fn value(output: &str, name: &str) -> (f64, String) {
    output
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once('=')?;
            if k.trim() != name {
                return None;
            }
            let mut w = v.split_whitespace();
            let n = w.next()?.replace(',', "").parse().ok()?;
            Some((n, w.next().unwrap_or("").to_owned()))
        })
        .unwrap_or_else(|| panic!("qperf printed no {name}:\n{output}"))
}

fn run(test: &str) -> String {
    run_with(test, None)
}

/// Runs qperf `test`; with `zcopy`, both ends have `SDP_ZCOPY=zcopy` and
/// send 1 MiB messages, and the data connection must show Zcopy bytes
/// and messages on both ends while the test runs.
fn run_with(test: &str, zcopy: Option<&str>) -> String {
    require("qperf");
    let env = match zcopy {
        Some(mode) => Env::new(&format!("{test}-zcopy-{mode}")),
        None => Env::new(test),
    };
    let (sync_port, data_port) = (free_port(), free_port());
    let mut server = env.preloaded("qperf");
    server.args(["-lp", &sync_port.to_string()]);
    let mut client = env.preloaded("qperf");
    client.args(["-lp", &sync_port.to_string(), "-ip", &data_port.to_string()]);
    // One second; three with Zcopy, for the export to show it mid-run.
    client.args(["-t", if zcopy.is_some() { "3" } else { "1" }]);
    if let Some(mode) = zcopy {
        for cmd in [&mut server, &mut client] {
            cmd.env("SDP_ZCOPY", mode)
                .env("SDP_ZCOPY_THRESHOLD", "256K");
        }
        // (Options after the test name are not the test's.)
        client.args(["-m", "1M"]);
    }
    client.args(["-vv", "127.0.0.1", test]);
    let server = Proc::spawn("qperf server", server, false);
    env.wait_listener(server.pid(), sync_port);
    let client = Proc::spawn(&format!("qperf {test}"), client, false);
    for (what, port) in [("synchronisation", sync_port), ("data", data_port)] {
        let c = env
            .wait_records(what, client.pid(), 1, |r| {
                r.role == field::CLIENT && r.peer.is_some_and(|a| a.port() == port)
            })
            .remove(0);
        expect_sdp(&format!("qperf {test}: client's {what} connection"), &c);
        let local = c.local.expect("the client's local address");
        let (pid, s) = env.accepted_from(local);
        expect_sdp(&format!("qperf {test}: server's {what} connection"), &s);
        if let (Some(mode), true) = (zcopy, port == data_port) {
            // read: sent by SrcAvail and the server's RDMA Reads of the
            // client's buffers, straight into the server's; write: the
            // server's SinkAvails and the client's RDMA Writes into them.
            let (tx, rx, advertiser) = if mode == "write" {
                (4, 5, 1)
            } else {
                (2, 3, 0)
            };
            env.wait_records("Zcopy bytes sent", client.pid(), 1, |r| {
                r.local == Some(local)
                    && r.counters[tx] > 0
                    && (advertiser == 1 || r.messages[0] > 0)
            });
            env.wait_records("Zcopy bytes received", pid, 1, |r| {
                r.peer.is_some_and(|a| a.port() == local.port())
                    && r.counters[rx] > 0
                    && (advertiser == 0 || r.messages[1] > 0)
            });
        }
    }
    let out = client.finish_ok();
    assert!(
        out.stdout.starts_with(&format!("{test}:")),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    drop(server);
    out.stdout
}

fn check_bandwidth(out: &str) {
    let (bw, unit) = value(out, "bw");
    assert!(bw > 0.0 && unit.ends_with("/sec"), "bw {bw} {unit}");
    // Both sides count the bytes they moved; the receiver stops counting
    // when the sender reports the end, so it has at most what was sent.
    let (sent, su) = value(out, "send_bytes");
    let (received, ru) = value(out, "recv_bytes");
    assert!(sent > 0.0 && received > 0.0, "{out}");
    // qperf picks decimal or binary units per figure ("733 MiB" sent,
    // "768 MB" received).
    let scale = |u: &str| match u {
        "KB" => 1e3,
        "MB" => 1e6,
        "GB" => 1e9,
        "TB" => 1e12,
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "TiB" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => 1.0,
    };
    // qperf prints three significant digits: each figure may be off by
    // half a unit of the last one (0.5 %), so allow the two roundings.
    assert!(
        received * scale(&ru) <= sent * scale(&su) * (1.005 / 0.995),
        "{out}"
    );
}

#[test]
fn qperf_sdp_bw() {
    check_bandwidth(&run("sdp_bw"));
}

/// The unmodified program's blocking 1 MiB sends and receives go by Read
/// Zcopy under `SDP_ZCOPY=read`.
#[test]
fn qperf_sdp_bw_by_read_zcopy() {
    let out = run_with("sdp_bw", Some("read"));
    check_bandwidth(&out);
    assert_eq!(value(&out, "msg_size"), (1.0, "MiB".to_owned()), "{out}");
}

/// The same by Write Zcopy under `SDP_ZCOPY=write`: the server's posted
/// 1 MiB receives are advertised by SinkAvail and written into.
#[test]
fn qperf_sdp_bw_by_write_zcopy() {
    let out = run_with("sdp_bw", Some("write"));
    check_bandwidth(&out);
    assert_eq!(value(&out, "msg_size"), (1.0, "MiB".to_owned()), "{out}");
}

#[test]
fn qperf_sdp_lat() {
    let out = run("sdp_lat");
    let (lat, unit) = value(&out, "latency");
    assert!(
        lat > 0.0 && ["ns", "us", "ms"].contains(&unit.as_str()),
        "{out}"
    );
}

#[test]
fn qperf_tcp_bw() {
    check_bandwidth(&run("tcp_bw"));
}
