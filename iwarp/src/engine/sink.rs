//! The Data Sink: incoming DDP segments validated and placed (RFC 5041
//! §5.2, §7.1; RFC 5040 §5, §7.2), messages delivered in order (RFC 5041
//! §5.3–§5.4, RFC 5040 §5.5).
//!
//! For every FPDU, in this order:
//!
//! 1. the deframer collects the headers ([`super::rx`]);
//! 2. [`DataPath::classify`] runs every check that decides *where* the
//!    payload may go — DDP and RDMAP versions, opcode, QN, MSN, buffer,
//!    MO, length, STag, access, TO wrap, bounds — before any payload octet
//!    is placed. A failed check sends the payload nowhere;
//! 3. payload is placed as it streams in (copied by `handle_input`, or
//!    received in place by the driver and reported with `placed`);
//! 4. at the end of the FPDU, only if the CRC and the markers are right
//!    (RFC 5044 §6), either the pending error is raised as a Terminate, or
//!    the segment takes effect: MSNs advance, receives complete, Reads are
//!    answered, STags are invalidated.
//!
//! So a corrupted FPDU is never acted on, and the error reported for it is
//! the CRC's (code 2) even when the damage also broke a header.

use crate::mem::{Access, Memory, RegionId};
use crate::wire::ddp::{self, BufferModel, QueueNumber, Segment, Stag};
use crate::wire::fpdu;
use crate::wire::rdmap::{Opcode, RdmapRepr, READ_REQUEST_LEN};
use crate::wire::terminate::TermCode;

use super::placement::{Action, RecvInProgress, RxSeg, Target};
use super::qp::{DataPath, ReadJob, RecvTarget, RtrKind, State};
use super::rx::{RxEvent, HDR_CAP};
use super::terminate::{self, Echo, TERM_CAP};
use super::wr::{Completion, Status, WcOpcode};

impl DataPath {
    /// Consumes received octets: deframes, validates, places payload into
    /// `mem` (one copy), and acts on complete FPDUs. Returns the octets
    /// consumed: all of them, except in [`State::Idle`] (none).
    pub fn handle_input(&mut self, mut data: &[u8], mem: &mut dyn Memory) -> usize {
        let total = data.len();
        if self.state == State::Idle {
            return 0;
        }
        while !data.is_empty() {
            if self.rx.dropping {
                return total;
            }
            let run = self.rx.deframer.payload_run();
            if run > 0 {
                let n = run.min(data.len());
                self.place_copy(&data[..n], mem);
                self.rx.deframer.consume_payload(&data[..n]);
                data = &data[n..];
                continue;
            }
            let (n, ev) = self.rx.deframer.consume_control(data);
            data = &data[n..];
            self.on_event(ev);
        }
        total
    }

    /// Where the driver should receive the next octets: into a scratch
    /// buffer for [`DataPath::handle_input`], or straight into place for
    /// [`DataPath::placed`] (DESIGN §3.2).
    pub fn recv_target(&self) -> RecvTarget {
        if self.state == State::Idle || self.rx.dropping {
            return RecvTarget::Scratch { max: 64 * 1024 };
        }
        let run = self.rx.deframer.payload_run();
        match self.rx.seg.target {
            Target::Place {
                region,
                offset,
                stag,
            } if run > 0 => {
                let l = self.land(region, offset, run, stag);
                RecvTarget::Place {
                    region: l.region,
                    offset: l.offset,
                    len: l.len,
                }
            }
            // Discarded payload: through the scratch buffer too.
            _ if run > 0 => RecvTarget::Scratch { max: run },
            _ => RecvTarget::Scratch {
                max: self.rx.deframer.scratch_max(),
            },
        }
    }

    /// The driver received `n` octets (at most the `len` of the last
    /// [`RecvTarget::Place`]) straight into place: the CRC runs over them
    /// where they landed.
    pub fn placed(&mut self, n: usize, mem: &mut dyn Memory) {
        if n == 0 || self.rx.dropping || self.state == State::Idle {
            return;
        }
        let run = self.rx.deframer.payload_run();
        let landing = match self.rx.seg.target {
            Target::Place {
                region,
                offset,
                stag,
            } => Some(self.land(region, offset, run, stag)).filter(|l| n <= l.len),
            _ => None,
        };
        if let Some(l) = &landing {
            self.overlay_placed(l, n);
        }
        let bytes = landing.and_then(|l| {
            mem.region(l.region)
                .and_then(|r| r.get(l.offset..l.offset.checked_add(n)?))
        });
        let Some(bytes) = bytes else {
            // The driver placed more than it was offered, or into memory
            // that is not there: the stream is out of step, our side's
            // failure (RFC 5041 §7.2 Local Catastrophic).
            self.rx.seg.target = Target::Discard;
            self.raise(TermCode::DDP_LOCAL_CATASTROPHIC, &Echo::NONE);
            return;
        };
        self.rx.deframer.consume_payload(bytes);
        self.advance_target(n);
    }

