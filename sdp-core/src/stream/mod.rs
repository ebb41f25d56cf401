//! SDP sockets with the shape of `std::net`: [`SdpStream`] and
//! [`SdpListener`], over a kernel TCP socket carrying MPA/DDP/RDMAP
//! (DESIGN §2, §4, §6).
//!
//! * Blocking and nonblocking use, read/write timeouts, `shutdown`,
//!   `SO_LINGER` 0 for an abortive close, OOB (`send_flags`/`recv_flags`),
//!   and the errno a TCP program expects: ECONNREFUSED when the peer
//!   rejects the MPA connection or refuses the Hello, ECONNRESET after an
//!   abortive close, EPIPE after `shutdown(Write)` or the end of the
//!   connection, EAGAIN from a nonblocking call that would wait — and from
//!   a blocking one whose read/write timeout passed, as Linux TCP does for
//!   SO_RCVTIMEO/SO_SNDTIMEO — and ETIMEDOUT when `connect_timeout` or the
//!   connection (keepalive, close timer) times out.
//! * **Readiness.** [`AsRawFd`] (and [`SdpStream::readiness_fd`]) give a
//!   descriptor that poll/epoll/mio see readable exactly when a read would
//!   make progress and writable exactly when a write would
//!   ([`readiness`] explains the socket-pair construction and why not an
//!   eventfd or the kernel socket). The kernel socket itself is
//!   [`SdpStream::socket_fd`]; keepalive is off until the application
//!   turns it on there, as TCP's (draft §14.3: SO_KEEPALIVE is TCP's
//!   keepalive timer).
//! * **Socket duplication.** A peer's SuspComm (draft §13.1.1) is answered
//!   and the connection moves to a new TCP connection to the port it
//!   names, under the same stream: nothing is lost, the application sees
//!   nothing but a pause; the readiness descriptor, `socket_fd` and the
//!   addresses stay ([`shared`]'s `resume`).
//! * **Progress.** Bytes accepted by `write` reach the peer without further
//!   calls: a process-wide progress thread ([`progress`]) writes them as
//!   the socket takes them, takes in the peer's messages and fires timers.
//!   Application threads do the work themselves on the fast path, and a
//!   blocking read sleeps in `poll` on its own socket ([`shared`] holds the
//!   locking rules).
//! * **Copies** (DESIGN §7, [`crate::link::direct`]). `write` sends
//!   straight from the caller's buffer and stages only what the socket does
//!   not take during the call; a `read` that waits with nothing unread
//!   receives the next messages' payload straight into its buffer.
//!   [`SdpStream::info`] counts both paths.
//! * **Close.** Dropping the last handle closes gracefully (DisConn after
//!   the data, §8.2.1) and the progress thread finishes the exchange; a
//!   blocking stream first waits (at most 10 s) until its accepted bytes
//!   are with the kernel, so that a process exiting right after its last
//!   write does not lose them. With `set_linger(Some(0))` the close is
//!   abortive (§8.2.2).
//!
//! The calls the preload needs are public here too:
//! [`SdpStream::from_parts`] wraps a [`Link`] and an [`Endpoint`] it set up
//! on the application's own socket; [`SdpStream::send_vectored`] and
//! [`SdpStream::recv_vectored`] are `sendmsg` and `recvmsg` with the
//! program's blocking rule ([`Block`]: a signal ends their wait, as a
//! socket call's); `readable`, `writable`, `bytes_readable`, `at_mark`
//! and the readiness descriptor do the rest. [`Endpoint`] is the iWARP
//! driver's socket pump (`iwarp::driver`).
//!
//! ```
//! use std::io::{Read, Write};
//! use sdp_core::stream::{SdpListener, SdpStream};
//!
//! let listener = SdpListener::bind("127.0.0.1:0")?;
//! let addr = listener.local_addr()?;
//! let server = std::thread::spawn(move || -> std::io::Result<Vec<u8>> {
//!     let (mut s, _) = listener.accept()?;
//!     let mut got = Vec::new();
//!     s.read_to_end(&mut got)?;
//!     s.write_all(b"bye")?;
//!     Ok(got)
//! });
//! let mut c = SdpStream::connect(addr)?;
//! c.write_all(b"hello over SDP")?;
//! c.shutdown(std::net::Shutdown::Write)?;
//! let mut reply = String::new();
//! c.read_to_string(&mut reply)?;
//! assert_eq!(reply, "bye");
//! assert_eq!(server.join().unwrap()?, b"hello over SDP");
//! # Ok::<(), std::io::Error>(())
//! ```

pub mod accept;
pub mod busy_poll;
mod call;
pub mod counters;
pub mod progress;
pub mod readiness;
pub mod shared;
#[cfg(any(test, feature = "testing"))]
mod suspend;
pub mod zcopy;

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown as NetShutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};

pub use iwarp::driver::{Endpoint, Progress};

use crate::conn::{
    Config, CreditState, FlowControlMode, RecvFlags, SendFlags, Shutdown, State, ZcopyStats,
};
use crate::errno::Error;
use crate::link::direct::CopyStats;
use crate::link::{connection_config, Link};
pub use call::Block;
use call::Rule;
use shared::{Locked, Shared};

/// How long dropping a blocking stream waits for its accepted bytes to
/// reach the kernel.
const DROP_FLUSH: Duration = Duration::from_secs(10);

fn to_io(e: Error) -> io::Error {
    io::Error::from(e)
}

fn would_block() -> io::Error {
    to_io(Error::WouldBlock)
}

/// The last handle closes the stream (or [`SdpStream::close`] did).
#[derive(Debug)]
struct Handle {
    shared: Arc<Shared>,
    local: SocketAddr,
    peer: SocketAddr,
    /// [`SdpStream::detach`]: dropping does nothing to the connection.
    detached: AtomicBool,
    /// The close ran ([`Handle::close`]): once.
    closed: AtomicBool,
}

impl Handle {
    /// The close of the connection: graceful (after the accepted bytes
    /// reached the kernel, for a blocking stream), or abortive with a
    /// zero `SO_LINGER`; a lingering blocking stream waits for the close
    /// exchange.
    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        let shared = &self.shared;
        shared.set_released();
        let mut g = shared.lock();
        let abort = g.linger == Some(Duration::ZERO);
        if !abort && !g.nonblocking {
            let deadline = Instant::now() + DROP_FLUSH;
            let _ = wait_until(&mut g, Some(deadline), false, |g| {
                let tx = g.link.conn().tx();
                tx.released() == tx.accepted() || !g.link.is_connected()
            });
        }
        let now = Instant::now();
        if abort {
            g.link.abort();
        } else {
            g.link.close(now);
        }
        g.released = true;
        if let (Some(linger), false) = (g.linger.filter(|l| !l.is_zero()), g.nonblocking) {
            // SO_LINGER: wait for the close exchange to finish.
            let deadline = now + linger;
            let _ = wait_until(&mut g, Some(deadline), false, |g| {
                g.finished(Instant::now())
            });
        }
        // Out of the progress thread's set before the pump writes the FIN:
        // a socket's shutdown wakes every epoll registration on it, asked
        // for or not, and the thread would wake for nothing at each close.
        // A link left with more than draining to do comes back in below.
        progress::drain_lazily(&**shared);
        let now = Instant::now();
        g.pump(now);
        let finished = g.finished(now);
        let lazy = !finished && shared.drain_if_only_that_is_left(&mut g, now);
        drop(g);
        if finished {
            progress::deregister(shared.id);
        } else if !lazy {
            progress::rejoin(&**shared);
        }
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if self.detached.load(Ordering::Acquire) {
            progress::deregister(self.shared.id);
            return;
        }
        self.close();
    }
}

