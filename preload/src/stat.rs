//! State export for `sdp-stat`: each preloaded process that manages a
//! socket publishes one file, `<dir>/<pid>.stat`, a header and one fixed
//! 224-byte record per fd number, mapped shared into the process and
//! updated in place (a sequence counter per record, no syscall per update).
//! The format is documented in `docs/preload.md`; [`parse`] reads it.
//!
//! `<dir>` is `$SDP_STAT_DIR`, else `$XDG_RUNTIME_DIR/sdp`, else
//! `/tmp/sdp-<uid>`, created with mode 0700. `SDP_STAT=0` turns the export
//! off. The file is created with the first managed socket, replaced in a
//! forked child by its own file, written from the child's fd table, removed at `exit` and at the start of a
//! program that `exec`'d in the same process (a killed process leaves its
//! file: readers skip files whose pid no longer runs that start time).
//!
//! Every writer holds the fd's slot lock in [`crate::table`] (or is the
//! only thread, in a forked child), so each record has one writer at a time.

use crate::rules::Family;
use crate::sdp::Stats;
use crate::stat_format;
use crate::sys::real;
use crate::table::{self, Entry, SocketRole, TcpReason, Transport, CHUNK};
use portmapper::client::{CacheEntry, CacheKey, Decision, Fallback};
use std::ffi::CString;
use std::net::SocketAddr;
use std::ops::Range;
use std::ptr;
use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Mutex;

use crate::stat_format::{field, le_u64, monotonic_ms};
pub use crate::stat_format::{
    parse, ParseError, ProcessState, Record, FLAG_FORCED, FLAG_IPV6, HEADER_LEN, MAGIC, RECORD_LEN,
    VERSION,
};
use crate::stat_format::{PM_CACHE_MAX, PM_ENTRY_LEN, REASONS};
const CHUNK_BYTES: usize = CHUNK * RECORD_LEN;
const CHUNKS: usize = 4096;

#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Status {
    Unknown = 0,
    Ready = 1,
    Off = 2,
}

static STATUS: AtomicU8 = AtomicU8::new(Status::Unknown as u8);
static MAPS: [AtomicPtr<u8>; CHUNKS] = [const { AtomicPtr::new(ptr::null_mut()) }; CHUNKS];

/// The open export file (created lazily).
struct File {
    fd: libc::c_int,
    path: CString,
    len: usize,
}

static FILE: Mutex<Option<File>> = Mutex::new(None);

/// Sockets that went over TCP, by reason (the header's `H_FALLBACKS`).
static FALLBACKS: [AtomicU64; REASONS] = [const { AtomicU64::new(0) }; REASONS];

/// Sockets that went over SDP (the header's `H_SDP_CONNECTIONS`), and the
/// count the file has: a connection's setup writes no header, the
/// export's periodic pass does ([`publish_counts`]).
static SDP_CONNECTIONS: AtomicU64 = AtomicU64::new(0);
static SDP_CONNECTIONS_WRITTEN: AtomicU64 = AtomicU64::new(0);

/// The header's port mapper cache part: entries in use and their bytes.
/// Taken only with [`FILE`] held (the one lock order).
static PM_CACHE: Mutex<(u32, [u8; PM_CACHE_MAX * PM_ENTRY_LEN])> =
    Mutex::new((0, [0; PM_CACHE_MAX * PM_ENTRY_LEN]));

/// The header's sequence word (`H_SEQ`), even between updates.
static HEADER_SEQ: AtomicU32 = AtomicU32::new(0);

/// The directory files go to (`None` if the export is off).
pub fn directory() -> Option<String> {
    // Unit tests run in one process with many threads: no export files.
    if cfg!(test) {
        return None;
    }
    if std::env::var("SDP_STAT").is_ok_and(|v| v == "0") {
        return None;
    }
    if let Ok(dir) = std::env::var("SDP_STAT_DIR") {
        if !dir.is_empty() {
            return Some(dir);
        }
    }
    if let Ok(run) = std::env::var("XDG_RUNTIME_DIR") {
        if !run.is_empty() {
            return Some(format!("{run}/sdp"));
        }
    }
    // SAFETY: getuid has no preconditions.
    Some(format!("/tmp/sdp-{}", unsafe { libc::getuid() }))
}

fn own_path(dir: &str) -> Option<CString> {
    // SAFETY: getpid has no preconditions.
    CString::new(format!("{dir}/{}.stat", unsafe { libc::getpid() })).ok()
}

