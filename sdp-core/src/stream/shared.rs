//! What one stream's handles, the application threads using it and the
//! progress thread share, and who may touch the socket when.
//!
//! # Locking
//!
//! One mutex per link holds the [`Link`], the [`Endpoint`] (socket and
//! iWARP connection) and the readiness descriptor. Whoever holds it may
//! pump: read the socket into the Private Buffers, drive the link, write
//! what is queued, act on the teardown, fire timers ([`Inner::pump`]).
//!
//! An application thread that must wait (blocking read or write, connect)
//! becomes the **poller**: it marks itself, releases the lock and sleeps in
//! `poll(2)` on the socket (readable; writable when bytes are queued) and
//! on the stream's wake-up eventfd, with the nearest deadline as timeout.
//! It then reads the socket itself — no hand-off through another thread on
//! the blocking path. Other application threads that must wait meanwhile
//! sleep on the stream's bell (a condition variable a signal interrupts,
//! [`bell`]) and are woken whenever the lock is
//! released after a change — also by a thread that goes to sleep itself
//! after its pumps moved something: a writer without credit that polls
//! may receive what the reader waits for.
//!
//! The progress thread ([`super::progress`]) keeps off a link whose poller
//! is active (an atomic flag, checked again under the lock): it could
//! otherwise drain the socket between the poller's last check and its
//! `poll`, stealing its wake-up. Any other thread that changes the link
//! while a poller sleeps writes the wake-up eventfd. When the progress
//! thread finds the lock taken it leaves a *kick*; every holder checks it
//! after unlocking and pumps again, so no socket edge is lost.
//!
//! # Zcopy
//!
//! A blocking call that lends its buffer for Zcopy ([`crate::link::zcopy`])
//! becomes the **Zcopy owner** until the buffer's completion: only it
//! reads or writes the socket, since the engine may place into or send
//! from that buffer at any time. Everyone else's pump only drives the link
//! (receives already in the Private Buffers can be read, credit updates
//! get posted); a thread that must wait leaves the socket to the owner
//! and sleeps on the condition variable, which the owner signals after
//! each of its pumps. Before it sleeps it wakes the owner if its own
//! pumps left the owner something to do: bytes to write, a completion.

use std::io;
use std::net::TcpStream;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, RwLock, RwLockReadGuard};
use std::thread::ThreadId;
use std::time::{Duration, Instant};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::io::Errno;

use self::bell::Bell;
use super::busy_poll::{poll_until, BusyPoll};
use super::counters::{Counters, Snapshot};
use super::progress::{base, decode, encode, Serviced, NO_DEADLINE};
use super::readiness::{LevelWatch, Readiness};
use crate::conn::FlowControlMode;
use crate::link::{Lent, Link};
use crate::verbs::{ErrorKind, Teardown};
use iwarp::driver::{Endpoint, Progress};

mod bell;
mod resume;
#[cfg(test)]
mod tests;

/// How long a closed link keeps reading after its FIN, waiting for the
/// peer's (see [`Inner::finished`]).
pub const DRAIN: Duration = Duration::from_secs(5);

/// How often the progress thread looks at the released links that only
/// wait for their peer's end ([`Inner::drains_only`]), all at once, and
/// steps in for the streams handed to a program that has not watched them
/// ([`Shared::give_grace`]).
pub const DRAIN_LOOK: Duration = Duration::from_millis(50);

/// The next point of the [`DRAIN_LOOK`] grid after `now`: every lazily
/// drained link has it as its deadline, so that they share one wake-up.
fn drain_look(now: Instant) -> Instant {
    let step = DRAIN_LOOK.as_nanos();
    let n = now.saturating_duration_since(base()).as_nanos() / step + 1;
    base() + Duration::from_nanos((n * step).min(u64::MAX as u128) as u64)
}

/// Most pumps [`Inner::settle_input`] makes for one report: more than the
/// credit-only messages that can come in a row before data.
const SETTLE_ROUNDS: usize = 64;

/// The progress thread services a link through its shared state.
impl Serviced for Shared {
    fn id(&self) -> u64 {
        self.id
    }
    fn sock(&self) -> RwLockReadGuard<'_, Arc<TcpStream>> {
        Shared::sock(self)
    }
    fn is_lazy(&self) -> bool {
        Shared::is_lazy(self)
    }
    fn deadline(&self) -> Option<Instant> {
        Shared::deadline(self)
    }
    fn polled(&self) -> bool {
        Shared::polled(self)
    }
    fn is_released(&self) -> bool {
        Shared::is_released(self)
    }
    fn written_out(&self) -> bool {
        Shared::written_out(self)
    }
    fn waits_for_room(&self) -> bool {
        Shared::waits_for_room(self)
    }
    fn reads(&self) -> bool {
        Shared::reads(self)
    }
    fn service(&self, now: Instant) -> bool {
        Shared::service(self, now)
    }
    fn note_hangup(&self) {
        Shared::note_hangup(self)
    }
    fn kick_pending(&self) -> bool {
        Shared::kick_pending(self)
    }
}

fn error_kind(e: &io::Error) -> ErrorKind {
    match e.kind() {
        io::ErrorKind::TimedOut => ErrorKind::TimedOut,
        io::ErrorKind::ConnectionRefused => ErrorKind::Refused,
        _ => ErrorKind::Reset,
    }
}

/// One more (`on`) or one less in `n`.
fn count(n: &AtomicUsize, on: bool) {
    if on {
        n.fetch_add(1, Ordering::SeqCst);
    } else {
        let _ = n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1));
    }
}

/// The state under the lock.
#[derive(Debug)]
pub struct Inner {
    /// The SDP link.
    pub link: Link,
    /// The socket and the iWARP connection.
    pub ep: Endpoint,
    /// EOF or a socket error was seen: no more reading.
    llp_end: bool,
    /// The graceful teardown's FIN went (shutdown(SHUT_WR)).
    shut_wr: bool,
    /// The abortive teardown's reset went.
    reset: bool,
    /// After our FIN: how long the socket is read (and what comes
    /// discarded) waiting for the peer's FIN.
    drain_until: Option<Instant>,
    readiness: Option<Readiness>,
    /// Only those who say so poll the readiness descriptor
    /// ([`Shared::readiness_on_demand`]) ...
    readiness_on_demand: bool,
    /// ... and none does now: its levels are not kept.
    readiness_idle: bool,
    /// Told of the levels too ([`Shared::watch_levels`]), with the levels
    /// they were last told.
    watches: Watches,
    told: (bool, bool),
    /// [`Inner::rx_seen`] for the watches.
    told_rx: u64,
    /// The receive stream's length at the last readiness update.
    rx_seen: u64,
    poller_active: bool,
    /// The poller's wake-up eventfd ([`thread_wake`]), while it polls.
    poller_wake: Option<Arc<OwnedFd>>,
    /// The poller's `poll` asks for socket space too: it wakes by itself
    /// when bytes can go.
    polling_out: bool,
    cond_waiters: u32,
    wake_pending: bool,
    /// A pump moved something (socket, timers) that the waiting threads
    /// have not been woken for yet (see [`Locked::wait`]).
    news: bool,
    /// No handle is left: the progress thread finishes the close.
    pub released: bool,
    /// Released, and all that is left is the peer's end: looked at on the
    /// progress thread's [`DRAIN_LOOK`] grid, not woken for (see
    /// [`Inner::drains_only`]).
    lazy: bool,
    /// Handed to a program that has not watched the socket yet: the
    /// progress thread reads it from this point on ([`Shared::give_grace`]).
    grace_until: Option<Instant>,
    /// O_NONBLOCK.
    pub nonblocking: bool,
    /// SO_RCVTIMEO.
    pub read_timeout: Option<Duration>,
    /// [`Shared`]'s handle of the socket, which a socket duplication
    /// points at the new one ([`resume`]).
    sock: Arc<RwLock<Arc<TcpStream>>>,
    /// [`Shared::id`].
    id: u64,
    /// SO_SNDTIMEO.
    pub write_timeout: Option<Duration>,
    /// SO_LINGER: zero aborts on close, more waits for the close.
    pub linger: Option<Duration>,
    /// The socket reported hang-up (RDHUP, HUP or ERR) since the last
    /// pump: read past a short read (see [`Inner::pump`]).
    hangup_hint: bool,
    /// The thread whose Zcopy buffer is lent (see the module docs).
    zc_owner: Option<ThreadId>,
    /// A Zcopy write waits for an idle Zcopy read to give the socket up:
    /// reads do not post again meanwhile.
    pub zc_writer_waiting: bool,
    /// The readiness descriptor's levels are left as they are
    /// ([`Inner::pump_quietly`]).
    quiet_levels: bool,
    /// [`Inner::pump_quietly`] ran under this hold of the lock.
    quiet_unlock: bool,
    /// The readiness descriptor's levels were left behind by a quiet pump
    /// and no [`Inner::update_readiness`] has set them since.
    levels_stale: bool,
    /// The connection moved to a new socket (SuspComm): epoll sets that
    /// watched the old one no longer see it ([`Shared::watch_socket`]).
    pub(super) socket_moved: bool,
    /// The buffer length of the program's last read ([`Inner::read_len`]).
    last_read: u32,
    /// How long this stream's reader polls before it sleeps.
    busy_poll: BusyPoll,
}

