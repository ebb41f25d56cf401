//! How long a reader that would sleep polls its socket first (DESIGN §7
//! "Latency"): a blocking read, a blocking connect waiting for the
//! setup's answers, and (in the preload) an `epoll_wait` on a set with SDP
//! connections.
//!
//! A thread woken from `poll(2)` costs both ends a context switch and, on
//! another core, an inter-processor interrupt: on a virtual machine that
//! is most of a small message's round trip. A reader whose answers come
//! quickly looks at its socket without sleeping for a while first, as
//! Linux's `busy_read`, rsocket's `polling_time` and libvma's receive
//! polling do. The budget adapts per stream: a wait that ended within the
//! configured time (`Config::busy_poll_us`) earns the whole of it for the
//! next one; a longer wait (an idle peer, a slow answer that polling would
//! not have caught) halves it, so a reader that waits long polls for
//! about twice the budget in all and then sleeps at once, until answers
//! come quickly again.

use std::time::{Duration, Instant};

/// Calls `look` (a wait with a zero timeout) until it finds something or
/// `limit` from `started` has passed, giving the core away between looks:
/// the polling of the stream's waits and of the preload's `epoll_wait`.
/// `None` once the time is up.
pub fn poll_until<T>(
    started: Instant,
    limit: Duration,
    mut look: impl FnMut() -> Option<T>,
) -> Option<T> {
    while started.elapsed() < limit {
        if let Some(r) = look() {
            return Some(r);
        }
        std::thread::yield_now();
    }
    None
}

/// The adapted polling time of one stream's reader, and how its waits
/// ended (counts that stop at `u32::MAX`: 16 bytes a stream, which an
/// idle connection's memory has room for).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BusyPoll {
    /// Microseconds to poll before the next sleep.
    us: u32,
    /// The last read took a Private Buffer's worth or more (a bulk
    /// transfer): the next wait sleeps at once.
    pub bulk: bool,
    /// Waits that ended while polling.
    pub polled: u32,
    /// Waits that went to sleep.
    pub slept: u32,
}

impl BusyPoll {
    /// A stream's first wait polls for the whole of `max_us`.
    pub fn new(max_us: u32) -> BusyPoll {
        BusyPoll {
            us: max_us,
            ..BusyPoll::default()
        }
    }

    /// A wait that did not poll went to sleep.
    pub fn slept(&mut self) {
        self.slept = self.slept.saturating_add(1);
    }

    /// How long the next wait polls before it sleeps.
    pub fn budget(self) -> Duration {
        Duration::from_micros(u64::from(self.us))
    }

    /// A wait ended after `waited` (polling and sleep together), while
    /// `polling` or after a sleep.
    pub fn ended(&mut self, waited: Duration, polling: bool, max_us: u32) {
        if polling {
            self.polled = self.polled.saturating_add(1);
        } else {
            self.slept();
        }
        self.us = if waited <= Duration::from_micros(u64::from(max_us)) {
            max_us
        } else {
            self.us / 2
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: fn(u64) -> Duration = Duration::from_micros;

    #[test]
    fn quick_answers_keep_the_whole_budget() {
        let mut b = BusyPoll::new(50);
        assert_eq!(b.budget(), US(50));
        b.ended(US(7), true, 50);
        assert_eq!(b.budget(), US(50));
        b.ended(US(50), false, 50);
        assert_eq!(b.budget(), US(50));
        assert_eq!((b.polled, b.slept), (1, 1));
    }

    #[test]
    fn long_waits_halve_it_to_nothing_and_a_quick_one_restores_it() {
        let mut b = BusyPoll::new(50);
        let mut polled = Duration::ZERO;
        let mut waits = 0;
        while !b.budget().is_zero() {
            polled += b.budget();
            b.ended(Duration::from_secs(1), false, 50);
            waits += 1;
        }
        // 50 + 25 + 12 + 6 + 3 + 1 µs over six long waits, then none.
        assert_eq!((waits, polled), (6, US(97)));
        b.ended(Duration::from_secs(1), false, 50);
        assert_eq!(b.budget(), Duration::ZERO);
        // A wait that slept and still ended within the budget: polling
        // would have caught it.
        b.ended(US(30), false, 50);
        assert_eq!(b.budget(), US(50));
    }

    #[test]
    fn nothing_configured_never_polls() {
        let mut b = BusyPoll::new(0);
        assert_eq!(b.budget(), Duration::ZERO);
        b.ended(Duration::ZERO, false, 0);
        assert_eq!(b.budget(), Duration::ZERO);
        b.ended(US(5), false, 0);
        assert_eq!(b.budget(), Duration::ZERO);
    }
}
