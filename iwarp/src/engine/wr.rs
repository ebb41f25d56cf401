//! Work requests, completions and events: the verbs-like surface of the
//! queue pair (RFC 5040 §3.2, "RDMAP Interactions with the ULP").

use core::fmt;

use crate::mem::RegionId;
use crate::wire::ddp::Stag;
use crate::wire::rdmap::ReadRequestRepr;
use crate::wire::terminate::{HdrCt, TermCode};

/// A gather or scatter element: `len` bytes of `region` from `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sge {
    /// The region of [`crate::mem::Memory`].
    pub region: RegionId,
    /// Offset of the first byte.
    pub offset: usize,
    /// Number of bytes.
    pub len: usize,
}

/// The payload of a Send or RDMA Write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Payload {
    /// A gather list in memory: referenced, never copied (RFC 5040 §5.1:
    /// "a gather-list of non-contiguous data blocks ... sent as a single
    /// RDMA Write Message").
    Sges(Vec<Sge>),
    /// Bytes owned by the work request (copied into the transmit buffer).
    Inline(Vec<u8>),
}

impl Payload {
    /// No payload.
    pub fn empty() -> Payload {
        Payload::Inline(Vec::new())
    }

    /// One contiguous range of a region.
    pub fn region(region: RegionId, offset: usize, len: usize) -> Payload {
        Payload::Sges(vec![Sge {
            region,
            offset,
            len,
        }])
    }

    /// Total length in bytes (saturating).
    pub fn len(&self) -> u64 {
        match self {
            Payload::Inline(v) => v.len() as u64,
            Payload::Sges(s) => s
                .iter()
                .fold(0u64, |acc, s| acc.saturating_add(s.len as u64)),
        }
    }

    /// Whether it has no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Which of the four Send operations (RFC 5040 §5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendKind {
    /// Send.
    Send,
    /// Send with Solicited Event.
    SendSe,
    /// Send with Invalidate of the peer's STag.
    SendInvalidate(Stag),
    /// Send with Solicited Event and Invalidate.
    SendSeInvalidate(Stag),
}

/// A Send work request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Which Send.
    pub kind: SendKind,
    /// The ULP message.
    pub payload: Payload,
    /// Whether a successful completion is reported (errors always are).
    pub signaled: bool,
}

/// An RDMA Write work request (RFC 5040 §5.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// The Data Sink's advertised STag.
    pub remote_stag: Stag,
    /// The Data Sink Tagged Offset of the first byte.
    pub remote_to: u64,
    /// The data.
    pub payload: Payload,
    /// Whether a successful completion is reported.
    pub signaled: bool,
}

/// An RDMA Read work request (RFC 5040 §5.2): we are the Data Sink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Our STag the Read Response places into; registered with
    /// [`crate::mem::Access::LOCAL_WRITE`].
    pub local_stag: Stag,
    /// Tagged Offset in it.
    pub local_to: u64,
    /// The peer's advertised STag (Data Source).
    pub remote_stag: Stag,
    /// Tagged Offset in it.
    pub remote_to: u64,
    /// RDMA Read Message Size.
    pub len: u32,
    /// Whether a successful completion is reported.
    pub signaled: bool,
}

/// A receive buffer for one incoming Send (RFC 5041 §5.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where the message is placed.
    pub sge: Sge,
}

/// What a completion completes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// One of the Sends.
    Send,
    /// RDMA Write.
    Write,
    /// RDMA Read.
    Read,
    /// A receive: an incoming Send was delivered.
    Recv,
}

/// How a work request ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// It completed.
    Success,
    /// It was under way when the stream failed with `code`; `remote` when
    /// the peer's Terminate reported it, false when we found it (and sent
    /// a Terminate, RFC 5040 §7.1) or the LLP failed (RFC 5044 §8 code 1).
    /// RFC 5040 §6.2.1: "the state of all outstanding RDMA Messages is
    /// indeterminate, and the Messages SHOULD be considered Completed in
    /// error."
    Error {
        /// The Terminate triple.
        code: TermCode,
        /// Reported by the peer.
        remote: bool,
    },
    /// It had not started when the stream failed (RFC 5040 §5.4: "The
    /// RDMAP layer Completes in error all ULP operations that have not been
    /// provided to the DDP layer").
    Flushed,
}

impl Status {
    /// Whether it is [`Status::Success`].
    pub fn is_success(&self) -> bool {
        *self == Status::Success
    }
}

