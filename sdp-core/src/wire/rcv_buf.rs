//! The Private Buffer resizing headers: ChRcvBuf Header, CRBH (draft
//! §6.4.1, Figure 13), and ChRcvBufAck Header, CRBAH (§6.4.2, Figure 14).
//!
//! Each is one 32-bit size in bytes 0-3, and the message is a BSDH plus that
//! header and nothing else. The resizing procedure is §10.6.
//!
//! ```
//! use sdp_core::wire::{ChRcvBufHeader, ChRcvBufRepr};
//!
//! let mut buf = [0u8; 4];
//! ChRcvBufRepr { des_sz: 0x8000 }.emit(&mut ChRcvBufHeader::new_unchecked(&mut buf[..]));
//! assert_eq!(buf, [0, 0, 0x80, 0]);
//! ```

word_header! {
    /// A checked view of a ChRcvBuf Header (§6.4.1).
    view ChRcvBufHeader;
    /// The fields of a ChRcvBuf Header (§6.4.1).
    repr ChRcvBufRepr;
    /// DesSz: desired size in bytes of the Data Sink's receive Private
    /// Buffers (§6.4.1.1).
    field des_sz => des_sz, set_des_sz;
    "DesSz"
}

word_header! {
    /// A checked view of a ChRcvBufAck Header (§6.4.2).
    view ChRcvBufAckHeader;
    /// The fields of a ChRcvBufAck Header (§6.4.2).
    repr ChRcvBufAckRepr;
    /// ActSz: actual or new size in bytes of the sender's receive Private
    /// Buffers (§6.4.2.1).
    field act_sz => act_sz, set_act_sz;
    "ActSz"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Error;

    static BYTES: [u8; 4] = [0x00, 0x02, 0x00, 0x01];

    #[test]
    fn test_deconstruct() {
        assert_eq!(
            ChRcvBufHeader::new_checked(&BYTES[..]).unwrap().des_sz(),
            0x2_0001
        );
        assert_eq!(
            ChRcvBufAckHeader::new_checked(&BYTES[..]).unwrap().act_sz(),
            0x2_0001
        );
    }

    #[test]
    fn test_construct() {
        let mut bytes = [0xa5u8; 4];
        ChRcvBufHeader::new_unchecked(&mut bytes[..]).set_des_sz(0x2_0001);
        assert_eq!(bytes, BYTES);
        let mut bytes = [0xa5u8; 4];
        ChRcvBufAckHeader::new_unchecked(&mut bytes[..]).set_act_sz(0x2_0001);
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn test_parse() {
        let h = ChRcvBufHeader::new_checked(&BYTES[..]).unwrap();
        assert_eq!(
            ChRcvBufRepr::parse(&h),
            Ok(ChRcvBufRepr { des_sz: 0x2_0001 })
        );
        let h = ChRcvBufAckHeader::new_checked(&BYTES[..]).unwrap();
        assert_eq!(
            ChRcvBufAckRepr::parse(&h),
            Ok(ChRcvBufAckRepr { act_sz: 0x2_0001 })
        );
    }

    #[test]
    fn test_emit() {
        let mut bytes = [0xa5u8; 4];
        ChRcvBufRepr { des_sz: 0x2_0001 }.emit(&mut ChRcvBufHeader::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
        let mut bytes = [0xa5u8; 4];
        ChRcvBufAckRepr { act_sz: 0x2_0001 }
            .emit(&mut ChRcvBufAckHeader::new_unchecked(&mut bytes[..]));
        assert_eq!(bytes, BYTES);
    }

    #[test]
    fn truncated() {
        for n in 0..4 {
            assert_eq!(
                ChRcvBufHeader::new_checked(&BYTES[..n]),
                Err(Error::Truncated)
            );
            assert_eq!(
                ChRcvBufAckHeader::new_checked(&BYTES[..n]),
                Err(Error::Truncated)
            );
        }
    }
}
