//! Per-fd state of the sockets the preload manages.
//!
//! Indexed by fd number: chunks of 1024 slots, allocated the first time a
//! socket in their range is managed and never freed, so a lookup is two
//! loads and no lock. Each slot has a flag byte read without a lock (the
//! fast path: "not managed", "managed, TCP", "managed, SDP") and an entry
//! behind a per-slot spin lock, held only to copy or change the entry,
//! never across a call into the C library or the SDP engine.
//!
//! The number of fds in SDP state is one global counter: while it is zero
//! (always, until the SDP engine is installed) the data-path hooks do one
//! relaxed load and call the C library.
//!
//! `fork`: a gate counts the threads inside the table; the fork hook closes
//! the gate and waits for them to leave before forking, so the child never
//! inherits a held slot lock.
//!
//! The table imports nothing above it: the state export and `epoll`, which
//! must hear of its changes, register a function for it ([`set_publisher`],
//! [`set_on_fall_back`]).

use crate::rules::Family;
pub use crate::sdp::TcpReason;
use crate::sdp::{SdpEndpoint, SdpListener, Stats};
use std::cell::UnsafeCell;
use std::net::SocketAddr;
use std::ptr;
use std::sync::atomic::{
    AtomicBool, AtomicPtr, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering,
};
use std::sync::{Arc, OnceLock};

/// Slots per chunk.
pub const CHUNK: usize = 1024;
/// Chunks: fds up to 4 Mi, above any `RLIMIT_NOFILE` Linux allows by default.
const CHUNKS: usize = 4096;

const MANAGED: u8 = 1;
const SDP: u8 = 2;

/// Which transport carries a managed socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Transport {
    /// Not connected or listening yet.
    Undecided = 0,
    Tcp = 1,
    Sdp = 2,
}

/// What the socket does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum SocketRole {
    None = 0,
    /// `connect` was called.
    Client = 1,
    /// `listen` was called.
    Listener = 2,
    /// Returned by `accept`.
    Accepted = 3,
}

/// Who made the SDP/TCP decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum DecidedBy {
    Nothing = 0,
    /// No rule matched: `both` (DESIGN §6).
    Default = 1,
    /// The rule numbered in [`Entry::rule`].
    Rule = 2,
    /// `socket(AF_INET_SDP, ...)`.
    Forced = 3,
    /// Inherited from the listening socket that accepted it.
    Listener = 4,
}

/// An SDP endpoint shared by every fd number (dup, fork) referring to it.
pub struct StreamHandle {
    fds: AtomicUsize,
    /// `O_NONBLOCK` as the program set it: the kernel socket of an SDP fd
    /// is always nonblocking (the engine needs it, and a `dup` shares the
    /// flag), so `fcntl(F_GETFL/F_SETFL)` and `ioctl(FIONBIO)` use this.
    pub nonblock: AtomicBool,
    /// `SO_RCVTIMEO` and `SO_SNDTIMEO` in nanoseconds (0: none) as last
    /// read from the kernel socket, or [`TIMEOUT_UNKNOWN`]: a blocking call
    /// reads them once, not once per call; `setsockopt` forgets them.
    pub timeouts: [AtomicU64; 2],
    /// Threads of this process inside a call that waits on the fd: a
    /// blocking `recv`/`send`, or `poll`/`select` with it. A `fork` while
    /// one waits leaves the connection to this process (see
    /// [`StreamHandle::in_use`]).
    waiters: AtomicU32,
    pub endpoint: Arc<dyn SdpEndpoint>,
}

impl StreamHandle {
    /// The socket has neither `SO_RCVTIMEO` nor `SO_SNDTIMEO` (known
    /// without asking the kernel).
    pub fn timeouts_unset(&self) {
        for t in &self.timeouts {
            t.store(0, Ordering::Relaxed);
        }
    }

    /// Counts the calling thread as waiting on the fd until the guard
    /// drops.
    pub fn watch(&self) -> Watch<'_> {
        self.waiters.fetch_add(1, Ordering::AcqRel);
        Watch(&self.waiters)
    }

    /// Whether a thread of this process waits on the fd now: at a `fork`,
    /// the process that is using the connection keeps it (the child's copy
    /// is lost at once) instead of leaving it to whichever process uses it
    /// first — a thread asleep in `poll` on it would never see the data
    /// that the paused connection no longer moves.
    pub fn in_use(&self) -> bool {
        self.waiters.load(Ordering::Acquire) > 0
    }
}

