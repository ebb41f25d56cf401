//! DDP segment headers (RFC 5041 §4).
//!
//! * §4.1 the DDP Control Field: `T` (tagged), `L` (last), 4 reserved bits
//!   and `DV`, the 2-bit DDP version, which must be 1.
//! * §4.2 the Tagged Buffer Model header (14 bytes): control, one RsvdULP
//!   byte, STag, 64-bit Tagged Offset.
//! * §4.3 the Untagged Buffer Model header (18 bytes): control, RsvdULP
//!   (40 bits, carried here as its first byte plus a 32-bit word), Queue
//!   Number, Message Sequence Number, Message Offset.
//! * §4.4 a DDP Segment is the header followed by ULP payload, if any.
//!
//! RDMAP (RFC 5040 §4.1) owns the RsvdULP bits: its control byte is the
//! first RsvdULP byte of both formats, and the Invalidate STag of Send with
//! Invalidate is the 32-bit RsvdULP word of the untagged header. DDP itself
//! passes them through unmodified (§4.2, §4.3); see the `rdmap` module.
//!
//! This module only checks what makes a header a header: its length and its
//! version. Whether an STag, QN, MSN or MO is acceptable is decided by the
//! placement engine (§7.1), which reports the codes of §7.2 from
//! [`TermCode`]. [`to_end`] is the pure piece of the TO-wrap check.
//!
//! ```
//! use iwarp::wire::ddp::{BufferModel, DdpRepr, QueueNumber, Segment};
//!
//! // A last, untagged segment to QN 0, MSN 1, MO 0, carrying "hi".
//! let bytes = [
//!     0x41, 0x43, 0, 0, 0, 0, // control (L, DV=1), RsvdULP
//!     0, 0, 0, 0, // QN
//!     0, 0, 0, 1, // MSN
//!     0, 0, 0, 0, // MO
//!     b'h', b'i',
//! ];
//! let segment = Segment::new_checked(&bytes[..])?;
//! let repr = DdpRepr::parse(&segment)?;
//! assert!(repr.last);
//! assert_eq!(
//!     repr.model,
//!     BufferModel::Untagged { qn: QueueNumber::SEND, msn: 1, mo: 0, rsvd_ulp32: 0 }
//! );
//! assert_eq!(segment.payload(), b"hi");
//!
//! let mut out = [0u8; 18];
//! repr.emit(&mut Segment::new_unchecked(&mut out[..]));
//! assert_eq!(out, bytes[..18]);
//! # Ok::<(), iwarp::wire::ddp::Error>(())
//! ```

use core::fmt;

use super::term_code::TermCode;

/// The DDP version this implementation speaks (RFC 5041 §4.1, DV).
pub const VERSION: u8 = 1;

/// The first MSN of every queue (RFC 5041 §4.3: "The initial value for MSN
/// MUST be one."). MSNs then wrap modulo 2^32; see [`next_msn`].
pub const INITIAL_MSN: u32 = 1;

/// The MSN after `msn` on the same queue.
///
/// RFC 5041 §4.3: the MSN "MUST be increased by one (modulo 2^32) with each
/// DDP Message targeting the specific Queue Number", and "MUST wrap to 0
/// after a value of 0xFFFFFFFF".
pub const fn next_msn(msn: u32) -> u32 {
    msn.wrapping_add(1)
}

/// The Tagged Offset one past the last byte of a segment carrying `len`
/// payload bytes at `to`, or `None` if that sum wraps.
///
/// RFC 5041 §7.1, tagged check 5: "A 64-bit unsigned sum of the DDP Segment
/// payload length and the TO does not wrap." `None` is
/// [`TermCode::DDP_TO_WRAP`] for the caller. The same check guards the Data
/// Source TO plus RDMA Read Message Size (RFC 5040 §7.2, 4e).
pub const fn to_end(to: u64, len: u64) -> Option<u64> {
    to.checked_add(len)
}

/// A Steering Tag (RFC 5041 §4.2): names a Tagged Buffer at the Data Sink.
///
/// The RFCs treat the STag as opaque 32 bits. Like the iWARP and InfiniBand
/// verbs (the "rkey"/"lkey" of `ib_verbs`), this stack splits it into a
/// 24-bit *index* in the upper bits, which selects a memory region, and an
/// 8-bit *key* in the low bits, which changes each time the index is
/// reused, so that a stale STag held by the peer fails validation instead
/// of reaching newer memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Stag(pub u32);

