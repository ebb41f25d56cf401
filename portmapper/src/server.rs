//! The Port Mapper Service Provider (PMSP) of draft-pinkerton-iwarp-sdp-01
//! §7.4–§7.5.2 and §15.2, as a sans-IO state machine.
//!
//! Read §7.5.2 first. The [`Server`] takes datagrams, registration changes,
//! "a connection arrived" notices and the current time; it gives back the
//! reply to send (always to the UDP source of the request, §7.4) and the
//! next timer deadline. It never touches a socket or a clock; the
//! `sdp-portmapper` daemon is its driver.
//!
//! State kept, and why it stays bounded:
//!
//! * registrations `(address, P) → Q` made by local listeners
//!   ([`Server::register`]), at most [`ServerConfig::max_registrations`];
//! * one pending transaction per PMAccept sent, keyed by the four-tuple
//!   (ApPort, CpPort, ApIPAddr, CpIPAddr) of the request, with the
//!   AssocHandle that completes the five-tuple of §7.5. It is deleted by the
//!   matching PMAck, by a connection to the SDP address, by its timer
//!   ([`ServerConfig::accept_timeout`]), or — when the table holds
//!   [`ServerConfig::max_pending`] entries — by eviction of the entry closest
//!   to expiry. A PMDeny leaves no state: a duplicate request is answered
//!   afresh, which is the "most recent state" §7.5.2 asks for;
//! * a token bucket per source (IPv4 address, IPv6 /64), at most
//!   [`ServerConfig::max_sources`]; sources beyond that share one bucket.
//!
//! Deleting a pending entry never affects a connection: the SDP listener Q
//! belongs to the registering process, not to the transaction (§7.5.2: "an
//! existing, established LLP connection to the SDP Address should be
//! unaffected").
#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use crate::wire::{self, MessageRepr, MsgType, PmTime, MESSAGE_LEN};

/// Policy and limits of a [`Server`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// PmTime put in every PMAccept (§7.3.1.4).
    pub pm_time: PmTime,
    /// How long a PMAccept's state waits for a PMAck or a connection
    /// (§7.5.2 "The PMSP SHOULD arm a timer when it sends a PMAccept").
    pub accept_timeout: Duration,
    /// Most pending transactions kept at once.
    pub max_pending: usize,
    /// Most registrations kept at once.
    pub max_registrations: usize,
    /// PMReqs per second allowed from one source (§15.2.1).
    pub rate_per_sec: u32,
    /// Burst of PMReqs allowed from one source.
    pub burst: u32,
    /// Most sources tracked individually; the rest share one bucket.
    pub max_sources: usize,
    /// Addresses to hand out as ApIPAddr in turn, for listeners bound to the
    /// wildcard address (load balancing, §7.4 "The Accepting Peer MAY return
    /// a different ApIPAddr"). Only those of the request's family are used.
    pub rewrite_addrs: Vec<IpAddr>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            pm_time: PmTime::from_duration(Duration::from_secs(30)),
            accept_timeout: Duration::from_secs(2),
            max_pending: 4096,
            max_registrations: 4096,
            rate_per_sec: 200,
            burst: 200,
            max_sources: 4096,
            rewrite_addrs: Vec::new(),
        }
    }
}

/// A listener registration: TCP port `port` on `addr` is served by the SDP
/// listener on `sdp_port` of the same address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// Who registered it (the driver's id for the control connection).
    pub owner: u64,
    /// The listeners' address; unspecified for a wildcard listener.
    pub addr: IpAddr,
    /// P, the application's TCP port.
    pub port: u16,
    /// Q, the SDP listener's port.
    pub sdp_port: u16,
    /// When it was made.
    pub since: Instant,
}

/// Why [`Server::register`] refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterError {
    /// Port 0 given for P or Q.
    ZeroPort,
    /// [`ServerConfig::max_registrations`] reached.
    Full,
}

/// The four-tuple (ApPort, CpPort, ApIPAddr, CpIPAddr) of §7.5.2 that
/// identifies a transaction apart from its AssocHandle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FourTuple {
    /// ApIPAddr of the request.
    pub ap_addr: IpAddr,
    /// ApPort of the request (P).
    pub ap_port: u16,
    /// CpIPAddr.
    pub cp_addr: IpAddr,
    /// CpPort.
    pub cp_port: u16,
}

/// A PMAccept sent and not yet acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// The request's four-tuple.
    pub key: FourTuple,
    /// The request's AssocHandle.
    pub assoc_handle: u64,
    /// The SDP port returned (Q).
    pub sdp_port: u16,
    /// The ApIPAddr returned.
    pub sdp_addr: IpAddr,
    /// Where the PMAccept went (the request's UDP source).
    pub reply_to: SocketAddr,
    /// When the state is deleted unless acknowledged.
    pub expires: Instant,
    timer_seq: u64,
}

