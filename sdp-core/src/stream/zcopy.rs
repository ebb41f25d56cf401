//! Blocking reads and writes of large buffers by Zcopy (draft §9.2 Read
//! Zcopy, §9.3 Write Zcopy; [`crate::link::zcopy`]).
//!
//! * **Write.** A blocking `write` of more than the Bcopy Threshold
//!   ([`Config::bcopy_threshold`](crate::conn::Config)) hands the caller's
//!   buffer to the connection as one ULP send buffer and waits for its
//!   completion: the peer RDMA Reads it (SrcAvail), or we RDMA Write it
//!   into the peer's advertised buffer (SinkAvail, Pipelined Mode), or —
//!   after a SendSm — its rest goes by Data Messages, still straight from
//!   the caller's buffer. SO_SNDTIMEO becomes the send buffer's deadline:
//!   its advertisement is canceled (§9.5.4) and the write returns what is
//!   in the stream by then (a partial write), or EAGAIN if nothing.
//! * **Read.** A blocking `read` with more than the Bcopy Threshold of room
//!   and nothing unread posts the buffer: the next bytes of the stream are
//!   RDMA Read into it or RDMA Written into it by the peer (unless
//!   MSG_WAITALL, §9.3), or the next Data Message's payload is copied into
//!   it. SO_RCVTIMEO cancels the post (§9.5.5). Bytes already received
//!   come first, by Bcopy.
//!
//! While its buffer is lent, the call is the Zcopy owner of the socket
//! (see [`super::shared`]).
//!
//! A socket call ([`SdpStream::send_vectored`](super::SdpStream::send_vectored),
//! [`SdpStream::recv_vectored`](super::SdpStream::recv_vectored): the
//! preload's) brings its own deadline, and a signal ends it — the buffer
//! is taken back first (a cancel, §9.5.4 and §9.5.5, when advertised) and
//! the call returns what it moved, or EINTR.

use std::io;
use std::time::{Duration, Instant};

use super::call::{interrupted, is_interrupt, Rule};
use super::shared::Locked;
use super::{recv_loop, to_io, would_block};
use crate::conn::{Completion, Config, RecvFlags, State};
use crate::errno::Error;

