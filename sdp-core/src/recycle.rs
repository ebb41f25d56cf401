//! Spare connection memory: the receive Private Buffers and the send
//! staging ring of a connection that ended are kept for the next one.
//!
//! Each connection needs about 2 MiB of buffers (16 × 64 KiB to receive
//! into, a 1 MiB ring to send from). A fresh zeroed allocation of that size
//! costs a `memset` and a page fault per page — most of an SDP connection's
//! setup time against TCP's. A recycled buffer is handed out as it was
//! left: the connection only ever reads bytes it placed there itself, so
//! nothing needs clearing.
//!
//! At most [`KEEP`] bytes are kept, in at most [`KEEP_BUFS`] buffers. The lock is only tried: a caller that
//! finds it taken (or a child of `fork` that inherited it taken) allocates
//! or frees as if there were no spares.
//!
//! ```
//! let a = sdp_core::recycle::take(4096);
//! assert_eq!(a.len(), 4096);
//! sdp_core::recycle::give(a);
//! let b = sdp_core::recycle::take(4096);
//! assert_eq!(b.len(), 4096);
//! ```

use std::sync::Mutex;

/// The most bytes kept for reuse.
pub const KEEP: usize = 32 << 20;

/// The most buffers kept: [`take`] and [`give`] go through all of them.
/// Default-sized connections reach [`KEEP`] first (two 1 MiB buffers
/// each); connections with small, varied buffers (small socket buffers,
/// or the fuzz targets' configurations) would otherwise pile up thousands
/// and make every setup and close scan them.
pub const KEEP_BUFS: usize = 64;

static SPARE: Mutex<Spares> = Mutex::new(Spares::new(KEEP));

/// A buffer of exactly `len` bytes, recycled (any contents) or zeroed.
pub fn take(len: usize) -> Vec<u8> {
    let spare = SPARE.try_lock().ok().and_then(|mut s| s.take(len));
    spare.unwrap_or_else(|| vec![0; len])
}

/// Keeps `buf` for a later [`take`] of its length, if there is room.
pub fn give(buf: Vec<u8>) {
    if let Ok(mut s) = SPARE.try_lock() {
        s.give(buf);
    }
}

/// Buffers kept, up to `keep` bytes in all.
#[derive(Debug)]
struct Spares {
    bufs: Vec<Vec<u8>>,
    keep: usize,
}

impl Spares {
    const fn new(keep: usize) -> Spares {
        Spares {
            bufs: Vec::new(),
            keep,
        }
    }

    fn take(&mut self, len: usize) -> Option<Vec<u8>> {
        let i = self.bufs.iter().position(|b| b.len() == len)?;
        Some(self.bufs.swap_remove(i))
    }

    fn give(&mut self, buf: Vec<u8>) {
        let kept: usize = self.bufs.iter().map(Vec::len).sum();
        if !buf.is_empty()
            && self.bufs.len() < KEEP_BUFS
            && kept.saturating_add(buf.len()) <= self.keep
        {
            self.bufs.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_buffer_is_taken_again_as_it_was() {
        let mut s = Spares::new(1 << 20);
        let mut a = vec![0; 4096];
        a[0] = 7;
        let at = a.as_ptr();
        s.give(a);
        assert!(s.take(4095).is_none(), "only the same length");
        let b = s.take(4096).unwrap();
        assert_eq!((b.as_ptr(), b[0]), (at, 7));
        assert!(s.take(4096).is_none());
    }

    #[test]
    fn no_more_than_keep_is_kept() {
        let mut s = Spares::new(10_000);
        s.give(vec![1; 6_000]);
        s.give(vec![2; 6_000]);
        s.give(vec![3; 4_000]);
        assert_eq!(s.take(6_000).map(|b| b[0]), Some(1));
        assert_eq!(s.take(6_000), None);
        assert_eq!(s.take(4_000).map(|b| b[0]), Some(3));
    }

    #[test]
    fn no_more_than_keep_bufs_are_kept() {
        let mut s = Spares::new(1 << 20);
        for i in 0..=KEEP_BUFS {
            s.give(vec![0; 100 + i]);
        }
        assert_eq!(s.bufs.len(), KEEP_BUFS);
        assert!(
            s.take(100 + KEEP_BUFS).is_none(),
            "the last one was dropped"
        );
        assert!(s.take(100).is_some());
        s.give(vec![0; 7]);
        assert_eq!(s.take(7).map(|b| b.len()), Some(7), "room again");
    }

    #[test]
    fn take_always_gives_the_length_asked() {
        let a = take(12_345);
        assert_eq!(a.len(), 12_345);
        give(a);
        assert_eq!(take(12_345).len(), 12_345);
    }
}
