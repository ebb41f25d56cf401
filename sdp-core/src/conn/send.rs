//! The send stream at the Data Source (draft §9.1 Bcopy, §9.5.3 OOB).
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

/// §9.5.3: "no more than 65,535 (2^16-1) bytes of data are sent between the
/// flag and its associated Out-Of-Band data byte".
pub const OOB_PEND_REACH: u64 = 65_535;

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
/// The tail goes when the next write fills its message, when the wait
/// runs out, or at once after [`Hold::push`].
#[derive(Debug, Clone, Default)]
pub struct Hold {
    /// A write came since the last [`Hold::tick`]: whether it was large.
    wrote: Option<bool>,
    /// A write before this time follows the last one closely.
    close_until: Option<Instant>,
    /// The last write was large and followed the one before closely.
    streaming: bool,
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
            self.streaming = large && self.close_until.is_some_and(|t| now < t);
            self.close_until = Some(now + wait);
        }
        if self.until.is_some_and(|t| now >= t) {
            self.push();
        }
    }

    /// Whether a short tail, all that is left to send, waits now.
    pub fn holds(&mut self, now: Instant, wait: Duration) -> bool {
        if self.pushed || !self.streaming {
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
        assert!(!h.holds(t0, WAIT));
        // The next one, 20 µs later, holds its tail for the wait.
        h.wrote(true, false);
        h.tick(at(t0, 20), WAIT);
        assert!(h.holds(at(t0, 30), WAIT));
        assert!(h.holding());
        assert_eq!(h.deadline(), Some(at(t0, 30) + WAIT));
        // A small write close behind sends its bytes.
        h.wrote(false, false);
        h.tick(at(t0, 40), WAIT);
        assert!(!h.holds(at(t0, 40), WAIT));
        assert_eq!(h.deadline(), None);
        // A large write long after the last one starts a burst again.
        h.wrote(true, false);
        h.tick(at(t0, 40) + WAIT, WAIT);
        assert!(!h.holds(at(t0, 40) + WAIT, WAIT));
    }

    #[test]
    fn a_held_tail_goes_when_the_wait_ends_or_on_a_push() {
        let t0 = Instant::now();
        let mut h = Hold::default();
        h.wrote(true, false);
        h.tick(t0, WAIT);
        h.wrote(true, false);
        h.tick(at(t0, 10), WAIT);
        assert!(h.holds(at(t0, 10), WAIT));
        // The wait runs out.
        h.tick(at(t0, 10) + WAIT, WAIT);
        assert!(!h.holding());
        assert!(!h.holds(at(t0, 11) + WAIT, WAIT));
        // That write came a whole wait after the one before: the next
        // one is the first of a burst, the one after it holds until a
        // push.
        let t1 = at(t0, 20) + WAIT;
        h.wrote(true, false);
        h.tick(t1, WAIT);
        assert!(!h.holds(t1, WAIT));
        h.wrote(true, false);
        h.tick(at(t1, 10), WAIT);
        assert!(h.holds(at(t1, 10), WAIT));
        h.push();
        assert!(!h.holds(at(t1, 11), WAIT));
        assert_eq!(h.deadline(), None);
        // An urgent write holds nothing back.
        h.wrote(true, true);
        h.tick(at(t1, 20), WAIT);
        assert!(!h.holds(at(t1, 20), WAIT));
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
