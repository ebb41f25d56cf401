//! The close of a connection (draft §8.2): the application's `shutdown`,
//! `close` and abortive close, the graceful exchange's end and the
//! abortive one, the state of each half ([`Ending`], [`Reading`]) and of
//! the LLP ([`Llp`]); why a connection closed, and the protocol
//! violations that close it abortively.
//!
//! §8.2.2: "If an SDP protocol violation occurs, an implementation SHOULD
//! abortively close the connection." Every [`Violation`] names the rule it
//! breaks ([`Violation::rule`]) so the close can be logged as
//! `abortive close: <what> (<section>)`.
//!
//! ```
//! use sdp_core::conn::{CloseReason, Violation};
//!
//! let v = Violation::DataAfterDisConn;
//! assert_eq!(v.rule(), "§8.2.1");
//! assert_eq!(
//!     CloseReason::Violation(v).to_string(),
//!     "abortive close: ULP payload after DisConn (§8.2.1)"
//! );
//! ```

use core::fmt;
use std::time::Instant;

use super::credit::CreditFault;
use super::{seq_ge, AbortConn, Conn, Shutdown, State};
use crate::errno::Error;
use crate::verbs::{ErrorKind, Teardown};
use crate::wire::{self, Mid};

/// Our half of the close (§8.2.1), one state for what was flags: the
/// writer shut, its DisConn posted, and that DisConn's completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// Writing goes on.
    Open,
    /// Shut for writing (`shutdown`, a close): the DisConn follows the
    /// data accepted before.
    Shut,
    /// The DisConn was posted as MSeq `mseq` (`after_peer`: the peer's had
    /// arrived); `done` once its Send completed.
    DisConn {
        mseq: u32,
        after_peer: bool,
        done: bool,
    },
}

impl Ending {
    /// `shutdown(SHUT_WR)` or a close: no more bytes are accepted.
    pub fn shut(&mut self) {
        if *self == Ending::Open {
            *self = Ending::Shut;
        }
    }

    pub fn disconn_sent(self) -> bool {
        matches!(self, Ending::DisConn { .. })
    }
}

/// The application's reading half: open, shut (`shutdown(SHUT_RD)`: no
/// more bytes are read), or released (closed: nobody will read, and
/// data that arrives ends the connection, as Linux TCP resets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reading {
    Open,
    Shut,
    Released,
}

/// The LLP connection under the session: up, to be closed by the next
/// Op ([`Teardown`]), or closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Llp {
    Up,
    Due(Teardown),
    Down,
}

/// The close itself: the application's calls (§8.2.1 graceful, §8.2.2
/// abortive) and the steps both closes share.
impl Conn {
    /// `shutdown(2)`. SHUT_WR sends DisConn once every accepted byte is
    /// sent (§8.2.1); receiving goes on. ENOTCONN while the Connecting
    /// Peer waits for the HelloAck, as TCP's before its connect finished,
    /// and after the connection closed. An accepted connection waiting
    /// for the RTR is one the program already has, as TCP's accepted one:
    /// its DisConn follows the HelloAck.
    pub fn shutdown(&mut self, how: Shutdown) -> Result<(), Error> {
        if !matches!(self.state, State::Connected | State::HelloReceived) {
            return Err(Error::NotConnected);
        }
        if matches!(how, Shutdown::Read | Shutdown::Both) && self.reading == Reading::Open {
            self.reading = Reading::Shut;
        }
        if matches!(how, Shutdown::Write | Shutdown::Both) {
            self.ending.shut();
        }
        Ok(())
    }

    /// `close(2)` of the last descriptor: a graceful close that finishes
    /// on its own (data out, DisConn, wait for the peer's DisConn and the
    /// LLP teardown), aborted after [`Config::close_timeout`]. As Linux
    /// TCP, unread received data turns it into an abortive close, and so
    /// does data arriving afterwards.
    pub fn close(&mut self, now: Instant) {
        self.reading = Reading::Released;
        match self.state {
            State::Closed => {}
            State::HelloSent => {
                self.reason.get_or_insert(CloseReason::LocalAbort);
                self.finish(Teardown::Abortive);
            }
            // The peer's connect is not complete before the HelloAck: the
            // setup finishes, then the graceful close goes as for a
            // connected one (an abort would make the peer's connect fail,
            // where TCP's succeeded before the accept).
            State::HelloReceived | State::Connected => {
                if self.rx.queued() > 0 {
                    self.abort_with(CloseReason::LocalAbort, None);
                } else {
                    self.ending.shut();
                    if self.deadline.is_none() {
                        self.deadline = Some(now + self.config.close_timeout);
                    }
                }
            }
        }
    }

