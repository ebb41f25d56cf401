//! The in-memory test harness: two endpoints, virtual time, the byte
//! stream of each direction cut into random chunks (seeded, down to 1
//! byte), optional corruption, and both receive paths (copying
//! `handle_input` and direct `recv_target`/`placed`). Nothing sleeps: when
//! no byte can move, time jumps to the next deadline.

#![allow(dead_code)]

use std::time::{Duration, Instant};

use iwarp::engine::{
    Completion, Connection, ConnectionConfig, DataPath, Event, Params, PostError, ReadWr,
    RecvTarget, RecvWr, SendWr, TxQueue, WriteWr,
};
use iwarp::mem::{Access, Memory, MrAttrs, Pd, RegError, RegionId, VecMemory};
use iwarp::wire::ddp::Stag;

/// splitmix64: small, seeded, good enough to cut streams.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    /// `n` pseudo-random bytes. Beyond 1 MiB, built from shifted copies of
    /// a random MiB with every 4 KiB page stamped with its number, so that
    /// no two pages are alike and a debug build need not run the generator
    /// for every word.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        const BLOCK: usize = 1 << 20;
        let small = n.min(BLOCK + 64);
        let mut base = vec![0u8; small.next_multiple_of(8)];
        for w in base.chunks_exact_mut(8) {
            w.copy_from_slice(&self.next_u64().to_le_bytes());
        }
        if n <= base.len() {
            base.truncate(n);
            return base;
        }
        let mut v = Vec::with_capacity(n);
        while v.len() < n {
            let shift = (self.next_u64() % 64) as usize;
            let take = BLOCK.min(n - v.len());
            v.extend_from_slice(&base[shift..shift + take]);
        }
        for (page, chunk) in v.chunks_mut(4096).enumerate() {
            let stamp = (page as u32).to_le_bytes();
            let m = chunk.len().min(4);
            chunk[..m].copy_from_slice(&stamp[..m]);
        }
        v
    }
}

/// How a byte stream is cut.
#[derive(Debug, Clone, Copy)]
pub struct Chunking {
    /// Largest chunk.
    pub max: usize,
}

impl Chunking {
    /// A chunk size: a quarter of them 1 to 4 bytes, a quarter up to 600,
    /// the rest up to `max`. Every distribution includes 1-byte chunks.
    pub fn pick(&self, rng: &mut Rng) -> usize {
        match rng.range(0, 3) {
            0 => rng.range(1, 4.min(self.max)),
            1 => rng.range(1, 600.min(self.max)),
            _ => rng.range(1, self.max),
        }
    }
}

/// What the harness needs from an endpoint: a [`DataPath`] or a
/// [`iwarp::engine::Connection`].
pub trait Endpoint {
    fn poll_transmit(&mut self, now: Instant, mem: &dyn Memory, budget: usize) -> usize;
    fn txq(&self) -> &TxQueue;
    fn tx_advance(&mut self, now: Instant, n: usize);
    fn handle_input(&mut self, now: Instant, data: &[u8], mem: &mut dyn Memory) -> usize;
    fn recv_target(&self) -> RecvTarget;
    fn placed(&mut self, now: Instant, n: usize, mem: &mut dyn Memory);
    fn poll_timeout(&self) -> Option<Instant>;
    fn handle_timeout(&mut self, now: Instant);
    fn poll_completion(&mut self) -> Option<Completion>;
    fn poll_event(&mut self) -> Option<Event>;
}

impl Endpoint for DataPath {
    fn poll_transmit(&mut self, _now: Instant, mem: &dyn Memory, budget: usize) -> usize {
        DataPath::poll_transmit(self, mem, budget)
    }
    fn txq(&self) -> &TxQueue {
        DataPath::txq(self)
    }
    fn tx_advance(&mut self, _now: Instant, n: usize) {
        DataPath::tx_advance(self, n)
    }
    fn handle_input(&mut self, _now: Instant, data: &[u8], mem: &mut dyn Memory) -> usize {
        DataPath::handle_input(self, data, mem)
    }
    fn recv_target(&self) -> RecvTarget {
        DataPath::recv_target(self)
    }
    fn placed(&mut self, _now: Instant, n: usize, mem: &mut dyn Memory) {
        DataPath::placed(self, n, mem)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        None
    }
    fn handle_timeout(&mut self, _now: Instant) {}
    fn poll_completion(&mut self) -> Option<Completion> {
        DataPath::poll_completion(self)
    }
    fn poll_event(&mut self) -> Option<Event> {
        DataPath::poll_event(self)
    }
}

