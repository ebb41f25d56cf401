//! `sdprun [--config FILE] [--log LEVEL] program [args...]`
//!
//! Runs `program` with `libsdp_preload.so` preloaded: the library is named
//! by `SDP_PRELOAD_LIB`, or looked for next to this executable (so
//! `target/debug/sdprun` uses `target/debug/libsdp_preload.so`), then in
//! the library directories of its prefix (`/usr/bin/sdprun` uses
//! `/usr/lib/x86_64-linux-gnu/libsdp_preload.so`). It is
//! appended to an existing `LD_PRELOAD`; `--config` sets `SDP_CONFIG`
//! (made absolute), `--log` sets `SDP_LOG`. sdprun then `exec`s the program,
//! so its exit status and signals are the program's own.
//!
//! Before the `exec`, a program the library cannot reach (statically
//! linked, setuid, or making its socket calls without the C library:
//! [`reach`]) is named on standard error, never standard output: it still
//! runs, over TCP.
//!
//! This binary does not link the preload library (whose hooks it would
//! otherwise carry): it only sets up the environment.

mod reach;

use std::ffi::OsString;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use portmapper::client::{ClientConfig, Decision, Fallback, Timing};
use portmapper::net::PmClient;

const LIBRARY: &str = "libsdp_preload.so";
const LEVELS: &[&str] = &["off", "error", "warn", "info", "debug", "trace"];

const USAGE: &str = "\
usage: sdprun [--config FILE] [--log LEVEL] program [args...]

Runs an unmodified TCP program with its connections carried over SDP when
the peer speaks it, plain TCP otherwise.

  --config FILE   libsdp.conf rules (sets SDP_CONFIG)
  --log LEVEL     off, error, warn, info, debug or trace (sets SDP_LOG);
                  SDP_LOG_FILE=path sends the log to a file
  --help          this text

The library is SDP_PRELOAD_LIB, else libsdp_preload.so next to sdprun,
else in ../lib/<multiarch>/ or ../lib/ from sdprun's directory.
Unless one answers already, sdprun starts sdp-portmapper (from its own
directory) in the background on UDP SDP_PM_PORT (default 3935);
SDP_NO_PORTMAPPER=1 skips that.
";

#[derive(Debug, PartialEq, Eq)]
struct Options {
    config: Option<PathBuf>,
    log: Option<String>,
    program: OsString,
    args: Vec<OsString>,
}

#[derive(Debug, PartialEq, Eq)]
enum Parsed {
    Run(Options),
    Help,
}

fn parse(mut argv: impl Iterator<Item = OsString>) -> Result<Parsed, String> {
    let mut config = None;
    let mut log = None;
    let program = loop {
        let Some(arg) = argv.next() else {
            return Err("no program to run".into());
        };
        let text = arg.to_string_lossy();
        let (name, inline) = match text.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(OsString::from(v))),
            _ => (text.clone().into_owned(), None),
        };
        let mut value = |what: &str| {
            inline
                .clone()
                .or_else(|| argv.next())
                .ok_or_else(|| format!("{what} needs a value"))
        };
        match name.as_str() {
            "--help" | "-h" => return Ok(Parsed::Help),
            "--config" | "-c" => config = Some(PathBuf::from(value("--config")?)),
            "--log" | "-l" => {
                let level = value("--log")?.to_string_lossy().to_ascii_lowercase();
                if !LEVELS.contains(&level.as_str()) {
                    return Err(format!(
                        "unknown log level {level:?} (one of {})",
                        LEVELS.join(", ")
                    ));
                }
                log = Some(level);
            }
            "--" => break argv.next().ok_or("no program to run")?,
            n if n.starts_with('-') && n.len() > 1 => {
                return Err(format!("unknown option {n}"));
            }
            _ => break arg,
        }
    };
    Ok(Parsed::Run(Options {
        config,
        log,
        program,
        args: argv.collect(),
    }))
}

/// Debian's multiarch directory name for the target this was built for
/// (`lib/<triple>/` holds the shared libraries of a package installed in
/// `/usr`): `x86_64-linux-gnu`, `aarch64-linux-gnu`...
fn multiarch() -> String {
    // Debian names 32-bit x86 after the i386, where Rust says x86.
    let arch = if cfg!(target_arch = "x86") {
        "i386"
    } else {
        std::env::consts::ARCH
    };
    let env = if cfg!(target_env = "musl") {
        "musl"
    } else {
        "gnu"
    };
    format!("{arch}-{}-{env}", std::env::consts::OS)
}

/// Where the preload library may be, best first, for an `sdprun` in `dir`:
/// beside it (a `cargo build`'s `target/release/`), then the library
/// directories of the prefix it is installed in (`/usr/bin/sdprun` finds
/// `/usr/lib/x86_64-linux-gnu/libsdp_preload.so`, then `/usr/lib/`).
fn library_candidates(dir: &Path) -> [PathBuf; 3] {
    [
        dir.join(LIBRARY),
        dir.join("../lib").join(multiarch()).join(LIBRARY),
        dir.join("../lib").join(LIBRARY),
    ]
}

