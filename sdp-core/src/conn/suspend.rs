//! Socket duplication as the Remote Peer (draft §13, §6.5).
//!
//! §13.1: "An SDP implementation is REQUIRED to support responding to a
//! socket duplication request using the procedure defined for the Remote
//! Peer in section 13.1.1." Initiating one is OPTIONAL and not offered
//! (except by the test-only Local Peer below).
//!
//! The Remote Peer's side, step by step:
//!
//! 1. A SuspComm arrives (step 3) with its Destination TCP Port
//!    (§6.5.1.1; the constants are checked by the wire parser, a bad one
//!    is a violation). Before setup finished it is not the HelloAck (a
//!    violation of §8.1.1); after a DisConn either way, or while another
//!    one is answered, it is a violation too (abortive close).
//! 2. No new Data Message goes; once every Send posted has completed
//!    (nothing is In-Process: this implementation does Bcopy only, so
//!    those Sends are all), the SuspCommAck (BSDH only, §6.5.2) goes, and
//!    after it no SDP Message at all (step 3).
//! 3. When the SuspCommAck's Send completed, the connection's last Op is
//!    [`Teardown::Resume`] with the port (step 4): the adapter closes the
//!    LLP connection and connects to the same peer address at that port.
//! 4. [`Conn::resume`] turns the connection into a Connecting Peer of the
//!    new LLP connection: a fresh Hello ([`Conn::hello`]) advertising
//!    fresh receive buffers, fresh credits and MSeq (§13.1.1 step 4:
//!    "Posting of receive Private Buffers and the contents of the HH MUST
//!    follow the same rules as connection setup"). The application's
//!    streams carry over: bytes accepted and not sent go on the new
//!    connection (at their send stream offsets, so the adapter's staging
//!    stays valid), bytes received and not read stay readable (their
//!    buffers are moved into the new pool and not posted until read), the
//!    urgent mark stays, OOB bytes not yet sent are announced again.
//!    Advertisements in progress are cancelled by the transition (§13): a
//!    SendSm owed for a SrcAvail is dropped. Data waits for the HelloAck
//!    (step 8); reads and writes of the application go on meanwhile.
//!
//! If the new connection fails — refused, MPA reject, Hello refused,
//! startup timeout, reset — the connection is lost for the application:
//! an abortive close with ECONNRESET, which is what a TCP program expects
//! of a connection that went away.
//!
//! §13.1.2 (both peers send SuspComm at once) cannot arise: this
//! implementation never sends one outside tests. The test-only Local
//! Peer answers a crossing SuspComm as a violation.

use super::close::Llp;
use super::credit::Credits;
use super::{setup, AbortConn, Conn, PostKind, Received, Role, Sent, State, Violation};
use crate::verbs::{Op, Teardown};
use crate::wire::{Body, Flags, Mid, SuspCommRepr};

/// The Remote Peer's progress through §13.1.1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Suspend {
    None,
    /// SuspComm received (step 3): the SuspCommAck goes once nothing is
    /// In-Process.
    Requested {
        port: u16,
    },
    /// SuspCommAck posted: no more SDP Messages (step 3).
    AckSent {
        port: u16,
    },
    /// Its Send completed: [`Teardown::Resume`] went (step 4).
    Suspended {
        port: u16,
    },
}

impl Suspend {
    /// The SuspCommAck went: nothing more goes on this LLP connection.
    pub(super) fn ack_sent(self) -> bool {
        matches!(self, Suspend::AckSent { .. } | Suspend::Suspended { .. })
    }
}

/// The Local Peer (Controlling Address Space) of a test, §13.1.1 step 2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LocalSuspend {
    None,
    /// SuspComm to go once nothing is In-Process and it provides credit.
    #[cfg_attr(not(any(test, feature = "testing")), allow(dead_code))]
    Pending {
        port: u16,
    },
    /// SuspComm sent: no more SDP Messages.
    Sent,
    /// The SuspCommAck arrived; the LLP connection may end.
    Acked,
}

impl Conn {
    /// The port of [`Teardown::Resume`], once the connection is suspended
    /// (the SuspCommAck completed) and [`Conn::resume`] may be called.
    pub fn resume_port(&self) -> Option<u16> {
        match self.suspend {
            Suspend::Suspended { port } => Some(port),
            _ => None,
        }
    }

    /// Whether a SuspComm is being answered or was answered (§13.1.1 steps
    /// 3–4): no new data goes out on this LLP connection.
    pub fn is_suspending(&self) -> bool {
        self.suspend != Suspend::None
    }