/// What the server did with one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Not a port mapper message; dropped, never answered.
    Malformed(wire::Error),
    /// A PMReq over its source's rate limit; dropped.
    RateLimited,
    /// PMAccept sent. `duplicate`: the five-tuple matched a pending
    /// transaction. `replaced`: a transaction on the same four-tuple with
    /// another AssocHandle was discarded first. `evicted`: the table was
    /// full and the entry closest to expiry made room.
    Accepted {
        /// SDP port returned.
        sdp_port: u16,
        /// A retransmitted request.
        duplicate: bool,
        /// An older transaction was replaced.
        replaced: bool,
        /// Another transaction was evicted to make room.
        evicted: bool,
    },
    /// PMDeny sent (no registration for the port). `duplicate`: the request
    /// matched a pending transaction whose service has since gone.
    Denied {
        /// A retransmitted request.
        duplicate: bool,
        /// An older transaction was replaced.
        replaced: bool,
    },
    /// A PMAck completed a transaction.
    Acked,
    /// A PMAck with no matching state (§7.5.2 "it MUST discard").
    StrayAck,
    /// A PMAccept or PMDeny sent to the server; discarded.
    StrayReply,
}

/// The result of [`Server::handle_datagram`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handled {
    /// The reply, to be sent to the datagram's source.
    pub reply: Option<[u8; MESSAGE_LEN]>,
    /// The decoded message, if it decoded.
    pub msg: Option<MessageRepr>,
    /// What happened.
    pub action: Action,
}

/// Counters, for logs and `sdp-portmapper list`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Datagrams received.
    pub rx: u64,
    /// Malformed: shorter than 48 bytes.
    pub malformed_truncated: u64,
    /// Malformed: longer than 48 bytes.
    pub malformed_too_long: u64,
    /// Malformed: Ver ≠ 0.
    pub malformed_version: u64,
    /// Malformed: reserved IPV.
    pub malformed_ipv: u64,
    /// PMReqs dropped by the rate limit.
    pub rate_limited: u64,
    /// PMAccepts sent.
    pub accepts: u64,
    /// PMDenies sent.
    pub denies: u64,
    /// Duplicate PMReqs (five-tuple match).
    pub duplicates: u64,
    /// Transactions replaced by a new AssocHandle on the same four-tuple.
    pub replaced: u64,
    /// PMAcks that completed a transaction.
    pub acks: u64,
    /// PMAcks discarded.
    pub stray_acks: u64,
    /// PMAccept/PMDeny received and discarded.
    pub stray_replies: u64,
    /// Transactions deleted by their timer.
    pub expired: u64,
    /// Transactions evicted because the table was full.
    pub evicted: u64,
    /// Transactions completed by a connection notice.
    pub connected: u64,
}

impl Stats {
    /// All malformed datagrams.
    pub fn malformed(&self) -> u64 {
        self.malformed_truncated
            + self.malformed_too_long
            + self.malformed_version
            + self.malformed_ipv
    }
}

/// A token bucket, in millionths of a token.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    micro: u64,
    last: Instant,
}

const MICRO: u64 = 1_000_000;

impl Bucket {
    fn refill(&mut self, now: Instant, rate: u32, burst: u32) {
        let cap = u64::from(burst).saturating_mul(MICRO);
        let dt = now.saturating_duration_since(self.last);
        // tokens = dt * rate; in micro-tokens = dt_ns * rate / 1000.
        let add =
            (dt.as_nanos().saturating_mul(u128::from(rate)) / 1000).min(u128::from(cap)) as u64;
        self.micro = self.micro.saturating_add(add).min(cap);
        self.last = now;
    }

    fn take(&mut self) -> bool {
        if self.micro >= MICRO {
            self.micro -= MICRO;
            true
        } else {
            false
        }
    }

    fn is_full(&self, burst: u32) -> bool {
        self.micro >= u64::from(burst).saturating_mul(MICRO)
    }
}

/// The key a source is rate limited by: an IPv4 address or an IPv6 /64.
fn source_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(a) => IpAddr::V4(a),
        IpAddr::V6(a) => {
            let s = a.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
    }
}

#[derive(Debug)]
struct RateLimiter {
    sources: HashMap<IpAddr, Bucket>,
    shared: Option<Bucket>,
}

impl RateLimiter {
    fn allow(&mut self, now: Instant, src: IpAddr, cfg: &ServerConfig) -> bool {
        let key = source_key(src);
        let full = |now| Bucket {
            micro: u64::from(cfg.burst).saturating_mul(MICRO),
            last: now,
        };
        if !self.sources.contains_key(&key) && self.sources.len() >= cfg.max_sources {
            // Forget sources whose buckets have refilled: they are idle and
            // a fresh bucket is the same as theirs.
            for b in self.sources.values_mut() {
                b.refill(now, cfg.rate_per_sec, cfg.burst);
            }
            self.sources.retain(|_, b| !b.is_full(cfg.burst));
        }
        let bucket = if self.sources.len() < cfg.max_sources || self.sources.contains_key(&key) {
            self.sources.entry(key).or_insert_with(|| full(now))
        } else {
            self.shared.get_or_insert_with(|| full(now))
        };
        bucket.refill(now, cfg.rate_per_sec, cfg.burst);
        bucket.take()
    }
}

