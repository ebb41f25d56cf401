//! PLACEHOLDER for the MPA startup machine (RFC 5044 §7.1, RFC 6581).
//!
//! The worker "startup" owns this file; this stand-in only implements the
//! interface fixed in `briefs/engine.md` well enough for the data path's
//! `Connection` to compile and be tested: Request/Reply exchange, Rev 1
//! and 2, IRD/ORD and RTR choice, accept/reject, a whole-startup timeout.
//! It is to be replaced by the real module on merge.

use core::fmt;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::wire::mpa::{EnhancedRepr, Frame, FrameKind, FrameRepr, HEADER_LEN, REV_1, REV_2};
use crate::wire::terminate::TermCode;

/// Startup parameters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartupConfig {
    /// 2 = enhanced (RFC 6581), 1 = RFC 5044 only.
    pub rev: u8,
    /// Our C bit.
    pub crc: bool,
    /// Our M bit: we require the peer to send markers.
    pub markers: bool,
    /// Local IRD.
    pub ird: u16,
    /// Local ORD.
    pub ord: u16,
    /// A bit.
    pub peer_to_peer: bool,
    /// RTR options offered (initiator) or supported (responder).
    pub rtr: RtrSet,
    /// The whole startup must finish within this.
    pub timeout: Duration,
}

impl Default for StartupConfig {
    fn default() -> StartupConfig {
        StartupConfig {
            rev: REV_2,
            crc: true,
            markers: false,
            ird: 16,
            ord: 16,
            peer_to_peer: true,
            rtr: RtrSet {
                send: true,
                write: true,
                read: true,
            },
            timeout: Duration::from_secs(5),
        }
    }
}

/// A set of RTR options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RtrSet {
    pub send: bool,
    pub write: bool,
    pub read: bool,
}

/// A zero-length Send, RDMA Write or RDMA Read as RTR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rtr {
    Send,
    Write,
    Read,
}

/// What the startup negotiated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Negotiated {
    pub rev: u8,
    pub crc: bool,
    pub tx_markers: bool,
    pub rx_markers: bool,
    pub ird: u16,
    pub ord: u16,
    pub peer_ird: u16,
    pub peer_ord: u16,
    pub rtr: Option<Rtr>,
    pub peer_private_data: Vec<u8>,
}

/// What the startup reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupEvent {
    Request {
        rev: u8,
        private_data: Vec<u8>,
        peer_ird: u16,
        peer_ord: u16,
    },
    Established(Negotiated),
    Rejected {
        private_data: Vec<u8>,
        peer_ird: u16,
        peer_ord: u16,
    },
    Failed {
        code: TermCode,
        send_terminate: bool,
    },
}

/// A call at the wrong time or with bad arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartupError {
    /// Not possible in this state.
    InvalidState,
    /// Private data too long or IRD/ORD out of range.
    InvalidArgument,
}

impl fmt::Display for StartupError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            StartupError::InvalidState => "not possible in this startup state",
            StartupError::InvalidArgument => "invalid startup argument",
        })
    }
}

impl std::error::Error for StartupError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitFrame,
    AwaitUlp,
    Done,
}

/// Rev, M, C, enhanced data and ULP data of a received Request.
type Request = (u8, bool, bool, Option<EnhancedRepr>, Vec<u8>);

/// The startup machine (placeholder).
#[derive(Debug)]
pub struct Startup {
    cfg: StartupConfig,
    initiator: bool,
    phase: Phase,
    buf: Vec<u8>,
    deadline: Instant,
    tx: VecDeque<Vec<u8>>,
    events: VecDeque<StartupEvent>,
    /// Responder: the Request.
    request: Option<Request>,
}

fn frame(
    kind: FrameKind,
    cfg: &StartupConfig,
    rev: u8,
    rejected: bool,
    enhanced: Option<EnhancedRepr>,
    pd: &[u8],
) -> Result<Vec<u8>, StartupError> {
    let mut private = Vec::new();
    if let Some(e) = enhanced {
        private.extend_from_slice(&e.to_bytes().map_err(|_| StartupError::InvalidArgument)?);
    }
    private.extend_from_slice(pd);
    FrameRepr {
        kind,
        markers: cfg.markers,
        crc: cfg.crc,
        rejected,
        enhanced: enhanced.is_some(),
        rev,
        private_data: &private,
    }
    .to_vec()
    .map_err(|_| StartupError::InvalidArgument)
}

