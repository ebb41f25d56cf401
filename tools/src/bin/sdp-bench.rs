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
//! sdp-bench --mechanism bcopy|read|write [--size N] [--bytes N]
//! sdp-bench --mechanisms [--bytes N] [--rounds N]
//! ```
//!
//! Prints one line per measurement and the ratios SDP/TCP.
//!
//! `--mechanisms` sweeps the write size (4 KiB to 16 MiB, the reader's
//! buffer the same size) over kernel TCP and SDP by Bcopy, Read Zcopy
//! (§9.2) and Write Zcopy (§9.3), alternating them in each round, and
//! prints Gbit/s and the ratios to TCP. Each SDP figure says which share
//! of the bytes the named mechanism carried, from the stream's counters;
//! a mechanism that carried less than 90 % is flagged (Zcopy needs buffers
//! larger than the receive Private Buffer, 64 KiB: §9.5.1 for SinkAvail; a
//! SrcAvail's payload carries a smaller one whole).

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use sdp_core::conn::Config;
use sdp_core::stream::zcopy::ZcopyMode;
use sdp_core::stream::{SdpListener, SdpStream};

/// Bcopy Threshold of the Zcopy configurations: the sweep's writes and
/// reads (4 KiB and up) are larger, its 9-byte request is not.
const ZC_THRESHOLD: u64 = 4095;

