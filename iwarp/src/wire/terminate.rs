//! Terminate: the error triples and the Terminate header.
//!
//! * The Layer / Error Type / Error Code tables of RFC 5040 §4.8 (Figure 9),
//!   RFC 5041 §7.2 and RFC 5044 §8 as extended by RFC 6581 §8. Every
//!   protocol violation detected by the engine is named by one
//!   [`TermCode`]; the decode errors of the wire modules convert into it
//!   with `From`.
//! * The Terminate header of RFC 5040 §4.8 (Figures 7 and 8), which follows
//!   the DDP header of a Terminate message (opcode 7, QN 2):
//!
//! ```text
//!  0      4      8             16 17 18 19                      31
//! +------+------+---------------+--+--+--+------------------------+
//! |Layer |EType |  Error Code   |M |D |R |   Reserved (13 bits)   |
//! +------+------+---------------+--+--+--+------------------------+
//! | DDP Segment Length (if D)   | Terminated DDP Header (if D):   |
//! +-----------------------------+ 14 bytes tagged, 18 untagged    |
//! |                    ... (the T bit of its first byte says)     |
//! +---------------------------------------------------------------+
//! |   Terminated RDMA Header (if R): a 28-byte Read Request header|
//! +---------------------------------------------------------------+
//! ```
//!
//! Presence follows the HdrCt bits. RFC 5040 §4.8: the DDP Segment Length
//! "MUST be valid if the M bit is set. It MUST be present when the D bit is
//! set"; the Terminated DDP Header "MUST be present if the D bit is set";
//! the Terminated RDMA Header "MUST be present if the R bit is set". So the
//! length travels with the DDP header, and M only says whether its value is
//! meaningful. M without D is rejected: the length would have to be valid
//! but Figure 7 only gives it a place in front of the DDP header, Figure 10
//! never asks for one without the other, and Wireshark and the Linux `siw`
//! driver both read the length and the DDP header together.
//!
//! Bytes after the last included part are not rejected: RFC 5040 §7.1
//! (case 1) has senders set the headers they do not include "to zero",
//! which some implementations do by sending zero-filled fields.
//!
//! Wireshark's `iwarp_ddp_rdmap` dissector shows the same layout as fields
//! `iwarp_rdma.term_ctrl` (`term_layer`, `term_etype_*`, `term_errcode_*`,
//! `term_hdrct_m`/`_d`/`_r`), `term_rsvd`, `term_ddp_seg_len`, `term_ddp_h`
//! and `term_rdma_h`. It reads the length and DDP header when D is set, but
//! sizes the DDP header by the *error type* (14 bytes only for a DDP
//! Tagged Buffer Error) rather than by the header's own T bit, so it
//! misreads an RDMAP-layer Terminate that echoes a tagged header. The RFC's
//! "112 bits for Tagged Messages and 144 bits for Untagged Messages" is
//! what this module implements.
//!
//! ```
//! use iwarp::wire::terminate::{HdrCt, TermCode, TerminateHeader, TerminateRepr, TerminatedDdp};
//!
//! // A DDP "Invalid MO" Terminate echoing the offending untagged header.
//! let offending = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0x10, 0, 0, 0];
//! let repr = TerminateRepr {
//!     code: TermCode::DDP_INVALID_MO,
//!     ddp: Some(TerminatedDdp {
//!         segment_length: 18 + 100,
//!         segment_length_valid: true,
//!         header: &offending,
//!     }),
//!     rdma_header: None,
//! };
//! assert_eq!(repr.hdrct(), TermCode::DDP_INVALID_MO.header_inclusion(false, true));
//! let mut bytes = vec![0u8; repr.buffer_len()];
//! repr.emit(&mut TerminateHeader::new_unchecked(&mut bytes[..]));
//! assert_eq!(&bytes[..6], &[0x12, 0x04, 0xc0, 0x00, 0x00, 0x76]);
//!
//! let parsed = TerminateRepr::parse(&TerminateHeader::new_checked(&bytes[..])?)?;
//! assert_eq!(parsed, repr);
//! # Ok::<(), iwarp::wire::terminate::Error>(())
//! ```

use core::fmt;
use core::ops::Range;

use super::ddp::{self, DdpRepr, Segment};
use super::rdmap::{ReadRequest, ReadRequestRepr, READ_REQUEST_LEN};
pub use super::term_code::{EType, ErrorCode, HdrCt, Layer, TermCode};

/// A Terminate header that could not be decoded.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Fewer bytes than the Terminate Control field and the parts its HdrCt
    /// bits announce.
    Truncated,
    /// M set without D: a valid DDP Segment Length with no place on the
    /// wire (see the module documentation).
    LengthWithoutHeader,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated => f.write_str("Terminate header truncated"),
            Error::LengthWithoutHeader => {
                f.write_str("Terminate HdrCt has M (segment length valid) without D")
            }
        }
    }
}

