//! Whether the calling thread is inside the preload, the library's own
//! threads, and the process the library's memory belongs to.
//!
//! A thread-local guard marks "inside the preload": any C call the preload
//! makes itself (reading the rules file, logging, `getsockname` for the
//! state export) goes straight to the C library.

use std::cell::Cell;
use std::sync::atomic::{AtomicI32, Ordering};

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Proof that this thread is inside the preload; dropping it leaves.
pub struct Guard(());

impl Guard {
    /// Enters the preload, or `None` if this thread already is inside (the
    /// call then goes straight to the C library).
    #[inline]
    pub fn enter() -> Option<Guard> {
        INSIDE
            .try_with(|inside| {
                if inside.get() {
                    None
                } else {
                    inside.set(true);
                    Some(Guard(()))
                }
            })
            .ok()
            .flatten()
    }
}

/// Whether this thread is inside the preload: one of its own threads, or
/// a program's thread in a hook. A socket call made from there is the
/// library's own and goes straight to the C library: the engine's
/// `getsockopt(TCP_MAXSEG)` on a stream's socket, made while it holds the
/// stream's lock, must not wait at the fork gate for a `fork` that waits
/// for that lock.
#[inline]
pub fn inside() -> bool {
    INSIDE.try_with(Cell::get).unwrap_or(true)
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = INSIDE.try_with(|inside| inside.set(false));
    }
}

impl Guard {
    /// [`Guard::enter`] for the hooks that change the fd table (`close`,
    /// `dup*`): `None` in the child of a `vfork` (or of a `clone` sharing
    /// our memory, as `posix_spawn` makes), which runs on the parent's
    /// memory until it execs. Such a child closing or duplicating fds
    /// (Python's `subprocess` does) must not touch the parent's table.
    pub fn enter_lifecycle() -> Option<Guard> {
        // Inside already (the library's own `close` of a descriptor it
        // made): straight to the C library, without the `getpid`.
        if INSIDE.try_with(Cell::get).unwrap_or(true) || foreign_process() {
            return None;
        }
        Guard::enter()
    }
}

/// Marks the calling thread as the preload's own for its whole life (the
/// SDP engine's progress and service threads): its C calls go straight to
/// the C library — its `close` of a connection's socket must not wait at
/// the fork gate, which a `fork` holds closed while it waits for this
/// thread — and every signal is blocked on it, so that a signal for the
/// process goes to a thread of the program, whose blocking call it
/// interrupts (`EINTR`) as it would without the library.
pub fn library_thread() {
    let _ = INSIDE.try_with(|inside| inside.set(true));
    super::signals::block_all();
}

/// This process's id, as the library last saw it (start, fork child).
static PID: AtomicI32 = AtomicI32::new(0);

/// Notes this process's id (at library start and in the child of each
/// `fork`).
pub fn note_pid() {
    // SAFETY: getpid has no preconditions.
    PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
}

/// This process's id as the library last noted it (at start and in the
/// child of each `fork`).
pub fn pid() -> i32 {
    PID.load(Ordering::Relaxed)
}

/// True when running in a process other than the one the library's
/// memory belongs to (a `vfork` child before its `exec`).
pub fn foreign_process() -> bool {
    let p = PID.load(Ordering::Relaxed);
    // SAFETY: getpid has no preconditions.
    p != 0 && p != unsafe { libc::getpid() }
}