/// Caller memory lent to one pump, and where its reading may stop. Both
/// stops hold only while the program's reads take two messages or more
/// ([`Inner::read_len`]); the socket is read until empty otherwise.
#[derive(Default)]
struct Lend<'a> {
    /// A waiting reader's buffer (Bcopy direct receive): reading stops
    /// once no more of the socket's messages can land there, and the rest
    /// waits in the socket for the reader's next call.
    recv_into: Option<&'a mut [u8]>,
    /// Reading stops once a message arrived: the caller only needs to know
    /// that the stream is readable ([`Inner::pump_quietly`]), and what
    /// follows may go straight into the reader's buffer then.
    first_arrival: bool,
    /// The Zcopy owner's pump, with its buffers.
    zcopy: bool,
    zc_send: Option<&'a [u8]>,
    zc_recv: Option<&'a mut [u8]>,
}

impl Inner {
    /// Wakes the thread polling the socket, once until it looks.
    fn wake_poller(&mut self) {
        if self.poller_active && !self.wake_pending {
            if let Some(w) = &self.poller_wake {
                self.wake_pending = true;
                let _ = rustix::io::write(&**w, &1u64.to_ne_bytes());
            }
        }
    }

    /// Reads the socket, drives the link, writes what is queued, acts on
    /// the teardown and the timers, until nothing moves. True if anything
    /// did.
    pub fn pump(&mut self, now: Instant) -> bool {
        self.pump_lent(now, None)
    }

    /// [`Inner::pump`] for a reader waiting with `buf` (no MSG_PEEK or
    /// MSG_OOB): when nothing is unread, the next message's payload is
    /// received straight into `buf` (DESIGN §7, [`Link::lend_recv`]).
    /// Returns the bytes that landed there, from its start, which are
    /// read; 0 when none did (what arrived is in the Private Buffers). Pass
    /// the same `buf` on every call of one read, and end the read with
    /// [`Inner::reader_leaves`].
    pub fn pump_for_reader(&mut self, now: Instant, buf: &mut [u8]) -> usize {
        self.link.drive(now, self.ep.connection_mut());
        if self.reset || !self.link.lend_recv(now, self.ep.connection_mut(), buf) {
            self.pump(now);
        } else {
            self.pump_lent(now, Some(&mut *buf));
        }
        let n = self.link.take_received_direct();
        if n > 0 {
            // The read returns these; a next message landing behind them
            // goes back to the Private Buffers.
            self.reader_leaves(now, buf);
        } else {
            self.link.park_recv(self.ep.connection_mut());
        }
        n
    }

    /// A read of `len` bytes starts: what a pump that only needs to know
    /// of an arrival leaves in the socket follows its size ([`Lend`]).
    pub fn read_len(&mut self, len: usize) {
        self.last_read = u32::try_from(len).unwrap_or(u32::MAX);
    }

    /// The payload one of our Private Buffers takes: a full message.
    pub fn message_len(&self) -> usize {
        self.link.conn().pool().buf_size()
    }

    /// Whether the socket may hold input that no pump read yet: the last
    /// one stopped before the socket was empty ([`Lend`]).
    pub fn input_left(&self) -> bool {
        self.ep.rx_stopped() && !self.llp_end && !self.reset
    }

    /// Whether a pump now would move anything: input a pump left in the
    /// socket ([`Inner::input_left`]), bytes or control messages waiting
    /// to go, a timer due, or input that arrived since, by the kernel's
    /// count. One `ioctl` at most, where a pump that finds nothing makes
    /// a `read` that fails and a pass over the stream.
    pub fn pump_would_move(&self, now: Instant) -> bool {
        let conn = self.link.conn();
        self.input_left()
            || conn.tx().unsent() > 0
            || conn.control_pending()
            || self.ep.poll_timeout().is_some_and(|t| t <= now)
            || self.link.poll_timeout().is_some_and(|t| t <= now)
            || rustix::io::ioctl_fionread(self.ep.stream()).map_or(true, |n| n > 0)
    }

    /// The readable level of the readiness descriptor and the watches: the
    /// link is readable, or a pump left input in the socket
    /// ([`Inner::input_left`]) — no edge of the socket tells of it again,
    /// so whoever sleeps must wake and look ([`Inner::settle_input`]).
    pub fn readable(&self) -> bool {
        self.link.readable() || self.input_left()
    }

    /// Reads what pumps left in the socket until the link is readable or
    /// the socket is empty, one message at a time: readiness reported to
    /// the program is then exact (a read after it finds a message), and
    /// what follows stays in the socket for the reader's buffer.
    pub fn settle_input(&mut self, now: Instant) {
        // Each round reads the socket or ends; the bound keeps a pump that
        // moves only other things (writes, timers) from going round.
        for _ in 0..SETTLE_ROUNDS {
            if self.link.readable() || !self.input_left() {
                return;
            }
            let lend = Lend {
                first_arrival: true,
                ..Lend::default()
            };
            if !self.pump_io(now, lend) {
                return;
            }
        }
    }

    /// The read that [`Inner::pump_for_reader`] served ends with `buf` as
    /// lent: what was placed there for a message not handed over goes back
    /// into the Private Buffers.
    pub fn reader_leaves(&mut self, now: Instant, buf: &[u8]) {
        if self
            .link
            .recv_done_waiting(now, self.ep.connection_mut(), buf)
        {
            self.pump_out(now);
        }
    }

    fn pump_lent(&mut self, now: Instant, recv_into: Option<&mut [u8]>) -> bool {
        self.pump_io(
            now,
            Lend {
                recv_into,
                ..Lend::default()
            },
        )
    }

    /// The Zcopy owner's pump (see the module docs), with its send buffer
    /// ([`Link::send_zcopy`]) or receive buffer
    /// ([`Link::post_recv_zcopy`]) lent.
    pub fn pump_zcopy(
        &mut self,
        now: Instant,
        zc_send: Option<&[u8]>,
        zc_recv: Option<&mut [u8]>,
    ) -> bool {
        self.pump_io(
            now,
            Lend {
                zcopy: true,
                zc_send,
                zc_recv,
                ..Lend::default()
            },
        )
    }

    /// This thread's Zcopy buffer is lent from now on until
    /// [`Inner::zcopy_end`]: only its pumps use the socket.
    pub fn zcopy_begin(&mut self) {
        self.zc_owner = Some(std::thread::current().id());
    }

    /// The Zcopy owner's call ends: anything still naming its memory goes
    /// ([`Link::abandon_zcopy`]) and the socket is everyone's again.
    pub fn zcopy_end(&mut self, now: Instant) {
        self.link.abandon_zcopy(self.ep.connection_mut());
        self.zc_owner = None;
        self.pump(now);
    }

    /// The next finished Zcopy buffer ([`Link::poll_zcopy`]).
    pub fn poll_zcopy(&mut self) -> Option<crate::conn::Completion> {
        self.link.poll_zcopy(self.ep.connection_mut())
    }

    /// Whether another thread's Zcopy buffer is lent.
    pub fn zcopy_elsewhere(&self) -> bool {
        self.zc_owner
            .is_some_and(|t| t != std::thread::current().id())
    }

