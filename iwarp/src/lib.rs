//! A user-space iWARP stack: RDMAP (RFC 5040) over DDP (RFC 5041) over MPA
//! (RFC 5044, with the enhanced connection setup of RFC 6581), running over
//! any reliable byte stream — in practice a kernel TCP socket.
//!
//! The crate is layered bottom-up:
//!
//! * [`wire`] — one module per wire format: a checked view over bytes plus a
//!   plain struct with `parse`/`emit`. Nothing in it panics on any input.
//! * [`mpa`] — the MPA Startup Phase (RFC 5044 §7.1, RFC 6581): a sans-IO
//!   machine exchanging Request/Reply Frames and negotiating Full Operation.
#![forbid(unsafe_code)]

pub mod mpa;
pub mod wire;
