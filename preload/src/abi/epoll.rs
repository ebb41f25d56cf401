//! `epoll_create`, `epoll_create1`, `epoll_ctl`, `epoll_wait`, `epoll_pwait`,
//! `epoll_pwait2`.
//!
//! While no fd is SDP and nothing is registered here, every call goes to
//! the C library unchanged. An SDP fd is never put in the kernel epoll set
//! itself (its kernel socket carries protocol bytes, not the program's
//! data). A connected stream tells the set's ready list ([`ReadyList`])
//! of each change of its levels ([`crate::sdp::LevelWatch`]); the list's
//! one eventfd per set is registered in the kernel set under a token of a
//! reserved range, readable while the list holds something. A stream still
//! connecting, and a listener, have their wake fd
//! ([`crate::sdp::WakeFd`]) registered instead. The program's interest
//! and `epoll_data` are kept here. `epoll_wait` translates the list and
//! each token event back into one event per fd, with the exact readiness
//! bits of that moment ([`crate::sdp::Readiness`]), in the program's
//! data, and drops wake-ups that no longer hold.
//!
//! * Level-triggered: a ready stream reported stays on the list, and the
//!   next wait looks at the list before it sleeps, so a ready fd is
//!   reported on every wait (a wake fd's `POLLIN`/`POLLOUT` are levels).
//! * `EPOLLET`: each change of a level is a new edge, and so is each
//!   arrival of data, as with TCP (a wake fd is registered
//!   edge-triggered, and the stream renews its readability).
//! * `EPOLLONESHOT`: after a report the registration is disarmed until
//!   `EPOLL_CTL_MOD`.
//! * One fd in several epoll sets: one registration per (epoll fd, fd),
//!   each on its set's list.
//! * After a `fork`, an SDP connection belongs to the first process that
//!   uses it ([`crate::backend`]); while one waits for that, `epoll_wait`
//!   counts as a use of the SDP fds registered in the set.
//!
//! * A listener with a hidden SDP listener: its kernel socket is
//!   registered too (under the registration's second token), and the two
//!   give one event.
//!
//! * A stream's own socket is registered too (edge-triggered, the third
//!   token): when bytes arrive, `epoll_wait` has the endpoint read them
//!   before it looks at the readiness, so the program need not wait for
//!   the progress thread to do it and tell the list. After the peer
//!   moved the connection to a new TCP connection (SuspComm, draft §13.1.1)
//!   that registration went with the old socket; the list alone reports
//!   the connection then.
//!
//! Tokens are `0x5D50 << 48 | id << 2 | which`: a non-canonical address,
//! never a user pointer; id 0 is the ready list's. Registrations end with the close of the fd number
//! or of the epoll fd; when an SDP connection falls back to TCP its
//! registrations become ordinary ones of the fd.
//!
//! * `EPOLL_CTL_DEL` of a stream leaves its registration *dormant*: the
//!   kernel registrations stay as they were, their events dropped; one
//!   that fires is silenced then (`EPOLLET` alone, asking for nothing), and
//!   an `EPOLL_CTL_ADD` of the same fd sets again only what differs. Event
//!   loops that add and delete an fd around every request
//!   (redis-benchmark's `ae` does) so cost at most one `epoll_ctl` per
//!   kernel registration, not two duplicates made and closed each time
//!   (a dormant stream stays on its set's list, its reports dropped).
//!   An `EPOLL_CTL_MOD` leaves the kernel registrations whose events it
//!   does not change alone.
#![allow(clippy::missing_safety_doc)]

use super::poll::{Side, Timeout};
use super::protect;
use super::spin::Spin;
use crate::sys::errno::{fail, keep_errno_on_success, SavedErrno};
use crate::sys::guard::{pid, Guard};
use crate::sys::real;
use crate::table;
use libc::{c_int, epoll_event, sigset_t, timespec};
use smallvec::SmallVec;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

const TOKEN_TAG: u64 = 0x5D50 << 48;
const TOKEN_MASK: u64 = 0xFFFF << 48;

/// Flags of the program's interest that shape the wake registrations.
const MODE_FLAGS: u32 = (libc::EPOLLET | libc::EPOLLONESHOT) as u32;

struct Registration {
    epfd: c_int,
    fd: c_int,
    /// The program's `events` (interest and flags) and `data`.
    events: u32,
    data: u64,
    side: Side,
    /// The wake fd's number in the kernel set: the endpoint's own, or
    /// (`wake_dup`) our duplicate of it; -1 for a stream the set's ready
    /// list watches instead (`levels`).
    wake: c_int,
    /// A connected stream: its levels come to the set's ready list.
    levels: Option<Arc<Watch>>,
    wake_dup: bool,
    /// A listener: the kernel listening socket `fd` is registered too
    /// (TCP connections arrive there), under the second token.
    kernel: bool,
    /// A stream: our duplicate of the connection's socket, registered
    /// edge-triggered under the third token: when bytes arrive the waiting
    /// thread reads them itself ([`crate::sdp::SdpEndpoint::pump`]).
    sock: Option<c_int>,
    /// `sock` is our duplicate (else the stream's own number).
    sock_dup: bool,
    /// A listener: our duplicate of the hidden listener's socket, whose
    /// queue holds SDP connections no process took yet, under the fourth
    /// token.
    queue: Option<c_int>,
    /// `EPOLLONESHOT` fired.
    disarmed: bool,
    /// Deleted by the program, kept for the next `EPOLL_CTL_ADD` of the
    /// fd (see the module docs); its events are dropped.
    dormant: bool,
    /// The kernel registrations ask for nothing: a dormant one fired.
    silenced: bool,
    /// The endpoint was told this set watches its socket
    /// ([`crate::sdp::SdpEndpoint::watch_socket`]): armed, with `sock`.
    watching: bool,
    /// The process that made the kernel registrations. A child of `fork`
    /// shares the epoll instance with it: when the child closes its copy
    /// of the fd (or of the epoll fd), it closes its own duplicates but
    /// must not delete the parent's registrations from the shared
    /// instance, as closing a shared fd never does with the kernel's own
    /// registrations.
    owner: i32,
}

impl Registration {
    /// The kernel registrations: (fd, which token).
    fn kernel_fds(&self) -> impl Iterator<Item = (c_int, u64)> {
        (self.wake >= 0)
            .then_some((self.wake, WAKE))
            .into_iter()
            .chain(self.kernel.then_some((self.fd, LISTENER)))
            .chain(self.sock.map(|s| (s, SOCKET)))
            .chain(self.queue.map(|q| (q, QUEUE)))
    }
}

/// A registration's kernel fds with their kinds, on the stack.
type KernelFds = SmallVec<[(c_int, u64); 4]>;

/// Hashes the registry's integer keys with one multiply per word: the
/// keys are ours (fd numbers, counters), so the default hasher's defence
/// against chosen keys buys nothing and costs a call per `epoll_ctl`.
#[derive(Default)]
struct IntHasher(u64);

impl Hasher for IntHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_i32(&mut self, n: i32) {
        self.write_u64(n as u32 as u64);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

type IntMap<K, V> = HashMap<K, V, BuildHasherDefault<IntHasher>>;

#[derive(Default)]
struct Registry {
    by_id: IntMap<u64, Registration>,
    by_key: IntMap<(c_int, c_int), u64>,
    /// How many registrations each epoll set holds. The registrations a
    /// `close` of an fd ends are found from the sets, a handful, by key:
    /// a server holding thousands of connections closes a file per
    /// request, and that close looked at every registration.
    in_set: IntMap<c_int, usize>,
    /// The ready list of each epoll fd that has one.
    sets: IntMap<c_int, Arc<ReadyList>>,
    next: u64,
}

impl Registry {
    fn insert(&mut self, id: u64, reg: Registration) {
        self.by_key.insert((reg.epfd, reg.fd), id);
        *self.in_set.entry(reg.epfd).or_default() += 1;
        self.by_id.insert(id, reg);
    }

    fn remove(&mut self, id: u64) -> Option<Registration> {
        let reg = self.by_id.remove(&id)?;
        self.by_key.remove(&(reg.epfd, reg.fd));
        if let Some(n) = self.in_set.get_mut(&reg.epfd) {
            *n -= 1;
            if *n == 0 {
                self.in_set.remove(&reg.epfd);
            }
        }
        Some(reg)
    }

    /// The registrations of the fd `fd`, one key per set.
    fn of_fd(&self, fd: c_int) -> impl Iterator<Item = u64> + '_ {
        self.in_set
            .keys()
            .filter_map(move |&epfd| self.by_key.get(&(epfd, fd)).copied())
    }

