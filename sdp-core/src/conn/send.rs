//! The transmit half of a connection: the send stream at the Data Source
//! (draft §9.1 Bcopy, §9.5.3 OOB), [`Conn::send`] and writability, and
//! the choice of the next message (§10.5: control first, then the Zcopy
//! advertisements, Data Messages, DisConn, credit updates), with the Send
//! completions that release the stream.
//!
//! The connection never holds payload. The application's bytes are named
//! by their send stream offset: `send` accepts bytes up to the send buffer
//! size, Data Messages reference ranges of them, and a range is released
//! when its Send completes.
//!
//! ```text
//!  0 ........ released ........ sent ........ accepted
//!     done       in Sends posted    waiting for credit
//! ```
//!
//! Each Data Message carries at most the peer's receive Private Buffer size
//! minus the BSDH (§9.1: "The Data Source MUST limit the amount of ULP data
//! sent in an SDP Message ... to ensure the ULP data plus SDP header(s) fits
//! within the receive Private Buffer size advertised by the Data Sink"),
//! ends at an OOB byte (OOB_PRES), and is cut so that OOB_PEND can precede
//! its byte by at most 65,535 bytes (§9.5.3).
//!
//! ```
//! use sdp_core::conn::send::TxStream;
//! use sdp_core::wire::Flags;
//!
//! let mut tx = TxStream::default();
//! tx.accept(10, true); // 10 bytes, the last one urgent
//! let chunk = tx.next_chunk(100).unwrap();
//! assert_eq!(chunk.range, 0..10);
//! assert_eq!(chunk.flags, Flags::OOB_PEND | Flags::OOB_PRES);
//! ```

use core::ops::Range;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::wire::Flags;

use super::close::Ending;
use super::credit::{CONTROL_MIN_CREDIT, PAYLOAD_MIN_CREDIT};
use super::local::{self, LocalOff, PeerSlot};
use super::suspend::LocalSuspend;
use super::{
    setup, AbortConn, Conn, Control, SendFlags, SendRecord, Sent, State, Violation, ASK_GAP_MAX,
    ASK_GAP_MIN, SEND_WR_BIT,
};
use crate::errno::Error;
use crate::verbs::{Op, SendHeader, SendKind, Teardown, Work, WrId, MAX_HEADER_LEN};
use crate::wire::{self, Body, Bsdh, BsdhRepr, ChRcvBufAckRepr, ChRcvBufRepr, MessageRepr, Mid};

/// §9.5.3: "no more than 65,535 (2^16-1) bytes of data are sent between the
/// flag and its associated Out-Of-Band data byte".
pub const OOB_PEND_REACH: u64 = 65_535;

/// Our messages in the peer's buffers beyond which credit counts as scarce
/// however many buffers the peer has ([`Conn::credit_scarce`]).
const SCARCE_IN_FLIGHT: i64 = 8;

/// One OOB indication of the application.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Urgent {
    /// Send stream offset of the urgent byte.
    offset: u64,
    /// OOB_PEND already sent for it.
    pend_sent: bool,
}

/// The next Data Message's payload and OOB flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// Send stream offsets.
    pub range: Range<u64>,
    /// OOB_PEND and/or OOB_PRES.
    pub flags: Flags,
}

/// The application's send stream; see the module documentation.
#[derive(Debug, Clone, Default)]
pub struct TxStream {
    accepted: u64,
    sent: u64,
    released: u64,
    /// OOB bytes not yet sent with OOB_PRES, in stream order.
    urgent: VecDeque<Urgent>,
}

impl TxStream {
    /// Bytes accepted from the application so far: the stream offset the
    /// next accepted byte gets.
    pub fn accepted(&self) -> u64 {
        self.accepted
    }

    /// Bytes handed to Sends.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Bytes whose Sends completed.
    pub fn released(&self) -> u64 {
        self.released
    }

    /// Bytes accepted and not released: what occupies the send buffer.
    pub fn buffered(&self) -> u64 {
        self.accepted.saturating_sub(self.released)
    }

    /// Bytes accepted and not yet in a Send.
    pub fn unsent(&self) -> u64 {
        self.accepted.saturating_sub(self.sent)
    }

    /// Appends `n` bytes; with `oob`, the last of them is urgent.
    pub fn accept(&mut self, n: u64, oob: bool) {
        if n == 0 {
            return;
        }
        self.accepted = self.accepted.saturating_add(n);
        if oob {
            self.urgent.push_back(Urgent {
                offset: self.accepted - 1,
                pend_sent: false,
            });
        }
    }

    /// The payload of the next Data Message, at most `max_payload` bytes,
    /// or `None` when everything accepted is sent.
    pub fn next_chunk(&self, max_payload: u64) -> Option<Chunk> {
        self.next_chunk_until(max_payload, u64::MAX)
    }

    /// As [`TxStream::next_chunk`], ending at stream offset `limit` at the
    /// latest (where a Zcopy transfer takes over).
    pub fn next_chunk_until(&self, max_payload: u64, limit: u64) -> Option<Chunk> {
        let start = self.sent;
        let stop = self.accepted.min(limit);
        if start >= stop || max_payload == 0 {
            return None;
        }
        let mut end = stop.min(start.saturating_add(max_payload));
        let mut flags = Flags::EMPTY;
        if let Some(u) = self.urgent.front() {
            let reach = (u.offset + 1).saturating_sub(start);
            if !u.pend_sent && reach > OOB_PEND_REACH {
                // Too far for OOB_PEND yet: stop where the next message can
                // carry it.
                end = end.min((u.offset + 1).saturating_sub(OOB_PEND_REACH));
            } else {
                // §9.5.3: "The OOB_PEND flag MUST be set on an SDP Message
                // that is sent no later than the SDP Message containing the
                // Out-Of-Band data byte."
                if !u.pend_sent {
                    flags |= Flags::OOB_PEND;
                }
                // §9.5.3: "the Data Source MUST send the Out-Of-Band data
                // using a Data Message with the OOB_PRES bit set and the
                // Out-of-Band data byte as the last byte of the ULP
                // payload".
                if u.offset < end {
                    end = u.offset + 1;
                    flags |= Flags::OOB_PRES;
                }
            }
        }
        Some(Chunk {
            range: start..end,
            flags,
        })
    }

