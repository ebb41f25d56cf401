//! Zero copy through the engine: the [`RdmaOp`]s of the Read Zcopy and
//! Write Zcopy mechanisms (draft §9.2, §9.3) carried out on the iWARP
//! connection (RFC 5040 §4.3 Send with Invalidate, §5.1 RDMA Write, §5.2
//! RDMA Read, §8.1.1 memory protection).
//!
//! The application buffers are lent for the length of one blocking call,
//! like the Bcopy copy budget's ([`super::direct`]):
//!
//! * **Send** ([`Link::send_zcopy`]): the caller's buffer is region
//!   [`SEND_ZCOPY`] of [`super::LinkMemory`] until its
//!   [`Completion::Sent`] — the call does not return before it. The
//!   SrcAvail's buffer is registered there for remote read (the peer's
//!   RDMA Read Responses come straight from it), RDMA Writes into the
//!   peer's SinkAvail buffers gather from it, and so do the Data Messages
//!   of a SrcAvail's payload or of the rest after a SendSm.
//! * **Receive** ([`Link::post_recv_zcopy`]): the reader's buffer is
//!   region [`RECV_ZCOPY`] until its [`Completion::Received`]: the target
//!   of our RDMA Reads of the peer's SrcAvail buffer (registered for local
//!   write), or the buffer a SinkAvail advertises (registered for remote
//!   write). Tagged payload goes from the socket straight into it.
//!
//! Only the call that lent the memory may pump the socket meanwhile (the
//! stream layer keeps everyone else off it): the engine would otherwise
//! place into, or send from, a region that is not there — a local
//! catastrophic error, never a stray byte.
//!
//! Registrations are scoped to the stream (RFC 5040 §8.1.1 item 7), so
//! that the peer's final RdmaRdCompl or RdmaWrCompl, a Send with SE and
//! Invalidate, may invalidate them (§9.2, §9.3); the connection
//! deregisters each one when it is done with it, and the call's end
//! removes anything left before the memory goes.

use core::ops::Range;
use std::time::Instant;

use iwarp::engine::{Connection, Payload, ReadWr, Sge, WriteWr};
use iwarp::mem::{Access as MemAccess, MrAttrs, RegionId, Scope};
use iwarp::wire::ddp::Stag;

use super::direct::SendSpan;
use super::local::{self, Lent};
use super::Link;
use crate::conn::local::{LocalOff, PeerSlot};
use crate::conn::{Completion, RecvFlags};
use crate::errno::Error;
use crate::verbs::{Access, Event, MemId, Memory, RdmaOp, RecvId, SendId, WrId};

/// The caller's buffer during a Zcopy send (read-only).
pub const SEND_ZCOPY: RegionId = RegionId(u32::MAX - 4);
/// The reader's buffer during a Zcopy receive.
pub const RECV_ZCOPY: RegionId = RegionId(u32::MAX - 5);

/// One registration of the connection's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Reg {
    mem: MemId,
    stag: Stag,
    /// The posted receive buffer it names, if any.
    recv: Option<RecvId>,
}

/// The Zcopy state of a link: the buffers lent and the registrations.
#[derive(Debug, Default)]
pub(crate) struct ZcopyLink {
    /// The send buffer lent for a blocking write, until its completion.
    send: Option<(SendId, SendSpan)>,
    /// The receive buffer lent for a blocking read, until its completion.
    recv: Option<(RecvId, u32)>,
    /// Where the lent send and receive buffers are in this process: their
    /// Tagged Offsets on the same-host path ([`Conn::local_tos`]).
    ///
    /// [`Conn::local_tos`]: crate::conn::Conn::local_tos
    send_at: u64,
    recv_at: u64,
    regs: Vec<Reg>,
}

impl ZcopyLink {
    /// The send stream bytes in the caller's buffer, if a Zcopy send is
    /// under way.
    pub(crate) fn send_span(&self) -> Option<&SendSpan> {
        self.send.as_ref().map(|(_, s)| s)
    }
}