/// One wait of a call whose buffer is lent; the caller pumps and looks
/// for the completion before and after. A signal during the sleep of a
/// call that hears of signals sets `signalled` and runs `take_back` once;
/// later sleeps of the call wait for the completion regardless. Other
/// errors end the call. `until`: the sleep ends then at the latest.
fn wait_lent(
    call: &Rule,
    g: &mut Locked<'_>,
    signalled: &mut bool,
    until: Option<Instant>,
    take_back: impl FnOnce(&mut Locked<'_>),
) -> io::Result<()> {
    match sleep(g, until, call.signals && !*signalled) {
        Err(e) if is_interrupt(&e) => {
            *signalled = true;
            take_back(g);
            Ok(())
        }
        r => r,
    }
}

/// Whether a call with `len` bytes of buffer is large enough for Zcopy.
pub(super) fn fits(g: &Locked<'_>, len: usize) -> bool {
    g.link.is_connected() && (len as u64) > g.link.conn().config().bcopy_threshold
}

/// Whether a write of `len` bytes lends its buffer: for Zcopy, or for
/// Bcopy straight from it ([`Config::lend_above`]).
pub(super) fn lends(g: &Locked<'_>, len: usize) -> bool {
    let config = g.link.conn().config();
    g.link.is_connected() && (len as u64) > config.bcopy_threshold.min(config.lend_above)
}

/// Whether a `read` into `len` bytes with `flags` may go by Zcopy: the
/// connection takes the peer's buffers (Read Zcopy) or advertises ours
/// (Write Zcopy).
pub(super) fn read_fits(g: &Locked<'_>, len: usize, flags: RecvFlags) -> bool {
    let config = g.link.conn().config();
    fits(g, len)
        && (config.read_zcopy || config.write_zcopy)
        && !flags.contains(RecvFlags::PEEK)
        && !flags.contains(RecvFlags::OOB)
        && !g.link.zcopy_lent()
        && !g.zc_writer_waiting
}

/// The error of a connection that ended while a Zcopy buffer was lent.
fn ended(g: &mut Locked<'_>) -> Option<io::Error> {
    let conn = g.link.conn();
    if conn.state() == State::Connected && !conn.is_aborting() && !conn.error_pending() {
        return None;
    }
    let e = g
        .link
        .conn_mut()
        .take_error()
        .unwrap_or(Error::ConnectionReset);
    Some(to_io(e))
}

/// Sleeps as the call may: a signal ends an interruptible call's sleep.
fn sleep(g: &mut Locked<'_>, deadline: Option<Instant>, interruptible: bool) -> io::Result<()> {
    if interruptible {
        g.wait_interruptible(deadline)
    } else {
        g.wait(deadline)
    }
}

/// A blocking `write` of `buf` by Zcopy; returns the bytes in the stream,
/// or `None` when it must go by Bcopy. Another thread's Zcopy read that
/// holds the socket is asked to give it up: its buffer is taken back (at
/// once if unused; after the SinkAvailCancel exchange, §9.5.5, if
/// advertised; after the RDMA Read under way) and that read goes on by
/// Bcopy.
pub(super) fn write(g: &mut Locked<'_>, buf: &[u8], call: Rule) -> Option<io::Result<usize>> {
    if g.zcopy_elsewhere() {
        if !g.link.cancel_recv_zcopy() {
            return None;
        }
        g.zc_writer_waiting = true;
        while g.zcopy_elsewhere() {
            if let Err(e) = sleep(g, call.deadline(), call.signals) {
                g.zc_writer_waiting = false;
                return Some(Err(e));
            }
            if call.expired() {
                g.zc_writer_waiting = false;
                return Some(Err(would_block()));
            }
        }
        g.zc_writer_waiting = false;
    }
    Some(write_owned(g, buf, call))
}

/// How long a write lent for Bcopy ([`Config::lend_above`]) waits without
/// a byte going into a Send before its rest is copied into the send
/// buffer instead: the peer is not reading, and may be writing to us
/// before it reads, which a copy lets go on as TCP's socket buffers would.
pub const LENT_STALL: Duration = Duration::from_millis(20);

fn write_owned(g: &mut Locked<'_>, buf: &[u8], call: Rule) -> io::Result<usize> {
    let bcopy = buf.len() as u64 <= g.link.conn().config().bcopy_threshold;
    loop {
        match g.link.send_zcopy(buf, call.deadline(), Instant::now()) {
            Ok(_) => break,
            Err(Error::WouldBlock) => {
                // A Zcopy buffer of another thread, or a stream cut by a
                // cancel the application has not seen yet.
                if call.expired() {
                    return Err(would_block());
                }
                sleep(g, call.deadline(), call.signals)?;
                g.pump(Instant::now());
            }
            Err(e) => return Err(to_io(e)),
        }
    }
    g.zcopy_begin();
    let mut signalled = false;
    // A Bcopy write stalls once no byte went into a Send for LENT_STALL.
    let mut sent = g.link.conn().tx().sent();
    let mut stall_at = bcopy.then(|| Instant::now() + LENT_STALL);
    let mut stalled = false;
    let r = loop {
        g.pump_zcopy(Instant::now(), Some(buf), None);
        if let Some(c) = g.poll_zcopy() {
            if let Completion::Sent { len, .. } = c {
                break match len {
                    0 if signalled => Err(interrupted()),
                    0 if stalled => Ok(0),
                    0 => Err(would_block()),
                    n => Ok(usize::try_from(n).unwrap_or(buf.len()).min(buf.len())),
                };
            }
            continue;
        }
        if let Some(e) = ended(g) {
            break Err(e);
        }
        if let Some(at) = stall_at {
            let now = Instant::now();
            let now_sent = g.link.conn().tx().sent();
            if now_sent != sent {
                sent = now_sent;
                stall_at = Some(now + LENT_STALL);
            } else if now >= at {
                // Taken back as at a deadline: the completion says how
                // much is in Sends, the rest goes the copying way below.
                stalled = g.link.cancel_send_zcopy(now);
                stall_at = None;
                continue;
            }
        }
        // A signal: the buffer must not outlive the call, so its
        // advertisement is canceled (§9.5.4) and the completion says how
        // much of it the stream kept.
        let take_back = |g: &mut Locked<'_>| {
            g.link.cancel_send_zcopy(Instant::now());
        };
        if let Err(e) = wait_lent(&call, g, &mut signalled, stall_at, take_back) {
            break Err(e);
        }
    };
    g.zcopy_end(Instant::now());
    match r {
        Ok(n) if stalled && !signalled && n < buf.len() => copy_rest(g, buf, n, &call),
        r => r,
    }
}

