//! The I/O driver: an iWARP [`Connection`] over a kernel TCP socket.
//!
//! [`Endpoint`] owns a connected [`TcpStream`] and the sans-IO
//! [`Connection`] (MPA startup, then the FPDU/DDP/RDMAP data path) and
//! moves bytes between them. It never blocks in the pump calls: the socket
//! is nonblocking, and the caller waits on [`Endpoint::raw_fd`] with
//! poll/epoll (or uses [`Endpoint::drive_until`], which does).
//!
//! * **Transmit** ([`Endpoint::pump_send`]): `poll_transmit` frames up to
//!   [`TX_BUDGET`] octets as a gather list — engine-made headers, markers
//!   and CRCs plus references into the caller's [`Memory`] — which goes
//!   to `sendmsg` as iovecs without a copy (DESIGN §3.2, §7). Partial
//!   writes are normal: `tx_advance` takes what the kernel took. The CRC
//!   was computed over the payload where it lies, so that memory must not
//!   change until written.
//! * **Receive** ([`Endpoint::pump_recv`]): when the engine says the next
//!   octets are payload for a known place ([`RecvTarget::Place`]), they are
//!   read straight into that memory with one `readv` whose second buffer
//!   takes the octets after them (the CRC and the next header), so one
//!   large FPDU costs one system call; otherwise into a scratch buffer fed
//!   to `handle_input`. During the MPA startup exactly the peer's frame is
//!   read, never a byte past it: after a reject the rest of the stream is
//!   the ULP's, still in the socket (RFC 5044 §7.1.2 rules 2 and 3).
//! * **Framing parameters**: TCP_NODELAY is set; the EMSS is the socket's
//!   TCP_MAXSEG (RFC 5044 §5.1: "If the TCP implementation allows EMSS to
//!   be determined by MPA, that value should be used"), which replaces
//!   `cfg.emss`; a smaller EMSS is had by lowering TCP_MAXSEG before the
//!   connection is made ([`setup::tcp_connect`]). STag keys are seeded at
//!   random unless `cfg.stag_seed` is set (RFC 5040 §8.1.1 item 8).
//! * **Closing**: end of stream, a reset or a socket error is the LLP
//!   failing (RFC 5044 §8 code 1: `handle_llp_closed`). Once the stream is
//!   in error (a Terminate sent or received, a startup failure) what is
//!   queued — the Terminate — is written, then our direction of the TCP
//!   connection is shut down (RFC 5040 §5.4, RFC 5044 §8: "close the TCP
//!   connection"); reading goes on, discarded, until the peer closes too.
//!   After an MPA reject nothing is closed: the stream is the ULP's.
//! * **FPDU alignment** (RFC 5044 §5.1: senders "SHOULD also use whatever
//!   facilities the TCP stack presents to cause the TCP transmitter to
//!   start TCP segments at FPDU boundaries"): by default many FPDUs go out
//!   per `sendmsg` and Linux packs the byte stream into segments as it
//!   likes, which receivers must and do cope with (§5, §6). In aligned
//!   mode ([`Endpoint::set_aligned`]) each `sendmsg` carries one FPDU and
//!   is made only when TCP has sent everything before it (TCP_NOTSENT_LOWAT
//!   = 1 and a POLLOUT check), "a break in transmission where the TCP send
//!   buffers are emptied" after which §5.1 says alignment is regained. It
//!   costs throughput; it makes captures decodable by tools that want one
//!   FPDU per segment (docs/wire.md).
//!
//! ```
//! use std::net::TcpListener;
//! use iwarp::driver::{self, Endpoint};
//! use iwarp::engine::{ConnectionConfig, Payload, RecvWr, SendKind, SendWr, Sge, WcOpcode};
//! use iwarp::mem::VecMemory;
//!
//! let listener = TcpListener::bind("127.0.0.1:0")?;
//! let addr = listener.local_addr()?;
//! let server = std::thread::spawn(move || -> std::io::Result<Vec<u8>> {
//!     let mut ep = driver::accept(&listener, ConnectionConfig::default(), |_| Ok(b"hi".to_vec()))?;
//!     let mut mem = VecMemory::new();
//!     let buf = mem.add(vec![0; 64]);
//!     let sge = Sge { region: buf, offset: 0, len: 64 };
//!     ep.connection_mut().datapath_mut().post_recv(RecvWr { wr_id: 1, sge }).unwrap();
//!     let mut got = None;
//!     ep.drive_until(&mut mem, None, &mut |ep| {
//!         got = got.or_else(|| ep.connection_mut().datapath_mut().poll_completion());
//!         got.is_some()
//!     })?;
//!     Ok(mem.get(buf).unwrap()[..got.unwrap().byte_len as usize].to_vec())
//! });
//!
//! let mut ep = driver::connect(addr, ConnectionConfig::default(), b"hello")?;
//! assert_eq!(ep.established().unwrap().private_data, b"hi");
//! let mut mem = VecMemory::new();
//! ep.connection_mut()
//!     .datapath_mut()
//!     .post_send(SendWr {
//!         wr_id: 7,
//!         kind: SendKind::Send,
//!         payload: Payload::Inline(b"over iWARP".to_vec()),
//!         signaled: true,
//!     })
//!     .unwrap();
//! let mut sent = false;
//! ep.drive_until(&mut mem, None, &mut |ep| {
//!     sent |= ep.connection_mut().datapath_mut().poll_completion().is_some_and(|c| c.opcode == WcOpcode::Send);
//!     sent
//! })?;
//! assert_eq!(server.join().unwrap()?, b"over iWARP");
//! # Ok::<(), std::io::Error>(())
//! ```