/// The PMSP state machine. See the module documentation.
#[derive(Debug)]
pub struct Server {
    cfg: ServerConfig,
    registrations: HashMap<u16, Vec<Registration>>,
    n_registrations: usize,
    pending: HashMap<FourTuple, Pending>,
    /// (AssocHandle, CpIPAddr, CpPort) → four-tuple, to match PMAcks, whose
    /// ApPort/ApIPAddr are the mapped ones.
    by_handle: HashMap<(u64, IpAddr, u16), FourTuple>,
    timers: BTreeMap<(Instant, u64), FourTuple>,
    timer_seq: u64,
    limiter: RateLimiter,
    rr: usize,
    stats: Stats,
}

fn later(now: Instant, d: Duration) -> Instant {
    // A configured duration too large for Instant: cap it at a year.
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 86_400)))
        .unwrap_or(now)
}

impl Server {
    /// A server with no registrations.
    pub fn new(cfg: ServerConfig) -> Server {
        Server {
            cfg,
            registrations: HashMap::new(),
            n_registrations: 0,
            pending: HashMap::new(),
            by_handle: HashMap::new(),
            timers: BTreeMap::new(),
            timer_seq: 0,
            limiter: RateLimiter {
                sources: HashMap::new(),
                shared: None,
            },
            rr: 0,
            stats: Stats::default(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.cfg
    }

    /// Replace the configuration, keeping registrations, pending
    /// transactions and counters (the daemon's reload). New limits apply to
    /// what comes next: tables over a lowered bound shrink as entries leave,
    /// timers already armed keep their deadlines, and the next PMAccept
    /// carries the new PmTime.
    pub fn set_config(&mut self, cfg: ServerConfig) {
        self.cfg = cfg;
        self.rr = 0;
    }

    /// The counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Pending transactions, in no particular order.
    pub fn pending(&self) -> impl Iterator<Item = &Pending> {
        self.pending.values()
    }

    /// Number of pending transactions.
    pub fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Number of sources with their own rate-limit bucket.
    pub fn sources_len(&self) -> usize {
        self.limiter.sources.len()
    }

    /// Registrations, in no particular order.
    pub fn registrations(&self) -> impl Iterator<Item = &Registration> {
        self.registrations.values().flatten()
    }

    /// Record that TCP port `port` on `addr` is served by SDP listener
    /// `sdp_port`. The caller has checked that `owner` listens on both.
    pub fn register(
        &mut self,
        now: Instant,
        owner: u64,
        addr: IpAddr,
        port: u16,
        sdp_port: u16,
    ) -> Result<(), RegisterError> {
        if port == 0 || sdp_port == 0 {
            return Err(RegisterError::ZeroPort);
        }
        let addr = addr.to_canonical();
        let list = self.registrations.entry(port).or_default();
        // A re-registration by the same owner replaces its earlier one.
        if let Some(r) = list.iter_mut().find(|r| r.owner == owner && r.addr == addr) {
            r.sdp_port = sdp_port;
            r.since = now;
            return Ok(());
        }
        if self.n_registrations >= self.cfg.max_registrations {
            if list.is_empty() {
                self.registrations.remove(&port);
            }
            return Err(RegisterError::Full);
        }
        list.push(Registration {
            owner,
            addr,
            port,
            sdp_port,
            since: now,
        });
        self.n_registrations += 1;
        Ok(())
    }

    /// Remove `owner`'s registration of `port` on `addr`; true if it existed.
    pub fn unregister(&mut self, owner: u64, addr: IpAddr, port: u16) -> bool {
        let addr = addr.to_canonical();
        let Some(list) = self.registrations.get_mut(&port) else {
            return false;
        };
        let before = list.len();
        list.retain(|r| !(r.owner == owner && r.addr == addr));
        let removed = before - list.len();
        if list.is_empty() {
            self.registrations.remove(&port);
        }
        self.n_registrations -= removed;
        removed > 0
    }

    /// Remove every registration of `owner` (its process is gone); returns
    /// what was removed. Pending transactions stay until their timers: a
    /// duplicate request is then denied, the service's most recent state.
    pub fn unregister_owner(&mut self, owner: u64) -> Vec<Registration> {
        let mut gone = Vec::new();
        self.registrations.retain(|_, list| {
            list.retain(|r| {
                if r.owner == owner {
                    gone.push(r.clone());
                    false
                } else {
                    true
                }
            });
            !list.is_empty()
        });
        self.n_registrations -= gone.len();
        gone
    }

    /// Does `owner` have a registration whose SDP port is `sdp_port`?
    pub fn owns_sdp_port(&self, owner: u64, sdp_port: u16) -> bool {
        self.registrations()
            .any(|r| r.owner == owner && r.sdp_port == sdp_port)
    }

    /// The registration serving `port` on `ap_addr`: one bound to that
    /// address first, else a wildcard one of the same family, else one on
    /// `::`; the most recent of those.
    pub fn lookup(&self, ap_addr: IpAddr, port: u16) -> Option<&Registration> {
        let ap = ap_addr.to_canonical();
        let list = self.registrations.get(&port)?;
        let exact = list.iter().rev().find(|r| r.addr == ap);
        let same_family = || {
            list.iter()
                .rev()
                .find(|r| r.addr.is_unspecified() && r.addr.is_ipv4() == ap.is_ipv4())
        };
        // A listener on :: takes IPv4 too (dual stack) — unless it is
        // IPV6_V6ONLY, as it must be when 0.0.0.0 on the same port is
        // bound too: hence the same family first. One on 0.0.0.0 takes
        // only IPv4.
        let any_v6 = || {
            list.iter()
                .rev()
                .find(|r| matches!(r.addr, IpAddr::V6(a) if a.is_unspecified()))
        };
        exact.or_else(same_family).or_else(any_v6)
    }

    /// The earliest timer deadline, if any.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.timers.keys().next().map(|(t, _)| *t)
    }

    /// Delete every pending transaction whose timer has expired (§7.5.2 "all
    /// resources associated with the PMReq MUST be deleted"); returns them.
    pub fn handle_timeout(&mut self, now: Instant) -> Vec<Pending> {
        let mut out = Vec::new();
        while let Some((&(t, seq), &key)) = self.timers.iter().next() {
            if t > now {
                break;
            }
            self.timers.remove(&(t, seq));
            if let Some(p) = self.remove_pending(&key) {
                self.stats.expired += 1;
                out.push(p);
            }
        }
        out
    }

    /// A connection from `cp_addr:cp_port` arrived at SDP port `sdp_port`:
    /// its transaction is complete (§7.5.2 "to be disabled when either a
    /// PMAck or LLP connection setup request ... has occurred"). Returns
    /// whether a pending transaction matched.
    pub fn handle_connection(&mut self, sdp_port: u16, cp_addr: IpAddr, cp_port: u16) -> bool {
        let cp = cp_addr.to_canonical();
        let key = self
            .pending
            .values()
            .find(|p| {
                p.sdp_port == sdp_port
                    && p.key.cp_port == cp_port
                    && p.key.cp_addr.to_canonical() == cp
            })
            .map(|p| p.key);
        match key.and_then(|k| self.remove_pending(&k)) {
            Some(_) => {
                self.stats.connected += 1;
                true
            }
            None => false,
        }
    }

    fn remove_pending(&mut self, key: &FourTuple) -> Option<Pending> {
        let p = self.pending.remove(key)?;
        self.timers.remove(&(p.expires, p.timer_seq));
        self.by_handle
            .remove(&(p.assoc_handle, p.key.cp_addr, p.key.cp_port));
        Some(p)
    }

    fn arm(&mut self, now: Instant, key: FourTuple) -> (Instant, u64) {
        let t = later(now, self.cfg.accept_timeout);
        self.timer_seq = self.timer_seq.wrapping_add(1);
        self.timers.insert((t, self.timer_seq), key);
        (t, self.timer_seq)
    }

    fn choose_ap_addr(&mut self, req_ap: IpAddr, reg: &Registration) -> IpAddr {
        if !reg.addr.is_unspecified() || self.cfg.rewrite_addrs.is_empty() {
            return req_ap;
        }
        let want_v4 = req_ap.to_canonical().is_ipv4();
        let n = self
            .cfg
            .rewrite_addrs
            .iter()
            .filter(|a| a.is_ipv4() == want_v4)
            .count();
        if n == 0 {
            return req_ap;
        }
        let i = self.rr % n;
        self.rr = self.rr.wrapping_add(1);
        let Some(&pick) = self
            .cfg
            .rewrite_addrs
            .iter()
            .filter(|a| a.is_ipv4() == want_v4)
            .nth(i)
        else {
            return req_ap;
        };
        // Keep the request's IPV (§7.4 "IPV - MUST be set to the same value
        // as the IPV field in the PMReq"): an IPv4 choice for an IPV 6
        // request goes out IPv4-mapped.
        match (req_ap, pick) {
            (IpAddr::V6(_), IpAddr::V4(a)) => IpAddr::V6(a.to_ipv6_mapped()),
            _ => pick,
        }
    }

    /// Handle one datagram from `from`. The reply, if any, goes to `from`.
    pub fn handle_datagram(&mut self, now: Instant, from: SocketAddr, data: &[u8]) -> Handled {
        self.stats.rx += 1;
        let msg = match MessageRepr::parse_bytes(data) {
            Ok(m) => m,
            Err(e) => {
                match e {
                    wire::Error::Truncated => self.stats.malformed_truncated += 1,
                    wire::Error::TooLong => self.stats.malformed_too_long += 1,
                    wire::Error::BadVersion => self.stats.malformed_version += 1,
                    _ => self.stats.malformed_ipv += 1,
                }
                return Handled {
                    reply: None,
                    msg: None,
                    action: Action::Malformed(e),
                };
            }
        };
        let (reply, action) = match msg.mtype {
            MsgType::REQ => self.on_request(now, from, &msg),
            MsgType::ACK => (None, self.on_ack(from, &msg)),
            _ => {
                // A PMAccept or PMDeny is only ever sent by a PMSP; one that
                // reaches us is stray or spoofed.
                self.stats.stray_replies += 1;
                (None, Action::StrayReply)
            }
        };
        Handled {
            reply,
            msg: Some(msg),
            action,
        }
    }

    fn on_ack(&mut self, from: SocketAddr, m: &MessageRepr) -> Action {
        let Some(&key) = self.by_handle.get(&(m.assoc_handle, m.cp_addr, m.cp_port)) else {
            // §7.5.2: "if a PMSP receives a PMAck Message which does not
            // relate to any known state, it MUST discard the PMAck message."
            self.stats.stray_acks += 1;
            return Action::StrayAck;
        };
        let matches = self.pending.get(&key).is_some_and(|p| {
            // §7.4: the PMAck echoes the PMAccept's ApPort and ApIPAddr and
            // comes from where the PMAccept went.
            p.sdp_port == m.ap_port && p.sdp_addr == m.ap_addr && p.reply_to == from
        });
        if !matches {
            self.stats.stray_acks += 1;
            return Action::StrayAck;
        }
        self.remove_pending(&key);
        self.stats.acks += 1;
        Action::Acked
    }

    fn on_request(
        &mut self,
        now: Instant,
        from: SocketAddr,
        m: &MessageRepr,
    ) -> (Option<[u8; MESSAGE_LEN]>, Action) {
        // §15.2.1: limit what one source can make us do.
        if !self.limiter.allow(now, from.ip(), &self.cfg) {
            self.stats.rate_limited += 1;
            return (None, Action::RateLimited);
        }
        let key = FourTuple {
            ap_addr: m.ap_addr,
            ap_port: m.ap_port,
            cp_addr: m.cp_addr,
            cp_port: m.cp_port,
        };
        let mut duplicate = false;
        let mut replaced = false;
        if let Some(p) = self.pending.get(&key) {
            if p.assoc_handle == m.assoc_handle {
                // §7.5: the five-tuple matches: "the PM Server MUST treat the
                // incoming PMReq Message as a duplicate message."
                duplicate = true;
                self.stats.duplicates += 1;
            } else {
                // §7.5.2: "the AssocHandle does not match the prior request,
                // the PMSP MUST discard and cleanup the state associated with
                // the prior request and process the new PMReq normally."
                replaced = true;
                self.stats.replaced += 1;
                self.remove_pending(&key);
            }
        }
        // §7.5.2: "the PMSP SHOULD use the most recent state of the requested
        // service to reply to the PMReq".
        let reg = self.lookup(m.ap_addr, m.ap_port).cloned();
        let Some(reg) = reg else {
            if duplicate {
                self.remove_pending(&key);
            }
            self.stats.denies += 1;
            // §7.4 PMDeny: every field echoes the PMReq, PmTime zero.
            let deny = MessageRepr {
                mtype: MsgType::DENY,
                pm_time: PmTime::NO_CACHE,
                ..*m
            };
            return (
                Some(deny.to_bytes()),
                Action::Denied {
                    duplicate,
                    replaced,
                },
            );
        };

        let mut evicted = false;
        let sdp_addr = if duplicate {
            // Keep the address already handed out for this transaction
            // unless the service moved to a listener bound elsewhere.
            let prev = self.pending.get(&key).map(|p| p.sdp_addr);
            match prev {
                Some(a) if reg.addr.is_unspecified() => a,
                _ => m.ap_addr,
            }
        } else {
            if self.pending.len() >= self.cfg.max_pending {
                if let Some((_, &victim)) = self.timers.iter().next() {
                    self.remove_pending(&victim);
                    self.stats.evicted += 1;
                    evicted = true;
                }
            }
            self.choose_ap_addr(m.ap_addr, &reg)
        };
        if self.cfg.max_pending == 0 {
            // No state may be kept: answer without it.
        } else {
            if let Some(p) = self.pending.get(&key) {
                let old = (p.expires, p.timer_seq);
                self.timers.remove(&old);
            }
            // §7.5.2: "it should reset the timer when resending the PMAccept".
            let (expires, timer_seq) = self.arm(now, key);
            self.by_handle
                .insert((m.assoc_handle, m.cp_addr, m.cp_port), key);
            self.pending.insert(
                key,
                Pending {
                    key,
                    assoc_handle: m.assoc_handle,
                    sdp_port: reg.sdp_port,
                    sdp_addr,
                    reply_to: from,
                    expires,
                    timer_seq,
                },
            );
        }
        self.stats.accepts += 1;
        // §7.4 PMAccept: IPV, CpPort, AssocHandle, CpIPAddr echo the PMReq;
        // ApPort is the SDP listen port; ApIPAddr the address to connect to.
        let accept = MessageRepr {
            mtype: MsgType::ACCEPT,
            pm_time: self.cfg.pm_time,
            ap_port: reg.sdp_port,
            ap_addr: sdp_addr,
            ..*m
        };
        (
            Some(accept.to_bytes()),
            Action::Accepted {
                sdp_port: reg.sdp_port,
                duplicate,
                replaced,
                evicted,
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const P: u16 = 5001;
    const Q: u16 = 40001;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn req(handle: u64, cp_port: u16) -> MessageRepr {
        MessageRepr {
            mtype: MsgType::REQ,
            pm_time: PmTime::NO_CACHE,
            ap_port: P,
            cp_port,
            assoc_handle: handle,
            cp_addr: ip("10.0.0.1"),
            ap_addr: ip("10.0.0.2"),
        }
    }

    fn from() -> SocketAddr {
        "10.0.0.1:7000".parse().unwrap()
    }

    fn setup() -> (Server, Instant) {
        let now = Instant::now();
        let mut s = Server::new(ServerConfig {
            accept_timeout: Duration::from_millis(100),
            ..ServerConfig::default()
        });
        s.register(now, 1, ip("0.0.0.0"), P, Q).unwrap();
        (s, now)
    }

    fn parse(b: Option<[u8; 48]>) -> MessageRepr {
        MessageRepr::parse_bytes(&b.expect("reply")).unwrap()
    }

    #[test]
    fn accept_then_ack() {
        let (mut s, now) = setup();
        let h = s.handle_datagram(now, from(), &req(7, 9000).to_bytes());
        let a = parse(h.reply);
        assert_eq!(a.mtype, MsgType::ACCEPT);
        assert_eq!(a.ap_port, Q);
        assert_eq!(a.ap_addr, ip("10.0.0.2"));
        assert_eq!(a.assoc_handle, 7);
        assert_eq!(a.cp_port, 9000);
        assert_eq!(a.pm_time, ServerConfig::default().pm_time);
        assert_eq!(s.pending_len(), 1);
        assert_eq!(s.poll_timeout(), Some(now + Duration::from_millis(100)));

        let ack = MessageRepr {
            mtype: MsgType::ACK,
            ..a
        };
        // From elsewhere: stray.
        let h = s.handle_datagram(now, "10.0.0.9:7000".parse().unwrap(), &ack.to_bytes());
        assert_eq!(h.action, Action::StrayAck);
        let h = s.handle_datagram(now, from(), &ack.to_bytes());
        assert_eq!(h.action, Action::Acked);
        assert_eq!(h.reply, None);
        assert_eq!(s.pending_len(), 0);
        assert_eq!(s.poll_timeout(), None);
        // A second PMAck relates to no state.
        let h = s.handle_datagram(now, from(), &ack.to_bytes());
        assert_eq!(h.action, Action::StrayAck);
        assert_eq!(s.stats().acks, 1);
        assert_eq!(s.stats().stray_acks, 2);
    }

    #[test]
    fn deny_unregistered_leaves_no_state() {
        let (mut s, now) = setup();
        let mut r = req(7, 9000);
        r.ap_port = 22;
        let h = s.handle_datagram(now, from(), &r.to_bytes());
        let d = parse(h.reply);
        assert_eq!(
            d,
            MessageRepr {
                mtype: MsgType::DENY,
                ..r
            }
        );
        assert_eq!(
            h.action,
            Action::Denied {
                duplicate: false,
                replaced: false
            }
        );
        assert_eq!(s.pending_len(), 0);
    }

    #[test]
    fn duplicate_resets_timer_and_uses_recent_state() {
        let (mut s, now) = setup();
        let r = req(7, 9000).to_bytes();
        s.handle_datagram(now, from(), &r);
        let t1 = now + Duration::from_millis(50);
        let h = s.handle_datagram(t1, from(), &r);
        assert!(matches!(
            h.action,
            Action::Accepted {
                duplicate: true,
                ..
            }
        ));
        assert_eq!(s.poll_timeout(), Some(t1 + Duration::from_millis(100)));
        assert_eq!(s.pending_len(), 1);
        // The service moves to another Q: the duplicate gets the new one.
        s.register(t1, 1, ip("0.0.0.0"), P, Q + 1).unwrap();
        assert_eq!(
            parse(s.handle_datagram(t1, from(), &r).reply).ap_port,
            Q + 1
        );
        // The service goes away: the duplicate is denied and state dropped.
        s.unregister_owner(1);
        let h = s.handle_datagram(t1, from(), &r);
        assert_eq!(parse(h.reply).mtype, MsgType::DENY);
        assert_eq!(
            h.action,
            Action::Denied {
                duplicate: true,
                replaced: false
            }
        );
        assert_eq!(s.pending_len(), 0);
        assert_eq!(s.stats().duplicates, 3);
    }

    #[test]
    fn new_handle_replaces() {
        let (mut s, now) = setup();
        s.handle_datagram(now, from(), &req(7, 9000).to_bytes());
        let h = s.handle_datagram(now, from(), &req(8, 9000).to_bytes());
        assert!(matches!(
            h.action,
            Action::Accepted {
                replaced: true,
                duplicate: false,
                ..
            }
        ));
        assert_eq!(s.pending_len(), 1);
        assert_eq!(s.pending().next().unwrap().assoc_handle, 8);
        // The old transaction's PMAck is now stray.
        let mut ack = parse(h.reply);
        ack.mtype = MsgType::ACK;
        ack.assoc_handle = 7;
        assert_eq!(
            s.handle_datagram(now, from(), &ack.to_bytes()).action,
            Action::StrayAck
        );
        ack.assoc_handle = 8;
        assert_eq!(
            s.handle_datagram(now, from(), &ack.to_bytes()).action,
            Action::Acked
        );
    }

    #[test]
    fn timer_deletes_state() {
        let (mut s, now) = setup();
        s.handle_datagram(now, from(), &req(7, 9000).to_bytes());
        s.handle_datagram(now, from(), &req(8, 9001).to_bytes());
        assert!(s.handle_timeout(now + Duration::from_millis(99)).is_empty());
        assert_eq!(s.handle_timeout(now + Duration::from_millis(100)).len(), 2);
        assert_eq!(s.pending_len(), 0);
        assert_eq!(s.poll_timeout(), None);
        assert_eq!(s.stats().expired, 2);
    }

    #[test]
    fn connection_completes() {
        let (mut s, now) = setup();
        s.handle_datagram(now, from(), &req(7, 9000).to_bytes());
        assert!(!s.handle_connection(Q, ip("10.0.0.1"), 9001));
        assert!(s.handle_connection(Q, ip("10.0.0.1"), 9000));
        assert_eq!(s.pending_len(), 0);
        assert_eq!(s.poll_timeout(), None);
    }

    #[test]
    fn stray_replies_and_malformed_are_never_answered() {
        let (mut s, now) = setup();
        for mt in [MsgType::ACCEPT, MsgType::DENY] {
            let m = MessageRepr {
                mtype: mt,
                ..req(1, 1)
            };
            let h = s.handle_datagram(now, from(), &m.to_bytes());
            assert_eq!((h.reply, h.action), (None, Action::StrayReply));
        }
        let good = req(1, 1).to_bytes();
        let mut bad_ver = good;
        bad_ver[0] |= 0x40;
        let mut bad_ipv = good;
        bad_ipv[0] = 0x05;
        let long = [&good[..], &[0u8]].concat();
        for (d, e) in [
            (&good[..47], wire::Error::Truncated),
            (&long[..], wire::Error::TooLong),
            (&bad_ver[..], wire::Error::BadVersion),
            (&bad_ipv[..], wire::Error::ReservedIpVersion),
        ] {
            let h = s.handle_datagram(now, from(), d);
            assert_eq!((h.reply, h.action), (None, Action::Malformed(e)));
        }
        let st = s.stats();
        assert_eq!(
            (
                st.malformed_truncated,
                st.malformed_too_long,
                st.malformed_version,
                st.malformed_ipv
            ),
            (1, 1, 1, 1)
        );
        assert_eq!(st.malformed(), 4);
        assert_eq!(st.stray_replies, 2);
        assert_eq!(s.pending_len(), 0);
    }

    #[test]
    fn rate_limit_per_source() {
        let now = Instant::now();
        let mut s = Server::new(ServerConfig {
            rate_per_sec: 10,
            burst: 5,
            ..ServerConfig::default()
        });
        let mut limited = 0;
        for i in 0..20u16 {
            let h = s.handle_datagram(now, from(), &req(u64::from(i), i).to_bytes());
            if h.action == Action::RateLimited {
                limited += 1;
                assert_eq!(h.reply, None);
            }
        }
        assert_eq!(limited, 15);
        // Another source is not affected.
        let h = s.handle_datagram(now, "10.0.0.3:1".parse().unwrap(), &req(99, 99).to_bytes());
        assert_ne!(h.action, Action::RateLimited);
        // 100 ms later one more token.
        let t = now + Duration::from_millis(100);
        assert_ne!(
            s.handle_datagram(t, from(), &req(50, 50).to_bytes()).action,
            Action::RateLimited
        );
        assert_eq!(
            s.handle_datagram(t, from(), &req(51, 51).to_bytes()).action,
            Action::RateLimited
        );
    }

    #[test]
    fn sources_table_is_bounded() {
        let now = Instant::now();
        let mut s = Server::new(ServerConfig {
            rate_per_sec: 1,
            burst: 1,
            max_sources: 4,
            ..ServerConfig::default()
        });
        for i in 0..100u8 {
            let src = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(10, 1, 0, i)), 1);
            s.handle_datagram(now, src, &req(u64::from(i), 1).to_bytes());
        }
        assert_eq!(s.sources_len(), 4);
        // 4 individual buckets + 1 shared one let 5 through.
        assert_eq!(s.stats().rate_limited, 95);
        // IPv6 sources share a bucket per /64.
        let mut s = Server::new(ServerConfig {
            rate_per_sec: 1,
            burst: 1,
            ..ServerConfig::default()
        });
        for i in 0..10u16 {
            let src = SocketAddr::new(
                IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 1, 0, 0, 0, i)),
                1,
            );
            s.handle_datagram(now, src, &req(u64::from(i), 1).to_bytes());
        }
        assert_eq!(s.stats().rate_limited, 9);
    }

