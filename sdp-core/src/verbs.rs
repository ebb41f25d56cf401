//! The values an SDP connection exchanges with its transport: verbs
//! operations out ([`Op`]), verbs events in ([`Event`]).
//!
//! The connection ([`crate::conn::Conn`]) is sans-IO. It never calls the
//! iWARP engine; a thin adapter drains [`Op`]s from
//! [`Conn::poll_op`](crate::conn::Conn::poll_op) and maps them onto the
//! queue pair (post_recv, Send / Send with SE of RFC 5040 §4.3, closing the
//! LLP), and feeds completions and connection events back through
//! [`Conn::handle_event`](crate::conn::Conn::handle_event).
//!
//! Rules the adapter must keep:
//!
//! * Execute Ops in the order they are returned. A [`Op::PostRecv`] comes
//!   before any [`Op::Send`] whose BSDH Bufs counts that buffer (draft
//!   §6.1.3: Bufs are buffers *posted*).
//! * Receives complete in posting order, Sends complete in posting order
//!   (RDMAP Send semantics, RFC 5040 §5.3): report them in that order.
//! * A received message lands in the connection's
//!   [`BufferPool`](crate::conn::BufferPool) buffer named by the PostRecv.
//!
//! ```
//! use sdp_core::verbs::{SendKind, SendHeader};
//! use sdp_core::wire::{Flags, Mid};
//!
//! // §14.2: DisConn is unsolicited, AbortConn solicited, Data with
//! // OOB_PEND solicited.
//! assert_eq!(SendKind::for_message(Mid::DIS_CONN, Flags::EMPTY), SendKind::Send);
//! assert_eq!(SendKind::for_message(Mid::ABORT_CONN, Flags::EMPTY), SendKind::SendSe);
//! assert_eq!(SendKind::for_message(Mid::DATA, Flags::OOB_PEND), SendKind::SendSe);
//!
//! let header = SendHeader::from_slice(&[0xff; 16]).unwrap();
//! assert_eq!(header.len(), 16);
//! ```

use core::fmt;
use core::ops::{Deref, Range};

use crate::wire::{Flags, Mid};

/// Work request identifier, returned unchanged in the matching completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WrId(pub u64);

/// The RDMAP Send flavour of one SDP Message (RFC 5040 §4.3, opcodes
/// Send, Send with SE, Send with Invalidate, Send with SE and Invalidate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SendKind {
    /// Send (opcode 0x3).
    Send,
    /// Send with Solicited Event (opcode 0x5).
    SendSe,
    /// Send with Invalidate of the given STag (opcode 0x4).
    SendInvalidate(u32),
    /// Send with Solicited Event and Invalidate of the given STag
    /// (opcode 0x6).
    SendSeInvalidate(u32),
}

impl SendKind {
    /// Whether this kind raises a solicited event at the receiver.
    pub const fn is_solicited(self) -> bool {
        matches!(self, SendKind::SendSe | SendKind::SendSeInvalidate(_))
    }

    /// The kind for an SDP Message with this MID and these flags, without
    /// invalidation (§14.2).
    pub const fn for_message(mid: Mid, flags: Flags) -> SendKind {
        if is_solicited(mid, flags) {
            SendKind::SendSe
        } else {
            SendKind::Send
        }
    }
}

