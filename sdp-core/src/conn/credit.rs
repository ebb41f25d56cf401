//! Private buffer credits (draft §10.2–§10.5).
//!
//! Both directions of the §10.2 formula live here:
//!
//! * our send credit: `bufs − WrapSubtract(LSSeq − MSeqAck)` with Bufs and
//!   MSeqAck from the last message received;
//! * the peer's send credit as we last told it: the Bufs and MSeqAck of our
//!   last message, minus the messages received since — the number §10.5's
//!   "if the Remote Peer's credits drop to one or fewer" speaks of.
//!
//! # Sequence numbers at setup
//!
//! Hello and HelloAck both carry MSeq 0 (§6.2.1, §6.2.2) and the next message
//! of each peer carries MSeq 1 (§6.1.5). The Hello travels in Streaming Mode
//! and uses no Private Buffer; the HelloAck is an iWARP Send and uses one.
//! So the Accepting Peer treats the Hello's MSeqAck (0, "not checked on
//! receive") as "nothing acknowledged" (−1): its credit after sending the
//! HelloAck is the Hello's Bufs minus one. The Connecting Peer reads the
//! HelloAck's MSeqAck 0 as acknowledging the Hello (which used no buffer):
//! its credit is the HelloAck's Bufs. After that the formula holds as
//! written, and the first MSeqAck each peer sends is 0, as §6.1.6 requires.
//!
//! ```
//! use sdp_core::conn::credit::Credits;
//!
//! // The Connecting Peer posted 8 buffers and sent Hello (MSeq 0); the
//! // HelloAck said Bufs 4.
//! let mut c = Credits::connecting(8);
//! c.hello_ack_received(4);
//! assert_eq!(c.send_credit(), 4);
//! assert_eq!(c.remote_credit(), 7); // the HelloAck used one of our 8
//! ```

use std::collections::VecDeque;

/// §10.5: below this credit, no message with ULP payload may be sent.
pub const PAYLOAD_MIN_CREDIT: i64 = 3;
/// §10.5: below this credit, only messages that provide additional credit
/// (and carry no payload) may be sent.
pub const CONTROL_MIN_CREDIT: i64 = 2;

/// One of our messages as the peer will see it: what it advertised.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Advert {
    mseq: u32,
    bufs: u16,
    mseq_ack: u32,
}

/// What a received message needs checked against §10.5 before it is
/// accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CreditFault {
    /// MSeq is not the successor of the last MSeq received (§10.1).
    SequenceGap {
        /// The MSeq that should have come.
        expected: u32,
        /// The MSeq that came.
        got: u32,
    },
    /// MSeqAck acknowledges a message we never sent, or goes back
    /// (§6.1.6).
    BadAck,
    /// The peer had no credit left for this message (§10.5: "If no credits
    /// are available, an implementation MUST NOT send any type of SDP
    /// Message").
    NoCredit,
    /// ULP payload sent with fewer than three credits (§10.5).
    PayloadWithoutCredit,
    /// A message without payload that gives no credit, sent with the last
    /// credit (§10.5: "If one credit is available, an implementation MUST
    /// only send SDP Messages that provide additional credits").
    LastCreditMisused,
}

/// The credit state of one connection; see the module documentation.
#[derive(Debug, Clone)]
pub struct Credits {
    /// MSeq of the last message sent (LSSeq).
    lsseq: u32,
    /// Bufs of the last message received.
    peer_bufs: u16,
    /// MSeqAck of the last message received.
    peer_mseq_ack: u32,
    /// MSeq of the last message received: the MSeqAck we send.
    last_rcvd: u32,
    /// Receive Private Buffers posted and not yet used by a message: the
    /// Bufs we send (§6.1.3).
    posted: u32,
    /// Our messages the peer has not acknowledged, oldest first, starting
    /// with the one its last MSeqAck names.
    adverts: VecDeque<Advert>,
    /// Buffers posted since our last message, excluding buffers that held
    /// a pure credit update (see [`Credits::must_update`]).
    fresh: u32,
    /// The highest MSeqAck we may send while a SrcAvailCancel waits for
    /// In-Process RDMA Reads (§9.5.4).
    ack_hold: Option<u32>,
    /// MSeq of our SrcAvailCancel until an MSeqAck reaches it: the peer
    /// may hold its MSeqAck just below it (§9.5.4).
    peer_hold: Option<u32>,
}

