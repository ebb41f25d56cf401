//! The queue pair: one RDMAP stream's send queue, receive queue,
//! completion queue, registration table, and its state (RFC 5040 §5, §6,
//! §7).
//!
//! This file holds the Data Source side (posting, message scheduling, the
//! ordering and completion rules of RFC 5040 §5.5, IRD/ORD of §6.1) and the
//! error machinery (Terminate, QP to Error). The Data Sink side (validation
//! and placement of incoming segments) is in the `sink` module.
//!
//! # States
//!
//! The words are those of the RDMAC verbs that RFC 5040 was written with:
//! [`State::Idle`] (not yet in the Full Operation Phase: MPA startup),
//! [`State::Rts`] (ready to send and receive), [`State::Terminate`] (we
//! found an error; our Terminate message is queued but not all written)
//! and [`State::Error`] (Terminate sent or received, or the LLP failed).
//! Error is final: "Once failed, a connection stays failed".

use std::cell::RefCell;
use std::collections::VecDeque;

use crate::mem::{Access, Memory, MrAttrs, Pd, RegError, RegionId, Registry, Span};
use crate::wire::ddp::{self, Stag, INITIAL_MSN};
use crate::wire::fpdu;
use crate::wire::rdmap::{Opcode, ReadRequestRepr};
use crate::wire::terminate::TermCode;

use super::placement::Placement;
use super::rebase::{self, Rebase};
use super::rx::Deframer;
use super::terminate::{self, Echo};
use super::tx::{Framer, MsgKind, OutMsg, Source};
use super::txq::{Mark, MissingRegion, TxChunk, TxQueue};
use super::wr::{
    Completion, Event, Payload, PostError, ReadWr, RecvWr, SendKind, SendWr, Sge, Status,
    TerminateInfo, WcOpcode, WriteWr,
};

/// The STag a zero-length tagged RTR carries: any non-zero value (the
/// receiver never checks it, RFC 5041 §5.2).
pub const RTR_STAG: Stag = Stag(0x0000_0100);

/// The state of the stream (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Not yet in the Full Operation Phase.
    Idle,
    /// Ready to send: the Full Operation Phase.
    Rts,
    /// We found an error; our Terminate is queued, not yet all written.
    Terminate,
    /// Terminate sent or received, or the LLP failed. Final.
    Error,
}

/// Which zero-length message is the Ready-To-Receive indication (RFC 6581
/// §9.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RtrKind {
    /// Zero-length Send (FULPDU).
    Send,
    /// Zero-length RDMA Write.
    Write,
    /// Zero-length RDMA Read.
    Read,
}

/// This side's part in the RTR exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RtrRole {
    /// No RTR (client-server model, or MPA Rev 1).
    #[default]
    None,
    /// Initiator: send this RTR as the first FPDU.
    Send(RtrKind),
    /// Responder: the initiator sends this RTR first; a zero-length Send
    /// RTR is absorbed without consuming a receive buffer.
    Expect(RtrKind),
}

/// What the Full Operation Phase runs with: the negotiated MPA framing and
/// RDMA Read limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Params {
    /// CRC32c on the FPDUs (RFC 5044 §4.4), both directions.
    pub crc: bool,
    /// Insert markers in what we send (the peer set M).
    pub tx_markers: bool,
    /// Expect markers in what we receive (we set M).
    pub rx_markers: bool,
    /// Local IRD: RDMA Read Requests we serve at once (RFC 5040 §6.1).
    pub ird: u16,
    /// Local ORD: RDMA Read Requests we have outstanding at once.
    pub ord: u16,
    /// Effective MSS of the LLP, from which MULPDU is computed (RFC 5044
    /// §4.5, §5.1).
    pub emss: usize,
    /// The RTR exchange.
    pub rtr: RtrRole,
    /// Responder: send no FPDU before one was received and validated
    /// (RFC 5044 §7.1.2 rule 4).
    pub gated: bool,
}

impl Default for Params {
    fn default() -> Params {
        Params {
            crc: true,
            tx_markers: false,
            rx_markers: false,
            ird: 16,
            ord: 16,
            emss: 1460,
            rtr: RtrRole::None,
            gated: false,
        }
    }
}

/// Where a Read Response we send comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadJob {
    /// The request, as received.
    pub rr: ReadRequestRepr,
    /// The validated source (none for a zero-length Read).
    pub span: Option<Span>,
}

/// A Read Request we sent and await the response of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReadOut {
    /// The send-queue entry, or none for the RTR.
    pub seq: Option<u64>,
    pub sink_stag: Stag,
    pub sink_to: u64,
    pub size: u32,
}

#[derive(Debug)]
enum Work {
    Send {
        kind: SendKind,
        payload: Payload,
    },
    Write {
        stag: Stag,
        to: u64,
        payload: Payload,
    },
    Read(ReadWr),
}