/// At library start: decides whether the export is on, and removes a file
/// left under our pid by the program this process was before `exec`.
pub fn init() {
    table::set_publisher(table::Publisher {
        entry: publish,
        stats: publish_stats,
    });
    match directory() {
        None => STATUS.store(Status::Off as u8, Ordering::Relaxed),
        Some(dir) => {
            if let Some(path) = own_path(&dir) {
                // SAFETY: path is NUL-terminated.
                unsafe { libc::unlink(path.as_ptr()) };
            }
        }
    }
}

/// Clock ticks since boot at which this process started (/proc stat field
/// 22), which with the pid identifies it.
fn start_time() -> u64 {
    let Ok(text) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    // The command name (field 2) may hold spaces; fields resume after ')'.
    text.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().nth(19))
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

fn header() -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[field::H_MAGIC].copy_from_slice(&MAGIC);
    h[field::H_VERSION].copy_from_slice(&VERSION.to_le_bytes());
    h[field::H_HEADER_LEN].copy_from_slice(&(HEADER_LEN as u32).to_le_bytes());
    h[field::H_RECORD_LEN].copy_from_slice(&(RECORD_LEN as u32).to_le_bytes());
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() } as u32;
    h[field::H_PID].copy_from_slice(&pid.to_le_bytes());
    h[field::H_START].copy_from_slice(&start_time().to_le_bytes());
    let name = crate::config::program().as_bytes();
    let n = name.len().min(field::H_PROGRAM.len() - 1);
    h[field::H_PROGRAM.start..field::H_PROGRAM.start + n].copy_from_slice(&name[..n]);
    extras(&mut h);
    h
}

/// Fills the header's counters and cache from the process's figures.
fn extras(h: &mut [u8; HEADER_LEN]) {
    for (b, n) in h[field::H_FALLBACKS].chunks_exact_mut(8).zip(&FALLBACKS) {
        b.copy_from_slice(&n.load(Ordering::Relaxed).to_le_bytes());
    }
    let sdp = SDP_CONNECTIONS.load(Ordering::Relaxed);
    h[field::H_SDP_CONNECTIONS].copy_from_slice(&sdp.to_le_bytes());
    SDP_CONNECTIONS_WRITTEN.store(sdp, Ordering::Relaxed);
    let cache = PM_CACHE.lock().unwrap_or_else(|p| p.into_inner());
    h[field::H_PM_CACHE_LEN].copy_from_slice(&cache.0.to_le_bytes());
    h[field::H_PM_CACHE].copy_from_slice(&cache.1);
}

/// Rewrites the header's counters and cache in the file, under its
/// sequence word. Called with [`FILE`] held.
fn write_extras(file: &File) {
    let mut h = [0u8; HEADER_LEN];
    extras(&mut h);
    let s = HEADER_SEQ.load(Ordering::Relaxed);
    let seq = |v: u32| v.to_le_bytes();
    pwrite_all(file.fd, &seq(s | 1), field::H_SEQ.start);
    let body = field::H_SDP_CONNECTIONS.start..field::H_PM_CACHE.end;
    pwrite_all(file.fd, &h[body.clone()], body.start);
    let next = (s | 1).wrapping_add(1);
    pwrite_all(file.fd, &seq(next), field::H_SEQ.start);
    HEADER_SEQ.store(next, Ordering::Relaxed);
}

/// Counts a socket that went over TCP for `reason`.
fn count_fallback(reason: TcpReason) {
    if let Some(n) = FALLBACKS.get(reason as usize) {
        n.fetch_add(1, Ordering::Relaxed);
    }
    rewrite_extras();
}

/// Writes the header's counters if a connection went over SDP since they
/// were last written (the export's periodic pass).
pub fn publish_counts() {
    if SDP_CONNECTIONS.load(Ordering::Relaxed) != SDP_CONNECTIONS_WRITTEN.load(Ordering::Relaxed) {
        rewrite_extras();
    }
}

/// [`write_extras`] to the file, if there is one.
fn rewrite_extras() {
    if let Ok(guard) = FILE.lock() {
        if let Some(file) = guard.as_ref() {
            write_extras(file);
        }
    }
}