impl Credits {
    /// The Connecting Peer, about to send its Hello (MSeq 0) with `posted`
    /// buffers posted.
    pub fn connecting(posted: u16) -> Credits {
        let mut adverts = VecDeque::new();
        // The Hello "acknowledges" nothing: −1, so the HelloAck counts
        // against its Bufs.
        adverts.push_back(Advert {
            mseq: 0,
            bufs: posted,
            mseq_ack: u32::MAX,
        });
        Credits {
            lsseq: 0,
            peer_bufs: 0,
            peer_mseq_ack: 0,
            last_rcvd: u32::MAX,
            posted: u32::from(posted),
            adverts,
            fresh: 0,
            ack_hold: None,
            peer_hold: None,
        }
    }

    /// §9.5.4: "The Data Sink MUST NOT update the value of MSeqAck to be
    /// sent in SDP Messages to greater than or equal to the MSeq value ...
    /// in the SrcAvailCancel Message until all In-Process SrcAvail
    /// advertisements have been completed": hold MSeqAck at `cancel_mseq`
    /// − 1, or (`None`) release it. Gratuitous updates wait meanwhile: a
    /// held MSeqAck gives the peer no credit back.
    pub fn hold_ack(&mut self, cancel_mseq: Option<u32>) {
        self.ack_hold = cancel_mseq.map(|m| m.wrapping_sub(1));
    }

    /// Our SrcAvailCancel went as MSeq `mseq`: until an MSeqAck reaches
    /// it, the peer may hold its MSeqAck below it while it goes on
    /// receiving our messages and using the credit they give (§10.2 does
    /// not depend on what the peer acknowledges), so a message from it
    /// acknowledging `mseq − 1` is judged by the most its credit can be.
    pub fn peer_may_hold(&mut self, mseq: u32) {
        self.peer_hold = Some(mseq);
    }

    /// Whether `mseq_ack` from the peer may be held below what it received
    /// (see [`Credits::peer_may_hold`]).
    pub fn peer_holds_at(&self, mseq_ack: u32) -> bool {
        self.peer_hold
            .is_some_and(|c| mseq_ack == c.wrapping_sub(1))
    }

    /// Whether MSeqAck is held (see [`Credits::hold_ack`]).
    pub fn ack_held(&self) -> bool {
        self.ack_hold.is_some()
    }

    /// The Connecting Peer received the HelloAck (MSeq 0, a Private Buffer
    /// used) with Bufs `bufs`.
    pub fn hello_ack_received(&mut self, bufs: u16) {
        self.peer_bufs = bufs;
        self.peer_mseq_ack = 0;
        self.last_rcvd = 0;
        self.posted = self.posted.saturating_sub(1);
    }

    /// The Accepting Peer received a Hello with Bufs `bufs`, and has
    /// `posted` buffers posted; nothing is sent yet.
    pub fn accepting(bufs: u16, posted: u16) -> Credits {
        Credits {
            // Nothing sent: the HelloAck will be MSeq 0.
            lsseq: u32::MAX,
            peer_bufs: bufs,
            peer_mseq_ack: u32::MAX,
            last_rcvd: 0,
            posted: u32::from(posted),
            adverts: VecDeque::new(),
            fresh: 0,
            ack_hold: None,
            peer_hold: None,
        }
    }

    /// §10.2: "New send credit = bufs − WrapSubtract(LSSeq − MSeqAck)".
    /// Negative only if the peer under-reports its buffers.
    pub fn send_credit(&self) -> i64 {
        i64::from(self.peer_bufs) - i64::from(self.lsseq.wrapping_sub(self.peer_mseq_ack))
    }

    /// The peer's send credit as our last message set it, less the
    /// messages it sent since (an upper bound: more may be in flight).
    pub fn remote_credit(&self) -> i64 {
        match self.adverts.back() {
            Some(a) => i64::from(a.bufs) - i64::from(self.last_rcvd.wrapping_sub(a.mseq_ack)),
            None => 0,
        }
    }

