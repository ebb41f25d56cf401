//! The MPA Startup Phase: RFC 5044 §7.1 with the enhanced RDMA connection
//! establishment of RFC 6581.
//!
//! Read first: RFC 5044 §7.1.1 (what each field of the Request and Reply
//! Frames means and what a receiver MUST check), §7.1.2 (the ten startup
//! rules), §8 (error codes 1–4); RFC 6581 §6 (the S bit and Rev 2), §8
//! (codes 5–7), §9.1 (IRD/ORD), §9.2 (the RTR indication), §10 (Rev 1
//! peers).
//!
//! [`Startup`] is sans-IO: bytes and the current time go in
//! ([`Startup::handle_input`], [`Startup::handle_timeout`],
//! [`Startup::handle_close`]), frames to send, events and the next deadline
//! come out ([`Startup::poll_transmit`], [`Startup::poll_event`],
//! [`Startup::poll_timeout`]). The Consumer's decision on a Request is
//! [`Startup::accept`] or [`Startup::reject`].
//!
//! ```text
//!  Initiator                                     Responder
//!  initiator() ── MPA Request Frame ──────────▶  WaitingForRequest
//!  WaitingForReply                                │ validated: Request event
//!                                                 ▼
//!                                                ExaminingRequest
//!                                                 │ accept()        │ reject()
//!            ◀──────────────── Reply, R=0 ────────┤                 │
//!  FullOperation (Established)                    ▼                 │
//!  or Failed{6|7}, Terminate                     FullOperation      │
//!            ◀──────────────── Reply, R=1 ──────────────────────────┤
//!  Rejected (TCP left open)                                         ▼
//!                                                                Rejected (TCP left open)
//! ```
//!
//! What the data path does with the outcome:
//!
//! * `Established(n)`: the next byte in each direction is stream position 0
//!   of the Full Operation Phase (RFC 5044 §7.1.2 rule 7: with markers the
//!   first octets sent are the special Marker 0x00000000). Frame FPDUs with
//!   [`Negotiated::tx_framing`] and deframe with [`Negotiated::rx_framing`].
//!   The initiator sends the RTR [`Negotiated::rtr`] first; the responder
//!   sends nothing until it has received and validated one FPDU
//!   ([`Negotiated::must_receive_fpdu_first`]).
//! * `Rejected`: MPA is over, the TCP connection stays open; what follows on
//!   the stream is the ULP's, not FPDUs.
//! * `Failed { send_terminate: true, .. }` (codes 6 and 7, initiator only):
//!   send one Terminate FPDU with that code, framed per
//!   [`Startup::negotiated`], then close TCP. `send_terminate: false`
//!   (codes 1, 4, 5): close TCP at once; no FPDU may be sent, the peer is not
//!   in Full Operation.
//!
//! ```
//! use std::time::Instant;
//! use iwarp::mpa::startup::{Rtr, Startup, StartupConfig, StartupEvent};
//!
//! let t0 = Instant::now();
//! let mut ini = Startup::initiator(StartupConfig::default(), b"hello", t0)?;
//! let mut rsp = Startup::responder(StartupConfig::default(), t0);
//!
//! let request = ini.poll_transmit().unwrap();
//! assert_eq!(rsp.handle_input(t0, &request), request.len());
//! match rsp.poll_event() {
//!     Some(StartupEvent::Request { private_data, .. }) => assert_eq!(private_data, b"hello"),
//!     other => panic!("{other:?}"),
//! }
//! rsp.accept(b"welcome")?;
//!
//! let reply = rsp.poll_transmit().unwrap();
//! // FPDU bytes that arrive with the Reply are left for the data path.
//! let mut stream = reply.clone();
//! stream.extend_from_slice(&[0, 0x12]);
//! assert_eq!(ini.handle_input(t0, &stream), reply.len());
//! match ini.poll_event() {
//!     Some(StartupEvent::Established(n)) => {
//!         assert_eq!(n.rtr, Some(Rtr::Write));
//!         assert_eq!(n.peer_private_data, b"welcome");
//!     }
//!     other => panic!("{other:?}"),
//! }
//! # Ok::<(), iwarp::mpa::startup::StartupError>(())
//! ```

use core::fmt;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::wire::fpdu::Framing;
use crate::wire::mpa::{
    self, EnhancedRepr, Frame, FrameKind, FrameRepr, ENHANCED_LEN, HEADER_LEN,
    IRD_ORD_NO_NEGOTIATION, MAX_PRIVATE_DATA, REPLY_KEY, REQUEST_KEY, REV_1, REV_2,
};
use crate::wire::terminate::TermCode;

const NO_NEG: u16 = IRD_ORD_NO_NEGOTIATION;

/// Offset of Rev in a frame (RFC 5044 §7.1.1, Figure 8).
const REV_OFFSET: usize = 17;
/// Length of the Key.
const KEY_LEN: usize = 16;

/// Default for [`StartupConfig::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Default for [`StartupConfig::ird`] and [`StartupConfig::ord`].
pub const DEFAULT_IRD_ORD: u16 = 16;

/// The largest ULP Private Data in a frame that carries the 4 octets of
/// enhanced connection data (RFC 6581 §9: "The maximum amount of
/// ULP-specified Private Data is therefore reduced by 4 bytes").
pub const MAX_ENHANCED_PRIVATE_DATA: usize = MAX_PRIVATE_DATA - ENHANCED_LEN;

/// Which end of the Startup Phase this is.
///
/// RFC 5044 §7.1: "The Initiator is the side that sends first in the MPA
/// startup sequence (the MPA Request Frame)", unrelated to who sent the SYN.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// Sends the MPA Request Frame, receives the Reply.
    Initiator,
    /// Waits for the Request, answers with the Reply.
    Responder,
}

/// A Ready-to-Receive indication (RFC 6581 §9.2): the message the initiator
/// sends as its first FPDU in the peer-to-peer model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rtr {
    /// A zero-length FULPDU Send (flag B).
    Send,
    /// A zero-length RDMA Write (flag C).
    Write,
    /// A zero-length RDMA Read (flag D).
    Read,
}

impl Rtr {
    /// The order in which both ends of this implementation pick an RTR when
    /// several are possible: Write (nothing is consumed at the responder),
    /// then Read, then Send (which uses up a posted receive buffer).
    pub const PREFERENCE: [Rtr; 3] = [Rtr::Write, Rtr::Read, Rtr::Send];
}

/// A set of RTR options: the B, C and D flags of RFC 6581 §9.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct RtrSet {
    /// B: zero-length Send.
    pub send: bool,
    /// C: zero-length RDMA Write.
    pub write: bool,
    /// D: zero-length RDMA Read.
    pub read: bool,
}

impl RtrSet {
    /// No option.
    pub const NONE: RtrSet = RtrSet {
        send: false,
        write: false,
        read: false,
    };
    /// All three options.
    pub const ALL: RtrSet = RtrSet {
        send: true,
        write: true,
        read: true,
    };

    /// The set holding only `rtr`.
    pub const fn only(rtr: Rtr) -> RtrSet {
        RtrSet::NONE.with(rtr)
    }

    /// This set plus `rtr`.
    pub const fn with(self, rtr: Rtr) -> RtrSet {
        match rtr {
            Rtr::Send => RtrSet { send: true, ..self },
            Rtr::Write => RtrSet {
                write: true,
                ..self
            },
            Rtr::Read => RtrSet { read: true, ..self },
        }
    }

    /// This set without `rtr`.
    pub const fn without(self, rtr: Rtr) -> RtrSet {
        match rtr {
            Rtr::Send => RtrSet {
                send: false,
                ..self
            },
            Rtr::Write => RtrSet {
                write: false,
                ..self
            },
            Rtr::Read => RtrSet {
                read: false,
                ..self
            },
        }
    }

    /// Whether `rtr` is in the set.
    pub const fn contains(self, rtr: Rtr) -> bool {
        match rtr {
            Rtr::Send => self.send,
            Rtr::Write => self.write,
            Rtr::Read => self.read,
        }
    }

    /// The options in both sets.
    pub const fn intersection(self, other: RtrSet) -> RtrSet {
        RtrSet {
            send: self.send && other.send,
            write: self.write && other.write,
            read: self.read && other.read,
        }
    }

