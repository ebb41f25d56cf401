//! The PM Client's socket driver: runs [`crate::client`] transactions over
//! UDP, blocking or from an event loop.
//!
//! Each query uses its own UDP socket connected to the port mapper, so the
//! kernel hands back an ICMP port unreachable as `ECONNREFUSED` — the
//! "no daemon on that host" answer, which decides at once instead of after
//! the retransmission budget.
//!
//! * [`PmClient::query`] blocks for at most [`crate::client::Timing::budget`].
//! * [`PmClient::start`] never blocks: it gives back a [`PendingQuery`]
//!   whose file descriptor an event loop watches for readability, and
//!   whose [`PendingQuery::deadline`] is the loop's timeout; call
//!   [`PendingQuery::drive`] on either, then [`PmClient::finish`].
//!
//! ```no_run
//! use portmapper::client::{ClientConfig, Decision};
//! use portmapper::net::PmClient;
//!
//! let pm = PmClient::new(ClientConfig::default());
//! match pm.query("192.0.2.2:5001".parse().unwrap(), "0.0.0.0:40000".parse().unwrap()) {
//!     Decision::Sdp(addr) => println!("connect to {addr} over SDP"),
//!     Decision::Tcp(why) => println!("plain TCP ({why:?})"),
//! }
//! ```
#![forbid(unsafe_code)]

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Instant, SystemTime};

use crate::client::{
    CacheEntry, Client, ClientConfig, Decision, Fallback, Lookup, Outcome, Transaction,
};

/// A random 64-bit value for an AssocHandle: SipHash, keyed from the OS's
/// randomness once per process, over a counter, the pid and the time. Not a
/// cryptographic generator, but unpredictable to an off-path third party
/// (§7.5.1: "SHOULD be chosen at random to make it harder for a third party
/// to interfere with the protocol").
pub fn random_u64() -> u64 {
    static KEYS: OnceLock<RandomState> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = KEYS.get_or_init(RandomState::new).build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u32(std::process::id());
    if let Ok(d) = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH) {
        h.write_u128(d.as_nanos());
    }
    h.finish()
}

fn is_unreachable(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::HostUnreachable
            | io::ErrorKind::NetworkUnreachable
    )
}

/// A nonblocking UDP socket connected to `server`: made nonblocking and
/// close-on-exec in one call, its port picked by the connect.
fn connect_udp(server: SocketAddr) -> io::Result<UdpSocket> {
    let ty = socket2::Type::DGRAM.nonblocking().cloexec();
    let s = socket2::Socket::new(socket2::Domain::for_address(server), ty, None)?;
    s.connect(&server.into())?;
    Ok(s.into())
}

/// A transaction in progress on its own nonblocking UDP socket.
#[derive(Debug)]
pub struct PendingQuery {
    sock: UdpSocket,
    txn: Transaction,
}

impl PendingQuery {
    /// Run `txn` against the port mapper at `server`: sends the first PMReq
    /// now. Never blocks.
    pub fn start(now: Instant, txn: Transaction, server: SocketAddr) -> io::Result<PendingQuery> {
        PendingQuery::with_socket(now, txn, connect_udp(server)?)
    }

    fn with_socket(now: Instant, txn: Transaction, sock: UdpSocket) -> io::Result<PendingQuery> {
        let mut q = PendingQuery { sock, txn };
        q.drive(now);
        Ok(q)
    }

    /// The transaction.
    pub fn transaction(&self) -> &Transaction {
        &self.txn
    }

    /// The outcome, once decided.
    pub fn outcome(&self) -> Option<Outcome> {
        self.txn.outcome()
    }

    /// When to call [`PendingQuery::drive`] if the socket stays quiet;
    /// `None` once decided.
    pub fn deadline(&self) -> Option<Instant> {
        self.txn.poll_timeout()
    }

    /// The local address of the query's socket.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    fn on_io_error(&mut self, now: Instant, e: &io::Error) {
        if is_unreachable(e) {
            self.txn.handle_unreachable(now);
        }
    }

    /// Read whatever arrived, handle timers, send what is due. Returns the
    /// outcome once decided. Never blocks.
    pub fn drive(&mut self, now: Instant) -> Option<Outcome> {
        let mut buf = [0u8; 128];
        // Nothing can have come before the first PMReq went out, and once
        // decided later datagrams are discarded unread (§7.5.1): the socket
        // is closed with them.
        while self.txn.transmissions() > 0 && self.txn.outcome().is_none() {
            match self.sock.recv(&mut buf) {
                Ok(n) => {
                    self.txn.handle_datagram(now, &buf[..n]);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    self.on_io_error(now, &e);
                    break;
                }
            }
        }
        self.txn.handle_timeout(now);
        while let Some(d) = self.txn.poll_transmit(now) {
            // A lost send is like a lost datagram: retransmission covers it.
            if let Err(e) = self.sock.send(&d) {
                self.on_io_error(now, &e);
            }
        }
        self.txn.outcome()
    }

    /// Block until decided (at most the transaction's budget).
    pub fn wait(&mut self) -> Outcome {
        loop {
            let now = Instant::now();
            if let Some(o) = self.drive(now) {
                return o;
            }
            let Some(deadline) = self.deadline() else {
                // Unreachable: undecided transactions always have one.
                return Outcome::NoAnswer;
            };
            let wait = deadline.saturating_duration_since(now);
            if wait.is_zero() {
                continue;
            }
            // Wait for a datagram or the deadline; `drive` reads it.
            if self.sock.set_nonblocking(false).is_err()
                || self.sock.set_read_timeout(Some(wait)).is_err()
            {
                return Outcome::NoAnswer;
            }
            let mut b = [0u8; 1];
            let r = self.sock.peek(&mut b);
            let _ = self.sock.set_nonblocking(true);
            if let Err(e) = r {
                let now = Instant::now();
                self.on_io_error(now, &e);
            }
        }
    }
}

