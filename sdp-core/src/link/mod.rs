//! The link: an SDP connection ([`Conn`]) carried by an iWARP connection
//! ([`iwarp::engine::Connection`]), still sans-IO (DESIGN §3.1, §4, §7).
//!
//! A [`Link`] is the adapter that [`crate::verbs`] describes. It owns the
//! [`Conn`] and the send [`staging`]; the iWARP connection stays outside
//! (a test harness owns it, or the I/O driver does) and is passed to
//! [`Link::drive`]. What it does:
//!
//! * **Setup** (draft §8.1.1 in Streaming Mode, RFC 6581): the Connecting
//!   Peer's Hello ([`Link::hello`]) is the ULP private data of the MPA
//!   Request, after the 4 octets of IRD/ORD the startup machine puts
//!   first; the receive buffers are posted before the Request can be
//!   answered. The Accepting Peer parses the Hello from the Request
//!   ([`Link::accept`]), posts its buffers and accepts the MPA connection,
//!   or rejects it when the Hello is refused; it reports
//!   [`Event::Established`] only when the initiator's RTR has been received
//!   (RFC 5044 §7.1.2 rule 4), so the HelloAck is its first FPDU.
//! * **Verbs**: [`Op::PostRecv`] becomes a receive of a whole pool buffer
//!   (region = buffer index of [`LinkMemory`]), so the engine places each
//!   message straight into the pool; [`Op::Send`] becomes an RDMAP Send of
//!   the kind asked (§14.2) with a gather list: the header from a staging
//!   slot, then the payload from the staging ring or, during a direct
//!   send, from the caller's buffer. Completions come back in order as
//!   [`Event::RecvDone`] / [`Event::SendDone`].
//! * **Failures**: a Terminate sent or received, an MPA reject, a startup
//!   failure or an LLP reset become [`Event::TransportError`]; the end of
//!   the peer's byte stream ([`Link::llp_closed`]) becomes
//!   [`Event::TransportClosed`] — each after every completion that came
//!   before it.
//! * **Teardown**: the connection's last Op is kept in [`Link::teardown`]
//!   for the I/O layer: graceful = FIN once everything queued is written;
//!   abortive = reset now.
//!
//! # Copies (DESIGN §7)
//!
//! The caller's buffer is lent to the engine for the length of one call
//! ([`direct`]), as an extra region of [`LinkMemory`]; no `unsafe` needed.
//!
//! * Send ([`Link::send_direct`], what `SdpStream::write` uses): the Data
//!   Messages refer to the caller's bytes, the driver writes what the
//!   socket takes straight from them (CRC computed over them once), and
//!   [`Link::finish_direct`] copies into the staging ring only the bytes
//!   still referred to by unwritten FPDUs or not yet posted (no credit),
//!   moving the engine's references there ([`iwarp::engine::Rebase`]). The
//!   progress thread sends those later. [`Link::send`] still copies all.
//! * Receive ([`Link::lend_recv`], what a waiting `SdpStream::read` uses):
//!   when nothing is unread, the payload part of the next receive buffer
//!   is overlaid on the reader's buffer ([`iwarp::engine::RecvOverlay`]):
//!   the driver's `readv` and the CRC run over the reader's memory, the
//!   BSDH still lands in the Private Buffer, and a plain Data Message's
//!   payload counts as read at once. Otherwise (nobody waiting, MSG_PEEK,
//!   OOB data, other messages) a message lands once in a Private Buffer and
//!   [`Link::recv`] copies it once into the reader's buffer.
//!
//! [`Link::copy_stats`] counts which path each byte took.
//!
//! # Using it
//!
//! ```
//! use std::time::Instant;
//! use iwarp::engine::{Connection, Event as QpEvent};
//! use sdp_core::conn::{Config, RecvFlags, SendFlags};
//! use sdp_core::link::{connection_config, Link};
//!
//! let now = Instant::now();
//! let config = Config { bufs: 4, buf_size: 4096, ..Config::default() };
//! let mut client = Link::connect(&config);
//! let mut cq = Connection::connect(connection_config(&config), client.hello(), now).unwrap();
//! client.drive(now, &mut cq); // posts the receive buffers
//! let mut sq = Connection::listen(connection_config(&config), now);
//!
//! // Moves what `from` has queued into `to`, as a TCP connection would.
//! fn pump(from: &mut Connection, fl: &mut Link, to: &mut Connection, tl: Option<&mut Link>) {
//!     let now = Instant::now();
//!     let mut wire = Vec::new();
//!     from.poll_transmit(now, &fl.memory(), 1 << 20);
//!     from.txq().for_each_slice(&fl.memory(), |s| { wire.extend_from_slice(s); true }).unwrap();
//!     from.tx_advance(now, wire.len());
//!     match tl {
//!         Some(l) => { to.handle_input(now, &wire, &mut l.memory()); }
//!         None => { to.handle_input(now, &wire, &mut iwarp::mem::VecMemory::new()); }
//!     }
//! }
//!
//! pump(&mut cq, &mut client, &mut sq, None); // MPA Request with the Hello
//! let Some(QpEvent::ConnectRequest { private_data, .. }) = sq.poll_event() else { panic!() };
//! let mut server = Link::accept(&config, &private_data, &mut sq, now).unwrap();
//! pump(&mut sq, &mut server, &mut cq, Some(&mut client)); // MPA Reply
//! client.drive(now, &mut cq);
//! pump(&mut cq, &mut client, &mut sq, Some(&mut server)); // RTR
//! server.drive(now, &mut sq); // Established: HelloAck posted
//! pump(&mut sq, &mut server, &mut cq, Some(&mut client));
//! client.drive(now, &mut cq);
//! assert!(client.is_connected() && server.is_connected());
//!
//! assert_eq!(client.send(b"hello", SendFlags::EMPTY), Ok(5));
//! client.drive(now, &mut cq);
//! pump(&mut cq, &mut client, &mut sq, Some(&mut server));
//! server.drive(now, &mut sq);
//! let mut buf = [0; 16];
//! assert_eq!(server.recv(&mut buf, RecvFlags::EMPTY), Ok(5));
//! assert_eq!(&buf[..5], b"hello");
//! ```