    fn pump_io(&mut self, now: Instant, mut lend: Lend<'_>) -> bool {
        if self.zc_owner.is_some() && !lend.zcopy {
            // The socket is the Zcopy owner's: drive only.
            self.link.drive(now, self.ep.connection_mut());
            self.update_readiness();
            return false;
        }
        let mut recv_into = lend.recv_into.take();
        let mut any = self.timers(now);
        // A short read means "drained" to the endpoint, but the peer's FIN
        // may wait behind the bytes it read: an edge-triggered event that
        // said so ([`Shared::note_hangup`]) makes it read until Idle or EOF.
        let mut again = std::mem::take(&mut self.hangup_hint);
        // Input stays in the socket only for a reader whose buffer takes
        // more than the message read now: a smaller one would have it
        // copied all the same, after more pumps.
        let leave = self.last_read as usize >= 2 * self.message_len();
        let (lent, first_arrival) = (recv_into.is_some(), lend.first_arrival);
        let mut enough = |c: &iwarp::engine::Connection| {
            leave
                && ((lent && c.datapath().overlay().is_none())
                    || (first_arrival && c.datapath().completions() > 0))
        };
        while !self.llp_end && !self.reset {
            let r = self.ep.pump_recv_until(
                now,
                &mut self.link.memory_lent(
                    None,
                    recv_into.as_deref_mut(),
                    lend.zc_send,
                    lend.zc_recv.as_deref_mut(),
                ),
                &mut enough,
            );
            match r {
                Ok(Progress::Idle) => break,
                Ok(Progress::Progressed) => {
                    any = true;
                    if !std::mem::take(&mut again) {
                        break;
                    }
                }
                Ok(Progress::Closed) => {
                    self.llp_end = true;
                    // The driver reports a FIN and a reset alike; its
                    // failure() tells them apart.
                    match self.ep.failure() {
                        Some(e) if e.kind() != std::io::ErrorKind::UnexpectedEof => {
                            let kind = error_kind(&e);
                            self.link.llp_failed(now, kind, self.ep.connection_mut());
                        }
                        _ => self.link.llp_closed(now, self.ep.connection_mut()),
                    }
                    any = true;
                }
                Err(e) => {
                    self.llp_end = true;
                    let kind = error_kind(&e);
                    self.link.llp_failed(now, kind, self.ep.connection_mut());
                    any = true;
                }
            }
        }
        any |= self.pump_out_lent(
            now,
            None,
            recv_into.as_deref(),
            lend.zcopy,
            lend.zc_send,
            lend.zc_recv,
        );
        self.news |= any;
        any
    }

    /// [`Inner::pump`] for a thread that reports the stream's readiness
    /// itself, from its state, and whose program will call on the stream
    /// next (an `epoll_wait` that the socket woke): the readiness
    /// descriptor's levels are left as they are, since the program's next
    /// call sets them as they are then — for a request read whole, not
    /// readable, as before — saving a write to the descriptor and the read
    /// that empties it again. [`Inner::update_readiness`] catches up.
    pub fn pump_quietly(&mut self, now: Instant) -> bool {
        self.quiet_levels = true;
        let moved = self.pump_io(
            now,
            Lend {
                first_arrival: true,
                ..Lend::default()
            },
        );
        // Quiet until the unlock ([`Locked`]), which tells the watches
        // nothing either: the caller reports the levels itself.
        self.quiet_unlock = true;
        self.quiet_levels = false;
        self.levels_stale = true;
        moved
    }

    /// Drives the link and writes until nothing moves (no socket read).
    pub fn pump_out(&mut self, now: Instant) -> bool {
        self.pump_out_from(now, None, None)
    }

    /// `send(2)` straight from `bufs`, in order (DESIGN §7): the accepted
    /// bytes are posted and written from the caller's buffers as far as
    /// the socket takes them now, messages gathered across the buffers;
    /// only the rest is copied into the staging ring, from which the
    /// progress thread sends it later ([`Link::send_direct`]).
    pub fn send_direct(
        &mut self,
        now: Instant,
        bufs: &[&[u8]],
        flags: crate::conn::SendFlags,
    ) -> Result<usize, crate::errno::Error> {
        let n = self.link.send_direct(bufs, flags)?;
        self.pump_out_from(now, Some(bufs), None);
        self.link.finish_direct(bufs, self.ep.connection_mut());
        Ok(n)
    }

    /// [`Inner::pump_out`], with the bytes of a direct send or a waiting
    /// reader's buffer lent.
    fn pump_out_from(
        &mut self,
        now: Instant,
        send_from: Option<&[&[u8]]>,
        recv_into: Option<&[u8]>,
    ) -> bool {
        self.pump_out_lent(now, send_from, recv_into, false, None, None)
    }

    /// [`Inner::pump_out_from`], for the Zcopy owner (`zcopy`) with its
    /// send or receive buffer.
    fn pump_out_lent(
        &mut self,
        now: Instant,
        send_from: Option<&[&[u8]]>,
        recv_into: Option<&[u8]>,
        zcopy: bool,
        zc_send: Option<&[u8]>,
        mut zc_recv: Option<&mut [u8]>,
    ) -> bool {
        if self.zc_owner.is_some() && !zcopy {
            let lent = Lent {
                send_from,
                zc_send,
                zc_recv,
            };
            self.link
                .drive_lent(now, self.ep.connection_mut(), lent, recv_into);
            self.update_readiness();
            return false;
        }
        let mut any = false;
        for _ in 0..64 {
            let lent = Lent {
                send_from,
                zc_send,
                zc_recv: zc_recv.as_deref_mut(),
            };
            self.link
                .drive_lent(now, self.ep.connection_mut(), lent, recv_into);
            let mut progressed = false;
            // A round whose drive framed nothing and left nothing queued
            // has nothing to write: no look at the engine's queues.
            if !self.reset && self.ep.wants_send() {
                // The last message of a graceful close goes with our FIN.
                self.ep.set_fin_next(
                    !self.shut_wr
                        && (self.link.teardown() == Some(Teardown::Graceful)
                            || self.link.conn().fin_follows()),
                );
                match self
                    .ep
                    .pump_send(now, &self.link.memory_lent(send_from, None, zc_send, None))
                {
                    Ok(Progress::Progressed) => progressed = true,
                    Ok(_) => {}
                    Err(e) => {
                        if !self.llp_end {
                            self.llp_end = true;
                            let kind = error_kind(&e);
                            self.link.llp_failed(now, kind, self.ep.connection_mut());
                        }
                        progressed = true;
                    }
                }
            }
            progressed |= self.teardown(now, send_from);
            any |= progressed;
            if !progressed {
                break;
            }
        }
        if !self.shut_wr {
            // The FIN did not follow after all: what waits for it goes.
            self.ep.uncork();
        }
        self.update_readiness();
        self.news |= any;
        any
    }

    fn timers(&mut self, now: Instant) -> bool {
        let mut fired = false;
        if self.ep.poll_timeout().is_some_and(|t| t <= now) {
            self.ep.handle_timeout(now);
            fired = true;
        }
        if self.link.poll_timeout().is_some_and(|t| t <= now) {
            if self.link.give_back_due(now) {
                // Idle: the link gives back its buffers' memory as it is
                // driven next, the driver its scratch now.
                self.ep.shrink_scratch();
            }
            self.link.handle_timeout(now);
            fired = true;
        }
        fired
    }

    /// Carries out the link's LLP teardown once it can.
    fn teardown(&mut self, now: Instant, send_from: Option<&[&[u8]]>) -> bool {
        match self.link.teardown() {
            Some(Teardown::Graceful)
                if !self.shut_wr
                    && !self.reset
                    && self.ep.connection().txq().is_empty()
                    && self.ep.connection().datapath().send_outstanding() == 0 =>
            {
                // Every Send already posted is written: FIN (§8.2.1),
                // unless the LLP closed and the driver sent ours already.
                self.ep.shutdown_write();
                self.shut_wr = true;
                self.drain_until = Some(now + DRAIN);
                true
            }
            // Socket duplication (draft §13.1.1 step 4): once the
            // SuspCommAck is written. Not while an application thread
            // sleeps in poll(2) on the socket: it is woken when the lock
            // goes and carries the resumption out itself.
            Some(Teardown::Resume { port })
                if !self.poller_active
                    && self.ep.connection().txq().is_empty()
                    && self.ep.connection().datapath().send_outstanding() == 0 =>
            {
                self.resume(now, port);
                true
            }
            Some(Teardown::Abortive) if !self.reset => {
                // A Terminate we queued still goes, if the socket takes it.
                if matches!(
                    self.ep.connection().state(),
                    iwarp::engine::State::Terminate
                ) {
                    let _ = self
                        .ep
                        .pump_send(now, &self.link.memory_with(send_from, None));
                }
                // §8.2.2: "MUST immediately terminate the LLP connection":
                // a TCP reset; connect(AF_UNSPEC) sends it and leaves the
                // descriptor open (it may be the application's own).
                let fd = self.ep.stream();
                let _ = rustix::net::sockopt::set_socket_linger(fd, Some(Duration::ZERO));
                let _ = rustix::net::connect_unspec(fd);
                self.reset = true;
                self.llp_end = true;
                true
            }
            _ => false,
        }
    }

