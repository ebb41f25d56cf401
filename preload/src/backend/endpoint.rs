//! [`Ep`]: one SDP connection behind an application fd, over
//! `sdp_core::stream::SdpStream` ([`SdpEndpoint`] for the hooks).
//!
//! A data call is one call of the stream with the program's blocking rule
//! ([`SdpStream::recv_vectored`], [`SdpStream::send_vectored`]): a call
//! that may wait sleeps in the stream (on the socket, as the stream's
//! poller, so the progress thread keeps off and no readiness descriptor
//! is kept up to date for it), outside the fork gate; the stream's own
//! mode stays nonblocking. poll and select use the
//! wake fd, the stream's readiness descriptor (a socket pair end whose
//! `POLLIN`/`POLLOUT` are exact), made only when first asked for: each
//! change of its levels costs system calls on every message; an epoll set
//! is told of the levels instead ([`SdpEndpoint::watch_levels`]). A
//! nonblocking connect hands the wake fd out before the stream exists; the
//! stream adopts it once its setup succeeded.
//!
//! The stream runs on the program's own fd number (its socket) once
//! connected; the program's `close` of that number moves it to a
//! duplicate of its own first ([`SdpEndpoint::leave_fd`]).
//!
//! Every call that touches the stream runs inside the fd table's fork gate
//! (a fork waits until it is out, so a child never inherits one of the
//! stream's locks held) and first claims the connection for this process
//! ([`super::owner`]). Once connected, a call reaches the stream without
//! the endpoint's own lock (`live`, `open`): the stream's lock is the one
//! a data call takes. So the endpoint decides when the connection closes
//! ([`SdpStream::close`]), not the drop of the last handle.

use super::owner::{Claim, Orphan, OrphanStep, Ownership, Release};
use super::service::{self, Task, Wait};
use crate::log::Level;
use crate::sdp::{
    Block, Counters, Errno, LevelWatch, Mode, Pumped, Readiness, RecvFlags, SdpEndpoint, SendFlags,
    Setup, Shutdown, Stats, WakeFd,
};
use crate::sys::real;
use crate::table;
use libc::c_int;
use sdp_core::conn::{FlowControlMode, RecvFlags as SdpRecv, SendFlags as SdpSend};
use sdp_core::stream::readiness::Readiness as Levels;
use sdp_core::stream::SdpStream;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, BorrowedFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Where the connection stands.
pub enum State {
    /// A connect under way (the caller's thread carries a blocking one,
    /// the service thread a nonblocking one); `levels` is the wake fd's
    /// pair, neither readable nor writable.
    Connecting {
        levels: Option<Levels>,
    },
    /// The stream is [`Ep::live`].
    Connected,
    /// The connect failed (SDP only, or the TCP fallback's own connect):
    /// `errno` is reported once (`SO_ERROR` or the next call).
    Failed {
        errno: Errno,
        reported: bool,
        _levels: Option<Levels>,
    },
    /// The nonblocking connect fell back to TCP: the fd is a kernel
    /// socket again (calls that still arrive here go to it).
    FellBack,
    Closed,
}

/// A nonblocking connect's setup that the program's own calls on the fd
/// (`poll`, `epoll_ctl`, `epoll_wait`, `SO_ERROR`, a data call) may end
/// (the connect module's `Pending`): what arrived for it is read in the
/// caller's thread, not after hops through the progress and the service
/// threads. A client whose server's blocking `accept` returned sees its
/// connect complete, as over TCP.
pub trait Advance: Send + Sync {
    /// Reads what arrived and ends the setup if that completes it;
    /// whether it ended.
    fn advance(&self) -> bool;
}

/// See the module documentation.
pub struct Ep {
    state: Mutex<State>,
    /// The stream, once connected (for good: a closed one stays, closed).
    live: OnceLock<SdpStream>,
    /// `state` is `Connected`: a data call takes [`Ep::live`] without the
    /// state's lock (DESIGN §7 "One lock per call").
    open: AtomicBool,
    /// Data calls under way ([`Busy`]).
    calls: AtomicUsize,
    /// A close waiting for them: the program's `O_NONBLOCK` then.
    closing: Mutex<Option<bool>>,
    own: Ownership,
    /// The readiness descriptor (our duplicate), stable for the Ep's life
    /// once made (see the module documentation).
    wake: OnceLock<Arc<OwnedFd>>,
    /// The application's fd number (for a fallback to TCP).
    fd: RawFd,
    /// The stream's own socket descriptor, once connected (-1 before).
    sock: AtomicI32,
    /// A connect waiting for the hooks to record the endpoint
    /// ([`SdpEndpoint::recorded`]) before it goes on.
    connector: Mutex<Option<Box<dyn FnOnce() -> Setup + Send>>>,
    /// A nonblocking connect's setup, while the service thread has it.
    setup: OnceLock<Weak<dyn Advance>>,
    warned: AtomicBool,
    /// The program set TCP_USER_TIMEOUT itself: keepalive leaves it alone.
    user_timeout: AtomicBool,
    /// SO_KEEPALIVE, TCP_KEEPIDLE, TCP_KEEPINTVL and TCP_KEEPCNT as last
    /// set or read ([`UNKNOWN`] before; [`Ep::keepalive_deadline`]).
    keepalive: [AtomicI32; 4],
    /// The TCP_USER_TIMEOUT they gave, as last set ([`UNKNOWN`] before).
    keepalive_ms: AtomicI32,
    /// The program's O_NONBLOCK ([`SdpEndpoint::set_nonblocking`]), for a
    /// stream connected later.
    nonblocking: AtomicBool,
    /// The program's TCP_NODELAY, for a stream connected later.
    nodelay: AtomicBool,
    /// Kernel waits that report the wake fd ([`SdpEndpoint::hold_wake`]),
    /// for a stream connected later.
    wake_holders: AtomicUsize,
}

/// A data call under way on an [`Ep`]: a close meanwhile waits for the
/// last one to end.
struct Busy<'a>(&'a Ep);

impl<'a> Busy<'a> {
    fn new(ep: &'a Ep) -> Busy<'a> {
        ep.calls.fetch_add(1, Ordering::SeqCst);
        Busy(ep)
    }
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let ep = self.0;
        if ep.calls.fetch_sub(1, Ordering::SeqCst) == 1 && !ep.open.load(Ordering::SeqCst) {
            ep.close_now();
        }
    }
}

