//! The MPA Startup Phase (RFC 5044 §7.1, RFC 6581) end to end in memory:
//! the negotiation matrix, IRD/ORD, Private Data limits, malformed frames,
//! chunking, reject, Initiator/Initiator, timeouts. Frames are compared
//! with bytes built here by hand, not by the codec under test. Time is
//! virtual (an `Instant` plus offsets); nothing sleeps.

use std::time::{Duration, Instant};

use iwarp::mpa::startup::{
    FailureReason, Negotiated, Role, Rtr, RtrSet, Startup, StartupConfig, StartupError,
    StartupEvent, State,
};
use iwarp::wire::mpa::Error as WireError;
use iwarp::wire::terminate::TermCode;

const REQ: &[u8; 16] = b"MPA ID Req Frame";
const REP: &[u8; 16] = b"MPA ID Rep Frame";
const M: u8 = 0x80;
const C: u8 = 0x40;
const R: u8 = 0x20;
const S: u8 = 0x10;
const NO_NEG: u16 = 0x3fff;

/// A frame, byte by byte (RFC 5044 Figure 8).
fn frame(key: &[u8; 16], flags: u8, rev: u8, pd: &[u8]) -> Vec<u8> {
    let mut f = key.to_vec();
    f.push(flags);
    f.push(rev);
    f.extend_from_slice(&(pd.len() as u16).to_be_bytes());
    f.extend_from_slice(pd);
    f
}

/// The enhanced data A|B|IRD|C|D|ORD (RFC 6581 §9) followed by `ulp`.
fn enh(a: bool, rtr: RtrSet, ird: u16, ord: u16, ulp: &[u8]) -> Vec<u8> {
    let w1 = u16::from(a) << 15 | u16::from(rtr.send) << 14 | ird;
    let w2 = u16::from(rtr.write) << 15 | u16::from(rtr.read) << 14 | ord;
    let mut v = w1.to_be_bytes().to_vec();
    v.extend_from_slice(&w2.to_be_bytes());
    v.extend_from_slice(ulp);
    v
}

fn t0() -> Instant {
    Instant::now()
}

const ALL_SIZES: [usize; 4] = [1, 3, 19, usize::MAX];

/// Feeds `bytes` in chunks of `chunk`; returns the octets consumed.
fn feed(s: &mut Startup, now: Instant, bytes: &[u8], chunk: usize) -> usize {
    let mut used = 0;
    for piece in bytes.chunks(chunk.min(bytes.len()).max(1)) {
        let n = s.handle_input(now, piece);
        assert!(n <= piece.len());
        used += n;
        if n < piece.len() {
            break;
        }
    }
    used
}

fn events(s: &mut Startup) -> Vec<StartupEvent> {
    std::iter::from_fn(|| s.poll_event()).collect()
}

fn frames(s: &mut Startup) -> Vec<Vec<u8>> {
    std::iter::from_fn(|| s.poll_transmit()).collect()
}