pub mod direct;
pub mod local;
#[cfg(any(test, feature = "testing"))]
pub mod pair;
pub mod staging;
pub mod zcopy;

use std::collections::VecDeque;
use std::time::Instant;

use iwarp::engine::{
    Completion, Connection, ConnectionConfig, Event as QpEvent, Payload, Rebase, RecvWr,
    SendKind as QpSendKind, SendWr, Sge, State as QpState, Status, WcOpcode,
};
use iwarp::mem::{Memory, RegionId};
use iwarp::mpa::startup::StartupError;
use iwarp::wire::ddp::Stag;
use iwarp::wire::terminate::TermCode;

use crate::conn::{
    BufferPool, CloseReason, Config, Conn, CreditState, RecvFlags, Role, SendFlags, Shutdown,
    State, Violation,
};
use crate::errno::Error;
use crate::verbs::{ErrorKind, Event, Op, SendKind, Teardown, Work, WrId};
use direct::{CopyStats, SendSpan};
pub use local::Lent;
use staging::Staging;

/// A test's look at each verbs operation with the credit state before it
/// ([`Link::drive_checked`]).
type Check<'a> = &'a mut dyn FnMut(&CreditState, &Op);

/// The iWARP connection configuration for an SDP link with `config`: the
/// MPA startup's IRD and ORD are the SDP ones (§8.1.1 step 1d: LocIRD and
/// LocORD are at most the local IRD and ORD). Everything else keeps the
/// defaults (Rev 2, CRC on, markers off, all RTR options); the I/O layer
/// sets the EMSS and the STag seed.
pub fn connection_config(config: &Config) -> ConnectionConfig {
    let config = config.normalized();
    let mut cc = ConnectionConfig::default();
    cc.startup.ird = config.ird.min(0x3ffe);
    cc.startup.ord = config.ord.min(0x3ffe);
    cc
}

/// Why the Accepting Peer did not accept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcceptError {
    /// The Hello was refused (§8.1.1 step 3a); the MPA connection was
    /// rejected.
    Hello(Violation),
    /// The MPA startup refused to accept (RFC 6581 §9.1).
    Mpa(StartupError),
}

impl core::fmt::Display for AcceptError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            AcceptError::Hello(v) => write!(f, "Hello refused: {v}"),
            AcceptError::Mpa(e) => write!(f, "MPA accept failed: {e:?}"),
        }
    }
}

impl std::error::Error for AcceptError {}

/// How the LLP (the TCP connection) ended, as the I/O layer saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LlpEnd {
    /// The peer's FIN.
    Closed,
    /// Reset or another socket error.
    Failed(ErrorKind),
}

/// The memory the engine transmits from and places into: the receive
/// Private Buffers (region `i` = buffer `i`), the send [`Staging`]
/// (regions [`staging::PAYLOAD_REGION`] and [`staging::HEADER_REGION`],
/// read-only), and for the length of one call the caller's buffers
/// ([`direct::send_from`], read-only; [`direct::RECV_INTO`];
/// [`zcopy::SEND_ZCOPY`], read-only; [`zcopy::RECV_ZCOPY`]).
pub struct LinkMemory<'a> {
    pool: &'a mut BufferPool,
    staging: &'a Staging,
    send_from: Option<&'a [&'a [u8]]>,
    recv_into: Option<&'a mut [u8]>,
    zc_send: Option<&'a [u8]>,
    zc_recv: Option<&'a mut [u8]>,
}

