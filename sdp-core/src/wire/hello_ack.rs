//! The HelloAck Header, HAH (draft §6.2.2, Figure 6).
//!
//! The HelloAck Message is a BSDH followed by this 12-byte header and
//! nothing else; the Accepting Peer sends it as an iWARP Send with SE
//! (§8.1.1 step 5).
//!
//! Wire layout (each row of Figure 6 read rightmost byte first, see
//! [`super`]):
//!
//! ```text
//!  byte 0     MajV (bits 7-4) | MinV (bits 3-0)
//!  byte 1     Rsvd
//!  bytes 2-3  MaxAdverts
//!  bytes 4-7  ActRcvSz
//!  bytes 8-9  LocORD
//!  bytes 10-11 LocIRD
//! ```
//!
//! ```
//! use sdp_core::wire::{HelloAckHeader, HelloAckRepr};
//!
//! let bytes = [0x11, 0, 0, 8, 0, 1, 0, 0, 0, 2, 0, 4];
//! let hah = HelloAckRepr::parse(&HelloAckHeader::new_checked(&bytes[..]).unwrap()).unwrap();
//! assert_eq!((hah.act_rcv_sz, hah.loc_ird, hah.loc_ord), (65536, 4, 2));
//! assert_eq!(hah.validate(), Ok(()));
//! ```

use super::{read_u16, read_u32, write_u16, write_u32, Error, MAJOR_VERSION, MAX_SIZE};

mod field {
    use core::ops::Range;

    /// MajV in the high nibble, MinV in the low nibble.
    pub const VERSION: usize = 0;
    pub const RSVD: usize = 1;
    pub const MAX_ADVERTS: Range<usize> = 2..4;
    pub const ACT_RCV_SZ: Range<usize> = 4..8;
    pub const LOC_ORD: Range<usize> = 8..10;
    pub const LOC_IRD: Range<usize> = 10..12;
}

/// Size of the HAH in bytes.
pub const HEADER_LEN: usize = field::LOC_IRD.end;

/// A checked view of a HelloAck Header (the bytes after the BSDH).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloAckHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> HelloAckHeader<T> {
    /// Wraps a buffer without checking its length; accessors may panic on a
    /// short buffer. Use [`HelloAckHeader::new_checked`] on input.
    pub const fn new_unchecked(buffer: T) -> HelloAckHeader<T> {
        HelloAckHeader { buffer }
    }

    /// Wraps a buffer, checking that it holds a whole HAH.
    pub fn new_checked(buffer: T) -> Result<HelloAckHeader<T>, Error> {
        let header = Self::new_unchecked(buffer);
        header.check_len()?;
        Ok(header)
    }

    /// Checks that the buffer holds the 12 bytes of a HAH.
    pub fn check_len(&self) -> Result<(), Error> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Returns the underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The MajV field, 4 bits (§6.2.2.1).
    pub fn maj_v(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION] >> 4
    }

    /// The MinV field, 4 bits (§6.2.2.2).
    pub fn min_v(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION] & 0x0f
    }

    /// The reserved byte as received (§6.2.2.7: "MUST NOT be checked").
    pub fn rsvd(&self) -> u8 {
        self.buffer.as_ref()[field::RSVD]
    }

    /// The MaxAdverts field (§6.2.2.3).
    pub fn max_adverts(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::MAX_ADVERTS.start)
    }

    /// The ActRcvSz field (§6.2.2.4).
    pub fn act_rcv_sz(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::ACT_RCV_SZ.start)
    }

    /// The LocIRD field (§6.2.2.5).
    pub fn loc_ird(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::LOC_IRD.start)
    }

    /// The LocORD field (§6.2.2.6).
    pub fn loc_ord(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::LOC_ORD.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> HelloAckHeader<T> {
    /// Sets MajV (the low 4 bits of `value`).
    pub fn set_maj_v(&mut self, value: u8) {
        let b = &mut self.buffer.as_mut()[field::VERSION];
        *b = (*b & 0x0f) | (value << 4);
    }

    /// Sets MinV (the low 4 bits of `value`).
    pub fn set_min_v(&mut self, value: u8) {
        let b = &mut self.buffer.as_mut()[field::VERSION];
        *b = (*b & 0xf0) | (value & 0x0f);
    }

    /// Sets the reserved byte.
    pub fn set_rsvd(&mut self, value: u8) {
        self.buffer.as_mut()[field::RSVD] = value;
    }

    /// Sets MaxAdverts.
    pub fn set_max_adverts(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::MAX_ADVERTS.start, value)
    }

    /// Sets ActRcvSz.
    pub fn set_act_rcv_sz(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::ACT_RCV_SZ.start, value)
    }

    /// Sets LocIRD.
    pub fn set_loc_ird(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::LOC_IRD.start, value)
    }

    /// Sets LocORD.
    pub fn set_loc_ord(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::LOC_ORD.start, value)
    }
}

