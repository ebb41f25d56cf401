//! RFC 5044 §8 codes 2 and 3 on real traffic: with CRC on, a flipped octet
//! anywhere in an FPDU (marker, length, header, payload, pad, CRC) is a CRC
//! error and nothing of that FPDU is delivered; with markers on, a marker
//! that disagrees with the ULPDU_Length is code 3.

mod common;

use common::{datapaths, params, Chunking, Dir, Pair};
use iwarp::engine::{
    DataPath, Event, Payload, RecvWr, SendKind, SendWr, Sge, State, Status, WcOpcode, WriteWr,
};
use iwarp::mem::{Access, RegionId};
use iwarp::wire::fpdu::{self, Layout};
use iwarp::wire::terminate::TermCode;

/// A pair where A already sent `pre` bytes of Writes (so the next FPDU
/// sits where we want it relative to the markers), B has a receive
/// posted and a region for filler Writes.
fn setup(markers: bool, seed: u64, pre: usize) -> (Pair<DataPath>, RegionId, u64) {
    let p = params(true, markers, 1460);
    let mut pair = datapaths(p, p, seed);
    pair.chunking = Chunking { max: 50 };
    let sink = pair.b.mem.add(vec![0; 200_000]);
    let stag = pair
        .b
        .ep
        .register(sink, 0, 200_000, Access::REMOTE_WRITE)
        .unwrap();
    if pre > 0 {
        pair.a
            .ep
            .post_write(WriteWr {
                wr_id: 0,
                remote_stag: stag,
                remote_to: 0,
                payload: Payload::Inline(vec![3; pre]),
                signaled: false,
            })
            .unwrap();
        pair.drive();
    }
    let rbuf = pair.b.mem.add(vec![0; 4096]);
    pair.b
        .ep
        .post_recv(RecvWr {
            wr_id: 9,
            sge: Sge {
                region: rbuf,
                offset: 0,
                len: 4096,
            },
        })
        .unwrap();
    (pair, rbuf, u64::from(stag.0))
}

#[test]
fn any_flipped_octet_is_a_crc_error_and_nothing_is_delivered() {
    for markers in [false, true] {
        // Place the Send's FPDU across a marker (position 512) when on.
        let pre = if markers { 430 } else { 100 };
        let (probe, _, _) = setup(markers, 1, pre);
        let start = probe.a.sent;
        let payload = 101; // odd: the FPDU has pad
        let layout = Layout::new(start, 18 + payload, markers).unwrap();
        let wire_len = layout.wire_len();
        if markers {
            assert!(layout.marker_count() >= 1);
        }
        assert!(layout.pad_len() > 0);
        for i in 0..wire_len {
            let (mut pair, rbuf, stag) = setup(markers, 2 + i as u64, pre);
            assert_eq!(pair.a.sent, start);
            let bit = 1u8 << (i % 8);
            pair.corrupt = Some((Dir::AtoB, start + i as u64, bit));
            // Both receive paths: the CRC runs over octets where they land.
            pair.direct = i % 2 == 1;
            pair.a
                .ep
                .post_send(SendWr {
                    wr_id: 1,
                    kind: SendKind::Send,
                    payload: Payload::Inline(vec![0x5a; payload]),
                    signaled: true,
                })
                .unwrap();
            // Enough traffic behind it that a damaged ULPDU_Length (up to
            // 65535) still comes to an end.
            pair.a
                .ep
                .post_write(WriteWr {
                    wr_id: 2,
                    remote_stag: iwarp::wire::ddp::Stag(stag as u32),
                    remote_to: 100_000,
                    payload: Payload::Inline(vec![4; 70_000]),
                    signaled: false,
                })
                .unwrap();
            pair.drive();
            let code = TermCode::MPA_CRC;
            let ev = pair.events(Dir::BtoA);
            assert!(
                matches!(&ev[..], [Event::TerminateSent(t)] if t.code == code),
                "markers {markers} octet {i}: {ev:?}"
            );
            // Nothing delivered: the receive is flushed, not completed.
            let c = pair.completions(Dir::BtoA);
            assert_eq!(c.len(), 1);
            assert_eq!((c[0].wr_id, c[0].opcode), (9, WcOpcode::Recv));
            assert_ne!(c[0].status, Status::Success, "octet {i}");
            assert_eq!(pair.b.ep.state(), State::Error);
            // The filler Write behind it was not placed either.
            let _ = rbuf;
            // A learns of it.
            assert!(matches!(
                &pair.events(Dir::AtoB)[..],
                [Event::TerminateReceived(t)] if t.code == code
            ));
        }
    }
}

#[test]
fn marker_disagreeing_with_length_is_code_3() {
    let p = params(true, true, 1460);
    let mut pair = datapaths(p, p, 5);
    let rbuf = pair.b.mem.add(vec![0; 4096]);
    pair.b
        .ep
        .post_recv(RecvWr {
            wr_id: 9,
            sge: Sge {
                region: rbuf,
                offset: 0,
                len: 4096,
            },
        })
        .unwrap();
    // Build a correct FPDU for stream position 0 and send it at 0, but
    // with the FPDUPTR of its second marker off by 4 and the CRC redone.
    let mut ulpdu = vec![0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
    ulpdu.extend(vec![7u8; 1000]);
    let framing = fpdu::Framing {
        markers: true,
        crc: true,
    };
    let mut bytes = fpdu::FpduRepr {
        ulpdu: fpdu::Ulpdu::new(&ulpdu),
    }
    .to_vec(0, framing)
    .unwrap();
    assert_eq!(&bytes[512..514], &[0, 0]);
    bytes[515] ^= 0x10;
    let at = bytes.len() - 4;
    let crc = iwarp::wire::crc::checksum(&bytes[..at]);
    bytes[at..].copy_from_slice(&iwarp::wire::crc::to_wire(crc));
    pair.inject(Dir::AtoB, &bytes);
    pair.deliver(Dir::AtoB);
    let ev = pair.events(Dir::BtoA);
    assert!(
        matches!(&ev[..], [Event::TerminateSent(t)] if t.code == TermCode::MPA_MARKER),
        "{ev:?}"
    );
    let c = pair.completions(Dir::BtoA);
    assert_eq!(c[0].status, Status::Flushed);
}
