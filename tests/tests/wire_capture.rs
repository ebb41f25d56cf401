//! Our emitters, checked by an independent decoder: a capture of an MPA
//! Request/Reply exchange followed by FPDUs carrying each RDMAP message
//! (RTR Write, Send, RDMA Write, Read Request, Read Response, Terminate),
//! with and without markers, is decoded by tshark's `iwarp_mpa` and
//! `iwarp_ddp_rdmap` dissectors; the CRCs must check and every decoded field
//! must equal what we emitted.

use std::net::Ipv4Addr;

use iwarp::wire::ddp::{BufferModel, QueueNumber, Stag};
use iwarp::wire::fpdu::{FpduRepr, Framing, Ulpdu};
use iwarp::wire::mpa::{EnhancedRepr, FrameKind, FrameRepr, REV_2};
use iwarp::wire::rdmap::{Opcode, RdmapRepr, ReadRequestRepr};
use iwarp::wire::terminate::{TermCode, TerminateHeader, TerminateRepr, TerminatedDdp};
use sdp_tests::pcap::{Side, TcpConversation};
use sdp_tests::tshark;

/// One direction of the full operation phase: the FPDU stream position
/// that decides where markers fall (RFC 5044 §4.3).
struct Direction {
    side: Side,
    pos: u64,
    framing: Framing,
}

/// What we emitted, for comparison with what tshark decoded.
#[derive(Debug, Clone, PartialEq)]
struct Sent {
    ulpdu_len: usize,
    crc: u32,
    opcode: u8,
    tagged: bool,
    last: bool,
    /// STag and TO for tagged segments; QN, MSN and MO for untagged ones.
    model: Vec<u64>,
    /// FPDUPTR of each marker inside the FPDU, worked out from stream
    /// positions alone (RFC 5044 §4.3), independently of our emitter.
    fpduptrs: Vec<u64>,
}

struct Capture {
    conv: TcpConversation,
    client: Direction,
    server: Direction,
    sent: Vec<Sent>,
}

impl Capture {
    /// Writes the Request and Reply; `markers` sets M on both, so that both
    /// directions carry markers.
    fn new(markers: bool, port: u16) -> Capture {
        let mut conv = TcpConversation::new(
            (Ipv4Addr::new(192, 0, 2, 1), 40_000),
            (Ipv4Addr::new(192, 0, 2, 2), port),
        );
        let offer = EnhancedRepr {
            peer_to_peer: true,
            rtr_send: true,
            rtr_write: true,
            rtr_read: true,
            ird: 4,
            ord: 4,
        };
        let chosen = EnhancedRepr {
            rtr_send: false,
            rtr_read: false,
            ..offer
        };
        for (side, kind, enhanced, ulp) in [
            (
                Side::Client,
                FrameKind::Request,
                offer,
                &b"request private data"[..],
            ),
            (Side::Server, FrameKind::Reply, chosen, &b"reply"[..]),
        ] {
            let mut pd = enhanced.to_bytes().unwrap().to_vec();
            pd.extend_from_slice(ulp);
            let frame = FrameRepr {
                kind,
                markers,
                crc: true,
                rejected: false,
                enhanced: true,
                rev: REV_2,
                private_data: &pd,
            };
            conv.send(side, &frame.to_vec().unwrap());
        }
        let framing = Framing { markers, crc: true };
        Capture {
            conv,
            client: Direction {
                side: Side::Client,
                pos: 0,
                framing,
            },
            server: Direction {
                side: Side::Server,
                pos: 0,
                framing,
            },
            sent: Vec::new(),
        }
    }

    /// Emits one DDP segment (`header` then `payload`) as one FPDU.
    fn fpdu(&mut self, from: Side, header: RdmapRepr, payload: &[u8]) {
        let mut ulpdu = vec![0u8; header.buffer_len()];
        header.emit(&mut ulpdu);
        ulpdu.extend_from_slice(payload);
        let dir = match from {
            Side::Client => &mut self.client,
            Side::Server => &mut self.server,
        };
        let wire = FpduRepr {
            ulpdu: Ulpdu::new(&ulpdu),
        }
        .to_vec(dir.pos, dir.framing)
        .unwrap();
        let start = dir.pos;
        dir.pos += wire.len() as u64;
        let mut fpduptrs = Vec::new();
        if dir.framing.markers {
            // A marker at the FPDU's first octet precedes its header and
            // points at it with 0; any later one points back to the header.
            let header = if start % 512 == 0 { start + 4 } else { start };
            let mut marker = start.next_multiple_of(512);
            while marker < dir.pos {
                fpduptrs.push(marker.saturating_sub(header));
                marker += 512;
            }
        }
        self.conv.send(dir.side, &wire);
        let crc = u32::from_le_bytes(wire[wire.len() - 4..].try_into().unwrap());
        let (tagged, model) = match header.model {
            BufferModel::Tagged { stag, to } => (true, vec![u64::from(stag.0), to]),
            BufferModel::Untagged { qn, msn, mo, .. } => {
                (false, vec![u64::from(qn.0), u64::from(msn), u64::from(mo)])
            }
        };
        self.sent.push(Sent {
            ulpdu_len: ulpdu.len(),
            crc,
            opcode: header.opcode.0,
            tagged,
            last: header.last,
            model,
            fpduptrs,
        });
    }
}