    /// No option set.
    pub const fn is_empty(self) -> bool {
        !(self.send || self.write || self.read)
    }

    /// The first option of [`Rtr::PREFERENCE`] in the set.
    pub fn preferred(self) -> Option<Rtr> {
        Rtr::PREFERENCE.into_iter().find(|&r| self.contains(r))
    }

    /// The B, C, D flags of received enhanced data (all clear when A is
    /// clear: [`EnhancedRepr::parse`] already ignores them then).
    pub const fn of(e: &EnhancedRepr) -> RtrSet {
        RtrSet {
            send: e.rtr_send,
            write: e.rtr_write,
            read: e.rtr_read,
        }
    }
}

/// What one end asks for in its frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartupConfig {
    /// Initiator: the Rev to send — [`REV_2`] (enhanced, RFC 6581; the
    /// default) or [`REV_1`] (plain RFC 5044: no S, no enhanced data).
    ///
    /// Responder: the highest Rev it accepts. 2 accepts Rev 1 and Rev 2
    /// Requests (RFC 6581 §6: "A host accepting MPA connections MUST
    /// continue to accept MPA Requests with version one"); 1 is an
    /// RFC 5044-only responder, which closes the connection on a Rev 2
    /// Request (RFC 5044 §7.1.1 Rev, RFC 6581 §10).
    pub rev: u8,
    /// Our C bit (RFC 5044 §7.1.1). CRCs are used when either end sets it.
    /// Default true.
    pub crc: bool,
    /// Our M bit: we require the peer to insert Markers in the FPDUs it
    /// sends us. Default false.
    pub markers: bool,
    /// Local IRD: the most inbound RDMA Read Requests we can have
    /// outstanding on this connection, at most 0x3FFF. An initiator sending
    /// 0x3FFF asks for no automatic negotiation (RFC 6581 §9.1).
    pub ird: u16,
    /// Local ORD: the most outbound RDMA Read Requests we want outstanding,
    /// at most 0x3FFF (0x3FFF from an initiator: no automatic negotiation).
    pub ord: u16,
    /// Initiator only: the A flag — peer-to-peer model with an RTR (true,
    /// the default) or client-server (false). A responder echoes the
    /// initiator's A (RFC 6581 §9.2).
    pub peer_to_peer: bool,
    /// Initiator: the RTR options offered (B, C, D), which RFC 6581 §9.2
    /// equates with those it supports. Responder: the options it supports.
    /// Default: all three.
    pub rtr: RtrSet,
    /// The whole Startup Phase must finish within this (RFC 5044 §7.1.2
    /// rules 8 and 10). Default [`DEFAULT_TIMEOUT`].
    pub timeout: Duration,
    /// Responder only: the ORD the ULP requires (default 0, no
    /// requirement). If an enhanced initiator's IRD is below it, the
    /// responder refuses as RFC 6581 §9.1 allows: [`Startup::accept`] sends
    /// a Reply with R=1 whose responder ORD is this value and returns
    /// [`StartupError::InsufficientIrd`] (error code 6). Must be below
    /// 0x3FFF.
    pub required_ord: u16,
}

impl Default for StartupConfig {
    fn default() -> StartupConfig {
        StartupConfig {
            rev: REV_2,
            // RFC 5044 requires CRCs on by default.
            crc: true,
            markers: false,
            ird: DEFAULT_IRD_ORD,
            ord: DEFAULT_IRD_ORD,
            peer_to_peer: true,
            rtr: RtrSet::ALL,
            timeout: DEFAULT_TIMEOUT,
            required_ord: 0,
        }
    }
}

impl StartupConfig {
    /// This configuration for a plain RFC 5044 (Rev 1) start: same CRC,
    /// Markers, IRD/ORD and timeout; no peer-to-peer model and no RTR
    /// options, which Rev 1 cannot carry (RFC 6581 §10: the initiator
    /// retrying with Rev 1 lets "the ULP deal with ORD and IRD and
    /// peer-to-peer negotiations").
    pub fn rev1(&self) -> StartupConfig {
        StartupConfig {
            rev: REV_1,
            peer_to_peer: false,
            rtr: RtrSet::NONE,
            ..self.clone()
        }
    }

    fn validate(&self, role: Role) -> Result<(), StartupError> {
        if self.rev != REV_1 && self.rev != REV_2 {
            return Err(StartupError::InvalidConfig("rev must be 1 or 2"));
        }
        // RFC 6581 §9: "IRD and ORD encoded as 14-bit unsigned integers".
        if self.ird > NO_NEG || self.ord > NO_NEG {
            return Err(StartupError::InvalidConfig(
                "ird and ord must be at most 0x3FFF",
            ));
        }
        if self.required_ord >= NO_NEG {
            return Err(StartupError::InvalidConfig(
                "required_ord must be below 0x3FFF",
            ));
        }
        match role {
            // RFC 6581 §9.2: "The initiator MUST set each Control Flag B, C,
            // and D to 1 for each of the options it supports, if Control
            // Flag A is set to 1." With none, no RTR could ever be agreed.
            Role::Initiator if self.rev >= REV_2 && self.peer_to_peer && self.rtr.is_empty() => {
                Err(StartupError::InvalidConfig(
                    "peer_to_peer needs at least one RTR option",
                ))
            }
            // RFC 6581 §9.2: "The responder MUST support at least one RTR
            // indication option if it supports Enhanced RDMA connection
            // establishment."
            Role::Responder if self.rev >= REV_2 && self.rtr.is_empty() => Err(
                StartupError::InvalidConfig("an enhanced responder must support an RTR option"),
            ),
            _ => Ok(()),
        }
    }
}

/// The parameters of Full Operation, as agreed by the two frames.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    /// The Rev of the Reply (1 or 2; the responder answers with the
    /// Request's Rev).
    pub rev: u8,
    /// CRCs generated and checked in both directions. RFC 5044 §7.1.1 C:
    /// "When this bit is '1' in either the MPA Request Frame or MPA Reply
    /// Frame, CRCs MUST be generated and checked by both endpoints."
    pub crc: bool,
    /// Markers in the FPDUs we send: the peer's M bit. RFC 5044 §7.1.1 M:
    /// "When in a received MPA Request Frame or MPA Reply Frame and the
    /// value is '0', Markers MUST NOT be added to the data stream by that
    /// endpoint. When '1' Markers MUST be added".
    pub tx_markers: bool,
    /// Markers in the FPDUs we receive: our M bit.
    pub rx_markers: bool,
    /// Local IRD after the RFC 6581 §9.1 rules (0x3FFF: left to the ULP).
    pub ird: u16,
    /// Local ORD after the RFC 6581 §9.1 rules (0x3FFF: left to the ULP).
    pub ord: u16,
    /// The peer's IRD as received, for the ULP (RFC 6581 §9.1: "The
    /// responder and initiator MUST pass the peer's provided IRD and ORD
    /// values to the ULP"). 0x3FFF when the frames carried no enhanced
    /// data (Rev 1): not negotiated, the ULP's to handle.
    pub peer_ird: u16,
    /// The peer's ORD as received (see `peer_ird`).
    pub peer_ord: u16,
    /// Peer-to-peer model: the RTR the initiator sends as its first FPDU,
    /// before any other FPDU (RFC 6581 §5: "The RDMA connection initiator
    /// MUST NOT allow any later FULPDUs to be transmitted before the RTR
    /// indication"). `None` in the client-server model and with Rev 1: then
    /// the initiator's first FPDU, whatever it is, plays the RTR role
    /// (RFC 6581 §4.3).
    pub rtr: Option<Rtr>,
    /// The peer's ULP Private Data (after the enhanced data, if any).
    pub peer_private_data: Vec<u8>,
    /// Which end we are.
    pub role: Role,
}

impl Negotiated {
    /// How to frame the FPDUs we send.
    pub fn tx_framing(&self) -> Framing {
        Framing {
            markers: self.tx_markers,
            crc: self.crc,
        }
    }

    /// How to deframe the FPDUs we receive.
    pub fn rx_framing(&self) -> Framing {
        Framing {
            markers: self.rx_markers,
            crc: self.crc,
        }
    }