/// See [`StreamHandle::watch`].
pub struct Watch<'a>(&'a AtomicU32);

impl Drop for Watch<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// See [`StreamHandle::timeouts`].
pub const TIMEOUT_UNKNOWN: u64 = u64::MAX;

/// The names `SO_RCVTIMEO` and `SO_SNDTIMEO` go by (the 32-bit time
/// layout and the 64-bit one).
pub const TIMEOUT_OPTS: [i32; 4] = [
    libc::SO_RCVTIMEO,
    libc::SO_SNDTIMEO,
    libc::SO_RCVTIMEO_NEW,
    libc::SO_SNDTIMEO_NEW,
];

/// `TCP_NODELAY` of `fd`, whose entry is `entry`: off if the program never
/// set it on a socket made under the library, else as the kernel has it.
pub fn nodelay(fd: i32, entry: Option<&Entry>) -> bool {
    flag(fd, entry, libc::IPPROTO_TCP, libc::TCP_NODELAY)
}

/// The on/off option `(level, name)` of `fd`, whose entry is `entry`, for
/// options that start off: off if the program never set it on a socket
/// made under the library, else as the kernel has it.
pub fn flag(fd: i32, entry: Option<&Entry>, level: i32, name: i32) -> bool {
    match entry.and_then(|e| e.set_by_program(level, &[name])) {
        Some(false) => false,
        _ => crate::sys::addr::int_sockopt(fd, level, name).is_some_and(|v| v != 0),
    }
}

/// A hidden SDP listener shared like [`StreamHandle`].
pub struct ListenerHandle {
    fds: AtomicUsize,
    /// `O_NONBLOCK` as the program set it on the listening socket, which
    /// is kept nonblocking in the kernel so that `accept` can take from
    /// the hidden listener and the kernel one without blocking in either.
    pub nonblock: AtomicBool,
    pub listener: Arc<dyn SdpListener>,
}

/// A socket option the program set (`setsockopt`), replayed on the fresh
/// socket of a fallback to TCP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SockOpt {
    pub level: i32,
    pub name: i32,
    pub value: Vec<u8>,
}

/// Most options kept per socket.
const MAX_OPTS: usize = 32;

/// The SDP side of a managed socket.
#[derive(Clone, Default)]
pub enum SdpSide {
    #[default]
    None,
    Stream(Arc<StreamHandle>),
    Listener(Arc<ListenerHandle>),
}

impl SdpSide {
    /// A stream endpoint for a newly managed fd; `nonblock` is the
    /// program's `O_NONBLOCK`.
    pub fn stream(endpoint: Arc<dyn SdpEndpoint>, nonblock: bool) -> SdpSide {
        endpoint.set_nonblocking(nonblock);
        SdpSide::Stream(Arc::new(StreamHandle {
            fds: AtomicUsize::new(0),
            nonblock: AtomicBool::new(nonblock),
            timeouts: [
                AtomicU64::new(TIMEOUT_UNKNOWN),
                AtomicU64::new(TIMEOUT_UNKNOWN),
            ],
            waiters: AtomicU32::new(0),
            endpoint,
        }))
    }

    /// A hidden listener for a newly managed fd; `nonblock` is the
    /// program's `O_NONBLOCK` on the listening socket.
    pub fn listener(listener: Arc<dyn SdpListener>, nonblock: bool) -> SdpSide {
        SdpSide::Listener(Arc::new(ListenerHandle {
            fds: AtomicUsize::new(0),
            nonblock: AtomicBool::new(nonblock),
            listener,
        }))
    }

    /// The program's view of `O_NONBLOCK`, for an SDP side.
    pub fn nonblock(&self) -> Option<&AtomicBool> {
        match self {
            SdpSide::None => None,
            SdpSide::Stream(h) => Some(&h.nonblock),
            SdpSide::Listener(h) => Some(&h.nonblock),
        }
    }

    fn is_some(&self) -> bool {
        !matches!(self, SdpSide::None)
    }

