//! The hidden SDP listener beside a listening socket (DESIGN §5): a kernel
//! TCP listener on an ephemeral port Q of the same address, registered
//! P→Q with the local `sdp-portmapper` over its control socket.
//!
//! A connection is taken from Q by the program's `accept`, as a TCP
//! connection is taken from the kernel's queue: `accept` takes the next
//! one, answers its MPA Request (with the Hello; the client sends it right
//! after its TCP connect, and Q queues a connection only once it came)
//! and returns it at once — a blocking `accept`, which has nothing else
//! to do, once it took the RTR and sent the HelloAck itself, or after
//! `RTR_WAIT` without them. The RTR and the HelloAck follow in whichever
//! thread drives the connection next — the program's own read, write or
//! wait on it, or the progress thread — so a setup costs no hand-off
//! between threads. Until the HelloAck went the connection reads and
//! writes nothing (EAGAIN, or a blocking call waits), and a `close` or
//! `shutdown` meanwhile lets the setup finish before its DisConn: the
//! client's connect succeeds, as TCP's did before the `accept`. A
//! connection whose Request has not come yet goes on in the service
//! thread ([`super::service`]) and is handed out once answered. A
//! nonblocking `accept` never waits for a handshake; a blocking one
//! sleeps until a connection is answered. The listener is readable while
//! an answered connection waits here or one waits in Q
//! (`Shared::q_pending`); an epoll set polls Q too.
//!
//! A blocking `accept`, `poll`, `select` and epoll sets wait on Q (beside
//! the program's listening socket and the readiness of the connections set
//! up here), so no connection is taken for them before an `accept`.
//! Only the process that called `listen`, until it forks, has the service
//! thread take connections ahead, up to `MAX_QUEUED`, of those that
//! waited in Q for `TAKE_AHEAD_AFTER` without an `accept`: a program may
//! connect to its own listener before it accepts, as with TCP, and its
//! connect needs the server's half of the setup done without an `accept`;
//! and a client's connect returns while a slow server has not accepted
//! yet, as TCP's does. A program that called `accept` in the last
//! `ATTENTIVE` is busy, not absent: the service thread leaves it its
//! connections, which it takes in its own thread with no hand-off (under
//! a burst of clients an event loop's round is longer than
//! `TAKE_AHEAD_AFTER`).
//! Connections are answered, and handed out, in Q's order: whoever takes
//! from Q holds `Shared::taking` until the connection it took is answered
//! and queued or returned.
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
use crate::sdp::{Accepted, Errno, Readiness, SdpListener, WakeFd};
use crate::table;
use portmapper::control::ControlClient;
use sdp_core::stream::accept::{self, Answer};
use sdp_core::stream::readiness::Readiness as Levels;
use sdp_core::stream::{Driver, Endpoint, SdpStream};
use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Connections being answered or answered, at most, per listener and
/// process.
const MAX_QUEUED: usize = 64;

/// How long a connection waits in Q for an `accept` before the service
/// thread takes it ahead: an attentive program takes it itself, in its own
/// thread, with no hand-off.
const TAKE_AHEAD_AFTER: Duration = Duration::from_millis(2);

/// How recent a program's `accept` makes it attentive (see the module
/// documentation).
const ATTENTIVE: Duration = Duration::from_millis(50);

/// How long a blocking `accept` waits for the RTR of the connection it
/// returns (it returns it either way).
const RTR_WAIT: Duration = Duration::from_millis(50);

/// How long a connection's MPA Request may take to come (the MPA startup
/// timer, 5 s, normally decides first).
const SETUP_LIMIT: Duration = Duration::from_secs(10);

struct Ready {
    stream: SdpStream,
    peer: SocketAddr,
}