pub mod setup;

use core::fmt;
use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, IoSlice, IoSliceMut};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::io::Errno;
use rustix::net::{sendmsg, SendAncillaryBuffer, SendFlags};
use socket2::SockRef;

use crate::engine::{Connection, ConnectionConfig, RecvTarget, State};
use crate::mem::Memory;
use crate::mpa::startup::StartupError;
use crate::wire::mpa::{Frame, HEADER_LEN as FRAME_HEADER_LEN};
use crate::wire::terminate::TermCode;

pub use setup::{
    accept, accept_with, connect, connect_with, respond, tcp_connect, ConnectRequest, Options,
};

/// Octets `poll_transmit` frames ahead of the socket per round: several
/// full-size FPDUs per `sendmsg`, little enough to stay in cache between
/// the CRC pass and the kernel's copy.
pub const TX_BUDGET: usize = 256 * 1024;
/// Octets sent before the first look at TCP's MSS again, and between two
/// looks after it changed ([`Endpoint::follow_emss`]); the gap doubles
/// each time it did not, up to [`EMSS_CHECK_MAX`].
const EMSS_CHECK: u64 = 1 << 20;
const EMSS_CHECK_MAX: u64 = 64 << 20;
/// Octets one [`Endpoint::pump_recv`] call reads at most, so that a busy
/// receive direction does not starve the send direction.
const RX_BUDGET: usize = 4 << 20;
/// Size of the scratch buffer (headers, small FPDUs, discarded payload)
/// at first: an idle connection, or one of small messages, never needs
/// more, and its memory is what a connection costs at rest.
const SCRATCH_MIN: usize = 256;
/// The most the scratch buffer grows to, doubling each time a read fills
/// it: a read then takes many FPDUs at once.
const SCRATCH_LEN: usize = 64 * 1024;
/// Octets read into scratch beyond what the engine asked for: the CRC, pad
/// and next header after placed payload, or a whole small FPDU. Payload
/// among them is copied, which costs less than another system call.
const READ_AHEAD: usize = 1024;
/// Octets read into scratch after a payload run shorter than
/// [`READ_AHEAD`].
const SHORT_RUN_AHEAD: usize = 16 * 1024;
/// iovecs per `sendmsg`.
const IOV: usize = 128;

/// What one pump call achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Progress {
    /// Nothing: the socket would block (or there was nothing to do).
    Idle,
    /// Octets moved or the connection changed state.
    Progressed,
    /// This direction is closed: the peer closed or reset the connection,
    /// or (sending) we shut our direction down after an error.
    Closed,
}

/// The outcome of the MPA startup, as the helpers ([`connect`],
/// [`accept`]) saw it in [`crate::engine::Event::Established`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Established {
    /// The peer's Private Data (ULP part).
    pub private_data: Vec<u8>,
    /// Local IRD after negotiation.
    pub ird: u16,
    /// Local ORD after negotiation.
    pub ord: u16,
    /// The peer's IRD as sent.
    pub peer_ird: u16,
    /// The peer's ORD as sent.
    pub peer_ord: u16,
}

/// The peer rejected the connection: carried inside the
/// [`io::ErrorKind::ConnectionRefused`] error [`connect`] returns
/// (`err.get_ref().and_then(|e| e.downcast_ref::<Rejected>())`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// The responder's Private Data.
    pub private_data: Vec<u8>,
    /// The responder's IRD.
    pub peer_ird: u16,
    /// The responder's ORD.
    pub peer_ord: u16,
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "MPA connection rejected by the peer ({} octets of private data)",
            self.private_data.len()
        )
    }
}

