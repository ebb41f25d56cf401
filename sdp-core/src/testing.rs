//! A deterministic two-connection harness (STYLE habit 5): two
//! [`Conn`]s, the applications on top of them, and a verbs
//! [`Transport`] between them, with virtual time and seeded random
//! interleaving. Every verbs operation is checked against the §10.5 credit
//! rules as it is issued.
//!
//! [`MemTransport`] obeys RDMA Send semantics (RFC 5040 §5.3): a Send
//! consumes the peer's oldest posted receive buffer; with none posted, or
//! a message longer than the buffer, the iWARP layer would Terminate, so
//! both ends get a transport error. It also holds registered memory: RDMA
//! Reads and Writes are checked against the STag, its access rights, its
//! bounds and its validity (a Send with Invalidate or a deregistration
//! ends it), and anything else Terminates (RFC 5040 §4.8). Every work
//! request is checked against Figure 25 of the draft for the Modes its
//! side is in ([`check_modes`]), and every received message against what
//! the receiver may accept ([`check_accept`]); both also hold each side
//! to the cancel rules of §9.5.4 and §9.5.5.
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

use std::collections::HashMap;

use crate::conn::{
    BufferPool, Completion, Config, Conn, FlowControlMode, RecvFlags, SendFlags, State, ZcopyState,
};
use crate::errno::Error;
use crate::verbs::{
    Access, ErrorKind, Event, MemId, Memory, Op, RdmaOp, RecvId, SendKind, Teardown, Work, WrId,
};
use crate::wire::{Body, MessageRepr, Mode};

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

/// The Modes and advertisements of one side, as seen before it issues a
/// work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModeView {
    /// Our send half-connection (A to B in Figure 25).
    pub send: FlowControlMode,
    /// Our receive half-connection (B to A).
    pub recv: FlowControlMode,
    /// Outstanding advertisements.
    pub z: ZcopyState,
}

impl ModeView {
    /// The view of `conn` now.
    pub fn of(conn: &Conn) -> ModeView {
        ModeView {
            send: conn.send_mode(),
            recv: conn.recv_mode(),
            z: conn.zcopy_state(),
        }
    }
}

/// §9.5.5 as one side sees it as a Data Source: the SinkAvailCancels it
/// received and the SinkCancelAcks it sent. "Exactly one SinkCancelAck"
/// answers a cancel that canceled something, none one that found every
/// SinkAvail Processed: never more acks than cancels.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SinkCancels {
    /// SinkAvailCancel Messages received.
    pub received: u64,
    /// SinkCancelAck Messages sent.
    pub acked: u64,
}

/// Figure 25 of the draft ("Summary of Permitted Actions By Mode Pair")
/// for one work request issued by `side` in the Modes `v`: RDMA Read
/// Requests only when the peer's half towards us is Combined or Pipelined,
/// RDMA Writes only when ours is Pipelined, SrcAvail only when ours is not
/// Buffered (one at a time with payload in Combined, without payload in
/// Pipelined), SinkAvail and Transaction only when the peer's half is
/// Pipelined, ModeChange only from the Mode Master (Figure 27). Also the
/// cancels: no SrcAvail while our SrcAvailCancel is not Processed
/// (§9.5.4), and no SinkCancelAck beyond the SinkAvailCancels received
/// (`cancels`, §9.5.5).
///
/// # Panics
///
/// If a rule is broken.
pub fn check_modes(side: usize, v: &ModeView, cancels: &mut SinkCancels, work: &Work) {
    use FlowControlMode::*;
    match work {
        Work::Rdma(RdmaOp::Read { .. }) => {
            assert!(v.recv != Buffered, "side {side}: RDMA Read in {v:?}");
        }
        Work::Rdma(RdmaOp::Write { .. }) => {
            assert!(v.send == Pipelined, "side {side}: RDMA Write in {v:?}");
        }
        Work::Op(Op::Send {
            header, payload, ..
        }) => {
            let with_payload = payload.end > payload.start;
            if header.first() == Some(&0x0a) {
                // SinkCancelAck.
                cancels.acked += 1;
                assert!(
                    cancels.acked <= cancels.received,
                    "side {side}: SinkCancelAck without a SinkAvailCancel to answer: {cancels:?}"
                );
                return;
            }
            if !matches!(header.first(), Some(0xfe | 0xfd | 0x07)) {
                return;
            }
            // The header with room for its payload, to parse.
            let mut bytes = header.to_vec();
            bytes.resize(header.len() + (payload.end - payload.start) as usize, 0);
            let Ok(msg) = MessageRepr::parse(&bytes) else {
                panic!("side {side}: unparsable header {header:?}");
            };
            match msg.body {
                Body::SrcAvail { .. } => {
                    assert!(v.send != Buffered, "side {side}: SrcAvail in {v:?}");
                    // §9.5.4: "after sending a SrcAvailCancel Message, MUST
                    // NOT send any new SrcAvail Messages until the
                    // SrcAvailCancel Message has been Processed".
                    assert!(
                        !v.z.src_cancel_sent,
                        "side {side}: SrcAvail while its SrcAvailCancel is outstanding"
                    );
                    if v.send == Combined {
                        assert!(
                            with_payload,
                            "side {side}: Combined SrcAvail without payload"
                        );
                        assert_eq!(v.z.src_out, 0, "side {side}: a second SrcAvail in Combined");
                    } else {
                        assert!(
                            !with_payload,
                            "side {side}: Pipelined SrcAvail with payload"
                        );
                    }
                }
                Body::SinkAvail { .. } => {
                    assert!(v.recv == Pipelined, "side {side}: SinkAvail in {v:?}");
                }
                Body::ModeChange(m) => {
                    if m.send {
                        assert!(
                            v.recv == Buffered && m.mode == Mode::COMB_MODE,
                            "side {side}: ModeChange S=1 {m:?} in {v:?}"
                        );
                    } else {
                        assert!(v.send != Buffered, "side {side}: ModeChange S=0 in {v:?}");
                    }
                }
                _ => {}
            }
        }
        _ => {}
    }
}