    /// True at the responder: RFC 5044 §7.1.2 rule 4, "MPA Responder mode
    /// implementations MUST receive and validate at least one FPDU before
    /// sending any FPDUs or Markers."
    pub fn must_receive_fpdu_first(&self) -> bool {
        self.role == Role::Responder
    }
}

/// What the Startup Phase tells its user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupEvent {
    /// Responder: a valid Request arrived; the ULP examines `private_data`
    /// and calls [`Startup::accept`] or [`Startup::reject`]. `rev` is the
    /// Request's Rev (RFC 5044 §7.1.1: "the MPA receiver should report the
    /// received version to the ULP"); `peer_ird`/`peer_ord` the initiator's
    /// values, 0x3FFF without enhanced data.
    Request {
        rev: u8,
        private_data: Vec<u8>,
        peer_ird: u16,
        peer_ord: u16,
    },
    /// Full Operation: FPDUs from now on, with these parameters.
    Established(Negotiated),
    /// The connection was rejected (a Reply with R=1 was received by the
    /// initiator, or sent by the responder). MPA is over but the TCP
    /// connection stays open (RFC 5044 §7.1.2 rules 2 and 3): "The ULP may
    /// close TCP or use the connection for other purposes." The fields are
    /// the peer's: at the initiator the responder's Private Data and IRD/ORD
    /// (RFC 6581 §9.1: "The initiator MUST pass the responder provided IRD
    /// and ORD to the ULP for both MPA Accept and Reject messages"), at the
    /// responder the Request's.
    Rejected {
        private_data: Vec<u8>,
        peer_ird: u16,
        peer_ord: u16,
    },
    /// The Startup Phase failed with this RFC 5044 §8 / RFC 6581 §8 code.
    /// `send_terminate`: send a Terminate FPDU carrying `code` before closing
    /// TCP (codes 6 and 7, once both frames were exchanged); otherwise close
    /// TCP at once (codes 1, 4, 5). See [`Startup::failure`] for the cause.
    Failed {
        code: TermCode,
        send_terminate: bool,
    },
}

/// A refused call: nothing was sent unless the variant says so.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartupError {
    /// The ULP Private Data is longer than `max`: 512 octets (RFC 5044
    /// §7.1.1), 508 when the frame carries the enhanced data (RFC 6581 §9).
    PrivateDataTooLong { len: usize, max: usize },
    /// A configuration the RFCs do not allow (see [`StartupConfig`]).
    InvalidConfig(&'static str),
    /// `accept`/`reject` called when no Request is being examined.
    InvalidState(State),
    /// Returned by [`Startup::accept`] when the initiator's IRD is below
    /// [`StartupConfig::required_ord`]. The call did act: the Request was
    /// answered with a Reply R=1 carrying `required_ord` as the responder
    /// ORD (RFC 6581 §9.1), and a [`StartupEvent::Rejected`] follows.
    InsufficientIrd {
        initiator_ird: u16,
        required_ord: u16,
    },
    /// A frame could not be encoded (a bug: the inputs are checked first).
    Encode(mpa::Error),
}

impl fmt::Display for StartupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartupError::PrivateDataTooLong { len, max } => {
                write!(f, "MPA private data of {len} octets exceeds {max}")
            }
            StartupError::InvalidConfig(why) => write!(f, "invalid MPA startup config: {why}"),
            StartupError::InvalidState(s) => write!(f, "no MPA Request to answer in state {s:?}"),
            StartupError::InsufficientIrd {
                initiator_ird,
                required_ord,
            } => write!(
                f,
                "initiator IRD {initiator_ird} is below the required ORD {required_ord}; rejected"
            ),
            StartupError::Encode(e) => write!(f, "cannot encode MPA frame: {e}"),
        }
    }
}

impl std::error::Error for StartupError {}

impl From<StartupError> for TermCode {
    fn from(e: StartupError) -> TermCode {
        match e {
            // RFC 6581 §9.1: rejecting for the initiator IRD is error code 6.
            StartupError::InsufficientIrd { .. } => TermCode::MPA_INSUFFICIENT_IRD,
            // RFC 6581 §9.3: "any error locally for which the special Error
            // Code is not defined" is code 5.
            StartupError::PrivateDataTooLong { .. }
            | StartupError::InvalidConfig(_)
            | StartupError::InvalidState(_)
            | StartupError::Encode(_) => TermCode::MPA_LOCAL_CATASTROPHIC,
        }
    }
}

/// Why the Startup Phase failed.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureReason {
    /// The peer's frame is improperly formatted: bad Key, PD_Length above
    /// 512, S without enhanced data (code 4).
    InvalidFrame(mpa::Error),
    /// An initiator received a Request: both ends started as Initiator
    /// (RFC 5044 §7.1.2 rule 8; code 4).
    InitiatorInitiator,
    /// A responder received a Reply Key where the Request Key belongs
    /// (RFC 5044 §7.1.1 Key; code 4).
    UnexpectedReply,
    /// A Rev we cannot interoperate with (code 4). A Rev-1-only responder
    /// fails this way on a Rev 2 Request (RFC 6581 §10).
    UnsupportedRev(u8),
    /// The Reply's S does not match the Request's (RFC 6581 §10; code 4).
    EnhancedMismatch { sent: bool, received: bool },
    /// The responder ORD exceeds our IRD (RFC 6581 §9.1; code 6, Terminate).
    InsufficientIrd { responder_ord: u16, ird: u16 },
    /// The Reply's A does not echo the Request's (RFC 6581 §9.2; code 7,
    /// Terminate).
    ConnectionModelMismatch { sent: bool, received: bool },
    /// None of the responder's RTR options is one we can generate
    /// (RFC 6581 §9.2; code 7, Terminate).
    NoMatchingRtr { offered: RtrSet, responder: RtrSet },
    /// The Startup Phase did not finish within the timeout (code 1).
    Timeout,
    /// The TCP connection was closed or reset during startup (code 1).
    ConnectionClosed,
    /// The responder was created with an invalid configuration (code 5).
    InvalidConfig(&'static str),
}

impl FailureReason {
    /// The RFC 5044 §8 / RFC 6581 §8 code reported for this failure.
    pub fn code(&self) -> TermCode {
        match self {
            FailureReason::InvalidFrame(_)
            | FailureReason::InitiatorInitiator
            | FailureReason::UnexpectedReply
            | FailureReason::UnsupportedRev(_)
            | FailureReason::EnhancedMismatch { .. } => TermCode::MPA_INVALID_FRAME,
            FailureReason::InsufficientIrd { .. } => TermCode::MPA_INSUFFICIENT_IRD,
            FailureReason::ConnectionModelMismatch { .. } | FailureReason::NoMatchingRtr { .. } => {
                TermCode::MPA_NO_MATCHING_RTR
            }
            // RFC 5044 §8 code 1: "TCP connection closed, terminated, or
            // lost. This includes lost by timeout". A startup timeout gives
            // the connection up as lost; code 5 would call for a Terminate,
            // which cannot be framed before the peer's frame is known.
            FailureReason::Timeout | FailureReason::ConnectionClosed => {
                TermCode::MPA_CONNECTION_LOST
            }
            FailureReason::InvalidConfig(_) => TermCode::MPA_LOCAL_CATASTROPHIC,
        }
    }

    /// Whether a Terminate FPDU is to be sent before closing: only after a
    /// valid Reply, when both ends know the framing (RFC 6581 §9.1, §9.2:
    /// the initiator "MUST send a TERM message to the responder").
    pub fn send_terminate(&self) -> bool {
        matches!(
            self,
            FailureReason::InsufficientIrd { .. }
                | FailureReason::ConnectionModelMismatch { .. }
                | FailureReason::NoMatchingRtr { .. }
        )
    }
}