/// One endpoint with its memory and the bytes on their way to it.
pub struct Side<E> {
    pub ep: E,
    pub mem: VecMemory,
    /// Bytes sent to this side, not yet consumed.
    inbox: Vec<u8>,
    /// Stream offset of the next byte this side sends.
    pub sent: u64,
    /// Everything this side sent, if recording.
    pub record: Option<Vec<u8>>,
    /// Payload bytes received straight into place (direct path).
    pub placed: u64,
}

impl<E> Side<E> {
    pub fn new(ep: E) -> Side<E> {
        Side {
            ep,
            mem: VecMemory::new(),
            inbox: Vec::new(),
            sent: 0,
            record: None,
            placed: 0,
        }
    }

    /// Bytes waiting to be delivered to this side.
    pub fn inbox(&self) -> &[u8] {
        &self.inbox
    }
}

/// Which way bytes flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    AtoB,
    BtoA,
}

/// Two endpoints joined by an in-memory byte stream.
pub struct Pair<E> {
    pub a: Side<E>,
    pub b: Side<E>,
    pub rng: Rng,
    pub now: Instant,
    pub chunking: Chunking,
    /// Receive through `recv_target`/`placed` (else `handle_input` only).
    pub direct: bool,
    /// Flip bits `xor` of the byte at this stream offset of this direction.
    pub corrupt: Option<(Dir, u64, u8)>,
    /// Hold bytes back from delivery (to inspect what a side sends).
    pub hold: bool,
    /// Most bytes one `poll_transmit` queues.
    pub budget: usize,
    last_fired: Option<Instant>,
}

impl<E: Endpoint> Pair<E> {
    pub fn new(a: E, b: E, seed: u64) -> Pair<E> {
        Pair {
            a: Side::new(a),
            b: Side::new(b),
            rng: Rng::new(seed),
            now: Instant::now(),
            chunking: Chunking { max: 4096 },
            direct: false,
            corrupt: None,
            hold: false,
            budget: 256 * 1024,
            last_fired: None,
        }
    }

    fn sides(&mut self, dir: Dir) -> (&mut Side<E>, &mut Side<E>) {
        match dir {
            Dir::AtoB => (&mut self.a, &mut self.b),
            Dir::BtoA => (&mut self.b, &mut self.a),
        }
    }

    /// Moves what `from` has to send into the stream; returns bytes moved.
    /// Takes a random prefix when `partial`, like a short `writev`.
    pub fn transmit(&mut self, dir: Dir, partial: bool) -> usize {
        let now = self.now;
        let budget = self.budget;
        let corrupt = self.corrupt.filter(|c| c.0 == dir);
        let want = if partial {
            Some(self.rng.range(1, 1 << 20))
        } else {
            None
        };
        let (from, to) = self.sides(dir);
        let queued = from.ep.poll_transmit(now, &from.mem, budget);
        if queued == 0 {
            return 0;
        }
        let n = want.map_or(queued, |w| w.min(queued));
        let start = to.inbox.len();
        let mut left = n;
        from.ep
            .txq()
            .for_each_slice(&from.mem, |s| {
                let take = s.len().min(left);
                to.inbox.extend_from_slice(&s[..take]);
                left -= take;
                left > 0
            })
            .expect("queued memory present");
        if let Some((_, at, xor)) = corrupt {
            if at >= from.sent && at < from.sent + n as u64 {
                to.inbox[start + (at - from.sent) as usize] ^= xor;
            }
        }
        if let Some(rec) = &mut from.record {
            rec.extend_from_slice(&to.inbox[start..]);
        }
        from.sent += n as u64;
        from.ep.tx_advance(now, n);
        n
    }

    /// Delivers what is on its way to `dir`'s receiver, in random chunks;
    /// returns bytes consumed.
    pub fn deliver(&mut self, dir: Dir) -> usize {
        let now = self.now;
        let direct = self.direct;
        let chunking = self.chunking;
        let mut rng = self.rng.clone();
        let (_, to) = self.sides(dir);
        let mut head = 0;
        let inbox = core::mem::take(&mut to.inbox);
        while head < inbox.len() {
            let n = chunking.pick(&mut rng).min(inbox.len() - head);
            let (used, placed) = feed(&mut to.ep, &mut to.mem, now, &inbox[head..head + n], direct);
            head += used;
            to.placed += placed as u64;
            if used < n {
                break;
            }
        }
        to.inbox = inbox;
        to.inbox.drain(..head);
        self.rng = rng;
        head
    }

