//! `sdp-portmapper`: the SDP port mapper daemon (draft-pinkerton-iwarp-sdp-01
//! §7) and its command-line client. See docs/portmapper.md.
//!
//! ```text
//! sdp-portmapper [daemon] [OPTIONS]           run the daemon
//! sdp-portmapper query [OPTIONS] HOST PORT    ask HOST's port mapper about PORT
//! sdp-portmapper list [--control PATH]        registrations, pending, counters
//! ```
#![deny(unsafe_code)]

mod daemon;
mod log;
mod sys;

use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use portmapper::client::{Client, ClientConfig, Lookup, Outcome, Timing};
use portmapper::control::{self, ControlClient};
use portmapper::net::{random_u64, PendingQuery};
use portmapper::server::ServerConfig;
use portmapper::wire::{PmTime, DEFAULT_PORT};

const USAGE: &str = "\
usage:
  sdp-portmapper [daemon] [--port N] [--bind ADDR]... [--control PATH]
                 [--pm-time SECS|permanent] [--accept-timeout-ms MS]
                 [--max-pending N] [--max-registrations N] [--rate N] [--burst N]
                 [--max-sources N] [--rewrite-addr ADDR]... [--max-control-conns N]
                 [--stats-interval-ms MS] [--log-level error|warn|info|debug]
  sdp-portmapper query [--port N] [--timeout-ms MS] HOST PORT
  sdp-portmapper list [--control PATH]
";

fn usage_error(msg: &str) -> ExitCode {
    eprintln!("sdp-portmapper: {msg}\n{USAGE}");
    ExitCode::from(64)
}

struct Args {
    v: Vec<String>,
    i: usize,
}

impl Args {
    fn next(&mut self) -> Option<String> {
        let a = self.v.get(self.i).cloned();
        self.i += 1;
        a
    }

    fn value<T: std::str::FromStr>(&mut self, flag: &str) -> Result<T, String> {
        let v = self.next().ok_or(format!("{flag} needs a value"))?;
        v.parse().map_err(|_| format!("bad value for {flag}: {v}"))
    }
}

fn main() -> ExitCode {
    let mut args = Args {
        v: std::env::args().skip(1).collect(),
        i: 0,
    };
    let r = match args.v.first().map(String::as_str) {
        Some("query") => {
            args.i = 1;
            query(args)
        }
        Some("list") => {
            args.i = 1;
            list(args)
        }
        Some("daemon") => {
            args.i = 1;
            run_daemon(args)
        }
        Some("-h" | "--help" | "help") => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        _ => run_daemon(args),
    };
    match r {
        Ok(code) => code,
        Err(msg) => usage_error(&msg),
    }
}