    #[test]
    fn pending_table_is_bounded() {
        let now = Instant::now();
        let mut s = Server::new(ServerConfig {
            max_pending: 8,
            ..ServerConfig::default()
        });
        s.register(now, 1, ip("::"), P, Q).unwrap();
        for i in 0..100u16 {
            let t = now + Duration::from_micros(u64::from(i));
            let h = s.handle_datagram(t, from(), &req(u64::from(i), i).to_bytes());
            assert!(matches!(h.action, Action::Accepted { .. }));
        }
        assert_eq!(s.pending_len(), 8);
        assert_eq!(s.stats().evicted, 92);
        // The survivors are the newest.
        let mut ports: Vec<u16> = s.pending().map(|p| p.key.cp_port).collect();
        ports.sort();
        assert_eq!(ports, (92..100).collect::<Vec<_>>());
    }

    #[test]
    fn lookup_prefers_exact_address() {
        let now = Instant::now();
        let mut s = Server::new(ServerConfig::default());
        s.register(now, 1, ip("::"), P, 1).unwrap();
        s.register(now, 2, ip("10.0.0.2"), P, 2).unwrap();
        s.register(now, 3, ip("0.0.0.0"), 6000, 3).unwrap();
        assert_eq!(s.lookup(ip("10.0.0.2"), P).unwrap().sdp_port, 2);
        assert_eq!(s.lookup(ip("::ffff:10.0.0.2"), P).unwrap().sdp_port, 2);
        assert_eq!(s.lookup(ip("10.0.0.3"), P).unwrap().sdp_port, 1);
        assert_eq!(s.lookup(ip("2001:db8::1"), P).unwrap().sdp_port, 1);
        assert_eq!(s.lookup(ip("10.0.0.3"), 6000).unwrap().sdp_port, 3);
        assert!(s.lookup(ip("2001:db8::1"), 6000).is_none());
        assert!(s.unregister(2, ip("10.0.0.2"), P));
        assert!(!s.unregister(2, ip("10.0.0.2"), P));
        assert_eq!(s.lookup(ip("10.0.0.2"), P).unwrap().sdp_port, 1);
        assert_eq!(
            s.register(now, 1, ip("::"), 0, 1),
            Err(RegisterError::ZeroPort)
        );
        assert!(s.owns_sdp_port(3, 3));
        assert!(!s.owns_sdp_port(3, 1));
        // 0.0.0.0 and :: on one port (the :: one IPV6_V6ONLY, or the bind
        // would have failed): each family goes to its own, whatever the
        // order of registration.
        s.register(now, 4, ip("0.0.0.0"), 7000, 40).unwrap();
        s.register(now, 4, ip("::"), 7000, 41).unwrap();
        assert_eq!(s.lookup(ip("127.0.0.1"), 7000).unwrap().sdp_port, 40);
        assert_eq!(s.lookup(ip("::1"), 7000).unwrap().sdp_port, 41);
    }

