//! The receive half of a connection: the receive Private Buffer pool, the
//! received byte stream (draft §9.1 Bcopy at the Data Sink, §10), what
//! each arriving message does ([`Conn`]'s `on_message`), [`Conn::recv`]
//! and readability.
//!
//! Every SDP Message lands in a posted receive Private Buffer. A message
//! without payload gives its buffer back at once; a Data Message keeps its
//! buffer until the application has read every byte of it, so buffers
//! (and with them the peer's credits, §10.2) come back as fast as the
//! application reads — that is the flow control a TCP receiver expects.
//!
//! The stream also keeps the urgent mark for OOB data (§9.5.3) with the
//! Linux TCP semantics: a read stops at the mark, the urgent byte is left
//! out of the stream unless SO_OOBINLINE, and a read that passes the mark
//! forgets it.
//!
//! ```
//! use sdp_core::conn::BufferPool;
//!
//! let mut pool = BufferPool::new(4, 64);
//! pool.buffer_mut(2).unwrap()[..3].copy_from_slice(b"abc");
//! assert_eq!(&pool.buffer(2).unwrap()[..3], b"abc");
//! assert!(pool.buffer(4).is_none());
//! ```

use std::collections::VecDeque;

use std::time::Instant;

use super::close::Reading;
use super::credit::PAYLOAD_MIN_CREDIT;
use super::local::{self, Ring};
use super::send::OOB_PEND_REACH;
use super::setup::PeerParams;
use super::suspend::LocalSuspend;
use super::{
    setup, CloseReason, Conn, Control, PostKind, Received, RecvFlags, Role, State, Violation,
};
use crate::errno::Error;
use crate::verbs::{Teardown, WrId};
use crate::wire::{self, Body, Flags, MessageRepr, Mid};

/// The receive Private Buffers of one connection: `count` buffers of
/// `buf_size` bytes. Kept apart from the rest of the connection so the
/// adapter can lend it to the iWARP engine as the memory that receives
/// are placed into.
///
/// A buffer takes memory as bytes are placed into it, not when it is
/// posted: the credits advertised for the pool (§10.2) cost nothing until
/// the peer uses them, and an idle connection's pool holds only what its
/// messages filled ([`grow`]). A buffer keeps what it grew to (no memory
/// is cleared twice, nor given back and taken again, on a busy
/// connection).
#[derive(Debug, Clone)]
pub struct BufferPool {
    /// Buffers `0..bufs.len()`; the others never held a byte.
    bufs: Vec<Vec<u8>>,
    count: usize,
    buf_size: usize,
    /// Bytes the buffers' allocations hold.
    held: usize,
    /// The ring offered to a peer on the same host ([`super::local`]),
    /// boxed: few connections have one.
    pub(crate) ring: Option<Box<Ring>>,
}

impl BufferPool {
    /// `count` buffers of `buf_size` bytes, none holding memory yet.
    pub fn new(count: usize, buf_size: usize) -> BufferPool {
        BufferPool {
            bufs: Vec::new(),
            count,
            buf_size,
            held: 0,
            ring: None,
        }
    }

    /// Number of buffers.
    pub fn len(&self) -> usize {
        self.count
    }

    /// Whether the pool has no buffers.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// `count` buffers from now on, the new ones holding no memory yet
    /// (fewer than now: unchanged).
    pub fn grow_to(&mut self, count: usize) {
        self.count = self.count.max(count);
    }

    /// Size of each buffer in bytes.
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    /// The bytes placed so far in buffer `i` (a prefix of it, the rest
    /// never written), or `None` if there is no such buffer.
    pub fn buffer(&self, i: usize) -> Option<&[u8]> {
        if i >= self.count {
            return None;
        }
        Some(self.bufs.get(i).map_or(&[], Vec::as_slice))
    }

    /// Buffer `i` for writing, all `buf_size` bytes, or `None` if there is
    /// no such buffer.
    pub fn buffer_mut(&mut self, i: usize) -> Option<&mut [u8]> {
        self.range_mut(i, 0..self.buf_size)
    }

    /// Bytes `range` of buffer `i` for writing (the buffer grows to hold
    /// them), or `None` if there is no such buffer or the range passes
    /// its end.
    pub fn range_mut(&mut self, i: usize, range: core::ops::Range<usize>) -> Option<&mut [u8]> {
        if range.end > self.buf_size || i >= self.count {
            return None;
        }
        if self.bufs.len() <= i {
            self.bufs.resize_with(i + 1, Vec::new);
        }
        let buf = self.bufs.get_mut(i)?;
        let before = buf.capacity();
        grow(buf, range.end, self.buf_size);
        self.held += buf.capacity() - before;
        buf.get_mut(range)
    }

    /// Bytes the buffers' allocations hold now (not the same-host ring).
    pub fn held(&self) -> usize {
        self.held
    }

    /// Gives back the memory of every buffer but those `keep` says, for a
    /// connection gone idle: the buffers stay posted and take memory again
    /// as bytes land, as at the start. The caller keeps every buffer that
    /// holds an unread message or may be written before the next message
    /// begins.
    pub fn give_back(&mut self, keep: impl Fn(usize) -> bool) {
        for (i, buf) in self.bufs.iter_mut().enumerate() {
            if buf.capacity() > 0 && !keep(i) {
                self.held -= buf.capacity();
                *buf = Vec::new();
            }
        }
        while self.bufs.last().is_some_and(|b| b.capacity() == 0) {
            self.bufs.pop();
        }
        if self.bufs.is_empty() {
            self.bufs = Vec::new();
        }
    }
}