    /// Records that `chunk` went out in a Data Message.
    pub fn on_chunk_sent(&mut self, chunk: &Chunk) {
        self.sent = chunk.range.end;
        if chunk.flags.contains(Flags::OOB_PEND) {
            self.on_pend_sent();
        }
        if chunk.flags.contains(Flags::OOB_PRES) {
            self.urgent.pop_front();
        }
    }

    /// Whether a message without payload sent now may carry OOB_PEND: an
    /// OOB byte is waiting for its flag and lies within reach.
    pub fn pend_due(&self) -> bool {
        self.urgent.front().is_some_and(|u| {
            !u.pend_sent && (u.offset + 1).saturating_sub(self.sent) <= OOB_PEND_REACH
        })
    }

    /// Records that OOB_PEND went out for the oldest OOB byte.
    pub fn on_pend_sent(&mut self) {
        if let Some(u) = self.urgent.front_mut() {
            u.pend_sent = true;
        }
    }

    /// Takes back the bytes from `point` on out of the last message, which
    /// did not go (they are sent again).
    pub(super) fn unsend(&mut self, point: u64) {
        if (self.released..self.sent).contains(&point) {
            self.sent = point;
        }
    }

    /// Records that `n` more bytes left by RDMA (Read or Write Zcopy).
    pub fn advance(&mut self, n: u64) {
        self.sent = self.sent.saturating_add(n).min(self.accepted);
    }

    /// Takes back the accepted bytes from `point` on, which were never
    /// sent (a canceled SrcAvail, §9.5.4).
    pub fn retract(&mut self, point: u64) {
        let point = point.max(self.sent);
        if point < self.accepted {
            self.accepted = point;
            self.urgent.retain(|u| u.offset < point);
        }
    }

    /// On a new LLP connection (draft §13.1.1 step 4): the peer's new
    /// connection has seen no OOB_PEND, so each OOB byte not yet sent is
    /// announced again.
    pub(crate) fn renotify_urgent(&mut self) {
        for u in &mut self.urgent {
            u.pend_sent = false;
        }
    }

    /// Releases stream bytes up to `end` (a Send completed).
    pub fn release(&mut self, end: u64) {
        self.released = self.released.max(end.min(self.sent));
    }

    /// Drops everything unsent (§8.2.2: "An implementation MUST discard any
    /// unsent ULP data").
    pub fn discard_unsent(&mut self) {
        self.accepted = self.sent;
        self.urgent.clear();
    }
}

/// DESIGN §7 "Small messages": whether the short tail of a write waits
/// for the next write to fill its message, as TCP's Nagle algorithm and
/// autocorking hold a short segment back (RFC 5044 Appendix A.2 leaves
/// the choice to the ULP). A message spends one of the peer's Private
/// Buffers and a credit whatever it carries, so a streaming writer whose
/// writes are not a multiple of the payload would send every other
/// message nearly empty.
///
/// Only a write of a message's worth or more that comes within the wait
/// of the write before holds its tail back: the first write of a burst,
/// and every write of a request–response exchange, send all they have.
/// While most of the peer's buffers hold our messages (credit is
/// scarce), any write close behind another holds back: a stream of small
/// writes would otherwise spend each of the few buffers left on one small
/// message, and a peer that reads more slowly than we write would see
/// its whole window in a few kilobytes. The tail goes when the next write
/// fills its message, when credit comes back, when the wait runs out, or
/// at once after [`Hold::push`].
#[derive(Debug, Clone, Default)]
pub struct Hold {
    /// A write came since the last [`Hold::tick`]: whether it was large.
    wrote: Option<bool>,
    /// A write before this time follows the last one closely.
    close_until: Option<Instant>,
    /// The last write was large and followed the one before closely.
    streaming: bool,
    /// The last write followed the one before closely, whatever its size.
    bursting: bool,
    /// When the tail held back goes (none while nothing is held).
    until: Option<Instant>,
    /// Nothing waits until the next write.
    pushed: bool,
}

impl Hold {
    /// A write was accepted: a message's worth or more (`large`), or
    /// urgent, after which nothing waits.
    pub fn wrote(&mut self, large: bool, urgent: bool) {
        self.wrote = Some(large);
        self.until = None;
        self.pushed = urgent;
    }

    /// What is held goes now, and nothing waits until the next write.
    pub fn push(&mut self) {
        self.pushed = true;
        self.until = None;
    }

    /// Dates the last write (`wait`: the longest a tail waits), and ends
    /// a hold whose time ran out.
    pub fn tick(&mut self, now: Instant, wait: Duration) {
        if let Some(large) = self.wrote.take() {
            self.bursting = self.close_until.is_some_and(|t| now < t);
            self.streaming = large && self.bursting;
            self.close_until = Some(now + wait);
        }
        if self.until.is_some_and(|t| now >= t) {
            self.push();
        }
    }

    /// Whether a short tail, all that is left to send, waits now; with
    /// `scarce` credit, after any write close behind another.
    pub fn holds(&mut self, now: Instant, wait: Duration, scarce: bool) -> bool {
        if self.pushed || !(self.streaming || (scarce && self.bursting)) {
            // Credit came back: what was held goes now, with no timer left
            // behind for it.
            self.until = None;
            return false;
        }
        let until = *self.until.get_or_insert(now + wait);
        if now >= until {
            self.push();
            return false;
        }
        true
    }

    /// A tail is held back.
    pub fn holding(&self) -> bool {
        self.until.is_some()
    }

    /// When the held tail goes unless a write fills it first.
    pub fn deadline(&self) -> Option<Instant> {
        self.until
    }
}

