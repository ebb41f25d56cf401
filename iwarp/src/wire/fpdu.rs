//! FPDU framing of the MPA Full Operation Phase: RFC 5044 §4.1 (FPDU
//! format), §4.2–4.3 (markers), §4.4 (CRC), §4.5 and §5.1 (MULPDU), §6
//! (receiver FPDU identification), §8 (error codes 2 and 3).
//!
//! ```text
//!  [marker] ULPDU_Length(2) ULPDU ... [marker] ... ULPDU PAD(0-3) [marker] CRC(4)
//! ```
//!
//! # Stream positions
//!
//! Markers sit at fixed places in the byte stream of one direction, so
//! everything here takes the *stream position* of the FPDU's first byte:
//! the number of octets sent in that direction since the Full Operation
//! Phase began, i.e. since the octet right after that direction's MPA
//! Request or Reply frame. RFC 5044 §4.3: "the MPA Markers MUST be inserted
//! immediately preceding the first FPDU of Full Operation Phase, and at every
//! 512th octet of the TCP octet stream thereafter" — so marker 0 is at
//! position 0 and a marker starts at every position that is a multiple of
//! [`MARKER_INTERVAL`]. Positions count marker octets too. Only `pos % 512`
//! matters, so a TCP sequence number difference wrapped at 2^32 works as
//! well as a 64-bit byte count (2^32 is a multiple of 512).
//!
//! A marker precedes any FPDU octet (length field, ULPDU, pad or CRC) that
//! would fall on a marker position; nothing is inserted after the CRC, since
//! a marker there belongs to the next FPDU. With markers on, every FPDU is a
//! multiple of 4 octets long and starts at a multiple of 4, so a marker never
//! splits the length field, the pad or the CRC — which is why a position
//! that is not a multiple of 4 is refused ([`Error::Misaligned`]).
//!
//! # Pieces for zero-copy I/O
//!
//! [`Layout`] is the geometry of one FPDU: [`Layout::segments`] lists, in
//! wire order, which octets are markers, the length field, ULPDU (and at
//! which ULPDU offset), pad and CRC. The checked view [`Fpdu`] and the
//! contiguous [`FpduRepr::emit`] are built on it, and so are the transmit
//! gather list [`TxPlan`] and, later, a streaming receiver that places ULPDU
//! octets straight into their destination and runs [`Crc`] over them where
//! they land.
//!
//! ```
//! use iwarp::wire::fpdu::{self, Framing, FpduRepr, Ulpdu};
//!
//! // RFC 5044 Figure 5: the first FPDU of the stream, markers and CRC on.
//! // A DDP untagged Send header (control 0x4143, Queue 0, MSN 1, MO 0)
//! // and 24 zero octets of payload.
//! let mut ulpdu = vec![0u8; 42];
//! ulpdu[..2].copy_from_slice(&[0x41, 0x43]);
//! ulpdu[13] = 1;
//! let framing = Framing { markers: true, crc: true };
//! let wire = FpduRepr { ulpdu: Ulpdu::new(&ulpdu) }.to_vec(0, framing).unwrap();
//! assert_eq!(wire.len(), 0x34);
//! assert_eq!(&wire[..6], &[0, 0, 0, 0, 0x00, 0x2a]); // marker, ULPDU_Length
//! assert_eq!(&wire[0x30..], &[0x52, 0x23, 0x99, 0x83]); // CRC
//!
//! let (repr, consumed) = fpdu::parse(&wire, 0, framing).unwrap();
//! assert_eq!(consumed, wire.len());
//! assert_eq!(repr.ulpdu.to_vec(), ulpdu);
//! ```

use core::fmt;
use core::ops::Range;

use super::crc::{self, Crc, CRC_LEN};
use super::terminate::TermCode;

/// Length of the ULPDU_Length field (RFC 5044 §4.1).
pub const HEADER_LEN: usize = 2;
/// Length of a marker (RFC 5044 §4.2).
pub const MARKER_LEN: usize = 4;
/// Distance between markers in the stream (RFC 5044 §4.3).
pub const MARKER_INTERVAL: u64 = 512;
/// Smallest ULPDU this module accepts: the 14-octet tagged DDP header
/// (RFC 5041 §5.2; the untagged header is 18). Every DDP segment, even one
/// without payload, carries a whole DDP header, so anything shorter cannot
/// be a DDP segment. Checked against the smaller of the two because MPA
/// does not know the segment's type; DDP checks its own header length.
pub const MIN_ULPDU_LEN: usize = 14;
/// Largest ULPDU the 16-bit ULPDU_Length can describe.
pub const MAX_ULPDU_LEN: usize = u16::MAX as usize;
/// The floor under MULPDU (RFC 5044 §4.5).
pub const MIN_MULPDU: usize = 128;

/// Errors while framing or deframing an FPDU.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// The buffer ends before the FPDU does: read more and retry. Also: an
    /// emit buffer shorter than the FPDU.
    Truncated,
    /// The received CRC does not match the FPDU (RFC 5044 §8 code 2).
    Crc,
    /// A marker in the FPDU does not point at the FPDU's ULPDU_Length field
    /// (RFC 5044 §8 code 3).
    Marker,
    /// ULPDU_Length is below [`MIN_ULPDU_LEN`].
    UlpduTooShort,
    /// Emit only: a ULPDU above 65535 octets.
    UlpduTooLong,
    /// Markers are on and the stream position is not a multiple of 4: a
    /// local bookkeeping error, since every FPDU is a multiple of 4 octets.
    Misaligned,
    /// Emit only: the ULPDU pieces do not add up to the planned length.
    LengthMismatch,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::Truncated => "truncated FPDU",
            Error::Crc => "FPDU CRC mismatch",
            Error::Marker => "FPDU marker does not point at the FPDU start",
            Error::UlpduTooShort => "ULPDU shorter than a DDP header",
            Error::UlpduTooLong => "ULPDU longer than 65535 octets",
            Error::Misaligned => "FPDU stream position is not a multiple of 4",
            Error::LengthMismatch => "ULPDU pieces do not match the FPDU length",
        })
    }
}

impl std::error::Error for Error {}

impl From<Error> for TermCode {
    fn from(e: Error) -> TermCode {
        match e {
            // A receiver only reports Truncated when the stream ends inside
            // an FPDU: RFC 5044 §8 code 1, connection closed or lost.
            Error::Truncated => TermCode::MPA_CONNECTION_LOST,
            Error::Crc => TermCode::MPA_CRC,
            Error::Marker => TermCode::MPA_MARKER,
            // No code in RFC 5044 §8, RFC 6581 §8 or RFC 5041 §7 names a
            // CRC-valid FPDU too short for a DDP header; code 4 is MPA's
            // "invalid framing, close the connection".
            Error::UlpduTooShort => TermCode::MPA_INVALID_FRAME,
            // Our own faults (RFC 6581 §9.3: local catastrophic).
            Error::UlpduTooLong | Error::Misaligned | Error::LengthMismatch => {
                TermCode::MPA_LOCAL_CATASTROPHIC
            }
        }
    }
}

/// What the two MPA Request/Reply frames negotiated for one direction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Framing {
    /// Markers in this direction (the *receiver's* M bit).
    pub markers: bool,
    /// CRCs generated and checked (either side's C bit).
    pub crc: bool,
}

/// The maximum ULPDU for an FPDU that fits in a TCP segment of `emss`
/// octets (RFC 5044 §4.5, used as §5.1 says), never below 128 and never
/// above 65535.
///
/// With markers: `EMSS - (6 + 4 * Ceiling(EMSS / 512) + EMSS mod 4)`;
/// without: `EMSS - (6 + EMSS mod 4)`.
pub fn mulpdu(emss: usize, markers: bool) -> usize {
    let overhead = if markers {
        // RFC 5044 §4.5: "The formula above accounts for the worst-case
        // number of Markers."
        6 + 4 * emss.div_ceil(512) + emss % 4
    } else {
        6 + emss % 4
    };
    // RFC 5044 §4.5: "the MPA on TCP sender MUST NOT shrink the MULPDU below
    // 128 octets". The upper bound is the ULPDU_Length field.
    emss.saturating_sub(overhead)
        .clamp(MIN_MULPDU, MAX_ULPDU_LEN)
}

