//! The SDP connection state machine (sdp_core::conn): after a real setup,
//! arbitrary received messages (raw bytes, or BSDHs with the right sequence
//! numbers so they get past the first checks), completions, LLP events,
//! timers and socket calls — and, with a Zcopy configuration, the Zcopy and
//! Mode paths: registrations completed when the input says, RDMA Read and
//! Write completions, `send_zcopy`, `post_recv`, cancels, Mode changes.
//!
//! Checks: nothing panics (the close reason's Display included, formatted
//! whenever it changes); every Send the connection issues obeys the §10.5
//! credit rules (credit ≥ 1; payload only with three, and only bytes the
//! send buffer accepted; the last credit only for a message that gives
//! credit).
//!
//! An input drives at most [`MAX_CMDS`] commands: the cost of a run stays
//! bounded however long libFuzzer lets inputs grow (see docs/fuzzing.md).
#![no_main]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use sdp_core::conn::{
    Config, Conn, FlowControlMode, Pipelining, RecvFlags, SendFlags, Shutdown,
};
use sdp_core::verbs::{ErrorKind, Event, MemId, Op, RdmaOp, RecvId, SendId, Work, WrId};

/// Commands taken from one input; the rest of a longer input is ignored.
const MAX_CMDS: usize = 256;

/// The connection and what the adapter would track for it.
struct Harness {
    conn: Conn,
    posted: VecDeque<(WrId, usize)>,
    /// Work requests in order, with the completion each reports (0 Send,
    /// 1 RDMA Write, 2 RDMA Read).
    sends: VecDeque<(WrId, u8)>,
    /// Registrations asked for, not yet reported.
    regs: VecDeque<MemId>,
    next_stag: u32,
    /// Receive buffers posted with `post_recv`.
    ulp_recvs: Vec<RecvId>,
    /// Send buffers handed with `send_zcopy`.
    ulp_sends: Vec<SendId>,
    now: Instant,
}

impl Harness {
    fn drain(&mut self) {
        loop {
            let before = self.conn.credit_state();
            let Some(work) = self.conn.poll_work() else {
                break;
            };
            let op = match work {
                Work::Op(op) => op,
                Work::Rdma(RdmaOp::Register { mem, .. }) => {
                    self.regs.push_back(mem);
                    continue;
                }
                Work::Rdma(RdmaOp::Deregister { .. }) => continue,
                Work::Rdma(RdmaOp::Write { wr_id, .. }) => {
                    self.sends.push_back((wr_id, 1));
                    continue;
                }
                Work::Rdma(RdmaOp::Read { wr_id, .. }) => {
                    self.sends.push_back((wr_id, 2));
                    continue;
                }
            };
            match op {
                Op::PostRecv { wr_id, buf } => self.posted.push_back((wr_id, buf)),
                Op::Send {
                    wr_id,
                    header,
                    payload,
                    ..
                } => {
                    // §10.5: no message without credit, payload only with
                    // three, the last credit only for credit updates.
                    assert!(before.send_credit >= 1, "{before:?} {header:?}");
                    if payload.end > payload.start {
                        assert!(before.send_credit >= 3, "{before:?}");
                        assert!(payload.end <= self.conn.tx().accepted());
                    } else if before.send_credit < 2 {
                        assert!(before.gain > 0, "{before:?}");
                    }
                    self.sends.push_back((wr_id, 0));
                }
                Op::Teardown(_) => {}
            }
        }
    }

    fn recv_done(&mut self, bytes: &[u8], len: usize) {
        self.recv_event(bytes, len, None);
    }

    /// A receive, as Send with Invalidate of `stag` if given.
    fn recv_event(&mut self, bytes: &[u8], len: usize, stag: Option<u32>) {
        let Some((wr_id, buf)) = self.posted.pop_front() else {
            return;
        };
        if let Some(dst) = self.conn.pool_mut().buffer_mut(buf) {
            let n = bytes.len().min(dst.len());
            dst[..n].copy_from_slice(&bytes[..n]);
        }
        let event = match stag {
            Some(stag) => Event::RecvInvalidate { wr_id, len, stag },
            None => Event::RecvDone { wr_id, len },
        };
        self.conn.handle_event(self.now, event);
    }
}

/// A cursor over the fuzz input.
struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
}