// ----- The transmit half of a connection -------------------------------

impl Conn {
    /// The next SDP Message to send, if §10.5 allows one.
    pub(super) fn next_message(&mut self, now: Option<Instant>) -> Option<Work> {
        let credit = self.credits.send_credit();
        let gain = self.credits.gain();
        // §10.5: "If one credit is available, an implementation MUST only
        // send SDP Messages that provide additional credits and do not
        // contain ULP payload."
        let control_ok = credit >= CONTROL_MIN_CREDIT || (credit >= 1 && gain > 0);
        match self.abort_conn {
            AbortConn::Pending if control_ok => {
                self.abort_conn = AbortConn::Sent;
                return Some(Work::Op(self.emit(
                    Body::AbortConn,
                    Flags::EMPTY,
                    Sent::AbortConn,
                )));
            }
            AbortConn::Pending => {
                // No credit for the AbortConn: the LLP reset says the same.
                self.finish(Teardown::Abortive);
                return self.work(now);
            }
            AbortConn::Sent => return None,
            AbortConn::None => {}
        }
        if let Some(op) = self.suspend_gate(control_ok) {
            return op.map(Work::Op);
        }
        // §8.2.1: once our DisConn went and the peer's arrived, both
        // halves are closed and the peer may already have closed the LLP
        // (its kernel would answer anything more with a reset, losing
        // what we have not read yet). Nothing more is sent but an
        // AbortConn.
        if self.peer_disconn.is_some() && self.ending.disconn_sent() {
            return None;
        }
        // §10.5: "If no credits are available, an implementation MUST NOT
        // send any type of SDP Message."
        if credit <= 0 {
            return None;
        }
        if self.hello_ack_due {
            // §8.1.1 step 5: "Send the HelloAck Message using the iWARP
            // Send with SE Message." The credit is the Hello's Bufs, ≥ 3.
            self.hello_ack_due = false;
            let hah = setup::hello_ack_repr(&self.config, self.ird, self.ord);
            let mut op = self.emit(Body::HelloAck(hah), Flags::EMPTY, Sent::Other);
            if let (true, Op::Send { header, .. }) = (self.local.both, &mut op) {
                header.set_bits(setup::RSVD_AT, wire::LOCAL_BIT);
            }
            return Some(Work::Op(op));
        }
        if let Some(&control) = self.control.front() {
            if !control_ok {
                return None;
            }
            self.control.pop_front();
            let op = match control {
                Control::SendSm { cancel } => {
                    if cancel.is_some() {
                        // §9.5.4: the SendSm completing a cancel is the
                        // first message whose MSeqAck reaches the
                        // SrcAvailCancel's MSeq — that is how the Data
                        // Source tells it from an earlier SendSm.
                        self.credits.hold_ack(None);
                    }
                    let op = self.emit(Body::SendSm, Flags::EMPTY, Sent::Other);
                    let mseq = self.credits.lsseq();
                    self.on_send_sm_sent(mseq, cancel);
                    op
                }
                Control::RdmaRdCompl { len, invalidate } => {
                    let flags = self.req_pipe_flag();
                    let mut op = self.emit(Conn::rd_compl(len), flags, Sent::Other);
                    if let Op::Send { kind, .. } = &mut op {
                        *kind = Conn::compl_kind(invalidate);
                    }
                    op
                }
                Control::RdmaWrCompl { len, stag } => {
                    // §9.3: "The Data Source SHOULD send the RdmaWrCompl
                    // Message using Send with SE and Invalidate".
                    let flags = self.req_pipe_flag();
                    let mut op = self.emit(Conn::wr_compl(len), flags, Sent::Other);
                    if let Op::Send { kind, .. } = &mut op {
                        *kind = Conn::compl_kind(Some(stag));
                    }
                    op
                }
                Control::SinkCancelAck => self.emit(Body::SinkCancelAck, Flags::EMPTY, Sent::Other),
                Control::SrcAvailCancel => {
                    let op = self.emit(Body::SrcAvailCancel, Flags::EMPTY, Sent::Other);
                    self.credits.peer_may_hold(self.credits.lsseq());
                    if self.z.src_cancel.is_some() {
                        self.z.src_cancel = Some(Some(self.credits.lsseq()));
                    }
                    op
                }
                Control::SinkAvailCancel => {
                    self.emit(Body::SinkAvailCancel, Flags::EMPTY, Sent::Other)
                }
                Control::ModeChange { send, mode } => {
                    let op = self.emit(
                        Conn::mode_change_body(send, mode),
                        Flags::EMPTY,
                        Sent::Other,
                    );
                    let mseq = self.credits.lsseq();
                    self.on_mode_change_sent(mseq, send, mode);
                    op
                }
                Control::ChRcvBuf { size } => {
                    let crbh = ChRcvBufRepr { des_sz: size };
                    self.emit(Body::ChRcvBuf(crbh), Flags::EMPTY, Sent::Other)
                }
                Control::LocalOffer => {
                    // The ring stays once made (a resumed connection
                    // starts with a new queue).
                    let Some(offer) = self.pool.ring.as_ref().map(|r| r.offer) else {
                        return self.next_message(now);
                    };
                    self.emit(Body::LocalOffer(offer), Flags::EMPTY, Sent::Other)
                }
                Control::ChRcvBufAck => {
                    // §10.6: "If the Remote Peer is unable to resize its
                    // receive Private Buffers, it MUST specify in the
                    // ChRcvBufAck Message the original receive Private
                    // Buffer size."
                    let crbah = ChRcvBufAckRepr {
                        act_sz: self.config.buf_size,
                    };
                    self.emit(Body::ChRcvBufAck(crbah), Flags::EMPTY, Sent::Other)
                }
            };
            return Some(Work::Op(op));
        }
        if let Some(w) = self.next_src_avail(credit, control_ok) {
            return Some(w);
        }
        if let Some(w) = self.next_sink_avail(credit, control_ok) {
            return Some(w);
        }
        // §10.5: "If two credits are available, an implementation MUST only
        // send SDP Messages that do not contain ULP payload."
        if credit >= PAYLOAD_MIN_CREDIT {
            let limit = self.bcopy_limit();
            if let Some(chunk) = self.next_chunk(limit) {
                if !self.holds(&chunk, now) {
                    return Some(Work::Op(self.emit_data(chunk)));
                }
            }
        }
        // §8.2.1 steps 1–2: DisConn after all data posted before the close.
        if self.ending == Ending::Shut
            && self.tx.unsent() == 0
            && self.z.srcs.is_empty()
            && self.z.writing.is_none()
        {
            if !control_ok {
                return None;
            }
            let after_peer = self.peer_disconn.is_some();
            let op = self.emit(Body::DisConn, Flags::EMPTY, Sent::DisConn);
            self.ending = Ending::DisConn {
                mseq: self.credits.lsseq(),
                after_peer,
                done: false,
            };
            return Some(Work::Op(op));
        }
        // §9.5.3: "It is RECOMMENDED that this notification be accomplished
        // in an expeditious fashion"; "an implementation MAY send an SDP
        // Message with the OOB_PEND flag using a reserved credit".
        if control_ok && self.tx.pend_due() {
            self.tx.on_pend_sent();
            return Some(Work::Op(self.emit(
                Body::Data { payload: &[] },
                Flags::OOB_PEND,
                Sent::Other,
            )));
        }
        // §10.4: gratuitous credit update.
        if self
            .credits
            .should_update(u16::try_from(self.pool.len()).unwrap_or(u16::MAX))
            && self.credit_updates_due()
        {
            return Some(Work::Op(self.emit(
                Body::Data { payload: &[] },
                Flags::EMPTY,
                Sent::Other,
            )));
        }
        // Two credits and data waiting: the peer may have buffers it has
        // not told us about but cannot see that we are stuck. One empty
        // Data Message (allowed with two credits) lowers our credit as the
        // peer sees it and so triggers its update.
        if credit == CONTROL_MIN_CREDIT
            && !self.asked
            && (self.tx.unsent() > 0 || self.credit_wanted)
        {
            self.asked = true;
            return Some(Work::Op(self.emit(
                Body::Data { payload: &[] },
                Flags::EMPTY,
                Sent::Other,
            )));
        }
        None
    }

