//! Live captures on the loopback interface with `dumpcap`, for tests that
//! let tshark check what our programs really put on the wire.
//!
//! [`LiveCapture::start`] returns once the capture is known to run: it
//! sends probe packets (TCP connection attempts to a port nothing listens
//! on, answered by a RST) until one shows up in the capture file.
//! [`LiveCapture::finish`] probes again and waits until that probe is in
//! the file, so that everything sent before it is too, then stops dumpcap.
//! Nothing waits on a guess of how long capturing takes.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a probe may take to show up before the capture is given up.
const PROBE_PATIENCE: Duration = Duration::from_secs(60);

/// A running `dumpcap -i lo` for TCP port `port` and a probe port.
pub struct LiveCapture {
    child: Child,
    path: PathBuf,
    probe_port: u16,
}

/// A loopback port that nothing listens on now (bound, then released),
/// below the kernel's ephemeral range: no connection of another test
/// running beside this one can have it as its local port, so the capture
/// holds this test's traffic alone.
pub fn free_port() -> u16 {
    const LOWEST: u32 = 10_000;
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    let span = first_ephemeral.saturating_sub(LOWEST).max(1);
    let seed = std::process::id()
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
    (0..span)
        .map(|i| LOWEST + (seed.wrapping_add(i.wrapping_mul(7_919))) % span)
        .find_map(|port| {
            let port = u16::try_from(port).ok()?;
            TcpListener::bind((Ipv4Addr::LOCALHOST, port))
                .ok()
                .map(|_| port)
        })
        .expect("a free loopback port below the ephemeral range")
}

impl LiveCapture {
    /// Starts capturing TCP port `port` on `lo`.
    ///
    /// # Panics
    ///
    /// When dumpcap is missing or no probe is captured in time.
    pub fn start(port: u16) -> LiveCapture {
        let probe_port = free_port();
        let path = std::env::temp_dir().join(format!(
            "sdp-tests-live-{}-{port}.pcapng",
            std::process::id()
        ));
        let _ = std::fs::remove_file(&path);
        let child = Command::new("dumpcap")
            .args(["-q", "-i", "lo", "-f"])
            .arg(format!("tcp port {port} or tcp port {probe_port}"))
            .arg("-w")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("dumpcap is installed (scripts/test.sh installs tshark)");
        let mut cap = LiveCapture {
            child,
            path,
            probe_port,
        };
        cap.probe_until_seen();
        cap
    }

    /// Probe packets in the file so far.
    fn probes_seen(&self) -> usize {
        if !self.path.exists() {
            return 0;
        }
        let out = Command::new("tshark")
            .args(["-n", "-r"])
            .arg(&self.path)
            .args(["-Y", &format!("tcp.port == {}", self.probe_port)])
            .args(["-T", "fields", "-e", "frame.number"])
            .stderr(Stdio::null())
            .output()
            .expect("tshark is installed");
        String::from_utf8_lossy(&out.stdout).lines().count()
    }

    /// Sends probes until one more than before is in the file: another
    /// probe every half second (dumpcap may not have been capturing yet
    /// when one went), the file decoded again only when it grew.
    fn probe_until_seen(&mut self) {
        let before = self.probes_seen();
        let deadline = Instant::now() + PROBE_PATIENCE;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.probe_port));
        let mut size = None;
        loop {
            // Refused: a SYN and a RST, both captured.
            let _ = TcpStream::connect_timeout(&addr, Duration::from_secs(1));
            let again = Instant::now() + Duration::from_millis(500);
            while Instant::now() < again {
                let now = std::fs::metadata(&self.path).ok().map(|m| m.len());
                if now != size {
                    size = now;
                    if self.probes_seen() > before {
                        return;
                    }
                }
                if let Ok(Some(status)) = self.child.try_wait() {
                    panic!("dumpcap exited: {status}");
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            assert!(Instant::now() < deadline, "capture never saw a probe");
        }
    }

    /// Stops the capture once everything sent so far is in it; returns
    /// the capture file's bytes.
    pub fn finish(mut self) -> Vec<u8> {
        self.probe_until_seen();
        let _ = Command::new("kill")
            .arg("-INT")
            .arg(self.child.id().to_string())
            .status();
        let _ = self.child.wait();
        let bytes = std::fs::read(&self.path).expect("read the capture file");
        let _ = std::fs::remove_file(&self.path);
        bytes
    }
}

impl Drop for LiveCapture {
    fn drop(&mut self) {
        // After finish() the child is gone; on a panic, do not leave it.
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}