    fn advance_target(&mut self, n: usize) {
        if let Target::Place { offset, .. } = &mut self.rx.seg.target {
            *offset += n;
        }
    }

    /// Where placement at `offset` of `region` lands: through the receive
    /// overlay for untagged placement ([`super::overlay`]).
    fn land(
        &self,
        region: RegionId,
        offset: usize,
        len: usize,
        stag: Option<Stag>,
    ) -> super::overlay::Landing {
        match stag {
            None => self.landing(region, offset, len),
            Some(_) => super::overlay::Landing {
                region,
                offset,
                len,
                overlaid: false,
                parked: false,
            },
        }
    }

    fn place_copy(&mut self, mut data: &[u8], mem: &mut dyn Memory) {
        while !data.is_empty() {
            let Target::Place {
                region,
                offset,
                stag,
            } = self.rx.seg.target
            else {
                return;
            };
            let l = self.land(region, offset, data.len(), stag);
            let (now, rest) = data.split_at(l.len.min(data.len()));
            let dst = l
                .offset
                .checked_add(now.len())
                .and_then(|end| mem.region_range_mut(l.region, l.offset..end));
            match dst {
                Some(dst) => {
                    dst.copy_from_slice(now);
                    self.overlay_placed(&l, now.len());
                    self.advance_target(now.len());
                }
                None => {
                    // Registered memory that the Memory no longer has: ours.
                    self.rx.seg.target = Target::Discard;
                    self.rx.seg.pending = Some(TermCode::DDP_LOCAL_CATASTROPHIC);
                    self.rx.seg.echo = Echo::NONE;
                    return;
                }
            }
            data = rest;
        }
    }

    fn on_event(&mut self, ev: Option<RxEvent>) {
        match ev {
            None => {}
            Some(RxEvent::Header) => {
                let mut hdr = [0u8; HDR_CAP];
                let h = self.rx.deframer.header();
                let hlen = h.len();
                hdr[..hlen].copy_from_slice(h);
                let ulpdu_len = self.rx.deframer.ulpdu_len();
                self.rx.seg = self.classify(&hdr[..hlen], ulpdu_len);
            }
            Some(RxEvent::End { crc_ok, markers_ok }) => self.on_end(crc_ok, markers_ok),
        }
    }

    /// The local side dropped `stag` while a segment was being placed
    /// under it: the rest of the segment goes nowhere, and the segment is
    /// an Invalid STag error (RFC 5041 §7.1 check 1; RFC 5040 §8.1.1 item
    /// 6).
    pub(super) fn retarget_invalidated(&mut self, stag: Stag) {
        if let Target::Place {
            stag: Some(current),
            ..
        } = self.rx.seg.target
        {
            if current == stag && self.rx.deframer.payload_left() > 0 {
                self.rx.seg.target = Target::Discard;
                self.rx
                    .seg
                    .pending
                    .get_or_insert(TermCode::DDP_INVALID_STAG);
            }
        }
    }

    /// Validates the headers of a segment (RFC 5041 §7.1, RFC 5040 §7.2)
    /// and decides where its payload goes and what it does.
    fn classify(&mut self, hdr: &[u8], ulpdu_len: usize) -> RxSeg {
        let mut seg = RxSeg::default();
        match self.check(hdr, ulpdu_len, &mut seg) {
            Ok((target, action)) => {
                seg.target = target;
                seg.action = action;
            }
            Err(code) => {
                seg.pending = Some(code);
                seg.target = Target::Discard;
                seg.action = Action::None;
            }
        }
        seg
    }

