//! Zero copy and Flow Control Modes (draft §9.2 Read Zcopy, §9.3 Write
//! Zcopy, §9.4 Transaction, §9.5.1 stale SinkAvails, §9.5.2 forcing
//! Bcopy, §9.5.4–§9.5.5 cancels, §11 Modes, §12 Mode transitions).
//!
//! Read first: §11 Figure 25 (what each peer may do for each pair of
//! Modes) and §12 Figures 26–31.
//!
//! This file holds the state (`Zcopy`, one part of [`Conn`]) and the
//! application's entries; the protocol is in three parts: `source` (our
//! send half: SrcAvail, Write Zcopy, where Bcopy stops), `sink` (our
//! receive half: posted buffers, RDMA Reads, SinkAvails) and `mode` (§11,
//! §12). Bcopy traffic meets them only in the §9.5.1 counters and the
//! statistics every payload message moves, and in checks that find no
//! Zcopy state.
//!
//! # The application side
//!
//! * Data Source: [`Conn::send_zcopy`] hands one ULP send buffer (its bytes
//!   get the next send stream offsets, as with [`Conn::send`]). A buffer
//!   larger than [`Config::bcopy_threshold`](super::Config) goes by Read
//!   Zcopy (SrcAvail) or, in Pipelined Mode with a SinkAvail in hand, by
//!   Write Zcopy; a smaller one by Bcopy. The buffer is done when
//!   [`Conn::poll_completion`] returns its [`Completion::Sent`]: after the
//!   final RdmaRdCompl, the RdmaWrCompl, the Bcopy of the rest after a
//!   SendSm, or a cancel (§9.5.4) when its deadline passed — then `len`
//!   tells how much of it is in the stream.
//! * Data Sink: [`Conn::post_recv`] posts a ULP receive buffer the adapter
//!   holds. It is a Zcopy opportunity: RDMA Reads of an advertised SrcAvail
//!   land in it, or it is advertised with a SinkAvail in Pipelined Mode
//!   (only if larger than our receive Private Buffers, §9.5.1, and never
//!   for MSG_WAITALL, §9.3). [`Completion::Received`] returns it: `placed`
//!   bytes are in it, or `copy` bytes are to be taken with [`Conn::recv`]
//!   (the payload of exactly one SDP Message, §9.5.1). A deadline cancels
//!   its SinkAvail (§9.5.5). Placed bytes keep their place in the stream:
//!   `recv` stops in front of them and their completion comes once every
//!   byte before them was read.
//!
//! # Modes
//!
//! Each half-connection has its own Mode (§11). We are Mode Master of our
//! send half in Combined and Pipelined Mode and of our receive half in
//! Buffered Mode (Figure 27); [`Conn::set_send_mode`] and
//! [`Conn::set_recv_mode`] ask for a transition, [`Config::pipelining`] and
//! [`Config::buffered_after_send_sm`] are the automatic policies.

mod mode;
mod sink;
mod source;

use std::collections::VecDeque;
use std::time::Instant;

use super::{Conn, Control, FlowControlMode};
use crate::errno::Error;
use crate::verbs::{MemId, RdmaOp, RecvId, SendId, SendKind};
use crate::wire::{Body, RdmaRdComplRepr, RdmaWrComplRepr};

/// §6.3.2.1, §6.3.3.1: an advertised buffer is at most 2^31 bytes.
const MAX_ADVERT: u64 = 1 << 31;

/// SendSms in a row after which a Pipelined Mode Data Source stops
/// advertising by SrcAvail for [`SKIP_SRC_AVAIL`] bytes.
const SEND_SMS_TO_SKIP: u32 = 2;

/// How much of the stream goes by Bcopy without asking by SrcAvail again.
const SKIP_SRC_AVAIL: u64 = 16 << 20;

/// How many bytes of a Combined Mode SrcAvail's buffer travel in it
/// (§11.2: "greater than zero bytes ... The actual amount of ULP data
/// included is implementation dependent").
pub const SRC_AVAIL_PAYLOAD: u64 = 1024;

