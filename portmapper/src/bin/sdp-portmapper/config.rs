//! Daemon settings: the defaults, then a settings file (`--config FILE`),
//! then the command line, which wins over the file. A setting's name in the
//! file is its long option without the dashes:
//!
//! ```text
//! # /etc/sdp-portmapper.conf
//! pm-time = 60
//! rewrite-addr = 192.0.2.10
//! rewrite-addr = 192.0.2.11
//! ```
//!
//! One `name = value` per line; `#` starts a comment, blank lines are
//! skipped. A repeatable setting (`bind`, `rewrite-addr`) may repeat and
//! collects its values; given on the command line at all, it replaces the
//! file's values. On SIGHUP the daemon loads the same sources again (see
//! `daemon.rs`); [`RESTART`] names what it cannot change while running.

use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use portmapper::control;
use portmapper::server::ServerConfig;
use portmapper::wire::{PmTime, DEFAULT_PORT};

use crate::daemon::Options;
use crate::log::{Level, Logger};

/// Every setting, in the order of `--help`.
pub const NAMES: &[&str] = &[
    "port",
    "bind",
    "control",
    "pm-time",
    "accept-timeout-ms",
    "max-pending",
    "max-registrations",
    "rate",
    "burst",
    "max-sources",
    "rewrite-addr",
    "max-control-conns",
    "stats-interval-ms",
    "log-level",
];

/// Settings that may be given more than once.
const REPEATABLE: &[&str] = &["bind", "rewrite-addr"];

/// Settings a running daemon keeps until it is restarted: its sockets.
pub const RESTART: &[&str] = &["port", "bind", "control"];

/// One `name = value`, and where it was given (for error messages).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Setting {
    name: String,
    value: String,
    /// `FILE:LINE` or `--name`.
    origin: String,
}

/// The sources of the daemon's settings, kept to load them again on SIGHUP.
#[derive(Debug, Clone, Default)]
pub struct Loader {
    /// The `--config` file, if one was given.
    pub file: Option<PathBuf>,
    cli: Vec<Setting>,
}

impl Loader {
    /// The daemon's command line (after `daemon`, if given): `--NAME VALUE`
    /// for each setting, and `--config FILE`.
    pub fn from_args(args: impl IntoIterator<Item = String>) -> Result<Loader, String> {
        let mut out = Loader::default();
        let mut args = args.into_iter();
        while let Some(flag) = args.next() {
            let name = flag
                .strip_prefix("--")
                .filter(|n| *n == "config" || NAMES.contains(n))
                .ok_or_else(|| format!("unknown argument {flag}"))?;
            let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
            if name == "config" {
                if out.file.is_some() {
                    return Err("--config given twice".into());
                }
                out.file = Some(PathBuf::from(value));
            } else {
                out.cli.push(Setting {
                    name: name.to_string(),
                    value,
                    origin: flag.clone(),
                });
            }
        }
        Ok(out)
    }

    /// Defaults, overridden by the file's settings, overridden by the
    /// command line's. The error names the file and line, or the option.
    pub fn load(&self) -> Result<Options, String> {
        let mut opts = defaults();
        if let Some(path) = &self.file {
            let text = fs::read_to_string(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            for s in parse_file(path, &text)? {
                if !self.cli.iter().any(|c| c.name == s.name) {
                    apply(&mut opts, &s)?;
                }
            }
        }
        for s in &self.cli {
            apply(&mut opts, s)?;
        }
        Ok(opts)
    }
}

/// The built-in settings.
pub fn defaults() -> Options {
    Options {
        port: DEFAULT_PORT,
        binds: Vec::new(),
        control: control::default_path(),
        server: ServerConfig::default(),
        max_control_conns: 256,
        stats_interval: Duration::from_secs(10),
        log: Logger::new(Level::Info),
    }
}

fn parse_file(path: &Path, text: &str) -> Result<Vec<Setting>, String> {
    let mut out: Vec<Setting> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let origin = format!("{}:{}", path.display(), i + 1);
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            return Err(format!("{origin}: expected `name = value`, got {line:?}"));
        };
        let (name, value) = (name.trim(), value.trim());
        if !NAMES.contains(&name) {
            return Err(format!("{origin}: unknown setting {name:?}"));
        }
        if value.is_empty() {
            return Err(format!("{origin}: {name} needs a value"));
        }
        if !REPEATABLE.contains(&name) {
            if let Some(earlier) = out.iter().find(|s| s.name == name) {
                return Err(format!(
                    "{origin}: {name} already set at {}",
                    earlier.origin
                ));
            }
        }
        out.push(Setting {
            name: name.to_string(),
            value: value.to_string(),
            origin,
        });
    }
    Ok(out)
}

