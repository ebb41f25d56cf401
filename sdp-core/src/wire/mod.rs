//! SDP message formats (draft-pinkerton-iwarp-sdp-01 §6).
//!
//! Every SDP Message is a Base Sockets Direct Header ([`bsdh`], §6.1),
//! optionally followed by the extended header its MID requires (§6.2–§6.5)
//! and ULP payload (§6, first paragraph):
//!
//! | MID               | extended header             | module          | payload  |
//! |-------------------|-----------------------------|-----------------|----------|
//! | Hello             | HH, 16 bytes                | [`hello`]       | none     |
//! | HelloAck          | HAH, 12 bytes               | [`hello_ack`]   | none     |
//! | RdmaWrCompl       | RWCH, 4 bytes               | [`compl`]       | none     |
//! | RdmaRdCompl       | RRCH, 4 bytes               | [`compl`]       | none     |
//! | ModeChange        | MCH, 4 bytes                | [`mode_change`] | none     |
//! | ChRcvBuf          | CRBH, 4 bytes               | [`rcv_buf`]     | none     |
//! | ChRcvBufAck       | CRBAH, 4 bytes              | [`rcv_buf`]     | none     |
//! | SuspComm          | SuspCH, 8 bytes             | [`susp_comm`]   | none     |
//! | SrcAvail          | SrcAH, 16 bytes             | [`src_avail`]   | optional |
//! | SinkAvail         | SinkAH, 20 bytes            | [`sink_avail`]  | optional |
//! | Data              | —                           | —               | optional |
//! | LocalOffer (0x40, experimental) | LOH, 20 bytes | [`local`]       | none     |
//! | LocalData (0x41, experimental)  | LDH, 8 bytes  | [`local`]       | none     |
//! | DisConn, AbortConn, SendSm, SrcAvailCancel, SinkAvailCancel, SinkCancelAck, SuspCommAck | — | — | none |
//!
//! [`message`] puts them together: [`Message`] is the checked view of a whole
//! message and [`MessageRepr`] its plain form. Decode errors are the
//! [`Error`] of [`error`]; each names the draft section it enforces, for the
//! log line of the abortive close that follows (§8.2.2).
//!
//! # Reading the draft's figures
//!
//! All headers are big-endian (§6). The draft's figures, however, number
//! the bits of each 32-bit row from the least significant end: the MID table
//! counts `MID[7-0]`, the Flags table puts OOB_PRES at "bit position 0", and
//! the VA rows are labelled `VA(32-63)` then `VA(0-31)`. Read that way, the
//! rightmost byte of a row is the first byte on the wire, and a field keeps
//! its big-endian value inside the bytes it occupies. This is the only
//! reading under which the draft's stated compatibility with the
//! InfiniBand SDP [IBTA-SDP] holds:
//!
//! * §6.5.1: `[Constant1, Constant2]` must form the 48-bit constant of the
//!   InfiniBand SuspComm Service ID `0x0000_0000_0001_PPPP`; with the
//!   rightmost-first reading the SuspCH is exactly those 8 bytes.
//! * §6.3.2/§6.3.3: the VA word order is "compatible with" InfiniBand's
//!   big-endian 64-bit VA.
//! * The BSDH becomes MID, Flags, Bufs (as in every InfiniBand SDP stack),
//!   the HH/HAH start with MajV in the high nibble and MinV in the low
//!   nibble of the first byte, and the MCH puts S in bit 7 and Mode in bits
//!   6–4 of its first byte — all as in InfiniBand SDP.
//!
//! So a row drawn `| LocIRD | LocORD |` is sent LocORD first, then LocIRD.
//! Each module's `mod field` spells out the resulting byte offsets.
//!
//! # Example
//!
//! ```
//! use sdp_core::wire::{Body, Flags, MessageRepr};
//!
//! let repr = MessageRepr {
//!     bufs: 4,
//!     flags: Flags::EMPTY,
//!     mseq: 7,
//!     mseq_ack: 3,
//!     body: Body::Data { payload: b"hi" },
//! };
//! let mut buf = vec![0; repr.buffer_len()];
//! repr.emit(&mut buf);
//! assert_eq!(&buf[..4], &[0xff, 0x00, 0x00, 0x04]); // MID Data, Flags, Bufs
//! assert_eq!(MessageRepr::parse(&buf), Ok(repr));
//! ```

