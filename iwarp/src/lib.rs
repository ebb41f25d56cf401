//! A user-space iWARP stack: RDMAP (RFC 5040) over DDP (RFC 5041) over MPA
//! (RFC 5044, with the enhanced connection setup of RFC 6581), running over
//! any reliable byte stream — in practice a kernel TCP socket.
//!
//! The crate is layered bottom-up:
//!
//! * [`wire`] — one module per wire format: a checked view over bytes plus a
//!   plain struct with `parse`/`emit`. Nothing in it panics on any input.
//! * [`mem`] — memory regions, protection domains, STags and the checks
//!   that keep the peer inside what was registered.
//! * [`mpa`] — the MPA startup (Request/Reply, RFC 5044 §7.1, RFC 6581).
//! * [`engine`] — the data path (MPA FPDUs, DDP, RDMAP) as a sans-IO queue
//!   pair.
//! * [`driver`] — the I/O pump that runs a connection over a kernel TCP
//!   socket, and blocking connect/accept helpers.
#![deny(unsafe_code)]

pub mod driver;
pub mod engine;
pub mod mem;
pub mod mpa;
pub mod wire;
