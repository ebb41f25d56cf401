//! Port mapper message codec: parse arbitrary bytes; if they parse, emit and
//! compare, then parse the emitted bytes again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use portmapper::wire::{Message, MessageRepr, MsgType, MESSAGE_LEN};

fuzz_target!(|data: &[u8]| {
    let Ok(repr) = MessageRepr::parse_bytes(data) else {
        return;
    };
    let out = repr.to_bytes();

    // Normalise exactly the bits the draft says are ignored on receive:
    // Reserved (§7.3.1.5), PmTime outside PMAccept (§7.4), and the trailing
    // 96 bits of each address field when IPV is 4 (§7.3.1.3).
    let mut expect = [0u8; MESSAGE_LEN];
    expect.copy_from_slice(data);
    expect[2] = 0;
    expect[3] = 0;
    if repr.mtype != MsgType::ACCEPT {
        expect[1] = 0;
    }
    if expect[0] & 0x0f == 4 {
        expect[20..32].fill(0);
        expect[36..48].fill(0);
    }
    assert_eq!(out, expect);

    let again = MessageRepr::parse(&Message::new_checked(&out[..]).unwrap()).unwrap();
    assert_eq!(again, repr);
});
