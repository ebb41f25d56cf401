//! CRC32c as MPA uses it: RFC 5044 §4.4, which takes the polynomial and the
//! procedure from iSCSI (RFC 3720 §12.1, test vectors in Appendix B.4).
//!
//! [`Crc`] is incremental so that a receiver can checksum bytes where they
//! land (header, payload pieces, markers, pad) in stream order, and a
//! transmitter can checksum a gather list without joining it. Each piece
//! goes to the fastest kernel the CPU has for its length, chosen at run
//! time:
//!
//! * on x86-64 with SSE4.2, pieces under 256 bytes (MPA and DDP headers,
//!   pads, small payloads) by the `crc32` instruction, and longer ones by
//!   256-bit carry-less multiplication folding where the CPU has AVX2 and
//!   VPCLMULQDQ but not AVX-512 ([`x86_64`]);
//! * otherwise by the `crc-fast` crate (AVX-512 VPCLMULQDQ, else
//!   PCLMULQDQ), with pieces of [`SMALL`] octets or fewer through a
//!   slice-by-8 table, for which crc-fast's set-up costs more than their
//!   bytes.
//!
//! # Byte order on the wire
//!
//! The CRC field is the one MPA field that is *not* in network byte order.
//! iSCSI defines the digest bit-reflected, so the 32-bit value the reflected
//! algorithm computes (what the checksum functions return) goes on the wire least
//! significant byte first: the wire bytes are `crc.to_le_bytes()`. RFC 3720
//! B.4 gives 32 zero octets -> `aa 36 91 8a` (value 0x8a9136aa), and RFC 5044
//! Figure 5 ends in `52 23 99 83` for the value 0x83992352. Read as a
//! big-endian field (like ULPDU_Length), the bytes would give the
//! byte-swapped value; [`to_wire`] and [`from_wire`] are the only places that
//! convert.
//!
//! ```
//! use iwarp::wire::crc::{self, Crc};
//!
//! let mut c = Crc::new();
//! c.update(&[0u8; 16]);
//! c.update(&[0u8; 16]);
//! assert_eq!(crc::to_wire(c.finish()), [0xaa, 0x36, 0x91, 0x8a]);
//! ```

use crc_fast::{CrcAlgorithm::Crc32Iscsi, Digest};

#[cfg(target_arch = "x86_64")]
mod x86_64;

/// Length of the CRC field of an FPDU (RFC 5044 §4.1).
pub const CRC_LEN: usize = 4;

/// An incremental CRC32c computation.
///
/// Feeding the data in any split gives the same result as feeding it at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Crc(u32);

impl Crc {
    /// A computation over no data yet.
    pub const fn new() -> Crc {
        Crc(0)
    }

    /// Appends `data` to the checksummed bytes.
    #[inline]
    pub fn update(&mut self, data: &[u8]) {
        // The state is the finished value: the running register is its
        // complement (CRC32c's final XOR is all ones).
        self.0 = !advance(!self.0, data);
    }

    /// The CRC32c of everything fed so far. Does not consume the state.
    #[inline]
    pub fn finish(&self) -> u32 {
        self.0
    }
}

/// The CRC32c of `data` in one go.
#[inline]
pub fn checksum(data: &[u8]) -> u32 {
    !advance(!0, data)
}

/// Advances the running register `reg` over `data` by the fastest kernel
/// this CPU has for its length.
#[inline]
fn advance(reg: u32, data: &[u8]) -> u32 {
    #[cfg(target_arch = "x86_64")]
    if let Some(reg) = x86_64::advance(reg, data) {
        return reg;
    }
    portable(reg, data)
}

/// [`advance`] without the x86-64 kernels.
fn portable(reg: u32, data: &[u8]) -> u32 {
    if data.len() <= SMALL {
        return by_table(reg, data);
    }
    let mut d = Digest::new_with_init_state(Crc32Iscsi, u64::from(reg));
    d.update(data);
    !(d.finalize() as u32)
}

/// The longest piece the portable path checksums by table rather than by
/// crc-fast.
pub const SMALL: usize = 64;

/// CRC32c's polynomial, bit-reflected (RFC 3720 §12.1: 0x1EDC6F41).
const POLY: u32 = 0x82f6_3b78;

/// Slice-by-8 tables: `TABLE[0]` advances the register by one octet,
/// `TABLE[k]` by one octet followed by `k` zero octets.
static TABLE: [[u32; 256]; 8] = tables();

