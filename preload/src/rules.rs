//! Which connections go over SDP: the `libsdp.conf` rule language.
//!
//! ```text
//! # comment
//! log [destination stderr|syslog|file <name>] [min-level <1-9>]
//! use <sdp|tcp|both> <server|listen|client|connect> [<program-glob>] <address[/prefix]|*>:<port[-port]|*>
//! ```
//!
//! Rules are tried in file order and the first that matches decides; when
//! none matches, the answer is `both` (DESIGN §6). `both` means: a client
//! tries SDP and silently falls back to TCP; a server listens on both. `sdp`
//! means SDP only (no fallback); `tcp` leaves the socket alone.
//!
//! The program glob matches the program's name without its directory, with
//! `*` and `?` as in the shell. Addresses are IPv4 or IPv6 (an IPv6 address
//! with a port is written `[addr]:port` or `addr:port`, the port after the
//! last colon); an IPv4-mapped IPv6 address matches IPv4 rules.
//!
//! A line that does not parse is reported with its line number and skipped;
//! the other lines still apply.
//!
//! Which rules apply ([`Source::from_env`]) follows the OFED libsdp: with
//! `SIMPLE_LIBSDP` or `ALWAYS_USE_SDP` set, SDP for every socket and no
//! file; else the file `SDP_CONFIG` or `LIBSDP_CONFIG_FILE` names; else
//! `/etc/libsdp.conf` if it exists. As in libsdp, an IPv4 rule address of
//! `0.0.0.0` matches every address.
//!
//! This file stands alone (std only): `sdp-stat --explain` includes it.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// What a rule asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    /// SDP only: no TCP fallback.
    Sdp,
    /// Plain TCP: the preload stays out of the way.
    Tcp,
    /// SDP when the peer speaks it, TCP otherwise.
    Both,
}

impl Family {
    /// The word a rule uses for it.
    pub fn name(self) -> &'static str {
        match self {
            Family::Sdp => "sdp",
            Family::Tcp => "tcp",
            Family::Both => "both",
        }
    }
}

/// Which side of a connection a rule is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// `server` / `listen`: the address a socket listens on.
    Server,
    /// `client` / `connect`: the address a socket connects to.
    Client,
}

/// The rules file libsdp reads when no variable names one.
pub const DEFAULT_FILE: &str = "/etc/libsdp.conf";

/// Where the rules come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// `SIMPLE_LIBSDP` or `ALWAYS_USE_SDP` (the variable) is set: SDP for
    /// every socket, no file read.
    AlwaysSdp(&'static str),
    /// A rules file: named by a variable (`Some(variable)`), or the
    /// default file.
    File {
        path: String,
        variable: Option<&'static str>,
    },
    /// No file: `both` everywhere.
    None,
}

impl Source {
    /// Decides from the environment (`var` reads a variable) and whether
    /// [`DEFAULT_FILE`] exists.
    pub fn from_env(var: impl Fn(&str) -> Option<String>, default_exists: bool) -> Source {
        // libsdp tests these for presence: an empty value counts.
        for name in ["SIMPLE_LIBSDP", "ALWAYS_USE_SDP"] {
            if var(name).is_some() {
                return Source::AlwaysSdp(name);
            }
        }
        for name in ["SDP_CONFIG", "LIBSDP_CONFIG_FILE"] {
            if let Some(path) = var(name).filter(|p| !p.is_empty()) {
                return Source::File {
                    path,
                    variable: Some(name),
                };
            }
        }
        if default_exists {
            return Source::File {
                path: DEFAULT_FILE.to_owned(),
                variable: None,
            };
        }
        Source::None
    }

    /// The source of this process: its environment and file system.
    pub fn current() -> Source {
        Source::from_env(
            |name| std::env::var(name).ok(),
            std::path::Path::new(DEFAULT_FILE).exists(),
        )
    }
}

/// Where log lines go (`log destination ...`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogDestination {
    Stderr,
    Syslog,
    File(String),
}