fn number<T: std::str::FromStr>(v: &str) -> Result<T, String> {
    v.parse().map_err(|_| format!("bad value {v:?}"))
}

/// Set one setting; a repeatable one adds a value.
fn apply(opts: &mut Options, s: &Setting) -> Result<(), String> {
    let v = s.value.as_str();
    let r = match s.name.as_str() {
        "port" => number(v).map(|x| opts.port = x),
        "bind" => number(v).map(|x| opts.binds.push(x)),
        "control" => {
            opts.control = PathBuf::from(v);
            Ok(())
        }
        "pm-time" => pm_time(v).map(|x| opts.server.pm_time = x),
        "accept-timeout-ms" => match number::<u64>(v) {
            Ok(ms) if (1..=3_600_000).contains(&ms) => {
                opts.server.accept_timeout = Duration::from_millis(ms);
                Ok(())
            }
            Ok(_) => Err("must be 1..=3600000".into()),
            Err(e) => Err(e),
        },
        "max-pending" => number(v).map(|x| opts.server.max_pending = x),
        "max-registrations" => number(v).map(|x| opts.server.max_registrations = x),
        "rate" => number(v).map(|x| opts.server.rate_per_sec = x),
        "burst" => number(v).map(|x| opts.server.burst = x),
        "max-sources" => number(v).map(|x| opts.server.max_sources = x),
        "rewrite-addr" => number::<IpAddr>(v).map(|x| opts.server.rewrite_addrs.push(x)),
        "max-control-conns" => number(v).map(|x| opts.max_control_conns = x),
        "stats-interval-ms" => number(v).map(|x| opts.stats_interval = Duration::from_millis(x)),
        "log-level" => Level::parse(v)
            .map(|l| opts.log.level = l)
            .ok_or_else(|| format!("bad value {v:?} (error, warn, info or debug)")),
        other => Err(format!("unknown setting {other:?}")),
    };
    r.map_err(|e| {
        if s.origin.starts_with("--") {
            format!("{}: {e}", s.origin)
        } else {
            format!("{}: {}: {e}", s.origin, s.name)
        }
    })
}

fn pm_time(v: &str) -> Result<PmTime, String> {
    if v == "permanent" {
        return Ok(PmTime::PERMANENT);
    }
    match v.parse::<f64>() {
        Ok(secs) if (0.0..=254.0).contains(&secs) => {
            Ok(PmTime::from_duration(Duration::from_secs_f64(secs)))
        }
        _ => Err(format!("bad value {v:?} (0..=254 seconds, or permanent)")),
    }
}