/// Publishes the port mapper client's cache (after each change to it):
/// `snapshot` lists it, taken under the file's lock so that of two
/// threads the later snapshot is the one written last.
pub fn publish_pm_cache(snapshot: impl FnOnce() -> Vec<CacheEntry>) {
    let Ok(guard) = FILE.lock() else { return };
    let entries = snapshot();
    let now = monotonic_ms();
    let mut bytes = [0u8; PM_CACHE_MAX * PM_ENTRY_LEN];
    let mut n = 0;
    for (e, out) in entries.iter().zip(bytes.chunks_exact_mut(PM_ENTRY_LEN)) {
        let (key, host) = match e.key {
            CacheKey::Service(a) => (a, 0),
            CacheKey::Host(ip) => (SocketAddr::new(ip, 0), stat_format::PM_KIND_HOST),
        };
        let (answer, sdp_port) = match e.decision {
            Decision::Sdp(a) => (stat_format::PM_SDP, a.port()),
            Decision::Tcp(Fallback::Denied) => (stat_format::PM_DENY, 0),
            Decision::Tcp(Fallback::NoAnswer) => (stat_format::PM_NO_ANSWER, 0),
            Decision::Tcp(Fallback::Unreachable) => (stat_format::PM_UNREACHABLE, 0),
        };
        let expires = e.expires_in.map_or(u64::MAX, |d| {
            now.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        });
        out[field::PM_KEY].copy_from_slice(&addr_bytes(Some(key)));
        out[field::PM_KIND] = answer | host;
        out[field::PM_SDP_PORT].copy_from_slice(&sdp_port.to_le_bytes());
        out[field::PM_EXPIRES].copy_from_slice(&expires.to_le_bytes());
        n += 1;
    }
    {
        let mut published = PM_CACHE.lock().unwrap_or_else(|p| p.into_inner());
        // A query that changed nothing (PmTime 0, a cache that says the
        // same) leaves the file as it is.
        if *published == (n, bytes) {
            return;
        }
        *published = (n, bytes);
    }
    if let Some(file) = guard.as_ref() {
        write_extras(file);
    }
}

fn pwrite_all(fd: libc::c_int, bytes: &[u8], offset: usize) -> bool {
    let mut done = 0;
    while done < bytes.len() {
        // SAFETY: the range is inside `bytes`.
        let n = unsafe {
            libc::pwrite(
                fd,
                bytes[done..].as_ptr().cast(),
                bytes.len() - done,
                (offset + done) as libc::off_t,
            )
        };
        if n <= 0 {
            if n < 0 && real::errno() == libc::EINTR {
                continue;
            }
            return false;
        }
        done += n as usize;
    }
    true
}

/// Creates the directory and the file with its header. `first`: the
/// process's first file (a forked child inherited the parent's sweep of
/// stale files and its `atexit` handler, and registering another one could
/// take a lock a parent thread held at the fork).
fn create(dir: &str, first: bool) -> Option<File> {
    let cdir = CString::new(dir).ok()?;
    // SAFETY: cdir is NUL-terminated.
    unsafe { libc::mkdir(cdir.as_ptr(), 0o700) };
    // Refuse a directory someone else owns (or a symlink to one).
    // SAFETY: an all-zero stat is a valid out-parameter.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: cdir is NUL-terminated, st is a valid out-parameter.
    if unsafe { libc::lstat(cdir.as_ptr(), &mut st) } != 0
        || st.st_mode & libc::S_IFMT != libc::S_IFDIR
        // SAFETY: getuid has no preconditions.
        || st.st_uid != unsafe { libc::getuid() }
    {
        crate::log!(
            crate::log::Level::Warn,
            "state export off: {dir} is not our directory"
        );
        return None;
    }
    if first {
        remove_stale(dir);
    }
    let path = own_path(dir)?;
    // SAFETY: path is NUL-terminated.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC | libc::O_CLOEXEC | libc::O_NOFOLLOW,
            0o644,
        )
    };
    if fd < 0 {
        crate::log!(
            crate::log::Level::Warn,
            "state export off: cannot create {}",
            path.to_string_lossy()
        );
        return None;
    }
    if !pwrite_all(fd, &header(), 0) {
        // SAFETY: fd is ours.
        unsafe { real::close(fd) };
        return None;
    }
    if first {
        // SAFETY: the callback is a plain extern "C" fn without captures.
        unsafe { libc::atexit(remove_at_exit) };
    }
    Some(File {
        fd,
        path,
        len: HEADER_LEN,
    })
}

/// Removes the files of processes that are gone (a process that ends with
/// `_exit` or a signal cannot remove its own): the pid no longer exists,
/// or it is another process now (its start time differs).
fn remove_stale(dir: &str) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_suffix(".stat"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let alive = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => false,
            Ok(text) => {
                let started = text
                    .rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(19))
                    .and_then(|t| t.parse::<u64>().ok());
                let mut head = [0u8; 32];
                let recorded = std::fs::File::open(entry.path())
                    .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head))
                    .ok()
                    .map(|()| le_u64(&head[field::H_START]));
                // A file still being created has no start time yet.
                recorded.is_none_or(|r| r == 0 || Some(r) == started)
            }
        };
        if !alive {
            let _ = std::fs::remove_file(entry.path());
        }
    }
}

