//! The PM Client of draft-pinkerton-iwarp-sdp-01 §7.4 and §7.5.1, sans-IO.
//!
//! Read §7.5.1 first. A [`Transaction`] is one PMReq exchange: it says what
//! to send and when ([`Transaction::poll_transmit`],
//! [`Transaction::poll_timeout`]), takes the datagrams and ICMP errors that
//! arrive, and settles on one [`Outcome`] — the first reply wins, later ones
//! are discarded. A [`Client`] hands out transactions with AssocHandles that
//! are unique among those in flight and keeps the caches: positive answers
//! for their PmTime, negative ones per host and per port. Time and
//! randomness come from the caller; [`crate::net`] is the socket driver.
//!
//! ```
//! use portmapper::client::{Client, ClientConfig, Decision, Lookup, Outcome};
//! use portmapper::wire::{MessageRepr, MsgType, PmTime};
//! use std::time::{Duration, Instant};
//!
//! let mut client = Client::new(ClientConfig::default());
//! let now = Instant::now();
//! let ap = "192.0.2.2:5001".parse().unwrap();
//! let cp = "192.0.2.1:40000".parse().unwrap();
//! let Lookup::Query(mut txn) = client.begin(now, 0x1234, ap, cp) else { unreachable!() };
//! let req = MessageRepr::parse_bytes(&txn.poll_transmit(now).unwrap()).unwrap();
//! assert_eq!(req.mtype, MsgType::REQ);
//!
//! // The server answers: SDP listener on port 40001, cache for 2 s.
//! let accept = MessageRepr { mtype: MsgType::ACCEPT, ap_port: 40001, pm_time: PmTime(8), ..req };
//! txn.handle_datagram(now, &accept.to_bytes());
//! assert!(matches!(txn.outcome(), Some(Outcome::Accept { .. })));
//! let ack = MessageRepr::parse_bytes(&txn.poll_transmit(now).unwrap()).unwrap();
//! assert_eq!(ack.mtype, MsgType::ACK);
//!
//! assert_eq!(client.finish(now, &txn), Decision::Sdp("192.0.2.2:40001".parse().unwrap()));
//! // Cached for the next connection to the same service.
//! assert!(matches!(client.begin(now, 1, ap, cp), Lookup::Decided(Decision::Sdp(_))));
//! ```
#![forbid(unsafe_code)]

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use crate::wire::{self, MessageRepr, MsgType, PmTime, MESSAGE_LEN};

/// Retransmission schedule of one transaction (§7.5.1 "The PM Client MUST
/// arm a timeout when transmitting a PMReq Message").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Wait before the first retransmission.
    pub initial_rto: Duration,
    /// The wait doubles after each retransmission up to this.
    pub max_rto: Duration,
    /// Total time from the first PMReq to giving up (fallback to TCP).
    pub budget: Duration,
}

impl Default for Timing {
    /// PMReqs at 0, 50, 150, 350 and 750 ms; no answer by 900 ms means
    /// TCP, so that the decision lands within 1 s even on a busy host.
    fn default() -> Self {
        Timing {
            initial_rto: Duration::from_millis(50),
            max_rto: Duration::from_millis(400),
            budget: Duration::from_millis(900),
        }
    }
}

/// How a transaction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// PMAccept: connect to `sdp`; cacheable per `pm_time`.
    Accept {
        /// The SDP address (ApIPAddr, ApPort of the PMAccept).
        sdp: SocketAddr,
        /// PmTime of the PMAccept.
        pm_time: PmTime,
        /// When the PMAccept arrived (PmTime counts from here, §7.3.1.4).
        at: Instant,
    },
    /// PMDeny.
    Deny,
    /// No reply within the budget.
    NoAnswer,
    /// ICMP port (or host) unreachable: no port mapper there.
    Unreachable,
}

/// What [`Transaction::handle_datagram`] made of a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Received {
    /// The first reply: the transaction is decided.
    Decided,
    /// A reply after the first (§7.5.1 "MUST discard any additional
    /// replies").
    Duplicate,
    /// Not a reply to this transaction (malformed, wrong type, other
    /// three-tuple): discarded (§7.5.1 "has no associated state for the
    /// Message, the Message MUST be discarded").
    Ignored,
}

