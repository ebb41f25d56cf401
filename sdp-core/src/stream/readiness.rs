//! The readiness descriptor of a stream: a file descriptor that poll(2),
//! epoll(7) and mio see readable exactly when a read would make progress
//! and writable exactly when a write would (DESIGN §6 "Readiness is
//! exact").
//!
//! The kernel socket cannot serve: it turns readable on protocol-only
//! traffic (credit updates) and stays quiet about data the link already
//! holds in its Private Buffers. An eventfd cannot either: it is writable
//! whenever its counter is below its maximum, so "neither readable nor
//! writable" — the common state of a bulk sender waiting for credits —
//! has no encoding. So the descriptor is one end (`user`) of a Unix stream
//! socket pair whose two states the library sets from the other end:
//!
//! * readable ⇔ one byte waits in `user`'s receive queue (written through
//!   `ours`; drained from `user` to clear);
//! * writable ⇔ `user`'s send buffer is not full. `user` has the smallest
//!   send buffer the kernel allows; one write from `user` fills it past
//!   the quarter below which a Unix socket polls writable (not writable), reading everything from `ours` empties it again
//!   (writable: the kernel wakes pollers when the space returns).
//!
//! Each transition costs one or two system calls, and is only done once a
//! caller has asked for the descriptor. The descriptor is for polling only:
//! reading or writing it is undefined.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use rustix::io::Errno;
use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};

/// Readiness without a descriptor: told of the stream's levels where the
/// descriptor's would change (and of each arrival while readable, a new
/// edge), under the stream's lock, so it must be quick and take no lock
/// that is held while calling the stream. An epoll set that keeps its own
/// ready list (as the preload's do) needs no descriptor per stream.
pub trait LevelWatch: Send + Sync {
    /// The stream is now readable iff `readable`, writable iff `writable`.
    fn levels(&self, readable: bool, writable: bool);
}

/// See the module documentation.
#[derive(Debug)]
pub struct Readiness {
    /// Shared with those who poll it ([`Readiness::user_shared`]).
    user: Arc<OwnedFd>,
    ours: OwnedFd,
    readable: bool,
    writable: bool,
}

impl Readiness {
    /// A descriptor that is neither readable nor writable.
    pub fn new() -> io::Result<Readiness> {
        let (user, ours) = socketpair(
            AddressFamily::UNIX,
            SocketType::STREAM,
            SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
            None,
        )?;
        let (user, ours) = (crate::fds::high(user), crate::fds::high(ours));
        // The kernel rounds up to its minimum (a few KiB).
        rustix::net::sockopt::set_socket_send_buffer_size(&user, 1)?;
        let mut r = Readiness {
            user: Arc::new(user),
            ours,
            readable: false,
            writable: true,
        };
        r.set(false, false)?;
        Ok(r)
    }

    /// Whether the descriptor is readable now.
    pub fn is_readable(&self) -> bool {
        self.readable
    }

    /// The descriptor to poll.
    pub fn user_fd(&self) -> BorrowedFd<'_> {
        self.user.as_fd()
    }

    /// The descriptor to poll, shared: the same descriptor (no duplicate)
    /// for a holder that outlives this borrow.
    pub fn user_shared(&self) -> Arc<OwnedFd> {
        self.user.clone()
    }

    /// Makes the descriptor readable iff `readable`, writable iff
    /// `writable`.
    pub fn set(&mut self, readable: bool, writable: bool) -> io::Result<()> {
        if readable != self.readable {
            if readable {
                write_all_once(&self.ours, &[1])?;
            } else {
                drain(&*self.user)?;
            }
            self.readable = readable;
        }
        if writable != self.writable {
            if writable {
                drain(&self.ours)?;
            } else {
                fill(&*self.user)?;
            }
            self.writable = writable;
        }
        Ok(())
    }

    /// New data arrived: a readable descriptor gets one more byte, which
    /// an edge-triggered poller sees as a new edge (a TCP socket gives one
    /// for each arrival too). Nothing when not readable: `set` makes the
    /// edge then.
    pub fn renew_readable(&mut self) -> io::Result<()> {
        if self.readable {
            write_all_once(&self.ours, &[1])?;
        }
        Ok(())
    }
}

