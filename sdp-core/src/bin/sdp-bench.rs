//! `sdp-bench`: SdpStream against kernel TCP (std `TcpStream`) on
//! loopback, side by side in one run (DESIGN §7 targets): Bcopy throughput
//! with 64 KiB writes, and 64-byte ping-pong latency. The server side runs
//! in a child process (this binary with `--serve tcp|sdp`), as a real peer
//! would, each process with its own SDP progress thread.
//!
//! ```text
//! sdp-bench [--bytes N] [--iters N] [--rounds N]
//! sdp-bench --latency-only tcp|sdp [--iters N]     (for profiling)
//! sdp-bench --throughput-only tcp|sdp [--bytes N]
//! ```
//!
//! Prints one line per measurement and the ratios SDP/TCP.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use sdp_core::stream::{SdpListener, SdpStream};

const WRITE: usize = 64 * 1024;
const PING: usize = 64;

trait Conn: Read + Write + Send {
    /// shutdown(SHUT_WR).
    fn shut_write(&self) -> io::Result<()>;
}

impl Conn for TcpStream {
    fn shut_write(&self) -> io::Result<()> {
        self.shutdown(std::net::Shutdown::Write)
    }
}

impl Conn for SdpStream {
    fn shut_write(&self) -> io::Result<()> {
        self.shutdown(std::net::Shutdown::Write)
    }
}

fn serve(kind: &str) -> io::Result<()> {
    let accept: Box<dyn Fn() -> io::Result<Box<dyn Conn>>> = match kind {
        "tcp" => {
            let l = TcpListener::bind("127.0.0.1:0")?;
            println!("{}", l.local_addr()?);
            Box::new(move || {
                let (s, _) = l.accept()?;
                s.set_nodelay(true)?;
                Ok(Box::new(s) as Box<dyn Conn>)
            })
        }
        _ => {
            let l = SdpListener::bind("127.0.0.1:0")?;
            println!("{}", l.local_addr()?);
            Box::new(move || Ok(Box::new(l.accept()?.0) as Box<dyn Conn>))
        }
    };
    io::stdout().flush()?;
    loop {
        let mut c = accept()?;
        let mut mode = [0u8; 1];
        if c.read(&mut mode)? == 0 {
            return Ok(());
        }
        if mode[0] == b't' {
            // Throughput: read to the end, then acknowledge the count.
            let mut buf = vec![0u8; 256 * 1024];
            let mut total = 0u64;
            loop {
                match c.read(&mut buf)? {
                    0 => break,
                    n => total += n as u64,
                }
            }
            c.write_all(&total.to_le_bytes())?;
        } else {
            // Ping-pong: echo PING-byte messages until the end.
            let mut buf = [0u8; PING];
            while c.read_exact(&mut buf).is_ok() {
                c.write_all(&buf)?;
            }
        }
    }
}

struct Server {
    child: Child,
    addr: SocketAddr,
}