    /// The registrations that end when `n` closes: those of the fd `n`,
    /// and those in the set `n` (an epoll fd's close is rare: a look at
    /// every registration).
    fn naming(&self, n: c_int) -> Vec<u64> {
        let mut ids: Vec<u64> = self.of_fd(n).collect();
        if self.in_set.contains_key(&n) {
            ids.extend(
                self.by_id
                    .iter()
                    .filter(|(_, g)| g.epfd == n)
                    .map(|(id, _)| *id),
            );
        }
        ids
    }

    /// Whether closing `n` ends a registration.
    fn names(&self, n: c_int) -> bool {
        self.in_set.contains_key(&n) || self.sets.contains_key(&n) || self.of_fd(n).next().is_some()
    }

    /// Whether a registration is in the set `epfd`.
    fn set_in_use(&self, epfd: c_int) -> bool {
        self.in_set.contains_key(&epfd)
    }
}

/// The token of a set's ready list eventfd (no registration has id 0).
const READY_TOKEN: u64 = TOKEN_TAG;

/// An epoll set's ready list: the streams whose levels changed since the
/// set last looked (or that stay ready, level-triggered), with an eventfd
/// in the kernel set, readable while the list is not empty. One
/// descriptor per set where a readiness descriptor per stream took two.
struct ReadyList {
    queued: Mutex<Queued>,
    efd: c_int,
}

#[derive(Default)]
struct Queued {
    watches: Vec<Arc<Watch>>,
    /// The eventfd is readable.
    signaled: bool,
}

impl ReadyList {
    /// A list with its eventfd in the kernel set `epfd`.
    fn new(epfd: c_int) -> Result<ReadyList, c_int> {
        // SAFETY: plain eventfd creation.
        let efd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if efd < 0 {
            return Err(real::errno());
        }
        let efd = match hidden_dup(efd) {
            Some(d) => {
                close_quietly(efd);
                d
            }
            None => efd,
        };
        // Dropped on failure, closing the eventfd.
        let list = ReadyList {
            queued: Mutex::new(Queued::default()),
            efd,
        };
        kernel_ctl(
            epfd,
            libc::EPOLL_CTL_ADD,
            efd,
            libc::EPOLLIN as u32,
            READY_TOKEN,
        )?;
        Ok(list)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queued> {
        self.queued.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `w` once, for a change of its levels: the eventfd turns
    /// readable, waking a thread asleep on the set.
    fn push(&self, w: &Arc<Watch>) {
        if w.queued.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut q = self.lock();
        q.watches.push(w.clone());
        if !std::mem::replace(&mut q.signaled, true) {
            let _errno = SavedErrno::save();
            // SAFETY: our eventfd, a local 8-byte counter increment.
            unsafe { real::write(self.efd, (&1u64 as *const u64).cast(), 8) };
        }
    }

    /// Queues `w` once for the next wait of the thread that reported it
    /// (level-triggered, still ready), which looks at the list before it
    /// sleeps: no wake-up.
    fn requeue(&self, w: &Arc<Watch>) {
        if !w.queued.swap(true, Ordering::AcqRel) {
            self.lock().watches.push(w.clone());
        }
    }

    /// Takes `w` off the list if it is on it.
    fn unqueue(&self, w: &Arc<Watch>) {
        if w.queued.load(Ordering::Acquire) {
            let mut q = self.lock();
            q.watches.retain(|x| !Arc::ptr_eq(x, w));
            w.queued.store(false, Ordering::Release);
        }
    }

    fn is_empty(&self) -> bool {
        self.lock().watches.is_empty()
    }

    /// Moves what is queued onto `out`, last queued first, emptying the
    /// eventfd: one queued after that makes it readable again. The list
    /// keeps its room for the next pushes.
    fn take_into(&self, out: &mut Vec<Arc<Watch>>) {
        let mut q = self.lock();
        if std::mem::take(&mut q.signaled) {
            let mut n = 0u64;
            let _errno = SavedErrno::save();
            // SAFETY: our eventfd, into a local 8-byte counter.
            unsafe { real::read(self.efd, (&mut n as *mut u64).cast(), 8) };
        }
        // Under the lock: a push meanwhile finds the mark cleared and
        // queues again.
        for w in q.watches.drain(..).rev() {
            w.queued.store(false, Ordering::Release);
            out.push(w);
        }
    }
}

impl Drop for ReadyList {
    fn drop(&mut self) {
        close_quietly(self.efd);
    }
}

/// What a stream tells of its levels to a set's [`ReadyList`], for
/// registration `id` ([`crate::sdp::LevelWatch`]).
struct Watch {
    id: u64,
    list: Weak<ReadyList>,
    me: Weak<Watch>,
    /// In the list now.
    queued: AtomicBool,
    /// The levels last told: `POLLIN`, `POLLOUT` bits.
    levels: AtomicU32,
    /// Of those, what the registration asks for (both if neither: it
    /// waits for a hang-up or an error, which the levels do not name).
    asked: AtomicU32,
}

impl crate::sdp::LevelWatch for Watch {
    fn levels(&self, readable: bool, writable: bool) {
        let bits = if readable { libc::EPOLLIN as u32 } else { 0 }
            | if writable { libc::EPOLLOUT as u32 } else { 0 };
        self.levels.store(bits, Ordering::Release);
        // Levels the registration does not ask for would only wake the
        // wait for nothing to report (a new connection's writability,
        // told as a server registers it for reads).
        if bits & self.asked.load(Ordering::Acquire) == 0 {
            return;
        }
        // Under the stream's lock: the list's lock is a leaf.
        if let (Some(list), Some(me)) = (self.list.upgrade(), self.me.upgrade()) {
            list.push(&me);
        }
    }
}

impl Watch {
    fn new(id: u64, list: &Arc<ReadyList>, events: u32) -> Arc<Watch> {
        Arc::new_cyclic(|me| Watch {
            id,
            list: Arc::downgrade(list),
            me: me.clone(),
            queued: AtomicBool::new(false),
            levels: AtomicU32::new(0),
            asked: AtomicU32::new(Watch::asked(events)),
        })
    }

    /// The level bits a registration for `events` is told of.
    fn asked(events: u32) -> u32 {
        match events & (libc::EPOLLIN | libc::EPOLLOUT) as u32 {
            0 => (libc::EPOLLIN | libc::EPOLLOUT) as u32,
            bits => bits,
        }
    }

    /// Queues the registration if its stream is ready for `events` now.
    fn push_if_ready(&self, events: u32) {
        if self.levels.load(Ordering::Acquire) & events & (libc::EPOLLIN | libc::EPOLLOUT) as u32
            != 0
        {
            if let (Some(list), Some(me)) = (self.list.upgrade(), self.me.upgrade()) {
                list.push(&me);
            }
        }
    }
}

/// The ready list of the set `epfd`, made on first use.
fn ready_list(epfd: c_int) -> Result<Arc<ReadyList>, c_int> {
    if let Some(l) = with_registry(|r| r.sets.get(&epfd).cloned()) {
        return Ok(l);
    }
    let list = Arc::new(ReadyList::new(epfd)?);
    Ok(with_registry(|r| {
        r.sets.entry(epfd).or_insert(list).clone()
    }))
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);

fn with_registry<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    // Inside the fork gate, so a child never inherits the lock held.
    let _gate = table::enter_gate();
    let mut guard = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    let r = f(guard.get_or_insert_with(Registry::default));
    table::set_epoll_registrations(guard.as_ref().map_or(0, |g| g.by_id.len()));
    r
}

/// The kernel registrations of one: the wake fd, a listener's own socket,
/// a stream's socket, a listener's hidden queue.
const WAKE: u64 = 0;
const LISTENER: u64 = 1;
const SOCKET: u64 = 2;
const QUEUE: u64 = 3;

/// Token of registration `id` for `which` of its kernel registrations.
fn token(id: u64, which: u64) -> u64 {
    TOKEN_TAG | (id << 2) | which
}

/// A private duplicate of `fd`, numbered high to stay out of the program's
/// way, close-on-exec.
fn hidden_dup(fd: c_int) -> Option<c_int> {
    let _errno = SavedErrno::save();
    // SAFETY: F_DUPFD_CLOEXEC takes the lowest acceptable fd number.
    let d = unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, 512) };
    if d >= 0 {
        return Some(d);
    }
    // SAFETY: as above (the limit may be below 512).
    let d = unsafe { real::fcntl(fd, libc::F_DUPFD_CLOEXEC, 3) };
    (d >= 0).then_some(d)
}

