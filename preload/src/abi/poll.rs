//! Readiness hooks: `poll`, `ppoll`, `select`, `pselect`, `__poll_chk`,
//! `__ppoll_chk` (`epoll` has a module of its own).
//!
//! While no fd is SDP every call goes to the C library unchanged. When a
//! set holds SDP fds, `poll`/`select` report their readiness from the
//! endpoint ([`crate::sdp::Readiness`], exact as DESIGN §6 asks) and sleep
//! in the kernel on the endpoint's wake fds beside the program's other fds,
//! re-checking after every wake-up so a wake fd's stale level never shows
//! as readiness.
#![allow(clippy::missing_safety_doc)]

use super::protect;
use super::spin::Spin;
use crate::sdp::Readiness;
use crate::sys::errno::{fail, keep_errno_on_success};
use crate::sys::guard::Guard;
use crate::sys::real;
use crate::table::{self, ListenerHandle, SdpSide, StreamHandle};
use libc::{c_int, fd_set, nfds_t, pollfd, sigset_t, size_t, timespec, timeval};
use smallvec::SmallVec;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The SDP side of an fd in a readiness set.
#[derive(Clone)]
pub(super) enum Side {
    Stream(Arc<StreamHandle>),
    Listener(Arc<ListenerHandle>),
}

impl Side {
    pub(super) fn of(fd: c_int) -> Option<Side> {
        match table::side(fd) {
            SdpSide::None => None,
            SdpSide::Stream(h) => Some(Side::Stream(h)),
            SdpSide::Listener(h) => Some(Side::Listener(h)),
        }
    }

    pub(super) fn readiness(&self) -> Readiness {
        match self {
            Side::Stream(h) => h.endpoint.readiness(),
            Side::Listener(h) => h.listener.readiness(),
        }
    }

    /// [`Side::readiness`], a listener's without its queue (the caller
    /// polls [`crate::sdp::SdpListener::queue_fd`] itself).
    fn readiness_beside_queue(&self) -> Readiness {
        match self {
            Side::Stream(h) => h.endpoint.readiness(),
            Side::Listener(h) => h.listener.readiness_beside_queue(),
        }
    }

    pub(super) fn wake_fd(&self) -> crate::sdp::WakeFd {
        match self {
            Side::Stream(h) => h.endpoint.wake_fd(),
            Side::Listener(h) => h.listener.wake_fd(),
        }
    }
}

/// Room on the stack for a readiness call's set: the sets programs pass
/// are small, and a call per message must not allocate (a larger set
/// spills to the heap).
type Few<T> = SmallVec<[T; 8]>;

/// A call's time limit. The clock starts when the call first sleeps: a
/// call that finds something ready never reads it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timeout {
    limit: Option<Duration>,
    start: Option<Instant>,
}

impl Timeout {
    /// `poll`'s milliseconds (negative: no limit).
    pub(super) fn ms(timeout: c_int) -> Timeout {
        Timeout {
            limit: (timeout >= 0).then(|| Duration::from_millis(timeout as u64)),
            start: None,
        }
    }

    /// A `timespec` limit (null: none).
    pub(super) fn ts(ts: *const timespec) -> Timeout {
        let limit = (!ts.is_null()).then(|| {
            // SAFETY: the program's timespec, not null.
            let t = unsafe { *ts };
            Duration::new(
                t.tv_sec.max(0) as u64,
                t.tv_nsec.clamp(0, 999_999_999) as u32,
            )
        });
        Timeout { limit, start: None }
    }

    /// A `timeval` limit (null: none).
    fn tv(tv: *const timeval) -> Timeout {
        let limit = (!tv.is_null()).then(|| {
            // SAFETY: the program's timeval, not null.
            let t = unsafe { *tv };
            Duration::new(
                t.tv_sec.max(0) as u64,
                (t.tv_usec.clamp(0, 999_999) * 1000) as u32,
            )
        });
        Timeout { limit, start: None }
    }

    /// The time not used up yet (`None`: no limit).
    fn left(&self) -> Option<Duration> {
        let limit = self.limit?;
        Some(match self.start {
            Some(s) => limit.saturating_sub(s.elapsed()),
            None => limit,
        })
    }

    /// What is left, for a sleep in the kernel: the first one starts the
    /// clock.
    pub(super) fn remaining(&mut self) -> Option<timespec> {
        let limit = self.limit?;
        if self.start.is_none() && !limit.is_zero() {
            self.start = Some(Instant::now());
        }
        let left = self.left()?;
        Some(timespec {
            tv_sec: left.as_secs() as libc::time_t,
            tv_nsec: left.subsec_nanos() as libc::c_long,
        })
    }