    /// One more fd number refers to this side.
    fn add_ref(&self) {
        match self {
            SdpSide::None => {}
            SdpSide::Stream(h) => {
                h.fds.fetch_add(1, Ordering::Relaxed);
            }
            SdpSide::Listener(h) => {
                h.fds.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// One fd number less; true when it was the last.
    fn release(&self) -> bool {
        match self {
            SdpSide::None => false,
            SdpSide::Stream(h) => h.fds.fetch_sub(1, Ordering::AcqRel) == 1,
            SdpSide::Listener(h) => h.fds.fetch_sub(1, Ordering::AcqRel) == 1,
        }
    }

    /// Tells the endpoint or listener the last fd referring to it closes.
    fn close(&self) {
        match self {
            SdpSide::None => {}
            SdpSide::Stream(h) => h.endpoint.close(h.nonblock.load(Ordering::Relaxed)),
            SdpSide::Listener(h) => h.listener.close(),
        }
    }
}

/// The state of one managed socket.
#[derive(Clone)]
pub struct Entry {
    /// `AF_INET6` (else `AF_INET`).
    pub ipv6: bool,
    /// Created as `socket(AF_INET_SDP, ...)`.
    pub forced: bool,
    /// Made before this library saw it (inherited across `exec`, a raw
    /// system call): the options it has and whether it is bound are the
    /// kernel's to tell, not [`Entry::opts`].
    pub adopted: bool,
    /// The program bound it.
    pub bound: bool,
    pub role: SocketRole,
    /// What the rules asked for (`None` until connect/listen).
    pub want: Option<Family>,
    pub decided_by: DecidedBy,
    /// 1-based rule number when `decided_by == Rule`, else 0.
    pub rule: u16,
    pub transport: Transport,
    pub reason: TcpReason,
    pub local: Option<SocketAddr>,
    pub peer: Option<SocketAddr>,
    pub sdp: SdpSide,
    /// Options the program set, oldest first (one per level and name).
    pub opts: Vec<SockOpt>,
}

impl Entry {
    /// Records an option the kernel accepted (the last value per level
    /// and name; at most a few dozen options).
    pub fn record_opt(&mut self, level: i32, name: i32, value: &[u8]) {
        self.opts.retain(|o| (o.level, o.name) != (level, name));
        if self.opts.len() < MAX_OPTS {
            self.opts.push(SockOpt {
                level,
                name,
                value: value.to_vec(),
            });
        }
    }

    /// Whether the program set one of the options `names` at `level`
    /// (`None`: the socket was adopted, only the kernel knows). A socket
    /// the program made here has the kernel's defaults for the others,
    /// which saves reading them back in each setup.
    pub fn set_by_program(&self, level: i32, names: &[i32]) -> Option<bool> {
        (!self.adopted).then(|| {
            self.opts
                .iter()
                .any(|o| o.level == level && names.contains(&o.name))
        })
    }

    /// A socket just created.
    pub fn new(ipv6: bool, forced: bool) -> Entry {
        Entry {
            ipv6,
            forced,
            adopted: false,
            bound: false,
            role: SocketRole::None,
            want: None,
            decided_by: DecidedBy::Nothing,
            rule: 0,
            transport: Transport::Undecided,
            reason: TcpReason::None,
            local: None,
            peer: None,
            sdp: SdpSide::None,
            opts: Vec::new(),
        }
    }
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Entry")
            .field("ipv6", &self.ipv6)
            .field("forced", &self.forced)
            .field("adopted", &self.adopted)
            .field("bound", &self.bound)
            .field("role", &self.role)
            .field("want", &self.want)
            .field("decided_by", &self.decided_by)
            .field("rule", &self.rule)
            .field("transport", &self.transport)
            .field("reason", &self.reason)
            .field("local", &self.local)
            .field("peer", &self.peer)
            .field("sdp", &self.sdp.is_some())
            .finish()
    }
}

/// A spin lock: the critical sections are a few loads and stores, and
/// unlike `std::sync::Mutex` it can be reset in a forked child if ever
/// needed.
struct SpinLock<T> {
    locked: AtomicBool,
    value: UnsafeCell<T>,
}

// SAFETY: access to `value` is serialised by `locked`.
unsafe impl<T: Send> Sync for SpinLock<T> {}

impl<T> SpinLock<T> {
    fn new(value: T) -> Self {
        SpinLock {
            locked: AtomicBool::new(false),
            value: UnsafeCell::new(value),
        }
    }

    fn with<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut spins = 0u32;
        while self
            .locked
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            spins += 1;
            if spins < 64 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
        struct Unlock<'a>(&'a AtomicBool);
        impl Drop for Unlock<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _unlock = Unlock(&self.locked);
        // SAFETY: we hold the lock, so this is the only reference.
        f(unsafe { &mut *self.value.get() })
    }
}

struct Slot {
    flags: AtomicU8,
    /// Counts the changes of `entry`: a thread's remembered lookup
    /// ([`LAST`]) is good while it has not moved.
    generation: AtomicU64,
    entry: SpinLock<Option<Entry>>,
}