    /// Abortive close by the application (`SO_LINGER` 0 then close):
    /// AbortConn if a DisConn went out, else an immediate LLP reset
    /// (§8.2.2).
    pub fn abort(&mut self) {
        self.reading = Reading::Released;
        self.abort_local();
    }

    pub(super) fn abort_local(&mut self) {
        if matches!(self.state, State::HelloSent | State::HelloReceived) {
            self.reason.get_or_insert(CloseReason::LocalAbort);
            self.finish(Teardown::Abortive);
        } else {
            self.abort_with(CloseReason::LocalAbort, None);
        }
    }

    /// §8.2.1: both DisConns are out and ours completed.
    pub(super) fn check_graceful(&mut self, now: Instant) {
        if self.state != State::Connected || self.abort_conn != AbortConn::None {
            return;
        }
        let (
            Ending::DisConn {
                mseq,
                after_peer,
                done: true,
            },
            Some(peer_ack),
        ) = (self.ending, self.peer_disconn)
        else {
            return;
        };
        // The Remote Peer (which received the DisConn first) "MUST use the
        // LLP connection teardown protocol to complete the teardown"
        // (§8.2.1 Remote Peer step 4). If the two DisConns crossed, both
        // are Remote Peers.
        if after_peer || !seq_ge(peer_ack, mseq) {
            self.reason.get_or_insert(CloseReason::Graceful);
            self.finish(Teardown::Graceful);
        } else if self.deadline.is_none() {
            // Local Peer: wait for the LLP teardown (§8.2.1 steps 3–4).
            self.deadline = Some(now + self.config.close_timeout);
        }
    }

    /// A protocol violation: abortive close naming the rule (§8.2.2).
    pub(super) fn violation(&mut self, v: Violation) {
        self.abort_with(CloseReason::Violation(v), Some(Error::ConnectionReset));
    }

    /// Abortive close (§8.2.2).
    pub(super) fn abort_with(&mut self, reason: CloseReason, error: Option<Error>) {
        if self.state == State::Closed || self.abort_conn != AbortConn::None {
            return;
        }
        self.reason.get_or_insert(reason);
        if let Some(e) = error {
            self.error.get_or_insert(e);
        }
        // §8.2.2: "An implementation MUST discard any unsent ULP data."
        self.tx.discard_unsent();
        self.control.clear();
        self.hello_ack_due = false;
        self.deadline = None;
        if self.state == State::Connected && self.ending.disconn_sent() {
            // §8.2.2: "If the LLP connection is still valid and a DisConn
            // Message was previously sent, then an implementation MUST send
            // an AbortConn Message and process its completion before
            // terminating the LLP connection."
            self.abort_conn = AbortConn::Pending;
        } else {
            // §8.2.2: "If the LLP connection is not valid, or if the LLP
            // connection is valid and no DisConn Message was previously
            // sent, an implementation MUST NOT attempt to send additional
            // SDP Messages and MUST immediately terminate the LLP
            // connection."
            self.finish(Teardown::Abortive);
        }
    }

    /// Ends the connection: the next Op is the LLP teardown.
    pub(super) fn finish(&mut self, teardown: Teardown) {
        if self.state == State::Closed {
            return;
        }
        self.state = State::Closed;
        // A teardown gone out already (a resume's) stays the one.
        if self.llp != Llp::Down {
            self.llp = Llp::Due(teardown);
        }
        self.deadline = None;
        // §8.2.1 step 4: "In either case, the Local Peer MUST complete all
        // ULP receive buffers".
        self.complete_posted();
        self.to_post.clear();
        self.control.clear();
        self.hello_ack_due = false;
        if teardown == Teardown::Abortive {
            self.tx.discard_unsent();
        }
    }
}

