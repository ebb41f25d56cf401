//! The local registration protocol of the `sdp-portmapper` daemon (DESIGN
//! §5), spoken over its Unix-domain stream socket.
//!
//! One request per line, one reply per request, ASCII:
//!
//! | request                          | reply                          |
//! |----------------------------------|--------------------------------|
//! | `REGISTER <addr> <P> <Q>`        | `OK` or `ERR <reason>`         |
//! | `UNREGISTER <addr> <P>`          | `OK` or `ERR <reason>`         |
//! | `CONNECTED <Q> <cp-addr> <cp-port>` | `OK`                        |
//! | `LIST`                           | lines, then `END`              |
//!
//! A registration lasts as long as the control connection that made it: the
//! daemon forgets it when the connection closes, which happens at the latest
//! when the registering process exits. `CONNECTED` tells the daemon that the
//! SDP listener Q accepted a connection from the given client, which
//! completes that client's transaction (§7.5.2). Requests longer than
//! [`MAX_LINE`] bytes close the connection.
//!
//! ```no_run
//! use portmapper::control::ControlClient;
//! use std::net::TcpListener;
//!
//! let app = TcpListener::bind("0.0.0.0:5001")?; // the application's P
//! let sdp = TcpListener::bind("0.0.0.0:0")?; // the hidden SDP listener Q
//! let mut ctl = ControlClient::connect(portmapper::control::default_path())?;
//! ctl.register(
//!     app.local_addr()?.ip(),
//!     app.local_addr()?.port(),
//!     sdp.local_addr()?.port(),
//! )?;
//! // ... registered until `ctl` is dropped or the process exits.
//! # Ok::<(), std::io::Error>(())
//! ```
#![forbid(unsafe_code)]

use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Longest request line accepted, newline included.
pub const MAX_LINE: usize = 256;

/// Environment variable naming the control socket, for daemon and clients.
pub const ENV_PATH: &str = "SDP_PM_CONTROL";

/// The directory of the system-wide control socket. A systemd unit with
/// `RuntimeDirectory=sdp-portmapper` creates it, owned by the service's user.
pub const SYSTEM_DIR: &str = "/run/sdp-portmapper";

/// The system-wide control socket, in [`SYSTEM_DIR`]: used by a daemon run
/// as root or as the service user that owns that directory, and tried first
/// by clients.
pub const SYSTEM_PATH: &str = "/run/sdp-portmapper/control.sock";

fn uid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX)
}

/// The filesystem uid, gid and supplementary groups of this process, from
/// `/proc/self/status` (std has no getresuid).
fn credentials() -> Option<(u32, u32, Vec<u32>)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    // "Uid:" and "Gid:" give real, effective, saved and filesystem ids; the
    // kernel checks file access with the last.
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|rest| {
                rest.split_whitespace()
                    .filter_map(|w| w.parse::<u32>().ok())
            })
    };
    let fsuid = field("Uid:")?.nth(3)?;
    let fsgid = field("Gid:")?.nth(3)?;
    let groups = field("Groups:").map(Iterator::collect).unwrap_or_default();
    Some((fsuid, fsgid, groups))
}

/// May this process create and remove entries in `dir`: write and search
/// permission by its mode bits (ACLs are not looked at)?
fn dir_writable(dir: &Path) -> bool {
    let Ok(m) = std::fs::metadata(dir) else {
        return false;
    };
    let Some((fsuid, fsgid, groups)) = credentials() else {
        return false;
    };
    if !m.is_dir() {
        return false;
    }
    if fsuid == 0 {
        return true;
    }
    let class = if m.uid() == fsuid {
        m.mode() >> 6
    } else if m.gid() == fsgid || groups.contains(&m.gid()) {
        m.mode() >> 3
    } else {
        m.mode()
    };
    class & 0o3 == 0o3
}

/// The per-user control socket: `$XDG_RUNTIME_DIR/sdp-portmapper.sock`, or
/// `/tmp/sdp-portmapper-<uid>.sock` without it.
pub fn user_path() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => Path::new(&d).join("sdp-portmapper.sock"),
        _ => PathBuf::from(format!("/tmp/sdp-portmapper-{}.sock", uid())),
    }
}