/// Pad octets after a ULPDU of `ulpdu_len` octets: RFC 5044 §4.1 "The
/// length of the pad is set so as to make the size of the FPDU an integral
/// multiple of four."
pub const fn pad_len(ulpdu_len: usize) -> usize {
    (4 - (HEADER_LEN + ulpdu_len) % 4) % 4
}

/// Octets from stream position `pos` to the next marker position (0 if a
/// marker starts at `pos`).
pub const fn bytes_to_marker(pos: u64) -> usize {
    // < 512, so the cast is lossless.
    ((MARKER_INTERVAL - pos % MARKER_INTERVAL) % MARKER_INTERVAL) as usize
}

/// The geometry of one FPDU: where its markers, length field, ULPDU
/// pieces, pad and CRC fall, given its ULPDU length and the stream position
/// of its first octet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Layout {
    pos: u64,
    ulpdu_len: u16,
    markers: bool,
}

impl Layout {
    /// The layout of an FPDU carrying `ulpdu_len` octets whose first octet
    /// is at stream position `pos`.
    pub fn new(pos: u64, ulpdu_len: usize, markers: bool) -> Result<Layout, Error> {
        let ulpdu_len = u16::try_from(ulpdu_len).map_err(|_| Error::UlpduTooLong)?;
        if markers && !pos.is_multiple_of(4) {
            return Err(Error::Misaligned);
        }
        Ok(Layout {
            pos,
            ulpdu_len,
            markers,
        })
    }

    /// How many octets at `pos` [`Layout::from_header`] needs: the length
    /// field, plus the marker in front of it when one is due.
    pub fn prefix_len(pos: u64, markers: bool) -> usize {
        if markers && bytes_to_marker(pos) == 0 {
            MARKER_LEN + HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// The layout of the FPDU whose first octets, at stream position `pos`,
    /// are `prefix` (at least [`Layout::prefix_len`] of them; more are
    /// ignored). This is how a stream reader learns how many octets the FPDU
    /// takes before it has them all (RFC 5044 §6: "The ULPDU Length field
    /// ... MUST be used to determine if the entire FPDU is present").
    pub fn from_header(prefix: &[u8], pos: u64, markers: bool) -> Result<Layout, Error> {
        if markers && !pos.is_multiple_of(4) {
            return Err(Error::Misaligned);
        }
        let at = Self::prefix_len(pos, markers) - HEADER_LEN;
        match prefix.get(at..at + HEADER_LEN) {
            Some(&[hi, lo]) => Layout::new(pos, usize::from(u16::from_be_bytes([hi, lo])), markers),
            _ => Err(Error::Truncated),
        }
    }

    /// Stream position of the first octet.
    pub const fn pos(&self) -> u64 {
        self.pos
    }

    /// Whether markers are inserted.
    pub const fn markers(&self) -> bool {
        self.markers
    }

    /// ULPDU length.
    pub const fn ulpdu_len(&self) -> usize {
        self.ulpdu_len as usize
    }

    /// Pad length.
    pub const fn pad_len(&self) -> usize {
        pad_len(self.ulpdu_len as usize)
    }

    /// Offset of the ULPDU_Length field: 4 when a marker precedes it.
    pub fn header_offset(&self) -> usize {
        Self::prefix_len(self.pos, self.markers) - HEADER_LEN
    }

    /// Octets of the FPDU without markers: length field, ULPDU, pad, CRC.
    pub const fn content_len(&self) -> usize {
        HEADER_LEN + self.ulpdu_len() + self.pad_len() + CRC_LEN
    }

    /// Number of markers inside this FPDU (including a leading one).
    pub fn marker_count(&self) -> usize {
        if !self.markers {
            return 0;
        }
        // Marker k is at wire offset g + 512k and has g + 508k content
        // octets before it; it belongs to this FPDU iff content remains.
        let g = bytes_to_marker(self.pos);
        let content = self.content_len();
        if g >= content {
            0
        } else {
            (content - g - 1) / (MARKER_INTERVAL as usize - MARKER_LEN) + 1
        }
    }

    /// Total octets on the wire.
    pub fn wire_len(&self) -> usize {
        self.content_len() + MARKER_LEN * self.marker_count()
    }

    /// Offset of the CRC field; every octet before it is covered by the CRC
    /// (RFC 5044 §4.4 rules 1 and 2: markers included, a leading one too).
    pub fn crc_offset(&self) -> usize {
        self.wire_len() - CRC_LEN
    }

    /// The FPDU's pieces in wire order.
    pub fn segments(&self) -> Segments {
        Segments {
            layout: *self,
            wire: 0,
            region: Region::Header,
            in_region: 0,
            next_marker: if self.markers {
                bytes_to_marker(self.pos)
            } else {
                usize::MAX
            },
            header_offset: self.header_offset(),
        }
    }
}

/// What a [`Segment`] of an FPDU holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SegmentKind {
    /// A marker, and the FPDUPTR it must carry.
    Marker {
        /// RFC 5044 §4.3: the octets from the ULPDU_Length field to the
        /// marker, or 0 for a marker just before it. Kept to 16 bits: only
        /// an FPDU larger than any TCP segment could overflow it.
        fpduptr: u16,
    },
    /// (Part of) the ULPDU_Length field.
    Header,
    /// ULPDU octets starting at this ULPDU offset.
    Ulpdu {
        /// Offset within the ULPDU of the segment's first octet.
        offset: usize,
    },
    /// Pad octets.
    Pad,
    /// (Part of) the CRC field.
    Crc,
}

/// A run of octets of one kind, at `wire` offsets from the FPDU's start.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Segment {
    /// Offsets within the FPDU.
    pub wire: Range<usize>,
    /// What they are.
    pub kind: SegmentKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Region {
    Header,
    Ulpdu,
    Pad,
    Crc,
    Done,
}

/// Iterator over the [`Segment`]s of a [`Layout`].
#[derive(Debug, Clone)]
pub struct Segments {
    layout: Layout,
    wire: usize,
    region: Region,
    in_region: usize,
    next_marker: usize,
    header_offset: usize,
}

impl Iterator for Segments {
    type Item = Segment;

    fn next(&mut self) -> Option<Segment> {
        loop {
            let (len, next) = match self.region {
                Region::Header => (HEADER_LEN, Region::Ulpdu),
                Region::Ulpdu => (self.layout.ulpdu_len(), Region::Pad),
                Region::Pad => (self.layout.pad_len(), Region::Crc),
                Region::Crc => (CRC_LEN, Region::Done),
                Region::Done => return None,
            };
            if self.in_region >= len {
                self.region = next;
                self.in_region = 0;
                continue;
            }
            let start = self.wire;
            if start == self.next_marker {
                // RFC 5044 §4.3: FPDUPTR "MUST contain the number of octets
                // in the TCP stream from the beginning of the ULPDU Length
                // field to the first octet of the Marker, unless the Marker
                // falls between FPDUs", when it is 0x0000.
                let fpduptr = start.saturating_sub(self.header_offset) as u16;
                self.wire += MARKER_LEN;
                self.next_marker = self.next_marker.saturating_add(MARKER_INTERVAL as usize);
                return Some(Segment {
                    wire: start..self.wire,
                    kind: SegmentKind::Marker { fpduptr },
                });
            }
            let take = (len - self.in_region).min(self.next_marker - start);
            let kind = match self.region {
                Region::Header => SegmentKind::Header,
                Region::Ulpdu => SegmentKind::Ulpdu {
                    offset: self.in_region,
                },
                Region::Pad => SegmentKind::Pad,
                _ => SegmentKind::Crc,
            };
            self.wire += take;
            self.in_region += take;
            return Some(Segment {
                wire: start..self.wire,
                kind,
            });
        }
    }
}

/// A read/write view of one FPDU in a buffer starting at its first octet.
///
/// Unlike most views, its shape depends on where it sits in the stream
/// (markers), so it carries its [`Layout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fpdu<T: AsRef<[u8]>> {
    buffer: T,
    layout: Layout,
}

impl<T: AsRef<[u8]>> Fpdu<T> {
    /// Wraps `buffer` as an FPDU of the given layout (for emitting).
    pub const fn new_unchecked(buffer: T, layout: Layout) -> Fpdu<T> {
        Fpdu { buffer, layout }
    }

    /// Reads the ULPDU_Length of the FPDU at stream position `pos` and
    /// checks the whole FPDU is in `buffer` (which may hold more after it).
    /// `Error::Truncated` means: wait for more octets.
    pub fn new_checked(buffer: T, pos: u64, markers: bool) -> Result<Fpdu<T>, Error> {
        let layout = Layout::from_header(buffer.as_ref(), pos, markers)?;
        let fpdu = Self::new_unchecked(buffer, layout);
        fpdu.check_len()?;
        Ok(fpdu)
    }