impl Memory for LinkMemory<'_> {
    fn region(&self, id: RegionId) -> Option<&[u8]> {
        if let Some(i) = direct::send_from_index(id) {
            return self.send_from.and_then(|b| b.get(i)).copied();
        }
        match id {
            direct::RECV_INTO => self.recv_into.as_deref(),
            zcopy::SEND_ZCOPY => self.zc_send,
            zcopy::RECV_ZCOPY => self.zc_recv.as_deref(),
            _ => self
                .staging
                .region(id)
                .or_else(|| self.pool.buffer(id.0 as usize)),
        }
    }

    fn region_mut(&mut self, id: RegionId) -> Option<&mut [u8]> {
        if direct::send_from_index(id).is_some() {
            return None;
        }
        match id {
            zcopy::SEND_ZCOPY => None,
            direct::RECV_INTO => self.recv_into.as_deref_mut(),
            zcopy::RECV_ZCOPY => self.zc_recv.as_deref_mut(),
            _ if self.staging.region(id).is_some() => None,
            _ => self.pool.buffer_mut(id.0 as usize),
        }
    }

    fn region_range_mut(
        &mut self,
        id: RegionId,
        range: core::ops::Range<usize>,
    ) -> Option<&mut [u8]> {
        match id {
            // The receive Private Buffers grow as bytes land in them.
            RegionId(i) if (i as usize) < self.pool.len() => self.pool.range_mut(i as usize, range),
            _ => self.region_mut(id)?.get_mut(range),
        }
    }
}

/// Most log lines a link keeps.
const LOG_KEEP: usize = 16;

/// An SDP connection over an iWARP connection; see the module docs.
#[derive(Debug)]
pub struct Link {
    conn: Conn,
    staging: Staging,
    /// Accepting Peer: Established was reported (the RTR arrived).
    established: bool,
    /// A transport failure seen on the iWARP connection, not yet reported.
    failure: Option<Event>,
    llp: Option<LlpEnd>,
    /// A TransportError or TransportClosed was reported to the conn.
    ended: bool,
    /// Header slots of the Sends posted, oldest first.
    sends: VecDeque<(u64, u32)>,
    teardown: Option<Teardown>,
    logged_close: bool,
    log: VecDeque<String>,
    /// A direct send in progress ([`Link::send_direct`]).
    send_span: Option<SendSpan>,
    /// The parts list of the last direct send, kept for the next one (no
    /// allocation per `write`).
    spare_parts: Vec<(RegionId, u64)>,
    /// A waiting reader's receive ([`Link::lend_recv`]).
    recv_lend: Option<direct::RecvLend>,
    /// Receive completions held while the waiting reader is away, the
    /// first one its own, with its overlay.
    deferred: VecDeque<(Completion, Option<iwarp::engine::RecvOverlay>)>,
    /// Bytes placed in the waiting reader's buffer and consumed, not yet
    /// returned to it ([`Link::take_received_direct`]).
    received_direct: usize,
    stats: CopyStats,
    /// Zcopy buffers lent and registrations ([`zcopy`]).
    zc: zcopy::ZcopyLink,
    /// When the buffers give their memory back if no byte moves before
    /// ([`GIVE_BACK_AFTER`]).
    give_back_at: Option<Instant>,
    /// [`Conn::stream_progress`] when the link last looked.
    progress: u64,
}

/// How long a connection that moves no byte keeps the memory its buffers
/// grew to: then the receive Private Buffers, the send staging and the
/// driver's scratch (see [`Link::give_back_due`]) give it back, as TCP
/// frees a socket's queues once they are read and acknowledged. They grow
/// again with use.
pub const GIVE_BACK_AFTER: std::time::Duration = std::time::Duration::from_secs(1);

/// Buffer memory at most kept without a timer: what a connection of
/// small messages holds (its buffers grow only to the messages' size).
const GIVE_BACK_ABOVE: usize = 8 * 1024;

/// Bytes the links of this process gave back since [`take_given_back`]
/// last looked: the progress thread has the allocator release them.
static GIVEN_BACK: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The bytes the links gave back since the last call.
pub fn take_given_back() -> usize {
    GIVEN_BACK.swap(0, std::sync::atomic::Ordering::Relaxed)
}

impl Link {
    fn new(conn: Conn) -> Link {
        let cap = usize::try_from(conn.config().send_buffer).unwrap_or(usize::MAX);
        Link {
            staging: Staging::new(cap),
            conn,
            established: false,
            failure: None,
            llp: None,
            ended: false,
            sends: VecDeque::new(),
            teardown: None,
            logged_close: false,
            log: VecDeque::new(),
            send_span: None,
            spare_parts: Vec::new(),
            recv_lend: None,
            deferred: VecDeque::new(),
            received_direct: 0,
            stats: CopyStats::default(),
            zc: zcopy::ZcopyLink::default(),
            give_back_at: None,
            progress: 0,
        }
    }

