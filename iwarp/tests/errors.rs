//! One negative test per DDP, RDMAP and MPA error code (RFC 5041 §7.2,
//! RFC 5040 §4.8 Figure 9, RFC 5044 §8, RFC 6581 §8): the receiver emits
//! a Terminate with exactly the expected Layer/EType/Code and header bits
//! (M/D/R per Figure 10, with the echoed headers), places nothing, and the
//! sender surfaces the Terminate as completion errors.
//!
//! Each test: A posts an RDMA Read of B (so that A has work outstanding),
//! then a crafted FPDU is put on the stream from A to B. B answers with
//! one Terminate FPDU, parsed here from the bytes B sends.
//!
//! Three entries of Figure 9 have no test because no check of RFC 5040
//! §7.2 or RFC 5041 §7.1 leads to them, so the engine never sends them:
//! Remote Protection "Unspecified" (0/1/FF: every protection fault has its
//! own code), Remote Operation "Catastrophic error, global" (0/2/08: one
//! connection's engine cannot fail the others) and Remote Operation "STag
//! cannot be Invalidated" (0/2/09: a refused invalidation is a protection
//! error, 0/1/09, as Figure 10 places Send with Invalidate there). When
//! received from a peer, they are handled like every other code.

mod common;

use common::{datapaths, params, Chunking, Dir, Pair};
use iwarp::engine::{
    DataPath, Event, Params, Payload, ReadWr, RecvWr, SendKind, SendWr, Sge, State, Status,
    TerminateInfo, WcOpcode, WriteWr,
};
use iwarp::mem::{Access, MrAttrs, Pd, RegionId, Scope};
use iwarp::wire::ddp::{BufferModel, QueueNumber, Stag};
use iwarp::wire::fpdu::{self, FpduRepr, Framing, Ulpdu};
use iwarp::wire::rdmap::{Opcode, RdmapRepr, ReadRequestRepr};
use iwarp::wire::terminate::{HdrCt, TermCode, TerminateHeader, TerminateRepr};

const NONE: HdrCt = HdrCt {
    segment_length: false,
    ddp_header: false,
    rdma_header: false,
};
const MD: HdrCt = HdrCt {
    segment_length: true,
    ddp_header: true,
    rdma_header: false,
};
const MDR: HdrCt = HdrCt {
    segment_length: true,
    ddp_header: true,
    rdma_header: true,
};

/// The ULPDU of an untagged segment.
fn untagged(
    opcode: Opcode,
    qn: u32,
    msn: u32,
    mo: u32,
    last: bool,
    inv: u32,
    payload: &[u8],
) -> Vec<u8> {
    let repr = RdmapRepr {
        opcode,
        last,
        model: BufferModel::Untagged {
            qn: QueueNumber(qn),
            msn,
            mo,
            rsvd_ulp32: inv,
        },
        read_request: None,
    };
    let mut v = vec![0u8; repr.buffer_len()];
    repr.emit(&mut v);
    v.extend_from_slice(payload);
    v
}

/// A Send.
fn send(msn: u32, mo: u32, payload: &[u8]) -> Vec<u8> {
    untagged(Opcode::SEND, 0, msn, mo, true, 0, payload)
}

/// The ULPDU of a tagged segment.
fn tagged(opcode: Opcode, stag: Stag, to: u64, last: bool, payload: &[u8]) -> Vec<u8> {
    let repr = RdmapRepr {
        opcode,
        last,
        model: BufferModel::Tagged { stag, to },
        read_request: None,
    };
    let mut v = vec![0u8; repr.buffer_len()];
    repr.emit(&mut v);
    v.extend_from_slice(payload);
    v
}

/// An RDMA Read Request.
fn read_request(msn: u32, rr: ReadRequestRepr) -> Vec<u8> {
    let repr = RdmapRepr {
        opcode: Opcode::RDMA_READ_REQUEST,
        last: true,
        model: BufferModel::Untagged {
            qn: QueueNumber::READ_REQUEST,
            msn,
            mo: 0,
            rsvd_ulp32: 0,
        },
        read_request: Some(rr),
    };
    let mut v = vec![0u8; repr.buffer_len()];
    repr.emit(&mut v);
    v
}

