//! The copy budget of DESIGN §7: caller memory lent to the engine for the
//! length of one call, and the counters that show which copies happened.
//!
//! * **Send** ([`super::Link::send_direct`]): the bytes a `write` accepts
//!   stay in the caller's buffers — regions [`send_from`] of
//!   [`super::LinkMemory`], one per buffer of a `writev`, so that its
//!   messages gather across them — while the Data Messages carrying them are
//!   posted and the driver writes what the socket takes straight from it
//!   (the CRC runs over those bytes once, where they lie). Before the call
//!   returns, [`super::Link::finish_direct`] copies into the staging ring
//!   only the bytes something still refers to — queued FPDUs not yet
//!   written, or bytes not yet posted for lack of credit — and moves the
//!   engine's references onto the ring ([`iwarp::engine::Rebase`]). What
//!   the socket took during the call was never copied.
//! * **Receive** ([`super::Link::lend_recv`]): a reader that waits with
//!   nothing unread lends its buffer as region [`RECV_INTO`] whenever it
//!   pumps the socket itself; the engine places the payload part of the
//!   next receive buffer there (an overlay, [`iwarp::engine::RecvOverlay`])
//!   while the BSDH still lands in the Private Buffer. When the message
//!   completes and is a plain Data Message, its payload is the reader's at
//!   once (the conn counts it as read); the next message's payload lands
//!   right behind it while the buffer has room. Between its pumps the
//!   reader waits without the lock and the overlay is *parked*: what it
//!   placed stays in its buffer, anything another thread receives meanwhile
//!   lands in the Private Buffer (and is copied over when the reader is
//!   back), and a completion of its message is held for it. Anything else —
//!   another message kind, OOB data, the call ending before the message is
//!   whole — has the bytes copied back into the Private Buffer, as if
//!   placed there.
//!
//! MSG_PEEK and MSG_OOB never lend (they consume nothing).

use core::ops::Range;
use std::time::Instant;

use iwarp::engine::{Completion, Connection, RecvOverlay, Status};
use iwarp::mem::RegionId;

use super::Link;
use crate::wire::{Bsdh, Mid, BSDH_LEN};

/// The caller's first buffer during a direct send (read-only).
pub const SEND_FROM: RegionId = RegionId(u32::MAX - 2);
/// Most buffers a direct send takes from the caller (`IOV_MAX` is 1024;
/// a longer `writev` is gathered in pieces).
pub const SEND_FROM_MAX: usize = 64;
/// Where the caller's buffers after the first lie: region ids from here
/// down.
const SEND_FROM_REST: u32 = u32::MAX - 16;

/// Region of the caller's `i`-th buffer during a direct send.
pub fn send_from(i: usize) -> RegionId {
    match i {
        0 => SEND_FROM,
        _ => RegionId(SEND_FROM_REST - (i.min(SEND_FROM_MAX) as u32 - 1)),
    }
}

/// Which of the caller's buffers region `id` is, if it is one.
pub fn send_from_index(id: RegionId) -> Option<usize> {
    if id == SEND_FROM {
        return Some(0);
    }
    let i = SEND_FROM_REST.checked_sub(id.0)? as usize + 1;
    (id.0 <= SEND_FROM_REST && i < SEND_FROM_MAX).then_some(i)
}
/// The waiting reader's buffer during a direct receive.
pub const RECV_INTO: RegionId = RegionId(u32::MAX - 3);

/// Payload bytes by the way they travelled through this end, for
/// observability and tests (DESIGN §7).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Sent: written to the socket straight from the caller's buffer
    /// during its `write`.
    pub bytes_sent_direct: u64,
    /// Sent: copied into the staging ring (the socket did not take them
    /// during the call, or the caller used the copying `send`).
    pub bytes_staged: u64,
    /// Received: placed straight into a waiting reader's buffer.
    pub bytes_received_direct: u64,
    /// Received: copied from a Private Buffer into a reader's buffer
    /// (consuming reads, and bytes caught up into a waiting reader's buffer
    /// after another thread received them; MSG_PEEK copies are not
    /// counted). With `bytes_received_direct`, every byte read.
    pub bytes_copied_from_pool: u64,
    /// Received: bytes placed in a waiting reader's buffer that had to go
    /// back into the Private Buffer (the call ended before the message was
    /// whole, or it was not a plain Data Message) — a copy on top.
    pub bytes_copied_back: u64,
    /// Sent: written straight into the peer's ring (the same-host path,
    /// [`crate::conn::local`]).
    pub bytes_sent_local: u64,
    /// Received: read out of our ring, where the peer wrote them.
    pub bytes_received_local: u64,
}

