//! A deterministic two-connection harness (STYLE habit 5): two
//! [`Conn`]s, the applications on top of them, and a verbs
//! [`Transport`] between them, with virtual time and seeded random
//! interleaving. Every verbs operation is checked against the §10.5 credit
//! rules as it is issued.
//!
//! [`MemTransport`] obeys RDMA Send semantics (RFC 5040 §5.3): a Send
//! consumes the peer's oldest posted receive buffer; with none posted, or
//! a message longer than the buffer, the iWARP layer would Terminate, so
//! both ends get a transport error. Another [`Transport`] (the real iWARP
//! engine over a byte pipe) can run the same scenarios.
//!
//! ```
//! use sdp_core::conn::Config;
//! use sdp_core::testing::Pair;
//!
//! let mut pair = Pair::new(&Config::default(), &Config::default(), 7);
//! pair.apps[0].to_write = 100_000;
//! pair.apps[1].to_write = 50_000;
//! pair.run(1_000_000, |p| p.apps[0].read == 50_000 && p.apps[1].read == 100_000);
//! assert_eq!(pair.apps[1].read_hash, pair.apps[0].write_hash);
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use crate::conn::{BufferPool, Config, Conn, RecvFlags, SendFlags, State};
use crate::errno::Error;
use crate::verbs::{ErrorKind, Event, Op, Teardown, WrId};

/// A small seeded generator (xorshift64*).
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// Seeds the generator (any seed, zero included).
    pub fn new(seed: u64) -> Rng {
        Rng(splitmix(seed) | 1)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// True with probability `num / den`.
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// Fills `out` with the bytes at `offset..` of the test stream `seed`.
pub fn pattern(seed: u64, offset: u64, out: &mut [u8]) {
    let mut pos = offset;
    let mut i = 0;
    while i < out.len() {
        let word = splitmix(seed ^ (pos / 8)).to_le_bytes();
        let from = (pos % 8) as usize;
        let n = (8 - from).min(out.len() - i);
        out[i..i + n].copy_from_slice(&word[from..from + n]);
        i += n;
        pos += n as u64;
    }
}

/// FNV-1a over 64-bit words and the tail: a cheap stream hash that does
/// not depend on how the stream was cut.
#[derive(Debug, Clone, Copy)]
pub struct StreamHash {
    state: u64,
    pending: [u8; 8],
    fill: usize,
}

impl Default for StreamHash {
    fn default() -> StreamHash {
        StreamHash {
            state: 0xcbf2_9ce4_8422_2325,
            pending: [0; 8],
            fill: 0,
        }
    }
}

impl PartialEq for StreamHash {
    fn eq(&self, other: &StreamHash) -> bool {
        self.value() == other.value()
    }
}

impl Eq for StreamHash {}

impl StreamHash {
    /// The hash of everything added so far.
    pub fn value(&self) -> u64 {
        let mut h = *self;
        for i in 0..self.fill {
            h.mix(u64::from(self.pending[i]) | 0x100);
        }
        h.mix(self.fill as u64);
        h.state
    }

    fn mix(&mut self, word: u64) {
        self.state = (self.state ^ word).wrapping_mul(0x0000_0100_0000_01b3);
    }

    /// Adds bytes.
    pub fn update(&mut self, mut bytes: &[u8]) {
        while self.fill > 0 && !bytes.is_empty() {
            self.pending[self.fill] = bytes[0];
            self.fill += 1;
            bytes = &bytes[1..];
            if self.fill == 8 {
                self.fill = 0;
                self.mix(u64::from_le_bytes(self.pending));
            }
        }
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut a = [0; 8];
            a.copy_from_slice(w);
            self.mix(u64::from_le_bytes(a));
        }
        for &b in words.remainder() {
            self.pending[self.fill] = b;
            self.fill += 1;
        }
    }
}

/// §10.5 for one Send about to be issued by `side` with the credit state
/// `before` it: credit ≥ 3 with payload, ≥ 2 without, 1 only for a message
/// that provides credit.
///
/// # Panics
///
/// If the rule is broken.
pub fn check_send(side: usize, before: &crate::conn::CreditState, header: &[u8], payload: bool) {
    let c = before.send_credit;
    assert!(c >= 1, "side {side}: Send with credit {c}: {header:02x?}");
    if payload {
        assert!(c >= 3, "side {side}: payload with credit {c}");
    } else if c < 2 {
        assert!(
            before.gain > 0,
            "side {side}: last credit, no new credit: {before:?}"
        );
    }
}