/// A pair where A has an RDMA Read of B outstanding (its Read Request is
/// on the way to B, MSN 1 of QN 1), and B has memory to be attacked.
struct T {
    pair: Pair<DataPath>,
    framing: Framing,
    /// B: 100 bytes registered for remote write and read, zero-based.
    b_stag: Stag,
    /// B: the source of A's Read.
    b_src_stag: Stag,
    /// Check that B's memory is unchanged.
    check_mem: bool,
}

impl T {
    fn new(crc: bool, markers: bool) -> T {
        T::with(params(crc, markers, 1460))
    }

    fn with(p: Params) -> T {
        let (crc, markers) = (p.crc, p.tx_markers);
        let mut pair = datapaths(p, p, 99);
        pair.chunking = Chunking { max: 7 };
        let b_buf = pair.b.mem.add(vec![0x55; 100]);
        let b_stag = pair
            .b
            .ep
            .register(b_buf, 0, 100, Access::REMOTE_WRITE | Access::REMOTE_READ)
            .unwrap();
        let b_src = pair.b.mem.add(vec![1; 10]);
        let b_src_stag = pair
            .b
            .ep
            .register(b_src, 0, 10, Access::REMOTE_READ)
            .unwrap();
        let a_sink = pair.a.mem.add(vec![0; 10]);
        let a_sink_stag = pair
            .a
            .ep
            .register(a_sink, 0, 10, Access::LOCAL_WRITE)
            .unwrap();
        pair.a
            .ep
            .post_read(ReadWr {
                wr_id: 77,
                local_stag: a_sink_stag,
                local_to: 0,
                remote_stag: b_src_stag,
                remote_to: 0,
                len: 10,
                signaled: true,
            })
            .unwrap();
        pair.transmit(Dir::AtoB, false);
        T {
            pair,
            framing: Framing { markers, crc },
            b_stag,
            b_src_stag,
            check_mem: true,
        }
    }

    /// Frames `ulpdu` at the current position of the stream A to B and
    /// puts it on the stream.
    fn inject(&mut self, ulpdu: &[u8]) {
        let bytes = FpduRepr {
            ulpdu: Ulpdu::new(ulpdu),
        }
        .to_vec(self.pair.a.sent, self.framing)
        .unwrap();
        self.pair.inject(Dir::AtoB, &bytes);
    }

