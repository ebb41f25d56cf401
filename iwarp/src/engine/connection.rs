//! A whole iWARP connection over one byte stream: MPA startup (RFC 5044
//! §7.1, RFC 6581) and then the data path, with the RTR exchange.
//!
//! * The startup machine ([`crate::mpa::startup::Startup`]) consumes the
//!   peer's Request or Reply; its frames go out ahead of any FPDU through
//!   the same gather list.
//! * When it reports `Established`, the [`DataPath`] enters the Full
//!   Operation Phase with the negotiated framing, IRD and ORD. The
//!   initiator sends the negotiated RTR as its first FPDU (RFC 6581 §9.2);
//!   the responder sends no FPDU before it has received and validated one
//!   (RFC 5044 §7.1.2 rule 4) and absorbs a zero-length Send RTR without a
//!   receive buffer. Octets after the frame in the same input go straight
//!   to the data path.
//! * `Failed { send_terminate: true }` (RFC 6581 §8 codes 5, 6, 7) sends a
//!   Terminate FPDU with that code and no headers, framed as the frames
//!   exchanged so far say (our C bit, the peer's M and C bits), then the
//!   connection is in Error. Other failures (code 4: invalid frame, close
//!   the LLP; a timeout) go to Error at once.
//!
//! Work can be posted and memory registered from the start; Sends wait
//! for the Full Operation Phase, receive buffers are there for the first
//! Send the peer makes.
//!
//! ```
//! use std::time::Instant;
//! use iwarp::engine::{Connection, ConnectionConfig, Event, Payload, RecvWr, SendKind, SendWr, Sge};
//! use iwarp::mem::{Memory, VecMemory};
//!
//! let now = Instant::now();
//! let mut a = Connection::connect(ConnectionConfig::default(), b"hello", now).unwrap();
//! let mut b = Connection::listen(ConnectionConfig::default(), now);
//! let (mut ma, mut mb) = (VecMemory::new(), VecMemory::new());
//!
//! // Moves everything queued on `from` into `to`, as a socket would.
//! fn pump(from: &mut Connection, fm: &VecMemory, to: &mut Connection, tm: &mut VecMemory) {
//!     let now = Instant::now();
//!     from.poll_transmit(now, fm, 1 << 20);
//!     let mut wire = Vec::new();
//!     from.txq().for_each_slice(fm, |s| { wire.extend_from_slice(s); true }).unwrap();
//!     from.tx_advance(now, wire.len());
//!     assert_eq!(to.handle_input(now, &wire, tm), wire.len());
//! }
//!
//! pump(&mut a, &ma, &mut b, &mut mb); // MPA Request
//! assert!(matches!(b.poll_event(), Some(Event::ConnectRequest { .. })));
//! let buf = mb.add(vec![0; 64]);
//! b.datapath_mut().post_recv(RecvWr { wr_id: 1, sge: Sge { region: buf, offset: 0, len: 64 } }).unwrap();
//! b.accept(b"welcome").unwrap();
//! pump(&mut b, &mb, &mut a, &mut ma); // MPA Reply
//! assert!(matches!(a.poll_event(), Some(Event::Established { .. })));
//!
//! a.datapath_mut().post_send(SendWr {
//!     wr_id: 2,
//!     kind: SendKind::Send,
//!     payload: Payload::Inline(b"over iWARP".to_vec()),
//!     signaled: true,
//! })
//! .unwrap();
//! pump(&mut a, &ma, &mut b, &mut mb); // RTR, then the Send
//! assert_eq!(b.datapath_mut().poll_completion().unwrap().byte_len, 10);
//! assert_eq!(&mb.region(buf).unwrap()[..10], b"over iWARP");
//! ```

use core::fmt;
use std::collections::VecDeque;
use std::time::Instant;

use crate::mem::{Memory, Pd};
use crate::mpa::startup::{Negotiated, Rtr, Startup, StartupConfig, StartupError, StartupEvent};
use crate::wire::mpa::{Frame, HEADER_LEN as FRAME_HEADER_LEN, MAX_PRIVATE_DATA};
use crate::wire::terminate::TermCode;

use super::qp::{DataPath, Params, RecvTarget, RtrKind, RtrRole, State};
use super::txq::TxQueue;
use super::wr::Event;

/// Everything a connection is made with.
#[derive(Clone)]
pub struct ConnectionConfig {
    /// MPA startup parameters (CRC, markers, IRD/ORD, RTR, timeout).
    pub startup: StartupConfig,
    /// The LLP's effective MSS (RFC 5044 §5.1); changeable later with
    /// [`Connection::set_emss`].
    pub emss: usize,
    /// The protection domain of the queue pair.
    pub pd: Pd,
    /// Seed for STag keys (RFC 5040 §8.1.1 item 8); the driver passes a
    /// random one.
    pub stag_seed: u64,
}

