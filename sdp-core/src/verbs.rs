//! The values an SDP connection exchanges with its transport: verbs
//! operations out ([`Op`]), verbs events in ([`Event`]).
//!
//! The connection (`conn::Conn`) is sans-IO. It never calls the
//! iWARP engine; a thin adapter drains [`Op`]s from
//! `Conn::poll_op` and maps them onto the
//! queue pair (post_recv, Send / Send with SE of RFC 5040 §4.3, closing the
//! LLP), and feeds completions and connection events back through
//! `Conn::handle_event`.
//!
//! Rules the adapter must keep:
//!
//! * Execute Ops in the order they are returned. A [`Op::PostRecv`] comes
//!   before any [`Op::Send`] whose BSDH Bufs counts that buffer (draft
//!   §6.1.3: Bufs are buffers *posted*).
//! * Receives complete in posting order, Sends complete in posting order
//!   (RDMAP Send semantics, RFC 5040 §5.3): report them in that order.
//! * A received message lands in the connection's
//!   `BufferPool` buffer named by the PostRecv.
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
/// constraint 4 (the same-host extension's LOH is no larger).
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

    /// Sets `bits` in byte `at` (an Rsvd bit of the Hello's family).
    pub(crate) fn set_bits(&mut self, at: usize, bits: u8) {
        if at < usize::from(self.len) {
            self.bytes[at] |= bits;
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
    /// `Conn::resume`.
    Resume {
        /// The Destination TCP Port of the SuspComm (§6.5.1.1).
        port: u16,
    },
}

/// A verbs operation the connection asks the adapter to perform.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Post private receive buffer `buf` (index into the connection's
    /// `BufferPool`) on the receive queue.
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
        /// A LocalData (the same-host extension): the adapter writes the
        /// payload here first, and the message carries only `header`.
        local: Option<PeerSlot>,
    },
    /// Close the LLP connection. The connection emits this once, as its
    /// last Op.
    Teardown(Teardown),
}

/// Where a LocalData's payload goes (the same-host extension): the peer
/// process, the address of the slot, and the offer's token, read back
/// after the write.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PeerSlot {
    /// The peer process.
    pub pid: u32,
    /// Address of the slot's first byte in it.
    pub addr: u64,
    /// The offer's ring (the token lies in the 8 bytes before it).
    pub ring: u64,
    /// The offer's token.
    pub token: u32,
}

/// Names one memory registration of the connection; the adapter maps it
/// to the STag it got for that memory (RFC 5040 §2, tagged buffers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MemId(pub u32);

/// Names one ULP send buffer handed to
/// `Conn::send_zcopy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SendId(pub u64);

/// Names one ULP receive buffer posted with
/// `Conn::post_recv`; the adapter holds
/// its memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RecvId(pub u64);

/// Memory the connection asks the adapter to register.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Memory {
    /// Send stream bytes (the application's, kept until released): the
    /// Data Source's RDMA Buffer of a SrcAvail (§9.2). The adapter tells
    /// the Tagged Offset of its first byte in [`Event::Registered`].
    Stream(Range<u64>),
    /// The posted ULP receive buffer `id` of `len` bytes: the target of
    /// RDMA Reads (§9.2) or the RDMA Buffer of a SinkAvail (§9.3).
    Recv {
        /// The posted buffer.
        id: RecvId,
        /// Its size.
        len: u32,
    },
}

/// Who may access registered memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Access {
    /// Only local work requests (the target of our RDMA Reads).
    Local,
    /// The peer may RDMA Read it (SrcAvail).
    RemoteRead,
    /// The peer may RDMA Write it (SinkAvail); we may write it too (an
    /// RDMA Read of a SrcAvail that came before the SinkAvail could go
    /// lands in it through the same registration).
    RemoteWrite,
}

/// An RDMA operation for the Zcopy mechanisms (§9.2, §9.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RdmaOp {
    /// Register `memory` with `access`. The adapter answers at once (before
    /// the next `poll_work`) with [`Event::Registered`] naming `mem`.
    Register {
        /// The registration's name.
        mem: MemId,
        /// What to register.
        memory: Memory,
        /// Who may access it.
        access: Access,
    },
    /// RDMA Read Request (RFC 5040 §4.4): `len` bytes of the peer's buffer
    /// `stag` at Tagged Offset `to` into the posted receive buffer `into`
    /// at byte `offset`. Completes as [`Event::ReadDone`], in order with
    /// the Sends.
    Read {
        /// Returned in [`Event::ReadDone`].
        wr_id: WrId,
        /// The Data Source's STag (SrcAH).
        stag: u32,
        /// Tagged Offset of the first byte.
        to: u64,
        /// Bytes to read.
        len: u32,
        /// The local buffer.
        into: RecvId,
        /// Where in it.
        offset: u32,
    },
    /// RDMA Write (RFC 5040 §4.2) of the send stream bytes `payload` to
    /// the peer's buffer `stag` at Tagged Offset `to`. Completes as
    /// [`Event::WriteDone`], in order with the Sends.
    Write {
        /// Returned in [`Event::WriteDone`].
        wr_id: WrId,
        /// The Data Sink's STag (SinkAH).
        stag: u32,
        /// Tagged Offset of the first byte.
        to: u64,
        /// Send stream offsets of the bytes.
        payload: Range<u64>,
    },
    /// Invalidate the STag of `mem` locally and deregister it (unless the
    /// peer already invalidated it with a Send with Invalidate).
    Deregister {
        /// The registration.
        mem: MemId,
    },
}

/// Everything the connection asks of the adapter, in order: the Bcopy
/// [`Op`]s and the Zcopy [`RdmaOp`]s
/// (`Conn::poll_work`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Work {
    /// A receive, Send or teardown.
    Op(Op),
    /// A memory registration or an RDMA operation.
    Rdma(RdmaOp),
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
    /// [`RdmaOp::Register`] of `mem` succeeded: the peer names it with
    /// `stag`, its first byte has Tagged Offset `to`.
    Registered {
        /// The registration.
        mem: MemId,
        /// Its STag.
        stag: u32,
        /// Tagged Offset of its first byte.
        to: u64,
    },
    /// As [`Event::RecvDone`] for a Send with Invalidate: the peer
    /// invalidated our STag `stag` (RFC 5040 §4.3, §6.1).
    RecvInvalidate {
        /// The PostRecv's id.
        wr_id: WrId,
        /// Message length.
        len: usize,
        /// The STag invalidated.
        stag: u32,
    },
    /// An [`RdmaOp::Read`] completed: its bytes are placed.
    ReadDone {
        /// The Read's id.
        wr_id: WrId,
    },
    /// An [`RdmaOp::Write`] completed.
    WriteDone {
        /// The Write's id.
        wr_id: WrId,
    },
    /// An [`RdmaOp::Read`] or [`RdmaOp::Write`] the adapter carried out
    /// itself, process to process (the same-host path, DESIGN §9): its
    /// bytes are placed. It counts as completed once the work requests
    /// before it have (RFC 5040 §5: in Send Queue order).
    DoneLocally {
        /// The Read's or Write's id.
        wr_id: WrId,
    },
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
