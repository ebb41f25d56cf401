//! The SDP port mapper (draft-pinkerton-iwarp-sdp-01 §7): it tells a
//! connecting client whether a TCP port on a host is served by SDP, and on
//! which port.
//!
//! * [`wire`] — the 48-byte port mapper message of §7.3.
#![forbid(unsafe_code)]

pub mod wire;
