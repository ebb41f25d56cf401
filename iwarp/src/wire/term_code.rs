//! The error a Terminate message reports (RFC 5040 §4.8): the layer that
//! found it, the error type and the error code, with the codes RDMAP
//! (RFC 5040 §4.8 Figure 9), DDP (RFC 5041 §7.2) and MPA (RFC 5044 §8,
//! RFC 6581 §8) define. Each layer's parser names what it rejects with
//! one of these; a Terminate message (`terminate`) carries it on the wire.

use core::fmt;

/// The layer that detected the error (RFC 5040 §4.8, 4 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Layer(pub u8);

impl Layer {
    pub const RDMAP: Layer = Layer(0x0);
    pub const DDP: Layer = Layer(0x1);
    /// The lower layer protocol; for us always MPA.
    pub const LLP: Layer = Layer(0x2);
}

/// The error type within a layer (4 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EType(pub u8);

impl EType {
    // RFC 5040 §4.8, Figure 9 (Layer RDMAP).
    pub const RDMAP_LOCAL_CATASTROPHIC: EType = EType(0x0);
    pub const RDMAP_REMOTE_PROTECTION: EType = EType(0x1);
    pub const RDMAP_REMOTE_OPERATION: EType = EType(0x2);
    // RFC 5041 §7.2 (Layer DDP).
    pub const DDP_LOCAL_CATASTROPHIC: EType = EType(0x0);
    pub const DDP_TAGGED_BUFFER: EType = EType(0x1);
    pub const DDP_UNTAGGED_BUFFER: EType = EType(0x2);
    pub const DDP_RESERVED_FOR_LLP: EType = EType(0x3);
    // RFC 6581 §8 (Layer LLP).
    pub const MPA: EType = EType(0x0);
}

/// The error code within a type (8 bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ErrorCode(pub u8);

/// Which optional parts a Terminate header carries (RFC 5040 §4.8, HdrCt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct HdrCt {
    /// M: the DDP Segment Length field is valid.
    pub segment_length: bool,
    /// D: the terminated DDP header is included.
    pub ddp_header: bool,
    /// R: the terminated RDMA (Read Request) header is included.
    pub rdma_header: bool,
}

/// A Layer / Error Type / Error Code triple as carried in the Terminate
/// Control field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TermCode {
    pub layer: Layer,
    pub etype: EType,
    pub code: ErrorCode,
}

pub(super) const fn tc(layer: u8, etype: u8, code: u8) -> TermCode {
    TermCode {
        layer: Layer(layer),
        etype: EType(etype),
        code: ErrorCode(code),
    }
}

impl TermCode {
    // RFC 5040 §4.8, Figure 9: RDMAP Local Catastrophic Error has no code.
    pub const RDMAP_LOCAL_CATASTROPHIC: TermCode = tc(0x0, 0x0, 0x00);
    // RDMAP Remote Protection Errors.
    pub const RDMAP_INVALID_STAG: TermCode = tc(0x0, 0x1, 0x00);
    pub const RDMAP_BASE_BOUNDS: TermCode = tc(0x0, 0x1, 0x01);
    pub const RDMAP_ACCESS_RIGHTS: TermCode = tc(0x0, 0x1, 0x02);
    pub const RDMAP_STAG_NOT_ASSOCIATED: TermCode = tc(0x0, 0x1, 0x03);
    pub const RDMAP_TO_WRAP: TermCode = tc(0x0, 0x1, 0x04);
    pub const RDMAP_PROT_CANNOT_INVALIDATE: TermCode = tc(0x0, 0x1, 0x09);
    pub const RDMAP_PROT_UNSPECIFIED: TermCode = tc(0x0, 0x1, 0xff);
    // RDMAP Remote Operation Errors.
    pub const RDMAP_INVALID_VERSION: TermCode = tc(0x0, 0x2, 0x05);
    pub const RDMAP_UNEXPECTED_OPCODE: TermCode = tc(0x0, 0x2, 0x06);
    pub const RDMAP_CATASTROPHIC_STREAM: TermCode = tc(0x0, 0x2, 0x07);
    pub const RDMAP_CATASTROPHIC_GLOBAL: TermCode = tc(0x0, 0x2, 0x08);
    pub const RDMAP_OP_CANNOT_INVALIDATE: TermCode = tc(0x0, 0x2, 0x09);
    pub const RDMAP_OP_UNSPECIFIED: TermCode = tc(0x0, 0x2, 0xff);

    // RFC 5041 §7.2.
    pub const DDP_LOCAL_CATASTROPHIC: TermCode = tc(0x1, 0x0, 0x00);
    pub const DDP_INVALID_STAG: TermCode = tc(0x1, 0x1, 0x00);
    pub const DDP_BASE_BOUNDS: TermCode = tc(0x1, 0x1, 0x01);
    pub const DDP_STAG_NOT_ASSOCIATED: TermCode = tc(0x1, 0x1, 0x02);
    pub const DDP_TO_WRAP: TermCode = tc(0x1, 0x1, 0x03);
    pub const DDP_TAGGED_INVALID_VERSION: TermCode = tc(0x1, 0x1, 0x04);
    pub const DDP_INVALID_QN: TermCode = tc(0x1, 0x2, 0x01);
    pub const DDP_NO_BUFFER: TermCode = tc(0x1, 0x2, 0x02);
    pub const DDP_INVALID_MSN_RANGE: TermCode = tc(0x1, 0x2, 0x03);
    pub const DDP_INVALID_MO: TermCode = tc(0x1, 0x2, 0x04);
    pub const DDP_MESSAGE_TOO_LONG: TermCode = tc(0x1, 0x2, 0x05);
    pub const DDP_UNTAGGED_INVALID_VERSION: TermCode = tc(0x1, 0x2, 0x06);

