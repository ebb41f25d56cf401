//! Harness for running real programs under `libsdp_preload.so`.
//!
//! The library and `sdprun` are built from this workspace the first time a
//! test asks for them (`cargo build -p preload -p portmapper`, same profile and target
//! directory as the running test), so `cargo test` alone is enough.

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Output, Stdio};
use std::sync::OnceLock;

use crate::watchdog::{self, Watchdog};

/// Paths of the built preload artifacts.
#[derive(Debug)]
pub struct Artifacts {
    pub library: PathBuf,
    pub sdprun: PathBuf,
    /// The port mapper daemon, which `sdprun` starts from its own directory.
    pub portmapper: PathBuf,
    /// `sdp-stat`, the reader of the state export.
    pub sdp_stat: PathBuf,
}

/// `target/<profile>` of the running test (its executable is in `deps/`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf()
}

/// Builds (if needed) and returns the preload library and `sdprun`.
pub fn artifacts() -> &'static Artifacts {
    static ARTIFACTS: OnceLock<Artifacts> = OnceLock::new();
    ARTIFACTS.get_or_init(|| {
        let dir = profile_dir();
        let target = dir.parent().expect("target dir");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../Cargo.toml");
        let mut cmd = Command::new(cargo);
        cmd.args(["build", "--quiet", "-p", "preload", "--lib", "--bins"])
            .args(["-p", "portmapper", "--bin", "sdp-portmapper"])
            .arg("--manifest-path")
            .arg(&manifest)
            .arg("--target-dir")
            .arg(target);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let status = cmd.status().expect("run cargo build -p preload");
        assert!(status.success(), "cargo build -p preload failed");
        let a = Artifacts {
            library: dir.join("libsdp_preload.so"),
            sdprun: dir.join("sdprun"),
            portmapper: dir.join("sdp-portmapper"),
            sdp_stat: dir.join("sdp-stat"),
        };
        assert!(a.library.is_file(), "{} missing", a.library.display());
        assert!(a.sdprun.is_file(), "{} missing", a.sdprun.display());
        assert!(a.portmapper.is_file(), "{} missing", a.portmapper.display());
        assert!(a.sdp_stat.is_file(), "{} missing", a.sdp_stat.display());
        a
    })
}

/// The real Python 3 interpreter (not a version manager's shell shim, which
/// would run a shell under the preload first).
pub fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .expect("python3 is needed by the preload tests");
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// Panics with a clear message when `tool` is not installed.
pub fn require(tool: &str) {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
        .unwrap_or(false);
    assert!(
        found,
        "{tool} is not installed (scripts/test.sh installs it)"
    );
}

