//! Scenarios of issue 5 acceptance 1 over the real engine
//! ([`super::pair::LinkPair`]): setup accept/reject, bulk transfer with
//! hashes, a stalled receiver, half-closes, abortive close, OOB, and a
//! hostile peer sending real FPDUs.

use iwarp::engine::{Payload, SendKind as QpSendKind, SendWr};

use super::pair::LinkPair;
use super::AcceptError;
use super::Lent;
use crate::conn::{CloseReason, Config, RecvFlags, SendFlags, Shutdown, State, Violation};
use crate::errno::Error;
use crate::verbs::{ErrorKind, Teardown};
use crate::wire::{self, Bsdh, BsdhRepr, Flags, Mid};

fn small() -> Config {
    Config {
        bufs: 4,
        buf_size: 512,
        desired_remote_buf_size: 512,
        send_buffer: 4096,
        ..Config::default()
    }
}

/// The Hello of `config` with `f` applied to its bytes.
fn hello_with(config: &Config, f: impl FnOnce(&mut [u8])) -> Vec<u8> {
    let mut h = crate::conn::setup::hello_message(config).to_vec();
    f(&mut h);
    h
}

#[test]
fn setup_accept_reject_matrix() {
    let c = Config::default();
    // Bytes 16: MajV|MinV; 18..20 MaxAdverts; 28..30 LocORD; 30..32 LocIRD.
    let refused: [(&str, Vec<u8>, Violation); 4] = [
        (
            "MajV 2",
            hello_with(&c, |h| h[16] = 0x21),
            Violation::Malformed(wire::Error::UnsupportedMajorVersion),
        ),
        (
            "MaxAdverts 0",
            hello_with(&c, |h| h[18..20].copy_from_slice(&[0, 0])),
            Violation::Malformed(wire::Error::ZeroMaxAdverts),
        ),
        (
            "LocIRD 0",
            hello_with(&c, |h| h[30..32].copy_from_slice(&[0, 0])),
            Violation::Malformed(wire::Error::ZeroLocIrd),
        ),
        (
            "LocORD 0",
            hello_with(&c, |h| h[28..30].copy_from_slice(&[0, 0])),
            Violation::Malformed(wire::Error::ZeroLocOrd),
        ),
    ];
    for (seed, (what, hello, violation)) in refused.into_iter().enumerate() {
        let mut pair = LinkPair::new(&c, &c, seed as u64, Some(hello));
        pair.settle(100_000);
        assert_eq!(
            pair.sides[1].refused,
            Some(AcceptError::Hello(violation)),
            "{what}"
        );
        let client = pair.sides[0].link();
        assert_eq!(
            client.close_reason(),
            Some(&CloseReason::Transport(ErrorKind::Refused)),
            "{what}"
        );
        assert_eq!(client.teardown(), Some(Teardown::Abortive));
        assert!(saw_error(&mut pair, 0, Error::ConnectionRefused), "{what}");
    }
    // §8.1.1 step 3b: a MinV mismatch is no reason to refuse.
    for min_v in [0, 2, 15] {
        let hello = hello_with(&c, |h| h[16] = 0x10 | min_v);
        let mut pair = LinkPair::new(&c, &c, 9, Some(hello));
        assert!(pair.run(100_000, LinkPair::both_connected), "MinV {min_v}");
        assert_eq!(
            pair.sides[1].link().conn().minor_version(),
            min_v.min(wire::MINOR_VERSION)
        );
    }
}

/// Whether the application of side `s` got `err` from a call, or gets it
/// from `recv` now (after reading what is left).
fn saw_error(pair: &mut LinkPair, s: usize, err: Error) -> bool {
    if pair.apps[s].errors.contains(&err) {
        return true;
    }
    let link = pair.sides[s].link();
    let mut buf = [0; 4096];
    loop {
        match link.recv(&mut buf, RecvFlags::EMPTY) {
            Ok(n) if n > 0 => continue,
            r => return r == Err(err),
        }
    }
}

/// Both directions at once, hashes compared; then a graceful close.
fn transfer(a: &Config, b: &Config, seed: u64, bytes: u64, max_chunk: usize) -> LinkPair {
    transfer_with(a, b, seed, bytes, max_chunk, (false, false))
}

