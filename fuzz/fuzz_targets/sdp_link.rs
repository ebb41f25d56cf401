//! The SDP link over the real iWARP engine (sdp_core::link::pair): two
//! links set up for real, then an arbitrary sequence of transmissions and
//! deliveries in arbitrary chunks, application calls, closes, timers, and
//! raw RDMAP Sends of arbitrary bytes from one side (a hostile peer), then
//! a settle: random steps until nothing can happen.
//!
//! Checks (all in the harness, on every step of both phases): nothing
//! panics; every Send obeys the §10.5 credit rules (`check_send`); after
//! every drive the credit accounting holds on both sides (`check_idle`: Bufs
//! equals the buffers posted, no mandated update left unsent) along with
//! the §10 safety rule (a side's credit never exceeds the buffers the peer
//! posted minus its messages in flight); every byte an application reads
//! is the byte the other one wrote at that offset; every placement lands
//! inside registered memory.
//!
//! Kept cheap so that ten million runs take hours, not days (see
//! docs/fuzzing.md): an input drives at most [`MAX_OPS`] operations, and
//! the settle lets what was written arrive rather than writing more, in
//! whole chunks (the input's operations are where the streams are cut at
//! the seed's chunk size). The settle also stops when the links trade
//! messages without progress (see [`settle`]).
#![no_main]

use iwarp::engine::{Payload, SendKind, SendWr};
use libfuzzer_sys::fuzz_target;
use sdp_core::conn::{Config, Shutdown};
use sdp_core::link::pair::LinkPair;

/// Operations taken from one input; the rest of a longer input is ignored.
const MAX_OPS: usize = 64;

fuzz_target!(|data: &[u8]| {
    let Some((&seed, mut data)) = data.split_first() else {
        return;
    };
    let config = Config {
        bufs: 3 + u16::from(seed & 3),
        buf_size: 64 + 32 * u32::from(seed >> 4),
        send_buffer: 700,
        ..Config::default()
    };
    let mut pair = LinkPair::connected(&config, &config, u64::from(seed));
    pair.max_chunk = 1 + usize::from(seed) * 7;
    for app in &mut pair.apps {
        app.to_write = 2000;
        app.max_io = 300;
    }
    let mut hostile = false;
    let mut ops = 0;
    while let Some((&op, rest)) = data.split_first() {
        data = rest;
        ops += 1;
        if ops > MAX_OPS {
            break;
        }
        let s = usize::from(op & 1);
        match op >> 1 {
            0..=19 => {
                pair.step();
            }
            20..=29 => pair.transmit(s),
            30..=39 => pair.deliver(s),
            40..=49 if !hostile => pair.app_write(s),
            50..=59 if !hostile => pair.app_read(s),
            60 if !hostile => {
                let _ = pair.sides[s].link().shutdown(Shutdown::Write);
                pair.drive(s);
            }
            61 if !hostile => {
                pair.sides[s].link().abort();
                pair.drive(s);
            }
            62 if !hostile => {
                let now = pair.now;
                pair.sides[s].link().close(now);
                pair.drive(s);
            }
            63 => {
                // Side 0 turns hostile: the next bytes go out as one Send.
                let n = usize::from(rest.first().copied().unwrap_or(0)).min(rest.len());
                let msg = rest.get(1..n).unwrap_or_default().to_vec();
                data = rest.get(n..).unwrap_or_default();
                hostile = true;
                pair.sides[0].hostile = true;
                pair.apps[1].reading = false;
                let _ = pair.sides[0].qp.datapath_mut().post_send(SendWr {
                    wr_id: 7,
                    kind: SendKind::Send,
                    payload: Payload::Inline(msg),
                    signaled: false,
                });
            }
            _ => {}
        }
    }
    // The settle: the applications write no more, and what was written
    // arrives in whole chunks, is read, acknowledged, closed, timed out.
    for app in &mut pair.apps {
        app.to_write = app.written;
    }
    pair.max_chunk = 64 * 1024;
    pair.tiny_chunks = false;
    settle(&mut pair);
});

/// What the applications and the connections have got to: bytes written
/// and read, EOF, errors, FINs, resets and connection states.
fn progress(pair: &LinkPair) -> [u64; 16] {
    let mut p = [0; 16];
    for s in 0..2 {
        let (app, side) = (&pair.apps[s], &pair.sides[s]);
        let state = side.link.as_ref().map(|l| l.conn().state());
        p[8 * s..8 * s + 8].copy_from_slice(&[
            app.written,
            app.read,
            u64::from(app.eof),
            app.errors.len() as u64,
            u64::from(side.fin),
            u64::from(side.fin_delivered),
            u64::from(side.dead),
            state.map_or(99, |s| s as u64),
        ]);
    }
    p
}

/// Random steps until nothing can happen, at most 20 000; or until the
/// links issued 64 verbs operations (some 32 messages) with no
/// [`progress`]: two links that both have data to send and three buffers
/// each can trade credit messages forever without moving a byte (see
/// docs/fuzzing.md).
fn settle(pair: &mut LinkPair) {
    let mut last = progress(pair);
    let mut since = pair.ops_checked;
    for _ in 0..20_000 {
        if !pair.step() {
            return;
        }
        let now = progress(pair);
        if now != last {
            (last, since) = (now, pair.ops_checked);
        } else if pair.ops_checked - since > 64 {
            return;
        }
    }
}
