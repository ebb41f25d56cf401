//! Whole connections: MPA startup then the data path, the RTR of RFC 6581,
//! the responder's "no FPDU before one received" (RFC 5044 §7.1.2 rule 4),
//! rejection, startup timeout, and what the data path sends when the
//! startup fails with a code that calls for a Terminate (RFC 6581 §8).

mod common;

use std::time::Instant;

use common::{conn_config, connected, Dir, Pair};
use iwarp::engine::{
    Connection, Event, Payload, RecvWr, SendKind, SendWr, Sge, State, Status, WcOpcode,
};
use iwarp::mem::RegionId;
use iwarp::mpa::startup::{RtrSet, StartupEvent};
use iwarp::wire::ddp::BufferModel;
use iwarp::wire::fpdu::{self, Framing};
use iwarp::wire::mpa::Frame;
use iwarp::wire::rdmap::{Opcode, RdmapRepr};
use iwarp::wire::terminate::{HdrCt, TermCode, TerminateHeader, TerminateRepr};

fn recv(pair: &mut Pair<Connection>, dir: Dir, wr_id: u64, len: usize) -> RegionId {
    let side = if dir == Dir::AtoB {
        &mut pair.a
    } else {
        &mut pair.b
    };
    let r = side.mem.add(vec![0; len]);
    side.ep
        .datapath_mut()
        .post_recv(RecvWr {
            wr_id,
            sge: Sge {
                region: r,
                offset: 0,
                len,
            },
        })
        .unwrap();
    r
}

fn send(ep: &mut Connection, wr_id: u64, data: &[u8]) {
    ep.datapath_mut()
        .post_send(SendWr {
            wr_id,
            kind: SendKind::Send,
            payload: Payload::Inline(data.to_vec()),
            signaled: true,
        })
        .unwrap();
}

/// The frame at the front of `stream`, and its length.
fn frame_len(stream: &[u8]) -> usize {
    Frame::<&[u8]>::frame_len(&stream[..20]).unwrap()
}

/// Each RTR kind: the initiator's first FPDU is that zero-length message;
/// the responder sends nothing but its Reply until it has it; a Send RTR
/// consumes no receive buffer; a Read RTR completes nothing.
#[test]
fn rtr_each_kind_and_responder_waits() {
    for (kind, rtr) in [
        (
            "write",
            RtrSet {
                send: false,
                write: true,
                read: false,
            },
        ),
        (
            "read",
            RtrSet {
                send: false,
                write: false,
                read: true,
            },
        ),
        (
            "send",
            RtrSet {
                send: true,
                write: false,
                read: false,
            },
        ),
    ] {
        for markers in [false, true] {
            let mut a_cfg = conn_config(true, markers, 1460, 1);
            a_cfg.startup.rtr = rtr;
            let b_cfg = conn_config(true, markers, 1460, 2);
            let mut pair = Pair::new(
                Connection::connect(a_cfg, b"hi", Instant::now()).unwrap(),
                Connection::listen(b_cfg, Instant::now()),
                3,
            );
            pair.a.record = Some(Vec::new());
            pair.b.record = Some(Vec::new());
            pair.settle();
            assert!(matches!(
                pair.b.ep.poll_event(),
                Some(Event::ConnectRequest { .. })
            ));
            // Work posted on both sides before the Full Operation Phase.
            recv(&mut pair, Dir::AtoB, 10, 100);
            recv(&mut pair, Dir::BtoA, 20, 100);
            send(&mut pair.b.ep, 21, b"from b");
            pair.b.ep.accept(b"ok").unwrap();
            // The responder has only its Reply to send: rule 4.
            let now = pair.now;
            let queued = pair.b.ep.poll_transmit(now, &pair.b.mem, 1 << 20);
            assert_eq!(queued, 20 + 4 + 2, "{kind}");
            assert_eq!(pair.b.ep.state(), State::Rts);
            pair.settle();
            send(&mut pair.a.ep, 11, b"from a");
            pair.settle();

            let c: Vec<_> = pair
                .completions(Dir::AtoB)
                .iter()
                .map(|c| (c.wr_id, c.byte_len))
                .collect();
            assert_eq!(c, vec![(10, 6), (11, 6)], "{kind}");
            let c: Vec<_> = pair
                .completions(Dir::BtoA)
                .iter()
                .map(|c| (c.wr_id, c.byte_len))
                .collect();
            assert_eq!(c, vec![(21, 6), (20, 6)], "{kind}");

            // The initiator's first FPDU is the RTR.
            let stream = pair.a.record.take().unwrap();
            let at = frame_len(&stream);
            let (f, _) = fpdu::parse(&stream[at..], 0, Framing { markers, crc: true }).unwrap();
            let u = f.ulpdu.to_vec();
            let (repr, hl) = RdmapRepr::parse_bytes(&u).unwrap();
            assert_eq!(u.len(), hl, "zero-length");
            match kind {
                "write" => {
                    assert_eq!(repr.opcode, Opcode::RDMA_WRITE);
                    // RFC 6581 / DESIGN §4: a non-zero STag.
                    assert!(matches!(repr.model, BufferModel::Tagged { stag, .. } if stag.0 != 0));
                }
                "read" => {
                    assert_eq!(repr.opcode, Opcode::RDMA_READ_REQUEST);
                    assert_eq!(repr.read_request.unwrap().size, 0);
                }
                _ => {
                    assert_eq!(repr.opcode, Opcode::SEND);
                    assert!(matches!(repr.model, BufferModel::Untagged { msn: 1, .. }));
                }
            }
            // The responder's first FPDU comes after it.
            let b_stream = pair.b.record.take().unwrap();
            assert!(b_stream.len() > frame_len(&b_stream));
        }
    }
}