#[derive(Debug)]
struct SqEntry {
    wr_id: u64,
    opcode: WcOpcode,
    signaled: bool,
    len: u32,
    work: Option<Work>,
    started: bool,
    status: Option<Status>,
}

/// What the message being segmented is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Current {
    Sq(u64),
    Response(ReadJob),
    Rtr,
}

/// Where the driver puts the next octets it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecvTarget {
    /// Read at most `max` octets into a scratch buffer and pass them to
    /// `handle_input` (it copies what is payload).
    Scratch {
        /// Reading more is correct, only slower: payload would be copied.
        max: usize,
    },
    /// Receive up to `len` octets straight into `region` at `offset`, then
    /// call `placed` with the number received.
    Place {
        /// The region of [`Memory`].
        region: RegionId,
        /// Offset in the region.
        offset: usize,
        /// Octets that belong there.
        len: usize,
    },
}

/// The RDMAP/DDP/MPA data path of one stream: a queue pair.
#[derive(Debug)]
pub struct DataPath {
    pub(super) pd: Pd,
    pub(super) state: State,
    pub(super) reg: Registry,
    pub(super) txq: TxQueue,
    framer: Framer,
    emss: usize,
    mulpdu: usize,
    pub(super) ird: u16,
    ord: u16,
    /// RFC 5044 §7.1.2 rule 4, until an FPDU has been received.
    pub(super) gated: bool,
    rtr_send: Option<RtrKind>,
    pub(super) rtr_expect: Option<RtrKind>,

    sq: VecDeque<SqEntry>,
    /// Sequence number of `sq[0]`.
    sq_base: u64,
    /// Sequence number of the next entry to start.
    sq_next: u64,
    cur: Option<(OutMsg, Current)>,
    tx_msn: [u32; 3],
    /// Read Requests sent, awaiting their responses, in order.
    pub(super) reads_out: VecDeque<ReadOut>,
    /// Read Requests received, to be answered in order (RFC 5040 §5.2.2).
    pub(super) reads_in: VecDeque<ReadJob>,
    /// Read Requests received and not yet fully answered: the IRD count.
    pub(super) ird_inflight: usize,
    prefer_responses: bool,

    /// The receive side: deframing and placement (the `sink` module).
    pub(super) rx: Placement,

    pub(super) cq: VecDeque<Completion>,
    pub(super) events: VecDeque<Event>,
    error: Option<(TermCode, bool)>,
}

/// Most gather lists a thread keeps for reuse ([`DataPath::sge_list`]),
/// and the longest it keeps.
const SPARE_SGE_LISTS: usize = 8;
const SPARE_SGE_LEN: usize = 16;

thread_local! {
    /// Gather lists of messages this thread wrote, any connection's: kept
    /// by the thread, not by the connection, so that an idle connection
    /// holds none.
    static SPARE_SGES: RefCell<Vec<Vec<Sge>>> = const { RefCell::new(Vec::new()) };
}

impl DataPath {
    /// A queue pair in [`State::Idle`] in protection domain `pd`, whose
    /// STag keys come from `stag_seed`. Work and receive buffers may be
    /// posted and memory registered before [`DataPath::enable`].
    pub fn new(pd: Pd, stag_seed: u64) -> DataPath {
        DataPath {
            pd,
            state: State::Idle,
            reg: Registry::new(stag_seed),
            txq: TxQueue::new(),
            framer: Framer {
                pos: 0,
                markers: false,
                crc: true,
            },
            emss: 0,
            mulpdu: fpdu::MIN_MULPDU,
            ird: 0,
            ord: 0,
            gated: false,
            rtr_send: None,
            rtr_expect: None,
            sq: VecDeque::new(),
            sq_base: 0,
            sq_next: 0,
            cur: None,
            tx_msn: [INITIAL_MSN; 3],
            reads_out: VecDeque::new(),
            reads_in: VecDeque::new(),
            ird_inflight: 0,
            prefer_responses: true,
            rx: Placement::new(),
            cq: VecDeque::new(),
            events: VecDeque::new(),
            error: None,
        }
    }

    /// An empty gather list for a work request's [`Payload::Sges`]: one of
    /// a message this thread wrote before if there is one, so that a
    /// stream of messages allocates none.
    pub fn sge_list(&self) -> Vec<Sge> {
        SPARE_SGES
            .try_with(|s| s.borrow_mut().pop())
            .ok()
            .flatten()
            .unwrap_or_else(|| Vec::with_capacity(4))
    }

