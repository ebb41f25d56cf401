//! The Connecting Peer's way to SDP (DESIGN §4): bind the program's socket
//! to an ephemeral port (CpPort), ask the port mapper, TCP-connect the
//! same socket to the SDP address S':Q, MPA Request with the Hello, RTR,
//! HelloAck. Any failure falls back to plain TCP to S:P on the same fd
//! number, with a fresh kernel socket (`dup3`'ed onto it, keeping
//! `FD_CLOEXEC`, `O_NONBLOCK` and the options the program set) once the old
//! one was connected somewhere.
//!
//! [`Connector`] is the state machine: [`Connector::step`] never blocks
//! (except for the kernel's own `connect` of a blocking socket) and says
//! which fd to wait on. Either way the fd table holds the endpoint, as a
//! connecting socket, before the setup starts: the program's other threads
//! never reach the setup's own socket. A blocking `connect` runs the
//! machine on the calling thread; a nonblocking one hands it to the
//! service thread ([`super::service`]) and returns `EINPROGRESS` at once:
//! the fd turns writable when SDP or the fallback is up or failed, and
//! `SO_ERROR` tells which. Both end in [`Connector::finish`]. Once the
//! MPA Request is out, the program's own calls on the fd may end a
//! nonblocking setup first ([`Pending`]).
//!
//! A cached port mapper answer whose SDP port refuses is forgotten and
//! asked again once; a fresh answer refused is a denial (draft §7.5.1).
//!
//! `use sdp` rules and `AF_INET_SDP` sockets have no fallback: when SDP
//! cannot be had the connect fails with `ECONNREFUSED` (DESIGN §4).

use super::endpoint::{Advance, Ep, State};
use super::service::{self, Task, Wait};
use crate::log::Level;
use crate::sdp::{ConnectOutcome, Errno, SdpEndpoint, Setup};
use crate::sys::addr::{socket_name, RawAddr};
use crate::sys::real;
use crate::table::{self, TcpReason};
use portmapper::client::{Decision, Fallback};
use portmapper::net::{PendingQuery, Start};
use sdp_core::stream::busy_poll::poll_until;
use sdp_core::stream::readiness::Readiness as Levels;
use sdp_core::stream::{Driver, SdpStream};
use std::cell::Cell;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// How long the MPA/Hello setup may take before the fallback (the engine's
/// own startup timer, 5 s, normally decides first).
const SETUP_LIMIT: Duration = Duration::from_secs(10);

/// Where the setup stands.
enum Phase {
    /// The port mapper is being asked.
    Query(Box<PendingQuery>),
    /// PMAccept: connect the socket to the SDP address.
    Connect(SocketAddr),
    /// TCP connect to S':Q under way (nonblocking socket).
    Tcp,
    /// TCP connected: start the MPA/SDP setup.
    StartSetup,
    /// MPA Request sent. A blocking connect carries the setup on in its
    /// own thread; a nonblocking one leaves it to the progress thread and
    /// waits on the stream's readiness descriptor (`watch`).
    Setup {
        stream: SdpStream,
        watch: Option<Arc<OwnedFd>>,
        until: Instant,
    },
    Done,
}

/// Why SDP was not had.
#[derive(Debug, Clone, Copy)]
pub struct Fail {
    pub reason: TcpReason,
    /// The socket was connected (or tried) to the SDP address: the
    /// fallback needs a fresh one.
    pub connected: bool,
}

/// What to do next.
pub enum Step {
    Wait(Wait),
    Done(Result<SdpStream, Fail>),
}

/// See the module documentation.
pub struct Connector {
    /// The program's fd number.
    fd: RawFd,
    /// A duplicate of the program's socket (same socket, our number),
    /// until the stream takes it.
    sock: Option<OwnedFd>,
    /// S:P as the program gave it.
    dest: SocketAddr,
    /// S:P for the port mapper (a v4-mapped address as IPv4).
    ap: SocketAddr,
    v6: bool,
    sdp_only: bool,
    /// The address the program bound the socket to before connecting.
    app_local: Option<SocketAddr>,
    phase: Phase,
    /// `phase` went to `Connect` on the cache's answer.
    from_cache: bool,
    /// The endpoint the fd table holds meanwhile.
    ep: Option<Arc<Ep>>,
    nonblocking: bool,
    /// Why not SDP, when the port mapper's cache decided at once.
    decided: TcpReason,
}

fn tcp_reason(f: Fallback) -> TcpReason {
    match f {
        Fallback::Denied => TcpReason::PmDeny,
        Fallback::NoAnswer => TcpReason::PmTimeout,
        Fallback::Unreachable => TcpReason::PmUnreachable,
    }
}