/// A waiting reader's receive ([`Link::lend_recv`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecvLend {
    /// The receive whose payload part goes to the reader's buffer.
    pub wr_id: u64,
    /// The reader is away (waiting without the lock): the overlay is
    /// parked.
    pub parked: bool,
    /// Bytes copied from the Private Buffer into the reader's buffer when
    /// it came back (received by another thread meanwhile).
    pub caught_up: usize,
}

impl Link {
    /// A reader waits with `buf` and pumps the socket itself (DESIGN §7;
    /// the module docs). Returns whether `buf` is lent for this pump: the
    /// caller then pumps with [`Link::memory_with`]`(.., Some(buf))`,
    /// drives with [`Link::drive_lent`], and calls [`Link::park_recv`]
    /// afterwards; [`Link::take_received_direct`] tells what landed. Pass
    /// the same `buf` on every pump of one call, and end the call with
    /// [`Link::recv_done_waiting`]. Call after [`Link::drive`].
    pub fn lend_recv(&mut self, now: Instant, qp: &mut Connection, buf: &mut [u8]) -> bool {
        if !self.deferred.is_empty() {
            // A message landed while the reader was away.
            self.release_deferred(now, Some(buf), true);
            return false;
        }
        let lend = match self.recv_lend {
            Some(lend) => lend,
            None => {
                if buf.is_empty() || !self.conn.rx_waiting() {
                    return false;
                }
                let Some(wr_id) =
                    qp.datapath_mut()
                        .overlay_next_recv(BSDH_LEN, RECV_INTO, 0, buf.len())
                else {
                    return false;
                };
                let lend = RecvLend {
                    wr_id,
                    parked: false,
                    caught_up: 0,
                };
                self.recv_lend = Some(lend);
                if qp.datapath().overlay().is_some_and(|ov| ov.active) {
                    return true;
                }
                // The message is under way: what it placed so far is
                // caught up below, as after a park.
                lend
            }
        };
        let Some(ov) = qp.datapath().overlay().copied() else {
            self.recv_lend = None;
            return false;
        };
        let Some((at, n)) = qp.datapath_mut().resume_overlay() else {
            return false;
        };
        if n > 0 {
            // Placed in the Private Buffer while the reader was away, or
            // before it came: caught up.
            let src = self
                .conn
                .pool()
                .buffer(ov.from.region.0 as usize)
                .and_then(|b| b.get(at..at.checked_add(n)?));
            let start = ov.to_offset.saturating_add(ov.placed);
            let dst = buf.get_mut(start..start.saturating_add(n));
            if let (Some(src), Some(dst)) = (src, dst) {
                dst.copy_from_slice(src);
            }
        }
        self.recv_lend = Some(RecvLend {
            parked: false,
            caught_up: lend.caught_up.saturating_add(n),
            ..lend
        });
        true
    }

    /// The reader's pump is over: if its message is not whole, the overlay
    /// parks until the reader is back ([`Link::lend_recv`]) or leaves
    /// ([`Link::recv_done_waiting`]).
    pub fn park_recv(&mut self, qp: &mut Connection) {
        if let Some(lend) = &mut self.recv_lend {
            lend.parked = true;
            qp.datapath_mut().park_overlay();
        }
    }

    /// Receive completions held for a waiting reader that is away (the
    /// conn has not seen them yet; their buffers count as posted to it).
    pub fn recv_held(&self) -> usize {
        self.deferred.len()
    }

    /// Whether a reader's buffer is lent ([`Link::lend_recv`]) and
    /// [`Link::recv_done_waiting`] is due when its call ends.
    pub fn recv_lent(&self) -> bool {
        self.recv_lend.is_some()
    }

    /// The waiting reader's call ends (`buf` as lent): bytes placed in it
    /// for messages not handed over go back into the Private Buffers;
    /// completions held for it go to the conn. Returns whether there was
    /// anything to do (the caller drives the link then).
    pub fn recv_done_waiting(&mut self, now: Instant, qp: &mut Connection, buf: &[u8]) -> bool {
        let mut any = self.recv_lend.take().is_some();
        if !self.deferred.is_empty() {
            self.release_deferred(now, Some(buf), false);
            any = true;
        }
        while let Some(ov) = qp.datapath_mut().take_next_overlay() {
            self.copy_back(&ov, Some(buf));
            any = true;
        }
        any
    }

    /// Bytes placed straight into the waiting reader's buffer (from its
    /// start) and consumed; they are the reader's now.
    pub fn take_received_direct(&mut self) -> usize {
        core::mem::take(&mut self.received_direct)
    }

