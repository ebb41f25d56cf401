//! MPA Request and Reply frames (RFC 5044 §7.1.1, with the S bit of
//! RFC 6581 §6) and the enhanced RDMA connection establishment data that
//! opens their Private Data when S is set (RFC 6581 §9).
//!
//! These frames are exchanged in the Startup Phase, before any FPDU, over
//! the raw byte stream (no CRC, no markers). Because a frame has no delimiter
//! other than its PD_Length, a receiver reads the fixed 20-byte header, asks
//! [`Frame::frame_len`] how long the whole frame is, and reads exactly that
//! many bytes: whatever follows is the first byte of the Full Operation Phase
//! (stream position 0 for the marker arithmetic of [`super::fpdu`]).
//!
//! The parser reports what the frame says — which key, the flags, Rev —
//! and rejects only what makes the frame unreadable (RFC 5044 §7.1.2 rule 9:
//! improperly formatted). Whether a Request was expected rather than a Reply,
//! and which Rev is acceptable, is the startup state machine's decision.
//!
//! ```
//! use iwarp::wire::mpa::{Frame, FrameKind, FrameRepr, REV_2};
//!
//! let repr = FrameRepr {
//!     kind: FrameKind::Request,
//!     markers: false,
//!     crc: true,
//!     rejected: false,
//!     enhanced: false,
//!     rev: REV_2,
//!     private_data: b"hello",
//! };
//! let mut bytes = vec![0u8; repr.buffer_len()];
//! repr.emit(&mut Frame::new_unchecked(&mut bytes[..])).unwrap();
//!
//! // A receiver learns the frame length from the first 20 bytes ...
//! assert_eq!(Frame::<&[u8]>::frame_len(&bytes[..20]), Ok(25));
//! // ... and parses exactly one frame.
//! let frame = Frame::new_checked(&bytes[..]).unwrap();
//! assert_eq!(FrameRepr::parse(&frame), Ok(repr));
//! ```

use core::fmt;

use super::terminate::TermCode;

/// "MPA ID Req Frame" (RFC 5044 §7.1.1).
pub const REQUEST_KEY: [u8; 16] = *b"MPA ID Req Frame";
/// "MPA ID Rep Frame" (RFC 5044 §7.1.1).
pub const REPLY_KEY: [u8; 16] = *b"MPA ID Rep Frame";

/// Rev of RFC 5044.
pub const REV_1: u8 = 1;
/// Rev of RFC 6581 (enhanced connection establishment).
pub const REV_2: u8 = 2;

/// Largest Private Data field (RFC 5044 §7.1.1).
pub const MAX_PRIVATE_DATA: usize = 512;

/// Length of the fixed part of a frame, before the Private Data.
pub const HEADER_LEN: usize = field::PRIVATE_DATA;

/// Errors in an MPA Request/Reply frame or the enhanced connection data.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// Fewer bytes than the header, the PD_Length or the enhanced data need.
    Truncated,
    /// The Key is neither "MPA ID Req Frame" nor "MPA ID Rep Frame".
    BadKey,
    /// PD_Length (or, on emit, the Private Data) exceeds 512 octets.
    PrivateDataTooLong,
    /// S is set but the Private Data is shorter than the 4 octets of
    /// enhanced connection data it must begin with.
    EnhancedDataMissing,
    /// Emit only: an IRD or ORD above the 14-bit maximum 0x3FFF.
    IrdOrdTooLarge,
    /// Emit only: a B, C or D flag set while A is clear.
    RtrWithoutPeerToPeer,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::Truncated => "truncated MPA frame",
            Error::BadKey => "MPA frame key is neither Request nor Reply",
            Error::PrivateDataTooLong => "MPA private data longer than 512 octets",
            Error::EnhancedDataMissing => "MPA frame has S set but no enhanced connection data",
            Error::IrdOrdTooLarge => "IRD or ORD does not fit in 14 bits",
            Error::RtrWithoutPeerToPeer => "RTR flag set without the peer-to-peer flag",
        })
    }
}

impl std::error::Error for Error {}

impl From<Error> for TermCode {
    fn from(e: Error) -> TermCode {
        match e {
            // RFC 5044 §8 code 4: invalid MPA Request or Reply frame.
            Error::Truncated
            | Error::BadKey
            | Error::PrivateDataTooLong
            | Error::EnhancedDataMissing => TermCode::MPA_INVALID_FRAME,
            // Only raised when we build a frame: our own fault, for which
            // RFC 6581 §9.3 prescribes code 5 (local catastrophic).
            Error::IrdOrdTooLarge | Error::RtrWithoutPeerToPeer => TermCode::MPA_LOCAL_CATASTROPHIC,
        }
    }
}

/// Which of the two startup frames this is, as told by its Key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// "MPA ID Req Frame", sent by the Initiator.
    Request,
    /// "MPA ID Rep Frame", sent by the Responder.
    Reply,
}