impl fmt::Display for FailureReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureReason::InvalidFrame(e) => write!(f, "invalid MPA frame: {e}"),
            FailureReason::InitiatorInitiator => f.write_str("Initiator/Initiator startup"),
            FailureReason::UnexpectedReply => f.write_str("MPA Reply received by the responder"),
            FailureReason::UnsupportedRev(rev) => write!(f, "unsupported MPA Rev {rev}"),
            FailureReason::EnhancedMismatch { sent, received } => {
                write!(
                    f,
                    "Reply S={} to a Request S={}",
                    *received as u8, *sent as u8
                )
            }
            FailureReason::InsufficientIrd { responder_ord, ird } => {
                write!(f, "responder ORD {responder_ord} exceeds local IRD {ird}")
            }
            FailureReason::ConnectionModelMismatch { sent, received } => {
                write!(
                    f,
                    "Reply A={} to a Request A={}",
                    *received as u8, *sent as u8
                )
            }
            FailureReason::NoMatchingRtr { offered, responder } => {
                write!(
                    f,
                    "no matching RTR: offered {offered:?}, responder {responder:?}"
                )
            }
            FailureReason::Timeout => f.write_str("MPA startup timed out"),
            FailureReason::ConnectionClosed => f.write_str("TCP connection closed during startup"),
            FailureReason::InvalidConfig(why) => write!(f, "invalid MPA startup config: {why}"),
        }
    }
}

/// Where the Startup Phase is, in RFC 5044 §7.1's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Responder: "waits for \<MPA Request frame\>" (§7.1.4.2).
    WaitingForRequest,
    /// Responder: "Consumer examines Private Data" and decides (§7.1.4.2).
    ExaminingRequest,
    /// Initiator: "MPA waits for incoming \<MPA Reply Frame\>" (§7.1.4.2).
    WaitingForReply,
    /// "Full MPA/DDP Operation" (§7.1.2): FPDUs from now on.
    FullOperation,
    /// Rejected: "exit MPA, leaving the TCP connection open" (§7.1.2).
    Rejected,
    /// Failed: "close the TCP connection and exit MPA" (§7.1.2), after a
    /// Terminate where [`FailureReason::send_terminate`] says so.
    Failed,
}

/// A Request received and validated, awaiting the Consumer.
#[derive(Debug, Clone)]
struct ReceivedRequest {
    rev: u8,
    markers: bool,
    crc: bool,
    enhanced: Option<EnhancedRepr>,
    private_data: Vec<u8>,
}

impl ReceivedRequest {
    fn peer_ird_ord(&self) -> (u16, u16) {
        self.enhanced.map_or((NO_NEG, NO_NEG), |e| (e.ird, e.ord))
    }
}

#[derive(Debug, Clone)]
enum Phase {
    WaitingForRequest,
    ExaminingRequest(ReceivedRequest),
    WaitingForReply,
    FullOperation,
    Rejected,
    Failed(FailureReason),
}

/// The MPA Startup Phase of one connection, Initiator or Responder.
#[derive(Debug, Clone)]
pub struct Startup {
    role: Role,
    cfg: StartupConfig,
    phase: Phase,
    deadline: Option<Instant>,
    /// Initiator: the enhanced data of our Request (None for Rev 1).
    sent: Option<EnhancedRepr>,
    /// Initiator: our ULP Private Data, kept for [`Startup::retry_with_rev1`].
    private_data: Vec<u8>,
    /// The peer's frame so far; never more than one frame.
    rx: Vec<u8>,
    /// Octets of the peer's frame received in all.
    rx_total: usize,
    negotiated: Option<Negotiated>,
    transmit: VecDeque<Vec<u8>>,
    events: VecDeque<StartupEvent>,
}

impl Startup {
    fn new(role: Role, cfg: StartupConfig, phase: Phase, now: Instant) -> Startup {
        Startup {
            role,
            // `checked_add`: a huge timeout means none, not a panic.
            deadline: now.checked_add(cfg.timeout),
            cfg,
            phase,
            sent: None,
            private_data: Vec::new(),
            rx: Vec::with_capacity(HEADER_LEN),
            rx_total: 0,
            negotiated: None,
            transmit: VecDeque::new(),
            events: VecDeque::new(),
        }
    }

    /// Starts in Initiator mode and queues the MPA Request Frame.
    ///
    /// Rev 2 sends S=1 and the enhanced data (A, the offered B/C/D, IRD,
    /// ORD) in front of `private_data`, which may then hold at most 508
    /// octets; Rev 1 sends a plain RFC 5044 Request with up to 512.
    pub fn initiator(
        cfg: StartupConfig,
        private_data: &[u8],
        now: Instant,
    ) -> Result<Startup, StartupError> {
        cfg.validate(Role::Initiator)?;
        // RFC 6581 §10: "The initiator MUST NOT use the enhanced RDMA
        // connection establishment formats or function codes when no
        // enhanced functionality is desired": Rev 1 sends none.
        let sent = (cfg.rev >= REV_2).then(|| {
            let a = cfg.peer_to_peer;
            // RFC 6581 §9.2: "The initiator MUST set Control Flag A to 1 for
            // the peer-to-peer model. The initiator MUST set each Control
            // Flag B, C, and D to 1 for each of the options it supports, if
            // Control Flag A is set to 1." and "If Control Flag A is set to
            // 0, then Control Flags B, C, and D MUST also be set to 0."
            EnhancedRepr {
                peer_to_peer: a,
                rtr_send: a && cfg.rtr.send,
                rtr_write: a && cfg.rtr.write,
                rtr_read: a && cfg.rtr.read,
                ird: cfg.ird,
                ord: cfg.ord,
            }
        });
        check_private_data(private_data, sent.is_some())?;
        // RFC 5044 §7.1.2 rule 1: "When MPA is started in the Initiator
        // mode, the MPA implementation MUST send a valid MPA Request Frame."
        let frame = build_frame(FrameKind::Request, &cfg, false, cfg.rev, sent, private_data)?;
        let mut s = Startup::new(Role::Initiator, cfg, Phase::WaitingForReply, now);
        s.sent = sent;
        s.private_data = private_data.to_vec();
        s.transmit.push_back(frame);
        Ok(s)
    }

    /// Starts in Responder mode, waiting for the Request.
    ///
    /// An invalid `cfg` does not panic: the machine starts Failed with code
    /// 5 ([`FailureReason::InvalidConfig`]) and reports it as its first
    /// event.
    pub fn responder(cfg: StartupConfig, now: Instant) -> Startup {
        let invalid = cfg.validate(Role::Responder).err();
        let mut s = Startup::new(Role::Responder, cfg, Phase::WaitingForRequest, now);
        if let Some(StartupError::InvalidConfig(why)) = invalid {
            s.fail(FailureReason::InvalidConfig(why));
        }
        s
    }

    /// For an Initiator whose Rev 2 Request met a closed connection before
    /// any Reply octet: a fresh Rev 1 Initiator with the same Private Data,
    /// to run on a new TCP connection. Otherwise `None`.
    ///
    /// RFC 6581 §10: a responder without enhanced support "treats the
    /// enhanced request as incorrectly formatted and closes the TCP
    /// connection ... the initiator MAY attempt to establish an RDMA
    /// connection using the unenhanced MPA protocol as defined in
    /// \[RFC5044\]". The caller reports the close with
    /// [`Startup::handle_close`] first. Rev 1 carries no IRD/ORD or RTR:
    /// the ULP handles them.
    pub fn retry_with_rev1(&self, now: Instant) -> Option<Startup> {
        let closed_before_reply =
            matches!(self.phase, Phase::Failed(FailureReason::ConnectionClosed))
                && self.rx_total == 0;
        if self.role != Role::Initiator || self.cfg.rev < REV_2 || !closed_before_reply {
            return None;
        }
        Startup::initiator(self.cfg.rev1(), &self.private_data, now).ok()
    }

    /// Our role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// Our configuration.
    pub fn config(&self) -> &StartupConfig {
        &self.cfg
    }

    /// Where the Startup Phase is.
    pub fn state(&self) -> State {
        match self.phase {
            Phase::WaitingForRequest => State::WaitingForRequest,
            Phase::ExaminingRequest(_) => State::ExaminingRequest,
            Phase::WaitingForReply => State::WaitingForReply,
            Phase::FullOperation => State::FullOperation,
            Phase::Rejected => State::Rejected,
            Phase::Failed(_) => State::Failed,
        }
    }

    /// Why it failed, once it has.
    pub fn failure(&self) -> Option<FailureReason> {
        match self.phase {
            Phase::Failed(reason) => Some(reason),
            _ => None,
        }
    }