impl std::error::Error for Rejected {}

/// One `read` of the socket, by system call: the socket's number may be an
/// application's, which a library interposing on the C library's socket
/// calls (the SDP preload) serves itself.
fn read_socket(stream: &TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    rustix::io::read(stream, buf).map_err(io::Error::from)
}

/// An iWARP connection over a TCP socket (see the module docs).
pub struct Endpoint {
    /// Shared with a holder that polls the socket beside the endpoint
    /// ([`Endpoint::shared_stream`]): one descriptor for both.
    stream: Arc<TcpStream>,
    conn: Connection,
    scratch: Vec<u8>,
    /// Octets in `scratch[held.0..held.1]` read earlier and not yet taken
    /// by the engine.
    held: (usize, usize),
    /// The first octets of the peer's MPA frame (its length is in them).
    frame: [u8; FRAME_HEADER_LEN],
    /// Octets of the peer's MPA frame read so far.
    frame_read: usize,
    /// Octets received in all.
    rx_total: u64,
    /// Of those, octets received straight into place.
    rx_placed: u64,
    /// The peer closed or reset the connection, or reading failed.
    rx_closed: bool,
    /// Why the LLP failed, when it was not a plain end of stream.
    llp_error: Option<io::ErrorKind>,
    /// We shut our direction down (or it failed).
    tx_closed: bool,
    /// The MPA startup timed out.
    timed_out: bool,
    /// The last `pump_recv` found the socket drained.
    rx_drained: bool,
    /// [`Endpoint::rx_stopped`].
    rx_stopped: bool,
    /// The last `pump_send` found the send buffer full.
    tx_blocked: bool,
    /// Our FIN follows what is queued ([`Endpoint::set_fin_next`]).
    fin_next: bool,
    /// A write left its last segment open for the FIN (`MSG_MORE`).
    corked: bool,
    /// Octets the socket took in all.
    tx_total: u64,
    /// [`Endpoint::tx_total`] at which to look at TCP's MSS again, and the
    /// gap before the look after.
    emss_check_at: u64,
    emss_check_gap: u64,
    aligned: bool,
    pub(crate) established: Option<Established>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("stream", &self.stream)
            .field("conn", &self.conn)
            .field("rx_closed", &self.rx_closed)
            .field("tx_closed", &self.tx_closed)
            .finish_non_exhaustive()
    }
}

fn startup_error(e: StartupError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, e)
}

/// A seed for STag keys that the peer cannot predict: std's random
/// SipHash keys (from the OS once per thread, a different key for each
/// call), mixed with the time. (No process id: a system call per
/// connection for nothing the keys do not give.)
fn random_seed() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.finish()
}

/// Socket options and the parameters taken from the socket.
fn prepare(stream: &TcpStream, cfg: &mut ConnectionConfig) -> io::Result<()> {
    stream.set_nonblocking(true)?;
    // RFC 5044 §5.1: TCP_NODELAY, so that FPDUs are not held back.
    stream.set_nodelay(true)?;
    if let Ok(mss) = SockRef::from(stream).tcp_mss() {
        if mss > 0 {
            cfg.emss = mss as usize;
        }
    }
    if cfg.stag_seed == 0 {
        cfg.stag_seed = random_seed();
    }
    Ok(())
}

impl Endpoint {
    fn with(stream: TcpStream, conn: Connection) -> Endpoint {
        Endpoint {
            stream: Arc::new(stream),
            conn,
            scratch: vec![0; SCRATCH_MIN],
            held: (0, 0),
            frame: [0; FRAME_HEADER_LEN],
            frame_read: 0,
            rx_total: 0,
            rx_placed: 0,
            rx_closed: false,
            llp_error: None,
            tx_closed: false,
            timed_out: false,
            rx_drained: false,
            rx_stopped: false,
            tx_total: 0,
            emss_check_at: EMSS_CHECK,
            emss_check_gap: EMSS_CHECK,
            tx_blocked: false,
            fin_next: false,
            corked: false,
            aligned: false,
            established: None,
        }
    }

    /// Connected TCP stream → MPA initiator (the Request carrying
    /// `private_data` is queued). Sets the socket nonblocking and
    /// TCP_NODELAY, takes the EMSS from TCP_MAXSEG.
    pub fn initiator(
        stream: TcpStream,
        mut cfg: ConnectionConfig,
        private_data: &[u8],
        now: Instant,
    ) -> io::Result<Endpoint> {
        prepare(&stream, &mut cfg)?;
        let conn = Connection::connect(cfg, private_data, now).map_err(startup_error)?;
        Ok(Endpoint::with(stream, conn))
    }

