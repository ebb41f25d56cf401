//! `accept` and `accept4`: from the kernel listener, or from the hidden
//! SDP listener beside it, whichever has a connection first; the accepted
//! socket is recorded in the fd table with the listener's decision.
#![allow(clippy::missing_safety_doc)]

use super::protect;
use crate::log::Level;
use crate::sdp;
use crate::sys::addr::{int_sockopt, read_sockaddr, socket_name, write_sockaddr};
use crate::sys::errno::{fail, SavedErrno};
use crate::sys::guard::Guard;
use crate::sys::real;
use crate::sys::signals::SignalsHeld;
use crate::table::{self, DecidedBy, Entry, SdpSide, SocketRole, TcpReason, Transport};
use libc::{c_int, sockaddr, socklen_t};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Records a connection the kernel listener `listener` accepted as `fd`.
unsafe fn record_accepted(listener: c_int, fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) {
    let Some(l) = table::get(listener) else {
        return;
    };
    let _errno = SavedErrno::save();
    let peer = if addr.is_null() || len.is_null() {
        None
    } else {
        // SAFETY: the kernel just filled the program's (addr, *len).
        unsafe { read_sockaddr(addr, *len) }
    }
    .or_else(|| socket_name(fd, true));
    let local = match l.local {
        Some(a) if !a.ip().is_unspecified() => Some(a),
        _ => socket_name(fd, false),
    };
    let mut e = Entry::new(l.ipv6, l.forced);
    e.role = SocketRole::Accepted;
    e.want = l.want;
    e.decided_by = DecidedBy::Listener;
    e.rule = l.rule;
    e.transport = Transport::Tcp;
    e.reason = if l.transport == Transport::Sdp {
        TcpReason::PeerTcp
    } else {
        l.reason
    };
    e.local = local;
    e.peer = peer;
    table::insert(fd, e);
}

unsafe fn accept_common(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    // SAFETY: the program's arguments, passed on.
    let r = unsafe { real::accept4(fd, addr, len, flags) };
    if r < 0 || !table::is_managed(fd) {
        return r;
    }
    let Some(_g) = Guard::enter() else { return r };
    // SAFETY: the kernel filled (addr, len) for the new fd.
    protect(
        "accept",
        || unsafe { record_accepted(fd, r, addr, len) },
        || (),
    );
    r
}

/// A listening socket the program did not `listen` on under the preload
/// (inherited across `exec`, or from systemd's socket activation) is
/// managed from its first `accept` on, with its hidden SDP listener. The
/// check costs one `getsockopt` per `accept` on sockets the preload does
/// not manage (Unix sockets, say).
fn adopt_inherited_listener(fd: c_int) {
    if table::is_managed(fd) || sdp::backend().is_none() {
        return;
    }
    // Not from the preload's own threads (the hidden listeners' accepts).
    let Some(_g) = Guard::enter() else { return };
    protect(
        "accept",
        || {
            let _errno = SavedErrno::save();
            let domain = int_sockopt(fd, libc::SOL_SOCKET, libc::SO_DOMAIN);
            if !matches!(domain, Some(libc::AF_INET | libc::AF_INET6)) {
                return;
            }
            if int_sockopt(fd, libc::SOL_SOCKET, libc::SO_ACCEPTCONN) != Some(1) {
                return;
            }
            if super::socket::adopt(fd) {
                crate::log!(Level::Debug, "fd {fd}: inherited listener adopted");
                super::socket::listen_managed(fd, libc::SOMAXCONN);
            }
        },
        || (),
    );
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    adopt_inherited_listener(fd);
    if table::listener(fd).is_some() {
        // SAFETY: the program's arguments.
        return unsafe { sdp_accept(fd, addr, len, 0) };
    }
    if !table::is_managed(fd) {
        // SAFETY: the program's arguments, passed on.
        return unsafe { real::accept(fd, addr, len) };
    }
    // SAFETY: the program's arguments.
    unsafe { accept_common(fd, addr, len, 0) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    adopt_inherited_listener(fd);
    if table::listener(fd).is_some() {
        // SAFETY: the program's arguments.
        return unsafe { sdp_accept(fd, addr, len, flags) };
    }
    // SAFETY: the program's arguments.
    unsafe { accept_common(fd, addr, len, flags) }
}

/// How long a nonblocking `accept` waits for a connection taken from the
/// queue before its MPA Request came (rare: the queue holds a connection
/// only once its Request came, or after 10 s without): the listener was
/// readable for it, and a program that saw it readable must not get
/// `EAGAIN`, as from TCP's queue. The bound holds a client that stalls in
/// its setup from stalling the program.
const SETUP_WAIT: Duration = Duration::from_millis(500);

/// On/off options a connection takes from its listener that the hidden
/// listener cannot pass on (the SDP stream keeps its own copy).
const INHERITED_FLAGS: [(c_int, c_int); 2] = [
    (libc::IPPROTO_TCP, libc::TCP_NODELAY),
    (libc::SOL_SOCKET, libc::SO_OOBINLINE),
];

/// When a blocking `accept` on `fd` gives up with `EAGAIN`: the
/// listener's `SO_RCVTIMEO`, as the kernel's `accept` has it. Asked of the
/// kernel only if the program may have set it (a listener it made and
/// never gave a timeout has none).
fn accept_deadline(fd: c_int) -> Option<Instant> {
    const NAMES: [c_int; 2] = [libc::SO_RCVTIMEO, libc::SO_RCVTIMEO_NEW];
    let l = table::get(fd);
    if l.and_then(|l| l.set_by_program(libc::SOL_SOCKET, &NAMES)) == Some(false) {
        return None;
    }
    super::io::kernel_timeout(fd, libc::SO_RCVTIMEO).map(|t| Instant::now() + t)
}

/// `accept` on a listening fd with a hidden SDP listener beside it: the
/// first connection from either, SDP or TCP.
unsafe fn sdp_accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    protect(
        "accept",
        // SAFETY: the program's arguments.
        || unsafe { sdp_accept_inner(fd, addr, len, flags) },
        || fail(libc::ECONNABORTED),
    )
}

