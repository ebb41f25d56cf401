//! The Data Source (our send half): Read Zcopy by SrcAvail (draft §9.2),
//! Write Zcopy into the peer's SinkAvails (§9.3), where Bcopy must stop
//! (§11.2, §11.3), SendSm (§9.5.2), stale SinkAvails (§9.5.1) and our
//! SrcAvailCancel (§9.5.4).

use super::{
    Completion, PendingSrc, SinkIn, SrcOut, Writing, ZSend, MAX_ADVERT, SEND_SMS_TO_SKIP,
    SKIP_SRC_AVAIL, SRC_AVAIL_PAYLOAD,
};
use crate::conn::credit::PAYLOAD_MIN_CREDIT;
use crate::conn::send::Chunk;
use crate::conn::{
    seq_ge, Conn, Control, FlowControlMode, Pipelining, SendRecord, Sent, Violation,
};
use crate::verbs::{Access, Memory, Op, RdmaOp, SendHeader, Work, WrId, MAX_HEADER_LEN};
use crate::wire::{Body, Flags, MessageRepr, Mid, SinkAvailRepr, SrcAvailRepr};

impl Conn {
    /// The ZSend holding stream offset `at`.
    pub(super) fn zsend_at(&self, at: u64) -> Option<&ZSend> {
        self.z.zsends.iter().find(|z| z.start <= at && at < z.end)
    }

    /// Whether the bytes from `at` go by Zcopy now.
    pub(super) fn zcopy_from(&self, at: u64) -> bool {
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
    pub(super) fn skip_src_avail(&self, at: u64) -> bool {
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

    pub(super) fn mode_change_queued(&self) -> bool {
        self.control
            .iter()
            .any(|c| matches!(c, Control::ModeChange { .. }))
    }

    pub(super) fn control_pending_wr_compl(&self) -> bool {
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
                self.sends.push_back(SendRecord {
                    wr_id: wr,
                    stream_end: sent + n,
                    what: Sent::Write,
                    done: false,
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
        self.offer_ring_now();
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
            if credit < PAYLOAD_MIN_CREDIT {
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
    pub(crate) fn emit_payload(&mut self, body: Body<'_>, range: core::ops::Range<u64>) -> Op {
        let (mseq, bufs, mseq_ack) = self.credits.on_send();
        let n = range.end.saturating_sub(range.start);
        let repr = MessageRepr {
            bufs,
            flags: Flags::EMPTY,
            mseq,
            mseq_ack,
            body,
        };
        let mut buf = [0u8; MAX_HEADER_LEN];
        let hlen = repr.header_len().min(MAX_HEADER_LEN);
        repr.emit_header(&mut buf[..hlen]);
        // Len covers the payload gathered from the stream.
        let total = u32::try_from(hlen as u64 + n).unwrap_or(u32::MAX);
        buf[4..8].copy_from_slice(&total.to_be_bytes());
        let header = SendHeader::from_array(buf, hlen);
        if n > 0 {
            let chunk = Chunk {
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
    pub(super) fn attribute_rdma(&mut self, at: u64, n: u64) {
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
    pub(super) fn drop_srcs(&mut self) {
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
            FlowControlMode::Pipelined if self.config.pipelining == Pipelining::OnRequest => {
                self.want_send_mode(FlowControlMode::Combined);
            }
            _ => {}
        }
    }

    /// Takes the stream back from `point` and finishes the ULP buffers
    /// there (§9.5.4).
    pub(super) fn retract(&mut self, point: u64) {
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
    pub(super) fn req_pipe_hint(&mut self, flags: Flags) {
        if self.config.pipelining != Pipelining::OnRequest {
            return;
        }
        let pipe = flags.contains(Flags::REQ_PIPE);
        match self.zsend_mode() {
            FlowControlMode::Combined if pipe => self.want_send_mode(FlowControlMode::Pipelined),
            FlowControlMode::Pipelined if !pipe => self.want_send_mode(FlowControlMode::Combined),
            _ => {}
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
    pub(super) fn discard_stale_sinks(&mut self) {
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

    /// Whether send-side Zcopy work blocks plain `send` (§11.2: no Bcopy
    /// while a Read Zcopy is In-Process is handled by ordering; this only
    /// keeps a canceled buffer the last thing in the stream).
    pub(crate) fn zsend_pending(&self) -> bool {
        !self.z.zsends.is_empty() || self.z.cut.is_some()
    }
}