    /// Keeps the gather list of a message written (see
    /// [`DataPath::sge_list`]).
    fn recycle(&self, msg: OutMsg) {
        if let Source::Payload(Payload::Sges(mut sges)) = msg.source {
            if sges.capacity() > SPARE_SGE_LEN {
                // A long list (a lent writev's) is not the common case.
                return;
            }
            sges.clear();
            let _ = SPARE_SGES.try_with(|s| {
                let mut s = s.borrow_mut();
                if s.len() < SPARE_SGE_LISTS {
                    s.push(sges);
                }
            });
        }
    }

    /// Enters the Full Operation Phase with the negotiated `params`. The
    /// stream positions of both directions start at 0 here (RFC 5044
    /// §4.3). Does nothing unless [`State::Idle`].
    pub fn enable(&mut self, params: Params) {
        if self.state != State::Idle {
            return;
        }
        self.framer = Framer {
            pos: 0,
            markers: params.tx_markers,
            crc: params.crc,
        };
        self.rx.deframer = Deframer::new(params.rx_markers, params.crc);
        self.ird = params.ird;
        self.ord = params.ord;
        self.gated = params.gated;
        match params.rtr {
            RtrRole::None => {}
            RtrRole::Send(kind) => self.rtr_send = Some(kind),
            RtrRole::Expect(kind) => self.rtr_expect = Some(kind),
        }
        self.state = State::Rts;
        self.set_emss(params.emss);
    }

    /// Changes the EMSS (RFC 5044 §4.5: "If the TCP implementation needs to
    /// adjust EMSS ... the MULPDU value is changed accordingly"); applies
    /// from the next segment.
    pub fn set_emss(&mut self, emss: usize) {
        self.emss = emss;
        self.mulpdu = fpdu::mulpdu(emss, self.framer.markers);
    }

    /// The current MULPDU: the largest ULPDU (DDP segment) we send.
    pub fn mulpdu(&self) -> usize {
        self.mulpdu
    }

    /// The state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Whether the stream still waits for its first FPDU before it may send
    /// (RFC 5044 §7.1.2 rule 4: "MPA Responder mode implementations MUST
    /// receive and validate at least one FPDU before sending any FPDUs or
    /// Markers"). At the responder this turns false when the initiator's
    /// RTR (or, without one, its first FPDU) has been received.
    pub fn awaiting_first_fpdu(&self) -> bool {
        self.gated
    }

    /// The error the stream failed with, and whether the peer reported it.
    pub fn error(&self) -> Option<(TermCode, bool)> {
        self.error
    }

    /// The protection domain.
    pub fn pd(&self) -> Pd {
        self.pd
    }

    /// The registration table.
    pub fn registry(&self) -> &Registry {
        &self.reg
    }

    /// Local IRD and ORD in force.
    pub fn ird_ord(&self) -> (u16, u16) {
        (self.ird, self.ord)
    }

    // ---- memory -------------------------------------------------------

    /// Registers `len` bytes of `region` from `offset` in this stream's
    /// protection domain (see [`Registry::register`]).
    pub fn register(
        &mut self,
        region: RegionId,
        offset: usize,
        len: u64,
        access: Access,
    ) -> Result<Stag, RegError> {
        self.reg
            .register(region, offset, len, MrAttrs::new(self.pd, access))
    }

    /// Registers with full attributes (another PD, a base TO, a scope).
    pub fn register_with(
        &mut self,
        region: RegionId,
        offset: usize,
        len: u64,
        attrs: MrAttrs,
    ) -> Result<Stag, RegError> {
        self.reg.register(region, offset, len, attrs)
    }

    /// Local invalidation (RFC 5040 §8.1.1 items 4–6): from now on the
    /// peer cannot place into or read through `stag`. A segment being
    /// placed into it right now stops placing.
    pub fn invalidate(&mut self, stag: Stag) -> Result<(), RegError> {
        self.reg.invalidate(stag)?;
        self.retarget_invalidated(stag);
        Ok(())
    }

    /// Removes a registration (its STag becomes invalid for good).
    pub fn deregister(&mut self, stag: Stag) -> Result<(), RegError> {
        self.reg.deregister(stag)?;
        self.retarget_invalidated(stag);
        Ok(())
    }

    // ---- posting ------------------------------------------------------

    fn accepting(&self) -> Result<(), PostError> {
        match self.state {
            State::Idle | State::Rts => Ok(()),
            State::Terminate | State::Error => Err(PostError::NotAccepting),
        }
    }

    fn push_work(&mut self, wr_id: u64, opcode: WcOpcode, signaled: bool, len: u32, work: Work) {
        self.sq.push_back(SqEntry {
            wr_id,
            opcode,
            signaled,
            len,
            work: Some(work),
            started: false,
            status: None,
        });
    }