fn errno_of(e: &io::Error) -> Errno {
    e.raw_os_error().unwrap_or(libc::EIO)
}

fn mode(m: FlowControlMode) -> Mode {
    match m {
        FlowControlMode::Buffered => Mode::Buffered,
        FlowControlMode::Combined => Mode::Combined,
        FlowControlMode::Pipelined => Mode::Pipelined,
    }
}

fn clamp_u32(v: i64) -> u32 {
    v.clamp(0, i64::from(u32::MAX)) as u32
}

/// What a call finds.
enum Access<'a> {
    Stream(&'a SdpStream),
    Connecting,
    Failed,
    FellBack,
    Closed,
    Lost,
}

impl Ep {
    /// Keepalive as the program set it must end a dead connection as it
    /// does over TCP: after the idle time and `TCP_KEEPCNT` unanswered
    /// probes. Linux sends no probe while data is unacknowledged, and an
    /// SDP reader's own credit updates are data, so a reader whose peer
    /// went away would wait for the retransmissions to give up (about 15
    /// minutes) where a TCP reader, which sends only ACKs, gets ETIMEDOUT.
    /// `TCP_USER_TIMEOUT` bounds both at the keepalive's time (tcp(7):
    /// with keepalive on, it decides when the connection is dropped). Off
    /// again when the program turns keepalive off.
    ///
    /// The option just set is `which` of [`KEEPALIVE`], at `value` (the
    /// kernel took it); the times and the count are read from the socket
    /// once and remembered, and the timeout is set when it changes: the
    /// four calls a server makes per connection (redis) cost seven system
    /// calls more, not twenty. (A forked child that changes them on the
    /// shared socket leaves this process's copy behind; its own setting
    /// of the timeout stands until this process sets one.)
    fn keepalive_deadline(&self, which: usize, value: Option<c_int>) {
        let fd = self.fd;
        if let Some(v) = value {
            self.keepalive[which].store(v, Ordering::Relaxed);
        }
        let option = |i: usize, default: c_int| {
            let v = self.keepalive[i].load(Ordering::Relaxed);
            if v != UNKNOWN {
                return v;
            }
            let (level, name) = KEEPALIVE[i];
            let v = kernel_int(fd, level, name).unwrap_or(default);
            self.keepalive[i].store(v, Ordering::Relaxed);
            v
        };
        let ms = if option(0, 0) != 0 {
            let secs =
                i64::from(option(1, 7200)) + i64::from(option(2, 75)) * i64::from(option(3, 9));
            (secs * 1000).clamp(0, i64::from(c_int::MAX)) as c_int
        } else {
            0
        };
        if self.keepalive_ms.swap(ms, Ordering::Relaxed) == ms {
            return;
        }
        // SAFETY: an int option on the program's socket.
        unsafe {
            real::setsockopt(
                fd,
                libc::IPPROTO_TCP,
                libc::TCP_USER_TIMEOUT,
                (&ms as *const c_int).cast(),
                std::mem::size_of::<c_int>() as libc::socklen_t,
            )
        };
    }

    /// An established stream (blocking connect, accept).
    pub fn connected(stream: SdpStream, fd: RawFd) -> io::Result<Ep> {
        stream.set_nonblocking(true)?;
        let ep = Ep::with(State::Closed, None, fd);
        ep.connect(&mut ep.lock(), stream);
        Ok(ep)
    }

    /// A connect just started: the wake fd is neither readable nor
    /// writable until it ends. A blocking connect's is made only when
    /// another thread polls the fd meanwhile ([`SdpEndpoint::wake_fd`]):
    /// a stream that adopts it keeps its levels up to date ever after.
    /// `nodelay`: the program set TCP_NODELAY before its connect.
    pub fn connecting(fd: RawFd, wake_now: bool, nodelay: bool) -> io::Result<Ep> {
        let ep = if wake_now {
            let levels = Levels::new()?;
            let wake = levels.user_shared();
            Ep::with(
                State::Connecting {
                    levels: Some(levels),
                },
                Some(wake),
                fd,
            )
        } else {
            Ep::with(State::Connecting { levels: None }, None, fd)
        };
        ep.nodelay.store(nodelay, Ordering::Relaxed);
        Ok(ep)
    }

    /// The connect succeeded: `stream` is the connection from now on.
    pub fn connect(&self, st: &mut State, stream: SdpStream) {
        // The wake fd's levels are kept while a kernel wait reports it
        // (an epoll set that registered the fd while it connected, say):
        // the program's calls see the stream's state itself.
        for _ in 0..self.wake_holders.load(Ordering::SeqCst) {
            stream.hold_readiness(true);
        }
        stream.readiness_on_demand(true);
        self.sock.store(stream.socket_fd(), Ordering::Relaxed);
        let _ = self.live.set(stream);
        *st = State::Connected;
        self.open.store(true, Ordering::Release);
    }

    fn with(state: State, wake: Option<Arc<OwnedFd>>, fd: RawFd) -> Ep {
        let cell = OnceLock::new();
        if let Some(w) = wake {
            let _ = cell.set(w);
        }
        Ep {
            state: Mutex::new(state),
            live: OnceLock::new(),
            open: AtomicBool::new(false),
            calls: AtomicUsize::new(0),
            closing: Mutex::new(None),
            own: Ownership::new(),
            wake: cell,
            fd,
            connector: Mutex::new(None),
            setup: OnceLock::new(),
            sock: AtomicI32::new(-1),
            warned: AtomicBool::new(false),
            user_timeout: AtomicBool::new(false),
            keepalive: [const { AtomicI32::new(UNKNOWN) }; 4],
            keepalive_ms: AtomicI32::new(UNKNOWN),
            nonblocking: AtomicBool::new(false),
            nodelay: AtomicBool::new(false),
            wake_holders: AtomicUsize::new(0),
        }
    }

    /// The program's O_NONBLOCK as last told.
    pub(crate) fn nonblocking(&self) -> bool {
        self.nonblocking.load(Ordering::Relaxed)
    }

    /// The program's TCP_NODELAY as last set.
    pub(crate) fn nodelay(&self) -> bool {
        self.nodelay.load(Ordering::Relaxed)
    }