/// Pumps and waits until `done` holds; `Err(EAGAIN)` when `deadline`
/// passes first. A wait for the peer's `answer` (the setup's Reply and
/// HelloAck) polls before it sleeps, as a blocking read does.
fn wait_until(
    g: &mut Locked<'_>,
    deadline: Option<Instant>,
    answer: bool,
    mut done: impl FnMut(&mut Locked<'_>) -> bool,
) -> io::Result<()> {
    loop {
        g.pump(Instant::now());
        if done(g) {
            return Ok(());
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(would_block());
        }
        if answer {
            g.wait_for_answer(deadline)?;
        } else {
            g.wait(deadline)?;
        }
    }
}

/// The copying `send` of `bufs` (their concatenation) under `rule`: a
/// call that may wait takes every byte (fewer only when its deadline or a
/// signal cuts it short), one that may not takes what fits now, after one
/// look at the socket for credit. EAGAIN or EINTR when no byte went.
fn send_loop(
    g: &mut Locked<'_>,
    bufs: &[&[u8]],
    flags: SendFlags,
    rule: Rule,
) -> io::Result<usize> {
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    let mut done = 0;
    let mut pumped = false;
    loop {
        let r = if done == 0 {
            g.send_direct(Instant::now(), bufs, flags)
        } else {
            g.send_direct(Instant::now(), &after(bufs, done), flags)
        };
        match r {
            Ok(n) => {
                done += n;
                if !rule.waits() || done >= total {
                    return Ok(done);
                }
            }
            Err(Error::WouldBlock) if !rule.waits() && !pumped => {
                // Credits or completions may be waiting in the socket.
                g.pump(Instant::now());
                pumped = true;
            }
            Err(Error::WouldBlock) if !rule.waits() => return Err(would_block()),
            Err(Error::WouldBlock) => {
                if rule.expired() {
                    return moved_or(done, would_block());
                }
                if let Err(e) = g.wait_for(rule.deadline(), rule.signals) {
                    return moved_or(done, e);
                }
                g.pump(Instant::now());
            }
            Err(e) if done > 0 => {
                // The bytes taken go first; an error the connection keeps
                // waits for the next call.
                restore(g, &to_io(e));
                return Ok(done);
            }
            Err(e) => return Err(to_io(e)),
        }
    }
}

/// `bufs` without their first `n` bytes.
fn after<'a>(bufs: &[&'a [u8]], mut n: usize) -> Vec<&'a [u8]> {
    let mut rest = Vec::with_capacity(bufs.len());
    for b in bufs {
        if n >= b.len() {
            n -= b.len();
        } else {
            rest.push(&b[n..]);
            n = 0;
        }
    }
    rest
}

/// The end of a call that met `e`: the bytes moved, if any, else `e`.
fn moved_or(done: usize, e: io::Error) -> io::Result<usize> {
    if done > 0 {
        Ok(done)
    } else {
        Err(e)
    }
}

/// One send under `rule`: one large buffer that may wait is lent
/// ([`zcopy::write`]), the rest copied.
fn send_in(g: &mut Locked<'_>, parts: &[&[u8]], flags: SendFlags, rule: Rule) -> io::Result<usize> {
    if let [buf] = parts {
        if rule.waits()
            && !flags.contains(SendFlags::OOB)
            && !flags.contains(SendFlags::MORE)
            && zcopy::lends(g, buf.len())
        {
            if let Some(r) = zcopy::write(g, buf, rule) {
                return r;
            }
        }
    }
    send_loop(g, parts, flags, rule)
}

/// One receive into `buf` under `rule`: by Zcopy when it fits and may
/// wait ([`zcopy::read`]), else copied.
fn recv_in(g: &mut Locked<'_>, buf: &mut [u8], flags: RecvFlags, rule: Rule) -> io::Result<usize> {
    g.read_len(buf.len());
    let mut got = 0;
    let mut now = Instant::now();
    let r = if rule.waits() && zcopy::read_fits(g, buf.len(), flags) {
        let r = zcopy::read(g, buf, flags, &mut got, rule);
        now = Instant::now();
        r
    } else {
        recv_loop(g, buf, flags, &mut got, rule, &mut now)
    };
    // A message that was landing in `buf[got..]` and is not whole goes
    // back to the Private Buffers.
    g.reader_leaves(now, &buf[got..]);
    if let Ok(n) = r {
        g.read_got(n);
    }
    r
}

/// `e`, met after some bytes moved, waits for the next call if the
/// connection keeps it pending.
fn restore(g: &mut Locked<'_>, e: &io::Error) {
    if let Some(e) = e.raw_os_error().and_then(Error::pending_from_errno) {
        g.link.conn_mut().restore_error(e);
    }
}

/// The copying `recv` into `buf` under `rule`; `got` counts the bytes in
/// `buf`. `now` is the clock as of the call's start, read again after
/// each wait (one read of the clock for a call that does not wait).
fn recv_loop(
    g: &mut Locked<'_>,
    buf: &mut [u8],
    flags: RecvFlags,
    got: &mut usize,
    rule: Rule,
    now: &mut Instant,
) -> io::Result<usize> {
    let mut pumped = false;
    // A plain read that waits lends its buffer: the next message's
    // payload may land in it directly (DESIGN §7).
    let lend = !flags.contains(RecvFlags::PEEK) && !flags.contains(RecvFlags::OOB);
    let mut direct = 0;
    loop {
        let r = if direct > 0 {
            // Bytes already in place; more may wait in the Private
            // Buffers behind them, as a TCP read would return.
            let more = match g.link.recv(&mut buf[*got + direct..], flags) {
                Ok(n) => n,
                Err(e) => {
                    // The bytes in place go first; the error waits.
                    if e != Error::WouldBlock {
                        g.link.conn_mut().restore_error(e);
                    }
                    0
                }
            };
            Ok(core::mem::take(&mut direct) + more)
        } else {
            g.link.recv(&mut buf[*got..], flags)
        };
        match r {
            Ok(n) => {
                // Emptied buffers are re-posted and credited; a read that
                // emptied none only changes the levels.
                if g.link.conn().owes_after_read() {
                    g.pump_out(*now);
                } else {
                    g.update_readiness();
                }
                *got += n;
                let room = buf.len() - *got;
                if lend && n > 0 && room >= g.message_len() && !pumped && g.input_left() {
                    // The Private Buffers are read out and the socket holds
                    // more: it comes straight into the rest of `buf`, as a
                    // TCP read takes what the socket holds.
                    pumped = true;
                    direct = pump_reader(g, *now, true, &mut buf[*got..]);
                    if direct > 0 {
                        continue;
                    }
                }
                let waitall = flags.contains(RecvFlags::WAITALL)
                    && !flags.contains(RecvFlags::PEEK)
                    && n > 0
                    && *got < buf.len();
                if !waitall {
                    return Ok(*got);
                }
            }
            Err(e) if *got > 0 && e != Error::WouldBlock => {
                g.link.conn_mut().restore_error(e);
                return Ok(*got);
            }
            // A blocking call goes straight to poll(2), which sees what
            // the socket holds; a nonblocking one reads it first.
            Err(Error::WouldBlock) if !rule.waits() && !pumped => {
                direct = pump_reader(g, *now, lend, &mut buf[*got..]);
                pumped = true;
            }
            Err(Error::WouldBlock) if !rule.waits() => {
                // A SendSm for a SrcAvail this read cannot take (§9.2
                // step 2a) goes now: the caller may wait in epoll.
                if g.link.conn().control_pending() {
                    g.pump_out(*now);
                }
                return moved_or(*got, would_block());
            }
            Err(Error::WouldBlock) => {
                if rule.expired() {
                    return moved_or(*got, would_block());
                }
                if g.link.conn().tx().unsent() > 0 {
                    // A tail the reader's wait set free (the peer may
                    // wait for it before it answers).
                    g.pump_out(*now);
                }
                if let Err(e) = g.wait_to_read(rule.deadline(), rule.signals) {
                    return moved_or(*got, e);
                }
                *now = Instant::now();
                direct = pump_reader(g, *now, lend, &mut buf[*got..]);
            }
            Err(e) => return Err(to_io(e)),
        }
    }
}

