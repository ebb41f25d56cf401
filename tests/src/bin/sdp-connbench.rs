//! `sdp-connbench`: connection setup rate and idle-connection memory, the
//! two figures of `scripts/bench.sh` that no stock tool measures. It is a
//! plain TCP program (std sockets only); run it under `sdprun` for SDP.
//!
//! ```text
//! sdp-connbench server [--bind ADDR] [--port P] [--hold]
//! sdp-connbench rate   [--host ADDR] --port P --count N [--check]
//! sdp-connbench hold   [--host ADDR] --port P --count N
//! ```
//!
//! * `server` prints `listening PORT`, then serves one connection at a
//!   time: read one byte, send it back, read to end of stream, close. With
//!   `--hold` it keeps every connection it accepts, without I/O, and prints
//!   `held K` after the K-th.
//! * `rate` makes `N` connections one after the other. Each one is
//!   "set up" once `connect` returned and one byte went to the server and
//!   back, so both transports are measured to the same point: the
//!   connection carries data both ways (a TCP `connect` returns before the
//!   server even accepted; an SDP one after the Hello exchange). Then the
//!   client closes it. Prints one JSON line with the count, the wall time
//!   of the loop, and percentiles of the connect and setup times. With
//!   `--check` it then opens one more connection, prints `check LOCALPORT`
//!   and holds it until a line arrives on standard input, so that the
//!   caller can see which transport a connection of this process got.
//! * `hold` opens one connection and prints `one LOCALPORT`, waits for a
//!   line on standard input, opens `N` more, prints `held N`, and waits
//!   for another line (or end of input) before it exits. The caller reads
//!   both processes' RSS at the two points: the difference over `N` is the
//!   memory of an idle connection, beyond what the first one set up.

