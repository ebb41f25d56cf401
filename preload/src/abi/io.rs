//! Data hooks: `read`, `write`, `recv*`, `send*`, `sendfile`, `splice`
//! and their `_chk` variants.
//!
//! On an SDP fd a hook decodes the program's call into one call of the
//! endpoint, which has the socket semantics (DESIGN §7 "Who owns
//! blocking"): the fd's `O_NONBLOCK` and `MSG_DONTWAIT` and its
//! `SO_RCVTIMEO` / `SO_SNDTIMEO` become the call's [`Block`]; the flags
//! `MSG_WAITALL`, `MSG_PEEK`, `MSG_OOB` and `MSG_MORE` go with it; the
//! result comes back as the return value and `errno`, and `EPIPE` raises
//! `SIGPIPE` unless `MSG_NOSIGNAL`.
#![allow(clippy::missing_safety_doc)]

use super::protect;
use crate::sdp::{Block, Errno, RecvFlags, SendFlags};
use crate::sys::errno::{fail, SavedErrno};
use crate::sys::guard::Guard;
use crate::sys::real;
use crate::table::{self, StreamHandle};
use libc::{
    c_int, c_uint, c_void, iovec, loff_t, mmsghdr, msghdr, off_t, size_t, sockaddr, socklen_t,
    ssize_t, timespec,
};
use std::cell::RefCell;
use std::io::{IoSlice, IoSliceMut};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Where a data call on `fd` goes: the SDP endpoint, when there is one
/// and this thread is not already inside the preload. One relaxed load
/// while no fd is SDP.
#[inline]
fn sdp_stream(fd: c_int) -> Route {
    if table::no_sdp() {
        return Route::Kernel;
    }
    let Some(g) = Guard::enter() else {
        // A signal handler that interrupted this thread inside the preload
        // (or the preload itself, which never uses an SDP fd number): the
        // kernel socket carries the SDP byte stream, so the call must not
        // go there, and the endpoint is busy on this very thread.
        return if table::is_sdp(fd) {
            Route::Reentrant
        } else {
            Route::Kernel
        };
    };
    match table::stream(fd) {
        Some(h) => Route::Sdp(h, g),
        None => Route::Kernel,
    }
}

/// Where a data call goes.
enum Route {
    /// The SDP endpoint (with the guard held).
    Sdp(Arc<StreamHandle>, Guard),
    /// An SDP fd used re-entrantly (from a signal handler): `EINTR`.
    Reentrant,
    /// Not SDP: the C library.
    Kernel,
}

/// A program buffer as a slice (`None`: null with a length, `EFAULT`).
unsafe fn buf_mut<'a>(p: *mut c_void, n: size_t) -> Option<&'a mut [u8]> {
    if n == 0 {
        return Some(&mut []);
    }
    // SAFETY: the program vouches for n bytes at p (non-null checked).
    (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), n) })
}

unsafe fn buf<'a>(p: *const c_void, n: size_t) -> Option<&'a [u8]> {
    if n == 0 {
        return Some(&[]);
    }
    // SAFETY: as in buf_mut.
    (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts(p.cast::<u8>(), n) })
}

/// The program's iovec array as slices (`Err`: the errno the kernel gives).
unsafe fn iovs_mut<'a>(iov: *const iovec, n: usize) -> Result<Vec<IoSliceMut<'a>>, Errno> {
    if n > libc::UIO_MAXIOV as usize {
        return Err(libc::EINVAL);
    }
    if n > 0 && iov.is_null() {
        return Err(libc::EFAULT);
    }
    (0..n)
        .map(|i| {
            // SAFETY: the program's array of n iovecs.
            let v = unsafe { *iov.add(i) };
            // SAFETY: each iovec describes program memory.
            unsafe { buf_mut(v.iov_base, v.iov_len) }
                .map(IoSliceMut::new)
                .ok_or(libc::EFAULT)
        })
        .collect()
}

unsafe fn iovs<'a>(iov: *const iovec, n: usize) -> Result<Vec<IoSlice<'a>>, Errno> {
    if n > libc::UIO_MAXIOV as usize {
        return Err(libc::EINVAL);
    }
    if n > 0 && iov.is_null() {
        return Err(libc::EFAULT);
    }
    (0..n)
        .map(|i| {
            // SAFETY: as in iovs_mut.
            let v = unsafe { *iov.add(i) };
            // SAFETY: as in iovs_mut.
            unsafe { buf(v.iov_base, v.iov_len) }
                .map(IoSlice::new)
                .ok_or(libc::EFAULT)
        })
        .collect()
}

/// `SO_RCVTIMEO` / `SO_SNDTIMEO` of an SDP fd (`None`: wait forever),
/// from `h`'s copy once read.
fn timeout(fd: c_int, h: &StreamHandle, name: c_int) -> Option<Duration> {
    let slot = &h.timeouts[usize::from(name == libc::SO_SNDTIMEO)];
    let ns = match slot.load(Ordering::Relaxed) {
        table::TIMEOUT_UNKNOWN => {
            let t = kernel_timeout(fd, name).map_or(0, |t| t.as_nanos() as u64);
            slot.store(t, Ordering::Relaxed);
            t
        }
        t => t,
    };
    (ns != 0).then(|| Duration::from_nanos(ns))
}

