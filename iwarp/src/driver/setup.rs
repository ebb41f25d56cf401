//! Blocking helpers that run the MPA startup over a socket: [`connect`]
//! (initiator) and [`accept`] (responder), for tools and tests.
//!
//! * [`connect`] drives the startup to the Full Operation Phase, or
//!   returns the error a TCP program expects: `ConnectionRefused` on an
//!   MPA reject (the peer's Private Data inside, as [`Rejected`]),
//!   `TimedOut` when the startup timer fires (RFC 5044 §7.1.2 rule 10),
//!   `ConnectionReset` when the peer closes or resets the TCP connection
//!   during the startup. A Rev 2 Request met by a close before any Reply
//!   octet is retried once with Rev 1 on a new TCP connection (RFC 6581
//!   §10: a responder without enhanced support "treats the enhanced
//!   request as incorrectly formatted and closes the TCP connection ...
//!   the initiator MAY attempt to establish an RDMA connection using the
//!   unenhanced MPA protocol").
//! * [`accept`] takes the next TCP connection of a listener, waits for the
//!   Request, lets the caller decide from its Private Data, and writes the
//!   Reply. [`accept_with`] gives the decision the [`Endpoint`] too, to
//!   register memory and advertise it in the Reply, or to set the framing.

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::{Endpoint, Established, Progress, Rejected};
use crate::engine::{ConnectionConfig, Event};
use crate::mem::VecMemory;
use crate::wire::mpa::REV_2;

/// Socket-level options of the helpers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    /// TCP_MAXSEG to set before connecting (initiator): a smaller EMSS and
    /// so smaller FPDUs (RFC 5044 §5.1). The peer's TCP learns it from the
    /// SYN, so both directions use it.
    pub mss: Option<u32>,
    /// Aligned mode ([`Endpoint::set_aligned`]).
    pub aligned: bool,
}

/// The MPA Request as the responder's ULP sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectRequest {
    /// The Request's Rev.
    pub rev: u8,
    /// The initiator's Private Data (ULP part).
    pub private_data: Vec<u8>,
    /// The initiator's IRD.
    pub peer_ird: u16,
    /// The initiator's ORD.
    pub peer_ord: u16,
}

/// A TCP connection to `addr`, with TCP_MAXSEG set to `mss` first if
/// given; blocking (the [`Endpoint`] makes it nonblocking).
pub fn tcp_connect(addr: SocketAddr, mss: Option<u32>) -> io::Result<TcpStream> {
    let Some(mss) = mss else {
        return TcpStream::connect(addr);
    };
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_tcp_mss(mss)?;
    socket.connect(&SockAddr::from(addr))?;
    Ok(socket.into())
}

/// Connects to `addr` and runs the MPA startup as initiator with
/// `private_data` (see the module docs for the errors).
pub fn connect<A: ToSocketAddrs>(
    addr: A,
    cfg: ConnectionConfig,
    private_data: &[u8],
) -> io::Result<Endpoint> {
    connect_with(addr, cfg, private_data, &Options::default())
}

/// [`connect`] with socket options.
pub fn connect_with<A: ToSocketAddrs>(
    addr: A,
    cfg: ConnectionConfig,
    private_data: &[u8],
    opts: &Options,
) -> io::Result<Endpoint> {
    let mut last = None;
    for addr in addr.to_socket_addrs()? {
        match connect_addr(addr, cfg.clone(), private_data, opts) {
            Ok(ep) => return Ok(ep),
            // The peer spoke: no other address will do better.
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused && is_rejected(&e) => {
                return Err(e)
            }
            Err(e) => last = Some(e),
        }
    }
    Err(last
        .unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to connect to")))
}

fn is_rejected(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|e| e.is::<Rejected>())
}

fn connect_addr(
    addr: SocketAddr,
    cfg: ConnectionConfig,
    private_data: &[u8],
    opts: &Options,
) -> io::Result<Endpoint> {
    match start(addr, cfg.clone(), private_data, opts) {
        Err(Retry::Rev1) => {
            let mut cfg = cfg;
            cfg.startup = cfg.startup.rev1();
            start(addr, cfg, private_data, opts).map_err(Retry::into_error)
        }
        r => r.map_err(Retry::into_error),
    }
}

enum Retry {
    Rev1,
    Fail(io::Error),
}

impl Retry {
    fn into_error(self) -> io::Error {
        match self {
            Retry::Fail(e) => e,
            Retry::Rev1 => io::Error::new(
                io::ErrorKind::ConnectionReset,
                "peer closed the TCP connection during the MPA startup",
            ),
        }
    }
}

