//! `sdp-stat [--dir DIR] [--json] [--pid PID]... [--watch SECS [--count N]]`
//! `sdp-stat --explain HOST:PORT [PROGRAM] [--json] [--no-query] [--timeout-ms MS]`
//!
//! Lists, for every preloaded process on the host (the state export files
//! of `docs/preload.md`, "State export"), each socket the preload manages:
//! local and peer address, role, SDP or TCP and why (the rule, PMDeny, a
//! port mapper timeout, an MPA reject...), the flow-control mode of each
//! direction, bytes moved by Bcopy, Read Zcopy and Write Zcopy, the
//! credits, the Zcopy messages sent (SrcAvail, SinkAvail, SendSm, cancels,
//! ModeChange) and the received bytes copied from Private Buffers; then,
//! per process, how many sockets went over TCP for each reason. `--json`
//! prints the same as one JSON document (`version` says its layout);
//! `--watch` prints it again every SECS seconds. `--explain` is in
//! [`explain`].
//!
//! Files of processes that are gone (or whose pid now runs another
//! process) are skipped. The directory is `--dir`, else `SDP_STAT_DIR`,
//! else `$XDG_RUNTIME_DIR/sdp`, else `/tmp/sdp-<uid>` — where the library
//! writes them.
//!
//! This binary reads the format with the library's own reader (the file is
//! included, the library is not linked: its interposed functions would
//! otherwise be this program's).

mod explain;

#[allow(dead_code)]
#[path = "../../stat_format.rs"]
mod stat_format;

#[allow(dead_code)]
#[path = "../../rules.rs"]
mod rules;

use stat_format::{monotonic_ms, ParseError, ProcessState, Record};
use std::time::Duration;

/// The layout of the `--json` documents: 2 wraps the processes in an
/// object with this field (1 was a bare list).
pub const JSON_VERSION: u32 = 2;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const USAGE: &str = "\
usage: sdp-stat [--dir DIR] [--json] [--pid PID]... [--watch SECS [--count N]]
       sdp-stat --explain HOST:PORT [PROGRAM] [--json] [--no-query] [--timeout-ms MS]

Lists the sockets of every process running under the SDP preload: role,
addresses, SDP or TCP and why, modes, bytes by mechanism, credits, Zcopy
messages sent (ZC MSGS: SrcAvail/SinkAvail/SendSm/cancels/ModeChange),
received bytes copied from Private Buffers and copied back (COPIED), and
the same-host path (SAME HOST TX/RX: bytes written into the peer's memory
and received without the wire, written by the peer into ours or read from
its SrcAvail buffers, or why a direction stays on the wire: wire,
off, other-host, peer-gone, bad-offer, refused:ERRNO), and how waits for
the peer ended (WAITS POLLED/SLEPT, of blocking reads, a blocking
connect's setup, and poll or select waiting for the connection's input:
while polling the socket, or after a sleep;
SDP_BUSY_POLL_US). After the table,
each process's sockets that went over TCP, counted by reason.

  --dir DIR          the state export directory (default: SDP_STAT_DIR, else
                     $XDG_RUNTIME_DIR/sdp, else /tmp/sdp-<uid>)
  --json             one JSON document instead of the table (with a version
                     field)
  --pid PID          only this process (repeatable)
  --watch SECS       print again every SECS seconds (fractions allowed)
  --count N          with --watch: stop after N prints
  --explain HOST:PORT
                     what a connect to HOST:PORT would do and why: the rule
                     that matches (SDP_CONFIG, LIBSDP_CONFIG_FILE,
                     /etc/libsdp.conf, SIMPLE_LIBSDP), the running processes'
                     cached port mapper answers, and the answer of HOST's
                     port mapper now; PROGRAM (after HOST:PORT) applies
                     program rules and that program's caches
  --no-query         with --explain: do not ask the port mapper
  --timeout-ms MS    with --explain: how long to wait for the port mapper
                     (default 900)
  --help             this text