/// Pumps for a reader with `buf`: straight into it if `lend` (see
/// [`shared::Inner::pump_for_reader`]). Returns the bytes placed there.
fn pump_reader(g: &mut Locked<'_>, now: Instant, lend: bool, buf: &mut [u8]) -> usize {
    if lend {
        g.pump_for_reader(now, buf)
    } else {
        g.pump(now);
        0
    }
}

/// What [`SdpStream::pump_quietly`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pumped {
    /// Anything moved: bytes read or written, a state change.
    pub moved: bool,
    /// The readiness descriptor's levels were left as they were.
    pub quiet: bool,
}

/// Who carries a new stream's setup (MPA, Hello, HelloAck) on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    /// The progress thread, from the start: for a caller that returns
    /// before the setup ends (a nonblocking connect).
    Progress,
    /// The calling thread, which waits for the setup in its own calls and
    /// then hands the stream on ([`SdpStream::to_progress`]): no other
    /// thread wakes for the setup's messages.
    Caller,
    /// The progress thread, once the program the stream is handed to had
    /// its turn: an event loop registers an accepted connection in its
    /// epoll set at once, and its own wait takes the RTR that follows the
    /// Reply within microseconds — which the progress thread, reading the
    /// socket from the start, raced it for, a wake-up and a contended
    /// lock per connection. It reads only if the program did not watch
    /// the socket by the next point of the [`shared::DRAIN_LOOK`] grid.
    Handed,
}

/// An SDP connection; see the module documentation.
#[derive(Debug, Clone)]
pub struct SdpStream {
    handle: Arc<Handle>,
}

impl SdpStream {
    /// Connects to `addr` (each address in turn, as `TcpStream::connect`),
    /// with the default [`Config`].
    pub fn connect(addr: impl ToSocketAddrs) -> io::Result<SdpStream> {
        SdpStream::connect_with(addr, &Config::default())
    }

