//! The interposed C functions (DESIGN §6 "Calls covered").
//!
//! Every hook starts on a fast path that costs a relaxed atomic load or two
//! and no allocation: while no fd is in SDP state ([`fdtable::no_sdp`]) the
//! data-path hooks call the C library at once; the lifecycle hooks
//! (`socket`, `connect`, `listen`, `accept`, `close`, `dup`...) touch the
//! fd table only for the sockets it manages, found lock-free.
//!
//! A thread-local guard marks "inside the preload": any C call the preload
//! makes itself (reading the rules file, logging, `getsockname` for the
//! state export) goes straight to the C library. Panics never cross the C
//! boundary: the managed paths run under `catch_unwind` and, on a panic,
//! log it and do what the C library would have done.
//!
//! The `unsafe extern "C"` functions of the submodules are exported under
//! their C names from the shared library (not from unit-test builds, where
//! the tests call them as ordinary functions).

pub mod epoll;
pub mod io;
pub mod poll;
pub mod socket;

use crate::fdtable;
use crate::log::Level;
use crate::real;
use libc::{c_int, sockaddr, socklen_t};
use std::cell::Cell;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicI32, Ordering};

/// `socket(AF_INET_SDP, ...)`: libsdp's address family that forces SDP.
pub const AF_INET_SDP: c_int = 27;

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Proof that this thread is inside the preload; dropping it leaves.
pub struct Guard(());

impl Guard {
    /// Enters the preload, or `None` if this thread already is inside (the
    /// call then goes straight to the C library).
    #[inline]
    pub fn enter() -> Option<Guard> {
        INSIDE
            .try_with(|inside| {
                if inside.get() {
                    None
                } else {
                    inside.set(true);
                    Some(Guard(()))
                }
            })
            .ok()
            .flatten()
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = INSIDE.try_with(|inside| inside.set(false));
    }
}

impl Guard {
    /// [`Guard::enter`] for the hooks that change the fd table (`close`,
    /// `dup*`): `None` in the child of a `vfork` (or of a `clone` sharing
    /// our memory, as `posix_spawn` makes), which runs on the parent's
    /// memory until it execs. Such a child closing or duplicating fds
    /// (Python's `subprocess` does) must not touch the parent's table.
    pub fn enter_lifecycle() -> Option<Guard> {
        if foreign_process() {
            return None;
        }
        Guard::enter()
    }
}

/// Marks the calling thread as the preload's own for its whole life (the
/// SDP engine's progress and service threads): its C calls go straight to
/// the C library — its `close` of a connection's socket must not wait at
/// the fork gate, which a `fork` holds closed while it waits for this
/// thread — and every signal is blocked on it, so that a signal for the
/// process goes to a thread of the program, whose blocking call it
/// interrupts (`EINTR`) as it would without the library.
pub fn library_thread() {
    let _ = INSIDE.try_with(|inside| inside.set(true));
    // SAFETY: a local set filled by sigfillset; only this thread's mask
    // changes.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// This process's id, as the library last saw it (start, fork child).
static PID: AtomicI32 = AtomicI32::new(0);

fn note_pid() {
    // SAFETY: getpid has no preconditions.
    PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
}

/// This process's id as the library last noted it (at start and in the
/// child of each `fork`).
pub fn pid() -> i32 {
    PID.load(Ordering::Relaxed)
}

/// True when running in a process other than the one the library's
/// memory belongs to (a `vfork` child before its `exec`).
pub fn foreign_process() -> bool {
    let p = PID.load(Ordering::Relaxed);
    // SAFETY: getpid has no preconditions.
    p != 0 && p != unsafe { libc::getpid() }
}

/// Runs `f`; if it panics, logs and runs `fallback` instead (which must do
/// what the C library would do with the same arguments).
pub fn protect<R>(what: &str, f: impl FnOnce() -> R, fallback: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            crate::log!(
                Level::Error,
                "internal error in {what}; the call goes to the C library"
            );
            fallback()
        }
    }
}

/// Keeps `errno` across calls the preload makes for itself.
pub struct SavedErrno(c_int);

impl SavedErrno {
    pub fn save() -> Self {
        SavedErrno(real::errno())
    }
}

impl Drop for SavedErrno {
    fn drop(&mut self) {
        real::set_errno(self.0);
    }
}

