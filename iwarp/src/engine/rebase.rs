//! Moving queued payload references from one region to another: a caller
//! lends memory for the length of one call, lets the driver write what the
//! socket takes straight from it, then copies the rest elsewhere and
//! points the engine there ([`super::DataPath::rebase_region`]). The engine never
//! owns memory (DESIGN §3.2), so this is pure bookkeeping: the gather
//! entries of the transmit queue and the payloads of work not yet framed
//! change region and offset; the CRCs already computed stay valid because
//! the bytes are equal.
//!
//! ```
//! use iwarp::engine::{DataPath, Params, Payload, Rebase, SendKind, SendWr};
//! use iwarp::mem::{Pd, VecMemory};
//!
//! let mut dp = DataPath::new(Pd(1), 1);
//! dp.enable(Params::default());
//! let mut mem = VecMemory::new();
//! let lent = mem.add(b"hello".to_vec());
//! let kept = mem.add(vec![0; 8]);
//! dp.post_send(SendWr {
//!     wr_id: 1,
//!     kind: SendKind::Send,
//!     payload: Payload::region(lent, 0, 5),
//!     signaled: true,
//! })
//! .unwrap();
//! dp.poll_transmit(&mem, 1 << 20);
//! assert_eq!(dp.region_low_water(lent), Some(0));
//! // Copy the bytes to `kept` at offset 3 (a ring would wrap here), move
//! // the references, and the lent memory may go.
//! let bytes = mem.remove(lent).unwrap();
//! mem.region_mut(kept).unwrap()[3..8].copy_from_slice(&bytes);
//! dp.rebase_region(&Rebase { from: lent, to: kept, map: &|off| (3 + off, 5 - off) });
//! assert_eq!(dp.region_low_water(lent), None);
//! let mut wire = Vec::new();
//! dp.txq().for_each_slice(&mem, |s| { wire.extend_from_slice(s); true }).unwrap();
//! assert!(wire.windows(5).any(|w| w == b"hello"));
//! # use iwarp::mem::Memory;
//! ```

use crate::mem::RegionId;

use super::wr::{Payload, Sge};

/// Where the bytes of region `from` went: `map(offset)` returns the offset
/// of that byte in region `to` and how many bytes from it on are
/// contiguous there (at least 1; a ring that wraps splits a range in two).
pub struct Rebase<'a> {
    /// The region the references leave.
    pub from: RegionId,
    /// The region they point to afterwards.
    pub to: RegionId,
    /// Offset in `from` to (offset in `to`, contiguous bytes from there).
    pub map: &'a dyn Fn(usize) -> (usize, usize),
}

impl Rebase<'_> {
    /// Calls `f(offset, len)` for the pieces in `to` of `len` bytes of
    /// `from` at `offset`, in order.
    pub(crate) fn split(&self, mut offset: usize, mut len: usize, mut f: impl FnMut(usize, usize)) {
        while len > 0 {
            let (to, run) = (self.map)(offset);
            let n = run.clamp(1, len);
            f(to, n);
            offset = offset.saturating_add(n);
            len -= n;
        }
    }

    /// A gather list with every element of `from` replaced by its pieces;
    /// `cursor` (element index, bytes of it used) is moved along.
    pub(crate) fn sges(&self, sges: &[Sge], cursor: &mut (usize, usize)) -> Vec<Sge> {
        let mut out = Vec::with_capacity(sges.len() + 1);
        let mut moved = (out.len(), 0);
        let mut found = false;
        for (i, s) in sges.iter().enumerate() {
            let first = out.len();
            if s.region == self.from {
                self.split(s.offset, s.len, |offset, len| {
                    out.push(Sge {
                        region: self.to,
                        offset,
                        len,
                    })
                });
            } else {
                out.push(*s);
            }
            if i == cursor.0 {
                // The piece holding the cursor's byte.
                let (mut j, mut off) = (first, cursor.1);
                while j + 1 < out.len() && out.get(j).is_some_and(|p| off >= p.len) {
                    off -= out.get(j).map_or(0, |p| p.len);
                    j += 1;
                }
                moved = (j, off);
                found = true;
            }
        }
        *cursor = if found { moved } else { (out.len(), 0) };
        out
    }
}

/// The lowest offset of `region` among `sges` from `cursor` on.
pub(crate) fn sges_low_water(
    sges: &[Sge],
    cursor: (usize, usize),
    region: RegionId,
) -> Option<usize> {
    sges.iter()
        .enumerate()
        .skip(cursor.0)
        .filter(|(_, s)| s.region == region)
        .filter_map(|(i, s)| {
            let used = if i == cursor.0 { cursor.1 } else { 0 };
            (s.len > used).then(|| s.offset.saturating_add(used))
        })
        .min()
}

/// [`sges_low_water`] of a payload not started.
pub(crate) fn payload_low_water(p: &Payload, region: RegionId) -> Option<usize> {
    match p {
        Payload::Sges(s) => sges_low_water(s, (0, 0), region),
        Payload::Inline(_) => None,
    }
}

/// Rebases a payload not started.
pub(crate) fn rebase_payload(p: &mut Payload, rb: &Rebase<'_>) {
    if let Payload::Sges(s) = p {
        if s.iter().any(|s| s.region == rb.from) {
            *s = rb.sges(s, &mut (0, 0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sge(region: u32, offset: usize, len: usize) -> Sge {
        Sge {
            region: RegionId(region),
            offset,
            len,
        }
    }

    /// Region 9 moves into an 8-byte ring of region 1, byte 0 at 6.
    fn ring(off: usize) -> (usize, usize) {
        let p = (6 + off) % 8;
        (p, 8 - p)
    }

    #[test]
    fn splits_at_the_wrap_and_moves_the_cursor() {
        let rb = Rebase {
            from: RegionId(9),
            to: RegionId(1),
            map: &ring,
        };
        let sges = [sge(2, 100, 4), sge(9, 0, 5)];
        // Cursor inside the moved element, past the wrap.
        let mut cursor = (1, 3);
        let out = rb.sges(&sges, &mut cursor);
        assert_eq!(out, [sge(2, 100, 4), sge(1, 6, 2), sge(1, 0, 3)]);
        assert_eq!(cursor, (2, 1));
        // Cursor before it stays.
        let mut cursor = (0, 2);
        rb.sges(&sges, &mut cursor);
        assert_eq!(cursor, (0, 2));
        // Cursor past the end stays past the end.
        let mut cursor = (2, 0);
        rb.sges(&sges, &mut cursor);
        assert_eq!(cursor, (3, 0));
        assert_eq!(sges_low_water(&sges, (1, 3), RegionId(9)), Some(3));
        assert_eq!(sges_low_water(&sges, (2, 0), RegionId(9)), None);
    }
}
