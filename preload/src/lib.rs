//! `libsdp_preload.so`: loaded with `LD_PRELOAD` into an unmodified,
//! dynamically linked program, it carries the program's TCP stream
//! connections over SDP when the peer speaks it (DESIGN §6).
//!
//! * [`abi`] — the interposed C functions (every call of DESIGN §6).
//! * [`table`] — per-fd state of the sockets the preload manages.
//! * [`sdp`] — the interface the SDP data path plugs into
//!   ([`sdp::SdpEndpoint`], [`sdp::SdpListener`], [`sdp::SdpBackend`]).
//! * [`rules`] — the `libsdp.conf` rule language; [`config`] loads it.
//! * [`stat`] — the per-process state export read by `sdp-stat`.
//! * [`log`] — logging by environment, never to standard output.
//! * [`sys`] — the C library's own functions and low-level helpers.
//! * [`backend`] — the SDP engine behind [`sdp`]: `sdp-core` streams, the
//!   port mapper client, the hidden listeners, `fork`.
//!
//! Every decision is recorded (rule, reason) and published, SDP or TCP.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod abi;
pub mod backend;
pub mod config;
pub mod log;
#[cfg(test)]
mod no_alloc_test;
pub mod rules;
pub mod sdp;
pub mod stat;
pub mod stat_format;
pub mod sys;
pub mod table;
#[cfg(test)]
mod test_support;