impl std::error::Error for Error {}

impl From<Error> for TermCode {
    /// RFC 5040 §5.4: "when an invalid Terminate Message is delivered to the
    /// Remote Peer's RDMAP layer, an error is surfaced (see Section 7.1)".
    /// No code of Figure 9 names a malformed Terminate header; it is a
    /// Remote Operation Error, Unspecified (0x0/0x2/0xFF). It is only ever
    /// reported locally: the peer has already terminated the stream.
    fn from(err: Error) -> TermCode {
        match err {
            Error::Truncated | Error::LengthWithoutHeader => TermCode::RDMAP_OP_UNSPECIFIED,
        }
    }
}

mod field {
    use core::ops::Range;

    /// Terminate Control (19 bits) and Reserved (13 bits).
    pub const LAYER_ETYPE: usize = 0;
    pub const ERROR_CODE: usize = 1;
    pub const HDRCT: usize = 2;
    /// RFC 5040 §4.8 Figure 8: M is bit 16, D bit 17, R bit 18.
    pub const M: u8 = 0x80;
    pub const D: u8 = 0x40;
    pub const R: u8 = 0x20;
    /// Bits 19-31.
    pub const RESERVED: Range<usize> = 2..4;
    pub const RESERVED_MASK: u16 = 0x1fff;
    pub const CONTROL_LEN: usize = 4;
    /// Present when D is set.
    pub const SEGMENT_LENGTH: Range<usize> = 4..6;
    pub const DDP_HEADER: usize = 6;
}

/// Length of the Terminate Control and Reserved fields, the part every
/// Terminate header has.
pub const CONTROL_LEN: usize = field::CONTROL_LEN;

/// Where the optional parts of a Terminate header sit.
struct Layout {
    ddp_header: Option<Range<usize>>,
    rdma_header: Option<Range<usize>>,
    len: usize,
}

fn layout(data: &[u8]) -> Result<Layout, Error> {
    let hdrct = *data.get(field::HDRCT).ok_or(Error::Truncated)?;
    if data.len() < field::CONTROL_LEN {
        return Err(Error::Truncated);
    }
    let (m, d, r) = (
        hdrct & field::M != 0,
        hdrct & field::D != 0,
        hdrct & field::R != 0,
    );
    // RFC 5040 §4.8: DDP Segment Length "MUST be valid if the M bit is set.
    // It MUST be present when the D bit is set."
    if m && !d {
        return Err(Error::LengthWithoutHeader);
    }
    let mut len = field::CONTROL_LEN;
    let ddp_header = if d {
        // "Terminated DDP Header: 112 bits for Tagged Messages and 144 bits
        // for Untagged Messages": its own T bit says which.
        let control = *data.get(field::DDP_HEADER).ok_or(Error::Truncated)?;
        let range = field::DDP_HEADER..field::DDP_HEADER + ddp::header_len(control & 0x80 != 0);
        len = range.end;
        Some(range)
    } else {
        None
    };
    let rdma_header = if r {
        let range = len..len + READ_REQUEST_LEN;
        len = range.end;
        Some(range)
    } else {
        None
    };
    if data.len() < len {
        return Err(Error::Truncated);
    }
    Ok(Layout {
        ddp_header,
        rdma_header,
        len,
    })
}