fn close_quietly(fd: c_int) {
    let _errno = SavedErrno::save();
    // SAFETY: one of our own duplicates.
    unsafe { real::close(fd) };
}

/// Adds `fd` to the kernel set `epfd`. `own`: `fd` is one of a stream's
/// descriptors, which lives as long as the registration (the
/// registration holds the stream): it goes in under its own number, and
/// only when the set has that number already (the program registered
/// another of its fds for the same stream) under a duplicate's. Returns
/// the number registered and whether it is a duplicate (ours to close).
fn kernel_add(
    epfd: c_int,
    fd: c_int,
    own: bool,
    events: u32,
    data: u64,
) -> Result<(c_int, bool), c_int> {
    if own {
        match kernel_ctl(epfd, libc::EPOLL_CTL_ADD, fd, events, data) {
            Ok(()) => return Ok((fd, false)),
            Err(libc::EEXIST) => {}
            Err(e) => return Err(e),
        }
    }
    let d = hidden_dup(fd).ok_or(libc::ENOMEM)?;
    match kernel_ctl(epfd, libc::EPOLL_CTL_ADD, d, events, data) {
        Ok(()) => Ok((d, true)),
        Err(e) => {
            close_quietly(d);
            Err(e)
        }
    }
}

fn kernel_ctl(epfd: c_int, op: c_int, fd: c_int, events: u32, data: u64) -> Result<(), c_int> {
    let mut ev = epoll_event { events, u64: data };
    // SAFETY: a local epoll_event.
    if unsafe { real::epoll_ctl(epfd, op, fd, &mut ev) } == 0 {
        Ok(())
    } else {
        Err(real::errno())
    }
}

/// The kernel registration of a wake fd for the program's `events`: the
/// levels asked for and no other. A level the program did not ask for —
/// bytes it leaves unread while it waits to write — would fire again and
/// again, level-triggered, with nothing to report. Errors and a closed
/// connection show as writable too; a registration that asks for neither
/// hears of them from the stream's socket, registered beside it.
fn wake_events(events: u32) -> u32 {
    let mut kernel = events & MODE_FLAGS;
    if wants_read(events) {
        kernel |= libc::EPOLLIN as u32;
    }
    if wants_write(events) {
        kernel |= libc::EPOLLOUT as u32;
    }
    kernel
}

/// The kernel registration of a listener's own socket.
fn kernel_events(events: u32) -> u32 {
    (events & (libc::EPOLLIN | libc::EPOLLRDNORM | libc::EPOLLPRI) as u32) | (events & MODE_FLAGS)
}

fn events_for(which: u64, events: u32) -> u32 {
    match which {
        LISTENER | QUEUE => kernel_events(events),
        // New bytes only: data the endpoint cannot take now (its buffers
        // full) must not wake the set again and again.
        SOCKET => (libc::EPOLLIN | libc::EPOLLET) as u32 | (events & libc::EPOLLONESHOT as u32),
        _ => wake_events(events),
    }
}

fn wants_read(events: u32) -> bool {
    let input = libc::EPOLLIN | libc::EPOLLRDNORM | libc::EPOLLPRI | libc::EPOLLRDHUP;
    events & input as u32 != 0
}

fn wants_write(events: u32) -> bool {
    events & (libc::EPOLLOUT | libc::EPOLLWRNORM) as u32 != 0
}

fn add(epfd: c_int, fd: c_int, side: Side, events: u32, data: u64) -> Result<(), c_int> {
    // The table tells us when a registered fd falls back to TCP.
    table::set_on_fall_back(fell_back);
    // (dormant, of this very socket and process)
    let existing = with_registry(|r| {
        let reg = r.by_key.get(&(epfd, fd)).and_then(|id| r.by_id.get(id))?;
        Some((
            reg.dormant,
            reg.owner == pid() && same_side(&reg.side, &side),
        ))
    });
    match existing {
        Some((false, _)) => return Err(libc::EEXIST),
        Some((true, true)) => return rearm(epfd, fd, events, data, true),
        // Dormant for another socket that got the fd number, or a
        // parent's: it ends, and the fd is registered afresh.
        Some((true, false)) => {
            remove_ids(|r| r.by_key.get(&(epfd, fd)).copied().into_iter().collect());
        }
        None => {}
    }
    let id = with_registry(|r| {
        r.next += 1;
        r.next
    });
    let kernel = matches!(side, Side::Listener(_));
    // A connected stream tells the set's ready list of its levels; a
    // listener, or a stream still connecting, has a wake fd.
    let levels = match &side {
        Side::Stream(h) => {
            let list = ready_list(epfd)?;
            let w = Watch::new(id, &list, events);
            h.endpoint.watch_levels(w.clone()).then_some(w)
        }
        Side::Listener(_) => None,
    };
    // A listener's wake fd changes in a fork child: the set keeps its own
    // duplicate.
    let own = matches!(side, Side::Stream(_));
    let (wake, wake_dup) = match levels {
        Some(_) => (-1, false),
        None => kernel_add(
            epfd,
            side.wake_fd(),
            own,
            wake_events(events),
            token(id, WAKE),
        )?,
    };
    if let (true, Side::Stream(h)) = (wake >= 0, &side) {
        h.endpoint.hold_wake(true);
    }
    if kernel {
        if let Err(e) = kernel_ctl(
            epfd,
            libc::EPOLL_CTL_ADD,
            fd,
            kernel_events(events),
            token(id, LISTENER),
        ) {
            // (A listener: the wake fd is there.)
            let _ = kernel_ctl(epfd, libc::EPOLL_CTL_DEL, wake, 0, 0);
            if wake_dup {
                close_quietly(wake);
            }
            return Err(e);
        }
    }
    // Best effort: without it the program is woken by the wake fd alone.
    let sock = match &side {
        Side::Stream(h) => h.endpoint.kernel_fd(),
        Side::Listener(_) => None,
    }
    .and_then(|k| kernel_add(epfd, k, true, events_for(SOCKET, events), token(id, SOCKET)).ok());
    let (sock, sock_dup) = (sock.map(|(k, _)| k), sock.is_some_and(|(_, dup)| dup));
    // A listener's connections that no process took yet wake the set too:
    // the `accept` they lead to takes one (this process sets up none
    // ahead for the set, so a worker that exits leaves the others theirs).
    let queue = match &side {
        Side::Listener(h) => h.listener.queue_fd().and_then(hidden_dup),
        Side::Stream(_) => None,
    }
    .filter(|&d| {
        let ok = kernel_ctl(
            epfd,
            libc::EPOLL_CTL_ADD,
            d,
            events_for(QUEUE, events),
            token(id, QUEUE),
        )
        .is_ok();
        if !ok {
            close_quietly(d);
        }
        ok
    });
    with_registry(|r| {
        r.insert(
            id,
            Registration {
                epfd,
                fd,
                events,
                data,
                side,
                wake,
                levels: levels.clone(),
                wake_dup,
                kernel,
                sock,
                sock_dup,
                queue,
                disarmed: false,
                dormant: false,
                silenced: false,
                watching: false,
                owner: pid(),
            },
        );
    });
    // Ready already: told before the registration was here to take it.
    if let Some(w) = levels {
        w.push_if_ready(events);
    }
    watch(id);
    Ok(())
}

/// A stream registered while its nonblocking connect was under way has
/// its wake fd in the kernel set (the readiness descriptor the connect
/// handed out). Once it is connected, its levels go to the set's ready
/// list instead, as for a stream registered connected: the program's
/// `EPOLL_CTL_MOD`s are then ours alone, where each was a kernel
/// `epoll_ctl` on the wake fd (an event loop that asks for room only
/// while it has something to write makes two a request). Called when
/// the wake fd fired and at the program's `EPOLL_CTL_MOD`; does nothing
/// while the connect is under way.
fn adopt_levels(id: u64) {
    let found = with_registry(|r| {
        let g = r.by_id.get(&id)?;
        let connecting = g.levels.is_none() && g.wake >= 0 && !g.dormant && g.owner == pid();
        match (&g.side, connecting) {
            (Side::Stream(h), true) => Some((g.epfd, h.clone(), g.events, g.wake, g.wake_dup)),
            _ => None,
        }
    });
    let Some((epfd, h, events, wake, wake_dup)) = found else {
        return;
    };
    let Ok(list) = ready_list(epfd) else { return };
    let w = Watch::new(id, &list, events);
    if !h.endpoint.watch_levels(w.clone()) {
        return;
    }
    let adopted = with_registry(|r| match r.by_id.get_mut(&id) {
        Some(g) if g.levels.is_none() && g.wake == wake => {
            g.levels = Some(w.clone());
            g.wake = -1;
            g.wake_dup = false;
            true
        }
        _ => false,
    });
    if !adopted {
        let w: Arc<dyn crate::sdp::LevelWatch> = w;
        h.endpoint.unwatch_levels(&w);
        return;
    }
    let _ = kernel_ctl(epfd, libc::EPOLL_CTL_DEL, wake, 0, 0);
    if wake_dup {
        close_quietly(wake);
    }
    h.endpoint.hold_wake(false);
    // The socket joins if it did not at the registration (as at a MOD).
    let sock = with_registry(|r| r.by_id.get(&id).is_some_and(|g| g.sock.is_none()))
        .then(|| h.endpoint.kernel_fd())
        .flatten()
        .and_then(|k| {
            kernel_add(epfd, k, true, events_for(SOCKET, events), token(id, SOCKET)).ok()
        });
    if let Some((k, dup)) = sock {
        let kept = with_registry(|r| match r.by_id.get_mut(&id) {
            Some(g) if g.sock.is_none() => {
                g.sock = Some(k);
                g.sock_dup = dup;
                true
            }
            _ => false,
        });
        if !kept {
            // Deleted meanwhile by another thread.
            let _ = kernel_ctl(epfd, libc::EPOLL_CTL_DEL, k, 0, 0);
            if dup {
                close_quietly(k);
            }
        }
    }
    w.push_if_ready(events);
    watch(id);
}