/// Defines the view and the Repr of an extended header that is one 32-bit
/// field (RWCH, RRCH, CRBH, CRBAH). They differ only in names and sections.
macro_rules! word_header {
    (
        $(#[$view_doc:meta])*
        view $View:ident;
        $(#[$repr_doc:meta])*
        repr $Repr:ident;
        $(#[$field_doc:meta])*
        field $field:ident => $get:ident, $set_field:ident;
        $name:literal
    ) => {
        $(#[$view_doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $View<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $View<T> {
            /// Wraps a buffer without checking its length; accessors may
            /// panic on a short buffer. Use [`Self::new_checked`] on input.
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer, checking that it holds the whole header.
            pub fn new_checked(buffer: T) -> Result<Self, $crate::wire::Error> {
                let header = Self::new_unchecked(buffer);
                header.check_len()?;
                Ok(header)
            }

            /// Checks that the buffer holds the whole header
            #[doc = concat!("(", stringify!($Repr), "::HEADER_LEN bytes); ")]
            /// extra bytes are ignored.
            pub fn check_len(&self) -> Result<(), $crate::wire::Error> {
                if self.buffer.as_ref().len() < $Repr::HEADER_LEN {
                    Err($crate::wire::Error::Truncated)
                } else {
                    Ok(())
                }
            }

            /// Returns the underlying buffer.
            pub fn into_inner(self) -> T {
                self.buffer
            }

            $(#[$field_doc])*
            pub fn $get(&self) -> u32 {
                $crate::wire::read_u32(self.buffer.as_ref(), 0)
            }
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $View<T> {
            #[doc = concat!("Sets the ", $name, " field.")]
            pub fn $set_field(&mut self, value: u32) {
                $crate::wire::write_u32(self.buffer.as_mut(), 0, value)
            }
        }

        $(#[$repr_doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub struct $Repr {
            $(#[$field_doc])*
            pub $field: u32,
        }

        impl $Repr {
            /// Size of this extended header on the wire, in bytes.
            pub const HEADER_LEN: usize = 4;

            /// Reads the header out of a checked view.
            pub fn parse<T: AsRef<[u8]> + ?Sized>(
                header: &$View<&T>,
            ) -> Result<Self, $crate::wire::Error> {
                header.check_len()?;
                Ok(Self { $field: header.$get() })
            }

            /// Bytes [`Self::emit`] writes.
            pub const fn buffer_len(&self) -> usize {
                Self::HEADER_LEN
            }

            /// Writes the header into a view of at least
            /// [`Self::buffer_len`] bytes.
            pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, header: &mut $View<T>) {
                header.$set_field(self.$field);
            }
        }
    };
}

pub mod bsdh;
pub mod compl;
pub mod error;
pub mod hello;
pub mod hello_ack;
pub mod local;
pub mod message;
pub mod mode_change;
pub mod rcv_buf;
pub mod sink_avail;
pub mod src_avail;
pub mod susp_comm;

pub use bsdh::{Bsdh, BsdhRepr, Flags, Mid};
pub use compl::{RdmaRdComplHeader, RdmaRdComplRepr, RdmaWrComplHeader, RdmaWrComplRepr};
pub use error::Error;
pub use hello::{HelloHeader, HelloRepr, MAJOR_VERSION, MINOR_VERSION};
pub use hello_ack::{HelloAckHeader, HelloAckRepr};
pub use local::{LocalDataRepr, LocalOfferRepr, LOCAL_BIT};
pub use message::{Body, Message, MessageRepr};
pub use mode_change::{Mode, ModeChangeHeader, ModeChangeRepr};
pub use rcv_buf::{ChRcvBufAckHeader, ChRcvBufAckRepr, ChRcvBufHeader, ChRcvBufRepr};
pub use sink_avail::{SinkAvailHeader, SinkAvailRepr};
pub use src_avail::{SrcAvailHeader, SrcAvailRepr};
pub use susp_comm::{SuspCommHeader, SuspCommRepr};

/// Size of the BSDH, the smallest SDP Message (§6.1, Figure 2).
pub const BSDH_LEN: usize = bsdh::HEADER_LEN;

/// Size of a whole Hello Message: BSDH plus HH, and nothing else (§6.2.1).
/// This is what the Connecting Peer puts in the MPA Request's private data.
pub const HELLO_MSG_LEN: usize = bsdh::HEADER_LEN + hello::HEADER_LEN;

/// Size of a whole HelloAck Message: BSDH plus HAH, and nothing else
/// (§6.2.2).
pub const HELLO_ACK_MSG_LEN: usize = bsdh::HEADER_LEN + hello_ack::HEADER_LEN;

/// The largest private buffer size and the largest advertised RDMA Buffer
/// the draft allows: "maximum = 2^31 bytes" (§6.2.1.4, §6.2.1.5, §6.2.2.4),
/// "less than or equal to 2^31 bytes" (§6.3.2.1, §6.3.3.1).
pub const MAX_SIZE: u32 = 1 << 31;

// Big-endian field access at fixed offsets. Callers only use offsets that
// their view's `check_len` has verified, so the indexing cannot fail there.

pub(crate) fn read_u16(buf: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([buf[at], buf[at + 1]])
}

pub(crate) fn read_u32(buf: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([buf[at], buf[at + 1], buf[at + 2], buf[at + 3]])
}

pub(crate) fn write_u16(buf: &mut [u8], at: usize, value: u16) {
    buf[at..at + 2].copy_from_slice(&value.to_be_bytes());
}

pub(crate) fn write_u32(buf: &mut [u8], at: usize, value: u32) {
    buf[at..at + 4].copy_from_slice(&value.to_be_bytes());
}
