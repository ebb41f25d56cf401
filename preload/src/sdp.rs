//! The one interface between the hooks and the SDP data path.
//!
//! The hooks decode the program's call and translate the result: its
//! blocking rule (`O_NONBLOCK`, `MSG_DONTWAIT`, `SO_RCVTIMEO`,
//! `SO_SNDTIMEO`) becomes the call's [`Block`], the error its `errno`, and
//! `EPIPE` a `SIGPIPE` unless `MSG_NOSIGNAL`. An SDP connection gives the
//! socket semantics itself: one data call is one call of the endpoint,
//! which waits as the [`Block`] lets it (DESIGN §7 "Who owns blocking").
//! The SDP engine (`backend`, a layer above) implements these traits over
//! `sdp-core` and `abi::process::init` installs it (unless
//! `SDP_ENGINE=0`); without it every connection is TCP with the reason
//! [`TcpReason::NoEngine`]. The interface sits below the fd table, which
//! stores the endpoints, and imports nothing of the crate.
//!
//! Contract shared by every method:
//! * Only `recv` and `send` wait, as their [`Block`] lets them, and a
//!   signal handler that runs meanwhile ends the wait (`EINTR`, or the
//!   bytes moved). No other method blocks: "nothing now" is
//!   `Err(EAGAIN)`, and `poll`, `select` and `epoll` wait on the
//!   [`WakeFd`].
//! * Errors are the `errno` a TCP program expects (DESIGN §3.4): `EPIPE`
//!   after our shutdown for writing, `ECONNRESET` after a Terminate, ...
//! * The endpoint never changes the file status flags (`O_NONBLOCK`) of the
//!   application's fd: it uses `MSG_DONTWAIT` on its own socket calls, so
//!   `fcntl(F_GETFL)` keeps telling the program what it set.
//! * The endpoint does its own socket I/O with the functions of
//!   [`crate::sys::real`] (or raw syscalls), never through the hooks.
//!
//! The fd table (`table`) owns the handles: an fd number, its `dup`s and its
//! copies in forked children share one endpoint; `close` is called when the
//! last fd number of this process referring to it is closed.

use libc::c_int;
use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::{Arc, OnceLock};
use std::time::Instant;

pub use sdp_core::stream::readiness::LevelWatch;
pub use sdp_core::stream::{Block, Pumped};

/// An `errno` value.
pub type Errno = c_int;

/// Why a socket that could have been SDP is TCP (`sdp-stat`'s "why").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum TcpReason {
    None = 0,
    /// A `use tcp` rule.
    RuleTcp = 1,
    /// This build has no SDP engine installed.
    NoEngine = 2,
    /// The port mapper answered PMDeny.
    PmDeny = 3,
    /// The port mapper did not answer after the retries.
    PmTimeout = 4,
    /// ICMP port unreachable for the port mapper.
    PmUnreachable = 5,
    /// RST on the SDP port.
    Refused = 6,
    /// MPA reject.
    MpaReject = 7,
    /// The SDP Hello was refused.
    HelloReject = 8,
    /// MPA or Hello timeout.
    Timeout = 9,
    /// An internal error of the preload (logged).
    Internal = 10,
    /// Accepted on the kernel TCP listener (the peer used TCP).
    PeerTcp = 11,
}

impl TcpReason {
    /// The name used in logs and by `sdp-stat`.
    pub fn name(self) -> &'static str {
        match self {
            TcpReason::None => "-",
            TcpReason::RuleTcp => "rule-tcp",
            TcpReason::NoEngine => "no-sdp-engine",
            TcpReason::PmDeny => "pm-deny",
            TcpReason::PmTimeout => "pm-timeout",
            TcpReason::PmUnreachable => "pm-unreachable",
            TcpReason::Refused => "refused",
            TcpReason::MpaReject => "mpa-reject",
            TcpReason::HelloReject => "hello-reject",
            TcpReason::Timeout => "timeout",
            TcpReason::Internal => "internal-error",
            TcpReason::PeerTcp => "peer-tcp",
        }
    }
}

