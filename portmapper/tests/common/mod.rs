//! Test harness: starts the real `sdp-portmapper` binary on loopback with an
//! ephemeral UDP port and a private control socket, and stops it.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use portmapper::client::ClientConfig;
use portmapper::control::ControlClient;

pub const BIN: &str = env!("CARGO_BIN_EXE_sdp-portmapper");

/// The daemon binary: `PM_DAEMON_BIN` (e.g. a release build, for
/// measurements) or the one cargo built for these tests.
pub fn daemon_bin() -> std::ffi::OsString {
    std::env::var_os("PM_DAEMON_BIN").unwrap_or_else(|| BIN.into())
}

pub fn temp_dir() -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let d = std::env::temp_dir().join(format!(
        "pm-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub struct Daemon {
    pub child: Child,
    pub port: u16,
    pub control: PathBuf,
    pub dir: PathBuf,
}

impl Daemon {
    /// Start on 127.0.0.1 and ::1 with `extra` flags.
    pub fn start(extra: &[&str]) -> Daemon {
        Daemon::start_bound(&["127.0.0.1", "::1"], extra)
    }

    pub fn start_bound(binds: &[&str], extra: &[&str]) -> Daemon {
        let dir = temp_dir();
        let control = dir.join("control.sock");
        let log = std::fs::File::create(dir.join("daemon.log")).unwrap();
        let mut cmd = Command::new(daemon_bin());
        cmd.args(["--port", "0", "--control"]).arg(&control);
        for b in binds {
            cmd.args(["--bind", b]);
        }
        cmd.args(["--log-level", "debug"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log);
        let mut child = cmd.spawn().expect("spawn sdp-portmapper");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        // "ready udp=127.0.0.1:PORT,[::1]:PORT control=PATH"
        let udp = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("udp="))
            .unwrap_or_else(|| panic!("no ready line: {line:?}"));
        let first: SocketAddr = udp.split(',').next().unwrap().parse().unwrap();
        Daemon {
            child,
            port: first.port(),
            control,
            dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn ctl(&self) -> ControlClient {
        ControlClient::connect(&self.control).unwrap()
    }

    pub fn list(&self) -> Vec<String> {
        self.ctl().list().unwrap()
    }

    /// A counter from the `stats` line of `list`.
    pub fn stat(&self, name: &str) -> u64 {
        let lines = self.list();
        let stats = lines.iter().find(|l| l.starts_with("stats ")).unwrap();
        stats
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(name).and_then(|r| r.strip_prefix('=')))
            .unwrap_or_else(|| panic!("no stat {name}"))
            .parse()
            .unwrap()
    }

    /// Poll `list` until `cond` holds or `within` passes; true if it held.
    pub fn wait_for(&self, within: Duration, cond: impl Fn(&Daemon) -> bool) -> bool {
        let end = Instant::now() + within;
        loop {
            if cond(self) {
                return true;
            }
            if Instant::now() > end {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    pub fn client_config(&self) -> ClientConfig {
        ClientConfig {
            server_port: self.port,
            ..ClientConfig::default()
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Listeners P and Q of this process, registered with the daemon for as
/// long as the value lives.
pub struct Registered {
    pub p: TcpListener,
    pub q: TcpListener,
    pub ctl: ControlClient,
}

impl Registered {
    pub fn new(d: &Daemon, ip: &str) -> Registered {
        let p = TcpListener::bind((ip, 0)).unwrap();
        let q = TcpListener::bind((ip, 0)).unwrap();
        let mut ctl = d.ctl();
        ctl.register(ip.parse().unwrap(), port(&p), port(&q))
            .unwrap();
        Registered { p, q, ctl }
    }

    pub fn ap(&self) -> SocketAddr {
        self.p.local_addr().unwrap()
    }

    pub fn sdp(&self) -> SocketAddr {
        self.q.local_addr().unwrap()
    }
}

pub fn port(l: &TcpListener) -> u16 {
    l.local_addr().unwrap().port()
}

pub fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A tiny deterministic generator for the tests' randomness.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        ((self.next() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}