const fn tables() -> [[u32; 256]; 8] {
    let mut t = [[0u32; 256]; 8];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut bit = 0;
        while bit < 8 {
            c = if c & 1 != 0 { (c >> 1) ^ POLY } else { c >> 1 };
            bit += 1;
        }
        t[0][i] = c;
        i += 1;
    }
    let mut k = 1;
    while k < 8 {
        let mut i = 0;
        while i < 256 {
            let prev = t[k - 1][i];
            t[k][i] = (prev >> 8) ^ t[0][(prev & 0xff) as usize];
            i += 1;
        }
        k += 1;
    }
    t
}

/// Advances the running register `reg` over `data`, eight octets per step.
fn by_table(mut reg: u32, data: &[u8]) -> u32 {
    let t = &TABLE;
    let mut words = data.chunks_exact(8);
    for w in &mut words {
        let lo = u32::from_le_bytes([w[0], w[1], w[2], w[3]]) ^ reg;
        let hi = u32::from_le_bytes([w[4], w[5], w[6], w[7]]);
        reg = t[7][(lo & 0xff) as usize]
            ^ t[6][((lo >> 8) & 0xff) as usize]
            ^ t[5][((lo >> 16) & 0xff) as usize]
            ^ t[4][(lo >> 24) as usize]
            ^ t[3][(hi & 0xff) as usize]
            ^ t[2][((hi >> 8) & 0xff) as usize]
            ^ t[1][((hi >> 16) & 0xff) as usize]
            ^ t[0][(hi >> 24) as usize];
    }
    for &b in words.remainder() {
        reg = t[0][((reg ^ u32::from(b)) & 0xff) as usize] ^ (reg >> 8);
    }
    reg
}

/// The CRC field bytes for `crc`: least significant byte first (see the
/// module docs for why this is not network byte order).
#[inline]
pub fn to_wire(crc: u32) -> [u8; CRC_LEN] {
    crc.to_le_bytes()
}

/// The CRC value carried by the field bytes `wire`; inverse of [`to_wire`].
#[inline]
pub fn from_wire(wire: [u8; CRC_LEN]) -> u32 {
    u32::from_le_bytes(wire)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ascending() -> Vec<u8> {
        (0u8..32).collect()
    }

    fn descending() -> Vec<u8> {
        (0u8..32).rev().collect()
    }

    // RFC 3720 Appendix B.4, bytes as they appear on the wire.
    fn vectors() -> Vec<(Vec<u8>, [u8; 4])> {
        vec![
            (vec![0x00; 32], [0xaa, 0x36, 0x91, 0x8a]),
            (vec![0xff; 32], [0x43, 0xab, 0xa8, 0x62]),
            (ascending(), [0x4e, 0x79, 0xdd, 0x46]),
            (descending(), [0x5c, 0xdb, 0x3f, 0x11]),
        ]
    }

    #[test]
    fn rfc3720_b4_vectors() {
        for (data, wire) in vectors() {
            assert_eq!(to_wire(checksum(&data)), wire);
            assert_eq!(from_wire(wire), checksum(&data));
        }
        // The same vectors as values, to pin the byte order down explicitly.
        assert_eq!(checksum(&[0x00; 32]), 0x8a91_36aa);
        assert_eq!(checksum(&[0xff; 32]), 0x62a8_ab43);
        assert_eq!(checksum(&ascending()), 0x46dd_794e);
        assert_eq!(checksum(&descending()), 0x113f_db5c);
    }

    #[test]
    fn incremental_matches_one_shot_at_every_split() {
        for (data, wire) in vectors() {
            for split in 0..=data.len() {
                let mut c = Crc::new();
                c.update(&data[..split]);
                c.update(&[]);
                c.update(&data[split..]);
                assert_eq!(to_wire(c.finish()), wire, "split at {split}");
            }
            let mut c = Crc::new();
            for b in &data {
                c.update(core::slice::from_ref(b));
            }
            assert_eq!(to_wire(c.finish()), wire);
        }
    }

    /// Every path agrees with the `crc32c` crate at every length around
    /// the thresholds, from every starting state, split anywhere.
    #[test]
    fn every_path_agrees_with_an_independent_implementation() {
        let data: Vec<u8> = (0..5 * SMALL as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        for len in 0..data.len() {
            let d = &data[..len];
            let folded = crc32c::crc32c(d);
            assert_eq!(checksum(d), folded, "length {len}");
            assert_eq!(!by_table(!0, d), folded, "length {len}, table only");
            assert_eq!(!portable(!0, d), folded, "length {len}, portable");
            for split in [0, 1, 7, 8, 9, len / 2, len.saturating_sub(1), len] {
                let split = split.min(len);
                let mut c = Crc::new();
                c.update(&d[..split]);
                c.update(&d[split..]);
                assert_eq!(c.finish(), folded, "length {len}, split at {split}");
            }
        }
    }

    #[test]
    fn empty() {
        assert_eq!(Crc::new().finish(), 0);
        assert_eq!(Crc::default(), Crc::new());
    }
}