/// A protocol violation by the peer (or a broken adapter), each naming the
/// draft section it breaks.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Violation {
    /// A message that does not parse or breaks a field rule of §6
    /// (bad Len, payload where none is allowed, MaxAdverts 0, ...).
    Malformed(wire::Error),
    /// A reserved or experimental MID (§6.1.1, Figure 3).
    ReservedMid(Mid),
    /// A defined message that may not arrive now: a Hello or HelloAck after
    /// setup, a completion or acknowledgement of something never sent, a
    /// second DisConn, a first message other than HelloAck, a SuspComm
    /// after a DisConn or while one is being answered (§13.1.1).
    UnexpectedMessage(Mid),
    /// A message longer than the receive Private Buffer it landed in
    /// (§10 constraint 3: "A Local Peer MUST NOT send SDP Messages larger
    /// than the size of the Remote Peer's receive Private Buffers").
    MessageTooLarge {
        /// Message length.
        len: usize,
        /// Buffer size.
        size: usize,
    },
    /// MSeq gap, bad MSeqAck, or a message sent without the credit §10.5
    /// requires.
    Credit(CreditFault),
    /// ULP payload after the peer's DisConn (§8.2.1: "no ULP data will be
    /// received by the Remote Peer after the Remote Peer receives the
    /// DisConn Message").
    DataAfterDisConn,
    /// OOB_PRES without an OOB_PEND sent no later (§9.5.3).
    OobPresWithoutPend,
    /// More than 65,535 bytes between OOB_PEND and its OOB byte (§9.5.3).
    OobPendTooFar,
    /// Initial Bufs below three in Hello or HelloAck (§10.3: "The initial
    /// send credit advertisements from each peer MUST be greater than or
    /// equal to three").
    TooFewBufs(u16),
    /// A receive Private Buffer size below BSDH + SinkAH + 1 = 37 bytes
    /// (§10 constraint 4).
    BufferTooSmall(u32),
    /// A Combined Mode rule broken (§11.2): SrcAvail without payload, a
    /// second SrcAvail or payload while one is In-Process, or a SinkAvail
    /// (Write Zcopy needs Pipelined Mode).
    CombinedMode(Mid),
    /// A Buffered Mode rule broken (§11.1): a SrcAvail towards a Buffered
    /// receive half, a SinkAvail towards a Buffered send half.
    BufferedMode(Mid),
    /// A Pipelined Mode rule broken (§11.3): ULP payload in a SrcAvail, or
    /// payload while SrcAvails are outstanding.
    PipelinedMode(Mid),
    /// More SrcAvail or SinkAvail advertisements outstanding than our
    /// MaxAdverts (§11.3).
    TooManyAdverts(Mid),
    /// A ModeChange outside Figure 26, from the Mode Slave, or naming the
    /// current Mode (§12).
    BadModeChange {
        /// The S bit: our send half-connection.
        send: bool,
        /// Our Mode of that half-connection.
        from: super::FlowControlMode,
        /// The Mode asked for (MCH value).
        to: u8,
    },
    /// A Send with Invalidate naming another STag than the advertised one
    /// (§9.2, §9.3), or invalidating one where none was advertised.
    WrongStag {
        /// The message that carried it.
        mid: Mid,
        /// The STag it invalidated.
        got: u32,
    },
    /// An RdmaRdCompl or RdmaWrCompl Len beyond what the advertisement left
    /// (§6.3.6.1, §6.3.7.1).
    ZcopyLength(Mid),
    /// A ChRcvBufAck size against the §10.6 rules.
    BadChRcvBufAck(u32),
    /// A message this implementation does not handle.
    Unsupported(Mid),
    /// A LocalData for a slot other than the next, or longer than a slot,
    /// or empty (the same-host extension, [`crate::wire::local`]).
    LocalData {
        /// The slot it named.
        slot: u32,
        /// Its Len.
        len: u32,
    },
    /// The adapter reported a completion that does not match the oldest
    /// posted work request (RFC 5040 §5: completions are in order).
    BadCompletion,
}

