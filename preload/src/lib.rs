//! `libsdp_preload.so`: loaded with `LD_PRELOAD` into an unmodified,
//! dynamically linked program, it carries the program's TCP stream
//! connections over SDP when the peer speaks it (DESIGN §6).
//!
//! The interposition layer is built on `sdp-core` and the `portmapper`
//! client; until it lands, loading the library changes nothing for the
//! program.

pub mod rules;
