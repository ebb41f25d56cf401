//! The backend's service thread, one per process: it carries nonblocking
//! connects (`connect`'s `Connector`) and the setup of connections
//! arriving at hidden listeners (`listener`'s `Handshake`) on, takes new
//! connections from the hidden listeners this process watches, watches
//! the connections it let go of after a fork for the last other holder's
//! end (`owner`'s `Orphan`), and publishes the SDP connections'
//! statistics to the state export every `SDP_STAT_INTERVAL_MS` (default
//! 200; `0`: never): the data calls only count, in place.
//!
//! It sleeps in `poll(2)` on the fds its tasks wait for; its work runs
//! inside the fd table's fork gate, so a fork never finds it holding a
//! lock. A child of `fork` starts its own thread on first use; the tasks
//! of the parent's thread stay the parent's (their descriptors are left
//! open in the child until it execs or exits).
//!
//! The tasks are [`Task`] trait objects: each is defined beside the code
//! it carries on, and this module knows none of them.

use crate::sys::real;
use crate::table::{self, SdpSide};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// What a task waits for: until `fd` polls one of `events` (`fd` -1:
/// until the thread is woken, [`wake`]), or until the deadline.
pub type Wait = (RawFd, i16, Option<Instant>);

/// Work for the service thread: a state machine it steps each time what
/// the task waits for is there.
pub trait Task: Send {
    /// One step at `now` (inside the fork gate); tasks it starts go to
    /// `spawned`. `Some` to keep the task, with what it waits for next;
    /// `None` once it ended.
    fn advance(
        self: Box<Self>,
        now: Instant,
        spawned: &mut Vec<Box<dyn Task>>,
    ) -> Option<(Box<dyn Task>, Wait)>;

    /// The task ended elsewhere (another thread did its work): it goes
    /// at the next wake of the service thread ([`wake`]), whatever it
    /// waits for.
    fn ended(&self) -> bool {
        false
    }

    /// The service thread cannot start: the task is dropped unstepped.
    fn dropped(self: Box<Self>) {}
}

struct Service {
    wake: OwnedFd,
    queue: Mutex<Vec<Box<dyn Task>>>,
}

const GENERATIONS: usize = 256;
static GENERATION: AtomicUsize = AtomicUsize::new(0);
static SERVICES: [OnceLock<Option<&'static Service>>; GENERATIONS] =
    [const { OnceLock::new() }; GENERATIONS];

fn service() -> Option<&'static Service> {
    let slot = SERVICES.get(GENERATION.load(Ordering::Acquire))?;
    *slot.get_or_init(|| {
        // SAFETY: plain eventfd creation.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return None;
        }
        let s: &'static Service = Box::leak(Box::new(Service {
            // SAFETY: a fresh descriptor of ours.
            wake: unsafe { OwnedFd::from_raw_fd(fd) },
            queue: Mutex::new(Vec::new()),
        }));
        std::thread::Builder::new()
            .name("sdp-service".into())
            .spawn(move || s.run())
            .ok()?;
        Some(s)
    })
}

/// Starts the thread if it does not run yet (statistics publishing).
pub fn ensure() {
    let _ = service();
}