impl Stag {
    /// The largest index ([`Stag::index`] has 24 bits).
    pub const MAX_INDEX: u32 = 0x00ff_ffff;

    /// Builds an STag from a region index (only its low 24 bits are kept)
    /// and a key.
    pub const fn from_parts(index: u32, key: u8) -> Stag {
        Stag(((index & Self::MAX_INDEX) << 8) | key as u32)
    }

    /// The upper 24 bits: which registered region.
    pub const fn index(self) -> u32 {
        self.0 >> 8
    }

    /// The low 8 bits: the consumer key of this registration.
    pub const fn key(self) -> u8 {
        // Truncation intended: the key is the low byte.
        (self.0 & 0xff) as u8
    }
}

impl fmt::Display for Stag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#010x}", self.0)
    }
}

/// A DDP Queue Number (RFC 5041 §4.3): selects the Data Sink's untagged
/// buffer queue.
///
/// RDMAP uses three queues (RFC 5040 §4.1 Figure 4; §5.2.1, §5.3, §5.4).
/// Any other value parses; it is the engine that answers it with
/// [`TermCode::DDP_INVALID_QN`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct QueueNumber(pub u32);

impl QueueNumber {
    /// Send, Send with Invalidate, Send with SE, Send with SE and Invalidate.
    pub const SEND: QueueNumber = QueueNumber(0);
    /// RDMA Read Request.
    pub const READ_REQUEST: QueueNumber = QueueNumber(1);
    /// Terminate.
    pub const TERMINATE: QueueNumber = QueueNumber(2);

    /// The RDMAP name of the queue, if RDMAP defines it.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::SEND => "Send",
            Self::READ_REQUEST => "RDMA Read Request",
            Self::TERMINATE => "Terminate",
            _ => return None,
        })
    }
}

impl fmt::Display for QueueNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{} ({name})", self.0),
            None => write!(f, "{}", self.0),
        }
    }
}

/// A DDP header that could not be decoded.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Fewer bytes than the header of the model the T bit names.
    Truncated,
    /// DV is not 1 (RFC 5041 §4.1). `tagged` is the segment's T bit, which
    /// picks the error type of RFC 5041 §7.2.
    Version { tagged: bool, version: u8 },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated => f.write_str("DDP segment shorter than its header"),
            Error::Version { tagged, version } => write!(
                f,
                "invalid DDP version {version} in {} segment",
                if *tagged { "tagged" } else { "untagged" }
            ),
        }
    }
}

impl std::error::Error for Error {}

impl From<Error> for TermCode {
    fn from(err: Error) -> TermCode {
        match err {
            // RFC 5041 §7.2 has no code for a segment too short to hold its
            // header. It is reported as DDP Local Catastrophic, the one DDP
            // error type whose Terminate does not echo the (here
            // incomplete) DDP header (RFC 5040 §4.8: "The DDP Header is not
            // present if the Terminate Error Type is a Local Catastrophic
            // Error").
            Error::Truncated => TermCode::DDP_LOCAL_CATASTROPHIC,
            // RFC 5041 §7.2: Invalid DDP version is 0x1/0x04 for tagged and
            // 0x2/0x06 for untagged segments.
            Error::Version { tagged: true, .. } => TermCode::DDP_TAGGED_INVALID_VERSION,
            Error::Version { tagged: false, .. } => TermCode::DDP_UNTAGGED_INVALID_VERSION,
        }
    }
}

mod field {
    use core::ops::Range;

    /// DDP Control Field (§4.1).
    pub const CONTROL: usize = 0;
    pub const T: u8 = 0x80;
    pub const L: u8 = 0x40;
    pub const RSVD: u8 = 0x3c;
    pub const DV: u8 = 0x03;
    /// First RsvdULP byte: the RDMAP control field.
    pub const RSVD_ULP: usize = 1;

    // Tagged (§4.2, Figure 4).
    pub const STAG: Range<usize> = 2..6;
    pub const TO: Range<usize> = 6..14;
    pub const TAGGED_LEN: usize = 14;