fn start(
    addr: SocketAddr,
    cfg: ConnectionConfig,
    private_data: &[u8],
    opts: &Options,
) -> Result<Endpoint, Retry> {
    let rev2 = cfg.startup.rev >= REV_2;
    let stream = tcp_connect(addr, opts.mss).map_err(Retry::Fail)?;
    let mut ep =
        Endpoint::initiator(stream, cfg, private_data, Instant::now()).map_err(Retry::Fail)?;
    if opts.aligned {
        ep.set_aligned(true).map_err(Retry::Fail)?;
    }
    let mut outcome = None;
    // No FPDU can arrive before our RTR (RFC 5044 §7.1.2 rule 4), so no
    // memory is needed yet.
    let mut mem = VecMemory::new();
    let r = ep.drive_until(&mut mem, None, &mut |ep| {
        while outcome.is_none() {
            match ep.connection_mut().poll_event() {
                Some(ev @ (Event::Established { .. } | Event::Rejected { .. })) => {
                    outcome = Some(ev)
                }
                Some(_) => {}
                None => break,
            }
        }
        outcome.is_some()
    });
    match outcome {
        Some(Event::Established {
            private_data,
            ird,
            ord,
            peer_ird,
            peer_ord,
        }) => {
            ep.established = Some(Established {
                private_data,
                ird,
                ord,
                peer_ird,
                peer_ord,
            });
            Ok(ep)
        }
        Some(Event::Rejected {
            private_data,
            peer_ird,
            peer_ord,
        }) => Err(Retry::Fail(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            Rejected {
                private_data,
                peer_ird,
                peer_ord,
            },
        ))),
        _ => {
            let e = r
                .err()
                .unwrap_or_else(|| io::Error::other("MPA startup failed"));
            if ep.is_closed() && ep.rx_total() == 0 && rev2 {
                return Err(Retry::Rev1);
            }
            Err(Retry::Fail(match e.kind() {
                io::ErrorKind::UnexpectedEof => io::Error::new(
                    io::ErrorKind::ConnectionReset,
                    "peer closed the TCP connection during the MPA startup",
                ),
                _ => e,
            }))
        }
    }
}

/// Accepts the next TCP connection of `listener` and answers its MPA
/// Request: `decide` gets the initiator's Private Data and returns
/// `Ok(reply_private_data)` to accept or `Err(reject_private_data)` to
/// reject (the Reply is written, then `ConnectionRefused` is returned).
pub fn accept(
    listener: &TcpListener,
    cfg: ConnectionConfig,
    decide: impl FnOnce(&[u8]) -> Result<Vec<u8>, Vec<u8>>,
) -> io::Result<Endpoint> {
    accept_with(listener, cfg, &Options::default(), |_, req| {
        decide(&req.private_data)
    })
}

/// [`accept`] with socket options, and a decision that may use the
/// endpoint: register memory to advertise in the Reply, post receive
/// buffers, set the framing (`connection_mut().set_framing(..)`).
pub fn accept_with(
    listener: &TcpListener,
    cfg: ConnectionConfig,
    opts: &Options,
    decide: impl FnOnce(&mut Endpoint, &ConnectRequest) -> Result<Vec<u8>, Vec<u8>>,
) -> io::Result<Endpoint> {
    let (stream, _) = listener.accept()?;
    respond(stream, cfg, opts, decide)
}

/// [`accept_with`] on a TCP connection already accepted (a server that
/// runs each connection on its own thread).
pub fn respond(
    stream: TcpStream,
    cfg: ConnectionConfig,
    opts: &Options,
    decide: impl FnOnce(&mut Endpoint, &ConnectRequest) -> Result<Vec<u8>, Vec<u8>>,
) -> io::Result<Endpoint> {
    let mut ep = Endpoint::responder(stream, cfg, Instant::now())?;
    if opts.aligned {
        ep.set_aligned(true)?;
    }
    let mut req = None;
    let mut mem = VecMemory::new();
    // Only the Request is read here: the startup reads exactly the frame.
    ep.drive_until(&mut mem, None, &mut |ep| {
        while req.is_none() {
            match ep.connection_mut().poll_event() {
                Some(Event::ConnectRequest {
                    rev,
                    private_data,
                    peer_ird,
                    peer_ord,
                }) => {
                    req = Some(ConnectRequest {
                        rev,
                        private_data,
                        peer_ird,
                        peer_ord,
                    })
                }
                Some(_) => {}
                None => break,
            }
        }
        req.is_some()
    })?;
    let Some(req) = req else {
        return Err(io::Error::other("MPA startup ended without a Request"));
    };
    let decision = decide(&mut ep, &req);
    let accepted = decision.is_ok();
    let r = match decision {
        Ok(pd) => ep.connection_mut().accept(&pd),
        Err(pd) => ep.connection_mut().reject(&pd),
    };
    r.map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    flush(&mut ep)?;
    if !accepted {
        return Err(io::Error::new(
            io::ErrorKind::ConnectionRefused,
            "MPA connection rejected",
        ));
    }
    while let Some(ev) = ep.connection_mut().poll_event() {
        if let Event::Established {
            private_data,
            ird,
            ord,
            peer_ird,
            peer_ord,
        } = ev
        {
            ep.established = Some(Established {
                private_data,
                ird,
                ord,
                peer_ird,
                peer_ord,
            });
        }
    }
    Ok(ep)
}

/// Writes what is queued (the Reply) without reading: what arrives next
/// may be FPDUs for memory the caller has not handed over yet.
fn flush(ep: &mut Endpoint) -> io::Result<()> {
    let mem = VecMemory::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ep.connection().txq().is_empty() {
        if ep.pump_send(Instant::now(), &mem)? == Progress::Closed {
            break;
        }
        if Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "MPA Reply not written",
            ));
        }
        if !ep.connection().txq().is_empty() {
            ep.wait(Some(Duration::from_millis(100)))?;
        }
    }
    Ok(())
}
