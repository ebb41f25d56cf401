//! The SuspComm Header, SuspCH (draft §6.5.1, Figure 15), used by socket
//! duplication (§13).
//!
//! Wire layout (the rows of Figure 15 read rightmost byte first, see
//! [`super`]): the 8 bytes are the InfiniBand SDP Service ID
//! `0x0000_0000_0001_PPPP` for port `PPPP`, which is what §6.5.1 asks for
//! ("[Constant1, Constant2] form a 48-bit constant value that corresponds to
//! the 48-bit constant of the SuspComm header" of InfiniBand SDP).
//!
//! ```text
//!  bytes 0-3  Constant1 = 0x0
//!  bytes 4-5  Constant2 = 0x1
//!  bytes 6-7  Destination TCP Port
//! ```
//!
//! ```
//! use sdp_core::wire::{SuspCommHeader, SuspCommRepr};
//!
//! let mut buf = [0u8; SuspCommRepr::HEADER_LEN];
//! SuspCommRepr { port: 0x1234 }.emit(&mut SuspCommHeader::new_unchecked(&mut buf[..]));
//! assert_eq!(buf, [0, 0, 0, 0, 0, 1, 0x12, 0x34]);
//! ```

use super::{read_u16, read_u32, write_u16, write_u32, Error};

mod field {
    use core::ops::Range;

    pub const CONSTANT1: Range<usize> = 0..4;
    pub const CONSTANT2: Range<usize> = 4..6;
    pub const PORT: Range<usize> = 6..8;
}

/// Size of the SuspCH in bytes.
pub const HEADER_LEN: usize = field::PORT.end;

/// "Constant1 MUST be set to 0x0" (§6.5.1.2).
pub const CONSTANT1: u32 = 0x0;

/// "Constant2 MUST be set to 0x1" (§6.5.1.3).
pub const CONSTANT2: u16 = 0x1;

/// A checked view of a SuspComm Header (the bytes after the BSDH).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuspCommHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> SuspCommHeader<T> {
    /// Wraps a buffer without checking its length; accessors may panic on a
    /// short buffer. Use [`SuspCommHeader::new_checked`] on input.
    pub const fn new_unchecked(buffer: T) -> SuspCommHeader<T> {
        SuspCommHeader { buffer }
    }

    /// Wraps a buffer, checking that it holds a whole SuspCH. The constants
    /// are checked by [`SuspCommRepr::parse`].
    pub fn new_checked(buffer: T) -> Result<SuspCommHeader<T>, Error> {
        let header = Self::new_unchecked(buffer);
        header.check_len()?;
        Ok(header)
    }

    /// Checks that the buffer holds the 8 bytes of a SuspCH.
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

    /// The Constant1 field (§6.5.1.2).
    pub fn constant1(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::CONSTANT1.start)
    }

    /// The Constant2 field (§6.5.1.3).
    pub fn constant2(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CONSTANT2.start)
    }

    /// The Destination TCP Port the Remote Peer reconnects to after the
    /// duplication (§6.5.1.1).
    pub fn port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::PORT.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> SuspCommHeader<T> {
    /// Sets Constant1.
    pub fn set_constant1(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::CONSTANT1.start, value)
    }

    /// Sets Constant2.
    pub fn set_constant2(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::CONSTANT2.start, value)
    }

    /// Sets the Destination TCP Port.
    pub fn set_port(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::PORT.start, value)
    }
}

/// The fields of a SuspComm Header. The constants are not kept: parse
/// checks them and emit writes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SuspCommRepr {
    /// Destination TCP Port to reconnect to (§6.5.1.1).
    pub port: u16,
}

impl SuspCommRepr {
    /// Size of the SuspCH on the wire.
    pub const HEADER_LEN: usize = HEADER_LEN;

    /// Reads a SuspCH, rejecting wrong constants.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        header: &SuspCommHeader<&T>,
    ) -> Result<SuspCommRepr, Error> {
        header.check_len()?;
        // §6.5.1.2 "Constant1 MUST be set to 0x0", §6.5.1.3 "Constant2 MUST
        // be set to 0x1": together they identify the header as the
        // InfiniBand Service ID form; anything else is not a SuspCH we
        // understand.
        if header.constant1() != CONSTANT1 || header.constant2() != CONSTANT2 {
            return Err(Error::SuspCommConstant);
        }
        Ok(SuspCommRepr {
            port: header.port(),
        })
    }

    /// Bytes [`SuspCommRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the SuspCH into a view of at least [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut SuspCommHeader<T>) {
        header.set_constant1(CONSTANT1);
        header.set_constant2(CONSTANT2);
        header.set_port(self.port);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Destination TCP Port 5001 (0x1389).
    static BYTES: [u8; 8] = [0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x13, 0x89];

    #[test]
    fn test_deconstruct() {
        let h = SuspCommHeader::new_checked(&BYTES[..]).unwrap();
        assert_eq!(h.constant1(), 0);
        assert_eq!(h.constant2(), 1);
        assert_eq!(h.port(), 5001);
    }

    #[test]
    fn test_construct() {
        let mut bytes = [0xa5u8; 8];
        let mut h = SuspCommHeader::new_unchecked(&mut bytes[..]);
        h.set_constant1(0);
        h.set_constant2(1);
        h.set_port(5001);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn test_parse() {
        let h = SuspCommHeader::new_checked(&BYTES[..]).unwrap();
        assert_eq!(SuspCommRepr::parse(&h), Ok(SuspCommRepr { port: 5001 }));
    }

    #[test]
    fn test_emit() {
        let mut bytes = [0xa5u8; 8];
        SuspCommRepr { port: 5001 }.emit(&mut SuspCommHeader::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn is_infiniband_service_id() {
        assert_eq!(u64::from_be_bytes(BYTES), 0x0000_0000_0001_0000 | 5001);
    }

    #[test]
    fn truncated() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                SuspCommHeader::new_checked(&BYTES[..n]),
                Err(Error::Truncated)
            );
        }
    }

    #[test]
    fn wrong_constants() {
        for i in 0..6 {
            let mut bytes = BYTES;
            bytes[i] ^= 0x10;
            let h = SuspCommHeader::new_checked(&bytes[..]).unwrap();
            assert_eq!(
                SuspCommRepr::parse(&h),
                Err(Error::SuspCommConstant),
                "byte {i}"
            );
        }
    }
}
