//! The receive Private Buffer pool and the received byte stream (draft
//! §9.1 Bcopy at the Data Sink, §10).
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

/// The receive Private Buffers of one connection: `count` buffers of
/// `buf_size` bytes in one allocation. Kept apart from the rest of the
/// connection so the adapter can lend it to the iWARP engine as the memory
/// that receives are placed into.
#[derive(Debug, Clone)]
pub struct BufferPool {
    data: Vec<u8>,
    buf_size: usize,
    count: usize,
}

impl BufferPool {
    /// Allocates `count` zeroed buffers of `buf_size` bytes.
    pub fn new(count: usize, buf_size: usize) -> BufferPool {
        BufferPool {
            data: vec![0; count.saturating_mul(buf_size)],
            buf_size,
            count,
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

    /// Size of each buffer in bytes.
    pub fn buf_size(&self) -> usize {
        self.buf_size
    }

    fn range(&self, i: usize) -> Option<core::ops::Range<usize>> {
        if i >= self.count {
            return None;
        }
        let start = i.checked_mul(self.buf_size)?;
        Some(start..start.checked_add(self.buf_size)?)
    }

    /// Buffer `i`, or `None` if there is no such buffer.
    pub fn buffer(&self, i: usize) -> Option<&[u8]> {
        let range = self.range(i)?;
        self.data.get(range)
    }

    /// Buffer `i` for writing, or `None` if there is no such buffer.
    pub fn buffer_mut(&mut self, i: usize) -> Option<&mut [u8]> {
        let range = self.range(i)?;
        self.data.get_mut(range)
    }
}

/// Received payload not yet read: bytes `start..end` of buffer `buf`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    buf: usize,
    start: usize,
    end: usize,
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
        let seg = Segment { buf, start, end };
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
            let Some(src) = pool
                .buffer(seg.buf)
                .and_then(|b| b.get(seg.start + in_seg..seg.end))
            else {
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