";

struct Options {
    dir: PathBuf,
    json: bool,
    pids: Vec<u32>,
    watch: Option<Duration>,
    count: Option<u64>,
    explain: Option<explain::Question>,
}

fn default_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("SDP_STAT_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return Path::new(&d).join("sdp");
    }
    let uid = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap_or(0);
    PathBuf::from(format!("/tmp/sdp-{uid}"))
}

fn parse_args(args: impl Iterator<Item = String>) -> Result<Option<Options>, String> {
    let mut o = Options {
        dir: default_dir(),
        json: false,
        pids: Vec::new(),
        watch: None,
        count: None,
        explain: None,
    };
    let mut no_query = false;
    let mut timeout = Duration::from_millis(900);
    let mut args = args.peekable();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--help" | "-h" => return Ok(None),
            "--json" => o.json = true,
            "--watch" => {
                let v = args.next().ok_or("--watch needs seconds")?;
                let secs: f64 = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0 && *s < 86_400.0)
                    .ok_or(format!("bad --watch {v:?} (seconds, more than 0)"))?;
                o.watch = Some(Duration::from_secs_f64(secs));
            }
            "--count" => {
                let v = args.next().ok_or("--count needs a number")?;
                o.count = Some(
                    v.parse()
                        .ok()
                        .filter(|&n: &u64| n > 0)
                        .ok_or(format!("bad --count {v:?} (1 or more)"))?,
                );
            }
            "--explain" => {
                let target = args.next().ok_or("--explain needs HOST:PORT")?;
                let program = args.next_if(|a| !a.starts_with('-'));
                o.explain = Some(explain::Question {
                    target,
                    program,
                    query: true,
                    timeout: Duration::ZERO,
                });
            }
            "--no-query" => no_query = true,
            "--timeout-ms" => {
                let v = args.next().ok_or("--timeout-ms needs a number")?;
                let ms: u64 = v
                    .parse()
                    .ok()
                    .filter(|ms| (1..=60_000).contains(ms))
                    .ok_or(format!("bad --timeout-ms {v:?} (1 to 60000)"))?;
                timeout = Duration::from_millis(ms);
            }
            "--dir" => o.dir = args.next().ok_or("--dir needs a directory")?.into(),
            "--pid" | "-p" => {
                let p = args.next().ok_or("--pid needs a number")?;
                o.pids
                    .push(p.parse().map_err(|_| format!("bad pid {p:?}"))?);
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if let Some(q) = &mut o.explain {
        q.query = !no_query;
        q.timeout = timeout;
        if o.watch.is_some() {
            return Err("--explain and --watch do not go together".into());
        }
    }
    if o.count.is_some() && o.watch.is_none() {
        return Err("--count needs --watch".into());
    }
    Ok(Some(o))
}

/// The start time (clock ticks since boot) of process `pid`, if it runs.
fn start_time(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    text.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(19)?
        .parse()
        .ok()
}

/// Reads one file consistently: a snapshot is taken only if a second read
/// finds every sequence word (the header's and each record's) as the
/// first did, even — a writer that started after the first read passed a
/// word but before it reached the fields behind it has moved the word by
/// the second. Otherwise it reads again.
fn read_state(path: &Path) -> Option<ProcessState> {
    let mut bytes = std::fs::read(path).ok()?;
    for _ in 0..100 {
        let again = std::fs::read(path).ok()?;
        let parsed = stat_format::parse(&bytes);
        if sequences(&bytes) != sequences(&again) {
            bytes = again;
            std::thread::yield_now();
            continue;
        }
        match parsed {
            Ok(s) => return Some(s),
            Err(ParseError::Torn(_) | ParseError::TornHeader) => {
                bytes = again;
                std::thread::yield_now();
            }
            Err(_) => return None,
        }
    }
    None
}