fn untagged(opcode: Opcode, qn: QueueNumber, msn: u32) -> RdmapRepr {
    RdmapRepr {
        opcode,
        last: true,
        model: BufferModel::Untagged {
            qn,
            msn,
            mo: 0,
            rsvd_ulp32: 0,
        },
        read_request: None,
    }
}

fn tagged(opcode: Opcode, stag: u32, to: u64) -> RdmapRepr {
    RdmapRepr {
        opcode,
        last: true,
        model: BufferModel::Tagged {
            stag: Stag(stag),
            to,
        },
        read_request: None,
    }
}

/// A deterministic payload pattern, different for every message.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

/// The whole exchange: RTR, Send, RDMA Write (large enough to cross
/// several markers), Read Request, Read Response, Terminate.
fn exchange(markers: bool, port: u16) -> Capture {
    let mut cap = Capture::new(markers, port);
    // RFC 6581 §9.2: the initiator sends the RTR the Reply chose; a
    // zero-length tagged RTR carries a non-zero STag.
    cap.fpdu(
        Side::Client,
        tagged(Opcode::RDMA_WRITE, 0x0000_0101, 0),
        &[],
    );
    cap.fpdu(
        Side::Server,
        untagged(Opcode::SEND_SE, QueueNumber::SEND, 1),
        &pattern(37, 1),
    );
    cap.fpdu(
        Side::Client,
        tagged(Opcode::RDMA_WRITE, 0x1234_5601, 0x1000),
        &pattern(1500, 2),
    );
    let read = ReadRequestRepr {
        sink_stag: Stag(0x0000_2202),
        sink_to: 0x40,
        size: 700,
        src_stag: Stag(0x0000_3303),
        src_to: 0x80,
    };
    cap.fpdu(
        Side::Client,
        RdmapRepr {
            read_request: Some(read),
            ..untagged(Opcode::RDMA_READ_REQUEST, QueueNumber::READ_REQUEST, 1)
        },
        &[],
    );
    cap.fpdu(
        Side::Server,
        tagged(Opcode::RDMA_READ_RESPONSE, 0x0000_2202, 0x40),
        &pattern(700, 3),
    );
    // A DDP Tagged Buffer error echoing the offending tagged header
    // (RFC 5040 §4.8 Figure 10: DDP errors include the DDP header and
    // segment length).
    let mut offending = vec![0u8; 14];
    tagged(Opcode::RDMA_WRITE, 0x0000_4404, 0xffff_0000).emit(&mut offending);
    let term = TerminateRepr {
        code: TermCode::DDP_BASE_BOUNDS,
        ddp: Some(TerminatedDdp {
            segment_length: 1514,
            segment_length_valid: true,
            header: &offending,
        }),
        rdma_header: None,
    };
    let mut term_bytes = vec![0u8; term.buffer_len()];
    term.emit(&mut TerminateHeader::new_unchecked(&mut term_bytes[..]));
    cap.fpdu(
        Side::Server,
        untagged(Opcode::TERMINATE, QueueNumber::TERMINATE, 1),
        &term_bytes,
    );
    cap
}

const FPDU_FIELDS: [&str; 11] = [
    "iwarp_mpa.ulpdulength",
    "iwarp_mpa.crc_check",
    "iwarp_ddp.tagged_flag",
    "iwarp_ddp.last_flag",
    "iwarp_rdma.opcode",
    "iwarp_ddp.stag",
    "iwarp_ddp.tagged_offset",
    "iwarp_ddp.qn",
    "iwarp_ddp.msn",
    "iwarp_ddp.mo",
    "iwarp_mpa.marker_fpduptr",
];

fn number(field: &str) -> u64 {
    match field.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => field.parse(),
    }
    .unwrap_or_else(|_| panic!("not a number: {field:?}"))
}

fn one(frame: &[Vec<String>], i: usize) -> &str {
    match frame[i].as_slice() {
        [value] => value,
        other => panic!("field {} has {other:?}", FPDU_FIELDS[i]),
    }
}