extern "C" fn remove_at_exit() {
    if let Ok(guard) = FILE.try_lock() {
        if let Some(f) = guard.as_ref() {
            // SAFETY: the path is NUL-terminated.
            unsafe { libc::unlink(f.path.as_ptr()) };
        }
    }
}

fn map_window(fd: libc::c_int, chunk: usize, at: *mut u8) -> *mut u8 {
    let flags = if at.is_null() {
        libc::MAP_SHARED
    } else {
        libc::MAP_SHARED | libc::MAP_FIXED
    };
    // SAFETY: maps CHUNK_BYTES of our own file at a page-aligned offset;
    // with MAP_FIXED, `at` is a window we mapped before with this size.
    let p = unsafe {
        libc::mmap(
            at.cast(),
            CHUNK_BYTES,
            libc::PROT_READ | libc::PROT_WRITE,
            flags,
            fd,
            (HEADER_LEN + chunk * CHUNK_BYTES) as libc::off_t,
        )
    };
    if p == libc::MAP_FAILED {
        ptr::null_mut()
    } else {
        p.cast()
    }
}

/// The mapped window of records `chunk * CHUNK ..`, creating the file and
/// the window if needed.
fn window(chunk: usize, create_it: bool) -> *mut u8 {
    let p = MAPS[chunk].load(Ordering::Acquire);
    if !p.is_null() || !create_it {
        return p;
    }
    if STATUS.load(Ordering::Relaxed) == Status::Off as u8 {
        return ptr::null_mut();
    }
    let Ok(mut guard) = FILE.lock() else {
        return ptr::null_mut();
    };
    let p = MAPS[chunk].load(Ordering::Acquire);
    if !p.is_null() {
        return p;
    }
    if guard.is_none() {
        let Some(dir) = directory() else {
            STATUS.store(Status::Off as u8, Ordering::Relaxed);
            return ptr::null_mut();
        };
        match create(&dir, true) {
            Some(f) => *guard = Some(f),
            None => {
                STATUS.store(Status::Off as u8, Ordering::Relaxed);
                return ptr::null_mut();
            }
        }
        STATUS.store(Status::Ready as u8, Ordering::Relaxed);
    }
    let Some(file) = guard.as_mut() else {
        return ptr::null_mut();
    };
    let end = HEADER_LEN + (chunk + 1) * CHUNK_BYTES;
    if end > file.len {
        // SAFETY: file.fd is our open file.
        if unsafe { libc::ftruncate(file.fd, end as libc::off_t) } != 0 {
            return ptr::null_mut();
        }
        file.len = end;
    }
    let p = map_window(file.fd, chunk, ptr::null_mut());
    MAPS[chunk].store(p, Ordering::Release);
    p
}

/// The record of `fd`, if its window exists (or can be made).
fn record(fd: i32, create_it: bool) -> Option<*mut u8> {
    let fd = usize::try_from(fd).ok()?;
    let chunk = fd / CHUNK;
    if chunk >= CHUNKS {
        return None;
    }
    let base = window(chunk, create_it);
    // SAFETY: the window holds CHUNK records.
    (!base.is_null()).then(|| unsafe { base.add((fd % CHUNK) * RECORD_LEN) })
}

/// Writes `bytes` at `range` of the record under its sequence counter.
fn write_record(rec: *mut u8, parts: &[(usize, &[u8])]) {
    // SAFETY: the record is RECORD_LEN bytes of a live shared mapping, its
    // first 4 bytes (4-aligned: the window is page-aligned and records are
    // 192 bytes) are used only as this atomic.
    let seq = unsafe { &*(rec as *const AtomicU32) };
    let s = seq.load(Ordering::Relaxed);
    seq.store(s.wrapping_add(1) | 1, Ordering::Relaxed);
    fence(Ordering::Release);
    for (offset, bytes) in parts {
        debug_assert!(offset + bytes.len() <= RECORD_LEN);
        // SAFETY: the destination lies inside the record (offsets are the
        // constants of `field`), and the mapping does not overlap `bytes`.
        unsafe { ptr::copy_nonoverlapping(bytes.as_ptr(), rec.add(*offset), bytes.len()) };
    }
    fence(Ordering::Release);
    seq.store((s | 1).wrapping_add(1), Ordering::Release);
}