impl Startup {
    /// Starts as initiator: the Request is queued.
    pub fn initiator(
        cfg: StartupConfig,
        private_data: &[u8],
        now: Instant,
    ) -> Result<Startup, StartupError> {
        let enhanced = (cfg.rev >= REV_2).then_some(EnhancedRepr {
            peer_to_peer: cfg.peer_to_peer,
            rtr_send: cfg.peer_to_peer && cfg.rtr.send,
            rtr_write: cfg.peer_to_peer && cfg.rtr.write,
            rtr_read: cfg.peer_to_peer && cfg.rtr.read,
            ird: cfg.ird,
            ord: cfg.ord,
        });
        let request = frame(
            FrameKind::Request,
            &cfg,
            cfg.rev,
            false,
            enhanced,
            private_data,
        )?;
        let mut s = Startup::new(cfg, true, now);
        s.tx.push_back(request);
        Ok(s)
    }

    /// Starts as responder.
    pub fn responder(cfg: StartupConfig, now: Instant) -> Startup {
        Startup::new(cfg, false, now)
    }

    fn new(cfg: StartupConfig, initiator: bool, now: Instant) -> Startup {
        Startup {
            cfg,
            initiator,
            phase: Phase::AwaitFrame,
            buf: Vec::new(),
            deadline: now + cfg.timeout,
            tx: VecDeque::new(),
            events: VecDeque::new(),
            request: None,
        }
    }

    fn fail(&mut self, code: TermCode, send_terminate: bool) {
        self.phase = Phase::Done;
        self.events.push_back(StartupEvent::Failed {
            code,
            send_terminate,
        });
    }