fn write_all_once(fd: impl AsFd, bytes: &[u8]) -> io::Result<()> {
    loop {
        match rustix::io::write(&fd, bytes) {
            Ok(_) | Err(Errno::AGAIN) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Empties the receive queue of `fd`, whose peer end only this process
/// writes, under the stream's lock: a read that returns less than the
/// buffer took everything (a stream socket hands over all it has), so no
/// second read to see `EAGAIN`.
fn drain(fd: impl AsFd) -> io::Result<()> {
    // Uninitialised: the bytes are thrown away, and zeroing the buffer on each
    // transition cost more than the read itself.
    const LEN: usize = 4096;
    let mut buf = [MaybeUninit::<u8>::uninit(); LEN];
    loop {
        match rustix::io::read(&fd, &mut buf[..]) {
            Ok((got, _)) if got.len() < LEN => return Ok(()),
            Err(Errno::AGAIN) => return Ok(()),
            Ok(_) | Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// What `fill` writes (any bytes do): one buffer whose socket buffer
/// accounting (payload and overhead, about 1.7 KiB) is above a quarter of
/// the smallest send buffer (4.5 KiB).
static FILLER: [u8; 1024] = [0; 1024];

/// Makes `fd` not writable in one system call: a Unix stream socket polls
/// writable only while what its send buffer holds is at most a quarter of
/// the buffer (`unix_writable`), far below what fills it, so one write
/// does and no second one is needed to see `EAGAIN`.
fn fill(fd: impl AsFd) -> io::Result<()> {
    loop {
        match rustix::io::write(&fd, &FILLER) {
            Ok(_) | Err(Errno::AGAIN) => return Ok(()),
            Err(Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustix::event::{poll, PollFd, PollFlags};

    fn state(r: &Readiness) -> (bool, bool) {
        let mut fds = [PollFd::new(&*r.user, PollFlags::IN | PollFlags::OUT)];
        poll(&mut fds, Some(&rustix::event::Timespec::default())).unwrap();
        let ev = fds[0].revents();
        (ev.contains(PollFlags::IN), ev.contains(PollFlags::OUT))
    }

    #[test]
    fn every_combination_is_expressed() {
        let mut r = Readiness::new().unwrap();
        assert_eq!(state(&r), (false, false));
        for want in [
            (true, false),
            (true, true),
            (false, true),
            (false, false),
            (false, true),
            (true, true),
            (true, false),
        ] {
            r.set(want.0, want.1).unwrap();
            assert_eq!(state(&r), want);
        }
    }

    #[test]
    fn renewed_readability_is_a_new_edge() {
        use rustix::event::epoll;
        let mut r = Readiness::new().unwrap();
        let ep = epoll::create(epoll::CreateFlags::CLOEXEC).unwrap();
        epoll::add(
            &ep,
            &*r.user,
            epoll::EventData::new_u64(7),
            epoll::EventFlags::IN | epoll::EventFlags::ET,
        )
        .unwrap();
        let mut events = Vec::with_capacity(4);
        let wait = |events: &mut Vec<epoll::Event>| {
            events.clear();
            let ts = rustix::event::Timespec::default();
            epoll::wait(&ep, rustix::buffer::spare_capacity(events), Some(&ts)).unwrap();
            events.len()
        };
        // Not readable: renewing makes no edge.
        r.renew_readable().unwrap();
        assert_eq!(wait(&mut events), 0);
        r.set(true, false).unwrap();
        assert_eq!(wait(&mut events), 1);
        assert_eq!(wait(&mut events), 0, "one edge per change");
        r.renew_readable().unwrap();
        assert_eq!(wait(&mut events), 1, "new data is a new edge");
        assert_eq!(state(&r), (true, false));
        r.set(false, false).unwrap();
        assert_eq!(state(&r), (false, false));
    }
}