impl Link {
    /// Hands `buf`, the caller's buffer, to the connection as one
    /// ULP send buffer ([`crate::conn::Conn::send_zcopy`]): larger than
    /// the Bcopy Threshold they go by Read or Write Zcopy. The buffer is
    /// region [`SEND_ZCOPY`] until [`Link::poll_zcopy`] returns its
    /// [`Completion::Sent`]: pump only with it lent
    /// ([`Link::memory_zcopy`]). EAGAIN while another one is under way.
    pub fn send_zcopy(
        &mut self,
        buf: &[u8],
        deadline: Option<Instant>,
        now: Instant,
    ) -> Result<SendId, Error> {
        if self.zc.send.is_some() || self.send_span.is_some() {
            return Err(Error::WouldBlock);
        }
        let len = buf.len();
        let id = self.conn.send_zcopy(len as u64, deadline, now)?;
        self.zc.send_at = buf.as_ptr() as u64;
        let end = self.conn.tx().accepted();
        self.zc.send = Some((
            id,
            SendSpan::one(end.saturating_sub(len as u64)..end, SEND_ZCOPY),
        ));
        Ok(id)
    }

    /// Posts the reader's buffer `buf`, up to 4 GiB of it
    /// ([`crate::conn::Conn::post_recv`]): RDMA Reads of the peer's
    /// SrcAvail land in it, or a SinkAvail advertises it. It is region
    /// [`RECV_ZCOPY`] until [`Link::poll_zcopy`] returns its
    /// [`Completion::Received`]. EAGAIN while another one is posted.
    pub fn post_recv_zcopy(
        &mut self,
        buf: &[u8],
        flags: RecvFlags,
        deadline: Option<Instant>,
    ) -> Result<RecvId, Error> {
        if self.zc.recv.is_some() {
            return Err(Error::WouldBlock);
        }
        let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let id = self.conn.post_recv(len, flags, deadline)?;
        self.zc.recv = Some((id, len));
        self.zc.recv_at = buf.as_ptr() as u64;
        Ok(id)
    }

    /// Takes the posted buffer back ([`crate::conn::Conn::cancel_recv`]):
    /// its completion follows, at once if it was not in use.
    pub fn cancel_recv_zcopy(&mut self) -> bool {
        match self.zc.recv {
            Some((id, _)) => self.conn.cancel_recv(id),
            None => false,
        }
    }

    /// Takes the send buffer back ([`crate::conn::Conn::cancel_send`]): its
    /// completion follows once the peer answered the cancel.
    pub fn cancel_send_zcopy(&mut self, now: Instant) -> bool {
        match self.zc.send {
            Some((id, _)) => self.conn.cancel_send(id, now),
            None => false,
        }
    }

    /// The registrations the link holds for the connection.
    #[cfg(test)]
    pub(crate) fn zc_regs(&self) -> usize {
        self.zc.regs.len()
    }

    /// Whether a Zcopy send or receive buffer is lent.
    pub fn zcopy_lent(&self) -> bool {
        self.zc.send.is_some() || self.zc.recv.is_some()
    }

    /// The next finished ULP buffer ([`crate::conn::Conn::poll_completion`]).
    /// A buffer of ours that finished is no longer lent: whatever still
    /// names its memory is removed.
    pub fn poll_zcopy(&mut self, qp: &mut Connection) -> Option<Completion> {
        let c = self.conn.poll_completion()?;
        match c {
            Completion::Sent { id, len, zcopy }
                if self.zc.send.as_ref().is_some_and(|s| s.0 == id) =>
            {
                // What went by Data Messages went straight from the buffer.
                self.stats.bytes_sent_direct += len.saturating_sub(zcopy);
                self.end_send_zcopy(qp);
            }
            Completion::Received { id, .. } if self.zc.recv.is_some_and(|r| r.0 == id) => {
                self.end_recv_zcopy(qp);
            }
            _ => {}
        }
        Some(c)
    }

    /// The call that lent a buffer ends without its completion (the
    /// connection failed): nothing may name the memory any more. With the
    /// connection still up that breaks its promises to the peer, so it is
    /// aborted.
    pub fn abandon_zcopy(&mut self, qp: &mut Connection) {
        if !self.zcopy_lent() {
            return;
        }
        if self.is_connected() {
            self.log("Zcopy buffer taken back before its completion".to_string());
            self.conn.abort();
        }
        self.end_send_zcopy(qp);
        self.end_recv_zcopy(qp);
    }

    fn end_send_zcopy(&mut self, qp: &mut Connection) {
        if self.zc.send.take().is_none() {
            return;
        }
        self.drop_region_regs(qp, SEND_ZCOPY);
        if qp.datapath().region_low_water(SEND_ZCOPY).is_some() {
            // Queued work still refers to the buffer (a peer that
            // acknowledged bytes it had not read): it cannot be sent.
            self.log("Zcopy send buffer still referred to at its completion".to_string());
            self.conn.abort();
        }
    }

