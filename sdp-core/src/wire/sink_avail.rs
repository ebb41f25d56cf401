//! The SinkAvail Header, SinkAH (draft §6.3.3, Figure 8).
//!
//! A SinkAvail Message is a BSDH, this 20-byte header and optionally ULP
//! payload for the opposite direction (the Transaction Mechanism, §9.4).
//!
//! Wire layout:
//!
//! ```text
//!  bytes 0-3   Len
//!  bytes 4-7   STag
//!  bytes 8-15  VA, big-endian: VA(32-63) then VA(0-31)
//!  bytes 16-19 NonDiscards
//! ```
//!
//! ```
//! use sdp_core::wire::{SinkAvailHeader, SinkAvailRepr};
//!
//! let bytes = [0, 0, 0x10, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0x20, 0, 0, 0, 0, 3];
//! let h = SinkAvailHeader::new_checked(&bytes[..]).unwrap();
//! let sinkah = SinkAvailRepr::parse(&h).unwrap();
//! assert_eq!(sinkah, SinkAvailRepr { len: 4096, stag: 7, va: 0x2000, non_discards: 3 });
//! ```

use super::{read_u32, write_u32, Error, MAX_SIZE};

mod field {
    use core::ops::Range;

    pub const LEN: Range<usize> = 0..4;
    pub const STAG: Range<usize> = 4..8;
    /// VA(32-63) in bytes 8-11, VA(0-31) in bytes 12-15.
    pub const VA: Range<usize> = 8..16;
    pub const NON_DISCARDS: Range<usize> = 16..20;
}

/// Size of the SinkAH in bytes.
pub const HEADER_LEN: usize = field::NON_DISCARDS.end;

/// A checked view of a SinkAvail Header (the bytes after the BSDH).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkAvailHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> SinkAvailHeader<T> {
    /// Wraps a buffer without checking its length; accessors may panic on a
    /// short buffer. Use [`SinkAvailHeader::new_checked`] on input.
    pub const fn new_unchecked(buffer: T) -> SinkAvailHeader<T> {
        SinkAvailHeader { buffer }
    }

    /// Wraps a buffer, checking that it holds a whole SinkAH.
    pub fn new_checked(buffer: T) -> Result<SinkAvailHeader<T>, Error> {
        let header = Self::new_unchecked(buffer);
        header.check_len()?;
        Ok(header)
    }

    /// Checks that the buffer holds the 20 bytes of a SinkAH; the payload
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

    /// The Len field: size of the advertised buffer (§6.3.3.1).
    pub fn length(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::LEN.start)
    }

    /// The STag of the advertised buffer (§6.3.3.3).
    pub fn stag(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::STAG.start)
    }

    /// The VA (Tagged Offset) of the advertised buffer (§6.3.3.2).
    pub fn va(&self) -> u64 {
        let b = self.buffer.as_ref();
        (u64::from(read_u32(b, field::VA.start)) << 32)
            | u64::from(read_u32(b, field::VA.start + 4))
    }

    /// The NonDiscards field (§6.3.3.4).
    pub fn non_discards(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::NON_DISCARDS.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SinkAvailHeader<T> {
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

    /// Sets NonDiscards.
    pub fn set_non_discards(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::NON_DISCARDS.start, value)
    }
}

/// The fields of a SinkAvail Header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SinkAvailRepr {
    /// Size of the advertised buffer in bytes (§6.3.3.1).
    pub len: u32,
    /// STag the Data Source uses in its RDMA Writes (§6.3.3.3).
    pub stag: u32,
    /// Start of the advertised buffer, the iWARP Tagged Offset (§6.3.3.2).
    pub va: u64,
    /// The Data Sink's NonDiscards count, wrapping (§6.3.3.4, §9.5.1).
    pub non_discards: u32,
}

impl SinkAvailRepr {
    /// Size of the SinkAH on the wire.
    pub const HEADER_LEN: usize = HEADER_LEN;

    /// Reads a SinkAH. Every value parses; see [`SinkAvailRepr::validate`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        header: &SinkAvailHeader<&T>,
    ) -> Result<SinkAvailRepr, Error> {
        header.check_len()?;
        Ok(SinkAvailRepr {
            len: header.length(),
            stag: header.stag(),
            va: header.va(),
            non_discards: header.non_discards(),
        })
    }

    /// The field rules of §6.3.3 that need no connection state.
    pub fn validate(&self) -> Result<(), Error> {
        // §6.3.3.1: "The value of Len MUST be greater than zero and less than
        // or equal to 2^31 bytes."
        if self.len == 0 || self.len > MAX_SIZE {
            return Err(Error::AdvertLen);
        }
        Ok(())
    }

    /// Bytes [`SinkAvailRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the SinkAH into a view of at least [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut SinkAvailHeader<T>) {
        header.set_length(self.len);
        header.set_stag(self.stag);
        header.set_va(self.va);
        header.set_non_discards(self.non_discards);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Len 0x00002000, STag 0x01020304, VA 0xfedcba9876543210,
    // NonDiscards 0xffffffff.
    static BYTES: [u8; 20] = [
        0x00, 0x00, 0x20, 0x00, 0x01, 0x02, 0x03, 0x04, 0xfe, 0xdc, 0xba, 0x98, 0x76, 0x54, 0x32,
        0x10, 0xff, 0xff, 0xff, 0xff,
    ];

    fn repr() -> SinkAvailRepr {
        SinkAvailRepr {
            len: 0x2000,
            stag: 0x0102_0304,
            va: 0xfedc_ba98_7654_3210,
            non_discards: 0xffff_ffff,
        }
    }

    #[test]
    fn test_deconstruct() {
        let h = SinkAvailHeader::new_checked(&BYTES[..]).unwrap();
        assert_eq!(h.length(), 0x2000);
        assert_eq!(h.stag(), 0x0102_0304);
        assert_eq!(h.va(), 0xfedc_ba98_7654_3210);
        assert_eq!(h.non_discards(), 0xffff_ffff);
    }

    #[test]
    fn test_construct() {
        let mut bytes = [0xa5u8; 20];
        let mut h = SinkAvailHeader::new_unchecked(&mut bytes[..]);
        h.set_length(0x2000);
        h.set_stag(0x0102_0304);
        h.set_va(0xfedc_ba98_7654_3210);
        h.set_non_discards(0xffff_ffff);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn test_parse() {
        let h = SinkAvailHeader::new_checked(&BYTES[..]).unwrap();
        assert_eq!(SinkAvailRepr::parse(&h), Ok(repr()));
    }

    #[test]
    fn test_emit() {
        let mut bytes = [0xa5u8; 20];
        repr().emit(&mut SinkAvailHeader::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn truncated() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                SinkAvailHeader::new_checked(&BYTES[..n]),
                Err(Error::Truncated)
            );
        }
    }

    #[test]
    fn validate() {
        assert_eq!(repr().validate(), Ok(()));
        assert_eq!(
            SinkAvailRepr {
                len: MAX_SIZE,
                ..repr()
            }
            .validate(),
            Ok(())
        );
        assert_eq!(
            SinkAvailRepr { len: 0, ..repr() }.validate(),
            Err(Error::AdvertLen)
        );
        assert_eq!(
            SinkAvailRepr {
                len: u32::MAX,
                ..repr()
            }
            .validate(),
            Err(Error::AdvertLen)
        );
    }
}
