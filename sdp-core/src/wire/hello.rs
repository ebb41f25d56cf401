//! The Hello Header, HH (draft §6.2.1, Figure 5), and the protocol version
//! this implementation speaks (§6.2.1.1, §6.2.1.2).
//!
//! The Hello Message is a BSDH followed by this 16-byte header and nothing
//! else; it is the one message sent in Streaming Mode (§8.1.1), here inside
//! the MPA Request's private data.
//!
//! Wire layout (each row of Figure 5 read rightmost byte first, see
//! [`super`]):
//!
//! ```text
//!  byte 0     MajV (bits 7-4) | MinV (bits 3-0)
//!  byte 1     Rsvd
//!  bytes 2-3  MaxAdverts
//!  bytes 4-7  DesRemRcvSz
//!  bytes 8-11 LocalRcvSz
//!  bytes 12-13 LocORD
//!  bytes 14-15 LocIRD
//! ```
//!
//! ```
//! use sdp_core::wire::{HelloHeader, HelloRepr, MAJOR_VERSION, MINOR_VERSION};
//!
//! let hh = HelloRepr {
//!     maj_v: MAJOR_VERSION,
//!     min_v: MINOR_VERSION,
//!     max_adverts: 8,
//!     des_rem_rcv_sz: 65536,
//!     local_rcv_sz: 65536,
//!     loc_ird: 4,
//!     loc_ord: 4,
//! };
//! let mut buf = [0u8; HelloRepr::HEADER_LEN];
//! hh.emit(&mut HelloHeader::new_unchecked(&mut buf[..]));
//! assert_eq!(buf[0], 0x11);
//! assert_eq!(HelloRepr::parse(&HelloHeader::new_checked(&buf[..]).unwrap()), Ok(hh));
//! assert_eq!(hh.validate(), Ok(()));
//! ```

use super::{read_u16, read_u32, write_u16, write_u32, Error, MAX_SIZE};

/// MajV of this version of the specification: "MajV MUST be set to 1"
/// (§6.2.1.1).
pub const MAJOR_VERSION: u8 = 1;

/// MinV of this version of the specification: "MinV MUST be set to 1"
/// (§6.2.1.2).
pub const MINOR_VERSION: u8 = 1;

mod field {
    use core::ops::Range;

    /// MajV in the high nibble, MinV in the low nibble.
    pub const VERSION: usize = 0;
    pub const RSVD: usize = 1;
    pub const MAX_ADVERTS: Range<usize> = 2..4;
    pub const DES_REM_RCV_SZ: Range<usize> = 4..8;
    pub const LOCAL_RCV_SZ: Range<usize> = 8..12;
    pub const LOC_ORD: Range<usize> = 12..14;
    pub const LOC_IRD: Range<usize> = 14..16;
}

/// Size of the HH in bytes.
pub const HEADER_LEN: usize = field::LOC_IRD.end;

/// A checked view of a Hello Header (the bytes after the BSDH).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> HelloHeader<T> {
    /// Wraps a buffer without checking its length; accessors may panic on a
    /// short buffer. Use [`HelloHeader::new_checked`] on input.
    pub const fn new_unchecked(buffer: T) -> HelloHeader<T> {
        HelloHeader { buffer }
    }

    /// Wraps a buffer, checking that it holds a whole HH.
    pub fn new_checked(buffer: T) -> Result<HelloHeader<T>, Error> {
        let header = Self::new_unchecked(buffer);
        header.check_len()?;
        Ok(header)
    }

    /// Checks that the buffer holds the 16 bytes of an HH.
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

    /// The MajV field, 4 bits (§6.2.1.1).
    pub fn maj_v(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION] >> 4
    }

    /// The MinV field, 4 bits (§6.2.1.2).
    pub fn min_v(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION] & 0x0f
    }

    /// The reserved byte as received (§6.2.1.8: "MUST NOT be checked").
    pub fn rsvd(&self) -> u8 {
        self.buffer.as_ref()[field::RSVD]
    }

    /// The MaxAdverts field (§6.2.1.3).
    pub fn max_adverts(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::MAX_ADVERTS.start)
    }

    /// The DesRemRcvSz field (§6.2.1.4).
    pub fn des_rem_rcv_sz(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::DES_REM_RCV_SZ.start)
    }

    /// The LocalRcvSz field (§6.2.1.5).
    pub fn local_rcv_sz(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::LOCAL_RCV_SZ.start)
    }

    /// The LocIRD field (§6.2.1.6).
    pub fn loc_ird(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::LOC_IRD.start)
    }

    /// The LocORD field (§6.2.1.7).
    pub fn loc_ord(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::LOC_ORD.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> HelloHeader<T> {
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

    /// Sets DesRemRcvSz.
    pub fn set_des_rem_rcv_sz(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::DES_REM_RCV_SZ.start, value)
    }

    /// Sets LocalRcvSz.
    pub fn set_local_rcv_sz(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::LOCAL_RCV_SZ.start, value)
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

/// The fields of a Hello Header. The reserved byte is not kept: it is sent
/// as zero and "MUST NOT be checked on receive" (§6.2.1.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct HelloRepr {
    /// Major protocol version, 4 bits; [`MAJOR_VERSION`] for this draft.
    pub maj_v: u8,
    /// Minor protocol version, 4 bits; [`MINOR_VERSION`] for this draft.
    pub min_v: u8,
    /// Concurrent Zcopy advertisements the sender allows (§6.2.1.3).
    pub max_adverts: u16,
    /// Desired size of the peer's receive Private Buffers (§6.2.1.4).
    pub des_rem_rcv_sz: u32,
    /// Initial size of the sender's receive Private Buffers (§6.2.1.5).
    pub local_rcv_sz: u32,
    /// The sender's IRD for this connection (§6.2.1.6).
    pub loc_ird: u16,
    /// The sender's ORD for this connection (§6.2.1.7).
    pub loc_ord: u16,
}

