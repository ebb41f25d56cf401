//! The SrcAvail Header, SrcAH (draft §6.3.2, Figure 7).
//!
//! A SrcAvail Message is a BSDH, this 16-byte header and, depending on the
//! Flow Control Mode, a copy of the first bytes of the advertised buffer as
//! ULP payload (§6.3.2, §11: in Combined Mode it carries payload, in
//! Pipelined Mode none; that check belongs to the connection).
//!
//! Wire layout:
//!
//! ```text
//!  bytes 0-3   Len
//!  bytes 4-7   STag
//!  bytes 8-15  VA, big-endian: VA(32-63) then VA(0-31)
//! ```
//!
//! ```
//! use sdp_core::wire::{SrcAvailHeader, SrcAvailRepr};
//!
//! let srcah = SrcAvailRepr { len: 4096, stag: 0x1234_5600, va: 0x7f00_0000_1000 };
//! let mut buf = [0u8; SrcAvailRepr::HEADER_LEN];
//! srcah.emit(&mut SrcAvailHeader::new_unchecked(&mut buf[..]));
//! assert_eq!(&buf[8..], &[0, 0, 0x7f, 0, 0, 0, 0x10, 0]);
//! assert_eq!(srcah.validate(), Ok(()));
//! ```

use super::{read_u32, write_u32, Error, MAX_SIZE};

mod field {
    use core::ops::Range;

    pub const LEN: Range<usize> = 0..4;
    pub const STAG: Range<usize> = 4..8;
    /// VA(32-63) in bytes 8-11, VA(0-31) in bytes 12-15.
    pub const VA: Range<usize> = 8..16;
}

/// Size of the SrcAH in bytes.
pub const HEADER_LEN: usize = field::VA.end;

/// A checked view of a SrcAvail Header (the bytes after the BSDH).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SrcAvailHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> SrcAvailHeader<T> {
    /// Wraps a buffer without checking its length; accessors may panic on a
    /// short buffer. Use [`SrcAvailHeader::new_checked`] on input.
    pub const fn new_unchecked(buffer: T) -> SrcAvailHeader<T> {
        SrcAvailHeader { buffer }
    }

    /// Wraps a buffer, checking that it holds a whole SrcAH.
    pub fn new_checked(buffer: T) -> Result<SrcAvailHeader<T>, Error> {
        let header = Self::new_unchecked(buffer);
        header.check_len()?;
        Ok(header)
    }

    /// Checks that the buffer holds the 16 bytes of a SrcAH; the payload
    /// after it is ignored here.
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

    /// The Len field: size of the advertised buffer (§6.3.2.1).
    pub fn length(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::LEN.start)
    }

    /// The STag of the advertised buffer (§6.3.2.3).
    pub fn stag(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::STAG.start)
    }

    /// The VA (Tagged Offset) of the advertised buffer (§6.3.2.2).
    pub fn va(&self) -> u64 {
        let b = self.buffer.as_ref();
        (u64::from(read_u32(b, field::VA.start)) << 32)
            | u64::from(read_u32(b, field::VA.start + 4))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SrcAvailHeader<T> {
    /// Sets Len.
    pub fn set_length(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::LEN.start, value)
    }

    /// Sets the STag.
    pub fn set_stag(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::STAG.start, value)
    }

    /// Sets the VA.
    pub fn set_va(&mut self, value: u64) {
        self.buffer.as_mut()[field::VA].copy_from_slice(&value.to_be_bytes());
    }
}

/// The fields of a SrcAvail Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SrcAvailRepr {
    /// Size of the advertised buffer in bytes, including the part copied
    /// into this message's payload (§6.3.2.1, §6.3.2.2).
    pub len: u32,
    /// STag the Data Sink uses in its RDMA Read (§6.3.2.3).
    pub stag: u32,
    /// Start of the advertised buffer, the iWARP Tagged Offset (§6.3.2.2).
    pub va: u64,
}

impl SrcAvailRepr {
    /// Size of the SrcAH on the wire.
    pub const HEADER_LEN: usize = HEADER_LEN;

    /// Reads a SrcAH. Every value parses; see [`SrcAvailRepr::validate`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        header: &SrcAvailHeader<&T>,
    ) -> Result<SrcAvailRepr, Error> {
        header.check_len()?;
        Ok(SrcAvailRepr {
            len: header.length(),
            stag: header.stag(),
            va: header.va(),
        })
    }

    /// The field rules of §6.3.2 that need no connection state.
    pub fn validate(&self) -> Result<(), Error> {
        // §6.3.2.1: "The value of Len MUST be greater than zero and less than
        // or equal to 2^31 bytes."
        if self.len == 0 || self.len > MAX_SIZE {
            return Err(Error::AdvertLen);
        }
        Ok(())
    }

    /// Bytes [`SrcAvailRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the SrcAH into a view of at least [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut SrcAvailHeader<T>) {
        header.set_length(self.len);
        header.set_stag(self.stag);
        header.set_va(self.va);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Len 0x00010000, STag 0xaabbcc01, VA 0x0011223344556677.
    static BYTES: [u8; 16] = [
        0x00, 0x01, 0x00, 0x00, 0xaa, 0xbb, 0xcc, 0x01, 0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66,
        0x77,
    ];

    fn repr() -> SrcAvailRepr {
        SrcAvailRepr {
            len: 0x1_0000,
            stag: 0xaabb_cc01,
            va: 0x0011_2233_4455_6677,
        }
    }

    #[test]
    fn test_deconstruct() {
        let h = SrcAvailHeader::new_checked(&BYTES[..]).unwrap();
        assert_eq!(h.length(), 0x1_0000);
        assert_eq!(h.stag(), 0xaabb_cc01);
        assert_eq!(h.va(), 0x0011_2233_4455_6677);
    }

    #[test]
    fn test_construct() {
        let mut bytes = [0xa5u8; 16];
        let mut h = SrcAvailHeader::new_unchecked(&mut bytes[..]);
        h.set_length(0x1_0000);
        h.set_stag(0xaabb_cc01);
        h.set_va(0x0011_2233_4455_6677);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn test_parse() {
        let h = SrcAvailHeader::new_checked(&BYTES[..]).unwrap();
        assert_eq!(SrcAvailRepr::parse(&h), Ok(repr()));
    }

    #[test]
    fn test_emit() {
        let mut bytes = [0xa5u8; 16];
        repr().emit(&mut SrcAvailHeader::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn truncated() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                SrcAvailHeader::new_checked(&BYTES[..n]),
                Err(Error::Truncated)
            );
        }
    }

    #[test]
    fn validate() {
        assert_eq!(repr().validate(), Ok(()));
        assert_eq!(SrcAvailRepr { len: 1, ..repr() }.validate(), Ok(()));
        assert_eq!(
            SrcAvailRepr {
                len: MAX_SIZE,
                ..repr()
            }
            .validate(),
            Ok(())
        );
        assert_eq!(
            SrcAvailRepr { len: 0, ..repr() }.validate(),
            Err(Error::AdvertLen)
        );
        assert_eq!(
            SrcAvailRepr {
                len: MAX_SIZE + 1,
                ..repr()
            }
            .validate(),
            Err(Error::AdvertLen)
        );
    }
}