/// Where a daemon listens by default: `$SDP_PM_CONTROL` if set, else
/// [`SYSTEM_PATH`] when run as root or when [`SYSTEM_DIR`] exists and this
/// process may create files in it (the systemd service's unprivileged
/// user), else [`user_path`].
pub fn default_path() -> PathBuf {
    if let Some(p) = std::env::var_os(ENV_PATH).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if uid() == 0 || dir_writable(Path::new(SYSTEM_DIR)) {
        PathBuf::from(SYSTEM_PATH)
    } else {
        user_path()
    }
}

/// Where a client looks, in order: `$SDP_PM_CONTROL` alone if set, else
/// [`SYSTEM_PATH`] then [`user_path`].
pub fn candidate_paths() -> Vec<PathBuf> {
    if let Some(p) = std::env::var_os(ENV_PATH).filter(|p| !p.is_empty()) {
        return vec![PathBuf::from(p)];
    }
    vec![PathBuf::from(SYSTEM_PATH), user_path()]
}

/// A control request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request {
    /// TCP port `port` on `addr` is served by the SDP listener `sdp_port`.
    Register {
        /// Address both listeners are bound to.
        addr: IpAddr,
        /// P.
        port: u16,
        /// Q.
        sdp_port: u16,
    },
    /// Withdraw a registration.
    Unregister {
        /// Address.
        addr: IpAddr,
        /// P.
        port: u16,
    },
    /// SDP listener `sdp_port` accepted a connection from `cp`.
    Connected {
        /// Q.
        sdp_port: u16,
        /// The connecting peer's address and port.
        cp: SocketAddr,
    },
    /// List registrations, pending transactions and counters.
    List,
}

/// A request line that does not parse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BadRequest;

impl fmt::Display for BadRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("bad request")
    }
}

impl std::error::Error for BadRequest {}

impl Request {
    /// Parse one line (without or with its newline).
    pub fn parse(line: &str) -> Result<Request, BadRequest> {
        let w: Vec<&str> = line.split_ascii_whitespace().collect();
        let ip = |s: &str| s.parse::<IpAddr>().map_err(|_| BadRequest);
        let port = |s: &str| s.parse::<u16>().map_err(|_| BadRequest);
        match w.as_slice() {
            ["REGISTER", a, p, q] => Ok(Request::Register {
                addr: ip(a)?,
                port: port(p)?,
                sdp_port: port(q)?,
            }),
            ["UNREGISTER", a, p] => Ok(Request::Unregister {
                addr: ip(a)?,
                port: port(p)?,
            }),
            ["CONNECTED", q, a, p] => Ok(Request::Connected {
                sdp_port: port(q)?,
                cp: SocketAddr::new(ip(a)?, port(p)?),
            }),
            ["LIST"] => Ok(Request::List),
            _ => Err(BadRequest),
        }
    }
}

impl fmt::Display for Request {
    /// The request line, without newline.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Request::Register {
                addr,
                port,
                sdp_port,
            } => write!(f, "REGISTER {addr} {port} {sdp_port}"),
            Request::Unregister { addr, port } => write!(f, "UNREGISTER {addr} {port}"),
            Request::Connected { sdp_port, cp } => {
                write!(f, "CONNECTED {sdp_port} {} {}", cp.ip(), cp.port())
            }
            Request::List => f.write_str("LIST"),
        }
    }
}

/// A connection to the daemon's control socket. Registrations made through
/// it last until it is dropped (or the process exits).
#[derive(Debug)]
pub struct ControlClient {
    reader: BufReader<UnixStream>,
}

impl ControlClient {
    /// Connect to the control socket at `path`. Replies are awaited at most
    /// 5 s.
    pub fn connect(path: impl AsRef<Path>) -> io::Result<ControlClient> {
        let s = UnixStream::connect(path)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        Ok(ControlClient {
            reader: BufReader::new(s),
        })
    }