    /// Accepted TCP stream → MPA responder: waits for the Request, which
    /// the connection reports as [`crate::engine::Event::ConnectRequest`];
    /// answer with `connection_mut().accept(..)` or `reject(..)`.
    pub fn responder(
        stream: TcpStream,
        mut cfg: ConnectionConfig,
        now: Instant,
    ) -> io::Result<Endpoint> {
        prepare(&stream, &mut cfg)?;
        let conn = Connection::listen(cfg, now);
        Ok(Endpoint::with(stream, conn))
    }

    /// The iWARP connection: verbs, completions, events.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The iWARP connection, mutable.
    pub fn connection_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// The TCP socket.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// The TCP socket, shared: the same descriptor, for a holder that
    /// polls it without a borrow of the endpoint.
    pub fn shared_stream(&self) -> Arc<TcpStream> {
        self.stream.clone()
    }

    /// Points the endpoint at `to`, another descriptor of the same socket,
    /// and gives back the one it had: the holder of a descriptor number
    /// that must go away (a program's `close`) keeps the connection on a
    /// number of its own.
    pub fn replace_stream(&mut self, to: Arc<TcpStream>) -> Arc<TcpStream> {
        std::mem::replace(&mut self.stream, to)
    }

    /// What the MPA startup agreed, when [`connect`] or [`accept`] ran it.
    pub fn established(&self) -> Option<&Established> {
        self.established.as_ref()
    }

    /// Aligned mode: one FPDU per `sendmsg`, each started only when TCP has
    /// sent everything before it, so that FPDUs start TCP segments (RFC
    /// 5044 §5.1; see the module docs). For captures; slower.
    pub fn set_aligned(&mut self, on: bool) -> io::Result<()> {
        // TCP_NOTSENT_LOWAT 1: POLLOUT only when nothing is unsent (0
        // restores the system default).
        SockRef::from(&self.stream).set_tcp_notsent_lowat(u32::from(on))?;
        self.aligned = on;
        Ok(())
    }

    /// Whether aligned mode is on.
    pub fn aligned(&self) -> bool {
        self.aligned
    }

    /// Whether the peer closed or reset the connection (or reading
    /// failed).
    pub fn is_closed(&self) -> bool {
        self.rx_closed
    }

    /// Octets received from the socket in all.
    pub fn rx_total(&self) -> u64 {
        self.rx_total
    }

    /// Of [`Endpoint::rx_total`], the octets received straight into their
    /// destination (payload not copied in user space).
    pub fn rx_placed(&self) -> u64 {
        self.rx_placed
    }