/// A v4-mapped IPv6 address as IPv4 (what the port mapper and the rules
/// speak); others unchanged.
fn plain(a: SocketAddr) -> SocketAddr {
    match a {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(IpAddr::V4(v4), v6.port()),
            None => a,
        },
        v4 => v4,
    }
}

/// `a` in the socket's family (IPv4 on an IPv6 socket as v4-mapped).
fn for_socket(a: SocketAddr, v6: bool) -> Option<SocketAddr> {
    match (a, v6) {
        (SocketAddr::V4(v4), true) => Some(SocketAddr::new(
            IpAddr::V6(v4.ip().to_ipv6_mapped()),
            v4.port(),
        )),
        (SocketAddr::V6(v6a), false) => v6a
            .ip()
            .to_ipv4_mapped()
            .map(|ip| SocketAddr::new(IpAddr::V4(ip), v6a.port())),
        (a, _) => Some(a),
    }
}

/// The engine's own descriptor of the socket `fd`, high in the table
/// ([`sdp_core::fds`]).
fn dup_cloexec(fd: RawFd) -> Option<OwnedFd> {
    // SAFETY: `fd` is the program's socket, open for this call.
    let sock = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    match sdp_core::fds::dup_high(sock) {
        Ok(d) => Some(d),
        Err(e) => {
            // An internal-error fallback says why (EMFILE: the process is
            // at its descriptor limit, and SDP needs a few more per
            // connection).
            crate::log!(
                Level::Warn,
                "fd {fd}: cannot duplicate the socket for SDP: {e}"
            );
            None
        }
    }
}

fn connect_raw(fd: RawFd, a: SocketAddr) -> Result<(), Errno> {
    let raw = RawAddr::new(a);
    // SAFETY: a complete address of raw.len() bytes.
    if unsafe { real::connect(fd, raw.as_ptr(), raw.len()) } == 0 {
        Ok(())
    } else {
        Err(real::errno())
    }
}

fn bind_raw(fd: RawFd, a: SocketAddr) -> Result<(), Errno> {
    let raw = RawAddr::new(a);
    // SAFETY: a complete address of raw.len() bytes.
    if unsafe { real::bind(fd, raw.as_ptr(), raw.len()) } == 0 {
        Ok(())
    } else {
        Err(real::errno())
    }
}

fn so_error(fd: RawFd) -> Errno {
    crate::sys::addr::int_sockopt(fd, libc::SOL_SOCKET, libc::SO_ERROR).unwrap_or(libc::EIO)
}

fn set_nonblock(fd: RawFd, on: bool) {
    // SAFETY: F_GETFL/F_SETFL on a socket we hold.
    unsafe {
        let fl = real::fcntl(fd, libc::F_GETFL, 0);
        if fl >= 0 {
            let want = if on {
                fl | libc::O_NONBLOCK
            } else {
                fl & !libc::O_NONBLOCK
            };
            if want != fl {
                real::fcntl(fd, libc::F_SETFL, want as libc::c_ulong);
            }
        }
    }
}

/// Waits until `fd` polls `events` or `deadline` (signals restart it);
/// whether it does.
pub fn poll_one(fd: RawFd, events: i16, deadline: Option<Instant>) -> bool {
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let ms = deadline.map_or(-1, |d| {
        let left = d.saturating_duration_since(Instant::now());
        left.as_millis().min(60_000) as i32 + i32::from(left.subsec_micros() % 1000 != 0)
    });
    // SAFETY: one local pollfd.
    unsafe { real::poll(&mut p, 1, ms) > 0 }
}

/// [`poll_one`], looking without sleeping first for the busy-poll time
/// (`SDP_BUSY_POLL_US`, DESIGN §7 "Polling before a sleep"): a port
/// mapper answers within tens of microseconds, and a sleep would add a
/// wake-up to every connect that asks it.
fn poll_polling(fd: RawFd, events: i16, deadline: Option<Instant>) {
    let budget = Duration::from_micros(u64::from(super::sdp_config().busy_poll_us));
    let started = Instant::now();
    let limit = deadline.map_or(budget, |d| budget.min(d.saturating_duration_since(started)));
    let look = || poll_one(fd, events, Some(Instant::now())).then_some(());
    if limit.is_zero() || poll_until(started, limit, look).is_none() {
        poll_one(fd, events, deadline);
    }
}

