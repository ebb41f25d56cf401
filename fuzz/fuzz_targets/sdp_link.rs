//! The SDP link over the real iWARP engine (sdp_core::link::pair): two
//! links set up for real, then an arbitrary sequence of transmissions and
//! deliveries in arbitrary chunks, application calls, closes, timers, and
//! raw RDMAP Sends of arbitrary bytes from one side (a hostile peer).
//! Nothing may panic; the harness asserts the §10.5 credit rules on every
//! Send, the credit accounting after every step, and the received bytes.
#![no_main]

use iwarp::engine::{Payload, SendKind, SendWr};
use libfuzzer_sys::fuzz_target;
use sdp_core::conn::{Config, Shutdown};
use sdp_core::link::pair::LinkPair;

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
    while let Some((&op, rest)) = data.split_first() {
        data = rest;
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
                let _ = pair.sides[0].qp.post_send(SendWr {
                    wr_id: 7,
                    kind: SendKind::Send,
                    payload: Payload::Inline(msg),
                    signaled: false,
                });
            }
            _ => {}
        }
    }
    pair.settle(20_000);
});