    fn check(
        &mut self,
        hdr: &[u8],
        ulpdu_len: usize,
        seg: &mut RxSeg,
    ) -> Result<(Target, Action), TermCode> {
        if ulpdu_len < fpdu::MIN_ULPDU_LEN {
            return Err(fpdu::Error::UlpduTooShort.into());
        }
        // Shorter than the header its T bit names: DDP cannot read it
        // (no header to echo: Local Catastrophic, see wire::ddp).
        let segment = Segment::new_checked(hdr)?;
        let hlen = segment.header_len();
        seg.echo.ddp[..hlen].copy_from_slice(&hdr[..hlen]);
        seg.echo.ddp_len = hlen;
        seg.echo.seg_len = ulpdu_len as u16;
        // DDP version (RFC 5041 §4.1), RDMAP version (RFC 5040 §7.2 check
        // 3), opcode against the T bit (§4.1 Figure 4), Read Request header
        // present (§4.4).
        let repr = RdmapRepr::parse(&segment)?;
        let opcode = repr.opcode;
        seg.echo.read_request = opcode == Opcode::RDMA_READ_REQUEST;
        seg.echo.rr = repr.read_request;
        // DDP payload octets of this segment.
        let len = ulpdu_len - hlen;
        match repr.model {
            BufferModel::Tagged { stag, to } => self.check_tagged(opcode, repr.last, stag, to, len),
            BufferModel::Untagged { qn, msn, mo, .. } => {
                // RFC 5041 §7.1 untagged check 1: "The QN is valid for this
                // stream." RDMAP uses 0, 1 and 2 (RFC 5040 §4.1 Figure 4).
                if qn.0 > QueueNumber::TERMINATE.0 {
                    return Err(TermCode::DDP_INVALID_QN);
                }
                // RFC 5040 §7.2 check 2: "The RDMA OpCode MUST be valid";
                // Figure 4 ties each untagged opcode to its queue.
                if opcode.queue() != Some(qn) {
                    return Err(TermCode::RDMAP_UNEXPECTED_OPCODE);
                }
                let invalidate = repr.invalidate_stag().unwrap_or_default();
                match qn {
                    QueueNumber::SEND => self.check_send(opcode, &repr, msn, mo, len, invalidate),
                    QueueNumber::READ_REQUEST => self.check_read_request(&repr, msn, mo, len),
                    _ => self.check_terminate(hdr, repr.last, msn, mo, len),
                }
            }
        }
    }

    /// RFC 5041 §7.1 tagged checks, for RDMA Write and Read Response.
    fn check_tagged(
        &self,
        opcode: Opcode,
        last: bool,
        stag: Stag,
        to: u64,
        len: usize,
    ) -> Result<(Target, Action), TermCode> {
        let len64 = len as u64;
        match opcode {
            Opcode::RDMA_WRITE => {
                // RFC 5041 §5.2: "The STag and TO fields MUST NOT be checked
                // for a zero-length Tagged DDP Message" (the tagged RTR).
                if len == 0 {
                    return Ok((Target::Discard, Action::Write));
                }
                let span = self
                    .reg
                    .check_tagged(stag, to, len64, self.pd, Access::REMOTE_WRITE)
                    .map_err(|e| e.ddp_code())?;
                Ok((
                    Target::Place {
                        region: span.region,
                        offset: span.offset,
                        stag: Some(stag),
                    },
                    Action::Write,
                ))
            }
            Opcode::RDMA_READ_RESPONSE => {
                // RFC 5040 §5.2.2: a Read Response answers our oldest
                // outstanding Read Request; without one it is not a valid
                // opcode here (§7.2 check 2).
                let read = *self
                    .reads_out
                    .front()
                    .ok_or(TermCode::RDMAP_UNEXPECTED_OPCODE)?;
                if len == 0 {
                    return Ok((Target::Discard, Action::ReadResponse { last }));
                }
                // RFC 5040 §5.2.2: "The Data Sink MAY validate that the
                // STag, Tagged Offset, and length of the RDMA Read Response
                // Message are the same as" in the request. We do, so the
                // peer can place only into the buffer we asked it to fill,
                // although that STag grants no remote rights.
                if stag != read.sink_stag {
                    return Err(TermCode::DDP_INVALID_STAG);
                }
                let end = ddp::to_end(to, len64).ok_or(TermCode::DDP_TO_WRAP)?;
                // sink_to + size was checked when the Read was posted.
                if to < read.sink_to || end > read.sink_to + u64::from(read.size) {
                    return Err(TermCode::DDP_BASE_BOUNDS);
                }
                let span = self
                    .reg
                    .check_tagged(stag, to, len64, self.pd, Access::LOCAL_WRITE)
                    .map_err(|e| e.ddp_code())?;
                Ok((
                    Target::Place {
                        region: span.region,
                        offset: span.offset,
                        stag: Some(stag),
                    },
                    Action::ReadResponse { last },
                ))
            }
            // Reserved opcodes (8-15) in a tagged segment.
            _ => Err(TermCode::RDMAP_UNEXPECTED_OPCODE),
        }
    }

