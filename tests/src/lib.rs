//! Shared harness for the end-to-end tests in `tests/tests/`.

pub mod pcap;
pub mod tshark;