/// [`transfer`], writing with `send_direct` and reading into a waiting
/// buffer as `direct` (send, receive) says.
fn transfer_with(
    a: &Config,
    b: &Config,
    seed: u64,
    bytes: u64,
    max_chunk: usize,
    direct: (bool, bool),
) -> LinkPair {
    let mut pair = LinkPair::connected(a, b, seed);
    pair.max_chunk = max_chunk;
    for app in &mut pair.apps {
        app.to_write = bytes;
        app.shutdown_when_done = true;
        (app.direct_send, app.direct_recv) = direct;
    }
    let done = |p: &LinkPair| p.apps.iter().all(|a| a.eof);
    assert!(pair.run(u64::MAX, done), "seed {seed}: transfer stuck");
    for s in 0..2 {
        let o = 1 - s;
        assert_eq!(pair.apps[s].read, bytes, "seed {seed} side {s}");
        assert_eq!(pair.apps[s].read_hash, pair.apps[o].write_hash);
        assert!(pair.apps[s].errors.is_empty(), "{:?}", pair.apps[s].errors);
    }
    assert!(pair.settle(1_000_000));
    for s in 0..2 {
        assert_eq!(
            pair.sides[s].link().close_reason(),
            Some(&CloseReason::Graceful),
            "seed {seed} side {s}"
        );
        assert_eq!(pair.sides[s].link().teardown(), Some(Teardown::Graceful));
    }
    pair
}

#[test]
fn random_transfers_small_buffers_tiny_chunks() {
    for seed in 0..12 {
        let mut rng = crate::testing::Rng::new(seed);
        let mut cfg = || Config {
            bufs: 3 + rng.below(6) as u16,
            buf_size: 37 + rng.below(2000) as u32,
            send_buffer: 1 + rng.below(10_000),
            ..Config::default()
        };
        let (a, b) = (cfg(), cfg());
        let max_chunk = [1, 7, 100, 3000][seed as usize % 4];
        let pair = transfer(&a, &b, seed, 20_000 + seed * 1000, max_chunk);
        assert!(pair.ops_checked > 0);
    }
}

#[test]
fn gigabyte_each_way() {
    // 1 GiB each way under `cargo test --release`; 16 MiB in debug builds,
    // where the byte-by-byte checks make a gigabyte take minutes.
    let bytes = if cfg!(debug_assertions) {
        16 << 20
    } else {
        1 << 30
    };
    let c = Config::default();
    let pair = transfer(&c, &c, 77, bytes, 256 * 1024);
    assert_eq!(pair.apps[0].read, bytes);
}

/// The direct paths at scale: every write sends straight from its buffer,
/// every waiting read lends its buffer; 256 MiB each way under `cargo test
/// --release` (run with `gigabyte`), 8 MiB in debug builds.
#[test]
fn gigabyte_direct_quarter_each_way() {
    let bytes = if cfg!(debug_assertions) {
        8 << 20
    } else {
        256 << 20
    };
    let c = Config::default();
    let mut pair = transfer_with(&c, &c, 78, bytes, 256 * 1024, (true, true));
    for s in 0..2 {
        let st = pair.sides[s].link().copy_stats();
        assert_eq!(st.bytes_sent_direct + st.bytes_staged, bytes);
        assert_eq!(st.bytes_received_direct + st.bytes_copied_from_pool, bytes);
        assert!(
            st.bytes_sent_direct > 0 && st.bytes_received_direct > 0,
            "{st:?}"
        );
    }
}

#[test]
fn stalled_receiver_stalls_sender_without_loss() {
    let c = small();
    let mut pair = LinkPair::connected(&c, &c, 5);
    pair.apps[0].to_write = 200_000;
    pair.apps[1].reading = false;
    // Nothing more can happen: the sender is stuck on a full send buffer.
    assert!(pair.settle(1_000_000));
    let written = pair.apps[0].written;
    assert!(written < 200_000 && written >= c.send_buffer);
    assert!(!pair.sides[0].link().writable());
    // Every buffer of the receiver holds data; the peer has no credit.
    let held = pair.sides[1].link().bytes_readable();
    assert!(held > 0);
    assert!(pair.sides[0].link().credit_state().send_credit < 3);
    pair.apps[1].reading = true;
    assert!(pair.run(u64::MAX, |p| p.apps[1].read == 200_000));
    assert_eq!(pair.apps[1].read_hash, pair.apps[0].write_hash);
}