    // Untagged (§4.3, Figure 5).
    pub const RSVD_ULP32: Range<usize> = 2..6;
    pub const QN: Range<usize> = 6..10;
    pub const MSN: Range<usize> = 10..14;
    pub const MO: Range<usize> = 14..18;
    pub const UNTAGGED_LEN: usize = 18;
}

/// Length of the tagged header (RFC 5041 §4.2).
pub const TAGGED_HEADER_LEN: usize = field::TAGGED_LEN;
/// Length of the untagged header (RFC 5041 §4.3).
pub const UNTAGGED_HEADER_LEN: usize = field::UNTAGGED_LEN;

/// Header length for a segment whose T bit is `tagged`.
pub const fn header_len(tagged: bool) -> usize {
    if tagged {
        TAGGED_HEADER_LEN
    } else {
        UNTAGGED_HEADER_LEN
    }
}

/// A read/write view of a DDP Segment: header plus payload (RFC 5041 §4.4).
///
/// After [`Segment::new_checked`] the buffer holds at least the header that
/// its T bit names, so no getter panics. Getters of the *other* model's
/// fields (say [`Segment::mo`] on a tagged segment) read whatever bytes sit
/// at that position, or 0 past the end; they are meaningful only for the
/// model the T bit names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Segment<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> Segment<T> {
        Segment { buffer }
    }

    /// Wraps a buffer, checking that it holds a whole header.
    pub fn new_checked(buffer: T) -> Result<Segment<T>, Error> {
        let segment = Self::new_unchecked(buffer);
        segment.check_len()?;
        Ok(segment)
    }

    /// Checks that the buffer holds the header its T bit names.
    pub fn check_len(&self) -> Result<(), Error> {
        let data = self.buffer.as_ref();
        match data.first() {
            Some(&control) if data.len() >= header_len(control & field::T != 0) => Ok(()),
            _ => Err(Error::Truncated),
        }
    }

    /// Unwraps the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn byte(&self, index: usize) -> u8 {
        self.buffer.as_ref().get(index).copied().unwrap_or(0)
    }

    fn be_u32(&self, range: core::ops::Range<usize>) -> u32 {
        match self.buffer.as_ref().get(range) {
            Some(&[a, b, c, d]) => u32::from_be_bytes([a, b, c, d]),
            _ => 0,
        }
    }

    /// T: the segment targets a Tagged Buffer.
    pub fn tagged(&self) -> bool {
        self.byte(field::CONTROL) & field::T != 0
    }

    /// L: the last segment of its DDP Message.
    pub fn last(&self) -> bool {
        self.byte(field::CONTROL) & field::L != 0
    }

    /// The 4 reserved control bits (RFC 5041 §4.1: "not checked on
    /// receive").
    pub fn reserved(&self) -> u8 {
        (self.byte(field::CONTROL) & field::RSVD) >> 2
    }

    /// DV, the DDP version.
    pub fn version(&self) -> u8 {
        self.byte(field::CONTROL) & field::DV
    }

    /// The first RsvdULP byte (the RDMAP control field, RFC 5040 §4.1).
    pub fn rsvd_ulp(&self) -> u8 {
        self.byte(field::RSVD_ULP)
    }

    /// The header length for this segment's model.
    pub fn header_len(&self) -> usize {
        header_len(self.tagged())
    }

    /// STag (tagged).
    pub fn stag(&self) -> Stag {
        Stag(self.be_u32(field::STAG))
    }

    /// Tagged Offset (tagged).
    pub fn to(&self) -> u64 {
        match self.buffer.as_ref().get(field::TO) {
            Some(bytes) => {
                let mut be = [0u8; 8];
                be.copy_from_slice(bytes);
                u64::from_be_bytes(be)
            }
            None => 0,
        }
    }

    /// RsvdULP bits 8..39 (untagged): RDMAP's Invalidate STag.
    pub fn rsvd_ulp32(&self) -> u32 {
        self.be_u32(field::RSVD_ULP32)
    }

    /// Queue Number (untagged).
    pub fn qn(&self) -> QueueNumber {
        QueueNumber(self.be_u32(field::QN))
    }

    /// Message Sequence Number (untagged).
    pub fn msn(&self) -> u32 {
        self.be_u32(field::MSN)
    }

    /// Message Offset (untagged).
    pub fn mo(&self) -> u32 {
        self.be_u32(field::MO)
    }

    /// The header bytes (empty if the buffer is too short to hold them).
    pub fn header(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(..self.header_len())
            .unwrap_or_default()
    }

    /// The ULP payload after the header (RFC 5041 §4.4).
    pub fn payload(&self) -> &[u8] {
        self.buffer
            .as_ref()
            .get(self.header_len()..)
            .unwrap_or_default()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Segment<T> {
    fn set_control_bit(&mut self, mask: u8, value: bool) {
        let byte = &mut self.buffer.as_mut()[field::CONTROL];
        *byte = if value { *byte | mask } else { *byte & !mask };
    }

    /// Sets T. The buffer must be long enough for the model it selects.
    pub fn set_tagged(&mut self, value: bool) {
        self.set_control_bit(field::T, value)
    }

    /// Sets L.
    pub fn set_last(&mut self, value: bool) {
        self.set_control_bit(field::L, value)
    }

    /// Sets the reserved control bits (emit zero: RFC 5041 §4.1).
    pub fn set_reserved(&mut self, value: u8) {
        let byte = &mut self.buffer.as_mut()[field::CONTROL];
        *byte = (*byte & !field::RSVD) | ((value << 2) & field::RSVD);
    }

    /// Sets DV (low 2 bits of `value`).
    pub fn set_version(&mut self, value: u8) {
        let byte = &mut self.buffer.as_mut()[field::CONTROL];
        *byte = (*byte & !field::DV) | (value & field::DV);
    }

    /// Sets the first RsvdULP byte.
    pub fn set_rsvd_ulp(&mut self, value: u8) {
        self.buffer.as_mut()[field::RSVD_ULP] = value;
    }

    /// Sets the STag (tagged).
    pub fn set_stag(&mut self, value: Stag) {
        self.buffer.as_mut()[field::STAG].copy_from_slice(&value.0.to_be_bytes());
    }

    /// Sets the Tagged Offset (tagged).
    pub fn set_to(&mut self, value: u64) {
        self.buffer.as_mut()[field::TO].copy_from_slice(&value.to_be_bytes());
    }

    /// Sets RsvdULP bits 8..39 (untagged).
    pub fn set_rsvd_ulp32(&mut self, value: u32) {
        self.buffer.as_mut()[field::RSVD_ULP32].copy_from_slice(&value.to_be_bytes());
    }

    /// Sets the Queue Number (untagged).
    pub fn set_qn(&mut self, value: QueueNumber) {
        self.buffer.as_mut()[field::QN].copy_from_slice(&value.0.to_be_bytes());
    }

    /// Sets the Message Sequence Number (untagged).
    pub fn set_msn(&mut self, value: u32) {
        self.buffer.as_mut()[field::MSN].copy_from_slice(&value.to_be_bytes());
    }

    /// Sets the Message Offset (untagged).
    pub fn set_mo(&mut self, value: u32) {
        self.buffer.as_mut()[field::MO].copy_from_slice(&value.to_be_bytes());
    }

    /// The payload after the header, writable.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        self.buffer.as_mut().get_mut(start..).unwrap_or_default()
    }
}