impl BufferPool {
    /// The unread bytes of `seg` from `in_seg` on.
    fn segment(&self, seg: &Segment, in_seg: usize) -> Option<&[u8]> {
        let from = seg.start + in_seg;
        match seg.slot {
            Some(slot) => self.ring.as_ref()?.slot(slot, from..seg.end),
            None => self.buffer(seg.buf)?.get(from..seg.end),
        }
    }
}

/// Grows `buf` to `len` bytes (zero-filling only the new ones), its
/// allocation doubling up to `cap`: a buffer that carries small messages
/// stays small, one that fills at once takes its size in one step, and
/// each byte is copied by a reallocation at most about once on average.
pub(crate) fn grow(buf: &mut Vec<u8>, len: usize, cap: usize) {
    if buf.len() >= len {
        return;
    }
    if buf.capacity() < len {
        let want = len.max(buf.capacity() * 2).max(GROW_MIN).min(cap.max(len));
        buf.reserve_exact(want - buf.len());
    }
    buf.resize(len, 0);
}

/// The smallest allocation [`grow`] makes: a Hello or a short message
/// fits.
const GROW_MIN: usize = 64;

/// Received payload not yet read: bytes `start..end` of buffer `buf`, or
/// of slot `slot` of the ring for a LocalData (whose buffer holds only
/// its header, and is held all the same).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    buf: usize,
    start: usize,
    end: usize,
    slot: Option<u32>,
}

impl Segment {
    fn len(&self) -> usize {
        self.end.saturating_sub(self.start)
    }
}

/// The urgent byte and where it sits in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Mark {
    /// Stream offset of the urgent byte.
    pub offset: u64,
    /// The byte.
    pub byte: u8,
    /// Read out of band already (Linux TCP_URG_READ).
    pub read: bool,
}

/// The received byte stream, in receive Private Buffers.
#[derive(Debug, Clone, Default)]
pub(crate) struct RxStream {
    segs: VecDeque<Segment>,
    /// Stream offset of the next byte to read.
    read: u64,
    /// Stream offset after the last byte received.
    total: u64,
    /// The urgent mark, until a read passes it.
    pub mark: Option<Mark>,
    /// Bytes placed by RDMA into posted ULP buffers (§9.2, §9.3), as
    /// (stream offset, length), oldest first: they are in the stream but
    /// not in the pool, so a read stops in front of them.
    placed: VecDeque<(u64, u64)>,
}

impl RxStream {
    /// Stream offset after the last byte received.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Bytes received and not read.
    pub fn queued(&self) -> u64 {
        self.total.saturating_sub(self.read)
    }

    /// Stream offset of the next byte to read.
    pub fn read_pos(&self) -> u64 {
        self.read
    }

    /// Where the bytes a plain read may copy end: the next placed bytes or
    /// the end of the stream.
    fn pool_end(&self) -> u64 {
        self.placed.front().map_or(self.total, |&(at, _)| at)
    }

    /// Appends `len` bytes placed outside the pool by RDMA.
    pub fn push_placed(&mut self, len: u64) {
        if len == 0 {
            return;
        }
        self.placed.push_back((self.total, len));
        self.total = self.total.saturating_add(len);
    }

    /// The length of the placed bytes at the read position, if any.
    pub fn placed_at_read(&self) -> Option<u64> {
        match self.placed.front() {
            Some(&(at, len)) if at == self.read => Some(len),
            _ => None,
        }
    }

    /// Steps the read position over the placed bytes there.
    pub fn take_placed(&mut self) -> u64 {
        let Some(len) = self.placed_at_read() else {
            return 0;
        };
        self.placed.pop_front();
        self.read = self.read.saturating_add(len);
        if self.mark.is_some_and(|m| m.offset < self.read) {
            self.mark = None;
        }
        len
    }

    /// Buffers holding unread payload.
    pub fn held_buffers(&self) -> usize {
        self.segs.len()
    }

    /// Bytes a normal read could return now: the urgent byte does not count
    /// while it waits at the read position out of line (as Linux
    /// `tcp_poll`).
    pub fn readable(&self, inline: bool) -> u64 {
        let mut n = self.pool_end().saturating_sub(self.read);
        if !inline && self.mark.is_some_and(|m| m.offset == self.read) {
            n = n.saturating_sub(1);
        }
        n
    }

    /// Whether the next byte to read is the urgent byte (SIOCATMARK).
    pub fn at_mark(&self) -> bool {
        self.mark.is_some_and(|m| m.offset == self.read)
    }

    /// Appends `buf[start..end]` to the stream.
    pub fn push(&mut self, buf: usize, start: usize, end: usize) {
        self.push_seg(Segment {
            buf,
            start,
            end,
            slot: None,
        });
    }

    /// Appends the first `len` bytes of ring slot `slot`, announced by the
    /// LocalData in `buf`.
    pub fn push_local(&mut self, buf: usize, slot: u32, len: usize) {
        self.push_seg(Segment {
            buf,
            start: 0,
            end: len,
            slot: Some(slot),
        });
    }

    fn push_seg(&mut self, seg: Segment) {
        self.total = self.total.saturating_add(seg.len() as u64);
        self.segs.push_back(seg);
    }

    /// Sets a new urgent mark on the byte at `offset`. An older urgent byte
    /// still in the stream becomes normal data, except that one waiting out
    /// of line at the read position is dropped (Linux `tcp_check_urg`).
    pub fn set_mark(&mut self, offset: u64, byte: u8, inline: bool, freed: &mut Vec<usize>) {
        if let Some(old) = self.mark {
            if !inline && old.offset == self.read && self.read < self.total {
                self.consume(1, freed);
            }
        }
        self.mark = Some(Mark {
            offset,
            byte,
            read: false,
        });
    }