/// `connect` on SDP: see [`crate::sdp::SdpBackend::connect`].
pub fn start(fd: RawFd, dest: SocketAddr, nonblocking: bool, sdp_only: bool) -> ConnectOutcome {
    let fail = |reason: TcpReason| {
        if sdp_only {
            crate::log!(
                Level::Info,
                "fd {fd}: connect {dest}: SDP only, and SDP failed ({}): ECONNREFUSED",
                reason.name()
            );
            ConnectOutcome::Failed(libc::ECONNREFUSED)
        } else {
            ConnectOutcome::Fallback(reason)
        }
    };
    let known = table::get(fd);
    let mut c = match Connector::new(fd, dest, sdp_only, known.as_ref()) {
        Ok(c) => c,
        Err(reason) => return fail(reason),
    };
    if let Phase::Done = c.phase {
        return fail(c.decided);
    }
    // Blocking: the wake fd is made only if another thread polls the fd
    // meanwhile (see `Ep::connecting`).
    // A TCP_NODELAY the program set before connect (the socket has it
    // until the engine sets its own); one it never set is off.
    let ep = match Ep::connecting(fd, nonblocking, table::nodelay(fd, known.as_ref())) {
        Ok(ep) => Arc::new(ep),
        Err(_) => return fail(TcpReason::Internal),
    };
    c.ep = Some(ep.clone());
    c.nonblocking = nonblocking;
    // Carried on once the hooks recorded the endpoint in the fd table:
    // a fallback must find it there.
    if nonblocking {
        let carried = ep.clone();
        ep.park(Box::new(move || {
            let pending = Arc::new(Pending {
                connector: Mutex::new(Some(c)),
                watch: OnceLock::new(),
                ended: AtomicBool::new(false),
            });
            let setup: Weak<dyn Advance> = Arc::downgrade(&pending) as Weak<dyn Advance>;
            carried.carried_by(setup);
            service::submit(Box::new(Carried(pending)));
            Setup::InProgress
        }));
    } else {
        ep.park(Box::new(move || {
            let result = c.run_blocking();
            let setup = {
                let _g = table::enter_gate();
                c.finish(result)
            };
            let Setup::Fallback(reason) = setup else {
                return setup;
            };
            // The program's own connect, blocking as it asked, outside
            // the fork gate; meanwhile the fd stays a connecting socket to
            // the program's other threads, as a TCP one would.
            let connected = connect_raw(fd, dest);
            let _g = table::enter_gate();
            c.fall_back(reason);
            Setup::FellBack(reason, connected)
        }));
    }
    ConnectOutcome::Started(ep)
}

impl Connector {
    /// Binds the socket (CpPort) and asks the port mapper (or its cache).
    /// `known`: the socket's entry in the fd table (its family, and
    /// whether the program bound it, without asking the kernel).
    fn new(
        fd: RawFd,
        dest: SocketAddr,
        sdp_only: bool,
        known: Option<&table::Entry>,
    ) -> Result<Connector, TcpReason> {
        let sock = dup_cloexec(fd).ok_or(TcpReason::Internal)?;
        let v6 = match known {
            Some(e) => e.ipv6,
            None => {
                crate::sys::addr::int_sockopt(fd, libc::SOL_SOCKET, libc::SO_DOMAIN)
                    == Some(libc::AF_INET6)
            }
        };
        let ap = plain(dest);
        let app_local = match known {
            Some(e) if !e.adopted && !e.bound => None,
            _ => socket_name(fd, false).filter(|a| a.port() != 0),
        };
        let mut c = Connector {
            fd,
            sock: Some(sock),
            dest,
            ap,
            v6,
            sdp_only,
            app_local,
            phase: Phase::Done,
            from_cache: false,
            ep: None,
            nonblocking: false,
            decided: TcpReason::None,
        };
        let cached = {
            let _g = table::enter_gate();
            super::pm().cached(ap)
        };
        c.ask(cached)?;
        Ok(c)
    }