    /// `f` on the connected stream, if there is one; whether there was.
    /// Not a use of the connection (no claim after a fork): marks such as
    /// [`SdpEndpoint::watch_socket`] go with the stream whoever has it.
    fn mark(&self, f: impl FnOnce(&SdpStream)) -> bool {
        let _g = table::enter_gate();
        match self.stream_if_open() {
            Some(s) => {
                f(s);
                true
            }
            None => false,
        }
    }

    /// The stream while the state is `Connected` (whoever owns it).
    fn stream_if_open(&self) -> Option<&SdpStream> {
        if self.open.load(Ordering::SeqCst) {
            self.live.get()
        } else {
            None
        }
    }

    /// The state, locked (never across a blocking call).
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The application's fd number.
    pub fn fd(&self) -> RawFd {
        self.fd
    }

    /// The stream's socket descriptor, once connected.
    pub fn set_socket(&self, fd: RawFd) {
        self.sock.store(fd, Ordering::Relaxed);
    }

    /// The connect's setup, to carry on once the hooks recorded us.
    pub fn park(&self, setup: Box<dyn FnOnce() -> Setup + Send>) {
        *self.connector.lock().unwrap_or_else(|p| p.into_inner()) = Some(setup);
    }

    /// The nonblocking connect's setup, which the program's calls may
    /// carry on ([`Advance`]).
    pub fn carried_by(&self, setup: Weak<dyn Advance>) {
        let _ = self.setup.set(setup);
    }

    /// A connect under way takes a step in this thread; whether it ended.
    fn advance_setup(&self) -> bool {
        self.setup
            .get()
            .and_then(Weak::upgrade)
            .is_some_and(|s| s.advance())
    }

    /// The stream to call, after claiming the connection (a connect under
    /// way looks at what arrived first). A connected stream this process
    /// owns takes no lock.
    fn access(&self) -> Access<'_> {
        match self.access_now() {
            Access::Connecting if self.advance_setup() => self.access_now(),
            found => found,
        }
    }

    fn access_now(&self) -> Access<'_> {
        if let (Some(s), true) = (self.stream_if_open(), self.own.owned()) {
            return Access::Stream(s);
        }
        let stream = match &*self.lock() {
            State::Connected => match self.live.get() {
                Some(s) => s,
                None => return Access::Closed,
            },
            State::Connecting { .. } => return Access::Connecting,
            State::Failed { .. } => return Access::Failed,
            State::FellBack => return Access::FellBack,
            State::Closed => return Access::Closed,
        };
        if self.own.owned() {
            return Access::Stream(stream);
        }
        match self.own.claim() {
            Claim::Owned => Access::Stream(stream),
            Claim::Taken => {
                if let Err(e) = stream.resume_progress() {
                    crate::log!(
                        Level::Error,
                        "fd {}: cannot resume SDP progress after fork: {e}",
                        self.fd
                    );
                }
                crate::log!(
                    Level::Debug,
                    "fd {}: this process goes on with the SDP connection after fork",
                    self.fd
                );
                Access::Stream(stream)
            }
            Claim::Lost(pid) => {
                if !self.warned.swap(true, Ordering::Relaxed) {
                    crate::log!(
                        Level::Warn,
                        "fd {}: the SDP connection is used by process {pid}; an SDP socket \
                         serves one process after fork (socket duplication is not supported)",
                        self.fd
                    );
                }
                Access::Lost
            }
        }
    }

    /// The close [`SdpEndpoint::close`] decided, once no data call is
    /// under way (once: whoever takes `closing` carries it out).
    fn close_now(&self) {
        let Some(nonblocking) = self
            .closing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        else {
            return;
        };
        let Some(stream) = self.live.get().cloned() else {
            return;
        };
        match self.own.release() {
            Release::Close { resume } => {
                // The last holder after a fork: its progress was paused.
                if resume {
                    let _ = stream.resume_progress();
                }
            }
            Release::LetGo => {
                // Not ours after a fork: let go of the descriptors only.
                let _g = table::enter_gate();
                stream.detach();
                return;
            }
            Release::Watch => {
                // Another process holds a copy: it may take the connection
                // or be gone without, and then this one closes it.
                match self.own.orphan() {
                    Some(o) => service::submit(Box::new(Orphaned(o, stream))),
                    None => stream.detach(),
                }
                return;
            }
        }
        let lingering = linger(stream.socket_fd());
        if lingering.is_some_and(|t| !t.is_zero()) {
            // The stream keeps the wait (below); the kernel socket's own
            // close, later and perhaps in the progress thread, must not
            // wait too: Linux's does with the linger on whatever
            // O_NONBLOCK says, and a dead peer would hold every stream's
            // progress that long.
            linger_off(stream.socket_fd());
        }
        match lingering {
            Some(t) if t.is_zero() => {
                // SO_LINGER 0: abortive close (§8.2.2).
                let _ = stream.set_linger(Some(Duration::ZERO));
            }
            // A blocking close waits for the close exchange, up to t.
            Some(t) if !nonblocking => {
                let _ = stream.set_nonblocking(false);
                let _ = stream.set_linger(Some(t));
            }
            _ => {}
        }
        // A graceful close the progress thread finishes (or, lingering,
        // this thread), outside the gate.
        stream.close();
    }

    /// `Failed`: the error once, then what TCP gives on an unconnected
    /// socket (`otherwise`).
    fn failed(&self, otherwise: Errno) -> Errno {
        if let State::Failed {
            errno, reported, ..
        } = &mut *self.lock()
        {
            if !*reported {
                *reported = true;
                return *errno;
            }
        }
        otherwise
    }
}

fn recv_flags(flags: RecvFlags) -> SdpRecv {
    let mut f = 0;
    if flags.oob {
        f |= SdpRecv::OOB.0;
    }
    if flags.peek {
        f |= SdpRecv::PEEK.0;
    }
    if flags.waitall {
        f |= SdpRecv::WAITALL.0;
    }
    SdpRecv(f)
}

fn send_flags(flags: SendFlags) -> SdpSend {
    let mut f = 0;
    if flags.oob {
        f |= SdpSend::OOB.0;
    }
    if flags.more {
        f |= SdpSend::MORE.0;
    }
    SdpSend(f)
}