/// Where a segment's payload goes: the buffer-model fields of the header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BufferModel {
    /// RFC 5041 §4.2: placed at Tagged Offset `to` of the buffer `stag`.
    Tagged { stag: Stag, to: u64 },
    /// RFC 5041 §4.3: placed at Message Offset `mo` of message `msn` on
    /// queue `qn`. MSNs start at [`INITIAL_MSN`] and wrap ([`next_msn`]).
    /// `rsvd_ulp32` is RsvdULP bits 8..39, opaque to DDP.
    Untagged {
        qn: QueueNumber,
        msn: u32,
        mo: u32,
        rsvd_ulp32: u32,
    },
}

impl BufferModel {
    /// The T bit for this model.
    pub const fn tagged(&self) -> bool {
        matches!(self, BufferModel::Tagged { .. })
    }
}

/// A decoded DDP header.
///
/// The four reserved control bits are not represented: RFC 5041 §4.1 says
/// they are "set to zero on transmit, and not checked on receive". DV is
/// not represented either: it is always [`VERSION`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DdpRepr {
    /// L: last segment of the DDP Message.
    pub last: bool,
    /// The first RsvdULP byte, passed through for the ULP (RDMAP's control
    /// field).
    pub rsvd_ulp: u8,
    /// The tagged or untagged fields.
    pub model: BufferModel,
}