unsafe fn sdp_accept_inner(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    let Some(_g) = Guard::enter() else {
        // SAFETY: the program's arguments, passed on.
        return unsafe { real::accept4(fd, addr, len, flags) };
    };
    let Some(h) = table::listener(fd) else {
        // SAFETY: the program's arguments, passed on.
        return unsafe { real::accept4(fd, addr, len, flags) };
    };
    let dontwait = h.nonblock.load(Ordering::Relaxed);
    // A blocking call sleeps with the program's signal mask and holds its
    // signals until then: one that comes on the way ends the sleep.
    let held = (!dontwait).then(SignalsHeld::hold);
    let deadline = if dontwait { None } else { accept_deadline(fd) };
    // How long a nonblocking call waits for a connection already in setup.
    let setup_deadline = Instant::now() + SETUP_WAIT;
    loop {
        match h.listener.accept(dontwait, flags & libc::SOCK_CLOEXEC != 0) {
            Ok(acc) => {
                let new = acc.fd;
                let _errno = SavedErrno::save();
                // SAFETY: our new fd; F_SETFL takes an int.
                unsafe {
                    if flags & libc::SOCK_NONBLOCK != 0 {
                        let fl = real::fcntl(new, libc::F_GETFL, 0);
                        real::fcntl(new, libc::F_SETFL, (fl | libc::O_NONBLOCK) as libc::c_ulong);
                    }
                }
                // The listener's TCP_NODELAY and SO_OOBINLINE go on to
                // what it accepts, as the kernel copies them (the
                // connection came through the hidden listener, which does
                // not have them); the SDP stream keeps its own copy. A
                // listener the program never set them on has them off.
                let l = table::get(fd);
                for (level, name) in INHERITED_FLAGS {
                    if !table::flag(fd, l.as_ref(), level, name) {
                        continue;
                    }
                    let one: c_int = 1;
                    // SAFETY: an int option on our new fd.
                    let set = unsafe {
                        real::setsockopt(
                            new,
                            level,
                            name,
                            (&one as *const c_int).cast(),
                            std::mem::size_of::<c_int>() as socklen_t,
                        )
                    };
                    if set == 0 {
                        let _ = acc.endpoint.setsockopt(level, name, &one.to_ne_bytes());
                    }
                }
                let mut e = Entry::new(acc.peer.is_ipv6(), l.as_ref().is_some_and(|l| l.forced));
                e.role = SocketRole::Accepted;
                e.want = l.as_ref().and_then(|l| l.want);
                e.decided_by = DecidedBy::Listener;
                e.rule = l.as_ref().map_or(0, |l| l.rule);
                e.transport = Transport::Sdp;
                e.reason = TcpReason::None;
                // Report the listening port P, not the hidden port Q.
                let own = acc.local.or_else(|| socket_name(new, false));
                e.local = match (l.as_ref().and_then(|l| l.local), own) {
                    (Some(p), Some(mut q)) => {
                        q.set_port(p.port());
                        Some(q)
                    }
                    (p, q) => p.or(q),
                };
                e.peer = Some(acc.peer);
                e.sdp = SdpSide::stream(acc.endpoint, flags & libc::SOCK_NONBLOCK != 0);
                // Timeouts come from the listener, as from the kernel's: a
                // listener the program never gave any passes none on, and
                // the first blocking call need not ask.
                if let (SdpSide::Stream(h), Some(false)) = (
                    &e.sdp,
                    l.as_ref()
                        .and_then(|l| l.set_by_program(libc::SOL_SOCKET, &table::TIMEOUT_OPTS)),
                ) {
                    h.timeouts_unset();
                }
                table::insert(new, e);
                drop(_errno);
                // SAFETY: the program's (addr, len) pair.
                unsafe { write_sockaddr(acc.peer, addr, len) };
                return new;
            }
            // The timeout holds also when the listeners stay readable
            // but yield nothing (a connection another thread took).
            Err(e) if e == libc::EAGAIN && deadline.is_some_and(|d| Instant::now() >= d) => {
                return fail(e)
            }
            Err(e) if e == libc::EAGAIN => {}
            Err(e) => return fail(e),
        }
        // Then the kernel listener, without blocking in it; a blocking call
        // waits for either listener, and for a connection whose setup went
        // on in the background.
        let pollfd = |fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let mut p = [
            pollfd(fd),
            pollfd(h.listener.wake_fd()),
            pollfd(h.listener.queue_fd().unwrap_or(-1)),
        ];
        let t = if !dontwait {
            -1
        } else if h.listener.setting_up() {
            let left = setup_deadline.saturating_duration_since(Instant::now());
            left.as_millis() as c_int
        } else {
            0
        };
        let r = match &held {
            // SAFETY: three local pollfds, a local timespec or none, the
            // program's mask.
            Some(held) => unsafe {
                let left = deadline.map(|d| {
                    let left = d.saturating_duration_since(Instant::now());
                    libc::timespec {
                        tv_sec: left.as_secs() as libc::time_t,
                        tv_nsec: libc::c_long::from(left.subsec_nanos()),
                    }
                });
                let left = left.as_ref().map_or(std::ptr::null(), |t| t as *const _);
                real::ppoll(p.as_mut_ptr(), 3, left, held.program_mask())
            },
            // SAFETY: three local pollfds.
            None => unsafe { real::poll(p.as_mut_ptr(), 3, t) },
        };
        if r < 0 {
            return -1;
        }
        if p[0].revents != 0 {
            // The kernel listener is nonblocking: another process (or
            // thread) sharing it may have taken the connection.
            // SAFETY: the program's arguments, passed on.
            let new = unsafe { real::accept4(fd, addr, len, flags) };
            if new >= 0 {
                // SAFETY: the kernel filled (addr, len) for `new`.
                unsafe { record_accepted(fd, new, addr, len) };
                return new;
            }
            let e = real::errno();
            if e != libc::EAGAIN || dontwait {
                return -1;
            }
            continue;
        }
        if r == 0 {
            return fail(libc::EAGAIN);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sdp::{Accepted, Errno, Readiness, SdpListener, WakeFd};
    use crate::test_support::socketpair;
    use std::sync::atomic::AtomicUsize;
    use std::sync::{mpsc, Arc};

    static HANDLED: AtomicUsize = AtomicUsize::new(0);

    extern "C" fn count(_: c_int) {
        HANDLED.fetch_add(1, Ordering::SeqCst);
    }

    /// A hidden listener with no connection, whose `accept` meets a signal
    /// for its own thread: the signal comes while the program's call is on
    /// its way to its sleep.
    struct SignalOnTheWay {
        wake: c_int,
    }

    impl SdpListener for SignalOnTheWay {
        fn readiness(&self) -> Readiness {
            Readiness::default()
        }
        fn wake_fd(&self) -> WakeFd {
            self.wake
        }
        fn accept(&self, _nonblocking: bool, _cloexec: bool) -> Result<Accepted, Errno> {
            // SAFETY: a signal for this very thread.
            unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGWINCH) };
            Err(libc::EAGAIN)
        }
        fn close(&self) {}
        fn fork_child(&self) {}
    }

    /// A signal whose handler (without SA_RESTART) runs once a blocking
    /// `accept` began ends the call with `EINTR`, as it ends the kernel's:
    /// a program whose handler sets the flag its loop checks before each
    /// `accept` (sockperf's server on SIGINT) must not sleep for good.
    #[test]
    fn a_signal_on_the_way_to_the_sleep_ends_a_blocking_accept() {
        // SAFETY: a handler without SA_RESTART for SIGWINCH, which no other
        // test uses; an all-zero sigaction is valid before filling it.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = count as extern "C" fn(c_int) as usize;
            assert_eq!(
                libc::sigaction(libc::SIGWINCH, &sa, std::ptr::null_mut()),
                0
            );
        }
        // Stand-ins for the kernel listener and the wake fd: never readable.
        let (kernel, _peer) = socketpair();
        let (wake, _wake_peer) = socketpair();
        let mut e = Entry::new(false, false);
        e.sdp = SdpSide::listener(Arc::new(SignalOnTheWay { wake }), false);
        table::insert(kernel, e);
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            // SAFETY: no address wanted.
            let r = unsafe { accept(kernel, std::ptr::null_mut(), std::ptr::null_mut()) };
            let _ = tx.send((r, std::io::Error::last_os_error().raw_os_error()));
        });
        let got = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the accept slept on after the signal its call met");
        assert_eq!(got, (-1, Some(libc::EINTR)));
        assert_eq!(HANDLED.load(Ordering::SeqCst), 1, "the handler ran once");
    }
}
