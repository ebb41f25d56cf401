//! Acceptance 4: the client's fallback decisions and its nonblocking form.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use common::{Daemon, Registered};
use portmapper::client::{ClientConfig, Decision, Fallback, Outcome};
use portmapper::net::{PendingQuery, PmClient, Start};

fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Wait until `fd` is readable or `deadline` passes, as an event loop would.
fn poll_readable(fd: i32, deadline: Option<Instant>) {
    let timeout = deadline.map_or(-1, |d| {
        d.saturating_duration_since(Instant::now())
            .as_micros()
            .div_ceil(1000) as i32
    });
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one live pollfd, count 1.
    unsafe { libc::poll(&mut p, 1, timeout) };
}

#[test]
fn no_daemon_decides_fast_via_icmp() {
    let pm = PmClient::new(ClientConfig {
        server_port: free_udp_port(),
        ..ClientConfig::default()
    });
    let mut worst = Duration::ZERO;
    for ap in ["127.0.0.1:5001", "[::1]:5001"] {
        let t = Instant::now();
        let d = pm.query(ap.parse().unwrap(), "0.0.0.0:0".parse().unwrap());
        let took = t.elapsed();
        assert_eq!(d, Decision::Tcp(Fallback::Unreachable), "{ap}");
        assert!(took < Duration::from_millis(50), "{ap}: {took:?}");
        worst = worst.max(took);
    }
    println!("no daemon: decision in {worst:?} (worst of IPv4, IPv6)");
    // The negative cache answers the next one without any packet.
    let t = Instant::now();
    assert_eq!(
        pm.query(
            "127.0.0.1:80".parse().unwrap(),
            "0.0.0.0:0".parse().unwrap()
        ),
        Decision::Tcp(Fallback::Unreachable)
    );
    assert!(t.elapsed() < Duration::from_millis(5));
}

#[test]
fn silent_drop_decides_within_default_budget() {
    // A socket that receives and never answers: packets vanish.
    let hole = UdpSocket::bind("127.0.0.1:0").unwrap();
    let cfg = ClientConfig {
        server_port: hole.local_addr().unwrap().port(),
        ..ClientConfig::default()
    };
    assert!(cfg.timing.budget <= Duration::from_secs(1));
    let pm = PmClient::new(cfg);
    let t = Instant::now();
    let d = pm.query(
        "127.0.0.1:5001".parse().unwrap(),
        "0.0.0.0:0".parse().unwrap(),
    );
    let took = t.elapsed();
    assert_eq!(d, Decision::Tcp(Fallback::NoAnswer));
    assert!(took >= cfg.timing.budget, "{took:?}");
    assert!(took < Duration::from_secs(1), "{took:?}");
    println!(
        "silent drop: decision in {took:?} (budget {:?})",
        cfg.timing.budget
    );
    // Five PMReqs went out (0, 50, 150, 350, 750 ms).
    let mut b = [0u8; 64];
    hole.set_nonblocking(true).unwrap();
    let mut n = 0;
    while hole.recv(&mut b).is_ok() {
        n += 1;
    }
    assert_eq!(n, 5);
}

#[test]
fn configured_budget_is_respected() {
    let hole = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut cfg = ClientConfig {
        server_port: hole.local_addr().unwrap().port(),
        ..ClientConfig::default()
    };
    cfg.timing.budget = Duration::from_millis(200);
    let pm = PmClient::new(cfg);
    let t = Instant::now();
    let d = pm.query(
        "127.0.0.1:5001".parse().unwrap(),
        "0.0.0.0:0".parse().unwrap(),
    );
    let took = t.elapsed();
    assert_eq!(d, Decision::Tcp(Fallback::NoAnswer));
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(400),
        "{took:?}"
    );
}

#[test]
fn nonblocking_start_never_blocks() {
    let hole = UdpSocket::bind("127.0.0.1:0").unwrap();
    let pm = PmClient::new(ClientConfig {
        server_port: hole.local_addr().unwrap().port(),
        ..ClientConfig::default()
    });
    let t = Instant::now();
    let Start::Pending(mut q) = pm
        .start(
            "127.0.0.1:5001".parse().unwrap(),
            "0.0.0.0:0".parse().unwrap(),
        )
        .unwrap()
    else {
        panic!("expected a pending query")
    };
    assert!(t.elapsed() < Duration::from_millis(20), "{:?}", t.elapsed());
    assert_eq!(q.outcome(), None);
    // An event loop: wait for readability or the deadline, then drive.
    let mut wakeups = 0;
    while q.drive(Instant::now()).is_none() {
        poll_readable(q.as_raw_fd(), q.deadline());
        wakeups += 1;
    }
    assert_eq!(q.outcome(), Some(Outcome::NoAnswer));
    assert!(wakeups >= 5, "{wakeups}");
    assert_eq!(pm.finish(q), Decision::Tcp(Fallback::NoAnswer));
}

#[test]
fn nonblocking_query_against_daemon() {
    let d = Daemon::start(&[]);
    let r = Registered::new(&d, "127.0.0.1");
    let pm = PmClient::new(d.client_config());
    let cp: SocketAddr = "127.0.0.1:45678".parse().unwrap();
    let Start::Pending(mut q) = pm.start(r.ap(), cp).unwrap() else {
        panic!("expected a pending query")
    };
    while q.drive(Instant::now()).is_none() {
        poll_readable(q.as_raw_fd(), q.deadline());
    }
    assert!(matches!(q.outcome(), Some(Outcome::Accept { sdp, .. }) if sdp == r.sdp()));
    assert_eq!(q.transaction().transmissions(), 1);
    assert_eq!(pm.finish(q), Decision::Sdp(r.sdp()));
    // Now cached: decided without a query.
    assert!(matches!(
        pm.start(r.ap(), cp).unwrap(),
        Start::Decided(Decision::Sdp(_))
    ));
    // And the PMAck reached the daemon.
    assert!(d.wait_for(Duration::from_secs(2), |d| d.stat("acks") == 1));
}

#[test]
fn pending_query_start_directly() {
    // The lower-level form, with a transaction built by the caller.
    let port = free_udp_port();
    let mut c = portmapper::client::Client::new(ClientConfig::default());
    let now = Instant::now();
    let portmapper::client::Lookup::Query(txn) = c.begin(
        now,
        1,
        "127.0.0.1:5001".parse().unwrap(),
        "127.0.0.1:4000".parse().unwrap(),
    ) else {
        panic!()
    };
    let mut q = PendingQuery::start(
        now,
        txn,
        ("127.0.0.1".parse::<std::net::IpAddr>().unwrap(), port).into(),
    )
    .unwrap();
    assert_eq!(q.wait(), Outcome::Unreachable);
}
