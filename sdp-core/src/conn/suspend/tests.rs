//! Socket duplication as the Remote Peer (draft §13.1.1) through the
//! two-connection harness: the SuspCommAck's timing, nothing after it, the
//! resumed connection's Hello, the streams across the new connection, and
//! the SuspComms that are violations.

use std::time::Instant;

use crate::conn::{CloseReason, Config, Conn, RecvFlags, SendFlags, Shutdown, State, Violation};
use crate::errno::Error;
use crate::testing::Pair;
use crate::verbs::{ErrorKind, Event, Op, SendKind, Teardown};
use crate::wire::{self, Body, Flags, MessageRepr, Mid, SuspCommRepr};

fn small() -> Config {
    Config {
        bufs: 8,
        buf_size: 1024,
        send_buffer: 16 * 1024,
        ..Config::default()
    }
}

/// The bytes of a message `body` from side `from` of `pair` as its next
/// message (MSeq, MSeqAck and Bufs from its credit state).
fn message_from(pair: &Pair, from: usize, body: Body<'_>) -> Vec<u8> {
    let cs = pair.conns[from].credit_state();
    let msg = MessageRepr {
        bufs: cs.bufs,
        flags: Flags::EMPTY,
        mseq: cs.lsseq.wrapping_add(1),
        mseq_ack: cs.mseq_ack,
        body,
    };
    let mut out = vec![0; msg.buffer_len()];
    msg.emit(&mut out);
    out
}

fn violation(conn: &Conn) -> Violation {
    match conn.close_reason().copied() {
        Some(CloseReason::Violation(v)) => v,
        other => panic!("not a violation: {other:?}"),
    }
}

/// Everything Op-wise a conn has now, without a transport.
fn ops(conn: &mut Conn) -> Vec<Op> {
    std::iter::from_fn(|| conn.poll_op()).collect()
}

#[test]
fn susp_comm_ack_waits_for_in_process_sends_and_nothing_follows_it() {
    let mut pair = Pair::new(&small(), &small(), 1);
    let now = pair.now;
    // Side 0 posts Sends of 3000 bytes (three Data Messages); the
    // transport holds them: they are In-Process.
    let data: Vec<u8> = (0..3000u32).map(|i| i as u8).collect();
    assert_eq!(pair.conns[0].send(data.len(), SendFlags::EMPTY), Ok(3000));
    pair.stage(0, &data);
    let mut in_process = Vec::new();
    while let Some(op) = pair.conns[0].poll_op() {
        if let Op::Send { wr_id, .. } = op {
            in_process.push(wr_id);
        }
    }
    assert_eq!(in_process.len(), 3);
    let susp = message_from(&pair, 1, Body::SuspComm(SuspCommRepr { port: 4791 }));
    pair.inject(0, &susp, susp.len()).unwrap();
    assert!(pair.conns[0].is_suspending());
    // The SuspComm's buffer goes back; no message while Sends are
    // In-Process, and none for bytes written now.
    assert_eq!(pair.conns[0].send(500, SendFlags::EMPTY), Ok(500));
    let early = ops(&mut pair.conns[0]);
    assert!(
        early.iter().all(|op| matches!(op, Op::PostRecv { .. })),
        "{early:?}"
    );
    for (i, wr_id) in in_process.iter().enumerate() {
        pair.conns[0].handle_event(now, Event::SendDone { wr_id: *wr_id });
        let out = ops(&mut pair.conns[0]);
        if i + 1 < in_process.len() {
            assert!(out.is_empty(), "{out:?}");
            continue;
        }
        // The last completion lets the SuspCommAck go: BSDH only, Send
        // with SE (§6.5.2, §14.2), carrying credit.
        let [Op::Send {
            wr_id,
            kind,
            header,
            payload,
            ..
        }] = &out[..]
        else {
            panic!("{out:?}")
        };
        assert_eq!(*kind, SendKind::SendSe);
        assert!(payload.is_empty());
        assert_eq!(header.len(), wire::BSDH_LEN);
        let msg = MessageRepr::parse(header).unwrap();
        assert_eq!(msg.body, Body::SuspCommAck);
        assert_eq!(msg.bufs, 8);
        // After it: nothing, whatever the application does.
        assert_eq!(pair.conns[0].send(100, SendFlags::EMPTY), Ok(100));
        assert_eq!(pair.conns[0].shutdown(Shutdown::Write), Ok(()));
        assert!(ops(&mut pair.conns[0]).is_empty());
        assert_eq!(pair.conns[0].resume_port(), None);
        // Its completion: the LLP connection is to be replaced.
        pair.conns[0].handle_event(now, Event::SendDone { wr_id: *wr_id });
    }
    assert_eq!(
        ops(&mut pair.conns[0]),
        vec![Op::Teardown(Teardown::Resume { port: 4791 })]
    );
    assert_eq!(pair.conns[0].resume_port(), Some(4791));
    // The old LLP connection's end is not the connection's.
    pair.conns[0].handle_event(now, Event::TransportClosed);
    assert_eq!(pair.conns[0].close_reason(), None);
    assert!(ops(&mut pair.conns[0]).is_empty());
    // Sent bytes were released; 600 accepted bytes wait for the new
    // connection.
    let tx = pair.conns[0].tx();
    assert_eq!((tx.released(), tx.accepted()), (3000, 3600));
}