impl Violation {
    /// The draft section(s) whose rule was broken.
    pub fn rule(&self) -> &'static str {
        match self {
            Violation::Malformed(e) => e.rule(),
            Violation::ReservedMid(_) => "§6.1.1",
            Violation::UnexpectedMessage(mid) => match *mid {
                Mid::HELLO | Mid::HELLO_ACK => "§8.1.1",
                Mid::DIS_CONN => "§8.2.1",
                Mid::SEND_SM => "§9.5.2.1",
                Mid::RDMA_RD_COMPL => "§9.2",
                Mid::RDMA_WR_COMPL => "§9.3",
                Mid::SINK_CANCEL_ACK => "§9.5.5",
                Mid::SRC_AVAIL_CANCEL => "§9.5.4",
                Mid::CH_RCV_BUF_ACK => "§10.6",
                Mid::SUSP_COMM | Mid::SUSP_COMM_ACK => "§13.1.1",
                _ => "§6.1.1",
            },
            Violation::MessageTooLarge { .. } => "§10",
            Violation::Credit(CreditFault::SequenceGap { .. }) => "§10.1",
            Violation::Credit(CreditFault::BadAck) => "§6.1.6",
            Violation::Credit(_) => "§10.5",
            Violation::DataAfterDisConn => "§8.2.1",
            Violation::OobPresWithoutPend | Violation::OobPendTooFar => "§9.5.3",
            Violation::TooFewBufs(_) => "§10.3",
            Violation::BufferTooSmall(_) => "§10",
            Violation::CombinedMode(_) => "§11.2",
            Violation::BufferedMode(_) => "§11.1",
            Violation::PipelinedMode(_) | Violation::TooManyAdverts(_) => "§11.3",
            Violation::BadModeChange { .. } => "§12",
            Violation::WrongStag { mid, .. } if *mid == Mid::RDMA_WR_COMPL => "§9.3",
            Violation::WrongStag { .. } => "§9.2",
            Violation::ZcopyLength(mid) if *mid == Mid::RDMA_WR_COMPL => "§6.3.6.1",
            Violation::ZcopyLength(_) => "§6.3.7.1",
            Violation::BadChRcvBufAck(_) => "§10.6",
            Violation::Unsupported(Mid::MODE_CHANGE) => "§12",
            Violation::Unsupported(_) => "§13",
            Violation::LocalData { .. } => "§6.1.1, same-host extension",
            Violation::BadCompletion => "RFC 5040 §5",
        }
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // The wire error's text already ends with its section.
            Violation::Malformed(e) => return write!(f, "{e}"),
            Violation::ReservedMid(mid) => write!(f, "undefined MID {mid}"),
            Violation::UnexpectedMessage(mid) => write!(f, "unexpected {mid} message"),
            Violation::MessageTooLarge { len, size } => {
                write!(f, "{len}-byte message for a {size}-byte receive buffer")
            }
            Violation::Credit(CreditFault::SequenceGap { expected, got }) => {
                write!(f, "MSeq {got} where {expected} was due")
            }
            Violation::Credit(CreditFault::BadAck) => {
                write!(f, "MSeqAck acknowledges a message never sent")
            }
            Violation::Credit(CreditFault::NoCredit) => write!(f, "message sent without credit"),
            Violation::Credit(CreditFault::PayloadWithoutCredit) => {
                write!(f, "ULP payload sent with fewer than three credits")
            }
            Violation::Credit(CreditFault::LastCreditMisused) => {
                write!(f, "last credit used for a message that gives no credit")
            }
            Violation::DataAfterDisConn => write!(f, "ULP payload after DisConn"),
            Violation::OobPresWithoutPend => write!(f, "OOB_PRES without OOB_PEND"),
            Violation::OobPendTooFar => {
                write!(f, "more than 65535 bytes between OOB_PEND and its OOB byte")
            }
            Violation::TooFewBufs(n) => write!(f, "initial Bufs {n} below 3"),
            Violation::BufferTooSmall(n) => {
                write!(f, "receive Private Buffer size {n} below 37 bytes")
            }
            Violation::CombinedMode(mid) => write!(f, "{mid} breaks Combined Mode"),
            Violation::BufferedMode(mid) => write!(f, "{mid} breaks Buffered Mode"),
            Violation::PipelinedMode(mid) => write!(f, "{mid} breaks Pipelined Mode"),
            Violation::TooManyAdverts(mid) => write!(f, "{mid} beyond MaxAdverts"),
            Violation::BadModeChange { send, from, to } => {
                let half = if *send { "send" } else { "receive" };
                write!(
                    f,
                    "ModeChange of our {half} half from {from:?} to mode {to}"
                )
            }
            Violation::WrongStag { mid, got } => {
                write!(f, "{mid} invalidated STag {got:#x}, not the advertised one")
            }
            Violation::ZcopyLength(mid) => write!(f, "{mid} Len beyond the advertised buffer"),
            Violation::BadChRcvBufAck(n) => write!(f, "ChRcvBufAck size {n} against the request"),
            Violation::Unsupported(mid) => write!(f, "{mid} not supported yet"),
            Violation::LocalData { slot, len } => {
                write!(
                    f,
                    "LocalData of {len} bytes in slot {slot}, out of the ring"
                )
            }
            Violation::BadCompletion => write!(f, "completion out of order"),
        }?;
        write!(f, " ({})", self.rule())
    }
}