/// Whether an SDP Message is solicited (§14.2).
///
/// §14.2: "An SDP implementation MUST use an iWARP Send with Solicited Event
/// or Send with Solicited Event and Invalidate Message for solicited SDP
/// Messages", which are "AbortConn, SuspComm, SuspCommAck, SendSm,
/// SrcAvailCancel, SinkAvailCancel, HelloAck", "RdmaWrCompl, RdmaRdCompl,
/// SinkCancelAck" and "Data with OOB_PRES or OOB_PEND bit set". Everything
/// else (DisConn, SrcAvail, SinkAvail, plain Data, ModeChange, ChRcvBuf,
/// ChRcvBufAck) is unsolicited and "MUST use an iWARP Send Message or Send
/// with Invalidate Message".
pub const fn is_solicited(mid: Mid, flags: Flags) -> bool {
    match mid {
        Mid::ABORT_CONN
        | Mid::SUSP_COMM
        | Mid::SUSP_COMM_ACK
        | Mid::SEND_SM
        | Mid::SRC_AVAIL_CANCEL
        | Mid::SINK_AVAIL_CANCEL
        | Mid::HELLO_ACK
        | Mid::RDMA_WR_COMPL
        | Mid::RDMA_RD_COMPL
        | Mid::SINK_CANCEL_ACK => true,
        Mid::DATA => flags.contains(Flags::OOB_PRES) || flags.contains(Flags::OOB_PEND),
        _ => false,
    }
}

/// The largest SDP header: BSDH (16 bytes) plus SinkAH (20 bytes), §10
/// constraint 4.
pub const MAX_HEADER_LEN: usize = 36;

/// The header bytes of one SDP Message (BSDH plus extended header), held
/// inline so that emitting a message allocates nothing.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SendHeader {
    bytes: [u8; MAX_HEADER_LEN],
    len: u8,
}

impl SendHeader {
    /// Copies `bytes`; `None` if longer than [`MAX_HEADER_LEN`].
    pub fn from_slice(bytes: &[u8]) -> Option<SendHeader> {
        let mut header = SendHeader {
            bytes: [0; MAX_HEADER_LEN],
            len: u8::try_from(bytes.len()).ok()?,
        };
        header.bytes.get_mut(..bytes.len())?.copy_from_slice(bytes);
        Some(header)
    }

    /// The first `len` bytes of `bytes` (at most all of them).
    pub(crate) fn from_array(bytes: [u8; MAX_HEADER_LEN], len: usize) -> SendHeader {
        SendHeader {
            bytes,
            len: len.min(MAX_HEADER_LEN) as u8,
        }
    }

    /// The header bytes.
    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len).min(MAX_HEADER_LEN)]
    }
}

impl Deref for SendHeader {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl fmt::Debug for SendHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SendHeader(")?;
        for b in self.as_slice() {
            write!(f, "{b:02x}")?;
        }
        write!(f, ")")
    }
}

/// How the adapter must close the LLP connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Teardown {
    /// The normal LLP teardown: let every Send already posted complete,
    /// then close the TCP connection (FIN). Used after a graceful close
    /// (§8.2.1) and after an AbortConn completed (§8.2.2).
    Graceful,
    /// Terminate the LLP connection at once, dropping what is queued (TCP
    /// reset): "MUST NOT attempt to send additional SDP Messages and MUST
    /// immediately terminate the LLP connection" (§8.2.2).
    Abortive,
    /// Socket duplication (draft §13.1.1 step 4): the SuspCommAck's Send
    /// completed; close the LLP connection (FIN, once everything queued
    /// is written) and connect to the same peer address at `port`, where
    /// the connection goes on after
    /// [`Conn::resume`](crate::conn::Conn::resume).
    Resume {
        /// The Destination TCP Port of the SuspComm (§6.5.1.1).
        port: u16,
    },
}

/// A verbs operation the connection asks the adapter to perform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Post private receive buffer `buf` (index into the connection's
    /// [`BufferPool`](crate::conn::BufferPool)) on the receive queue.
    PostRecv {
        /// Returned in [`Event::RecvDone`].
        wr_id: WrId,
        /// Index of the buffer in the pool.
        buf: usize,
    },
    /// Send one SDP Message: `header` (BSDH plus extended header, already
    /// emitted, Len covering the payload) followed by the payload bytes
    /// `payload`, a range of the application's send stream offsets (byte
    /// positions of the stream the application wrote, counted from 0).
    /// Empty range: no payload. The adapter keeps those bytes until the
    /// matching [`Event::SendDone`].
    Send {
        /// Returned in [`Event::SendDone`].
        wr_id: WrId,
        /// Send or Send with SE (§14.2).
        kind: SendKind,
        /// The SDP headers.
        header: SendHeader,
        /// Send stream offsets of the ULP payload.
        payload: Range<u64>,
    },
    /// Close the LLP connection. The connection emits this once, as its
    /// last Op.
    Teardown(Teardown),
    // RDMA Read / RDMA Write for Zcopy (§9.2, §9.3) will join here.
}