/// After every pending Op of `conn` was issued: Bufs equals the buffers on
/// the receive queue (`rq_len`, as the transport counts them), and no
/// §10.5-mandated update is left unsent.
///
/// # Panics
///
/// If either does not hold.
pub fn check_idle(side: usize, conn: &Conn, rq_len: usize) {
    // A socket duplication stops every message, credit updates included
    // (draft §13.1.1 steps 2–3).
    if conn.state() != State::Connected
        || conn.is_aborting()
        || conn.is_suspending()
        || conn.susp_comm_sent()
    {
        return;
    }
    let cs = conn.credit_state();
    assert_eq!(usize::from(cs.bufs), cs.rq_posted, "side {side}: {cs:?}");
    assert_eq!(cs.rq_posted, rq_len, "side {side}");
    assert!(
        !(cs.must_update && cs.send_credit >= 1),
        "side {side}: credit update owed: {cs:?}"
    );
}

/// What carries verbs operations between the two connections.
pub trait Transport {
    /// Carries out `op`, issued by side `side` (0 or 1); for a Send,
    /// `payload` holds the bytes of its payload range.
    fn submit(&mut self, side: usize, op: &Op, payload: &[u8], events: &mut Vec<(usize, Event)>);
    /// Makes one random step of progress (delivers a message, completes a
    /// Send, closes a half), writing received messages into `pools` and
    /// reporting what happened in `events`. False if nothing was pending.
    fn step(
        &mut self,
        rng: &mut Rng,
        pools: [&mut BufferPool; 2],
        events: &mut Vec<(usize, Event)>,
    ) -> bool;
    /// Whether anything is pending.
    fn busy(&self) -> bool;
    /// Receive buffers posted at `side` and not yet used.
    fn rq_len(&self, side: usize) -> usize;
    /// Messages from `side` not yet delivered.
    fn in_flight(&self, side: usize) -> usize;
}

/// Messages and Sends of one direction.
#[derive(Debug, Default)]
struct Dir {
    /// Messages posted, not delivered.
    msgs: VecDeque<Vec<u8>>,
    /// Send ids posted, not completed, oldest first.
    sends: VecDeque<WrId>,
    /// How many of `sends` were delivered (may complete).
    delivered: usize,
    /// Graceful LLP close requested: FIN after the messages.
    closing: bool,
}

/// In-memory RDMA Sends; see the module documentation.
#[derive(Debug, Default)]
pub struct MemTransport {
    /// `dirs[i]`: from side i to side 1 - i.
    dirs: [Dir; 2],
    /// Receive queues per side.
    rq: [VecDeque<(WrId, usize)>; 2],
    dead: bool,
}

impl MemTransport {
    fn kill(&mut self) {
        self.dead = true;
        for d in &mut self.dirs {
            d.msgs.clear();
            d.sends.clear();
            d.delivered = 0;
            d.closing = false;
        }
    }

    fn deliver(
        &mut self,
        from: usize,
        pools: [&mut BufferPool; 2],
        events: &mut Vec<(usize, Event)>,
    ) {
        let to = 1 - from;
        let Some(msg) = self.dirs[from].msgs.pop_front() else {
            return;
        };
        let Some((wr_id, buf)) = self.rq[to].pop_front() else {
            // RFC 5040 §5.3: no receive buffer posted → Terminate.
            events.push((0, Event::TransportError(ErrorKind::NoReceiveBuffer)));
            events.push((1, Event::TransportError(ErrorKind::NoReceiveBuffer)));
            return self.kill();
        };
        let [p0, p1] = pools;
        let pool = if to == 0 { p0 } else { p1 };
        match pool.buffer_mut(buf).and_then(|b| b.get_mut(..msg.len())) {
            Some(dst) => dst.copy_from_slice(&msg),
            None => {
                // RFC 5041 §7: message too long for the buffer → Terminate.
                events.push((0, Event::TransportError(ErrorKind::Terminated)));
                events.push((1, Event::TransportError(ErrorKind::Terminated)));
                return self.kill();
            }
        }
        self.dirs[from].delivered += 1;
        events.push((
            to,
            Event::RecvDone {
                wr_id,
                len: msg.len(),
            },
        ));
    }
}

