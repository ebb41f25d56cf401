//! The graceful close on the wire (draft §8.2.1), in a live loopback
//! capture decoded by tshark: the peer that closes second, having received
//! the other's DisConn, sends its own DisConn and its FIN in one segment
//! (one segment and one wake-up of the peer fewer per connection); the
//! first closer's DisConn goes at once, without a FIN, since it may still
//! have to give credit while the peer writes.

use sdp_core::stream::{SdpListener, SdpStream};
use sdp_core::wire::Mid;
use sdp_tests::capture::{free_port, LiveCapture};
use sdp_tests::tshark;
use std::io::{Read, Write};

const FIELDS: [&str; 4] = ["tcp.srcport", "tcp.flags.fin", "tcp.len", "tcp.payload"];

/// One segment with payload or a FIN: from the listener's side or not, FIN
/// or not, and the MID of each SDP message it carries.
#[derive(Debug)]
struct Segment {
    from_server: bool,
    fin: bool,
    mids: Vec<u8>,
}

fn segments(pcap: &[u8], port: u16) -> Vec<Segment> {
    let filter = format!("tcp.port == {port} && (tcp.len > 0 || tcp.flags.fin == 1)");
    tshark::decode(pcap, &filter, &FIELDS)
        .into_iter()
        .map(|f| {
            let payload = f[3].first().map_or_else(Vec::new, |h| hex(h));
            assert_eq!(payload.len().to_string(), f[2][0], "tcp.len");
            Segment {
                from_server: f[0][0] == port.to_string(),
                fin: f[1][0] == "1" || f[1][0] == "True",
                mids: mids(&payload),
            }
        })
        .collect()
}

fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap())
        .collect()
}

/// The MIDs of the SDP messages in a segment of whole FPDUs (no markers):
/// each FPDU is the ULPDU length (2 octets), the DDP/RDMAP untagged header
/// (18, RFC 5041 §4.3, RFC 5040 §4.1), the SDP message, whose BSDH starts
/// with the MID, padding to 4 octets and the CRC (RFC 5044 §4).
fn mids(mut fpdus: &[u8]) -> Vec<u8> {
    const HEADERS: usize = 2 + 18;
    let mut out = Vec::new();
    while fpdus.len() > HEADERS {
        let ulpdu = usize::from(u16::from_be_bytes([fpdus[0], fpdus[1]]));
        out.push(fpdus[HEADERS]);
        let len = (2 + ulpdu).next_multiple_of(4) + 4;
        fpdus = &fpdus[len.min(fpdus.len())..];
    }
    out
}

#[test]
fn the_second_closers_disconn_goes_with_its_fin() {
    let port = free_port();
    let cap = LiveCapture::start(port);
    let listener = SdpListener::bind(("127.0.0.1", port)).unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut one = [0u8; 1];
        s.read_exact(&mut one).unwrap();
        s.write_all(&one).unwrap();
        // The client closes first (its DisConn); the server reads the end,
        // then closes: its DisConn and FIN are written before the drop
        // returns, nothing being left to wait for.
        assert_eq!(s.read(&mut one).unwrap(), 0);
    });
    let mut client = SdpStream::connect(("127.0.0.1", port)).unwrap();
    client.write_all(b"x").unwrap();
    let mut one = [0u8; 1];
    client.read_exact(&mut one).unwrap();
    assert_eq!(&one, b"x");
    drop(client);
    server.join().unwrap();
    let pcap = cap.finish();
    let segs = segments(&pcap, port);
    let disconn = Mid::DIS_CONN.0;
    let server: Vec<&Segment> = segs.iter().filter(|s| s.from_server).collect();
    let last = server.last().expect("segments of the server");
    assert!(
        last.fin && last.mids == [disconn],
        "the server's DisConn and FIN are not one segment: {segs:#?}"
    );
    assert_eq!(server.iter().filter(|s| s.fin).count(), 1, "{segs:#?}");
    // The client's DisConn went before the server's, without its FIN.
    let client_disconn = segs
        .iter()
        .position(|s| !s.from_server && s.mids.contains(&disconn))
        .expect("the client's DisConn");
    assert!(!segs[client_disconn].fin, "{segs:#?}");
    let server_disconn = segs.iter().position(|s| s.from_server && s.fin).unwrap();
    assert!(client_disconn < server_disconn, "{segs:#?}");
}