    /// Whether `chunk` waits for the next write to fill its message
    /// ([`Hold`]): the short tail of a stream of large writes, while no
    /// reader of ours waits for the peer, no urgent byte, close, lent
    /// buffer or socket duplication needs it in a Send, and the program
    /// did not set TCP_NODELAY.
    pub(super) fn holds(&mut self, chunk: &Chunk, now: Option<Instant>) -> bool {
        let Some(now) = now else {
            return false;
        };
        let len = chunk.range.end - chunk.range.start;
        // A LocalData carries up to a slot of the peer's ring: a message's
        // worth or more fills on while an earlier message of ours is still
        // unread, as autocorking holds while an earlier send is in flight.
        let slot_fills =
            len >= self.max_payload() && len < self.message_max() && self.in_flight() > 0;
        let short = len < self.max_payload() || slot_fills;
        let tail = chunk.range.end == self.tx.accepted() && chunk.flags.is_empty();
        short
            && tail
            && !self.nodelay
            && self.ending == Ending::Open
            && !self.config.coalesce.is_zero()
            && !self.zsend_pending()
            && self.local_suspend == LocalSuspend::None
            && self.hold.holds(
                now,
                self.config.coalesce,
                slot_fills || self.credit_scarce(),
            )
    }

    /// More than half of the peer's Private Buffers, or more than eight,
    /// hold our messages: one more short message now would take one of
    /// the few left, where waiting fills it (see [`Hold`]). Eight at most,
    /// so that a peer whose pool grew (`Config::max_bufs`) does not turn
    /// a stream of small writes into as many small messages, as TCP's
    /// autocorking holds while anything is in flight.
    fn credit_scarce(&self) -> bool {
        let bufs = i64::from(self.credits.peer_bufs());
        self.in_flight() > (bufs / 2).min(SCARCE_IN_FLIGHT)
    }

    /// Our messages in the peer's Private Buffers, as far as we know.
    fn in_flight(&self) -> i64 {
        i64::from(self.credits.peer_bufs()) - self.credits.send_credit()
    }

    /// Bytes wait to be sent that only credit holds back (not a short tail
    /// waiting for the next write, [`Conn::holds`]).
    pub fn waits_for_credit(&self) -> bool {
        let unsent = self.tx.unsent();
        unsent > 0 && !(self.hold.holding() && unsent < self.max_payload())
    }

    /// New send credit came. Enough for payload: a credit request may go
    /// again whenever we are stuck. Less: the peer's message may have
    /// lifted its view of our credit above one, where §10.5 no longer
    /// makes it send the buffer its application frees next (this
    /// implementation sends it anyway, [`Credits::should_update`], another
    /// may not), so the request goes again — but not at once: two peers
    /// stuck at two credits each, their applications holding every other
    /// buffer, would answer each other's requests for ever, each request
    /// giving back the buffer of the one before. It waits 1 ms, doubling
    /// while requests bring nothing more, and after 64 ms gives up until
    /// credit for payload comes.
    pub(super) fn on_credit(&mut self, now: Instant) {
        if self.credits.send_credit() >= PAYLOAD_MIN_CREDIT {
            self.asked = false;
            self.ask_again = None;
            self.ask_gap = Duration::ZERO;
        } else if self.asked && self.ask_again.is_none() && self.ask_gap < ASK_GAP_MAX {
            self.ask_gap = (self.ask_gap * 2).max(ASK_GAP_MIN);
            self.ask_again = Some(now + self.ask_gap);
        }
    }