#[derive(Clone, Copy)]
enum Decision<'a> {
    Accept(&'a [u8]),
    Reject(&'a [u8]),
}

#[derive(Debug, PartialEq)]
struct Run {
    request: Vec<u8>,
    reply: Option<Vec<u8>>,
    initiator: Vec<StartupEvent>,
    responder: Vec<StartupEvent>,
    initiator_failure: Option<FailureReason>,
    responder_failure: Option<FailureReason>,
    /// The responder failed with a code that closes TCP, and the initiator
    /// was told so with handle_close.
    closed: bool,
    /// Rev 1 retry on a "new connection", when the initiator may.
    retry: Option<Box<Run>>,
}

/// Runs an initiator and a responder against each other, moving bytes in
/// chunks of `chunk`. A responder failure closes "TCP": the initiator gets
/// handle_close, and if it may retry with Rev 1 that runs too.
fn run(icfg: StartupConfig, ipd: &[u8], rcfg: StartupConfig, d: Decision, chunk: usize) -> Run {
    let now = t0();
    let ini = Startup::initiator(icfg, ipd, now).unwrap();
    run_with(ini, rcfg, d, chunk, now)
}

fn run_with(mut ini: Startup, rcfg: StartupConfig, d: Decision, chunk: usize, now: Instant) -> Run {
    let mut rsp = Startup::responder(rcfg.clone(), now);
    let out = frames(&mut ini);
    assert_eq!(out.len(), 1);
    let request = out[0].clone();
    feed(&mut rsp, now, &request, chunk);
    let mut responder = events(&mut rsp);
    if let Some(StartupEvent::Request { .. }) = responder.last() {
        let _ = match d {
            Decision::Accept(pd) => rsp.accept(pd),
            Decision::Reject(pd) => rsp.reject(pd),
        };
        responder.extend(events(&mut rsp));
    }
    let out = frames(&mut rsp);
    assert!(out.len() <= 1);
    let reply = out.first().cloned();
    let mut closed = false;
    if let Some(reply) = &reply {
        assert_eq!(feed(&mut ini, now, reply, chunk), reply.len());
    } else if rsp.state() == State::Failed {
        closed = true;
        ini.handle_close(now);
    }
    let initiator = events(&mut ini);
    let retry = ini
        .retry_with_rev1(now)
        .map(|again| Box::new(run_with(again, rcfg, d, chunk, now)));
    Run {
        request,
        reply,
        initiator,
        responder,
        initiator_failure: ini.failure(),
        responder_failure: rsp.failure(),
        closed,
        retry,
    }
}

fn cfg_initiator(rev: u8, p2p: bool, offer: RtrSet) -> StartupConfig {
    StartupConfig {
        rev,
        ird: 8,
        ord: 4,
        peer_to_peer: p2p,
        rtr: offer,
        ..StartupConfig::default()
    }
}

fn cfg_responder(rev: u8, support: RtrSet) -> StartupConfig {
    StartupConfig {
        rev,
        rtr: support,
        ..StartupConfig::default()
    }
}

fn set(send: bool, write: bool, read: bool) -> RtrSet {
    RtrSet { send, write, read }
}

/// The Established pair for the matrix configurations (initiator IRD 8
/// ORD 4; responder IRD 16 ORD 16, which §9.1 turns into ORD 8).
fn established(rev: u8, enhanced: bool, rtr: Option<Rtr>) -> (Negotiated, Negotiated) {
    let (peer_i, peer_r) = if enhanced {
        ((16, 8), (8, 4))
    } else {
        ((NO_NEG, NO_NEG), (NO_NEG, NO_NEG))
    };
    let ini = Negotiated {
        rev,
        crc: true,
        tx_markers: false,
        rx_markers: false,
        ird: 8,
        ord: 4,
        peer_ird: peer_i.0,
        peer_ord: peer_i.1,
        rtr,
        peer_private_data: b"rsp".to_vec(),
        role: Role::Initiator,
    };
    let rsp = Negotiated {
        rev,
        crc: true,
        tx_markers: false,
        rx_markers: false,
        ird: 16,
        ord: if enhanced { 8 } else { 16 },
        peer_ird: peer_r.0,
        peer_ord: peer_r.1,
        rtr,
        peer_private_data: b"ini".to_vec(),
        role: Role::Responder,
    };
    (ini, rsp)
}

fn request_event(rev: u8, enhanced: bool) -> StartupEvent {
    let (peer_ird, peer_ord) = if enhanced { (8, 4) } else { (NO_NEG, NO_NEG) };
    StartupEvent::Request {
        rev,
        private_data: b"ini".to_vec(),
        peer_ird,
        peer_ord,
    }
}

/// Checks a Rev 1 run: plain frames, Established with no RTR.
fn assert_rev1_established(run: &Run) {
    assert_eq!(run.request, frame(REQ, C, 1, b"ini"));
    assert_eq!(run.reply.as_deref(), Some(&frame(REP, C, 1, b"rsp")[..]));
    let (ini, rsp) = established(1, false, None);
    assert_eq!(
        run.responder,
        [request_event(1, false), StartupEvent::Established(rsp)]
    );
    assert_eq!(run.initiator, [StartupEvent::Established(ini)]);
}

/// Checks a Rev 2 initiator against a Rev-1-only responder: the responder
/// closes on Rev (code 4) after reading 18 octets and sends nothing; the
/// initiator sees the close (code 1) and its Rev 1 retry succeeds.
fn assert_closed_then_rev1(run: &Run) {
    assert_eq!(run.reply, None);
    assert!(run.closed);
    assert_eq!(
        run.responder,
        [StartupEvent::Failed {
            code: TermCode::MPA_INVALID_FRAME,
            send_terminate: false
        }]
    );
    assert_eq!(
        run.responder_failure,
        Some(FailureReason::UnsupportedRev(2))
    );
    assert_eq!(
        run.initiator,
        [StartupEvent::Failed {
            code: TermCode::MPA_CONNECTION_LOST,
            send_terminate: false
        }]
    );
    assert_eq!(run.initiator_failure, Some(FailureReason::ConnectionClosed));
    let retry = run.retry.as_deref().expect("a Rev 1 retry");
    assert_rev1_established(retry);
    assert!(retry.retry.is_none());
}

#[test]
fn matrix_rev1_initiator() {
    let responders = [
        cfg_responder(1, RtrSet::ALL),
        cfg_responder(2, RtrSet::only(Rtr::Send)),
        cfg_responder(2, RtrSet::only(Rtr::Write)),
        cfg_responder(2, RtrSet::only(Rtr::Read)),
        cfg_responder(2, RtrSet::ALL),
    ];
    for rcfg in responders {
        for chunk in ALL_SIZES {
            let r = run(
                cfg_initiator(1, true, RtrSet::ALL),
                b"ini",
                rcfg.clone(),
                Decision::Accept(b"rsp"),
                chunk,
            );
            // RFC 6581 §10: "All responders are REQUIRED to issue unenhanced
            // RDMA connection establishment responses in response to
            // unenhanced RDMA connection establishment requests."
            assert_rev1_established(&r);
            assert!(r.retry.is_none());
        }
    }
}

#[test]
fn matrix_rev2_client_server() {
    let icfg = cfg_initiator(2, false, RtrSet::ALL);
    for chunk in ALL_SIZES {
        let r = run(
            icfg.clone(),
            b"ini",
            cfg_responder(1, RtrSet::ALL),
            Decision::Accept(b"rsp"),
            chunk,
        );
        assert_eq!(
            r.request,
            frame(REQ, C | S, 2, &enh(false, RtrSet::NONE, 8, 4, b"ini"))
        );
        assert_closed_then_rev1(&r);

        for support in [
            RtrSet::only(Rtr::Send),
            RtrSet::only(Rtr::Write),
            RtrSet::only(Rtr::Read),
            RtrSet::ALL,
        ] {
            let r = run(
                icfg.clone(),
                b"ini",
                cfg_responder(2, support),
                Decision::Accept(b"rsp"),
                chunk,
            );
            // A=0 echoed, no B/C/D (RFC 6581 §9.2).
            assert_eq!(
                r.reply.as_deref(),
                Some(&frame(REP, C | S, 2, &enh(false, RtrSet::NONE, 16, 8, b"rsp"))[..])
            );
            let (ini, rsp) = established(2, true, None);
            assert_eq!(
                r.responder,
                [request_event(2, true), StartupEvent::Established(rsp)]
            );
            assert_eq!(r.initiator, [StartupEvent::Established(ini)]);
        }
    }
}

/// The one flag the responder sets, and the RTR the initiator then sends
/// (None: code 7).
type Expect = (Rtr, Option<Rtr>);

#[test]
fn matrix_rev2_peer_to_peer() {
    use Rtr::{Read as Rd, Send as Sd, Write as Wr};
    let subsets = [
        set(true, false, false),
        set(false, true, false),
        set(false, false, true),
        set(true, true, false),
        set(true, false, true),
        set(false, true, true),
        set(true, true, true),
    ];
    // Per offer, per responder subset: (the one flag the responder sets,
    // the RTR the initiator then sends or None for code 7).
    let table: [(RtrSet, [Expect; 7]); 4] = [
        (
            RtrSet::only(Sd),
            [
                (Sd, Some(Sd)),
                (Wr, None),
                (Rd, None),
                (Sd, Some(Sd)),
                (Sd, Some(Sd)),
                (Wr, None),
                (Sd, Some(Sd)),
            ],
        ),
        (
            RtrSet::only(Wr),
            [
                (Sd, None),
                (Wr, Some(Wr)),
                (Rd, None),
                (Wr, Some(Wr)),
                (Rd, None),
                (Wr, Some(Wr)),
                (Wr, Some(Wr)),
            ],
        ),
        (
            RtrSet::only(Rd),
            [
                (Sd, None),
                (Wr, None),
                (Rd, Some(Rd)),
                (Wr, None),
                (Rd, Some(Rd)),
                (Rd, Some(Rd)),
                (Rd, Some(Rd)),
            ],
        ),
        (
            RtrSet::ALL,
            [
                (Sd, Some(Sd)),
                (Wr, Some(Wr)),
                (Rd, Some(Rd)),
                (Wr, Some(Wr)),
                (Rd, Some(Rd)),
                (Wr, Some(Wr)),
                (Wr, Some(Wr)),
            ],
        ),
    ];
    for (offer, row) in table {
        let icfg = cfg_initiator(2, true, offer);
        let request = frame(REQ, C | S, 2, &enh(true, offer, 8, 4, b"ini"));
        for chunk in ALL_SIZES {
            // Rev-1-only responder.
            let r = run(
                icfg.clone(),
                b"ini",
                cfg_responder(1, RtrSet::ALL),
                Decision::Accept(b"rsp"),
                chunk,
            );
            assert_eq!(r.request, request);
            assert_closed_then_rev1(&r);

            for (support, (flag, chosen)) in subsets.into_iter().zip(row) {
                let what = format!("offer {offer:?} support {support:?} chunk {chunk}");
                let r = run(
                    icfg.clone(),
                    b"ini",
                    cfg_responder(2, support),
                    Decision::Accept(b"rsp"),
                    chunk,
                );
                assert_eq!(r.request, request, "{what}");
                assert_eq!(
                    r.reply.as_deref(),
                    Some(&frame(REP, C | S, 2, &enh(true, RtrSet::only(flag), 16, 8, b"rsp"))[..]),
                    "{what}"
                );
                let (ini, rsp) = established(2, true, chosen);
                let rsp = Negotiated {
                    rtr: Some(flag),
                    ..rsp
                };
                assert_eq!(
                    r.responder,
                    [request_event(2, true), StartupEvent::Established(rsp)],
                    "{what}"
                );
                match chosen {
                    Some(_) => assert_eq!(r.initiator, [StartupEvent::Established(ini)], "{what}"),
                    None => {
                        assert_eq!(
                            r.initiator,
                            [StartupEvent::Failed {
                                code: TermCode::MPA_NO_MATCHING_RTR,
                                send_terminate: true
                            }],
                            "{what}"
                        );
                        assert_eq!(
                            r.initiator_failure,
                            Some(FailureReason::NoMatchingRtr {
                                offered: offer,
                                responder: RtrSet::only(flag)
                            }),
                            "{what}"
                        );
                    }
                }
                assert!(r.retry.is_none());
            }
        }
    }
}

#[test]
fn matrix_reject() {
    // Every kind of initiator against a Rev 2 responder whose Consumer
    // rejects: R=1, S as in the Request, Rejected at both ends.
    let cases = [
        (
            cfg_initiator(1, true, RtrSet::ALL),
            frame(REP, C | R, 1, b"rsp"),
            false,
        ),
        (
            cfg_initiator(2, false, RtrSet::ALL),
            frame(REP, C | R | S, 2, &enh(false, RtrSet::NONE, 16, 8, b"rsp")),
            true,
        ),
        (
            cfg_initiator(2, true, RtrSet::only(Rtr::Send)),
            frame(
                REP,
                C | R | S,
                2,
                &enh(true, RtrSet::only(Rtr::Send), 16, 8, b"rsp"),
            ),
            true,
        ),
    ];
    for (icfg, reply, enhanced) in cases {
        for chunk in ALL_SIZES {
            let r = run(
                icfg.clone(),
                b"ini",
                StartupConfig::default(),
                Decision::Reject(b"rsp"),
                chunk,
            );
            assert_eq!(r.reply.as_deref(), Some(&reply[..]));
            let (ird, ord) = if enhanced { (8, 4) } else { (NO_NEG, NO_NEG) };
            assert_eq!(
                r.responder,
                [
                    request_event(icfg.rev, enhanced),
                    StartupEvent::Rejected {
                        private_data: b"ini".to_vec(),
                        peer_ird: ird,
                        peer_ord: ord
                    }
                ]
            );
            let (ird, ord) = if enhanced { (16, 8) } else { (NO_NEG, NO_NEG) };
            assert_eq!(
                r.initiator,
                [StartupEvent::Rejected {
                    private_data: b"rsp".to_vec(),
                    peer_ird: ird,
                    peer_ord: ord
                }]
            );
            assert!(!r.closed && r.retry.is_none());
            assert_eq!((r.initiator_failure, r.responder_failure), (None, None));
        }
    }
}

/// Builds an initiator and returns it after its Request went out.
fn initiator(cfg: StartupConfig, pd: &[u8], now: Instant) -> Startup {
    let mut ini = Startup::initiator(cfg, pd, now).unwrap();
    assert_eq!(frames(&mut ini).len(), 1);
    ini
}

#[test]
fn initiator_picks_among_several_responder_flags() {
    let now = t0();
    // A foreign responder may set several flags; the initiator picks among
    // those it offered: Write, then Read, then Send.
    let cases = [
        (RtrSet::ALL, RtrSet::ALL, Rtr::Write),
        (RtrSet::ALL, set(true, false, true), Rtr::Read),
        (RtrSet::ALL, set(true, false, false), Rtr::Send),
        (set(true, false, true), set(false, true, true), Rtr::Read),
        (set(true, false, true), RtrSet::ALL, Rtr::Read),
        (set(true, false, false), RtrSet::ALL, Rtr::Send),
    ];
    for (offer, flags, want) in cases {
        let mut ini = initiator(cfg_initiator(2, true, offer), b"", now);
        let reply = frame(REP, C | S, 2, &enh(true, flags, 16, 8, b""));
        assert_eq!(ini.handle_input(now, &reply), reply.len());
        match ini.poll_event() {
            Some(StartupEvent::Established(n)) => assert_eq!(n.rtr, Some(want)),
            other => panic!("{offer:?} {flags:?}: {other:?}"),
        }
    }
    // A=1 but no flag at all: code 7.
    let mut ini = initiator(cfg_initiator(2, true, RtrSet::ALL), b"", now);
    ini.handle_input(
        now,
        &frame(REP, C | S, 2, &enh(true, RtrSet::NONE, 16, 8, b"")),
    );
    assert_eq!(
        events(&mut ini),
        [StartupEvent::Failed {
            code: TermCode::MPA_NO_MATCHING_RTR,
            send_terminate: true
        }]
    );
}

#[test]
fn the_request_in_full() {
    // Default config, "SDP": C|S, Rev 2, PD_Length 7, A|B IRD 16, C|D ORD 16.
    let ini = Startup::initiator(StartupConfig::default(), b"SDP", t0());
    let bytes = ini.unwrap().poll_transmit().unwrap();
    assert_eq!(
        bytes,
        [
            0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61,
            0x6d, 0x65, 0x50, 0x02, 0x00, 0x07, 0xc0, 0x10, 0xc0, 0x10, b'S', b'D', b'P'
        ]
    );
    // Rev 1 with markers: M|C, no enhanced data.
    let cfg = StartupConfig {
        markers: true,
        ..StartupConfig::default().rev1()
    };
    let bytes = Startup::initiator(cfg, b"", t0())
        .unwrap()
        .poll_transmit()
        .unwrap();
    assert_eq!(
        bytes,
        [
            0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61,
            0x6d, 0x65, 0xc0, 0x01, 0x00, 0x00
        ]
    );
}

/// One enhanced exchange with the given IRD/ORD; returns (reply bytes,
/// initiator Negotiated, responder Negotiated).
fn ird_ord(i: (u16, u16), r: (u16, u16)) -> (Vec<u8>, Negotiated, Negotiated) {
    let now = t0();
    let icfg = StartupConfig {
        ird: i.0,
        ord: i.1,
        ..StartupConfig::default()
    };
    let rcfg = StartupConfig {
        ird: r.0,
        ord: r.1,
        ..StartupConfig::default()
    };
    let r = run_with(
        initiator_unsent(icfg, now),
        rcfg,
        Decision::Accept(b""),
        5,
        now,
    );
    let get = |ev: &[StartupEvent]| match ev.last() {
        Some(StartupEvent::Established(n)) => n.clone(),
        other => panic!("{other:?}"),
    };
    (r.reply.unwrap(), get(&r.initiator), get(&r.responder))
}

fn initiator_unsent(cfg: StartupConfig, now: Instant) -> Startup {
    Startup::initiator(cfg, b"", now).unwrap()
}

#[test]
fn ird_ord_plain() {
    // RFC 6581 §9.1: responder ORD at most the initiator IRD (32 -> 16);
    // initiator ORD at most the responder IRD (8 -> 4); IRDs kept.
    let (reply, i, r) = ird_ord((16, 8), (4, 32));
    assert_eq!(
        reply,
        frame(
            REP,
            C | S,
            2,
            &enh(true, RtrSet::only(Rtr::Write), 4, 16, b"")
        )
    );
    assert_eq!((i.ird, i.ord, i.peer_ird, i.peer_ord), (16, 4, 4, 16));
    assert_eq!((r.ird, r.ord, r.peer_ird, r.peer_ord), (4, 16, 16, 8));
    // The relationships of a successful negotiation.
    assert!(i.ord <= r.ird && r.ord <= i.ird);
}

#[test]
fn ird_ord_initiator_ord_all_ones() {
    // Initiator ORD 0x3FFF: responder IRD unchanged locally, 0x3FFF in the
    // Reply; the initiator leaves its ORD unchanged.
    let (reply, i, r) = ird_ord((16, NO_NEG), (4, 32));
    assert_eq!(
        reply,
        frame(
            REP,
            C | S,
            2,
            &enh(true, RtrSet::only(Rtr::Write), NO_NEG, 16, b"")
        )
    );
    assert_eq!(
        (i.ird, i.ord, i.peer_ird, i.peer_ord),
        (16, NO_NEG, NO_NEG, 16)
    );
    assert_eq!((r.ird, r.ord, r.peer_ird, r.peer_ord), (4, 16, 16, NO_NEG));
}

#[test]
fn ird_ord_initiator_ird_all_ones() {
    // Initiator IRD 0x3FFF: responder ORD unchanged locally, 0x3FFF in the
    // Reply; the initiator leaves its IRD unchanged.
    let (reply, i, r) = ird_ord((NO_NEG, 8), (4, 32));
    assert_eq!(
        reply,
        frame(
            REP,
            C | S,
            2,
            &enh(true, RtrSet::only(Rtr::Write), 4, NO_NEG, b"")
        )
    );
    assert_eq!(
        (i.ird, i.ord, i.peer_ird, i.peer_ord),
        (NO_NEG, 4, 4, NO_NEG)
    );
    assert_eq!((r.ird, r.ord, r.peer_ird, r.peer_ord), (4, 32, NO_NEG, 8));
}

#[test]
fn ird_ord_both_all_ones() {
    let (reply, i, r) = ird_ord((NO_NEG, NO_NEG), (4, 32));
    assert_eq!(
        reply,
        frame(
            REP,
            C | S,
            2,
            &enh(true, RtrSet::only(Rtr::Write), NO_NEG, NO_NEG, b"")
        )
    );
    assert_eq!((i.ird, i.ord), (NO_NEG, NO_NEG));
    assert_eq!((r.ird, r.ord), (4, 32));
}

#[test]
fn ird_ord_zero_and_read_rtr() {
    // RFC 6581 §9.1's example: initiator ORD 0 and a Read RTR — the
    // responder raises its IRD 0 to 1, the initiator takes one ORD slot.
    let now = t0();
    let icfg = StartupConfig {
        ird: 0,
        ord: 0,
        rtr: RtrSet::only(Rtr::Read),
        ..StartupConfig::default()
    };
    let rcfg = StartupConfig {
        ird: 0,
        ord: 0,
        rtr: RtrSet::only(Rtr::Read),
        ..StartupConfig::default()
    };
    let r = run_with(
        initiator_unsent(icfg, now),
        rcfg,
        Decision::Accept(b""),
        1,
        now,
    );
    assert_eq!(
        r.request,
        frame(
            REQ,
            C | S,
            2,
            &enh(true, RtrSet::only(Rtr::Read), 0, 0, b"")
        )
    );
    assert_eq!(
        r.reply.unwrap(),
        frame(
            REP,
            C | S,
            2,
            &enh(true, RtrSet::only(Rtr::Read), 1, 0, b"")
        )
    );
    match (&r.initiator[..], r.responder.last()) {
        ([StartupEvent::Established(i)], Some(StartupEvent::Established(rs))) => {
            assert_eq!((i.ird, i.ord, i.rtr), (0, 1, Some(Rtr::Read)));
            assert_eq!((rs.ird, rs.ord, rs.rtr), (1, 0, Some(Rtr::Read)));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn insufficient_ird_at_initiator() {
    let now = t0();
    let mut ini = initiator(cfg_initiator(2, true, RtrSet::ALL), b"", now);
    // A responder ORD (9) above our IRD (8).
    let reply = frame(REP, C | M | S, 2, &enh(true, RtrSet::ALL, 16, 9, b"x"));
    assert_eq!(ini.handle_input(now, &reply), reply.len());
    assert_eq!(
        events(&mut ini),
        [StartupEvent::Failed {
            code: TermCode::MPA_INSUFFICIENT_IRD,
            send_terminate: true
        }]
    );
    assert_eq!(
        ini.failure(),
        Some(FailureReason::InsufficientIrd {
            responder_ord: 9,
            ird: 8
        })
    );
    assert_eq!(ini.state(), State::Failed);
    assert_eq!(ini.poll_timeout(), None);
    // The framing of the Terminate to send: CRC on, markers to the peer.
    let n = ini.negotiated().expect("framing for the Terminate");
    assert!(n.crc && n.tx_markers && !n.rx_markers);
    assert_eq!((n.peer_ird, n.peer_ord), (16, 9));

    // At our IRD exactly, or 0x3FFF, is fine.
    for ord in [8, NO_NEG] {
        let mut ini = initiator(cfg_initiator(2, true, RtrSet::ALL), b"", now);
        ini.handle_input(
            now,
            &frame(REP, C | S, 2, &enh(true, RtrSet::ALL, 16, ord, b"")),
        );
        assert!(matches!(
            events(&mut ini)[..],
            [StartupEvent::Established(_)]
        ));
    }
}

#[test]
fn responder_rejects_for_required_ord() {
    let now = t0();
    // The ULP needs ORD 6; the initiator IRD is 4: RFC 6581 §9.1 lets the
    // responder reject with the required ORD in the Reply (error 6).
    let icfg = StartupConfig {
        ird: 4,
        ord: 2,
        ..StartupConfig::default()
    };
    let rcfg = StartupConfig {
        required_ord: 6,
        ..StartupConfig::default()
    };
    let mut ini = initiator_unsent(icfg.clone(), now);
    let mut rsp = Startup::responder(rcfg.clone(), now);
    let request = ini.poll_transmit().unwrap();
    assert_eq!(feed(&mut rsp, now, &request, 1), request.len());
    assert!(matches!(
        rsp.poll_event(),
        Some(StartupEvent::Request { .. })
    ));
    assert_eq!(
        rsp.accept(b"need 6"),
        Err(StartupError::InsufficientIrd {
            initiator_ird: 4,
            required_ord: 6
        })
    );
    assert_eq!(
        TermCode::from(StartupError::InsufficientIrd {
            initiator_ird: 4,
            required_ord: 6
        }),
        TermCode::MPA_INSUFFICIENT_IRD
    );
    assert_eq!(rsp.state(), State::Rejected);
    assert_eq!(
        events(&mut rsp),
        [StartupEvent::Rejected {
            private_data: vec![],
            peer_ird: 4,
            peer_ord: 2
        }]
    );
    let reply = rsp.poll_transmit().unwrap();
    assert_eq!(
        reply,
        frame(
            REP,
            C | R | S,
            2,
            &enh(true, RtrSet::only(Rtr::Write), 16, 6, b"need 6")
        )
    );
    assert_eq!(ini.handle_input(now, &reply), reply.len());
    assert_eq!(
        events(&mut ini),
        [StartupEvent::Rejected {
            private_data: b"need 6".to_vec(),
            peer_ird: 16,
            peer_ord: 6
        }]
    );

    // Enough IRD, or an initiator IRD of 0x3FFF (the ULP's): accepted.
    for ird in [6, NO_NEG] {
        let icfg = StartupConfig {
            ird,
            ..icfg.clone()
        };
        let r = run(icfg, b"", rcfg.clone(), Decision::Accept(b""), 7);
        assert!(matches!(r.initiator[..], [StartupEvent::Established(_)]));
    }
    // Rev 1 carries no IRD: nothing to check.
    let r = run(icfg.rev1(), b"", rcfg, Decision::Accept(b""), 7);
    assert!(matches!(r.initiator[..], [StartupEvent::Established(_)]));
}

#[test]
fn crc_and_markers() {
    let now = t0();
    for bits in 0u8..16 {
        let (ic, im, rc, rm) = (bits & 1 != 0, bits & 2 != 0, bits & 4 != 0, bits & 8 != 0);
        let icfg = StartupConfig {
            crc: ic,
            markers: im,
            ..StartupConfig::default()
        };
        let rcfg = StartupConfig {
            crc: rc,
            markers: rm,
            ..StartupConfig::default()
        };
        let r = run_with(
            initiator_unsent(icfg, now),
            rcfg,
            Decision::Accept(b""),
            2,
            now,
        );
        let flags = |c: bool, m: bool| S | if c { C } else { 0 } | if m { M } else { 0 };
        assert_eq!(r.request[16], flags(ic, im));
        assert_eq!(r.reply.as_ref().unwrap()[16], flags(rc, rm));
        let (Some(StartupEvent::Established(i)), Some(StartupEvent::Established(rs))) =
            (r.initiator.last(), r.responder.last())
        else {
            panic!("{r:?}")
        };
        // RFC 5044 §7.1.1 C: "When this bit is '1' in either ... CRCs MUST
        // be generated and checked by both endpoints."
        assert_eq!(i.crc, ic || rc);
        assert_eq!(rs.crc, ic || rc);
        // M: markers in FPDUs sent *to* the end that set it.
        assert_eq!((i.tx_markers, i.rx_markers), (rm, im));
        assert_eq!((rs.tx_markers, rs.rx_markers), (im, rm));
        assert_eq!(i.tx_framing(), rs.rx_framing());
        assert_eq!(rs.tx_framing(), i.rx_framing());
        assert!(rs.must_receive_fpdu_first() && !i.must_receive_fpdu_first());
    }
}

#[test]
fn private_data_limits_at_initiator() {
    let now = t0();
    let pd = [0x5au8; 513];
    let rev2 = StartupConfig::default();
    let ini = Startup::initiator(rev2.clone(), &pd[..508], now);
    assert_eq!(ini.unwrap().poll_transmit().unwrap().len(), 20 + 512);
    assert_eq!(
        Startup::initiator(rev2.clone(), &pd[..509], now).err(),
        Some(StartupError::PrivateDataTooLong { len: 509, max: 508 })
    );
    let ini = Startup::initiator(rev2.rev1(), &pd[..512], now);
    assert_eq!(
        ini.unwrap().poll_transmit().unwrap(),
        frame(REQ, C, 1, &pd[..512])
    );
    assert_eq!(
        Startup::initiator(rev2.rev1(), &pd, now).err(),
        Some(StartupError::PrivateDataTooLong { len: 513, max: 512 })
    );
    assert_eq!(
        TermCode::from(StartupError::PrivateDataTooLong { len: 513, max: 512 }),
        TermCode::MPA_LOCAL_CATASTROPHIC
    );
}

#[test]
fn private_data_limits_both_ways() {
    let now = t0();
    let big = [0xa5u8; 513];
    for (icfg, max) in [
        (StartupConfig::default(), 508),
        (StartupConfig::default().rev1(), 512),
    ] {
        for reject in [false, true] {
            // The largest Private Data the Request can carry.
            let mut ini_big = Startup::initiator(icfg.clone(), &big[..max], now).unwrap();
            let request = ini_big.poll_transmit().unwrap();
            assert_eq!(request.len(), 532);
            let mut rsp = Startup::responder(StartupConfig::default(), now);
            assert_eq!(feed(&mut rsp, now, &request, 1), 532);
            match rsp.poll_event() {
                Some(StartupEvent::Request { private_data, .. }) => {
                    assert_eq!(private_data, &big[..max])
                }
                other => panic!("{other:?}"),
            }
            let answer = |rsp: &mut Startup, pd: &[u8]| {
                if reject {
                    rsp.reject(pd)
                } else {
                    rsp.accept(pd)
                }
            };
            // One octet too many: refused, nothing sent, still deciding.
            assert_eq!(
                answer(&mut rsp, &big[..max + 1]),
                Err(StartupError::PrivateDataTooLong { len: max + 1, max })
            );
            assert_eq!(rsp.state(), State::ExaminingRequest);
            assert_eq!(rsp.poll_transmit(), None);
            assert_eq!(rsp.poll_event(), None);
            assert_eq!(answer(&mut rsp, &big[..max]), Ok(()));
            let reply = rsp.poll_transmit().unwrap();
            assert_eq!(reply.len(), 532);
            assert_eq!(reply[16] & R != 0, reject);
            assert_eq!(feed(&mut ini_big, now, &reply, 1), 532);
            match ini_big.poll_event() {
                Some(StartupEvent::Established(n)) => {
                    assert!(!reject);
                    assert_eq!(n.peer_private_data, &big[..max]);
                }
                Some(StartupEvent::Rejected { private_data, .. }) => {
                    assert!(reject);
                    assert_eq!(private_data, &big[..max]);
                }
                other => panic!("{other:?}"),
            }
        }
    }
}

fn failed(code: TermCode) -> Vec<StartupEvent> {
    vec![StartupEvent::Failed {
        code,
        send_terminate: false,
    }]
}

#[test]
fn pd_length_above_512_fails_on_the_header() {
    let now = t0();
    let mut bad = frame(REQ, C, 1, &[0u8; 600]);
    bad[18..20].copy_from_slice(&513u16.to_be_bytes());
    for chunk in ALL_SIZES {
        let mut rsp = Startup::responder(StartupConfig::default(), now);
        // Fails on the 20th octet, without waiting for the Private Data.
        assert_eq!(feed(&mut rsp, now, &bad, chunk), 20);
        assert_eq!(events(&mut rsp), failed(TermCode::MPA_INVALID_FRAME));
        assert_eq!(
            rsp.failure(),
            Some(FailureReason::InvalidFrame(WireError::PrivateDataTooLong))
        );
        assert_eq!(rsp.poll_transmit(), None);
        // The same at the initiator.
        let mut ini = initiator(StartupConfig::default(), b"", now);
        let mut bad = bad.clone();
        bad[..16].copy_from_slice(REP);
        assert_eq!(feed(&mut ini, now, &bad, chunk), 20);
        assert_eq!(events(&mut ini), failed(TermCode::MPA_INVALID_FRAME));
    }
}

#[test]
fn bad_keys() {
    let now = t0();
    // A non-MPA peer: caught on its first octet.
    let mut rsp = Startup::responder(StartupConfig::default(), now);
    assert_eq!(rsp.handle_input(now, b"GET / HTTP/1.1\r\n\r\n"), 1);
    assert_eq!(events(&mut rsp), failed(TermCode::MPA_INVALID_FRAME));
    assert_eq!(
        rsp.failure(),
        Some(FailureReason::InvalidFrame(WireError::BadKey))
    );
    // A key wrong in its last octet.
    for chunk in ALL_SIZES {
        let mut key = *REQ;
        key[15] = b'E';
        let mut rsp = Startup::responder(StartupConfig::default(), now);
        assert_eq!(feed(&mut rsp, now, &frame(&key, C, 1, b""), chunk), 16);
        assert_eq!(events(&mut rsp), failed(TermCode::MPA_INVALID_FRAME));
        let mut ini = initiator(StartupConfig::default(), b"", now);
        let mut key = *REP;
        key[0] = b'm';
        assert_eq!(feed(&mut ini, now, &frame(&key, C, 1, b""), chunk), 1);
        assert_eq!(
            ini.failure(),
            Some(FailureReason::InvalidFrame(WireError::BadKey))
        );
    }
}

#[test]
fn initiator_initiator_detected() {
    let now = t0();
    for chunk in ALL_SIZES {
        let mut a = initiator_unsent(StartupConfig::default(), now);
        let mut b = initiator_unsent(StartupConfig::default(), now);
        let from_b = b.poll_transmit().unwrap();
        let _ = a.poll_transmit();
        // "MPA ID Re" is common; the tenth octet ('q') tells.
        assert_eq!(feed(&mut a, now, &from_b, chunk), 10);
        assert_eq!(events(&mut a), failed(TermCode::MPA_INVALID_FRAME));
        assert_eq!(a.failure(), Some(FailureReason::InitiatorInitiator));
        assert_eq!(a.state(), State::Failed);
    }
    // A responder handed a Reply: the wrong Key for it.
    let mut rsp = Startup::responder(StartupConfig::default(), now);
    assert_eq!(rsp.handle_input(now, &frame(REP, C, 1, b"")), 10);
    assert_eq!(events(&mut rsp), failed(TermCode::MPA_INVALID_FRAME));
    assert_eq!(rsp.failure(), Some(FailureReason::UnexpectedReply));
}

#[test]
fn bad_rev() {
    let now = t0();
    for rev in [0u8, 3, 0xff] {
        for chunk in ALL_SIZES {
            let mut rsp = Startup::responder(StartupConfig::default(), now);
            assert_eq!(feed(&mut rsp, now, &frame(REQ, C, rev, b"abc"), chunk), 18);
            assert_eq!(events(&mut rsp), failed(TermCode::MPA_INVALID_FRAME));
            assert_eq!(rsp.failure(), Some(FailureReason::UnsupportedRev(rev)));
            assert_eq!(rsp.poll_transmit(), None);

            let mut ini = initiator(StartupConfig::default(), b"", now);
            assert_eq!(feed(&mut ini, now, &frame(REP, C, rev, b""), chunk), 18);
            assert_eq!(ini.failure(), Some(FailureReason::UnsupportedRev(rev)));
        }
    }
    // A Rev-1-only responder refuses Rev 2 ...
    let mut rsp = Startup::responder(StartupConfig::default().rev1(), now);
    rsp.handle_input(
        now,
        &frame(REQ, C | S, 2, &enh(false, RtrSet::NONE, 1, 1, b"")),
    );
    assert_eq!(rsp.failure(), Some(FailureReason::UnsupportedRev(2)));
    // ... and a Rev 2 one takes Rev 1, replying Rev 1 (RFC 6581 §6, §10).
    let r = run(
        StartupConfig::default().rev1(),
        b"ini",
        StartupConfig::default(),
        Decision::Accept(b"rsp"),
        1,
    );
    assert_eq!(r.reply.unwrap(), frame(REP, C, 1, b"rsp"));
}

#[test]
fn malformed_enhanced_data() {
    let now = t0();
    // S with fewer than 4 octets of Private Data.
    let mut rsp = Startup::responder(StartupConfig::default(), now);
    let bad = frame(REQ, C | S, 2, b"abc");
    assert_eq!(rsp.handle_input(now, &bad), bad.len());
    assert_eq!(events(&mut rsp), failed(TermCode::MPA_INVALID_FRAME));
    assert_eq!(
        rsp.failure(),
        Some(FailureReason::InvalidFrame(WireError::EnhancedDataMissing))
    );
    // In a Rev 1 frame the S bit is Res, not checked: the 3 octets are
    // the ULP's and the Reply is plain.
    let mut rsp = Startup::responder(StartupConfig::default(), now);
    rsp.handle_input(now, &frame(REQ, C | S | 0x0f, 1, b"abc"));
    assert_eq!(
        events(&mut rsp),
        [StartupEvent::Request {
            rev: 1,
            private_data: b"abc".to_vec(),
            peer_ird: NO_NEG,
            peer_ord: NO_NEG
        }]
    );
    rsp.accept(b"").unwrap();
    assert_eq!(rsp.poll_transmit().unwrap(), frame(REP, C, 1, b""));
}

#[test]
fn rev2_request_without_s() {
    // Rev 2 with S=0: unenhanced, so the Reply is unenhanced (RFC 6581 §10)
    // and keeps the Request's Rev.
    let now = t0();
    let mut rsp = Startup::responder(StartupConfig::default(), now);
    rsp.handle_input(now, &frame(REQ, 0, 2, b"x"));
    assert!(matches!(
        rsp.poll_event(),
        Some(StartupEvent::Request { rev: 2, .. })
    ));
    rsp.accept(b"y").unwrap();
    assert_eq!(rsp.poll_transmit().unwrap(), frame(REP, C, 2, b"y"));
    match rsp.poll_event() {
        Some(StartupEvent::Established(n)) => {
            assert_eq!(
                (n.rev, n.rtr, n.peer_ird, n.peer_ord),
                (2, None, NO_NEG, NO_NEG)
            );
            assert!(n.crc);
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn reply_s_must_match_request_s() {
    let now = t0();
    // Enhanced Request, unenhanced Reply (Rev 2 S=0, or Rev 1 with the S
    // bit, which is Res there): code 4, close.
    for reply in [
        frame(REP, C, 2, b""),
        frame(REP, C | S, 1, &enh(true, RtrSet::ALL, 1, 1, b"")),
    ] {
        let mut ini = initiator(StartupConfig::default(), b"", now);
        assert_eq!(ini.handle_input(now, &reply), reply.len());
        assert_eq!(events(&mut ini), failed(TermCode::MPA_INVALID_FRAME));
        assert_eq!(
            ini.failure(),
            Some(FailureReason::EnhancedMismatch {
                sent: true,
                received: false
            })
        );
        assert!(ini.negotiated().is_none());
    }
    // Unenhanced Request, enhanced Reply.
    let mut ini = initiator(StartupConfig::default().rev1(), b"", now);
    ini.handle_input(
        now,
        &frame(REP, C | S, 2, &enh(true, RtrSet::ALL, 1, 1, b"")),
    );
    assert_eq!(
        ini.failure(),
        Some(FailureReason::EnhancedMismatch {
            sent: false,
            received: true
        })
    );
    // Unenhanced Request, Rev 2 Reply without S: fine.
    let mut ini = initiator(StartupConfig::default().rev1(), b"", now);
    ini.handle_input(now, &frame(REP, 0, 2, b"ok"));
    match ini.poll_event() {
        Some(StartupEvent::Established(n)) => {
            assert_eq!((n.rev, n.crc, n.rtr), (2, true, None));
            assert_eq!(n.peer_private_data, b"ok");
        }
        other => panic!("{other:?}"),
    }
    // A reject without S still rejects (TCP left open), IRD/ORD unknown.
    let mut ini = initiator(StartupConfig::default(), b"", now);
    ini.handle_input(now, &frame(REP, C | R, 1, b"no"));
    assert_eq!(
        events(&mut ini),
        [StartupEvent::Rejected {
            private_data: b"no".to_vec(),
            peer_ird: NO_NEG,
            peer_ord: NO_NEG
        }]
    );
}

#[test]
fn reply_a_must_echo_request_a() {
    let now = t0();
    // A=1 answered with A=0, and A=0 answered with A=1: code 7, Terminate.
    for (p2p, reply_a, flags) in [(true, false, RtrSet::NONE), (false, true, RtrSet::ALL)] {
        let mut ini = initiator(cfg_initiator(2, p2p, RtrSet::ALL), b"", now);
        let reply = frame(REP, C | S, 2, &enh(reply_a, flags, 16, 8, b""));
        assert_eq!(ini.handle_input(now, &reply), reply.len());
        assert_eq!(
            events(&mut ini),
            [StartupEvent::Failed {
                code: TermCode::MPA_NO_MATCHING_RTR,
                send_terminate: true
            }]
        );
        assert_eq!(
            ini.failure(),
            Some(FailureReason::ConnectionModelMismatch {
                sent: p2p,
                received: reply_a
            })
        );
        assert!(ini.negotiated().is_some());
    }
}

#[test]
fn fpdu_bytes_after_the_frame_are_left() {
    let now = t0();
    let fpdu = [0x00, 0x12, 0x41, 0x43, 0xde, 0xad];
    let mut ini = initiator_unsent(StartupConfig::default(), now);
    let mut rsp = Startup::responder(StartupConfig::default(), now);
    let mut stream = ini.poll_transmit().unwrap();
    let len = stream.len();
    stream.extend_from_slice(&fpdu);
    assert_eq!(rsp.handle_input(now, &stream), len);
    // Still deciding: nothing more is taken.
    assert_eq!(rsp.handle_input(now, &fpdu), 0);
    rsp.accept(b"").unwrap();
    let mut stream = rsp.poll_transmit().unwrap();
    let len = stream.len();
    stream.extend_from_slice(&fpdu);
    // Byte by byte up to the last header octet, then the rest in one go.
    for (k, b) in stream[..19].iter().enumerate() {
        assert_eq!(
            ini.handle_input(now, std::slice::from_ref(b)),
            1,
            "octet {k}"
        );
    }
    assert_eq!(ini.handle_input(now, &stream[19..]), len - 19);
    assert!(matches!(
        ini.poll_event(),
        Some(StartupEvent::Established(_))
    ));
    assert_eq!(ini.handle_input(now, &fpdu), 0);
    assert_eq!(ini.state(), State::FullOperation);
}

#[test]
fn reject_leaves_tcp_open() {
    let now = t0();
    for (icfg, reply) in [
        (
            StartupConfig::default(),
            frame(
                REP,
                C | R | S,
                2,
                &enh(true, RtrSet::only(Rtr::Write), 16, 16, b"no"),
            ),
        ),
        (StartupConfig::default().rev1(), frame(REP, C | R, 1, b"no")),
    ] {
        for chunk in ALL_SIZES {
            let mut ini = initiator_unsent(icfg.clone(), now);
            let mut rsp = Startup::responder(StartupConfig::default(), now);
            let request = ini.poll_transmit().unwrap();
            feed(&mut rsp, now, &request, chunk);
            let Some(StartupEvent::Request {
                peer_ird, peer_ord, ..
            }) = rsp.poll_event()
            else {
                panic!()
            };
            rsp.reject(b"no").unwrap();
            assert_eq!(rsp.poll_transmit().unwrap(), reply);
            assert_eq!(rsp.poll_transmit(), None);
            // RFC 5044 §7.1.2 rule 2: "exit MPA, leaving the TCP connection
            // open" — Rejected, never Failed.
            assert_eq!(
                events(&mut rsp),
                [StartupEvent::Rejected {
                    private_data: vec![],
                    peer_ird,
                    peer_ord
                }]
            );
            let mut stream = reply.clone();
            stream.extend_from_slice(b"plain TCP from here");
            assert_eq!(feed(&mut ini, now, &stream, chunk), reply.len());
            let (pi, po) = if icfg.rev == 2 {
                (16, 16)
            } else {
                (NO_NEG, NO_NEG)
            };
            assert_eq!(
                events(&mut ini),
                [StartupEvent::Rejected {
                    private_data: b"no".to_vec(),
                    peer_ird: pi,
                    peer_ord: po
                }]
            );
            for s in [&mut ini, &mut rsp] {
                assert_eq!(s.state(), State::Rejected);
                assert!(s.is_finished() && s.failure().is_none() && s.negotiated().is_none());
                assert_eq!(s.poll_timeout(), None);
                // The stream now belongs to the ULP; MPA takes nothing,
                // and neither a late timer nor a close turns into Failed.
                assert_eq!(s.handle_input(now, b"more"), 0);
                s.handle_timeout(now + Duration::from_secs(3600));
                s.handle_close(now);
                assert_eq!(s.poll_event(), None);
                assert_eq!(
                    s.accept(b""),
                    Err(StartupError::InvalidState(State::Rejected))
                );
            }
            assert!(ini.retry_with_rev1(now).is_none());
        }
    }
}

#[test]
fn timeouts_with_virtual_time() {
    let now = t0();
    let five = Duration::from_secs(5);
    let just_before = now + five - Duration::from_nanos(1);

    // Initiator waiting for the Reply.
    let mut ini = initiator_unsent(StartupConfig::default(), now);
    assert_eq!(ini.poll_timeout(), Some(now + five));
    ini.handle_timeout(just_before);
    assert_eq!(ini.poll_event(), None);
    assert_eq!(ini.state(), State::WaitingForReply);
    ini.handle_timeout(now + five);
    assert_eq!(events(&mut ini), failed(TermCode::MPA_CONNECTION_LOST));
    assert_eq!(ini.failure(), Some(FailureReason::Timeout));
    assert_eq!(ini.poll_timeout(), None);
    // The unsent Request is dropped; a timeout is no reason to retry Rev 1.
    assert_eq!(ini.poll_transmit(), None);
    assert!(ini.retry_with_rev1(now).is_none());

    // Responder waiting for the Request (Responder/Responder, rule 8), with
    // a custom timeout; input at the deadline fires the timer first.
    let cfg = StartupConfig {
        timeout: Duration::from_millis(250),
        ..StartupConfig::default()
    };
    let mut rsp = Startup::responder(cfg.clone(), now);
    assert_eq!(rsp.poll_timeout(), Some(now + Duration::from_millis(250)));
    let request = initiator_unsent(StartupConfig::default(), now)
        .poll_transmit()
        .unwrap();
    assert_eq!(
        rsp.handle_input(now + Duration::from_millis(250), &request),
        0
    );
    assert_eq!(events(&mut rsp), failed(TermCode::MPA_CONNECTION_LOST));

    // Responder whose Consumer never decides.
    let mut rsp = Startup::responder(cfg, now);
    rsp.handle_input(now + Duration::from_millis(100), &request);
    assert!(matches!(
        rsp.poll_event(),
        Some(StartupEvent::Request { .. })
    ));
    assert_eq!(rsp.poll_timeout(), Some(now + Duration::from_millis(250)));
    rsp.handle_timeout(now + Duration::from_secs(1));
    assert_eq!(events(&mut rsp), failed(TermCode::MPA_CONNECTION_LOST));
    assert_eq!(
        rsp.accept(b""),
        Err(StartupError::InvalidState(State::Failed))
    );
    assert_eq!(rsp.poll_transmit(), None);

    // Once established, no timer.
    let r = run(
        StartupConfig::default(),
        b"",
        StartupConfig::default(),
        Decision::Accept(b""),
        usize::MAX,
    );
    assert!(matches!(r.initiator[..], [StartupEvent::Established(_)]));
    let mut ini = initiator_unsent(StartupConfig::default(), now);
    let mut rsp = Startup::responder(StartupConfig::default(), now);
    rsp.handle_input(now, &ini.poll_transmit().unwrap());
    rsp.accept(b"").unwrap();
    ini.handle_input(now, &rsp.poll_transmit().unwrap());
    for s in [&mut ini, &mut rsp] {
        assert_eq!(s.poll_timeout(), None);
        s.handle_timeout(now + Duration::from_secs(60));
        assert!(matches!(
            events(s).last(),
            Some(StartupEvent::Established(_))
        ));
        assert_eq!(s.state(), State::FullOperation);
    }
    // A timeout too large for Instant means none, not a panic.
    let never = StartupConfig {
        timeout: Duration::MAX,
        ..StartupConfig::default()
    };
    assert_eq!(Startup::responder(never, now).poll_timeout(), None);
}

#[test]
fn connection_closed_during_startup() {
    let now = t0();
    let mut rsp = Startup::responder(StartupConfig::default(), now);
    rsp.handle_input(now, &REQ[..5]);
    rsp.handle_close(now);
    assert_eq!(events(&mut rsp), failed(TermCode::MPA_CONNECTION_LOST));
    assert_eq!(rsp.failure(), Some(FailureReason::ConnectionClosed));
    assert!(rsp.retry_with_rev1(now).is_none());

    // Part of a Reply arrived: the peer speaks MPA, no Rev 1 retry.
    let mut ini = initiator(StartupConfig::default(), b"", now);
    ini.handle_input(now, &REP[..3]);
    ini.handle_close(now);
    assert!(ini.retry_with_rev1(now).is_none());
    // A Rev 1 initiator has nothing to fall back to.
    let mut ini = initiator(StartupConfig::default().rev1(), b"", now);
    ini.handle_close(now);
    assert!(ini.retry_with_rev1(now).is_none());
    // A Rev 2 one closed before any Reply octet: retry with Rev 1, the same
    // Private Data, IRD/ORD and CRC/Markers settings.
    let cfg = StartupConfig {
        markers: true,
        ..StartupConfig::default()
    };
    let mut ini = initiator(cfg, b"hello", now);
    ini.handle_close(now);
    let mut again = ini.retry_with_rev1(now).unwrap();
    assert_eq!(again.config().rev, 1);
    assert_eq!(
        again.poll_transmit().unwrap(),
        frame(REQ, M | C, 1, b"hello")
    );
}

#[test]
fn invalid_configs() {
    let now = t0();
    let bad = StartupConfig {
        rev: 3,
        ..StartupConfig::default()
    };
    assert!(matches!(
        Startup::initiator(bad.clone(), b"", now),
        Err(StartupError::InvalidConfig(_))
    ));
    let mut rsp = Startup::responder(bad, now);
    assert_eq!(events(&mut rsp), failed(TermCode::MPA_LOCAL_CATASTROPHIC));
    assert!(matches!(
        rsp.failure(),
        Some(FailureReason::InvalidConfig(_))
    ));
    assert_eq!(rsp.handle_input(now, REQ), 0);
    // An enhanced responder must support an RTR (RFC 6581 §9.2).
    let mut rsp = Startup::responder(
        StartupConfig {
            rtr: RtrSet::NONE,
            ..StartupConfig::default()
        },
        now,
    );
    assert_eq!(events(&mut rsp), failed(TermCode::MPA_LOCAL_CATASTROPHIC));
    // accept/reject before any Request.
    let mut rsp = Startup::responder(StartupConfig::default(), now);
    assert_eq!(
        rsp.accept(b""),
        Err(StartupError::InvalidState(State::WaitingForRequest))
    );
    assert_eq!(
        rsp.reject(b""),
        Err(StartupError::InvalidState(State::WaitingForRequest))
    );
    let mut ini = initiator(StartupConfig::default(), b"", now);
    assert_eq!(
        ini.accept(b""),
        Err(StartupError::InvalidState(State::WaitingForReply))
    );
    assert_eq!(ini.role(), Role::Initiator);
    assert_eq!(rsp.role(), Role::Responder);
}

#[test]
fn failed_stays_failed() {
    let now = t0();
    let mut rsp = Startup::responder(StartupConfig::default(), now);
    rsp.handle_input(now, b"X");
    assert_eq!(events(&mut rsp).len(), 1);
    let good = initiator_unsent(StartupConfig::default(), now)
        .poll_transmit()
        .unwrap();
    assert_eq!(rsp.handle_input(now, &good), 0);
    rsp.handle_timeout(now + Duration::from_secs(10));
    rsp.handle_close(now);
    assert_eq!(rsp.poll_event(), None);
    assert_eq!(rsp.state(), State::Failed);
}
