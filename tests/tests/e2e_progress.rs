//! Issue 6, item 8 (DESIGN §6 "Progress without the application"): a
//! program writes 10 MiB, then sleeps 10 s without another call into the
//! library; the peer must have all of it within 1 s of the write's return.
//!
//! After `sendall` returns, the writer reads the clock and then makes only
//! raw system calls (`syscall(SYS_write)` to report the time,
//! `syscall(SYS_nanosleep)` to sleep), which no hook sees. The reader
//! reports when it has every byte; both times are `CLOCK_MONOTONIC`. While
//! the writer sleeps, the test reads both ends' records (SDP), then kills
//! the writer, so the exit-time flush cannot stand in for progress.

use sdp_tests::e2e::{expect_sdp, Env, Proc};
use sdp_tests::preload::Mode;

const SIZE: usize = 10 << 20;

const WRITER: &str = r#"
import ctypes, hashlib, os, platform, socket, sys, time
SYS_WRITE, SYS_NANOSLEEP = {"x86_64": (1, 35), "aarch64": (64, 101)}[platform.machine()]
libc = ctypes.CDLL(None, use_errno=True)
port, size = int(sys.argv[1]), int(sys.argv[2])
data = (hashlib.sha256(b"progress").digest() * (size // 32 + 1))[:size]
c = socket.create_connection(("127.0.0.1", port))
print("connected", os.getpid(), c.fileno(), hashlib.sha256(data).hexdigest(), flush=True)
c.sendall(data)
t = time.monotonic()
line = b"written %.6f\n" % t
libc.syscall(SYS_WRITE, 1, line, len(line))
ts = (ctypes.c_long * 2)(10, 0)
libc.syscall(SYS_NANOSLEEP, ts, None)
"#;

const READER: &str = r#"
import hashlib, os, socket, sys, time
size = int(sys.argv[1])
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
print("listening", srv.getsockname()[1], flush=True)
a, _ = srv.accept()
a.settimeout(12)
n, h = 0, hashlib.sha256()
try:
    while n < size:
        d = a.recv(1 << 20)
        if not d:
            break
        n += len(d)
        h.update(d)
except socket.timeout:
    pass
t = time.monotonic()
print("received", n, h.hexdigest(), "%.6f" % t, os.getpid(), a.fileno(), flush=True)
sys.stdin.readline()
"#;

#[test]
fn sent_data_reaches_the_peer_while_the_writer_sleeps() {
    let env = Env::new("progress");
    let mut cmd = env.python(READER, Mode::Sdp);
    cmd.arg(SIZE.to_string());
    let mut reader = Proc::spawn("reader", cmd, true);
    let line = reader.wait_line(|l| l.starts_with("listening "));
    let port = line.split_whitespace().nth(1).unwrap().to_owned();

    let mut cmd = env.python(WRITER, Mode::Sdp);
    cmd.args([port, SIZE.to_string()]);
    let mut writer = Proc::spawn("writer", cmd, false);
    let line = writer.wait_line(|l| l.starts_with("connected "));
    let w: Vec<&str> = line.split_whitespace().collect();
    let (writer_pid, writer_fd, sha) = (
        w[1].parse::<u32>().unwrap(),
        w[2].parse::<usize>().unwrap(),
        w[3].to_owned(),
    );
    let line = writer.wait_line(|l| l.starts_with("written "));
    let written: f64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();

    let line = reader.wait_line(|l| l.starts_with("received "));
    let r: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(r[1], SIZE.to_string(), "bytes received: {line}");
    assert_eq!(r[2], sha, "the bytes differ");
    let received: f64 = r[3].parse().unwrap();
    let late = received - written;
    assert!(
        late < 1.0,
        "the reader had everything {late:.3} s after the write returned"
    );

    // The writer is still asleep (it ends after 10 s).
    let c = env.wait_records("the writer's connection", writer_pid, 1, |r| {
        r.fd == writer_fd
    });
    expect_sdp("writer (sleeping)", &c[0]);
    let (reader_pid, reader_fd) = (r[4].parse().unwrap(), r[5].parse::<usize>().unwrap());
    let a = env.wait_records("the reader's connection", reader_pid, 1, |r| {
        r.fd == reader_fd
    });
    expect_sdp("reader", &a[0]);
    drop(writer);
    reader.send("\n");
    reader.finish_ok();
}