fn check(markers: bool, port: u16) {
    let cap = exchange(markers, port);
    let sent = cap.sent.clone();
    let pcap = cap.conv.finish();

    // The Request and Reply as tshark reads them.
    let frames = tshark::decode(
        &pcap,
        "iwarp_mpa.req || iwarp_mpa.rep",
        &[
            "iwarp_mpa.marker_flag",
            "iwarp_mpa.crc_flag",
            "iwarp_mpa.rej_flag",
            "iwarp_mpa.rev",
            "iwarp_mpa.pdlength",
        ],
    );
    let m = if markers { "1" } else { "0" };
    let flat = |f: &Vec<Vec<String>>| f.iter().map(|v| v.join("|")).collect::<Vec<_>>();
    assert_eq!(
        frames.iter().map(flat).collect::<Vec<_>>(),
        vec![vec![m, "1", "0", "2", "24"], vec![m, "1", "0", "2", "9"]],
    );

    let frames = tshark::decode(&pcap, "iwarp_mpa.fpdu", &FPDU_FIELDS);
    assert_eq!(frames.len(), sent.len(), "every FPDU decoded as MPA");
    for (frame, sent) in frames.iter().zip(&sent) {
        assert_eq!(number(one(frame, 0)), sent.ulpdu_len as u64);
        // The dissector prints the CRC field as a big-endian word; it is
        // sent least significant octet first.
        assert_eq!(number(one(frame, 1)), u64::from(sent.crc.swap_bytes()));
        assert_eq!(one(frame, 2), if sent.tagged { "1" } else { "0" });
        assert_eq!(one(frame, 3), if sent.last { "1" } else { "0" });
        assert_eq!(number(one(frame, 4)), u64::from(sent.opcode));
        let model: Vec<u64> = if sent.tagged { 5..7 } else { 7..10 }
            .map(|i| number(one(frame, i)))
            .collect();
        assert_eq!(model, sent.model);
        let fpduptrs: Vec<u64> = frame[10].iter().map(|v| number(v)).collect();
        assert_eq!(fpduptrs, sent.fpduptrs);
    }
    if markers {
        assert!(sent.iter().any(|s| s.fpduptrs.len() >= 3));
        assert!(sent.iter().any(|s| s.fpduptrs.first() == Some(&0)));
    }

    // Every CRC is reported good.
    let text = tshark::verbose(&pcap, "iwarp_mpa");
    assert_eq!(text.matches("(Good CRC32)").count(), sent.len(), "{text}");
    assert!(!text.contains("Bad CRC32"), "{text}");

    // The Read Request and Terminate headers.
    let rr = tshark::decode(
        &pcap,
        "iwarp_rdma.rr",
        &[
            "iwarp_rdma.sinkstag",
            "iwarp_rdma.sinkto",
            "iwarp_rdma.rdmardsz",
            "iwarp_rdma.srcstag",
            "iwarp_rdma.srcto",
        ],
    );
    assert_eq!(
        rr.iter().map(flat).collect::<Vec<_>>(),
        vec![vec![
            "0x00002202",
            "0x0000000000000040",
            "700",
            "0x00003303",
            "0x0000000000000080"
        ]]
    );
    let term = tshark::decode(
        &pcap,
        "iwarp_rdma.terminate",
        &[
            "iwarp_rdma.term_layer",
            "iwarp_rdma.term_etype_ddp",
            "iwarp_rdma.term_errcode_ddp_tagged",
            "iwarp_rdma.term_hdrct_m",
            "iwarp_rdma.hdrct_d",
            "iwarp_rdma.hdrct_r",
            "iwarp_rdma.term_ddp_seg_len",
            "iwarp_rdma.term_ddp_h",
        ],
    );
    assert_eq!(
        term.iter().map(flat).collect::<Vec<_>>(),
        vec![vec![
            "0x01",
            "0x01",
            "0x01",
            "1",
            "1",
            "0",
            "05ea",
            "c1400000440400000000ffff0000"
        ]]
    );

    // Nothing malformed, and no warning beyond the two this RFC 5044-era
    // dissector gives every RFC 6581 frame (the S bit lives in its "Res",
    // and Rev is 2).
    for info in tshark::expert_infos(&pcap) {
        assert!(!info.contains("alformed"), "{info}");
        for message in info.split('\t').nth(2).unwrap_or("").split(',') {
            assert!(
                !message.contains("RFC 5044")
                    || message.contains("Res field")
                    || message.contains("Rev field"),
                "{info}"
            );
        }
    }
}

#[test]
fn tshark_decodes_fpdus_without_markers() {
    check(false, 19875);
}

#[test]
fn tshark_decodes_fpdus_with_markers() {
    check(true, 19876);
}
