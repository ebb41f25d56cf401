//! The copy budget of DESIGN §7: caller memory lent to the engine for the
//! length of one call, and the counters that show which copies happened.
//!
//! * **Send** ([`super::Link::send_direct`]): the bytes a `write` accepts
//!   stay in the caller's buffer — region [`SEND_FROM`] of
//!   [`super::LinkMemory`] — while the Data Messages carrying them are
//!   posted and the driver writes what the socket takes straight from it
//!   (the CRC runs over those bytes once, where they lie). Before the call
//!   returns, [`super::Link::finish_direct`] copies into the staging ring
//!   only the bytes something still refers to — queued FPDUs not yet
//!   written, or bytes not yet posted for lack of credit — and moves the
//!   engine's references onto the ring ([`iwarp::engine::Rebase`]). What
//!   the socket took during the call was never copied.
//! * **Receive** ([`super::Link::recv_waiting`]): a reader that waits with
//!   an empty stream lends its buffer as region [`RECV_INTO`]; the engine
//!   places the payload part of the next receive buffer there (an overlay,
//!   [`iwarp::engine::RecvOverlay`]) while the BSDH still lands in the
//!   Private Buffer. When the message completes and is a plain Data
//!   Message, its payload is the reader's at once; anything else — another
//!   message, OOB data, the call ending before the message is whole — has
//!   its bytes copied back into the Private Buffer as if placed there.

use core::ops::Range;

use iwarp::mem::RegionId;

/// The caller's buffer during a direct send (read-only).
pub const SEND_FROM: RegionId = RegionId(u32::MAX - 2);
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
    /// (consuming reads; MSG_PEEK copies are not counted).
    pub bytes_copied_from_pool: u64,
}

/// A direct send in progress: the send stream offsets whose bytes are in
/// the caller's buffer (byte `span.start` at its offset 0).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SendSpan {
    pub span: Range<u64>,
}

impl SendSpan {
    /// Splits a Data Message's payload range into the part in the staging
    /// ring (older bytes, copied by an earlier call) and the gather
    /// element of the part in the caller's buffer.
    pub fn split(&self, payload: Range<u64>) -> (Range<u64>, Option<iwarp::engine::Sge>) {
        if payload.end <= self.span.start {
            return (payload, None);
        }
        let from = payload.start.max(self.span.start);
        let sge = iwarp::engine::Sge {
            region: SEND_FROM,
            offset: (from - self.span.start) as usize,
            len: (payload.end - from) as usize,
        };
        (payload.start..from, Some(sge))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_split_between_ring_and_caller() {
        let d = SendSpan { span: 100..200 };
        assert_eq!(d.split(10..90), (10..90, None));
        let (ring, sge) = d.split(90..150);
        assert_eq!(ring, 90..100);
        let sge = sge.unwrap();
        assert_eq!((sge.region, sge.offset, sge.len), (SEND_FROM, 0, 50));
        let (ring, sge) = d.split(120..200);
        assert_eq!(ring, 120..120);
        assert_eq!(sge.map(|s| (s.offset, s.len)), Some((20, 80)));
    }
}
