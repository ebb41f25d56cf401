//! The capture decoder (`sdp-decode`) reads back an SDP connection written
//! by our emitters: the Hello in the MPA Request, the RTR, the HelloAck, a
//! Data message split over several FPDUs, and a DisConn — with markers, so
//! that reassembly and marker removal are exercised.

use std::net::Ipv4Addr;

use iwarp::wire::ddp::{BufferModel, QueueNumber, Stag};
use iwarp::wire::fpdu::{FpduRepr, Framing, Ulpdu};
use iwarp::wire::mpa::{EnhancedRepr, FrameKind, FrameRepr, REV_2};
use iwarp::wire::rdmap::{Opcode, RdmapRepr};
use sdp_core::wire::{Body, Flags, HelloAckRepr, HelloRepr, MessageRepr};
use sdp_tests::pcap::{Side, TcpConversation};

fn sdp(bufs: u16, mseq: u32, mseq_ack: u32, body: Body<'_>) -> Vec<u8> {
    let msg = MessageRepr {
        bufs,
        flags: Flags::EMPTY,
        mseq,
        mseq_ack,
        body,
    };
    let mut out = vec![0u8; msg.buffer_len()];
    msg.emit(&mut out);
    out
}

struct Stream {
    pos: u64,
    msn: u32,
}

/// Sends `message` as Send segments of at most `mulpdu` octets.
fn send(
    conv: &mut TcpConversation,
    side: Side,
    s: &mut Stream,
    op: Opcode,
    message: &[u8],
    mulpdu: usize,
) {
    let framing = Framing {
        markers: true,
        crc: true,
    };
    let chunk = mulpdu - 18;
    let mut mo = 0;
    loop {
        let end = (mo + chunk).min(message.len());
        let header = RdmapRepr {
            opcode: op,
            last: end == message.len(),
            model: BufferModel::Untagged {
                qn: QueueNumber::SEND,
                msn: s.msn,
                mo: mo as u32,
                rsvd_ulp32: 0,
            },
            read_request: None,
        };
        let mut ulpdu = vec![0u8; header.buffer_len()];
        header.emit(&mut ulpdu);
        ulpdu.extend_from_slice(&message[mo..end]);
        let wire = FpduRepr {
            ulpdu: Ulpdu::new(&ulpdu),
        }
        .to_vec(s.pos, framing)
        .unwrap();
        s.pos += wire.len() as u64;
        conv.send(side, &wire);
        mo = end;
        if mo == message.len() {
            break;
        }
    }
    s.msn += 1;
}

#[test]
fn decodes_an_sdp_connection() {
    let mut conv = TcpConversation::new(
        (Ipv4Addr::new(192, 0, 2, 1), 40_001),
        (Ipv4Addr::new(192, 0, 2, 2), 19_877),
    );
    let hello = sdp(
        8,
        0,
        0,
        Body::Hello(HelloRepr {
            maj_v: 1,
            min_v: 1,
            max_adverts: 4,
            des_rem_rcv_sz: 65536,
            local_rcv_sz: 65536,
            loc_ird: 4,
            loc_ord: 4,
        }),
    );
    let enhanced = EnhancedRepr {
        peer_to_peer: true,
        rtr_send: false,
        rtr_write: true,
        rtr_read: false,
        ird: 4,
        ord: 4,
    };
    let mut pd = enhanced.to_bytes().unwrap().to_vec();
    pd.extend_from_slice(&hello);
    let request = FrameRepr {
        kind: FrameKind::Request,
        markers: true,
        crc: true,
        rejected: false,
        enhanced: true,
        rev: REV_2,
        private_data: &pd,
    };
    conv.send(Side::Client, &request.to_vec().unwrap());
    let reply_pd = enhanced.to_bytes().unwrap();
    let reply = FrameRepr {
        kind: FrameKind::Reply,
        private_data: &reply_pd,
        ..request
    };
    conv.send(Side::Server, &reply.to_vec().unwrap());

    let mut client = Stream { pos: 0, msn: 1 };
    let mut server = Stream { pos: 0, msn: 1 };
    // RTR: a zero-length RDMA Write with a non-zero STag.
    let rtr = RdmapRepr {
        opcode: Opcode::RDMA_WRITE,
        last: true,
        model: BufferModel::Tagged {
            stag: Stag(0x0101),
            to: 0,
        },
        read_request: None,
    };
    let mut ulpdu = vec![0u8; rtr.buffer_len()];
    rtr.emit(&mut ulpdu);
    let wire = FpduRepr {
        ulpdu: Ulpdu::new(&ulpdu),
    }
    .to_vec(
        0,
        Framing {
            markers: true,
            crc: true,
        },
    )
    .unwrap();
    client.pos += wire.len() as u64;
    conv.send(Side::Client, &wire);

    let ack = sdp(
        8,
        0,
        0,
        Body::HelloAck(HelloAckRepr {
            maj_v: 1,
            min_v: 1,
            max_adverts: 4,
            act_rcv_sz: 65536,
            loc_ird: 4,
            loc_ord: 4,
        }),
    );
    send(
        &mut conv,
        Side::Server,
        &mut server,
        Opcode::SEND_SE,
        &ack,
        1024,
    );
    let payload: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
    let data = sdp(7, 1, 0, Body::Data { payload: &payload });
    send(
        &mut conv,
        Side::Client,
        &mut client,
        Opcode::SEND,
        &data,
        1024,
    );
    let disconn = sdp(7, 2, 1, Body::DisConn);
    send(
        &mut conv,
        Side::Client,
        &mut client,
        Opcode::SEND_SE,
        &disconn,
        1024,
    );

    let lines = sdp_tools::decode::decode(&conv.finish()).unwrap();
    let bodies: Vec<&str> = lines
        .iter()
        .map(|l| l.splitn(5, ' ').nth(4).unwrap())
        .collect();
    assert_eq!(bodies.len(), 6, "{lines:#?}");
    assert!(bodies[0].starts_with("MPA Request rev 2 M=1 C=1 R=0 S=1 PD 36 [A=1 B=0 C=1 D=0 IRD=4 ORD=4]: SDP Hello bufs=8 mseq=0 mseq_ack=0"), "{}", bodies[0]);
    assert!(bodies[0].contains("max_adverts: 4"), "{}", bodies[0]);
    assert!(
        bodies[1].starts_with("MPA Reply rev 2 M=1 C=1 R=0 S=1 PD 4"),
        "{}",
        bodies[1]
    );
    assert_eq!(bodies[2], "RDMA Write STag 0x00000101 TO 0x0 len 0 L");
    assert!(
        bodies[3].starts_with("Send with Solicited Event QN 0 MSN 1: SDP HelloAck bufs=8"),
        "{}",
        bodies[3]
    );
    assert_eq!(
        bodies[4],
        "Send QN 0 MSN 1: SDP Data bufs=7 mseq=1 mseq_ack=0 flags=0 payload 3000"
    );
    assert_eq!(
        bodies[5],
        "Send with Solicited Event QN 0 MSN 2: SDP DisConn bufs=7 mseq=2 mseq_ack=1 flags=0"
    );
    assert!(lines[0].starts_with("0.000"));
    assert!(lines[0].contains("192.0.2.1:40001 > 192.0.2.2:19877"));
}