    /// Connects with `config`.
    pub fn connect_with(addr: impl ToSocketAddrs, config: &Config) -> io::Result<SdpStream> {
        let mut last = io::Error::new(io::ErrorKind::InvalidInput, "no address");
        for a in addr.to_socket_addrs()? {
            match TcpStream::connect(a).and_then(|tcp| SdpStream::setup(tcp, config, None)) {
                Ok(s) => return Ok(s),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Connects to `addr` within `timeout` (TCP and SDP setup together);
    /// ETIMEDOUT when it passes.
    pub fn connect_timeout(addr: &SocketAddr, timeout: Duration) -> io::Result<SdpStream> {
        let deadline = Instant::now() + timeout;
        let tcp = TcpStream::connect_timeout(addr, timeout)?;
        SdpStream::setup(tcp, &Config::default(), Some(deadline))
    }

    /// The SDP setup of a connected TCP stream, as the Connecting Peer,
    /// blocking until the HelloAck arrived.
    fn setup(tcp: TcpStream, config: &Config, deadline: Option<Instant>) -> io::Result<SdpStream> {
        let stream = SdpStream::start_connect_by(tcp, config, Driver::Caller)?;
        let r = stream.wait_connected(deadline);
        stream.to_progress()?;
        r.map(|()| stream)
    }

    /// Starts the SDP setup of a connected TCP stream as the Connecting
    /// Peer and returns at once; the progress thread carries the setup on.
    /// The stream turns writable (readiness) when it is connected or
    /// failed; [`SdpStream::take_error`] then tells which — the contract of
    /// a nonblocking `connect`.
    pub fn start_connect(tcp: TcpStream, config: &Config) -> io::Result<SdpStream> {
        SdpStream::start_connect_with(tcp, config, None)
    }

    /// [`SdpStream::start_connect`], the setup carried on by `driver`.
    pub fn start_connect_by(
        tcp: TcpStream,
        config: &Config,
        driver: Driver,
    ) -> io::Result<SdpStream> {
        let (link, ep) = SdpStream::initiator(tcp, config)?;
        SdpStream::build(link, ep, None, driver)
    }

    /// [`SdpStream::start_connect`] with `readiness` as the stream's
    /// readiness descriptor (see [`SdpStream::from_parts_with`]).
    pub fn start_connect_with(
        tcp: TcpStream,
        config: &Config,
        readiness: Option<readiness::Readiness>,
    ) -> io::Result<SdpStream> {
        let (link, ep) = SdpStream::initiator(tcp, config)?;
        SdpStream::from_parts_with(link, ep, readiness)
    }

    /// The Connecting Peer's link and endpoint, the MPA Request queued.
    fn initiator(tcp: TcpStream, config: &Config) -> io::Result<(Link, Endpoint)> {
        let now = Instant::now();
        let config = &fit_config(&tcp, config);
        let mut link = Link::connect(config);
        let mut ep = Endpoint::initiator(tcp, connection_config(config), link.hello(), now)?;
        link.drive(now, ep.connection_mut());
        Ok((link, ep))
    }

    /// Wraps a link and its endpoint (set up by the caller, connected or
    /// not) and hands them to the progress thread.
    pub fn from_parts(link: Link, ep: Endpoint) -> io::Result<SdpStream> {
        SdpStream::from_parts_with(link, ep, None)
    }

    /// [`SdpStream::from_parts`], with `readiness` (if given) as the
    /// stream's readiness descriptor from now on, kept up to date like the
    /// one [`SdpStream::readiness_fd`] creates: for a caller that handed
    /// the descriptor out before the stream existed (the preload's
    /// nonblocking connect, polled while the port mapper is asked).
    pub fn from_parts_with(
        link: Link,
        ep: Endpoint,
        readiness: Option<readiness::Readiness>,
    ) -> io::Result<SdpStream> {
        SdpStream::build(link, ep, readiness, Driver::Progress)
    }

    /// [`SdpStream::from_parts`], the setup carried on by `driver`.
    pub fn from_parts_by(link: Link, ep: Endpoint, driver: Driver) -> io::Result<SdpStream> {
        SdpStream::build(link, ep, None, driver)
    }

    fn build(
        link: Link,
        ep: Endpoint,
        readiness: Option<readiness::Readiness>,
        driver: Driver,
    ) -> io::Result<SdpStream> {
        let local = ep.stream().local_addr()?;
        let peer = ep.stream().peer_addr()?;
        let shared = Arc::new(Shared::with_readiness(
            link,
            ep,
            progress::next_id(),
            readiness,
        )?);
        if driver != Driver::Caller {
            if driver == Driver::Handed {
                shared.give_grace(Instant::now());
            }
            progress::register(shared.clone())?;
        }
        // What the setup sends first (the MPA Request or Reply) goes from
        // this thread, not after a hand-off to the progress thread; the
        // unlock tells the thread of the setup's deadline, and asks it to
        // watch for room only if the socket did not take it all.
        shared.lock().pump_out(Instant::now());
        Ok(SdpStream {
            handle: Arc::new(Handle {
                shared,
                local,
                peer,
                detached: AtomicBool::new(false),
                closed: AtomicBool::new(false),
            }),
        })
    }

    /// Makes `readiness` the stream's readiness descriptor from now on,
    /// kept up to date like the one [`SdpStream::readiness_fd`] creates:
    /// for a caller that handed a descriptor out before it knew whether
    /// the connection would be SDP (the preload's nonblocking connect,
    /// which adopts it once the setup succeeded). A descriptor asked for
    /// before keeps its last state and no longer follows the stream.
    pub fn adopt_readiness(&self, readiness: readiness::Readiness) -> io::Result<()> {
        self.shared().adopt_readiness(readiness)
    }

    /// Reads what the socket has, drives the connection and writes what is
    /// queued, now, without blocking: for a caller that learned from its
    /// own poll of [`SdpStream::socket_fd`] that bytes arrived. True if
    /// anything moved.
    pub fn pump(&self) -> bool {
        self.shared().lock().pump(Instant::now())
    }

    /// Takes the stream away from this process's progress thread: nothing
    /// reads or writes its socket until [`SdpStream::resume_progress`] or
    /// an application call (which still pumps). For the preload across
    /// `fork`, while it is unknown which process goes on with the
    /// connection.
    pub fn pause_progress(&self) {
        progress::deregister(self.shared().id);
    }

    /// Hands a stream whose setup its caller carried on
    /// ([`Driver::Caller`]) to the progress thread, set up or not: from
    /// now on the thread moves what the application leaves.
    pub fn to_progress(&self) -> io::Result<()> {
        progress::register(self.handle.shared.clone())
    }

    /// Hands the stream (back) to this process's progress thread — in a
    /// child of `fork`, to the child's own.
    pub fn resume_progress(&self) -> io::Result<()> {
        self.handle.shared.forget_watchers();
        progress::register(self.handle.shared.clone())
    }

    /// The application reads this stream with blocking calls from the
    /// start (a blocking connect): the progress thread leaves arrivals to
    /// its reads, as it does once a blocking read waited. Call before
    /// [`SdpStream::to_progress`].
    pub fn reads_blocking(&self) {
        self.shared().reads_blocking();
    }

    /// An epoll set of the application starts (`on`) or stops watching the
    /// stream's socket, its waiting thread pumping the stream when bytes
    /// arrive; the progress thread leaves arrivals to it meanwhile (see
    /// [`shared::Shared::watch_socket`]). Calls balance.
    pub fn watch_socket(&self, on: bool) {
        self.shared().watch_socket(on);
    }

    /// A `poll` or `select` of the application polls the stream's socket
    /// itself, and pumps the stream when bytes arrive; the progress thread
    /// leaves arrivals to the application from now on (see
    /// [`shared::Shared::poll_socket`]).
    pub fn poll_socket(&self) {
        self.shared().poll_socket();
    }

    /// [`SdpStream::pump`] for a waiter (`epoll_wait`, `poll`) that the
    /// socket woke and that reports the readiness itself: the readiness
    /// descriptor keeps its levels until [`SdpStream::sync_readiness`] or
    /// the next call on the stream. Only while no other thread could be
    /// sleeping on the descriptor alone and one waiter at most reads the
    /// socket ([`shared::Shared::alone_on_readiness`]); else it pumps as
    /// [`SdpStream::pump`].
    pub fn pump_quietly(&self) -> Pumped {
        let shared = self.shared();
        let mut g = shared.lock();
        let quiet = shared.alone_on_readiness();
        let moved = if quiet {
            g.pump_quietly(Instant::now())
        } else {
            g.pump(Instant::now())
        };
        Pumped { moved, quiet }
    }

    /// Tells `w` of the stream's levels from now on, first of those of now
    /// ([`readiness::LevelWatch`]): readiness without a descriptor.
    pub fn watch_levels(&self, w: Arc<dyn readiness::LevelWatch>) {
        self.shared().watch_levels(w);
    }

    /// Stops telling `w` ([`SdpStream::watch_levels`]).
    pub fn unwatch_levels(&self, w: &Arc<dyn readiness::LevelWatch>) {
        self.shared().unwatch_levels(w);
    }

    /// Sets the readiness descriptor's levels as the stream is now (after
    /// [`SdpStream::pump_quietly`]), unless a call since (the program's
    /// read or write that followed) set them already: no lock then.
    pub fn sync_readiness(&self) {
        let shared = self.shared();
        if shared
            .levels_stale
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            shared.lock().update_readiness();
        }
    }

    /// The reader's last read took a Private Buffer's worth or more (a
    /// bulk transfer): a wait for its input sleeps at once, as a blocking
    /// read's does ([`busy_poll::BusyPoll::bulk`]).
    pub fn reads_in_bulk(&self) -> bool {
        self.shared()
            .bulk_reader
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// A `poll` or `select` of the program waited for this stream's
    /// input and the wait ended while polling (`polled`) or after a sleep:
    /// counted in the statistics with the reads' own waits.
    pub fn count_wait(&self, polled: bool) {
        self.shared().count_wait(polled);
    }

    /// An application thread starts (`on`) or stops sleeping on the
    /// readiness descriptor ([`SdpStream::readiness_fd`]); calls balance.
    pub fn await_readiness(&self, on: bool) {
        self.shared().await_readiness(on);
    }

    /// The readiness descriptor is polled only by those who say so from
    /// now on (`on`): [`SdpStream::await_readiness`] and
    /// [`SdpStream::hold_readiness`]; while none does, its levels are not
    /// kept (see [`shared::Shared::readiness_on_demand`]).
    pub fn readiness_on_demand(&self, on: bool) {
        self.shared().readiness_on_demand(on);
    }

    /// An epoll set's kernel registration starts (`on`) or stops
    /// reporting the readiness descriptor; calls balance.
    pub fn hold_readiness(&self, on: bool) {
        self.shared().hold_readiness(on);
    }

    /// Lets go of the stream without touching the connection: no DisConn,
    /// no shutdown, no reset; the descriptors this process holds for it are
    /// closed. For a process that shares the socket with another one (a
    /// child of `fork`) which goes on with the connection. Other handles
    /// to the stream (clones) become inert too.
    pub fn detach(self) {
        self.handle.detached.store(true, Ordering::Release);
        progress::deregister(self.shared().id);
    }

    /// Closes the connection now, as dropping the last handle would (and
    /// dropping it later does nothing more), whatever other handles there
    /// are: for an owner that keeps a handle for its calls' fast path (the
    /// preload's endpoint) and decides itself when the socket is closed. A
    /// call on another handle meanwhile finds the stream closing, as a
    /// call on a TCP socket that another thread shuts down.
    pub fn close(&self) {
        if !self.handle.detached.load(Ordering::Acquire) {
            self.handle.close();
        }
    }

    /// Readiness and state at this moment, as the bits of `poll(2)`: exact,
    /// input a pump left in the socket read first if need be
    /// ([`shared::Inner::settle_input`]).
    pub fn poll_state(&self) -> PollState {
        let state = |g: &shared::Inner| {
            let conn = g.link.conn();
            let closed = conn.state() == State::Closed;
            let read_closed = conn.disconn_received() || closed;
            PollState {
                readable: g.link.readable(),
                writable: g.link.writable(),
                read_closed,
                hangup: closed || (read_closed && conn.disconn_sent()),
                error: conn.error_pending(),
                urgent: g.link.urgent_ready(),
                connected: g.link.is_connected(),
            }
        };
        let shared = self.shared();
        if let Some(s) = shared.look(|g| (g.link.readable() || !g.input_left()).then(|| state(g))) {
            return s;
        }
        let mut g = shared.lock();
        g.settle_input(Instant::now());
        state(&g)
    }

    /// The figures for observability as of the stream's last unlock,
    /// without taking its lock ([`counters`]).
    pub fn counters(&self) -> counters::Snapshot {
        self.shared().counters()
    }

    /// Modes, byte counts and credits, for observability.
    pub fn info(&self) -> StreamInfo {
        self.shared().look(|g| {
            let conn = g.link.conn();
            StreamInfo {
                send_mode: conn.send_mode(),
                recv_mode: conn.recv_mode(),
                bytes_sent: conn.tx().sent(),
                bytes_received: conn.rx_total(),
                credits: conn.credit_state(),
                copies: g.link.copy_stats(),
                zcopy: conn.zcopy_stats(),
            }
        })
    }

    /// In a child of `fork`, before it uses the stream: marks left by
    /// threads of the parent that waited on the stream during the fork
    /// (they are not in the child) are cleared.
    pub fn forget_waiters(&self) {
        self.shared().forget_waiters();
    }

    /// Before a `fork` (no other thread inside the library): the peer
    /// stops writing into this process's ring of the same-host path, since
    /// the connection may go on in the child ([`crate::conn::local`]).
    pub fn revoke_local(&self) {
        self.shared().revoke_local();
    }

    /// Blocks until setup finished; its error if it failed.
    pub fn wait_connected(&self, deadline: Option<Instant>) -> io::Result<()> {
        let shared = self.shared();
        let mut g = shared.lock();
        let r = wait_until(&mut g, deadline, true, |g| {
            g.link.is_connected() || g.link.conn().state() == State::Closed
        });
        if r.is_err() {
            return Err(to_io(Error::TimedOut));
        }
        if g.link.is_connected() {
            return Ok(());
        }
        Err(to_io(
            g.link
                .conn_mut()
                .take_error()
                .unwrap_or(Error::ConnectionRefused),
        ))
    }

    fn shared(&self) -> &Shared {
        &self.handle.shared
    }

    /// Another handle to the same connection (the last one dropped closes
    /// it).
    pub fn try_clone(&self) -> io::Result<SdpStream> {
        Ok(self.clone())
    }

    /// `send(2)` with flags ([`SendFlags::OOB`]) in the stream's mode
    /// (blocking unless nonblocking, the write timeout); returns the
    /// bytes accepted.
    pub fn send_flags(&self, buf: &[u8], flags: SendFlags) -> io::Result<usize> {
        let mut g = self.shared().lock();
        let rule = Rule::of_mode(g.nonblocking, g.write_timeout);
        send_in(&mut g, &[buf], flags, rule)
    }

    /// `sendmsg(2)` of several buffers (`writev`) under the caller's
    /// blocking rule (`block`; a signal ends a wait as it ends a socket
    /// call's): one operation on the stream, as it is one on a TCP
    /// socket — the bytes go in as one `send` of their concatenation
    /// would take them, its messages gathered across the buffers without
    /// a copy, so a reader finds them together, never a message per
    /// buffer. A call that may wait takes every byte (fewer only when its
    /// deadline or a signal cuts it short: EAGAIN or EINTR if none went);
    /// one that may not takes what fits now. The buffers go
    /// [`SEND_FROM_MAX`](crate::link::direct::SEND_FROM_MAX) at a time
    /// (a call that may not wait takes from the first ones only, a partial
    /// write as from a socket short of room); [`SendFlags::OOB`] marks the
    /// last byte of the whole. One large buffer that may wait is lent:
    /// sent by Zcopy, or by Bcopy straight from it ([`zcopy`]), unless
    /// [`SendFlags::MORE`].
    pub fn send_vectored(
        &self,
        bufs: &[IoSlice<'_>],
        flags: SendFlags,
        block: Block,
    ) -> io::Result<usize> {
        use crate::link::direct::SEND_FROM_MAX;
        let rule = Rule::socket(block);
        let nonempty = bufs.iter().filter(|b| !b.is_empty()).map(|b| &b[..]);
        if bufs.len() <= SEND_FROM_MAX {
            // The common call: its buffers on the stack, no allocation.
            let mut few: [&[u8]; SEND_FROM_MAX] = [&[]; SEND_FROM_MAX];
            let mut n = 0;
            for (slot, b) in few.iter_mut().zip(nonempty) {
                *slot = b;
                n += 1;
            }
            return send_in(&mut self.shared().lock(), &few[..n], flags, rule);
        }
        let parts: Vec<&[u8]> = nonempty.collect();
        let mut g = self.shared().lock();
        if parts.len() <= SEND_FROM_MAX {
            return send_in(&mut g, &parts, flags, rule);
        }
        let mut done = 0;
        for (k, chunk) in parts.chunks(SEND_FROM_MAX).enumerate() {
            // The urgent byte is the last of the whole call.
            let last = (k + 1) * SEND_FROM_MAX >= parts.len();
            let f = if last {
                flags
            } else {
                SendFlags(flags.0 & !SendFlags::OOB.0)
            };
            let want: usize = chunk.iter().map(|b| b.len()).sum();
            match send_in(&mut g, chunk, f, rule) {
                Ok(n) => {
                    done += n;
                    if n < want || !rule.waits() {
                        break;
                    }
                }
                Err(e) if done > 0 => {
                    restore(&mut g, &e);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// A caller that made several calls for one (a scattered read) and
    /// met an error after some bytes moved returns the bytes; the error,
    /// if it is one a connection keeps pending, is reported by the next
    /// call (see [`Conn::restore_error`](crate::conn::Conn::restore_error)).
    pub fn restore_error(&self, e: &io::Error) {
        restore(&mut self.shared().lock(), e);
    }

    /// `recv(2)` with flags ([`RecvFlags::OOB`], [`RecvFlags::PEEK`],
    /// [`RecvFlags::WAITALL`]) in the stream's mode.
    pub fn recv_flags(&self, buf: &mut [u8], flags: RecvFlags) -> io::Result<usize> {
        let mut g = self.shared().lock();
        let rule = Rule::of_mode(g.nonblocking, g.read_timeout);
        recv_in(&mut g, buf, flags, rule)
    }

    /// `recvmsg(2)` into several buffers (`readv`) under the caller's
    /// blocking rule (`block`; a signal ends a wait as it ends a socket
    /// call's: the bytes read by then, or EINTR): the buffers fill in
    /// order, and the call returns once it has bytes and the next buffer
    /// would wait, or with [`RecvFlags::WAITALL`] once all are full (or
    /// the stream ended, the deadline passed, a signal came). The urgent
    /// byte ([`RecvFlags::OOB`]) is never waited for, as TCP answers at
    /// once. One large buffer that may wait is posted for Zcopy when the
    /// connection uses it ([`zcopy`]).
    pub fn recv_vectored(
        &self,
        bufs: &mut [IoSliceMut<'_>],
        flags: RecvFlags,
        block: Block,
    ) -> io::Result<usize> {
        let mut g = self.shared().lock();
        let rule = Rule::socket(block);
        let now = Rule::socket(Block::Never);
        // A peek takes what is there: WAITALL would wait for bytes that,
        // peeked, never leave.
        let flags = if flags.contains(RecvFlags::PEEK) {
            RecvFlags(flags.0 & !RecvFlags::WAITALL.0)
        } else {
            flags
        };
        if flags.contains(RecvFlags::OOB) {
            let one = match bufs.iter_mut().find(|b| !b.is_empty()) {
                Some(b) => &mut b[..1],
                None => &mut [],
            };
            return recv_in(&mut g, one, flags, now);
        }
        let filled = bufs.iter().filter(|b| !b.is_empty()).count();
        if flags.contains(RecvFlags::PEEK) && filled > 1 {
            // Peeked bytes stay: one look at them all, then scattered.
            let mut all = vec![0u8; bufs.iter().map(|b| b.len()).sum()];
            let n = recv_in(&mut g, &mut all, flags, rule)?;
            let mut from = &all[..n];
            for b in bufs.iter_mut() {
                let k = from.len().min(b.len());
                b[..k].copy_from_slice(&from[..k]);
                from = &from[k..];
            }
            return Ok(n);
        }
        let mut done = 0;
        for b in bufs.iter_mut().filter(|b| !b.is_empty()) {
            // Once the call has bytes, only WAITALL waits for more.
            let r = if done == 0 || flags.contains(RecvFlags::WAITALL) {
                recv_in(&mut g, b, flags, rule)
            } else {
                recv_in(&mut g, b, flags, now)
            };
            match r {
                Ok(n) => {
                    done += n;
                    if n < b.len() {
                        break;
                    }
                }
                Err(e) if done > 0 => {
                    restore(&mut g, &e);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }

    /// The connection's whole state, for a test that hangs.
    #[cfg(feature = "testing")]
    pub fn debug_state(&self) -> String {
        format!("{:#?}", self.shared().lock().link.conn())
    }

    /// Holds the stream's lock until the guard drops — as a thread that a
    /// `fork` caught inside a call leaves it held for good in the child:
    /// for tests of code that must never wait for it.
    #[cfg(feature = "testing")]
    pub fn hold_lock(&self) -> shared::Locked<'_> {
        self.shared().lock()
    }

    /// Whether another thread's Zcopy call holds the socket now: a thread
    /// that waits for this stream then waits for that call's progress,
    /// not for the socket (which only that call reads).
    pub fn zcopy_elsewhere(&self) -> bool {
        self.shared().look(|g| g.zcopy_elsewhere())
    }

    /// `shutdown(2)`. Write: DisConn once every accepted byte is sent
    /// (§8.2.1); Read: later reads return 0.
    pub fn shutdown(&self, how: NetShutdown) -> io::Result<()> {
        let how = match how {
            NetShutdown::Read => Shutdown::Read,
            NetShutdown::Write => Shutdown::Write,
            NetShutdown::Both => Shutdown::Both,
        };
        let mut g = self.shared().lock();
        g.link.shutdown(how).map_err(to_io)?;
        g.pump_out(Instant::now());
        Ok(())
    }

    /// O_NONBLOCK.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.shared().lock().nonblocking = nonblocking;
        Ok(())
    }

    /// SO_RCVTIMEO (`Some(0)` is refused, as by `TcpStream`).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        check_timeout(t)?;
        self.shared().lock().read_timeout = t;
        Ok(())
    }

    /// SO_SNDTIMEO.
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        check_timeout(t)?;
        self.shared().lock().write_timeout = t;
        Ok(())
    }

    /// The read timeout.
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(self.shared().look(|g| g.read_timeout))
    }

    /// The write timeout.
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(self.shared().look(|g| g.write_timeout))
    }

    /// SO_LINGER. `Some(0)`: the close (drop of the last handle) is
    /// abortive (§8.2.2). `Some(t)`: a blocking close waits up to `t` for
    /// the graceful close to finish — both DisConns and both FINs — which a
    /// process about to exit wants: its socket must not be closed while
    /// the peer still sends (credit updates), or the kernel answers with a
    /// reset. `None` (default): the close finishes in the background.
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        self.shared().lock().linger = linger;
        Ok(())
    }

    /// SO_LINGER.
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        Ok(self.shared().look(|g| g.linger))
    }

    /// TCP_NODELAY: no short tail of a write waits for the next write
    /// ([`Config::coalesce`]). The iWARP stream's own socket always has
    /// it (its messages are framed already).
    pub fn set_nodelay(&self, on: bool) -> io::Result<()> {
        self.shared().lock().link.conn_mut().set_nodelay(on);
        Ok(())
    }

    /// TCP_NODELAY as [`SdpStream::set_nodelay`] left it.
    pub fn nodelay(&self) -> io::Result<bool> {
        Ok(self.shared().look(|g| g.link.conn().nodelay()))
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.handle.peer)
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.handle.local)
    }

    /// SO_ERROR: the pending error, taken.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        Ok(self.shared().lock().link.conn_mut().take_error().map(to_io))
    }

    /// FIONREAD: what a read would return now. The stream is pumped
    /// first if that would move anything, as TCP's count takes in what
    /// the kernel holds: bytes left in the socket (a reader that took it
    /// over leaves arrivals there between its reads) would otherwise
    /// count as none. Programs ask before each read (wrk, between its
    /// 8 KiB reads of one response), mostly with nothing to move.
    pub fn bytes_readable(&self) -> u64 {
        self.lock_pumped().link.bytes_readable()
    }

    /// SIOCATMARK, pumped first as [`SdpStream::bytes_readable`] is.
    pub fn at_mark(&self) -> bool {
        self.lock_pumped().link.at_mark()
    }

    /// The stream's lock, the stream pumped first if that would move
    /// anything ([`shared::Inner::pump_would_move`]): for a call that
    /// only reports.
    fn lock_pumped(&self) -> Locked<'_> {
        let mut g = self.shared().lock();
        let now = Instant::now();
        if g.pump_would_move(now) {
            g.pump(now);
        }
        g
    }