/// A read/write view of a Terminate header (RFC 5040 §4.8): the payload of
/// a Terminate message, after its DDP header.
///
/// After [`TerminateHeader::new_checked`] the buffer holds every part the
/// HdrCt bits announce, so no getter panics (on an unchecked buffer the
/// getters return 0 or `None` for what is missing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TerminateHeader<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TerminateHeader<T> {
    /// Wraps a buffer without checking it.
    pub const fn new_unchecked(buffer: T) -> TerminateHeader<T> {
        TerminateHeader { buffer }
    }

    /// Wraps a buffer, checking that it holds the whole header.
    pub fn new_checked(buffer: T) -> Result<TerminateHeader<T>, Error> {
        let header = Self::new_unchecked(buffer);
        header.check_len()?;
        Ok(header)
    }

    /// Checks that the buffer holds every part the HdrCt bits announce and
    /// that the bits are consistent.
    pub fn check_len(&self) -> Result<(), Error> {
        layout(self.buffer.as_ref()).map(|_| ())
    }

    /// Unwraps the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    fn byte(&self, index: usize) -> u8 {
        self.buffer.as_ref().get(index).copied().unwrap_or(0)
    }

    /// Layer (4 bits).
    pub fn layer(&self) -> Layer {
        Layer(self.byte(field::LAYER_ETYPE) >> 4)
    }

    /// EType (4 bits).
    pub fn etype(&self) -> EType {
        EType(self.byte(field::LAYER_ETYPE) & 0x0f)
    }

    /// Error Code (8 bits).
    pub fn error_code(&self) -> ErrorCode {
        ErrorCode(self.byte(field::ERROR_CODE))
    }

    /// The Layer / EType / Error Code triple.
    pub fn code(&self) -> TermCode {
        TermCode {
            layer: self.layer(),
            etype: self.etype(),
            code: self.error_code(),
        }
    }

    /// The M, D and R bits.
    pub fn hdrct(&self) -> HdrCt {
        let hdrct = self.byte(field::HDRCT);
        HdrCt {
            segment_length: hdrct & field::M != 0,
            ddp_header: hdrct & field::D != 0,
            rdma_header: hdrct & field::R != 0,
        }
    }

    /// The 13 reserved bits ("MUST be set to zero on transmit, ignored on
    /// receive").
    pub fn reserved(&self) -> u16 {
        u16::from_be_bytes([
            self.byte(field::RESERVED.start),
            self.byte(field::RESERVED.end - 1),
        ]) & field::RESERVED_MASK
    }

    /// The DDP Segment Length field, present when D is set; its value is
    /// meaningful only when M is set as well.
    pub fn segment_length(&self) -> Option<u16> {
        if !self.hdrct().ddp_header {
            return None;
        }
        match self.buffer.as_ref().get(field::SEGMENT_LENGTH) {
            Some(&[a, b]) => Some(u16::from_be_bytes([a, b])),
            _ => None,
        }
    }

    /// The Terminated DDP Header, present when D is set.
    pub fn ddp_header(&self) -> Option<&[u8]> {
        let data = self.buffer.as_ref();
        data.get(layout(data).ok()?.ddp_header?)
    }

    /// The Terminated RDMA Header, present when R is set.
    pub fn rdma_header(&self) -> Option<&[u8]> {
        let data = self.buffer.as_ref();
        data.get(layout(data).ok()?.rdma_header?)
    }

    /// The header's length as its HdrCt bits and included DDP header say
    /// (0 if they are inconsistent or truncated). Anything after it is not
    /// part of the header.
    pub fn header_len(&self) -> usize {
        layout(self.buffer.as_ref()).map_or(0, |layout| layout.len)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TerminateHeader<T> {
    /// Sets Layer, EType and Error Code.
    pub fn set_code(&mut self, code: TermCode) {
        let data = self.buffer.as_mut();
        data[field::LAYER_ETYPE] = (code.layer.0 << 4) | (code.etype.0 & 0x0f);
        data[field::ERROR_CODE] = code.code.0;
    }

    /// Sets the M, D and R bits.
    pub fn set_hdrct(&mut self, hdrct: HdrCt) {
        let byte = &mut self.buffer.as_mut()[field::HDRCT];
        *byte &= !(field::M | field::D | field::R);
        if hdrct.segment_length {
            *byte |= field::M;
        }
        if hdrct.ddp_header {
            *byte |= field::D;
        }
        if hdrct.rdma_header {
            *byte |= field::R;
        }
    }

    /// Sets the 13 reserved bits (emit zero).
    pub fn set_reserved(&mut self, value: u16) {
        let data = self.buffer.as_mut();
        let [hi, lo] = (value & field::RESERVED_MASK).to_be_bytes();
        data[field::RESERVED.start] = (data[field::RESERVED.start] & !0x1f) | hi;
        data[field::RESERVED.end - 1] = lo;
    }

    /// Sets the DDP Segment Length field (its place exists only with D).
    pub fn set_segment_length(&mut self, value: u16) {
        self.buffer.as_mut()[field::SEGMENT_LENGTH].copy_from_slice(&value.to_be_bytes());
    }

    /// Copies a terminated DDP header into place (D).
    pub fn set_ddp_header(&mut self, header: &[u8]) {
        let start = field::DDP_HEADER;
        self.buffer.as_mut()[start..start + header.len()].copy_from_slice(header);
    }

    /// The bytes of the Terminated RDMA Header, writable: after the DDP
    /// header if D is set and the control field otherwise. Set HdrCt and the
    /// DDP header first. Panics if the buffer is too short.
    pub fn rdma_header_mut(&mut self) -> &mut [u8] {
        let start = if self.hdrct().ddp_header {
            let tagged = self.byte(field::DDP_HEADER) & 0x80 != 0;
            field::DDP_HEADER + ddp::header_len(tagged)
        } else {
            field::CONTROL_LEN
        };
        &mut self.buffer.as_mut()[start..start + READ_REQUEST_LEN]
    }
}

/// The DDP part of a Terminate header (D set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminatedDdp<'a> {
    /// The DDP Segment Length field: "The length handed up by the DDP layer
    /// when the error was detected" (RFC 5040 §4.8). Kept as received even
    /// when not valid, so that a header is echoed bit for bit.
    pub segment_length: u16,
    /// M: [`TerminatedDdp::segment_length`] is valid.
    pub segment_length_valid: bool,
    /// The DDP header of the terminated message: exactly 14 bytes if its T
    /// bit is set, 18 if not.
    pub header: &'a [u8],
}

