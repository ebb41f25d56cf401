//! `sdp-portmapper`: the SDP port mapper daemon (draft-pinkerton-iwarp-sdp-01
//! §7) and its command-line client. See docs/portmapper.md.
//!
//! ```text
//! sdp-portmapper [daemon] [OPTIONS]           run the daemon (SIGHUP reloads)
//! sdp-portmapper query [OPTIONS] HOST PORT    ask HOST's port mapper about PORT
//! sdp-portmapper list [--control PATH]        registrations, pending, counters
//! ```
#![deny(unsafe_code)]

mod config;
mod daemon;
mod log;
mod sys;

use std::net::{IpAddr, SocketAddr, TcpListener, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use portmapper::client::{Client, ClientConfig, Lookup, Outcome, Timing};
use portmapper::control::ControlClient;
use portmapper::net::{random_u64, PendingQuery};
use portmapper::wire::PmTime;

const USAGE: &str = "\
usage:
  sdp-portmapper [daemon] [--config FILE] [--port N] [--bind ADDR]... [--control PATH]
                 [--pm-time SECS|permanent] [--accept-timeout-ms MS]
                 [--max-pending N] [--max-registrations N] [--rate N] [--burst N]
                 [--max-sources N] [--rewrite-addr ADDR]... [--max-control-conns N]
                 [--stats-interval-ms MS] [--log-level error|warn|info|debug]
  sdp-portmapper query [--port N] [--timeout-ms MS] HOST PORT
  sdp-portmapper list [--control PATH]

options (each daemon option but --config is also a setting of the --config
file, named without the dashes; the command line wins over the file):
  --config FILE              settings file, one `name = value` per line, `#`
                             comments; read again on SIGHUP
  --port N                   UDP port (default 3935; 0 picks a free one;
                             changes need a restart); for query, the port
                             mapper's port
  --bind ADDR                address to listen on, repeatable (default [::]
                             and 0.0.0.0); changes need a restart
  --control PATH             control socket (default $SDP_PM_CONTROL, else
                             /run/sdp-portmapper/control.sock for root or the
                             owner of /run/sdp-portmapper, else a per-user
                             path; changes need a restart); for list, the
                             socket asked (default: the system-wide one,
                             then the per-user one)
  --pm-time SECS|permanent   PmTime of every PMAccept: how long clients may
                             cache the answer (default 30; 0 = no caching)
  --accept-timeout-ms MS     how long a PMAccept's state waits for the PMAck
                             or the connection (default 2000)
  --max-pending N            pending transactions kept (default 4096)
  --max-registrations N      registrations kept (default 4096)
  --rate N                   PMReqs per second allowed per source (default 200)
  --burst N                  burst of PMReqs allowed per source (default 200)
  --max-sources N            sources rate limited one by one (default 4096)
  --rewrite-addr ADDR        for wildcard listeners, answer with these
                             addresses in turn; repeatable (default none)
  --max-control-conns N      simultaneous control connections (default 256)
  --stats-interval-ms MS     period of the stats log line (default 10000;
                             0 = off)
  --log-level LEVEL          error, warn, info or debug (default info)
  --timeout-ms MS            query only: give up after MS milliseconds
                             (default 900)

signals: SIGTERM and SIGINT stop the daemon; SIGHUP reloads --config.
exit status: 0 after a signal, 1 on a startup error, 64 on a usage error.
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

fn run_daemon(a: Args) -> Result<ExitCode, String> {
    let loader = config::Loader::from_args(a.v.into_iter().skip(a.i))?;
    let opts = loader.load()?;
    let log = opts.log;
    match daemon::run(opts, loader) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every setting is an option line of `--help`: two spaces, the option
    /// and its value, two or more spaces, the description (the manual page
    /// is generated from these lines).
    #[test]
    fn help_lists_every_option() {
        for name in ["config", "timeout-ms"].iter().chain(config::NAMES) {
            let line = USAGE
                .lines()
                .find(|l| l.starts_with(&format!("  --{name} ")))
                .unwrap_or_else(|| panic!("--{name} missing from USAGE"));
            let rest = line[2..].split_once("  ").map(|(_, d)| d.trim_start());
            assert!(rest.is_some_and(|d| !d.is_empty()), "{line:?}");
        }
    }
}