/// The SDP configuration of a mechanism (`bcopy`, `read`, `write`).
fn mechanism_config(mech: &str) -> Config {
    let mode = match mech {
        "read" => ZcopyMode::Read,
        "write" => ZcopyMode::Write,
        _ => ZcopyMode::Off,
    };
    let mut c = Config::default();
    mode.apply(&mut c, ZC_THRESHOLD);
    c
}

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
            let mech = kind.strip_prefix("sdp-").unwrap_or("bcopy");
            let l = SdpListener::bind_with("127.0.0.1:0", &mechanism_config(mech))?;
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
        if mode[0] == b'm' {
            // Throughput with reads of the writer's size.
            let mut size = [0u8; 8];
            c.read_exact(&mut size)?;
            let size = usize::try_from(u64::from_le_bytes(size))
                .ok()
                .filter(|&n| (1..=1 << 30).contains(&n))
                .ok_or_else(|| io::Error::other("bad size"))?;
            let mut buf = vec![0u8; size];
            let mut total = 0u64;
            loop {
                match c.read(&mut buf)? {
                    0 => break,
                    n => total += n as u64,
                }
            }
            c.write_all(&total.to_le_bytes())?;
        } else if mode[0] == b't' {
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

    fn connect_sdp(&self, mech: &str) -> io::Result<SdpStream> {
        SdpStream::connect_with(self.addr, &mechanism_config(mech))
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

/// `bytes` written in `size`-byte calls against reads of `size`: bytes
/// per second.
fn sized_throughput(c: &mut dyn Conn, size: usize, bytes: u64) -> io::Result<f64> {
    let mut hello = [0u8; 9];
    hello[0] = b'm';
    hello[1..].copy_from_slice(&(size as u64).to_le_bytes());
    c.write_all(&hello)?;
    let buf = vec![0x5au8; size];
    let t = Instant::now();
    let mut left = bytes;
    while left > 0 {
        let n = left.min(size as u64) as usize;
        c.write_all(&buf[..n])?;
        left -= n as u64;
    }
    c.shut_write()?;
    let mut ack = [0u8; 8];
    c.read_exact(&mut ack)?;
    let secs = t.elapsed().as_secs_f64();
    if u64::from_le_bytes(ack) != bytes {
        return Err(io::Error::other("server counted a different size"));
    }
    Ok(bytes as f64 / secs)
}

/// One SDP measurement by `mech`: bytes per second and the share of the
/// payload the mechanism carried (the sender's counters).
fn mechanism_throughput(
    server: &Server,
    mech: &str,
    size: usize,
    bytes: u64,
) -> io::Result<(f64, f64)> {
    let mut s = server.connect_sdp(mech)?;
    let bps = sized_throughput(&mut s, size, bytes)?;
    let z = s.info().zcopy;
    let by = match mech {
        "read" => z.read_zcopy_sent,
        "write" => z.write_zcopy_sent,
        _ => z.bcopy_sent.saturating_sub(9),
    };
    Ok((bps, by as f64 / bytes as f64))
}

const SIZES: [usize; 6] = [4 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20];
const MECHS: [&str; 3] = ["bcopy", "read", "write"];

/// The sweep of `--mechanisms`; false if a mechanism did not carry what
/// it was asked to where it applies.
fn mechanisms(bytes: u64, rounds: u64) -> io::Result<bool> {
    let tcp = Server::start("tcp")?;
    let sdp: Vec<Server> = MECHS
        .iter()
        .map(|m| Server::start(&format!("sdp-{m}")))
        .collect::<io::Result<_>>()?;
    println!(
        "loopback, {} MiB per measurement, best of {rounds} rounds (TCP and the mechanisms alternate); CRC32c on",
        bytes >> 20
    );
    println!(
        "{:>8} {:>9} {:>18} {:>18} {:>18}   (Gbit/s, ratio to TCP, share of bytes by the mechanism)",
        "size", "TCP", "Bcopy", "Read Zcopy", "Write Zcopy"
    );
    let mut ok = true;
    for size in SIZES {
        let mut best = [0f64; 4];
        let mut share = [1f64; 3];
        for _ in 0..rounds {
            let mut c = tcp.connect("tcp")?;
            best[0] = best[0].max(sized_throughput(&mut *c, size, bytes)?);
            drop(c);
            for (i, m) in MECHS.iter().enumerate() {
                let (bps, sh) = mechanism_throughput(&sdp[i], m, size, bytes)?;
                best[i + 1] = best[i + 1].max(bps);
                share[i] = share[i].min(sh);
            }
        }
        let gbit = |b: f64| b * 8.0 / 1e9;
        let mut line = format!("{:>7}K {:>9.2}", size >> 10, gbit(best[0]));
        for i in 0..3 {
            // §9.5.1: no SinkAvail for a buffer the size of a Private
            // Buffer or smaller; a Combined Mode SrcAvail carries such a
            // buffer whole as its payload (§9.2).
            let applies = MECHS[i] == "bcopy" || size > 64 << 10;
            let flag = if share[i] >= 0.9 {
                ' '
            } else if applies {
                ok = false;
                '!'
            } else {
                '-'
            };
            line.push_str(&format!(
                " {:>6.2} {:>4.2}x {:>3.0}%{flag}",
                gbit(best[i + 1]),
                best[i + 1] / best[0],
                share[i] * 100.0
            ));
        }
        println!("{line}");
    }
    println!(
        "! the mechanism carried < 90 % of the bytes; - it does not apply at this size (§9.5.1)"
    );
    Ok(ok)
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
    if let Some(i) = args.iter().position(|a| a == "--mechanism") {
        // One SDP mechanism at one size, with the writer's counters.
        let mech = args.get(i + 1).map_or("bcopy", String::as_str);
        let bytes = arg(&args, "--bytes", 1 << 30);
        let size = arg(&args, "--size", 1 << 20) as usize;
        let r = Server::start(&format!("sdp-{mech}")).and_then(|s| {
            let mut c = s.connect_sdp(mech)?;
            let bps = sized_throughput(&mut c, size, bytes)?;
            Ok((bps, c.info().zcopy))
        });
        return match r {
            Ok((bps, z)) => {
                println!("sdp {mech} {size}: {:.2} Gbit/s; {z:?}", bps * 8.0 / 1e9);
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
    if args.iter().any(|a| a == "--mechanisms") {
        let bytes = arg(&args, "--bytes", 256 << 20);
        let rounds = arg(&args, "--rounds", 2);
        return match mechanisms(bytes, rounds) {
            Ok(true) => ExitCode::SUCCESS,
            Ok(false) => ExitCode::FAILURE,
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
