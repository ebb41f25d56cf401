//! Socket lifecycle hooks: creation, the SDP/TCP decision at `connect` and
//! `listen`, names, options, `close`, `dup*`, `fcntl`, `ioctl` (`accept`
//! has a module of its own).
#![allow(clippy::missing_safety_doc)]

use super::protect;
use crate::config;
use crate::log::Level;
use crate::rules::{Family, Role};
use crate::sdp::{self, ConnectOutcome, Setup, Shutdown};
use crate::sys::addr::{
    int_sockopt, read_sockaddr, socket_name, write_sockaddr, RawAddr, AF_INET_SDP,
};
use crate::sys::errno::{fail, SavedErrno};
use crate::sys::guard::{self, Guard};
use crate::sys::real;
use crate::table::{self, DecidedBy, Entry, SdpSide, SocketRole, TcpReason, Transport};
use libc::{c_int, c_uint, c_ulong, c_void, sockaddr, socklen_t};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};

/// `ioctl(SIOCATMARK)` (linux/sockios.h), which the libc crate lacks.
const SIOCATMARK: c_ulong = 0x8905;

/// Is this `socket()` call a TCP stream socket we manage?
fn is_tcp(domain: c_int, ty: c_int, protocol: c_int) -> bool {
    matches!(domain, libc::AF_INET | libc::AF_INET6)
        && ty & 0xf == libc::SOCK_STREAM
        && (protocol == 0 || protocol == libc::IPPROTO_TCP)
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, protocol: c_int) -> c_int {
    let forced = domain == AF_INET_SDP;
    // AF_INET_SDP is AF_IB to the kernel: the socket is an AF_INET one.
    let domain = if forced { libc::AF_INET } else { domain };
    // SAFETY: the program's arguments, passed on.
    let fd = unsafe { real::socket(domain, ty, protocol) };
    if fd < 0 || !is_tcp(domain, ty, protocol) {
        return fd;
    }
    let Some(_g) = Guard::enter() else { return fd };
    protect(
        "socket",
        || {
            let _errno = SavedErrno::save();
            table::insert(fd, Entry::new(domain == libc::AF_INET6, forced));
            if forced {
                crate::log!(Level::Debug, "fd {fd}: socket(AF_INET_SDP): SDP forced");
            }
        },
        || (),
    );
    fd
}

/// A socket we did not see created (inherited across `exec`, made with a
/// raw syscall): manage it from now on if it is a TCP socket.
pub(super) fn adopt(fd: c_int) -> bool {
    if table::is_managed(fd) {
        return true;
    }
    let domain = int_sockopt(fd, libc::SOL_SOCKET, libc::SO_DOMAIN);
    let ty = int_sockopt(fd, libc::SOL_SOCKET, libc::SO_TYPE);
    let proto = int_sockopt(fd, libc::SOL_SOCKET, libc::SO_PROTOCOL);
    match (domain, ty, proto) {
        (Some(d), Some(t), Some(p)) if is_tcp(d, t, p) => {
            let mut e = Entry::new(d == libc::AF_INET6, false);
            e.adopted = true;
            table::insert(fd, e);
            true
        }
        _ => false,
    }
}

/// For a socket forced to SDP by `AF_INET_SDP`, an address whose family is
/// `AF_INET_SDP` is rewritten to `AF_INET` for the kernel.
unsafe fn kernel_addr(addr: *const sockaddr, len: socklen_t) -> Option<RawAddr> {
    // SAFETY: the program's (addr, len) pair.
    if addr.is_null() || c_int::from(unsafe { (*addr).sa_family }) != AF_INET_SDP {
        return None;
    }
    // SAFETY: as above.
    unsafe { read_sockaddr(addr, len) }.map(RawAddr::new)
}