    /// The limit passed.
    pub(super) fn expired(&self) -> bool {
        self.left().is_some_and(|l| l.is_zero())
    }
}

/// How a `poll` or `select` hears of its streams' arrivals.
///
/// It polls a connected stream's socket itself, and pumps the stream when
/// the socket has input ([`crate::sdp::SdpEndpoint::poll_socket`]): the
/// progress thread leaves arrivals to the program, so an arrival wakes
/// one thread, the one that reports it, not the progress thread and then
/// this one. A call that finds something ready still polls the sockets of
/// streams not ready for all it asks of them: the stream may have nothing
/// else reading them. For another stream, a call that sleeps takes
/// [`crate::sdp::SdpEndpoint::await_readiness`]: it sleeps on the wake fd
/// alone, and the progress thread reads meanwhile.
struct Marks<'a> {
    /// Streams whose sockets the call polls, with the socket.
    socks: Few<(&'a StreamHandle, c_int)>,
    /// Streams with [`crate::sdp::SdpEndpoint::await_readiness`] taken.
    awaiting: Few<&'a StreamHandle>,
    /// Streams whose socket the call polls beside the wake fd, with
    /// [`crate::sdp::SdpEndpoint::hold_wake`] taken: the wake fd tells
    /// what the socket does not (room made by the progress thread's
    /// writes, another thread's calls).
    holding: Few<&'a StreamHandle>,
    /// Whether the call is going to sleep (the await marks are taken).
    sleeps: bool,
}

impl<'a> Marks<'a> {
    fn new(streams: &'a [Arc<StreamHandle>]) -> Marks<'a> {
        let socks = streams
            .iter()
            .filter_map(|h| {
                if h.endpoint.zcopy_elsewhere() {
                    return None;
                }
                let fd = h.endpoint.kernel_fd()?;
                h.endpoint.poll_socket().then_some((&**h, fd))
            })
            .collect();
        Marks {
            socks,
            awaiting: Few::new(),
            holding: Few::new(),
            sleeps: false,
        }
    }

    /// Before the call's first sleep.
    fn sleep(&mut self, streams: &'a [Arc<StreamHandle>]) {
        if std::mem::replace(&mut self.sleeps, true) {
            return;
        }
        for h in streams {
            if !self.polls_socket(h) {
                self.awaits(h);
            } else {
                h.endpoint.hold_wake(true);
                self.holding.push(h);
            }
        }
    }

    fn polls_socket(&self, h: &StreamHandle) -> bool {
        self.socks.iter().any(|(s, _)| std::ptr::eq(*s, h))
    }

    fn awaits(&mut self, h: &'a StreamHandle) {
        if h.endpoint.await_readiness(true) {
            self.awaiting.push(h);
        }
    }

    /// The stream's socket had input and a pump moved nothing: the stream
    /// takes no input now (or another thread read it first), its socket
    /// may stay readable and polling it would spin. The call leaves it to
    /// the wake fd from now on.
    fn stuck(&mut self, h: &'a StreamHandle) {
        self.socks.retain(|(s, _)| !std::ptr::eq(*s, h));
        if self.sleeps {
            self.awaits(h);
        }
    }
}

impl Drop for Marks<'_> {
    fn drop(&mut self) {
        for h in &self.awaiting {
            h.endpoint.await_readiness(false);
        }
        for h in &self.holding {
            h.endpoint.hold_wake(false);
        }
    }
}

/// The directions `bits` ask for or report: `POLLIN` for input (with
/// `POLLRDNORM` and `POLLPRI`), `POLLOUT` for output (with `POLLWRNORM`).
fn directions(bits: i16) -> i16 {
    let mut d = 0;
    if bits & (libc::POLLIN | libc::POLLRDNORM | libc::POLLPRI) != 0 {
        d |= libc::POLLIN;
    }
    if bits & (libc::POLLOUT | libc::POLLWRNORM) != 0 {
        d |= libc::POLLOUT;
    }
    d
}

/// Does the set hold an SDP fd? (Only asked while some fd is SDP.)
fn any_sdp(fds: &[pollfd]) -> bool {
    fds.iter().any(|p| table::is_sdp(p.fd))
}