/// Sleeps until `fd` polls `events`: `Err(EAGAIN)` at the deadline,
/// `Err(EINTR)` when a signal handler ran.
fn sleep_on(fd: RawFd, events: i16, block: Block) -> Result<(), Errno> {
    let deadline = match block {
        Block::Until(d) => d,
        Block::Never => return Err(libc::EAGAIN),
    };
    let mut p = libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let ts = deadline.map(|d| {
        let left = d.saturating_duration_since(Instant::now());
        libc::timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        }
    });
    let tp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: one local pollfd, a local timespec or null, no signal mask.
    match unsafe { real::ppoll(&mut p, 1, tp, std::ptr::null()) } {
        0 => Err(libc::EAGAIN),
        r if r > 0 => Ok(()),
        _ => Err(real::errno()),
    }
}

/// A receive on the kernel socket of a connection that fell back to TCP
/// (its descriptor stays nonblocking: the wait is ours).
fn kernel_recv(
    fd: RawFd,
    mut bufs: &mut [IoSliceMut<'_>],
    flags: RecvFlags,
    block: Block,
) -> Result<usize, Errno> {
    let mut f = libc::MSG_DONTWAIT;
    if flags.peek {
        f |= libc::MSG_PEEK;
    }
    if flags.oob {
        f |= libc::MSG_OOB;
    }
    // MSG_WAITALL: a call that may wait goes on until the buffers are
    // full (the descriptor is nonblocking, so the kernel would not).
    let waitall = flags.waitall && !flags.peek && block != Block::Never;
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    let mut done = 0;
    loop {
        let mut msg: libc::msghdr = unsafe_zeroed_msghdr();
        msg.msg_iov = bufs.as_mut_ptr().cast();
        msg.msg_iovlen = bufs.len();
        // SAFETY: the iovecs are the caller's live slices (IoSliceMut is
        // ABI-compatible with iovec).
        let n = unsafe { real::recvmsg(fd, &mut msg, f) };
        if n > 0 && waitall && done + (n as usize) < total {
            done += n as usize;
            IoSliceMut::advance_slices(&mut bufs, n as usize);
            continue;
        }
        if n >= 0 {
            return Ok(done + n as usize);
        }
        let waited = match real::errno() {
            libc::EAGAIN if !flags.oob => sleep_on(fd, libc::POLLIN, block),
            e => Err(e),
        };
        if let Err(e) = waited {
            return if done > 0 { Ok(done) } else { Err(e) };
        }
    }
}

/// A send on the kernel socket of a connection that fell back to TCP.
fn kernel_send(
    fd: RawFd,
    mut bufs: &mut [IoSlice<'_>],
    flags: SendFlags,
    block: Block,
) -> Result<usize, Errno> {
    let mut f = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
    if flags.oob {
        f |= libc::MSG_OOB;
    }
    if flags.more {
        f |= libc::MSG_MORE;
    }
    let total: usize = bufs.iter().map(|b| b.len()).sum();
    let mut done = 0;
    loop {
        let mut msg: libc::msghdr = unsafe_zeroed_msghdr();
        msg.msg_iov = bufs.as_ptr().cast_mut().cast();
        msg.msg_iovlen = bufs.len();
        // SAFETY: as in kernel_recv; sendmsg only reads the buffers.
        let n = unsafe { real::sendmsg(fd, &msg, f) };
        if n >= 0 {
            done += n as usize;
            if block == Block::Never || done >= total {
                return Ok(done);
            }
            IoSlice::advance_slices(&mut bufs, n as usize);
            continue;
        }
        let e = real::errno();
        let waited = match e {
            libc::EAGAIN => sleep_on(fd, libc::POLLOUT, block),
            e => Err(e),
        };
        if let Err(e) = waited {
            return if done > 0 { Ok(done) } else { Err(e) };
        }
    }
}

/// The options keepalive is made of ([`Ep::keepalive_deadline`]).
const KEEPALIVE: [(c_int, c_int); 4] = [
    (libc::SOL_SOCKET, libc::SO_KEEPALIVE),
    (libc::IPPROTO_TCP, libc::TCP_KEEPIDLE),
    (libc::IPPROTO_TCP, libc::TCP_KEEPINTVL),
    (libc::IPPROTO_TCP, libc::TCP_KEEPCNT),
];

/// Not yet known (an [`Ep`]'s keepalive options).
const UNKNOWN: c_int = -1;

/// An int socket option of the kernel socket `fd`.
fn kernel_int(fd: RawFd, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
    // SAFETY: a local int and its length.
    let r = unsafe { real::getsockopt(fd, level, name, (&mut v as *mut c_int).cast(), &mut len) };
    (r == 0).then_some(v)
}

/// `SO_LINGER` of the kernel socket `fd`: `Some(timeout)` when on.
fn linger(fd: RawFd) -> Option<Duration> {
    let mut l = libc::linger {
        l_onoff: 0,
        l_linger: 0,
    };
    let mut len = std::mem::size_of::<libc::linger>() as libc::socklen_t;
    // SAFETY: a local linger struct and its length.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&mut l as *mut libc::linger).cast(),
            &mut len,
        )
    };
    (r == 0 && l.l_onoff != 0).then(|| Duration::from_secs(l.l_linger.max(0) as u64))
}

/// Turns `SO_LINGER` off on the kernel socket `fd`.
fn linger_off(fd: RawFd) {
    let off = libc::linger {
        l_onoff: 0,
        l_linger: 0,
    };
    // SAFETY: a local linger struct and its length.
    unsafe {
        real::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&off as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
}

fn kernel_readiness(fd: RawFd) -> Readiness {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN | libc::POLLOUT | libc::POLLRDHUP | libc::POLLPRI,
        revents: 0,
    };
    // SAFETY: one local pollfd, no wait.
    unsafe { real::poll(&mut p, 1, 0) };
    let r = p.revents;
    Readiness {
        readable: r & libc::POLLIN != 0,
        writable: r & libc::POLLOUT != 0,
        read_closed: r & libc::POLLRDHUP != 0,
        hangup: r & libc::POLLHUP != 0,
        error: r & libc::POLLERR != 0,
        urgent: r & libc::POLLPRI != 0,
    }
}

fn all_ready() -> Readiness {
    Readiness {
        readable: true,
        writable: true,
        read_closed: true,
        hangup: true,
        error: true,
        urgent: false,
    }
}

