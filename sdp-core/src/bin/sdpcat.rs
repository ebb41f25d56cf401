//! `sdpcat`: netcat over SDP.
//!
//! ```text
//! sdpcat -l [ADDR:]PORT     accept one SDP connection
//! sdpcat HOST:PORT          connect
//! ```
//!
//! Copies standard input to the connection and the connection to standard
//! output. At the end of standard input it half-closes the connection
//! (`shutdown(SHUT_WR)`: DisConn, draft §8.2.1); it exits once the peer's
//! side has ended too. Exit status 0 after a graceful close; 1 on an
//! abortive close (ECONNRESET) or any other error; 2 on bad usage.
//! Messages go to standard error.

use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;

use sdp_core::stream::{SdpListener, SdpStream};

const BUF: usize = 256 * 1024;

fn usage() -> ExitCode {
    eprintln!("usage: sdpcat -l [ADDR:]PORT | sdpcat HOST:PORT");
    ExitCode::from(2)
}

fn listen_addr(arg: &str) -> io::Result<SocketAddr> {
    if let Ok(port) = arg.parse::<u16>() {
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    arg.to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address"))
}

fn open(args: &[String]) -> Result<SdpStream, ExitCode> {
    let fail = |what: &str, e: io::Error| {
        eprintln!("sdpcat: {what}: {e}");
        ExitCode::FAILURE
    };
    match args {
        [l, addr] if l == "-l" => {
            let addr = listen_addr(addr).map_err(|e| fail(addr, e))?;
            let listener = SdpListener::bind(addr).map_err(|e| fail("bind", e))?;
            let local = listener.local_addr().map_err(|e| fail("bind", e))?;
            eprintln!("sdpcat: listening on {local}");
            let (stream, peer) = listener.accept().map_err(|e| fail("accept", e))?;
            eprintln!("sdpcat: connection from {peer}");
            Ok(stream)
        }
        [addr] if !addr.starts_with('-') => {
            let stream = SdpStream::connect(addr.as_str()).map_err(|e| fail(addr, e))?;
            eprintln!("sdpcat: connected to {addr}");
            Ok(stream)
        }
        _ => Err(usage()),
    }
}

/// Standard input to the connection, then SHUT_WR.
fn upload(stream: &SdpStream) -> io::Result<u64> {
    let mut input = io::stdin().lock();
    let mut buf = vec![0; BUF];
    let mut total = 0u64;
    loop {
        let n = match input.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        (&*stream).write_all(&buf[..n])?;
        total += n as u64;
    }
    stream.shutdown(Shutdown::Write)?;
    Ok(total)
}

/// The connection to standard output, until the peer's side ends.
fn download(stream: &SdpStream) -> io::Result<u64> {
    let mut output = io::stdout().lock();
    let mut buf = vec![0; BUF];
    let mut total = 0u64;
    loop {
        let n = match (&*stream).read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        output.write_all(&buf[..n])?;
        total += n as u64;
    }
    output.flush()?;
    Ok(total)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let stream = match open(&args) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let up = {
        let stream = stream.clone();
        std::thread::spawn(move || upload(&stream))
    };
    let down = download(&stream);
    if let Err(e) = down {
        // An abortive close or another failure: standard input may never
        // end, so do not wait for the upload.
        eprintln!("sdpcat: receiving: {e}");
        return ExitCode::FAILURE;
    }
    let up = up
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("upload thread panicked")));
    let mut ok = true;
    match up {
        Ok(n) => eprintln!("sdpcat: sent {n} bytes"),
        Err(e) => {
            eprintln!("sdpcat: sending: {e}");
            ok = false;
        }
    }
    if let Ok(n) = down {
        eprintln!("sdpcat: received {n} bytes");
    }
    // Finish the close exchange before exiting: a socket closed by the exit
    // while the peer still sends credit updates would be reset.
    let _ = stream.set_linger(Some(std::time::Duration::from_secs(10)));
    drop(stream);
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
