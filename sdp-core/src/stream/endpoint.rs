//! STAND-IN for `iwarp::driver::Endpoint` (branch `iwarp-driver`, being
//! written by another worker). Same names and shapes as the fixed
//! interface, only what the stream layer uses, so that it compiles and runs
//! until the real driver is merged; then this file goes and
//! `stream/mod.rs` imports `iwarp::driver::{Endpoint, Progress}` instead.
//!
//! Semantics assumed of the real one (and implemented here):
//! * the socket is nonblocking, TCP_NODELAY, EMSS from TCP_MAXSEG;
//! * `pump_recv` reads until the socket is drained (a short read counts as
//!   drained), placing payload straight into `mem` where the engine says
//!   so; on EOF it calls `handle_llp_closed` and returns
//!   `Ok(Progress::Closed)`; on a socket error it calls `handle_llp_closed`
//!   and returns the error;
//! * at an FPDU boundary it reads up to 4 KiB into its scratch buffer (one
//!   `read` for a whole small message), and payload beyond that straight
//!   into place;
//! * `pump_send` frames and writes until nothing is left or the socket
//!   would block.

use std::io::{self, IoSlice, Read, Write};
use std::net::TcpStream;
use std::os::fd::{AsRawFd, RawFd};
use std::time::Instant;

use iwarp::engine::{Connection, ConnectionConfig, RecvTarget};
use iwarp::mem::Memory;

/// What a pump call achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// Nothing moved.
    Idle,
    /// Bytes moved.
    Progressed,
    /// The peer closed its half (EOF).
    Closed,
}

/// A TCP stream carrying an iWARP [`Connection`] (stand-in, see the module
/// docs).
#[derive(Debug)]
pub struct Endpoint {
    stream: TcpStream,
    conn: Connection,
    scratch: Vec<u8>,
    eof: bool,
}

/// Bytes read at once into the scratch buffer at an FPDU boundary.
const GREEDY: usize = 4096;

/// Bytes framed per `poll_transmit` call.
const BUDGET: usize = 256 * 1024;

fn prepare(stream: &TcpStream, cfg: &mut ConnectionConfig) -> io::Result<()> {
    stream.set_nonblocking(true)?;
    stream.set_nodelay(true)?;
    if let Ok(mss) = socket2::SockRef::from(stream).tcp_mss() {
        cfg.emss = mss as usize;
    }
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_i32(stream.as_raw_fd());
    cfg.stag_seed = h.finish();
    Ok(())
}

fn startup_error(e: iwarp::mpa::startup::StartupError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("MPA startup: {e:?}"))
}

impl Endpoint {
    /// Connected TCP stream → MPA initiator (the Request is queued).
    pub fn initiator(
        stream: TcpStream,
        mut cfg: ConnectionConfig,
        private_data: &[u8],
        now: Instant,
    ) -> io::Result<Endpoint> {
        prepare(&stream, &mut cfg)?;
        let conn = Connection::connect(cfg, private_data, now).map_err(startup_error)?;
        Ok(Endpoint::with(stream, conn))
    }

    /// Accepted TCP stream → MPA responder.
    pub fn responder(
        stream: TcpStream,
        mut cfg: ConnectionConfig,
        now: Instant,
    ) -> io::Result<Endpoint> {
        prepare(&stream, &mut cfg)?;
        Ok(Endpoint::with(stream, Connection::listen(cfg, now)))
    }

    fn with(stream: TcpStream, conn: Connection) -> Endpoint {
        Endpoint {
            stream,
            conn,
            scratch: vec![0; 64 * 1024],
            eof: false,
        }
    }

    /// The iWARP connection.
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// The iWARP connection, mutable.
    pub fn connection_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// The TCP stream.
    pub fn stream(&self) -> &TcpStream {
        &self.stream
    }