impl SdpEndpoint for Ep {
    fn readiness(&self) -> Readiness {
        let _g = table::enter_gate();
        match self.access() {
            Access::Stream(s) => {
                let st = s.poll_state();
                Readiness {
                    readable: st.readable,
                    writable: st.writable,
                    read_closed: st.read_closed,
                    hangup: st.hangup,
                    error: st.error,
                    urgent: st.urgent,
                }
            }
            Access::Connecting => Readiness::default(),
            Access::Failed | Access::Lost => all_ready(),
            Access::FellBack => kernel_readiness(self.fd),
            Access::Closed => Readiness {
                hangup: true,
                ..Readiness::default()
            },
        }
    }

    fn wake_fd(&self) -> WakeFd {
        if let (Some(w), true) = (self.wake.get(), self.open.load(Ordering::Acquire)) {
            return w.as_raw_fd();
        }
        let _g = table::enter_gate();
        let mut st = self.lock();
        if matches!(*st, State::FellBack) {
            return self.fd;
        }
        if let Some(w) = self.wake.get() {
            return w.as_raw_fd();
        }
        let made = match &mut *st {
            // Another process's connection: its stream is not touched
            // here (`Ownership::lost`); it polls ready at once
            // (`readiness`), and the kernel socket will do to sleep on.
            State::Connected if self.own.lost() => return self.fd,
            State::Connected => self
                .live
                .get()
                .ok_or_else(|| io::Error::other("no stream"))
                .and_then(SdpStream::readiness_shared),
            State::Connecting { levels } => Levels::new().map(|l| {
                let w = l.user_shared();
                *levels = Some(l);
                w
            }),
            _ => Err(io::Error::other("no stream")),
        };
        match made {
            Ok(w) => {
                let _ = self.wake.set(w);
                self.wake.get().map_or(self.fd, |w| w.as_raw_fd())
            }
            Err(e) => {
                // Only a connected stream comes without one; out of
                // descriptors, the kernel socket is the nearest thing.
                crate::log!(
                    Level::Error,
                    "fd {}: cannot make the readiness descriptor: {e}",
                    self.fd
                );
                self.fd
            }
        }
    }