    /// Checks that the buffer holds the whole FPDU of this layout.
    pub fn check_len(&self) -> Result<(), Error> {
        if self.buffer.as_ref().len() < self.layout.wire_len() {
            Err(Error::Truncated)
        } else {
            Ok(())
        }
    }

    /// Consumes the view and returns the buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The layout.
    pub const fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The FPDU's octets (the buffer may continue past them).
    pub fn as_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.layout.wire_len()]
    }

    /// The ULPDU_Length field.
    pub fn ulpdu_length(&self) -> u16 {
        let at = self.layout.header_offset();
        let b = &self.buffer.as_ref()[at..at + HEADER_LEN];
        u16::from_be_bytes([b[0], b[1]])
    }

    /// The CRC field, as a value (see [`crc::from_wire`]).
    pub fn crc(&self) -> u32 {
        let at = self.layout.crc_offset();
        let b = &self.buffer.as_ref()[at..at + CRC_LEN];
        crc::from_wire([b[0], b[1], b[2], b[3]])
    }

    /// Every marker: its offset in the FPDU, the FPDUPTR it carries and the
    /// FPDUPTR it should carry. The reserved half is not reported: RFC 5044
    /// §4.2 "ignored on receive (except for CRC calculation)".
    pub fn markers(&self) -> impl Iterator<Item = (usize, u16, u16)> + '_ {
        let bytes = self.buffer.as_ref();
        self.layout.segments().filter_map(move |s| match s.kind {
            SegmentKind::Marker { fpduptr } => {
                let m = &bytes[s.wire.start..s.wire.end];
                Some((s.wire.start, u16::from_be_bytes([m[2], m[3]]), fpduptr))
            }
            _ => None,
        })
    }

    /// The pad octets.
    pub fn pad(&self) -> &[u8] {
        let end = self.layout.crc_offset();
        let start = end - self.layout.pad_len();
        // A marker can sit between pad and CRC (RFC 5044 §4.4 rule 1).
        let marker_before_crc = self
            .layout
            .segments()
            .any(|s| s.wire.end == end && matches!(s.kind, SegmentKind::Marker { .. }));
        let shift = if marker_before_crc { MARKER_LEN } else { 0 };
        &self.buffer.as_ref()[start - shift..end - shift]
    }

    /// The CRC32c of every octet before the CRC field.
    pub fn compute_crc(&self) -> u32 {
        crc::checksum(&self.buffer.as_ref()[..self.layout.crc_offset()])
    }

    /// Checks the CRC field.
    pub fn check_crc(&self) -> Result<(), Error> {
        // RFC 5044 §4.4: "If not, the receiver MUST treat the FPDU as an
        // invalid FPDU."
        if self.compute_crc() == self.crc() {
            Ok(())
        } else {
            Err(Error::Crc)
        }
    }

    /// Checks that every marker points at this FPDU.
    pub fn check_markers(&self) -> Result<(), Error> {
        for (_, got, want) in self.markers() {
            // RFC 5044 §4.2: "the receivers MUST always treat these [the
            // least significant two bits] as zero for calculations".
            if got & !3 != want {
                return Err(Error::Marker);
            }
        }
        Ok(())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Fpdu<T> {
    /// Sets the ULPDU_Length field.
    pub fn set_ulpdu_length(&mut self, value: u16) {
        let at = self.layout.header_offset();
        self.buffer.as_mut()[at..at + HEADER_LEN].copy_from_slice(&value.to_be_bytes());
    }

    /// Sets the CRC field to `value` (see [`crc::to_wire`]).
    pub fn set_crc(&mut self, value: u32) {
        let at = self.layout.crc_offset();
        self.buffer.as_mut()[at..at + CRC_LEN].copy_from_slice(&crc::to_wire(value));
    }

    /// Writes every marker (reserved half zero, FPDUPTR from the layout),
    /// the ULPDU_Length field from the layout, and zero pad: RFC 5044 §4.1
    /// "The pad data MUST be set to zero by the sender", §4.2 "RESERVED
    /// ... MUST be set to zero on transmit".
    pub fn fill_framing(&mut self) {
        let ulpdu_len = self.layout.ulpdu_len;
        let buf = self.buffer.as_mut();
        for s in self.layout.segments() {
            let dst = &mut buf[s.wire.clone()];
            match s.kind {
                SegmentKind::Marker { fpduptr } => {
                    dst[..2].fill(0);
                    dst[2..].copy_from_slice(&fpduptr.to_be_bytes());
                }
                SegmentKind::Pad => dst.fill(0),
                _ => {}
            }
        }
        self.set_ulpdu_length(ulpdu_len);
    }

    /// Copies `ulpdu` (whose length must be the layout's) into the ULPDU
    /// segments.
    pub fn set_ulpdu(&mut self, ulpdu: Ulpdu<'_>) -> Result<(), Error> {
        if ulpdu.len() != self.layout.ulpdu_len() {
            return Err(Error::LengthMismatch);
        }
        let mut src = Cursor::new(ulpdu.pieces());
        let buf = self.buffer.as_mut();
        for s in self.layout.segments() {
            if let SegmentKind::Ulpdu { .. } = s.kind {
                src.copy_to(&mut buf[s.wire]);
            }
        }
        Ok(())
    }

    /// Computes and writes the CRC, or zero when CRCs are off (RFC 5044
    /// §4.1: the field "is still present, may contain any value").
    pub fn fill_crc(&mut self, enabled: bool) {
        let value = if enabled { self.compute_crc() } else { 0 };
        self.set_crc(value);
    }
}

/// The octets of a ULPDU: one slice, or the pieces between the markers of a
/// received FPDU (borrowed, not copied).
#[derive(Debug, Clone, Copy)]
pub struct Ulpdu<'a> {
    bytes: &'a [u8],
    /// When set, `bytes` is a whole FPDU of this layout.
    framed: Option<Layout>,
}

impl<'a> Ulpdu<'a> {
    /// A contiguous ULPDU.
    pub const fn new(bytes: &'a [u8]) -> Ulpdu<'a> {
        Ulpdu {
            bytes,
            framed: None,
        }
    }

    /// Length in octets.
    pub fn len(&self) -> usize {
        match self.framed {
            Some(layout) => layout.ulpdu_len(),
            None => self.bytes.len(),
        }
    }

    /// Whether it has no octets.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pieces in order (one unless markers split it).
    pub fn pieces(&self) -> Pieces<'a> {
        Pieces {
            bytes: self.bytes,
            segments: self.framed.map(|l| l.segments()),
            done: false,
        }
    }

    /// The ULPDU as one slice, if no marker splits it.
    pub fn as_contiguous(&self) -> Option<&'a [u8]> {
        let mut pieces = self.pieces();
        match (pieces.next(), pieces.next()) {
            (None, _) => Some(&[]),
            (Some(one), None) => Some(one),
            _ => None,
        }
    }

    /// The ULPDU copied into a vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len());
        for p in self.pieces() {
            v.extend_from_slice(p);
        }
        v
    }
}

impl<'a> From<&'a [u8]> for Ulpdu<'a> {
    fn from(bytes: &'a [u8]) -> Ulpdu<'a> {
        Ulpdu::new(bytes)
    }
}

impl PartialEq for Ulpdu<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.pieces().flatten().eq(other.pieces().flatten())
    }
}

impl Eq for Ulpdu<'_> {}

/// Iterator over the pieces of a [`Ulpdu`].
#[derive(Debug, Clone)]
pub struct Pieces<'a> {
    bytes: &'a [u8],
    segments: Option<Segments>,
    done: bool,
}

impl<'a> Iterator for Pieces<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        match &mut self.segments {
            None => {
                if self.done || self.bytes.is_empty() {
                    return None;
                }
                self.done = true;
                Some(self.bytes)
            }
            Some(segments) => segments.find_map(|s| match s.kind {
                // In range: a framed Ulpdu is only built from a checked view.
                SegmentKind::Ulpdu { .. } => self.bytes.get(s.wire),
                _ => None,
            }),
        }
    }
}

/// Sequential reader over a list of slices.
struct Cursor<'a, I: Iterator<Item = &'a [u8]>> {
    pieces: I,
    current: &'a [u8],
}

