//! The C library's own functions, found once with `dlsym(RTLD_NEXT, ...)`.
//!
//! Each wrapper keeps the resolved address in its own atomic: the first
//! call resolves it (a benign race: every thread finds the same address),
//! later calls are one relaxed load and an indirect call. There is no lock,
//! so a hook that runs while `dlsym` itself is running (or in a signal
//! handler, or in a child after `fork`) cannot deadlock here.
//!
//! `dlsym(RTLD_NEXT)` gives the default version of a symbol. None of the
//! functions wrapped here has more than one version in glibc on x86_64 or
//! aarch64 (`fcntl` and `fcntl64` are two names for one function), so
//! `dlvsym` is not needed. A symbol the C library lacks (`epoll_pwait2`
//! before glibc 2.35, `close_range` before 2.34) makes its wrapper fail with
//! `ENOSYS`, which is what such a C library would do.
#![allow(clippy::missing_safety_doc)]

use libc::{
    c_int, c_uint, c_ulong, c_void, epoll_event, fd_set, iovec, loff_t, mmsghdr, msghdr, nfds_t,
    off_t, pid_t, pollfd, sigset_t, size_t, sockaddr, socklen_t, ssize_t, timespec, timeval,
};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Looks `name` (NUL-terminated) up in the objects loaded after this one.
fn resolve(name: &'static str) -> usize {
    debug_assert!(name.ends_with('\0'));
    // SAFETY: `name` is a NUL-terminated static string; dlsym only reads it.
    unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr().cast()) as usize }
}

/// The address of `name`, resolved on first use and cached in `slot`.
#[inline]
fn address(slot: &AtomicUsize, name: &'static str) -> usize {
    let cached = slot.load(Ordering::Relaxed);
    if cached != 0 {
        return cached;
    }
    let found = resolve(name);
    slot.store(found, Ordering::Relaxed);
    found
}

/// Sets `errno` for the calling thread.
pub fn set_errno(value: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot,
    // valid for the thread's lifetime.
    unsafe { *libc::__errno_location() = value }
}

/// Reads `errno` of the calling thread.
pub fn errno() -> c_int {
    // SAFETY: as in `set_errno`.
    unsafe { *libc::__errno_location() }
}

macro_rules! real_fns {
    ($( $name:ident ( $($arg:ident : $ty:ty),* ) -> $ret:ty ; )*) => {
        /// Every symbol wrapped here, for `resolve_all` and the docs.
        pub const NAMES: &[&str] = &[$(stringify!($name)),*];

        $(
        #[doc = concat!("The C library's `", stringify!($name), "`.")]
        #[inline]
        pub unsafe fn $name($($arg: $ty),*) -> $ret {
            static SLOT: AtomicUsize = AtomicUsize::new(0);
            let addr = address(&SLOT, concat!(stringify!($name), "\0"));
            if addr == 0 {
                set_errno(libc::ENOSYS);
                return <$ret>::from(-1i8);
            }
            // SAFETY: `addr` is the C library's definition of this symbol,
            // whose C prototype is the one spelled out above.
            let f: unsafe extern "C" fn($($ty),*) -> $ret = unsafe { std::mem::transmute(addr) };
            // SAFETY: the caller passes the arguments its own caller gave
            // us, with the C contract of the function.
            unsafe { f($($arg),*) }
        }
        )*

        /// Resolves every wrapped symbol now (from the library constructor),
        /// and returns the names the C library does not have.
        pub fn resolve_all() -> Vec<&'static str> {
            NAMES.iter().copied().filter(|n| {
                let mut z = String::with_capacity(n.len() + 1);
                z.push_str(n);
                z.push('\0');
                // SAFETY: z is NUL-terminated and outlives the call.
                unsafe { libc::dlsym(libc::RTLD_NEXT, z.as_ptr().cast()).is_null() }
            }).collect()
        }
    };
}