impl Transport for MemTransport {
    fn submit(&mut self, side: usize, op: &Op, payload: &[u8], events: &mut Vec<(usize, Event)>) {
        if self.dead {
            return;
        }
        match op {
            Op::PostRecv { wr_id, buf } => self.rq[side].push_back((*wr_id, *buf)),
            Op::Send { wr_id, header, .. } => {
                let dir = &mut self.dirs[side];
                if dir.closing {
                    return;
                }
                let mut msg = Vec::with_capacity(header.len() + payload.len());
                msg.extend_from_slice(header);
                msg.extend_from_slice(payload);
                dir.msgs.push_back(msg);
                dir.sends.push_back(*wr_id);
            }
            // A socket duplication closes this LLP connection gracefully;
            // [`Pair::resume`] sets up the next one.
            Op::Teardown(Teardown::Graceful | Teardown::Resume { .. }) => {
                self.dirs[side].closing = true
            }
            Op::Teardown(Teardown::Abortive) => {
                events.push((1 - side, Event::TransportError(ErrorKind::Reset)));
                self.kill();
            }
        }
    }

    fn step(
        &mut self,
        rng: &mut Rng,
        pools: [&mut BufferPool; 2],
        events: &mut Vec<(usize, Event)>,
    ) -> bool {
        if self.dead {
            return false;
        }
        // Enabled actions: 0/1 deliver from side, 2/3 complete a Send of
        // side, 4/5 FIN from side.
        let mut enabled = [false; 6];
        for s in 0..2 {
            let d = &self.dirs[s];
            enabled[s] = !d.msgs.is_empty();
            enabled[2 + s] = d.delivered > 0;
            enabled[4 + s] = d.closing && d.msgs.is_empty();
        }
        let count = enabled.iter().filter(|e| **e).count() as u64;
        if count == 0 {
            return false;
        }
        let mut pick = rng.below(count);
        let mut action = 0;
        for (i, e) in enabled.iter().enumerate() {
            if *e {
                if pick == 0 {
                    action = i;
                    break;
                }
                pick -= 1;
            }
        }
        match action {
            0 | 1 => self.deliver(action, pools, events),
            2 | 3 => {
                let d = &mut self.dirs[action - 2];
                if let Some(wr_id) = d.sends.pop_front() {
                    d.delivered -= 1;
                    events.push((action - 2, Event::SendDone { wr_id }));
                }
            }
            _ => {
                let from = action - 4;
                // Every Send of the closing side completes before its FIN.
                let d = &mut self.dirs[from];
                d.closing = false;
                for wr_id in d.sends.drain(..) {
                    events.push((from, Event::SendDone { wr_id }));
                }
                d.delivered = 0;
                events.push((1 - from, Event::TransportClosed));
            }
        }
        true
    }

    fn busy(&self) -> bool {
        !self.dead
            && self
                .dirs
                .iter()
                .any(|d| !d.msgs.is_empty() || d.delivered > 0 || d.closing)
    }

    fn rq_len(&self, side: usize) -> usize {
        self.rq[side].len()
    }

    fn in_flight(&self, side: usize) -> usize {
        self.dirs[side].msgs.len()
    }
}

impl Pair<MemTransport> {
    /// Places `bytes` (cut or padded to `len`) in the next posted receive
    /// buffer of side `to` and reports a receive of `len` bytes, as if the
    /// peer had sent them: for hostile-peer tests. Returns the buffer
    /// index, or `None` if `to` has no buffer posted.
    pub fn inject(&mut self, to: usize, bytes: &[u8], len: usize) -> Option<usize> {
        let (wr_id, buf) = self.transport.rq[to].pop_front()?;
        if let Some(dst) = self.conns[to].pool_mut().buffer_mut(buf) {
            let n = bytes.len().min(dst.len());
            dst[..n].copy_from_slice(&bytes[..n]);
        }
        self.feed(to, Event::RecvDone { wr_id, len });
        Some(buf)
    }
}