    /// Drops `n` bytes from the front of the stream.
    pub(crate) fn consume(&mut self, mut n: usize, freed: &mut Vec<usize>) {
        while n > 0 {
            let Some(front) = self.segs.front_mut() else {
                break;
            };
            let take = n.min(front.len());
            front.start += take;
            self.read = self.read.saturating_add(take as u64);
            n -= take;
            if front.len() == 0 {
                freed.push(front.buf);
                self.segs.pop_front();
            }
        }
    }

    /// Copies received bytes into `out` the way Linux `tcp_recvmsg` does:
    /// a read stops before the urgent mark once it has copied something;
    /// at the mark, the urgent byte is skipped unless `inline`. With `peek`
    /// nothing is consumed. Buffers emptied are pushed onto `freed`.
    pub fn read(
        &mut self,
        pool: &BufferPool,
        out: &mut [u8],
        peek: bool,
        inline: bool,
        freed: &mut Vec<usize>,
    ) -> usize {
        // A cursor: segment index, offset inside it, stream offset.
        let mut idx = 0;
        let mut in_seg = 0usize;
        let mut pos = self.read;
        let mut copied = 0usize;
        let pool_end = self.pool_end();
        while copied < out.len() {
            let mut limit = usize::try_from(pool_end.saturating_sub(pos)).unwrap_or(usize::MAX);
            if limit == 0 {
                break;
            }
            if let Some(mark) = self.mark {
                if mark.offset == pos {
                    if copied > 0 {
                        break;
                    }
                    if !inline {
                        // Step over the urgent byte.
                        if !self.advance(&mut idx, &mut in_seg, 1) {
                            break;
                        }
                        pos += 1;
                        continue;
                    }
                } else if mark.offset > pos {
                    limit = limit.min(usize::try_from(mark.offset - pos).unwrap_or(usize::MAX));
                }
            }
            let Some(seg) = self.segs.get(idx) else {
                break;
            };
            let Some(src) = pool.segment(seg, in_seg) else {
                break;
            };
            let Some(dst) = out.get_mut(copied..) else {
                break;
            };
            let n = src.len().min(dst.len()).min(limit);
            dst[..n].copy_from_slice(&src[..n]);
            copied += n;
            pos += n as u64;
            self.advance(&mut idx, &mut in_seg, n);
        }
        if !peek {
            // Commit the cursor.
            let n = usize::try_from(pos - self.read).unwrap_or(usize::MAX);
            self.consume(n, freed);
            if self.mark.is_some_and(|m| m.offset < self.read) {
                self.mark = None;
            }
        }
        copied
    }

    /// This stream in a new pool for a resumed connection (draft §13.1.1
    /// step 4): the buffers holding unread payload are copied to the first
    /// buffers of a pool of `held + fresh` buffers of `pool`'s size, the
    /// segments renumbered; buffers `held..` are free for the new
    /// connection to post.
    pub(crate) fn carry_over(&self, pool: &BufferPool, fresh: usize) -> (BufferPool, RxStream) {
        let held = self.segs.len();
        let mut new_pool = BufferPool::new(held.saturating_add(fresh), pool.buf_size());
        let mut rx = self.clone();
        for (i, seg) in rx.segs.iter_mut().enumerate() {
            // A LocalData's bytes move out of the ring to the same place
            // in the new buffer: the new connection starts without one.
            let src = match seg.slot.take() {
                Some(slot) => pool.ring.as_ref().and_then(|r| r.slot(slot, 0..seg.end)),
                None => pool.buffer(seg.buf),
            };
            if let Some(src) = src {
                if let Some(dst) = new_pool.range_mut(i, 0..src.len()) {
                    dst.copy_from_slice(src);
                }
            }
            seg.buf = i;
        }
        (new_pool, rx)
    }

    /// Moves a cursor `n` bytes on; false if the stream ends first.
    fn advance(&self, idx: &mut usize, in_seg: &mut usize, mut n: usize) -> bool {
        while n > 0 {
            let Some(seg) = self.segs.get(*idx) else {
                return false;
            };
            let left = seg.len() - *in_seg;
            if n < left {
                *in_seg += n;
                return true;
            }
            n -= left;
            *idx += 1;
            *in_seg = 0;
        }
        // Normalise: never rest at the end of a segment.
        while self.segs.get(*idx).is_some_and(|s| *in_seg >= s.len()) {
            *idx += 1;
            *in_seg = 0;
        }
        true
    }
}

// ----- The receive half of a connection --------------------------------

impl Conn {
    pub(super) fn on_recv(
        &mut self,
        now: Instant,
        wr_id: WrId,
        len: usize,
        invalidated: Option<u32>,
    ) {
        if self.state == State::Closed {
            return;
        }
        match self.posted.front() {
            Some(&buf) if buf as u64 == wr_id.0 => {}
            _ => return self.violation(Violation::BadCompletion),
        }
        let Some(buf) = self.posted.pop_front() else {
            return;
        };
        // §10 constraint 3: "A Local Peer MUST NOT send SDP Messages larger
        // than the size of the Remote Peer's receive Private Buffers."
        let size = self.pool.buf_size();
        if len > size {
            return self.violation(Violation::MessageTooLarge { len, size });
        }
        // A payload placed straight into a waiting reader's buffer (the
        // link's receive overlay) never landed here; the buffer spans the
        // whole message all the same.
        let _ = self.pool.range_mut(buf, 0..len);
        match self.parse(buf, len) {
            Ok(msg) => self.on_message(now, buf, msg, invalidated),
            Err(v) => self.violation(v),
        }
    }