    /// Injects `ulpdus`, delivers, and checks B's Terminate: `code`,
    /// `hdrct`, the echoed DDP header (of `ulpdus[echo]`), the echoed
    /// Read Request; then that A surfaces it; then that B's memory is as
    /// before. Returns the Terminate as A received it.
    fn expect(
        &mut self,
        ulpdus: &[Vec<u8>],
        code: TermCode,
        hdrct: HdrCt,
        echo: Option<usize>,
        rr: Option<ReadRequestRepr>,
    ) -> TerminateInfo {
        let before = self.pair.b.mem.clone();
        for u in ulpdus {
            self.inject(u);
        }
        self.pair.deliver(Dir::AtoB);
        // What B sent: one Terminate FPDU.
        let start = self.pair.b.sent;
        self.pair.b.record = Some(Vec::new());
        self.pair.transmit(Dir::BtoA, false);
        let sent = self.pair.b.record.take().unwrap();
        let (fpdu, n) = fpdu::parse(&sent, start, self.framing).expect("one whole FPDU");
        assert_eq!(n, sent.len(), "B sent more than its Terminate");
        let ulpdu = fpdu.ulpdu.to_vec();
        let (repr, at) = RdmapRepr::parse_bytes(&ulpdu).unwrap();
        // RFC 5040 §5.4: untagged, QN 2, its own MSN (the first), one
        // segment.
        assert_eq!(repr.opcode, Opcode::TERMINATE);
        assert!(repr.last);
        assert_eq!(
            repr.model,
            BufferModel::Untagged {
                qn: QueueNumber::TERMINATE,
                msn: 1,
                mo: 0,
                rsvd_ulp32: 0
            }
        );
        let header = TerminateHeader::new_checked(&ulpdu[at..]).unwrap();
        let term = TerminateRepr::parse(&header).unwrap();
        assert_eq!(term.code, code, "code");
        assert_eq!(term.hdrct(), hdrct, "M/D/R for {code}");
        assert_eq!(header.reserved(), 0);
        match echo {
            Some(i) => {
                let d = term.ddp.unwrap();
                let hl = if ulpdus[i][0] & 0x80 != 0 { 14 } else { 18 };
                assert_eq!(d.header, &ulpdus[i][..hl], "echoed DDP header");
                assert_eq!(usize::from(d.segment_length), ulpdus[i].len());
            }
            None => assert!(term.ddp.is_none()),
        }
        assert_eq!(term.rdma_header, rr, "echoed RDMA header");

        // B: told the ULP, went to Error once the Terminate was written.
        let ev = self.pair.events(Dir::BtoA);
        let info = match &ev[..] {
            [Event::TerminateSent(info)] => info.clone(),
            other => panic!("B events {other:?}"),
        };
        assert_eq!(info.code, code);
        assert_eq!(self.pair.b.ep.state(), State::Error);
        // Nothing placed: RFC 5041 §7.1 checks come before placement.
        if self.check_mem {
            assert!(self.pair.b.mem == before, "B's memory changed");
        }

        // A: the Terminate is delivered, outstanding work fails with it.
        self.pair.deliver(Dir::BtoA);
        let ev = self.pair.events(Dir::AtoB);
        assert_eq!(ev, vec![Event::TerminateReceived(info.clone())]);
        let c = self.pair.completions(Dir::AtoB);
        assert_eq!(c.len(), 1, "{c:?}");
        assert_eq!(
            (c[0].wr_id, c[0].opcode, c[0].status),
            (77, WcOpcode::Read, Status::Error { code, remote: true })
        );
        assert_eq!(self.pair.a.ep.state(), State::Error);
        assert!(self
            .pair
            .a
            .ep
            .post_recv(RecvWr {
                wr_id: 1,
                sge: Sge {
                    region: RegionId(0),
                    offset: 0,
                    len: 0
                }
            })
            .is_err());
        // Nothing more moves.
        self.pair.drive();
        assert_eq!(self.pair.b.inbox(), &[] as &[u8]);
        info
    }

    fn post_recv(&mut self, len: usize) -> RegionId {
        let r = self.pair.b.mem.add(vec![0x33; len]);
        self.pair
            .b
            .ep
            .post_recv(RecvWr {
                wr_id: 5,
                sge: Sge {
                    region: r,
                    offset: 0,
                    len,
                },
            })
            .unwrap();
        r
    }
}

fn rr(sink_to: u64, size: u32, src_stag: Stag, src_to: u64) -> ReadRequestRepr {
    ReadRequestRepr {
        sink_stag: Stag(0x4242_4200),
        sink_to,
        size,
        src_stag,
        src_to,
    }
}

// ---- DDP (RFC 5041 §7.2) ----------------------------------------------

#[test]
fn ddp_local_catastrophic_header_truncated() {
    // A CRC-valid FPDU of 16 octets whose T bit asks for 18.
    let mut t = T::new(true, false);
    let u = send(1, 0, &[])[..16].to_vec();
    t.expect(&[u], TermCode::DDP_LOCAL_CATASTROPHIC, NONE, None, None);
}

#[test]
fn ddp_invalid_stag() {
    let mut t = T::new(true, true);
    let u = tagged(Opcode::RDMA_WRITE, Stag(0x00ab_cd00), 0, true, &[1; 10]);
    t.expect(&[u], TermCode::DDP_INVALID_STAG, MD, Some(0), None);
}

#[test]
fn ddp_invalid_stag_stale_key_and_no_write_access() {
    let mut t = T::new(true, false);
    let stale = Stag(t.b_stag.0 ^ 0x01);
    let u = tagged(Opcode::RDMA_WRITE, stale, 0, true, &[1; 10]);
    t.expect(&[u], TermCode::DDP_INVALID_STAG, MD, Some(0), None);

    // An STag for remote read only: no writing through it.
    let mut t = T::new(false, true);
    let src = t.b_src_stag;
    let u = tagged(Opcode::RDMA_WRITE, src, 0, true, &[1; 10]);
    t.expect(&[u], TermCode::DDP_INVALID_STAG, MD, Some(0), None);
}

