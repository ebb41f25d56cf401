//! `sdp-connbench`: connection setup rate, churn and idle-connection
//! memory, the figures of `scripts/bench.sh` that no stock tool measures.
//! It is a plain TCP program (std sockets and epoll); run it under `sdprun`
//! for SDP.
//!
//! ```text
//! sdp-connbench server [--bind ADDR] [--port P] [--hold]
//! sdp-connbench rate   [--host ADDR] --port P --count N [--concurrency C] [--check]
//! sdp-connbench hold   [--host ADDR] --port P --count N [--burst BYTES]
//! ```
//!
//! * `server` prints `listening PORT`, then serves every connection at
//!   once from one epoll loop, as event-driven servers do: it echoes what
//!   a connection brings and closes it when the peer ends. With `--hold`
//!   it prints `held K` after accepting the K-th.
//! * `rate` makes `N` connections, `C` at a time (default 1: one after the
//!   other). Each one is "set up" once `connect` returned and one byte went
//!   to the server and back, so both transports are measured to the same
//!   point: the connection carries data both ways (a TCP `connect` returns
//!   before the server even accepted; an SDP one after the Hello exchange).
//!   Then the client closes it. Prints one JSON line with the count, the
//!   wall time, and percentiles of the connect and setup times. With
//!   `--check` it then opens one more connection, prints `check LOCALPORT`
//!   and holds it until a line arrives on standard input, so that the
//!   caller can see which transport a connection of this process got.
//! * `hold` opens one connection and prints `one LOCALPORT`, waits for a
//!   line on standard input, opens `N` more and prints `held N SECONDS`
//!   (the time they took to open). At the next line it sends one byte over
//!   each of the `N + 1`, reads every echo and prints `used N+1 SECONDS`;
//!   then it waits for another line (or end of input). With `--burst` it
//!   then sends `BYTES` over each connection in turn, reads the echo and
//!   compares it, prints `burst N+1 SECONDS` and waits for one more line
//!   before it exits: the caller reads the RSS after the burst and again
//!   once the connections have been idle a while.
//!   Every connection carries a byte both ways as it opens. The caller
//!   reads both processes' RSS at `one` and `held`: the difference over
//!   `N` is the memory of an idle connection, beyond what the first one
//!   set up.
//!
//! Both ends raise their descriptor limit to what `N` connections need.