/// One PMReq exchange. See the module documentation.
#[derive(Debug, Clone)]
pub struct Transaction {
    req: MessageRepr,
    timing: Timing,
    deadline: Instant,
    next_tx: Option<Instant>,
    rto: Duration,
    sent: u32,
    outcome: Option<Outcome>,
    ack: Option<[u8; MESSAGE_LEN]>,
}

impl Transaction {
    /// A transaction for PMReq `req` (its `mtype` is forced to PMReq); the
    /// first PMReq is due at `now`.
    pub fn new(now: Instant, req: MessageRepr, timing: Timing) -> Transaction {
        Transaction {
            req: MessageRepr {
                mtype: MsgType::REQ,
                pm_time: PmTime::NO_CACHE,
                ..req
            },
            timing,
            deadline: now.checked_add(timing.budget).unwrap_or(now),
            next_tx: Some(now),
            rto: timing.initial_rto,
            sent: 0,
            outcome: None,
            ack: None,
        }
    }

    /// The PMReq this transaction sends.
    pub fn request(&self) -> &MessageRepr {
        &self.req
    }

    /// How many PMReqs were sent so far.
    pub fn transmissions(&self) -> u32 {
        self.sent
    }

    /// The outcome, once decided. It never changes afterwards.
    pub fn outcome(&self) -> Option<Outcome> {
        self.outcome
    }

    /// A datagram to send now, if any: the PMAck owed for a PMAccept, or a
    /// PMReq (first or retransmission) that is due.
    pub fn poll_transmit(&mut self, now: Instant) -> Option<[u8; MESSAGE_LEN]> {
        if let Some(ack) = self.ack.take() {
            return Some(ack);
        }
        if self.outcome.is_some() {
            return None;
        }
        let due = self.next_tx?;
        if due > now {
            return None;
        }
        // §7.5.1: "the PM Client MUST retransmit the PMReq Message and re-arm
        // the timeout, up to a maximum number of retransmissions" — here,
        // bounded by total time so the caller's wait is bounded.
        let next = now.checked_add(self.rto).filter(|&t| t < self.deadline);
        self.next_tx = next;
        self.rto = (self.rto * 2).min(self.timing.max_rto);
        self.sent += 1;
        // §7.5.1: "MUST use the same AssocHandle, ApPort, ApIPAddr, CpPort,
        // and CpIPAddr on any retransmissions of PMReq."
        Some(self.req.to_bytes())
    }

    /// When [`Transaction::handle_timeout`] (or `poll_transmit`) is next
    /// needed; `None` once decided and nothing is left to send.
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.outcome.is_some() {
            return None;
        }
        Some(match self.next_tx {
            Some(t) => t.min(self.deadline),
            None => self.deadline,
        })
    }

    /// Advance time: past the budget with no reply, the outcome is
    /// [`Outcome::NoAnswer`] (§7.5.1: "the PM Client SHOULD stop attempting
    /// to connect to an SDP Address and instead use the Conventional
    /// Address").
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.outcome.is_none() && now >= self.deadline {
            self.outcome = Some(Outcome::NoAnswer);
        }
    }

    /// An ICMP port or host unreachable for our PMReq: no port mapper
    /// listens there, so decide now instead of retransmitting into nothing.
    pub fn handle_unreachable(&mut self, _now: Instant) {
        if self.outcome.is_none() {
            self.outcome = Some(Outcome::Unreachable);
        }
    }

    /// A datagram from the port mapper.
    pub fn handle_datagram(&mut self, now: Instant, data: &[u8]) -> Received {
        let Ok(m) = MessageRepr::parse_bytes(data) else {
            return Received::Ignored;
        };
        // §7.5: "The PM Client detects duplicate PMAccept or PMDeny messages
        // by comparing the 3-tuple (AssocHandle, CpPort, CpIPAddr)".
        if m.assoc_handle != self.req.assoc_handle
            || m.cp_port != self.req.cp_port
            || m.cp_addr.to_canonical() != self.req.cp_addr.to_canonical()
        {
            return Received::Ignored;
        }
        let outcome = match m.mtype {
            // A PMAccept naming port 0 cannot be connected to: not an answer.
            MsgType::ACCEPT if m.ap_port != 0 => Outcome::Accept {
                sdp: SocketAddr::new(m.ap_addr.to_canonical(), m.ap_port),
                pm_time: m.pm_time,
                at: now,
            },
            // §7.3.1.6: a PMDeny's ApPort is "ignored on receive".
            MsgType::DENY => Outcome::Deny,
            _ => return Received::Ignored,
        };
        if self.outcome.is_some() {
            // §7.5.1: "the PM Client MUST discard any additional replies
            // (PMAccept or PMDeny) to the request." Also no second PMAck.
            return Received::Duplicate;
        }
        self.outcome = Some(outcome);
        if m.mtype == MsgType::ACCEPT {
            // §7.4: "Upon receipt of a PMAccept Message, the PM Client MUST
            // return a PMAck Message", echoing the PMAccept's fields.
            // §7.4: "Upon receipt of a PMDeny Message, the PM Client ... MUST
            // not issue a PMAck Message."
            let ack = MessageRepr {
                mtype: MsgType::ACK,
                pm_time: PmTime::NO_CACHE,
                ..m
            };
            self.ack = Some(ack.to_bytes());
        }
        Received::Decided
    }
}