/// Figure 25's "Accept" columns for a message `bytes` arriving at a side in
/// the Modes `v`: SrcAvail only if the peer's half towards us is Combined
/// (one at a time) or Pipelined; SinkAvail (and Transaction) only if our
/// half is Pipelined — or was, with our ModeChange to Combined not yet
/// acknowledged (Figure 30, §12.4). A SinkAvailCancel is counted in
/// `cancels` (see [`check_modes`]).
///
/// # Panics
///
/// If the rule is broken.
pub fn check_accept(side: usize, v: &ModeView, cancels: &mut SinkCancels, bytes: &[u8]) {
    use FlowControlMode::*;
    let Ok(msg) = MessageRepr::parse(bytes) else {
        return;
    };
    match msg.body {
        Body::SinkAvailCancel => cancels.received += 1,
        Body::SrcAvail { .. } => {
            assert!(v.recv != Buffered, "side {side}: SrcAvail arrives in {v:?}");
            if v.recv == Combined {
                assert_eq!(v.z.src_in, 0, "side {side}: second SrcAvail in Combined");
            }
        }
        Body::SinkAvail { .. } => assert!(
            v.send == Pipelined || v.z.mode_ack_pending,
            "side {side}: SinkAvail arrives in {v:?}"
        ),
        _ => {}
    }
}

/// What carries verbs operations between the two connections.
pub trait Transport {
    /// Carries out `work`, issued by side `side` (0 or 1); for a Send, an
    /// RDMA Write or the registration of send stream bytes, `payload`
    /// holds the bytes of its stream range.
    fn submit(
        &mut self,
        side: usize,
        work: &Work,
        payload: &[u8],
        events: &mut Vec<(usize, Event)>,
    );
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
    /// The bytes of side `side`'s posted receive buffer `id` (placed by
    /// RDMA), forgetting them.
    fn take_recv_memory(&mut self, side: usize, id: RecvId) -> Option<Vec<u8>>;
}

/// One thing on the wire from a side.
#[derive(Debug)]
enum Item {
    /// A Send: the message and its kind.
    Msg(Vec<u8>, SendKind),
    /// An RDMA Write.
    Write { stag: u32, to: u64, bytes: Vec<u8> },
    /// An RDMA Read Request.
    Read {
        stag: u32,
        to: u64,
        len: u32,
        into: RecvId,
        offset: u32,
    },
}

/// Registered memory of one side.
#[derive(Debug)]
struct Region {
    side: usize,
    mem: MemId,
    to: u64,
    len: u64,
    access: Access,
    valid: bool,
    /// A snapshot of send stream bytes, or the posted buffer it names.
    source: Option<Vec<u8>>,
    recv: Option<RecvId>,
}

/// Messages and Sends of one direction.
#[derive(Debug, Default)]
struct Dir {
    /// Messages posted, not delivered.
    msgs: VecDeque<Item>,
    /// Work requests posted, not completed, oldest first, with the
    /// completion each reports.
    sends: VecDeque<(WrId, u8)>,
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
    /// Registered memory by STag.
    regions: HashMap<u32, Region>,
    next_stag: u32,
    /// Posted receive buffers' memory per side.
    recv_mem: [HashMap<RecvId, Vec<u8>>; 2],
    /// RDMA bytes moved (Read, Write).
    pub rdma_bytes: [u64; 2],
}

/// Completion kinds in [`Dir::sends`].
const DONE_SEND: u8 = 0;
const DONE_WRITE: u8 = 1;
const DONE_READ: u8 = 2;