/// The receive pool doubles while the peer runs out of credit and the
/// application keeps up, to `max_bufs` and no further; every byte arrives
/// (hashes compared by `transfer`) and every Op met §10.5 (checked).
#[test]
fn a_pool_grows_while_its_reader_keeps_up() {
    let c = Config {
        max_bufs: 16,
        ..small()
    };
    let mut pair = transfer(&c, &c, 9, 400_000, 4096);
    assert!(pair.ops_checked > 0);
    for s in 0..2 {
        assert_eq!(pair.sides[s].link().conn().pool().len(), 16, "side {s}");
    }
    // Without `max_bufs` the pool keeps its size.
    let mut pair = transfer(&small(), &small(), 9, 400_000, 4096);
    for s in 0..2 {
        assert_eq!(pair.sides[s].link().conn().pool().len(), 4, "side {s}");
    }
}

/// A reader that does not read holds its buffers: the peer's lack of
/// credit is its doing, and more buffers would only hold more unread
/// bytes.
#[test]
fn a_stalled_reader_does_not_grow_the_pool() {
    let c = Config {
        max_bufs: 16,
        ..small()
    };
    let mut pair = LinkPair::connected(&c, &c, 5);
    pair.apps[0].to_write = 200_000;
    pair.apps[1].reading = false;
    assert!(pair.settle(1_000_000));
    assert!(pair.sides[0].link().credit_state().send_credit < 3);
    assert_eq!(pair.sides[1].link().conn().pool().len(), 4);
    pair.apps[1].reading = true;
    assert!(pair.run(u64::MAX, |p| p.apps[1].read == 200_000));
    assert_eq!(pair.apps[1].read_hash, pair.apps[0].write_hash);
}

/// Known livelock, found by the `sdp_link` fuzz target: with three receive
/// buffers on each side (the least §10 allows; `Config::with_socket_buffers`
/// gives it to programs with a small SO_RCVBUF), two applications that both
/// send, and messages cut in chunks smaller than themselves, both sides
/// sit at a send credit of one or two with the data messages waiting for
/// three. Each message a side receives acknowledges all its messages but
/// the last, raising its credit from one to two, which re-arms its credit
/// request (the empty Data Message at the end of `Conn::next_message`);
/// the two requests cross on the wire, and so on forever: some 72 000
/// messages each way in a million steps, no byte of data.
#[test]
#[ignore = "known livelock of the credit requests, not fixed yet"]
fn two_senders_three_buffers_each_make_progress() {
    let c = Config {
        bufs: 3,
        buf_size: 64,
        send_buffer: 700,
        ..Config::default()
    };
    let mut pair = LinkPair::connected(&c, &c, 4);
    pair.max_chunk = 29;
    for app in &mut pair.apps {
        app.to_write = 2000;
        app.max_io = 300;
    }
    let done = |p: &LinkPair| p.apps.iter().all(|a| a.read == 2000);
    assert!(
        pair.run(1_000_000, done),
        "read {} and {}",
        pair.apps[0].read,
        pair.apps[1].read
    );
}

fn half_close(first: usize, seed: u64) {
    let c = small();
    let mut pair = LinkPair::connected(&c, &c, seed);
    let second = 1 - first;
    pair.apps[first].to_write = 3000;
    pair.apps[first].shutdown_when_done = true;
    pair.apps[second].to_write = 5000;
    // The first closer's peer sees the end of the stream, and can still
    // send for as long as it likes.
    assert!(pair.run(u64::MAX, |p| p.apps[second].eof));
    assert_eq!(pair.apps[second].read, 3000);
    assert!(pair.run(u64::MAX, |p| p.apps[first].read == 5000));
    assert_eq!(
        pair.sides[first].link().send(b"x", SendFlags::EMPTY),
        Err(Error::BrokenPipe)
    );
    assert!(!pair.apps[first].eof);
    pair.sides[second].link().shutdown(Shutdown::Write).unwrap();
    pair.drive(second);
    assert!(pair.run(u64::MAX, |p| p.apps[first].eof));
    assert!(pair.settle(1_000_000));
    for s in 0..2 {
        assert_eq!(
            pair.sides[s].link().close_reason(),
            Some(&CloseReason::Graceful)
        );
    }
    assert_eq!(pair.apps[first].read_hash, pair.apps[second].write_hash);
    assert_eq!(pair.apps[second].read_hash, pair.apps[first].write_hash);
}