impl AsFd for PendingQuery {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

impl AsRawFd for PendingQuery {
    fn as_raw_fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }
}

/// What [`PmClient::start`] gives.
// Short-lived and moved once (see client::Lookup).
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Start {
    /// Decided from the cache.
    Decided(Decision),
    /// A query is running; drive it, then [`PmClient::finish`] it.
    Pending(PendingQuery),
}

/// A thread-safe PM Client for a process: caches shared by all its
/// connections.
#[derive(Debug)]
pub struct PmClient {
    inner: Mutex<Client>,
}

impl PmClient {
    /// A client with empty caches.
    pub fn new(cfg: ClientConfig) -> PmClient {
        PmClient {
            inner: Mutex::new(Client::new(cfg)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Client> {
        // A panic elsewhere leaves the caches consistent enough to use.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The configuration.
    pub fn config(&self) -> ClientConfig {
        *self.lock().config()
    }

    /// The caches' answer for `ap`, if they have one (no socket needed).
    pub fn cached(&self, ap: SocketAddr) -> Option<Decision> {
        self.lock().cached(Instant::now(), ap)
    }

    /// Start resolving `ap` for a TCP connection from `cp`. If `cp`'s
    /// address is unspecified, the source address the kernel picks for the
    /// port mapper becomes CpIPAddr. Never blocks.
    pub fn start(&self, ap: SocketAddr, cp: SocketAddr) -> io::Result<Start> {
        let now = Instant::now();
        // A cached answer needs no socket (nor the source address).
        if let Some(d) = self.lock().cached(now, ap) {
            return Ok(Start::Decided(d));
        }
        let server = SocketAddr::new(ap.ip(), self.config().server_port);
        let mut sock = None;
        let mut cp = cp;
        if cp.ip().is_unspecified() {
            let s = connect_udp(server)?;
            cp.set_ip(s.local_addr()?.ip());
            sock = Some(s);
        }
        let lookup = self.lock().begin(now, random_u64(), ap, cp);
        match lookup {
            Lookup::Decided(d) => Ok(Start::Decided(d)),
            Lookup::Query(txn) => {
                let r = match sock {
                    Some(s) => PendingQuery::with_socket(now, txn.clone(), s),
                    None => PendingQuery::start(now, txn.clone(), server),
                };
                if r.is_err() {
                    // Release the handle; nothing was sent.
                    self.lock().finish(now, &txn);
                }
                r.map(Start::Pending)
            }
        }
    }

    /// Record a query's outcome (undecided counts as no answer) and say
    /// what to connect to.
    pub fn finish(&self, q: PendingQuery) -> Decision {
        self.lock().finish(Instant::now(), &q.txn)
    }

    /// Resolve `ap` for a connection from `cp`, blocking at most the
    /// configured budget. Socket errors give plain TCP.
    pub fn query(&self, ap: SocketAddr, cp: SocketAddr) -> Decision {
        match self.start(ap, cp) {
            Ok(Start::Decided(d)) => d,
            Ok(Start::Pending(mut q)) => {
                q.wait();
                self.finish(q)
            }
            Err(_) => Decision::Tcp(Fallback::Unreachable),
        }
    }

    /// Connecting to the SDP address for `ap` failed (RST): drop the cached
    /// mapping and treat it as a PMDeny (§7.5.1).
    pub fn sdp_connect_failed(&self, ap: SocketAddr) {
        self.lock().sdp_connect_failed(Instant::now(), ap);
    }

    /// The cached mapping for `ap` was refused: drop it ([`Client::forget`]).
    pub fn forget(&self, ap: SocketAddr) {
        self.lock().forget(ap);
    }

    /// Forget every cached answer.
    pub fn clear_cache(&self) {
        self.lock().clear_cache();
    }

    /// The live cache entries, at most `max` ([`Client::entries`]).
    pub fn entries(&self, max: usize) -> Vec<CacheEntry> {
        self.lock().entries(Instant::now(), max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn random_differs() {
        let a = random_u64();
        let b = random_u64();
        assert_ne!(a, b);
    }

    #[test]
    fn unreachable_is_fast() {
        // A UDP port nobody listens on: ICMP port unreachable on loopback.
        let port = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let pm = PmClient::new(ClientConfig {
            server_port: port,
            ..ClientConfig::default()
        });
        let t = Instant::now();
        let d = pm.query(
            "127.0.0.1:5001".parse().unwrap(),
            "0.0.0.0:4".parse().unwrap(),
        );
        assert_eq!(d, Decision::Tcp(Fallback::Unreachable));
        assert!(t.elapsed() < Duration::from_millis(50), "{:?}", t.elapsed());
        // Now cached for the host.
        let Start::Decided(d) = pm
            .start(
                "127.0.0.1:80".parse().unwrap(),
                "0.0.0.0:4".parse().unwrap(),
            )
            .unwrap()
        else {
            panic!("not cached")
        };
        assert_eq!(d, Decision::Tcp(Fallback::Unreachable));
    }
}
