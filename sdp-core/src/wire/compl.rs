//! The RDMA completion headers: RdmaWrCompl Header, RWCH (draft §6.3.6,
//! Figure 9), and RdmaRdCompl Header, RRCH (§6.3.7, Figure 10).
//!
//! Each is one 32-bit Len in bytes 0-3, and the message is a BSDH plus that
//! header and nothing else. The sender's Flow Control Mode preference rides
//! in the REQ_PIPE flag of the BSDH (§6.1.2).
//!
//! ```
//! use sdp_core::wire::{RdmaRdComplHeader, RdmaRdComplRepr};
//!
//! let rrch = RdmaRdComplRepr::parse(&RdmaRdComplHeader::new_checked(&[0, 0, 0x10, 0][..]).unwrap());
//! assert_eq!(rrch, Ok(RdmaRdComplRepr { len: 4096 }));
//! ```

word_header! {
    /// A checked view of an RdmaWrCompl Header (§6.3.6).
    view RdmaWrComplHeader;
    /// The fields of an RdmaWrCompl Header (§6.3.6).
    repr RdmaWrComplRepr;
    /// Bytes placed by RDMA Write(s) into the Data Sink's buffer of the
    /// oldest outstanding SinkAvail; may be less than advertised
    /// (§6.3.6.1).
    field len => length, set_length;
    "RWCH Len"
}

word_header! {
    /// A checked view of an RdmaRdCompl Header (§6.3.7).
    view RdmaRdComplHeader;
    /// The fields of an RdmaRdCompl Header (§6.3.7).
    repr RdmaRdComplRepr;
    /// Bytes fetched by RDMA Read(s) for the oldest outstanding SrcAvail,
    /// not counting the SrcAvail's own payload (§6.3.7.1).
    field len => length, set_length;
    "RRCH Len"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    static BYTES: [u8; 4] = [0x12, 0x34, 0x56, 0x78];

    #[test]
    fn test_deconstruct() {
        assert_eq!(
            RdmaWrComplHeader::new_checked(&BYTES[..]).unwrap().length(),
            0x1234_5678
        );
        assert_eq!(
            RdmaRdComplHeader::new_checked(&BYTES[..]).unwrap().length(),
            0x1234_5678
        );
    }

    #[test]
    fn test_construct() {
        let mut bytes = [0xa5u8; 4];
        RdmaWrComplHeader::new_unchecked(&mut bytes[..]).set_length(0x1234_5678);
        assert_eq!(bytes, BYTES);
        let mut bytes = [0xa5u8; 4];
        RdmaRdComplHeader::new_unchecked(&mut bytes[..]).set_length(0x1234_5678);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn test_parse() {
        let h = RdmaWrComplHeader::new_checked(&BYTES[..]).unwrap();
        assert_eq!(
            RdmaWrComplRepr::parse(&h),
            Ok(RdmaWrComplRepr { len: 0x1234_5678 })
        );
        let h = RdmaRdComplHeader::new_checked(&BYTES[..]).unwrap();
        assert_eq!(
            RdmaRdComplRepr::parse(&h),
            Ok(RdmaRdComplRepr { len: 0x1234_5678 })
        );
    }

    #[test]
    fn test_emit() {
        let mut bytes = [0xa5u8; 4];
        let r = RdmaWrComplRepr { len: 0x1234_5678 };
        assert_eq!(r.buffer_len(), 4);
        r.emit(&mut RdmaWrComplHeader::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
        let mut bytes = [0xa5u8; 4];
        let r = RdmaRdComplRepr { len: 0x1234_5678 };
        assert_eq!(r.buffer_len(), 4);
        r.emit(&mut RdmaRdComplHeader::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn truncated() {
        for n in 0..4 {
            assert_eq!(
                RdmaWrComplHeader::new_checked(&BYTES[..n]),
                Err(Error::Truncated)
            );
            assert_eq!(
                RdmaRdComplHeader::new_checked(&BYTES[..n]),
                Err(Error::Truncated)
            );
        }
    }
}