    fn end_recv_zcopy(&mut self, qp: &mut Connection) {
        if self.zc.recv.take().is_some() {
            self.drop_region_regs(qp, RECV_ZCOPY);
        }
    }

    /// Deregisters whatever names `region`.
    fn drop_region_regs(&mut self, qp: &mut Connection, region: RegionId) {
        let mut i = 0;
        while let Some(r) = self.zc.regs.get(i).copied() {
            let here = qp
                .datapath()
                .registry()
                .get(r.stag)
                .is_some_and(|mr| mr.region == region);
            if here {
                let _ = qp.datapath_mut().deregister(r.stag);
                self.zc.regs.remove(i);
            } else {
                i += 1;
            }
        }
    }

    /// Carries out one [`RdmaOp`]. A registration is answered at once
    /// with [`Event::Registered`] (the verbs contract). With the peer on
    /// this host (DESIGN §9), an RDMA Read or Write whose memory is lent
    /// in this drive moves process to process and completes as
    /// [`Event::DoneLocally`]; if the kernel refuses, the same-host path
    /// is left and it goes on the wire, nothing lost.
    pub(super) fn execute_rdma(
        &mut self,
        now: Instant,
        op: RdmaOp,
        qp: &mut Connection,
        lent: &mut Lent<'_>,
    ) {
        match op {
            RdmaOp::Register {
                mem,
                memory,
                access,
            } => match self.register(mem, &memory, access, qp) {
                Some((stag, to)) => self.conn.handle_event(
                    now,
                    Event::Registered {
                        mem,
                        stag: stag.0,
                        to,
                    },
                ),
                None => {
                    self.log(format!("cannot register {memory:?}"));
                    self.conn.abort();
                }
            },
            RdmaOp::Read {
                wr_id,
                stag,
                to,
                len,
                into,
                offset,
            } => {
                if self.read_here(now, wr_id, to, len, (into, offset), lent) {
                    return;
                }
                let local = self.zc.regs.iter().find(|r| r.recv == Some(into));
                let posted = local.ok_or(None).and_then(|r| {
                    // Zero-based, or the buffer's address (register).
                    let base = qp
                        .datapath()
                        .registry()
                        .get(r.stag)
                        .map_or(0, |mr| mr.attrs.base_to);
                    qp.datapath_mut()
                        .post_read(ReadWr {
                            wr_id: wr_id.0,
                            local_stag: r.stag,
                            local_to: base.saturating_add(u64::from(offset)),
                            remote_stag: Stag(stag),
                            remote_to: to,
                            len,
                            signaled: true,
                        })
                        .map_err(Some)
                });
                if let Err(e) = posted {
                    if qp.datapath().error().is_none() {
                        self.log(match e {
                            Some(e) => format!("RDMA Read refused: {e:?}"),
                            None => "RDMA Read into a buffer not registered".to_string(),
                        });
                        self.conn.abort();
                    }
                }
            }
            RdmaOp::Write {
                wr_id,
                stag,
                to,
                payload,
            } => {
                if self.write_here(now, wr_id, to, payload.clone(), lent) {
                    return;
                }
                let mut sges = Vec::with_capacity(2);
                self.payload_sges(payload, &mut sges);
                let wr = WriteWr {
                    wr_id: wr_id.0,
                    remote_stag: Stag(stag),
                    remote_to: to,
                    payload: Payload::Sges(sges),
                    signaled: true,
                };
                if qp.datapath_mut().post_write(wr).is_err() && qp.datapath().error().is_none() {
                    self.log("RDMA Write refused".to_string());
                    self.conn.abort();
                }
            }
            RdmaOp::Deregister { mem } => {
                if let Some(i) = self.zc.regs.iter().position(|r| r.mem == mem) {
                    let r = self.zc.regs.remove(i);
                    // Invalidated by the peer already (Send with
                    // Invalidate) or not: it goes either way.
                    let _ = qp.datapath_mut().deregister(r.stag);
                }
            }
        }
    }

