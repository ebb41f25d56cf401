//! The condition variable the stream's other waiters sleep on: a counter
//! and a futex. Unlike `std`'s, whose wait sleeps on through signals, its
//! wait ends when a signal handler ran (`EINTR`, or with `SA_RESTART` the
//! kernel restarts it), so a program's second thread blocked on a socket
//! is interrupted as it would be over TCP.

use std::io;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use rustix::event::Timespec;
use rustix::io::Errno;
use rustix::thread::futex;

#[derive(Debug, Default)]
pub(super) struct Bell {
    /// How often it rang; a waiter sleeps while it stays what it read.
    rung: AtomicU32,
}

impl Bell {
    /// The count to wait past, read under the stream's lock before the
    /// waiter lets it go: a ring after any change it could not see yet
    /// ends the wait.
    pub fn seen(&self) -> u32 {
        self.rung.load(Ordering::Acquire)
    }

    /// Wakes every waiter.
    pub fn ring(&self) {
        self.rung.fetch_add(1, Ordering::Release);
        let _ = futex::wake(&self.rung, futex::Flags::PRIVATE, i32::MAX as u32);
    }

    /// Sleeps until a ring after `seen`, `timeout` or a signal handler
    /// (`Interrupted`). It may also end early: the waiter looks again.
    pub fn wait(&self, seen: u32, timeout: Option<Duration>) -> io::Result<()> {
        let ts = timeout.map(|t| Timespec {
            tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(t.subsec_nanos()),
        });
        match futex::wait(&self.rung, futex::Flags::PRIVATE, seen, ts.as_ref()) {
            Ok(()) | Err(Errno::AGAIN | Errno::TIMEDOUT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}
