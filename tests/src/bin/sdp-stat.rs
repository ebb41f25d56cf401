//! `sdp-stat`: the connections of running preloaded programs, read from the
//! state export files (format in docs/preload.md), one line per socket.
//!
//! ```text
//! sdp-stat [--dir DIR] [PID...]
//! ```
//!
//! DIR is where the preload writes the files: `$SDP_STAT_DIR`, else
//! `$XDG_RUNTIME_DIR/sdp`, else `/tmp/sdp-<uid>`. Without PIDs, every
//! running process with a file is shown. Exit status 0, or 1 when a PID
//! given has no file (or the directory cannot be read), 2 on a usage error.
//!
//! A small reader kept next to the end-to-end harness, whose state export
//! reader (`sdp_tests::statfile`) it uses.

use sdp_tests::statfile::{self, Record, StatFile};
use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage: sdp-stat [--dir DIR] [PID...]";

fn default_dir() -> PathBuf {
    let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(d) = var("SDP_STAT_DIR") {
        return d.into();
    }
    if let Some(run) = var("XDG_RUNTIME_DIR") {
        return PathBuf::from(run).join("sdp");
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    PathBuf::from(format!("/tmp/sdp-{uid}"))
}

fn role(r: u8) -> &'static str {
    match r {
        1 => "client",
        2 => "listener",
        3 => "accepted",
        _ => "-",
    }
}

fn why(r: u8) -> &'static str {
    match r {
        1 => "use-tcp-rule",
        2 => "no-sdp-engine",
        3 => "pm-deny",
        4 => "pm-timeout",
        5 => "pm-unreachable",
        6 => "rst-on-sdp-port",
        7 => "mpa-reject",
        8 => "hello-refused",
        9 => "mpa-hello-timeout",
        10 => "internal-error",
        11 => "peer-used-tcp",
        _ => "-",
    }
}

fn mode(m: u8) -> &'static str {
    match m {
        1 => "combined",
        2 => "buffered",
        3 => "pipelined",
        _ => "-",
    }
}

fn transport(r: &Record) -> String {
    match r.transport {
        1 if r.reason != 0 => format!("TCP({})", why(r.reason)),
        1 => "TCP".into(),
        2 => "SDP".into(),
        _ => "undecided".into(),
    }
}

fn addr(a: Option<std::net::SocketAddr>) -> String {
    a.map_or_else(|| "-".into(), |a| a.to_string())
}

fn print(f: &StatFile) {
    for r in &f.records {
        let c = r.counters;
        let mut line = format!(
            "{:<7} {:<15} {:>4} {:<8} {:<24} {:<22} {:<22}",
            f.pid,
            f.program,
            r.fd,
            role(r.role),
            transport(r),
            addr(r.local),
            addr(r.peer)
        );
        if r.transport == 2 {
            line.push_str(&format!(
                " tx={}/{} bcopy={}/{} rzcopy={}/{} wzcopy={}/{} credits={}/{}",
                mode(r.tx_mode),
                mode(r.rx_mode),
                c[0],
                c[1],
                c[2],
                c[3],
                c[4],
                c[5],
                r.local_credits,
                r.remote_credits
            ));
        }
        println!("{}", line.trim_end());
    }
}

fn main() -> ExitCode {
    let mut dir = None;
    let mut pids = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--dir" => match args.next() {
                Some(d) => dir = Some(PathBuf::from(d)),
                None => {
                    eprintln!("sdp-stat: --dir needs a value\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            p => match p.parse::<u32>() {
                Ok(pid) => pids.push(pid),
                Err(_) => {
                    eprintln!("sdp-stat: unknown argument {p:?}\n{USAGE}");
                    return ExitCode::from(2);
                }
            },
        }
    }
    let dir = dir.unwrap_or_else(default_dir);
    println!(
        "{:<7} {:<15} {:>4} {:<8} {:<24} {:<22} {:<22} (SDP: modes, bytes sent/received, credits local/remote)",
        "PID", "PROGRAM", "FD", "ROLE", "TRANSPORT", "LOCAL", "PEER"
    );
    if pids.is_empty() {
        if let Err(e) = std::fs::read_dir(&dir) {
            eprintln!("sdp-stat: {}: {e}", dir.display());
            return ExitCode::from(1);
        }
        for f in statfile::live(&dir) {
            print(&f);
        }
        return ExitCode::SUCCESS;
    }
    let mut status = ExitCode::SUCCESS;
    for pid in pids {
        match statfile::snapshot(&dir, pid) {
            Ok(f) if statfile::is_live(f.pid, f.start_time) => print(&f),
            Ok(_) => {
                eprintln!("sdp-stat: process {pid} has ended");
                status = ExitCode::from(1);
            }
            Err(e) => {
                eprintln!("sdp-stat: process {pid}: {e}");
                status = ExitCode::from(1);
            }
        }
    }
    status
}
