//! The Accepting Peer's setup up to the answered MPA Request (DESIGN §4),
//! one nonblocking step at a time: [`SdpListener::accept`] loops on it
//! with `poll(2)`, and a host that waits its own way (the preload's
//! service thread and `accept`) calls it when the socket is readable.
//! After the answer the stream waits for the RTR and the Hello exchange
//! like any other ([`SdpStream::wait_connected`]).
//!
//! [`SdpListener::accept`]: super::SdpListener::accept

use std::io;
use std::net::TcpStream;
use std::time::Instant;

use iwarp::engine::Event as QpEvent;
use iwarp::mem::VecMemory;

use super::{fit_config, Driver, Endpoint, Progress, SdpStream};
use crate::conn::Config;
use crate::link::{connection_config, Link};

/// How far one [`answer_request`] got.
pub enum Answer {
    /// The MPA Request and its Hello came, and the Reply with the
    /// HelloAck's parameters went: the stream waits for the RTR.
    Answered(SdpStream),
    /// Nothing whole yet: call again once the socket is readable, or at
    /// the endpoint's `poll_timeout` (the MPA startup timer).
    Pending(Box<Endpoint>),
    /// The peer closed, the startup failed or timed out, or the Hello was
    /// refused (the reject Reply went; ECONNREFUSED).
    Failed(io::Error),
}

/// The responder's endpoint on an accepted TCP connection, with `config`
/// fitted to the socket ([`fit_config`]): nonblocking (the endpoint makes
/// it so). Returns the fitted configuration for [`answer_request`].
pub fn responder(
    tcp: TcpStream,
    config: &Config,
    now: Instant,
) -> io::Result<(Box<Endpoint>, Config)> {
    let config = fit_config(&tcp, config);
    let ep = Endpoint::responder(tcp, connection_config(&config), now)?;
    Ok((Box::new(ep), config))
}

/// Reads what came on `ep`, fires its timer if due, and answers the MPA
/// Request once it and its Hello are whole: the Reply with our HelloAck's
/// parameters, or a reject Reply for a Hello we refuse (§8.1.1). The
/// stream answered waits for the RTR, carried on by `driver`.
pub fn answer_request(
    mut ep: Box<Endpoint>,
    config: &Config,
    now: Instant,
    driver: Driver,
) -> Answer {
    match ep.pump_recv(now, &mut VecMemory::new()) {
        Ok(Progress::Closed) => {
            return Answer::Failed(io::Error::new(
                io::ErrorKind::ConnectionReset,
                "closed before the MPA Request",
            ))
        }
        Err(e) => return Answer::Failed(e),
        Ok(_) => {}
    }
    if ep.poll_timeout().is_some_and(|t| t <= now) {
        ep.handle_timeout(now);
    }
    let mut hello = None;
    while let Some(ev) = ep.connection_mut().poll_event() {
        match ev {
            QpEvent::ConnectRequest { private_data, .. } => hello = Some(private_data),
            QpEvent::Failed(code) => {
                return Answer::Failed(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("MPA startup failed: {code}"),
                ))
            }
            _ => {}
        }
    }
    let Some(hello) = hello else {
        return Answer::Pending(ep);
    };
    let link = match Link::accept(config, &hello, ep.connection_mut(), now) {
        Ok(link) => link,
        Err(e) => {
            // The reject Reply goes, then the connection is dropped.
            let _ = ep.pump_send(now, &VecMemory::new());
            return Answer::Failed(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("refused: {e}"),
            ));
        }
    };
    match SdpStream::from_parts_by(link, *ep, driver) {
        Ok(s) => Answer::Answered(s),
        Err(e) => Answer::Failed(e),
    }
}