    /// Takes the cache's answer, or asks the port mapper: a query binds
    /// the socket first (CpPort) unless the program did; a cached answer
    /// needs no CpPort, so no bind before the connect.
    fn ask(&mut self, cached: Option<Decision>) -> Result<(), TcpReason> {
        let fd = self.fd;
        if self.app_local.is_none() && cached.is_none() {
            let any = if self.v6 {
                SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), 0)
            } else {
                SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0)
            };
            bind_raw(fd, any).map_err(|e| {
                crate::log!(Level::Warn, "fd {fd}: bind for CpPort: errno {e}");
                TcpReason::Internal
            })?;
        }
        let started = match cached {
            Some(d) => Ok(Start::Decided(d)),
            None => {
                let cp = socket_name(fd, false)
                    .map(plain)
                    .ok_or(TcpReason::Internal)?;
                let _g = table::enter_gate();
                super::pm().start(self.ap, cp)
            }
        };
        self.from_cache = false;
        match started {
            Ok(Start::Decided(Decision::Sdp(a))) => {
                self.phase = Phase::Connect(a);
                self.from_cache = true;
            }
            Ok(Start::Decided(Decision::Tcp(f))) => self.decided = tcp_reason(f),
            Ok(Start::Pending(q)) => self.phase = Phase::Query(Box::new(q)),
            Err(e) => {
                crate::log!(Level::Debug, "fd {fd}: port mapper query: {e}");
                self.decided = TcpReason::PmUnreachable;
            }
        }
        Ok(())
    }

    /// The SDP address of a cached answer refused the connection: the
    /// listener behind it is gone (the server listened again since, on a
    /// new SDP port). The answer is forgotten and the port mapper asked
    /// again, on a fresh socket; a second refusal is a denial (draft
    /// §7.5.1).
    fn ask_again(&mut self) -> Result<(), TcpReason> {
        crate::log!(
            Level::Debug,
            "fd {}: {}: the cached SDP address refused, asking the port mapper again",
            self.fd,
            self.dest
        );
        {
            let _g = table::enter_gate();
            super::pm().forget(self.ap);
            super::pm_cache_changed();
        }
        self.replace_socket(self.nonblocking)
            .map_err(|_| TcpReason::Internal)?;
        self.sock = Some(dup_cloexec(self.fd).ok_or(TcpReason::Internal)?);
        self.share_with_duplicates();
        self.ask(None)
    }

    /// Our duplicate of the program's socket (-1 once the stream took it).
    fn sock_fd(&self) -> RawFd {
        self.sock.as_ref().map_or(-1, AsRawFd::as_raw_fd)
    }

    /// The program closed the fd of a nonblocking connect: stop.
    pub fn abandoned(&self) -> bool {
        self.ep
            .as_ref()
            .is_some_and(|ep| matches!(*ep.lock(), State::Closed))
    }

    fn failed(&self, reason: TcpReason) -> Step {
        // Connected to the SDP address or tried: remember, for this host,
        // that SDP did not work (the cached PMAccept becomes a denial).
        {
            let _g = table::enter_gate();
            super::pm().sdp_connect_failed(self.ap);
            super::pm_cache_changed();
        }
        Step::Done(Err(Fail {
            reason,
            connected: true,
        }))
    }

    /// One step; see [`Step`].
    pub fn step(&mut self, now: Instant) -> Step {
        loop {
            match std::mem::replace(&mut self.phase, Phase::Done) {
                Phase::Done => {
                    return Step::Done(Err(Fail {
                        reason: self.decided,
                        connected: false,
                    }))
                }
                Phase::Query(mut q) => {
                    if q.drive(now).is_none() {
                        let step = Step::Wait((q.as_raw_fd(), libc::POLLIN, q.deadline()));
                        self.phase = Phase::Query(q);
                        return step;
                    }
                    let decision = {
                        let _g = table::enter_gate();
                        let d = super::pm().finish(*q);
                        super::pm_cache_changed();
                        d
                    };
                    match decision {
                        Decision::Sdp(a) => self.phase = Phase::Connect(a),
                        Decision::Tcp(f) => {
                            return Step::Done(Err(Fail {
                                reason: tcp_reason(f),
                                connected: false,
                            }))
                        }
                    }
                }
                Phase::Connect(a) => {
                    let Some(a) = for_socket(a, self.v6) else {
                        return Step::Done(Err(Fail {
                            reason: TcpReason::Internal,
                            connected: false,
                        }));
                    };
                    crate::log!(
                        Level::Debug,
                        "fd {}: {}: PMAccept, SDP at {a}",
                        self.fd,
                        self.dest
                    );
                    match connect_raw(self.sock_fd(), a) {
                        Ok(()) => self.phase = Phase::StartSetup,
                        Err(libc::EINPROGRESS | libc::EINTR) => self.phase = Phase::Tcp,
                        Err(libc::ECONNREFUSED) if self.from_cache => {
                            if let Err(reason) = self.ask_again() {
                                return self.failed(reason);
                            }
                        }
                        Err(e) => {
                            let reason = if e == libc::ECONNREFUSED {
                                TcpReason::Refused
                            } else {
                                TcpReason::Internal
                            };
                            return self.failed(reason);
                        }
                    }
                }
                Phase::Tcp => {
                    let mut p = libc::pollfd {
                        fd: self.sock_fd(),
                        events: libc::POLLOUT,
                        revents: 0,
                    };
                    // SAFETY: one local pollfd, no wait.
                    unsafe { real::poll(&mut p, 1, 0) };
                    if p.revents == 0 {
                        self.phase = Phase::Tcp;
                        return Step::Wait((self.sock_fd(), libc::POLLOUT, None));
                    }
                    match so_error(self.sock_fd()) {
                        0 => self.phase = Phase::StartSetup,
                        libc::ETIMEDOUT => return self.failed(TcpReason::Timeout),
                        libc::ECONNREFUSED if self.from_cache => {
                            if let Err(reason) = self.ask_again() {
                                return self.failed(reason);
                            }
                        }
                        _ => return self.failed(TcpReason::Refused),
                    }
                }
                Phase::StartSetup => {
                    // A blocking connect carries the setup on itself.
                    let driver = if self.nonblocking {
                        Driver::Progress
                    } else {
                        Driver::Caller
                    };
                    // The stream takes our duplicate; it moves to the
                    // program's number once set up (`finish`).
                    let stream = self.sock.take().and_then(|d| {
                        let tcp = std::net::TcpStream::from(d);
                        SdpStream::start_connect_by(tcp, &super::sdp_config(), driver).ok()
                    });
                    let Some(stream) = stream else {
                        return self.failed(TcpReason::Internal);
                    };
                    let watch = if self.nonblocking {
                        let Ok(watch) = stream.readiness_shared() else {
                            return self.failed(TcpReason::Internal);
                        };
                        Some(watch)
                    } else {
                        None
                    };
                    self.phase = Phase::Setup {
                        stream,
                        watch,
                        until: now + SETUP_LIMIT,
                    };
                }
                Phase::Setup {
                    stream,
                    watch,
                    until,
                } => {
                    let now = match watch {
                        Some(_) => now,
                        None => {
                            // Blocking: this thread reads the MPA Reply and
                            // the HelloAck itself, no hand-off both ways;
                            // then the progress thread takes the stream on:
                            // set up, once on the program's number
                            // (`finish`), or closing, now.
                            let _ = stream.wait_connected(Some(until));
                            if stream.poll_state().connected {
                                return Step::Done(Ok(stream));
                            }
                            if stream.to_progress().is_err() {
                                return self.failed(TcpReason::Internal);
                            }
                            Instant::now()
                        }
                    };
                    let st = stream.poll_state();
                    if st.connected {
                        return Step::Done(Ok(stream));
                    }
                    if st.writable || now >= until {
                        use sdp_core::conn::CloseReason as Why;
                        use sdp_core::verbs::ErrorKind as Kind;
                        let reason = match stream.close_cause() {
                            _ if !st.writable => TcpReason::Timeout,
                            // An MPA reject: the peer refused the Hello or
                            // the MPA parameters (RFC 6581 §9.1).
                            Some(Why::Transport(Kind::Refused)) => TcpReason::MpaReject,
                            Some(Why::Transport(Kind::TimedOut)) => TcpReason::Timeout,
                            Some(Why::Transport(Kind::Reset) | Why::TornDown) => TcpReason::Refused,
                            // The HelloAck broke a rule.
                            Some(Why::Violation(_)) => TcpReason::HelloReject,
                            _ => TcpReason::Internal,
                        };
                        crate::log!(
                            Level::Debug,
                            "fd {}: SDP setup with {} failed: {}",
                            self.fd,
                            self.dest,
                            stream
                                .close_reason()
                                .unwrap_or_else(|| reason.name().to_string())
                        );
                        drop(stream);
                        return self.failed(reason);
                    }
                    let fd = watch.as_ref().map(|w| w.as_raw_fd());
                    self.phase = Phase::Setup {
                        stream,
                        watch,
                        until,
                    };
                    match fd {
                        Some(fd) => return Step::Wait((fd, libc::POLLOUT, Some(until))),
                        // Neither set up nor failed, and time left: wait on.
                        None => continue,
                    }
                }
            }
        }
    }

    /// Runs to the end on this thread (a blocking connect).
    fn run_blocking(&mut self) -> Result<SdpStream, Fail> {
        loop {
            match self.step(Instant::now()) {
                Step::Done(r) => return r,
                Step::Wait((fd, events, deadline)) => poll_polling(fd, events, deadline),
            }
        }
    }

    /// Puts a fresh kernel socket on the program's fd number: same family,
    /// the options the program set, `FD_CLOEXEC` as it was, `O_NONBLOCK`
    /// as `nonblock`. The old socket (connected to the SDP address, or
    /// reset) closes with our last reference to it.
    fn replace_socket(&self, nonblock: bool) -> Result<(), Errno> {
        let opts = table::get(self.fd).map(|e| e.opts).unwrap_or_default();
        let domain = if self.v6 {
            libc::AF_INET6
        } else {
            libc::AF_INET
        };
        let mut ty = libc::SOCK_STREAM | libc::SOCK_CLOEXEC;
        if nonblock {
            ty |= libc::SOCK_NONBLOCK;
        }
        // SAFETY: plain socket creation.
        let new = unsafe { real::socket(domain, ty, libc::IPPROTO_TCP) };
        if new < 0 {
            return Err(real::errno());
        }
        for o in &opts {
            // SAFETY: the option bytes the kernel accepted before.
            unsafe {
                real::setsockopt(
                    new,
                    o.level,
                    o.name,
                    o.value.as_ptr().cast(),
                    o.value.len() as libc::socklen_t,
                )
            };
        }
        // SAFETY: F_GETFD takes no argument.
        let cloexec = unsafe { real::fcntl(self.fd, libc::F_GETFD, 0) } & libc::FD_CLOEXEC != 0;
        let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
        // SAFETY: our new socket onto the program's fd number (checked to
        // be still the program's socket by the caller).
        let r = unsafe { real::dup3(new, self.fd, flags) };
        let e = real::errno();
        // SAFETY: our temporary number.
        unsafe { real::close(new) };
        if r < 0 {
            return Err(e);
        }
        if let Some(a) = self.app_local {
            if let Err(e) = bind_raw(self.fd, a) {
                crate::log!(
                    Level::Warn,
                    "fd {}: fallback socket cannot bind {a} again: errno {e}",
                    self.fd
                );
            }
        }
        Ok(())
    }

    /// The end of the setup (inside the fork gate; on the service thread
    /// for a nonblocking connect). A blocking connect that falls back
    /// gets [`Setup::Fallback`]: its fd, a fresh socket if need be, waits
    /// for the caller's TCP connect and then `Connector::fall_back`.
    pub fn finish(&mut self, result: Result<SdpStream, Fail>) -> Setup {
        // A blocking connect's stream is not with the progress thread yet.
        let to_progress = |s: &SdpStream| {
            if self.nonblocking {
                Ok(())
            } else {
                s.to_progress()
            }
        };
        let closed = |result: Result<SdpStream, Fail>| {
            if let Ok(s) = result {
                // It closes in the background.
                let _ = to_progress(&s);
            }
            Setup::Failed(libc::ECONNABORTED)
        };
        let Some(ep) = self.ep.clone() else {
            return closed(result);
        };
        let mut st = ep.lock();
        let mut levels = match &mut *st {
            State::Connecting { levels } => levels.take(),
            // Closed by the program meanwhile: nothing to report.
            _ => return closed(result),
        };
        let fd = self.fd;
        let fail = match result {
            Ok(stream) => {
                let adopted = match levels.take() {
                    Some(l) => stream.adopt_readiness(l),
                    None => Ok(()),
                };
                if stream.set_nonblocking(true).is_ok() && adopted.is_ok() {
                    // The stream runs on the program's number from now on
                    // (one descriptor), until the program's close takes it
                    // back ([`SdpEndpoint::leave_fd`]); our duplicate
                    // closes.
                    // SAFETY: the program's number, its connecting socket
                    // still (checked under the endpoint's lock).
                    let _ = stream.move_socket(unsafe { OwnedFd::from_raw_fd(fd) });
                    if !self.nonblocking {
                        // Its program reads with blocking calls, which
                        // wait on the socket: the progress thread need
                        // not wake for what arrives.
                        stream.reads_blocking();
                    }
                    if to_progress(&stream).is_err() {
                        crate::log!(
                            Level::Error,
                            "fd {fd}: the SDP progress thread cannot start"
                        );
                    }
                    stream.set_credit_bound(ep.nonblocking());
                    let _ = stream.set_nodelay(ep.nodelay());
                    let local = stream.local_addr().ok();
                    ep.connect(&mut st, stream);
                    let dyn_ep: Arc<dyn SdpEndpoint> = ep.clone();
                    table::update(fd, |e| {
                        if matches!(&e.sdp, table::SdpSide::Stream(h)
                            if std::ptr::addr_eq(Arc::as_ptr(&h.endpoint), Arc::as_ptr(&dyn_ep)))
                        {
                            e.local = local;
                            e.transport = table::Transport::Sdp;
                        }
                    });
                    if !self.nonblocking {
                        service::ensure();
                        return Setup::Sdp;
                    }
                    crate::log!(
                        Level::Info,
                        "fd {fd}: connect {} (nonblocking) -> SDP",
                        self.dest
                    );
                    return Setup::InProgress;
                }
                let _ = to_progress(&stream);
                drop(stream);
                Fail {
                    reason: TcpReason::Internal,
                    connected: true,
                }
            }
            Err(f) => f,
        };
        // Pollers of the wake fd wake up and look again once the end is
        // in place.
        let failed = |st: &mut State, mut levels: Option<Levels>, errno| {
            if let Some(l) = levels.as_mut() {
                let _ = l.set(true, true);
            }
            *st = State::Failed {
                errno,
                reported: false,
                _levels: levels,
            };
            Setup::Failed(errno)
        };
        let dyn_ep: Arc<dyn SdpEndpoint> = ep.clone();
        if table::stream(fd).is_none_or(|h| !Arc::ptr_eq(&h.endpoint, &dyn_ep)) {
            // The fd number is no longer this connection's: leave it alone.
            return failed(&mut st, levels, libc::ECONNABORTED);
        }
        if fail.connected {
            if let Err(e) = self.replace_socket(self.nonblocking) {
                return failed(&mut st, levels, e);
            }
            // Before the program may see the fallback and close `fd`.
            self.share_with_duplicates();
        }
        if self.sdp_only {
            crate::log!(
                Level::Info,
                "fd {fd}: connect {}: SDP only, and SDP failed ({}): ECONNREFUSED",
                self.dest,
                fail.reason.name()
            );
            return failed(&mut st, levels, libc::ECONNREFUSED);
        }
        if self.nonblocking {
            // The TCP fallback: the same fd number to S:P.
            set_nonblock(fd, true);
            match connect_raw(fd, self.dest) {
                Ok(()) | Err(libc::EINPROGRESS) => {}
                Err(e) => return failed(&mut st, levels, e),
            }
            crate::log!(
                Level::Info,
                "fd {fd}: connect {} (nonblocking) -> TCP ({})",
                self.dest,
                fail.reason.name()
            );
        }
        *st = State::Connecting { levels };
        drop(st);
        if !self.nonblocking {
            return Setup::Fallback(fail.reason);
        }
        self.fall_back(fail.reason);
        Setup::InProgress
    }

    /// Duplicates the program made of the fd meanwhile (dup, F_DUPFD) are
    /// the same socket for it: after [`Connector::replace_socket`] they get
    /// the fresh one too.
    fn share_with_duplicates(&self) {
        let Some(ep) = &self.ep else { return };
        let dyn_ep: Arc<dyn SdpEndpoint> = ep.clone();
        for other in duplicates(self.fd, &dyn_ep) {
            share_socket(self.fd, other);
        }
    }

    /// The fd, and the duplicates the program made of it meanwhile, are
    /// TCP sockets again: calls go to the kernel, pollers look again.
    fn fall_back(&self, reason: TcpReason) {
        let Some(ep) = &self.ep else { return };
        let levels = {
            let mut st = ep.lock();
            match std::mem::replace(&mut *st, State::FellBack) {
                State::Connecting { levels } => levels,
                other => {
                    // Closed by the program meanwhile.
                    *st = other;
                    return;
                }
            }
        };
        let dyn_ep: Arc<dyn SdpEndpoint> = ep.clone();
        for other in duplicates(self.fd, &dyn_ep) {
            table::fall_back_if(other, &dyn_ep, reason);
        }
        table::fall_back_if(self.fd, &dyn_ep, reason);
        if let Some(mut l) = levels {
            let _ = l.set(true, true);
        }
    }
}

