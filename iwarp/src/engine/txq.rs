//! The transmit queue: bytes ready for the LLP, as a gather list.
//!
//! Octets the engine makes (MPA frames, markers, ULPDU_Length, DDP and
//! RDMAP headers, pad, CRC, inline payload) are appended to one
//! engine-owned buffer; payload that lives in registered memory is only
//! *referenced* ([`TxChunk::Region`]), so a driver hands it to `writev`
//! without a copy (DESIGN §3.2). Zero-length marks ride along in the chunk
//! list and are reported back once every byte before them has been
//! written: that is how a Send or RDMA Write learns that it was handed to
//! the LLP (RFC 5040 §5.5 rule 14, RFC 5041 §5.4).
//!
//! In steady state nothing allocates: the byte buffer and the chunk deque
//! keep their capacity, and the buffer is compacted as it drains.

use std::collections::VecDeque;
use std::io::IoSlice;

use crate::mem::{Memory, RegionId};

use super::rebase::Rebase;

/// What a mark stands for, reported by [`TxQueue::advance`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Mark {
    /// The last byte of the message of send-queue entry `seq` is written.
    Message(u64),
    /// The last byte of an RDMA Read Response is written.
    ReadResponse,
    /// The Terminate message is written.
    Terminate,
}

/// One entry of the gather list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TxChunk {
    /// The next `len` octets of the engine's own buffer.
    Bytes(usize),
    /// `len` octets of a region of [`Memory`], from `offset`.
    Region {
        /// The region.
        region: RegionId,
        /// Offset of the first octet.
        offset: usize,
        /// Number of octets.
        len: usize,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Entry {
    Chunk(TxChunk),
    Mark(Mark),
}

/// A memory region referenced by the queue is missing or too short: the
/// application changed memory it had handed to the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MissingRegion(pub RegionId);

impl core::fmt::Display for MissingRegion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "region {} is missing or shorter than queued", self.0 .0)
    }
}

impl std::error::Error for MissingRegion {}

/// Octets queued for the LLP.
#[derive(Debug, Clone, Default)]
pub struct TxQueue {
    bytes: Vec<u8>,
    /// Octets of `bytes` already written.
    head: usize,
    entries: VecDeque<Entry>,
    /// Octets of the front chunk already written.
    front_done: usize,
    /// Unwritten octets in total.
    len: usize,
    done_marks: VecDeque<Mark>,
}

impl TxQueue {
    /// An empty queue.
    pub fn new() -> TxQueue {
        TxQueue::default()
    }

    /// Unwritten octets.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is waiting to be written.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends engine-made octets.
    pub(crate) fn push_bytes(&mut self, data: &[u8]) {
        if data.is_empty() {
            return;
        }
        self.bytes.extend_from_slice(data);
        self.extend_bytes_chunk(data.len());
    }

    /// Appends `n` zero octets.
    #[cfg(test)]
    pub(crate) fn push_zeros(&mut self, n: usize) {
        if n == 0 {
            return;
        }
        self.bytes.resize(self.bytes.len() + n, 0);
        self.extend_bytes_chunk(n);
    }

    fn extend_bytes_chunk(&mut self, n: usize) {
        self.len += n;
        if let Some(Entry::Chunk(TxChunk::Bytes(last))) = self.entries.back_mut() {
            *last += n;
        } else {
            self.entries.push_back(Entry::Chunk(TxChunk::Bytes(n)));
        }
    }

    /// Appends a reference to memory.
    pub(crate) fn push_region(&mut self, region: RegionId, offset: usize, len: usize) {
        if len == 0 {
            return;
        }
        self.len += len;
        if let Some(Entry::Chunk(TxChunk::Region {
            region: r,
            offset: o,
            len: l,
        })) = self.entries.back_mut()
        {
            if *r == region && o.checked_add(*l) == Some(offset) {
                *l += len;
                return;
            }
        }
        self.entries.push_back(Entry::Chunk(TxChunk::Region {
            region,
            offset,
            len,
        }));
    }

    /// Appends a mark, reported once everything before it is written.
    pub(crate) fn push_mark(&mut self, mark: Mark) {
        if self.len == 0 {
            // Nothing before it is unwritten.
            self.done_marks.push_back(mark);
        } else {
            self.entries.push_back(Entry::Mark(mark));
        }
    }