/// The sequence words of an export file: the header's, then each
/// record's.
fn sequences(bytes: &[u8]) -> Vec<u32> {
    let mut out = Vec::new();
    if let Some(h) = bytes.get(stat_format::field::H_SEQ) {
        out.push(stat_format::le_u32(h));
    }
    let body = bytes.get(stat_format::HEADER_LEN..).unwrap_or(&[]);
    out.extend(
        body.chunks_exact(stat_format::RECORD_LEN)
            .map(stat_format::le_u32),
    );
    out
}

/// The live processes' states, by pid.
fn states(o: &Options) -> std::io::Result<Vec<ProcessState>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&o.dir)? {
        let entry = entry?;
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.strip_suffix(".stat"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !o.pids.is_empty() && !o.pids.contains(&pid) {
            continue;
        }
        let Some(state) = read_state(&entry.path()) else {
            continue;
        };
        // Gone, or the pid is another process now.
        if state.pid != pid || start_time(pid).is_none_or(|t| t != state.start_time) {
            continue;
        }
        out.push(state);
    }
    out.sort_by_key(|s| s.pid);
    Ok(out)
}

fn role(r: u8) -> &'static str {
    match r {
        1 => "client",
        2 => "listener",
        3 => "accepted",
        _ => "-",
    }
}

fn transport(t: u8) -> &'static str {
    match t {
        1 => "tcp",
        2 => "sdp",
        _ => "-",
    }
}

fn want(w: u8) -> &'static str {
    match w {
        1 => "sdp",
        2 => "tcp",
        3 => "both",
        _ => "-",
    }
}

/// The names of `TcpReason` (`table::TcpReason::name`).
fn reason(r: u8) -> &'static str {
    match r {
        1 => "rule-tcp",
        2 => "no-sdp-engine",
        3 => "pm-deny",
        4 => "pm-timeout",
        5 => "pm-unreachable",
        6 => "refused",
        7 => "mpa-reject",
        8 => "hello-reject",
        9 => "timeout",
        10 => "internal-error",
        11 => "peer-tcp",
        _ => "-",
    }
}

fn decided(r: &Record) -> String {
    match r.decided_by {
        1 => "default".into(),
        2 => format!("rule {}", r.rule),
        3 => "AF_INET_SDP".into(),
        4 => "listener".into(),
        _ => "-".into(),
    }
}

/// Why the socket is what it is: for TCP the reason, for SDP who decided.
fn why(r: &Record) -> String {
    match (r.transport, r.reason) {
        (1, 1) => format!("rule-tcp ({})", decided(r)),
        (1, x) => reason(x).into(),
        (2, _) => decided(r),
        _ => "-".into(),
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

fn addr(a: &Option<std::net::SocketAddr>) -> String {
    a.map_or("-".into(), |a| a.to_string())
}

fn table(states: &[ProcessState]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>7} {:<14} {:>4} {:<8} {:<3} {:<22} {:<22} {:<22} {:<19} {:>23} {:>23} {:>13} {:>13} {:>11} {:>26} {:>23} {:>23} {:>21}",
        "PID",
        "PROGRAM",
        "FD",
        "ROLE",
        "VIA",
        "WHY",
        "LOCAL",
        "PEER",
        "MODE TX/RX",
        "BCOPY TX/RX",
        "DIRECT TX/RX",
        "RZCOPY TX/RX",
        "WZCOPY TX/RX",
        "CREDITS L/R",
        "ZC MSGS SRC/SINK/SM/CAN/MC",
        "COPIED RX/BACK",
        "SAME HOST TX/RX",
        "WAITS POLLED/SLEPT"
    );
    for s in states {
        for r in &s.records {
            let c = &r.counters;
            let modes = if r.transport == 2 && r.role != 2 {
                format!("{}/{}", mode(r.tx_mode), mode(r.rx_mode))
            } else {
                "-".into()
            };
            let credits = if r.transport == 2 && r.role != 2 {
                format!("{}/{}", r.local_credits, r.remote_credits)
            } else {
                "-".into()
            };
            let _ = writeln!(
                out,
                "{:>7} {:<14} {:>4} {:<8} {:<3} {:<22} {:<22} {:<22} {:<19} {:>23} {:>23} {:>13} {:>13} {:>11} {:>26} {:>23} {:>23} {:>21}",
                s.pid,
                s.program.chars().take(14).collect::<String>(),
                r.fd,
                role(r.role),
                transport(r.transport),
                why(r),
                addr(&r.local),
                addr(&r.peer),
                modes,
                format!("{}/{}", c[0], c[1]),
                format!("{}/{}", r.direct[0], r.direct[1]),
                format!("{}/{}", c[2], c[3]),
                format!("{}/{}", c[4], c[5]),
                credits,
                r.messages.map(|m| m.to_string()).join("/"),
                format!("{}/{}", r.copied[0], r.copied[1]),
                same_host(r).map_or("-".into(), |(tx, rx)| format!("{tx}/{rx}")),
                waits(r)
            );
        }
    }
    let mut header = false;
    for st in states {
        let counts = fallbacks(st);
        if counts.is_empty() {
            continue;
        }
        if !header {
            let _ = writeln!(out, "\nTCP BY REASON");
            header = true;
        }
        let list: Vec<String> = counts.iter().map(|(r, n)| format!("{r}={n}")).collect();
        let program: String = st.program.chars().take(14).collect();
        let _ = writeln!(out, "{:>7} {:<14} {}", st.pid, program, list.join(" "));
    }
    out
}