/// A fresh directory under the system temp dir, removed on drop. Every
/// test that runs preloaded programs has one (their state export and log
/// go there), so it carries the test's [`Watchdog`]: a test still running
/// after [`watchdog::LIMIT`] prints the state of every SDP connection of
/// the programs (`sdp-stat`) and the preload's log, and aborts.
pub struct TempDir(
    pub PathBuf,
    // Held for its drop: it disarms the watchdog.
    #[allow(dead_code)] Watchdog,
);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static COUNTER: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let p = std::env::temp_dir().join(format!("sdp-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create temp dir");
        let dir = p.clone();
        let dog = Watchdog::arm(tag, watchdog::LIMIT, move || stuck_state(&dir));
        TempDir(p, dog)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn file(&self, name: &str, contents: &[u8]) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, contents).expect("write temp file");
        p
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// What a stuck test's programs were doing: their SDP connections as
/// `sdp-stat` shows them (state, credits, bytes), the records of the state
/// export, and the end of the preload's log.
fn stuck_state(dir: &Path) -> String {
    let mut out = String::new();
    let sdp_stat = profile_dir().join("sdp-stat");
    if sdp_stat.is_file() {
        if let Ok(o) = Command::new(&sdp_stat).arg("--dir").arg(dir).output() {
            out.push_str(&String::from_utf8_lossy(&o.stdout));
            out.push_str(&String::from_utf8_lossy(&o.stderr));
        }
    }
    out.push_str(&crate::e2e::dump(&crate::statfile::live(dir)));
    for name in ["sdp.log", "log"] {
        if let Ok(log) = std::fs::read_to_string(dir.join(name)) {
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            out.push_str(&format!("--- {name} (last lines) ---\n"));
            for line in tail.into_iter().rev() {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

/// How a program is started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No preload.
    Plain,
    /// `LD_PRELOAD=libsdp_preload.so`: with no port mapper answering
    /// (unless the test applies one), every connection falls back to TCP.
    Preload,
    /// The preload for connections meant to run over SDP (the test applies
    /// a port mapper), with more time to flush at exit.
    Sdp,
}

/// A command for `program`, preloaded or not, with the environment cleared
/// of our variables and the state export sent to `stat_dir`.
pub fn command(program: impl AsRef<std::ffi::OsStr>, mode: Mode, stat_dir: &Path) -> Command {
    let mut cmd = Command::new(program);
    for var in [
        "LD_PRELOAD",
        "SDP_CONFIG",
        "LIBSDP_CONFIG_FILE",
        "SIMPLE_LIBSDP",
        "ALWAYS_USE_SDP",
        "SDP_LOG",
        "SDP_LOG_FILE",
        "SDP_STAT",
        "SDP_ENGINE",
        "SDP_EXIT_FLUSH_MS",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("SDP_STAT_DIR", stat_dir);
    // sdprun would otherwise start a port mapper that outlives the test;
    // the test that wants one says so. Without one, the preload's queries
    // go to a port where nothing answers (not a daemon of the host's, or
    // of another test), and connections fall back to TCP at once
    // (`crate::portmapper::PortMapper::apply` points them at one).
    cmd.env("SDP_NO_PORTMAPPER", "1");
    cmd.env("SDP_PM_PORT", crate::portmapper::dead_port().to_string());
    cmd.env("SDP_PM_CONTROL", "/nonexistent/sdp-portmapper.sock");
    if mode != Mode::Plain {
        cmd.env("LD_PRELOAD", &artifacts().library);
    }
    if mode == Mode::Sdp {
        // Tests run many programs at once on few cores: give closing
        // connections longer than the default 2 s to finish at exit.
        cmd.env("SDP_EXIT_FLUSH_MS", "10000");
    }
    cmd.stdin(Stdio::null());
    cmd
}

/// A Python program from source text.
pub fn python_command(source: &str, mode: Mode, stat_dir: &Path) -> Command {
    let mut cmd = command(python(), mode, stat_dir);
    cmd.arg("-u").arg("-c").arg(source);
    cmd
}

/// Runs to completion and checks the exit status.
pub fn run_ok(mut cmd: Command) -> Output {
    let out = cmd.output().expect("start program");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A background program whose stdout we read line by line (its readiness
/// is a line it prints, never a sleep).
pub struct Background {
    pub child: Child,
    pub stdout: BufReader<ChildStdout>,
}

impl Background {
    pub fn start(mut cmd: Command) -> Background {
        cmd.stdout(Stdio::piped());
        let mut child = cmd.spawn().expect("start background program");
        let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        Background { child, stdout }
    }

    /// Reads lines until one contains `needle`; returns that line.
    pub fn wait_for_line(&mut self, needle: &str) -> String {
        let mut seen = String::new();
        loop {
            let mut line = String::new();
            let n = self
                .stdout
                .read_line(&mut line)
                .expect("read program output");
            assert!(
                n > 0,
                "program ended before printing {needle:?}; it printed:\n{seen}"
            );
            if line.contains(needle) {
                return line;
            }
            seen.push_str(&line);
        }
    }

    /// Waits for the exit and returns the rest of stdout.
    pub fn finish(mut self) -> (std::process::ExitStatus, String) {
        let mut rest = String::new();
        let _ = self.stdout.read_to_string(&mut rest);
        let status = self.child.wait().expect("wait for program");
        (status, rest)
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A TCP port free right now on the loopback (for programs that cannot
/// report the port they bound).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind an ephemeral port")
        .port()
}
