//! MPA Request/Reply frames and the RFC 6581 enhanced connection data:
//! parse arbitrary bytes, emit, compare, parse again.
#![no_main]

use iwarp::wire::mpa::{EnhancedData, EnhancedRepr, Frame, FrameKind, FrameRepr, HEADER_LEN};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let parsed = Frame::new_checked(data).and_then(|f| FrameRepr::parse(&f));
    if let Ok(repr) = parsed {
        let len = repr.buffer_len();
        // The header alone tells a stream reader how long the frame is.
        assert_eq!(Frame::<&[u8]>::frame_len(&data[..HEADER_LEN]), Ok(len));

        let out = repr.to_vec().expect("a parsed frame emits");
        // Normalise exactly the bits ignored on receive: Res (RFC 5044
        // §7.1.1 "not checked on reception") and, in a Request, R ("not
        // checked on reception in the MPA Request Frame").
        let mut expect = data[..len].to_vec();
        expect[16] &= !0x0f;
        if repr.kind == FrameKind::Request {
            expect[16] &= !0x20;
        }
        assert_eq!(out, expect);

        let again = FrameRepr::parse(&Frame::new_checked(&out[..]).unwrap()).unwrap();
        assert_eq!(again, repr);

        let (enhanced, rest) = repr
            .split_private_data()
            .expect("parse checked the enhanced data is there");
        assert_eq!(enhanced.is_some(), repr.enhanced);
        assert_eq!(
            rest.len() + if repr.enhanced { 4 } else { 0 },
            repr.private_data.len()
        );
    } else if let Ok(len) = Frame::<&[u8]>::frame_len(data) {
        // frame_len accepted the header: the frame can only have failed for
        // lack of bytes or for S without enhanced data.
        assert!(data.len() < len || (data[16] & 0x10 != 0 && len < HEADER_LEN + 4));
    }

    // The enhanced data on its own, from the front of the input.
    if let Ok(view) = EnhancedData::new_checked(data) {
        let repr = EnhancedRepr::parse(&view).unwrap();
        let out = repr.to_bytes().expect("parsed enhanced data emits");
        // RFC 6581 §9.2: with A clear, B, C and D are ignored on receive.
        let mut expect = [data[0], data[1], data[2], data[3]];
        if !repr.peer_to_peer {
            expect[0] &= !0x40;
            expect[2] &= !0xc0;
        }
        assert_eq!(out, expect);
        let again = EnhancedRepr::parse(&EnhancedData::new_checked(&out[..]).unwrap()).unwrap();
        assert_eq!(again, repr);
    }
});