    /// The payload of the next message: a Data Message's worth, or, when a
    /// full one goes to the peer's ring, a slot's worth as a LocalData —
    /// only if that is enough for one ([`local::LOCAL_MIN`]): a peer whose
    /// Private Buffers are smaller than that (a program's small
    /// SO_RCVBUF) would get a Data Message longer than its buffer.
    fn next_chunk(&self, limit: u64) -> Option<Chunk> {
        let chunk = self.tx.next_chunk_until(self.max_payload(), limit)?;
        let full = chunk.range.end - chunk.range.start == self.max_payload();
        match self.local.slot_size() {
            Some(slot) if full && chunk.flags.is_empty() => self
                .tx
                .next_chunk_until(slot, limit)
                .filter(|c| c.flags.is_empty() && c.range.end - c.range.start >= local::LOCAL_MIN)
                .or(Some(chunk)),
            _ => Some(chunk),
        }
    }

    /// The most payload one message carries now: a slot of the peer's ring
    /// while LocalData go there, else [`Conn::max_payload`].
    fn message_max(&self) -> u64 {
        self.local.slot_size().unwrap_or(0).max(self.max_payload())
    }

    /// The largest Data Message payload: the peer's receive Private Buffer
    /// minus the BSDH (§9.1, §10 constraint 3).
    pub(super) fn max_payload(&self) -> u64 {
        self.peer.map_or(0, |p| {
            let size = self
                .resize
                .smaller
                .map_or(p.rcv_size, |s| s.min(p.rcv_size));
            u64::from(size).saturating_sub(wire::BSDH_LEN as u64)
        })
    }

    pub(super) fn next_wr(&mut self) -> u64 {
        let id = SEND_WR_BIT | self.next_send_id;
        self.next_send_id = self.next_send_id.wrapping_add(1) & !SEND_WR_BIT;
        id
    }

    /// Emits a message without payload.
    pub(super) fn emit(&mut self, body: Body<'_>, flags: Flags, what: Sent) -> Op {
        let (mseq, bufs, mseq_ack) = self.credits.on_send();
        let repr = MessageRepr {
            bufs,
            flags,
            mseq,
            mseq_ack,
            body,
        };
        let mut buf = [0u8; MAX_HEADER_LEN];
        let len = repr.header_len().min(MAX_HEADER_LEN);
        repr.emit_header(&mut buf[..len]);
        let header = SendHeader::from_array(buf, len);
        let at = self.tx.sent();
        self.post_send(body.mid(), flags, header, at..at, what)
    }

    /// Emits a Data Message with payload, or a LocalData when the payload
    /// goes into the peer's ring ([`super::local`]).
    pub(super) fn emit_data(&mut self, chunk: Chunk) -> Op {
        let payload_len = chunk.range.end.saturating_sub(chunk.range.start);
        if chunk.flags.is_empty() {
            if let Some((ldh, at)) = self.local.next_slot(payload_len) {
                return self.emit_local(chunk, ldh, at);
            }
        }
        let (mseq, bufs, mseq_ack) = self.credits.on_send();
        // max_payload keeps this below 2^31.
        let len = u32::try_from(payload_len + wire::BSDH_LEN as u64).unwrap_or(u32::MAX);
        let bsdh = BsdhRepr {
            mid: Mid::DATA,
            flags: chunk.flags,
            bufs,
            len,
            mseq,
            mseq_ack,
        };
        let mut buf = [0u8; MAX_HEADER_LEN];
        bsdh.emit(&mut Bsdh::new_unchecked(&mut buf[..wire::BSDH_LEN]));
        let header = SendHeader::from_array(buf, wire::BSDH_LEN);
        self.tx.on_chunk_sent(&chunk);
        self.on_payload_sent(payload_len);
        self.post_send(Mid::DATA, chunk.flags, header, chunk.range, Sent::Other)
    }

    fn emit_local(&mut self, chunk: Chunk, ldh: wire::LocalDataRepr, at: PeerSlot) -> Op {
        if let local::SendPath::On(w) = &mut self.local.send {
            w.sent = w.sent.wrapping_add(1);
        }
        let mut op = self.emit(Body::LocalData(ldh), Flags::EMPTY, Sent::Other);
        self.tx.on_chunk_sent(&chunk);
        self.on_payload_sent(u64::from(ldh.len));
        if let Op::Send { payload, local, .. } = &mut op {
            *payload = chunk.range.clone();
            *local = Some(at);
        }
        if let Some(record) = self.sends.back_mut() {
            record.stream_end = chunk.range.end;
        }
        op
    }

    /// The adapter could not write a LocalData's payload into the peer
    /// (`why`): the message goes as the Data Message it stands for — same
    /// credits and sequence number, the payload in the message — and this
    /// send half stays on the wire from now on. Returns its header and
    /// payload range.
    /// `why` is `None` when only this message's bytes were not at hand:
    /// the path stays on, its slot unused.
    pub fn local_refused(
        &mut self,
        header: &SendHeader,
        payload: Range<u64>,
        why: Option<LocalOff>,
    ) -> (SendHeader, Range<u64>) {
        match (why, &mut self.local.send) {
            (Some(why), send) => *send = local::SendPath::Wire(why),
            (None, local::SendPath::On(w)) => w.sent = w.sent.wrapping_sub(1),
            (None, _) => {}
        }
        // A slot's worth may be more than the peer's Private Buffer holds
        // (§10 constraint 3): the message takes what it can, the rest goes
        // back to the unsent bytes (this is the last message emitted).
        let end = payload.end.min(payload.start + self.max_payload());
        if end < payload.end {
            self.tx.unsend(end);
            self.z.stats.bcopy_sent = self.z.stats.bcopy_sent.saturating_sub(payload.end - end);
            if let Some(record) = self.sends.back_mut() {
                record.stream_end = end;
            }
        }
        let len = (end - payload.start) as u32;
        let mut buf = [0u8; MAX_HEADER_LEN];
        if let Ok(b) = wire::Bsdh::new_checked(header.as_slice()) {
            let bsdh = BsdhRepr {
                mid: Mid::DATA,
                flags: Flags::EMPTY,
                bufs: b.bufs(),
                len: len.saturating_add(wire::BSDH_LEN as u32),
                mseq: b.mseq(),
                mseq_ack: b.mseq_ack(),
            };
            bsdh.emit(&mut Bsdh::new_unchecked(&mut buf[..wire::BSDH_LEN]));
        }
        (
            SendHeader::from_array(buf, wire::BSDH_LEN),
            payload.start..end,
        )
    }