    /// SO_OOBINLINE.
    pub fn set_oob_inline(&self, inline: bool) {
        self.shared().lock().link.conn_mut().set_oob_inline(inline);
    }

    /// SO_SNDBUF set by the program (see
    /// [`Config::with_socket_buffers`]): the send buffer holds at most
    /// `bytes` from now on, and never more than it started with.
    pub fn set_send_buffer(&self, bytes: u64) {
        let mut g = self.shared().lock();
        g.link.set_send_buffer(bytes);
        g.update_readiness();
    }

    /// The program waits for POLLOUT itself (O_NONBLOCK) rather than in
    /// its writes: sends take only what the peer's credits carry, and
    /// writability follows the credit (see
    /// [`Conn::set_credit_bound`](crate::conn::Conn::set_credit_bound)).
    pub fn set_credit_bound(&self, on: bool) {
        let mut g = self.shared().lock();
        g.link.conn_mut().set_credit_bound(on);
        g.update_readiness();
    }

    /// A read would make progress (data, end of stream, or an error).
    pub fn readable(&self) -> bool {
        self.poll_state().readable
    }

    /// A write would take at least one byte (or fail at once).
    pub fn writable(&self) -> bool {
        self.shared().look(|g| g.link.writable())
    }

    /// Setup finished and the connection carries data.
    pub fn is_connected(&self) -> bool {
        self.shared().look(|g| g.link.is_connected())
    }

