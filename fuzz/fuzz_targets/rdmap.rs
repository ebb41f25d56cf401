//! RDMAP message headers over a DDP segment (RFC 5040 §4): parse, emit,
//! compare.
#![no_main]

use iwarp::wire::ddp::BufferModel;
use iwarp::wire::rdmap::RdmapRepr;
use iwarp::wire::terminate::TermCode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (repr, len) = match RdmapRepr::parse_bytes(data) {
        Ok(parsed) => parsed,
        Err(err) => {
            let _ = TermCode::from(err);
            return;
        }
    };
    assert!(len <= data.len());
    assert_eq!(len, repr.buffer_len());
    let _ = repr.invalidate_stag();
    let mut out = vec![0u8; len];
    repr.emit(&mut out);

    // Normalise exactly the bits the RFCs make "ignored on receive":
    // the DDP reserved control bits (RFC 5041 §4.1), the RDMAP Rsv bits and,
    // for defined untagged opcodes other than the two Invalidate ones, the
    // untagged RsvdULP word (RFC 5040 §4.1).
    let mut expected = data[..len].to_vec();
    expected[0] &= !0x3c;
    expected[1] &= !0x30;
    if let BufferModel::Untagged { .. } = repr.model {
        if repr.opcode.is_known() && !repr.opcode.has_invalidate_stag() {
            expected[2..6].fill(0);
        }
    }
    assert_eq!(out, expected);

    let (again, again_len) = RdmapRepr::parse_bytes(&out).unwrap();
    assert_eq!(again, repr);
    assert_eq!(again_len, len);
});
