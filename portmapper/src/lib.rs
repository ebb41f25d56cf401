//! The SDP port mapper (draft-pinkerton-iwarp-sdp-01 §7): it tells a
//! connecting client whether a TCP port on a host is served by SDP, and on
//! which port.
//!
//! * [`wire`] — the 48-byte port mapper message of §7.3.
//! * [`server`] — the Port Mapper Service Provider (§7.5.2), sans-IO.
//! * [`client`] — the PM Client (§7.5.1): transactions with retransmission,
//!   caches, sans-IO.
//! * [`net`] — the client's socket driver: blocking and nonblocking queries.
//! * [`control`] — the local registration protocol spoken over the daemon's
//!   Unix-domain control socket.
//! * [`procnet`] — which process listens on which TCP port (`/proc`).
//!
//! The daemon `sdp-portmapper` (src/bin) drives [`server`]; see
//! `docs/portmapper.md` for operating it.
#![forbid(unsafe_code)]

pub mod client;
pub mod control;
pub mod net;
pub mod procnet;
pub mod server;
pub mod wire;
