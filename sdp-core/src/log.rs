//! Diagnostics: one line for each event an operator wants to know about
//! (an abortive close and the rule that caused it, a Terminate, a refused
//! Hello). Lines go to standard error when the environment variable
//! `SDP_LOG` is set (to anything but `0`), prefixed with `sdp:`; each
//! connection also keeps its own lines (its `Link`'s log) for tests and for
//! `sdp-stat`.
//!
//! ```
//! sdp_core::log::emit(format_args!("nothing to see"));
//! assert!(!sdp_core::log::enabled() || std::env::var_os("SDP_LOG").is_some());
//! ```

use std::sync::OnceLock;

/// Where lines go instead of standard error (see [`set_sink`]).
static SINK: OnceLock<fn(&str)> = OnceLock::new();

/// Sends every line to `sink` from now on, whatever `SDP_LOG` says (a host
/// with its own logging, such as the preload library, applies its own
/// level and destination). The first call wins.
pub fn set_sink(sink: fn(&str)) {
    let _ = SINK.set(sink);
}

/// Whether lines go to standard error.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("SDP_LOG").is_some_and(|v| v != "0"))
}

/// Writes one line to the sink, or to standard error if [`enabled`].
pub fn emit(args: core::fmt::Arguments<'_>) {
    if let Some(sink) = SINK.get() {
        sink(&args.to_string());
    } else if enabled() {
        eprintln!("sdp: {args}");
    }
}