impl MemTransport {
    fn terminate(&mut self, events: &mut Vec<(usize, Event)>) {
        // RFC 5040 §4.8: a tagged access fault Terminates the stream.
        events.push((0, Event::TransportError(ErrorKind::Terminated)));
        events.push((1, Event::TransportError(ErrorKind::Terminated)));
        self.kill();
    }

    /// The region `stag` of side `side` if valid, allowing `access`, and
    /// holding `to .. to + len`.
    fn region(
        &mut self,
        side: usize,
        stag: u32,
        to: u64,
        len: u64,
        access: Access,
    ) -> Option<&mut Region> {
        let r = self.regions.get_mut(&stag)?;
        let inside = to >= r.to && to.checked_add(len)? <= r.to.checked_add(r.len)?;
        (r.side == side && r.valid && r.access == access && inside).then_some(r)
    }

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
        let Some(item) = self.dirs[from].msgs.pop_front() else {
            return;
        };
        let (msg, kind) = match item {
            Item::Msg(msg, kind) => (msg, kind),
            Item::Write {
                stag,
                to: at,
                bytes,
            } => {
                let n = bytes.len() as u64;
                let Some(r) = self.region(to, stag, at, n, Access::RemoteWrite) else {
                    return self.terminate(events);
                };
                let off = (at - r.to) as usize;
                let Some(id) = r.recv else {
                    return self.terminate(events);
                };
                let Some(dst) = self.recv_mem[to]
                    .get_mut(&id)
                    .and_then(|m| m.get_mut(off..off + bytes.len()))
                else {
                    return self.terminate(events);
                };
                dst.copy_from_slice(&bytes);
                self.rdma_bytes[from] += n;
                self.dirs[from].delivered += 1;
                return;
            }
            Item::Read {
                stag,
                to: at,
                len,
                into,
                offset,
            } => {
                let Some(r) = self.region(to, stag, at, u64::from(len), Access::RemoteRead) else {
                    return self.terminate(events);
                };
                let off = (at - r.to) as usize;
                let Some(src) = r
                    .source
                    .as_ref()
                    .and_then(|b| b.get(off..off + len as usize))
                    .map(<[u8]>::to_vec)
                else {
                    return self.terminate(events);
                };
                let offset = offset as usize;
                let Some(dst) = self.recv_mem[from]
                    .get_mut(&into)
                    .and_then(|m| m.get_mut(offset..offset + src.len()))
                else {
                    return self.terminate(events);
                };
                dst.copy_from_slice(&src);
                self.rdma_bytes[to] += u64::from(len);
                self.dirs[from].delivered += 1;
                return;
            }
        };
        let invalidate = match kind {
            SendKind::SendInvalidate(s) | SendKind::SendSeInvalidate(s) => Some(s),
            _ => None,
        };
        if let Some(stag) = invalidate {
            // RFC 5040 §6.1: the STag must be the receiver's and valid.
            match self.regions.get_mut(&stag) {
                Some(r) if r.side == to && r.valid => r.valid = false,
                _ => return self.terminate(events),
            }
        }
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
        let len = msg.len();
        events.push((
            to,
            match invalidate {
                Some(stag) => Event::RecvInvalidate { wr_id, len, stag },
                None => Event::RecvDone { wr_id, len },
            },
        ));
    }
}

