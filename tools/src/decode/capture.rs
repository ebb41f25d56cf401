//! Reading TCP segments out of a capture file: classic pcap (either byte
//! order, micro- or nanosecond timestamps) and pcapng, with Ethernet, raw IP,
//! Linux cooked (v1 and v2) and BSD loopback link layers, IPv4 and IPv6.
//!
//! Anything that is not a TCP segment, or is cut short, is skipped.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// One TCP segment from the capture.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    /// Seconds since the first packet of the capture.
    pub time: f64,
    pub src: SocketAddr,
    pub dst: SocketAddr,
    pub seq: u32,
    pub syn: bool,
    pub fin: bool,
    pub rst: bool,
    pub payload: Vec<u8>,
}

/// Why a file could not be read as a capture.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Error {
    /// Neither the pcap nor the pcapng magic number.
    NotACapture,
    /// The file ends inside a header.
    Truncated,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Error::NotACapture => "not a pcap or pcapng file",
            Error::Truncated => "capture file ends inside a header",
        })
    }
}

impl std::error::Error for Error {}

const LINKTYPE_NULL: u32 = 0;
const LINKTYPE_ETHERNET: u32 = 1;
const LINKTYPE_RAW: u32 = 101;
const LINKTYPE_LOOP: u32 = 108;
const LINKTYPE_LINUX_SLL: u32 = 113;
const LINKTYPE_IPV4: u32 = 228;
const LINKTYPE_IPV6: u32 = 229;
const LINKTYPE_LINUX_SLL2: u32 = 276;

/// Reads every TCP segment of a pcap or pcapng file, in capture order.
pub fn segments(file: &[u8]) -> Result<Vec<Segment>, Error> {
    let magic = file.get(..4).ok_or(Error::NotACapture)?;
    let packets = match magic {
        [0x0a, 0x0d, 0x0d, 0x0a] => pcapng(file)?,
        _ => pcap(file)?,
    };
    let start = packets.first().map_or(0.0, |p| p.0);
    Ok(packets
        .into_iter()
        .filter_map(|(time, link, data)| tcp(link, data, time - start))
        .collect())
}

type Packet<'a> = (f64, u32, &'a [u8]);

fn u16_at(b: &[u8], at: usize, big: bool) -> Option<u16> {
    let bytes: [u8; 2] = b.get(at..at + 2)?.try_into().ok()?;
    Some(if big {
        u16::from_be_bytes(bytes)
    } else {
        u16::from_le_bytes(bytes)
    })
}

fn u32_at(b: &[u8], at: usize, big: bool) -> Option<u32> {
    let bytes: [u8; 4] = b.get(at..at + 4)?.try_into().ok()?;
    Some(if big {
        u32::from_be_bytes(bytes)
    } else {
        u32::from_le_bytes(bytes)
    })
}

fn pcap(file: &[u8]) -> Result<Vec<Packet<'_>>, Error> {
    let (big, nanos) = match file.get(..4) {
        Some([0xd4, 0xc3, 0xb2, 0xa1]) => (false, false),
        Some([0xa1, 0xb2, 0xc3, 0xd4]) => (true, false),
        Some([0x4d, 0x3c, 0xb2, 0xa1]) => (false, true),
        Some([0xa1, 0xb2, 0x3c, 0x4d]) => (true, true),
        _ => return Err(Error::NotACapture),
    };
    let link = u32_at(file, 20, big).ok_or(Error::Truncated)?;
    let mut packets = Vec::new();
    let mut at = 24;
    while at < file.len() {
        let (Some(sec), Some(frac), Some(caplen)) = (
            u32_at(file, at, big),
            u32_at(file, at + 4, big),
            u32_at(file, at + 8, big),
        ) else {
            break;
        };
        let body = at + 16;
        let Some(data) = file.get(body..body + caplen as usize) else {
            break;
        };
        let scale = if nanos { 1e-9 } else { 1e-6 };
        packets.push((f64::from(sec) + f64::from(frac) * scale, link, data));
        at = body + caplen as usize;
    }
    Ok(packets)
}

fn pcapng(file: &[u8]) -> Result<Vec<Packet<'_>>, Error> {
    // The byte-order magic of the Section Header Block decides the order of
    // everything in the section.
    let mut big = match file.get(8..12) {
        Some([0x1a, 0x2b, 0x3c, 0x4d]) => true,
        Some([0x4d, 0x3c, 0x2b, 0x1a]) => false,
        _ => return Err(Error::NotACapture),
    };
    let mut links: Vec<(u32, f64)> = Vec::new();
    let mut packets = Vec::new();
    let mut at = 0;
    while let (Some(kind), Some(len)) = (u32_at(file, at, big), u32_at(file, at + 4, big)) {
        let len = len as usize;
        let Some(block) = file.get(at..at + len) else {
            break;
        };
        if len < 12 {
            break;
        }
        match kind {
            0x0a0d_0d0a => {
                big = block.get(8..12) == Some(&[0x1a, 0x2b, 0x3c, 0x4d]);
                links.clear();
            }
            // Interface Description Block: link type, and if_tsresol.
            1 => {
                let link = u32::from(u16_at(block, 8, big).unwrap_or(0));
                let mut resolution = 1e-6;
                let mut opt = 16;
                while let (Some(code), Some(olen)) =
                    (u16_at(block, opt, big), u16_at(block, opt + 2, big))
                {
                    if code == 0 {
                        break;
                    }
                    if code == 9 {
                        if let Some(&r) = block.get(opt + 4) {
                            let exp = i32::from(r & 0x7f);
                            resolution = if r & 0x80 == 0 {
                                10f64.powi(-exp)
                            } else {
                                2f64.powi(-exp)
                            };
                        }
                    }
                    opt += 4 + usize::from(olen).next_multiple_of(4);
                }
                links.push((link, resolution));
            }
            // Enhanced Packet Block.
            6 => {
                let fields = (
                    u32_at(block, 8, big),
                    u32_at(block, 12, big),
                    u32_at(block, 16, big),
                    u32_at(block, 20, big),
                );
                if let (Some(iface), Some(hi), Some(lo), Some(caplen)) = fields {
                    if let (Some(&(link, res)), Some(data)) = (
                        links.get(iface as usize),
                        block.get(28..28 + caplen as usize),
                    ) {
                        let ticks = (u64::from(hi) << 32) | u64::from(lo);
                        packets.push((ticks as f64 * res, link, data));
                    }
                }
            }
            _ => {}
        }
        at += len;
    }
    Ok(packets)
}