#[test]
fn ddp_base_bounds() {
    let mut t = T::new(true, false);
    // 95 + 10 > 100: not even the first 5 bytes may land.
    let u = tagged(Opcode::RDMA_WRITE, t.b_stag, 95, true, &[1; 10]);
    t.expect(&[u], TermCode::DDP_BASE_BOUNDS, MD, Some(0), None);
}

#[test]
fn ddp_stag_not_associated() {
    let mut t = T::new(true, false);
    let r = t.pair.b.mem.add(vec![0; 10]);
    let other_pd = t
        .pair
        .b
        .ep
        .register_with(r, 0, 10, MrAttrs::new(Pd(2), Access::REMOTE_WRITE))
        .unwrap();
    let u = tagged(Opcode::RDMA_WRITE, other_pd, 0, true, &[1; 10]);
    t.expect(&[u], TermCode::DDP_STAG_NOT_ASSOCIATED, MD, Some(0), None);
}

#[test]
fn ddp_to_wrap() {
    let mut t = T::new(true, false);
    let u = tagged(Opcode::RDMA_WRITE, t.b_stag, u64::MAX - 3, true, &[1; 10]);
    t.expect(&[u], TermCode::DDP_TO_WRAP, MD, Some(0), None);
}

#[test]
fn ddp_tagged_invalid_version() {
    let mut t = T::new(true, false);
    let mut u = tagged(Opcode::RDMA_WRITE, t.b_stag, 0, true, &[1; 10]);
    u[0] = (u[0] & !3) | 2;
    t.expect(
        &[u],
        TermCode::DDP_TAGGED_INVALID_VERSION,
        MD,
        Some(0),
        None,
    );
}

#[test]
fn ddp_invalid_qn() {
    let mut t = T::new(true, false);
    t.post_recv(100);
    let u = untagged(Opcode::SEND, 3, 1, 0, true, 0, &[1; 10]);
    t.expect(&[u], TermCode::DDP_INVALID_QN, MD, Some(0), None);
}

#[test]
fn ddp_no_buffer() {
    let mut t = T::new(true, false);
    let u = send(1, 0, &[1; 10]);
    t.expect(&[u], TermCode::DDP_NO_BUFFER, MD, Some(0), None);
}

#[test]
fn ddp_no_buffer_beyond_ird() {
    // IRD 1 at B: A's Read is one, a second Read Request has no buffer.
    let mut p = params(true, false, 1460);
    p.ird = 1;
    let mut t = T::with(p);
    let u = read_request(2, rr(0, 4, t.b_src_stag, 0));
    t.expect(&[u], TermCode::DDP_NO_BUFFER, MD, Some(0), None);
}

#[test]
fn ddp_invalid_msn_range() {
    let mut t = T::new(true, false);
    t.post_recv(100);
    t.post_recv(100);
    let u = send(2, 0, &[1; 10]);
    t.expect(&[u], TermCode::DDP_INVALID_MSN_RANGE, MD, Some(0), None);
}

#[test]
fn ddp_invalid_mo() {
    let mut t = T::new(true, false);
    t.post_recv(100);
    let u = send(1, 200, &[1; 10]);
    t.expect(&[u], TermCode::DDP_INVALID_MO, MD, Some(0), None);
}

#[test]
fn ddp_message_too_long() {
    let mut t = T::new(true, true);
    let buf = t.post_recv(100);
    // A first segment that fits, then one that does not.
    let first = untagged(Opcode::SEND, 0, 1, 0, false, 0, &[1; 60]);
    let second = send(1, 60, &[2; 41]);
    t.check_mem = false;
    let info = t.expect(
        &[first, second],
        TermCode::DDP_MESSAGE_TOO_LONG,
        MD,
        Some(1),
        None,
    );
    assert_eq!(info.segment_length, Some(18 + 41));
    // The first segment was placed (not delivered), the second not at all.
    let got = t.pair.b.mem.get(buf).unwrap();
    assert_eq!(&got[..60], &[1; 60][..]);
    assert_eq!(&got[60..], &[0x33; 40][..]);
    assert_eq!(
        t.pair.completions(Dir::BtoA)[0].status,
        Status::Error {
            code: TermCode::DDP_MESSAGE_TOO_LONG,
            remote: false
        }
    );
}

