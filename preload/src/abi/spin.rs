//! Polling before a sleep in the program's readiness waits (DESIGN §7
//! "Latency"): `epoll_wait` on a set with SDP connections, and `poll` and
//! `select` waiting for an SDP connection's input. The kernel's set is
//! looked at without sleeping for this thread's budget
//! ([`BusyPoll`], `SDP_BUSY_POLL_US`; an event loop is one thread), then
//! the call sleeps as before; the budget adapts to how long the call
//! waited in all.

use libc::{c_int, timespec};
use sdp_core::stream::busy_poll::{poll_until, BusyPoll};
use std::time::{Duration, Instant};

thread_local! {
    /// How long this thread's waits on SDP streams poll before they
    /// sleep (`SDP_BUSY_POLL_US`).
    static BUSY_POLL: std::cell::Cell<Option<BusyPoll>> = const { std::cell::Cell::new(None) };
}

/// The busy polling of one wait ([`BusyPoll`]): the kernel's set
/// looked at without sleeping for this thread's budget, then the sleep;
/// the budget adapts to how long the call waited in all.
pub(super) struct Spin {
    max_us: u32,
    budget: Duration,
    started: Instant,
    /// The events came while polling.
    polled: bool,
}

impl Spin {
    /// A wait on SDP streams (`ours`) that may sleep (its timeout not
    /// `expired`) polls.
    pub(super) fn begin(ours: bool, expired: bool) -> Spin {
        let max_us = if ours && !expired {
            crate::backend::sdp_config().busy_poll_us
        } else {
            0
        };
        let budget = match max_us {
            0 => Duration::ZERO,
            _ => BUSY_POLL
                .try_with(|b| b.get().unwrap_or_else(|| BusyPoll::new(max_us)).budget())
                .unwrap_or_default(),
        };
        Spin {
            max_us,
            budget,
            started: Instant::now(),
            polled: false,
        }
    }

    /// The last [`Spin::wait`] ended while polling.
    pub(super) fn polled(&self) -> bool {
        self.polled
    }

    /// `wait` for what is left of the timeout (`remaining`), polling
    /// first while the budget lasts.
    pub(super) fn wait(
        &mut self,
        wait: &impl Fn(Option<timespec>) -> c_int,
        mut remaining: impl FnMut() -> Option<timespec>,
    ) -> c_int {
        if !self.budget.is_zero() {
            let limit = remaining().map_or(self.budget, |t| {
                self.budget
                    .min(Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
            });
            let now = timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            if let Some(n) = poll_until(self.started, limit, || {
                Some(wait(Some(now))).filter(|&n| n != 0)
            }) {
                self.polled = true;
                return n;
            }
        }
        self.polled = false;
        wait(remaining())
    }
}

impl Drop for Spin {
    fn drop(&mut self) {
        if self.max_us > 0 {
            let _ = BUSY_POLL.try_with(|b| {
                let mut p = b.get().unwrap_or_else(|| BusyPoll::new(self.max_us));
                p.ended(self.started.elapsed(), self.polled, self.max_us);
                b.set(Some(p));
            });
        }
    }
}
