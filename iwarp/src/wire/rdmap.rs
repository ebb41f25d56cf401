//! RDMAP message headers (RFC 5040 §4).
//!
//! * §4.1 the RDMAP Control Field, carried in the first DDP RsvdULP byte
//!   (RV, 2 bits, Rsv, 2 bits, Opcode, 4 bits), and the Invalidate STag in
//!   the 32-bit untagged RsvdULP word; Figure 4 fixes, per opcode, the
//!   Tagged flag and the Queue Number.
//! * §4.2 which messages carry an RDMAP header of their own: the RDMA Read
//!   Request (§4.4, 28 bytes, here) and the Terminate (§4.8, in the
//!   `terminate` module).
//!
//! [`RdmapRepr`] decodes one DDP Segment's worth of headers: the DDP header
//! (via [`super::ddp`]), the RDMAP control field and, for an RDMA Read
//! Request, the Read Request header; [`RdmapRepr::buffer_len`] is where the
//! payload starts. For a Terminate the payload is the Terminate header,
//! decoded by `terminate::TerminateRepr`.
//!
//! Unknown opcodes (8 to 15, "Reserved ... Not Specified") parse as values;
//! the engine rejects them with [`TermCode::RDMAP_UNEXPECTED_OPCODE`]
//! (RFC 5040 §7.2: "The RDMA OpCode MUST be valid"). The parser itself
//! rejects only what leaves the headers undecodable or self-contradictory;
//! see [`Error`].
//!
//! ```
//! use iwarp::wire::ddp::{BufferModel, QueueNumber, Stag};
//! use iwarp::wire::rdmap::{Opcode, RdmapRepr, ReadRequestRepr};
//!
//! let repr = RdmapRepr {
//!     opcode: Opcode::RDMA_READ_REQUEST,
//!     last: true,
//!     model: BufferModel::Untagged { qn: QueueNumber::READ_REQUEST, msn: 1, mo: 0, rsvd_ulp32: 0 },
//!     read_request: Some(ReadRequestRepr {
//!         sink_stag: Stag(0x100),
//!         sink_to: 0,
//!         size: 4096,
//!         src_stag: Stag(0x200),
//!         src_to: 0x8000,
//!     }),
//! };
//! let mut bytes = vec![0u8; repr.buffer_len()];
//! repr.emit(&mut bytes);
//! assert_eq!(bytes.len(), 18 + 28);
//! assert_eq!(&bytes[..2], &[0x41, 0x41]); // untagged, last, DV 1; RV 1, opcode 1
//!
//! let (parsed, payload_offset) = RdmapRepr::parse_bytes(&bytes)?;
//! assert_eq!(parsed, repr);
//! assert_eq!(payload_offset, 46);
//! # Ok::<(), iwarp::wire::rdmap::Error>(())
//! ```

use core::fmt;

use super::ddp::{self, BufferModel, DdpRepr, QueueNumber, Segment, Stag};
use super::term_code::TermCode;

/// The RDMAP version this implementation speaks (RFC 5040 §4.1, RV).
pub const VERSION: u8 = 1;

/// An RDMA Message opcode (RFC 5040 §4.1 Figure 4, 4 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

impl Opcode {
    pub const RDMA_WRITE: Opcode = Opcode(0x0);
    pub const RDMA_READ_REQUEST: Opcode = Opcode(0x1);
    pub const RDMA_READ_RESPONSE: Opcode = Opcode(0x2);
    pub const SEND: Opcode = Opcode(0x3);
    pub const SEND_INVALIDATE: Opcode = Opcode(0x4);
    pub const SEND_SE: Opcode = Opcode(0x5);
    pub const SEND_SE_INVALIDATE: Opcode = Opcode(0x6);
    pub const TERMINATE: Opcode = Opcode(0x7);

