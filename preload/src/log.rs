//! Logging by environment: `SDP_LOG=error|warn|info|debug|trace` (default
//! `warn`), `SDP_LOG_FILE=path` (default: standard error), and the `log`
//! statement of the rules file, which the environment overrides.
//!
//! A message is formatted into a buffer on the stack and leaves with one
//! `write(2)` to fd 2 or to the log file (opened with `O_APPEND` for that
//! one message, so forked children and threads interleave whole lines).
//! No lock, no allocation: a message can be logged from any hook, in a
//! child after `fork`, or while another thread is inside `malloc`. Nothing
//! is ever written to standard output.

use crate::sys::real;
use std::ffi::CString;
use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::OnceLock;

/// Severity of a message; a message is written when its level is at most
/// the configured one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
pub enum Level {
    Error = 1,
    Warn = 2,
    Info = 3,
    Debug = 4,
    Trace = 5,
}

impl Level {
    /// Parses `error`, `warn`, `info`, `debug`, `trace` (also `warning`,
    /// `off`/`none` for nothing, and the digits 0 to 5).
    pub fn parse(text: &str) -> Option<Option<Level>> {
        Some(Some(match text.trim().to_ascii_lowercase().as_str() {
            "off" | "none" | "0" => return Some(None),
            "error" | "1" => Level::Error,
            "warn" | "warning" | "2" => Level::Warn,
            "info" | "3" => Level::Info,
            "debug" | "4" => Level::Debug,
            "trace" | "5" => Level::Trace,
            _ => return None,
        }))
    }

    /// libsdp's `min-level` (1 = everything, 9 = errors only).
    pub fn from_libsdp(min_level: u8) -> Level {
        match min_level {
            0 | 1 => Level::Trace,
            2 => Level::Debug,
            3 | 4 => Level::Info,
            5..=7 => Level::Warn,
            _ => Level::Error,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        }
    }
}

/// Where messages go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    Stderr,
    Syslog,
    /// Appended to this file, never through a symbolic link.
    File(CString),
}

/// 0 = logging off; otherwise the highest `Level` written.
static MAX_LEVEL: AtomicU8 = AtomicU8::new(Level::Warn as u8);
static DESTINATION: OnceLock<Destination> = OnceLock::new();

/// Sets the level (`None`: nothing is logged).
pub fn set_level(level: Option<Level>) {
    MAX_LEVEL.store(level.map_or(0, |l| l as u8), Ordering::Relaxed);
}

/// Sets the destination; only the first call counts (at initialisation).
pub fn set_destination(dest: Destination) {
    let _ = DESTINATION.set(dest);
}

/// True when messages of `level` are written.
#[inline]
pub fn enabled(level: Level) -> bool {
    level as u8 <= MAX_LEVEL.load(Ordering::Relaxed)
}

/// A `fmt::Write` into a fixed buffer that drops what does not fit.
struct StackBuf {
    buf: [u8; 1024],
    len: usize,
}

impl fmt::Write for StackBuf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Keep the last byte for the newline.
        let room = self.buf.len() - 1 - self.len;
        let take = s.len().min(room);
        self.buf[self.len..self.len + take].copy_from_slice(&s.as_bytes()[..take]);
        self.len += take;
        Ok(())
    }
}

/// Writes one message (use the [`crate::log!`] macro).
pub fn write(level: Level, args: fmt::Arguments<'_>) {
    if !enabled(level) {
        return;
    }
    let mut line = StackBuf {
        buf: [0; 1024],
        len: 0,
    };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let _ = write!(line, "libsdp[{pid}] {}: ", level.name());
    let _ = line.write_fmt(args);
    let len = line.len;
    line.buf[len] = b'\n';
    let bytes = &line.buf[..=len];
    match DESTINATION.get().unwrap_or(&Destination::Stderr) {
        Destination::Stderr => write_all(2, bytes),
        Destination::File(path) => {
            // SAFETY: path is NUL-terminated; open has no other precondition.
            let fd = unsafe {
                libc::open(
                    path.as_ptr(),
                    // Not through a link someone else planted (a
                    // predictable name in /tmp).
                    libc::O_WRONLY
                        | libc::O_APPEND
                        | libc::O_CREAT
                        | libc::O_CLOEXEC
                        | libc::O_NOFOLLOW,
                    0o644,
                )
            };
            if fd >= 0 {
                write_all(fd, bytes);
                // SAFETY: fd was opened just above and is ours.
                unsafe { real::close(fd) };
            } else {
                write_all(2, bytes);
            }
        }
        Destination::Syslog => {
            let priority = match level {
                Level::Error => libc::LOG_ERR,
                Level::Warn => libc::LOG_WARNING,
                Level::Info => libc::LOG_INFO,
                Level::Debug | Level::Trace => libc::LOG_DEBUG,
            };
            // Replace the newline by the terminating NUL syslog needs.
            line.buf[len] = 0;
            // SAFETY: the format is a NUL-terminated "%s" and the argument
            // a NUL-terminated string in our buffer (a NUL inside the text
            // only shortens it).
            unsafe { libc::syslog(priority, c"%s".as_ptr(), line.buf.as_ptr()) };
        }
    }
}

fn write_all(fd: libc::c_int, mut bytes: &[u8]) {
    let saved = real::errno();
    while !bytes.is_empty() {
        // SAFETY: bytes is a valid buffer of its length.
        let n = unsafe { real::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 && real::errno() == libc::EINTR {
            continue;
        }
        if n <= 0 {
            break;
        }
        bytes = bytes.get(n as usize..).unwrap_or(&[]);
    }
    // Logging must not change what the program sees in errno.
    real::set_errno(saved);
}

/// `log!(Level::Warn, "format {}", args)`: formats only when enabled.
#[macro_export]
macro_rules! log {
    ($level:expr, $($arg:tt)+) => {
        if $crate::log::enabled($level) {
            $crate::log::write($level, format_args!($($arg)+));
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse() {
        assert_eq!(Level::parse("WARN"), Some(Some(Level::Warn)));
        assert_eq!(Level::parse("trace"), Some(Some(Level::Trace)));
        assert_eq!(Level::parse("off"), Some(None));
        assert_eq!(Level::parse("loud"), None);
        assert_eq!(Level::from_libsdp(9), Level::Error);
        assert_eq!(Level::from_libsdp(1), Level::Trace);
    }

    #[test]
    fn long_messages_are_cut_not_overflowed() {
        let mut b = StackBuf {
            buf: [0; 1024],
            len: 0,
        };
        let long = "x".repeat(5000);
        write!(b, "{long}").unwrap();
        assert_eq!(b.len, 1023);
    }
}