    /// The link's teardown was carried out and the socket may be closed:
    /// after a reset at once; after our FIN once the peer's arrived (or
    /// [`DRAIN`] passed). Closing a socket with unread bytes — such as the
    /// credit updates a peer still sends while it reads our last data —
    /// would make the kernel answer with a reset.
    pub fn finished(&self, now: Instant) -> bool {
        self.reset || (self.shut_wr && (self.llp_end || self.drain_until.is_some_and(|d| now >= d)))
    }

    /// Nothing is left for this end to write: the connection ended, or the
    /// DisConn of its close and every Send before it are in the socket.
    pub fn written_out(&self) -> bool {
        let qp = self.ep.connection();
        self.reset
            || self.llp_end
            || (self.link.conn().disconn_sent()
                && qp.txq().is_empty()
                && qp.datapath().send_outstanding() == 0)
    }

    /// Released, everything we owe in the socket (our DisConn too), and
    /// not finished: all that is left is to read what the peer still
    /// sends — its DisConn and FIN, credit updates, or data that ends the
    /// connection as it would a TCP socket closed with data arriving —
    /// which nobody waits for. Such a link need not wake the progress
    /// thread for each arrival; a server closing connection after
    /// connection, or a client, would otherwise have its progress thread
    /// woken once for each.
    fn drains_only(&self, now: Instant) -> bool {
        self.released && !self.finished(now) && self.written_out()
    }

    /// Sets the readiness descriptor from the link's state, and tells
    /// the watches.
    pub fn update_readiness(&mut self) {
        if self.quiet_levels {
            return;
        }
        self.levels_stale = false;
        let readable = self.readable();
        let idle = self.readiness_idle;
        if let Some(r) = self.readiness.as_mut().filter(|_| !idle) {
            // Data that arrived since the last update is a new edge for an
            // edge-triggered poller even if the stream was readable, as
            // for a TCP socket.
            let rx = self.link.conn().rx_total();
            let arrived = rx != self.rx_seen;
            self.rx_seen = rx;
            let was = r.is_readable();
            let _ = r.set(readable, self.link.writable());
            // Turning readable is the arrival's edge already: one write.
            if arrived && was {
                let _ = r.renew_readable();
            }
        }
        self.tell_watches();
    }

    /// Tells the watches of the levels if they changed since they were
    /// last told, or data arrived while readable (a new edge). Done at
    /// every unlock too ([`Locked`]): a watch has no descriptor whose
    /// level the kernel keeps reporting, so it must hear of every change,
    /// also of one a call made without a pump (a read from what was
    /// buffered, a write that used the last credit).
    fn tell_watches(&mut self) {
        if self.watches.0.is_empty() {
            return;
        }
        let rx = self.link.conn().rx_total();
        let arrived = rx != self.told_rx;
        self.told_rx = rx;
        let now = (self.readable(), self.link.writable());
        if now != self.told || (arrived && now.0) {
            self.told = now;
            for w in &self.watches.0 {
                w.levels(now.0, now.1);
            }
        }
    }

    /// Creates the readiness descriptor; returns the descriptor to poll.
    fn arm_readiness(&mut self) -> io::Result<Arc<OwnedFd>> {
        let r = Readiness::new()?;
        let user = r.user_shared();
        self.readiness = Some(r);
        self.update_readiness();
        Ok(user)
    }

    /// The nearest deadline: the engine's, the link's, the end of the
    /// drain of a released link, and `extra`.
    /// The figures [`Counters`] keeps.
    fn snapshot(&self) -> Snapshot {
        let conn = self.link.conn();
        let (send_credit, remote_credit) = conn.credits();
        Snapshot {
            send_mode: Some(conn.send_mode()),
            recv_mode: Some(conn.recv_mode()),
            zcopy: conn.zcopy_stats(),
            copies: self.link.copy_stats(),
            send_credit,
            remote_credit,
            local: crate::conn::local::code(conn.local_state()),
            waits_polled: u64::from(self.busy_poll.polled),
            waits_slept: u64::from(self.busy_poll.slept),
        }
    }

    fn next_deadline(&self, extra: Option<Instant>) -> Option<Instant> {
        let drain = self.drain_until.filter(|_| self.released && !self.llp_end);
        let look = self.lazy.then(|| drain_look(Instant::now()));
        [
            extra,
            self.ep.poll_timeout(),
            self.link.poll_timeout(),
            drain,
            look,
            self.grace_until,
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

/// The [`LevelWatch`]es of a stream.
#[derive(Default)]
struct Watches(Vec<Arc<dyn LevelWatch>>);

impl std::fmt::Debug for Watches {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} level watches", self.0.len())
    }
}

/// See the module documentation.
#[derive(Debug)]
pub struct Shared {
    inner: Mutex<Inner>,
    /// Where the waiters that are not the poller sleep.
    bell: Bell,
    poller: AtomicBool,
    /// The figures for observability, copied in at each unlock.
    counters: Counters,
    kick: AtomicBool,
    /// The endpoint's socket, shared (one descriptor), to poll it
    /// without the lock: a stable descriptor number, pointed at the new
    /// socket by a socket duplication (written under the link's lock, and
    /// only while no application thread polls it).
    sock: Arc<RwLock<Arc<TcpStream>>>,
    deadline: AtomicU64,
    /// The readiness descriptor the application polls, once asked for.
    readiness: OnceLock<Arc<OwnedFd>>,
    /// Mirror of [`Inner::released`], readable without the lock.
    released: AtomicBool,
    /// Mirror of [`Inner::levels_stale`] as of the last unlock: a waiter
    /// that left the levels behind learns without the lock whether a
    /// later call set them already ([`super::SdpStream::sync_readiness`]).
    pub(super) levels_stale: AtomicBool,
    /// Mirror of the reader's [`BusyPoll::bulk`]: whether a `poll` or
    /// `select` that would sleep for this stream's input polls first.
    pub(super) bulk_reader: AtomicBool,
    /// The program's `poll` and `select` waits for this stream's input
    /// that ended while polling, and that slept ([`Shared::count_wait`]).
    waits_polled: AtomicU32,
    waits_slept: AtomicU32,
    /// An event reported hang-up, not yet passed to [`Inner`].
    hangup: AtomicBool,
    /// Epoll sets of the application that watch the socket and have their
    /// waiting thread read it ([`Shared::watch_socket`]).
    watchers: AtomicUsize,
    /// A `poll` or `select` of the application has polled the socket
    /// itself ([`Shared::poll_socket`]).
    socket_polled: AtomicBool,
    /// A blocking read has waited on the socket itself
    /// ([`Locked::wait_to_read`]).
    read_blocking: AtomicBool,
    /// Application threads sleeping on the readiness descriptor
    /// ([`Shared::await_readiness`]).
    readiness_waiters: AtomicUsize,
    /// Epoll sets whose kernel registration reports the readiness
    /// descriptor ([`Shared::hold_readiness`]).
    readiness_holders: AtomicUsize,
    /// Whether the progress thread's registration asks for reads.
    reads: AtomicBool,
    /// Whether the progress thread's registration asks for room in the
    /// socket (FPDUs wait for it).
    room: AtomicBool,
    /// [`Inner::lazy`], for the progress thread: the socket is out of its
    /// epoll set.
    lazy: AtomicBool,
    /// [`Inner::grace_until`] is set: arrivals are left to the program.
    in_grace: AtomicBool,
    /// Key in the progress thread's table.
    pub id: u64,
}

impl Shared {
    /// Wraps a link and its endpoint.
    pub fn new(link: Link, ep: Endpoint, id: u64) -> io::Result<Shared> {
        Shared::with_readiness(link, ep, id, None)
    }

