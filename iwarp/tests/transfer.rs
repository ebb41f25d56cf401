//! Every RDMAP operation between two data paths in memory, data checked
//! byte for byte, for sizes around MULPDU, 1 MiB and 64 MiB, with the
//! stream cut into random chunks down to 1 byte, with and without markers
//! and CRC, through both receive paths.

mod common;

use common::{conn_config, connected, datapaths, params, Chunking, Dir, Pair, Verbs};
use iwarp::engine::{Payload, ReadWr, RecvWr, SendKind, SendWr, Sge, Status, WcOpcode, WriteWr};
use iwarp::mem::{Access, MrAttrs, Scope};
use iwarp::wire::ddp::Stag;
use iwarp::wire::fpdu;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Send,
    SendSe,
    SendInv,
    SendSeInv,
    Write,
    Read,
}

const OPS: [Op; 6] = [
    Op::Send,
    Op::SendSe,
    Op::SendInv,
    Op::SendSeInv,
    Op::Write,
    Op::Read,
];

/// Bytes around each copied range that must stay untouched.
const GUARD: usize = 16;
const FILL: u8 = 0xee;

/// Runs `op` of `len` bytes from A to B (for Read: A reads from B) and
/// checks data, completions and untouched neighbours.
fn run_op<E: Verbs>(pair: &mut Pair<E>, op: Op, len: usize) {
    let data = pair.rng.bytes(len);
    let wr_id = pair.rng.next_u64();
    match op {
        Op::Send | Op::SendSe | Op::SendInv | Op::SendSeInv => {
            let src = pair.a.mem.add(data.clone());
            let dst = pair.b.mem.add(vec![FILL; len + 2 * GUARD]);
            // An STag of B's for the peer to invalidate.
            let inv = pair
                .b
                .ep
                .register_with(
                    dst,
                    0,
                    8,
                    MrAttrs::new(pair.b.ep.dp().pd(), Access::REMOTE_WRITE)
                        .with_scope(Scope::Stream),
                )
                .unwrap();
            let kind = match op {
                Op::Send => SendKind::Send,
                Op::SendSe => SendKind::SendSe,
                Op::SendInv => SendKind::SendInvalidate(inv),
                _ => SendKind::SendSeInvalidate(inv),
            };
            pair.b
                .ep
                .post_recv(RecvWr {
                    wr_id: wr_id ^ 1,
                    sge: Sge {
                        region: dst,
                        offset: GUARD,
                        len: len + GUARD,
                    },
                })
                .unwrap();
            pair.a
                .ep
                .post_send(SendWr {
                    wr_id,
                    kind,
                    payload: Payload::region(src, 0, len),
                    signaled: true,
                })
                .unwrap();
            pair.drive();
            let ca = pair.completions(Dir::AtoB);
            assert_eq!(ca.len(), 1, "{op:?} {len}: {ca:?}");
            assert_eq!(
                (ca[0].wr_id, ca[0].opcode, ca[0].status, ca[0].byte_len),
                (wr_id, WcOpcode::Send, Status::Success, len as u32)
            );
            let cb = pair.completions(Dir::BtoA);
            assert_eq!(cb.len(), 1, "{op:?} {len}: {cb:?}");
            let c = cb[0];
            assert_eq!(
                (c.wr_id, c.opcode, c.status, c.byte_len),
                (wr_id ^ 1, WcOpcode::Recv, Status::Success, len as u32)
            );
            assert_eq!(c.solicited, matches!(op, Op::SendSe | Op::SendSeInv));
            let invalidates = matches!(op, Op::SendInv | Op::SendSeInv);
            assert_eq!(c.invalidated, invalidates.then_some(inv));
            assert_eq!(
                pair.b.ep.dp().registry().get(inv).unwrap().valid,
                !invalidates
            );
            let got = pair.b.mem.remove(dst).unwrap();
            check(&got, GUARD, &data, op);
            pair.a.mem.remove(src);
            pair.b.ep.deregister(inv).unwrap();
        }
        Op::Write => {
            let src = pair.a.mem.add(data.clone());
            let dst = pair.b.mem.add(vec![FILL; len + 2 * GUARD]);
            let base = 0x1000_0000_0000;
            let stag = pair
                .b
                .ep
                .register_with(
                    dst,
                    0,
                    (len + 2 * GUARD) as u64,
                    MrAttrs::new(pair.b.ep.dp().pd(), Access::REMOTE_WRITE).with_base_to(base),
                )
                .unwrap();
            pair.a
                .ep
                .post_write(WriteWr {
                    wr_id,
                    remote_stag: stag,
                    remote_to: base + GUARD as u64,
                    payload: Payload::region(src, 0, len),
                    signaled: true,
                })
                .unwrap();
            pair.drive();
            let ca = pair.completions(Dir::AtoB);
            assert_eq!(ca.len(), 1);
            assert_eq!(
                (ca[0].wr_id, ca[0].opcode, ca[0].status, ca[0].byte_len),
                (wr_id, WcOpcode::Write, Status::Success, len as u32)
            );
            // RFC 5040 §5.1: a Write is placed, never delivered.
            assert_eq!(pair.completions(Dir::BtoA), vec![]);
            let got = pair.b.mem.remove(dst).unwrap();
            check(&got, GUARD, &data, op);
            pair.a.mem.remove(src);
            pair.b.ep.deregister(stag).unwrap();
        }
        Op::Read => {
            let src = pair.b.mem.add(data.clone());
            let src_stag = pair
                .b
                .ep
                .register(src, 0, len as u64, Access::REMOTE_READ)
                .unwrap();
            let sink = pair.a.mem.add(vec![FILL; len + 2 * GUARD]);
            let sink_stag = pair
                .a
                .ep
                .register(sink, 0, (len + 2 * GUARD) as u64, Access::LOCAL_WRITE)
                .unwrap();
            pair.a
                .ep
                .post_read(ReadWr {
                    wr_id,
                    local_stag: sink_stag,
                    local_to: GUARD as u64,
                    remote_stag: src_stag,
                    remote_to: 0,
                    len: len as u32,
                    signaled: true,
                })
                .unwrap();
            pair.drive();
            let ca = pair.completions(Dir::AtoB);
            assert_eq!(ca.len(), 1, "{ca:?}");
            assert_eq!(
                (ca[0].wr_id, ca[0].opcode, ca[0].status, ca[0].byte_len),
                (wr_id, WcOpcode::Read, Status::Success, len as u32)
            );
            assert_eq!(pair.completions(Dir::BtoA), vec![]);
            let got = pair.a.mem.remove(sink).unwrap();
            check(&got, GUARD, &data, op);
            pair.b.mem.remove(src);
            pair.a.ep.deregister(sink_stag).unwrap();
            pair.b.ep.deregister(src_stag).unwrap();
        }
    }
    assert_eq!(pair.events(Dir::AtoB), vec![]);
    assert_eq!(pair.events(Dir::BtoA), vec![]);
}