    /// The message type name of Figure 4, or `None` for reserved values.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::RDMA_WRITE => "RDMA Write",
            Self::RDMA_READ_REQUEST => "RDMA Read Request",
            Self::RDMA_READ_RESPONSE => "RDMA Read Response",
            Self::SEND => "Send",
            Self::SEND_INVALIDATE => "Send with Invalidate",
            Self::SEND_SE => "Send with Solicited Event",
            Self::SEND_SE_INVALIDATE => "Send with Solicited Event and Invalidate",
            Self::TERMINATE => "Terminate",
            _ => return None,
        })
    }

    /// Whether RFC 5040 defines this opcode (0 to 7).
    pub fn is_known(self) -> bool {
        self.0 <= Self::TERMINATE.0
    }

    /// The Tagged flag Figure 4 requires, or `None` for reserved opcodes.
    pub fn tagged(self) -> Option<bool> {
        match self {
            Self::RDMA_WRITE | Self::RDMA_READ_RESPONSE => Some(true),
            _ if self.is_known() => Some(false),
            _ => None,
        }
    }

    /// The Queue Number Figure 4 requires, or `None` for tagged and
    /// reserved opcodes.
    pub fn queue(self) -> Option<QueueNumber> {
        match self {
            Self::RDMA_READ_REQUEST => Some(QueueNumber::READ_REQUEST),
            Self::TERMINATE => Some(QueueNumber::TERMINATE),
            Self::SEND | Self::SEND_INVALIDATE | Self::SEND_SE | Self::SEND_SE_INVALIDATE => {
                Some(QueueNumber::SEND)
            }
            _ => None,
        }
    }

    /// Whether the message carries an Invalidate STag in the untagged
    /// RsvdULP word (RFC 5040 §4.1, Figure 4).
    pub fn has_invalidate_stag(self) -> bool {
        matches!(self, Self::SEND_INVALIDATE | Self::SEND_SE_INVALIDATE)
    }

    /// Whether the message asks for a Solicited Event (RFC 5040 §5.3).
    pub fn solicited_event(self) -> bool {
        matches!(self, Self::SEND_SE | Self::SEND_SE_INVALIDATE)
    }

    /// Whether the message is one of the four Send types.
    pub fn is_send(self) -> bool {
        self.queue() == Some(QueueNumber::SEND)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "reserved opcode {:#x}", self.0),
        }
    }
}

/// An RDMAP header that could not be decoded.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// The DDP header is truncated or has the wrong version.
    Ddp(ddp::Error),
    /// An RDMA Read Request segment too short for the 28-byte Read Request
    /// header (RFC 5040 §4.4).
    Truncated,
    /// RV is not 1 (RFC 5040 §4.1).
    Version(u8),
    /// A defined opcode in a segment whose T bit contradicts Figure 4.
    TaggedMismatch { opcode: Opcode, tagged: bool },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Ddp(err) => err.fmt(f),
            Error::Truncated => f.write_str("RDMA Read Request header truncated"),
            Error::Version(rv) => write!(f, "invalid RDMAP version {rv}"),
            Error::TaggedMismatch { opcode, tagged } => write!(
                f,
                "{opcode} in a{} segment",
                if *tagged { " tagged" } else { "n untagged" }
            ),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Ddp(err) => Some(err),
            _ => None,
        }
    }
}

impl From<ddp::Error> for Error {
    fn from(err: ddp::Error) -> Error {
        Error::Ddp(err)
    }
}

impl From<Error> for TermCode {
    fn from(err: Error) -> TermCode {
        match err {
            Error::Ddp(err) => err.into(),
            // RFC 5040 §7.2 lists no check for a short Read Request; the
            // header "MUST be used for all RDMA Read Request Messages"
            // (§4.4), so its absence is a Remote Operation Error, and no
            // named code fits: Unspecified (Figure 9, 0x2/0xFF).
            Error::Truncated => TermCode::RDMAP_OP_UNSPECIFIED,
            // RFC 5040 §7.2: "The RDMA Version MUST be valid." Figure 9:
            // Remote Operation Error, Invalid RDMAP version.
            Error::Version(_) => TermCode::RDMAP_INVALID_VERSION,
            // RFC 5040 §4.1: Figure 4 "MUST be used to define the value of
            // the Tagged flag" for each opcode; §7.2: "The RDMA OpCode MUST
            // be valid". An opcode arriving in the wrong buffer model is
            // not a valid opcode for that segment: Unexpected OpCode.
            Error::TaggedMismatch { .. } => TermCode::RDMAP_UNEXPECTED_OPCODE,
        }
    }
}

mod control {
    /// RV: bits 24-25 of the DDP/RDMAP word, the top of the RsvdULP byte.
    pub const RV_SHIFT: u8 = 6;
    /// Rsv: bits 26-27, "MUST be set to zero by sender, ignored by the
    /// receiver".
    pub const RSV: u8 = 0x30;
    /// Opcode: bits 28-31.
    pub const OPCODE: u8 = 0x0f;
}

/// The RDMAP control byte (RV = 1, Rsv = 0) for `opcode`.
pub const fn control_byte(opcode: Opcode) -> u8 {
    (VERSION << control::RV_SHIFT) | (opcode.0 & control::OPCODE)
}