#[test]
fn ddp_untagged_invalid_version() {
    let mut t = T::new(true, false);
    t.post_recv(100);
    let mut u = send(1, 0, &[1; 10]);
    u[0] &= !3;
    t.expect(
        &[u],
        TermCode::DDP_UNTAGGED_INVALID_VERSION,
        MD,
        Some(0),
        None,
    );
}

// ---- RDMAP (RFC 5040 §4.8 Figure 9, §7.2) -----------------------------

#[test]
fn rdmap_read_invalid_stag() {
    let mut t = T::new(true, false);
    let r = rr(0, 4, Stag(0x0077_0000), 0);
    t.expect(
        &[read_request(2, r)],
        TermCode::RDMAP_INVALID_STAG,
        MDR,
        Some(0),
        Some(r),
    );
}

#[test]
fn rdmap_read_base_bounds() {
    let mut t = T::new(true, true);
    let r = rr(0, 11, t.b_src_stag, 0);
    t.expect(
        &[read_request(2, r)],
        TermCode::RDMAP_BASE_BOUNDS,
        MDR,
        Some(0),
        Some(r),
    );
}

#[test]
fn rdmap_read_access_rights() {
    let mut t = T::new(true, false);
    let r_only_write = t.pair.b.mem.add(vec![0; 8]);
    let stag = t
        .pair
        .b
        .ep
        .register(r_only_write, 0, 8, Access::REMOTE_WRITE)
        .unwrap();
    let r = rr(0, 8, stag, 0);
    t.expect(
        &[read_request(2, r)],
        TermCode::RDMAP_ACCESS_RIGHTS,
        MDR,
        Some(0),
        Some(r),
    );
}

#[test]
fn rdmap_read_stag_not_associated() {
    let mut t = T::new(true, false);
    let reg = t.pair.b.mem.add(vec![0; 8]);
    let stag = t
        .pair
        .b
        .ep
        .register_with(reg, 0, 8, MrAttrs::new(Pd(9), Access::REMOTE_READ))
        .unwrap();
    let r = rr(0, 8, stag, 0);
    t.expect(
        &[read_request(2, r)],
        TermCode::RDMAP_STAG_NOT_ASSOCIATED,
        MDR,
        Some(0),
        Some(r),
    );
}

#[test]
fn rdmap_read_to_wrap() {
    let mut t = T::new(true, false);
    let r = rr(0, 8, t.b_src_stag, u64::MAX - 2);
    t.expect(
        &[read_request(2, r)],
        TermCode::RDMAP_TO_WRAP,
        MDR,
        Some(0),
        Some(r),
    );
}

#[test]
fn rdmap_invalidate_invalid_stag() {
    let mut t = T::new(true, false);
    t.post_recv(100);
    let u = untagged(
        Opcode::SEND_INVALIDATE,
        0,
        1,
        0,
        true,
        0x0099_0000,
        &[1; 10],
    );
    // Figure 10: R only exists for Read Requests.
    t.expect(&[u], TermCode::RDMAP_INVALID_STAG, MD, Some(0), None);
}

#[test]
fn rdmap_cannot_invalidate() {
    // A PD-wide STag may be shared: the peer may not invalidate it (RFC
    // 5040 §8.1.1 item 7).
    let mut t = T::new(true, false);
    t.post_recv(100);
    let stag = t.b_stag;
    let u = untagged(Opcode::SEND_SE_INVALIDATE, 0, 1, 0, true, stag.0, &[1; 10]);
    t.expect(
        &[u],
        TermCode::RDMAP_PROT_CANNOT_INVALIDATE,
        MD,
        Some(0),
        None,
    );
    assert!(t.pair.b.ep.registry().get(stag).unwrap().valid);

    // Nor one of another protection domain.
    let mut t = T::new(true, false);
    t.post_recv(100);
    let r = t.pair.b.mem.add(vec![0; 8]);
    let stag = t
        .pair
        .b
        .ep
        .register_with(
            r,
            0,
            8,
            MrAttrs::new(Pd(3), Access::REMOTE_WRITE).with_scope(Scope::Stream),
        )
        .unwrap();
    let u = untagged(Opcode::SEND_INVALIDATE, 0, 1, 0, true, stag.0, &[]);
    t.expect(
        &[u],
        TermCode::RDMAP_PROT_CANNOT_INVALIDATE,
        MD,
        Some(0),
        None,
    );
}

