//! Signals held back while a blocking call is on its way to its sleep.

/// Every signal blocked on the calling thread until this drops, the
/// program's own mask kept for the sleep (`ppoll`). The kernel checks for
/// a signal before a system call sleeps, so a handler that runs once the
/// call began ends the call (`EINTR`); a library call does work of its
/// own before it sleeps, and a handler that ran then (setting the flag
/// the program's loop checks before it calls again) would leave the call
/// asleep for good. Held from the start of the call, such a signal waits,
/// and the sleep with the program's mask ends at once with `EINTR`.
pub struct SignalsHeld(libc::sigset_t);

/// Blocks every signal on the calling thread; returns the mask before.
pub fn block_all() -> libc::sigset_t {
    // SAFETY: local sets filled before use; only this thread's mask
    // changes.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut before);
        before
    }
}

impl SignalsHeld {
    pub fn hold() -> SignalsHeld {
        SignalsHeld(block_all())
    }

    /// The program's mask, for the sleep.
    pub fn program_mask(&self) -> &libc::sigset_t {
        &self.0
    }
}

impl Drop for SignalsHeld {
    fn drop(&mut self) {
        // SAFETY: this thread's mask back as the program had it; a signal
        // that came meanwhile is delivered now.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}