    /// A Connecting Peer. Create the iWARP initiator with [`Link::hello`]
    /// as its private data, then call [`Link::drive`] (which posts the
    /// receive buffers) before feeding it any input.
    pub fn connect(config: &Config) -> Link {
        Link::new(Conn::connect(config))
    }

    /// The Hello for the MPA Request's private data (Connecting Peer).
    pub fn hello(&self) -> &[u8] {
        self.conn.hello().unwrap_or_default()
    }

    /// An Accepting Peer for the MPA Request whose private data is `hello`
    /// ([`iwarp::engine::Event::ConnectRequest`] of `qp`): posts the
    /// receive buffers and accepts the MPA connection, or rejects it if the
    /// Hello is refused (§8.1.1 step 3a, DESIGN §4). The Reply carries no
    /// private data: the HelloAck follows as the first Send.
    pub fn accept(
        config: &Config,
        hello: &[u8],
        qp: &mut Connection,
        now: Instant,
    ) -> Result<Link, AcceptError> {
        let conn = match Conn::accept(config, hello) {
            Ok(conn) => conn,
            Err(v) => {
                crate::log::emit(format_args!("Hello refused, MPA reject: {v}"));
                let _ = qp.reject(&[]);
                return Err(AcceptError::Hello(v));
            }
        };
        let mut link = Link::new(conn);
        let rtr_due = now + connection_config(config).startup.timeout;
        link.conn.await_rtr(rtr_due);
        link.drive(now, qp);
        qp.accept(&[]).map_err(AcceptError::Mpa)?;
        Ok(link)
    }

    /// After [`Teardown::Resume`] (socket duplication, draft §13.1.1 step
    /// 4): the link of the new LLP connection, in place. The connection
    /// carries its streams over ([`Conn::resume`]) and the staging keeps
    /// the unsent bytes at their offsets. Create the iWARP initiator on
    /// the new TCP connection with [`Link::hello`] and drive, as after
    /// [`Link::connect`]. False (nothing changed) before the teardown.
    pub fn resume(&mut self) -> bool {
        if !self.conn.resume_in_place() {
            return false;
        }
        self.established = false;
        self.failure = None;
        self.llp = None;
        self.ended = false;
        // Every Send completed before the SuspCommAck's did.
        self.sends.clear();
        self.teardown = None;
        self.logged_close = false;
        true
    }

    /// The SDP connection.
    pub fn conn(&self) -> &Conn {
        &self.conn
    }

    /// The SDP connection, mutable (socket options such as SO_OOBINLINE).
    pub fn conn_mut(&mut self) -> &mut Conn {
        &mut self.conn
    }

