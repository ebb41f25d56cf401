//! The SDP connection state machine (sdp_core::conn): after a real setup,
//! arbitrary received messages (raw bytes, or BSDHs with the right sequence
//! numbers so they get past the first checks), completions, LLP events,
//! timers and socket calls. Nothing may panic, and every Send the
//! connection issues must obey the §10.5 credit rules.
#![no_main]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use sdp_core::conn::{Config, Conn, RecvFlags, SendFlags, Shutdown};
use sdp_core::verbs::{ErrorKind, Event, Op, WrId};

/// The connection and what the adapter would track for it.
struct Harness {
    conn: Conn,
    posted: VecDeque<(WrId, usize)>,
    sends: VecDeque<WrId>,
    now: Instant,
}

impl Harness {
    fn drain(&mut self) {
        loop {
            let before = self.conn.credit_state();
            let Some(op) = self.conn.poll_op() else {
                break;
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
                    self.sends.push_back(wr_id);
                }
                Op::Teardown(_) => {}
            }
        }
    }

    fn recv_done(&mut self, bytes: &[u8], len: usize) {
        let Some((wr_id, buf)) = self.posted.pop_front() else {
            return;
        };
        if let Some(dst) = self.conn.pool_mut().buffer_mut(buf) {
            let n = bytes.len().min(dst.len());
            dst[..n].copy_from_slice(&bytes[..n]);
        }
        self.conn
            .handle_event(self.now, Event::RecvDone { wr_id, len });
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
    let config = Config {
        bufs: 3 + u16::from(first % 8),
        buf_size: 37 + u32::from(second) * 3,
        send_buffer: 1 + u64::from(second) * 50,
        oob_inline: first & 0x40 != 0,
        close_timeout: Duration::from_secs(1),
        ..Config::default()
    };
    let Some(mut h) = setup(&config, first & 0x80 != 0) else {
        return;
    };
    let mut scratch = vec![0u8; 4096];
    while let Some(cmd) = input.byte() {
        match cmd % 10 {
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
                let wr_id = if cmd & 0x80 != 0 {
                    WrId(u64::from(cmd))
                } else {
                    match h.sends.pop_front() {
                        Some(id) => id,
                        None => continue,
                    }
                };
                h.conn.handle_event(h.now, Event::SendDone { wr_id });
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
            _ => {
                h.now += Duration::from_millis(u64::from(cmd) * 20);
                h.conn.handle_timeout(h.now);
            }
        }
        h.drain();
        let _ = h.conn.close_reason().map(ToString::to_string);
    }
});
