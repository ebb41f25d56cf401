//! The system calls std does not offer: peer credentials of a Unix socket,
//! poll(2), and signal handlers for shutdown and reload. The only `unsafe` code
//! of the port mapper lives here.
#![allow(unsafe_code)]

use std::io::{self, Read};
use std::mem::size_of;
use std::os::fd::{AsRawFd, IntoRawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicI32, Ordering};

/// Credentials of the process at the other end of a Unix socket, as of its
/// connect(2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    pub pid: i32,
    pub uid: u32,
}

/// SO_PEERCRED.
pub fn peer_cred(s: &UnixStream) -> io::Result<PeerCred> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: the fd is open for the duration of the borrow of `s`; `c` and
    // `len` are live locals and `len` holds the size of `c`.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(PeerCred {
        pid: c.pid,
        uid: c.uid,
    })
}

pub use libc::{pollfd, POLLERR, POLLHUP, POLLIN, POLLOUT};

/// poll(2); EINTR is reported as zero ready descriptors.
pub fn poll(fds: &mut [pollfd], timeout_ms: i32) -> io::Result<usize> {
    // SAFETY: pointer and length come from one live mutable slice.
    let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(e);
    }
    Ok(r as usize)
}

static SIGNAL_FD: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = SIGNAL_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        // Signal numbers of interest are below 256: the byte names it.
        let byte = [sig as u8];
        // SAFETY: errno is thread-local; write(2) is async-signal-safe and
        // gets a pointer to one live byte. errno is restored for the
        // interrupted code.
        unsafe {
            let errno = *libc::__errno_location();
            libc::write(fd, byte.as_ptr().cast(), 1);
            *libc::__errno_location() = errno;
        }
    }
}

/// What a signal asks of the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM or SIGINT: stop.
    Shutdown,
    /// SIGHUP: re-read the settings.
    Reload,
}

/// Make SIGTERM, SIGINT and SIGHUP readable: the returned socket gets a
/// byte per signal, its number (the self-pipe trick), so the event loop can
/// poll it and do the work outside the handler. See [`read_signals`].
pub fn daemon_signals() -> io::Result<UnixStream> {
    let (r, w) = UnixStream::pair()?;
    r.set_nonblocking(true)?;
    w.set_nonblocking(true)?;
    // The write end lives as long as the process.
    SIGNAL_FD.store(w.into_raw_fd(), Ordering::Relaxed);
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: a zeroed sigaction is a valid "no flags, empty mask"
        // value; the handler is an extern "C" fn that only does
        // async-signal-safe work; pointers are to live locals.
        let r = unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            sa.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(r)
}

/// Drain the bytes [`daemon_signals`] queued: `Shutdown` if any of them asks
/// to stop (it outranks a reload), else `Reload` if one asks for that.
pub fn read_signals(mut r: &UnixStream) -> Option<Signal> {
    let mut out = None;
    let mut buf = [0u8; 64];
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break, // WouldBlock: drained
        };
        for &b in &buf[..n] {
            match libc::c_int::from(b) {
                libc::SIGTERM | libc::SIGINT => out = Some(Signal::Shutdown),
                libc::SIGHUP if out.is_none() => out = Some(Signal::Reload),
                _ => {}
            }
        }
    }
    out
}