impl FrameKind {
    /// The 16-byte Key of this kind.
    pub const fn key(self) -> &'static [u8; 16] {
        match self {
            FrameKind::Request => &REQUEST_KEY,
            FrameKind::Reply => &REPLY_KEY,
        }
    }

    /// The kind a Key names, if any.
    pub fn from_key(key: &[u8]) -> Option<FrameKind> {
        if key == REQUEST_KEY {
            Some(FrameKind::Request)
        } else if key == REPLY_KEY {
            Some(FrameKind::Reply)
        } else {
            None
        }
    }
}

mod field {
    use core::ops::Range;

    pub const KEY: Range<usize> = 0..16;
    pub const FLAGS: usize = 16;
    pub const REV: usize = 17;
    pub const PD_LENGTH: Range<usize> = 18..20;
    pub const PRIVATE_DATA: usize = 20;

    pub const FLAG_M: u8 = 0x80;
    pub const FLAG_C: u8 = 0x40;
    pub const FLAG_R: u8 = 0x20;
    /// RFC 6581 §6 takes the top bit of RFC 5044's Res for S.
    pub const FLAG_S: u8 = 0x10;
    pub const RES_MASK: u8 = 0x0f;
}

/// A read/write view of an MPA Request or Reply frame.
///
/// The buffer may extend past the frame (bytes of the Full Operation Phase
/// that arrived with it); [`Frame::private_data`] stops at PD_Length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps `buffer` without checking its length.
    pub const fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    /// Wraps `buffer` and checks that it holds the header and the Private
    /// Data announced by PD_Length.
    pub fn new_checked(buffer: T) -> Result<Frame<T>, Error> {
        let frame = Self::new_unchecked(buffer);
        frame.check_len()?;
        Ok(frame)
    }

    /// Checks that no accessor can panic: the header is there and so are
    /// PD_Length octets of Private Data.
    pub fn check_len(&self) -> Result<(), Error> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        // RFC 5044 §7.1.1: "If the receiver detects that the PD_Length field
        // does not match the length of the Private Data field ... the
        // receiver MUST close the connection". Over a stream, missing bytes
        // are the only mismatch we can see.
        if len < HEADER_LEN + usize::from(self.pd_length()) {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// The total length (header plus Private Data) of the frame whose first
    /// [`HEADER_LEN`] bytes are `header`, so that a stream reader can take
    /// exactly one frame and leave the FPDU bytes behind it.
    ///
    /// Fails early, before the Private Data arrives, on a bad Key or a
    /// PD_Length above 512, so that a non-MPA peer or a hostile one cannot
    /// make us wait for 64 KiB.
    pub fn frame_len(header: &[u8]) -> Result<usize, Error> {
        let header = header.get(..HEADER_LEN).ok_or(Error::Truncated)?;
        let frame = Frame::new_unchecked(header);
        if frame.kind().is_none() {
            return Err(Error::BadKey);
        }
        let pd_len = usize::from(frame.pd_length());
        if pd_len > MAX_PRIVATE_DATA {
            return Err(Error::PrivateDataTooLong);
        }
        Ok(HEADER_LEN + pd_len)
    }

    /// Consumes the view and returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The 16 Key octets.
    pub fn key(&self) -> &[u8] {
        &self.buffer.as_ref()[field::KEY]
    }

    /// The frame kind the Key names, or `None` for any other Key.
    pub fn kind(&self) -> Option<FrameKind> {
        FrameKind::from_key(self.key())
    }

    fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }

    /// M: markers required in FPDUs sent *to* the sender of this frame.
    pub fn markers(&self) -> bool {
        self.flags() & field::FLAG_M != 0
    }

    /// C: CRC preferred.
    pub fn crc(&self) -> bool {
        self.flags() & field::FLAG_C != 0
    }

    /// R: connection rejected (meaningful in a Reply only).
    pub fn rejected(&self) -> bool {
        self.flags() & field::FLAG_R != 0
    }

    /// S: the Private Data begins with enhanced connection data.
    pub fn enhanced(&self) -> bool {
        self.flags() & field::FLAG_S != 0
    }

    /// Res: the reserved low 4 bits of the flags octet.
    pub fn res(&self) -> u8 {
        self.flags() & field::RES_MASK
    }

    /// Rev.
    pub fn rev(&self) -> u8 {
        self.buffer.as_ref()[field::REV]
    }

    /// PD_Length.
    pub fn pd_length(&self) -> u16 {
        let b = &self.buffer.as_ref()[field::PD_LENGTH];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// The Private Data field: exactly PD_Length octets.
    pub fn private_data(&self) -> &[u8] {
        let end = HEADER_LEN + usize::from(self.pd_length());
        &self.buffer.as_ref()[HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    fn set_flag(&mut self, flag: u8, value: bool) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        if value {
            *b |= flag;
        } else {
            *b &= !flag;
        }
    }

    /// Writes the Key of `kind`.
    pub fn set_kind(&mut self, kind: FrameKind) {
        self.buffer.as_mut()[field::KEY].copy_from_slice(kind.key());
    }

    /// Sets M.
    pub fn set_markers(&mut self, value: bool) {
        self.set_flag(field::FLAG_M, value)
    }

    /// Sets C.
    pub fn set_crc(&mut self, value: bool) {
        self.set_flag(field::FLAG_C, value)
    }

    /// Sets R.
    pub fn set_rejected(&mut self, value: bool) {
        self.set_flag(field::FLAG_R, value)
    }

    /// Sets S.
    pub fn set_enhanced(&mut self, value: bool) {
        self.set_flag(field::FLAG_S, value)
    }

    /// Sets Res (low 4 bits of `value`).
    pub fn set_res(&mut self, value: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !field::RES_MASK) | (value & field::RES_MASK);
    }

    /// Sets Rev.
    pub fn set_rev(&mut self, value: u8) {
        self.buffer.as_mut()[field::REV] = value;
    }

    /// Sets PD_Length.
    pub fn set_pd_length(&mut self, value: u16) {
        self.buffer.as_mut()[field::PD_LENGTH].copy_from_slice(&value.to_be_bytes());
    }

    /// The Private Data field, mutably (PD_Length octets).
    pub fn private_data_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + usize::from(self.pd_length());
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// A parsed MPA Request or Reply frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameRepr<'a> {
    /// Request or Reply, from the Key.
    pub kind: FrameKind,
    /// M: the sender requires markers in the FPDUs it receives.
    pub markers: bool,
    /// C: the sender prefers CRCs.
    pub crc: bool,
    /// R: the Responder rejects the connection. Always false in a Request:
    /// RFC 5044 §7.1.1 "R: This bit is set to zero, and not checked on
    /// reception in the MPA Request Frame".
    pub rejected: bool,
    /// S (RFC 6581 §6): `private_data` begins with the 4 octets of
    /// [`EnhancedRepr`].
    pub enhanced: bool,
    /// Rev, as received. [`REV_1`] or [`REV_2`] in practice; accepting it is
    /// the caller's decision (RFC 5044 §7.1.1: "the MPA receiver should
    /// report the received version to the ULP").
    pub rev: u8,
    /// The whole Private Data field, including the enhanced connection data
    /// when `enhanced` is set (RFC 6581 §6: PD_Length "is the total length
    /// of the Private Data field, including the enhanced RDMA connection
    /// establishment data").
    pub private_data: &'a [u8],
}

