//! Harness of the end-to-end suite (`tests/tests/e2e_*.rs`): real programs
//! under `libsdp_preload.so`, each test with its own port mapper, state
//! export directory and log, every process it starts stopped when it ends.
//!
//! Each test checks two things: the result is right (bytes, hashes, counts
//! the program reports), and the connection really ran over SDP, read from
//! the state export (docs/preload.md) with [`expect_sdp`]. The second half
//! depends on the mode the suite runs in, `SDP_E2E_EXPECT`:
//!
//! * unset or `sdp` (the default): every preloaded connection between two
//!   preloaded programs must be SDP;
//! * `tcp`: for a build without the SDP backend. The same tests then check
//!   that those connections are TCP with the reason "no SDP engine", so the
//!   correctness half is proven on its own.
//!
//! Readiness is always an event: a line a program prints, or a record
//! appearing in the state export. Nothing sleeps in place of one.

use crate::preload::{self, Mode, TempDir};
use crate::statfile::{self, Record, StatFile};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

/// Values of the state export record (docs/preload.md, "Records").
pub mod field {
    pub const UNDECIDED: u8 = 0;
    pub const TCP: u8 = 1;
    pub const SDP: u8 = 2;

    pub const CLIENT: u8 = 1;
    pub const LISTENER: u8 = 2;
    pub const ACCEPTED: u8 = 3;

    pub const REASON_NONE: u8 = 0;
    pub const REASON_RULE_TCP: u8 = 1;
    pub const REASON_NO_ENGINE: u8 = 2;
    pub const REASON_PM_DENY: u8 = 3;
    pub const REASON_PM_TIMEOUT: u8 = 4;
    pub const REASON_PM_UNREACHABLE: u8 = 5;
    pub const REASON_RST: u8 = 6;
    pub const REASON_MPA_REJECT: u8 = 7;
    pub const REASON_HELLO_REFUSED: u8 = 8;
    pub const REASON_TIMEOUT: u8 = 9;
    pub const REASON_INTERNAL: u8 = 10;
    pub const REASON_PEER_TCP: u8 = 11;
}
use field::*;

/// How long one step of a test (a program's run, a line it prints) may
/// take before the test fails instead of hanging.
pub const STEP: Duration = Duration::from_secs(60);

/// How long a record may take to appear in the state export, or to be
/// decided (the SDP setup, the port mapper's retries and the fallback all
/// end well within it).
pub const EXPORT_WAIT: Duration = Duration::from_secs(20);

/// What the suite expects of connections between preloaded programs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// They are SDP (the default).
    Sdp,
    /// They are TCP because the build has no SDP engine
    /// (`SDP_E2E_EXPECT=tcp`).
    Tcp,
}

/// The mode from `SDP_E2E_EXPECT`.
pub fn expect() -> Expect {
    match std::env::var("SDP_E2E_EXPECT").as_deref() {
        Err(_) | Ok("") | Ok("sdp") => Expect::Sdp,
        Ok("tcp") => Expect::Tcp,
        Ok(other) => panic!("SDP_E2E_EXPECT={other:?}: use \"sdp\" (default) or \"tcp\""),
    }
}

/// Name of a `why TCP` value, for messages.
pub fn reason_name(reason: u8) -> &'static str {
    match reason {
        REASON_NONE => "-",
        REASON_RULE_TCP => "use tcp rule",
        REASON_NO_ENGINE => "no SDP engine",
        REASON_PM_DENY => "PMDeny",
        REASON_PM_TIMEOUT => "port mapper timeout",
        REASON_PM_UNREACHABLE => "port mapper unreachable",
        REASON_RST => "RST on the SDP port",
        REASON_MPA_REJECT => "MPA reject",
        REASON_HELLO_REFUSED => "Hello refused",
        REASON_TIMEOUT => "MPA/Hello timeout",
        REASON_INTERNAL => "internal error",
        REASON_PEER_TCP => "peer used TCP",
        _ => "unknown reason",
    }
}

