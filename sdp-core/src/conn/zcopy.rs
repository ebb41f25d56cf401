//! Zero copy and Flow Control Modes (draft §9.2 Read Zcopy, §9.3 Write
//! Zcopy, §9.4 Transaction, §9.5.1 stale SinkAvails, §9.5.2 forcing
//! Bcopy, §9.5.4–§9.5.5 cancels, §11 Modes, §12 Mode transitions).
//!
//! Read first: §11 Figure 25 (what each peer may do for each pair of
//! Modes) and §12 Figures 26–31.
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

use std::collections::VecDeque;
use std::time::Instant;

use super::{seq_ge, Conn, Control, FlowControlMode, Sent, Violation};
use crate::errno::Error;
use crate::verbs::{Access, MemId, Memory, RdmaOp, RecvId, SendId, SendKind, Work, WrId};
use crate::wire::{
    self, Body, Flags, Mid, Mode, ModeChangeRepr, RdmaRdComplRepr, RdmaWrComplRepr, SinkAvailRepr,
    SrcAvailRepr,
};

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

/// The wire Mode of a Flow Control Mode.
fn wire_mode(m: FlowControlMode) -> Mode {
    match m {
        FlowControlMode::Buffered => Mode::BUFF_MODE,
        FlowControlMode::Combined => Mode::COMB_MODE,
        FlowControlMode::Pipelined => Mode::PIPE_MODE,
    }
}

impl Conn {
    pub(crate) fn zsend_mode(&self) -> FlowControlMode {
        self.z.send_mode.unwrap_or(FlowControlMode::Combined)
    }

    pub(crate) fn zrecv_mode(&self) -> FlowControlMode {
        self.z.recv_mode.unwrap_or(FlowControlMode::Combined)
    }

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

    /// As Mode Master of our send half (§12.1, §12.3, §12.4), moves it to
    /// `mode`: Combined → Buffered once no SrcAvail is outstanding,
    /// Combined ↔ Pipelined. EINVAL for a transition outside Figure 26 or
    /// while we are Mode Slave (Buffered: the Data Sink is master); EAGAIN
    /// while a transition is under way.
    pub fn set_send_mode(&mut self, mode: FlowControlMode) -> Result<(), Error> {
        use FlowControlMode::*;
        if self.state != super::State::Connected {
            return Err(Error::NotConnected);
        }
        match (self.zsend_mode(), mode) {
            (Combined, Buffered) | (Combined, Pipelined) | (Pipelined, Combined) => {}
            _ => return Err(Error::InvalidInput),
        }
        if self.z.mode_change.is_some() || self.z.mode_ack.is_some() || self.mode_change_queued() {
            return Err(Error::WouldBlock);
        }
        self.z.mode_change = Some((false, mode));
        Ok(())
    }