thread_local! {
    /// This thread's last [`stream`] lookup: the fd, its slot's
    /// generation then, and the handle — weak, so that a closed
    /// connection is not kept open by a thread that looked at it once.
    static LAST: std::cell::RefCell<Option<(i32, u64, std::sync::Weak<StreamHandle>)>> =
        const { std::cell::RefCell::new(None) };
}

static CHUNK_TABLE: [AtomicPtr<Slot>; CHUNKS] = [const { AtomicPtr::new(ptr::null_mut()) }; CHUNKS];
static SDP_FDS: AtomicUsize = AtomicUsize::new(0);

/// Fork gate: bit 63 = closed for a fork, low bits = threads inside.
static GATE: AtomicUsize = AtomicUsize::new(0);
const GATE_CLOSED: usize = 1 << 63;

thread_local! {
    /// Depth of this thread inside the gate (a signal handler may nest).
    static INSIDE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Inside the fork gate (see the module docs); dropping it leaves.
pub struct GateGuard;

/// Enters the fork gate: any lock taken while the guard lives is never
/// held by another thread at the moment of a `fork`.
pub fn enter_gate() -> GateGuard {
    if INSIDE.with(|d| d.get()) == 0 {
        loop {
            let g = GATE.load(Ordering::Acquire);
            if g & GATE_CLOSED == 0
                && GATE
                    .compare_exchange_weak(g, g + 1, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok()
            {
                break;
            }
            std::thread::yield_now();
        }
    }
    INSIDE.with(|d| d.set(d.get() + 1));
    GateGuard
}

impl Drop for GateGuard {
    fn drop(&mut self) {
        let depth = INSIDE.with(|d| {
            let v = d.get() - 1;
            d.set(v);
            v
        });
        if depth == 0 {
            GATE.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Before `fork`: wait until no other thread is inside the table and keep
/// them out. A fork from inside the table (a signal handler) skips the wait.
pub fn fork_prepare() {
    if INSIDE.with(|d| d.get()) != 0 {
        return;
    }
    loop {
        let g = GATE.load(Ordering::Acquire);
        if g & GATE_CLOSED == 0 {
            // Close the gate (retry if another thread moved the count).
            let _ =
                GATE.compare_exchange_weak(g, g | GATE_CLOSED, Ordering::AcqRel, Ordering::Relaxed);
        } else if g == GATE_CLOSED {
            return;
        } else {
            std::thread::yield_now();
        }
    }
}

/// After `fork`, in the parent or the child: reopen the gate.
pub fn fork_done() {
    if INSIDE.with(|d| d.get()) != 0 {
        return;
    }
    GATE.fetch_and(!GATE_CLOSED, Ordering::AcqRel);
}

fn index(fd: i32) -> Option<(usize, usize)> {
    let fd = usize::try_from(fd).ok()?;
    let chunk = fd / CHUNK;
    (chunk < CHUNKS).then_some((chunk, fd % CHUNK))
}

fn slot(fd: i32) -> Option<&'static Slot> {
    let (chunk, i) = index(fd)?;
    let base = CHUNK_TABLE[chunk].load(Ordering::Acquire);
    if base.is_null() {
        return None;
    }
    // SAFETY: a non-null chunk pointer points to CHUNK slots that are never
    // freed, and `i < CHUNK`.
    Some(unsafe { &*base.add(i) })
}

fn slot_or_create(fd: i32) -> Option<&'static Slot> {
    if let Some(s) = slot(fd) {
        return Some(s);
    }
    let (chunk, i) = index(fd)?;
    let slots: Box<[Slot]> = (0..CHUNK)
        .map(|_| Slot {
            flags: AtomicU8::new(0),
            generation: AtomicU64::new(0),
            entry: SpinLock::new(None),
        })
        .collect();
    let fresh = Box::into_raw(slots) as *mut Slot;
    let base = match CHUNK_TABLE[chunk].compare_exchange(
        ptr::null_mut(),
        fresh,
        Ordering::AcqRel,
        Ordering::Acquire,
    ) {
        Ok(_) => fresh,
        Err(winner) => {
            // SAFETY: `fresh` came from Box::into_raw of a CHUNK-slot box
            // just above and was never shared.
            drop(unsafe { Box::from_raw(ptr::slice_from_raw_parts_mut(fresh, CHUNK)) });
            winner
        }
    };
    // SAFETY: as in `slot`.
    Some(unsafe { &*base.add(i) })
}

/// True when no fd is in SDP state: the data-path hooks pass through.
#[inline]
pub fn no_sdp() -> bool {
    SDP_FDS.load(Ordering::Relaxed) == 0
}

/// Is `fd` a socket the preload manages? (Lock-free.)
#[inline]
pub fn is_managed(fd: i32) -> bool {
    slot(fd).is_some_and(|s| s.flags.load(Ordering::Acquire) & MANAGED != 0)
}

/// Is `fd` in SDP state? (Lock-free; false whenever [`no_sdp`].)
#[inline]
pub fn is_sdp(fd: i32) -> bool {
    !no_sdp() && slot(fd).is_some_and(|s| s.flags.load(Ordering::Acquire) & SDP != 0)
}

fn flags_of(entry: Option<&Entry>) -> u8 {
    match entry {
        None => 0,
        Some(e) if e.sdp.is_some() => MANAGED | SDP,
        Some(_) => MANAGED,
    }
}

/// Replaces the slot's entry (under its lock), keeping the flags, the SDP
/// counter and the published record right. Returns the previous entry.
fn store(s: &Slot, fd: i32, entry: &mut Option<Entry>, new: Option<Entry>) -> Option<Entry> {
    let old_flags = flags_of(entry.as_ref());
    let new_flags = flags_of(new.as_ref());
    let old = std::mem::replace(entry, new);
    s.flags.store(new_flags, Ordering::Release);
    s.generation.fetch_add(1, Ordering::Release);
    match (old_flags & SDP != 0, new_flags & SDP != 0) {
        (false, true) => {
            SDP_FDS.fetch_add(1, Ordering::Relaxed);
        }
        (true, false) => {
            SDP_FDS.fetch_sub(1, Ordering::Relaxed);
        }
        _ => {}
    }
    if let Some(p) = PUBLISHER.get() {
        (p.entry)(fd, entry.as_ref());
    }
    old
}

/// Drops an entry that left the table: the last fd number of an SDP side
/// closes it.
fn retire(old: Option<Entry>) {
    if let Some(e) = old {
        if e.sdp.release() {
            e.sdp.close();
        }
    }
}

/// Starts managing `fd` with `entry` (a stale entry of a number the program
/// closed behind our back is replaced).
pub fn insert(fd: i32, entry: Entry) {
    let _g = enter_gate();
    let Some(s) = slot_or_create(fd) else { return };
    entry.sdp.add_ref();
    let old = s.entry.with(|e| store(s, fd, e, Some(entry)));
    retire(old);
}

/// Changes the entry of `fd` if it is managed; returns `f`'s result.
pub fn update<R>(fd: i32, f: impl FnOnce(&mut Entry) -> R) -> Option<R> {
    let _g = enter_gate();
    let s = slot(fd)?;
    let (result, old_side) = s.entry.with(|e| {
        let mut entry = e.clone()?;
        let before = entry.sdp.clone();
        let r = f(&mut entry);
        let changed_side = !same_side(&before, &entry.sdp);
        if changed_side {
            entry.sdp.add_ref();
        }
        store(s, fd, e, Some(entry));
        Some((r, changed_side.then_some(before)))
    })?;
    if let Some(before) = old_side {
        if before.release() {
            before.close();
        }
    }
    Some(result)
}

fn same_side(a: &SdpSide, b: &SdpSide) -> bool {
    match (a, b) {
        (SdpSide::None, SdpSide::None) => true,
        (SdpSide::Stream(x), SdpSide::Stream(y)) => Arc::ptr_eq(x, y),
        (SdpSide::Listener(x), SdpSide::Listener(y)) => Arc::ptr_eq(x, y),
        _ => false,
    }
}

/// Whether `a` and `b` name the same SDP stream or listener (one a
/// duplicate of the other).
pub fn same_endpoint(a: i32, b: i32) -> bool {
    match (get(a), get(b)) {
        (Some(x), Some(y)) => !matches!(x.sdp, SdpSide::None) && same_side(&x.sdp, &y.sdp),
        _ => false,
    }
}

/// A copy of the entry of `fd`.
pub fn get(fd: i32) -> Option<Entry> {
    if !is_managed(fd) {
        return None;
    }
    let _g = enter_gate();
    slot(fd)?.entry.with(|e| e.clone())
}

/// The SDP endpoint behind `fd`, if it is in SDP state. A thread that
/// asks for the fd it asked for last, unchanged since, takes neither the
/// fork gate nor the slot's lock (DESIGN §7 "One lock per call").
#[inline]
pub fn stream(fd: i32) -> Option<Arc<StreamHandle>> {
    if !is_sdp(fd) {
        return None;
    }
    let s = slot(fd)?;
    if let Some(h) = remembered(fd, s) {
        return Some(h);
    }
    let (h, generation) = {
        let _g = enter_gate();
        s.entry.with(|e| match e.as_ref().map(|e| &e.sdp) {
            Some(SdpSide::Stream(h)) => Some((h.clone(), s.generation.load(Ordering::Relaxed))),
            _ => None,
        })?
    };
    let _ = LAST.try_with(|last| {
        if let Ok(mut last) = last.try_borrow_mut() {
            *last = Some((fd, generation, Arc::downgrade(&h)));
        }
    });
    Some(h)
}

/// The stream this thread asked [`stream`] for last, if it is `fd`'s and
/// the slot did not change since.
fn remembered(fd: i32, s: &Slot) -> Option<Arc<StreamHandle>> {
    let generation = s.generation.load(Ordering::Acquire);
    LAST.try_with(|last| match &*last.try_borrow().ok()? {
        Some((f, g, h)) if (*f, *g) == (fd, generation) => h.upgrade(),
        _ => None,
    })
    .ok()
    .flatten()
}

/// The SDP side of `fd`, stream or listener, in one look (for the
/// readiness calls, which ask about every fd of their set).
pub fn side(fd: i32) -> SdpSide {
    if !is_sdp(fd) {
        return SdpSide::None;
    }
    let Some(s) = slot(fd) else {
        return SdpSide::None;
    };
    if let Some(h) = remembered(fd, s) {
        return SdpSide::Stream(h);
    }
    let _g = enter_gate();
    s.entry
        .with(|e| e.as_ref().map_or(SdpSide::None, |e| e.sdp.clone()))
}

/// The hidden SDP listener beside `fd`, if any.
#[inline]
pub fn listener(fd: i32) -> Option<Arc<ListenerHandle>> {
    match side(fd) {
        SdpSide::Listener(h) => Some(h),
        _ => None,
    }
}

/// Forgets `fd` (it was closed). Called before the fd number is closed so
/// an endpoint can still dup it.
pub fn remove(fd: i32) {
    if !is_managed(fd) {
        return;
    }
    let _g = enter_gate();
    let Some(s) = slot(fd) else { return };
    let old = s.entry.with(|e| store(s, fd, e, None));
    drop(_g);
    let Some(e) = old else { return };
    // The last holder's close goes first, its socket still on the number:
    // a connection left only to drain leaves the progress thread's epoll
    // set there, and its socket then moves off the number with no
    // registration to carry along (one `epoll_ctl` where a move first
    // took three).
    if e.sdp.release() {
        e.sdp.close();
    }
    if let SdpSide::Stream(h) = &e.sdp {
        h.endpoint.leave_fd(fd);
    }
}

/// `new` now refers to what `old` refers to (`dup2`, `F_DUPFD`...): the
/// entry is copied, and whatever `new` held before is forgotten.
pub fn duplicate(old: i32, new: i32) {
    if old == new {
        return;
    }
    match get(old) {
        Some(entry) => insert(new, entry),
        None => remove(new),
    }
}

/// Forgets every managed fd in `first..=last` (`close_range`).
pub fn remove_range(first: u32, last: u32) {
    let last = last.min((CHUNK * CHUNKS - 1) as u32);
    let mut fd = first;
    while fd <= last {
        let i = fd as i32;
        if slot(i).is_none() {
            // Skip the rest of an absent chunk.
            fd = ((fd as usize / CHUNK + 1) * CHUNK) as u32;
            continue;
        }
        remove(i);
        fd += 1;
    }
}

/// [`for_each`] for the fork handlers, while this thread holds the fork
/// gate closed (no other thread is inside the table, so no slot lock is
/// held; entering the gate would wait for ever).
pub fn for_each_unguarded(mut f: impl FnMut(i32, &Entry)) {
    for (chunk, base) in CHUNK_TABLE.iter().enumerate() {
        if base.load(Ordering::Acquire).is_null() {
            continue;
        }
        for i in 0..CHUNK {
            let fd = (chunk * CHUNK + i) as i32;
            if !is_managed(fd) {
                continue;
            }
            let Some(s) = slot(fd) else { continue };
            if let Some(e) = s.entry.with(|e| e.clone()) {
                f(fd, &e);
            }
        }
    }
}

/// Calls `f` with every managed fd and a copy of its entry.
pub fn for_each(mut f: impl FnMut(i32, &Entry)) {
    for (chunk, base) in CHUNK_TABLE.iter().enumerate() {
        if base.load(Ordering::Acquire).is_null() {
            continue;
        }
        for i in 0..CHUNK {
            let fd = (chunk * CHUNK + i) as i32;
            if let Some(e) = get(fd) {
                f(fd, &e);
            }
        }
    }
}

/// The SDP connection of `fd` became plain TCP (a nonblocking SDP connect
/// that fell back): for the SDP engine, after it has put a connected TCP
/// socket on the same fd number.
pub fn fall_back(fd: i32, reason: TcpReason) {
    update(fd, |e| {
        e.sdp = SdpSide::None;
        e.transport = Transport::Tcp;
        e.reason = reason;
    });
    fell_back(fd);
}

/// [`fall_back`], only if `fd` still refers to `endpoint` (the SDP
/// engine's own thread finishing a nonblocking connect: the program may
/// have closed the fd meanwhile). True if it did.
pub fn fall_back_if(fd: i32, endpoint: &Arc<dyn SdpEndpoint>, reason: TcpReason) -> bool {
    let ours = update(fd, |e| match &e.sdp {
        SdpSide::Stream(h) if Arc::ptr_eq(&h.endpoint, endpoint) => {
            // The program's O_NONBLOCK goes to the kernel socket while no
            // `fcntl` can slip between (the slot is ours): one that took
            // the handle before sees the fd is TCP now and sets the
            // kernel's itself (`abi::socket`), one after goes there.
            set_kernel_nonblock(fd, h.nonblock.load(Ordering::Acquire));
            e.sdp = SdpSide::None;
            e.transport = Transport::Tcp;
            e.reason = reason;
            true
        }
        _ => false,
    })
    .unwrap_or(false);
    if ours {
        fell_back(fd);
    }
    ours
}

fn set_kernel_nonblock(fd: i32, on: bool) {
    // SAFETY: F_GETFL/F_SETFL on a descriptor of the program's.
    unsafe {
        let fl = crate::sys::real::fcntl(fd, libc::F_GETFL, 0);
        if fl >= 0 {
            let fl = if on {
                fl | libc::O_NONBLOCK
            } else {
                fl & !libc::O_NONBLOCK
            };
            crate::sys::real::fcntl(fd, libc::F_SETFL, fl as libc::c_ulong);
        }
    }
}

/// Publishes the SDP statistics of `fd` to the state export.
pub fn publish_stats(fd: i32, stats: &Stats) {
    let Some(p) = PUBLISHER.get() else { return };
    let _g = enter_gate();
    if let Some(s) = slot(fd) {
        s.entry.with(|e| {
            if e.is_some() {
                (p.stats)(fd, stats);
            }
        });
    }
}

/// What the state export is told, under the fd's slot lock (so each
/// record has one writer at a time).
#[derive(Clone, Copy)]
pub struct Publisher {
    /// The entry of `fd` was stored (`None`: the fd is no longer managed).
    pub entry: fn(i32, Option<&Entry>),
    /// The SDP statistics of `fd` ([`publish_stats`]).
    pub stats: fn(i32, &Stats),
}

static PUBLISHER: OnceLock<Publisher> = OnceLock::new();

/// Sets the state export's functions (at library start; only the first
/// call counts). Until then nothing is published.
pub fn set_publisher(p: Publisher) {
    // Inside the gate: a fork never finds the cell half set.
    let _g = enter_gate();
    let _ = PUBLISHER.set(p);
}

static ON_FALL_BACK: OnceLock<fn(i32)> = OnceLock::new();

/// Sets what is called after an SDP connection fell back to TCP, with its
/// fd number (`epoll` makes its registrations ordinary ones of the fd);
/// only the first call counts.
pub fn set_on_fall_back(f: fn(i32)) {
    if ON_FALL_BACK.get().is_none() {
        // Inside the gate: a fork never finds the cell half set.
        let _g = enter_gate();
        let _ = ON_FALL_BACK.set(f);
    }
}

fn fell_back(fd: i32) {
    if let Some(f) = ON_FALL_BACK.get() {
        f(fd);
    }
}

/// SDP fds registered in epoll sets (kept by `abi::epoll`).
static EPOLL_REGISTRATIONS: AtomicUsize = AtomicUsize::new(0);

/// How many SDP fd registrations epoll sets hold ([`epoll_registrations`]).
pub fn set_epoll_registrations(n: usize) {
    EPOLL_REGISTRATIONS.store(n, Ordering::Relaxed);
}

/// SDP fd registrations in epoll sets: while there are none, the readiness
/// hooks need not look.
#[inline]
pub fn epoll_registrations() -> usize {
    EPOLL_REGISTRATIONS.load(Ordering::Relaxed)
}

/// Number of fds in SDP state.
pub fn sdp_count() -> usize {
    SDP_FDS.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    // Tests use fd numbers far above what the test process opens, each test
    // its own range, since the table is process-wide.

    #[test]
    fn insert_get_update_remove() {
        let fd = 900_001;
        assert!(!is_managed(fd));
        insert(fd, Entry::new(false, true));
        assert!(is_managed(fd));
        assert!(!is_sdp(fd));
        let got = update(fd, |e| {
            e.role = SocketRole::Client;
            e.transport = Transport::Tcp;
            e.reason = TcpReason::NoEngine;
            7
        });
        assert_eq!(got, Some(7));
        let e = get(fd).unwrap();
        assert_eq!(
            (e.role, e.transport, e.reason),
            (SocketRole::Client, Transport::Tcp, TcpReason::NoEngine)
        );
        assert!(e.forced);
        remove(fd);
        assert!(!is_managed(fd));
        assert!(get(fd).is_none());
        assert_eq!(update(fd, |_| ()), None);
    }

    /// A thread's remembered lookup follows the slot: a new endpoint under
    /// the same fd number is found, and a removed one is not kept alive.
    #[test]
    fn a_remembered_lookup_follows_the_slot() {
        use crate::test_support::FakeEndpoint;
        let fd = 900_051;
        let sdp = |ep: &Arc<FakeEndpoint>| {
            let mut e = Entry::new(false, false);
            e.transport = Transport::Sdp;
            e.sdp = SdpSide::stream(ep.clone(), false);
            e
        };
        let same = |h: &StreamHandle, ep: &Arc<FakeEndpoint>| {
            std::ptr::addr_eq(Arc::as_ptr(&h.endpoint), Arc::as_ptr(ep))
        };
        let (a, b) = (FakeEndpoint::new(), FakeEndpoint::new());
        insert(fd, sdp(&a));
        let h = stream(fd).unwrap();
        assert!(same(&h, &a));
        // Asked again: the same handle, remembered.
        assert!(Arc::ptr_eq(&h, &stream(fd).unwrap()));
        // Replaced while a call still holds the old handle.
        insert(fd, sdp(&b));
        assert!(same(&stream(fd).unwrap(), &b));
        let gone = Arc::downgrade(&h);
        drop(h);
        assert!(gone.upgrade().is_none(), "the replaced handle lives on");
        remove(fd);
        assert!(stream(fd).is_none());
        assert_eq!(a.closes(), 1);
    }

    #[test]
    fn duplicate_copies_and_overwrites() {
        let (a, b) = (900_101, 900_102);
        insert(a, Entry::new(true, false));
        insert(b, Entry::new(false, true));
        duplicate(a, b);
        assert!(get(b).unwrap().ipv6);
        remove(a);
        assert!(is_managed(b));
        // Duplicating an unmanaged fd onto a managed one forgets the latter.
        duplicate(a, b);
        assert!(!is_managed(b));
    }

    #[test]
    fn range_removal_and_out_of_range_fds() {
        for fd in 900_200..900_210 {
            insert(fd, Entry::new(false, false));
        }
        remove_range(900_203, 900_206);
        let left: Vec<i32> = (900_200..900_210).filter(|&fd| is_managed(fd)).collect();
        assert_eq!(
            left,
            vec![900_200, 900_201, 900_202, 900_207, 900_208, 900_209]
        );
        remove_range(900_200, 900_299);
        assert!(!is_managed(900_200));
        // Negative and huge fds are simply never managed.
        insert(-1, Entry::new(false, false));
        insert(i32::MAX, Entry::new(false, false));
        assert!(!is_managed(-1));
        assert!(!is_managed(i32::MAX));
    }

    #[test]
    fn fork_gate_waits_for_no_one_when_idle() {
        fork_prepare();
        assert_eq!(GATE.load(Ordering::Acquire), GATE_CLOSED);
        fork_done();
        assert_eq!(GATE.load(Ordering::Acquire) & GATE_CLOSED, 0);
    }
}