#[test]
fn resumed_conn_sends_a_fresh_hello_and_keeps_unread_bytes_readable() {
    let mut pair = Pair::new(&small(), &small(), 2);
    // 2500 bytes from side 1 arrive at side 0, which reads 1000 of them.
    let data: Vec<u8> = (0..2500u32).map(|i| (i * 7) as u8).collect();
    assert_eq!(pair.conns[1].send(data.len(), SendFlags::EMPTY), Ok(2500));
    pair.stage(1, &data);
    pair.apps[0].reading = false;
    // Side 1's SuspComm needs a buffer to advertise (it must give credit
    // for the SuspCommAck): a message from side 0, read.
    pair.apps[0].to_write = 10;
    pair.settle(10_000);
    let mut got = vec![0; 1000];
    assert_eq!(pair.conns[0].recv(&mut got, RecvFlags::EMPTY), Ok(1000));
    pair.drain();
    pair.conns[1].request_suspend(9000);
    pair.drain();
    assert!(pair.run(10_000, |p| p.conns[0].resume_port().is_some()));
    assert!(pair.conns[1].susp_comm_acked());
    let mut conn = std::mem::replace(&mut pair.conns[0], Conn::connect(&small()));
    conn = conn.resume().unwrap();
    assert_eq!(conn.role(), crate::conn::Role::Connecting);
    assert!(conn.is_resuming());
    // §13.1.1 step 4: a Hello as at connection setup, with fresh buffers
    // posted first (the three holding unread bytes are not among them).
    let hello = setup_check(conn.hello().unwrap());
    assert_eq!(hello, (8, 1024));
    let posted: Vec<usize> = ops(&mut conn)
        .into_iter()
        .map(|op| match op {
            Op::PostRecv { buf, .. } => buf,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(posted, (3..11).collect::<Vec<_>>());
    // The unread bytes stay readable before the new HelloAck; writes are
    // accepted and wait.
    assert_eq!(conn.send(10, SendFlags::EMPTY), Ok(10));
    assert!(ops(&mut conn).is_empty());
    let mut rest = vec![0; 4000];
    assert_eq!(conn.recv(&mut rest, RecvFlags::EMPTY), Ok(1500));
    got.extend_from_slice(&rest[..1500]);
    assert_eq!(got, data);
    assert_eq!(
        conn.recv(&mut rest, RecvFlags::EMPTY),
        Err(Error::WouldBlock)
    );
    // Buffers read empty are posted again, credited by the next message.
    assert_eq!(ops(&mut conn).len(), 3);
}

fn setup_check(hello: &[u8]) -> (u16, u32) {
    let peer = crate::conn::setup::check_hello(hello).unwrap();
    (peer.bufs, peer.rcv_size)
}

/// Side `remote` answers a SuspComm from the other side mid-transfer
/// (both directions busy, bytes unsent and unread on it), resumes on a new
/// connection, and both streams arrive whole.
fn duplicate_mid_transfer(seed: u64, remote: usize) {
    let local = 1 - remote;
    let config = small();
    let total = 300_000;
    let mut pair = Pair::new(&config, &config, seed);
    pair.apps[0].to_write = total;
    pair.apps[1].to_write = total;
    assert!(pair.run(1_000_000, |p| p.apps[0].read > 60_000
        && p.apps[1].read > 60_000));
    // The Local Peer (Controlling Address Space) waits for its In-Process
    // Sends (§13.1.1 step 2); the Remote Peer goes on writing.
    pair.apps[local].to_write = pair.apps[local].written;
    assert!(pair.run(1_000_000, |p| {
        let tx = p.conns[local].tx();
        tx.released() == tx.accepted()
    }));
    pair.conns[local].request_suspend(7000 + seed as u16);
    assert!(pair.run(1_000_000, |p| p.conns[remote].resume_port().is_some()));
    assert_eq!(pair.conns[remote].resume_port(), Some(7000 + seed as u16));
    assert!(pair.conns[local].susp_comm_acked());
    assert!(pair.conns[remote].poll_op().is_none());
    let unsent = pair.conns[remote].tx().unsent();
    assert!(pair.resume(remote, &config), "seed {seed}: no HelloAck");
    assert!(pair.conns[remote].hello().is_some());
    assert_eq!(pair.conns[remote].state(), State::Connected);
    // The rest of both streams, over the new connection.
    pair.apps[local].to_write = total;
    assert!(
        pair.run(5_000_000, |p| p.apps[0].read == total
            && p.apps[1].read == total),
        "seed {seed}: read {} / {} (unsent at suspension: {unsent})",
        pair.apps[0].read,
        pair.apps[1].read
    );
    assert_eq!(pair.apps[1].read_hash, pair.apps[0].write_hash);
    assert_eq!(pair.apps[0].read_hash, pair.apps[1].write_hash);
    assert!(pair.apps.iter().all(|a| a.errors.is_empty()));
    // §10.5 was checked on every Send, the old connection's and the new.
    assert!(pair.sends_checked > 100);
}

#[test]
fn connecting_peer_answers_susp_comm_mid_transfer() {
    for seed in 0..8 {
        duplicate_mid_transfer(seed, 0);
    }
}

#[test]
fn accepting_peer_answers_susp_comm_mid_transfer() {
    for seed in 0..8 {
        duplicate_mid_transfer(seed, 1);
    }
}

#[test]
fn susp_comm_with_bad_constants_is_a_violation() {
    for (at, value) in [(wire::BSDH_LEN + 3, 1u8), (wire::BSDH_LEN + 5, 0)] {
        let mut pair = Pair::new(&small(), &small(), 3);
        let mut bytes = message_from(&pair, 1, Body::SuspComm(SuspCommRepr { port: 1 }));
        bytes[at] = value;
        pair.inject(0, &bytes, bytes.len()).unwrap();
        let v = violation(&pair.conns[0]);
        assert_eq!(v, Violation::Malformed(wire::Error::SuspCommConstant));
        assert_eq!(v.rule(), "§6.5.1.2, §6.5.1.3");
        assert_eq!(
            pair.conns[0].poll_op(),
            Some(Op::Teardown(Teardown::Abortive))
        );
    }
}

#[test]
fn susp_comm_before_setup_is_a_violation() {
    let now = Instant::now();
    let mut client = Conn::connect(&small());
    while client.poll_op().is_some() {}
    let msg = MessageRepr {
        bufs: 8,
        flags: Flags::EMPTY,
        mseq: 0,
        mseq_ack: 0,
        body: Body::SuspComm(SuspCommRepr { port: 5 }),
    };
    let mut bytes = vec![0; msg.buffer_len()];
    msg.emit(&mut bytes);
    client.pool_mut().buffer_mut(0).unwrap()[..bytes.len()].copy_from_slice(&bytes);
    client.handle_event(
        now,
        Event::RecvDone {
            wr_id: crate::verbs::WrId(0),
            len: bytes.len(),
        },
    );
    assert_eq!(
        violation(&client),
        Violation::UnexpectedMessage(Mid::SUSP_COMM)
    );
    assert_eq!(client.poll_op(), Some(Op::Teardown(Teardown::Abortive)));
    assert_eq!(
        client.recv(&mut [0; 4], RecvFlags::EMPTY),
        Err(Error::ConnectionReset)
    );
}

#[test]
fn susp_comm_after_dis_conn_is_a_violation() {
    // The peer's DisConn, then its SuspComm.
    let mut pair = Pair::new(&small(), &small(), 4);
    pair.conns[1].shutdown(Shutdown::Write).unwrap();
    pair.settle(10_000);
    assert!(pair.conns[0].disconn_received());
    let bytes = message_from(&pair, 1, Body::SuspComm(SuspCommRepr { port: 5 }));
    pair.inject(0, &bytes, bytes.len()).unwrap();
    let v = violation(&pair.conns[0]);
    assert_eq!(v, Violation::UnexpectedMessage(Mid::SUSP_COMM));
    assert_eq!(v.rule(), "§13.1.1");
    // Our DisConn, then the peer's SuspComm.
    let mut pair = Pair::new(&small(), &small(), 5);
    pair.apps[1].reading = false;
    pair.conns[0].shutdown(Shutdown::Write).unwrap();
    pair.drain();
    assert!(pair.conns[0].disconn_sent());
    let bytes = message_from(&pair, 1, Body::SuspComm(SuspCommRepr { port: 5 }));
    pair.inject(0, &bytes, bytes.len()).unwrap();
    assert_eq!(
        violation(&pair.conns[0]),
        Violation::UnexpectedMessage(Mid::SUSP_COMM)
    );
    // A DisConn went: the abortive close sends AbortConn (§8.2.2).
    assert!(pair.conns[0].is_aborting());
}

#[test]
fn a_second_susp_comm_is_a_violation() {
    let mut pair = Pair::new(&small(), &small(), 6);
    let first = message_from(&pair, 1, Body::SuspComm(SuspCommRepr { port: 5 }));
    pair.inject(0, &first, first.len()).unwrap();
    let mut second = first.clone();
    // MSeq one further.
    second[8..12]
        .copy_from_slice(&(u32::from_be_bytes(first[8..12].try_into().unwrap()) + 1).to_be_bytes());
    pair.inject(0, &second, second.len()).unwrap();
    assert_eq!(
        violation(&pair.conns[0]),
        Violation::UnexpectedMessage(Mid::SUSP_COMM)
    );
}

#[test]
fn failed_reconnection_is_econnreset() {
    let kinds = [
        Event::TransportError(ErrorKind::Refused),
        Event::TransportError(ErrorKind::Terminated),
        Event::TransportError(ErrorKind::TimedOut),
        Event::TransportClosed,
    ];
    for ev in kinds {
        let mut pair = Pair::new(&small(), &small(), 7);
        // A message for side 1 to read: its SuspComm then gives credit.
        pair.apps[0].to_write = 10;
        pair.settle(10_000);
        pair.conns[1].request_suspend(80);
        pair.drain();
        assert!(pair.run(10_000, |p| p.conns[0].resume_port().is_some()));
        let mut conn = std::mem::replace(&mut pair.conns[0], Conn::connect(&small()));
        assert!(conn.resume_in_place());
        while conn.poll_op().is_some() {}
        // The new TCP connection is refused, the MPA Request rejected, the
        // startup times out, or the peer closes before the HelloAck.
        conn.handle_event(pair.now, ev);
        assert_eq!(conn.state(), State::Closed);
        assert_eq!(conn.poll_op(), Some(Op::Teardown(Teardown::Abortive)));
        assert_eq!(
            conn.send(1, SendFlags::EMPTY),
            Err(Error::ConnectionReset),
            "{ev:?}"
        );
    }
}

/// The Local Peer's SuspComm is its last credit update (§13.1.1 step 2):
/// sent while the Remote Peer's messages in flight fill every buffer it
/// advertises, it would leave the Remote Peer no credit for the
/// SuspCommAck (§10.5). It waits until it provides credit; the
/// SuspCommAck then goes with the last credit, which it may use since it
/// provides credit too.
#[test]
fn susp_comm_waits_until_it_gives_the_peer_credit_for_the_ack() {
    let mut pair = Pair::new(&small(), &small(), 11);
    let cs = |p: &Pair, side: usize| p.conns[side].credit_state();
    // Side 0 writes more than the 8 buffers of side 1 take: six Data
    // Messages and a credit request, down to its last credit.
    let data = vec![0xa5; 8000];
    assert_eq!(pair.conns[0].send(data.len(), SendFlags::EMPTY), Ok(8000));
    pair.stage(0, &data);
    pair.drain();
    assert_eq!(cs(&pair, 0).send_credit, 1);
    // Side 1's four Data Messages are read by side 0, whose credit update
    // takes that last credit: eight messages in flight, side 1's eight
    // buffers.
    let data = vec![0x5a; 4 * 1008];
    assert_eq!(pair.conns[1].send(data.len(), SendFlags::EMPTY), Ok(4032));
    pair.stage(1, &data);
    pair.drain();
    pair.deliver_all(1);
    pair.complete_delivered(1);
    let mut got = vec![0; 4032];
    assert_eq!(pair.conns[0].recv(&mut got, RecvFlags::EMPTY), Ok(4032));
    pair.drain();
    assert_eq!(pair.on_wire(0).len(), 8);
    assert_eq!(cs(&pair, 0).send_credit, 0);
    // Side 1 has credit and nothing In-Process, but no buffer to
    // advertise: a SuspComm now would leave side 0 at credit 0 for good.
    assert!(cs(&pair, 1).send_credit >= 2);
    assert_eq!(cs(&pair, 1).gain, 0);
    pair.conns[1].request_suspend(4000);
    pair.drain();
    assert!(!pair.conns[1].susp_comm_sent());
    // The Data Messages arrive and wait for side 1's application; the
    // credit request's buffer goes back at once (no payload), and the
    // SuspComm advertises it.
    for _ in 0..6 {
        assert!(pair.deliver_next(0));
        assert!(!pair.conns[1].susp_comm_sent());
    }
    assert!(pair.deliver_next(0));
    assert!(pair.conns[1].susp_comm_sent());
    assert_eq!(
        pair.on_wire(1),
        vec!["SuspComm(SuspCommRepr { port: 4000 })"]
    );
    pair.deliver_all(0);
    pair.deliver_all(1);
    assert!(pair.conns[0].is_suspending());
    assert_eq!(cs(&pair, 0).send_credit, 1);
    // Once side 0's Sends complete, the SuspCommAck goes with that last
    // credit (checked against §10.5 at both ends).
    pair.complete_delivered(0);
    assert_eq!(pair.on_wire(0), vec!["SuspCommAck"]);
    pair.deliver_all(0);
    assert!(pair.conns[1].susp_comm_acked());
    assert_eq!(pair.conns[1].close_reason(), None);
    pair.complete_delivered(0);
    assert_eq!(pair.conns[0].resume_port(), Some(4000));
}