/// The rest of a stalled lent write (from `done`), by the copying `send`
/// with the call's blocking rule: all of it, or what went in by the
/// deadline or a signal.
fn copy_rest(g: &mut Locked<'_>, buf: &[u8], mut done: usize, call: &Rule) -> io::Result<usize> {
    while done < buf.len() {
        match g.send_direct(
            Instant::now(),
            &[&buf[done..]],
            crate::conn::SendFlags::EMPTY,
        ) {
            Ok(n) => done += n,
            Err(Error::WouldBlock) => {
                if call.expired() {
                    break;
                }
                match sleep(g, call.deadline(), call.signals) {
                    Ok(()) => {
                        g.pump(Instant::now());
                    }
                    Err(e) if is_interrupt(&e) => break,
                    Err(e) if done == 0 => return Err(e),
                    Err(_) => break,
                }
            }
            Err(e) if done == 0 => return Err(to_io(e)),
            Err(e) => {
                // Reported by the next call, as TCP keeps it.
                if let Some(e) = Error::pending_from_errno(e.errno()) {
                    g.link.conn_mut().restore_error(e);
                }
                break;
            }
        }
    }
    match done {
        0 if call.expired() => Err(would_block()),
        0 => Err(interrupted()),
        n => Ok(n),
    }
}

/// A blocking `read` into `buf` by Zcopy; `got` counts the bytes in it.
pub(super) fn read(
    g: &mut Locked<'_>,
    buf: &mut [u8],
    flags: RecvFlags,
    got: &mut usize,
    call: Rule,
) -> io::Result<usize> {
    let deadline = call.deadline();
    let waitall = flags.contains(RecvFlags::WAITALL);
    // Posts returned unused in a row (a Mode change, a cancel for Bcopy
    // bytes): after a few, the read goes by Bcopy.
    let mut unused = 0;
    loop {
        // Bytes already received precede anything placed later: they go
        // first, by Bcopy; so do the end of the stream and errors.
        let conn = g.link.conn();
        if conn.bytes_readable() > 0
            || conn.error_pending()
            || conn.disconn_received()
            || conn.state() != State::Connected
        {
            let rest = buf.get_mut(*got..).unwrap_or_default();
            match g
                .link
                .recv(rest, RecvFlags(flags.0 & !RecvFlags::WAITALL.0))
            {
                Ok(0) => return Ok(*got),
                Ok(n) => {
                    g.pump_out(Instant::now());
                    *got += n;
                    if !waitall || *got == buf.len() {
                        return Ok(*got);
                    }
                    continue;
                }
                Err(Error::WouldBlock) => {}
                Err(_) if *got > 0 => return Ok(*got),
                Err(e) => return Err(to_io(e)),
            }
        }
        let rest = buf.len() - *got;
        if !fits(g, rest) || g.link.zcopy_lent() || g.zc_writer_waiting || unused >= 3 {
            return recv_loop(g, buf, flags, got, call, &mut Instant::now());
        }
        let posted = buf.get(*got..).unwrap_or_default();
        if g.link.post_recv_zcopy(posted, flags, deadline).is_err() {
            return recv_loop(g, buf, flags, got, call, &mut Instant::now());
        }
        g.zcopy_begin();
        let into = buf.get_mut(*got..).unwrap_or_default();
        let mut canceled = false;
        let mut signalled = false;
        let c = loop {
            g.pump_zcopy(Instant::now(), None, Some(&mut *into));
            if let Some(c) = g.poll_zcopy() {
                if let Completion::Received { placed, copy, .. } = c {
                    break Ok((placed, copy));
                }
                continue;
            }
            // (The peer's DisConn returns the buffer by itself, §8.2.1.)
            if g.link.bytes_readable() > 0 && !canceled {
                // Bcopy bytes came first: the buffer is taken back (it
                // returns at once unless advertised or being filled).
                canceled = true;
                g.link.cancel_recv_zcopy();
                continue;
            }
            if let Some(e) = ended(g) {
                break Err(e);
            }
            // A signal: taken back before the call returns, at once if
            // unused, else after the SinkAvailCancel exchange (§9.5.5) or
            // the RDMA Read under way.
            let take_back = |g: &mut Locked<'_>| {
                g.link.cancel_recv_zcopy();
            };
            if let Err(e) = wait_lent(&call, g, &mut signalled, None, take_back) {
                break Err(e);
            }
            canceled |= signalled;
        };
        g.zcopy_end(Instant::now());
        match c {
            Ok((placed, _)) if placed > 0 => *got += placed as usize,
            Ok((_, copy)) if copy > 0 => {
                let end = (*got).saturating_add(copy as usize).min(buf.len());
                let into = buf.get_mut(*got..end).unwrap_or_default();
                let n = g.link.recv(into, RecvFlags::EMPTY).unwrap_or(0);
                g.pump_out(Instant::now());
                *got += n;
            }
            Ok(_) if signalled => {
                return if *got > 0 {
                    Ok(*got)
                } else {
                    Err(interrupted())
                };
            }
            Ok(_) => {
                // Returned unused: its deadline passed, Bcopy bytes came
                // first, or a Mode change.
                unused += 1;
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return if *got > 0 {
                        Ok(*got)
                    } else {
                        Err(would_block())
                    };
                }
                continue;
            }
            Err(_) if *got > 0 => return Ok(*got),
            Err(e) => return Err(e),
        }
        if signalled || !waitall || *got == buf.len() {
            return Ok(*got);
        }
    }
}

