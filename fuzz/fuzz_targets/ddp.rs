//! DDP header (RFC 5041 §4): parse, emit, compare.
#![no_main]

use iwarp::wire::ddp::{DdpRepr, Segment};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(segment) = Segment::new_checked(data) else {
        return;
    };
    // Every getter must be safe on a checked segment.
    let _ = (
        segment.stag(),
        segment.to(),
        segment.qn(),
        segment.msn(),
        segment.mo(),
    );
    let _ = (
        segment.rsvd_ulp32(),
        segment.reserved(),
        segment.payload().len(),
    );
    let Ok(repr) = DdpRepr::parse(&segment) else {
        return;
    };
    let len = repr.buffer_len();
    assert_eq!(len, segment.header_len());
    let mut out = vec![0u8; len];
    repr.emit(&mut Segment::new_unchecked(&mut out[..]));

    // RFC 5041 §4.1: the 4 reserved control bits are "not checked on
    // receive" and emitted as zero, so compare with them cleared.
    let mut expected = data[..len].to_vec();
    expected[0] &= !0x3c;
    assert_eq!(out, expected);

    let again = DdpRepr::parse(&Segment::new_checked(&out[..]).unwrap()).unwrap();
    assert_eq!(again, repr);
});