/// Tells the endpoint of registration `id` that this set watches its
/// socket (with the socket registered), if it was not told yet; the mark
/// is taken back when the registration ends ([`remove_ids`]). Dormant
/// and `EPOLLONESHOT`-disarmed registrations keep it: the bytes wait in
/// the socket until the program asks again, as over TCP (a `poll` or
/// `select` meanwhile has them read, see `abi::poll`). Outside the
/// registry's lock: the endpoint takes the stream's.
fn watch(id: u64) {
    // Claimed first, so that two threads never both tell the endpoint.
    let side = with_registry(|r| {
        let g = r.by_id.get_mut(&id)?;
        if g.sock.is_none() || g.watching {
            return None;
        }
        g.watching = true;
        Some(g.side.clone())
    });
    let Some(side) = side else { return };
    let told = matches!(&side, Side::Stream(h) if h.endpoint.watch_socket(true));
    if !told {
        with_registry(|r| {
            if let Some(g) = r.by_id.get_mut(&id) {
                g.watching = false;
            }
        });
    }
}

/// Whether two sides are the same SDP socket.
fn same_side(a: &Side, b: &Side) -> bool {
    match (a, b) {
        (Side::Stream(a), Side::Stream(b)) => Arc::ptr_eq(a, b),
        (Side::Listener(a), Side::Listener(b)) => Arc::ptr_eq(a, b),
        _ => false,
    }
}

fn modify(epfd: c_int, fd: c_int, events: u32, data: u64) -> Result<(), c_int> {
    rearm(epfd, fd, events, data, false)
}

/// `EPOLL_CTL_MOD` of a live registration, or (`wake`) the `EPOLL_CTL_ADD`
/// that wakes a dormant one: every kernel registration is set anew then;
/// otherwise only those whose events change (or that `EPOLLONESHOT`
/// disarmed).
fn rearm(epfd: c_int, fd: c_int, events: u32, data: u64, wake: bool) -> Result<(), c_int> {
    if let Some(id) = with_registry(|r| r.by_key.get(&(epfd, fd)).copied()) {
        adopt_levels(id);
    }
    let Some((id, fds, side, has_sock, old, stale)) = with_registry(|r| {
        let id = *r.by_key.get(&(epfd, fd))?;
        let reg = r.by_id.get(&id).filter(|g| g.dormant == wake)?;
        Some((
            id,
            reg.kernel_fds().collect::<KernelFds>(),
            reg.side.clone(),
            reg.sock.is_some(),
            reg.events,
            reg.disarmed || reg.silenced,
        ))
    }) else {
        return Err(libc::ENOENT);
    };
    // Registered while a nonblocking connect was under way: the socket
    // joins once the connection has one.
    let mut added = None;
    if let (false, Side::Stream(h)) = (has_sock, &side) {
        added = h.endpoint.kernel_fd().and_then(|k| {
            kernel_add(epfd, k, true, events_for(SOCKET, events), token(id, SOCKET)).ok()
        });
    }
    for (k, which) in fds {
        let new = events_for(which, events);
        if !stale && new == events_for(which, old) {
            continue;
        }
        match kernel_ctl(epfd, libc::EPOLL_CTL_MOD, k, new, token(id, which)) {
            // The socket's registration is a help, not the program's: it
            // went with the old socket when a socket duplication moved
            // the stream's number to the new one.
            Err(libc::ENOENT) if which == SOCKET => {}
            r => r?,
        }
    }
    let levels = with_registry(|r| {
        let reg = r.by_id.get_mut(&id)?;
        reg.events = events;
        reg.data = data;
        reg.disarmed = false;
        reg.dormant = false;
        reg.silenced = false;
        if let Some((k, dup)) = added {
            reg.sock = Some(k);
            reg.sock_dup = dup;
        }
        reg.levels.clone()
    });
    // What the kernel would report again of a wake fd: the levels of now.
    if let Some(w) = levels {
        w.asked.store(Watch::asked(events), Ordering::Release);
        w.push_if_ready(events);
    }
    watch(id);
    Ok(())
}

/// `EPOLL_CTL_DEL`: a stream's registration made in this process goes
/// dormant (see the module docs); any other ends.
fn delete(epfd: c_int, fd: c_int) -> Result<(), c_int> {
    let found = with_registry(|r| {
        let id = *r.by_key.get(&(epfd, fd))?;
        let reg = r.by_id.get_mut(&id).filter(|g| !g.dormant)?;
        let keep = matches!(reg.side, Side::Stream(_)) && reg.owner == pid();
        if keep {
            // The kernel registrations stay as they are until one fires
            // (`translate` silences it then) or the fd is added again.
            reg.dormant = true;
        }
        Some(keep)
    });
    match found {
        None => Err(libc::ENOENT),
        Some(true) => Ok(()),
        Some(false) => {
            remove_ids(|r| r.by_key.get(&(epfd, fd)).copied().into_iter().collect());
            Ok(())
        }
    }
}

/// Removes the registrations `select` names from the kernel and from here.
fn remove_ids(select: impl FnOnce(&Registry) -> Vec<u64>) -> usize {
    let gone: Vec<Registration> = with_registry(|r| {
        let ids = select(r);
        ids.into_iter().filter_map(|id| r.remove(id)).collect()
    });
    // A set left without registrations lets go of its ready list (any
    // stream's registration made one, connected or not): the program may
    // close the epoll fd while we are not looking, and a new set under the
    // same number must not find this one's list.
    with_registry(|r| {
        for reg in &gone {
            if !r.set_in_use(reg.epfd) {
                r.sets.remove(&reg.epfd);
            }
        }
    });
    for reg in &gone {
        if let (true, Side::Stream(h)) = (reg.watching, &reg.side) {
            h.endpoint.watch_socket(false);
        }
        if let (Some(w), Side::Stream(h)) = (&reg.levels, &reg.side) {
            let w: Arc<dyn crate::sdp::LevelWatch> = w.clone();
            h.endpoint.unwatch_levels(&w);
        }
        if let (true, Side::Stream(h)) = (reg.wake >= 0, &reg.side) {
            h.endpoint.hold_wake(false);
        }
        for (k, _) in reg.kernel_fds().filter(|_| reg.owner == pid()) {
            // Before closing our duplicates: a registration lives on while
            // another fd (the program's) refers to the same socket.
            let _ = kernel_ctl(reg.epfd, libc::EPOLL_CTL_DEL, k, 0, 0);
        }
        // Our duplicates; the stream's own numbers stay its.
        let dups = [
            Some(reg.wake).filter(|_| reg.wake_dup),
            reg.sock.filter(|_| reg.sock_dup),
            reg.queue,
        ];
        for d in dups.into_iter().flatten() {
            close_quietly(d);
        }
    }
    gone.len()
}

/// True when some SDP fd is registered in an epoll set.
#[inline]
pub fn registered() -> bool {
    table::epoll_registrations() != 0
}

/// Whether closing `fd` ends a registration: it is an SDP fd in an epoll
/// set, or an epoll set holding one. Looks, changes nothing (a `vfork`
/// child's `close` may ask).
pub fn concerns(fd: c_int) -> bool {
    registered() && with_registry(|r| r.names(fd))
}