    pub(super) fn is_suspended(&self) -> bool {
        matches!(self.suspend, Suspend::Suspended { .. })
    }

    /// Whether a resumed connection still waits for the HelloAck of its
    /// new LLP connection.
    pub fn is_resuming(&self) -> bool {
        self.resuming
    }

    /// The connection on a new LLP connection after a socket duplication
    /// (§13.1.1 steps 4, 8); see the module documentation. `Err(self)`
    /// unless [`Conn::resume_port`] is `Some`. The first Ops are the
    /// PostRecvs of the fresh buffers; then the adapter connects and sends
    /// [`Conn::hello`] in the MPA Request, as for [`Conn::connect`].
    // The connection is handed back whole, as `TryFrom` impls do.
    #[allow(clippy::result_large_err)]
    pub fn resume(mut self) -> Result<Conn, Conn> {
        if self.resume_in_place() {
            Ok(self)
        } else {
            Err(self)
        }
    }

    /// [`Conn::resume`] without moving the connection; false (and nothing
    /// changed) unless it is suspended.
    pub fn resume_in_place(&mut self) -> bool {
        if !self.is_suspended() {
            return false;
        }
        let config = self.config.clone();
        let bufs = config.bufs;
        let (pool, rx) = self.rx.carry_over(&self.pool, usize::from(bufs));
        let held = rx.held_buffers();
        let mut fresh = Conn::with_pool(
            Role::Connecting,
            config,
            // §13.1.1 step 4: credits and MSeq as at connection setup.
            Credits::connecting(bufs),
            State::Connected,
            pool,
        );
        fresh.to_post = (held..held + usize::from(bufs))
            .map(|b| (b, PostKind::Initial))
            .collect();
        fresh.hello = Some(Box::new(setup::hello_message(&fresh.config)));
        fresh.resuming = true;
        let old = core::mem::replace(self, fresh);
        self.rx = rx;
        self.tx = old.tx;
        self.tx.renotify_urgent();
        self.urgent_notice = old.urgent_notice;
        self.ending = old.ending;
        self.reading = old.reading;
        self.deadline = old.deadline;
        self.next_send_id = old.next_send_id;
        true
    }

    /// A SuspComm arrived in buffer `buf` (§13.1.1 step 3).
    pub(super) fn on_susp_comm(&mut self, buf: usize, port: Option<u16>) {
        let Some(port) = port else {
            return self.violation(Violation::UnexpectedMessage(Mid::SUSP_COMM));
        };
        // After a DisConn either way the connection is closing: there is
        // no session to suspend. A second SuspComm, or one crossing the
        // test Local Peer's own (§13.1.2 cannot arise otherwise), is not
        // answered either.
        if self.peer_disconn.is_some()
            || self.ending.disconn_sent()
            || self.abort_conn != AbortConn::None
            || self.suspend != Suspend::None
            || self.local_suspend != LocalSuspend::None
        {
            return self.violation(Violation::UnexpectedMessage(Mid::SUSP_COMM));
        }
        // §13: "Any incomplete SinkAvail or SrcAvail advertisements were
        // effectively canceled during the transition to a new connection."
        // Carrying Zcopy buffers across is not built: a duplication while
        // an advertisement is outstanding ends the connection.
        let z = self.zcopy_state();
        if z.src_out + z.src_in + z.sink_out + z.sink_in > 0 {
            return self.violation(Violation::Unsupported(Mid::SUSP_COMM));
        }
        // Its buffer goes back at once, so the SuspCommAck provides credit
        // and may go with our last credit (§10.5: "If one credit is
        // available, an implementation MUST only send SDP Messages that
        // provide additional credits and do not contain ULP payload"; it
        // is BSDH only, §6.5.2). The Local Peer sends no more after its
        // SuspComm, so we cannot wait for credit from it: the SuspComm
        // must leave us one (this implementation's Local Peer sees to it).
        self.repost(buf, PostKind::Fresh);
        self.suspend = Suspend::Requested { port };
        self.control.clear();
    }