// By hand, so as to need nothing of `StartupConfig` but its fields.
impl fmt::Debug for ConnectionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionConfig")
            .field("crc", &self.startup.crc)
            .field("markers", &self.startup.markers)
            .field("ird", &self.startup.ird)
            .field("ord", &self.startup.ord)
            .field("emss", &self.emss)
            .field("pd", &self.pd)
            .finish_non_exhaustive()
    }
}

impl Default for ConnectionConfig {
    fn default() -> ConnectionConfig {
        ConnectionConfig {
            startup: StartupConfig::default(),
            emss: 1460,
            pd: Pd(0),
            stag_seed: 0,
        }
    }
}

/// What a connection keeps of its config.
struct Parts {
    emss: usize,
    pd: Pd,
    stag_seed: u64,
    crc: bool,
    markers: bool,
}

impl Parts {
    fn of(cfg: &ConnectionConfig) -> Parts {
        Parts {
            emss: cfg.emss,
            pd: cfg.pd,
            stag_seed: cfg.stag_seed,
            crc: cfg.startup.crc,
            markers: cfg.startup.markers,
        }
    }
}

/// Which end of the MPA startup we are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Sent the MPA Request.
    Initiator,
    /// Answers it.
    Responder,
}

/// An iWARP connection: MPA startup, then a [`DataPath`].
pub struct Connection {
    role: Role,
    /// Boxed: an established connection keeps only the pointer.
    startup: Option<Box<Startup>>,
    dp: DataPath,
    emss: usize,
    our_crc: bool,
    our_markers: bool,
    /// The first octets of the peer's frame: its M and C bits frame a
    /// Terminate sent on a startup failure.
    peer_frame: [u8; FRAME_HEADER_LEN],
    peer_frame_len: usize,
    events: VecDeque<Event>,
    /// The stream left iWARP (rejected): later octets are the ULP's.
    left: bool,
}

impl fmt::Debug for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Connection")
            .field("role", &self.role)
            .field("in_startup", &self.startup.is_some())
            .field("dp", &self.dp)
            .finish_non_exhaustive()
    }
}

fn rtr_kind(r: Rtr) -> RtrKind {
    match r {
        Rtr::Send => RtrKind::Send,
        Rtr::Write => RtrKind::Write,
        Rtr::Read => RtrKind::Read,
    }
}

impl Connection {
    fn with(role: Role, startup: Startup, cfg: Parts) -> Connection {
        let mut c = Connection {
            role,
            startup: Some(Box::new(startup)),
            dp: DataPath::new(cfg.pd, cfg.stag_seed),
            emss: cfg.emss,
            our_crc: cfg.crc,
            our_markers: cfg.markers,
            peer_frame: [0; FRAME_HEADER_LEN],
            peer_frame_len: 0,
            events: VecDeque::new(),
            left: false,
        };
        c.drive_startup();
        c
    }

    /// The initiator: the MPA Request carrying `private_data` is queued.
    pub fn connect(
        cfg: ConnectionConfig,
        private_data: &[u8],
        now: Instant,
    ) -> Result<Connection, StartupError> {
        let parts = Parts::of(&cfg);
        let startup = Startup::initiator(cfg.startup, private_data, now)?;
        Ok(Connection::with(Role::Initiator, startup, parts))
    }

    /// The responder: waits for the MPA Request, reports
    /// [`Event::ConnectRequest`], then [`Connection::accept`] or
    /// [`Connection::reject`].
    pub fn listen(cfg: ConnectionConfig, now: Instant) -> Connection {
        let parts = Parts::of(&cfg);
        Connection::with(Role::Responder, Startup::responder(cfg.startup, now), parts)
    }

    /// Responder: accepts the connection with `private_data` in the Reply.
    pub fn accept(&mut self, private_data: &[u8]) -> Result<(), StartupError> {
        let r = match &mut self.startup {
            Some(s) => s.accept(private_data),
            None => return Ok(()),
        };
        self.drive_startup();
        r
    }

