//! The same-host extension (DESIGN §9): two messages in the draft's
//! experimental MID range (§6.1.1, Figure 3: 0x40–0x7f, "SHOULD NOT be
//! used for permanent assignment"), sent only to a peer whose Hello or
//! HelloAck set bit 0 of its Rsvd byte ([`LOCAL_BIT`]). A peer without the
//! extension never sets that bit (§6.2.1.8, §6.2.2.7: "transmitted as
//! zero") and so never sees either message.
//!
//! * **LocalOffer** (MID 0x40), header LOH: "you may write payload for me
//!   into my memory". The offering process, its ring of `slots` slots of
//!   `slot_size` bytes at address `ring`, and the `token` it wrote at the
//!   start of the ring: the peer reads it back with `process_vm_readv`
//!   before it writes anything, which proves the same kernel, the right
//!   process and the permission at once.
//! * **LocalData** (MID 0x41), header LDH: "the next `len` bytes of the
//!   stream are in slot `slot` of my ring". It takes a receive Private
//!   Buffer and a credit as a Data Message does (§10), and keeps the buffer
//!   until the bytes are read, which is what keeps a slot from being
//!   written again before it is read (docs/wire.md).
//!
//! Wire layouts, big-endian as the rest of §6:
//!
//! ```text
//!  LOH  bytes 0-3 Pid | 4-5 Slots | 6-7 SlotSize in KiB
//!       bytes 8-15 Ring | 16-19 Token
//!  LDH  bytes 0-3 Len | 4-7 Slot
//! ```
//!
//! The LOH is 20 bytes, no larger than the draft's largest extended
//! header (SinkAH), so every Private Buffer the draft allows holds it
//! (§10 constraint 4).
//!
//! ```
//! use sdp_core::wire::{LocalDataRepr, LocalOfferRepr};
//!
//! let offer = LocalOfferRepr { pid: 7, slot_size: 262144, slots: 16, ring: 0x7f00_0000_1000, token: 42 };
//! let mut buf = [0u8; LocalOfferRepr::HEADER_LEN];
//! offer.emit(&mut buf);
//! assert_eq!(LocalOfferRepr::parse(&buf), Ok(offer));
//!
//! let data = LocalDataRepr { len: 65520, slot: 3 };
//! let mut buf = [0u8; LocalDataRepr::HEADER_LEN];
//! data.emit(&mut buf);
//! assert_eq!(buf, [0, 0, 0xff, 0xf0, 0, 0, 0, 3]);
//! ```

use super::{read_u16, read_u32, write_u16, write_u32, Error};

/// Bit 0 of the Hello's and the HelloAck's Rsvd byte: the sender speaks
/// this extension.
pub const LOCAL_BIT: u8 = 0x01;

/// The LocalOffer Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LocalOfferRepr {
    /// The offering process, as its kernel numbers it.
    pub pid: u32,
    /// Bytes of each slot: the largest LocalData; a whole number of KiB
    /// below 64 MiB (the wire counts KiB).
    pub slot_size: u32,
    /// Slots in the ring, at least the offerer's receive Private Buffers.
    pub slots: u16,
    /// Address of slot 0 in the offering process.
    pub ring: u64,
    /// The 4 bytes in front of `ring` when the offer went.
    pub token: u32,
}

impl LocalOfferRepr {
    /// Size of the LOH in bytes.
    pub const HEADER_LEN: usize = 20;

    /// Reads an LOH; extra bytes are ignored.
    pub fn parse(buf: &[u8]) -> Result<LocalOfferRepr, Error> {
        if buf.len() < Self::HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(LocalOfferRepr {
            pid: read_u32(buf, 0),
            slots: read_u16(buf, 4),
            slot_size: u32::from(read_u16(buf, 6)) * 1024,
            ring: read_u64(buf, 8),
            token: read_u32(buf, 16),
        })
    }

    /// Writes the LOH into the first [`Self::HEADER_LEN`] bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) {
        write_u32(buf, 0, self.pid);
        write_u16(buf, 4, self.slots);
        write_u16(
            buf,
            6,
            u16::try_from(self.slot_size / 1024).unwrap_or(u16::MAX),
        );
        buf[8..16].copy_from_slice(&self.ring.to_be_bytes());
        write_u32(buf, 16, self.token);
    }
}

/// The LocalData Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LocalDataRepr {
    /// Payload bytes in the slot, from its first byte.
    pub len: u32,
    /// The slot: the count of LocalData sent before this one, modulo the
    /// ring's slots.
    pub slot: u32,
}

impl LocalDataRepr {
    /// Size of the LDH in bytes.
    pub const HEADER_LEN: usize = 8;

    /// Reads an LDH; extra bytes are ignored.
    pub fn parse(buf: &[u8]) -> Result<LocalDataRepr, Error> {
        if buf.len() < Self::HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(LocalDataRepr {
            len: read_u32(buf, 0),
            slot: read_u32(buf, 4),
        })
    }

    /// Writes the LDH into the first [`Self::HEADER_LEN`] bytes of `buf`.
    pub fn emit(&self, buf: &mut [u8]) {
        write_u32(buf, 0, self.len);
        write_u32(buf, 4, self.slot);
    }
}

fn read_u64(buf: &[u8], at: usize) -> u64 {
    (u64::from(read_u32(buf, at)) << 32) | u64::from(read_u32(buf, at + 4))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offer_round_trip_and_exact_bytes() {
        let offer = LocalOfferRepr {
            pid: 0x0102_0304,
            slot_size: 0x0004_0000,
            slots: 0x0010,
            ring: 0x1122_3344_5566_7788,
            token: 0x99aa_bbcc,
        };
        let mut buf = [0xa5u8; LocalOfferRepr::HEADER_LEN];
        offer.emit(&mut buf);
        assert_eq!(
            buf,
            [
                1, 2, 3, 4, 0, 0x10, 1, 0, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99,
                0xaa, 0xbb, 0xcc
            ]
        );
        assert_eq!(LocalOfferRepr::parse(&buf), Ok(offer));
    }

    #[test]
    fn truncated_headers_are_refused() {
        let buf = [0u8; 20];
        for n in 0..LocalOfferRepr::HEADER_LEN {
            assert_eq!(LocalOfferRepr::parse(&buf[..n]), Err(Error::Truncated));
        }
        for n in 0..LocalDataRepr::HEADER_LEN {
            assert_eq!(LocalDataRepr::parse(&buf[..n]), Err(Error::Truncated));
        }
    }
}