    /// While a socket duplication is under way: what [`Conn::poll_op`]
    /// sends (`Some`), or `None` to go on as usual.
    pub(super) fn suspend_gate(&mut self, control_ok: bool) -> Option<Option<Op>> {
        if self.resuming {
            // §13.1.1 step 8: data waits for the new connection's setup.
            return Some(None);
        }
        match self.local_suspend {
            LocalSuspend::None => {}
            LocalSuspend::Pending { port } => {
                // §13.1.1 step 2: "MUST wait for all In-Process data
                // transfer operations to complete, then it MUST send a
                // SuspComm Message".
                //
                // After it we "MUST NOT send additional SDP Messages": the
                // SuspComm is our last credit update, and buffers the
                // application frees later are never advertised. The
                // peer's messages still in flight may use up every buffer
                // it advertises, leaving the peer no credit for the
                // SuspCommAck (§10.5: "If no credits are available, an
                // implementation MUST NOT send any type of SDP Message").
                // So it goes only when it provides additional credit: the
                // peer's credit (never below zero) then rises by the gain,
                // to one at least, and that last credit may carry the
                // SuspCommAck, which provides credit too (see
                // `on_susp_comm`). Until the application frees a buffer,
                // the connection goes on as usual.
                if !self.sends.is_empty() || !control_ok || self.credits.gain() <= 0 {
                    return None;
                }
                self.local_suspend = LocalSuspend::Sent;
                let body = Body::SuspComm(SuspCommRepr { port });
                return Some(Some(self.emit(body, Flags::EMPTY, Sent::Other)));
            }
            // §13.1.1 step 2: "MUST NOT send additional SDP Messages".
            LocalSuspend::Sent | LocalSuspend::Acked => return Some(None),
        }
        match self.suspend {
            Suspend::None => None,
            Suspend::Requested { port } => {
                // §13.1.1 step 3: "MUST wait for all In-Process data
                // transfer operations to complete, then MUST send a
                // SuspCommAck Message". Bcopy Sends are the only
                // operations this implementation has In-Process.
                if !self.sends.is_empty() || !control_ok {
                    return Some(None);
                }
                self.suspend = Suspend::AckSent { port };
                Some(Some(self.emit(
                    Body::SuspCommAck,
                    Flags::EMPTY,
                    Sent::SuspCommAck,
                )))
            }
            // §13.1.1 step 3: "After sending the SuspCommAck Message, this
            // peer MUST NOT send any more SDP Messages".
            Suspend::AckSent { .. } | Suspend::Suspended { .. } => Some(None),
        }
    }

    /// The SuspCommAck's Send completed (§13.1.1 step 4: "MUST wait for
    /// completion of the send of the SuspCommAck Message, then close the
    /// LLP connection").
    pub(super) fn on_susp_comm_ack_done(&mut self) {
        if let Suspend::AckSent { port } = self.suspend {
            self.suspend = Suspend::Suspended { port };
            self.to_post.clear();
            if self.llp != Llp::Down {
                self.llp = Llp::Due(Teardown::Resume { port });
            }
        }
    }

    /// The first message on a resumed connection's new LLP connection: the
    /// HelloAck (§8.1.1 steps 2, 7), checked in `parse`.
    pub(super) fn on_resumed_hello_ack(&mut self, buf: usize, msg: &Received) {
        let Some(peer) = msg.hello_ack else {
            return self.violation(Violation::UnexpectedMessage(msg.mid));
        };
        self.take_hello_ack(peer);
        self.resuming = false;
        self.repost(buf, PostKind::Fresh);
    }

    /// Test-only Local Peer: sends a SuspComm for `port` once nothing is
    /// In-Process and a receive buffer was posted since our last message
    /// (so that the SuspComm gives the peer the credit for its
    /// SuspCommAck, §10.5), then nothing more; the SuspCommAck is awaited
    /// ([`Conn::susp_comm_acked`]) and the LLP connection's end is then a
    /// graceful close. The caller hands the connection's streams over
    /// itself. Not the §13.1.1 step 5 hand-over: for tests of the Remote
    /// Peer.
    #[cfg(any(test, feature = "testing"))]
    pub fn request_suspend(&mut self, port: u16) {
        if self.state == State::Connected && self.local_suspend == LocalSuspend::None {
            self.local_suspend = LocalSuspend::Pending { port };
        }
    }

    /// Test-only Local Peer: the SuspComm went (no more messages).
    pub fn susp_comm_sent(&self) -> bool {
        matches!(self.local_suspend, LocalSuspend::Sent | LocalSuspend::Acked)
    }

    /// Test-only Local Peer: the SuspCommAck arrived.
    pub fn susp_comm_acked(&self) -> bool {
        self.local_suspend == LocalSuspend::Acked
    }

    pub(super) fn on_local_susp_comm_ack(&mut self, buf: usize) {
        self.local_suspend = LocalSuspend::Acked;
        self.repost(buf, PostKind::Fresh);
    }
}
#[cfg(test)]
mod tests;