#[test]
fn rdmap_invalid_version() {
    let mut t = T::new(true, false);
    t.post_recv(100);
    let mut u = send(1, 0, &[1; 10]);
    u[1] = (2 << 6) | Opcode::SEND.0;
    t.expect(&[u], TermCode::RDMAP_INVALID_VERSION, MD, Some(0), None);
}

#[test]
fn rdmap_unexpected_opcode() {
    // A reserved opcode.
    let mut t = T::new(true, false);
    t.post_recv(100);
    let u = untagged(Opcode(0x9), 0, 1, 0, true, 0, &[1; 10]);
    t.expect(&[u], TermCode::RDMAP_UNEXPECTED_OPCODE, MD, Some(0), None);
    // A Send on the Read Request queue.
    let mut t = T::new(true, false);
    let u = untagged(Opcode::SEND, 1, 2, 0, true, 0, &[1; 10]);
    t.expect(&[u], TermCode::RDMAP_UNEXPECTED_OPCODE, MD, Some(0), None);
    // A Read Response nobody asked for (B has no Read outstanding).
    let mut t = T::new(true, false);
    let u = tagged(Opcode::RDMA_READ_RESPONSE, t.b_stag, 0, true, &[1; 10]);
    t.expect(&[u], TermCode::RDMAP_UNEXPECTED_OPCODE, MD, Some(0), None);
    // A Write opcode in an untagged segment.
    let mut t = T::new(true, false);
    let mut u = send(1, 0, &[1; 10]);
    u[1] = (1 << 6) | Opcode::RDMA_WRITE.0;
    t.expect(&[u], TermCode::RDMAP_UNEXPECTED_OPCODE, MD, Some(0), None);
}

#[test]
fn rdmap_op_unspecified_truncated_read_request() {
    let mut t = T::new(true, false);
    let u = read_request(2, rr(0, 4, t.b_src_stag, 0))[..18 + 20].to_vec();
    t.expect(&[u], TermCode::RDMAP_OP_UNSPECIFIED, MD, Some(0), None);
}

#[test]
fn rdmap_catastrophic_stream_read_source_memory_gone() {
    // B accepted A's Read Request, but the memory behind the Data Source
    // STag is gone before B can answer: 0/2/07, for this stream only.
    let mut t = T::new(true, false);
    let src = RegionId(1);
    assert!(t.pair.b.mem.remove(src).is_some());
    t.check_mem = false;
    t.expect(&[], TermCode::RDMAP_CATASTROPHIC_STREAM, NONE, None, None);
}

#[test]
fn rdmap_local_catastrophic_sent_instead_of_request() {
    // RFC 5040 §7.1 case 1: A cannot build its Send (the memory is gone):
    // the Terminate goes instead, with no headers.
    let p = params(true, true, 1460);
    let mut pair = datapaths(p, p, 3);
    let r = pair.a.mem.add(vec![0; 10]);
    pair.a
        .ep
        .post_send(SendWr {
            wr_id: 1,
            kind: SendKind::Send,
            payload: Payload::region(r, 0, 10),
            signaled: true,
        })
        .unwrap();
    pair.a
        .ep
        .post_send(SendWr {
            wr_id: 2,
            kind: SendKind::Send,
            payload: Payload::empty(),
            signaled: true,
        })
        .unwrap();
    pair.a.mem.remove(r);
    pair.a.record = Some(Vec::new());
    pair.drive();
    let code = TermCode::RDMAP_LOCAL_CATASTROPHIC;
    let sent = pair.a.record.take().unwrap();
    let (f, _) = fpdu::parse(
        &sent,
        0,
        Framing {
            markers: true,
            crc: true,
        },
    )
    .unwrap();
    let u = f.ulpdu.to_vec();
    let term = TerminateRepr::parse(&TerminateHeader::new_checked(&u[18..]).unwrap()).unwrap();
    assert_eq!((term.code, term.hdrct()), (code, NONE));
    let c: Vec<_> = pair
        .completions(Dir::AtoB)
        .iter()
        .map(|c| (c.wr_id, c.status))
        .collect();
    assert_eq!(
        c,
        vec![
            (
                1,
                Status::Error {
                    code,
                    remote: false
                }
            ),
            (2, Status::Flushed)
        ]
    );
    assert!(matches!(&pair.events(Dir::BtoA)[..], [Event::TerminateReceived(i)] if i.code == code));
}