/// How the blocking reads of an SDP connection waited: ended while
/// polling the socket, or slept (`SDP_BUSY_POLL_US`).
fn waits(r: &Record) -> String {
    if r.transport != 2 || r.role == 2 {
        return "-".into();
    }
    format!("{}/{}", r.waits[0], r.waits[1])
}

/// The same-host path of an SDP connection, each direction as its bytes
/// or the reason it stays on the wire.
fn same_host(r: &Record) -> Option<(String, String)> {
    use sdp_core::conn::local::{decode, LocalOff};
    if r.transport != 2 || r.role == 2 {
        return None;
    }
    let (send, ring) = decode(u64::from(r.same_host));
    let tx = match send {
        Ok(()) => r.same_host_bytes[0].to_string(),
        Err(LocalOff::NotOffered) => "wire".into(),
        Err(LocalOff::Disabled) => "off".into(),
        Err(LocalOff::OtherHost) => "other-host".into(),
        Err(LocalOff::Gone) => "peer-gone".into(),
        Err(LocalOff::BadOffer) => "bad-offer".into(),
        Err(LocalOff::Refused(e)) => format!("refused:{e}"),
    };
    // Bytes come by our ring, or by our reads of the peer's SrcAvails.
    let rx = if ring || r.same_host_bytes[1] > 0 {
        r.same_host_bytes[1].to_string()
    } else {
        "wire".into()
    };
    Some((tx, rx))
}

