//! `sdpcat` over loopback (issue 5 acceptance 2): a generated stream goes
//! from one `sdpcat` to another and the SHA-256 (coreutils `sha256sum`) of
//! what went in equals that of what came out; the exit status tells an
//! abortive close from a graceful one.
//!
//! The binary is the release build: `cargo build --release -p sdp-tools
//! --bin sdpcat` is run by the first test that needs it. The 10 GiB run
//! takes about a minute on two cores (most of it in the two `sha256sum`
//! processes); the 1 GiB one finds a fault sooner.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use sdp_core::stream::SdpListener;

fn sdpcat() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .current_dir(&root)
            .args([
                "build",
                "--release",
                "-q",
                "-p",
                "sdp-tools",
                "--bin",
                "sdpcat",
            ])
            .status()
            .expect("cargo build");
        assert!(status.success(), "building sdpcat failed");
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| root.join("target"));
        target.join("release").join("sdpcat")
    })
    .clone()
}

/// Starts `sdpcat -l 127.0.0.1:0` and returns it with its address.
fn server(stdout: Stdio) -> (Child, SocketAddr) {
    let (child, addr, _) = server_with(&[], stdout);
    (child, addr)
}

/// [`server`] with `opts` before `-l`; the thread returns its messages.
fn server_with(
    opts: &[&str],
    stdout: Stdio,
) -> (Child, SocketAddr, std::thread::JoinHandle<String>) {
    let mut child = Command::new(sdpcat())
        .args(opts)
        .args(["-l", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .expect("sdpcat -l");
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    err.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("sdpcat: listening on ")
        .unwrap_or_else(|| panic!("unexpected: {line:?}"))
        .parse()
        .unwrap();
    // Keep draining its messages.
    let messages = std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = err.read_to_string(&mut rest);
        eprint!("{rest}");
        rest
    });
    (child, addr, messages)
}

/// The counters of sdpcat's last line: sent (bcopy, read-zcopy,
/// write-zcopy), received (the same), received bytes copied.
fn mechanism_line(messages: &str) -> [u64; 7] {
    let line = messages
        .lines()
        .find(|l| l.starts_with("sdpcat: sent bcopy"))
        .unwrap_or_else(|| panic!("no counters in {messages:?}"));
    let nums: Vec<u64> = line
        .split(|c: char| !c.is_ascii_digit())
        .filter(|w| !w.is_empty())
        .map(|w| w.parse().unwrap())
        .collect();
    nums.try_into()
        .unwrap_or_else(|_| panic!("bad counters {line:?}"))
}

fn sha256sum(stdin: Stdio) -> Child {
    Command::new("sha256sum")
        .stdin(stdin)
        .stdout(Stdio::piped())
        .spawn()
        .expect("sha256sum")
}

fn digest(child: Child) -> String {
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap()
}

/// A deterministic stream that is cheap even in a debug build: one random
/// MiB, its first word replaced by the chunk number in each chunk, so that
/// a lost, repeated or reordered chunk changes the hash.
struct Generator {
    block: Vec<u8>,
    chunk: u64,
}

impl Generator {
    fn new() -> Generator {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let block = (0..1 << 17)
            .flat_map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()
            })
            .collect();
        Generator { block, chunk: 0 }
    }

    fn next(&mut self) -> &[u8] {
        self.chunk += 1;
        self.block[..8].copy_from_slice(&self.chunk.to_le_bytes());
        &self.block
    }
}

fn transfer(bytes: u64) {
    let (mut srv, addr) = server(Stdio::piped());
    let srv_sum = sha256sum(Stdio::from(srv.stdout.take().unwrap()));
    let mut client = Command::new(sdpcat())
        .arg(addr.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sdpcat client");
    let mut local_sum = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let t = Instant::now();
    {
        let mut to_client = client.stdin.take().unwrap();
        let mut to_sum = local_sum.stdin.take().unwrap();
        let mut gen = Generator::new();
        let mut left = bytes;
        while left > 0 {
            let chunk = gen.next();
            let n = left.min(chunk.len() as u64) as usize;
            to_client.write_all(&chunk[..n]).unwrap();
            to_sum.write_all(&chunk[..n]).unwrap();
            left -= n as u64;
        }
    }
    let out = client.wait_with_output().unwrap();
    let msgs = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "client failed: {msgs}");
    assert!(srv.wait().unwrap().success(), "server failed");
    let secs = t.elapsed().as_secs_f64();
    // The client's counters, printed once everything went, add up.
    let tx = mechanism_line(&msgs);
    assert_eq!(tx[0] + tx[1] + tx[2], bytes, "{msgs}");
    let (sent, received) = (digest(local_sum), digest(srv_sum));
    eprintln!(
        "{bytes} bytes in {secs:.1} s ({:.2} Gbit/s with the hashing)",
        bytes as f64 * 8.0 / secs / 1e9
    );
    assert_eq!(
        sent.split_whitespace().next(),
        received.split_whitespace().next()
    );
}