/// RV of an RDMAP control byte.
pub const fn control_version(byte: u8) -> u8 {
    byte >> control::RV_SHIFT
}

/// The reserved bits of an RDMAP control byte.
pub const fn control_reserved(byte: u8) -> u8 {
    (byte & control::RSV) >> 4
}

/// The opcode of an RDMAP control byte.
pub const fn control_opcode(byte: u8) -> Opcode {
    Opcode(byte & control::OPCODE)
}

mod field {
    use core::ops::Range;

    pub const SINK_STAG: Range<usize> = 0..4;
    pub const SINK_TO: Range<usize> = 4..12;
    pub const SIZE: Range<usize> = 12..16;
    pub const SRC_STAG: Range<usize> = 16..20;
    pub const SRC_TO: Range<usize> = 20..28;
    pub const LEN: usize = 28;
}

/// Length of the RDMA Read Request header (RFC 5040 §4.4, 224 bits).
pub const READ_REQUEST_LEN: usize = field::LEN;

/// A read/write view of an RDMA Read Request header (RFC 5040 §4.4,
/// Figure 6). The same 28 bytes are the Terminated RDMA Header of a
/// Terminate (§4.8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest<T: AsRef<[u8]>> {
    buffer: T,
}

fn be_u32(bytes: &[u8], range: core::ops::Range<usize>) -> u32 {
    match bytes.get(range) {
        Some(&[a, b, c, d]) => u32::from_be_bytes([a, b, c, d]),
        _ => 0,
    }
}

fn be_u64(bytes: &[u8], range: core::ops::Range<usize>) -> u64 {
    match bytes.get(range) {
        Some(&[a, b, c, d, e, f, g, h]) => u64::from_be_bytes([a, b, c, d, e, f, g, h]),
        _ => 0,
    }
}