    /// Posts a Send of any of the four kinds (RFC 5040 §5.3).
    pub fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        self.accepting()?;
        let len = u32::try_from(wr.payload.len()).map_err(|_| PostError::TooLong)?;
        let work = Work::Send {
            kind: wr.kind,
            payload: wr.payload,
        };
        self.push_work(wr.wr_id, WcOpcode::Send, wr.signaled, len, work);
        Ok(())
    }

    /// Posts an RDMA Write (RFC 5040 §5.1).
    pub fn post_write(&mut self, wr: WriteWr) -> Result<(), PostError> {
        self.accepting()?;
        let len = u32::try_from(wr.payload.len()).map_err(|_| PostError::TooLong)?;
        ddp::to_end(wr.remote_to, u64::from(len)).ok_or(PostError::ToWrap)?;
        let work = Work::Write {
            stag: wr.remote_stag,
            to: wr.remote_to,
            payload: wr.payload,
        };
        self.push_work(wr.wr_id, WcOpcode::Write, wr.signaled, len, work);
        Ok(())
    }

    /// Posts an RDMA Read (RFC 5040 §5.2). It waits in the send queue
    /// while ORD Reads are outstanding (RFC 5040 §6.1: "the RDMAP layer
    /// MUST NOT exceed the maximum number of outstanding, outbound RDMA
    /// Read Requests").
    pub fn post_read(&mut self, wr: ReadWr) -> Result<(), PostError> {
        self.accepting()?;
        if self.state == State::Rts && self.ord == 0 {
            return Err(PostError::NoOrd);
        }
        ddp::to_end(wr.remote_to, u64::from(wr.len)).ok_or(PostError::ToWrap)?;
        if wr.len > 0 {
            self.reg
                .check_tagged(
                    wr.local_stag,
                    wr.local_to,
                    u64::from(wr.len),
                    self.pd,
                    Access::LOCAL_WRITE,
                )
                .map_err(|_| PostError::LocalProtection)?;
        }
        self.push_work(
            wr.wr_id,
            WcOpcode::Read,
            wr.signaled,
            wr.len,
            Work::Read(wr),
        );
        Ok(())
    }

    /// Posts a receive buffer for one incoming Send (RFC 5041 §5.1.2).
    pub fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        self.accepting()?;
        self.rx.rq.push_back(wr);
        Ok(())
    }

    /// Receive buffers posted and not yet consumed.
    pub fn recv_posted(&self) -> usize {
        self.rx.rq.len() + usize::from(self.rx.send.is_some())
    }

    /// The receive buffers that hold octets of a message not yet
    /// delivered: the buffer of the Send being received, the Receive
    /// Queue's head while a segment is being received (a message's first
    /// segment lands there before it is verified), and the buffers of
    /// overlays not yet delivered. Every other posted buffer is written
    /// only once its receive comes first, from its start.
    pub fn recv_regions_busy(&self) -> impl Iterator<Item = RegionId> + '_ {
        let overlays = self.rx.overlay.iter().chain(&self.rx.overlays_done);
        let head = self
            .rx
            .rq
            .front()
            .filter(|_| !self.rx.deframer.at_boundary());
        self.rx
            .send
            .map(|p| p.wr.sge.region)
            .into_iter()
            .chain(head.map(|wr| wr.sge.region))
            .chain(overlays.map(|o| o.from.region))
    }

    /// Work requests posted and not yet completed.
    pub fn send_outstanding(&self) -> usize {
        self.sq.len()
    }

    // ---- completions and events ---------------------------------------

    /// Work completions waiting for [`DataPath::poll_completion`].
    pub fn completions(&self) -> usize {
        self.cq.len()
    }

    /// The next work completion, in the order RFC 5040 §5.5 rule 15 sets
    /// for the send queue ("RDMA Operations MUST be Completed at the Local
    /// Peer in the order that they were submitted").
    pub fn poll_completion(&mut self) -> Option<Completion> {
        self.cq.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        let e = self.events.pop_front();
        // Events are rare (establishment, the end): an idle connection
        // keeps no queue for them.
        if e.is_none() && self.events.capacity() > 0 {
            self.events = VecDeque::new();
        }
        e
    }

    fn set_status(&mut self, seq: u64, status: Status) {
        let Some(i) = seq.checked_sub(self.sq_base) else {
            return;
        };
        if let Some(e) = self.sq.get_mut(i as usize) {
            if e.status.is_none() {
                e.status = Some(status);
            }
        }
        self.drain_sq();
    }

    pub(super) fn complete_read(&mut self, seq: u64) {
        self.set_status(seq, Status::Success);
    }

    fn drain_sq(&mut self) {
        while let Some(status) = self.sq.front().and_then(|e| e.status) {
            if let Some(e) = self.sq.pop_front() {
                self.sq_base += 1;
                if e.signaled || status != Status::Success {
                    self.cq.push_back(Completion {
                        wr_id: e.wr_id,
                        opcode: e.opcode,
                        status,
                        byte_len: e.len,
                        invalidated: None,
                        solicited: false,
                    });
                }
            }
        }
    }

    // ---- transmit -----------------------------------------------------

    /// Segments and frames pending work until at least `budget` octets
    /// are queued (or there is nothing to send); returns the octets queued.
    /// Payload in `mem` is referenced, not copied; the CRC runs over it now,
    /// so it must not change until written.
    pub fn poll_transmit(&mut self, mem: &dyn Memory, budget: usize) -> usize {
        while self.txq.len() < budget && self.state == State::Rts && !self.gated {
            if self.cur.is_none() && !self.start_next() {
                break;
            }
            let Some((mut msg, what)) = self.cur.take() else {
                break;
            };
            if let Current::Response(job) = what {
                if let Err(code) = self.recheck_source(&job, msg.sent) {
                    let rr = advanced_rr(&job.rr, msg.sent);
                    let echo = Echo {
                        read_request: true,
                        rr: Some(rr),
                        ..Echo::NONE
                    };
                    self.raise(code, &echo);
                    break;
                }
            }
            match msg.write_segment(&mut self.framer, &mut self.txq, mem, self.mulpdu) {
                Ok(true) => self.recycle(msg),
                Ok(false) => self.cur = Some((msg, what)),
                Err(MissingRegion(_)) => {
                    if let Current::Response(job) = &what {
                        // RFC 5040 §7.1 case 3: an error on an incoming
                        // Read Request after DDP delivered it. Its Data
                        // Source passed every check, but the memory behind
                        // it is no longer there: nothing the peer did, and
                        // nothing beyond this stream is affected — "
                        // Catastrophic error, localized to RDMAP Stream"
                        // (§4.8 Figure 9), headers by Figure 10.
                        let rr = advanced_rr(&job.rr, msg.sent);
                        let echo = Echo {
                            read_request: true,
                            rr: Some(rr),
                            ..Echo::NONE
                        };
                        self.raise(TermCode::RDMAP_CATASTROPHIC_STREAM, &echo);
                        break;
                    }
                    // RFC 5040 §7.1 case 1: an error "detected while
                    // creating" a message: "the Terminate Message and Error
                    // code are sent instead of the request", headers zero.
                    if let Current::Sq(seq) = what {
                        self.set_status(
                            seq,
                            Status::Error {
                                code: TermCode::RDMAP_LOCAL_CATASTROPHIC,
                                remote: false,
                            },
                        );
                    }
                    self.raise(TermCode::RDMAP_LOCAL_CATASTROPHIC, &Echo::NONE);
                    break;
                }
            }
        }
        self.txq.len()
    }

    /// Checks before each Read Response segment that the source STag is
    /// still valid (RFC 5040 §8.1.1 item 6).
    fn recheck_source(&self, job: &ReadJob, sent: u64) -> Result<(), TermCode> {
        let size = u64::from(job.rr.size);
        if size == 0 || sent >= size {
            return Ok(());
        }
        self.reg
            .check_tagged(
                job.rr.src_stag,
                job.rr.src_to + sent,
                size - sent,
                self.pd,
                Access::REMOTE_READ,
            )
            .map(|_| ())
            .map_err(|e| e.rdmap_code())
    }

    /// Picks the next message: the RTR first, then Read Responses and the
    /// send queue in turn, one message at a time.
    fn start_next(&mut self) -> bool {
        if let Some(kind) = self.rtr_send.take() {
            let msg = self.rtr_message(kind);
            self.cur = Some((msg, Current::Rtr));
            return true;
        }
        let responses_first = self.prefer_responses;
        self.prefer_responses = !self.prefer_responses;
        if responses_first && self.start_response() {
            return true;
        }
        self.start_sq() || self.start_response()
    }

    fn rtr_message(&mut self, kind: RtrKind) -> OutMsg {
        let none = || Source::Payload(Payload::empty());
        match kind {
            RtrKind::Send => {
                let msn = self.next_tx_msn(0);
                OutMsg::new(
                    MsgKind::Send {
                        opcode: Opcode::SEND,
                        msn,
                        inv: Stag(0),
                    },
                    none(),
                    0,
                    None,
                )
            }
            RtrKind::Write => OutMsg::new(
                MsgKind::Tagged {
                    opcode: Opcode::RDMA_WRITE,
                    stag: RTR_STAG,
                    to: 0,
                },
                none(),
                0,
                None,
            ),
            RtrKind::Read => {
                let msn = self.next_tx_msn(1);
                let rr = ReadRequestRepr {
                    sink_stag: RTR_STAG,
                    sink_to: 0,
                    size: 0,
                    src_stag: RTR_STAG,
                    src_to: 0,
                };
                self.reads_out.push_back(ReadOut {
                    seq: None,
                    sink_stag: RTR_STAG,
                    sink_to: 0,
                    size: 0,
                });
                OutMsg::new(MsgKind::ReadRequest { msn, rr }, none(), 0, None)
            }
        }
    }

    fn next_tx_msn(&mut self, qn: usize) -> u32 {
        let msn = self.tx_msn[qn];
        self.tx_msn[qn] = ddp::next_msn(msn);
        msn
    }

    fn start_response(&mut self) -> bool {
        let Some(job) = self.reads_in.pop_front() else {
            return false;
        };
        let source = match job.span {
            Some(Span { region, offset }) => Source::Region { region, offset },
            None => Source::Payload(Payload::empty()),
        };
        // RFC 5040 §5.2.2: the response goes to the Data Sink STag and TO
        // of the request.
        let msg = OutMsg::new(
            MsgKind::Tagged {
                opcode: Opcode::RDMA_READ_RESPONSE,
                stag: job.rr.sink_stag,
                to: job.rr.sink_to,
            },
            source,
            u64::from(job.rr.size),
            Some(Mark::ReadResponse),
        );
        self.cur = Some((msg, Current::Response(job)));
        true
    }

    fn start_sq(&mut self) -> bool {
        let seq = self.sq_next;
        let Some(i) = seq.checked_sub(self.sq_base) else {
            return false;
        };
        let Some(entry) = self.sq.get(i as usize) else {
            return false;
        };
        if entry.status.is_some() {
            // Completed without being sent (cannot happen in Rts); skip.
            self.sq_next += 1;
            return self.start_sq();
        }
        let is_read = matches!(entry.work, Some(Work::Read(_)));
        if is_read && self.ord == 0 {
            // Posted before the negotiation gave an ORD of 0: it can never
            // be sent. RFC 5040 §7.1 case 1, an error "detected while
            // creating" a Read Request: a Terminate goes instead.
            self.set_status(
                seq,
                Status::Error {
                    code: TermCode::RDMAP_LOCAL_CATASTROPHIC,
                    remote: false,
                },
            );
            self.raise(TermCode::RDMAP_LOCAL_CATASTROPHIC, &Echo::NONE);
            return false;
        }
        if is_read && self.reads_out.len() >= usize::from(self.ord) {
            // ORD reached: the queue waits (RFC 5040 §5.5 rule 13 keeps
            // later work behind it).
            return false;
        }
        let Some(work) = self.sq.get_mut(i as usize).and_then(|e| {
            e.started = true;
            e.work.take()
        }) else {
            return false;
        };
        self.sq_next += 1;
        let mark = Some(Mark::Message(seq));
        let msg = match work {
            Work::Send { kind, payload } => {
                let (opcode, inv) = match kind {
                    SendKind::Send => (Opcode::SEND, Stag(0)),
                    SendKind::SendSe => (Opcode::SEND_SE, Stag(0)),
                    SendKind::SendInvalidate(s) => (Opcode::SEND_INVALIDATE, s),
                    SendKind::SendSeInvalidate(s) => (Opcode::SEND_SE_INVALIDATE, s),
                };
                let len = payload.len();
                let msn = self.next_tx_msn(0);
                OutMsg::new(
                    MsgKind::Send { opcode, msn, inv },
                    Source::Payload(payload),
                    len,
                    mark,
                )
            }
            Work::Write { stag, to, payload } => {
                let len = payload.len();
                OutMsg::new(
                    MsgKind::Tagged {
                        opcode: Opcode::RDMA_WRITE,
                        stag,
                        to,
                    },
                    Source::Payload(payload),
                    len,
                    mark,
                )
            }
            Work::Read(wr) => {
                let msn = self.next_tx_msn(1);
                let rr = ReadRequestRepr {
                    sink_stag: wr.local_stag,
                    sink_to: wr.local_to,
                    size: wr.len,
                    src_stag: wr.remote_stag,
                    src_to: wr.remote_to,
                };
                self.reads_out.push_back(ReadOut {
                    seq: Some(seq),
                    sink_stag: wr.local_stag,
                    sink_to: wr.local_to,
                    size: wr.len,
                });
                // RFC 5040 §5.5 rule 19: completes when the response is
                // Delivered, not when sent: no mark.
                OutMsg::new(
                    MsgKind::ReadRequest { msn, rr },
                    Source::Payload(Payload::empty()),
                    0,
                    None,
                )
            }
        };
        self.cur = Some((msg, Current::Sq(seq)));
        true
    }

    /// Whether [`DataPath::poll_transmit`] would queue something now: a
    /// message under way, the RTR, a Read Response, or a send-queue entry
    /// that may start (a Read waits while ORD Reads are outstanding).
    /// False while the stream may not send (not in [`State::Rts`], or the
    /// RFC 5044 §7.1.2 rule 4 gate is closed): a driver polls for
    /// writability only when this or a non-empty [`DataPath::txq`] says so.
    pub fn has_pending_tx(&self) -> bool {
        if self.state != State::Rts || self.gated {
            return false;
        }
        if self.cur.is_some() || self.rtr_send.is_some() || !self.reads_in.is_empty() {
            return true;
        }
        let Some(i) = self.sq_next.checked_sub(self.sq_base) else {
            return false;
        };
        match self.sq.get(i as usize) {
            None => false,
            Some(e) => match e.work {
                // ORD 0 makes poll_transmit fail the Read (progress too).
                Some(Work::Read(_)) => {
                    self.ord == 0 || self.reads_out.len() < usize::from(self.ord)
                }
                _ => true,
            },
        }
    }

    /// Octets queued for the LLP.
    pub fn tx_len(&self) -> usize {
        self.txq.len()
    }

    /// The queued octets as a gather list (see [`TxQueue::chunks`]).
    pub fn tx_chunks(&self) -> impl Iterator<Item = TxChunk> + '_ {
        self.txq.chunks()
    }

    /// The queue itself, to resolve slices or fill an iovec.
    pub fn txq(&self) -> &TxQueue {
        &self.txq
    }

    /// Records that the LLP took the next `n` queued octets. Sends and RDMA
    /// Writes whose last octet is among them complete (RFC 5040 §5.5 rule
    /// 14, RFC 5041 §5.4).
    pub fn tx_advance(&mut self, n: usize) {
        self.txq.advance(n);
        while let Some(mark) = self.txq.pop_done_mark() {
            match mark {
                Mark::Message(seq) => self.set_status(seq, Status::Success),
                Mark::ReadResponse => self.ird_inflight = self.ird_inflight.saturating_sub(1),
                Mark::Terminate => {
                    if self.state == State::Terminate {
                        self.state = State::Error;
                    }
                }
            }
        }
    }

    /// The lowest offset of `region` that the engine still refers to: in
    /// queued octets not yet written, in the message being segmented, or in
    /// work not yet started. `None` once nothing refers to it — then the
    /// memory may go.
    pub fn region_low_water(&self, region: RegionId) -> Option<usize> {
        let queued = self.txq.region_low_water(region);
        let current = self
            .cur
            .as_ref()
            .and_then(|(m, _)| m.region_low_water(region));
        let waiting = self.sq.iter().filter_map(|e| match &e.work {
            Some(Work::Send { payload, .. } | Work::Write { payload, .. }) => {
                rebase::payload_low_water(payload, region)
            }
            _ => None,
        });
        queued.into_iter().chain(current).chain(waiting).min()
    }

    /// Moves every reference to `rb.from` — queued octets, the message
    /// being segmented, work not yet started — to `rb.to` (see
    /// [`super::rebase`]). The caller has copied the octets there.
    pub fn rebase_region(&mut self, rb: &Rebase<'_>) {
        self.txq.rebase_region(rb);
        if let Some((m, _)) = &mut self.cur {
            m.rebase(rb);
        }
        for e in &mut self.sq {
            if let Some(Work::Send { payload, .. } | Work::Write { payload, .. }) = &mut e.work {
                rebase::rebase_payload(payload, rb);
            }
        }
    }

    /// Queues raw octets ahead of any FPDU (the MPA Request or Reply).
    pub(crate) fn push_raw(&mut self, bytes: &[u8]) {
        self.txq.push_bytes(bytes);
    }

    // ---- errors -------------------------------------------------------

    /// We found an error: send a Terminate for it at once (RFC 5040 §7.1:
    /// "at the earliest possible opportunity"), fail outstanding work, and
    /// stop receiving. Does nothing unless in [`State::Rts`].
    pub(super) fn raise(&mut self, code: TermCode, echo: &Echo) {
        if self.state != State::Rts {
            return;
        }
        let (bytes, len, info) = terminate::build(code, echo);
        // RFC 5040 §5.4: QN 2, its own MSN. Written straight into the queue
        // at an FPDU boundary, ahead of any further segment, and ahead of
        // the RFC 5044 §7.1.2 rule 4 gate: it is the one FPDU a stream in
        // error still sends.
        let msn = self.next_tx_msn(2);
        let mut internal = [0u8; 64];
        internal[..len].copy_from_slice(&bytes[..len]);
        let mut msg = OutMsg::new(
            MsgKind::Terminate { msn },
            Source::Internal { bytes: internal },
            len as u64,
            Some(Mark::Terminate),
        );
        let no_mem = crate::mem::VecMemory::new();
        // Internal payload needs no memory and fits one FPDU.
        let _ = msg.write_segment(&mut self.framer, &mut self.txq, &no_mem, self.mulpdu);
        self.state = State::Terminate;
        self.fail_all(code, false);
        self.events.push_back(Event::TerminateSent(info));
        // The mark may already be passed if nothing was queued before.
        self.tx_advance(0);
    }

    /// The peer's Terminate arrived (RFC 5040 §5.4, §6.2.1).
    pub(super) fn terminated_by_peer(&mut self, info: TerminateInfo) {
        if matches!(self.state, State::Error) {
            return;
        }
        let code = info.code;
        self.state = State::Error;
        self.fail_all(code, true);
        self.events.push_back(Event::TerminateReceived(info));
    }

    /// The LLP closed or failed (RFC 5044 §8 code 1): no Terminate can be
    /// sent. Everything outstanding fails.
    pub fn handle_llp_closed(&mut self) {
        if self.state == State::Error {
            return;
        }
        let code = TermCode::MPA_CONNECTION_LOST;
        self.state = State::Error;
        self.fail_all(code, false);
        self.events.push_back(Event::Failed(code));
    }

    /// Fails the stream with `code` because of a local problem. In
    /// [`State::Rts`] a Terminate without headers is sent (RFC 5040 §7.1
    /// case 1; RFC 6581 §8 for the MPA codes 5, 6, 7); otherwise the
    /// stream just goes to [`State::Error`].
    pub fn fail(&mut self, code: TermCode) {
        match self.state {
            State::Rts => self.raise(code, &Echo::NONE),
            State::Idle => {
                self.state = State::Error;
                self.fail_all(code, false);
                self.events.push_back(Event::Failed(code));
            }
            State::Terminate | State::Error => {}
        }
    }

    /// The stream will never reach the Full Operation Phase (the MPA
    /// startup was rejected): everything posted is flushed, quietly.
    pub(crate) fn abandon(&mut self) {
        if self.state == State::Idle {
            self.state = State::Error;
            self.fail_all(TermCode::MPA_CONNECTION_LOST, false);
        }
    }

    /// Completes everything outstanding in error: work under way with
    /// `code`, work not started as flushed (RFC 5040 §5.4, §6.2.1; RFC 5041
    /// §6.2.2: "complete all outstanding ULP requests with an error").
    fn fail_all(&mut self, code: TermCode, remote: bool) {
        if self.error.is_none() {
            self.error = Some((code, remote));
        }
        self.rx.dropping = true;
        self.cur = None;
        self.rtr_send = None;
        self.reads_in.clear();
        self.reads_out.clear();
        let under_way = Status::Error { code, remote };
        for e in self.sq.iter_mut() {
            if e.status.is_none() {
                e.status = Some(if e.started {
                    under_way
                } else {
                    Status::Flushed
                });
            }
        }
        self.drain_sq();
        if let Some(p) = self.rx.send.take() {
            self.cq.push_back(Completion {
                wr_id: p.wr.wr_id,
                opcode: WcOpcode::Recv,
                status: under_way,
                byte_len: 0,
                invalidated: None,
                solicited: false,
            });
        }
        while let Some(wr) = self.rx.rq.pop_front() {
            self.cq.push_back(Completion {
                wr_id: wr.wr_id,
                opcode: WcOpcode::Recv,
                status: Status::Flushed,
                byte_len: 0,
                invalidated: None,
                solicited: false,
            });
        }
    }
}

