//! Issue 6, item 1: `iperf3 -s` and `iperf3 -c` both preloaded, plain, with
//! `-R`, `-P 4` and `--bidir`. Each run moves 256 MiB (`-n`). Where the
//! client sends, it stops at exactly that count, and the server's count
//! can only be lower (iperf3 snapshots it when the sender reports the end,
//! with data in flight). In `-R` the client receives and ends the test when
//! it has counted all of it, so there the received count is at least `-n`
//! (its last read may take a little more). Every
//! connection, the control connection and each data stream, must be SDP on
//! both sides.
//!
//! The test watches both processes' state export until all the
//! connections are there and decided. The sending rate is capped (`-b`) so
//! that the transfer lasts about a second over fast plain TCP too, and
//! both programs are still running when the test looks.

use sdp_tests::e2e::{expect_sdp, Env, Proc};
use sdp_tests::preload::{free_port, require};
use serde_json::Value;

const BYTES: u64 = 256 << 20;

fn bytes(json: &Value, section: &str) -> u64 {
    json["end"][section]["bytes"]
        .as_u64()
        .unwrap_or_else(|| panic!("no end.{section}.bytes in iperf3's JSON"))
}

/// Runs one client against a one-off server; `streams` is the number of
/// data connections the options make, `senders` how many of them carry
/// the `-n` bytes. Returns the client's JSON.
fn run(tag: &str, options: &[&str], streams: usize, senders: u64) -> Value {
    require("iperf3");
    let env = Env::new(tag);
    let port = free_port();
    let p = port.to_string();
    let mut server = env.preloaded("iperf3");
    server.args(["-s", "-1", "-p", &p, "--forceflush"]);
    let mut server = Proc::spawn("iperf3 -s", server, false);
    server.wait_line(|l| l.contains("Server listening on"));

    // About a second at the capped rate; the cap is per stream.
    let rate = format!("{}", BYTES * 8 / senders);
    let n = BYTES.to_string();
    let mut client = env.preloaded("iperf3");
    client
        .args(["-c", "127.0.0.1", "-p", &p, "-n", &n, "-b", &rate, "-J"])
        .args(options);
    let client = Proc::spawn("iperf3 -c", client, false);
    // The control connection and each data stream: iperf3 makes them all
    // before the transfer starts.
    let (c, s) = env.connections(client.pid(), server.pid(), port, streams + 1);
    for r in &c {
        expect_sdp(&format!("{tag}: iperf3 -c connection"), r);
    }
    for r in &s {
        expect_sdp(&format!("{tag}: iperf3 -s accepted connection"), r);
    }

    let out = client.finish_ok();
    let json: Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("iperf3 -J output: {e}\n{}", out.stdout));
    assert!(
        json.get("error").is_none(),
        "iperf3 reported {}",
        json["error"]
    );
    let done = server.finish();
    assert!(done.status.success(), "iperf3 -s: {}", done.stdout);
    json
}

#[test]
fn iperf3_one_stream() {
    let json = run("iperf3", &[], 1, 1);
    assert_eq!(bytes(&json, "sum_sent"), BYTES);
    let received = bytes(&json, "sum_received");
    assert!(received > 0 && received <= BYTES, "received {received}");
}

#[test]
fn iperf3_reverse() {
    let json = run("iperf3-R", &["-R"], 1, 1);
    // The client receives and ends the test once it has counted the `-n`
    // bytes; its last read may take a little of what the server sent
    // past them (at most a block), and the server may have sent a block
    // more by then.
    let received = bytes(&json, "sum_received");
    assert!(
        (BYTES..=BYTES + (128 << 10)).contains(&received),
        "received {received}"
    );
    let sent = bytes(&json, "sum_sent");
    assert!(sent >= BYTES, "sent {sent}");
}

#[test]
fn iperf3_four_streams() {
    let json = run("iperf3-P4", &["-P", "4"], 4, 4);
    // Streams that are writable in the same round each send a block
    // (128 KiB) past `-n` before one sees the count reached: plain TCP
    // does it too.
    let sent = bytes(&json, "sum_sent");
    assert!(
        (BYTES..=BYTES + 4 * (128 << 10)).contains(&sent),
        "sent {sent}"
    );
    let streams = json["end"]["streams"].as_array().expect("end.streams");
    assert_eq!(streams.len(), 4);
    for s in streams {
        let sent = s["sender"]["bytes"].as_u64().expect("sender bytes");
        let received = s["receiver"]["bytes"].as_u64().expect("receiver bytes");
        assert!(sent > 0 && received <= sent, "stream {s}");
    }
}

#[test]
fn iperf3_bidirectional() {
    let json = run("iperf3-bidir", &["--bidir"], 2, 1);
    // Both directions run at the same capped rate, and the test ends when
    // either sender has sent its `-n` bytes.
    let (sent, received) = (bytes(&json, "sum_sent"), bytes(&json, "sum_received"));
    let back = bytes(&json, "sum_sent_bidir_reverse");
    let back_received = bytes(&json, "sum_received_bidir_reverse");
    assert!(
        sent == BYTES || back >= BYTES,
        "neither direction sent {BYTES}: {sent} and {back}"
    );
    assert!(received > 0 && received <= sent, "{received} of {sent}");
    assert!(
        back_received > 0 && back_received <= back,
        "reverse: {back_received} of {back}"
    );
}