    /// Responder: rejects the connection (RFC 5044 §7.1.2 rule 2: a Reply
    /// with R set; the LLP is left open).
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), StartupError> {
        let r = match &mut self.startup {
            Some(s) => s.reject(private_data),
            None => return Ok(()),
        };
        self.drive_startup();
        if r.is_ok() {
            self.dp.abandon();
            self.left = true;
        }
        r
    }

    /// Responder, before [`Connection::accept`] or [`Connection::reject`]:
    /// changes our M (Markers wanted in what we receive) and C bits (see
    /// [`Startup::set_framing`]).
    pub fn set_framing(&mut self, markers: bool, crc: bool) -> Result<(), StartupError> {
        let Some(s) = &mut self.startup else {
            return Err(StartupError::InvalidState(
                crate::mpa::startup::State::FullOperation,
            ));
        };
        s.set_framing(markers, crc)?;
        self.our_markers = markers;
        self.our_crc = crc;
        Ok(())
    }

    /// Whether the stream left iWARP: the MPA startup was rejected (by
    /// either end). The LLP stays open and what follows on it is the
    /// ULP's (RFC 5044 §7.1.2 rules 2 and 3).
    pub fn rejected(&self) -> bool {
        self.left
    }

    /// Whether the MPA startup is still running (neither established,
    /// rejected nor failed).
    pub fn in_startup(&self) -> bool {
        self.startup.is_some()
    }

    /// Whether [`Connection::poll_transmit`] would queue octets now (see
    /// [`DataPath::has_pending_tx`]); queued octets are in
    /// [`Connection::txq`].
    pub fn has_pending_tx(&self) -> bool {
        self.startup.is_none() && self.dp.has_pending_tx()
    }

    /// Our role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The state: [`State::Idle`] during the MPA startup, then as the data
    /// path's.
    pub fn state(&self) -> State {
        self.dp.state()
    }

    /// The data path (registration table, limits, counters).
    pub fn datapath(&self) -> &DataPath {
        &self.dp
    }

    /// The data path, mutable.
    pub fn datapath_mut(&mut self) -> &mut DataPath {
        &mut self.dp
    }

    /// Pulls the startup machine's frames and events.
    fn drive_startup(&mut self) {
        let Some(s) = &mut self.startup else {
            return;
        };
        // Frames first: the Reply precedes any FPDU.
        while let Some(frame) = s.poll_transmit() {
            self.dp.push_raw(&frame);
        }
        let mut done = false;
        let mut evs = Vec::new();
        while let Some(ev) = s.poll_event() {
            evs.push(ev);
        }
        for ev in evs {
            match ev {
                StartupEvent::Request {
                    rev,
                    private_data,
                    peer_ird,
                    peer_ord,
                } => self.events.push_back(Event::ConnectRequest {
                    rev,
                    private_data,
                    peer_ird,
                    peer_ord,
                }),
                StartupEvent::Established(n) => {
                    self.establish(n);
                    done = true;
                }
                StartupEvent::Rejected {
                    private_data,
                    peer_ird,
                    peer_ord,
                } => {
                    self.dp.abandon();
                    self.left = true;
                    self.events.push_back(Event::Rejected {
                        private_data,
                        peer_ird,
                        peer_ord,
                    });
                    done = true;
                }
                StartupEvent::Failed {
                    code,
                    send_terminate,
                } => {
                    self.startup_failed(code, send_terminate);
                    done = true;
                }
            }
        }
        if done {
            // Frames queued along with the final event (none expected).
            if let Some(s) = &mut self.startup {
                while let Some(frame) = s.poll_transmit() {
                    self.dp.push_raw(&frame);
                }
            }
            self.startup = None;
        }
    }

    fn establish(&mut self, n: Negotiated) {
        let rtr = match (self.role, n.rtr) {
            (_, None) => RtrRole::None,
            (Role::Initiator, Some(r)) => RtrRole::Send(rtr_kind(r)),
            (Role::Responder, Some(r)) => RtrRole::Expect(rtr_kind(r)),
        };
        self.dp.enable(Params {
            crc: n.crc,
            tx_markers: n.tx_markers,
            rx_markers: n.rx_markers,
            ird: n.ird,
            ord: n.ord,
            emss: self.emss,
            rtr,
            // RFC 5044 §7.1.2 rule 4.
            gated: self.role == Role::Responder,
        });
        self.events.push_back(Event::Established {
            private_data: n.peer_private_data,
            ird: n.ird,
            ord: n.ord,
            peer_ird: n.peer_ird,
            peer_ord: n.peer_ord,
        });
    }

    fn startup_failed(&mut self, code: TermCode, send_terminate: bool) {
        let peer = (self.peer_frame_len == FRAME_HEADER_LEN)
            .then(|| Frame::new_unchecked(&self.peer_frame[..]));
        match peer {
            // RFC 6581 §8, §9.1–9.3: "the TERM message MUST contain Layer 2,
            // Error Type 0, Error Code" 5, 6 or 7. It is the first FPDU of
            // our direction, framed as negotiated: markers if the peer set
            // M, CRC if either side set C (RFC 5044 §7.1.1).
            Some(peer) if send_terminate => {
                let params = Params {
                    crc: self.our_crc || peer.crc(),
                    tx_markers: peer.markers(),
                    rx_markers: self.our_markers,
                    ird: 0,
                    ord: 0,
                    emss: self.emss,
                    rtr: RtrRole::None,
                    gated: false,
                };
                self.dp.enable(params);
                self.dp.fail(code);
            }
            // No frame to learn the framing from, or RFC 5044 §8 code 4:
            // "the TCP connection MUST be immediately closed".
            _ => self.dp.fail(code),
        }
    }

    fn record_peer_frame(&mut self, consumed: &[u8]) {
        let n = (FRAME_HEADER_LEN - self.peer_frame_len).min(consumed.len());
        self.peer_frame[self.peer_frame_len..self.peer_frame_len + n]
            .copy_from_slice(&consumed[..n]);
        self.peer_frame_len += n;
    }

    // ---- input ----------------------------------------------------------

    /// Consumes received octets: the peer's startup frame, then FPDUs
    /// (copied into place). Returns the octets consumed; fewer than given
    /// only when the stream leaves iWARP (a rejected connection: the rest
    /// belongs to the ULP) or the startup is waiting for the ULP.
    pub fn handle_input(&mut self, now: Instant, data: &[u8], mem: &mut dyn Memory) -> usize {
        let mut used = 0;
        if let Some(s) = &mut self.startup {
            used = s.handle_input(now, data);
            self.record_peer_frame(&data[..used]);
            self.drive_startup();
        }
        if used < data.len()
            && self.startup.is_none()
            && !self.left
            && self.dp.state() != State::Idle
        {
            used += self.dp.handle_input(&data[used..], mem);
        }
        used
    }

    /// Where the driver should receive next (see [`DataPath::recv_target`]).
    pub fn recv_target(&self) -> RecvTarget {
        if self.startup.is_some() {
            return RecvTarget::Scratch {
                max: FRAME_HEADER_LEN + MAX_PRIVATE_DATA,
            };
        }
        self.dp.recv_target()
    }

    /// The driver received `n` octets in place (see [`DataPath::placed`]).
    pub fn placed(&mut self, _now: Instant, n: usize, mem: &mut dyn Memory) {
        self.dp.placed(n, mem)
    }

    /// The LLP closed or failed (RFC 5044 §8 code 1).
    pub fn handle_llp_closed(&mut self, _now: Instant) {
        self.startup = None;
        self.dp.handle_llp_closed();
    }

    // ---- output ---------------------------------------------------------

    /// Queues what can be sent, up to `budget` octets (see
    /// [`DataPath::poll_transmit`]); returns the octets queued.
    pub fn poll_transmit(&mut self, _now: Instant, mem: &dyn Memory, budget: usize) -> usize {
        self.dp.poll_transmit(mem, budget)
    }

    /// The queued octets (gather list).
    pub fn txq(&self) -> &TxQueue {
        self.dp.txq()
    }

    /// The LLP took the next `n` queued octets.
    pub fn tx_advance(&mut self, _now: Instant, n: usize) {
        self.dp.tx_advance(n)
    }

    /// The startup deadline, if the startup is running.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.startup.as_ref().and_then(|s| s.poll_timeout())
    }

    /// Lets a passed deadline take effect.
    pub fn handle_timeout(&mut self, now: Instant) {
        if let Some(s) = &mut self.startup {
            s.handle_timeout(now);
            self.drive_startup();
        }
    }

    /// The next event: startup events, then the data path's.
    pub fn poll_event(&mut self) -> Option<Event> {
        if let Some(e) = self.events.pop_front() {
            return Some(e);
        }
        // Startup's events come once: their queue's memory goes with them.
        if self.events.capacity() > 0 {
            self.events = VecDeque::new();
        }
        self.dp.poll_event()
    }

    /// The EMSS FPDUs are sized for.
    pub fn emss(&self) -> usize {
        self.emss
    }

    /// Changes the EMSS (see [`DataPath::set_emss`]).
    pub fn set_emss(&mut self, emss: usize) {
        self.emss = emss;
        if self.dp.state() != State::Idle {
            self.dp.set_emss(emss);
        }
    }

    // ---- verbs ----------------------------------------------------------

    /// The startup event handler, exposed for tests of what the data path
    /// does with each startup outcome.
    #[doc(hidden)]
    pub fn inject_startup_event(&mut self, ev: StartupEvent) {
        match ev {
            StartupEvent::Failed {
                code,
                send_terminate,
            } => {
                self.startup = None;
                self.startup_failed(code, send_terminate);
            }
            StartupEvent::Established(n) => {
                self.startup = None;
                self.establish(n);
            }
            _ => {}
        }
    }
}