/// The `log` settings of a configuration file.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LogSettings {
    pub destination: Option<LogDestination>,
    /// 1 (debug) to 9 (errors only), as in libsdp.
    pub min_level: Option<u8>,
}

/// One `use` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub family: Family,
    pub role: Role,
    /// `None` matches every program.
    pub program: Option<String>,
    /// Network and prefix length; `None` matches every address.
    pub network: Option<(IpAddr, u8)>,
    /// Inclusive port range; `None` matches every port.
    pub ports: Option<(u16, u16)>,
}

impl fmt::Display for Rule {
    /// The rule as a `use` line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let family = self.family.name();
        let role = match self.role {
            Role::Server => "server",
            Role::Client => "client",
        };
        let program = self.program.as_deref().unwrap_or("*");
        write!(f, "use {family} {role} {program} ")?;
        match self.network {
            None => write!(f, "*")?,
            Some((IpAddr::V6(a), p)) => write!(f, "[{a}]/{p}")?,
            Some((a, p)) => write!(f, "{a}/{p}")?,
        }
        match self.ports {
            None => write!(f, ":*"),
            Some((lo, hi)) if lo == hi => write!(f, ":{lo}"),
            Some((lo, hi)) => write!(f, ":{lo}-{hi}"),
        }
    }
}

/// A line of a configuration file that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

impl std::error::Error for ParseError {}

/// A parsed configuration: the rules in file order, the log settings, and
/// the lines that were skipped.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rules {
    pub rules: Vec<Rule>,
    pub log: LogSettings,
    pub errors: Vec<ParseError>,
}

/// The decision for one socket, with the rule that made it (for
/// `sdp-stat`'s "why").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub family: Family,
    /// 1-based index of the matching rule in file order; `None` for the
    /// default.
    pub rule: Option<usize>,
}

impl Rules {
    /// SDP only for every socket of both roles (`SIMPLE_LIBSDP`).
    pub fn always_sdp() -> Rules {
        let all = |role| Rule {
            family: Family::Sdp,
            role,
            program: None,
            network: None,
            ports: None,
        };
        Rules {
            rules: vec![all(Role::Server), all(Role::Client)],
            ..Rules::default()
        }
    }