    /// By how much a message sent now would raise the peer's credit:
    /// buffers posted since our last message. A message "provides
    /// additional credits" (§10.5) when this is positive.
    pub fn gain(&self) -> i64 {
        // The peer sees new − old credit = Bufs − old Bufs + MSeqAck
        // advance; a held MSeqAck (§9.5.4) does not advance.
        match self.adverts.back() {
            Some(a) => {
                i64::from(self.posted) - i64::from(a.bufs)
                    + i64::from(self.mseq_ack().wrapping_sub(a.mseq_ack))
            }
            None => i64::from(self.posted),
        }
    }

    /// §10.5: "An SDP implementation MUST send an SDP Message that provides
    /// additional credit(s) if the Remote Peer's credits drop to one or
    /// fewer credits."
    ///
    /// Only buffers that held something other than a pure credit update
    /// count here. Re-posting the buffer a peer's credit update used only
    /// gives back what that update took; answering it with an update of
    /// our own would, between two peers whose applications hold nearly all
    /// buffers, trade updates forever. Those buffers still count in
    /// [`Credits::should_update`] once the gain reaches two.
    pub fn must_update(&self) -> bool {
        self.ack_hold.is_none() && self.remote_credit() <= 1 && self.fresh > 0
    }

    /// Whether to send a gratuitous update (§10.4) now, with `total` the
    /// number of Private Buffers: when §10.5 requires it, when the peer
    /// cannot send payload (credit below three) and we can give it two or
    /// more, or enough to send payload with a buffer our application
    /// freed, or when half the pool is waiting to be advertised.
    ///
    /// An update takes one buffer from the peer, which the peer gives back
    /// by re-posting it; requiring a gain of two, or a freed buffer, keeps
    /// two peers from answering each other's updates forever. The freed
    /// buffer matters to a peer stuck at two credits whose last request
    /// (§10.5's message at two credits) we answered with one buffer: our
    /// next one alone lets it send, and §10.5 no longer requires it.
    pub fn should_update(&self, total: u16) -> bool {
        let gain = self.gain();
        if gain <= 0 || self.ack_hold.is_some() {
            return false;
        }
        let remote = self.remote_credit();
        self.must_update()
            || (gain >= 2 && remote < PAYLOAD_MIN_CREDIT)
            || (self.fresh > 0
                && remote < PAYLOAD_MIN_CREDIT
                && remote + gain >= PAYLOAD_MIN_CREDIT)
            || gain >= i64::from(total / 2).max(2)
    }

    /// The BSDH Bufs field: buffers posted minus messages received
    /// (§6.1.3), at most 65535.
    pub fn bufs(&self) -> u16 {
        u16::try_from(self.posted).unwrap_or(u16::MAX)
    }

    /// The BSDH MSeqAck field: the MSeq of the last message received
    /// (§6.1.6).
    pub fn mseq_ack(&self) -> u32 {
        match self.ack_hold {
            // The hold is below every MSeq received since it began.
            Some(h) if self.last_rcvd.wrapping_sub(h) < 1 << 31 => h,
            _ => self.last_rcvd,
        }
    }

    /// MSeq of the last message sent.
    pub fn lsseq(&self) -> u32 {
        self.lsseq
    }

    /// Bufs of the last message received.
    pub fn peer_bufs(&self) -> u16 {
        self.peer_bufs
    }

    /// MSeqAck of the last message received.
    pub fn peer_mseq_ack(&self) -> u32 {
        self.peer_mseq_ack
    }

    /// Receive buffers posted and unused.
    pub fn posted(&self) -> u32 {
        self.posted
    }

    /// Records that a message goes out now and returns its (MSeq, Bufs,
    /// MSeqAck).
    pub fn on_send(&mut self) -> (u32, u16, u32) {
        self.lsseq = self.lsseq.wrapping_add(1);
        let advert = Advert {
            mseq: self.lsseq,
            bufs: self.bufs(),
            mseq_ack: self.mseq_ack(),
        };
        self.adverts.push_back(advert);
        self.fresh = 0;
        (advert.mseq, advert.bufs, advert.mseq_ack)
    }

    /// A receive buffer was posted. `fresh` is false for a buffer that held
    /// a pure credit update (see [`Credits::must_update`]).
    pub fn on_post(&mut self, fresh: bool) {
        self.posted = self.posted.saturating_add(1);
        if fresh {
            self.fresh = self.fresh.saturating_add(1);
        }
    }

