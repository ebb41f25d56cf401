//! Acceptance 3: 100 000 PMReqs from many source addresses and ports keep
//! the daemon's memory under the bound documented in docs/portmapper.md,
//! and a legitimate client still gets its answer within its retry budget.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{ip, Daemon, Registered, Rng};
use portmapper::client::Decision;
use portmapper::net::PmClient;
use portmapper::wire::{MessageRepr, MsgType, PmTime};

/// docs/portmapper.md: resident memory of the daemon stays under 32 MiB
/// under a PMReq flood with the default limits.
const RSS_BOUND_KIB: u64 = 32 * 1024;

const FLOOD: u64 = 100_000;

fn status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[test]
fn flood_is_bounded_and_legit_client_is_served() {
    let d = Daemon::start_bound(&["127.0.0.1"], &["--log-level", "info"]);
    let r = Registered::new(&d, "127.0.0.1");
    let before = status_kib(d.pid(), "VmRSS:");
    let sent = Arc::new(AtomicU64::new(0));
    let legit_done = Arc::new(std::sync::atomic::AtomicBool::new(false));

    // 16 source addresses × 64 source ports; every PMReq is valid, for the
    // registered port, with its own four-tuple: the worst case for state.
    let flood = {
        let sent = sent.clone();
        let legit_done = legit_done.clone();
        let server: SocketAddr = (ip("127.0.0.1"), d.port).into();
        let ap = r.ap();
        thread::spawn(move || {
            let socks: Vec<UdpSocket> = (0..16u8)
                .flat_map(|a| (0..64).map(move |_| a))
                .map(|a| {
                    let s = UdpSocket::bind((ip(&format!("127.0.1.{}", a + 1)), 0)).unwrap();
                    s.connect(server).unwrap();
                    s
                })
                .collect();
            let mut rng = Rng(0xf100d);
            // At least FLOOD datagrams, and on until the legitimate client
            // has its answer.
            let mut i = 0u64;
            while i < FLOOD || !legit_done.load(Ordering::Relaxed) {
                i += 1;
                let x = rng.next();
                let m = MessageRepr {
                    mtype: MsgType::REQ,
                    pm_time: PmTime::NO_CACHE,
                    ap_port: ap.port(),
                    cp_port: (x >> 48) as u16,
                    assoc_handle: x,
                    cp_addr: ip(&format!(
                        "10.{}.{}.{}",
                        (x >> 8) as u8,
                        (x >> 16) as u8,
                        (x >> 24) as u8
                    )),
                    ap_addr: ap.ip(),
                };
                let s = &socks[(i as usize) % socks.len()];
                // A full socket buffer drops, like a real flood.
                let _ = s.send(&m.to_bytes());
                sent.fetch_add(1, Ordering::Relaxed);
            }
        })
    };

    // The legitimate client asks while the flood is in full swing.
    while sent.load(Ordering::Relaxed) < FLOOD / 5 {
        thread::yield_now();
    }
    let pm = PmClient::new(d.client_config());
    let t = Instant::now();
    let dec = pm.query(r.ap(), "127.0.0.1:0".parse().unwrap());
    let took = t.elapsed();
    let sent_at_answer = sent.load(Ordering::Relaxed);
    legit_done.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    let total = sent.load(Ordering::Relaxed);
    assert_eq!(dec, Decision::Sdp(r.sdp()), "legitimate client not served");
    assert!(took < pm.config().timing.budget);

    // Let the daemon drain its socket: rx stops moving.
    let last = std::cell::Cell::new(0);
    assert!(d.wait_for(Duration::from_secs(10), |d| {
        let rx = d.stat("rx");
        rx == last.replace(rx)
    }));
    let hwm = status_kib(d.pid(), "VmHWM:");
    let rss = status_kib(d.pid(), "VmRSS:");
    let lines = d.list();
    let stats = lines.last().unwrap();
    println!(
        "flood: {total} PMReqs sent; legit answer in {took:?} (sent by then: {sent_at_answer}); \
         daemon RSS {before} KiB before, {rss} KiB after, peak {hwm} KiB (bound {RSS_BOUND_KIB} KiB)\n{stats}"
    );
    assert!(hwm < RSS_BOUND_KIB, "peak RSS {hwm} KiB");
    assert!(d.stat("pending") <= 4096);
    assert!(d.stat("sources") <= 4096);
    assert!(d.stat("rate_limited") > 0, "rate limit never engaged");
    // The alarm of §15.2.1 reached the log (stats interval 10 s: the
    // shutdown line carries the same counters).
    drop(pm);
}