#[test]
fn half_close_connecting_peer_first() {
    half_close(0, 11);
}

#[test]
fn half_close_accepting_peer_first() {
    half_close(1, 12);
}

#[test]
fn abortive_close_resets_the_peer() {
    for (closer, seed) in [(0, 21), (1, 22)] {
        let c = small();
        let mut pair = LinkPair::connected(&c, &c, seed);
        pair.apps[0].to_write = 10_000;
        pair.apps[1].to_write = 10_000;
        pair.run(50, |_| false);
        pair.sides[closer].link().abort();
        pair.drive(closer);
        assert_eq!(
            pair.sides[closer].link().teardown(),
            Some(Teardown::Abortive)
        );
        pair.settle(100_000);
        let peer = 1 - closer;
        assert_eq!(pair.sides[peer].link().teardown(), Some(Teardown::Abortive));
        // Whatever was received before the reset may still be read; then
        // the reset is reported, once.
        assert!(saw_error(&mut pair, peer, Error::ConnectionReset));
        let peer = pair.sides[peer].link();
        assert_eq!(peer.send(b"x", SendFlags::EMPTY), Err(Error::BrokenPipe));
    }
}

#[test]
fn oob_byte_arrives_in_order_with_the_mark() {
    let c = small();
    let mut pair = LinkPair::connected(&c, &c, 31);
    pair.apps[1].reading = false;
    let client = pair.sides[0].link();
    assert_eq!(client.send(b"abc", SendFlags::EMPTY), Ok(3));
    assert_eq!(client.send(b"d!", SendFlags::OOB), Ok(2));
    assert_eq!(client.send(b"ef", SendFlags::EMPTY), Ok(2));
    pair.drive(0);
    assert!(pair.settle(100_000));
    let server = pair.sides[1].link();
    assert!(server.urgent_ready());
    let mut buf = [0; 16];
    // The read stops at the mark.
    assert_eq!(server.recv(&mut buf, RecvFlags::EMPTY), Ok(4));
    assert_eq!(&buf[..4], b"abcd");
    assert!(server.at_mark());
    assert_eq!(server.recv(&mut buf, RecvFlags::OOB), Ok(1));
    assert_eq!(buf[0], b'!');
    assert_eq!(server.recv(&mut buf, RecvFlags::EMPTY), Ok(2));
    assert_eq!(&buf[..2], b"ef");
}

/// One SDP message: BSDH (Len covering `payload`) and `payload`.
fn message(mid: Mid, flags: Flags, bufs: u16, mseq: u32, mseq_ack: u32, payload: &[u8]) -> Vec<u8> {
    let mut m = vec![0; wire::BSDH_LEN];
    BsdhRepr {
        mid,
        flags,
        bufs,
        len: (wire::BSDH_LEN + payload.len()) as u32,
        mseq,
        mseq_ack,
    }
    .emit(&mut Bsdh::new_unchecked(&mut m[..]));
    m.extend_from_slice(payload);
    m
}