    /// Parses and checks the message in `buf` (§6 rules needing no state).
    pub(super) fn parse(&self, buf: usize, len: usize) -> Result<Received, Violation> {
        let bytes = self
            .pool
            .buffer(buf)
            .and_then(|b| b.get(..len))
            .ok_or(Violation::BadCompletion)?;
        let msg = MessageRepr::parse(bytes)?;
        if let Body::Other { mid, .. } = msg.body {
            // §6.1.1 Figure 3: reserved and experimental values define no
            // message.
            return Err(Violation::ReservedMid(mid));
        }
        msg.validate()?;
        let hello_ack = if self.state == State::HelloSent || self.resuming {
            // §8.1.1 step 2: the Accepting Peer's first iWARP Message is the
            // HelloAck; step 7a checks.
            let mut peer = setup::check_hello_ack(&msg)?;
            peer.local = bytes
                .get(setup::RSVD_AT)
                .is_some_and(|b| b & wire::LOCAL_BIT != 0);
            Some(peer)
        } else {
            None
        };
        let (local_offer, local_data) = match msg.body {
            Body::LocalOffer(loh) => (Some(loh), None),
            Body::LocalData(ldh) => (None, Some(ldh)),
            _ => (None, None),
        };
        let susp_port = match msg.body {
            Body::SuspComm(sch) => Some(sch.port),
            _ => None,
        };
        let payload = msg.body.payload();
        let start = msg.header_len();
        let compl_len = match msg.body {
            Body::RdmaRdCompl(r) => r.len,
            Body::RdmaWrCompl(r) => r.len,
            Body::ChRcvBufAck(r) => r.act_sz,
            _ => 0,
        };
        let (sink_avail, src_avail) = match msg.body {
            Body::SinkAvail { header, .. } => (Some(header), None),
            Body::SrcAvail { header, .. } => (None, Some(header)),
            _ => (None, None),
        };
        let mode_change = match msg.body {
            Body::ModeChange(m) => Some(m),
            _ => None,
        };
        Ok(Received {
            compl_len,
            sink_avail,
            src_avail,
            mode_change,
            bufs: msg.bufs,
            flags: msg.flags,
            mseq: msg.mseq,
            mseq_ack: msg.mseq_ack,
            mid: msg.body.mid(),
            payload: start..start + payload.len(),
            last: payload.last().copied().unwrap_or(0),
            hello_ack,
            susp_port,
            local_offer,
            local_data,
        })
    }

    /// The Accepting Peer's HelloAck parameters take effect (§8.1.1
    /// step 7): its Bufs as our send credits, IRD/ORD, minor version.
    pub(super) fn take_hello_ack(&mut self, peer: PeerParams) {
        // §6.2.2: "MSeq = set to zero and not checked on receive".
        self.credits.hello_ack_received(peer.bufs);
        let (ird, ord) = setup::adjust_ird_ord(&self.config, &peer);
        self.ird = ird;
        self.ord = ord;
        self.minor = setup::minor_version(&peer);
        self.local.both = self.config.local && peer.local;
        self.peer = Some(peer);
    }

