//! The system calls std does not offer: peer credentials of a Unix socket,
//! poll(2), and a signal handler for clean shutdown. The only `unsafe` code
//! of the port mapper lives here.
#![allow(unsafe_code)]

use std::io;
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

extern "C" fn on_signal(_sig: libc::c_int) {
    let fd = SIGNAL_FD.load(Ordering::Relaxed);
    if fd >= 0 {
        // SAFETY: errno is thread-local; write(2) is async-signal-safe and
        // gets a pointer to one live byte. errno is restored for the
        // interrupted code.
        unsafe {
            let errno = *libc::__errno_location();
            libc::write(fd, [1u8].as_ptr().cast(), 1);
            *libc::__errno_location() = errno;
        }
    }
}

/// Make SIGTERM and SIGINT readable: the returned socket gets a byte per
/// signal (the self-pipe trick), so the event loop can poll it.
pub fn shutdown_signals() -> io::Result<UnixStream> {
    let (r, w) = UnixStream::pair()?;
    r.set_nonblocking(true)?;
    w.set_nonblocking(true)?;
    // The write end lives as long as the process.
    SIGNAL_FD.store(w.into_raw_fd(), Ordering::Relaxed);
    for sig in [libc::SIGTERM, libc::SIGINT] {
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
