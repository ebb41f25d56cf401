//! The Data Sink (our receive half): posted ULP receive buffers, RDMA
//! Reads of the peer's SrcAvails (§9.2), SinkAvails (§9.3, §9.4), the
//! payload rules while an advertisement is out (§11.2, §11.3), SendSm
//! (§9.5.2), NonDiscards (§9.5.1) and the cancels (§9.5.4, §9.5.5).

use super::{Completion, Reg, SrcIn};
use crate::conn::credit::PAYLOAD_MIN_CREDIT;
use crate::conn::{seq_ge, Conn, Control, FlowControlMode, SendRecord, Sent, State, Violation};
use crate::verbs::{Access, Memory, RdmaOp, Work, WrId};
use crate::wire::{self, Body, Flags, Mid, SinkAvailRepr, SrcAvailRepr};

impl Conn {
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
    pub(super) fn sink_cancel_check(&mut self) {
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

    /// No Zcopy advertisement in or out on the sink side: a read then
    /// leaves [`Conn::sink_progress`] nothing to do.
    pub(crate) fn sink_quiet(&self) -> bool {
        self.z.srcs_in.is_empty()
            && self.z.posted.is_empty()
            && self.z.cancel_in.is_none()
            && self.z.forced_until.is_none()
            && !self.z.sink_cancel
    }

    /// Sink side progress: SendSm when Read Zcopy will not happen, RDMA
    /// Reads into posted buffers, SinkAvails for posted buffers.
    pub(crate) fn sink_progress(&mut self) {
        if self.state != State::Connected {
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
        self.sends.push_back(SendRecord {
            wr_id: wr,
            stream_end: self.tx.sent(),
            what: Sent::Read,
            done: false,
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

    pub(super) fn control_has_send_sm(&self) -> bool {
        self.control
            .iter()
            .any(|c| matches!(c, Control::SendSm { .. }))
    }

    pub(super) fn queue_send_sm(&mut self, cancel: Option<u32>) {
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
    pub(super) fn drop_advertised(&mut self) {
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
    pub(super) fn sink_avail_allowed(&self) -> bool {
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
            self.offer_ring_now();
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
            Some(c) if credit >= PAYLOAD_MIN_CREDIT && c.flags.is_empty() => c.range,
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
}