/// A nonblocking connect: the service thread carries it on ([`Carried`]),
/// and once the MPA Request is out the program's calls on the fd may end
/// it first ([`Advance`]): the setup's last messages are read in the
/// program's thread, with no hop through the progress and the service
/// threads (a client whose server's blocking `accept` returned finds its
/// connect complete, as over TCP).
struct Pending {
    connector: Mutex<Option<Connector>>,
    /// The setup's readiness descriptor, which the service thread may be
    /// polling: open until its task ends, even after a program's call
    /// ended the setup.
    watch: OnceLock<Arc<OwnedFd>>,
    /// A program's call ended the setup: the task ends at its next look.
    ended: AtomicBool,
}

thread_local! {
    /// This thread steps a connector now: a call the step makes that
    /// reaches the same endpoint does not take it again.
    static STEPPING: Cell<bool> = const { Cell::new(false) };
}

/// A [`Pending`]'s connector, held by the thread stepping it.
struct Turn<'a>(MutexGuard<'a, Option<Connector>>);

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        STEPPING.with(|s| s.set(false));
    }
}

impl Turn<'_> {
    /// Ends the setup with `result`, if no one else did.
    fn finish(&mut self, result: Result<SdpStream, Fail>) {
        if let Some(mut c) = self.0.take() {
            c.finish(result);
        }
    }
}