/// Runs the SDP side of a readiness wait (`epoll_wait`, `poll`, `select`
/// and their variants), which returns a count or -1: a count leaves
/// `errno` as the program had it before the call, -1 keeps the `errno` of
/// the failure.
///
/// Such a wait makes calls of its own: it takes locks (a lock wait that a
/// signal without `SA_RESTART` interrupts leaves `EINTR` in `errno`, though
/// the lock is then taken), pumps a stream (a socket read that found
/// nothing leaves `EAGAIN`). Programs look at `errno` after a successful
/// wait: CPython's `select.epoll.poll`, `select.poll.poll` and
/// `select.select` clear it, call, and take `errno == EINTR` as "the call
/// was interrupted" whatever it returned — they throw the events away and
/// wait again. An edge-triggered event thrown away never comes back, and
/// the connection stalls.
pub fn keep_errno_on_success(wait: impl FnOnce() -> c_int) -> c_int {
    let before = real::errno();
    let r = wait();
    if r >= 0 {
        real::set_errno(before);
    }
    r
}

/// Fails the current call with `errno` set: the C convention.
pub fn fail<T: From<i8>>(errno: c_int) -> T {
    real::set_errno(errno);
    T::from(-1)
}

/// Reads a socket address the program passed (`AF_INET`, `AF_INET6`, and
/// `AF_INET_SDP` laid out as `sockaddr_in`).
///
/// # Safety
/// `addr` is null or points to `len` readable bytes.
pub unsafe fn read_sockaddr(addr: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: at least the family field is readable (checked above).
    let family = c_int::from(unsafe { (*addr).sa_family });
    match family {
        libc::AF_INET | AF_INET_SDP if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: len covers a sockaddr_in; read_unaligned allows any
            // alignment of the program's buffer.
            let sin = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in>()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: as above, for a sockaddr_in6.
            let sin6 = unsafe { std::ptr::read_unaligned(addr.cast::<libc::sockaddr_in6>()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// A socket address as the kernel wants it.
pub enum RawAddr {
    V4(libc::sockaddr_in),
    V6(libc::sockaddr_in6),
}

impl RawAddr {
    pub fn new(addr: SocketAddr) -> RawAddr {
        match addr {
            SocketAddr::V4(a) => RawAddr::V4(libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from(*a.ip()).to_be(),
                },
                sin_zero: [0; 8],
            }),
            SocketAddr::V6(a) => RawAddr::V6(libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            }),
        }
    }

    pub fn as_ptr(&self) -> *const sockaddr {
        match self {
            RawAddr::V4(a) => (a as *const libc::sockaddr_in).cast(),
            RawAddr::V6(a) => (a as *const libc::sockaddr_in6).cast(),
        }
    }

    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> socklen_t {
        (match self {
            RawAddr::V4(_) => std::mem::size_of::<libc::sockaddr_in>(),
            RawAddr::V6(_) => std::mem::size_of::<libc::sockaddr_in6>(),
        }) as socklen_t
    }
}

/// Writes `addr` to the program's `(addr, len)` pair as the kernel would:
/// truncated to the buffer, `*len` set to the full size.
///
/// # Safety
/// `out` is null or points to `*len` writable bytes; `len` is null or valid.
pub unsafe fn write_sockaddr(addr: SocketAddr, out: *mut sockaddr, len: *mut socklen_t) {
    if out.is_null() || len.is_null() {
        return;
    }
    let raw = RawAddr::new(addr);
    // SAFETY: len is valid (checked non-null; the caller vouches for it).
    let room = unsafe { *len } as usize;
    let n = room.min(raw.len() as usize);
    // SAFETY: raw is raw.len() bytes; out has room for `room` >= n bytes.
    unsafe {
        std::ptr::copy_nonoverlapping(raw.as_ptr().cast::<u8>(), out.cast::<u8>(), n);
        *len = raw.len();
    }
}

/// `getsockname`/`getpeername` of our own, into a std address.
pub fn socket_name(fd: c_int, peer: bool) -> Option<SocketAddr> {
    let _errno = SavedErrno::save();
    // SAFETY: an all-zero sockaddr_storage is valid.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
    let p = (&mut storage as *mut libc::sockaddr_storage).cast::<sockaddr>();
    // SAFETY: p/len describe our local storage.
    let r = unsafe {
        if peer {
            real::getpeername(fd, p, &mut len)
        } else {
            real::getsockname(fd, p, &mut len)
        }
    };
    if r != 0 {
        return None;
    }
    // SAFETY: the kernel wrote `len` bytes of an address into storage.
    unsafe { read_sockaddr(p, len) }
}

/// An integer socket option of our own (errno kept).
pub fn int_sockopt(fd: c_int, level: c_int, name: c_int) -> Option<c_int> {
    let _errno = SavedErrno::save();
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: v/len describe a local int.
    let r = unsafe { real::getsockopt(fd, level, name, (&mut v as *mut c_int).cast(), &mut len) };
    (r == 0).then_some(v)
}

/// Library start: configuration, logging, symbol resolution, fork handlers.
pub fn init() {
    let Some(_g) = Guard::enter() else { return };
    protect(
        "initialisation",
        || {
            note_pid();
            let config = crate::config::get();
            crate::stat::init();
            // SDP_ENGINE=0: no SDP at all, every connection plain TCP.
            if std::env::var("SDP_ENGINE").is_ok_and(|v| v == "0") {
                crate::log!(Level::Debug, "SDP_ENGINE=0: every connection is TCP");
            } else {
                crate::backend::install();
            }
            for missing in real::resolve_all() {
                crate::log!(
                    Level::Debug,
                    "the C library has no {missing}; its hook answers ENOSYS"
                );
            }
            std::panic::set_hook(Box::new(|info| {
                crate::log!(Level::Error, "panic: {info}");
            }));
            // SAFETY: the handlers are plain extern "C" functions.
            unsafe {
                libc::pthread_atfork(
                    Some(atfork_prepare),
                    Some(atfork_parent),
                    Some(atfork_child),
                );
                libc::atexit(at_exit);
            }
            crate::log!(
                Level::Debug,
                "loaded into {:?} with {} rules from {}",
                crate::config::program(),
                config.rules.rules.len(),
                config.path.as_deref().unwrap_or("(no rules file)")
            );
        },
        || (),
    );
}

/// How long `exit` waits for SDP connections to flush
/// (`SDP_EXIT_FLUSH_MS`, default 2000).
fn exit_flush_time() -> std::time::Duration {
    let ms = std::env::var("SDP_EXIT_FLUSH_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000u64);
    std::time::Duration::from_millis(ms)
}

/// Asks every open SDP connection to flush before the process ends (each
/// endpoint once, however many fd numbers share it); returns how many.
pub fn flush_all(deadline: std::time::Instant) -> usize {
    let mut seen: Vec<*const ()> = Vec::new();
    let mut listeners: Vec<*const ()> = Vec::new();
    fdtable::for_each(|_, e| match &e.sdp {
        fdtable::SdpSide::Stream(h) => {
            let key = std::sync::Arc::as_ptr(h).cast::<()>();
            if !seen.contains(&key) {
                seen.push(key);
                h.endpoint.flush_at_exit(deadline);
            }
        }
        fdtable::SdpSide::Listener(h) => {
            let key = std::sync::Arc::as_ptr(h).cast::<()>();
            if !listeners.contains(&key) {
                listeners.push(key);
                h.listener.exiting();
            }
        }
        fdtable::SdpSide::None => {}
    });
    seen.len()
}

/// The process ends (`exit` or `_exit`): open SDP connections are closed
/// gracefully and, with the ones the program closed already, given until
/// `SDP_EXIT_FLUSH_MS` to finish.
fn exit_flush() {
    if foreign_process() {
        return;
    }
    let Some(_g) = Guard::enter() else { return };
    protect(
        "exit",
        || {
            let deadline = std::time::Instant::now() + exit_flush_time();
            if !fdtable::no_sdp() {
                flush_all(deadline);
            }
            if let Some(b) = crate::sdp::backend() {
                b.exiting(deadline);
            }
        },
        || (),
    );
}

extern "C" fn at_exit() {
    exit_flush();
}

/// `_exit` (and `_Exit`): what a forked child calls to end without the
/// parent's `atexit` work. Its SDP connections still need their bytes and
/// close exchange out before the socket goes (the kernel keeps TCP bytes
/// past the process's end; the SDP engine's are in this process).
///
/// # Safety
/// As the C function: it does not return.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn _exit(status: c_int) -> ! {
    exit_flush();
    // SAFETY: ends the process, as the C library's _exit would.
    unsafe { real_exit(status) }
}

/// `_Exit`: the same as `_exit`.
///
/// # Safety
/// As the C function: it does not return.
#[allow(non_snake_case)]
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn _Exit(status: c_int) -> ! {
    exit_flush();
    // SAFETY: as in _exit.
    unsafe { real_exit(status) }
}

/// The C library's `_exit`, or the system call if it cannot be found.
unsafe fn real_exit(status: c_int) -> ! {
    // SAFETY: a NUL-terminated name.
    let f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"_exit".as_ptr()) };
    if !f.is_null() {
        // SAFETY: the C library's `void _exit(int)`.
        let f: unsafe extern "C" fn(c_int) -> ! = unsafe { std::mem::transmute(f) };
        // SAFETY: as documented for _exit.
        unsafe { f(status) }
    }
    loop {
        // SAFETY: exit_group ends the process.
        unsafe { libc::syscall(libc::SYS_exit_group, status) };
    }
}