/// Name of a transport value, for messages.
pub fn transport_name(transport: u8) -> &'static str {
    match transport {
        UNDECIDED => "undecided",
        TCP => "TCP",
        SDP => "SDP",
        _ => "unknown transport",
    }
}

fn describe(r: &Record) -> String {
    format!(
        "fd {} role {} {} (why TCP: {}) local {:?} peer {:?}",
        r.fd,
        r.role,
        transport_name(r.transport),
        reason_name(r.reason),
        r.local,
        r.peer
    )
}

/// The one place the suite asserts that a connection ran over SDP. In the
/// `tcp` mode it asserts instead that the connection is TCP because the
/// build has no SDP engine.
pub fn expect_sdp(what: &str, r: &Record) {
    match expect() {
        Expect::Sdp => assert!(
            r.transport == SDP,
            "{what}: expected SDP, the state export says {} \
             (SDP_E2E_EXPECT=tcp checks a build without the SDP backend)",
            describe(r)
        ),
        Expect::Tcp => assert!(
            r.transport == TCP && r.reason == REASON_NO_ENGINE,
            "{what}: SDP_E2E_EXPECT=tcp expects TCP because of \"no SDP engine\", \
             the state export says {}",
            describe(r)
        ),
    }
}

/// A connection that must fall back to TCP for `reason` (in the `tcp`
/// mode: for "no SDP engine", the engine never being asked).
pub fn expect_tcp(what: &str, r: &Record, reason: u8) {
    let reason = match expect() {
        Expect::Sdp => reason,
        Expect::Tcp => REASON_NO_ENGINE,
    };
    assert!(
        r.transport == TCP && r.reason == reason,
        "{what}: expected TCP because of \"{}\", the state export says {}",
        reason_name(reason),
        describe(r)
    );
}

/// A UDP port on the loopback where nothing listens right now, so that a
/// datagram sent there is answered by ICMP port unreachable.
pub fn closed_udp_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("bind an ephemeral UDP port")
        .port()
}

/// A running program whose standard output and error the test reads line
/// by line (one thread per stream). Dropping it kills the program.
pub struct Proc {
    pub name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    rx: Receiver<Msg>,
    open_streams: u8,
    stdout: Vec<String>,
    stderr: Vec<String>,
}

enum Msg {
    Out(String),
    Err(String),
    Eof,
}

/// Why [`Proc::try_wait_line`] returned no line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waited {
    /// The time given passed first.
    TimedOut,
    /// The program closed its output (ended) first.
    Ended,
}

/// A finished program.
#[derive(Debug)]
pub struct Finished {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

fn pump(stream: impl Read + Send + 'static, tx: Sender<Msg>, wrap: fn(String) -> Msg) {
    std::thread::spawn(move || {
        let mut r = BufReader::new(stream);
        let mut line = Vec::new();
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = String::from_utf8_lossy(&line);
                    let text = text.strip_suffix('\n').unwrap_or(&text);
                    if tx.send(wrap(text.to_owned())).is_err() {
                        return;
                    }
                }
            }
        }
        let _ = tx.send(Msg::Eof);
    });
}