impl Pending {
    /// The connector, once the other thread's step ended (steps never
    /// block); `None` inside this thread's own step.
    fn turn(&self) -> Option<Turn<'_>> {
        if STEPPING.with(Cell::get) {
            return None;
        }
        let g = self.connector.lock().unwrap_or_else(|p| p.into_inner());
        STEPPING.with(|s| s.set(true));
        Some(Turn(g))
    }
}

impl Advance for Pending {
    fn advance(&self) -> bool {
        // Inside the fork gate before the connector's lock, as the
        // service thread is: a `fork` never finds the lock held.
        let _g = table::enter_gate();
        let Some(mut turn) = self.turn() else {
            return false;
        };
        let Some(c) = turn.0.as_mut() else {
            // The service thread ended it.
            return true;
        };
        // The last phase only: the service thread's wait in the earlier
        // ones is a descriptor a step here could close.
        let Phase::Setup { stream, .. } = &c.phase else {
            return false;
        };
        stream.pump();
        match c.step(Instant::now()) {
            Step::Wait(_) => false,
            Step::Done(r) => {
                turn.finish(r);
                self.ended.store(true, Ordering::Release);
                service::wake();
                true
            }
        }
    }
}

/// The service thread's side of a [`Pending`].
struct Carried(Arc<Pending>);

