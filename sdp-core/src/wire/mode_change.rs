//! The ModeChange Header, MCH (draft §6.3.8, Figure 11), with the Mode
//! values of Figure 12 (§6.3.8.2; the modes themselves are §11).
//!
//! Wire layout (the row of Figure 11 read rightmost byte first, see
//! [`super`]; InfiniBand SDP uses the same byte):
//!
//! ```text
//!  byte 0     S (bit 7) | Mode (bits 6-4) | Rsvd (bits 3-0)
//!  bytes 1-3  Rsvd
//! ```
//!
//! ```
//! use sdp_core::wire::{Mode, ModeChangeHeader, ModeChangeRepr};
//!
//! // "Change your send half-connection to Pipelined Mode."
//! let mch = ModeChangeRepr { send: true, mode: Mode::PIPE_MODE };
//! let mut buf = [0u8; 4];
//! mch.emit(&mut ModeChangeHeader::new_unchecked(&mut buf[..]));
//! assert_eq!(buf, [0xa0, 0, 0, 0]);
//! assert_eq!(mch.mode.to_string(), "PIPE_MODE");
//! ```

use core::fmt;

use super::Error;

mod field {
    use core::ops::Range;

    /// The byte holding S and Mode.
    pub const MODE: usize = 0;
    pub const S_BIT: u8 = 0x80;
    pub const MODE_SHIFT: u8 = 4;
    pub const MODE_MASK: u8 = 0x07;
    /// Bits 3-0 of byte 0 and bytes 1-3: 28 reserved bits.
    pub const RSVD_BITS: u8 = 0x0f;
    pub const RSVD: Range<usize> = 1..4;
}

/// Size of the MCH in bytes.
pub const HEADER_LEN: usize = field::RSVD.end;

/// A Flow Control Mode as carried in the MCH Mode field (§6.3.8.2,
/// Figure 12). Three bits; values 3–7 are reserved and parse as values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mode(pub u8);

impl Mode {
    /// 0: "New Mode should be Buffered Mode" (§11.1).
    pub const BUFF_MODE: Mode = Mode(0);
    /// 1: "New Mode should be Combined Mode" (§11.2).
    pub const COMB_MODE: Mode = Mode(1);
    /// 2: "New Mode should be Pipelined Mode" (§11.3).
    pub const PIPE_MODE: Mode = Mode(2);

    /// Whether Figure 12 reserves this value (3–7).
    pub const fn is_reserved(self) -> bool {
        self.0 > Mode::PIPE_MODE.0
    }

    /// The name Figure 12 gives this value, or "reserved".
    pub const fn name(self) -> &'static str {
        match self {
            Mode::BUFF_MODE => "BUFF_MODE",
            Mode::COMB_MODE => "COMB_MODE",
            Mode::PIPE_MODE => "PIPE_MODE",
            _ => "reserved",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_reserved() {
            write!(f, "reserved({})", self.0)
        } else {
            f.write_str(self.name())
        }
    }
}

/// A checked view of a ModeChange Header (the bytes after the BSDH).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeChangeHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> ModeChangeHeader<T> {
    /// Wraps a buffer without checking its length; accessors may panic on a
    /// short buffer. Use [`ModeChangeHeader::new_checked`] on input.
    pub const fn new_unchecked(buffer: T) -> ModeChangeHeader<T> {
        ModeChangeHeader { buffer }
    }

    /// Wraps a buffer, checking that it holds a whole MCH.
    pub fn new_checked(buffer: T) -> Result<ModeChangeHeader<T>, Error> {
        let header = Self::new_unchecked(buffer);
        header.check_len()?;
        Ok(header)
    }

    /// Checks that the buffer holds the 4 bytes of an MCH.
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

    /// The S bit: the receiver changes its send half-connection (true) or
    /// its receive half-connection (false) (§6.3.8.1).
    pub fn s(&self) -> bool {
        self.buffer.as_ref()[field::MODE] & field::S_BIT != 0
    }

    /// The Mode field (§6.3.8.2).
    pub fn mode(&self) -> Mode {
        Mode((self.buffer.as_ref()[field::MODE] >> field::MODE_SHIFT) & field::MODE_MASK)
    }

    /// The 28 reserved bits as received, right-aligned (§6.3.8.3: "MUST NOT
    /// be checked on receive").
    pub fn rsvd(&self) -> u32 {
        let b = self.buffer.as_ref();
        (u32::from(b[field::MODE] & field::RSVD_BITS) << 24)
            | (u32::from(b[1]) << 16)
            | (u32::from(b[2]) << 8)
            | u32::from(b[3])
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ModeChangeHeader<T> {
    /// Sets the S bit.
    pub fn set_s(&mut self, value: bool) {
        let b = &mut self.buffer.as_mut()[field::MODE];
        *b = (*b & !field::S_BIT) | if value { field::S_BIT } else { 0 };
    }

    /// Sets the Mode field (the low 3 bits of `value`).
    pub fn set_mode(&mut self, value: Mode) {
        let b = &mut self.buffer.as_mut()[field::MODE];
        *b = (*b & !(field::MODE_MASK << field::MODE_SHIFT))
            | ((value.0 & field::MODE_MASK) << field::MODE_SHIFT);
    }

    /// Sets the 28 reserved bits from the low 28 bits of `value`.
    pub fn set_rsvd(&mut self, value: u32) {
        let [hi, b1, b2, b3] = value.to_be_bytes();
        let b = self.buffer.as_mut();
        b[field::MODE] = (b[field::MODE] & !field::RSVD_BITS) | (hi & field::RSVD_BITS);
        b[field::RSVD].copy_from_slice(&[b1, b2, b3]);
    }
}

/// The fields of a ModeChange Header. The reserved bits are not kept: they
/// are sent as zero and "MUST NOT be checked on receive" (§6.3.8.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ModeChangeRepr {
    /// The S bit: true — change the receiver's send half-connection; false
    /// — its receive half-connection (§6.3.8.1).
    pub send: bool,
    /// The new Flow Control Mode (§6.3.8.2).
    pub mode: Mode,
}