    /// Connect to the first of [`candidate_paths`] that answers.
    pub fn connect_default() -> io::Result<ControlClient> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "no control socket");
        for p in candidate_paths() {
            match ControlClient::connect(&p) {
                Ok(c) => return Ok(c),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn send(&mut self, req: &Request) -> io::Result<()> {
        let mut s = self.reader.get_ref();
        s.write_all(format!("{req}\n").as_bytes())
    }

    fn line(&mut self) -> io::Result<String> {
        let mut l = String::new();
        if self.reader.read_line(&mut l)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "control connection closed",
            ));
        }
        Ok(l.trim_end().to_string())
    }

    fn simple(&mut self, req: Request) -> io::Result<()> {
        self.send(&req)?;
        let l = self.line()?;
        match l.strip_prefix("ERR") {
            None if l == "OK" => Ok(()),
            Some(reason) => Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!("port mapper refused: {}", reason.trim()),
            )),
            None => Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("unexpected reply {l:?}"),
            )),
        }
    }

    /// The connection's descriptor, to poll: it turns readable when the
    /// daemon closes its end (it sends nothing unasked).
    pub fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(self.reader.get_ref())
    }

    /// Whether the daemon closed its end (it stopped or restarted): the
    /// registrations made on this connection are gone with it. Does not
    /// block.
    pub fn closed_by_daemon(&self) -> bool {
        let mut s = self.reader.get_ref();
        if s.set_nonblocking(true).is_err() {
            return true;
        }
        // The daemon sends nothing unasked, so reading takes nothing a
        // reply needs: end of stream or an error means it is gone.
        let r = s.read(&mut [0u8; 1]);
        let _ = s.set_nonblocking(false);
        match r {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        }
    }

    /// Register "TCP `port` on `addr` is served by SDP listener `sdp_port`".
    /// Refused (`PermissionDenied`) unless this process listens on both.
    pub fn register(&mut self, addr: IpAddr, port: u16, sdp_port: u16) -> io::Result<()> {
        self.simple(Request::Register {
            addr,
            port,
            sdp_port,
        })
    }

    /// Withdraw a registration made on this connection.
    pub fn unregister(&mut self, addr: IpAddr, port: u16) -> io::Result<()> {
        self.simple(Request::Unregister { addr, port })
    }

    /// Tell the daemon SDP listener `sdp_port` accepted a connection from
    /// `cp`.
    pub fn connected(&mut self, sdp_port: u16, cp: SocketAddr) -> io::Result<()> {
        self.simple(Request::Connected { sdp_port, cp })
    }

    /// The daemon's listing: registrations, pending transactions, counters.
    pub fn list(&mut self) -> io::Result<Vec<String>> {
        self.send(&Request::List)?;
        let mut out = Vec::new();
        loop {
            let l = self.line()?;
            if l == "END" {
                return Ok(out);
            }
            out.push(l);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for r in [
            Request::Register {
                addr: "::".parse().unwrap(),
                port: 5001,
                sdp_port: 40001,
            },
            Request::Unregister {
                addr: "127.0.0.1".parse().unwrap(),
                port: 1,
            },
            Request::Connected {
                sdp_port: 9,
                cp: "[::1]:4".parse().unwrap(),
            },
            Request::List,
        ] {
            assert_eq!(Request::parse(&format!("{r}\n")), Ok(r));
        }
    }

    #[test]
    fn bad_lines() {
        for l in [
            "",
            "LIST x",
            "REGISTER 1.2.3.4 1",
            "REGISTER 1.2.3.4 1 70000",
            "REGISTER host 1 2",
            "register ::1 1 2",
        ] {
            assert_eq!(Request::parse(l), Err(BadRequest), "{l:?}");
        }
    }

    #[test]
    fn system_path_is_in_system_dir() {
        assert_eq!(Path::new(SYSTEM_PATH).parent(), Some(Path::new(SYSTEM_DIR)));
    }

    #[test]
    fn writable_dirs() {
        let dir = std::env::temp_dir().join(format!("pm-ctl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // Our own directory, mode 0700: ours to write in.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        assert!(dir_writable(&dir));
        assert!(!dir_writable(&dir.join("missing")));
        let file = dir.join("f");
        std::fs::write(&file, b"").unwrap();
        assert!(!dir_writable(&file), "a file is not a directory");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn paths() {
        assert!(!candidate_paths().is_empty());
        assert!(!default_path().as_os_str().is_empty());
    }
}