/// The fd number `fd` is being closed: its registrations (as an SDP fd or
/// as an epoll fd) end. Cheap when nothing is registered.
pub fn forget_fd(fd: c_int) {
    if table::epoll_registrations() == 0 {
        return;
    }
    remove_ids(|r| r.naming(fd));
    // An epoll fd: its ready list goes (its eventfd closes with the last
    // holder).
    with_registry(|r| r.sets.remove(&fd));
}

/// `fd` fell back from SDP to TCP: its registrations become ordinary
/// kernel registrations of the fd itself.
pub fn fell_back(fd: c_int) {
    if table::epoll_registrations() == 0 {
        return;
    }
    let moved: Vec<(c_int, u32, u64)> = with_registry(|r| {
        r.by_id
            .values()
            .filter(|g| g.fd == fd && !g.dormant)
            .map(|g| (g.epfd, g.events, g.data))
            .collect()
    });
    remove_ids(|r| r.of_fd(fd).collect());
    for (epfd, events, data) in moved {
        let _ = kernel_ctl(epfd, libc::EPOLL_CTL_ADD, fd, events, data);
    }
}

/// The readiness of a registration as epoll bits, within its interest
/// (a listener's: the hidden listener's and the kernel socket's `fd`).
fn epoll_bits(side: &Side, fd: c_int, events: u32) -> u32 {
    let asked = (events & 0xffff) as i16;
    let bits = match side {
        Side::Stream(h) => h.endpoint.readiness().poll_bits(asked),
        Side::Listener(h) => {
            // One look at both kernel sockets: the program's, and the
            // hidden listener's queue (anything on it is a connection to
            // take).
            let mut bits = h.listener.readiness_beside_queue().poll_bits(asked);
            let pollfd = |fd, events| libc::pollfd {
                fd,
                events,
                revents: 0,
            };
            let q = h.listener.queue_fd().unwrap_or(-1);
            let mut p = [pollfd(fd, asked), pollfd(q, libc::POLLIN)];
            // SAFETY: two local pollfds, no wait.
            if unsafe { real::poll(p.as_mut_ptr(), 2, 0) } > 0 {
                bits |= p[0].revents & asked;
                if p[1].revents != 0 {
                    bits |= libc::POLLIN & asked;
                }
            }
            bits
        }
    };
    bits as u16 as u32
}

/// A registration [`translate`] reports on, found in its events.
struct Hit {
    id: u64,
    side: Side,
    interest: u32,
    data: u64,
    oneshot: bool,
    epfd: c_int,
    fd: c_int,
    fds: KernelFds,
    /// The connection's socket had news: read it first.
    pump: bool,
    /// The wake fd (or a listener's socket) fired, or the ready list
    /// had it, not only the connection's socket.
    woken: bool,
    /// Level-triggered from the ready list: queued again while ready.
    levels: Option<Arc<Watch>>,
}

/// [`translate`]'s working lists, kept per thread: once grown, a wait
/// allocates nothing.
#[derive(Default)]
struct Scratch {
    hits: Vec<(usize, Hit)>,
    from_list: Vec<Arc<Watch>>,
    dropped: Vec<usize>,
}

thread_local! {
    static SCRATCH: std::cell::RefCell<Scratch> =
        std::cell::RefCell::new(Scratch::default());
}

/// Rewrites the first `n` kernel events of `events` (room for all of it)
/// in place: program events pass, token events become the program's,
/// merged per fd, stale ones dropped, and the set's ready list (`epfd`'s)
/// adds those of its streams. Returns how many remain, and whether an
/// edge-triggered socket event was left for the ready list or the wake
/// fd to report (so the caller looks once more).
fn translate(epfd: c_int, events: &mut [epoll_event], n: usize) -> (usize, bool) {
    // A wait inside a signal handler that interrupted this one, or one
    // while the thread ends, works on fresh lists.
    let mut sc = SCRATCH
        .try_with(|c| c.try_borrow_mut().map(|mut c| std::mem::take(&mut *c)).ok())
        .ok()
        .flatten()
        .unwrap_or_default();
    let r = translate_with(epfd, events, n, &mut sc);
    sc.hits.clear();
    sc.from_list.clear();
    sc.dropped.clear();
    let _ = SCRATCH.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            *c = sc;
        }
    });
    r
}