real_fns! {
    socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int;
    bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    listen(fd: c_int, backlog: c_int) -> c_int;
    accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int;
    connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int;
    read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t;
    readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t;
    writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t;
    recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t;
    recvfrom(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t;
    recvmmsg(fd: c_int, msgs: *mut mmsghdr, n: c_uint, flags: c_int, timeout: *mut timespec) -> c_int;
    send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t;
    sendto(fd: c_int, buf: *const c_void, n: size_t, flags: c_int, addr: *const sockaddr, len: socklen_t) -> ssize_t;
    sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t;
    sendmmsg(fd: c_int, msgs: *mut mmsghdr, n: c_uint, flags: c_int) -> c_int;
    sendfile(out: c_int, input: c_int, offset: *mut off_t, n: size_t) -> ssize_t;
    sendfile64(out: c_int, input: c_int, offset: *mut off_t, n: size_t) -> ssize_t;
    splice(fd_in: c_int, off_in: *mut loff_t, fd_out: c_int, off_out: *mut loff_t, n: size_t, flags: c_uint) -> ssize_t;
    close(fd: c_int) -> c_int;
    close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int;
    shutdown(fd: c_int, how: c_int) -> c_int;
    getsockopt(fd: c_int, level: c_int, name: c_int, val: *mut c_void, len: *mut socklen_t) -> c_int;
    setsockopt(fd: c_int, level: c_int, name: c_int, val: *const c_void, len: socklen_t) -> c_int;
    getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int;
    dup(fd: c_int) -> c_int;
    dup2(old: c_int, new: c_int) -> c_int;
    dup3(old: c_int, new: c_int, flags: c_int) -> c_int;
    poll(fds: *mut pollfd, n: nfds_t, timeout: c_int) -> c_int;
    ppoll(fds: *mut pollfd, n: nfds_t, timeout: *const timespec, mask: *const sigset_t) -> c_int;
    select(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, timeout: *mut timeval) -> c_int;
    pselect(n: c_int, r: *mut fd_set, w: *mut fd_set, e: *mut fd_set, timeout: *const timespec, mask: *const sigset_t) -> c_int;
    epoll_create(size: c_int) -> c_int;
    epoll_create1(flags: c_int) -> c_int;
    epoll_ctl(epfd: c_int, op: c_int, fd: c_int, event: *mut epoll_event) -> c_int;
    epoll_wait(epfd: c_int, events: *mut epoll_event, max: c_int, timeout: c_int) -> c_int;
    epoll_pwait(epfd: c_int, events: *mut epoll_event, max: c_int, timeout: c_int, mask: *const sigset_t) -> c_int;
    epoll_pwait2(epfd: c_int, events: *mut epoll_event, max: c_int, timeout: *const timespec, mask: *const sigset_t) -> c_int;
    fork() -> pid_t;
    __read_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t) -> ssize_t;
    __recv_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int) -> ssize_t;
    __recvfrom_chk(fd: c_int, buf: *mut c_void, n: size_t, buflen: size_t, flags: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> ssize_t;
    __poll_chk(fds: *mut pollfd, n: nfds_t, timeout: c_int, fdslen: size_t) -> c_int;
    __ppoll_chk(fds: *mut pollfd, n: nfds_t, timeout: *const timespec, mask: *const sigset_t, fdslen: size_t) -> c_int;
}

/// The C library's `fcntl` (variadic: the third argument, when there is
/// one, is an `int` or a pointer, both passed as a machine word).
pub unsafe fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    static SLOT: AtomicUsize = AtomicUsize::new(0);
    let addr = address(&SLOT, "fcntl\0");
    if addr == 0 {
        set_errno(libc::ENOSYS);
        return -1;
    }
    // SAFETY: `addr` is glibc's variadic `int fcntl(int, int, ...)`.
    let f: unsafe extern "C" fn(c_int, c_int, ...) -> c_int = unsafe { std::mem::transmute(addr) };
    // SAFETY: the argument word is the caller's, passed on unchanged; fcntl
    // reads it only for commands that take one.
    unsafe { f(fd, cmd, arg) }
}

/// The C library's `ioctl` (variadic, like [`fcntl`]).
pub unsafe fn ioctl(fd: c_int, request: c_ulong, arg: c_ulong) -> c_int {
    static SLOT: AtomicUsize = AtomicUsize::new(0);
    let addr = address(&SLOT, "ioctl\0");
    if addr == 0 {
        set_errno(libc::ENOSYS);
        return -1;
    }
    // SAFETY: `addr` is glibc's variadic `int ioctl(int, unsigned long, ...)`.
    let f: unsafe extern "C" fn(c_int, c_ulong, ...) -> c_int =
        unsafe { std::mem::transmute(addr) };
    // SAFETY: as in `fcntl`.
    unsafe { f(fd, request, arg) }
}