/// Calls `f` once per SDP side (however many fd numbers share it), with
/// the fork gate closed by this thread.
fn each_side_unguarded(mut f: impl FnMut(&fdtable::SdpSide)) {
    let mut seen: Vec<*const ()> = Vec::new();
    fdtable::for_each_unguarded(|_, e| {
        let key = match &e.sdp {
            fdtable::SdpSide::None => return,
            fdtable::SdpSide::Stream(h) => std::sync::Arc::as_ptr(h).cast::<()>(),
            fdtable::SdpSide::Listener(h) => std::sync::Arc::as_ptr(h).cast::<()>(),
        };
        if !seen.contains(&key) {
            seen.push(key);
            f(&e.sdp);
        }
    });
}

/// A `fork` failed: the connections it made pending keep no holder slot
/// for a child (see `backend::owner`).
fn fork_failed() {
    let Some(_g) = Guard::enter() else { return };
    protect(
        "fork",
        || {
            let mut seen: Vec<*const ()> = Vec::new();
            fdtable::for_each(|_, e| {
                if let fdtable::SdpSide::Stream(h) = &e.sdp {
                    let key = std::sync::Arc::as_ptr(h).cast::<()>();
                    if !seen.contains(&key) {
                        seen.push(key);
                        h.endpoint.fork_failed();
                    }
                }
            });
        },
        || (),
    );
}

