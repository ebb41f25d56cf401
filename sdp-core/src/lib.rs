//! The Sockets Direct Protocol for iWARP (draft-pinkerton-iwarp-sdp-01),
//! carried over the user-space engine of the `iwarp` crate.
//!
//! * [`wire`] — the SDP messages of draft §6: the Base Sockets Direct Header
//!   and every extended header, as checked views and plain structs.
#![forbid(unsafe_code)]

pub mod decode;
pub mod wire;
