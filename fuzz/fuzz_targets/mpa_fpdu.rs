//! FPDU deframing: the first byte picks markers (bit 0), CRC (bit 1) and a
//! stream position (bits 2..8: the next marker 0..252 octets away, near the
//! top of the u64 range); the rest is wire bytes. Parse, emit contiguously
//! and as a gather list, compare, parse again.
#![no_main]

use iwarp::wire::fpdu::{self, Framing, SegmentKind, TxPlan};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&sel, wire)) = data.split_first() else {
        return;
    };
    let framing = Framing {
        markers: sel & 1 != 0,
        crc: sel & 2 != 0,
    };
    let k = u64::from(sel >> 2);
    let pos = (u64::MAX - 511) + (512 - 4 * k) % 512;

    let Ok((repr, used)) = fpdu::parse(wire, pos, framing) else {
        return;
    };
    let layout = repr.layout(pos, framing.markers).unwrap();
    assert_eq!(layout.wire_len(), used);
    assert_eq!(repr.ulpdu.len(), layout.ulpdu_len());

    let out = repr.to_vec(pos, framing).expect("a parsed FPDU emits");

    // Normalise what a receiver ignores: marker RESERVED halves (RFC 5044
    // §4.2), the two low FPDUPTR bits (§4.2 "treat these as zero"), pad
    // (§4.1 "ignored by the receiver (except for CRC checking)"). Any such
    // change, or CRCs off (§4.1: any value, MUST NOT be checked), leaves the
    // CRC field to the emitter.
    let mut expect = wire[..used].to_vec();
    let mut normalised = false;
    let mut crc_range = None;
    for s in layout.segments() {
        let bytes = &mut expect[s.wire.clone()];
        match s.kind {
            SegmentKind::Marker { .. } => {
                normalised |= bytes[0] != 0 || bytes[1] != 0 || bytes[3] & 3 != 0;
                bytes[0] = 0;
                bytes[1] = 0;
                bytes[3] &= !3;
            }
            SegmentKind::Pad => {
                normalised |= bytes.iter().any(|&b| b != 0);
                bytes.fill(0);
            }
            SegmentKind::Crc => crc_range = Some(s.wire.clone()),
            _ => {}
        }
    }
    let crc_range = crc_range.expect("every FPDU ends in a CRC");
    if normalised || !framing.crc {
        expect[crc_range.clone()].copy_from_slice(&out[crc_range]);
    }
    assert_eq!(out, expect);

    // The gather form, fed the ULPDU pieces straight from the input.
    let parts: Vec<&[u8]> = repr.ulpdu.pieces().collect();
    let mut plan = TxPlan::new(layout);
    plan.seal(&parts, framing.crc).unwrap();
    let mut gathered = Vec::new();
    plan.for_each_slice(&parts, |s| gathered.extend_from_slice(s))
        .unwrap();
    assert_eq!(gathered, out);

    let (again, used_again) = fpdu::parse(&out, pos, framing).expect("emitted FPDU parses");
    assert_eq!(used_again, used);
    assert_eq!(again, repr);
});