/// What became of a ULP buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// A [`Conn::send_zcopy`] buffer is done: `len` of its bytes are in
    /// the stream (fewer than handed only after a cancel), `zcopy` of them
    /// went by RDMA.
    Sent {
        /// The buffer.
        id: SendId,
        /// Bytes of it sent.
        len: u64,
        /// Of which by RDMA Read or Write.
        zcopy: u64,
    },
    /// A [`Conn::post_recv`] buffer is returned.
    Received {
        /// The buffer.
        id: RecvId,
        /// Bytes placed at its start by RDMA (the next bytes of the
        /// stream).
        placed: u32,
        /// Otherwise: bytes to copy into it with [`Conn::recv`] — one SDP
        /// Message's payload (§9.5.1). Both 0: returned unused (cancel,
        /// timeout, Mode change).
        copy: u32,
    },
}

/// Bytes and messages by mechanism (for observability and tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZcopyStats {
    /// Payload bytes sent in Data, SrcAvail and SinkAvail Messages.
    pub bcopy_sent: u64,
    /// Bytes the peer took by RDMA Read (acknowledged by RdmaRdCompl).
    pub read_zcopy_sent: u64,
    /// Bytes we sent by RDMA Write.
    pub write_zcopy_sent: u64,
    /// Payload bytes received in messages.
    pub bcopy_received: u64,
    /// Bytes we took by RDMA Read.
    pub read_zcopy_received: u64,
    /// Bytes the peer wrote into our buffers.
    pub write_zcopy_received: u64,
    /// SrcAvail Messages sent.
    pub src_avails: u64,
    /// SinkAvail Messages sent.
    pub sink_avails: u64,
    /// SendSm Messages sent.
    pub send_sms: u64,
    /// SrcAvailCancel and SinkAvailCancel Messages sent.
    pub cancels: u64,
    /// ModeChange Messages sent.
    pub mode_changes: u64,
}

/// Outstanding advertisements, for the Figure 25 checks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ZcopyState {
    /// Our SrcAvails not yet Processed.
    pub src_out: usize,
    /// The peer's SrcAvails we have not Processed.
    pub src_in: usize,
    /// Our SinkAvails not yet Processed.
    pub sink_out: usize,
    /// The peer's SinkAvails we hold.
    pub sink_in: usize,
    /// A Pipelined → Combined ModeChange of ours is not yet acknowledged
    /// (§12.4): stale SinkAvails may still arrive.
    pub mode_ack_pending: bool,
    /// Our §9.5.1 PotentialNonDiscards (Data Source).
    pub potential_non_discards: u32,
    /// Our §9.5.1 NonDiscards (Data Sink).
    pub non_discards: u32,
    /// Our SrcAvailCancel went and is not yet Processed (§9.5.4): a
    /// SendSm or RdmaRdCompl (or a SinkAvail, §11.3 rule 1b) has not yet
    /// finished every SrcAvail it canceled.
    pub src_cancel_sent: bool,
}

/// A ULP send buffer (Data Source).
#[derive(Debug, Clone)]
pub(crate) struct ZSend {
    id: SendId,
    start: u64,
    end: u64,
    /// Larger than the Bcopy Threshold.
    zcopy: bool,
    deadline: Option<Instant>,
    rdma: u64,
    /// Until when it waits for a SinkAvail ([`Config::sink_avail_wait`]).
    ///
    /// [`Config::sink_avail_wait`]: super::Config::sink_avail_wait
    sink_wait: Option<Instant>,
}

/// A SrcAvail we sent, not yet Processed.
#[derive(Debug, Clone)]
pub(crate) struct SrcOut {
    /// Numbered in sending order.
    n: u64,
    /// Stream offset of the buffer's first byte.
    start: u64,
    len: u64,
    payload: u64,
    /// Bytes acknowledged by RdmaRdCompl.
    done: u64,
    mem: MemId,
    stag: u32,
}

/// The next SrcAvail, while its buffer is being registered.
#[derive(Debug, Clone)]
pub(crate) struct PendingSrc {
    start: u64,
    len: u64,
    mem: MemId,
    reg: Option<(u32, u64)>,
}