/// One application on top of a connection: writes a generated stream,
/// reads and checks the peer's.
#[derive(Debug, Clone)]
pub struct App {
    /// Seed of the stream this application writes.
    pub seed: u64,
    /// Bytes to write in all.
    pub to_write: u64,
    /// Bytes accepted by `send` so far.
    pub written: u64,
    /// Hash of the bytes written.
    pub write_hash: StreamHash,
    /// Whether the application reads.
    pub reading: bool,
    /// Bytes read.
    pub read: u64,
    /// Hash of the bytes read.
    pub read_hash: StreamHash,
    /// Seed of the stream it reads (the peer's).
    pub peer_seed: u64,
    /// `recv` returned 0.
    pub eof: bool,
    /// Errors returned by `send` or `recv` (EAGAIN excluded).
    pub errors: Vec<Error>,
    /// shutdown(SHUT_WR) once everything is written.
    pub shutdown_when_done: bool,
    /// Largest single `send`/`recv`.
    pub max_io: usize,
    /// Bytes accepted and not yet released, from offset `staged_base`.
    staged: Vec<u8>,
    staged_start: usize,
    staged_base: u64,
}

impl App {
    fn new(seed: u64, peer_seed: u64) -> App {
        App {
            seed,
            to_write: 0,
            written: 0,
            write_hash: StreamHash::default(),
            reading: true,
            read: 0,
            read_hash: StreamHash::default(),
            peer_seed,
            eof: false,
            errors: Vec::new(),
            shutdown_when_done: false,
            max_io: 96 * 1024,
            staged: Vec::new(),
            staged_start: 0,
            staged_base: 0,
        }
    }

    /// The staged bytes of send stream `range`.
    fn payload(&self, range: core::ops::Range<u64>) -> &[u8] {
        let from = (range.start - self.staged_base) as usize + self.staged_start;
        let to = (range.end - self.staged_base) as usize + self.staged_start;
        &self.staged[from..to]
    }

    /// Drops staged bytes below `released`.
    fn release(&mut self, released: u64) {
        if released <= self.staged_base {
            return;
        }
        self.staged_start += (released - self.staged_base) as usize;
        self.staged_base = released;
        if self.staged_start > self.staged.len() / 2 {
            self.staged.drain(..self.staged_start);
            self.staged_start = 0;
        }
    }
}

/// Two connected [`Conn`]s with their applications; see the module
/// documentation.
pub struct Pair<T: Transport = MemTransport> {
    /// The connections: 0 is the Connecting Peer, 1 the Accepting Peer.
    pub conns: [Conn; 2],
    /// The applications.
    pub apps: [App; 2],
    /// The transport between them.
    pub transport: T,
    /// Virtual time.
    pub now: Instant,
    /// The interleaving.
    pub rng: Rng,
    /// Sends checked against §10.5.
    pub sends_checked: u64,
    /// The transport errors and closes each side saw.
    pub transport_events: [Vec<Event>; 2],
    /// The application stream offset of each connection's send stream
    /// offset 0 (not 0 after [`Pair::resume`] gave a side a new [`Conn`]).
    pub tx_base: [u64; 2],
    events: Vec<(usize, Event)>,
    buf: Vec<u8>,
    expect: Vec<u8>,
}

impl Pair<MemTransport> {
    /// Sets up a connection between a Connecting Peer with `a` and an
    /// Accepting Peer with `b` over a [`MemTransport`], interleaving with
    /// `seed`.
    ///
    /// # Panics
    ///
    /// If the Accepting Peer refuses the Hello or setup does not finish.
    pub fn new(a: &Config, b: &Config, seed: u64) -> Pair<MemTransport> {
        Pair::with_transport(a, b, seed, MemTransport::default())
    }
}

impl<T: Transport> Pair<T> {
    /// As [`Pair::new`] over `transport`.
    ///
    /// # Panics
    ///
    /// If the Accepting Peer refuses the Hello or setup does not finish.
    pub fn with_transport(a: &Config, b: &Config, seed: u64, transport: T) -> Pair<T> {
        let client = Conn::connect(a);
        let hello = client.hello().map(<[u8]>::to_vec).unwrap_or_default();
        let server = Conn::accept(b, &hello).expect("Hello refused");
        let mut pair = Pair {
            conns: [client, server],
            apps: [
                App::new(seed ^ 0xa, seed ^ 0xb),
                App::new(seed ^ 0xb, seed ^ 0xa),
            ],
            transport,
            now: Instant::now(),
            rng: Rng::new(seed),
            sends_checked: 0,
            transport_events: [Vec::new(), Vec::new()],
            tx_base: [0; 2],
            events: Vec::new(),
            buf: Vec::new(),
            expect: Vec::new(),
        };
        // Both post their buffers; then the RTR arrives at the responder.
        pair.drain();
        pair.feed(1, Event::Established);
        pair.drain();
        let ok = pair.run(10_000, |p| p.conns[0].state() == State::Connected);
        assert!(ok, "setup did not finish");
        pair
    }

