//! Structured logs: one logfmt line per event on standard error,
//! `ts=<unix seconds.millis> level=<level> msg=<event> key=value ...`
//! (docs/portmapper.md "Logs" is the stable contract).
//!
//! Under systemd, when standard error is the journal's stream
//! (`$JOURNAL_STREAM` names its device and inode), the line drops `ts=`,
//! since the journal stamps every entry, and starts with the `<N>` syslog
//! priority prefix journald reads (sd-daemon(3)), so `journalctl -p warning`
//! selects by level.

use std::fmt::{Display, Write as _};
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::time::SystemTime;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
}

impl Level {
    pub fn parse(s: &str) -> Option<Level> {
        Some(match s {
            "error" => Level::Error,
            "warn" => Level::Warn,
            "info" => Level::Info,
            "debug" => Level::Debug,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }

    /// The syslog priority (LOG_ERR, LOG_WARNING, LOG_INFO, LOG_DEBUG).
    fn syslog_priority(self) -> u8 {
        match self {
            Level::Error => 3,
            Level::Warn => 4,
            Level::Info => 6,
            Level::Debug => 7,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Logger {
    pub level: Level,
    /// Standard error is the journal: priority prefix, no timestamp.
    pub journal: bool,
}

/// Is standard error the stream `$JOURNAL_STREAM` ("<dev>:<inode>") names?
/// The variable alone is not enough: it is inherited by children whose
/// standard error may have been redirected elsewhere.
fn stderr_is_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.to_str().and_then(|v| v.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

fn push_value(out: &mut String, v: &dyn Display) {
    let s = v.to_string();
    if !s.is_empty()
        && !s.contains(|c: char| c.is_whitespace() || c.is_control() || c == '"' || c == '=')
    {
        out.push_str(&s);
    } else {
        // Quoted with escapes: a value never breaks the line.
        let _ = write!(out, "{s:?}");
    }
}

impl Logger {
    pub fn new(level: Level) -> Logger {
        Logger {
            level,
            journal: stderr_is_journal(),
        }
    }

    pub fn enabled(&self, level: Level) -> bool {
        level <= self.level
    }

    /// The line for an event, newline included.
    fn format(&self, level: Level, msg: &str, fields: &[(&str, &dyn Display)]) -> String {
        let mut line = String::with_capacity(128);
        if self.journal {
            let _ = write!(line, "<{}>", level.syslog_priority());
        } else {
            let ts = SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap_or_default();
            let _ = write!(line, "ts={}.{:03} ", ts.as_secs(), ts.subsec_millis());
        }
        let _ = write!(line, "level={} msg={}", level.name(), msg);
        for (k, v) in fields {
            line.push(' ');
            line.push_str(k);
            line.push('=');
            push_value(&mut line, *v);
        }
        line.push('\n');
        line
    }

    pub fn log(&self, level: Level, msg: &str, fields: &[(&str, &dyn Display)]) {
        if !self.enabled(level) {
            return;
        }
        let line = self.format(level, msg, fields);
        // One write per line, so lines of one event never interleave with
        // others. Logging must never take the daemon down.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn line_format() {
        let plain = Logger {
            level: Level::Debug,
            journal: false,
        };
        let l = plain.format(
            Level::Warn,
            "register_refused",
            &[
                ("port", &5001),
                ("reason", &"caller does not listen"),
                ("e", &""),
            ],
        );
        let rest = l.strip_prefix("ts=").unwrap();
        let (ts, rest) = rest.split_once(' ').unwrap();
        let (secs, millis) = ts.split_once('.').unwrap();
        assert!(secs.parse::<u64>().is_ok() && millis.len() == 3, "{l}");
        assert_eq!(
            rest,
            "level=warn msg=register_refused port=5001 reason=\"caller does not listen\" e=\"\"\n"
        );
        let journal = Logger {
            journal: true,
            ..plain
        };
        assert_eq!(
            journal.format(Level::Error, "fatal", &[("error", &"a\nb=c")]),
            "<3>level=error msg=fatal error=\"a\\nb=c\"\n"
        );
    }

    #[test]
    fn levels() {
        let l = Logger {
            level: Level::Info,
            journal: false,
        };
        assert!(l.enabled(Level::Error) && l.enabled(Level::Info));
        assert!(!l.enabled(Level::Debug));
        for lv in [Level::Error, Level::Warn, Level::Info, Level::Debug] {
            assert_eq!(Level::parse(lv.name()), Some(lv));
        }
    }
}
