//! `sdp-stat --explain HOST:PORT [PROGRAM]`: what a connect to HOST:PORT
//! by PROGRAM would do under the preload, and why — the libsdp question
//! "why is this connection TCP?" answered before or after the fact.
//!
//! Three sources, in the order the preload consults them (docs/preload.md,
//! "Deciding"):
//! 1. the rules ([`rules::Source::current`], as the library reads them);
//! 2. the port mapper caches of the running preloaded processes (their
//!    state export): a process with a live entry uses it without asking;
//! 3. a PMReq to HOST's port mapper now: what a process with an empty
//!    cache would be told (PMAccept with the SDP port, PMDeny, or no
//!    answer).

use std::fmt::Write as _;
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use portmapper::client::{ClientConfig, Decision, Fallback, Timing};
use portmapper::net::PmClient;

use crate::json_str;
use crate::rules::{Family, Role, Rules, Source};
use crate::stat_format::{self, monotonic_ms, ProcessState};

/// What was asked.
pub struct Question {
    pub target: String,
    pub program: Option<String>,
    /// Ask the port mapper (`--no-query` turns it off).
    pub query: bool,
    pub timeout: Duration,
}

/// The rules' part of the answer.
struct RuleAnswer {
    source: String,
    family: Family,
    /// 1-based rule number and its text; `None`: no rule matched.
    rule: Option<(usize, String)>,
    /// Lines of the file that did not parse.
    errors: Vec<String>,
}

/// A live cache entry of a process for the target.
struct Cached {
    pid: u32,
    program: String,
    answer: &'static str,
    sdp_port: u16,
    /// Milliseconds left; `None` permanent.
    left_ms: Option<u64>,
    host: bool,
}