    pub(super) fn on_message(
        &mut self,
        now: Instant,
        buf: usize,
        msg: Received,
        invalidated: Option<u32>,
    ) {
        if self.resuming {
            return self.on_resumed_hello_ack(buf, &msg);
        }
        match self.state {
            State::HelloSent => {
                let Some(peer) = msg.hello_ack else {
                    return self.violation(Violation::UnexpectedMessage(msg.mid));
                };
                self.take_hello_ack(peer);
                // §8.1.1 step 7e: Combined Mode, data may flow.
                self.state = State::Connected;
                self.repost(buf, PostKind::Fresh);
                return;
            }
            // §8.1.1 step 2: "The Connecting Peer MUST NOT send any iWARP
            // Messages until a HelloAck Message is received".
            State::HelloReceived => return self.violation(Violation::UnexpectedMessage(msg.mid)),
            State::Connected => {}
            State::Closed => return,
        }
        let has_payload = msg.payload_len() > 0;
        let credit_before = self.credits.send_credit();
        if let Err(fault) = self
            .credits
            .on_receive(msg.mseq, msg.mseq_ack, msg.bufs, has_payload)
        {
            return self.violation(Violation::Credit(fault));
        }
        if self.credits.send_credit() > credit_before {
            self.on_credit(now);
        }
        self.on_mseq_ack(msg.mseq_ack);
        // RFC 5040 §6.1: only the completions of §9.2 and §9.3 invalidate
        // our STags.
        if let Some(stag) = invalidated {
            if !matches!(msg.mid, Mid::RDMA_RD_COMPL | Mid::RDMA_WR_COMPL) {
                return self.violation(Violation::WrongStag {
                    mid: msg.mid,
                    got: stag,
                });
            }
        }
        if msg.flags.contains(Flags::OOB_PEND) {
            // §9.5.3: the OOB byte follows within 65,535 bytes.
            if self.oob_pend.len() >= usize::from(u16::MAX) {
                return self.violation(Violation::OobPendTooFar);
            }
            self.oob_pend.push_back(self.rx.total());
            self.urgent_notice = true;
        }
        match msg.mid {
            Mid::DATA => self.on_data(buf, &msg),
            Mid::LOCAL_DATA if self.pool.ring.is_some() => self.on_local_data(buf, &msg),
            Mid::LOCAL_OFFER if self.local.both => {
                self.repost(buf, PostKind::Fresh);
                if let Some(offer) = msg.local_offer {
                    self.on_local_offer(offer);
                }
            }
            Mid::SRC_AVAIL => self.on_src_avail(buf, &msg),
            Mid::SINK_AVAIL => {
                let Some(header) = msg.sink_avail else {
                    return;
                };
                if !self.on_sink_avail(header, !msg.payload.is_empty()) {
                    return;
                }
                // §9.4: "the Data Source MUST process the ULP payload
                // normally regardless of whether the SinkAvail was
                // discarded".
                self.take_payload(buf, &msg);
            }
            Mid::SEND_SM => {
                self.repost(buf, PostKind::Fresh);
                self.on_send_sm(msg.mseq_ack);
            }
            Mid::RDMA_RD_COMPL => {
                self.repost(buf, PostKind::Fresh);
                self.on_rdma_rd_compl(msg.compl_len, msg.flags, invalidated);
            }
            Mid::RDMA_WR_COMPL => {
                self.repost(buf, PostKind::Fresh);
                self.on_rdma_wr_compl(msg.compl_len, msg.flags, invalidated);
            }
            Mid::SRC_AVAIL_CANCEL => {
                self.repost(buf, PostKind::Fresh);
                self.on_src_avail_cancel(msg.mseq);
            }
            Mid::SINK_AVAIL_CANCEL => {
                self.repost(buf, PostKind::Fresh);
                self.on_sink_avail_cancel();
            }
            Mid::SINK_CANCEL_ACK => {
                self.repost(buf, PostKind::Fresh);
                self.on_sink_cancel_ack();
            }
            Mid::MODE_CHANGE => {
                self.repost(buf, PostKind::Fresh);
                if let Some(mch) = msg.mode_change {
                    self.on_mode_change(mch);
                }
            }
            Mid::CH_RCV_BUF_ACK => {
                self.repost(buf, PostKind::Fresh);
                self.on_ch_rcv_buf_ack(msg.compl_len);
            }
            Mid::DIS_CONN => {
                // A second DisConn.
                if self.peer_disconn.is_some() {
                    return self.violation(Violation::UnexpectedMessage(Mid::DIS_CONN));
                }
                // §8.2.1 (Remote Peer) step 1: complete receives and report
                // the end of the stream; our SinkAvails count as canceled.
                self.peer_disconn = Some(msg.mseq_ack);
                if let Some(ring) = &mut self.pool.ring {
                    // The peer writes no more into it.
                    ring.peer_done = true;
                }
                self.on_peer_disconn();
                self.repost(buf, PostKind::Fresh);
                self.check_graceful(now);
            }
            Mid::ABORT_CONN => {
                // §8.2.2: AbortConn "tells the Remote Peer to ignore an
                // earlier DisConn Message (if received) and to consider
                // socket teardown as abortive".
                self.reason.get_or_insert(CloseReason::PeerAbort);
                self.error.get_or_insert(Error::ConnectionReset);
                self.finish(Teardown::Abortive);
            }
            Mid::CH_RCV_BUF => {
                // §10.6.1: "If both peers concurrently send each other
                // ChRcvBuf Messages, then the Accepting Peer MUST disregard
                // the ChRcvBuf Message."
                if !(self.role == Role::Accepting && self.resize.asked.is_some()) {
                    self.control.push_back(Control::ChRcvBufAck);
                    // "The Connecting Peer MAY re-send its ChRcvBuf Message
                    // after sending the ChRcvBufAck Message": ours crossed
                    // this one and the Accepting Peer disregards it.
                    if let Some(size) = self.resize.asked {
                        self.control.push_back(Control::ChRcvBuf { size });
                    }
                }
                self.repost(buf, PostKind::Fresh);
            }
            Mid::SUSP_COMM => self.on_susp_comm(buf, msg.susp_port),
            Mid::SUSP_COMM_ACK if self.local_suspend == LocalSuspend::Sent => {
                self.on_local_susp_comm_ack(buf)
            }
            // Hello and HelloAck after setup; SuspCommAck answers something
            // we never sent (a SuspCommAck is expected only by the
            // test-only Local Peer, see [`suspend`]).
            mid => self.violation(Violation::UnexpectedMessage(mid)),
        }
        if self.state == State::Connected {
            if let Some(&at) = self.oob_pend.front() {
                if self.rx.total().saturating_sub(at) >= OOB_PEND_REACH {
                    self.violation(Violation::OobPendTooFar);
                }
            }
        }
    }

    pub(super) fn on_data(&mut self, buf: usize, msg: &Received) {
        if msg.payload.is_empty() {
            // A gratuitous credit update (§6.3.1), maybe with OOB_PEND.
            let kind = if msg.flags.is_empty() {
                PostKind::Pure
            } else {
                PostKind::Fresh
            };
            return self.repost(buf, kind);
        }
        if !self.accept_payload(Mid::DATA, msg) {
            return;
        }
        self.on_payload_received(msg.payload.len());
        if !msg.flags.contains(Flags::OOB_PRES) {
            self.rx.push(buf, msg.payload.start, msg.payload.end);
            self.offer_ring();
            self.grow_pool(msg.payload.len());
            return;
        }
        // §9.5.3: OOB_PEND "MUST be set on an SDP Message that is sent no
        // later than the SDP Message containing the Out-Of-Band data byte".
        let Some(pend_at) = self.oob_pend.pop_front() else {
            return self.violation(Violation::OobPresWithoutPend);
        };
        let offset = self.rx.total() + (msg.payload.len() as u64 - 1);
        // §9.5.3: "no more than 65,535 (2^16-1) bytes of data are sent
        // between the flag and its associated Out-Of-Band data byte".
        if (offset + 1).saturating_sub(pend_at) > OOB_PEND_REACH {
            return self.violation(Violation::OobPendTooFar);
        }
        self.rx.push(buf, msg.payload.start, msg.payload.end);
        let mut freed = core::mem::take(&mut self.freed);
        self.rx
            .set_mark(offset, msg.last, self.config.oob_inline, &mut freed);
        for b in freed.drain(..) {
            self.repost(b, PostKind::Fresh);
        }
        self.freed = freed;
    }