impl DdpRepr {
    /// Decodes a checked segment's header.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(segment: &Segment<&T>) -> Result<DdpRepr, Error> {
        segment.check_len()?;
        let tagged = segment.tagged();
        // RFC 5041 §4.1: DV "MUST be set to one to indicate the version of
        // the specification described in this document."
        if segment.version() != VERSION {
            return Err(Error::Version {
                tagged,
                version: segment.version(),
            });
        }
        let model = if tagged {
            BufferModel::Tagged {
                stag: segment.stag(),
                to: segment.to(),
            }
        } else {
            BufferModel::Untagged {
                qn: segment.qn(),
                msn: segment.msn(),
                mo: segment.mo(),
                rsvd_ulp32: segment.rsvd_ulp32(),
            }
        };
        Ok(DdpRepr {
            last: segment.last(),
            rsvd_ulp: segment.rsvd_ulp(),
            model,
        })
    }

    /// The header length: 14 tagged, 18 untagged.
    pub const fn header_len(&self) -> usize {
        header_len(self.model.tagged())
    }

    /// Same as [`DdpRepr::header_len`]: the bytes [`DdpRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        self.header_len()
    }

    /// Writes the header into the first [`DdpRepr::header_len`] bytes of
    /// `segment` (the payload is the caller's). Panics if the buffer is
    /// shorter.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, segment: &mut Segment<&mut T>) {
        let control = match self.model {
            BufferModel::Tagged { .. } => field::T,
            BufferModel::Untagged { .. } => 0,
        } | if self.last { field::L } else { 0 }
            | VERSION;
        segment.buffer.as_mut()[field::CONTROL] = control;
        segment.set_rsvd_ulp(self.rsvd_ulp);
        match self.model {
            BufferModel::Tagged { stag, to } => {
                segment.set_stag(stag);
                segment.set_to(to);
            }
            BufferModel::Untagged {
                qn,
                msn,
                mo,
                rsvd_ulp32,
            } => {
                segment.set_rsvd_ulp32(rsvd_ulp32);
                segment.set_qn(qn);
                segment.set_msn(msn);
                segment.set_mo(mo);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Tagged, not last, DV 1; RsvdULP 0x40 (RDMA Write); STag 0x12345678;
    // TO 0x0000_0001_0000_4000; then 3 bytes of payload.
    static TAGGED: [u8; 17] = [
        0x81, 0x40, 0x12, 0x34, 0x56, 0x78, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x40, 0x00, 0xaa,
        0xbb, 0xcc,
    ];

    // Untagged, last, DV 1; RsvdULP 0x44 (Send with Invalidate); Invalidate
    // STag 0xcafe0001; QN 0; MSN 7; MO 0x5ca; one payload byte.
    static UNTAGGED: [u8; 19] = [
        0x41, 0x44, 0xca, 0xfe, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, 0x00,
        0x00, 0x05, 0xca, 0x99,
    ];

    fn tagged_repr() -> DdpRepr {
        DdpRepr {
            last: false,
            rsvd_ulp: 0x40,
            model: BufferModel::Tagged {
                stag: Stag(0x1234_5678),
                to: 0x0000_0001_0000_4000,
            },
        }
    }

    fn untagged_repr() -> DdpRepr {
        DdpRepr {
            last: true,
            rsvd_ulp: 0x44,
            model: BufferModel::Untagged {
                qn: QueueNumber::SEND,
                msn: 7,
                mo: 0x5ca,
                rsvd_ulp32: 0xcafe_0001,
            },
        }
    }

    #[test]
    fn test_deconstruct_tagged() {
        let segment = Segment::new_checked(&TAGGED[..]).unwrap();
        assert!(segment.tagged());
        assert!(!segment.last());
        assert_eq!(segment.reserved(), 0);
        assert_eq!(segment.version(), 1);
        assert_eq!(segment.rsvd_ulp(), 0x40);
        assert_eq!(segment.stag(), Stag(0x1234_5678));
        assert_eq!(segment.to(), 0x0000_0001_0000_4000);
        assert_eq!(segment.header_len(), 14);
        assert_eq!(segment.header(), &TAGGED[..14]);
        assert_eq!(segment.payload(), &[0xaa, 0xbb, 0xcc]);
    }

    #[test]
    fn test_deconstruct_untagged() {
        let segment = Segment::new_checked(&UNTAGGED[..]).unwrap();
        assert!(!segment.tagged());
        assert!(segment.last());
        assert_eq!(segment.version(), 1);
        assert_eq!(segment.rsvd_ulp(), 0x44);
        assert_eq!(segment.rsvd_ulp32(), 0xcafe_0001);
        assert_eq!(segment.qn(), QueueNumber::SEND);
        assert_eq!(segment.msn(), 7);
        assert_eq!(segment.mo(), 0x5ca);
        assert_eq!(segment.header_len(), 18);
        assert_eq!(segment.payload(), &[0x99]);
    }

    #[test]
    fn test_construct_tagged() {
        let mut bytes = [0u8; 17];
        let mut segment = Segment::new_unchecked(&mut bytes[..]);
        segment.set_tagged(true);
        segment.set_last(false);
        segment.set_reserved(0);
        segment.set_version(1);
        segment.set_rsvd_ulp(0x40);
        segment.set_stag(Stag(0x1234_5678));
        segment.set_to(0x0000_0001_0000_4000);
        segment.payload_mut().copy_from_slice(&[0xaa, 0xbb, 0xcc]);
        assert_eq!(bytes, TAGGED);
    }

    #[test]
    fn test_construct_untagged() {
        let mut bytes = [0u8; 19];
        let mut segment = Segment::new_unchecked(&mut bytes[..]);
        segment.set_tagged(false);
        segment.set_last(true);
        segment.set_version(1);
        segment.set_rsvd_ulp(0x44);
        segment.set_rsvd_ulp32(0xcafe_0001);
        segment.set_qn(QueueNumber::SEND);
        segment.set_msn(7);
        segment.set_mo(0x5ca);
        segment.payload_mut()[0] = 0x99;
        assert_eq!(bytes, UNTAGGED);
    }

    #[test]
    fn test_parse() {
        let tagged = Segment::new_checked(&TAGGED[..]).unwrap();
        assert_eq!(DdpRepr::parse(&tagged), Ok(tagged_repr()));
        let untagged = Segment::new_checked(&UNTAGGED[..]).unwrap();
        assert_eq!(DdpRepr::parse(&untagged), Ok(untagged_repr()));
    }

    #[test]
    fn test_emit() {
        let repr = tagged_repr();
        assert_eq!(repr.buffer_len(), 14);
        let mut bytes = [0u8; 14];
        repr.emit(&mut Segment::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, TAGGED[..14]);

        let repr = untagged_repr();
        assert_eq!(repr.buffer_len(), 18);
        let mut bytes = [0xffu8; 18];
        repr.emit(&mut Segment::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, UNTAGGED[..18]);
    }

    #[test]
    fn round_trip() {
        for bytes in [&TAGGED[..14], &UNTAGGED[..18]] {
            let repr = DdpRepr::parse(&Segment::new_checked(bytes).unwrap()).unwrap();
            let mut out = vec![0u8; repr.buffer_len()];
            repr.emit(&mut Segment::new_unchecked(&mut out[..]));
            assert_eq!(out, bytes);
        }
    }

    #[test]
    fn every_prefix_is_truncated() {
        for whole in [&TAGGED[..14], &UNTAGGED[..18]] {
            for len in 0..whole.len() {
                let prefix = &whole[..len];
                assert_eq!(
                    Segment::new_checked(prefix).err(),
                    Some(Error::Truncated),
                    "{len}"
                );
                assert_eq!(
                    DdpRepr::parse(&Segment::new_unchecked(prefix)),
                    Err(Error::Truncated)
                );
            }
        }
        // A tagged header is complete at 14 bytes; an untagged one is not.
        assert!(Segment::new_checked(&TAGGED[..14]).is_ok());
        assert_eq!(
            Segment::new_checked(&UNTAGGED[..14]).err(),
            Some(Error::Truncated)
        );
        assert_eq!(
            TermCode::from(Error::Truncated),
            TermCode::DDP_LOCAL_CATASTROPHIC
        );
    }

    #[test]
    fn version_is_checked() {
        for dv in [0u8, 2, 3] {
            let mut tagged = TAGGED;
            tagged[0] = 0x80 | dv;
            let err = DdpRepr::parse(&Segment::new_checked(&tagged[..]).unwrap()).unwrap_err();
            assert_eq!(
                err,
                Error::Version {
                    tagged: true,
                    version: dv
                }
            );
            assert_eq!(TermCode::from(err), TermCode::DDP_TAGGED_INVALID_VERSION);
            assert_eq!(
                TermCode::from(err),
                TermCode {
                    layer: super::super::terminate::Layer(1),
                    etype: super::super::terminate::EType(1),
                    code: super::super::terminate::ErrorCode(4),
                }
            );

            let mut untagged = UNTAGGED;
            untagged[0] = 0x40 | dv;
            let err = DdpRepr::parse(&Segment::new_checked(&untagged[..]).unwrap()).unwrap_err();
            assert_eq!(
                err,
                Error::Version {
                    tagged: false,
                    version: dv
                }
            );
            assert_eq!(TermCode::from(err), TermCode::DDP_UNTAGGED_INVALID_VERSION);
            assert_eq!(
                TermCode::from(err),
                TermCode {
                    layer: super::super::terminate::Layer(1),
                    etype: super::super::terminate::EType(2),
                    code: super::super::terminate::ErrorCode(6),
                }
            );
        }
    }

    #[test]
    fn reserved_bits_are_ignored_and_emitted_zero() {
        let mut bytes = TAGGED;
        bytes[0] |= 0x3c;
        let segment = Segment::new_checked(&bytes[..]).unwrap();
        assert_eq!(segment.reserved(), 0xf);
        assert_eq!(DdpRepr::parse(&segment), Ok(tagged_repr()));
        let mut out = [0u8; 14];
        tagged_repr().emit(&mut Segment::new_unchecked(&mut out[..]));
        assert_eq!(out[0], 0x81);
    }

    #[test]
    fn other_model_getters_do_not_panic() {
        let segment = Segment::new_checked(&TAGGED[..14]).unwrap();
        assert_eq!(segment.mo(), 0);
        assert_eq!(segment.payload(), &[] as &[u8]);
        let empty = Segment::new_unchecked(&[][..]);
        assert!(!empty.tagged());
        assert_eq!(empty.header(), &[] as &[u8]);
        assert_eq!(empty.payload(), &[] as &[u8]);
        assert_eq!(empty.to(), 0);
    }

    #[test]
    fn unknown_queue_numbers_parse() {
        let mut bytes = UNTAGGED;
        bytes[6..10].copy_from_slice(&0xdead_beefu32.to_be_bytes());
        let repr = DdpRepr::parse(&Segment::new_checked(&bytes[..]).unwrap()).unwrap();
        assert!(matches!(
            repr.model,
            BufferModel::Untagged {
                qn: QueueNumber(0xdead_beef),
                ..
            }
        ));
        assert_eq!(QueueNumber(0xdead_beef).name(), None);
        assert_eq!(QueueNumber::TERMINATE.to_string(), "2 (Terminate)");
    }

    #[test]
    fn stag_parts() {
        let stag = Stag(0x1234_5678);
        assert_eq!(stag.index(), 0x12_3456);
        assert_eq!(stag.key(), 0x78);
        assert_eq!(Stag::from_parts(0x12_3456, 0x78), stag);
        assert_eq!(Stag::from_parts(0xff12_3456, 0x78), stag);
        assert_eq!(Stag::from_parts(Stag::MAX_INDEX, 0xff), Stag(u32::MAX));
        assert_eq!(stag.to_string(), "0x12345678");
    }

    #[test]
    fn msn_wraps() {
        assert_eq!(INITIAL_MSN, 1);
        assert_eq!(next_msn(1), 2);
        assert_eq!(next_msn(0xffff_ffff), 0);
    }

    #[test]
    fn to_wrap() {
        assert_eq!(to_end(0x4000, 0x100), Some(0x4100));
        assert_eq!(to_end(u64::MAX - 10, 10), Some(u64::MAX));
        // The 64-bit sum itself must not wrap (RFC 5041 §7.1 check 5), so a
        // segment ending exactly at 2^64 is a TO wrap.
        assert_eq!(to_end(u64::MAX - 9, 10), None);
        assert_eq!(to_end(u64::MAX, 0), Some(u64::MAX));
    }
}
