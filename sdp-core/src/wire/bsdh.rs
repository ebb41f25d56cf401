//! The Base Sockets Direct Header (draft §6.1, Figure 2): the 16 bytes that
//! start every SDP Message, with the Message Identifier (§6.1.1, Figure 3)
//! and the Flags (§6.1.2, Figure 4).
//!
//! Wire layout (the figure read rightmost byte first, see [`super`]):
//!
//! ```text
//!  byte 0   MID
//!  byte 1   Flags        bit 0 OOB_PRES, bit 1 OOB_PEND, bit 2 REQ_PIPE
//!  bytes 2-3  Bufs
//!  bytes 4-7  Len        size of BSDH + extended header + ULP payload
//!  bytes 8-11 MSeq
//!  bytes 12-15 MSeqAck
//! ```
//!
//! ```
//! use sdp_core::wire::{Bsdh, BsdhRepr, Flags, Mid};
//!
//! let bytes = [0x07, 0x00, 0x00, 0x02, 0, 0, 0, 20, 0, 0, 0, 9, 0, 0, 0, 8];
//! let bsdh = Bsdh::new_checked(&bytes[..]).unwrap();
//! assert_eq!(bsdh.mid(), Mid::MODE_CHANGE);
//! assert_eq!(bsdh.mid().name(), "ModeChange");
//! let repr = BsdhRepr::parse(&bsdh).unwrap();
//! assert_eq!(repr.bufs, 2);
//! assert_eq!(repr.len, 20);
//! assert_eq!(repr.flags, Flags::EMPTY);
//! ```

use core::fmt;
use core::ops::{BitOr, BitOrAssign};

use super::{read_u16, read_u32, write_u16, write_u32, Error};

mod field {
    use core::ops::Range;

    pub const MID: usize = 0;
    pub const FLAGS: usize = 1;
    pub const BUFS: Range<usize> = 2..4;
    pub const LEN: Range<usize> = 4..8;
    pub const MSEQ: Range<usize> = 8..12;
    pub const MSEQ_ACK: Range<usize> = 12..16;
}

/// Size of the BSDH in bytes.
pub const HEADER_LEN: usize = field::MSEQ_ACK.end;

/// Message Identifier: the type of an SDP Message (§6.1.1, Figure 3).
///
/// Every value parses; [`Mid::is_reserved`] and [`Mid::is_experimental`]
/// classify the ones Figure 3 does not define, which the connection state
/// machine rejects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Mid(pub u8);

impl Mid {
    /// Hello, with HH (§6.2.1).
    pub const HELLO: Mid = Mid(0x00);
    /// HelloAck, with HAH (§6.2.2).
    pub const HELLO_ACK: Mid = Mid(0x01);
    /// DisConn, BSDH only (§6.2.3).
    pub const DIS_CONN: Mid = Mid(0x02);
    /// AbortConn, BSDH only (§6.2.4).
    pub const ABORT_CONN: Mid = Mid(0x03);
    /// SendSm, BSDH only (§6.3.5).
    pub const SEND_SM: Mid = Mid(0x04);
    /// RdmaWrCompl, with RWCH (§6.3.6).
    pub const RDMA_WR_COMPL: Mid = Mid(0x05);
    /// RdmaRdCompl, with RRCH (§6.3.7).
    pub const RDMA_RD_COMPL: Mid = Mid(0x06);
    /// ModeChange, with MCH (§6.3.8).
    pub const MODE_CHANGE: Mid = Mid(0x07);
    /// SrcAvailCancel, BSDH only (§6.3.9).
    pub const SRC_AVAIL_CANCEL: Mid = Mid(0x08);
    /// SinkAvailCancel, BSDH only (§6.3.10).
    pub const SINK_AVAIL_CANCEL: Mid = Mid(0x09);
    /// SinkCancelAck, BSDH only (§6.3.11).
    pub const SINK_CANCEL_ACK: Mid = Mid(0x0a);
    /// ChRcvBuf, with CRBH (§6.4.1).
    pub const CH_RCV_BUF: Mid = Mid(0x0b);
    /// ChRcvBufAck, with CRBAH (§6.4.2).
    pub const CH_RCV_BUF_ACK: Mid = Mid(0x0c);
    /// SuspComm, with SuspCH (§6.5.1).
    pub const SUSP_COMM: Mid = Mid(0x0d);
    /// SuspCommAck, BSDH only (§6.5.2).
    pub const SUSP_COMM_ACK: Mid = Mid(0x0e);
    /// SinkAvail, with SinkAH and optional ULP payload (§6.3.3).
    pub const SINK_AVAIL: Mid = Mid(0xfd);
    /// SrcAvail, with SrcAH and optional ULP payload (§6.3.2).
    pub const SRC_AVAIL: Mid = Mid(0xfe);
    /// Data, with optional ULP payload (§6.3.1).
    pub const DATA: Mid = Mid(0xff);
    /// LocalOffer, with LOH: the same-host extension's offer of memory,
    /// an experimental value ([`super::local`]).
    pub const LOCAL_OFFER: Mid = Mid(0x40);
    /// LocalData, with LDH: stream bytes placed in the receiver's memory,
    /// an experimental value ([`super::local`]).
    pub const LOCAL_DATA: Mid = Mid(0x41);

