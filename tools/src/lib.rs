//! Programs that are not the protocol, over the protocol crates (`iwarp`,
//! `sdp-core`), which hold the protocol only:
//!
//! * `sdpcat` — an SDP client and server, netcat-style, over
//!   `sdp_core::stream`;
//! * `sdp-bench` — SDP throughput and latency over loopback, by mechanism;
//! * `sdp-decode` — prints the MPA, RDMAP and SDP messages of a capture
//!   file ([`decode`]);
//! * `iwarp-perf` — the iWARP engine alone: Send, RDMA Write and Read
//!   between two processes.
#![forbid(unsafe_code)]

pub mod decode;