    /// The peer's ring offer the adapter should check ([`super::local`]).
    pub fn local_offer_to_check(&self) -> Option<wire::LocalOfferRepr> {
        match &self.local.send {
            local::SendPath::Check(offer) => Some(**offer),
            _ => None,
        }
    }

    /// The adapter's verdict on the offer: LocalData from now on, or the
    /// wire for good.
    pub fn local_checked(&mut self, result: Result<(), LocalOff>) {
        if let local::SendPath::Check(offer) = &self.local.send {
            let offer = **offer;
            self.local.send = match result {
                Ok(()) => local::SendPath::On(Box::new(local::Writing { offer, sent: 0 })),
                Err(why) => local::SendPath::Wire(why),
            };
        }
    }

    /// Whether each half uses the same-host path: `Ok(())` for the send
    /// half when it writes into the peer, else why not; and whether our
    /// ring is offered to the peer.
    pub fn local_state(&self) -> (Result<(), LocalOff>, bool) {
        let send = match self.local.send {
            local::SendPath::On(_) => Ok(()),
            local::SendPath::Check(_) => Err(LocalOff::NotOffered),
            local::SendPath::Wire(why) => Err(why),
        };
        (send, self.pool.ring.is_some())
    }

    /// Whether our Zcopy advertisements name memory by its address in
    /// this process (Tagged Offset = virtual address, RFC 5040 §4.4), so
    /// that a peer on the same host can move the bytes itself: while both
    /// ends speak the extension and no `fork` came.
    pub fn local_tos(&self) -> bool {
        self.local.both && !self.local.forked
    }

    /// The peer process whose advertised memory we may read or write
    /// ourselves, and the token to read back after: its ring's offer,
    /// checked. `None` while the bytes go on the wire.
    pub fn local_peer(&self) -> Option<PeerSlot> {
        match &self.local.send {
            local::SendPath::On(w) => Some(PeerSlot {
                pid: w.offer.pid,
                addr: w.offer.ring,
                ring: w.offer.ring,
                token: w.offer.token,
            }),
            _ => None,
        }
    }

    /// The adapter could not move bytes of the peer's memory itself: the
    /// same-host path is left for good, the bytes go on the wire.
    pub fn local_left(&mut self, why: LocalOff) {
        if matches!(self.local.send, local::SendPath::On(_)) {
            self.local.send = local::SendPath::Wire(why);
        }
    }

    /// Before a `fork`: the peer writes no more into our ring (see
    /// [`local::Ring`]); what it wrote before is in both processes.
    pub fn local_revoke(&mut self) {
        self.local.forked = true;
        if let Some(ring) = &mut self.pool.ring {
            ring.revoke();
        }
    }

    /// Payload bytes received by LocalData.
    pub fn local_bytes_received(&self) -> u64 {
        self.pool.ring.as_ref().map_or(0, |r| r.bytes_received)
    }

    pub(super) fn post_send(
        &mut self,
        mid: Mid,
        flags: Flags,
        header: SendHeader,
        payload: core::ops::Range<u64>,
        what: Sent,
    ) -> Op {
        let wr_id = self.next_wr();
        self.sends.push_back(SendRecord {
            wr_id,
            stream_end: payload.end,
            what,
            done: false,
        });
        Op::Send {
            wr_id: WrId(wr_id),
            kind: SendKind::for_message(mid, flags),
            header,
            payload,
            local: None,
        }
    }

    pub(super) fn on_send_done(&mut self, now: Instant, wr_id: WrId, kind: Sent) {
        if self.state == State::Closed {
            return;
        }
        // Send Queue work requests complete in order (RFC 5040 §5), each
        // with its own kind of completion.
        match self.sends.front() {
            Some(s) if s.wr_id == wr_id.0 && s.what.completes_as() == kind => {}
            _ => return self.violation(Violation::BadCompletion),
        }
        // Work carried out locally behind it completes with it, in order.
        while let Some(record) = self.sends.pop_front() {
            self.complete(now, record);
            if !self.sends.front().is_some_and(|s| s.done) || self.state == State::Closed {
                break;
            }
        }
    }

    /// An RDMA Read or Write the adapter carried out itself (the
    /// same-host path, DESIGN §9): its bytes are placed; it completes in
    /// Send Queue order, as the engine's own would.
    pub(super) fn on_done_locally(&mut self, now: Instant, wr_id: WrId) {
        if self.state == State::Closed {
            return;
        }
        let record = self
            .sends
            .iter_mut()
            .find(|s| s.wr_id == wr_id.0 && !s.done && matches!(s.what, Sent::Read | Sent::Write));
        let Some(record) = record else {
            return self.violation(Violation::BadCompletion);
        };
        record.done = true;
        let (id, kind) = (record.wr_id, record.what);
        if self.sends.front().is_some_and(|s| s.wr_id == id) {
            self.on_send_done(now, WrId(id), kind);
        }
    }

    fn complete(&mut self, now: Instant, record: SendRecord) {
        self.tx.release(record.stream_end);
        match record.what {
            Sent::Other => {}
            Sent::Write => self.on_write_done(),
            Sent::Read => self.on_read_done(),
            Sent::DisConn => {
                if let Ending::DisConn { done, .. } = &mut self.ending {
                    *done = true;
                }
                self.check_graceful(now);
            }
            // §8.2.2: "Once the AbortConn Message completion event occurs,
            // an SDP implementation MUST use the normal LLP connection
            // teardown protocol to complete the teardown."
            Sent::AbortConn => self.finish(Teardown::Graceful),
            Sent::SuspCommAck => self.on_susp_comm_ack_done(),
        }
    }