    /// Reserved values of Figure 3: 00001111, 00010000–00111111 and
    /// 10000000–11111100 ("may be assigned in future versions").
    pub const fn is_reserved(self) -> bool {
        matches!(self.0, 0x0f..=0x3f | 0x80..=0xfc)
    }

    /// Experimental values of Figure 3: 01000000–01111111.
    pub const fn is_experimental(self) -> bool {
        matches!(self.0, 0x40..=0x7f)
    }

    /// Whether this is one of the same-host extension's experimental
    /// values ([`super::local`]), which carry no payload.
    pub const fn is_local(self) -> bool {
        matches!(self, Mid::LOCAL_OFFER | Mid::LOCAL_DATA)
    }

    /// Whether Figure 3 defines a message for this value.
    pub const fn is_defined(self) -> bool {
        !self.is_reserved() && !self.is_experimental()
    }

    /// The message name of Figure 3, or "Reserved"/"Experimental".
    pub const fn name(self) -> &'static str {
        match self {
            Mid::HELLO => "Hello",
            Mid::HELLO_ACK => "HelloAck",
            Mid::DIS_CONN => "DisConn",
            Mid::ABORT_CONN => "AbortConn",
            Mid::SEND_SM => "SendSm",
            Mid::RDMA_WR_COMPL => "RdmaWrCompl",
            Mid::RDMA_RD_COMPL => "RdmaRdCompl",
            Mid::MODE_CHANGE => "ModeChange",
            Mid::SRC_AVAIL_CANCEL => "SrcAvailCancel",
            Mid::SINK_AVAIL_CANCEL => "SinkAvailCancel",
            Mid::SINK_CANCEL_ACK => "SinkCancelAck",
            Mid::CH_RCV_BUF => "ChRcvBuf",
            Mid::CH_RCV_BUF_ACK => "ChRcvBufAck",
            Mid::SUSP_COMM => "SuspComm",
            Mid::SUSP_COMM_ACK => "SuspCommAck",
            Mid::SINK_AVAIL => "SinkAvail",
            Mid::SRC_AVAIL => "SrcAvail",
            Mid::DATA => "Data",
            Mid::LOCAL_OFFER => "LocalOffer",
            Mid::LOCAL_DATA => "LocalData",
            m if m.is_experimental() => "Experimental",
            _ => "Reserved",
        }
    }

    /// Size of the extended header that follows the BSDH for this MID
    /// (Figure 3, "Extended Header following the Base SDP Header"); zero for
    /// messages without one and for reserved and experimental values.
    pub const fn ext_header_len(self) -> usize {
        match self {
            Mid::HELLO => super::hello::HEADER_LEN,
            Mid::HELLO_ACK => super::hello_ack::HEADER_LEN,
            Mid::RDMA_WR_COMPL => super::compl::RdmaWrComplRepr::HEADER_LEN,
            Mid::RDMA_RD_COMPL => super::compl::RdmaRdComplRepr::HEADER_LEN,
            Mid::MODE_CHANGE => super::mode_change::HEADER_LEN,
            Mid::CH_RCV_BUF => super::rcv_buf::ChRcvBufRepr::HEADER_LEN,
            Mid::CH_RCV_BUF_ACK => super::rcv_buf::ChRcvBufAckRepr::HEADER_LEN,
            Mid::SUSP_COMM => super::susp_comm::HEADER_LEN,
            Mid::SINK_AVAIL => super::sink_avail::HEADER_LEN,
            Mid::SRC_AVAIL => super::src_avail::HEADER_LEN,
            Mid::LOCAL_OFFER => super::local::LocalOfferRepr::HEADER_LEN,
            Mid::LOCAL_DATA => super::local::LocalDataRepr::HEADER_LEN,
            _ => 0,
        }
    }

    /// Whether bytes may follow the headers (Figure 3, "Packet Contents
    /// following the Extended Header"): ULP payload for Data, SrcAvail and
    /// SinkAvail, an optional payload for experimental values, and — since
    /// their format is "n/a" — anything for reserved values.
    pub const fn may_carry_payload(self) -> bool {
        matches!(self, Mid::DATA | Mid::SRC_AVAIL | Mid::SINK_AVAIL)
            || !(self.is_defined() || self.is_local())
    }
}