/// The Read Request as updated after `sent` octets were answered (RFC 5040
/// §4.8: sink and source TO advanced, size reduced).
fn advanced_rr(rr: &ReadRequestRepr, sent: u64) -> ReadRequestRepr {
    ReadRequestRepr {
        sink_to: rr.sink_to.wrapping_add(sent),
        size: rr.size.saturating_sub(sent as u32),
        src_to: rr.src_to.wrapping_add(sent),
        ..*rr
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::Params;
    use crate::mem::VecMemory;

    /// A Send's gather list comes back from [`DataPath::sge_list`] once
    /// its message is written, emptied: a stream of Sends allocates none.
    #[test]
    fn a_written_message_gives_its_gather_list_back() {
        let mut dp = DataPath::new(Pd(1), 1);
        dp.enable(Params::default());
        let mut mem = VecMemory::new();
        let src = mem.add(vec![7; 100]);
        let mut sges = Vec::with_capacity(9);
        sges.push(Sge {
            region: src,
            offset: 0,
            len: 100,
        });
        dp.post_send(SendWr {
            wr_id: 1,
            kind: SendKind::Send,
            payload: Payload::Sges(sges),
            signaled: true,
        })
        .unwrap();
        assert_eq!(
            dp.sge_list().capacity(),
            4,
            "nothing written yet: a new list"
        );
        assert!(dp.poll_transmit(&mem, 1 << 20) > 100);
        let again = dp.sge_list();
        assert!(again.is_empty());
        assert_eq!(again.capacity(), 9, "the Send's own list");
    }
}