    /// The credit state (§10), for observability.
    pub fn credit_state(&self) -> CreditState {
        self.shared().look(|g| g.link.credit_state())
    }

    /// Why the connection closed, once it did (for diagnostics).
    pub fn close_reason(&self) -> Option<String> {
        self.shared()
            .look(|g| g.link.close_reason().map(ToString::to_string))
    }

    /// Why the connection closed, once it did (for a caller that picks a
    /// fallback by cause: an MPA reject, a timeout, a reset).
    pub fn close_cause(&self) -> Option<crate::conn::CloseReason> {
        self.shared().look(|g| g.link.close_reason().copied())
    }

    /// The readiness descriptor (see the module documentation); what
    /// [`AsRawFd`] returns. For polling only.
    pub fn readiness_fd(&self) -> io::Result<BorrowedFd<'_>> {
        self.shared().readiness()
    }

    /// [`SdpStream::readiness_fd`], shared: the same descriptor (no
    /// duplicate) for a holder that outlives the borrow.
    pub fn readiness_shared(&self) -> io::Result<Arc<OwnedFd>> {
        self.shared().readiness_shared()
    }

    /// The kernel TCP socket (the endpoint's), whose number stays valid
    /// until [`SdpStream::move_socket`] and follows a socket duplication
    /// (draft §13.1.1, the connection moved to a new TCP connection).
    pub fn socket_fd(&self) -> RawFd {
        self.shared().sock().as_raw_fd()
    }

    /// Carries the connection on over `to`, another descriptor of its
    /// socket, and gives back the descriptor it had: a caller that lent
    /// the stream a number of its own (a program's fd) takes it back.
    pub fn move_socket(&self, to: OwnedFd) -> io::Result<OwnedFd> {
        self.shared().move_socket(to)
    }

    /// Blocks until every byte accepted so far is handed to the kernel
    /// (nonblocking mode: one attempt).
    fn flush_accepted(&self) -> io::Result<()> {
        let shared = self.shared();
        let mut g = shared.lock();
        if g.nonblocking {
            g.pump(Instant::now());
            return Ok(());
        }
        let deadline = g.write_timeout.map(|t| Instant::now() + t);
        wait_until(&mut g, deadline, false, |g| {
            let tx = g.link.conn().tx();
            tx.released() == tx.accepted() || !g.link.is_connected()
        })
    }
}