/// Why the transport failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The peer reset the LLP connection (TCP RST).
    Reset,
    /// The LLP connection timed out (retransmission or keepalive).
    TimedOut,
    /// The connection was refused during setup (TCP RST to the SYN, MPA
    /// reject).
    Refused,
    /// The iWARP layer terminated the connection (RDMAP/DDP/MPA error,
    /// Terminate message sent or received, RFC 5040 §4.8).
    Terminated,
    /// A receive queue overrun: a Send arrived with no receive buffer
    /// posted (RFC 5040 §5.3; the iWARP layer Terminates).
    NoReceiveBuffer,
}

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ErrorKind::Reset => "connection reset by the LLP",
            ErrorKind::TimedOut => "LLP connection timed out",
            ErrorKind::Refused => "connection refused",
            ErrorKind::Terminated => "iWARP Terminate",
            ErrorKind::NoReceiveBuffer => "Send with no receive buffer posted",
        })
    }
}

/// A verbs event the adapter reports to the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The iWARP connection is up (RTS). At the Accepting Peer: after the
    /// initiator's RTR arrived (RFC 6581), so the HelloAck may go
    /// (DESIGN §4). The Connecting Peer ignores it.
    Established,
    /// A posted private buffer received a message of `len` bytes (the
    /// bytes are in the pool).
    RecvDone {
        /// The PostRecv's id.
        wr_id: WrId,
        /// Message length.
        len: usize,
    },
    /// A Send completed: its payload stream range may be released.
    SendDone {
        /// The Send's id.
        wr_id: WrId,
    },
    /// The transport failed (Terminate, TCP reset, ...): abortive.
    TransportError(ErrorKind),
    /// The peer closed its TCP half (FIN).
    TransportClosed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn solicited_messages_follow_section_14_2() {
        let solicited = [
            Mid::ABORT_CONN,
            Mid::SUSP_COMM,
            Mid::SUSP_COMM_ACK,
            Mid::SEND_SM,
            Mid::SRC_AVAIL_CANCEL,
            Mid::SINK_AVAIL_CANCEL,
            Mid::HELLO_ACK,
            Mid::RDMA_WR_COMPL,
            Mid::RDMA_RD_COMPL,
            Mid::SINK_CANCEL_ACK,
        ];
        let unsolicited = [
            Mid::DIS_CONN,
            Mid::SRC_AVAIL,
            Mid::SINK_AVAIL,
            Mid::DATA,
            Mid::MODE_CHANGE,
            Mid::CH_RCV_BUF,
            Mid::CH_RCV_BUF_ACK,
        ];
        for mid in solicited {
            assert!(is_solicited(mid, Flags::EMPTY), "{mid}");
        }
        for mid in unsolicited {
            assert!(!is_solicited(mid, Flags::EMPTY), "{mid}");
        }
        assert!(is_solicited(Mid::DATA, Flags::OOB_PRES | Flags::OOB_PEND));
        assert!(is_solicited(Mid::DATA, Flags::OOB_PRES));
        assert!(!is_solicited(Mid::SRC_AVAIL, Flags::OOB_PEND));
        assert!(!is_solicited(Mid::DATA, Flags::REQ_PIPE));
    }

    #[test]
    fn send_header_holds_at_most_36_bytes() {
        assert_eq!(SendHeader::from_slice(&[1; 36]).map(|h| h.len()), Some(36));
        assert_eq!(SendHeader::from_slice(&[1; 37]), None);
        assert_eq!(&*SendHeader::from_slice(&[1, 2, 3]).unwrap(), &[1, 2, 3]);
    }
}