    /// Why the connection cannot go on, as the error a TCP program would
    /// see: [`io::ErrorKind::TimedOut`] (MPA startup timeout),
    /// `ConnectionRefused` (MPA reject, either side), `ConnectionReset` and
    /// the like (the socket failed), `UnexpectedEof` (the peer closed), or
    /// `ConnectionAborted` (the stream is in error: a Terminate was sent or
    /// received, or the startup failed; reported once what was queued is
    /// written). `None` while it can go on.
    pub fn failure(&self) -> Option<io::Error> {
        if self.timed_out {
            return Some(io::Error::new(
                io::ErrorKind::TimedOut,
                "MPA startup timed out",
            ));
        }
        if self.conn.rejected() {
            return Some(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                "MPA connection rejected",
            ));
        }
        // A Terminate (or a startup failure) is the reason even when the
        // peer closed right after it.
        let error = self
            .conn
            .datapath()
            .error()
            .filter(|(code, _)| *code != TermCode::MPA_CONNECTION_LOST);
        if let Some((code, remote)) = error {
            if self.conn.state() == State::Error && self.conn.txq().is_empty() {
                let why = if remote {
                    format!("iWARP stream terminated by the peer: {code}")
                } else {
                    format!("iWARP stream failed: {code}")
                };
                return Some(io::Error::new(io::ErrorKind::ConnectionAborted, why));
            }
        }
        if let Some(kind) = self.llp_error {
            return Some(io::Error::new(kind, "TCP connection failed"));
        }
        if self.rx_closed {
            let what = if self.conn.in_startup() || self.conn.state() == State::Idle {
                "peer closed the TCP connection during the MPA startup"
            } else {
                "peer closed the TCP connection"
            };
            return Some(io::Error::new(io::ErrorKind::UnexpectedEof, what));
        }
        if self.conn.state() == State::Error && self.conn.txq().is_empty() {
            return Some(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "iWARP stream failed",
            ));
        }
        None
    }

    /// Whether the MPA startup timed out.
    pub fn timed_out(&self) -> bool {
        self.timed_out
    }

    /// For poll/epoll by the caller: readable and (when
    /// [`Endpoint::wants_send`]) writable interest.
    pub fn raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// Whether there is something to write: octets queued, work that can
    /// be framed now, or our direction to shut down after an error. Poll
    /// for writability only then; after posting work, call
    /// [`Endpoint::pump_send`].
    pub fn wants_send(&self) -> bool {
        !self.tx_closed
            && (!self.conn.txq().is_empty() || self.conn.has_pending_tx() || self.must_shut_down())
    }

    /// Shuts our direction of the socket down (the FIN of a graceful
    /// close), unless it is already: nothing is written after it.
    pub fn shutdown_write(&mut self) {
        self.corked = false;
        if !std::mem::replace(&mut self.tx_closed, true) {
            let _ = rustix::net::shutdown(&*self.stream, rustix::net::Shutdown::Write);
        }
    }

    /// Whether our FIN follows what is queued now (a graceful close whose
    /// last message is queued): writes then leave their last segment open
    /// (`MSG_MORE`) and [`Endpoint::shutdown_write`] sends it with the
    /// FIN, one segment and one wake-up of the peer instead of two. A
    /// caller that sets it and does not shut down after the write calls
    /// [`Endpoint::uncork`]. Not in aligned mode, which waits for TCP to
    /// send each FPDU before the next.
    pub fn set_fin_next(&mut self, on: bool) {
        self.fin_next = on && !self.aligned;
    }

    /// Sends a segment a write left open for the FIN, if the FIN is not
    /// coming after all (TCP_NODELAY set again pushes what waits).
    pub fn uncork(&mut self) {
        if std::mem::replace(&mut self.corked, false) && !self.tx_closed {
            let _ = rustix::net::sockopt::set_tcp_nodelay(&*self.stream, true);
        }
    }

    /// Whether reading makes sense now (for the readable interest).
    pub fn wants_recv(&self) -> bool {
        let frame_read = self.conn.in_startup() && self.startup_want() == 0;
        !(self.rx_closed || self.conn.rejected() || frame_read)
    }

    /// The next deadline of the connection (the MPA startup timeout).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conn.poll_timeout()
    }

    /// Lets a passed deadline take effect.
    pub fn handle_timeout(&mut self, now: Instant) {
        let starting = self.conn.in_startup();
        self.conn.handle_timeout(now);
        if starting && !self.conn.in_startup() && self.conn.state() == State::Error {
            self.timed_out = true;
        }
    }

    fn must_shut_down(&self) -> bool {
        self.conn.state() == State::Error && !self.conn.rejected() && !self.tx_closed
    }

    /// Octets of the peer's MPA frame still to read; 0 once it is whole.
    fn startup_want(&self) -> usize {
        if self.frame_read < FRAME_HEADER_LEN {
            return FRAME_HEADER_LEN - self.frame_read;
        }
        // A bad header has already failed the startup in the engine.
        Frame::<&[u8]>::frame_len(&self.frame).map_or(0, |len| len.saturating_sub(self.frame_read))
    }

    /// The LLP failed or closed (RFC 5044 §8 code 1).
    fn llp_closed(&mut self, now: Instant, error: Option<io::ErrorKind>) {
        self.rx_closed = true;
        let shut = std::mem::replace(&mut self.tx_closed, true);
        if self.llp_error.is_none() {
            self.llp_error = error;
        }
        if !self.conn.rejected() {
            self.conn.handle_llp_closed(now);
        }
        if !shut {
            // Our FIN too, unless it went already (then the socket, shut
            // both ways by the peer's, would answer ENOTCONN).
            let _ = rustix::net::shutdown(&*self.stream, rustix::net::Shutdown::Both);
        }
    }

    /// Feeds `scratch[from..to]` to the engine; keeps what it does not
    /// take. Returns the octets taken.
    fn feed(&mut self, now: Instant, from: usize, to: usize, mem: &mut dyn Memory) -> usize {
        let data = &self.scratch[from..to];
        if self.conn.in_startup() {
            // Keep the frame header: its PD_Length says where the frame
            // ends.
            for &b in data {
                if self.frame_read < FRAME_HEADER_LEN {
                    self.frame[self.frame_read] = b;
                }
                self.frame_read += 1;
            }
        }
        let used = self.conn.handle_input(now, data, mem).min(to - from);
        self.held = if from + used < to {
            (from + used, to)
        } else {
            (0, 0)
        };
        used
    }

    /// A read put `n` octets into scratch: if they filled it, the socket
    /// may hold more than scratch takes, and it doubles (up to
    /// [`SCRATCH_LEN`]), keeping what it holds.
    fn grow_scratch(&mut self, n: usize) {
        let len = self.scratch.len();
        if n >= len && len < SCRATCH_LEN {
            self.scratch.resize((len * 2).min(SCRATCH_LEN), 0);
        }
    }

    /// The receive scratch buffer's size now: 256 bytes at first, up to
    /// 64 KiB after reads that filled it.
    pub fn scratch_len(&self) -> usize {
        self.scratch.len()
    }

    /// Gives back the memory the scratch buffer grew to, for a connection
    /// gone idle; it grows again with the next reads that fill it. Nothing
    /// happens while it holds octets not yet taken.
    pub fn shrink_scratch(&mut self) {
        if self.held.0 == self.held.1 && self.scratch.len() > SCRATCH_MIN {
            self.scratch = vec![0; SCRATCH_MIN];
            self.held = (0, 0);
        }
    }

    /// One read from the socket into wherever the engine wants the next
    /// octets: the octets read and the octets asked for. `Ok((0, _))` is
    /// the end of the stream.
    fn read_once(&mut self, now: Instant, mem: &mut dyn Memory) -> io::Result<(usize, usize)> {
        if self.conn.in_startup() {
            // Exactly the frame: what follows it may not be ours.
            let want = self.startup_want().min(self.scratch.len());
            let n = read_socket(&self.stream, &mut self.scratch[..want])?;
            self.feed(now, 0, n, mem);
            return Ok((n, want));
        }
        match self.conn.recv_target() {
            RecvTarget::Place {
                region,
                offset,
                len,
            } => {
                // After a short run (a small message, the tail of a large
                // one, payload between markers every 512 octets) read more
                // into scratch: a system call per run would cost more than
                // copying.
                let trail = if len < READ_AHEAD {
                    SHORT_RUN_AHEAD
                } else {
                    READ_AHEAD
                };
                let trail = trail.min(self.scratch.len());
                let read = {
                    let dst = offset
                        .checked_add(len)
                        .and_then(|end| mem.region_range_mut(region, offset..end));
                    match dst {
                        Some(dst) => Some(
                            rustix::io::readv(
                                &*self.stream,
                                &mut [
                                    IoSliceMut::new(dst),
                                    IoSliceMut::new(&mut self.scratch[..trail]),
                                ],
                            )
                            .map_err(io::Error::from)?,
                        ),
                        None => None,
                    }
                };
                match read {
                    Some(n) => {
                        let placed = n.min(len);
                        self.rx_placed += placed as u64;
                        self.conn.placed(now, placed, mem);
                        if n > len {
                            self.feed(now, 0, n - len, mem);
                        }
                        self.grow_scratch(n - placed);
                        Ok((n, len + trail))
                    }
                    None => {
                        // The memory is gone: through scratch, where the
                        // engine finds the region missing and fails the
                        // stream (local catastrophic error).
                        let max = len.min(self.scratch.len());
                        let n = read_socket(&self.stream, &mut self.scratch[..max])?;
                        self.feed(now, 0, n, mem);
                        Ok((n, max))
                    }
                }
            }
            RecvTarget::Scratch { max } => {
                let max = max.max(READ_AHEAD).min(self.scratch.len());
                let n = read_socket(&self.stream, &mut self.scratch[..max])?;
                self.feed(now, 0, n, mem);
                self.grow_scratch(n);
                Ok((n, max))
            }
        }
    }

    /// Nonblocking: reads what the socket has now — payload straight into
    /// place — and feeds the engine, until the socket would block (or a
    /// few MiB were read, to give the send direction its turn). A read
    /// that returns less than asked means the socket is drained, as
    /// epoll(7) allows for stream sockets: no further read is tried.
    ///
    /// End of stream, a reset or a socket error fail the connection (RFC
    /// 5044 §8 code 1) and return [`Progress::Closed`]; errors other than
    /// the connection going away are returned as well.
    pub fn pump_recv(&mut self, now: Instant, mem: &mut dyn Memory) -> io::Result<Progress> {
        self.pump_recv_until(now, mem, &mut |_| false)
    }

    /// [`Endpoint::pump_recv`] that stops reading once `enough` says so,
    /// asked before each read after the first: what it leaves in the
    /// socket stays there for the next pump (the socket stays readable).
    /// For a reader whose buffer is full, or a caller that only needs to
    /// know that something arrived.
    pub fn pump_recv_until(
        &mut self,
        now: Instant,
        mem: &mut dyn Memory,
        enough: &mut dyn FnMut(&Connection) -> bool,
    ) -> io::Result<Progress> {
        if self.rx_closed {
            return Ok(Progress::Closed);
        }
        let mut progressed = false;
        if self.held.0 < self.held.1 {
            let (from, to) = self.held;
            progressed |= self.feed(now, from, to, mem) > 0;
        }
        self.rx_drained = false;
        let mut budget = RX_BUDGET;
        let (mut read, mut stopped) = (false, false);
        while self.held.0 == self.held.1 && self.wants_recv() {
            if budget == 0 || (read && enough(&self.conn)) {
                stopped = true;
                break;
            }
            read = true;
            match self.read_once(now, mem) {
                Ok((0, _)) => {
                    self.llp_closed(now, None);
                    return Ok(Progress::Closed);
                }
                Ok((n, asked)) => {
                    self.rx_total += n as u64;
                    budget = budget.saturating_sub(n);
                    progressed = true;
                    if n < asked {
                        self.rx_drained = true;
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.rx_drained = true;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.llp_closed(now, Some(e.kind()));
                    return if gone(e.kind()) {
                        Ok(Progress::Closed)
                    } else {
                        Err(e)
                    };
                }
            }
        }
        if read {
            // A pump that could not read knows no better.
            self.rx_stopped = stopped;
        }
        Ok(if progressed {
            Progress::Progressed
        } else {
            Progress::Idle
        })
    }

    /// Whether the last [`Endpoint::pump_recv_until`] that read stopped
    /// before the socket was empty (it had enough, or its budget ran out):
    /// until a pump reads on, nothing but this tells that input waits there
    /// (an edge-triggered poller saw its edge already).
    pub fn rx_stopped(&self) -> bool {
        self.rx_stopped
    }

    /// Whether TCP has sent everything written so far (aligned mode):
    /// with TCP_NOTSENT_LOWAT 1, POLLOUT means no unsent octet.
    fn all_sent(&self) -> io::Result<bool> {
        let mut fds = [PollFd::new(&self.stream, PollFlags::OUT)];
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        match poll(&mut fds, Some(&zero)) {
            Ok(_) => Ok(fds[0].revents().contains(PollFlags::OUT)),
            Err(Errno::INTR) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Nonblocking: frames pending work (`poll_transmit`) and writes it
    /// with `sendmsg` (`tx_advance` by what the kernel took) until the
    /// socket would block or nothing is left. In error, once the queue
    /// (the Terminate) is written, shuts our direction down and returns
    /// [`Progress::Closed`].
    pub fn pump_send(&mut self, now: Instant, mem: &dyn Memory) -> io::Result<Progress> {
        if self.tx_closed {
            return Ok(Progress::Closed);
        }
        let mut progressed = false;
        self.tx_blocked = false;
        loop {
            if self.aligned {
                // One FPDU per write, each once TCP sent all before it.
                if self.conn.txq().is_empty() {
                    if !self.conn.has_pending_tx() || !self.all_sent()? {
                        break;
                    }
                    self.conn.poll_transmit(now, mem, 1);
                }
            } else if self.conn.txq().len() < TX_BUDGET / 2 {
                self.conn.poll_transmit(now, mem, TX_BUDGET);
            }
            if self.conn.txq().is_empty() {
                break;
            }
            let sent = {
                let mut iov = [IoSlice::new(&[]); IOV];
                let n = match self.conn.txq().fill_iovec(mem, &mut iov) {
                    Ok(n) => n,
                    Err(missing) => {
                        // Memory handed to the engine went away: the stream
                        // cannot go on consistently.
                        self.llp_closed(now, Some(io::ErrorKind::InvalidData));
                        return Err(io::Error::new(io::ErrorKind::InvalidData, missing));
                    }
                };
                let offered: usize = iov[..n].iter().map(|s| s.len()).sum();
                let flags = if self.fin_next {
                    self.corked = true;
                    SendFlags::NOSIGNAL | SendFlags::MORE
                } else {
                    SendFlags::NOSIGNAL
                };
                let r = sendmsg(
                    &self.stream,
                    &iov[..n],
                    &mut SendAncillaryBuffer::default(),
                    flags,
                );
                r.map(|sent| (sent, offered))
            };
            match sent {
                Ok((n, offered)) => {
                    self.conn.tx_advance(now, n);
                    progressed = true;
                    self.tx_total += n as u64;
                    if self.tx_total >= self.emss_check_at {
                        self.follow_emss();
                    }
                    if n < offered {
                        // The send buffer is full: the next call would
                        // only say EAGAIN.
                        self.tx_blocked = true;
                        break;
                    }
                }
                Err(Errno::AGAIN) => {
                    self.tx_blocked = true;
                    break;
                }
                Err(Errno::INTR) => {}
                Err(e) => {
                    let e = io::Error::from(e);
                    self.llp_closed(now, Some(e.kind()));
                    return if gone(e.kind()) {
                        Ok(Progress::Closed)
                    } else {
                        Err(e)
                    };
                }
            }
        }
        if self.must_shut_down() && self.conn.txq().is_empty() {
            // RFC 5040 §5.4 / RFC 5044 §8: after the Terminate, close.
            let _ = rustix::net::shutdown(&*self.stream, rustix::net::Shutdown::Write);
            self.tx_closed = true;
            return Ok(Progress::Closed);
        }
        Ok(if progressed {
            Progress::Progressed
        } else {
            Progress::Idle
        })
    }

    /// RFC 5044 §4.5: "If the TCP implementation needs to adjust EMSS
    /// ... the MULPDU value is changed accordingly." The MSS TCP reports
    /// at setup is often not the one it settles on: Linux bounds it by
    /// half the largest window the peer offered, which grows once data
    /// flows (32 KiB at the start of a loopback connection, 64 KiB soon
    /// after). Looked at again after [`EMSS_CHECK`] octets sent, and then
    /// less often while it stays.
    fn follow_emss(&mut self) {
        let changed = match SockRef::from(&self.stream).tcp_mss() {
            Ok(mss) if mss > 0 && mss as usize != self.conn.emss() => {
                self.conn.set_emss(mss as usize);
                true
            }
            _ => false,
        };
        self.emss_check_gap = match changed {
            true => EMSS_CHECK,
            false => (self.emss_check_gap * 2).min(EMSS_CHECK_MAX),
        };
        self.emss_check_at = self.tx_total + self.emss_check_gap;
    }

    /// Blocking convenience: pumps both directions — waiting in poll(2) on
    /// the socket when nothing moves, and honouring `deadline` and the
    /// connection's timers — until `done(self)` returns true.
    ///
    /// `done` is asked before anything is pumped and after every round; it
    /// typically drains completions or events into the caller's variables.
    /// Returns `Ok(())` when it says done; [`Endpoint::failure`] when the
    /// connection fails or closes first (after `done` has seen its last
    /// completions and events); [`io::ErrorKind::TimedOut`] when `deadline`
    /// passes.
    pub fn drive_until(
        &mut self,
        mem: &mut dyn Memory,
        deadline: Option<Instant>,
        done: &mut dyn FnMut(&mut Endpoint) -> bool,
    ) -> io::Result<()> {
        loop {
            if done(self) {
                return Ok(());
            }
            let now = Instant::now();
            if self.poll_timeout().is_some_and(|t| t <= now) {
                self.handle_timeout(now);
            }
            // A receive may queue Read Responses or a Terminate: send again.
            let s1 = self.pump_send(now, mem)?;
            let r = self.pump_recv(now, mem)?;
            let s2 = self.pump_send(now, mem)?;
            if done(self) {
                return Ok(());
            }
            if let Some(e) = self.failure() {
                return Err(e);
            }
            // More to do at once: octets left to read (the round's budget
            // ran out) or to write (the socket took all it was given).
            let more_rx = r == Progress::Progressed && !self.rx_drained;
            let more_tx =
                [s1, s2].contains(&Progress::Progressed) && !self.tx_blocked && self.wants_send();
            if more_rx || more_tx {
                continue;
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "deadline passed before the iWARP operation finished",
                ));
            }
            let wake = [deadline, self.poll_timeout()].into_iter().flatten().min();
            self.wait(wake.map(|w| w.saturating_duration_since(now)))?;
        }
    }

    /// Waits in poll(2) until the socket is ready for what the endpoint
    /// wants, or `timeout` passes.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<()> {
        let mut flags = PollFlags::empty();
        if self.wants_recv() {
            flags |= PollFlags::IN;
        }
        if self.wants_send() {
            flags |= PollFlags::OUT;
        }
        let ts = timeout.map(|d| Timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(d.subsec_nanos()),
        });
        let mut fds = [PollFd::new(&self.stream, flags)];
        match poll(&mut fds, ts.as_ref()) {
            Ok(_) | Err(Errno::INTR) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// Errors that mean the connection is gone, not that the caller erred.
fn gone(kind: io::ErrorKind) -> bool {
    matches!(
        kind,
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::TimedOut
            | io::ErrorKind::NotConnected
            | io::ErrorKind::UnexpectedEof
    )
}
