//! MPA connection setup: the startup machine of RFC 5044 §7.1 with the
//! enhanced connection establishment of RFC 6581.
//!
//! PLACEHOLDER (worker "datapath"): the real module is written by the
//! worker "startup"; this one only exists so that `engine::Connection`
//! compiles and can be tested against the agreed interface.

pub mod startup;
