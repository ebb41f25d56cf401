//! Where the library's own descriptors go: high in the descriptor table,
//! out of the program's way.
//!
//! The library holds descriptors a TCP program does not: a connection's
//! own descriptor of its socket once the program closed its number and
//! the connection still finishes its close, the two ends of a readiness
//! socket pair once `poll` asks for it, an eventfd per epoll set and per
//! thread that waits on a stream.
//! Taking the lowest free numbers, as `socket`, `dup` and `eventfd` do,
//! they would push every descriptor the program opens next up the table:
//! a program that sizes a table by its connection count (an `ae` event
//! loop, `select`'s `FD_SETSIZE`) would see numbers it never sees over
//! TCP. [`high`] moves one to the top quarter of the soft `RLIMIT_NOFILE`
//! (while there is room there; otherwise it stays where it is), where a
//! program that names a number it never opened (to see `EBADF`, as
//! CPython's `test_epoll` does with 10 000 under a limit of 20 000) is
//! least likely to meet one.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicI32, Ordering};

use rustix::io::{fcntl_dupfd_cloexec, Errno};
use rustix::process::{getrlimit, Resource};

/// The lowest number [`high`] places at; 0 until first computed.
static FLOOR: AtomicI32 = AtomicI32::new(0);

fn floor() -> i32 {
    let f = FLOOR.load(Ordering::Relaxed);
    if f > 0 {
        return f;
    }
    let soft = getrlimit(Resource::Nofile).current.unwrap_or(1 << 20);
    let f = i32::try_from(soft - soft / 4)
        .unwrap_or(i32::MAX / 2)
        .max(3);
    FLOOR.store(f, Ordering::Relaxed);
    f
}

/// `fd` renumbered at or above the floor, close-on-exec; `fd` itself when
/// that fails (the top quarter is full, or the program lowered its limit).
pub fn high(fd: OwnedFd) -> OwnedFd {
    let f = floor();
    if rustix::fd::AsRawFd::as_raw_fd(&fd) >= f {
        return fd;
    }
    match fcntl_dupfd_cloexec(fd.as_fd(), f) {
        Ok(moved) => moved,
        Err(Errno::INVAL) => {
            // Below the floor now: computed again next time.
            FLOOR.store(0, Ordering::Relaxed);
            fd
        }
        Err(_) => fd,
    }
}

/// Whether `fd` is in the top quarter, where [`high`] places.
pub fn is_high(fd: BorrowedFd<'_>) -> bool {
    rustix::fd::AsRawFd::as_raw_fd(&fd) >= floor()
}

/// A duplicate of `fd` at or above the floor, close-on-exec, in one
/// system call; at the lowest free number when there is no room there.
pub fn dup_high(fd: BorrowedFd<'_>) -> std::io::Result<OwnedFd> {
    match fcntl_dupfd_cloexec(fd, floor()) {
        Ok(d) => Ok(d),
        Err(e) => {
            if e == Errno::INVAL {
                FLOOR.store(0, Ordering::Relaxed);
            }
            Ok(fd.try_clone_to_owned()?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_descriptor_moves_to_the_top_quarter_of_the_limit() {
        let fd = rustix::io::dup(std::io::stdin().as_fd()).unwrap();
        let moved = high(fd);
        let soft = getrlimit(Resource::Nofile).current.unwrap_or(1 << 20);
        assert!(
            moved.as_raw_fd() >= floor(),
            "{} with a limit of {soft}",
            moved.as_raw_fd()
        );
        assert!(u64::try_from(moved.as_raw_fd()).unwrap() < soft);
    }

    #[test]
    fn a_duplicate_goes_to_the_top_quarter_at_once() {
        use std::io::{Read, Write};
        let (a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        let d = dup_high(a.as_fd()).unwrap();
        assert!(d.as_raw_fd() >= floor(), "{}", d.as_raw_fd());
        // The same socket: what goes in through the duplicate comes out
        // at the other end.
        std::os::unix::net::UnixStream::from(d)
            .write_all(b"dup")
            .unwrap();
        let mut got = [0u8; 3];
        b.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"dup");
    }
}