/// MPA Rev 1 (no RTR negotiation): the responder waits for whatever FPDU
/// the initiator sends first.
#[test]
fn rev1_initiators_first_fpdu_opens_the_responder() {
    let mut a_cfg = conn_config(true, false, 1460, 1);
    a_cfg.startup.rev = 1;
    let mut pair = connected(a_cfg, conn_config(true, false, 1460, 2), 4);
    recv(&mut pair, Dir::AtoB, 1, 10);
    recv(&mut pair, Dir::BtoA, 2, 10);
    send(&mut pair.b.ep, 3, b"b");
    pair.settle();
    assert_eq!(pair.completions(Dir::AtoB), vec![]);
    send(&mut pair.a.ep, 4, b"a");
    pair.settle();
    assert_eq!(pair.completions(Dir::AtoB).len(), 2);
    assert_eq!(pair.completions(Dir::BtoA).len(), 2);
}

#[test]
fn rejected() {
    let mut pair = Pair::new(
        Connection::connect(conn_config(true, false, 1460, 1), b"hi", Instant::now()).unwrap(),
        Connection::listen(conn_config(true, false, 1460, 2), Instant::now()),
        5,
    );
    recv(&mut pair, Dir::AtoB, 1, 10);
    pair.settle();
    assert!(matches!(
        pair.b.ep.poll_event(),
        Some(Event::ConnectRequest { .. })
    ));
    pair.b.ep.reject(b"no").unwrap();
    pair.settle();
    match pair.a.ep.poll_event() {
        Some(Event::Rejected { private_data, .. }) => assert_eq!(private_data, b"no"),
        other => panic!("{other:?}"),
    }
    assert_eq!(pair.a.ep.state(), State::Error);
    assert_eq!(pair.completions(Dir::AtoB)[0].status, Status::Flushed);
    assert_eq!(pair.b.ep.state(), State::Error);
    assert!(pair.a.ep.rejected() && pair.b.ep.rejected());
    assert!(!pair.a.ep.in_startup() && !pair.a.ep.has_pending_tx());
    // The stream left MPA: what follows the Reply is the ULP's.
    pair.inject(Dir::BtoA, b"plain tcp");
    pair.deliver(Dir::BtoA);
    assert_eq!(pair.a.inbox(), b"plain tcp");
}

#[test]
fn startup_timeout() {
    let start = Instant::now();
    let mut pair = Pair::new(
        Connection::connect(conn_config(true, false, 1460, 1), b"hi", start).unwrap(),
        Connection::listen(conn_config(true, false, 1460, 2), start),
        6,
    );
    pair.now = start;
    recv(&mut pair, Dir::AtoB, 1, 10);
    // The responder's ULP never answers; time jumps to the deadline.
    pair.drive();
    assert!(pair.now >= start + std::time::Duration::from_secs(5));
    let ev = pair.events(Dir::AtoB);
    assert!(matches!(&ev[..], [Event::Failed(_)]), "{ev:?}");
    assert_eq!(pair.a.ep.state(), State::Error);
    assert_eq!(pair.completions(Dir::AtoB)[0].status, Status::Flushed);
}