impl<T: AsRef<[u8]>> ReadRequest<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> ReadRequest<T> {
        ReadRequest { buffer }
    }

    /// Wraps a buffer, checking that it holds the 28-byte header.
    pub fn new_checked(buffer: T) -> Result<ReadRequest<T>, Error> {
        let header = Self::new_unchecked(buffer);
        header.check_len()?;
        Ok(header)
    }

    /// Checks that the buffer holds the whole header.
    pub fn check_len(&self) -> Result<(), Error> {
        if self.buffer.as_ref().len() < field::LEN {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Unwraps the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Data Sink STag: copied into the RDMA Read Response.
    pub fn sink_stag(&self) -> Stag {
        Stag(be_u32(self.buffer.as_ref(), field::SINK_STAG))
    }

    /// Data Sink Tagged Offset.
    pub fn sink_to(&self) -> u64 {
        be_u64(self.buffer.as_ref(), field::SINK_TO)
    }

    /// RDMA Read Message Size, in octets (0 to 2^32-1).
    pub fn size(&self) -> u32 {
        be_u32(self.buffer.as_ref(), field::SIZE)
    }

    /// Data Source STag.
    pub fn src_stag(&self) -> Stag {
        Stag(be_u32(self.buffer.as_ref(), field::SRC_STAG))
    }

    /// Data Source Tagged Offset.
    pub fn src_to(&self) -> u64 {
        be_u64(self.buffer.as_ref(), field::SRC_TO)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> ReadRequest<T> {
    /// Sets the Data Sink STag.
    pub fn set_sink_stag(&mut self, value: Stag) {
        self.buffer.as_mut()[field::SINK_STAG].copy_from_slice(&value.0.to_be_bytes());
    }

    /// Sets the Data Sink Tagged Offset.
    pub fn set_sink_to(&mut self, value: u64) {
        self.buffer.as_mut()[field::SINK_TO].copy_from_slice(&value.to_be_bytes());
    }

    /// Sets the RDMA Read Message Size.
    pub fn set_size(&mut self, value: u32) {
        self.buffer.as_mut()[field::SIZE].copy_from_slice(&value.to_be_bytes());
    }

    /// Sets the Data Source STag.
    pub fn set_src_stag(&mut self, value: Stag) {
        self.buffer.as_mut()[field::SRC_STAG].copy_from_slice(&value.0.to_be_bytes());
    }

    /// Sets the Data Source Tagged Offset.
    pub fn set_src_to(&mut self, value: u64) {
        self.buffer.as_mut()[field::SRC_TO].copy_from_slice(&value.to_be_bytes());
    }
}

/// A decoded RDMA Read Request header (RFC 5040 §4.4).
///
/// Validation belongs to the Data Source engine (§5.2.1, §7.2): for a
/// non-zero `size` it checks `src_stag` and `src_to` (with
/// [`ddp::to_end`] for the wrap); for a zero `size` it "MUST NOT validate"
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct ReadRequestRepr {
    pub sink_stag: Stag,
    pub sink_to: u64,
    pub size: u32,
    pub src_stag: Stag,
    pub src_to: u64,
}

impl ReadRequestRepr {
    /// Decodes a Read Request header.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        header: &ReadRequest<&T>,
    ) -> Result<ReadRequestRepr, Error> {
        header.check_len()?;
        Ok(ReadRequestRepr {
            sink_stag: header.sink_stag(),
            sink_to: header.sink_to(),
            size: header.size(),
            src_stag: header.src_stag(),
            src_to: header.src_to(),
        })
    }

    /// Always [`READ_REQUEST_LEN`].
    pub const fn buffer_len(&self) -> usize {
        READ_REQUEST_LEN
    }

    /// Writes the header into the first 28 bytes of `header`. Panics if the
    /// buffer is shorter.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(&self, header: &mut ReadRequest<&mut T>) {
        header.set_sink_stag(self.sink_stag);
        header.set_sink_to(self.sink_to);
        header.set_size(self.size);
        header.set_src_stag(self.src_stag);
        header.set_src_to(self.src_to);
    }
}

/// Zeroes the untagged RsvdULP word where RFC 5040 §4.1 makes it ignored:
/// for Send, Send with SE, RDMA Read Request and Terminate "the Invalidate
/// STag field MUST be set to zero on transmit and ignored by the receiver."
fn normalise(opcode: Opcode, model: BufferModel) -> BufferModel {
    match model {
        BufferModel::Untagged { qn, msn, mo, .. }
            if opcode.is_known() && !opcode.has_invalidate_stag() =>
        {
            BufferModel::Untagged {
                qn,
                msn,
                mo,
                rsvd_ulp32: 0,
            }
        }
        model => model,
    }
}

/// The headers of one RDMAP DDP Segment: DDP header, RDMAP control field
/// and, for an RDMA Read Request, the Read Request header.
///
/// Not represented, because the RFCs make them "ignored on receive":
/// the DDP reserved control bits (RFC 5041 §4.1), the RDMAP Rsv bits and,
/// for the defined opcodes without an Invalidate STag (Send, Send with SE,
/// RDMA Read Request, Terminate), the untagged RsvdULP word, which "MUST be
/// set to zero on transmit and ignored by the receiver" (RFC 5040 §4.1):
/// [`RdmapRepr::parse`] reports it as 0 and [`RdmapRepr::emit`] writes 0.
/// For Send with Invalidate and Send with SE and Invalidate that word is
/// the Invalidate STag ([`RdmapRepr::invalidate_stag`]); for reserved
/// untagged opcodes it is passed through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RdmapRepr {
    /// The RDMA opcode.
    pub opcode: Opcode,
    /// DDP L: last segment of the message.
    pub last: bool,
    /// The DDP buffer-model fields (STag/TO, or QN/MSN/MO).
    pub model: BufferModel,
    /// The Read Request header; `Some` exactly for untagged RDMA Read
    /// Requests when parsed. It is read from the segment's first bytes
    /// after the DDP header: a Read Request is one segment (MO 0, L set)
    /// in every implementation, and the engine rejects one that is not.
    pub read_request: Option<ReadRequestRepr>,
}

