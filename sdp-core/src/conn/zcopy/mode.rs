//! Flow Control Modes (draft §11) and their transitions (§12): the Mode
//! of each half-connection, ModeChange sent and received, and the
//! acknowledgement a Pipelined → Combined change waits for (§12.4).

use super::Reg;
use crate::conn::{Conn, Control, FlowControlMode, Pipelining, State, Violation};
use crate::errno::Error;
use crate::verbs::RdmaOp;
use crate::wire::{Body, Flags, Mid, Mode, ModeChangeRepr};

/// The wire Mode of a Flow Control Mode.
fn wire_mode(m: FlowControlMode) -> Mode {
    match m {
        FlowControlMode::Buffered => Mode::BUFF_MODE,
        FlowControlMode::Combined => Mode::COMB_MODE,
        FlowControlMode::Pipelined => Mode::PIPE_MODE,
    }
}

impl Conn {
    pub(crate) fn zsend_mode(&self) -> FlowControlMode {
        self.z.send_mode.unwrap_or(FlowControlMode::Combined)
    }

    pub(crate) fn zrecv_mode(&self) -> FlowControlMode {
        self.z.recv_mode.unwrap_or(FlowControlMode::Combined)
    }

    /// As Mode Master of our send half (§12.1, §12.3, §12.4), moves it to
    /// `mode`: Combined → Buffered once no SrcAvail is outstanding,
    /// Combined ↔ Pipelined. EINVAL for a transition outside Figure 26 or
    /// while we are Mode Slave (Buffered: the Data Sink is master); EAGAIN
    /// while a transition is under way.
    pub fn set_send_mode(&mut self, mode: FlowControlMode) -> Result<(), Error> {
        use FlowControlMode::*;
        if self.state != State::Connected {
            return Err(Error::NotConnected);
        }
        match (self.zsend_mode(), mode) {
            (Combined, Buffered) | (Combined, Pipelined) | (Pipelined, Combined) => {}
            _ => return Err(Error::InvalidInput),
        }
        if self.z.mode_change.is_some() || self.z.mode_ack.is_some() || self.mode_change_queued() {
            return Err(Error::WouldBlock);
        }
        self.z.mode_change = Some((false, mode));
        Ok(())
    }

    /// As Mode Master of our receive half in Buffered Mode (§12.2), moves
    /// it to Combined Mode. EINVAL otherwise.
    pub fn set_recv_mode(&mut self, mode: FlowControlMode) -> Result<(), Error> {
        if self.state != State::Connected {
            return Err(Error::NotConnected);
        }
        if self.zrecv_mode() != FlowControlMode::Buffered || mode != FlowControlMode::Combined {
            return Err(Error::InvalidInput);
        }
        if self.z.mode_change.is_some() || self.mode_change_queued() {
            return Err(Error::WouldBlock);
        }
        self.z.mode_change = Some((true, mode));
        Ok(())
    }

    pub(super) fn want_send_mode(&mut self, mode: FlowControlMode) {
        if self.z.mode_change.is_none()
            && self.z.mode_ack.is_none()
            && !self.mode_change_queued()
            && self.zsend_mode() != mode
        {
            self.z.mode_change = Some((false, mode));
        }
    }

    pub(super) fn mode_violation(&self, mid: Mid) -> Violation {
        match self.zrecv_mode() {
            FlowControlMode::Pipelined => Violation::PipelinedMode(mid),
            _ => Violation::CombinedMode(mid),
        }
    }

    /// Queues the ModeChange the policy or the application asked for, once
    /// §12 allows it.
    pub(super) fn mode_progress(&mut self) {
        if self.state != State::Connected {
            return;
        }
        if self.config.pipelining == Pipelining::Always
            && self.zsend_mode() == FlowControlMode::Combined
            && self.z.mode_ack.is_none()
        {
            self.want_send_mode(FlowControlMode::Pipelined);
        }
        let Some((send, mode)) = self.z.mode_change else {
            return;
        };
        if self.mode_change_queued() {
            return;
        }
        if !send {
            match (self.zsend_mode(), mode) {
                // §12.1: "The Data Source MUST NOT send the ModeChange
                // Message until all Unprocessed or In-Process Read Zcopy
                // transfers have been moved to the Processed state".
                (FlowControlMode::Combined, FlowControlMode::Buffered)
                    if !self.z.srcs.is_empty() || self.z.pending_src.is_some() =>
                {
                    return;
                }
                // §12.4: "the Data Source MUST complete any RDMA Writes that
                // are In-Process, and issue all RdmaWrCompl Messages before
                // sending a ModeChange Message".
                (FlowControlMode::Pipelined, FlowControlMode::Combined)
                    if self.z.writing.is_some() || self.control_pending_wr_compl() =>
                {
                    return;
                }
                _ => {}
            }
        }
        self.z.mode_change = None;
        self.control.push_back(Control::ModeChange { send, mode });
    }