    /// The unwritten chunks in order, the first one shortened by what was
    /// already written of it. `Bytes` chunks refer to [`TxQueue::bytes`]
    /// consecutively.
    pub fn chunks(&self) -> impl Iterator<Item = TxChunk> + '_ {
        let mut first = true;
        let front_done = self.front_done;
        self.entries.iter().filter_map(move |e| match e {
            Entry::Mark(_) => None,
            Entry::Chunk(c) => {
                let skip = if first { front_done } else { 0 };
                first = false;
                Some(match *c {
                    TxChunk::Bytes(n) => TxChunk::Bytes(n - skip),
                    TxChunk::Region {
                        region,
                        offset,
                        len,
                    } => TxChunk::Region {
                        region,
                        offset: offset + skip,
                        len: len - skip,
                    },
                })
            }
        })
    }

    /// The unwritten engine-made octets, in order (what the `Bytes` chunks
    /// of [`TxQueue::chunks`] take from, one after the other).
    pub fn bytes(&self) -> &[u8] {
        &self.bytes[self.head..]
    }

    /// Hands every unwritten octet to `f` as slices in wire order, resolving
    /// region chunks through `mem`, until `f` returns false.
    pub fn for_each_slice<'a>(
        &'a self,
        mem: &'a dyn Memory,
        mut f: impl FnMut(&'a [u8]) -> bool,
    ) -> Result<(), MissingRegion> {
        let mut at = self.head;
        for chunk in self.chunks() {
            let slice: &'a [u8] = match chunk {
                TxChunk::Bytes(n) => {
                    let s = &self.bytes[at..at + n];
                    at += n;
                    s
                }
                TxChunk::Region {
                    region,
                    offset,
                    len,
                } => mem
                    .region(region)
                    .and_then(|r| r.get(offset..offset.checked_add(len)?))
                    .ok_or(MissingRegion(region))?,
            };
            if !f(slice) {
                break;
            }
        }
        Ok(())
    }

    /// Fills `out` with the first unwritten slices for `writev`; returns how
    /// many it filled.
    pub fn fill_iovec<'a>(
        &'a self,
        mem: &'a dyn Memory,
        out: &mut [IoSlice<'a>],
    ) -> Result<usize, MissingRegion> {
        let mut n = 0;
        if out.is_empty() {
            return Ok(0);
        }
        self.for_each_slice(mem, |s| {
            out[n] = IoSlice::new(s);
            n += 1;
            n < out.len()
        })?;
        Ok(n)
    }

    /// Records that the LLP took the next `n` octets (at most [`TxQueue::len`]).
    pub(crate) fn advance(&mut self, mut n: usize) {
        n = n.min(self.len);
        self.len -= n;
        while let Some(front) = self.entries.front_mut() {
            match front {
                Entry::Mark(mark) => {
                    self.done_marks.push_back(*mark);
                    self.entries.pop_front();
                }
                Entry::Chunk(chunk) => {
                    let total = match *chunk {
                        TxChunk::Bytes(len) | TxChunk::Region { len, .. } => len,
                    };
                    let left = total - self.front_done;
                    if n < left {
                        if let TxChunk::Bytes(_) = chunk {
                            self.head += n;
                        }
                        self.front_done += n;
                        break;
                    }
                    if let TxChunk::Bytes(_) = chunk {
                        self.head += left;
                    }
                    n -= left;
                    self.front_done = 0;
                    self.entries.pop_front();
                }
            }
        }
        self.compact();
    }

    fn compact(&mut self) {
        if self.head == self.bytes.len() {
            self.bytes.clear();
            self.head = 0;
        } else if self.head > 64 * 1024 && self.head * 2 > self.bytes.len() {
            // What is left is a few headers: cheap to move.
            self.bytes.drain(..self.head);
            self.head = 0;
        }
    }

    /// The next mark whose octets are all written.
    pub(crate) fn pop_done_mark(&mut self) -> Option<Mark> {
        self.done_marks.pop_front()
    }

    /// The lowest offset of `region` that unwritten chunks refer to.
    pub fn region_low_water(&self, region: RegionId) -> Option<usize> {
        self.chunks()
            .filter_map(|c| match c {
                TxChunk::Region {
                    region: r, offset, ..
                } if r == region => Some(offset),
                _ => None,
            })
            .min()
    }

    /// Points every unwritten chunk of `rb.from` at `rb.to` (see
    /// [`super::rebase`]); the octets must be equal there.
    pub(crate) fn rebase_region(&mut self, rb: &Rebase<'_>) {
        let refers = |e: &Entry| matches!(e, Entry::Chunk(TxChunk::Region { region, .. }) if *region == rb.from);
        if !self.entries.iter().any(refers) {
            return;
        }
        // The partly written front chunk starts where writing stopped.
        if let Some(Entry::Chunk(TxChunk::Region {
            region,
            offset,
            len,
        })) = self.entries.front_mut()
        {
            if *region == rb.from {
                *offset += self.front_done;
                *len -= self.front_done;
                self.front_done = 0;
            }
        }
        let old = core::mem::take(&mut self.entries);
        self.entries.reserve(old.len() + 2);
        for e in old {
            match e {
                Entry::Chunk(TxChunk::Region {
                    region,
                    offset,
                    len,
                }) if region == rb.from => rb.split(offset, len, |offset, len| {
                    self.entries.push_back(Entry::Chunk(TxChunk::Region {
                        region: rb.to,
                        offset,
                        len,
                    }))
                }),
                e => self.entries.push_back(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mem::VecMemory;

    fn collect(q: &TxQueue, mem: &VecMemory) -> Vec<u8> {
        let mut v = Vec::new();
        q.for_each_slice(mem, |s| {
            v.extend_from_slice(s);
            true
        })
        .unwrap();
        v
    }

    #[test]
    fn gather_and_advance() {
        let mut mem = VecMemory::new();
        let r = mem.add((0u8..100).collect());
        let mut q = TxQueue::new();
        q.push_bytes(b"ab");
        q.push_bytes(b"c");
        q.push_region(r, 10, 5);
        q.push_region(r, 15, 2);
        q.push_mark(Mark::Message(1));
        q.push_zeros(2);
        q.push_mark(Mark::Message(2));
        assert_eq!(q.len(), 12);
        assert_eq!(q.chunks().count(), 3);
        assert_eq!(
            collect(&q, &mem),
            [b'a', b'b', b'c', 10, 11, 12, 13, 14, 15, 16, 0, 0]
        );
        q.advance(4);
        assert_eq!(collect(&q, &mem), [11, 12, 13, 14, 15, 16, 0, 0]);
        assert_eq!(q.pop_done_mark(), None);
        q.advance(6);
        assert_eq!(q.pop_done_mark(), Some(Mark::Message(1)));
        assert_eq!(q.pop_done_mark(), None);
        assert_eq!(collect(&q, &mem), [0, 0]);
        q.advance(2);
        assert_eq!(q.pop_done_mark(), Some(Mark::Message(2)));
        assert!(q.is_empty());
        q.push_mark(Mark::Terminate);
        assert_eq!(q.pop_done_mark(), Some(Mark::Terminate));
    }

    #[test]
    fn missing_region() {
        let mem = VecMemory::new();
        let mut q = TxQueue::new();
        q.push_region(RegionId(3), 0, 1);
        assert_eq!(
            q.for_each_slice(&mem, |_| true),
            Err(MissingRegion(RegionId(3)))
        );
    }

    #[test]
    fn rebase_keeps_the_octets_and_the_marks() {
        let mut mem = VecMemory::new();
        let lent = mem.add((10u8..20).collect());
        let ring = mem.add(vec![0; 8]);
        let mut q = TxQueue::new();
        q.push_bytes(b"h");
        q.push_region(lent, 0, 10);
        q.push_mark(Mark::Message(1));
        q.push_bytes(b"t");
        q.advance(4); // "h" and 10, 11, 12 are written
        assert_eq!(q.region_low_water(lent), Some(3));
        // Offsets 3..10 of `lent` go to the ring from position 5, wrapping.
        let map = |off: usize| {
            let p = (off + 2) % 8;
            (p, 8 - p)
        };
        let bytes = mem.get(lent).unwrap().to_vec();
        for (off, &b) in bytes.iter().enumerate().skip(3) {
            mem.region_mut(ring).unwrap()[map(off).0] = b;
        }
        q.rebase_region(&Rebase {
            from: lent,
            to: ring,
            map: &map,
        });
        mem.remove(lent);
        assert_eq!(q.region_low_water(lent), None);
        assert_eq!(collect(&q, &mem), [13, 14, 15, 16, 17, 18, 19, b't']);
        q.advance(7);
        assert_eq!(q.pop_done_mark(), Some(Mark::Message(1)));
    }

    #[test]
    fn iovec() {
        let mut mem = VecMemory::new();
        let r = mem.add(vec![7; 4]);
        let mut q = TxQueue::new();
        q.push_bytes(b"x");
        q.push_region(r, 0, 4);
        q.push_bytes(b"y");
        let mut iov = [IoSlice::new(&[]); 2];
        assert_eq!(q.fill_iovec(&mem, &mut iov).unwrap(), 2);
        assert_eq!(&*iov[1], &[7, 7, 7, 7]);
    }
}