    #[test]
    fn registrations_are_bounded() {
        let now = Instant::now();
        let mut s = Server::new(ServerConfig {
            max_registrations: 2,
            ..ServerConfig::default()
        });
        s.register(now, 1, ip("::"), 1, 1).unwrap();
        s.register(now, 1, ip("::"), 2, 2).unwrap();
        // Re-registering the same one is an update, not a new entry.
        s.register(now, 1, ip("::"), 2, 3).unwrap();
        assert_eq!(s.register(now, 1, ip("::"), 3, 3), Err(RegisterError::Full));
        assert_eq!(s.unregister_owner(1).len(), 2);
        s.register(now, 1, ip("::"), 3, 3).unwrap();
    }

    #[test]
    fn rewrites_ap_addr_round_robin() {
        let now = Instant::now();
        let mut s = Server::new(ServerConfig {
            rewrite_addrs: vec![ip("10.9.0.1"), ip("2001:db8::9"), ip("10.9.0.2")],
            ..ServerConfig::default()
        });
        s.register(now, 1, ip("0.0.0.0"), P, Q).unwrap();
        let a1 = parse(s.handle_datagram(now, from(), &req(1, 1).to_bytes()).reply);
        let a2 = parse(s.handle_datagram(now, from(), &req(2, 2).to_bytes()).reply);
        let a3 = parse(s.handle_datagram(now, from(), &req(3, 3).to_bytes()).reply);
        assert_eq!(
            (a1.ap_addr, a2.ap_addr, a3.ap_addr),
            (ip("10.9.0.1"), ip("10.9.0.2"), ip("10.9.0.1"))
        );
        // A duplicate keeps its address; the PMAck must carry it.
        let d2 = parse(s.handle_datagram(now, from(), &req(2, 2).to_bytes()).reply);
        assert_eq!(d2.ap_addr, ip("10.9.0.2"));
        let ack = MessageRepr {
            mtype: MsgType::ACK,
            ..d2
        };
        assert_eq!(
            s.handle_datagram(now, from(), &ack.to_bytes()).action,
            Action::Acked
        );
        // A listener bound to one address is never rewritten.
        s.register(now, 2, ip("10.0.0.2"), P, Q).unwrap();
        let a = parse(s.handle_datagram(now, from(), &req(4, 4).to_bytes()).reply);
        assert_eq!(a.ap_addr, ip("10.0.0.2"));
    }

    #[test]
    fn ipv6_request() {
        let now = Instant::now();
        let mut s = Server::new(ServerConfig::default());
        s.register(now, 1, ip("::1"), P, Q).unwrap();
        let r = MessageRepr {
            cp_addr: ip("::1"),
            ap_addr: ip("::1"),
            ..req(5, 5)
        };
        let a = parse(
            s.handle_datagram(now, "[::1]:9".parse().unwrap(), &r.to_bytes())
                .reply,
        );
        assert_eq!(a.mtype, MsgType::ACCEPT);
        assert_eq!(a.ap_addr, ip("::1"));
        assert_eq!(a.ip_version(), wire::IpVersion::V6);
    }
}