impl<'a> TerminatedDdp<'a> {
    /// The segment length if M says it is valid.
    pub fn valid_segment_length(&self) -> Option<u16> {
        self.segment_length_valid.then_some(self.segment_length)
    }

    /// Decodes the echoed DDP header. It may legitimately fail: a Terminate
    /// for an invalid DDP version echoes that header.
    pub fn header_repr(&self) -> Result<DdpRepr, ddp::Error> {
        DdpRepr::parse(&Segment::new_checked(self.header)?)
    }
}

/// A decoded Terminate header (RFC 5040 §4.8).
///
/// The HdrCt bits are not stored twice: D is `ddp.is_some()`, M is
/// `ddp.segment_length_valid`, R is `rdma_header.is_some()`
/// ([`TerminateRepr::hdrct`]). The 13 reserved bits are not represented
/// ("ignored on receive"). Which parts a Terminate *should* carry for a
/// given error is Figure 10, [`TermCode::header_inclusion`]; the parser
/// does not enforce it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TerminateRepr<'a> {
    /// Layer, EType and Error Code.
    pub code: TermCode,
    /// The DDP Segment Length and Terminated DDP Header (D, and M).
    pub ddp: Option<TerminatedDdp<'a>>,
    /// The Terminated RDMA Header (R): the Read Request, as updated by the
    /// Data Source for the part already transferred (§4.8).
    pub rdma_header: Option<ReadRequestRepr>,
}