/// `SO_RCVTIMEO` / `SO_SNDTIMEO` as the kernel socket has it.
pub(super) fn kernel_timeout(fd: c_int, name: c_int) -> Option<Duration> {
    let _errno = SavedErrno::save();
    let mut tv = libc::timeval {
        tv_sec: 0,
        tv_usec: 0,
    };
    let mut len = std::mem::size_of::<libc::timeval>() as socklen_t;
    // SAFETY: tv/len describe a local timeval.
    let r = unsafe {
        real::getsockopt(
            fd,
            libc::SOL_SOCKET,
            name,
            (&mut tv as *mut libc::timeval).cast(),
            &mut len,
        )
    };
    if r != 0 || (tv.tv_sec == 0 && tv.tv_usec == 0) {
        return None;
    }
    Some(Duration::new(
        tv.tv_sec.max(0) as u64,
        (tv.tv_usec.clamp(0, 999_999) * 1000) as u32,
    ))
}

/// The call's [`Block`]: never with `MSG_DONTWAIT` or `O_NONBLOCK`, else
/// until the socket's timeout `name` (`SO_RCVTIMEO`, `SO_SNDTIMEO`).
fn block(fd: c_int, h: &StreamHandle, flags: c_int, name: c_int) -> Block {
    if flags & libc::MSG_DONTWAIT != 0 || h.nonblock.load(Ordering::Relaxed) {
        Block::Never
    } else {
        Block::within(timeout(fd, h, name))
    }
}