    /// Wraps a link and its endpoint, with `readiness` (if given) as its
    /// readiness descriptor from the start: a caller that handed out the
    /// descriptor before the stream existed (a nonblocking connect) keeps
    /// it.
    pub fn with_readiness(
        link: Link,
        ep: Endpoint,
        id: u64,
        readiness: Option<Readiness>,
    ) -> io::Result<Shared> {
        let sock = Arc::new(RwLock::new(ep.shared_stream()));
        let user = readiness.as_ref().map(Readiness::user_shared);
        let busy_poll = BusyPoll::new(link.conn().config().busy_poll_us);
        let mut inner = Inner {
            link,
            ep,
            llp_end: false,
            shut_wr: false,
            reset: false,
            drain_until: None,
            readiness: None,
            readiness_on_demand: false,
            readiness_idle: false,
            watches: Watches::default(),
            told: (false, false),
            told_rx: 0,
            rx_seen: 0,
            poller_active: false,
            poller_wake: None,
            polling_out: false,
            cond_waiters: 0,
            wake_pending: false,
            news: false,
            released: false,
            lazy: false,
            grace_until: None,
            nonblocking: false,
            read_timeout: None,
            write_timeout: None,
            linger: None,
            hangup_hint: false,
            sock: sock.clone(),
            id,
            zc_owner: None,
            zc_writer_waiting: false,
            quiet_levels: false,
            quiet_unlock: false,
            levels_stale: false,
            socket_moved: false,
            last_read: 0,
            busy_poll,
        };
        let user_fd = OnceLock::new();
        if let (Some(r), Some(user)) = (readiness, user) {
            inner.readiness = Some(r);
            inner.update_readiness();
            let _ = user_fd.set(user);
        }
        Ok(Shared {
            inner: Mutex::new(inner),
            bell: Bell::default(),
            poller: AtomicBool::new(false),
            counters: Counters::default(),
            kick: AtomicBool::new(false),
            sock,
            deadline: AtomicU64::new(NO_DEADLINE),
            readiness: user_fd,
            released: AtomicBool::new(false),
            levels_stale: AtomicBool::new(false),
            bulk_reader: AtomicBool::new(false),
            waits_polled: AtomicU32::new(0),
            waits_slept: AtomicU32::new(0),
            hangup: AtomicBool::new(false),
            watchers: AtomicUsize::new(0),
            socket_polled: AtomicBool::new(false),
            read_blocking: AtomicBool::new(false),
            readiness_waiters: AtomicUsize::new(0),
            readiness_holders: AtomicUsize::new(0),
            reads: AtomicBool::new(true),
            // Nothing was written yet: the first unlock asks for room if
            // the socket does not take what it writes.
            room: AtomicBool::new(false),
            lazy: AtomicBool::new(false),
            in_grace: AtomicBool::new(false),
            id,
        })
    }

    /// The progress thread saw RDHUP, HUP or ERR on the socket (an
    /// edge-triggered event: it will not come again).
    pub fn note_hangup(&self) {
        self.hangup.store(true, Ordering::SeqCst);
    }

    fn take_hangup(&self, g: &mut Inner) {
        if self.hangup.swap(false, Ordering::SeqCst) {
            g.hangup_hint = true;
        }
    }

    /// Tells `w` of the levels from now on, first of those of now.
    pub fn watch_levels(&self, w: Arc<dyn LevelWatch>) {
        let mut g = self.lock();
        // Those watching already hear of the levels of now first.
        g.tell_watches();
        if g.watches.0.is_empty() {
            // Arrivals count from here.
            g.told_rx = g.link.conn().rx_total();
        }
        let now = (g.readable(), g.link.writable());
        g.told = now;
        w.levels(now.0, now.1);
        g.watches.0.push(w);
    }

    /// Stops telling `w` ([`Shared::watch_levels`]).
    pub fn unwatch_levels(&self, w: &Arc<dyn LevelWatch>) {
        self.lock().watches.0.retain(|x| !Arc::ptr_eq(x, w));
    }

    /// Makes `r` the readiness descriptor from now on (kept up to date as
    /// [`Shared::readiness`]'s). One asked for before keeps its last
    /// state and no longer follows the stream.
    pub fn adopt_readiness(&self, r: Readiness) -> io::Result<()> {
        let user = r.user_shared();
        let mut g = self.lock();
        g.readiness = Some(r);
        g.update_readiness();
        let _ = self.readiness.set(user);
        Ok(())
    }

    /// The application released the stream (dropped its last handle).
    pub fn is_released(&self) -> bool {
        self.released.load(Ordering::Relaxed)
    }

    /// Marks the stream released (see [`Shared::is_released`]).
    pub fn set_released(&self) {
        self.released.store(true, Ordering::Relaxed);
    }

    /// A stream handed to a program ([`super::Driver::Handed`]): until the
    /// next point of the [`DRAIN_LOOK`] grid the progress thread leaves
    /// its arrivals to the program, which usually watches the socket at
    /// once. The grid is the one the thread wakes on for the links left
    /// to drain, so that a server accepting and closing connection after
    /// connection has it wake for neither; the price is that a program
    /// which takes a connection and leaves it alone delays its peer's
    /// connect by up to one step. Call before the stream is registered.
    pub fn give_grace(&self, now: Instant) {
        let mut g = self.lock_inner();
        g.grace_until = Some(drain_look(now));
        self.in_grace.store(true, Ordering::SeqCst);
        // Only the reads: room is asked for once the first unlock finds
        // the Reply not written.
        self.reads.store(self.wants_reads(&g), Ordering::SeqCst);
    }

    fn end_grace(&self, g: &mut Inner) {
        g.grace_until = None;
        self.in_grace.store(false, Ordering::SeqCst);
    }

    /// The program did not watch the socket in time: its arrivals are
    /// read by whoever pumps for the progress thread from now on.
    fn end_grace_if_due(&self, g: &mut Inner, now: Instant) {
        if g.grace_until.is_some_and(|t| t <= now) {
            self.end_grace(g);
        }
    }

    /// Marks `g`'s link lazily drained if it [`Inner::drains_only`]; true
    /// if it just became so (the caller then takes its socket out of the
    /// progress thread's epoll set, [`super::progress::drain_lazily`]).
    fn mark_lazy(&self, g: &mut Inner, now: Instant) -> bool {
        if g.lazy || !g.drains_only(now) {
            return false;
        }
        g.lazy = true;
        self.lazy.store(true, Ordering::SeqCst);
        true
    }

    /// The progress thread found the lock taken and left its visit to the
    /// holder ([`Shared::serve_kicks`]).
    pub fn kick_pending(&self) -> bool {
        self.kick.load(Ordering::SeqCst)
    }

    /// Whether the link is lazily drained ([`Inner::drains_only`]).
    pub fn is_lazy(&self) -> bool {
        self.lazy.load(Ordering::SeqCst)
    }

    /// See [`Inner::written_out`].
    pub fn written_out(&self) -> bool {
        self.lock_inner().written_out()
    }

    /// The socket (the endpoint's, whose number stays the same across a
    /// socket duplication), for epoll.
    pub fn sock(&self) -> RwLockReadGuard<'_, Arc<TcpStream>> {
        self.sock.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Moves the connection to `to`, another descriptor of its socket, and
    /// gives back the one it had: a number the program closes goes, the
    /// connection stays.
    pub fn move_socket(&self, to: OwnedFd) -> io::Result<OwnedFd> {
        let to = Arc::new(TcpStream::from(to));
        let mut g = self.lock_inner();
        // A call asleep on the socket lets go of it (and sleeps again on
        // the new one).
        g.wake_poller();
        let from_ep = g.ep.replace_stream(to.clone());
        let (old, added) = super::progress::move_socket(self.id, &self.sock, to);
        drop(g);
        if let Err(e) = added {
            crate::log::emit(format_args!("socket moved, not watched: {e}"));
        }
        drop(from_ep);
        // The endpoint's and `sock`'s were the only holders. Were there
        // another, the descriptor would stay open for good rather than be
        // closed behind its new owner.
        Arc::try_unwrap(old).map(OwnedFd::from).map_err(|held| {
            std::mem::forget(held);
            io::Error::other("the old socket descriptor is still shared")
        })
    }

    /// The readiness descriptor (see [`super::readiness`]), created and
    /// kept up to date from the first call on.
    pub fn readiness(&self) -> io::Result<BorrowedFd<'_>> {
        self.armed_readiness().map(|fd| fd.as_fd())
    }

    /// [`Shared::readiness`], shared: the same descriptor (no duplicate)
    /// for a holder that outlives the borrow.
    pub fn readiness_shared(&self) -> io::Result<Arc<OwnedFd>> {
        self.armed_readiness().cloned()
    }

    fn armed_readiness(&self) -> io::Result<&Arc<OwnedFd>> {
        if let Some(fd) = self.readiness.get() {
            return Ok(fd);
        }
        let mut g = self.lock();
        if self.readiness.get().is_none() {
            let fd = g.arm_readiness()?;
            let _ = self.readiness.set(fd);
        }
        drop(g);
        self.readiness
            .get()
            .ok_or_else(|| io::Error::other("no readiness descriptor"))
    }

