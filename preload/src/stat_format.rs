//! The format of the state export files (`docs/preload.md`, "State
//! export"): constants, field offsets, and the reader. Self-contained (no
//! other module of the library), so that `sdp-stat` includes this file
//! without linking the library and its interposed functions.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// First 8 bytes of the file.
pub const MAGIC: [u8; 8] = *b"SDPSTAT1";
/// Format version (header offset 8). Version 4 added the fallback counters
/// and the port mapper cache to the header; a version 3 file reads as one
/// with neither. Version 5 added [`field::WAITS`] to the record; an older
/// file's records read as ones with no waits.
pub const VERSION: u32 = 5;
/// The oldest version [`parse`] reads.
pub const MIN_VERSION: u32 = 3;
/// Bytes before record 0 (one page).
pub const HEADER_LEN: usize = 4096;
/// Bytes per record; record `n` (fd `n`) is at `HEADER_LEN + n * RECORD_LEN`.
pub const RECORD_LEN: usize = 224;
/// Bytes per record of the oldest version [`parse`] reads.
const MIN_RECORD_LEN: usize = 208;

// Every field lies inside a record (the writer reads and writes them in
// place).
const _: () = assert!(field::WAITS.end <= RECORD_LEN);

/// Byte ranges of the header and of a record.
pub mod field {
    // Header.
    pub const H_MAGIC: std::ops::Range<usize> = 0..8;
    pub const H_VERSION: std::ops::Range<usize> = 8..12;
    pub const H_HEADER_LEN: std::ops::Range<usize> = 12..16;
    pub const H_RECORD_LEN: std::ops::Range<usize> = 16..20;
    pub const H_PID: std::ops::Range<usize> = 20..24;
    pub const H_START: std::ops::Range<usize> = 24..32;
    pub const H_PROGRAM: std::ops::Range<usize> = 32..96;
    /// Sequence word of the fallback counters and the cache: odd while
    /// the writer changes them.
    pub const H_SEQ: std::ops::Range<usize> = 96..100;
    /// Sockets of this process that went over SDP (connected or
    /// accepted), one u64: counted as each goes, written within the
    /// state export's interval (zero in files of writers before it).
    pub const H_SDP_CONNECTIONS: std::ops::Range<usize> = 104..112;
    /// Sockets of this process that went over TCP, by reason (index: the
    /// `table::TcpReason` number), one u64 each.
    pub const H_FALLBACKS: std::ops::Range<usize> = 128..256;
    /// Entries in use of `H_PM_CACHE`.
    pub const H_PM_CACHE_LEN: std::ops::Range<usize> = 256..260;
    /// The port mapper client's cache: `PM_CACHE_MAX` entries of
    /// `PM_ENTRY_LEN` bytes (`PM_KEY`, `PM_KIND`, `PM_SDP_PORT`,
    /// `PM_EXPIRES`).
    pub const H_PM_CACHE: std::ops::Range<usize> =
        512..512 + super::PM_CACHE_MAX * super::PM_ENTRY_LEN;
    /// Cache entry: the service (address and port) or, with port 0 and
    /// `PM_KIND_HOST`, the host, as a record's address field.
    pub const PM_KEY: std::ops::Range<usize> = 0..20;
    /// Cache entry: `PM_SDP`, `PM_DENY`, `PM_NO_ANSWER` or
    /// `PM_UNREACHABLE`, plus `PM_KIND_HOST` for a host entry.
    pub const PM_KIND: usize = 20;
    /// Cache entry: the SDP port of a `PM_SDP` answer.
    pub const PM_SDP_PORT: std::ops::Range<usize> = 22..24;
    /// Cache entry: when it expires, CLOCK_MONOTONIC in milliseconds;
    /// `u64::MAX` is never.
    pub const PM_EXPIRES: std::ops::Range<usize> = 24..32;
    // Record.
    pub const SEQ: std::ops::Range<usize> = 0..4;
    pub const IN_USE: usize = 4;
    pub const TRANSPORT: usize = 5;
    pub const ROLE: usize = 6;
    pub const WANT: usize = 7;
    pub const DECIDED_BY: usize = 8;
    pub const REASON: usize = 9;
    pub const RULE: std::ops::Range<usize> = 10..12;
    pub const TX_MODE: usize = 12;
    pub const RX_MODE: usize = 13;
    pub const FLAGS: usize = 14;
    pub const LOCAL: std::ops::Range<usize> = 16..36;
    pub const PEER: std::ops::Range<usize> = 36..56;
    pub const COUNTERS: std::ops::Range<usize> = 56..104;
    pub const LOCAL_CREDITS: std::ops::Range<usize> = 104..108;
    pub const REMOTE_CREDITS: std::ops::Range<usize> = 108..112;
    /// Bcopy bytes sent and received without a copy (DESIGN §7).
    pub const DIRECT: std::ops::Range<usize> = 112..128;
    /// Messages this end sent: SrcAvail, SinkAvail, SendSm, SrcAvailCancel
    /// and SinkAvailCancel, ModeChange.
    pub const MESSAGES: std::ops::Range<usize> = 128..168;
    /// Received bytes copied from a Private Buffer into the reader's
    /// buffer, and bytes that had to go back into a Private Buffer.
    pub const COPIED: std::ops::Range<usize> = 168..184;
    /// The same-host path (`sdp_core::conn::local::code`).
    pub const SAME_HOST: std::ops::Range<usize> = 184..188;
    /// Reserved: zero.
    pub const RESERVED: std::ops::Range<usize> = 188..192;
    /// Bytes written into the peer's ring, and into ours by the peer.
    pub const SAME_HOST_BYTES: std::ops::Range<usize> = 192..208;
    /// Waits for the peer (a blocking read, a blocking connect's setup)
    /// that ended while polling the socket, and waits that slept.
    pub const WAITS: std::ops::Range<usize> = 208..224;
    /// What `publish` owns: everything but the sequence word and the
    /// engine's statistics.
    pub const ENTRY_PART: std::ops::Range<usize> = 4..56;
}