/// Why a connection goes over plain TCP.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fallback {
    /// The port mapper said PMDeny (or a cached PMDeny).
    Denied,
    /// No answer within the budget (or cached).
    NoAnswer,
    /// No port mapper on the host, per ICMP (or cached).
    Unreachable,
}

/// What to connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Connect to this SDP address.
    Sdp(SocketAddr),
    /// Connect to the Conventional Address over TCP.
    Tcp(Fallback),
}

/// The answer of [`Client::begin`].
// Short-lived and moved once; boxing the transaction would only add an
// allocation per connection.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Lookup {
    /// Decided from a cache; nothing to send.
    Decided(Decision),
    /// Run this transaction, then give it to [`Client::finish`].
    Query(Transaction),
}

/// Client policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientConfig {
    /// Retransmission schedule.
    pub timing: Timing,
    /// The port mapper's UDP port on the target host.
    pub server_port: u16,
    /// How long a PMDeny (per host and port) or a silent/unreachable host
    /// (per host) keeps the client from asking again.
    pub negative_ttl: Duration,
    /// Most entries in each cache.
    pub max_cache: usize,
}

impl Default for ClientConfig {
    fn default() -> Self {
        ClientConfig {
            timing: Timing::default(),
            server_port: wire::DEFAULT_PORT,
            negative_ttl: Duration::from_secs(30),
            max_cache: 1024,
        }
    }
}

/// A cache entry's end; `None` is "permanently" (PmTime 255).
type Expiry = Option<Instant>;

fn live(e: &Expiry, now: Instant) -> bool {
    e.is_none_or(|t| now < t)
}

/// Insert into a bounded map: expired entries go first, then an arbitrary one.
fn bounded_insert<K: std::hash::Hash + Eq + Copy, V>(
    map: &mut HashMap<K, (V, Expiry)>,
    max: usize,
    now: Instant,
    k: K,
    v: (V, Expiry),
) {
    if max == 0 {
        return;
    }
    if !map.contains_key(&k) && map.len() >= max {
        map.retain(|_, (_, e)| live(e, now));
        if map.len() >= max {
            if let Some(&victim) = map.keys().next() {
                map.remove(&victim);
            }
        }
    }
    map.insert(k, v);
}

/// What a cache entry is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheKey {
    /// One service: ApIPAddr and ApPort.
    Service(SocketAddr),
    /// Every port of a host (no port mapper answered there).
    Host(IpAddr),
}

/// One live cache entry, for observability ([`Client::entries`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheEntry {
    /// What it answers for.
    pub key: CacheKey,
    /// The answer a connection gets from it.
    pub decision: Decision,
    /// Time left; `None` is permanent (PmTime 255).
    pub expires_in: Option<Duration>,
}

/// The PM Client: handle allocation and caches. See the module docs.
#[derive(Debug)]
pub struct Client {
    cfg: ClientConfig,
    /// (ApIPAddr, ApPort) → SDP address.
    positive: HashMap<(IpAddr, u16), (SocketAddr, Expiry)>,
    /// (ApIPAddr, ApPort) denied.
    denied: HashMap<(IpAddr, u16), ((), Expiry)>,
    /// ApIPAddr with no port mapper.
    dead_hosts: HashMap<IpAddr, (Fallback, Expiry)>,
    /// (AssocHandle, CpIPAddr, CpPort) of transactions in flight.
    in_flight: HashSet<(u64, IpAddr, u16)>,
}