/// `got[at..at + want.len()] == want`, and the guard bytes around it
/// untouched.
fn check(got: &[u8], at: usize, want: &[u8], op: Op) {
    let end = at + want.len();
    if got[at..end] != *want {
        let i = got[at..end]
            .iter()
            .zip(want)
            .position(|(a, b)| a != b)
            .unwrap();
        panic!("{op:?} of {} bytes differs at {i}", want.len());
    }
    assert!(got[..at].iter().all(|&b| b == FILL), "{op:?}: bytes before");
    assert!(
        got[end..end + GUARD].iter().all(|&b| b == FILL),
        "{op:?}: bytes after"
    );
}

/// The sizes of acceptance item 1 for a MULPDU, plus the payload limits of
/// one untagged (18-byte header) and one tagged (14-byte) segment.
fn sizes(mulpdu: usize) -> Vec<usize> {
    let mut v = vec![
        0,
        1,
        mulpdu - 1,
        mulpdu,
        mulpdu + 1,
        mulpdu - 18,
        mulpdu - 18 + 1,
        mulpdu - 14,
        mulpdu - 14 + 1,
        1 << 20,
    ];
    v.sort();
    v.dedup();
    v
}

const FRAMINGS: [(bool, bool); 4] = [(true, false), (true, true), (false, false), (false, true)];

/// All operations, all sizes up to 1 MiB, all framings, both receive
/// paths, EMSS of an Ethernet MSS.
#[test]
fn every_operation_every_size_every_framing() {
    for (i, (crc, markers)) in FRAMINGS.into_iter().enumerate() {
        for direct in [false, true] {
            let seed = 100 + i as u64 * 2 + u64::from(direct);
            let p = params(crc, markers, 1460);
            let mut pair = datapaths(p, p, seed);
            pair.direct = direct;
            pair.chunking = Chunking { max: 3000 };
            let mulpdu = pair.a.ep.mulpdu();
            assert_eq!(mulpdu, fpdu::mulpdu(1460, markers));
            for len in sizes(mulpdu) {
                for op in OPS {
                    run_op(&mut pair, op, len);
                }
            }
            // The direct path received payload in place; the copying one
            // never did.
            assert_eq!(pair.a.placed > 0 && pair.b.placed > 0, direct);
        }
    }
}