fn translate_with(
    epfd: c_int,
    events: &mut [epoll_event],
    n: usize,
    sc: &mut Scratch,
) -> (usize, bool) {
    let mut out = 0;
    let Scratch {
        hits,
        from_list,
        dropped,
    } = sc;
    let mut silence = Vec::new();
    let mut list = None;
    // The kernel's events first, then the ready list's.
    let mut i = 0;
    loop {
        let (id, pump) = if i < n {
            let ev = events[i];
            i += 1;
            let data = ev.u64;
            if data & TOKEN_MASK != TOKEN_TAG {
                events[out] = ev;
                out += 1;
                continue;
            }
            if data == READY_TOKEN {
                // (Twice when the caller added the list to the kernel's
                // event for it: the second take finds what came since.)
                if list.is_none() {
                    list = with_registry(|r| r.sets.get(&epfd).cloned());
                }
                if let Some(l) = &list {
                    l.take_into(from_list);
                }
                continue;
            }
            ((data & !TOKEN_MASK) >> 2, data & 3 == SOCKET)
        } else {
            match from_list.pop() {
                Some(w) if out < events.len() => (w.id, false),
                // No room left: the next wait has the rest.
                Some(w) => {
                    if let Some(l) = &list {
                        l.push(&w);
                        for w in from_list.drain(..) {
                            l.push(&w);
                        }
                    }
                    break;
                }
                None => break,
            }
        };
        if let Some((_, h)) = hits.iter_mut().find(|(_, h)| h.id == id) {
            h.pump |= pump;
            h.woken |= !pump;
            continue;
        }
        let hit = with_registry(|r| {
            let reg = r.by_id.get_mut(&id)?;
            if reg.dormant && !reg.silenced {
                // Deleted by the program, and a kernel registration
                // fired: none asks for anything from now on.
                reg.silenced = true;
                silence.push((reg.epfd, id, reg.kernel_fds().collect::<KernelFds>()));
            }
            if reg.disarmed || reg.dormant {
                return None;
            }
            Some(Hit {
                id,
                side: reg.side.clone(),
                interest: reg.events,
                data: reg.data,
                oneshot: reg.events & libc::EPOLLONESHOT as u32 != 0,
                epfd: reg.epfd,
                fd: reg.fd,
                fds: reg.kernel_fds().collect(),
                pump,
                woken: !pump,
                levels: reg.levels.clone(),
            })
        });
        if let Some(hit) = hit {
            // A placeholder, filled below once readiness is known.
            events[out] = epoll_event { events: 0, u64: 0 };
            hits.push((out, hit));
            out += 1;
        }
    }
    for (epfd, id, fds) in silence {
        for (k, which) in fds {
            // Only the errors and hang-ups the kernel always reports, once.
            let _ = kernel_ctl(
                epfd,
                libc::EPOLL_CTL_MOD,
                k,
                libc::EPOLLET as u32,
                token(id, which),
            );
        }
    }
    let mut deferred = false;
    for (slot, hit) in hits.iter() {
        if let (true, Side::Stream(h)) = (hit.pump, &hit.side) {
            // Level-triggered: the report below comes from the stream's
            // state, and the program calls on it next; the wake fd's levels
            // (and the ready list) catch up then, or at this thread's next
            // wait.
            let level = hit.interest & (libc::EPOLLET | libc::EPOLLONESHOT) as u32 == 0;
            if level && h.endpoint.pump_quietly().quiet {
                UNSETTLED.with(|u| u.borrow_mut().push(h.clone()));
            } else {
                h.endpoint.pump();
            }
        }
        // What this look reports is the stream as it is now: an entry the
        // pump above queued (or one queued meanwhile) says nothing more.
        // One queued from here on is news for the next look.
        if let (Some(w), true) = (&hit.levels, hit.woken) {
            if let Some(l) = w.list.upgrade() {
                l.unqueue(w);
            }
        }
        // Edge-triggered, the socket alone fired: what it brought is a new
        // edge of the wake fd or a new entry of the ready list (the pump
        // made it), reported from there — once, as TCP reports each
        // arrival once.
        let edge_only_from_socket = hit.interest & libc::EPOLLET as u32 != 0 && !hit.woken;
        deferred |= edge_only_from_socket;
        let bits = if edge_only_from_socket {
            0
        } else {
            epoll_bits(&hit.side, hit.fd, hit.interest)
        };
        if bits == 0 {
            dropped.push(*slot);
            if hit.oneshot {
                // The kernel disarmed what fired: re-arm.
                for &(k, which) in &hit.fds {
                    let _ = kernel_ctl(
                        hit.epfd,
                        libc::EPOLL_CTL_MOD,
                        k,
                        events_for(which, hit.interest),
                        token(hit.id, which),
                    );
                }
            }
            continue;
        }
        events[*slot] = epoll_event {
            events: bits,
            u64: hit.data,
        };
        // Level-triggered: reported again at the next wait while it holds,
        // as the kernel does (the next report looks at the stream again).
        if let (Some(w), false) = (&hit.levels, hit.interest & MODE_FLAGS != 0) {
            if let Some(l) = w.list.upgrade() {
                l.requeue(w);
            }
        }
        if hit.oneshot {
            with_registry(|r| {
                if let Some(g) = r.by_id.get_mut(&hit.id) {
                    g.disarmed = true;
                }
            });
            // The kernel disarmed what fired; disarm the other one too.
            for &(k, which) in &hit.fds {
                let _ = kernel_ctl(
                    hit.epfd,
                    libc::EPOLL_CTL_MOD,
                    k,
                    libc::EPOLLONESHOT as u32,
                    token(hit.id, which),
                );
            }
        }
    }
    for (_, hit) in hits.iter() {
        if hit.levels.is_none() && hit.woken && matches!(hit.side, Side::Stream(_)) {
            adopt_levels(hit.id);
        }
    }
    if dropped.is_empty() {
        return (out, deferred);
    }
    let mut kept = 0;
    for i in 0..out {
        if !dropped.contains(&i) {
            events[kept] = events[i];
            kept += 1;
        }
    }
    (kept, deferred)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_create(size: c_int) -> c_int {
    // SAFETY: the program's argument, passed on.
    unsafe { real::epoll_create(size) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_create1(flags: c_int) -> c_int {
    // SAFETY: the program's argument, passed on.
    unsafe { real::epoll_create1(flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_ctl(
    epfd: c_int,
    op: c_int,
    fd: c_int,
    event: *mut epoll_event,
) -> c_int {
    let ours = !table::no_sdp() && table::is_sdp(fd)
        || table::epoll_registrations() != 0
            && with_registry(|r| r.by_key.contains_key(&(epfd, fd)));
    if ours {
        if let Some(_g) = Guard::enter() {
            let ev = if event.is_null() {
                None
            } else {
                // SAFETY: the program's epoll_event.
                Some(unsafe { *event })
            };
            let result = protect(
                "epoll_ctl",
                || match (op, ev) {
                    (libc::EPOLL_CTL_DEL, _) => delete(epfd, fd),
                    (libc::EPOLL_CTL_ADD | libc::EPOLL_CTL_MOD, None) => Err(libc::EFAULT),
                    (libc::EPOLL_CTL_ADD, Some(ev)) => match Side::of(fd) {
                        Some(side) => add(epfd, fd, side, ev.events, ev.u64),
                        None => Err(libc::EBADF),
                    },
                    (libc::EPOLL_CTL_MOD, Some(ev)) => modify(epfd, fd, ev.events, ev.u64),
                    _ => Err(libc::EINVAL),
                },
                || Err(libc::ENOMEM),
            );
            return match result {
                Ok(()) => 0,
                Err(e) => fail(e),
            };
        }
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::epoll_ctl(epfd, op, fd, event) }
}

/// After a `fork`, an SDP connection waits for the first process that
/// uses it: waiting on an epoll set it is registered in is a use.
fn touch_pending(epfd: c_int) {
    if crate::sdp::backend().is_none_or(|b| b.pending() == 0) {
        return;
    }
    let sides: Vec<Side> = with_registry(|r| {
        r.by_id
            .values()
            .filter(|g| g.epfd == epfd && !g.dormant)
            .map(|g| g.side.clone())
            .collect()
    });
    for side in sides {
        side.readiness();
    }
}

/// Epoll sets some thread of this process is waiting on (-1: a free
/// slot), read at a `fork`: the SDP connections registered in them are in
/// use ([`crate::table::StreamHandle::in_use`]). One atomic store in,
/// one out; with more waiting threads than slots, the extra ones are not
/// seen (their sets' connections go pending as before).
static WAITING: [AtomicI32; 64] = [const { AtomicI32::new(-1) }; 64];

/// Holds a [`WAITING`] slot for one `epoll_wait`.
struct Waiting(Option<&'static AtomicI32>);

impl Waiting {
    fn begin(epfd: c_int) -> Waiting {
        Waiting(WAITING.iter().find(|slot| {
            slot.compare_exchange(-1, epfd, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        }))
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Some(slot) = self.0 {
            slot.store(-1, Ordering::Release);
        }
    }
}

/// Before a `fork` (the fork gate is closed, so no other thread holds the
/// registry): whether `h` is registered in a set that a thread waits on.
pub(super) fn in_waited_set(h: &table::StreamHandle) -> bool {
    let sets: Vec<c_int> = WAITING
        .iter()
        .map(|slot| slot.load(Ordering::Acquire))
        .filter(|&epfd| epfd >= 0)
        .collect();
    if sets.is_empty() {
        return false;
    }
    let guard = REGISTRY.lock().unwrap_or_else(|p| p.into_inner());
    guard.as_ref().is_some_and(|r| {
        r.by_id.values().any(|g| {
            sets.contains(&g.epfd)
                && !g.dormant
                && matches!(&g.side, Side::Stream(s) if std::ptr::eq(Arc::as_ptr(s), h))
        })
    })
}

thread_local! {
    /// Streams whose wake fd levels this thread's last `translate` left
    /// behind ([`crate::sdp::SdpEndpoint::pump_quietly`]).
    static UNSETTLED: std::cell::RefCell<Vec<Arc<table::StreamHandle>>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Before this thread waits again: the wake fds its last `translate` left
/// behind get their levels (a level-triggered fd the program did not read
/// empty is reported again, from its wake fd).
fn settle_levels() {
    let mut left = UNSETTLED.with(|u| std::mem::take(&mut *u.borrow_mut()));
    for h in left.drain(..) {
        h.endpoint.sync_readiness();
    }
    // The emptied list goes back, with its room, unless one came meanwhile.
    UNSETTLED.with(|u| {
        let mut u = u.borrow_mut();
        if u.is_empty() {
            *u = left;
        }
    });
}

/// Waits with `wait(timeout)` until a translated event remains or the
/// deadline passes. A count leaves `errno` as the program had it (see
/// [`keep_errno_on_success`]: our own calls on the way must not
/// make the program throw the events away).
fn wait_translated(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: Timeout,
    wait: impl Fn(Option<timespec>) -> c_int,
) -> c_int {
    keep_errno_on_success(|| wait_translated_inner(epfd, events, max, timeout, wait))
}

fn wait_translated_inner(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    mut timeout: Timeout,
    wait: impl Fn(Option<timespec>) -> c_int,
) -> c_int {
    protect("epoll_wait", || touch_pending(epfd), || ());
    protect("epoll_wait", settle_levels, || ());
    let _waiting = Waiting::begin(epfd);
    let (list, ours) = with_registry(|r| {
        (
            r.sets.get(&epfd).cloned(),
            r.in_set.get(&epfd).is_some_and(|&n| n > 0),
        )
    });
    // Level-triggered streams reported last time and still queued: the
    // first look does not sleep and takes the list beside the kernel's
    // events, as the kernel reports a ready fd at every wait (and the
    // other ready fds with it).
    let mut leftovers = max > 0 && !events.is_null() && list.is_some_and(|l| !l.is_empty());
    let mut spin = Spin::begin(ours, timeout.expired());
    let mut look_again = true;
    loop {
        let now = timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let n = if std::mem::take(&mut leftovers) {
            // The list's event goes after the kernel's (when they left
            // room; otherwise the next call takes the list).
            let n = wait(Some(now));
            if n < 0 {
                return n;
            }
            if n < max {
                // SAFETY: the program's array of max events, n < max.
                unsafe {
                    *events.add(n as usize) = epoll_event {
                        events: libc::EPOLLIN as u32,
                        u64: READY_TOKEN,
                    }
                };
                n + 1
            } else {
                n
            }
        } else {
            spin.wait(&wait, || timeout.remaining())
        };
        if n <= 0 || events.is_null() {
            return n;
        }
        // SAFETY: the program's array of max events, the first n <= max
        // written by the kernel.
        let got = unsafe { std::slice::from_raw_parts_mut(events, max.max(0) as usize) };
        let n = (n as usize).min(got.len());
        let (kept, deferred) = protect("epoll_wait", || translate(epfd, got, n), || (0, false));
        if kept > 0 {
            return kept as c_int;
        }
        if timeout.expired() {
            // A deferred edge is on the wake fd or the ready list now: one
            // more look (the deadline passed, so it does not wait).
            if std::mem::take(&mut look_again) && deferred {
                continue;
            }
            return 0;
        }
    }
}

fn timeout_ms(t: Option<timespec>) -> c_int {
    match t {
        None => -1,
        Some(t) => {
            let ms = t
                .tv_sec
                .saturating_mul(1000)
                .saturating_add((t.tv_nsec + 999_999) / 1_000_000);
            ms.clamp(0, c_int::MAX as i64) as c_int
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_wait(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: c_int,
) -> c_int {
    if table::epoll_registrations() != 0 {
        if let Some(_g) = Guard::enter() {
            // SAFETY: the program's array of max events.
            return wait_translated(epfd, events, max, Timeout::ms(timeout), |t| unsafe {
                real::epoll_wait(epfd, events, max, timeout_ms(t))
            });
        }
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::epoll_wait(epfd, events, max, timeout) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_pwait(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: c_int,
    mask: *const sigset_t,
) -> c_int {
    if table::epoll_registrations() != 0 {
        if let Some(_g) = Guard::enter() {
            // SAFETY: the program's array and signal mask.
            return wait_translated(epfd, events, max, Timeout::ms(timeout), |t| unsafe {
                real::epoll_pwait(epfd, events, max, timeout_ms(t), mask)
            });
        }
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::epoll_pwait(epfd, events, max, timeout, mask) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn epoll_pwait2(
    epfd: c_int,
    events: *mut epoll_event,
    max: c_int,
    timeout: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    if table::epoll_registrations() != 0 {
        if let Some(_g) = Guard::enter() {
            return wait_translated(epfd, events, max, Timeout::ts(timeout), |t| {
                let tp = t
                    .as_ref()
                    .map_or(std::ptr::null(), |t| t as *const timespec);
                // SAFETY: the program's array and signal mask, a local timespec.
                unsafe { real::epoll_pwait2(epfd, events, max, tp, mask) }
            });
        }
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::epoll_pwait2(epfd, events, max, timeout, mask) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::*;

    fn ctl(ep: c_int, op: c_int, fd: c_int, events: i32, data: u64) -> c_int {
        let mut ev = epoll_event {
            events: events as u32,
            u64: data,
        };
        // SAFETY: a local event.
        unsafe { epoll_ctl(ep, op, fd, &mut ev) }
    }

    fn wait(ep: c_int, timeout: c_int) -> Vec<(u32, u64)> {
        let mut evs = [epoll_event { events: 0, u64: 0 }; 8];
        // SAFETY: a local array of 8 events.
        let n = unsafe { epoll_wait(ep, evs.as_mut_ptr(), 8, timeout) };
        assert!(n >= 0, "epoll_wait failed: {}", real::errno());
        let mut v: Vec<(u32, u64)> = evs[..n as usize]
            .iter()
            .map(|e| (e.events, e.u64))
            .collect();
        v.sort_by_key(|e| e.1);
        v
    }

    fn epoll() -> c_int {
        // SAFETY: plain call.
        let ep = unsafe { epoll_create1(libc::EPOLL_CLOEXEC) };
        assert!(ep >= 0);
        ep
    }

    const IN: u32 = libc::EPOLLIN as u32;
    const OUT: u32 = libc::EPOLLOUT as u32;

    #[test]
    fn level_triggered_reports_data_not_protocol_bytes() {
        let (app, peer) = socketpair();
        let (other, other_peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        let e = epoll();
        assert_eq!(ctl(e, libc::EPOLL_CTL_ADD, app, libc::EPOLLIN, 7), 0);
        assert_eq!(ctl(e, libc::EPOLL_CTL_ADD, other, libc::EPOLLIN, 9), 0);
        assert_eq!(ctl(e, libc::EPOLL_CTL_ADD, app, libc::EPOLLIN, 7), -1);
        assert_eq!(real::errno(), libc::EEXIST);
        // SAFETY: writes to our own sockets.
        unsafe { libc::write(peer, b"proto".as_ptr().cast(), 5) };
        assert_eq!(wait(e, 0), vec![]);
        ep.deliver(b"data");
        // SAFETY: as above.
        unsafe { libc::write(other_peer, b"k".as_ptr().cast(), 1) };
        assert_eq!(wait(e, 1000), vec![(IN, 7), (IN, 9)]);
        // Level: still there on the next wait.
        assert_eq!(wait(e, 0), vec![(IN, 7), (IN, 9)]);
        ep.take_all();
        assert_eq!(wait(e, 0), vec![(IN, 9)]);
        assert_eq!(ctl(e, libc::EPOLL_CTL_DEL, app, 0, 0), 0);
        ep.deliver(b"more");
        assert_eq!(wait(e, 0), vec![(IN, 9)]);
        uninstall(app);
    }

    #[test]
    fn in_and_out_merge_and_oneshot_needs_a_mod() {
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        let e = epoll();
        assert_eq!(
            ctl(
                e,
                libc::EPOLL_CTL_ADD,
                app,
                libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLONESHOT,
                5
            ),
            0
        );
        ep.deliver(b"x");
        assert_eq!(wait(e, 1000), vec![(IN | OUT, 5)]);
        assert_eq!(wait(e, 0), vec![]);
        assert_eq!(
            ctl(
                e,
                libc::EPOLL_CTL_MOD,
                app,
                libc::EPOLLOUT | libc::EPOLLONESHOT,
                6
            ),
            0
        );
        assert_eq!(wait(e, 1000), vec![(OUT, 6)]);
        assert_eq!(wait(e, 0), vec![]);
        uninstall(app);
    }

    #[test]
    fn a_deleted_fd_is_quiet_until_added_again() {
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        let e = epoll();
        let errno_of = |r: c_int| (r, if r < 0 { real::errno() } else { 0 });
        assert_eq!(ctl(e, libc::EPOLL_CTL_ADD, app, libc::EPOLLIN, 1), 0);
        assert_eq!(ctl(e, libc::EPOLL_CTL_DEL, app, 0, 0), 0);
        // Gone for the program, whatever stays in the kernel.
        let del = ctl(e, libc::EPOLL_CTL_DEL, app, 0, 0);
        assert_eq!(errno_of(del), (-1, libc::ENOENT));
        let modify = ctl(e, libc::EPOLL_CTL_MOD, app, libc::EPOLLIN, 1);
        assert_eq!(errno_of(modify), (-1, libc::ENOENT));
        ep.deliver(b"x");
        assert_eq!(wait(e, 0), vec![]);
        let both = libc::EPOLLIN | libc::EPOLLOUT;
        assert_eq!(ctl(e, libc::EPOLL_CTL_ADD, app, both, 2), 0);
        assert_eq!(wait(e, 1000), vec![(IN | OUT, 2)]);
        let again = ctl(e, libc::EPOLL_CTL_ADD, app, libc::EPOLLIN, 3);
        assert_eq!(errno_of(again), (-1, libc::EEXIST));
        // A change the kernel registrations do not see still changes the
        // program's data; one they see changes the events.
        assert_eq!(ctl(e, libc::EPOLL_CTL_MOD, app, both, 4), 0);
        assert_eq!(wait(e, 1000), vec![(IN | OUT, 4)]);
        assert_eq!(ctl(e, libc::EPOLL_CTL_MOD, app, libc::EPOLLIN, 5), 0);
        assert_eq!(wait(e, 1000), vec![(IN, 5)]);
        uninstall(app);
    }

    #[test]
    fn edge_triggered_reports_each_new_readiness_once() {
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        let e = epoll();
        assert_eq!(
            ctl(
                e,
                libc::EPOLL_CTL_ADD,
                app,
                libc::EPOLLIN | libc::EPOLLET,
                1
            ),
            0
        );
        ep.deliver(b"a");
        assert_eq!(wait(e, 1000), vec![(IN, 1)]);
        assert_eq!(wait(e, 0), vec![]);
        // Drained to EAGAIN (the EPOLLET contract), new data is a new edge.
        ep.take_all();
        ep.deliver(b"b");
        assert_eq!(wait(e, 1000), vec![(IN, 1)]);
        uninstall(app);
    }

    /// An edge-triggered wait whose own lock wait a signal interrupted
    /// (the progress thread held the stream's lock; the handler has no
    /// SA_RESTART) returns the event with `errno` as the program left it.
    /// CPython's `select.epoll.poll` clears `errno`, calls, and takes
    /// `EINTR` as an interrupted call: it threw the events away and waited
    /// again, and an edge thrown away never comes back (soak bug 5: a
    /// connection waiting for `EPOLLOUT` stalled for good). A failed wait
    /// keeps its own `errno`.
    #[test]
    fn a_wait_returning_events_leaves_errno_as_the_program_had_it() {
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        let e = epoll();
        let interest = libc::EPOLLIN | libc::EPOLLOUT | libc::EPOLLET;
        assert_eq!(ctl(e, libc::EPOLL_CTL_ADD, app, interest, 4), 0);
        ep.deliver(b"x");
        let (n, errno, got) = with_lock_wait_interrupted(&ep, || {
            let mut evs = [epoll_event { events: 0, u64: 0 }; 8];
            real::set_errno(0);
            // SAFETY: a local array of 8 events.
            let n = unsafe { epoll_wait(e, evs.as_mut_ptr(), 8, 1000) };
            (n, real::errno(), (evs[0].events, evs[0].u64))
        });
        assert_eq!((n, got), (1, (IN | OUT, 4)));
        assert_eq!(errno, 0, "errno after a wait that returned an event");
        // No event: the timeout, errno as it was.
        real::set_errno(0);
        assert_eq!(wait(e, 0), vec![]);
        assert_eq!(real::errno(), 0);
        // A wait that fails says why.
        let mut ev = epoll_event { events: 0, u64: 0 };
        // SAFETY: one local event; fd -1 is no epoll instance.
        let n = unsafe { epoll_wait(-1, &mut ev, 1, 0) };
        assert_eq!((n, real::errno()), (-1, libc::EBADF));
        uninstall(app);
    }

    #[test]
    fn one_fd_in_two_sets_and_close_ends_registrations() {
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        let (e1, e2) = (epoll(), epoll());
        assert_eq!(ctl(e1, libc::EPOLL_CTL_ADD, app, libc::EPOLLIN, 1), 0);
        assert_eq!(ctl(e2, libc::EPOLL_CTL_ADD, app, libc::EPOLLIN, 2), 0);
        ep.deliver(b"z");
        assert_eq!(wait(e1, 1000), vec![(IN, 1)]);
        assert_eq!(wait(e2, 1000), vec![(IN, 2)]);
        let registered = |epfd: c_int| with_registry(|r| r.by_key.contains_key(&(epfd, app)));
        assert!(registered(e1) && registered(e2));
        // SAFETY: closing our own fd through the hook.
        unsafe { super::super::socket::close(app) };
        assert!(!registered(e1) && !registered(e2));
        assert_eq!(wait(e1, 0), vec![]);
    }

    #[test]
    fn a_close_ends_the_registrations_that_name_its_number_and_no_others() {
        let (a, _pa) = socketpair();
        let (b, _pb) = socketpair();
        let (other, _po) = socketpair();
        for fd in [a, b] {
            install(fd, FakeEndpoint::new());
        }
        let (e1, e2) = (epoll(), epoll());
        assert_eq!(ctl(e1, libc::EPOLL_CTL_ADD, a, libc::EPOLLIN, 1), 0);
        assert_eq!(ctl(e1, libc::EPOLL_CTL_ADD, b, libc::EPOLLIN, 2), 0);
        assert_eq!(ctl(e2, libc::EPOLL_CTL_ADD, b, libc::EPOLLIN, 3), 0);
        let keys = || {
            let mut k: Vec<(c_int, c_int)> = with_registry(|r| r.by_key.keys().copied().collect());
            k.sort();
            k
        };
        let mut all = vec![(e1, a), (e1, b), (e2, b)];
        all.sort();
        assert_eq!(keys(), all);
        assert!(concerns(a) && concerns(b) && concerns(e1) && concerns(e2));
        assert!(!concerns(other));
        // SAFETY: closing our own fds through the hook.
        unsafe { super::super::socket::close(other) };
        assert_eq!(keys(), all);
        // The set goes with both its registrations; b stays in e2.
        // SAFETY: as above.
        unsafe { super::super::socket::close(e1) };
        assert_eq!(keys(), vec![(e2, b)]);
        assert!(!concerns(e1) && !concerns(a) && concerns(b));
        assert!(with_registry(
            |r| !r.sets.contains_key(&e1) && r.sets.contains_key(&e2)
        ));
        // SAFETY: as above.
        unsafe { super::super::socket::close(b) };
        assert_eq!(keys(), vec![]);
        assert!(with_registry(|r| r.in_set.is_empty() && r.sets.is_empty()));
    }
    #[test]
    fn a_dup2_onto_a_registered_number_ends_its_registrations() {
        let (a, _pa) = socketpair();
        let (b, _pb) = socketpair();
        let (other, _po) = socketpair();
        for fd in [a, b] {
            install(fd, FakeEndpoint::new());
        }
        let e = epoll();
        assert_eq!(ctl(e, libc::EPOLL_CTL_ADD, a, libc::EPOLLIN, 1), 0);
        assert_eq!(ctl(e, libc::EPOLL_CTL_ADD, b, libc::EPOLLIN, 2), 0);
        // SAFETY: our own fds, through the hook.
        let b2 = unsafe { super::super::socket::dup(b) };
        assert!(b2 >= 0);
        // Onto a duplicate of its own socket: the kernel keeps the
        // registration, and so do we.
        // SAFETY: as above.
        assert_eq!(unsafe { super::super::socket::dup2(b2, b) }, b);
        assert!(concerns(b));
        // Onto another file: `a` now names a plain socket, in no set.
        // SAFETY: as above.
        assert_eq!(unsafe { super::super::socket::dup2(other, a) }, a);
        assert!(!concerns(a) && concerns(b));
        assert!(with_registry(|r| r.by_key.keys().all(|&(_, fd)| fd != a)));
        // The program registers the new file under the number: no EEXIST.
        assert_eq!(ctl(e, libc::EPOLL_CTL_ADD, a, libc::EPOLLIN, 3), 0);
    }
    /// A stream registered while its connect was under way has its wake fd
    /// in the kernel set; once connected, its levels go to the set's ready
    /// list (at the program's next `EPOLL_CTL_MOD` or when the wake fd
    /// fires), and changes of interest no longer touch the kernel set.
    #[test]
    fn a_stream_registered_while_connecting_moves_to_the_ready_list_once_connected() {
        for by_mod in [true, false] {
            let (fd, _peer) = socketpair();
            let ep = FakeEndpoint::new();
            ep.set_send_room(0);
            install(fd, ep.clone());
            let e = epoll();
            assert_eq!(ctl(e, libc::EPOLL_CTL_ADD, fd, libc::EPOLLOUT, 7), 0);
            let wake = with_registry(|r| r.by_id.values().find(|g| g.fd == fd).unwrap().wake);
            assert!(wake >= 0, "connecting: the wake fd is in the kernel set");
            assert_eq!(wait(e, 0), vec![]);
            ep.set_connected();
            if by_mod {
                assert_eq!(ctl(e, libc::EPOLL_CTL_MOD, fd, libc::EPOLLOUT, 7), 0);
            } else {
                // The connect's end: room, on the wake fd.
                ep.set_send_room(1 << 20);
                assert_eq!(wait(e, 1000), vec![(OUT, 7)]);
            }
            let reg = |f: fn(&Registration) -> bool| {
                with_registry(|r| f(r.by_id.values().find(|g| g.fd == fd).unwrap()))
            };
            assert!(
                reg(|g| g.levels.is_some() && g.wake < 0),
                "not on the ready list"
            );
            // Out of the kernel set: the kernel no longer knows it.
            let mut ev = epoll_event { events: 0, u64: 0 };
            // SAFETY: a local event.
            let r = unsafe { real::epoll_ctl(e, libc::EPOLL_CTL_DEL, wake, &mut ev) };
            assert_eq!((r, real::errno()), (-1, libc::ENOENT));
            // Reports come from the list now, interest changes are ours.
            ep.set_send_room(1 << 20);
            assert_eq!(ctl(e, libc::EPOLL_CTL_MOD, fd, libc::EPOLLIN, 7), 0);
            assert_eq!(wait(e, 0), vec![]);
            ep.deliver(b"x");
            assert_eq!(wait(e, 1000), vec![(IN, 7)]);
            assert_eq!(ctl(e, libc::EPOLL_CTL_MOD, fd, (IN | OUT) as i32, 7), 0);
            assert_eq!(wait(e, 0), vec![(IN | OUT, 7)]);
            for own in [fd, e] {
                // SAFETY: our own fds, through the hook.
                unsafe { super::super::socket::close(own) };
            }
        }
    }
}