impl Proc {
    /// Starts `cmd` with its standard output and error piped to the test,
    /// and its standard input piped too when `stdin` is true (else null).
    pub fn spawn(name: &str, mut cmd: Command, stdin: bool) -> Proc {
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        cmd.stdin(if stdin { Stdio::piped() } else { Stdio::null() });
        let mut child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("start {name} ({cmd:?}): {e}"));
        let (tx, rx) = mpsc::channel();
        pump(child.stdout.take().expect("piped"), tx.clone(), Msg::Out);
        pump(child.stderr.take().expect("piped"), tx, Msg::Err);
        Proc {
            name: name.to_owned(),
            stdin: child.stdin.take(),
            child,
            rx,
            open_streams: 2,
            stdout: Vec::new(),
            stderr: Vec::new(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the program printed so far, for failure messages.
    pub fn transcript(&self) -> String {
        format!(
            "{} (pid {}) stdout:\n{}\nstderr:\n{}",
            self.name,
            self.pid(),
            self.stdout.join("\n"),
            self.stderr.join("\n")
        )
    }

    /// The next line on either stream, `None` once both are closed.
    fn next_line(&mut self, deadline: Instant) -> Option<String> {
        match self.line_before(deadline) {
            Ok(line) => line,
            Err(Waited::TimedOut) => panic!(
                "{}: nothing after {:?}\n{}\n{}",
                self.name,
                STEP,
                self.transcript(),
                threads(self.pid())
            ),
            Err(Waited::Ended) => None,
        }
    }

    /// The next line on either stream: `Ok(None)` once both are closed,
    /// `Err(Waited::TimedOut)` when `deadline` passes first.
    fn line_before(&mut self, deadline: Instant) -> Result<Option<String>, Waited> {
        while self.open_streams > 0 {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(Msg::Out(l)) => {
                    self.stdout.push(l.clone());
                    return Ok(Some(l));
                }
                Ok(Msg::Err(l)) => {
                    self.stderr.push(l.clone());
                    return Ok(Some(l));
                }
                Ok(Msg::Eof) => self.open_streams -= 1,
                Err(RecvTimeoutError::Timeout) => return Err(Waited::TimedOut),
                Err(RecvTimeoutError::Disconnected) => self.open_streams = 0,
            }
        }
        Ok(None)
    }

    /// Reads lines until one satisfies `pred` and returns it, like
    /// [`Proc::wait_line`], but gives up after `within` instead of failing:
    /// the caller can then show more than this program's transcript (the
    /// state export, the other programs). `within` zero reads only what
    /// the program printed already (into its transcript).
    pub fn try_wait_line(
        &mut self,
        within: Duration,
        pred: impl Fn(&str) -> bool,
    ) -> Result<String, Waited> {
        let deadline = Instant::now() + within;
        loop {
            match self.line_before(deadline)? {
                Some(l) if pred(&l) => return Ok(l),
                Some(_) => {}
                None => return Err(Waited::Ended),
            }
        }
    }

    /// Reads lines (standard output or error) until one satisfies `pred`,
    /// and returns it. Fails if the program ends first or `STEP` passes.
    pub fn wait_line(&mut self, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + STEP;
        loop {
            match self.next_line(deadline) {
                Some(l) if pred(&l) => return l,
                Some(_) => {}
                None => panic!(
                    "{} ended before printing the line the test waits for\n{}",
                    self.name,
                    self.transcript()
                ),
            }
        }
    }

    /// The next line the program prints (standard output or error).
    pub fn line(&mut self) -> String {
        self.wait_line(|_| true)
    }

    /// Writes to the program's standard input.
    pub fn send(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().expect("started with stdin piped");
        stdin
            .write_all(text.as_bytes())
            .and_then(|()| stdin.flush())
            .unwrap_or_else(|e| panic!("write to {}: {e}\n{}", self.name, self.transcript()));
    }

    /// Closes the program's standard input (end of file).
    pub fn close_stdin(&mut self) {
        drop(self.stdin.take());
    }

    /// Sends `signal` to the program.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill has no memory preconditions; the pid is our child's,
        // not yet waited for (so not reused).
        unsafe { libc::kill(self.child.id() as libc::pid_t, signal) };
    }