/// Fallback counters in the header (one per `table::TcpReason`).
pub const REASONS: usize = 16;
/// Most port mapper cache entries in the header.
pub const PM_CACHE_MAX: usize = 64;
/// Bytes per port mapper cache entry.
pub const PM_ENTRY_LEN: usize = 32;
/// Cache answers (`field::PM_KIND`).
pub const PM_SDP: u8 = 1;
pub const PM_DENY: u8 = 2;
pub const PM_NO_ANSWER: u8 = 3;
pub const PM_UNREACHABLE: u8 = 4;
/// Cache entry flag: the entry is about every port of a host.
pub const PM_KIND_HOST: u8 = 0x80;

const _: () = assert!(field::H_FALLBACKS.end - field::H_FALLBACKS.start == REASONS * 8);
const _: () = assert!(field::H_PM_CACHE.end <= HEADER_LEN);
// The counters the writer rewrites under `H_SEQ` are one range after it.
const _: () = assert!(
    field::H_SEQ.end <= field::H_SDP_CONNECTIONS.start
        && field::H_SDP_CONNECTIONS.end <= field::H_FALLBACKS.start
);

/// Record flag: created as `socket(AF_INET_SDP, ...)`.
pub const FLAG_FORCED: u8 = 1;
/// Record flag: an `AF_INET6` socket.
pub const FLAG_IPV6: u8 = 2;

// ---------------------------------------------------------------------
// Reading (for sdp-stat and the tests).

/// A decoded export file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessState {
    pub pid: u32,
    pub start_time: u64,
    pub program: String,
    pub records: Vec<Record>,
    /// Sockets that went over TCP, by `table::TcpReason` number.
    pub fallbacks: [u64; REASONS],
    /// Sockets that went over SDP, those closed since included.
    pub sdp_connections: u64,
    /// The port mapper client's cache when the file was read.
    pub pm_cache: Vec<PmCached>,
}

/// A port mapper cache entry of a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PmCached {
    /// The service; for a host entry, its address with port 0.
    pub key: SocketAddr,
    /// The entry is about every port of the host.
    pub host: bool,
    /// `PM_SDP`, `PM_DENY`, `PM_NO_ANSWER` or `PM_UNREACHABLE`.
    pub answer: u8,
    /// The SDP port of a `PM_SDP` answer.
    pub sdp_port: u16,
    /// CLOCK_MONOTONIC milliseconds at which it expires; `u64::MAX` never.
    pub expires_ms: u64,
}

/// One in-use record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    pub fd: u32,
    /// 0 undecided, 1 TCP, 2 SDP (`table::Transport`).
    pub transport: u8,
    /// `table::SocketRole` as a number.
    pub role: u8,
    /// 0 none, 1 sdp, 2 tcp, 3 both.
    pub want: u8,
    /// `table::DecidedBy` as a number.
    pub decided_by: u8,
    /// `table::TcpReason` as a number.
    pub reason: u8,
    pub rule: u16,
    /// 0 (TCP), else `sdp::Mode`.
    pub tx_mode: u8,
    pub rx_mode: u8,
    pub flags: u8,
    pub local: Option<SocketAddr>,
    pub peer: Option<SocketAddr>,
    /// bcopy tx/rx, read zcopy tx/rx, write zcopy tx/rx.
    pub counters: [u64; 6],
    /// Of bcopy tx/rx, the bytes sent straight from the application's
    /// buffer and received straight into it.
    pub direct: [u64; 2],
    /// Messages sent: SrcAvail, SinkAvail, SendSm, cancels, ModeChange.
    pub messages: [u64; 5],
    /// Received bytes copied from a Private Buffer into the reader's
    /// buffer, and bytes copied back into a Private Buffer.
    pub copied: [u64; 2],
    pub local_credits: u32,
    pub remote_credits: u32,
    /// The same-host path (`sdp_core::conn::local::code`).
    pub same_host: u32,
    /// Bytes written into the peer's ring, and into ours by the peer.
    pub same_host_bytes: [u64; 2],
    /// Waits for the peer (a blocking read, a blocking connect's setup)
    /// that ended while polling the socket, and waits that slept.
    pub waits: [u64; 2],
}