impl<'a, I: Iterator<Item = &'a [u8]>> Cursor<'a, I> {
    fn new(pieces: I) -> Self {
        Cursor {
            pieces,
            current: &[],
        }
    }

    /// Hands the next `n` octets to `f` in as few slices as possible;
    /// returns how many there were.
    fn take(&mut self, mut n: usize, mut f: impl FnMut(&'a [u8])) -> usize {
        let mut done = 0;
        while n > 0 {
            if self.current.is_empty() {
                match self.pieces.next() {
                    Some(p) => self.current = p,
                    None => break,
                }
                continue;
            }
            let (now, rest) = self.current.split_at(n.min(self.current.len()));
            f(now);
            self.current = rest;
            n -= now.len();
            done += now.len();
        }
        done
    }

    fn copy_to(&mut self, dst: &mut [u8]) {
        let mut at = 0;
        self.take(dst.len(), |s| {
            dst[at..at + s.len()].copy_from_slice(s);
            at += s.len();
        });
    }
}

/// A parsed (or to-be-emitted) FPDU: its ULPDU. The stream position and
/// the negotiated [`Framing`] are context, given to `parse` and `emit`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FpduRepr<'a> {
    /// The ULPDU (a DDP segment), without markers, header, pad or CRC.
    pub ulpdu: Ulpdu<'a>,
}

impl<'a> FpduRepr<'a> {
    /// Verifies a received FPDU — CRC (if `crc`), then markers, then the
    /// ULPDU length — and returns its ULPDU.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(
        fpdu: &Fpdu<&'a T>,
        crc: bool,
    ) -> Result<FpduRepr<'a>, Error> {
        fpdu.check_len()?;
        // RFC 5044 §4.1: "When CRCs are not enabled, this field ... MUST
        // NOT be checked." RFC 5044 §6: the receiver "MUST first verify the
        // FPDU before passing the ULPDU to DDP".
        if crc {
            fpdu.check_crc()?;
        }
        // RFC 5044 §8 code 3 applies "In the event that the CRC is valid":
        // hence after the CRC. Checking every marker is OPTIONAL there; we
        // do, since it is cheap here.
        fpdu.check_markers()?;
        // Every DDP segment carries a whole DDP header (RFC 5041 §5).
        if fpdu.layout.ulpdu_len() < MIN_ULPDU_LEN {
            return Err(Error::UlpduTooShort);
        }
        let bytes: &'a [u8] = T::as_ref(fpdu.buffer);
        Ok(FpduRepr {
            ulpdu: Ulpdu {
                bytes: bytes
                    .get(..fpdu.layout.wire_len())
                    .ok_or(Error::Truncated)?,
                framed: Some(fpdu.layout),
            },
        })
    }

    /// The layout this FPDU takes at stream position `pos`.
    pub fn layout(&self, pos: u64, markers: bool) -> Result<Layout, Error> {
        Layout::new(pos, self.ulpdu.len(), markers)
    }

    /// The emitted length at stream position `pos`; fails like
    /// [`Layout::new`] (ULPDU over 65535 octets, misaligned position).
    pub fn buffer_len(&self, pos: u64, markers: bool) -> Result<usize, Error> {
        Ok(self.layout(pos, markers)?.wire_len())
    }

    /// Writes the FPDU into `fpdu`, whose layout must be this ULPDU's.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]> + ?Sized>(
        &self,
        fpdu: &mut Fpdu<&mut T>,
        crc: bool,
    ) -> Result<(), Error> {
        if self.ulpdu.len() < MIN_ULPDU_LEN {
            return Err(Error::UlpduTooShort);
        }
        fpdu.check_len()?;
        fpdu.set_ulpdu(self.ulpdu)?;
        fpdu.fill_framing();
        fpdu.fill_crc(crc);
        Ok(())
    }

    /// Writes the FPDU that starts at stream position `pos` into the front
    /// of `out`; returns its length.
    pub fn emit_to(&self, pos: u64, framing: Framing, out: &mut [u8]) -> Result<usize, Error> {
        let layout = self.layout(pos, framing.markers)?;
        self.emit(&mut Fpdu::new_unchecked(out, layout), framing.crc)?;
        Ok(layout.wire_len())
    }

    /// The FPDU that starts at stream position `pos`, as a vector.
    pub fn to_vec(&self, pos: u64, framing: Framing) -> Result<Vec<u8>, Error> {
        let mut out = vec![0u8; self.buffer_len(pos, framing.markers)?];
        self.emit_to(pos, framing, &mut out)?;
        Ok(out)
    }
}

/// Checks and deframes the FPDU at the front of `wire`, whose first octet
/// is at stream position `pos`. Returns its ULPDU and the octets it took.
/// `Error::Truncated` means the buffer holds only part of it.
pub fn parse(wire: &[u8], pos: u64, framing: Framing) -> Result<(FpduRepr<'_>, usize), Error> {
    let fpdu = Fpdu::new_checked(wire, pos, framing.markers)?;
    let repr = FpduRepr::parse(&fpdu, framing.crc)?;
    Ok((repr, fpdu.layout.wire_len()))
}

/// One entry of a [`TxPlan`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Piece {
    /// Octets MPA made (markers, ULPDU_Length, pad, CRC): this range of
    /// [`TxPlan::mpa_bytes`].
    Mpa(Range<usize>),
    /// This range of ULPDU offsets, from the caller's memory.
    Ulpdu(Range<usize>),
}

/// A gather list for transmitting one FPDU without copying its ULPDU
/// (DESIGN §3.2): MPA's own octets interleaved with ranges of the ULPDU,
/// e.g. `[marker, ULPDU_Length] [ULPDU 0..506] [marker] [ULPDU 506..900]
/// [pad, CRC]`, ready for `writev`.
///
/// The ULPDU itself is given as a list of parts (a DDP header and the
/// application's buffer, say); [`TxPlan::seal`] computes the CRC over the
/// pieces in wire order and [`TxPlan::for_each_slice`] yields the slices.
///
/// ```
/// use iwarp::wire::fpdu::{Framing, FpduRepr, Layout, TxPlan, Ulpdu};
///
/// let header = [0x41, 0x43, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0];
/// let payload = vec![7u8; 1000];
/// let mut plan = TxPlan::new(Layout::new(508, header.len() + payload.len(), true).unwrap());
/// plan.seal(&[&header, &payload], true).unwrap();
///
/// let mut iov = Vec::new(); // would be IoSlices for writev
/// plan.for_each_slice(&[&header, &payload], |s| iov.push(s)).unwrap();
/// let wire: Vec<u8> = iov.concat();
///
/// let ulpdu = [&header[..], &payload[..]].concat();
/// let framing = Framing { markers: true, crc: true };
/// assert_eq!(wire, FpduRepr { ulpdu: Ulpdu::new(&ulpdu) }.to_vec(508, framing).unwrap());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TxPlan {
    layout: Layout,
    bytes: Vec<u8>,
    pieces: Vec<Piece>,
}

impl TxPlan {
    /// Plans the FPDU of `layout`. The CRC field is zero until sealed.
    pub fn new(layout: Layout) -> TxPlan {
        let mut plan = TxPlan {
            layout,
            bytes: Vec::new(),
            pieces: Vec::new(),
        };
        plan.rebuild(layout);
        plan
    }

    /// Re-plans for another FPDU, keeping the allocations.
    pub fn rebuild(&mut self, layout: Layout) {
        self.layout = layout;
        self.bytes.clear();
        self.pieces.clear();
        let header = layout.ulpdu_len.to_be_bytes();
        for s in layout.segments() {
            let piece = match s.kind {
                SegmentKind::Ulpdu { offset } => Piece::Ulpdu(offset..offset + s.wire.len()),
                kind => {
                    let start = self.bytes.len();
                    match kind {
                        SegmentKind::Marker { fpduptr } => {
                            self.bytes.extend_from_slice(&[0, 0]);
                            self.bytes.extend_from_slice(&fpduptr.to_be_bytes());
                        }
                        SegmentKind::Header => self.bytes.extend_from_slice(&header),
                        // Pad and CRC placeholder: zero.
                        _ => self.bytes.resize(start + s.wire.len(), 0),
                    }
                    Piece::Mpa(start..self.bytes.len())
                }
            };
            // Adjacent MPA octets become one piece.
            match (self.pieces.last_mut(), &piece) {
                (Some(Piece::Mpa(last)), Piece::Mpa(new)) if last.end == new.start => {
                    last.end = new.end
                }
                _ => self.pieces.push(piece),
            }
        }
    }