    /// Offers `len` more bytes of the send stream. Returns how many are
    /// accepted (limited by [`Config::send_buffer`]); they get the next
    /// send stream offsets, `tx().accepted() - n .. tx().accepted()`, and
    /// the adapter keeps them until their Sends complete. With
    /// [`SendFlags::OOB`] the last accepted byte is urgent (§9.5.3).
    ///
    /// Errors: EAGAIN while the send buffer is full or before setup
    /// finished; a pending connection error once (ECONNRESET, ETIMEDOUT,
    /// ...); then EPIPE after shutdown(SHUT_WR), close or abort (§8.2.1:
    /// "MUST reject any send data posted by the ULP after the ULP close
    /// call").
    pub fn send(&mut self, len: usize, flags: SendFlags) -> Result<usize, Error> {
        self.send_allowed()?;
        if len == 0 {
            return Ok(0);
        }
        // A ULP buffer handed to send_zcopy is still in flight: its call
        // has not returned (a cancel may take back its tail, §9.5.4).
        if self.zsend_pending() {
            return Err(Error::WouldBlock);
        }
        self.large_writes = len as u64 >= self.max_payload();
        let room = self.send_room();
        self.credit_wanted = self.credit_bound && room < len as u64;
        if room == 0 {
            return Err(Error::WouldBlock);
        }
        let n = (len as u64).min(room);
        let oob = flags.contains(SendFlags::OOB);
        self.tx.accept(n, oob);
        self.hold.wrote(self.large_writes, oob);
        Ok(n as usize)
    }

    /// How many bytes a send takes now: what the send buffer has room
    /// for, and for a credit-bound conn ([`Conn::set_credit_bound`])
    /// writing a message's worth or more at a time, no more than the
    /// peer's credits carry beyond the bytes already waiting for them.
    /// Smaller writes still wait for credit in the send buffer, where they
    /// gather into full messages (one message each would spend a credit, a
    /// whole Private Buffer of the peer, on a few bytes). Writability
    /// follows the same rule for the same kind of write as the last, so a
    /// program that polls before each write never finds POLLOUT and then
    /// EAGAIN twice in a row.
    pub(super) fn send_room(&self) -> u64 {
        let room = self.config.send_buffer.saturating_sub(self.tx.buffered());
        if !self.credit_bound || !self.large_writes {
            return room;
        }
        room.min(self.credited_room())
    }

    /// Payload bytes the send credit lets go now (§10.5: a Data Message
    /// with payload needs three credits) beyond the bytes waiting for it.
    pub(super) fn credited_room(&self) -> u64 {
        let messages = self.credits.send_credit() - (PAYLOAD_MIN_CREDIT - 1);
        let carried = u64::try_from(messages).unwrap_or(0) * self.message_max();
        carried.saturating_sub(self.tx.unsent())
    }