    /// Our ModeChange goes out as MSeq `mseq`: "The Mode Master MUST change
    /// its Flow Control Mode immediately after sending a ModeChange
    /// Message" (§12).
    pub(crate) fn on_mode_change_sent(&mut self, mseq: u32, send: bool, mode: FlowControlMode) {
        self.z.stats.mode_changes += 1;
        if send {
            self.z.recv_mode = Some(mode);
            return;
        }
        let from = self.zsend_mode();
        self.z.send_mode = Some(mode);
        if from == FlowControlMode::Pipelined && mode == FlowControlMode::Combined {
            // §12.4, Figure 28: discard incomplete SinkAvails (and with
            // them the SrcAvails they overrode), then ignore SinkAvails
            // until the ModeChange is acknowledged.
            let mut valid = false;
            while let Some(s) = self.z.sinks.pop_front() {
                if s.non_discards != self.z.pnd {
                    self.z.pnd = self.z.pnd.wrapping_sub(1);
                } else {
                    valid = true;
                }
            }
            if valid {
                self.drop_srcs();
            }
            self.z.mode_ack = Some(mseq);
            self.z.pnd_at_mode_change = self.z.pnd;
            self.z.last_src_before_mode_change = self.z.srcs.back().map(|s| s.n);
        }
        if mode != FlowControlMode::Combined {
            self.z.send_sms_in_row = 0;
        }
    }

    /// The MSeqAck of every received message (§12.4).
    pub(crate) fn on_mseq_ack(&mut self, mseq_ack: u32) {
        if let Some(m) = self.z.mode_ack {
            // "MSeqAck >= (MSeq of the ModeChange Message)", signed.
            if (mseq_ack.wrapping_sub(m) as i32) >= 0 {
                self.z.mode_ack = None;
            }
        }
    }

    /// ModeChange received (§6.3.8, §12, Figures 30–31).
    pub(crate) fn on_mode_change(&mut self, mch: ModeChangeRepr) {
        use FlowControlMode::*;
        let to = match mch.mode {
            Mode::BUFF_MODE => Buffered,
            Mode::COMB_MODE => Combined,
            _ => Pipelined,
        };
        let from = if mch.send {
            self.zsend_mode()
        } else {
            self.zrecv_mode()
        };
        // Figure 26 and Figure 27: the Data Sink is master only in Buffered
        // Mode (S=1, to Combined); the Data Source otherwise (S=0).
        let ok = match (mch.send, from, to) {
            (true, Buffered, Combined) => true,
            (false, Combined, Buffered) => self.z.srcs_in.is_empty(),
            (false, Combined, Pipelined) | (false, Pipelined, Combined) => true,
            _ => false,
        };
        if !ok {
            return self.violation(Violation::BadModeChange {
                send: mch.send,
                from,
                to: mch.mode.0,
            });
        }
        if mch.send {
            self.z.send_mode = Some(to);
            return;
        }
        self.z.recv_mode = Some(to);
        if from == Pipelined {
            // Figure 29: "Stop sending SinkAvail Messages", "Discard all
            // outstanding SinkAvails".
            self.drop_advertised();
            self.z.sink_cancel_crossed = core::mem::take(&mut self.z.sink_cancel);
            for p in &mut self.z.posted {
                if let Reg::Done { mem, .. } | Reg::Pending(mem) = p.reg {
                    self.rdma_out.push_back(RdmaOp::Deregister { mem });
                    p.reg = Reg::None;
                }
            }
        }
    }

    /// The Data Sink's REQ_PIPE preference for our RdmaRdCompl and
    /// RdmaWrCompl (§6.1.2).
    pub(crate) fn req_pipe_flag(&self) -> Flags {
        if self.config.req_pipe && self.zrecv_mode() != FlowControlMode::Buffered {
            Flags::REQ_PIPE
        } else {
            Flags::EMPTY
        }
    }

    /// The ModeChange body.
    pub(crate) fn mode_change_body(send: bool, mode: FlowControlMode) -> Body<'static> {
        Body::ModeChange(ModeChangeRepr {
            send,
            mode: wire_mode(mode),
        })
    }
}