    /// An application thread is polling the socket.
    pub fn polled(&self) -> bool {
        self.poller.load(Ordering::SeqCst)
    }

    /// An epoll set of the application starts (`on`) or stops watching the
    /// socket, its waiting thread reading what arrives itself. While one
    /// does, the progress thread leaves arrivals to it: two threads woken
    /// per message, and the hand-off between them, would cost a
    /// request–response exchange more than its own work (redis). It still
    /// reads while bytes wait for credit the socket may bring, while a
    /// thread sleeps on the readiness descriptor instead
    /// ([`Shared::await_readiness`]: `poll` or `select` on a stream an
    /// epoll set also holds, or no longer wakes for), and once the
    /// application released the stream ([`Shared::wants_reads`]).
    pub fn watch_socket(&self, on: bool) {
        count(&self.watchers, on);
        let mut g = self.lock_inner();
        self.sync_interest(&mut g);
    }

    /// A `poll` or `select` of the application polls the socket beside
    /// the readiness descriptor and reads what arrives itself, as an epoll
    /// set that watches it does ([`Shared::watch_socket`]), and so, it is
    /// taken, will its next ones: the progress thread leaves arrivals to
    /// the application from now on, as TCP leaves them in the socket until
    /// the program looks — between two `select`s a program reads, and a
    /// read reads the socket too. (Taking the mark for the length of each
    /// call instead costs two system calls a call, and the progress
    /// thread is woken by what comes between the calls.)
    pub fn poll_socket(&self) {
        if !self.socket_polled.load(Ordering::Relaxed)
            && !self.socket_polled.swap(true, Ordering::SeqCst)
        {
            let mut g = self.lock_inner();
            self.sync_interest(&mut g);
        }
    }

    /// The application reads with blocking calls (a blocking connect's
    /// program): from the start the progress thread leaves arrivals to
    /// them, as after a blocking read that waited
    /// ([`Locked::wait_to_read`]). Otherwise the first answer to come
    /// wakes the progress thread too, racing the reader for the lock.
    pub fn reads_blocking(&self) {
        let mut g = self.lock_inner();
        // A socket moved before: its marks are cleared first.
        self.sync_interest(&mut g);
        self.read_blocking.store(true, Ordering::SeqCst);
        self.sync_interest(&mut g);
    }

    /// An application thread starts (`on`) or stops sleeping on the
    /// readiness descriptor, which only what reads the socket moves: the
    /// progress thread reads it meanwhile (see [`Shared::watch_socket`]).
    pub fn await_readiness(&self, on: bool) {
        count(&self.readiness_waiters, on);
        let mut g = self.lock_inner();
        if self.watched() {
            self.sync_interest(&mut g);
        }
        self.refollow(&mut g);
    }

    /// From now on (`on`) the readiness descriptor is polled only by those
    /// who say so: a thread asleep on it ([`Shared::await_readiness`]) and
    /// an epoll set whose kernel registration reports it
    /// ([`Shared::hold_readiness`]). While there are none its levels are
    /// not kept — each change cost two system calls on the socket pair, a
    /// request that a read leaves partly unread two more — and they are
    /// set as they are when one comes.
    pub fn readiness_on_demand(&self, on: bool) {
        let mut g = self.lock_inner();
        g.readiness_on_demand = on;
        self.refollow(&mut g);
    }

    /// An epoll set's kernel registration starts (`on`) or stops
    /// reporting the readiness descriptor; calls balance.
    pub fn hold_readiness(&self, on: bool) {
        count(&self.readiness_holders, on);
        let mut g = self.lock_inner();
        self.refollow(&mut g);
    }

    /// Keeps the readiness descriptor's levels while someone polls it
    /// ([`Shared::readiness_on_demand`]), setting them as they are when
    /// the first comes.
    fn refollow(&self, g: &mut Inner) {
        let idle = g.readiness_on_demand
            && self.readiness_waiters.load(Ordering::SeqCst) == 0
            && self.readiness_holders.load(Ordering::SeqCst) == 0;
        if idle != g.readiness_idle {
            g.readiness_idle = idle;
            if !idle {
                g.update_readiness();
            }
        }
    }

    /// Whether the progress thread should read the socket (see
    /// [`Shared::watch_socket`]).
    fn wants_reads(&self, g: &Inner) -> bool {
        (!self.watched() && !self.in_grace.load(Ordering::SeqCst))
            || self.readiness_waiters.load(Ordering::SeqCst) > 0
            || g.released
            || g.zc_owner.is_some()
            || g.link.conn().tx().unsent() > 0
            // The peer may hold SinkAvails (§9.3): one it cancels waits
            // for our SinkCancelAck (§9.5.5), which must not wait for the
            // program's next call on this socket — a program blocked on
            // another one (its peer, in one thread) would never make it.
            || g.link.conn().send_mode() == FlowControlMode::Pipelined
    }

    /// Whether the application reads the socket itself (an epoll set
    /// watches it, a `poll` or `select` polled it, or a blocking read
    /// waited on it).
    fn watched(&self) -> bool {
        self.watchers.load(Ordering::SeqCst) > 0
            || self.socket_polled.load(Ordering::SeqCst)
            || self.read_blocking.load(Ordering::SeqCst)
    }

    /// Brings the progress thread's registration in line with
    /// [`Shared::wants_reads`] and with whether FPDUs wait for room in the
    /// socket (a system call only when either changes).
    fn sync_interest(&self, g: &mut Inner) {
        if g.grace_until.is_some() && self.watched() {
            // The program watches: the grace has done its work.
            self.end_grace(g);
        }
        if std::mem::take(&mut g.socket_moved) {
            // Their duplicates refer to the old socket: the progress
            // thread reads the new one from now on.
            self.watchers.store(0, Ordering::SeqCst);
            self.socket_polled.store(false, Ordering::SeqCst);
            self.read_blocking.store(false, Ordering::SeqCst);
        }
        let changed = |flag: &AtomicBool, want: bool| {
            flag.load(Ordering::Relaxed) != want && flag.swap(want, Ordering::SeqCst) != want
        };
        let reads = changed(&self.reads, self.wants_reads(g));
        let qp = g.ep.connection();
        let room = changed(&self.room, !qp.txq().is_empty() || qp.has_pending_tx());
        if reads || room {
            super::progress::set_interest(self.id);
        }
    }

    /// No thread sleeps on the readiness descriptor alone, and one waiter
    /// at most reads the socket: one epoll set, or `poll` and `select`
    /// (see [`super::SdpStream::pump_quietly`]).
    pub fn alone_on_readiness(&self) -> bool {
        self.readiness_waiters.load(Ordering::SeqCst) == 0
            && self.watchers.load(Ordering::SeqCst)
                + usize::from(self.socket_polled.load(Ordering::SeqCst))
                <= 1
    }

    /// Whether the progress thread's registration asks for reads.
    pub fn reads(&self) -> bool {
        self.reads.load(Ordering::SeqCst)
    }

    /// Whether the progress thread's registration asks for room in the
    /// socket: FPDUs were queued that the socket did not take.
    pub fn waits_for_room(&self) -> bool {
        self.room.load(Ordering::SeqCst)
    }

    /// In a child of `fork` taking the stream on: its epoll sets' marks
    /// are the parent's, and its new progress thread reads.
    pub fn forget_watchers(&self) {
        self.watchers.store(0, Ordering::SeqCst);
        self.socket_polled.store(false, Ordering::SeqCst);
        self.read_blocking.store(false, Ordering::SeqCst);
        self.readiness_waiters.store(0, Ordering::SeqCst);
        self.readiness_holders.store(0, Ordering::SeqCst);
        self.reads.store(true, Ordering::SeqCst);
        self.room.store(true, Ordering::SeqCst);
        // Who polls the descriptor in this process is not known: its
        // levels are kept.
        let mut g = self.lock_inner();
        g.readiness_on_demand = false;
        self.refollow(&mut g);
    }

    /// The nearest deadline of the link, as last published.
    pub fn deadline(&self) -> Option<Instant> {
        decode(self.deadline.load(Ordering::Relaxed))
    }