    /// A LocalData (the same-host extension): its payload is in the next
    /// slot of our ring; its buffer stays held until the bytes are read,
    /// which keeps the peer from writing that slot again before.
    fn on_local_data(&mut self, buf: usize, msg: &Received) {
        let (Some(ldh), Some(ring)) = (msg.local_data, &self.pool.ring) else {
            return;
        };
        let next = ring.received % u32::from(ring.slots);
        if ldh.slot != next || ldh.len == 0 || ldh.len > ring.slot_size {
            return self.violation(Violation::LocalData {
                slot: ldh.slot,
                len: ldh.len,
            });
        }
        if !self.accept_payload(Mid::DATA, msg) {
            return;
        }
        if let Some(ring) = &mut self.pool.ring {
            ring.received = ring.received.wrapping_add(1);
            ring.bytes_received += u64::from(ldh.len);
        }
        self.on_payload_received(ldh.len as usize);
        self.rx.push_local(buf, ldh.slot, ldh.len as usize);
    }

    /// Doubles the receive pool, up to `Config::max_bufs`, when the peer
    /// has run out of credit for payload while our application keeps up
    /// (it emptied a pool's worth of buffers since the pool last grew, and
    /// at most half of them hold unread bytes now), and its messages fill
    /// at least half a buffer (`len`, this one's payload): more buffers let
    /// more be in flight, as TCP's receive buffer grows with the rate the
    /// reader takes (Linux `tcp_rcv_space_adjust`). A slow reader does not
    /// grow it. The new buffers are posted and credited as freed ones are
    /// (§10.2: Bufs counts every buffer posted). Not once a ring is
    /// offered: its slots cover the buffers there were (§9 of DESIGN, the
    /// credit that frees a slot). Smaller messages take a buffer each for
    /// few bytes: more buffers would add messages in flight, hardly bytes.
    fn grow_pool(&mut self, len: usize) {
        let n = self.pool.len();
        let max = usize::from(self.config.max_bufs);
        if n >= max
            || len.saturating_mul(2) < self.pool.buf_size()
            || self.pool.ring.is_some()
            || self.credits.remote_credit() >= PAYLOAD_MIN_CREDIT
            || self.emptied < n
            || self.rx.held_buffers() > n / 2
        {
            return;
        }
        let grown = n.saturating_mul(2).min(max);
        self.pool.grow_to(grown);
        for b in n..grown {
            self.repost(b, PostKind::Fresh);
        }
        self.emptied = 0;
    }

    /// Offers our ring to the peer once this receive half has moved
    /// enough to be worth one ([`local::OFFER_AFTER`]). Every Private
    /// Buffer the draft allows holds the LocalOffer: the LOH is no larger
    /// than SinkAH (§10 constraint 4).
    fn offer_ring(&mut self) {
        if self.rx.total() >= local::OFFER_AFTER {
            self.offer_ring_now();
        }
    }

    /// Offers our ring now if both ends speak the extension and it was not
    /// offered yet. Before a Zcopy advertisement of ours, too: the ring's
    /// token is what tells the peer that the advertised memory is in this
    /// process ([`Conn::local_tos`]).
    pub(super) fn offer_ring_now(&mut self) {
        if !self.local.both || self.local.forked || self.pool.ring.is_some() {
            return;
        }
        let slots = u16::try_from(self.pool.len()).ok();
        let slot_size = u32::try_from(self.pool.buf_size())
            .ok()
            // Whole KiB below 64 MiB: what the LOH can say.
            .map(|s| {
                (s.max(local::SLOT_MIN).div_ceil(1024) * 1024).min(u32::from(u16::MAX) * 1024)
            });
        let (Some(slots), Some(slot_size)) = (slots, slot_size) else {
            return;
        };
        if let Some(ring) = local::Ring::open(slots, slot_size) {
            self.pool.ring = Some(Box::new(ring));
            self.control.push_back(Control::LocalOffer);
        }
    }

    /// The peer's ring offer: checked by the link before the first write.
    fn on_local_offer(&mut self, offer: wire::LocalOfferRepr) {
        self.local.send = if offer.slots == 0 || u64::from(offer.slot_size) < local::LOCAL_MIN {
            local::SendPath::Wire(local::LocalOff::BadOffer)
        } else {
            local::SendPath::Check(Box::new(offer))
        };
    }

    /// §9.2, §11.2, §11.3: a SrcAvail; in Combined Mode it carries the
    /// first bytes of the buffer as stream data.
    pub(super) fn on_src_avail(&mut self, buf: usize, msg: &Received) {
        let Some(header) = msg.src_avail else {
            return;
        };
        if !msg.payload.is_empty() && !self.accept_payload(Mid::SRC_AVAIL, msg) {
            return;
        }
        if !self.on_src_avail_z(header, msg.payload.len()) {
            return;
        }
        if msg.payload.is_empty() {
            self.repost(buf, PostKind::Fresh);
        } else {
            self.on_payload_received(msg.payload.len());
            self.rx.push(buf, msg.payload.start, msg.payload.end);
        }
    }

    /// The ULP payload of a SinkAvail (§9.4), or its buffer back.
    pub(super) fn take_payload(&mut self, buf: usize, msg: &Received) {
        if msg.payload.is_empty() {
            return self.repost(buf, PostKind::Fresh);
        }
        if !self.accept_payload(Mid::SINK_AVAIL, msg) {
            return;
        }
        self.on_payload_received(msg.payload.len());
        self.rx.push(buf, msg.payload.start, msg.payload.end);
    }

