//! The progress thread (DESIGN §6 "Progress without the application"): one
//! per process, started with the first stream. It waits in `epoll` on every
//! registered link's socket (edge-triggered, readable and writable) and on
//! the links' timers, and pumps a link when its socket has news or a timer
//! is due: queued bytes are written as soon as the socket takes them,
//! incoming messages (data, credit updates) are placed into the Private
//! Buffers, closes finish after the application dropped the stream.
//!
//! It keeps off a link whose application thread is polling the socket
//! itself (see the `shared` module), and drops a link once the application
//! released it and its teardown was carried out.
//!
//! **Parking.** Every message arriving on a socket would wake this thread
//! as well as the application thread sleeping in `poll` on it — a second
//! wake-up per message on the latency path. So when an event finds the
//! link's poller active, the link is *parked*: its interest is cleared
//! (`EPOLL_CTL_MOD`, on this thread, off the critical path) and set again
//! [`PARK`] later. Setting it again reports the socket at once if it is
//! ready then, so nothing is missed; the price is that progress for an
//! application that stops polling comes at most [`PARK`] late. (A link
//! whose application reads the socket itself — an epoll set or a `poll`
//! watches it, or a blocking read waited on it — is not watched for
//! arrivals at all unless bytes wait for credit; parking is for those.)
//!
//! **Timers.** The thread sleeps until the nearest deadline of its links.
//! A link whose deadline moves wakes it only if the new one comes sooner
//! ([`wake_for`]): a burst of new connections, each with its MPA startup
//! timer seconds away, costs the thread no wake-up. What `wake_for` tells,
//! and the deadlines of the links it served, are all the thread needs to
//! know the nearest one (or one sooner); it looks at every link only once
//! that deadline has come.
//!
//! **fork.** A child of `fork` has no progress thread (only the forking
//! thread survives). A program that forks calls [`fork_prepare`] before,
//! [`fork_parent`] after in the parent and [`fork_child`] in the child (the
//! preload does it from its `pthread_atfork` handlers): the thread is
//! paused outside every lock across the fork, and the child starts its own
//! thread, with an empty table, on first use. Links inherited by the child
//! are not in it; [`super::SdpStream::resume_progress`] adds one.

use std::collections::HashMap;
use std::io;
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock, RwLockReadGuard};
use std::time::{Duration, Instant};

use rustix::buffer::spare_capacity;
use rustix::event::epoll::{self, CreateFlags, EventData, EventFlags};
use rustix::event::{eventfd, EventfdFlags, Timespec};

use crate::link::GIVE_BACK_AFTER;

/// A link as the thread services it (the stream's shared state is one).
/// The thread knows its links through this alone, so that a link can
/// tell the thread of its interest and deadline without the two modules
/// importing each other.
pub trait Serviced: Send + Sync {
    /// The link's key in the thread's table and epoll set.
    fn id(&self) -> u64;
    /// The socket, for epoll.
    fn sock(&self) -> RwLockReadGuard<'_, Arc<TcpStream>>;
    /// Released, and only waiting for its peer's end: looked at on the
    /// drain grid, not watched in the epoll set (`drain_lazily`).
    fn is_lazy(&self) -> bool;
    /// When the thread must look at the link next.
    fn deadline(&self) -> Option<Instant>;
    /// An application thread polls the socket itself.
    fn polled(&self) -> bool;
    /// The application let go of the link.
    fn is_released(&self) -> bool;
    /// Nothing waits to be written.
    fn written_out(&self) -> bool;
    /// FPDUs wait for room in the socket.
    fn waits_for_room(&self) -> bool;
    /// The thread reads the socket's arrivals (the application does not).
    fn reads(&self) -> bool;
    /// Moves what can move; whether the link is finished.
    fn service(&self, now: Instant) -> bool;
    /// The socket reported a hang-up.
    fn note_hangup(&self);
    /// The thread found the link's lock taken and left its visit to the
    /// holder.
    fn kick_pending(&self) -> bool;
}

/// A deadline kept in an atomic: nanoseconds since the process's first
/// use of it, [`NO_DEADLINE`] for none.
pub(super) fn encode(t: Option<Instant>) -> u64 {
    t.map_or(NO_DEADLINE, |t| {
        t.saturating_duration_since(base())
            .as_nanos()
            .min(u128::from(NO_DEADLINE - 1)) as u64
    })
}