    /// The parameters agreed by the two frames: set on Established, and
    /// also when the initiator fails with code 6 or 7 — the Terminate it
    /// must send is an FPDU framed with these CRC and Marker settings.
    pub fn negotiated(&self) -> Option<&Negotiated> {
        self.negotiated.as_ref()
    }

    /// Whether the Startup Phase is over (Full Operation, Rejected or
    /// Failed).
    pub fn is_finished(&self) -> bool {
        matches!(
            self.phase,
            Phase::FullOperation | Phase::Rejected | Phase::Failed(_)
        )
    }

    /// Consumes octets of the peer's Request (responder) or Reply
    /// (initiator) and returns how many. Never consumes an octet past the
    /// frame: what follows belongs to the Full Operation Phase (or, after a
    /// reject, to the ULP). Returns 0 once the Startup Phase is over.
    ///
    /// `data` may be cut anywhere. A bad Key or Rev is caught on the octet
    /// that shows it, a PD_Length above 512 on the 20th, without waiting for
    /// the rest. If `now` is past the deadline the timeout fires first.
    pub fn handle_input(&mut self, now: Instant, data: &[u8]) -> usize {
        self.handle_timeout(now);
        let expected = match self.phase {
            Phase::WaitingForRequest => FrameKind::Request,
            Phase::WaitingForReply => FrameKind::Reply,
            _ => return 0,
        };
        let mut used = 0;
        while self.rx.len() < HEADER_LEN {
            let Some(&byte) = data.get(used) else {
                return used;
            };
            self.rx.push(byte);
            self.rx_total += 1;
            used += 1;
            if let Err(reason) = self.check_header(expected) {
                self.fail(reason);
                return used;
            }
        }
        // RFC 5044 §7.1.2 rule 9: "MPA implementations MUST validate the
        // PD_Length field." frame_len refuses a PD_Length above 512.
        let frame_len = match Frame::<&[u8]>::frame_len(&self.rx) {
            Ok(len) => len,
            Err(e) => {
                self.fail(FailureReason::InvalidFrame(e));
                return used;
            }
        };
        let want = frame_len.saturating_sub(self.rx.len());
        let rest = data.get(used..).unwrap_or_default();
        let take = want.min(rest.len());
        self.rx
            .extend_from_slice(rest.get(..take).unwrap_or_default());
        self.rx_total += take;
        used += take;
        if self.rx.len() == frame_len {
            self.on_frame();
        }
        used
    }

    /// The TCP connection was closed (FIN) or reset by the peer. During the
    /// Startup Phase this fails with code 1 (RFC 5044 §8: "TCP connection
    /// closed, terminated, or lost ... RST received, or FIN received");
    /// afterwards it is the data path's to report.
    pub fn handle_close(&mut self, _now: Instant) {
        if !self.is_finished() {
            self.fail(FailureReason::ConnectionClosed);
        }
    }

    /// The Consumer accepts the Request: queue the Reply (R=0) with its
    /// `private_data` and enter Full Operation.
    ///
    /// The Reply echoes the Request's Rev and S. With enhanced data it
    /// echoes A, sets IRD/ORD per RFC 6581 §9.1 and, for A=1, exactly one
    /// RTR flag: the first of Write, Read, Send that the initiator offered
    /// and we support, or if there is none, the first we support (§9.2).
    ///
    /// Errors without side effects: [`StartupError::InvalidState`],
    /// [`StartupError::PrivateDataTooLong`]. With one:
    /// [`StartupError::InsufficientIrd`] (see
    /// [`StartupConfig::required_ord`]).
    pub fn accept(&mut self, private_data: &[u8]) -> Result<(), StartupError> {
        let Phase::ExaminingRequest(req) = &self.phase else {
            return Err(StartupError::InvalidState(self.state()));
        };
        let req = req.clone();
        let plan = ResponderPlan::new(&self.cfg, &req);
        check_private_data(private_data, plan.reply.is_some())?;
        if let Some(e) = req.enhanced {
            // RFC 6581 §9.1: "The responder MAY reject the connection
            // request if the initiator IRD is not sufficient for the
            // ULP-required ORD and specify the required ORD in the MPA
            // Reject Frame responder ORD." (0x3FFF: the ULP negotiates.)
            if e.ird != NO_NEG && e.ird < self.cfg.required_ord {
                let reply = plan.reply.map(|r| EnhancedRepr {
                    ord: self.cfg.required_ord,
                    ..r
                });
                self.send_reply(&req, true, reply, private_data)?;
                self.finish_rejected(req);
                return Err(StartupError::InsufficientIrd {
                    initiator_ird: e.ird,
                    required_ord: self.cfg.required_ord,
                });
            }
        }
        // RFC 5044 §7.1.2 rule 2: "If the MPA Request Frame is properly
        // formatted and the Private Data is acceptable, the implementation
        // SHOULD return an MPA Reply Frame with the Rejected Connection bit
        // set to '0'".
        self.send_reply(&req, false, plan.reply, private_data)?;
        let negotiated = Negotiated {
            rev: req.rev,
            // RFC 5044 §7.1.1 C: "When this bit is '1' in either the MPA
            // Request Frame or MPA Reply Frame, CRCs MUST be generated and
            // checked by both endpoints."
            crc: self.cfg.crc || req.crc,
            // M: the Request's M asks for Markers in what we send.
            tx_markers: req.markers,
            rx_markers: self.cfg.markers,
            ird: plan.ird,
            ord: plan.ord,
            peer_ird: req.peer_ird_ord().0,
            peer_ord: req.peer_ird_ord().1,
            rtr: plan.rtr,
            peer_private_data: req.private_data,
            role: Role::Responder,
        };
        self.negotiated = Some(negotiated.clone());
        self.phase = Phase::FullOperation;
        self.events.push_back(StartupEvent::Established(negotiated));
        Ok(())
    }

    /// Responder, before the Reply: changes our M and C bits, e.g. to
    /// mirror what the Request asked for. RFC 5044 §7.1.1 lets each end
    /// set them for itself ("M: ... set to 1 by the ... Responder ... if it
    /// requires Markers"; C: CRCs are used when either end sets it), and
    /// the Reply is built from them by [`Startup::accept`] or
    /// [`Startup::reject`]. Refused once the frame is queued (initiator,
    /// or after the decision).
    pub fn set_framing(&mut self, markers: bool, crc: bool) -> Result<(), StartupError> {
        match self.phase {
            Phase::WaitingForRequest | Phase::ExaminingRequest(_) => {
                self.cfg.markers = markers;
                self.cfg.crc = crc;
                Ok(())
            }
            _ => Err(StartupError::InvalidState(self.state())),
        }
    }