/// `socket(AF_INET_SDP, ...)` makes an `AF_INET` socket; libsdp's family
/// takes IPv6 addresses too (qperf binds one from `getaddrinfo`). The first
/// `bind` or `connect` with an `AF_INET6` address puts a fresh `AF_INET6`
/// socket on the fd number (same flags, the options set so far).
///
/// # Safety
/// `addr` is null or points to `len` readable bytes.
/// The caller holds the [`Guard`].
unsafe fn forced_to_ipv6(fd: c_int, addr: *const sockaddr, len: socklen_t) {
    if addr.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return;
    }
    // SAFETY: at least the family field is readable (checked above).
    if c_int::from(unsafe { (*addr).sa_family }) != libc::AF_INET6 {
        return;
    }
    let _errno = SavedErrno::save();
    let Some(e) = table::get(fd) else { return };
    if !e.forced || e.ipv6 || e.role != SocketRole::None {
        return;
    }
    // SAFETY: F_GETFL/F_GETFD take no argument; socket creation; our new
    // socket onto the program's fd number; options the kernel took before.
    unsafe {
        let fl = real::fcntl(fd, libc::F_GETFL, 0);
        let fdfl = real::fcntl(fd, libc::F_GETFD, 0);
        let new = real::socket(libc::AF_INET6, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fl < 0 || fdfl < 0 || new < 0 {
            if new >= 0 {
                real::close(new);
            }
            return;
        }
        for o in &e.opts {
            real::setsockopt(
                new,
                o.level,
                o.name,
                o.value.as_ptr().cast(),
                o.value.len() as socklen_t,
            );
        }
        real::fcntl(new, libc::F_SETFL, fl as c_ulong);
        let cloexec = if fdfl & libc::FD_CLOEXEC != 0 {
            libc::O_CLOEXEC
        } else {
            0
        };
        let r = real::dup3(new, fd, cloexec);
        real::close(new);
        if r >= 0 {
            table::update(fd, |e| e.ipv6 = true);
            crate::log!(Level::Debug, "fd {fd}: AF_INET_SDP socket now AF_INET6");
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    if !table::is_managed(fd) {
        // SAFETY: the program's arguments, passed on.
        return unsafe { real::bind(fd, addr, len) };
    }
    let guard = Guard::enter();
    if guard.is_some() {
        // SAFETY: the program's (addr, len) pair.
        unsafe { forced_to_ipv6(fd, addr, len) };
    }
    // SAFETY: the program's (addr, len) pair.
    let r = match unsafe { kernel_addr(addr, len) } {
        // SAFETY: raw is a complete address of raw.len() bytes.
        Some(raw) => unsafe { real::bind(fd, raw.as_ptr(), raw.len()) },
        // SAFETY: the program's arguments, passed on.
        None => unsafe { real::bind(fd, addr, len) },
    };
    if r == 0 && guard.is_some() {
        let _errno = SavedErrno::save();
        protect("bind", || table::update(fd, |e| e.bound = true), || None);
    }
    r
}

/// Logs "SDP wanted but not available" once at warn, then at debug.
fn warn_no_engine(fd: c_int, what: &str) {
    static WARNED: AtomicBool = AtomicBool::new(false);
    let level = if WARNED.swap(true, Ordering::Relaxed) {
        Level::Debug
    } else {
        Level::Warn
    };
    crate::log!(
        level,
        "fd {fd}: {what} asks for SDP only, but this build has no SDP engine: using TCP"
    );
}

/// The rules' answer for `fd`, as (family, who decided, rule number).
fn decide(entry: &Entry, role: Role, addr: &SocketAddr) -> (Family, DecidedBy, u16) {
    if entry.forced {
        return (Family::Sdp, DecidedBy::Forced, 0);
    }
    let d = config::get().rules.decide(role, config::program(), addr);
    match d.rule {
        Some(n) => (
            d.family,
            DecidedBy::Rule,
            u16::try_from(n).unwrap_or(u16::MAX),
        ),
        None => (d.family, DecidedBy::Default, 0),
    }
}

fn describe(decided_by: DecidedBy, rule: u16) -> String {
    match decided_by {
        DecidedBy::Rule => format!("rule {rule}"),
        DecidedBy::Forced => "AF_INET_SDP".into(),
        DecidedBy::Listener => "listener".into(),
        DecidedBy::Default | DecidedBy::Nothing => "default".into(),
    }
}

/// The C library's `connect`, with an `AF_INET_SDP` address rewritten to
/// `AF_INET` for the kernel.
unsafe fn pass_connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the program's (addr, len) pair, or a complete address we
    // built from it, passed to the C library.
    unsafe {
        match kernel_addr(addr, len) {
            Some(raw) => real::connect(fd, raw.as_ptr(), raw.len()),
            None => real::connect(fd, addr, len),
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    let Some(_g) = Guard::enter() else {
        // SAFETY: the program's arguments.
        return unsafe { pass_connect(fd, addr, len) };
    };
    // SAFETY: the program's (addr, len) pair.
    let dest = unsafe { read_sockaddr(addr, len) };
    if dest.is_some() && table::is_managed(fd) {
        // SAFETY: the program's (addr, len) pair.
        unsafe { forced_to_ipv6(fd, addr, len) };
    }
    match dest {
        Some(dest) if adopt(fd) => protect(
            "connect",
            // SAFETY: the program's arguments.
            || unsafe { connect_managed(fd, addr, len, dest) },
            // SAFETY: the program's arguments.
            || unsafe { pass_connect(fd, addr, len) },
        ),
        // SAFETY: the program's arguments.
        _ => unsafe { pass_connect(fd, addr, len) },
    }
}

unsafe fn connect_managed(
    fd: c_int,
    addr: *const sockaddr,
    len: socklen_t,
    dest: SocketAddr,
) -> c_int {
    let Some(entry) = table::get(fd) else {
        // SAFETY: the program's arguments.
        return unsafe { pass_connect(fd, addr, len) };
    };
    if entry.role == SocketRole::Client {
        // Decided already: a program asking again about its connect.
        if let SdpSide::Stream(h) = &entry.sdp {
            let r = h.endpoint.readiness();
            return fail(if r.writable || r.error {
                libc::EISCONN
            } else {
                libc::EALREADY
            });
        }
        // SAFETY: the program's arguments.
        return unsafe { pass_connect(fd, addr, len) };
    }
    let (family, decided_by, rule) = decide(&entry, Role::Client, &dest);
    let mut reason = TcpReason::RuleTcp;
    // The backend's fallback already made the TCP connect (its outcome).
    let mut connected = None;
    if family != Family::Tcp {
        reason = TcpReason::NoEngine;
        if let Some(backend) = sdp::backend() {
            let nonblocking = {
                let _e = SavedErrno::save();
                // SAFETY: F_GETFL takes no argument.
                let flags = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
                flags >= 0 && flags & libc::O_NONBLOCK != 0
            };
            let setup = match backend.connect(fd, dest, nonblocking, family == Family::Sdp) {
                ConnectOutcome::Started(ep) => {
                    // SDP once the setup is done (the backend records it).
                    record_connect(
                        fd,
                        family,
                        decided_by,
                        rule,
                        Transport::Undecided,
                        TcpReason::None,
                        dest,
                        SdpSide::stream(ep.clone(), nonblocking),
                    );
                    ep.recorded()
                }
                ConnectOutcome::Fallback(r) => Setup::Fallback(r),
                ConnectOutcome::Failed(errno) => Setup::Failed(errno),
            };
            match setup {
                Setup::Sdp => {
                    crate::log!(
                        Level::Info,
                        "fd {fd}: connect {dest}: {:?} by {} -> SDP",
                        family,
                        describe(decided_by, rule)
                    );
                    return 0;
                }
                Setup::InProgress => return fail(libc::EINPROGRESS),
                Setup::Failed(errno) => {
                    record_connect(
                        fd,
                        family,
                        decided_by,
                        rule,
                        Transport::Undecided,
                        TcpReason::None,
                        dest,
                        SdpSide::None,
                    );
                    return fail(errno);
                }
                Setup::Fallback(r) => reason = r,
                Setup::FellBack(r, c) => {
                    reason = r;
                    connected = Some(c);
                }
            }
        } else if family == Family::Sdp {
            warn_no_engine(fd, &describe(decided_by, rule));
        }
    }
    crate::log!(
        Level::Info,
        "fd {fd}: connect {dest}: {:?} by {} -> TCP ({})",
        family,
        describe(decided_by, rule),
        reason.name()
    );
    record_connect(
        fd,
        family,
        decided_by,
        rule,
        Transport::Tcp,
        reason,
        dest,
        SdpSide::None,
    );
    let r = match connected {
        Some(Ok(())) => 0,
        Some(Err(e)) => fail(e),
        // SAFETY: the program's arguments.
        None => unsafe { pass_connect(fd, addr, len) },
    };
    if r == 0 || matches!(real::errno(), libc::EINPROGRESS | libc::EINTR) {
        let local = socket_name(fd, false);
        table::update(fd, |e| e.local = local);
    }
    r
}

#[allow(clippy::too_many_arguments)]
fn record_connect(
    fd: c_int,
    family: Family,
    decided_by: DecidedBy,
    rule: u16,
    transport: Transport,
    reason: TcpReason,
    dest: SocketAddr,
    side: SdpSide,
) {
    let _errno = SavedErrno::save();
    table::update(fd, |e| {
        e.role = SocketRole::Client;
        e.want = Some(family);
        e.decided_by = decided_by;
        e.rule = rule;
        e.transport = transport;
        e.reason = reason;
        e.peer = Some(dest);
        if let SdpSide::Stream(h) = &side {
            if e.set_by_program(libc::SOL_SOCKET, &table::TIMEOUT_OPTS) == Some(false) {
                h.timeouts_unset();
            }
        }
        e.sdp = side;
    });
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    // SAFETY: the program's arguments, passed on.
    let r = unsafe { real::listen(fd, backlog) };
    if r != 0 {
        return r;
    }
    let Some(_g) = Guard::enter() else { return r };
    protect(
        "listen",
        || {
            let _errno = SavedErrno::save();
            if adopt(fd) {
                listen_managed(fd, backlog);
            }
        },
        || (),
    );
    r
}

pub(super) fn listen_managed(fd: c_int, backlog: c_int) {
    let Some(entry) = table::get(fd) else {
        return;
    };
    if entry.role == SocketRole::Listener {
        // A second listen only changes the backlog.
        return;
    }
    let Some(local) = socket_name(fd, false) else {
        return;
    };
    let (family, decided_by, rule) = decide(&entry, Role::Server, &local);
    let mut side = SdpSide::None;
    let reason = if family == Family::Tcp {
        TcpReason::RuleTcp
    } else if let Some(backend) = sdp::backend() {
        match backend.listen(fd, local, backlog) {
            Ok(l) => {
                // The kernel listener turns nonblocking (accept takes from
                // both listeners without blocking in either); the program
                // keeps its own view of the flag.
                // SAFETY: F_GETFL/F_SETFL on the program's socket.
                let nonblock = unsafe {
                    let fl = real::fcntl(fd, libc::F_GETFL, 0);
                    if fl >= 0 {
                        real::fcntl(fd, libc::F_SETFL, (fl | libc::O_NONBLOCK) as c_ulong);
                    }
                    fl >= 0 && fl & libc::O_NONBLOCK != 0
                };
                side = SdpSide::listener(l, nonblock);
                TcpReason::None
            }
            Err(r) => r,
        }
    } else {
        if family == Family::Sdp {
            warn_no_engine(fd, &describe(decided_by, rule));
        }
        TcpReason::NoEngine
    };
    let transport = if matches!(side, SdpSide::None) {
        Transport::Tcp
    } else {
        Transport::Sdp
    };
    crate::log!(
        Level::Info,
        "fd {fd}: listen {local}: {:?} by {} -> {}",
        family,
        describe(decided_by, rule),
        if transport == Transport::Sdp {
            "SDP and TCP"
        } else {
            reason.name()
        }
    );
    table::update(fd, |e| {
        e.role = SocketRole::Listener;
        e.want = Some(family);
        e.decided_by = decided_by;
        e.rule = rule;
        e.transport = transport;
        e.reason = reason;
        e.local = Some(local);
        e.sdp = side;
    });
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    // Another fd's close (a file a server opens per request) is the C
    // library's alone: no look at this process's id, no registry walk.
    if table::is_managed(fd) || super::epoll::concerns(fd) {
        if let Some(_g) = Guard::enter_lifecycle() {
            let _errno = SavedErrno::save();
            protect(
                "close",
                || {
                    super::epoll::forget_fd(fd);
                    table::remove(fd);
                },
                || (),
            );
        }
    }
    // SAFETY: the program's argument, passed on.
    unsafe { real::close(fd) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    // SAFETY: the program's arguments, passed on.
    let r = unsafe { real::close_range(first, last, flags) };
    if r == 0 && flags & (libc::CLOSE_RANGE_CLOEXEC as c_int) == 0 {
        if let Some(_g) = Guard::enter_lifecycle() {
            let _errno = SavedErrno::save();
            protect("close_range", || table::remove_range(first, last), || ());
        }
    }
    r
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    if let Some(h) = own_stream(fd) {
        let how = match how {
            libc::SHUT_RD => Shutdown::Read,
            libc::SHUT_WR => Shutdown::Write,
            libc::SHUT_RDWR => Shutdown::Both,
            _ => return fail(libc::EINVAL),
        };
        return protect(
            "shutdown",
            || match h.endpoint.shutdown(how) {
                Ok(()) => 0,
                Err(e) => fail(e),
            },
            || fail(libc::EIO),
        );
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::shutdown(fd, how) }
}

/// After a successful duplication of `old` onto `new`.
fn duplicated(old: c_int, new: c_int) {
    if new >= 0 && (table::is_managed(old) || table::is_managed(new)) {
        if let Some(_g) = Guard::enter_lifecycle() {
            let _errno = SavedErrno::save();
            protect("dup", || table::duplicate(old, new), || ());
        }
    }
}

/// `dup2`/`dup3` close `new` first: an SDP connection there learns it
/// before the kernel closes the fd (so it can still flush).
fn forget_target(old: c_int, new: c_int) {
    if old == new {
        return;
    }
    let sdp = table::is_sdp(new) && table::is_managed(new);
    // The number's registrations end with its file, as at a close: an
    // SDP fd's in the program's epoll sets, an epoll set's own. (Onto a
    // duplicate of the same socket, the kernel's would stay.)
    let registered = super::epoll::concerns(new) && !table::same_endpoint(old, new);
    if !sdp && !registered {
        return;
    }
    if let Some(_g) = Guard::enter_lifecycle() {
        let _errno = SavedErrno::save();
        // Only if `old` is open: otherwise dup2 fails and changes nothing.
        // SAFETY: F_GETFD takes no argument.
        if unsafe { real::fcntl(old, libc::F_GETFD, 0) } >= 0 {
            protect(
                "dup2",
                || {
                    if registered {
                        super::epoll::forget_fd(new);
                    }
                    if sdp {
                        table::remove(new);
                    }
                },
                || (),
            );
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    // SAFETY: the program's argument, passed on.
    let r = unsafe { real::dup(fd) };
    duplicated(fd, r);
    r
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup2(old: c_int, new: c_int) -> c_int {
    forget_target(old, new);
    // SAFETY: the program's arguments, passed on.
    let r = unsafe { real::dup2(old, new) };
    if r >= 0 && old != new {
        duplicated(old, r);
    }
    r
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn dup3(old: c_int, new: c_int, flags: c_int) -> c_int {
    forget_target(old, new);
    // SAFETY: the program's arguments, passed on.
    let r = unsafe { real::dup3(old, new, flags) };
    if r >= 0 {
        duplicated(old, r);
    }
    r
}

/// The SDP stream at `fd` for a program's call; `None` for the
/// library's own calls (its threads', or made inside a hook), which go
/// straight to the C library ([`guard::inside`]).
#[inline]
fn own_stream(fd: c_int) -> Option<std::sync::Arc<table::StreamHandle>> {
    if guard::inside() {
        return None;
    }
    table::stream(fd)
}

/// The program's view of `O_NONBLOCK` on an SDP fd (stream or listener),
/// whose kernel socket is always nonblocking.
fn nonblock_view(fd: c_int) -> Option<std::sync::Arc<dyn AsNonblock>> {
    if table::no_sdp() {
        return None;
    }
    let _g = Guard::enter()?;
    if let Some(h) = table::stream(fd) {
        return Some(h);
    }
    table::listener(fd).map(|h| h as std::sync::Arc<dyn AsNonblock>)
}

/// Whether `fd` stopped being `h`'s while the program set its view of
/// `O_NONBLOCK` (a connect that fell back to TCP): the kernel's flag was
/// set from the view before the fall-back, so the new value goes to the
/// kernel too.
fn fell_back_meanwhile(fd: c_int, h: &std::sync::Arc<dyn AsNonblock>) -> bool {
    match nonblock_view(fd) {
        Some(now) => !std::ptr::addr_eq(std::sync::Arc::as_ptr(&now), std::sync::Arc::as_ptr(h)),
        None => true,
    }
}

/// A handle carrying the program's `O_NONBLOCK`.
pub(crate) trait AsNonblock {
    fn flag(&self) -> &std::sync::atomic::AtomicBool;
    /// The program sets `O_NONBLOCK` (`on`) or clears it.
    fn set(&self, on: bool) {
        self.flag().store(on, Ordering::Release);
    }
}

impl AsNonblock for table::StreamHandle {
    fn flag(&self) -> &std::sync::atomic::AtomicBool {
        &self.nonblock
    }

    fn set(&self, on: bool) {
        self.nonblock.store(on, Ordering::Release);
        self.endpoint.set_nonblocking(on);
    }
}

impl AsNonblock for table::ListenerHandle {
    fn flag(&self) -> &std::sync::atomic::AtomicBool {
        &self.nonblock
    }
}

unsafe fn fcntl_common(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    if cmd == libc::F_GETFL || cmd == libc::F_SETFL {
        if let Some(h) = nonblock_view(fd) {
            let view = h.flag();
            if cmd == libc::F_GETFL {
                // SAFETY: F_GETFL takes no argument.
                let fl = unsafe { real::fcntl(fd, cmd, 0) };
                if fl < 0 {
                    return fl;
                }
                let on = view.load(Ordering::Relaxed);
                return (fl & !libc::O_NONBLOCK) | if on { libc::O_NONBLOCK } else { 0 };
            }
            let want = arg as c_int;
            // SAFETY: F_SETFL with the program's flags, O_NONBLOCK kept on.
            let r = unsafe { real::fcntl(fd, cmd, (want | libc::O_NONBLOCK) as c_ulong) };
            if r == 0 {
                h.set(want & libc::O_NONBLOCK != 0);
                if fell_back_meanwhile(fd, &h) {
                    // SAFETY: F_SETFL with the program's own flags.
                    return unsafe { real::fcntl(fd, cmd, arg) };
                }
            }
            return r;
        }
    }
    // SAFETY: the program's arguments, passed on (see real::fcntl on the
    // variadic argument).
    let r = unsafe { real::fcntl(fd, cmd, arg) };
    if r >= 0 && (cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC) {
        duplicated(fd, r);
    }
    r
}

/// `fcntl(int, int, ...)`. Rust cannot define a C-variadic function; on
/// the x86_64 and aarch64 Linux ABIs a variadic integer or pointer argument
/// arrives in the same register as a third fixed one, so reading it as a
/// machine word is exact (and harmless garbage for commands without one,
/// which the C library then ignores as it would have).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: as documented above.
    unsafe { fcntl_common(fd, cmd, arg) }
}

/// `fcntl64`: the same function in glibc on 64-bit targets.
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: c_ulong) -> c_int {
    // SAFETY: as for fcntl.
    unsafe { fcntl_common(fd, cmd, arg) }
}

/// `ioctl(int, unsigned long, ...)`, read like [`fcntl`]. On an SDP fd,
/// `FIONREAD` and `SIOCATMARK` are answered by the SDP connection;
/// `FIONBIO` sets the program's view of `O_NONBLOCK`, which the hooks
/// follow (the kernel socket stays nonblocking).
#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn ioctl(fd: c_int, request: c_ulong, arg: c_ulong) -> c_int {
    if request == libc::FIONBIO {
        if let Some(h) = nonblock_view(fd) {
            let p = arg as *const c_int;
            if p.is_null() {
                return fail(libc::EFAULT);
            }
            // SAFETY: FIONBIO takes an int* the program passed.
            let on = unsafe { p.read_unaligned() } != 0;
            h.set(on);
            if fell_back_meanwhile(fd, &h) {
                // SAFETY: the program's arguments, passed on.
                return unsafe { real::ioctl(fd, request, arg) };
            }
            return 0;
        }
    }
    if let Some(h) = own_stream(fd) {
        let value = protect(
            "ioctl",
            || match request {
                libc::FIONREAD => {
                    Some(c_int::try_from(h.endpoint.fionread()).unwrap_or(c_int::MAX))
                }
                SIOCATMARK => Some(c_int::from(h.endpoint.at_mark())),
                _ => None,
            },
            || None,
        );
        if let Some(v) = value {
            let out = arg as *mut c_int;
            if out.is_null() {
                return fail(libc::EFAULT);
            }
            // SAFETY: both requests take an int* the program passed.
            unsafe { out.write_unaligned(v) };
            return 0;
        }
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::ioctl(fd, request, arg) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *mut c_void,
    len: *mut socklen_t,
) -> c_int {
    if let Some(h) = own_stream(fd) {
        if val.is_null() || len.is_null() {
            return fail(libc::EFAULT);
        }
        if level == libc::SOL_SOCKET && name == libc::SO_ERROR {
            if let Some(e) = protect("getsockopt", || h.endpoint.take_error(), || None) {
                // SAFETY: the program's (val, len) pair; we write at most
                // *len bytes.
                unsafe {
                    let bytes = e.to_ne_bytes();
                    let n = (*len as usize).min(bytes.len());
                    std::ptr::copy_nonoverlapping(bytes.as_ptr(), val.cast(), n);
                    *len = n as socklen_t;
                }
                return 0;
            }
        }
        // SAFETY: the program's (val, *len) buffer.
        let buf = unsafe { std::slice::from_raw_parts_mut(val.cast::<u8>(), *len as usize) };
        match protect(
            "getsockopt",
            || h.endpoint.getsockopt(level, name, buf),
            || None,
        ) {
            Some(Ok(n)) => {
                // SAFETY: len is valid (checked above).
                unsafe { *len = n as socklen_t };
                return 0;
            }
            Some(Err(e)) => return fail(e),
            None => {}
        }
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::getsockopt(fd, level, name, val, len) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn setsockopt(
    fd: c_int,
    level: c_int,
    name: c_int,
    val: *const c_void,
    len: socklen_t,
) -> c_int {
    // The kernel socket always gets the option, so a fallback keeps it.
    // SAFETY: the program's arguments, passed on.
    let r = unsafe { real::setsockopt(fd, level, name, val, len) };
    if r == 0 && !val.is_null() && table::is_managed(fd) {
        if let Some(_g) = Guard::enter() {
            let _errno = SavedErrno::save();
            // SAFETY: the kernel just read `len` bytes at `val`.
            let bytes = unsafe { std::slice::from_raw_parts(val.cast::<u8>(), len as usize) };
            protect(
                "setsockopt",
                || {
                    table::update(fd, |e| e.record_opt(level, name, bytes));
                    // A buffer size or timeout set on a listener after
                    // `listen`: its hidden SDP listener takes it too, for
                    // the connections it passes on from now on, as the
                    // kernel's does.
                    let passed_on = crate::backend::listener::passed_on(level, name);
                    if let Some(q) = passed_on
                        .then(|| table::listener(fd).and_then(|h| h.listener.queue_fd()))
                        .flatten()
                    {
                        // SAFETY: the value the kernel just took, on the
                        // library's own socket.
                        unsafe { real::setsockopt(q, level, name, val, len) };
                    }
                },
                || (),
            );
        }
    }
    if r == 0 && !val.is_null() {
        if let Some(h) = own_stream(fd) {
            if level == libc::SOL_SOCKET {
                // Perhaps a timeout: read again at the next blocking call.
                for t in &h.timeouts {
                    t.store(table::TIMEOUT_UNKNOWN, Ordering::Relaxed);
                }
            }
            // SAFETY: the kernel just read `len` bytes at `val`.
            let bytes = unsafe { std::slice::from_raw_parts(val.cast::<u8>(), len as usize) };
            let answer = protect(
                "setsockopt",
                || h.endpoint.setsockopt(level, name, bytes),
                || Ok(()),
            );
            if let Err(e) = answer {
                return fail(e);
            }
        }
    }
    r
}

/// On an SDP fd, the addresses TCP would report (an accepted SDP connection
/// arrived on the hidden port Q but reports the listening port P; a client
/// reports the address it connected to, not the SDP port's).
unsafe fn name_common(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, peer: bool) -> c_int {
    if table::is_sdp(fd) {
        if let Some(e) = table::get(fd) {
            if let Some(a) = if peer { e.peer } else { e.local } {
                if addr.is_null() || len.is_null() {
                    return fail(libc::EFAULT);
                }
                // SAFETY: the program's (addr, len) pair.
                unsafe { write_sockaddr(a, addr, len) };
                return 0;
            }
        }
    }
    // SAFETY: the program's arguments, passed on.
    unsafe {
        if peer {
            real::getpeername(fd, addr, len)
        } else {
            real::getsockname(fd, addr, len)
        }
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the program's arguments.
    unsafe { name_common(fd, addr, len, false) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the program's arguments.
    unsafe { name_common(fd, addr, len, true) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::*;
    use std::time::Duration;

    /// The engine's own socket calls on a stream's socket (its
    /// `getsockopt(TCP_MAXSEG)` as it sends, made while it holds the
    /// stream's lock) go to the kernel even while a `fork` has the gate
    /// closed: the fork waits for that lock, so a call waiting at the
    /// gate would never end (found by the soak: the progress thread and
    /// a forking thread each waiting for the other).
    #[test]
    fn a_library_threads_socket_calls_pass_a_closed_fork_gate() {
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        table::fork_prepare();
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            guard::library_thread();
            let mut ty: c_int = 0;
            let mut len = std::mem::size_of::<c_int>() as socklen_t;
            // SAFETY: a local int and its length.
            let r = unsafe {
                getsockopt(
                    app,
                    libc::SOL_SOCKET,
                    libc::SO_TYPE,
                    (&mut ty as *mut c_int).cast(),
                    &mut len,
                )
            };
            // SAFETY: plain calls on a socket this test owns.
            let keepalive = unsafe {
                let one: c_int = 1;
                setsockopt(
                    app,
                    libc::SOL_SOCKET,
                    libc::SO_KEEPALIVE,
                    (&one as *const c_int).cast(),
                    std::mem::size_of::<c_int>() as socklen_t,
                )
            };
            let _ = done.send((r, ty, keepalive));
        });
        let got = finished.recv_timeout(Duration::from_secs(10));
        table::fork_done();
        assert_eq!(
            got,
            Ok((0, libc::SOCK_STREAM, 0)),
            "the calls waited at the fork gate"
        );
        uninstall(app);
    }
}
