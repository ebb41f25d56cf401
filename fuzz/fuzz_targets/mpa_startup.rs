//! The MPA Startup machine as responder and as initiator, fed arbitrary
//! bytes cut at places the input chooses, with the Consumer's decisions,
//! timer jumps and closes also chosen by the input. It must never panic,
//! never consume more than one frame, and only ever send well-formed frames.
//!
//! Input: 8 octets of configuration (two roles), one octet `split`; then
//! `split` octets of operations and the rest as stream data. When bit 0 of
//! the first octet is set, the stream starts with a genuine frame from a
//! peer machine (so the fuzzer reaches the negotiation quickly) and the
//! data follows it as if it were the first FPDU bytes.
#![no_main]

use std::time::{Duration, Instant};

use iwarp::mpa::startup::{RtrSet, Startup, StartupConfig, StartupEvent, State};
use iwarp::wire::mpa::{Frame, FrameKind, FrameRepr, HEADER_LEN, MAX_PRIVATE_DATA};
use libfuzzer_sys::fuzz_target;

fn config(a: u8, b: u8, c: u8, d: u8) -> StartupConfig {
    StartupConfig {
        // 0 and 3 are invalid on purpose.
        rev: a >> 6,
        crc: a & 0x02 != 0,
        markers: a & 0x04 != 0,
        peer_to_peer: a & 0x08 != 0,
        rtr: RtrSet {
            send: a & 0x10 != 0,
            write: a & 0x20 != 0,
            read: b & 0x80 != 0,
        },
        // Up to 0x7fff: above 0x3fff is invalid on purpose; 0x3fff is common.
        ird: if b & 0x40 != 0 {
            0x3fff
        } else {
            u16::from(b & 0x3f) << 8 | u16::from(c)
        },
        ord: if d & 0x80 != 0 {
            0x3fff
        } else {
            u16::from(d & 0x7f)
        },
        timeout: Duration::from_millis(u64::from(c) * 20),
        required_ord: u16::from(d >> 4),
    }
}

/// Drains transmit and events, checking what comes out.
fn drain(s: &mut Startup) {
    let kind = match s.role() {
        iwarp::mpa::Role::Initiator => FrameKind::Request,
        iwarp::mpa::Role::Responder => FrameKind::Reply,
    };
    while let Some(f) = s.poll_transmit() {
        let frame = Frame::new_checked(&f[..]).expect("a sent frame is complete");
        let repr = FrameRepr::parse(&frame).expect("a sent frame parses");
        assert_eq!(repr.kind, kind);
        assert_eq!(repr.buffer_len(), f.len());
        assert!(repr.split_private_data().is_ok());
    }
    while let Some(ev) = s.poll_event() {
        match ev {
            StartupEvent::Established(n) => {
                assert_eq!(s.negotiated(), Some(&n));
                assert!(n.peer_private_data.len() <= MAX_PRIVATE_DATA);
                assert!(n.ird <= 0x3fff && n.ord <= 0x3fff);
            }
            StartupEvent::Failed { send_terminate, .. } => {
                assert_eq!(s.state(), State::Failed);
                assert!(!send_terminate || s.negotiated().is_some());
            }
            StartupEvent::Request { private_data, .. }
            | StartupEvent::Rejected { private_data, .. } => {
                assert!(private_data.len() <= MAX_PRIVATE_DATA)
            }
        }
    }
    assert_eq!(s.poll_timeout().is_some(), !s.is_finished());
}

fn drive(mut s: Startup, ops: &[u8], stream: &[u8], t0: Instant) {
    let mut now = t0;
    let mut pos = 0;
    let mut used = 0;
    let pd = [0x5au8; 600];
    drain(&mut s);
    let mut feed = |s: &mut Startup, now: Instant, len: usize, pos: &mut usize| {
        let chunk = stream.get(*pos..).unwrap_or_default();
        let chunk = &chunk[..len.min(chunk.len())];
        let was_finished = s.is_finished();
        let n = s.handle_input(now, chunk);
        assert!(n <= chunk.len());
        if was_finished {
            assert_eq!(n, 0);
        }
        used += n;
        // Never more than one frame.
        assert!(used <= HEADER_LEN + MAX_PRIVATE_DATA);
        *pos += n;
        n
    };
    for &op in ops {
        match op & 7 {
            0..=3 => {
                feed(&mut s, now, usize::from(op >> 3) + 1, &mut pos);
            }
            4 => {
                now += Duration::from_millis(u64::from(op >> 3) * 150);
                s.handle_timeout(now);
            }
            5 => {
                let _ = s.accept(&pd[..usize::from(op >> 3) * 17]);
            }
            6 => {
                let _ = s.reject(&pd[..usize::from(op >> 3) * 17]);
            }
            _ => {
                if op & 0x80 != 0 {
                    s.handle_close(now);
                    if let Some(again) = s.retry_with_rev1(now) {
                        assert_eq!(again.config().rev, 1);
                    }
                } else {
                    let _ = s.poll_timeout();
                }
            }
        }
        drain(&mut s);
    }
    // The rest in one piece, then a decision if one is pending.
    feed(&mut s, now, usize::MAX, &mut pos);
    let _ = s.accept(b"");
    drain(&mut s);
}

fuzz_target!(|data: &[u8]| {
    let Some((head, rest)) = data.split_first_chunk::<9>() else {
        return;
    };
    let split = usize::from(head[8]).min(rest.len());
    let (ops, tail) = rest.split_at(split);
    let genuine = head[0] & 1 != 0;
    let t0 = Instant::now();
    let ini_cfg = config(head[0], head[1], head[2], head[3]);
    let rsp_cfg = config(head[4], head[5], head[6], head[7]);
    let ini_pd = &tail[..tail.len().min(usize::from(head[2] & 0x7f) * 5)];

    // As responder.
    let mut stream = Vec::new();
    if genuine {
        if let Ok(mut peer) = Startup::initiator(ini_cfg.clone(), ini_pd, t0) {
            stream.extend(peer.poll_transmit().unwrap_or_default());
        }
    }
    stream.extend_from_slice(tail);
    drive(Startup::responder(rsp_cfg.clone(), t0), ops, &stream, t0);

    // As initiator.
    let Ok(mut ini) = Startup::initiator(ini_cfg, ini_pd, t0) else {
        return;
    };
    let mut stream = Vec::new();
    if genuine {
        let request = ini.poll_transmit().unwrap_or_default();
        let mut peer = Startup::responder(rsp_cfg, t0);
        peer.handle_input(t0, &request);
        let _ = if head[4] & 1 != 0 {
            peer.reject(b"no")
        } else {
            peer.accept(b"yes")
        };
        stream.extend(peer.poll_transmit().unwrap_or_default());
    }
    stream.extend_from_slice(tail);
    drive(ini, ops, &stream, t0);
});
