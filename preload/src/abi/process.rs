//! The library's life in the process: start (the constructor), `fork`
//! (the hook and the `pthread_atfork` handlers), and the end (`atexit`,
//! `_exit`, `_Exit`: SDP connections flush first).
#![allow(clippy::missing_safety_doc)]

use super::protect;
use crate::log::Level;
use crate::sys::errno::SavedErrno;
use crate::sys::guard::{foreign_process, note_pid, Guard};
use crate::sys::real;
use crate::table;
use libc::{c_int, pid_t};

/// Library start: configuration, logging, symbol resolution, fork handlers.
pub fn init() {
    let Some(_g) = Guard::enter() else { return };
    protect(
        "initialisation",
        || {
            note_pid();
            let config = crate::config::get();
            crate::stat::init();
            // SDP_ENGINE=0: no SDP at all, every connection plain TCP.
            if std::env::var("SDP_ENGINE").is_ok_and(|v| v == "0") {
                crate::log!(Level::Debug, "SDP_ENGINE=0: every connection is TCP");
            } else {
                crate::backend::install();
            }
            for missing in real::resolve_all() {
                crate::log!(
                    Level::Debug,
                    "the C library has no {missing}; its hook answers ENOSYS"
                );
            }
            std::panic::set_hook(Box::new(|info| {
                crate::log!(Level::Error, "panic: {info}");
            }));
            // SAFETY: the handlers are plain extern "C" functions.
            unsafe {
                libc::pthread_atfork(
                    Some(atfork_prepare),
                    Some(atfork_parent),
                    Some(atfork_child),
                );
                libc::atexit(at_exit);
            }
            crate::log!(
                Level::Debug,
                "loaded into {:?} with {} rules from {}",
                crate::config::program(),
                config.rules.rules.len(),
                config.path.as_deref().unwrap_or("(no rules file)")
            );
        },
        || (),
    );
}

/// How long `exit` waits for SDP connections to flush
/// (`SDP_EXIT_FLUSH_MS`, default 2000).
fn exit_flush_time() -> std::time::Duration {
    let ms = std::env::var("SDP_EXIT_FLUSH_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000u64);
    std::time::Duration::from_millis(ms)
}

/// Asks every open SDP connection to flush before the process ends (each
/// endpoint once, however many fd numbers share it); returns how many.
pub fn flush_all(deadline: std::time::Instant) -> usize {
    let mut seen: Vec<*const ()> = Vec::new();
    let mut listeners: Vec<*const ()> = Vec::new();
    table::for_each(|_, e| match &e.sdp {
        table::SdpSide::Stream(h) => {
            let key = std::sync::Arc::as_ptr(h).cast::<()>();
            if !seen.contains(&key) {
                seen.push(key);
                h.endpoint.flush_at_exit(deadline);
            }
        }
        table::SdpSide::Listener(h) => {
            let key = std::sync::Arc::as_ptr(h).cast::<()>();
            if !listeners.contains(&key) {
                listeners.push(key);
                h.listener.exiting();
            }
        }
        table::SdpSide::None => {}
    });
    seen.len()
}

/// The process ends (`exit` or `_exit`): open SDP connections are closed
/// gracefully and, with the ones the program closed already, given until
/// `SDP_EXIT_FLUSH_MS` to finish.
fn exit_flush() {
    if foreign_process() {
        return;
    }
    let Some(_g) = Guard::enter() else { return };
    protect(
        "exit",
        || {
            let deadline = std::time::Instant::now() + exit_flush_time();
            if !table::no_sdp() {
                flush_all(deadline);
            }
            if let Some(b) = crate::sdp::backend() {
                b.exiting(deadline);
            }
        },
        || (),
    );
}

extern "C" fn at_exit() {
    exit_flush();
}

/// `_exit` (and `_Exit`): what a forked child calls to end without the
/// parent's `atexit` work. Its SDP connections still need their bytes and
/// close exchange out before the socket goes (the kernel keeps TCP bytes
/// past the process's end; the SDP engine's are in this process).
///
/// # Safety
/// As the C function: it does not return.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    exit_flush();
    // SAFETY: ends the process, as the C library's _exit would.
    unsafe { real_exit(status) }
}

/// `_Exit`: the same as `_exit`.
///
/// # Safety
/// As the C function: it does not return.
#[allow(non_snake_case)]
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    exit_flush();
    // SAFETY: as in _exit.
    unsafe { real_exit(status) }
}