/// Why an export file could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseError {
    Truncated,
    BadMagic,
    UnsupportedVersion(u32),
    /// A record stayed mid-update (odd sequence) in the snapshot.
    Torn(u32),
    /// The header's counters or cache were mid-update.
    TornHeader,
}

/// CLOCK_MONOTONIC in milliseconds: the clock of the cache entries'
/// expiry, which every process of the host shares.
pub fn monotonic_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid out-parameter.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    (ts.tv_sec as u64).saturating_mul(1000) + (ts.tv_nsec as u64) / 1_000_000
}

pub fn le_u16(b: &[u8]) -> u16 {
    u16::from_le_bytes([b[0], b[1]])
}
pub fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}
pub fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Consecutive u64s (`N` of them: the length of a field).
fn le_u64s<const N: usize>(b: &[u8]) -> [u64; N] {
    let mut out = [0; N];
    for (v, c) in out.iter_mut().zip(b.chunks_exact(8)) {
        *v = le_u64(c);
    }
    out
}

fn parse_addr(b: &[u8]) -> Option<SocketAddr> {
    let port = le_u16(&b[2..4]);
    match le_u16(&b[0..2]) {
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

/// Decodes a snapshot of an export file. A reader that finds a record
/// with an odd sequence number re-reads that record (`Torn`).
pub fn parse(bytes: &[u8]) -> Result<ProcessState, ParseError> {
    let h = bytes.get(..HEADER_LEN).ok_or(ParseError::Truncated)?;
    if h[field::H_MAGIC] != MAGIC {
        return Err(ParseError::BadMagic);
    }
    let version = le_u32(&h[field::H_VERSION]);
    if !(MIN_VERSION..=VERSION).contains(&version) {
        return Err(ParseError::UnsupportedVersion(version));
    }
    let header_len = le_u32(&h[field::H_HEADER_LEN]) as usize;
    let record_len = le_u32(&h[field::H_RECORD_LEN]) as usize;
    if record_len < MIN_RECORD_LEN || header_len < HEADER_LEN {
        return Err(ParseError::Truncated);
    }
    let program = &h[field::H_PROGRAM];
    let end = program
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(program.len());
    let mut state = ProcessState {
        pid: le_u32(&h[field::H_PID]),
        start_time: le_u64(&h[field::H_START]),
        program: String::from_utf8_lossy(&program[..end]).into_owned(),
        records: Vec::new(),
        fallbacks: [0; REASONS],
        sdp_connections: 0,
        pm_cache: Vec::new(),
    };
    if version >= 4 {
        if le_u32(&h[field::H_SEQ]) & 1 == 1 {
            return Err(ParseError::TornHeader);
        }
        state.fallbacks = le_u64s(&h[field::H_FALLBACKS]);
        state.sdp_connections = le_u64(&h[field::H_SDP_CONNECTIONS]);
        let n = (le_u32(&h[field::H_PM_CACHE_LEN]) as usize).min(PM_CACHE_MAX);
        for e in h[field::H_PM_CACHE].chunks_exact(PM_ENTRY_LEN).take(n) {
            let Some(key) = parse_addr(&e[field::PM_KEY]) else {
                continue;
            };
            state.pm_cache.push(PmCached {
                key,
                host: e[field::PM_KIND] & PM_KIND_HOST != 0,
                answer: e[field::PM_KIND] & !PM_KIND_HOST,
                sdp_port: le_u16(&e[field::PM_SDP_PORT]),
                expires_ms: le_u64(&e[field::PM_EXPIRES]),
            });
        }
    }
    let body = bytes.get(header_len..).unwrap_or(&[]);
    for (fd, r) in body.chunks_exact(record_len).enumerate() {
        let seq = le_u32(&r[field::SEQ]);
        if seq & 1 == 1 {
            return Err(ParseError::Torn(fd as u32));
        }
        if r[field::IN_USE] == 0 {
            continue;
        }
        state.records.push(Record {
            fd: fd as u32,
            transport: r[field::TRANSPORT],
            role: r[field::ROLE],
            want: r[field::WANT],
            decided_by: r[field::DECIDED_BY],
            reason: r[field::REASON],
            rule: le_u16(&r[field::RULE]),
            tx_mode: r[field::TX_MODE],
            rx_mode: r[field::RX_MODE],
            flags: r[field::FLAGS],
            local: parse_addr(&r[field::LOCAL]),
            peer: parse_addr(&r[field::PEER]),
            counters: le_u64s(&r[field::COUNTERS]),
            direct: le_u64s(&r[field::DIRECT]),
            messages: le_u64s(&r[field::MESSAGES]),
            copied: le_u64s(&r[field::COPIED]),
            local_credits: le_u32(&r[field::LOCAL_CREDITS]),
            remote_credits: le_u32(&r[field::REMOTE_CREDITS]),
            same_host: le_u32(&r[field::SAME_HOST]),
            same_host_bytes: le_u64s(&r[field::SAME_HOST_BYTES]),
            waits: r.get(field::WAITS).map_or([0; 2], le_u64s),
        });
    }
    Ok(state)
}