/// The fields of a HelloAck Header. The reserved byte is not kept: it is
/// sent as zero and "MUST NOT be checked on receive" (§6.2.2.7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HelloAckRepr {
    /// Major protocol version, 4 bits.
    pub maj_v: u8,
    /// Minor protocol version, 4 bits.
    pub min_v: u8,
    /// Concurrent Zcopy advertisements the sender allows (§6.2.2.3).
    pub max_adverts: u16,
    /// Initial size of the sender's receive Private Buffers (§6.2.2.4).
    pub act_rcv_sz: u32,
    /// The sender's IRD for this connection (§6.2.2.5).
    pub loc_ird: u16,
    /// The sender's ORD for this connection (§6.2.2.6).
    pub loc_ord: u16,
}

impl HelloAckRepr {
    /// Size of the HAH on the wire.
    pub const HEADER_LEN: usize = HEADER_LEN;

    /// Reads a HAH. Every value parses; [`HelloAckRepr::validate`] applies
    /// the Connecting Peer's checks.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        header: &HelloAckHeader<&T>,
    ) -> Result<HelloAckRepr, Error> {
        header.check_len()?;
        Ok(HelloAckRepr {
            maj_v: header.maj_v(),
            min_v: header.min_v(),
            max_adverts: header.max_adverts(),
            act_rcv_sz: header.act_rcv_sz(),
            loc_ird: header.loc_ird(),
            loc_ord: header.loc_ord(),
        })
    }

    /// The Connecting Peer's checks of a received HAH that need no
    /// connection state (§8.1.1 step 7a, §6.2.2), given that our HH carried
    /// [`MAJOR_VERSION`].
    ///
    /// A MinV mismatch is not an error (§6.2.2.2, §8.1.1 step 7b).
    pub fn validate(&self) -> Result<(), Error> {
        // §6.2.2.1: "The Connecting Peer MUST terminate the connection if
        // MajV in the HAH does not match the value that the Connecting Peer
        // supplied in the HH."
        if self.maj_v != MAJOR_VERSION {
            return Err(Error::UnsupportedMajorVersion);
        }
        // §6.2.2.3: "The Connecting Peer MUST terminate the connection
        // attempt if MaxAdverts of the HAH is set to zero."
        if self.max_adverts == 0 {
            return Err(Error::ZeroMaxAdverts);
        }
        // §8.1.1 step 7a: terminate when "The LocORD or LocIRD field in the
        // HelloAck Message is equal to zero."
        if self.loc_ird == 0 {
            return Err(Error::ZeroLocIrd);
        }
        if self.loc_ord == 0 {
            return Err(Error::ZeroLocOrd);
        }
        // §6.2.2.4: "(maximum = 2^31 bytes)".
        if self.act_rcv_sz > MAX_SIZE {
            return Err(Error::RcvSzTooLarge);
        }
        Ok(())
    }

    /// Bytes [`HelloAckRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the HAH into a view of at least [`HEADER_LEN`] bytes. MajV
    /// and MinV are truncated to their 4 bits.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut HelloAckHeader<T>) {
        header.set_maj_v(self.maj_v);
        header.set_min_v(self.min_v);
        // §6.2.2.7: "These bits MUST be transmitted as zeroes".
        header.set_rsvd(0);
        header.set_max_adverts(self.max_adverts);
        header.set_act_rcv_sz(self.act_rcv_sz);
        header.set_loc_ird(self.loc_ird);
        header.set_loc_ord(self.loc_ord);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // MajV 1, MinV 1, MaxAdverts 0x0102, ActRcvSz 0x00004000, LocIRD 0x0003,
    // LocORD 0x0009 (sent LocORD first).
    static BYTES: [u8; 12] = [
        0x11, 0x00, 0x01, 0x02, 0x00, 0x00, 0x40, 0x00, 0x00, 0x09, 0x00, 0x03,
    ];

    fn repr() -> HelloAckRepr {
        HelloAckRepr {
            maj_v: 1,
            min_v: 1,
            max_adverts: 0x0102,
            act_rcv_sz: 0x4000,
            loc_ird: 3,
            loc_ord: 9,
        }
    }

    #[test]
    fn test_deconstruct() {
        let hah = HelloAckHeader::new_checked(&BYTES[..]).unwrap();
        assert_eq!(hah.maj_v(), 1);
        assert_eq!(hah.min_v(), 1);
        assert_eq!(hah.rsvd(), 0);
        assert_eq!(hah.max_adverts(), 0x0102);
        assert_eq!(hah.act_rcv_sz(), 0x4000);
        assert_eq!(hah.loc_ird(), 3);
        assert_eq!(hah.loc_ord(), 9);
    }

    #[test]
    fn test_construct() {
        let mut bytes = [0xa5u8; 12];
        let mut hah = HelloAckHeader::new_unchecked(&mut bytes[..]);
        hah.set_maj_v(1);
        hah.set_min_v(1);
        hah.set_rsvd(0);
        hah.set_max_adverts(0x0102);
        hah.set_act_rcv_sz(0x4000);
        hah.set_loc_ird(3);
        hah.set_loc_ord(9);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn test_parse() {
        let hah = HelloAckHeader::new_checked(&BYTES[..]).unwrap();
        assert_eq!(HelloAckRepr::parse(&hah), Ok(repr()));
    }

    #[test]
    fn test_emit() {
        let mut bytes = [0xa5u8; 12];
        repr().emit(&mut HelloAckHeader::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn rsvd_not_checked_and_sent_as_zero() {
        let mut bytes = BYTES;
        bytes[1] = 0xee;
        let parsed = HelloAckRepr::parse(&HelloAckHeader::new_checked(&bytes[..]).unwrap());
        assert_eq!(parsed, Ok(repr()));
        let mut out = [0xffu8; 12];
        repr().emit(&mut HelloAckHeader::new_unchecked(&mut out[..]));
        assert_eq!(out, BYTES);
    }

    #[test]
    fn truncated() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                HelloAckHeader::new_checked(&BYTES[..n]),
                Err(Error::Truncated)
            );
        }
    }

    #[test]
    fn validate() {
        assert_eq!(repr().validate(), Ok(()));
        assert_eq!(HelloAckRepr { min_v: 0, ..repr() }.validate(), Ok(()));
        let cases = [
            (
                HelloAckRepr { maj_v: 3, ..repr() },
                Error::UnsupportedMajorVersion,
            ),
            (
                HelloAckRepr {
                    max_adverts: 0,
                    ..repr()
                },
                Error::ZeroMaxAdverts,
            ),
            (
                HelloAckRepr {
                    loc_ird: 0,
                    ..repr()
                },
                Error::ZeroLocIrd,
            ),
            (
                HelloAckRepr {
                    loc_ord: 0,
                    ..repr()
                },
                Error::ZeroLocOrd,
            ),
            (
                HelloAckRepr {
                    act_rcv_sz: MAX_SIZE + 1,
                    ..repr()
                },
                Error::RcvSzTooLarge,
            ),
        ];
        for (r, e) in cases {
            assert_eq!(r.validate(), Err(e), "{r:?}");
        }
    }
}