    /// The memory to hand the engine (or the driver) for transmit and
    /// receive.
    pub fn memory(&mut self) -> LinkMemory<'_> {
        self.memory_with(None, None)
    }

    /// [`Link::memory`] with the caller's buffers lent for one call: the
    /// bytes of a direct send ([`Link::send_direct`]) and a waiting
    /// reader's buffer ([`Link::lend_recv`]).
    pub fn memory_with<'a>(
        &'a mut self,
        send_from: Option<&'a [&'a [u8]]>,
        recv_into: Option<&'a mut [u8]>,
    ) -> LinkMemory<'a> {
        self.memory_lent(send_from, recv_into, None, None)
    }

    /// [`Link::memory`] with every kind of caller memory lent that is:
    /// [`Link::memory_with`]'s and [`Link::memory_zcopy`]'s.
    pub fn memory_lent<'a>(
        &'a mut self,
        send_from: Option<&'a [&'a [u8]]>,
        recv_into: Option<&'a mut [u8]>,
        zc_send: Option<&'a [u8]>,
        zc_recv: Option<&'a mut [u8]>,
    ) -> LinkMemory<'a> {
        LinkMemory {
            pool: self.conn.pool_mut(),
            staging: &self.staging,
            send_from,
            recv_into,
            zc_send,
            zc_recv,
        }
    }

    /// [`Link::memory`] with the buffers of a Zcopy send
    /// ([`Link::send_zcopy`]) and receive ([`Link::post_recv_zcopy`])
    /// lent, as far as they are.
    pub fn memory_zcopy<'a>(
        &'a mut self,
        zc_send: Option<&'a [u8]>,
        zc_recv: Option<&'a mut [u8]>,
    ) -> LinkMemory<'a> {
        self.memory_lent(None, None, zc_send, zc_recv)
    }

    /// Payload bytes by the way they travelled (DESIGN §7).
    pub fn copy_stats(&self) -> CopyStats {
        CopyStats {
            // LocalData the ring received, and RDMA Reads done here.
            bytes_received_local: self.conn.local_bytes_received()
                + self.stats.bytes_received_local,
            ..self.stats
        }
    }

    /// Whether setup finished (both half-connections carry data, maybe
    /// half-closed) — what `connect`/`accept` wait for.
    pub fn is_connected(&self) -> bool {
        self.conn.state() == State::Connected
    }

    /// The LLP teardown the connection asked for, once it did: the I/O
    /// layer closes the TCP connection gracefully (FIN, after everything
    /// queued is written) or abortively (reset now).
    pub fn teardown(&self) -> Option<Teardown> {
        self.teardown
    }

    /// Why the connection closed, once it did.
    pub fn close_reason(&self) -> Option<&CloseReason> {
        self.conn.close_reason()
    }

    /// The diagnostic lines of this link (abortive closes with their rule,
    /// Terminates), oldest first; see [`crate::log`].
    pub fn log_lines(&self) -> impl Iterator<Item = &str> {
        self.log.iter().map(String::as_str)
    }

    fn log(&mut self, line: String) {
        crate::log::emit(format_args!("{line}"));
        if self.log.len() == LOG_KEEP {
            self.log.pop_front();
        }
        self.log.push_back(line);
    }

    // ----- socket calls -------------------------------------------------

    /// Offers `data`; returns how many bytes were accepted (copied into the
    /// staging ring). See [`Conn::send`] for the errors. The caller drives
    /// the link afterwards so they go out.
    pub fn send(&mut self, data: &[u8], flags: SendFlags) -> Result<usize, Error> {
        self.finish_pending_span();
        let n = self.conn.send(data.len(), flags)?;
        let at = self.conn.tx().accepted() - n as u64;
        self.staging.write(at, &data[..n]);
        self.stats.bytes_staged += n as u64;
        Ok(n)
    }

    /// Offers `data` without copying it (DESIGN §7; [`direct`]): returns
    /// how many bytes were accepted, which stay in `data` for now. The
    /// caller then drives the link and pumps the socket with
    /// [`Link::memory_with`]`(Some(&data[..n]), ..)` — the Data Messages
    /// carrying them refer to `data` — and before `data` goes away calls
    /// [`Link::finish_direct`] with the same bytes, which copies what is
    /// still needed into the staging ring. Errors as [`Conn::send`].
    pub fn send_direct(&mut self, data: &[&[u8]], flags: SendFlags) -> Result<usize, Error> {
        self.finish_pending_span();
        let data = &data[..data.len().min(direct::SEND_FROM_MAX)];
        let total: usize = data.iter().map(|b| b.len()).sum();
        let n = self.conn.send(total, flags)?;
        let end = self.conn.tx().accepted();
        if n > 0 {
            let mut left = n as u64;
            let mut parts = core::mem::take(&mut self.spare_parts);
            parts.clear();
            parts.extend(data.iter().enumerate().map(|(i, b)| {
                let len = left.min(b.len() as u64);
                left -= len;
                (direct::send_from(i), len)
            }));
            self.send_span = Some(SendSpan {
                span: end - n as u64..end,
                parts,
            });
        }
        Ok(n)
    }

    /// Ends a direct send: the bytes of `data` (what [`Link::send_direct`]
    /// accepted) that queued FPDUs still refer to, or that are not posted
    /// yet, are copied into the staging ring and the engine's references
    /// move there; the rest went to the socket during the call and was
    /// never copied.
    pub fn finish_direct(&mut self, data: &[&[u8]], qp: &mut Connection) {
        let Some(send) = self.send_span.take() else {
            return;
        };
        let span = send.span.clone();
        // The first byte still referred to; the unposted ones lie after
        // every posted one.
        let unposted = self.conn.tx().sent().clamp(span.start, span.end);
        let keep_from = send
            .parts()
            .filter_map(|(region, start, _)| {
                qp.datapath()
                    .region_low_water(region)
                    .map(|low| start + low as u64)
            })
            .fold(unposted, u64::min);
        for ((_, start, len), b) in send.parts().zip(data) {
            let lo = keep_from.max(start);
            let hi = start + len.min(b.len() as u64);
            if lo < hi {
                self.staging
                    .write(lo, &b[(lo - start) as usize..(hi - start) as usize]);
            }
        }
        self.stats.bytes_sent_direct += keep_from - span.start;
        self.stats.bytes_staged += span.end - keep_from;
        let staging = &self.staging;
        for (region, start, _) in send.parts() {
            let map = move |off: usize| {
                let pos = staging.position(start.wrapping_add(off as u64));
                (pos, staging.capacity() - pos)
            };
            qp.datapath_mut().rebase_region(&Rebase {
                from: region,
                to: staging::PAYLOAD_REGION,
                map: &map,
            });
        }
        self.spare_parts = send.parts;
    }

    /// A direct send whose [`Link::finish_direct`] never came: its bytes
    /// are gone, so what refers to them cannot be sent. Only a caller
    /// that broke the contract gets here; the engine then fails the stream
    /// on the missing memory (a local catastrophic error), never reads
    /// stale bytes.
    fn finish_pending_span(&mut self) {
        if self.send_span.take().is_some() {
            self.log("direct send not finished before the next send".to_string());
        }
    }

    /// Copies received bytes into `buf` (see [`Conn::recv`]). The caller
    /// drives the link afterwards: emptied buffers are re-posted and
    /// credited.
    pub fn recv(&mut self, buf: &mut [u8], flags: RecvFlags) -> Result<usize, Error> {
        let n = self.conn.recv(buf, flags)?;
        if !flags.contains(RecvFlags::PEEK) && !flags.contains(RecvFlags::OOB) {
            self.stats.bytes_copied_from_pool += n as u64;
        }
        Ok(n)
    }

    /// SO_SNDBUF (see [`Conn::set_send_buffer`]), at most the staging
    /// ring it was made with.
    pub fn set_send_buffer(&mut self, bytes: u64) {
        let cap = self.staging.capacity() as u64;
        self.conn.set_send_buffer(bytes.min(cap));
    }

    /// `shutdown(2)` (see [`Conn::shutdown`]).
    pub fn shutdown(&mut self, how: Shutdown) -> Result<(), Error> {
        self.conn.shutdown(how)
    }

    /// `close(2)` of the last descriptor (see [`Conn::close`]).
    pub fn close(&mut self, now: Instant) {
        self.conn.close(now)
    }

    /// Abortive close (see [`Conn::abort`]).
    pub fn abort(&mut self) {
        self.conn.abort()
    }

    /// POLLIN: data, end of stream, or an error.
    pub fn readable(&self) -> bool {
        self.conn.readable()
    }

    /// POLLOUT: a send would take at least one byte (or fail at once).
    pub fn writable(&self) -> bool {
        self.conn.writable()
    }

    /// FIONREAD.
    pub fn bytes_readable(&self) -> u64 {
        self.conn.bytes_readable()
    }

    /// SIOCATMARK.
    pub fn at_mark(&self) -> bool {
        self.conn.at_mark()
    }

    /// POLLPRI: an urgent byte waits.
    pub fn urgent_ready(&self) -> bool {
        self.conn.urgent_ready()
    }

    /// The credit state (§10), for observability and tests.
    pub fn credit_state(&self) -> CreditState {
        self.conn.credit_state()
    }

    /// The connection's timer (close timeouts) and the link's (memory
    /// given back by an idle connection); the iWARP connection has its
    /// own ([`Connection::poll_timeout`]).
    pub fn poll_timeout(&self) -> Option<Instant> {
        match (self.conn.poll_timeout(), self.give_back_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Whether the connection has been idle for [`GIVE_BACK_AFTER`] with
    /// memory to give back: the next [`Link::drive`] gives back the
    /// link's, and the I/O driver its own receive scratch.
    pub fn give_back_due(&self, now: Instant) -> bool {
        self.give_back_at.is_some_and(|t| t <= now)
    }

    /// Bytes the link's buffers hold now: the receive Private Buffers and
    /// the send staging.
    pub fn buffer_memory(&self) -> usize {
        self.conn.pool().held() + self.staging.held()
    }

    /// Lets the connection's timer take effect; drive afterwards.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.conn.handle_timeout(now)
    }

    // ----- LLP events ---------------------------------------------------

    /// The peer's byte stream ended (TCP FIN, `read` returned 0). Call it
    /// before the next [`Link::drive`].
    pub fn llp_closed(&mut self, now: Instant, qp: &mut Connection) {
        self.llp.get_or_insert(LlpEnd::Closed);
        qp.handle_llp_closed(now);
    }

    /// The TCP connection failed (reset, timeout). Call it before the next
    /// [`Link::drive`].
    pub fn llp_failed(&mut self, now: Instant, kind: ErrorKind, qp: &mut Connection) {
        self.llp.get_or_insert(LlpEnd::Failed(kind));
        qp.handle_llp_closed(now);
    }

    // ----- the adapter --------------------------------------------------

    /// Moves everything that can move between the SDP connection and the
    /// iWARP connection: events and completions in, verbs operations out.
    /// Call after every input (bytes received, a socket call, a timer).
    pub fn drive(&mut self, now: Instant, qp: &mut Connection) {
        self.drive_all(now, qp, None, Lent::default(), None)
    }

    /// [`Link::drive`] while a waiting reader lends `recv_into`
    /// ([`Link::lend_recv`]) and a call lends its memory (`sent`: the
    /// bytes of a direct send and of a Zcopy send, which a LocalData's
    /// payload may come from, and a Zcopy receive buffer).
    pub fn drive_lent(
        &mut self,
        now: Instant,
        qp: &mut Connection,
        sent: Lent<'_>,
        recv_into: Option<&[u8]>,
    ) {
        self.drive_all(now, qp, None, sent, recv_into)
    }

    /// [`Link::drive_lent`], calling `check` with the credit state before
    /// each Op is carried out (tests assert §10.5 with it).
    pub fn drive_checked(
        &mut self,
        now: Instant,
        qp: &mut Connection,
        check: &mut dyn FnMut(&CreditState, &Op),
        recv_into: Option<&[u8]>,
    ) {
        self.drive_all(now, qp, Some(check), Lent::default(), recv_into)
    }

    fn drive_all(
        &mut self,
        now: Instant,
        qp: &mut Connection,
        mut check: Option<Check<'_>>,
        mut sent: Lent<'_>,
        recv_into: Option<&[u8]>,
    ) {
        while let Some(ev) = qp.poll_event() {
            self.on_qp_event(ev);
        }
        if self.conn.role() == Role::Accepting
            && !self.established
            && qp.state() == QpState::Rts
            && !qp.datapath().awaiting_first_fpdu()
        {
            // RFC 5044 §7.1.2 rule 4 is met: the RTR arrived, the HelloAck
            // may be our first FPDU (DESIGN §4).
            self.established = true;
            self.conn.handle_event(now, Event::Established);
        }
        while let Some(c) = qp.datapath_mut().poll_completion() {
            if c.opcode == WcOpcode::Recv && self.lent_completion(now, &c, qp, recv_into) {
                continue;
            }
            self.on_completion(now, c);
        }
        // A transport end comes after the completions held for a reader.
        if !self.ended && self.deferred.is_empty() {
            let end = self.failure.take().or(match self.llp {
                Some(LlpEnd::Closed) => Some(Event::TransportClosed),
                Some(LlpEnd::Failed(kind)) => Some(Event::TransportError(kind)),
                None => None,
            });
            if let Some(ev) = end {
                self.ended = true;
                self.conn.handle_event(now, ev);
            }
        }
        if self.give_back_due(now) {
            self.give_back_at = None;
            self.give_back(qp);
        }
        if let Some(offer) = self.conn.local_offer_to_check() {
            let result = local::check(&offer);
            if let Err(why) = result {
                self.log(format!("same-host path not taken: {why}"));
            }
            self.conn.local_checked(result);
        }
        loop {
            // Only a checking caller pays for the snapshot.
            let before = check.as_ref().map(|_| self.conn.credit_state());
            match self.conn.poll_work_at(now) {
                None => break,
                Some(Work::Op(op)) => {
                    if let (Some(check), Some(before)) = (check.as_mut(), &before) {
                        check(before, &op);
                    }
                    self.execute(op, qp, &sent);
                }
                Some(Work::Rdma(op)) => self.execute_rdma(now, op, qp, &mut sent),
            }
        }
        let progress = self.conn.stream_progress();
        if progress != self.progress {
            self.progress = progress;
            if self.buffer_memory() > GIVE_BACK_ABOVE {
                self.give_back_at = Some(now + GIVE_BACK_AFTER);
            }
        }
        if !self.logged_close {
            if let Some(reason) = self.conn.close_reason() {
                self.logged_close = true;
                if *reason != CloseReason::Graceful {
                    let line = reason.to_string();
                    self.log(line);
                }
            }
        }
    }

    /// Gives back the memory of the buffers that hold nothing needed: the
    /// receive Private Buffers once every message was read, but for those
    /// the engine may be placing into; the send staging once every byte
    /// accepted was released and nothing refers to it.
    fn give_back(&mut self, qp: &Connection) {
        let before = self.buffer_memory();
        let dp = qp.datapath();
        if self.conn.rx_unread() == 0
            && self.deferred.is_empty()
            && self.recv_lend.is_none()
            && dp.completions() == 0
        {
            let busy: Vec<usize> = dp.recv_regions_busy().map(|r| r.0 as usize).collect();
            self.conn.pool_mut().give_back(|i| busy.contains(&i));
        }
        if self.conn.tx().buffered() == 0
            && self.sends.is_empty()
            && self.send_span.is_none()
            && dp.region_low_water(staging::PAYLOAD_REGION).is_none()
            && dp.region_low_water(staging::HEADER_REGION).is_none()
        {
            self.staging.give_back();
        }
        let freed = before - self.buffer_memory();
        GIVEN_BACK.fetch_add(freed, std::sync::atomic::Ordering::Relaxed);
    }

    fn on_qp_event(&mut self, ev: QpEvent) {
        let kind = match ev {
            QpEvent::Established { .. } => {
                // The Connecting Peer waits for the HelloAck instead; the
                // Accepting Peer waits for the RTR (see drive).
                return;
            }
            QpEvent::ConnectRequest { .. } => return,
            QpEvent::Rejected { .. } => ErrorKind::Refused,
            QpEvent::TerminateSent(info) => {
                self.log(format!("iWARP Terminate sent: {}", info.code));
                ErrorKind::Terminated
            }
            QpEvent::TerminateReceived(info) => {
                self.log(format!("iWARP Terminate received: {}", info.code));
                ErrorKind::Terminated
            }
            QpEvent::Failed(code) => match self.llp {
                Some(LlpEnd::Closed) => {
                    self.failure.get_or_insert(Event::TransportClosed);
                    return;
                }
                Some(LlpEnd::Failed(kind)) => kind,
                // RFC 5044 §8 code 1 before we heard from the LLP: during
                // the MPA startup, its timer expired; once connected, the
                // driver saw the TCP connection fail (a reset) before
                // telling us how.
                None if code == TermCode::MPA_CONNECTION_LOST => {
                    if self.is_connected() {
                        ErrorKind::Reset
                    } else {
                        ErrorKind::TimedOut
                    }
                }
                None => {
                    self.log(format!("iWARP connection failed: {code}"));
                    ErrorKind::Terminated
                }
            },
        };
        self.failure.get_or_insert(Event::TransportError(kind));
    }

    fn on_completion(&mut self, now: Instant, c: Completion) {
        if c.status != Status::Success {
            // The stream failed; its event says why (RFC 5040 §6.2.1).
            return;
        }
        match c.opcode {
            WcOpcode::Recv => {
                let len = c.byte_len as usize;
                let wr_id = WrId(c.wr_id);
                let ev = match c.invalidated {
                    // RFC 5040 §4.3: the peer invalidated our STag with
                    // this message (a final RdmaRdCompl or RdmaWrCompl).
                    Some(stag) => Event::RecvInvalidate {
                        wr_id,
                        len,
                        stag: stag.0,
                    },
                    None => Event::RecvDone { wr_id, len },
                };
                self.conn.handle_event(now, ev);
            }
            WcOpcode::Send => {
                if let Some((_, slot)) = self.sends.pop_front() {
                    self.staging.free_header(slot);
                }
                self.conn.handle_event(
                    now,
                    Event::SendDone {
                        wr_id: WrId(c.wr_id),
                    },
                );
            }
            // In Send Queue order with the Sends (RFC 5040 §5.5).
            WcOpcode::Write => self.conn.handle_event(
                now,
                Event::WriteDone {
                    wr_id: WrId(c.wr_id),
                },
            ),
            WcOpcode::Read => self.conn.handle_event(
                now,
                Event::ReadDone {
                    wr_id: WrId(c.wr_id),
                },
            ),
        }
    }

    fn execute(&mut self, op: Op, qp: &mut Connection, sent: &Lent<'_>) {
        match op {
            Op::PostRecv { wr_id, buf } => {
                let wr = RecvWr {
                    wr_id: wr_id.0,
                    sge: Sge {
                        region: RegionId(buf as u32),
                        offset: 0,
                        len: self.conn.pool().buf_size(),
                    },
                };
                // Refused only once the stream failed; its event follows.
                let _ = qp.datapath_mut().post_recv(wr);
            }
            Op::Send {
                wr_id,
                kind,
                mut header,
                payload,
                local,
            } => {
                let mut sges = qp.datapath().sge_list();
                let mut inline = true;
                let mut payload = payload;
                if let Some(at) = local {
                    match self.write_local(at, payload.clone(), sent) {
                        Ok(()) => {
                            inline = false;
                            self.stats.bytes_sent_local += payload.end - payload.start;
                        }
                        Err(why) => {
                            if let Some(why) = why {
                                self.log(format!("same-host path left: {why}"));
                            }
                            (header, payload) = self.conn.local_refused(&header, payload, why);
                        }
                    }
                }
                let slot = self.staging.alloc_header(&header);
                sges.push(self.staging.header_sge(slot, header.len()));
                if inline {
                    self.payload_sges(payload, &mut sges);
                }
                let kind = match kind {
                    SendKind::Send => QpSendKind::Send,
                    SendKind::SendSe => QpSendKind::SendSe,
                    SendKind::SendInvalidate(s) => QpSendKind::SendInvalidate(Stag(s)),
                    SendKind::SendSeInvalidate(s) => QpSendKind::SendSeInvalidate(Stag(s)),
                };
                let wr = SendWr {
                    wr_id: wr_id.0,
                    kind,
                    payload: Payload::Sges(sges),
                    signaled: true,
                };
                if qp.datapath_mut().post_send(wr).is_ok() {
                    self.sends.push_back((wr_id.0, slot));
                } else {
                    self.staging.free_header(slot);
                }
            }
            Op::Teardown(t) => self.teardown = Some(t),
        }
    }
}

#[cfg(test)]
mod tests;