impl ModeChangeRepr {
    /// Size of the MCH on the wire.
    pub const HEADER_LEN: usize = HEADER_LEN;

    /// Reads an MCH. Reserved Mode values parse; see
    /// [`ModeChangeRepr::validate`].
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        header: &ModeChangeHeader<&T>,
    ) -> Result<ModeChangeRepr, Error> {
        header.check_len()?;
        Ok(ModeChangeRepr {
            send: header.s(),
            mode: header.mode(),
        })
    }

    /// The field rule of §6.3.8.2: "The ModeChange MCH field value MUST be
    /// as defined in Figure 12", whose values 3–7 are reserved.
    pub fn validate(&self) -> Result<(), Error> {
        if self.mode.is_reserved() {
            return Err(Error::ReservedMode);
        }
        Ok(())
    }

    /// Bytes [`ModeChangeRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the MCH into a view of at least [`HEADER_LEN`] bytes. The Mode
    /// is truncated to its 3 bits.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut ModeChangeHeader<T>) {
        // §6.3.8.3: "These bits MUST be transmitted as zeroes".
        header.set_rsvd(0);
        header.set_s(self.send);
        header.set_mode(self.mode);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // S = 0 (receive half-connection), Mode = COMB_MODE.
    static BYTES: [u8; 4] = [0x10, 0x00, 0x00, 0x00];

    fn repr() -> ModeChangeRepr {
        ModeChangeRepr {
            send: false,
            mode: Mode::COMB_MODE,
        }
    }

    #[test]
    fn test_deconstruct() {
        let h = ModeChangeHeader::new_checked(&BYTES[..]).unwrap();
        assert!(!h.s());
        assert_eq!(h.mode(), Mode::COMB_MODE);
        assert_eq!(h.rsvd(), 0);
    }

    #[test]
    fn test_construct() {
        let mut bytes = [0xa5u8; 4];
        let mut h = ModeChangeHeader::new_unchecked(&mut bytes[..]);
        h.set_rsvd(0);
        h.set_s(false);
        h.set_mode(Mode::COMB_MODE);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn test_parse() {
        let h = ModeChangeHeader::new_checked(&BYTES[..]).unwrap();
        assert_eq!(ModeChangeRepr::parse(&h), Ok(repr()));
    }

    #[test]
    fn test_emit() {
        let mut bytes = [0xa5u8; 4];
        repr().emit(&mut ModeChangeHeader::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn s_and_mode_bits() {
        // The same byte values InfiniBand SDP uses (0x0-0x2 receive, 0x8-0xa
        // send, in the high nibble).
        let cases = [
            (false, Mode::BUFF_MODE, 0x00),
            (false, Mode::COMB_MODE, 0x10),
            (false, Mode::PIPE_MODE, 0x20),
            (true, Mode::BUFF_MODE, 0x80),
            (true, Mode::COMB_MODE, 0x90),
            (true, Mode::PIPE_MODE, 0xa0),
            (true, Mode(7), 0xf0),
        ];
        for (send, mode, byte) in cases {
            let mut bytes = [0u8; 4];
            ModeChangeRepr { send, mode }
                .emit(&mut ModeChangeHeader::new_unchecked(&mut bytes[..]));
            assert_eq!(bytes, [byte, 0, 0, 0]);
            let h = ModeChangeHeader::new_checked(&bytes[..]).unwrap();
            assert_eq!(ModeChangeRepr::parse(&h), Ok(ModeChangeRepr { send, mode }));
        }
    }

    #[test]
    fn rsvd_not_checked_and_sent_as_zero() {
        let bytes = [0x9f, 0xff, 0xff, 0xff];
        let h = ModeChangeHeader::new_checked(&bytes[..]).unwrap();
        assert_eq!(h.rsvd(), 0x0fff_ffff);
        let parsed = ModeChangeRepr::parse(&h).unwrap();
        assert_eq!(
            parsed,
            ModeChangeRepr {
                send: true,
                mode: Mode::COMB_MODE
            }
        );
        let mut out = [0xffu8; 4];
        parsed.emit(&mut ModeChangeHeader::new_unchecked(&mut out[..]));
        assert_eq!(out, [0x90, 0, 0, 0]);
    }

    #[test]
    fn truncated() {
        for n in 0..HEADER_LEN {
            assert_eq!(
                ModeChangeHeader::new_checked(&BYTES[..n]),
                Err(Error::Truncated)
            );
        }
    }

    #[test]
    fn mode_values() {
        assert_eq!(Mode::BUFF_MODE.name(), "BUFF_MODE");
        assert_eq!(Mode::COMB_MODE.name(), "COMB_MODE");
        assert_eq!(Mode::PIPE_MODE.name(), "PIPE_MODE");
        for v in 3..8 {
            assert!(Mode(v).is_reserved());
            assert_eq!(Mode(v).name(), "reserved");
            let r = ModeChangeRepr {
                send: false,
                mode: Mode(v),
            };
            assert_eq!(r.validate(), Err(Error::ReservedMode));
        }
        assert_eq!(Mode(5).to_string(), "reserved(5)");
        for m in [Mode::BUFF_MODE, Mode::COMB_MODE, Mode::PIPE_MODE] {
            assert!(!m.is_reserved());
            assert_eq!(
                ModeChangeRepr {
                    send: true,
                    mode: m
                }
                .validate(),
                Ok(())
            );
        }
    }
}