/// A SinkAvail received (Data Source).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SinkIn {
    len: u32,
    stag: u32,
    va: u64,
    non_discards: u32,
}

/// An RDMA Write under way and the RdmaWrCompl it owes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Writing {
    stag: u32,
    len: u32,
}

/// A SrcAvail received (Data Sink), Unprocessed or In-Process.
#[derive(Debug, Clone)]
pub(crate) struct SrcIn {
    stag: u32,
    va: u64,
    len: u64,
    payload: u64,
    /// Bytes taken by RDMA Read and acknowledged.
    done: u64,
    /// An RDMA Read of this many bytes into the posted buffer is under way.
    reading: Option<u32>,
}

/// How far a posted buffer's registration got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reg {
    None,
    Pending(MemId),
    Done { mem: MemId, stag: u32, to: u64 },
}

/// A posted ULP receive buffer (Data Sink).
#[derive(Debug, Clone)]
pub(crate) struct Posted {
    id: RecvId,
    len: u32,
    waitall: bool,
    deadline: Option<Instant>,
    reg: Reg,
    /// Sent in a SinkAvail.
    advertised: bool,
    /// An RDMA Read into it is under way.
    reading: bool,
    /// The application took it back.
    cancel: bool,
    /// Registered for remote write (a SinkAvail), not only as the local
    /// target of RDMA Reads.
    remote: bool,
}

/// The Zcopy and Mode state of one connection.
#[derive(Debug, Default)]
pub(crate) struct Zcopy {
    pub send_mode: Option<FlowControlMode>,
    pub recv_mode: Option<FlowControlMode>,
    next_id: u64,
    next_mem: u32,
    // ----- Data Source (our send half)
    zsends: VecDeque<ZSend>,
    pub srcs: VecDeque<SrcOut>,
    pending_src: Option<PendingSrc>,
    sinks: VecDeque<SinkIn>,
    pub writing: Option<Writing>,
    /// A SinkAvailCancel canceled SinkAvails while an RDMA Write was
    /// In-Process: the SinkCancelAck follows its RdmaWrCompl.
    cancel_ack_after_write: bool,
    /// A cancel took back the stream's tail (§9.5.4): the last send buffer
    /// it cut, until the application polled its completion.
    cut: Option<SendId>,
    /// §9.5.2.1: after a SendSm, the rest of that SrcAvail's buffer goes by
    /// Bcopy, up to this stream offset.
    forced_to: Option<u64>,
    /// §9.5.1 PotentialNonDiscards.
    pnd: u32,
    /// PotentialNonDiscards when our Pipelined → Combined ModeChange went,
    /// less the stale SinkAvails discarded since (§12.4).
    pnd_at_mode_change: u32,
    /// The last SrcAvail sent before that ModeChange.
    last_src_before_mode_change: Option<u64>,
    /// Our SrcAvailCancel: queued (None) or sent as MSeq (Some).
    pub src_cancel: Option<Option<u32>>,
    /// A ModeChange we want to send: (S bit, new Mode).
    mode_change: Option<(bool, FlowControlMode)>,
    /// §12.4: MSeq of our Pipelined → Combined ModeChange until an
    /// MSeqAck reaches it.
    mode_ack: Option<u32>,
    send_sms_in_row: u32,
    /// Pipelined Mode: the Data Sink answered our last SrcAvails by
    /// SendSm; Zcopy buffers before this stream offset go by Bcopy without
    /// a SrcAvail (see `Conn::skip_src_avail`).
    skip_src_until: u64,
    /// The last Zcopy buffer went by Write Zcopy: the Data Sink posts its
    /// receive buffers ahead of our sends.
    sink_streak: bool,
    // ----- Data Sink (our receive half)
    srcs_in: VecDeque<SrcIn>,
    posted: VecDeque<Posted>,
    /// §9.5.1 NonDiscards.
    nd: u32,
    /// §9.2: after our SendSm, no RdmaRdCompl until the stream reaches
    /// this offset (the end of that SrcAvail's buffer) and no payload
    /// before the peer saw the SendSm (MSeq).
    forced_until: Option<(u64, u32)>,
    /// The peer's SrcAvailCancel (its MSeq), being processed.
    cancel_in: Option<u32>,
    /// Our SinkAvailCancel is out and not yet Processed.
    sink_cancel: bool,
    /// A ModeChange ended Pipelined Mode while our SinkAvailCancel was
    /// out: its SinkCancelAck may still come.
    sink_cancel_crossed: bool,
    completions: VecDeque<Completion>,
    /// Received completions with placed bytes: (stream offset, completion).
    placed: VecDeque<(u64, Completion)>,
    pub stats: ZcopyStats,
}