impl fmt::Display for Mid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_defined() {
            f.write_str(self.name())
        } else {
            write!(f, "{}(0x{:02x})", self.name(), self.0)
        }
    }
}

/// The BSDH Flags field (§6.1.2, Figure 4).
///
/// Bits 3–7 are "transmitted as zero and not checked at receiver":
/// [`BsdhRepr::parse`] drops them and [`BsdhRepr::emit`] sends zeros.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Flags(pub u8);

impl Flags {
    /// No flag set.
    pub const EMPTY: Flags = Flags(0);
    /// Bit 0: Out-Of-Band Data is present — the last payload byte of this
    /// Data Message is the OOB byte.
    pub const OOB_PRES: Flags = Flags(1 << 0);
    /// Bit 1: Out-Of-Band Data is pending.
    pub const OOB_PEND: Flags = Flags(1 << 1);
    /// Bit 2: Request change to Pipelined Mode (only meaningful in
    /// RdmaRdCompl and RdmaWrCompl).
    pub const REQ_PIPE: Flags = Flags(1 << 2);
    /// The bits Figure 4 defines.
    pub const KNOWN: Flags = Flags(0x07);

    /// The raw byte.
    pub const fn bits(self) -> u8 {
        self.0
    }

    /// Whether every bit of `other` is set in `self`.
    pub const fn contains(self, other: Flags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both sets of bits.
    pub const fn union(self, other: Flags) -> Flags {
        Flags(self.0 | other.0)
    }

    /// `self` without the bits of `other`.
    pub const fn difference(self, other: Flags) -> Flags {
        Flags(self.0 & !other.0)
    }

    /// Whether no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// `self` with the reserved bits 3–7 cleared.
    pub const fn known(self) -> Flags {
        Flags(self.0 & Self::KNOWN.0)
    }

    /// Sets the bits of `other`.
    pub fn insert(&mut self, other: Flags) {
        self.0 |= other.0;
    }

    /// Clears the bits of `other`.
    pub fn remove(&mut self, other: Flags) {
        self.0 &= !other.0;
    }
}

impl BitOr for Flags {
    type Output = Flags;
    fn bitor(self, rhs: Flags) -> Flags {
        self.union(rhs)
    }
}

impl BitOrAssign for Flags {
    fn bitor_assign(&mut self, rhs: Flags) {
        self.insert(rhs)
    }
}

impl fmt::Display for Flags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (flag, name) in [
            (Flags::OOB_PRES, "OOB_PRES"),
            (Flags::OOB_PEND, "OOB_PEND"),
            (Flags::REQ_PIPE, "REQ_PIPE"),
        ] {
            if self.contains(flag) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        let rest = self.difference(Flags::KNOWN);
        if !rest.is_empty() {
            if !first {
                f.write_str("|")?;
            }
            write!(f, "0x{:02x}", rest.0)?;
            first = false;
        }
        if first {
            f.write_str("0")?;
        }
        Ok(())
    }
}