    /// The checks every send call makes.
    pub(super) fn send_allowed(&mut self) -> Result<(), Error> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        match self.state {
            State::HelloSent | State::HelloReceived => return Err(Error::WouldBlock),
            State::Closed => return Err(Error::BrokenPipe),
            State::Connected => {}
        }
        if self.ending != Ending::Open || self.abort_conn != AbortConn::None {
            return Err(Error::BrokenPipe);
        }
        Ok(())
    }

    /// Whether sends take only what the peer's credits carry now, for a
    /// program that waits for POLLOUT itself (O_NONBLOCK) instead of in
    /// the call: a write that finds no credit is refused (EAGAIN), its
    /// bytes stay in the program's buffer, and POLLOUT comes with the
    /// credit, when they go from that buffer to the socket without the
    /// copy into the send buffer that would otherwise hold them meanwhile
    /// (DESIGN §7 "Copies"). Writes smaller than a message still gather
    /// in the send buffer behind missing credit (see `Conn::send_room`).
    /// Off: sends fill the send buffer whatever the credit, for calls that
    /// wait.
    pub fn set_credit_bound(&mut self, on: bool) {
        self.credit_bound = on;
    }

    /// TCP_NODELAY: every message goes as soon as credit allows; no short
    /// tail of a write waits for the next write ([`Conn::holds`]).
    pub fn set_nodelay(&mut self, on: bool) {
        self.nodelay = on;
    }

    /// Whether TCP_NODELAY is set ([`Conn::set_nodelay`]).
    pub fn nodelay(&self) -> bool {
        self.nodelay
    }

    /// SO_SNDBUF: how many accepted bytes may wait for their Sends to
    /// complete from now on (bytes already accepted stay).
    pub fn set_send_buffer(&mut self, bytes: u64) {
        self.config.send_buffer = bytes.max(1);
    }

    /// Writable (POLLOUT): a send would accept at least one byte, or fail
    /// at once.
    pub fn writable(&self) -> bool {
        match self.state {
            State::HelloSent | State::HelloReceived => false,
            State::Closed => true,
            State::Connected => {
                self.error.is_some()
                    || self.ending != Ending::Open
                    || self.abort_conn != AbortConn::None
                    || self.send_room() > 0
            }
        }
    }

    /// Whether control messages wait to be sent (a SendSm that a `recv`
    /// finding nothing queued, say): whoever goes to sleep drives the link
    /// first, or the peer would wait for it.
    pub fn control_pending(&self) -> bool {
        !self.control.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WAIT: Duration = Duration::from_millis(5);

    fn at(t0: Instant, us: u64) -> Instant {
        t0 + Duration::from_micros(us)
    }

    #[test]
    fn only_large_writes_close_behind_another_hold_their_tail() {
        let t0 = Instant::now();
        let mut h = Hold::default();
        // The first write of a burst sends all it has.
        h.wrote(true, false);
        h.tick(t0, WAIT);
        assert!(!h.holds(t0, WAIT, false));
        // The next one, 20 µs later, holds its tail for the wait.
        h.wrote(true, false);
        h.tick(at(t0, 20), WAIT);
        assert!(h.holds(at(t0, 30), WAIT, false));
        assert!(h.holding());
        assert_eq!(h.deadline(), Some(at(t0, 30) + WAIT));
        // A small write close behind sends its bytes.
        h.wrote(false, false);
        h.tick(at(t0, 40), WAIT);
        assert!(!h.holds(at(t0, 40), WAIT, false));
        assert_eq!(h.deadline(), None);
        // A large write long after the last one starts a burst again.
        h.wrote(true, false);
        h.tick(at(t0, 40) + WAIT, WAIT);
        assert!(!h.holds(at(t0, 40) + WAIT, WAIT, false));
    }

    #[test]
    fn with_scarce_credit_small_writes_close_behind_another_hold_too() {
        let t0 = Instant::now();
        let mut h = Hold::default();
        // The first small write of a burst sends all it has.
        h.wrote(false, false);
        h.tick(t0, WAIT);
        assert!(!h.holds(t0, WAIT, true));
        // The next one, close behind, holds while credit is scarce...
        h.wrote(false, false);
        h.tick(at(t0, 20), WAIT);
        assert!(!h.holds(at(t0, 20), WAIT, false));
        assert!(h.holds(at(t0, 20), WAIT, true));
        assert_eq!(h.deadline(), Some(at(t0, 20) + WAIT));
        // ...and goes once credit came back.
        assert!(!h.holds(at(t0, 30), WAIT, false));
        assert!(!h.holding());
        assert_eq!(h.deadline(), None);
        // A small write a whole wait after the last one starts a burst.
        h.wrote(false, false);
        h.tick(at(t0, 40) + WAIT, WAIT);
        assert!(!h.holds(at(t0, 40) + WAIT, WAIT, true));
    }

    #[test]
    fn a_held_tail_goes_when_the_wait_ends_or_on_a_push() {
        let t0 = Instant::now();
        let mut h = Hold::default();
        h.wrote(true, false);
        h.tick(t0, WAIT);
        h.wrote(true, false);
        h.tick(at(t0, 10), WAIT);
        assert!(h.holds(at(t0, 10), WAIT, false));
        // The wait runs out.
        h.tick(at(t0, 10) + WAIT, WAIT);
        assert!(!h.holding());
        assert!(!h.holds(at(t0, 11) + WAIT, WAIT, false));
        // That write came a whole wait after the one before: the next
        // one is the first of a burst, the one after it holds until a
        // push.
        let t1 = at(t0, 20) + WAIT;
        h.wrote(true, false);
        h.tick(t1, WAIT);
        assert!(!h.holds(t1, WAIT, false));
        h.wrote(true, false);
        h.tick(at(t1, 10), WAIT);
        assert!(h.holds(at(t1, 10), WAIT, false));
        h.push();
        assert!(!h.holds(at(t1, 11), WAIT, false));
        assert_eq!(h.deadline(), None);
        // An urgent write holds nothing back.
        h.wrote(true, true);
        h.tick(at(t1, 20), WAIT);
        assert!(!h.holds(at(t1, 20), WAIT, false));
    }

    #[test]
    fn chunks_respect_the_peer_buffer() {
        let mut tx = TxStream::default();
        tx.accept(25, false);
        let c = tx.next_chunk(10).unwrap();
        assert_eq!((c.range.clone(), c.flags), (0..10, Flags::EMPTY));
        tx.on_chunk_sent(&c);
        let c = tx.next_chunk(10).unwrap();
        tx.on_chunk_sent(&c);
        let c = tx.next_chunk(10).unwrap();
        assert_eq!(c.range, 20..25);
        tx.on_chunk_sent(&c);
        assert_eq!(tx.next_chunk(10), None);
        tx.release(20);
        assert_eq!(tx.buffered(), 5);
    }

    #[test]
    fn oob_byte_ends_its_message() {
        let mut tx = TxStream::default();
        tx.accept(5, false);
        tx.accept(5, true); // byte 9 urgent
        tx.accept(5, false);
        let c = tx.next_chunk(100).unwrap();
        assert_eq!(c.range, 0..10);
        assert_eq!(c.flags, Flags::OOB_PEND | Flags::OOB_PRES);
        tx.on_chunk_sent(&c);
        let c = tx.next_chunk(100).unwrap();
        assert_eq!((c.range.clone(), c.flags), (10..15, Flags::EMPTY));
    }

    #[test]
    fn oob_pend_waits_until_within_65535_bytes() {
        let mut tx = TxStream::default();
        tx.accept(100_000, true); // byte 99_999 urgent
        assert!(!tx.pend_due());
        let c = tx.next_chunk(1 << 20).unwrap();
        // Cut so that the next message starts 65_535 bytes before the end.
        assert_eq!((c.range.clone(), c.flags), (0..34_465, Flags::EMPTY));
        tx.on_chunk_sent(&c);
        assert!(tx.pend_due());
        let c = tx.next_chunk(1 << 20).unwrap();
        assert_eq!(c.range, 34_465..100_000);
        assert_eq!(c.flags, Flags::OOB_PEND | Flags::OOB_PRES);
        assert_eq!(c.range.end - c.range.start, OOB_PEND_REACH);
    }

    #[test]
    fn pend_sent_early_is_not_repeated() {
        let mut tx = TxStream::default();
        tx.accept(50, true);
        assert!(tx.pend_due());
        tx.on_pend_sent();
        let c = tx.next_chunk(20).unwrap();
        assert_eq!((c.range.clone(), c.flags), (0..20, Flags::EMPTY));
        tx.on_chunk_sent(&c);
        tx.on_chunk_sent(&tx.next_chunk(20).unwrap());
        let c = tx.next_chunk(20).unwrap();
        assert_eq!((c.range.clone(), c.flags), (40..50, Flags::OOB_PRES));
    }
}