/// The first candidate that is a file.
fn first_file(candidates: impl IntoIterator<Item = PathBuf>) -> Option<PathBuf> {
    candidates.into_iter().find(|c| c.is_file())
}

/// The directory of this executable.
fn exe_dir() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find myself: {e}"))?;
    Ok(exe.parent().unwrap_or(Path::new("/")).to_owned())
}

/// The preload library: `$SDP_PRELOAD_LIB`, else the first of
/// [`library_candidates`] that exists.
fn find_library() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("SDP_PRELOAD_LIB").filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let dir = exe_dir()?;
    let candidates = library_candidates(&dir);
    first_file(candidates.clone()).ok_or_else(|| {
        let tried: Vec<String> = candidates.iter().map(|c| c.display().to_string()).collect();
        format!(
            "{LIBRARY} is in none of {} (build it with `cargo build -p preload`, or set SDP_PRELOAD_LIB)",
            tried.join(", ")
        )
    })
}

/// Where the port mapper daemon may be for an `sdprun` in `dir`: beside it
/// (`target/release/`, or `/usr/bin/` where the package puts both).
fn daemon_candidates(dir: &Path) -> [PathBuf; 1] {
    [dir.join("sdp-portmapper")]
}

/// `LD_PRELOAD` with `lib` appended (the list takes spaces or colons).
fn preload_value(existing: Option<OsString>, lib: &Path) -> OsString {
    match existing.filter(|e| !e.is_empty()) {
        None => lib.as_os_str().to_owned(),
        Some(mut e) => {
            e.push(" ");
            e.push(lib);
            e
        }
    }
}