fn addr_bytes(addr: Option<SocketAddr>) -> [u8; 20] {
    let mut b = [0u8; 20];
    match addr {
        None => {}
        Some(SocketAddr::V4(a)) => {
            b[0..2].copy_from_slice(&4u16.to_le_bytes());
            b[2..4].copy_from_slice(&a.port().to_le_bytes());
            b[4..8].copy_from_slice(&a.ip().octets());
        }
        Some(SocketAddr::V6(a)) => {
            b[0..2].copy_from_slice(&6u16.to_le_bytes());
            b[2..4].copy_from_slice(&a.port().to_le_bytes());
            b[4..20].copy_from_slice(&a.ip().octets());
        }
    }
    b
}

fn entry_bytes(entry: &Entry) -> [u8; 52] {
    let mut r = [0u8; RECORD_LEN];
    r[field::IN_USE] = 1;
    r[field::TRANSPORT] = entry.transport as u8;
    r[field::ROLE] = entry.role as u8;
    r[field::WANT] = match entry.want {
        None => 0,
        Some(Family::Sdp) => 1,
        Some(Family::Tcp) => 2,
        Some(Family::Both) => 3,
    };
    r[field::DECIDED_BY] = entry.decided_by as u8;
    r[field::REASON] = entry.reason as u8;
    r[field::RULE].copy_from_slice(&entry.rule.to_le_bytes());
    r[field::FLAGS] =
        if entry.forced { FLAG_FORCED } else { 0 } | if entry.ipv6 { FLAG_IPV6 } else { 0 };
    r[field::LOCAL].copy_from_slice(&addr_bytes(entry.local));
    r[field::PEER].copy_from_slice(&addr_bytes(entry.peer));
    let mut out = [0u8; 52];
    out.copy_from_slice(&r[field::ENTRY_PART]);
    out
}