    /// Whether ULP payload may arrive now; closes the connection if not.
    pub(super) fn accept_payload(&mut self, mid: Mid, msg: &Received) -> bool {
        if self.peer_disconn.is_some() {
            self.violation(Violation::DataAfterDisConn);
            return false;
        }
        // §11.2: after a SrcAvail the Data Source "MUST NOT send any SDP
        // Messages containing a ULP payload until ... a RdmaRdCompl or
        // SendSm Message is received"; §11.3 likewise.
        if let Err(v) = self.zcopy_payload_ok(mid, msg.mseq_ack, msg.payload_len()) {
            self.violation(v);
            return false;
        }
        if self.reading == Reading::Released {
            // Nobody will read it: Linux TCP answers data after close()
            // with a reset.
            self.abort_with(CloseReason::LocalAbort, None);
            return false;
        }
        true
    }

    pub(super) fn repost(&mut self, buf: usize, kind: PostKind) {
        // After a SuspCommAck, buffers freed stay unposted: the new LLP
        // connection posts its own (see [`Conn::resume`]).
        if self.state != State::Closed && !self.suspend.ack_sent() {
            self.to_post.push_back((buf, kind));
            if kind == PostKind::Fresh {
                self.emptied = self.emptied.saturating_add(1);
            }
        }
    }

    /// Copies received bytes into `buf` and gives emptied receive buffers
    /// back to the peer (re-posted, credited on the next message). Never
    /// blocks: EAGAIN when nothing is there; 0 at the end of the stream
    /// (the peer's DisConn, SHUT_RD, or after the connection closed and a
    /// pending error was reported).
    ///
    /// Linux TCP semantics: a read stops at the urgent mark; the urgent
    /// byte is skipped unless SO_OOBINLINE. [`RecvFlags::PEEK`] copies
    /// without consuming. [`RecvFlags::OOB`] reads the urgent byte: EINVAL
    /// with SO_OOBINLINE or when there is none, EAGAIN while it is
    /// announced (OOB_PEND) but not here. [`RecvFlags::WAITALL`] returns
    /// what is there like a plain read — the blocking caller repeats until
    /// its buffer is full, the stream ends or an error comes — except
    /// with PEEK, where it reports EAGAIN until `buf.len()` bytes are there
    /// (or no more can come because every receive buffer holds data).
    pub fn recv(&mut self, buf: &mut [u8], flags: RecvFlags) -> Result<usize, Error> {
        let peek = flags.contains(RecvFlags::PEEK);
        if flags.contains(RecvFlags::OOB) {
            return self.recv_oob(buf, peek);
        }
        if matches!(self.state, State::HelloSent | State::HelloReceived) {
            return Err(Error::WouldBlock);
        }
        if buf.is_empty() {
            return Ok(0);
        }
        let inline = self.config.oob_inline;
        if peek && flags.contains(RecvFlags::WAITALL) && !self.at_eof() {
            let full = self.rx.held_buffers() + 2 >= self.pool.len();
            if self.rx.readable(inline) < buf.len() as u64 && !full {
                return Err(Error::WouldBlock);
            }
        }
        let mut freed = core::mem::take(&mut self.freed);
        let n = self.rx.read(&self.pool, buf, peek, inline, &mut freed);
        for b in freed.drain(..) {
            self.repost(b, PostKind::Fresh);
        }
        self.freed = freed;
        if n > 0 {
            self.sink_progress();
            return Ok(n);
        }
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        if self.at_eof() {
            return Ok(0);
        }
        if self.state == State::Connected && self.rx.queued() == 0 {
            // The peer may wait for what we hold before it answers.
            self.hold.push();
            self.recv_would_block();
        }
        Err(Error::WouldBlock)
    }

    /// Whether the reads since the last drive left the link work: emptied
    /// buffers to re-post and credit, a control message owed (a SendSm,
    /// §9.2 step 2a), RDMA Reads to issue, a Zcopy advertisement under
    /// way. A read that only copied out of a buffer still partly unread
    /// leaves none, and its caller need not drive the link (DESIGN §7: a
    /// call does the work its bytes need).
    pub fn owes_after_read(&self) -> bool {
        !self.to_post.is_empty()
            || self.control_pending()
            || !self.rdma_out.is_empty()
            || !self.sink_quiet()
    }

    /// Whether a reader that waits now would get the next message's
    /// payload first: connected, nothing received unread, no urgent mark,
    /// more may come. A link may then place that payload straight into the
    /// reader's buffer (DESIGN §7) and report it with
    /// [`Conn::consume_placed`].
    pub fn rx_waiting(&self) -> bool {
        self.state == State::Connected
            && self.rx.queued() == 0
            && self.rx.mark.is_none()
            && !self.at_eof()
    }

    /// The first `n` unread bytes were placed in the reader's buffer by the
    /// transport: they are the first bytes of the message just received,
    /// with `payload` bytes, the stream having been empty before it
    /// ([`Conn::rx_waiting`]). They count as read — buffers emptied are
    /// re-posted and credited as by [`Conn::recv`]. False (nothing
    /// consumed) unless exactly that message's bytes are unread and no mark
    /// is set.
    pub fn consume_placed(&mut self, n: usize, payload: usize) -> bool {
        if n > payload || self.rx.queued() != payload as u64 || self.rx.mark.is_some() {
            return false;
        }
        let mut freed = core::mem::take(&mut self.freed);
        self.rx.consume(n, &mut freed);
        for b in freed.drain(..) {
            self.repost(b, PostKind::Fresh);
        }
        self.freed = freed;
        true
    }