impl Transport for MemTransport {
    fn submit(
        &mut self,
        side: usize,
        work: &Work,
        payload: &[u8],
        events: &mut Vec<(usize, Event)>,
    ) {
        if self.dead {
            return;
        }
        let op = match work {
            Work::Op(op) => op,
            Work::Rdma(rdma) => return self.submit_rdma(side, rdma, payload, events),
        };
        match op {
            Op::PostRecv { wr_id, buf } => self.rq[side].push_back((*wr_id, *buf)),
            Op::Send {
                wr_id,
                header,
                kind,
                ..
            } => {
                let dir = &mut self.dirs[side];
                if dir.closing {
                    return;
                }
                let mut msg = Vec::with_capacity(header.len() + payload.len());
                msg.extend_from_slice(header);
                msg.extend_from_slice(payload);
                dir.msgs.push_back(Item::Msg(msg, *kind));
                dir.sends.push_back((*wr_id, DONE_SEND));
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
                if let Some((wr_id, kind)) = d.sends.pop_front() {
                    d.delivered -= 1;
                    events.push((action - 2, done_event(wr_id, kind)));
                }
            }
            _ => {
                let from = action - 4;
                // Every Send of the closing side completes before its FIN.
                let d = &mut self.dirs[from];
                d.closing = false;
                for (wr_id, kind) in d.sends.drain(..) {
                    events.push((from, done_event(wr_id, kind)));
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
        self.dirs[side]
            .msgs
            .iter()
            .filter(|m| matches!(m, Item::Msg(..)))
            .count()
    }

    fn take_recv_memory(&mut self, side: usize, id: RecvId) -> Option<Vec<u8>> {
        self.recv_mem[side].remove(&id)
    }
}

fn done_event(wr_id: WrId, kind: u8) -> Event {
    match kind {
        DONE_WRITE => Event::WriteDone { wr_id },
        DONE_READ => Event::ReadDone { wr_id },
        _ => Event::SendDone { wr_id },
    }
}

impl MemTransport {
    fn submit_rdma(
        &mut self,
        side: usize,
        op: &RdmaOp,
        payload: &[u8],
        events: &mut Vec<(usize, Event)>,
    ) {
        match op {
            RdmaOp::Register {
                mem,
                memory,
                access,
            } => {
                self.next_stag = self.next_stag.wrapping_add(0x100);
                let stag = self.next_stag | 0x5a;
                // Tagged Offsets that are not zero-based, to catch VA
                // arithmetic errors.
                let to = u64::from(stag) << 24;
                let (len, source, recv) = match memory {
                    Memory::Stream(r) => (r.end - r.start, Some(payload.to_vec()), None),
                    Memory::Recv { id, len } => {
                        let buf = self.recv_mem[side].entry(*id).or_default();
                        if buf.len() < *len as usize {
                            buf.resize(*len as usize, 0);
                        }
                        (u64::from(*len), None, Some(*id))
                    }
                };
                self.regions.insert(
                    stag,
                    Region {
                        side,
                        mem: *mem,
                        to,
                        len,
                        access: *access,
                        valid: true,
                        source,
                        recv,
                    },
                );
                events.push((
                    side,
                    Event::Registered {
                        mem: *mem,
                        stag,
                        to,
                    },
                ));
            }
            RdmaOp::Deregister { mem } => {
                self.regions
                    .retain(|_, r| !(r.side == side && r.mem == *mem));
            }
            RdmaOp::Write {
                wr_id, stag, to, ..
            } => {
                let dir = &mut self.dirs[side];
                dir.msgs.push_back(Item::Write {
                    stag: *stag,
                    to: *to,
                    bytes: payload.to_vec(),
                });
                dir.sends.push_back((*wr_id, DONE_WRITE));
            }
            RdmaOp::Read {
                wr_id,
                stag,
                to,
                len,
                into,
                offset,
            } => {
                let Some(buf) = self.recv_mem[side].get(into) else {
                    return self.terminate(events);
                };
                if (*offset as usize).saturating_add(*len as usize) > buf.len() {
                    return self.terminate(events);
                }
                let dir = &mut self.dirs[side];
                dir.msgs.push_back(Item::Read {
                    stag: *stag,
                    to: *to,
                    len: *len,
                    into: *into,
                    offset: *offset,
                });
                dir.sends.push_back((*wr_id, DONE_READ));
            }
        }
    }
}

impl Pair<MemTransport> {
    /// Delivers the oldest message or RDMA operation side `from` has on
    /// the wire, feeds what it caused and drains: for tests that script
    /// the order of events. False if nothing was on the wire.
    pub fn deliver_next(&mut self, from: usize) -> bool {
        if self.transport.dirs[from].msgs.is_empty() {
            return false;
        }
        let [a, b] = &mut self.conns;
        let mut events = core::mem::take(&mut self.events);
        self.transport
            .deliver(from, [a.pool_mut(), b.pool_mut()], &mut events);
        for &(side, ev) in &events {
            self.feed(side, ev);
        }
        events.clear();
        self.events = events;
        self.drain();
        true
    }

    /// Delivers everything side `from` has on the wire, in order.
    pub fn deliver_all(&mut self, from: usize) {
        while self.deliver_next(from) {}
    }

    /// Reports the completion of every delivered work request of `side`.
    pub fn complete_delivered(&mut self, side: usize) {
        let d = &mut self.transport.dirs[side];
        let n = d.delivered;
        d.delivered = 0;
        let done: Vec<_> = d.sends.drain(..n).collect();
        for (wr_id, kind) in done {
            self.feed(side, done_event(wr_id, kind));
        }
        self.drain();
    }

    /// What side `from` has on the wire, oldest first: the SDP Messages
    /// (parsed) and RDMA operations, as text for assertions.
    pub fn on_wire(&self, from: usize) -> Vec<String> {
        self.transport.dirs[from]
            .msgs
            .iter()
            .map(|m| match m {
                Item::Msg(bytes, _) => match MessageRepr::parse(bytes) {
                    Ok(msg) => match msg.body {
                        Body::Data { payload } => format!("Data {}", payload.len()),
                        Body::SinkAvail { header, payload } => format!(
                            "SinkAvail stag {} nd {} payload {}",
                            header.stag,
                            header.non_discards,
                            payload.len()
                        ),
                        Body::SrcAvail { header, payload } => format!(
                            "SrcAvail stag {} len {} payload {}",
                            header.stag,
                            header.len,
                            payload.len()
                        ),
                        body => format!("{body:?}"),
                    },
                    Err(e) => format!("unparsable {e:?}"),
                },
                Item::Write { stag, bytes, .. } => format!("Write stag {stag} {}", bytes.len()),
                Item::Read { stag, len, .. } => format!("Read stag {stag} {len}"),
            })
            .collect()
    }

    /// The (MSeq, MSeqAck) of each SDP Message side `from` has on the
    /// wire, in the order of [`Pair::on_wire`] (RDMA operations: (0, 0)).
    pub fn on_wire_seq(&self, from: usize) -> Vec<(u32, u32)> {
        self.transport.dirs[from]
            .msgs
            .iter()
            .map(|m| match m {
                Item::Msg(bytes, _) => MessageRepr::parse(bytes)
                    .map(|msg| (msg.mseq, msg.mseq_ack))
                    .unwrap_or((0, 0)),
                _ => (0, 0),
            })
            .collect()
    }

    /// Places `bytes` (cut or padded to `len`) in the next posted receive
    /// buffer of side `to` and reports a receive of `len` bytes, as if the
    /// peer had sent them: for hostile-peer tests. Returns the buffer
    /// index, or `None` if `to` has no buffer posted.
    pub fn inject(&mut self, to: usize, bytes: &[u8], len: usize) -> Option<usize> {
        self.check_non_discards = false;
        let (wr_id, buf) = self.transport.rq[to].pop_front()?;
        if let Some(dst) = self.conns[to].pool_mut().buffer_mut(buf) {
            let n = bytes.len().min(dst.len());
            dst[..n].copy_from_slice(&bytes[..n]);
        }
        // A hostile peer: not held to Figure 25 here, the connection
        // under test judges it.
        self.conns[to].handle_event(self.now, Event::RecvDone { wr_id, len });
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
    /// How this application uses the Zcopy calls.
    pub zcopy: ZcopyUse,
    /// Zcopy send buffers handed and not completed: (id, start, length,
    /// write hash before it).
    zsends: Vec<(crate::verbs::SendId, u64, u64, StreamHash)>,
    /// Posted receive buffers not returned.
    pub posted: Vec<RecvId>,
    /// Bytes of the last returned buffer still to copy with `recv`
    /// (§9.5.1: one SDP Message's payload).
    copy_left: u32,
    /// Completions seen: Zcopy sends, sends cut by a cancel, receive
    /// buffers with placed bytes, with bytes to copy, unused.
    pub seen: [u64; 5],
    /// Zcopy sends taken back by [`Pair::app_interrupt`].
    pub interrupts: u64,
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
            zcopy: ZcopyUse::default(),
            zsends: Vec::new(),
            posted: Vec::new(),
            copy_left: 0,
            seen: [0; 5],
            interrupts: 0,
            staged: Vec::new(),
            staged_start: 0,
            staged_base: 0,
        }
    }

    /// Whether every Zcopy send buffer came back.
    pub fn zsends_done(&self) -> bool {
        self.zsends.is_empty()
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

/// How an [`App`] uses [`Conn::send_zcopy`], [`Conn::post_recv`] and the
/// Mode calls: chances in percent per action.
#[derive(Debug, Clone, Copy, Default)]
pub struct ZcopyUse {
    /// A write is a `send_zcopy` of up to `send_max` bytes.
    pub send_chance: u64,
    /// Largest `send_zcopy` buffer.
    pub send_max: u64,
    /// Deadline of a `send_zcopy`, in microseconds of virtual time (0:
    /// none).
    pub send_deadline_us: u64,
    /// Post a receive buffer of up to `post_max` bytes when none is posted.
    pub post_chance: u64,
    /// Largest posted buffer.
    pub post_max: u32,
    /// A posted buffer is MSG_WAITALL.
    pub waitall_chance: u64,
    /// Deadline of a posted buffer, in microseconds (0: none).
    pub post_deadline_us: u64,
    /// A step asks for a Mode transition.
    pub mode_chance: u64,
    /// A step takes a Zcopy send buffer back, as a signal interrupting
    /// the blocking write does ([`Conn::cancel_send`]).
    pub interrupt_chance: u64,
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
    /// Work requests checked against Figure 25.
    pub works_checked: u64,
    /// Whether every work request also checks the §9.5.1 counters of the
    /// two sides against each other (off once a test injects messages).
    pub check_non_discards: bool,
    /// Messages checked against Figure 25's Accept columns.
    pub accepts_checked: u64,
    /// §9.5.5 counts of each side (see [`check_modes`]).
    pub sink_cancels: [SinkCancels; 2],
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
        let mut pair = Pair::answered(a, b, seed, transport);
        // The RTR arrives at the responder.
        pair.feed(1, Event::Established);
        pair.drain();
        let ok = pair.run(10_000, |p| p.conns[0].state() == State::Connected);
        assert!(ok, "setup did not finish");
        pair
    }

    /// The pair as the Accepting Peer hands its connection to the program:
    /// the Hello accepted and both sides' buffers posted, the RTR not yet
    /// arrived (feed [`Event::Established`] to side 1 for it).
    ///
    /// # Panics
    ///
    /// If the Accepting Peer refuses the Hello.
    pub fn answered(a: &Config, b: &Config, seed: u64, transport: T) -> Pair<T> {
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
            works_checked: 0,
            check_non_discards: true,
            accepts_checked: 0,
            sink_cancels: [SinkCancels::default(); 2],
            transport_events: [Vec::new(), Vec::new()],
            tx_base: [0; 2],
            events: Vec::new(),
            buf: Vec::new(),
            expect: Vec::new(),
        };
        // Both post their buffers.
        pair.drain();
        pair
    }

    /// Issues every pending Op of both connections to the transport,
    /// checking §10.5 before each Send and the credit accounting after.
    pub fn drain(&mut self) {
        loop {
            let mut any = false;
            for side in 0..2 {
                while let Some(before) = Some(self.conns[side].credit_state()) {
                    let view = ModeView::of(&self.conns[side]);
                    let Some(work) = self.conns[side].poll_work() else {
                        break;
                    };
                    any = true;
                    if let Work::Op(Op::Send {
                        ref payload,
                        ref header,
                        ..
                    }) = work
                    {
                        self.check_send(side, &before, header, payload.end > payload.start);
                    }
                    check_modes(side, &view, &mut self.sink_cancels[side], &work);
                    self.works_checked += 1;
                    let base = self.tx_base[side];
                    let range = match &work {
                        Work::Op(Op::Send { payload, .. })
                        | Work::Rdma(RdmaOp::Write { payload, .. }) => payload.clone(),
                        Work::Rdma(RdmaOp::Register {
                            memory: Memory::Stream(r),
                            ..
                        }) => r.clone(),
                        _ => 0..0,
                    };
                    let payload: &[u8] = if range.end > range.start {
                        self.apps[side].payload(range.start + base..range.end + base)
                    } else {
                        &[]
                    };
                    let mut events = core::mem::take(&mut self.events);
                    self.transport.submit(side, &work, payload, &mut events);
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
        let peer = &self.conns[1 - side];
        if self.check_non_discards && peer.state() == State::Connected {
            // §9.5.1: PotentialNonDiscards counts every payload message
            // sent less the stale SinkAvails discarded, each of which the
            // Data Sink completed (or will) with one of those messages
            // instead of counting it: it never falls below the peer's
            // NonDiscards. Below it, a SinkAvail the Data Sink already
            // returned would pass for fresh.
            let pnd = conn.zcopy_state().potential_non_discards;
            let nd = peer.zcopy_state().non_discards;
            assert!(
                pnd.wrapping_sub(nd) as i32 >= 0,
                "side {side}: PotentialNonDiscards {pnd} < peer NonDiscards {nd}"
            );
        }
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

    /// Takes the application of `side`'s stream back to offset `point`,
    /// as a cut send buffer leaves it (for scripted tests, which compare
    /// bytes: the write hash is not rewound).
    pub fn unstage(&mut self, side: usize, point: u64) {
        let app = &mut self.apps[side];
        let keep = (point - app.staged_base) as usize + app.staged_start;
        app.staged.truncate(keep);
        app.written = point;
    }

    /// Feeds one event to a side, checking a received message against
    /// what the side's Modes let it accept.
    pub fn feed(&mut self, side: usize, event: Event) {
        if matches!(event, Event::TransportError(_) | Event::TransportClosed) {
            self.transport_events[side].push(event);
        }
        if let Event::RecvDone { wr_id, len } | Event::RecvInvalidate { wr_id, len, .. } = event {
            let conn = &self.conns[side];
            if conn.state() == State::Connected {
                let bytes = conn
                    .pool()
                    .buffer(wr_id.0 as usize)
                    .and_then(|b| b.get(..len));
                if let Some(bytes) = bytes {
                    check_accept(
                        side,
                        &ModeView::of(conn),
                        &mut self.sink_cancels[side],
                        bytes,
                    );
                    self.accepts_checked += 1;
                }
            }
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
        if app.zcopy.send_chance > 0 && self.rng.chance(app.zcopy.send_chance, 100) {
            let len = (1 + self.rng.below(app.zcopy.send_max.max(1))).min(left);
            let deadline = (app.zcopy.send_deadline_us > 0).then(|| {
                self.now + Duration::from_micros(1 + self.rng.below(app.zcopy.send_deadline_us))
            });
            match self.conns[side].send_zcopy(len, deadline, self.now) {
                Ok(id) => {
                    let app = &mut self.apps[side];
                    app.zsends.push((id, app.written, len, app.write_hash));
                    let start = app.staged.len();
                    app.staged.resize(start + len as usize, 0);
                    pattern(app.seed, app.written, &mut app.staged[start..]);
                    app.write_hash.update(&app.staged[start..]);
                    app.written += len;
                }
                Err(Error::WouldBlock) => {}
                Err(e) => self.apps[side].errors.push(e),
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

    /// A signal interrupts the application of `side` in one of its Zcopy
    /// writes: the buffer is taken back ([`Conn::cancel_send`]); its
    /// completion says what stayed in the stream.
    pub fn app_interrupt(&mut self, side: usize) {
        let zsends = &self.apps[side].zsends;
        if zsends.is_empty() {
            return;
        }
        let (id, ..) = zsends[self.rng.below(zsends.len() as u64) as usize];
        if self.conns[side].cancel_send(id, self.now) {
            self.apps[side].interrupts += 1;
        }
        self.drain();
    }

    /// The application of `side` takes its finished Zcopy buffers: checks
    /// the placed bytes, notes the bytes to copy, rolls its stream back to
    /// what a canceled send left in it.
    pub fn app_completions(&mut self, side: usize) {
        while let Some(c) = self.conns[side].poll_completion() {
            match c {
                Completion::Sent { id, len, .. } => {
                    let app = &mut self.apps[side];
                    let Some(i) = app.zsends.iter().position(|z| z.0 == id) else {
                        panic!("side {side}: completion of unknown send {id:?}");
                    };
                    let (_, start, asked, hash) = app.zsends.remove(i);
                    app.seen[0] += 1;
                    if len < asked && start < app.written {
                        // §9.5.4: the rest of it, and everything after,
                        // never entered the stream.
                        app.seen[1] += 1;
                        let point = start + len;
                        let keep = (point - app.staged_base) as usize + app.staged_start;
                        app.staged.truncate(keep);
                        // Its bytes that went (maybe released already).
                        let mut went = vec![0; len as usize];
                        pattern(app.seed, start, &mut went);
                        app.write_hash = hash;
                        app.write_hash.update(&went);
                        app.written = point;
                    } else if start >= app.written {
                        // A later buffer of the same cut: none of it went.
                        assert_eq!(len, 0, "side {side}: {id:?} after a cut");
                    } else {
                        assert_eq!(len, asked, "side {side}: {id:?}");
                    }
                }
                Completion::Received { id, placed, copy } => {
                    let app = &mut self.apps[side];
                    app.posted.retain(|p| *p != id);
                    let mem = self.transport.take_recv_memory(side, id);
                    if placed > 0 {
                        let Some(bytes) = mem.as_ref().and_then(|m| m.get(..placed as usize))
                        else {
                            panic!("side {side}: no placed bytes for {id:?}");
                        };
                        self.expect.resize(placed as usize, 0);
                        pattern(app.peer_seed, app.read, &mut self.expect);
                        assert!(
                            bytes == &self.expect[..],
                            "side {side}: wrong placed bytes at offset {}",
                            app.read
                        );
                        app.read_hash.update(bytes);
                        app.read += u64::from(placed);
                        app.seen[2] += 1;
                    } else if copy > 0 {
                        app.copy_left = copy;
                        app.seen[3] += 1;
                    } else {
                        app.seen[4] += 1;
                    }
                }
            }
        }
    }

    /// The application of `side` posts a receive buffer.
    pub fn app_post(&mut self, side: usize) {
        let z = self.apps[side].zcopy;
        let len = 1 + self.rng.below(u64::from(z.post_max.max(1))) as u32;
        let flags = if self.rng.chance(z.waitall_chance, 100) {
            RecvFlags::WAITALL
        } else {
            RecvFlags::EMPTY
        };
        let deadline = (z.post_deadline_us > 0)
            .then(|| self.now + Duration::from_micros(1 + self.rng.below(z.post_deadline_us)));
        match self.conns[side].post_recv(len, flags, deadline) {
            Ok(id) => self.apps[side].posted.push(id),
            Err(e) => self.apps[side].errors.push(e),
        }
    }

    /// The application of `side` asks for a random Mode transition.
    pub fn app_mode(&mut self, side: usize) {
        use FlowControlMode::*;
        let modes = [Buffered, Combined, Pipelined];
        let m = modes[self.rng.below(3) as usize];
        let conn = &mut self.conns[side];
        let _ = if self.rng.chance(1, 2) {
            conn.set_send_mode(m)
        } else {
            conn.set_recv_mode(m)
        };
    }

    /// The application of `side` reads once and checks the bytes.
    pub fn app_read(&mut self, side: usize) {
        self.app_completions(side);
        let mut want = 1 + self.rng.below(self.apps[side].max_io as u64) as usize;
        let copy = self.apps[side].copy_left;
        if copy > 0 {
            want = copy as usize;
        }
        self.buf.resize(want, 0);
        match self.conns[side].recv(&mut self.buf, RecvFlags::EMPTY) {
            Ok(0) => self.apps[side].eof = true,
            Ok(n) => {
                let app = &mut self.apps[side];
                app.copy_left = app.copy_left.saturating_sub(n as u32);
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
        // Timers that came due fire, busy or not.
        let mut fired = false;
        for c in &mut self.conns {
            if c.poll_timeout().is_some_and(|t| t <= self.now) {
                c.handle_timeout(self.now);
                fired = true;
            }
        }
        if fired {
            self.drain();
        }
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
            // A reader blocked in recv while a SrcAvail waits also calls.
            let blocked = conn.state() == State::Connected && conn.zcopy_state().src_in > 0;
            if app.reading && !app.eof && (conn.readable() || blocked) {
                choices.push(3 + side);
            }
            let z = app.zcopy;
            if app.reading
                && z.post_chance > 0
                && app.posted.len() < 2
                && conn.state() == State::Connected
                && self.rng.chance(z.post_chance, 100)
            {
                choices.push(5 + side);
            }
            if z.mode_chance > 0
                && conn.state() == State::Connected
                && self.rng.chance(z.mode_chance, 100)
            {
                choices.push(7 + side);
            }
            if !app.zsends.is_empty() && conn.completion_ready() {
                choices.push(9 + side);
            }
            if z.interrupt_chance > 0
                && !app.zsends.is_empty()
                && self.rng.chance(z.interrupt_chance, 100)
            {
                choices.push(11 + side);
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
            3 | 4 => self.app_read(choice - 3),
            5 | 6 => self.app_post(choice - 5),
            7 | 8 => self.app_mode(choice - 7),
            9 | 10 => self.app_completions(choice - 9),
            _ => self.app_interrupt(choice - 11),
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
        self.sink_cancels[other] = SinkCancels::default();
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{Flags, SrcAvailRepr};

    fn message(body: Body<'_>) -> Vec<u8> {
        let msg = MessageRepr {
            bufs: 4,
            flags: Flags::EMPTY,
            mseq: 7,
            mseq_ack: 3,
            body,
        };
        let mut out = vec![0; msg.buffer_len()];
        msg.emit(&mut out);
        out
    }

    /// One message as a work request: its header, and the stream range of
    /// the payload that follows it.
    fn send(body: Body<'_>) -> Work {
        let header_len = body.ext_header_len() + crate::wire::bsdh::HEADER_LEN;
        let out = message(body);
        Work::Op(Op::Send {
            wr_id: WrId(1),
            kind: SendKind::Send,
            header: crate::verbs::SendHeader::from_slice(&out[..header_len]).unwrap(),
            payload: 0..(out.len() - header_len) as u64,
            local: None,
        })
    }

    fn src_avail() -> Work {
        let header = SrcAvailRepr {
            len: 10_000,
            stag: 9,
            va: 0,
        };
        send(Body::SrcAvail {
            header,
            payload: &[],
        })
    }

    fn pipelined(src_cancel_sent: bool) -> ModeView {
        ModeView {
            send: FlowControlMode::Pipelined,
            recv: FlowControlMode::Pipelined,
            z: ZcopyState {
                src_cancel_sent,
                ..ZcopyState::default()
            },
        }
    }

    /// The panic message of `f`, if it panics.
    fn panic_of(f: impl FnOnce()) -> Option<String> {
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).err()?;
        err.downcast_ref::<String>()
            .cloned()
            .or(Some(String::new()))
    }

    /// §9.5.4: a Pipelined SrcAvail passes, the same SrcAvail while our
    /// SrcAvailCancel is outstanding fails.
    #[test]
    fn src_avail_after_src_avail_cancel_fails() {
        let mut c = SinkCancels::default();
        check_modes(0, &pipelined(false), &mut c, &src_avail());
        let got = panic_of(|| check_modes(0, &pipelined(true), &mut c, &src_avail()));
        assert_eq!(
            got.as_deref(),
            Some("side 0: SrcAvail while its SrcAvailCancel is outstanding")
        );
    }

    /// §9.5.5: one SinkCancelAck per SinkAvailCancel received passes; a
    /// second ack for one cancel, or an ack for none, fails.
    #[test]
    fn sink_cancel_ack_beyond_the_cancels_fails() {
        let v = pipelined(false);
        let mut c = SinkCancels::default();
        let ack = send(Body::SinkCancelAck);
        let got = panic_of(|| check_modes(1, &v, &mut c.clone(), &ack));
        assert!(got
            .unwrap()
            .contains("SinkCancelAck without a SinkAvailCancel"));
        check_accept(1, &v, &mut c, &message(Body::SinkAvailCancel));
        check_modes(1, &v, &mut c, &ack);
        assert_eq!(
            c,
            SinkCancels {
                received: 1,
                acked: 1
            }
        );
        let got = panic_of(|| check_modes(1, &v, &mut c, &ack));
        assert!(got
            .unwrap()
            .contains("SinkCancelAck without a SinkAvailCancel"));
    }
}