impl RdmapRepr {
    /// Decodes the headers of a checked DDP segment.
    ///
    /// Checks, in order: the DDP header is complete and DV is 1; RV is 1;
    /// a defined opcode has the T bit of Figure 4; a Read Request holds its
    /// 28-byte header. Everything else (reserved opcodes, QN, MSN, MO,
    /// STag, TO, L, payload length) is for the engine.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(segment: &Segment<&T>) -> Result<RdmapRepr, Error> {
        let ddp = DdpRepr::parse(segment)?;
        let rv = control_version(ddp.rsvd_ulp);
        // RFC 5040 §4.1: RV is "01b for an RNIC that complies with this
        // RDMA protocol specification"; 00b marks the pre-IETF RDMA
        // Consortium protocol, which only runs over MPA as negotiated
        // before RFC 5044. We speak MPA Rev 1/2 only, so anything but 1 is
        // an invalid version (§7.2: "The RDMA Version MUST be valid").
        if rv != VERSION {
            return Err(Error::Version(rv));
        }
        let opcode = control_opcode(ddp.rsvd_ulp);
        let tagged = ddp.model.tagged();
        // RFC 5040 §4.1: Figure 4 "MUST be used to define the value of the
        // Tagged flag" of each RDMA Message.
        if let Some(expected) = opcode.tagged() {
            if expected != tagged {
                return Err(Error::TaggedMismatch { opcode, tagged });
            }
        }
        let model = normalise(opcode, ddp.model);
        let read_request = if opcode == Opcode::RDMA_READ_REQUEST {
            // RFC 5040 §4.4: "The RDMA Read Request Header immediately
            // follows the DDP header."
            let header = ReadRequest::new_checked(segment.payload())?;
            Some(ReadRequestRepr::parse(&header)?)
        } else {
            None
        };
        Ok(RdmapRepr {
            opcode,
            last: ddp.last,
            model,
            read_request,
        })
    }

    /// Decodes the headers at the start of a DDP segment; returns them and
    /// the offset of the ULP payload (for a Terminate, of its Terminate
    /// header).
    pub fn parse_bytes(segment: &[u8]) -> Result<(RdmapRepr, usize), Error> {
        let segment = Segment::new_checked(segment)?;
        let repr = RdmapRepr::parse(&segment)?;
        Ok((repr, repr.buffer_len()))
    }

    /// The Invalidate STag of Send with Invalidate and Send with SE and
    /// Invalidate (RFC 5040 §4.1).
    pub fn invalidate_stag(&self) -> Option<Stag> {
        match self.model {
            BufferModel::Untagged { rsvd_ulp32, .. } if self.opcode.has_invalidate_stag() => {
                Some(Stag(rsvd_ulp32))
            }
            _ => None,
        }
    }

    /// The DDP header this segment carries.
    pub fn ddp(&self) -> DdpRepr {
        DdpRepr {
            last: self.last,
            rsvd_ulp: control_byte(self.opcode),
            model: normalise(self.opcode, self.model),
        }
    }

    /// Header bytes: DDP header plus Read Request header if any. This is
    /// the payload offset.
    pub fn buffer_len(&self) -> usize {
        self.ddp().header_len() + self.read_request.map_or(0, |rr| rr.buffer_len())
    }

    /// Writes the headers into the first [`RdmapRepr::buffer_len`] bytes of
    /// `buffer`. Panics if it is shorter.
    pub fn emit(&self, buffer: &mut [u8]) {
        let ddp = self.ddp();
        let (header, rest) = buffer.split_at_mut(ddp.header_len());
        ddp.emit(&mut Segment::new_unchecked(header));
        if let Some(rr) = self.read_request {
            rr.emit(&mut ReadRequest::new_unchecked(rest));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::terminate::{EType, ErrorCode, Layer};

    static READ_REQUEST: [u8; 46] = [
        // DDP: untagged, last, DV 1; RDMAP: RV 1, opcode 1.
        0x41, 0x41, //
        0x00, 0x00, 0x00, 0x00, // RsvdULP (zero)
        0x00, 0x00, 0x00, 0x01, // QN 1
        0x00, 0x00, 0x00, 0x05, // MSN 5
        0x00, 0x00, 0x00, 0x00, // MO 0
        // Read Request header.
        0x00, 0x01, 0x02, 0x03, // sink STag
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x00, // sink TO 0x1000
        0x00, 0x01, 0x00, 0x00, // size 65536
        0x0a, 0x0b, 0x0c, 0x0d, // source STag
        0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, // source TO
    ];

    fn read_request_repr() -> ReadRequestRepr {
        ReadRequestRepr {
            sink_stag: Stag(0x0001_0203),
            sink_to: 0x1000,
            size: 0x1_0000,
            src_stag: Stag(0x0a0b_0c0d),
            src_to: 0xffff_ffff_0000_0000,
        }
    }

    fn untagged(qn: QueueNumber, msn: u32, mo: u32, rsvd_ulp32: u32) -> BufferModel {
        BufferModel::Untagged {
            qn,
            msn,
            mo,
            rsvd_ulp32,
        }
    }

    /// One literal segment header per opcode, with its expected Repr.
    fn every_opcode() -> Vec<(Vec<u8>, RdmapRepr)> {
        let tagged = BufferModel::Tagged {
            stag: Stag(0x1122_3344),
            to: 0x0102_0304_0506_0708,
        };
        let tagged_bytes = [
            0x11, 0x22, 0x33, 0x44, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08,
        ];
        let mut v = Vec::new();
        // RDMA Write, not last.
        let mut b = vec![0x81, 0x40];
        b.extend_from_slice(&tagged_bytes);
        v.push((
            b,
            RdmapRepr {
                opcode: Opcode::RDMA_WRITE,
                last: false,
                model: tagged,
                read_request: None,
            },
        ));
        // RDMA Read Request.
        v.push((
            READ_REQUEST.to_vec(),
            RdmapRepr {
                opcode: Opcode::RDMA_READ_REQUEST,
                last: true,
                model: untagged(QueueNumber::READ_REQUEST, 5, 0, 0),
                read_request: Some(read_request_repr()),
            },
        ));
        // RDMA Read Response, last.
        let mut b = vec![0xc1, 0x42];
        b.extend_from_slice(&tagged_bytes);
        v.push((
            b,
            RdmapRepr {
                opcode: Opcode::RDMA_READ_RESPONSE,
                last: true,
                model: tagged,
                read_request: None,
            },
        ));
        // Sends: QN 0, MSN 1, MO 0x100.
        let sends = [
            (0x43, Opcode::SEND, 0),
            (0x44, Opcode::SEND_INVALIDATE, 0xdead_beef),
            (0x45, Opcode::SEND_SE, 0),
            (0x46, Opcode::SEND_SE_INVALIDATE, 0x0000_1201),
        ];
        for (control, opcode, inval) in sends {
            let mut b = vec![0x41, control];
            b.extend_from_slice(&u32::to_be_bytes(inval));
            b.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 1, 0]);
            v.push((
                b,
                RdmapRepr {
                    opcode,
                    last: true,
                    model: untagged(QueueNumber::SEND, 1, 0x100, inval),
                    read_request: None,
                },
            ));
        }
        // Terminate: QN 2, MSN 1, MO 0.
        v.push((
            vec![0x41, 0x47, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 1, 0, 0, 0, 0],
            RdmapRepr {
                opcode: Opcode::TERMINATE,
                last: true,
                model: untagged(QueueNumber::TERMINATE, 1, 0, 0),
                read_request: None,
            },
        ));
        v
    }

    #[test]
    fn test_deconstruct() {
        let header = ReadRequest::new_checked(&READ_REQUEST[18..]).unwrap();
        assert_eq!(header.sink_stag(), Stag(0x0001_0203));
        assert_eq!(header.sink_to(), 0x1000);
        assert_eq!(header.size(), 0x1_0000);
        assert_eq!(header.src_stag(), Stag(0x0a0b_0c0d));
        assert_eq!(header.src_to(), 0xffff_ffff_0000_0000);

        let control = READ_REQUEST[1];
        assert_eq!(control_version(control), 1);
        assert_eq!(control_reserved(control), 0);
        assert_eq!(control_opcode(control), Opcode::RDMA_READ_REQUEST);
    }

    #[test]
    fn test_construct() {
        let mut bytes = [0u8; 28];
        let mut header = ReadRequest::new_unchecked(&mut bytes[..]);
        header.set_sink_stag(Stag(0x0001_0203));
        header.set_sink_to(0x1000);
        header.set_size(0x1_0000);
        header.set_src_stag(Stag(0x0a0b_0c0d));
        header.set_src_to(0xffff_ffff_0000_0000);
        assert_eq!(bytes, READ_REQUEST[18..]);
        assert_eq!(control_byte(Opcode::RDMA_READ_REQUEST), 0x41);
        assert_eq!(control_byte(Opcode::TERMINATE), 0x47);
        assert_eq!(control_byte(Opcode(0x1f)), 0x4f);
    }

    #[test]
    fn test_parse() {
        let header = ReadRequest::new_checked(&READ_REQUEST[18..]).unwrap();
        assert_eq!(ReadRequestRepr::parse(&header), Ok(read_request_repr()));
        for (bytes, repr) in every_opcode() {
            let segment = Segment::new_checked(&bytes[..]).unwrap();
            assert_eq!(RdmapRepr::parse(&segment), Ok(repr), "{}", repr.opcode);
            assert_eq!(
                RdmapRepr::parse_bytes(&bytes),
                Ok((repr, bytes.len())),
                "{}",
                repr.opcode
            );
        }
    }

    #[test]
    fn test_emit() {
        let mut bytes = [0u8; 28];
        read_request_repr().emit(&mut ReadRequest::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, READ_REQUEST[18..]);
        for (bytes, repr) in every_opcode() {
            assert_eq!(repr.buffer_len(), bytes.len());
            let mut out = vec![0xa5; bytes.len()];
            repr.emit(&mut out);
            assert_eq!(out, bytes, "{}", repr.opcode);
        }
    }

    #[test]
    fn payload_offset() {
        let (bytes, _) = &every_opcode()[3]; // Send
        let mut with_payload = bytes.clone();
        with_payload.extend_from_slice(b"payload");
        let (repr, offset) = RdmapRepr::parse_bytes(&with_payload).unwrap();
        assert_eq!(repr.opcode, Opcode::SEND);
        assert_eq!(offset, 18);
        assert_eq!(&with_payload[offset..], b"payload");

        let (repr, offset) = RdmapRepr::parse_bytes(&READ_REQUEST).unwrap();
        assert_eq!(repr.read_request, Some(read_request_repr()));
        assert_eq!(offset, 46);
    }

    #[test]
    fn every_prefix_is_truncated() {
        for (bytes, repr) in every_opcode() {
            let ddp_len = repr.ddp().header_len();
            for len in 0..bytes.len() {
                let err = RdmapRepr::parse_bytes(&bytes[..len]).unwrap_err();
                let expected = if len < ddp_len {
                    Error::Ddp(ddp::Error::Truncated)
                } else {
                    Error::Truncated
                };
                assert_eq!(err, expected, "{} at {len}", repr.opcode);
            }
        }
        assert_eq!(
            TermCode::from(Error::Truncated),
            TermCode {
                layer: Layer(0),
                etype: EType(2),
                code: ErrorCode(0xff),
            }
        );
        assert_eq!(
            TermCode::from(Error::Ddp(ddp::Error::Truncated)),
            TermCode::DDP_LOCAL_CATASTROPHIC
        );
    }

    #[test]
    fn round_trip_every_opcode() {
        for (bytes, _) in every_opcode() {
            let (repr, len) = RdmapRepr::parse_bytes(&bytes).unwrap();
            let mut out = vec![0u8; len];
            repr.emit(&mut out);
            assert_eq!(out, bytes);
        }
    }

    #[test]
    fn ddp_version_is_checked_first() {
        let mut bytes = READ_REQUEST;
        bytes[0] = 0x42; // DV 2
        bytes[1] = 0x81; // RV 2 as well
        let err = RdmapRepr::parse_bytes(&bytes).unwrap_err();
        assert_eq!(
            err,
            Error::Ddp(ddp::Error::Version {
                tagged: false,
                version: 2
            })
        );
        assert_eq!(TermCode::from(err), TermCode::DDP_UNTAGGED_INVALID_VERSION);
    }

    #[test]
    fn rdmap_version_is_checked() {
        for rv in [0u8, 2, 3] {
            let mut bytes = READ_REQUEST;
            bytes[1] = (rv << 6) | 0x01;
            let err = RdmapRepr::parse_bytes(&bytes).unwrap_err();
            assert_eq!(err, Error::Version(rv));
            assert_eq!(
                TermCode::from(err),
                TermCode {
                    layer: Layer(0),
                    etype: EType(2),
                    code: ErrorCode(0x05),
                }
            );
        }
    }

    #[test]
    fn tagged_flag_must_match_a_known_opcode() {
        // Send (0x3) in a tagged segment.
        let bytes = [0xc1, 0x43, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        let err = RdmapRepr::parse_bytes(&bytes).unwrap_err();
        assert_eq!(
            err,
            Error::TaggedMismatch {
                opcode: Opcode::SEND,
                tagged: true
            }
        );
        assert_eq!(
            TermCode::from(err),
            TermCode {
                layer: Layer(0),
                etype: EType(2),
                code: ErrorCode(0x06),
            }
        );
        // RDMA Write (0x0) in an untagged segment.
        let bytes = [0x41, 0x40, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
        assert_eq!(
            RdmapRepr::parse_bytes(&bytes).unwrap_err(),
            Error::TaggedMismatch {
                opcode: Opcode::RDMA_WRITE,
                tagged: false
            }
        );
        assert_eq!(
            TermCode::from(RdmapRepr::parse_bytes(&bytes).unwrap_err()),
            TermCode::RDMAP_UNEXPECTED_OPCODE
        );
    }

    #[test]
    fn reserved_opcodes_parse_in_either_model() {
        for opcode in 8..=15u8 {
            let tagged = [0x81, 0x40 | opcode, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 0];
            let (repr, len) = RdmapRepr::parse_bytes(&tagged).unwrap();
            assert_eq!(repr.opcode, Opcode(opcode));
            assert!(!repr.opcode.is_known());
            assert_eq!(repr.opcode.name(), None);
            assert_eq!(len, 14);
            let mut out = vec![0u8; len];
            repr.emit(&mut out);
            assert_eq!(out, tagged);

            // Untagged: the RsvdULP word is passed through.
            let mut untagged = [0x01, 0, 1, 2, 3, 4, 0, 0, 0, 7, 0, 0, 0, 1, 0, 0, 0, 0];
            untagged[1] = 0x40 | opcode;
            let (repr, len) = RdmapRepr::parse_bytes(&untagged).unwrap();
            assert_eq!(repr.model, untagged_model(7, 0x0102_0304));
            assert_eq!(repr.read_request, None);
            let mut out = vec![0u8; len];
            repr.emit(&mut out);
            assert_eq!(out, untagged);
        }
        assert_eq!(Opcode(9).to_string(), "reserved opcode 0x9");
    }

    fn untagged_model(qn: u32, rsvd_ulp32: u32) -> BufferModel {
        untagged(QueueNumber(qn), 1, 0, rsvd_ulp32)
    }

    #[test]
    fn ignored_bits_are_normalised() {
        // Send with Rsv bits set and a non-zero RsvdULP word: both ignored.
        let bytes = [
            0x7d, 0x73, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0,
        ];
        let (repr, _) = RdmapRepr::parse_bytes(&bytes).unwrap();
        assert_eq!(repr.opcode, Opcode::SEND);
        assert_eq!(repr.model, untagged(QueueNumber::SEND, 1, 0, 0));
        assert_eq!(repr.invalidate_stag(), None);
        let mut out = [0u8; 18];
        repr.emit(&mut out);
        assert_eq!(
            out,
            [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0]
        );
        // emit also zeroes a word a caller left in the Repr.
        let repr = RdmapRepr {
            model: untagged(QueueNumber::SEND, 1, 0, 0x1234),
            ..repr
        };
        repr.emit(&mut out);
        assert_eq!(&out[2..6], &[0, 0, 0, 0]);
    }

    #[test]
    fn invalidate_stag() {
        let all = every_opcode();
        let (_, send_inv) = &all[4];
        assert_eq!(send_inv.invalidate_stag(), Some(Stag(0xdead_beef)));
        let (_, send_se_inv) = &all[6];
        assert_eq!(send_se_inv.invalidate_stag(), Some(Stag(0x1201)));
        let (_, send) = &all[3];
        assert_eq!(send.invalidate_stag(), None);
    }

    #[test]
    fn opcode_table() {
        // (opcode, tagged, queue, invalidate, SE) from RFC 5040 Figure 4.
        let table = [
            (Opcode::RDMA_WRITE, true, None, false, false),
            (Opcode::RDMA_READ_REQUEST, false, Some(1), false, false),
            (Opcode::RDMA_READ_RESPONSE, true, None, false, false),
            (Opcode::SEND, false, Some(0), false, false),
            (Opcode::SEND_INVALIDATE, false, Some(0), true, false),
            (Opcode::SEND_SE, false, Some(0), false, true),
            (Opcode::SEND_SE_INVALIDATE, false, Some(0), true, true),
            (Opcode::TERMINATE, false, Some(2), false, false),
        ];
        for (i, (opcode, tagged, qn, inv, se)) in table.into_iter().enumerate() {
            assert_eq!(opcode, Opcode(i as u8));
            assert!(opcode.is_known());
            assert!(opcode.name().is_some());
            assert_eq!(opcode.tagged(), Some(tagged), "{opcode}");
            assert_eq!(opcode.queue(), qn.map(QueueNumber), "{opcode}");
            assert_eq!(opcode.has_invalidate_stag(), inv, "{opcode}");
            assert_eq!(opcode.solicited_event(), se, "{opcode}");
        }
        assert_eq!(Opcode(8).tagged(), None);
        assert_eq!(Opcode(8).queue(), None);
        assert!(Opcode::SEND_SE.is_send());
        assert!(!Opcode::TERMINATE.is_send());
        assert_eq!(Opcode::SEND_SE.to_string(), "Send with Solicited Event");
    }

    #[test]
    fn read_request_view_truncation() {
        for len in 0..28 {
            assert_eq!(
                ReadRequest::new_checked(&READ_REQUEST[18..18 + len]).err(),
                Some(Error::Truncated)
            );
            assert_eq!(
                ReadRequestRepr::parse(&ReadRequest::new_unchecked(&READ_REQUEST[18..18 + len])),
                Err(Error::Truncated)
            );
        }
    }
}