/// A receive on an SDP fd with the program's `flags`. A panic in the
/// endpoint fails the call with `EIO` instead of unwinding into C.
pub fn sdp_recv(fd: c_int, h: &StreamHandle, bufs: &mut [IoSliceMut<'_>], flags: c_int) -> ssize_t {
    protect(
        "recv",
        || {
            let rflags = RecvFlags {
                peek: flags & libc::MSG_PEEK != 0,
                oob: flags & libc::MSG_OOB != 0,
                waitall: flags & libc::MSG_WAITALL != 0,
            };
            let block = block(fd, h, flags, libc::SO_RCVTIMEO);
            // A blocked call uses the connection (a fork leaves it to this
            // process).
            let _watch = (block != Block::Never).then(|| h.watch());
            match h.endpoint.recv(bufs, rflags, block) {
                Ok(n) => n as ssize_t,
                Err(e) => fail(e),
            }
        },
        || fail(libc::EIO),
    )
}

/// A send on an SDP fd with the program's `flags` (a panic: `EIO`).
pub fn sdp_send(fd: c_int, h: &StreamHandle, bufs: &mut [IoSlice<'_>], flags: c_int) -> ssize_t {
    protect(
        "send",
        || {
            let sflags = SendFlags {
                oob: flags & libc::MSG_OOB != 0,
                more: flags & libc::MSG_MORE != 0,
            };
            let block = block(fd, h, flags, libc::SO_SNDTIMEO);
            let _watch = (block != Block::Never).then(|| h.watch());
            match h.endpoint.send(bufs, sflags, block) {
                Ok(n) => n as ssize_t,
                Err(libc::EPIPE) if flags & libc::MSG_NOSIGNAL == 0 => {
                    // As the kernel does: SIGPIPE to the sending thread.
                    // SAFETY: signalling the calling thread.
                    unsafe { libc::pthread_kill(libc::pthread_self(), libc::SIGPIPE) };
                    fail(libc::EPIPE)
                }
                Err(e) => fail(e),
            }
        },
        || fail(libc::EIO),
    )
}

unsafe fn recv_one(
    fd: c_int,
    h: &StreamHandle,
    p: *mut c_void,
    n: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the program's buffer.
    match unsafe { buf_mut(p, n) } {
        Some(b) => sdp_recv(fd, h, &mut [IoSliceMut::new(b)], flags),
        None => fail(libc::EFAULT),
    }
}

unsafe fn send_one(
    fd: c_int,
    h: &StreamHandle,
    p: *const c_void,
    n: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the program's buffer.
    match unsafe { buf(p, n) } {
        Some(b) => sdp_send(fd, h, &mut [IoSlice::new(b)], flags),
        None => fail(libc::EFAULT),
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn read(fd: c_int, p: *mut c_void, n: size_t) -> ssize_t {
    let route = sdp_stream(fd);
    if let Route::Reentrant = route {
        return fail(libc::EINTR);
    }
    if let Route::Sdp(h, _g) = route {
        // SAFETY: the program's buffer.
        return unsafe { recv_one(fd, &h, p, n, 0) };
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::read(fd, p, n) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    p: *mut c_void,
    n: size_t,
    buflen: size_t,
) -> ssize_t {
    if n <= buflen {
        let route = sdp_stream(fd);
        if let Route::Reentrant = route {
            return fail(libc::EINTR);
        }
        if let Route::Sdp(h, _g) = route {
            // SAFETY: the program's buffer, n <= its size.
            return unsafe { recv_one(fd, &h, p, n, 0) };
        }
    }
    // SAFETY: the program's arguments; the C library aborts on overflow.
    unsafe { real::__read_chk(fd, p, n, buflen) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    let route = sdp_stream(fd);
    if let Route::Reentrant = route {
        return fail(libc::EINTR);
    }
    if let Route::Sdp(h, _g) = route {
        // SAFETY: the program's iovec array.
        return match unsafe { iovs_mut(iov, usize::try_from(n).unwrap_or(usize::MAX)) } {
            Ok(mut v) => sdp_recv(fd, &h, &mut v, 0),
            Err(e) => fail(e),
        };
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::readv(fd, iov, n) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recv(fd: c_int, p: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    let route = sdp_stream(fd);
    if let Route::Reentrant = route {
        return fail(libc::EINTR);
    }
    if let Route::Sdp(h, _g) = route {
        // SAFETY: the program's buffer.
        return unsafe { recv_one(fd, &h, p, n, flags) };
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::recv(fd, p, n, flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    p: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
) -> ssize_t {
    if n <= buflen {
        let route = sdp_stream(fd);
        if let Route::Reentrant = route {
            return fail(libc::EINTR);
        }
        if let Route::Sdp(h, _g) = route {
            // SAFETY: the program's buffer, n <= its size.
            return unsafe { recv_one(fd, &h, p, n, flags) };
        }
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::__recv_chk(fd, p, n, buflen, flags) }
}

/// A stream socket reports no source address: `*len = 0`, as Linux TCP.
unsafe fn no_source(len: *mut socklen_t) {
    if !len.is_null() {
        // SAFETY: the program's length pointer.
        unsafe { *len = 0 };
    }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    p: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    let route = sdp_stream(fd);
    if let Route::Reentrant = route {
        return fail(libc::EINTR);
    }
    if let Route::Sdp(h, _g) = route {
        // SAFETY: the program's buffers.
        let r = unsafe { recv_one(fd, &h, p, n, flags) };
        if r >= 0 && !addr.is_null() {
            // SAFETY: as above.
            unsafe { no_source(len) };
        }
        return r;
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::recvfrom(fd, p, n, flags, addr, len) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    p: *mut c_void,
    n: size_t,
    buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    if n <= buflen && !table::no_sdp() && table::is_sdp(fd) {
        // SAFETY: the program's arguments, n <= the buffer's size.
        return unsafe { recvfrom(fd, p, n, flags, addr, len) };
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::__recvfrom_chk(fd, p, n, buflen, flags, addr, len) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    let route = sdp_stream(fd);
    if let Route::Reentrant = route {
        return fail(libc::EINTR);
    }
    if let Route::Sdp(h, _g) = route {
        if msg.is_null() {
            return fail(libc::EFAULT);
        }
        // SAFETY: the program's msghdr.
        let m = unsafe { &mut *msg };
        // SAFETY: its iovec array.
        let r = match unsafe { iovs_mut(m.msg_iov, m.msg_iovlen) } {
            Ok(mut v) => sdp_recv(fd, &h, &mut v, flags),
            Err(e) => fail(e),
        };
        if r >= 0 {
            m.msg_namelen = 0;
            m.msg_controllen = 0;
            m.msg_flags = 0;
        }
        return r;
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::recvmsg(fd, msg, flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgs: *mut mmsghdr,
    n: c_uint,
    flags: c_int,
    timeout: *mut timespec,
) -> c_int {
    if !table::no_sdp() && table::is_sdp(fd) {
        // A stream socket: one message is all a sensible program asks for.
        if n == 0 {
            return 0;
        }
        if msgs.is_null() {
            return fail(libc::EFAULT);
        }
        // SAFETY: the program's first mmsghdr.
        let r = unsafe { recvmsg(fd, &mut (*msgs).msg_hdr, flags & !libc::MSG_WAITFORONE) };
        if r < 0 {
            return -1;
        }
        // SAFETY: as above.
        unsafe { (*msgs).msg_len = r as c_uint };
        return 1;
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::recvmmsg(fd, msgs, n, flags, timeout) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn write(fd: c_int, p: *const c_void, n: size_t) -> ssize_t {
    let route = sdp_stream(fd);
    if let Route::Reentrant = route {
        return fail(libc::EINTR);
    }
    if let Route::Sdp(h, _g) = route {
        // SAFETY: the program's buffer.
        return unsafe { send_one(fd, &h, p, n, 0) };
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::write(fd, p, n) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, n: c_int) -> ssize_t {
    let route = sdp_stream(fd);
    if let Route::Reentrant = route {
        return fail(libc::EINTR);
    }
    if let Route::Sdp(h, _g) = route {
        // SAFETY: the program's iovec array.
        return match unsafe { iovs(iov, usize::try_from(n).unwrap_or(usize::MAX)) } {
            Ok(mut v) => sdp_send(fd, &h, &mut v, 0),
            Err(e) => fail(e),
        };
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::writev(fd, iov, n) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn send(fd: c_int, p: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    let route = sdp_stream(fd);
    if let Route::Reentrant = route {
        return fail(libc::EINTR);
    }
    if let Route::Sdp(h, _g) = route {
        // SAFETY: the program's buffer.
        return unsafe { send_one(fd, &h, p, n, flags) };
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::send(fd, p, n, flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    p: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    let route = sdp_stream(fd);
    if let Route::Reentrant = route {
        return fail(libc::EINTR);
    }
    if let Route::Sdp(h, _g) = route {
        // A connected stream socket ignores the address (Linux TCP does,
        // unless it is TCP Fast Open, which the preload does not offer).
        // SAFETY: the program's buffer.
        return unsafe { send_one(fd, &h, p, n, flags) };
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::sendto(fd, p, n, flags, addr, len) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    let route = sdp_stream(fd);
    if let Route::Reentrant = route {
        return fail(libc::EINTR);
    }
    if let Route::Sdp(h, _g) = route {
        if msg.is_null() {
            return fail(libc::EFAULT);
        }
        // SAFETY: the program's msghdr and its iovec array.
        return match unsafe { iovs((*msg).msg_iov, (*msg).msg_iovlen) } {
            Ok(mut v) => sdp_send(fd, &h, &mut v, flags),
            Err(e) => fail(e),
        };
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::sendmsg(fd, msg, flags) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendmmsg(fd: c_int, msgs: *mut mmsghdr, n: c_uint, flags: c_int) -> c_int {
    if !table::no_sdp() && table::is_sdp(fd) {
        let mut sent = 0;
        while sent < n {
            // SAFETY: the program's array of n mmsghdrs.
            let m = unsafe { &mut *msgs.add(sent as usize) };
            // SAFETY: as above.
            let r = unsafe { sendmsg(fd, &m.msg_hdr, flags) };
            if r < 0 {
                return if sent > 0 { sent as c_int } else { -1 };
            }
            m.msg_len = r as c_uint;
            sent += 1;
        }
        return sent as c_int;
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::sendmmsg(fd, msgs, n, flags) }
}

/// The most `sendfile` to an SDP fd reads from the file at a time.
const SENDFILE_CHUNK: usize = 128 * 1024;

thread_local! {
    /// The buffer `sendfile` to an SDP fd reads the file into, and
    /// `splice` moves its bytes through: the thread's, kept from call to
    /// call (a fresh zeroed one a call cost a web server a page-sized
    /// `memset` per response, and `mmap` and `munmap` beyond glibc's
    /// threshold).
    static SENDFILE_BUF: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with the thread's buffer ([`SENDFILE_BUF`]) of at least `len`
/// bytes. The guard the calling hook holds keeps a signal handler's call
/// on an SDP fd out (EINTR), so the buffer is never in use here already;
/// a thread that is exiting gets a fresh one.
fn with_thread_buf<R>(len: usize, f: impl Fn(&mut [u8]) -> R) -> R {
    let run = |b: &mut Vec<u8>| {
        if b.len() < len {
            b.resize(len, 0);
        }
        f(&mut b[..len])
    };
    SENDFILE_BUF
        .try_with(|b| b.try_borrow_mut().ok().map(|mut b| run(&mut b)))
        .ok()
        .flatten()
        .unwrap_or_else(|| run(&mut Vec::new()))
}

/// `sendfile` to an SDP fd: read from the file, send on SDP. With no
/// `offset` the file's own position moves by what was sent, and only
/// that: bytes read that the socket did not take (a nonblocking socket
/// that is full, an error) are given back to the file.
unsafe fn sdp_sendfile(
    out: c_int,
    h: &StreamHandle,
    input: c_int,
    offset: *mut off_t,
    n: size_t,
) -> ssize_t {
    with_thread_buf(n.min(SENDFILE_CHUNK), |chunk| {
        // SAFETY: the program's arguments.
        unsafe { sendfile_through(out, h, input, offset, n, chunk) }
    })
}

/// [`sdp_sendfile`] through `chunk`.
unsafe fn sendfile_through(
    out: c_int,
    h: &StreamHandle,
    input: c_int,
    offset: *mut off_t,
    n: size_t,
    chunk: &mut [u8],
) -> ssize_t {
    let mut done: usize = 0;
    while done < n {
        let want = (n - done).min(chunk.len());
        // SAFETY: chunk has `want` bytes; offset is the program's or null.
        let got = unsafe {
            if offset.is_null() {
                real::read(input, chunk.as_mut_ptr().cast(), want)
            } else {
                libc::pread(input, chunk.as_mut_ptr().cast(), want, *offset)
            }
        };
        if got < 0 {
            return if done > 0 { done as ssize_t } else { -1 };
        }
        if got == 0 {
            break;
        }
        let got = got as usize;
        let sent = sdp_send(out, h, &mut [IoSlice::new(&chunk[..got])], 0);
        let taken = sent.max(0) as usize;
        if offset.is_null() {
            if taken < got {
                // Give back what the socket did not take (the send's
                // errno stays the call's).
                let _errno = SavedErrno::save();
                // SAFETY: seeking the program's input file back.
                unsafe { libc::lseek(input, taken as off_t - got as off_t, libc::SEEK_CUR) };
            }
        } else {
            // SAFETY: the program's offset.
            unsafe { *offset += taken as off_t };
        }
        if sent < 0 {
            return if done > 0 { done as ssize_t } else { -1 };
        }
        done += taken;
        if taken < got {
            break;
        }
    }
    done as ssize_t
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendfile(
    out: c_int,
    input: c_int,
    offset: *mut off_t,
    n: size_t,
) -> ssize_t {
    let route = sdp_stream(out);
    if let Route::Reentrant = route {
        return fail(libc::EINTR);
    }
    if let Route::Sdp(h, _g) = route {
        // SAFETY: the program's arguments.
        return unsafe { sdp_sendfile(out, &h, input, offset, n) };
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::sendfile(out, input, offset, n) }
}

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn sendfile64(
    out: c_int,
    input: c_int,
    offset: *mut off_t,
    n: size_t,
) -> ssize_t {
    let route = sdp_stream(out);
    if let Route::Reentrant = route {
        return fail(libc::EINTR);
    }
    if let Route::Sdp(h, _g) = route {
        // SAFETY: the program's arguments.
        return unsafe { sdp_sendfile(out, &h, input, offset, n) };
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::sendfile64(out, input, offset, n) }
}

/// The most `splice` moves to or from an SDP fd in one call: a pipe's
/// default capacity.
const SPLICE_CHUNK: usize = 64 * 1024;

#[cfg_attr(not(test), no_mangle)]
pub unsafe extern "C" fn splice(
    fd_in: c_int,
    off_in: *mut loff_t,
    fd_out: c_int,
    off_out: *mut loff_t,
    n: size_t,
    flags: c_uint,
) -> ssize_t {
    // The kernel would move the bytes to or from the socket as they are,
    // in the middle of SDP's messages: they go through the endpoint.
    if n == 0 {
        return 0;
    }
    match sdp_stream(fd_out) {
        Route::Reentrant => return fail(libc::EINTR),
        Route::Sdp(h, _g) => {
            return match splice_check(fd_in, false, off_in, off_out, flags) {
                Err(e) => fail(e),
                // SAFETY: the program's arguments.
                Ok(_) => unsafe { splice_to_sdp(fd_in, fd_out, &h, n, flags) },
            };
        }
        Route::Kernel => {}
    }
    match sdp_stream(fd_in) {
        Route::Reentrant => return fail(libc::EINTR),
        Route::Sdp(h, _g) => {
            return match splice_check(fd_out, true, off_out, off_in, flags) {
                Err(e) => fail(e),
                // SAFETY: the program's arguments.
                Ok(fl) => unsafe { splice_from_sdp(fd_in, &h, fd_out, fl, n, flags) },
            };
        }
        Route::Kernel => {}
    }
    // SAFETY: the program's arguments, passed on.
    unsafe { real::splice(fd_in, off_in, fd_out, off_out, n, flags) }
}

/// The kernel's checks of a `splice` between a socket and `pipe`, in its
/// order (fs/splice.c): unknown flags EINVAL; `pipe` not open (EBADF), not
/// a pipe (EINVAL: neither end is one), with an offset (ESPIPE), not open
/// the way the bytes go (`write`: the bytes go into it; EBADF); an offset
/// on the socket's end EINVAL. The pipe's file flags when all hold.
fn splice_check(
    pipe: c_int,
    write: bool,
    pipe_off: *mut loff_t,
    socket_off: *mut loff_t,
    flags: c_uint,
) -> Result<c_int, Errno> {
    const SPLICE_F_ALL: c_uint =
        libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MORE | libc::SPLICE_F_GIFT;
    if flags & !SPLICE_F_ALL != 0 {
        return Err(libc::EINVAL);
    }
    let _errno = SavedErrno::save();
    // SAFETY: a zeroed stat for fstat to fill.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is a local stat; F_GETFL takes no argument.
    let (r, fl) = unsafe {
        (
            libc::fstat(pipe, &mut st),
            real::fcntl(pipe, libc::F_GETFL, 0),
        )
    };
    if r != 0 || fl < 0 {
        return Err(libc::EBADF);
    }
    let mode = fl & libc::O_ACCMODE;
    if st.st_mode & libc::S_IFMT != libc::S_IFIFO {
        Err(libc::EINVAL)
    } else if !pipe_off.is_null() {
        Err(libc::ESPIPE)
    } else if mode
        == if write {
            libc::O_RDONLY
        } else {
            libc::O_WRONLY
        }
    {
        Err(libc::EBADF)
    } else if !socket_off.is_null() {
        Err(libc::EINVAL)
    } else {
        Ok(fl)
    }
}

/// A pipe of the library's own, for one `splice` (closed on drop).
struct OwnPipe {
    r: c_int,
    w: c_int,
}

impl OwnPipe {
    fn new() -> Option<OwnPipe> {
        let mut fds = [0 as c_int; 2];
        // SAFETY: a local array of two fds.
        (unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } == 0).then_some(OwnPipe {
            r: fds[0],
            w: fds[1],
        })
    }
}

impl Drop for OwnPipe {
    fn drop(&mut self) {
        let _errno = SavedErrno::save();
        // SAFETY: our own two fds, closed once.
        unsafe {
            real::close(self.r);
            real::close(self.w);
        }
    }
}

/// The kernel's `splice` of up to `n` bytes from pipe `from` to pipe `to`
/// (no offsets: pipes have none).
fn pipe_to_pipe(from: c_int, to: c_int, n: usize, flags: c_uint) -> ssize_t {
    let none = std::ptr::null_mut();
    // SAFETY: two descriptors and null offsets; the kernel checks the rest.
    unsafe { real::splice(from, none, to, none, n, flags) }
}

/// `splice` from the pipe `pipe` to the SDP fd `out`: the pipe's bytes are
/// copied into a pipe of our own with `tee` (not yet taken from the
/// program's), read and sent; then exactly what the stream took moves
/// from the program's pipe to ours, which is dropped. The kernel's splice
/// also leaves in the pipe what the socket did not take. (A pipe that
/// another reader empties meanwhile is not the program's to splice from
/// alone; the move then takes what is left, and says so in the log.)
unsafe fn splice_to_sdp(
    pipe: c_int,
    out: c_int,
    h: &StreamHandle,
    n: size_t,
    flags: c_uint,
) -> ssize_t {
    let Some(own) = OwnPipe::new() else {
        return -1;
    };
    with_thread_buf(n.min(SPLICE_CHUNK), |buf| {
        // SAFETY: our pipe's write end; the wait for the program's pipe
        // is its splice's (SPLICE_F_NONBLOCK, or the pipe's O_NONBLOCK,
        // which `tee` honours too).
        let got = unsafe { libc::tee(pipe, own.w, buf.len(), flags & libc::SPLICE_F_NONBLOCK) };
        if got <= 0 {
            return got;
        }
        // SAFETY: `got` bytes wait in our pipe; buf has room for them.
        let read = unsafe { real::read(own.r, buf.as_mut_ptr().cast(), got as usize) };
        if read != got {
            return fail(libc::EIO);
        }
        let more = if flags & libc::SPLICE_F_MORE != 0 {
            libc::MSG_MORE
        } else {
            0
        };
        let sent = sdp_send(out, h, &mut [IoSlice::new(&buf[..got as usize])], more);
        if sent > 0 {
            let _errno = SavedErrno::save();
            // The program's pipe to our (empty) one: an exact count,
            // whatever the pipe's packet mode.
            let taken = pipe_to_pipe(pipe, own.w, sent as usize, libc::SPLICE_F_NONBLOCK);
            if taken != sent {
                crate::log!(
                    crate::log::Level::Warn,
                    "fd {out}: splice: {sent} bytes sent, {taken} taken from the pipe (another reader?)"
                );
            }
        }
        sent
    })
}

/// `splice` from the SDP fd `input` to the pipe `pipe` (file flags `fl`):
/// the stream's bytes are peeked, written to a pipe of our own and
/// spliced from it into the program's (the kernel's pipe-to-pipe move
/// waits, or not, as the program's splice would, and raises EPIPE); then
/// exactly what the program's pipe took is read from the stream. (Pages
/// of our buffer are never lent to the program's pipe: `vmsplice` would
/// leave them there, to change under a later call.)
unsafe fn splice_from_sdp(
    input: c_int,
    h: &StreamHandle,
    pipe: c_int,
    fl: c_int,
    n: size_t,
    flags: c_uint,
) -> ssize_t {
    if flags & libc::SPLICE_F_NONBLOCK != 0 || fl & libc::O_NONBLOCK != 0 {
        // The kernel looks for room in the pipe before it reads the
        // socket: a full pipe is EAGAIN, whether bytes came or not.
        let mut p = libc::pollfd {
            fd: pipe,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one local pollfd, no wait.
        unsafe { libc::poll(&mut p, 1, 0) };
        if p.revents & (libc::POLLOUT | libc::POLLERR) == 0 {
            return fail(libc::EAGAIN);
        }
    }
    let Some(own) = OwnPipe::new() else {
        return -1;
    };
    with_thread_buf(n.min(SPLICE_CHUNK), |buf| {
        let got = sdp_recv(input, h, &mut [IoSliceMut::new(buf)], libc::MSG_PEEK);
        if got <= 0 {
            return got;
        }
        // SAFETY: `got` bytes of buf into our empty pipe (what it takes
        // is what goes on).
        let staged = unsafe { real::write(own.w, buf.as_ptr().cast(), got as usize) };
        if staged <= 0 {
            return fail(libc::EIO);
        }
        let put = pipe_to_pipe(
            own.r,
            pipe,
            staged as usize,
            flags & (libc::SPLICE_F_NONBLOCK | libc::SPLICE_F_MORE),
        );
        if put > 0 {
            let _errno = SavedErrno::save();
            // What the pipe took leaves the stream (it is there: peeked).
            let taken = sdp_recv(
                input,
                h,
                &mut [IoSliceMut::new(&mut buf[..put as usize])],
                libc::MSG_DONTWAIT,
            );
            if taken != put {
                crate::log!(
                    crate::log::Level::Warn,
                    "fd {input}: splice: {put} bytes into the pipe, {taken} taken from the stream (another reader?)"
                );
            }
        }
        put
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::*;
    use std::time::Instant;

    #[test]
    fn recv_blocks_until_data_then_peeks_and_waits_for_all() {
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        // Data arrives from another thread while recv sleeps.
        let feeder = {
            let ep = ep.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(20));
                ep.deliver(b"hello ");
                ep.deliver(b"world");
            })
        };
        let mut buf = [0u8; 11];
        // SAFETY: a local buffer.
        let n = unsafe { recv(app, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_WAITALL) };
        feeder.join().unwrap();
        assert_eq!(n, 11);
        assert_eq!(&buf, b"hello world");

        ep.deliver(b"abc");
        let mut b = [0u8; 8];
        // SAFETY: a local buffer.
        let n = unsafe { recv(app, b.as_mut_ptr().cast(), 8, libc::MSG_PEEK) };
        assert_eq!(&b[..n as usize], b"abc");
        // SAFETY: a local buffer.
        let n = unsafe { read(app, b.as_mut_ptr().cast(), 8) };
        assert_eq!(&b[..n as usize], b"abc");
        // One call of the endpoint per program call, with its flags.
        let flags = |peek, waitall| RecvFlags {
            peek,
            oob: false,
            waitall,
        };
        let forever = Block::Until(None);
        assert_eq!(
            ep.calls(),
            [
                Call::Recv(flags(false, true), forever),
                Call::Recv(flags(true, false), forever),
                Call::Recv(flags(false, false), forever),
            ]
        );
        uninstall(app);
    }

    #[test]
    fn nonblocking_and_timeouts_give_eagain() {
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        let mut b = [0u8; 4];
        // SAFETY: a local buffer.
        let n = unsafe { recv(app, b.as_mut_ptr().cast(), 4, libc::MSG_DONTWAIT) };
        assert_eq!((n, real::errno()), (-1, libc::EAGAIN));
        // A blocking read with data there: no timeout yet (and the handle
        // keeps that), then the program sets one.
        ep.deliver(b"ab");
        // SAFETY: a local buffer.
        let n = unsafe { read(app, b.as_mut_ptr().cast(), 4) };
        assert_eq!(n, 2);
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 30_000,
        };
        // SAFETY: a local timeval; the hook, as the program would call it.
        let r = unsafe {
            super::super::socket::setsockopt(
                app,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as socklen_t,
            )
        };
        assert_eq!(r, 0);
        let start = Instant::now();
        // SAFETY: a local buffer.
        let n = unsafe { read(app, b.as_mut_ptr().cast(), 4) };
        assert_eq!((n, real::errno()), (-1, libc::EAGAIN));
        assert!(start.elapsed() >= Duration::from_millis(30));
        // MSG_DONTWAIT: never; then for ever; then until the timeout.
        let blocks: Vec<Block> = ep
            .calls()
            .into_iter()
            .map(|c| match c {
                Call::Recv(_, b) | Call::Send(b) => b,
            })
            .collect();
        assert!(
            matches!(
                blocks[..],
                [Block::Never, Block::Until(None), Block::Until(Some(d))]
                    if d >= start + Duration::from_millis(30)
                        && d <= start + Duration::from_secs(5)
            ),
            "{blocks:?}"
        );
        uninstall(app);
    }

    extern "C" fn ignore(_: c_int) {}

    #[test]
    fn a_signal_interrupts_a_blocked_recv_with_eintr() {
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        // SAFETY: a handler without SA_RESTART for SIGUSR2, which no other
        // test uses; an all-zero sigaction is valid before filling it.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = ignore as extern "C" fn(c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
        }
        // SAFETY: plain call.
        let me = unsafe { libc::pthread_self() };
        let kicker = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            // SAFETY: the test thread is alive: it waits for us in join().
            unsafe { libc::pthread_kill(me, libc::SIGUSR2) };
        });
        let mut b = [0u8; 4];
        // SAFETY: a local buffer.
        let n = unsafe { recv(app, b.as_mut_ptr().cast(), 4, 0) };
        let errno = real::errno();
        kicker.join().unwrap();
        assert_eq!((n, errno), (-1, libc::EINTR));
        uninstall(app);
    }

    #[test]
    fn send_takes_everything_blocking_and_raises_epipe() {
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        ep.set_send_room(3);
        install(app, ep.clone());
        let drainer = {
            let ep = ep.clone();
            std::thread::spawn(move || {
                for _ in 0..3 {
                    std::thread::sleep(Duration::from_millis(10));
                    ep.set_send_room(3);
                }
            })
        };
        let data = b"0123456789";
        // SAFETY: a local buffer.
        let n = unsafe { send(app, data.as_ptr().cast(), data.len(), 0) };
        drainer.join().unwrap();
        assert_eq!(n, 10);
        assert_eq!(ep.sent(), data.to_vec());

        ep.shut_write();
        // SAFETY: a local buffer; MSG_NOSIGNAL keeps the test alive.
        let n = unsafe { send(app, data.as_ptr().cast(), 1, libc::MSG_NOSIGNAL) };
        assert_eq!((n, real::errno()), (-1, libc::EPIPE));
        uninstall(app);
    }

    #[test]
    fn fionread_and_names_come_from_the_endpoint() {
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        ep.deliver(b"12345");
        let mut v: c_int = -1;
        // SAFETY: a local int.
        let r = unsafe {
            super::super::socket::ioctl(
                app,
                libc::FIONREAD,
                (&mut v as *mut c_int) as libc::c_ulong,
            )
        };
        assert_eq!((r, v), (0, 5));
        table::update(app, |e| e.peer = Some("10.1.2.3:5201".parse().unwrap()));
        // SAFETY: an all-zero sockaddr_storage is valid.
        let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let mut len = std::mem::size_of::<libc::sockaddr_storage>() as socklen_t;
        // SAFETY: local storage.
        let r = unsafe {
            super::super::socket::getpeername(
                app,
                (&mut ss as *mut libc::sockaddr_storage).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0);
        // SAFETY: getpeername wrote len bytes.
        let a = unsafe {
            crate::sys::addr::read_sockaddr((&ss as *const libc::sockaddr_storage).cast(), len)
        };
        assert_eq!(a, Some("10.1.2.3:5201".parse().unwrap()));
        uninstall(app);
    }

    #[test]
    fn connect_again_on_an_sdp_connection_answers_eisconn() {
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        table::update(app, |e| e.role = crate::table::SocketRole::Client);
        let raw = crate::sys::addr::RawAddr::new("127.0.0.1:9".parse().unwrap());
        // SAFETY: a complete local address.
        let r = unsafe { super::super::socket::connect(app, raw.as_ptr(), raw.len()) };
        assert_eq!((r, real::errno()), (-1, libc::EISCONN));
        ep.set_send_room(0);
        // SAFETY: as above.
        let r = unsafe { super::super::socket::connect(app, raw.as_ptr(), raw.len()) };
        assert_eq!((r, real::errno()), (-1, libc::EALREADY));
        uninstall(app);
    }

    #[test]
    fn a_reentrant_call_on_an_sdp_fd_fails_with_eintr_not_the_kernel() {
        let (app, peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        // Bytes on the kernel socket: the SDP stream, never the program's.
        // SAFETY: writing to our own socket.
        assert_eq!(unsafe { libc::write(peer, b"raw".as_ptr().cast(), 3) }, 3);
        ep.deliver(b"data");
        // As a signal handler running while this thread is in the preload.
        let inside = Guard::enter().unwrap();
        let mut b = [0u8; 8];
        // SAFETY: a local buffer.
        let n = unsafe { read(app, b.as_mut_ptr().cast(), 8) };
        assert_eq!((n, real::errno()), (-1, libc::EINTR));
        drop(inside);
        // SAFETY: a local buffer.
        let n = unsafe { read(app, b.as_mut_ptr().cast(), 8) };
        assert_eq!(&b[..n as usize], b"data");
        uninstall(app);
    }

    #[test]
    fn a_panicking_endpoint_fails_the_call_with_eio() {
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        ep.break_recv();
        let mut b = [0u8; 4];
        // SAFETY: a local buffer.
        let n = unsafe { recv(app, b.as_mut_ptr().cast(), 4, 0) };
        assert_eq!((n, real::errno()), (-1, libc::EIO));
        uninstall(app);
    }

    #[test]
    fn exit_flushes_each_endpoint_once() {
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        // SAFETY: duplicating our own fd.
        let copy = unsafe { super::super::socket::dup(app) };
        crate::abi::process::flush_all(Instant::now());
        assert_eq!(ep.flushes(), 1);
        uninstall(copy);
        uninstall(app);
    }

    #[test]
    fn close_of_the_last_dup_closes_the_endpoint_once() {
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        install(app, ep.clone());
        // SAFETY: duplicating our own fd.
        let copy = unsafe { super::super::socket::dup(app) };
        assert!(copy > app);
        assert!(table::is_sdp(copy));
        // SAFETY: closing our own fds.
        unsafe { super::super::socket::close(app) };
        assert_eq!(ep.closes(), 0);
        // SAFETY: as above.
        unsafe { super::super::socket::close(copy) };
        assert_eq!(ep.closes(), 1);
        assert!(!table::is_managed(copy));
    }

    /// `sendfile` to an SDP fd with no offset moves the file's position by
    /// the bytes the socket took and no further: a nonblocking socket that
    /// takes part of a chunk, then nothing (`EAGAIN`), leaves the rest of
    /// the file to the next call, and the stream is the file.
    #[test]
    fn sendfile_gives_back_to_the_file_what_the_socket_did_not_take() {
        use crate::table::{Entry, SdpSide, Transport};
        let (app, _peer) = socketpair();
        let ep = FakeEndpoint::new();
        let mut e = Entry::new(false, false);
        e.transport = Transport::Sdp;
        e.sdp = SdpSide::stream(ep.clone(), true);
        table::insert(app, e);
        let data: Vec<u8> = (0..300_000u32)
            .map(|i| (i % 251) as u8 ^ (i >> 8) as u8)
            .collect();
        // SAFETY: a name and no flags; the data is ours.
        let file = unsafe { libc::memfd_create(c"sendfile".as_ptr(), 0) };
        assert!(file >= 0);
        // SAFETY: our buffer, our file.
        let written = unsafe { libc::write(file, data.as_ptr().cast(), data.len()) };
        assert_eq!(written, 300_000);
        // SAFETY: our file.
        let position = || unsafe { libc::lseek(file, 0, libc::SEEK_CUR) };
        // SAFETY: our file.
        unsafe { libc::lseek(file, 0, libc::SEEK_SET) };

        ep.set_send_room(1000);
        // SAFETY: our descriptors, no offset.
        let n = unsafe { sendfile(app, file, std::ptr::null_mut(), data.len()) };
        assert_eq!((n, position()), (1000, 1000), "a part taken");

        ep.set_send_room(0);
        // SAFETY: as above.
        let n = unsafe { sendfile(app, file, std::ptr::null_mut(), data.len()) };
        let errno = std::io::Error::last_os_error().raw_os_error();
        assert_eq!(
            (n, errno, position()),
            (-1, Some(libc::EAGAIN), 1000),
            "nothing taken"
        );

        ep.set_send_room(usize::MAX);
        // SAFETY: as above.
        let n = unsafe { sendfile(app, file, std::ptr::null_mut(), data.len()) };
        assert_eq!((n, position()), (299_000, 300_000), "the rest, in chunks");
        assert!(ep.sent() == data, "the stream is not the file");
        uninstall(app);
        // SAFETY: our file.
        unsafe { libc::close(file) };
    }
}