    /// Waits (at most `STEP`) for the program to end; returns everything
    /// it printed. Kills it and fails on the deadline.
    pub fn finish(mut self) -> Finished {
        self.close_stdin();
        let deadline = Instant::now() + STEP;
        while self.next_line(deadline).is_some() {}
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("wait for child") {
                break s;
            }
            if Instant::now() > deadline {
                let stuck = threads(self.pid());
                let _ = self.child.kill();
                panic!("{} did not end\n{}\n{stuck}", self.name, self.transcript());
            }
            // The streams are closed; only the exit itself is left.
            std::thread::sleep(Duration::from_millis(2));
        };
        Finished {
            status,
            stdout: std::mem::take(&mut self.stdout).join("\n"),
            stderr: std::mem::take(&mut self.stderr).join("\n"),
        }
    }

    /// [`Proc::finish`], and the exit status must be success.
    pub fn finish_ok(self) -> Finished {
        let name = self.name.clone();
        let f = self.finish();
        assert!(
            f.status.success(),
            "{name} failed: {}\nstdout:\n{}\nstderr:\n{}",
            f.status,
            f.stdout,
            f.stderr
        );
        f
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// An `sdp-portmapper` of the test's own: a free UDP port, a control
/// socket in a temporary directory. Killed on drop.
pub struct PortMapper {
    pub port: u16,
    pub control: PathBuf,
    daemon: Proc,
}

impl PortMapper {
    /// Starts the daemon and waits for its ready line.
    pub fn start(dir: &Path) -> PortMapper {
        let control = dir.join("pm.sock");
        let mut cmd = Command::new(&preload::artifacts().portmapper);
        cmd.args(["--port", "0", "--stats-interval-ms", "0"])
            .args(["--log-level", "warn", "--control"])
            .arg(&control);
        let mut daemon = Proc::spawn("sdp-portmapper", cmd, false);
        // "ready udp=[::]:41234,0.0.0.0:41234 control=/tmp/.../pm.sock"
        let line = daemon.wait_line(|l| l.starts_with("ready "));
        let port = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("udp="))
            .and_then(|list| list.split(',').next())
            .and_then(|a| a.parse::<SocketAddr>().ok())
            .map(|a| a.port())
            .unwrap_or_else(|| panic!("no UDP port in {line:?}"));
        PortMapper {
            port,
            control,
            daemon,
        }
    }

    /// The daemon's registrations and pending mappings (`list`).
    pub fn list(&self) -> String {
        let out = Command::new(&preload::artifacts().portmapper)
            .arg("list")
            .arg("--control")
            .arg(&self.control)
            .output()
            .expect("run sdp-portmapper list");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    pub fn pid(&self) -> u32 {
        self.daemon.pid()
    }
}

/// One test's world: a state export directory, a log file the preloaded
/// programs append to, and a port mapper. On a failing test its drop
/// prints the preload's log.
pub struct Env {
    pub dir: TempDir,
    pub pm: PortMapper,
    log: PathBuf,
}

impl Env {
    pub fn new(tag: &str) -> Env {
        let dir = TempDir::new(&format!("e2e-{tag}"));
        let pm = PortMapper::start(dir.path());
        let log = dir.path().join("sdp.log");
        Env { dir, pm, log }
    }

    /// The state export directory.
    pub fn stat_dir(&self) -> &Path {
        self.dir.path()
    }

    /// `program` under the preload, pointed at this test's port mapper
    /// (`SDP_PM_PORT`, `SDP_PM_CONTROL`), export directory and log.
    pub fn preloaded(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.command(program, Mode::Sdp)
    }

    /// `program` without the preload (same environment otherwise).
    pub fn plain(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        self.command(program, Mode::Plain)
    }

    fn command(&self, program: impl AsRef<std::ffi::OsStr>, mode: Mode) -> Command {
        let mut cmd = preload::command(program, mode, self.stat_dir());
        cmd.env("SDP_PM_PORT", self.pm.port.to_string())
            .env("SDP_PM_CONTROL", &self.pm.control)
            .env("SDP_LOG", "info")
            .env("SDP_LOG_FILE", &self.log);
        cmd
    }

    /// A Python program from source, preloaded or not.
    pub fn python(&self, source: &str, mode: Mode) -> Command {
        let mut cmd = self.command(preload::python(), mode);
        cmd.arg("-u").arg("-c").arg(source);
        cmd
    }

    /// The export of one running process.
    pub fn snapshot(&self, pid: u32) -> StatFile {
        statfile::snapshot(self.stat_dir(), pid)
            .unwrap_or_else(|e| panic!("state export of pid {pid}: {e}"))
    }

    /// Polls the export of the running processes until `find` returns
    /// something (at most `EXPORT_WAIT`): records appear when a program makes a
    /// connection, and are decided when its setup ends.
    pub fn wait_for<T>(&self, what: &str, mut find: impl FnMut(&[StatFile]) -> Option<T>) -> T {
        let deadline = Instant::now() + EXPORT_WAIT;
        loop {
            let files = statfile::live(self.stat_dir());
            if let Some(t) = find(&files) {
                return t;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: not in the state export after {EXPORT_WAIT:?}; it holds:\n{}",
                dump(&files)
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits until process `pid` holds `n` decided connections that
    /// `pred` selects, and returns them.
    pub fn wait_records(
        &self,
        what: &str,
        pid: u32,
        n: usize,
        pred: impl Fn(&Record) -> bool,
    ) -> Vec<Record> {
        // Checked before the export is read: a process that ended after
        // the read could not have been seen in it.
        let mut alive = running(pid);
        self.wait_for(what, |files| {
            let found: Vec<Record> = files
                .iter()
                .filter(|f| f.pid == pid)
                .flat_map(|f| &f.records)
                .filter(|r| pred(r) && r.transport != UNDECIDED)
                .cloned()
                .collect();
            if found.len() >= n {
                return Some(found);
            }
            assert!(
                alive,
                "{what}: process {pid} ended first; the export held:\n{}",
                dump(files)
            );
            alive = running(pid);
            None
        })
    }

    /// Waits until process `pid` listens on TCP port `port` (its listener
    /// record is in the export: the readiness of a server that prints
    /// nothing when it is ready).
    pub fn wait_listener(&self, pid: u32, port: u16) -> Record {
        let mut alive = running(pid);
        self.wait_for(&format!("pid {pid} listening on {port}"), |files| {
            let found = files
                .iter()
                .filter(|f| f.pid == pid)
                .flat_map(|f| &f.records)
                .find(|r| r.role == LISTENER && r.local.is_some_and(|a| a.port() == port));
            if found.is_none() {
                assert!(alive, "process {pid} ended before listening on {port}");
                alive = running(pid);
            }
            found.cloned()
        })
    }

    /// The connections of `client_pid` to TCP port `port` and the ones
    /// `server_pid` accepted on it, once `n` of each are decided.
    pub fn connections(
        &self,
        client_pid: u32,
        server_pid: u32,
        port: u16,
        n: usize,
    ) -> (Vec<Record>, Vec<Record>) {
        let clients = self.wait_records("client connections", client_pid, n, |r| {
            r.role == CLIENT && r.peer.is_some_and(|a| a.port() == port)
        });
        let accepted = self.wait_records("accepted connections", server_pid, n, |r| {
            r.role == ACCEPTED && r.local.is_some_and(|a| a.port() == port)
        });
        (clients, accepted)
    }

    /// The accepted connection whose peer is `peer`, in whichever running
    /// process holds it (a forked child, say), once decided.
    pub fn accepted_from(&self, peer: SocketAddr) -> (u32, Record) {
        self.wait_for(&format!("the accepted end of {peer}"), |files| {
            files.iter().find_map(|f| {
                f.records
                    .iter()
                    .find(|r| {
                        r.role == ACCEPTED
                            && r.transport != UNDECIDED
                            && r.peer.is_some_and(|a| same_endpoint(a, peer))
                    })
                    .map(|r| (f.pid, r.clone()))
            })
        })
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Ok(log) = std::fs::read_to_string(&self.log) {
                let tail: Vec<&str> = log.lines().rev().take(60).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                eprintln!("--- preload log (last lines) ---\n{}", tail.join("\n"));
            }
        }
    }
}

/// Where each thread of process `pid` is, for a program that is stuck:
/// its name, state, system call (`/proc/PID/task/TID/syscall`: the number
/// and its arguments, or `running`) and the kernel function it sleeps in.
pub fn threads(pid: u32) -> String {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return format!("threads of {pid}: gone");
    };
    let mut out = format!("threads of {pid}:");
    for task in tasks.flatten() {
        let dir = task.path();
        let read = |f: &str| {
            std::fs::read_to_string(dir.join(f))
                .map(|t| t.trim().to_owned())
                .unwrap_or_default()
        };
        out += &format!(
            "\n  {} {} {} syscall [{}] wchan {}",
            task.file_name().to_string_lossy(),
            read("comm"),
            state(&read("stat")).unwrap_or(""),
            read("syscall"),
            read("wchan")
        );
    }
    out
}

/// The state letter of a `/proc/.../stat` line (after the command name,
/// which may hold spaces and parentheses).
fn state(stat: &str) -> Option<&str> {
    stat.rsplit_once(')')?.1.split_whitespace().next()
}

/// Whether process `pid` exists and has not ended (a zombie has ended).
pub fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .is_some_and(|t| state(&t).is_some_and(|s| s != "Z" && s != "X"))
}

/// Equal addresses, an IPv4-mapped IPv6 address counting as its IPv4 one
/// (a dual-stack listener reports its peers that way).
pub fn same_endpoint(a: SocketAddr, b: SocketAddr) -> bool {
    let canon = |s: SocketAddr| match s {
        SocketAddr::V6(v6) => match v6.ip().to_ipv4_mapped() {
            Some(v4) => SocketAddr::new(v4.into(), v6.port()),
            None => s,
        },
        s => s,
    };
    canon(a) == canon(b)
}

/// The records of some export files, for failure messages.
pub fn dump(files: &[StatFile]) -> String {
    let mut s = String::new();
    for f in files {
        s.push_str(&format!("pid {} ({}):\n", f.pid, f.program));
        for r in &f.records {
            s.push_str(&format!("  {}\n", describe(r)));
        }
    }
    s
}

/// A threaded echo server on 127.0.0.1 (any port): prints
/// `listening PORT PID`, then echoes every connection until its EOF.
pub const ECHO_SERVER: &str = r#"
import os, socket, threading
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(64)
print("listening", srv.getsockname()[1], os.getpid())
def serve(c):
    while True:
        d = c.recv(1 << 16)
        if not d:
            break
        c.sendall(d)
    c.close()
while True:
    c, _ = srv.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Echo client: `HOST PORT SEED SIZE`. Sends SIZE bytes made from SEED,
/// reads the echo, prints `echo True|False PID FD LOCALPORT`, and holds the
/// connection open until a line arrives on its standard input.
pub const ECHO_CLIENT: &str = r#"
import hashlib, os, socket, sys
host, port, seed, size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
block = hashlib.sha256(b"%d" % seed).digest()
payload = (block * (size // 32 + 1))[:size]
c = socket.create_connection((host, port))
c.sendall(payload)
got = b""
while len(got) < size:
    d = c.recv(1 << 16)
    if not d:
        break
    got += d
print("echo", got == payload, os.getpid(), c.fileno(), c.getsockname()[1])
sys.stdin.readline()
c.close()
"#;

/// `len` pseudo-random printable characters (letters and digits) from
/// `seed`: distinct, reproducible payloads without a random crate.
pub fn text(seed: u64, len: usize) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            // xorshift64*
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
            ALPHABET[(v >> 58) as usize % ALPHABET.len()] as char
        })
        .collect()
}

/// The median of some durations.
pub fn median(mut v: Vec<Duration>) -> Duration {
    assert!(!v.is_empty());
    v.sort();
    v[v.len() / 2]
}