/// A work completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// The work request's id.
    pub wr_id: u64,
    /// What kind of work it was.
    pub opcode: WcOpcode,
    /// How it ended.
    pub status: Status,
    /// Receives: the ULP Message Length (RFC 5041 §5.4: "DDP MUST provide
    /// the ULP Message Length to the ULP when an Untagged DDP Message is
    /// Delivered"). Sends, Writes, Reads: the length of the work.
    pub byte_len: u32,
    /// Receives of Send with Invalidate: the STag the peer invalidated
    /// (RFC 5040 §3.2).
    pub invalidated: Option<Stag>,
    /// Receives of Send with Solicited Event (RFC 5040 §5.3).
    pub solicited: bool,
}

/// A Terminate message's content, sent or received (RFC 5040 §4.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminateInfo {
    /// Layer, Error Type, Error Code.
    pub code: TermCode,
    /// The M, D, R bits.
    pub hdrct: HdrCt,
    /// DDP Segment Length, when D is set.
    pub segment_length: Option<u16>,
    /// The Terminated DDP Header, when D is set.
    pub ddp_header: Option<Vec<u8>>,
    /// The Terminated RDMA Header, when R is set.
    pub rdma_header: Option<ReadRequestRepr>,
}

impl TerminateInfo {
    /// A Terminate without headers.
    pub fn bare(code: TermCode) -> TerminateInfo {
        TerminateInfo {
            code,
            hdrct: HdrCt::default(),
            segment_length: None,
            ddp_header: None,
            rdma_header: None,
        }
    }
}

/// Something that happened on the stream, other than a work completion.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Responder: an MPA Request arrived; answer with `accept` or `reject`
    /// (RFC 5044 §7.1.2 rule 2).
    ConnectRequest {
        /// MPA revision of the Request.
        rev: u8,
        /// The initiator's Private Data (ULP part).
        private_data: Vec<u8>,
        /// The initiator's IRD and ORD (RFC 6581 §9.1).
        peer_ird: u16,
        /// See `peer_ird`.
        peer_ord: u16,
    },
    /// The Full Operation Phase began.
    Established {
        /// The peer's Private Data.
        private_data: Vec<u8>,
        /// Local IRD after negotiation.
        ird: u16,
        /// Local ORD after negotiation.
        ord: u16,
        /// The peer's IRD as sent (RFC 6581 §9.1: passed to the ULP).
        peer_ird: u16,
        /// The peer's ORD as sent.
        peer_ord: u16,
    },
    /// Initiator: the responder rejected the connection; the LLP is left
    /// open for the ULP (RFC 5044 §7.1.2 rule 3).
    Rejected {
        /// The responder's Private Data.
        private_data: Vec<u8>,
        /// Responder's IRD.
        peer_ird: u16,
        /// Responder's ORD.
        peer_ord: u16,
    },
    /// We found an error and queued a Terminate carrying it (RFC 5040
    /// §7.1); the stream is in [`super::State::Terminate`], then
    /// [`super::State::Error`].
    TerminateSent(TerminateInfo),
    /// The peer's Terminate arrived (RFC 5040 §5.4: "The RDMAP layer MUST
    /// Deliver the Terminate Message to the ULP").
    TerminateReceived(TerminateInfo),
    /// The stream failed without a Terminate: the LLP failed (RFC 5044 §8
    /// code 1), an invalid MPA frame (code 4: close the LLP), or an error
    /// that could not be reported. Close the LLP.
    Failed(TermCode),
}

/// Why a work request was refused at posting.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PostError {
    /// The stream is in Error (or Terminate): RFC 5041 §6.2.1, "any further
    /// data transfer requests ... MUST return an error".
    NotAccepting,
    /// RFC 5041 §5.2: "The ULP Message Length MUST be less than 2^32."
    TooLong,
    /// The Tagged Offset plus the length wraps 2^64.
    ToWrap,
    /// An RDMA Read with an ORD of 0 could never be sent (RFC 5040 §6.1).
    NoOrd,
    /// The local Data Sink STag of a Read is not valid for local write of
    /// this range.
    LocalProtection,
}

impl fmt::Display for PostError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PostError::NotAccepting => "stream does not accept work (Terminate or Error)",
            PostError::TooLong => "message of 2^32 bytes or more",
            PostError::ToWrap => "tagged offset plus length wraps",
            PostError::NoOrd => "RDMA Read with ORD 0",
            PostError::LocalProtection => "local STag not valid for this access",
        })
    }
}

impl std::error::Error for PostError {}