use std::io::{BufRead, ErrorKind, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::process::ExitCode;
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: sdp-connbench server [--bind ADDR] [--port P] [--hold]
       sdp-connbench rate   [--host ADDR] --port P --count N [--concurrency C] [--check]
       sdp-connbench hold   [--host ADDR] --port P --count N [--burst BYTES]
";

/// Descriptors a connection may take: its socket, and what the preload
/// keeps beside it under SDP.
const FDS_PER_CONNECTION: u64 = 4;

#[derive(Debug, PartialEq)]
struct Options {
    mode: String,
    addr: IpAddr,
    port: u16,
    count: usize,
    concurrency: usize,
    hold: bool,
    check: bool,
    burst: u64,
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
        concurrency: 1,
        hold: false,
        check: false,
        burst: 0,
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
            "--concurrency" => {
                let v = value("a number")?;
                o.concurrency = match v.parse() {
                    Ok(c) if c > 0 => c,
                    _ => return Err(format!("bad concurrency {v:?}")),
                };
            }
            "--burst" => {
                let v = value("a byte count")?;
                o.burst = v.parse().map_err(|_| format!("bad burst {v:?}"))?;
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

/// Raises `RLIMIT_NOFILE` to at least `need`: the soft limit up to the
/// hard one, and the hard one too where the process may (it is root).
/// A limit it cannot raise is left, and the connection that meets it
/// reports `EMFILE`.
fn raise_fd_limit(need: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 || r.rlim_cur >= need {
        return;
    }
    let want = libc::rlimit {
        rlim_cur: need,
        rlim_max: r.rlim_max.max(need),
    };
    // SAFETY: setrlimit reads the struct it is given.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &want) } != 0 {
        let soft = libc::rlimit {
            rlim_cur: r.rlim_max,
            rlim_max: r.rlim_max,
        };
        // SAFETY: as above.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &soft) };
    }
}

/// The epoll instance of the server's loop.
struct Epoll(RawFd);

const LISTENER: u64 = u64::MAX;

impl Epoll {
    fn new() -> std::io::Result<Epoll> {
        // SAFETY: plain epoll creation.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(Epoll(fd))
    }

    fn control(&self, op: libc::c_int, fd: RawFd, events: u32, key: u64) -> std::io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: key };
        // SAFETY: `ev` lives across the call; `fd` is open.
        if unsafe { libc::epoll_ctl(self.0, op, fd, &mut ev) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    fn wait(&self, events: &mut [libc::epoll_event]) -> std::io::Result<usize> {
        loop {
            let max = events.len().min(i32::MAX as usize) as libc::c_int;
            // SAFETY: the kernel writes at most `max` entries of `events`.
            let n = unsafe { libc::epoll_wait(self.0, events.as_mut_ptr(), max, -1) };
            if n >= 0 {
                return Ok(n as usize);
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

impl Drop for Epoll {
    fn drop(&mut self) {
        // SAFETY: the descriptor is ours and closed once.
        unsafe { libc::close(self.0) };
    }
}

/// A connection of the server: what it has read and not yet echoed.
struct Echo {
    stream: TcpStream,
    unsent: Vec<u8>,
}

impl Echo {
    /// Reads and echoes until the socket would block. `Ok(false)`: the
    /// peer ended (or failed) and the connection is to be closed;
    /// otherwise whether it waits for room to echo.
    fn serve(&mut self) -> Result<bool, ()> {
        let mut buf = [0u8; 4096];
        loop {
            if !self.unsent.is_empty() {
                match self.stream.write(&self.unsent) {
                    Ok(n) => drop(self.unsent.drain(..n)),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(true),
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => return Err(()),
                }
                continue;
            }
            match self.stream.read(&mut buf) {
                Ok(0) => return Err(()),
                Ok(n) => self.unsent.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Err(()),
            }
        }
    }
}

fn server(o: &Options) -> std::io::Result<()> {
    let listener = TcpListener::bind(SocketAddr::new(o.addr, o.port))?;
    listener.set_nonblocking(true)?;
    raise_fd_limit(65_536);
    let epoll = Epoll::new()?;
    epoll.control(
        libc::EPOLL_CTL_ADD,
        listener.as_raw_fd(),
        libc::EPOLLIN as u32,
        LISTENER,
    )?;
    line(&format!("listening {}", listener.local_addr()?.port()))?;
    let mut conns: Vec<Option<Echo>> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let mut accepted = 0u64;
    let mut events = vec![libc::epoll_event { events: 0, u64: 0 }; 256];
    loop {
        let n = epoll.wait(&mut events)?;
        for ev in &events[..n] {
            let key = ev.u64;
            if key == LISTENER {
                loop {
                    let stream = match listener.accept() {
                        Ok((s, _)) => s,
                        Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                        // A connection that failed before it was taken
                        // (ECONNABORTED) is the client's to report.
                        Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
                        Err(e) => return Err(e),
                    };
                    stream.set_nonblocking(true)?;
                    let slot = free.pop().unwrap_or_else(|| {
                        conns.push(None);
                        conns.len() - 1
                    });
                    let fd = stream.as_raw_fd();
                    conns[slot] = Some(Echo {
                        stream,
                        unsent: Vec::new(),
                    });
                    epoll.control(libc::EPOLL_CTL_ADD, fd, libc::EPOLLIN as u32, slot as u64)?;
                    accepted += 1;
                    if o.hold {
                        line(&format!("held {accepted}"))?;
                    }
                }
                continue;
            }
            let slot = key as usize;
            let Some(echo) = conns.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            match echo.serve() {
                Ok(blocked) => {
                    let events = if blocked {
                        libc::EPOLLOUT
                    } else {
                        libc::EPOLLIN
                    };
                    let fd = echo.stream.as_raw_fd();
                    epoll.control(libc::EPOLL_CTL_MOD, fd, events as u32, key)?;
                }
                Err(()) => {
                    // Closing the descriptor takes it out of the set.
                    conns[slot] = None;
                    free.push(slot);
                }
            }
        }
    }
}

/// Connects and exchanges one byte; returns the stream and the time
/// `connect` took.
fn setup(to: SocketAddr, n: usize) -> Result<(TcpStream, Duration), String> {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(to).map_err(|e| format!("connection {n}: connect: {e}"))?;
    let connected = t0.elapsed();
    exchange(&mut s, n).map_err(|e| format!("connection {n}: one-byte exchange: {e}"))?;
    Ok((s, connected))
}

/// Sends connection `n`'s byte and reads it back.
fn exchange(s: &mut TcpStream, n: usize) -> std::io::Result<()> {
    let sent = [(n % 251) as u8];
    let mut back = [0u8; 1];
    s.write_all(&sent)?;
    s.read_exact(&mut back)?;
    if back != sent {
        return Err(std::io::Error::other(format!(
            "sent {sent:?}, got {back:?}"
        )));
    }
    Ok(())
}

/// The `p`-th percentile (0–100) of sorted `v`, in microseconds.
fn percentile_us(v: &[Duration], p: usize) -> f64 {
    let i = (v.len().saturating_sub(1) * p) / 100;
    v.get(i).map_or(0.0, |d| d.as_secs_f64() * 1e6)
}

/// Connection setup times: (connect, setup) per connection.
type Times = Vec<(Duration, Duration)>;

/// Connections `first`, `first + step`, ... below `count`, one after the
/// other.
fn serial(to: SocketAddr, first: usize, step: usize, count: usize) -> Result<Times, String> {
    let mut times = Vec::with_capacity(count / step + 1);
    for n in (first..count).step_by(step) {
        let t0 = Instant::now();
        let (s, c) = setup(to, n)?;
        times.push((c, t0.elapsed()));
        drop(s);
    }
    Ok(times)
}

fn rate(o: &Options) -> Result<(), String> {
    let to = SocketAddr::new(o.addr, o.port);
    let c = o.concurrency.min(o.count);
    raise_fd_limit(c as u64 * FDS_PER_CONNECTION + 64);
    let start = Instant::now();
    let times: Times = if c == 1 {
        serial(to, 0, 1, o.count)?
    } else {
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..c)
                .map(|i| scope.spawn(move || serial(to, i, c, o.count)))
                .collect();
            let mut all = Vec::with_capacity(o.count);
            for w in workers {
                all.extend(
                    w.join()
                        .map_err(|_| "a client thread panicked".to_string())??,
                );
            }
            Ok::<_, String>(all)
        })?
    };
    let seconds = start.elapsed().as_secs_f64();
    let (mut connect, mut total): (Vec<_>, Vec<_>) = times.into_iter().unzip();
    let mean = total.iter().sum::<Duration>().as_secs_f64() * 1e6 / o.count as f64;
    connect.sort();
    total.sort();
    line(&format!(
        "{{\"count\": {}, \"concurrency\": {c}, \"seconds\": {seconds:.6}, \"per_second\": {:.1}, \
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
    raise_fd_limit((o.count as u64 + 1) * FDS_PER_CONNECTION + 64);
    let say = |text: String| line(&text).map_err(|e| e.to_string());
    let mut held = Vec::with_capacity(o.count + 1);
    held.push(setup(to, 0)?.0);
    say(format!(
        "one {}",
        held[0].local_addr().map_err(|e| e.to_string())?.port()
    ))?;
    wait_stdin().map_err(|e| e.to_string())?;
    let t0 = Instant::now();
    for n in 1..=o.count {
        held.push(setup(to, n)?.0);
    }
    say(format!(
        "held {} {:.3}",
        o.count,
        t0.elapsed().as_secs_f64()
    ))?;
    wait_stdin().map_err(|e| e.to_string())?;
    // Every connection at once: all the bytes out, then all the echoes.
    let t0 = Instant::now();
    for (n, s) in held.iter_mut().enumerate() {
        s.write_all(&[(n % 251) as u8])
            .map_err(|e| format!("connection {n}: send: {e}"))?;
    }
    for (n, s) in held.iter_mut().enumerate() {
        let mut back = [0u8; 1];
        s.read_exact(&mut back)
            .map_err(|e| format!("connection {n}: echo: {e}"))?;
        if back[0] != (n % 251) as u8 {
            return Err(format!("connection {n}: sent {}, got {}", n % 251, back[0]));
        }
    }
    say(format!(
        "used {} {:.3}",
        held.len(),
        t0.elapsed().as_secs_f64()
    ))?;
    wait_stdin().map_err(|e| e.to_string())?;
    if o.burst > 0 {
        let t0 = Instant::now();
        for (n, s) in held.iter_mut().enumerate() {
            burst(s, o.burst).map_err(|e| format!("connection {n}: burst: {e}"))?;
        }
        say(format!(
            "burst {} {:.3}",
            held.len(),
            t0.elapsed().as_secs_f64()
        ))?;
        wait_stdin().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// Byte `i` of a burst.
fn pattern(i: u64) -> u8 {
    (i.wrapping_mul(131).wrapping_add(7) % 251) as u8
}

/// Sends `bytes` of [`pattern`] over `s` (from a second thread) and reads
/// the server's echo of them, comparing every byte.
fn burst(s: &mut TcpStream, bytes: u64) -> Result<(), String> {
    let mut out = s.try_clone().map_err(|e| e.to_string())?;
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut chunk = vec![0u8; 64 * 1024];
        let mut at = 0;
        while at < bytes {
            let n = chunk.len().min((bytes - at) as usize);
            for (k, b) in chunk[..n].iter_mut().enumerate() {
                *b = pattern(at + k as u64);
            }
            out.write_all(&chunk[..n])?;
            at += n as u64;
        }
        Ok(())
    });
    let mut buf = vec![0u8; 64 * 1024];
    let mut at = 0;
    while at < bytes {
        let want = buf.len().min((bytes - at) as usize);
        let n = s.read(&mut buf[..want]).map_err(|e| format!("echo: {e}"))?;
        if n == 0 {
            return Err(format!("echo ended after {at} of {bytes} bytes"));
        }
        if let Some(k) = (0..n).find(|&k| buf[k] != pattern(at + k as u64)) {
            return Err(format!("echo byte {} differs", at + k as u64));
        }
        at += n as u64;
    }
    match writer.join() {
        Ok(r) => r.map_err(|e| format!("send: {e}")),
        Err(_) => Err("the sending thread panicked".into()),
    }
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
        assert_eq!(o.concurrency, 1);
        let o = parse_args(args("rate --port 5000 --count 10 --concurrency 4")).unwrap();
        assert_eq!(o.concurrency, 4);
        let o = parse_args(args("server --hold --bind ::1")).unwrap();
        assert_eq!((o.addr, o.port, o.hold), ("::1".parse().unwrap(), 0, true));
        let o = parse_args(args("hold --port 5000 --count 10 --burst 4194304")).unwrap();
        assert_eq!((o.count, o.burst), (10, 4 << 20));
        assert!(parse_args(args("hold --port 5000 --count 10 --burst many")).is_err());
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
        assert!(parse_args(args("rate --port 1 --count 1 --concurrency 0")).is_err());
    }

    #[test]
    fn percentile_picks_by_rank() {
        let v: Vec<Duration> = (1..=100).map(Duration::from_micros).collect();
        assert_eq!(percentile_us(&v, 50), 50.0);
        assert_eq!(percentile_us(&v, 99), 99.0);
        assert_eq!(percentile_us(&[], 50), 0.0);
    }
}
