//! The Sockets Direct Protocol for iWARP (draft-pinkerton-iwarp-sdp-01),
//! carried over the user-space engine of the `iwarp` crate.
//!
//! * [`wire`] — the SDP messages of draft §6: the Base Sockets Direct Header
//!   and every extended header, as checked views and plain structs.
//! * [`conn`] — the SDP connection: setup (§8.1), Bcopy (§9.1), OOB
//!   (§9.5.3), credits (§10), close (§8.2), socket duplication as the
//!   Remote Peer (§13.1.1), as a sans-IO state machine.
//! * [`verbs`] — the operations and events it exchanges with the iWARP
//!   engine's queue pair.
//! * [`link`] — the adapter between a [`conn::Conn`] and the iWARP
//!   engine's `Connection` (still sans-IO), with the send staging.
//! * [`errno`] — the socket errors a TCP program expects.
//! * [`log`] — diagnostic lines (abortive closes and their rule).
//! * [`stream`] — [`stream::SdpStream`] and [`stream::SdpListener`]: SDP
//!   sockets over kernel TCP, with the progress thread and exact
//!   readiness.
//! * `testing` (feature `testing`) — a deterministic two-connection
//!   harness with an in-memory RDMA Send transport.
#![deny(unsafe_code)]

pub mod conn;
pub mod errno;
pub mod fds;
pub mod link;
pub mod log;
pub mod stream;
mod sys;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod verbs;
pub mod wire;
