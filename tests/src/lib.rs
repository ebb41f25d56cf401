//! Shared harness for the end-to-end tests in `tests/tests/`.

pub mod bins;
pub mod capture;
pub mod e2e;
pub mod netns;
pub mod pcap;
pub mod portmapper;
pub mod preload;
pub mod programs;
pub mod proxy;
pub mod statfile;
pub mod tshark;
pub mod watchdog;
