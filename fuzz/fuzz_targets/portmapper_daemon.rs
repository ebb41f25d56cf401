//! The port mapper daemon's packet handling (portmapper::server::Server, the
//! sans-IO core the daemon drives), fed arbitrary sequences of datagrams,
//! time steps, registrations and connection notices. Checks: no panic;
//! malformed datagrams, PMAcks and stray replies are never answered; a reply
//! to a PMReq echoes its AssocHandle, CpPort, CpIPAddr and IPV (and for a
//! PMDeny its ApPort and ApIPAddr); every table stays within its bound;
//! timers only delete expired state; poll_timeout is the earliest expiry;
//! and once time passes the PMAccept timeout with no more input, no
//! transaction state is left.
//!
//! An input drives at most [`MAX_OPS`] operations (the tables hold at most
//! 16 entries, so that is room to fill, churn and expire them many times
//! over): the cost of a run stays bounded however long libFuzzer lets
//! inputs grow (see docs/fuzzing.md). The PMAck of an answer goes to the
//! pending transaction with the smallest four-tuple, not to the first in
//! the table's (randomly seeded) hash order, so that a run depends on its
//! input alone.
#![no_main]

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use portmapper::server::{Action, Server, ServerConfig};
use portmapper::wire::{MessageRepr, MsgType, PmTime};

const ADDRS: [&str; 6] = [
    "10.0.0.1",
    "10.0.0.2",
    "0.0.0.0",
    "::",
    "2001:db8::1",
    "::ffff:10.0.0.2",
];

fn addr(i: u8) -> IpAddr {
    ADDRS[i as usize % ADDRS.len()].parse().unwrap()
}

/// Operations taken from one input; the rest of a longer input is ignored.
const MAX_OPS: usize = 128;

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn bytes(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        a
    }
}

fn check_datagram(s: &mut Server, now: Instant, from: SocketAddr, dg: &[u8]) {
    let h = s.handle_datagram(now, from, dg);
    let parsed = MessageRepr::parse_bytes(dg);
    let m = match parsed {
        Err(e) => {
            assert_eq!(h.action, Action::Malformed(e));
            assert!(h.reply.is_none());
            return;
        }
        Ok(m) => m,
    };
    if m.mtype != MsgType::REQ {
        assert!(h.reply.is_none(), "answered a {}", m.mtype);
        return;
    }
    let Some(reply) = h.reply else {
        assert_eq!(h.action, Action::RateLimited);
        return;
    };
    let r = MessageRepr::parse_bytes(&reply).unwrap();
    assert_eq!(r.assoc_handle, m.assoc_handle);
    assert_eq!(r.cp_port, m.cp_port);
    assert_eq!(r.cp_addr, m.cp_addr);
    assert_eq!(r.ip_version(), m.ip_version());
    match r.mtype {
        MsgType::ACCEPT => assert!(r.ap_port != 0),
        MsgType::DENY => {
            assert_eq!((r.ap_port, r.ap_addr), (m.ap_port, m.ap_addr));
            assert_eq!(r.pm_time, PmTime::NO_CACHE);
        }
        t => panic!("replied with {t}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let cfg = ServerConfig {
        accept_timeout: Duration::from_millis(100),
        max_pending: 16,
        max_registrations: 8,
        rate_per_sec: 50,
        burst: 8,
        max_sources: 4,
        rewrite_addrs: vec![addr(0), addr(4)],
        ..ServerConfig::default()
    };
    let mut s = Server::new(cfg.clone());
    let mut now = Instant::now();
    let mut inp = Input(data);
    for _ in 0..MAX_OPS {
        if inp.0.is_empty() {
            break;
        }
        let op = inp.byte();
        let from = SocketAddr::new(addr(op >> 3), 1000 + u16::from(op >> 6));
        match op % 6 {
            // Raw bytes: anything, malformed included.
            0 => {
                let len = inp.byte() as usize % 64;
                let dg = inp.bytes(len).to_vec();
                check_datagram(&mut s, now, from, &dg);
            }
            // A well-formed message over a small space of values, so that
            // duplicates, replacements and PMAcks actually match state.
            1 | 2 => {
                let a = inp.byte();
                let b = inp.byte();
                let m = MessageRepr {
                    mtype: MsgType(a & 3),
                    pm_time: PmTime(0),
                    ap_port: u16::from(b & 3) + 1,
                    cp_port: u16::from((b >> 2) & 3),
                    assoc_handle: u64::from(a >> 2 & 3),
                    cp_addr: addr(b >> 4),
                    ap_addr: addr(a >> 4),
                };
                let mut bytes = m.to_bytes();
                if a & 0x80 != 0 {
                    // An answer-shaped PMAck: take the SDP port from state.
                    let first = s.pending().min_by_key(|p| p.key).cloned();
                    if let Some(p) = first {
                        let ack = MessageRepr {
                            mtype: MsgType::ACK,
                            pm_time: PmTime(0),
                            ap_port: p.sdp_port,
                            cp_port: p.key.cp_port,
                            assoc_handle: p.assoc_handle,
                            cp_addr: p.key.cp_addr,
                            ap_addr: p.sdp_addr,
                        };
                        bytes = ack.to_bytes();
                        let to = p.reply_to;
                        check_datagram(&mut s, now, to, &bytes);
                        continue;
                    }
                }
                check_datagram(&mut s, now, from, &bytes);
            }
            3 => {
                now += Duration::from_millis(u64::from(inp.byte()) * 2);
                for p in s.handle_timeout(now) {
                    assert!(p.expires <= now);
                }
            }
            4 => {
                let b = inp.byte();
                let c = inp.byte();
                let _ = s.register(
                    now,
                    u64::from(b & 3),
                    addr(b >> 2),
                    u16::from(c & 3) + 1,
                    u16::from(c >> 2),
                );
            }
            _ => {
                let b = inp.byte();
                if b & 1 == 0 {
                    s.unregister_owner(u64::from(b >> 1 & 3));
                } else {
                    s.handle_connection(u16::from(b >> 3), addr(b >> 5), u16::from(b >> 6));
                }
            }
        }
        assert!(s.pending_len() <= cfg.max_pending);
        assert!(s.registrations().count() <= cfg.max_registrations);
        assert!(s.sources_len() <= cfg.max_sources);
        let earliest = s.pending().map(|p| p.expires).min();
        assert_eq!(s.poll_timeout(), earliest);
    }
    now += cfg.accept_timeout;
    s.handle_timeout(now);
    assert_eq!(s.pending_len(), 0);
    assert_eq!(s.poll_timeout(), None);
});