/// Readiness and state of a stream at one moment ([`SdpStream::poll_state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PollState {
    /// A read would make progress: data, end of stream or an error
    /// (POLLIN).
    pub readable: bool,
    /// A write would take at least one byte or fail at once (POLLOUT).
    pub writable: bool,
    /// No more data will come: the peer's DisConn, or the connection
    /// closed (POLLRDHUP).
    pub read_closed: bool,
    /// Both directions are closed (POLLHUP).
    pub hangup: bool,
    /// An error is pending (POLLERR; [`SdpStream::take_error`]).
    pub error: bool,
    /// An urgent byte waits (POLLPRI).
    pub urgent: bool,
    /// Setup finished and the connection carries data.
    pub connected: bool,
}

/// Modes, byte counts and credits of a stream ([`SdpStream::info`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamInfo {
    /// Flow Control Mode of our sending half-connection.
    pub send_mode: FlowControlMode,
    /// Flow Control Mode of our receiving half-connection.
    pub recv_mode: FlowControlMode,
    /// Payload bytes sent in SDP messages (Bcopy).
    pub bytes_sent: u64,
    /// Payload bytes received in SDP messages (Bcopy).
    pub bytes_received: u64,
    /// The credit state (§10).
    pub credits: CreditState,
    /// The Bcopy bytes by the copies they took (DESIGN §7): sent straight
    /// from the caller's buffer or staged, received straight into the
    /// reader's buffer or copied from a Private Buffer.
    pub copies: CopyStats,
    /// Bytes by mechanism — Bcopy, Read Zcopy, Write Zcopy — and the
    /// Zcopy messages sent ([`crate::stream::zcopy`]).
    pub zcopy: ZcopyStats,
}

/// `config` with its receive Private Buffers shrunk, if need be, so that a
/// full message is one FPDU on this socket — when that still leaves at
/// least 32 KiB (a loopback or jumbo-frame path). A 64 KiB buffer on
/// loopback (MULPDU 65,474) would otherwise make every full message two
/// FPDUs, the second one of a few dozen bytes. The FPDU is the one the
/// peer's EMSS settles on ([`settled_mss`]), not the one it starts with.
/// [`SdpStream::start_connect`] and [`SdpListener::accept`] apply it; a
/// caller that sets a link up itself ([`SdpStream::from_parts`]) does too.
pub fn fit_config(tcp: &TcpStream, config: &Config) -> Config {
    let sock = socket2::SockRef::from(tcp);
    let mut c = config.with_socket_buffers(
        program_set(&sock, Buffer::Recv),
        program_set(&sock, Buffer::Send),
    );
    let Some(mss) = settled_mss(tcp) else {
        return c;
    };
    let one_fpdu = iwarp::wire::fpdu::mulpdu(mss as usize, false)
        .saturating_sub(iwarp::wire::ddp::UNTAGGED_HEADER_LEN) as u32;
    if one_fpdu >= 32 * 1024 && c.buf_size > one_fpdu {
        c.buf_size = one_fpdu;
    }
    c
}