/// The port mapper's answer now.
enum PmAnswer {
    NotAsked(&'static str),
    Accept(u16),
    Deny,
    NoAnswer,
    Unreachable,
}

pub fn run(q: &Question, states: &[ProcessState], json: bool) -> Result<String, String> {
    let target = resolve(&q.target)?;
    let program = q.program.clone().unwrap_or_default();
    let rules = rule_answer(&program, &target);
    let cached = cached(states, q.program.as_deref(), &target);
    let pm = if rules.family == Family::Tcp {
        PmAnswer::NotAsked("the rule says tcp")
    } else if !q.query {
        PmAnswer::NotAsked("--no-query")
    } else {
        ask(&target, q.timeout)
    };
    let verdict = verdict(&rules, &cached, &pm);
    let answer = Answer {
        target,
        rules,
        cached,
        pm,
        verdict,
    };
    Ok(if json { answer.json(q) } else { answer.text(q) })
}

/// Everything `--explain` found.
struct Answer {
    target: SocketAddr,
    rules: RuleAnswer,
    cached: Vec<Cached>,
    pm: PmAnswer,
    /// What a connect does ("sdp", "tcp", "fails", "unknown") and why.
    verdict: (&'static str, String),
}

fn resolve(target: &str) -> Result<SocketAddr, String> {
    target
        .to_socket_addrs()
        .map_err(|e| format!("--explain {target:?}: {e} (expected HOST:PORT)"))?
        .next()
        .ok_or_else(|| format!("--explain {target:?}: no address"))
}

fn rule_answer(program: &str, target: &SocketAddr) -> RuleAnswer {
    let source = Source::current();
    let (rules, from, errors) = match &source {
        Source::AlwaysSdp(var) => (
            Rules::always_sdp(),
            format!("{var} is set: sdp for every socket"),
            Vec::new(),
        ),
        Source::None => (
            Rules::default(),
            format!("no rules file ({} absent)", crate::rules::DEFAULT_FILE),
            Vec::new(),
        ),
        Source::File { path, variable } => {
            let from = match variable {
                Some(v) => format!("{path} (from {v})"),
                None => path.clone(),
            };
            match std::fs::read_to_string(path) {
                Ok(text) => {
                    let r = Rules::parse(&text);
                    let errors = r.errors.iter().map(|e| format!("{path}: {e}")).collect();
                    (r, from, errors)
                }
                Err(e) => (
                    Rules::default(),
                    format!("{from}: unreadable ({e}), defaults apply"),
                    Vec::new(),
                ),
            }
        }
    };
    let d = rules.decide(Role::Client, program, target);
    RuleAnswer {
        source: from,
        family: d.family,
        rule: d.rule.map(|n| (n, rules.rules[n - 1].to_string())),
        errors,
    }
}

fn cached(states: &[ProcessState], program: Option<&str>, target: &SocketAddr) -> Vec<Cached> {
    let now = monotonic_ms();
    let canonical = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    let target = canonical(*target);
    let mut out = Vec::new();
    for s in states {
        if program.is_some_and(|p| p != s.program) {
            continue;
        }
        for e in &s.pm_cache {
            let key = canonical(e.key);
            let hit = if e.host {
                key.ip() == target.ip()
            } else {
                key == target
            };
            if !hit || e.expires_ms <= now {
                continue;
            }
            out.push(Cached {
                pid: s.pid,
                program: s.program.clone(),
                answer: answer_name(e.answer),
                sdp_port: e.sdp_port,
                left_ms: (e.expires_ms != u64::MAX).then(|| e.expires_ms - now),
                host: e.host,
            });
        }
    }
    out
}

fn answer_name(a: u8) -> &'static str {
    match a {
        stat_format::PM_SDP => "accept",
        stat_format::PM_DENY => "deny",
        stat_format::PM_NO_ANSWER => "no-answer",
        stat_format::PM_UNREACHABLE => "unreachable",
        _ => "unknown",
    }
}

/// One PMReq exchange with a fresh client (no cache): the answer a
/// process that never asked would get.
fn ask(target: &SocketAddr, timeout: Duration) -> PmAnswer {
    let port = std::env::var("SDP_PM_PORT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(portmapper::wire::DEFAULT_PORT);
    let client = PmClient::new(ClientConfig {
        server_port: port,
        timing: Timing {
            budget: timeout,
            ..Timing::default()
        },
        ..ClientConfig::default()
    });
    let from = SocketAddr::new(
        if target.is_ipv4() {
            std::net::Ipv4Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        },
        0,
    );
    match client.query(*target, from) {
        Decision::Sdp(a) => PmAnswer::Accept(a.port()),
        Decision::Tcp(Fallback::Denied) => PmAnswer::Deny,
        Decision::Tcp(Fallback::NoAnswer) => PmAnswer::NoAnswer,
        Decision::Tcp(Fallback::Unreachable) => PmAnswer::Unreachable,
    }
}

/// What a connect does: ("sdp" | "tcp" | "fails", why).
fn verdict(rules: &RuleAnswer, cached: &[Cached], pm: &PmAnswer) -> (&'static str, String) {
    let by_rule = match &rules.rule {
        Some((n, _)) => format!("rule {n}"),
        None => "no rule matches: both".into(),
    };
    if rules.family == Family::Tcp {
        return ("tcp", format!("rule-tcp ({by_rule})"));
    }
    let tcp_or_fail = |reason: &str| match rules.family {
        Family::Sdp => (
            "fails",
            format!("{reason}, and {by_rule} allows no TCP fallback: ECONNREFUSED"),
        ),
        _ => ("tcp", reason.to_owned()),
    };
    let mut why = match pm {
        PmAnswer::Accept(q) => ("sdp", format!("the port mapper maps it to SDP port {q}")),
        PmAnswer::Deny => tcp_or_fail("pm-deny (nothing is registered for this port)"),
        PmAnswer::NoAnswer => tcp_or_fail("pm-timeout (no port mapper answered)"),
        PmAnswer::Unreachable => tcp_or_fail("pm-unreachable (no port mapper on the host)"),
        PmAnswer::NotAsked(_) => ("unknown", "the port mapper was not asked".into()),
    };
    if !cached.is_empty() {
        let _ = write!(
            why.1,
            "; {} process(es) holding a cached answer use it instead until it expires",
            cached.len()
        );
    }
    why
}

fn pm_text(pm: &PmAnswer) -> String {
    match pm {
        PmAnswer::NotAsked(why) => format!("not asked ({why})"),
        PmAnswer::Accept(q) => format!("PMAccept: SDP port {q}"),
        PmAnswer::Deny => "PMDeny".into(),
        PmAnswer::NoAnswer => "no answer within the retries".into(),
        PmAnswer::Unreachable => "none (ICMP port unreachable)".into(),
    }
}

fn left(ms: Option<u64>) -> String {
    ms.map_or("permanent".into(), |ms| {
        format!("{:.1} s left", ms as f64 / 1000.0)
    })
}

impl Answer {
    fn text(&self, q: &Question) -> String {
        let Answer {
            target,
            rules,
            cached,
            pm,
            verdict,
        } = self;
        let mut o = String::new();
        let program = q.program.as_deref().unwrap_or("any program");
        let _ = writeln!(o, "connect to {target} by {program}:");
        let _ = writeln!(o, "  rules:       {}", rules.source);
        for e in &rules.errors {
            let _ = writeln!(o, "               {e} (line skipped)");
        }
        match &rules.rule {
            Some((n, text)) => {
                let _ = writeln!(
                    o,
                    "               rule {n} matches: {text} -> {}",
                    rules.family.name()
                );
            }
            None => {
                let _ = writeln!(o, "               no rule matches -> both");
            }
        }
        if cached.is_empty() {
            let _ = writeln!(o, "  cached:      no running process holds an answer");
        }
        for c in cached {
            let what = match c.answer {
                "accept" => format!("accept, SDP port {}", c.sdp_port),
                other if c.host => format!("{other} for every port of the host"),
                other => other.to_owned(),
            };
            let _ = writeln!(
                o,
                "  cached:      pid {} ({}): {what}, {}",
                c.pid,
                c.program,
                left(c.left_ms)
            );
        }
        let _ = writeln!(o, "  port mapper: {}", pm_text(pm));
        let _ = writeln!(
            o,
            "  so:          {}: {}",
            verdict.0.to_uppercase(),
            verdict.1
        );
        o
    }

    fn json(&self, q: &Question) -> String {
        let Answer {
            target,
            rules,
            cached,
            pm,
            verdict,
        } = self;
        let (rule, text) = match &rules.rule {
            Some((n, t)) => (n.to_string(), json_str(t)),
            None => ("null".into(), "null".into()),
        };
        let errors: Vec<String> = rules.errors.iter().map(|e| json_str(e)).collect();
        let pm = match pm {
            PmAnswer::NotAsked(why) => {
                format!("{{\"answer\": \"not-asked\", \"why\": {}}}", json_str(why))
            }
            PmAnswer::Accept(p) => format!("{{\"answer\": \"accept\", \"sdp_port\": {p}}}"),
            PmAnswer::Deny => "{\"answer\": \"deny\"}".into(),
            PmAnswer::NoAnswer => "{\"answer\": \"no-answer\"}".into(),
            PmAnswer::Unreachable => "{\"answer\": \"unreachable\"}".into(),
        };
        let cached: Vec<String> = cached
        .iter()
        .map(|c| {
            format!(
                "{{\"pid\": {}, \"program\": {}, \"answer\": \"{}\", \"host\": {}, \"sdp_port\": {}, \"expires_in_ms\": {}}}",
                c.pid,
                json_str(&c.program),
                c.answer,
                c.host,
                c.sdp_port,
                c.left_ms.map_or("null".into(), |m| m.to_string())
            )
        })
        .collect();
        format!(
        "{{\"version\": {}, \"target\": {}, \"program\": {}, \
         \"rules\": {{\"source\": {}, \"rule\": {rule}, \"text\": {text}, \"family\": \"{}\", \"errors\": [{}]}}, \
         \"cached\": [{}], \"port_mapper\": {pm}, \
         \"verdict\": {{\"transport\": \"{}\", \"why\": {}}}}}\n",
        crate::JSON_VERSION,
        json_str(&target.to_string()),
        q.program.as_deref().map_or("null".into(), json_str),
        json_str(&rules.source),
        rules.family.name(),
        errors.join(", "),
        cached.join(", "),
        verdict.0,
        json_str(&verdict.1)
    )
    }
}