impl Zcopy {
    fn mem(&mut self) -> MemId {
        self.next_mem = self.next_mem.wrapping_add(1);
        MemId(self.next_mem)
    }

    fn id(&mut self) -> u64 {
        self.next_id = self.next_id.wrapping_add(1);
        self.next_id
    }
}

impl Conn {
    /// Outstanding advertisements (see [`ZcopyState`]).
    pub fn zcopy_state(&self) -> ZcopyState {
        ZcopyState {
            src_out: self.z.srcs.len(),
            src_in: self.z.srcs_in.len(),
            sink_out: self.z.posted.iter().filter(|p| p.advertised).count(),
            sink_in: self.z.sinks.len(),
            mode_ack_pending: self.z.mode_ack.is_some(),
            potential_non_discards: self.z.pnd,
            non_discards: self.z.nd,
            src_cancel_sent: matches!(self.z.src_cancel, Some(Some(_))),
        }
    }

    /// Bytes and messages by mechanism.
    pub fn zcopy_stats(&self) -> ZcopyStats {
        self.z.stats
    }

    /// Hands one ULP send buffer of `len` bytes (see the [module
    /// documentation](self)); it gets the next `len` send stream offsets.
    /// `deadline`: when its advertisements are canceled (§9.5.4,
    /// SO_SNDTIMEO). Not limited by [`Config::send_buffer`](super::Config):
    /// the adapter keeps (or registers) the whole buffer until its
    /// completion. `now` starts its wait for a SinkAvail, if it waits
    /// ([`Config::sink_avail_wait`](super::Config)). Errors as
    /// [`Conn::send`]; EINVAL for an empty buffer.
    pub fn send_zcopy(
        &mut self,
        len: u64,
        deadline: Option<Instant>,
        now: Instant,
    ) -> Result<SendId, Error> {
        self.send_allowed()?;
        if len == 0 {
            return Err(Error::InvalidInput);
        }
        if self.z.cut.is_some() {
            return Err(Error::WouldBlock);
        }
        let start = self.tx.accepted();
        self.tx.accept(len, false);
        let id = SendId(self.z.id());
        let zcopy = len > self.config.bcopy_threshold;
        let wait = self.config.sink_avail_wait;
        self.z.zsends.push_back(ZSend {
            id,
            start,
            end: start.saturating_add(len),
            zcopy,
            deadline,
            rdma: 0,
            sink_wait: (zcopy && self.z.sink_streak && !wait.is_zero()).then(|| now + wait),
        });
        Ok(id)
    }

    /// Posts a ULP receive buffer of `len` bytes (see the [module
    /// documentation](self)). [`RecvFlags::WAITALL`](super::RecvFlags):
    /// never advertised by SinkAvail (§9.3). `deadline`: when an
    /// advertisement is canceled (§9.5.5, SO_RCVTIMEO) or the buffer is
    /// returned unused. ENOTCONN before setup, EINVAL for an empty buffer.
    pub fn post_recv(
        &mut self,
        len: u32,
        flags: super::RecvFlags,
        deadline: Option<Instant>,
    ) -> Result<RecvId, Error> {
        if self.state != super::State::Connected {
            return Err(Error::NotConnected);
        }
        if len == 0 {
            return Err(Error::InvalidInput);
        }
        let id = RecvId(self.z.id());
        if self.peer_disconn.is_some() {
            // §8.2.1: the Remote Peer "MUST complete any new ULP receive
            // buffers" once the DisConn arrived.
            self.z.completions.push_back(Completion::Received {
                id,
                placed: 0,
                copy: 0,
            });
            return Ok(id);
        }
        self.z.posted.push_back(Posted {
            id,
            len,
            waitall: flags.contains(super::RecvFlags::WAITALL),
            deadline,
            reg: Reg::None,
            advertised: false,
            reading: false,
            cancel: false,
            remote: false,
        });
        self.sink_progress();
        Ok(id)
    }

