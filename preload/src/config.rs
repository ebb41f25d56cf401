//! Configuration read once at start: the rules ([`Source::current`]:
//! `SIMPLE_LIBSDP`/`ALWAYS_USE_SDP`, else the file `SDP_CONFIG` or
//! `LIBSDP_CONFIG_FILE` names, else `/etc/libsdp.conf` if it exists; none
//! means "both" everywhere) and logging (`SDP_LOG`, `SDP_LOG_FILE`, which
//! win over the file's `log` statements).

use crate::log::{self, Destination, Level};
use crate::rules::{LogDestination, Rules, Source};
use std::ffi::CString;
use std::sync::OnceLock;

/// What the library runs with.
#[derive(Debug, Default)]
pub struct Config {
    pub rules: Rules,
    /// The rules file, if one was read.
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

/// The variables that name files the library reads or writes.
const FILE_VARIABLES: [&str; 3] = ["SDP_CONFIG", "LIBSDP_CONFIG_FILE", "SDP_LOG_FILE"];

/// A program in secure-execution mode (setuid, setgid, capabilities: a
/// library loaded by `/etc/ld.so.preload`) takes no file names from its
/// caller's environment, as the loader takes no `LD_PRELOAD`.
fn secure() -> bool {
    // SAFETY: getauxval has no preconditions.
    unsafe { libc::getauxval(libc::AT_SECURE) != 0 }
}

/// A variable, unless it names a file and the program runs secure.
fn trusted_env(name: &str, secure: bool) -> Option<String> {
    if secure && FILE_VARIABLES.contains(&name) {
        return None;
    }
    std::env::var(name).ok()
}

fn load() -> Config {
    let env_level = env("SDP_LOG");
    let parsed_level = env_level.as_deref().map(Level::parse);
    if let Some(Some(level)) = parsed_level {
        log::set_level(level);
    }
    let secure = secure();
    let env_file = trusted_env("SDP_LOG_FILE", secure).filter(|v| !v.is_empty());

    let source = Source::from_env(
        |name| trusted_env(name, secure),
        std::path::Path::new(crate::rules::DEFAULT_FILE).exists(),
    );
    let path = match &source {
        Source::File { path, .. } => Some(path.clone()),
        _ => None,
    };
    let (rules, read_error) = match &source {
        Source::AlwaysSdp(_) => (Rules::always_sdp(), None),
        Source::None => (Rules::default(), None),
        Source::File { path, .. } => match std::fs::read_to_string(path) {
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
            // SAFETY: getuid has no preconditions.
            let uid = unsafe { libc::getuid() };
            CString::new(libsdp_log_path(f, uid))
                .ok()
                .map(Destination::File)
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
    if let Source::AlwaysSdp(variable) = source {
        crate::log!(
            Level::Debug,
            "{variable} is set: SDP for every socket, no rules file"
        );
    }
    Config { rules, path }
}

/// Where libsdp wrote a `log destination file NAME`: root's logs go to
/// `/var/log/NAME`; another user's to `NAME.<uid>` if NAME has a
/// directory, else to `/tmp/NAME.<uid>`. (The log never follows a
/// symbolic link there: `log::Destination::File`.)
fn libsdp_log_path(name: &str, uid: u32) -> String {
    match (uid, name.contains('/')) {
        (0, true) => name.to_owned(),
        (0, false) => format!("/var/log/{name}"),
        (_, true) => format!("{name}.{uid}"),
        (_, false) => format!("/tmp/{name}.{uid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::libsdp_log_path;

    #[test]
    fn log_files_go_where_libsdp_put_them() {
        assert_eq!(libsdp_log_path("libsdp.log", 0), "/var/log/libsdp.log");
        assert_eq!(libsdp_log_path("/srv/sdp.log", 0), "/srv/sdp.log");
        assert_eq!(libsdp_log_path("libsdp.log", 1000), "/tmp/libsdp.log.1000");
        assert_eq!(libsdp_log_path("/srv/sdp.log", 1000), "/srv/sdp.log.1000");
    }
}