impl Task for Carried {
    fn advance(
        self: Box<Self>,
        now: Instant,
        _spawned: &mut Vec<Box<dyn Task>>,
    ) -> Option<(Box<dyn Task>, Wait)> {
        let wait = {
            let mut turn = self.0.turn()?;
            let c = turn.0.as_mut()?;
            if c.abandoned() {
                *turn.0 = None;
                return None;
            }
            match c.step(now) {
                Step::Wait(wait) => {
                    if let Phase::Setup { watch: Some(w), .. } = &c.phase {
                        self.0.watch.get_or_init(|| w.clone());
                    }
                    wait
                }
                Step::Done(r) => {
                    turn.finish(r);
                    return None;
                }
            }
        };
        Some((self, wait))
    }

    fn ended(&self) -> bool {
        self.0.ended.load(Ordering::Acquire)
    }

    /// No service thread: the connect fails as after an internal error.
    fn dropped(self: Box<Self>) {
        let _g = table::enter_gate();
        let Some(mut turn) = self.0.turn() else {
            return;
        };
        turn.finish(Err(Fail {
            reason: TcpReason::Internal,
            connected: false,
        }));
    }
}

/// The other fd numbers in the table that hold `ep`'s connection.
fn duplicates(fd: RawFd, ep: &Arc<dyn SdpEndpoint>) -> Vec<RawFd> {
    let mut found = Vec::new();
    table::for_each(|n, e| {
        if n != fd && matches!(&e.sdp, table::SdpSide::Stream(h) if Arc::ptr_eq(&h.endpoint, ep)) {
            found.push(n);
        }
    });
    found
}