/// The deadline [`encode`] kept.
pub(super) fn decode(v: u64) -> Option<Instant> {
    (v != NO_DEADLINE).then(|| base() + Duration::from_nanos(v))
}

/// The origin of the deadlines kept in atomics.
pub(super) fn base() -> Instant {
    static BASE: OnceLock<Instant> = OnceLock::new();
    *BASE.get_or_init(Instant::now)
}

pub(super) const NO_DEADLINE: u64 = u64::MAX;

/// How long a link whose application thread polls its socket is left out
/// of the epoll set (see Parking above).
pub const PARK: Duration = Duration::from_millis(1);

/// When a due link whose lock was taken, or whose poller sleeps, is looked
/// at again.
const KICK_RETRY: Duration = Duration::from_millis(1);

/// Arrivals, room and a hang-up: what a moved socket is watched for when
/// its link is not known (see [`interest`]).
const EVERYTHING: EventFlags = EventFlags::IN
    .union(EventFlags::OUT)
    .union(EventFlags::RDHUP)
    .union(EventFlags::ET);

/// What the thread waits for on a link's socket: arrivals unless the
/// application reads them itself (the stream's `watch_socket`), room only
/// while FPDUs wait for it ([`Serviced::waits_for_room`]: TCP reports room
/// again and again while a bulk sender keeps its socket nearly full, and
/// each report would wake the thread for nothing), a hang-up always.
fn interest(s: &dyn Serviced) -> EventFlags {
    let mut flags = EventFlags::RDHUP | EventFlags::ET;
    if s.reads() {
        flags |= EventFlags::IN;
    }
    if s.waits_for_room() {
        flags |= EventFlags::OUT;
    }
    flags
}

/// What runs first on a progress thread ([`set_thread_start`]).
static THREAD_START: OnceLock<fn()> = OnceLock::new();

/// Has `f` run first on every progress thread started from now on: a host
/// that interposes on a program (the preload) blocks signals there, so
/// that a signal for the process interrupts one of the program's threads,
/// as it would without the library. The first call wins.
pub fn set_thread_start(f: fn()) {
    let _ = THREAD_START.set(f);
}

/// Epoll key of the thread's own wake-up eventfd.
const WAKE_KEY: u64 = u64::MAX;

struct Thread {
    epoll: OwnedFd,
    wake: OwnedFd,
    links: Mutex<HashMap<u64, Arc<dyn Serviced>>>,
    /// Until when the thread sleeps (encoded as a link's deadline),
    /// [`AWAKE`] while it works: a deadline later than that needs no
    /// wake-up, one sooner does ([`wake_for`]).
    asleep_until: AtomicU64,
    /// Bumped by each [`wake_for`]: a thread that planned its sleep
    /// without the change plans again.
    changes: AtomicU64,
    /// The soonest deadline [`wake_for`] told of since the thread last
    /// looked (encoded): with the deadlines of the links it served, all
    /// it needs to plan its sleep without looking at every link.
    soonest: AtomicU64,
}

/// [`Thread::asleep_until`] while the thread works: it looks at every
/// deadline before it sleeps again.
const AWAKE: u64 = 0;

/// Fork generations a process may descend through (each child starts the
/// next slot); beyond that a child gets no progress thread.
const GENERATIONS: usize = 256;

/// This process's fork generation: the slot of [`THREADS`] it uses.
static GENERATION: AtomicUsize = AtomicUsize::new(0);

type Slot = OnceLock<io::Result<&'static Thread>>;

/// One progress thread per fork generation. A child moves to the next
/// slot, so its thread is created afresh (the parent's is not there).
static THREADS: [Slot; GENERATIONS] = [const { OnceLock::new() }; GENERATIONS];

/// Link ids, unique in a process and its children.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Set across a fork: the thread stays outside its work.
static PAUSE: AtomicBool = AtomicBool::new(false);
/// The thread is doing work (holding locks).
static BUSY: AtomicBool = AtomicBool::new(false);

