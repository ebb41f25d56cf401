//! Decode errors of the SDP message formats (draft §6).
//!
//! SDP has no error message of its own: a peer that breaks a rule of §6 gets
//! an abortive close (§8.2.2). So instead of a wire code, each variant names
//! the section it enforces ([`Error::rule`]), for the log line
//! `abortive close: <rule>`.
//!
//! The parsers ([`MessageRepr::parse`](super::MessageRepr::parse) and the
//! header views) report the structural faults: [`Error::Truncated`],
//! [`Error::LengthMismatch`], [`Error::UnexpectedPayload`],
//! [`Error::SuspCommConstant`]. The per-message field rules that need no
//! connection state are checked by
//! [`MessageRepr::validate`](super::MessageRepr::validate) and report the
//! remaining variants.
//!
//! ```
//! use sdp_core::wire::{Error, MessageRepr};
//!
//! let err = MessageRepr::parse(&[0xff, 0, 0, 0]).unwrap_err();
//! assert_eq!(err, Error::Truncated);
//! assert_eq!(err.rule(), "§6.1");
//! assert_eq!(format!("abortive close: {err}"),
//!            "abortive close: message shorter than its headers or its Len (§6.1)");
//! ```

use core::fmt;

/// A violation of the SDP message formats.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// The buffer ends before the BSDH, before the extended header the MID
    /// requires, or before the length given by the BSDH Len field.
    Truncated,
    /// The buffer is longer than the BSDH Len field, or Len is smaller than
    /// the headers of the message (§6.1.4).
    LengthMismatch,
    /// ULP payload in a message type that "MUST contain only" its headers
    /// (§6.1.1 Figure 3, §6.2–§6.5).
    UnexpectedPayload,
    /// A SuspCH whose Constant1 is not 0x0 or whose Constant2 is not 0x1
    /// (§6.5.1.2, §6.5.1.3).
    SuspCommConstant,
    /// OOB_PRES set in a message other than Data (§6.1.2).
    OobPresOutsideData,
    /// OOB_PRES set in a Data Message without ULP payload: the last payload
    /// byte is the OOB byte, so there must be one (§6.1.2, §9.5.3).
    OobPresWithoutPayload,
    /// MajV in the HH or HAH is not the version this implementation speaks
    /// (§6.2.1.1, §6.2.2.1, §8.1.1 steps 3a and 7a).
    UnsupportedMajorVersion,
    /// MaxAdverts of zero in the HH or HAH (§6.2.1.3, §6.2.2.3).
    ZeroMaxAdverts,
    /// LocIRD of zero in the HH or HAH (§6.2.1.6, §6.2.2.5, §8.1.1).
    ZeroLocIrd,
    /// LocORD of zero in the HH or HAH (§6.2.1.7, §6.2.2.6, §8.1.1).
    ZeroLocOrd,
    /// DesRemRcvSz, LocalRcvSz or ActRcvSz above 2^31 bytes (§6.2.1.4,
    /// §6.2.1.5, §6.2.2.4).
    RcvSzTooLarge,
    /// SrcAvail or SinkAvail Len of zero or above 2^31 bytes (§6.3.2.1,
    /// §6.3.3.1).
    AdvertLen,
    /// A Mode value the draft reserves (3–7) in a ModeChange (§6.3.8.2
    /// Figure 12).
    ReservedMode,
}

impl Error {
    /// The draft-pinkerton-iwarp-sdp-01 section(s) whose rule was broken.
    pub const fn rule(&self) -> &'static str {
        match self {
            Error::Truncated => "§6.1",
            Error::LengthMismatch => "§6.1.4",
            Error::UnexpectedPayload => "§6.1.1",
            Error::SuspCommConstant => "§6.5.1.2, §6.5.1.3",
            Error::OobPresOutsideData => "§6.1.2",
            Error::OobPresWithoutPayload => "§6.1.2, §9.5.3",
            Error::UnsupportedMajorVersion => "§6.2.1.1, §6.2.2.1",
            Error::ZeroMaxAdverts => "§6.2.1.3, §6.2.2.3",
            Error::ZeroLocIrd => "§6.2.1.6, §6.2.2.5",
            Error::ZeroLocOrd => "§6.2.1.7, §6.2.2.6",
            Error::RcvSzTooLarge => "§6.2.1.4, §6.2.1.5, §6.2.2.4",
            Error::AdvertLen => "§6.3.2.1, §6.3.3.1",
            Error::ReservedMode => "§6.3.8.2",
        }
    }

    fn description(&self) -> &'static str {
        match self {
            Error::Truncated => "message shorter than its headers or its Len",
            Error::LengthMismatch => "Len is not the size of the message",
            Error::UnexpectedPayload => "payload in a message that carries none",
            Error::SuspCommConstant => "SuspCH Constant1 is not 0x0 or Constant2 is not 0x1",
            Error::OobPresOutsideData => "OOB_PRES set outside a Data Message",
            Error::OobPresWithoutPayload => "OOB_PRES set in a Data Message without payload",
            Error::UnsupportedMajorVersion => "unsupported MajV",
            Error::ZeroMaxAdverts => "MaxAdverts is zero",
            Error::ZeroLocIrd => "LocIRD is zero",
            Error::ZeroLocOrd => "LocORD is zero",
            Error::RcvSzTooLarge => "receive Private Buffer size above 2^31",
            Error::AdvertLen => "advertised buffer Len is zero or above 2^31",
            Error::ReservedMode => "reserved Mode value in ModeChange",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.description(), self.rule())
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variant_names_a_section() {
        let all = [
            Error::Truncated,
            Error::LengthMismatch,
            Error::UnexpectedPayload,
            Error::SuspCommConstant,
            Error::OobPresOutsideData,
            Error::OobPresWithoutPayload,
            Error::UnsupportedMajorVersion,
            Error::ZeroMaxAdverts,
            Error::ZeroLocIrd,
            Error::ZeroLocOrd,
            Error::RcvSzTooLarge,
            Error::AdvertLen,
            Error::ReservedMode,
        ];
        for e in all {
            assert!(e.rule().starts_with("§6.") || e.rule().starts_with("§9."));
            let text = e.to_string();
            assert!(text.ends_with(&format!("({})", e.rule())), "{text}");
        }
        assert_eq!(
            Error::LengthMismatch.to_string(),
            "Len is not the size of the message (§6.1.4)"
        );
    }
}