    fn recv(
        &self,
        bufs: &mut [IoSliceMut<'_>],
        flags: RecvFlags,
        block: Block,
    ) -> Result<usize, Errno> {
        let _busy = Busy::new(self);
        loop {
            let wake = {
                let gate = table::enter_gate();
                match self.access() {
                    Access::Stream(s) => {
                        // A call that may wait runs outside the gate (a
                        // fork goes ahead; the waiting thread keeps the
                        // connection to this process, `StreamHandle::watch`).
                        if block != Block::Never {
                            drop(gate);
                        }
                        return s
                            .recv_vectored(bufs, recv_flags(flags), block)
                            .map_err(|e| errno_of(&e));
                    }
                    // A receive on a connecting socket waits for the end
                    // of the connect, and then for data.
                    Access::Connecting if block != Block::Never => self.wake_fd(),
                    Access::Connecting => return Err(libc::EAGAIN),
                    Access::Failed => return Err(self.failed(libc::ENOTCONN)),
                    Access::Lost => return Err(libc::ENOTCONN),
                    Access::Closed => return Err(libc::EBADF),
                    Access::FellBack => {
                        drop(gate);
                        return kernel_recv(self.fd, bufs, flags, block);
                    }
                }
            };
            // Writable once connected: the call goes round into the
            // stream's own wait.
            sleep_on(wake, libc::POLLIN | libc::POLLOUT, block)?;
        }
    }

    fn send(&self, bufs: &[IoSlice<'_>], flags: SendFlags, block: Block) -> Result<usize, Errno> {
        let _busy = Busy::new(self);
        loop {
            let wake = {
                let gate = table::enter_gate();
                match self.access() {
                    Access::Stream(s) => {
                        if block != Block::Never {
                            drop(gate);
                        }
                        return s
                            .send_vectored(bufs, send_flags(flags), block)
                            .map_err(|e| errno_of(&e));
                    }
                    Access::Connecting if block != Block::Never => self.wake_fd(),
                    Access::Connecting => return Err(libc::EAGAIN),
                    Access::Failed => return Err(self.failed(libc::EPIPE)),
                    Access::Lost => return Err(libc::ENOTCONN),
                    Access::Closed => return Err(libc::EBADF),
                    Access::FellBack => {
                        drop(gate);
                        let mut v = bufs.to_vec();
                        return kernel_send(self.fd, &mut v, flags, block);
                    }
                }
            };
            sleep_on(wake, libc::POLLOUT, block)?;
        }
    }

    fn shutdown(&self, how: Shutdown) -> Result<(), Errno> {
        let _g = table::enter_gate();
        let how_net = match how {
            Shutdown::Read => std::net::Shutdown::Read,
            Shutdown::Write => std::net::Shutdown::Write,
            Shutdown::Both => std::net::Shutdown::Both,
        };
        match self.access() {
            Access::Stream(s) => s.shutdown(how_net).map_err(|e| errno_of(&e)),
            Access::FellBack => {
                let h = match how {
                    Shutdown::Read => libc::SHUT_RD,
                    Shutdown::Write => libc::SHUT_WR,
                    Shutdown::Both => libc::SHUT_RDWR,
                };
                // SAFETY: the program's socket.
                if unsafe { real::shutdown(self.fd, h) } == 0 {
                    Ok(())
                } else {
                    Err(real::errno())
                }
            }
            Access::Closed => Err(libc::EBADF),
            _ => Err(libc::ENOTCONN),
        }
    }

    fn close(&self, nonblocking: bool) {
        {
            let _g = table::enter_gate();
            let mut st = self.lock();
            match std::mem::replace(&mut *st, State::Closed) {
                State::Connected => {
                    *self.closing.lock().unwrap_or_else(|p| p.into_inner()) = Some(nonblocking);
                    self.open.store(false, Ordering::SeqCst);
                }
                // The table let go of a connection that fell back to TCP:
                // the fd is the program's kernel socket now, and a call
                // that took this endpoint just before goes to it.
                State::FellBack => {
                    *st = State::FellBack;
                    return;
                }
                // A connect under way learns it from the state and stops.
                _ => return,
            }
        }
        // A data call still under way in another thread goes on with the
        // connection, as a kernel socket stays while a call uses it: the
        // last such call closes it ([`Busy`]).
        if self.calls.load(Ordering::SeqCst) == 0 {
            self.close_now();
        }
    }

    fn getsockopt(
        &self,
        level: c_int,
        name: c_int,
        value: &mut [u8],
    ) -> Option<Result<usize, Errno>> {
        // TCP_NODELAY as the program set it: the TCP connection that
        // carries SDP has it on whatever the program asked.
        if (level, name) != (libc::IPPROTO_TCP, libc::TCP_NODELAY)
            || matches!(*self.lock(), State::FellBack)
        {
            return None;
        }
        let v = c_int::from(self.nodelay()).to_ne_bytes();
        let n = value.len().min(v.len());
        value[..n].copy_from_slice(&v[..n]);
        Some(Ok(n))
    }

    fn setsockopt(&self, level: c_int, name: c_int, value: &[u8]) -> Result<(), Errno> {
        if (level, name) == (libc::SOL_SOCKET, libc::SO_OOBINLINE) {
            let on = value.iter().any(|&b| b != 0);
            let _g = table::enter_gate();
            if let Access::Stream(s) = self.access() {
                s.set_oob_inline(on);
            }
        }
        if (level, name) == (libc::SOL_SOCKET, libc::SO_SNDBUF) {
            // What the kernel made of it (twice the value, within limits).
            let _g = table::enter_gate();
            if let (Some(v), Access::Stream(s)) = (kernel_int(self.fd, level, name), self.access())
            {
                s.set_send_buffer(v.max(1) as u64);
            }
        }
        if (level, name) == (libc::IPPROTO_TCP, libc::TCP_NODELAY) {
            let on = value.iter().any(|&b| b != 0);
            self.nodelay.store(on, Ordering::Relaxed);
            self.mark(|s| {
                let _ = s.set_nodelay(on);
            });
        }
        if (level, name) == (libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT) {
            self.user_timeout.store(true, Ordering::Relaxed);
        }
        let keepalive = KEEPALIVE.iter().position(|&o| o == (level, name));
        if let Some(which) = keepalive.filter(|_| !self.user_timeout.load(Ordering::Relaxed)) {
            let v = value
                .get(..4)
                .and_then(|b| b.try_into().ok())
                .map(c_int::from_ne_bytes);
            // SO_KEEPALIVE is on for any non-zero value.
            let v = if which == 0 {
                v.map(|v| c_int::from(v != 0))
            } else {
                v
            };
            self.keepalive_deadline(which, v);
        }
        Ok(())
    }

    fn fionread(&self) -> usize {
        let _g = table::enter_gate();
        match self.access() {
            Access::Stream(s) => usize::try_from(s.bytes_readable()).unwrap_or(usize::MAX),
            Access::FellBack => {
                let mut v: c_int = 0;
                // SAFETY: FIONREAD into a local int.
                unsafe { real::ioctl(self.fd, libc::FIONREAD, (&mut v as *mut c_int) as u64) };
                v.max(0) as usize
            }
            _ => 0,
        }
    }

    fn at_mark(&self) -> bool {
        let _g = table::enter_gate();
        match self.access() {
            Access::Stream(s) => s.at_mark(),
            _ => false,
        }
    }

    fn take_error(&self) -> Option<Errno> {
        let _g = table::enter_gate();
        match self.access() {
            Access::Stream(s) => s.take_error().ok().flatten().map(|e| errno_of(&e)),
            Access::Failed => {
                let e = self.failed(0);
                (e != 0).then_some(e)
            }
            _ => None,
        }
    }

    fn stats(&self) -> Option<Stats> {
        use crate::sdp::Messages;
        let _g = table::enter_gate();
        // The stream's figures as of its last unlock: read without its
        // lock (`SdpStream::counters`). Reading them is not a use: no
        // claim.
        let i = match &*self.lock() {
            // Another process goes on with it: nothing to report.
            State::Connected if self.own.lost() => return None,
            State::Connected => match self.live.get() {
                Some(s) => s.counters(),
                None => return None,
            },
            _ => {
                return Some(Stats {
                    tx_mode: Mode::Combined,
                    rx_mode: Mode::Combined,
                    bytes: Counters::default(),
                    messages: Messages::default(),
                    local_credits: 0,
                    remote_credits: 0,
                    same_host: 0,
                })
            }
        };
        Some(Stats {
            tx_mode: i.send_mode.map_or(Mode::Combined, mode),
            rx_mode: i.recv_mode.map_or(Mode::Combined, mode),
            bytes: Counters {
                bcopy_tx: i.zcopy.bcopy_sent,
                bcopy_rx: i.zcopy.bcopy_received,
                read_zcopy_tx: i.zcopy.read_zcopy_sent,
                read_zcopy_rx: i.zcopy.read_zcopy_received,
                write_zcopy_tx: i.zcopy.write_zcopy_sent,
                write_zcopy_rx: i.zcopy.write_zcopy_received,
                bcopy_tx_direct: i.copies.bytes_sent_direct,
                bcopy_rx_direct: i.copies.bytes_received_direct,
                rx_copied: i.copies.bytes_copied_from_pool,
                rx_copied_back: i.copies.bytes_copied_back,
                same_host_tx: i.copies.bytes_sent_local,
                same_host_rx: i.copies.bytes_received_local,
                waits_polled: i.waits_polled,
                waits_slept: i.waits_slept,
            },
            messages: Messages {
                src_avails: i.zcopy.src_avails,
                sink_avails: i.zcopy.sink_avails,
                send_sms: i.zcopy.send_sms,
                cancels: i.zcopy.cancels,
                mode_changes: i.zcopy.mode_changes,
            },
            // Buffers advertised to the peer: its send credit.
            local_credits: clamp_u32(i.remote_credit),
            remote_credits: clamp_u32(i.send_credit),
            same_host: u32::try_from(i.local).unwrap_or(0),
        })
    }

    fn fork_prepare(&self, in_use: bool) {
        // The fork gate is closed: no lock is held by another thread.
        if matches!(*self.lock(), State::Connected) {
            self.own.fork_prepare(in_use);
            if let Some(s) = self.live.get() {
                s.revoke_local();
            }
        }
    }

    fn fork_failed(&self) {
        self.own.fork_failed();
    }

    fn fork_parent(&self) {
        if self.own.is_pending() {
            if let (State::Connected, Some(s)) = (&*self.lock(), self.live.get()) {
                s.pause_progress();
            }
        }
    }

    fn fork_child(&self) {
        self.own.fork_child();
        // The threads that were in calls are not in the child.
        self.calls.store(0, Ordering::SeqCst);
        // A connect under way goes on in the parent (its service thread).
        let mut st = self.lock();
        // Only a connection this process may claim forgets the parent's
        // waiters: one the parent keeps (a thread of the parent used it
        // across the fork, a Zcopy call with the stream's lock held, say)
        // is never touched here, its lock perhaps held for good.
        if let (State::Connected, Some(s), true) = (&*st, self.live.get(), self.own.is_pending()) {
            s.forget_waiters();
        }
        if matches!(*st, State::Connecting { .. }) {
            self.own.lose();
            *st = State::Failed {
                errno: libc::ECONNABORTED,
                reported: false,
                _levels: None,
            };
        }
    }

    fn flush_at_exit(&self, _deadline: Instant) {
        // Exit closes the fd: a graceful close, which the backend's
        // `exiting` then waits for with the others — if this process owns
        // the connection or holds the last copy after a fork (another
        // holder goes on, or finds this process gone when it lets go).
        let resume = match self.own.release() {
            Release::Close { resume } => resume,
            Release::LetGo | Release::Watch => return,
        };
        let stream = {
            let _g = table::enter_gate();
            let mut st = self.lock();
            match std::mem::replace(&mut *st, State::Closed) {
                State::Connected => {
                    self.open.store(false, Ordering::Release);
                    match self.live.get() {
                        Some(s) => s,
                        None => return,
                    }
                }
                other => {
                    *st = other;
                    return;
                }
            }
        };
        if resume {
            let _ = stream.resume_progress();
        }
        stream.close();
    }

    fn leave_fd(&self, fd: RawFd) {
        let _g = table::enter_gate();
        // Under the state's lock: a connect that completes meanwhile moves
        // the stream onto `fd` before or not at all.
        let _st = self.lock();
        if self.sock.load(Ordering::Relaxed) != fd {
            return;
        }
        let Some(stream) = self.live.get() else {
            return;
        };
        // SAFETY: the program's number, open until its close returns.
        let to = sdp_core::fds::dup_high(unsafe { BorrowedFd::borrow_raw(fd) });
        match to.and_then(|to| stream.move_socket(to)) {
            Ok(lent) => {
                // The program's close closes its number.
                let _ = lent.into_raw_fd();
                self.sock.store(stream.socket_fd(), Ordering::Relaxed);
            }
            Err(e) => {
                // Out of descriptors: the connection cannot outlive the
                // number, so it ends with it, reset.
                crate::log!(Level::Error, "fd {fd}: SDP connection reset at close: {e}");
                let _ = stream.set_linger(Some(Duration::ZERO));
                stream.close();
            }
        }
    }

    fn set_nonblocking(&self, on: bool) {
        self.nonblocking.store(on, Ordering::Relaxed);
        self.mark(|s| s.set_credit_bound(on));
    }

    fn kernel_fd(&self) -> Option<RawFd> {
        let fd = self.sock.load(Ordering::Relaxed);
        (fd >= 0 && self.own.owned()).then_some(fd)
    }

    fn zcopy_elsewhere(&self) -> bool {
        !self.own.lost()
            && self
                .stream_if_open()
                .is_some_and(SdpStream::zcopy_elsewhere)
    }

    fn watch_socket(&self, on: bool) -> bool {
        self.mark(|s| s.watch_socket(on))
    }

    fn watch_levels(&self, w: Arc<dyn LevelWatch>) -> bool {
        // A set that starts watching a connect under way looks first.
        if !self.open.load(Ordering::Acquire) {
            self.advance_setup();
        }
        self.mark(|s| s.watch_levels(w))
    }

    fn unwatch_levels(&self, w: &Arc<dyn LevelWatch>) {
        // Closed or not: the set lets go of the stream either way.
        let _g = table::enter_gate();
        if let Some(s) = self.live.get() {
            s.unwatch_levels(w);
        }
    }

    fn poll_socket(&self) -> bool {
        self.mark(SdpStream::poll_socket)
    }

    fn await_readiness(&self, on: bool) -> bool {
        self.mark(|s| s.await_readiness(on))
    }

    fn hold_wake(&self, on: bool) {
        let _g = table::enter_gate();
        // Under the state's lock: a connect that ends meanwhile counts
        // this hold once, before or after (`Ep::connect`).
        let _st = self.lock();
        if on {
            self.wake_holders.fetch_add(1, Ordering::SeqCst);
        } else if self
            .wake_holders
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_err()
        {
            return;
        }
        if let Some(s) = self.live.get() {
            s.hold_readiness(on);
        }
    }

    fn pump_quietly(&self) -> Pumped {
        let _g = table::enter_gate();
        match self.access() {
            Access::Stream(s) => s.pump_quietly(),
            _ => Pumped::default(),
        }
    }

    fn sync_readiness(&self) {
        self.mark(SdpStream::sync_readiness);
    }

    fn reads_in_bulk(&self) -> bool {
        let _g = table::enter_gate();
        self.stream_if_open().is_some_and(SdpStream::reads_in_bulk)
    }

    fn count_wait(&self, polled: bool) {
        self.mark(|s| s.count_wait(polled));
    }

    fn pump(&self) -> bool {
        let _g = table::enter_gate();
        match self.access() {
            Access::Stream(s) => s.pump(),
            _ => false,
        }
    }

    fn recorded(&self) -> Setup {
        let setup = self
            .connector
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        setup.map_or(Setup::InProgress, |run| run())
    }
}

/// A connection this process let go of after a fork while another
/// process held a copy (see [`super::owner`]): the service thread watches
/// the other holders.
struct Orphaned(Orphan, SdpStream);

/// How often an orphan's other holders are looked at.
const ORPHAN_LOOK: Duration = Duration::from_millis(200);

impl Task for Orphaned {
    fn advance(
        self: Box<Self>,
        now: Instant,
        _spawned: &mut Vec<Box<dyn Task>>,
    ) -> Option<(Box<dyn Task>, Wait)> {
        match self.0.step() {
            OrphanStep::Wait => Some((self, (-1, 0, Some(now + ORPHAN_LOOK)))),
            OrphanStep::LetGo => {
                self.1.detach();
                None
            }
            OrphanStep::Close => {
                // Every other holder is gone: the close they would have
                // made, graceful, by this process's progress thread.
                let Orphaned(_, stream) = *self;
                let _ = stream.resume_progress();
                stream.close();
                None
            }
        }
    }
}

/// An all-zero `msghdr` (valid: null pointers and zero lengths).
fn unsafe_zeroed_msghdr() -> libc::msghdr {
    // SAFETY: msghdr is plain data; all-zero is a valid empty header.
    unsafe { std::mem::zeroed() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sdp_core::stream::SdpListener;
    use std::io::{Read, Write};
    use std::sync::{mpsc, Arc};

    /// A connected pair of streams over loopback.
    fn pair() -> (SdpStream, SdpStream) {
        let listener = SdpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || listener.accept().unwrap().0);
        let client = SdpStream::connect(addr).unwrap();
        (client, server.join().unwrap())
    }

    /// `f`'s result, if it comes within 10 s (from another thread).
    fn within<R: Send + 'static>(f: impl FnOnce() -> R + Send + 'static) -> Option<R> {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(Duration::from_secs(10)).ok()
    }

    /// Keepalive set option by option, as a server sets it on each
    /// connection, bounds the connection at its time through
    /// TCP_USER_TIMEOUT, follows each change, and lets go of it when
    /// keepalive is turned off.
    #[test]
    fn keepalive_set_option_by_option_bounds_the_connection_at_its_time() {
        let (client, _server) = pair();
        let fd = client.socket_fd();
        let ep = Ep::connected(client, fd).unwrap();
        let set = |level, name, v: c_int| {
            // The hook: the kernel takes the option, then the endpoint.
            // SAFETY: an int option on our socket.
            let r = unsafe {
                real::setsockopt(
                    fd,
                    level,
                    name,
                    (&v as *const c_int).cast(),
                    std::mem::size_of::<c_int>() as libc::socklen_t,
                )
            };
            assert_eq!(r, 0);
            ep.setsockopt(level, name, &v.to_ne_bytes()).unwrap();
            kernel_int(fd, libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT).unwrap()
        };
        let defaults = |o| kernel_int(fd, libc::IPPROTO_TCP, o).unwrap();
        let (intvl, cnt) = (defaults(libc::TCP_KEEPINTVL), defaults(libc::TCP_KEEPCNT));
        assert_eq!(
            set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 7),
            defaults(libc::TCP_KEEPIDLE) * 1000 + intvl * cnt * 1000
        );
        assert_eq!(
            set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 30),
            (30 + intvl * cnt) * 1000
        );
        assert_eq!(
            set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 5),
            (30 + 5 * cnt) * 1000
        );
        assert_eq!(set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3), 45_000);
        assert_eq!(set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 4), 50_000);
        assert_eq!(set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 0), 0);
        assert_eq!(set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1), 50_000);
        // The program's own timeout is left alone from then on.
        assert_eq!(set(libc::IPPROTO_TCP, libc::TCP_USER_TIMEOUT, 1234), 1234);
        assert_eq!(set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 60), 1234);
    }

    /// A close while another thread's data call is under way leaves the
    /// connection to that call, as a kernel socket stays while a call
    /// uses it: the call gets the bytes that come, and the connection
    /// closes when it returns (the peer then reads the end).
    #[test]
    fn a_close_waits_for_the_data_call_under_way() {
        let (client, server) = pair();
        let fd = client.socket_fd();
        let ep = Arc::new(Ep::connected(client, fd).unwrap());
        let (started, is_started) = mpsc::channel();
        let reader = {
            let ep = ep.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 16];
                // SAFETY: a plain call about the calling thread.
                started.send(unsafe { libc::gettid() }).unwrap();
                let n = ep.recv(
                    &mut [IoSliceMut::new(&mut buf)],
                    RecvFlags::default(),
                    Block::Until(Some(Instant::now() + Duration::from_secs(10))),
                );
                n.map(|n| buf[..n].to_vec())
            })
        };
        let tid = is_started.recv().unwrap();
        // Wait until the reader sleeps in its call (in poll, /proc says).
        let syscall = format!("/proc/self/task/{tid}/syscall");
        let polls = [libc::SYS_poll.to_string(), libc::SYS_ppoll.to_string()];
        let until = Instant::now() + Duration::from_secs(10);
        while !std::fs::read_to_string(&syscall)
            .unwrap_or_default()
            .split_whitespace()
            .next()
            .is_some_and(|n| polls.iter().any(|p| p == n))
        {
            assert!(Instant::now() < until, "the reader never slept in its call");
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(ep.calls.load(Ordering::SeqCst), 1);
        ep.close(false);
        // Still open: the peer's bytes reach the reader.
        (&server).write_all(b"after close").unwrap();
        assert_eq!(reader.join().unwrap(), Ok(b"after close".to_vec()));
        // Its return closed the connection: the peer reads the end.
        server
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut rest = Vec::new();
        (&server).read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "{rest:?}");
        // A call after the close finds it closed.
        let mut buf = [0u8; 4];
        let r = ep.recv(
            &mut [IoSliceMut::new(&mut buf)],
            RecvFlags::default(),
            Block::Never,
        );
        assert_eq!(r, Err(libc::EBADF));
    }

    /// The child of a fork that caught a thread of the parent inside a
    /// call on the connection (so the parent keeps it) inherits the
    /// stream's lock as that thread held it: nothing in the child may
    /// wait for it. The child's service thread publishing statistics did,
    /// and every nonblocking connect of the child after that waited for
    /// ever (the soak's busy-fork client).
    #[test]
    fn a_copy_the_parent_kept_across_a_fork_is_never_locked() {
        let (client, _server) = pair();
        let held = client.try_clone().unwrap();
        let fd = held.socket_fd();
        let ep = Arc::new(Ep::connected(client, fd).unwrap());
        // A thread waits on the connection at the fork: the parent keeps
        // it, the child's copy is lost...
        ep.fork_prepare(true);
        ep.fork_child();
        // ...with the lock that thread held at the fork.
        let lock = held.hold_lock();
        let e = ep.clone();
        let seen = within(move || {
            (
                e.stats().is_none(),
                e.zcopy_elsewhere(),
                e.wake_fd(),
                e.readiness().writable,
            )
        });
        assert_eq!(seen, Some((true, false, fd, true)));
        drop(lock);
        // The connection this process drives still reports.
        let (client, _server) = pair();
        let ep = Ep::connected(client, fd).unwrap();
        assert!(ep.stats().is_some());
    }
}