    /// A receive completion in [`Link::drive`]: true if it was taken care
    /// of here — one whose message landed in the waiting reader's buffer
    /// (settled now if the buffer is here, held otherwise), or one behind a
    /// held one.
    pub(super) fn lent_completion(
        &mut self,
        now: Instant,
        c: &Completion,
        qp: &mut Connection,
        buf: Option<&[u8]>,
    ) -> bool {
        if !self.deferred.is_empty() {
            let ov = qp.datapath_mut().take_overlay_done(c.wr_id);
            self.deferred.push_back((*c, ov));
            return true;
        }
        // Overlays are done in receive order, each with its completion.
        let Some(ov) = qp.datapath_mut().take_overlay_done(c.wr_id) else {
            if let Some(lend) = self.recv_lend.filter(|l| l.wr_id == c.wr_id) {
                // Nothing of this message reached the reader's buffer; the
                // next receive's payload goes there instead, if any.
                let next = qp.datapath().overlay().map(|ov| ov.wr_id);
                self.recv_lend = next.map(|wr_id| RecvLend { wr_id, ..lend });
            }
            return false;
        };
        let lend = self.recv_lend;
        if lend.is_some_and(|l| l.parked) || buf.is_none() {
            self.deferred.push_back((*c, Some(ov)));
            return true;
        }
        let caught_up = lend
            .filter(|l| l.wr_id == c.wr_id)
            .map_or(0, |l| l.caught_up);
        // The next message's payload may already be landing right behind.
        let next = qp.datapath().overlay().map(|ov| ov.wr_id);
        self.recv_lend = next.map(|wr_id| RecvLend {
            wr_id,
            parked: false,
            caught_up: 0,
        });
        if !self.settle(now, *c, ov, buf, true, caught_up) {
            self.break_chain(qp, buf);
        }
        true
    }

    /// A message of the reader's was copied back: those behind it in the
    /// reader's buffer go back too, and nothing more lands there.
    fn break_chain(&mut self, qp: &mut Connection, buf: Option<&[u8]>) {
        self.recv_lend = None;
        while let Some(ov) = qp.datapath_mut().take_next_overlay() {
            self.copy_back(&ov, buf);
        }
    }

    /// Hands the held completions to the conn in order: with `keep` the
    /// reader takes what landed in its buffer.
    fn release_deferred(&mut self, now: Instant, buf: Option<&[u8]>, keep: bool) {
        let mut caught_up = self.recv_lend.take().map_or(0, |l| l.caught_up);
        let mut keep = keep;
        while let Some((c, ov)) = self.deferred.pop_front() {
            match ov {
                Some(ov) => {
                    keep &= self.settle(now, c, ov, buf, keep, caught_up);
                    caught_up = 0;
                }
                None => self.on_completion(now, c),
            }
        }
    }

    /// Hands a completed receive whose message landed (partly) in the
    /// waiting reader's buffer to the conn: with `keep`, a plain Data
    /// Message's payload stays there and counts as read; otherwise the
    /// bytes go back into the Private Buffer first, where the conn parses
    /// and reads them. Returns whether they stayed.
    fn settle(
        &mut self,
        now: Instant,
        c: Completion,
        ov: RecvOverlay,
        buf: Option<&[u8]>,
        keep: bool,
        caught_up: usize,
    ) -> bool {
        let payload = (c.byte_len as usize).saturating_sub(BSDH_LEN);
        let direct = match buf {
            Some(_) if keep && self.plain_data(&c, &ov) => ov.placed.min(payload),
            _ => 0,
        };
        if direct == 0 {
            self.copy_back(&ov, buf);
        }
        self.on_completion(now, c);
        if direct == 0 {
            return false;
        }
        // The stream was empty (lend_recv, or the message before went to
        // the reader whole): these are its first bytes.
        if self.conn.consume_placed(direct, payload) {
            self.received_direct += direct;
            let caught_up = caught_up.min(direct);
            self.stats.bytes_copied_from_pool += caught_up as u64;
            self.stats.bytes_received_direct += (direct - caught_up) as u64;
            true
        } else {
            // Not taken as read (the conn refused the message): the bytes
            // belong where the conn looks for them.
            self.copy_back(&ov, buf);
            false
        }
    }

    /// A Data Message without OOB flags, whose payload starts right after
    /// the BSDH in the Private Buffer (where the BSDH landed).
    fn plain_data(&self, c: &Completion, ov: &RecvOverlay) -> bool {
        c.status == Status::Success
            && ov.wr_id == c.wr_id
            && ov.from.offset == BSDH_LEN
            && self
                .conn
                .pool()
                .buffer(ov.from.region.0 as usize)
                .and_then(|b| b.get(..BSDH_LEN))
                .and_then(|h| Bsdh::new_checked(h).ok())
                .is_some_and(|h| h.mid() == Mid::DATA && h.flags().is_empty())
    }

