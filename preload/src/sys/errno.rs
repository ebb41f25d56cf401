//! `errno` around the preload's own calls, and the C convention of failing
//! a call.

use super::real;
use libc::c_int;

/// Keeps `errno` across calls the preload makes for itself.
pub struct SavedErrno(c_int);

impl SavedErrno {
    pub fn save() -> Self {
        SavedErrno(real::errno())
    }
}

impl Drop for SavedErrno {
    fn drop(&mut self) {
        real::set_errno(self.0);
    }
}

/// Runs the SDP side of a readiness wait (`epoll_wait`, `poll`, `select`
/// and their variants), which returns a count or -1: a count leaves
/// `errno` as the program had it before the call, -1 keeps the `errno` of
/// the failure.
///
/// Such a wait makes calls of its own: it takes locks (a lock wait that a
/// signal without `SA_RESTART` interrupts leaves `EINTR` in `errno`, though
/// the lock is then taken), pumps a stream (a socket read that found
/// nothing leaves `EAGAIN`). Programs look at `errno` after a successful
/// wait: CPython's `select.epoll.poll`, `select.poll.poll` and
/// `select.select` clear it, call, and take `errno == EINTR` as "the call
/// was interrupted" whatever it returned — they throw the events away and
/// wait again. An edge-triggered event thrown away never comes back, and
/// the connection stalls.
pub fn keep_errno_on_success(wait: impl FnOnce() -> c_int) -> c_int {
    let before = real::errno();
    let r = wait();
    if r >= 0 {
        real::set_errno(before);
    }
    r
}

/// Fails the current call with `errno` set: the C convention.
pub fn fail<T: From<i8>>(errno: c_int) -> T {
    real::set_errno(errno);
    T::from(-1)
}