    // RFC 5044 §8 and RFC 6581 §8: Layer LLP, Error Type MPA.
    pub const MPA_CONNECTION_LOST: TermCode = tc(0x2, 0x0, 0x01);
    pub const MPA_CRC: TermCode = tc(0x2, 0x0, 0x02);
    pub const MPA_MARKER: TermCode = tc(0x2, 0x0, 0x03);
    pub const MPA_INVALID_FRAME: TermCode = tc(0x2, 0x0, 0x04);
    pub const MPA_LOCAL_CATASTROPHIC: TermCode = tc(0x2, 0x0, 0x05);
    pub const MPA_INSUFFICIENT_IRD: TermCode = tc(0x2, 0x0, 0x06);
    pub const MPA_NO_MATCHING_RTR: TermCode = tc(0x2, 0x0, 0x07);

    /// Which headers a Terminate for this error carries, following
    /// RFC 5040 §4.8 Figure 10.
    ///
    /// `read_request` says whether the terminated message was an RDMA Read
    /// Request, Send with Invalidate or Send with SE and Invalidate (the
    /// messages for which a Remote Protection Error returns the RDMA header;
    /// the header itself only exists for the Read Request).
    /// `ddp_header_known` is false when the error was found before a DDP
    /// header could be parsed ("Yes, if possible").
    pub fn header_inclusion(self, read_request: bool, ddp_header_known: bool) -> HdrCt {
        let ddp = |known: bool| HdrCt {
            segment_length: known,
            ddp_header: known,
            rdma_header: false,
        };
        match self.layer {
            Layer::RDMAP => match self.etype {
                EType::RDMAP_REMOTE_PROTECTION => HdrCt {
                    rdma_header: read_request,
                    ..ddp(ddp_header_known)
                },
                EType::RDMAP_REMOTE_OPERATION => ddp(ddp_header_known),
                _ => HdrCt::default(),
            },
            Layer::DDP => match self.etype {
                EType::DDP_LOCAL_CATASTROPHIC => HdrCt::default(),
                _ => ddp(ddp_header_known),
            },
            _ => HdrCt::default(),
        }
    }

    /// The name the RFC tables give this triple, or `None` if it is not in
    /// them (a peer may send anything; we still print it).
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Self::RDMAP_INVALID_STAG => "RDMAP: invalid STag",
            Self::RDMAP_BASE_BOUNDS => "RDMAP: base or bounds violation",
            Self::RDMAP_ACCESS_RIGHTS => "RDMAP: access rights violation",
            Self::RDMAP_STAG_NOT_ASSOCIATED => "RDMAP: STag not associated with RDMAP Stream",
            Self::RDMAP_TO_WRAP => "RDMAP: TO wrap",
            Self::RDMAP_PROT_CANNOT_INVALIDATE | Self::RDMAP_OP_CANNOT_INVALIDATE => {
                "RDMAP: STag cannot be invalidated"
            }
            Self::RDMAP_PROT_UNSPECIFIED => "RDMAP: unspecified protection error",
            Self::RDMAP_INVALID_VERSION => "RDMAP: invalid RDMAP version",
            Self::RDMAP_UNEXPECTED_OPCODE => "RDMAP: unexpected opcode",
            Self::RDMAP_CATASTROPHIC_STREAM => "RDMAP: catastrophic error, localized to stream",
            Self::RDMAP_CATASTROPHIC_GLOBAL => "RDMAP: catastrophic error, global",
            Self::RDMAP_OP_UNSPECIFIED => "RDMAP: unspecified operation error",
            Self::DDP_LOCAL_CATASTROPHIC => "DDP: local catastrophic",
            Self::DDP_INVALID_STAG => "DDP: invalid STag",
            Self::DDP_BASE_BOUNDS => "DDP: base or bounds violation",
            Self::DDP_STAG_NOT_ASSOCIATED => "DDP: STag not associated with DDP Stream",
            Self::DDP_TO_WRAP => "DDP: TO wrap",
            Self::DDP_TAGGED_INVALID_VERSION | Self::DDP_UNTAGGED_INVALID_VERSION => {
                "DDP: invalid DDP version"
            }
            Self::DDP_INVALID_QN => "DDP: invalid QN",
            Self::DDP_NO_BUFFER => "DDP: invalid MSN, no buffer available",
            Self::DDP_INVALID_MSN_RANGE => "DDP: invalid MSN, MSN range is not valid",
            Self::DDP_INVALID_MO => "DDP: invalid MO",
            Self::DDP_MESSAGE_TOO_LONG => "DDP: message too long for available buffer",
            Self::MPA_CONNECTION_LOST => "MPA: TCP connection closed, terminated or lost",
            Self::MPA_CRC => "MPA: CRC mismatch",
            Self::MPA_MARKER => "MPA: marker and ULPDU_Length disagree",
            Self::MPA_INVALID_FRAME => "MPA: invalid Request or Reply frame",
            Self::MPA_LOCAL_CATASTROPHIC => "MPA: local catastrophic",
            Self::MPA_INSUFFICIENT_IRD => "MPA: insufficient IRD resources",
            Self::MPA_NO_MATCHING_RTR => "MPA: no matching RTR option",
            _ if self.layer == Layer::RDMAP && self.etype == EType::RDMAP_LOCAL_CATASTROPHIC => {
                "RDMAP: local catastrophic"
            }
            _ => return None,
        })
    }
}

impl fmt::Display for TermCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "layer {:#x} type {:#x} code {:#04x}",
            self.layer.0, self.etype.0, self.code.0
        )?;
        if let Some(name) = self.name() {
            write!(f, " ({name})")?;
        }
        Ok(())
    }
}