/// [`Config::sink_avail_wait`] of the modes with Write Zcopy.
pub const SINK_AVAIL_WAIT: Duration = Duration::from_millis(10);

/// Which Zcopy mechanisms a connection uses: the `SDP_ZCOPY` setting of
/// the preload, `sdpcat -z`, `sdp-bench --mechanism`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ZcopyMode {
    /// Bcopy only (Bcopy Threshold infinite).
    Off,
    /// Read Zcopy: large writes are advertised by SrcAvail and read by
    /// the peer (§9.2); Combined Mode.
    Read,
    /// Write Zcopy: the send half goes to Pipelined Mode, posted reads are
    /// advertised by SinkAvail and written by the peer (§9.3); a SrcAvail
    /// is answered by SendSm.
    Write,
    /// Both: Pipelined Mode; a read posted before the peer's write is
    /// written into, otherwise the writer's buffer is read.
    Both,
}

impl ZcopyMode {
    /// Sets `config`'s Zcopy policies for this mode; `threshold` is the
    /// Bcopy Threshold (ignored when off).
    pub fn apply(self, config: &mut Config, threshold: u64) {
        use crate::conn::Pipelining;
        let (read, write, pipelining) = match self {
            ZcopyMode::Off => (false, false, Pipelining::Never),
            ZcopyMode::Read => (true, false, Pipelining::Never),
            ZcopyMode::Write => (false, true, Pipelining::Always),
            ZcopyMode::Both => (true, true, Pipelining::Always),
        };
        config.bcopy_threshold = if self == ZcopyMode::Off {
            u64::MAX
        } else {
            threshold
        };
        config.read_zcopy = read;
        config.write_zcopy = write;
        config.pipelining = pipelining;
        // With Write Zcopy on, a writer whose reader keeps its reads posted
        // ahead waits this long for the next SinkAvail (a few turnarounds
        // of a loaded loopback) rather than fall back to SrcAvail or Bcopy.
        config.sink_avail_wait = if write {
            SINK_AVAIL_WAIT
        } else {
            Duration::ZERO
        };
    }

    /// The mode `config` describes (as [`ZcopyMode::apply`] sets it).
    pub fn of(config: &Config) -> ZcopyMode {
        match (
            config.bcopy_threshold == u64::MAX,
            config.read_zcopy,
            config.write_zcopy,
        ) {
            (true, _, _) | (false, false, false) => ZcopyMode::Off,
            (false, true, false) => ZcopyMode::Read,
            (false, false, true) => ZcopyMode::Write,
            (false, true, true) => ZcopyMode::Both,
        }
    }
}

impl core::str::FromStr for ZcopyMode {
    type Err = String;
    fn from_str(s: &str) -> Result<ZcopyMode, String> {
        match s.to_ascii_lowercase().as_str() {
            "off" | "no" | "0" | "bcopy" => Ok(ZcopyMode::Off),
            "read" => Ok(ZcopyMode::Read),
            "write" => Ok(ZcopyMode::Write),
            "both" | "on" | "1" => Ok(ZcopyMode::Both),
            _ => Err(format!("{s:?} is not off, read, write or both")),
        }
    }
}

/// Parses a size: a number with an optional K, M or G suffix (powers of
/// 1024).
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().last()? {
        (i, 'k' | 'K') => (&s[..i], 1 << 10),
        (i, 'm' | 'M') => (&s[..i], 1 << 20),
        (i, 'g' | 'G') => (&s[..i], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mul)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_and_sizes_parse() {
        assert_eq!("read".parse(), Ok(ZcopyMode::Read));
        assert_eq!("BOTH".parse(), Ok(ZcopyMode::Both));
        assert!("sideways".parse::<ZcopyMode>().is_err());
        assert_eq!(parse_size("64K"), Some(65536));
        assert_eq!(parse_size("16m"), Some(16 << 20));
        assert_eq!(parse_size("123"), Some(123));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_size(""), None);
        for m in [
            ZcopyMode::Off,
            ZcopyMode::Read,
            ZcopyMode::Write,
            ZcopyMode::Both,
        ] {
            let mut c = Config::default();
            m.apply(&mut c, 1 << 18);
            assert_eq!(ZcopyMode::of(&c), m);
        }
    }
}
