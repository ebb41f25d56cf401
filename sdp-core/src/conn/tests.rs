//! Two connections against each other through the harness of
//! [`crate::testing`]: setup, Bcopy both ways, flow control, close, OOB,
//! and hostile peers.

use std::time::{Duration, Instant};

use super::*;
use crate::testing::{MemTransport, Pair, Rng, StreamHash};
use crate::verbs::{Event, Op, SendKind, Teardown, WrId};
use crate::wire::{Body, Flags, HelloAckRepr, MessageRepr};

fn small() -> Config {
    Config {
        bufs: 8,
        buf_size: 1024,
        send_buffer: 16 * 1024,
        ..Config::default()
    }
}

fn reason(pair: &Pair, side: usize) -> Option<CloseReason> {
    pair.conns[side].close_reason().copied()
}

// ----- setup ---------------------------------------------------------------

/// A Hello from `config` with its HH changed by `f`.
fn hello_with(config: &Config, f: impl FnOnce(&mut MessageRepr<'static>)) -> Vec<u8> {
    let bytes = setup::hello_message(config);
    let mut msg = MessageRepr::parse(&bytes).unwrap();
    let Body::Hello(hh) = msg.body else {
        unreachable!()
    };
    let mut owned = MessageRepr {
        bufs: msg.bufs,
        flags: msg.flags,
        mseq: msg.mseq,
        mseq_ack: msg.mseq_ack,
        body: Body::Hello(hh),
    };
    f(&mut owned);
    msg = owned;
    let mut out = vec![0; msg.buffer_len()];
    msg.emit(&mut out);
    out
}

#[test]
fn setup_accept_reject_matrix() {
    let c = Config::default();
    let with_hh = |g: fn(&mut crate::wire::HelloRepr)| {
        hello_with(&c, |m| {
            if let Body::Hello(hh) = &mut m.body {
                g(hh)
            }
        })
    };
    let refused = [
        (with_hh(|h| h.maj_v = 2), "§6.2.1.1, §6.2.2.1"),
        (with_hh(|h| h.max_adverts = 0), "§6.2.1.3, §6.2.2.3"),
        (with_hh(|h| h.loc_ird = 0), "§6.2.1.6, §6.2.2.5"),
        (with_hh(|h| h.loc_ord = 0), "§6.2.1.7, §6.2.2.6"),
        (hello_with(&c, |m| m.bufs = 2), "§10.3"),
    ];
    for (hello, rule) in refused {
        let err = Conn::accept(&c, &hello).unwrap_err();
        assert_eq!(err.rule(), rule, "{err}");
    }
    // A MinV mismatch is tolerated; the lower version is used.
    let conn = Conn::accept(&c, &with_hh(|h| h.min_v = 9)).unwrap();
    assert_eq!(conn.minor_version(), 1);
    let conn = Conn::accept(&c, &with_hh(|h| h.min_v = 0)).unwrap();
    assert_eq!(conn.minor_version(), 0);
    // IRD/ORD adjusted to the Hello's.
    let mine = Config {
        ird: 8,
        ord: 8,
        ..Config::default()
    };
    let hello = setup::hello_message(&Config {
        ird: 2,
        ord: 5,
        ..Config::default()
    });
    let conn = Conn::accept(&mine, &hello).unwrap();
    assert_eq!((conn.ird(), conn.ord()), (5, 2));
}

/// Runs setup by hand with a HelloAck changed by `f` and returns the
/// Connecting Peer after it received it.
fn client_after_hello_ack(f: impl FnOnce(&mut u16, &mut HelloAckRepr)) -> Conn {
    let now = Instant::now();
    let mut client = Conn::connect(&small());
    while client.poll_op().is_some() {}
    let mut bufs = 8;
    let mut hah = setup::hello_ack_repr(&small(), 1, 1);
    f(&mut bufs, &mut hah);
    let msg = MessageRepr {
        bufs,
        flags: Flags::EMPTY,
        mseq: 0,
        mseq_ack: 0,
        body: Body::HelloAck(hah),
    };
    let mut bytes = vec![0; msg.buffer_len()];
    msg.emit(&mut bytes);
    client.pool_mut().buffer_mut(0).unwrap()[..bytes.len()].copy_from_slice(&bytes);
    client.handle_event(
        now,
        Event::RecvDone {
            wr_id: WrId(0),
            len: bytes.len(),
        },
    );
    client
}

#[test]
fn connecting_peer_checks_the_hello_ack() {
    let ok = client_after_hello_ack(|_, h| h.min_v = 3);
    assert_eq!(ok.state(), State::Connected);
    assert_eq!(ok.minor_version(), 1);
    assert_eq!(ok.peer_buf_size(), Some(1024));
    type Change = fn(&mut u16, &mut HelloAckRepr);
    let cases: [(Change, &str); 5] = [
        (|_, h| h.maj_v = 3, "§6.2.1.1, §6.2.2.1"),
        (|_, h| h.max_adverts = 0, "§6.2.1.3, §6.2.2.3"),
        (|_, h| h.loc_ird = 0, "§6.2.1.6, §6.2.2.5"),
        (|b, _| *b = 1, "§10.3"),
        (|_, h| h.act_rcv_sz = 20, "§10"),
    ];
    for (f, rule) in cases {
        let mut conn = client_after_hello_ack(f);
        assert_eq!(conn.state(), State::Closed);
        let Some(CloseReason::Violation(v)) = conn.close_reason().copied() else {
            panic!("{:?}", conn.close_reason())
        };
        assert_eq!(v.rule(), rule);
        assert_eq!(conn.poll_op(), Some(Op::Teardown(Teardown::Abortive)));
        assert_eq!(
            conn.recv(&mut [0; 4], RecvFlags::EMPTY),
            Err(Error::ConnectionReset)
        );
    }
}

#[test]
fn hello_ack_is_the_first_send_with_se() {
    let now = Instant::now();
    let client = Conn::connect(&small());
    let mut server = Conn::accept(&small(), client.hello().unwrap()).unwrap();
    while let Some(op) = server.poll_op() {
        assert!(matches!(op, Op::PostRecv { .. }));
    }
    // Nothing before the RTR arrived.
    assert_eq!(server.send(10, SendFlags::EMPTY), Err(Error::WouldBlock));
    server.handle_event(now, Event::Established);
    let Some(Op::Send {
        kind,
        header,
        payload,
        ..
    }) = server.poll_op()
    else {
        panic!()
    };
    assert_eq!(kind, SendKind::SendSe);
    assert!(payload.is_empty());
    let msg = MessageRepr::parse(&header).unwrap();
    assert_eq!((msg.bufs, msg.mseq, msg.mseq_ack), (8, 0, 0));
    assert!(matches!(msg.body, Body::HelloAck(_)));
    // Credit: the Hello's 8 minus the HelloAck.
    assert_eq!(server.credit_state().send_credit, 7);
}

#[test]
fn refused_setup_reports_econnrefused() {
    let now = Instant::now();
    let mut client = Conn::connect(&small());
    while client.poll_op().is_some() {}
    client.handle_event(now, Event::TransportError(ErrorKind::Refused));
    assert_eq!(client.state(), State::Closed);
    assert_eq!(
        client.send(1, SendFlags::EMPTY),
        Err(Error::ConnectionRefused)
    );
    assert_eq!(client.poll_op(), Some(Op::Teardown(Teardown::Abortive)));
}

// ----- data transfer ---------------------------------------------------------

#[test]
fn large_transfer_both_ways() {
    // 256 MiB each way in release builds, 16 MiB in debug builds.
    let total: u64 = if cfg!(debug_assertions) {
        16 << 20
    } else {
        256 << 20
    };
    let config = Config {
        bufs: 16,
        buf_size: 64 * 1024,
        send_buffer: 1 << 20,
        ..Config::default()
    };
    let mut pair = Pair::new(&config, &config, 1);
    for app in &mut pair.apps {
        app.to_write = total;
        app.max_io = 256 * 1024;
    }
    let done = pair.run(u64::MAX, |p| {
        p.apps[0].read == total && p.apps[1].read == total
    });
    assert!(done);
    assert!(pair.transport_events.iter().all(Vec::is_empty));
    assert_eq!(pair.apps[1].read_hash, pair.apps[0].write_hash);
    assert_eq!(pair.apps[0].read_hash, pair.apps[1].write_hash);
    assert_ne!(pair.apps[0].read_hash, StreamHash::default());
    assert!(pair.sends_checked > 2 * total / (64 * 1024));
}

#[test]
fn random_interleavings_tiny_buffers() {
    // Minimal pools and buffers stress the reserved credits.
    for seed in 0..40 {
        let config = Config {
            bufs: 3 + (seed % 4) as u16,
            buf_size: 37 + (seed as u32 * 13) % 200,
            send_buffer: 1 + seed * 97 % 3000,
            ..Config::default()
        };
        let mut pair = Pair::new(&config, &small(), seed);
        pair.apps[0].to_write = 20_000;
        pair.apps[1].to_write = 7_000 + seed * 11;
        pair.apps[0].max_io = 300;
        pair.apps[1].max_io = 5000;
        let (a, b) = (pair.apps[0].to_write, pair.apps[1].to_write);
        let done = pair.run(2_000_000, |p| p.apps[0].read == b && p.apps[1].read == a);
        assert!(
            done,
            "seed {seed}: {:?} {:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{:?} {:?}",
            pair.apps[0].read,
            pair.apps[1].read,
            pair.conns[0].credit_state(),
            pair.conns[1].credit_state(),
            pair.conns[0].tx(),
            pair.conns[1].tx(),
            pair.conns[0].state(),
            pair.conns[1].state(),
        );
        assert_eq!(pair.apps[1].read_hash, pair.apps[0].write_hash);
        assert!(
            pair.transport_events.iter().all(Vec::is_empty),
            "seed {seed}"
        );
    }
}

#[test]
fn stalled_reader_stalls_the_sender_without_loss() {
    let mut pair = Pair::new(&small(), &small(), 3);
    pair.apps[0].to_write = 1 << 20;
    pair.apps[1].reading = false;
    // The sender fills the peer's buffers and its own send buffer, then
    // everything stops.
    assert!(pair.settle(1_000_000));
    let cs = pair.conns[0].credit_state();
    assert!(cs.send_credit < 3, "{cs:?}");
    assert!(!pair.conns[0].writable());
    let stuck = pair.apps[0].written;
    assert!(stuck < 1 << 20);
    assert_eq!(pair.conns[1].bytes_readable(), pair.conns[0].tx().sent());
    // The receiver resumes; everything arrives.
    pair.apps[1].reading = true;
    let done = pair.run(5_000_000, |p| p.apps[1].read == 1 << 20);
    assert!(done);
    assert_eq!(pair.apps[1].read_hash, pair.apps[0].write_hash);
    // And stalls again, the other way, while the first direction goes on.
    pair.apps[1].to_write = 300_000;
    pair.apps[0].reading = false;
    assert!(pair.settle(1_000_000));
    assert!(pair.apps[1].written < 300_000);
    pair.apps[0].reading = true;
    assert!(pair.run(5_000_000, |p| p.apps[0].read == 300_000));
}

#[test]
fn both_readers_stalled_is_quiet() {
    // Both applications write and never read: the pair must come to rest
    // (no credit updates traded forever).
    let mut pair = Pair::new(&small(), &small(), 4);
    for app in &mut pair.apps {
        app.to_write = 1 << 20;
        app.reading = false;
    }
    assert!(pair.settle(1_000_000));
    let sends = pair.sends_checked;
    assert!(pair.settle(1_000));
    assert_eq!(pair.sends_checked, sends);
    for app in &mut pair.apps {
        app.reading = true;
    }
    assert!(pair.run(10_000_000, |p| p.apps[0].read == 1 << 20
        && p.apps[1].read == 1 << 20));
}

#[test]
fn peek_and_waitall() {
    let mut pair = Pair::new(&small(), &small(), 5);
    pair.apps[1].reading = false;
    pair.apps[0].to_write = 100;
    assert!(pair.settle(100_000));
    let conn = &mut pair.conns[1];
    let mut buf = [0; 200];
    assert_eq!(
        conn.recv(&mut buf, RecvFlags::PEEK | RecvFlags::WAITALL),
        Err(Error::WouldBlock)
    );
    assert_eq!(
        conn.recv(&mut buf[..60], RecvFlags::PEEK | RecvFlags::WAITALL),
        Ok(60)
    );
    assert_eq!(conn.recv(&mut buf[..10], RecvFlags::PEEK), Ok(10));
    let mut expect = [0; 100];
    crate::testing::pattern(pair.apps[1].peer_seed, 0, &mut expect);
    assert_eq!(buf[..10], expect[..10]);
    assert_eq!(conn.recv(&mut buf, RecvFlags::WAITALL), Ok(100));
    assert_eq!(buf[..100], expect[..]);
    assert_eq!(
        conn.recv(&mut buf, RecvFlags::EMPTY),
        Err(Error::WouldBlock)
    );
}

#[test]
fn only_a_read_that_empties_a_buffer_owes_the_link_work() {
    // A read that copies out of a message still partly unread leaves the
    // link nothing to do; the one that empties its buffer owes a re-post
    // (and the credit it brings) until the link is driven.
    let mut pair = Pair::new(&small(), &small(), 6);
    pair.apps[1].reading = false;
    pair.apps[0].to_write = 100;
    assert!(pair.settle(100_000));
    let conn = &mut pair.conns[1];
    assert!(!conn.owes_after_read());
    let mut buf = [0; 100];
    assert_eq!(conn.recv(&mut buf[..40], RecvFlags::EMPTY), Ok(40));
    assert!(!conn.owes_after_read());
    assert_eq!(conn.recv(&mut buf[40..], RecvFlags::EMPTY), Ok(60));
    assert!(conn.owes_after_read());
    let mut expect = [0; 100];
    crate::testing::pattern(pair.apps[1].peer_seed, 0, &mut expect);
    assert_eq!(buf, expect);
    pair.drain();
    assert!(!pair.conns[1].owes_after_read());
}

// ----- close -----------------------------------------------------------------

/// A writes `a` bytes and shuts down; B writes `b` bytes and shuts down
/// once it saw A's end of stream, or at once if `together`.
fn half_close(first: usize, together: bool, seed: u64) {
    let mut pair = Pair::new(&small(), &small(), seed);
    let second = 1 - first;
    pair.apps[first].to_write = 50_000;
    pair.apps[first].shutdown_when_done = true;
    pair.apps[second].to_write = 30_000;
    pair.apps[second].shutdown_when_done = together;
    assert!(pair.run(1_000_000, |p| p.apps[second].eof));
    assert_eq!(pair.apps[second].read, 50_000);
    assert!(pair.conns[second].disconn_received());
    if !together {
        // The other half still carries data.
        assert_eq!(
            pair.conns[first].send(1, SendFlags::EMPTY),
            Err(Error::BrokenPipe)
        );
        pair.apps[second].shutdown_when_done = true;
    }
    assert!(pair.settle(1_000_000));
    assert_eq!(pair.apps[first].read, 30_000);
    assert_eq!(pair.apps[second].read_hash, pair.apps[first].write_hash);
    assert_eq!(pair.apps[first].read_hash, pair.apps[second].write_hash);
    for side in 0..2 {
        assert!(pair.apps[side].eof, "side {side}");
        assert!(
            pair.apps[side].errors.is_empty(),
            "{:?}",
            pair.apps[side].errors
        );
        assert_eq!(
            reason(&pair, side),
            Some(CloseReason::Graceful),
            "side {side}"
        );
        assert!(pair.conns[side].is_closed());
    }
}

#[test]
fn half_close_connecting_peer_first() {
    for seed in 0..10 {
        half_close(0, false, seed);
    }
}

#[test]
fn half_close_accepting_peer_first() {
    for seed in 0..10 {
        half_close(1, false, seed);
    }
}

#[test]
fn half_close_both_at_once() {
    for seed in 0..10 {
        half_close(0, true, seed);
    }
}

#[test]
fn abortive_close_resets_the_peer() {
    let mut pair = Pair::new(&small(), &small(), 6);
    pair.apps[0].to_write = 5_000;
    pair.apps[1].reading = false;
    assert!(pair.settle(100_000));
    pair.conns[0].abort();
    pair.drain();
    assert_eq!(reason(&pair, 0), Some(CloseReason::LocalAbort));
    assert_eq!(
        pair.transport_events[1],
        vec![Event::TransportError(ErrorKind::Reset)]
    );
    // The peer reads what arrived, then ECONNRESET once, then EOF; sends
    // fail with EPIPE after the error was reported.
    let conn = &mut pair.conns[1];
    let mut buf = vec![0; 10_000];
    assert_eq!(conn.recv(&mut buf, RecvFlags::EMPTY), Ok(5_000));
    assert_eq!(
        conn.recv(&mut buf, RecvFlags::EMPTY),
        Err(Error::ConnectionReset)
    );
    assert_eq!(conn.recv(&mut buf, RecvFlags::EMPTY), Ok(0));
    assert_eq!(conn.send(1, SendFlags::EMPTY), Err(Error::BrokenPipe));
    assert_eq!(
        std::io::Error::from(Error::ConnectionReset).raw_os_error(),
        Some(104)
    );
}

#[test]
fn abort_after_disconn_sends_abort_conn() {
    let mut pair = Pair::new(&small(), &small(), 7);
    pair.conns[0].shutdown(Shutdown::Write).unwrap();
    pair.drain();
    assert!(pair.conns[0].disconn_sent());
    pair.conns[0].abort();
    pair.drain();
    assert!(pair.conns[0].is_aborting());
    assert!(pair.settle(10_000));
    // §8.2.2: AbortConn, its completion, then the normal LLP teardown.
    assert_eq!(reason(&pair, 0), Some(CloseReason::LocalAbort));
    assert_eq!(reason(&pair, 1), Some(CloseReason::PeerAbort));
    assert_eq!(
        pair.conns[1].recv(&mut [0; 8], RecvFlags::EMPTY),
        Err(Error::ConnectionReset)
    );
}

#[test]
fn close_with_unread_data_is_abortive() {
    let mut pair = Pair::new(&small(), &small(), 8);
    pair.apps[0].to_write = 100;
    pair.apps[1].reading = false;
    assert!(pair.settle(100_000));
    pair.conns[1].close(pair.now);
    pair.drain();
    assert_eq!(reason(&pair, 1), Some(CloseReason::LocalAbort));
    assert_eq!(
        pair.conns[0].send(1, SendFlags::EMPTY),
        Err(Error::ConnectionReset)
    );
}

#[test]
fn close_finishes_without_the_application() {
    // close() with data still queued: it leaves, DisConn follows, and the
    // peer's close completes the teardown.
    let mut pair = Pair::new(&small(), &small(), 9);
    pair.apps[1].reading = false;
    pair.apps[0].to_write = 15_000;
    assert!(pair.run(100_000, |p| p.apps[0].written == 15_000));
    pair.apps[0].reading = false;
    pair.conns[0].close(pair.now);
    pair.apps[1].reading = true;
    assert!(pair.run(1_000_000, |p| p.apps[1].eof));
    assert_eq!(pair.apps[1].read, 15_000);
    pair.conns[1].close(pair.now);
    assert!(pair.settle(100_000));
    assert_eq!(reason(&pair, 0), Some(CloseReason::Graceful));
    assert_eq!(reason(&pair, 1), Some(CloseReason::Graceful));
}

/// The accepting program closes, or shuts its writing half, before the
/// RTR came: the setup still finishes — the peer's connect succeeds, as
/// TCP's did before the accept — and the close is graceful after the
/// HelloAck.
#[test]
fn an_accepted_connection_closed_before_the_rtr_finishes_its_setup_first() {
    for shut in [false, true] {
        let mut pair = Pair::answered(&small(), &small(), 12, MemTransport::default());
        assert_eq!(pair.conns[1].state(), State::HelloReceived);
        if shut {
            assert_eq!(pair.conns[1].shutdown(Shutdown::Write), Ok(()));
        } else {
            pair.conns[1].close(pair.now);
        }
        pair.drain();
        assert_eq!(pair.conns[1].state(), State::HelloReceived);
        assert!(pair.on_wire(1).is_empty(), "no FPDU before the RTR");
        pair.feed(1, Event::Established);
        pair.drain();
        let wire = pair.on_wire(1);
        assert_eq!(wire.len(), 2, "{wire:?}");
        assert!(wire[0].starts_with("HelloAck"), "{wire:?}");
        assert_eq!(wire[1], "DisConn");
        pair.apps[0].to_write = if shut { 3_000 } else { 0 };
        pair.apps[0].shutdown_when_done = true;
        assert!(pair.settle(100_000));
        assert!(pair.apps[0].eof);
        assert!(pair.apps[0].errors.is_empty(), "{:?}", pair.apps[0].errors);
        if shut {
            assert_eq!(pair.apps[1].read, 3_000);
            assert_eq!(pair.apps[1].read_hash, pair.apps[0].write_hash);
        }
        assert_eq!(reason(&pair, 0), Some(CloseReason::Graceful));
        assert_eq!(reason(&pair, 1), Some(CloseReason::Graceful));
    }
}

/// No RTR comes by the deadline: the accepted connection ends, and the
/// program that has it reads ECONNRESET.
#[test]
fn an_accepted_connection_without_its_rtr_ends_at_the_deadline() {
    let mut pair = Pair::answered(&small(), &small(), 14, MemTransport::default());
    let start = pair.now;
    pair.conns[1].await_rtr(start + Duration::from_secs(5));
    pair.apps[1].reading = false;
    assert!(pair.settle(100_000));
    assert!(pair.now >= start + Duration::from_secs(5));
    assert_eq!(reason(&pair, 1), Some(CloseReason::Timeout));
    assert_eq!(
        pair.conns[1].recv(&mut [0; 8], RecvFlags::EMPTY),
        Err(Error::ConnectionReset)
    );
}

/// The Connecting Peer has no connection before the HelloAck: its
/// shutdown is ENOTCONN and its close aborts the setup.
#[test]
fn a_connecting_peer_closed_before_the_helloack_aborts() {
    let mut pair = Pair::answered(&small(), &small(), 13, MemTransport::default());
    assert_eq!(pair.conns[0].state(), State::HelloSent);
    assert_eq!(
        pair.conns[0].shutdown(Shutdown::Write),
        Err(Error::NotConnected)
    );
    pair.conns[0].close(pair.now);
    assert_eq!(reason(&pair, 0), Some(CloseReason::LocalAbort));
    assert_eq!(pair.conns[0].state(), State::Closed);
}

#[test]
fn orphaned_close_times_out() {
    // The peer never closes: the orphan aborts after close_timeout.
    let config = Config {
        close_timeout: Duration::from_secs(5),
        ..small()
    };
    let mut pair = Pair::new(&config, &small(), 10);
    let start = pair.now;
    pair.conns[0].close(pair.now);
    assert!(pair.settle(100_000));
    assert!(pair.now >= start + Duration::from_secs(5));
    assert_eq!(reason(&pair, 0), Some(CloseReason::Timeout));
    assert_eq!(reason(&pair, 1), Some(CloseReason::PeerAbort));
}

#[test]
fn llp_close_without_disconn_is_abortive() {
    let mut pair = Pair::new(&small(), &small(), 11);
    pair.feed(1, Event::TransportClosed);
    assert_eq!(reason(&pair, 1), Some(CloseReason::TornDown));
    assert_eq!(
        pair.conns[1].recv(&mut [0; 4], RecvFlags::EMPTY),
        Err(Error::ConnectionReset)
    );
    pair.feed(0, Event::TransportError(ErrorKind::TimedOut));
    assert_eq!(
        pair.conns[0].send(4, SendFlags::EMPTY),
        Err(Error::TimedOut)
    );
}

// ----- OOB ---------------------------------------------------------------

#[test]
fn oob_byte_arrives_in_order_with_the_mark() {
    for inline in [false, true] {
        let mut pair = Pair::new(
            &small(),
            &Config {
                oob_inline: inline,
                ..small()
            },
            12,
        );
        pair.apps[1].reading = false;
        // "hello" then urgent "!" (sent as "hello!" with MSG_OOB) then "world".
        let bytes = b"hello!world";
        assert_eq!(pair.conns[0].send(6, SendFlags::OOB), Ok(6));
        assert_eq!(pair.conns[0].send(5, SendFlags::EMPTY), Ok(5));
        pair.stage(0, bytes);
        assert!(pair.settle(100_000));
        let conn = &mut pair.conns[1];
        assert!(conn.take_urgent_notice());
        assert!(conn.urgent_ready());
        assert!(!conn.at_mark());
        let mut buf = [0; 32];
        if !inline {
            // The urgent byte out of band, before or after the mark.
            assert_eq!(conn.recv(&mut buf, RecvFlags::OOB | RecvFlags::PEEK), Ok(1));
            assert_eq!(conn.recv(&mut buf, RecvFlags::OOB), Ok(1));
            assert_eq!(buf[0], b'!');
            assert_eq!(
                conn.recv(&mut buf, RecvFlags::OOB),
                Err(Error::InvalidInput)
            );
        } else {
            assert_eq!(
                conn.recv(&mut buf, RecvFlags::OOB),
                Err(Error::InvalidInput)
            );
        }
        // The read stops at the mark.
        assert_eq!(conn.recv(&mut buf, RecvFlags::EMPTY), Ok(5));
        assert_eq!(&buf[..5], b"hello");
        assert!(conn.at_mark());
        let n = conn.recv(&mut buf, RecvFlags::EMPTY).unwrap();
        if inline {
            assert_eq!(&buf[..n], b"!world");
        } else {
            assert_eq!(&buf[..n], b"world");
        }
        assert!(!conn.at_mark());
        assert_eq!(
            conn.recv(&mut buf, RecvFlags::OOB),
            Err(Error::InvalidInput)
        );
    }
}

#[test]
fn oob_pend_precedes_the_byte_and_mark_is_found_far_away() {
    // 200 000 bytes with the last one urgent: OOB_PEND cannot go with the
    // first message; it goes within 65 535 bytes of the byte.
    let config = Config {
        bufs: 16,
        buf_size: 64 * 1024,
        send_buffer: 1 << 20,
        ..Config::default()
    };
    let mut pair = Pair::new(&config, &config, 13);
    pair.apps[1].reading = false;
    let mut data = vec![0; 200_000];
    crate::testing::pattern(99, 0, &mut data);
    assert_eq!(
        pair.conns[0].send(data.len(), SendFlags::OOB),
        Ok(data.len())
    );
    pair.stage(0, &data);
    assert!(pair.settle(1_000_000));
    assert!(pair.conns[1].urgent_ready());
    let mut buf = vec![0; 300_000];
    let mut got = 0;
    while !pair.conns[1].at_mark() {
        got += pair.conns[1]
            .recv(&mut buf[got..], RecvFlags::EMPTY)
            .unwrap();
        pair.drain();
        pair.settle(100_000);
    }
    let conn = &mut pair.conns[1];
    assert_eq!(got, 199_999);
    assert_eq!(buf[..got], data[..got]);
    assert_eq!(conn.recv(&mut buf, RecvFlags::OOB), Ok(1));
    assert_eq!(buf[0], data[199_999]);
}

// ----- hostile peers -----------------------------------------------------------

/// Puts `bytes` in side 1's next posted buffer as if side 0 had sent
/// them, lets both sides act, and returns side 1's close reason.
fn inject(pair: &mut Pair, bytes: &[u8], len: usize) -> Option<CloseReason> {
    pair.inject(1, bytes, len).unwrap();
    pair.drain();
    pair.conns[1].close_reason().copied()
}

/// A message from side 0 to side 1 with valid sequence numbers.
pub(super) fn message(pair: &Pair, flags: Flags, body: Body<'_>) -> Vec<u8> {
    let cs = pair.conns[1].credit_state();
    let msg = MessageRepr {
        bufs: pair.conns[0].credit_state().bufs,
        flags,
        mseq: cs.mseq_ack.wrapping_add(1),
        mseq_ack: cs.lsseq,
        body,
    };
    let mut out = vec![0; msg.buffer_len()];
    msg.emit(&mut out);
    out
}

pub(super) fn assert_violation(got: Option<CloseReason>, rule: &str) {
    match got {
        Some(CloseReason::Violation(v)) => assert_eq!(v.rule(), rule, "{v}"),
        other => panic!("expected a violation of {rule}, got {other:?}"),
    }
}

#[test]
fn hostile_peer_violations_close_abortively_with_the_rule() {
    type Craft = fn(&mut Pair) -> (Vec<u8>, Option<usize>);
    let cases: Vec<(&str, Craft, &str)> = vec![
        (
            "reserved MID",
            |p| {
                let mut m = message(p, Flags::EMPTY, Body::DisConn);
                m[0] = 0x20;
                (m, None)
            },
            "§6.1.1",
        ),
        (
            "experimental MID",
            |p| {
                let mut m = message(p, Flags::EMPTY, Body::DisConn);
                m[0] = 0x42;
                (m, None)
            },
            "§6.1.1",
        ),
        (
            "Len larger than the message",
            |p| {
                let mut m = message(p, Flags::EMPTY, Body::Data { payload: b"abc" });
                m[7] += 1;
                (m, None)
            },
            "§6.1",
        ),
        (
            "Len smaller than the message",
            |p| {
                let mut m = message(p, Flags::EMPTY, Body::Data { payload: b"abc" });
                m[7] -= 1;
                (m, None)
            },
            "§6.1.4",
        ),
        (
            "payload on DisConn",
            |p| {
                let mut m = message(p, Flags::EMPTY, Body::DisConn);
                m.push(0);
                m[7] += 1;
                (m, None)
            },
            "§6.1.1",
        ),
        (
            "message larger than the buffer",
            |p| {
                let m = message(p, Flags::EMPTY, Body::Data { payload: b"x" });
                (m, Some(p.conns[1].pool().buf_size() + 1))
            },
            "§10",
        ),
        (
            "MSeq gap",
            |p| {
                let mut m = message(p, Flags::EMPTY, Body::Data { payload: b"x" });
                m[11] += 1;
                (m, None)
            },
            "§10.1",
        ),
        (
            "MSeqAck of a message never sent",
            |p| {
                let mut m = message(p, Flags::EMPTY, Body::Data { payload: b"x" });
                m[15] += 5;
                (m, None)
            },
            "§6.1.6",
        ),
        (
            "OOB_PRES without OOB_PEND",
            |p| {
                (
                    message(p, Flags::OOB_PRES, Body::Data { payload: b"x" }),
                    None,
                )
            },
            "§9.5.3",
        ),
        (
            "OOB_PRES on DisConn",
            |p| (message(p, Flags::OOB_PRES, Body::DisConn), None),
            "§6.1.2",
        ),
        (
            "Hello after setup",
            |p| {
                let hh = setup::hello_message(&small());
                let Body::Hello(h) = MessageRepr::parse(&hh).unwrap().body else {
                    unreachable!()
                };
                (message(p, Flags::EMPTY, Body::Hello(h)), None)
            },
            "§8.1.1",
        ),
        (
            "SendSm without SrcAvail",
            |p| (message(p, Flags::EMPTY, Body::SendSm), None),
            "§9.5.2.1",
        ),
        (
            "SinkAvail in Combined Mode",
            |p| {
                let header = crate::wire::SinkAvailRepr {
                    len: 100,
                    stag: 1,
                    va: 0,
                    non_discards: 0,
                };
                (
                    message(
                        p,
                        Flags::EMPTY,
                        Body::SinkAvail {
                            header,
                            payload: &[],
                        },
                    ),
                    None,
                )
            },
            "§11.2",
        ),
        (
            "SrcAvail without payload",
            |p| {
                let header = crate::wire::SrcAvailRepr {
                    len: 100,
                    stag: 1,
                    va: 0,
                };
                (
                    message(
                        p,
                        Flags::EMPTY,
                        Body::SrcAvail {
                            header,
                            payload: &[],
                        },
                    ),
                    None,
                )
            },
            "§11.2",
        ),
    ];
    for (name, craft, rule) in cases {
        let mut pair = Pair::new(&small(), &small(), 20);
        let (bytes, len) = craft(&mut pair);
        let len = len.unwrap_or(bytes.len());
        let got = inject(&mut pair, &bytes, len);
        assert_violation(got, rule);
        // Abortive: the LLP is reset (no DisConn was sent), the
        // application sees ECONNRESET.
        assert_eq!(
            pair.transport_events[0],
            vec![Event::TransportError(ErrorKind::Reset)],
            "{name}"
        );
        assert_eq!(
            pair.conns[1].recv(&mut [0; 4], RecvFlags::EMPTY),
            Err(Error::ConnectionReset),
            "{name}"
        );
    }
}

#[test]
fn hostile_peer_sending_without_credit() {
    // Side 1 advertised 8 buffers; side 0 "sends" payload messages without
    // waiting for an update: the 7th has only 2 credits left.
    let mut pair = Pair::new(&small(), &small(), 21);
    let mut got = None;
    for i in 0..7 {
        let m = message(&pair, Flags::EMPTY, Body::Data { payload: b"x" });
        got = inject(&mut pair, &m, m.len());
        if got.is_some() {
            assert_eq!(i, 6);
            break;
        }
        // Side 1's application does not read: no buffer comes back.
    }
    let Some(CloseReason::Violation(Violation::Credit(f))) = got else {
        panic!("{got:?}")
    };
    assert_eq!(f, credit::CreditFault::PayloadWithoutCredit);
    assert_eq!(Violation::Credit(f).rule(), "§10.5");
}

#[test]
fn hostile_peer_oob_pend_without_its_byte() {
    // OOB_PEND, then 65 535 bytes without OOB_PRES: the byte can no longer
    // come within reach (§9.5.3).
    let big = Config {
        bufs: 8,
        buf_size: 64 * 1024,
        ..Config::default()
    };
    let mut pair = Pair::new(&small(), &big, 26);
    pair.apps[1].reading = false;
    let data = vec![7u8; 40_000];
    let m = message(&pair, Flags::OOB_PEND, Body::Data { payload: &data });
    assert_eq!(inject(&mut pair, &m, m.len()), None);
    assert!(pair.conns[1].take_urgent_notice());
    // Announced but not here: EAGAIN, as Linux before the urgent byte.
    assert_eq!(
        pair.conns[1].recv(&mut [0; 1], RecvFlags::OOB),
        Err(Error::WouldBlock)
    );
    let m = message(
        &pair,
        Flags::EMPTY,
        Body::Data {
            payload: &data[..25_535],
        },
    );
    assert_violation(inject(&mut pair, &m, m.len()), "§9.5.3");
    // And an OOB_PRES too far from its OOB_PEND.
    let mut pair = Pair::new(&small(), &big, 27);
    let m = message(&pair, Flags::OOB_PEND, Body::Data { payload: &data });
    inject(&mut pair, &m, m.len());
    let m = message(
        &pair,
        Flags::OOB_PRES,
        Body::Data {
            payload: &data[..25_536],
        },
    );
    assert_eq!(
        inject(&mut pair, &m, m.len()),
        Some(CloseReason::Violation(Violation::OobPendTooFar))
    );
}

#[test]
fn hostile_peer_data_after_disconn() {
    let mut pair = Pair::new(&small(), &small(), 22);
    let m = message(&pair, Flags::EMPTY, Body::DisConn);
    assert_eq!(inject(&mut pair, &m, m.len()), None);
    let m = message(&pair, Flags::EMPTY, Body::Data { payload: b"late" });
    assert_eq!(
        inject(&mut pair, &m, m.len()),
        Some(CloseReason::Violation(Violation::DataAfterDisConn))
    );
    // A gratuitous update after DisConn is fine.
    let mut pair = Pair::new(&small(), &small(), 22);
    let m = message(&pair, Flags::EMPTY, Body::DisConn);
    inject(&mut pair, &m, m.len());
    let m = message(&pair, Flags::EMPTY, Body::Data { payload: &[] });
    assert_eq!(inject(&mut pair, &m, m.len()), None);
    // A second DisConn is not.
    let m = message(&pair, Flags::EMPTY, Body::DisConn);
    assert_violation(inject(&mut pair, &m, m.len()), "§8.2.1");
}

/// The Send side 1 issues next, skipping PostRecvs.
fn next_send(pair: &mut Pair) -> (SendKind, MessageRepr<'static>) {
    loop {
        match pair.conns[1].poll_op() {
            Some(Op::PostRecv { .. }) => continue,
            Some(Op::Send { kind, header, .. }) => {
                let bytes: &'static [u8] = Vec::leak(header.to_vec());
                return (kind, MessageRepr::parse(bytes).unwrap());
            }
            other => panic!("{other:?}"),
        }
    }
}

#[test]
fn src_avail_is_answered_with_send_sm() {
    let mut pair = Pair::new(&small(), &small(), 23);
    let header = crate::wire::SrcAvailRepr {
        len: 100,
        stag: 7,
        va: 0,
    };
    let m = message(
        &pair,
        Flags::EMPTY,
        Body::SrcAvail {
            header,
            payload: b"first",
        },
    );
    pair.inject(1, &m, m.len()).unwrap();
    // §9.5.2.1: SendSm, a solicited message (§14.2).
    let (kind, msg) = next_send(&mut pair);
    assert_eq!(kind, SendKind::SendSe);
    assert_eq!(msg.body, Body::SendSm);
    // The SrcAvail's payload is stream data.
    let mut out = [0; 8];
    assert_eq!(pair.conns[1].recv(&mut out, RecvFlags::EMPTY), Ok(5));
    assert_eq!(&out[..5], b"first");
    // Payload before the Data Source saw the SendSm breaks §11.2.
    let mut m = message(&pair, Flags::EMPTY, Body::Data { payload: b"rest" });
    // MSeqAck one short of the SendSm.
    m[15] -= 1;
    pair.inject(1, &m, m.len()).unwrap();
    assert_violation(reason(&pair, 1), "§11.2");
}

#[test]
fn ch_rcv_buf_is_answered_with_the_unchanged_size() {
    let mut pair = Pair::new(&small(), &small(), 24);
    let m = message(
        &pair,
        Flags::EMPTY,
        Body::ChRcvBuf(crate::wire::ChRcvBufRepr { des_sz: 4096 }),
    );
    pair.inject(1, &m, m.len()).unwrap();
    let (kind, msg) = next_send(&mut pair);
    assert_eq!(kind, SendKind::Send);
    assert_eq!(
        msg.body,
        Body::ChRcvBufAck(crate::wire::ChRcvBufAckRepr { act_sz: 1024 })
    );
}

#[test]
fn bad_completions_are_reported_not_panicked() {
    let mut pair = Pair::new(&small(), &small(), 25);
    pair.feed(
        1,
        Event::RecvDone {
            wr_id: WrId(999),
            len: 16,
        },
    );
    assert_violation(reason(&pair, 1), "RFC 5040 §5");
    let mut pair = Pair::new(&small(), &small(), 25);
    pair.feed(0, Event::SendDone { wr_id: WrId(12345) });
    assert_violation(reason(&pair, 0), "RFC 5040 §5");
}

/// Random socket calls and random bytes into a connection never panic.
#[test]
fn random_hostile_messages_never_panic() {
    let mut rng = Rng::new(77);
    for round in 0..300 {
        let mut pair = Pair::new(&small(), &small(), round);
        for _ in 0..20 {
            let mut m = message(
                &pair,
                Flags(rng.below(8) as u8),
                Body::Data { payload: b"abcdef" },
            );
            for _ in 0..rng.below(4) {
                let i = rng.below(m.len() as u64) as usize;
                m[i] = rng.next_u64() as u8;
            }
            let _ = inject(&mut pair, &m, m.len());
            let _ = pair.conns[1].recv(&mut [0; 3], RecvFlags(rng.below(4) as u32));
            if pair.conns[1].state() == State::Closed {
                break;
            }
        }
    }
}