/// Sets up a Connecting Peer (`client`) or an Accepting Peer with the
/// other end played by a real connection, and returns the one under test.
fn setup(config: &Config, client: bool) -> Option<Harness> {
    let now = Instant::now();
    let peer_config = Config {
        bufs: 4,
        buf_size: 256,
        ..Config::default()
    };
    let (a, mut b) = if client {
        let c = Conn::connect(config);
        let s = Conn::accept(&peer_config, c.hello()?).ok()?;
        (c, s)
    } else {
        let c = Conn::connect(&peer_config);
        let s = Conn::accept(config, c.hello()?).ok()?;
        (s, c)
    };
    let mut h = Harness {
        conn: a,
        posted: VecDeque::new(),
        sends: VecDeque::new(),
        regs: VecDeque::new(),
        next_stag: 0,
        ulp_recvs: Vec::new(),
        ulp_sends: Vec::new(),
        now,
    };
    h.drain();
    while b.poll_op().is_some() {}
    if client {
        b.handle_event(now, Event::Established);
        let Some(Op::Send { header, .. }) = b.poll_op() else {
            return None;
        };
        h.recv_done(&header, header.len());
    } else {
        h.conn.handle_event(now, Event::Established);
    }
    h.drain();
    Some(h)
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let Some(first) = input.byte() else {
        return;
    };
    let Some(second) = input.byte() else {
        return;
    };
    let mut config = Config {
        bufs: 3 + u16::from(first % 8),
        buf_size: 37 + u32::from(second) * 3,
        send_buffer: 1 + u64::from(second) * 50,
        oob_inline: first & 0x40 != 0,
        close_timeout: Duration::from_secs(1),
        ..Config::default()
    };
    if first & 0x20 != 0 {
        // Zcopy: both mechanisms, a Bcopy Threshold at or above the
        // receive Private Buffer size (§9.5.1), a Pipelining policy.
        let z = input.byte().unwrap_or(0);
        config.read_zcopy = z & 1 != 0;
        config.write_zcopy = z & 2 != 0;
        config.req_pipe = z & 4 != 0;
        config.pipelining = match (z >> 3) % 3 {
            0 => Pipelining::Never,
            1 => Pipelining::OnRequest,
            _ => Pipelining::Always,
        };
        config.max_adverts = 1 + u16::from((z >> 5) % 4);
        config.bcopy_threshold = u64::from(config.buf_size) + u64::from(z) * 4;
        config.buffered_after_send_sm = u32::from(z >> 6);
    }
    let Some(mut h) = setup(&config, first & 0x80 != 0) else {
        return;
    };
    let mut scratch = [0u8; 4096];
    let mut reason = None;
    for _ in 0..MAX_CMDS {
        let Some(cmd) = input.byte() else {
            break;
        };
        match cmd % 15 {
            // Raw bytes as a received message, with the length reported as
            // given or as the real length.
            0 => {
                let n = usize::from(input.byte().unwrap_or(0));
                let bytes = input.take(n);
                let len = if cmd & 0x80 != 0 {
                    usize::from(input.byte().unwrap_or(0)) * 16
                } else {
                    bytes.len()
                };
                h.recv_done(bytes, len);
            }
            // A message whose BSDH has the expected MSeq/MSeqAck and a Len
            // that matches, with the fuzzer's MID, flags, Bufs and body.
            1 => {
                let mid = input.byte().unwrap_or(0xff);
                let flags = input.byte().unwrap_or(0);
                let bufs = u16::from(input.byte().unwrap_or(8));
                let n = usize::from(input.byte().unwrap_or(0));
                let body = input.take(n);
                let cs = h.conn.credit_state();
                let mut msg = vec![mid, flags];
                msg.extend_from_slice(&bufs.to_be_bytes());
                msg.extend_from_slice(&((16 + body.len()) as u32).to_be_bytes());
                msg.extend_from_slice(&cs.mseq_ack.wrapping_add(1).to_be_bytes());
                msg.extend_from_slice(&cs.lsseq.to_be_bytes());
                msg.extend_from_slice(body);
                let len = msg.len();
                h.recv_done(&msg, len);
            }
            2 => {
                let n = usize::from(input.byte().unwrap_or(1)) * 7;
                let flags = if cmd & 0x80 != 0 {
                    SendFlags::OOB
                } else {
                    SendFlags::EMPTY
                };
                let _ = h.conn.send(n, flags);
            }
            3 => {
                let n = usize::from(input.byte().unwrap_or(1)) * 16;
                let flags = RecvFlags(u32::from(cmd >> 4) & 0x3 | (u32::from(cmd >> 6) & 1) << 8);
                let _ = h.conn.recv(&mut scratch[..n], flags);
                let _ = h.conn.at_mark();
                let _ = (h.conn.readable(), h.conn.writable(), h.conn.urgent_ready());
            }
            // Completions: the right one, or a stray id.
            4 => {
                let (wr_id, kind) = if cmd & 0x80 != 0 {
                    (WrId(u64::from(cmd)), cmd >> 5 & 3)
                } else {
                    match h.sends.pop_front() {
                        Some(s) => s,
                        None => continue,
                    }
                };
                let event = match kind {
                    1 => Event::WriteDone { wr_id },
                    2 => Event::ReadDone { wr_id },
                    _ => Event::SendDone { wr_id },
                };
                h.conn.handle_event(h.now, event);
            }
            5 => {
                let event = match cmd >> 4 {
                    0 => Event::TransportClosed,
                    1 => Event::TransportError(ErrorKind::Reset),
                    2 => Event::TransportError(ErrorKind::TimedOut),
                    3 => Event::Established,
                    _ => continue,
                };
                h.conn.handle_event(h.now, event);
            }
            6 => {
                let how = match cmd >> 4 {
                    0 => Shutdown::Read,
                    1 => Shutdown::Write,
                    _ => Shutdown::Both,
                };
                let _ = h.conn.shutdown(how);
            }
            7 => h.conn.close(h.now),
            8 => {
                if cmd & 0x80 != 0 {
                    h.conn.abort();
                } else {
                    h.conn.set_oob_inline(cmd & 0x40 != 0);
                }
            }
            9 => {
                h.now += Duration::from_millis(u64::from(cmd) * 20);
                h.conn.handle_timeout(h.now);
            }
            // A registration completes (or a stray one).
            10 => {
                let mem = if cmd & 0x80 != 0 {
                    MemId(u32::from(input.byte().unwrap_or(0)))
                } else {
                    match h.regs.pop_front() {
                        Some(m) => m,
                        None => continue,
                    }
                };
                h.next_stag = h.next_stag.wrapping_add(0x100);
                let stag = h.next_stag | 0x5a;
                let to = u64::from(stag) << 20;
                h.conn.handle_event(h.now, Event::Registered { mem, stag, to });
            }
            11 => {
                let n = u64::from(input.byte().unwrap_or(1)) * 61;
                let deadline = (cmd & 0x80 != 0)
                    .then(|| h.now + Duration::from_millis(u64::from(cmd >> 4 & 7)));
                if let Ok(id) = h.conn.send_zcopy(n, deadline, h.now) {
                    h.ulp_sends.push(id);
                }
            }
            12 => {
                let n = u32::from(input.byte().unwrap_or(1)) * 53;
                let flags = if cmd & 0x40 != 0 {
                    RecvFlags::WAITALL
                } else {
                    RecvFlags::EMPTY
                };
                let deadline = (cmd & 0x80 != 0)
                    .then(|| h.now + Duration::from_millis(u64::from(cmd >> 4 & 3)));
                if let Ok(id) = h.conn.post_recv(n, flags, deadline) {
                    h.ulp_recvs.push(id);
                }
            }
            13 => {
                let i = usize::from(cmd >> 4);
                if cmd & 0x08 != 0 {
                    // A signal interrupts a Zcopy write.
                    if let Some(&id) = h.ulp_sends.get(i % h.ulp_sends.len().max(1)) {
                        let _ = h.conn.cancel_send(id, h.now);
                    }
                } else if let Some(&id) = h.ulp_recvs.get(i % h.ulp_recvs.len().max(1)) {
                    let _ = h.conn.cancel_recv(id);
                }
                while h.conn.poll_completion().is_some() {}
                let _ = (h.conn.zcopy_state(), h.conn.zcopy_stats());
            }
            // Mode transitions asked by the application, and messages that
            // invalidate an STag.
            _ => {
                let mode = match cmd >> 4 & 3 {
                    0 => FlowControlMode::Buffered,
                    1 => FlowControlMode::Combined,
                    _ => FlowControlMode::Pipelined,
                };
                if cmd & 0x80 != 0 {
                    let stag = u32::from(input.byte().unwrap_or(0)) << 8 | 0x5a;
                    let n = usize::from(input.byte().unwrap_or(0));
                    let body = input.take(n);
                    let cs = h.conn.credit_state();
                    let mid = if cmd & 0x40 != 0 { 0x05 } else { 0x06 };
                    let mut msg = vec![mid, 0x04];
                    msg.extend_from_slice(&8u16.to_be_bytes());
                    msg.extend_from_slice(&((16 + body.len()) as u32).to_be_bytes());
                    msg.extend_from_slice(&cs.mseq_ack.wrapping_add(1).to_be_bytes());
                    msg.extend_from_slice(&cs.lsseq.to_be_bytes());
                    msg.extend_from_slice(body);
                    let len = msg.len();
                    h.recv_event(&msg, len, Some(stag));
                } else if cmd & 0x40 != 0 {
                    let _ = h.conn.set_recv_mode(mode);
                } else {
                    let _ = h.conn.set_send_mode(mode);
                }
            }
        }
        h.drain();
        if h.conn.close_reason() != reason.as_ref() {
            reason = h.conn.close_reason().copied();
            let _ = reason.map(|r| r.to_string());
        }
    }
});
