//! The receive side's state, the types it is made of and nothing that
//! acts on them: the queue pair holds it, and the `sink` and `overlay`
//! modules (which extend the queue pair) fill it in.

use std::collections::VecDeque;

use crate::mem::RegionId;
use crate::wire::ddp::{Stag, INITIAL_MSN};
use crate::wire::rdmap::{Opcode, ReadRequestRepr};
use crate::wire::terminate::TermCode;

use super::rx::Deframer;
use super::terminate::{Echo, TERM_CAP};
use super::wr::{RecvWr, Sge};

/// Part of a receive buffer placed elsewhere (the `overlay` module).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvOverlay {
    /// The receive the buffer belongs to.
    pub wr_id: u64,
    /// The part of the receive buffer: region, offset, length.
    pub from: Sge,
    /// Where its octets land instead.
    pub to: RegionId,
    /// Offset in `to` of the first octet of `from`.
    pub to_offset: usize,
    /// Octets of the receive buffer before `from`.
    pub skip: usize,
    /// Octets of `to` from `to_offset` up to the furthest one placed.
    pub placed: usize,
    /// Whether placement is translated now; a parked overlay
    /// (`DataPath::park_overlay`) lets octets land in the receive buffer.
    pub active: bool,
    /// While parked: the end (an offset of `from.region`) of the octets of
    /// `from` placed in the receive buffer.
    pub parked_end: usize,
}

/// The receive side of a queue pair: what the deframer found, where it
/// lands, and the Receive Queue it consumes. The rest of the queue pair
/// (registry, Read queues, completions) is shared with the send side.
#[derive(Debug)]
pub(crate) struct Placement {
    pub deframer: Deframer,
    /// After an error, everything received is dropped (RFC 5041 §7.1: "DDP
    /// MUST silently drop any subsequent incoming DDP Segments"; RFC 5044
    /// §8: "it MUST NOT pass or deliver any additional FPDUs").
    pub dropping: bool,
    pub rq: VecDeque<RecvWr>,
    /// The MSN the next DDP Message on each untagged queue carries (RFC
    /// 5041 §4.3: one at first, one more per message).
    pub msn: [u32; 3],
    pub send: Option<RecvInProgress>,
    pub term_buf: [u8; TERM_CAP],
    pub seg: RxSeg,
    /// Part of the next receive buffer placed elsewhere (the `overlay` module).
    pub overlay: Option<RecvOverlay>,
    /// Overlays whose messages were delivered, oldest first.
    pub overlays_done: VecDeque<RecvOverlay>,
}

impl Placement {
    pub fn new() -> Placement {
        Placement {
            deframer: Deframer::new(false, true),
            dropping: false,
            rq: VecDeque::new(),
            msn: [INITIAL_MSN; 3],
            send: None,
            term_buf: [0; TERM_CAP],
            seg: RxSeg::default(),
            overlay: None,
            overlays_done: VecDeque::new(),
        }
    }
}

/// The Send message being received on QN 0 and the buffer it consumes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecvInProgress {
    pub wr: RecvWr,
    /// The end (an offset of the buffer's region) of what its segments
    /// committed so far placed: segments arrive in order (RFC 5044 over
    /// TCP), so everything before it is placed.
    pub end: usize,
}

/// Where the current segment's payload goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Target {
    /// Nowhere: the segment failed a check, or has no placeable payload.
    #[default]
    Discard,
    /// Into memory; `stag` is the STag it was validated under, if tagged.
    Place {
        region: RegionId,
        offset: usize,
        stag: Option<Stag>,
    },
}

/// What the segment does once its FPDU is verified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Action {
    #[default]
    None,
    Send {
        opcode: Opcode,
        last: bool,
        mo: u32,
        len: u32,
        inv: Stag,
        first: bool,
    },
    /// The initiator's zero-length Send RTR (RFC 6581 §9.2).
    RtrSend,
    ReadRequest(ReadRequestRepr),
    Terminate {
        last: bool,
        end: usize,
    },
    Write,
    ReadResponse {
        last: bool,
    },
}

/// The segment being received.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RxSeg {
    pub target: Target,
    pub action: Action,
    /// An error found in the headers, raised once the CRC is verified.
    pub pending: Option<TermCode>,
    pub echo: Echo,
}

impl Default for RxSeg {
    fn default() -> RxSeg {
        RxSeg {
            target: Target::Discard,
            action: Action::None,
            pending: None,
            echo: Echo::NONE,
        }
    }
}
