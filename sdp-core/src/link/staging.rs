//! The send staging of one link (DESIGN §7): the bytes `send` accepted,
//! held until their Sends complete, and the SDP headers of the Sends in
//! flight — the memory the iWARP engine transmits from.
//!
//! The payload ring is addressed by send stream offset (`offset % cap`,
//! shifted so that the first write after the memory was given back lands
//! at the start), so a Data Message's payload range
//! ([`Op::Send`](crate::verbs::Op)) maps to at most two gather elements
//! without any bookkeeping. The connection
//! never lets more than [`Config::send_buffer`](crate::conn::Config) bytes
//! be accepted and unreleased, which is the ring's size: a byte is never
//! overwritten before the Send carrying it completed.
//!
//! The ring takes memory as it is written, not when the link is made: one
//! that sends little never commits the whole ring, and a connection idle
//! for a while gives it back ([`Staging::give_back`]).
//!
//! Headers go into fixed slots of [`MAX_HEADER_LEN`] bytes, taken when the
//! Send is posted and given back on its completion. The slot table only
//! grows (to the most Sends ever outstanding, bounded by the peer's
//! credits), so a slot's offset never changes while the engine refers to it.
//!
//! ```
//! use sdp_core::link::staging::{Staging, HEADER_REGION, PAYLOAD_REGION};
//!
//! let mut s = Staging::new(8);
//! s.write(6, b"abcd"); // offsets 6..10 wrap around the 8-byte ring
//! let (first, second) = s.payload_sges(6..10);
//! assert_eq!((first.region, first.offset, first.len), (PAYLOAD_REGION, 6, 2));
//! let second = second.unwrap();
//! assert_eq!((second.offset, second.len), (0, 2));
//! let slot = s.alloc_header(&[1, 2, 3]);
//! assert_eq!(s.header_sge(slot, 3).region, HEADER_REGION);
//! s.free_header(slot);
//! ```

use core::ops::Range;

use iwarp::engine::Sge;
use iwarp::mem::RegionId;

use crate::verbs::MAX_HEADER_LEN;

/// The region of the payload ring in [`super::LinkMemory`].
pub const PAYLOAD_REGION: RegionId = RegionId(u32::MAX);
/// The region of the header slots in [`super::LinkMemory`].
pub const HEADER_REGION: RegionId = RegionId(u32::MAX - 1);

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct Staging {
    /// The ring's bytes written so far: it grows to `cap` and then wraps.
    ring: Vec<u8>,
    cap: usize,
    /// Added to a stream offset (modulo the size) to give its position:
    /// set by the first write after the memory was given back so that
    /// that write lands at position 0 and the ring grows from its start
    /// again.
    shift: Option<u64>,
    headers: Vec<u8>,
    free: Vec<u32>,
}

impl Staging {
    /// A ring of `cap` bytes (at least 1).
    pub fn new(cap: usize) -> Staging {
        Staging {
            ring: Vec::new(),
            cap: cap.max(1),
            shift: Some(0),
            headers: Vec::new(),
            free: Vec::new(),
        }
    }

    /// The ring size.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// The ring position of send stream offset `offset`.
    pub fn position(&self, offset: u64) -> usize {
        let cap = self.cap as u64;
        ((offset % cap + self.shift.unwrap_or(0)) % cap) as usize
    }

    /// Ring bytes `at..end`, grown to hold them.
    fn span(&mut self, at: usize, end: usize) -> &mut [u8] {
        crate::conn::grow(&mut self.ring, end, self.cap);
        &mut self.ring[at..end]
    }