pub fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for ch in s.chars() {
        match ch {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

fn json_addr(a: &Option<std::net::SocketAddr>) -> String {
    a.map_or("null".into(), |a| json_str(&a.to_string()))
}

fn json(states: &[ProcessState]) -> String {
    let mut out = format!("{{\"version\": {JSON_VERSION}, \"processes\": [");
    for (i, s) in states.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let _ = write!(
            out,
            "\n  {{\"pid\": {}, \"program\": {}, \"sockets\": [",
            s.pid,
            json_str(&s.program)
        );
        for (j, r) in s.records.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            let (c, m) = (&r.counters, &r.messages);
            let _ = write!(
                out,
                "\n    {{\"fd\": {}, \"role\": {}, \"transport\": {}, \"want\": {}, \
                 \"decided_by\": {}, \"rule\": {}, \"reason\": {}, \"why\": {}, \
                 \"local\": {}, \"peer\": {}, \"tx_mode\": {}, \"rx_mode\": {}, \
                 \"forced\": {}, \"ipv6\": {}, \"bytes\": {{\"bcopy_tx\": {}, \"bcopy_rx\": {}, \
                 \"bcopy_tx_direct\": {}, \"bcopy_rx_direct\": {}, \"read_zcopy_tx\": {}, \"read_zcopy_rx\": {}, \"write_zcopy_tx\": {}, \
                 \"write_zcopy_rx\": {}}}, \"local_credits\": {}, \"remote_credits\": {}, \
                 \"src_avails\": {}, \"sink_avails\": {}, \"send_sms\": {}, \"cancels\": {}, \
                 \"mode_changes\": {}, \"bytes_copied_rx\": {}, \"bytes_copied_back\": {}, \
                 \"same_host\": {}, \"read_waits\": {{\"polled\": {}, \"slept\": {}}}}}",
                r.fd,
                json_str(role(r.role)),
                json_str(transport(r.transport)),
                json_str(want(r.want)),
                json_str(&decided(r)),
                r.rule,
                json_str(reason(r.reason)),
                json_str(&why(r)),
                json_addr(&r.local),
                json_addr(&r.peer),
                json_str(mode(r.tx_mode)),
                json_str(mode(r.rx_mode)),
                r.flags & stat_format::FLAG_FORCED != 0,
                r.flags & stat_format::FLAG_IPV6 != 0,
                c[0],
                c[1],
                r.direct[0],
                r.direct[1],
                c[2],
                c[3],
                c[4],
                c[5],
                r.local_credits,
                r.remote_credits,
                m[0],
                m[1],
                m[2],
                m[3],
                m[4],
                r.copied[0],
                r.copied[1],
                same_host(r).map_or("null".into(), |(tx, rx)| format!(
                    "{{\"tx\": {}, \"rx\": {}, \"bytes_tx\": {}, \"bytes_rx\": {}}}",
                    json_str(&tx),
                    json_str(&rx),
                    r.same_host_bytes[0],
                    r.same_host_bytes[1]
                )),
                r.waits[0],
                r.waits[1]
            );
        }
        out.push_str(if s.records.is_empty() { "]" } else { "\n  ]" });
        let counts: Vec<String> = fallbacks(s)
            .iter()
            .map(|(r, n)| format!("{}: {n}", json_str(r)))
            .collect();
        let now = monotonic_ms();
        let cache: Vec<String> = s
            .pm_cache
            .iter()
            .filter(|e| e.expires_ms > now)
            .map(|e| {
                format!(
                    "{{\"key\": {}, \"host\": {}, \"answer\": {}, \"sdp_port\": {}, \"expires_in_ms\": {}}}",
                    json_str(&e.key.to_string()),
                    e.host,
                    e.answer,
                    e.sdp_port,
                    if e.expires_ms == u64::MAX {
                        "null".into()
                    } else {
                        (e.expires_ms - now).to_string()
                    }
                )
            })
            .collect();
        let _ = write!(
            out,
            ", \"sdp_connections\": {}, \"tcp_by_reason\": {{{}}}, \"pm_cache\": [{}]}}",
            s.sdp_connections,
            counts.join(", "),
            cache.join(", ")
        );
    }
    out.push_str(if states.is_empty() { "]}\n" } else { "\n]}\n" });
    out
}

/// A process's sockets that went over TCP, by reason name (nonzero only).
fn fallbacks(s: &ProcessState) -> Vec<(&'static str, u64)> {
    (0..s.fallbacks.len())
        .map(|r| (reason(r as u8), s.fallbacks[r]))
        // Index 0 and those past the last reason name none: skip them.
        .filter(|&(name, n)| n > 0 && name != "-")
        .collect()
}