/// Publishes the entry of `fd` (`None`: the fd is no longer managed).
/// Called by the fd table with the fd's slot lock held.
pub fn publish(fd: i32, entry: Option<&Entry>) {
    match entry {
        Some(e) => {
            if let Some(rec) = record(fd, true) {
                // SAFETY: the record is RECORD_LEN bytes of a live
                // mapping, and the fd's slot lock our caller holds makes
                // us its one writer.
                let was = unsafe {
                    (
                        *rec.add(field::IN_USE),
                        *rec.add(field::TRANSPORT),
                        *rec.add(field::REASON),
                    )
                };
                let bytes = entry_bytes(e);
                write_record(rec, &[(field::ENTRY_PART.start, &bytes)]);
                let now = (1, Transport::Tcp as u8, e.reason as u8);
                if e.transport == Transport::Tcp && e.reason != TcpReason::None && was != now {
                    count_fallback(e.reason);
                }
                let connection = matches!(e.role, SocketRole::Client | SocketRole::Accepted);
                if connection
                    && e.transport == Transport::Sdp
                    && (was.0, was.1) != (1, Transport::Sdp as u8)
                {
                    SDP_CONNECTIONS.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        None => {
            if let Some(rec) = record(fd, false) {
                write_record(rec, &[(4, &[0u8; RECORD_LEN - 4])]);
            }
        }
    }
}

fn stats_bytes(stats: &Stats) -> StatsPart {
    let mut part = [0u8; STATS_LEN];
    let mut put = |f: Range<usize>, values: &[u64]| {
        debug_assert_eq!(values.len() * 8, f.len());
        for (b, v) in part[in_part(f)].chunks_exact_mut(8).zip(values) {
            b.copy_from_slice(&v.to_le_bytes());
        }
    };
    let c = &stats.bytes;
    let m = &stats.messages;
    put(
        field::COUNTERS,
        &[
            c.bcopy_tx,
            c.bcopy_rx,
            c.read_zcopy_tx,
            c.read_zcopy_rx,
            c.write_zcopy_tx,
            c.write_zcopy_rx,
        ],
    );
    put(field::DIRECT, &[c.bcopy_tx_direct, c.bcopy_rx_direct]);
    put(
        field::MESSAGES,
        &[
            m.src_avails,
            m.sink_avails,
            m.send_sms,
            m.cancels,
            m.mode_changes,
        ],
    );
    put(field::COPIED, &[c.rx_copied, c.rx_copied_back]);
    put(field::SAME_HOST_BYTES, &[c.same_host_tx, c.same_host_rx]);
    put(field::WAITS, &[c.waits_polled, c.waits_slept]);
    part[in_part(field::SAME_HOST)].copy_from_slice(&stats.same_host.to_le_bytes());
    part[in_part(field::LOCAL_CREDITS)].copy_from_slice(&stats.local_credits.to_le_bytes());
    part[in_part(field::REMOTE_CREDITS)].copy_from_slice(&stats.remote_credits.to_le_bytes());
    ([stats.tx_mode as u8, stats.rx_mode as u8], part)
}

fn write_stats(rec: *mut u8, stats: &Stats) {
    write_part(rec, &stats_bytes(stats));
}

fn write_part(rec: *mut u8, (modes, counters): &StatsPart) {
    write_record(
        rec,
        &[(field::TX_MODE, modes), (field::COUNTERS.start, counters)],
    );
}

/// Publishes the SDP statistics of `fd` (slot lock held).
pub fn publish_stats(fd: i32, stats: &Stats) {
    if let Some(rec) = record(fd, false) {
        write_stats(rec, stats);
    }
}

/// Bytes of a record from [`field::COUNTERS`] to the end of
/// [`field::WAITS`]: the byte counters, the credits, the direct counters,
/// the messages, the copy counters, the same-host path and the waits.
const STATS_LEN: usize = field::WAITS.end - field::COUNTERS.start;

/// The SDP part of a record: the modes, and the counters with credits.
type StatsPart = ([u8; 2], [u8; STATS_LEN]);

/// Where the record field `f` lies in the counters of a [`StatsPart`].
fn in_part(f: Range<usize>) -> Range<usize> {
    f.start - field::COUNTERS.start..f.end - field::COUNTERS.start
}

/// The SDP part of a record as the parent last wrote it, if the record is
/// in use and not caught mid-update.
fn stats_part(rec: *mut u8) -> Option<StatsPart> {
    // SAFETY: the record is RECORD_LEN bytes of a live mapping; its first
    // 4 bytes are only used as this atomic (see `write_record`).
    let seq = unsafe { &*(rec as *const AtomicU32) }.load(Ordering::Acquire);
    // SAFETY: the offsets are the constants of `field`, inside the record.
    let (in_use, modes, counters) = unsafe {
        (
            *rec.add(field::IN_USE),
            [*rec.add(field::TX_MODE), *rec.add(field::RX_MODE)],
            *(rec.add(field::COUNTERS.start) as *const [u8; STATS_LEN]),
        )
    };
    (seq & 1 == 0 && in_use != 0).then_some((modes, counters))
}

/// Unmaps every window and turns the export off (in the child, when its
/// own file cannot be made: never write into the parent's file).
fn disable() {
    for m in MAPS.iter() {
        let p = m.swap(ptr::null_mut(), Ordering::AcqRel);
        if !p.is_null() {
            // SAFETY: p is a window of CHUNK_BYTES we mapped.
            unsafe { libc::munmap(p.cast(), CHUNK_BYTES) };
        }
    }
    STATUS.store(Status::Off as u8, Ordering::Relaxed);
}

/// In the child after `fork` (the only thread, fork gate open, no slot
/// lock held): the records become this process's own file, created at
/// once and mapped at the same addresses, holding one record per fd of the
/// child's fd table (it inherited them all).
///
/// The records are written from the table, not copied from the parent's
/// file: that file is shared with the parent, which may already have
/// closed its copy of an fd (accept-then-fork servers do so at once) and
/// cleared its record. Only the SDP counters are taken from the parent's
/// record, when it still holds them.
///
/// No lock another parent thread could have held: every user of `FILE`
/// and of the slot locks runs inside the fork gate, which was closed
/// across the fork; `FILE` is taken with `try_lock` all the same.
pub fn fork_child() {
    let Ok(mut guard) = FILE.try_lock() else {
        disable();
        return;
    };
    let Some(old) = guard.take() else { return };
    // The child counts its own sockets; the cache it inherited is its own.
    for n in FALLBACKS
        .iter()
        .chain([&SDP_CONNECTIONS, &SDP_CONNECTIONS_WRITTEN])
    {
        n.store(0, Ordering::Relaxed);
    }
    // What the child holds, read before the windows are replaced.
    let mut records: Vec<(i32, [u8; 52], Option<StatsPart>)> = Vec::new();
    crate::table::for_each_unguarded(|fd, e| {
        let stats = record(fd, false).and_then(stats_part);
        records.push((fd, entry_bytes(e), stats));
    });
    // SAFETY: the parent's fd was inherited; we no longer use it.
    unsafe { real::close(old.fd) };
    let file = directory()
        .and_then(|dir| create(&dir, false))
        .and_then(|mut file| {
            // SAFETY: file.fd is our new file.
            if unsafe { libc::ftruncate(file.fd, old.len as libc::off_t) } != 0 {
                // SAFETY: file.fd is ours; the path is NUL-terminated.
                unsafe {
                    real::close(file.fd);
                    libc::unlink(file.path.as_ptr());
                }
                return None;
            }
            file.len = old.len;
            Some(file)
        });
    let Some(file) = file else {
        disable();
        return;
    };
    for (chunk, m) in MAPS.iter().enumerate() {
        let p = m.load(Ordering::Acquire);
        if p.is_null() {
            continue;
        }
        // Over the parent's window: all zero (no record in use).
        if map_window(file.fd, chunk, p).is_null() {
            // SAFETY: p is a window of CHUNK_BYTES we mapped; the failed
            // MAP_FIXED may have left it mapped to the parent's file.
            unsafe { libc::munmap(p.cast(), CHUNK_BYTES) };
            m.store(ptr::null_mut(), Ordering::Release);
        }
    }
    *guard = Some(file);
    drop(guard);
    for (fd, entry, stats) in &records {
        // `true`: a window the parent lacked is made in the child's file.
        let Some(rec) = record(*fd, true) else {
            continue;
        };
        write_record(rec, &[(field::ENTRY_PART.start, entry)]);
        if let Some(part) = stats {
            write_part(rec, part);
        }
    }
}

/// The path of this process's export file, once created.
pub fn current_path() -> Option<String> {
    FILE.lock()
        .ok()?
        .as_ref()
        .map(|f| f.path.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sdp::{Counters, Messages, Mode};
    use crate::stat_format::le_u32;
    use crate::table::{DecidedBy, TcpReason, Transport};

    #[test]
    fn the_header_carries_the_fallbacks_and_the_port_mapper_cache() {
        use std::time::Duration;
        FALLBACKS[TcpReason::PmDeny as usize].fetch_add(2, Ordering::Relaxed);
        SDP_CONNECTIONS.fetch_add(3, Ordering::Relaxed);
        let service: SocketAddr = "10.0.0.2:5201".parse().unwrap();
        let host: std::net::IpAddr = "10.0.0.3".parse().unwrap();
        let before = monotonic_ms();
        publish_pm_cache(|| {
            vec![
                CacheEntry {
                    key: CacheKey::Service(service),
                    decision: Decision::Sdp("10.0.0.2:40001".parse().unwrap()),
                    expires_in: Some(Duration::from_secs(5)),
                },
                CacheEntry {
                    key: CacheKey::Host(host),
                    decision: Decision::Tcp(Fallback::Unreachable),
                    expires_in: None,
                },
            ]
        });
        let mut file = header().to_vec();
        let state = parse(&file).unwrap();
        assert!(state.fallbacks[TcpReason::PmDeny as usize] >= 2);
        assert!(state.sdp_connections >= 3);
        assert_eq!(state.pm_cache.len(), 2);
        let (a, b) = (state.pm_cache[0], state.pm_cache[1]);
        assert_eq!(
            (a.key, a.host, a.answer, a.sdp_port),
            (service, false, 1, 40001)
        );
        assert!((before + 5000..=monotonic_ms() + 5000).contains(&a.expires_ms));
        assert_eq!(
            (b.key, b.host, b.answer, b.expires_ms),
            (SocketAddr::new(host, 0), true, 4, u64::MAX)
        );
        // Caught mid-update: read again.
        file[field::H_SEQ].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(parse(&file), Err(ParseError::TornHeader));
        // A version 3 file has neither.
        file[field::H_VERSION].copy_from_slice(&3u32.to_le_bytes());
        let old = parse(&file).unwrap();
        assert_eq!(
            (old.fallbacks, old.sdp_connections, old.pm_cache.len()),
            ([0; REASONS], 0, 0)
        );
    }

    #[test]
    fn records_round_trip_through_the_format() {
        let mut file = header().to_vec();
        file.resize(HEADER_LEN + 3 * RECORD_LEN, 0);
        let mut e = Entry::new(true, true);
        e.role = SocketRole::Client;
        e.want = Some(Family::Both);
        e.decided_by = DecidedBy::Rule;
        e.rule = 3;
        e.transport = Transport::Tcp;
        e.reason = TcpReason::NoEngine;
        e.local = Some("[::1]:40000".parse().unwrap());
        e.peer = Some("127.0.0.1:5201".parse().unwrap());
        let rec = file[HEADER_LEN + 2 * RECORD_LEN..].as_mut_ptr();
        write_record(rec, &[(field::ENTRY_PART.start, &entry_bytes(&e))]);
        publish_stats_into(rec);
        let state = parse(&file).unwrap();
        assert_eq!(state.program, crate::config::program());
        assert_eq!(state.pid, std::process::id());
        assert_eq!(state.records.len(), 1);
        let r = &state.records[0];
        assert_eq!(r.fd, 2);
        assert_eq!(
            (
                r.transport,
                r.role,
                r.want,
                r.decided_by,
                r.reason,
                r.rule,
                r.flags
            ),
            (1, 1, 3, 2, 2, 3, FLAG_FORCED | FLAG_IPV6)
        );
        assert_eq!(r.local, e.local);
        assert_eq!(r.peer, e.peer);
        assert_eq!((r.tx_mode, r.rx_mode), (1, 3));
        assert_eq!(r.counters, [1, 2, 3, 4, 5, 6]);
        assert_eq!(r.direct, [9, 10]);
        assert_eq!(r.messages, [11, 12, 13, 14, 15]);
        assert_eq!(r.copied, [16, 17]);
        assert_eq!((r.local_credits, r.remote_credits), (7, 8));
        assert_eq!((r.same_host_bytes, r.waits), ([18, 19], [20, 21]));
        let rec = &file[HEADER_LEN + 2 * RECORD_LEN..];
        assert!(rec[field::RESERVED].iter().all(|&b| b == 0));
        // Sequence: two writes, each leaving it even.
        assert_eq!(le_u32(&file[HEADER_LEN + 2 * RECORD_LEN..]), 4);
    }

    /// A forked child rewrites its records from the table plus the SDP
    /// part of the parent's record (`fork_child`): every statistic goes
    /// along.
    #[test]
    fn the_sdp_part_carries_every_statistic() {
        let mut file = header().to_vec();
        file.resize(HEADER_LEN + 2 * RECORD_LEN, 0);
        let entry = entry_bytes(&Entry::new(false, false));
        let parent = file[HEADER_LEN..].as_mut_ptr();
        write_record(parent, &[(field::ENTRY_PART.start, &entry)]);
        publish_stats_into(parent);
        let part = stats_part(parent).unwrap();
        let child = file[HEADER_LEN + RECORD_LEN..].as_mut_ptr();
        write_record(child, &[(field::ENTRY_PART.start, &entry)]);
        write_part(child, &part);
        let state = parse(&file).unwrap();
        let [p, c] = &state.records[..] else {
            panic!("{state:?}")
        };
        assert_eq!(Record { fd: 0, ..c.clone() }, *p);
    }

    fn publish_stats_into(rec: *mut u8) {
        let stats = Stats {
            tx_mode: Mode::Combined,
            rx_mode: Mode::Pipelined,
            bytes: Counters {
                bcopy_tx: 1,
                bcopy_rx: 2,
                read_zcopy_tx: 3,
                read_zcopy_rx: 4,
                write_zcopy_tx: 5,
                write_zcopy_rx: 6,
                bcopy_tx_direct: 9,
                bcopy_rx_direct: 10,
                rx_copied: 16,
                rx_copied_back: 17,
                same_host_tx: 18,
                same_host_rx: 19,
                waits_polled: 20,
                waits_slept: 21,
            },
            messages: Messages {
                src_avails: 11,
                sink_avails: 12,
                send_sms: 13,
                cancels: 14,
                mode_changes: 15,
            },
            local_credits: 7,
            remote_credits: 8,
            same_host: 0x1_0001,
        };
        write_stats(rec, &stats);
    }

    #[test]
    fn bad_files_are_rejected() {
        assert_eq!(parse(&[0u8; 100]), Err(ParseError::Truncated));
        assert_eq!(parse(&[0u8; HEADER_LEN]), Err(ParseError::BadMagic));
        let mut h = header().to_vec();
        h[8] = 9;
        assert_eq!(parse(&h), Err(ParseError::UnsupportedVersion(9)));
        // Version 1 records were 128 bytes, without the messages.
        h[8] = 1;
        assert_eq!(parse(&h), Err(ParseError::UnsupportedVersion(1)));
        let mut f = header().to_vec();
        f.resize(HEADER_LEN + RECORD_LEN, 0);
        f[HEADER_LEN] = 1;
        assert_eq!(parse(&f), Err(ParseError::Torn(0)));
    }
}