    /// Takes back a posted buffer not yet in use (returned at once, unused)
    /// or cancels its SinkAvail (§9.5.5). False if it is no longer posted.
    pub fn cancel_recv(&mut self, id: RecvId) -> bool {
        let Some(i) = self.z.posted.iter().position(|p| p.id == id) else {
            return false;
        };
        if let Some(p) = self.z.posted.get_mut(i) {
            p.cancel = true;
        }
        self.expire_posted(None);
        true
    }

    /// Takes back a send buffer as its deadline would at `now` (a signal
    /// interrupted the blocking call that lent it): an outstanding
    /// SrcAvail of it is canceled (§9.5.4), and its completion tells how
    /// much of it is in the stream. A buffer not advertised yet is canceled
    /// once it is. False if it is no longer under way.
    pub fn cancel_send(&mut self, id: SendId, now: Instant) -> bool {
        let Some(z) = self.z.zsends.iter_mut().find(|z| z.id == id) else {
            return false;
        };
        z.deadline = Some(z.deadline.map_or(now, |d| d.min(now)));
        self.zcopy_timeout(now);
        true
    }

    /// The next finished ULP buffer. A [`Completion::Received`] with placed
    /// bytes comes once every stream byte before them was read.
    pub fn poll_completion(&mut self) -> Option<Completion> {
        if let Some(c) = self.z.completions.pop_front() {
            if let Completion::Sent { id, .. } = c {
                if self.z.cut == Some(id) {
                    self.z.cut = None;
                }
            }
            return Some(c);
        }
        let &(at, c) = self.z.placed.front()?;
        if self.rx.read_pos() == at && self.rx.placed_at_read().is_some() {
            self.rx.take_placed();
            self.z.placed.pop_front();
            return Some(c);
        }
        None
    }

    /// Whether [`Conn::poll_completion`] has something.
    pub fn completion_ready(&self) -> bool {
        !self.z.completions.is_empty()
            || self
                .z
                .placed
                .front()
                .is_some_and(|&(at, _)| self.rx.read_pos() == at)
    }

    /// The earliest Zcopy deadline.
    pub(crate) fn zcopy_deadline(&self) -> Option<Instant> {
        if self.z.zsends.is_empty() && self.z.posted.is_empty() {
            // Bcopy traffic: no buffer lent, nothing to time.
            return None;
        }
        let sends = self
            .z
            .zsends
            .iter()
            .filter(|z| {
                self.z
                    .srcs
                    .iter()
                    .any(|s| s.start < z.end && s.start >= z.start)
            })
            .filter_map(|z| z.deadline);
        let waits = self.z.zsends.iter().filter_map(|z| z.sink_wait);
        // A buffer going by Bcopy, until its bytes are all in Sends.
        let sent = self.tx.sent();
        let bcopy = self
            .z
            .zsends
            .iter()
            .filter(|z| !z.zcopy && z.end > sent)
            .filter_map(|z| z.deadline);
        let recvs = self
            .z
            .posted
            .iter()
            .filter(|p| !p.reading)
            .filter_map(|p| p.deadline);
        sends.chain(waits).chain(bcopy).chain(recvs).min()
    }