impl std::error::Error for Violation {}

impl From<wire::Error> for Violation {
    fn from(e: wire::Error) -> Violation {
        Violation::Malformed(e)
    }
}

/// How and why a connection ended.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// Both DisConn Messages exchanged and the LLP closed (§8.2.1).
    Graceful,
    /// The local application aborted: SO_LINGER 0, close with unread
    /// data, or data arriving after close (as Linux TCP resets).
    LocalAbort,
    /// The peer sent AbortConn (§8.2.2).
    PeerAbort,
    /// The peer broke a rule; we closed abortively (§8.2.2).
    Violation(Violation),
    /// The LLP or iWARP connection failed.
    Transport(ErrorKind),
    /// The LLP closed without a DisConn: "MUST consider the connection
    /// abortively torn down if the LLP connection is torn down without
    /// receiving a DisConn Message" (§8.2.2).
    TornDown,
    /// The close did not finish in time (§8.2.1 step 3: "When no forward
    /// progress is being made, the connection MAY be abortively closed").
    Timeout,
}

impl CloseReason {
    /// Whether the close was abortive.
    pub fn is_abortive(&self) -> bool {
        !matches!(self, CloseReason::Graceful)
    }
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseReason::Graceful => write!(f, "graceful close (§8.2.1)"),
            CloseReason::LocalAbort => write!(f, "abortive close by the application (§8.2.2)"),
            CloseReason::PeerAbort => write!(f, "abortive close: AbortConn received (§8.2.2)"),
            CloseReason::Violation(v) => write!(f, "abortive close: {v}"),
            CloseReason::Transport(k) => write!(f, "abortive close: {k} (§8.2.2)"),
            CloseReason::TornDown => {
                write!(f, "abortive close: LLP torn down without DisConn (§8.2.2)")
            }
            CloseReason::Timeout => write!(f, "abortive close: close timed out (§8.2.1)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_violation_names_its_rule() {
        let cases: [(Violation, &str); 8] = [
            (
                Violation::Malformed(wire::Error::LengthMismatch),
                "Len is not the size of the message (§6.1.4)",
            ),
            (
                Violation::ReservedMid(Mid(0x20)),
                "undefined MID Reserved(0x20) (§6.1.1)",
            ),
            (
                Violation::MessageTooLarge { len: 70, size: 64 },
                "70-byte message for a 64-byte receive buffer (§10)",
            ),
            (
                Violation::Credit(CreditFault::SequenceGap {
                    expected: 3,
                    got: 5,
                }),
                "MSeq 5 where 3 was due (§10.1)",
            ),
            (
                Violation::Credit(CreditFault::NoCredit),
                "message sent without credit (§10.5)",
            ),
            (
                Violation::DataAfterDisConn,
                "ULP payload after DisConn (§8.2.1)",
            ),
            (
                Violation::UnexpectedMessage(Mid::HELLO_ACK),
                "unexpected HelloAck message (§8.1.1)",
            ),
            (Violation::TooFewBufs(2), "initial Bufs 2 below 3 (§10.3)"),
        ];
        for (v, text) in cases {
            assert_eq!(v.to_string(), text);
        }
    }
}
