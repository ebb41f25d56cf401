//! The hidden SDP listener beside a listening socket (DESIGN §5): a kernel
//! TCP listener on an ephemeral port Q of the same address, registered
//! P→Q with the local `sdp-portmapper` over its control socket.
//!
//! A connection is taken from Q by the program's `accept`, as a TCP
//! connection is taken from the kernel's queue: `accept` takes the next
//! one and, when its MPA Request (with the Hello) is already there — the
//! client sends it right after its TCP connect — answers it at once. The
//! service thread ([`super::service`]) then waits for the RTR and sends
//! the HelloAck, and the connection is handed out once set up: one the
//! program closed at once would otherwise cut the client's setup short,
//! where TCP's connect is complete. A connection whose Request has not
//! come yet goes on in the service thread the same way. A nonblocking
//! `accept` never waits for a handshake; a blocking one sleeps until a
//! connection is set up. The listener is readable while a connection is
//! set up here or waits in Q (`Shared::q_pending`); an epoll set polls Q
//! too.
//!
//! A blocking `accept`, `poll`, `select` and epoll sets wait on Q (beside
//! the program's listening socket and the readiness of the connections set
//! up here), so no connection is taken for them before an `accept`.
//! Only the process that called `listen`, until it forks, has the service
//! thread take connections ahead, up to `MAX_QUEUED`: a program may
//! connect to its own listener before it accepts, as with TCP, and its
//! connect needs the server's half of the setup done without an `accept`.
//! A connection set up here can be accepted only here, and one left when
//! the process exits is reset, where a TCP connection would wait in the
//! kernel's queue for the next process: so a prefork master that merely
//! holds the listening socket takes nothing, and a worker that exits,
//! whatever it waits with, leaves the connections it did not accept in Q
//! for the others.
//!
//! The registration lasts as long as the control connection that made it,
//! which every process holding the listener keeps open (it is inherited by
//! `fork`): the port mapper forgets P→Q when the last of them closes the
//! listener or exits. When the daemon goes away (stopped, restarted,
//! crashed) the registration goes with it; the process that called
//! `listen` watches its control connection from its service thread and
//! registers again once a daemon answers ([`Shared::registration_step`],
//! first after 0.5 s, then backing off to 10 s), so that new SDP clients
//! find the listener again — and the same when no port mapper answered at
//! `listen`. Meanwhile SDP clients use TCP, and the hidden listener costs
//! nothing but a socket.

use super::endpoint::Ep;
use super::service::{self, Task, Wait};
use crate::log::Level;
use crate::sdp::{Accepted, Errno, LevelWatch, Readiness, SdpListener, WakeFd};
use crate::table;
use portmapper::control::ControlClient;
use sdp_core::stream::accept::{self, Answer};
use sdp_core::stream::readiness::Readiness as Levels;
use sdp_core::stream::{Driver, Endpoint, SdpStream};
use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Connections being set up or ready, at most, per listener and process.
const MAX_QUEUED: usize = 64;

/// How long a connection's setup may take (the MPA startup timer, 5 s,
/// normally decides first).
const SETUP_LIMIT: Duration = Duration::from_secs(10);

struct Ready {
    stream: SdpStream,
    peer: SocketAddr,
}

struct Queue {
    ready: VecDeque<Ready>,
    /// Connections being set up.
    setting_up: usize,
    /// POLLIN while `ready` holds a connection.
    levels: Levels,
    /// Our duplicate of the levels' descriptor, handed out as the wake fd.
    wake: Arc<OwnedFd>,
    closed: bool,
}

/// What the listener's users and the service thread share.
pub struct Shared {
    /// Q.
    q: TcpListener,
    /// P: the program's listening address.
    p: SocketAddr,
    queue: Mutex<Queue>,
    /// This process called `listen` and has not forked since.
    listening: AtomicBool,
    /// A task of this process's service thread takes from Q.
    task: AtomicBool,
    control: Mutex<Option<ControlClient>>,
    /// When to try to register again, and the wait after that.
    retry: Mutex<(Instant, Duration)>,
}

/// The first wait before a registration is tried again, and the longest.
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(10);

/// See the module documentation.
pub struct Lst {
    sh: Arc<Shared>,
}