fn thread() -> io::Result<&'static Thread> {
    let Some(slot) = THREADS.get(GENERATION.load(Ordering::Acquire)) else {
        return Err(io::Error::other("too many fork generations"));
    };
    slot.get_or_init(|| {
        let epoll = crate::fds::high(epoll::create(CreateFlags::CLOEXEC)?);
        let wake = crate::fds::high(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
        epoll::add(
            &epoll,
            &wake,
            EventData::new_u64(WAKE_KEY),
            EventFlags::IN | EventFlags::ET,
        )?;
        let t: &'static Thread = Box::leak(Box::new(Thread {
            epoll,
            wake,
            links: Mutex::new(HashMap::new()),
            asleep_until: AtomicU64::new(AWAKE),
            changes: AtomicU64::new(0),
            soonest: AtomicU64::new(encode(None)),
        }));
        std::thread::Builder::new()
            .name("sdp-progress".into())
            .spawn(move || {
                if let Some(f) = THREAD_START.get() {
                    f();
                }
                t.run()
            })?;
        Ok(t)
    })
    .as_ref()
    .map(|t| *t)
    .map_err(|e| io::Error::new(e.kind(), e.to_string()))
}

/// Whether this process's progress thread runs (it starts with the first
/// stream).
fn running() -> Option<&'static Thread> {
    THREADS
        .get(GENERATION.load(Ordering::Acquire))?
        .get()?
        .as_ref()
        .ok()
        .copied()
}

/// A fresh key for [`Serviced::id`].
pub fn next_id() -> u64 {
    NEXT_ID.fetch_add(1, Ordering::Relaxed)
}

/// Before `fork`: waits until the progress thread is outside its work
/// (holding no lock) and keeps it there until [`fork_parent`]. The caller
/// keeps its own threads out of the streams across the fork.
pub fn fork_prepare() {
    PAUSE.store(true, Ordering::SeqCst);
    if running().is_none() {
        return;
    }
    wake();
    while BUSY.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
}

/// After `fork`, in the parent: the progress thread goes on.
pub fn fork_parent() {
    PAUSE.store(false, Ordering::SeqCst);
    wake();
}

/// After `fork`, in the child (its only thread): the parent's progress
/// thread is not here; the next stream use starts one for this process,
/// with an empty table (see the module documentation).
pub fn fork_child() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
    BUSY.store(false, Ordering::SeqCst);
    PAUSE.store(false, Ordering::SeqCst);
}

