//! Socket addresses between the C layout and `std`, and the socket
//! queries the preload makes for itself (`errno` kept).

use super::errno::SavedErrno;
use super::real;
use libc::{c_int, sockaddr, socklen_t};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// `socket(AF_INET_SDP, ...)`: libsdp's address family that forces SDP.
pub const AF_INET_SDP: c_int = 27;

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
