//! The progress thread (DESIGN §6 "Progress without the application"): one
//! per process, started with the first stream. It waits in `epoll` on every
//! registered link's socket (edge-triggered, readable and writable) and on
//! the links' timers, and pumps a link when its socket has news or a timer
//! is due: queued bytes are written as soon as the socket takes them,
//! incoming messages (data, credit updates) are placed into the Private
//! Buffers, closes finish after the application dropped the stream.
//!
//! It keeps off a link whose application thread is polling the socket
//! itself (see [`super::shared`]), and drops a link once the application
//! released it and its teardown was carried out.
//!
//! **Parking.** Every message arriving on a socket would wake this thread
//! as well as the application thread sleeping in `poll` on it — a second
//! wake-up per message on the latency path. So when an event finds the
//! link's poller active, the link is *parked*: its interest is cleared
//! (`EPOLL_CTL_MOD`, on this thread, off the critical path) and set again
//! [`PARK`] later. Setting it again reports the socket at once if it is
//! ready then, so nothing is missed; the price is that progress for an
//! application that stops polling comes at most [`PARK`] late.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use rustix::buffer::spare_capacity;
use rustix::event::epoll::{self, CreateFlags, EventData, EventFlags};
use rustix::event::{eventfd, EventfdFlags, Timespec};

use super::shared::Shared;

/// How long a link whose application thread polls its socket is left out
/// of the epoll set (see Parking above).
pub const PARK: Duration = Duration::from_millis(1);

const INTEREST: EventFlags = EventFlags::IN
    .union(EventFlags::OUT)
    .union(EventFlags::RDHUP)
    .union(EventFlags::ET);

/// Epoll key of the thread's own wake-up eventfd.
const WAKE_KEY: u64 = u64::MAX;

struct Thread {
    epoll: OwnedFd,
    wake: OwnedFd,
    links: Mutex<HashMap<u64, Arc<Shared>>>,
    next_id: AtomicU64,
}

fn thread() -> io::Result<&'static Thread> {
    static THREAD: OnceLock<io::Result<&'static Thread>> = OnceLock::new();
    THREAD
        .get_or_init(|| {
            let epoll = epoll::create(CreateFlags::CLOEXEC)?;
            let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
            epoll::add(
                &epoll,
                &wake,
                EventData::new_u64(WAKE_KEY),
                EventFlags::IN | EventFlags::ET,
            )?;
            let t: &'static Thread = Box::leak(Box::new(Thread {
                epoll,
                wake,
                links: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
            }));
            std::thread::Builder::new()
                .name("sdp-progress".into())
                .spawn(move || t.run())?;
            Ok(t)
        })
        .as_ref()
        .map(|t| *t)
        .map_err(|e| io::Error::new(e.kind(), e.to_string()))
}

/// A fresh key for [`Shared::id`].
pub fn next_id() -> u64 {
    static FALLBACK: AtomicU64 = AtomicU64::new(1 << 62);
    match thread() {
        Ok(t) => t.next_id.fetch_add(1, Ordering::Relaxed),
        Err(_) => FALLBACK.fetch_add(1, Ordering::Relaxed),
    }
}

/// Hands a link to the progress thread.
pub fn register(shared: Arc<Shared>) -> io::Result<()> {
    let t = thread()?;
    // In the table first: the first (edge) event may come at once.
    lock(&t.links).insert(shared.id, shared.clone());
    let r = epoll::add(
        &t.epoll,
        shared.sock(),
        EventData::new_u64(shared.id),
        INTEREST,
    );
    if let Err(e) = r {
        lock(&t.links).remove(&shared.id);
        return Err(e.into());
    }
    wake();
    Ok(())
}

/// Takes a link back (it is finished, or was never set up).
pub fn deregister(id: u64) {
    let Ok(t) = thread() else {
        return;
    };
    if let Some(shared) = lock(&t.links).remove(&id) {
        let _ = epoll::delete(&t.epoll, shared.sock());
    }
}

/// Makes the thread recompute its timeout (a link's deadline moved
/// earlier).
pub fn wake() {
    if let Ok(t) = thread() {
        let _ = rustix::io::write(&t.wake, &1u64.to_ne_bytes());
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Thread {
    fn run(&self) {
        let mut events = Vec::with_capacity(256);
        let mut due: Vec<Arc<Shared>> = Vec::new();
        let mut parked: Vec<(Instant, Arc<Shared>)> = Vec::new();
        loop {
            let next = lock(&self.links)
                .values()
                .filter_map(|s| s.deadline())
                .chain(parked.first().map(|p| p.0))
                .min();
            let timeout = next.map(|t| {
                let d = t.saturating_duration_since(Instant::now());
                Timespec {
                    tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
                    tv_nsec: i64::from(d.subsec_nanos()),
                }
            });
            events.clear();
            if epoll::wait(&self.epoll, spare_capacity(&mut events), timeout.as_ref()).is_err() {
                continue;
            }
            let now = Instant::now();
            {
                let links = lock(&self.links);
                for ev in &events {
                    let key = ev.data.u64();
                    if key == WAKE_KEY {
                        let mut buf = [0u8; 8];
                        let _ = rustix::io::read(&self.wake, &mut buf);
                    } else if let Some(s) = links.get(&key) {
                        if s.polled() {
                            // Its application thread reads the socket.
                            let data = EventData::new_u64(s.id);
                            let _ = epoll::modify(&self.epoll, s.sock(), data, EventFlags::ET);
                            parked.push((now + PARK, s.clone()));
                        } else {
                            due.push(s.clone());
                        }
                    }
                }
                for s in links.values() {
                    if s.deadline().is_some_and(|d| d <= now) {
                        due.push(s.clone());
                    }
                }
                // Parked links come back: an event follows at once if their
                // socket is ready.
                let back = parked.iter().take_while(|p| p.0 <= now).count();
                for (_, s) in parked.drain(..back) {
                    if links.contains_key(&s.id) {
                        let data = EventData::new_u64(s.id);
                        let _ = epoll::modify(&self.epoll, s.sock(), data, INTEREST);
                    }
                }
            }
            for s in due.drain(..) {
                if s.service(now) {
                    self.remove(&s);
                }
            }
        }
    }

    fn remove(&self, s: &Shared) {
        if lock(&self.links).remove(&s.id).is_some() {
            let _ = epoll::delete(&self.epoll, s.sock());
        }
    }
}
