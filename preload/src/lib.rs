//! `libsdp_preload.so`: loaded with `LD_PRELOAD` into an unmodified,
//! dynamically linked program, it carries the program's TCP stream
//! connections over SDP when the peer speaks it (DESIGN §6).
//!
//! The modules are layers (DESIGN §8), top to bottom; each imports only
//! its own layer and those below it, and no modules import each other in
//! a circle:
//!
//! 1. [`abi`] — the interposed C functions (every call of DESIGN §6):
//!    argument decoding, `errno`, the library's start, `fork` and exit.
//! 2. [`backend`] — the SDP engine behind [`sdp`]: `sdp-core` streams, the
//!    port mapper client, the hidden listeners, `fork`.
//! 3. [`stat`] (with [`stat_format`]) — the per-process state export read
//!    by `sdp-stat`; it reads the table.
//! 4. [`table`] — per-fd state of the sockets the preload manages; it
//!    tells the state export and `epoll` of changes through callbacks they
//!    register.
//! 5. [`sdp`] — the interface the SDP data path plugs into
//!    ([`sdp::SdpEndpoint`], [`sdp::SdpListener`], [`sdp::SdpBackend`]),
//!    which the table stores.
//! 6. [`config`], [`rules`], [`log`](mod@log) — the `libsdp.conf` rule language and
//!    its loading; logging by environment, never to standard output.
//! 7. [`sys`] — the C library's own functions, `sockaddr`, socket options,
//!    `errno`, the thread guard and signal mask of the library's threads.
//!
//! The unit test in `layers_test.rs` checks the layering from the source
//! (`cargo test -p preload layers`), reading imports as
//! `shared/tools/layers.py` does.
//!
//! Every decision is recorded (rule, reason) and published, SDP or TCP.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod abi;
pub mod backend;
pub mod config;
#[cfg(test)]
mod layers_test;
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