fn main() -> ExitCode {
    let o = match parse_args(std::env::args().skip(1)) {
        Ok(Some(o)) => o,
        Ok(None) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprint!("sdp-stat: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut printed = 0u64;
    loop {
        let states = match states(&o) {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => {
                eprintln!("sdp-stat: {}: {e}", o.dir.display());
                return ExitCode::from(1);
            }
        };
        let text = match &o.explain {
            Some(q) => match explain::run(q, &states, o.json) {
                Ok(t) => t,
                Err(e) => {
                    // HOST:PORT that does not resolve: not a usage error.
                    eprintln!("sdp-stat: {e}");
                    return ExitCode::from(1);
                }
            },
            None if o.json => json(&states),
            None => table(&states),
        };
        let Some(every) = o.watch else {
            print!("{text}");
            return ExitCode::SUCCESS;
        };
        if o.json {
            print!("{text}");
        } else {
            // Home and clear, as watch(1) does, then the time of the look.
            print!("\x1b[H\x1b[2J{}\n{text}", now_line(every));
        }
        use std::io::Write as _;
        if std::io::stdout().flush().is_err() {
            return ExitCode::SUCCESS;
        }
        printed += 1;
        if o.count.is_some_and(|n| printed >= n) {
            return ExitCode::SUCCESS;
        }
        std::thread::sleep(every);
    }
}

/// The first line of a `--watch` screen.
fn now_line(every: Duration) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (h, m, s) = (secs / 3600 % 24, secs / 60 % 60, secs % 60);
    format!(
        "every {:.1} s; {h:02}:{m:02}:{s:02} UTC",
        every.as_secs_f64()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        Record {
            fd: 7,
            transport: 1,
            role: 1,
            want: 3,
            decided_by: 1,
            reason: 3,
            rule: 0,
            tx_mode: 0,
            rx_mode: 0,
            flags: 0,
            local: Some("127.0.0.1:40000".parse().unwrap()),
            peer: Some("127.0.0.1:5201".parse().unwrap()),
            counters: [1, 2, 3, 4, 5, 6],
            direct: [7, 8],
            messages: [9, 10, 11, 12, 13],
            copied: [14, 15],
            local_credits: 0,
            remote_credits: 0,
            same_host: 0,
            same_host_bytes: [0, 0],
            waits: [0, 0],
        }
    }

    #[test]
    fn why_names_the_reason_or_the_decision() {
        let mut r = record();
        assert_eq!(why(&r), "pm-deny");
        r.reason = 1;
        r.decided_by = 2;
        r.rule = 4;
        assert_eq!(why(&r), "rule-tcp (rule 4)");
        r.transport = 2;
        r.reason = 0;
        r.decided_by = 3;
        assert_eq!(why(&r), "AF_INET_SDP");
    }

    #[test]
    fn json_is_well_formed() {
        let s = ProcessState {
            pid: 42,
            start_time: 1,
            program: "a\"b".into(),
            records: vec![record()],
            fallbacks: {
                let mut f = [0; stat_format::REASONS];
                f[3] = 2;
                f[11] = 1;
                f
            },
            sdp_connections: 5,
            pm_cache: vec![stat_format::PmCached {
                key: "10.0.0.2:22".parse().unwrap(),
                host: false,
                answer: stat_format::PM_DENY,
                sdp_port: 0,
                expires_ms: u64::MAX,
            }],
        };
        let j = json(std::slice::from_ref(&s));
        assert!(
            j.starts_with(
                "{\"version\": 2, \"processes\": [\n  {\"pid\": 42, \"program\": \"a\\\"b\""
            ),
            "{j}"
        );
        assert!(
            j.ends_with(
                "\n  ], \"sdp_connections\": 5, \"tcp_by_reason\": {\"pm-deny\": 2, \"peer-tcp\": 1}, \"pm_cache\": [{\"key\": \"10.0.0.2:22\", \
                 \"host\": false, \"answer\": 2, \"sdp_port\": 0, \"expires_in_ms\": null}]}\n]}\n"
            ),
            "{j}"
        );
        let t = table(&[s]);
        assert!(
            t.ends_with("\nTCP BY REASON\n     42 a\"b            pm-deny=2 peer-tcp=1\n"),
            "{t}"
        );
        assert!(j.contains("\"reason\": \"pm-deny\""), "{j}");
        assert!(j.contains("\"bcopy_tx\": 1, \"bcopy_rx\": 2"), "{j}");
        assert!(
            j.contains("\"bcopy_tx_direct\": 7, \"bcopy_rx_direct\": 8"),
            "{j}"
        );
        assert!(
            j.contains(
                "\"src_avails\": 9, \"sink_avails\": 10, \"send_sms\": 11, \"cancels\": 12, \
                 \"mode_changes\": 13, \"bytes_copied_rx\": 14, \"bytes_copied_back\": 15, \
                 \"same_host\": null, \"read_waits\": {\"polled\": 0, \"slept\": 0}}"
            ),
            "{j}"
        );
        assert_eq!(json(&[]), "{\"version\": 2, \"processes\": []}\n");
        let t = table(&[]);
        assert!(t.starts_with("    PID PROGRAM"), "{t}");
        let s = ProcessState {
            pid: 42,
            start_time: 1,
            program: "p".into(),
            records: vec![record()],
            fallbacks: [0; stat_format::REASONS],
            sdp_connections: 0,
            pm_cache: Vec::new(),
        };
        let t = table(&[s]);
        assert!(t.contains(" 9/10/11/12/13 "), "{t}");
        assert!(
            t.trim_end()
                .ends_with(" 14/15                       -                     -"),
            "{t}"
        );
    }

    #[test]
    fn the_same_host_path_shows_its_bytes_or_why_not() {
        let mut r = record();
        assert_eq!(same_host(&r), None, "a TCP connection");
        r.transport = 2;
        r.same_host_bytes = [100, 200];
        let show = |code: u32, r: &mut Record| {
            r.same_host = code;
            same_host(r).map(|(tx, rx)| format!("{tx}/{rx}"))
        };
        assert_eq!(show(0x1_0001, &mut r).as_deref(), Some("100/200"));
        assert_eq!(show(0x1_0003, &mut r).as_deref(), Some("other-host/200"));
        // No ring of ours, but bytes read from the peer's SrcAvails.
        assert_eq!(show(0x101, &mut r).as_deref(), Some("refused:1/200"));
        r.same_host_bytes = [100, 0];
        assert_eq!(show(0, &mut r).as_deref(), Some("wire/wire"));
        assert_eq!(show(2, &mut r).as_deref(), Some("off/wire"));
        assert_eq!(show(0x101, &mut r).as_deref(), Some("refused:1/wire"));
        r.same_host_bytes = [100, 200];
        let j = json(&[ProcessState {
            pid: 1,
            start_time: 1,
            program: "p".into(),
            records: vec![Record {
                same_host: 0x1_0001,
                ..r
            }],
            fallbacks: [0; stat_format::REASONS],
            sdp_connections: 0,
            pm_cache: Vec::new(),
        }]);
        assert!(
            j.contains(
                r#""same_host": {"tx": "100", "rx": "200", "bytes_tx": 100, "bytes_rx": 200}, "read_waits""#
            ),
            "{j}"
        );
    }

    #[test]
    fn waits_show_for_an_sdp_connection_only() {
        let mut r = record();
        r.waits = [30, 4];
        assert_eq!(waits(&r), "-", "a TCP connection");
        r.transport = 2;
        assert_eq!(waits(&r), "30/4");
        r.role = 2;
        assert_eq!(waits(&r), "-", "a listener");
        r.role = 1;
        let s = ProcessState {
            pid: 1,
            start_time: 1,
            program: "p".into(),
            records: vec![r],
            fallbacks: [0; stat_format::REASONS],
            sdp_connections: 0,
            pm_cache: Vec::new(),
        };
        assert!(table(std::slice::from_ref(&s))
            .trim_end()
            .ends_with(" 30/4"));
        assert!(json(&[s]).contains(r#""read_waits": {"polled": 30, "slept": 4}}"#));
    }
}
