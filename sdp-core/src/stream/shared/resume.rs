//! Socket duplication at the I/O layer (draft §13.1.1 step 4): the link
//! answered a SuspComm and its SuspCommAck is in the socket
//! ([`Teardown::Resume`](crate::verbs::Teardown::Resume)). Here the old TCP
//! connection is closed, a new one opened to the same peer address at the
//! SuspComm's port, the MPA startup begun as initiator with the resumed
//! connection's Hello, and the endpoint swapped under the stream.
//!
//! What stays: the [`Link`](crate::link::Link) (its streams, staging and
//! the application's options), the readiness descriptor, the waiting
//! threads, the progress thread's registration, and the stream's socket
//! descriptor number ([`super::Shared::sock`], what
//! [`SdpStream::socket_fd`](crate::stream::SdpStream::socket_fd) reports),
//! which is pointed at the new socket. The stream's addresses are the
//! original ones.
//!
//! The new TCP connection is opened nonblocking from the old local
//! address (port chosen by the kernel): the MPA Request waits in the
//! engine until the socket is connected, a refusal comes as the socket's
//! error, and the MPA startup timer bounds the rest. Any failure is an
//! abortive close with ECONNRESET ([`crate::conn::suspend`]).

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::Inner;
use crate::link::connection_config;
use crate::verbs::ErrorKind;
use iwarp::driver::Endpoint;

/// A nonblocking TCP connection from `local`'s address to `peer`, with
/// the keepalive of `old`.
fn reconnect(old: &TcpStream, local: SocketAddr, peer: SocketAddr) -> io::Result<TcpStream> {
    let socket = Socket::new(Domain::for_address(peer), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_cloexec(true)?;
    socket.set_nonblocking(true)?;
    keep_keepalive(old, &socket);
    socket.bind(&SockAddr::from(SocketAddr::new(local.ip(), 0)))?;
    match socket.connect(&SockAddr::from(peer)) {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INPROGRESS.raw_os_error()) => {}
        Err(e) => return Err(e),
    }
    Ok(socket.into())
}

/// The keepalive options the application gave the old connection's
/// socket (§14.3: SO_KEEPALIVE is TCP's timer), on the new one: the
/// application's settings hold across the move. Best effort: an option
/// the kernel will not tell or take is left as the new socket has it.
fn keep_keepalive(old: &TcpStream, new: &Socket) {
    use rustix::net::sockopt as o;
    if let Ok(on) = o::socket_keepalive(old) {
        let _ = o::set_socket_keepalive(new, on);
    }
    if let Ok(t) = o::tcp_keepidle(old) {
        let _ = o::set_tcp_keepidle(new, t);
    }
    if let Ok(t) = o::tcp_keepintvl(old) {
        let _ = o::set_tcp_keepintvl(new, t);
    }
    if let Ok(n) = o::tcp_keepcnt(old) {
        let _ = o::set_tcp_keepcnt(new, n);
    }
    if let Ok(ms) = o::tcp_user_timeout(old) {
        let _ = o::set_tcp_user_timeout(new, ms);
    }
}

impl Inner {
    /// See the module documentation.
    pub(super) fn resume(&mut self, now: Instant, port: u16) {
        // By system call: the socket's number may be the application's,
        // whose names an interposing library reports as it recorded them.
        let name = |a: rustix::io::Result<rustix::net::SocketAddrAny>| {
            a.map_err(io::Error::from)
                .and_then(|a| SocketAddr::try_from(a).map_err(io::Error::from))
        };
        let peer = rustix::net::getpeername(self.ep.stream())
            .and_then(|p| p.ok_or(rustix::io::Errno::NOTCONN));
        let addrs =
            name(rustix::net::getsockname(self.ep.stream())).and_then(|l| Ok((l, name(peer)?)));
        // §13.1.1 step 4: "MUST wait for completion of the send of the
        // SuspCommAck Message, then close the LLP connection."
        let _ = rustix::net::shutdown(self.ep.stream(), rustix::net::Shutdown::Write);
        if !self.link.resume() {
            return;
        }
        // "... initiate the new connection to the destination TCP port
        // number received through the SuspComm Message, utilizing the same
        // IP address specified in the prior connection setup sequence."
        let config = connection_config(self.link.conn().config());
        let ep = addrs
            .and_then(|(local, peer)| {
                reconnect(self.ep.stream(), local, SocketAddr::new(peer.ip(), port))
            })
            .and_then(|tcp| Endpoint::initiator(tcp, config, self.link.hello(), now));
        let ep = match ep {
            Ok(ep) => ep,
            Err(e) => {
                crate::log::emit(format_args!("SuspComm: reconnection to port {port}: {e}"));
                // The old socket stands in until the reset.
                self.llp_end = true;
                let qp = self.ep.connection_mut();
                self.link.llp_failed(now, ErrorKind::Reset, qp);
                return;
            }
        };
        // The old endpoint goes first: its socket's last holder is then
        // `sock`, whose number the new socket takes.
        let old = std::mem::replace(&mut self.ep, ep);
        drop(old);
        let swapped =
            super::super::progress::swap_socket(self.id, &self.sock, &self.ep.shared_stream());
        self.socket_moved = true;
        self.llp_end = false;
        self.shut_wr = false;
        self.reset = false;
        self.drain_until = None;
        self.hangup_hint = false;
        if let Err(e) = swapped {
            crate::log::emit(format_args!("SuspComm: socket descriptor not moved: {e}"));
            self.llp_end = true;
            let qp = self.ep.connection_mut();
            self.link.llp_failed(now, ErrorKind::Reset, qp);
            return;
        }
        // Posts the fresh receive buffers before the Request can be
        // answered (§8.1.1 step 1c).
        self.link.drive(now, self.ep.connection_mut());
    }
}