/// Side 0 turns hostile and sends `msgs` (built from its credit state) as
/// real RDMAP Sends; side 1 must close abortively, logging `rule`.
fn hostile(name: &str, rule: &str, msgs: impl FnOnce(u32, u32, u16) -> Vec<Vec<u8>>) {
    let c = small();
    let mut pair = LinkPair::connected(&c, &c, 41);
    // A little traffic first, so sequence numbers are not at their start.
    pair.apps[0].to_write = 1000;
    pair.apps[1].to_write = 1000;
    assert!(pair.run(u64::MAX, |p| p.apps[0].read == 1000
        && p.apps[1].read == 1000));
    assert!(pair.settle(100_000));
    // One more message from side 1, acknowledging all side 0 sent: side 0
    // has all four of side 1's buffers to misuse.
    pair.apps[1].to_write = 1001;
    assert!(pair.run(u64::MAX, |p| p.apps[0].read == 1001));
    assert!(pair.settle(100_000));
    assert_eq!(pair.sides[0].link().credit_state().send_credit, 4);
    pair.apps[1].reading = false;
    let side = &mut pair.sides[0];
    side.hostile = true;
    let cs = side.link().credit_state();
    for (i, m) in msgs(cs.lsseq.wrapping_add(1), cs.mseq_ack, cs.bufs)
        .into_iter()
        .enumerate()
    {
        side.qp
            .datapath_mut()
            .post_send(SendWr {
                wr_id: 1000 + i as u64,
                kind: QpSendKind::Send,
                payload: Payload::Inline(m),
                signaled: false,
            })
            .unwrap();
    }
    assert!(pair.settle(100_000), "{name}: no end");
    let victim = pair.sides[1].link();
    assert_eq!(victim.teardown(), Some(Teardown::Abortive), "{name}");
    assert_eq!(victim.conn().state(), State::Closed, "{name}");
    let lines: Vec<String> = victim.log_lines().map(str::to_string).collect();
    assert!(
        lines.iter().any(|l| l.contains(rule)),
        "{name}: log lines {lines:?} do not name {rule}"
    );
    assert!(saw_error(&mut pair, 1, Error::ConnectionReset), "{name}");
}

#[test]
fn hostile_bad_mid() {
    hostile("bad MID", "§6.1.1", |mseq, ack, bufs| {
        vec![message(Mid(0x20), Flags::EMPTY, bufs, mseq, ack, &[])]
    });
}

#[test]
fn hostile_len_mismatch() {
    hostile("Len mismatch", "§6.1", |mseq, ack, bufs| {
        let mut m = message(Mid::DATA, Flags::EMPTY, bufs, mseq, ack, b"hello");
        m[7] += 3;
        vec![m]
    });
}

#[test]
fn hostile_message_larger_than_buffer() {
    // The engine finds it: DDP Terminate (RFC 5041 §7.2 "message too long").
    hostile("too large", "Terminate sent", |mseq, ack, bufs| {
        vec![message(Mid::DATA, Flags::EMPTY, bufs, mseq, ack, &[7; 600])]
    });
}

#[test]
fn hostile_mseq_gap() {
    hostile("MSeq gap", "§10.1", |mseq, ack, bufs| {
        vec![message(
            Mid::DATA,
            Flags::EMPTY,
            bufs,
            mseq.wrapping_add(1),
            ack,
            b"x",
        )]
    });
}

#[test]
fn hostile_sending_without_credit() {
    // Four buffers at the victim: the third message with payload is sent
    // with fewer than three credits.
    hostile("no credit", "§10.5", |mseq, ack, bufs| {
        (0..4)
            .map(|i| message(Mid::DATA, Flags::EMPTY, bufs, mseq + i, ack, b"payload"))
            .collect()
    });
}

#[test]
fn hostile_data_after_disconn() {
    hostile("data after DisConn", "§8.2.1", |mseq, ack, bufs| {
        vec![
            message(Mid::DIS_CONN, Flags::EMPTY, bufs, mseq, ack, &[]),
            message(Mid::DATA, Flags::EMPTY, bufs, mseq + 1, ack, b"late"),
        ]
    });
}