/// Q: a nonblocking listening socket on an ephemeral port of `local`'s
/// address, `IPV6_V6ONLY` as P's (a v6-only P must not get IPv4 clients
/// over SDP), with the program's backlog.
fn bind_q(p: RawFd, local: SocketAddr, backlog: i32) -> io::Result<TcpListener> {
    let v6 = local.is_ipv6();
    let domain = if v6 { libc::AF_INET6 } else { libc::AF_INET };
    // SAFETY: plain socket creation.
    let s = unsafe {
        crate::sys::real::socket(
            domain,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            libc::IPPROTO_TCP,
        )
    };
    if s < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor of ours.
    let q = unsafe { OwnedFd::from_raw_fd(s) };
    if v6 {
        let only =
            crate::sys::addr::int_sockopt(p, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY).unwrap_or(0);
        // SAFETY: an int option on our own socket.
        unsafe {
            crate::sys::real::setsockopt(
                s,
                libc::IPPROTO_IPV6,
                libc::IPV6_V6ONLY,
                (&only as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    }
    // A connection joins Q's queue once its first bytes came (the MPA
    // Request, which the client sends with its TCP connect): Q polls
    // readable only when an `accept` can answer the connection at once,
    // so that a program's nonblocking `accept` after an epoll or poll
    // event finds it, as over TCP. A client that sends nothing waits at
    // most SETUP_LIMIT before the kernel queues it anyway.
    let defer = SETUP_LIMIT.as_secs() as libc::c_int;
    // SAFETY: an int option on our own socket.
    unsafe {
        crate::sys::real::setsockopt(
            s,
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&defer as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    let raw = crate::sys::addr::RawAddr::new(SocketAddr::new(local.ip(), 0));
    // SAFETY: a complete address; listen on our own socket.
    unsafe {
        if crate::sys::real::bind(s, raw.as_ptr(), raw.len()) != 0
            || crate::sys::real::listen(s, if backlog > 0 { backlog } else { 128 }) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(TcpListener::from(q))
}

/// Opens the hidden listener for `local` (P) and registers it.
pub fn open(fd: RawFd, local: SocketAddr, backlog: i32) -> io::Result<Lst> {
    let q = bind_q(fd, local, backlog)?;
    let q_port = q.local_addr()?.port();
    let levels = Levels::new()?;
    let wake = levels.user_shared();
    let control = match ControlClient::connect_default()
        .and_then(|mut c| c.register(local.ip(), local.port(), q_port).map(|()| c))
    {
        Ok(c) => {
            crate::log!(
                Level::Info,
                "fd {fd}: listen {local}: SDP on port {q_port}, registered with the port mapper"
            );
            Some(c)
        }
        Err(e) => {
            crate::log!(
                Level::Info,
                "fd {fd}: listen {local}: SDP on port {q_port}, not registered ({e}): \
                 SDP clients will use TCP"
            );
            None
        }
    };
    let lst = Lst {
        sh: Arc::new(Shared {
            q,
            p: local,
            queue: Mutex::new(Queue {
                ready: VecDeque::new(),
                setting_up: 0,
                levels,
                wake,
                closed: false,
            }),
            listening: AtomicBool::new(true),
            task: AtomicBool::new(false),
            control: Mutex::new(control),
            retry: Mutex::new((Instant::now() + RETRY_FIRST, RETRY_FIRST)),
        }),
    };
    // The listening process takes connections from the start (inside the
    // fork gate, as every use of the queue's lock: a fork never finds it
    // held).
    {
        let _g = table::enter_gate();
        lst.sh.kick();
    }
    service::submit(Box::new(Registration(lst.sh.clone())));
    Ok(lst)
}

/// The service thread's task taking connections from Q
/// ([`Shared::listen_step`]).
struct Listen(Arc<Shared>);

impl Task for Listen {
    fn advance(
        self: Box<Self>,
        now: Instant,
        spawned: &mut Vec<Box<dyn Task>>,
    ) -> Option<(Box<dyn Task>, Wait)> {
        if !self.0.listen_step(now, spawned) {
            return None;
        }
        let fd = self.0.q_fd();
        Some((self, (fd, libc::POLLIN, None)))
    }
}

/// The service thread's task keeping the hidden listener registered with
/// the port mapper ([`Shared::registration_step`]).
struct Registration(Arc<Shared>);

impl Task for Registration {
    fn advance(
        self: Box<Self>,
        now: Instant,
        _spawned: &mut Vec<Box<dyn Task>>,
    ) -> Option<(Box<dyn Task>, Wait)> {
        let wait = self.0.registration_step(now)?;
        Some((self, wait))
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Q's descriptor, for the service thread.
    pub fn q_fd(&self) -> RawFd {
        self.q.as_raw_fd()
    }

    /// The listener was closed in this process.
    pub fn is_closed(&self) -> bool {
        self.lock().closed
    }

    /// The service thread's watch on the registration (see the module
    /// documentation): what to wait for next — the control connection's
    /// end, or the time of the next try — or `None` once the listener is
    /// closed.
    pub fn registration_step(&self, now: Instant) -> Option<(RawFd, i16, Option<Instant>)> {
        if self.is_closed() {
            return None;
        }
        let mut control = self.control.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = control.as_ref() {
            if !c.closed_by_daemon() {
                return Some((c.raw_fd(), libc::POLLIN, None));
            }
            crate::log!(
                Level::Info,
                "listen {}: the port mapper went away with the registration; \
                 registering again once one answers",
                self.p
            );
            *control = None;
            *self.retry.lock().unwrap_or_else(|p| p.into_inner()) =
                (now + RETRY_FIRST, RETRY_FIRST);
        }
        let mut retry = self.retry.lock().unwrap_or_else(|p| p.into_inner());
        if now < retry.0 {
            return Some((-1, 0, Some(retry.0)));
        }
        let q_port = self.q.local_addr().ok()?.port();
        match ControlClient::connect_default()
            .and_then(|mut c| c.register(self.p.ip(), self.p.port(), q_port).map(|()| c))
        {
            Ok(c) => {
                crate::log!(
                    Level::Info,
                    "listen {}: SDP on port {q_port}, registered with the port mapper",
                    self.p
                );
                let fd = c.raw_fd();
                *control = Some(c);
                *retry = (now, RETRY_FIRST);
                Some((fd, libc::POLLIN, None))
            }
            Err(_) => {
                *retry = (now + retry.1, (retry.1 * 2).min(RETRY_MAX));
                Some((-1, 0, Some(retry.0)))
            }
        }
    }

    /// This process sets up connections before anything waits for them.
    fn takes_ahead(&self) -> bool {
        self.listening.load(Ordering::Acquire)
    }

    /// Whether Q holds a connection no process took yet.
    fn q_pending(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.q.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one local pollfd, no wait.
        unsafe { crate::sys::real::poll(&mut p, 1, 0) > 0 }
    }

    /// How many connections the service thread may hold set up or in
    /// setup for this process ahead of any `accept`.
    fn limit(&self) -> usize {
        if self.takes_ahead() {
            MAX_QUEUED
        } else {
            0
        }
    }

    /// Whether this process takes another connection from Q now.
    fn wanted(&self) -> bool {
        let limit = self.limit();
        let q = self.lock();
        !q.closed && q.ready.len() + q.setting_up < limit
    }

    /// Starts the service thread's task on Q if a connection is wanted and
    /// none runs.
    fn kick(self: &Arc<Self>) {
        if self.wanted() && !self.task.swap(true, Ordering::AcqRel) {
            service::submit(Box::new(Listen(self.clone())));
        }
    }

    /// The service thread's task on Q (inside the fork gate): takes the
    /// connections wanted and starts their setup; false when it ends
    /// (nothing wanted: a later want starts another).
    pub fn listen_step(self: &Arc<Self>, now: Instant, out: &mut Vec<Box<dyn Task>>) -> bool {
        self.take_connections(now, out);
        if self.wanted() {
            return true;
        }
        self.task.store(false, Ordering::Release);
        // A want that came meanwhile found the task still running.
        self.kick();
        false
    }

    /// Takes the connections waiting on Q, as many as wanted.
    fn take_connections(self: &Arc<Self>, now: Instant, out: &mut Vec<Box<dyn Task>>) {
        while self.wanted() {
            let Some((tcp, peer)) = self.take_q(true) else {
                return;
            };
            match Handshake::new(self.clone(), tcp, peer, now) {
                Ok(h) => out.push(Box::new(h)),
                Err(e) => {
                    self.setup_failed();
                    crate::log!(Level::Debug, "SDP setup with {peer}: {e}");
                }
            }
        }
    }

    /// Takes the next connection from Q, counted as in setup from before
    /// the kernel's `accept` on: a `poll` in another thread finds the
    /// listener readable (Q) or a setup under way, never neither (then a
    /// nonblocking `accept` waits for the setup, see `SdpListener`).
    /// Taken `ahead` of an `accept`, its descriptor goes high, out of the
    /// way of the numbers the program opens meanwhile; an `accept`'s keeps
    /// the number a TCP accept would give, which the program gets.
    fn take_q(&self, ahead: bool) -> Option<(std::net::TcpStream, SocketAddr)> {
        self.lock().setting_up += 1;
        loop {
            match self.q.accept() {
                Ok((c, a)) if ahead => {
                    let c = std::net::TcpStream::from(sdp_core::fds::high(OwnedFd::from(c)));
                    return Some((c, a));
                }
                Ok((c, a)) => return Some((c, a)),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    // ECONNABORTED, EMFILE...: tried again on the next event.
                    if e.kind() != io::ErrorKind::WouldBlock {
                        crate::log!(Level::Debug, "hidden listener {}: accept: {e}", self.p);
                    }
                    self.setup_failed();
                    return None;
                }
            }
        }
    }

    fn setup_failed(&self) {
        let mut q = self.lock();
        q.setting_up = q.setting_up.saturating_sub(1);
    }

    /// An `accept` takes the next connection from Q itself: answered at
    /// once when its MPA Request is there, else left to the service thread
    /// (it is handed out once set up); `None` when Q is empty.
    fn take_now(self: &Arc<Self>, now: Instant) -> Option<()> {
        loop {
            let (tcp, peer) = self.take_q(false)?;
            let mut h = match Handshake::new(self.clone(), tcp, peer, now) {
                Ok(h) => h,
                Err(e) => {
                    self.setup_failed();
                    crate::log!(Level::Debug, "SDP setup with {peer}: {e}");
                    continue;
                }
            };
            match h.request_now(now) {
                // The program gets the connection once its setup is over
                // (the service thread waits for the RTR and sends the
                // HelloAck): one it closed at once would cut the client's
                // setup short, where TCP's connect is complete.
                Some(Ok(stream)) => match Handshake::answered(self.clone(), stream, peer, now) {
                    Ok(h) => {
                        service::submit(Box::new(h));
                        return Some(());
                    }
                    Err(e) => {
                        self.setup_failed();
                        crate::log!(Level::Debug, "SDP setup with {peer}: {e}");
                    }
                },
                Some(Err(())) => self.setup_failed(),
                None => {
                    service::submit(Box::new(h));
                    return Some(());
                }
            }
        }
    }

    fn done(self: &Arc<Self>, ready: Option<Ready>) {
        let mut q = self.lock();
        q.setting_up = q.setting_up.saturating_sub(1);
        match ready {
            Some(r) if q.closed => {
                // Nobody will accept it: close it (graceful, background).
                drop(q);
                drop(r);
            }
            Some(r) => {
                q.ready.push_back(r);
                let _ = q.levels.set(true, false);
            }
            None => {
                // Failed: the call that wanted it wants another.
                drop(q);
                self.kick();
            }
        }
    }
}

/// What the MPA Request phase of a handshake came to.
enum Request {
    /// Answered: the stream, waiting for the RTR.
    Answered(SdpStream),
    /// Not there yet: wait for `fd` until `deadline`.
    Wait(Box<Endpoint>, sdp_core::conn::Config, RawFd, Instant),
    Failed(String),
}

/// Reads the MPA Request and its Hello from `ep` if they came, and answers
/// them (the Reply with the HelloAck's parameters, or a reject): sdp-core's
/// step ([`accept::answer_request`]), within the setup's limit `until`.
fn answer_request(
    ep: Box<Endpoint>,
    config: sdp_core::conn::Config,
    now: Instant,
    until: Instant,
) -> Request {
    if now >= until {
        return Request::Failed("setup timed out".into());
    }
    match accept::answer_request(ep, &config, now, Driver::Progress) {
        Answer::Answered(s) => Request::Answered(s),
        Answer::Pending(ep) => {
            let deadline = ep.poll_timeout().map_or(until, |t| t.min(until));
            let fd = ep.raw_fd();
            Request::Wait(ep, config, fd, deadline)
        }
        Answer::Failed(e) => Request::Failed(e.to_string()),
    }
}

/// The Accepting Peer's setup of one connection (DESIGN §4).
pub struct Handshake {
    lst: Arc<Shared>,
    peer: SocketAddr,
    until: Instant,
    phase: HsPhase,
}

enum HsPhase {
    /// Waiting for the MPA Request and its Hello.
    Request(Box<Endpoint>, sdp_core::conn::Config),
    /// Accepted; waiting for the RTR, then the HelloAck goes (the progress
    /// thread carries it). The stream turns writable once set up (or
    /// failed), and `watch` wakes the service thread then.
    Setup {
        stream: SdpStream,
        watch: Arc<dyn LevelWatch>,
    },
    Done,
}

impl Handshake {
    fn new(
        lst: Arc<Shared>,
        tcp: std::net::TcpStream,
        peer: SocketAddr,
        now: Instant,
    ) -> io::Result<Handshake> {
        let (ep, config) = accept::responder(tcp, &super::sdp_config(), now)?;
        Ok(Handshake {
            lst,
            peer,
            until: now + SETUP_LIMIT,
            phase: HsPhase::Request(ep, config),
        })
    }

    /// A handshake whose MPA Request an `accept` answered, left to wait
    /// for the RTR in the service thread.
    fn answered(
        lst: Arc<Shared>,
        stream: SdpStream,
        peer: SocketAddr,
        now: Instant,
    ) -> io::Result<Handshake> {
        let watch = setup_watch(&stream);
        Ok(Handshake {
            lst,
            peer,
            until: now + SETUP_LIMIT,
            phase: HsPhase::Setup { stream, watch },
        })
    }

    /// The listener was closed: stop.
    pub fn abandoned(&self) -> bool {
        self.lst.is_closed()
    }

    /// One step (service thread, inside the fork gate): what to wait for
    /// next, or `None` once it ended.
    pub fn step(&mut self, now: Instant) -> Option<Wait> {
        loop {
            match std::mem::replace(&mut self.phase, HsPhase::Done) {
                HsPhase::Done => {
                    self.lst.done(None);
                    return None;
                }
                HsPhase::Request(ep, config) => {
                    let stream = match answer_request(ep, config, now, self.until) {
                        Request::Answered(stream) => stream,
                        Request::Wait(ep, config, fd, deadline) => {
                            self.phase = HsPhase::Request(ep, config);
                            return Some((fd, libc::POLLIN, Some(deadline)));
                        }
                        Request::Failed(why) => return self.fail(&why),
                    };
                    let watch = setup_watch(&stream);
                    self.phase = HsPhase::Setup { stream, watch };
                }
                HsPhase::Setup { stream, watch } => {
                    let st = stream.poll_state();
                    if st.connected || st.writable || now >= self.until {
                        stream.unwatch_levels(&watch);
                    }
                    if st.connected {
                        let peer = self.peer;
                        self.lst.done(Some(Ready { stream, peer }));
                        return None;
                    }
                    if st.writable || now >= self.until {
                        let why = stream
                            .close_reason()
                            .unwrap_or_else(|| "setup timed out".into());
                        drop(stream);
                        return self.fail(&why);
                    }
                    self.phase = HsPhase::Setup { stream, watch };
                    return Some((-1, 0, Some(self.until)));
                }
            }
        }
    }

    fn fail(&mut self, why: &str) -> Option<Wait> {
        crate::log!(
            Level::Debug,
            "listener {}: SDP setup with {} failed: {why}",
            self.lst.p,
            self.peer
        );
        self.lst.done(None);
        None
    }

    /// For an `accept` that took the connection itself: its MPA Request
    /// answered now (`Some(Ok)`: the stream, its RTR and HelloAck to come;
    /// the handshake is then spent), failed (`Some(Err)`, logged), or not
    /// there yet (`None`: the service thread goes on with it).
    fn request_now(&mut self, now: Instant) -> Option<Result<SdpStream, ()>> {
        let HsPhase::Request(ep, config) = std::mem::replace(&mut self.phase, HsPhase::Done) else {
            return Some(Err(()));
        };
        match answer_request(ep, config, now, self.until) {
            Request::Answered(stream) => Some(Ok(stream)),
            Request::Wait(ep, config, ..) => {
                self.phase = HsPhase::Request(ep, config);
                None
            }
            Request::Failed(why) => {
                crate::log!(
                    Level::Debug,
                    "listener {}: SDP setup with {} failed: {why}",
                    self.lst.p,
                    self.peer
                );
                Some(Err(()))
            }
        }
    }

    /// A child of `fork` inherited this handshake: the parent finishes it.
    pub fn forget(self) {
        if let HsPhase::Setup { stream, .. } = self.phase {
            stream.detach();
        }
    }
}

/// Wakes the service thread when the stream turns writable: set up, or
/// failed (a setup needs no readiness descriptor).
struct SetupWatch;

impl LevelWatch for SetupWatch {
    fn levels(&self, _readable: bool, writable: bool) {
        if writable {
            service::wake();
        }
    }
}

fn setup_watch(stream: &SdpStream) -> Arc<dyn LevelWatch> {
    let w: Arc<dyn LevelWatch> = Arc::new(SetupWatch);
    stream.watch_levels(w.clone());
    w
}

/// The stream's socket under the number a TCP accept would give, without
/// close-on-exec (accept4's flags decide): one descriptor for the program
/// and the stream, lent to the program until its `close` takes the
/// number back ([`crate::sdp::SdpEndpoint::leave_fd`]). A socket taken ahead (high)
/// moves down.
fn program_number(stream: &SdpStream) -> io::Result<RawFd> {
    use crate::sys::real;
    let fd = stream.socket_fd();
    // SAFETY: a descriptor of the stream, borrowed for the call.
    if !sdp_core::fds::is_high(unsafe { BorrowedFd::borrow_raw(fd) }) {
        // SAFETY: F_SETFD takes an int.
        if unsafe { real::fcntl(fd, libc::F_SETFD, 0) } < 0 {
            return Err(io::Error::last_os_error());
        }
        return Ok(fd);
    }
    // SAFETY: F_DUPFD (no close-on-exec).
    let low = unsafe { real::fcntl(fd, libc::F_DUPFD, 3) };
    if low < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor of ours, which the stream takes; the high
    // one it gives back closes.
    drop(stream.move_socket(unsafe { OwnedFd::from_raw_fd(low) })?);
    Ok(low)
}

/// The setup of one connection, carried on by the service thread.
impl Task for Handshake {
    fn advance(
        mut self: Box<Self>,
        now: Instant,
        _spawned: &mut Vec<Box<dyn Task>>,
    ) -> Option<(Box<dyn Task>, Wait)> {
        if self.abandoned() {
            return None;
        }
        let wait = self.step(now)?;
        Some((self, wait))
    }
}

impl SdpListener for Lst {
    fn readiness(&self) -> Readiness {
        let _g = table::enter_gate();
        Readiness {
            readable: !self.sh.lock().ready.is_empty() || self.sh.q_pending(),
            ..Readiness::default()
        }
    }

    fn readiness_beside_queue(&self) -> Readiness {
        let _g = table::enter_gate();
        Readiness {
            readable: !self.sh.lock().ready.is_empty(),
            ..Readiness::default()
        }
    }

    fn wake_fd(&self) -> WakeFd {
        let _g = table::enter_gate();
        self.sh.lock().wake.as_raw_fd()
    }

    fn queue_fd(&self) -> Option<RawFd> {
        Some(self.sh.q.as_raw_fd())
    }

    fn setting_up(&self) -> bool {
        let _g = table::enter_gate();
        self.sh.lock().setting_up > 0
    }

    fn accept(&self, _nonblocking: bool) -> Result<Accepted, Errno> {
        let _g = table::enter_gate();
        loop {
            let r = {
                let mut q = self.sh.lock();
                let r = q.ready.pop_front();
                if q.ready.is_empty() {
                    let _ = q.levels.set(false, false);
                }
                r
            };
            let (stream, peer) = match r {
                Some(Ready { stream, peer }) => {
                    // Room for the next one, for a listener that takes
                    // them ahead (not for a waiting call: it has this one).
                    if self.sh.takes_ahead() {
                        self.sh.kick();
                    }
                    (stream, peer)
                }
                // The next connection in Q, taken by this call.
                None => match self.sh.take_now(Instant::now()) {
                    // Its setup goes on in the service thread.
                    Some(()) => continue,
                    None => {
                        self.sh.kick();
                        return Err(libc::EAGAIN);
                    }
                },
            };
            // A connection that ended while it waited is still handed out,
            // as TCP does (the program's first read tells).
            let fd = match program_number(&stream) {
                Ok(fd) => fd,
                Err(e) => return Err(e.raw_os_error().unwrap_or(libc::EMFILE)),
            };
            match Ep::connected(stream, fd) {
                Ok(ep) => {
                    crate::log!(
                        Level::Debug,
                        "fd {fd}: accepted SDP connection from {peer} on {}",
                        self.sh.p
                    );
                    return Ok(Accepted {
                        fd,
                        peer,
                        endpoint: Arc::new(ep),
                    });
                }
                Err(e) => {
                    crate::log!(Level::Error, "SDP endpoint for {peer}: {e}");
                    continue;
                }
            }
        }
    }

    fn close(&self) {
        let (ready, control) = {
            let _g = table::enter_gate();
            let mut q = self.sh.lock();
            q.closed = true;
            let ready: Vec<Ready> = q.ready.drain(..).collect();
            drop(q);
            let control = self
                .sh
                .control
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            (ready, control)
        };
        // Connections nobody accepted: closed (graceful, in the background).
        drop(ready);
        if let (Some(mut c), true) = (control, self.sh.listening.load(Ordering::Acquire)) {
            // No child shares the registration: it ends before close
            // returns, as the program's TCP listener did. Left to the
            // control connection's end, the daemon might see it only after
            // the program listened on the port again (CPython's tests do),
            // and answer clients with this dead listener's SDP port.
            if let Err(e) = c.unregister(self.sh.p.ip(), self.sh.p.port()) {
                crate::log!(
                    Level::Debug,
                    "listen {}: unregistering from the port mapper: {e}",
                    self.sh.p
                );
            }
        }
        // (Otherwise our copy of the control connection went: the
        // registration ends when the last process holding it closes it.)
        if self.sh.listening.load(Ordering::Acquire) {
            // No child shares Q (no fork since `listen`): it stops
            // listening now, as the program's TCP listener just did, and
            // resets the connections in its queue — a client that the
            // port mapper's cached answer sends here is refused at once
            // (and goes on by TCP) instead of waiting for an MPA Reply
            // that would never come. Q itself goes with the last task
            // holding it (the service thread wakes on the hang-up).
            // SAFETY: shutdown on our own socket.
            unsafe { crate::sys::real::shutdown(self.sh.q.as_raw_fd(), libc::SHUT_RD) };
        }
    }

    fn fork_child(&self) {
        // The connections set up in the parent are the parent's.
        let ready: Vec<Ready> = self.sh.lock().ready.drain(..).collect();
        for r in ready {
            r.stream.detach();
        }
        {
            let mut q = self.sh.lock();
            q.setting_up = 0;
            // The levels are a socket pair shared with the parent: this
            // process gets its own.
            if let Ok(levels) = Levels::new() {
                q.wake = levels.user_shared();
                q.levels = levels;
            }
        }
        // This process takes connections once it waits for them; its
        // service thread is a new one, without the parent's task.
        self.sh.listening.store(false, Ordering::Release);
        self.sh.task.store(false, Ordering::Release);
    }

    fn exiting(&self) {
        self.sh.listening.store(false, Ordering::Release);
        let ready: Vec<Ready> = {
            let _g = table::enter_gate();
            self.sh.lock().ready.drain(..).collect()
        };
        drop(ready);
    }

    fn fork_parent(&self) {
        // The parent too takes connections only once it waits for them or
        // accepts (a prefork master must not take its workers'
        // connections).
        self.sh.listening.store(false, Ordering::Release);
    }
}