    /// As Mode Master of our receive half in Buffered Mode (§12.2), moves
    /// it to Combined Mode. EINVAL otherwise.
    pub fn set_recv_mode(&mut self, mode: FlowControlMode) -> Result<(), Error> {
        if self.state != super::State::Connected {
            return Err(Error::NotConnected);
        }
        if self.zrecv_mode() != FlowControlMode::Buffered || mode != FlowControlMode::Combined {
            return Err(Error::InvalidInput);
        }
        if self.z.mode_change.is_some() || self.mode_change_queued() {
            return Err(Error::WouldBlock);
        }
        self.z.mode_change = Some((true, mode));
        Ok(())
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

    // ----- Data Source -------------------------------------------------

    /// The ZSend holding stream offset `at`.
    fn zsend_at(&self, at: u64) -> Option<&ZSend> {
        self.z.zsends.iter().find(|z| z.start <= at && at < z.end)
    }

    /// Whether the bytes from `at` go by Zcopy now.
    fn zcopy_from(&self, at: u64) -> bool {
        self.zsend_mode() != FlowControlMode::Buffered
            && self
                .zsend_at(at)
                .is_some_and(|z| z.zcopy && z.end.saturating_sub(at) >= 2)
    }

    /// Whether the Zcopy buffer holding `at` goes by Bcopy with no SrcAvail
    /// (decided at its start, so none is split by a late SrcAvail):
    /// Pipelined Mode, no SinkAvail in hand nor awaited, and the Data Sink
    /// answered our last [`SEND_SMS_TO_SKIP`] SrcAvails by SendSm — a
    /// SrcAvail would only cost a round trip before the same Bcopy (§9.2),
    /// and while one is outstanding the Data Sink may not advertise its
    /// buffers (§11.3 rule 2a), so Write Zcopy could never begin.
    fn skip_src_avail(&self, at: u64) -> bool {
        self.zsend_mode() == FlowControlMode::Pipelined
            && self.z.sinks.is_empty()
            && self
                .zsend_at(at)
                .is_some_and(|z| z.start < self.z.skip_src_until && z.sink_wait.is_none())
    }

    /// Where Bcopy must stop: the §11.2/§11.3 rule that no payload goes
    /// while a SrcAvail is outstanding (but the rest of a SendSm'd buffer,
    /// §9.5.2.1), no payload while an RDMA Write waits for its
    /// RdmaWrCompl, and the start of the next Zcopy buffer.
    pub(crate) fn bcopy_limit(&self) -> u64 {
        let sent = self.tx.sent();
        if let Some(f) = self.z.forced_to {
            if f > sent {
                return f;
            }
        }
        if !self.z.srcs.is_empty() || self.z.writing.is_some() || self.z.pending_src.is_some() {
            return sent;
        }
        if self.control_pending_wr_compl() {
            return sent;
        }
        if self.zsend_mode() == FlowControlMode::Buffered || self.z.zsends.is_empty() {
            return u64::MAX;
        }
        if self.zcopy_from(sent) && !self.skip_src_avail(sent) {
            return sent;
        }
        self.z
            .zsends
            .iter()
            .filter(|z| z.zcopy && z.start > sent)
            .map(|z| z.start)
            .min()
            .unwrap_or(u64::MAX)
    }

    fn mode_change_queued(&self) -> bool {
        self.control
            .iter()
            .any(|c| matches!(c, Control::ModeChange { .. }))
    }

    fn control_pending_wr_compl(&self) -> bool {
        self.control
            .iter()
            .any(|c| matches!(c, Control::RdmaWrCompl { .. }))
    }

    /// Source side progress before a message is chosen: RDMA Writes into
    /// SinkAvails, registrations for the next SrcAvail, ModeChanges.
    pub(crate) fn source_progress(&mut self) {
        self.mode_progress();
        let sent = self.tx.sent();
        if self.z.forced_to.is_some_and(|f| sent >= f) {
            self.z.forced_to = None;
        }
        if self.z.zsends.is_empty() {
            // No ULP buffer lent (Bcopy traffic): nothing to write into a
            // SinkAvail or to advertise (both need `zcopy_from`).
            return;
        }
        // A queued ModeChange goes first: no RDMA Write may precede a
        // ModeChange to Combined in the stream (§12.4), and no new
        // SrcAvail is readied for a Mode about to end (§12.1).
        if self.z.forced_to.is_some() || self.z.writing.is_some() || self.mode_change_queued() {
            return;
        }
        // §11.3 rule 1a: with a SinkAvail in hand, Write Zcopy.
        if self.zsend_mode() == FlowControlMode::Pipelined
            && self.z.srcs.is_empty()
            && self.z.pending_src.is_none()
            && self.zcopy_from(sent)
            && !self.control_pending_wr_compl()
        {
            // §9.5.1 step 4, at the moment of use: every payload message
            // sent since may have made it stale.
            self.discard_stale_sinks();
            if let Some(sink) = self.z.sinks.pop_front() {
                let end = self.zsend_at(sent).map_or(sent, |z| z.end);
                let n = end.saturating_sub(sent).min(u64::from(sink.len));
                if sent + n == end {
                    // Its wait is over: no timer may end the streak for it.
                    if let Some(z) = self.z.zsends.iter_mut().find(|z| z.end == end) {
                        z.sink_wait = None;
                    }
                }
                let wr = self.next_wr();
                self.sends.push_back(super::SendRecord {
                    wr_id: wr,
                    stream_end: sent + n,
                    what: Sent::Write,
                });
                self.rdma_out.push_back(RdmaOp::Write {
                    wr_id: WrId(wr),
                    stag: sink.stag,
                    to: sink.va,
                    payload: sent..sent + n,
                });
                self.tx.advance(n);
                self.attribute_rdma(sent, n);
                self.z.stats.write_zcopy_sent += n;
                self.z.sink_streak = true;
                self.z.writing = Some(Writing {
                    stag: sink.stag,
                    len: n as u32,
                });
                return;
            }
        }
        // The next SrcAvail: register its buffer.
        let mode = self.zsend_mode();
        if mode == FlowControlMode::Buffered
            || self.z.pending_src.is_some()
            || self.z.src_cancel.is_some()
            || self.z.mode_change.is_some()
            || self.control_pending_wr_compl()
        {
            return;
        }
        let from = match self.z.srcs.back() {
            None => sent,
            Some(s) => s.start + s.len,
        };
        let limit = match mode {
            FlowControlMode::Combined => 1,
            _ => usize::from(self.peer.map_or(1, |p| p.max_adverts)),
        };
        // §11.3: "The Data Sink MUST limit the maximum number of
        // outstanding SrcAvail and SinkAvail advertisements to the HH or
        // HAH MaxAdverts value specified by the Remote Peer".
        if self.z.srcs.len() >= limit || !self.zcopy_from(from) {
            return;
        }
        // §9.4: this buffer waits for the SinkAvail the Data Sink's next
        // posted buffer brings (Config::sink_avail_wait).
        if (mode == FlowControlMode::Pipelined
            && self.zsend_at(from).is_some_and(|z| z.sink_wait.is_some()))
            || self.skip_src_avail(from)
        {
            return;
        }
        let end = self.zsend_at(from).map_or(from, |z| z.end);
        let len = end.saturating_sub(from).min(MAX_ADVERT);
        let mem = self.z.mem();
        self.z.pending_src = Some(PendingSrc {
            start: from,
            len,
            mem,
            reg: None,
        });
        self.rdma_out.push_back(RdmaOp::Register {
            mem,
            memory: Memory::Stream(from..from + len),
            access: Access::RemoteRead,
        });
    }

    /// The SrcAvail whose buffer is registered, if credit allows it now.
    pub(crate) fn next_src_avail(&mut self, credit: i64, control_ok: bool) -> Option<Work> {
        let p = self.z.pending_src.as_ref()?;
        let (stag, to) = p.reg?;
        let mode = self.zsend_mode();
        // §9.5.4: "The Data Source, after sending a SrcAvailCancel
        // Message, MUST NOT send any new SrcAvail Messages until the
        // SrcAvailCancel Message has been Processed" — not even one whose
        // buffer was registered before. (While our ModeChange to Combined
        // waits for its acknowledgement, §12.4, SrcAvails may go: they
        // reach the Data Sink after the ModeChange, when it holds no
        // SinkAvail that could make it ignore them — waiting would stall
        // a connection whose peer has nothing to send.)
        if mode == FlowControlMode::Buffered || self.z.src_cancel.is_some() {
            return None;
        }
        // §11.2: one SrcAvail at a time in Combined Mode, its payload the
        // next bytes of the stream.
        if mode == FlowControlMode::Combined
            && (!self.z.srcs.is_empty() || p.start != self.tx.sent() || self.z.forced_to.is_some())
        {
            return None;
        }
        let payload = if mode == FlowControlMode::Combined {
            // §9.2 step 1: "In Combined Mode the SrcAvail Message payload
            // MUST contain at least one byte of ULP payload."
            if credit < super::PAYLOAD_MIN_CREDIT {
                return None;
            }
            let room = self
                .max_payload()
                .saturating_sub(SrcAvailRepr::HEADER_LEN as u64);
            SRC_AVAIL_PAYLOAD.min(room).min(p.len - 1).max(1)
        } else {
            // "in Pipelined Mode the SrcAvail Message MUST NOT contain ULP
            // payload".
            if !control_ok {
                return None;
            }
            0
        };
        let p = self.z.pending_src.take()?;
        let header = SrcAvailRepr {
            // §6.3.2: "MUST describe the entire Data Source RDMA Buffer".
            len: p.len as u32,
            stag,
            va: to,
        };
        let range = p.start..p.start + payload;
        let n = self.z.id();
        self.z.srcs.push_back(SrcOut {
            n,
            start: p.start,
            len: p.len,
            payload,
            done: 0,
            mem: p.mem,
            stag,
        });
        self.z.stats.src_avails += 1;
        Some(Work::Op(self.emit_payload(
            Body::SrcAvail {
                header,
                payload: &[],
            },
            range,
        )))
    }

    /// Emits a SrcAvail or SinkAvail carrying the send stream bytes
    /// `range` (none if empty).
    pub(crate) fn emit_payload(
        &mut self,
        body: Body<'_>,
        range: core::ops::Range<u64>,
    ) -> super::Op {
        let (mseq, bufs, mseq_ack) = self.credits.on_send();
        let n = range.end.saturating_sub(range.start);
        let repr = super::MessageRepr {
            bufs,
            flags: Flags::EMPTY,
            mseq,
            mseq_ack,
            body,
        };
        let mut buf = [0u8; super::MAX_HEADER_LEN];
        let hlen = repr.header_len().min(super::MAX_HEADER_LEN);
        repr.emit_header(&mut buf[..hlen]);
        // Len covers the payload gathered from the stream.
        let total = u32::try_from(hlen as u64 + n).unwrap_or(u32::MAX);
        buf[4..8].copy_from_slice(&total.to_be_bytes());
        let header = super::SendHeader::from_array(buf, hlen);
        if n > 0 {
            let chunk = super::Chunk {
                range: range.clone(),
                flags: Flags::EMPTY,
            };
            self.tx.on_chunk_sent(&chunk);
            self.on_payload_sent(n);
        }
        let mid = body.mid();
        self.post_send(mid, Flags::EMPTY, header, range, Sent::Other)
    }

    /// §9.5.1 step 3: "The Data Source, upon sending an SDP Message
    /// carrying ULP payload, MUST increment PotentialNonDiscards by one."
    pub(crate) fn on_payload_sent(&mut self, n: u64) {
        self.z.pnd = self.z.pnd.wrapping_add(1);
        self.z.stats.bcopy_sent += n;
    }

    /// Counts `n` RDMA bytes from stream offset `at` to their ZSend.
    fn attribute_rdma(&mut self, at: u64, n: u64) {
        if let Some(z) = self
            .z
            .zsends
            .iter_mut()
            .find(|z| z.start <= at && at < z.end)
        {
            z.rdma += n;
        }
    }

    /// Releases bytes no Send covers once no work request is in flight,
    /// and reports finished ULP send buffers.
    pub(crate) fn source_settle(&mut self) {
        if self.sends.is_empty() {
            let sent = self.tx.sent();
            self.tx.release(sent);
        }
        let released = self.tx.released();
        while let Some(z) = self.z.zsends.front() {
            let advertised = self.z.srcs.iter().any(|s| s.start < z.end)
                || self.z.pending_src.as_ref().is_some_and(|p| p.start < z.end);
            if z.end > released || advertised {
                break;
            }
            let Some(z) = self.z.zsends.pop_front() else {
                break;
            };
            self.z.completions.push_back(Completion::Sent {
                id: z.id,
                len: z.end.saturating_sub(z.start),
                zcopy: z.rdma,
            });
        }
    }

    /// Drops every outstanding SrcAvail (a SinkAvail overrode them, §11.3
    /// rule 1b, or a cancel finished).
    fn drop_srcs(&mut self) {
        while let Some(s) = self.z.srcs.pop_front() {
            self.rdma_out.push_back(RdmaOp::Deregister { mem: s.mem });
        }
        if let Some(p) = self.z.pending_src.take() {
            self.rdma_out.push_back(RdmaOp::Deregister { mem: p.mem });
        }
        // §9.5.4: the cancel is Processed once no SrcAvail is outstanding.
        self.z.src_cancel = None;
    }

    /// SendSm (§9.5.2.1, §9.5.4).
    pub(crate) fn on_send_sm(&mut self, mseq_ack: u32) {
        let Some(front) = self.z.srcs.front().cloned() else {
            return self.violation(Violation::UnexpectedMessage(Mid::SEND_SM));
        };
        if let Some(Some(cancel)) = self.z.src_cancel {
            // §9.5.4: the cancel is Processed by "A SendSm Message ... with
            // an MSeqAck value greater than or equal to the MSeq value in
            // the SrcAvailCancel Message": what was not transferred is not
            // in the stream.
            if seq_ge(mseq_ack, cancel) {
                let point = front.start + front.payload + front.done;
                self.drop_srcs();
                self.retract(point);
                return;
            }
        }
        // §9.2: "the Data Source MUST match the SendSm Message with the
        // oldest, incomplete SrcAvail advertisement ... and MUST send the
        // remaining ULP data using Data Messages".
        self.z.srcs.pop_front();
        self.rdma_out
            .push_back(RdmaOp::Deregister { mem: front.mem });
        self.z.forced_to = Some(front.start + front.len);
        if self.z.srcs.is_empty() {
            self.z.src_cancel = None;
        }
        self.z.send_sms_in_row = self.z.send_sms_in_row.saturating_add(1);
        if self.z.send_sms_in_row >= SEND_SMS_TO_SKIP {
            self.z.skip_src_until = (front.start + front.len).saturating_add(SKIP_SRC_AVAIL);
        }
        // Figure 30: "Receive SendSm — Advisory".
        let after = self.config.buffered_after_send_sm;
        match self.zsend_mode() {
            FlowControlMode::Combined if after > 0 && self.z.send_sms_in_row >= after => {
                self.want_send_mode(FlowControlMode::Buffered);
            }
            FlowControlMode::Pipelined
                if self.config.pipelining == super::Pipelining::OnRequest =>
            {
                self.want_send_mode(FlowControlMode::Combined);
            }
            _ => {}
        }
    }

    /// Takes the stream back from `point` and finishes the ULP buffers
    /// there (§9.5.4).
    fn retract(&mut self, point: u64) {
        self.tx.retract(point);
        for z in &mut self.z.zsends {
            z.start = z.start.min(point);
            z.end = z.end.min(point);
        }
        // Until the application learned where its stream now ends, nothing
        // more may enter it.
        self.z.cut = self.z.zsends.back().map(|z| z.id);
        self.z.forced_to = self.z.forced_to.map(|f| f.min(point));
    }

    /// RdmaRdCompl (§9.2 step 3, §6.3.7).
    pub(crate) fn on_rdma_rd_compl(&mut self, len: u32, flags: Flags, invalidated: Option<u32>) {
        let Some(front) = self.z.srcs.front().cloned() else {
            return self.violation(Violation::UnexpectedMessage(Mid::RDMA_RD_COMPL));
        };
        // §9.2: after a SendSm the Data Sink "MUST wait until it has
        // received all of the data ... before sending any RdmaRdCompl".
        if self.z.forced_to.is_some_and(|f| f > self.tx.sent()) {
            return self.violation(Violation::UnexpectedMessage(Mid::RDMA_RD_COMPL));
        }
        let left = front.len - front.payload - front.done;
        // §6.3.7.1: Len counts the RDMA Read bytes of "the oldest
        // outstanding SrcAvail".
        if u64::from(len) > left {
            return self.violation(Violation::ZcopyLength(Mid::RDMA_RD_COMPL));
        }
        // §9.2: "the Data Source MUST verify that the invalidated STag was
        // the same STag that was sent in the original SrcAvail Message".
        if let Some(stag) = invalidated {
            if stag != front.stag {
                return self.violation(Violation::WrongStag {
                    mid: Mid::RDMA_RD_COMPL,
                    got: stag,
                });
            }
        }
        let at = self.tx.sent();
        self.tx.advance(u64::from(len));
        self.attribute_rdma(at, u64::from(len));
        self.z.stats.read_zcopy_sent += u64::from(len);
        self.z.send_sms_in_row = 0;
        self.z.skip_src_until = 0;
        if let Some(s) = self.z.srcs.front_mut() {
            s.done += u64::from(len);
        }
        if u64::from(len) == left {
            self.z.srcs.pop_front();
            // "If the Data Sink did not use the remote invalidate feature,
            // the Data Source should locally invalidate the advertised
            // STag." (The adapter deregisters either way.)
            self.rdma_out
                .push_back(RdmaOp::Deregister { mem: front.mem });
            if self.z.srcs.is_empty() {
                self.z.src_cancel = None;
            }
        }
        self.req_pipe_hint(flags);
    }

    /// §6.1.2: REQ_PIPE in an RdmaRdCompl or RdmaWrCompl is the Mode
    /// Slave's hint for our send half.
    fn req_pipe_hint(&mut self, flags: Flags) {
        if self.config.pipelining != super::Pipelining::OnRequest {
            return;
        }
        let pipe = flags.contains(Flags::REQ_PIPE);
        match self.zsend_mode() {
            FlowControlMode::Combined if pipe => self.want_send_mode(FlowControlMode::Pipelined),
            FlowControlMode::Pipelined if !pipe => self.want_send_mode(FlowControlMode::Combined),
            _ => {}
        }
    }

    fn want_send_mode(&mut self, mode: FlowControlMode) {
        if self.z.mode_change.is_none()
            && self.z.mode_ack.is_none()
            && !self.mode_change_queued()
            && self.zsend_mode() != mode
        {
            self.z.mode_change = Some((false, mode));
        }
    }

    /// SinkAvail (§9.3, §9.4, §9.5.1, §11.3, §12.4).
    pub(crate) fn on_sink_avail(&mut self, header: SinkAvailRepr, payload: bool) -> bool {
        let mode = self.zsend_mode();
        if mode != FlowControlMode::Pipelined {
            if self.z.mode_ack.is_none() {
                let v = if mode == FlowControlMode::Buffered {
                    Violation::BufferedMode(Mid::SINK_AVAIL)
                } else {
                    Violation::CombinedMode(Mid::SINK_AVAIL)
                };
                self.violation(v);
                return false;
            }
            // Figure 28: a SinkAvail before the ModeChange is acknowledged
            // is ignored; one that is not stale means the Data Sink
            // discarded our SrcAvails (§11.3 rule 2b): re-issue them.
            // Stale is judged as of the ModeChange: a payload message sent
            // after it reaches the Data Sink once it dropped its SinkAvails
            // (Figure 29), so it counts in NonDiscards and discards nothing.
            // Only SrcAvails sent before the ModeChange can have been
            // ignored.
            if header.non_discards != self.z.pnd_at_mode_change {
                self.z.pnd = self.z.pnd.wrapping_sub(1);
                self.z.pnd_at_mode_change = self.z.pnd_at_mode_change.wrapping_sub(1);
            } else if self
                .z
                .srcs
                .front()
                .zip(self.z.last_src_before_mode_change)
                .is_some_and(|(s, last)| s.n <= last)
            {
                self.drop_srcs();
            }
            return true;
        }
        if self.disconn_sent() {
            // It crossed our DisConn, which ends our send half: the Data
            // Sink counts it as canceled on receiving the DisConn (§8.2.1).
            return true;
        }
        // §9.5.1 step 4 before the count: a SinkAvail that a Data Message
        // of ours made stale is one the Data Sink no longer has out (that
        // message completed its buffer), so it may have advertised
        // another in its place (§11.3).
        self.discard_stale_sinks();
        if self.z.sinks.len() >= usize::from(self.config.max_adverts) {
            self.violation(Violation::TooManyAdverts(Mid::SINK_AVAIL));
            return false;
        }
        self.z.sinks.push_back(SinkIn {
            len: header.len,
            stag: header.stag,
            va: header.va,
            non_discards: header.non_discards,
        });
        // Stale or not, it says the Data Sink has caught up and posts its
        // receive buffers: our next Zcopy buffer waits for the next one.
        self.z.sink_streak = true;
        // §11.3: "The Data Source MUST give precedence to discarding stale
        // SinkAvail advertisements"; §9.5.1 step 4, in the order the
        // SinkAvails came: a later one is judged only after every earlier
        // one was (each discard takes one from PotentialNonDiscards; judged
        // out of order, a SinkAvail the Data Sink already completed with a
        // Data Message would pass for fresh and be written into).
        self.discard_stale_sinks();
        if !self.z.sinks.is_empty() {
            // §11.3 rule 1b: "the Data Source MUST treat all outstanding
            // SrcAvail advertisements as having been discarded by the Data
            // Sink".
            self.drop_srcs();
        }
        let _ = payload;
        true
    }

    /// §9.5.1 step 4 for the oldest SinkAvails: discards those a payload
    /// message we sent since made stale, up to the first fresh one.
    fn discard_stale_sinks(&mut self) {
        while let Some(s) = self.z.sinks.front() {
            if s.non_discards == self.z.pnd {
                return;
            }
            self.z.sinks.pop_front();
            self.z.pnd = self.z.pnd.wrapping_sub(1);
        }
    }

    /// SinkAvailCancel (§9.5.5).
    pub(crate) fn on_sink_avail_cancel(&mut self) {
        if self.disconn_sent() {
            // It crossed our DisConn, which canceled every SinkAvail at
            // the Data Sink already (§8.2.1): no SinkCancelAck, which
            // would answer a cancel the Data Sink no longer has out.
            self.z.sinks.clear();
            return;
        }
        let mut canceled = 0;
        while let Some(s) = self.z.sinks.pop_front() {
            if s.non_discards != self.z.pnd {
                self.z.pnd = self.z.pnd.wrapping_sub(1);
            } else {
                canceled += 1;
            }
        }
        // "If the Data Source canceled one or more SinkAvail advertisements
        // ... the Data Source MUST send exactly one SinkCancelAck Message";
        // "If all SinkAvail advertisements have been Processed, the Data
        // Source MUST ignore the SinkAvailCancel Message."
        if canceled > 0 {
            if self.z.writing.is_some() {
                // The RDMA Write In-Process cannot be canceled; its
                // RdmaWrCompl completes the oldest SinkAvail and must reach
                // the Data Sink before the SinkCancelAck that discards the
                // rest (§9.5.5 steps 1–3).
                self.z.cancel_ack_after_write = true;
            } else {
                self.control.push_back(Control::SinkCancelAck);
            }
        }
    }

    /// An RDMA Write completed: its RdmaWrCompl goes (§9.3 step 2).
    pub(crate) fn on_write_done(&mut self) {
        if let Some(w) = self.z.writing.take() {
            self.control.push_back(Control::RdmaWrCompl {
                len: w.len,
                stag: w.stag,
            });
        }
        if core::mem::take(&mut self.z.cancel_ack_after_write) {
            self.control.push_back(Control::SinkCancelAck);
        }
    }

    // ----- Data Sink ---------------------------------------------------

    /// §9.5.1 step 1 for a message carrying `len` payload bytes: it
    /// completes the oldest advertised buffer, or counts in NonDiscards.
    pub(crate) fn on_payload_received(&mut self, len: usize) {
        self.z.stats.bcopy_received += len as u64;
        if let Some(i) = self.z.posted.iter().position(|p| p.advertised) {
            if let Some(p) = self.z.posted.remove(i) {
                self.release_posted(&p);
                self.z.completions.push_back(Completion::Received {
                    id: p.id,
                    placed: 0,
                    copy: u32::try_from(len).unwrap_or(u32::MAX),
                });
            }
            self.sink_cancel_check();
        } else {
            // §6.3.3.4: "The Data Sink MUST increment its local value for
            // NonDiscards when an SDP Message that is carrying ULP payload
            // is received and the SDP Message did not cause the Data Sink
            // to discard a previously sent SinkAvail Message."
            self.z.nd = self.z.nd.wrapping_add(1);
        }
    }

    /// Our SinkAvailCancel is Processed once no SinkAvail is outstanding.
    fn sink_cancel_check(&mut self) {
        if !self.z.posted.iter().any(|p| p.advertised) {
            self.z.sink_cancel = false;
        }
    }

    /// Whether ULP payload may arrive now (§11.2, §11.3, §9.2).
    pub(crate) fn zcopy_payload_ok(
        &self,
        mid: Mid,
        mseq_ack: u32,
        len: usize,
    ) -> Result<(), Violation> {
        if let Some((until, send_sm)) = self.z.forced_until {
            // The rest of a SendSm'd buffer, once the Data Source saw the
            // SendSm, and no further.
            // (An MSeqAck held for our SrcAvailCancel, §9.5.4, may stay
            // below the SendSm although the peer saw it.)
            let end = self.rx.total().saturating_add(len as u64);
            let seen = seq_ge(mseq_ack, send_sm) || self.credits.peer_holds_at(mseq_ack);
            if seen && end <= until {
                return Ok(());
            }
            return Err(self.mode_violation(mid));
        }
        if !self.z.srcs_in.is_empty() {
            return Err(self.mode_violation(mid));
        }
        Ok(())
    }

    fn mode_violation(&self, mid: Mid) -> Violation {
        match self.zrecv_mode() {
            FlowControlMode::Pipelined => Violation::PipelinedMode(mid),
            _ => Violation::CombinedMode(mid),
        }
    }

    /// SrcAvail (§9.2, §11.2, §11.3).
    pub(crate) fn on_src_avail_z(&mut self, header: SrcAvailRepr, payload: usize) -> bool {
        let mode = self.zrecv_mode();
        match mode {
            FlowControlMode::Buffered => {
                self.violation(Violation::BufferedMode(Mid::SRC_AVAIL));
                return false;
            }
            // §11.2: "only a single SrcAvail Message may be In-Process at
            // any one time"; "the SrcAvail Message MUST contain greater
            // than zero bytes of ULP payload".
            FlowControlMode::Combined if payload == 0 || !self.z.srcs_in.is_empty() => {
                self.violation(Violation::CombinedMode(Mid::SRC_AVAIL));
                return false;
            }
            // §11.3: "the Data Source MUST NOT include ULP payload in any
            // SrcAvail Messages".
            FlowControlMode::Pipelined if payload > 0 => {
                self.violation(Violation::PipelinedMode(Mid::SRC_AVAIL));
                return false;
            }
            _ => {}
        }
        if self.z.srcs_in.len() >= usize::from(self.config.max_adverts) {
            self.violation(Violation::TooManyAdverts(Mid::SRC_AVAIL));
            return false;
        }
        // §6.3.7.1: the payload is part of the advertised buffer.
        if payload as u64 >= u64::from(header.len) {
            self.violation(Violation::Malformed(wire::Error::LengthMismatch));
            return false;
        }
        // §11.3 rule 2b: with a SinkAvail outstanding, "MUST ignore the
        // current SrcAvail advertisement (but otherwise process the packet
        // normally)".
        if self.z.posted.iter().any(|p| p.advertised) {
            return true;
        }
        self.z.srcs_in.push_back(SrcIn {
            stag: header.stag,
            va: header.va,
            len: u64::from(header.len),
            payload: payload as u64,
            done: 0,
            reading: None,
        });
        true
    }

    /// Sink side progress: SendSm when Read Zcopy will not happen, RDMA
    /// Reads into posted buffers, SinkAvails for posted buffers.
    pub(crate) fn sink_progress(&mut self) {
        if self.state != super::State::Connected {
            return;
        }
        if let Some((until, _)) = self.z.forced_until {
            if self.rx.total() < until {
                return;
            }
            self.z.forced_until = None;
        }
        if let Some(cancel) = self.z.cancel_in {
            if self.z.srcs_in.iter().any(|s| s.reading.is_some()) {
                return;
            }
            // §9.5.4 step 3 and "the Data Sink MUST send exactly one SendSm
            // Message associated with the oldest incomplete SrcAvail".
            let canceled = !self.z.srcs_in.is_empty();
            self.z.srcs_in.clear();
            self.z.cancel_in = None;
            if canceled {
                self.queue_send_sm(Some(cancel));
            } else {
                self.credits.hold_ack(None);
            }
            return;
        }
        if self
            .z
            .srcs_in
            .front()
            .is_some_and(|s| s.reading.is_none() && s.done > 0 && s.done + s.payload >= s.len)
        {
            self.z.srcs_in.pop_front();
        }
        let Some(front) = self.z.srcs_in.front().cloned() else {
            return self.advertise_sinks();
        };
        if front.reading.is_some() || self.control_has_send_sm() {
            return;
        }
        let posted = self
            .z
            .posted
            .iter()
            .position(|p| !p.advertised && !p.reading);
        // §9.2 step 2a, the end of §9.2 (both Data Sources waiting on
        // each other with no receive posted: force Bcopy), and no Read
        // Zcopy wanted at all.
        let own_src = !self.z.srcs.is_empty() || self.z.pending_src.is_some();
        if !self.config.read_zcopy || (posted.is_none() && own_src) {
            return self.queue_send_sm(None);
        }
        let Some(i) = posted else {
            return;
        };
        // Placed bytes follow every byte before them: read only once the
        // SrcAvail's payload was read.
        if self.rx.read_pos() != self.rx.total() {
            return;
        }
        let Some(p) = self.z.posted.get(i).cloned() else {
            return;
        };
        let (stag, _) = match p.reg {
            Reg::None => {
                let mem = self.z.mem();
                if let Some(q) = self.z.posted.get_mut(i) {
                    q.reg = Reg::Pending(mem);
                    q.remote = false;
                }
                self.rdma_out.push_back(RdmaOp::Register {
                    mem,
                    memory: Memory::Recv {
                        id: p.id,
                        len: p.len,
                    },
                    access: Access::Local,
                });
                return;
            }
            Reg::Pending(_) => return,
            Reg::Done { stag, to, .. } => (stag, to),
        };
        let _ = stag;
        let off = front.payload + front.done;
        let n = (front.len - off).min(u64::from(p.len)) as u32;
        let wr = self.next_wr();
        self.sends.push_back(super::SendRecord {
            wr_id: wr,
            stream_end: self.tx.sent(),
            what: Sent::Read,
        });
        self.rdma_out.push_back(RdmaOp::Read {
            wr_id: WrId(wr),
            stag: front.stag,
            to: front.va.wrapping_add(off),
            len: n,
            into: p.id,
            offset: 0,
        });
        if let Some(q) = self.z.posted.get_mut(i) {
            q.reading = true;
        }
        if let Some(s) = self.z.srcs_in.front_mut() {
            s.reading = Some(n);
        }
    }

    fn control_has_send_sm(&self) -> bool {
        self.control
            .iter()
            .any(|c| matches!(c, Control::SendSm { .. }))
    }

    fn queue_send_sm(&mut self, cancel: Option<u32>) {
        self.control.push_back(Control::SendSm { cancel });
    }

    /// Our SendSm goes out as MSeq `mseq`.
    pub(crate) fn on_send_sm_sent(&mut self, mseq: u32, cancel: Option<u32>) {
        self.z.stats.send_sms += 1;
        if cancel.is_some() {
            // §9.5.4: the cancel is complete; MSeqAck may advance.
            self.credits.hold_ack(None);
            return;
        }
        if let Some(s) = self.z.srcs_in.pop_front() {
            // §9.2: the remaining bytes come by Bcopy.
            let rest = s.len - s.payload - s.done;
            self.z.forced_until = Some((self.rx.total().saturating_add(rest), mseq));
        }
    }

    /// An RDMA Read completed (§9.2 step 2b).
    pub(crate) fn on_read_done(&mut self) {
        let Some(n) = self.z.srcs_in.front().and_then(|s| s.reading) else {
            return;
        };
        let Some(i) = self.z.posted.iter().position(|p| p.reading) else {
            return;
        };
        let Some(p) = self.z.posted.remove(i) else {
            return;
        };
        self.release_posted(&p);
        let at = self.rx.total();
        self.rx.push_placed(u64::from(n));
        self.z.placed.push_back((
            at,
            Completion::Received {
                id: p.id,
                placed: n,
                copy: 0,
            },
        ));
        self.z.stats.read_zcopy_received += u64::from(n);
        let Some(s) = self.z.srcs_in.front_mut() else {
            return;
        };
        s.reading = None;
        s.done += u64::from(n);
        let last = s.payload + s.done >= s.len;
        let stag = s.stag;
        if last {
            self.z.srcs_in.pop_front();
        }
        // §9.2: "The Data Sink SHOULD send the final RdmaRdCompl Message
        // ... with the Send with SE and Invalidate iWARP Message".
        self.control.push_back(Control::RdmaRdCompl {
            len: n,
            invalidate: last.then_some(stag),
        });
        if self.z.cancel_in.is_some() {
            // §9.5.4: no Read is In-Process any more; what follows (this
            // RdmaRdCompl, then the SendSm canceling the rest) completes
            // the canceled SrcAvails, so MSeqAck may advance. Held longer,
            // it would leave the peer without credit (its credit counts
            // from our MSeqAck) while we may need its credit update to
            // send the SendSm.
            self.credits.hold_ack(None);
        }
    }

    /// SrcAvailCancel (§9.5.4).
    pub(crate) fn on_src_avail_cancel(&mut self, mseq: u32) {
        // "If all SrcAvail Messages have been Processed, then the Data Sink
        // MUST ignore the SrcAvailCancel Message."
        if self.z.srcs_in.is_empty() {
            return;
        }
        // A SendSm not yet sent becomes the one answering the cancel.
        self.control
            .retain(|c| !matches!(c, Control::SendSm { cancel: None }));
        self.z.cancel_in = Some(mseq);
        if self.z.srcs_in.iter().any(|s| s.reading.is_some()) {
            self.credits.hold_ack(Some(mseq));
        }
    }

    /// RdmaWrCompl (§9.3 step 3).
    pub(crate) fn on_rdma_wr_compl(&mut self, len: u32, flags: Flags, invalidated: Option<u32>) {
        // "the Data Sink MUST match the RdmaWrCompl Message to the oldest
        // incomplete SinkAvail advertisement".
        let Some(i) = self.z.posted.iter().position(|p| p.advertised) else {
            return self.violation(Violation::UnexpectedMessage(Mid::RDMA_WR_COMPL));
        };
        let Some(p) = self.z.posted.get(i).cloned() else {
            return;
        };
        if len > p.len {
            return self.violation(Violation::ZcopyLength(Mid::RDMA_WR_COMPL));
        }
        if let (Some(got), Reg::Done { stag, .. }) = (invalidated, p.reg) {
            if got != stag {
                return self.violation(Violation::WrongStag {
                    mid: Mid::RDMA_WR_COMPL,
                    got,
                });
            }
        }
        self.z.posted.remove(i);
        self.release_posted(&p);
        let at = self.rx.total();
        self.rx.push_placed(u64::from(len));
        let c = Completion::Received {
            id: p.id,
            placed: len,
            copy: 0,
        };
        if len == 0 {
            self.z.completions.push_back(c);
        } else {
            self.z.placed.push_back((at, c));
        }
        self.z.stats.write_zcopy_received += u64::from(len);
        self.sink_cancel_check();
        self.req_pipe_hint(flags);
    }

    /// SinkCancelAck (§9.5.5).
    pub(crate) fn on_sink_cancel_ack(&mut self) {
        if !self.z.sink_cancel {
            // The Data Source's ModeChange to Combined discarded our
            // SinkAvails (Figure 29) after it had canceled them: its
            // SinkCancelAck follows the ModeChange.
            if core::mem::take(&mut self.z.sink_cancel_crossed) {
                return;
            }
            return self.violation(Violation::UnexpectedMessage(Mid::SINK_CANCEL_ACK));
        }
        self.drop_advertised();
        self.z.sink_cancel = false;
    }

    /// Returns every advertised buffer unused.
    fn drop_advertised(&mut self) {
        let mut i = 0;
        while i < self.z.posted.len() {
            if self.z.posted.get(i).is_some_and(|p| p.advertised) {
                if let Some(p) = self.z.posted.remove(i) {
                    self.release_posted(&p);
                    self.z.completions.push_back(Completion::Received {
                        id: p.id,
                        placed: 0,
                        copy: 0,
                    });
                }
            } else {
                i += 1;
            }
        }
    }

    /// The peer's DisConn (§8.2.1 Remote Peer step 1): "MUST consider all
    /// its outstanding SinkAvail advertisements as canceled, complete all
    /// ULP receive buffers" — no SinkAvailCancel, whose SinkCancelAck a
    /// peer that closed its socket would never send. If ours was already
    /// out, its SinkCancelAck may still come and is ignored.
    pub(crate) fn on_peer_disconn(&mut self) {
        if core::mem::take(&mut self.z.sink_cancel) {
            self.z.sink_cancel_crossed = true;
        }
        self.control
            .retain(|c| !matches!(c, Control::SinkAvailCancel));
        self.complete_posted();
    }

    /// Returns every posted buffer that no RDMA Read is filling, unused.
    pub(crate) fn complete_posted(&mut self) {
        let mut i = 0;
        while i < self.z.posted.len() {
            if self.z.posted.get(i).is_some_and(|p| !p.reading) {
                if let Some(p) = self.z.posted.remove(i) {
                    self.release_posted(&p);
                    self.z.completions.push_back(Completion::Received {
                        id: p.id,
                        placed: 0,
                        copy: 0,
                    });
                }
            } else {
                i += 1;
            }
        }
    }

    /// Whether a SinkAvail may go now: the peer's send half open,
    /// Pipelined Mode, no SinkAvailCancel
    /// of ours unprocessed (§9.5.5), no SrcAvail to process (§11.3 rule
    /// 2a), none being canceled, no Bcopy owed after our SendSm (§9.2),
    /// and every received byte read (placed bytes keep stream order).
    fn sink_avail_allowed(&self) -> bool {
        // §8.2.1: after the peer's DisConn, new receive buffers complete at
        // once; nothing more will be written into them.
        self.config.write_zcopy
            && self.peer_disconn.is_none()
            && self.zrecv_mode() == FlowControlMode::Pipelined
            && !self.z.sink_cancel
            && self.z.srcs_in.is_empty()
            && self.z.cancel_in.is_none()
            && self.z.forced_until.is_none()
            && self.rx.read_pos() == self.rx.total()
    }

    /// SinkAvails for posted buffers (§9.3 step 1, §9.5.1, §11.3).
    pub(crate) fn advertise_sinks(&mut self) {
        if !self.sink_avail_allowed() {
            return;
        }
        let out = self.z.posted.iter().filter(|p| p.advertised).count();
        if out >= usize::from(self.peer.map_or(1, |p| p.max_adverts)) {
            return;
        }
        let size = u64::from(self.config.buf_size);
        // Buffers are used in posting order: only the first one not
        // advertised.
        let Some(i) = self.z.posted.iter().position(|p| !p.advertised) else {
            return;
        };
        let Some(p) = self.z.posted.get(i).cloned() else {
            return;
        };
        // §9.5.1: "The Data Sink MUST only send a SinkAvail advertisement if
        // the RDMA Buffer is larger than the local receive Private Buffer
        // size"; §9.3: never for MSG_WAITALL.
        if u64::from(p.len) <= size || p.waitall || p.reading {
            return;
        }
        if p.reg != Reg::None && !p.remote {
            // Registered for local access only: the SinkAvail needs an STag
            // the peer may write through.
            self.release_posted(&p);
            if let Some(q) = self.z.posted.get_mut(i) {
                q.reg = Reg::None;
            }
        }
        if self.z.posted.get(i).is_some_and(|q| q.reg == Reg::None) {
            let mem = self.z.mem();
            if let Some(q) = self.z.posted.get_mut(i) {
                q.reg = Reg::Pending(mem);
                q.remote = true;
            }
            self.rdma_out.push_back(RdmaOp::Register {
                mem,
                memory: Memory::Recv {
                    id: p.id,
                    len: p.len,
                },
                access: Access::RemoteWrite,
            });
        }
    }

    /// The SinkAvail of a registered posted buffer, with Transaction
    /// payload when Bcopy bytes wait (§9.4).
    pub(crate) fn next_sink_avail(&mut self, credit: i64, control_ok: bool) -> Option<Work> {
        if !control_ok || !self.sink_avail_allowed() {
            return None;
        }
        let i = self.z.posted.iter().position(|p| !p.advertised)?;
        let p = self.z.posted.get(i)?;
        let Reg::Done { stag, to, .. } = p.reg else {
            return None;
        };
        if p.reading
            || !p.remote
            || u64::from(p.len) <= u64::from(self.config.buf_size)
            || p.waitall
        {
            return None;
        }
        let len = p.len;
        if let Some(q) = self.z.posted.get_mut(i) {
            q.advertised = true;
        }
        let header = SinkAvailRepr {
            len,
            stag,
            va: to,
            non_discards: self.z.nd,
        };
        // §9.4: the Data Message for the other direction rides along.
        let room = self
            .max_payload()
            .saturating_sub(SinkAvailRepr::HEADER_LEN as u64);
        let limit = self.bcopy_limit();
        let range = match self.tx.next_chunk_until(room, limit) {
            Some(c) if credit >= super::PAYLOAD_MIN_CREDIT && c.flags.is_empty() => c.range,
            _ => {
                let at = self.tx.sent();
                at..at
            }
        };
        self.z.stats.sink_avails += 1;
        Some(Work::Op(self.emit_payload(
            Body::SinkAvail {
                header,
                payload: &[],
            },
            range,
        )))
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

    // ----- Modes ---------------------------------------------------------

    /// Queues the ModeChange the policy or the application asked for, once
    /// §12 allows it.
    fn mode_progress(&mut self) {
        if self.state != super::State::Connected {
            return;
        }
        if self.config.pipelining == super::Pipelining::Always
            && self.zsend_mode() == FlowControlMode::Combined
            && self.z.mode_ack.is_none()
        {
            self.want_send_mode(FlowControlMode::Pipelined);
        }
        let Some((send, mode)) = self.z.mode_change else {
            return;
        };
        if self.mode_change_queued() {
            return;
        }
        if !send {
            match (self.zsend_mode(), mode) {
                // §12.1: "The Data Source MUST NOT send the ModeChange
                // Message until all Unprocessed or In-Process Read Zcopy
                // transfers have been moved to the Processed state".
                (FlowControlMode::Combined, FlowControlMode::Buffered)
                    if !self.z.srcs.is_empty() || self.z.pending_src.is_some() =>
                {
                    return;
                }
                // §12.4: "the Data Source MUST complete any RDMA Writes that
                // are In-Process, and issue all RdmaWrCompl Messages before
                // sending a ModeChange Message".
                (FlowControlMode::Pipelined, FlowControlMode::Combined)
                    if self.z.writing.is_some() || self.control_pending_wr_compl() =>
                {
                    return;
                }
                _ => {}
            }
        }
        self.z.mode_change = None;
        self.control.push_back(Control::ModeChange { send, mode });
    }

    /// Our ModeChange goes out as MSeq `mseq`: "The Mode Master MUST change
    /// its Flow Control Mode immediately after sending a ModeChange
    /// Message" (§12).
    pub(crate) fn on_mode_change_sent(&mut self, mseq: u32, send: bool, mode: FlowControlMode) {
        self.z.stats.mode_changes += 1;
        if send {
            self.z.recv_mode = Some(mode);
            return;
        }
        let from = self.zsend_mode();
        self.z.send_mode = Some(mode);
        if from == FlowControlMode::Pipelined && mode == FlowControlMode::Combined {
            // §12.4, Figure 28: discard incomplete SinkAvails (and with
            // them the SrcAvails they overrode), then ignore SinkAvails
            // until the ModeChange is acknowledged.
            let mut valid = false;
            while let Some(s) = self.z.sinks.pop_front() {
                if s.non_discards != self.z.pnd {
                    self.z.pnd = self.z.pnd.wrapping_sub(1);
                } else {
                    valid = true;
                }
            }
            if valid {
                self.drop_srcs();
            }
            self.z.mode_ack = Some(mseq);
            self.z.pnd_at_mode_change = self.z.pnd;
            self.z.last_src_before_mode_change = self.z.srcs.back().map(|s| s.n);
        }
        if mode != FlowControlMode::Combined {
            self.z.send_sms_in_row = 0;
        }
    }

    /// The MSeqAck of every received message (§12.4).
    pub(crate) fn on_mseq_ack(&mut self, mseq_ack: u32) {
        if let Some(m) = self.z.mode_ack {
            // "MSeqAck >= (MSeq of the ModeChange Message)", signed.
            if (mseq_ack.wrapping_sub(m) as i32) >= 0 {
                self.z.mode_ack = None;
            }
        }
    }

    /// ModeChange received (§6.3.8, §12, Figures 30–31).
    pub(crate) fn on_mode_change(&mut self, mch: ModeChangeRepr) {
        use FlowControlMode::*;
        let to = match mch.mode {
            Mode::BUFF_MODE => Buffered,
            Mode::COMB_MODE => Combined,
            _ => Pipelined,
        };
        let from = if mch.send {
            self.zsend_mode()
        } else {
            self.zrecv_mode()
        };
        // Figure 26 and Figure 27: the Data Sink is master only in Buffered
        // Mode (S=1, to Combined); the Data Source otherwise (S=0).
        let ok = match (mch.send, from, to) {
            (true, Buffered, Combined) => true,
            (false, Combined, Buffered) => self.z.srcs_in.is_empty(),
            (false, Combined, Pipelined) | (false, Pipelined, Combined) => true,
            _ => false,
        };
        if !ok {
            return self.violation(Violation::BadModeChange {
                send: mch.send,
                from,
                to: mch.mode.0,
            });
        }
        if mch.send {
            self.z.send_mode = Some(to);
            return;
        }
        self.z.recv_mode = Some(to);
        if from == Pipelined {
            // Figure 29: "Stop sending SinkAvail Messages", "Discard all
            // outstanding SinkAvails".
            self.drop_advertised();
            self.z.sink_cancel_crossed = core::mem::take(&mut self.z.sink_cancel);
            for p in &mut self.z.posted {
                if let Reg::Done { mem, .. } | Reg::Pending(mem) = p.reg {
                    self.rdma_out.push_back(RdmaOp::Deregister { mem });
                    p.reg = Reg::None;
                }
            }
        }
    }

    /// The Data Sink's REQ_PIPE preference for our RdmaRdCompl and
    /// RdmaWrCompl (§6.1.2).
    pub(crate) fn req_pipe_flag(&self) -> Flags {
        if self.config.req_pipe && self.zrecv_mode() != FlowControlMode::Buffered {
            Flags::REQ_PIPE
        } else {
            Flags::EMPTY
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

    /// The ModeChange body.
    pub(crate) fn mode_change_body(send: bool, mode: FlowControlMode) -> Body<'static> {
        Body::ModeChange(ModeChangeRepr {
            send,
            mode: wire_mode(mode),
        })
    }

    /// Called by `recv` finding nothing to read: a SrcAvail waiting for a
    /// posted buffer that is not there is answered with SendSm (§9.2 step
    /// 2a: the application's buffer is "unsuitable for Read Zcopy").
    pub(crate) fn recv_would_block(&mut self) {
        if self.src_avail_unanswered() {
            self.queue_send_sm(None);
        }
    }

    /// A peer's SrcAvail waits for a reader: no buffer is posted for it,
    /// and no RDMA Read, SendSm or cancel is under way. Its bytes are data
    /// the application can read, so the stream polls readable — a reader
    /// woken by it that brings no buffer answers with SendSm
    /// ([`Conn::recv_would_block`]) and gets the bytes by Bcopy.
    pub(crate) fn src_avail_unanswered(&self) -> bool {
        self.z.posted.is_empty()
            && self.z.srcs_in.front().is_some_and(|s| s.reading.is_none())
            && self.z.cancel_in.is_none()
            && self.z.forced_until.is_none()
            && !self.control_has_send_sm()
    }

    /// Whether send-side Zcopy work blocks plain `send` (§11.2: no Bcopy
    /// while a Read Zcopy is In-Process is handled by ordering; this only
    /// keeps a canceled buffer the last thing in the stream).
    pub(crate) fn zsend_pending(&self) -> bool {
        !self.z.zsends.is_empty() || self.z.cut.is_some()
    }
}