/// The MSS TCP settles on for this connection, as far as it can be known
/// at the start: its MSS now, or what the path MTU leaves for TCP's
/// segments, less the largest TCP options, if that is more. Linux starts
/// with half the peer's first window (32 KiB on loopback) and grows to
/// the path's once the window has; the driver follows it (RFC 5044 §4.5).
fn settled_mss(tcp: &TcpStream) -> Option<u32> {
    const TCP_HEADER_AND_OPTIONS: u32 = 20 + 40;
    let now = socket2::SockRef::from(tcp).tcp_mss().ok();
    // IPV6_MTU answers only on an IPv6 socket (no address lookup first).
    let path = match rustix::net::sockopt::ipv6_mtu(tcp) {
        Ok(m) => Some((m, 40)),
        Err(_) => rustix::net::sockopt::ip_mtu(tcp).ok().map(|m| (m, 20)),
    };
    let path = path.map(|(mtu, ip)| mtu.saturating_sub(ip + TCP_HEADER_AND_OPTIONS));
    now.max(path).filter(|&m| m > 0)
}

#[derive(Clone, Copy)]
enum Buffer {
    Recv,
    Send,
}

/// The socket's SO_RCVBUF or SO_SNDBUF if the program made it smaller
/// than the kernel starts a TCP socket with (`net.ipv4.tcp_rmem` and
/// `tcp_wmem`, the middle value): the kernel's own tuning only grows a
/// buffer, so a smaller one before any data moved is the program's
/// choice (Linux reports twice what was asked, its bookkeeping included).
fn program_set(sock: &socket2::SockRef<'_>, which: Buffer) -> Option<u64> {
    let size = match which {
        Buffer::Recv => sock.recv_buffer_size(),
        Buffer::Send => sock.send_buffer_size(),
    };
    let size = size.ok()? as u64;
    (size < initial_size(which)?).then_some(size)
}

/// The middle value of `net.ipv4.tcp_rmem` or `tcp_wmem`, read once per
/// process: reading the file for every connection cost each end four
/// system calls and two trips through procfs in its setup.
fn initial_size(which: Buffer) -> Option<u64> {
    static RMEM: OnceLock<Option<u64>> = OnceLock::new();
    static WMEM: OnceLock<Option<u64>> = OnceLock::new();
    let (cell, sysctl) = match which {
        Buffer::Recv => (&RMEM, "/proc/sys/net/ipv4/tcp_rmem"),
        Buffer::Send => (&WMEM, "/proc/sys/net/ipv4/tcp_wmem"),
    };
    *cell.get_or_init(|| {
        std::fs::read_to_string(sysctl)
            .ok()?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    })
}

fn check_timeout(t: Option<Duration>) -> io::Result<()> {
    if t == Some(Duration::ZERO) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cannot set a 0 duration timeout",
        ));
    }
    Ok(())
}

impl Read for &SdpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_flags(buf, RecvFlags::EMPTY)
    }
}

impl Read for SdpStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        (&*self).read(buf)
    }
}

impl Write for &SdpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.send_flags(buf, SendFlags::EMPTY)
    }

    /// Waits until every accepted byte is with the kernel.
    fn flush(&mut self) -> io::Result<()> {
        self.flush_accepted()
    }
}

impl Write for SdpStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        (&*self).flush()
    }
}

impl AsRawFd for SdpStream {
    /// The readiness descriptor (-1 if it could not be created).
    fn as_raw_fd(&self) -> RawFd {
        self.readiness_fd().map_or(-1, |fd| fd.as_raw_fd())
    }
}

impl AsFd for SdpStream {
    /// The readiness descriptor.
    ///
    /// # Panics
    ///
    /// If it cannot be created (out of descriptors); use
    /// [`SdpStream::readiness_fd`] to see the error.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.readiness_fd().expect("readiness descriptor")
    }
}

/// A listening SDP socket; see the module documentation.
#[derive(Debug)]
pub struct SdpListener {
    tcp: TcpListener,
    config: Config,
}

impl SdpListener {
    /// Binds to `addr`, with the default [`Config`].
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<SdpListener> {
        SdpListener::bind_with(addr, &Config::default())
    }

    /// Binds with `config` for the accepted connections.
    pub fn bind_with(addr: impl ToSocketAddrs, config: &Config) -> io::Result<SdpListener> {
        Ok(SdpListener {
            tcp: TcpListener::bind(addr)?,
            config: config.clone(),
        })
    }

    /// The local address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    /// O_NONBLOCK: `accept` returns EAGAIN when no TCP connection waits.
    /// A connection that is there is still set up before `accept` returns
    /// (bounded by the MPA startup timeout).
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.tcp.set_nonblocking(nonblocking)
    }

    /// Accepts the next SDP connection. A TCP connection whose SDP setup
    /// fails (bad MPA frame, refused Hello, timeout) is dropped and the
    /// next one is waited for.
    pub fn accept(&self) -> io::Result<(SdpStream, SocketAddr)> {
        loop {
            let (tcp, addr) = self.tcp.accept()?;
            match accept_setup(tcp, &self.config) {
                Ok(s) => return Ok((s, addr)),
                Err(e) => crate::log::emit(format_args!("SDP setup with {addr} failed: {e}")),
            }
        }
    }

    /// The accepted connections, one after another.
    pub fn incoming(&self) -> impl Iterator<Item = io::Result<SdpStream>> + '_ {
        std::iter::repeat_with(move || self.accept().map(|(s, _)| s))
    }
}

impl AsRawFd for SdpListener {
    /// The kernel listening socket.
    fn as_raw_fd(&self) -> RawFd {
        self.tcp.as_raw_fd()
    }
}

/// The Accepting Peer's setup on an accepted TCP stream: wait for the MPA
/// Request, accept or refuse its Hello ([`accept::answer_request`]), then
/// wait for the RTR.
fn accept_setup(tcp: TcpStream, config: &Config) -> io::Result<SdpStream> {
    let (mut ep, config) = accept::responder(tcp, config, Instant::now())?;
    let stream = loop {
        ep = match accept::answer_request(ep, &config, Instant::now(), Driver::Caller) {
            accept::Answer::Answered(s) => break s,
            accept::Answer::Failed(e) => return Err(e),
            accept::Answer::Pending(ep) => ep,
        };
        let timeout = ep
            .poll_timeout()
            .map(|t| t.saturating_duration_since(Instant::now()));
        let ts = timeout.map(|t| Timespec {
            tv_sec: t.as_secs() as i64,
            tv_nsec: i64::from(t.subsec_nanos()),
        });
        let mut fds = [PollFd::new(ep.stream(), PollFlags::IN)];
        let _ = poll(&mut fds, ts.as_ref());
    };
    let deadline = Instant::now() + iwarp::mpa::startup::DEFAULT_TIMEOUT;
    let r = stream.wait_connected(Some(deadline));
    stream.to_progress()?;
    r.map(|()| stream)
}