    /// Parses the text of a configuration file.
    ///
    /// ```
    /// use sdp_preload::rules::{Family, Role, Rules};
    ///
    /// let rules = Rules::parse("use tcp client * *:22\nuse sdp client iperf* 10.0.0.0/8:5201-5210\n");
    /// assert!(rules.errors.is_empty());
    /// let decide = |prog, addr: &str| rules.decide(Role::Client, prog, &addr.parse().unwrap()).family;
    /// assert_eq!(decide("ssh", "10.1.2.3:22"), Family::Tcp);
    /// assert_eq!(decide("iperf3", "10.1.2.3:5201"), Family::Sdp);
    /// assert_eq!(decide("iperf3", "192.168.0.1:5201"), Family::Both);
    /// ```
    pub fn parse(text: &str) -> Rules {
        let mut rules = Rules::default();
        for (index, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or("").trim();
            if line.is_empty() {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            let result = match words.first() {
                Some(&"use") => parse_use(&words[1..]).map(|rule| rules.rules.push(rule)),
                Some(&"log") => parse_log(&words[1..], &mut rules.log),
                Some(other) => Err(format!("unknown statement {other:?} (expected use or log)")),
                None => Ok(()),
            };
            if let Err(message) = result {
                rules.errors.push(ParseError {
                    line: index + 1,
                    message,
                });
            }
        }
        rules
    }

    /// Decides for a socket in `role` of `program` (its name without
    /// directory) at `addr` (the listening address for a server, the
    /// destination for a client).
    pub fn decide(&self, role: Role, program: &str, addr: &SocketAddr) -> Decision {
        let ip = canonical(addr.ip());
        for (index, rule) in self.rules.iter().enumerate() {
            if rule.role == role
                && rule
                    .program
                    .as_deref()
                    .is_none_or(|g| glob_match(g, program))
                && rule
                    .network
                    .is_none_or(|(net, prefix)| in_network(ip, net, prefix))
                && rule
                    .ports
                    .is_none_or(|(lo, hi)| (lo..=hi).contains(&addr.port()))
            {
                return Decision {
                    family: rule.family,
                    rule: Some(index + 1),
                };
            }
        }
        Decision {
            family: Family::Both,
            rule: None,
        }
    }
}

fn parse_use(words: &[&str]) -> Result<Rule, String> {
    let (family, role, program, target) = match *words {
        [family, role, target] => (family, role, None, target),
        [family, role, program, target] => (family, role, Some(program), target),
        _ => {
            return Err(
                "expected: use <sdp|tcp|both> <server|listen|client|connect> [program] <address>:<ports>"
                    .into(),
            )
        }
    };
    let family = match family {
        "sdp" => Family::Sdp,
        "tcp" => Family::Tcp,
        "both" => Family::Both,
        other => {
            return Err(format!(
                "unknown address family {other:?} (sdp, tcp or both)"
            ))
        }
    };
    let role = match role {
        "server" | "listen" => Role::Server,
        "client" | "connect" => Role::Client,
        other => {
            return Err(format!(
                "unknown role {other:?} (server, listen, client or connect)"
            ))
        }
    };
    let program = program.filter(|p| *p != "*").map(str::to_owned);
    let (address, ports) = split_address_port(target)?;
    Ok(Rule {
        family,
        role,
        program,
        network: parse_network(&address)?,
        ports: parse_ports(ports)?,
    })
}

/// Splits `addr:ports`, `[v6addr]:ports`, `[v6addr]/prefix:ports` or
/// `v6addr:ports` into the address (with its prefix) and the ports.
fn split_address_port(target: &str) -> Result<(String, &str), String> {
    if let Some(rest) = target.strip_prefix('[') {
        let (addr, after) = rest
            .split_once(']')
            .ok_or_else(|| format!("missing ']' in {target:?}"))?;
        let (prefix, ports) = after
            .rsplit_once(':')
            .ok_or_else(|| format!("missing ':<ports>' in {target:?}"))?;
        return Ok((format!("{addr}{prefix}"), ports));
    }
    target
        .rsplit_once(':')
        .map(|(addr, ports)| (addr.to_owned(), ports))
        .ok_or_else(|| format!("expected <address>:<ports>, got {target:?}"))
}

fn parse_network(text: &str) -> Result<Option<(IpAddr, u8)>, String> {
    if text == "*" {
        return Ok(None);
    }
    let (addr, prefix) = match text.split_once('/') {
        Some((addr, prefix)) => (addr, Some(prefix)),
        None => (text, None),
    };
    let addr: IpAddr = addr.parse().map_err(|_| format!("bad address {addr:?}"))?;
    let addr = canonical(addr);
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let prefix = match prefix {
        None => max,
        Some(p) => match p.parse::<u8>() {
            Ok(p) if p <= max => p,
            _ => return Err(format!("bad prefix length {p:?} (0 to {max})")),
        },
    };
    Ok(Some((addr, prefix)))
}

fn parse_ports(text: &str) -> Result<Option<(u16, u16)>, String> {
    if text == "*" {
        return Ok(None);
    }
    let port = |p: &str| {
        p.parse::<u16>()
            .map_err(|_| format!("bad port {p:?} (0 to 65535)"))
    };
    let (lo, hi) = match text.split_once('-') {
        Some((lo, hi)) => (port(lo)?, port(hi)?),
        None => (port(text)?, port(text)?),
    };
    if lo > hi {
        return Err(format!("empty port range {text:?}"));
    }
    Ok(Some((lo, hi)))
}

fn parse_log(words: &[&str], log: &mut LogSettings) -> Result<(), String> {
    let mut rest = words;
    while let Some((&key, tail)) = rest.split_first() {
        match (key, tail) {
            ("destination", ["stderr", tail @ ..]) => {
                log.destination = Some(LogDestination::Stderr);
                rest = tail;
            }
            ("destination", ["syslog", tail @ ..]) => {
                log.destination = Some(LogDestination::Syslog);
                rest = tail;
            }
            ("destination", ["file", name, tail @ ..]) => {
                log.destination = Some(LogDestination::File((*name).to_owned()));
                rest = tail;
            }
            ("min-level", [level, tail @ ..]) => {
                log.min_level = match level.parse::<u8>() {
                    Ok(l @ 1..=9) => Some(l),
                    _ => return Err(format!("bad min-level {level:?} (1 to 9)")),
                };
                rest = tail;
            }
            _ => {
                return Err(format!(
                "bad log statement at {key:?}: expected destination stderr|syslog|file <name> or min-level <1-9>"
            ))
            }
        }
    }
    Ok(())
}

/// An IPv4-mapped IPv6 address as the IPv4 address it carries.
fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

fn in_network(ip: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (ip, net) {
        // libsdp: "0.0.0.0" as a rule address matches any address.
        (_, IpAddr::V4(net)) if net.is_unspecified() => true,
        (IpAddr::V4(ip), IpAddr::V4(net)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (IpAddr::V6(ip), IpAddr::V6(net)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

/// Shell-style match of `*` (any run) and `?` (any one character).
fn glob_match(pattern: &str, name: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let n: Vec<char> = name.chars().collect();
    let (mut pi, mut ni) = (0, 0);
    // Position after the last `*` and the name position it was tried at.
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi + 1, ni));
                pi += 1;
            }
            Some(&c) if c == '?' || c == n[ni] => {
                pi += 1;
                ni += 1;
            }
            _ => match star {
                Some((after, tried)) => {
                    pi = after;
                    ni = tried + 1;
                    star = Some((after, tried + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// The statements of the `libsdp.conf` the OFED library shipped: its
    /// one `log` line and two `use` lines, and the example statements its
    /// comments gave (here uncommented, in the same order, ahead of the
    /// defaults as the file told users to put them).
    const OFED: &str = "\
# errors only, to /tmp/libsdp.log.<uid> (/var/log/libsdp.log for root)
log min-level 9 destination file libsdp.log
# the examples, one per kind of rule
#log min-level 1 destination file libsdp.log
#log min-level 7 destination stderr
#log min-level 9 destination syslog
use sdp connect * 192.168.1.0/24:*
use sdp listen ttcp *:5001
use tcp server ttcp* *:22-25
use both server * *:8080
use both connect * 11.4.8.0/24:22
# the defaults: servers listen on both, clients try SDP first
use both server * *:*
use both client * *:*
";

    #[test]
    fn the_ofed_file_parses_and_each_rule_matches_as_in_libsdp() {
        let rules = Rules::parse(OFED);
        assert_eq!(rules.errors, vec![]);
        assert_eq!(
            rules.log,
            LogSettings {
                destination: Some(LogDestination::File("libsdp.log".into())),
                min_level: Some(9),
            }
        );
        assert_eq!(rules.rules.len(), 7);
        // The commented log lines parse too.
        for line in OFED.lines().filter(|l| l.starts_with("#log")) {
            assert_eq!(Rules::parse(&line[1..]).errors, vec![], "{line}");
        }
        // (role, program, address) → (family, rule): libsdp's matcher takes
        // the first rule of the role whose program glob, port range and
        // network all match, else "both".
        let cases = [
            (Role::Client, "curl", "192.168.1.7:80", Family::Sdp, Some(1)),
            (
                Role::Client,
                "curl",
                "192.168.2.7:80",
                Family::Both,
                Some(7),
            ),
            (Role::Client, "ssh", "11.4.8.9:22", Family::Both, Some(5)),
            (Role::Client, "ssh", "11.4.9.9:22", Family::Both, Some(7)),
            (
                Role::Client,
                "ttcp",
                "[fe80::1]:5001",
                Family::Both,
                Some(7),
            ),
            (Role::Server, "ttcp", "0.0.0.0:5001", Family::Sdp, Some(2)),
            (Role::Server, "nttcp", "0.0.0.0:5001", Family::Both, Some(6)),
            (Role::Server, "ttcp", "0.0.0.0:23", Family::Tcp, Some(3)),
            (Role::Server, "ttcp-x", "10.0.0.1:25", Family::Tcp, Some(3)),
            (Role::Server, "ttcp", "0.0.0.0:26", Family::Both, Some(6)),
            (Role::Server, "sshd", "0.0.0.0:22", Family::Both, Some(6)),
            (Role::Server, "nginx", "[::]:8080", Family::Both, Some(4)),
        ];
        for (role, program, address, family, rule) in cases {
            let d = rules.decide(role, program, &addr(address));
            assert_eq!(
                (d.family, d.rule),
                (family, rule),
                "{role:?} {program} {address}"
            );
        }
    }

    #[test]
    fn a_rule_prints_as_a_line_that_parses_to_it() {
        let text = "use tcp server ttcp* 10.0.0.0/8:22-25\nuse both client * [2001:db8::]/32:*\nuse sdp client *:7\n";
        let rules = Rules::parse(text);
        let lines: Vec<String> = rules.rules.iter().map(|r| r.to_string()).collect();
        assert_eq!(
            lines,
            [
                "use tcp server ttcp* 10.0.0.0/8:22-25",
                "use both client * [2001:db8::]/32:*",
                "use sdp client * *:7"
            ]
        );
        assert_eq!(Rules::parse(&lines.join("\n")).rules, rules.rules);
    }

    #[test]
    fn an_unspecified_ipv4_rule_address_matches_every_address() {
        let rules = Rules::parse("use tcp client * 0.0.0.0:7\n");
        for a in ["10.1.1.1:7", "[2001:db8::1]:7"] {
            assert_eq!(
                rules.decide(Role::Client, "x", &addr(a)).family,
                Family::Tcp
            );
        }
        assert_eq!(
            rules.decide(Role::Client, "x", &addr("10.1.1.1:8")).family,
            Family::Both
        );
    }

    #[test]
    fn the_source_follows_libsdp() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let file = |path: &str, variable| Source::File {
            path: path.into(),
            variable,
        };
        assert_eq!(Source::from_env(env(&[]), false), Source::None);
        assert_eq!(Source::from_env(env(&[]), true), file(DEFAULT_FILE, None));
        assert_eq!(
            Source::from_env(env(&[("LIBSDP_CONFIG_FILE", "/a")]), true),
            file("/a", Some("LIBSDP_CONFIG_FILE"))
        );
        assert_eq!(
            Source::from_env(
                env(&[("LIBSDP_CONFIG_FILE", "/a"), ("SDP_CONFIG", "/b")]),
                true
            ),
            file("/b", Some("SDP_CONFIG"))
        );
        // Set, even empty, wins over any file.
        assert_eq!(
            Source::from_env(env(&[("SIMPLE_LIBSDP", ""), ("SDP_CONFIG", "/b")]), true),
            Source::AlwaysSdp("SIMPLE_LIBSDP")
        );
        assert_eq!(
            Source::from_env(env(&[("ALWAYS_USE_SDP", "1")]), false),
            Source::AlwaysSdp("ALWAYS_USE_SDP")
        );
        let all = Rules::always_sdp();
        for (role, a) in [(Role::Client, "10.0.0.1:22"), (Role::Server, "[::]:80")] {
            assert_eq!(all.decide(role, "sshd", &addr(a)).family, Family::Sdp);
        }
    }

    #[test]
    fn first_match_wins_and_default_is_both() {
        let rules = Rules::parse(
            "# keep ssh on TCP\n\
             use tcp client * *:22\n\
             use sdp connect * 10.0.0.0/8:*\n\
             use tcp listen redis-* *:6379\n\
             use both server * *:*\n",
        );
        assert_eq!(rules.errors, vec![]);
        let d = rules.decide(Role::Client, "ssh", &addr("10.0.0.1:22"));
        assert_eq!((d.family, d.rule), (Family::Tcp, Some(1)));
        let d = rules.decide(Role::Client, "curl", &addr("10.9.9.9:80"));
        assert_eq!((d.family, d.rule), (Family::Sdp, Some(2)));
        let d = rules.decide(Role::Client, "curl", &addr("11.0.0.1:80"));
        assert_eq!((d.family, d.rule), (Family::Both, None));
        let d = rules.decide(Role::Server, "redis-server", &addr("0.0.0.0:6379"));
        assert_eq!((d.family, d.rule), (Family::Tcp, Some(3)));
        let d = rules.decide(Role::Server, "nginx", &addr("0.0.0.0:6379"));
        assert_eq!((d.family, d.rule), (Family::Both, Some(4)));
    }

    #[test]
    fn program_is_optional_and_globs_match() {
        let rules = Rules::parse("use tcp client *:7\nuse sdp client t?cp *:*\n");
        assert_eq!(rules.errors, vec![]);
        assert_eq!(rules.rules[0].program, None);
        assert_eq!(
            rules
                .decide(Role::Client, "ttcp", &addr("1.2.3.4:9"))
                .family,
            Family::Sdp
        );
        assert_eq!(
            rules.decide(Role::Client, "tcp", &addr("1.2.3.4:9")).family,
            Family::Both
        );
        assert!(glob_match("db2*", "db2inst"));
        assert!(glob_match("*a*b", "xxaxxb"));
        assert!(!glob_match("*a*b", "xxaxxbc"));
        assert!(glob_match("", ""));
        assert!(!glob_match("", "x"));
        assert!(glob_match("**", ""));
    }

    #[test]
    fn ipv6_rules_and_mapped_addresses() {
        let rules = Rules::parse(
            "use tcp client [fe80::]/10:80\n\
             use sdp client 2001:db8::/32:5201-5202\n\
             use tcp client 192.168.0.0/16:*\n",
        );
        assert_eq!(rules.errors, vec![]);
        assert_eq!(
            rules
                .decide(Role::Client, "p", &addr("[fe80::1]:80"))
                .family,
            Family::Tcp
        );
        assert_eq!(
            rules
                .decide(Role::Client, "p", &addr("[2001:db8::5]:5202"))
                .family,
            Family::Sdp
        );
        assert_eq!(
            rules
                .decide(Role::Client, "p", &addr("[2001:db8::5]:5203"))
                .family,
            Family::Both
        );
        assert_eq!(
            rules
                .decide(Role::Client, "p", &addr("[::ffff:192.168.3.4]:1"))
                .family,
            Family::Tcp
        );
    }

    #[test]
    fn log_statements() {
        let rules =
            Rules::parse("log min-level 9 destination file libsdp.log\nlog destination stderr\n");
        assert_eq!(rules.errors, vec![]);
        assert_eq!(
            rules.log,
            LogSettings {
                destination: Some(LogDestination::Stderr),
                min_level: Some(9),
            }
        );
    }

    #[test]
    fn bad_lines_are_reported_and_skipped() {
        let rules = Rules::parse(
            "use tcp client * *:22\n\
             use maybe client * *:*\n\
             use sdp sideways * *:*\n\
             use sdp client * 10.0.0.0/33:*\n\
             use sdp client * 10.0.0.1:70000\n\
             use sdp client * 10.0.0.1:9-8\n\
             use sdp client * 10.0.0.1\n\
             use sdp\n\
             log min-level 0\n\
             log destination pigeon\n\
             frobnicate\n\
             use sdp client * *:5201\n",
        );
        let lines: Vec<usize> = rules.errors.iter().map(|e| e.line).collect();
        assert_eq!(lines, (2..=11).collect::<Vec<_>>());
        assert_eq!(rules.rules.len(), 2);
        assert_eq!(
            rules.errors[0].to_string(),
            "line 2: unknown address family \"maybe\" (sdp, tcp or both)"
        );
        assert_eq!(
            rules
                .decide(Role::Client, "x", &addr("1.1.1.1:5201"))
                .family,
            Family::Sdp
        );
    }
}