impl Server {
    fn start(kind: &str) -> io::Result<Server> {
        let exe = std::env::current_exe()?;
        let mut child = Command::new(exe)
            .args(["--serve", kind])
            .stdout(Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout")).read_line(&mut line)?;
        let addr = line
            .trim()
            .parse()
            .map_err(|e| io::Error::other(format!("server said {line:?}: {e}")))?;
        Ok(Server { child, addr })
    }

    fn connect(&self, kind: &str) -> io::Result<Box<dyn Conn>> {
        Ok(match kind {
            "tcp" => {
                let s = TcpStream::connect(self.addr)?;
                s.set_nodelay(true)?;
                Box::new(s)
            }
            _ => Box::new(SdpStream::connect(self.addr)?),
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Bytes per second for `bytes` written in WRITE-byte calls.
fn throughput(server: &Server, kind: &str, bytes: u64) -> io::Result<f64> {
    let mut c = server.connect(kind)?;
    c.write_all(b"t")?;
    let buf = vec![0x5au8; WRITE];
    let t = Instant::now();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(WRITE as u64) as usize;
        c.write_all(&buf[..n])?;
        left -= n as u64;
    }
    // End of stream: the server acknowledges once it read everything.
    c.shut_write()?;
    let mut ack = [0u8; 8];
    c.read_exact(&mut ack)?;
    let secs = t.elapsed().as_secs_f64();
    if u64::from_le_bytes(ack) != bytes {
        return Err(io::Error::other("server counted a different size"));
    }
    Ok(bytes as f64 / secs)
}

/// Round trips of PING bytes: (mean, median) in microseconds.
fn latency(server: &Server, kind: &str, iters: usize) -> io::Result<(f64, f64)> {
    let mut c = server.connect(kind)?;
    c.write_all(b"p")?;
    let mut buf = [0x33u8; PING];
    for _ in 0..iters / 10 {
        c.write_all(&buf)?;
        c.read_exact(&mut buf)?;
    }
    let mut rtts = Vec::with_capacity(iters);
    let t0 = Instant::now();
    for _ in 0..iters {
        let t = Instant::now();
        c.write_all(&buf)?;
        c.read_exact(&mut buf)?;
        rtts.push(t.elapsed());
    }
    let mean = t0.elapsed().as_secs_f64() * 1e6 / iters as f64;
    rtts.sort();
    let median = rtts[rtts.len() / 2].as_secs_f64() * 1e6;
    Ok((mean, median))
}

fn arg(args: &[String], name: &str, default: u64) -> u64 {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--serve") {
        return match serve(args.get(1).map_or("sdp", String::as_str)) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("sdp-bench server: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(i) = args.iter().position(|a| a == "--latency-only") {
        // For profiling: one kind, ping-pong only.
        let kind = args.get(i + 1).map_or("sdp", String::as_str);
        let iters = arg(&args, "--iters", 100_000) as usize;
        let r = Server::start(kind).and_then(|s| latency(&s, kind, iters));
        return match r {
            Ok((mean, median)) => {
                println!("{kind}: mean {mean:.2} us median {median:.2} us");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sdp-bench: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if let Some(i) = args.iter().position(|a| a == "--throughput-only") {
        let kind = args.get(i + 1).map_or("sdp", String::as_str);
        let bytes = arg(&args, "--bytes", 4 << 30);
        let r = Server::start(kind).and_then(|s| throughput(&s, kind, bytes));
        return match r {
            Ok(bps) => {
                println!("{kind}: {:.2} Gbit/s", bps * 8.0 / 1e9);
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("sdp-bench: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let bytes = arg(&args, "--bytes", 2 << 30);
    let iters = arg(&args, "--iters", 20_000) as usize;
    let rounds = arg(&args, "--rounds", 3);
    match run(bytes, iters, rounds) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sdp-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(bytes: u64, iters: usize, rounds: u64) -> io::Result<()> {
    let tcp = Server::start("tcp")?;
    let sdp = Server::start("sdp")?;
    let (mut tput, mut lat) = ([Vec::new(), Vec::new()], [Vec::new(), Vec::new()]);
    // Alternate, so that drift on a shared machine hits both alike.
    for _ in 0..rounds {
        for (i, (kind, server)) in [("tcp", &tcp), ("sdp", &sdp)].into_iter().enumerate() {
            tput[i].push(throughput(server, kind, bytes)?);
            lat[i].push(latency(server, kind, iters)?);
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    let best_lat = |v: &[(f64, f64)]| {
        v.iter()
            .copied()
            .fold((f64::MAX, f64::MAX), |a, b| (a.0.min(b.0), a.1.min(b.1)))
    };
    println!("loopback, {rounds} rounds each, best of rounds; CRC32c on for SDP");
    for (i, kind) in ["TCP", "SDP"].into_iter().enumerate() {
        let (mean, median) = best_lat(&lat[i]);
        println!(
            "{kind}: throughput {:8.2} Gbit/s ({} MiB in 64 KiB writes)   64-byte ping-pong RTT mean {mean:6.2} us  median {median:6.2} us",
            best(&tput[i]) * 8.0 / 1e9,
            bytes >> 20
        );
    }
    let (t_tcp, t_sdp) = (best(&tput[0]), best(&tput[1]));
    let (l_tcp, l_sdp) = (best_lat(&lat[0]), best_lat(&lat[1]));
    println!(
        "ratio SDP/TCP: throughput {:.3} (target >= 0.95)   latency mean {:.3} median {:.3} (target <= 1.10)",
        t_sdp / t_tcp,
        l_sdp.0 / l_tcp.0,
        l_sdp.1 / l_tcp.1
    );
    Ok(())
}