/// Makes sure a port mapper answers on this host (DESIGN §5: "sdprun starts
/// a daemon in the background when none answers").
///
/// The probe is a PMReq for the discard port on the loopback: any reply,
/// PMDeny included, means a daemon is there. Otherwise `sdp-portmapper`,
/// found next to this executable, is started in its own process group with
/// its standard streams on /dev/null (it outlives the program, like any
/// daemon), and we wait until it answers. Failing that, the program still
/// runs: its connections fall back to TCP.
fn ensure_portmapper() {
    if std::env::var_os("SDP_NO_PORTMAPPER").is_some_and(|v| v == "1") || portmapper_answers() {
        return;
    }
    let Some(daemon) = exe_dir()
        .ok()
        .and_then(|dir| first_file(daemon_candidates(&dir)))
    else {
        eprintln!("sdprun: no port mapper answers and sdp-portmapper is not next to sdprun; connections will use TCP");
        return;
    };
    let spawned = Command::new(&daemon)
        .arg("--port")
        .arg(portmapper_port().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    if let Err(e) = spawned {
        eprintln!(
            "sdprun: cannot start {}: {e}; connections will use TCP",
            daemon.display()
        );
        return;
    }
    // A probe ends early when the port is still closed (ICMP): pause
    // between probes so that they do not take the CPU the starting daemon
    // needs on a busy machine.
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if portmapper_answers() {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    eprintln!("sdprun: the port mapper started but does not answer; connections will use TCP");
}

/// The port mapper's UDP port: `SDP_PM_PORT`, or the draft's 3935.
fn portmapper_port() -> u16 {
    std::env::var("SDP_PM_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(portmapper::wire::DEFAULT_PORT)
}

/// Whether a port mapper on the loopback answers a PMReq.
fn portmapper_answers() -> bool {
    let cfg = ClientConfig {
        timing: Timing {
            initial_rto: Duration::from_millis(20),
            max_rto: Duration::from_millis(100),
            budget: Duration::from_millis(300),
        },
        server_port: portmapper_port(),
        ..ClientConfig::default()
    };
    let client = PmClient::new(cfg);
    let discard = SocketAddr::from((Ipv4Addr::LOCALHOST, 9));
    let cp = SocketAddr::from((Ipv4Addr::LOCALHOST, 0));
    matches!(
        client.query(discard, cp),
        Decision::Sdp(_) | Decision::Tcp(Fallback::Denied)
    )
}

fn main() -> ExitCode {
    let options = match parse(std::env::args_os().skip(1)) {
        Ok(Parsed::Run(o)) => o,
        Ok(Parsed::Help) => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("sdprun: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let lib = match find_library() {
        Ok(l) => l,
        Err(e) => {
            eprintln!("sdprun: {e}");
            return ExitCode::from(127);
        }
    };
    let lib = std::fs::canonicalize(&lib).unwrap_or(lib);
    let mut command = Command::new(&options.program);
    command.args(&options.args);
    command.env(
        "LD_PRELOAD",
        preload_value(std::env::var_os("LD_PRELOAD"), &lib),
    );
    if let Some(config) = &options.config {
        if let Err(e) = std::fs::metadata(config) {
            eprintln!("sdprun: cannot read {}: {e}", config.display());
            return ExitCode::from(2);
        }
        command.env(
            "SDP_CONFIG",
            std::path::absolute(config).unwrap_or(config.clone()),
        );
    }
    if let Some(level) = &options.log {
        command.env("SDP_LOG", level);
    }
    if let Some(why) = reach::resolve(
        Path::new(&options.program),
        std::env::var_os("PATH").as_deref(),
    )
    .and_then(|file| reach::check(&file))
    {
        eprintln!(
            "sdprun: {}: {why}: the SDP library cannot reach it, its connections stay TCP",
            options.program.to_string_lossy()
        );
    }
    ensure_portmapper();
    // exec only returns on failure.
    let error = command.exec();
    eprintln!(
        "sdprun: cannot run {}: {error}",
        options.program.to_string_lossy()
    );
    ExitCode::from(if error.kind() == std::io::ErrorKind::NotFound {
        127
    } else {
        126
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> impl Iterator<Item = OsString> {
        list.iter()
            .map(OsString::from)
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn options_stop_at_the_program() {
        let p = parse(args(&[
            "--config",
            "a.conf",
            "--log=debug",
            "iperf3",
            "-c",
            "--log",
        ]))
        .unwrap();
        assert_eq!(
            p,
            Parsed::Run(Options {
                config: Some("a.conf".into()),
                log: Some("debug".into()),
                program: "iperf3".into(),
                args: vec!["-c".into(), "--log".into()],
            })
        );
        let p = parse(args(&["--", "-weird"])).unwrap();
        assert!(matches!(p, Parsed::Run(o) if o.program == "-weird" && o.args.is_empty()));
    }

    #[test]
    fn bad_command_lines_are_refused() {
        assert_eq!(parse(args(&[])), Err("no program to run".into()));
        assert_eq!(parse(args(&["--log"])), Err("--log needs a value".into()));
        assert!(parse(args(&["--log", "loud", "x"]))
            .unwrap_err()
            .starts_with("unknown log level"));
        assert_eq!(
            parse(args(&["--frob", "x"])),
            Err("unknown option --frob".into())
        );
        assert_eq!(parse(args(&["--help"])), Ok(Parsed::Help));
    }

    /// A fresh empty directory under the system's temporary directory.
    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("sdprun-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, b"").unwrap();
    }

    #[test]
    fn multiarch_names_the_build_target() {
        #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
        assert_eq!(multiarch(), "x86_64-linux-gnu");
        assert!(multiarch().contains("-linux-"), "{}", multiarch());
    }

    #[test]
    fn library_is_looked_for_beside_then_in_the_prefix() {
        let root = scratch("lib");
        let bin = root.join("bin");
        std::fs::create_dir_all(&bin).unwrap();
        let [beside, in_multiarch, plain] = library_candidates(&bin);
        assert_eq!(beside, bin.join("libsdp_preload.so"));
        assert_eq!(
            in_multiarch,
            bin.join(format!("../lib/{}/libsdp_preload.so", multiarch()))
        );
        assert_eq!(plain, bin.join("../lib/libsdp_preload.so"));

        assert_eq!(first_file(library_candidates(&bin)), None);
        touch(&plain);
        assert_eq!(first_file(library_candidates(&bin)), Some(plain.clone()));
        touch(&in_multiarch);
        assert_eq!(
            first_file(library_candidates(&bin)),
            Some(in_multiarch.clone())
        );
        touch(&beside);
        assert_eq!(first_file(library_candidates(&bin)), Some(beside));
        // A directory of the library's name is not the library (`other`
        // shares `bin`'s prefix).
        let other = root.join("other");
        std::fs::create_dir_all(other.join("libsdp_preload.so")).unwrap();
        assert_eq!(
            first_file(library_candidates(&other)),
            Some(other.join(format!("../lib/{}/libsdp_preload.so", multiarch())))
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn daemon_is_looked_for_beside_sdprun() {
        let bin = scratch("daemon");
        assert_eq!(first_file(daemon_candidates(&bin)), None);
        touch(&bin.join("sdp-portmapper"));
        assert_eq!(
            first_file(daemon_candidates(&bin)),
            Some(bin.join("sdp-portmapper"))
        );
        std::fs::remove_dir_all(&bin).unwrap();
    }

    #[test]
    fn library_is_appended_to_ld_preload() {
        let lib = Path::new("/x/libsdp_preload.so");
        assert_eq!(
            preload_value(None, lib),
            OsString::from("/x/libsdp_preload.so")
        );
        assert_eq!(
            preload_value(Some("libfoo.so".into()), lib),
            OsString::from("libfoo.so /x/libsdp_preload.so")
        );
    }
}