    /// The Consumer rejects the Request: queue a Reply with R=1 (carrying
    /// the enhanced data when the Request did, so the initiator learns our
    /// IRD/ORD) and `private_data`, and exit MPA. The TCP connection stays
    /// open: RFC 5044 §7.1.2 rule 2, "the implementation MUST exit MPA,
    /// leaving the TCP connection open." A [`StartupEvent::Rejected`]
    /// follows; no `Failed`.
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), StartupError> {
        let Phase::ExaminingRequest(req) = &self.phase else {
            return Err(StartupError::InvalidState(self.state()));
        };
        let req = req.clone();
        let plan = ResponderPlan::new(&self.cfg, &req);
        check_private_data(private_data, plan.reply.is_some())?;
        self.send_reply(&req, true, plan.reply, private_data)?;
        self.finish_rejected(req);
        Ok(())
    }

    /// The next frame to write to the TCP connection, in order.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.transmit.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<StartupEvent> {
        self.events.pop_front()
    }

    /// When [`Startup::handle_timeout`] must be called: start + timeout,
    /// until the Startup Phase is over.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.is_finished() {
            None
        } else {
            self.deadline
        }
    }

    /// Fails the Startup Phase with code 1 if `now` is at or past the
    /// deadline. RFC 5044 §7.1.2 rule 10: "MPA implementations SHOULD
    /// implement a reasonable timeout while waiting for the entire set of
    /// startup frames"; rule 8 asks the same of a Responder, "to detect
    /// incorrect "Responder/Responder" startups".
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.is_finished() {
            return;
        }
        if self.deadline.is_some_and(|d| now >= d) {
            self.fail(FailureReason::Timeout);
        }
    }

    fn fail(&mut self, reason: FailureReason) {
        self.phase = Phase::Failed(reason);
        // Nothing more goes out as a startup frame.
        self.transmit.clear();
        self.events.push_back(StartupEvent::Failed {
            code: reason.code(),
            send_terminate: reason.send_terminate(),
        });
    }

    /// Checks the header octets received so far; called after each one.
    fn check_header(&self, expected: FrameKind) -> Result<(), FailureReason> {
        let key = self
            .rx
            .get(..self.rx.len().min(KEY_LEN))
            .unwrap_or_default();
        let request = REQUEST_KEY.starts_with(key);
        let reply = REPLY_KEY.starts_with(key);
        match (request, reply, expected) {
            // RFC 5044 §7.1.1 Key: receivers "MUST check this field for the
            // same value, and close the connection and report an error
            // locally if any other value is detected."
            (false, false, _) => return Err(FailureReason::InvalidFrame(mpa::Error::BadKey)),
            // RFC 5044 §7.1.2 rule 8: "MPA implementations MUST use the
            // difference between the MPA Request Frame and the MPA Reply
            // Frame to check for incorrect "Initiator/Initiator" startups."
            (true, false, FrameKind::Reply) => return Err(FailureReason::InitiatorInitiator),
            (false, true, FrameKind::Request) => return Err(FailureReason::UnexpectedReply),
            _ => {}
        }
        if self.rx.len() == REV_OFFSET + 1 {
            let rev = self.rx.get(REV_OFFSET).copied().unwrap_or_default();
            // RFC 5044 §7.1.1 Rev: "MPA receivers compliant with this
            // version of the specification MUST check this field. If the
            // MPA receiver cannot interoperate with the received version,
            // then it MUST close the connection and report an error
            // locally." A responder takes Rev 1 up to its configured Rev
            // (RFC 6581 §6: "MUST continue to accept MPA Requests with
            // version one"); an initiator takes a Reply of Rev 1 or 2 and
            // checks S against its Request once the frame is in.
            let max = match self.role {
                Role::Responder => self.cfg.rev,
                Role::Initiator => REV_2,
            };
            if !(REV_1..=max).contains(&rev) {
                return Err(FailureReason::UnsupportedRev(rev));
            }
        }
        Ok(())
    }

    /// The whole frame is in `self.rx`.
    fn on_frame(&mut self) {
        let mut rx = core::mem::take(&mut self.rx);
        {
            let mut frame = Frame::new_unchecked(&mut rx[..]);
            // S is a Rev 2 field (RFC 6581 §6: to use any enhanced feature
            // Rev "MUST be set to two or higher"). In a Rev 1 frame its bit
            // is RFC 5044's Res: "MUST be set to zero when sending, and not
            // checked on reception".
            if frame.check_len().is_ok() && frame.rev() < REV_2 {
                frame.set_enhanced(false);
            }
        }
        let parsed = Frame::new_checked(&rx[..])
            .and_then(|f| FrameRepr::parse(&f))
            .and_then(|repr| repr.split_private_data().map(|(e, pd)| (repr, e, pd)));
        match parsed {
            // RFC 5044 §7.1.2 rules 2 and 3: "If the MPA Request [Reply]
            // Frame is improperly formatted, the implementation MUST close
            // the TCP connection and exit MPA."
            Err(e) => self.fail(FailureReason::InvalidFrame(e)),
            Ok((repr, enhanced, pd)) => match self.role {
                Role::Responder => self.on_request(&repr, enhanced, pd),
                Role::Initiator => self.on_reply(&repr, enhanced, pd),
            },
        }
    }

    fn on_request(&mut self, repr: &FrameRepr<'_>, enhanced: Option<EnhancedRepr>, pd: &[u8]) {
        let req = ReceivedRequest {
            rev: repr.rev,
            markers: repr.markers,
            crc: repr.crc,
            enhanced,
            private_data: pd.to_vec(),
        };
        let (peer_ird, peer_ord) = req.peer_ird_ord();
        // RFC 5044 §7.1.1 PD_Length: "the MPA receiver should pass the
        // PD_Length value and Private Data to the ULP".
        self.events.push_back(StartupEvent::Request {
            rev: req.rev,
            private_data: req.private_data.clone(),
            peer_ird,
            peer_ord,
        });
        self.phase = Phase::ExaminingRequest(req);
    }

    fn on_reply(&mut self, repr: &FrameRepr<'_>, enhanced: Option<EnhancedRepr>, pd: &[u8]) {
        let (peer_ird, peer_ord) = enhanced.map_or((NO_NEG, NO_NEG), |e| (e.ird, e.ord));
        if repr.rejected {
            // RFC 5044 §7.1.2 rule 3: "if the Rejected Connection bit is set
            // to '1', the implementation MUST exit MPA, leaving the TCP
            // connection open." RFC 6581 §9.1: "The initiator MUST pass the
            // responder provided IRD and ORD to the ULP for both MPA Accept
            // and Reject messages."
            self.phase = Phase::Rejected;
            self.events.push_back(StartupEvent::Rejected {
                private_data: pd.to_vec(),
                peer_ird,
                peer_ord,
            });
            return;
        }
        let mut negotiated = Negotiated {
            rev: repr.rev,
            // RFC 5044 §7.1.1 C: "When this bit is '1' in either the MPA
            // Request Frame or MPA Reply Frame, CRCs MUST be generated and
            // checked by both endpoints."
            crc: self.cfg.crc || repr.crc,
            // M: the Reply's M asks for Markers in what we send.
            tx_markers: repr.markers,
            rx_markers: self.cfg.markers,
            ird: self.cfg.ird,
            ord: self.cfg.ord,
            peer_ird,
            peer_ord,
            rtr: None,
            peer_private_data: pd.to_vec(),
            role: Role::Initiator,
        };
        let outcome = match (self.sent, enhanced) {
            // Rev 1 (or S=0) both ways: RFC 5044 as it stands, no RTR.
            (None, None) => Ok(()),
            (Some(sent), Some(reply)) => {
                negotiate_initiator(&self.cfg, &sent, &reply, &mut negotiated)
            }
            // RFC 6581 §10: "If the responder receives an enhanced MPA
            // message, it MUST respond with an enhanced MPA message", and to
            // an unenhanced one "it MUST respond with an unenhanced MPA
            // message". Either mismatch makes the Reply improperly formatted
            // for this exchange: close (RFC 5044 §7.1.2 rule 3).
            (sent, received) => {
                self.fail(FailureReason::EnhancedMismatch {
                    sent: sent.is_some(),
                    received: received.is_some(),
                });
                return;
            }
        };
        // Kept on failure as well: the Terminate is framed with it.
        self.negotiated = Some(negotiated.clone());
        match outcome {
            Ok(()) => {
                // RFC 5044 §7.1.2 rule 3: "the implementation SHOULD enter
                // Full MPA/DDP Operation Phase".
                self.phase = Phase::FullOperation;
                self.events.push_back(StartupEvent::Established(negotiated));
            }
            Err(reason) => self.fail(reason),
        }
    }

    fn send_reply(
        &mut self,
        req: &ReceivedRequest,
        rejected: bool,
        reply: Option<EnhancedRepr>,
        private_data: &[u8],
    ) -> Result<(), StartupError> {
        // RFC 6581 §10: enhanced Request, enhanced Reply; unenhanced,
        // unenhanced — and the Reply carries the Request's Rev.
        let frame = build_frame(
            FrameKind::Reply,
            &self.cfg,
            rejected,
            req.rev,
            reply,
            private_data,
        )?;
        self.transmit.push_back(frame);
        Ok(())
    }

    fn finish_rejected(&mut self, req: ReceivedRequest) {
        let (peer_ird, peer_ord) = req.peer_ird_ord();
        self.phase = Phase::Rejected;
        self.events.push_back(StartupEvent::Rejected {
            private_data: req.private_data,
            peer_ird,
            peer_ord,
        });
    }
}

