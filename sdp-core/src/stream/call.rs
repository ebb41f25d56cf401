//! How a call waits: the caller's blocking rule (DESIGN §7 "Who owns
//! blocking"). A socket call ([`super::SdpStream::recv_vectored`],
//! [`super::SdpStream::send_vectored`]) brings its own: the program's
//! `O_NONBLOCK` or `MSG_DONTWAIT`, its `SO_RCVTIMEO` or `SO_SNDTIMEO`,
//! and a signal ends its wait as it ends a blocking socket call's. The
//! stream's `Read` and `Write` follow the stream's mode instead
//! (`set_nonblocking`, the timeouts) and sleep on through signals, as a
//! Rust program expects of them.

use std::io;
use std::time::{Duration, Instant};

/// How long a call may wait for the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Block {
    /// Not at all: `EAGAIN` instead (a nonblocking socket,
    /// `MSG_DONTWAIT`).
    Never,
    /// Until the deadline (`EAGAIN` then, or the bytes moved by then), or
    /// for ever (`None`).
    Until(Option<Instant>),
}

impl Block {
    /// A blocking call with `timeout` from now (`None`: for ever).
    pub fn within(timeout: Option<Duration>) -> Block {
        Block::Until(timeout.map(|t| Instant::now() + t))
    }
}

/// One call's rule: its [`Block`], and whether a signal ends its wait.
#[derive(Debug, Clone, Copy)]
pub(super) struct Rule {
    pub block: Block,
    pub signals: bool,
}

impl Rule {
    /// A socket call's: a signal ends it (`EINTR`, or the bytes moved).
    pub fn socket(block: Block) -> Rule {
        Rule {
            block,
            signals: true,
        }
    }

    /// The stream's mode, for its `Read` and `Write`.
    pub fn of_mode(nonblocking: bool, timeout: Option<Duration>) -> Rule {
        Rule {
            block: if nonblocking {
                Block::Never
            } else {
                Block::within(timeout)
            },
            signals: false,
        }
    }

    pub fn waits(&self) -> bool {
        self.block != Block::Never
    }

    pub fn deadline(&self) -> Option<Instant> {
        match self.block {
            Block::Until(d) => d,
            Block::Never => None,
        }
    }

    /// The deadline passed.
    pub fn expired(&self) -> bool {
        self.deadline().is_some_and(|d| Instant::now() >= d)
    }
}

/// The error of a sleep a signal ended.
pub(super) fn is_interrupt(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::Interrupted
}

/// `EINTR`.
pub(super) fn interrupted() -> io::Error {
    io::Error::from_raw_os_error(rustix::io::Errno::INTR.raw_os_error())
}