/// The C library's `_exit`, or the system call if it cannot be found.
unsafe fn real_exit(status: c_int) -> ! {
    // SAFETY: a NUL-terminated name.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"_exit".as_ptr()) };
    if !f.is_null() {
        // SAFETY: the C library's `void _exit(int)`.
        let f: unsafe extern "C" fn(c_int) -> ! = unsafe { std::mem::transmute(f) };
        // SAFETY: as documented for _exit.
        unsafe { f(status) }
    }
    loop {
        // SAFETY: exit_group ends the process.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}

/// Calls `f` once per SDP side (however many fd numbers share it), with
/// the fork gate closed by this thread.
fn each_side_unguarded(mut f: impl FnMut(&table::SdpSide)) {
    let mut seen: Vec<*const ()> = Vec::new();
    table::for_each_unguarded(|_, e| {
        let key = match &e.sdp {
            table::SdpSide::None => return,
            table::SdpSide::Stream(h) => std::sync::Arc::as_ptr(h).cast::<()>(),
            table::SdpSide::Listener(h) => std::sync::Arc::as_ptr(h).cast::<()>(),
        };
        if !seen.contains(&key) {
            seen.push(key);
            f(&e.sdp);
        }
    });
}

/// A `fork` failed: the connections it made pending keep no holder slot
/// for a child (see `backend::owner`).
fn fork_failed() {
    let Some(_g) = Guard::enter() else { return };
    protect(
        "fork",
        || {
            let mut seen: Vec<*const ()> = Vec::new();
            table::for_each(|_, e| {
                if let table::SdpSide::Stream(h) = &e.sdp {
                    let key = std::sync::Arc::as_ptr(h).cast::<()>();
                    if !seen.contains(&key) {
                        seen.push(key);
                        h.endpoint.fork_failed();
                    }
                }
            });
        },
        || (),
    );
}

extern "C" fn atfork_prepare() {
    table::fork_prepare();
    if foreign_process() {
        return;
    }
    let Some(backend) = crate::sdp::backend() else {
        return;
    };
    let Some(_g) = Guard::enter() else { return };
    protect(
        "fork (prepare)",
        || {
            if !table::no_sdp() {
                each_side_unguarded(|side| {
                    if let table::SdpSide::Stream(h) = side {
                        let in_use = h.in_use() || super::epoll::in_waited_set(h);
                        h.endpoint.fork_prepare(in_use);
                    }
                });
            }
            backend.fork_prepare();
        },
        || (),
    );
}

extern "C" fn atfork_parent() {
    if let (false, Some(backend), Some(_g)) =
        (foreign_process(), crate::sdp::backend(), Guard::enter())
    {
        protect(
            "fork (parent)",
            || {
                if !table::no_sdp() {
                    each_side_unguarded(|side| match side {
                        table::SdpSide::None => {}
                        table::SdpSide::Stream(h) => h.endpoint.fork_parent(),
                        table::SdpSide::Listener(h) => h.listener.fork_parent(),
                    });
                }
                backend.fork_parent();
            },
            || (),
        );
    }
    table::fork_done();
}

extern "C" fn atfork_child() {
    note_pid();
    // The only thread: the gate may open before the fix-ups.
    table::fork_done();
    let Some(_g) = Guard::enter() else {
        return;
    };
    protect(
        "fork (child)",
        || {
            crate::stat::fork_child();
            if let Some(backend) = crate::sdp::backend() {
                backend.fork_child();
            }
            each_side_unguarded(|side| match side {
                table::SdpSide::None => {}
                table::SdpSide::Stream(h) => h.endpoint.fork_child(),
                table::SdpSide::Listener(h) => h.listener.fork_child(),
            });
        },
        || (),
    );
}

#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = {
    extern "C" fn constructor() {
        init();
    }
    constructor
};

/// `fork`: the fd table and state export are fixed up by the `pthread_atfork`
/// handlers the library registers at start, which also run for forks the C
/// library makes itself (`daemon`).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fork() -> pid_t {
    // SAFETY: fork has no arguments; the handlers do the rest.
    let pid = unsafe { real::fork() };
    if pid < 0 {
        let _errno = SavedErrno::save();
        fork_failed();
    }
    pid
}