fn check_private_data(pd: &[u8], enhanced: bool) -> Result<(), StartupError> {
    // RFC 5044 §7.1.1: "The Private Data field MUST be between 0 and 512
    // octets in length"; RFC 6581 §9 takes 4 of them for the enhanced data.
    let max = if enhanced {
        MAX_ENHANCED_PRIVATE_DATA
    } else {
        MAX_PRIVATE_DATA
    };
    if pd.len() > max {
        return Err(StartupError::PrivateDataTooLong { len: pd.len(), max });
    }
    Ok(())
}

fn build_frame(
    kind: FrameKind,
    cfg: &StartupConfig,
    rejected: bool,
    rev: u8,
    enhanced: Option<EnhancedRepr>,
    ulp_data: &[u8],
) -> Result<Vec<u8>, StartupError> {
    let mut private_data = Vec::with_capacity(ENHANCED_LEN + ulp_data.len());
    if let Some(e) = enhanced {
        private_data.extend_from_slice(&e.to_bytes().map_err(StartupError::Encode)?);
    }
    private_data.extend_from_slice(ulp_data);
    FrameRepr {
        kind,
        markers: cfg.markers,
        crc: cfg.crc,
        rejected,
        enhanced: enhanced.is_some(),
        rev,
        private_data: &private_data,
    }
    .to_vec()
    .map_err(StartupError::Encode)
}

/// The responder's side of RFC 6581 §9.1 and §9.2 for one Request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ResponderPlan {
    /// The enhanced data of the Reply (None for an unenhanced Request).
    reply: Option<EnhancedRepr>,
    /// Local IRD/ORD.
    ird: u16,
    ord: u16,
    /// The one RTR flag set in the Reply.
    rtr: Option<Rtr>,
}

impl ResponderPlan {
    fn new(cfg: &StartupConfig, req: &ReceivedRequest) -> ResponderPlan {
        let Some(init) = req.enhanced else {
            // RFC 6581 §10: "let the ULP deal with ORD and IRD and
            // peer-to-peer negotiations".
            return ResponderPlan {
                reply: None,
                ird: cfg.ird,
                ord: cfg.ord,
                rtr: None,
            };
        };
        // RFC 6581 §9.2: "If Control Flag A is 1 in the MPA Request message,
        // then the responder MUST set Control Flag A to 1 in the MPA reply
        // message." and "The responder MUST set Control Flag A to 0 if
        // Control Flag A is 0 in the request."
        let rtr = if init.peer_to_peer {
            // "For each initiator-supported RTR indication option, the
            // responder SHOULD set the corresponding Control Flag if the
            // responder can support that option ... The responder is not
            // required to specify all RTR indication options it supports."
            // We set exactly one, the one we prefer, so that both ends know
            // which RTR comes. "If the responder does not support any of the
            // initiator-specified RTR indication options, then the responder
            // MUST set at least one RTR indication type option it supports."
            RtrSet::of(&init)
                .intersection(cfg.rtr)
                .preferred()
                .or_else(|| cfg.rtr.preferred())
        } else {
            None
        };
        let (mut ird, mut reply_ird) = responder_ird(cfg.ird, init.ord);
        let (ord, reply_ord) = responder_ord(cfg.ord, init.ird);
        // "If the initiator ORD is insufficient to support the selected
        // connection model, the responder IRD MAY be increased; for example,
        // if the initiator ORD is 0 ... and the responder supports use of a
        // zero-length RDMA Read RTR indication, then the responder IRD can
        // be set to 1." (Not when the IRD is the ULP's, at 0x3FFF.)
        if rtr == Some(Rtr::Read) && ird == 0 && reply_ird != NO_NEG {
            ird = 1;
            reply_ird = 1;
        }
        let flags = rtr.map_or(RtrSet::NONE, RtrSet::only);
        ResponderPlan {
            reply: Some(EnhancedRepr {
                peer_to_peer: init.peer_to_peer,
                rtr_send: flags.send,
                rtr_write: flags.write,
                rtr_read: flags.read,
                ird: reply_ird,
                ord: reply_ord,
            }),
            ird,
            ord,
            rtr,
        }
    }
}

/// Responder IRD: (local, in the Reply), from our IRD and the initiator ORD.
fn responder_ird(local: u16, initiator_ord: u16) -> (u16, u16) {
    // RFC 6581 §9.1: "The responder MUST respond to an initiator ORD value
    // of 0x3FFF by leaving its local endpoint IRD value unchanged and
    // setting the IRD to 0x3FFF in its reply message."
    if initiator_ord == NO_NEG {
        (local, NO_NEG)
    } else {
        // "This is the actual value that the responder sets for its local
        // IRD"; below the initiator ORD the initiator lowers its ORD.
        (local, local)
    }
}

/// Responder ORD: (local, in the Reply), from our ORD and the initiator IRD.
fn responder_ord(local: u16, initiator_ird: u16) -> (u16, u16) {
    // RFC 6581 §9.1: "The responder MUST respond to an initiator IRD value
    // of 0x3FFF by leaving its local endpoint ORD value unchanged, and
    // setting ORD to 0x3FFF in its reply message."
    if initiator_ird == NO_NEG {
        (local, NO_NEG)
    } else {
        // "The responder MUST set its ORD at most to the initiator IRD."
        let ord = local.min(initiator_ird);
        (ord, ord)
    }
}