    /// Puts the bytes an overlay placed in the reader's buffer where the
    /// engine would have placed them.
    fn copy_back(&mut self, ov: &RecvOverlay, from: Option<&[u8]>) {
        let n = ov.placed.min(ov.from.len);
        let src = from.and_then(|b| b.get(ov.to_offset..ov.to_offset.checked_add(n)?));
        let dst = ov.from.offset.checked_add(n).and_then(|end| {
            self.conn
                .pool_mut()
                .range_mut(ov.from.region.0 as usize, ov.from.offset..end)
        });
        if let (Some(src), Some(dst)) = (src, dst) {
            dst.copy_from_slice(src);
            self.stats.bytes_copied_back += n as u64;
        }
    }
}

/// A direct send in progress: the send stream offsets whose bytes are in
/// the caller's buffers, and where: each part a region and its length,
/// in stream order (byte `span.start` at offset 0 of the first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SendSpan {
    pub span: Range<u64>,
    pub parts: Vec<(RegionId, u64)>,
}

impl SendSpan {
    /// The span `span` lent as one region.
    pub fn one(span: Range<u64>, region: RegionId) -> SendSpan {
        let len = span.end - span.start;
        SendSpan {
            span,
            parts: vec![(region, len)],
        }
    }

    /// The parts: region, stream offset of its first byte, length.
    pub fn parts(&self) -> impl Iterator<Item = (RegionId, u64, u64)> + '_ {
        self.parts
            .iter()
            .scan(self.span.start, |at, &(region, len)| {
                let start = *at;
                *at += len;
                Some((region, start, len))
            })
    }

    /// The part of a Data Message's payload range `payload` in the
    /// staging ring: the bytes before the span, copied by an earlier call.
    pub fn ring_part(&self, payload: Range<u64>) -> Range<u64> {
        payload.start..payload.start.max(self.span.start).min(payload.end)
    }

    /// Pushes onto `out`, in order, the gather elements of the bytes of
    /// `range` that lie in the caller's buffers.
    pub fn lent_sges(&self, range: Range<u64>, out: &mut Vec<iwarp::engine::Sge>) {
        for (region, start, len) in self.parts() {
            let lo = range.start.max(start);
            let hi = range.end.min(start + len);
            if lo < hi {
                out.push(iwarp::engine::Sge {
                    region,
                    offset: (lo - start) as usize,
                    len: (hi - lo) as usize,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sges(d: &SendSpan, payload: Range<u64>) -> (Range<u64>, Vec<(RegionId, usize, usize)>) {
        let ring = d.ring_part(payload.clone());
        let mut lent = Vec::new();
        d.lent_sges(ring.end..payload.end, &mut lent);
        (
            ring,
            lent.iter().map(|s| (s.region, s.offset, s.len)).collect(),
        )
    }

    #[test]
    fn payload_split_between_ring_and_caller() {
        let d = SendSpan::one(100..200, SEND_FROM);
        assert_eq!(sges(&d, 10..90), (10..90, vec![]));
        assert_eq!(sges(&d, 90..150), (90..100, vec![(SEND_FROM, 0, 50)]));
        assert_eq!(sges(&d, 120..200), (120..120, vec![(SEND_FROM, 20, 80)]));
    }

    #[test]
    fn payload_split_across_the_callers_buffers() {
        // A writev of 30, 0 and 70 bytes at stream offset 100.
        let d = SendSpan {
            span: 100..200,
            parts: vec![(send_from(0), 30), (send_from(1), 0), (send_from(2), 70)],
        };
        assert_eq!(
            sges(&d, 90..150),
            (90..100, vec![(send_from(0), 0, 30), (send_from(2), 0, 20)])
        );
        assert_eq!(sges(&d, 150..200), (150..150, vec![(send_from(2), 20, 50)]));
        // The regions are distinct and found again.
        let ids: Vec<RegionId> = (0..SEND_FROM_MAX).map(send_from).collect();
        for (i, id) in ids.iter().enumerate() {
            assert_eq!(send_from_index(*id), Some(i));
            assert!(ids[..i].iter().all(|x| x != id));
        }
        for other in [RECV_INTO, super::super::zcopy::SEND_ZCOPY, RegionId(0)] {
            assert_eq!(send_from_index(other), None);
        }
    }
}
