//! The errors a TCP program sees, with the errno Linux TCP gives for each
//! (DESIGN §3 principle 4).
//!
//! Every failing socket-level call of the connection (`Conn`) returns
//! an [`Error`]; `std::io::Error::from(err)` carries the raw OS error, so
//! the preload can hand `err.errno()` to `errno` unchanged.
//!
//! ```
//! use sdp_core::errno::Error;
//!
//! let io: std::io::Error = Error::ConnectionReset.into();
//! assert_eq!(io.raw_os_error(), Some(104)); // ECONNRESET
//! assert_eq!(io.kind(), std::io::ErrorKind::ConnectionReset);
//! assert_eq!(Error::WouldBlock.errno(), 11); // EAGAIN == EWOULDBLOCK
//! ```

use core::fmt;

/// Linux errno values (x86_64 and every other Linux architecture share
/// these). Written out to keep `sdp-core` free of a libc dependency.
pub mod code {
    /// Resource temporarily unavailable (== EWOULDBLOCK).
    pub const EAGAIN: i32 = 11;
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// Broken pipe.
    pub const EPIPE: i32 = 32;
    /// Software caused connection abort.
    pub const ECONNABORTED: i32 = 103;
    /// Connection reset by peer.
    pub const ECONNRESET: i32 = 104;
    /// Transport endpoint is not connected.
    pub const ENOTCONN: i32 = 107;
    /// Connection timed out.
    pub const ETIMEDOUT: i32 = 110;
    /// Connection refused.
    pub const ECONNREFUSED: i32 = 111;
}

/// A socket-level failure, as errno.
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Error {
    /// EAGAIN/EWOULDBLOCK: nothing can be done now without blocking; the
    /// caller waits for readiness (or returns EAGAIN on O_NONBLOCK).
    WouldBlock,
    /// EINVAL: a bad argument, or `recv(MSG_OOB)` with no urgent byte to
    /// return (or SO_OOBINLINE set), as Linux TCP.
    InvalidInput,
    /// EPIPE: sending after `shutdown(SHUT_WR)` or after the connection
    /// closed.
    BrokenPipe,
    /// ENOTCONN: the connection was never established.
    NotConnected,
    /// ECONNRESET: the connection was closed abortively (AbortConn, LLP
    /// reset, or a protocol violation, draft §8.2.2).
    ConnectionReset,
    /// ECONNABORTED: the local side aborted the connection.
    ConnectionAborted,
    /// ETIMEDOUT: the LLP or a close timer timed out.
    TimedOut,
    /// ECONNREFUSED: the peer refused the connection during setup.
    ConnectionRefused,
}

impl Error {
    /// The Linux errno.
    pub const fn errno(self) -> i32 {
        match self {
            Error::WouldBlock => code::EAGAIN,
            Error::InvalidInput => code::EINVAL,
            Error::BrokenPipe => code::EPIPE,
            Error::NotConnected => code::ENOTCONN,
            Error::ConnectionReset => code::ECONNRESET,
            Error::ConnectionAborted => code::ECONNABORTED,
            Error::TimedOut => code::ETIMEDOUT,
            Error::ConnectionRefused => code::ECONNREFUSED,
        }
    }

    /// The connection error that `errno` reports, for the errors a
    /// connection keeps pending (SO_ERROR): ECONNRESET, ECONNABORTED,
    /// ETIMEDOUT, ECONNREFUSED. Others are not pending errors.
    pub const fn pending_from_errno(errno: i32) -> Option<Error> {
        match errno {
            code::ECONNRESET => Some(Error::ConnectionReset),
            code::ECONNABORTED => Some(Error::ConnectionAborted),
            code::ETIMEDOUT => Some(Error::TimedOut),
            code::ECONNREFUSED => Some(Error::ConnectionRefused),
            _ => None,
        }
    }

    const fn name(self) -> &'static str {
        match self {
            Error::WouldBlock => "EAGAIN: operation would block",
            Error::InvalidInput => "EINVAL: invalid argument",
            Error::BrokenPipe => "EPIPE: broken pipe",
            Error::NotConnected => "ENOTCONN: not connected",
            Error::ConnectionReset => "ECONNRESET: connection reset by peer",
            Error::ConnectionAborted => "ECONNABORTED: connection aborted",
            Error::TimedOut => "ETIMEDOUT: connection timed out",
            Error::ConnectionRefused => "ECONNREFUSED: connection refused",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl std::error::Error for Error {}

impl From<Error> for std::io::Error {
    fn from(err: Error) -> std::io::Error {
        std::io::Error::from_raw_os_error(err.errno())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;

    #[test]
    fn io_errors_carry_the_raw_errno_and_kind() {
        let cases = [
            (Error::WouldBlock, 11, ErrorKind::WouldBlock),
            (Error::InvalidInput, 22, ErrorKind::InvalidInput),
            (Error::BrokenPipe, 32, ErrorKind::BrokenPipe),
            (Error::NotConnected, 107, ErrorKind::NotConnected),
            (Error::ConnectionReset, 104, ErrorKind::ConnectionReset),
            (Error::ConnectionAborted, 103, ErrorKind::ConnectionAborted),
            (Error::TimedOut, 110, ErrorKind::TimedOut),
            (Error::ConnectionRefused, 111, ErrorKind::ConnectionRefused),
        ];
        for (err, errno, kind) in cases {
            let io = std::io::Error::from(err);
            assert_eq!(io.raw_os_error(), Some(errno), "{err}");
            assert_eq!(io.kind(), kind, "{err}");
        }
    }
}