impl HelloRepr {
    /// Size of the HH on the wire.
    pub const HEADER_LEN: usize = HEADER_LEN;

    /// Reads an HH. Every value parses; [`HelloRepr::validate`] applies the
    /// Accepting Peer's checks.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(header: &HelloHeader<&T>) -> Result<HelloRepr, Error> {
        header.check_len()?;
        Ok(HelloRepr {
            maj_v: header.maj_v(),
            min_v: header.min_v(),
            max_adverts: header.max_adverts(),
            des_rem_rcv_sz: header.des_rem_rcv_sz(),
            local_rcv_sz: header.local_rcv_sz(),
            loc_ird: header.loc_ird(),
            loc_ord: header.loc_ord(),
        })
    }

    /// The Accepting Peer's checks of a received HH that need no connection
    /// state (§8.1.1 step 3a, §6.2.1).
    ///
    /// A MinV mismatch is not an error: "The Accepting Peer SHOULD NOT
    /// reject the connection request based solely on a mismatch of the Minor
    /// Protocol Version Number" (§8.1.1 step 3b).
    pub fn validate(&self) -> Result<(), Error> {
        // §6.2.1.1: "The Accepting Peer MUST terminate the connection if
        // MajV in the HH does not match its locally supported value(s)."
        if self.maj_v != MAJOR_VERSION {
            return Err(Error::UnsupportedMajorVersion);
        }
        // §6.2.1.3: "The Accepting Peer MUST terminate the connection if
        // MaxAdverts of the HH is zero."
        if self.max_adverts == 0 {
            return Err(Error::ZeroMaxAdverts);
        }
        // §8.1.1 step 3a: terminate when "The LocIRD or LocORD field in the
        // Hello Message is equal to zero."
        if self.loc_ird == 0 {
            return Err(Error::ZeroLocIrd);
        }
        if self.loc_ord == 0 {
            return Err(Error::ZeroLocOrd);
        }
        // §6.2.1.4, §6.2.1.5: buffer sizes are at most 2^31 bytes.
        if self.des_rem_rcv_sz > MAX_SIZE || self.local_rcv_sz > MAX_SIZE {
            return Err(Error::RcvSzTooLarge);
        }
        Ok(())
    }

    /// Bytes [`HelloRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the HH into a view of at least [`HEADER_LEN`] bytes. MajV and
    /// MinV are truncated to their 4 bits.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut HelloHeader<T>) {
        header.set_maj_v(self.maj_v);
        header.set_min_v(self.min_v);
        // §6.2.1.8: "These bits MUST be transmitted as zeroes".
        header.set_rsvd(0);
        header.set_max_adverts(self.max_adverts);
        header.set_des_rem_rcv_sz(self.des_rem_rcv_sz);
        header.set_local_rcv_sz(self.local_rcv_sz);
        header.set_loc_ird(self.loc_ird);
        header.set_loc_ord(self.loc_ord);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // MajV 1, MinV 1, MaxAdverts 0x0010, DesRemRcvSz 0x00010000,
    // LocalRcvSz 0x00008000, LocIRD 4, LocORD 8 (sent LocORD first).
    static BYTES: [u8; 16] = [
        0x11, 0x00, 0x00, 0x10, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x80, 0x00, 0x00, 0x08, 0x00,
        0x04,
    ];

    fn repr() -> HelloRepr {
        HelloRepr {
            maj_v: 1,
            min_v: 1,
            max_adverts: 0x10,
            des_rem_rcv_sz: 0x1_0000,
            local_rcv_sz: 0x8000,
            loc_ird: 4,
            loc_ord: 8,
        }
    }

    #[test]
    fn test_deconstruct() {
        let hh = HelloHeader::new_checked(&BYTES[..]).unwrap();
        assert_eq!(hh.maj_v(), 1);
        assert_eq!(hh.min_v(), 1);
        assert_eq!(hh.rsvd(), 0);
        assert_eq!(hh.max_adverts(), 0x10);
        assert_eq!(hh.des_rem_rcv_sz(), 0x1_0000);
        assert_eq!(hh.local_rcv_sz(), 0x8000);
        assert_eq!(hh.loc_ird(), 4);
        assert_eq!(hh.loc_ord(), 8);
    }

    #[test]
    fn test_construct() {
        let mut bytes = [0xa5u8; 16];
        let mut hh = HelloHeader::new_unchecked(&mut bytes[..]);
        hh.set_maj_v(1);
        hh.set_min_v(1);
        hh.set_rsvd(0);
        hh.set_max_adverts(0x10);
        hh.set_des_rem_rcv_sz(0x1_0000);
        hh.set_local_rcv_sz(0x8000);
        hh.set_loc_ird(4);
        hh.set_loc_ord(8);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn test_parse() {
        let hh = HelloHeader::new_checked(&BYTES[..]).unwrap();
        assert_eq!(HelloRepr::parse(&hh), Ok(repr()));
    }

    #[test]
    fn test_emit() {
        let mut bytes = [0xa5u8; 16];
        repr().emit(&mut HelloHeader::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn version_nibbles() {
        // MajV is the high nibble, MinV the low one.
        let mut bytes = BYTES;
        bytes[0] = 0x23;
        let hh = HelloHeader::new_checked(&bytes[..]).unwrap();
        assert_eq!((hh.maj_v(), hh.min_v()), (2, 3));
    }

    #[test]
    fn rsvd_not_checked_and_sent_as_zero() {
        let mut bytes = BYTES;
        bytes[1] = 0x40;
        let hh = HelloHeader::new_checked(&bytes[..]).unwrap();
        assert_eq!(hh.rsvd(), 0x40);
        let parsed = HelloRepr::parse(&hh).unwrap();
        assert_eq!(parsed, repr());
        let mut out = [0xffu8; 16];
        parsed.emit(&mut HelloHeader::new_unchecked(&mut out[..]));
        assert_eq!(out, BYTES);
    }

    #[test]
    fn truncated() {
        for n in 0..HEADER_LEN {
            assert_eq!(HelloHeader::new_checked(&BYTES[..n]), Err(Error::Truncated));
        }
    }

    #[test]
    fn validate() {
        assert_eq!(repr().validate(), Ok(()));
        // §6.2.1.2 / §8.1.1 3b: another MinV is accepted.
        let r = HelloRepr { min_v: 7, ..repr() };
        assert_eq!(r.validate(), Ok(()));
        let cases = [
            (
                HelloRepr { maj_v: 2, ..repr() },
                Error::UnsupportedMajorVersion,
            ),
            (
                HelloRepr { maj_v: 0, ..repr() },
                Error::UnsupportedMajorVersion,
            ),
            (
                HelloRepr {
                    max_adverts: 0,
                    ..repr()
                },
                Error::ZeroMaxAdverts,
            ),
            (
                HelloRepr {
                    loc_ird: 0,
                    ..repr()
                },
                Error::ZeroLocIrd,
            ),
            (
                HelloRepr {
                    loc_ord: 0,
                    ..repr()
                },
                Error::ZeroLocOrd,
            ),
            (
                HelloRepr {
                    des_rem_rcv_sz: MAX_SIZE + 1,
                    ..repr()
                },
                Error::RcvSzTooLarge,
            ),
            (
                HelloRepr {
                    local_rcv_sz: u32::MAX,
                    ..repr()
                },
                Error::RcvSzTooLarge,
            ),
        ];
        for (r, e) in cases {
            assert_eq!(r.validate(), Err(e), "{r:?}");
        }
        let r = HelloRepr {
            des_rem_rcv_sz: MAX_SIZE,
            local_rcv_sz: MAX_SIZE,
            ..repr()
        };
        assert_eq!(r.validate(), Ok(()));
    }
}
