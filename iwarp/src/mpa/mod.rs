//! MPA connection semantics above the wire formats: the Startup Phase of
//! RFC 5044 §7.1 with the enhanced connection establishment of RFC 6581
//! (§5, §6, §8, §9, §10).
//!
//! * [`startup`] — the sans-IO [`Startup`] machine that exchanges the MPA
//!   Request and Reply Frames, negotiates CRC, Markers, IRD/ORD and the
//!   Ready-to-Receive (RTR) indication, and hands the data path a
//!   [`Negotiated`] set of parameters for Full Operation.
//!
//! The frames themselves are parsed and emitted by [`crate::wire::mpa`];
//! this module decides what a frame means in the state the connection is in.

pub mod startup;

pub use startup::{
    FailureReason, Negotiated, Role, Rtr, RtrSet, Startup, StartupConfig, StartupError,
    StartupEvent, State,
};