    /// Moves bytes both ways until nothing moves; time stands still.
    pub fn settle(&mut self) {
        for _ in 0..1_000_000 {
            let partial = self.rng.range(0, 3) == 0;
            let mut moved = self.transmit(Dir::AtoB, partial);
            moved += self.transmit(Dir::BtoA, partial);
            if !self.hold {
                moved += self.deliver(Dir::AtoB);
                moved += self.deliver(Dir::BtoA);
            }
            if moved == 0 {
                return;
            }
        }
        panic!("no quiescence");
    }

    /// Runs both directions until nothing moves, jumping virtual time to
    /// each next deadline, until no deadline is left or one survives its
    /// own firing.
    pub fn drive(&mut self) {
        loop {
            self.settle();
            let next = [self.a.ep.poll_timeout(), self.b.ep.poll_timeout()]
                .into_iter()
                .flatten()
                .min();
            match next {
                Some(t) if Some(t) != self.last_fired => {
                    self.last_fired = Some(t);
                    self.now = self.now.max(t);
                    let now = self.now;
                    self.a.ep.handle_timeout(now);
                    self.b.ep.handle_timeout(now);
                }
                _ => return,
            }
        }
    }

    /// Puts `bytes` on the stream of `dir` as if its sender had sent them
    /// (the sender's stream offset advances; its engine knows nothing).
    pub fn inject(&mut self, dir: Dir, bytes: &[u8]) {
        let (from, to) = self.sides(dir);
        to.inbox.extend_from_slice(bytes);
        from.sent += bytes.len() as u64;
    }

    /// Advances virtual time.
    pub fn advance(&mut self, d: Duration) {
        self.now += d;
    }

    pub fn completions(&mut self, dir: Dir) -> Vec<Completion> {
        let (s, _) = self.sides(dir);
        std::iter::from_fn(|| s.ep.poll_completion()).collect()
    }

    pub fn events(&mut self, dir: Dir) -> Vec<Event> {
        let (s, _) = self.sides(dir);
        std::iter::from_fn(|| s.ep.poll_event()).collect()
    }
}

/// Feeds `data` to `ep` through one of the two receive paths; returns
/// bytes consumed and, of those, bytes received straight into place.
pub fn feed<E: Endpoint>(
    ep: &mut E,
    mem: &mut VecMemory,
    now: Instant,
    data: &[u8],
    direct: bool,
) -> (usize, usize) {
    if !direct {
        return (ep.handle_input(now, data, mem), 0);
    }
    let mut used = 0;
    let mut placed = 0;
    while used < data.len() {
        let rest = &data[used..];
        match ep.recv_target() {
            RecvTarget::Scratch { max } => {
                let n = max.min(rest.len());
                let got = ep.handle_input(now, &rest[..n], mem);
                used += got;
                if got == 0 {
                    break;
                }
            }
            RecvTarget::Place {
                region,
                offset,
                len,
            } => {
                let n = len.min(rest.len());
                mem.region_mut(region).expect("target region")[offset..offset + n]
                    .copy_from_slice(&rest[..n]);
                ep.placed(now, n, mem);
                used += n;
                placed += n;
            }
        }
    }
    (used, placed)
}

/// A pair of data paths enabled with `params` on both sides (the
/// initiator's RTR role for `a`, the responder's for `b` are the caller's).
pub fn datapaths(pa: Params, pb: Params, seed: u64) -> Pair<DataPath> {
    let mut a = DataPath::new(Pd(1), seed ^ 0xa);
    let mut b = DataPath::new(Pd(1), seed ^ 0xb);
    a.enable(pa);
    b.enable(pb);
    Pair::new(a, b, seed)
}

/// Params with the given framing and EMSS.
pub fn params(crc: bool, markers: bool, emss: usize) -> Params {
    Params {
        crc,
        tx_markers: markers,
        rx_markers: markers,
        ird: 8,
        ord: 8,
        emss,
        ..Params::default()
    }
}