    /// Nonblocking: reads what the socket has now and feeds the engine.
    pub fn pump_recv(&mut self, now: Instant, mem: &mut dyn Memory) -> io::Result<Progress> {
        if self.eof {
            return Ok(Progress::Closed);
        }
        let mut progressed = false;
        loop {
            let (n, asked) = match self.conn.recv_target() {
                RecvTarget::Place {
                    region,
                    offset,
                    len,
                } => {
                    let Some(dst) = mem
                        .region_mut(region)
                        .and_then(|r| r.get_mut(offset..offset.checked_add(len)?))
                    else {
                        // The engine names memory that is not there: let it
                        // raise its local error.
                        self.conn.placed(now, len.max(1), mem);
                        return Ok(Progress::Progressed);
                    };
                    match (&self.stream).read(dst) {
                        Ok(0) if len > 0 => return self.on_eof(now),
                        Ok(n) => {
                            self.conn.placed(now, n, mem);
                            (n, len)
                        }
                        Err(e) => return self.on_error(now, e, progressed),
                    }
                }
                RecvTarget::Scratch { max } => {
                    // Past the startup, read a few KiB at an FPDU boundary:
                    // a small message then takes one read(2) instead of one
                    // per header, payload and CRC; the engine copies the
                    // little payload that came with it into place.
                    let max = if self.conn.state() == iwarp::engine::State::Idle {
                        max
                    } else {
                        max.max(GREEDY)
                    };
                    let max = max.clamp(1, self.scratch.len());
                    match (&self.stream).read(&mut self.scratch[..max]) {
                        Ok(0) => return self.on_eof(now),
                        Ok(n) => {
                            self.conn.handle_input(now, &self.scratch[..n], mem);
                            (n, max)
                        }
                        Err(e) => return self.on_error(now, e, progressed),
                    }
                }
            };
            progressed = true;
            if n < asked {
                // A short read: the socket was drained.
                return Ok(Progress::Progressed);
            }
        }
    }

    fn on_eof(&mut self, now: Instant) -> io::Result<Progress> {
        self.eof = true;
        self.conn.handle_llp_closed(now);
        Ok(Progress::Closed)
    }

    fn on_error(&mut self, now: Instant, e: io::Error, progressed: bool) -> io::Result<Progress> {
        match e.kind() {
            io::ErrorKind::WouldBlock => Ok(if progressed {
                Progress::Progressed
            } else {
                Progress::Idle
            }),
            io::ErrorKind::Interrupted => Ok(Progress::Progressed),
            _ => {
                self.conn.handle_llp_closed(now);
                Err(e)
            }
        }
    }

    /// Nonblocking: frames and writes pending FPDUs until nothing is left or
    /// the socket would block.
    pub fn pump_send(&mut self, now: Instant, mem: &dyn Memory) -> io::Result<Progress> {
        let mut progressed = false;
        loop {
            self.conn.poll_transmit(now, mem, BUDGET);
            if self.conn.txq().is_empty() {
                break;
            }
            let written = {
                let mut iov = [IoSlice::new(&[]); 64];
                let n = self
                    .conn
                    .txq()
                    .fill_iovec(mem, &mut iov)
                    .map_err(|e| io::Error::other(e.to_string()))?;
                (&self.stream).write_vectored(&iov[..n])
            };
            match written {
                Ok(n) => {
                    progressed = true;
                    self.conn.tx_advance(now, n);
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    self.conn.handle_llp_closed(now);
                    return Err(e);
                }
            }
        }
        Ok(if progressed {
            Progress::Progressed
        } else {
            Progress::Idle
        })
    }

    /// Bytes queued for the socket.
    pub fn wants_send(&self) -> bool {
        !self.conn.txq().is_empty()
    }

    /// The engine's deadline (MPA startup).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.conn.poll_timeout()
    }

    /// Lets a passed deadline take effect.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.conn.handle_timeout(now)
    }

    /// The socket's descriptor.
    pub fn raw_fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }
}