/// A setting's value as the log shows it (lists joined with commas).
pub fn value_of(opts: &Options, name: &str) -> String {
    let join = |v: &[IpAddr]| {
        v.iter()
            .map(IpAddr::to_string)
            .collect::<Vec<_>>()
            .join(",")
    };
    match name {
        "port" => opts.port.to_string(),
        "bind" => join(&opts.binds),
        "control" => opts.control.display().to_string(),
        "pm-time" => match opts.server.pm_time {
            PmTime::PERMANENT => "permanent".into(),
            t => t.duration().as_secs_f64().to_string(),
        },
        "accept-timeout-ms" => opts.server.accept_timeout.as_millis().to_string(),
        "max-pending" => opts.server.max_pending.to_string(),
        "max-registrations" => opts.server.max_registrations.to_string(),
        "rate" => opts.server.rate_per_sec.to_string(),
        "burst" => opts.server.burst.to_string(),
        "max-sources" => opts.server.max_sources.to_string(),
        "rewrite-addr" => join(&opts.server.rewrite_addrs),
        "max-control-conns" => opts.max_control_conns.to_string(),
        "stats-interval-ms" => opts.stats_interval.as_millis().to_string(),
        "log-level" => opts.log.level.name().to_string(),
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli(args: &[&str]) -> Loader {
        Loader::from_args(args.iter().map(|s| s.to_string())).unwrap()
    }

    fn file_settings(text: &str) -> Result<Vec<Setting>, String> {
        parse_file(Path::new("/etc/pm.conf"), text)
    }

    #[test]
    fn file_syntax() {
        let s = file_settings(
            "# comment\n\n  pm-time = 60  # trailing comment\nbind=127.0.0.1\nbind = ::1\n",
        )
        .unwrap();
        let pairs: Vec<(&str, &str, &str)> = s
            .iter()
            .map(|s| (s.name.as_str(), s.value.as_str(), s.origin.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                ("pm-time", "60", "/etc/pm.conf:3"),
                ("bind", "127.0.0.1", "/etc/pm.conf:4"),
                ("bind", "::1", "/etc/pm.conf:5"),
            ]
        );
    }

    #[test]
    fn file_errors_name_file_and_line() {
        for (text, want) in [
            (
                "port = 1\nnonsense\n",
                "/etc/pm.conf:2: expected `name = value`",
            ),
            (
                "\n\nfrobnicate = 1\n",
                "/etc/pm.conf:3: unknown setting \"frobnicate\"",
            ),
            ("rate =\n", "/etc/pm.conf:1: rate needs a value"),
            (
                "rate = 1\nrate = 2\n",
                "/etc/pm.conf:2: rate already set at /etc/pm.conf:1",
            ),
            ("--port = 1\n", "/etc/pm.conf:1: unknown setting \"--port\""),
        ] {
            let e = file_settings(text).unwrap_err();
            assert!(e.starts_with(want), "{text:?}: {e}");
        }
    }

    #[test]
    fn bad_values_name_their_origin() {
        let mut o = defaults();
        let s = |name: &str, value: &str| Setting {
            name: name.into(),
            value: value.into(),
            origin: "f:7".into(),
        };
        for (name, value) in [
            ("port", "70000"),
            ("pm-time", "255"),
            ("pm-time", "-1"),
            ("accept-timeout-ms", "0"),
            ("rewrite-addr", "host"),
            ("log-level", "loud"),
        ] {
            let e = apply(&mut o, &s(name, value)).unwrap_err();
            assert!(e.starts_with(&format!("f:7: {name}: ")), "{e}");
        }
        let e = cli(&["--rate", "x"]).load().unwrap_err();
        assert_eq!(e, "--rate: bad value \"x\"");
    }

    #[test]
    fn command_line_parsing() {
        let l = cli(&["--config", "/x.conf", "--port", "0", "--bind", "::1"]);
        assert_eq!(l.file, Some(PathBuf::from("/x.conf")));
        let o = l.clone().load_without_file();
        assert_eq!(
            (o.port, o.binds),
            (0, vec!["::1".parse::<IpAddr>().unwrap()])
        );
        for (args, want) in [
            (&["--nope", "1"][..], "unknown argument --nope"),
            (&["port", "1"][..], "unknown argument port"),
            (&["--port"][..], "--port needs a value"),
            (
                &["--config", "a", "--config", "b"][..],
                "--config given twice",
            ),
        ] {
            let e = Loader::from_args(args.iter().map(|s| s.to_string())).unwrap_err();
            assert_eq!(e, want);
        }
    }

    #[test]
    fn command_line_wins_over_file() {
        let dir = std::env::temp_dir().join(format!("pm-config-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("pm.conf");
        fs::write(
            &path,
            "pm-time = 10\nrate = 7\nrewrite-addr = 192.0.2.1\nrewrite-addr = 192.0.2.2\n",
        )
        .unwrap();
        let mut args = vec!["--config".to_string(), path.display().to_string()];
        args.extend(["--pm-time", "20", "--rewrite-addr", "192.0.2.9"].map(String::from));
        let o = Loader::from_args(args).unwrap().load().unwrap();
        assert_eq!(value_of(&o, "pm-time"), "20");
        assert_eq!(value_of(&o, "rate"), "7");
        // A repeatable option on the command line replaces the file's list.
        assert_eq!(value_of(&o, "rewrite-addr"), "192.0.2.9");
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn missing_file() {
        let e = cli(&["--config", "/nonexistent/pm.conf"])
            .load()
            .unwrap_err();
        assert!(e.starts_with("cannot read /nonexistent/pm.conf: "), "{e}");
    }

    #[test]
    fn every_setting_has_a_value_to_show() {
        let o = defaults();
        for name in NAMES {
            let v = value_of(&o, name);
            let lists = ["bind", "rewrite-addr"];
            assert!(!v.is_empty() || lists.contains(name), "{name}");
        }
        assert_eq!(value_of(&o, "pm-time"), "30");
        assert!(RESTART.iter().all(|r| NAMES.contains(r)));
    }

    impl Loader {
        fn load_without_file(mut self) -> Options {
            self.file = None;
            self.load().unwrap()
        }
    }
}