    /// Checks a received message's BSDH against §10.1 and §10.5, and on
    /// success takes its Bufs and MSeqAck and counts the buffer it used.
    /// `payload` tells whether it carried ULP payload. Nothing changes on
    /// error.
    pub fn on_receive(
        &mut self,
        mseq: u32,
        mseq_ack: u32,
        bufs: u16,
        payload: bool,
    ) -> Result<(), CreditFault> {
        // §10.1: "The SDP receiver MUST process all SDP Messages in BSDH
        // MSeq order"; §6.1.5: each message increases MSeq by one.
        let expected = self.last_rcvd.wrapping_add(1);
        if mseq != expected {
            return Err(CreditFault::SequenceGap {
                expected,
                got: mseq,
            });
        }
        // §6.1.6: MSeqAck is "the sequence number of the last SDP Message
        // received": never beyond LSSeq, never back.
        let outstanding = self.lsseq.wrapping_sub(self.peer_mseq_ack);
        let advance = mseq_ack.wrapping_sub(self.peer_mseq_ack);
        if advance > outstanding {
            return Err(CreditFault::BadAck);
        }
        // The peer's credit when it sent this message, from what our
        // message number `mseq_ack` advertised (§10.2 at the peer, with its
        // LSSeq = mseq − 1).
        let Some(advert) = self.adverts.iter().find(|a| a.mseq == mseq_ack) else {
            return Err(CreditFault::BadAck);
        };
        let their_lsseq = mseq.wrapping_sub(1);
        let credit_from =
            |a: &Advert| i64::from(a.bufs) - i64::from(their_lsseq.wrapping_sub(a.mseq_ack));
        let credit = if self.peer_holds_at(mseq_ack) {
            // Any of our messages since may have reached it.
            self.adverts
                .iter()
                .map(credit_from)
                .max()
                .unwrap_or_else(|| credit_from(advert))
        } else {
            credit_from(advert)
        };
        // §10.5: "If no credits are available, an implementation MUST NOT
        // send any type of SDP Message."
        if credit <= 0 {
            return Err(CreditFault::NoCredit);
        }
        // §10.5: "If two credits are available, an implementation MUST only
        // send SDP Messages that do not contain ULP payload."
        if payload && credit < PAYLOAD_MIN_CREDIT {
            return Err(CreditFault::PayloadWithoutCredit);
        }
        // §10.5: "If one credit is available, an implementation MUST only
        // send SDP Messages that provide additional credits and do not
        // contain ULP payload." Whether it provided credit does not depend
        // on our LSSeq
        // (new credit − old credit = Bufs − old Bufs + MSeqAck advance).
        if credit == 1 && i64::from(bufs) + i64::from(advance) <= i64::from(self.peer_bufs) {
            return Err(CreditFault::LastCreditMisused);
        }
        self.last_rcvd = mseq;
        if self
            .peer_hold
            .is_some_and(|c| mseq_ack.wrapping_sub(c) < 1 << 31)
        {
            self.peer_hold = None;
        }
        self.peer_bufs = bufs;
        self.peer_mseq_ack = mseq_ack;
        while self.adverts.front().is_some_and(|a| a.mseq != mseq_ack) {
            self.adverts.pop_front();
        }
        self.posted = self.posted.saturating_sub(1);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pair of credit states after setup: Connecting Peer with 8 buffers,
    /// Accepting Peer with 5.
    fn pair() -> (Credits, Credits) {
        let mut c = Credits::connecting(8);
        let mut a = Credits::accepting(8, 5);
        // The Accepting Peer sends the HelloAck.
        assert_eq!(a.on_send(), (0, 5, 0));
        c.hello_ack_received(5);
        (c, a)
    }

    #[test]
    fn setup_credits_count_the_hello_ack_buffer() {
        let (c, a) = pair();
        assert_eq!(c.send_credit(), 5);
        assert_eq!(a.send_credit(), 7);
        assert_eq!(c.remote_credit(), 7);
        assert_eq!(a.remote_credit(), 5);
        assert_eq!((c.bufs(), c.mseq_ack()), (7, 0));
        assert_eq!((a.bufs(), a.mseq_ack()), (5, 0));
    }

    #[test]
    fn formula_tracks_messages_both_ways() {
        let (mut c, mut a) = pair();
        // c sends MSeq 1 with payload.
        let (mseq, bufs, ack) = c.on_send();
        assert_eq!((mseq, bufs, ack), (1, 7, 0));
        assert_eq!(c.send_credit(), 4);
        a.on_receive(mseq, ack, bufs, true).unwrap();
        assert_eq!(a.posted(), 4);
        assert_eq!(a.remote_credit(), 4);
        // a re-posts and answers.
        a.on_post(true);
        assert_eq!(a.gain(), 1);
        let (mseq, bufs, ack) = a.on_send();
        assert_eq!((mseq, bufs, ack), (1, 5, 1));
        c.on_receive(mseq, ack, bufs, false).unwrap();
        assert_eq!(c.send_credit(), 5);
        assert_eq!(c.remote_credit(), 6);
    }

    #[test]
    fn faults_are_detected_and_change_nothing() {
        let (_, mut a) = pair();
        let before = a.clone();
        assert_eq!(
            a.on_receive(2, 0, 8, false),
            Err(CreditFault::SequenceGap {
                expected: 1,
                got: 2
            })
        );
        assert_eq!(a.on_receive(1, 1, 8, false), Err(CreditFault::BadAck));
        assert_eq!(a.posted(), before.posted());
        assert_eq!(a.mseq_ack(), before.mseq_ack());
    }

    #[test]
    fn section_10_5_thresholds_at_the_receiver() {
        // The Accepting Peer advertised 3 buffers; the Connecting Peer may
        // send one payload message, then control only.
        let mut c = Credits::connecting(8);
        let mut a = Credits::accepting(8, 3);
        a.on_send();
        c.hello_ack_received(3);
        // Credit 3: payload allowed.
        a.on_receive(1, 0, 7, true).unwrap();
        // Credit 2: payload refused.
        let mut a2 = a.clone();
        assert_eq!(
            a2.on_receive(2, 0, 7, true),
            Err(CreditFault::PayloadWithoutCredit)
        );
        // Credit 2, no payload: fine.
        a.on_receive(2, 0, 7, false).unwrap();
        // Credit 1, no payload, no new credit: refused.
        let mut a3 = a.clone();
        assert_eq!(
            a3.on_receive(3, 0, 7, false),
            Err(CreditFault::LastCreditMisused)
        );
        // Credit 1, providing credit: fine.
        a.on_receive(3, 0, 8, false).unwrap();
        // Credit 0: nothing.
        assert_eq!(a.on_receive(4, 0, 9, false), Err(CreditFault::NoCredit));
    }

    #[test]
    fn update_policy() {
        let (mut c, mut a) = pair();
        // Nothing re-posted: no update.
        assert!(!a.should_update(5));
        // c sends four messages; a's view of c's credit drops to 1.
        for _ in 0..4 {
            let (m, b, k) = c.on_send();
            a.on_receive(m, k, b, false).unwrap();
        }
        assert_eq!(a.remote_credit(), 1);
        assert!(!a.must_update());
        // A re-posted pure-update buffer alone does not force an update.
        a.on_post(false);
        assert!(!a.must_update());
        assert!(!a.should_update(5));
        // A data buffer does.
        a.on_post(true);
        assert!(a.must_update());
        assert!(a.should_update(5));
    }

    #[test]
    fn a_freed_buffer_that_lets_the_peer_send_goes_at_once() {
        let (mut c, mut a) = pair();
        // c sends three messages: a's view of c's credit is 2, too few
        // for payload, and §10.5 does not require an update at 2.
        for _ in 0..3 {
            let (m, b, k) = c.on_send();
            a.on_receive(m, k, b, false).unwrap();
        }
        assert_eq!(a.remote_credit(), 2);
        // Giving back a buffer a credit request used: not for that alone
        // (two stuck peers would trade requests and updates for ever).
        let mut pure = a.clone();
        pure.on_post(false);
        assert!(!pure.should_update(5));
        // A buffer the application freed: c can send with it.
        a.on_post(true);
        assert!(!a.must_update());
        assert!(a.should_update(5));
    }
}
