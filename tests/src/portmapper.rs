//! A private `sdp-portmapper` daemon for a test: its own UDP port and
//! control socket, killed when dropped. Programs started with
//! [`PortMapper::apply`] on their command use it (`SDP_PM_PORT`,
//! `SDP_PM_CONTROL`), so SDP connections between preloaded programs work.

use crate::preload::{artifacts, TempDir};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

/// See the module documentation.
pub struct PortMapper {
    child: Child,
    /// The UDP port it answers on.
    pub port: u16,
    /// Its control socket.
    pub control: PathBuf,
    _dir: TempDir,
}

impl PortMapper {
    /// Starts a daemon on a free UDP port (all addresses) and waits for its
    /// ready line.
    pub fn start() -> PortMapper {
        let dir = TempDir::new("pm");
        let control = dir.path().join("pm.sock");
        let mut child = Command::new(&artifacts().portmapper)
            .args(["--port", "0", "--control"])
            .arg(&control)
            .args(["--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start sdp-portmapper");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the ready line");
        // "ready udp=[::]:41234,0.0.0.0:41234 control=/path"
        let port = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("udp="))
            .and_then(|list| list.split(',').next())
            .and_then(|a| a.rsplit(':').next())
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {line:?}"));
        PortMapper {
            child,
            port,
            control,
            _dir: dir,
        }
    }

    /// Points `cmd` at this daemon.
    pub fn apply<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        cmd.env("SDP_PM_PORT", self.port.to_string())
            .env("SDP_PM_CONTROL", &self.control)
    }

    /// The control socket's path.
    pub fn control(&self) -> &Path {
        &self.control
    }
}

impl Drop for PortMapper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A UDP port on the loopback where nothing answers right now: a port
/// mapper query there gets ICMP port unreachable at once.
pub fn dead_port() -> u16 {
    std::net::UdpSocket::bind("127.0.0.1:0")
        .and_then(|s| s.local_addr())
        .expect("bind a UDP port")
        .port()
}
