//! Diagnostics: one line for each event an operator wants to know about
//! (an abortive close and the rule that caused it, a Terminate, a refused
//! Hello). Lines go to standard error when the environment variable
//! `SDP_LOG` is set (to anything but `0`), prefixed with `sdp:`; each
//! [`Link`](crate::link::Link) also keeps its own lines for tests and for
//! `sdp-stat`.
//!
//! ```
//! sdp_core::log::emit(format_args!("nothing to see"));
//! assert!(!sdp_core::log::enabled() || std::env::var_os("SDP_LOG").is_some());
//! ```

use std::sync::OnceLock;

/// Whether lines go to standard error.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SDP_LOG").is_some_and(|v| v != "0"))
}

/// Writes one line to standard error if [`enabled`].
pub fn emit(args: core::fmt::Arguments<'_>) {
    if enabled() {
        eprintln!("sdp: {args}");
    }
}