/// RFC 6581 §8: startup failures 5, 6 and 7 are reported to the peer in a
/// Terminate (Layer 2, Type 0, the code, no headers), framed as the
/// frames said (here the responder asked for markers); code 4 closes
/// without one.
#[test]
fn startup_failure_terminate() {
    for code in [
        TermCode::MPA_LOCAL_CATASTROPHIC,
        TermCode::MPA_INSUFFICIENT_IRD,
        TermCode::MPA_NO_MATCHING_RTR,
    ] {
        let a_cfg = conn_config(true, false, 1460, 1);
        let b_cfg = conn_config(true, true, 1460, 2);
        let mut pair = Pair::new(
            Connection::connect(a_cfg, b"hi", Instant::now()).unwrap(),
            Connection::listen(b_cfg, Instant::now()),
            7,
        );
        recv(&mut pair, Dir::AtoB, 1, 10);
        pair.settle();
        assert!(matches!(
            pair.b.ep.poll_event(),
            Some(Event::ConnectRequest { .. })
        ));
        pair.b.ep.accept(b"").unwrap();
        pair.hold = true;
        pair.settle();
        // A has read the Reply's header only when its startup fails.
        let reply = pair.a.inbox().to_vec();
        let now = pair.now;
        assert_eq!(
            pair.a.ep.handle_input(now, &reply[..20], &mut pair.a.mem),
            20
        );
        pair.a.ep.inject_startup_event(StartupEvent::Failed {
            code,
            send_terminate: true,
        });
        pair.a.record = Some(Vec::new());
        pair.hold = false;
        pair.transmit(Dir::AtoB, false);
        let sent = pair.a.record.take().unwrap();
        // Markers, because the responder set M; stream position 0.
        let (f, n) = fpdu::parse(
            &sent,
            0,
            Framing {
                markers: true,
                crc: true,
            },
        )
        .unwrap();
        assert_eq!(n, sent.len());
        assert_eq!(&sent[..4], &[0, 0, 0, 0]);
        let u = f.ulpdu.to_vec();
        let term = TerminateRepr::parse(&TerminateHeader::new_checked(&u[18..]).unwrap()).unwrap();
        assert_eq!((term.code, term.hdrct()), (code, HdrCt::default()));
        // A is in Error, its work flushed; B gets the Terminate.
        assert_eq!(pair.a.ep.state(), State::Error);
        let c = pair.completions(Dir::AtoB);
        assert_eq!(
            (c[0].opcode, c[0].status),
            (WcOpcode::Recv, Status::Flushed)
        );
        pair.deliver(Dir::AtoB);
        let ev = pair.events(Dir::BtoA);
        assert!(
            matches!(&ev[..], [Event::Established { .. }, Event::TerminateReceived(t)] if t.code == code),
            "{ev:?}"
        );
        assert_eq!(pair.b.ep.state(), State::Error);
    }

    // Code 4: close, nothing sent.
    let mut a =
        Connection::connect(conn_config(true, false, 1460, 1), b"", Instant::now()).unwrap();
    let frame = a.txq().len();
    a.inject_startup_event(StartupEvent::Failed {
        code: TermCode::MPA_INVALID_FRAME,
        send_terminate: false,
    });
    assert_eq!(
        a.poll_event(),
        Some(Event::Failed(TermCode::MPA_INVALID_FRAME))
    );
    assert_eq!(a.txq().len(), frame);
    assert_eq!(a.state(), State::Error);
}

/// A lost connection in the middle of things.
#[test]
fn llp_closed_fails_everything() {
    let mut pair = connected(
        conn_config(true, false, 1460, 1),
        conn_config(true, false, 1460, 2),
        8,
    );
    recv(&mut pair, Dir::AtoB, 1, 10);
    send(&mut pair.a.ep, 2, b"x");
    let now = pair.now;
    pair.a.ep.handle_llp_closed(now);
    let code = TermCode::MPA_CONNECTION_LOST;
    assert_eq!(pair.events(Dir::AtoB), vec![Event::Failed(code)]);
    let c: Vec<_> = pair
        .completions(Dir::AtoB)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(c, vec![(2, Status::Flushed), (1, Status::Flushed)]);
    let _ = Frame::new_unchecked(&[0u8; 20][..]);
}

/// A responder may change its M and C bits after seeing the Request and
/// before answering: here it mirrors an initiator that wants markers and
/// no CRC, so both directions carry markers and neither a CRC.
#[test]
fn responder_mirrors_framing() {
    let mut pair = Pair::new(
        Connection::connect(conn_config(false, true, 1460, 1), b"hi", Instant::now()).unwrap(),
        Connection::listen(conn_config(true, false, 1460, 2), Instant::now()),
        7,
    );
    pair.settle();
    assert!(pair.b.ep.in_startup());
    assert!(matches!(
        pair.b.ep.poll_event(),
        Some(Event::ConnectRequest { .. })
    ));
    pair.b.ep.set_framing(true, false).unwrap();
    pair.b.ep.accept(b"ok").unwrap();
    assert!(pair.b.ep.set_framing(false, true).is_err());
    assert!(pair.a.ep.set_framing(false, true).is_err());
    let r = recv(&mut pair, Dir::AtoB, 1, 4000);
    send(&mut pair.b.ep, 2, &[9; 3000]);
    // The responder's Send waits for the RTR (RFC 5044 §7.1.2 rule 4).
    assert!(!pair.b.ep.has_pending_tx());
    pair.hold = true;
    pair.settle();
    pair.hold = false;
    pair.deliver(Dir::BtoA);
    assert!(matches!(
        pair.a.ep.poll_event(),
        Some(Event::Established { .. })
    ));
    assert!(!pair.a.ep.in_startup() && !pair.a.ep.rejected());
    // The initiator has its RTR to send.
    assert!(pair.a.ep.has_pending_tx());
    pair.settle();
    assert!(!pair.a.ep.has_pending_tx() && !pair.b.ep.has_pending_tx());
    let c = pair.completions(Dir::AtoB);
    assert_eq!((c[0].wr_id, c[0].byte_len), (1, 3000));
    assert_eq!(&pair.a.mem.get(r).unwrap()[..3000], &[9; 3000][..]);
    // Markers both ways, no CRC: MULPDU of EMSS 1460 with markers.
    assert_eq!(pair.a.ep.datapath().mulpdu(), fpdu::mulpdu(1460, true));
    assert_eq!(pair.b.ep.datapath().mulpdu(), fpdu::mulpdu(1460, true));
}
