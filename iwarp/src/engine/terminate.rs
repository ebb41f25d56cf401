//! Terminate messages (RFC 5040 §4.8, §5.4, §7.1): which headers go in
//! (Figure 10, via [`TermCode::header_inclusion`]) and decoding the peer's.

use crate::wire::ddp;
use crate::wire::rdmap::ReadRequestRepr;
use crate::wire::terminate::{TermCode, TerminateHeader, TerminateRepr, TerminatedDdp};

use super::wr::TerminateInfo;

/// Room for the largest Terminate header: control (4), DDP Segment Length
/// (2), untagged DDP header (18), Read Request header (28).
pub(crate) const TERM_CAP: usize = 64;

/// What an incoming segment can contribute to a Terminate about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Echo {
    /// The segment's DDP header as received.
    pub ddp: [u8; ddp::UNTAGGED_HEADER_LEN],
    /// Its length (14 or 18), or 0 when no whole header was received.
    pub ddp_len: usize,
    /// The DDP segment length (the ULPDU_Length), RFC 5040 §4.8: "The
    /// length handed up by the DDP layer when the error was detected".
    pub seg_len: u16,
    /// The segment was an RDMA Read Request.
    pub read_request: bool,
    /// Its Read Request header, as updated (RFC 5040 §4.8).
    pub rr: Option<ReadRequestRepr>,
}

impl Echo {
    /// Nothing to echo.
    pub const NONE: Echo = Echo {
        ddp: [0; ddp::UNTAGGED_HEADER_LEN],
        ddp_len: 0,
        seg_len: 0,
        read_request: false,
        rr: None,
    };
}

/// The Terminate header for `code` about the segment `echo` describes:
/// its bytes (in a [`TERM_CAP`] array, with the length used) and, for the
/// ULP, its content.
pub(crate) fn build(code: TermCode, echo: &Echo) -> ([u8; TERM_CAP], usize, TerminateInfo) {
    // RFC 5040 §4.8 Figure 10 decides M, D and R; "Yes, if possible":
    // only if a whole DDP header was received.
    let hdrct = code.header_inclusion(echo.read_request, echo.ddp_len > 0);
    let ddp_header = &echo.ddp[..echo.ddp_len];
    let repr = TerminateRepr {
        code,
        ddp: hdrct.ddp_header.then_some(TerminatedDdp {
            segment_length: echo.seg_len,
            segment_length_valid: hdrct.segment_length,
            header: ddp_header,
        }),
        // RFC 5040 §4.8: "The Terminated RDMA Header is only sent back if
        // the terminate is associated with an RDMA Read Request Message."
        rdma_header: if hdrct.rdma_header { echo.rr } else { None },
    };
    let mut bytes = [0u8; TERM_CAP];
    let len = repr.buffer_len();
    repr.emit(&mut TerminateHeader::new_unchecked(&mut bytes[..len]));
    let info = TerminateInfo {
        code,
        hdrct: repr.hdrct(),
        segment_length: repr.ddp.map(|d| d.segment_length),
        ddp_header: repr.ddp.map(|d| d.header.to_vec()),
        rdma_header: repr.rdma_header,
    };
    (bytes, len, info)
}

/// Decodes the peer's Terminate header. A malformed one still yields the
/// peer's code if its control field is there (RFC 5040 §5.4: "an error is
/// surfaced"), else [`TermCode::RDMAP_OP_UNSPECIFIED`].
pub(crate) fn parse(data: &[u8]) -> TerminateInfo {
    let parsed =
        TerminateHeader::new_checked(data).and_then(|h| TerminateRepr::parse(&h).map(|r| (r, h)));
    match parsed {
        Ok((repr, _)) => TerminateInfo {
            code: repr.code,
            hdrct: repr.hdrct(),
            segment_length: repr.ddp.map(|d| d.segment_length),
            ddp_header: repr.ddp.map(|d| d.header.to_vec()),
            rdma_header: repr.rdma_header,
        },
        Err(e) => match TerminateRepr::parse_control(data) {
            Ok((code, _)) => TerminateInfo::bare(code),
            Err(_) => TerminateInfo::bare(e.into()),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::terminate::HdrCt;

    #[test]
    fn figure_10_shapes() {
        let mut echo = Echo::NONE;
        echo.ddp[..2].copy_from_slice(&[0x41, 0x41]);
        echo.ddp_len = 18;
        echo.seg_len = 46;
        echo.read_request = true;
        echo.rr = Some(ReadRequestRepr {
            size: 5,
            ..Default::default()
        });
        let (bytes, len, info) = build(TermCode::RDMAP_BASE_BOUNDS, &echo);
        assert_eq!(len, 4 + 2 + 18 + 28);
        assert_eq!(
            info.hdrct,
            HdrCt {
                segment_length: true,
                ddp_header: true,
                rdma_header: true
            }
        );
        assert_eq!(parse(&bytes[..len]), info);

        let (_, len, info) = build(TermCode::MPA_CRC, &echo);
        assert_eq!((len, info.hdrct), (4, HdrCt::default()));
        let (_, len, info) = build(TermCode::DDP_INVALID_QN, &echo);
        assert_eq!(len, 4 + 2 + 18);
        assert!(!info.hdrct.rdma_header);
        let (_, len, _) = build(TermCode::DDP_LOCAL_CATASTROPHIC, &echo);
        assert_eq!(len, 4);
        let (_, len, _) = build(TermCode::RDMAP_INVALID_STAG, &Echo::NONE);
        assert_eq!(len, 4);
    }

    #[test]
    fn malformed_terminate_keeps_code() {
        // D set but the DDP header is missing.
        let info = parse(&[0x12, 0x04, 0x40, 0x00]);
        assert_eq!(info.code, TermCode::DDP_INVALID_MO);
        assert_eq!(parse(&[1]).code, TermCode::RDMAP_OP_UNSPECIFIED);
    }
}