use std::io::{BufRead, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: sdp-connbench server [--bind ADDR] [--port P] [--hold]
       sdp-connbench rate   [--host ADDR] --port P --count N [--check]
       sdp-connbench hold   [--host ADDR] --port P --count N
";

#[derive(Debug, PartialEq)]
struct Options {
    mode: String,
    addr: IpAddr,
    port: u16,
    count: usize,
    hold: bool,
    check: bool,
}

fn parse_args(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mode = args.next().ok_or("no mode")?;
    if !["server", "rate", "hold"].contains(&mode.as_str()) {
        return Err(format!("unknown mode {mode:?}"));
    }
    let mut o = Options {
        mode,
        addr: IpAddr::V4(Ipv4Addr::LOCALHOST),
        port: 0,
        count: 0,
        hold: false,
        check: false,
    };
    while let Some(a) = args.next() {
        let mut value = |what: &str| args.next().ok_or(format!("{a} needs {what}"));
        match a.as_str() {
            "--bind" | "--host" => {
                let v = value("an address")?;
                o.addr = v.parse().map_err(|_| format!("bad address {v:?}"))?;
            }
            "--port" => {
                let v = value("a port")?;
                o.port = v.parse().map_err(|_| format!("bad port {v:?}"))?;
            }
            "--count" => {
                let v = value("a number")?;
                o.count = v.parse().map_err(|_| format!("bad count {v:?}"))?;
            }
            "--hold" => o.hold = true,
            "--check" => o.check = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if o.mode != "server" && (o.port == 0 || o.count == 0) {
        return Err(format!("{} needs --port and --count", o.mode));
    }
    Ok(o)
}

fn line(text: &str) -> std::io::Result<()> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "{text}")?;
    out.flush()
}

/// Blocks until a line (or the end) arrives on standard input.
fn wait_stdin() -> std::io::Result<()> {
    let mut s = String::new();
    std::io::stdin().lock().read_line(&mut s).map(|_| ())
}

fn server(o: &Options) -> std::io::Result<()> {
    let listener = TcpListener::bind(SocketAddr::new(o.addr, o.port))?;
    line(&format!("listening {}", listener.local_addr()?.port()))?;
    let mut held = Vec::new();
    loop {
        let (mut s, _) = listener.accept()?;
        if o.hold {
            held.push(s);
            line(&format!("held {}", held.len()))?;
            continue;
        }
        // A client that fails mid-exchange must not stop the server; the
        // client reports its own error.
        let mut b = [0u8; 1];
        if s.read_exact(&mut b).is_ok() && s.write_all(&b).is_ok() {
            let mut rest = [0u8; 64];
            while matches!(s.read(&mut rest), Ok(n) if n > 0) {}
        }
    }
}

/// Connects and exchanges one byte; returns the stream and the time
/// `connect` took.
fn setup(to: SocketAddr, n: usize) -> Result<(TcpStream, Duration), String> {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(to).map_err(|e| format!("connection {n}: connect: {e}"))?;
    let connected = t0.elapsed();
    let sent = [(n % 251) as u8];
    let mut back = [0u8; 1];
    s.write_all(&sent)
        .and_then(|_| s.read_exact(&mut back))
        .map_err(|e| format!("connection {n}: one-byte exchange: {e}"))?;
    if back != sent {
        return Err(format!("connection {n}: sent {sent:?}, got {back:?}"));
    }
    Ok((s, connected))
}

/// The `p`-th percentile (0–100) of sorted `v`, in microseconds.
fn percentile_us(v: &[Duration], p: usize) -> f64 {
    let i = (v.len().saturating_sub(1) * p) / 100;
    v.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

fn rate(o: &Options) -> Result<(), String> {
    let to = SocketAddr::new(o.addr, o.port);
    let mut connect = Vec::with_capacity(o.count);
    let mut total = Vec::with_capacity(o.count);
    let start = Instant::now();
    for n in 0..o.count {
        let t0 = Instant::now();
        let (s, c) = setup(to, n)?;
        total.push(t0.elapsed());
        connect.push(c);
        drop(s);
    }
    let seconds = start.elapsed().as_secs_f64();
    let mean = total.iter().sum::<Duration>().as_secs_f64() * 1e6 / o.count as f64;
    connect.sort();
    total.sort();
    line(&format!(
        "{{\"count\": {}, \"seconds\": {seconds:.6}, \"per_second\": {:.1}, \
         \"connect_us\": {{\"p50\": {:.1}, \"p99\": {:.1}}}, \
         \"setup_us\": {{\"p50\": {:.1}, \"p99\": {:.1}, \"mean\": {mean:.1}}}}}",
        o.count,
        o.count as f64 / seconds,
        percentile_us(&connect, 50),
        percentile_us(&connect, 99),
        percentile_us(&total, 50),
        percentile_us(&total, 99),
    ))
    .map_err(|e| e.to_string())?;
    if o.check {
        let (s, _) = setup(to, o.count)?;
        let port = s.local_addr().map_err(|e| e.to_string())?.port();
        line(&format!("check {port}")).map_err(|e| e.to_string())?;
        wait_stdin().map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn hold(o: &Options) -> Result<(), String> {
    let to = SocketAddr::new(o.addr, o.port);
    let first = TcpStream::connect(to).map_err(|e| format!("connection 0: {e}"))?;
    let port = first.local_addr().map_err(|e| e.to_string())?.port();
    line(&format!("one {port}")).map_err(|e| e.to_string())?;
    wait_stdin().map_err(|e| e.to_string())?;
    let mut held = Vec::with_capacity(o.count);
    for n in 1..=o.count {
        held.push(TcpStream::connect(to).map_err(|e| format!("connection {n}: {e}"))?);
    }
    line(&format!("held {}", o.count)).map_err(|e| e.to_string())?;
    wait_stdin().map_err(|e| e.to_string())?;
    Ok(())
}

fn main() -> ExitCode {
    let o = match parse_args(std::env::args().skip(1)) {
        Ok(o) => o,
        Err(e) => {
            eprint!("sdp-connbench: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match o.mode.as_str() {
        "server" => server(&o).map_err(|e| e.to_string()),
        "rate" => rate(&o),
        _ => hold(&o),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sdp-connbench {}: {e}", o.mode);
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(s: &str) -> impl Iterator<Item = String> + '_ {
        s.split_whitespace().map(String::from)
    }

    #[test]
    fn parses_each_mode() {
        let o = parse_args(args("rate --port 5000 --count 10 --check")).unwrap();
        assert_eq!((o.port, o.count, o.check, o.hold), (5000, 10, true, false));
        let o = parse_args(args("server --hold --bind ::1")).unwrap();
        assert_eq!((o.addr, o.port, o.hold), ("::1".parse().unwrap(), 0, true));
    }

    #[test]
    fn rejects_missing_or_bad_values() {
        assert_eq!(
            parse_args(args("rate --port 5000")).unwrap_err(),
            "rate needs --port and --count"
        );
        assert!(parse_args(args("hold --port x --count 1")).is_err());
        assert!(parse_args(args("serve")).is_err());
        assert!(parse_args(args("server --port")).is_err());
    }

    #[test]
    fn percentile_picks_by_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(percentile_us(&v, 50), 50.0);
        assert_eq!(percentile_us(&v, 99), 99.0);
        assert_eq!(percentile_us(&[], 50), 0.0);
    }
}