// ---- MPA (RFC 5044 §8, RFC 6581 §8) -----------------------------------

#[test]
fn mpa_crc() {
    let mut t = T::new(true, false);
    t.post_recv(100);
    let mut bytes = FpduRepr {
        ulpdu: Ulpdu::new(&send(1, 0, &[1; 10])),
    }
    .to_vec(t.pair.a.sent, t.framing)
    .unwrap();
    bytes[10] ^= 0x80;
    t.pair.inject(Dir::AtoB, &bytes);
    t.expect(&[], TermCode::MPA_CRC, NONE, None, None);
}

#[test]
fn mpa_marker() {
    for crc in [true, false] {
        let mut t = T::new(crc, true);
        t.post_recv(1000);
        let pos = t.pair.a.sent;
        let mut bytes = FpduRepr {
            ulpdu: Ulpdu::new(&send(1, 0, &[1; 900])),
        }
        .to_vec(pos, t.framing)
        .unwrap();
        // The marker inside the FPDU points elsewhere; the CRC is made to
        // match, so the marker is the only fault (RFC 5044 §8 code 3).
        let m = fpdu::bytes_to_marker(pos);
        bytes[m + 3] ^= 0x10;
        let crc_at = bytes.len() - 4;
        let c = iwarp::wire::crc::checksum(&bytes[..crc_at]);
        if crc {
            bytes[crc_at..].copy_from_slice(&iwarp::wire::crc::to_wire(c));
        }
        t.pair.inject(Dir::AtoB, &bytes);
        // The payload may have been placed into the receive buffer it was
        // headed for (placement is not delivery, RFC 5041 §5.3); it is
        // never delivered.
        t.check_mem = false;
        t.expect(&[], TermCode::MPA_MARKER, NONE, None, None);
        let c = t.pair.completions(Dir::BtoA);
        assert_eq!((c.len(), c[0].status), (1, Status::Flushed));
    }
}

#[test]
fn mpa_invalid_frame_ulpdu_too_short() {
    // A CRC-valid FPDU whose ULPDU cannot hold any DDP header.
    let mut t = T::new(true, false);
    // ULPDU_Length 4, four octets, two of pad, CRC.
    let mut bytes = vec![0, 4, 0x41, 0x43, 0, 0, 0, 0];
    let c = iwarp::wire::crc::checksum(&bytes);
    bytes.extend_from_slice(&iwarp::wire::crc::to_wire(c));
    t.pair.inject(Dir::AtoB, &bytes);
    t.expect(&[], TermCode::MPA_INVALID_FRAME, NONE, None, None);
}

#[test]
fn mpa_connection_lost() {
    let mut t = T::new(true, false);
    t.pair.deliver(Dir::AtoB);
    t.pair.a.ep.handle_llp_closed();
    let code = TermCode::MPA_CONNECTION_LOST;
    assert_eq!(t.pair.events(Dir::AtoB), vec![Event::Failed(code)]);
    let c = t.pair.completions(Dir::AtoB);
    assert_eq!(
        c[0].status,
        Status::Error {
            code,
            remote: false
        }
    );
    assert_eq!(t.pair.a.ep.state(), State::Error);
    // No Terminate can go out on a lost connection.
    assert_eq!(t.pair.a.ep.poll_transmit(&t.pair.a.mem, 1 << 20), 0);
}