impl Client {
    /// A client with empty caches.
    pub fn new(cfg: ClientConfig) -> Client {
        Client {
            cfg,
            positive: HashMap::new(),
            denied: HashMap::new(),
            dead_hosts: HashMap::new(),
            in_flight: HashSet::new(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ClientConfig {
        &self.cfg
    }

    /// The caches' answer for `ap`, if they have one: then no PMReq, and
    /// no CpIPAddr, is needed.
    pub fn cached(&mut self, now: Instant, ap: SocketAddr) -> Option<Decision> {
        let host = ap.ip().to_canonical();
        let key = (host, ap.port());
        if let Some((sdp, e)) = self.positive.get(&key) {
            if live(e, now) {
                return Some(Decision::Sdp(*sdp));
            }
            self.positive.remove(&key);
        }
        if let Some((_, e)) = self.denied.get(&key) {
            if live(e, now) {
                return Some(Decision::Tcp(Fallback::Denied));
            }
            self.denied.remove(&key);
        }
        if let Some((why, e)) = self.dead_hosts.get(&host) {
            if live(e, now) {
                return Some(Decision::Tcp(*why));
            }
            self.dead_hosts.remove(&host);
        }
        None
    }

    /// Start resolving the Conventional Address `ap` for a connection from
    /// `cp` (the local address and TCP port the connection will use).
    /// `rand` is a fresh random number; it becomes the AssocHandle unless
    /// that would repeat one in flight for the same `cp` (§7.5.1: "MUST
    /// select the combination of the AssocHandle, CpIPAddr, and CpPort to
    /// ensure that it is unique"; "SHOULD be chosen at random").
    pub fn begin(&mut self, now: Instant, rand: u64, ap: SocketAddr, cp: SocketAddr) -> Lookup {
        if let Some(d) = self.cached(now, ap) {
            return Lookup::Decided(d);
        }
        let cp_addr = cp.ip();
        let mut handle = rand;
        while self.in_flight.contains(&(handle, cp_addr, cp.port())) {
            handle = handle.wrapping_add(0x9e37_79b9_7f4a_7c15);
        }
        self.in_flight.insert((handle, cp_addr, cp.port()));
        // §7.4: PMReq fields: ApPort the listen port, CpPort the local TCP
        // port, CpIPAddr/ApIPAddr the connection's addresses, PmTime zero.
        let (cp_ip, ap_ip) = match (cp_addr, ap.ip()) {
            // Both of one family, so that IPV is right (§7.3.1.3).
            (IpAddr::V4(c), IpAddr::V6(a)) => (IpAddr::V6(c.to_ipv6_mapped()), IpAddr::V6(a)),
            (IpAddr::V6(c), IpAddr::V4(a)) => (IpAddr::V6(c), IpAddr::V6(a.to_ipv6_mapped())),
            (c, a) => (c, a),
        };
        let req = MessageRepr {
            mtype: MsgType::REQ,
            pm_time: PmTime::NO_CACHE,
            ap_port: ap.port(),
            cp_port: cp.port(),
            assoc_handle: handle,
            cp_addr: cp_ip,
            ap_addr: ap_ip,
        };
        Lookup::Query(Transaction::new(now, req, self.cfg.timing))
    }

    /// A transaction from [`Client::begin`] is decided (or abandoned):
    /// record the outcome in the caches and release its handle.
    pub fn finish(&mut self, now: Instant, txn: &Transaction) -> Decision {
        let r = txn.request();
        self.in_flight
            .remove(&(r.assoc_handle, r.cp_addr, r.cp_port));
        let host = r.ap_addr.to_canonical();
        let key = (host, r.ap_port);
        let neg_until = now.checked_add(self.cfg.negative_ttl);
        match txn.outcome() {
            Some(Outcome::Accept { sdp, pm_time, at }) => {
                // §7.3.1.4: PmTime 0: "MUST NOT cache"; 255: "MAY permanently
                // cache"; otherwise cache for the decoded time from receipt.
                let expiry = match pm_time {
                    PmTime::NO_CACHE => None::<Expiry>,
                    PmTime::PERMANENT => Some(None),
                    t => at.checked_add(t.duration()).map(Some),
                };
                if let Some(e) = expiry {
                    bounded_insert(&mut self.positive, self.cfg.max_cache, now, key, (sdp, e));
                }
                self.denied.remove(&key);
                self.dead_hosts.remove(&host);
                Decision::Sdp(sdp)
            }
            Some(Outcome::Deny) => {
                self.positive.remove(&key);
                if let Some(t) = neg_until {
                    bounded_insert(
                        &mut self.denied,
                        self.cfg.max_cache,
                        now,
                        key,
                        ((), Some(t)),
                    );
                }
                Decision::Tcp(Fallback::Denied)
            }
            Some(Outcome::Unreachable) => {
                self.mark_dead(now, host, Fallback::Unreachable, neg_until);
                Decision::Tcp(Fallback::Unreachable)
            }
            Some(Outcome::NoAnswer) | None => {
                self.mark_dead(now, host, Fallback::NoAnswer, neg_until);
                Decision::Tcp(Fallback::NoAnswer)
            }
        }
    }

    fn mark_dead(&mut self, now: Instant, host: IpAddr, why: Fallback, until: Option<Instant>) {
        self.positive.retain(|(h, _), _| *h != host);
        if let Some(t) = until {
            bounded_insert(
                &mut self.dead_hosts,
                self.cfg.max_cache,
                now,
                host,
                (why, Some(t)),
            );
        }
    }

    /// Connecting to the SDP address failed (e.g. TCP RST, §7.5.1: "SHOULD
    /// view this as equivalent to receiving a PMDeny Message"): forget the
    /// cached mapping and remember the denial.
    pub fn sdp_connect_failed(&mut self, now: Instant, ap: SocketAddr) {
        let key = (ap.ip().to_canonical(), ap.port());
        self.positive.remove(&key);
        if let Some(t) = now.checked_add(self.cfg.negative_ttl) {
            bounded_insert(
                &mut self.denied,
                self.cfg.max_cache,
                now,
                key,
                ((), Some(t)),
            );
        }
    }

    /// The cached mapping for `ap` named an SDP address that refused the
    /// connection: the listener behind it is gone (the server listened
    /// again since), so the mapping is dropped, with no denial recorded,
    /// for the caller to ask again.
    pub fn forget(&mut self, ap: SocketAddr) {
        self.positive.remove(&(ap.ip().to_canonical(), ap.port()));
    }

    /// Forget every cached answer.
    pub fn clear_cache(&mut self) {
        self.positive.clear();
        self.denied.clear();
        self.dead_hosts.clear();
    }

    /// The live entries of the caches, at most `max`: positive answers
    /// first, then denials, then silent hosts.
    pub fn entries(&self, now: Instant, max: usize) -> Vec<CacheEntry> {
        let left = |e: &Expiry| e.map(|t| t.saturating_duration_since(now));
        let positive = self.positive.iter().map(|(&(ip, port), (sdp, e))| {
            (
                CacheKey::Service(SocketAddr::new(ip, port)),
                Decision::Sdp(*sdp),
                e,
            )
        });
        let denied = self.denied.iter().map(|(&(ip, port), ((), e))| {
            let key = CacheKey::Service(SocketAddr::new(ip, port));
            (key, Decision::Tcp(Fallback::Denied), e)
        });
        let dead = self
            .dead_hosts
            .iter()
            .map(|(&ip, (why, e))| (CacheKey::Host(ip), Decision::Tcp(*why), e));
        positive
            .chain(denied)
            .chain(dead)
            .filter(|(_, _, e)| live(e, now))
            .take(max)
            .map(|(key, decision, e)| CacheEntry {
                key,
                decision,
                expires_in: left(e),
            })
            .collect()
    }

    /// Transactions begun and not finished.
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    const AP: &str = "10.0.0.2:5001";
    const CP: &str = "10.0.0.1:40000";

    fn start(c: &mut Client, now: Instant, rand: u64) -> Transaction {
        match c.begin(now, rand, sa(AP), sa(CP)) {
            Lookup::Query(t) => t,
            other => panic!("{other:?}"),
        }
    }

    fn reply(t: &Transaction, mt: MsgType, port: u16, pm: u8) -> [u8; 48] {
        MessageRepr {
            mtype: mt,
            ap_port: port,
            pm_time: PmTime(pm),
            ..*t.request()
        }
        .to_bytes()
    }

    #[test]
    fn entries_list_each_cache_with_its_time_left() {
        let mut c = Client::new(ClientConfig::default());
        let now = Instant::now();
        let mut t = start(&mut c, now, 1);
        t.handle_datagram(now, &reply(&t, MsgType::ACCEPT, 40001, 8));
        c.finish(now, &t);
        let other = sa("10.0.0.3:22");
        let Lookup::Query(mut t) = c.begin(now, 2, other, sa(CP)) else {
            panic!("cached")
        };
        t.handle_datagram(now, &reply(&t, MsgType::DENY, 22, 0));
        c.finish(now, &t);
        let later = now + Duration::from_millis(500);
        let entries = c.entries(later, 10);
        assert_eq!(
            entries,
            [
                CacheEntry {
                    key: CacheKey::Service(sa(AP)),
                    decision: Decision::Sdp(sa("10.0.0.2:40001")),
                    expires_in: Some(PmTime(8).duration() - Duration::from_millis(500)),
                },
                CacheEntry {
                    key: CacheKey::Service(other),
                    decision: Decision::Tcp(Fallback::Denied),
                    expires_in: Some(Duration::from_millis(29_500)),
                },
            ]
        );
        assert_eq!(c.entries(later, 1).len(), 1);
        // Expired entries are not listed.
        assert_eq!(c.entries(now + Duration::from_secs(31), 10), []);
    }

    #[test]
    fn request_fields() {
        let mut c = Client::new(ClientConfig::default());
        let now = Instant::now();
        let mut t = start(&mut c, now, 42);
        let r = MessageRepr::parse_bytes(&t.poll_transmit(now).unwrap()).unwrap();
        assert_eq!(
            r,
            MessageRepr {
                mtype: MsgType::REQ,
                pm_time: PmTime(0),
                ap_port: 5001,
                cp_port: 40000,
                assoc_handle: 42,
                cp_addr: "10.0.0.1".parse().unwrap(),
                ap_addr: "10.0.0.2".parse().unwrap(),
            }
        );
        assert_eq!(t.poll_transmit(now), None);
    }

    #[test]
    fn retransmission_schedule_and_budget() {
        let now = Instant::now();
        let mut t = Transaction::new(
            now,
            MessageRepr {
                mtype: MsgType::ACK,
                pm_time: PmTime(9),
                ap_port: 1,
                cp_port: 2,
                assoc_handle: 3,
                cp_addr: "::1".parse().unwrap(),
                ap_addr: "::1".parse().unwrap(),
            },
            Timing::default(),
        );
        let mut sends = Vec::new();
        let mut clock = now;
        while t.outcome().is_none() {
            while let Some(b) = t.poll_transmit(clock) {
                let m = MessageRepr::parse_bytes(&b).unwrap();
                assert_eq!((m.mtype, m.pm_time), (MsgType::REQ, PmTime(0)));
                sends.push((clock - now).as_millis());
            }
            clock = t.poll_timeout().unwrap();
            t.handle_timeout(clock);
        }
        assert_eq!(sends, [0, 50, 150, 350, 750]);
        assert_eq!(clock - now, Duration::from_millis(900));
        assert_eq!(t.outcome(), Some(Outcome::NoAnswer));
        assert_eq!(t.transmissions(), 5);
        assert_eq!(t.poll_timeout(), None);
    }

    #[test]
    fn first_reply_wins() {
        let mut c = Client::new(ClientConfig::default());
        let now = Instant::now();
        let mut t = start(&mut c, now, 42);
        t.poll_transmit(now);
        let deny = reply(&t, MsgType::DENY, 0, 0);
        let accept = reply(&t, MsgType::ACCEPT, 40001, 8);
        assert_eq!(t.handle_datagram(now, &deny), Received::Decided);
        assert_eq!(t.handle_datagram(now, &accept), Received::Duplicate);
        assert_eq!(t.handle_datagram(now, &deny), Received::Duplicate);
        assert_eq!(t.outcome(), Some(Outcome::Deny));
        // No PMAck after a PMDeny, and nothing more to send.
        assert_eq!(t.poll_transmit(now + Duration::from_secs(5)), None);
        t.handle_unreachable(now);
        assert_eq!(t.outcome(), Some(Outcome::Deny));
        assert_eq!(c.finish(now, &t), Decision::Tcp(Fallback::Denied));
        // Cached per host and port.
        assert!(matches!(
            c.begin(now, 1, sa(AP), sa(CP)),
            Lookup::Decided(Decision::Tcp(Fallback::Denied))
        ));
        assert!(matches!(
            c.begin(now, 1, sa("10.0.0.2:5002"), sa(CP)),
            Lookup::Query(_)
        ));
    }

    #[test]
    fn accept_sends_one_ack() {
        let mut c = Client::new(ClientConfig::default());
        let now = Instant::now();
        let mut t = start(&mut c, now, 42);
        t.poll_transmit(now);
        let accept = reply(&t, MsgType::ACCEPT, 40001, 8);
        assert_eq!(t.handle_datagram(now, &accept), Received::Decided);
        assert_eq!(t.handle_datagram(now, &accept), Received::Duplicate);
        let ack = MessageRepr::parse_bytes(&t.poll_transmit(now).unwrap()).unwrap();
        assert_eq!(
            ack,
            MessageRepr {
                mtype: MsgType::ACK,
                pm_time: PmTime(0),
                ..MessageRepr::parse_bytes(&accept).unwrap()
            }
        );
        assert_eq!(t.poll_transmit(now), None);
        assert_eq!(t.poll_timeout(), None);
    }

    #[test]
    fn foreign_replies_ignored() {
        let mut c = Client::new(ClientConfig::default());
        let now = Instant::now();
        let mut t = start(&mut c, now, 42);
        t.poll_transmit(now);
        let good = reply(&t, MsgType::ACCEPT, 40001, 8);
        let mut other = MessageRepr::parse_bytes(&good).unwrap();
        other.assoc_handle = 43;
        assert_eq!(t.handle_datagram(now, &other.to_bytes()), Received::Ignored);
        other.assoc_handle = 42;
        other.cp_port = 1;
        assert_eq!(t.handle_datagram(now, &other.to_bytes()), Received::Ignored);
        other.cp_port = 40000;
        other.cp_addr = "10.0.0.9".parse().unwrap();
        assert_eq!(t.handle_datagram(now, &other.to_bytes()), Received::Ignored);
        assert_eq!(t.handle_datagram(now, &good[..47]), Received::Ignored);
        assert_eq!(
            t.handle_datagram(now, &reply(&t, MsgType::REQ, 1, 0)),
            Received::Ignored
        );
        assert_eq!(
            t.handle_datagram(now, &reply(&t, MsgType::ACK, 1, 0)),
            Received::Ignored
        );
        assert_eq!(
            t.handle_datagram(now, &reply(&t, MsgType::ACCEPT, 0, 0)),
            Received::Ignored
        );
        assert_eq!(t.outcome(), None);
        assert_eq!(t.handle_datagram(now, &good), Received::Decided);
    }

    #[test]
    fn pm_time_cache() {
        let mut c = Client::new(ClientConfig::default());
        let now = Instant::now();
        let mut t = start(&mut c, now, 1);
        t.handle_datagram(now, &reply(&t, MsgType::ACCEPT, 40001, 4)); // 1 s
        let sdp = Decision::Sdp(sa("10.0.0.2:40001"));
        assert_eq!(c.finish(now, &t), sdp);
        let later = now + Duration::from_millis(999);
        assert!(matches!(c.begin(later, 2, sa(AP), sa(CP)), Lookup::Decided(d) if d == sdp));
        // §7.3.1.4: "When the PmTime has elapsed, the PM Client MUST flush".
        let t2 = match c.begin(now + Duration::from_secs(1), 2, sa(AP), sa(CP)) {
            Lookup::Query(t) => t,
            other => panic!("{other:?}"),
        };
        // PmTime 0: single use, not cached.
        let mut t2 = t2;
        t2.handle_datagram(now, &reply(&t2, MsgType::ACCEPT, 40002, 0));
        assert_eq!(c.finish(now, &t2), Decision::Sdp(sa("10.0.0.2:40002")));
        assert!(matches!(c.begin(now, 3, sa(AP), sa(CP)), Lookup::Query(_)));
        // PmTime 255: permanent.
        let mut c = Client::new(ClientConfig::default());
        let mut t = start(&mut c, now, 1);
        t.handle_datagram(now, &reply(&t, MsgType::ACCEPT, 40003, 255));
        c.finish(now, &t);
        let much_later = now + Duration::from_secs(86_400 * 365);
        assert!(matches!(
            c.begin(much_later, 2, sa(AP), sa(CP)),
            Lookup::Decided(Decision::Sdp(_))
        ));
        // Until the SDP address refuses a connection.
        c.sdp_connect_failed(much_later, sa(AP));
        assert!(matches!(
            c.begin(much_later, 2, sa(AP), sa(CP)),
            Lookup::Decided(Decision::Tcp(Fallback::Denied))
        ));
    }

    #[test]
    fn a_forgotten_mapping_is_asked_again_not_denied() {
        let mut c = Client::new(ClientConfig::default());
        let now = Instant::now();
        let mut t = start(&mut c, now, 1);
        t.handle_datagram(now, &reply(&t, MsgType::ACCEPT, 40001, 255));
        c.finish(now, &t);
        assert!(matches!(
            c.begin(now, 2, sa(AP), sa(CP)),
            Lookup::Decided(Decision::Sdp(_))
        ));
        c.forget(sa(AP));
        assert!(matches!(c.begin(now, 3, sa(AP), sa(CP)), Lookup::Query(_)));
    }

    #[test]
    fn negative_cache_per_host() {
        let cfg = ClientConfig {
            negative_ttl: Duration::from_secs(10),
            ..ClientConfig::default()
        };
        let mut c = Client::new(cfg);
        let now = Instant::now();
        let mut t = start(&mut c, now, 1);
        t.handle_unreachable(now);
        assert_eq!(c.finish(now, &t), Decision::Tcp(Fallback::Unreachable));
        // Any port on that host.
        assert!(matches!(
            c.begin(now, 1, sa("10.0.0.2:80"), sa(CP)),
            Lookup::Decided(Decision::Tcp(Fallback::Unreachable))
        ));
        assert!(matches!(
            c.begin(now, 1, sa("10.0.0.3:80"), sa(CP)),
            Lookup::Query(_)
        ));
        assert!(matches!(
            c.begin(now + Duration::from_secs(10), 1, sa(AP), sa(CP)),
            Lookup::Query(_)
        ));
        // An unfinished (abandoned) transaction counts as no answer.
        let mut c = Client::new(ClientConfig::default());
        let t = start(&mut c, now, 1);
        assert_eq!(c.finish(now, &t), Decision::Tcp(Fallback::NoAnswer));
        assert_eq!(c.in_flight(), 0);
        c.clear_cache();
        assert!(matches!(c.begin(now, 1, sa(AP), sa(CP)), Lookup::Query(_)));
    }

    #[test]
    fn handles_unique_in_flight() {
        let mut c = Client::new(ClientConfig::default());
        let now = Instant::now();
        let a = start(&mut c, now, 7);
        let b = start(&mut c, now, 7);
        assert_ne!(a.request().assoc_handle, b.request().assoc_handle);
        assert_eq!(c.in_flight(), 2);
        c.finish(now, &a);
        c.finish(now, &b);
        assert_eq!(c.in_flight(), 0);
    }

    #[test]
    fn cache_is_bounded() {
        let cfg = ClientConfig {
            max_cache: 3,
            ..ClientConfig::default()
        };
        let mut c = Client::new(cfg);
        let now = Instant::now();
        for i in 0..10u8 {
            let ap = SocketAddr::new(IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 1, i)), 1);
            let Lookup::Query(mut t) = c.begin(now, 1, ap, sa(CP)) else {
                panic!()
            };
            t.handle_datagram(now, &reply(&t, MsgType::ACCEPT, 2, 255));
            c.finish(now, &t);
        }
        assert_eq!(c.positive.len(), 3);
    }

    #[test]
    fn mixed_family_request_is_v6() {
        let mut c = Client::new(ClientConfig::default());
        let now = Instant::now();
        let Lookup::Query(mut t) = c.begin(now, 1, sa("[::1]:5001"), sa("127.0.0.1:4")) else {
            panic!()
        };
        let b = t.poll_transmit(now).unwrap();
        assert_eq!(b[0] & 0xf, 6);
    }
}