    fn lock_inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes the lock (an application thread).
    pub fn lock(&self) -> Locked<'_> {
        Locked {
            shared: self,
            guard: Some(self.lock_inner()),
        }
    }

    /// Runs `f` on the state under the lock, for a look that changes
    /// nothing: the unlock has no figures to publish, no waiter to wake and
    /// no interest to change, only a kick to serve ([`Locked`]'s drop does
    /// all of it after a call that may have moved something).
    pub fn look<R>(&self, f: impl FnOnce(&Inner) -> R) -> R {
        let r = f(&self.lock_inner());
        self.serve_kicks();
        r
    }

    /// After an unlock: the pumps the progress thread left to the holder
    /// while it found the lock taken.
    fn serve_kicks(&self) {
        while self.kick.load(Ordering::SeqCst) && !self.poller.load(Ordering::SeqCst) {
            let mut g = self.lock_inner();
            self.kick.store(false, Ordering::SeqCst);
            if g.poller_active {
                break;
            }
            self.take_hangup(&mut g);
            let now = Instant::now();
            self.end_grace_if_due(&mut g, now);
            g.pump(now);
            self.sync_interest(&mut g);
            if std::mem::take(&mut g.news) {
                self.wake_waiters(&mut g);
            }
            // The progress thread left its due deadline to this pump.
            if self.publish_deadline(&g) {
                super::progress::wake_for(self.deadline());
            }
            if g.released && g.finished(now) {
                // The progress thread left this pump to us: it will not
                // look at the link again to drop it.
                drop(g);
                super::progress::deregister(self.id);
                break;
            }
        }
    }

    /// The progress thread's visit: pump unless a poller owns the socket or
    /// the lock is taken (then leave a kick). Returns the state's
    /// `released && finished` (the link may be dropped), or false.
    pub fn service(&self, now: Instant) -> bool {
        if self.poller.load(Ordering::SeqCst) {
            return false;
        }
        let mut g = match self.inner.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                self.kick.store(true, Ordering::SeqCst);
                // The holder checks the kick after unlocking; if it
                // unlocked already, take the lock now.
                match self.inner.try_lock() {
                    Ok(g) => g,
                    Err(_) => return false,
                }
            }
        };
        self.kick.store(false, Ordering::SeqCst);
        if g.poller_active {
            return false;
        }
        self.end_grace_if_due(&mut g, now);
        self.take_hangup(&mut g);
        g.pump(now);
        if std::mem::take(&mut g.news) {
            self.wake_waiters(&mut g);
        }
        let lazy = self.mark_lazy(&mut g, now);
        self.publish_deadline(&g);
        self.counters.store(self.snapshot(&g));
        self.sync_interest(&mut g);
        let finished = g.released && g.finished(now);
        drop(g);
        if lazy {
            super::progress::drain_lazily(self);
        }
        finished
    }

    /// After the application's close pumped: a link that only waits for
    /// its peer's end is drained lazily from now on.
    pub fn drain_if_only_that_is_left(&self, g: &mut Locked<'_>, now: Instant) -> bool {
        match g.guard.as_mut() {
            Some(inner) => self.mark_lazy(inner, now),
            None => false,
        }
    }

    /// The figures as of the last unlock (no lock taken).
    pub fn counters(&self) -> Snapshot {
        self.counters.load()
    }

    /// In a child of `fork` (its only thread): threads of the parent that
    /// were waiting on the stream did not come along, so their marks go.
    pub fn revoke_local(&self) {
        self.lock_inner().link.conn_mut().local_revoke();
    }

    pub fn forget_waiters(&self) {
        let mut g = self.lock_inner();
        g.poller_active = false;
        g.cond_waiters = 0;
        self.poller.store(false, Ordering::SeqCst);
        // Their eventfds went with them.
        g.wake_pending = false;
        g.poller_wake = None;
        g.zc_writer_waiting = false;
        if g.zc_owner.take().is_some() {
            // The thread that lent a Zcopy buffer is not here: this copy
            // of the connection cannot keep its promises to the peer about
            // that buffer, so it is aborted — should this process use it.
            let inner = &mut *g;
            inner.link.abandon_zcopy(inner.ep.connection_mut());
        }
    }

    /// Wakes the threads waiting for the stream: the poller through the
    /// eventfd, the others on the condition variable.
    fn wake_waiters(&self, g: &mut Inner) {
        g.wake_poller();
        if g.cond_waiters > 0 {
            self.bell.ring();
        }
    }

    /// A wait of the program's `poll` or `select` for this stream ended,
    /// while polling or after a sleep: counted with the reads' own
    /// ([`BusyPoll`]), for `sdp-stat`.
    pub fn count_wait(&self, polled: bool) {
        let n = if polled {
            &self.waits_polled
        } else {
            &self.waits_slept
        };
        n.fetch_add(1, Ordering::Relaxed);
    }

    /// The figures [`Counters`] keeps: the state's, and the waits counted
    /// outside the lock.
    fn snapshot(&self, g: &Inner) -> Snapshot {
        let mut s = g.snapshot();
        s.waits_polled += u64::from(self.waits_polled.load(Ordering::Relaxed));
        s.waits_slept += u64::from(self.waits_slept.load(Ordering::Relaxed));
        s
    }

    fn publish_deadline(&self, g: &Inner) -> bool {
        let new = encode(g.next_deadline(None));
        // Most unlocks leave the deadline as it was: no write to the line
        // the progress thread reads.
        let old = self.deadline.load(Ordering::Relaxed);
        if new == old {
            return false;
        }
        self.deadline.swap(new, Ordering::Relaxed) > new
    }
}

/// The lock, held by an application thread. Dropping it wakes the poller
/// and the waiters if there are any, and serves a kick from the progress
/// thread.
pub struct Locked<'a> {
    shared: &'a Shared,
    guard: Option<MutexGuard<'a, Inner>>,
}

impl core::ops::Deref for Locked<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        self.guard.as_ref().expect("lock held")
    }
}

impl core::ops::DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        self.guard.as_mut().expect("lock held")
    }
}

impl<'a> Locked<'a> {
    /// A read took `n` bytes: a small one (a request, an answer) polls
    /// before its next sleep, a bulk one does not ([`BusyPoll`]); the
    /// mark is mirrored for waiters that look without the lock.
    pub fn read_got(&mut self, n: usize) {
        let bulk = n >= self.message_len();
        self.busy_poll.bulk = bulk;
        if self.shared.bulk_reader.load(Ordering::Relaxed) != bulk {
            self.shared.bulk_reader.store(bulk, Ordering::Relaxed);
        }
    }

    /// Blocks the calling application thread until the link may have
    /// changed, `deadline` passed, or a timer of the link is due; see the
    /// module documentation. The caller pumps afterwards.
    pub fn wait(&mut self, deadline: Option<Instant>) -> io::Result<()> {
        self.wait_as(deadline, false, false)
    }

    /// [`Locked::wait`] for the peer's answer during the setup: polls
    /// the socket before it sleeps, as [`Locked::wait_to_read`] does.
    pub fn wait_for_answer(&mut self, deadline: Option<Instant>) -> io::Result<()> {
        self.wait_as(deadline, false, true)
    }

    /// [`Locked::wait`], but a signal that interrupts the sleep in
    /// `poll(2)` ends it with [`io::ErrorKind::Interrupted`] (as a blocking
    /// socket call's `EINTR`), for a caller that reports it.
    pub fn wait_interruptible(&mut self, deadline: Option<Instant>) -> io::Result<()> {
        self.wait_as(deadline, true, false)
    }

    /// [`Locked::wait_for`] for a read with nothing to take: the reader
    /// polls the socket itself, and so, it is taken, will its next reads,
    /// as a `poll` that polled it does ([`Shared::poll_socket`]): the
    /// progress thread leaves arrivals to the application from now on.
    /// Otherwise every message would wake it too, to find the reader
    /// polling (and park the link) or holding the lock (and leave it a
    /// second pump); between two reads the bytes wait in the socket, as
    /// TCP's do.
    pub fn wait_to_read(&mut self, deadline: Option<Instant>, signals: bool) -> io::Result<()> {
        let shared = self.shared;
        if !shared.read_blocking.load(Ordering::Relaxed)
            && !shared.read_blocking.swap(true, Ordering::SeqCst)
        {
            if let Some(g) = self.guard.as_mut() {
                shared.sync_interest(g);
            }
        }
        self.wait_as(deadline, signals, true)
    }

    /// Another thread is the poller, or owns the socket for Zcopy: a wait
    /// now would sleep on the condition variable.
    pub fn waits_elsewhere(&self) -> bool {
        self.guard
            .as_ref()
            .is_some_and(|g| g.poller_active || g.zcopy_elsewhere())
    }