/// Readiness of a connection or listener, exactly as DESIGN §6 defines it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Readiness {
    /// Application data, EOF, an error, or (listener) a pending accept.
    /// Never set for protocol-only traffic (credit updates).
    pub readable: bool,
    /// A send would take at least one byte (or would fail at once).
    pub writable: bool,
    /// The peer shut down its sending side (`POLLRDHUP`).
    pub read_closed: bool,
    /// Both directions are closed (`POLLHUP`).
    pub hangup: bool,
    /// An error is pending (`POLLERR`; [`SdpEndpoint::take_error`]).
    pub error: bool,
    /// Out-of-band data is pending (`POLLPRI`, select's exception set).
    pub urgent: bool,
}

impl Readiness {
    /// The `poll` bits for this readiness, given the requested `events`
    /// (`POLLERR` and `POLLHUP` are reported whether asked for or not).
    pub fn poll_bits(&self, events: i16) -> i16 {
        let mut r = 0;
        if self.readable {
            r |= events & (libc::POLLIN | libc::POLLRDNORM);
        }
        if self.writable {
            r |= events & (libc::POLLOUT | libc::POLLWRNORM);
        }
        if self.read_closed {
            r |= events & (libc::POLLRDHUP | libc::POLLIN | libc::POLLRDNORM);
        }
        if self.urgent {
            r |= events & (libc::POLLPRI | libc::POLLRDBAND);
        }
        if self.hangup {
            r |= libc::POLLHUP;
        }
        if self.error {
            r |= libc::POLLERR;
        }
        r
    }
}

/// The file descriptor, owned by the endpoint, whose poll levels follow
/// its readiness, so the hooks can sleep in the kernel (`ppoll`, `epoll`)
/// next to the program's other fds.
///
/// `POLLIN` holds whenever [`Readiness::readable`] (which includes end of
/// stream and a pending error); `POLLOUT` whenever [`Readiness::writable`]
/// (which includes a closed or failed connection). Levels, exact: the fd
/// is neither readable nor writable while the connection is neither (a
/// socket pair end, `sdp_core::stream::readiness`, can say that; an eventfd
/// cannot). A listener's wake fd polls `POLLIN` while a connection waits.
///
/// `EPOLLET` sees an edge on every change of a level; a reader that
/// drains the connection until `EAGAIN` gets a new edge with new data.
pub type WakeFd = RawFd;

/// Flags of a receive the endpoint honours (the hooks turn
/// `MSG_DONTWAIT` into the call's [`Block`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RecvFlags {
    /// `MSG_PEEK`: copy without consuming.
    pub peek: bool,
    /// `MSG_OOB`: the urgent byte (`EINVAL` if none, as TCP).
    pub oob: bool,
    /// `MSG_WAITALL`: a call that may wait fills every buffer.
    pub waitall: bool,
}

/// Flags of a send the endpoint honours (the hooks turn `MSG_DONTWAIT`
/// into the call's [`Block`] and raise `SIGPIPE` unless `MSG_NOSIGNAL`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SendFlags {
    /// `MSG_OOB`: the last byte is urgent (SDP OOB, draft §6).
    pub oob: bool,
    /// `MSG_MORE` (or `TCP_CORK`): more data follows soon.
    pub more: bool,
}

/// Which directions `shutdown` closes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    Read,
    Write,
    Both,
}

/// SDP data transfer mode of one direction (draft §5.3's words).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    Combined = 1,
    Buffered = 2,
    Pipelined = 3,
}

/// Bytes moved by each mechanism, per direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    pub bcopy_tx: u64,
    pub bcopy_rx: u64,
    pub read_zcopy_tx: u64,
    pub read_zcopy_rx: u64,
    pub write_zcopy_tx: u64,
    pub write_zcopy_rx: u64,
    /// Of `bcopy_tx`, bytes written straight from the application's buffer
    /// (no staging copy, DESIGN §7).
    pub bcopy_tx_direct: u64,
    /// Of `bcopy_rx`, bytes received straight into a waiting reader's
    /// buffer (no copy from a Private Buffer, DESIGN §7).
    pub bcopy_rx_direct: u64,
    /// Received bytes copied from a Private Buffer into the reader's
    /// buffer (with `bcopy_rx_direct`, every byte read).
    pub rx_copied: u64,
    /// Bytes placed in a waiting reader's buffer that had to go back into
    /// the Private Buffer (the read ended before the message was whole): a
    /// copy on top.
    pub rx_copied_back: u64,
    /// Bytes written into the peer's ring by the same-host path
    /// (DESIGN §9), and bytes the peer wrote into ours.
    pub same_host_tx: u64,
    pub same_host_rx: u64,
    /// Waits for the peer (a blocking read, a blocking connect's setup)
    /// that ended while polling the socket
    /// (`SDP_BUSY_POLL_US`), and waits that slept.
    pub waits_polled: u64,
    pub waits_slept: u64,
}

