//! Terminate header (RFC 5040 §4.8): parse, emit, compare.
#![no_main]

use iwarp::wire::terminate::{TermCode, TerminateHeader, TerminateRepr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let control = TerminateRepr::parse_control(data);
    let header = match TerminateHeader::new_checked(data) {
        Ok(header) => header,
        Err(err) => {
            let _ = TermCode::from(err);
            return;
        }
    };
    let _ = (
        header.segment_length(),
        header.ddp_header(),
        header.rdma_header(),
    );
    let repr = TerminateRepr::parse(&header).unwrap();
    assert_eq!(control, Ok((repr.code, repr.hdrct())));
    if let Some(ddp) = repr.ddp {
        let _ = ddp.header_repr();
    }
    let len = repr.buffer_len();
    assert_eq!(len, header.header_len());
    let mut out = vec![0u8; len];
    repr.emit(&mut TerminateHeader::new_unchecked(&mut out[..]));

    // RFC 5040 §4.8: the 13 reserved bits are "ignored on receive" and
    // emitted as zero; bytes after the header are not part of it.
    let mut expected = data[..len].to_vec();
    expected[2] &= !0x1f;
    expected[3] = 0;
    assert_eq!(out, expected);

    let again = TerminateRepr::parse(&TerminateHeader::new_checked(&out[..]).unwrap()).unwrap();
    assert_eq!(again, repr);
});