fn run_daemon(mut a: Args) -> Result<ExitCode, String> {
    let mut opts = daemon::Options {
        port: DEFAULT_PORT,
        binds: Vec::new(),
        control: control::default_path(),
        server: ServerConfig::default(),
        max_control_conns: 256,
        stats_interval: Duration::from_secs(10),
        log: log::Logger {
            level: log::Level::Info,
        },
    };
    while let Some(f) = a.next() {
        match f.as_str() {
            "--port" => opts.port = a.value(&f)?,
            "--bind" => opts.binds.push(a.value(&f)?),
            "--control" => opts.control = a.value::<PathBuf>(&f)?,
            "--pm-time" => {
                let v = a.next().ok_or("--pm-time needs a value")?;
                opts.server.pm_time = if v == "permanent" {
                    PmTime::PERMANENT
                } else {
                    let secs: f64 = v.parse().map_err(|_| format!("bad --pm-time {v}"))?;
                    if !(0.0..=254.0).contains(&secs) {
                        return Err("--pm-time must be 0..=254 seconds or permanent".into());
                    }
                    PmTime::from_duration(Duration::from_secs_f64(secs))
                };
            }
            "--accept-timeout-ms" => {
                let v: u64 = a.value(&f)?;
                if v == 0 || v > 3_600_000 {
                    return Err("--accept-timeout-ms must be 1..=3600000".into());
                }
                opts.server.accept_timeout = Duration::from_millis(v);
            }
            "--max-pending" => opts.server.max_pending = a.value(&f)?,
            "--max-registrations" => opts.server.max_registrations = a.value(&f)?,
            "--rate" => opts.server.rate_per_sec = a.value(&f)?,
            "--burst" => opts.server.burst = a.value(&f)?,
            "--max-sources" => opts.server.max_sources = a.value(&f)?,
            "--rewrite-addr" => opts.server.rewrite_addrs.push(a.value::<IpAddr>(&f)?),
            "--max-control-conns" => opts.max_control_conns = a.value(&f)?,
            "--stats-interval-ms" => opts.stats_interval = Duration::from_millis(a.value(&f)?),
            "--log-level" => {
                let v = a.next().ok_or("--log-level needs a value")?;
                opts.log.level = log::Level::parse(&v).ok_or(format!("bad --log-level {v}"))?;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let log = opts.log;
    match daemon::run(opts) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e) => {
            log.log(log::Level::Error, "fatal", &[("error", &e)]);
            Ok(ExitCode::from(1))
        }
    }
}

/// `query HOST PORT`: exit 0 on PMAccept, 1 on PMDeny, 2 without answer.
fn query(mut a: Args) -> Result<ExitCode, String> {
    let mut cfg = ClientConfig::default();
    let mut pos = Vec::new();
    while let Some(f) = a.next() {
        match f.as_str() {
            "--port" => cfg.server_port = a.value(&f)?,
            "--timeout-ms" => {
                cfg.timing = Timing {
                    budget: Duration::from_millis(a.value(&f)?),
                    ..cfg.timing
                }
            }
            _ => pos.push(f),
        }
    }
    let [host, port] = pos.as_slice() else {
        return Err("query needs HOST PORT".into());
    };
    let port: u16 = port.parse().map_err(|_| format!("bad port {port}"))?;
    let ap: SocketAddr = (host.as_str(), port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve {host}: {e}"))?
        .next()
        .ok_or(format!("no address for {host}"))?;
    let server = SocketAddr::new(ap.ip(), cfg.server_port);
    // CpPort is "the local TCP port number that the Connecting Peer will
    // use" (§7.4): hold an ephemeral TCP port for the query's duration.
    let any: IpAddr = if ap.is_ipv4() {
        "0.0.0.0".parse().unwrap_or(IpAddr::from([0u8; 4]))
    } else {
        "::".parse().unwrap_or(IpAddr::from([0u8; 16]))
    };
    let tcp = TcpListener::bind((any, 0)).map_err(|e| format!("cannot bind: {e}"))?;
    let cp_port = tcp.local_addr().map_err(|e| e.to_string())?.port();
    let route = std::net::UdpSocket::bind((any, 0))
        .and_then(|s| s.connect(server).map(|_| s))
        .and_then(|s| s.local_addr())
        .map_err(|e| format!("no route to {server}: {e}"))?;
    let cp = SocketAddr::new(route.ip(), cp_port);
    let mut client = Client::new(cfg);
    let now = Instant::now();
    let Lookup::Query(txn) = client.begin(now, random_u64(), ap, cp) else {
        return Err("unexpected cache hit".into());
    };
    let outcome = match PendingQuery::start(now, txn, server) {
        Ok(mut q) => q.wait(),
        Err(e) => {
            println!("unreachable error={e:?}");
            return Ok(ExitCode::from(2));
        }
    };
    match outcome {
        Outcome::Accept { sdp, pm_time, .. } => {
            let cache = match pm_time {
                PmTime::NO_CACHE => "none".to_string(),
                PmTime::PERMANENT => "permanent".to_string(),
                t => format!("{}ms", t.duration().as_millis()),
            };
            println!("accept sdp={sdp} pm_time={} cache={cache}", pm_time.0);
            Ok(ExitCode::SUCCESS)
        }
        Outcome::Deny => {
            println!("deny");
            Ok(ExitCode::from(1))
        }
        Outcome::NoAnswer => {
            println!("no-answer");
            Ok(ExitCode::from(2))
        }
        Outcome::Unreachable => {
            println!("unreachable");
            Ok(ExitCode::from(2))
        }
    }
}

fn list(mut a: Args) -> Result<ExitCode, String> {
    let mut path = None;
    while let Some(f) = a.next() {
        match f.as_str() {
            "--control" => path = Some(a.value::<PathBuf>(&f)?),
            other => return Err(format!("unknown argument {other}")),
        }
    }
    let conn = match &path {
        Some(p) => ControlClient::connect(p),
        None => ControlClient::connect_default(),
    };
    let lines = conn.and_then(|mut c| c.list());
    match lines {
        Ok(lines) => {
            for l in lines {
                println!("{l}");
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("sdp-portmapper: cannot reach the daemon: {e}");
            Ok(ExitCode::from(2))
        }
    }
}