extern "C" fn atfork_prepare() {
    fdtable::fork_prepare();
    if foreign_process() {
        return;
    }
    let Some(backend) = crate::sdp::backend() else {
        return;
    };
    let Some(_g) = Guard::enter() else { return };
    protect(
        "fork (prepare)",
        || {
            if !fdtable::no_sdp() {
                each_side_unguarded(|side| {
                    if let fdtable::SdpSide::Stream(h) = side {
                        let in_use = h.in_use() || epoll::in_waited_set(h);
                        h.endpoint.fork_prepare(in_use);
                    }
                });
            }
            backend.fork_prepare();
        },
        || (),
    );
}

extern "C" fn atfork_parent() {
    if let (false, Some(backend), Some(_g)) =
        (foreign_process(), crate::sdp::backend(), Guard::enter())
    {
        protect(
            "fork (parent)",
            || {
                if !fdtable::no_sdp() {
                    each_side_unguarded(|side| match side {
                        fdtable::SdpSide::None => {}
                        fdtable::SdpSide::Stream(h) => h.endpoint.fork_parent(),
                        fdtable::SdpSide::Listener(h) => h.listener.fork_parent(),
                    });
                }
                backend.fork_parent();
            },
            || (),
        );
    }
    fdtable::fork_done();
}

extern "C" fn atfork_child() {
    note_pid();
    // The only thread: the gate may open before the fix-ups.
    fdtable::fork_done();
    let Some(_g) = Guard::enter() else {
        return;
    };
    protect(
        "fork (child)",
        || {
            crate::stat::fork_child();
            if let Some(backend) = crate::sdp::backend() {
                backend.fork_child();
            }
            each_side_unguarded(|side| match side {
                fdtable::SdpSide::None => {}
                fdtable::SdpSide::Stream(h) => h.endpoint.fork_child(),
                fdtable::SdpSide::Listener(h) => h.listener.fork_child(),
            });
        },
        || (),
    );
}

#[cfg(not(test))]
#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = {
    extern "C" fn constructor() {
        init();
    }
    constructor
};