    /// RFC 5041 §7.1 untagged checks 2–5 on QN 0 (the Sends).
    fn check_send(
        &self,
        opcode: Opcode,
        repr: &RdmapRepr,
        msn: u32,
        mo: u32,
        len: usize,
        inv: Stag,
    ) -> Result<(Target, Action), TermCode> {
        // Check 5: segments arrive in order, so the only legal MSN is that
        // of the message in progress or, between messages, the next one.
        if msn != self.rx.msn[0] {
            return Err(TermCode::DDP_INVALID_MSN_RANGE);
        }
        if self.rtr_expect == Some(RtrKind::Send)
            && self.rx.send.is_none()
            && len == 0
            && mo == 0
            && repr.last
        {
            return Ok((Target::Discard, Action::RtrSend));
        }
        // RFC 5040 §7.2 checks 4 and 5 on the Invalidate STag. They apply
        // when the message is delivered (and are repeated then), but every
        // segment carries the STag: checking it before placing keeps an
        // invalid Send with Invalidate from placing anything.
        if opcode.has_invalidate_stag() {
            self.reg
                .check_remote_invalidate(inv, self.pd)
                .map_err(|e| e.code())?;
        }
        // Check 2: "The QN and MSN have an associated buffer".
        let buf = match &self.rx.send {
            Some(p) => p.wr.sge,
            None => self.rx.rq.front().ok_or(TermCode::DDP_NO_BUFFER)?.sge,
        };
        // Check 3: "The MO falls in the range of legal offsets".
        if mo as usize > buf.len {
            return Err(TermCode::DDP_INVALID_MO);
        }
        // Check 4: MO plus payload length within the buffer (RFC 5040
        // §5.3: a message larger than the buffer "is an error").
        let end = u64::from(mo) + len as u64;
        if end > buf.len as u64 || end > u64::from(u32::MAX) {
            return Err(TermCode::DDP_MESSAGE_TOO_LONG);
        }
        let target = if len > 0 {
            Target::Place {
                region: buf.region,
                offset: buf.offset + mo as usize,
                stag: None,
            }
        } else {
            Target::Discard
        };
        Ok((
            target,
            Action::Send {
                opcode,
                last: repr.last,
                mo,
                len: len as u32,
                inv,
                first: self.rx.send.is_none(),
            },
        ))
    }

    /// RFC 5041 §7.1 on QN 1: the Read Request queue has IRD buffers of
    /// one Read Request header each (RFC 5040 §5.2.2: "sufficient number of
    /// Untagged Buffers ... on the RDMA Read Request Queue").
    fn check_read_request(
        &self,
        repr: &RdmapRepr,
        msn: u32,
        mo: u32,
        len: usize,
    ) -> Result<(Target, Action), TermCode> {
        if msn != self.rx.msn[1] {
            return Err(TermCode::DDP_INVALID_MSN_RANGE);
        }
        // RFC 5040 §6.1: "For inbound RDMA Read Requests, the RDMAP layer
        // MUST NOT exceed the maximum number of outstanding, inbound RDMA
        // Read Requests": beyond IRD there is no buffer for it.
        if self.ird_inflight >= usize::from(self.ird) {
            return Err(TermCode::DDP_NO_BUFFER);
        }
        // The header is read from the first segment (wire::rdmap): its MO
        // is 0 and it is the whole message.
        if mo != 0 {
            return Err(TermCode::DDP_INVALID_MO);
        }
        if len > READ_REQUEST_LEN || !repr.last {
            return Err(TermCode::DDP_MESSAGE_TOO_LONG);
        }
        let rr = repr.read_request.ok_or(TermCode::RDMAP_OP_UNSPECIFIED)?;
        Ok((Target::Discard, Action::ReadRequest(rr)))
    }

    /// RFC 5041 §7.1 on QN 2: one Terminate buffer of [`TERM_CAP`] octets.
    fn check_terminate(
        &mut self,
        hdr: &[u8],
        last: bool,
        msn: u32,
        mo: u32,
        len: usize,
    ) -> Result<(Target, Action), TermCode> {
        if msn != self.rx.msn[2] {
            return Err(TermCode::DDP_INVALID_MSN_RANGE);
        }
        let mo = mo as usize;
        if mo > TERM_CAP {
            return Err(TermCode::DDP_INVALID_MO);
        }
        let end = mo + len;
        if end > TERM_CAP {
            return Err(TermCode::DDP_MESSAGE_TOO_LONG);
        }
        // The payload came in with the header (HDR_CAP > 18 + TERM_CAP):
        // place it in the Terminate buffer now; it is only read once the
        // FPDU is verified.
        let payload = hdr.get(ddp::UNTAGGED_HEADER_LEN..).unwrap_or_default();
        let n = payload.len().min(len);
        self.rx.term_buf[mo..mo + n].copy_from_slice(&payload[..n]);
        Ok((Target::Discard, Action::Terminate { last, end }))
    }