    /// Zcopy timers: cancels for expired buffers.
    pub(crate) fn zcopy_timeout(&mut self, now: Instant) {
        // A wait for a SinkAvail that ran out: SrcAvail or Bcopy now, and
        // no more waiting until a SinkAvail is used again.
        for z in &mut self.z.zsends {
            if z.sink_wait.is_some_and(|t| t <= now) {
                z.sink_wait = None;
                self.z.sink_streak = false;
            }
        }
        // §9.5.4: a send whose advertisement outlived its deadline.
        let mut expired = false;
        for z in &mut self.z.zsends {
            if z.deadline.is_some_and(|d| d <= now)
                && self
                    .z
                    .srcs
                    .iter()
                    .any(|s| s.start >= z.start && s.start < z.end)
            {
                z.deadline = None;
                expired = true;
            }
        }
        if expired && self.z.src_cancel.is_none() {
            self.z.src_cancel = Some(None);
            self.z.stats.cancels += 1;
            self.control.push_back(Control::SrcAvailCancel);
        }
        // A buffer going by Bcopy whose deadline passed: what is not yet in
        // a Send leaves the stream (nothing of it reached the peer), as a
        // timed-out TCP write returns what the socket took.
        let sent = self.tx.sent();
        let cut = self
            .z
            .zsends
            .iter_mut()
            .find(|z| !z.zcopy && z.end > sent && z.deadline.is_some_and(|d| d <= now))
            .map(|z| {
                z.deadline = None;
                z.start.max(sent)
            });
        if let Some(point) = cut {
            self.retract(point);
            // Its Sends may all be complete already: nothing else would
            // report it.
            self.source_settle();
        }
        self.expire_posted(Some(now));
    }

    /// Returns expired posted buffers not in use; cancels expired
    /// SinkAvails (§9.5.5), and buffers the application took back.
    fn expire_posted(&mut self, now: Option<Instant>) {
        let due =
            |p: &Posted| p.cancel || matches!((p.deadline, now), (Some(d), Some(n)) if d <= n);
        let mut cancel = false;
        let mut i = 0;
        while i < self.z.posted.len() {
            let Some(p) = self.z.posted.get(i).cloned() else {
                break;
            };
            if !due(&p) || p.reading {
                i += 1;
                continue;
            }
            if p.advertised {
                cancel = true;
                if let Some(q) = self.z.posted.get_mut(i) {
                    q.deadline = None;
                    q.cancel = false;
                }
                i += 1;
                continue;
            }
            self.z.posted.remove(i);
            self.release_posted(&p);
            self.z.completions.push_back(Completion::Received {
                id: p.id,
                placed: 0,
                copy: 0,
            });
        }
        if cancel && !self.z.sink_cancel {
            // §9.5.5: "the Data Sink MUST send the SinkAvailCancel Message".
            self.z.sink_cancel = true;
            self.z.stats.cancels += 1;
            self.control.push_back(Control::SinkAvailCancel);
        }
    }

    fn release_posted(&mut self, p: &Posted) {
        match p.reg {
            Reg::Done { mem, .. } | Reg::Pending(mem) => {
                self.rdma_out.push_back(RdmaOp::Deregister { mem });
            }
            Reg::None => {}
        }
    }

    /// A registration finished.
    pub(crate) fn on_registered(&mut self, mem: MemId, stag: u32, to: u64) {
        if let Some(p) = self.z.pending_src.as_mut().filter(|p| p.mem == mem) {
            p.reg = Some((stag, to));
            return;
        }
        if let Some(p) = self
            .z
            .posted
            .iter_mut()
            .find(|p| p.reg == Reg::Pending(mem))
        {
            p.reg = Reg::Done { mem, stag, to };
        }
    }

    /// The Send kind of an RdmaRdCompl or RdmaWrCompl: with SE, and with
    /// Invalidate of the advertised STag when given (§9.2, §9.3).
    pub(crate) fn compl_kind(invalidate: Option<u32>) -> SendKind {
        match invalidate {
            Some(stag) => SendKind::SendSeInvalidate(stag),
            None => SendKind::SendSe,
        }
    }

    /// The RdmaRdCompl body.
    pub(crate) fn rd_compl(len: u32) -> Body<'static> {
        Body::RdmaRdCompl(RdmaRdComplRepr { len })
    }

    /// The RdmaWrCompl body.
    pub(crate) fn wr_compl(len: u32) -> Body<'static> {
        Body::RdmaWrCompl(RdmaWrComplRepr { len })
    }
}