/// `poll` over a set with SDP fds. A listener's readiness joins the
/// kernel listener's own (pending TCP connections). A count leaves `errno`
/// as the program had it ([`keep_errno_on_success`]).
fn poll_sdp(fds: &mut [pollfd], timeout: &mut Timeout, mask: *const sigset_t) -> c_int {
    keep_errno_on_success(|| {
        // A panic in an endpoint fails the call (ENOMEM) instead of
        // unwinding.
        protect(
            "poll",
            || poll_sdp_inner(fds, timeout, mask),
            || fail(libc::ENOMEM),
        )
    })
}

fn poll_sdp_inner(fds: &mut [pollfd], timeout: &mut Timeout, mask: *const sigset_t) -> c_int {
    let mut sides: Few<Option<Side>> = fds.iter().map(|p| Side::of(p.fd)).collect();
    // Each connection polled is in use while we wait (a fork leaves it to
    // this process).
    let streams: Few<Arc<table::StreamHandle>> = sides
        .iter()
        .filter_map(|s| match s {
            Some(Side::Stream(h)) => Some(h.clone()),
            _ => None,
        })
        .collect();
    let _in_use: Few<table::Watch<'_>> = streams.iter().map(|h| h.watch()).collect();
    let mut marks = Marks::new(&streams);
    // A wait for input on connections whose reads are small polls before
    // it sleeps, as `epoll_wait` does (DESIGN §7 "Latency"): a program
    // with a socket timeout (Python's) polls before each read. Not a wait
    // for room (credit comes back at the reader's pace), nor a bulk
    // reader's: its poller would take the time the writer's side needs.
    let polls = !streams.is_empty()
        && fds.iter().zip(&sides).all(|(p, side)| match side {
            Some(Side::Stream(h)) => {
                directions(p.events) == libc::POLLIN && !h.endpoint.reads_in_bulk()
            }
            _ => true,
        });
    let mut spin = Spin::begin(polls, timeout.expired());
    let mut first = true;
    loop {
        if !std::mem::take(&mut first) {
            // Again after a sleep: a nonblocking connect that fell back to
            // TCP meanwhile is polled as the kernel socket it now is.
            sides = fds.iter().map(|p| Side::of(p.fd)).collect();
        }
        // Each program entry's SDP readiness bits before the sleep (a
        // listener's without its queue).
        let before: Few<i16> = fds
            .iter()
            .zip(&sides)
            .map(|(p, side)| {
                side.as_ref()
                    .map_or(0, |s| s.readiness_beside_queue().poll_bits(p.events))
            })
            .collect();
        // Ready already: the kernel's fds are looked at without a sleep,
        // and the readiness just taken is reported; the wake fds are not
        // needed, nor the sockets of streams ready for all that is asked.
        let sdp_ready = before.iter().any(|&b| b != 0);
        let zero = timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        let wait = if sdp_ready {
            Some(zero)
        } else {
            timeout.remaining()
        };
        let sleeps = wait.is_none_or(|t| t.tv_sec != 0 || t.tv_nsec != 0);
        if sleeps {
            marks.sleep(&streams);
        }
        let mut kfds: Few<pollfd> = Few::new();
        // For each program entry: its own kernel entry, if it has one; its
        // listener's queue entry, if it has one.
        let mut own: Few<Option<usize>> = Few::new();
        let mut queue: Few<Option<usize>> = Few::new();
        for (p, side) in fds.iter().zip(&sides) {
            let listener = matches!(side, Some(Side::Listener(_)));
            own.push((side.is_none() || listener).then(|| {
                kfds.push(pollfd {
                    fd: p.fd,
                    events: p.events,
                    revents: 0,
                });
                kfds.len() - 1
            }));
            let Some(s) = side else {
                queue.push(None);
                continue;
            };
            if !sdp_ready {
                // The wake fd's levels asked for: readable for input (the
                // end of the stream and errors show there too), writable
                // for output (a closed or failed connection too). Not a
                // level the call did not ask for: bytes the program leaves
                // unread, or room it does not want, would wake it again
                // and again. (A call that asks for neither hears of errors
                // and hang-ups from the stream's socket.)
                let mut events = directions(p.events);
                if let Side::Listener(_) = s {
                    events |= libc::POLLIN;
                }
                kfds.push(pollfd {
                    fd: s.wake_fd(),
                    events,
                    revents: 0,
                });
            }
            // A listener's connections that no process took yet: the
            // `accept` this leads to takes one.
            let q = match (s, p.events & libc::POLLIN != 0) {
                (Side::Listener(h), true) => h.listener.queue_fd(),
                _ => None,
            };
            queue.push(q.map(|fd| {
                kfds.push(pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
                kfds.len() - 1
            }));
        }
        // The sockets this call polls: (stream, index). Without a sleep,
        // those of streams with something asked for and not ready yet:
        // what came in the socket may be it (input, or the credits a
        // send waits for).
        let wanting = |h: &StreamHandle| {
            fds.iter().zip(&sides).zip(&before).any(|((p, side), &b)| {
                matches!(side, Some(Side::Stream(x)) if std::ptr::eq(&**x, h))
                    && directions(p.events) & !directions(b) != 0
            })
        };
        let socks: Few<(&StreamHandle, usize)> = marks
            .socks
            .iter()
            .filter(|&&(h, _)| !sdp_ready || wanting(h))
            .map(|&(h, fd)| {
                kfds.push(pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
                (h, kfds.len() - 1)
            })
            .collect();
        let r = if kfds.is_empty() {
            // Only streams, one of them ready: nothing to ask the kernel.
            0
        } else {
            let (set, n) = (kfds.as_mut_ptr(), kfds.len() as nfds_t);
            let ppoll = |t: Option<timespec>| {
                let tp = t
                    .as_ref()
                    .map_or(std::ptr::null(), |t| t as *const timespec);
                // SAFETY: our own pollfd vector, a local timespec or null,
                // and the program's signal mask or null.
                unsafe { real::ppoll(set, n, tp, mask) }
            };
            if sleeps {
                spin.wait(&ppoll, || timeout.remaining())
            } else {
                ppoll(wait)
            }
        };
        if r < 0 {
            return -1;
        }
        if sleeps {
            // Each connection waited for shows how its waits ended
            // (sdp-stat's WAITS POLLED/SLEPT), as its blocking reads do.
            for (p, side) in fds.iter().zip(&sides) {
                if let (Some(Side::Stream(h)), true) = (side, p.events & libc::POLLIN != 0) {
                    h.endpoint.count_wait(spin.polled());
                }
            }
        }
        // Input on a polled socket: read it here, so the readiness below
        // shows what came.
        let mut pumped: Few<&StreamHandle> = Few::new();
        for &(h, k) in &socks {
            if kfds[k].revents == 0 {
                continue;
            }
            // The program calls on the stream next, which sets the wake
            // fd's levels then, or polls again, which reports from the
            // stream's state.
            if h.endpoint.pump_quietly().moved {
                pumped.push(h);
            } else {
                marks.stuck(h);
            }
        }
        let mut count = 0;
        for (i, (p, side)) in fds.iter_mut().zip(&sides).enumerate() {
            let kernel = own[i].map_or(0, |k| kfds[k].revents);
            let queued = queue[i].is_some_and(|k| kfds[k].revents & libc::POLLIN != 0);
            let fresh = match side {
                Some(Side::Stream(h)) => pumped.iter().any(|&x| std::ptr::eq(x, &**h)),
                _ => false,
            };
            let sdp = match side {
                None => 0,
                Some(_) if sdp_ready && !fresh => before[i],
                Some(s) => s.readiness_beside_queue().poll_bits(p.events),
            };
            let queued = if queued {
                Readiness {
                    readable: true,
                    ..Readiness::default()
                }
                .poll_bits(p.events)
            } else {
                0
            };
            p.revents = kernel | sdp | queued;
            if p.revents != 0 {
                count += 1;
            }
        }
        if count > 0 || !sleeps {
            return count;
        }
    }
}

/// The program's pollfd array, if it holds SDP fds and we may handle it.
unsafe fn sdp_set<'a>(fds: *mut pollfd, n: nfds_t) -> Option<(&'a mut [pollfd], Guard)> {
    if table::no_sdp() || fds.is_null() {
        return None;
    }
    let g = Guard::enter()?;
    // SAFETY: the program's array of n pollfds.
    let set = unsafe { std::slice::from_raw_parts_mut(fds, n as usize) };
    any_sdp(set).then_some((set, g))
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the program's array.
    if let Some((set, _g)) = unsafe { sdp_set(fds, n) } {
        return poll_sdp(set, &mut Timeout::ms(timeout), std::ptr::null());
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::poll(fds, n, timeout) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __poll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    timeout: c_int,
    fdslen: size_t,
) -> c_int {
    if (n as usize) <= fdslen / std::mem::size_of::<pollfd>() {
        // SAFETY: the array holds n entries (checked).
        if let Some((set, _g)) = unsafe { sdp_set(fds, n) } {
            return poll_sdp(set, &mut Timeout::ms(timeout), std::ptr::null());
        }
    }
    // SAFETY: the program's arguments; the C library aborts on overflow.
    unsafe { real::__poll_chk(fds, n, timeout, fdslen) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ppoll(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: the program's array.
    if let Some((set, _g)) = unsafe { sdp_set(fds, n) } {
        return poll_sdp(set, &mut Timeout::ts(ts), mask);
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::ppoll(fds, n, ts, mask) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __ppoll_chk(
    fds: *mut pollfd,
    n: nfds_t,
    ts: *const timespec,
    mask: *const sigset_t,
    fdslen: size_t,
) -> c_int {
    if (n as usize) <= fdslen / std::mem::size_of::<pollfd>() {
        // SAFETY: the array holds n entries (checked).
        if let Some((set, _g)) = unsafe { sdp_set(fds, n) } {
            return poll_sdp(set, &mut Timeout::ts(ts), mask);
        }
    }
    // SAFETY: the program's arguments; the C library aborts on overflow.
    unsafe { real::__ppoll_chk(fds, n, ts, mask, fdslen) }
}

unsafe fn isset(set: *const fd_set, fd: c_int) -> bool {
    // SAFETY: the program's fd_set, fd < FD_SETSIZE (callers bound nfds).
    !set.is_null() && unsafe { libc::FD_ISSET(fd, set) }
}

/// `select` over sets holding SDP fds, through [`poll_sdp`]. `None`: no
/// SDP fd in the sets (or we may not handle them): the caller passes on.
unsafe fn select_sdp(
    nfds: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    timeout: &mut Timeout,
    mask: *const sigset_t,
) -> Option<c_int> {
    if table::no_sdp() {
        return None;
    }
    let nfds = nfds.clamp(0, libc::FD_SETSIZE as c_int);
    let _g = Guard::enter()?;
    // SAFETY: the program's sets, fd < nfds <= FD_SETSIZE.
    let events_of = |fd| unsafe {
        let mut events = 0;
        if isset(r, fd) {
            events |= libc::POLLIN;
        }
        if isset(w, fd) {
            events |= libc::POLLOUT;
        }
        if isset(e, fd) {
            events |= libc::POLLPRI;
        }
        events
    };
    // Without an SDP fd in the sets, the C library does it (no allocation).
    if !(0..nfds).any(|fd| events_of(fd) != 0 && table::is_sdp(fd)) {
        return None;
    }
    let mut set: Few<pollfd> = (0..nfds)
        .filter_map(|fd| {
            let events = events_of(fd);
            (events != 0).then_some(pollfd {
                fd,
                events,
                revents: 0,
            })
        })
        .collect();
    let n = poll_sdp(&mut set, timeout, mask);
    if n < 0 {
        return Some(-1);
    }
    if set.iter().any(|p| p.revents & libc::POLLNVAL != 0) {
        return Some(fail(libc::EBADF));
    }
    // SAFETY: the program's sets (each cleared, then the ready bits set).
    unsafe {
        for s in [r, w, e] {
            if !s.is_null() {
                libc::FD_ZERO(s);
            }
        }
    }
    let mut count = 0;
    for p in &set {
        let ev = p.revents;
        let marks = [
            (
                r,
                libc::POLLIN,
                ev & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0,
            ),
            (w, libc::POLLOUT, ev & (libc::POLLOUT | libc::POLLERR) != 0),
            (e, libc::POLLPRI, ev & libc::POLLPRI != 0),
        ];
        for (s, asked, ready) in marks {
            if p.events & asked != 0 && ready {
                // SAFETY: the program's set, fd < FD_SETSIZE.
                unsafe { libc::FD_SET(p.fd, s) };
                count += 1;
            }
        }
    }
    Some(count)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn select(
    nfds: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    tv: *mut timeval,
) -> c_int {
    let mut timeout = Timeout::tv(tv);
    // SAFETY: the program's sets.
    if let Some(n) = unsafe { select_sdp(nfds, r, w, e, &mut timeout, std::ptr::null()) } {
        if let Some(left) = timeout.left() {
            // Linux select leaves the time not slept in *tv.
            // SAFETY: the program's timeval (a limit came from it).
            unsafe {
                (*tv).tv_sec = left.as_secs() as libc::time_t;
                (*tv).tv_usec = left.subsec_micros() as libc::suseconds_t;
            }
        }
        return n;
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::select(nfds, r, w, e, tv) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn pselect(
    nfds: c_int,
    r: *mut fd_set,
    w: *mut fd_set,
    e: *mut fd_set,
    ts: *const timespec,
    mask: *const sigset_t,
) -> c_int {
    // SAFETY: the program's sets.
    if let Some(n) = unsafe { select_sdp(nfds, r, w, e, &mut Timeout::ts(ts), mask) } {
        return n;
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::pselect(nfds, r, w, e, ts, mask) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::*;

    fn pfd(fd: c_int, events: i16) -> pollfd {
        pollfd {
            fd,
            events,
            revents: 0,
        }
    }

    /// A poll whose own lock wait a signal interrupted returns what is
    /// ready with `errno` as the program left it: CPython's
    /// `select.poll.poll` and `select.select` take `EINTR` after the call
    /// as an interrupted call and poll again, which made a ready fd look
    /// like a timeout once the time was up.
    #[test]
    fn a_poll_returning_readiness_leaves_errno_as_the_program_had_it() {
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        ep.deliver(b"x");
        let mut set = [pfd(app, libc::POLLIN)];
        let (n, errno) = with_lock_wait_interrupted(&ep, || {
            real::set_errno(0);
            // SAFETY: a local array.
            let n = unsafe { poll(set.as_mut_ptr(), 1, 1000) };
            (n, real::errno())
        });
        assert_eq!((n, set[0].revents), (1, libc::POLLIN));
        assert_eq!(errno, 0, "errno after a poll that found the fd ready");
        uninstall(app);
    }

    #[test]
    fn poll_reports_endpoint_readiness_not_kernel_bytes() {
        let (app, peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        // Protocol bytes on the kernel socket are not application data.
        // SAFETY: writing to our own socket.
        assert_eq!(unsafe { libc::write(peer, b"xx".as_ptr().cast(), 2) }, 2);
        let mut set = [pfd(app, libc::POLLIN)];
        // SAFETY: a local array.
        assert_eq!(unsafe { poll(set.as_mut_ptr(), 1, 0) }, 0);
        assert_eq!(set[0].revents, 0);
        // Writable: the fake has room.
        let mut set = [pfd(app, libc::POLLIN | libc::POLLOUT)];
        // SAFETY: a local array.
        assert_eq!(unsafe { poll(set.as_mut_ptr(), 1, 0) }, 1);
        assert_eq!(set[0].revents, libc::POLLOUT);
        uninstall(app);
    }

    #[test]
    fn poll_sleeps_until_the_endpoint_has_data() {
        let (app, _peer) = socketpair();
        let (other, _other_peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        let feeder = {
            let ep = ep.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                ep.deliver(b"x");
            })
        };
        let mut set = [pfd(other, libc::POLLIN), pfd(app, libc::POLLIN)];
        // SAFETY: a local array.
        let n = unsafe { poll(set.as_mut_ptr(), 2, 5000) };
        feeder.join().unwrap();
        assert_eq!(n, 1);
        assert_eq!((set[0].revents, set[1].revents), (0, libc::POLLIN));
        uninstall(app);
    }

    #[test]
    fn select_marks_sdp_and_kernel_fds() {
        let (app, _peer) = socketpair();
        let (other, other_peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        ep.deliver(b"data");
        // SAFETY: writing to our own socket.
        let wrote = unsafe { libc::write(other_peer, b"k".as_ptr().cast(), 1) };
        assert_eq!(wrote, 1);
        // SAFETY: fd_sets on the stack, FD_* on them.
        unsafe {
            let mut r: fd_set = std::mem::zeroed();
            libc::FD_SET(app, &mut r);
            libc::FD_SET(other, &mut r);
            let mut tv = timeval {
                tv_sec: 1,
                tv_usec: 0,
            };
            let n = select(
                app.max(other) + 1,
                &mut r,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut tv,
            );
            assert_eq!(n, 2);
            assert!(libc::FD_ISSET(app, &r) && libc::FD_ISSET(other, &r));
        }
        ep.take_all();
        // SAFETY: as above.
        unsafe {
            let mut r: fd_set = std::mem::zeroed();
            libc::FD_SET(app, &mut r);
            let mut tv = timeval {
                tv_sec: 0,
                tv_usec: 10_000,
            };
            let n = select(
                app + 1,
                &mut r,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                &mut tv,
            );
            assert_eq!(n, 0);
            assert!(!libc::FD_ISSET(app, &r));
        }
        uninstall(app);
    }
}