    /// Copies `data` to send stream offsets `offset..offset + data.len()`
    /// (at most the ring size).
    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let cap = self.cap as u64;
        self.shift.get_or_insert((cap - offset % cap) % cap);
        let data = &data[..data.len().min(self.cap)];
        let at = self.position(offset);
        let first = data.len().min(self.cap - at);
        self.span(at, at + first).copy_from_slice(&data[..first]);
        let rest = &data[first..];
        self.span(0, rest.len()).copy_from_slice(rest);
    }

    /// The gather elements of send stream `range` (at most the ring size):
    /// one, or two when it wraps.
    pub fn payload_sges(&self, range: Range<u64>) -> (Sge, Option<Sge>) {
        let len = (range.end.saturating_sub(range.start) as usize).min(self.cap);
        let at = self.position(range.start);
        let first = len.min(self.cap - at);
        let sge = |offset, len| Sge {
            region: PAYLOAD_REGION,
            offset,
            len,
        };
        let second = (len > first).then(|| sge(0, len - first));
        (sge(at, first), second)
    }

    /// Stores a header in a free slot; returns the slot.
    pub fn alloc_header(&mut self, header: &[u8]) -> u32 {
        let slot = self.free.pop().unwrap_or_else(|| {
            let slot = (self.headers.len() / MAX_HEADER_LEN) as u32;
            self.headers.resize(self.headers.len() + MAX_HEADER_LEN, 0);
            slot
        });
        let at = slot as usize * MAX_HEADER_LEN;
        let n = header.len().min(MAX_HEADER_LEN);
        self.headers[at..at + n].copy_from_slice(&header[..n]);
        slot
    }

    /// The gather element of the first `len` bytes of header slot `slot`.
    pub fn header_sge(&self, slot: u32, len: usize) -> Sge {
        Sge {
            region: HEADER_REGION,
            offset: slot as usize * MAX_HEADER_LEN,
            len: len.min(MAX_HEADER_LEN),
        }
    }

    /// Gives a slot back (its Send completed).
    pub fn free_header(&mut self, slot: u32) {
        self.free.push(slot);
    }

    /// Bytes the ring's and the header slots' allocations hold now.
    pub fn held(&self) -> usize {
        self.ring.capacity() + self.headers.capacity() + self.free.capacity() * 4
    }

    /// Gives back the memory of the ring and the header slots, for a
    /// connection gone idle. The caller makes sure that nothing refers to
    /// them: every byte written was released and every Send completed.
    pub fn give_back(&mut self) {
        self.ring = Vec::new();
        self.shift = None;
        if self.free.len() * MAX_HEADER_LEN == self.headers.len() {
            self.headers = Vec::new();
            self.free = Vec::new();
        }
    }

    /// The bytes of a staging region.
    pub fn region(&self, id: RegionId) -> Option<&[u8]> {
        match id {
            PAYLOAD_REGION => Some(&self.ring),
            HEADER_REGION => Some(&self.headers),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_wraps_by_stream_offset() {
        let mut s = Staging::new(10);
        s.write(0, b"0123456789");
        s.write(10, b"ab");
        assert_eq!(s.region(PAYLOAD_REGION).unwrap(), b"ab23456789");
        let (a, b) = s.payload_sges(8..12);
        assert_eq!((a.offset, a.len), (8, 2));
        assert_eq!(b.map(|b| (b.offset, b.len)), Some((0, 2)));
        let (a, b) = s.payload_sges(12..15);
        assert_eq!(((a.offset, a.len), b), ((2, 3), None));
        let (a, b) = s.payload_sges(20..30);
        assert_eq!(((a.offset, a.len), b), ((0, 10), None));
    }

    #[test]
    fn the_ring_takes_memory_as_it_is_written() {
        let mut s = Staging::new(1 << 20);
        assert_eq!(s.region(PAYLOAD_REGION).unwrap().len(), 0);
        s.write(0, b"abc");
        assert_eq!(s.region(PAYLOAD_REGION).unwrap(), b"abc");
        // A write that wraps fills the whole ring.
        s.write((1 << 20) - 1, b"xy");
        let ring = s.region(PAYLOAD_REGION).unwrap();
        assert_eq!(
            (ring.len(), ring[(1 << 20) - 1], &ring[..3]),
            (1 << 20, b'x', &b"ybc"[..])
        );
        assert_eq!(s.capacity(), 1 << 20);
    }

    #[test]
    fn header_slots_are_reused_and_never_move() {
        let mut s = Staging::new(1);
        let a = s.alloc_header(&[1; 16]);
        let b = s.alloc_header(&[2; MAX_HEADER_LEN]);
        assert_eq!((a, b), (0, 1));
        s.free_header(a);
        assert_eq!(s.alloc_header(&[3; 4]), 0);
        let h = s.region(HEADER_REGION).unwrap();
        assert_eq!(&h[..4], &[3; 4]);
        assert_eq!(&h[MAX_HEADER_LEN..2 * MAX_HEADER_LEN], &[2; MAX_HEADER_LEN]);
        assert_eq!(s.header_sge(1, 20).offset, MAX_HEADER_LEN);
    }
}
