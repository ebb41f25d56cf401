//! SDP messages (draft-pinkerton-iwarp-sdp-01 §6): parse arbitrary bytes;
//! whatever parses must re-emit to the same bytes and parse again to the
//! same Repr. `validate` must not panic either.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sdp_core::wire::{Message, MessageRepr};

fuzz_target!(|data: &[u8]| {
    let Ok(repr) = MessageRepr::parse(data) else {
        return;
    };
    let _ = repr.validate();

    let mut out = vec![0u8; repr.buffer_len()];
    repr.emit(&mut out);

    // The draft makes some bits "transmitted as zero and not checked at
    // receiver": BSDH Flags bits 3-7 (§6.1.2), the HH/HAH Rsvd byte
    // (§6.2.1.8, §6.2.2.7) and the MCH Rsvd bits (§6.3.8.3). Parse drops
    // them and emit sends zeros, so compare after clearing exactly those.
    let mut expected = data.to_vec();
    Message::new_unchecked(&mut expected[..]).clear_reserved();
    assert_eq!(out, expected);

    assert_eq!(MessageRepr::parse(&out), Ok(repr));
});