/// Direct sends (DESIGN §7) with random buffer sizes and chunking: within
/// each call the "socket" takes a random part straight from the caller's
/// buffer and the rest is staged and rebased. The bytes arrive intact, and
/// every byte written was either sent direct or staged, never both.
#[test]
fn direct_send_random_partial_writes() {
    let (mut direct, mut staged) = (0, 0);
    for seed in 0..12 {
        let mut rng = crate::testing::Rng::new(seed + 100);
        let mut cfg = || Config {
            bufs: 3 + rng.below(6) as u16,
            buf_size: 37 + rng.below(4000) as u32,
            send_buffer: 1 + rng.below(20_000),
            ..Config::default()
        };
        let (a, b) = (cfg(), cfg());
        let max_chunk = [1, 7, 100, 3000, 40_000][seed as usize % 5];
        let bytes = 30_000 + seed * 1000;
        let mut pair = transfer_with(&a, &b, seed, bytes, max_chunk, (true, false));
        for s in 0..2 {
            let st = pair.sides[s].link().copy_stats();
            assert_eq!(st.bytes_sent_direct + st.bytes_staged, bytes, "seed {seed}");
            direct += st.bytes_sent_direct;
            staged += st.bytes_staged;
        }
    }
    assert!(direct > 0 && staged > 0, "direct {direct} staged {staged}");
}

/// One direct send of four full Data Messages; the socket takes two
/// FPDUs and 100 octets of the third within the call. Exactly the payload
/// not written is staged, the queued references move to the ring, and the
/// peer reads the bytes intact.
#[test]
fn direct_send_stages_exactly_what_the_socket_did_not_take() {
    let c = Config {
        bufs: 16,
        buf_size: 512,
        desired_remote_buf_size: 512,
        send_buffer: 4096,
        ..Config::default()
    };
    let mut pair = LinkPair::connected(&c, &c, 21);
    assert!(pair.settle(100_000));
    assert!(pair.sides[0].qp.txq().is_empty());
    // 496 payload octets per message (512 minus the BSDH); each FPDU is
    // 2 (ULPDU_Length) + 18 (DDP/RDMAP) + 16 (BSDH) + 496 + 4 (CRC) = 536.
    let payload = 4 * 496;
    let mut data = vec![0; payload];
    crate::testing::pattern(pair.apps[0].seed, 0, &mut data);
    assert_eq!(
        pair.sides[0].link().send_direct(&[&data], SendFlags::EMPTY),
        Ok(payload)
    );
    pair.drive(0);
    assert_eq!(pair.sides[0].link().conn().tx().sent(), payload as u64);
    // Two whole FPDUs, then the 36 header octets and 64 payload octets of
    // the third.
    let took = pair.transmit_from(0, 2 * 536 + 100, Some(&[&data]));
    assert_eq!(took, 2 * 536 + 100);
    let side = &mut pair.sides[0];
    let link = side.link.as_mut().unwrap();
    assert_eq!(
        side.qp
            .datapath()
            .region_low_water(super::direct::SEND_FROM),
        Some(2 * 496 + 64)
    );
    link.finish_direct(&[&data], &mut side.qp);
    assert_eq!(
        side.qp
            .datapath()
            .region_low_water(super::direct::SEND_FROM),
        None
    );
    let st = link.copy_stats();
    assert_eq!(st.bytes_sent_direct, 2 * 496 + 64);
    assert_eq!(st.bytes_staged, payload as u64 - (2 * 496 + 64));
    // The rest goes from the ring; the lent buffer is gone.
    drop(data);
    pair.apps[0].to_write = payload as u64;
    pair.apps[0].written = payload as u64;
    let mut hash = crate::testing::StreamHash::default();
    let mut again = vec![0; payload];
    crate::testing::pattern(pair.apps[0].seed, 0, &mut again);
    hash.update(&again);
    assert!(pair.run(1_000_000, |p| p.apps[1].read == payload as u64));
    assert_eq!(pair.apps[1].read_hash, hash);
}

/// Direct receive (DESIGN §7): readers wait with buffers of random size
/// while the byte stream arrives in random chunks, so messages land whole
/// in the reader's buffer, split across calls (copied back into the
/// Private Buffer), or after a credit update. The bytes arrive intact and
/// each was either placed direct or copied from a Private Buffer.
#[test]
fn direct_recv_random_chunking() {
    let mut direct = 0;
    for seed in 0..32 {
        let mut rng = crate::testing::Rng::new(seed + 200);
        let mut cfg = || Config {
            bufs: 3 + rng.below(6) as u16,
            buf_size: 37 + rng.below(4000) as u32,
            send_buffer: 1 + rng.below(20_000),
            ..Config::default()
        };
        let (a, b) = (cfg(), cfg());
        let max_chunk = [1, 7, 100, 3000, 40_000, 1 << 20][seed as usize % 6];
        let bytes = 30_000 + seed * 1000;
        let both = seed % 2 == 0;
        let mut pair = transfer_with(&a, &b, seed, bytes, max_chunk, (both, true));
        for s in 0..2 {
            let st = pair.sides[s].link().copy_stats();
            assert_eq!(
                st.bytes_received_direct + st.bytes_copied_from_pool,
                bytes,
                "seed {seed} side {s}"
            );
            direct += st.bytes_received_direct;
        }
    }
    assert!(direct > 0);
}