    /// Issues every pending Op of both connections to the transport,
    /// checking §10.5 before each Send and the credit accounting after.
    pub fn drain(&mut self) {
        loop {
            let mut any = false;
            for side in 0..2 {
                while let Some(before) = Some(self.conns[side].credit_state()) {
                    let Some(op) = self.conns[side].poll_op() else {
                        break;
                    };
                    any = true;
                    if let Op::Send {
                        ref payload,
                        ref header,
                        ..
                    } = op
                    {
                        self.check_send(side, &before, header, payload.end > payload.start);
                    }
                    let base = self.tx_base[side];
                    let payload: &[u8] = match &op {
                        Op::Send { payload, .. } if payload.end > payload.start => {
                            self.apps[side].payload(payload.start + base..payload.end + base)
                        }
                        _ => &[],
                    };
                    let mut events = core::mem::take(&mut self.events);
                    self.transport.submit(side, &op, payload, &mut events);
                    self.events = events;
                    self.check_safety(side);
                }
                let released = self.conns[side].tx().released() + self.tx_base[side];
                self.apps[side].release(released);
            }
            let events = core::mem::take(&mut self.events);
            for &(side, ev) in &events {
                self.feed(side, ev);
            }
            self.events = events;
            self.events.clear();
            if !any {
                break;
            }
        }
        for side in 0..2 {
            self.check_idle(side);
        }
    }

    /// §10.5 for one Send (see [`check_send`]).
    fn check_send(
        &mut self,
        side: usize,
        before: &crate::conn::CreditState,
        header: &[u8],
        payload: bool,
    ) {
        self.sends_checked += 1;
        check_send(side, before, header, payload);
    }

    /// Our credit never exceeds the buffers really posted at the peer minus
    /// our messages in flight: no Send can find an empty receive queue.
    fn check_safety(&self, side: usize) {
        let conn = &self.conns[side];
        if conn.state() != State::Connected {
            return;
        }
        let credit = conn.credit_state().send_credit;
        let room = self.transport.rq_len(1 - side) as i64 - self.transport.in_flight(side) as i64;
        assert!(
            credit <= room,
            "side {side}: credit {credit} > peer buffers {room}"
        );
    }

    /// After a drain (see [`check_idle`]).
    fn check_idle(&self, side: usize) {
        check_idle(side, &self.conns[side], self.transport.rq_len(side));
    }

    /// Stages `bytes` as the next bytes of side `side`'s send stream, for
    /// tests that call [`Conn::send`] themselves: the conn must have
    /// accepted exactly these bytes.
    pub fn stage(&mut self, side: usize, bytes: &[u8]) {
        let app = &mut self.apps[side];
        app.staged.extend_from_slice(bytes);
        app.write_hash.update(bytes);
        app.written += bytes.len() as u64;
    }

    /// Feeds one event to a side.
    pub fn feed(&mut self, side: usize, event: Event) {
        if matches!(event, Event::TransportError(_) | Event::TransportClosed) {
            self.transport_events[side].push(event);
        }
        self.conns[side].handle_event(self.now, event);
    }

    /// The application of `side` writes once.
    pub fn app_write(&mut self, side: usize) {
        let app = &self.apps[side];
        let left = app.to_write - app.written;
        if left == 0 {
            if app.shutdown_when_done && self.conns[side].state() == State::Connected {
                let _ = self.conns[side].shutdown(crate::conn::Shutdown::Write);
                self.apps[side].shutdown_when_done = false;
            }
            return;
        }
        let want = (1 + self.rng.below(app.max_io as u64)).min(left) as usize;
        match self.conns[side].send(want, SendFlags::EMPTY) {
            Ok(n) => {
                let app = &mut self.apps[side];
                let start = app.staged.len();
                app.staged.resize(start + n, 0);
                pattern(app.seed, app.written, &mut app.staged[start..]);
                app.write_hash.update(&app.staged[start..]);
                app.written += n as u64;
            }
            Err(Error::WouldBlock) => {}
            Err(e) => self.apps[side].errors.push(e),
        }
    }