    /// Registers `memory`, with its Tagged Offsets zero-based or, on the
    /// same-host path, its addresses; `None` if it is not lent (a
    /// connection asking for memory nobody handed it).
    fn register(
        &mut self,
        mem: MemId,
        memory: &Memory,
        access: Access,
        qp: &mut Connection,
    ) -> Option<(Stag, u64)> {
        let (region, offset, len, recv) = match memory {
            Memory::Stream(range) => {
                let span = &self.zc.send_span()?.span;
                if range.start < span.start || range.end > span.end || range.is_empty() {
                    return None;
                }
                let offset = usize::try_from(range.start - span.start).ok()?;
                (SEND_ZCOPY, offset, range.end - range.start, None)
            }
            Memory::Recv { id, len } => {
                let (lent, size) = self.zc.recv?;
                if lent != *id || *len > size || *len == 0 {
                    return None;
                }
                (RECV_ZCOPY, 0, u64::from(*len), Some(*id))
            }
        };
        let rights = match access {
            Access::Local => MemAccess::LOCAL_WRITE,
            Access::RemoteRead => MemAccess::REMOTE_READ,
            // A buffer the peer may write into is also ours to write:
            // the connection RDMA Reads into a posted buffer registered
            // for a SinkAvail that never went (a SrcAvail came first).
            Access::RemoteWrite => MemAccess::LOCAL_WRITE | MemAccess::REMOTE_WRITE,
        };
        // Scoped to this stream: the peer's Send with Invalidate may
        // invalidate it (RFC 5040 §8.1.1 item 7; draft §9.2, §9.3).
        let mut attrs = MrAttrs::new(qp.datapath().pd(), rights).with_scope(Scope::Stream);
        if self.conn.local_tos() {
            let at = if region == SEND_ZCOPY {
                self.zc.send_at
            } else {
                self.zc.recv_at
            };
            attrs = attrs.with_base_to(at.checked_add(offset as u64)?);
        }
        let stag = qp
            .datapath_mut()
            .register_with(region, offset, len, attrs)
            .ok()?;
        self.zc.regs.push(Reg { mem, stag, recv });
        Some((stag, attrs.base_to))
    }

    /// The same-host RDMA Read: `len` bytes at `to`, the address the
    /// peer's SrcAvail gave, straight into the lent receive buffer at
    /// `offset`. False if it goes on the wire.
    fn read_here(
        &mut self,
        now: Instant,
        wr_id: WrId,
        to: u64,
        len: u32,
        (into, offset): (RecvId, u32),
        lent: &mut Lent<'_>,
    ) -> bool {
        let Some(peer) = self.conn.local_peer() else {
            return false;
        };
        let lent_here = self.zc.recv.is_some_and(|(id, _)| id == into);
        let start = offset as usize;
        let Some(buf) = lent
            .zc_recv
            .as_deref_mut()
            .filter(|_| lent_here)
            .and_then(|b| b.get_mut(start..start.checked_add(len as usize)?))
        else {
            return false;
        };
        match local::read(peer, to, buf) {
            Ok(()) => {
                self.stats.bytes_received_local += u64::from(len);
                self.conn.handle_event(now, Event::DoneLocally { wr_id });
                true
            }
            Err(why) => {
                self.leave_local(why);
                false
            }
        }
    }

    /// The same-host RDMA Write: the send stream bytes `payload` into the
    /// peer's SinkAvail buffer at `to`, then its token read back. False if
    /// it goes on the wire.
    fn write_here(
        &mut self,
        now: Instant,
        wr_id: WrId,
        to: u64,
        payload: Range<u64>,
        lent: &Lent<'_>,
    ) -> bool {
        let Some(peer) = self.conn.local_peer() else {
            return false;
        };
        let len = payload.end - payload.start;
        match self.write_local(PeerSlot { addr: to, ..peer }, payload, lent) {
            Ok(()) => {
                self.stats.bytes_sent_local += len;
                self.conn.handle_event(now, Event::DoneLocally { wr_id });
                true
            }
            Err(None) => false,
            Err(Some(why)) => {
                self.leave_local(why);
                false
            }
        }
    }

    fn leave_local(&mut self, why: LocalOff) {
        self.log(format!("same-host path left: {why}"));
        self.conn.local_left(why);
    }

    /// The gather list of the send stream bytes `payload`: older bytes
    /// from the staging ring, the rest from the caller's buffer of a
    /// direct or Zcopy send.
    pub(super) fn payload_sges(&self, payload: Range<u64>, sges: &mut Vec<Sge>) {
        let span = self.send_span.as_ref().or(self.zc.send_span());
        let ring = span.map_or(payload.clone(), |d| d.ring_part(payload.clone()));
        if ring.end > ring.start {
            let (a, b) = self.staging.payload_sges(ring.clone());
            sges.push(a);
            sges.extend(b);
        }
        if let Some(d) = span {
            d.lent_sges(ring.end..payload.end, sges);
        }
    }
}