    /// No more bytes will arrive.
    pub(super) fn at_eof(&self) -> bool {
        self.peer_disconn.is_some() || self.reading != Reading::Open || self.state == State::Closed
    }

    /// `recv(MSG_OOB)` as Linux `tcp_recv_urg`.
    pub(super) fn recv_oob(&mut self, buf: &mut [u8], peek: bool) -> Result<usize, Error> {
        if self.config.oob_inline {
            return Err(Error::InvalidInput);
        }
        match self.rx.mark.as_mut() {
            Some(mark) if !mark.read => {
                if !peek {
                    mark.read = true;
                }
                match buf.first_mut() {
                    Some(b) => {
                        *b = mark.byte;
                        Ok(1)
                    }
                    None => Ok(0),
                }
            }
            _ if !self.oob_pend.is_empty() => {
                if self.at_eof() {
                    Ok(0)
                } else {
                    Err(Error::WouldBlock)
                }
            }
            _ => Err(Error::InvalidInput),
        }
    }

    /// SIOCATMARK: the next byte to read is the urgent byte.
    pub fn at_mark(&self) -> bool {
        self.rx.at_mark()
    }

    /// An urgent byte waits to be read (POLLPRI).
    pub fn urgent_ready(&self) -> bool {
        self.rx.mark.is_some_and(|m| !m.read)
    }

    /// Whether an OOB_PEND arrived since the last call (for SIGURG).
    pub fn take_urgent_notice(&mut self) -> bool {
        core::mem::take(&mut self.urgent_notice)
    }

    /// SO_OOBINLINE.
    pub fn set_oob_inline(&mut self, inline: bool) {
        self.config.oob_inline = inline;
    }

    /// Readable (POLLIN): data (a SrcAvail waiting for a reader too), end
    /// of stream, or a pending error.
    pub fn readable(&self) -> bool {
        match self.state {
            State::HelloSent | State::HelloReceived => false,
            _ => {
                self.rx.readable(self.config.oob_inline) > 0
                    || self.completion_ready()
                    || self.error.is_some()
                    || self.at_eof()
                    || self.src_avail_unanswered()
            }
        }
    }

    /// Bytes readable now (FIONREAD).
    pub fn bytes_readable(&self) -> u64 {
        self.rx.readable(self.config.oob_inline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool with `chunks` pushed into buffers 0, 1, ... at offset 16.
    fn stream(chunks: &[&[u8]]) -> (BufferPool, RxStream) {
        let mut pool = BufferPool::new(chunks.len().max(1), 64);
        let mut rx = RxStream::default();
        for (i, c) in chunks.iter().enumerate() {
            pool.buffer_mut(i).unwrap()[16..16 + c.len()].copy_from_slice(c);
            rx.push(i, 16, 16 + c.len());
        }
        (pool, rx)
    }

    #[test]
    fn reads_across_buffers_and_frees_them_in_order() {
        let (pool, mut rx) = stream(&[b"hello ", b"world"]);
        let mut freed = vec![];
        let mut out = [0; 8];
        assert_eq!(rx.read(&pool, &mut out, true, false, &mut freed), 8);
        assert_eq!(&out, b"hello wo");
        assert!(freed.is_empty());
        assert_eq!(rx.queued(), 11);
        assert_eq!(rx.read(&pool, &mut out, false, false, &mut freed), 8);
        assert_eq!(freed, vec![0]);
        assert_eq!(rx.read(&pool, &mut out, false, false, &mut freed), 3);
        assert_eq!(&out[..3], b"rld");
        assert_eq!(freed, vec![0, 1]);
        assert_eq!(rx.queued(), 0);
    }

    #[test]
    fn urgent_byte_out_of_line() {
        // "abc" then "de!" with '!' urgent, then "fg".
        let (pool, mut rx) = stream(&[b"abc", b"de!", b"fg"]);
        let mut freed = vec![];
        rx.set_mark(5, b'!', false, &mut freed);
        assert!(!rx.at_mark());
        let mut out = [0; 16];
        // Stops before the mark.
        assert_eq!(rx.read(&pool, &mut out, false, false, &mut freed), 5);
        assert_eq!(&out[..5], b"abcde");
        assert!(rx.at_mark());
        assert_eq!(rx.readable(false), 2);
        // At the mark the urgent byte is skipped and reading goes on.
        assert_eq!(rx.read(&pool, &mut out, false, false, &mut freed), 2);
        assert_eq!(&out[..2], b"fg");
        assert!(rx.mark.is_none());
        assert_eq!(freed, vec![0, 1, 2]);
    }

    #[test]
    fn urgent_byte_inline() {
        let (pool, mut rx) = stream(&[b"ab!", b"cd"]);
        let mut freed = vec![];
        rx.set_mark(2, b'!', true, &mut freed);
        let mut out = [0; 16];
        assert_eq!(rx.read(&pool, &mut out, false, true, &mut freed), 2);
        assert!(rx.at_mark());
        assert_eq!(rx.readable(true), 3);
        assert_eq!(rx.read(&pool, &mut out, false, true, &mut freed), 3);
        assert_eq!(&out[..3], b"!cd");
        assert!(!rx.at_mark());
    }

    #[test]
    fn a_new_mark_drops_an_old_urgent_byte_waiting_at_the_read_position() {
        let (pool, mut rx) = stream(&[b"!", b"x?"]);
        let mut freed = vec![];
        rx.set_mark(0, b'!', false, &mut freed);
        rx.set_mark(2, b'?', false, &mut freed);
        assert_eq!(freed, vec![0]);
        let mut out = [0; 4];
        assert_eq!(rx.read(&pool, &mut out, false, false, &mut freed), 1);
        assert_eq!(&out[..1], b"x");
    }
}