/// The TCP segment in a link-layer frame, if it carries one.
fn tcp(link: u32, frame: &[u8], time: f64) -> Option<Segment> {
    let ip = match link {
        LINKTYPE_ETHERNET => {
            let mut at = 12;
            let mut ethertype = u16_at(frame, at, true)?;
            // 802.1Q tags.
            while ethertype == 0x8100 || ethertype == 0x88a8 {
                at += 4;
                ethertype = u16_at(frame, at, true)?;
            }
            frame.get(at + 2..)?
        }
        LINKTYPE_RAW | LINKTYPE_IPV4 | LINKTYPE_IPV6 => frame,
        LINKTYPE_NULL | LINKTYPE_LOOP => frame.get(4..)?,
        LINKTYPE_LINUX_SLL => frame.get(16..)?,
        LINKTYPE_LINUX_SLL2 => frame.get(20..)?,
        _ => return None,
    };
    let (src, dst, proto, l4) = match ip.first()? >> 4 {
        4 => {
            let ihl = usize::from(ip.first()? & 0x0f) * 4;
            let total = usize::from(u16_at(ip, 2, true)?).min(ip.len());
            let src: [u8; 4] = ip.get(12..16)?.try_into().ok()?;
            let dst: [u8; 4] = ip.get(16..20)?.try_into().ok()?;
            (
                IpAddr::V4(Ipv4Addr::from(src)),
                IpAddr::V4(Ipv4Addr::from(dst)),
                *ip.get(9)?,
                ip.get(ihl..total)?,
            )
        }
        6 => {
            let payload_len = usize::from(u16_at(ip, 4, true)?);
            let src: [u8; 16] = ip.get(8..24)?.try_into().ok()?;
            let dst: [u8; 16] = ip.get(24..40)?.try_into().ok()?;
            // Extension headers are not followed: TCP directly after the
            // fixed header is what our traffic looks like.
            let end = (40 + payload_len).min(ip.len());
            (
                IpAddr::V6(Ipv6Addr::from(src)),
                IpAddr::V6(Ipv6Addr::from(dst)),
                *ip.get(6)?,
                ip.get(40..end)?,
            )
        }
        _ => return None,
    };
    if proto != 6 {
        return None;
    }
    let offset = usize::from(l4.get(12)? >> 4) * 4;
    let flags = *l4.get(13)?;
    Some(Segment {
        time,
        src: SocketAddr::new(src, u16_at(l4, 0, true)?),
        dst: SocketAddr::new(dst, u16_at(l4, 2, true)?),
        seq: u32_at(l4, 4, true)?,
        syn: flags & 0x02 != 0,
        fin: flags & 0x01 != 0,
        rst: flags & 0x04 != 0,
        payload: l4.get(offset..)?.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pcap with one raw-IPv4 TCP segment carrying "hi".
    fn tiny_pcap() -> Vec<u8> {
        let mut ip = vec![
            0x45, 0, 0, 42, 0, 1, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        ip.extend_from_slice(&[0x9c, 0x40, 0x13, 0x88]); // ports 40000 -> 5000
        ip.extend_from_slice(&7u32.to_be_bytes());
        ip.extend_from_slice(&[0, 0, 0, 0, 0x50, 0x18, 0xff, 0xff, 0, 0, 0, 0]);
        ip.extend_from_slice(b"hi");
        let mut f = vec![0xd4, 0xc3, 0xb2, 0xa1, 2, 0, 4, 0];
        f.extend_from_slice(&[0; 8]);
        f.extend_from_slice(&65535u32.to_le_bytes());
        f.extend_from_slice(&LINKTYPE_RAW.to_le_bytes());
        f.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
        f.extend_from_slice(&(ip.len() as u32).to_le_bytes());
        f.extend_from_slice(&(ip.len() as u32).to_le_bytes());
        f.extend_from_slice(&ip);
        f
    }

    #[test]
    fn reads_a_tcp_segment() {
        let segs = segments(&tiny_pcap()).unwrap();
        assert_eq!(
            segs,
            vec![Segment {
                time: 0.0,
                src: "10.0.0.1:40000".parse().unwrap(),
                dst: "10.0.0.2:5000".parse().unwrap(),
                seq: 7,
                syn: false,
                fin: false,
                rst: false,
                payload: b"hi".to_vec(),
            }]
        );
    }

    #[test]
    fn truncated_files_do_not_panic() {
        let f = tiny_pcap();
        for len in 0..f.len() {
            let _ = segments(&f[..len]);
        }
        assert_eq!(segments(b"nope").unwrap_err(), Error::NotACapture);
    }
}
