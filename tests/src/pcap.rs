//! A minimal pcap writer for synthetic TCP conversations, so that `tshark`
//! can decode what our emitters produce without a live capture.
//!
//! Frames are raw IPv4 (LINKTYPE_RAW) carrying TCP with correct sequence
//! numbers and checksums; each call to [`TcpConversation::send`] becomes one
//! TCP segment, which is how the MPA dissector expects FPDUs to arrive
//! (RFC 5044 §5.1: FPDUs aligned with TCP segments).

use std::net::Ipv4Addr;

/// LINKTYPE_RAW: the packet begins with an IPv4 or IPv6 header.
const LINKTYPE_RAW: u32 = 101;

/// One side of the conversation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

struct Endpoint {
    addr: Ipv4Addr,
    port: u16,
    /// Next sequence number this endpoint sends.
    seq: u32,
}

/// A TCP connection whose segments are appended to a pcap file image.
pub struct TcpConversation {
    client: Endpoint,
    server: Endpoint,
    pcap: Vec<u8>,
    usec: u32,
    ip_id: u16,
}

const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const PSH: u8 = 0x08;
const FIN: u8 = 0x01;

impl TcpConversation {
    /// Starts a conversation with the three-way handshake already written.
    pub fn new(client: (Ipv4Addr, u16), server: (Ipv4Addr, u16)) -> Self {
        let mut pcap = Vec::new();
        // pcap global header, microsecond timestamps, native byte order.
        pcap.extend_from_slice(&0xa1b2_c3d4u32.to_le_bytes());
        pcap.extend_from_slice(&2u16.to_le_bytes());
        pcap.extend_from_slice(&4u16.to_le_bytes());
        pcap.extend_from_slice(&0i32.to_le_bytes());
        pcap.extend_from_slice(&0u32.to_le_bytes());
        pcap.extend_from_slice(&65535u32.to_le_bytes());
        pcap.extend_from_slice(&LINKTYPE_RAW.to_le_bytes());
        let mut conv = TcpConversation {
            client: Endpoint {
                addr: client.0,
                port: client.1,
                seq: 0x1000_0000,
            },
            server: Endpoint {
                addr: server.0,
                port: server.1,
                seq: 0x7000_0000,
            },
            pcap,
            usec: 0,
            ip_id: 1,
        };
        conv.segment(Side::Client, SYN, &[]);
        conv.client.seq = conv.client.seq.wrapping_add(1);
        conv.segment(Side::Server, SYN | ACK, &[]);
        conv.server.seq = conv.server.seq.wrapping_add(1);
        conv.segment(Side::Client, ACK, &[]);
        conv
    }

    /// Writes `payload` as one TCP segment from `from`.
    pub fn send(&mut self, from: Side, payload: &[u8]) {
        assert!(payload.len() <= 65535 - 40, "one segment per call");
        self.segment(from, PSH | ACK, payload);
        let ep = match from {
            Side::Client => &mut self.client,
            Side::Server => &mut self.server,
        };
        ep.seq = ep.seq.wrapping_add(payload.len() as u32);
    }

    /// Closes both directions and returns the pcap file image.
    pub fn finish(mut self) -> Vec<u8> {
        for side in [Side::Client, Side::Server] {
            self.segment(side, FIN | ACK, &[]);
            match side {
                Side::Client => self.client.seq = self.client.seq.wrapping_add(1),
                Side::Server => self.server.seq = self.server.seq.wrapping_add(1),
            }
        }
        self.pcap
    }

    fn segment(&mut self, from: Side, flags: u8, payload: &[u8]) {
        let (src, dst) = match from {
            Side::Client => (&self.client, &self.server),
            Side::Server => (&self.server, &self.client),
        };
        let ack = if flags & ACK != 0 { dst.seq } else { 0 };
        let mut tcp = Vec::with_capacity(20 + payload.len());
        tcp.extend_from_slice(&src.port.to_be_bytes());
        tcp.extend_from_slice(&dst.port.to_be_bytes());
        tcp.extend_from_slice(&src.seq.to_be_bytes());
        tcp.extend_from_slice(&ack.to_be_bytes());
        tcp.push(5 << 4); // data offset: 20 bytes, no options
        tcp.push(flags);
        tcp.extend_from_slice(&65535u16.to_be_bytes()); // window
        tcp.extend_from_slice(&[0, 0, 0, 0]); // checksum, urgent pointer
        tcp.extend_from_slice(payload);
        let mut pseudo = Vec::with_capacity(12 + tcp.len());
        pseudo.extend_from_slice(&src.addr.octets());
        pseudo.extend_from_slice(&dst.addr.octets());
        pseudo.extend_from_slice(&[0, 6]);
        pseudo.extend_from_slice(&(tcp.len() as u16).to_be_bytes());
        pseudo.extend_from_slice(&tcp);
        let sum = internet_checksum(&pseudo);
        tcp[16..18].copy_from_slice(&sum.to_be_bytes());

        let total = 20 + tcp.len();
        let mut ip = Vec::with_capacity(total);
        ip.push(0x45);
        ip.push(0);
        ip.extend_from_slice(&(total as u16).to_be_bytes());
        ip.extend_from_slice(&self.ip_id.to_be_bytes());
        ip.extend_from_slice(&[0x40, 0]); // don't fragment
        ip.push(64);
        ip.push(6);
        ip.extend_from_slice(&[0, 0]);
        ip.extend_from_slice(&src.addr.octets());
        ip.extend_from_slice(&dst.addr.octets());
        let sum = internet_checksum(&ip);
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
        ip.extend_from_slice(&tcp);
        self.ip_id = self.ip_id.wrapping_add(1);

        self.usec += 100;
        self.pcap.extend_from_slice(&1u32.to_le_bytes());
        self.pcap.extend_from_slice(&self.usec.to_le_bytes());
        self.pcap
            .extend_from_slice(&(ip.len() as u32).to_le_bytes());
        self.pcap
            .extend_from_slice(&(ip.len() as u32).to_le_bytes());
        self.pcap.extend_from_slice(&ip);
    }
}

/// RFC 1071 ones' complement sum.
fn internet_checksum(data: &[u8]) -> u16 {
    let mut sum = 0u32;
    for chunk in data.chunks(2) {
        let word = match *chunk {
            [hi, lo] => u16::from_be_bytes([hi, lo]),
            [hi] => u16::from_be_bytes([hi, 0]),
            _ => 0,
        };
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_of_rfc1071_example() {
        // RFC 1071 §3: the sum of 00 01 f2 03 f4 f5 f6 f7 is ddf2, complemented 220d.
        assert_eq!(
            internet_checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            0x220d
        );
    }

    #[test]
    fn handshake_and_segments_are_framed() {
        let mut conv = TcpConversation::new(
            (Ipv4Addr::new(10, 0, 0, 1), 40000),
            (Ipv4Addr::new(10, 0, 0, 2), 5000),
        );
        conv.send(Side::Client, b"hello");
        let pcap = conv.finish();
        // global header + 6 records (3 handshake, 1 data, 2 FIN)
        let records = 3 + 1 + 2;
        let bare = 16 + 40;
        assert_eq!(pcap.len(), 24 + records * bare + 5);
    }
}