impl Endpoint for Connection {
    fn poll_transmit(&mut self, now: Instant, mem: &dyn Memory, budget: usize) -> usize {
        Connection::poll_transmit(self, now, mem, budget)
    }
    fn txq(&self) -> &TxQueue {
        Connection::txq(self)
    }
    fn tx_advance(&mut self, now: Instant, n: usize) {
        Connection::tx_advance(self, now, n)
    }
    fn handle_input(&mut self, now: Instant, data: &[u8], mem: &mut dyn Memory) -> usize {
        Connection::handle_input(self, now, data, mem)
    }
    fn recv_target(&self) -> RecvTarget {
        Connection::recv_target(self)
    }
    fn placed(&mut self, now: Instant, n: usize, mem: &mut dyn Memory) {
        Connection::placed(self, now, n, mem)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        Connection::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now: Instant) {
        Connection::handle_timeout(self, now)
    }
    fn poll_completion(&mut self) -> Option<Completion> {
        self.datapath_mut().poll_completion()
    }
    fn poll_event(&mut self) -> Option<Event> {
        Connection::poll_event(self)
    }
}

/// The verbs both endpoints offer, for tests that run on either: a
/// connection's are its queue pair's.
pub trait Verbs: Endpoint {
    fn dp(&self) -> &DataPath;
    fn dp_mut(&mut self) -> &mut DataPath;
    fn post_send(&mut self, wr: SendWr) -> Result<(), PostError> {
        self.dp_mut().post_send(wr)
    }
    fn post_write(&mut self, wr: WriteWr) -> Result<(), PostError> {
        self.dp_mut().post_write(wr)
    }
    fn post_read(&mut self, wr: ReadWr) -> Result<(), PostError> {
        self.dp_mut().post_read(wr)
    }
    fn post_recv(&mut self, wr: RecvWr) -> Result<(), PostError> {
        self.dp_mut().post_recv(wr)
    }
    fn register_with(
        &mut self,
        region: RegionId,
        offset: usize,
        len: u64,
        attrs: MrAttrs,
    ) -> Result<Stag, RegError> {
        self.dp_mut().register_with(region, offset, len, attrs)
    }
    fn deregister(&mut self, stag: Stag) -> Result<(), RegError> {
        self.dp_mut().deregister(stag)
    }
    fn register(
        &mut self,
        region: RegionId,
        offset: usize,
        len: u64,
        access: Access,
    ) -> Result<Stag, RegError> {
        let pd = self.dp().pd();
        self.register_with(region, offset, len, MrAttrs::new(pd, access))
    }
}

impl Verbs for DataPath {
    fn dp(&self) -> &DataPath {
        self
    }
    fn dp_mut(&mut self) -> &mut DataPath {
        self
    }
}

impl Verbs for Connection {
    fn dp(&self) -> &DataPath {
        self.datapath()
    }
    fn dp_mut(&mut self) -> &mut DataPath {
        self.datapath_mut()
    }
}

/// Connection parameters with the given framing wishes (both C bits, both
/// M bits) and EMSS.
pub fn conn_config(crc: bool, markers: bool, emss: usize, seed: u64) -> ConnectionConfig {
    let mut cfg = ConnectionConfig {
        emss,
        pd: Pd(1),
        stag_seed: seed,
        ..ConnectionConfig::default()
    };
    cfg.startup.crc = crc;
    cfg.startup.markers = markers;
    cfg.startup.ird = 8;
    cfg.startup.ord = 8;
    cfg
}

/// An initiator and a responder, connected (the responder accepts), with
/// the handshake run to the end.
pub fn connected(a: ConnectionConfig, b: ConnectionConfig, seed: u64) -> Pair<Connection> {
    let mut pair = Pair::new(
        Connection::connect(a, b"hello", Instant::now()).unwrap(),
        Connection::listen(b, Instant::now()),
        seed,
    );
    pair.settle();
    match pair.b.ep.poll_event() {
        Some(Event::ConnectRequest { private_data, .. }) => assert_eq!(private_data, b"hello"),
        other => panic!("responder: {other:?}"),
    }
    pair.b.ep.accept(b"welcome").unwrap();
    pair.settle();
    match pair.a.ep.poll_event() {
        Some(Event::Established { private_data, .. }) => assert_eq!(private_data, b"welcome"),
        other => panic!("initiator: {other:?}"),
    }
    assert!(matches!(
        pair.b.ep.poll_event(),
        Some(Event::Established { .. })
    ));
    pair
}