/// A checked view of a Base Sockets Direct Header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bsdh<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Bsdh<T> {
    /// Wraps a buffer without checking its length; accessors may panic on a
    /// short buffer. Use [`Bsdh::new_checked`] on input.
    pub const fn new_unchecked(buffer: T) -> Bsdh<T> {
        Bsdh { buffer }
    }

    /// Wraps a buffer, checking that it holds a whole BSDH.
    pub fn new_checked(buffer: T) -> Result<Bsdh<T>, Error> {
        let bsdh = Self::new_unchecked(buffer);
        bsdh.check_len()?;
        Ok(bsdh)
    }

    /// Checks that the buffer holds the 16 bytes of a BSDH. Bytes after it
    /// are ignored here; [`super::Message`] checks them against Len.
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

    /// The MID field.
    pub fn mid(&self) -> Mid {
        Mid(self.buffer.as_ref()[field::MID])
    }

    /// The Flags field as received, reserved bits included.
    pub fn flags(&self) -> Flags {
        Flags(self.buffer.as_ref()[field::FLAGS])
    }

    /// The Bufs field: Private Buffers posted minus messages received
    /// (§6.1.3).
    pub fn bufs(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::BUFS.start)
    }

    /// The Len field: size of the whole message in bytes (§6.1.4).
    pub fn length(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::LEN.start)
    }

    /// The MSeq field (§6.1.5).
    pub fn mseq(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::MSEQ.start)
    }

    /// The MSeqAck field (§6.1.6).
    pub fn mseq_ack(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::MSEQ_ACK.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bsdh<T> {
    /// Sets the MID field.
    pub fn set_mid(&mut self, value: Mid) {
        self.buffer.as_mut()[field::MID] = value.0;
    }

    /// Sets the Flags field, reserved bits included as given.
    pub fn set_flags(&mut self, value: Flags) {
        self.buffer.as_mut()[field::FLAGS] = value.0;
    }

    /// Sets the Bufs field.
    pub fn set_bufs(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::BUFS.start, value)
    }

    /// Sets the Len field.
    pub fn set_length(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::LEN.start, value)
    }

    /// Sets the MSeq field.
    pub fn set_mseq(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::MSEQ.start, value)
    }

    /// Sets the MSeqAck field.
    pub fn set_mseq_ack(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::MSEQ_ACK.start, value)
    }
}

/// The fields of a BSDH.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BsdhRepr {
    /// Message type.
    pub mid: Mid,
    /// OOB_PRES, OOB_PEND and REQ_PIPE; never reserved bits.
    pub flags: Flags,
    /// Private Buffers posted minus messages received (§6.1.3).
    pub bufs: u16,
    /// Size of the whole message in bytes (§6.1.4).
    pub len: u32,
    /// Message sequence number (§6.1.5).
    pub mseq: u32,
    /// Sequence number of the last message received (§6.1.6).
    pub mseq_ack: u32,
}

impl BsdhRepr {
    /// Size of the BSDH on the wire.
    pub const HEADER_LEN: usize = HEADER_LEN;