impl<'a> TerminateRepr<'a> {
    /// Decodes a checked Terminate header.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        header: &TerminateHeader<&'a T>,
    ) -> Result<TerminateRepr<'a>, Error> {
        let data: &'a [u8] = header.buffer.as_ref();
        let layout = layout(data)?;
        let hdrct = header.hdrct();
        let ddp = match layout.ddp_header {
            Some(range) => Some(TerminatedDdp {
                segment_length: header.segment_length().ok_or(Error::Truncated)?,
                segment_length_valid: hdrct.segment_length,
                header: data.get(range).ok_or(Error::Truncated)?,
            }),
            None => None,
        };
        let rdma_header = match layout.rdma_header {
            Some(range) => {
                let bytes = data.get(range).ok_or(Error::Truncated)?;
                let view = ReadRequest::new_checked(bytes).map_err(|_| Error::Truncated)?;
                Some(ReadRequestRepr::parse(&view).map_err(|_| Error::Truncated)?)
            }
            None => None,
        };
        Ok(TerminateRepr {
            code: header.code(),
            ddp,
            rdma_header,
        })
    }

    /// Reads only the Terminate Control field: for reporting the peer's
    /// error even when the rest of its header is malformed.
    pub fn parse_control(data: &[u8]) -> Result<(TermCode, HdrCt), Error> {
        if data.len() < field::CONTROL_LEN {
            return Err(Error::Truncated);
        }
        let header = TerminateHeader::new_unchecked(data);
        Ok((header.code(), header.hdrct()))
    }

    /// The M, D and R bits this header carries.
    pub fn hdrct(&self) -> HdrCt {
        HdrCt {
            segment_length: self.ddp.is_some_and(|ddp| ddp.segment_length_valid),
            ddp_header: self.ddp.is_some(),
            rdma_header: self.rdma_header.is_some(),
        }
    }

    /// Bytes [`TerminateRepr::emit`] writes.
    pub fn buffer_len(&self) -> usize {
        field::CONTROL_LEN
            + self
                .ddp
                .map_or(0, |ddp| field::SEGMENT_LENGTH.len() + ddp.header.len())
            + self.rdma_header.map_or(0, |rr| rr.buffer_len())
    }

    /// Writes the header into the first [`TerminateRepr::buffer_len`]
    /// bytes of `header`. Panics if the buffer is shorter.
    ///
    /// `ddp.header` must be a whole DDP header (14 bytes with T set, 18
    /// without), or the bytes will not parse back.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(
        &self,
        header: &mut TerminateHeader<&mut T>,
    ) {
        header.set_code(self.code);
        header.buffer.as_mut()[field::HDRCT] = 0;
        header.set_hdrct(self.hdrct());
        // RFC 5040 §4.8: Reserved "MUST be set to zero on transmit".
        header.set_reserved(0);
        let mut offset = field::CONTROL_LEN;
        if let Some(ddp) = self.ddp {
            debug_assert_eq!(
                Some(ddp.header.len()),
                ddp.header
                    .first()
                    .map(|control| ddp::header_len(control & 0x80 != 0)),
                "terminated DDP header length disagrees with its T bit"
            );
            header.set_segment_length(ddp.segment_length);
            header.set_ddp_header(ddp.header);
            offset = field::DDP_HEADER + ddp.header.len();
        }
        if let Some(rr) = self.rdma_header {
            let buffer = &mut header.buffer.as_mut()[offset..offset + READ_REQUEST_LEN];
            rr.emit(&mut ReadRequest::new_unchecked(buffer));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::term_code::tc;

    #[test]
    fn figure_10_header_inclusion() {
        let all = HdrCt {
            segment_length: true,
            ddp_header: true,
            rdma_header: true,
        };
        assert_eq!(
            TermCode::RDMAP_BASE_BOUNDS.header_inclusion(true, true),
            all
        );
        assert!(
            !TermCode::RDMAP_BASE_BOUNDS
                .header_inclusion(false, true)
                .rdma_header
        );
        assert_eq!(
            TermCode::RDMAP_UNEXPECTED_OPCODE.header_inclusion(true, true),
            HdrCt {
                rdma_header: false,
                ..all
            }
        );
        assert_eq!(
            TermCode::DDP_INVALID_MO.header_inclusion(false, true),
            HdrCt {
                rdma_header: false,
                ..all
            }
        );
        assert_eq!(
            TermCode::MPA_CRC.header_inclusion(true, true),
            HdrCt::default()
        );
        assert_eq!(
            TermCode::RDMAP_LOCAL_CATASTROPHIC.header_inclusion(true, true),
            HdrCt::default()
        );
    }

    #[test]
    fn names_cover_every_constant() {
        for code in [
            TermCode::RDMAP_LOCAL_CATASTROPHIC,
            TermCode::RDMAP_TO_WRAP,
            TermCode::DDP_MESSAGE_TOO_LONG,
            TermCode::MPA_NO_MATCHING_RTR,
        ] {
            assert!(code.name().is_some(), "{code:?}");
        }
        assert_eq!(
            TermCode::MPA_CRC.to_string(),
            "layer 0x2 type 0x0 code 0x02 (MPA: CRC mismatch)"
        );
        assert_eq!(tc(0x3, 0x0, 0x00).name(), None);
    }

    // ---- Terminate header ----

    use crate::wire::ddp::Stag;

    /// The untagged DDP header of a Send (QN 0, MSN 1, MO 0x1000).
    const SEND_DDP: [u8; 18] = [
        0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0x10, 0,
    ];
    /// The tagged DDP header of an RDMA Write (STag 0x100, TO 0x2000).
    const WRITE_DDP: [u8; 14] = [0xc1, 0x40, 0, 0, 0x01, 0, 0, 0, 0, 0, 0, 0, 0x20, 0];
    /// The untagged DDP header of a Read Request (QN 1, MSN 3, MO 0).
    const READ_DDP: [u8; 18] = [0x41, 0x41, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 3, 0, 0, 0, 0];
    /// Its Read Request header.
    const READ_RR: [u8; 28] = [
        0, 0, 0x02, 0x01, // sink STag 0x201
        0, 0, 0, 0, 0, 0, 0x30, 0, // sink TO 0x3000
        0, 0, 0x08, 0, // size 2048
        0, 0, 0x05, 0x07, // source STag 0x507
        0, 0, 0, 0, 0, 0, 0x40, 0, // source TO 0x4000
    ];

    fn read_rr() -> ReadRequestRepr {
        ReadRequestRepr {
            sink_stag: Stag(0x201),
            sink_to: 0x3000,
            size: 2048,
            src_stag: Stag(0x507),
            src_to: 0x4000,
        }
    }

    fn cat(parts: &[&[u8]]) -> Vec<u8> {
        parts.concat()
    }

    /// Literal Terminate headers, one per HdrCt combination the parser
    /// accepts, with their Reprs.
    fn cases() -> Vec<(Vec<u8>, TerminateRepr<'static>)> {
        vec![
            // 000: LLP CRC error, no headers (Figure 10, LLP row).
            (
                vec![0x20, 0x02, 0x00, 0x00],
                TerminateRepr {
                    code: TermCode::MPA_CRC,
                    ddp: None,
                    rdma_header: None,
                },
            ),
            // 110: DDP Invalid MO, untagged header, length 0x0412 valid.
            (
                cat(&[&[0x12, 0x04, 0xc0, 0x00, 0x04, 0x12], &SEND_DDP]),
                TerminateRepr {
                    code: TermCode::DDP_INVALID_MO,
                    ddp: Some(TerminatedDdp {
                        segment_length: 0x0412,
                        segment_length_valid: true,
                        header: &SEND_DDP,
                    }),
                    rdma_header: None,
                },
            ),
            // 110: DDP base/bounds on an RDMA Write, tagged header.
            (
                cat(&[&[0x11, 0x01, 0xc0, 0x00, 0x05, 0xb4], &WRITE_DDP]),
                TerminateRepr {
                    code: TermCode::DDP_BASE_BOUNDS,
                    ddp: Some(TerminatedDdp {
                        segment_length: 1460,
                        segment_length_valid: true,
                        header: &WRITE_DDP,
                    }),
                    rdma_header: None,
                },
            ),
            // 010: D without M: the length is present but not valid.
            (
                cat(&[&[0x02, 0x06, 0x40, 0x00, 0xab, 0xcd], &SEND_DDP]),
                TerminateRepr {
                    code: TermCode::RDMAP_UNEXPECTED_OPCODE,
                    ddp: Some(TerminatedDdp {
                        segment_length: 0xabcd,
                        segment_length_valid: false,
                        header: &SEND_DDP,
                    }),
                    rdma_header: None,
                },
            ),
            // 111: Remote Protection Error on an RDMA Read Request.
            (
                cat(&[&[0x01, 0x01, 0xe0, 0x00, 0x00, 0x2e], &READ_DDP, &READ_RR]),
                TerminateRepr {
                    code: TermCode::RDMAP_BASE_BOUNDS,
                    ddp: Some(TerminatedDdp {
                        segment_length: 46,
                        segment_length_valid: true,
                        header: &READ_DDP,
                    }),
                    rdma_header: Some(read_rr()),
                },
            ),
            // 011: D and R without M.
            (
                cat(&[&[0x01, 0x02, 0x60, 0x00, 0x00, 0x00], &READ_DDP, &READ_RR]),
                TerminateRepr {
                    code: TermCode::RDMAP_ACCESS_RIGHTS,
                    ddp: Some(TerminatedDdp {
                        segment_length: 0,
                        segment_length_valid: false,
                        header: &READ_DDP,
                    }),
                    rdma_header: Some(read_rr()),
                },
            ),
            // 001: R only: the RDMA header follows the control field.
            (
                cat(&[&[0x01, 0x00, 0x20, 0x00], &READ_RR]),
                TerminateRepr {
                    code: TermCode::RDMAP_INVALID_STAG,
                    ddp: None,
                    rdma_header: Some(read_rr()),
                },
            ),
        ]
    }

    #[test]
    fn test_deconstruct_terminate() {
        let bytes = &cases()[4].0;
        let header = TerminateHeader::new_checked(&bytes[..]).unwrap();
        assert_eq!(header.layer(), Layer::RDMAP);
        assert_eq!(header.etype(), EType::RDMAP_REMOTE_PROTECTION);
        assert_eq!(header.error_code(), ErrorCode(0x01));
        assert_eq!(header.code(), TermCode::RDMAP_BASE_BOUNDS);
        assert_eq!(
            header.hdrct(),
            HdrCt {
                segment_length: true,
                ddp_header: true,
                rdma_header: true
            }
        );
        assert_eq!(header.reserved(), 0);
        assert_eq!(header.segment_length(), Some(46));
        assert_eq!(header.ddp_header(), Some(&READ_DDP[..]));
        assert_eq!(header.rdma_header(), Some(&READ_RR[..]));
        assert_eq!(header.header_len(), 4 + 2 + 18 + 28);

        let bytes = &cases()[0].0;
        let header = TerminateHeader::new_checked(&bytes[..]).unwrap();
        assert_eq!(header.code(), TermCode::MPA_CRC);
        assert_eq!(header.hdrct(), HdrCt::default());
        assert_eq!(header.segment_length(), None);
        assert_eq!(header.ddp_header(), None);
        assert_eq!(header.rdma_header(), None);
        assert_eq!(header.header_len(), 4);

        let bytes = &cases()[6].0;
        let header = TerminateHeader::new_checked(&bytes[..]).unwrap();
        assert_eq!(header.segment_length(), None);
        assert_eq!(header.rdma_header(), Some(&READ_RR[..]));
    }

    #[test]
    fn test_construct_terminate() {
        let expected = &cases()[4].0;
        let mut bytes = vec![0u8; expected.len()];
        let mut header = TerminateHeader::new_unchecked(&mut bytes[..]);
        header.set_code(TermCode::RDMAP_BASE_BOUNDS);
        header.set_hdrct(HdrCt {
            segment_length: true,
            ddp_header: true,
            rdma_header: true,
        });
        header.set_reserved(0);
        header.set_segment_length(46);
        header.set_ddp_header(&READ_DDP);
        header.rdma_header_mut().copy_from_slice(&READ_RR);
        assert_eq!(&bytes, expected);

        let expected = &cases()[6].0;
        let mut bytes = vec![0u8; expected.len()];
        let mut header = TerminateHeader::new_unchecked(&mut bytes[..]);
        header.set_code(TermCode::RDMAP_INVALID_STAG);
        header.set_hdrct(HdrCt {
            rdma_header: true,
            ..HdrCt::default()
        });
        header.rdma_header_mut().copy_from_slice(&READ_RR);
        assert_eq!(&bytes, expected);
    }

    #[test]
    fn test_parse_terminate() {
        for (bytes, repr) in cases() {
            let header = TerminateHeader::new_checked(&bytes[..]).unwrap();
            assert_eq!(TerminateRepr::parse(&header), Ok(repr), "{}", repr.code);
            assert_eq!(
                TerminateRepr::parse_control(&bytes),
                Ok((repr.code, repr.hdrct()))
            );
        }
    }

    #[test]
    fn test_emit_terminate() {
        for (bytes, repr) in cases() {
            assert_eq!(repr.buffer_len(), bytes.len(), "{}", repr.code);
            let mut out = vec![0xffu8; bytes.len()];
            repr.emit(&mut TerminateHeader::new_unchecked(&mut out[..]));
            assert_eq!(out, bytes, "{}", repr.code);
        }
    }

    #[test]
    fn terminate_round_trip() {
        for (bytes, _) in cases() {
            let repr =
                TerminateRepr::parse(&TerminateHeader::new_checked(&bytes[..]).unwrap()).unwrap();
            let mut out = vec![0u8; repr.buffer_len()];
            repr.emit(&mut TerminateHeader::new_unchecked(&mut out[..]));
            assert_eq!(out, bytes);
        }
    }

    #[test]
    fn terminate_every_prefix_is_truncated() {
        for (bytes, repr) in cases() {
            for len in 0..bytes.len() {
                let prefix = &bytes[..len];
                assert_eq!(
                    TerminateHeader::new_checked(prefix).err(),
                    Some(Error::Truncated),
                    "{} at {len}",
                    repr.code
                );
                assert_eq!(
                    TerminateRepr::parse(&TerminateHeader::new_unchecked(prefix)),
                    Err(Error::Truncated)
                );
            }
        }
        assert_eq!(
            TerminateRepr::parse_control(&[0x20, 0x02, 0]),
            Err(Error::Truncated)
        );
        assert_eq!(TermCode::from(Error::Truncated), tc(0x0, 0x2, 0xff));
    }

    #[test]
    fn terminate_m_without_d_is_rejected() {
        // 100 and 101, with enough bytes after them for any reading.
        for hdrct in [0x80u8, 0xa0] {
            let mut bytes = vec![0x12, 0x04, hdrct, 0x00, 0x00, 0x12];
            bytes.extend_from_slice(&SEND_DDP);
            bytes.extend_from_slice(&READ_RR);
            assert_eq!(
                TerminateHeader::new_checked(&bytes[..]).err(),
                Some(Error::LengthWithoutHeader)
            );
            assert_eq!(
                TerminateRepr::parse(&TerminateHeader::new_unchecked(&bytes[..])),
                Err(Error::LengthWithoutHeader)
            );
            // The peer's error is still readable.
            assert_eq!(
                TerminateRepr::parse_control(&bytes).map(|(code, _)| code),
                Ok(TermCode::DDP_INVALID_MO)
            );
        }
        assert_eq!(
            TermCode::from(Error::LengthWithoutHeader),
            TermCode::RDMAP_OP_UNSPECIFIED
        );
    }

    #[test]
    fn terminate_tagged_header_length_follows_its_t_bit() {
        // The same error code with an untagged echo is 4 bytes longer.
        let untagged = cat(&[&[0x11, 0x01, 0xc0, 0x00, 0x05, 0xb4], &SEND_DDP]);
        let header = TerminateHeader::new_checked(&untagged[..]).unwrap();
        assert_eq!(header.header_len(), 24);
        let tagged = &cases()[2].0;
        let header = TerminateHeader::new_checked(&tagged[..]).unwrap();
        assert_eq!(header.header_len(), 20);
        let repr = TerminateRepr::parse(&header).unwrap();
        let ddp = repr.ddp.unwrap();
        assert_eq!(ddp.valid_segment_length(), Some(1460));
        assert!(ddp.header_repr().unwrap().model.tagged());
    }

    #[test]
    fn terminate_reserved_and_trailing_bytes_are_ignored() {
        // Reserved bits set, and zero-filled "not included" headers after
        // the control field (RFC 5040 §7.1 case 1).
        let mut bytes = vec![0x00, 0x00, 0x1f, 0xff];
        bytes.extend_from_slice(&[0u8; 2 + 18 + 28]);
        let header = TerminateHeader::new_checked(&bytes[..]).unwrap();
        assert_eq!(header.reserved(), 0x1fff);
        assert_eq!(header.header_len(), 4);
        let repr = TerminateRepr::parse(&header).unwrap();
        assert_eq!(
            repr,
            TerminateRepr {
                code: TermCode::RDMAP_LOCAL_CATASTROPHIC,
                ddp: None,
                rdma_header: None,
            }
        );
        let mut out = [0xffu8; 4];
        repr.emit(&mut TerminateHeader::new_unchecked(&mut out[..]));
        assert_eq!(out, [0, 0, 0, 0]);
    }

    #[test]
    fn terminate_unknown_codes_parse() {
        let bytes = [0xf7, 0x42, 0x00, 0x00];
        let repr =
            TerminateRepr::parse(&TerminateHeader::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr.code, tc(0xf, 0x7, 0x42));
        assert_eq!(repr.code.name(), None);
        let mut out = [0u8; 4];
        repr.emit(&mut TerminateHeader::new_unchecked(&mut out[..]));
        assert_eq!(out, bytes);
    }

    #[test]
    fn terminate_echo_of_a_bad_version_header() {
        // A DDP version error echoes the offending header; it still parses,
        // and decoding the echo reports the version.
        let mut bad = SEND_DDP;
        bad[0] = 0x40; // DV 0
        let bytes = cat(&[&[0x12, 0x06, 0xc0, 0x00, 0x00, 0x12], &bad]);
        let repr =
            TerminateRepr::parse(&TerminateHeader::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(repr.code, TermCode::DDP_UNTAGGED_INVALID_VERSION);
        assert_eq!(
            repr.ddp.unwrap().header_repr(),
            Err(ddp::Error::Version {
                tagged: false,
                version: 0
            })
        );
    }

    /// RFC 5040 §4.8 Figure 10: every row, emitted with the HdrCt that
    /// `header_inclusion` chooses, gives the exact bytes and parses back.
    #[test]
    fn figure_10_consistent_terminates() {
        // (code, read_request, ddp_header_known, DDP header, bytes)
        type Row = (TermCode, bool, bool, &'static [u8], Vec<u8>);
        let rows: [Row; 8] = [
            // Local Catastrophic: no headers.
            (
                TermCode::RDMAP_LOCAL_CATASTROPHIC,
                false,
                true,
                &[],
                vec![0x00, 0x00, 0x00, 0x00],
            ),
            // Remote Protection on a Read Request: DDP header, length, RDMA
            // header.
            (
                TermCode::RDMAP_TO_WRAP,
                true,
                true,
                &READ_DDP,
                cat(&[&[0x01, 0x04, 0xe0, 0x00, 0x00, 0x2e], &READ_DDP, &READ_RR]),
            ),
            // Remote Protection on a Send with Invalidate: there is no RDMA
            // header to return.
            (
                TermCode::RDMAP_PROT_CANNOT_INVALIDATE,
                false,
                true,
                &SEND_DDP,
                cat(&[&[0x01, 0x09, 0xc0, 0x00, 0x00, 0x2e], &SEND_DDP]),
            ),
            // Remote Protection before a DDP header was known: RDMA header
            // only.
            (
                TermCode::RDMAP_INVALID_STAG,
                true,
                false,
                &[],
                cat(&[&[0x01, 0x00, 0x20, 0x00], &READ_RR]),
            ),
            // Remote Operation: DDP header and length.
            (
                TermCode::RDMAP_CATASTROPHIC_STREAM,
                false,
                true,
                &WRITE_DDP,
                cat(&[&[0x02, 0x07, 0xc0, 0x00, 0x00, 0x2e], &WRITE_DDP]),
            ),
            // Remote Operation, header not known.
            (
                TermCode::RDMAP_OP_UNSPECIFIED,
                false,
                false,
                &[],
                vec![0x02, 0xff, 0x00, 0x00],
            ),
            // DDP: DDP header and length.
            (
                TermCode::DDP_INVALID_QN,
                false,
                true,
                &SEND_DDP,
                cat(&[&[0x12, 0x01, 0xc0, 0x00, 0x00, 0x2e], &SEND_DDP]),
            ),
            // LLP: no headers.
            (
                TermCode::MPA_MARKER,
                false,
                true,
                &[],
                vec![0x20, 0x03, 0x00, 0x00],
            ),
        ];
        for (code, read_request, known, ddp_header, expected) in rows {
            let hdrct = code.header_inclusion(read_request, known);
            let repr = TerminateRepr {
                code,
                ddp: hdrct.ddp_header.then_some(TerminatedDdp {
                    segment_length: 46,
                    segment_length_valid: hdrct.segment_length,
                    header: ddp_header,
                }),
                rdma_header: hdrct.rdma_header.then_some(read_rr()),
            };
            assert_eq!(repr.hdrct(), hdrct, "{code}");
            let mut out = vec![0u8; repr.buffer_len()];
            repr.emit(&mut TerminateHeader::new_unchecked(&mut out[..]));
            assert_eq!(out, expected, "{code}");
            let parsed =
                TerminateRepr::parse(&TerminateHeader::new_checked(&out[..]).unwrap()).unwrap();
            assert_eq!(parsed, repr, "{code}");
        }
    }
}
