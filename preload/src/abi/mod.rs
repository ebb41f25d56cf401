//! The interposed C functions (DESIGN §6 "Calls covered").
//!
//! Every hook starts on a fast path that costs a relaxed atomic load or two
//! and no allocation: while no fd is in SDP state ([`crate::table::no_sdp`]) the
//! data-path hooks call the C library at once; the lifecycle hooks
//! (`socket`, `connect`, `listen`, `accept`, `close`, `dup`...) touch the
//! fd table only for the sockets it manages, found lock-free.
//!
//! A thread-local guard ([`crate::sys::guard`]) marks "inside the preload":
//! any C call the preload makes itself (reading the rules file, logging,
//! `getsockname` for the state export) goes straight to the C library.
//! Panics never cross the C boundary: the managed paths run under
//! `catch_unwind` and, on a panic, log it and do what the C library would
//! have done.
//!
//! The `unsafe extern "C"` functions of the submodules are exported under
//! their C names from the shared library (not from unit-test builds, where
//! the tests call them as ordinary functions).
//!
//! * [`process`] — library start, `fork` and its handlers, the flush at
//!   exit.
//! * [`accept`] — `accept`, `accept4`: kernel and hidden SDP listener.
//! * [`socket`] — the rest of the socket lifecycle: `socket`, `bind`,
//!   `connect`, `listen`, `close`, `dup*`, options, names.
//! * [`epoll`] — the `epoll` family.
//! * [`poll`] — `poll`, `ppoll`, `select`, `pselect`.
//! * [`io`] — the data calls: `read`, `write`, `recv*`, `send*`,
//!   `sendfile`.
//!
//! Each uses only those listed after it (and [`protect`], here).

pub mod accept;
pub mod epoll;
pub mod io;
pub mod poll;
pub mod process;
pub mod socket;
mod spin;

use crate::log::Level;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`; if it panics, logs and runs `fallback` instead (which must do
/// what the C library would do with the same arguments).
pub fn protect<R>(what: &str, f: impl FnOnce() -> R, fallback: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            crate::log!(
                Level::Error,
                "internal error in {what}; the call goes to the C library"
            );
            fallback()
        }
    }
}