/// Wakes the service thread: tasks that wait on no descriptor (-1) step.
pub fn wake() {
    let Some(Some(s)) = SERVICES
        .get(GENERATION.load(Ordering::Acquire))
        .and_then(OnceLock::get)
    else {
        return;
    };
    let one: u64 = 1;
    // SAFETY: an 8-byte eventfd write from a local.
    unsafe { real::write(s.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// Hands `task` to the service thread.
pub fn submit(task: Box<dyn Task>) {
    let Some(s) = service() else {
        crate::log!(
            crate::log::Level::Error,
            "the SDP service thread cannot start; a connection setup is dropped"
        );
        task.dropped();
        return;
    };
    {
        let _g = table::enter_gate();
        s.queue.lock().unwrap_or_else(|p| p.into_inner()).push(task);
    }
    let one: u64 = 1;
    // SAFETY: an 8-byte eventfd write from a local.
    unsafe { real::write(s.wake.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

/// In the child after `fork`: the next use starts this process's thread.
pub fn fork_child() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

fn stat_interval() -> Option<Duration> {
    static I: OnceLock<Option<Duration>> = OnceLock::new();
    *I.get_or_init(|| {
        let ms = std::env::var("SDP_STAT_INTERVAL_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(200u64);
        (ms > 0).then(|| Duration::from_millis(ms))
    })
}

/// Publishes the statistics of every SDP connection this process drives
/// (not of a copy another process goes on with after a fork: in a child,
/// the lock of a connection the parent kept may be held for good, and
/// this thread, waiting for it, would leave every task stranded).
fn publish_all() {
    if table::no_sdp() {
        return;
    }
    crate::stat::publish_counts();
    table::for_each(|fd, e| {
        if let SdpSide::Stream(h) = &e.sdp {
            if let Some(stats) = h.endpoint.stats() {
                table::publish_stats(fd, &stats);
            }
        }
    });
}

struct Slot {
    task: Box<dyn Task>,
    /// What it waits for; `None`: step at once.
    wait: Option<Wait>,
}

impl Service {
    fn run(&'static self) {
        crate::sys::guard::library_thread();
        let mut slots: Vec<Slot> = Vec::new();
        let interval = stat_interval();
        let mut next_stats = interval.map(|i| Instant::now() + i);
        loop {
            let mut pfds = Vec::with_capacity(slots.len() + 1);
            pfds.push(libc::pollfd {
                fd: self.wake.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            });
            let mut deadline = next_stats;
            let mut now_please = false;
            for s in &slots {
                match s.wait {
                    Some((fd, events, d)) => {
                        pfds.push(libc::pollfd {
                            fd,
                            events,
                            revents: 0,
                        });
                        if let Some(d) = d {
                            deadline = Some(deadline.map_or(d, |x| x.min(d)));
                        }
                    }
                    None => {
                        now_please = true;
                        pfds.push(libc::pollfd {
                            fd: -1,
                            events: 0,
                            revents: 0,
                        });
                    }
                }
            }
            let timeout = if now_please {
                0
            } else {
                deadline.map_or(-1, |d| {
                    let left = d.saturating_duration_since(Instant::now());
                    (left.as_micros().div_ceil(1000)).min(60_000) as i32
                })
            };
            // SAFETY: our own pollfd vector.
            unsafe { real::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout) };
            let now = Instant::now();
            let _g = table::enter_gate();
            let woken = pfds[0].revents != 0;
            if woken {
                let mut v: u64 = 0;
                // SAFETY: an 8-byte eventfd read into a local.
                unsafe { real::read(self.wake.as_raw_fd(), (&mut v as *mut u64).cast(), 8) };
            }
            let due: Vec<bool> = slots
                .iter()
                .zip(&pfds[1..])
                .map(|(s, p)| match s.wait {
                    None => true,
                    Some(_) if woken && s.task.ended() => true,
                    Some((fd, _, d)) => {
                        p.revents != 0 || (fd < 0 && woken) || d.is_some_and(|d| now >= d)
                    }
                })
                .collect();
            let mut spawned = Vec::new();
            let mut kept = Vec::with_capacity(slots.len());
            for (s, due) in slots.drain(..).zip(due) {
                if !due {
                    kept.push(s);
                    continue;
                }
                if let Some((task, w)) = s.task.advance(now, &mut spawned) {
                    kept.push(Slot {
                        task,
                        wait: Some(w),
                    });
                }
            }
            slots = kept;
            let fresh: Vec<Box<dyn Task>> =
                std::mem::take(&mut *self.queue.lock().unwrap_or_else(|p| p.into_inner()));
            slots.extend(
                fresh
                    .into_iter()
                    .chain(spawned)
                    .map(|task| Slot { task, wait: None }),
            );
            if let (Some(at), Some(i)) = (next_stats, interval) {
                if now >= at {
                    publish_all();
                    next_stats = Some(now + i);
                }
            }
        }
    }
}