/// RFC 6581 §8 codes 5, 6, 7 (from the startup machine, which hands them
/// to the data path with `fail`): a Terminate without headers.
#[test]
fn mpa_enhanced_codes_from_startup() {
    for code in [
        TermCode::MPA_LOCAL_CATASTROPHIC,
        TermCode::MPA_INSUFFICIENT_IRD,
        TermCode::MPA_NO_MATCHING_RTR,
    ] {
        let mut t = T::new(true, true);
        t.pair.deliver(Dir::AtoB);
        // B fails locally.
        t.pair.b.ep.fail(code);
        let start = t.pair.b.sent;
        t.pair.b.record = Some(Vec::new());
        t.pair.transmit(Dir::BtoA, false);
        let sent = t.pair.b.record.take().unwrap();
        let (f, n) = fpdu::parse(&sent, start, t.framing).unwrap();
        assert_eq!(n, sent.len());
        let u = f.ulpdu.to_vec();
        let term = TerminateRepr::parse(&TerminateHeader::new_checked(&u[18..]).unwrap()).unwrap();
        assert_eq!((term.code, term.hdrct()), (code, NONE));
        t.pair.deliver(Dir::BtoA);
        let c = t.pair.completions(Dir::AtoB);
        assert_eq!(c[0].status, Status::Error { code, remote: true });
    }
}

// ---- memory protection beyond the codes --------------------------------

/// A Write that is in bounds for its first segment but not its second:
/// the first lands, the second is refused entirely, and nothing past the
/// registered range is touched.
#[test]
fn write_running_off_the_end_places_nothing_beyond() {
    let p = params(true, false, 1460);
    let mut pair = datapaths(p, p, 4);
    let dst = pair.b.mem.add(vec![0; 3000]);
    // Register only the first 2000 bytes.
    let stag = pair
        .b
        .ep
        .register(dst, 0, 2000, Access::REMOTE_WRITE)
        .unwrap();
    pair.a
        .ep
        .post_write(WriteWr {
            wr_id: 1,
            remote_stag: stag,
            remote_to: 0,
            payload: Payload::Inline(vec![7; 2500]),
            signaled: true,
        })
        .unwrap();
    pair.drive();
    let got = pair.b.mem.get(dst).unwrap();
    let first = fpdu::mulpdu(p.emss, false) - 14;
    assert!(got[..first].iter().all(|&b| b == 7));
    assert!(got[first..].iter().all(|&b| b == 0));
    assert!(matches!(
        &pair.events(Dir::BtoA)[..],
        [Event::TerminateSent(i)] if i.code == TermCode::DDP_BASE_BOUNDS
    ));
}

/// Invalidating an STag locally while a segment is being placed into it
/// stops the placement there.
#[test]
fn local_invalidate_mid_segment_stops_placement() {
    let p = params(true, false, 65483);
    let mut pair = datapaths(p, p, 6);
    let dst = pair.b.mem.add(vec![0; 10_000]);
    let stag = pair
        .b
        .ep
        .register(dst, 0, 10_000, Access::REMOTE_WRITE)
        .unwrap();
    pair.a
        .ep
        .post_write(WriteWr {
            wr_id: 1,
            remote_stag: stag,
            remote_to: 0,
            payload: Payload::Inline(vec![7; 10_000]),
            signaled: true,
        })
        .unwrap();
    pair.transmit(Dir::AtoB, false);
    let bytes = pair.b.inbox().to_vec();
    // Headers (2 + 14) and 1000 bytes of payload, then invalidate.
    pair.b.ep.handle_input(&bytes[..1016], &mut pair.b.mem);
    pair.b.ep.invalidate(stag).unwrap();
    pair.b.ep.handle_input(&bytes[1016..], &mut pair.b.mem);
    let got = pair.b.mem.get(dst).unwrap();
    assert!(got[..1000].iter().all(|&b| b == 7));
    assert!(got[1000..].iter().all(|&b| b == 0));
    assert!(matches!(
        &pair.b.ep.poll_event(),
        Some(Event::TerminateSent(i)) if i.code == TermCode::DDP_INVALID_STAG
    ));
}