/// Blocks until no link that the application released (closed) is left
/// unfinished in this process, or until `deadline`; returns how many are
/// left. For a process about to exit: a released link still has bytes or
/// its close exchange to carry out, which the exit would cut short.
pub fn wait_released(deadline: Instant) -> usize {
    let Some(t) = running() else {
        return 0;
    };
    loop {
        let left = lock(&t.links).values().filter(|s| s.is_released()).count();
        if left == 0 || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Blocks until every link that the application released has written all
/// it owes the peer — its data and its DisConn (§8.2.1), or it ended — and
/// `delivered` says the kernel passed the socket's bytes on, or until
/// `deadline`; returns how many are left. What an exiting process waits
/// for: like TCP's, the close then completes without the process (the
/// kernel sends the FIN), where [`wait_released`] would also wait for the
/// peer's DisConn, which a peer that is not closing never sends.
pub fn wait_written(deadline: Instant, delivered: impl Fn(BorrowedFd<'_>) -> bool) -> usize {
    let Some(t) = running() else {
        return 0;
    };
    loop {
        // Not under the table's lock: each check takes the link's lock.
        let released: Vec<Arc<dyn Serviced>> = lock(&t.links)
            .values()
            .filter(|s| s.is_released())
            .cloned()
            .collect();
        let left = released
            .iter()
            .filter(|s| !(s.written_out() && delivered(s.sock().as_fd())))
            .count();
        if left == 0 || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Hands a link to the progress thread.
pub fn register(shared: Arc<dyn Serviced>) -> io::Result<()> {
    let t = thread()?;
    // In the table first: the first (edge) event may come at once.
    if lock(&t.links).insert(shared.id(), shared.clone()).is_some() {
        // Registered already.
        return Ok(());
    }
    let r = epoll::add(
        &t.epoll,
        &*shared.sock(),
        EventData::new_u64(shared.id()),
        interest(&*shared),
    );
    if let Err(e) = r {
        lock(&t.links).remove(&shared.id());
        return Err(e.into());
    }
    // The socket is in the epoll set: what it brings wakes the thread.
    // Its deadline needs a wake-up only if sooner than the thread's own.
    wake_for(shared.deadline());
    Ok(())
}

/// Brings the thread's registration of link `id`'s socket in line with
/// [`interest`]. Asking for reads or room again reports the socket at
/// once if bytes or room are there.
pub(super) fn set_interest(id: u64) {
    let Some(t) = running() else {
        return;
    };
    let links = lock(&t.links);
    if let Some(s) = links.get(&id).filter(|s| !s.is_lazy()) {
        let _ = epoll::modify(&t.epoll, &*s.sock(), EventData::new_u64(id), interest(&**s));
    }
}

/// Takes a link back (it is finished, or was never set up).
pub fn deregister(id: u64) {
    let Some(t) = running() else {
        return;
    };
    if let Some(shared) = lock(&t.links).remove(&id) {
        if !shared.is_lazy() {
            let _ = epoll::delete(&t.epoll, &*shared.sock());
        }
    }
}

/// Takes a released link that only waits for its peer's end out of the
/// epoll set: the thread looks at it on the `DRAIN_LOOK`
/// grid (its deadline) with every other such link, instead of waking for
/// each arrival on it. (`EPOLLHUP` cannot be masked: the peer's FIN
/// after ours would wake the thread however little it asked for.)
pub(super) fn drain_lazily(shared: &dyn Serviced) {
    let Some(t) = running() else {
        return;
    };
    let links = lock(&t.links);
    if links.contains_key(&shared.id()) {
        let _ = epoll::delete(&t.epoll, &*shared.sock());
    }
}

/// Puts a link [`drain_lazily`] took out of the epoll set back in, if it
/// is not lazily drained after all; what its socket has is reported at
/// once.
pub(super) fn rejoin(shared: &dyn Serviced) {
    let Some(t) = running() else {
        return;
    };
    let links = lock(&t.links);
    if links.contains_key(&shared.id()) && !shared.is_lazy() {
        let _ = epoll::add(
            &t.epoll,
            &*shared.sock(),
            EventData::new_u64(shared.id()),
            interest(shared),
        );
    }
}

/// Points `sock`, link `id`'s stable socket descriptor, at `new` (the
/// socket of a socket duplication, draft §13.1.1 step 4). The number
/// stays the same (`dup3`) when `sock` was the last holder of the old
/// socket (the endpoint that shared it is gone); otherwise `sock` takes
/// `new` itself. The caller holds the link's lock and no application
/// thread polls `sock`.
pub(super) fn swap_socket(
    id: u64,
    sock: &RwLock<Arc<TcpStream>>,
    new: &Arc<TcpStream>,
) -> io::Result<()> {
    let (r, added) = rekey(id, sock, true, |cur| {
        match Arc::try_unwrap(std::mem::replace(cur, new.clone())) {
            Ok(old) => {
                let mut fd = OwnedFd::from(old);
                let r = rustix::io::dup3(&**new, &mut fd, rustix::io::DupFlags::CLOEXEC);
                if r.is_ok() {
                    *cur = Arc::new(TcpStream::from(fd));
                }
                r.map_err(io::Error::from)
            }
            Err(_) => Err(io::Error::other("the old socket is still shared")),
        }
    });
    added.and(r)
}

/// Points `sock`, link `id`'s socket descriptor, at `to` (another
/// descriptor of the same socket) and gives back the old one, with
/// whether the thread's registration followed. The caller holds the
/// link's lock and points the endpoint at `to` as well.
pub(super) fn move_socket(
    id: u64,
    sock: &RwLock<Arc<TcpStream>>,
    to: Arc<TcpStream>,
) -> (Arc<TcpStream>, io::Result<()>) {
    // The same socket: what the thread waits for is unchanged, and the
    // new registration reports at once what is there.
    rekey(id, sock, false, |cur| std::mem::replace(cur, to))
}

/// Runs `change` on `sock`, link `id`'s socket, keeping the thread's
/// registration: the old socket's is removed before the number changes
/// and the new one's added after (whether that worked is the second
/// result); `look_again`: the thread is woken to look at the link (a new
/// connection under it). Lock order: the table, then `sock` — as the thread takes
/// them.
fn rekey<R>(
    id: u64,
    sock: &RwLock<Arc<TcpStream>>,
    look_again: bool,
    change: impl FnOnce(&mut Arc<TcpStream>) -> R,
) -> (R, io::Result<()>) {
    let t = running();
    let links = t.map(|t| lock(&t.links));
    let registered = links
        .as_ref()
        .and_then(|l| l.get(&id))
        .is_some_and(|s| !s.is_lazy());
    let mut cur = sock.write().unwrap_or_else(|p| p.into_inner());
    if let (Some(t), true) = (t, registered) {
        let _ = epoll::delete(&t.epoll, &**cur);
    }
    let r = change(&mut cur);
    let mut added = Ok(());
    if let (Some(t), true) = (t, registered) {
        let flags = links
            .as_ref()
            .and_then(|l| l.get(&id))
            .map_or(EVERYTHING, |s| interest(&**s));
        added = epoll::add(&t.epoll, &**cur, EventData::new_u64(id), flags).map_err(Into::into);
    }
    drop(cur);
    drop(links);
    if look_again && registered {
        wake();
    }
    (r, added)
}

/// A link's deadline is now `deadline`: wakes the thread if it sleeps
/// past it. (Most links' first deadline, the MPA startup timer, is later
/// than the thread's planned wake-up when connections come in bursts.)
pub fn wake_for(deadline: Option<Instant>) {
    let Some(t) = running() else {
        return;
    };
    let d = encode(deadline);
    t.soonest.fetch_min(d, Ordering::SeqCst);
    t.changes.fetch_add(1, Ordering::SeqCst);
    let until = t.asleep_until.load(Ordering::SeqCst);
    if until != AWAKE && d < until {
        let _ = rustix::io::write(&t.wake, &1u64.to_ne_bytes());
    }
}

/// Makes the thread look at its links again (its table or a link's
/// socket changed, or a fork is under way).
pub fn wake() {
    if let Some(t) = running() {
        let _ = rustix::io::write(&t.wake, &1u64.to_ne_bytes());
    }
}

/// Marks the thread busy, first waiting outside while a fork is being
/// prepared ([`fork_prepare`] waits for the mark to go).
fn enter_work() {
    loop {
        if PAUSE.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_micros(200));
            continue;
        }
        BUSY.store(true, Ordering::SeqCst);
        if !PAUSE.load(Ordering::SeqCst) {
            return;
        }
        BUSY.store(false, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Thread {
    fn run(&self) {
        let mut events = Vec::with_capacity(256);
        let mut due: Vec<Arc<dyn Serviced>> = Vec::new();
        let mut parked: Vec<(Instant, Arc<dyn Serviced>)> = Vec::new();
        // The links' nearest deadline as far as known: never later than
        // the true one (a deadline that comes sooner is told, one that
        // moves later is found when this one passes), so the thread looks
        // at every link only when a deadline is due, not at each event —
        // with 10 000 links that look was most of its time.
        let mut timer: Option<Instant> = None;
        let mut release = Release::default();
        loop {
            let seen = self.changes.load(Ordering::SeqCst);
            let told = decode(self.soonest.swap(encode(None), Ordering::SeqCst));
            timer = timer.into_iter().chain(told).min();
            let next = timer
                .into_iter()
                .chain(parked.first().map(|p| p.0))
                .chain(release.due())
                .min();
            self.asleep_until.store(encode(next), Ordering::SeqCst);
            if self.changes.load(Ordering::SeqCst) != seen {
                // A deadline came while we looked: look again.
                self.asleep_until.store(AWAKE, Ordering::SeqCst);
                continue;
            }
            let timeout = next.map(|t| {
                // Whole milliseconds, rounded up: `epoll_pwait` takes
                // those, and a deadline less than one away would
                // otherwise be waited for by looking again and again.
                let d = t.saturating_duration_since(Instant::now());
                let d = Duration::from_millis(d.as_nanos().div_ceil(1_000_000) as u64);
                Timespec {
                    tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
                    tv_nsec: i64::from(d.subsec_nanos()),
                }
            });
            events.clear();
            let r = epoll::wait(&self.epoll, spare_capacity(&mut events), timeout.as_ref());
            self.asleep_until.store(AWAKE, Ordering::SeqCst);
            if r.is_err() {
                continue;
            }
            enter_work();
            let now = Instant::now();
            {
                let links = lock(&self.links);
                for ev in &events {
                    let key = ev.data.u64();
                    if key == WAKE_KEY {
                        let mut buf = [0u8; 8];
                        let _ = rustix::io::read(&self.wake, &mut buf);
                    } else if let Some(s) = links.get(&key) {
                        let flags = ev.flags;
                        if flags.intersects(EventFlags::RDHUP | EventFlags::HUP | EventFlags::ERR) {
                            s.note_hangup();
                        }
                        if s.polled() {
                            // Its application thread reads the socket.
                            let data = EventData::new_u64(s.id());
                            let _ = epoll::modify(&self.epoll, &*s.sock(), data, EventFlags::ET);
                            parked.push((now + PARK, s.clone()));
                        } else {
                            due.push(s.clone());
                        }
                    }
                }
                if timer.is_some_and(|t| t <= now) {
                    // One pass: the links that are due, and the nearest
                    // deadline of the others.
                    timer = None;
                    for s in links.values() {
                        match s.deadline() {
                            Some(d) if d <= now => due.push(s.clone()),
                            Some(d) => timer = Some(timer.map_or(d, |t| t.min(d))),
                            None => {}
                        }
                    }
                }
                // Parked links come back: an event follows at once if their
                // socket is ready.
                let back = parked.iter().take_while(|p| p.0 <= now).count();
                for (_, s) in parked.drain(..back) {
                    if links.contains_key(&s.id()) {
                        let data = EventData::new_u64(s.id());
                        let _ = epoll::modify(&self.epoll, &*s.sock(), data, interest(&*s));
                    }
                }
            }
            for s in due.drain(..) {
                if s.service(now) {
                    self.remove(&*s);
                } else if let (true, Some(d)) = (s.kick_pending() || s.polled(), s.deadline()) {
                    // The lock's holder serves the kick when it unlocks
                    // (if it unlocks through `Locked`), and a poller its
                    // timers when its sleep ends at them: looked at again a
                    // little later, not at once and again and again while
                    // the lock is taken or the poller sleeps.
                    let d = d.max(now + KICK_RETRY);
                    timer = Some(timer.map_or(d, |t| t.min(d)));
                } else if let Some(d) = s.deadline() {
                    // Served: its deadline may have moved later, untold.
                    timer = Some(timer.map_or(d, |t| t.min(d)));
                }
            }
            release.note(now);
            BUSY.store(false, Ordering::SeqCst);
        }
    }

    fn remove(&self, s: &dyn Serviced) {
        if lock(&self.links).remove(&s.id()).is_some() && !s.is_lazy() {
            let _ = epoll::delete(&self.epoll, &*s.sock());
        }
    }
}

/// The memory idle links gave back ([`crate::link::take_given_back`]),
/// released to the kernel by the allocator at most once per
/// [`GIVE_BACK_AFTER`]: the release looks at every free chunk of the
/// process, so many connections going idle one after the other share one.
#[derive(Default)]
struct Release {
    pending: usize,
    last: Option<Instant>,
}

/// Bytes given back that are worth a release.
const RELEASE_ABOVE: usize = 256 * 1024;

impl Release {
    fn note(&mut self, now: Instant) {
        self.pending += crate::link::take_given_back();
        if self.pending >= RELEASE_ABOVE && self.due().is_none_or(|t| t <= now) {
            self.pending = 0;
            self.last = Some(now);
            crate::sys::release_free_memory();
        }
    }

    /// When a release waiting for its turn is due.
    fn due(&self) -> Option<Instant> {
        match self.last {
            Some(t) if self.pending >= RELEASE_ABOVE => Some(t + GIVE_BACK_AFTER),
            _ => None,
        }
    }
}
