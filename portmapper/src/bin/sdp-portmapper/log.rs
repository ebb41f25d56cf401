//! Structured logs: one logfmt line per event on stderr,
//! `ts=<unix seconds> level=<level> msg=<event> key=value ...`.

use std::fmt::{Display, Write as _};
use std::io::Write;
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

    fn name(self) -> &'static str {
        match self {
            Level::Error => "error",
            Level::Warn => "warn",
            Level::Info => "info",
            Level::Debug => "debug",
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub struct Logger {
    pub level: Level,
}

fn push_value(out: &mut String, v: &dyn Display) {
    let s = v.to_string();
    if !s.is_empty() && !s.contains(|c: char| c.is_whitespace() || c == '"' || c == '=') {
        out.push_str(&s);
    } else {
        let _ = write!(out, "{s:?}");
    }
}

impl Logger {
    pub fn enabled(&self, level: Level) -> bool {
        level <= self.level
    }

    pub fn log(&self, level: Level, msg: &str, fields: &[(&str, &dyn Display)]) {
        if !self.enabled(level) {
            return;
        }
        let ts = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        let mut line = String::with_capacity(128);
        let _ = write!(
            line,
            "ts={}.{:03} level={} msg={}",
            ts.as_secs(),
            ts.subsec_millis(),
            level.name(),
            msg
        );
        for (k, v) in fields {
            line.push(' ');
            line.push_str(k);
            line.push('=');
            push_value(&mut line, *v);
        }
        line.push('\n');
        // Logging must never take the daemon down.
        let _ = std::io::stderr().lock().write_all(line.as_bytes());
    }
}