    /// The application of `side` reads once and checks the bytes.
    pub fn app_read(&mut self, side: usize) {
        let want = 1 + self.rng.below(self.apps[side].max_io as u64) as usize;
        self.buf.resize(want, 0);
        match self.conns[side].recv(&mut self.buf, RecvFlags::EMPTY) {
            Ok(0) => self.apps[side].eof = true,
            Ok(n) => {
                let app = &mut self.apps[side];
                self.expect.resize(n, 0);
                pattern(app.peer_seed, app.read, &mut self.expect);
                assert!(
                    self.buf[..n] == self.expect[..],
                    "side {side}: wrong bytes at offset {}",
                    app.read
                );
                app.read_hash.update(&self.buf[..n]);
                app.read += n as u64;
            }
            Err(Error::WouldBlock) => {}
            Err(e) => self.apps[side].errors.push(e),
        }
    }

    /// One random step: a transport step, an application action, or a jump
    /// of virtual time to the next timer. False if nothing could happen.
    pub fn step(&mut self) -> bool {
        self.now += Duration::from_micros(self.rng.below(20));
        let mut choices = Vec::with_capacity(5);
        if self.transport.busy() {
            choices.push(0);
        }
        for side in 0..2 {
            let app = &self.apps[side];
            let conn = &self.conns[side];
            if (app.written < app.to_write || app.shutdown_when_done) && conn.writable() {
                choices.push(1 + side);
            }
            if app.reading && !app.eof && conn.readable() {
                choices.push(3 + side);
            }
        }
        let Some(&choice) = choices.get(self.rng.below(choices.len() as u64) as usize) else {
            // Idle: jump to the next timer, if any.
            let next = self.conns.iter().filter_map(Conn::poll_timeout).min();
            let Some(at) = next else {
                return false;
            };
            self.now = self.now.max(at);
            for c in &mut self.conns {
                c.handle_timeout(self.now);
            }
            self.drain();
            return true;
        };
        match choice {
            0 => {
                let [a, b] = &mut self.conns;
                let mut events = core::mem::take(&mut self.events);
                self.transport
                    .step(&mut self.rng, [a.pool_mut(), b.pool_mut()], &mut events);
                for &(side, ev) in &events {
                    self.feed(side, ev);
                }
                events.clear();
                self.events = events;
            }
            1 | 2 => self.app_write(choice - 1),
            _ => self.app_read(choice - 3),
        }
        self.drain();
        true
    }

    /// Socket duplication (draft §13.1.1): side `side` answered a SuspComm
    /// and is suspended ([`Conn::resume_port`]); the other side (the test
    /// Local Peer, [`Conn::request_suspend`]) got the SuspCommAck. Its
    /// application reads what the old connection still holds (step 5's
    /// "buffered receive ULP data"), a new Accepting Peer with `config`
    /// takes the resumed connection's Hello over a fresh transport (steps
    /// 6–7), and setup runs until the resumed connection has its HelloAck.
    /// False if it does not get there.
    pub fn resume(&mut self, side: usize, config: &Config) -> bool
    where
        T: Default,
    {
        let other = 1 - side;
        while self.conns[other].bytes_readable() > 0 {
            self.app_read(other);
        }
        // The old connection's bytes were all sent and completed before
        // the SuspComm; the new one numbers its send stream from 0.
        self.tx_base[other] += self.conns[other].tx().accepted();
        if !self.conns[side].resume_in_place() {
            return false;
        }
        let hello = self.conns[side].hello().map(<[u8]>::to_vec);
        let Some(Ok(accepted)) = hello.map(|h| Conn::accept(config, &h)) else {
            return false;
        };
        self.conns[other] = accepted;
        self.transport = T::default();
        self.drain();
        self.feed(other, Event::Established);
        self.drain();
        self.run(10_000, |p| !p.conns[side].is_resuming())
    }

    /// Steps until `done` holds (true) or `max_steps` pass or nothing can
    /// happen (false).
    pub fn run(&mut self, max_steps: u64, done: impl Fn(&Pair<T>) -> bool) -> bool {
        for _ in 0..max_steps {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        done(self)
    }

    /// Steps until nothing can happen any more; false if `max_steps` pass
    /// first.
    pub fn settle(&mut self, max_steps: u64) -> bool {
        for _ in 0..max_steps {
            if !self.step() {
                return true;
            }
        }
        false
    }
}