/// Around the loopback MULPDU (EMSS 65483): FPDUs of 64 KiB.
#[test]
fn loopback_emss() {
    for (i, (crc, markers)) in FRAMINGS.into_iter().enumerate() {
        let p = params(crc, markers, 65483);
        let mut pair = datapaths(p, p, 200 + i as u64);
        pair.direct = i % 2 == 0;
        pair.chunking = Chunking { max: 100_000 };
        let mulpdu = pair.a.ep.mulpdu();
        assert_eq!(mulpdu, fpdu::mulpdu(65483, markers));
        for len in sizes(mulpdu) {
            for op in OPS {
                run_op(&mut pair, op, len);
            }
        }
    }
}

/// 64 MiB of every operation, every framing.
#[test]
fn sixty_four_mib() {
    for (i, (crc, markers)) in FRAMINGS.into_iter().enumerate() {
        let p = params(crc, markers, 65483);
        let mut pair = datapaths(p, p, 300 + i as u64);
        pair.direct = i % 2 == 0;
        // Chunks from 1 byte to 1 MiB.
        pair.chunking = Chunking { max: 1 << 20 };
        pair.budget = 4 << 20;
        for op in OPS {
            run_op(&mut pair, op, 64 << 20);
        }
        if pair.direct {
            // Nearly all of the 64 MiB Read Response landed in place.
            assert!(pair.a.placed > 60 << 20, "{}", pair.a.placed);
        }
    }
}

/// A gather list of several pieces, inline payload, and unsignaled work:
/// completions only for signaled work, all in order (RFC 5040 §5.5 rule
/// 15).
#[test]
fn gather_inline_unsignaled_and_order() {
    let p = params(true, true, 1460);
    let mut pair = datapaths(p, p, 7);
    let a = pair.a.mem.add((0..=255u8).cycle().take(5000).collect());
    let dst = pair.b.mem.add(vec![0; 8000]);
    for i in 0..3 {
        pair.b
            .ep
            .post_recv(RecvWr {
                wr_id: 10 + i,
                sge: Sge {
                    region: dst,
                    offset: 2000 * i as usize,
                    len: 2000,
                },
            })
            .unwrap();
    }
    let sink = pair.a.mem.add(vec![0; 100]);
    let sink_stag = pair
        .a
        .ep
        .register(sink, 0, 100, Access::LOCAL_WRITE)
        .unwrap();
    let src = pair.b.mem.add(vec![9; 100]);
    let src_stag = pair
        .b
        .ep
        .register(src, 0, 100, Access::REMOTE_READ)
        .unwrap();
    let gather = Payload::Sges(vec![
        Sge {
            region: a,
            offset: 10,
            len: 700,
        },
        Sge {
            region: a,
            offset: 4000,
            len: 0,
        },
        Sge {
            region: a,
            offset: 3000,
            len: 1200,
        },
    ]);
    let send = |wr_id, payload, signaled| SendWr {
        wr_id,
        kind: SendKind::Send,
        payload,
        signaled,
    };
    // A Read first: the Sends behind it complete after it (rule 15).
    pair.a
        .ep
        .post_read(ReadWr {
            wr_id: 1,
            local_stag: sink_stag,
            local_to: 0,
            remote_stag: src_stag,
            remote_to: 0,
            len: 100,
            signaled: true,
        })
        .unwrap();
    pair.a.ep.post_send(send(2, gather, true)).unwrap();
    pair.a
        .ep
        .post_send(send(3, Payload::Inline(b"inline".to_vec()), false))
        .unwrap();
    pair.a
        .ep
        .post_send(send(4, Payload::empty(), true))
        .unwrap();
    pair.drive();
    let ids: Vec<_> = pair
        .completions(Dir::AtoB)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        ids,
        vec![
            (1, Status::Success),
            (2, Status::Success),
            (4, Status::Success)
        ]
    );
    let rx: Vec<_> = pair
        .completions(Dir::BtoA)
        .iter()
        .map(|c| (c.wr_id, c.byte_len))
        .collect();
    assert_eq!(rx, vec![(10, 1900), (11, 6), (12, 0)]);
    let got = pair.b.mem.get(dst).unwrap();
    let src_bytes = pair.a.mem.get(a).unwrap();
    assert_eq!(&got[..700], &src_bytes[10..710]);
    assert_eq!(&got[700..1900], &src_bytes[3000..4200]);
    assert_eq!(&got[2000..2006], b"inline");
    assert_eq!(pair.a.mem.get(sink).unwrap(), &[9u8; 100][..]);
}