    /// [`Locked::wait`] for a call with the caller's rule: `signals`, a
    /// signal ends the sleep with [`io::ErrorKind::Interrupted`] — the
    /// sleep of the stream's poller in `poll(2)`. A thread that waits while
    /// another is the poller sleeps on the stream's bell, which a signal
    /// ends the same way. (Sleeping in `poll` on the readiness descriptor
    /// instead lost wake-ups under the soak's load: two threads each
    /// reading and writing one stream, signals every few milliseconds.)
    pub fn wait_for(&mut self, deadline: Option<Instant>, signals: bool) -> io::Result<()> {
        self.wait_as(deadline, signals, false)
    }

    /// Before the lock goes for a sleep: what the others and the peer
    /// must hear of first.
    fn before_sleep(shared: &Shared, g: &mut Inner) {
        if g.link.conn().control_pending() {
            // What the link owes the peer (a SendSm answering a SrcAvail
            // that a read found, §9.2 step 2a) goes before the sleep.
            g.pump_out(Instant::now());
        }
        if std::mem::take(&mut g.news) {
            // Our pumps since we took the lock moved something (received
            // what the reader waits for, say, or completions held for it
            // while it is away), and this release is not `Locked`'s drop:
            // the others hear of it here or sleep on. Only news wakes
            // them, or two waiting threads would wake each other in turn.
            shared.wake_waiters(g);
        }
        shared.counters.store(shared.snapshot(g));
        // The deadline as it is now: one the calls since the lock was
        // taken moved (a grace the program's watch ended) would have the
        // progress thread find the link due, and a poller keeps it from
        // serving the link, again and again while the sleep lasts.
        if shared.publish_deadline(g) {
            super::progress::wake_for(shared.deadline());
        }
    }

    /// The sleep of [`Locked::wait`] and its kin; a `reader`'s polls its
    /// socket first for the stream's [`BusyPoll`] budget.
    fn wait_as(
        &mut self,
        deadline: Option<Instant>,
        interruptible: bool,
        reader: bool,
    ) -> io::Result<()> {
        let shared = self.shared;
        let Some(mut g) = self.guard.take() else {
            return Ok(());
        };
        Self::before_sleep(shared, &mut g);
        let timer = g.next_deadline(deadline);
        let timeout = timer.map(|t| t.saturating_duration_since(Instant::now()));
        let zc_elsewhere = g.zcopy_elsewhere();
        if zc_elsewhere {
            // The socket is the Zcopy owner's: only it writes what our
            // pumps queued (a SendSm, a credit update) and takes the
            // completion they brought it, and while nobody polls, the
            // owner (asleep on the condition variable) must come and
            // poll. Otherwise a poller is woken by the socket or by news
            // (above): waking it with nothing for it to do would have it
            // wake us in turn, and the two threads would take turns at
            // the lock until the peer moved — also while the socket is
            // full, when a poller asking for space wakes by itself.
            let bytes = g.ep.wants_send() && !(g.poller_active && g.polling_out);
            let owed = bytes || g.link.conn().completion_ready();
            if (owed || !g.poller_active) && g.cond_waiters > 0 {
                shared.bell.ring();
            }
            if owed {
                g.wake_poller();
            }
        } else if g.zc_owner.is_some() {
            // We own the Zcopy buffer and another thread sleeps in poll:
            // wake it so that it leaves the socket to us.
            g.wake_poller();
        }
        if g.poller_active || zc_elsewhere {
            g.cond_waiters += 1;
            let seen = shared.bell.seen();
            drop(g);
            let r = shared.bell.wait(seen, timeout);
            let mut g = shared.lock_inner();
            g.cond_waiters -= 1;
            self.guard = Some(g);
            return match r {
                Err(e) if e.kind() == io::ErrorKind::Interrupted && !interruptible => Ok(()),
                r => r,
            };
        }
        let wake = thread_wake();
        g.poller_active = true;
        g.poller_wake = wake.clone();
        shared.poller.store(true, Ordering::SeqCst);
        let mut flags = PollFlags::IN;
        // Bytes waiting for socket space (not work the engine holds back,
        // such as the responder's before the RTR: that would spin).
        if !g.ep.connection().txq().is_empty() {
            flags |= PollFlags::OUT;
        }
        g.polling_out = flags.contains(PollFlags::OUT);
        // A reader whose last read took a Private Buffer's worth or more
        // (a bulk transfer) sleeps at once: its bytes come in a stream,
        // and a poller on two cores takes the time the writer's side needs.
        let max_poll = if reader && !g.busy_poll.bulk {
            g.link.conn().config().busy_poll_us
        } else {
            0
        };
        let spin = if max_poll > 0 {
            g.busy_poll.budget()
        } else {
            Duration::ZERO
        };
        drop(g);
        // Without an eventfd (the process is out of descriptors) the
        // poller looks again every few milliseconds instead.
        let timeout = match wake {
            Some(_) => timeout,
            None => Some(timeout.map_or(NO_WAKE_POLL, |t| t.min(NO_WAKE_POLL))),
        };
        let started = Instant::now();
        // The socket's read lock goes before the link's lock is taken.
        let (r, ended_polling) = {
            let sock = shared.sock();
            let mut fds = [
                PollFd::new(&*sock, flags),
                match &wake {
                    Some(w) => PollFd::new(&**w, PollFlags::IN),
                    None => PollFd::new(&*sock, flags),
                },
            ];
            let n = if wake.is_some() { 2 } else { 1 };
            let (r, polling) = poll_after_polling(&mut fds[..n], started, spin, timeout);
            let r = match r {
                Ok(_) => Ok(()),
                Err(Errno::INTR) if !interruptible => Ok(()),
                Err(e) => Err(e.into()),
            };
            (r, polling)
        };
        let mut g = shared.lock_inner();
        if max_poll > 0 {
            g.busy_poll
                .ended(started.elapsed(), ended_polling, max_poll);
        } else if reader {
            g.busy_poll.slept();
        }
        g.poller_active = false;
        g.poller_wake = None;
        shared.poller.store(false, Ordering::SeqCst);
        if g.zc_owner.is_some() && g.cond_waiters > 0 {
            // They may read what the owner's pump brings, or take the
            // socket over.
            shared.bell.ring();
        }
        if std::mem::take(&mut g.wake_pending) {
            if let Some(w) = &wake {
                let mut buf = [0u8; 8];
                let _ = rustix::io::read(&**w, &mut buf);
            }
        }
        self.guard = Some(g);
        r
    }
}

/// `poll(2)` on `fds` for up to `timeout` from `started`, looking
/// without sleeping for the first `spin` of it ([`BusyPoll`]); and
/// whether it ended while looking.
fn poll_after_polling(
    fds: &mut [PollFd<'_>],
    started: Instant,
    spin: Duration,
    timeout: Option<Duration>,
) -> (rustix::io::Result<usize>, bool) {
    let spin = timeout.map_or(spin, |t| spin.min(t));
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    let looked = poll_until(started, spin, || match poll(fds, Some(&now)) {
        Ok(0) => None,
        r => Some(r),
    });
    if let Some(r) = looked {
        return (r, true);
    }
    let ts = timeout.map(|t| {
        let t = t.saturating_sub(started.elapsed());
        Timespec {
            tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(t.subsec_nanos()),
        }
    });
    (poll(fds, ts.as_ref()), false)
}

/// How long a poller without a wake-up eventfd sleeps at most.
const NO_WAKE_POLL: Duration = Duration::from_millis(5);

thread_local! {
    static THREAD_WAKE: std::cell::OnceCell<Option<Arc<OwnedFd>>> =
        const { std::cell::OnceCell::new() };
}

/// The calling thread's wake-up eventfd, made on its first wait as a
/// stream's poller: a thread sleeps in one call at a time, so one
/// descriptor per thread serves every stream it ever waits on, not one
/// per connection. `None` if it cannot be made.
fn thread_wake() -> Option<Arc<OwnedFd>> {
    THREAD_WAKE
        .try_with(|w| {
            w.get_or_init(|| {
                eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
                    .ok()
                    .map(|fd| Arc::new(crate::fds::high(fd)))
            })
            .clone()
        })
        .ok()
        .flatten()
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let shared = self.shared;
        if let Some(mut g) = self.guard.take() {
            g.news = false;
            if !std::mem::take(&mut g.quiet_unlock) {
                g.tell_watches();
            }
            shared.counters.store(shared.snapshot(&g));
            if shared.levels_stale.load(Ordering::Relaxed) != g.levels_stale {
                shared.levels_stale.store(g.levels_stale, Ordering::Relaxed);
            }
            shared.sync_interest(&mut g);
            shared.wake_waiters(&mut g);
            if shared.publish_deadline(&g) {
                super::progress::wake_for(shared.deadline());
            }
        }
        shared.serve_kicks();
    }
}
