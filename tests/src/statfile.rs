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
    /// Transmit and receive mode: 0 n/a (TCP), 1 Combined, 2 Buffered,
    /// 3 Pipelined.
    pub tx_mode: u8,
    pub rx_mode: u8,
    pub flags: u8,
    pub local: Option<SocketAddr>,
    pub peer: Option<SocketAddr>,
    pub counters: [u64; 6],
    /// Of the Bcopy bytes, sent straight from the application's buffer and
    /// received straight into a waiting reader's buffer.
    pub direct: [u64; 2],
    /// Messages sent: SrcAvail, SinkAvail, SendSm, cancels (SrcAvailCancel
    /// and SinkAvailCancel), ModeChange.
    pub messages: [u64; 5],
    /// Received bytes copied from a Private Buffer into the reader's
    /// buffer, and bytes copied back into a Private Buffer.
    pub copied: [u64; 2],
    /// Receive buffers advertised to the peer, and send credits from it.
    pub local_credits: u32,
    pub remote_credits: u32,
    /// The same-host path: bit 16 our ring offered, the low bits the send
    /// direction (1: writing into the peer's ring).
    pub same_host: u32,
    /// Same-host bytes written into the peer's ring, and into ours.
    pub same_host_bytes: [u64; 2],
    /// Waits for the peer (blocking reads, a blocking connect): ended
    /// while polling, slept.
    pub waits: [u64; 2],
}

/// A decoded file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatFile {
    pub pid: u32,
    /// Start time of the process (clock ticks since boot).
    pub start_time: u64,
    pub program: String,
    pub records: Vec<Record>,
    /// Sockets that went over TCP, by reason number (header 128..256).
    pub tcp_by_reason: [u64; 16],
    /// Sockets that went over SDP, closed ones included (header 104..112).
    pub sdp_connections: u64,
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

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    v.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(v)
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
            .chunks(224)
            .any(|r| r.len() >= 4 && u32_at(r, 0) % 2 == 1)
}

/// Decodes a file (panics on anything the document does not allow).
pub fn parse(bytes: &[u8]) -> StatFile {
    assert!(bytes.len() >= 4096, "header is one page");
    assert_eq!(&bytes[0..8], b"SDPSTAT1");
    assert_eq!(u32_at(bytes, 8), 5, "version");
    let header_len = u32_at(bytes, 12) as usize;
    let record_len = u32_at(bytes, 16) as usize;
    assert_eq!((header_len, record_len), (4096, 224));
    let name = &bytes[32..96];
    let end = name.iter().position(|&c| c == 0).unwrap_or(64);
    let mut file = StatFile {
        pid: u32_at(bytes, 20),
        start_time: u64_at(bytes, 24),
        program: String::from_utf8_lossy(&name[..end]).into_owned(),
        records: Vec::new(),
        tcp_by_reason: std::array::from_fn(|i| u64_at(bytes, 128 + 8 * i)),
        sdp_connections: u64_at(bytes, 104),
    };
    assert_eq!((bytes.len() - header_len) % record_len, 0);
    for (fd, r) in bytes[header_len..].chunks(record_len).enumerate() {
        assert_eq!(u32_at(r, 0) % 2, 0, "record {fd} caught mid-update");
        if r[4] == 0 {
            continue;
        }
        let mut counters = [0u64; 6];
        for (i, c) in counters.iter_mut().enumerate() {
            *c = u64_at(r, 56 + 8 * i);
        }
        let mut messages = [0u64; 5];
        for (i, m) in messages.iter_mut().enumerate() {
            *m = u64_at(r, 128 + 8 * i);
        }
        assert_eq!(u32_at(r, 188), 0, "record {fd}: reserved bytes");
        file.records.push(Record {
            fd,
            transport: r[5],
            role: r[6],
            want: r[7],
            decided_by: r[8],
            reason: r[9],
            rule: u16_at(r, 10),
            tx_mode: r[12],
            rx_mode: r[13],
            flags: r[14],
            local: addr(&r[16..36]),
            peer: addr(&r[36..56]),
            counters,
            direct: [u64_at(r, 112), u64_at(r, 120)],
            messages,
            copied: [u64_at(r, 168), u64_at(r, 176)],
            local_credits: u32_at(r, 104),
            remote_credits: u32_at(r, 108),
            same_host: u32_at(r, 184),
            same_host_bytes: [u64_at(r, 192), u64_at(r, 200)],
            waits: [u64_at(r, 208), u64_at(r, 216)],
        });
    }
    file
}

/// Reads `<dir>/<pid>.stat` from a running process the way the document
/// says: a record is taken only when its sequence word is even and the
/// same on a second read, so a snapshot never holds a half-written record
/// (records are taken one by one; the snapshot is not atomic as a whole).
pub fn snapshot(dir: &Path, pid: u32) -> std::io::Result<StatFile> {
    snapshot_path(&dir.join(format!("{pid}.stat")))
}

fn snapshot_path(path: &Path) -> std::io::Result<StatFile> {
    const RECORD: usize = 224;
    const HEADER: usize = 4096;
    let mut prev = std::fs::read(path)?;
    let mut taken: Vec<Option<Vec<u8>>> = Vec::new();
    for _ in 0..10_000 {
        let next = std::fs::read(path)?;
        if prev.len() < HEADER || prev.len() != next.len() {
            // Not yet written, or grown between the reads: start again.
            taken.clear();
            prev = next;
            continue;
        }
        if &prev[0..8] != b"SDPSTAT1"
            || u32_at(&prev, 8) != 5
            || u32_at(&prev, 12) as usize != HEADER
            || u32_at(&prev, 16) as usize != RECORD
            || !(prev.len() - HEADER).is_multiple_of(RECORD)
        {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{}: not a version 5 state export file", path.display()),
            ));
        }
        let records = (prev.len() - HEADER) / RECORD;
        taken.resize(records, None);
        for (i, slot) in taken.iter_mut().enumerate() {
            let at = HEADER + i * RECORD;
            let (a, b) = (u32_at(&prev, at), u32_at(&next, at));
            if slot.is_none() && a % 2 == 0 && a == b {
                *slot = Some(prev[at..at + RECORD].to_vec());
            }
        }
        if taken.iter().all(Option::is_some) {
            let mut bytes = prev[..HEADER].to_vec();
            for r in &taken {
                bytes.extend_from_slice(r.as_deref().unwrap_or_default());
            }
            return Ok(parse(&bytes));
        }
        prev = next;
    }
    Err(std::io::Error::other(format!(
        "{}: records never stable",
        path.display()
    )))
}

/// Whether `pid` is still the process that started at `start_time`
/// (`/proc/<pid>/stat` field 22), as the document tells readers to check.
pub fn is_live(pid: u32, start_time: u64) -> bool {
    let Ok(text) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The command name (field 2) may hold spaces and parentheses: count
    // fields from the last ')'.
    let Some(rest) = text.rsplit_once(')').map(|(_, r)| r) else {
        return false;
    };
    rest.split_whitespace()
        .nth(22 - 3)
        .and_then(|f| f.parse::<u64>().ok())
        == Some(start_time)
}

/// Snapshots of every file in `dir` whose process still runs (files of
/// ended processes, and files that vanish while being read, are skipped).
pub fn live(dir: &Path) -> Vec<StatFile> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".stat"))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Ok(f) = snapshot(dir, pid) {
            if is_live(f.pid, f.start_time) {
                files.push(f);
            }
        }
    }
    files.sort_by_key(|f| f.pid);
    files
}