struct Queue {
    /// Answered connections, in Q's order.
    ready: VecDeque<Ready>,
    /// Connections taken from Q and not answered yet.
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
    /// Held from taking a connection from Q until it is answered and in
    /// `queue.ready` or returned by `accept` (see the module
    /// documentation); taken before `queue`.
    taking: Mutex<()>,
    /// This process called `listen` and has not forked since.
    listening: AtomicBool,
    /// A task of this process's service thread takes from Q.
    task: AtomicBool,
    /// When the program last called `accept`, in nanoseconds after
    /// `created` (0: never).
    accepted_at: AtomicU64,
    created: Instant,
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
    // The options the program gave P that a TCP connection accepted from
    // P would have ([`passed_on`]: Linux copies them from the listener);
    // the SDP connections taken from Q size their buffers by them too
    // (`Config::with_socket_buffers`). Set on P later, they follow (the
    // `setsockopt` hook).
    let opts = table::get(p).map(|e| e.opts).unwrap_or_default();
    for o in opts.iter().filter(|o| passed_on(o.level, o.name)) {
        // SAFETY: the option value the kernel took on P, on our own socket.
        unsafe {
            crate::sys::real::setsockopt(
                s,
                o.level,
                o.name,
                o.value.as_ptr().cast(),
                o.value.len() as libc::socklen_t,
            )
        };
    }
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

/// A listener's option that the connections it accepts start with, which
/// the hidden listener takes from the program's: the buffer sizes, the
/// timeouts, `SO_LINGER` and keepalive (Linux copies the listener's socket
/// into each connection; an SDP stream reads these from its kernel socket).
pub fn passed_on(level: i32, name: i32) -> bool {
    match level {
        libc::SOL_SOCKET => {
            [
                libc::SO_RCVBUF,
                libc::SO_SNDBUF,
                libc::SO_LINGER,
                libc::SO_KEEPALIVE,
            ]
            .contains(&name)
                || table::TIMEOUT_OPTS.contains(&name)
        }
        libc::IPPROTO_TCP => {
            [libc::TCP_KEEPIDLE, libc::TCP_KEEPINTVL, libc::TCP_KEEPCNT].contains(&name)
        }
        _ => false,
    }
}

/// Opens the hidden listener for `local` (P) and registers it.
pub fn open(fd: RawFd, local: SocketAddr, backlog: i32) -> io::Result<Lst> {
    let q = bind_q(fd, local, backlog)?;
    let q_port = q.local_addr()?.port();
    let levels = Levels::new()?;
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
        sh: Arc::new(Shared::new(q, local, levels, control)),
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
/// ([`Shared::listen_step`]) that waited there `TAKE_AHEAD_AFTER`.
struct Listen {
    sh: Arc<Shared>,
    /// Q had a connection: when to take what is still there.
    due: Option<Instant>,
}

impl Task for Listen {
    fn advance(
        mut self: Box<Self>,
        now: Instant,
        spawned: &mut Vec<Box<dyn Task>>,
    ) -> Option<(Box<dyn Task>, Wait)> {
        match self.due {
            // Woken for another task's sake.
            Some(due) if now < due => return Some((self, (-1, 0, Some(due)))),
            Some(_) => {
                // An attentive program takes what waits itself; look
                // again once it was not seen for `ATTENTIVE`.
                if let Some(until) = self.sh.attentive_until(now) {
                    let due = until.max(now + TAKE_AHEAD_AFTER);
                    self.due = Some(due);
                    return Some((self, (-1, 0, Some(due))));
                }
                self.due = None;
                if !self.sh.listen_step(now, spawned) {
                    return None;
                }
            }
            None => {}
        }
        if self.sh.q_pending() {
            let due = now + TAKE_AHEAD_AFTER;
            self.due = Some(due);
            return Some((self, (-1, 0, Some(due))));
        }
        let fd = self.sh.q_fd();
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
    /// The state of a listener that has just called `listen`.
    fn new(
        q: TcpListener,
        p: SocketAddr,
        levels: Levels,
        control: Option<ControlClient>,
    ) -> Shared {
        let wake = levels.user_shared();
        Shared {
            q,
            p,
            queue: Mutex::new(Queue {
                ready: VecDeque::new(),
                setting_up: 0,
                levels,
                wake,
                closed: false,
            }),
            taking: Mutex::new(()),
            listening: AtomicBool::new(true),
            task: AtomicBool::new(false),
            accepted_at: AtomicU64::new(0),
            created: Instant::now(),
            control: Mutex::new(control),
            retry: Mutex::new((Instant::now() + RETRY_FIRST, RETRY_FIRST)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Until when the program counts as attentive: [`ATTENTIVE`] after
    /// its last `accept`, if that is still to come.
    fn attentive_until(&self, now: Instant) -> Option<Instant> {
        let at = self.accepted_at.load(Ordering::Acquire);
        let until = self.created + Duration::from_nanos(at) + ATTENTIVE;
        (at != 0 && until > now).then_some(until)
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

    /// How many connections the service thread may hold answered or
    /// pending for this process ahead of any `accept`.
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
            service::submit(Box::new(Listen {
                sh: self.clone(),
                due: None,
            }));
        }
    }

    /// The service thread's task on Q (inside the fork gate): takes the
    /// connections wanted and answers them; false when it ends
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

    /// Takes the connections waiting on Q, as many as wanted: answered at
    /// once (their Request is there), or set up by a task in `out`.
    fn take_connections(self: &Arc<Self>, now: Instant, out: &mut Vec<Box<dyn Task>>) {
        while self.wanted() {
            let _taking = self.taking.lock().unwrap_or_else(|p| p.into_inner());
            let Some(mut h) = self.take_q(true, now) else {
                return;
            };
            // Taken ahead: it waits for an accept, the RTR must not.
            match h.answer(now, Driver::Progress) {
                Ok(Some(stream)) => {
                    let peer = h.peer;
                    self.answered(Ready { stream, peer });
                }
                Ok(None) => out.push(self.pending(h)),
                Err(why) => h.fail(&why),
            }
        }
    }

    /// Takes the next connection from Q and starts its handshake; `None`
    /// when Q is empty. Taken `ahead` of an `accept`, its descriptor goes
    /// high, out of the way of the numbers the program opens meanwhile; an
    /// `accept`'s keeps the number a TCP accept would give, which the
    /// program gets.
    fn take_q(self: &Arc<Self>, ahead: bool, now: Instant) -> Option<Handshake> {
        loop {
            let (tcp, peer) = match self.q.accept() {
                Ok((c, a)) if ahead => {
                    let c = std::net::TcpStream::from(sdp_core::fds::high(OwnedFd::from(c)));
                    (c, a)
                }
                Ok((c, a)) => (c, a),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // ECONNABORTED, EMFILE...: tried again on the next event.
                    if e.kind() != io::ErrorKind::WouldBlock {
                        crate::log!(Level::Debug, "hidden listener {}: accept: {e}", self.p);
                    }
                    return None;
                }
            };
            match Handshake::new(self.clone(), tcp, peer, now) {
                Ok(h) => return Some(h),
                Err(e) => crate::log!(Level::Debug, "SDP setup with {peer}: {e}"),
            }
        }
    }

    /// An `accept` (holding `taking`) takes the next connection from Q
    /// itself and returns it answered; one whose MPA Request has not come
    /// yet goes on in the service thread (and is handed out from `ready`
    /// once answered). `None` when Q is empty.
    fn take_now(self: &Arc<Self>, now: Instant) -> Option<Ready> {
        loop {
            let mut h = self.take_q(false, now)?;
            // The program's own accept: it drives the connection next.
            match h.answer(now, Driver::Handed) {
                Ok(Some(stream)) => {
                    let peer = h.peer;
                    return Some(Ready { stream, peer });
                }
                Ok(None) => service::submit(self.pending(h)),
                Err(why) => h.fail(&why),
            }
        }
    }

    /// A handshake whose MPA Request has not come, for the service thread:
    /// counted as in setup until it ends (a nonblocking `accept` then waits
    /// for it, see `SdpListener::setting_up`).
    fn pending(&self, h: Handshake) -> Box<dyn Task> {
        self.lock().setting_up += 1;
        Box::new(h)
    }

    /// An answered connection waits for an `accept`.
    fn answered(&self, r: Ready) {
        let mut q = self.lock();
        if q.closed {
            // Nobody will accept it: close it (graceful, background).
            drop(q);
            drop(r);
            return;
        }
        q.ready.push_back(r);
        let _ = q.levels.set(true, false);
    }

    /// A pending handshake ended: answered (`Some`) or failed.
    fn pending_ended(self: &Arc<Self>, ready: Option<Ready>) {
        {
            let mut q = self.lock();
            q.setting_up = q.setting_up.saturating_sub(1);
        }
        match ready {
            Some(r) => self.answered(r),
            // Failed: the call that wanted it wants another.
            None => self.kick(),
        }
    }
}

/// The Accepting Peer's setup of one connection up to its answered MPA
/// Request (DESIGN §4); the stream carries the rest on.
pub struct Handshake {
    lst: Arc<Shared>,
    peer: SocketAddr,
    until: Instant,
    /// The endpoint and its fitted configuration, until answered.
    ep: Option<(Box<Endpoint>, sdp_core::conn::Config)>,
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
            ep: Some((ep, config)),
        })
    }

    /// Reads the MPA Request and its Hello if they came, and answers them
    /// (the Reply with the HelloAck's parameters, or a reject): sdp-core's
    /// step ([`accept::answer_request`]). `Ok(Some)`: the stream, waiting
    /// for the RTR; `Ok(None)`: not there yet ([`Handshake::wait`]);
    /// `Err`: why it failed.
    fn answer(&mut self, now: Instant, driver: Driver) -> Result<Option<SdpStream>, String> {
        if now >= self.until {
            return Err("setup timed out".into());
        }
        let Some((ep, config)) = self.ep.take() else {
            return Err("answered already".into());
        };
        match accept::answer_request(ep, &config, now, driver) {
            Answer::Answered(s) => Ok(Some(s)),
            Answer::Pending(ep) => {
                self.ep = Some((ep, config));
                Ok(None)
            }
            Answer::Failed(e) => Err(e.to_string()),
        }
    }

    /// What a handshake whose Request has not come waits for: its socket,
    /// until the MPA startup timer or the setup's limit.
    fn wait(&self) -> Wait {
        match &self.ep {
            Some((ep, _)) => {
                let deadline = ep.poll_timeout().map_or(self.until, |t| t.min(self.until));
                (ep.raw_fd(), libc::POLLIN, Some(deadline))
            }
            None => (-1, 0, Some(self.until)),
        }
    }

    fn fail(&self, why: &str) {
        crate::log!(
            Level::Debug,
            "listener {}: SDP setup with {} failed: {why}",
            self.lst.p,
            self.peer
        );
    }
}

/// A handshake whose MPA Request had not come when its connection was
/// taken, carried on by the service thread; answered, the connection
/// waits in `ready` for an `accept`.
impl Task for Handshake {
    fn advance(
        mut self: Box<Self>,
        now: Instant,
        _spawned: &mut Vec<Box<dyn Task>>,
    ) -> Option<(Box<dyn Task>, Wait)> {
        if self.lst.is_closed() {
            return None;
        }
        match self.answer(now, Driver::Progress) {
            Ok(Some(stream)) => {
                let peer = self.peer;
                self.lst.pending_ended(Some(Ready { stream, peer }));
                None
            }
            Ok(None) => {
                let wait = self.wait();
                Some((self, wait))
            }
            Err(why) => {
                self.fail(&why);
                self.lst.pending_ended(None);
                None
            }
        }
    }
}

/// The stream's socket under the number a TCP accept would give,
/// close-on-exec as `cloexec` says (accept4's flags): one descriptor for the program
/// and the stream, lent to the program until its `close` takes the
/// number back ([`crate::sdp::SdpEndpoint::leave_fd`]). A socket taken ahead (high)
/// moves down.
fn program_number(stream: &SdpStream, cloexec: bool) -> io::Result<RawFd> {
    use crate::sys::real;
    let fd = stream.socket_fd();
    // SAFETY: a descriptor of the stream, borrowed for the call.
    if !sdp_core::fds::is_high(unsafe { BorrowedFd::borrow_raw(fd) }) {
        // Taken from Q close-on-exec.
        // SAFETY: F_SETFD takes an int.
        if !cloexec && unsafe { real::fcntl(fd, libc::F_SETFD, 0) } < 0 {
            return Err(io::Error::last_os_error());
        }
        return Ok(fd);
    }
    let dup = if cloexec {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    // SAFETY: F_DUPFD(_CLOEXEC) takes an int.
    let low = unsafe { real::fcntl(fd, dup, 3) };
    if low < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor of ours, which the stream takes; the high
    // one it gives back closes.
    drop(stream.move_socket(unsafe { OwnedFd::from_raw_fd(low) })?);
    Ok(low)
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

    fn accept(&self, nonblocking: bool, cloexec: bool) -> Result<Accepted, Errno> {
        let since = self.sh.created.elapsed().as_nanos() as u64;
        self.sh.accepted_at.store(since.max(1), Ordering::Release);
        loop {
            let taken = {
                let _g = table::enter_gate();
                let _taking = self.sh.taking.lock().unwrap_or_else(|p| p.into_inner());
                let answered = {
                    let mut q = self.sh.lock();
                    let r = q.ready.pop_front();
                    if q.ready.is_empty() {
                        let _ = q.levels.set(false, false);
                    }
                    r
                };
                // Else the next connection in Q, taken by this call.
                answered.or_else(|| self.sh.take_now(Instant::now()))
            };
            let Some(Ready { stream, peer }) = taken else {
                let _g = table::enter_gate();
                self.sh.kick();
                return Err(libc::EAGAIN);
            };
            if !nonblocking {
                // A blocking call has nothing else to do: it takes the RTR
                // and sends the HelloAck itself if they come soon, so the
                // connection it returns is set up, as a TCP one is, its
                // client's connect most likely complete too. (Outside the
                // fork gate: nothing else reaches the stream yet.)
                let _ = stream.wait_connected(Some(Instant::now() + RTR_WAIT));
            }
            let _g = table::enter_gate();
            // Room for the next one, for a listener that takes them ahead.
            if self.sh.takes_ahead() {
                self.sh.kick();
            }
            // A connection that ended while it waited is still handed out,
            // as TCP does (the program's first read tells).
            let fd = match program_number(&stream, cloexec) {
                Ok(fd) => fd,
                Err(e) => return Err(e.raw_os_error().unwrap_or(libc::EMFILE)),
            };
            let local = stream.local_addr();
            match Ep::connected(stream, fd) {
                Ok(ep) => {
                    crate::log!(
                        Level::Debug,
                        "fd {fd}: accepted SDP connection from {peer} on {}",
                        self.sh.p
                    );
                    // The statistics export runs in the service thread,
                    // which a forked worker that only accepts (nginx's)
                    // would otherwise never start.
                    service::ensure();
                    return Ok(Accepted {
                        fd,
                        peer,
                        local: local.ok(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// A listening process's shared state on a plain Q, with no port
    /// mapper, and a client whose connection waits in Q.
    fn waiting() -> (Arc<Shared>, std::net::TcpStream) {
        let q = TcpListener::bind("127.0.0.1:0").unwrap();
        q.set_nonblocking(true).unwrap();
        let mut client = std::net::TcpStream::connect(q.local_addr().unwrap()).unwrap();
        client.write_all(b"not an MPA Request").unwrap();
        let p = q.local_addr().unwrap();
        let sh = Arc::new(Shared::new(q, p, Levels::new().unwrap(), None));
        sh.task.store(true, Ordering::Release);
        (sh, client)
    }

    /// Steps the task at `now`; returns it and when it wants to run again.
    fn step(task: Box<dyn Task>, now: Instant) -> (Box<dyn Task>, Option<Instant>) {
        let (task, (_, _, due)) = task
            .advance(now, &mut Vec::new())
            .expect("the task goes on");
        (task, due)
    }

    /// The task's first step on a connection waiting in Q: it looks again
    /// after `TAKE_AHEAD_AFTER`.
    fn first_step(sh: &Arc<Shared>, t0: Instant) -> Box<dyn Task> {
        let listen = Listen {
            sh: sh.clone(),
            due: None,
        };
        let (task, due) = step(Box::new(listen), t0);
        assert_eq!(due, Some(t0 + TAKE_AHEAD_AFTER));
        assert!(sh.q_pending());
        task
    }

    #[test]
    fn a_connection_nobody_accepts_is_taken_ahead_after_a_moment() {
        let (sh, _client) = waiting();
        let t0 = Instant::now();
        let task = first_step(&sh, t0);
        // Taken from Q (and refused: it is no SDP peer).
        let _ = step(task, t0 + TAKE_AHEAD_AFTER);
        assert!(!sh.q_pending());
    }

    #[test]
    fn an_accepting_program_takes_its_connections_itself() {
        let (sh, _client) = waiting();
        let t0 = Instant::now();
        let task = first_step(&sh, t0);
        // The program accepted at t0 (what `accept` records).
        let at = t0.duration_since(sh.created).as_nanos() as u64;
        sh.accepted_at.store(at.max(1), Ordering::Release);
        let (task, due) = step(task, t0 + TAKE_AHEAD_AFTER);
        let attentive_until = sh.created + Duration::from_nanos(at.max(1)) + ATTENTIVE;
        assert_eq!(due, Some(attentive_until));
        assert!(sh.q_pending(), "taken ahead of an attentive program");
        // Not seen for ATTENTIVE: taken ahead after all.
        let _ = step(task, attentive_until);
        assert!(!sh.q_pending());
    }
}
