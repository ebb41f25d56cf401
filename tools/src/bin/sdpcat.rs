//! `sdpcat`: netcat over SDP.
//!
//! ```text
//! sdpcat [OPTIONS] -l [ADDR:]PORT     accept one SDP connection
//! sdpcat [OPTIONS] HOST:PORT          connect
//!
//!   -z off|read|write|both   Zcopy mechanisms (default: off, as the
//!                            preload's SDP_ZCOPY; docs/design.md §9)
//!   -t SIZE                  Bcopy Threshold: larger reads and writes go
//!                            by Zcopy (default 256K)
//!   -b SIZE                  read and write buffer (default 256K); each
//!                            write waits until the buffer is full
//! ```
//!
//! At the end it prints the bytes by mechanism (Bcopy, Read Zcopy, Write
//! Zcopy) in each direction and the received bytes copied from a Private
//! Buffer.
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

use sdp_core::conn::Config;
use sdp_core::stream::zcopy::{parse_size, ZcopyMode};
use sdp_core::stream::{SdpListener, SdpStream};

const BUF: usize = 256 * 1024;

fn usage() -> ExitCode {
    eprintln!(
        "usage: sdpcat [-z off|read|write|both] [-t SIZE] [-b SIZE] (-l [ADDR:]PORT | HOST:PORT)"
    );
    ExitCode::from(2)
}

/// The options before the address.
struct Options {
    config: Config,
    buf: usize,
}

fn options(args: &mut Vec<String>) -> Option<Options> {
    let mut mode = ZcopyMode::Off;
    let mut threshold = BUF as u64;
    let mut buf = BUF;
    while args.len() >= 2 {
        let (flag, value) = (args[0].as_str(), args[1].as_str());
        match flag {
            "-z" => mode = value.parse().ok()?,
            "-t" => threshold = parse_size(value)?,
            "-b" => {
                buf = usize::try_from(parse_size(value)?)
                    .ok()
                    .filter(|&b| b > 0)?
            }
            _ => break,
        }
        args.drain(..2);
    }
    let mut config = Config::default();
    mode.apply(&mut config, threshold);
    Some(Options { config, buf })
}

fn listen_addr(arg: &str) -> io::Result<SocketAddr> {
    if let Ok(port) = arg.parse::<u16>() {
        return Ok(SocketAddr::from(([0, 0, 0, 0], port)));
    }
    arg.to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address"))
}

fn open(args: &[String], config: &Config) -> Result<SdpStream, ExitCode> {
    let fail = |what: &str, e: io::Error| {
        eprintln!("sdpcat: {what}: {e}");
        ExitCode::FAILURE
    };
    match args {
        [l, addr] if l == "-l" => {
            let addr = listen_addr(addr).map_err(|e| fail(addr, e))?;
            let listener = SdpListener::bind_with(addr, config).map_err(|e| fail("bind", e))?;
            let local = listener.local_addr().map_err(|e| fail("bind", e))?;
            eprintln!("sdpcat: listening on {local}");
            let (stream, peer) = listener.accept().map_err(|e| fail("accept", e))?;
            eprintln!("sdpcat: connection from {peer}");
            Ok(stream)
        }
        [addr] if !addr.starts_with('-') => {
            let stream =
                SdpStream::connect_with(addr.as_str(), config).map_err(|e| fail(addr, e))?;
            eprintln!("sdpcat: connected to {addr}");
            Ok(stream)
        }
        _ => Err(usage()),
    }
}

/// Standard input to the connection, then SHUT_WR. Each write waits for
/// a full buffer (or the end of the input), so that large buffers reach
/// the connection whole.
fn upload(stream: &SdpStream, size: usize) -> io::Result<u64> {
    let mut input = io::stdin().lock();
    let mut buf = vec![0; size];
    let mut total = 0u64;
    let mut end = false;
    while !end {
        let mut n = 0;
        while n < buf.len() {
            match input.read(&mut buf[n..]) {
                Ok(0) => {
                    end = true;
                    break;
                }
                Ok(k) => n += k,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        (&*stream).write_all(&buf[..n])?;
        total += n as u64;
    }
    stream.shutdown(Shutdown::Write)?;
    Ok(total)
}

/// The connection to standard output, until the peer's side ends.
fn download(stream: &SdpStream, size: usize) -> io::Result<u64> {
    let mut output = io::stdout().lock();
    let mut buf = vec![0; size];
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
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let Some(opts) = options(&mut args) else {
        return usage();
    };
    let stream = match open(&args, &opts.config) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let up = {
        let stream = stream.clone();
        let size = opts.buf;
        std::thread::spawn(move || upload(&stream, size))
    };
    let down = download(&stream, opts.buf);
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
    // Counted once sent: the last bytes written may still be queued.
    let _ = (&stream).flush();
    let i = stream.info();
    let z = i.zcopy;
    eprintln!(
        "sdpcat: sent bcopy {} read-zcopy {} write-zcopy {}; received bcopy {} read-zcopy {} \
         write-zcopy {} copied {}",
        z.bcopy_sent,
        z.read_zcopy_sent,
        z.write_zcopy_sent,
        z.bcopy_received,
        z.read_zcopy_received,
        z.write_zcopy_received,
        i.copies.bytes_copied_from_pool
    );
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
