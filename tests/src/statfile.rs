//! An independent reader of the preload's state export files, written from
//! the format in `docs/preload.md` (not from the preload's own code), so
//! the end-to-end tests check the documented format.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::Path;

/// One in-use record, fields named as in the document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub fd: usize,
    pub transport: u8,
    pub role: u8,
    pub want: u8,
    pub decided_by: u8,
    pub reason: u8,
    pub rule: u16,
    pub flags: u8,
    pub local: Option<SocketAddr>,
    pub peer: Option<SocketAddr>,
    pub counters: [u64; 6],
}

/// A decoded file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatFile {
    pub pid: u32,
    pub program: String,
    pub records: Vec<Record>,
}

impl StatFile {
    pub fn record(&self, fd: usize) -> Option<&Record> {
        self.records.iter().find(|r| r.fd == fd)
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn addr(b: &[u8]) -> Option<SocketAddr> {
    let port = u16_at(b, 2);
    match u16_at(b, 0) {
        4 => Some(SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(b[4], b[5], b[6], b[7])),
            port,
        )),
        6 => {
            let mut o = [0u8; 16];
            o.copy_from_slice(&b[4..20]);
            Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(o)), port))
        }
        _ => None,
    }
}

/// Reads `<dir>/<pid>.stat`. A record caught mid-update (odd sequence:
/// the library publishes statistics in the background too) is read again,
/// as the document says.
pub fn read(dir: &Path, pid: u32) -> std::io::Result<StatFile> {
    let path = dir.join(format!("{pid}.stat"));
    let mut bytes = std::fs::read(&path)?;
    for _ in 0..1000 {
        if !torn(&bytes) {
            break;
        }
        std::thread::yield_now();
        bytes = std::fs::read(&path)?;
    }
    Ok(parse(&bytes))
}

/// Whether a record of the snapshot is being written (odd sequence).
fn torn(bytes: &[u8]) -> bool {
    bytes.len() > 4096
        && bytes[4096..]
            .chunks(128)
            .any(|r| r.len() >= 4 && u32_at(r, 0) % 2 == 1)
}

/// Decodes a file (panics on anything the document does not allow).
pub fn parse(bytes: &[u8]) -> StatFile {
    assert!(bytes.len() >= 4096, "header is one page");
    assert_eq!(&bytes[0..8], b"SDPSTAT1");
    assert_eq!(u32_at(bytes, 8), 1, "version");
    let header_len = u32_at(bytes, 12) as usize;
    let record_len = u32_at(bytes, 16) as usize;
    assert_eq!((header_len, record_len), (4096, 128));
    let name = &bytes[32..96];
    let end = name.iter().position(|&c| c == 0).unwrap_or(64);
    let mut file = StatFile {
        pid: u32_at(bytes, 20),
        program: String::from_utf8_lossy(&name[..end]).into_owned(),
        records: Vec::new(),
    };
    assert_eq!((bytes.len() - header_len) % record_len, 0);
    for (fd, r) in bytes[header_len..].chunks(record_len).enumerate() {
        assert_eq!(u32_at(r, 0) % 2, 0, "record {fd} caught mid-update");
        if r[4] == 0 {
            continue;
        }
        let mut counters = [0u64; 6];
        for (i, c) in counters.iter_mut().enumerate() {
            let mut v = [0u8; 8];
            v.copy_from_slice(&r[56 + 8 * i..64 + 8 * i]);
            *c = u64::from_le_bytes(v);
        }
        file.records.push(Record {
            fd,
            transport: r[5],
            role: r[6],
            want: r[7],
            decided_by: r[8],
            reason: r[9],
            rule: u16_at(r, 10),
            flags: r[14],
            local: addr(&r[16..36]),
            peer: addr(&r[36..56]),
            counters,
        });
    }
    file
}