/// ORD limits Reads in flight; IRD at the peer is never exceeded, and all
/// Reads complete, in order.
#[test]
fn ord_queues_reads() {
    let mut pa = params(true, false, 1460);
    pa.ord = 2;
    let mut pb = pa;
    pb.ird = 2;
    let mut pair = datapaths(pa, pb, 11);
    let src = pair
        .b
        .mem
        .add((0..=255u8).cycle().take(64 * 1024).collect());
    let src_stag = pair
        .b
        .ep
        .register(src, 0, 64 * 1024, Access::REMOTE_READ)
        .unwrap();
    let sink = pair.a.mem.add(vec![0; 64 * 1024]);
    let sink_stag = pair
        .a
        .ep
        .register(sink, 0, 64 * 1024, Access::LOCAL_WRITE)
        .unwrap();
    for i in 0..16u64 {
        pair.a
            .ep
            .post_read(ReadWr {
                wr_id: i,
                local_stag: sink_stag,
                local_to: i * 4096,
                remote_stag: src_stag,
                remote_to: i * 4096,
                len: 4096,
                signaled: true,
            })
            .unwrap();
    }
    pair.drive();
    let ids: Vec<_> = pair
        .completions(Dir::AtoB)
        .iter()
        .map(|c| c.wr_id)
        .collect();
    assert_eq!(ids, (0..16).collect::<Vec<_>>());
    assert_eq!(pair.a.mem.get(sink), pair.b.mem.get(src));
    assert_eq!(pair.events(Dir::BtoA), vec![]);
}

/// Writes to the same tagged buffer then a Send: when the Send is
/// delivered, the Writes are placed (RFC 5040 §5.5 rule 10).
#[test]
fn write_then_send_delivery_order() {
    let p = params(true, false, 1460);
    let mut pair = datapaths(p, p, 12);
    let dst = pair.b.mem.add(vec![0; 10_000]);
    let stag = pair
        .b
        .ep
        .register(dst, 0, 10_000, Access::REMOTE_WRITE)
        .unwrap();
    let note = pair.b.mem.add(vec![0; 16]);
    pair.b
        .ep
        .post_recv(RecvWr {
            wr_id: 1,
            sge: Sge {
                region: note,
                offset: 0,
                len: 16,
            },
        })
        .unwrap();
    pair.a
        .ep
        .post_write(WriteWr {
            wr_id: 1,
            remote_stag: stag,
            remote_to: 0,
            payload: Payload::Inline(vec![1; 10_000]),
            signaled: false,
        })
        .unwrap();
    pair.a
        .ep
        .post_write(WriteWr {
            wr_id: 2,
            remote_stag: stag,
            remote_to: 5000,
            payload: Payload::Inline(vec![2; 100]),
            signaled: false,
        })
        .unwrap();
    pair.a
        .ep
        .post_send(SendWr {
            wr_id: 3,
            kind: SendKind::SendSe,
            payload: Payload::Inline(b"done".to_vec()),
            signaled: true,
        })
        .unwrap();
    // Deliver byte by byte and look at B after each byte: the receive
    // completes only once both Writes are placed.
    pair.chunking = Chunking { max: 1 };
    pair.transmit(Dir::AtoB, false);
    let inbox = pair.b.inbox().to_vec();
    let mut done_at = None;
    for (i, byte) in inbox.iter().enumerate() {
        pair.b.ep.handle_input(&[*byte], &mut pair.b.mem);
        if let Some(c) = pair.b.ep.poll_completion() {
            assert!(c.solicited);
            done_at = Some(i);
            let d = pair.b.mem.get(dst).unwrap();
            assert!(d[..5000].iter().all(|&b| b == 1));
            assert!(d[5000..5100].iter().all(|&b| b == 2));
        }
    }
    assert_eq!(done_at, Some(inbox.len() - 1));
    let _ = Stag(0);
}

/// The same through whole connections: MPA startup (markers and CRC as
/// both sides ask), RTR, then every operation around MULPDU and 1 MiB.
#[test]
fn through_connections() {
    for (i, (crc, markers)) in FRAMINGS.into_iter().enumerate() {
        let cfg = |seed| conn_config(crc, markers, 1460, seed);
        let mut pair = connected(cfg(1), cfg(2), 400 + i as u64);
        pair.direct = i % 2 == 1;
        pair.chunking = Chunking { max: 5000 };
        let mulpdu = pair.a.ep.datapath().mulpdu();
        assert_eq!(mulpdu, fpdu::mulpdu(1460, markers));
        for len in sizes(mulpdu) {
            for op in OPS {
                run_op(&mut pair, op, len);
                // And the other way round.
                core::mem::swap(&mut pair.a, &mut pair.b);
                run_op(&mut pair, op, len);
                core::mem::swap(&mut pair.a, &mut pair.b);
            }
        }
    }
}