    /// The FPDU is complete: verify, then raise or act (module docs).
    fn on_end(&mut self, crc_ok: bool, markers_ok: bool) {
        let seg = core::mem::take(&mut self.rx.seg);
        // RFC 5044 §6: the FPDU is verified before DDP sees it; §8 code 2.
        if !crc_ok {
            self.raise(TermCode::MPA_CRC, &Echo::NONE);
            return;
        }
        // RFC 5044 §8 code 3: "In the event that the CRC is valid, received
        // MPA Marker ... and ULPDU Length fields do not agree".
        if !markers_ok {
            self.raise(TermCode::MPA_MARKER, &Echo::NONE);
            return;
        }
        // RFC 5041 §7.1: on an error DDP "MUST cease placing the remainder
        // of the DDP Segment and report the error(s) to the ULP".
        if let Some(code) = seg.pending {
            self.raise(code, &seg.echo);
            return;
        }
        // RFC 5044 §7.1.2 rule 4: one FPDU received and validated.
        self.gated = false;
        self.commit(seg);
    }

    fn commit(&mut self, seg: RxSeg) {
        match seg.action {
            Action::None | Action::Write => {}
            Action::RtrSend => {
                self.rx.msn[0] = ddp::next_msn(self.rx.msn[0]);
                self.rtr_expect = None;
            }
            Action::Send {
                opcode,
                last,
                mo,
                len,
                inv,
                first,
            } => {
                if first {
                    match self.rx.rq.pop_front() {
                        Some(wr) => self.rx.send = Some(RecvInProgress { wr, end: 0 }),
                        None => return,
                    }
                }
                if !last {
                    if let Some(p) = &mut self.rx.send {
                        p.end = p.wr.sge.offset + mo as usize + len as usize;
                    }
                    return;
                }
                // RFC 5040 §5.3: on delivery of a Send with Invalidate the
                // RDMAP layer MUST verify and invalidate the STag.
                let invalidated = if opcode.has_invalidate_stag() {
                    if let Err(e) = self.reg.remote_invalidate(inv, self.pd) {
                        self.raise(e.code(), &seg.echo);
                        return;
                    }
                    self.retarget_invalidated(inv);
                    Some(inv)
                } else {
                    None
                };
                let Some(p) = self.rx.send.take() else {
                    return;
                };
                self.rx.msn[0] = ddp::next_msn(self.rx.msn[0]);
                self.overlay_delivered(p.wr.wr_id, mo as usize + len as usize);
                // RFC 5041 §5.4: the ULP Message Length is "the MO and the
                // ULP Payload length in the last DDP Segment".
                self.cq.push_back(Completion {
                    wr_id: p.wr.wr_id,
                    opcode: WcOpcode::Recv,
                    status: Status::Success,
                    byte_len: mo + len,
                    invalidated,
                    solicited: opcode.solicited_event(),
                });
            }
            Action::ReadRequest(rr) => {
                self.rx.msn[1] = ddp::next_msn(self.rx.msn[1]);
                // RFC 5040 §5.2.1 / §7.2 check 4: a non-zero-length Read is
                // validated against the Data Source STag; a zero-length one
                // "MUST NOT" be.
                let span = if rr.size > 0 {
                    match self.reg.check_tagged(
                        rr.src_stag,
                        rr.src_to,
                        u64::from(rr.size),
                        self.pd,
                        Access::REMOTE_READ,
                    ) {
                        Ok(span) => Some(span),
                        Err(e) => {
                            self.raise(e.rdmap_code(), &seg.echo);
                            return;
                        }
                    }
                } else {
                    None
                };
                // RFC 5040 §5.5 rule 17: processing starts only now that
                // the request is Delivered; rule 20: answered in order.
                self.ird_inflight += 1;
                self.reads_in.push_back(ReadJob { rr, span });
            }
            Action::ReadResponse { last } => {
                if last {
                    // RFC 5040 §5.5 rule 19: the Read completes when its
                    // response is Delivered.
                    if let Some(read) = self.reads_out.pop_front() {
                        if let Some(seq) = read.seq {
                            self.complete_read(seq);
                        }
                    }
                }
            }
            Action::Terminate { last, end } => {
                if last {
                    self.rx.msn[2] = ddp::next_msn(self.rx.msn[2]);
                    let info = terminate::parse(&self.rx.term_buf[..end]);
                    self.terminated_by_peer(info);
                }
            }
        }
    }
}