/// A 64-byte ping-pong where each reader waits for the message and each
/// writer's socket takes the whole message during the call: no byte is
/// staged or copied from a Private Buffer, in either direction.
#[test]
fn pingpong_waiting_reader_copies_nothing() {
    let c = Config::default();
    let mut pair = LinkPair::connected(&c, &c, 31);
    assert!(pair.settle(100_000));
    // Each message reaches the reader in one piece, as from a socket.
    pair.max_chunk = 1 << 20;
    pair.tiny_chunks = false;
    for app in &mut pair.apps {
        app.direct_recv = true;
        app.exact_reads = true;
        app.max_io = 64;
    }
    let rounds = 500u64;
    let mut offsets = [0u64; 2];
    for i in 0..rounds * 2 {
        let s = (i % 2) as usize;
        let o = 1 - s;
        let mut msg = [0u8; 64];
        crate::testing::pattern(pair.apps[s].seed, offsets[s], &mut msg);
        offsets[s] += 64;
        pair.apps[s].write_hash.update(&msg);
        let side = &mut pair.sides[s];
        let link = side.link.as_mut().unwrap();
        assert_eq!(link.send_direct(&[&msg], SendFlags::EMPTY), Ok(64));
        pair.drive(s);
        pair.transmit_from(s, usize::MAX, Some(&[&msg]));
        let side = &mut pair.sides[s];
        side.link
            .as_mut()
            .unwrap()
            .finish_direct(&[&msg], &mut side.qp);
        pair.drive(s);
        // The reader waits with 64 bytes of room; the message arrives.
        let before = pair.apps[o].read;
        while !pair.sides[s].wire.is_empty() {
            pair.deliver(s);
        }
        assert_eq!(
            pair.apps[o].read,
            before + 64,
            "round {i}: {:?} {:?} {:?} readable {}",
            pair.sides[s].link().copy_stats(),
            pair.sides[o].link().copy_stats(),
            pair.sides[s].link().credit_state(),
            pair.sides[o].link().bytes_readable()
        );
    }
    for s in 0..2 {
        let st = pair.sides[s].link().copy_stats();
        assert_eq!(st.bytes_staged, 0, "side {s}");
        assert_eq!(st.bytes_copied_from_pool, 0, "side {s}");
        assert_eq!(st.bytes_sent_direct, rounds * 64);
        assert_eq!(st.bytes_received_direct, rounds * 64);
        assert_eq!(pair.apps[s].read_hash, pair.apps[1 - s].write_hash);
    }
}