/// Makes `other` refer to `fd`'s socket, keeping its own `FD_CLOEXEC`.
fn share_socket(fd: RawFd, other: RawFd) {
    // SAFETY: F_GETFD takes no argument.
    let cloexec = unsafe { real::fcntl(other, libc::F_GETFD, 0) } & libc::FD_CLOEXEC != 0;
    let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: both numbers are the program's, holding this connection
    // (checked against the table by the caller).
    if unsafe { real::dup3(fd, other, flags) } < 0 {
        crate::log!(
            Level::Warn,
            "fd {other}: a duplicate of fd {fd} keeps the old socket: errno {}",
            real::errno()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn addresses_between_the_port_mapper_and_the_socket() {
        // The port mapper speaks IPv4 for a v4-mapped destination.
        assert_eq!(plain(a("[::ffff:127.0.0.1]:80")), a("127.0.0.1:80"));
        assert_eq!(plain(a("[::1]:80")), a("[::1]:80"));
        assert_eq!(plain(a("10.0.0.1:80")), a("10.0.0.1:80"));
        // An SDP address in the socket's family.
        assert_eq!(
            for_socket(a("127.0.0.1:9"), true),
            Some(a("[::ffff:127.0.0.1]:9"))
        );
        assert_eq!(
            for_socket(a("[::ffff:10.0.0.2]:9"), false),
            Some(a("10.0.0.2:9"))
        );
        assert_eq!(for_socket(a("[::1]:9"), false), None);
        assert_eq!(for_socket(a("[::1]:9"), true), Some(a("[::1]:9")));
    }

    #[test]
    fn port_mapper_fallbacks_name_their_reason() {
        assert_eq!(tcp_reason(Fallback::Denied), TcpReason::PmDeny);
        assert_eq!(tcp_reason(Fallback::NoAnswer), TcpReason::PmTimeout);
        assert_eq!(tcp_reason(Fallback::Unreachable), TcpReason::PmUnreachable);
    }
}