/// The initiator's side of RFC 6581 §9.1 and §9.2 on an enhanced Reply
/// with R=0. Fills `n.ird`, `n.ord`, `n.rtr`.
fn negotiate_initiator(
    cfg: &StartupConfig,
    sent: &EnhancedRepr,
    reply: &EnhancedRepr,
    n: &mut Negotiated,
) -> Result<(), FailureReason> {
    // RFC 6581 §9.1: "The initiator MUST leave its local endpoint IRD value
    // unchanged upon receiving a responder ORD value of 0x3FFF."
    if reply.ord != NO_NEG && reply.ord > cfg.ird {
        // "Upon receiving the MPA Accept Frame from the responder, the
        // initiator MUST set its IRD at least to the responder ORD ... If
        // the initiator does not have sufficient resources for the required
        // IRD, it MUST send a TERM message to the responder indicating
        // insufficient resources ... Error Code 6." Our configured IRD is
        // all we have (it is what we offered).
        return Err(FailureReason::InsufficientIrd {
            responder_ord: reply.ord,
            ird: cfg.ird,
        });
    }
    n.ird = cfg.ird;
    // "The initiator MUST leave its local endpoint ORD value unchanged upon
    // receiving a responder IRD value of 0x3FFF." Otherwise: "its ORD at
    // most to the responder IRD".
    n.ord = if reply.ird == NO_NEG {
        cfg.ord
    } else {
        cfg.ord.min(reply.ird)
    };

    // RFC 6581 §9.2: "The responder MUST set Control Flag A to 0 if Control
    // Flag A is 0 in the request" and to 1 if it is 1. A Reply that does
    // not echo A is a "failure to negotiate a mutually compatible
    // connection model": "the TERM message MUST contain Layer 2, Error Type
    // 0, Error Code 7."
    if sent.peer_to_peer != reply.peer_to_peer {
        return Err(FailureReason::ConnectionModelMismatch {
            sent: sent.peer_to_peer,
            received: reply.peer_to_peer,
        });
    }
    if !reply.peer_to_peer {
        return Ok(());
    }
    // "Upon receiving the MPA Accept Frame with Control Flag A set to 1, the
    // initiator MUST generate one of the negotiated RTR indications." We can
    // generate what we offered ("each of the options it supports"), and a
    // zero-length Read only if the responder has room for a Read Request
    // (our ORD is at most its IRD).
    let offered = RtrSet::of(sent);
    let responder = RtrSet::of(reply);
    let mut usable = responder.intersection(offered);
    if reply.ird == 0 {
        usable = usable.without(Rtr::Read);
    }
    let Some(rtr) = usable.preferred() else {
        // "If the initiator is not able to generate any of the
        // responder-supported RTR indications, then it MUST send a TERM
        // message to the responder ... Error Code 7."
        return Err(FailureReason::NoMatchingRtr { offered, responder });
    };
    // The Read RTR takes one ORD slot; within the responder IRD (>= 1 here)
    // unless the ORD is the ULP's (responder IRD 0x3FFF).
    if rtr == Rtr::Read && n.ord == 0 && reply.ird != NO_NEG {
        n.ord = 1;
    }
    n.rtr = Some(rtr);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enh(a: bool, rtr: RtrSet, ird: u16, ord: u16) -> EnhancedRepr {
        EnhancedRepr {
            peer_to_peer: a,
            rtr_send: rtr.send,
            rtr_write: rtr.write,
            rtr_read: rtr.read,
            ird,
            ord,
        }
    }

    fn request(e: Option<EnhancedRepr>) -> ReceivedRequest {
        ReceivedRequest {
            rev: if e.is_some() { 2 } else { 1 },
            markers: false,
            crc: true,
            enhanced: e,
            private_data: Vec::new(),
        }
    }

    fn negotiated() -> Negotiated {
        Negotiated {
            rev: 2,
            crc: true,
            tx_markers: false,
            rx_markers: false,
            ird: 0,
            ord: 0,
            peer_ird: 0,
            peer_ord: 0,
            rtr: None,
            peer_private_data: Vec::new(),
            role: Role::Initiator,
        }
    }

    #[test]
    fn rtr_preference() {
        assert_eq!(RtrSet::ALL.preferred(), Some(Rtr::Write));
        assert_eq!(RtrSet::ALL.without(Rtr::Write).preferred(), Some(Rtr::Read));
        assert_eq!(RtrSet::only(Rtr::Send).preferred(), Some(Rtr::Send));
        assert_eq!(RtrSet::NONE.preferred(), None);
        assert_eq!(
            RtrSet::only(Rtr::Send)
                .with(Rtr::Read)
                .intersection(RtrSet::ALL),
            RtrSet {
                send: true,
                write: false,
                read: true
            }
        );
        assert!(RtrSet::NONE.is_empty() && !RtrSet::only(Rtr::Read).is_empty());
    }

    #[test]
    fn responder_ird_ord_rules() {
        // Plain: IRD ours, ORD at most the initiator IRD.
        assert_eq!(responder_ird(4, 8), (4, 4));
        assert_eq!(responder_ord(32, 16), (16, 16));
        assert_eq!(responder_ord(3, 16), (3, 3));
        // 0x3FFF from the initiator: local unchanged, 0x3FFF in the Reply.
        assert_eq!(responder_ird(4, NO_NEG), (4, NO_NEG));
        assert_eq!(responder_ord(32, NO_NEG), (32, NO_NEG));
    }

    #[test]
    fn responder_plan_read_rtr_raises_ird() {
        let cfg = StartupConfig {
            ird: 0,
            rtr: RtrSet::only(Rtr::Read),
            ..StartupConfig::default()
        };
        let plan = ResponderPlan::new(&cfg, &request(Some(enh(true, RtrSet::ALL, 4, 0))));
        assert_eq!(plan.rtr, Some(Rtr::Read));
        assert_eq!((plan.ird, plan.reply.unwrap().ird), (1, 1));
        // Not when the initiator ORD is 0x3FFF: the IRD stays the ULP's.
        let plan = ResponderPlan::new(&cfg, &request(Some(enh(true, RtrSet::ALL, 4, NO_NEG))));
        assert_eq!((plan.ird, plan.reply.unwrap().ird), (0, NO_NEG));
    }

    #[test]
    fn responder_plan_unenhanced() {
        let cfg = StartupConfig::default();
        let plan = ResponderPlan::new(&cfg, &request(None));
        assert_eq!(
            plan,
            ResponderPlan {
                reply: None,
                ird: 16,
                ord: 16,
                rtr: None
            }
        );
    }

    #[test]
    fn initiator_rules() {
        let cfg = StartupConfig {
            ird: 8,
            ord: 4,
            ..StartupConfig::default()
        };
        let sent = enh(true, RtrSet::ALL, 8, 4);
        let mut n = negotiated();
        // Responder ORD 9 > our IRD 8: code 6.
        assert_eq!(
            negotiate_initiator(&cfg, &sent, &enh(true, RtrSet::ALL, 2, 9), &mut n),
            Err(FailureReason::InsufficientIrd {
                responder_ord: 9,
                ird: 8
            })
        );
        // ORD lowered to the responder IRD, IRD kept.
        assert_eq!(
            negotiate_initiator(
                &cfg,
                &sent,
                &enh(true, RtrSet::only(Rtr::Read), 2, 8),
                &mut n
            ),
            Ok(())
        );
        assert_eq!((n.ird, n.ord, n.rtr), (8, 2, Some(Rtr::Read)));
        // 0x3FFF: unchanged both ways.
        assert_eq!(
            negotiate_initiator(&cfg, &sent, &enh(true, RtrSet::ALL, NO_NEG, NO_NEG), &mut n),
            Ok(())
        );
        assert_eq!((n.ird, n.ord, n.rtr), (8, 4, Some(Rtr::Write)));
        // Read only, responder IRD 0: no usable RTR.
        assert_eq!(
            negotiate_initiator(
                &cfg,
                &sent,
                &enh(true, RtrSet::only(Rtr::Read), 0, 0),
                &mut n
            ),
            Err(FailureReason::NoMatchingRtr {
                offered: RtrSet::ALL,
                responder: RtrSet::only(Rtr::Read)
            })
        );
        // Read RTR with ORD 0 takes one slot.
        let cfg0 = StartupConfig { ord: 0, ..cfg };
        let sent0 = enh(true, RtrSet::only(Rtr::Read), 8, 0);
        assert_eq!(
            negotiate_initiator(
                &cfg0,
                &sent0,
                &enh(true, RtrSet::only(Rtr::Read), 1, 0),
                &mut n
            ),
            Ok(())
        );
        assert_eq!((n.ord, n.rtr), (1, Some(Rtr::Read)));
    }

    #[test]
    fn config_validation() {
        let ok = StartupConfig::default();
        assert_eq!(ok.validate(Role::Initiator), Ok(()));
        assert_eq!(ok.validate(Role::Responder), Ok(()));
        for bad in [
            StartupConfig {
                rev: 0,
                ..ok.clone()
            },
            StartupConfig {
                rev: 3,
                ..ok.clone()
            },
            StartupConfig {
                ird: 0x4000,
                ..ok.clone()
            },
            StartupConfig {
                ord: 0x4000,
                ..ok.clone()
            },
            StartupConfig {
                required_ord: NO_NEG,
                ..ok.clone()
            },
            StartupConfig {
                rtr: RtrSet::NONE,
                ..ok.clone()
            },
        ] {
            assert!(matches!(
                bad.validate(Role::Initiator)
                    .or(bad.validate(Role::Responder)),
                Err(StartupError::InvalidConfig(_))
            ));
        }
        // Rev 1 and client-server need no RTR option.
        let rev1 = ok.rev1();
        assert_eq!(rev1.rtr, RtrSet::NONE);
        assert_eq!(rev1.validate(Role::Initiator), Ok(()));
        assert_eq!(rev1.validate(Role::Responder), Ok(()));
        let cs = StartupConfig {
            peer_to_peer: false,
            rtr: RtrSet::NONE,
            ..ok
        };
        assert_eq!(cs.validate(Role::Initiator), Ok(()));
    }

    #[test]
    fn error_codes() {
        assert_eq!(
            TermCode::from(StartupError::InsufficientIrd {
                initiator_ird: 1,
                required_ord: 2
            }),
            TermCode::MPA_INSUFFICIENT_IRD
        );
        assert_eq!(
            TermCode::from(StartupError::PrivateDataTooLong { len: 513, max: 512 }),
            TermCode::MPA_LOCAL_CATASTROPHIC
        );
        assert_eq!(FailureReason::Timeout.code(), TermCode::MPA_CONNECTION_LOST);
        assert!(!FailureReason::Timeout.send_terminate());
        assert_eq!(
            FailureReason::InitiatorInitiator.to_string(),
            "Initiator/Initiator startup"
        );
        assert_eq!(
            StartupError::PrivateDataTooLong { len: 509, max: 508 }.to_string(),
            "MPA private data of 509 octets exceeds 508"
        );
    }
}