/// Write Zcopy and Read Zcopy together (`sdpcat -z both`): a posted
/// buffer is registered for a SinkAvail (the peer may write into it), but
/// the SinkAvail has to wait (no send credit, a ModeChange under way);
/// the writer's SrcAvail arrives meanwhile and holds it back (§11.3), so
/// the connection RDMA Reads the SrcAvail's buffer into the posted one
/// through that same registration. It must be writable locally too: the
/// engine refused the RDMA Read (LocalProtection) and the connection was
/// aborted — one 64 MiB `sdpcat -z both` transfer in a few.
#[test]
fn rdma_read_into_a_buffer_registered_for_a_sink_avail() {
    use crate::verbs::{Access, MemId, Memory, RdmaOp, WrId};
    let mut config = Config::default();
    crate::stream::zcopy::ZcopyMode::Both.apply(&mut config, 64 * 1024);
    let mut pair = LinkPair::connected(&config, &config, 7);
    assert!(pair.settle(10_000));
    let now = pair.now;
    let side = &mut pair.sides[1];
    let link = side.link.as_mut().unwrap();
    let len = 1 << 20;
    let buf = vec![0u8; len as usize];
    let id = link.post_recv_zcopy(&buf, RecvFlags::EMPTY, None).unwrap();
    // What the connection asks of the link in that order.
    let mem = MemId(1 << 20);
    link.execute_rdma(
        now,
        RdmaOp::Register {
            mem,
            memory: Memory::Recv { id, len },
            access: Access::RemoteWrite,
        },
        &mut side.qp,
        &mut Lent::default(),
    );
    assert_eq!(link.zc_regs(), 1);
    let before = side.qp.datapath().send_outstanding();
    link.execute_rdma(
        now,
        RdmaOp::Read {
            wr_id: WrId(1 << 40),
            stag: 0x1234_5600,
            to: 0,
            len: 64 * 1024,
            into: id,
            offset: 0,
        },
        &mut side.qp,
        &mut Lent::default(),
    );
    let log: Vec<&str> = link.log_lines().collect();
    assert!(log.is_empty(), "{log:?}");
    assert!(!link.conn().is_aborting());
    // The RDMA Read Request is queued.
    assert_eq!(side.qp.datapath().send_outstanding(), before + 1);
}

/// A configuration whose buffers grow past what an idle connection keeps.
fn roomy() -> Config {
    Config {
        bufs: 4,
        buf_size: 16 * 1024,
        desired_remote_buf_size: 16 * 1024,
        send_buffer: 64 * 1024,
        ..Config::default()
    }
}

/// A connection that moved a burst of data and went quiet gives its
/// buffers' memory back after [`super::GIVE_BACK_AFTER`] (the harness's
/// virtual time jumps to the timer), and takes it again with the next
/// burst, delivering every byte of both.
#[test]
fn an_idle_connection_gives_its_buffer_memory_back() {
    for direct in [(false, false), (true, true)] {
        let mut pair = LinkPair::connected(&roomy(), &roomy(), 21);
        for app in &mut pair.apps {
            (app.direct_send, app.direct_recv) = direct;
        }
        for burst in 1..=2u64 {
            for app in &mut pair.apps {
                app.to_write = burst * 300_000;
            }
            let start = pair.now;
            let done = |p: &LinkPair| p.apps.iter().all(|a| a.read == burst * 300_000);
            assert!(pair.run(u64::MAX, done), "{direct:?} burst {burst} stuck");
            for s in 0..2 {
                let held = pair.sides[s].link().buffer_memory();
                assert!(held > super::GIVE_BACK_ABOVE, "{direct:?} side {s}: {held}");
                assert_eq!(pair.apps[s].read_hash, pair.apps[1 - s].write_hash);
            }
            assert!(pair.settle(1_000_000));
            assert!(pair.now >= start + super::GIVE_BACK_AFTER);
            for s in 0..2 {
                let link = pair.sides[s].link();
                assert_eq!(link.buffer_memory(), 0, "{direct:?} burst {burst} side {s}");
                assert_eq!(link.poll_timeout(), None);
                assert!(pair.apps[s].errors.is_empty(), "{:?}", pair.apps[s].errors);
            }
        }
    }
}

/// Unread bytes keep their buffers: the memory goes only once they are
/// read, and they come out whole.
#[test]
fn unread_bytes_keep_their_buffers_through_the_idle_time() {
    let mut pair = LinkPair::connected(&roomy(), &roomy(), 22);
    pair.apps[0].to_write = 40_000;
    pair.apps[1].reading = false;
    assert!(pair.settle(1_000_000));
    let unread = pair.sides[1].link().bytes_readable();
    assert!(unread > 0);
    assert!(pair.sides[1].link().conn().pool().held() as u64 >= unread);
    pair.apps[1].reading = true;
    assert!(pair.run(u64::MAX, |p| p.apps[1].read == 40_000));
    assert_eq!(pair.apps[1].read_hash, pair.apps[0].write_hash);
    assert!(pair.settle(1_000_000));
    assert_eq!(pair.sides[1].link().buffer_memory(), 0);
}