#[test]
fn sdpcat_moves_1_gib_with_matching_sha256() {
    transfer(1 << 30);
}

#[test]
fn sdpcat_moves_10_gib_with_matching_sha256() {
    transfer(10 << 30);
}

#[test]
fn sdpcat_exits_nonzero_on_abortive_close() {
    let listener = SdpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut client = Command::new(sdpcat())
        .arg(addr.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (s, _) = listener.accept().unwrap();
    (&s).write_all(b"before the reset\n").unwrap();
    let mut out = client.stdout.take().unwrap();
    let mut line = [0u8; 17];
    out.read_exact(&mut line).unwrap();
    assert_eq!(&line, b"before the reset\n");
    s.set_linger(Some(Duration::ZERO)).unwrap();
    drop(s);
    let status = client.wait().unwrap();
    assert_eq!(status.code(), Some(1));
    let mut err = String::new();
    client
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(err.contains("reset"), "{err}");
}

#[test]
fn sdpcat_graceful_both_ways() {
    let (mut srv, addr) = server(Stdio::piped());
    let mut client = Command::new(sdpcat())
        .arg(addr.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    client.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let mut got = String::new();
    srv.stdout.take().unwrap().read_to_string(&mut got).unwrap();
    assert_eq!(got, "hello\n");
    assert!(client.wait().unwrap().success());
    assert!(srv.wait().unwrap().success());
}

/// 64 MiB through two `sdpcat -z MODE -b 16M`: 16 MiB writes against
/// 16 MiB blocking reads go by Zcopy; the SHA-256 matches and both ends'
/// counters agree on the mechanism that carried the bytes.
fn zcopy_transfer(mode: &str) -> ([u64; 7], [u64; 7]) {
    const LEN: u64 = 64 << 20;
    let opts = ["-z", mode, "-b", "16M"];
    let (mut srv, addr, srv_msgs) = server_with(&opts, Stdio::piped());
    let srv_sum = sha256sum(Stdio::from(srv.stdout.take().unwrap()));
    let mut client = Command::new(sdpcat())
        .args(opts)
        .arg(addr.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("sdpcat client");
    let mut local_sum = Command::new("sha256sum")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    {
        let mut to_client = client.stdin.take().unwrap();
        let mut to_sum = local_sum.stdin.take().unwrap();
        let mut gen = Generator::new();
        for _ in 0..LEN >> 20 {
            let chunk = gen.next();
            to_client.write_all(chunk).unwrap();
            to_sum.write_all(chunk).unwrap();
        }
    }
    let out = client.wait_with_output().unwrap();
    let cli_msgs = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "client failed: {cli_msgs}");
    assert!(srv.wait().unwrap().success(), "server failed");
    let (sent, received) = (digest(local_sum), digest(srv_sum));
    assert_eq!(
        sent.split_whitespace().next(),
        received.split_whitespace().next()
    );
    let tx = mechanism_line(&cli_msgs);
    let rx = mechanism_line(&srv_msgs.join().unwrap());
    // Every byte sent is counted once, and received as it was sent.
    assert_eq!(tx[0] + tx[1] + tx[2], LEN, "{tx:?}");
    assert_eq!(&tx[..3], &rx[3..6], "sent {tx:?}, received {rx:?}");
    (tx, rx)
}

#[test]
fn sdpcat_64_mib_by_read_zcopy() {
    let (tx, rx) = zcopy_transfer("read");
    // Each 16 MiB buffer: a Combined Mode SrcAvail with its first bytes,
    // the rest read by the peer.
    assert!(tx[1] >= (64 << 20) - 16 * 1024, "{tx:?}");
    assert_eq!(tx[2], 0, "{tx:?}");
    // The SrcAvails' payload was copied from the Private Buffers; the
    // rest was placed.
    assert_eq!(rx[6], rx[3], "{rx:?}");
}

#[test]
fn sdpcat_64_mib_by_write_or_read_zcopy() {
    let (tx, rx) = zcopy_transfer("both");
    // Pipelined Mode: no payload rides on a SrcAvail; each buffer goes by
    // RDMA Write into a posted read or by the reader's RDMA Read, and no
    // received byte is copied.
    assert_eq!(tx[0], 0, "{tx:?}");
    assert_eq!(rx[6], 0, "{rx:?}");
}

#[test]
fn sdpcat_64_mib_by_write_zcopy() {
    let (tx, rx) = zcopy_transfer("write");
    // The reader's posted buffers are written into; a write that finds
    // none advertised yet is answered by SendSm and goes by Bcopy.
    assert!(tx[2] > 0, "{tx:?}");
    assert_eq!(tx[1], 0, "{tx:?}");
    assert_eq!(rx[6], rx[3], "{rx:?}");
}