impl<'a> FrameRepr<'a> {
    /// Parses a frame. The Res bits are not kept: RFC 5044 §7.1.1 "It MUST
    /// be set to zero when sending, and not checked on reception".
    pub fn parse<T: AsRef<[u8]> + ?Sized>(frame: &Frame<&'a T>) -> Result<FrameRepr<'a>, Error> {
        frame.check_len()?;
        // RFC 5044 §7.1.2 rule 5: "If a received "Key" does not match the
        // expected value ... the TCP/DDP connection MUST be closed". Which
        // of the two keys is expected is the caller's to check.
        let kind = frame.kind().ok_or(Error::BadKey)?;
        // RFC 5044 §7.1.1: "if the length of the Private Data field exceeds
        // 512 octets, the receiver MUST close the connection".
        if usize::from(frame.pd_length()) > MAX_PRIVATE_DATA {
            return Err(Error::PrivateDataTooLong);
        }
        // RFC 6581 §6: "if the 'S' flag is set, Private Data MUST begin with
        // enhanced RDMA connection establishment data".
        if frame.enhanced() && usize::from(frame.pd_length()) < ENHANCED_LEN {
            return Err(Error::EnhancedDataMissing);
        }
        let private_data = {
            let buf: &'a [u8] = frame.buffer.as_ref();
            let end = HEADER_LEN + usize::from(frame.pd_length());
            buf.get(HEADER_LEN..end).ok_or(Error::Truncated)?
        };
        Ok(FrameRepr {
            kind,
            markers: frame.markers(),
            crc: frame.crc(),
            rejected: kind == FrameKind::Reply && frame.rejected(),
            enhanced: frame.enhanced(),
            rev: frame.rev(),
            private_data,
        })
    }

    /// The length of the emitted frame.
    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + self.private_data.len()
    }