    /// The layout.
    pub const fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The pieces in wire order.
    pub fn pieces(&self) -> &[Piece] {
        &self.pieces
    }

    /// The octets [`Piece::Mpa`] ranges refer to.
    pub fn mpa_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Total octets on the wire.
    pub fn wire_len(&self) -> usize {
        self.layout.wire_len()
    }

    /// Computes the CRC over the pieces (with `ulpdu` as the ULPDU's parts,
    /// in order) and stores it; with `crc` off the field stays zero.
    pub fn seal(&mut self, ulpdu: &[&[u8]], crc: bool) -> Result<(), Error> {
        if self.layout.ulpdu_len() < MIN_ULPDU_LEN {
            return Err(Error::UlpduTooShort);
        }
        let crc_start = self.bytes.len() - CRC_LEN;
        let value = if crc {
            let mut c = Crc::new();
            self.walk(ulpdu, |s, mpa_start| {
                // Everything but the CRC field itself (the last 4 octets).
                let covered = match mpa_start {
                    Some(start) => &s[..crc_start.saturating_sub(start).min(s.len())],
                    None => s,
                };
                c.update(covered);
            })?;
            c.finish()
        } else {
            self.walk(ulpdu, |_, _| {})?;
            0
        };
        self.bytes[crc_start..].copy_from_slice(&crc::to_wire(value));
        Ok(())
    }