    /// Reads a BSDH. Nothing in the header alone can be inconsistent, so
    /// this only fails on a short buffer.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(bsdh: &Bsdh<&T>) -> Result<BsdhRepr, Error> {
        bsdh.check_len()?;
        Ok(BsdhRepr {
            mid: bsdh.mid(),
            // §6.1.2 Figure 4: bits 3-7 are "not checked at receiver".
            flags: bsdh.flags().known(),
            bufs: bsdh.bufs(),
            len: bsdh.length(),
            mseq: bsdh.mseq(),
            mseq_ack: bsdh.mseq_ack(),
        })
    }

    /// Bytes [`BsdhRepr::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the BSDH into a view of at least [`HEADER_LEN`] bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, bsdh: &mut Bsdh<T>) {
        bsdh.set_mid(self.mid);
        // §6.1.2 Figure 4: reserved bits are "transmitted as zero".
        bsdh.set_flags(self.flags.known());
        bsdh.set_bufs(self.bufs);
        bsdh.set_length(self.len);
        bsdh.set_mseq(self.mseq);
        bsdh.set_mseq_ack(self.mseq_ack);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Data Message BSDH: MID Data, Flags OOB_PEND, Bufs 0x0102, Len 20,
    // MSeq 0x0a0b0c0d, MSeqAck 0x01020304.
    static BYTES: [u8; 16] = [
        0xff, 0x02, 0x01, 0x02, 0x00, 0x00, 0x00, 0x14, 0x0a, 0x0b, 0x0c, 0x0d, 0x01, 0x02, 0x03,
        0x04,
    ];

    fn repr() -> BsdhRepr {
        BsdhRepr {
            mid: Mid::DATA,
            flags: Flags::OOB_PEND,
            bufs: 0x0102,
            len: 20,
            mseq: 0x0a0b_0c0d,
            mseq_ack: 0x0102_0304,
        }
    }

    #[test]
    fn test_deconstruct() {
        let bsdh = Bsdh::new_checked(&BYTES[..]).unwrap();
        assert_eq!(bsdh.mid(), Mid::DATA);
        assert_eq!(bsdh.flags(), Flags::OOB_PEND);
        assert_eq!(bsdh.bufs(), 0x0102);
        assert_eq!(bsdh.length(), 20);
        assert_eq!(bsdh.mseq(), 0x0a0b_0c0d);
        assert_eq!(bsdh.mseq_ack(), 0x0102_0304);
    }

    #[test]
    fn test_construct() {
        let mut bytes = [0xa5u8; 16];
        let mut bsdh = Bsdh::new_unchecked(&mut bytes[..]);
        bsdh.set_mid(Mid::DATA);
        bsdh.set_flags(Flags::OOB_PEND);
        bsdh.set_bufs(0x0102);
        bsdh.set_length(20);
        bsdh.set_mseq(0x0a0b_0c0d);
        bsdh.set_mseq_ack(0x0102_0304);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn test_parse() {
        let bsdh = Bsdh::new_checked(&BYTES[..]).unwrap();
        assert_eq!(BsdhRepr::parse(&bsdh), Ok(repr()));
    }

    #[test]
    fn test_emit() {
        let mut bytes = [0xa5u8; 16];
        repr().emit(&mut Bsdh::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn truncated() {
        for n in 0..HEADER_LEN {
            assert_eq!(Bsdh::new_checked(&BYTES[..n]), Err(Error::Truncated));
        }
    }

    #[test]
    fn reserved_flag_bits_ignored_on_receive_and_zero_on_send() {
        let mut bytes = BYTES;
        bytes[1] = 0xf8 | 0x05;
        let bsdh = Bsdh::new_checked(&bytes[..]).unwrap();
        assert_eq!(bsdh.flags(), Flags(0xfd));
        let parsed = BsdhRepr::parse(&bsdh).unwrap();
        assert_eq!(parsed.flags, Flags::OOB_PRES | Flags::REQ_PIPE);

        let mut out = [0u8; 16];
        let mut sent = parsed;
        sent.flags = Flags(0xff);
        sent.emit(&mut Bsdh::new_unchecked(&mut out[..]));
        assert_eq!(out[1], 0x07);
    }

    #[test]
    fn mid_values() {
        let defined = [
            (0x00, Mid::HELLO, "Hello"),
            (0x01, Mid::HELLO_ACK, "HelloAck"),
            (0x02, Mid::DIS_CONN, "DisConn"),
            (0x03, Mid::ABORT_CONN, "AbortConn"),
            (0x04, Mid::SEND_SM, "SendSm"),
            (0x05, Mid::RDMA_WR_COMPL, "RdmaWrCompl"),
            (0x06, Mid::RDMA_RD_COMPL, "RdmaRdCompl"),
            (0x07, Mid::MODE_CHANGE, "ModeChange"),
            (0x08, Mid::SRC_AVAIL_CANCEL, "SrcAvailCancel"),
            (0x09, Mid::SINK_AVAIL_CANCEL, "SinkAvailCancel"),
            (0x0a, Mid::SINK_CANCEL_ACK, "SinkCancelAck"),
            (0x0b, Mid::CH_RCV_BUF, "ChRcvBuf"),
            (0x0c, Mid::CH_RCV_BUF_ACK, "ChRcvBufAck"),
            (0x0d, Mid::SUSP_COMM, "SuspComm"),
            (0x0e, Mid::SUSP_COMM_ACK, "SuspCommAck"),
            (0xfd, Mid::SINK_AVAIL, "SinkAvail"),
            (0xfe, Mid::SRC_AVAIL, "SrcAvail"),
            (0xff, Mid::DATA, "Data"),
        ];
        for (value, mid, name) in defined {
            assert_eq!(mid, Mid(value));
            assert_eq!(mid.name(), name);
            assert_eq!(mid.to_string(), name);
            assert!(mid.is_defined() && !mid.is_reserved() && !mid.is_experimental());
        }
        let mut counts = (0, 0, 0);
        for v in 0..=255u8 {
            let mid = Mid(v);
            match (mid.is_defined(), mid.is_reserved(), mid.is_experimental()) {
                (true, false, false) => counts.0 += 1,
                (false, true, false) => {
                    counts.1 += 1;
                    assert_eq!(mid.name(), "Reserved");
                    assert_eq!(mid.ext_header_len(), 0);
                    assert!(mid.may_carry_payload());
                }
                (false, false, true) if mid.is_local() => {
                    counts.2 += 1;
                    assert!(mid.ext_header_len() > 0);
                    assert!(!mid.may_carry_payload());
                }
                (false, false, true) => {
                    counts.2 += 1;
                    assert_eq!(mid.name(), "Experimental");
                    assert_eq!(mid.ext_header_len(), 0);
                    assert!(mid.may_carry_payload());
                }
                other => panic!("MID {v:#x} classified {other:?}"),
            }
        }
        // 18 defined; reserved 0x0f, 0x10-0x3f, 0x80-0xfc; experimental 0x40-0x7f.
        assert_eq!(counts, (18, 1 + 48 + 125, 64));
        assert!(Mid(0x0f).is_reserved());
        assert!(Mid(0x3f).is_reserved());
        assert!(Mid(0x40).is_experimental());
        assert!(Mid(0x7f).is_experimental());
        assert!(Mid(0x80).is_reserved());
        assert!(Mid(0xfc).is_reserved());
        assert_eq!(Mid(0x42).to_string(), "Experimental(0x42)");
        assert_eq!(Mid(0x0f).to_string(), "Reserved(0x0f)");
    }

    #[test]
    fn ext_header_lengths() {
        assert_eq!(Mid::HELLO.ext_header_len(), 16);
        assert_eq!(Mid::HELLO_ACK.ext_header_len(), 12);
        assert_eq!(Mid::RDMA_WR_COMPL.ext_header_len(), 4);
        assert_eq!(Mid::RDMA_RD_COMPL.ext_header_len(), 4);
        assert_eq!(Mid::MODE_CHANGE.ext_header_len(), 4);
        assert_eq!(Mid::CH_RCV_BUF.ext_header_len(), 4);
        assert_eq!(Mid::CH_RCV_BUF_ACK.ext_header_len(), 4);
        assert_eq!(Mid::SUSP_COMM.ext_header_len(), 8);
        assert_eq!(Mid::SRC_AVAIL.ext_header_len(), 16);
        assert_eq!(Mid::SINK_AVAIL.ext_header_len(), 20);
        for mid in [
            Mid::DIS_CONN,
            Mid::ABORT_CONN,
            Mid::SEND_SM,
            Mid::SRC_AVAIL_CANCEL,
            Mid::SINK_AVAIL_CANCEL,
            Mid::SINK_CANCEL_ACK,
            Mid::SUSP_COMM_ACK,
            Mid::DATA,
        ] {
            assert_eq!(mid.ext_header_len(), 0, "{mid}");
        }
        for mid in [Mid::DATA, Mid::SRC_AVAIL, Mid::SINK_AVAIL] {
            assert!(mid.may_carry_payload());
        }
        assert!(!Mid::HELLO.may_carry_payload());
        assert!(!Mid::SEND_SM.may_carry_payload());
    }

    #[test]
    fn flags_ops() {
        let f = Flags::OOB_PRES | Flags::OOB_PEND;
        assert!(f.contains(Flags::OOB_PRES));
        assert!(f.contains(Flags::OOB_PEND));
        assert!(!f.contains(Flags::REQ_PIPE));
        assert!(!f.contains(Flags::OOB_PRES | Flags::REQ_PIPE));
        assert_eq!(f.bits(), 0x03);
        let mut g = Flags::EMPTY;
        assert!(g.is_empty());
        g |= Flags::REQ_PIPE;
        g.insert(Flags::OOB_PRES);
        g.remove(Flags::REQ_PIPE);
        assert_eq!(g, Flags::OOB_PRES);
        assert_eq!(f.to_string(), "OOB_PRES|OOB_PEND");
        assert_eq!(Flags(0x84).to_string(), "REQ_PIPE|0x80");
        assert_eq!(Flags::EMPTY.to_string(), "0");
    }
}
