//! Configuration read once at start: the rules file (`SDP_CONFIG`, else
//! `LIBSDP_CONFIG_FILE`; none means "both" everywhere) and logging
//! (`SDP_LOG`, `SDP_LOG_FILE`, which win over the file's `log` statements).

use crate::log::{self, Destination, Level};
use crate::rules::{LogDestination, Rules};
use std::ffi::CString;
use std::sync::OnceLock;

/// What the library runs with.
#[derive(Debug, Default)]
pub struct Config {
    pub rules: Rules,
    /// The rules file, if one was named.
    pub path: Option<String>,
}

static CONFIG: OnceLock<Config> = OnceLock::new();
static PROGRAM: OnceLock<String> = OnceLock::new();

extern "C" {
    /// glibc: the program name without its directory (argv[0]'s last part).
    static program_invocation_short_name: *const libc::c_char;
}

/// The program's name as rules match it (`argv[0]` without directory).
pub fn program() -> &'static str {
    PROGRAM.get_or_init(|| {
        // SAFETY: glibc sets this pointer before any constructor runs and
        // it points to a NUL-terminated string in argv[0] (or is null).
        let p = unsafe { program_invocation_short_name };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: non-null and NUL-terminated, as above.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    })
}

/// The configuration, loaded on first use.
pub fn get() -> &'static Config {
    CONFIG.get_or_init(load)
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn load() -> Config {
    let env_level = env("SDP_LOG");
    let parsed_level = env_level.as_deref().map(Level::parse);
    if let Some(Some(level)) = parsed_level {
        log::set_level(level);
    }
    let env_file = env("SDP_LOG_FILE");

    let path = env("SDP_CONFIG").or_else(|| env("LIBSDP_CONFIG_FILE"));
    let (rules, read_error) = match &path {
        None => (Rules::default(), None),
        Some(p) => match std::fs::read_to_string(p) {
            Ok(text) => (Rules::parse(&text), None),
            Err(e) => (Rules::default(), Some(e)),
        },
    };

    if parsed_level.is_none() {
        if let Some(min) = rules.log.min_level {
            log::set_level(Some(Level::from_libsdp(min)));
        }
    }
    let destination = match (&env_file, &rules.log.destination) {
        (Some(f), _) => CString::new(f.as_str()).ok().map(Destination::File),
        (None, Some(LogDestination::File(f))) => {
            CString::new(f.as_str()).ok().map(Destination::File)
        }
        (None, Some(LogDestination::Syslog)) => Some(Destination::Syslog),
        _ => None,
    };
    log::set_destination(destination.unwrap_or(Destination::Stderr));

    if let (Some(text), Some(None)) = (&env_level, parsed_level) {
        crate::log!(
            Level::Warn,
            "SDP_LOG={text:?} is not a level (error, warn, info, debug, trace)"
        );
    }
    if let (Some(p), Some(e)) = (&path, read_error) {
        crate::log!(
            Level::Warn,
            "{p}: cannot read the rules file ({e}); using the defaults"
        );
    }
    if let Some(p) = &path {
        for error in &rules.errors {
            crate::log!(Level::Warn, "{p}: {error} (line skipped)");
        }
        crate::log!(
            Level::Debug,
            "{p}: {} rules for program {:?}",
            rules.rules.len(),
            program()
        );
    }
    Config { rules, path }
}