    /// Consumes bytes of the peer's frame, never past it.
    pub fn handle_input(&mut self, _now: Instant, data: &[u8]) -> usize {
        if self.phase != Phase::AwaitFrame {
            return 0;
        }
        let mut used = 0;
        if self.buf.len() < HEADER_LEN {
            let n = (HEADER_LEN - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..n]);
            used = n;
            if self.buf.len() < HEADER_LEN {
                return used;
            }
        }
        let total = match Frame::<&[u8]>::frame_len(&self.buf) {
            Ok(t) => t,
            Err(e) => {
                self.fail(e.into(), false);
                return used;
            }
        };
        let n = (total - self.buf.len()).min(data.len() - used);
        self.buf.extend_from_slice(&data[used..used + n]);
        used += n;
        if self.buf.len() == total {
            self.on_frame();
        }
        used
    }

    fn on_frame(&mut self) {
        let buf = core::mem::take(&mut self.buf);
        let parsed = Frame::new_checked(&buf[..])
            .and_then(|f| FrameRepr::parse(&f))
            .and_then(|r| r.split_private_data().map(|(e, pd)| (r, e, pd.to_vec())));
        let (repr, enh, pd) = match parsed {
            Ok(x) => x,
            Err(e) => return self.fail(e.into(), false),
        };
        let want = if self.initiator {
            FrameKind::Reply
        } else {
            FrameKind::Request
        };
        if repr.kind != want || !(repr.rev == REV_1 || repr.rev == REV_2) {
            return self.fail(TermCode::MPA_INVALID_FRAME, false);
        }
        let (peer_ird, peer_ord) = enh.map_or((0, 0), |e| (e.ird, e.ord));
        if !self.initiator {
            self.request = Some((repr.rev, repr.markers, repr.crc, enh, pd.clone()));
            self.phase = Phase::AwaitUlp;
            self.events.push_back(StartupEvent::Request {
                rev: repr.rev,
                private_data: pd,
                peer_ird,
                peer_ord,
            });
            return;
        }
        self.phase = Phase::Done;
        if repr.rejected {
            self.events.push_back(StartupEvent::Rejected {
                private_data: pd,
                peer_ird,
                peer_ord,
            });
            return;
        }
        let (mut ird, mut ord) = (self.cfg.ird, self.cfg.ord);
        let mut rtr = None;
        if let Some(e) = enh {
            // RFC 6581 §9.1: IRD at least the responder ORD, ORD at most
            // the responder IRD.
            if e.ord > ird {
                return self.fail(TermCode::MPA_INSUFFICIENT_IRD, true);
            }
            ird = ird.max(e.ord);
            ord = ord.min(e.ird);
            if self.cfg.peer_to_peer && e.peer_to_peer {
                let c = self.cfg.rtr;
                rtr = if c.write && e.rtr_write {
                    Some(Rtr::Write)
                } else if c.read && e.rtr_read {
                    Some(Rtr::Read)
                } else if c.send && e.rtr_send {
                    Some(Rtr::Send)
                } else {
                    return self.fail(TermCode::MPA_NO_MATCHING_RTR, true);
                };
            }
        }
        self.events.push_back(StartupEvent::Established(Negotiated {
            rev: repr.rev,
            crc: self.cfg.crc || repr.crc,
            tx_markers: repr.markers,
            rx_markers: self.cfg.markers,
            ird,
            ord,
            peer_ird,
            peer_ord,
            rtr,
            peer_private_data: pd,
        }));
    }

    /// Responder: accept the Request.
    pub fn accept(&mut self, private_data: &[u8]) -> Result<(), StartupError> {
        let Some((rev, markers, crc, enh, pd)) = self.request.take() else {
            return Err(StartupError::InvalidState);
        };
        let mut ird = self.cfg.ird;
        let mut ord = self.cfg.ord;
        let mut rtr = None;
        let mut reply_enh = None;
        if let (REV_2, Some(e)) = (rev.min(self.cfg.rev), enh) {
            ird = ird.max(e.ord);
            ord = ord.min(e.ird);
            let c = self.cfg.rtr;
            if e.peer_to_peer {
                rtr = if c.write && e.rtr_write {
                    Some(Rtr::Write)
                } else if c.read && e.rtr_read {
                    Some(Rtr::Read)
                } else if c.send && e.rtr_send {
                    Some(Rtr::Send)
                } else {
                    None
                };
            }
            reply_enh = Some(EnhancedRepr {
                peer_to_peer: e.peer_to_peer,
                rtr_send: rtr == Some(Rtr::Send),
                rtr_write: rtr == Some(Rtr::Write),
                rtr_read: rtr == Some(Rtr::Read),
                ird,
                ord,
            });
        }
        let reply_rev = rev.min(self.cfg.rev);
        let reply = frame(
            FrameKind::Reply,
            &self.cfg,
            reply_rev,
            false,
            reply_enh,
            private_data,
        )?;
        self.tx.push_back(reply);
        self.phase = Phase::Done;
        let (peer_ird, peer_ord) = enh.map_or((0, 0), |e| (e.ird, e.ord));
        self.events.push_back(StartupEvent::Established(Negotiated {
            rev: reply_rev,
            crc: self.cfg.crc || crc,
            tx_markers: markers,
            rx_markers: self.cfg.markers,
            ird,
            ord,
            peer_ird,
            peer_ord,
            rtr,
            peer_private_data: pd,
        }));
        Ok(())
    }

    /// Responder: reject the Request (R=1).
    pub fn reject(&mut self, private_data: &[u8]) -> Result<(), StartupError> {
        let Some((rev, _, _, enh, _)) = self.request.take() else {
            return Err(StartupError::InvalidState);
        };
        let reply_enh = enh.map(|_| EnhancedRepr {
            ird: self.cfg.ird,
            ord: self.cfg.ord,
            ..EnhancedRepr::default()
        });
        let reply = frame(
            FrameKind::Reply,
            &self.cfg,
            rev.min(self.cfg.rev),
            true,
            reply_enh,
            private_data,
        )?;
        self.tx.push_back(reply);
        self.phase = Phase::Done;
        Ok(())
    }

    /// The next frame to send.
    pub fn poll_transmit(&mut self) -> Option<Vec<u8>> {
        self.tx.pop_front()
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<StartupEvent> {
        self.events.pop_front()
    }

    /// The startup deadline, while running.
    pub fn poll_timeout(&self) -> Option<Instant> {
        (self.phase != Phase::Done).then_some(self.deadline)
    }

    /// Fails the startup once the deadline passed.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.phase != Phase::Done && now >= self.deadline {
            // RFC 5044 §8 code 1 covers "lost by timeout".
            self.fail(TermCode::MPA_CONNECTION_LOST, false);
        }
    }
}