    /// Hands `f` the FPDU's slices in wire order: MPA octets from this plan
    /// and ULPDU octets from `ulpdu`'s parts.
    pub fn for_each_slice<'s>(
        &'s self,
        ulpdu: &[&'s [u8]],
        mut f: impl FnMut(&'s [u8]),
    ) -> Result<(), Error> {
        self.walk(ulpdu, |s, _| f(s))
    }

    /// `f` gets each slice and, for MPA octets, their offset in `bytes`.
    fn walk<'s>(
        &'s self,
        ulpdu: &[&'s [u8]],
        mut f: impl FnMut(&'s [u8], Option<usize>),
    ) -> Result<(), Error> {
        let total = ulpdu
            .iter()
            .try_fold(0usize, |acc, p| acc.checked_add(p.len()));
        if total != Some(self.layout.ulpdu_len()) {
            return Err(Error::LengthMismatch);
        }
        let mut src = Cursor::new(ulpdu.iter().copied());
        for piece in &self.pieces {
            match piece {
                Piece::Mpa(r) => f(&self.bytes[r.clone()], Some(r.start)),
                Piece::Ulpdu(r) => {
                    src.take(r.len(), |s| f(s, None));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ON: Framing = Framing {
        markers: true,
        crc: true,
    };

    /// RFC 5044 Figure 5, transcribed: stream octets 0x00..=0x33.
    fn figure5() -> Vec<u8> {
        let mut v = vec![
            0x00, 0x00, // 0000 Marker: Reserved
            0x00, 0x00, // 0002 Marker: FPDUPTR
            0x00, 0x2a, // 0004 ULPDU Length
            0x41, 0x43, // 0006 DDP Control Field, Send with Last flag set
            0x00, 0x00, 0x00, 0x00, // 0008 Reserved (DDP STag position with no STag)
            0x00, 0x00, 0x00, 0x00, // 000c DDP Queue = 0
            0x00, 0x00, 0x00, 0x01, // 0010 DDP MSN = 1
            0x00, 0x00, 0x00, 0x00, // 0014 DDP MO = 0
        ];
        v.extend_from_slice(&[0x00; 24]); // 0018..=002f DDP Send Data
        v.extend_from_slice(&[0x52, 0x23, 0x99, 0x83]); // 0030 CRC32c
        assert_eq!(v.len(), 0x34);
        v
    }

    /// The 42-octet ULPDU of Figure 5.
    fn figure5_ulpdu() -> Vec<u8> {
        figure5()[6..0x30].to_vec()
    }

    /// RFC 5044 Figure 6, transcribed: stream octets 0x1ec..=0x21f.
    const FIGURE6_POS: u64 = 0x1ec;
    fn figure6() -> Vec<u8> {
        let mut v = vec![
            0x00, 0x2a, // 01ec Length
            0x41, 0x43, // 01ee DDP Control Field: Send with Last Flag set
            0x00, 0x00, 0x00, 0x00, // 01f0 Reserved (DDP STag position with no STag)
            0x00, 0x00, 0x00, 0x00, // 01f4 DDP Queue = 0
            0x00, 0x00, 0x00, 0x02, // 01f8 DDP MSN = 2
            0x00, 0x00, 0x00, 0x00, // 01fc DDP MO = 0
            0x00, 0x00, // 0200 Marker: Reserved
            0x00, 0x14, // 0202 Marker: FPDUPTR
        ];
        v.extend_from_slice(&[0x00; 24]); // 0204..=021b DDP Send Data
        v.extend_from_slice(&[0x84, 0x92, 0x58, 0x98]); // 021c CRC32c
        assert_eq!(v.len(), 0x220 - 0x1ec);
        v
    }

    fn figure6_ulpdu() -> Vec<u8> {
        let f = figure6();
        [&f[2..20], &f[24..48]].concat()
    }

    /// A ULPDU of `len` octets that are not all alike.
    fn ulpdu(len: usize) -> Vec<u8> {
        (0..len).map(|i| (i * 7 + 3) as u8).collect()
    }

    #[test]
    fn test_deconstruct() {
        let f5 = figure5();
        let f = Fpdu::new_checked(&f5[..], 0, true).unwrap();
        assert_eq!(f.layout().header_offset(), 4);
        assert_eq!(f.ulpdu_length(), 0x2a);
        assert_eq!(f.crc(), 0x8399_2352);
        assert_eq!(f.compute_crc(), 0x8399_2352);
        assert_eq!(f.markers().collect::<Vec<_>>(), vec![(0, 0, 0)]);
        assert_eq!(f.pad(), &[] as &[u8]);
        assert_eq!(f.as_bytes(), &f5[..]);

        let f6 = figure6();
        let f = Fpdu::new_checked(&f6[..], FIGURE6_POS, true).unwrap();
        assert_eq!(f.layout().header_offset(), 0);
        assert_eq!(f.ulpdu_length(), 0x2a);
        assert_eq!(f.crc(), 0x9858_9284);
        assert_eq!(f.compute_crc(), 0x9858_9284);
        assert_eq!(f.markers().collect::<Vec<_>>(), vec![(0x14, 0x14, 0x14)]);
        let pieces: Vec<&[u8]> = FpduRepr::parse(&f, true).unwrap().ulpdu.pieces().collect();
        assert_eq!(pieces, vec![&f6[2..20], &f6[24..48]]);
    }

    #[test]
    fn test_construct() {
        let layout = Layout::new(0, 42, true).unwrap();
        let mut bytes = vec![0xeeu8; layout.wire_len()];
        let mut f = Fpdu::new_unchecked(&mut bytes[..], layout);
        f.set_ulpdu(Ulpdu::new(&figure5_ulpdu())).unwrap();
        f.fill_framing();
        f.set_crc(0x8399_2352);
        assert_eq!(bytes, figure5());

        let layout = Layout::new(FIGURE6_POS, 42, true).unwrap();
        let mut bytes = vec![0xeeu8; layout.wire_len()];
        let mut f = Fpdu::new_unchecked(&mut bytes[..], layout);
        f.set_ulpdu(Ulpdu::new(&figure6_ulpdu())).unwrap();
        f.fill_framing();
        f.fill_crc(true);
        assert_eq!(bytes, figure6());
    }

    #[test]
    fn test_parse() {
        let f5 = figure5();
        let (repr, used) = parse(&f5, 0, ON).unwrap();
        assert_eq!(used, 0x34);
        assert_eq!(repr.ulpdu.to_vec(), figure5_ulpdu());
        assert_eq!(repr.ulpdu.as_contiguous(), Some(&f5[6..0x30]));

        let f6 = figure6();
        let (repr, used) = parse(&f6, FIGURE6_POS, ON).unwrap();
        assert_eq!(used, 0x34);
        assert_eq!(repr.ulpdu.to_vec(), figure6_ulpdu());
        assert_eq!(repr.ulpdu.as_contiguous(), None);
        assert_eq!(repr.ulpdu, Ulpdu::new(&figure6_ulpdu()));
    }

    #[test]
    fn test_emit() {
        let u5 = figure5_ulpdu();
        let repr = FpduRepr {
            ulpdu: Ulpdu::new(&u5),
        };
        assert_eq!(repr.to_vec(0, ON).unwrap(), figure5());
        let u6 = figure6_ulpdu();
        let repr = FpduRepr {
            ulpdu: Ulpdu::new(&u6),
        };
        assert_eq!(repr.to_vec(FIGURE6_POS, ON).unwrap(), figure6());
        // Emitting from a parsed (split) ULPDU gives the same bytes.
        let f6 = figure6();
        let (parsed, _) = parse(&f6, FIGURE6_POS, ON).unwrap();
        assert_eq!(parsed.to_vec(FIGURE6_POS, ON).unwrap(), f6);
    }

    #[test]
    fn figures_through_tx_plan() {
        for (pos, wire, u) in [
            (0, figure5(), figure5_ulpdu()),
            (FIGURE6_POS, figure6(), figure6_ulpdu()),
        ] {
            let mut plan = TxPlan::new(Layout::new(pos, u.len(), true).unwrap());
            // The ULPDU in two parts: DDP header, payload.
            let parts: [&[u8]; 2] = [&u[..18], &u[18..]];
            plan.seal(&parts, true).unwrap();
            let mut out = Vec::new();
            plan.for_each_slice(&parts, |s| out.extend_from_slice(s))
                .unwrap();
            assert_eq!(out, wire);
        }
        // Figure 6's plan: [len] [ULPDU 0..18] [marker] [ULPDU 18..42] [CRC].
        let u = figure6_ulpdu();
        let plan = TxPlan::new(Layout::new(FIGURE6_POS, u.len(), true).unwrap());
        assert_eq!(
            plan.pieces(),
            &[
                Piece::Mpa(0..2),
                Piece::Ulpdu(0..18),
                Piece::Mpa(2..6),
                Piece::Ulpdu(18..42),
                Piece::Mpa(6..10),
            ]
        );
        assert_eq!(plan.mpa_bytes(), &[0, 0x2a, 0, 0, 0, 0x14, 0, 0, 0, 0]);
    }

    /// RFC 5044 Figure 4: ULPDU of 16 octets, marker after ULPDU octet 9
    /// with FPDUPTR 0x000C, 2 octets of pad. (No CRC given.)
    #[test]
    fn figure4_layout() {
        // The header must be 12 octets before a marker position.
        let pos = 512 - 12;
        let layout = Layout::new(pos, 16, true).unwrap();
        let segs: Vec<Segment> = layout.segments().collect();
        assert_eq!(
            segs,
            vec![
                Segment {
                    wire: 0..2,
                    kind: SegmentKind::Header
                },
                Segment {
                    wire: 2..12,
                    kind: SegmentKind::Ulpdu { offset: 0 }
                },
                Segment {
                    wire: 12..16,
                    kind: SegmentKind::Marker { fpduptr: 0x0c }
                },
                Segment {
                    wire: 16..22,
                    kind: SegmentKind::Ulpdu { offset: 10 }
                },
                Segment {
                    wire: 22..24,
                    kind: SegmentKind::Pad
                },
                Segment {
                    wire: 24..28,
                    kind: SegmentKind::Crc
                },
            ]
        );
        let u = ulpdu(16);
        let wire = FpduRepr {
            ulpdu: Ulpdu::new(&u),
        }
        .to_vec(pos, ON)
        .unwrap();
        assert_eq!(&wire[..2], &[0x00, 0x10]);
        assert_eq!(&wire[12..16], &[0x00, 0x00, 0x00, 0x0c]);
        assert_eq!(&wire[22..24], &[0, 0]);
        let f = Fpdu::new_checked(&wire[..], pos, true).unwrap();
        assert_eq!(f.pad(), &[0, 0]);
    }

    #[test]
    fn every_prefix_is_truncated() {
        for (pos, wire) in [(0, figure5()), (FIGURE6_POS, figure6())] {
            for len in 0..wire.len() {
                assert_eq!(
                    parse(&wire[..len], pos, ON).err(),
                    Some(Error::Truncated),
                    "len {len}"
                );
                let f = Fpdu::new_unchecked(&wire[..len], Layout::new(pos, 42, true).unwrap());
                assert_eq!(FpduRepr::parse(&f, true), Err(Error::Truncated));
            }
        }
        assert_eq!(
            TermCode::from(Error::Truncated),
            TermCode::MPA_CONNECTION_LOST
        );
    }

    #[test]
    fn wire_len_from_prefix() {
        let f5 = figure5();
        assert_eq!(Layout::prefix_len(0, true), 6);
        assert_eq!(Layout::prefix_len(0, false), 2);
        assert_eq!(Layout::prefix_len(4, true), 2);
        for len in 0..6 {
            assert_eq!(
                Layout::from_header(&f5[..len], 0, true),
                Err(Error::Truncated)
            );
        }
        assert_eq!(
            Layout::from_header(&f5[..6], 0, true).unwrap().wire_len(),
            0x34
        );
        let f6 = figure6();
        assert_eq!(
            Layout::from_header(&f6[..2], FIGURE6_POS, true)
                .unwrap()
                .wire_len(),
            0x34
        );
        // A following FPDU in the same buffer is left alone.
        let mut two = f5.clone();
        two.extend_from_slice(&[0, 0x2a, 0x41]);
        assert_eq!(parse(&two, 0, ON).unwrap().1, 0x34);
    }

    #[test]
    fn crc_mismatch_anywhere() {
        for (pos, wire) in [(0, figure5()), (FIGURE6_POS, figure6())] {
            for i in 0..wire.len() {
                for bit in 0..8 {
                    let mut bad = wire.clone();
                    bad[i] ^= 1 << bit;
                    let got = parse(&bad, pos, ON);
                    // A flipped length bit may also make the FPDU look longer
                    // than the buffer.
                    assert!(
                        matches!(got, Err(Error::Crc) | Err(Error::Truncated)),
                        "octet {i} bit {bit}: {got:?}"
                    );
                    let header = if pos % 512 == 0 { 4..6 } else { 0..2 };
                    if !header.contains(&i) {
                        assert_eq!(got.err(), Some(Error::Crc), "octet {i} bit {bit}");
                    }
                }
            }
        }
        assert_eq!(TermCode::from(Error::Crc), TermCode::MPA_CRC);
        assert_eq!(TermCode::from(Error::Crc).code.0, 2);
    }

    #[test]
    fn crc_off_is_not_checked() {
        let mut f5 = figure5();
        f5[0x30..].copy_from_slice(&[1, 2, 3, 4]);
        let off = Framing {
            markers: true,
            crc: false,
        };
        let (repr, _) = parse(&f5, 0, off).unwrap();
        assert_eq!(repr.ulpdu.to_vec(), figure5_ulpdu());
        assert_eq!(parse(&f5, 0, ON).err(), Some(Error::Crc));
        // Emitted with CRCs off, the field is zero.
        let out = repr.to_vec(0, off).unwrap();
        assert_eq!(&out[0x30..], &[0, 0, 0, 0]);
    }

    #[test]
    fn marker_disagreeing_with_position() {
        let off = Framing {
            markers: true,
            crc: false,
        };
        // Figure 6 with a wrong FPDUPTR, CRC recomputed so only the marker is
        // wrong.
        for ptr in [0x00u16, 0x10, 0x18, 0x214, 0xffff] {
            let mut f6 = figure6();
            f6[22..24].copy_from_slice(&ptr.to_be_bytes());
            let crc = crc::checksum(&f6[..48]);
            f6[48..].copy_from_slice(&crc::to_wire(crc));
            assert_eq!(parse(&f6, FIGURE6_POS, ON).err(), Some(Error::Marker));
            assert_eq!(parse(&f6, FIGURE6_POS, off).err(), Some(Error::Marker));
        }
        // The leading marker must be zero.
        let mut f5 = figure5();
        f5[3] = 0x04;
        assert_eq!(parse(&f5, 0, off).err(), Some(Error::Marker));
        // Parsed at the wrong position, Figure 6's marker is not where the
        // receiver expects one.
        let f6 = figure6();
        assert_eq!(parse(&f6, FIGURE6_POS + 4, off).err(), Some(Error::Marker));
        assert_eq!(TermCode::from(Error::Marker), TermCode::MPA_MARKER);
        assert_eq!(TermCode::from(Error::Marker).code.0, 3);
    }

    #[test]
    fn marker_reserved_and_low_bits_ignored() {
        let off = Framing {
            markers: true,
            crc: false,
        };
        let mut f6 = figure6();
        f6[20..22].copy_from_slice(&[0xab, 0xcd]);
        f6[23] |= 0x03;
        let (repr, _) = parse(&f6, FIGURE6_POS, off).unwrap();
        assert_eq!(repr.ulpdu.to_vec(), figure6_ulpdu());
        // With CRCs on they still count for the CRC.
        let crc = crc::checksum(&f6[..48]);
        f6[48..].copy_from_slice(&crc::to_wire(crc));
        assert!(parse(&f6, FIGURE6_POS, ON).is_ok());
    }

    #[test]
    fn ulpdu_too_short() {
        for framing in [ON, Framing::default()] {
            for len in 0..MIN_ULPDU_LEN {
                let u = ulpdu(len);
                let layout = Layout::new(0, len, framing.markers).unwrap();
                let mut wire = vec![0u8; layout.wire_len()];
                let mut f = Fpdu::new_unchecked(&mut wire[..], layout);
                f.set_ulpdu(Ulpdu::new(&u)).unwrap();
                f.fill_framing();
                f.fill_crc(true);
                assert_eq!(
                    parse(&wire, 0, framing).err(),
                    Some(Error::UlpduTooShort),
                    "len {len}"
                );
                let repr = FpduRepr {
                    ulpdu: Ulpdu::new(&u),
                };
                assert_eq!(repr.to_vec(0, framing).err(), Some(Error::UlpduTooShort));
                let mut plan = TxPlan::new(layout);
                assert_eq!(plan.seal(&[&u], true), Err(Error::UlpduTooShort));
            }
            // A DDP segment without payload: exactly a tagged header.
            let u = ulpdu(MIN_ULPDU_LEN);
            let wire = FpduRepr {
                ulpdu: Ulpdu::new(&u),
            }
            .to_vec(0, framing)
            .unwrap();
            assert_eq!(parse(&wire, 0, framing).unwrap().0.ulpdu.to_vec(), u);
        }
        assert_eq!(
            TermCode::from(Error::UlpduTooShort),
            TermCode::MPA_INVALID_FRAME
        );
    }

    #[test]
    fn emit_guards() {
        let big = vec![0u8; MAX_ULPDU_LEN + 1];
        let repr = FpduRepr {
            ulpdu: Ulpdu::new(&big),
        };
        assert_eq!(repr.to_vec(0, ON).err(), Some(Error::UlpduTooLong));
        assert_eq!(
            Layout::new(0, MAX_ULPDU_LEN + 1, false),
            Err(Error::UlpduTooLong)
        );
        assert_eq!(Layout::new(2, 20, true), Err(Error::Misaligned));
        assert!(Layout::new(2, 20, false).is_ok());
        assert_eq!(parse(&figure5(), 2, ON).err(), Some(Error::Misaligned));
        let u = ulpdu(20);
        let repr = FpduRepr {
            ulpdu: Ulpdu::new(&u),
        };
        let mut short = vec![0u8; 27];
        assert_eq!(
            repr.emit_to(0, Framing::default(), &mut short),
            Err(Error::Truncated)
        );
        let mut plan = TxPlan::new(Layout::new(0, 20, true).unwrap());
        assert_eq!(plan.seal(&[&u[..19]], true), Err(Error::LengthMismatch));
        assert_eq!(
            plan.for_each_slice(&[&u, &u[..1]], |_| {}),
            Err(Error::LengthMismatch)
        );
        for e in [
            Error::UlpduTooLong,
            Error::Misaligned,
            Error::LengthMismatch,
        ] {
            assert_eq!(TermCode::from(e), TermCode::MPA_LOCAL_CATASTROPHIC);
        }
    }

    #[test]
    fn no_markers_when_off() {
        for pos in [0u64, 2, 3, 510, 512, 1000] {
            let u = ulpdu(1500);
            let framing = Framing {
                markers: false,
                crc: true,
            };
            let wire = FpduRepr {
                ulpdu: Ulpdu::new(&u),
            }
            .to_vec(pos, framing)
            .unwrap();
            assert_eq!(wire.len(), 2 + 1500 + 2 + 4);
            assert_eq!(&wire[..2], &1500u16.to_be_bytes());
            assert_eq!(&wire[2..1502], &u[..]);
            assert_eq!(
                crc::from_wire(wire[1504..].try_into().unwrap()),
                crc::checksum(&wire[..1504])
            );
            let (repr, used) = parse(&wire, pos, framing).unwrap();
            assert_eq!(used, wire.len());
            assert_eq!(repr.ulpdu.as_contiguous(), Some(&u[..]));
        }
    }

    /// Every 4-aligned start relative to a marker, sizes around the
    /// 512 boundaries: layout arithmetic agrees with the segments, markers
    /// land exactly on marker positions with the right FPDUPTR, and the
    /// FPDU round-trips through both emit forms and parse.
    #[test]
    fn markers_at_every_alignment() {
        let sizes: Vec<usize> = [
            14usize, 15, 16, 17, 100, 497, 498, 499, 500, 501, 502, 503, 504, 505, 506, 507, 508,
            509, 510, 511, 512, 513, 1004, 1005, 1006, 1007, 1008, 1012, 1016, 1020, 1021, 1500,
            4096,
        ]
        .into();
        let base = 512 * 1000;
        for g in (0..512).step_by(4) {
            let pos = base + g as u64;
            for &n in &sizes {
                check_alignment(pos, n);
            }
        }
    }

    fn check_alignment(pos: u64, n: usize) {
        let layout = Layout::new(pos, n, true).unwrap();
        let segs: Vec<Segment> = layout.segments().collect();
        // Segments tile the FPDU.
        let mut at = 0;
        let mut ulpdu_at = 0;
        let mut markers = 0;
        let mut header_pos = None;
        for s in &segs {
            assert_eq!(s.wire.start, at);
            assert!(!s.wire.is_empty());
            let stream = pos + at as u64;
            match s.kind {
                SegmentKind::Marker { fpduptr } => {
                    assert_eq!(stream % 512, 0, "marker off position");
                    assert_eq!(s.wire.len(), 4);
                    markers += 1;
                    match header_pos {
                        None => assert_eq!(fpduptr, 0),
                        Some(h) => assert_eq!(u64::from(fpduptr), stream - h),
                    }
                }
                SegmentKind::Header => {
                    assert_eq!(s.wire.len(), 2, "header split");
                    header_pos = Some(stream);
                }
                SegmentKind::Ulpdu { offset } => {
                    assert_eq!(offset, ulpdu_at);
                    ulpdu_at += s.wire.len();
                }
                SegmentKind::Pad => assert!(s.wire.len() < 4),
                SegmentKind::Crc => assert_eq!(s.wire.len(), 4, "CRC split"),
            }
            // No octet other than a marker's first sits on a marker position.
            if !matches!(s.kind, SegmentKind::Marker { .. }) {
                assert!(
                    (stream..stream + s.wire.len() as u64).all(|p| p % 512 != 0),
                    "pos {pos} n {n}: {s:?} covers a marker position"
                );
            }
            at = s.wire.end;
        }
        assert_eq!(ulpdu_at, n);
        assert_eq!(at, layout.wire_len());
        assert_eq!(at % 4, 0);
        assert_eq!(markers, layout.marker_count());
        assert_eq!(segs.last().unwrap().kind, SegmentKind::Crc);

        let u = ulpdu(n);
        let repr = FpduRepr {
            ulpdu: Ulpdu::new(&u),
        };
        let wire = repr.to_vec(pos, ON).unwrap();
        // The gather form gives the same octets, with the ULPDU in 3 parts.
        let cut = [n / 3, 2 * n / 3];
        let parts: [&[u8]; 3] = [&u[..cut[0]], &u[cut[0]..cut[1]], &u[cut[1]..]];
        let mut plan = TxPlan::new(layout);
        plan.seal(&parts, true).unwrap();
        let mut out = Vec::new();
        plan.for_each_slice(&parts, |s| out.extend_from_slice(s))
            .unwrap();
        assert_eq!(out, wire, "pos {pos} n {n}");
        // Parse back, also with the next FPDU's octets behind it.
        let mut stream = wire.clone();
        stream.extend_from_slice(&[0xff; 8]);
        let (back, used) = parse(&stream, pos, ON).unwrap();
        assert_eq!(used, wire.len());
        assert_eq!(back.ulpdu.to_vec(), u);
        assert_eq!(back, repr);
        // The next FPDU starts where this one ended; its layout is sane.
        let next = Layout::new(pos + used as u64, 20, true).unwrap();
        assert_eq!(
            next.header_offset() == 4,
            (pos + used as u64).is_multiple_of(512)
        );
    }

    #[test]
    fn consecutive_fpdus_share_one_marker_grid() {
        // A stream of FPDUs of varying sizes from position 0: every marker
        // in the concatenated stream is at a multiple of 512 and each is
        // parsed back in order.
        let mut stream = Vec::new();
        let mut pos = 0u64;
        let sizes = [42usize, 14, 500, 507, 1000, 3, 2000, 509, 18, 65];
        let mut sent = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            let n = n.max(MIN_ULPDU_LEN);
            let u: Vec<u8> = ulpdu(n).iter().map(|b| b ^ i as u8).collect();
            let wire = FpduRepr {
                ulpdu: Ulpdu::new(&u),
            }
            .to_vec(pos, ON)
            .unwrap();
            pos += wire.len() as u64;
            stream.extend_from_slice(&wire);
            sent.push(u);
        }
        let mut at = 0;
        for u in &sent {
            let (repr, used) = parse(&stream[at..], at as u64, ON).unwrap();
            assert_eq!(&repr.ulpdu.to_vec(), u);
            at += used;
        }
        assert_eq!(at, stream.len());
        // parse checked every FPDUPTR; here: every multiple of 512 in the
        // stream starts a marker, its reserved half zero.
        for m in (0..stream.len()).step_by(512) {
            assert_eq!(&stream[m..m + 2], &[0, 0]);
        }
    }

    #[test]
    fn marker_before_crc() {
        // Header 4 + 2 + n + pad octets before a marker position: the marker
        // sits between pad and CRC and belongs to this FPDU (RFC 5044 §4.4
        // rule 1).
        let n = 30; // 2 + 30 = 32: no pad
        let pos = 512 - 32;
        let layout = Layout::new(pos, n, true).unwrap();
        let kinds: Vec<SegmentKind> = layout.segments().map(|s| s.kind).collect();
        assert_eq!(
            kinds,
            vec![
                SegmentKind::Header,
                SegmentKind::Ulpdu { offset: 0 },
                SegmentKind::Marker { fpduptr: 32 },
                SegmentKind::Crc
            ]
        );
        // A marker position right after the CRC is not part of the FPDU.
        let layout = Layout::new(512 - 36, n, true).unwrap();
        assert_eq!(layout.marker_count(), 0);
        assert_eq!(layout.wire_len(), 36);
        // With pad.
        let layout = Layout::new(512 - 32, 29, true).unwrap();
        let kinds: Vec<SegmentKind> = layout.segments().map(|s| s.kind).collect();
        assert_eq!(
            kinds,
            vec![
                SegmentKind::Header,
                SegmentKind::Ulpdu { offset: 0 },
                SegmentKind::Pad,
                SegmentKind::Marker { fpduptr: 32 },
                SegmentKind::Crc
            ]
        );
        let u = ulpdu(29);
        let wire = FpduRepr {
            ulpdu: Ulpdu::new(&u),
        }
        .to_vec(512 - 32, ON)
        .unwrap();
        let f = Fpdu::new_checked(&wire[..], 512 - 32, true).unwrap();
        assert_eq!(f.pad(), &[0]);
        // The CRC covers the marker.
        assert_eq!(f.crc(), crc::checksum(&wire[..36]));
    }

    #[test]
    fn mulpdu_values() {
        // By hand from RFC 5044 §4.5.
        // 1460: no markers 1460 - (6 + 0) = 1454;
        //       markers 1460 - (6 + 4*3 + 0) = 1442.
        assert_eq!(mulpdu(1460, false), 1454);
        assert_eq!(mulpdu(1460, true), 1442);
        // 1448 (timestamps): 1442; 1448 - (6 + 12) = 1430.
        assert_eq!(mulpdu(1448, false), 1442);
        assert_eq!(mulpdu(1448, true), 1430);
        // 536: 530; 536 - (6 + 8) = 522.
        assert_eq!(mulpdu(536, false), 530);
        assert_eq!(mulpdu(536, true), 522);
        // 65483 (loopback): 65483 mod 4 = 3: 65483 - 9 = 65474;
        //       Ceiling(65483/512) = 128: 65483 - (6 + 512 + 3) = 64962.
        assert_eq!(mulpdu(65483, false), 65474);
        assert_eq!(mulpdu(65483, true), 64962);
        // 8948 (9000 MTU): 8942; Ceiling(8948/512) = 18: 8948 - 78 = 8870.
        assert_eq!(mulpdu(8948, false), 8942);
        assert_eq!(mulpdu(8948, true), 8870);
        // 1461: mod 4 = 1: 1461 - 7 = 1454; 1461 - (6 + 12 + 1) = 1442.
        assert_eq!(mulpdu(1461, false), 1454);
        assert_eq!(mulpdu(1461, true), 1442);
        // The floor of 128.
        for emss in [0, 1, 64, 100, 133, 134] {
            assert_eq!(mulpdu(emss, false), 128, "{emss}");
            assert_eq!(mulpdu(emss, true), 128, "{emss}");
        }
        assert_eq!(mulpdu(135, false), 128);
        assert_eq!(mulpdu(136, false), 130);
        // The ULPDU_Length ceiling.
        assert_eq!(mulpdu(1 << 20, false), 65535);
        assert_eq!(mulpdu(usize::MAX, true), 65535);
    }

    #[test]
    fn mulpdu_fits_in_emss_at_every_alignment() {
        for emss in (136..3000).chain([8948, 9000, 16384, 65483, 65495]) {
            for markers in [false, true] {
                let m = mulpdu(emss, markers);
                if m == MIN_MULPDU {
                    continue;
                }
                for g in (0..512).step_by(4) {
                    let layout = Layout::new(g, m, markers).unwrap();
                    assert!(
                        layout.wire_len() <= emss,
                        "emss {emss} markers {markers} g {g}"
                    );
                }
            }
        }
    }

    #[test]
    fn pad_lengths() {
        assert_eq!(pad_len(0), 2);
        assert_eq!(pad_len(1), 1);
        assert_eq!(pad_len(2), 0);
        assert_eq!(pad_len(3), 3);
        assert_eq!(pad_len(42), 0);
        assert_eq!(pad_len(16), 2);
        assert_eq!(bytes_to_marker(0), 0);
        assert_eq!(bytes_to_marker(1), 511);
        assert_eq!(bytes_to_marker(0x1ec), 0x14);
        assert_eq!(bytes_to_marker(u64::MAX), 1);
    }

    #[test]
    fn u32_sequence_wrap_gives_same_markers() {
        // A position from a wrapped 32-bit sequence difference lands on the
        // same marker grid as the true 64-bit count.
        let true_pos: u64 = (1 << 32) + 0x1ec;
        let seq_pos = u64::from(true_pos as u32);
        let u = figure6_ulpdu();
        let repr = FpduRepr {
            ulpdu: Ulpdu::new(&u),
        };
        assert_eq!(repr.to_vec(true_pos, ON).unwrap(), figure6());
        assert_eq!(repr.to_vec(seq_pos, ON).unwrap(), figure6());
        // Near the end of u64: no overflow.
        let pos = u64::MAX - 3;
        let wire = repr.to_vec(pos, ON).unwrap();
        assert_eq!(parse(&wire, pos, ON).unwrap().0.ulpdu.to_vec(), u);
    }

    #[test]
    fn largest_fpdu_with_markers() {
        // 65535 octets: FPDUPTRs past 0xffff keep their low 16 bits.
        let u = ulpdu(MAX_ULPDU_LEN);
        for pos in [0u64, 4, 508] {
            let repr = FpduRepr {
                ulpdu: Ulpdu::new(&u),
            };
            let wire = repr.to_vec(pos, ON).unwrap();
            let (back, used) = parse(&wire, pos, ON).unwrap();
            assert_eq!(used, wire.len());
            assert_eq!(back, repr);
        }
    }

    #[test]
    fn errors_display() {
        assert_eq!(Error::Crc.to_string(), "FPDU CRC mismatch");
    }
}