    /// Writes the frame into `frame`, whose buffer must hold at least
    /// [`FrameRepr::buffer_len`] bytes (checked: `Error::Truncated`).
    ///
    /// Fails without writing if the Private Data is longer than 512 octets,
    /// or `enhanced` is set and it is shorter than 4. R is written as given,
    /// so the caller must keep it clear in a Request.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(
        &self,
        frame: &mut Frame<&mut T>,
    ) -> Result<(), Error> {
        // RFC 5044 §7.1.1: "The Private Data field MUST be between 0 and 512
        // octets in length."
        if self.private_data.len() > MAX_PRIVATE_DATA {
            return Err(Error::PrivateDataTooLong);
        }
        if self.enhanced && self.private_data.len() < ENHANCED_LEN {
            return Err(Error::EnhancedDataMissing);
        }
        if frame.buffer.as_ref().len() < self.buffer_len() {
            return Err(Error::Truncated);
        }
        frame.set_kind(self.kind);
        frame.buffer.as_mut()[field::FLAGS] = 0;
        frame.set_markers(self.markers);
        frame.set_crc(self.crc);
        frame.set_rejected(self.rejected);
        frame.set_enhanced(self.enhanced);
        frame.set_res(0);
        frame.set_rev(self.rev);
        // Fits: at most 512, checked above.
        frame.set_pd_length(self.private_data.len() as u16);
        frame.private_data_mut().copy_from_slice(self.private_data);
        Ok(())
    }

    /// The frame as a fresh vector.
    pub fn to_vec(&self) -> Result<Vec<u8>, Error> {
        let mut bytes = vec![0u8; self.buffer_len()];
        self.emit(&mut Frame::new_unchecked(&mut bytes[..]))?;
        Ok(bytes)
    }

    /// Splits the Private Data into the enhanced connection data (when S is
    /// set) and the ULP's part that follows it.
    pub fn split_private_data(&self) -> Result<(Option<EnhancedRepr>, &'a [u8]), Error> {
        if !self.enhanced {
            return Ok((None, self.private_data));
        }
        let data = EnhancedData::new_checked(self.private_data)?;
        let rest = self
            .private_data
            .get(ENHANCED_LEN..)
            .ok_or(Error::EnhancedDataMissing)?;
        Ok((Some(EnhancedRepr::parse(&data)?), rest))
    }
}

/// Length of the enhanced connection establishment data (RFC 6581 §9).
pub const ENHANCED_LEN: usize = 4;

/// The largest IRD or ORD the 14-bit fields carry — and, sent as the value,
/// a request not to negotiate.
///
/// RFC 6581 §9.1: "An all ones value (0x3FFF) indicates that automatic
/// negotiation of the IRD or ORD is not desired, and that the ULP will be
/// responsible for it." A responder answers an initiator ORD of 0x3FFF by
/// leaving its own IRD unchanged and replying IRD 0x3FFF, and an initiator
/// IRD of 0x3FFF by leaving its own ORD unchanged and replying ORD 0x3FFF;
/// an initiator receiving 0x3FFF leaves the corresponding local value
/// unchanged.
pub const IRD_ORD_NO_NEGOTIATION: u16 = 0x3fff;

mod enh_field {
    use core::ops::Range;

    pub const A_B_IRD: Range<usize> = 0..2;
    pub const C_D_ORD: Range<usize> = 2..4;
    pub const HIGH_FLAG: u16 = 0x8000;
    pub const LOW_FLAG: u16 = 0x4000;
    pub const VALUE: u16 = 0x3fff;
}