/// Zcopy and ModeChange Messages this end sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Messages {
    pub src_avails: u64,
    pub sink_avails: u64,
    pub send_sms: u64,
    /// SrcAvailCancel and SinkAvailCancel.
    pub cancels: u64,
    pub mode_changes: u64,
}

/// What `sdp-stat` shows of a live SDP connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub tx_mode: Mode,
    pub rx_mode: Mode,
    pub bytes: Counters,
    pub messages: Messages,
    /// Receive buffers we have advertised to the peer (our credits to it).
    pub local_credits: u32,
    /// Send credits the peer has given us.
    pub remote_credits: u32,
    /// The same-host path: `sdp_core::conn::local::code`.
    pub same_host: u32,
}

/// One SDP stream connection, behind an application fd.
pub trait SdpEndpoint: Send + Sync {
    /// Current readiness (exact; see [`Readiness`]).
    fn readiness(&self) -> Readiness;
    /// The fd whose levels follow [`SdpEndpoint::readiness`] (see
    /// [`WakeFd`]). It may change once, when a nonblocking connect falls
    /// back to TCP: the fd number itself, the kernel socket, is returned
    /// from then on.
    fn wake_fd(&self) -> WakeFd;
    /// Moves received application data into `bufs` (scatter, in order),
    /// waiting as `block` lets it (DESIGN §7 "Who owns blocking"): `Ok(0)`
    /// only at EOF (or for empty `bufs`); `Err(EAGAIN)` when no data came
    /// in time, `Err(EINTR)` when a signal handler ran first.
    fn recv(
        &self,
        bufs: &mut [IoSliceMut<'_>],
        flags: RecvFlags,
        block: Block,
    ) -> Result<usize, Errno>;
    /// Takes the bytes of `bufs` (gather): all of them when `block` lets
    /// it wait (fewer only after its deadline or a signal), else what fits
    /// now; the bytes reach the peer without further calls (DESIGN §6
    /// "progress"). `Err(EAGAIN)` or `Err(EINTR)` when none went;
    /// `Err(EPIPE)` after shutdown (the hooks raise `SIGPIPE` unless
    /// `MSG_NOSIGNAL`).
    fn send(&self, bufs: &[IoSlice<'_>], flags: SendFlags, block: Block) -> Result<usize, Errno>;
    /// The program's `O_NONBLOCK`, from the start and whenever it
    /// changes: a program that waits for `POLLOUT` itself gets sends that
    /// take only what the connection can send now (see
    /// `SdpStream::set_credit_bound`).
    fn set_nonblocking(&self, _on: bool) {}
    /// `shutdown(2)`: for writing, a graceful SDP close of our direction
    /// after the queued data.
    fn shutdown(&self, how: Shutdown) -> Result<(), Errno>;
    /// The last fd number of this process referring to the endpoint is
    /// being closed. Called before the fd is closed: an endpoint that still
    /// has data to flush dups the fd and finishes in the background (honour
    /// `SO_LINGER`, which it reads from the socket; `nonblocking` is the
    /// program's `O_NONBLOCK`: a lingering close blocks only without it).
    fn close(&self, nonblocking: bool);
    /// The program is closing `fd`, one of its numbers for the endpoint
    /// (called before the kernel's `close`): a connection that runs on that
    /// very number moves to one of its own first.
    fn leave_fd(&self, _fd: RawFd) {}
    /// An option the endpoint answers itself (`SO_ERROR`, `SO_RCVBUF` as
    /// SDP buffering, `TCP_INFO`...): `Some(Ok(len written))`; `None` lets
    /// the hooks ask the kernel socket.
    fn getsockopt(
        &self,
        level: c_int,
        name: c_int,
        value: &mut [u8],
    ) -> Option<Result<usize, Errno>>;
    /// An option the kernel socket has just accepted (`TCP_NODELAY`,
    /// `SO_RCVBUF`, `SO_LINGER`, `SO_OOBINLINE`...); the kernel keeps it too,
    /// so a fallback to TCP keeps every option.
    fn setsockopt(&self, level: c_int, name: c_int, value: &[u8]) -> Result<(), Errno>;
    /// Bytes a `recv` would return now (`FIONREAD`).
    fn fionread(&self) -> usize;
    /// True when the next byte read is the urgent mark (`SIOCATMARK`).
    fn at_mark(&self) -> bool;
    /// Takes the pending error (`SO_ERROR`), e.g. the result of a
    /// nonblocking connect.
    fn take_error(&self) -> Option<Errno>;
    /// Modes, byte counters and credits for the state export; `None`
    /// for a connection another process goes on with after a fork (this
    /// process's copy has nothing to report and is not touched).
    fn stats(&self) -> Option<Stats>;
    /// Before `fork`, with every other thread kept out of the fd table
    /// (the fork gate): the connection becomes shared by two processes.
    /// `in_use`: a thread of this process waits on it (a blocking call,
    /// `poll`, `select`, `epoll_wait`), so this process keeps it.
    fn fork_prepare(&self, _in_use: bool) {}
    /// After `fork`, in the parent.
    fn fork_parent(&self) {}
    /// After a `fork` that failed (no child came).
    fn fork_failed(&self) {}
    /// Called in the child of `fork` (the only thread there): the endpoint
    /// resumes progress in this process; SDP socket duplication (draft
    /// §13, SuspComm) is its business.
    fn fork_child(&self);
    /// The connection's kernel socket (the endpoint's own descriptor), if
    /// a thread blocked in `recv` or `send` may wait on it too: when it
    /// has input, the hooks call `recv`/`send` again, which read it
    /// themselves — the data (or credits) then come without waiting for
    /// the endpoint's progress machinery to wake the thread. (The progress
    /// machinery still serves the socket: it alone waits for socket
    /// space.)
    fn kernel_fd(&self) -> Option<RawFd> {
        None
    }
    /// Another thread's Zcopy call holds the connection's socket: only it
    /// reads the socket meanwhile, so a blocked call waits on the wake fd
    /// alone (input on the socket would wake it again and again).
    fn zcopy_elsewhere(&self) -> bool {
        false
    }
    /// [`SdpEndpoint::kernel_fd`] had input: read it now (nonblocking),
    /// so that [`SdpEndpoint::readiness`] shows what arrived. True if
    /// anything moved (bytes read or written, a state change).
    fn pump(&self) -> bool {
        false
    }
    /// [`SdpEndpoint::pump`] for a waiter (`epoll_wait`, `poll`) that
    /// reports the readiness itself and whose program calls next: the wake
    /// fd may keep its levels until [`SdpEndpoint::sync_readiness`] or the
    /// next call ([`Pumped::quiet`] says whether it did).
    fn pump_quietly(&self) -> Pumped {
        Pumped {
            moved: self.pump(),
            quiet: false,
        }
    }
    /// Sets the wake fd's levels as the endpoint is now.
    fn sync_readiness(&self) {}
    /// The program's reads take a Private Buffer's worth or more (a bulk
    /// transfer): a `poll` or `select` waiting for input sleeps at once.
    fn reads_in_bulk(&self) -> bool {
        false
    }
    /// A `poll` or `select` waited for the connection's input; the wait
    /// ended while polling (`polled`) or after a sleep.
    fn count_wait(&self, _polled: bool) {}
    /// Tells `w` of the connection's levels, now and at each change
    /// ([`LevelWatch`]), instead of a wake fd: an epoll set's ready list.
    /// False (and `w` is not kept) while there is no connected stream.
    fn watch_levels(&self, _w: Arc<dyn LevelWatch>) -> bool {
        false
    }
    /// Takes back a [`SdpEndpoint::watch_levels`].
    fn unwatch_levels(&self, _w: &Arc<dyn LevelWatch>) {}
    /// An epoll set starts (`on`) or stops watching the endpoint's socket
    /// ([`SdpEndpoint::kernel_fd`]), its waiting thread calling
    /// [`SdpEndpoint::pump`] when bytes arrive: background reads of that
    /// socket may stop meanwhile. Returns whether the mark was made (only
    /// a connected stream takes one); only such a mark is taken back.
    fn watch_socket(&self, _on: bool) -> bool {
        false
    }
    /// A `poll` or `select` polls the endpoint's socket
    /// ([`SdpEndpoint::kernel_fd`]) beside its wake fd, and calls
    /// [`SdpEndpoint::pump`] when bytes arrive; background reads of that
    /// socket may stop from now on, as the program's later calls read it
    /// too. Returns whether the mark was made (only a connected stream
    /// takes one).
    fn poll_socket(&self) -> bool {
        false
    }
    /// A thread starts (`on`) or stops sleeping on the endpoint's wake fd
    /// without its socket (`poll`, `select`): background reads are needed
    /// meanwhile. Returns whether the mark was made, as
    /// [`SdpEndpoint::watch_socket`].
    fn await_readiness(&self, _on: bool) -> bool {
        false
    }
    /// A kernel wait starts (`on`) or stops reporting the endpoint's wake
    /// fd beside its socket: an epoll set's registration of it, a `poll`
    /// asleep on it. A connected stream keeps the wake fd's levels only
    /// while one does ([`SdpEndpoint::await_readiness`] counts too).
    /// Calls balance.
    fn hold_wake(&self, _on: bool) {}
    /// The hooks recorded the endpoint of [`ConnectOutcome::Started`] in
    /// the fd table: the setup goes on, to its end on this thread for a
    /// blocking connect.
    fn recorded(&self) -> Setup {
        Setup::InProgress
    }
    /// The process is exiting (`exit`, not `_exit`) with this connection
    /// open: block until the bytes accepted by `send` have reached the
    /// peer, or until `deadline` (DESIGN §6 "flush at exit").
    fn flush_at_exit(&self, deadline: Instant);
}

/// A connection the hidden SDP listener accepted.
pub struct Accepted {
    /// The connection's kernel socket, under the number `accept` returns
    /// (the endpoint's too: [`SdpEndpoint::leave_fd`] when it is closed).
    pub fd: RawFd,
    /// The peer's address as TCP would report it.
    pub peer: SocketAddr,
    /// The connection's own address (the hidden listener's port), as the
    /// stream learnt it in its setup.
    pub local: Option<SocketAddr>,
    pub endpoint: Arc<dyn SdpEndpoint>,
}

/// The hidden SDP listener beside a listening socket (DESIGN §5: it listens
/// on an ephemeral port Q and is registered P→Q with the port mapper).
pub trait SdpListener: Send + Sync {
    /// `readable` ⇔ an SDP connection is ready to be accepted, or waits in
    /// the kernel's queue for an `accept` to take it
    /// ([`SdpListener::queue_fd`]).
    fn readiness(&self) -> Readiness;
    /// [`SdpListener::readiness`] without a look at the queue, for a caller
    /// that polls [`SdpListener::queue_fd`] itself (a system call saved).
    fn readiness_beside_queue(&self) -> Readiness {
        self.readiness()
    }
    /// `POLLIN` ⇔ an SDP connection is ready to be accepted.
    fn wake_fd(&self) -> WakeFd;
    /// An answered SDP connection, or `Err(EAGAIN)`; its descriptor
    /// close-on-exec as `cloexec` asks (`accept4`'s `SOCK_CLOEXEC`).
    /// `nonblocking`: the program's call does not wait, not even for the
    /// rest of the connection's setup.
    fn accept(&self, nonblocking: bool, cloexec: bool) -> Result<Accepted, Errno>;
    /// The kernel socket whose queue holds SDP connections no process took
    /// yet: `POLLIN` while `accept` would take one from it. A set that
    /// polls the listener polls it too (epoll).
    fn queue_fd(&self) -> Option<RawFd> {
        None
    }
    /// Whether a connection taken from the queue waits in this process for
    /// its MPA Request: `poll` reported the listener readable for it, so a
    /// nonblocking `accept` waits for it a moment rather than fail with
    /// `EAGAIN`.
    fn setting_up(&self) -> bool {
        false
    }
    /// The listening fd is closed: deregister and close the hidden listener.
    fn close(&self);
    /// After `fork`, in the parent.
    fn fork_parent(&self) {}
    /// After `fork`, in the child.
    fn fork_child(&self);
    /// The process is exiting with the listener open: connections answered
    /// but not accepted are closed (as the kernel resets TCP ones).
    fn exiting(&self) {}
}

/// What `connect` on SDP led to.
pub enum ConnectOutcome {
    /// The setup started: the hooks record the endpoint in the fd table
    /// (the program's other threads see a connecting socket, never the
    /// setup's own bytes), then call [`SdpEndpoint::recorded`].
    Started(Arc<dyn SdpEndpoint>),
    /// Not SDP: the hooks connect the same fd with TCP.
    Fallback(TcpReason),
    /// SDP only and it failed: `connect` fails with this errno.
    Failed(Errno),
}

/// Where a started connect stands once its endpoint is recorded.
pub enum Setup {
    /// Nonblocking: the setup goes on in the background. The endpoint
    /// turns writable when it is up or failed and `take_error` says which
    /// (DESIGN §4); a fallback to TCP calls `table::fall_back_if`.
    InProgress,
    /// Blocking: the setup ran on the caller's thread and SDP is up.
    Sdp,
    /// Not SDP, decided before any setup: the hooks connect the same fd
    /// with TCP.
    Fallback(TcpReason),
    /// Blocking: the setup failed, and the same fd is now a TCP socket
    /// that the backend connected (or tried to) to the program's address.
    FellBack(TcpReason, Result<(), Errno>),
    /// SDP only and it failed: `connect` fails with this errno.
    Failed(Errno),
}

/// The SDP engine as the hooks see it: installed once by the integration.
pub trait SdpBackend: Send + Sync {
    /// Tries SDP for the TCP socket `fd` to `dest` (port mapper, MPA,
    /// Hello). With `sdp_only` there is no fallback.
    fn connect(
        &self,
        fd: RawFd,
        dest: SocketAddr,
        nonblocking: bool,
        sdp_only: bool,
    ) -> ConnectOutcome;
    /// The program listens on `fd` bound to `local`: open the hidden SDP
    /// listener and register it, or say why not.
    fn listen(
        &self,
        fd: RawFd,
        local: SocketAddr,
        backlog: c_int,
    ) -> Result<Arc<dyn SdpListener>, TcpReason>;
    /// Before `fork`, after every endpoint's `fork_prepare` (the fork gate
    /// is closed): the engine's own threads are kept outside their locks.
    fn fork_prepare(&self) {}
    /// After `fork`, in the parent (after every endpoint's `fork_parent`).
    fn fork_parent(&self) {}
    /// After `fork`, in the child (before every endpoint's `fork_child`).
    fn fork_child(&self) {}
    /// The process is exiting (`exit` or `_exit`), after every open
    /// endpoint's `flush_at_exit`: wait until connections the program
    /// closed finished their close, or until `deadline`.
    fn exiting(&self, _deadline: Instant) {}
    /// Endpoints waiting, after a `fork`, for the first process that uses
    /// them (0 almost always). While it is not 0, `epoll_wait` counts as a
    /// use of the SDP fds registered in the set it waits on.
    fn pending(&self) -> usize {
        0
    }
}

static BACKEND: OnceLock<&'static dyn SdpBackend> = OnceLock::new();

/// Installs the SDP engine; only the first call counts.
pub fn install_backend(backend: &'static dyn SdpBackend) -> bool {
    BACKEND.set(backend).is_ok()
}

/// The installed SDP engine, if any.
pub fn backend() -> Option<&'static dyn SdpBackend> {
    BACKEND.get().copied()
}