/// A read/write view of the 4 octets of enhanced RDMA connection
/// establishment data (RFC 6581 §9): `A|B|IRD(14)|C|D|ORD(14)`, network
/// byte order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnhancedData<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> EnhancedData<T> {
    /// Wraps `buffer` without checking its length.
    pub const fn new_unchecked(buffer: T) -> EnhancedData<T> {
        EnhancedData { buffer }
    }

    /// Wraps `buffer`, checking it holds at least 4 octets.
    pub fn new_checked(buffer: T) -> Result<EnhancedData<T>, Error> {
        let data = Self::new_unchecked(buffer);
        data.check_len()?;
        Ok(data)
    }

    /// Checks the 4 octets are there.
    pub fn check_len(&self) -> Result<(), Error> {
        if self.buffer.as_ref().len() < ENHANCED_LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    fn word(&self, range: core::ops::Range<usize>) -> u16 {
        let b = &self.buffer.as_ref()[range];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// A: peer-to-peer connection model.
    pub fn peer_to_peer(&self) -> bool {
        self.word(enh_field::A_B_IRD) & enh_field::HIGH_FLAG != 0
    }

    /// B: zero-length Send (FULPDU) RTR.
    pub fn rtr_send(&self) -> bool {
        self.word(enh_field::A_B_IRD) & enh_field::LOW_FLAG != 0
    }

    /// IRD (14 bits).
    pub fn ird(&self) -> u16 {
        self.word(enh_field::A_B_IRD) & enh_field::VALUE
    }

    /// C: zero-length RDMA Write RTR.
    pub fn rtr_write(&self) -> bool {
        self.word(enh_field::C_D_ORD) & enh_field::HIGH_FLAG != 0
    }

    /// D: zero-length RDMA Read RTR.
    pub fn rtr_read(&self) -> bool {
        self.word(enh_field::C_D_ORD) & enh_field::LOW_FLAG != 0
    }

    /// ORD (14 bits).
    pub fn ord(&self) -> u16 {
        self.word(enh_field::C_D_ORD) & enh_field::VALUE
    }
}

fn pack(high: bool, low: bool, value: u16) -> [u8; 2] {
    let mut w = value & enh_field::VALUE;
    if high {
        w |= enh_field::HIGH_FLAG;
    }
    if low {
        w |= enh_field::LOW_FLAG;
    }
    w.to_be_bytes()
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> EnhancedData<T> {
    /// Sets A, B and IRD; IRD is truncated to 14 bits.
    pub fn set_ird_word(&mut self, a: bool, b: bool, ird: u16) {
        self.buffer.as_mut()[enh_field::A_B_IRD].copy_from_slice(&pack(a, b, ird));
    }

    /// Sets C, D and ORD; ORD is truncated to 14 bits.
    pub fn set_ord_word(&mut self, c: bool, d: bool, ord: u16) {
        self.buffer.as_mut()[enh_field::C_D_ORD].copy_from_slice(&pack(c, d, ord));
    }
}

/// Parsed enhanced RDMA connection establishment data (RFC 6581 §9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct EnhancedRepr {
    /// A: peer-to-peer connection model (RTR negotiation) requested/echoed.
    pub peer_to_peer: bool,
    /// B: zero-length Send RTR requested (Request) / supported (Reply).
    pub rtr_send: bool,
    /// C: zero-length RDMA Write RTR requested / supported.
    pub rtr_write: bool,
    /// D: zero-length RDMA Read RTR requested / supported.
    pub rtr_read: bool,
    /// IRD, at most [`IRD_ORD_NO_NEGOTIATION`].
    pub ird: u16,
    /// ORD, at most [`IRD_ORD_NO_NEGOTIATION`].
    pub ord: u16,
}

impl EnhancedRepr {
    /// Parses the enhanced data.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(data: &EnhancedData<&T>) -> Result<EnhancedRepr, Error> {
        data.check_len()?;
        let peer_to_peer = data.peer_to_peer();
        // RFC 6581 §9.2: "On reception, if Control Flag A is set to 0, then
        // Control Flags B, C, and D MUST be ignored."
        Ok(EnhancedRepr {
            peer_to_peer,
            rtr_send: peer_to_peer && data.rtr_send(),
            rtr_write: peer_to_peer && data.rtr_write(),
            rtr_read: peer_to_peer && data.rtr_read(),
            ird: data.ird(),
            ord: data.ord(),
        })
    }

    /// The emitted length: 4.
    pub const fn buffer_len(&self) -> usize {
        ENHANCED_LEN
    }

    /// Writes the 4 octets. Fails without writing if IRD or ORD exceeds
    /// 0x3FFF (they would not fit in 14 bits), if B, C or D is set without
    /// A (RFC 6581 §9.2: "If Control Flag A is set to 0, then Control Flags
    /// B, C, and D MUST also be set to 0"), or if the buffer is short.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(
        &self,
        data: &mut EnhancedData<&mut T>,
    ) -> Result<(), Error> {
        if self.ird > IRD_ORD_NO_NEGOTIATION || self.ord > IRD_ORD_NO_NEGOTIATION {
            return Err(Error::IrdOrdTooLarge);
        }
        if !self.peer_to_peer && (self.rtr_send || self.rtr_write || self.rtr_read) {
            return Err(Error::RtrWithoutPeerToPeer);
        }
        data.check_len()?;
        data.set_ird_word(self.peer_to_peer, self.rtr_send, self.ird);
        data.set_ord_word(self.rtr_write, self.rtr_read, self.ord);
        Ok(())
    }

    /// The 4 octets.
    pub fn to_bytes(&self) -> Result<[u8; ENHANCED_LEN], Error> {
        let mut bytes = [0u8; ENHANCED_LEN];
        self.emit(&mut EnhancedData::new_unchecked(&mut bytes[..]))?;
        Ok(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // An enhanced Request: M=0 C=1 R=0 S=1, Rev 2, PD_Length 7:
    // A=1 B=0 IRD=16 | C=1 D=1 ORD=8, then "SDP".
    static REQUEST: [u8; 27] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, // "MPA ID R"
        0x65, 0x71, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65, // "eq Frame"
        0x50, 0x02, 0x00, 0x07, // C|S, Rev 2, PD_Length 7
        0x80, 0x10, 0xc0, 0x08, // A IRD=16, C D ORD=8
        b'S', b'D', b'P',
    ];

    // A rejecting Rev 1 Reply: M=1 C=1 R=1 S=0, no Private Data.
    static REPLY: [u8; 20] = [
        0x4d, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, // "MPA ID R"
        0x65, 0x70, 0x20, 0x46, 0x72, 0x61, 0x6d, 0x65, // "ep Frame"
        0xe0, 0x01, 0x00, 0x00,
    ];

    fn request_repr() -> FrameRepr<'static> {
        FrameRepr {
            kind: FrameKind::Request,
            markers: false,
            crc: true,
            rejected: false,
            enhanced: true,
            rev: REV_2,
            private_data: &REQUEST[20..],
        }
    }

    fn reply_repr() -> FrameRepr<'static> {
        FrameRepr {
            kind: FrameKind::Reply,
            markers: true,
            crc: true,
            rejected: true,
            enhanced: false,
            rev: REV_1,
            private_data: &[],
        }
    }

    fn enhanced_repr() -> EnhancedRepr {
        EnhancedRepr {
            peer_to_peer: true,
            rtr_send: false,
            rtr_write: true,
            rtr_read: true,
            ird: 16,
            ord: 8,
        }
    }

    #[test]
    fn keys_spell_the_rfc_bytes() {
        assert_eq!(
            REQUEST_KEY,
            [
                0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x71, 0x20, 0x46, 0x72, 0x61,
                0x6D, 0x65
            ]
        );
        assert_eq!(
            REPLY_KEY,
            [
                0x4D, 0x50, 0x41, 0x20, 0x49, 0x44, 0x20, 0x52, 0x65, 0x70, 0x20, 0x46, 0x72, 0x61,
                0x6D, 0x65
            ]
        );
    }

    #[test]
    fn test_deconstruct() {
        let f = Frame::new_checked(&REQUEST[..]).unwrap();
        assert_eq!(f.kind(), Some(FrameKind::Request));
        assert!(!f.markers());
        assert!(f.crc());
        assert!(!f.rejected());
        assert!(f.enhanced());
        assert_eq!(f.res(), 0);
        assert_eq!(f.rev(), 2);
        assert_eq!(f.pd_length(), 7);
        assert_eq!(f.private_data(), &REQUEST[20..]);

        let e = EnhancedData::new_checked(f.private_data()).unwrap();
        assert!(e.peer_to_peer());
        assert!(!e.rtr_send());
        assert_eq!(e.ird(), 16);
        assert!(e.rtr_write());
        assert!(e.rtr_read());
        assert_eq!(e.ord(), 8);

        let f = Frame::new_checked(&REPLY[..]).unwrap();
        assert_eq!(f.kind(), Some(FrameKind::Reply));
        assert!(f.markers() && f.crc() && f.rejected() && !f.enhanced());
        assert_eq!(f.rev(), 1);
        assert_eq!(f.private_data(), &[] as &[u8]);
    }

    #[test]
    fn test_construct() {
        let mut bytes = [0xa5u8; 27];
        let mut f = Frame::new_unchecked(&mut bytes[..]);
        f.set_kind(FrameKind::Request);
        f.set_markers(false);
        f.set_crc(true);
        f.set_rejected(false);
        f.set_enhanced(true);
        f.set_res(0);
        f.set_rev(2);
        f.set_pd_length(7);
        let pd = f.private_data_mut();
        let mut e = EnhancedData::new_unchecked(&mut pd[..4]);
        e.set_ird_word(true, false, 16);
        e.set_ord_word(true, true, 8);
        pd[4..].copy_from_slice(b"SDP");
        assert_eq!(bytes, REQUEST);
    }

    #[test]
    fn test_parse() {
        let f = Frame::new_checked(&REQUEST[..]).unwrap();
        assert_eq!(FrameRepr::parse(&f), Ok(request_repr()));
        let f = Frame::new_checked(&REPLY[..]).unwrap();
        assert_eq!(FrameRepr::parse(&f), Ok(reply_repr()));
        let e = EnhancedData::new_checked(&REQUEST[20..24]).unwrap();
        assert_eq!(EnhancedRepr::parse(&e), Ok(enhanced_repr()));
        assert_eq!(
            request_repr().split_private_data(),
            Ok((Some(enhanced_repr()), &b"SDP"[..]))
        );
        assert_eq!(reply_repr().split_private_data(), Ok((None, &[][..])));
    }

    #[test]
    fn test_emit() {
        assert_eq!(request_repr().to_vec().unwrap(), REQUEST);
        assert_eq!(reply_repr().to_vec().unwrap(), REPLY);
        assert_eq!(enhanced_repr().to_bytes().unwrap(), REQUEST[20..24]);
        // Emit clears Res and whatever the buffer held before.
        let mut bytes = [0xffu8; 20];
        reply_repr()
            .emit(&mut Frame::new_unchecked(&mut bytes[..]))
            .unwrap();
        assert_eq!(bytes, REPLY);
    }

    #[test]
    fn frame_len_from_header() {
        assert_eq!(Frame::<&[u8]>::frame_len(&REQUEST[..20]), Ok(27));
        assert_eq!(Frame::<&[u8]>::frame_len(&REPLY), Ok(20));
        // Extra bytes (the first FPDU) do not change the answer.
        let mut stream = REQUEST.to_vec();
        stream.extend_from_slice(&[0, 0x2a, 0x41, 0x43]);
        assert_eq!(Frame::<&[u8]>::frame_len(&stream), Ok(27));
        let f = Frame::new_checked(&stream[..]).unwrap();
        assert_eq!(FrameRepr::parse(&f), Ok(request_repr()));
        for len in 0..20 {
            assert_eq!(
                Frame::<&[u8]>::frame_len(&REQUEST[..len]),
                Err(Error::Truncated)
            );
        }
        let mut bad = REQUEST;
        bad[0] = b'm';
        assert_eq!(Frame::<&[u8]>::frame_len(&bad), Err(Error::BadKey));
        let mut long = REPLY;
        long[18..20].copy_from_slice(&513u16.to_be_bytes());
        assert_eq!(
            Frame::<&[u8]>::frame_len(&long),
            Err(Error::PrivateDataTooLong)
        );
        long[18..20].copy_from_slice(&512u16.to_be_bytes());
        assert_eq!(Frame::<&[u8]>::frame_len(&long), Ok(532));
    }

    #[test]
    fn every_prefix_is_truncated() {
        for len in 0..REQUEST.len() {
            assert_eq!(
                Frame::new_checked(&REQUEST[..len]).err(),
                Some(Error::Truncated),
                "len {len}"
            );
            let f = Frame::new_unchecked(&REQUEST[..len]);
            assert_eq!(FrameRepr::parse(&f), Err(Error::Truncated));
        }
        for len in 0..ENHANCED_LEN {
            assert_eq!(
                EnhancedData::new_checked(&REQUEST[20..20 + len]).err(),
                Some(Error::Truncated)
            );
            let e = EnhancedData::new_unchecked(&REQUEST[20..20 + len]);
            assert_eq!(EnhancedRepr::parse(&e), Err(Error::Truncated));
        }
        assert_eq!(
            TermCode::from(Error::Truncated),
            TermCode::MPA_INVALID_FRAME
        );
    }

    #[test]
    fn bad_key() {
        for i in 0..16 {
            let mut bytes = REQUEST;
            // (Not ^0x01: that turns "Req" into "Rep".)
            bytes[i] ^= 0x80;
            let f = Frame::new_checked(&bytes[..]).unwrap();
            assert_eq!(f.kind(), None);
            assert_eq!(FrameRepr::parse(&f), Err(Error::BadKey));
        }
        assert_eq!(TermCode::from(Error::BadKey), TermCode::MPA_INVALID_FRAME);
        assert_eq!(TermCode::from(Error::BadKey).code.0, 4);
    }

    #[test]
    fn private_data_too_long() {
        let mut bytes = vec![0u8; 20 + 513];
        bytes[..20].copy_from_slice(&REPLY);
        bytes[18..20].copy_from_slice(&513u16.to_be_bytes());
        let f = Frame::new_checked(&bytes[..]).unwrap();
        assert_eq!(FrameRepr::parse(&f), Err(Error::PrivateDataTooLong));
        assert_eq!(
            TermCode::from(Error::PrivateDataTooLong),
            TermCode::MPA_INVALID_FRAME
        );
        // 512 is fine.
        bytes[18..20].copy_from_slice(&512u16.to_be_bytes());
        let f = Frame::new_checked(&bytes[..]).unwrap();
        let repr = FrameRepr::parse(&f).unwrap();
        assert_eq!(repr.private_data.len(), 512);
        assert_eq!(repr.to_vec().unwrap(), bytes[..532]);
        // And emit refuses 513.
        let pd = [0u8; 513];
        let repr = FrameRepr {
            private_data: &pd,
            ..reply_repr()
        };
        let mut out = vec![0u8; repr.buffer_len()];
        assert_eq!(
            repr.emit(&mut Frame::new_unchecked(&mut out[..])),
            Err(Error::PrivateDataTooLong)
        );
    }

    #[test]
    fn enhanced_data_missing() {
        // S set, PD_Length 3.
        let mut bytes = REQUEST;
        bytes[19] = 3;
        let f = Frame::new_checked(&bytes[..]).unwrap();
        assert_eq!(FrameRepr::parse(&f), Err(Error::EnhancedDataMissing));
        assert_eq!(
            TermCode::from(Error::EnhancedDataMissing),
            TermCode::MPA_INVALID_FRAME
        );
        let repr = FrameRepr {
            private_data: b"SDP",
            ..request_repr()
        };
        assert_eq!(repr.to_vec(), Err(Error::EnhancedDataMissing));
    }

    #[test]
    fn emit_into_short_buffer() {
        let mut out = [0u8; 26];
        assert_eq!(
            request_repr().emit(&mut Frame::new_unchecked(&mut out[..])),
            Err(Error::Truncated)
        );
        let mut out = [0u8; 3];
        assert_eq!(
            enhanced_repr().emit(&mut EnhancedData::new_unchecked(&mut out[..])),
            Err(Error::Truncated)
        );
    }

    #[test]
    fn reserved_and_request_r_ignored_on_receive() {
        // Res bits set, R set in a Request: neither shows in the Repr.
        let mut bytes = REQUEST;
        bytes[16] |= 0x0f | 0x20;
        let f = Frame::new_checked(&bytes[..]).unwrap();
        assert_eq!(f.res(), 0x0f);
        assert!(f.rejected());
        assert_eq!(FrameRepr::parse(&f), Ok(request_repr()));
        // In a Reply, R is the Rejected Connection bit.
        let mut bytes = REPLY;
        bytes[16] &= !0x20;
        let f = Frame::new_checked(&bytes[..]).unwrap();
        assert!(!FrameRepr::parse(&f).unwrap().rejected);
    }

    #[test]
    fn unknown_rev_parses() {
        for rev in [0u8, 1, 2, 3, 0xff] {
            let mut bytes = REQUEST;
            bytes[17] = rev;
            let f = Frame::new_checked(&bytes[..]).unwrap();
            let repr = FrameRepr::parse(&f).unwrap();
            assert_eq!(repr.rev, rev);
            assert_eq!(repr.to_vec().unwrap(), bytes);
        }
    }

    #[test]
    fn enhanced_flags_ignored_without_a() {
        // A=0 with B, C, D set and IRD/ORD all ones.
        let bytes = [0x7f, 0xff, 0xff, 0xff];
        let e = EnhancedData::new_checked(&bytes[..]).unwrap();
        assert!(!e.peer_to_peer() && e.rtr_send() && e.rtr_write() && e.rtr_read());
        assert_eq!(
            EnhancedRepr::parse(&e),
            Ok(EnhancedRepr {
                peer_to_peer: false,
                rtr_send: false,
                rtr_write: false,
                rtr_read: false,
                ird: IRD_ORD_NO_NEGOTIATION,
                ord: IRD_ORD_NO_NEGOTIATION,
            })
        );
        let repr = EnhancedRepr {
            rtr_send: true,
            ..EnhancedRepr::default()
        };
        assert_eq!(repr.to_bytes(), Err(Error::RtrWithoutPeerToPeer));
        assert_eq!(
            TermCode::from(Error::RtrWithoutPeerToPeer),
            TermCode::MPA_LOCAL_CATASTROPHIC
        );
    }

    #[test]
    fn ird_ord_limits() {
        let max = EnhancedRepr {
            peer_to_peer: true,
            rtr_send: true,
            rtr_write: true,
            rtr_read: true,
            ird: IRD_ORD_NO_NEGOTIATION,
            ord: IRD_ORD_NO_NEGOTIATION,
        };
        assert_eq!(max.to_bytes(), Ok([0xff; 4]));
        for (ird, ord) in [(0x4000, 0), (0, 0x4000), (u16::MAX, 1)] {
            let repr = EnhancedRepr { ird, ord, ..max };
            assert_eq!(repr.to_bytes(), Err(Error::IrdOrdTooLarge));
        }
        assert_eq!(
            TermCode::from(Error::IrdOrdTooLarge),
            TermCode::MPA_LOCAL_CATASTROPHIC
        );
        let zero = EnhancedRepr::default();
        assert_eq!(zero.to_bytes(), Ok([0; 4]));
    }

    #[test]
    fn round_trip_all_flag_combinations() {
        let pd = {
            let mut pd = [0u8; 10];
            pd[..4].copy_from_slice(&enhanced_repr().to_bytes().unwrap());
            pd
        };
        for kind in [FrameKind::Request, FrameKind::Reply] {
            for bits in 0u8..16 {
                let repr = FrameRepr {
                    kind,
                    markers: bits & 1 != 0,
                    crc: bits & 2 != 0,
                    rejected: kind == FrameKind::Reply && bits & 4 != 0,
                    enhanced: bits & 8 != 0,
                    rev: if bits & 8 != 0 { REV_2 } else { REV_1 },
                    private_data: &pd,
                };
                let bytes = repr.to_vec().unwrap();
                let f = Frame::new_checked(&bytes[..]).unwrap();
                assert_eq!(FrameRepr::parse(&f), Ok(repr));
                assert_eq!(FrameRepr::parse(&f).unwrap().to_vec().unwrap(), bytes);
            }
        }
        for bits in 0u8..16 {
            let a = bits & 1 != 0;
            let repr = EnhancedRepr {
                peer_to_peer: a,
                rtr_send: a && bits & 2 != 0,
                rtr_write: a && bits & 4 != 0,
                rtr_read: a && bits & 8 != 0,
                ird: u16::from(bits) * 1000,
                ord: 0x3fff - u16::from(bits),
            };
            let bytes = repr.to_bytes().unwrap();
            let e = EnhancedData::new_checked(&bytes[..]).unwrap();
            assert_eq!(EnhancedRepr::parse(&e), Ok(repr));
        }
    }

    #[test]
    fn errors_display() {
        assert_eq!(
            Error::BadKey.to_string(),
            "MPA frame key is neither Request nor Reply"
        );
    }
}
